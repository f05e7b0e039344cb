"""Keras files restore as Keras loads them, and a model's own name is no barrier (issue 9, 1-2).

Every test builds real Keras 3 models, saves them with Keras (``save_weights``, ``model.save``)
and compares each restored weight with a twin model loaded by Keras's own ``load_weights``.
"""

from __future__ import annotations

import zipfile

import numpy as np
import pytest

import ckptmerge as cm
from _cli_util import run
from _corpus import corpus
from ckptmerge.formats.keras.names import archive_names, snake_case


def _churn():
    """The issue's example: a Keras 3 model.weights.h5 from the corpus (Sequential of 3 Dense)."""
    return str(corpus() / "keras3-weights-h5-churn" / "model.weights.h5")


def _randomize(model, seed=0):
    rng = np.random.default_rng(seed)
    for v in model.weights:
        v.assign(rng.standard_normal(v.shape).astype(v.dtype))


def _rich_model(keras):
    """Functional model: Embedding, LSTM, GRU, MultiHeadAttention, BatchNormalization, a nested
    Sequential and a model inside a custom layer."""

    class Wrap(keras.layers.Layer):
        def __init__(self, **kw):
            super().__init__(**kw)
            self.inner = keras.Sequential([keras.layers.Dense(3), keras.layers.LayerNormalization()])

        def build(self, shape):
            self.inner.build(shape)

        def call(self, x):
            return self.inner(x)

    inp = keras.Input((6,), dtype="int32")
    x = keras.layers.Embedding(20, 4)(inp)
    x = keras.layers.LSTM(5, return_sequences=True)(x)
    x = keras.layers.GRU(4, return_sequences=True)(x)
    x = keras.layers.MultiHeadAttention(2, 3)(x, x)
    x = keras.layers.GlobalAveragePooling1D()(x)
    enc = keras.Sequential([keras.layers.Dense(4), keras.layers.BatchNormalization()], name="encoder")
    x = enc(x)
    x = Wrap()(x)
    return keras.Model(inp, keras.layers.Dense(2, name="head")(x))


def _assert_same_weights(a, b):
    assert len(a.weights) == len(b.weights)
    for va, vb in zip(a.weights, b.weights):
        np.testing.assert_array_equal(va.numpy(), vb.numpy(), err_msg=va.path)


def test_weights_h5_restores_exactly_what_load_weights_restores(tmp_path, tf):
    import keras

    saved = _rich_model(keras)
    _randomize(saved)
    path = str(tmp_path / "rich.weights.h5")
    saved.save_weights(path)
    ours, theirs = _rich_model(keras), _rich_model(keras)  # fresh models: other auto-names
    assert [v.path for v in ours.weights] != [v.path for v in saved.weights]
    report = cm.restore(ours, [cm.Source(path)])
    theirs.load_weights(path)
    _assert_same_weights(ours, theirs)
    _assert_same_weights(ours, saved)
    assert len(report.restored) == len(ours.weights) == 27
    assert not report.plan.missing and not report.plan.structure


def test_report_shows_the_raw_h5_key_beside_each_target(tmp_path, tf):
    import keras

    model = _rich_model(keras)
    path = str(tmp_path / "m.weights.h5")
    model.save_weights(path)
    text = cm.plan(model, [cm.Source(path, name="w")]).report()
    head = [line for line in text.splitlines() if line.strip().startswith("head/kernel <-")]
    assert head == ["  head/kernel <- w:'head/kernel' float32 (3, 2) [h5 'layers/dense/vars/0']"]
    assert "[h5 'layers/multi_head_attention/query_dense/vars/1']" in text


def test_corpus_weights_h5_restores_into_a_fresh_sequential_with_no_map(tf):
    import keras

    def build():
        return keras.Sequential([keras.Input((12,)), keras.layers.Dense(64), keras.layers.Dense(32),
                                 keras.layers.Dense(1)])

    churn = _churn()
    build()  # takes the names dense, dense_1, dense_2: ours get dense_3 ... and sequential_1
    ours, theirs = build(), build()
    plan = cm.plan(ours, [cm.Source(churn)])
    assert (len(plan.assignments), plan.missing, plan.unused[churn]) == (6, [], [])
    plan.restore()
    theirs.load_weights(churn)
    _assert_same_weights(ours, theirs)


def test_optimizer_entries_are_left_out_unless_optimizer_true(tf):
    import keras

    model = keras.Sequential([keras.Input((12,)), keras.layers.Dense(64), keras.layers.Dense(32),
                              keras.layers.Dense(1)])
    plan = cm.plan(model, [cm.Source(_churn(), name="c")])
    assert plan.unused["c"] == [] and plan.ok
    with_opt = cm.plan(model, [cm.Source(_churn(), name="c", optimizer=True)])
    assert "optimizer/vars/0" in with_opt.unused["c"] and len(with_opt.assignments) == 6
    # the model has no optimizer to restore the state into: a finding, not a silent partial restore
    assert [t.split(":")[0] for _, t in with_opt.structure] == [
        "the file holds optimizer state (14 entries under 'optimizer/') but the model has no optimizer"]
    assert cm.plan(model, [cm.Source(_churn(), name="c", optimizer=True, exclude=["optimizer/*"])]).ok


