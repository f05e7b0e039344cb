"""``ckptmerge diff`` of two Keras weights files whose paths differ (issue 33 item 5): the pairs
of paths that hold the same layer, not two unrelated lists; undecided where only luck would pair.

Every file is written by Keras itself.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Dict

import numpy as np
import pytest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
keras = pytest.importorskip("keras")

from _cli_util import run  # noqa: E402


class Block(keras.layers.Layer):
    def __init__(self, sizes: Dict[str, int], **kw: Any) -> None:
        super().__init__(**kw)
        self.names = list(sizes)
        for name, units in sizes.items():
            setattr(self, name, keras.layers.Dense(units))

    def call(self, x: Any) -> Any:
        for name in self.names:
            x = getattr(self, name)(x)
        return x


class Model(keras.Model):
    def __init__(self, attr: str, sizes: Dict[str, int], **kw: Any) -> None:
        super().__init__(**kw)
        self.attr = attr
        setattr(self, attr, Block(sizes))
        self.head = keras.layers.Dense(2)

    def call(self, x: Any) -> Any:
        return self.head(getattr(self, self.attr)(x))


def _save(path: Path, attr: str, sizes: Dict[str, int]) -> Path:
    model = Model(attr, sizes)
    model(np.zeros((1, 5), "float32"))
    model.save_weights(path)
    return path


@pytest.mark.parametrize("old,new", [("encoder", "backbone"), ("enc", "encoder"), ("body", "backbone")])
def test_renamed_attribute_is_named_as_pairs(tmp_path: Path, old: str, new: str) -> None:
    sizes = {"proj": 4, "out": 3}
    a = _save(tmp_path / "a.weights.h5", old, sizes)
    b = _save(tmp_path / "b.weights.h5", new, sizes)
    r = run("diff", a, b)
    assert r.exit_code == 1, r.output
    assert "Renamed paths - the same layer's entries under another path in B (2):" in r.stdout, r.stdout
    assert f"  {old}/proj <-> {new}/proj (" in r.stdout and f"  {old}/out <-> {new}/out (" in r.stdout
    data = json.loads(run("diff", a, b, "--json").stdout)
    assert sorted((p["a"], p["b"]) for p in data["renamed"]) == [(f"{old}/out", f"{new}/out"),
                                                                 (f"{old}/proj", f"{new}/proj")]
    assert data["renamed_unresolved"] == []


def test_renamed_layers_of_one_shape_are_never_paired_by_luck(tmp_path: Path) -> None:
    """Two layers with the same entries renamed to names that say nothing: undecided, not a guess."""
    a = _save(tmp_path / "a.weights.h5", "encoder", {"p": 4, "q": 4})
    b = _save(tmp_path / "b.weights.h5", "encoder", {"x": 4, "y": 4})
    data = json.loads(run("diff", a, b, "--json").stdout)
    paired = {(p["a"], p["b"]) for p in data["renamed"]}
    # encoder/p feeds (5 -> 4), encoder/q (4 -> 4): their entries differ, so each pairs by shape alone
    assert paired <= {("encoder/p", "encoder/x"), ("encoder/q", "encoder/y")}, paired
    r = run("diff", a, b)
    assert r.exit_code == 1 and "Only in A (4)" in r.stdout


def test_same_entries_and_no_evidence_stay_undecided(tmp_path: Path) -> None:
    a = _save(tmp_path / "a.weights.h5", "encoder", {"first": 4, "second": 4, "third": 4})
    b = _save(tmp_path / "b.weights.h5", "encoder", {"alpha": 4, "beta": 4, "gamma": 4})
    r = run("diff", a, b, "--json")
    data = json.loads(r.stdout)
    # 'first' is the only 5->4 layer on each side; 'second' and 'third' hold equal entries and
    # their names say nothing about 'beta' and 'gamma': undecided, never paired by order
    assert [(p["a"], p["b"]) for p in data["renamed"]] == [("encoder/first", "encoder/alpha")], data
    assert [(sorted(u["a"]), sorted(u["b"])) for u in data["renamed_unresolved"]] == [
        (["encoder/second", "encoder/third"], ["encoder/beta", "encoder/gamma"])], data
    text = run("diff", a, b).stdout
    assert "undecided: A encoder/second, encoder/third / B encoder/beta, encoder/gamma: " in text, text


def test_equal_files_and_other_formats_have_no_renamed_section(tmp_path: Path) -> None:
    a = _save(tmp_path / "a.weights.h5", "encoder", {"proj": 4})
    r = run("diff", a, a)
    assert r.exit_code == 0 and "Renamed paths" not in r.stdout
    assert "renamed" not in json.loads(run("diff", a, a, "--json").stdout)
