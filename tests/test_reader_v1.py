"""V1 checkpoints (TF 0.x, ``Saver(write_version=V1)``): read TF-free, bit for bit as TensorFlow.

Fixtures are written in the test by TensorFlow 2.21's own V1 writer (``tf.compat.v1.train.Saver``
with ``write_version=SaverDef.V1`` in graph mode, and the ``SaveSlices`` op it runs, for slice
layouts the Saver never makes). TensorFlow's values come from ``tf.train.load_checkpoint``, and
for the dtypes it refuses to load from V1 files (half, complex, quantized, uint16) from
``RestoreV2``, the op ``Saver.restore`` runs. Corrupt files are made by damaging those files, or
built entry by entry with the table helpers of tests/_reader_util.py.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import ckptmerge as cm
from _cli_util import run
from _corpus import corpus
from _reader_util import random_value, same_value, table_bytes, tf, write_saver_checkpoint
from ckptmerge.core.errors import CheckpointFormatError, CheckpointNotFoundError
from ckptmerge.formats import open_checkpoint
from ckptmerge.formats import protowire as pw
from ckptmerge.formats.dtypes import TF_DTYPE_NAMES, TF_TO_NUMPY
from ckptmerge.formats.tf.slices import encode_tensor_name_slice
from ckptmerge.sources.resolve import resolve_checkpoint

#: Every dtype TF's V1 writer can save (SaveSlices refuses bfloat16, qint16, quint16, uint32,
#: uint64 and the float8/int4 family).
V1_DTYPES = ["float16", "float32", "float64", "int8", "int16", "int32", "int64", "uint8", "uint16",
             "bool", "complex64", "complex128", "string", "qint8", "quint8", "qint32"]
_QUANTIZED = {"qint8": np.int8, "quint8": np.uint8, "qint32": np.int32}
_ENUM = {name: enum for enum, name in TF_DTYPE_NAMES.items()}


def _value(rng: np.random.Generator, dtype: str, shape) -> np.ndarray:
    """Random data, with the float specials (NaN payloads, -0.0, inf, subnormals) mixed in."""
    if dtype in _QUANTIZED:
        plain = random_value(rng, np.dtype(_QUANTIZED[dtype]).name, shape)
        return plain.view(TF_TO_NUMPY[_ENUM[dtype]])
    value = random_value(rng, dtype, shape)
    if value.dtype.kind in "fc" and value.size >= 4:
        flat = value.reshape(-1)
        tiny = np.finfo(flat.real.dtype).smallest_subnormal
        flat[:4] = [np.nan, -0.0, np.inf, tiny]
    return value


def tf_value(path: str, name: str, dtype: str) -> np.ndarray:
    """TensorFlow's value: ``tf.train.load_checkpoint``, or RestoreV2 for dtypes it refuses."""
    t = tf()
    try:
        return t.train.load_checkpoint(path).get_tensor(name)
    except t.errors.UnimplementedError:
        tf_dtype = t.string if dtype == "string" else t.as_dtype(dtype)
        with t.device("/cpu:0"):
            return t.raw_ops.RestoreV2(prefix=path, tensor_names=[name], shape_and_slices=[""],
                                       dtypes=[tf_dtype])[0].numpy()


def assert_reads_as_tf(path: str, expected_names=None) -> None:
    with open_checkpoint(path) as reader:
        assert reader.format == "tf-v1"
        names = [v.name for v in reader.variables()]
        assert names == sorted(tf().train.load_checkpoint(path).get_variable_to_shape_map())
        if expected_names is not None:
            assert names == sorted(expected_names)
        arrays = reader.read_many(names)
        for v in reader.variables():
            want = tf_value(path, v.name, v.dtype)
            assert same_value(reader.get(v.name), want), v.name
            assert same_value(arrays[v.name], want), v.name
            assert reader.get(v.name).shape == v.shape


