"""safetensors and NumPy sources: read exactly, validated as untrusted input, usable everywhere.

Fixtures are written in the test by the reference writers (the ``safetensors`` package and
``numpy.savez``); hostile variants are built by editing their bytes.
"""

from __future__ import annotations

import json
import os
import struct
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
import safetensors.numpy as st_numpy  # the reference writer (in the test extra)

from _cli_util import IN_PROCESS_CLI, REPO, assert_one_line_error, run
from ckptmerge.core.errors import CheckpointFormatError, CheckpointNotFoundError
from ckptmerge.formats import NumpyReader, SafetensorsReader, open_checkpoint
from ckptmerge.sources.resolve import FORMAT_NUMPY, FORMAT_SAFETENSORS, resolve_checkpoint



DTYPES = ["bool", "uint8", "int8", "int16", "uint16", "int32", "uint32", "int64", "uint64", "float16",
          "float32", "float64", "complex64", ml_dtypes.bfloat16, ml_dtypes.float8_e5m2, ml_dtypes.float8_e4m3fn]


def _values(rng: np.random.Generator):
    out = {}
    for i, dt in enumerate(DTYPES):
        dt = np.dtype(dt)
        raw = rng.integers(0, 256, size=(3, 5) if i % 2 else (7,), dtype=np.uint8)
        n = raw.size // dt.itemsize * dt.itemsize or dt.itemsize
        data = rng.integers(0, 256, size=max(n, dt.itemsize) * 4, dtype=np.uint8)
        arr = data.view(dt) if dt.kind != "b" else (data % 2).astype(bool)
        out[f"enc.layer.{i}.{dt.name}"] = arr.copy()
    out["empty"] = np.zeros((0, 4), np.float32)
    out["scalar"] = np.array(3.5, np.float32)
    return out


def _same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


@pytest.fixture(scope="module")
def st_file(tmp_path_factory):
    values = _values(np.random.default_rng(0))
    path = tmp_path_factory.mktemp("st") / "model.safetensors"
    st_numpy.save_file(values, str(path), metadata={"format": "pt"})
    return path, values


def test_safetensors_every_dtype_reads_bit_exact(st_file):
    path, values = st_file
    with open_checkpoint(str(path)) as r:
        assert isinstance(r, SafetensorsReader) and r.format == "safetensors"
        assert r.metadata == {"format": "pt"}
        assert sorted(r.names()) == sorted(values)
        for name, want in values.items():
            got = r.get(name)
            assert _same_bits(got, want), name
            assert (got.ctypes.data % 64 == 0 or not got.size) and got.flags.c_contiguous and got.flags.writeable


def test_safetensors_sharded_index_and_directory(tmp_path, st_file):
    _, values = st_file
    names = sorted(values)
    halves = [names[: len(names) // 2], names[len(names) // 2:]]
    weight_map = {}
    for i, part in enumerate(halves):
        file = f"model-0000{i + 1}-of-00002.safetensors"
        st_numpy.save_file({n: values[n] for n in part}, str(tmp_path / file))
        weight_map.update({n: file for n in part})
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    for given in (tmp_path / "model.safetensors.index.json", tmp_path):
        resolved = resolve_checkpoint(str(given))
        assert resolved.format == FORMAT_SAFETENSORS
        with open_checkpoint(resolved.prefix) as r:
            assert len(r.files) == 2
            for n in names:
                assert _same_bits(r.get(n), values[n]), n


def test_safetensors_index_may_not_name_files_outside_its_directory(tmp_path):
    outside = tmp_path / "secret.safetensors"
    st_numpy.save_file({"a": np.ones(2, np.float32)}, str(outside))
    inner = tmp_path / "hub"
    inner.mkdir()
    (inner / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {"a": "../secret.safetensors"}}))
    with pytest.raises(CheckpointFormatError, match="outside the named files"):
        open_checkpoint(str(inner / "model.safetensors.index.json"))


