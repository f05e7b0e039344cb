"""Hostile and unusual Keras ``.h5`` files (issue 10, items 1, 7 and 14).

Every file is built with h5py in the test: datasets that point outside the file (external raw
storage, virtual datasets, external and soft links, plugin filters), datasets that declare far
more data than the file holds (never-written chunks, gzip bombs, zip bombs in ``.keras``), and
datasets that are not tensors (compound, reference, opaque, array, variable-length, null
dataspace). The commands must refuse or mark them with a clear message, never a traceback,
and never read outside the named file.
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import zipfile

import h5py
import numpy as np
import pytest

from _cli_util import REPO, assert_one_line_error, run, write_config
from _reader_util import traced_peak

import ckptmerge as cm
from ckptmerge.core.errors import CheckpointFormatError, UnreadableTensorError, UnsafeCheckpointError
from ckptmerge.formats import open_checkpoint
from ckptmerge.formats.keras.h5 import MAX_EXPANSION

SECRET = b"TOP-SECRET-BYTES"
KEY = "layers/dense/vars/0"


def _secret(tmp_path):
    path = tmp_path / "secret.txt"
    path.write_bytes(SECRET)
    return path


def _other_h5(tmp_path):
    path = tmp_path / "other.h5"
    with h5py.File(path, "w") as f:
        f["x"] = np.frombuffer(SECRET, np.uint8)
    return path


def external_storage(tmp_path):
    _secret(tmp_path)
    path = tmp_path / "m.weights.h5"
    with h5py.File(path, "w") as f:
        f["layers/dense/vars/1"] = np.zeros(2, np.float32)
        f.create_dataset(KEY, shape=(len(SECRET),), dtype="u1", external=[("secret.txt", 0, len(SECRET))])
    return path, "keeps its values in external file(s) 'secret.txt'"


def virtual_dataset(tmp_path):
    _other_h5(tmp_path)
    path = tmp_path / "m.weights.h5"
    with h5py.File(path, "w") as f:
        layout = h5py.VirtualLayout(shape=(len(SECRET),), dtype="u1")
        layout[:] = h5py.VirtualSource("other.h5", "x", shape=(len(SECRET),))
        f.create_virtual_dataset(KEY, layout)
    return path, "is a virtual dataset (its values come from other datasets or files)"


def external_link(tmp_path):
    _other_h5(tmp_path)
    path = tmp_path / "m.weights.h5"
    with h5py.File(path, "w") as f:
        f["layers/dense/vars/1"] = np.zeros(2, np.float32)
        f[KEY] = h5py.ExternalLink("other.h5", "/x")
    return path, "is an external link (to '/x' in file 'other.h5')"


def soft_link(tmp_path):
    path = tmp_path / "m.weights.h5"
    with h5py.File(path, "w") as f:
        f["layers/dense/vars/1"] = np.zeros(2, np.float32)
        f[KEY] = h5py.SoftLink("/layers/dense/vars/1")
    return path, "is a soft link (to '/layers/dense/vars/1')"


def plugin_filter(tmp_path):
    path = tmp_path / "m.weights.h5"
    with h5py.File(path, "w") as f:
        dcpl = h5py.h5p.create(h5py.h5p.DATASET_CREATE)
        dcpl.set_chunk((4,))
        dcpl.set_filter(307, h5py.h5z.FLAG_OPTIONAL, (1,))  # bzip2's id: HDF5 would dlopen a plugin
        group = f.require_group("layers/dense/vars")
        dsid = h5py.h5d.create(group.id, b"0", h5py.h5t.NATIVE_FLOAT, h5py.h5s.create_simple((8,)), dcpl=dcpl)
        h5py.Dataset(dsid)[...] = np.arange(8, dtype=np.float32)
    return path, ("uses HDF5 filter 307, which HDF5 would load as a plugin (a shared library from "
                  "outside the file)")


INDIRECTIONS = [external_storage, virtual_dataset, external_link, soft_link, plugin_filter]


# ============================================================================================
# Item 1: nothing outside the named file is read
# ============================================================================================


@pytest.mark.parametrize("make", INDIRECTIONS, ids=lambda m: m.__name__)
@pytest.mark.parametrize("command", [["ls", "{path}", "--all"], ["ls", "{path}", "--stats"],
                                     ["show", "{path}", KEY], ["diff", "{path}", "{path}", "--values"]],
                         ids=lambda c: " ".join(c[:1] + c[2:]))
def test_inspection_refuses_a_file_that_points_outside_itself(tmp_path, make, command):
    path, problem = make(tmp_path)
    r = run(*(a.format(path=path) for a in command))
    assert_one_line_error(r, f"Refusing to read Keras weights file '{path}'", f"'{KEY}' {problem}",
                          "ckptmerge reads nothing outside the file you name", "self-contained copy")
    assert SECRET.decode() not in r.output


@pytest.mark.parametrize("make", INDIRECTIONS, ids=lambda m: m.__name__)
def test_api_load_refuses_with_the_dataset_named(tmp_path, make):
    path, problem = make(tmp_path)
    with pytest.raises(UnsafeCheckpointError) as err:
        cm.load(str(path))
    assert isinstance(err.value, CheckpointFormatError) and isinstance(err.value, ValueError)
    assert err.value.key == KEY and err.value.path == str(path)
    assert err.value.problems == [f"'{KEY}' {problem}"]


def test_every_problem_is_listed_at_once(tmp_path):
    _secret(tmp_path)
    _other_h5(tmp_path)
    path = tmp_path / "m.weights.h5"
    with h5py.File(path, "w") as f:
        f.create_dataset("a", shape=(4,), dtype="u1", external=[("secret.txt", 0, 4)])
        f["b"] = h5py.ExternalLink("other.h5", "/x")
    with pytest.raises(UnsafeCheckpointError) as err:
        open_checkpoint(str(path))
    assert sorted(err.value.problems) == ["'a' keeps its values in external file(s) 'secret.txt'",
                                          "'b' is an external link (to '/x' in file 'other.h5')"]
    assert "2 entries would make it" in str(err.value)


def test_merge_refuses_and_writes_nothing(tmp_path):
    path, _ = external_storage(tmp_path)
    config = write_config(tmp_path / "merge.yaml", f"""
        sources:
          - {{name: K, path: {path}}}
    """)
    out = tmp_path / "out" / "merged"
    r = run("merge", config, "-o", out)
    assert_one_line_error(r, f"'{KEY}' keeps its values in external file(s) 'secret.txt'")
    assert not out.parent.exists() or os.listdir(out.parent) == []


def test_restore_refuses_before_any_variable_changes(tmp_path):
    import tensorflow as tf

    path, _ = external_storage(tmp_path)
    v = tf.Variable(np.full(len(SECRET), 7, np.uint8), name="v")
    with pytest.raises(UnsafeCheckpointError, match="secret.txt"):
        cm.restore([v], [cm.Source(str(path), map={KEY: "v"})])
    assert v.numpy().tolist() == [7] * len(SECRET)


def test_a_keras_archive_holding_a_file_that_points_outside_is_refused(tmp_path):
    path, problem = external_storage(tmp_path)
    archive = tmp_path / "m.keras"
    with zipfile.ZipFile(archive, "w") as z:  # stored: read in place, checked all the same
        z.write(path, "model.weights.h5")
    with pytest.raises(UnsafeCheckpointError) as err:
        open_checkpoint(str(archive))
    assert err.value.problems == [f"'{KEY}' {problem}"]
    assert_one_line_error(run("show", archive, KEY), f"'{KEY}' {problem}")


# ============================================================================================
# Item 7: memory is bounded by the file
# ============================================================================================


@pytest.mark.parametrize("chunks", [(1 << 20,), None], ids=["chunked", "contiguous"])
def test_a_never_written_huge_dataset_is_refused_before_allocating(tmp_path, chunks):
    path = tmp_path / "m.weights.h5"
    with h5py.File(path, "w") as f:
        f.create_dataset(KEY, shape=(2 ** 33,), dtype="f4", chunks=chunks)
    assert path.stat().st_size < 10_000
    r = run("ls", path)  # listing reads no values: the declared size is shown
    assert r.exit_code == 0 and "32.0 GiB" in r.stdout
    for args in (["show", path, KEY], ["ls", path, "--stats"], ["diff", path, path, "--values"]):
        assert_one_line_error(run(*args), f"dataset '{KEY}' declares shape (8589934592,) of float32 (32.0 GiB) "
                              "but the file stores only 0 B of it", "never written", "re-save the weights")
    with pytest.raises(UnsafeCheckpointError) as err:
        cm.load(str(path))
    assert err.value.key == KEY


def test_a_small_never_written_dataset_reads_as_its_fill_value(tmp_path):
    path = tmp_path / "m.weights.h5"
    with h5py.File(path, "w") as f:
        f.create_dataset(KEY, shape=(1000,), dtype="f4", chunks=(100,), fillvalue=0.5)
    np.testing.assert_array_equal(cm.load(str(path))[KEY], np.full(1000, 0.5, np.float32))


def test_a_gzip_bomb_is_refused_with_the_ratio_named(tmp_path):
    path = tmp_path / "m.weights.h5"
    with h5py.File(path, "w") as f:
        ds = f.create_dataset(KEY, shape=(1 << 24,), dtype="f4", chunks=(1 << 20,), compression="gzip")
        for i in range(16):
            ds[i << 20:(i + 1) << 20] = 0.0
    assert path.stat().st_size < (64 << 20) // MAX_EXPANSION
    r = run("show", path, KEY)
    assert_one_line_error(r, f"dataset '{KEY}' declares shape (16777216,) of float32 (64.0 MiB) compressed into",
                          f"more than the {MAX_EXPANSION}x expansion ckptmerge accepts",
                          "h5repack -f NONE in.h5 out.h5")


def test_compressed_weights_within_the_ratio_are_read_into_one_buffer(tmp_path):
    values = np.random.default_rng(0).standard_normal(1 << 22).astype(np.float32)  # 16 MiB
    path = tmp_path / "m.weights.h5"
    with h5py.File(path, "w") as f:
        f.create_dataset(KEY, data=values, chunks=(1 << 18,), compression="gzip", compression_opts=1)
        f.create_dataset("layers/dense/vars/1", data=values.astype(">f4"))  # big-endian: converted
    with open_checkpoint(str(path)) as reader:
        got, peak = traced_peak(lambda: reader.get(KEY))
        np.testing.assert_array_equal(got, values)
        assert peak < values.nbytes * 1.25, f"peak {peak} for a {values.nbytes}-byte tensor: a second copy"
        big_endian = reader.get("layers/dense/vars/1")
        assert big_endian.dtype == np.dtype("<f4") and np.array_equal(big_endian, values)


def test_iter_chunks_reads_hyperslabs_that_concatenate_to_the_tensor(tmp_path):
    import ml_dtypes

    rng = np.random.default_rng(2)
    path = tmp_path / "m.weights.h5"
    with h5py.File(path, "w") as f:
        f["f32"] = rng.standard_normal((5, 7, 3)).astype(np.float32)
        f["f64be"] = rng.standard_normal((4, 6)).astype(">f8")
        f["bool"] = rng.integers(0, 2, 9).astype(bool)
        f.create_dataset("enum", data=np.array([[0, 1], [1, 1]], "i1"), dtype=h5py.enum_dtype({"A": 0, "B": 1}, "i1"))
        f.create_dataset("bf16", data=rng.standard_normal((3, 4)).astype(ml_dtypes.bfloat16).view("V2"))
        f["bf16"].attrs["dtype"] = "bfloat16"
        f["scalar"] = np.float32(3)
        f["empty"] = np.zeros((0, 4), np.float32)
    with open_checkpoint(str(path)) as reader:
        for v in reader.variables():
            whole = reader.get(v.name).reshape(-1)
            for n in (1, 2, 5, 7, 20, 21, 22, 104, 105, 1000):
                pieces = list(reader.iter_chunks(v.name, n))
                assert all(0 < p.size <= n for p in pieces), (v.name, n)
                got = np.concatenate(pieces) if pieces else whole[:0]
                assert got.dtype == whole.dtype and got.tobytes() == whole.tobytes(), (v.name, n)


def test_ls_stats_reads_a_big_dataset_in_pieces(tmp_path):
    values = np.arange(1 << 24, dtype=np.float32)  # 64 MiB, stored in full
    path = tmp_path / "m.weights.h5"
    with h5py.File(path, "w") as f:
        f[KEY] = values
    r, peak = traced_peak(lambda: run("ls", path, "--stats", "--json"))
    assert r.exit_code == 0, r.output
    stats = json.loads(r.stdout)[0]["stats"]
    assert (stats["min"], stats["max"], stats["mean"]) == (0.0, float((1 << 24) - 1), ((1 << 24) - 1) / 2)
    # pieces of 2**20 elements (4 MiB, 8 MiB as float64): far below the 64 MiB of the whole
    assert peak < values.nbytes * 3 // 4, f"ls --stats held {peak} bytes for a {values.nbytes}-byte dataset"


def _keras_zip(path, member_bytes_chunks, compression):
    with zipfile.ZipFile(path, "w", compression=compression) as z:
        with z.open("model.weights.h5", "w", force_zip64=True) as member:
            for chunk in member_bytes_chunks:
                member.write(chunk)


def test_a_keras_archive_zip_bomb_is_refused_before_decompressing(tmp_path):
    archive = tmp_path / "m.keras"
    zeros = bytes(1 << 20)
    _keras_zip(archive, [b"\x89HDF\r\n\x1a\n"] + [zeros] * 64, zipfile.ZIP_DEFLATED)
    assert archive.stat().st_size < (64 << 20) // MAX_EXPANSION
    with pytest.raises(UnsafeCheckpointError) as err:
        open_checkpoint(str(archive))
    for part in ("Refusing to read member 'model.weights.h5' of m.keras", f"more than {MAX_EXPANSION}x",
                 "it declares 64.0 MiB compressed into", f"(File: {archive})",
                 "unzip m.keras model.weights.h5"):
        assert part in str(err.value)
    assert err.value.key == "model.weights.h5"
    assert_one_line_error(run("ls", archive), "Refusing to read member 'model.weights.h5' of m.keras",
                          f"(File: {archive})")


def test_a_compressed_keras_member_is_streamed_not_held_in_memory(tmp_path):
    values = np.random.default_rng(1).standard_normal(1 << 22).astype(np.float32)  # 16 MiB
    plain = tmp_path / "m.weights.h5"
    with h5py.File(plain, "w") as f:
        f[KEY] = values
    archive = tmp_path / "m.keras"
    with zipfile.ZipFile(archive, "w", compression=zipfile.ZIP_DEFLATED, compresslevel=1) as z:
        z.write(plain, "model.weights.h5")
    reader, peak = traced_peak(lambda: open_checkpoint(str(archive)))
    with reader:
        assert peak < 4 << 20, f"opening the archive held {peak} bytes: the member is in memory"
        np.testing.assert_array_equal(reader.get(KEY), values)


def _tiny_weights() -> bytes:
    buf = io.BytesIO()
    with h5py.File(buf, "w") as f:
        f[KEY] = np.arange(3, dtype=np.float32)
    return buf.getvalue()


def test_a_keras_archive_config_bomb_is_ignored_not_inflated(tmp_path, caplog):
    archive = tmp_path / "m.keras"
    with zipfile.ZipFile(archive, "w", compression=zipfile.ZIP_DEFLATED) as z:
        z.writestr("config.json", b" " * (32 << 20) + b"{}")  # 32 MiB of JSON in ~32 KiB
        z.writestr("model.weights.h5", _tiny_weights())
    reader, peak = traced_peak(lambda: open_checkpoint(str(archive)))
    with reader:
        assert peak < 4 << 20, f"opening the archive held {peak} bytes: config.json was inflated"
        assert reader.names() == [KEY]  # raw keys, as for an archive without config.json
    assert f"Ignoring config.json of {archive}: it declares 32.0 MiB" in caplog.text


def test_a_deeply_nested_keras_config_is_ignored_not_a_traceback(tmp_path, caplog):
    archive = tmp_path / "m.keras"
    with zipfile.ZipFile(archive, "w") as z:
        z.writestr("config.json", "[" * 100_000 + "]" * 100_000)
        z.writestr("model.weights.h5", _tiny_weights())
    r = run("ls", archive)
    assert r.exit_code == 0, r.output
    assert r.stdout.splitlines()[-2:] == [f"{KEY}  float32  (3,)   12 B", "1 variable, 12 B"]
    assert "nested too deeply to parse" in caplog.text


_OOM_DRIVER = """
import re, resource, sys
import h5py, numpy
from ckptmerge.cli import main
vm = int(re.search(r"VmSize:\\s+(\\d+) kB", open("/proc/self/status").read()).group(1)) * 1024
resource.setrlimit(resource.RLIMIT_AS, (vm + (32 << 20), resource.getrlimit(resource.RLIMIT_AS)[1]))
main(sys.argv[1:])
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="needs /proc and RLIMIT_AS")
def test_out_of_memory_is_a_clear_error_not_a_traceback(tmp_path):
    path = tmp_path / "m.weights.h5"
    with h5py.File(path, "w") as f:
        f[KEY] = np.ones(96 << 18, np.float32)  # 96 MiB, stored in full: the file justifies it
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    p = subprocess.run([sys.executable, "-c", _OOM_DRIVER, "show", str(path), KEY],
                       capture_output=True, text=True, env=env, timeout=120)
    assert p.returncode == 2, p.stderr
    assert "Traceback" not in p.stderr
    assert p.stderr.startswith("Error: Out of memory: a tensor (or the set of tensors) this command reads")


