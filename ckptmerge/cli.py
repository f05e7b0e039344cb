"""The ``ckptmerge`` command line: a thin click layer over the library.

Each command parses its arguments, calls the library, and renders the result: fixed-width
tables for people, ``--json`` for scripts. This is the only module of ckptmerge that prints.
Every :class:`~ckptmerge.errors.CkptMergeError` (and every ``OSError`` on input files) becomes
one clear ``Error: ...`` message on stderr with exit code 2, never a traceback (config and plan
errors list one problem per line). Exit codes: 0 ok, 1 findings or differences, 2 usage or
input errors.

The inspection commands (``ls``, ``show``, ``diff``, ``checkpoints``, ``check``,
``plan --target``, ``merge`` without ``--model``) never import TensorFlow; ``demo`` and
``--model MODULE:FUNCTION`` do.

Example:
    $ ckptmerge ls runs/A --match 'enc*'
    $ ckptmerge diff runs/A runs/B --values
    $ ckptmerge plan warm.yaml --target runs/C
"""

from __future__ import annotations

import contextlib
import datetime
import fnmatch
import gc
import importlib
import importlib.util
import json
import logging
import math
import os
import re
import shlex
import sys
import time
from dataclasses import dataclass
from typing import (
    Any,
    Callable,
    Dict,
    Iterable,
    Iterator,
    List,
    Optional,
    Sequence,
    Tuple,
)

import click

from . import __version__
from .errors import CkptMergeError, PlanError, did_you_mean
from .specs import KIND_VARIABLE, VariableInfo
from .text import human_bytes, plural

__all__ = ["cli", "main"]

#: Exit code for findings (plan) or differences (diff).
EXIT_FINDINGS = 1
#: Exit code for usage and input errors.
EXIT_ERROR = 2

logger = logging.getLogger(__name__)

# Elements per chunk when computing statistics, so --stats never doubles a big tensor in memory.
_STATS_CHUNK = 1 << 20


# ============================================================================================
# Errors: one boundary turns library errors into one clear message and exit code 2
# ============================================================================================


class CliError(click.ClickException):
    """A user-facing error: printed as ``Error: <message>`` on stderr, exit code 2 (or given)."""

    exit_code = EXIT_ERROR

    def __init__(self, message: str, exit_code: int = EXIT_ERROR) -> None:
        super().__init__(message)
        self.exit_code = exit_code

    def show(self, file: Any = None) -> None:
        """``Error: ...`` for errors (exit 2); ``Blocked: ...`` for findings (exit 1), with the
        config keys that the library's fix hints (``allow_missing=...``, ``strict=False``) name."""
        if self.exit_code != EXIT_FINDINGS:
            return super().show(file)
        click.echo(f"Blocked: {self.format_message()}", err=True)
        click.echo(_CONFIG_KEYS_HINT, err=True)


_CONFIG_KEYS_HINT = ("In a config file, the options these hints name are top-level keys: allow_missing, "
                     "on_conflict, on_shape_mismatch, cast, strict, verify (see docs/config.md).")


def _os_error_message(e: OSError) -> str:
    what = e.strerror or str(e)
    if e.filename is not None:
        return f"{what}: '{e.filename}'"
    return what


