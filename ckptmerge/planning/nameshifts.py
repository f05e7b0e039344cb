"""Keras naming heuristics of the plan: a model's own root name, and layer numbers shifted by Keras's
per-process auto-naming (TF issue 46317). Pure: names in, ``{checkpoint name: target}`` out;
:func:`ckptmerge.planning.planner.make_plan` uses them for a Keras model target (``model_root``), for the
names that meet no target as they are. A name that fits two targets is a finding, never a guess.

Example:
    >>> root_swaps(["sequential/dense/kernel"], ["sequential_1/dense/kernel"], "sequential_1")[0]
    {'sequential/dense/kernel': 'sequential_1/dense/kernel'}
"""

from __future__ import annotations

import functools
import re
from typing import Dict, Iterable, List, Optional, Sequence, Tuple

from ..core.text import and_list, quote_name

__all__ = ["root_swaps", "series_shifts", "rerooted"]


def _common_root(names: Sequence[str]) -> Optional[str]:
    """The first name component every name shares (``sequential`` of ``sequential/dense/kernel``)."""
    root = None
    for n in names:
        head, sep, _ = n.partition("/")
        if not sep or (root is not None and head != root):
            return None
        root = head
    return root


def root_swaps(names: Sequence[str], target_names: Iterable[str],
               model_root: str) -> Tuple[Dict[str, str], List[str]]:
    """Match checkpoint names to a Keras model's targets with the model's own name replaceable.

    A checkpoint of ``sequential`` fits ``sequential_1`` and names without a root
    (``dense/kernel``) fit ``sequential/dense/kernel``: the name is tried with the checkpoint's
    common root (if any) removed and with ``model_root`` put in front (if not empty).

    Args:
        names: checkpoint names that met no target as they are.
        target_names: every target name.
        model_root: the model's root scope in its target names (``""`` if they have none).

    Returns:
        ``({checkpoint name: target}, [finding])``: a name two ways fit two targets is a
        finding, never a guess.

    Example:
        >>> root_swaps(["sequential/dense/kernel"], ["sequential_1/dense/kernel"], "sequential_1")
        ({'sequential/dense/kernel': 'sequential_1/dense/kernel'}, [])
    """
    targets = set(target_names)
    src_root = _common_root(names)
    out: Dict[str, str] = {}
    findings: List[str] = []
    for n in names:
        forms = [n]
        if src_root is not None:
            forms.append(n[len(src_root) + 1:])
        fits = sorted({f"{model_root}/{f}" if model_root else f for f in forms} & targets - {n})
        if len(fits) == 1:
            out[n] = fits[0]
        elif fits:
            findings.append(f"{quote_name(n)} fits {and_list([quote_name(f) for f in fits])} once the model's "
                            "root name is ignored; map it explicitly (map={...})")
    return out, findings


def rerooted(names: Sequence[str], model_root: str) -> Dict[str, str]:
    """Each name with the checkpoint's common root (if any) replaced by the model's: the form in
    which a name whose model root *and* layer numbers both moved is offered to
    :func:`series_shifts` (a legacy ``.h5`` of ``sequential_3/dense_7/...`` into a twin
    ``sequential_5/dense_12/...`` built in the same process). Names the form leaves alike are
    left out.

    Example:
        >>> rerooted(["s1/dense_1/kernel", "s1/dense_2/kernel"], "s2")
        {'s1/dense_1/kernel': 's2/dense_1/kernel', 's1/dense_2/kernel': 's2/dense_2/kernel'}
    """
    src_root = _common_root(names)
    out: Dict[str, str] = {}
    for n in names:
        rest = n[len(src_root) + 1:] if src_root is not None else n
        form = f"{model_root}/{rest}" if model_root else rest
        if form != n:
            out[n] = form
    return out


_SERIES = re.compile(r"^([a-z][a-z0-9_]*?)(?:_(\d+))?$")


