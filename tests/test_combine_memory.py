"""Combining N checkpoints holds memory for a few chunks whatever N, on the paths that stream
pieces rather than read ranges (issue 21, "Bounded and fast"): chunked and compressed HDF5
datasets, ``.keras`` archives (stored and deflated), partitioned TF variables and URLs.

Each case writes 8 small real inputs, combines the first 2 and then all 8 with a small chunk,
and compares the peak of Python-traced memory (NumPy's buffers are traced) while every chunk
is made. The tensor's rows (250 elements) do not divide the chunk (32768), so a reader cutting
in whole rows and a chunk of 32768 leave a rest of a piece with every input between chunks:
memory that grew by a piece per input before the chunks were aligned to the rows.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import tracemalloc
import zipfile
from pathlib import Path

import numpy as np
import pytest

import ckptmerge as cm
from ckptmerge.formats.tf.writer import BundleWriter

from _reader_util import write_partitioned_bundle

SHAPE = (1280, 250)
CHUNK = 1 << 15
N = 8
PIECE = CHUNK * 4  # bytes of one float32 piece a reader hands out
KINDS = ["h5 chunked", "h5 gzip", "keras stored", "keras deflated", "tf partitioned", "url"]


def value(k: int) -> np.ndarray:
    return np.random.default_rng(k).standard_normal(SHAPE, dtype=np.float32)


def write_h5(path: Path, v: np.ndarray, **opts) -> str:
    import h5py

    with h5py.File(path, "w") as f:
        f.create_group("layers/dense/vars").create_dataset("0", data=v, **opts)
    return str(path)


def write_keras(path: Path, v: np.ndarray, compression: int) -> str:
    weights = write_h5(path.with_suffix(".weights.h5"), v)
    with zipfile.ZipFile(path, "w", compression) as z:
        z.writestr("config.json", '{"class_name": "Sequential", "config": {"layers": []}}')
        z.writestr("metadata.json", '{"keras_version": "3.0.0"}')
        z.write(weights, "model.weights.h5")
    os.remove(weights)
    return str(path)


def write_inputs(d: Path, kind: str) -> list:
    d.mkdir()
    out = []
    for k in range(N):
        v = value(k)
        if kind == "h5 chunked":
            out.append(write_h5(d / f"m{k}.weights.h5", v, chunks=(40, 250)))
        elif kind == "h5 gzip":
            out.append(write_h5(d / f"m{k}.weights.h5", v, chunks=(200, 250), compression="gzip"))
        elif kind.startswith("keras"):
            out.append(write_keras(d / f"m{k}.keras", v,
                                   zipfile.ZIP_STORED if kind == "keras stored" else zipfile.ZIP_DEFLATED))
        elif kind == "tf partitioned":
            rows = [(0, 400), (400, 900), (900, 1280)]
            out.append(write_partitioned_bundle(str(d / f"ckpt-{k}"), "w", SHAPE,
                                                [(((a, b - a), (0, 250)), v[a:b]) for a, b in rows]))
        else:
            with BundleWriter(str(d / f"ckpt-{k}")) as w:
                w.add("w", v)
            out.append(str(d / f"ckpt-{k}"))
    return out


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """The URL inputs' files, served by a child process (so its requests are not traced here)."""
    d = tmp_path_factory.mktemp("served")
    write_inputs(d / "run", "url")
    code = textwrap.dedent(f"""
        import os, sys
        sys.path.insert(0, {str(Path(__file__).parent)!r})
        from _http_server import FileServer
        root = {str(d / "run")!r}
        s = FileServer({{"/" + f: open(os.path.join(root, f), "rb").read() for f in os.listdir(root)}})
        print(s.url, flush=True)
        sys.stdin.read()
        s.close()
    """)
    child = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        url = child.stdout.readline().strip()
        assert url.startswith("http://127.0.0.1:"), url
        yield [f"{url}/ckpt-{k}" for k in range(N)]
    finally:
        child.stdin.close()
        child.wait(timeout=30)


def peak_while_combining(inputs: list) -> tuple:
    """(peak traced bytes while the chunks after the first are made, the combined tensor)."""
    h = cm.combine(inputs, chunk_elements=CHUNK).open()
    try:
        (name,) = [v.name for v in h.all_variables]
        out = np.empty(int(np.prod(SHAPE)), np.float32)
        chunks = h.iter_chunks(name)
        first = next(chunks)  # (every input opened and read once: their fixed state is not counted)
        out[:first.size] = first
        pos = first.size
        tracemalloc.start()
        try:
            for c in chunks:
                out[pos:pos + c.size] = c
                pos += c.size
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        assert pos == out.size
        return peak, out.reshape(SHAPE)
    finally:
        h.close()


@pytest.mark.parametrize("kind", KINDS)
def test_memory_while_combining_does_not_grow_with_the_number_of_inputs(tmp_path, served, kind):
    inputs = served if kind == "url" else write_inputs(tmp_path / "run", kind)
    two, _ = peak_while_combining(inputs[:2])
    eight, got = peak_while_combining(inputs)
    want = np.mean([value(k).astype(np.float64) for k in range(N)], axis=0).astype(np.float32)
    np.testing.assert_array_equal(got, want)
    # A rest of a piece kept per input would add 6 pieces; a whole tensor per input, 7.3 MiB
    assert eight - two < 2 * PIECE, (kind, two, eight)
    assert eight < 16 * CHUNK * 8, (kind, eight)  # a few float64 chunks, whatever the inputs
