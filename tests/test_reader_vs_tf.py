"""The reader against checkpoints written by TensorFlow in the test: values, names, kinds.

Every checkpoint here is written by real TF (graph-mode Saver with partitioners and two CPU
devices for sharding, tf.train.Checkpoint, CheckpointManager, Keras 3) and read back both with
ckptmerge and with ``tf.train.load_checkpoint``.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from _reader_util import (ALL_DTYPES, random_value, same_value, tf, tf_tensors,
                          write_saver_checkpoint)
from ckptmerge.core.errors import CheckpointFormatError
from ckptmerge.formats import BundleReader, UnknownTensorError, list_variables, open_checkpoint
from ckptmerge.formats.dtypes import dtype_name
from ckptmerge.core.specs import KIND_BOOKKEEPING, KIND_OPTIMIZER, KIND_VARIABLE

REPO = Path(__file__).resolve().parents[1]


def _check_against_tf(prefix: str, specs) -> None:
    """ckptmerge == what was written, and == TF's reader wherever TF can read the tensor."""
    expected = {s["name"]: s for s in specs}
    theirs = tf_tensors(prefix)
    with open_checkpoint(prefix) as reader:
        infos = {v.name: v for v in reader.variables()}
        assert sorted(infos) == sorted(expected)
        assert sorted(infos) == sorted(theirs)
        many = reader.read_many(sorted(infos))
        for name, spec in expected.items():
            info = infos[name]
            assert info.shape == spec["value"].shape, name
            assert info.dtype == spec["dtype"], name
            mine = reader.get(name)
            assert mine.flags.c_contiguous and mine.flags.writeable
            assert same_value(mine, spec["value"]), name
            assert same_value(many[name], spec["value"]), name
            if not isinstance(theirs[name], Exception):
                assert same_value(mine, theirs[name]), name
            else:  # TF itself fails on some partitioned dtypes; never on plain ones
                assert spec.get("partitions", 0) > 1, (name, theirs[name])


# --------------------------------------------------------------------------------------------
# Name-based (TF1 Saver) checkpoints
# --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", ALL_DTYPES)
def test_every_dtype_round_trips_plain_and_partitioned(tmp_path, dtype):
    rng = np.random.default_rng(len(dtype))
    specs = [
        {"name": f"plain/{dtype}", "dtype": dtype, "value": random_value(rng, dtype, (3, 2))},
        {"name": f"scalar_{dtype}", "dtype": dtype, "value": random_value(rng, dtype, ())},
        {"name": f"empty_{dtype}", "dtype": dtype, "value": random_value(rng, dtype, (0, 4))},
        {"name": f"parts/{dtype}", "dtype": dtype, "value": random_value(rng, dtype, (5, 3)),
         "partitions": 3},
    ]
    _check_against_tf(write_saver_checkpoint(str(tmp_path / "m.ckpt"), specs), specs)


def test_sharded_saver_writes_two_shards_and_both_read(tmp_path):
    rng = np.random.default_rng(0)
    specs = [{"name": f"dev{d}/w{i}", "dtype": "float32", "device": d,
              "value": random_value(rng, "float32", (4, i + 1))} for d in (0, 1) for i in range(3)]
    specs.append({"name": "dev1/words", "dtype": "string", "device": 1,
                  "value": random_value(rng, "string", (3,))})
    specs.append({"name": "dev0/split", "dtype": "float32", "device": 0, "partitions": 2,
                  "value": random_value(rng, "float32", (6, 2))})
    prefix = write_saver_checkpoint(str(tmp_path / "m.ckpt"), specs, sharded=True)
    assert sorted(p.name for p in tmp_path.glob("m.ckpt.data-*")) == [
        "m.ckpt.data-00000-of-00002", "m.ckpt.data-00001-of-00002"]
    with BundleReader(prefix) as reader:
        assert reader.num_shards == 2
        assert {e.shard_id for e in reader.entries.values()} == {0, 1}
    _check_against_tf(prefix, specs)