def test_a_file_of_another_architecture_is_a_structure_finding(tmp_path, tf):
    import keras

    small = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3), keras.layers.Dense(2)])
    path = str(tmp_path / "small.weights.h5")
    small.save_weights(path)
    big = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3), keras.layers.Dense(2),
                            keras.layers.Dense(2)])
    plan = cm.plan(big, [cm.Source(path, name="s")])
    assert len(plan.assignments) == 4
    third = big.layers[2].name
    assert plan.structure == [("s", f"the model's layer at 'layers/dense_2' ('{big.name}/{third}/bias', "
                                    f"'{big.name}/{third}/kernel') has no entries in the file; load_weights "
                                    f"would fail: Layer '{third}' expected 2 variables, but received 0 "
                                    "variables during loading. Expected: ['kernel', 'bias']")]
    with pytest.raises(cm.PlanError, match="structure: source 's': the model's layer at 'layers/dense_2'"):
        plan.check()
    plan = cm.plan(small, [cm.Source(str(tmp_path / "small.weights.h5"), name="s")])
    assert plan.ok
    big.save_weights(str(tmp_path / "big.weights.h5"))
    extra = cm.plan(small, [cm.Source(str(tmp_path / "big.weights.h5"), name="b")])
    assert [t for _, t in extra.structure] == [
        "the file's 'layers/dense_2' holds 2 entries ('layers/dense_2/vars/0', 'layers/dense_2/vars/1') "
        "that the model's own walk (as Keras's load_weights) does not reach: the file was saved "
        "from another architecture"]
    assert "Structure (1) - names that do not line up:" in extra.report()


def test_weights_h5_mixes_with_other_sources_and_rules(tmp_path, tf):
    import keras

    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3), keras.layers.Dense(2)], name="m")
    _randomize(model, 1)
    path = str(tmp_path / "m.weights.h5")
    model.save_weights(path)
    want = {v.path: v.numpy().copy() for v in model.weights}
    _randomize(model, 2)
    bias = np.arange(2, dtype=np.float32)
    second = model.layers[1].bias.path
    report = cm.restore(model, [cm.Source(path, exclude=[second]),
                                cm.Source.from_values({"b": bias}, map={"b": second})])
    assert len(report.restored) == 4
    np.testing.assert_array_equal(model.layers[1].bias.numpy(), bias)
    np.testing.assert_array_equal(model.layers[0].kernel.numpy(), want[model.layers[0].kernel.path])


def test_keras_archive_is_a_source_named_from_its_config(tmp_path, tf):
    import keras

    saved = _rich_model(keras)
    _randomize(saved, 3)
    path = tmp_path / "rich.keras"
    saved.save(str(path))
    with zipfile.ZipFile(path) as z:
        assert z.getinfo("model.weights.h5").compress_type == zipfile.ZIP_STORED
    names = {v.name: v.raw_key for v in cm.list_variables(path, optimizer=False)}
    assert names == {v.path: k for k, v in _walk(saved).items()}  # Keras's own paths
    assert names["head/kernel"] == "layers/dense/vars/0"
    mha = next(layer.name for layer in saved.layers if type(layer).__name__ == "MultiHeadAttention")
    assert names[f"{mha}/query/bias"] == "layers/multi_head_attention/query_dense/vars/1"
    bn = saved.get_layer("encoder").layers[1].name
    assert names[f"encoder/{bn}/moving_variance"] == "layers/sequential/layers/batch_normalization/vars/3"
    ours, theirs = _rich_model(keras), _rich_model(keras)
    cm.restore(ours, [cm.Source(path)])
    theirs.load_weights(str(path))
    _assert_same_weights(ours, theirs)
    _assert_same_weights(ours, saved)


def _walk(model):
    from ckptmerge.restoring.keraswalk import weights_file_keys

    targets = {id(v) for v in model.weights}
    return {k: v for k, v in weights_file_keys(model).items() if id(v) in targets}


def test_ls_of_a_keras_archive_shows_layer_names_and_raw_keys_under_all(tmp_path, tf):
    import keras

    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2, name="proj", use_bias=False),
                              keras.layers.Dense(1, name="out")], name="net")
    path = tmp_path / "net.keras"
    model.save(str(path))
    r = run("ls", path)
    assert r.exit_code == 0, r.output
    rows = [line.split()[0] for line in r.stdout.splitlines()[2:-1]]
    assert rows == ["net/out/bias", "net/out/kernel", "net/proj/kernel"]  # as variable.path names them
    assert rows == sorted(v.path for v in model.weights)
    r = run("ls", path, "--all")
    assert any("net/proj/kernel" in line and "layers/dense/vars/0" in line for line in r.stdout.splitlines())


