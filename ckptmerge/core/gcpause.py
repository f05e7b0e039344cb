"""Pause Python's cyclic garbage collector while building many small acyclic objects.

Listing a checkpoint of 100,000 variables or planning against 100,000 targets creates several
hundred thousand tuples, strings and small dataclasses, none of which form reference cycles.
The cyclic collector still runs every 700 new container objects and, every few of those runs,
walks every object alive, so it would spend more time looking for cycles than the plan spends
working (measured: a plan of 100,000 targets takes about twice as long with it running).
Reference counting still frees everything as usual meanwhile; only the search for cycles waits
until the block ends. Blocks nest and overlap across threads: the collector is switched off by
the first block to enter and back on (if it was on then) by the last one to leave.
"""

from __future__ import annotations

import contextlib
import gc
import threading
from typing import Iterator

__all__ = ["paused_gc"]

_lock = threading.Lock()
_depth = 0  # blocks inside paused_gc now, in every thread
_was_enabled = False  # the collector's state when the outermost block entered


@contextlib.contextmanager
def paused_gc() -> Iterator[None]:
    """Disable the cyclic garbage collector inside the block (if it was enabled), then re-enable it.

    Example:
        >>> with paused_gc():
        ...     rows = [(i, str(i)) for i in range(100_000)]
    """
    global _depth, _was_enabled
    with _lock:
        if _depth == 0:
            _was_enabled = gc.isenabled()
            gc.disable()
        _depth += 1
    try:
        yield
    finally:
        with _lock:
            _depth -= 1
            if _depth == 0 and _was_enabled:
                gc.enable()