def test_partitioned_variable_lists_only_its_full_name(tmp_path):
    value = np.arange(30, dtype=np.float32).reshape(10, 3)
    prefix = write_saver_checkpoint(str(tmp_path / "m"), [
        {"name": "emb/table", "dtype": "float32", "value": value, "partitions": 3}])
    with BundleReader(prefix) as reader:
        assert [(v.name, v.shape, v.nbytes) for v in reader.variables()] == [("emb/table", (10, 3), 120)]
        assert sum(k.startswith("\x00") for k in reader.entries) == 3
        assert reader.entries["emb/table"].slices[1] == ((4, 3), (0, 3))
        np.testing.assert_array_equal(reader.get("emb/table"), value)


_NAMES = st.lists(
    st.tuples(st.sampled_from(["", "enc/", "enc/layer_0/", "head/", "a-b/c.d/"]),
              st.sampled_from(["kernel", "bias", "w", "Variable", "emb", "x_1"])),
    min_size=1, max_size=6, unique_by=lambda t: t[0] + t[1])
_SHAPES = st.lists(st.integers(0, 4), min_size=0, max_size=3).map(tuple)


@settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))
@given(names=_NAMES, data=st.data(), sharded=st.booleans(), seed=st.integers(0, 2**32 - 1))
def test_random_checkpoints_read_like_tensorflow(names, data, sharded, seed):
    rng = np.random.default_rng(seed)
    specs = []
    for scope, leaf in names:
        dtype = data.draw(st.sampled_from(ALL_DTYPES), label="dtype")
        shape = data.draw(_SHAPES, label="shape")
        parts = data.draw(st.sampled_from([0, 2, 3]), label="partitions") if shape and shape[0] >= 3 and 0 not in shape else 0
        specs.append({"name": scope + leaf, "dtype": dtype, "value": random_value(rng, dtype, shape),
                      "partitions": parts, "device": data.draw(st.integers(0, 1), label="device")})
    with tempfile.TemporaryDirectory() as tmp:
        prefix = write_saver_checkpoint(os.path.join(tmp, "ck", "model.ckpt-7"), specs, sharded=sharded)
        _check_against_tf(prefix, specs)


def test_name_based_kinds_follow_optimizer_naming(tmp_path):
    t = tf()
    graph = t.Graph()
    with graph.as_default():
        w = t.compat.v1.get_variable("dense/kernel", shape=(3, 2), use_resource=True)
        step = t.compat.v1.train.get_or_create_global_step()
        loss = t.reduce_sum(w * w)
        train = t.compat.v1.train.AdamOptimizer(0.1).minimize(loss, global_step=step)
        saver = t.compat.v1.train.Saver()
        with t.compat.v1.Session(graph=graph) as sess:
            sess.run(t.compat.v1.global_variables_initializer())
            sess.run(train)
            prefix = saver.save(sess, str(tmp_path / "m"), write_meta_graph=False)
    kinds = {v.name: v.kind for v in list_variables(prefix)}
    assert kinds == {"dense/kernel": KIND_VARIABLE, "dense/kernel/Adam": KIND_OPTIMIZER,
                     "dense/kernel/Adam_1": KIND_OPTIMIZER, "beta1_power": KIND_OPTIMIZER,
                     "beta2_power": KIND_OPTIMIZER, "global_step": KIND_BOOKKEEPING}


def test_name_based_kinds_scan_finds_every_optimizer_and_bookkeeping_name():
    # name_based_kinds looks closely only at names holding one of a few short words: every
    # optimizer's naming must contain one, or its state would pass for model variables
    from ckptmerge.formats.tf.objectgraph import name_based_kind, name_based_kinds

    slots = ["Adam", "AdamW", "Adamax", "Nadam", "LazyAdam", "Momentum", "RMSProp", "Adagrad", "AdagradDA",
             "ProximalAdagrad", "Ftrl", "Adadelta", "Lamb", "LARS", "Lion"]
    names = [f"dense/kernel/{s}" for s in slots] + [f"dense/kernel/{s}_1" for s in slots]
    names += [f"{scope}{opt}/iterations" for scope in ("", "training/", "training_2/")
              for opt in ("Adam", "SGD", "RMSprop", "Adagrad", "Adadelta", "Ftrl", "Lion", "Adafactor", "Nadam")]
    names += ["beta1_power", "beta2_power_3", "global_step", "save_counter", "x/global_step",
              "_CHECKPOINTABLE_OBJECT_GRAPH", "model/.OPTIMIZER_SLOT/opt/m", "dense/kernel", "Adaptive/kernel"]
    kinds = name_based_kinds(names)
    assert kinds == [name_based_kind(n) for n in names]
    assert kinds.count(KIND_VARIABLE) == 2  # dense/kernel, Adaptive/kernel


