"""Inspection commands: ``ls``, ``show``, ``diff`` and ``checkpoints`` (TensorFlow-free)."""

from __future__ import annotations

import bisect
import datetime
import fnmatch
import functools
import math
import operator
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

from ..alignment.keraspaths import LayerEntries, PathAlignment, align_paths
from ..core.errors import UnreadableTensorError, did_you_mean
from ..formats.io.urlpath import relative_to
from ..core.gcpause import paused_gc
from ..core.jsonout import Records
from ..formats.keras.names import layer_of
from ..planning.kerascompat import KerasVerdict, compare_legacy_files, compare_weights_files
from ..planning.patterns import PatternError, UserPattern, compile_pattern
from ..core.redact import redact
from ..core.specs import KIND_VARIABLE, VariableInfo, model_variables, normalize_name
from ..core.text import escape_name, human_bytes, plural, quote_name
from .common import (
    EXIT_FINDINGS,
    JSON_OPTION,
    NO_VERIFY_OPTION,
    STATS_CHUNK,
    STEP_OPTION,
    CliError,
    Opened,
    cli,
    echo_json,
    open_checkpoint_arg,
    shape_text,
    table,
    table_pieces,
)

# ============================================================================================
# ls
# ============================================================================================


_size_text = functools.lru_cache(maxsize=4096)(human_bytes)  # a listing repeats a few sizes many times


def _filter(infos: Iterable[VariableInfo], globs: Sequence[str], regex: Optional[UserPattern]) -> List[VariableInfo]:
    if not globs and regex is None:
        return list(infos)
    out = []
    for v in infos:
        names = (v.name, v.raw_key) if v.raw_key != v.name else (v.name,)
        if globs and not any(fnmatch.fnmatchcase(n, g) for g in globs for n in names):
            continue
        if regex is not None and not any(regex.search(n) for n in names):
            continue
        out.append(v)
    return out


def _compile_regex(pattern: Optional[str]) -> Optional[UserPattern]:
    if pattern is None:
        return None
    try:
        return compile_pattern(pattern)
    except PatternError as e:
        raise CliError(f"invalid --regex {quote_name(pattern)}: {e.detail}. Use a regular expression in RE2 "
                       "syntax, e.g. --regex 'enc.*/kernel$' (it is searched anywhere in the name).") from None


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

    return chunk_stats([np.asarray(value)], dtype)


def chunk_stats(chunks: Iterable[Any], dtype: str) -> Optional[Dict[str, Any]]:
    """:func:`tensor_stats` of a tensor given in pieces (``reader.iter_chunks(name)``), holding
    one piece at a time; None if not numeric (the pieces are then not read).

    Example:
        >>> import numpy as np
        >>> chunk_stats([np.array([1.0, np.inf]), np.array([3.0])], "float64")["max"]
        3.0
    """
    import numpy as np

    kind = _numeric_kind(dtype)
    if kind is None:
        return None
    n_nan = n_inf = count = 0
    lo, hi = math.inf, -math.inf
    total = total_sq = 0.0
    shift = None  # subtract the first finite value: a stable one-pass variance
    for piece in chunks:
        flat = np.asarray(piece).reshape(-1)
        for start in range(0, flat.size, STATS_CHUNK):
            chunk = flat[start:start + STATS_CHUNK].astype(np.float64)
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
                    v.dtype, shape_text(v.shape), human_bytes(v.nbytes)]
                if stats is not None:
                    row += _stats_cells(stats.get(v.name))
                rows.append(row)

    walk(root, 0)
    return rows


@cli.command("ls", short_help="List a checkpoint's variables: name, dtype, shape, size.")
@click.argument("path")
@STEP_OPTION
@click.option("--match", "globs", multiple=True, metavar="GLOB",
              help="Only names (or raw keys) matching this glob, e.g. 'enc*/kernel'. Repeatable.")
@click.option("--regex", metavar="RE", help="Only names (or raw keys) in which this regex (RE2 syntax: linear time) is found.")
@click.option("--tree", is_flag=True, help="Group by scope, with each scope's size and count.")
@click.option("--all", "show_all", is_flag=True,
              help="Also list optimizer state and bookkeeping, with each tensor's kind and raw key.")
@click.option("--stats", is_flag=True, help="Add min/max/mean/std and NaN/Inf counts (reads the values).")
@click.option("--sort", type=click.Choice(["name", "size"]), default="name", show_default=True,
              help="Order by name, or by size (largest first).")