class _Group(click.Group):
    """The command group; its ``invoke`` is the one place library errors become messages."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except PlanError as e:  # findings that block a strict merge: exit 1, not an input error
            raise CliError(str(e), EXIT_FINDINGS) from None
        except CkptMergeError as e:
            raise CliError(str(e)) from None
        except BrokenPipeError:  # `ckptmerge ls big | head`: stop quietly
            _silence_stdout()
            ctx.exit(0)
        except OSError as e:
            raise CliError(_os_error_message(e)) from None


def _silence_stdout() -> None:
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):  # pragma: no cover - stdout without a file descriptor
        pass


# ============================================================================================
# Rendering helpers
# ============================================================================================


def _shape(shape: Sequence[int]) -> str:
    return str(tuple(shape))


def table(rows: Sequence[Sequence[str]], *, right: Sequence[int] = (), header: Optional[Sequence[str]] = None) -> str:
    """Fixed-width columns, two spaces apart; columns in ``right`` are right-aligned.

    Example:
        >>> print(table([["a", "1"], ["bb", "22"]], right=[1], header=["X", "N"]))
        X    N
        a    1
        bb  22
    """
    all_rows = ([list(header)] if header else []) + [list(r) for r in rows]
    if not all_rows:
        return ""
    ncol = max(len(r) for r in all_rows)
    for r in all_rows:
        r.extend([""] * (ncol - len(r)))
    widths = [max(map(len, col)) for col in zip(*all_rows)]
    fmt = "  ".join(f"{{:{'>' if i in right else '<'}{w}}}" for i, w in enumerate(widths))
    return "\n".join(fmt.format(*r).rstrip() for r in all_rows)


def _json_text(data: Any, depth: int, expand: int) -> str:
    """JSON with the first ``expand`` levels of containers one item per line, the rest compact."""
    if depth >= expand or not isinstance(data, (dict, list)) or not data:
        return json.dumps(data, allow_nan=False)
    pad, inner = "  " * depth, "  " * (depth + 1)
    if isinstance(data, dict):
        items = [f"{inner}{json.dumps(str(k))}: {_json_text(v, depth + 1, expand)}" for k, v in data.items()]
        return "{\n" + ",\n".join(items) + f"\n{pad}}}"
    items = [f"{inner}{_json_text(v, depth + 1, expand)}" for v in data]
    return "[\n" + ",\n".join(items) + f"\n{pad}]"


def _echo_json(data: Any, *, expand: int = 2) -> None:
    """Print strict JSON (no NaN literals) that people can read too: the top levels one item
    per line, each record compact on its line (``expand=0``: all on one line)."""
    click.echo(_json_text(data, 0, expand))


# ============================================================================================
# Opening checkpoints
# ============================================================================================


@dataclass
class _Opened:
    given: str
    step: Optional[int]
    prefix: str
    note: str
    reader: Any

    def header(self) -> str:
        return f"Checkpoint: {self.prefix} ({self.note})"

    def ls_command(self) -> str:
        cmd = f"ckptmerge ls {shlex.quote(self.given)}"
        return cmd + (f" --step {self.step}" if self.step is not None else "")


def _open(path: str, step: Optional[int], *, verify: bool = True) -> _Opened:
    from .resolve import open_resolved

    resolved, reader = open_resolved(path, step=step, verify=verify)
    return _Opened(path, step, resolved.prefix, resolved.note, reader)


_STEP = click.option("--step", type=click.IntRange(min=0), default=None, metavar="N",
                     help="With a directory: the checkpoint of global step N (never another one).")
_JSON = click.option("--json", "as_json", is_flag=True, help="Print JSON for scripts instead of text.")
_NO_VERIFY = click.option("--no-verify", "no_verify", is_flag=True,
                          help="Read tensors even when their CRC32C checksum does not match (corrupt data).")


# ============================================================================================
# The group
# ============================================================================================


class _EchoHandler(logging.Handler):
    """Library log records (warnings; info with -v) to whatever stderr is at the time."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            click.echo(self.format(record), err=True)
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
    or a Keras .weights.h5 file. Exit codes: 0 ok, 1 findings or differences, 2 errors.
    """
    # Logging is process-wide state: set it up only when running as the program (main()), not
    # when a host (a test, a notebook) invokes the command group in-process.
    if isinstance(ctx.obj, dict) and ctx.obj.get("configure_logging"):
        lib_logger = logging.getLogger("ckptmerge")
        if not any(isinstance(h, _EchoHandler) for h in lib_logger.handlers):
            handler = _EchoHandler()
            handler.setFormatter(logging.Formatter("%(levelname)s: %(message)s"))
            lib_logger.addHandler(handler)
            lib_logger.propagate = False  # one copy of each message, on stderr
        lib_logger.setLevel(logging.INFO if verbose else logging.WARNING)


# ============================================================================================
# ls
# ============================================================================================


def _filter(infos: Iterable[VariableInfo], globs: Sequence[str], regex: Optional["re.Pattern[str]"]) -> List[VariableInfo]:
    out = []
    for v in infos:
        names = (v.name, v.raw_key) if v.raw_key != v.name else (v.name,)
        if globs and not any(fnmatch.fnmatchcase(n, g) for g in globs for n in names):
            continue
        if regex is not None and not any(regex.search(n) for n in names):
            continue
        out.append(v)
    return out


def _compile_regex(pattern: Optional[str]) -> Optional["re.Pattern[str]"]:
    if pattern is None:
        return None
    try:
        return re.compile(pattern)
    except re.error as e:
        raise CliError(f"invalid --regex {pattern!r}: {e}. Use a Python regular expression, "
                       "e.g. --regex 'enc.*/kernel$' (it is searched anywhere in the name).") from None


def _numeric_kind(dtype: str) -> Optional[str]:
    """'float', 'int' or None (bool, string, complex and others get no statistics)."""
    if dtype.startswith(("float", "bfloat")):
        return "float"
    if dtype.startswith(("int", "uint")):
        return "int"
    return None


def tensor_stats(value: Any, dtype: str) -> Optional[Dict[str, Any]]:
    """min/max/mean/std over the finite values, plus NaN and Inf counts; None if not numeric.

    Example:
        >>> import numpy as np
        >>> tensor_stats(np.array([1.0, np.nan, 3.0]), "float64")["mean"]
        2.0
    """
    import numpy as np

    kind = _numeric_kind(dtype)
    if kind is None:
        return None
    flat = np.asarray(value).reshape(-1)
    n_nan = n_inf = count = 0
    lo, hi = math.inf, -math.inf
    total = total_sq = 0.0
    shift = None  # subtract the first finite value: a stable one-pass variance
    for start in range(0, flat.size, _STATS_CHUNK):
        chunk = flat[start:start + _STATS_CHUNK].astype(np.float64)
        if kind == "float":
            nan = np.isnan(chunk)
            inf = np.isinf(chunk)
            n_nan += int(nan.sum())
            n_inf += int(inf.sum())
            if n_nan or n_inf:
                chunk = chunk[~(nan | inf)]
        if not chunk.size:
            continue
        if shift is None:
            shift = float(chunk[0])
        lo = min(lo, float(chunk.min()))
        hi = max(hi, float(chunk.max()))
        d = chunk - shift
        total += float(d.sum())
        total_sq += float(np.dot(d, d))
        count += chunk.size
    if count == 0:
        return {"min": None, "max": None, "mean": None, "std": None, "nan": n_nan, "inf": n_inf}
    mean_d = total / count
    var = max(total_sq / count - mean_d * mean_d, 0.0)
    return {"min": lo, "max": hi, "mean": shift + mean_d, "std": math.sqrt(var), "nan": n_nan, "inf": n_inf}


def _num(x: Optional[float]) -> str:
    return "-" if x is None else f"{x:.6g}"


def _stats_cells(stats: Optional[Dict[str, Any]]) -> List[str]:
    if stats is None:
        return ["-"] * 6
    return [_num(stats["min"]), _num(stats["max"]), _num(stats["mean"]), _num(stats["std"]),
            str(stats["nan"]), str(stats["inf"])]


_STATS_HEADER = ["MIN", "MAX", "MEAN", "STD", "NAN", "INF"]


def _tree_rows(infos: Sequence[VariableInfo], *, by_size: bool, show_kind: bool,
               stats: Optional[Dict[str, Optional[Dict[str, Any]]]]) -> List[List[str]]:
    """Rows of a scope tree: scopes first with their total size and count, then leaves."""
    root: Dict[str, Any] = {"children": {}, "leaves": [], "size": 0, "count": 0}
    for v in infos:
        parts = v.name.split("/")
        node = root
        node["size"] += v.nbytes
        node["count"] += 1
        for p in parts[:-1]:
            node = node["children"].setdefault(p, {"children": {}, "leaves": [], "size": 0, "count": 0})
            node["size"] += v.nbytes
            node["count"] += 1
        node["leaves"].append((parts[-1], v))

    rows: List[List[str]] = []
    ncols = 4 + (1 if show_kind else 0)
    n_stats = len(_STATS_HEADER) if stats is not None else 0

    def walk(node: Dict[str, Any], depth: int) -> None:
        indent = "  " * depth
        entries: List[Tuple[str, int, str, Any]] = []
        for name, child in node["children"].items():
            entries.append(("scope", child["size"], name, child))
        for leaf, v in node["leaves"]:
            entries.append(("leaf", v.nbytes, leaf, v))
        if by_size:
            entries.sort(key=lambda e: (-e[1], e[2]))
        else:
            entries.sort(key=lambda e: e[2])
        for kind, size, name, obj in entries:
            if kind == "scope":
                # the count goes last, after the stats columns if any, so leaves stay compact
                row = [f"{indent}{name}/"] + [""] * (ncols - 2) + [human_bytes(size)]
                row += [""] * n_stats + [f"({plural(obj['count'], 'variable')})"]
                rows.append(row)
                walk(obj, depth + 1)
            else:
                v = obj
                row = [f"{indent}{name}"] + ([v.kind] if show_kind else []) + [
                    v.dtype, _shape(v.shape), human_bytes(v.nbytes)]
                if stats is not None:
                    row += _stats_cells(stats.get(v.name))
                rows.append(row)

    walk(root, 0)
    return rows


@cli.command("ls", short_help="List a checkpoint's variables: name, dtype, shape, size.")
@click.argument("path")
@_STEP
@click.option("--match", "globs", multiple=True, metavar="GLOB",
              help="Only names (or raw keys) matching this glob, e.g. 'enc*/kernel'. Repeatable.")
@click.option("--regex", metavar="RE", help="Only names (or raw keys) in which this Python regex is found.")
@click.option("--tree", is_flag=True, help="Group by scope, with each scope's size and count.")
@click.option("--all", "show_all", is_flag=True,
              help="Also list optimizer state and bookkeeping, with each tensor's kind and raw key.")
@click.option("--stats", is_flag=True, help="Add min/max/mean/std and NaN/Inf counts (reads the values).")
@click.option("--sort", type=click.Choice(["name", "size"]), default="name", show_default=True,
              help="Order by name, or by size (largest first).")
@_NO_VERIFY
@_JSON
def ls_command(path: str, step: Optional[int], globs: Tuple[str, ...], regex: Optional[str], tree: bool,
               show_all: bool, stats: bool, sort: str, no_verify: bool, as_json: bool) -> None:
    """List the variables of the checkpoint at PATH: name, dtype, shape, size.

    Names follow ckptmerge's naming rule (Keras variable paths for object-based checkpoints,
    keys for name-based ones). Optimizer state and bookkeeping (global_step, save_counter,
    the object graph) are hidden unless --all. --json prints a list of objects with name,
    key, kind, dtype, shape, nbytes (and stats with --stats: min, max, mean, std over the
    finite values, nan, inf; null for non-numeric tensors). --tree does not apply to --json.
    """
    pattern = _compile_regex(regex)
    opened = _open(path, step, verify=not no_verify)
    with opened.reader as reader:
        everything = reader.variables()
        pool = everything if show_all else [v for v in everything if v.kind == KIND_VARIABLE]
        shown = _filter(pool, globs, pattern)
        if sort == "size":
            shown.sort(key=lambda v: (-v.nbytes, v.name))
        values_stats: Optional[Dict[str, Optional[Dict[str, Any]]]] = None
        if stats:
            values_stats = {v.name: (tensor_stats(reader.get(v.name), v.dtype)
                                     if _numeric_kind(v.dtype) else None) for v in shown}
    if as_json:
        out = []
        for v in shown:
            d = v.to_dict()
            if values_stats is not None:
                d["stats"] = values_stats[v.name]
            out.append(d)
        _echo_json(out, expand=1)
        return

    lines = [opened.header()]
    if tree:
        rows = _tree_rows(shown, by_size=sort == "size", show_kind=show_all, stats=values_stats)
        size_col = 3 + (1 if show_all else 0)
        right = [size_col] + ([size_col + 1 + i for i in range(6)] if values_stats is not None else [])
        if rows:
            lines.append(table(rows, right=right))
    else:
        header = ["NAME"] + (["KIND"] if show_all else []) + ["DTYPE", "SHAPE", "SIZE"]
        rows = []
        for v in shown:
            row = [v.name] + ([v.kind] if show_all else []) + [v.dtype, _shape(v.shape), human_bytes(v.nbytes)]
            if values_stats is not None:
                row += _stats_cells(values_stats[v.name])
            if show_all:
                row.append(v.raw_key)
            rows.append(row)
        size_col = len(header) - 1
        if values_stats is not None:
            header += _STATS_HEADER
        if show_all:
            header.append("KEY")
        right = [size_col] + ([size_col + 1 + i for i in range(6)] if values_stats is not None else [])
        if rows:
            lines.append(table(rows, right=right, header=header))
    word = "tensor" if show_all else "variable"
    total = f"{plural(len(shown), word)}, {human_bytes(sum(v.nbytes for v in shown))}"
    if globs or pattern is not None:
        total = f"{len(shown)} of {plural(len(pool), word)} match, {human_bytes(sum(v.nbytes for v in shown))}"
    hidden = len(everything) - len(pool)
    if hidden and (globs or pattern is not None):
        matching = len(_filter([v for v in everything if v.kind != KIND_VARIABLE], globs, pattern))
        if matching:
            total += f"; {matching} hidden optimizer/bookkeeping tensor{'s' if matching > 1 else ''} match too (--all shows them)"
    elif hidden:
        total += f"; {hidden} optimizer/bookkeeping hidden (--all shows them)"
    lines.append(total)
    click.echo("\n".join(lines))


# ============================================================================================
# show
# ============================================================================================


def _bytes_json(b: bytes) -> Any:
    """Text when valid UTF-8, else the list of byte values (ints 0-255): never ambiguous."""
    try:
        return b.decode("utf-8")
    except UnicodeDecodeError:
        return list(b)


def _finite_or_text(x: float) -> Any:
    if math.isnan(x):
        return "nan"
    if math.isinf(x):
        return "inf" if x > 0 else "-inf"
    return x


def _map_nested(obj: Any, fn: Callable[[Any], Any]) -> Any:
    if isinstance(obj, list):
        return [_map_nested(o, fn) for o in obj]
    return fn(obj)


def value_to_json(value: Any, dtype: str) -> Any:
    """A tensor as JSON-ready nested lists.

    Floats are numbers, with ``"nan"``, ``"inf"`` and ``"-inf"`` as strings (JSON has no such
    numbers); complex numbers are ``[re, im]`` pairs; strings (bytes) are text when they are
    valid UTF-8, else a list of byte values (ints 0-255).

    Example:
        >>> import numpy as np
        >>> value_to_json(np.array([1 + 2j]), "complex128")
        [[1.0, 2.0]]
    """
    import numpy as np

    arr = np.asarray(value)
    if dtype == "string" or arr.dtype == object or arr.dtype.kind == "S":
        return _map_nested(arr.tolist(), lambda b: _bytes_json(b) if isinstance(b, bytes) else b)
    if arr.dtype.kind == "c":
        pairs = np.stack([arr.real.astype(np.float64), arr.imag.astype(np.float64)], axis=-1)
        out = pairs.tolist()
        return out if np.isfinite(pairs).all() else _map_nested(out, _finite_or_text)
    if arr.dtype.kind in "biu":
        return arr.tolist()
    as_float = arr.astype(np.float64)
    out = as_float.tolist()
    return out if np.isfinite(as_float).all() else _map_nested(out, _finite_or_text)


def _unknown_name(opened: _Opened, name: str) -> CliError:
    infos = opened.reader.variables()
    n_vars = sum(1 for v in infos if v.kind == KIND_VARIABLE)
    candidates = [v.name for v in infos] + [v.raw_key for v in infos if v.raw_key != v.name]
    return CliError(
        f"Variable {name!r} not found in checkpoint {opened.given!r} ({opened.prefix})."
        f"{did_you_mean(name, candidates)} Run '{opened.ls_command()}' to list its "
        f"{plural(n_vars, 'variable')}.")


@cli.command("show", short_help="Print one tensor's values.")
@click.argument("path")
@click.argument("name")
@_STEP
@_NO_VERIFY
@_JSON
def show_command(path: str, name: str, step: Optional[int], no_verify: bool, as_json: bool) -> None:
    """Print the values of tensor NAME of the checkpoint at PATH.

    NAME is a name as 'ckptmerge ls' shows it, or a raw checkpoint key. Small tensors are
    printed in full, large ones summarised (numpy's print options). --json prints an object
    with name, key, kind, dtype, shape and value (nested lists; complex numbers as [re, im]
    pairs; NaN and infinities as the strings "nan", "inf", "-inf"; strings as text when valid
    UTF-8, else as a list of byte values).
    """
    import numpy as np

    opened = _open(path, step, verify=not no_verify)
    with opened.reader as reader:
        if name not in reader:
            raise _unknown_name(opened, name)
        info = reader.info(name)
        value = reader.get(info.name)
    if as_json:
        _echo_json({"name": info.name, "key": info.raw_key, "kind": info.kind, "dtype": info.dtype,
                    "shape": list(info.shape), "value": value_to_json(value, info.dtype)}, expand=0)
        return
    head = f"{info.name}  {info.dtype}  {_shape(info.shape)}  {human_bytes(info.nbytes)}"
    if info.raw_key != info.name:
        head += f"  key={info.raw_key}"
    click.echo(head)
    click.echo(np.array2string(np.asarray(value), separator=", "))


# ============================================================================================
# diff
# ============================================================================================


def max_abs_diff(a: Any, b: Any) -> Optional[float]:
    """Largest ``|a - b|`` (0.0 for equal tensors, NaN at the same place counts as equal).

    Returns ``None`` for tensors without a numeric difference (strings), and ``nan`` when NaN
    faces a number somewhere.

    Example:
        >>> import numpy as np
        >>> max_abs_diff(np.array([1.0, 2.0]), np.array([1.0, 2.5]))
        0.5
    """
    import numpy as np

    a, b = np.asarray(a), np.asarray(b)
    if a.dtype == object or b.dtype == object or a.dtype.kind in "SU" or b.dtype.kind in "SU":
        return None
    if a.size == 0:
        return 0.0
    if a.dtype.kind == "b":
        a = a.astype(np.int8)
    if b.dtype.kind == "b":
        b = b.astype(np.int8)
    if a.dtype.kind in "iu" and b.dtype.kind in "iu":  # exact: int64 does not fit in a float64
        if np.array_equal(a, b):
            return 0.0
        if a.dtype.kind != b.dtype.kind:
            return float(max(abs(int(x) - int(y)) for x, y in zip(a.reshape(-1).tolist(), b.reshape(-1).tolist())))
        common = np.result_type(a, b)
        a, b = a.astype(common), b.astype(common)
        # max - min wraps around in fixed width; as unsigned it is the exact distance (< 2**64)
        d = (np.maximum(a, b) - np.minimum(a, b)).astype(np.dtype(f"u{common.itemsize}"), copy=False)
        return float(d.max())
    if a.dtype.kind == "c" or b.dtype.kind == "c":
        a, b = a.astype(np.complex128), b.astype(np.complex128)
    else:
        a, b = a.astype(np.float64), b.astype(np.float64)
    both_nan = np.isnan(a) & np.isnan(b)
    with np.errstate(invalid="ignore", over="ignore"):
        d = np.abs(a - b)
    if both_nan.any():
        d = d[~both_nan]
    if d.size == 0:
        return 0.0
    if np.isnan(d).any():
        return math.nan
    return float(d.max())


def _strings_equal(a: Any, b: Any) -> bool:
    import numpy as np

    return bool(np.array_equal(np.asarray(a), np.asarray(b)))


@cli.command("diff", short_help="Compare two checkpoints (names, shapes, dtypes, values).")
@click.argument("a", metavar="A")
@click.argument("b", metavar="B")
@click.option("--step-a", type=click.IntRange(min=0), default=None, metavar="N", help="Step of A (a directory).")
@click.option("--step-b", type=click.IntRange(min=0), default=None, metavar="N", help="Step of B (a directory).")
@click.option("--values", is_flag=True, help="Also compare values: max absolute difference per common tensor.")
@click.option("--all", "show_all", is_flag=True, help="Include optimizer state and bookkeeping.")
@_NO_VERIFY
@_JSON
def diff_command(a: str, b: str, step_a: Optional[int], step_b: Optional[int], values: bool, show_all: bool,
                 no_verify: bool, as_json: bool) -> None:
    """Compare the checkpoints A and B: names only in A, only in B, shape/dtype differences.

    With --values also the values of the tensors both hold with the same shape (one pair at
    a time, so memory stays small). Exit code 0 when equal, 1 when different. --json prints
    an object with a, b, equal, only_in_a, only_in_b, mismatched and (with --values) values:
    one {name, max_abs_diff, equal} per compared tensor (max_abs_diff is null for strings and
    the string "nan" when NaN faces a number).
    """
    oa = _open(a, step_a, verify=not no_verify)
    try:
        ob = _open(b, step_b, verify=not no_verify)
    except BaseException:
        oa.reader.close()
        raise
    with oa.reader as ra, ob.reader as rb:
        def pool(r: Any) -> Dict[str, VariableInfo]:
            return {v.name: v for v in r.variables() if show_all or v.kind == KIND_VARIABLE}
        va, vb = pool(ra), pool(rb)
        only_a = sorted(set(va) - set(vb))
        only_b = sorted(set(vb) - set(va))
        common = sorted(set(va) & set(vb))
        mismatched = [n for n in common if va[n].shape != vb[n].shape or va[n].dtype != vb[n].dtype]
        compared: List[Dict[str, Any]] = []
        if values:
            for n in common:
                if va[n].shape != vb[n].shape:
                    continue
                xa, xb = ra.get(n), rb.get(n)
                d = max_abs_diff(xa, xb)
                eq = _strings_equal(xa, xb) if d is None else d == 0.0
                compared.append({"name": n, "max_abs_diff": d, "equal": bool(eq)})
    value_diffs = [c for c in compared if not c["equal"]]
    equal = not (only_a or only_b or mismatched or value_diffs)

    if as_json:
        _echo_json({
            "a": oa.prefix, "b": ob.prefix, "equal": equal, "only_in_a": only_a, "only_in_b": only_b,
            "mismatched": [{"name": n, "a": {"dtype": va[n].dtype, "shape": list(va[n].shape)},
                            "b": {"dtype": vb[n].dtype, "shape": list(vb[n].shape)}} for n in mismatched],
            **({"values": [{**c, "max_abs_diff": (c["max_abs_diff"] if c["max_abs_diff"] is None
                                                  else _finite_or_text(c["max_abs_diff"]))}
                           for c in compared]} if values else {}),
        })
        if not equal:
            raise SystemExit(EXIT_FINDINGS)
        return

    lines = [f"A: {oa.prefix} ({oa.note})", f"B: {ob.prefix} ({ob.note})"]

    def section(title: str, items: List[str]) -> None:
        if items:
            lines.append(f"{title} ({len(items)}):")
            lines.extend(f"  {i}" for i in items)

    def listing(names: List[str], infos: Dict[str, VariableInfo]) -> List[str]:
        text = table([[n, infos[n].dtype, _shape(infos[n].shape)] for n in names])
        return text.split("\n") if names else []

    section("Only in A", listing(only_a, va))
    section("Only in B", listing(only_b, vb))
    section("Shape/dtype differ", [f"{n}: A {va[n].dtype} {_shape(va[n].shape)}, B {vb[n].dtype} "
                                   f"{_shape(vb[n].shape)}" for n in mismatched])
    section("Values differ", [
        f"{c['name']}: " + ("strings differ" if c["max_abs_diff"] is None else f"max abs diff {c['max_abs_diff']:.6g}")
        for c in value_diffs])
    what = "names, dtypes, shapes" + (" and values" if values else "")
    if equal:
        lines.append(f"Equal: {plural(len(common), 'variable' if not show_all else 'tensor')}, same {what}"
                     + (f" ({len(compared)} compared)" if values else ""))
    else:
        parts = []
        if only_a:
            parts.append(f"{len(only_a)} only in A")
        if only_b:
            parts.append(f"{len(only_b)} only in B")
        if mismatched:
            parts.append(f"{len(mismatched)} with another shape/dtype")
        if value_diffs:
            parts.append(f"{len(value_diffs)} of {len(compared)} compared with other values")
        lines.append("Different: " + ", ".join(parts))
    click.echo("\n".join(lines))
    if not equal:
        raise SystemExit(EXIT_FINDINGS)


# ============================================================================================
# checkpoints
# ============================================================================================


def _local_iso(t: float) -> str:
    return datetime.datetime.fromtimestamp(t).astimezone().isoformat(timespec="seconds")


@cli.command("checkpoints", short_help="List the checkpoints of a training directory.")
@click.argument("directory", metavar="DIR")
@_JSON
def checkpoints_command(directory: str, as_json: bool) -> None:
    """List every checkpoint in the training directory DIR: step, time, size, latest.

    The latest is the one the directory's 'checkpoint' state file names (marked with *).
    Times are local, ISO 8601. --json prints a list of objects with name (relative to DIR),
    path, step, time (epoch seconds), time_iso, size (bytes) and latest.
    """
    from .resolve import checkpoints

    infos = checkpoints(directory)
    base = os.path.abspath(directory)

    def rel(p: str) -> str:
        try:
            return os.path.relpath(p, base)
        except ValueError:  # pragma: no cover - other drive on Windows
            return p

    if as_json:
        _echo_json([{"name": rel(c.path), "path": c.path, "step": c.step, "time": c.time,
                     "time_iso": _local_iso(c.time), "size": c.size, "latest": c.latest} for c in infos],
                   expand=1)
        return
    if not infos:
        click.echo(f"No checkpoint in {directory!r}.")
        return
    rows = [["*" if c.latest else "", "-" if c.step is None else str(c.step), _local_iso(c.time),
             human_bytes(c.size), rel(c.path)] for c in infos]
    total = f"{plural(len(infos), 'checkpoint')}, {human_bytes(sum(c.size for c in infos))}"
    if not any(c.latest for c in infos):
        from .resolve import read_state_file

        state = read_state_file(directory)
        named = state.model_checkpoint_path if state is not None else None
        if named:
            total += f"; the 'checkpoint' state file names {rel(named)!r} as latest, which is missing"
        else:
            total += "; no latest recorded (no 'checkpoint' state file naming one)"
    click.echo(table(rows, right=[1, 3], header=["LATEST", "STEP", "TIME", "SIZE", "NAME"]) + "\n" + total)


# ============================================================================================
# demo
# ============================================================================================


@cli.command("demo", short_help="Run the built-in A/B/C demo (imports TensorFlow).")
@click.option("--dir", "workdir", type=click.Path(file_okay=False), default=None,
              help="Write the demo checkpoints here (default: a new temporary folder).")
def demo_command(workdir: Optional[str]) -> None:
    """Run the built-in A/B/C demo: write two checkpoints, plan, restore, check values.

    Imports TensorFlow. Prints each step's plan or report and then every check with
    PASS/FAIL; exit code 0 when all pass, 1 otherwise.
    """
    if workdir is not None:
        if os.path.isdir(workdir) and os.listdir(workdir):
            raise CliError(f"--dir {workdir!r} is not empty; the demo writes its checkpoints into a new or "
                           "empty folder. Pass another --dir, or leave it out for a temporary folder.")
        os.makedirs(workdir, exist_ok=True)
    _quiet_tensorflow()
    from .demo import run_demo

    click.echo("Running the ckptmerge demo (imports TensorFlow: a few seconds) ...", err=True)
    with _tf_startup_silenced(_verbose()):
        import tensorflow as tf

        tf.constant(0)  # device set-up, with its own chatter
    result = run_demo(workdir)
    click.echo(f"Demo folder: {result.workdir}")
    for title, text in result.steps:
        click.echo(f"\n== {title} ==\n{text}")
    click.echo("\n== Checks ==")
    for description, ok in result.checks:
        click.echo(f"{'PASS' if ok else 'FAIL'}  {description}")
    n_fail = sum(1 for _, ok in result.checks if not ok)
    if result.ok:
        click.echo(f"All {plural(len(result.checks), 'check')} passed.")
    else:
        click.echo(f"{n_fail} of {plural(len(result.checks), 'check')} FAILED.")
        raise SystemExit(EXIT_FINDINGS)


# ============================================================================================
# check, plan, merge: config-driven
# ============================================================================================


def _load_config(path: str) -> Any:
    from .config import load_config

    return load_config(path)


@cli.command("check", short_help="Validate a config file.")
@click.argument("config", metavar="CONFIG")
def check_command(config: str) -> None:
    """Validate the config file CONFIG (YAML, TOML or JSON) without opening any checkpoint.

    Prints 'OK: N sources' (exit 0), or every problem, one per line as FILE:LINE KEYPATH:
    message (exit 2).
    """
    cfg = _load_config(config)
    click.echo(f"OK: {plural(len(cfg.sources), 'source')}")


def _import_function(spec: str) -> Callable[[], Any]:
    """``module:function`` or ``path/to/file.py:function`` -> the function."""
    mod_name, sep, func_name = spec.rpartition(":")
    if not sep or not mod_name or not func_name:
        raise CliError(f"--model expects MODULE:FUNCTION or path/to/file.py:FUNCTION, e.g. "
                       f"--model mymodels:build_model. Received: {spec!r}")
    try:
        if mod_name.endswith(".py") or os.sep in mod_name or "/" in mod_name:
            if not os.path.isfile(mod_name):
                raise CliError(f"--model {spec!r}: file {mod_name!r} does not exist.")
            name = "_ckptmerge_model_" + re.sub(r"\W", "_", os.path.splitext(os.path.basename(mod_name))[0])
            loader_spec = importlib.util.spec_from_file_location(name, mod_name)
            if loader_spec is None or loader_spec.loader is None:
                raise CliError(f"--model {spec!r}: cannot load {mod_name!r} as a Python module.")
            module = importlib.util.module_from_spec(loader_spec)
            sys.modules[name] = module
            loader_spec.loader.exec_module(module)
        else:
            if os.getcwd() not in sys.path and "" not in sys.path:
                sys.path.insert(0, os.getcwd())  # as `python -m` would: modules next to the user
            module = importlib.import_module(mod_name)
    except CliError:
        raise
    except ImportError as e:
        raise CliError(f"--model {spec!r}: cannot import module {mod_name!r}: {e}. Pass a module on "
                       "the Python path (run from its folder) or a file path, e.g. models.py:build.") from None
    except Exception as e:  # noqa: BLE001 - the user's module failed while loading: say so in one line
        logger.info("importing %s failed:", mod_name, exc_info=True)
        raise CliError(f"--model {spec!r}: importing {mod_name!r} raised {type(e).__name__}: {e} "
                       "(ckptmerge -v plan/merge ... shows the traceback)") from None
    func = getattr(module, func_name, None)
    if func is None or not callable(func):
        public = [n for n in dir(module) if not n.startswith("_") and callable(getattr(module, n, None))]
        raise CliError(f"--model {spec!r}: module {mod_name!r} has no function {func_name!r}."
                       f"{did_you_mean(func_name, public)}")
    return func


def _quiet_tensorflow() -> None:
    """TF's C++ start-up chatter is noise on a command line (the user's setting wins)."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


