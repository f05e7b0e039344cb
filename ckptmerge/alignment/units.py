"""Layers as units across layers: a norm goes with the layer it normalises.

A target's graph (a functional Keras model) says which layer feeds each normalisation layer: a
``BatchNormalization`` fed by ``conv1_conv`` normalises that conv's output. Once the conv is
paired with a checkpoint module (``conv1``), the norm belongs beside it: in PyTorch code a
layer's norm is a sibling of its conv, a child of the same parent module (``bn1`` beside
``conv1``; ``layer1.0.bn2`` beside ``layer1.0.conv2``; ``downsample.1`` beside ``downsample.0``).
A norm paired with a tensor outside that parent, while the parent holds candidates of its shape,
disagrees with its own layer's conv: that is evidence of a wrong pairing, which the order of
names (a numbered series compared across two families, ``conv1_bn`` against ``stack0_block0_1_bn``)
must never outvote. Such a pairing is never made:

- :func:`enforce` drops every pairing of the shape group such a contradiction shows wrong (they
  rested on one and the same order evidence) and solves the group again with each anchored norm
  allowed only the candidates beside its conv, in small independent problems (a block's ``bn1``
  and ``bn2``); a norm of that group without an anchor stays unresolved, its candidates named;
- :func:`contradicted` finds the pairings that still disagree at the end (none are kept).

Only normalisation layers (``gamma``, ``beta``, moving statistics) fed by one layer with a
``kernel`` are anchored, and only where the conv's parent module holds a candidate: a model
whose convs and norms live in separate lists (``convs.0``, ``norms.0``) gives no anchor, so
nothing is constrained. Pure: names in, matches out.
"""

from __future__ import annotations

import re
from typing import Callable, Dict, FrozenSet, List, Mapping, Optional, Sequence, Set, Tuple

from ..core.specs import VariableInfo
from ..core.text import quote_name
from .entries import Columns, Match, Unresolved
from .features import SYNONYMS

__all__ = ["NORM_LEAVES", "Anchor", "anchors", "contradicted", "enforce", "UNIT_REASON", "misnumbered", "NUMBER_REASON",
           "name_swaps", "SWAP_REASON"]

#: Leaves (synonyms folded) of a normalisation layer's variables.
NORM_LEAVES = frozenset({"gamma", "beta", "moving_mean", "moving_variance", "running_mean", "running_var"})

#: Why a norm's pairing is refused.
UNIT_REASON = ("layers are units: this norm's pairing disagrees with the module its own layer's conv took "
               "(the norm belongs beside it)")
_GROUP_REASON = ("its shape group's pairing by order was contradicted by a norm that disagreed with its own "
                 "layer's conv, and no conv anchors this one: the rest of the evidence does not decide it")

#: ``(feeder layer's scope, the checkpoint module its tensors came from, that module's parent)``.
Anchor = Tuple[str, str, str]

#: Solves one group of a shape: ``(targets, names, spec, matches out) -> unresolved``.
Solver = Callable[[List[str], List[str], VariableInfo, Columns], List[Unresolved]]


def _scope(name: str) -> str:
    return name[:name.rfind("/") + 1]


def _parent(scope: str) -> str:
    """``layer1/0/bn1/`` -> ``layer1/0/``; ``bn1/`` -> ``""``."""
    cut = scope.rstrip("/").rfind("/")
    return scope[:cut + 1] if cut >= 0 else ""


def _leaf(name: str) -> str:
    leaf = name[name.rfind("/") + 1:].lower()
    return SYNONYMS.get(leaf, leaf)


def anchors(targets: Sequence[str], inputs: Mapping[str, Sequence[str]], taken: Mapping[str, str]
            ) -> Dict[str, Anchor]:
    """Per normalisation target fed by one layer with a kernel whose matched tensors all come from
    one checkpoint module: that :data:`Anchor`.

    Example:
        >>> anchors(["conv1_bn/gamma"], {"conv1_bn/gamma": ("conv1_conv/kernel",)}, {"conv1_conv/kernel": "conv1/kernel"})
        {'conv1_bn/gamma': ('conv1_conv/', 'conv1/', '')}
    """
    out: Dict[str, Anchor] = {}
    for t in targets:
        if _leaf(t) not in NORM_LEAVES:
            continue
        feeders = inputs.get(t, ())
        if not feeders or not any(_leaf(f) == "kernel" for f in feeders) or not all(f in taken for f in feeders):
            continue
        modules = {_scope(taken[f]) for f in feeders}
        if len(modules) != 1:
            continue
        module = modules.pop()
        out[t] = (_scope(feeders[0]), module, _parent(module))
    return out


def _allowed(t: str, anchor: Anchor, candidates: Sequence[str]) -> Optional[FrozenSet[str]]:
    """The candidates beside the anchor's module (children of its parent, not the module itself),
    or ``None`` when its parent holds none (then the tree says nothing)."""
    _, module, parent = anchor
    near = frozenset(c for c in candidates if _parent(_scope(c)) == parent and _scope(c) != module)
    return near or None