@NO_VERIFY_OPTION
@JSON_OPTION
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
    opened = open_checkpoint_arg(path, step, verify=not no_verify)
    with opened.reader as reader:
        everything = reader.variables()
        pool = everything if show_all else model_variables(everything)
        shown = _filter(pool, globs, pattern)
        if sort == "size":
            shown.sort(key=lambda v: (-v.nbytes, v.name))
        values_stats: Optional[Dict[str, Optional[Dict[str, Any]]]] = None
        if stats:
            # piece by piece: memory for one piece, whatever the size of the tensor
            values_stats = {v.name: (chunk_stats(reader.iter_chunks(v.name, STATS_CHUNK), v.dtype)
                                     if _numeric_kind(v.dtype) else None) for v in shown}
    if as_json:
        def record(v: VariableInfo) -> Dict[str, Any]:
            d = v.to_dict()
            if values_stats is not None:
                d["stats"] = values_stats[v.name]
            return d
        echo_json(Records(map(record, shown)), expand=1)  # (made while written)
        return

    click.echo(opened.header())
    if tree:
        rows = _tree_rows(shown, by_size=sort == "size", show_kind=show_all, stats=values_stats)
        size_col = 3 + (1 if show_all else 0)
        right = [size_col] + ([size_col + 1 + i for i in range(6)] if values_stats is not None else [])
        if rows:
            click.echo(table(rows, right=right))
    elif shown:  # column by column, printed a piece at a time (see table_pieces)
        header = ["NAME"] + (["KIND"] if show_all else []) + ["DTYPE", "SHAPE", "SIZE"]
        columns = [list(map(_NAME, shown))] + ([[v.kind for v in shown]] if show_all else []) + [
            list(map(_DTYPE, shown)), [shape_text(v.shape) for v in shown], [_size_text(v.nbytes) for v in shown]]
        size_col = len(header) - 1
        if values_stats is not None:
            header += _STATS_HEADER
            columns += [list(c) for c in zip(*[_stats_cells(values_stats[v.name]) for v in shown])]
        if show_all:
            header.append("KEY")
            columns.append([v.raw_key for v in shown])
        right = [size_col] + ([size_col + 1 + i for i in range(6)] if values_stats is not None else [])
        for piece in table_pieces(columns, right=right, header=header):
            click.echo(piece)
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
    click.echo(total)


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


def _unknown_name(opened: Opened, name: str) -> CliError:
    infos = opened.reader.variables()
    n_vars = sum(1 for v in infos if v.kind == KIND_VARIABLE)
    candidates = [v.name for v in infos] + [v.raw_key for v in infos if v.raw_key != v.name]
    return CliError(
        f"Variable {quote_name(name)} not found in checkpoint {quote_name(opened.given)} "
        f"({escape_name(opened.prefix)})."
        f"{did_you_mean(name, candidates)} Run {opened.ls_command()} to list its "
        f"{plural(n_vars, 'variable')}.")


@cli.command("show", short_help="Print one tensor's values.")
@click.argument("path")
@click.argument("name")
@STEP_OPTION
@NO_VERIFY_OPTION
@JSON_OPTION
def show_command(path: str, name: str, step: Optional[int], no_verify: bool, as_json: bool) -> None:
    """Print the values of tensor NAME of the checkpoint at PATH.

    NAME is a name as 'ckptmerge ls' shows it, or a raw checkpoint key. Small tensors are
    printed in full, large ones summarised (numpy's print options). --json prints an object
    with name, key, kind, dtype, shape and value (nested lists; complex numbers as [re, im]
    pairs; NaN and infinities as the strings "nan", "inf", "-inf"; strings as text when valid
    UTF-8, else as a list of byte values).
    """
    import numpy as np

    opened = open_checkpoint_arg(path, step, verify=not no_verify)
    with opened.reader as reader:
        if name not in reader:
            raise _unknown_name(opened, name)
        info = reader.info(name)
        value = reader.get(info.name)
    if as_json:
        echo_json({"name": info.name, "key": info.raw_key, "kind": info.kind, "dtype": info.dtype,
                    "shape": list(info.shape), "value": value_to_json(value, info.dtype)}, expand=0)
        return
    head = f"{info.name}  {info.dtype}  {shape_text(info.shape)}  {human_bytes(info.nbytes)}"
    if info.raw_key != info.name:
        head += f"  key={info.raw_key}"
    click.echo(escape_name(head))
    click.echo(np.array2string(np.asarray(value), separator=", "))