def series_shifts(names: Sequence[str], target_names: Iterable[str], model_root: str) -> Dict[str, str]:
    """Undo a Keras auto-name shift of a model's layers (TF issue 46317), at every depth.

    Keras names layers ``dense``, ``dense_1``, ... per process, so a model built after another
    one saves ``dense_3``... and a fresh rebuild has ``dense``...: names that also exist on the
    other side would pair the wrong layers. The same holds inside nested models and layers (a
    Sequential inside a Functional, Dense layers inside a custom layer), whose own names shift
    too. Within each scope, a family of sub-scopes (one base name) is shifted only when it is
    certain: the same number of them on both sides, each side numbered without gaps, the numbers
    offset by a constant, and every shifted scope holding exactly the variables of the scope it
    lands on (with the shifts inside it undone). Scopes named alike on both sides are looked
    into for shifts further down.

    Args:
        names: the target names identity would give the checkpoint's names (root already swapped).
        target_names: every target name.
        model_root: the model's root scope in its target names (``""`` if none).

    Returns:
        ``{name: shifted target}`` for the names that move.

    Example:
        >>> series_shifts(["m/dense_3/kernel", "m/dense_4/kernel"], ["m/dense/kernel", "m/dense_1/kernel"], "m")
        {'m/dense_3/kernel': 'm/dense/kernel', 'm/dense_4/kernel': 'm/dense_1/kernel'}
        >>> series_shifts(["m/sequential_1/dense_3/kernel"], ["m/sequential_2/dense_8/kernel"], "m")
        {'m/sequential_1/dense_3/kernel': 'm/sequential_2/dense_8/kernel'}
    """
    head = f"{model_root}/" if model_root else ""
    k = len(head)
    moves = _scope_shifts([n[k:] for n in names if n.startswith(head)],
                          [t[k:] for t in target_names if t.startswith(head)])
    return {head + a: head + b for a, b in moves.items()}


@functools.lru_cache(maxsize=4096)
def _series_parts(scope: str) -> Optional[Tuple[str, int]]:
    """``("dense", 3)`` for ``dense_3``, ``("dense", 0)`` for ``dense``; ``None`` for a scope that
    is not a Keras auto-name (cached: the same scopes recur under every parent)."""
    m = _SERIES.match(scope)
    return (m.group(1), int(m.group(2) or 0)) if m else None


def _layer_families(names: Iterable[str]) -> Dict[str, Dict[int, Tuple[str, List[str]]]]:
    """``{base: {number: (scope, [names inside it])}}`` of the sub-scopes of relative names
    (``dense_3/kernel`` is in family ``dense``, number 3); a family where two scopes share a
    number (``dense`` and ``dense_0``) is left out: not an automatic series."""
    out: Dict[str, Dict[int, Tuple[str, List[str]]]] = {}
    bad = set()
    for n in names:
        scope, sep, rest = n.partition("/")
        parts = _series_parts(scope) if sep else None
        if parts is None:
            continue
        base, number = parts
        family = out.setdefault(base, {})
        held = family.get(number)
        if held is None:
            family[number] = (scope, [rest])
        elif held[0] == scope:
            held[1].append(rest)
        else:
            bad.add(base)
    for base in bad:
        del out[base]
    return out


def _scope_shifts(names: Sequence[str], targets: Sequence[str]) -> Dict[str, str]:
    """:func:`series_shifts` within one scope, on names relative to it: ``{name: moved name}``."""
    ckpt, tgt = _layer_families(names), _layer_families(targets)
    moves: Dict[str, str] = {}
    for base, layers in ckpt.items():
        have = tgt.get(base)
        if not have:
            continue
        if set(layers) == set(have):  # named alike: look inside for shifts further down
            for number, (scope, inside) in layers.items():
                there = have[number][1]
                for a, b in _scope_shifts(inside, there).items():
                    moves[f"{scope}/{a}"] = f"{scope}/{b}"
            continue
        c, t = sorted(layers), sorted(have)
        if len(c) != len(t) or c != list(range(c[0], c[0] + len(c))) or t != list(range(t[0], t[0] + len(t))):
            continue
        inner = []
        for i, j in zip(c, t):  # every scope must hold exactly what its twin holds
            inside, there = layers[i][1], have[j][1]
            shifted = _scope_shifts(inside, there)
            if {shifted.get(x, x) for x in inside} != set(there) or len(inside) != len(there):
                break
            inner.append(shifted)
        else:
            for (i, j), shifted in zip(zip(c, t), inner):
                old, new = layers[i][0], have[j][0]
                for x in layers[i][1]:
                    moves[f"{old}/{x}"] = f"{new}/{shifted.get(x, x)}"
    return moves
