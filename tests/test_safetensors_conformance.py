"""safetensors conformance, as the format's library and its spec define it.

The malformed and edge-case files of the library's own tests (``safetensors/src/tensor.rs``:
``test_json_attack``, ``test_metadata_incomplete_buffer``, ``test_header_too_large``,
``test_header_too_small``, ``test_invalid_header_length``, ``test_invalid_header_non_utf8``,
``test_invalid_header_not_json``, ``test_whitespace_padded_header``, ``test_zero_sized_tensor``,
``test_invalid_info``, ``test_validation_overflow``, ``test_empty_shapes_allowed``,
``test_deserialization``) and the spec's rules (no holes, the first tensor at offset 0, nothing
after the last, known dtypes only) are replayed against our reader, and each verdict is checked
against the installed ``safetensors`` package's own (``safetensors.deserialize``, the Rust core)
on the same bytes: what it accepts we accept, what it refuses we refuse, in ``list_variables``,
``ls --json`` and reads alike. The sub-byte and FNUZ dtypes are read as the package reads them.
"""

from __future__ import annotations

import json
import struct
import subprocess
import textwrap
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
import safetensors

from _cli_util import assert_one_line_error, run
from _torch import REASON as TORCH_REASON
from _torch import torch_python
from ckptmerge.core.errors import CheckpointFormatError, UnreadableTensorError
from ckptmerge.formats import SafetensorsReader, list_variables, open_checkpoint


def _file(header, data: bytes = b"", claimed: int = -1) -> bytes:
    raw = header if isinstance(header, bytes) else json.dumps(header).encode()
    return struct.pack("<Q", len(raw) if claimed < 0 else claimed) + raw + data


I32 = {"dtype": "I32", "shape": [2, 2], "data_offsets": [0, 16]}

#: name -> the file's bytes (from the library's tests, and the spec's rules)
CASES = {
    "deserialization": _file(b'{"test":{"dtype":"I32","shape":[2,2],"data_offsets":[0,16]}}', bytes(16)),
    "empty-shape": _file(b'{"test":{"dtype":"I32","shape":[],"data_offsets":[0,4]}}', bytes(4)),
    "json-attack": _file({f"weight_{i}": {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 16]}
                          for i in range(10)}, bytes(16)),
    "polyglot-trailing-bytes": _file({"test": I32}, bytes(16) + b"extra_bogus_data_for_polyglot_file"),
    "missing-bytes": _file({"test": I32}, bytes(14)),
    "header-too-large": b"<\x00\x00\x00\x00\xff\xff\xff" + json.dumps({"test": I32}).encode() + bytes(16),
    "header-too-small": b"",
    "invalid-header-length": b"<\x00\x00\x00\x00\x00\x00\x00",
    "header-not-utf8": b"\x01\x00\x00\x00\x00\x00\x00\x00\xff",
    "header-not-json": b"\x01\x00\x00\x00\x00\x00\x00\x00{",
    "header-not-an-object": _file(b"[]"),
    "whitespace-after-header": b"\x06\x00\x00\x00\x00\x00\x00\x00{}\x0d\x20\x09\x0a",
    "whitespace-before-header": b"\x06\x00\x00\x00\x00\x00\x00\x00\x09\x0a{}\x0d\x20",
    "whitespace-before-a-tensor": _file(b"  \n" + json.dumps({"test": I32}).encode(), bytes(16)),
    "zero-sized-tensor": _file(b'{"test":{"dtype":"I32","shape":[2,0],"data_offsets":[0, 0]}}'),
    "invalid-info": _file(b'{"test":{"dtype":"I32","shape":[2,2],"data_offsets":[0, 4]}}', bytes(4)),
    "overflow-shape": _file(b'{"test":{"dtype":"I32","shape":[2,18446744073709551614],"data_offsets":[0,16]}}',
                            bytes(16)),
    "overflow-bytes": _file(b'{"test":{"dtype":"I32","shape":[2,9223372036854775807],"data_offsets":[0,16]}}',
                            bytes(16)),
    "hole-between-tensors": _file({"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]},
                                   "b": {"dtype": "F32", "shape": [1], "data_offsets": [8, 12]}}, bytes(12)),
    "first-tensor-not-at-0": _file({"a": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}}, bytes(8)),
    "bytes-after-last-tensor": _file({"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}, bytes(8)),
    "unknown-dtype": _file({"a": {"dtype": "F33", "shape": [1], "data_offsets": [0, 4]}}, bytes(4)),
    "complex128-is-no-safetensors-dtype": _file({"a": {"dtype": "C128", "shape": [1], "data_offsets": [0, 16]}},
                                                bytes(16)),
    "empty-tensor-in-the-middle": _file({"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]},
                                         "e": {"dtype": "F32", "shape": [0], "data_offsets": [4, 4]},
                                         "b": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}}, bytes(8)),
    "f4-odd-elements": _file({"a": {"dtype": "F4", "shape": [3], "data_offsets": [0, 2]}}, bytes(2)),
    "f4": _file({"a": {"dtype": "F4", "shape": [2, 4], "data_offsets": [0, 4]}}, bytes(range(0x12, 0x9a, 0x22))),
    "f6": _file({"a": {"dtype": "F6_E2M3", "shape": [4], "data_offsets": [0, 3]}}, bytes(3)),
    "f6-not-whole-bytes": _file({"a": {"dtype": "F6_E3M2", "shape": [3], "data_offsets": [0, 3]}}, bytes(3)),
    "fnuz": _file({"a": {"dtype": "F8_E4M3FNUZ", "shape": [2], "data_offsets": [0, 2]},
                   "b": {"dtype": "F8_E5M2FNUZ", "shape": [2], "data_offsets": [2, 4]}}, b"\x12\x80\x7f\x01"),
    "metadata-not-strings": _file({"__metadata__": {"k": 1}}),
    "lone-surrogate-name": _file(b'{"enc.\\ud800x":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}', bytes(4)),
    "lone-surrogate-metadata": _file(b'{"__metadata__":{"k":"\\udcff"}}'),
    "escaped-unicode-name": _file(b'{"caf\\u00e9":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}', bytes(4)),
}