# ============================================================================================
# diff
# ============================================================================================


def max_abs_diff(a: Any, b: Any) -> Optional[float]:
    """Largest ``|a - b|``; 0.0 when the tensors are equal.

    Equal values count as equal (``inf`` and ``inf``, ``0.0`` and ``-0.0``), and so does NaN
    facing NaN at the same place. Returns ``None`` for tensors without a numeric difference
    (strings), and ``nan`` when NaN faces a number somewhere.

    Example:
        >>> import numpy as np
        >>> max_abs_diff(np.array([1.0, 2.0]), np.array([1.0, 2.5]))
        0.5
        >>> max_abs_diff(np.array([np.inf, np.nan]), np.array([np.inf, np.nan]))
        0.0
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

    def same(x: Any, y: Any) -> Any:  # equal values, or NaN facing NaN
        return (x == y) | (np.isnan(x) & np.isnan(y))

    if a.dtype.kind == "c" or b.dtype.kind == "c":
        a, b = a.astype(np.complex128), b.astype(np.complex128)
        equal = same(a.real, b.real) & same(a.imag, b.imag)
    else:
        a, b = a.astype(np.float64), b.astype(np.float64)
        equal = same(a, b)
    if equal.all():
        return 0.0
    with np.errstate(invalid="ignore", over="ignore"):
        d = np.abs(a[~equal] - b[~equal])  # never inf - inf: equal infinities were left out
    if np.isnan(d).any():
        return math.nan
    return float(d.max())


def _strings_equal(a: Any, b: Any) -> bool:
    import numpy as np

    return bool(np.array_equal(np.asarray(a), np.asarray(b)))


def _paired(xs: Iterable[Any], ys: Iterable[Any]) -> Iterator[Tuple[Any, Any]]:
    """Pairs of equally long pieces from two streams of flat pieces of equally long tensors
    (the streams may cut them in different places). Both streams are read to their end, so
    their checksums are checked."""
    xs, ys = iter(xs), iter(ys)
    a = b = None
    while True:
        if a is None or not len(a):
            a = next(xs, None)
        if b is None or not len(b):
            b = next(ys, None)
        if a is None or b is None:
            break
        n = min(len(a), len(b))
        if n:
            yield a[:n], b[:n]
        a, b = a[n:], b[n:]
    for _ in xs:
        pass
    for _ in ys:
        pass


def _compare_values(ra: Any, rb: Any, name: str) -> Tuple[Optional[float], bool]:
    """``(max abs diff, equal)`` of tensor ``name`` in readers ``ra`` and ``rb`` (same shape),
    read in pieces of at most ``STATS_CHUNK`` elements: memory for two pieces, whatever the
    tensor's size. See :func:`max_abs_diff`; strings have no difference (``None``)."""
    worst: Optional[float] = 0.0
    equal = True
    for xa, xb in _paired(ra.iter_chunks(name, STATS_CHUNK), rb.iter_chunks(name, STATS_CHUNK)):
        d = max_abs_diff(xa, xb)
        if d is None:
            worst = None
            equal = equal and _strings_equal(xa, xb)
        elif worst is not None and not math.isnan(worst):
            worst = d if math.isnan(d) else max(worst, d)
    return worst, equal if worst is None else worst == 0.0