def _phrase(anchor: Anchor, name: str) -> str:
    feeder, module, _ = anchor
    return (f"fed by {quote_name(feeder.rstrip('/'))}, which takes {quote_name(module.rstrip('/'))}: "
            f"{quote_name(_scope(name).rstrip('/'))} is beside it")


def contradicted(matches: Columns, groups: Mapping[object, Tuple[List[str], List[str], VariableInfo]],
                 inputs: Mapping[str, Sequence[str]]) -> Set[int]:
    """Indices of the matches whose norm disagrees with its own layer's conv (see the module
    docstring)."""
    if not inputs or not matches:
        return set()
    taken = dict(zip(matches.target, matches.name))
    candidates = {t: ss for ts, ss, _ in groups.values() for t in ts}
    found = anchors(matches.target, inputs, taken)
    bad = set()
    for i, (t, n) in enumerate(zip(matches.target, matches.name)):
        a = found.get(t)
        if a is None:
            continue
        near = _allowed(t, a, candidates.get(t, ()))
        if near is not None and n not in near:
            bad.add(i)
    return bad


def enforce(matches: Columns, unresolved: List[Unresolved],
            groups: Mapping[object, Tuple[List[str], List[str], VariableInfo]],
            inputs: Optional[Mapping[str, Sequence[str]]], solve: Solver) -> Tuple[Columns, List[Unresolved]]:
    """Norms placed beside their own layer's conv (see the module docstring): each shape group
    holding a norm that disagrees with its conv is solved again, every anchored norm allowed only
    the candidates beside its conv; in the other groups, the anchored norms left unresolved are
    solved so too.

    Example:
        >>> m, u = enforce(Columns(), [], {}, None, None)
        >>> (len(m), u)
        (0, [])
    """
    if not inputs:
        return matches, unresolved
    bad = contradicted(matches, groups, inputs)
    bad_targets = {matches.target[i] for i in bad}
    open_targets = {t for u in unresolved for t in u.targets}
    for ts, ss, spec in groups.values():
        wrong = not bad_targets.isdisjoint(ts)
        if wrong or not open_targets.isdisjoint(ts):
            matches, unresolved = _resolve_group(matches, unresolved, ts, ss, spec, inputs, solve, wrong)
    return matches, unresolved


def _resolve_group(matches: Columns, unresolved: List[Unresolved], ts: List[str], ss: List[str],
                   spec: VariableInfo, inputs: Mapping[str, Sequence[str]], solve: Solver, wrong: bool
                   ) -> Tuple[Columns, List[Unresolved]]:
    """One shape group's anchored norms solved beside their convs; ``wrong``: the group's
    pairings were contradicted, so all of them are dropped first."""
    group = set(ts)
    # (the anchors from the convs' pairings, made before this group's are dropped)
    found = anchors(ts, inputs, dict(zip(matches.target, matches.name)))
    dropped: Set[str] = set()
    if wrong:
        rows = {i for i, t in enumerate(matches.target) if t in group}
        dropped = {matches.target[i] for i in rows}
        matches = matches.without(rows)
    # unresolved groups of this group's targets alone are decided again; others stay as they are
    inside = [u for u in unresolved if set(u.targets) <= group]
    kept = [u for u in unresolved if not set(u.targets) <= group]
    held = {t for u in kept for t in u.targets}
    done = set(matches.target) | held
    elsewhere = set(matches.name)
    free = [s for s in ss if s not in elsewhere]
    allowed: Dict[str, FrozenSet[str]] = {}
    for t in ts:
        if t in done or t not in found:
            continue
        near = _allowed(t, found[t], free)
        if near is not None:
            allowed[t] = near
    if not allowed and not wrong:
        return matches, unresolved
    ok, new_unresolved = _solve_beside(allowed, found, spec, solve)
    decided_t = set(ok.target) | {t for u in new_unresolved for t in u.targets}
    decided_s = set(ok.name)  # (a name still free may be a candidate of two unresolved groups)
    for u in inside:  # what the anchors left of the groups unresolved before, for the same reasons
        rest_t = tuple(t for t in u.targets if t not in decided_t)
        rest_s = tuple(n for n in u.names if n not in decided_s)
        if rest_t and rest_s:
            new_unresolved.append(Unresolved(rest_t, rest_s, u.shape, u.dtype, u.reason))
            decided_t.update(rest_t)
    rest_t = tuple(sorted(t for t in dropped if t not in decided_t))
    rest_s = tuple(sorted(s for s in free if s not in decided_s))
    if rest_t and rest_s:
        new_unresolved.append(Unresolved(rest_t, rest_s, tuple(spec.shape), spec.dtype, _GROUP_REASON))
    matches.extend(ok)
    return matches, kept + new_unresolved


