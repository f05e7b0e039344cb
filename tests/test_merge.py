"""Offline merge (ckptmerge.merging.local): a new checkpoint from several, written without TensorFlow.

Sources are real checkpoints written by TensorFlow in the test (Saver, SaveV2, tf.train.Checkpoint);
outputs are read back with tf.train.load_checkpoint, restored with tf.compat.v1.train.Saver and read
with ckptmerge's reader, compared bit for bit. Safety is tested with real failures: SIGKILL, a file
size limit, a full tmpfs, a read-only directory, corrupt sources.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

import ckptmerge as cm
from _reader_util import write_saver_checkpoint
from ckptmerge.core.errors import (ArgumentError, ArgumentTypeError, CheckpointFormatError, CheckpointWriteError,
                              CkptMergeError, OutputExistsError, PlanError)
from ckptmerge.formats import open_checkpoint
from ckptmerge.formats.tf.writer import BundleWriter
from ckptmerge.merging.dispatch import MergeReport, merge
from ckptmerge.planning.transforms import Slice, TransformError, VocabRemap
from conftest import run_child, save_tf1

REPO = Path(__file__).resolve().parents[1]


# --------------------------------------------------------------------------------------------
# helpers


def files(d) -> list:
    """Every file name in ``d`` (hidden ones too), sorted; [] when ``d`` does not exist."""
    return sorted(os.listdir(d)) if os.path.isdir(d) else []


def tree_digest(*dirs) -> dict:
    """sha256 and mtime of every file under ``dirs``."""
    out = {}
    for d in dirs:
        for root, _, names in os.walk(d):
            for n in names:
                p = os.path.join(root, n)
                with open(p, "rb") as f:
                    out[p] = (hashlib.sha256(f.read()).hexdigest(), os.stat(p).st_mtime_ns)
    return out


def tf_values(tf, prefix) -> dict:
    """``{key: value}`` of a checkpoint, as TensorFlow reads it."""
    r = tf.train.load_checkpoint(str(prefix))
    return {k: r.get_tensor(k) for k in r.get_variable_to_shape_map()}


def same_bits(a, b) -> bool:
    a, b = np.asarray(a), np.asarray(b)
    if a.shape != b.shape:
        return False
    if a.dtype == object or b.dtype == object:
        return [bytes(x) for x in a.reshape(-1)] == [bytes(x) for x in b.reshape(-1)]
    return a.dtype.itemsize == b.dtype.itemsize and a.tobytes() == b.tobytes()


def numpy_ckpt(prefix, values) -> str:
    """A checkpoint written with ckptmerge's own writer (for the subprocess tests)."""
    with BundleWriter(str(prefix)) as w:
        for k, v in values.items():
            w.add(k, v)
    return str(prefix)