def _library_accepts(data: bytes) -> bool:
    try:
        safetensors.deserialize(data)
    except Exception:  # the package raises SafetensorError (and others) for what it refuses
        return False
    return True


def _we_accept(path: Path) -> bool:
    try:
        with SafetensorsReader(str(path)) as r:
            r.variables()
    except CheckpointFormatError:
        return False
    return True


@pytest.mark.parametrize("case", sorted(CASES))
def test_we_accept_exactly_the_files_the_library_accepts(tmp_path, case):
    path = tmp_path / "model.safetensors"
    path.write_bytes(CASES[case])
    assert _we_accept(path) == _library_accepts(CASES[case]), case


@pytest.mark.parametrize("case", sorted(c for c in CASES if not _library_accepts(CASES[c])))
def test_a_refused_file_is_refused_by_list_variables_and_ls_json_too(tmp_path, case):
    path = tmp_path / "model.safetensors"
    path.write_bytes(CASES[case])
    with pytest.raises(CheckpointFormatError):
        list_variables(str(path))
    for args in (("ls", path, "--json"), ("ls", path), ("show", path, "a")):
        assert_one_line_error(run(*args), "model.safetensors")


@pytest.mark.parametrize("case,problem", [
    ("hole-between-tensors", "bytes 4..8 of the data after tensor 'a' belong to no tensor"),
    ("first-tensor-not-at-0", "the first tensor starts at offset 0"),
    ("bytes-after-last-tensor", "4 byte(s) after the last tensor's data"),
    ("polyglot-trailing-bytes", "after the last tensor's data"),
    ("unknown-dtype", "dtype 'F33', which is no safetensors dtype"),
    ("json-attack", "overlap"),
    ("f4-odd-elements", "do not fill a whole number of bytes"),
])
def test_each_conformance_error_says_what_is_wrong(tmp_path, case, problem):
    path = tmp_path / "model.safetensors"
    path.write_bytes(CASES[case])
    with pytest.raises(CheckpointFormatError) as err:
        SafetensorsReader(str(path))
    assert problem in str(err.value) and str(path) in str(err.value)


def test_a_header_padded_in_front_is_recognised_and_read(tmp_path):
    path = tmp_path / "padded.bin"  # no suffix: recognised by its content
    path.write_bytes(_file(b" \t\r\n" + json.dumps({"test": I32}).encode(), np.arange(4, dtype="<i4").tobytes()))
    with open_checkpoint(str(path)) as r:
        assert isinstance(r, SafetensorsReader)
        assert r.get("test").tolist() == [[0, 1], [2, 3]]


