"""Fused tensors that no convention names: the splits ``cm.suggest`` proposes for review, never applies.

A PyTorch module that the fused table (:mod:`ckptmerge.alignment.fused`) names is split by the
layout, its parts named as the table says. Any other fused weight (ChatGLM's ``dense_h_to_4h``,
holding a gate and an up projection; a ``qkv_proj`` whose part sizes the targets do not settle)
reaches the plan whole: a kernel ``(in, a + b)`` beside missing sibling kernels ``(in, a)`` and
``(in, b)`` of one layer scope. Its columns fit those targets in more than one order, and with
equal parts no shape tells which half is which: reading the gate as the up projection gives a
model that runs and is wrong. So :func:`split_groups` reports each such tensor as unresolved with
every reading, and :func:`split_proposals` proposes each reading's :class:`~ckptmerge.Split` for
review; ``align="structure"`` applies none. A row added with
:func:`~ckptmerge.alignment.fused.add_fused_convention` settles it.

Pure: names and specs in, proposals out.
"""

from __future__ import annotations

import itertools
import math
from typing import Dict, Iterable, List, Sequence, Tuple

from ..alignment.entries import Entry, Unresolved
from ..core.specs import VariableInfo
from ..core.text import quote_name
from .model import Plan, SourceView

__all__ = ["split_groups", "split_proposals", "SPLIT_READINGS"]

#: Why a fused tensor without a convention stays unresolved.
SPLIT_READINGS = ("a fused tensor whose columns fit these targets in {n} readings ({readings}); no convention names "
                  "its parts, so none is applied: add a row with cm.add_fused_convention, or map it with cm.Split")

#: At most this many parts are looked for (query, key, value).
_MAX_PARTS = 3


def _fits(plan: Plan, src: SourceView, missing: Sequence[str], used: Iterable[str]
          ) -> List[Tuple[VariableInfo, Tuple[VariableInfo, ...]]]:
    """``[(unused kernel, the missing sibling kernels its columns add up to)]``."""
    kernels = []  # (looked for first: usually every checkpoint kernel is taken, and the targets need no pass)
    for n in itertools.filterfalse(set(used).__contains__, plan.unused.get(src.label, ())):
        v = src.variables.get(n)
        if v is None or n in src.composed or len(v.shape) != 2 or n.rsplit("/", 1)[-1] != "kernel":
            continue
        kernels.append(v)
    if not kernels:
        return []
    want = set(missing)
    groups: Dict[Tuple[str, str, int, str], List[VariableInfo]] = {}
    for t in plan.targets:
        if len(t.shape) >= 2 and t.name.endswith("/kernel") and t.name in want:  # (the cheap tests first)
            segs = t.name.split("/")
            groups.setdefault(("/".join(segs[:-2]), segs[-1], int(t.shape[0]), t.dtype), []).append(t)
    found = sorted((k, g) for k, g in groups.items() if 2 <= len(g) <= _MAX_PARTS)
    out = []
    for v in kernels:
        for (_, _, fan_in, dtype), g in found:
            if fan_in == v.shape[0] and dtype == v.dtype and sum(math.prod(t.shape[1:]) for t in g) == v.shape[1]:
                out.append((v, tuple(sorted(g, key=lambda t: t.name))))
    return out


#: Said with every proposal: a reading is a run of whole columns, which a fusion that interleaves
#: its parts head by head does not store, so for such a model every proposed reading is wrong.
INTERLEAVED = ("each reading takes one run of whole columns: if the fusion interleaves its parts head by "
               "head (GPT-NeoX and BLOOM query_key_value, Falcon, InternLM2 wqkv), every reading here is wrong")


def _readings(v: VariableInfo, group: Sequence[VariableInfo]) -> List[Tuple[Tuple[str, int, int], ...]]:
    """Every order of the group along the tensor's columns: per reading, ``(target, first, last)``."""
    out = []
    for order in itertools.permutations(group):
        lo, reading = 0, []
        for t in order:
            size = math.prod(t.shape[1:])
            reading.append((t.name, lo, lo + size - 1))
            lo += size
        out.append(tuple(reading))
    return out