def flip_byte(prefix, key) -> None:
    """Corrupt one byte of tensor ``key`` in its data file."""
    with open_checkpoint(str(prefix)) as r:
        e = r.entries[key]
        path = f"{prefix}.data-{e.shard_id:05d}-of-{r.num_shards:05d}"
    with open(path, "r+b") as f:
        f.seek(e.offset + e.size // 2)
        b = f.read(1)
        f.seek(e.offset + e.size // 2)
        f.write(bytes([b[0] ^ 0xFF]))




MERGE_AND_REPORT = """
    import json, sys
    from ckptmerge.merging.dispatch import merge
    try:
        merge([sys.argv[1]], sys.argv[2])
        print(json.dumps({"ok": True}))
    except Exception as e:
        print(json.dumps({"type": [c.__name__ for c in type(e).__mro__], "msg": str(e),
                          "path": getattr(e, "path", None), "errno": getattr(e, "errno", None)}))
"""


@pytest.fixture
def ab(tmp_path, tf):
    """Checkpoints A and B written by tf.compat.v1.train.Saver after one Adam step (so they hold
    optimizer slots, beta powers and global_step), and their values as TF reads them."""
    rng = np.random.default_rng(3)
    a = save_tf1(tmp_path / "A" / "model", {
        "enc/dense/kernel": rng.standard_normal((3, 4)).astype(np.float32),
        "enc/dense/bias": rng.standard_normal(4).astype(np.float32),
        "shared/w": np.ones(2, np.float32)}, step=7, optimizer_slots=True)
    b = save_tf1(tmp_path / "B" / "model", {
        "head/kernel": rng.standard_normal((4, 2)).astype(np.float32),
        "head/bias": rng.standard_normal(2).astype(np.float32),
        "shared/w": np.full(2, 5, np.float32)}, step=9, optimizer_slots=True)
    return {"A": a, "B": b, "a": tf_values(tf, a), "b": tf_values(tf, b), "root": tmp_path}


# --------------------------------------------------------------------------------------------
# what the output holds


def test_merge_renames_scopes_and_regexes_and_drops_optimizer_state(ab, tf):
    out = ab["root"] / "out" / "merged"
    report = merge([cm.Source(ab["A"], map={"enc/": "model/encoder/"}, name="A"),
                    cm.Source(ab["B"], regex=[(r"head/(.*)", r"model/head/\1")], name="B")], out)
    got = tf_values(tf, out)
    assert sorted(got) == ["model/encoder/dense/bias", "model/encoder/dense/kernel",
                           "model/head/bias", "model/head/kernel"]
    for k in ("dense/bias", "dense/kernel"):
        assert same_bits(got[f"model/encoder/{k}"], ab["a"][f"enc/{k}"])
    for k in ("bias", "kernel"):
        assert same_bits(got[f"model/head/{k}"], ab["b"][f"head/{k}"])
    assert isinstance(report, cm.Report) and isinstance(report, MergeReport)
    assert report.mode == "offline" and report.restored == sorted(got) and report.skipped == []
    assert report.plan.unused["A"] == ["shared/w"] and report.plan.unused["B"] == ["shared/w"]
    assert files(out.parent) == ["merged.data-00000-of-00001", "merged.index"]
    assert report.summary().startswith(f"wrote 4 variables from 2 sources to '{out}' in ")


def test_identity_merge_of_two_checkpoints_holds_every_model_variable(ab, tf):
    out = ab["root"] / "out" / "both"
    merge([cm.Source(ab["A"], exclude="shared/*"), ab["B"]], out)
    got = tf_values(tf, out)
    assert sorted(got) == ["enc/dense/bias", "enc/dense/kernel", "head/bias", "head/kernel", "shared/w"]
    assert not any("Adam" in k or "power" in k or k == "global_step" for k in got)
    assert same_bits(got["shared/w"], ab["b"]["shared/w"])


def test_optimizer_true_keeps_slots_and_global_step(ab, tf):
    out = ab["root"] / "out" / "full"
    merge([cm.Source(ab["A"], optimizer=True)], out)
    assert tf_values(tf, out).keys() == ab["a"].keys()
    for k, v in tf_values(tf, out).items():
        assert same_bits(v, ab["a"][k]), k


def test_merged_checkpoint_restores_into_a_graph_with_tf1_saver(ab, tf):
    out = ab["root"] / "out" / "m"
    merge([cm.Source(ab["A"], map={"enc/": "c/"}), cm.Source(ab["B"], include="head/*")], out)
    graph = tf.Graph()
    with graph.as_default():
        vs = {n: tf.compat.v1.get_variable(n, shape=s, dtype=tf.float32)
              for n, s in [("c/dense/kernel", (3, 4)), ("c/dense/bias", (4,)),
                           ("head/kernel", (4, 2)), ("head/bias", (2,))]}
        with tf.compat.v1.Session(graph=graph) as sess:
            tf.compat.v1.train.Saver(vs).restore(sess, str(out))
            got = sess.run(vs)
    assert same_bits(got["c/dense/kernel"], ab["a"]["enc/dense/kernel"])
    assert same_bits(got["head/bias"], ab["b"]["head/bias"])


def _tf_dtype_values(tf):
    """One value per dtype TF can save, with NaN payloads, -0.0, extremes and odd strings."""
    rng = np.random.default_rng(11)
    nan_bits = np.array([0x7FC00001, 0xFFC12345, 0x80000000, 0x7F800000], np.uint32).view(np.float32)
    vals = {
        "float16": rng.standard_normal((3, 2)).astype(np.float16),
        "float32": np.concatenate([rng.standard_normal(4).astype(np.float32), nan_bits]),
        "float64": np.array([np.nan, -0.0, np.inf, 1e308]),
        "bfloat16": rng.standard_normal(5).astype(ml_dtypes.bfloat16),
        "int8": np.arange(-128, 128, dtype=np.int8),
        "int16": np.array([-32768, 7, 32767], np.int16),
        "int32": np.arange(-6, 6, dtype=np.int32).reshape(3, 4),
        "int64": np.array([-(2 ** 63), 2 ** 63 - 1], np.int64),
        "uint8": np.arange(256, dtype=np.uint8),
        "uint16": np.array([0, 65535], np.uint16),
        "uint32": np.array([0, 2 ** 32 - 1], np.uint32),
        "uint64": np.array([0, 2 ** 64 - 1], np.uint64),
        "bool": np.array([[True, False], [False, True]]),
        "complex64": (rng.standard_normal(3) + 1j * rng.standard_normal(3)).astype(np.complex64),
        "complex128": np.array([1 + 2j, np.nan - 1j]),
        "string": np.array([b"", b"\xff\xfe\x00 not utf-8", "caf\u00e9".encode(), b"x" * 300], dtype=object),
        "scalar": np.array(2.5, np.float32),
        "empty": np.zeros((2, 0), np.float32),
    }
    for name in ("float8_e5m2", "float8_e4m3fn"):
        try:
            tf.as_dtype(getattr(ml_dtypes, name))
            vals[name] = rng.standard_normal(6).astype(getattr(ml_dtypes, name))
        except (TypeError, AttributeError):  # pragma: no cover - older TF
            pass
    return vals


def test_every_dtype_round_trips_bit_identical(tf, tmp_path):
    vals = _tf_dtype_values(tf)
    src = str(tmp_path / "src" / "all")
    names = sorted(vals)
    tensors = [tf.constant(vals[n]) if vals[n].dtype != object else tf.constant(list(vals[n]), tf.string)
               for n in names]
    tf.raw_ops.SaveV2(prefix=src, tensor_names=names, shape_and_slices=[""] * len(names), tensors=tensors)
    expected = tf_values(tf, src)
    out = tmp_path / "out" / "all"
    merge([cm.Source(src, map={"/": "m/"})], out)
    got_tf = tf_values(tf, out)
    assert sorted(got_tf) == [f"m/{n}" for n in names]
    with open_checkpoint(str(out)) as r:
        got_cm = {v.name: r.get(v.name) for v in r.variables()}
        dtypes = {v.name: v.dtype for v in r.variables()}
    for n in names:
        assert same_bits(got_tf[f"m/{n}"], expected[n]), n
        assert got_tf[f"m/{n}"].dtype == expected[n].dtype, n
        assert same_bits(got_cm[f"m/{n}"], expected[n]), n
    assert dtypes["m/bfloat16"] == "bfloat16" and dtypes["m/string"] == "string"


def test_partitioned_variable_in_a_sharded_source_is_written_whole(tf, tmp_path):
    full = np.arange(40, dtype=np.float32).reshape(10, 4)
    src = write_saver_checkpoint(str(tmp_path / "p" / "ckpt"), [
        {"name": "emb", "value": full, "dtype": "float32", "partitions": 3, "device": 0},
        {"name": "bias", "value": np.ones(4, np.float32), "dtype": "float32", "device": 1},
    ], sharded=True)
    out = tmp_path / "out" / "m"
    merge([src], out)
    got = tf_values(tf, out)
    assert sorted(got) == ["bias", "emb"] and same_bits(got["emb"], full)
    assert files(out.parent) == ["m.data-00000-of-00001", "m.index"]


def test_object_based_keras_checkpoint_is_merged_under_variable_paths(tf, tmp_path):
    import keras

    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(4, name="enc"), keras.layers.Dense(2, name="head")],
                             name="net")
    model.compile(optimizer="adam", loss="mse")
    model.fit(np.ones((4, 3)), np.ones((4, 2)), verbose=0)
    prefix = tf.train.Checkpoint(model=model, optimizer=model.optimizer).write(str(tmp_path / "k" / "ckpt"))
    out = tmp_path / "out" / "m"
    report = merge([cm.Source(prefix, include="net/enc/*", map={"net/": "/"})], out)
    got = tf_values(tf, out)
    assert sorted(got) == ["enc/bias", "enc/kernel"]
    assert same_bits(got["enc/kernel"], model.get_layer("enc").kernel.numpy())
    assert report.restored == ["enc/bias", "enc/kernel"]
    h5 = str(tmp_path / "k" / "model.weights.h5")  # a Keras weights file is a source too
    model.save_weights(h5)
    merge([h5], tmp_path / "out" / "h5")
    expected = cm.load(h5)
    got = tf_values(tf, tmp_path / "out" / "h5")
    assert sorted(got) == sorted(expected) and all(same_bits(got[k], v) for k, v in expected.items())


