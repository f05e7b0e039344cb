"""Faults every reader meets the same way: overflowing shapes, names that are not Unicode, files
that are damaged or half what they claim, and what is recognised as what.

* A zero-element shape whose dimensions multiply past 2**63 (``(0, 2**61, 2**61)``) cannot be an
  array: each reader refuses it with a ``CheckpointFormatError`` naming the file and tensor
  (one check, ``ckptmerge.formats.base.shape_problem``; Orbax's zarr metadata too), and ``ls``
  (``--json`` too: the safetensors, NumPy, Keras h5 and Orbax readers refuse it when they list the
  file), ``show``, ``ls --stats``, ``diff``, ``merge`` and ``cm.load`` say so in one line instead
  of a numpy traceback.
* A name that is not valid Unicode (a lone surrogate, as an undecodable byte of a file name
  gives) goes through ``suggest`` and is refused by a safetensors merge with a clear error.
* A damaged ``.safetensors``, an ``.npz`` with a member that is not an array, a folder whose
  ``.npy`` files are all in subfolders, and an unknown ``layout=`` are each named for what they are.
"""

from __future__ import annotations

import importlib.util
import json
import os
import struct
from pathlib import Path

import h5py
import numpy as np
import pytest

import ckptmerge as cm
from _cli_util import assert_one_line_error, run, write_config
from ckptmerge.core.errors import CheckpointFormatError, RuleError
from ckptmerge.formats import NumpyReader, open_checkpoint
from ckptmerge.formats.base import shape_problem, too_large_for_numpy

HUGE = [0, 2 ** 61, 2 ** 61]


def _safetensors(path: Path) -> Path:
    header = json.dumps({"huge": {"dtype": "F32", "shape": HUGE, "data_offsets": [0, 0]},
                         "ok": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}).encode()
    path.write_bytes(struct.pack("<Q", len(header)) + header + np.ones(2, "<f4").tobytes())
    return path


def _npy_header(shape) -> bytes:
    text = "{'descr': '<f4', 'fortran_order': False, 'shape': %r, }" % (tuple(shape),)
    text += " " * (-(len(text) + 11) % 64) + "\n"
    return b"\x93NUMPY\x01\x00" + struct.pack("<H", len(text)) + text.encode()


def _npy_dir(path: Path) -> Path:
    path.mkdir()
    (path / "huge.npy").write_bytes(_npy_header(HUGE))
    np.save(path / "ok.npy", np.ones(2, np.float32))
    return path


def _npz(path: Path) -> Path:
    import zipfile

    with zipfile.ZipFile(path, "w") as z:
        z.writestr("huge.npy", _npy_header(HUGE))
        z.writestr("ok.npy", _npy_header([2]) + np.ones(2, "<f4").tobytes())
    return path


def _h5(path: Path) -> Path:
    with h5py.File(path, "w") as f:
        f.create_dataset("huge", shape=tuple(HUGE), maxshape=(None, *HUGE[1:]), dtype="f4", chunks=(1, 1, 1))
        f["ok"] = np.ones(2, np.float32)
    return path


def _orbax(path: Path) -> Path:
    """An Orbax item folder as orbax-checkpoint's V0 handler writes it without OCDBT (zarr v2
    arrays in folders), uncompressed."""
    path.mkdir()
    tree = {f"('{k}',)": {"key_metadata": [{"key": k, "key_type": 2}],
                          "value_metadata": {"value_type": "np.ndarray", "skip_deserialize": False}}
            for k in ("huge", "ok")}
    (path / "_METADATA").write_text(json.dumps({"tree_metadata": tree, "use_ocdbt": False, "use_zarr3": False}))
    for key, shape in (("huge", HUGE), ("ok", [2])):
        (path / key).mkdir()
        (path / key / ".zarray").write_text(json.dumps(
            {"chunks": [1] * (len(shape) - 1) + [2], "compressor": None, "dimension_separator": ".", "dtype": "<f4",
             "fill_value": None, "filters": None, "order": "C", "shape": shape, "zarr_format": 2}))
    (path / "ok" / "0").write_bytes(np.ones(2, "<f4").tobytes())
    return path


_NEEDS_TENSORSTORE = pytest.mark.skipif(importlib.util.find_spec("tensorstore") is None,
                                        reason="the Orbax reader needs tensorstore (pip install 'ckptmerge[orbax]')")
MAKERS = {"safetensors": (_safetensors, "m.safetensors"), "npy-dir": (_npy_dir, "arrays"),
          "npz": (_npz, "w.npz"), "h5": (_h5, "m.weights.h5"), "orbax": (_orbax, "orbax-item")}
KINDS = [pytest.param(k, marks=_NEEDS_TENSORSTORE) if k == "orbax" else k for k in sorted(MAKERS)]


