"""Structural alignment: which checkpoint variable is which target when names differ wholesale.

Transfer learning moves weights between models whose names do not match (``dnn/hiddenlayer_0``
vs ``h0``, ``bert/encoder/layer_3/attention/self/query`` vs
``encoder/transformer_3/self_attention/query``, ``dense_3`` vs ``dense``). This module proposes
the map a person would write, from every piece of evidence at once:

- **shape and dtype**: only tensors of one shape and dtype can pair (the hard constraint);
- **leaf names** (``kernel``, ``bias``, ``gamma``; common synonyms folded: ``weights`` ~
  ``kernel``, ``scale`` ~ ``gamma``) and **scope tokens** (names split at ``/``, ``_``, case and
  digit changes: ``LayerNorm`` ~ ``layer_norm``, ``self_attention`` ~ ``attention/self``);
- **order**: a target's creation order and a checkpoint's own order where known, else the
  numeric-aware order of names (``layer_10`` after ``layer_9``), counted only where it means
  something (a creation order, or a numbered series of names).

Each group of equal shape and dtype is solved as one global assignment
(:func:`scipy.optimize.linear_sum_assignment`), never greedily. A pair is accepted only when the
evidence separates it from every alternative (a swap with any other pair, or a leftover candidate,
must lose score); pairs the evidence cannot separate are *unresolved*, never guessed. Accepted
pairs are then folded into scope-to-scope entries (``{"dnn/hiddenlayer_0/": "h0/"}``) wherever a
whole scope moves together.

Pure: names and specs in (:class:`~ckptmerge.core.specs.VariableInfo`), results out; no file access, no
TensorFlow. :func:`ckptmerge.suggest` and ``Source(..., align="structure")`` are built on it.
"""

from __future__ import annotations

import collections
import itertools
import operator
from dataclasses import dataclass
from typing import (
    Any,
    Dict,
    FrozenSet,
    Iterable,
    List,
    Mapping,
    Optional,
    Sequence,
    Tuple,
)

import numpy as np

from ..core.specs import VariableInfo
from ..core.text import quote_name
from .entries import Alignment, Columns, Entry, Match, Unresolved, match_columns, scope_entries, scopes_of
from .features import SYNONYMS, Features, leaf_kinds, leaf_of, natural_key, refined_ranks, tokens
from .tensorops import refines
from . import units

__all__ = ["Match", "Unresolved", "Alignment", "Entry", "align", "tokens", "natural_key", "scope_entries",
           "ALIGN_MODES", "CONFIDENCE_FLOOR", "below_floor"]

#: Valid values of ``Source(align=...)``.
ALIGN_MODES = ("structure",)
#: Below this margin a pair is not separated from its best alternative: unresolved.
MARGIN = 1e-3
#: Below this score a pair has no evidence beyond its shape: not proposed.
MIN_SCORE = 0.25
#: The confidence floor: ``Source(align="structure")`` applies only matches of at least this
#: confidence; :func:`ckptmerge.suggest` still proposes those below it, each marked for review.
#: (A confidence is the pair's score, 0..1, discounted when its best alternative is close; the
#: weakest pair that alignment proposes at all scores :data:`MIN_SCORE`.)
CONFIDENCE_FLOOR = 0.25
#: A pair whose relative positions (0..1) on the two sides differ by more than this contradicts
#: its own order evidence: not applied.
ORDER_TOLERANCE = 0.5

def _ranks(names: Sequence[str], order: Optional[Mapping[str, int]], feats: Features
           ) -> Tuple[np.ndarray, bool]:
    """Relative ranks (0..1) of ``names`` and whether that order carries evidence.

    A numbered series ranks by its numbers, compared as numbers, so ``layer_3/query`` and
    ``layer_3/key`` share a rank; else a known creation/saving order ranks; else there is no
    order evidence.
    """
    n = len(names)
    if n < 2:
        return np.zeros(n), False
    keys: List[Any]
    if feats.is_series(names) or _counter_series(names, feats):
        keys = [feats.numbers[x] for x in names]
    else:
        if order is None or not all(x in order for x in names):
            return np.zeros(n), False
        keys = [order[x] for x in names]
    distinct = sorted(set(keys))
    if len(distinct) < 2:
        return np.zeros(n), False
    pos = {k: i / (len(distinct) - 1) for i, k in enumerate(distinct)}
    return np.array([pos[k] for k in keys]), True


#: One block of a shape group: its target names, checkpoint names, series position ("" when the
#: group is not split) and, for a position, its kind (the stems of both sides, in name order).
_Block = Tuple[List[str], List[str], str, Optional[Tuple[Tuple[str, ...], Tuple[str, ...]]]]


