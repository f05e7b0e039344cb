"""TF outputs restore natively (issue 33): ``tf.train.Checkpoint(...).restore`` of a merge or an
average of object-based inputs, checked with TensorFlow's own ``assert_consumed()`` and
``assert_existing_objects_matched()``, values compared with a NumPy average.

Checkpoints are written in the test by ``tf.train.Checkpoint`` / ``CheckpointManager`` of a tiny
Keras model (never trained: values are set from seeded random numbers) and of a ``tf.Module``.
The object graph's pruning is checked on TF's own graph proto too.
"""

from __future__ import annotations

import numpy as np
import pytest

import ckptmerge as cm
from _cli_util import run, save_tf1
from ckptmerge.formats.tf.graph_writer import UnsupportedGraph, prune_object_graph
from ckptmerge.formats.tf.objectgraph import OBJECT_GRAPH_KEY, parse_object_graph
from ckptmerge.formats.tf.protowire import field_bytes, field_varint

STEPS = (100, 200, 300)


def keras_model(units=3, *, name="d1"):
    import keras

    return keras.Sequential([keras.Input((4,)), keras.layers.Dense(units, name=name),
                             keras.layers.BatchNormalization(), keras.layers.Dense(2)])


class Block:
    """A tf.Module with a nested module and a list (built lazily: TF is imported by the tests)."""

    @staticmethod
    def make(tf, size=3):
        root = tf.Module()
        root.inner = tf.Module()
        root.inner.w = tf.Variable(np.zeros((size, 2), np.float32), name="w")
        root.layers = [tf.Variable(np.zeros((2,), np.float32), name="b0"),
                       tf.Variable(np.zeros((size,), np.float64), name="b1")]
        return root


def fill(variables, seed):
    rng = np.random.RandomState(seed)
    for v in variables:
        dtype = np.dtype(getattr(v.dtype, "as_numpy_dtype", v.dtype))
        v.assign(rng.standard_normal(tuple(v.shape)).astype(dtype))


def save_run(tf, directory, make, *, steps=STEPS, seed=0, **extra):
    """A CheckpointManager run of ``make()`` (its variables set anew before each save)."""
    obj = make()
    step = tf.Variable(0, dtype=tf.int64)
    ckpt = tf.train.Checkpoint(model=obj, step=step, **extra)
    mgr = tf.train.CheckpointManager(ckpt, str(directory), max_to_keep=10)
    for i, s in enumerate(steps):
        fill(obj.weights if hasattr(obj, "weights") else obj.variables, seed + i)
        step.assign(s)
        mgr.save(checkpoint_number=s)
    return [str(directory / f"ckpt-{s}") for s in steps]


def mean_by_key(tf, prefixes):
    readers = [tf.train.load_checkpoint(p) for p in prefixes]
    keys = [k for k in readers[0].get_variable_to_shape_map() if k != OBJECT_GRAPH_KEY]
    return {k: np.mean([r.get_tensor(k) for r in readers], axis=0) for k in keys}


def restore(tf, out, make, *, step=True):
    """Restore ``out`` into a fresh ``make()`` with TF's own checks; return the object."""
    obj = make()
    parts = {"model": obj}
    if step:
        parts["step"] = tf.Variable(0, dtype=tf.int64)
    if hasattr(obj, "build") and not obj.built:  # pragma: no cover - Sequential with Input is built
        obj.build((None, 4))
    status = tf.train.Checkpoint(**parts).restore(out)
    status.assert_consumed()
    status.assert_existing_objects_matched()
    return obj, parts.get("step")


def check_values(tf, out, prefixes, expect_step):
    """Every tensor of ``out`` is the mean of the inputs' (integers: the last input's)."""
    mean = mean_by_key(tf, prefixes)
    got = tf.train.load_checkpoint(out)
    shapes = got.get_variable_to_shape_map()
    assert OBJECT_GRAPH_KEY in shapes
    for k, v in mean.items():
        if k.startswith(("optimizer/", "save_counter")):
            continue
        if k.startswith("step/"):
            assert got.get_tensor(k) == expect_step
        else:
            np.testing.assert_allclose(got.get_tensor(k), v, rtol=1e-6)


# --------------------------------------------------------------------------------------------
# averages of a CheckpointManager run