# --------------------------------------------------------------------------------------------
# Object-based (TF2) checkpoints
# --------------------------------------------------------------------------------------------
def test_keras3_checkpoint_names_are_variable_paths_and_optimizer_state_is_marked(tmp_path):
    import keras

    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(4, name="enc1"),
                              keras.layers.Dense(2, name="head")])
    opt = keras.optimizers.Adam()
    model.compile(optimizer=opt, loss="mse")
    model.fit(np.ones((4, 3)), np.ones((4, 2)), verbose=0, epochs=1)
    prefix = tf().train.Checkpoint(model=model, optimizer=opt).save(str(tmp_path / "ckpt"))
    with open_checkpoint(prefix) as reader:
        infos = {v.name: v for v in reader.variables()}
        for weight in model.weights:
            info = infos[weight.path]
            assert info.kind == KIND_VARIABLE, weight.path
            np.testing.assert_array_equal(reader.get(weight.path), weight.numpy())
        # TF stores the model weights under the optimizer's shortest path; still variables
        assert any(i.raw_key.startswith("optimizer/_trainable_variables/") for i in infos.values()
                   if i.kind == KIND_VARIABLE)
        optimizer_vars = {i.name for i in infos.values() if i.kind == KIND_OPTIMIZER}
        assert {v.path for v in opt.variables} == optimizer_vars
        assert infos["save_counter"].kind == KIND_BOOKKEEPING
        assert infos["_CHECKPOINTABLE_OBJECT_GRAPH"].kind == KIND_BOOKKEEPING


def test_module_names_use_explicit_names_and_paths_for_automatic_or_colliding_ones(tmp_path):
    t = tf()

    class Net(t.Module):
        def __init__(self):
            super().__init__()
            self.auto = t.Variable(1.0)
            self.auto2 = t.Variable([2.0, 3.0])
            self.named = t.Variable(4.0, name="encoder/scale")
            self.dup_a = t.Variable(5.0, name="dup")
            self.dup_b = t.Variable(6.0, name="dup")

    prefix = t.train.Checkpoint(net=Net()).write(str(tmp_path / "ckpt"))
    with open_checkpoint(prefix) as reader:
        got = {v.name: (v.raw_key, v.kind) for v in reader.variables()}
        assert got == {
            "_CHECKPOINTABLE_OBJECT_GRAPH": ("_CHECKPOINTABLE_OBJECT_GRAPH", KIND_BOOKKEEPING),
            "net/auto": ("net/auto/.ATTRIBUTES/VARIABLE_VALUE", KIND_VARIABLE),
            "net/auto2": ("net/auto2/.ATTRIBUTES/VARIABLE_VALUE", KIND_VARIABLE),
            "encoder/scale": ("net/named/.ATTRIBUTES/VARIABLE_VALUE", KIND_VARIABLE),
            "net/dup_a": ("net/dup_a/.ATTRIBUTES/VARIABLE_VALUE", KIND_VARIABLE),
            "net/dup_b": ("net/dup_b/.ATTRIBUTES/VARIABLE_VALUE", KIND_VARIABLE),
        }
        assert float(reader.get("net/dup_b")) == 6.0
        assert float(reader.get("net/dup_b/.ATTRIBUTES/VARIABLE_VALUE")) == 6.0  # raw keys work too


def test_checkpoint_manager_directory_checkpoints_read(tmp_path):
    t = tf()
    step = t.Variable(0, dtype=t.int64)
    weights = t.Variable(np.zeros((2, 2), np.float32), name="w")
    manager = t.train.CheckpointManager(t.train.Checkpoint(step=step, model=t.Module(), w=weights),
                                        str(tmp_path), max_to_keep=3)
    for i in range(3):
        step.assign(i)
        weights.assign_add(np.ones((2, 2), np.float32))
        manager.save()
    assert manager.latest_checkpoint.endswith("ckpt-3")
    for i, prefix in enumerate(manager.checkpoints):
        with open_checkpoint(prefix) as reader:
            assert int(reader.get("save_counter")) == i + 1
            assert reader.info("save_counter").kind == KIND_BOOKKEEPING
            np.testing.assert_array_equal(reader.get("w"), np.full((2, 2), i + 1, np.float32))


