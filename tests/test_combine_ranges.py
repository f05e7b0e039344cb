"""Element ranges (ckptmerge.formats.ranges) and the combination path that reads them: blocks
of every input read straight into small buffers, checksummed, added and cast while in the CPU
cache, by two threads. Its results must equal the chunk-streaming path (and NumPy) bit for bit,
its checksum and truncation errors must be those of the reader, and nothing may run on the
files after the caller stops."""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Optional

import numpy as np
import pytest

import ckptmerge as cm
import ckptmerge.combining.blocks as blocks
from ckptmerge.core.errors import CheckpointFormatError
from ckptmerge.formats import open_checkpoint
from ckptmerge.formats.ranges import TensorRanges
from ckptmerge.formats.tf.table import crc32c
from ckptmerge.formats.tf.writer import BundleWriter
from ckptmerge.combining.combine import CombinedHandle
from ckptmerge.combining.methods import combine_arrays

from _reader_util import write_partitioned_bundle

SHAPES = {"a/kernel": (97, 103), "a/bias": (103,), "h/half": (41, 29), "one": (1,)}


def values(k: int) -> dict:
    rng = np.random.default_rng(k)
    out = {n: rng.standard_normal(s).astype(np.float32) for n, s in SHAPES.items()}
    out["h/half"] = out["h/half"].astype(np.float16)
    out["step"] = np.array(k, np.int64)
    out["name"] = np.array([b"x", b"yz"], dtype=object)
    return out


def write(prefix: Path, vals: dict) -> str:
    with BundleWriter(str(prefix)) as w:
        for k, v in vals.items():
            w.add(k, v)
    return str(prefix)


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    d = tmp_path_factory.mktemp("ranges")
    return [write(d / f"ckpt-{k}", values(k)) for k in range(4)]


@pytest.fixture
def small_blocks(monkeypatch):
    """Blocks and pieces far smaller than the tensors, of sizes that divide nothing."""
    monkeypatch.setattr(blocks, "BLOCK", 7)
    monkeypatch.setattr(blocks, "TASK", 29)


def read_all(src, names, *, streamed=False, monkeypatch=None):
    h = src.open()
    try:
        if streamed:
            assert monkeypatch is not None
            monkeypatch.setattr(type(h), "_ranges", lambda self, e: None)
        return h.read(names)
    finally:
        if streamed:
            monkeypatch.undo()
        h.close()


def test_ranges_read_any_order_from_any_thread_and_check_the_crc_once_complete(run):
    with open_checkpoint(run[0]) as r:
        got = r.ranges("a/kernel")
        want = values(0)["a/kernel"].reshape(-1)
        assert got.dtype == np.float32 and got.count == want.size
        out = np.empty(want.size, np.float32)
        bounds = list(range(0, want.size, 1000)) + [want.size]
        spans = [(lo, hi) for lo, hi in zip(bounds, bounds[1:])][::-1]  # the last first

        def read(lo, hi):
            span = got.span(lo, hi)
            for s in range(lo, hi, 333):
                span.read(out[s:min(s + 333, hi)])

        threads = [threading.Thread(target=read, args=sp) for sp in spans]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        np.testing.assert_array_equal(out, want)
        assert got._covered == want.nbytes  # every byte folded into the checksum, which matched
        assert r.ranges("name") is None  # strings stream as before
        with pytest.raises(ValueError, match="outside"):
            got.span(0, want.size + 1)
        with pytest.raises(ValueError, match="does not fit"):
            got.span(0, 2).read(np.empty(3, np.float32))


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_crc_combine_equals_the_crc_of_the_concatenation(seed):
    # the fold of the spans' CRCs (crc32c_combine) over lengths with one, many and no set bits
    from ckptmerge.formats.tf.crc import crc32c_combine

    rng = np.random.default_rng(seed)
    for n in (0, 1, 7, 64, 4096, 1 << 16, (1 << 16) + 3, int(rng.integers(1, 200_000))):
        a = rng.integers(0, 256, int(rng.integers(0, 5000)), dtype=np.uint8).tobytes()
        b = rng.integers(0, 256, n, dtype=np.uint8).tobytes()
        assert crc32c_combine(crc32c(a), crc32c(b), len(b)) == crc32c(a + b), (len(a), n)


def test_a_checksum_mismatch_raises_the_readers_error():
    data = np.arange(10, dtype="<f4").tobytes()

    def fill(offset, view):
        view[:] = data[offset:offset + len(view)]

    r = TensorRanges(np.dtype("<f4"), 10, fill, crc32c(data) ^ 1, lambda actual: CheckpointFormatError(f"bad {actual}"))
    r.span(5, 10).read(np.empty(5, "<f4"))  # (not complete yet: nothing to check)
    with pytest.raises(CheckpointFormatError, match=f"bad {crc32c(data)}"):
        r.span(0, 5).read(np.empty(5, "<f4"))


