"""Ctrl-C held back while a few steps must happen together.

A ``KeyboardInterrupt`` is raised between any two bytecodes of the main thread, so a step that
must not be cut in two (take a lock and record it; assign a variable and count it; put every
variable back) cannot rely on ``try``/``except`` alone: the interrupt can land after the step and
before the bookkeeping. :class:`HeldInterrupts` installs a SIGINT handler that only records the
signal, for the length of a ``with`` block, then delivers it (to the handler that was there
before) when the block ends; the block can look at :attr:`HeldInterrupts.pending` to stop early
and clean up first. Outside the main thread (where no SIGINT is ever delivered), or where the
handler cannot be changed, it does nothing.
"""

from __future__ import annotations

import signal
import threading
from typing import Any, Optional

__all__ = ["HeldInterrupts"]


class HeldInterrupts:
    """Hold back SIGINT for a ``with`` block; deliver it when the block ends.

    Attributes:
        pending: a SIGINT arrived during the block (it is delivered on exit).

    Example:
        >>> with HeldInterrupts() as held:
        ...     done = [x * 2 for x in range(3)]  # not cut in two by Ctrl-C
        >>> held.pending
        False
    """

    def __init__(self) -> None:
        self.pending = False
        self._old: Any = None
        self._installed = False

    def _record(self, signum: int, frame: Optional[Any]) -> None:
        self.pending = True

    def __enter__(self) -> "HeldInterrupts":
        if threading.current_thread() is threading.main_thread():
            try:
                self._old = signal.signal(signal.SIGINT, self._record)
                self._installed = True
            except (ValueError, OSError):  # pragma: no cover - an embedding that owns signals
                self._installed = False
        return self

    def __exit__(self, *exc: Any) -> None:
        if not self._installed:
            return
        old = self._old if self._old is not None else signal.default_int_handler
        signal.signal(signal.SIGINT, old)
        self._installed = False
        if self.pending:  # deliver it as if it came now: KeyboardInterrupt, or what the handler does
            self.pending = False
            if old is signal.default_int_handler:
                raise KeyboardInterrupt
            signal.raise_signal(signal.SIGINT)
