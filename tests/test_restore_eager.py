"""The core scenario in eager mode: variable lists, tf.Module and Keras 3 models."""

from __future__ import annotations

import numpy as np
import pytest

import ckptmerge as cm


def _keras_model(n_classes=3, name=None):
    import keras

    inp = keras.Input((8,))
    h = keras.layers.Dense(16, name="enc1")(inp)
    h = keras.layers.Dense(16, name="enc2")(h)
    out = keras.layers.Dense(n_classes, name="head")(h)
    return keras.Model(inp, out, name=name)


def _values(model):
    return {v.path: v.numpy().copy() for v in model.weights}


def test_abc_scenario_restores_exact_values_into_a_dict_of_variables(tf, ab_checkpoints):
    ab = ab_checkpoints
    c = {"c/x1": tf.Variable(np.zeros((3, 4), np.float32)), "c/y1": tf.Variable(np.zeros(4, np.float32)),
         "c/z": tf.Variable(np.ones(2, np.float32))}
    sources = [cm.Source(ab["A"], map={"a1": "c/x1"}), cm.Source(ab["B"], map={"b1": c["c/y1"]})]
    report = cm.restore(c, sources, allow_missing=["c/z"])
    np.testing.assert_array_equal(c["c/x1"].numpy(), ab["a"]["a1"])
    np.testing.assert_array_equal(c["c/y1"].numpy(), ab["b"]["b1"])
    np.testing.assert_array_equal(c["c/z"].numpy(), np.ones(2, np.float32))
    assert report.mode == "eager"


def test_tf_module_targets_are_named_by_explicit_name_else_attribute_path(tf, ab_checkpoints):
    class C(tf.Module):
        def __init__(self):
            super().__init__()
            self.x1 = tf.Variable(np.zeros((3, 4), np.float32), name="c/x1")
            self.head = tf.Module()
            self.head.y = tf.Variable(np.zeros(4, np.float32))  # automatic name -> path head/y

    m = C()
    ab = ab_checkpoints
    plan = cm.plan(m, [cm.Source(ab["A"], map={"a1": "c/x1"}), cm.Source(ab["B"], map={"b1": "head/y"})])
    assert sorted(plan.assignments) == ["c/x1", "head/y"]
    plan.restore()
    np.testing.assert_array_equal(m.head.y.numpy(), ab["b"]["b1"])


def test_keras_encoder_from_one_checkpoint_and_head_from_another(tf, tmp_path):
    pre, cls, fresh = _keras_model(5, "pre"), _keras_model(3, "cls"), _keras_model(3, "fresh")
    p1 = tf.train.Checkpoint(model=pre).write(str(tmp_path / "pre" / "ckpt"))
    p2 = tf.train.Checkpoint(model=cls).write(str(tmp_path / "cls" / "ckpt"))
    cm.restore(fresh, [cm.Source(p1, include=["enc*"]), cm.Source(p2, include=["head/*"])])
    got, want_enc, want_head = _values(fresh), _values(pre), _values(cls)
    for name in ["enc1/kernel", "enc1/bias", "enc2/kernel", "enc2/bias"]:
        np.testing.assert_array_equal(got[name], want_enc[name])
    for name in ["head/kernel", "head/bias"]:
        np.testing.assert_array_equal(got[name], want_head[name])


def test_keras_head_with_other_class_count_is_a_shape_finding_naming_both_shapes(tf, tmp_path):
    pre, fresh = _keras_model(5, "pre"), _keras_model(3, "fresh")
    p = tf.train.Checkpoint(model=pre).write(str(tmp_path / "ckpt"))
    before = _values(fresh)
    with pytest.raises(cm.PlanError) as err:
        cm.restore(fresh, [p])
    msg = str(err.value)
    assert "head/kernel" in msg and "(16, 3)" in msg and "(16, 5)" in msg
    assert {m.target for m in err.value.plan.mismatched} == {"head/kernel", "head/bias"}
    for k, v in _values(fresh).items():  # nothing changed
        np.testing.assert_array_equal(v, before[k])


def test_on_shape_mismatch_skip_leaves_the_head_as_it_was(tf, tmp_path):
    pre, fresh = _keras_model(5, "pre"), _keras_model(3, "fresh")
    p = tf.train.Checkpoint(model=pre).write(str(tmp_path / "ckpt"))
    head_before = fresh.get_layer("head").kernel.numpy().copy()
    report = cm.restore(fresh, [p], on_shape_mismatch="skip")
    np.testing.assert_array_equal(fresh.get_layer("head").kernel.numpy(), head_before)
    np.testing.assert_array_equal(fresh.get_layer("enc1").kernel.numpy(), pre.get_layer("enc1").kernel.numpy())
    assert sorted(n for n, _ in report.skipped) == ["head/bias", "head/kernel"]