@pytest.mark.parametrize("units", [3, 5])
def test_cli_average_of_keras_run_restores_with_tf_checkpoint(tf, tmp_path, units):
    prefixes = save_run(tf, tmp_path / "run", lambda: keras_model(units))
    result = run("average", tmp_path / "run", "--last", "3", "-o", tmp_path / "out" / "avg")
    assert result.exit_code == 0, result.output
    assert "Layout: object-based" in result.stdout
    out = str(tmp_path / "out" / "avg")
    check_values(tf, out, prefixes, 300)
    model, step = restore(tf, out, lambda: keras_model(units))
    mean = mean_by_key(tf, prefixes)
    assert int(step.numpy()) == 300
    ops = "model/_functional/_operations/"
    order = ["1/_kernel", "1/bias", "2/gamma", "2/beta", "2/moving_mean", "2/moving_variance", "3/_kernel", "3/bias"]
    assert len(model.weights) == len(order)
    for v, k in zip(model.weights, order):  # the model's weights, in its own order
        np.testing.assert_allclose(v.numpy(), mean[f"{ops}{k}/.ATTRIBUTES/VARIABLE_VALUE"], rtol=1e-6)


def test_api_combine_of_module_run_restores(tf, tmp_path):
    prefixes = save_run(tf, tmp_path / "run", lambda: Block.make(tf), seed=7)
    report = cm.merge([cm.combine(str(tmp_path / "run"), "mean", last=2)], tmp_path / "avg")
    assert report.tf_layout == "object-based" and report.notes == []
    assert report.to_dict()["tf_layout"] == "object-based"
    obj, step = restore(tf, str(tmp_path / "avg"), lambda: Block.make(tf))
    mean = mean_by_key(tf, prefixes[1:])
    np.testing.assert_allclose(obj.inner.w.numpy(), mean["model/inner/w/.ATTRIBUTES/VARIABLE_VALUE"], rtol=1e-6)
    np.testing.assert_allclose(obj.layers[1].numpy(), mean["model/layers/1/.ATTRIBUTES/VARIABLE_VALUE"])
    assert obj.layers[1].dtype == tf.float64 and int(step.numpy()) == 300
    # the save counter is the last input's: the next save of a restored Checkpoint numbers on from it
    counter = tf.train.load_checkpoint(str(tmp_path / "avg")).get_tensor("save_counter/.ATTRIBUTES/VARIABLE_VALUE")
    assert counter == 3


def test_optimizer_state_is_pruned_from_the_graph(tf, tmp_path):
    """A run saved with its optimizer (a Keras 3 optimizer tracks the model's variables too, and
    TF keys them under the optimizer's path): the average (model only) restores into a Checkpoint
    of the model alone, assert_consumed() included; no optimizer state is written."""
    import keras

    def make():
        return keras_model()

    opt = keras.optimizers.Adam()
    model = make()
    opt.build(model.trainable_variables)
    ckpt = tf.train.Checkpoint(model=model, optimizer=opt)
    mgr = tf.train.CheckpointManager(ckpt, str(tmp_path / "run"), max_to_keep=5)
    saved = []
    for i, s in enumerate(STEPS):
        fill(model.weights, i)
        fill([v for v in opt.variables if "float" in str(v.dtype)], 10 + i)
        saved.append([v.numpy() for v in model.weights])
        mgr.save(checkpoint_number=s)
    report = cm.merge([cm.combine(str(tmp_path / "run"), "mean", last=3)], tmp_path / "avg")
    assert report.tf_layout == "object-based"
    restored = make()
    status = tf.train.Checkpoint(model=restored).restore(str(tmp_path / "avg"))
    status.assert_consumed()
    status.assert_existing_objects_matched()
    for v, values in zip(restored.weights, zip(*saved)):
        np.testing.assert_allclose(v.numpy(), np.mean(values, axis=0), rtol=1e-6)
    names = [v.name for v in cm.list_variables(str(tmp_path / "avg"))]
    assert len(names) == len(restored.weights) + 2  # the graph and the save counter besides
    assert not [n for n in names if "iteration" in n or "learning_rate" in n]