# --------------------------------------------------------------------------------------------
# Values, every dtype
# --------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def every_dtype(tmp_path_factory):
    """One V1 checkpoint with a variable of each dtype (several shapes), and a partitioned one."""
    rng = np.random.default_rng(2016)
    specs = []
    for dtype in V1_DTYPES:
        for shape in [(), (0,), (5, 3)]:
            specs.append({"name": f"{dtype}/{len(shape)}_{'x'.join(map(str, shape))}", "dtype": dtype,
                          "value": _value(rng, dtype, shape)})
        if dtype not in _QUANTIZED:
            specs.append({"name": f"{dtype}/parts", "dtype": dtype, "partitions": 3,
                          "value": _value(rng, dtype, (7, 2))})
    prefix = write_saver_checkpoint(str(tmp_path_factory.mktemp("v1dtypes") / "model.ckpt"), specs, v1=True)
    return prefix, {s["name"]: s["value"] for s in specs}


def test_every_dtype_reads_as_tensorflow_reads_it(every_dtype):
    prefix, values = every_dtype
    assert_reads_as_tf(prefix, values)


def test_every_dtype_reads_the_values_written(every_dtype):
    prefix, values = every_dtype
    with open_checkpoint(prefix) as reader:
        for name, value in values.items():
            assert same_value(reader.get(name), value), name
            assert reader.info(name).dtype == name.split("/")[0]


@settings(max_examples=25, deadline=None, derandomize=True, database=None,
          suppress_health_check=list(HealthCheck))
@given(dtype=st.sampled_from(V1_DTYPES), shape=st.lists(st.integers(0, 4), max_size=3).map(tuple),
       seed=st.integers(0, 2**32 - 1), cut=st.integers(0, 4))
def test_any_slice_layout_written_by_save_slices_reads_as_tf(tmp_path_factory, dtype, shape, seed, cut):
    """The SaveSlices op (what the V1 Saver runs) with a tensor split in two along dimension 0."""
    t = tf()
    value = _value(np.random.default_rng(seed), dtype, shape)
    path = str(tmp_path_factory.mktemp("slices") / "x")
    as_tf = value.view(_QUANTIZED[dtype]) if dtype in _QUANTIZED else value
    if shape and shape[0] >= 2:
        k = 1 + cut % (shape[0] - 1)
        dims = " ".join(map(str, shape))
        rest = ":".join(["-"] * (len(shape) - 1))
        names = ["w", "w"]
        specs = [f"{dims} 0,{k}" + (f":{rest}" if rest else ""),
                 f"{dims} {k},{shape[0] - k}" + (f":{rest}" if rest else "")]
        parts = [as_tf[:k], as_tf[k:]]
    else:
        names, specs, parts = ["w"], [""], [as_tf]
    tensors = [t.bitcast(t.constant(p), t.as_dtype(dtype)) if dtype in _QUANTIZED
               else t.constant(p, dtype=t.string if dtype == "string" else t.as_dtype(dtype)) for p in parts]
    t.raw_ops.SaveSlices(filename=path, tensor_names=names, shapes_and_slices=specs, data=tensors)
    with open_checkpoint(path) as reader:
        got = reader.get("w")
    assert same_value(got, tf_value(path, "w", dtype))
    assert same_value(got, value)


def test_the_2016_corpus_checkpoint_reads_as_tensorflow_reads_it():
    assert_reads_as_tf(str(corpus() / "tf0x-v1format-nxt" / "model.ckpt"))


# --------------------------------------------------------------------------------------------
# Sharded sets and partitioned variables
# --------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def sharded(tmp_path_factory):
    """A Saver(sharded=True) V1 checkpoint over two devices, so two shard files."""
    rng = np.random.default_rng(5)
    specs = [{"name": "dense/kernel", "dtype": "float32", "device": 0, "value": random_value(rng, "float32", (6, 4))},
             {"name": "emb", "dtype": "float32", "device": 1, "partitions": 3, "value": random_value(rng, "float32", (9, 2))},
             {"name": "words", "dtype": "string", "device": 1, "value": random_value(rng, "string", (3,))},
             {"name": "global_step", "dtype": "int64", "device": 0, "value": np.array(42, np.int64)}]
    folder = tmp_path_factory.mktemp("v1sharded")
    pattern = write_saver_checkpoint(str(folder / "model.ckpt-42"), specs, sharded=True, v1=True)
    return folder, pattern, {s["name"]: s["value"] for s in specs}