def _by_series(tnames: List[str], snames: List[str], feats: Features) -> List[_Block]:
    """Split one shape group by series position when both sides are numbered series with the same
    number of positions (the k-th ``layer_N`` of the checkpoint is the k-th ``transformer_M`` of
    the target); else the group as it is. Keeps large models linear: 12 x 600 equal layers are
    600 small problems, not one of 7,200 x 7,200. Names are given sorted."""
    numbers = feats.numbers
    t_numbers, s_numbers = set(map(numbers.__getitem__, tnames)), set(map(numbers.__getitem__, snames))
    # (names without numbers are a position of their own, first: where both sides have them, or
    # where they are the first of Keras's counted default names, ``dense`` before ``dense_1``; else
    # the k-th position of one side would be the (k+1)-th of the other)
    if (not (feats.is_series(tnames) and feats.is_series(snames)) or len(t_numbers) != len(s_numbers)
            or ((() in t_numbers) != (() in s_numbers)
                and not _counted_first(tnames if () in t_numbers else snames, feats))):
        return [(tnames, snames, "", None)]
    t_at, s_at = _at_positions(tnames, feats), _at_positions(snames, feats)
    n = len(t_at)
    if n < 2:
        return [(tnames, snames, "", None)]
    return [(tn, sn, f"series position {k + 1} of {n}", (tst, sst))
            for k, ((tst, tn), (sst, sn)) in enumerate(zip(t_at, s_at))]


def _counted_first(names: List[str], feats: Features) -> bool:
    """Whether every name without numbers among ``names`` is the first of a Keras counter, its
    layer's name numbered ``_0`` the template of another of them (``dense/kernel`` beside
    ``dense_1/kernel``)."""
    templates = set(map(feats.template.__getitem__, names))
    for n in names:
        if not feats.numbers[n]:
            cut = n.rfind("/")
            if cut < 0 or f"{feats.template[n][:cut]}_0{feats.template[n][cut:]}" not in templates:
                return False
    return True


def _counter_series(names: Sequence[str], feats: Features) -> bool:
    """Whether ``names`` are a Keras counter's layers with its first, unnumbered one among them
    (``dense/kernel`` and ``dense_2/kernel``): a series whose unnumbered name comes first."""
    numbered = [bool(feats.numbers[n]) for n in names]
    return any(numbered) and not all(numbered) and _counted_first(list(names), feats)


def _at_positions(names: List[str], feats: Features) -> List[Tuple[Tuple[str, ...], List[str]]]:
    """Per series position, in order: the stems and the names there, ordered by stem then name
    (two stable sorts of the sorted names, so no position sorts its own)."""
    stems = feats.stems(names)
    positions = list(map(feats.numbers.__getitem__, names))
    order = sorted(sorted(range(len(names)), key=stems.__getitem__), key=positions.__getitem__)
    out = []
    for _, at in itertools.groupby(order, key=positions.__getitem__):
        at = list(at)
        out.append((tuple([stems[i] for i in at]), [names[i] for i in at]))
    return out


def _token_matrix(token_lists: Sequence[Tuple[str, ...]], vocab: Dict[str, int]) -> np.ndarray:
    m = np.zeros((len(token_lists), len(vocab)), np.float32)
    for i, toks in enumerate(token_lists):
        for t in toks:
            m[i, vocab[t]] = 1.0
    return m


def _jaccard(a: Sequence[Tuple[str, ...]], b: Sequence[Tuple[str, ...]]) -> np.ndarray:
    """Jaccard similarity of every token set of ``a`` with every one of ``b``."""
    if len(a) * len(b) <= 256:  # small problems (most, once split by series): plain sets
        sa, sb = [frozenset(x) for x in a], [frozenset(x) for x in b]
        return np.array([[len(x & y) / len(x | y) if x or y else 0.0 for y in sb] for x in sa]).reshape(len(a), len(b))
    vocab: Dict[str, int] = {}
    for toks in list(a) + list(b):
        for t in toks:
            vocab.setdefault(t, len(vocab))
    if not vocab:
        return np.zeros((len(a), len(b)))
    ma, mb = _token_matrix(a, vocab), _token_matrix(b, vocab)
    inter = ma @ mb.T
    union = ma.sum(1)[:, None] + mb.sum(1)[None, :] - inter
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(union > 0, inter / np.maximum(union, 1), 0.0)


def _set_jaccard(a: Tuple[str, ...], b: Tuple[str, ...]) -> float:
    x, y = set(a), set(b)
    return len(x & y) / len(x | y) if x or y else 0.0


def _evidence(tname: str, sname: str, spec: VariableInfo, alone: bool, leaf: float, scope: float,
              feats: Features) -> List[str]:
    shape = f"shape {tuple(spec.shape)} {spec.dtype}"
    evidence = [f"{shape}, the only candidate of its shape" if alone else shape]
    if leaf > 0:
        evidence.append(f"leaf {quote_name(leaf_of(sname))} ~ {quote_name(leaf_of(tname))}")
    if scope > 0:
        shared = sorted(set(feats.tokens(tname)[1]) & set(feats.tokens(sname)[1]))
        evidence.append("scope tokens " + ", ".join(map(quote_name, shared)))
    return evidence


_BLIND = "nothing but their shape relates them (no shared name tokens, no order evidence)"
_CONTRADICTED = ("the best pairing's own order evidence disagrees (the two sides hold these at different "
                 "positions), so it is not applied")
_TIED = "the evidence (names, scopes, order) fits more than one pairing equally well"


