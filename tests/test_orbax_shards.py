"""Arrays whose stored chunks do not divide them (issue 36 item 3): the edge chunks of a zarr array
are stored padded to the full chunk shape, as Orbax stores the shards of an array whose shape its
mesh does not divide, and the global array reads whole and bit-exact, by ``get``, by
``read_many`` and one chunk row at a time by ``iter_chunks``.

Each case is an Orbax item written by orbax-checkpoint in the test, whose array is then written
again by TensorStore (the library Orbax writes with) with a generated shape and chunk shape; the
shapes, chunk shapes and seeds vary per case. (Arrays sharded over a 2x4 mesh of 8 devices, rows,
columns, replicated and bfloat16, OCDBT on and off, are in the release matrix: test_orbax_matrix.)
"""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

ts = pytest.importorskip("tensorstore", reason="the Orbax reader needs tensorstore (pip install 'ckptmerge[orbax]')")
pytest.importorskip("orbax.checkpoint", reason="the Orbax tests write checkpoints with orbax-checkpoint")

from _orbax_util import refuse_jax_from_ckptmerge, write_orbax  # noqa: E402,F401

import ckptmerge as cm  # noqa: E402


def _cases():
    rng = np.random.default_rng(36)
    out = []
    for i in range(6):
        ndim = 1 + i % 3
        shape = tuple(int(d) for d in rng.integers(3, 12, size=ndim))
        chunks = tuple(int(max(1, d - int(rng.integers(1, d)))) for d in shape)  # never a divisor of all
        if all(d % c == 0 for d, c in zip(shape, chunks)):
            chunks = (chunks[0] + 1,) + chunks[1:] if chunks[0] + 1 < shape[0] else chunks
        out.append((i, shape, chunks))
    return out


def _rewrite(folder, param, layout, values, chunks):
    """Write ``values`` as array ``param`` of the item ``folder`` with TensorStore, in ``layout``."""
    if layout.startswith("ocdbt"):
        for name in ("manifest.ocdbt", "d", "ocdbt.process_0"):
            p = folder / name
            shutil.rmtree(p) if p.is_dir() else p.unlink(missing_ok=True)
        kv = {"driver": "ocdbt", "base": {"driver": "file", "path": str(folder) + "/"}, "path": param + "/"}
    else:
        shutil.rmtree(folder / param)
        kv = {"driver": "file", "path": str(folder / param) + "/"}
    if layout.endswith("zarr3"):
        meta = {"shape": list(values.shape), "data_type": str(values.dtype),
                "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": list(chunks)}},
                "codecs": [{"name": "bytes", "configuration": {"endian": "little"}},
                           {"name": "zstd", "configuration": {"level": 1, "checksum": False}}]}
        spec = {"driver": "zarr3", "kvstore": kv, "metadata": meta}
    else:
        meta = {"shape": list(values.shape), "chunks": list(chunks), "dtype": values.dtype.str,
                "compressor": {"id": "zstd", "level": 1}}
        spec = {"driver": "zarr", "kvstore": kv, "metadata": meta}
    spec["store_data_equal_to_fill_value"] = True  # (as Orbax writes: _METADATA says every chunk is there)
    store = ts.open(spec, create=True, delete_existing=True).result()
    store.write(values).result()


@pytest.mark.parametrize("layout", ["zarr", "zarr3", "ocdbt+zarr", "ocdbt+zarr3"])
def test_arrays_whose_chunks_do_not_divide_them_read_whole_and_by_chunk_rows_bit_exact(tmp_path, layout):
    for i, shape, chunks in _cases():
        rng = np.random.default_rng(i)
        values = {"w": rng.standard_normal(shape).astype(np.float32),
                  "n": rng.integers(-9, 9, size=shape).astype(np.int16)}
        folder = write_orbax(tmp_path / f"c{i}", {k: np.zeros(shape, v.dtype) for k, v in values.items()},
                             "ocdbt+zarr" if layout.startswith("ocdbt") and not layout.endswith("3") else
                             layout if layout != "ocdbt+zarr3" else "zarr3")
        if layout == "ocdbt+zarr3":  # (an OCDBT item of zarr3 arrays: V0 handler flags)
            meta = json.loads((folder / "_METADATA").read_text())
            meta.update(use_ocdbt=True, use_zarr3=True)
            (folder / "_METADATA").write_text(json.dumps(meta))
        if layout.startswith("ocdbt"):
            # every array goes into one new database: write them all after clearing the old one
            _rewrite(folder, "w", layout, values["w"], chunks)
            kv = {"driver": "ocdbt", "base": {"driver": "file", "path": str(folder) + "/"}, "path": "n/"}
            driver = "zarr3" if layout.endswith("zarr3") else "zarr"
            meta = ({"shape": list(shape), "data_type": "int16",
                     "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": list(chunks)}},
                     "codecs": [{"name": "bytes", "configuration": {"endian": "little"}}]}
                    if driver == "zarr3" else
                    {"shape": list(shape), "chunks": list(chunks), "dtype": "<i2", "compressor": None})
            ts.open({"driver": driver, "kvstore": kv, "metadata": meta, "store_data_equal_to_fill_value": True},
                    create=True).result().write(
                values["n"]).result()
        else:
            for param, v in values.items():
                _rewrite(folder, param, layout, v, chunks)
        with cm.open(str(folder)) as r:
            got = r.read_many(["w", "n"])
            for name, want in values.items():
                assert got[name].dtype == want.dtype and got[name].tobytes() == want.tobytes(), (layout, shape, chunks)
                assert r.get(name).tobytes() == want.tobytes()
                row = int(np.prod(shape[1:]))
                pieces = list(r.iter_chunks(name, max_elements=max(1, row)))
                assert np.concatenate(pieces).tobytes() == want.reshape(-1).tobytes(), (layout, shape, chunks)