def test_variant_tensor_is_listed_but_not_read(tmp_path):
    t = tf()
    it = iter(t.data.Dataset.range(5))
    next(it)
    prefix = t.train.Checkpoint(it=it, v=t.Variable([1.0])).write(str(tmp_path / "ckpt"))
    with open_checkpoint(prefix) as reader:
        info = reader.info("it/.ATTRIBUTES/ITERATOR_STATE")
        assert info.dtype == "variant"
        with pytest.raises(CheckpointFormatError) as err:
            reader.get(info.name)
        assert "'variant'" in str(err.value) and "it/.ATTRIBUTES/ITERATOR_STATE" in str(err.value)
        assert err.value.key == "it/.ATTRIBUTES/ITERATOR_STATE"
        with pytest.raises(CheckpointFormatError):
            reader.read_many(["v", info.name])


# --------------------------------------------------------------------------------------------
# Keras .weights.h5
# --------------------------------------------------------------------------------------------
def test_keras3_weights_h5_reads_bfloat16_and_marks_optimizer(tmp_path):
    import keras

    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2, dtype="bfloat16", name="lo"),
                              keras.layers.Dense(2, name="hi")])
    model.compile(optimizer="adam", loss="mse")
    model.fit(np.ones((4, 3)), np.ones((4, 2)), verbose=0)
    path = str(tmp_path / "m.weights.h5")
    model.save_weights(path)
    with open_checkpoint(path) as reader:
        assert reader.format == "keras-h5"
        kernel = reader.get("layers/dense/vars/0")
        assert dtype_name(kernel.dtype) == "bfloat16" == reader.info("layers/dense/vars/0").dtype
        assert same_value(kernel, model.layers[0].kernel.numpy())
        assert same_value(reader.get("layers/dense_1/vars/1"), model.layers[1].bias.numpy())
        kinds = {v.name: v.kind for v in reader.variables()}
        assert kinds["optimizer/vars/0"] == KIND_OPTIMIZER and kinds["layers/dense/vars/1"] == KIND_VARIABLE
        assert set(reader.read_many(kinds)) == set(kinds)


def test_keras_archive_weights_read_in_place(tmp_path):
    import keras

    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2, name="d")])
    model.compile(optimizer="adam", loss="mse")
    model.fit(np.ones((4, 3)), np.ones((4, 2)), verbose=0)
    model.save(str(tmp_path / "m.keras"))
    model.save_weights(str(tmp_path / "m.weights.h5"))
    with open_checkpoint(str(tmp_path / "m.keras")) as archive, \
            open_checkpoint(str(tmp_path / "m.weights.h5")) as plain:
        assert archive.format == "keras-h5"
        by_key = {v.raw_key: v for v in archive.variables()}  # same entries, named from config.json
        # (as variable.path names them: a Sequential scopes its layers with its own name)
        assert [by_key[v.raw_key].name for v in plain.variables() if v.kind == "variable"] == [
            v.path for v in model.weights] == [f"{model.name}/d/kernel", f"{model.name}/d/bias"]
        assert sorted(by_key) == sorted(v.raw_key for v in plain.variables())
        for v in plain.variables():
            assert same_value(archive.get(v.name), plain.get(v.name)), v.name
        np.testing.assert_array_equal(archive.get("layers/dense/vars/0"), model.layers[0].kernel.numpy())


def test_keras2_style_h5_drops_output_suffix_and_marks_optimizer_weights(tmp_path):
    import h5py

    path = str(tmp_path / "legacy.h5")
    with h5py.File(path, "w") as f:
        f["model_weights/dense/dense/kernel:0"] = np.ones((2, 3), np.float32)
        f["optimizer_weights/Adam/iterations:0"] = np.array(4, np.int64)
        f["model_weights/names"] = np.array([b"ab", b"c"])
    with open_checkpoint(path) as reader:
        assert {v.name: (v.raw_key, v.kind, v.dtype) for v in reader.variables()} == {
            "model_weights/dense/dense/kernel": ("model_weights/dense/dense/kernel:0", KIND_VARIABLE, "float32"),
            "optimizer_weights/Adam/iterations": ("optimizer_weights/Adam/iterations:0", KIND_OPTIMIZER, "int64"),
            "model_weights/names": ("model_weights/names", KIND_VARIABLE, "string"),
        }
        assert int(reader.get("optimizer_weights/Adam/iterations")) == 4
        names = reader.get("model_weights/names")
        assert names.dtype == object and names.tolist() == [b"ab", b"c"]