def _solve_pair(tname: str, sname: str, spec: VariableInfo, position: str, feats: Features
                ) -> Tuple[List[Match], List[Unresolved]]:
    """One target, one candidate: accepted when its names say something, not its shape alone."""
    (t_leaf, t_scope), (s_leaf, s_scope) = feats.tokens(tname), feats.tokens(sname)
    leaf, scope = _set_jaccard(t_leaf, s_leaf), _set_jaccard(t_scope, s_scope)
    score = 0.5 * leaf + 0.5 * scope
    if score < MIN_SCORE:
        return [], [Unresolved((tname,), (sname,), tuple(spec.shape), spec.dtype, _BLIND)]
    evidence = _evidence(tname, sname, spec, not position, leaf, scope, feats)
    return [Match(tname, sname, round(min(1.0, score), 2), tuple(evidence), position)], []


def _solve_group(tnames: List[str], snames: List[str], target_order: Optional[Mapping[str, int]],
                 source_order: Optional[Mapping[str, int]], spec: VariableInfo, position: str,
                 feats: Features, beside: Optional["_Beside"] = None) -> Tuple[List[Match], List[Unresolved]]:
    """Solve one block as a global assignment; ``beside``: the graph evidence of
    :func:`_settle`, added to the names' (only for a group the names left tied)."""
    from scipy.optimize import linear_sum_assignment

    if len(tnames) == 1 and len(snames) == 1 and beside is None:  # the common case once split by series
        return _solve_pair(tnames[0], snames[0], spec, position, feats)
    tf, sf = [feats.tokens(t) for t in tnames], [feats.tokens(s) for s in snames]
    leaf = _jaccard([f[0] for f in tf], [f[0] for f in sf])
    scope = _jaccard([f[1] for f in tf], [f[1] for f in sf])
    if position or (len(tnames) == 1 and len(snames) == 1):  # one rank on each side: no evidence
        rt, rs, use_order = np.zeros(len(tnames)), np.zeros(len(snames)), False
    else:
        rt, t_inf = _ranks(tnames, target_order, feats)
        rs, s_inf = _ranks(snames, source_order, feats)
        if t_inf and s_inf and len(set(rt.tolist())) != len(set(rs.tolist())):
            rt, rs = refined_ranks(tnames, snames, rt, rs, target_order, source_order, feats)
        # Ranks compare only when both sides order their names as finely: a side that holds two
        # of them at one rank (``layer4/0/bn1`` and ``layer4/0/downsample/1`` both in block 4, 0)
        # against one that does not would pair by a scale that is not the same.
        use_order = t_inf and s_inf and len(set(rt.tolist())) == len(set(rs.tolist()))
    if use_order:
        order = 1.0 - np.abs(rt[:, None] - rs[None, :])
        score = 0.3 * leaf + 0.3 * scope + 0.4 * order
    else:
        order = None
        score = 0.5 * leaf + 0.5 * scope
    if beside is not None:
        score = score + beside.score
    nt, ns = score.shape
    n = max(nt, ns)
    padded = np.zeros((n, n))  # dummies score 0: "no partner" is always an option
    padded[:nt, :ns] = score
    if n == 1:
        partner = np.zeros(1, int)
    else:
        rows, cols = linear_sum_assignment(padded, maximize=True)
        partner = np.empty(n, int)
        partner[rows] = cols
    own = padded[np.arange(n), partner]
    # Margin of pair i: the score lost by the best swap with any other pair j (dummies included).
    cross = padded[:, partner]  # cross[i, j] = score(i, partner[j])
    delta = own[:, None] + own[None, :] - cross - cross.T
    np.fill_diagonal(delta, np.inf)
    margin = delta.min(axis=1) if n > 1 else np.full(n, np.inf)
    matches: List[Match] = []
    tied: Dict[int, set] = {}
    blind: List[int] = []  # pairs with nothing but their shape for them
    contradicted: List[int] = []
    for i in range(nt):
        j = partner[i]
        if j >= ns:
            continue
        if own[i] < MIN_SCORE:
            blind.append(i)
            continue
        if margin[i] <= MARGIN:
            tied[i] = {k for k in range(n) if k != i and delta[i, k] <= MARGIN}
            continue
        if order is not None and abs(rt[i] - rs[j]) > ORDER_TOLERANCE:
            contradicted.append(i)  # its own order evidence disagrees: never applied
            continue
        evidence = _evidence(tnames[i], snames[j], spec, False, leaf[i, j], scope[i, j], feats)
        if order is not None:
            evidence.append(f"order {rt[i]:.2f} ~ {rs[j]:.2f}")
        if beside is not None and beside.score[i, j] > 0:
            evidence.append(beside.phrase(i, j))
        confidence = float(min(1.0, own[i]) * min(1.0, 0.5 + margin[i] / 0.2 * 0.5))
        matches.append(Match(tnames[i], snames[j], round(confidence, 2), tuple(evidence), position))
    unresolved: List[Unresolved] = []

    def add(group: Iterable[int], reason: str) -> None:
        ts = sorted(tnames[k] for k in group if k < nt)
        ss = sorted(snames[partner[k]] for k in group if partner[k] < ns)
        if ts and ss:
            unresolved.append(Unresolved(tuple(ts), tuple(ss), tuple(spec.shape), spec.dtype, reason))

    seen: set = set()
    for i, rivals in sorted(tied.items()):
        if i not in seen:
            group = ({i} | rivals) - set(blind)
            seen |= group
            add(group, _TIED)
    if blind:
        add(blind, _BLIND)
    if contradicted:
        add(contradicted, _CONTRADICTED)
    return matches, unresolved