def test_merge_of_one_object_based_source_keeps_its_graph(tf, tmp_path):
    """`ckptmerge merge` of one source with an exclude: the rest restores, the excluded stays as built."""
    prefixes = save_run(tf, tmp_path / "run", lambda: Block.make(tf), steps=(1,))
    report = cm.merge([cm.Source(prefixes[0], exclude=["b0"])], tmp_path / "m")
    assert report.tf_layout == "object-based"
    obj = Block.make(tf)
    status = tf.train.Checkpoint(model=obj, step=tf.Variable(0, dtype=tf.int64)).restore(str(tmp_path / "m"))
    for check in (status.assert_consumed, status.assert_existing_objects_matched):
        with pytest.raises(AssertionError, match="b0"):  # b0 was left out, and TF says so
            check()
    status.expect_partial()
    src = tf.train.load_checkpoint(prefixes[0])
    np.testing.assert_array_equal(obj.inner.w.numpy(), src.get_tensor("model/inner/w/.ATTRIBUTES/VARIABLE_VALUE"))
    assert not obj.layers[0].numpy().any()


# --------------------------------------------------------------------------------------------
# when the graph cannot be kept: name-based, said before writing; templates


def test_differing_graphs_are_written_name_based_with_a_note(tf, tmp_path):
    a = save_run(tf, tmp_path / "a", lambda: Block.make(tf), steps=(1,))[0]
    b = save_run(tf, tmp_path / "b", lambda: keras_model(), steps=(1,))[0]
    dry = cm.merge([cm.Source(a, exclude=["step"]), cm.Source(b)], tmp_path / "m", dry_run=True)
    assert dry.tf_layout == "name-based"
    assert "object graphs differ" in dry.notes[0] and "template=" in dry.notes[0]
    report = cm.merge([cm.Source(a, exclude=["step"]), cm.Source(b)], tmp_path / "m")
    assert report.tf_layout == "name-based" and "Note: Written name-based" in report.render()
    assert OBJECT_GRAPH_KEY not in tf.train.load_checkpoint(str(tmp_path / "m")).get_variable_to_shape_map()


def test_renamed_names_are_written_name_based_with_a_note(tf, tmp_path):
    a = save_run(tf, tmp_path / "a", lambda: Block.make(tf), steps=(1,))[0]
    report = cm.merge([cm.Source(a, map={"w": "encoder/w"})], tmp_path / "m")
    assert report.tf_layout == "name-based"
    assert "renamed" in report.notes[0] and "'encoder/w'" in report.notes[0]


def test_template_with_an_object_graph_gives_the_keys(tf, tmp_path):
    """Sources renamed onto a template's names: written under the template's keys and graph."""
    a = save_run(tf, tmp_path / "a", lambda: Block.make(tf), steps=(1,), seed=4)[0]
    root = tf.Module()
    root.enc = tf.Module()
    root.enc.w = tf.Variable(np.zeros((3, 2), np.float32), name="enc/w")
    template = tf.train.Checkpoint(net=root).save(str(tmp_path / "template"))  # (with a save_counter)
    report = cm.merge([cm.Source(a, map={"w": "enc/w"}, include=["w"])], tmp_path / "m", template=template)
    assert report.tf_layout == "object-based", report.render()
    fresh = tf.Module()
    fresh.enc = tf.Module()
    fresh.enc.w = tf.Variable(np.zeros((3, 2), np.float32))
    status = tf.train.Checkpoint(net=fresh).restore(str(tmp_path / "m"))
    status.assert_consumed()
    status.assert_existing_objects_matched()
    np.testing.assert_array_equal(fresh.enc.w.numpy(),
                                  tf.train.load_checkpoint(a).get_tensor("model/inner/w/.ATTRIBUTES/VARIABLE_VALUE"))


def test_name_based_inputs_stay_name_based(tf, tmp_path):
    p = save_tf1(str(tmp_path / "tf1" / "model.ckpt"), {"dense/kernel": np.ones((2, 3), np.float32),
                                                        "dense/bias": np.zeros(3, np.float32)})
    report = cm.merge([p], tmp_path / "m")
    assert report.tf_layout == "name-based" and report.notes == []
    assert "Layout" not in report.render() and "Note" not in report.render()
    keys = tf.train.load_checkpoint(str(tmp_path / "m")).get_variable_to_shape_map()
    assert sorted(keys) == ["dense/bias", "dense/kernel"]


def test_cli_merge_prints_the_note(tf, tmp_path):
    a = save_run(tf, tmp_path / "a", lambda: Block.make(tf), steps=(1,))[0]
    cfg = tmp_path / "m.yaml"
    cfg.write_text(f"sources:\n  - path: {a}\n    map: {{w: renamed/w}}\n", encoding="utf-8")
    result = run("merge", cfg, "-o", tmp_path / "m")
    assert result.exit_code == 0, result.output
    assert "Note: Written name-based" in result.stdout and "--template" in result.stdout