def test_fnuz_float8_read_as_the_library_and_ml_dtypes_define_them(tmp_path):
    path = tmp_path / "m.safetensors"
    path.write_bytes(CASES["fnuz"])
    with SafetensorsReader(str(path)) as r:
        a, b = r.get("a"), r.get("b")
        assert r.info("a").dtype == "float8_e4m3fnuz" and r.info("b").dtype == "float8_e5m2fnuz"
    assert a.dtype == ml_dtypes.float8_e4m3fnuz and a.tobytes() == b"\x12\x80"
    assert np.isnan(a.astype(np.float32)[1])  # 0x80 is FNUZ's one NaN (it is -0 in E4M3FN)
    assert b.dtype == ml_dtypes.float8_e5m2fnuz and b.tobytes() == b"\x7f\x01"


def test_f4_unpacks_two_elements_per_byte_low_nibble_first(tmp_path):
    path = tmp_path / "m.safetensors"
    path.write_bytes(CASES["f4"])
    with SafetensorsReader(str(path)) as r:
        info = r.info("a")
        arr = r.get("a")
        assert (info.shape, info.dtype, info.nbytes) == ((2, 4), "float4_e2m1fn", 4)
        assert [c.tolist() for c in r.iter_chunks("a", 3)] == [arr.reshape(-1)[i:i + 3].tolist() for i in (0, 3, 6)]
    packed = np.frombuffer(CASES["f4"][-4:], np.uint8)
    expected = np.stack([packed & 0xF, packed >> 4], axis=-1).reshape(2, 4).astype(np.uint8)
    assert arr.dtype == ml_dtypes.float4_e2m1fn and arr.view(np.uint8).tolist() == expected.tolist()
    assert arr.astype(np.float32)[0, :2].tolist() == [1.0, 0.5]  # byte 0x12: low nibble 2 (1.0), high 1 (0.5)


def test_f6_is_listed_but_its_values_are_not_guessed(tmp_path):
    path = tmp_path / "m.safetensors"
    path.write_bytes(CASES["f6"])
    with SafetensorsReader(str(path)) as r:
        assert (r.info("a").dtype, r.info("a").nbytes) == ("float6_e2m3fn", 3)
        with pytest.raises(UnreadableTensorError, match="6-bit values packed in an order"):
            r.get("a")
    assert_one_line_error(run("show", path, "a"), "m.safetensors", "F6_E2M3")


_TORCH_READ = textwrap.dedent("""
    import json, sys
    import torch
    from safetensors.torch import load_file
    out = {}
    for name, t in load_file(sys.argv[1]).items():
        out[name] = [str(t.dtype), list(t.shape), t.view(torch.uint8).reshape(-1).tolist()]
    print(json.dumps(out))
""")


@pytest.mark.skipif(not torch_python(), reason=TORCH_REASON)
def test_the_safetensors_package_reads_f4_and_fnuz_as_we_do(tmp_path):
    """The package's own reading (torch: ``float4_e2m1fn_x2`` keeps the packed bytes, one per pair)."""
    path = tmp_path / "m.safetensors"
    path.write_bytes(_file({"a": {"dtype": "F4", "shape": [2, 4], "data_offsets": [0, 4]},
                            "n": {"dtype": "F8_E4M3FNUZ", "shape": [2], "data_offsets": [4, 6]},
                            "m": {"dtype": "F8_E5M2FNUZ", "shape": [2], "data_offsets": [6, 8]}},
                           bytes(range(0x12, 0x9a, 0x22)) + b"\x12\x80\x7f\x01"))
    done = subprocess.run([torch_python(), "-c", _TORCH_READ, str(path)], capture_output=True, text=True,
                          timeout=300, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    theirs = json.loads(done.stdout.splitlines()[-1])
    with SafetensorsReader(str(path)) as r:
        a, n, m = r.get("a"), r.get("n"), r.get("m")
    dtype, shape, packed = theirs["a"]
    assert dtype == "torch.float4_e2m1fn_x2" and shape == [2, 2]
    nibbles = a.view(np.uint8).reshape(-1)
    assert (nibbles[0::2] | (nibbles[1::2] << 4)).tolist() == packed  # our first element = their low nibble
    assert theirs["n"] == ["torch.float8_e4m3fnuz", [2], n.view(np.uint8).tolist()]
    assert theirs["m"] == ["torch.float8_e5m2fnuz", [2], m.view(np.uint8).tolist()]


def test_we_never_write_a_dtype_the_library_refuses(tmp_path):
    from ckptmerge.formats.safetensors.writer import unsupported_dtypes

    assert unsupported_dtypes([("c", "complex128", (1,)), ("f", "float4_e2m1fn", (2,))]) == [
        ("c", "complex128"), ("f", "float4_e2m1fn")]
    assert unsupported_dtypes([("n", "float8_e4m3fnuz", (1,)), ("m", "float8_e5m2fnuz", (1,))]) == []
