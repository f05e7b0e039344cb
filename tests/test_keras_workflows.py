"""Keras workflows users hit (issue 33): a new head on a pretrained file, and one config from
``plan --model`` to ``merge --model``.

Every model here is a real Keras model and every file is written by Keras itself.
"""

from __future__ import annotations

import os
import textwrap
import warnings
from pathlib import Path
from typing import Any, Callable, Dict

import numpy as np
import pytest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

keras = pytest.importorskip("keras")

import ckptmerge as cm  # noqa: E402
from _cli_util import run  # noqa: E402


def functional(n: int, width: int = 16) -> Any:
    inp = keras.Input((8,))
    x = keras.layers.Dense(width, name="enc")(inp)
    x = keras.layers.LayerNormalization(name="norm")(x)
    return keras.Model(inp, keras.layers.Dense(n, name="head")(x))


def sequential(n: int, width: int = 12) -> Any:
    return keras.Sequential([keras.Input((5,)), keras.layers.Dense(width), keras.layers.Dense(width),
                             keras.layers.Dense(n)])


class Subclassed(keras.Model):
    def __init__(self, n: int = 4, width: int = 6, **kw: Any) -> None:
        super().__init__(**kw)
        self.encoder = keras.layers.Dense(width)
        self.classifier = keras.layers.Dense(n)

    def call(self, x: Any) -> Any:
        return self.classifier(self.encoder(x))


def subclassed(n: int, width: int = 6) -> Any:
    model = Subclassed(n, width)
    model(np.zeros((1, 7), "float32"))
    return model


BUILDERS: Dict[str, Callable[[int], Any]] = {"functional": functional, "sequential": sequential,
                                             "subclassed": subclassed}


def _values(model: Any) -> Dict[str, np.ndarray]:
    return {v.path: np.array(v.numpy()) for v in model.weights}


@pytest.mark.parametrize("kind", sorted(BUILDERS))
@pytest.mark.parametrize("classes", [(10, 3), (2, 5)])
@pytest.mark.parametrize("suffix", [".weights.h5", ".keras"])
def test_new_head_is_one_call_and_only_the_head_is_skipped(tmp_path: Path, kind: str, classes: Any,
                                                            suffix: str) -> None:
    build = BUILDERS[kind]
    keras.utils.set_random_seed(sum(classes) + len(kind))
    pre = build(classes[0])
    path = tmp_path / f"pre{suffix}"
    (pre.save_weights if suffix == ".weights.h5" else pre.save)(path)
    new = build(classes[1])
    before = _values(new)
    plan = cm.plan(new, [str(path)])
    # the head's shapes differ; Keras's bookkeeping (a Functional's '_operations_by_depth') never a finding
    assert len(plan.mismatched) == 2 and not plan.structure, plan.report()
    assert "_operations_by_depth" not in plan.report()
    plan = cm.plan(new, [str(path)], skip_mismatch=True)
    text = plan.report()
    assert "Skipped (2) - shapes differ, left as they are" in text, text
    assert text.endswith("OK: nothing blocks a strict restore"), text
    cm.restore(new, [str(path)], skip_mismatch=True)
    skipped_layers = {m.target.rsplit("/", 1)[0] for m in plan.mismatched}
    assert len(skipped_layers) == 1  # the head, its kernel and bias
    for old, var, kept in zip(pre.weights, new.weights, before.values()):
        if var.path.rsplit("/", 1)[0] in skipped_layers:
            np.testing.assert_array_equal(var.numpy(), kept)  # the new head keeps its values
        else:
            np.testing.assert_array_equal(var.numpy(), old.numpy())
    # what Keras itself does with skip_mismatch=True: the same values
    native = build(classes[1])
    native.set_weights(list(before.values()))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        native.load_weights(path, skip_mismatch=True)
    for mine, theirs in zip(new.weights, native.weights):
        np.testing.assert_array_equal(mine.numpy(), theirs.numpy())


def test_skip_mismatch_is_on_shape_mismatch_skip_and_checked(tmp_path: Path) -> None:
    pre = functional(10)
    pre.save_weights(tmp_path / "pre.weights.h5")
    new = functional(3)
    a = cm.plan(new, [str(tmp_path / "pre.weights.h5")], skip_mismatch=True)
    b = cm.plan(new, [str(tmp_path / "pre.weights.h5")], on_shape_mismatch="skip")
    assert a.report() == b.report() and a.on_shape_mismatch == "skip"
    with pytest.raises(cm.ArgumentTypeError, match="skip_mismatch"):
        cm.plan(new, [str(tmp_path / "pre.weights.h5")], skip_mismatch="yes")
    with pytest.raises(cm.PlanError, match="shape mismatch"):
        cm.restore(new, [str(tmp_path / "pre.weights.h5")])