def test_sharded_set_is_written_as_two_shard_files_and_a_pattern(sharded):
    folder, pattern, _ = sharded
    assert pattern == str(folder / "model.ckpt-42-?????-of-00002")
    assert sorted(p.name for p in folder.iterdir() if "-of-" in p.name) == [
        "model.ckpt-42-00000-of-00002", "model.ckpt-42-00001-of-00002"]


def test_sharded_set_reads_as_tensorflow_reads_it(sharded):
    _, pattern, values = sharded
    assert_reads_as_tf(pattern, values)
    with open_checkpoint(pattern) as reader:
        assert reader.info("emb").shape == (9, 2)
        assert same_value(reader.get("emb"), values["emb"])


@pytest.mark.parametrize("given", ["dir", "state", "pattern", "shard0", "shard1", "prefix"])
def test_sharded_set_resolves_from_every_way_of_naming_it(sharded, given):
    folder, pattern, values = sharded
    path = {"dir": folder, "state": folder / "checkpoint", "pattern": pattern,
            "shard0": folder / "model.ckpt-42-00000-of-00002",
            "shard1": folder / "model.ckpt-42-00001-of-00002", "prefix": folder / "model.ckpt-42"}[given]
    r = resolve_checkpoint(path)
    assert (r.prefix, r.format, r.step) == (pattern, "tf-v1", 42)
    assert sorted(cm.load(path, list(values))) == sorted(values)
    assert same_value(cm.load(path, ["emb"])["emb"], values["emb"])


def test_partitions_spread_over_shards_are_assembled(tmp_path):
    t = tf()
    full = np.arange(12, dtype=np.float32).reshape(4, 3)
    t.raw_ops.SaveSlices(filename=str(tmp_path / "m-00000-of-00002"), tensor_names=["w"],
                         shapes_and_slices=["4 3 0,1:-"], data=[t.constant(full[:1])])
    t.raw_ops.SaveSlices(filename=str(tmp_path / "m-00001-of-00002"), tensor_names=["w", "b"],
                         shapes_and_slices=["4 3 1,3:-", ""], data=[t.constant(full[1:]), t.constant([1.0])])
    pattern = str(tmp_path / "m-?????-of-00002")
    assert_reads_as_tf(pattern, ["w", "b"])
    assert same_value(cm.load(pattern, ["w"])["w"], full)


def test_a_missing_shard_is_a_format_error_naming_it(sharded, tmp_path):
    folder, _, _ = sharded
    shutil.copy(folder / "model.ckpt-42-00000-of-00002", tmp_path)
    with pytest.raises(CheckpointFormatError) as err:
        open_checkpoint(str(tmp_path / "model.ckpt-42-?????-of-00002"))
    assert "shard model.ckpt-42-00001-of-00002 is missing" in str(err.value)
    assert err.value.path == str(tmp_path / "model.ckpt-42-00001-of-00002")


def test_a_pattern_without_files_is_not_found(tmp_path):
    with pytest.raises(CheckpointNotFoundError):
        open_checkpoint(str(tmp_path / "m-?????-of-00002"))


