"""What every ``ckptmerge`` command shares: the group, the error boundary, tables, opening.

The one place library errors become ``Error: ...`` (exit 2) or ``Blocked: ...`` (exit 1).
"""

from __future__ import annotations

import functools
import itertools
import logging
import os
import sys
import time
from dataclasses import dataclass
from typing import (
    Any,
    Iterator,
    List,
    Optional,
    Sequence,
    Tuple,
)

import click

from .. import __version__
from ..core import interrupts, limits
from ..core.errors import CkptMergeError, PlanError
from ..core.jsonout import json_pieces
from ..core.redact import get_logger
from ..core.text import escape_name, escape_text, human_bytes, quoted_command

#: Exit code for findings (plan) or differences (diff).
EXIT_FINDINGS = 1
#: Exit code for usage and input errors.
EXIT_ERROR = 2
#: Exit code when interrupted (Ctrl-C): 128 + SIGINT, as shells report it; never 1, which
#: would read as "findings" or "different".
EXIT_INTERRUPTED = interrupts.EXIT_INTERRUPTED

logger = get_logger(__name__)

# Elements per piece read by ls --stats and diff --values: their memory stays bounded whatever
# the size of the tensors.
STATS_CHUNK = 1 << 20


# ============================================================================================
# Errors: one boundary turns library errors into one clear message and exit code 2
# ============================================================================================


class CliError(click.ClickException):
    """A user-facing error: printed as ``Error: <message>`` on stderr, exit code 2 (or given).

    The message is escaped (:func:`~ckptmerge.core.text.escape_text`): names in library messages are
    escaped where they are built, and this is the net under every error the CLI prints.
    """

    exit_code = EXIT_ERROR

    def __init__(self, message: str, exit_code: int = EXIT_ERROR) -> None:
        super().__init__(escape_text(message))
        self.exit_code = exit_code

    def show(self, file: Any = None) -> None:
        """``Error: ...`` for errors (exit 2); ``Blocked: ...`` for findings (exit 1), with the
        config keys that the library's fix hints (``allow_missing=...``, ``strict=False``) name."""
        if self.exit_code != EXIT_FINDINGS:
            return super().show(file)
        click.echo(f"Blocked: {self.format_message()}", err=True)
        click.echo(CONFIG_KEYS_HINT, err=True)


CONFIG_KEYS_HINT = ("In a config file, the options these hints name are top-level keys: allow_missing, "
                     "on_conflict, on_shape_mismatch, cast, strict, verify (see docs/config.md).")


def _os_error_message(e: OSError) -> str:
    exhausted = limits.resource_error(e, e.filename if e.filename is not None else "a file")
    if exhausted is not None:  # out of open files or memory, wherever it came from
        return str(exhausted)
    what = e.strerror or str(e)
    if e.filename is not None:
        return f"{what}: '{escape_name(e.filename)}'"
    return what