@pytest.mark.parametrize("method, opts", [
    ("mean", {}),
    ("mean", {"weights": [1, 2, 3]}),
    ("ema", {"decay": 0.7}),
    ("task_arithmetic", {"weights": [0.5, 0.3, 0.2], "scale": 0.8}),
    ("dare", {"density": 0.4, "seed": 3}),
    ("ties", {"density": 0.4}),
    ("ties", {"density": 0.3, "weights": [1, 0.5, 2]}),
    ("model_stock", {}),
])
def test_blocks_equal_the_streamed_chunks_and_numpy(run, small_blocks, monkeypatch, method, opts):
    base = run[0] if method in ("task_arithmetic", "dare", "ties", "model_stock") else None
    fts = run[1:]
    src = cm.combine(fts, method, base=base, chunk_elements=500, **opts)
    names = ["a/kernel", "a/bias", "h/half", "one", "step"]
    h = src.open()
    try:  # (the combination reads ranges of the files, the integer is copied by streaming)
        assert h._ranges(h.entries["a/kernel"]) is not None and h.entries["step"].params is None
    finally:
        h.close()
    got = read_all(src, names)
    streamed = read_all(src, names, streamed=True, monkeypatch=monkeypatch)
    for n in names:
        np.testing.assert_array_equal(got[n], streamed[n], err_msg=n)
        assert got[n].dtype == streamed[n].dtype
    if method in ("mean", "task_arithmetic", "dare"):
        ref_opts = {k: v for k, v in opts.items()}
        ref = combine_arrays(method, [values(k)["a/kernel"] for k in (1, 2, 3)],
                             values(0)["a/kernel"] if base else None, name="a/kernel", **ref_opts)
        np.testing.assert_array_equal(got["a/kernel"], ref.astype(np.float32))


def test_ties_keeps_the_first_tied_magnitudes_in_any_block_and_chunk(tmp_path, small_blocks, monkeypatch):
    """Many deltas of equal magnitude at the trim cut: the first ones in element order are kept,
    by the blocks of two threads as by the chunk stream and the whole-array units."""
    rng = np.random.default_rng(3)
    base = np.round(rng.standard_normal(3001) * 2).astype(np.float32) / 4
    xs = [base + np.round(rng.standard_normal(3001) * 2).astype(np.float32) / 4 for _ in range(3)]
    xs[1][:900] = base[:900]  # zero deltas too
    paths = [write(tmp_path / f"t{i}", {"w": x}) for i, x in enumerate([base] + xs)]
    for density in (0.2, 0.5, 0.7):
        src = cm.combine(paths[1:], "ties", base=paths[0], density=density, chunk_elements=1000)
        got = read_all(src, ["w"])["w"]
        streamed = read_all(src, ["w"], streamed=True, monkeypatch=monkeypatch)["w"]
        whole = combine_arrays("ties", xs, base, density=density).astype(np.float32)
        np.testing.assert_array_equal(got, streamed)
        np.testing.assert_array_equal(got, whole)


def test_mixed_input_dtypes_and_a_bfloat16_output(tmp_path, small_blocks, monkeypatch):
    a = write(tmp_path / "a", {"w": np.linspace(-3, 3, 1001, dtype=np.float32)})
    b = write(tmp_path / "b", {"w": np.linspace(1, 2, 1001).astype(np.float16)})
    for dtype in (None, "bfloat16", "float64"):
        src = cm.combine([a, b], keys="union", dtype=dtype)
        got = read_all(src, ["w"])["w"]
        streamed = read_all(src, ["w"], streamed=True, monkeypatch=monkeypatch)["w"]
        assert got.dtype == streamed.dtype
        np.testing.assert_array_equal(got.astype(np.float64), streamed.astype(np.float64))


def test_safetensors_inputs_take_the_same_path(tmp_path, small_blocks, monkeypatch):
    from safetensors.numpy import save_file

    paths = []
    for k in range(3):
        p = str(tmp_path / f"m{k}.safetensors")
        save_file({"w": np.random.default_rng(k).standard_normal((50, 31)).astype(np.float32)}, p)
        paths.append(p)
    with open_checkpoint(paths[0]) as r:
        assert r.ranges("w") is not None
    src = cm.combine(paths)
    got = read_all(src, ["w"])["w"]
    np.testing.assert_array_equal(got, read_all(src, ["w"], streamed=True, monkeypatch=monkeypatch)["w"])


