"""Fused targets from separate tensors: the :class:`~ckptmerge.alignment.tensorops.Concat` that
structural alignment infers, and the ones ``cm.suggest`` proposes for review.

A target whose module the convention table calls a fused query/key/value (``qkv``, ``c_attn``,
``query_key_value``, ``in_proj``) may be made of three checkpoint tensors nothing else took: one
query, one key and one value (by the table's names: ``query``/``q_proj``/``q``, ...) under one
scope, with the target's leaf (``kernel``, ``bias``) and dtype, whose shapes join along exactly one
axis into the target's shape. The order of the parts is the fused tensor's own (query, key,
value); where the names do not say which part is which, nothing is proposed. A target whose module
the fused table names (:mod:`ckptmerge.alignment.fused`: ``gate_up_proj``, a gate then an up
projection) is made of its parts in the table's order, by the same rules.

Such a Concat is **applied** (``align="structure"``) only when it is the one candidate left: one
scope fits, or the scope the target's siblings were restored from (its attention output, say) picks
one scope over every other. Anything else (two blocks whose tensors fit equally, no sibling to
tell them apart) is proposed for review only, never applied: an ambiguous fusion stays unresolved.

Pure: names, shapes and specs in, proposals out.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any, Dict, Iterable, List, Mapping, NamedTuple, Optional, Sequence, Tuple

from ..alignment.conventions import conventions
from ..alignment.fused import fused_conventions, part_roles, target_role
from ..alignment.tensorops import Concat
from ..core.errors import TransformError
from ..core.specs import KIND_VARIABLE, VariableInfo
from ..core.text import quote_name
from .model import Plan, SourceView

__all__ = ["FusedProposal", "fused_proposals", "compose_view", "concat_entries_of", "part_label", "PART_ROLES"]

#: The roles of a fused query/key/value tensor's parts, in its order.
PART_ROLES = ("query", "key", "value")


class FusedProposal(NamedTuple):
    """One Concat proposed for a missing target.

    Attributes:
        concat: the :class:`~ckptmerge.alignment.tensorops.Concat` (its axis resolved).
        review: True when it is not the one candidate (proposed for a person to check, never applied).
        evidence: why, one phrase each.
    """

    concat: Concat
    review: bool
    evidence: Tuple[str, ...]


def _part_orders() -> Dict[str, Tuple[str, ...]]:
    """``{fused module name (lower case): the roles of its parts, in order}``: the fused table's
    rows (:mod:`ckptmerge.alignment.fused`: ``gate_up_proj`` is a gate then an up projection) whose
    parts all have a role."""
    out: Dict[str, Tuple[str, ...]] = {}
    for row in fused_conventions():
        order = part_roles(row)
        if None not in order:
            out.update({n.lower(): order for n in row.names})  # type: ignore[misc]
    return out


def _roles(orders: Mapping[str, Tuple[str, ...]] = {}) -> Dict[str, str]:
    """``{name segment (lower case): role}`` of the table's query, key, value and fused rows (and
    of the parts ``orders`` name)."""
    wanted = {*PART_ROLES, "fusedqkv", *(r for o in orders.values() for r in o)}
    out: Dict[str, str] = {}
    for c in conventions():
        if c.role in wanted:
            for n in c.names:
                if "/" not in n:
                    out.setdefault(n.lower(), c.role)
    return out


def _order(roles: Mapping[str, str], orders: Mapping[str, Tuple[str, ...]], segment: str) -> Optional[Tuple[str, ...]]:
    """The roles of a fused target's parts, in order, by its module's name; None for no fused module."""
    if target_role(segment, roles) == "fusedqkv":  # (the whole segment, or its last word: block_0_qkv)
        return PART_ROLES
    seg = segment.lower()
    return orders.get(seg) or orders.get(seg.rsplit("_", 1)[-1])


def _numbers(name: str) -> Tuple[int, ...]:
    return tuple(int(d) for d in re.findall(r"\d+", name))


def _by_rank(found: Sequence[Tuple[VariableInfo, List[Tuple[int, Concat, str]], int]]) -> Dict[str, Any]:
    """``{target: joined name}`` where several fused targets of one leaf and shape all fit the same
    scopes, as many as they are, and the numbers in their names order both sides strictly: the
    k-th target (by number) takes the k-th scope (a series of blocks, numbered from 0 on one side
    and 1 on the other as KerasHub does). Key ``""``: ``{target: "k of n"}`` for the evidence."""
    groups: Dict[Tuple[str, Tuple[int, ...]], List[Tuple[VariableInfo, List[Tuple[int, Concat, str]]]]] = {}
    for t, fits, _ in found:
        groups.setdefault((t.name.rsplit("/", 1)[-1], tuple(t.shape)), []).append((t, fits))
    out: Dict[str, Any] = {"": {}}
    for members in groups.values():
        scopes = [sorted(f[2] for f in fits) for _, fits in members]
        if len(members) < 2 or any(sc != scopes[0] for sc in scopes) or len(scopes[0]) != len(members):
            continue
        tnums = [_numbers(t.name.rsplit("/", 1)[0]) for t, _ in members]
        snums = [_numbers(sc) for sc in scopes[0]]
        if len(set(tnums)) != len(tnums) or len(set(snums)) != len(snums) or () in tnums or () in snums:
            continue
        by_scope = {f[2]: f[1].name for f in members[0][1]}
        order_t = sorted(range(len(members)), key=lambda i: tnums[i])
        order_s = sorted(scopes[0], key=_numbers)
        for k, (i, scope) in enumerate(zip(order_t, order_s)):
            t, fits = members[i]
            out[t.name] = next(f[1].name for f in fits if f[2] == scope)
            out[""][t.name] = f"{k + 1} of {len(members)}"
        del by_scope
    return out


def _common(a: Sequence[str], b: Sequence[str]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def fused_proposals(plan: Plan, src: SourceView, missing: Sequence[str], used: Iterable[str] = (),
                    matched: Mapping[str, str] = {}) -> List[FusedProposal]:
    """The Concats that could make the ``missing`` targets from ``src``'s unused tensors (not in ``used``).

    ``matched`` (``{checkpoint name: target}``) adds the structural matches found beside the plan's
    assignments, as evidence of which source scope a target's siblings came from.

    Example:
        >>> from ckptmerge.planning.planner import make_plan
        >>> t = VariableInfo("blk/attn/qkv/kernel", (4, 12), "float32")
        >>> parts = {f"layer/0/attn/{r}/kernel": VariableInfo(f"layer/0/attn/{r}/kernel", (4, 4), "float32")
        ...          for r in ("query", "key", "value")}
        >>> src = SourceView("A", "<memory>", "", parts)
        >>> p = fused_proposals(make_plan([t], [src]), src, [t.name])[0]
        >>> p.concat.sources, p.concat.axis, p.review
        (('layer/0/attn/query/kernel', 'layer/0/attn/key/kernel', 'layer/0/attn/value/kernel'), 1, False)
    """
    orders = _part_orders()
    roles = _roles(orders)
    want = set(missing)
    fused = [t for t in plan.targets if t.name in want and len(t.name.split("/")) >= 2
             and _order(roles, orders, t.name.split("/")[-2]) is not None]
    if not fused:
        return []
    every_part = {r for t in fused for r in _order(roles, orders, t.name.split("/")[-2]) or ()}
    taken = set(used)
    groups: Dict[Tuple[str, str], Dict[str, List[VariableInfo]]] = {}
    for n in plan.unused.get(src.label, ()):
        v = src.variables.get(n)
        segs = n.split("/")
        if v is None or n in taken or len(segs) < 2 or n in src.composed:
            continue
        role = roles.get(segs[-2].lower())  # (the whole segment only: 'attn_v' is no value)
        if role in every_part:
            groups.setdefault(("/".join(segs[:-2]), segs[-1]), {}).setdefault(role, []).append(v)
    came_from = {a.target: a.name for a in plan.assignments.values() if a.source == src.label}
    came_from.update({t: n for n, t in matched.items()})
    out: List[FusedProposal] = []
    claimed: Dict[str, int] = {}  # joined name -> how many targets it fits
    found: List[Tuple[VariableInfo, List[Tuple[int, Concat, str]], int]] = []
    for t in fused:
        tsegs = t.name.split("/")
        order = _order(roles, orders, tsegs[-2]) or PART_ROLES
        parent = "/".join(tsegs[:-2])
        siblings = [n.split("/") for tn, n in came_from.items() if parent and tn.startswith(parent + "/")]
        fits = []
        for (scope, leaf), g in groups.items():
            if leaf != tsegs[-1] or any(len(g.get(r, ())) != 1 for r in order):
                continue
            parts = [g[r][0] for r in order]
            if any(p.dtype != t.dtype for p in parts):
                continue
            shapes = [tuple(p.shape) for p in parts]
            c = Concat(t.name, tuple(p.name for p in parts))
            try:
                axis = c.axes(shapes, t.shape)[0]
            except TransformError:  # no axis, or more than one: not this one
                continue
            c = dataclasses.replace(c, axis=axis)
            if c.output_shape(shapes) != tuple(t.shape):
                continue
            score = max((_common(s, scope.split("/")) for s in siblings), default=0)
            fits.append((score, c, scope))
            claimed[c.name] = claimed.get(c.name, 0) + 1
        if fits:
            found.append((t, sorted(fits, key=lambda f: (-f[0], f[1].name)), len(siblings)))
    ranked = _by_rank(found)
    for t, fits, n_siblings in found:
        best = fits[0][0]
        top = [f for f in fits if f[0] == best]
        alone = len(fits) == 1 or (len(top) == 1 and n_siblings > 0 and best > 0)
        chosen = [f for f in fits if ranked.get(t.name) == f[1].name
                  or (alone and f[0] == best and claimed[f[1].name] == 1)]
        order = _order(roles, orders, t.name.split("/")[-2]) or PART_ROLES
        for score, c, scope in chosen or fits:  # (a target decided shows its one Concat, else every candidate)
            by_rank = ranked.get(t.name) == c.name
            certain = bool(chosen)
            why = [f"shapes {' + '.join(str(tuple(src.variables[p].shape)) for p in c.sources)} join along axis "
                   f"{c.axis} into {tuple(t.shape)}",
                   f"'{t.name.split('/')[-2]}' is a fused query/key/value; the parts are its query, key and value"
                   if order == PART_ROLES else
                   f"'{t.name.split('/')[-2]}' is fused ({', '.join(order)} in that order, by the fused table)"]
            if n_siblings and score:
                why.append(f"the target's siblings came from {'/'.join(scope.split('/')[:score])!r}")
            if by_rank:
                why.append(f"series position {ranked[''][t.name]}: the numbers of the fused targets and of "
                           "the scopes that fit them are in the same order")
            if not certain:
                why.append("another candidate fits as well: review" if len(fits) > 1 or claimed[c.name] > 1
                           else "review")
            out.append(FusedProposal(c, not certain, tuple(why)))
    return out


def part_label(part: VariableInfo, note: str = "") -> str:
    """A Concat's part as its report line shows it: the name, then the raw key and stored shape
    (from a layout's note) where they differ from it.

    Example:
        >>> q = VariableInfo("a/q/kernel", (8, 4), "float32", "a.q.weight")
        >>> part_label(q, "layout: a.q.weight (4, 8): transposed")
        "'a/q/kernel' [a.q.weight (4, 8): transposed]"
    """
    text = quote_name(part.name)
    if note.startswith("layout: "):
        return f"{text} [{note[len('layout: '):]}]"
    if part.raw_key != part.name:
        return f"{text} [raw {quote_name(part.raw_key)}]"
    return text


def compose_view(view: SourceView, concats: Sequence[Concat]) -> SourceView:
    """``view`` with each Concat's parts replaced by its joined tensor, mapped onto its target (as
    :class:`~ckptmerge.sources.composed.ComposedHandle` makes it for a source's own Concats).

    Raises:
        TransformError: a part is not in the view, or the parts do not join.
    """
    if not concats:
        return view
    variables = dict(view.variables)
    notes = dict(view.notes)
    for c in concats:
        parts = [variables.pop(p) for p in c.sources]
        shapes = [tuple(p.shape) for p in parts]
        shape = c.output_shape(shapes)
        variables[c.name] = VariableInfo(c.name, shape, parts[0].dtype, "+".join(p.raw_key for p in parts),
                                         KIND_VARIABLE, sum(p.nbytes for p in parts))
        notes[c.name] = c.describe(shapes, labels=[part_label(p, notes.get(p.name, "")) for p in parts])
    return dataclasses.replace(view, variables=dict(sorted(variables.items())), notes=notes,
                               composed={**view.composed, **{c.name: c.sources for c in concats}},
                               joined={**view.joined, **{c.name: c.target for c in concats}})


def concat_entries_of(view: SourceView) -> List[Concat]:
    """The Concats a view's joined tensors stand for (the axis taken from the parts' shapes and the
    target's, as when they were made)."""
    return [Concat(view.joined[n], parts) for n, parts in view.composed.items()]