class _Group(click.Group):
    """The command group; its ``invoke`` is the one place library errors become messages."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            with interrupts.command_scope():  # inside: Ctrl-C raises KeyboardInterrupt, caught below
                return super().invoke(ctx)
        except PlanError as e:  # findings that block a strict merge: exit 1, not an input error
            raise CliError(str(e), EXIT_FINDINGS) from None
        except CkptMergeError as e:
            raise CliError(str(e)) from None
        except BrokenPipeError:  # `ckptmerge ls big | head`: stop quietly
            _silence_stdout()
            ctx.exit(0)
        except KeyboardInterrupt:  # the library removed its temporary files on the way out
            click.echo(err=True)
            click.echo("Aborted!", err=True)
            ctx.exit(EXIT_INTERRUPTED)
        except OSError as e:
            raise CliError(_os_error_message(e)) from None
        except MemoryError:
            raise CliError(_OUT_OF_MEMORY) from None


_OUT_OF_MEMORY = ("Out of memory: a tensor (or the set of tensors) this command reads does not fit in "
                  "this machine's memory. 'ckptmerge ls' (without --stats) lists sizes without reading "
                  "values; select fewer tensors, or run on a machine with more memory.")


def _silence_stdout() -> None:
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):  # pragma: no cover - stdout without a file descriptor
        pass


# ============================================================================================
# Rendering helpers
# ============================================================================================


def shape_text(shape: Sequence[int]) -> str:
    return _shape_text(shape) if type(shape) is tuple else str(tuple(shape))


@functools.lru_cache(maxsize=4096)  # a listing repeats a few shapes many times
def _shape_text(shape: Tuple[int, ...]) -> str:
    return str(shape)


def table(rows: Sequence[Sequence[str]], *, right: Sequence[int] = (), header: Optional[Sequence[str]] = None) -> str:
    """Fixed-width columns, two spaces apart; columns in ``right`` are right-aligned. Cells are
    escaped (:func:`~ckptmerge.core.text.escape_name`), so a name is always one visible row.

    Example:
        >>> print(table([["a", "1"], ["bb", "22"]], right=[1], header=["X", "N"]))
        X    N
        a    1
        bb  22
    """
    rows = [list(r) for r in rows]
    ncol = max(max(map(len, rows), default=0), len(header) if rows and header else 0)
    for r in rows:
        if len(r) < ncol:
            r.extend([""] * (ncol - len(r)))
    return "\n".join(table_pieces(list(zip(*rows)), right=right, header=header, rows_per_piece=None))


#: Rows per piece of :func:`table_pieces`: a table of 100,000s of rows is printed a piece at a time.
TABLE_PIECE_ROWS = 10_000


def table_pieces(columns: Sequence[Sequence[str]], *, right: Sequence[int] = (),
                 header: Optional[Sequence[str]] = None, indent: str = "",
                 rows_per_piece: Optional[int] = TABLE_PIECE_ROWS) -> Iterator[str]:
    """:func:`table`, given column by column, as pieces of at most ``rows_per_piece`` lines
    (``None``: one piece), each line prefixed by ``indent``: the widths come from every row,
    the text is made a piece at a time, so printing a huge table holds one piece of its text.

    Example:
        >>> list(table_pieces([["a", "bb", "c"], ["1", "22", "3"]], right=[1], indent="  ", rows_per_piece=2))
        ['  a    1\\n  bb  22', '  c    3']
    """
    if not columns or not columns[0]:
        if header:
            yield indent + "  ".join(header).rstrip()
        return
    padded = []
    for i, col in enumerate(columns):
        try:
            printable = all(map(str.isprintable, col))
        except TypeError:  # a cell that is not a str
            printable = False
        cells = list(col) if printable else list(map(escape_name, col))
        if header:  # the header is shown as it is
            cells.insert(0, header[i] if i < len(header) else "")
        pad = str.rjust if i in right else str.ljust
        # (column by column with C-speed maps: `ls` of 100,000 variables is 400,000 cells)
        padded.append(map(pad, cells, itertools.repeat(max(map(len, cells)))))
    lines: Iterator[str] = map(str.rstrip, map("  ".join, zip(*padded)))
    if indent:
        lines = map(indent.__add__, lines)
    while True:
        piece = list(itertools.islice(lines, rows_per_piece))
        if not piece:
            return
        yield "\n".join(piece)


_JSON_PIECE = 1 << 16  # characters written at a time


def echo_json(data: Any, *, expand: int = 2) -> None:
    """Print strict JSON (no NaN literals) that people can read too: the top levels one item
    per line, each record compact on its line (``expand=0``: all on one line). Written a piece
    at a time (see :mod:`ckptmerge.core.jsonout`): ``data`` may hold records made while writing."""
    pending: List[str] = []
    size = 0
    for piece in json_pieces(data, expand=expand):
        pending.append(piece)
        size += len(piece)
        if size >= _JSON_PIECE:
            click.echo("".join(pending), nl=False)
            pending, size = [], 0
    click.echo("".join(pending))


# ============================================================================================
# Opening checkpoints
# ============================================================================================


@dataclass
class Opened:
    given: str
    step: Optional[int]
    prefix: str
    note: str
    reader: Any

    def header(self) -> str:
        return escape_name(f"Checkpoint: {self.prefix} ({self.note})")

    def ls_command(self) -> str:
        """The ``ckptmerge ls`` hint for this checkpoint, set off in the quotes it needs."""
        return quoted_command("ls", self.given, *(("--step", self.step) if self.step is not None else ()))


def open_checkpoint_arg(path: str, step: Optional[int], *, verify: bool = True) -> Opened:
    from ..sources.resolve import open_resolved

    resolved, reader = open_resolved(path, step=step, verify=verify)
    return Opened(path, step, resolved.prefix, resolved.note, reader)


STEP_OPTION = click.option("--step", type=click.IntRange(min=0), default=None, metavar="N",
                     help="With a directory: the checkpoint of global step N (never another one).")
JSON_OPTION = click.option("--json", "as_json", is_flag=True, help="Print JSON for scripts instead of text.")
NO_VERIFY_OPTION = click.option("--no-verify", "no_verify", is_flag=True,
                          help="Read tensors even when their CRC32C checksum does not match (corrupt data).")


# ============================================================================================
# The group
# ============================================================================================


def _escaped_arg(arg: Any) -> Any:
    return escape_name(os.fspath(arg)) if isinstance(arg, (str, os.PathLike)) else arg


class _EchoHandler(logging.Handler):
    """Library log records (warnings; info with -v) to whatever stderr is at the time.

    The arguments of a record (paths, names from files) are escaped one by one
    (:func:`~ckptmerge.core.text.escape_name`), so a newline in one cannot start a line of its own;
    the message around them keeps its newlines (a traceback with -v)."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            if isinstance(record.args, tuple) and record.args:
                record = logging.makeLogRecord({**record.__dict__,
                                                "args": tuple(map(_escaped_arg, record.args))})
            click.echo(escape_text(self.format(record)), err=True)
        except Exception:  # noqa: BLE001 - logging must never raise  # pragma: no cover
            self.handleError(record)


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, "--version", prog_name="ckptmerge", message="%(prog)s %(version)s")
@click.option("-v", "--verbose", is_flag=True, help="Log what ckptmerge does (to stderr).")
@click.pass_context
def cli(ctx: click.Context, verbose: bool) -> None:
    """Inspect, plan and merge TensorFlow checkpoints without writing model code.

    PATH arguments accept a checkpoint prefix (runs/A/model-10), one of its .index/.data
    files, a training directory (its latest checkpoint, or --step N), a SavedModel directory,
    or a Keras .weights.h5 file. Exit codes: 0 ok, 1 findings or differences, 2 errors,
    130 interrupted (Ctrl-C).
    """
    # Logging is process-wide state: set it up only when running as the program (main()), not
    # when a host (a test, a notebook) invokes the command group in-process.
    if isinstance(ctx.obj, dict) and ctx.obj.get("configure_logging"):
        lib_logger = get_logger("ckptmerge")
        if not any(isinstance(h, _EchoHandler) for h in lib_logger.handlers):
            handler = _EchoHandler()
            handler.setFormatter(logging.Formatter("%(levelname)s: %(message)s"))
            lib_logger.addHandler(handler)
            lib_logger.propagate = False  # one copy of each message, on stderr
        lib_logger.setLevel(logging.INFO if verbose else logging.WARNING)




def stderr_is_tty() -> bool:
    try:
        return sys.stderr.isatty()
    except (AttributeError, ValueError):
        return False


class ProgressBar:
    """A ``progress(done_bytes, total_bytes)`` callback drawing a click progress bar on stderr."""

    def __init__(self, label: str) -> None:
        self.label = label
        self.bar: Any = None
        self.done = 0
        self.start = time.monotonic()

    def _show(self, _item: Any) -> str:
        elapsed = max(time.monotonic() - self.start, 1e-9)
        total = self.bar.length if self.bar is not None else 0
        return f"{human_bytes(self.done)}/{human_bytes(total)} {human_bytes(int(self.done / elapsed))}/s"

    def __call__(self, done: int, total: int) -> None:
        if self.bar is None:
            self.bar = click.progressbar(length=max(int(total), 1), label=self.label, file=sys.stderr,
                                         item_show_func=self._show, show_eta=True, show_percent=True)
            self.bar.__enter__()
        step = int(done) - self.done
        self.done = int(done)
        if step > 0:
            self.bar.update(step, self.done)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.__exit__(None, None, None)
            self.bar = None
