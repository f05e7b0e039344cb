"""Zip faults in ``.npz`` and ``.keras`` archives: one set of rules for every member.

An encrypted member, a compression method ckptmerge does not decompress, declared sizes that
contradict the archive, a stream that ends early and a member that would expand more than
``MAX_EXPANSION`` (256) times are each a clear ``CheckpointFormatError`` naming the archive and
the member, in the API and in the CLI (exit 2, one line, no traceback, no "Aborted!"). Archives
are written by ``np.savez`` / ``zipfile`` in the test and then edited byte by byte.
"""

from __future__ import annotations

import io
import struct
import zipfile
from pathlib import Path
from typing import Callable

import h5py
import numpy as np
import pytest

from _cli_util import assert_one_line_error, run
from _reader_util import traced_peak
from ckptmerge.core.errors import CheckpointFormatError, UnsafeCheckpointError
from ckptmerge.formats import open_checkpoint
from ckptmerge.formats.io.zipmembers import MAX_EXPANSION, SMALL_MEMBER, check_member

KEY = "layers/dense/vars/0"


def _tiny_weights() -> bytes:
    buf = io.BytesIO()
    with h5py.File(buf, "w") as f:
        f[KEY] = np.arange(3, dtype=np.float32)
    return buf.getvalue()


def _npz(path: Path, compressed: bool) -> Path:
    (np.savez_compressed if compressed else np.savez)(path, x=np.arange(1000, dtype=np.float32))
    return path


def _keras(path: Path, compressed: bool) -> Path:
    method = zipfile.ZIP_DEFLATED if compressed else zipfile.ZIP_STORED
    with zipfile.ZipFile(path, "w", compression=method) as z:
        z.writestr("model.weights.h5", _tiny_weights())
    return path


MAKERS = {"npz": (_npz, "w.npz", "x.npy"), "keras": (_keras, "m.keras", "model.weights.h5")}


def _edit(path: Path, member: str, fn: Callable[[bytearray, int, int], None]) -> None:
    """Call ``fn(data, local_header, central_header)`` for ``member`` and write the result."""
    data = bytearray(path.read_bytes())
    with zipfile.ZipFile(path) as z:
        local = z.getinfo(member).header_offset
    central = data.find(b"PK\x01\x02")
    while data[central + 46:central + 46 + len(member)] != member.encode():
        central = data.find(b"PK\x01\x02", central + 4)
    fn(data, local, central)
    path.write_bytes(bytes(data))


def _encrypted(data: bytearray, local: int, central: int) -> None:
    data[local + 6] |= 1
    data[central + 8] |= 1


def _method(code: int) -> Callable[[bytearray, int, int], None]:
    def edit(data: bytearray, local: int, central: int) -> None:
        struct.pack_into("<H", data, local + 8, code)
        struct.pack_into("<H", data, central + 10, code)
    return edit


def _compressed_size(size: Callable[[int], int]) -> Callable[[bytearray, int, int], None]:
    def edit(data: bytearray, local: int, central: int) -> None:
        old = struct.unpack_from("<I", data, central + 20)[0]
        struct.pack_into("<I", data, central + 20, size(old))
        struct.pack_into("<I", data, local + 18, size(old))
    return edit


FAULTS = {
    "encrypted": (_encrypted, "it is encrypted"),
    "zstd": (_method(93), "compression method 93 (zstandard)"),
    "unknown-method": (_method(77), "compression method 77"),
    "size-past-end": (_compressed_size(lambda n: n + (1 << 30)), "runs past the end"),
}


def _read_everything(path: Path) -> None:
    with open_checkpoint(str(path)) as r:
        for name in r.names():
            r.get(name)
            for _ in r.iter_chunks(name, 7):
                pass


@pytest.mark.parametrize("kind", sorted(MAKERS))
@pytest.mark.parametrize("compressed", [False, True], ids=["stored", "deflated"])
@pytest.mark.parametrize("fault", sorted(FAULTS))
def test_a_zip_fault_is_a_format_error_naming_archive_and_member(tmp_path, kind, compressed, fault):
    make, name, member = MAKERS[kind]
    path = make(tmp_path / name, compressed)
    edit, problem = FAULTS[fault]
    _edit(path, member, edit)
    with pytest.raises(CheckpointFormatError) as err:
        _read_everything(path)
    text = str(err.value)
    assert problem in text and f"member '{member}' of {name}" in text and f"(File: {path})" in text, text
    assert err.value.path == str(path) and err.value.key == member
    for command in (("ls", path), ("ls", path, "--stats"), ("show", path, "x" if kind == "npz" else KEY)):
        result = run(*command)
        assert_one_line_error(result, f"member '{member}' of {name}", problem)
        assert "Aborted" not in result.output