def test_safetensors_index_naming_a_missing_shard_is_not_found(tmp_path):
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {"a": "gone.safetensors"}}))
    with pytest.raises(CheckpointNotFoundError, match="gone.safetensors"):
        open_checkpoint(str(tmp_path / "model.safetensors.index.json"))


def _hand_made(path: Path, header: dict, data: bytes = b"", claimed: int = -1) -> Path:
    raw = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(raw) if claimed < 0 else claimed) + raw + data)
    return path


@pytest.mark.parametrize("header,data,claimed,problem", [
    ({"a": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}}, b"\0" * 8, -1, "truncated"),
    ({"a": {"dtype": "F32", "shape": [2 ** 40], "data_offsets": [0, 16]}}, b"\0" * 16, -1, "needs"),
    ({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
      "b": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}}, b"\0" * 12, -1, "overlap"),
    ({"a": {"dtype": "F32", "shape": [-1], "data_offsets": [0, 0]}}, b"", -1, "invalid shape"),
    ({"a": {"dtype": "F32", "shape": [1], "data_offsets": [8, 4]}}, b"\0" * 8, -1, "invalid data_offsets"),
    ({"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}, b"\0" * 4, 1 << 40, "header claims"),
    ({"__metadata__": {"k": 1}}, b"", -1, "__metadata__"),
])
def test_malformed_safetensors_headers_are_refused_before_allocating(tmp_path, header, data, claimed, problem):
    path = _hand_made(tmp_path / "bad.safetensors", header, data, claimed)
    with pytest.raises(CheckpointFormatError, match=problem):
        SafetensorsReader(str(path))


def test_deeply_nested_safetensors_header_is_a_format_error(tmp_path):
    raw = b"[" * 100_000 + b"]" * 100_000
    path = tmp_path / "deep.safetensors"
    path.write_bytes(struct.pack("<Q", len(raw)) + raw)
    with pytest.raises(CheckpointFormatError, match="does not parse"):
        SafetensorsReader(str(path))


# -- NumPy -------------------------------------------------------------------------------------


@pytest.mark.parametrize("compressed", [False, True])
def test_npz_reads_bit_exact_including_fortran_and_big_endian(tmp_path, compressed):
    rng = np.random.default_rng(1)
    values = {"dense/kernel": rng.standard_normal((5, 3)).astype(np.float32),
              "fortran": np.asfortranarray(rng.standard_normal((4, 6))),
              "big": rng.standard_normal(7).astype(">f4"),
              "ints": np.arange(10, dtype=np.int64)}
    path = tmp_path / "w.npz"
    (np.savez_compressed if compressed else np.savez)(path, **values)
    assert resolve_checkpoint(str(path)).format == FORMAT_NUMPY
    with open_checkpoint(str(path)) as r:
        assert isinstance(r, NumpyReader)
        assert r.info("big").dtype == "float32"
        for name, want in values.items():
            got = r.get(name)
            assert got.flags.c_contiguous and got.dtype.isnative
            np.testing.assert_array_equal(got, want)


def test_directory_of_npy_files_names_tensors_by_relative_path(tmp_path):
    (tmp_path / "enc" / "l0").mkdir(parents=True)
    np.save(tmp_path / "enc" / "l0" / "kernel.npy", np.ones((2, 2), np.float32))
    np.save(tmp_path / "bias.npy", np.zeros(3, np.float16))
    outside = tmp_path.parent / f"{tmp_path.name}-secret.npy"
    np.save(outside, np.full(3, 7.0))
    os.symlink(outside, tmp_path / "leak.npy")
    resolved = resolve_checkpoint(str(tmp_path))
    assert resolved.format == FORMAT_NUMPY
    with open_checkpoint(resolved.prefix) as r:
        assert r.names() == ["bias", "enc/l0/kernel"]  # the symlink is not followed


def test_pickled_npy_is_never_loaded(tmp_path):
    np.save(tmp_path / "obj.npy", np.array([{"x": 1}], dtype=object), allow_pickle=True)
    with pytest.raises(CheckpointFormatError, match="pickled"):
        NumpyReader(str(tmp_path))