def _text(reading: Sequence[Tuple[str, int, int]]) -> str:
    return ", ".join(f"columns {lo}..{hi} -> {quote_name(t)}" for t, lo, hi in reading)


def split_groups(plan: Plan, src: SourceView, missing: Sequence[str], used: Iterable[str] = ()) -> List[Unresolved]:
    """One :class:`~ckptmerge.alignment.entries.Unresolved` per fused tensor of ``src`` (no
    convention named, nothing took it) whose columns add up to missing sibling kernels, with
    every reading in its reason.

    Example:
        >>> from ckptmerge.planning.planner import make_plan
        >>> f = VariableInfo("h/0/mlp/dense_h_to_4h/kernel", (16, 80), "float32")
        >>> ts = [VariableInfo(f"b/0/{n}/kernel", (16, 40), "float32") for n in ("ffn_a", "ffn_b")]
        >>> src = SourceView("A", "<memory>", "", {f.name: f})
        >>> g = split_groups(make_plan(ts, [src]), src, [t.name for t in ts])[0]
        >>> g.targets, g.reason.split(";")[0]
        (('b/0/ffn_a/kernel', 'b/0/ffn_b/kernel'), "a fused tensor whose columns fit these targets in 2 readings (columns 0..39 -> 'b/0/ffn_a/kernel', columns 40..79 -> 'b/0/ffn_b/kernel' or columns 0..39 -> 'b/0/ffn_b/kernel', columns 40..79 -> 'b/0/ffn_a/kernel')")
    """
    out = []
    for v, group in _fits(plan, src, missing, used):
        readings = _readings(v, group)
        out.append(Unresolved(tuple(t.name for t in group), (v.name,), tuple(v.shape), v.dtype,
                              SPLIT_READINGS.format(n=len(readings), readings=" or ".join(map(_text, readings)))))
    return out


def split_proposals(plan: Plan, src: SourceView, missing: Sequence[str], used: Iterable[str] = ()) -> List[Entry]:
    """Entries for review, one per target of each group of :func:`split_groups`: the tensor, and
    the :class:`~ckptmerge.Split` of every reading for that target (never applied by
    ``align="structure"``).

    Example:
        >>> from ckptmerge.planning.planner import make_plan
        >>> f = VariableInfo("h/0/mlp/dense_h_to_4h/kernel", (16, 80), "float32")
        >>> ts = [VariableInfo(f"b/0/{n}/kernel", (16, 40), "float32") for n in ("ffn_a", "ffn_b")]
        >>> src = SourceView("A", "<memory>", "", {f.name: f})
        >>> e = split_proposals(make_plan(ts, [src]), src, [t.name for t in ts])[0]
        >>> e.review, e.evidence[1]
        (True, "cm.Split('b/0/ffn_a/kernel', axis=1, index=0, parts=2) or cm.Split('b/0/ffn_a/kernel', axis=1, index=1, parts=2): no name says which")
    """
    out = []
    for v, group in _fits(plan, src, missing, used):
        readings = _readings(v, group)
        n = len(group)
        for t in group:
            splits = []
            for reading in readings:
                index = next(i for i, (name, _, _) in enumerate(reading) if name == t.name)
                sizes = [hi - lo + 1 for _, lo, hi in reading]
                given = f", sizes={tuple(sizes)}" if len(set(sizes)) > 1 else ""
                text = f"cm.Split({t.name!r}, axis=1, index={index}, parts={n}{given})"
                if text not in splits:
                    splits.append(text)
            out.append(Entry(v.name, t.name, 0.0, (
                f"shape {tuple(v.shape)}: its columns add up to the {n} missing kernels of "
                f"{quote_name(t.name.rsplit('/', 2)[0] + '/')} ({' + '.join(str(tuple(x.shape)) for x in group)})",
                " or ".join(splits) + ": no name says which", INTERLEAVED), 1, True))
    return out
