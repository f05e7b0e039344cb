"""Ctrl-C in the ``ckptmerge`` program: exit 130 with one line from its first line on, never a traceback.

A command reacts to Ctrl-C inside the CLI's error boundary: the library sees a
``KeyboardInterrupt``, removes its temporary files on the way out, and the boundary prints
``Aborted!`` and exits 130. Before the boundary is up (while the program imports its modules
and parses its arguments, half a second or more) and after it is left, there is nothing to
clean up, but Python's own handler would raise ``KeyboardInterrupt`` where nothing catches it:
a traceback and death by SIGINT (issue 30.7).

So the program installs :func:`on_interrupt` as the SIGINT handler as the first thing it runs
(``import ckptmerge`` does it when the process is the ``ckptmerge`` program:
:func:`started_as_program`; ``ckptmerge.__main__`` and ``ckptmerge.cli.main`` do it too).
Inside a command (:func:`command_scope`) it raises ``KeyboardInterrupt`` as Python's handler
does; outside, it flushes stdout and stderr, writes ``Aborted!`` and ends the process with 130 at
once (``os._exit``: no exception that some ``except`` could swallow). A handler someone else installed, or SIGINT ignored (a
background job of a non-interactive shell), is left as it is. Importing ckptmerge as a library
changes no signal handler.

What remains outside ckptmerge's reach: a SIGINT that arrives while the interpreter itself starts
(before it runs the program's first line, including ``site`` and ``.pth`` files): Python's own
behaviour applies there.

Example:
    >>> from ckptmerge.core import interrupts
    >>> with interrupts.command_scope():
    ...     interrupts.in_command()
    True
    >>> interrupts.in_command()
    False
"""

from __future__ import annotations

# Only modules the interpreter has loaded already (or built in): this runs before anything else.
import os
import signal
import sys

TYPE_CHECKING = False
if TYPE_CHECKING:  # pragma: no cover
    from typing import Any, Optional, Sequence

__all__ = ["EXIT_INTERRUPTED", "started_as_program", "install", "installed", "on_interrupt", "command_scope",
           "in_command"]

#: 128 + SIGINT, as shells report an interrupted command.
EXIT_INTERRUPTED = 130

#: The program's names: the console script (``ckptmerge``, and what pip makes of it on Windows).
PROGRAM_NAMES = ("ckptmerge", "ckptmerge.exe", "ckptmerge-script.py")

_MESSAGE = b"\nAborted!\n"
#: commands running inside the CLI's error boundary (nested only when a host re-enters the CLI)
_commands = [0]


def started_as_program(argv: Optional[Sequence[str]] = None, orig_argv: Optional[Sequence[str]] = None) -> bool:
    """Whether this process is the ``ckptmerge`` program: its console script, or ``python -m ckptmerge``.

    Args:
        argv: the command line as ``sys.argv`` has it (default: ``sys.argv``).
        orig_argv: the interpreter's own command line (default: ``sys.orig_argv``, Python 3.10+).

    Example:
        >>> started_as_program(["/venv/bin/ckptmerge", "ls", "runs/A"], [])
        True
        >>> started_as_program(["-m"], ["python", "-X", "utf8", "-m", "ckptmerge", "ls"])
        True
        >>> started_as_program(["train.py"], ["python", "train.py", "-m", "ckptmerge"])
        False
    """
    argv = sys.argv if argv is None else argv
    if argv and os.path.basename(str(argv[0])) in PROGRAM_NAMES:
        return True
    words = list(getattr(sys, "orig_argv", ()) if orig_argv is None else orig_argv)[1:]
    while words:
        word = words.pop(0)
        if word == "-m":
            return bool(words) and words[0] == "ckptmerge"
        if word.startswith("-m"):
            return word[2:] == "ckptmerge"
        if word in ("-W", "-X"):  # options that take the next word
            words[:1] = []
        elif not word.startswith("-") or word in ("-", "-c") or word.startswith("-c"):
            return False  # a script, stdin or -c: not the ckptmerge program
    return False


def on_interrupt(signum: int, frame: Any) -> None:
    """The SIGINT handler: ``KeyboardInterrupt`` inside a command, else ``Aborted!`` and exit 130."""
    if _commands[0] > 0:
        raise KeyboardInterrupt
    # (outside a command there is nothing to clean up; an exception could be swallowed by whatever
    # the main thread is running, e.g. an import's fallback, leaving the program running after its
    # "Aborted!" (seen: watch): output is flushed, then the process ends at once)
    for stream in (sys.stdout, sys.stderr):
        try:
            if stream is not None:
                stream.flush()
        except (OSError, ValueError):  # pragma: no cover - closed or broken
            pass
    try:
        os.write(2, _MESSAGE)
    except OSError:  # pragma: no cover - stderr closed
        pass
    os._exit(EXIT_INTERRUPTED)


def installed() -> bool:
    """Whether :func:`on_interrupt` is the SIGINT handler."""
    return signal.getsignal(signal.SIGINT) is on_interrupt


def install() -> bool:
    """Make :func:`on_interrupt` the SIGINT handler, unless Python's default handler has been
    replaced (SIGINT ignored, or a handler of the host's own) or this is not the main thread.
    Returns whether it is installed. For the program only: a library never calls this."""
    if installed():
        return True
    if signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
        return False
    try:
        signal.signal(signal.SIGINT, on_interrupt)
    except ValueError:  # not the main thread: signals are the main thread's
        return False
    return True


class command_scope:  # noqa: N801 - used as a context manager, named like contextlib's
    """Inside: Ctrl-C raises ``KeyboardInterrupt`` (the library cleans up, the CLI's boundary
    reports it). Enter it inside the ``try`` that catches ``KeyboardInterrupt``.

    Example:
        >>> with command_scope():
        ...     in_command()
        True
    """

    def __enter__(self) -> None:
        _commands[0] += 1

    def __exit__(self, *exc: object) -> None:
        _commands[0] -= 1


def in_command() -> bool:
    """Whether a command runs inside :func:`command_scope`."""
    return _commands[0] > 0