def test_the_shared_check_refuses_what_numpy_cannot_allocate():
    assert too_large_for_numpy(HUGE, 4) and too_large_for_numpy((0, 2 ** 60, 4), 4)
    assert not too_large_for_numpy((0, 2 ** 40), 4) and not too_large_for_numpy((3, 4), 8)
    with pytest.raises(ValueError):  # what the readers would otherwise hit
        np.empty((0, 2 ** 60, 4), np.float32)


@pytest.mark.parametrize("kind", KINDS)
def test_an_overflowing_zero_element_shape_is_a_format_error_in_every_reader(tmp_path, kind):
    make, name = MAKERS[kind]
    path = make(tmp_path / name)
    with pytest.raises(CheckpointFormatError, match="too large for any array") as err:
        with open_checkpoint(str(path)) as r:
            r.get("huge")
    assert name in str(err.value)
    with pytest.raises(CheckpointFormatError, match="too large for any array"):
        cm.load(str(path), "huge")


@pytest.mark.parametrize("kind", KINDS)
def test_the_commands_refuse_an_overflowing_shape_in_one_line(tmp_path, kind):
    make, name = MAKERS[kind]
    path = make(tmp_path / name)
    config = write_config(tmp_path / "m.yaml", f"sources:\n  - path: {json.dumps(str(path))}\n")
    for args in (("show", path, "huge"), ("ls", path, "--stats"), ("diff", path, path, "--values"),
                 ("merge", config, "-o", tmp_path / "out" / "model.ckpt"),
                 ("merge", config, "-o", tmp_path / "out" / "model.safetensors")):
        result = run(*args)
        assert_one_line_error(result, "too large for any array", name)
    assert not (tmp_path / "out").exists() or not [p for p in (tmp_path / "out").iterdir()]


@pytest.mark.parametrize("kind", KINDS)
def test_listing_refuses_an_overflowing_shape_as_the_other_commands_do(tmp_path, kind):
    """Regression: ``ls --json`` of a Keras weights file listed such a dataset with exit 0 while
    ``show`` and ``merge`` refused it (the h5 reader checked only when values were read)."""
    make, name = MAKERS[kind]
    path = make(tmp_path / name)
    for args in (("ls", path, "--json"), ("ls", path), ("show", path, "ok")):
        result = run(*args)
        assert_one_line_error(result, "too large for any array", name, "'huge", "(0, 2305843009213693952")


@pytest.mark.parametrize("dims", [(0, 2 ** 40, 2 ** 40), (0, 2 ** 31, 2 ** 31, 2 ** 31)])
def test_a_keras_weights_file_is_refused_when_listed(tmp_path, dims):
    path = tmp_path / "m.weights.h5"
    with h5py.File(path, "w") as f:
        f.create_dataset("layers/dense/vars/0", shape=dims, maxshape=(None, *dims[1:]), dtype="f4",
                         chunks=(1,) * len(dims))
        f["layers/dense/vars/1"] = np.ones(2, np.float32)
    with pytest.raises(CheckpointFormatError, match="too large for any array") as err:
        open_checkpoint(str(path))
    assert err.value.key == "layers/dense/vars/0" and err.value.path == str(path)
    result = run("ls", path, "--json")
    assert_one_line_error(result, "m.weights.h5", "dataset 'layers/dense/vars/0' has shape", str(dims))


def test_the_shared_shape_check_names_what_is_wrong():
    assert shape_problem((0, 2 ** 40, 2 ** 40), 4).startswith("has shape (0, 1099511627776, 1099511627776), too large")
    assert shape_problem((0, 2 ** 30, 2 ** 30), 4) is None  # 2**62 bytes of nothing: numpy makes it
    assert shape_problem([2, "3"], 4) == "has an invalid shape [2, '3']"
    assert shape_problem([True], 4) == "has an invalid shape [True]"
    assert shape_problem([1] * 65, 4).startswith("has an invalid shape")
    assert shape_problem("x\n", 4) == "has an invalid shape 'x\\n'"
    assert shape_problem([2 ** 62], 1).startswith("has an invalid shape")
    assert shape_problem([], 8) is None and shape_problem((3, 0, 5), 2) is None


def _non_utf8_name_dir(root: Path, scope: str) -> Path:
    """A folder of .npy files whose scope folder's name is not UTF-8 (``a\\xff``): a lone surrogate."""
    (root / scope).mkdir(parents=True)
    np.save(root / scope / "kernel.npy", np.ones((3, 5), np.float32))
    np.save(root / scope / "bias.npy", np.ones(5, np.float32))
    os.rename(os.fsencode(root / scope), os.fsencode(root / scope)[:-len(scope)] + b"a\xff")
    return root