def test_object_graph_is_written_anew_not_copied_as_a_tensor(tf, tmp_path):
    """An object-based source's graph is not a tensor to copy: the output writes its own (issue 33;
    tests/test_native_tf.py restores such outputs), and a name-based output never holds one."""
    v = tf.Variable(np.arange(3, dtype=np.float32), name="w")
    prefix = tf.train.Checkpoint(v=v).write(str(tmp_path / "k" / "ckpt"))
    out = tmp_path / "out" / "m"
    report = merge([cm.Source(prefix, optimizer=True)], out)
    got = tf_values(tf, out)
    assert sorted(got) == ["_CHECKPOINTABLE_OBJECT_GRAPH", "v/.ATTRIBUTES/VARIABLE_VALUE"]
    assert same_bits(got["v/.ATTRIBUTES/VARIABLE_VALUE"], v.numpy()) and report.skipped == []
    assert report.tf_layout == "object-based"
    renamed = merge([cm.Source(prefix, optimizer=True, map={"w": "x"})], tmp_path / "out" / "n")
    got = tf_values(tf, tmp_path / "out" / "n")
    assert sorted(got) == ["x"] and renamed.tf_layout == "name-based"
    assert "renamed" in renamed.notes[0]


# --------------------------------------------------------------------------------------------
# conflicts


def test_two_sources_giving_one_name_is_a_conflict_and_nothing_is_written(ab):
    out = ab["root"] / "out" / "m"
    with pytest.raises(PlanError) as err:
        merge([cm.Source(ab["A"], name="A"), cm.Source(ab["B"], name="B")], out)
    assert "conflict: target 'shared/w' is provided by A:'shared/w' and B:'shared/w'" in str(err.value)
    assert "on_conflict='first' or 'last'" in str(err.value)
    assert "Pass strict=False to write what can be written" in str(err.value)
    assert str(err.value).endswith(f"Nothing was written to '{out}'.")
    assert [c.target for c in err.value.plan.conflicts] == ["shared/w"]
    assert files(out.parent) == []


@pytest.mark.parametrize("policy, winner", [("first", "a"), ("last", "b")])
def test_on_conflict_picks_by_source_order(ab, tf, policy, winner):
    out = ab["root"] / "out" / policy
    report = merge([ab["A"], ab["B"]], out, on_conflict=policy)
    assert same_bits(tf_values(tf, out)["shared/w"], ab[winner]["shared/w"])
    assert report.plan.conflicts[0].resolved_to[0] == (ab["A"] if winner == "a" else ab["B"])


def test_two_rules_of_one_source_giving_one_name_is_a_conflict(ab):
    with pytest.raises(PlanError, match="conflict: target 'x' is provided by"):
        merge([cm.Source(ab["A"], map={"enc/dense/bias": "x", "shared/w": "x"})], ab["root"] / "out" / "m")


def test_strict_false_leaves_an_unresolved_conflict_out_and_says_why(ab, tf):
    out = ab["root"] / "out" / "m"
    report = merge([cm.Source(ab["A"], name="A"), cm.Source(ab["B"], name="B")], out, strict=False)
    assert "shared/w" not in tf_values(tf, out)
    assert [t for t, _ in report.skipped] == ["shared/w"] and "conflict" in report.skipped[0][1]


# --------------------------------------------------------------------------------------------
# templates


