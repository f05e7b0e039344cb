"""Positional reads into caller-owned buffers: the one loop every file reader uses.

Readers fill 64-byte aligned numpy buffers (see :func:`ckptmerge.formats.base.aligned_empty`)
straight from the file with ``preadv``, so a tensor's bytes are copied once, from the page cache
into the array TensorFlow (or numpy) will use. ``pread`` needs no shared file position, so one
descriptor serves every thread of a reader.
"""

from __future__ import annotations

import os
import threading
from typing import Dict, Hashable, Optional, Union

from ckptmerge.formats.io.localfile import open_regular
from ckptmerge.formats.io.storage import RemoteFile, is_url

#: What :class:`Descriptors` hands out: an OS file descriptor, or a remote object read by ranges.
Handle = Union[int, RemoteFile]

__all__ = ["pread_into", "Descriptors", "size_of"]

_SEEK_LOCK = threading.Lock()  # only for platforms without preadv (Windows)


def pread_into(fd: Handle, offset: int, buf: memoryview, lock: Optional[threading.Lock] = None, *,
               key: Optional[str] = None) -> int:
    """Fill ``buf`` with the bytes of ``fd`` at ``offset``; return how many were read.

    ``fd`` may also be a :class:`~ckptmerge.formats.io.storage.RemoteFile` (a URL opened by
    :class:`Descriptors`): one ranged read into ``buf``, whose remote errors name the tensor
    ``key`` (the caller's name for what it reads) besides the URL.

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
    if not isinstance(fd, int):
        return fd.readinto(offset, buf, key=key)
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
    """Read-only file descriptors opened on first use, one per file, shared by every thread
    (for a URL, a :class:`~ckptmerge.formats.io.storage.RemoteFile`: :func:`pread_into` takes both).

    Example:
        >>> fds = Descriptors()
        >>> fd = fds.get("setup.py", "setup.py")  # doctest: +SKIP
        >>> fds.close()
    """

    def __init__(self) -> None:
        self._fds: Dict[Hashable, Handle] = {}
        self._lock = threading.Lock()

    def get(self, key: Hashable, path: str) -> Handle:
        """The descriptor of ``path`` (cached under ``key``); ``OSError`` if it cannot be opened."""
        fd = self._fds.get(key)
        if fd is None:
            with self._lock:
                fd = self._fds.get(key)
                if fd is None:
                    fd = self._fds[key] = RemoteFile(path) if is_url(path) else open_regular(path)
        return fd

    def close(self) -> None:
        """Close every descriptor (a later :meth:`get` opens again)."""
        with self._lock:
            fds, self._fds = self._fds, {}
        for fd in fds.values():
            if not isinstance(fd, int):
                continue
            try:
                os.close(fd)
            except OSError:  # pragma: no cover
                pass


def size_of(fd: Handle) -> int:
    """The size in bytes of the file behind a :class:`Descriptors` handle.

    Example:
        >>> import tempfile
        >>> with tempfile.TemporaryFile() as f:
        ...     _ = f.write(b"abc"); f.flush()
        ...     size_of(f.fileno())
        3
    """
    return os.fstat(fd).st_size if isinstance(fd, int) else fd.size
