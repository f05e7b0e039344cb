"""How a combination's chunks are made from its inputs' chunks or ranges, in bounded memory.

:class:`FixedChunks` regroups a reader's pieces into chunks of one size (one chunk of each input
must cover the same elements). :func:`blocked_chunks` makes the chunks of an elementwise method
from element ranges of local files (:class:`~ckptmerge.formats.ranges.TensorRanges`): a block of
every input at a time, read straight into a small buffer, checksummed, added and cast while it is
in the CPU cache, by the calling thread and a worker thread sharing each chunk's pieces.
"""

from __future__ import annotations

import itertools
import threading
from concurrent.futures import Future, wait
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple

import numpy as np

from ..formats.base import aligned_empty
from ..formats.ranges import TensorRanges
from ..planning.casts import cast_array, numpy_dtype
from .methods import Method, TensorParams, quiet

__all__ = ["BlockedChunks", "FixedChunks", "Pieces", "aligned_step", "blocked_chunks", "BLOCK", "TASK"]

#: Elements of each input read and added at once: the block, its float64 accumulator and the
#: output block fit in a core's L2 cache (512 KiB here).
BLOCK = 1 << 15
#: Elements of the pieces of a chunk the threads share out.
TASK = 1 << 17
_PLAIN = (np.dtype(np.float16), np.dtype(np.float32), np.dtype(np.float64))  # numpy's casts round as TF's