@pytest.fixture
def template(ab, tf):
    """Checkpoint C (the model to build): enc/* like A, a 3-class head, an extra c/z, a float64 x."""
    c = save_tf1(ab["root"] / "C" / "model", {
        "enc/dense/kernel": np.full((3, 4), 9, np.float32), "enc/dense/bias": np.full(4, 9, np.float32),
        "head/kernel": np.full((4, 3), 7, np.float32), "head/bias": np.full(3, 7, np.float32),
        "c/z": np.full(2, 3, np.float32), "shared/w": np.zeros(2, np.float64)}, optimizer_slots=True)
    return {"C": c, "c": tf_values(tf, c)}


def test_template_findings_block_a_strict_merge_all_listed_and_nothing_written(ab, template):
    out = ab["root"] / "out" / "m"
    with pytest.raises(PlanError) as err:
        merge([cm.Source(ab["A"], name="A", exclude="shared/*"), cm.Source(ab["B"], name="B")], out,
              template=template["C"])
    msg = str(err.value)
    assert msg.startswith("4 blocking findings in the plan (strict=True):")
    assert "missing: target 'c/z' is provided by no source" in msg
    assert "shape mismatch: target 'head/kernel' (4, 3) <- B:'head/kernel' (4, 2)" in msg
    assert "shape mismatch: target 'head/bias' (3,) <- B:'head/bias' (2,)" in msg
    assert "dtype mismatch: target 'shared/w' float64 <- B:'shared/w' float32" in msg
    assert err.value.plan.missing == ["c/z"]
    assert files(out.parent) == []


def test_template_checkpoint_fills_what_no_source_provides_with_its_own_values(ab, template, tf):
    out = ab["root"] / "out" / "m"
    report = merge([cm.Source(ab["A"], exclude="shared/*")], out, template=template["C"],
                   allow_missing=["c/*", "head/*", "shared/*"])
    got = tf_values(tf, out)
    assert sorted(got) == sorted(k for k in template["c"] if "Adam" not in k and "power" not in k
                                 and k != "global_step")
    assert same_bits(got["enc/dense/kernel"], ab["a"]["enc/dense/kernel"])
    for k in ("c/z", "head/kernel", "head/bias", "shared/w"):
        assert same_bits(got[k], template["c"][k]), k
    assert [n for n, _ in report.from_template] == ["c/z", "head/bias", "head/kernel", "shared/w"]
    assert report.from_template[0][1] == "allowed missing: no source provides it"
    assert report.restored == sorted(got) and report.skipped == []
    assert "(4 from the template)" in report.summary()
    assert any(s["label"] == "(template)" and s["n_restored"] == 4 for s in report.sources)


def test_skipped_mismatches_keep_the_template_values(ab, template, tf):
    out = ab["root"] / "out" / "m"
    report = merge([cm.Source(ab["A"], exclude="shared/*"), cm.Source(ab["B"], exclude="shared/*")], out,
                   template=template["C"], on_shape_mismatch="skip", allow_missing=["c/z", "shared/w"])
    got = tf_values(tf, out)
    assert same_bits(got["head/kernel"], template["c"]["head/kernel"])
    reasons = dict(report.from_template)
    assert reasons["head/kernel"].startswith("shape mismatch: target 'head/kernel' (4, 3) <- ")
    assert reasons["head/kernel"].endswith("(on_shape_mismatch='skip')")


def test_strict_false_writes_exactly_the_template_names(ab, template, tf):
    out = ab["root"] / "out" / "m"
    report = merge([ab["A"], ab["B"]], out, template=template["C"], strict=False, on_conflict="first")
    got = tf_values(tf, out)
    assert sorted(got) == sorted(t.name for t in report.plan.targets)
    assert same_bits(got["c/z"], template["c"]["c/z"])
    assert dict(report.from_template)["c/z"] == "missing: no source provides it (strict=False)"


def test_template_specs_leave_unprovided_names_out_and_report_them(ab, tf):
    specs = [cm.VariableInfo("enc/dense/kernel", (3, 4), "float32"), cm.VariableInfo("c/z", (2,), "float32")]
    out = ab["root"] / "out" / "m"
    report = merge([ab["A"]], out, template=specs, allow_missing="c/*")
    assert sorted(tf_values(tf, out)) == ["enc/dense/kernel"]
    assert report.skipped == [("c/z", "allowed missing: no source provides it; a template given as specs "
                                      "has no value to write")]
    assert "1 left out" in report.summary()


def test_template_is_the_current_value_of_a_slice_with_init_keep(ab, template, tf):
    out = ab["root"] / "out" / "m"
    src = cm.Source(ab["B"], include="head/*", transforms=[Slice("head/kernel", axis=1), Slice("head/bias", axis=0)])
    merge([cm.Source(ab["A"], exclude="shared/*"), src], out, template=template["C"],
          allow_missing=["c/z", "shared/w"])
    got = tf_values(tf, out)
    assert got["head/kernel"].shape == (4, 3)
    assert same_bits(got["head/kernel"][:, :2], ab["b"]["head/kernel"])
    assert same_bits(got["head/kernel"][:, 2], template["c"]["head/kernel"][:, 2])
    assert same_bits(got["head/bias"], np.concatenate([ab["b"]["head/bias"], template["c"]["head/bias"][2:]]))