def _solve_block(block: _Block, t_order: Optional[Mapping[str, int]], s_order: Optional[Mapping[str, int]],
                 spec: VariableInfo, memo: Dict[Any, Any], feats: Features
                 ) -> Tuple[List[Match], List[Unresolved]]:
    """:func:`_solve_group` for one block; a position of a numbered series is solved once per kind
    of block: layer 7 of 600 has the same names, but for its number, as layer 6, so the same answer."""
    tnames, snames, position, kind = block
    if kind is None:
        return _solve_group(tnames, snames, t_order, s_order, spec, position, feats)
    solved = memo.get(kind)
    if solved is None:
        m, u = _solve_group(tnames, snames, t_order, s_order, spec, position, feats)
        ti, si = {n: i for i, n in enumerate(tnames)}, {n: i for i, n in enumerate(snames)}
        solved = memo[kind] = ([(ti[x.target], si[x.name], x.confidence, x.evidence) for x in m],
                               [(tuple(ti[t] for t in x.targets), tuple(si[n] for n in x.names), x.reason)
                                for x in u])
    pairs, groups = solved
    return ([Match(tnames[i], snames[j], c, e, position) for i, j, c, e in pairs],
            [Unresolved(tuple(tnames[i] for i in ts), tuple(snames[j] for j in ss), tuple(spec.shape), spec.dtype, r)
             for ts, ss, r in groups] if groups else [])


def _families(names: List[str], feats: Features
              ) -> Optional[Tuple[List[str], List[Tuple[int, ...]], List[List[str]]]]:
    """A side of a shape group as a *regular* numbered series: its names without numbers, the
    positions, and per numbered family (ordered by stem) its names ordered by position; ``None``
    unless every family holds exactly one name at each of the same (at least two) positions.
    Names come in any order."""
    numbers, template = feats.numbers, feats.template
    by_stem: Dict[str, List[str]] = {}
    plain = []
    for n in names:
        if numbers[n]:
            family = by_stem.get(template[n])
            if family is None:
                by_stem[template[n]] = [n]
            else:
                family.append(n)
        else:
            plain.append(n)
    positions: Optional[List[Tuple[int, ...]]] = None
    families = []
    for stem in sorted(by_stem):
        members = sorted(by_stem[stem], key=numbers.__getitem__)
        at = list(map(numbers.__getitem__, members))
        if positions is None:
            positions = at
            if len(set(at)) != len(at):
                return None
        elif at != positions:
            return None
        families.append(members)
    if positions is None or len(positions) < 2:  # fewer than two positions: no series
        return None
    return sorted(plain), positions, families


def _solve_regular(tnames: List[str], snames: List[str], spec: VariableInfo, feats: Features,
                   out: Columns) -> Optional[List[Unresolved]]:
    """The common case of :func:`_by_series` in bulk: both sides regular numbered series (see
    :func:`_families`) with as many positions. Every numbered position is then the same kind of
    block, so it is solved once and repeated family by family, without a step per position.
    Gives what :func:`_by_series` and :func:`_solve_block` give (the matches added to ``out``,
    the unresolved returned); ``None`` when not regular."""
    t, s = _families(tnames, feats), _families(snames, feats)
    if t is None or s is None:
        return None
    (t_plain, t_at, t_fams), (s_plain, s_at, s_fams) = t, s
    if not t_plain:  # checkpoint names outside the series (a pooler beside the layers) have no position
        s_plain = []
    if len(t_at) != len(s_at) or bool(t_plain) != bool(s_plain):
        return None
    n = len(t_at) + bool(t_plain)
    labels = [f"series position {k + 1} of {n}" for k in range(n)]
    matches: List[Match] = []
    unresolved: List[Unresolved] = []
    if t_plain:  # the names without numbers sort first, as position ()
        matches, unresolved = _solve_group(t_plain, s_plain, None, None, spec, labels.pop(0), feats)
    first_t, first_s = [f[0] for f in t_fams], [f[0] for f in s_fams]
    found, left = _solve_group(first_t, first_s, None, None, spec, labels[0], feats)
    ti, si = {x: i for i, x in enumerate(first_t)}, {x: i for i, x in enumerate(first_s)}
    out.extend(matches)
    for m in found:  # a family's matches as whole columns: no Python step per match
        family = t_fams[ti[m.target]]
        out.target += family
        out.name += s_fams[si[m.name]]
        out.confidence += [m.confidence] * len(family)
        out.evidence += [m.evidence] * len(family)
        out.position += labels
    shape = tuple(spec.shape)
    for u in left:
        its, jss = [ti[x] for x in u.targets], [si[x] for x in u.names]
        unresolved += [Unresolved(tuple(t_fams[i][k] for i in its), tuple(s_fams[j][k] for j in jss),
                                  shape, spec.dtype, u.reason) for k in range(len(labels))]
    return unresolved


def _by_spec(infos: Iterable[VariableInfo]) -> Dict[Tuple[Tuple[int, ...], str], Tuple[List[str], VariableInfo]]:
    """``{(shape, dtype): (names, one of the specs)}``."""
    out: Dict[Tuple[Tuple[int, ...], str], Tuple[List[str], VariableInfo]] = {}
    for info in infos:
        key = (tuple(info.shape), info.dtype)
        group = out.get(key)
        if group is None:
            out[key] = ([info.name], info)
        else:
            group[0].append(info.name)
    return out