# --------------------------------------------------------------------------------------------
# API behaviour
# --------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def small_ckpt(tmp_path_factory):
    rng = np.random.default_rng(1)
    specs = [{"name": "dense/kernel", "dtype": "float32", "value": random_value(rng, "float32", (3, 4))},
             {"name": "dense/bias", "dtype": "float32", "value": random_value(rng, "float32", (4,))},
             {"name": "big", "dtype": "float32", "value": random_value(rng, "float32", (1100, 1000))},
             {"name": "vocab", "dtype": "string", "value": random_value(rng, "string", (4,))},
             {"name": "part", "dtype": "int64", "value": random_value(rng, "int64", (6,)), "partitions": 2}]
    prefix = write_saver_checkpoint(str(tmp_path_factory.mktemp("small") / "m.ckpt"), specs)
    return prefix, {s["name"]: s["value"] for s in specs}


def test_unknown_name_raises_key_error_with_did_you_mean(small_ckpt):
    prefix, _ = small_ckpt
    with open_checkpoint(prefix) as reader:
        with pytest.raises(UnknownTensorError) as err:
            reader.get("dense/kernal")
        assert isinstance(err.value, KeyError)
        assert "Did you mean 'dense/kernel'?" in str(err.value) and prefix in str(err.value)
        assert "list_variables" in str(err.value)
        with pytest.raises(KeyError):
            reader.read_many(["dense/bias", "nope"])


def test_read_many_equals_get_for_every_tensor(small_ckpt):
    prefix, values = small_ckpt
    with open_checkpoint(prefix) as reader:
        names = [v.name for v in reader.variables()] + ["dense/bias"]
        for workers in (1, 4):
            many = reader.read_many(names, max_workers=workers)
            assert list(many) == list(dict.fromkeys(names))
            for name, value in values.items():
                assert same_value(many[name], value) and same_value(reader.get(name), value)
                assert many[name].flags.writeable and many[name].flags.c_contiguous


def test_get_returns_fresh_arrays(small_ckpt):
    prefix, _ = small_ckpt
    with open_checkpoint(prefix) as reader:
        a = reader.get("dense/kernel")
        a[...] = 0
        assert reader.get("dense/kernel").any()


def test_reader_is_usable_from_several_threads(small_ckpt):
    prefix, values = small_ckpt
    errors = []
    with open_checkpoint(prefix) as reader:
        def work():
            try:
                for _ in range(20):
                    assert same_value(reader.get("dense/kernel"), values["dense/kernel"])
            except Exception as e:  # pragma: no cover - reported below
                errors.append(e)
        threads = [threading.Thread(target=work) for _ in range(4)]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
    assert errors == []


def test_reader_reopens_files_after_close_and_has_a_repr(small_ckpt):
    prefix, values = small_ckpt
    reader = open_checkpoint(prefix)
    reader.close()
    assert same_value(reader.get("dense/bias"), values["dense/bias"])
    assert repr(reader) == "<BundleReader 'm.ckpt' format='tf-bundle' tensors=5>"
    assert "dense/bias" in reader and len(reader) == 5
    reader.close()


def test_list_variables_lists_sorted_infos(small_ckpt):
    prefix, _ = small_ckpt
    infos = list_variables(prefix)
    assert [v.name for v in infos] == ["big", "dense/bias", "dense/kernel", "part", "vocab"]
    assert infos[1].nbytes == 16 and infos[1].key == "dense/bias"


def test_importing_formats_does_not_import_tensorflow():
    code = ("import ckptmerge.formats, sys; "
            "assert 'tensorflow' not in sys.modules, 'tensorflow imported'; "
            "assert 'h5py' not in sys.modules, 'h5py imported eagerly'")
    result = subprocess.run([sys.executable, "-c", code], cwd=str(REPO), capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