@cli.command("diff", short_help="Compare two checkpoints (names, shapes, dtypes, values).")
@click.argument("a", metavar="A")
@click.argument("b", metavar="B")
@click.option("--step-a", type=click.IntRange(min=0), default=None, metavar="N", help="Step of A (a directory).")
@click.option("--step-b", type=click.IntRange(min=0), default=None, metavar="N", help="Step of B (a directory).")
@click.option("--values", is_flag=True, help="Also compare values: max absolute difference per common tensor.")
@click.option("--all", "show_all", is_flag=True, help="Include optimizer state and bookkeeping.")
@NO_VERIFY_OPTION
@JSON_OPTION
def diff_command(a: str, b: str, step_a: Optional[int], step_b: Optional[int], values: bool, show_all: bool,
                 no_verify: bool, as_json: bool) -> None:
    """Compare the checkpoints A and B: names only in A, only in B, shape/dtype differences.

    With --values also the values of the tensors both hold with the same shape, read in
    bounded pieces (memory stays small whatever the tensor's size); equal values are equal
    (inf and inf too), and so is NaN facing NaN at the same place. Exit code 0 when equal, 1
    when different. --json prints
    an object with a, b, equal, only_in_a, only_in_b, mismatched and (with --values) values:
    one {name, max_abs_diff, equal} per compared tensor (max_abs_diff is null for strings and
    the string "nan" when NaN faces a number) and not_compared: the names of tensors without
    values ckptmerge can read (e.g. HDF5 compound or reference datasets, listed as hdf5-*).
    """
    oa = open_checkpoint_arg(a, step_a, verify=not no_verify)
    try:
        ob = open_checkpoint_arg(b, step_b, verify=not no_verify)
    except BaseException:
        oa.reader.close()
        raise
    # (paused_gc: two listings of 100,000s of small acyclic objects; see ckptmerge.core.gcpause)
    with oa.reader as ra, ob.reader as rb, paused_gc():
        def pool(r: Any) -> List[VariableInfo]:
            return r.variables() if show_all else model_variables(r.variables())
        only_a, only_b, common = _sorted_diff(pool(ra), pool(rb))
        mismatched = [(x, y) for x, y in common if x.shape != y.shape or x.dtype != y.dtype]
        compared: List[Dict[str, Any]] = []
        not_compared: List[Tuple[VariableInfo, VariableInfo]] = []  # no values to read (e.g. HDF5 compound)
        if values:
            for x, y in common:
                if x.shape != y.shape:
                    continue
                try:
                    d, eq = _compare_values(ra, rb, x.name)
                except UnreadableTensorError:
                    not_compared.append((x, y))
                    continue
                compared.append({"name": x.name, "max_abs_diff": d, "equal": eq})
        keras = keras_verdict(ra, rb)
        renamed = renamed_layers(ra, rb, only_a, only_b) if keras is not None else None
    value_diffs = [c for c in compared if not c["equal"]]
    equal = not (only_a or only_b or mismatched or value_diffs)

    if as_json:
        echo_json({
            "a": redact(oa.prefix), "b": redact(ob.prefix), "equal": equal, "only_in_a": Records(map(_NAME, only_a)),
            "only_in_b": Records(map(_NAME, only_b)),
            "mismatched": [{"name": x.name, "a": {"dtype": x.dtype, "shape": list(x.shape)},
                            "b": {"dtype": y.dtype, "shape": list(y.shape)}} for x, y in mismatched],
            **({"values": [{**c, "max_abs_diff": (c["max_abs_diff"] if c["max_abs_diff"] is None
                                                  else _finite_or_text(c["max_abs_diff"]))}
                           for c in compared], "not_compared": [x.name for x, _ in not_compared]} if values else {}),
            **({"keras": keras.to_dict()} if keras is not None else {}),
            **({"renamed": [{"a": m.file, "b": m.model, "confidence": round(m.confidence, 4),
                             "evidence": list(m.evidence)} for m in renamed.matches],
                "renamed_unresolved": [{"a": list(fa), "b": list(fb), "reason": why}
                                       for fa, fb, why in renamed.unresolved]} if renamed is not None else {}),
        })
        if not equal:
            raise SystemExit(EXIT_FINDINGS)
        return

    # Printed a section, and a piece of a long listing, at a time: the text of 100,000s of
    # names is never held whole.
    click.echo(escape_name(f"A: {oa.prefix} ({oa.note})") + "\n" + escape_name(f"B: {ob.prefix} ({ob.note})"))

    def section(title: str, items: List[str]) -> None:
        if items:
            click.echo(f"{title} ({len(items)}):")
            click.echo("\n".join(f"  {escape_name(i)}" for i in items))

    def listing(title: str, infos: List[VariableInfo]) -> None:
        if infos:
            click.echo(f"{title} ({len(infos)}):")
            columns = [list(map(_NAME, infos)), list(map(_DTYPE, infos)), [shape_text(v.shape) for v in infos]]
            for piece in table_pieces(columns, indent="  "):
                click.echo(piece)

    listing("Only in A", only_a)
    listing("Only in B", only_b)
    if renamed is not None:  # the same layer under another path: the pair, not two lists
        section("Renamed paths - the same layer's entries under another path in B",
                [f"{m.file or 'root'} <-> {m.model or 'root'} ({m.confidence:.2f}: {'; '.join(m.evidence)})"
                 for m in renamed.matches]
                + [f"undecided: A {', '.join(fa)} / B {', '.join(fb)}: {why}" for fa, fb, why in renamed.unresolved])
    section("Shape/dtype differ", [f"{x.name}: A {x.dtype} {shape_text(x.shape)}, B {y.dtype} {shape_text(y.shape)}"
                                   for x, y in mismatched])
    section("Values differ", [
        f"{c['name']}: " + ("strings differ" if c["max_abs_diff"] is None else f"max abs diff {c['max_abs_diff']:.6g}")
        for c in value_diffs])
    section("Values not readable, not compared", [
        f"{x.name}: {x.dtype}" if x.dtype == y.dtype else f"{x.name}: A {x.dtype}, B {y.dtype}"
        for x, y in not_compared])
    if keras is not None:  # what Keras's own load_weights would do: B's model loading A
        click.echo("Keras (a model saved as B, loading A with load_weights):")
        click.echo("\n".join(f"  {escape_name(line)}" for line in keras.lines()))
    what = "names, dtypes, shapes" + (" and values" if values else "")
    if equal:
        click.echo(f"Equal: {plural(len(common), 'variable' if not show_all else 'tensor')}, same {what}"
                   + (f" ({len(compared)} compared{f', {len(not_compared)} not' if not_compared else ''})"
                      if values else ""))
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
        click.echo("Different: " + ", ".join(parts))
    if not equal:
        raise SystemExit(EXIT_FINDINGS)