def align(targets: Iterable[VariableInfo], names: Iterable[VariableInfo], *,
          target_order: Optional[Sequence[str]] = None,
          source_order: Optional[Sequence[str]] = None,
          target_inputs: Optional[Mapping[str, Sequence[str]]] = None) -> Alignment:
    """Pair targets with checkpoint variables by structure (see the module docstring).

    Args:
        targets: the targets to find a value for (e.g. a plan's ``missing``), as specs.
        names: the checkpoint variables that could provide them (e.g. a plan's ``unused``).
        target_order: target names in creation order (a Keras model's ``weights``, a graph's
            variables), if known: evidence for pairing by position.
        source_order: checkpoint names in the order they were saved, if known.
        target_inputs: per target, the targets of the one layer with weights that feeds its
            layer, where the target's graph records it (a functional Keras model): evidence for
            targets whose names leave them tied (see :func:`_settle`).

    Returns:
        An :class:`Alignment`: accepted matches and unresolved groups.

    Example:
        >>> t = [VariableInfo("h0/kernel", (4, 8), "float32"), VariableInfo("h0/bias", (8,), "float32")]
        >>> s = [VariableInfo("dnn/hiddenlayer_0/kernel", (4, 8), "float32"),
        ...      VariableInfo("dnn/hiddenlayer_0/bias", (8,), "float32")]
        >>> align(t, s).mapping
        {'dnn/hiddenlayer_0/bias': 'h0/bias', 'dnn/hiddenlayer_0/kernel': 'h0/kernel'}
    """
    t_order = {n: i for i, n in enumerate(target_order)} if target_order is not None else None
    s_order = {n: i for i, n in enumerate(source_order)} if source_order is not None else None
    targets, names = list(targets), list(names)
    t_groups, s_groups = _by_spec(targets), _by_spec(names)
    groups = {k: (ts, list(s_groups[k][0]) if k in s_groups else [], spec) for k, (ts, spec) in t_groups.items()}
    # A target may also take a tensor of another shape of its size that a reshape makes fit by
    # splitting or merging neighbouring axes or unit axes (attention heads, a (1, n, d) table):
    # such a tensor joins the target's shape group too, so one tensor can be a candidate of two
    # groups; :func:`_one_target_each` keeps a tensor's best match only where it is clear.
    by_size: Dict[Tuple[int, str], List[Tuple[Tuple[int, ...], str]]] = {}
    for (shape, dtype), (ss, _) in s_groups.items():
        by_size.setdefault((int(np.prod(shape, dtype=np.int64)), dtype), []).append(shape)
    reshaped = False
    t_names, s_names = list(map(_NAME, targets)), list(map(_NAME, names))
    feats = Features(list(dict.fromkeys(itertools.chain(t_names, s_names))))
    template = feats.template
    for (shape, dtype), (ts, ss, spec) in groups.items():
        leaves = None
        for other in by_size.get((int(np.prod(shape, dtype=np.int64)), dtype), ()):
            if other != shape and refines(other, shape):
                # Only a tensor of the same kind (its leaf: kernel to kernel, bias to bias): a
                # (1, 1, 4, 8) conv kernel has the size of a (32,) norm scale, not its meaning.
                # (words looked up once per template: names that differ only in their numbers share them)
                leaves = leaves if leaves is not None else {w for tp in set(map(template.__getitem__, ts))
                                                            for w in feats.template_tokens(tp)[0]}
                others = s_groups[(other, dtype)][0]
                fits = {tp: not leaves.isdisjoint(feats.template_tokens(tp)[0])
                        for tp in set(map(template.__getitem__, others))}
                ss.extend(itertools.compress(others, map(fits.__getitem__, map(template.__getitem__, others))))
                reshaped = True
    groups = {k: g for k, g in groups.items() if g[1]}
    matches = Columns()
    unresolved: List[Unresolved] = []
    hazards = (feats.hazards(t_names), feats.hazards(s_names))
    for tnames, snames, spec in groups.values():
        unresolved += _solve_spec(tnames, snames, spec, feats, hazards, t_order, s_order, matches)
    if reshaped:
        matches, unresolved = _one_target_each(matches, unresolved)
    matches, unresolved = _layers_as_units(matches, unresolved, feats)
    if target_inputs:
        # a norm that disagrees with its own layer's conv: its group solved again beside the convs
        def solve(ts: List[str], ss: List[str], spec: VariableInfo, out: Columns) -> List[Unresolved]:
            return _solve_spec(ts, ss, spec, feats, hazards, t_order, s_order, out)

        matches, unresolved = units.enforce(matches, unresolved, groups, target_inputs, solve)
        matches, unresolved = _layers_as_units(matches, unresolved, feats)
    if target_inputs and any(u.reason == _TIED for u in unresolved):
        matches, unresolved = _settle(matches, unresolved, target_inputs, feats, hazards, t_order, s_order)
        matches, unresolved = _layers_as_units(matches, unresolved, feats)
        # (convs the graph placed anchor norms left open)
        matches, unresolved = units.enforce(matches, unresolved, groups, target_inputs, solve)
        matches, unresolved = _layers_as_units(matches, unresolved, feats)
    if target_inputs:  # (never kept: a pairing that splits a conv from its norm)
        matches, unresolved = _drop_contradicted(matches, unresolved, groups, target_inputs, feats)
    # (never kept: bn2 <- bn1 beside a free bn2; two pairings whose names point the other way round)
    shape_of = {t.name: (tuple(t.shape), t.dtype) for t in targets}
    for bad, why in ((units.misnumbered(matches, s_names), units.NUMBER_REASON),
                     (units.name_swaps(matches, shape_of, lambda n: frozenset(feats.tokens(n)[1])), units.SWAP_REASON)):
        if bad and target_inputs:  # (and the norms placed beside a conv whose pairing is dropped)
            dropped = {matches.target[i] for i in bad}
            bad |= {i for i, t in enumerate(matches.target) if dropped.intersection(target_inputs.get(t, ()))}
        if bad:
            rows = sorted(bad)
            unresolved.append(Unresolved(tuple(sorted(matches.target[i] for i in rows)),
                                         tuple(sorted(matches.name[i] for i in rows)), (), "", why))
            matches, unresolved = _layers_as_units(matches.without(bad), unresolved, feats)
    unresolved += _left_over(groups, matches, unresolved)
    unresolved.sort(key=lambda u: u.targets)
    return Alignment(matches.sorted_by_target(), unresolved)