@contextlib.contextmanager
def _tf_startup_silenced(verbose: bool) -> Iterator[None]:
    """Silence file descriptor 2 while TensorFlow starts (imports, first device set-up).

    Recent TF writes "oneDNN ...", "Could not find cuda drivers ..." and the like from C++ before
    its logging is configured, ignoring TF_CPP_MIN_LOG_LEVEL. Python errors still surface (they
    are raised, and printed once stderr is back); ``-v`` keeps everything.
    """
    if verbose:
        yield
        return
    try:
        sys.stderr.flush()
        saved = os.dup(2)
        devnull = os.open(os.devnull, os.O_WRONLY)
    except (OSError, ValueError):  # pragma: no cover - no real fd 2 (embedded interpreters)
        yield
        return
    os.dup2(devnull, 2)
    try:
        yield
    finally:
        sys.stderr.flush()
        os.dup2(saved, 2)
        os.close(saved)
        os.close(devnull)


def _verbose() -> bool:
    ctx = click.get_current_context(silent=True)
    root = ctx.find_root() if ctx is not None else None
    return bool(root is not None and root.params.get("verbose"))


def _model_target(spec: str) -> Any:
    """Import and call the --model function; returns what it built (imports TensorFlow)."""
    _quiet_tensorflow()
    with _tf_startup_silenced(_verbose()):
        import tensorflow as tf

        tf.constant(0)
    func = _import_function(spec)
    try:
        target = func()
    except CkptMergeError:
        raise
    except Exception as e:  # noqa: BLE001 - the user's function failed: say so in one line
        logger.info("%s() failed:", getattr(func, "__name__", spec), exc_info=True)
        raise CliError(f"--model {spec!r}: {getattr(func, '__name__', 'the function')}() raised "
                       f"{type(e).__name__}: {e} (ckptmerge -v plan/merge ... shows the traceback)") from None
    import tensorflow as tf

    from .targets import _is_keras_object

    ok = (_is_keras_object(target) or isinstance(target, tf.Module)
          or (isinstance(target, (list, tuple, dict)) and bool(target)))
    if not ok:
        kind = type(target).__name__
        got = "None" if target is None else f"{'an' if kind[:1].lower() in 'aeiou' else 'a'} {kind}"
        raise CliError(f"--model {spec!r}: {getattr(func, '__name__', 'the function')}() returned {got}; "
                       "it must return a Keras model, a tf.Module, or a non-empty list/dict of variables.")
    return target


