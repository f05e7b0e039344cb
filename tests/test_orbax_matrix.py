"""The Orbax release matrix (issue 36 item 1): checkpoints written by each Orbax release line
(0.5, 0.6, 0.10, 0.11, the newest) in every common way of saving, read without JAX and compared
bit for bit with that release's own restore.

The fixtures, and the reference beside each, were written by scripts/orbax_matrix.py run in a
virtual environment per release (see its docstring); this test needs neither JAX nor Orbax.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("tensorstore", reason="the Orbax reader needs tensorstore (pip install 'ckptmerge[orbax]')")

from _cli_util import run  # noqa: E402
from _orbax_util import refuse_jax_from_ckptmerge  # noqa: E402,F401

import ckptmerge as cm  # noqa: E402

MATRIX = Path(__file__).resolve().parent / "fixtures" / "orbax_matrix"
CASES = sorted(p.parent for p in MATRIX.glob("*/*/case.json"))


def _reference(case: Path) -> dict:
    out = {}
    with np.load(case / "reference.npz") as npz:
        for key in npz.files:
            name, _, view = key.replace("|", "/").partition("@")
            out[name] = (npz[key], view)
    for name, value in json.loads((case / "strings.json").read_text()).items():
        out[name] = (value, "string")
    return out


def _same(got: np.ndarray, want: np.ndarray, view: str) -> bool:
    if view == "string":
        return got.shape == () and got.item() == want.encode("utf-8")
    if view:  # bfloat16 (stored in the reference as its bits)
        return got.dtype.name == view and got.shape == want.shape and got.tobytes() == want.tobytes()
    if got.ndim == 0 and want.ndim == 0 and got.dtype != want.dtype:  # Orbax restores scalars as Python numbers
        return got.item() == want.item()
    return got.dtype == want.dtype and got.shape == want.shape and got.tobytes() == want.tobytes()


def test_the_matrix_covers_every_release_line_and_way_of_saving():
    releases = {p.parent.name.rsplit(".", 1)[0] for p in CASES}
    assert {"0.5", "0.6", "0.10", "0.11", "0.12"} <= releases, releases
    for release in {p.parent for p in CASES}:
        cases = {p.name for p in CASES if p.parent == release}
        skipped = json.loads((release / "skipped.json").read_text())
        assert {"pytree_default", "handler_ocdbt", "handler_no_ocdbt", "manager_items", "sharded_ocdbt",
                "sharded_no_ocdbt", "containers", "save_args_cast"} - set(skipped) <= cases, (release.name, skipped)
    total = sum(f.stat().st_size for f in MATRIX.rglob("*") if f.is_file())
    assert total < 3 << 20, total


@pytest.mark.parametrize("case", CASES, ids=[f"{p.parent.name}/{p.name}" for p in CASES])
def test_every_fixture_lists_and_loads_bit_exact_as_its_release_restores_it(case):
    meta = json.loads((case / "case.json").read_text())
    ref = _reference(case)
    path = case / meta["read"]
    with cm.open(str(path)) as r:
        assert sorted(r.names()) == sorted(ref), (meta["how"], sorted(r.names()), sorted(ref))
        got = r.read_many(sorted(ref))
    for name, (want, view) in ref.items():
        assert _same(got[name], want, view), (meta["how"], name, got[name], want)
    res = run("ls", path, "--all")
    assert res.exit_code == 0 and "Traceback" not in res.stderr, res.output
    if meta.get("root"):
        res = run("checkpoints", path)
        assert res.exit_code == 0, res.output
        rows = [line.split() for line in res.stdout.splitlines()[1:-1]]
        listed = [int(row[1] if row[0] == "*" else row[0]) for row in rows]
        assert listed == meta["steps"], res.stdout
        first = meta["steps"][0]
        with cm.open(str(path), step=first) as r:
            assert sorted(r.names()) == sorted(ref)
