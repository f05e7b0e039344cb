"""Moving tensor bytes into an output file: array chunks, pread pieces, kernel copies, CRCs.

Large tensors are written in chunks (at most one chunk copied), byte ranges are copied between
files inside the kernel where it can (``copy_file_range``) and read back in cache-sized pieces to
checksum them on a background thread.
"""

from __future__ import annotations

import errno
import os
from typing import Iterable, Iterator, Optional

import crc32c as _crc32c
import numpy as np

_CHUNK_BYTES = 8 << 20  # bytes written per write() call for large tensors


_PIECE = 1 << 20  # read-back piece: stays in the CPU cache while its CRC is computed
_NO_KERNEL_COPY = {errno.EXDEV, errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP, errno.EBADF}


def kernel_copy(src_fd: int, src_offset: int, dst_fd: int, dst_offset: int, nbytes: int) -> Optional[int]:
    """Copy a byte range between files inside the kernel; ``None`` where that is unsupported."""
    copy = getattr(os, "copy_file_range", None)
    if copy is None or nbytes == 0:
        return None if copy is None else 0
    done = 0
    while done < nbytes:
        try:
            n = copy(src_fd, dst_fd, nbytes - done, src_offset + done, dst_offset + done)
        except OSError as e:
            if done == 0 and e.errno in _NO_KERNEL_COPY:
                return None
            raise
        if n == 0:  # end of the source file
            break
        done += n
    return done


class Checksum:
    """The CRC32C of a file range, computed on a background thread; ``result()`` waits for it."""

    def __init__(self, fd: int, offset: int, nbytes: int) -> None:
        import threading

        self._crc = 0
        self._error: Optional[BaseException] = None
        self._thread = threading.Thread(target=self._run, args=(fd, offset, nbytes), daemon=True)
        self._thread.start()

    def _run(self, fd: int, offset: int, nbytes: int) -> None:
        try:
            for piece in pread_pieces(fd, offset, nbytes):
                self._crc = _crc32c.crc32c(piece, self._crc)
        except BaseException as e:  # re-raised in the caller's thread by result()
            self._error = e

    def result(self) -> int:
        self._thread.join()
        if self._error is not None:
            raise self._error
        return self._crc


def pread_pieces(fd: int, offset: int, nbytes: int) -> Iterator[memoryview]:
    """Yield ``nbytes`` of ``fd`` from ``offset`` in pieces (one reused buffer)."""
    buf = memoryview(bytearray(min(_PIECE, max(nbytes, 1))))
    pos = 0
    while pos < nbytes:
        want = min(len(buf), nbytes - pos)
        n = os.preadv(fd, [buf[:want]], offset + pos)
        if n <= 0:
            raise OSError(errno.EIO, f"unexpected end of file after {pos} of {nbytes} bytes")
        yield buf[:n]
        pos += n


def array_chunks(value: np.ndarray, le_dtype: np.dtype) -> Iterable[memoryview]:
    """Yield the array's C-order little-endian bytes in chunks, copying at most one chunk."""
    if value.size == 0:
        return
    if value.flags.c_contiguous and value.dtype == le_dtype:
        flat = value.reshape(-1).view(np.uint8)
        for start in range(0, flat.size, _CHUNK_BYTES):
            yield memoryview(flat[start:start + _CHUNK_BYTES])
        return
    # Non-contiguous or big-endian: convert a band of leading-axis rows at a time.
    if value.ndim == 0:
        yield memoryview(np.ascontiguousarray(value, dtype=le_dtype).reshape(-1).view(np.uint8))
        return
    row_bytes = max(1, value.nbytes // max(1, value.shape[0]))
    rows = max(1, _CHUNK_BYTES // row_bytes)
    for start in range(0, value.shape[0], rows):
        band = np.ascontiguousarray(value[start:start + rows], dtype=le_dtype)
        yield memoryview(band.reshape(-1).view(np.uint8))