def test_suggest_handles_names_that_are_not_unicode(tmp_path):
    source = _non_utf8_name_dir(tmp_path / "src", "a")
    target = tmp_path / "target"
    (target / "dense").mkdir(parents=True)
    np.save(target / "dense" / "kernel.npy", np.ones((3, 5), np.float32))
    np.save(target / "dense" / "bias.npy", np.ones(5, np.float32))
    names = sorted(open_checkpoint(str(source)).names())
    assert names == ["a\udcff/bias", "a\udcff/kernel"]
    for extra in ((), ("--json",), ("-o", tmp_path / "warm.yaml")):
        result = run("suggest", source, "--target", target, *extra)
        assert result.exit_code == 0, result.output
        assert "Traceback" not in result.output
    result = run("plan", tmp_path / "warm.yaml", "--target", target)
    assert result.exit_code == 0 and "dense/kernel <- " in result.stdout, result.output


def test_a_safetensors_merge_refuses_a_name_that_is_not_unicode(tmp_path):
    source = _non_utf8_name_dir(tmp_path / "src", "a")
    config = write_config(tmp_path / "m.yaml", f"sources:\n  - path: {json.dumps(str(source))}\n")
    out = tmp_path / "out"
    result = run("merge", config, "-o", out / "model.safetensors")
    assert_one_line_error(result, "is not valid Unicode text", "a\\udcff/bias")
    assert not out.exists() or list(out.iterdir()) == []
    result = run("merge", config, "-o", out / "model.ckpt")  # a TF checkpoint: also refused, clearly
    assert result.exit_code == 2 and "Traceback" not in result.output


def test_a_damaged_safetensors_file_says_what_is_wrong(tmp_path):
    path = tmp_path / "model.safetensors"
    path.write_bytes(b"this is not a safetensors file at all")
    with pytest.raises(CheckpointFormatError, match="the header claims"):
        open_checkpoint(str(path))
    assert_one_line_error(run("ls", path), "Cannot read safetensors file model.safetensors", "the header claims")
    path.write_bytes(b"\x02")
    assert_one_line_error(run("ls", path), "model.safetensors", "fewer than the 8-byte header length")


def test_an_npz_with_a_member_that_is_not_an_array_names_it(tmp_path):
    import zipfile

    path = tmp_path / "w.npz"
    np.savez(path, x=np.ones(2))
    with zipfile.ZipFile(path, "a") as z:
        z.writestr("README.txt", "hello")
    with pytest.raises(CheckpointFormatError, match="member 'README.txt' is not an .npy array"):
        open_checkpoint(str(path))
    assert_one_line_error(run("ls", path), "w.npz", "'README.txt' is not an .npy array")
    renamed = tmp_path / "w.zip"  # not named .npz, but holding arrays: still read as one
    path.rename(renamed)
    assert_one_line_error(run("ls", renamed), "w.zip", "'README.txt' is not an .npy array")
    empty = tmp_path / "empty.npz"
    zipfile.ZipFile(empty, "w").close()
    assert_one_line_error(run("ls", empty), "empty.npz", "the archive is empty")


def test_a_folder_whose_npy_files_are_all_in_subfolders_is_recognised(tmp_path):
    root = tmp_path / "arrays"
    (root / "encoder" / "layer0").mkdir(parents=True)
    np.save(root / "encoder" / "layer0" / "kernel.npy", np.ones((2, 3), np.float32))
    np.save(root / "encoder" / "bias.npy", np.zeros(3, np.float32))
    assert isinstance(open_checkpoint(str(root)), NumpyReader)
    result = run("ls", root)
    assert result.exit_code == 0, result.output
    assert "encoder/layer0/kernel" in result.stdout and "encoder/bias" in result.stdout
    assert sorted(cm.load(str(root))) == ["encoder/bias", "encoder/layer0/kernel"]


def test_a_folder_with_no_npy_file_anywhere_is_still_no_checkpoint(tmp_path):
    (tmp_path / "d" / "sub").mkdir(parents=True)
    (tmp_path / "d" / "sub" / "notes.txt").write_text("x")
    result = run("ls", tmp_path / "d")
    assert result.exit_code == 2 and "No checkpoint in directory" in result.stderr


@pytest.mark.parametrize("layout,hint", [("nope", ""), ("torhc", "Did you mean 'torch'?"), ("flx", "Did you mean 'flax'?")])
def test_an_unknown_layout_names_the_layouts_that_exist(tmp_path, layout, hint):
    np.savez(tmp_path / "w.npz", a=np.ones(2))
    with pytest.raises(RuleError) as err:
        cm.Source(str(tmp_path / "w.npz"), layout=layout)
    text = str(err.value)
    assert f"layout={layout!r}" in text and "'torch'" in text and hint in text, text