def test_object_based_checkpoint_restores_into_same_structure_without_a_map(tf, tmp_path):
    import keras

    src, dst = _keras_model(3, "a"), _keras_model(3, "b")
    opt = keras.optimizers.Adam()
    src.compile(opt, "mse")
    src.fit(np.ones((4, 8), np.float32), np.ones((4, 3), np.float32), verbose=0)
    # With the optimizer in the checkpoint, TF stores the weights under optimizer/_trainable_variables.
    p = tf.train.Checkpoint(model=src, optimizer=opt).write(str(tmp_path / "ckpt"))
    plan = cm.plan(dst, [p])
    assert plan.missing == [] and plan.mismatched == []
    assert all(not n.startswith(f"{opt.name}/") for n in plan.assignments)  # adam_1 after other tests
    plan.restore()
    for k, v in _values(dst).items():
        np.testing.assert_array_equal(v, _values(src)[k])


def test_conflict_is_a_finding_unless_resolved_by_source_order(tf, ab_checkpoints):
    ab = ab_checkpoints
    v = {"t": tf.Variable(np.zeros(4, np.float32))}
    srcs = [cm.Source(ab["A"], map={"a2": "t"}, name="A"), cm.Source(ab["B"], map={"b1": "t"}, name="B")]
    with pytest.raises(cm.PlanError, match="conflict"):
        cm.restore(v, srcs)
    cm.restore(v, srcs, on_conflict="first")
    np.testing.assert_array_equal(v["t"].numpy(), ab["a"]["a2"])
    cm.restore(v, srcs, on_conflict="last")
    np.testing.assert_array_equal(v["t"].numpy(), ab["b"]["b1"])


def test_strict_failure_leaves_every_target_unchanged(tf, ab_checkpoints):
    ab = ab_checkpoints
    c = {"c/x1": tf.Variable(np.full((3, 4), 7, np.float32)), "c/y1": tf.Variable(np.full(5, 7, np.float32))}
    with pytest.raises(cm.PlanError) as err:  # c/y1 has the wrong shape for b1
        cm.restore(c, [cm.Source(ab["A"], map={"a1": "c/x1"}), cm.Source(ab["B"], map={"b1": "c/y1"})])
    assert "(5,)" in str(err.value) and "(4,)" in str(err.value)
    np.testing.assert_array_equal(c["c/x1"].numpy(), np.full((3, 4), 7, np.float32))


def test_corrupt_second_source_fails_and_changes_no_variable_in_eager_mode(tf, ab_checkpoints):
    ab = ab_checkpoints
    data = ab["B"] + ".data-00000-of-00001"
    raw = open(data, "rb").read()
    open(data, "wb").write(bytes(x ^ 0xFF for x in raw))
    c = {"c/x1": tf.Variable(np.zeros((3, 4), np.float32)), "c/y1": tf.Variable(np.zeros(4, np.float32))}
    with pytest.raises(cm.RestoreError) as err:
        cm.restore(c, [cm.Source(ab["A"], map={"a1": "c/x1"}), cm.Source(ab["B"], map={"b1": "c/y1"})])
    assert "data-00000-of-00001" in str(err.value)
    np.testing.assert_array_equal(c["c/x1"].numpy(), np.zeros((3, 4), np.float32))


def test_bfloat16_and_int_values_restore_bit_exact(tf, tmp_path):
    vals = {"bf": tf.constant([1.5, -3.0, 0.1], tf.bfloat16), "i": tf.constant([1, 2, 3], tf.int64)}
    src = {k: tf.Variable(v) for k, v in vals.items()}
    p = tf.train.Checkpoint(**src).write(str(tmp_path / "ckpt"))
    dst = {"bf": tf.Variable(tf.zeros(3, tf.bfloat16)), "i": tf.Variable(tf.zeros(3, tf.int64))}
    cm.restore(dst, [cm.Source(p, regex=[(r"(\w+)", r"\1")])])
    for k in vals:
        np.testing.assert_array_equal(dst[k].numpy(), vals[k].numpy())


def test_reader_buffers_are_64_byte_aligned_so_restores_hand_them_over_without_copies(ab_checkpoints):
    from ckptmerge.formats import open_checkpoint

    with open_checkpoint(ab_checkpoints["B"]) as r:
        arrays = r.read_many([v.name for v in r.variables()])
        single = r.get("b1")
    assert all(a.ctypes.data % 64 == 0 for a in arrays.values())
    assert single.ctypes.data % 64 == 0