def _checkpoint_specs(path: str, step: Optional[int], what: str) -> List[VariableInfo]:
    from .api import list_variables

    specs = list_variables(path, step=step, optimizer=False)
    if not specs:
        raise CliError(f"{what} checkpoint {path!r} holds no model variables (only optimizer state "
                       "or bookkeeping), so it cannot serve as a target.")
    return specs


def _close_plan(plan: Any) -> None:
    binding = getattr(plan, "_binding", None)
    if binding is not None and hasattr(binding, "close"):
        binding.close()


def _blocking(plan: Any, strict: bool) -> List[str]:
    return list(plan.blocking(strict=strict))


@cli.command("plan", short_help="Dry run: what a config would restore, and every finding.")
@click.argument("config", metavar="CONFIG")
@click.option("--target", "target_path", metavar="PATH",
              help="A checkpoint whose model variables (names, shapes, dtypes) are the target.")
@click.option("--target-step", type=click.IntRange(min=0), default=None, metavar="N",
              help="With a --target directory: its checkpoint of step N.")
@click.option("--model", "model_spec", metavar="MODULE:FUNCTION",
              help="A function that builds the target model (imports TensorFlow); MODULE may be "
                   "a path/to/file.py.")
@click.option("--all", "show_all", is_flag=True, help="Show every line of each section (no '... and N more').")
@_JSON
def plan_command(config: str, target_path: Optional[str], target_step: Optional[int], model_spec: Optional[str],
                 show_all: bool, as_json: bool) -> None:
    """Dry run: show what the config CONFIG would restore into a target, and every finding.

    The target is --target PATH (a checkpoint), --model MODULE:FUNCTION, or the config's
    'target' key. Nothing is restored or written. Exit code 0 when nothing blocks the restore
    (strict unless the config says strict: false), 1 when findings remain, 2 on config or
    input errors. --json prints plan.to_dict() (keys: ok, blocking, options, targets,
    sources, assignments, missing, mismatched, conflicts, unmatched_rules, unused, ...).
    """
    from .api import plan as make_plan

    if target_path is not None and model_spec is not None:
        raise CliError("pass either --target PATH or --model MODULE:FUNCTION, not both.")
    if target_step is not None and target_path is None:
        raise CliError("--target-step needs --target PATH.")
    cfg = _load_config(config)
    sources = cfg.make_sources()
    if model_spec is not None:
        target = _model_target(model_spec)
    elif target_path is not None:
        target = _checkpoint_specs(target_path, target_step, "--target")
    elif cfg.target is not None:
        target = _checkpoint_specs(cfg.target, None, "The config's 'target'")
    else:
        raise CliError(f"no target to plan against: pass --target PATH (a checkpoint) or --model "
                       f"MODULE:FUNCTION, or set 'target: PATH' in {config}.")
    plan = make_plan(target, sources, **cfg.plan_options)
    try:
        blocking = _blocking(plan, cfg.strict)
        if as_json:
            _echo_json(plan.to_dict())
        else:
            click.echo(plan.report(limit=None if show_all else 50))
            if not cfg.strict:
                click.echo("strict: false in the config: "
                           + ("nothing blocks the restore." if not blocking
                              else f"{plural(len(blocking), 'finding')} still block it."))
    finally:
        _close_plan(plan)
    if blocking:
        if not as_json:
            click.echo(_CONFIG_KEYS_HINT, err=True)
        raise SystemExit(EXIT_FINDINGS)


