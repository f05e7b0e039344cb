"""The inputs of a combination: which checkpoints it takes, and how their names line up.

:func:`select_inputs` turns what :func:`~ckptmerge.combine` was given (a training directory with
``last``/``steps``/``every``, or a list of paths and sources) into the input sources;
:func:`line_up` takes the opened inputs (and the base) and makes one :class:`Entry` per output
tensor, applying the policies (``keys``, ``integers``, dtypes, optimizer state) and the
per-tensor parameters (``{glob: value}``), and the :class:`~ckptmerge.CombineReport` that says
what was combined, copied and left out. Nothing here reads a tensor.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Dict, List, Mapping, Optional, Sequence, Tuple, Union

from ..core.args import describe_value
from ..core.errors import ArgumentError, ArgumentTypeError, CombineError, did_you_mean
from ..core.specs import VariableInfo, model_variables
from ..core.text import plural, quote_name
from ..planning.casts import numpy_dtype
from ..planning.rulekinds import GlobFilter
from ..sources.files import step_of
from ..sources.opening import as_sources
from ..sources.resolve import checkpoints as list_checkpoints
from ..sources.runs import select_steps
from ..sources.source import Source
from ..sources.handles import SourceHandle
from .conventions import parameter_conventions
from .methods import TensorParams, ema_weights
from .params import Gradient, layer_positions, resolved, weight_problems
from .report import CombineReport

if TYPE_CHECKING:
    from .combine import CombinedSource

__all__ = ["FLOATS", "HALF", "Entry", "PerInput", "SubstringFilter", "choice", "glob_value", "pick", "select_steps",
           "select_inputs", "line_up", "handle_step", "is_float_dtype", "spec_text"]

#: the float dtypes a combination averages (the others are copied from one input)
FLOATS = ("float16", "bfloat16", "float32", "float64")
#: the half-precision floats that ``accumulate="float32"`` sums in float32
HALF = ("float16", "bfloat16")


# --------------------------------------------------------------------------------------------
# Arguments
# --------------------------------------------------------------------------------------------


def choice(value: Any, what: str, choices: Sequence[str]) -> str:
    """``value`` if it is one of ``choices``, else an :class:`~ckptmerge.ArgumentError` naming them.

    Example:
        >>> choice("union", "keys", ("strict", "intersection", "union"))
        'union'
    """
    if value not in choices:
        raise ArgumentError(f"{what} must be one of {', '.join(map(repr, choices))}. Received: {what}="
                            f"{describe_value(value)}.{did_you_mean(str(value), choices, cutoff=0.5)}")
    return value


@dataclass(frozen=True)
class SubstringFilter:
    """mergekit's ``filter``: a name matches when it contains the text (``"*"`` matches every name).

    Example:
        >>> SubstringFilter("mlp").matches("model.layers.0.mlp.up_proj.weight")
        True
    """

    pattern: str

    def matches(self, name: str) -> bool:
        return self.pattern == "*" or self.pattern in name


@dataclass(frozen=True)
class PerInput:
    """A parameter with one value per input, in input order (mergekit's per-model ``density``);
    each value a plain value or ``{filter: value}``.

    Example:
        >>> PerInput((0.5, {"mlp": 0.3, "*": 0.7})).values[1]["mlp"]
        0.3
    """

    values: Tuple[Any, ...]


def glob_value(value: Any, what: str, default: Any = None, conventions: str = "ckptmerge") -> Any:
    """A parameter: a plain value (a gradient list as a :class:`~.params.Gradient`), or
    ``{glob: value}`` (first matching glob wins) as a list; under mergekit's conventions the keys
    are substrings (:class:`SubstringFilter`); :class:`PerInput`: each input's value so."""
    if isinstance(value, PerInput):
        return PerInput(tuple(glob_value(v, what, default, conventions) for v in value.values))
    if isinstance(value, Mapping):
        if not value:
            raise ArgumentError(f"{what} is an empty dict: give a value, or {{glob: value}} with at least one glob "
                                "(end with '*' for the rest).")
        match = SubstringFilter if conventions == "mergekit" else GlobFilter
        return [(match(str(g)), resolved(what, v, default)) for g, v in value.items()]
    return resolved(what, value, default)


def pick(value: Any, name: str, default: Any) -> Tuple[Any, str]:
    """The value of a (possibly per-glob) parameter for ``name``, and the glob that chose it."""
    if isinstance(value, list):
        for glob, v in value:
            if glob.matches(name):
                return v, glob.pattern
        return default, ""
    return value, ""


def select_inputs(checkpoints: Any, last: Optional[int], steps: Any, every: Optional[int]) -> List[Source]:
    """The input sources: a directory expanded by its selection, or the paths/sources given."""
    if isinstance(checkpoints, (str, os.PathLike)):
        where = os.fspath(checkpoints)
        infos = list_checkpoints(where)
        if not infos:
            raise CombineError(f"{quote_name(where)} holds no checkpoint to combine. Pass a directory of a training run "
                               "(with last=N, steps=..., every=K), or a list of checkpoints.")
        chosen = select_steps(infos, last=last, steps=steps, every=every, where=where)
        return [Source(c.path, name=os.path.basename(c.path)) for c in chosen]
    if last is not None or steps is not None or every is not None:
        raise ArgumentError("last, steps and every select checkpoints of one training directory: pass the directory "
                            "as checkpoints (cm.combine('runs/A', last=5)), not a list.")
    if isinstance(checkpoints, Source) or not isinstance(checkpoints, (list, tuple)):
        raise ArgumentTypeError("checkpoints must be a training directory or a list of checkpoint paths, URLs or "
                                f"ckptmerge.Source objects. Received: checkpoints={describe_value(checkpoints)}")
    return as_sources(list(checkpoints))


@dataclass(frozen=True)
class Entry:
    """One output tensor: where each input holds it, and how it is made."""

    spec: VariableInfo                      # the output's name, shape, dtype
    inputs: Tuple[Tuple[int, str], ...]    # (input index, name in that input)
    base: Optional[str]                    # name in the base
    params: Optional[TensorParams]         # None: copied from inputs[0] (integers policy)


def spec_text(v: VariableInfo) -> str:
    """A tensor's dtype and shape as a report writes them: ``float32 (3, 4)``."""
    return f"{v.dtype} {tuple(v.shape)}"


# --------------------------------------------------------------------------------------------
# Lining up the inputs' names
# --------------------------------------------------------------------------------------------


def produced_names(h: SourceHandle, optimizer: bool) -> Tuple[Dict[str, Tuple[str, VariableInfo]], List[str], int]:
    """``{output name: (name in the input, spec)}`` after the input's own rules, the names two
    of its names both map to, and how many optimizer names were left out."""
    variables = h.all_variables if optimizer else model_variables(h.all_variables)
    left = len(h.all_variables) - len(variables)
    specs = {v.name: v for v in variables}
    res = h.source.rules(None).apply(sorted(specs))
    out: Dict[str, Tuple[str, VariableInfo]] = {}
    clashes = []
    for name, targets in res.mapping.items():
        for t in targets:
            if t in out:
                clashes.append(t)
            out[t] = (name, specs[name])
    for amb in res.ambiguous:
        clashes.append(amb.name)
    return out, sorted(set(clashes)), left


def is_float_dtype(dtype: str) -> bool:
    """Whether a tensor of this dtype is combined (floats are; the rest is copied from one input)."""
    return dtype in FLOATS


def line_up(src: CombinedSource, inputs: List[SourceHandle], base: Optional[SourceHandle],
             method: Any) -> Tuple[Dict[str, Entry], CombineReport]:
    """One :class:`Entry` per output tensor of ``src`` over its opened inputs, and the report.

    Raises:
        CombineError: the inputs do not line up under ``src.keys`` (every difference listed), an
            integer tensor under ``integers="error"``, or no tensor is left to combine.
    """
    labels = [h.label for h in inputs]
    produced = [produced_names(h, src.optimizer) for h in inputs]
    base_names = produced_names(base, src.optimizer)[0] if base is not None else {}
    n = len(inputs)
    problems: List[str] = []
    unfit: List[str] = []  # tensors whose parameters or weights do not fit them
    for h, (_, clashes, _) in zip(inputs, produced):
        for c in clashes:
            problems.append(f"{quote_name(c)}: two names of input {quote_name(h.label)} map to it (its rules)")
    every = sorted(set().union(*(p[0] for p in produced)))
    entries: Dict[str, Entry] = {}
    fewer: List[Tuple[str, int, int]] = []
    copied: List[Tuple[str, str, str]] = []
    left_out: List[Tuple[str, str]] = []
    dtypes: List[Tuple[str, str, str]] = []
    families: Dict[str, List[str]] = {}
    integer_names: List[str] = []
    conventions = src.conventions
    defaults = method.defaults_for(conventions)
    weights = [glob_value(w, f"weights[{i}]", None, conventions) for i, w in enumerate(src.weights)]
    params = {k: glob_value(v, k, defaults.get(k), conventions) for k, v in src.params.items()}
    positions = layer_positions(every)[0]  # (gradient lists: each name's place among the layers)
    strict = src.keys == "strict"
    nbytes_out = nbytes_read = 0
    for name in every:
        holders = [(j, produced[j][0][name]) for j in range(n) if name in produced[j][0]]
        specs = [s for _, (_, s) in holders]
        if len(holders) < n:
            where = [labels[j] for j in range(n) if name not in produced[j][0]]
            if strict:
                problems.append(f"{quote_name(name)} is missing from {', '.join(map(quote_name, where))}")
                continue
            if src.keys == "intersection":
                left_out.append((name, f"in {len(holders)} of {n} inputs (keys='intersection')"))
                continue
        shapes = {tuple(s.shape) for s in specs}
        kinds = {s.dtype for s in specs}
        if len(shapes) > 1 or (len(kinds) > 1 and not all(map(is_float_dtype, kinds))) or (strict and len(kinds) > 1):
            text = "; ".join(f"{spec_text(s)} in {quote_name(labels[j])}" for j, (_, s) in holders)
            if strict:
                problems.append(f"{quote_name(name)} differs: {text}")
            else:
                left_out.append((name, f"shapes or dtypes differ: {text}"))
            continue
        first = specs[0]
        is_float = all(map(is_float_dtype, kinds))
        if not is_float:  # integers, bools, strings: one input's value, as the policy says
            integer_names.append(name)
            if src.integers == "error":
                continue
            j, (iname, ispec) = holders[-1] if src.integers == "last" else holders[0]
            entries[name] = Entry(VariableInfo(name, tuple(ispec.shape), ispec.dtype, name, ispec.kind, ispec.nbytes),
                                   ((j, iname),), None, None)
            copied.append((name, src.integers, labels[j]))
            nbytes_out += ispec.nbytes
            nbytes_read += ispec.nbytes
            continue
        base_name = None
        if method.needs_base:
            got = base_names.get(name)
            if got is None or tuple(got[1].shape) != tuple(first.shape) or not is_float_dtype(got[1].dtype):
                why = ("not in the base" if got is None else
                       f"the base holds it as {spec_text(got[1])}, the inputs as {spec_text(first)}")
                if strict:
                    problems.append(f"{quote_name(name)}: {why}")
                else:
                    left_out.append((name, why))
                continue
            base_name = got[0]
        if len(holders) < method.min_inputs:
            left_out.append((name, f"in {len(holders)} of {n} inputs; {src.method} needs {method.min_inputs}"))
            continue
        if len(holders) < n:
            fewer.append((name, len(holders), n))
        out_dtype = src.dtype or first.dtype
        if len(kinds) > 1:
            dtypes.append((name, out_dtype, ", ".join(f"{s.dtype} in {labels[j]}" for j, (_, s) in holders)))
        acc = "float32" if (src.accumulate == "float32" and all(k in HALF for k in kinds)) else "float64"
        chosen: Dict[str, Any] = {}
        globs: List[str] = []
        bad = []
        for key, default in defaults.items():
            given = params.get(key, default)
            per = isinstance(given, PerInput)  # one value per input holding the tensor
            picked = [pick(given.values[j], name, default) for j, _ in holders] if per else [pick(given, name, default)]
            vals = []
            for i, (v, g) in enumerate(picked):
                label = f"{key} of input {holders[i][0] + 1}" if per else key
                if isinstance(v, Gradient) and len(set(v.values)) == 1:  # (the same at every layer, and outside)
                    v = v.values[0]
                if isinstance(v, Gradient):
                    if name not in positions:
                        fix = (f"give it a plain value: put the gradient under '- filter: layers' and end the list "
                               f"with '- value: {v.values[-1]!r}' (mergekit would take the first value before the "
                               "layers and the last after them, which needs the model's architecture)"
                               if conventions == "mergekit" else
                               f"give it a plain value by glob, e.g. {key}={{'*layers*': {v}, '*': {v.values[-1]!r}}}")
                        bad.append(f"{label}={v} is a gradient over the layers, and this tensor is in no numbered layer "
                                   f"(no part of its name is a layer number); {fix}")
                        continue
                    globs.append(f"{label} from the gradient {v} at t={positions[name]:.4g}")
                    v = v.at(positions[name])
                if g:
                    globs.append(f"{label} by {g!r}")
                vals.append(v)
            if len(vals) == len(picked):
                chosen[key] = tuple(vals) if per else vals[0]
        ws = []
        for j, _ in holders:
            w, g = pick(weights[j], name, 1.0) if weights else (1.0, "")
            if isinstance(w, Gradient) and len(set(w.values)) == 1:
                w = w.values[0]
            if isinstance(w, Gradient):  # a weight spread over the layers, as any parameter
                if name not in positions:
                    bad.append(f"weights[{j}]={w} is a gradient over the layers, and this tensor is in no numbered "
                               f"layer; give it a plain weight by glob, e.g. {{'*layers*': {w}, '*': {w.values[-1]!r}}}")
                    w = 1.0
                else:
                    globs.append(f"weights[{j}] from the gradient {w} at t={positions[name]:.4g}")
                    w = w.at(positions[name])
            ws.append(float(w))
        if bad:
            unfit.append(f"{quote_name(name)}: {'; '.join(bad)}")
            continue
        if src.method == "ema":
            ws = ema_weights(len(holders), float(chosen["decay"]))
        elif src.method in ("mean", "task_arithmetic", "ties", "dare"):
            bad = weight_problems(src.method, ws, chosen)
        bad = bad + method.check(chosen)
        if bad:
            unfit.append(f"{quote_name(name)}: {'; '.join(bad)}")
            continue
        p = TensorParams(name, tuple(ws), chosen, acc, tuple(j for j, _ in holders), conventions, tuple(first.shape))
        fam = method.describe(p) if src.method not in ("mean", "ema") else ""
        wtext = ("weights " + ", ".join(f"{w:g}" for w in ws)) if (src.weights or src.method == "ema") else "weights uniform"
        family = "; ".join(x for x in (wtext if src.method in ("mean", "ema", "task_arithmetic", "ties", "dare") else "",
                                       fam, f"accumulate {acc}", ", ".join(globs)) if x)
        families.setdefault(family, []).append(name)
        nbytes = first.size * numpy_dtype(out_dtype).itemsize
        entries[name] = Entry(VariableInfo(name, tuple(first.shape), out_dtype, name, first.kind,
                                            sum(s.nbytes for s in specs) + (base_names[name][1].nbytes if base_name else 0)),
                               tuple((j, iname) for j, (iname, _) in holders), base_name, p)
        nbytes_out += nbytes
        nbytes_read += entries[name].spec.nbytes
    if integer_names and src.integers == "error":
        problems.append(f"{plural(len(integer_names), 'integer or bool tensor')} cannot be averaged and "
                        f"integers='error': {', '.join(map(quote_name, integer_names[:10]))}"
                        + (f" ... and {len(integer_names) - 10} more" if len(integer_names) > 10 else "")
                        + "; pass integers='last' or 'first' to take one input's value, or exclude them")
    if unfit and not problems:  # parameters or weights that do not fit some tensors (no key hint: not keys)
        raise CombineError(
            f"Cannot combine {plural(n, 'input')} with {src.method!r}: the parameters do not fit "
            f"{plural(len(unfit), 'tensor')}:\n  " + "\n  ".join(unfit[:200])
            + (f"\n  ... and {len(unfit) - 200} more" if len(unfit) > 200 else ""), differences=unfit)
    if problems:
        raise CombineError(
            f"Cannot combine {plural(n, 'input')} with {src.method!r} (keys={src.keys!r}): "
            f"{plural(len(problems), 'difference')}:\n  " + "\n  ".join(problems[:200])
            + (f"\n  ... and {len(problems) - 200} more" if len(problems) > 200 else "")
            + ("\nPass keys='intersection' (only the names every input holds) or keys='union' (each name over the "
               "inputs that hold it), or give the inputs rules (include/exclude/map) so they line up."
               if strict else "")
            + (f"\nAnd the parameters do not fit {plural(len(unfit), 'tensor')}:\n  " + "\n  ".join(unfit[:50])
               if unfit else ""), differences=problems + unfit)
    if not entries:
        raise CombineError(f"Nothing to combine: the {plural(n, 'input')} share no tensor "
                           f"({len(left_out)} left out, e.g. {quote_name(left_out[0][0]) if left_out else '-'}).")

    def describe(h: SourceHandle, weight: Any) -> Dict[str, Any]:
        return {"label": h.label, "path": h.path, "note": h.note, "step": handle_step(h), "weight": weight}

    ins = [describe(h, (src.weights[i] if src.weights else None)) for i, h in enumerate(inputs)]
    report = CombineReport(
        method=src.method, inputs=ins, base=describe(base, None) if base is not None else None,
        options={"dtype": src.dtype, "accumulate": src.accumulate, "keys": src.keys, "integers": src.integers,
                 "optimizer": src.optimizer, "order": src.order, "conventions": conventions,
                 **{k: _shown_param(v) for k, v in src.params.items()}},
        families=[(f, len(names), names[:5]) for f, names in families.items()],
        fewer=fewer, copied=copied, left_out=left_out, dtypes=dtypes, tensors=len(entries),
        nbytes_out=nbytes_out, nbytes_read=nbytes_read, optimizer_left_out=max(p[2] for p in produced),
        conventions=parameter_conventions(src.method, conventions, method.defaults_for(conventions), src.params))
    return entries, report


def _shown_param(v: Any) -> Any:
    """A parameter as the report's options show it (one value per input as a list)."""
    return list(v.values) if isinstance(v, PerInput) else v


def handle_step(h: SourceHandle) -> Optional[int]:
    """The training step of an opened input, from its path (``None`` for values in memory)."""
    return step_of(h.path) if h.path and not h.path.startswith("<") else None