def test_vocab_remap_applies_to_a_merged_tensor(tf, tmp_path):
    emb = np.arange(12, dtype=np.float32).reshape(3, 4)
    src = save_tf1(tmp_path / "E" / "model", {"emb": emb, "other": np.ones(2, np.float32)})
    out = tmp_path / "out" / "m"
    report = merge([cm.Source(src, transforms=[VocabRemap("emb", ["a", "b", "c"], ["c", "a", "new", "b"])])], out)
    got = tf_values(tf, out)
    assert same_bits(got["emb"], np.stack([emb[2], emb[0], np.zeros(4, np.float32), emb[1]]))
    assert same_bits(got["other"], np.ones(2, np.float32))
    assert "vocab remap axis 0: 3 of 3 old tokens kept" in report.plan.assignments["emb"].describe()


def test_cast_float16_to_float32_follows_the_template(tf, tmp_path):
    w = np.random.default_rng(0).standard_normal((64, 33)).astype(np.float16)
    src = save_tf1(tmp_path / "H" / "model", {"w": w, "b": np.ones(3, np.float16)})
    specs = [cm.VariableInfo("w", (64, 33), "float32"), cm.VariableInfo("b", (3,), "float16")]
    out = tmp_path / "out" / "m"
    with pytest.raises(PlanError, match="dtype mismatch: target 'w' float32 <- .* float16"):
        merge([src], out, template=specs)
    report = merge([src], out, template=specs, cast=True)
    got = tf_values(tf, out)
    assert got["w"].dtype == np.float32 and same_bits(got["w"], w.astype(np.float32))
    assert got["b"].dtype == np.float16 and same_bits(got["b"], np.ones(3, np.float16))
    assert report.plan.assignments["w"].cast and not report.plan.assignments["b"].cast


def test_cast_and_slice_together_take_the_whole_tensor_path(tf, tmp_path):
    w = np.arange(6, dtype=np.float16).reshape(2, 3)
    src = save_tf1(tmp_path / "H" / "model", {"w": w})
    out = tmp_path / "out" / "m"
    merge([cm.Source(src, transforms=[Slice("w", axis=1, init="zeros")])], out,
          template=[cm.VariableInfo("w", (2, 4), "float32")], cast=True)
    assert same_bits(tf_values(tf, out)["w"], np.pad(w.astype(np.float32), ((0, 0), (0, 1))))


def test_slice_without_a_template_is_an_error(ab):
    with pytest.raises(TransformError) as err:
        merge([cm.Source(ab["B"], transforms=[Slice("head/*", axis=0)])], ab["root"] / "out" / "m")
    msg = str(err.value)
    assert "2 slice transforms cannot apply in a merge without a template" in msg
    assert "Slice for 'head/*' applies to 'head/bias'" in msg and "Pass template=" in msg
    assert files(ab["root"] / "out") == []


def test_init_keep_without_a_template_checkpoint_is_an_error(ab):
    remap = VocabRemap("head/bias", ["x", "y"], ["y", "z"], init="keep")
    with pytest.raises(TransformError) as err:
        merge([cm.Source(ab["B"], include="head/*", transforms=[remap])], ab["root"] / "out" / "m",
              template=[cm.VariableInfo("head/bias", (2,), "float32")])
    assert "1 transform with init='keep' need the target's current value" in str(err.value)
    assert "'head/bias' (vocab remap axis 0:" in str(err.value) and "Use init='zeros'" in str(err.value)
    assert files(ab["root"] / "out") == []


def test_template_of_the_wrong_type_is_a_type_error(ab):
    with pytest.raises(ArgumentTypeError, match=r"template\[0\] is 'x'"):
        merge([ab["A"]], ab["root"] / "out" / "m", template=["x"])
    with pytest.raises(ArgumentTypeError, match="Received: 3"):
        merge([ab["A"]], ab["root"] / "out" / "m", template=3)


def test_nothing_left_to_write_is_an_error(ab):
    with pytest.raises(CkptMergeError, match="Nothing to write to .*optimizer=True"):
        merge([cm.Source(ab["A"], include="nothing/*")], ab["root"] / "out" / "m", strict=False)


# --------------------------------------------------------------------------------------------
# state file, dry run, progress, report


def test_update_state_makes_the_output_the_latest_checkpoint_for_tf(ab, tf):
    out = ab["root"] / "out" / "merged"
    report = merge([ab["A"]], out, update_state=True)
    assert tf.train.latest_checkpoint(str(out.parent)) == str(out)
    state = tf.train.get_checkpoint_state(str(out.parent))
    assert list(state.all_model_checkpoint_paths) == [str(out)]
    assert len(state.all_model_checkpoint_timestamps) == 1
    assert report.state_file == str(out.parent / "checkpoint")
    assert not [n for n in files(out.parent) if "tmp" in n]


def test_update_state_appends_to_an_existing_state_file(ab, tf):
    directory = Path(ab["A"]).parent  # Saver's state file: model-7
    out = ab["root"] / "copy" / "m"
    shutil.copytree(directory, out.parent)
    merge([ab["B"]], out.parent / "merged-10", update_state=True)
    merge([ab["B"]], out.parent / "merged-11", update_state=True)
    merge([ab["B"]], out.parent / "merged-10", update_state=True, overwrite=True)
    state = tf.train.get_checkpoint_state(str(out.parent))
    assert state.model_checkpoint_path == str(out.parent / "merged-10")
    assert [os.path.basename(p) for p in state.all_model_checkpoint_paths] == ["model-7", "merged-11", "merged-10"]
    assert list(state.all_model_checkpoint_timestamps) == []  # Saver recorded none to line up with
    assert tf.train.latest_checkpoint(str(out.parent)) == str(out.parent / "merged-10")
    from ckptmerge.sources.resolve import resolve_checkpoint
    assert resolve_checkpoint(str(out.parent)).prefix == str(out.parent / "merged-10")