_LEFT = "left over once the rest of its shape group was decided: nothing but the shape pairs these"


def _left_over(groups: Mapping[Any, Tuple[List[str], List[str], VariableInfo]], matches: Columns,
               unresolved: List[Unresolved]) -> List[Unresolved]:
    """Per shape group, the targets neither matched nor in an unresolved group while candidates of
    their shape are left too, as one more unresolved group: every target with a candidate is
    assigned or unresolved, never silently dropped."""
    t_done = set(matches.target).union(*(u.targets for u in unresolved))
    s_done = set(matches.name).union(*(u.names for u in unresolved))
    out = []
    for (shape, dtype), (ts, ss, _) in groups.items():
        left_t = [t for t in ts if t not in t_done]
        left_s = [n for n in ss if n not in s_done] if left_t else []
        if left_t and left_s:
            out.append(Unresolved(tuple(sorted(left_t)), tuple(sorted(left_s)), tuple(shape), dtype, _LEFT))
    return out


#: Per side (targets, checkpoint names): the pairs of scopes whose numbers do not compare (see
#: :meth:`Features.hazards`).
_Hazards = Tuple[FrozenSet[FrozenSet[str]], FrozenSet[FrozenSet[str]]]


def _solve_spec(tnames: List[str], snames: List[str], spec: VariableInfo, feats: Features, hazards: _Hazards,
                t_order: Optional[Mapping[str, int]], s_order: Optional[Mapping[str, int]],
                matches: Columns) -> List[Unresolved]:
    """Solve one group of a shape and dtype: its matches added to ``matches``, the unresolved returned.

    A group whose two sides hold the same kinds of leaf, as many of each (20 biases, 9 norm
    scales, 9 norm offsets of one width), is solved kind by kind: a bias never pairs with a
    scale, and within one kind the orders of the two sides compare (a Keras counter numbers each
    class of layer on its own: ``dense_8``..``dense_27`` beside ``layer_normalization_8``..)."""
    kinds = leaf_kinds(tnames, snames, feats)
    if kinds is not None:
        return [u for ts, ss in kinds
                for u in _solve_spec(ts, ss, spec, feats, hazards, t_order, s_order, matches)]
    seen = feats.with_positions(tnames, hazards[0]).with_positions(snames, hazards[1])  # (series positions)
    regular = _solve_regular(tnames, snames, spec, seen, matches)
    if regular is not None:
        return regular
    unresolved: List[Unresolved] = []
    memo: Dict[Any, Any] = {}
    for block in _by_series(sorted(tnames), sorted(snames), seen):
        if block[0] and block[1]:
            m, u = _solve_block(block, t_order, s_order, spec, memo, seen)
            matches.extend(m)
            unresolved += u
    return unresolved


def _tree_steps(a: str, b: str) -> int:
    """Steps between two scopes in the module tree (``a/b/`` to ``a/c/``: 2)."""
    x, y = a.strip("/").split("/"), b.strip("/").split("/")
    common = 0
    for p, q in zip(x, y):
        if p != q:
            break
        common += 1
    return len(x) + len(y) - 2 * common


@dataclass(frozen=True)
class _Beside:
    """Graph evidence for a tied group: how close each candidate's module sits, in the
    checkpoint's module tree, to the module that feeds the target's input layer."""

    score: np.ndarray
    anchors: Tuple[Optional[Tuple[str, str]], ...]  # per target: (its input layer's variable, its source)
    steps: np.ndarray

    def phrase(self, i: int, j: int) -> str:
        layer, source = self.anchors[i]  # type: ignore[misc]
        return (f"fed by {quote_name(_scope(layer).rstrip('/'))}, which takes {quote_name(_scope(source).rstrip('/'))}: "
                f"{int(self.steps[i, j])} steps from it in the module tree")


