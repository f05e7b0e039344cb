"""Positional reads into caller-owned buffers: the one loop every file reader uses.

Readers fill 64-byte aligned numpy buffers (see :func:`ckptmerge.formats.base.aligned_empty`)
straight from the file with ``preadv``, so a tensor's bytes are copied once, from the page cache
into the array TensorFlow (or numpy) will use. ``pread`` needs no shared file position, so one
descriptor serves every thread of a reader.
"""

from __future__ import annotations

import os
import threading
from typing import Dict, Hashable, Optional

__all__ = ["pread_into", "Descriptors"]

_SEEK_LOCK = threading.Lock()  # only for platforms without preadv (Windows)


def pread_into(fd: int, offset: int, buf: memoryview, lock: Optional[threading.Lock] = None) -> int:
    """Fill ``buf`` with the bytes of ``fd`` at ``offset``; return how many were read.

    Returns fewer than ``len(buf)`` only when the file ends early: callers turn that into a
    truncation error naming their file and tensor. ``OSError`` propagates.

    Example:
        >>> import tempfile
        >>> with tempfile.TemporaryFile() as f:
        ...     _ = f.write(b"abcdef"); f.flush()
        ...     b = bytearray(3)
        ...     pread_into(f.fileno(), 2, memoryview(b)), bytes(b)
        (3, b'cde')
    """
    n = len(buf)
    done = 0
    if hasattr(os, "preadv"):
        while done < n:
            got = os.preadv(fd, [buf[done:]], offset + done)
            if got <= 0:
                break
            done += got
        return done
    with lock or _SEEK_LOCK:  # pragma: no cover - Windows
        os.lseek(fd, offset, os.SEEK_SET)
        while done < n:
            chunk = os.read(fd, n - done)
            if not chunk:
                break
            buf[done:done + len(chunk)] = chunk
            done += len(chunk)
    return done


class Descriptors:
    """Read-only file descriptors opened on first use, one per file, shared by every thread.

    Example:
        >>> fds = Descriptors()
        >>> fd = fds.get("setup.py", "setup.py")  # doctest: +SKIP
        >>> fds.close()
    """

    def __init__(self) -> None:
        self._fds: Dict[Hashable, int] = {}
        self._lock = threading.Lock()

    def get(self, key: Hashable, path: str) -> int:
        """The descriptor of ``path`` (cached under ``key``); ``OSError`` if it cannot be opened."""
        fd = self._fds.get(key)
        if fd is None:
            with self._lock:
                fd = self._fds.get(key)
                if fd is None:
                    fd = self._fds[key] = os.open(path, os.O_RDONLY | getattr(os, "O_BINARY", 0))
        return fd

    def close(self) -> None:
        """Close every descriptor (a later :meth:`get` opens again)."""
        with self._lock:
            fds, self._fds = self._fds, {}
        for fd in fds.values():
            try:
                os.close(fd)
            except OSError:  # pragma: no cover
                pass
