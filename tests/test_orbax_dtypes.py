"""Every zarr dtype an Orbax checkpoint may declare is either read as TensorStore decodes it or
refused when the checkpoint is listed, naming the array and the dtype (issue 30 item 6): never a
traceback from TensorStore or NumPy when the array is read.

The dtypes are generated (every kind, size and byte order of NumPy type strings, NumPy's names and
aliases, every ml_dtypes name ckptmerge knows); each is written into the zarr metadata of a real
per-array Orbax checkpoint (zarr v2 and zarr3), with its chunk written uncompressed in the test.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("tensorstore", reason="the Orbax reader needs tensorstore (pip install 'ckptmerge[orbax]')")
pytest.importorskip("orbax.checkpoint", reason="the Orbax tests write checkpoints with orbax-checkpoint")

from _orbax_util import refuse_jax_from_ckptmerge, write_orbax  # noqa: E402,F401

import ckptmerge as cm  # noqa: E402
from ckptmerge.core.errors import CheckpointFormatError  # noqa: E402
from ckptmerge.formats.dtypes import ML_ITEMSIZE  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
SHAPE = (2, 3)


def _candidates() -> list:
    out = set(ML_ITEMSIZE)
    for kind, sizes in {"b": [1], "i": [1, 2, 4, 8, 16], "u": [1, 2, 4, 8], "f": [2, 4, 8, 12, 16],
                        "c": [8, 16, 32], "m": [8], "M": [8], "S": [4], "U": [1], "V": [4]}.items():
        for size in sizes:
            for order in "<>|=":
                out.add(f"{order}{kind}{size}")
    out.update(np.dtype(c).name for c in np.typecodes["All"] if c not in "OSUVMm")
    out.update(["half", "single", "double", "longdouble", "clongdouble", "float", "int", "?", "e", "g", "G", "O",
                "object", "str", "f4", "i8"])
    return sorted(out)


def _numpy_dtype(name: str):
    import ml_dtypes

    if name in ML_ITEMSIZE:
        return np.dtype(getattr(ml_dtypes, name)) if hasattr(ml_dtypes, name) else None
    try:
        dt = np.dtype(name)
    except TypeError:
        return None
    return dt if dt.kind in "biufc" else None


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    base = tmp_path_factory.mktemp("orbax_dtypes")
    tree = {"params": {"w": np.zeros(SHAPE, np.float32)}}
    return {layout: write_orbax(base / layout, tree, layout) for layout in ("zarr", "zarr3")}


def _retype(src: Path, dst: Path, driver: str, name: str):
    """A copy of ``src`` whose array ``params.w`` declares dtype ``name``, its chunk the values
    0, 1, 0, ... in that dtype, uncompressed; returns the values (``None``: NumPy has no such dtype)."""
    shutil.copytree(src, dst)
    folder = dst / "params.w"
    dt = _numpy_dtype(name)
    want = (np.arange(6).reshape(SHAPE) % 2).astype(dt) if dt is not None else None
    data = want.tobytes() if want is not None else b"\0" * 6
    if driver == "zarr":
        meta = json.loads((folder / ".zarray").read_text())
        meta.update(dtype=name, compressor=None, fill_value=None)
        (folder / ".zarray").write_text(json.dumps(meta))
        (folder / "0.0").write_bytes(data)
    else:
        meta = json.loads((folder / "zarr.json").read_text())
        fill = False if name == "bool" else [0.0, 0.0] if name.startswith("complex") else 0
        meta.update(data_type=name, fill_value=fill, codecs=[{"name": "bytes", "configuration": {"endian": "little"}}])
        shutil.rmtree(folder / "c")
        (folder / "c" / "0").mkdir(parents=True)
        (folder / "zarr.json").write_text(json.dumps(meta))
        (folder / "c" / "0" / "0").write_bytes(want.astype(want.dtype.newbyteorder("<")).tobytes()
                                               if want is not None else data)
    return want


@pytest.mark.parametrize("driver", ["zarr", "zarr3"])
def test_every_generated_dtype_is_read_exactly_or_refused_at_listing_naming_array_and_dtype(written, tmp_path,
                                                                                            driver):
    read, refused = [], []
    for i, name in enumerate(_candidates()):
        ckpt = tmp_path / f"c{i}"
        want = _retype(written[driver], ckpt, driver, name)
        try:
            with cm.open(str(ckpt)) as r:
                info = r.info("params/w")
                got = r.get("params/w")
        except CheckpointFormatError as e:
            assert "params.w" in str(e) and name in str(e), (name, str(e))
            refused.append(name)
            continue
        assert want is not None, name
        assert got.shape == SHAPE and info.dtype == got.dtype.name, name
        assert got.dtype == want.dtype.newbyteorder("=") and got.tobytes() == want.astype(got.dtype).tobytes(), name
        read.append(name)
    # what TensorStore decodes is read, the rest refused: both sides are non-trivial
    assert {"float16", "bfloat16", "int4", "float8_e4m3fn"} <= {np.dtype(_numpy_dtype(n)).name for n in read}
    assert {"<f16", "<c32", "=f4", "uint4"} <= set(refused) if driver == "zarr" else {"<f4", "float128"} <= set(refused)


@pytest.mark.parametrize("driver,name", [("zarr", "<f16"), ("zarr", "<c32"), ("zarr3", "complex256"),
                                         ("zarr", "float8_e4m3")])
def test_cli_show_and_ls_of_an_unreadable_dtype_exit_2_naming_it_without_a_traceback(written, tmp_path, driver,
                                                                                    name):
    ckpt = tmp_path / "ckpt"
    _retype(written[driver], ckpt, driver, name)
    env = dict(os.environ, PYTHONPATH=str(REPO), TF_CPP_MIN_LOG_LEVEL="3")
    for args in (["show", str(ckpt), "params/w"], ["ls", str(ckpt)]):
        res = subprocess.run([sys.executable, "-m", "ckptmerge", *args], capture_output=True, text=True, timeout=60,
                             env=env)
        assert res.returncode == 2 and "Traceback" not in res.stderr, (args, res.stderr)
        assert "'params.w'" in res.stderr and f"'{name}'" in res.stderr and "Cast the array" in res.stderr, res.stderr