def write_h5(path: Path, values: dict, **options) -> str:
    import h5py

    with h5py.File(path, "w") as f:
        for k, v in values.items():
            f.create_dataset(k, data=v, **options)
    return str(path)


def test_weights_h5_inputs_take_the_same_path(tmp_path, small_blocks, monkeypatch):
    import ml_dtypes

    def vals(k):
        rng = np.random.default_rng(k)
        return {"layers/d/vars/0": rng.standard_normal((50, 31)).astype(np.float32),
                "layers/d/vars/1": rng.standard_normal(31).astype(np.float16)}

    paths = [write_h5(tmp_path / f"m{k}.weights.h5", vals(k)) for k in range(3)]
    with open_checkpoint(paths[0]) as r:
        assert all(r.ranges(n) is not None for n in r.names())
    src = cm.combine(paths, chunk_elements=300)
    names = ["layers/d/vars/0", "layers/d/vars/1"]
    got = read_all(src, names)
    streamed = read_all(src, names, streamed=True, monkeypatch=monkeypatch)
    for n in names:
        np.testing.assert_array_equal(got[n], streamed[n])
        assert got[n].dtype == streamed[n].dtype
    ref = np.mean([vals(k)["layers/d/vars/0"].astype(np.float64) for k in range(3)], axis=0)
    np.testing.assert_array_equal(got["layers/d/vars/0"], ref.astype(np.float32))
    # bfloat16 as Keras stores it (2-byte opaque values named by a 'dtype' attribute)
    import h5py

    bf = [tmp_path / f"bf{k}.weights.h5" for k in range(2)]
    for k, path in enumerate(bf):
        with h5py.File(path, "w") as f:
            ds = f.create_dataset("w", data=np.linspace(k, k + 1, 77).astype(ml_dtypes.bfloat16).view(np.dtype("V2")))
            ds.attrs["dtype"] = "bfloat16"
    src = cm.combine([str(p) for p in bf])
    with open_checkpoint(str(bf[0])) as r:
        assert r.ranges("w") is not None
    np.testing.assert_array_equal(read_all(src, ["w"])["w"].astype(np.float32),
                                  read_all(src, ["w"], streamed=True, monkeypatch=monkeypatch)["w"].astype(np.float32))


def test_chunked_or_compressed_h5_datasets_fall_back_to_streaming(tmp_path):
    w = np.arange(600, dtype=np.float32).reshape(20, 30)
    chunked = write_h5(tmp_path / "c.weights.h5", {"w": w}, chunks=(5, 30))
    packed = write_h5(tmp_path / "z.weights.h5", {"w": w + 2}, compression="gzip")
    plain = write_h5(tmp_path / "p.weights.h5", {"w": w + 4})
    for path in (chunked, packed):
        with open_checkpoint(path) as r:
            assert r.ranges("w") is None
    got = read_all(cm.combine([chunked, packed, plain]), ["w"])["w"]
    np.testing.assert_array_equal(got, w + np.float32(2))


def test_an_h5_file_truncated_after_opening_raises_a_clear_error(tmp_path):
    w = np.arange(300_000, dtype=np.float32)
    a = write_h5(tmp_path / "a.weights.h5", {"w": w})
    b = write_h5(tmp_path / "b.weights.h5", {"w": w})
    h = cm.combine([a, b]).open()
    try:
        os.truncate(b, 4096)
        with pytest.raises(CheckpointFormatError, match="ended early") as e:
            h.read(["w"])
        assert "b.weights.h5" in str(e.value)
    finally:
        h.close()


def test_partitioned_inputs_fall_back_to_streaming(tmp_path, monkeypatch):
    whole = np.arange(12, dtype=np.float32).reshape(4, 3)
    p = write_partitioned_bundle(str(tmp_path / "p"), "v", (4, 3), [(((0, 2), (0, -1)), whole[:2]),
                                                                    (((2, 2), (0, -1)), whole[2:])])
    q = write(tmp_path / "q", {"v": whole + 1})
    with open_checkpoint(p) as r:
        assert r.ranges("v") is None
    got = read_all(cm.combine([p, q]), ["v"])["v"]
    np.testing.assert_array_equal(got, whole + np.float32(0.5))


def corrupt_copy(src: str, dst: Path, at: Optional[int]) -> str:
    """A copy of checkpoint ``src`` as ``dst``, the data byte ``at`` flipped (``None``: none)."""
    for f in Path(src).parent.glob(Path(src).name + ".*"):
        data = bytearray(f.read_bytes())
        if ".data-" in f.name and at is not None:
            data[at] ^= 0xFF
        (dst.parent / (dst.name + f.name[len(Path(src).name):])).write_bytes(bytes(data))
    return str(dst)