# --------------------------------------------------------------------------------------------
# Everywhere a path is accepted: CLI, plans and restores, merges
# --------------------------------------------------------------------------------------------
def test_cli_ls_show_diff_checkpoints_on_a_v1_set(sharded):
    folder, pattern, values = sharded
    r = run("ls", folder)
    assert r.exit_code == 0, r.output
    assert r.stdout.splitlines()[0] == f"Checkpoint: {pattern} (latest checkpoint per {folder}/checkpoint (step 42))"
    assert "emb           float32  (9, 2)  72 B" in r.stdout
    r = run("show", folder / "model.ckpt-42-00001-of-00002", "global_step")
    assert r.exit_code == 0, r.output
    assert r.stdout.rstrip().endswith("42")
    r = run("diff", folder, pattern, "--values")
    assert r.exit_code == 0, r.output
    r = run("checkpoints", folder)
    assert r.exit_code == 0, r.output
    assert r.stdout.splitlines()[1].split()[:2] == ["*", "42"]
    assert r.stdout.splitlines()[1].endswith("model.ckpt-42-?????-of-00002")


def test_cli_diff_of_v1_and_its_v2_merge_is_equal(sharded, tmp_path):
    folder, pattern, _ = sharded
    cm.merge([cm.Source(pattern, optimizer=True)], str(tmp_path / "v2"))
    r = run("diff", pattern, tmp_path / "v2", "--values")
    assert r.exit_code == 0, r.output


def test_merge_converts_v1_to_v2_that_tensorflow_reads(sharded, tmp_path):
    folder, pattern, values = sharded
    out = str(tmp_path / "merged")
    cm.merge([cm.Source(folder, optimizer=True)], out)
    assert Path(out + ".index").is_file()
    reader = tf().train.load_checkpoint(out)
    assert sorted(reader.get_variable_to_shape_map()) == sorted(values)
    for name, value in values.items():
        assert same_value(reader.get_tensor(name), value), name


def test_merge_of_the_2016_corpus_checkpoint_is_read_by_tensorflow(tmp_path):
    src = str(corpus() / "tf0x-v1format-nxt" / "model.ckpt")
    out = str(tmp_path / "nxt-v2")
    cm.merge([cm.Source(src, optimizer=True)], out)
    theirs, ours = tf().train.load_checkpoint(src), tf().train.load_checkpoint(out)
    assert ours.get_variable_to_shape_map() == theirs.get_variable_to_shape_map()
    for name in theirs.get_variable_to_shape_map():
        assert same_value(ours.get_tensor(name), theirs.get_tensor(name)), name


def test_plan_and_restore_into_a_graph_from_a_v1_source(sharded):
    t = tf()
    folder, _, values = sharded
    graph = t.Graph()
    with graph.as_default():
        kernel = t.compat.v1.get_variable("model/kernel", shape=(6, 4))
        emb = t.compat.v1.get_variable("model/emb", shape=(9, 2))
        plan = cm.plan(None, [cm.Source(folder, map={"dense/kernel": "model/kernel", "emb": "model/emb"})])
        assert sorted(plan.assignments) == ["model/emb", "model/kernel"]
        with t.compat.v1.Session(graph=graph) as sess:
            plan.restore(session=sess)
            assert same_value(sess.run(kernel), values["dense/kernel"])
            assert same_value(sess.run(emb), values["emb"])


def test_restore_eagerly_from_the_2016_corpus_checkpoint():
    t = tf()
    src = str(corpus() / "tf0x-v1format-nxt" / "model.ckpt")
    w = t.Variable(np.zeros((4, 10), np.float32), name="mweight")
    cm.restore([w], [cm.Source(src, include="mweight")])
    assert same_value(w.numpy(), t.train.load_checkpoint(src).get_tensor("mweight"))


# --------------------------------------------------------------------------------------------
# Damaged and hand-made files
# --------------------------------------------------------------------------------------------
def _meta(*tensors) -> bytes:
    """A SavedTensorSlices holding the metadata: (name, shape, dtype enum, [extents, ...])."""
    body = b""
    for name, shape, dtype, slices in tensors:
        dims = b"".join(pw.field_bytes(2, pw.field_varint(1, d)) for d in shape)
        sl = b"".join(pw.field_bytes(4, b"".join(
            pw.field_bytes(1, pw.field_varint(1, s) + (pw.field_varint(2, n) if n >= 0 else b""))
            for s, n in ext)) for ext in slices)
        body += pw.field_bytes(1, pw.field_bytes(1, name) + pw.field_bytes(2, dims)
                               + pw.field_varint(3, dtype) + sl)
    return pw.field_bytes(1, body)


