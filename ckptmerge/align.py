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

Pure: names and specs in (:class:`~ckptmerge.specs.VariableInfo`), results out; no file access, no
TensorFlow. :func:`ckptmerge.suggest` and ``Source(..., align="structure")`` are built on it.
"""

from __future__ import annotations

import collections
import functools
import re
from dataclasses import dataclass, field
from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

import numpy as np

from .specs import VariableInfo
from .text import plural, quote_name

__all__ = ["Match", "Unresolved", "Alignment", "align", "tokens", "natural_key", "scope_entries",
           "ALIGN_MODES"]

#: Valid values of ``Source(align=...)``.
ALIGN_MODES = ("structure",)
#: Below this margin a pair is not separated from its best alternative: unresolved.
MARGIN = 1e-3
#: Below this score a pair has no evidence beyond its shape: not proposed.
MIN_SCORE = 0.25

_SPLIT = re.compile(r"[/_\-.:\s]+")
_CAMEL = re.compile(r"(?<=[a-z])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])|(?<=[A-Za-z])(?=\d)|(?<=\d)(?=[A-Za-z])")
_DIGITS = re.compile(r"\d+")
_DIGIT_SPLIT = re.compile(r"(\d+)")
#: Tokens that mean the same thing in the naming schemes of TF1, Keras 2/3 and Model Garden.
_SYNONYMS = {
    "weights": "kernel", "weight": "kernel", "w": "kernel", "kernel": "kernel",
    "biases": "bias", "b": "bias", "bias": "bias",
    "scale": "gamma", "gamma": "gamma", "offset": "beta", "center": "beta", "beta": "beta",
    "embedding": "embeddings", "embeddings": "embeddings",
    "hiddenlayer": "dense", "fc": "dense", "linear": "dense", "dense": "dense", "hidden": "dense",
    "layernorm": "norm", "norm": "norm", "ln": "norm", "normalization": "norm",
}


def tokens(name: str) -> Tuple[str, ...]:
    """The lower-case word tokens of a name, digits left out, synonyms folded (cached by the name's
    digit-free template, so ``layer_0`` ... ``layer_599`` cost one split).

    Example:
        >>> tokens("bert/encoder/layer_3/attention/output/LayerNorm")
        ('bert', 'encoder', 'layer', 'attention', 'output', 'layer', 'norm')
        >>> tokens("dnn/hiddenlayer_0")
        ('dnn', 'dense')
    """
    return _template_tokens(_DIGITS.sub("0", name))


@functools.lru_cache(maxsize=65536)
def _template_tokens(name: str) -> Tuple[str, ...]:
    out = []
    for part in _SPLIT.split(name):
        for t in _CAMEL.split(part):
            t = t.lower()
            if t and not t.isdigit():
                out.append(_SYNONYMS.get(t, t))
    return tuple(out)


def natural_key(name: str) -> Tuple[Any, ...]:
    """Sort key that orders numbers by value: ``layer_9`` before ``layer_10``.

    Example:
        >>> sorted(["l_10/k", "l_9/k", "l_1/k"], key=natural_key)
        ['l_1/k', 'l_9/k', 'l_10/k']
    """
    return tuple((0, int(p), "") if p.isdigit() else (1, 0, p) for p in re.split(r"(\d+)", name) if p)


def _leaf(name: str) -> str:
    return name[name.rfind("/") + 1:]


def _scope(name: str) -> str:
    return name[:name.rfind("/") + 1]


@dataclass(frozen=True)
class Match:
    """One proposed pair: checkpoint name -> target name, with its evidence.

    Attributes:
        target: the target name.
        name: the checkpoint name.
        confidence: 0..1: the evidence's score, discounted when the best alternative is close.
        evidence: one short phrase per piece of evidence (shape, leaf, scope tokens, order).
    """

    target: str
    name: str
    confidence: float
    evidence: Tuple[str, ...] = ()

    def describe(self) -> str:
        """``"'name' -> 'target' (0.93: shape (3, 4) float32; leaf 'kernel'; ...)"``."""
        return f"{quote_name(self.name)} -> {quote_name(self.target)} ({self.confidence:.2f}: {'; '.join(self.evidence)})"


@dataclass(frozen=True)
class Unresolved:
    """Targets and checkpoint names of one shape the evidence cannot tell apart.

    Attributes:
        targets: the target names (sorted).
        names: the checkpoint names they could take (sorted).
        shape, dtype: what they share.
        reason: why they stay unresolved.
    """

    targets: Tuple[str, ...]
    names: Tuple[str, ...]
    shape: Tuple[int, ...]
    dtype: str
    reason: str

    def describe(self) -> str:
        """One line: the targets, the names, and why."""
        return (f"{', '.join(map(quote_name, self.targets))} <- one of "
                f"{', '.join(map(quote_name, self.names))} ({self.dtype} {self.shape}): {self.reason}")


@dataclass(frozen=True)
class Alignment:
    """The result of :func:`align` for one source.

    Attributes:
        matches: accepted pairs, sorted by target.
        unresolved: groups the evidence cannot separate.
    """

    matches: List[Match] = field(default_factory=list)
    unresolved: List[Unresolved] = field(default_factory=list)

    @property
    def mapping(self) -> Dict[str, str]:
        """``{checkpoint name: target}`` of the accepted pairs."""
        return {m.name: m.target for m in self.matches}


@functools.lru_cache(maxsize=1 << 17)
def _features(name: str) -> Tuple[Tuple[str, ...], Tuple[str, ...], Tuple[int, ...], Optional[str]]:
    """Leaf tokens, scope tokens, scope numbers and numbered-series stem of a name (computed once
    per name and :func:`align` call; one regex split)."""
    cut = name.rfind("/") + 1
    parts = _DIGIT_SPLIT.split(name)
    if len(parts) == 1:
        return _template_tokens(name[cut:]), _template_tokens(name[:cut]), (), None
    numbers = []
    pos = 0
    for i in range(0, len(parts) - 1, 2):  # the digit runs that start in the scope
        pos += len(parts[i])
        if pos < cut:
            numbers.append(int(parts[i + 1]))
        pos += len(parts[i + 1])
    template = "0".join(parts[0::2])
    tcut = template.rfind("/") + 1
    return (_template_tokens(template[tcut:]), _template_tokens(template[:tcut]), tuple(numbers),
            template if numbers else None)


def _numbers(name: str) -> Tuple[int, ...]:
    return _features(name)[2]


def _series(names: Sequence[str]) -> Optional[List[Tuple[int, ...]]]:
    """The numbers of each name's scope when the names form a numbered series (names equal but
    for their numbers: ``layer_0/...``, ``layer_1/...``), else ``None``."""
    stems: Dict[str, int] = {}
    for x in names:
        stem = _features(x)[3]
        if stem is not None:
            stems[stem] = stems.get(stem, 0) + 1
    if not any(c > 1 for c in stems.values()):
        return None
    return [_numbers(x) for x in names]


def _ranks(names: Sequence[str], order: Optional[Mapping[str, int]]) -> Tuple[np.ndarray, bool]:
    """Relative ranks (0..1) of ``names`` and whether that order carries evidence.

    A numbered series ranks by its numbers, compared as numbers, so ``layer_3/query`` and
    ``layer_3/key`` share a rank; else a known creation/saving order ranks; else there is no
    order evidence.
    """
    n = len(names)
    if n < 2:
        return np.zeros(n), False
    keys: Optional[List[Any]] = _series(names)
    if keys is None:
        if order is None or not all(x in order for x in names):
            return np.zeros(n), False
        keys = [order[x] for x in names]
    distinct = sorted(set(keys))
    if len(distinct) < 2:
        return np.zeros(n), False
    pos = {k: i / (len(distinct) - 1) for i, k in enumerate(distinct)}
    return np.array([pos[k] for k in keys]), True


def _by_series(tnames: List[str], snames: List[str]) -> List[Tuple[List[str], List[str], str]]:
    """Split one shape group by series position when both sides are numbered series with the same
    number of positions (the k-th ``layer_N`` of the checkpoint is the k-th ``transformer_M`` of
    the target); else the group as it is. Keeps large models linear: 12 x 600 equal layers are
    600 small problems, not one of 7,200 x 7,200."""
    ts, ss = _series(tnames), _series(snames)
    if ts is None or ss is None:
        return [(tnames, snames, "")]
    tk, sk = sorted(set(ts)), sorted(set(ss))
    if len(tk) != len(sk) or len(tk) < 2:
        return [(tnames, snames, "")]
    t_at: Dict[Tuple[int, ...], List[str]] = {}
    s_at: Dict[Tuple[int, ...], List[str]] = {}
    for t, x in zip(tnames, ts):
        t_at.setdefault(x, []).append(t)
    for n, x in zip(snames, ss):
        s_at.setdefault(x, []).append(n)
    out = [(t_at[a], s_at[b], f"series position {k + 1} of {len(tk)}") for k, (a, b) in enumerate(zip(tk, sk))]
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


def _evidence(tname: str, sname: str, spec: VariableInfo, alone: bool, leaf: float, scope: float) -> List[str]:
    shape = f"shape {tuple(spec.shape)} {spec.dtype}"
    evidence = [f"{shape}, the only candidate of its shape" if alone else shape]
    if leaf > 0:
        evidence.append(f"leaf {quote_name(_leaf(sname))} ~ {quote_name(_leaf(tname))}")
    if scope > 0:
        shared = sorted(set(_features(tname)[1]) & set(_features(sname)[1]))
        evidence.append("scope tokens " + ", ".join(map(quote_name, shared)))
    return evidence


_BLIND = "nothing but their shape relates them (no shared name tokens, no order evidence)"
_TIED = "the evidence (names, scopes, order) fits more than one pairing equally well"


def _solve_pair(tname: str, sname: str, spec: VariableInfo, position: str
                ) -> Tuple[List[Match], List[Unresolved]]:
    """One target, one candidate: accepted when its names say something, not its shape alone."""
    (t_leaf, t_scope, _, _), (s_leaf, s_scope, _, _) = _features(tname), _features(sname)
    leaf, scope = _set_jaccard(t_leaf, s_leaf), _set_jaccard(t_scope, s_scope)
    score = 0.5 * leaf + 0.5 * scope
    if score < MIN_SCORE:
        return [], [Unresolved((tname,), (sname,), tuple(spec.shape), spec.dtype, _BLIND)]
    evidence = _evidence(tname, sname, spec, not position, leaf, scope) + ([position] if position else [])
    return [Match(tname, sname, round(min(1.0, score), 2), tuple(evidence))], []


def _solve_group(tnames: List[str], snames: List[str], target_order: Optional[Mapping[str, int]],
                 source_order: Optional[Mapping[str, int]], spec: VariableInfo, position: str = ""
                 ) -> Tuple[List[Match], List[Unresolved]]:
    from scipy.optimize import linear_sum_assignment

    if len(tnames) == 1 and len(snames) == 1:  # the common case once split by series: no matrix
        return _solve_pair(tnames[0], snames[0], spec, position)
    tf, sf = [_features(t) for t in tnames], [_features(s) for s in snames]
    leaf = _jaccard([f[0] for f in tf], [f[0] for f in sf])
    scope = _jaccard([f[1] for f in tf], [f[1] for f in sf])
    if position or (len(tnames) == 1 and len(snames) == 1):  # one rank on each side: no evidence
        rt, rs, use_order = np.zeros(len(tnames)), np.zeros(len(snames)), False
    else:
        rt, t_inf = _ranks(tnames, target_order)
        rs, s_inf = _ranks(snames, source_order)
        use_order = t_inf and s_inf
    if use_order:
        order = 1.0 - np.abs(rt[:, None] - rs[None, :])
        score = 0.3 * leaf + 0.3 * scope + 0.4 * order
    else:
        order = None
        score = 0.5 * leaf + 0.5 * scope
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
        evidence = _evidence(tnames[i], snames[j], spec, False, leaf[i, j], scope[i, j])
        if order is not None:
            evidence.append(f"order {rt[i]:.2f} ~ {rs[j]:.2f}")
        if position:
            evidence.append(position)
        confidence = float(min(1.0, own[i]) * min(1.0, 0.5 + margin[i] / 0.2 * 0.5))
        matches.append(Match(tnames[i], snames[j], round(confidence, 2), tuple(evidence)))
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
    return matches, unresolved


def _solve_block(tnames: List[str], snames: List[str], t_order: Optional[Mapping[str, int]],
                 s_order: Optional[Mapping[str, int]], spec: VariableInfo, position: str,
                 memo: Dict[Any, Any]) -> Tuple[List[Match], List[Unresolved]]:
    """:func:`_solve_group` for one position of a numbered series, solved once per kind of block:
    layer 7 of 600 has the same names, but for its number, as layer 6, so the same answer."""
    if not position:
        return _solve_group(tnames, snames, t_order, s_order, spec, position)
    stem = {n: _features(n)[3] or n for n in tnames + snames}
    tnames, snames = sorted(tnames, key=stem.__getitem__), sorted(snames, key=stem.__getitem__)
    key = (tuple(stem[n] for n in tnames), tuple(stem[n] for n in snames))
    if key not in memo:
        m, u = _solve_group(tnames, snames, t_order, s_order, spec, position)
        ti, si = {n: i for i, n in enumerate(tnames)}, {n: i for i, n in enumerate(snames)}
        memo[key] = ([(ti[x.target], si[x.name], x.confidence, x.evidence[:-1]) for x in m],
                     [(tuple(ti[t] for t in x.targets), tuple(si[n] for n in x.names), x.reason) for x in u])
    pairs, groups = memo[key]
    return ([Match(tnames[i], snames[j], c, e + (position,)) for i, j, c, e in pairs],
            [Unresolved(tuple(tnames[i] for i in ts), tuple(snames[j] for j in ss), tuple(spec.shape), spec.dtype, r)
             for ts, ss, r in groups])


def align(targets: Iterable[VariableInfo], names: Iterable[VariableInfo], *,
          target_order: Optional[Sequence[str]] = None,
          source_order: Optional[Sequence[str]] = None) -> Alignment:
    """Pair targets with checkpoint variables by structure (see the module docstring).

    Args:
        targets: the targets to find a value for (e.g. a plan's ``missing``), as specs.
        names: the checkpoint variables that could provide them (e.g. a plan's ``unused``).
        target_order: target names in creation order (a Keras model's ``weights``, a graph's
            variables), if known: evidence for pairing by position.
        source_order: checkpoint names in the order they were saved, if known.

    Returns:
        An :class:`Alignment`: accepted matches and unresolved groups.

    Example:
        >>> t = [VariableInfo("h0/kernel", (4, 8), "float32"), VariableInfo("h0/bias", (8,), "float32")]
        >>> s = [VariableInfo("dnn/hiddenlayer_0/kernel", (4, 8), "float32"),
        ...      VariableInfo("dnn/hiddenlayer_0/bias", (8,), "float32")]
        >>> align(t, s).mapping
        {'dnn/hiddenlayer_0/bias': 'h0/bias', 'dnn/hiddenlayer_0/kernel': 'h0/kernel'}
    """
    _features.cache_clear()
    t_order = {n: i for i, n in enumerate(target_order)} if target_order is not None else None
    s_order = {n: i for i, n in enumerate(source_order)} if source_order is not None else None
    groups: Dict[Tuple[Tuple[int, ...], str], Tuple[List[VariableInfo], List[VariableInfo]]] = {}
    for t in targets:
        groups.setdefault((tuple(t.shape), t.dtype), ([], []))[0].append(t)
    for s in names:
        key = (tuple(s.shape), s.dtype)
        if key in groups:
            groups[key][1].append(s)
    matches: List[Match] = []
    unresolved: List[Unresolved] = []
    for (_shape, _dtype), (ts, ss) in groups.items():
        if not ss:
            continue
        memo: Dict[Any, Any] = {}
        for tsub, ssub, position in _by_series(sorted(t.name for t in ts), sorted(s.name for s in ss)):
            if tsub and ssub:
                m, u = _solve_block(tsub, ssub, t_order, s_order, ts[0], position, memo)
                matches += m
                unresolved += u
    matches.sort(key=lambda m: m.target)
    unresolved.sort(key=lambda u: u.targets)
    return Alignment(matches, unresolved)


@dataclass(frozen=True)
class Entry:
    """One map entry of a suggestion: a scope (``"a/"`` -> ``"b/"``) or one variable.

    Attributes:
        name: checkpoint name or scope (ending in ``/``).
        target: target name or scope.
        confidence: the lowest confidence of the variables it covers.
        evidence: the evidence (for a scope: of its variables, summarised).
        count: how many variables it covers.
    """

    name: str
    target: str
    confidence: float
    evidence: Tuple[str, ...]
    count: int = 1

    @property
    def is_scope(self) -> bool:
        """True for a scope-to-scope entry."""
        return self.name.endswith("/")

    def describe(self) -> str:
        """``"'a/' -> 'b/' (3 variables, 0.90: ...)"``."""
        what = f"{plural(self.count, 'variable')}, " if self.is_scope else ""
        return (f"{quote_name(self.name)} -> {quote_name(self.target)} "
                f"({what}{self.confidence:.2f}: {'; '.join(self.evidence)})")

    def to_dict(self) -> dict:
        """JSON-ready: name, target, confidence, evidence, count."""
        return {"name": self.name, "target": self.target, "confidence": self.confidence,
                "evidence": list(self.evidence), "count": self.count}


def scope_entries(matches: Sequence[Match], source_names: Iterable[str],
                  target_names: Iterable[str]) -> List[Entry]:
    """Fold matches into scope-to-scope entries wherever a whole scope moves together.

    A checkpoint scope becomes one entry when every name under it (among ``source_names``) is
    matched, all into one target scope, each keeping its leaf, and no other target lives in that
    target scope; everything else stays one entry per variable.

    Example:
        >>> ms = [Match("h0/kernel", "dnn/l0/kernel", 0.9), Match("h0/bias", "dnn/l0/bias", 0.9)]
        >>> [e.name + " -> " + e.target for e in scope_entries(ms, ["dnn/l0/kernel", "dnn/l0/bias"],
        ...                                                     ["h0/kernel", "h0/bias"])]
        ['dnn/l0/ -> h0/']
    """
    src_count = collections.Counter(map(_scope, source_names))
    tgt_count = collections.Counter(map(_scope, target_names))
    by_scope: Dict[str, List[Match]] = {}
    for m in matches:
        by_scope.setdefault(_scope(m.name), []).append(m)
    entries: List[Entry] = []
    for scope, ms in by_scope.items():
        first = ms[0].target
        tcut = first.rfind("/") + 1
        tscope, k = first[:tcut], len(scope)
        whole = (scope and tscope and 1 < len(ms) == src_count[scope] == tgt_count[tscope]
                 and all(m.target.rfind("/") + 1 == tcut and m.target.startswith(tscope)
                         and m.name[k:] == m.target[tcut:] for m in ms))
        if whole:
            evidence = sorted({e for m in ms for e in m.evidence[1:]})[:4]
            entries.append(Entry(scope, tscope, min(m.confidence for m in ms),
                                 tuple(["shapes of all " + plural(len(ms), "variable")] + evidence), len(ms)))
        else:
            entries += [Entry(m.name, m.target, m.confidence, m.evidence) for m in ms]
    entries.sort(key=lambda e: e.target)
    return entries