# ============================================================================================
# Item 14: datasets that are not tensors are listed, and marked or refused clearly
# ============================================================================================


@pytest.fixture(scope="module")
def kinds(tmp_path_factory):
    path = tmp_path_factory.mktemp("kinds") / "m.weights.h5"
    with h5py.File(path, "w") as f:
        f["plain"] = np.arange(3, dtype=np.float32)
        f["compound"] = np.array([(1, 2.0)], dtype=[("a", "i4"), ("b", "f4")])
        f.create_dataset("reference", (2,), dtype=h5py.ref_dtype)[0] = f["plain"].ref
        f.create_dataset("region", (1,), dtype=h5py.regionref_dtype)[0] = f["plain"].regionref[0:2]
        f["opaque"] = np.array([b"abcd"], dtype="V4")
        f.create_dataset("enum", data=np.array([0, 1, 1], "i1"), dtype=h5py.enum_dtype({"OFF": 0, "ON": 1}, "i1"))
        f.create_dataset("empty", data=h5py.Empty("f4"))
        f.create_dataset("vlen", (2,), dtype=h5py.vlen_dtype("i4"))
        f.create_dataset("array", (2,), dtype=np.dtype(("f4", (3,))))
    return path


NOT_TENSORS = {
    "array": ("hdf5-array", "(2,)", "its elements are HDF5 arrays of shape (3,), not scalars"),
    "compound": ("hdf5-compound", "(1,)", "it has an HDF5 compound type (fields 'a', 'b')"),
    "empty": ("hdf5-empty", "()", "it has a null dataspace (h5py.Empty): no shape and no values"),
    "opaque": ("hdf5-opaque", "(1,)", "it holds opaque 4-byte values without the 'dtype' attribute"),
    "reference": ("hdf5-reference", "(2,)", "its values are HDF5 object references"),
    "region": ("hdf5-reference", "(1,)", "its values are HDF5 region references"),
    "vlen": ("hdf5-vlen", "(2,)", "its values are variable-length sequences, not a tensor"),
}


