"""Waiting for a directory to change: file-system notifications where there are any, else a timer.

A watcher polls, and should wake up as soon as a trainer finishes a file rather than at its next
poll. :class:`Waker` waits until ``timeout`` seconds have passed, another thread calls
:meth:`Waker.kick` or :meth:`Waker.stop`, or (Linux, through ``inotify`` via ctypes: no extra
package) a file was created, finished (closed after writing) or moved into one of the
directories given to :meth:`Waker.watch`. Notifications only wake the poller early; it still
polls at its interval, so a missed event (a network file system, a full event queue) costs at
most one interval. Nothing here imports TensorFlow.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import select
import sys
import threading
from typing import Any, Optional, Tuple

from ckptmerge.core.redact import get_logger

__all__ = ["Waker"]

logger = get_logger(__name__)

_IN_CLOSE_WRITE, _IN_MOVED_TO, _IN_CREATE = 0x008, 0x080, 0x100
_IN_NONBLOCK, _IN_CLOEXEC = 0o4000, 0o2000000
_MASK = _IN_CLOSE_WRITE | _IN_MOVED_TO | _IN_CREATE


def _libc() -> Any:
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        libc.inotify_init1.argtypes = [ctypes.c_int]
        libc.inotify_add_watch.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_uint32]
        return libc
    except (OSError, AttributeError):
        return None


class Waker:
    """Sleep until a timeout, a kick or stop from another thread, or a change in a watched directory.

    Args:
        notify: use file-system notifications where the platform has them.

    Example:
        >>> w = Waker(notify=False)
        >>> w.wait(0.01)
        False
        >>> w.kick(); w.wait(60)
        False
        >>> w.close()
    """

    def __init__(self, notify: bool = True) -> None:
        self._stopped = False
        self._event = threading.Event()  # kicks and stops when there are no notifications
        self._fd: Optional[int] = None
        self._pipe: Optional[Tuple[int, int]] = None
        libc = _libc() if notify else None
        if libc is not None:
            fd = libc.inotify_init1(_IN_NONBLOCK | _IN_CLOEXEC)
            if fd >= 0:
                self._libc, self._fd = libc, fd
                self._pipe = os.pipe()
                os.set_blocking(self._pipe[0], False)
            else:
                logger.debug("inotify unavailable (errno %d): polling only", ctypes.get_errno())

    @property
    def notifying(self) -> bool:
        """Whether file-system notifications are in use."""
        return self._fd is not None

    def watch(self, directory: str) -> bool:
        """Wake on changes in ``directory`` (call again after it was removed and made anew: the
        same directory is watched once); False when notifications are not in use or it cannot be
        watched (yet)."""
        if self._fd is None:
            return False
        return self._libc.inotify_add_watch(self._fd, os.fsencode(directory), _MASK) >= 0

    def wait(self, timeout: float) -> bool:
        """Sleep at most ``timeout`` seconds; True when a file-system change woke it."""
        if self._stopped:
            return False
        if self._fd is None or self._pipe is None:
            self._event.wait(max(0.0, timeout))
            self._event.clear()
            return False
        try:
            ready, _, _ = select.select([self._fd, self._pipe[0]], [], [], max(0.0, timeout))
        except (OSError, ValueError):  # closed meanwhile
            return False
        if self._pipe[0] in ready:
            _drain(self._pipe[0])
        if self._fd in ready:
            _drain(self._fd)
            return True
        return False

    def kick(self) -> None:
        """Wake the waiting thread now (a later wait sleeps again)."""
        if self._pipe is not None:
            try:
                os.write(self._pipe[1], b"k")
            except OSError:  # pragma: no cover - closed
                pass
        else:
            self._event.set()

    def stop(self) -> None:
        """Wake the waiting thread now; every later wait returns at once."""
        self._stopped = True
        self.kick()
        self._event.set()

    @property
    def stopped(self) -> bool:
        """Whether :meth:`stop` was called."""
        return self._stopped

    def close(self) -> None:
        """Release the notification descriptors (call after the waiting thread ended)."""
        self.stop()
        for fd in ([self._fd] if self._fd is not None else []) + list(self._pipe or ()):
            try:
                os.close(fd)
            except OSError:  # pragma: no cover
                pass
        self._fd, self._pipe = None, None


def _drain(fd: int) -> None:
    while True:
        try:
            if not os.read(fd, 1 << 16):
                return
        except OSError:  # BlockingIOError: nothing more
            return