_NAME, _DTYPE = operator.attrgetter("name"), operator.attrgetter("dtype")


def _weight(key: str, layer: str) -> str:
    """A legacy file's weight name from its dataset key (``model_weights/d/seq/d/kernel`` -> ``seq/d/kernel``)."""
    if key.startswith("model_weights/"):
        key = key[len("model_weights/"):]
    return normalize_name(key[len(layer) + 1:])


def keras_verdict(old: Any, new: Any) -> Optional[KerasVerdict]:
    """What a model saved as the Keras weights file ``new`` would do loading ``old`` with
    ``load_weights`` (see :mod:`ckptmerge.planning.kerascompat`), when both readers are Keras
    weights files of one kind (Keras 3, or legacy ``.h5``); else ``None``.

    Example:
        >>> keras_verdict(open_checkpoint("old.weights.h5"), open_checkpoint("new.weights.h5")).outcome  # doctest: +SKIP
        'fail'
    """
    if getattr(old, "format", None) != "keras-h5" or getattr(new, "format", None) != "keras-h5":
        return None
    la, lb = getattr(old, "legacy", None), getattr(new, "legacy", None)
    if la is not None and lb is not None:
        shapes_a = {v.raw_key: v.shape for v in old.variables()}
        shapes_b = {v.raw_key: v.shape for v in new.variables()}
        return compare_legacy_files([(n, [(_weight(k, n), shapes_a[k]) for k in keys]) for n, keys in la.layers],
                                    [(n, [(_weight(k, n), shapes_b[k]) for k in keys]) for n, keys in lb.layers])
    if la is not None or lb is not None:
        return None
    shapes_a = {v.raw_key: v.shape for v in old.variables() if layer_of(v.raw_key) is not None}
    shapes_b = {v.raw_key: v.shape for v in new.variables() if layer_of(v.raw_key) is not None}
    if not shapes_a or not shapes_b:
        return None
    return compare_weights_files(shapes_a, shapes_b, getattr(new, "layer_names", {}))


def renamed_layers(old: Any, new: Any, only_a: Sequence[VariableInfo],
                   only_b: Sequence[VariableInfo]) -> Optional[PathAlignment]:
    """The layers of two Keras 3 weights files whose entries are all only in one of them, paired
    across the files where the structure is certain (:func:`~ckptmerge.alignment.keraspaths.align_paths`:
    the same entries, and the path and name tokens decide); ``None`` when there is nothing to pair.

    Example:
        >>> renamed_layers(a, b, only_a, only_b).matches[0].model  # doctest: +SKIP
        'encoder/dense_1'
    """
    if getattr(old, "legacy", None) is not None or getattr(new, "legacy", None) is not None:
        return None

    def layers(reader: Any, only: Sequence[VariableInfo]) -> List[LayerEntries]:
        alone = {v.raw_key for v in only}
        groups: Dict[str, List[Tuple[str, Tuple[int, ...], str]]] = {}
        partial = set()
        for v in reader.variables():
            head = layer_of(v.raw_key)
            if head is None or v.kind != KIND_VARIABLE:
                continue
            if v.raw_key not in alone:
                partial.add(head)
            groups.setdefault(head, []).append((v.raw_key.rpartition("/")[2], tuple(v.shape), v.dtype))
        names = getattr(reader, "layer_names", {})
        return [LayerEntries(g, names.get(g, ""), tuple(sorted(e, key=lambda x: (len(x[0]), x[0]))))
                for g, e in sorted(groups.items()) if g not in partial]

    la, lb = layers(old, only_a), layers(new, only_b)
    if not la or not lb:
        return None
    found = align_paths(la, lb)
    return found if found.matches or found.unresolved else None


