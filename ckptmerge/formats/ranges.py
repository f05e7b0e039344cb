"""Element ranges of one tensor read straight into the caller's buffers, checksum included.

A merge of many checkpoints (:mod:`ckptmerge.combining.combine`) reads one small block of each
input in turn and adds it at once, so that the block, the accumulator and the checksum work all
stay in the CPU cache; two threads do so for two halves of each chunk. :class:`TensorRanges` is
what a reader gives it for a tensor stored contiguously in a local file: each
:class:`Span` (a range of elements, read in order) fills buffers the caller owns with
``preadv`` (no intermediate ``bytes``), checksums the bytes just read when the format keeps a
CRC32C, and hands its checksum back when its last byte is read. The spans' checksums are folded
in file order as they complete (``crc32c_combine``), and the tensor's CRC32C is checked, in the
thread that completes the fold, once every byte has been read exactly once.

Readers that cannot read a tensor so (strings, partitioned variables, URLs, compressed files)
return ``None`` from ``ranges()``, and callers stream ``iter_chunks`` instead.
"""

from __future__ import annotations

import os
import threading
from typing import Callable, Dict, Optional, Tuple

import crc32c as _crc32c
import numpy as np

from ckptmerge.formats.tf.crc import crc32c_combine

__all__ = ["TensorRanges", "Span"]

Fill = Callable[[int, memoryview], None]  # (byte offset from the tensor's first byte, view) -> fill it
Locate = Callable[[], Tuple[int, int]]  # -> (file descriptor, file offset of the tensor's first byte)
_PREADV = getattr(os, "preadv", None)


class TensorRanges:
    """A tensor of ``count`` elements of ``dtype`` whose bytes ``fill(offset, view)`` reads,
    handed out as :class:`Span` objects that any thread may read (disjoint ones at once).

    Args:
        dtype: the elements' dtype (the buffers given to :meth:`Span.read` must have it).
        count: the number of elements.
        fill: reads the tensor's bytes from ``offset`` (counted from its first byte) into
            ``view``, raising the format's error on a short or failed read.
        crc32c: the tensor's expected (unmasked) CRC32C, or ``None`` when there is none to
            check (formats without one, or ``verify=False``).
        mismatch: ``mismatch(actual)`` is the error raised when the checksum differs.
        locate: for a tensor stored as it is in a local file, ``locate()`` gives ``(fd,
            offset)``: the open descriptor and the file offset of its first byte; spans then
            read with one ``preadv`` a block (``fill`` still reads whatever a short read left,
            and raises the format's error).

    Example:
        >>> data = np.arange(6, dtype="<f4").tobytes()
        >>> def fill(offset, view):
        ...     view[:] = data[offset:offset + len(view)]
        >>> ranges = TensorRanges(np.dtype("<f4"), 6, fill)
        >>> span, buf = ranges.span(2, 6), np.empty(2, "<f4")
        >>> span.read(buf).tolist(), span.read(buf).tolist()
        ([2.0, 3.0], [4.0, 5.0])
    """

    def __init__(self, dtype: np.dtype, count: int, fill: Fill, crc32c: Optional[int] = None,
                 mismatch: Optional[Callable[[int], Exception]] = None, locate: Optional[Locate] = None) -> None:
        self.dtype = np.dtype(dtype)
        self.count = count
        self.fill = fill
        self.locate = locate if _PREADV is not None else None
        self.expected = crc32c
        self.mismatch = mismatch
        self._lock = threading.Lock()
        self._done: Dict[int, Tuple[int, int]] = {}  # spans read ahead of the fold: start -> (end, crc)
        self._covered = 0  # bytes folded so far, from the first
        self._crc = 0

    def span(self, start: int, stop: int) -> "Span":
        """Elements ``start`` to ``stop`` (exclusive), to be read in order."""
        if not 0 <= start <= stop <= self.count:
            raise ValueError(f"span {start}:{stop} is outside the tensor's {self.count} elements")
        return Span(self, start * self.dtype.itemsize, stop * self.dtype.itemsize)

    def finished(self, start: int, end: int, crc: int) -> None:
        """Fold the checksum of bytes ``start:end`` (a span read to its end); once every byte
        has been folded, check the tensor's CRC32C.

        Raises:
            the ``mismatch`` error: the tensor's bytes do not match its checksum.
        """
        if self.expected is None:
            return
        with self._lock:
            self._done[start] = (end, crc)
            while self._covered in self._done:
                end, part = self._done.pop(self._covered)
                self._crc = part if self._covered == 0 else crc32c_combine(self._crc, part, end - self._covered)
                self._covered = end
            complete = self._covered == self.count * self.dtype.itemsize
            actual = self._crc
        if complete and actual != self.expected:
            raise (self.mismatch(actual) if self.mismatch is not None
                   else ValueError(f"checksum mismatch (expected 0x{self.expected:08x}, got 0x{actual:08x})"))


class Span:
    """A range of a :class:`TensorRanges`, read front to back by :meth:`read`."""

    __slots__ = ("ranges", "start", "pos", "end", "crc", "check", "fill", "fd", "at", "dtype")

    def __init__(self, ranges: TensorRanges, start: int, end: int) -> None:
        self.ranges = ranges
        self.start = self.pos = start
        self.end = end
        self.crc = 0
        self.check = ranges.expected is not None
        self.fill = ranges.fill
        self.dtype = ranges.dtype
        self.fd, self.at = -1, 0
        if ranges.locate is not None:
            try:
                fd, at = ranges.locate()
            except OSError:  # (the reader's fill reports it, as its format does)
                fd, at = -1, 0
            if isinstance(fd, int):
                self.fd, self.at = fd, at

    def read(self, out: np.ndarray, raw: Optional[memoryview] = None) -> np.ndarray:
        """Fill ``out`` (flat, contiguous, of the tensor's dtype) with the span's next
        ``out.size`` elements and return it; the read that reaches the span's end folds its
        checksum (and may raise the tensor's checksum error). ``raw``, when given, is ``out``'s
        bytes as a memoryview (callers reading many blocks make it once per buffer and slice it).
        """
        view = memoryview(out.view(np.uint8)) if raw is None else raw
        pos, n = self.pos, len(view)
        if pos + n > self.end or out.dtype != self.dtype or n != out.nbytes:
            raise ValueError(f"a read of {out.size} {out.dtype} elements does not fit the span's "
                             f"{(self.end - pos) // self.dtype.itemsize} {self.dtype} elements left")
        if self.fd < 0:
            self.fill(pos, view)
        else:  # one system call; a short or failed read is read again by the reader's fill (its error)
            try:
                got = _PREADV(self.fd, [view], self.at + pos)  # type: ignore[misc]
            except OSError:
                got = -1
            if got != n:
                self.fill(pos, view)
        if self.check:
            self.crc = _crc32c.crc32c(view, self.crc)  # while the bytes are still in the CPU cache
        self.pos = pos = pos + n
        if pos == self.end:
            self.ranges.finished(self.start, pos, self.crc)
        return out