def test_state_file_paths_with_quotes_and_non_ascii_read_back(ab, tf):
    out = ab["root"] / "out" / "we\"ird 'caf\u00e9'\tname"  # TF globs the path: no backslash
    merge([ab["A"]], out, update_state=True)
    assert tf.train.latest_checkpoint(str(out.parent)) == str(out)


def test_broken_state_file_fails_before_writing(ab):
    out = ab["root"] / "out" / "m"
    out.parent.mkdir()
    (out.parent / "checkpoint").write_text("model_checkpoint_path: \n")
    with pytest.raises(CheckpointFormatError, match="Cannot parse the checkpoint state file"):
        merge([ab["A"]], out, update_state=True)
    assert files(out.parent) == ["checkpoint"]


def test_dry_run_writes_nothing_and_reports_what_it_would_write(ab):
    out = ab["root"] / "out" / "m"
    report = merge([cm.Source(ab["A"], map={"enc/": "x/"})], out, dry_run=True, update_state=True)
    assert report.dry_run and report.restored == ["x/dense/bias", "x/dense/kernel"]
    assert report.bytes_read == 0 and report.bytes_written == 0
    assert report.summary() == f"would write 2 variables from 1 source to '{out}'"
    assert "Would write (2):" in report.render() and "nothing written" in report.render()
    assert not os.path.exists(out.parent)


def test_dry_run_raises_the_errors_a_real_merge_would(ab):
    with pytest.raises(PlanError):
        merge([ab["A"], ab["B"]], ab["root"] / "out" / "m", dry_run=True)


def test_progress_is_called_before_the_first_and_after_each_tensor(ab):
    calls = []
    report = merge([ab["A"]], ab["root"] / "out" / "m", progress=lambda d, t: calls.append((d, t)))
    total = 4 * (12 + 4 + 2)
    assert calls[0] == (0, total) and calls[-1] == (total, total) and len(calls) == 1 + len(report.restored)
    assert [d for d, _ in calls] == sorted(d for d, _ in calls)


def test_report_to_dict_is_json_ready(ab):
    d = json.loads(json.dumps(merge([ab["A"]], ab["root"] / "out" / "m").to_dict()))
    assert d["mode"] == "offline" and d["output"].endswith("m") and d["dry_run"] is False
    assert d["bytes_written"] > 0 and d["restored"] == ["enc/dense/bias", "enc/dense/kernel", "shared/w"]
    assert d["plan"]["ok"] is True


# --------------------------------------------------------------------------------------------
# safety


def test_existing_output_is_refused_before_any_source_is_read(ab):
    out = ab["root"] / "out" / "m"
    merge([ab["A"]], out)
    before = tree_digest(out.parent)
    bad = ab["root"] / "bad" / "ckpt"
    bad.parent.mkdir()
    (bad.parent / "ckpt.index").write_bytes(b"not an index")  # reading it would fail
    with pytest.raises(OutputExistsError) as err:
        merge([str(bad)], out)
    assert isinstance(err.value, FileExistsError)
    assert f"A checkpoint already exists at '{out}'" in str(err.value)
    assert "pass overwrite=True (ckptmerge merge --force)" in str(err.value)
    assert tree_digest(out.parent) == before


def test_overwrite_replaces_the_existing_output(ab, tf):
    out = ab["root"] / "out" / "m"
    merge([ab["A"]], out)
    merge([cm.Source(ab["B"], include="head/*")], out, overwrite=True)
    assert sorted(tf_values(tf, out)) == ["head/bias", "head/kernel"]
    assert files(out.parent) == ["m.data-00000-of-00001", "m.index"]


@pytest.mark.parametrize("overwrite", [False, True])
def test_output_that_is_a_source_is_refused(ab, overwrite):
    before = tree_digest(Path(ab["A"]).parent)
    with pytest.raises(ArgumentError) as err:
        merge([cm.Source(Path(ab["A"]).parent, name="A")], ab["A"], overwrite=overwrite)
    assert f"The output prefix '{ab['A']}' is the checkpoint of source 'A'" in str(err.value)
    assert "even with overwrite=True" in str(err.value)
    assert tree_digest(Path(ab["A"]).parent) == before


def _sharded_sets(root: Path) -> dict:
    """A safetensors index with two shards, and a Keras .weights.json with two shards (by hand)."""
    from safetensors.numpy import save_file

    import h5py

    st = root / "st"
    st.mkdir()
    save_file({"a": np.ones(2, np.float32)}, str(st / "model-00001-of-00002.safetensors"))
    save_file({"b": np.ones(2, np.float32)}, str(st / "model-00002-of-00002.safetensors"))
    (st / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {
        "a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors"}}))
    ks = root / "ks"
    ks.mkdir()
    for i, layer in enumerate(("dense", "dense_1")):
        with h5py.File(ks / f"model_0000{i}.weights.h5", "w") as f:
            f[f"layers/{layer}/vars/0"] = np.ones((2, 2), np.float32)
    (ks / "model.weights.json").write_text(json.dumps({"weight_map": {
        "/layers/dense/vars": "model_00000.weights.h5", "/layers/dense_1/vars": "model_00001.weights.h5"}}))
    return {"st": st, "ks": ks}


@pytest.mark.parametrize("source, shard", [("st", "model-00002-of-00002.safetensors"),
                                           ("st/model.safetensors.index.json", "model-00001-of-00002.safetensors"),
                                           ("ks/model.weights.json", "model_00001.weights.h5"),
                                           ("ks/model_00000.weights.h5", "model_00001.weights.h5")])