def _sorted_diff(a: List[VariableInfo], b: List[VariableInfo]
                 ) -> Tuple[List[VariableInfo], List[VariableInfo], List[Tuple[VariableInfo, VariableInfo]]]:
    """``(only in a, only in b, [(in a, in b)])`` of two lists sorted by unique names, in one
    walk (no set or dict of 100,000s of names)."""
    only_a: List[VariableInfo] = []
    only_b: List[VariableInfo] = []
    common: List[Tuple[VariableInfo, VariableInfo]] = []
    names_b = list(map(_NAME, b))
    j, nb = 0, len(b)
    for x in a:
        name = x.name
        if j < nb and names_b[j] < name:
            k = bisect.bisect_left(names_b, name, j)
            only_b += b[j:k]
            j = k
        if j < nb and names_b[j] == name:
            common.append((x, b[j]))
            j += 1
        else:
            only_a.append(x)
    only_b += b[j:]
    return only_a, only_b, common


# ============================================================================================
# checkpoints
# ============================================================================================


def _local_iso(t: float) -> str:
    return datetime.datetime.fromtimestamp(t).astimezone().isoformat(timespec="seconds")


@cli.command("checkpoints", short_help="List the checkpoints of a training directory.")
@click.argument("directory", metavar="DIR")
@JSON_OPTION
def checkpoints_command(directory: str, as_json: bool) -> None:
    """List every checkpoint in the training directory DIR: step, time, size, latest.

    The latest is the one the directory's 'checkpoint' state file names (marked with *).
    Times are local, ISO 8601. --json prints a list of objects with name (relative to DIR),
    path, step, time (epoch seconds), time_iso, size (bytes) and latest.
    """
    from ..core.args import local_path
    from ..sources.resolve import checkpoints
    from ..sources.runs import duplicate_steps

    infos = checkpoints(directory)
    where = local_path(directory)  # (a file:// URL is the local folder: names relative to it)

    def rel(p: str) -> str:
        return relative_to(p, where)

    if as_json:
        echo_json([{"name": redact(rel(c.path)), "path": redact(c.path), "step": c.step, "time": c.time,
                     "time_iso": _local_iso(c.time), "size": c.size, "latest": c.latest} for c in infos],
                   expand=1)
        return
    if not infos:
        click.echo(f"No checkpoint in {quote_name(directory)}.")
        return
    rows = [["*" if c.latest else "", "-" if c.step is None else str(c.step), _local_iso(c.time),
             human_bytes(c.size), rel(c.path)] for c in infos]
    total = f"{plural(len(infos), 'checkpoint')}, {human_bytes(sum(c.size for c in infos))}"
    if not any(c.latest for c in infos):
        import os

        from ..formats.io.urlpath import is_url
        from ..sources.files import prefix_exists
        from ..sources.resolve import read_state_file

        state = read_state_file(directory)
        named = state.model_checkpoint_path if state is not None else None
        recorded = state.recorded_model_checkpoint_path if state is not None else None
        if named and not is_url(named) and (prefix_exists(named) or os.path.lexists(named)):  # there, but left out
            total += (f"; the 'checkpoint' state file names {quote_name(rel(named))} as latest, which is left out "
                      f"(a file of it leads outside {quote_name(directory)})")
        elif named:
            total += f"; the 'checkpoint' state file names {quote_name(rel(named))} as latest, which is missing"
        elif recorded and recorded in state.outside:  # type: ignore[union-attr]
            total += (f"; the 'checkpoint' state file names {quote_name(recorded)} as latest, which is outside "
                      f"{quote_name(directory)} (not used)")
        else:
            total += "; no latest recorded (no 'checkpoint' state file naming one)"
    for step, paths in duplicate_steps(infos):
        total += (f"\n{len(paths)} checkpoints of step {step} ({', '.join(quote_name(rel(p)) for p in paths)}): a "
                  f"command that picks step {step} refuses it")
    click.echo(table(rows, right=[1, 3], header=["LATEST", "STEP", "TIME", "SIZE", "NAME"]) + "\n" + total)