def test_ls_lists_every_dataset_with_what_it_is(kinds):
    r = run("ls", kinds)
    assert r.exit_code == 0, r.output
    rows = {line.split()[0]: line.split()[1:3] for line in r.stdout.splitlines()[2:-1]}
    assert rows == {**{n: [d, s] for n, (d, s, _) in NOT_TENSORS.items()},
                    "enum": ["int8", "(3,)"], "plain": ["float32", "(3,)"]}


def test_ls_stats_marks_datasets_without_values(kinds):
    r = run("ls", kinds, "--stats")
    assert r.exit_code == 0, r.output
    cells = {line.split()[0]: line.split()[-6:] for line in r.stdout.splitlines()[2:-1]}
    for name in NOT_TENSORS:
        assert cells[name] == ["-"] * 6, (name, cells[name])
    assert cells["enum"] == ["0", "1", "0.666667", "0.471405", "0", "0"]
    d = {x["name"]: x for x in json.loads(run("ls", kinds, "--stats", "--json").stdout)}
    assert {n: d[n]["stats"] for n in NOT_TENSORS} == {n: None for n in NOT_TENSORS}
    assert d["empty"]["dtype"] == "hdf5-empty" and d["empty"]["nbytes"] == 0


@pytest.mark.parametrize("name", sorted(NOT_TENSORS))
@pytest.mark.parametrize("as_json", [False, True], ids=["text", "json"])
def test_show_says_what_cannot_be_shown(kinds, name, as_json):
    dtype, _, why = NOT_TENSORS[name]
    r = run("show", kinds, name, *(["--json"] if as_json else []))
    assert_one_line_error(r, f"Cannot read dataset '{name}' of Keras weights file '{kinds}': {why}",
                          f"ckptmerge lists it (dtype '{dtype}') but cannot show, compare or merge its values")