def _largest_divisor(n: int, most: int) -> int:
    """The largest divisor of ``n`` that is at most ``most`` (``n``, ``most`` >= 1)."""
    best, d = 1, 1
    while d * d <= n:
        if n % d == 0:
            for c in (d, n // d):
                if best < c <= most:
                    best = c
        d += 1
    return best


def aligned_step(shape: Tuple[int, ...], step: int) -> int:
    """Elements per chunk (at most ``step``) of a tensor of ``shape`` at which every reader's
    pieces fall on the chunks' bounds, so that :class:`FixedChunks` never keeps a rest.

    Readers cut a tensor either flat (pieces of exactly ``max_elements``: TF bundles' single
    entries, safetensors, NumPy files) or in runs of whole rows (HDF5 hyperslabs, partitioned
    TF variables: :func:`~ckptmerge.formats.tf.regions.c_order_blocks`, whose runs are shorter
    at the end of each row of the leading dimensions). Asked for this many elements, both cut
    at the same places: runs of whole rows that divide the dimension they run along. With a
    step of ``step`` a rest of up to a piece stays with every input between chunks (memory that
    grows with the number of inputs); ``step`` itself is returned where no such run is at least
    an eighth of it (a dimension with no divisor near the run: rare).

    Example:
        >>> aligned_step((3000, 1000), 1 << 16), aligned_step((4, 3000, 1000), 1 << 20)
        (65000, 1000000)
    """
    size = 1
    for d in shape:
        size *= d
    if size <= step:
        return step
    trailing, k = 1, len(shape)
    while k > 0 and trailing * shape[k - 1] <= step:
        k -= 1
        trailing *= shape[k]
    rows = step // trailing
    if k > 1:  # runs restart at each index of the leading dimensions: they must divide the row
        rows = _largest_divisor(shape[k - 1], rows)
    return rows * trailing if rows * trailing * 8 >= step else step


class FixedChunks:
    """Pieces of a stream regrouped into chunks of exactly ``step`` elements (the last one
    shorter): readers cut tensors where their files make it cheap (whole rows, hyperslabs), and
    one chunk of each input must cover the same elements. Keeps at most the rest of one piece.

    Example:
        >>> [c.tolist() for c in FixedChunks(iter([np.arange(3), np.arange(3, 5)]), 2)]
        [[0, 1], [2, 3], [4]]
    """

    def __init__(self, pieces: Iterator[np.ndarray], step: int) -> None:
        self.pieces = pieces
        self.step = step
        self.rest: Optional[np.ndarray] = None

    def __iter__(self) -> "FixedChunks":
        return self

    def __next__(self) -> np.ndarray:
        step, rest = self.step, self.rest
        self.rest = None
        if rest is None:
            rest = next(self.pieces)
        if rest.size >= step:
            if rest.size > step:
                self.rest = rest[step:]
            return rest[:step]
        parts, have = [rest], rest.size
        for x in self.pieces:
            need = step - have
            if x.size > need:
                parts.append(x[:need])
                self.rest = x[need:]
                have = step
            else:
                parts.append(x)
                have += x.size
            if have >= step:
                break
        return np.concatenate(parts) if len(parts) > 1 else parts[0]

    def close(self) -> None:
        self.rest = None
        close = getattr(self.pieces, "close", None)
        if close is not None:
            close()


class Pieces:
    """The pieces of one output chunk, claimed in turn by whichever thread is free: the worker
    thread given :meth:`run`, and the caller in :meth:`finish`, which then waits for the
    pieces still being made and raises the first error."""

    def __init__(self, out: np.ndarray, pieces: List[Tuple[int, int, int]], make: Callable[..., None]) -> None:
        self.out = out
        self.pieces = pieces
        self.make = make
        self.claim = itertools.count()  # (next() is atomic: each piece is made once)
        self.helper: Optional[Future] = None
        self.stop = False

    def run(self) -> None:
        with quiet():  # (NaN and Inf inputs are kept, without NumPy's warnings)
            for i in self.claim:
                if i >= len(self.pieces) or self.stop:
                    return
                self.make(self.out, *self.pieces[i])

    def finish(self) -> np.ndarray:
        try:
            self.run()
        except BaseException:
            self.abandon()
            raise
        if self.helper is not None:
            self.helper.result()
        return self.out

    def abandon(self) -> None:
        """Make no more pieces; return once the worker has left off (no read is in flight)."""
        self.stop = True
        if self.helper is not None and not self.helper.cancel():
            wait([self.helper])


class BlockedChunks:
    """The output chunks of one tensor made by :func:`blocked_chunks`, as an object whose first
    chunk may be started (:meth:`begin`) before it is iterated: a combination starts the next
    tensor a merge will ask for while the merge writes this one's last chunk.

    ``on_last()``, when given, is called once the last chunk is made, before it is handed out
    (so a worker makes the next tensor while the caller writes this chunk, and no more threads
    than the caller and one worker are busy). :meth:`abandon` stops the work of a stream never
    iterated to its end.
    """

    def __init__(self, m: Method, p: TensorParams, stats: Any, ranges: List[TensorRanges],
                 base: Optional[TensorRanges], size: int, step: int, out_name: str,
                 submit: Callable[..., Future], on_last: Optional[Callable[[], None]] = None) -> None:
        self.size, self.step, self.submit, self.on_last = size, step, submit, on_last
        self.out_dt = numpy_dtype(out_name)
        self.ahead: List[Pieces] = []
        plain = self.out_dt in _PLAIN  # else cast_array rounds (bfloat16 and others through float32, as TF)
        scratch = threading.local()

        def buffers() -> Tuple[List[Tuple[np.ndarray, memoryview, int]], Optional[np.ndarray]]:
            got = getattr(scratch, "bufs", None)
            if got is None:  # this thread's: a block of each input dtype (and its bytes), and of the base
                by_dtype: Dict[np.dtype, Tuple[np.ndarray, memoryview, int]] = {}
                for r in ranges:
                    if r.dtype not in by_dtype:
                        buf = aligned_empty(BLOCK, r.dtype)
                        by_dtype[r.dtype] = (buf, memoryview(buf.view(np.uint8)), r.dtype.itemsize)
                got = scratch.bufs = ([by_dtype[r.dtype] for r in ranges],
                                      aligned_empty(BLOCK, base.dtype) if base is not None else None)
            return got

        def piece(out: np.ndarray, first: int, lo: int, hi: int) -> None:
            xs, bbuf = buffers()
            spans = [(r.span(lo, hi), *x) for r, x in zip(ranges, xs)]
            bspan = base.span(lo, hi) if base is not None else None
            for s in range(lo, hi, BLOCK):
                k = min(BLOCK, hi - s)
                b = bspan.read(bbuf[:k]) if bspan is not None and bbuf is not None else None
                acc = m.start(p, k)
                for j, (span, buf, raw, itemsize) in enumerate(spans):
                    m.add(acc, p, stats, j, span.read(buf[:k], raw[:k * itemsize]), b, s)
                if plain:
                    m.finish_into(acc, p, stats, b, out[s - first:s - first + k])
                else:
                    out[s - first:s - first + k] = cast_array(m.finish(acc, p, stats, b), out_name)

        self.piece = piece

    def _start(self, first: int) -> Pieces:
        n = min(self.step, self.size - first)
        work = Pieces(aligned_empty(n, self.out_dt),
                      [(first, lo, min(lo + TASK, first + n)) for lo in range(first, first + n, TASK)], self.piece)
        work.helper = self.submit(work.run)
        return work

    def begin(self) -> "BlockedChunks":
        """Start making the first chunk (on a worker; once)."""
        if not self.ahead and self.size:
            self.ahead.append(self._start(0))
        return self

    def __iter__(self) -> Iterator[np.ndarray]:
        ahead, size, step = self.ahead, self.size, self.step
        self.begin()
        try:
            for first in range(0, size, step):
                work = ahead.pop()
                last = first + step >= size
                if not last:
                    ahead.append(self._start(first + step))
                out = work.finish()
                if last and self.on_last is not None:
                    self.on_last()
                yield out
        finally:  # (closed early or failed: no piece is left running on the files)
            self.abandon()

    def abandon(self) -> None:
        """Make no more pieces; return once no read of this tensor is in flight."""
        while self.ahead:
            self.ahead.pop().abandon()


def blocked_chunks(m: Method, p: TensorParams, stats: Any, ranges: List[TensorRanges], base: Optional[TensorRanges],
                   size: int, step: int, out_name: str, submit: Callable[..., Future]) -> Iterator[np.ndarray]:
    """The output chunks (``step`` elements, the last one shorter) of the elementwise method
    ``m`` over ``ranges`` (one per input, in order; ``base`` the base's), cast to ``out_name``.

    Each chunk is made in pieces of :data:`TASK` elements that the calling thread and a worker
    (``submit(fn)`` runs ``fn`` on one) claim in turn: the worker starts on the next chunk while
    the caller uses this one, and the caller never waits for a thread to be scheduled while a
    piece is left. A piece is made a :data:`BLOCK` at a time: that block of every input read,
    checksummed and added in input order, then finished and cast, so the reads, the accumulator
    and the output stay in the CPU cache (and each element's sum is the same whichever thread
    makes it). The last chunk is given only once every input's checksum matched.

    Example:
        >>> from concurrent.futures import ThreadPoolExecutor
        >>> from ckptmerge.combining.methods import METHODS
        >>> def ranges(values):
        ...     raw = np.asarray(values, np.float32).tobytes()
        ...     def fill(offset, view):
        ...         view[:] = raw[offset:offset + len(view)]
        ...     return TensorRanges(np.dtype(np.float32), len(values), fill)
        >>> mean, p = METHODS["mean"], TensorParams("x", (1.0, 1.0))
        >>> with ThreadPoolExecutor(1) as pool:
        ...     chunks = blocked_chunks(mean, p, mean.prepare(p, 3, [], None), [ranges([1, 2, 3]), ranges([3, 4, 6])],
        ...                             None, 3, 2, "float32", pool.submit)
        ...     [c.tolist() for c in chunks]
        [[2.0, 3.0], [4.5]]
    """
    return iter(BlockedChunks(m, p, stats, ranges, base, size, step, out_name, submit))