def _slice(name: str, extents, values: bytes) -> bytes:
    sl = b"".join(pw.field_bytes(1, pw.field_varint(1, s) + (pw.field_varint(2, n) if n >= 0 else b""))
                  for s, n in extents)
    return pw.field_bytes(2, pw.field_bytes(1, name) + pw.field_bytes(2, sl) + pw.field_bytes(3, values))


def _floats(*xs) -> bytes:
    return pw.field_bytes(5, np.array(xs, "<f4").tobytes())


def _write(path: Path, meta: bytes, *slices) -> str:
    entries = [(b"", meta)] + sorted((encode_tensor_name_slice(n, e), _slice(n, e, v)) for n, e, v in slices)
    path.write_bytes(table_bytes(entries))
    return str(path)


def test_hand_made_v1_file_reads(tmp_path):
    path = _write(tmp_path / "m", _meta(("w", (2,), 1, [((0, -1),)])), ("w", ((0, -1),), _floats(1.5, -2)))
    with open_checkpoint(path) as reader:
        assert reader.get("w").tolist() == [1.5, -2.0]


def test_tensor_content_instead_of_a_typed_field_reads(tmp_path):
    content = pw.field_bytes(4, np.array([7, -8], "<i8").tobytes())
    path = _write(tmp_path / "m", _meta(("w", (2,), 9, [((0, -1),)])), ("w", ((0, -1),), content))
    with open_checkpoint(path) as reader:
        assert reader.get("w").tolist() == [7, -8]


@pytest.mark.parametrize("case,message", [
    ("count", "bad data for tensor 'w': 1 values stored, the slice has 2 elements"),
    ("missing", "the data of tensor 'w' is missing"),
    ("overlap", "slices [(0, 2)] and [(1, 2)] of tensor 'w' overlap"),
    ("gap", "the slices of tensor 'w' cover 2 of its 4 elements"),
    ("outside", "tensor 'w' has slice ((3, 2),) outside its shape (4,)"),
    ("dtype", "bad data for tensor 'w': values are of dtype 'int32', the tensor is 'float32'"),
    ("huge", "bad data for tensor 'w': 2 values stored, the slice has 1000000000000 elements"),
    ("unrepresentable", "tensor 'w' has shape (0, 4611686018427387904), too large for any array"),
])
def test_inconsistent_entries_are_format_errors_naming_file_and_tensor(tmp_path, case, message):
    full = ((0, -1),)
    meta, data = {
        "count": (_meta(("w", (2,), 1, [full])), [("w", full, _floats(1))]),
        "missing": (_meta(("w", (2,), 1, [full])), []),
        "overlap": (_meta(("w", (4,), 1, [((0, 2),), ((1, 2),)])),
                    [("w", ((0, 2),), _floats(1, 2)), ("w", ((1, 2),), _floats(3, 4))]),
        "gap": (_meta(("w", (4,), 1, [((0, 2),)])), [("w", ((0, 2),), _floats(1, 2))]),
        "outside": (_meta(("w", (4,), 1, [((3, 2),)])), [("w", ((3, 2),), _floats(1, 2))]),
        "dtype": (_meta(("w", (2,), 1, [full])), [("w", full, pw.field_varint(1, 3) + _floats(1, 2))]),
        "huge": (_meta(("w", (10**12,), 1, [full])), [("w", full, _floats(1, 2))]),
        "unrepresentable": (_meta(("w", (0, 2**62), 1, [full + full])), [("w", full + full, _floats())]),
    }[case]
    path = _write(tmp_path / "m", meta, *data)
    with open_checkpoint(path) as reader:
        assert reader.info("w").dtype == "float32"
        with pytest.raises(CheckpointFormatError) as err:
            reader.get("w")
    assert message in str(err.value)
    assert err.value.path == path and err.value.key == "w"
    assert f"(File: {path})" in str(err.value)