# --------------------------------------------------------------------------------------------
# the graph itself


def _ref(i, name):
    return field_bytes(1, field_varint(1, i) + field_bytes(2, name))


def _attr(key):
    return field_bytes(2, field_bytes(1, "VARIABLE_VALUE") + field_bytes(2, key.split("/")[0]) + field_bytes(3, key))


def test_prune_drops_nodes_without_values_and_renumbers():
    graph = b"".join([
        field_bytes(1, _ref(1, "a") + _ref(2, "opt") + _ref(3, "b")),
        field_bytes(1, _attr("a/.ATTRIBUTES/VARIABLE_VALUE")),
        field_bytes(1, _ref(4, "m")),                      # the optimizer, with a slot below
        field_bytes(1, _attr("b/.ATTRIBUTES/VARIABLE_VALUE")),
        field_bytes(1, _attr("opt/m/.ATTRIBUTES/VARIABLE_VALUE")),
    ])
    pruned = parse_object_graph(prune_object_graph(graph, ["b/.ATTRIBUTES/VARIABLE_VALUE"]))
    assert [[(r.node_id, r.local_name) for r in n.children] for n in pruned.nodes] == [[(1, "b")], []]
    assert [a.checkpoint_key for a in pruned.nodes[1].attributes] == ["b/.ATTRIBUTES/VARIABLE_VALUE"]
    whole = parse_object_graph(prune_object_graph(graph, ["a/.ATTRIBUTES/VARIABLE_VALUE", "b/.ATTRIBUTES/VARIABLE_VALUE",
                                                          "opt/m/.ATTRIBUTES/VARIABLE_VALUE"]))
    assert len(whole.nodes) == 5


def test_prune_refuses_a_registered_saver():
    graph = field_bytes(1, _ref(1, "a")) + field_bytes(1, _attr("a/x") + field_bytes(4, field_bytes(1, "saver")))
    with pytest.raises(UnsupportedGraph):
        prune_object_graph(graph, ["a/x"])


def test_pruned_graph_parses_with_tensorflow(tf, tmp_path):
    """TF's own proto reads the pruned graph: has_checkpoint_values set as TF sets it."""
    from tensorflow.core.protobuf import trackable_object_graph_pb2

    prefix = save_run(tf, tmp_path / "run", lambda: Block.make(tf), steps=(1,))[0]
    raw = tf.train.load_checkpoint(prefix).get_tensor(OBJECT_GRAPH_KEY)
    keep = ["model/inner/w/.ATTRIBUTES/VARIABLE_VALUE"]
    proto = trackable_object_graph_pb2.TrackableObjectGraph.FromString(prune_object_graph(raw, keep))
    assert len(proto.nodes) == 4  # root, model, model.inner, model.inner.w
    assert all(n.has_checkpoint_values.value for n in proto.nodes)
    assert [c.local_name for c in proto.nodes[0].children] == ["model"]


def test_a_model_template_keeps_the_inputs_graph(tf, tmp_path):
    """A model (or specs) as the template chooses the names; the keys stay the inputs' own graph's
    (the names must be the inputs' own: layers named here, as auto names shift in one process)."""
    import keras

    def named():
        return keras.Sequential([keras.Input((4,)), keras.layers.Dense(4, name="d1"),
                                 keras.layers.BatchNormalization(name="bn"), keras.layers.Dense(2, name="d2")],
                                name="net")

    prefixes = save_run(tf, tmp_path / "run", named, steps=(1, 2))
    report = cm.merge([cm.combine(str(tmp_path / "run"), "mean", exclude=["step"])], tmp_path / "avg",
                      template=named())
    assert report.tf_layout == "object-based", report.render()
    model, _ = restore(tf, str(tmp_path / "avg"), named, step=False)
    mean = mean_by_key(tf, prefixes)
    np.testing.assert_allclose(model.layers[0].kernel.numpy(),
                               mean["model/_functional/_operations/1/_kernel/.ATTRIBUTES/VARIABLE_VALUE"], rtol=1e-6)
    specs = cm.list_variables(prefixes[0])
    as_specs = cm.merge([prefixes[0]], tmp_path / "s", template=[v for v in specs if v.kind == "variable"])
    assert as_specs.tf_layout == "object-based"