def test_saved_model_directory_is_a_source_of_its_variables(tf, tmp_path):
    class Net(tf.Module):
        def __init__(self, scale):
            super().__init__()
            self.w = tf.Variable(np.full((2, 3), scale, np.float32), name="w")
            self.b = tf.Variable(np.full(3, scale, np.float32), name="b")

        @tf.function(input_signature=[tf.TensorSpec((None, 2), tf.float32)])
        def __call__(self, x):
            return x @ self.w + self.b

    tf.saved_model.save(Net(2.0), str(tmp_path / "sm"))
    fresh = Net(0.0)
    plan = cm.plan(fresh, [cm.Source(str(tmp_path / "sm"))])
    assert "SavedModel" in plan.report()
    plan.restore()
    np.testing.assert_array_equal(fresh.w.numpy(), np.full((2, 3), 2.0, np.float32))
    np.testing.assert_array_equal(fresh.b.numpy(), np.full(3, 2.0, np.float32))


FINDINGS = {
    # kind: (target spec {name: shape or (shape, dtype)}, sources(ab), the problem target or None)
    "missing": ({"c/x1": (3, 4), "c/q": (2,)}, lambda ab: [cm.Source(ab["A"], map={"a1": "c/x1"})], "c/q"),
    "shape": ({"c/x1": (3, 4), "c/y1": (5,)},
              lambda ab: [cm.Source(ab["A"], map={"a1": "c/x1"}), cm.Source(ab["B"], map={"b1": "c/y1"})], "c/y1"),
    "dtype": ({"c/x1": (3, 4), "c/y1": ((4,), np.float64)},
              lambda ab: [cm.Source(ab["A"], map={"a1": "c/x1"}), cm.Source(ab["B"], map={"b1": "c/y1"})], "c/y1"),
    "conflict": ({"c/x1": (3, 4), "c/t": (4,)},
                 lambda ab: [cm.Source(ab["A"], map={"a1": "c/x1", "a2": "c/t"}, name="A"),
                             cm.Source(ab["B"], map={"b1": "c/t"}, name="B")], "c/t"),
    "unmatched include": ({"c/x1": (3, 4)},
                          lambda ab: [cm.Source(ab["A"], map={"a1": "c/x1"}),
                                      cm.Source(ab["B"], include=["encoder/*"])], None),
}


def _targets(tf, spec):
    out = {}
    for name, s in spec.items():
        shape, dtype = (s if isinstance(s[0], tuple) else (s, np.float32))
        out[name] = tf.Variable(np.full(shape, 7, dtype))
    return out


@pytest.mark.parametrize("kind", sorted(FINDINGS))
def test_each_finding_blocks_a_strict_restore_and_a_lenient_one_restores_the_rest(tf, ab_checkpoints, kind):
    spec, sources, problem = FINDINGS[kind]
    ab = ab_checkpoints
    targets = _targets(tf, spec)
    before = {k: v.numpy().copy() for k, v in targets.items()}
    with pytest.raises(cm.PlanError) as err:
        cm.restore(targets, sources(ab))
    assert len(err.value.plan.blocking(strict=True)) >= 1
    for k, v in targets.items():  # strict: nothing changed
        np.testing.assert_array_equal(v.numpy(), before[k])
    report = cm.restore(targets, sources(ab), strict=False)
    np.testing.assert_array_equal(targets["c/x1"].numpy(), ab["a"]["a1"])  # what matches is restored
    if problem is not None:
        np.testing.assert_array_equal(targets[problem].numpy(), before[problem])  # the rest kept
        assert [t for t, _ in report.skipped] == [problem]
        assert "strict=False" in report.skipped[0][1]


def test_one_checkpoint_name_feeding_two_variables_gives_each_its_own_buffer(tf, ab_checkpoints):
    ab = ab_checkpoints
    c = {"x": tf.Variable(np.zeros(4, np.float32)), "y": tf.Variable(np.zeros(4, np.float32))}
    cm.restore(c, [cm.Source(ab["B"], map={"b1": ["x", "y"]})])
    np.testing.assert_array_equal(c["x"].numpy(), ab["b"]["b1"])
    np.testing.assert_array_equal(c["y"].numpy(), ab["b"]["b1"])
    c["x"].assign_add(np.ones(4, np.float32))
    np.testing.assert_array_equal(c["y"].numpy(), ab["b"]["b1"])