def test_an_output_that_is_a_shard_of_a_source_is_refused(tmp_path, source, shard):
    """Not only a source's prefix: every file it is read from (a shard of an index or of a Keras
    set) is refused as the output, even with overwrite=True."""
    sets = _sharded_sets(tmp_path)
    folder = sets[source.split("/")[0]]
    out = folder / shard
    before = tree_digest(folder)
    with pytest.raises(ArgumentError, match="is the checkpoint of source") as err:
        merge([cm.Source(tmp_path / source)], out, overwrite=True)
    assert str(out) in str(err.value) and "even with overwrite=True" in str(err.value)
    assert tree_digest(folder) == before


def test_a_tf_output_named_like_a_data_file_of_a_source_is_refused(ab):
    data = Path(str(ab["A"]) + ".data-00000-of-00001")
    before = data.read_bytes()
    with pytest.raises(ArgumentError, match="is the checkpoint of source"):
        merge([ab["A"]], ab["A"], overwrite=True)
    from ckptmerge.sources.files import output_overwrites

    assert output_overwrites(str(ab["A"]), "tf", str(data)) and not output_overwrites(str(ab["A"]) + "x", "tf", str(data))
    assert data.read_bytes() == before


def test_output_that_is_the_template_is_refused(ab, template):
    with pytest.raises(ArgumentError, match="is the checkpoint of the template"):
        merge([ab["A"]], template["C"], template=template["C"], overwrite=True)


@pytest.mark.parametrize("suffix, problem", [("/", "not a directory"), (".index", "without '.index'"),
                                             (".data-00000-of-00001", "without '.index' or '.data-*'")])
def test_output_prefix_must_be_a_prefix(ab, suffix, problem):
    with pytest.raises(ArgumentError, match=re.escape(problem)):
        merge([ab["A"]], str(ab["root"] / "out" / "m") + suffix)


def test_output_prefix_naming_an_existing_directory_is_refused(ab):
    with pytest.raises(ArgumentError, match=r"not a directory.*e\.g\. '.*/A/merged'"):
        merge([ab["A"]], Path(ab["A"]).parent)


def test_sources_and_template_are_not_modified(ab, template):
    dirs = [Path(ab["A"]).parent, Path(ab["B"]).parent, Path(template["C"]).parent]
    before = tree_digest(*dirs)
    merge([cm.Source(ab["A"], optimizer=True), cm.Source(ab["B"], transforms=[Slice("head/*", axis=0)])],
          ab["root"] / "out" / "m", template=template["C"], strict=False, on_conflict="last", update_state=True)
    merge([ab["A"], ab["B"]], ab["root"] / "out" / "m2", on_conflict="first")
    assert tree_digest(*dirs) == before


def test_corrupt_source_tensor_is_a_clear_error_and_nothing_is_written(ab):
    flip_byte(ab["A"], "enc/dense/kernel")
    out = ab["root"] / "out" / "m"
    with pytest.raises(CheckpointFormatError) as err:
        merge([ab["A"]], out)
    assert "Checksum mismatch for tensor 'enc/dense/kernel' of source" in str(err.value)
    assert "pass verify=False" in str(err.value) and err.value.path.endswith("model-7.data-00000-of-00001")
    assert files(out.parent) == []
    merge([ab["A"]], out, verify=False)  # salvage: copied as it is
    assert files(out.parent) == ["m.data-00000-of-00001", "m.index"]
    salvaged = cm.load(str(out))  # readable: it records the checksum of the bytes it holds
    assert "enc/dense/kernel" in salvaged


def test_corrupt_source_tensor_is_caught_in_a_streamed_cast(tf, tmp_path):
    src = save_tf1(tmp_path / "H" / "model", {"w": np.ones((8, 8), np.float16)})
    flip_byte(src, "w")
    out = tmp_path / "out" / "m"
    with pytest.raises(CheckpointFormatError, match="Checksum mismatch for tensor 'w'"):
        merge([src], out, template=[cm.VariableInfo("w", (8, 8), "float32")], cast=True)
    assert files(out.parent) == []


KILL_CHILD = """
    import sys, time
    from ckptmerge.merging.dispatch import merge

    def progress(done, total):
        if done:
            print("written", flush=True)
            time.sleep(120)

    merge([sys.argv[1]], sys.argv[2], progress=progress)
"""


def test_sigkill_mid_merge_leaves_no_file_at_the_output_prefix(tmp_path, tf):
    src = numpy_ckpt(tmp_path / "src" / "big", {f"t{i}": np.full(1 << 18, i, np.float32) for i in range(8)})
    out = tmp_path / "out" / "m"
    proc = subprocess.Popen([sys.executable, "-c", textwrap.dedent(KILL_CHILD), src, str(out)], cwd=REPO,
                            stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "written"  # one tensor is in the temp file
        temps = files(out.parent)
        assert temps and all(n.startswith(".m.ckptmerge-tmp-") for n in temps)
        assert os.path.getsize(out.parent / next(n for n in temps if ".data-" in n)) == 1 << 20
        os.kill(proc.pid, signal.SIGKILL)
        assert proc.wait(timeout=30) == -signal.SIGKILL
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.stdout.close()
    assert not [n for n in files(out.parent) if n.startswith("m.")]  # nothing at the prefix
    assert tf.train.latest_checkpoint(str(out.parent)) is None
    merge([src], out)  # the next merge succeeds and removes the dead writer's temp files
    assert files(out.parent) == ["m.data-00000-of-00001", "m.index"]


def test_file_size_limit_is_a_clear_error_and_removes_temp_files(tmp_path):
    src = numpy_ckpt(tmp_path / "src" / "ckpt", {f"t{i}": np.ones(1 << 16, np.float32) for i in range(4)})

    def limit():
        import resource

        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (400_000, 400_000))

    res = run_child(MERGE_AND_REPORT, src, tmp_path / "out" / "m", preexec_fn=limit)
    assert "CheckpointWriteError" in res["type"] and "CkptMergeError" in res["type"] and res["errno"] == 27
    assert "File too large" in res["msg"] and res["msg"].endswith("No checkpoint was written.")
    assert files(tmp_path / "out") == []