def _model_file(tmp_path: Path, n: int) -> str:
    path = tmp_path / "model_fn.py"
    path.write_text(textwrap.dedent(f"""
        import keras

        def build():
            inp = keras.Input((8,))
            x = keras.layers.Dense(16, name="enc")(inp)
            x = keras.layers.LayerNormalization(name="norm")(x)
            return keras.Model(inp, keras.layers.Dense({n}, name="head")(x))
        """))
    return f"{path}:build"


def test_cli_skip_mismatch_flag_for_plan_and_merge(tmp_path: Path) -> None:
    pre = functional(10)
    pre.save_weights(tmp_path / "pre.weights.h5")
    config = tmp_path / "c.yml"
    config.write_text(f"sources:\n  - path: {tmp_path / 'pre.weights.h5'}\n")
    spec = _model_file(tmp_path, 3)
    blocked = run("plan", config, "--model", spec)
    assert blocked.exit_code == 1, blocked.output
    assert "pass on_shape_mismatch='skip'" in blocked.stdout and "_operations_by_depth" not in blocked.stdout
    ok = run("plan", config, "--model", spec, "--skip-mismatch")
    assert ok.exit_code == 0, ok.output
    assert "Skipped (2)" in ok.stdout and "head/kernel" in ok.stdout
    out = tmp_path / "out" / "merged"
    merged = run("merge", config, "--model", spec, "--skip-mismatch", "-o", out)
    assert merged.exit_code == 0, merged.output
    assert "wrote 4 variables" in merged.stdout and "Left out (2)" in merged.stdout
    names = {v.name for v in cm.list_variables(str(out))}
    assert names == {"enc/kernel", "enc/bias", "norm/gamma", "norm/beta"}
    np.testing.assert_array_equal(cm.load(str(out))["enc/kernel"], pre.get_layer("enc").kernel.numpy())


@pytest.mark.parametrize("with_rules", [False, True])
def test_one_config_from_plan_to_merge_for_keras_files(tmp_path: Path, with_rules: bool) -> None:
    """The README's promise: a config ``plan --model`` accepts, ``merge --model`` writes."""
    keras.utils.set_random_seed(7)
    pre = functional(3)
    pre.save_weights(tmp_path / "pre.weights.h5")
    config = tmp_path / "c.yml"
    rules = "    include: ['enc/*', 'norm/*', 'head/*']\n" if with_rules else ""
    config.write_text(f"sources:\n  - path: {tmp_path / 'pre.weights.h5'}\n{rules}")
    spec = _model_file(tmp_path, 3)
    checked = run("plan", config, "--model", spec)
    assert checked.exit_code == 0, checked.output
    out = tmp_path / "merged"
    merged = run("merge", config, "--model", spec, "-o", out)
    assert merged.exit_code == 0, merged.output
    values = cm.load(str(out))
    assert set(values) == {v.path for v in pre.weights}
    for var in pre.weights:
        np.testing.assert_array_equal(values[var.path], var.numpy())


def test_skip_mismatch_in_a_config_serves_plan_merge_and_warm_start(tmp_path: Path) -> None:
    pre = functional(10)
    pre.save_weights(tmp_path / "pre.weights.h5")
    config = tmp_path / "c.yml"
    config.write_text(f"sources:\n  - path: {tmp_path / 'pre.weights.h5'}\nskip_mismatch: true\n")
    spec = _model_file(tmp_path, 3)
    checked = run("plan", config, "--model", spec)
    assert checked.exit_code == 0 and "Skipped (2)" in checked.stdout, checked.output
    merged = run("merge", config, "--model", spec, "-o", tmp_path / "m")
    assert merged.exit_code == 0 and "Left out (2)" in merged.stdout, merged.output
    new = functional(3)
    head = new.get_layer("head").kernel.numpy().copy()
    cm.warm_start(new, str(config))
    np.testing.assert_array_equal(new.get_layer("enc").kernel.numpy(), pre.get_layer("enc").kernel.numpy())
    np.testing.assert_array_equal(new.get_layer("head").kernel.numpy(), head)
    bad = tmp_path / "bad.yml"
    bad.write_text(f"sources:\n  - path: {tmp_path / 'pre.weights.h5'}\nskip_mismatch: sometimes\n")
    r = run("plan", bad, "--model", spec)
    assert r.exit_code == 2 and "skip_mismatch" in r.stderr, r.output