@pytest.mark.parametrize("kind", sorted(MAKERS))
@pytest.mark.parametrize("damage", ["short", "garbage"])
def test_a_compressed_stream_that_ends_early_or_does_not_inflate_is_a_format_error(tmp_path, kind, damage):
    make, name, member = MAKERS[kind]
    path = make(tmp_path / name, True)
    if damage == "short":  # the declared compressed size cut in half: EOFError (the CLI said "Aborted!")
        _edit(path, member, _compressed_size(lambda n: n // 2))
    else:  # the compressed bytes overwritten: zlib.error
        with zipfile.ZipFile(path) as z:
            info = z.getinfo(member)
        def garble(data: bytearray, local: int, central: int) -> None:
            start = local + 30 + struct.unpack_from("<H", data, local + 26)[0] + struct.unpack_from("<H", data, local + 28)[0]
            data[start + 2:start + info.compress_size] = b"\xff" * (info.compress_size - 2)
        _edit(path, member, garble)
    with pytest.raises(CheckpointFormatError) as err:
        _read_everything(path)
    assert f"member '{member}' of {name}" in str(err.value), str(err.value)
    result = run("ls", path, "--stats")
    assert_one_line_error(result, f"member '{member}' of {name}")
    assert "Aborted" not in result.output


def _ratio_npz(path: Path, ratio: int, nbytes: int = 8 << 20) -> Path:
    """An ``.npz`` whose one member expands about ``ratio`` times: zeros spiced with random bytes."""
    rng = np.random.default_rng(0)
    data = np.zeros(nbytes, np.uint8)
    spots = rng.integers(0, nbytes, size=max(1, nbytes // (ratio * 4)))
    data[spots] = rng.integers(1, 256, size=len(spots), dtype=np.uint8)
    np.savez_compressed(path, x=data)
    return path


def test_a_npz_member_inflating_past_the_bound_is_refused_before_decompressing(tmp_path):
    path = _ratio_npz(tmp_path / "bomb.npz", 1000)
    with zipfile.ZipFile(path) as z:
        info = z.getinfo("x.npy")
    assert MAX_EXPANSION < info.file_size / info.compress_size < 1100  # what DEFLATE can really do
    with pytest.raises(UnsafeCheckpointError, match=f"more than {MAX_EXPANSION}x") as err:
        open_checkpoint(str(path))
    assert err.value.key == "x.npy" and err.value.path == str(path)
    assert_one_line_error(run("ls", path), "Refusing to read member 'x.npy' of bomb.npz", "decompression bomb")


def test_a_npz_member_within_the_bound_reads_and_streams_in_pieces(tmp_path):
    path = _ratio_npz(tmp_path / "ok.npz", 40, 32 << 20)
    with zipfile.ZipFile(path) as z:
        info = z.getinfo("x.npy")
    assert 4 < info.file_size / info.compress_size < MAX_EXPANSION
    with open_checkpoint(str(path)) as r:
        whole = r.get("x")
        pieces, peak = traced_peak(lambda: [int(c.sum(dtype=np.int64)) for c in r.iter_chunks("x", 1 << 20)])
    assert sum(pieces) == int(whole.astype(np.int64).sum())
    assert peak < 12 << 20, peak  # a piece (1 MiB) and zipfile's buffers, not the 32 MiB member


def test_check_member_bounds_every_compression_method():
    for method in (zipfile.ZIP_DEFLATED, zipfile.ZIP_BZIP2, zipfile.ZIP_LZMA):
        info = zipfile.ZipInfo("x.npy")
        info.compress_type, info.compress_size, info.file_size = method, 1 << 20, (1 << 20) * (MAX_EXPANSION + 1)
        with pytest.raises(UnsafeCheckpointError):
            check_member(info, "w.npz")
        info.file_size = (1 << 20) * MAX_EXPANSION
        check_member(info, "w.npz")  # at the bound: fine
    small = zipfile.ZipInfo("x.npy")
    small.compress_type, small.compress_size, small.file_size = zipfile.ZIP_DEFLATED, 10, SMALL_MEMBER
    check_member(small, "w.npz")  # a tiny constant array compresses beyond any ratio


def test_a_stored_member_whose_sizes_disagree_is_refused(tmp_path):
    path = _npz(tmp_path / "w.npz", False)
    _edit(path, "x.npy", lambda d, local, c: struct.pack_into("<I", d, c + 20, 17))
    with pytest.raises(CheckpointFormatError, match="stored uncompressed but declares"):
        open_checkpoint(str(path))


def test_a_keras_config_json_with_a_zip_fault_is_ignored_with_a_warning(tmp_path, caplog):
    path = tmp_path / "m.keras"
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as z:
        z.writestr("config.json", b"{}")
        z.writestr("model.weights.h5", _tiny_weights())
    _edit(path, "config.json", _method(93))
    with open_checkpoint(str(path)) as r:
        assert r.names() == [KEY]
    assert "Ignoring config.json" in caplog.text and "compression method 93" in caplog.text


METHODS = {"deflate": zipfile.ZIP_DEFLATED, "bzip2": zipfile.ZIP_BZIP2, "lzma": zipfile.ZIP_LZMA}


def _archive(path: Path, kind: str, method: int, seed: int) -> Path:
    """An archive of ``kind`` whose one member is compressed with ``method``: random values, so
    every part of the stream matters."""
    values = np.random.default_rng(seed).standard_normal(2000 + 100 * seed).astype(np.float32)
    if kind == "npz":
        buf = io.BytesIO()
        np.save(buf, values)
        member, data = "x.npy", buf.getvalue()
    else:
        buf = io.BytesIO()
        with h5py.File(buf, "w") as f:
            f[KEY] = values
        member, data = "model.weights.h5", buf.getvalue()
    with zipfile.ZipFile(path, "w", compression=method) as z:
        z.writestr(member, data)
    return path


def _damage(path: Path, member: str, damage: str, seed: int) -> None:
    with zipfile.ZipFile(path) as z:
        info = z.getinfo(member)
    rng = np.random.default_rng(seed)

    def edit(data: bytearray, local: int, central: int) -> None:
        start = local + 30 + struct.unpack_from("<H", data, local + 26)[0] + struct.unpack_from("<H", data, local + 28)[0]
        if damage == "garbage":
            data[start + 2:start + info.compress_size] = b"\xff" * (info.compress_size - 2)
        else:  # a few runs of flipped bits anywhere in the stream
            for at in rng.integers(0, info.compress_size - 8, size=3):
                for j in range(8):
                    data[start + int(at) + j] ^= 0xA5

    if damage == "short":
        _edit(path, member, _compressed_size(lambda n: n // 2))
    else:
        _edit(path, member, edit)


@pytest.mark.parametrize("kind", sorted(MAKERS))
@pytest.mark.parametrize("method", sorted(METHODS))
@pytest.mark.parametrize("damage", ["garbage", "flipped", "short"])
@pytest.mark.parametrize("seed", [1, 2])
def test_a_damaged_member_of_any_compression_is_a_format_error_naming_it(tmp_path, kind, method, damage, seed):
    """Issue 30: a corrupt LZMA member gave a traceback (LZMAError) and a bzip2 one was called "not
    an HDF5 file"; every method's faults name the member and the archive."""
    name = f"w{seed}.npz" if kind == "npz" else f"m{seed}.keras"
    member = MAKERS[kind][2]
    path = _archive(tmp_path / name, kind, METHODS[method], seed)
    _read_everything(path)  # the undamaged archive reads
    _damage(path, member, damage, seed)
    with pytest.raises(CheckpointFormatError) as err:
        _read_everything(path)
    text = str(err.value)
    assert f"member '{member}' of {name}" in text and f"(File: {path})" in text, text
    assert err.value.path == str(path) and err.value.key == member
    assert "not an HDF5" not in text, text
    result = run("ls", path, "--stats")
    assert_one_line_error(result, f"member '{member}' of {name}")
    assert "Traceback" not in result.output and "Aborted" not in result.output