def test_truncated_file_is_a_format_error_naming_it(every_dtype, tmp_path):
    prefix, _ = every_dtype
    data = Path(prefix).read_bytes()
    for cut in (10, len(data) // 2, len(data) - 1):
        (tmp_path / "m").write_bytes(data[:cut])
        with pytest.raises(CheckpointFormatError) as err:
            with open_checkpoint(str(tmp_path / "m")) as reader:  # noqa: F841
                pass
        assert err.value.path == str(tmp_path / "m"), cut


def test_flipped_byte_fails_the_block_checksum_unless_verify_is_off(sharded, tmp_path):
    folder, _, values = sharded
    for f in folder.iterdir():
        shutil.copy(f, tmp_path / f.name)
    shard = tmp_path / "model.ckpt-42-00000-of-00002"
    data = bytearray(shard.read_bytes())
    at = data.index(np.asarray(values["dense/kernel"]).tobytes()[:8])
    data[at] ^= 0x01
    shard.write_bytes(bytes(data))
    pattern = str(tmp_path / "model.ckpt-42-?????-of-00002")
    with pytest.raises(CheckpointFormatError) as err:
        with open_checkpoint(pattern) as reader:
            reader.get("dense/kernel")
    assert "block checksum mismatch" in str(err.value) and err.value.path == str(shard)
    with open_checkpoint(pattern, verify=False) as reader:
        got = reader.get("dense/kernel")
    assert not same_value(got, values["dense/kernel"])
    assert np.sum(got != values["dense/kernel"]) == 1


def test_a_file_that_is_not_a_table_is_refused(tmp_path):
    (tmp_path / "model.ckpt").write_bytes(b"\x00" * 100)
    r = run("ls", tmp_path / "model.ckpt")
    assert r.exit_code == 2 and "is a file but not a checkpoint ckptmerge can read" in r.stderr


def test_a_pattern_of_zero_shards_is_not_found(tmp_path):
    with pytest.raises(CheckpointNotFoundError):
        open_checkpoint(str(tmp_path / "m-?????-of-00000"))


def test_a_resource_tensor_is_listed_but_unreadable_and_diff_does_not_compare_it(tmp_path):
    from ckptmerge.core.errors import UnreadableTensorError

    meta = _meta(("h", (), 20, [()]), ("w", (2,), 1, [((0, -1),)]))
    paths = [_write(tmp_path / name, meta, ("w", ((0, -1),), _floats(1, 2))) for name in ("a", "b")]
    with open_checkpoint(paths[0]) as reader:
        assert reader.info("h").dtype == "resource"
        with pytest.raises(UnreadableTensorError, match="has dtype 'resource', which ckptmerge cannot read"):
            reader.get("h")
    r = run("diff", *paths, "--values", "--all")
    assert r.exit_code == 0, r.output
    assert "Values not readable, not compared (1):\n  h: resource\n" in r.stdout


def test_cli_merge_from_a_config_with_a_v1_source_writes_v2_that_tensorflow_reads(sharded, tmp_path):
    from _cli_util import write_config

    folder, _, values = sharded
    write_config(tmp_path / "convert.yaml", f"""
        sources:
          - {{name: old, path: "{folder}", map: {{"emb": "model/emb"}}}}
    """)
    out = tmp_path / "out" / "v2"
    r = run("merge", tmp_path / "convert.yaml", "-o", out)
    assert r.exit_code == 0, r.output
    assert r.stdout.startswith("wrote 1 variable from 1 source to ") and f"'{out}'" in r.stdout.splitlines()[0]
    reader = tf().train.load_checkpoint(str(out))
    assert list(reader.get_variable_to_shape_map()) == ["model/emb"]
    assert same_value(reader.get_tensor("model/emb"), values["emb"])