def test_a_zip_named_keras_without_weights_is_a_clear_error(tmp_path):
    bad = tmp_path / "m.keras"
    with zipfile.ZipFile(bad, "w") as z:
        z.writestr("config.json", "{}")
    with pytest.raises(cm.CheckpointFormatError, match="not a Keras '.keras' model archive"):
        cm.list_variables(bad)


def test_archive_names_fall_back_to_vars_index_for_unknown_classes():
    got = archive_names(["layers/my_block/vars/0", "layers/my_block/vars/1", "vars/0", "optimizer/vars/0"],
                        {"": "net", "layers/my_block": "blk"})
    assert got == {"layers/my_block/vars/0": "blk/vars/0", "layers/my_block/vars/1": "blk/vars/1",
                   "vars/0": "vars/0"}
    assert archive_names(["layers/dense/vars/0"], {}) == {}  # no recorded names: raw keys stay
    assert snake_case("MultiHeadAttention") == "multi_head_attention"


def test_legacy_h5_is_named_by_each_weight_name_without_output_suffix(tmp_path, tf):
    import h5py
    import keras

    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2, name="d")], name="legacy")
    _randomize(model, 5)
    path = str(tmp_path / "full.h5")
    model.save(path)  # Keras 3 writes the legacy (Keras 2) full-model h5 for a '.h5' name
    infos = {v.name: v.raw_key for v in cm.list_variables(path, optimizer=False)}
    assert infos == {"legacy/d/kernel": "model_weights/d/legacy/d/kernel",
                     "legacy/d/bias": "model_weights/d/legacy/d/bias"}
    fresh = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2, name="d")], name="legacy")
    cm.restore(fresh, [cm.Source(path)])
    _assert_same_weights(fresh, model)
    keras2 = str(tmp_path / "keras2.h5")  # as tf.keras 2's save_weights lays it out
    with h5py.File(keras2, "w") as f:
        f.attrs["layer_names"] = [b"dense"]
        f.create_group("dense").attrs["weight_names"] = [b"dense/kernel:0", b"dense/bias:0"]
        f["dense/dense/kernel:0"] = np.ones((3, 2), np.float32)
        f["dense/dense/bias:0"] = np.zeros(2, np.float32)
    assert [(v.name, v.raw_key) for v in cm.list_variables(keras2)] == [
        ("dense/bias", "dense/dense/bias:0"), ("dense/kernel", "dense/dense/kernel:0")]


# -- a model's own name is no barrier ---------------------------------------------------------

def test_checkpoint_of_sequential_restores_into_sequential_1(tmp_path, tf):
    import keras

    def build():
        return keras.Sequential([keras.Input((3,)), keras.layers.Dense(2, name="d")])

    first = build()
    _randomize(first, 4)
    prefix = tf.train.Checkpoint(model=first).write(str(tmp_path / "ck"))
    second = build()
    assert first.name != second.name
    plan = cm.plan(second, [cm.Source(prefix, name="ck")])
    a = plan.assignments[f"{second.name}/d/kernel"]
    assert a.name == f"{first.name}/d/kernel"
    assert a.via == f"model root: '{first.name}/d/kernel' as '{second.name}/d/kernel'"
    plan.restore()
    _assert_same_weights(first, second)


def test_names_without_a_model_root_restore_into_a_sequential(tmp_path, tf):
    import keras

    values = {"d/kernel": np.ones((3, 2), np.float32), "d/bias": np.full(2, 5, np.float32)}
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2, name="d")], name="sequential")
    cm.restore(model, [cm.Source.from_values(values)])
    np.testing.assert_array_equal(model.layers[0].bias.numpy(), values["d/bias"])


def test_ambiguous_root_swap_is_a_finding_never_a_guess():
    from ckptmerge.planning.planner import root_swaps

    swaps, findings = root_swaps(["m/k"], ["r/m/k", "r/k"], "r")
    assert swaps == {}
    assert findings == ["'m/k' fits 'r/k' and 'r/m/k' once the model's root name is ignored; "
                        "map it explicitly (map={...})"]


def test_root_swap_findings_block_a_strict_plan():
    from ckptmerge.planning.planner import SourceView, make_plan
    from ckptmerge.core.specs import VariableInfo

    spec = VariableInfo("m/k", (2,), "float32")
    targets = [VariableInfo("r/m/k", (2,), "float32"), VariableInfo("r/k", (2,), "float32")]
    plan = make_plan(targets, [SourceView("A", "<memory>", "", {"m/k": spec})], model_root="r")
    assert plan.structure and not plan.ok and plan.missing == ["r/k", "r/m/k"]
    plain = make_plan(targets, [SourceView("A", "<memory>", "", {"m/k": spec})])
    assert plain.structure == []