def _solve_beside(allowed: Mapping[str, FrozenSet[str]], found: Mapping[str, Anchor], spec: VariableInfo,
                  solve: Solver) -> Tuple[Columns, List[Unresolved]]:
    """The anchored norms, each among the candidates beside its conv, as independent problems
    (norms joined by the candidates they share: a block's ``bn1`` and ``bn2``); a pairing that
    leaves its norm's allowed candidates is refused."""
    parent: Dict[str, str] = {}

    def root(x: str) -> str:
        while parent.setdefault(x, x) != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    for t, near in allowed.items():
        for s in near:
            parent[root("t:" + t)] = root("s:" + s)
    parts: Dict[str, Tuple[List[str], Set[str]]] = {}
    for t, near in allowed.items():
        part = parts.setdefault(root("t:" + t), ([], set()))
        part[0].append(t)
        part[1].update(near)
    out = Columns()
    unresolved: List[Unresolved] = []
    for tnames, snames in parts.values():
        unresolved += solve(sorted(tnames), sorted(snames), spec, out)
    ok = Columns()
    refused: List[Tuple[str, str]] = []
    for m in out:
        if m.name in allowed[m.target]:
            ok.extend([Match(m.target, m.name, m.confidence, m.evidence + (_phrase(found[m.target], m.name),),
                             m.position)])
        else:
            refused.append((m.target, m.name))
    if refused:
        unresolved.append(Unresolved(tuple(sorted(t for t, _ in refused)), tuple(sorted(n for _, n in refused)),
                                     tuple(spec.shape), spec.dtype, UNIT_REASON))
    return ok, unresolved


#: Why a pairing against the modules' own numbers is refused.
NUMBER_REASON = ("layers are units: the target's module and the tensor's module are one word numbered differently "
                 "(bn2 <- bn1) while the tensor numbered as the target is free beside it")
_NUMBERED = re.compile(r"([A-Za-z]+)_?([0-9]+)$")


def misnumbered(matches: Columns, names: Sequence[str]) -> Set[int]:
    """Rows of ``matches`` whose target module and checkpoint module are one word with another
    number (``block_2_0_bn2`` <- ``blocks/2/0/bn1``) while the checkpoint tensor with the target's
    number, under the same parent and with the same leaf (``blocks/2/0/bn2/gamma``), is among
    ``names`` and no match took it: the names' own numbering contradicts the pairing.

    Example:
        >>> m = Columns(); m.extend([Match("blk_0_bn2/gamma", "b/0/bn1/gamma", 0.6, ())])
        >>> sorted(misnumbered(m, ["b/0/bn1/gamma", "b/0/bn2/gamma"]))
        [0]
    """
    used = set(matches.name)
    free = set(names) - used
    if not free:
        return set()
    bad = set()
    for i, (s, t) in enumerate(zip(matches.name, matches.target)):
        ss, ts = _scope(s).rstrip("/"), _scope(t).rstrip("/")
        sm, tm = ss[ss.rfind("/") + 1:], ts[ts.rfind("/") + 1:]
        a, b = _NUMBERED.search(tm), _NUMBERED.search(sm)
        if not a or not b or int(a.group(2)) == int(b.group(2)) or a.group(1).lower() != b.group(1).lower():
            continue
        alt = ss[:len(ss) - len(sm)] + sm[:b.start(2)] + a.group(2) + s[len(ss):]
        if alt in free:
            bad.add(i)
    return bad


#: Why two pairings whose names point the other way round are refused.
SWAP_REASON = ("names and order disagree: exchanged, these two pairings share more name words each, while the order "
               "of the two sides pairs them as they are")


def name_swaps(matches: Columns, shape_of: Mapping[str, object], scope_tokens: Callable[[str], FrozenSet[str]],
               limit: int = 200) -> Set[int]:
    """Rows of ``matches`` that come in pairs of one shape whose checkpoint tensors, exchanged,
    share more scope words with one target and no fewer with the other (``stage_1_csp_conv_down_1`` took
    ``blocks/0/conv2`` while ``conv_down`` went to a block's ``conv_2``): the order evidence that
    paired them outvoted the names, so neither pairing is certain. Groups of more than ``limit``
    matches are not compared.

    Example:
        >>> m = Columns(); m.extend([Match("s_down/k", "b/conv2/k", 0.6, ()), Match("blk_conv_2/k", "b/down/k", 0.6, ())])
        >>> toks = lambda n: frozenset(n.replace("_", "/").split("/")[:-1])
        >>> sorted(name_swaps(m, {"s_down/k": 1, "blk_conv_2/k": 1}, toks))
        [0, 1]
    """
    by_shape: Dict[object, List[int]] = {}
    for i, t in enumerate(matches.target):
        by_shape.setdefault(shape_of.get(t), []).append(i)
    bad: Set[int] = set()

    def share(t: str, s: str) -> float:
        a, b = scope_tokens(t), scope_tokens(s)
        return len(a & b) / len(a | b) if a or b else 0.0

    for rows in by_shape.values():
        if len(rows) < 2 or len(rows) > limit:
            continue
        for x, i in enumerate(rows):
            ti, si = matches.target[i], matches.name[i]
            for j in rows[x + 1:]:
                tj, sj = matches.target[j], matches.name[j]
                a, b, c, d = share(ti, sj), share(ti, si), share(tj, si), share(tj, sj)
                if a >= b and c >= d and a + c > b + d:
                    bad.update((i, j))
    return bad