def test_a_corrupt_input_fails_before_the_last_chunk_is_given(run, tmp_path, small_blocks):
    bad = corrupt_copy(run[1], tmp_path / "bad", 8)
    src = cm.combine([run[0], bad])
    h = src.open()
    try:
        names = [e for e in h.entries if h.entries[e].params is not None]
        failed = []
        for name in names:
            size = h.entries[name].spec.size
            got = 0
            try:
                for chunk in h.iter_chunks(name):
                    got += chunk.size
            except CheckpointFormatError as e:
                assert "checksum mismatch" in str(e) and "bad" in str(e)
                assert got < size
                failed.append(name)
        assert len(failed) == 1
    finally:
        h.close()
    with open_checkpoint(bad, verify=False) as r:
        assert r.ranges(failed[0]).expected is None  # verify=False: nothing checked


def test_a_file_truncated_after_opening_raises_a_clear_error(run, tmp_path):
    copy = corrupt_copy(run[2], tmp_path / "short", None)
    src = cm.combine([run[0], copy])
    h = src.open()
    try:
        data = next(tmp_path.glob("short.data-*"))
        os.truncate(data, 100)
        with pytest.raises(CheckpointFormatError, match="ended early|truncated"):
            for name in h.entries:
                for _ in h.iter_chunks(name):
                    pass
    finally:
        h.close()


def test_closing_early_leaves_nothing_running_on_the_files(run, small_blocks):
    src = cm.combine(run, chunk_elements=100)
    h = src.open()
    try:
        it = h.iter_chunks("a/kernel")
        first = next(it)
        assert first.size == 100
        it.close()
        pool = h._pool
        assert pool is not None
    finally:
        h.close()
    assert h._pool is None  # (close joined the worker: none of its reads outlives the handle)


@pytest.mark.parametrize("method, opts", [
    ("mean", {}),
    ("mean", {"weights": [1, 2, 3]}),
    ("ema", {"decay": 0.7}),
    ("task_arithmetic", {"weights": [0.5, 0.3, 0.2], "scale": 0.8}),
])
def test_a_merge_starts_the_next_tensor_early_and_writes_the_same_values(run, tmp_path, small_blocks, monkeypatch,
                                                                         method, opts):
    base = run[0] if method == "task_arithmetic" else None
    src = cm.combine(run[1:], method, base=base, chunk_elements=500, **opts)
    started = []
    real = CombinedHandle._start_after

    def spy(self, name):
        real(self, name)
        if self._ahead is not None:
            started.append(self._ahead[0])

    monkeypatch.setattr(CombinedHandle, "_start_after", spy)
    cm.merge(src, str(tmp_path / "merged"))
    monkeypatch.undo()
    names = ["a/bias", "a/kernel", "h/half", "one"]
    # the merge's order is by name: a/bias, a/kernel, h/half, name, one, step; each combined tensor
    # starts the next one (the string 'name' is copied from an input, so 'one' starts when asked)
    assert started == ["a/kernel", "h/half"]
    copied = ["name", "step"]  # (the last input's string and integer, as they are)
    want = read_all(src, names + copied, streamed=True, monkeypatch=monkeypatch)
    got = cm.load(str(tmp_path / "merged"), names + copied)
    for n in names + copied:
        np.testing.assert_array_equal(got[n], want[n], err_msg=n)
        assert got[n].dtype == want[n].dtype
    assert got["name"].tolist() == [b"x", b"yz"] and int(got["step"]) == 3


def test_tensors_asked_in_another_order_than_announced_are_made_all_the_same(run, small_blocks):
    src = cm.combine(run, chunk_elements=500)
    names = ["a/kernel", "a/bias", "h/half", "one"]
    want = read_all(src, names)
    h = src.open()
    try:
        h.read_order(names)
        np.testing.assert_array_equal(np.concatenate(list(h.iter_chunks("a/kernel"))), want["a/kernel"].reshape(-1))
        assert h._ahead is not None and h._ahead[0] == "a/bias"  # started while a/kernel's last chunk was made
        got = np.concatenate(list(h.iter_chunks("h/half")))  # not the one started: that one is dropped
        np.testing.assert_array_equal(got, want["h/half"].reshape(-1))
        assert h._ahead is not None and h._ahead[0] == "one"
        np.testing.assert_array_equal(np.concatenate(list(h.iter_chunks("one"))), want["one"].reshape(-1))
        list(h.iter_chunks("a/kernel"))  # a/bias started again: closed while it may still be read
    finally:
        h.close()
    assert h._ahead is None and h._pool is None