def test_npz_member_claiming_more_than_deflate_can_inflate_is_refused(tmp_path):
    path = tmp_path / "bomb.npz"
    np.savez_compressed(path, x=np.zeros(10, np.float32))
    data = bytearray(path.read_bytes())
    # Declare a 1 GiB uncompressed size in the central directory (what zipfile trusts).
    cd = data.rfind(b"PK\x01\x02")
    data[cd + 24:cd + 28] = struct.pack("<I", 1 << 30)
    path.write_bytes(bytes(data))
    with pytest.raises(CheckpointFormatError, match="decompression bomb"):
        NumpyReader(str(path))


def test_corrupt_stored_npz_member_fails_its_crc(tmp_path):
    path = tmp_path / "w.npz"
    np.savez(path, x=np.arange(64, dtype=np.float32))
    data = bytearray(path.read_bytes())
    data[200] ^= 0xFF  # inside x's data
    path.write_bytes(bytes(data))
    with NumpyReader(str(path)) as r:
        with pytest.raises(CheckpointFormatError, match="CRC-32 mismatch"):
            r.get("x")
    with NumpyReader(str(path), verify=False) as r:
        assert r.get("x").shape == (64,)


def test_truncated_npy_is_refused_at_open(tmp_path):
    np.save(tmp_path / "x.npy", np.ones(100, np.float64))
    with open(tmp_path / "x.npy", "r+b") as f:
        f.truncate(300)
    with pytest.raises(CheckpointFormatError, match="truncated"):
        NumpyReader(str(tmp_path))


# -- everywhere a path is accepted -------------------------------------------------------------


def test_cli_ls_show_diff_on_safetensors_and_npz(tmp_path, st_file):
    path, values = st_file
    res = run("ls", path)
    assert res.exit_code == 0, res.output
    assert "enc.layer.10.float32" in res.stdout and f"{len(values)} variables" in res.stdout
    res = run("show", path, "scalar")
    assert res.exit_code == 0 and "3.5" in res.stdout
    np.savez(tmp_path / "same.npz", **{"enc.layer.10.float32": values["enc.layer.10.float32"]})
    res = run("diff", tmp_path / "same.npz", path, "--values")
    assert res.exit_code == 1 and "Only in B" in res.stdout


def test_cli_error_for_corrupt_safetensors_is_one_line(tmp_path):
    path = _hand_made(tmp_path / "bad.safetensors", {"a": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}})
    assert_one_line_error(run("ls", path), "bad.safetensors", "truncated")


def test_restore_from_safetensors_and_merge_to_a_tf_checkpoint(tmp_path, st_file):
    import tensorflow as tf

    import ckptmerge as cm

    path, values = st_file
    want = values["enc.layer.10.float32"]
    var = tf.Variable(np.zeros_like(want), name="kernel")
    cm.restore({"enc.layer.10.float32": var}, [cm.Source(str(path))])
    assert _same_bits(var.numpy(), want)

    out = tmp_path / "out" / "merged"
    cm.merge([cm.Source(str(path), include=["enc.*"])], str(out))
    reader = tf.train.load_checkpoint(str(out))
    for name, value in values.items():
        if name.startswith("enc.") and value.dtype.name in ("float32", "int64", "float16", "bfloat16"):
            assert _same_bits(np.asarray(reader.get_tensor(name)), value), name


def test_safetensors_read_many_in_segments_equals_get(st_file, monkeypatch):
    import ckptmerge.formats.safetensors.reader as st_module

    monkeypatch.setattr(st_module, "_SEGMENT", 8)  # many segments per tensor, read by several threads
    path, values = st_file
    with open_checkpoint(str(path)) as r:
        got = r.read_many(list(values) + ["scalar"], max_workers=4)
        for name, want in values.items():
            assert _same_bits(got[name], want), name