class _ProgressBar:
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


@cli.command("merge", short_help="Write a new checkpoint assembled from several.")
@click.argument("config", metavar="CONFIG")
@click.option("-o", "--output", "out_prefix", metavar="OUT_PREFIX",
              help="Prefix of the checkpoint to write (OUT_PREFIX.index + .data-*); default: the "
                   "config's 'output' key.")
@click.option("--template", "template_path", metavar="PATH",
              help="A checkpoint whose model variables the output holds, exactly (names, shapes, "
                   "dtypes); its own values fill what no source provides.")
@click.option("--model", "model_spec", metavar="MODULE:FUNCTION",
              help="A function that builds a model whose variables the output holds (imports "
                   "TensorFlow); MODULE may be a path/to/file.py.")
@click.option("--force", is_flag=True, help="Overwrite an existing checkpoint at OUT_PREFIX.")
@click.option("--dry-run", is_flag=True, help="Plan and report what would be written; write nothing.")
@click.option("--update-state", is_flag=True,
              help="Also write/update the 'checkpoint' state file of OUT_PREFIX's directory.")
@click.option("--durable", is_flag=True,
              help="fsync every file before it is moved into place (survives a power loss; slower).")
@click.option("--quiet", "-q", is_flag=True, help="No progress bar; print only the summary line.")
@_JSON
def merge_command(config: str, out_prefix: Optional[str], template_path: Optional[str], model_spec: Optional[str],
                  force: bool, dry_run: bool, update_state: bool, durable: bool, quiet: bool,
                  as_json: bool) -> None:
    """Write a new checkpoint assembled from the sources of CONFIG, without model code.

    Without a template the output holds every name the sources give after their rules; with
    --template PATH or --model MODULE:FUNCTION exactly the template's names and shapes (the
    plan's findings apply). The output is a standard TF checkpoint, written atomically; an
    existing one is kept unless --force. A progress bar shows on a terminal unless --quiet.
    Exit code 0 on success, 1 when findings block the merge (nothing is written), 2 on config
    or input errors. --json prints the report (report.to_dict(): summary, restored, skipped,
    output, dry_run, bytes_written, plan, ...).
    """
    if template_path is not None and model_spec is not None:
        raise CliError("pass either --template PATH or --model MODULE:FUNCTION, not both.")
    from .offline import merge

    cfg = _load_config(config)
    out = out_prefix if out_prefix is not None else cfg.output
    if out is None:
        raise CliError(f"no output: pass -o OUT_PREFIX, or set 'output: PREFIX' in {config}.")
    sources = cfg.make_sources()
    template: Any = template_path
    if model_spec is not None:
        from .targets import collect_targets

        template = list(collect_targets(_model_target(model_spec)).infos)
    progress = _ProgressBar("Merging") if (not quiet and not as_json and _stderr_is_tty()) else None
    options = dict(cfg.plan_options)
    try:
        report = merge(sources, out, template=template, allow_missing=options.get("allow_missing", ()),
                       on_conflict=options.get("on_conflict", "error"),
                       on_shape_mismatch=options.get("on_shape_mismatch", "error"),
                       cast=options.get("cast", False), strict=cfg.strict, overwrite=force, dry_run=dry_run,
                       update_state=update_state, progress=progress, verify=options.get("verify", True),
                       durable=durable)
    except PlanError as e:
        if dry_run and e.plan is not None:  # a dry run is for reading the findings: show them all
            click.echo(_json_text(e.plan.to_dict(), 0, 2) if as_json else e.plan.report())
        raise
    finally:
        if progress is not None:
            progress.close()
    if as_json:
        _echo_json(report.to_dict())
    elif quiet:
        click.echo(report.summary())
    else:
        if dry_run:
            click.echo(report.plan.report())
        click.echo(report.render())


def _stderr_is_tty() -> bool:
    try:
        return sys.stderr.isatty()
    except (AttributeError, ValueError):
        return False


# ============================================================================================
# Entry point
# ============================================================================================


def main(argv: Optional[Sequence[str]] = None) -> None:
    """Run the ``ckptmerge`` command line (the console script and ``python -m ckptmerge``).

    Example:
        >>> main(["--version"])  # doctest: +SKIP
        ckptmerge 0.1.0
    """
    # Objects made while importing live until exit: take them out of the cyclic collector's
    # reach, so the collections triggered while parsing a large index stay cheap (~10% of
    # `ckptmerge ls` on 10,000 variables).
    gc.freeze()
    cli.main(args=list(argv) if argv is not None else None, prog_name="ckptmerge",
             obj={"configure_logging": True})