#: Weight of the graph evidence: enough to break a tie of names (its steps differ by a whole
#: module), never enough to outweigh a leaf (``gamma`` vs ``beta``) or scope that the names tell.
BESIDE_WEIGHT = 0.2


def _beside(tnames: Sequence[str], snames: Sequence[str], inputs: Mapping[str, Sequence[str]],
            taken: Mapping[str, str]) -> Optional[_Beside]:
    """:class:`_Beside` for a tied group, or ``None`` when no target has an input layer whose
    variables all come from one checkpoint module, or no such target sees its candidates at
    different distances (then the graph tells nothing)."""
    anchors: List[Optional[Tuple[str, str]]] = []
    steps = np.zeros((len(tnames), len(snames)))
    score = np.zeros_like(steps)
    useful = False
    for i, t in enumerate(tnames):
        feeders = [(x, taken[x]) for x in inputs.get(t, ()) if x in taken]
        modules = {_scope(s) for _, s in feeders}
        if not feeders or len(modules) != 1 or len(feeders) != len(inputs.get(t, ())):
            anchors.append(None)
            continue
        anchors.append(feeders[0])
        module = modules.pop()
        steps[i] = [_tree_steps(_scope(s), module) for s in snames]
        score[i] = BESIDE_WEIGHT / np.maximum(steps[i] - 1, 1)
        useful = useful or len(set(steps[i].tolist())) > 1
    return _Beside(score, tuple(anchors), steps) if useful else None


def _settle(matches: Columns, unresolved: List[Unresolved], inputs: Mapping[str, Sequence[str]],
            feats: Features, hazards: _Hazards, t_order: Optional[Mapping[str, int]],
            s_order: Optional[Mapping[str, int]]) -> Tuple[Columns, List[Unresolved]]:
    """Groups the names left tied, decided where the target's graph tells: a target whose input
    layer (``conv2d_17`` feeding ``batch_normalization_17``) took its tensors from one checkpoint
    module takes the candidate that sits nearest that module (``layer4/0/downsample/1`` beside
    ``layer4/0/downsample/0``), when that separates it from every alternative. What the graph
    decides leaves the rest of the group to be solved again by the names' own evidence (its
    numbers may form a series once the odd one is out), and so on while something is decided."""
    taken = dict(zip(matches.target, matches.name))
    todo = [u for u in unresolved if u.reason == _TIED]
    out = [u for u in unresolved if u.reason != _TIED]
    while todo:
        u = todo.pop()
        tnames, snames = list(u.targets), list(u.names)
        beside = _beside(tnames, snames, inputs, taken)
        if beside is None:
            out.append(u)
            continue
        spec = VariableInfo("", u.shape, u.dtype)
        seen = feats.with_positions(tnames, hazards[0]).with_positions(snames, hazards[1])
        found, _ = _solve_group(tnames, snames, None, None, spec, "", seen, beside)
        if not found:
            out.append(u)
            continue
        matches.extend(found)
        taken.update((m.target, m.name) for m in found)
        done_t, done_s = {m.target for m in found}, {m.name for m in found}
        rest_t, rest_s = [t for t in tnames if t not in done_t], [s for s in snames if s not in done_s]
        if rest_t and rest_s:
            again = Columns()
            left = _solve_spec(rest_t, rest_s, spec, feats, hazards, t_order, s_order, again)
            matches.extend(again)
            taken.update(zip(again.target, again.name))
            todo += [x for x in left if x.reason == _TIED]
            out += [x for x in left if x.reason != _TIED]
    return matches, out


def _scope(name: str) -> str:
    return name[:name.rfind("/") + 1]


def _drop_contradicted(matches: Columns, unresolved: List[Unresolved], groups: Mapping[Any, Any],
                       inputs: Mapping[str, Sequence[str]], feats: Features) -> Tuple[Columns, List[Unresolved]]:
    """The matches whose norm still disagrees with its own layer's conv (see
    :func:`ckptmerge.alignment.units.contradicted`), left unresolved, and their layers with them."""
    bad = units.contradicted(matches, groups, inputs)
    if not bad:
        return matches, unresolved
    rows = sorted(bad)
    unresolved.append(Unresolved(tuple(sorted(matches.target[i] for i in rows)),
                                 tuple(sorted(matches.name[i] for i in rows)), (), "", units.UNIT_REASON))
    return _layers_as_units(matches.without(bad), unresolved, feats)


#: Leaf names (after synonym folding) of a layer's own parameters. (Not ``reverse_embeddings``: an
#: untied output projection is a module of its own in PyTorch, ``lm_head``, beside the embedding.)
_LAYER_PARAMS = frozenset({"kernel", "bias", "gamma", "beta", "moving_mean", "moving_variance", "embeddings",
                           "recurrent_kernel", "running_mean", "running_var"})


def _unit_scopes(names: Sequence[str], scopes: List[str], feats: Features) -> List[str]:
    """Per name: its scope (of ``scopes``) when its leaf is a layer's own parameter (see
    :data:`_LAYER_PARAMS`), else ``""``. Looked up once per template: names that differ only in
    their numbers share a leaf."""
    templates = list(map(feats.template.__getitem__, names))
    unit = {}
    for t, n in dict(zip(templates, names)).items():
        leaf = n[n.rfind("/") + 1:].lower()
        unit[t] = SYNONYMS.get(leaf, leaf) in _LAYER_PARAMS
    if all(unit.values()):
        return scopes
    return list(map(operator.mul, scopes, map(unit.__getitem__, templates)))  # (a scope * False is "")