_LIST_DRIVER = IN_PROCESS_CLI + """
import json, sys
runs = {}
for path in sys.argv[1:]:
    runs[path] = [cli('ls', path, '--json'), cli('ls', path), cli('ls', path, '--tree'), cli('diff', path, path)]
listed_with = sorted(m for m in sys.modules if m.split('.')[0] == 'ml_dtypes')
shown = cli('show', sys.argv[1], 'bf', '--json')  # values: now ml_dtypes is needed
print(json.dumps({'runs': runs, 'listed_with': listed_with[:3], 'shown': shown,
                  'after_show': 'ml_dtypes' in sys.modules}))
"""


def test_listing_bf16_and_float8_tensors_never_imports_ml_dtypes(tmp_path):
    """Dtype names are strings until values are decoded: 'ls' (--json, --tree) and 'diff' of a
    safetensors file and of a Keras weights file (and a .keras archive) holding bfloat16, float8
    and packed 4-bit tensors never import ml_dtypes (about a second of CPU); 'show' then does."""
    import subprocess
    import sys
    import zipfile

    import h5py

    st = tmp_path / "m.safetensors"
    st_numpy.save_file({"bf": np.array([1.5, -2], ml_dtypes.bfloat16), "e4": np.ones(3, ml_dtypes.float8_e4m3fn),
                        "e5": np.ones(2, ml_dtypes.float8_e5m2), "x": np.ones(2, np.float32)}, str(st))
    header = json.dumps({"f4": {"dtype": "F4", "shape": [4], "data_offsets": [0, 2]},
                         "e8": {"dtype": "F8_E8M0", "shape": [2], "data_offsets": [2, 4]}}).encode()
    packed = tmp_path / "packed.safetensors"
    packed.write_bytes(struct.pack("<Q", len(header)) + header + bytes(4))
    h5 = tmp_path / "m.weights.h5"
    with h5py.File(h5, "w") as f:
        for key, dt in (("layers/dense/vars/0", ml_dtypes.bfloat16), ("layers/dense/vars/1", ml_dtypes.float8_e4m3fn)):
            f.create_dataset(key, data=np.ones((2, 3), dt).view(f"V{np.dtype(dt).itemsize}"))
            f[key].attrs["dtype"] = np.dtype(dt).name
        f["layers/dense/vars/2"] = np.ones(3, np.float32)
    archive = tmp_path / "m.keras"
    with zipfile.ZipFile(archive, "w") as z:
        z.write(h5, "model.weights.h5")
    paths = [str(p) for p in (st, packed, h5, archive)]
    out = subprocess.run([sys.executable, "-c", _LIST_DRIVER, *paths], capture_output=True, text=True, cwd=REPO,
                         env={**os.environ, "PYTHONPATH": str(REPO)}, timeout=180)
    assert out.returncode == 0, out.stderr[-3000:]
    found = json.loads(out.stdout.splitlines()[-1])
    for path, runs in found["runs"].items():
        assert [r[0] for r in runs] == [0, 0, 0, 0], (path, runs)
    assert found["listed_with"] == []
    dtypes = {p: {v["name"]: v["dtype"] for v in json.loads(found["runs"][p][0][1])} for p in paths}
    assert dtypes[str(st)] == {"bf": "bfloat16", "e4": "float8_e4m3fn", "e5": "float8_e5m2", "x": "float32"}
    assert dtypes[str(packed)] == {"f4": "float4_e2m1fn", "e8": "float8_e8m0fnu"}
    assert dtypes[str(h5)] == {"layers/dense/vars/0": "bfloat16", "layers/dense/vars/1": "float8_e4m3fn",
                               "layers/dense/vars/2": "float32"}
    assert sorted(dtypes[str(archive)].values()) == ["bfloat16", "float32", "float8_e4m3fn"]
    assert "bfloat16" in found["runs"][str(h5)][1][1] and "float8_e4m3fn" in found["runs"][str(st)][1][1]
    code, shown, err = found["shown"]
    assert code == 0 and json.loads(shown)["value"] == [1.5, -2.0], err
    assert found["after_show"]