@pytest.fixture
def tiny_disk(small_tmpfs):
    """A 1 MiB tmpfs to fill up (skipped where mounting is not allowed)."""
    return small_tmpfs("1m")


def test_disk_filling_up_mid_merge_is_a_clear_error_and_removes_temp_files(tmp_path, tiny_disk):
    src = numpy_ckpt(tmp_path / "src" / "ckpt", {f"t{i}": np.ones(1 << 16, np.float32) for i in range(3)})

    def fill_the_disk(done, total):
        if done:  # after the first tensor, someone else takes the rest of the space
            with open(tiny_disk / "filler", "wb") as f:
                try:
                    while True:
                        f.write(b"\0" * 65536)
                        f.flush()
                except OSError:
                    pass

    with pytest.raises(CheckpointWriteError) as err:
        merge([src], tiny_disk / "m", progress=fill_the_disk)
    assert isinstance(err.value, OSError) and err.value.errno == 28
    assert "No space left on device" in str(err.value) and "Free some space" in str(err.value)
    assert files(tiny_disk) == ["filler"]


def test_too_little_free_space_is_refused_before_writing(tmp_path, tiny_disk):
    src = numpy_ckpt(tmp_path / "src" / "ckpt", {f"t{i}": np.ones(1 << 17, np.float32) for i in range(3)})
    calls = []
    with pytest.raises(CheckpointWriteError) as err:
        merge([src], tiny_disk / "sub" / "m", progress=lambda d, t: calls.append(d))
    assert err.value.errno == 28 and calls == []
    assert f"Not enough space to write checkpoint '{tiny_disk / 'sub' / 'm'}': it needs about 1.5 MiB" in str(err.value)
    assert files(tiny_disk) == []


def test_read_only_output_directory_is_a_clear_error(tmp_path):
    src = numpy_ckpt(tmp_path / "src" / "ckpt", {"t": np.ones(8, np.float32)})
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o555)
    try:
        res = run_child(MERGE_AND_REPORT, src, ro / "m", drop_root=True)
    finally:
        ro.chmod(0o755)
    assert "CheckpointWriteError" in res["type"] and "CkptMergeError" in res["type"]
    assert "Permission denied" in res["msg"] and f"Check that you may write to the directory '{ro}'" in res["msg"]
    assert files(ro) == []


def test_memory_stays_near_one_piece_while_streaming_copies_and_casts(tmp_path):
    # 8 tensors of 8 MiB: reading them all would grow the process by 64 MiB, one tensor by 8 MiB;
    # streaming raw copies and casts in 4 MiB pieces grows it by a few pieces at most.
    big = numpy_ckpt(tmp_path / "src" / "f32", {f"t{i}": np.full(1 << 21, i, np.float32) for i in range(8)})
    half = numpy_ckpt(tmp_path / "src" / "f16", {f"h{i}": np.full(1 << 22, i, np.float16) for i in range(8)})
    res = run_child("""
        import json, resource, sys
        import ckptmerge as cm
        from ckptmerge.merging.dispatch import merge
        rss = lambda: resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        specs = [cm.VariableInfo(f"h{i}", (1 << 22,), "float32") for i in range(8)]
        merge([sys.argv[1]], sys.argv[3] + "/warm-up", dry_run=True)
        before = rss()
        merge([sys.argv[1]], sys.argv[3] + "/copy")
        copied = rss()
        merge([sys.argv[2]], sys.argv[3] + "/cast", template=specs, cast=True)
        print(json.dumps([copied - before, rss() - copied]))
    """, big, half, tmp_path / "out")
    copy_growth, cast_growth = res
    assert copy_growth < 6 << 20, copy_growth  # reading one whole tensor would add 8 MiB
    assert cast_growth < 20 << 20, cast_growth  # whole tensors: 8 MiB in + 16 MiB out


def test_merge_does_not_import_tensorflow(ab):
    res = run_child("""
        import json, sys
        import ckptmerge as cm
        from ckptmerge.merging.dispatch import merge
        merge([cm.Source(sys.argv[1], map={"enc/": "x/"}), cm.Source(sys.argv[2], include="head/*")], sys.argv[3],
              update_state=True)
        print(json.dumps("tensorflow" in sys.modules))
    """, ab["A"], ab["B"], ab["root"] / "out" / "m")
    assert res is False
    assert files(ab["root"] / "out") == ["checkpoint", "m.data-00000-of-00001", "m.index"]


def test_one_checkpoint_name_mapped_to_two_targets_writes_both(tmp_path):
    prefix = save_tf1(tmp_path / "m", {"a1": np.arange(4, dtype=np.float32)})
    cm.merge([cm.Source(prefix, map={"a1": ["x", "y"]})], str(tmp_path / "out"))
    out = cm.load(str(tmp_path / "out"))
    assert sorted(out) == ["x", "y"]
    assert out["x"].tobytes() == out["y"].tobytes() == np.arange(4, dtype=np.float32).tobytes()
