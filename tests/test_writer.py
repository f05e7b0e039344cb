"""The TF-free tensor bundle writer: byte-identical to TensorFlow's, readable by TF, atomic.

Checkpoints written by BundleWriter are compared byte for byte with the same tensors written by
TensorFlow's own writer (``tf.raw_ops.SaveV2``), read back with ``tf.train.load_checkpoint``,
restored with ``tf.compat.v1.train.Saver`` and read with ckptmerge's reader. Atomicity is tested
with real failures: exceptions, SIGKILL, a read-only directory, a file size limit, a full disk.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

from ckptmerge.core.errors import CheckpointFormatError, CkptMergeError
from ckptmerge.core.errors import ArgumentError, ArgumentTypeError
from ckptmerge.formats.tf.writer import BundleWriter, CheckpointWriteError, OutputExistsError
from conftest import run_child

REPO = Path(__file__).resolve().parents[1]
RNG = np.random.default_rng(7)


def all_dtypes():
    """One tensor of every dtype a checkpoint holds, plus scalars, empty tensors and strings."""
    c = RNG.standard_normal(6) + 1j * RNG.standard_normal(6)
    return {
        "float16": RNG.standard_normal((2, 3)).astype(np.float16),
        "float32": RNG.standard_normal((3, 4)).astype(np.float32),
        "float64": RNG.standard_normal((5,)),
        "bfloat16": RNG.standard_normal((4, 2)).astype(ml_dtypes.bfloat16),
        "int8": np.arange(-128, 128, dtype=np.int8),
        "int16": np.array([-32768, 0, 32767], np.int16),
        "int32": np.arange(-6, 6, dtype=np.int32).reshape(3, 4),
        "int64": np.array([-(2 ** 63), 2 ** 63 - 1], np.int64),
        "uint8": np.arange(256, dtype=np.uint8),
        "uint16": np.array([0, 65535], np.uint16),
        "uint32": np.array([0, 2 ** 32 - 1], np.uint32),
        "uint64": np.array([0, 2 ** 64 - 1], np.uint64),
        "bool": np.array([[True, False], [False, True]]),
        "complex64": c.astype(np.complex64),
        "complex128": c.reshape(2, 3),
        "string": np.array([b"", b"\xff\xfe not utf-8 \x00", "caf\u00e9".encode(), b"x" * 300], dtype=object),
        "string_scalar": np.array(b"only", dtype=object),
        "string_empty": np.zeros((0, 3), dtype=object),
        "scalar_float": np.float32(1.5),
        "scalar_int": np.array(-7, np.int64),
        "scalar_bool": np.bool_(True),
        "empty_float": np.zeros((2, 0), np.float32),
        "empty_int": np.zeros((0,), np.int64),
    }


def tf_tensor(tf, value):
    value = np.asarray(value)
    if value.dtype == ml_dtypes.bfloat16:
        return tf.constant(value.astype(np.float32), tf.bfloat16)
    if value.dtype == object:
        return tf.constant(value, tf.string)
    return tf.constant(value)


def save_with_tf(tf, prefix, tensors):
    names = list(tensors)
    tf.raw_ops.SaveV2(prefix=str(prefix), tensor_names=names, shape_and_slices=[""] * len(names),
                      tensors=[tf_tensor(tf, tensors[k]) for k in names])


def write(prefix, tensors, **kwargs):
    with BundleWriter(str(prefix), **kwargs) as w:
        for k, v in tensors.items():
            w.add(k, v)
    return str(prefix)


def assert_same(actual, expected):
    """Bit-identical: same dtype, shape and bytes (strings element by element)."""
    expected = np.asarray(expected)
    actual = np.asarray(actual)
    assert actual.shape == expected.shape
    if expected.dtype == object:
        assert [bytes(x) for x in actual.reshape(-1)] == [bytes(x) for x in expected.reshape(-1)]
    else:
        assert actual.dtype == expected.dtype
        assert actual.tobytes() == expected.tobytes()


def files(directory):
    return sorted(p.name for p in Path(directory).iterdir())


# ---------------------------------------------------------------------------------------------
# byte-identical to TensorFlow


def test_data_and_index_bytes_equal_tensorflows_for_every_dtype(tf, tmp_path):
    tensors = all_dtypes()
    save_with_tf(tf, tmp_path / "tf", tensors)
    write(tmp_path / "ours", tensors)
    for suffix in (".data-00000-of-00001", ".index"):
        assert (tmp_path / f"ours{suffix}").read_bytes() == (tmp_path / f"tf{suffix}").read_bytes(), suffix


def test_every_dtype_reads_back_bit_identical_with_tensorflow(tf, tmp_path):
    tensors = all_dtypes()
    reader = tf.train.load_checkpoint(write(tmp_path / "ours", tensors))
    for key, value in tensors.items():
        got = reader.get_tensor(key)
        if np.asarray(value).dtype == object and np.asarray(value).ndim == 0:
            got = np.array(got, dtype=object)  # TF returns a scalar string as bytes
        assert_same(got, value)


def test_entry_checksums_equal_tensorflows(tf, tmp_path):
    from ckptmerge.formats.tf.bundle import BundleReader

    tensors = all_dtypes()
    save_with_tf(tf, tmp_path / "tf", tensors)
    write(tmp_path / "ours", tensors)
    with BundleReader(str(tmp_path / "tf")) as theirs, BundleReader(str(tmp_path / "ours")) as ours:
        assert {k: e.crc32c for k, e in ours.entries.items()} == {k: e.crc32c for k, e in theirs.entries.items()}


def test_five_thousand_keys_give_tensorflows_index(tf, tmp_path):
    tensors = {f"layer_{i:05d}/kernel": np.float32(i) for i in range(5000)}
    save_with_tf(tf, tmp_path / "tf", tensors)
    write(tmp_path / "ours", tensors)
    assert (tmp_path / "ours.index").read_bytes() == (tmp_path / "tf.index").read_bytes()


def test_many_small_blocks_and_long_shared_prefix_keys_read_back(tf, tmp_path):
    base = "encoder/" + "very_long_scope_name/" * 12
    tensors = {f"{base}block_{i:04d}/{'kernel' if i % 2 else 'bias'}": np.full(2, i, np.int32)
               for i in range(5000)}
    tensors["z" * 2000] = np.ones(1, np.float32)  # one very long key
    prefix = write(tmp_path / "ours", tensors, block_size=4096)
    assert (tmp_path / "ours.index").stat().st_size > 40 * 4096  # well over two blocks
    reader = tf.train.load_checkpoint(prefix)
    assert set(reader.get_variable_to_shape_map()) == set(tensors)
    for key in list(tensors)[::97] + ["z" * 2000]:
        assert_same(reader.get_tensor(key), tensors[key])


def test_keys_are_sorted_bytewise_in_the_index(tf, tmp_path):
    tensors = {k: np.float32(i) for i, k in enumerate(["b", "B", "a/\u00e9", "a/z", "a", "\u4e2d", "a/"])}
    with BundleWriter(str(tmp_path / "ours")) as w:
        for k, v in tensors.items():
            w.add(k, v)
        assert w.keys == sorted(tensors, key=lambda k: k.encode())
    save_with_tf(tf, tmp_path / "tf", tensors)
    assert (tmp_path / "ours.index").read_bytes() == (tmp_path / "tf.index").read_bytes()


# ---------------------------------------------------------------------------------------------
# read by TF1 Saver and by ckptmerge's reader


def test_saver_restores_our_checkpoint_into_a_graph(tf, tmp_path):
    values = {"dense/kernel": RNG.standard_normal((3, 4)).astype(np.float32),
              "dense/bias": RNG.standard_normal(4).astype(np.float64),
              "emb": RNG.standard_normal((5, 2)).astype(ml_dtypes.bfloat16),
              "global_step": np.array(42, np.int64)}
    prefix = write(tmp_path / "model.ckpt-42", values)
    with tf.Graph().as_default():
        tvars = {k: tf.compat.v1.get_variable(k, shape=v.shape, dtype=tf_tensor(tf, v).dtype)
                 for k, v in values.items()}
        saver = tf.compat.v1.train.Saver(tvars)
        with tf.compat.v1.Session() as sess:
            saver.restore(sess, prefix)
            got = sess.run(tvars)
    for k, v in values.items():
        assert_same(got[k], v)


def test_ckptmerge_reader_reads_every_dtype_back(tmp_path):
    from ckptmerge.formats import open_checkpoint

    tensors = all_dtypes()
    with open_checkpoint(write(tmp_path / "ours", tensors)) as reader:
        assert {v.name for v in reader.variables()} == set(tensors)
        for key, value in tensors.items():
            assert_same(reader.get(key), value)


def test_shards_split_at_max_shard_bytes(tf, tmp_path):
    from ckptmerge.formats.tf.bundle import BundleReader

    tensors = {f"t{i}": np.full(100, i, np.float32) for i in range(5)}  # 400 bytes each
    prefix = write(tmp_path / "ours", tensors, max_shard_bytes=900)
    assert files(tmp_path) == ["ours.data-00000-of-00003", "ours.data-00001-of-00003",
                               "ours.data-00002-of-00003", "ours.index"]
    with BundleReader(prefix) as r:
        assert [(r.entries[k].shard_id, r.entries[k].offset) for k in tensors] == \
            [(0, 0), (0, 400), (1, 0), (1, 400), (2, 0)]
    reader = tf.train.load_checkpoint(prefix)
    for k, v in tensors.items():
        assert_same(reader.get_tensor(k), v)


def test_tensor_bigger_than_max_shard_bytes_gets_its_own_shard(tmp_path):
    write(tmp_path / "ours", {"a": np.zeros(10, np.uint8), "big": np.zeros(1000, np.uint8),
                              "c": np.zeros(10, np.uint8)}, max_shard_bytes=100)
    sizes = [(tmp_path / f"ours.data-0000{i}-of-00003").stat().st_size for i in range(3)]
    assert sizes == [10, 1000, 10]


def test_non_contiguous_and_big_endian_arrays_are_written_in_c_order(tf, tmp_path):
    base = RNG.standard_normal((6, 8))
    values = {"transposed": base.T, "strided": base[::2, ::3], "big_endian": base.astype(">f8"),
              "big_endian_int": np.arange(5, dtype=">i4")}
    reader = tf.train.load_checkpoint(write(tmp_path / "ours", values))
    for k, v in values.items():
        assert_same(reader.get_tensor(k), np.ascontiguousarray(v, dtype=v.dtype.newbyteorder("<")))


def test_str_and_fixed_width_string_arrays_are_written_as_utf8_bytes(tf, tmp_path):
    values = {"unicode": np.array(["caf\u00e9", "", "x"]), "fixed": np.array([b"ab", b""], dtype="S2"),
              "objects_str": np.array(["\u4e2d", b"raw"], dtype=object)}
    reader = tf.train.load_checkpoint(write(tmp_path / "ours", values))
    assert list(reader.get_tensor("unicode")) == ["caf\u00e9".encode(), b"", b"x"]
    assert list(reader.get_tensor("fixed")) == [b"ab", b""]
    assert list(reader.get_tensor("objects_str")) == ["\u4e2d".encode(), b"raw"]


def test_add_raw_streams_chunks_into_the_same_bytes_as_add(tmp_path):
    value = RNG.standard_normal((64, 33)).astype(np.float32)
    raw = value.tobytes()
    chunks = (raw[i:i + 1000] for i in range(0, len(raw), 1000))
    with BundleWriter(str(tmp_path / "raw")) as w:
        w.add_raw("v", 1, value.shape, chunks)
    write(tmp_path / "add", {"v": value})
    assert (tmp_path / "raw.index").read_bytes() == (tmp_path / "add.index").read_bytes()
    assert (tmp_path / "raw.data-00000-of-00001").read_bytes() == raw


def test_add_raw_with_a_matching_source_checksum_copies_a_tensor(tmp_path):
    from ckptmerge.formats.tf.bundle import BundleReader

    src = write(tmp_path / "src", {"v": np.arange(10, dtype=np.int64)})
    with BundleReader(src) as r:
        e = r.entries["v"]
    data = (tmp_path / "src.data-00000-of-00001").read_bytes()[e.offset:e.offset + e.size]
    with BundleWriter(str(tmp_path / "copy")) as w:
        w.add_raw("v", e.dtype, e.shape, [data], expected_crc32c=e.crc32c)
    assert (tmp_path / "copy.index").read_bytes() == (tmp_path / "src.index").read_bytes()


def test_add_raw_with_a_wrong_checksum_is_refused_and_the_writer_goes_on(tf, tmp_path):
    with BundleWriter(str(tmp_path / "out")) as w:
        with pytest.raises(CheckpointFormatError, match="Tensor 'v' failed its checksum") as err:
            w.add_raw("v", 1, (2,), [b"\0" * 8], expected_crc32c=123)
        assert err.value.key == "v"
        w.add("w", np.ones(2, np.float32))
    reader = tf.train.load_checkpoint(str(tmp_path / "out"))
    assert set(reader.get_variable_to_shape_map()) == {"w"}
    assert (tmp_path / "out.data-00000-of-00001").stat().st_size == 8


def test_add_raw_with_the_wrong_byte_count_is_an_argument_error(tmp_path):
    with BundleWriter(str(tmp_path / "out")) as w:
        with pytest.raises(ArgumentError, match=r"shape \(2, 3\) of float32 needs 24 bytes, but the chunks held 20"):
            w.add_raw("v", 1, (2, 3), [b"\0" * 20])


def test_add_raw_of_strings_is_refused(tmp_path):
    with BundleWriter(str(tmp_path / "out")) as w:
        with pytest.raises(ArgumentError, match="string tensors must be added with add"):
            w.add_raw("s", 7, (1,), [b""])


def test_failing_chunk_source_leaves_the_writer_consistent(tf, tmp_path):
    def chunks():
        yield b"\1" * 8
        raise RuntimeError("source broke")

    with BundleWriter(str(tmp_path / "out")) as w:
        w.add("a", np.ones(2, np.float32))
        with pytest.raises(RuntimeError):
            w.add_raw("b", 1, (4,), chunks())
        w.add("c", np.full(2, 3, np.float32))
    reader = tf.train.load_checkpoint(str(tmp_path / "out"))
    assert_same(reader.get_tensor("c"), np.full(2, 3, np.float32))


# ---------------------------------------------------------------------------------------------
# input errors


def test_duplicate_key_is_an_error(tmp_path):
    with BundleWriter(str(tmp_path / "out")) as w:
        w.add("a", np.ones(1))
        with pytest.raises(ArgumentError, match="Key 'a' was already added") as err:
            w.add("a", np.ones(1))
    assert isinstance(err.value, ValueError)


def test_empty_key_is_reserved(tmp_path):
    with BundleWriter(str(tmp_path / "out")) as w:
        with pytest.raises(ArgumentError, match="empty key is reserved"):
            w.add("", np.ones(1))


@pytest.mark.parametrize("value", [[1.0, 2.0], 3.0, None])
def test_value_that_is_not_a_numpy_array_is_a_type_error(tmp_path, value):
    with BundleWriter(str(tmp_path / "out")) as w:
        with pytest.raises(ArgumentTypeError, match="value must be a numpy array or scalar") as err:
            w.add("k", value)
    assert isinstance(err.value, TypeError)


def test_unsupported_dtype_names_the_key(tmp_path):
    with BundleWriter(str(tmp_path / "out")) as w:
        with pytest.raises(ArgumentError, match="Cannot write key 'when'"):
            w.add("when", np.array(["2020-01-01"], dtype="datetime64[D]"))


def test_string_tensor_with_non_string_elements_is_a_type_error(tmp_path):
    with BundleWriter(str(tmp_path / "out")) as w:
        with pytest.raises(ArgumentTypeError, match="element 1 is int"):
            w.add("s", np.array([b"a", 3], dtype=object))


@pytest.mark.parametrize("prefix", ["out/", "out.index", "out.data-00000-of-00001"])
def test_prefix_must_be_a_prefix(tmp_path, prefix):
    with pytest.raises(ArgumentError, match="prefix"):
        BundleWriter(str(tmp_path / prefix) + ("/" if prefix.endswith("/") else ""))


def test_writer_cannot_be_used_after_finish(tmp_path):
    w = BundleWriter(str(tmp_path / "out"))
    w.finish()
    with pytest.raises(ArgumentError, match="already finished"):
        w.add("a", np.ones(1))


# ---------------------------------------------------------------------------------------------
# atomicity


def test_nothing_appears_at_the_prefix_before_finish(tmp_path):
    w = BundleWriter(str(tmp_path / "out"))
    w.add("a", np.ones(1000))
    assert all(name.startswith(".out.ckptmerge-tmp-") for name in files(tmp_path))
    w.finish()
    assert files(tmp_path) == ["out.data-00000-of-00001", "out.index"]


def test_exception_inside_the_writer_leaves_no_files(tmp_path):
    with pytest.raises(KeyError):
        with BundleWriter(str(tmp_path / "out")) as w:
            w.add("a", np.ones(1000))
            raise KeyError("boom")
    assert files(tmp_path) == []


def test_abort_removes_temp_files(tmp_path):
    w = BundleWriter(str(tmp_path / "out"))
    w.add("a", np.ones(10))
    w.abort()
    w.abort()  # idempotent
    assert files(tmp_path) == []


def test_existing_checkpoint_is_not_overwritten(tmp_path):
    write(tmp_path / "out", {"a": np.ones(1)})
    before = {n: (tmp_path / n).read_bytes() for n in files(tmp_path)}
    with pytest.raises(OutputExistsError) as err:
        BundleWriter(str(tmp_path / "out"))
    assert isinstance(err.value, FileExistsError) and isinstance(err.value, CkptMergeError)
    assert f"A checkpoint already exists at '{tmp_path}/out'" in str(err.value)
    assert "overwrite=True" in str(err.value)
    assert {n: (tmp_path / n).read_bytes() for n in files(tmp_path)} == before


def test_a_lone_data_shard_also_counts_as_existing_output(tmp_path):
    (tmp_path / "out.data-00000-of-00002").write_bytes(b"x")
    with pytest.raises(OutputExistsError) as err:
        BundleWriter(str(tmp_path / "out"))
    assert err.value.path == f"{tmp_path}/out.data-00000-of-00002"


def test_checkpoint_appearing_during_the_write_is_not_overwritten(tmp_path):
    w = BundleWriter(str(tmp_path / "out"))
    w.add("a", np.ones(1))
    write(tmp_path / "out", {"theirs": np.ones(1)})
    with pytest.raises(OutputExistsError):
        w.finish()
    assert files(tmp_path) == ["out.data-00000-of-00001", "out.index"]


def test_overwrite_replaces_and_removes_stale_shards(tf, tmp_path):
    write(tmp_path / "out", {f"t{i}": np.ones(100) for i in range(3)}, max_shard_bytes=800)
    assert len(files(tmp_path)) == 4
    write(tmp_path / "out", {"new": np.zeros(2)}, overwrite=True)
    assert files(tmp_path) == ["out.data-00000-of-00001", "out.index"]
    assert set(tf.train.load_checkpoint(str(tmp_path / "out")).get_variable_to_shape_map()) == {"new"}


def test_missing_parent_directories_are_created(tf, tmp_path):
    prefix = write(tmp_path / "a" / "b" / "out", {"x": np.ones(2)})
    assert_same(tf.train.load_checkpoint(prefix).get_tensor("x"), np.ones(2))


KILL_CHILD = textwrap.dedent("""
    import sys, time
    import numpy as np
    from ckptmerge.formats.tf.writer import BundleWriter
    w = BundleWriter(sys.argv[1])
    w.add("small", np.ones(3, np.float32))
    def chunks():
        yield b"\\0" * (1 << 20)
        print("started", flush=True)
        time.sleep(120)
        yield b"\\0" * (1 << 20)
    w.add_raw("big", 1, ((2 << 20) // 4,), chunks())
    w.finish()
""")


def test_sigkill_mid_write_leaves_no_checkpoint_and_the_next_writer_cleans_up(tf, tmp_path):
    prefix = tmp_path / "out"
    proc = subprocess.Popen([sys.executable, "-c", KILL_CHILD, str(prefix)], cwd=REPO,
                            stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "started"
        os.kill(proc.pid, signal.SIGKILL)
        assert proc.wait(timeout=30) == -signal.SIGKILL
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.stdout.close()
    left = files(tmp_path)
    assert left and all(n.startswith(".out.ckptmerge-tmp-") for n in left)  # only hidden temps
    write(prefix, {"fresh": np.ones(2)})  # a later writer removes the dead writer's temps
    assert files(tmp_path) == ["out.data-00000-of-00001", "out.index"]
    assert set(tf.train.load_checkpoint(str(prefix)).get_variable_to_shape_map()) == {"fresh"}




WRITE_AND_REPORT = """
    import json, sys
    import numpy as np
    from ckptmerge.formats.tf.writer import BundleWriter
    try:
        with BundleWriter(sys.argv[1]) as w:
            w.add("big", np.ones(1 << 18, np.float32))
        print(json.dumps({"ok": True}))
    except Exception as e:
        print(json.dumps({"type": [c.__name__ for c in type(e).__mro__], "msg": str(e),
                          "path": getattr(e, "path", None), "errno": getattr(e, "errno", None)}))
"""


def test_read_only_directory_is_a_clear_error(tmp_path):
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o555)
    try:
        res = run_child(WRITE_AND_REPORT, ro / "out", drop_root=True)
    finally:
        ro.chmod(0o755)
    assert "CheckpointWriteError" in res["type"] and "CkptMergeError" in res["type"] and "OSError" in res["type"]
    assert "Permission denied" in res["msg"] and f"of checkpoint '{ro}/out'" in res["msg"]
    assert f"Check that you may write to the directory '{ro}'" in res["msg"]
    assert res["msg"].endswith("No checkpoint was written.")
    assert files(ro) == []


def test_file_size_limit_mid_write_is_a_clear_error_and_leaves_nothing(tmp_path):
    def limit():
        import resource

        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (100_000, 100_000))

    res = run_child(WRITE_AND_REPORT, tmp_path / "out", preexec_fn=limit)
    assert "CheckpointWriteError" in res["type"] and res["errno"] == 27  # EFBIG
    assert "Cannot write the temporary data file" in res["msg"] and ".ckptmerge-tmp-" in res["path"]
    assert files(tmp_path) == []


@pytest.fixture
def tiny_disk(small_tmpfs):
    """A 256 KiB tmpfs to fill up (skipped where mounting is not allowed)."""
    return small_tmpfs("256k")


def test_full_disk_is_a_clear_error_and_leaves_nothing(tiny_disk):
    with pytest.raises(CheckpointWriteError) as err:
        with BundleWriter(str(tiny_disk / "out")) as w:
            w.add("big", np.ones(1 << 18, np.float32))  # 1 MiB
    assert isinstance(err.value, OSError) and err.value.errno == 28  # ENOSPC
    assert "No space left on device" in str(err.value) and "Free some space" in str(err.value)
    assert files(tiny_disk) == []


def test_writer_does_not_import_tensorflow(tmp_path):
    res = run_child("""
        import json, sys
        import numpy as np
        from ckptmerge.formats.tf.writer import BundleWriter
        with BundleWriter(sys.argv[1]) as w:
            w.add("a", np.ones(2))
        print(json.dumps("tensorflow" in sys.modules))
    """, tmp_path / "out")
    assert res is False


def test_durable_writer_fsyncs_and_writes_the_same_checkpoint(tmp_path, monkeypatch):
    synced = []
    real_fsync = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (synced.append(fd), real_fsync(fd)))
    values = {"a": np.arange(5, dtype=np.float32), "b": np.array(3, np.int64)}
    for name, durable in (("plain", False), ("durable", True)):
        with BundleWriter(str(tmp_path / name), durable=durable) as w:
            for k, v in values.items():
                w.add(k, v)
        if not durable:
            assert synced == []
    assert len(synced) >= 3  # data shard, index, directory
    for suffix in (".index", ".data-00000-of-00001"):
        assert (tmp_path / f"plain{suffix}").read_bytes() == (tmp_path / f"durable{suffix}").read_bytes()


def _source_file(tmp_path, value):
    path = tmp_path / "src.bin"
    path.write_bytes(b"\0" * 64 + value.tobytes() + b"tail")
    return path


def _masked_crc(value):
    import crc32c

    from ckptmerge.formats.tf.bundle import mask_crc

    return mask_crc(crc32c.crc32c(value.tobytes()))


def test_add_range_copies_a_file_range_that_tensorflow_reads_back(tf, tmp_path):
    value = np.arange(3 * 1024 * 1024, dtype=np.float32).reshape(1024, 3072)  # several read-back pieces
    src = _source_file(tmp_path, value)
    fd = os.open(src, os.O_RDONLY)
    try:
        with BundleWriter(str(tmp_path / "out")) as w:
            w.add("first", np.ones(3, np.int8))  # so the range lands at a non-zero offset
            w.add_range("big", 1, value.shape, fd, 64, expected_crc32c=_masked_crc(value))
    finally:
        os.close(fd)
    reader = tf.train.load_checkpoint(str(tmp_path / "out"))
    assert reader.get_tensor("big").tobytes() == value.tobytes()
    assert reader.get_tensor("first").tolist() == [1, 1, 1]


def test_add_range_refuses_bytes_that_fail_the_recorded_checksum(tmp_path):
    value = np.arange(10, dtype=np.int64)
    fd = os.open(_source_file(tmp_path, value), os.O_RDONLY)
    try:
        with BundleWriter(str(tmp_path / "out")) as w:
            with pytest.raises(CheckpointFormatError, match="failed its checksum"):
                w.add_range("x", 9, (10,), fd, 64, expected_crc32c=_masked_crc(value) ^ 1)
            w.add("y", np.zeros(2, np.float32))  # the writer is still usable
    finally:
        os.close(fd)
    from ckptmerge.formats import open_checkpoint

    with open_checkpoint(str(tmp_path / "out")) as r:
        assert [v.name for v in r.variables()] == ["y"]


def test_add_range_streams_where_the_kernel_cannot_copy(tmp_path, monkeypatch):
    import errno

    def no_copy(*args):
        raise OSError(errno.EXDEV, "cross-device")

    monkeypatch.setattr(os, "copy_file_range", no_copy)
    value = np.linspace(0, 1, 1000, dtype=np.float64)
    fd = os.open(_source_file(tmp_path, value), os.O_RDONLY)
    try:
        with BundleWriter(str(tmp_path / "out")) as w:
            w.add_range("x", 2, (1000,), fd, 64, expected_crc32c=_masked_crc(value))
    finally:
        os.close(fd)
    from ckptmerge.formats import open_checkpoint

    with open_checkpoint(str(tmp_path / "out")) as r:
        assert r.get("x").tobytes() == value.tobytes()


def test_add_range_without_verify_copies_mismatching_bytes_with_their_own_checksum(tmp_path, caplog):
    value = np.arange(6, dtype=np.int32)
    fd = os.open(_source_file(tmp_path, value), os.O_RDONLY)
    try:
        with BundleWriter(str(tmp_path / "out")) as w:
            w.add_range("x", 3, (6,), fd, 64, expected_crc32c=_masked_crc(value) ^ 1, verify=False)
    finally:
        os.close(fd)
    assert "does not match its source checksum" in caplog.text
    from ckptmerge.formats import open_checkpoint

    with open_checkpoint(str(tmp_path / "out")) as r:  # readable: the recorded CRC is the copy's
        assert r.get("x").tolist() == list(range(6))


def test_add_raw_with_a_shape_too_big_for_int64_is_refused_not_overflowed(tmp_path):
    with BundleWriter(str(tmp_path / "out")) as w:
        with pytest.raises(ArgumentError, match="needs"):
            w.add_raw("huge", 1, (2 ** 40, 2 ** 40), [b"\0" * 8])