def test_show_reads_an_enum_as_its_integers(kinds):
    r = run("show", kinds, "enum", "--json")
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["value"] == [0, 1, 1] and json.loads(r.stdout)["dtype"] == "int8"


def test_diff_values_compares_the_tensors_and_lists_the_rest(kinds):
    r = run("diff", kinds, kinds, "--values")
    assert r.exit_code == 0, r.output
    assert r.stdout.splitlines()[2:] == [
        "Values not readable, not compared (7):",
        *(f"  {n}: {NOT_TENSORS[n][0]}" for n in sorted(NOT_TENSORS)),
        "Equal: 9 variables, same names, dtypes, shapes and values (2 compared, 7 not)"]
    d = json.loads(run("diff", kinds, kinds, "--values", "--json").stdout)
    assert d["equal"] is True and d["not_compared"] == sorted(NOT_TENSORS)
    assert [c["name"] for c in d["values"]] == ["enum", "plain"]


def test_api_load_of_a_non_tensor_raises_a_clear_error(kinds):
    with pytest.raises(UnreadableTensorError) as err:
        cm.load(str(kinds), ["compound"])
    assert isinstance(err.value, CheckpointFormatError) and cm.UnreadableTensorError is UnreadableTensorError
    assert err.value.key == "compound" and "HDF5 compound type" in str(err.value)