_FIRST, _SECOND = operator.itemgetter(0), operator.itemgetter(1)
_NAME = operator.attrgetter("name")


def _one_target_each(matches: "Columns", unresolved: List[Unresolved]) -> Tuple["Columns", List[Unresolved]]:
    """Where one checkpoint tensor was matched in two shape groups (as itself and reshaped), keep
    its match that is clearly the more confident (by more than 0.05); else neither: both targets
    become unresolved, with both candidates named."""
    if len(set(matches.name)) == len(matches.name):  # (the usual case: each tensor matched once)
        return matches, unresolved
    by_name: Dict[str, List[int]] = {}
    for i, n in enumerate(matches.name):
        by_name.setdefault(n, []).append(i)
    drop: set = set()
    for n, rows in by_name.items():
        if len(rows) < 2:
            continue
        rows = sorted(rows, key=lambda i: -matches.confidence[i])
        best, second = rows[0], rows[1]
        if matches.confidence[best] - matches.confidence[second] > 0.05:
            drop.update(rows[1:])
        else:
            drop.update(rows)
            unresolved.append(Unresolved(tuple(sorted(matches.target[i] for i in rows)), (n,), (), "",
                                         "one checkpoint tensor fits these targets about equally well "
                                         "(one of them only after a reshape)"))
    return matches.without(drop), unresolved


def _layers_as_units(matches: "Columns", unresolved: List[Unresolved], feats: Features
                     ) -> Tuple["Columns", List[Unresolved]]:
    """Layers are units: the matched variables of one target layer (a scope: kernel and bias,
    gamma and beta and the moving statistics) come from one checkpoint module, and one module's
    tensors go to one target layer. A layer whose matches come from two modules (or a module
    whose tensors went to two layers) keeps none of them: its targets are unresolved, with the
    candidates named."""
    # Only layer parameters make a unit: a table held directly under a scope
    # (``bert/embeddings/position_embeddings``) is a tensor of its own.
    t_all, s_all = scopes_of(matches)  # (kept on the columns: a suggestion folds scopes with them too)
    t_scope, s_scope = _unit_scopes(matches.target, t_all, feats), _unit_scopes(matches.name, s_all, feats)
    # (the distinct pairs of scopes, counted per side, at C speed: a scope in two pairs is bad)
    pairs = set(zip(t_scope, s_scope))
    if "" in t_scope or "" in s_scope:
        pairs = {(t, s) for t, s in pairs if t and s}
    per_t, per_s = collections.Counter(map(_FIRST, pairs)), collections.Counter(map(_SECOND, pairs))
    # (every scope in one pair, the usual case, when there are as many scopes as pairs)
    bad_t = {t for t, c in per_t.items() if c > 1} if len(per_t) < len(pairs) else set()
    bad_s = {s for s, c in per_s.items() if c > 1} if len(per_s) < len(pairs) else set()
    if not bad_t and not bad_s:
        return matches, unresolved
    drop = {i for i, (t, s) in enumerate(zip(t_scope, s_scope)) if t in bad_t or s in bad_s}
    groups: Dict[str, List[int]] = {}
    for i in sorted(drop):
        groups.setdefault(t_scope[i] if t_scope[i] in bad_t else s_scope[i], []).append(i)
    for key, rows in groups.items():
        where = ", ".join(map(quote_name, sorted({s_scope[i] for i in rows} | ({key} if key in bad_s else set()))))
        unresolved.append(Unresolved(tuple(sorted(matches.target[i] for i in rows)),
                                     tuple(sorted(matches.name[i] for i in rows)), (), "",
                                     f"layers are units: these variables of one layer would come from more than "
                                     f"one module, or one module would feed more than one layer ({where})"))
    return matches.without(drop), unresolved


def below_floor(found: Alignment, floor: float = CONFIDENCE_FLOOR) -> Tuple[Alignment, List[Unresolved]]:
    """The alignment with only its matches of at least ``floor`` confidence, and one
    :class:`Unresolved` per match below it (naming its one candidate and its confidence).

    Example:
        >>> v = lambda n: VariableInfo(n, (4, 4), "float32")
        >>> kept, weak = below_floor(align([v("enc/x/kernel"), v("a/b/kernel")], [v("enc/y/kernel"), v("p/my_kernel")]))
        >>> kept.mapping, weak[0].reason
        ({'enc/y/kernel': 'enc/x/kernel'}, 'confidence 0.23 is below the floor 0.25 that align="structure" applies')
    """
    low = {i for i, c in enumerate(match_columns(found.matches)[2]) if c < floor}
    if not low:
        return found, []
    columns = found.matches if isinstance(found.matches, Columns) else _as_columns(found.matches)
    weak = [Unresolved((m.target,), (m.name,), (), "",
                       f'confidence {m.confidence:.2f} is below the floor {floor} that align="structure" applies')
            for i, m in enumerate(columns) if i in low]
    return Alignment(columns.without(low), list(found.unresolved)), weak


def _as_columns(matches: Iterable[Match]) -> Columns:
    out = Columns()
    out.extend(matches)
    return out
