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
    """The lower-case word tokens of a name, digits left out, synonyms folded.

    Example:
        >>> tokens("bert/encoder/layer_3/attention/output/LayerNorm")
        ('bert', 'encoder', 'layer', 'attention', 'output', 'layer', 'norm')
        >>> tokens("dnn/hiddenlayer_0")
        ('dnn', 'dense')
    """
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
    return name.rsplit("/", 1)[-1]


def _scope(name: str) -> str:
    return name.rsplit("/", 1)[0] + "/" if "/" in name else ""


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


def _numbers(name: str) -> Tuple[int, ...]:
    return tuple(int(x) for x in _DIGITS.findall(_scope(name)))


def _ranks(names: Sequence[str], order: Optional[Mapping[str, int]]) -> Tuple[np.ndarray, bool]:
    """Relative ranks (0..1) of ``names`` and whether that order carries evidence.

    A numbered series (names equal but for their numbers: ``layer_0``, ``layer_1``) ranks by its
    numbers, compared as numbers, so ``layer_3/query`` and ``layer_3/key`` share a rank; else a
    known creation/saving order ranks; else there is no order evidence.
    """
    n = len(names)
    if n < 2:
        return np.zeros(n), False
    stems: Dict[str, int] = {}
    for x in names:
        if _DIGITS.search(_scope(x)):
            stem = _DIGITS.sub("#", x)
            stems[stem] = stems.get(stem, 0) + 1
    if any(c > 1 for c in stems.values()):
        keys: List[Any] = [_numbers(x) for x in names]
    elif order is not None and all(x in order for x in names):
        keys = [order[x] for x in names]
    else:
        return np.zeros(n), False
    distinct = sorted(set(keys))
    if len(distinct) < 2:
        return np.zeros(n), False
    pos = {k: i / (len(distinct) - 1) for i, k in enumerate(distinct)}
    return np.array([pos[k] for k in keys]), True


def _token_matrix(token_lists: Sequence[Tuple[str, ...]], vocab: Dict[str, int]) -> np.ndarray:
    m = np.zeros((len(token_lists), len(vocab)), np.float32)
    for i, toks in enumerate(token_lists):
        for t in toks:
            m[i, vocab[t]] = 1.0
    return m


def _jaccard(a: Sequence[Tuple[str, ...]], b: Sequence[Tuple[str, ...]]) -> np.ndarray:
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


def _solve_group(tnames: List[str], snames: List[str], target_order: Optional[Mapping[str, int]],
                 source_order: Optional[Mapping[str, int]], spec: VariableInfo
                 ) -> Tuple[List[Match], List[Unresolved]]:
    from scipy.optimize import linear_sum_assignment

    leaf = _jaccard([tokens(_leaf(t)) for t in tnames], [tokens(_leaf(s)) for s in snames])
    scope = _jaccard([tokens(_scope(t)) for t in tnames], [tokens(_scope(s)) for s in snames])
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
    shape = f"shape {tuple(spec.shape)} {spec.dtype}"
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
        evidence = [shape if nt > 1 or ns > 1 else f"{shape}, the only candidate of its shape"]
        if leaf[i, j] > 0:
            evidence.append(f"leaf {quote_name(_leaf(snames[j]))} ~ {quote_name(_leaf(tnames[i]))}")
        if scope[i, j] > 0:
            shared = sorted(set(tokens(_scope(tnames[i]))) & set(tokens(_scope(snames[j]))))
            evidence.append("scope tokens " + ", ".join(map(quote_name, shared)))
        if order is not None:
            evidence.append(f"order {rt[i]:.2f} ~ {rs[j]:.2f}")
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
            add(group, "the evidence (names, scopes, order) fits more than one pairing equally well")
    if blind:
        add(blind, "nothing but their shape relates them (no shared name tokens, no order evidence)")
    return matches, unresolved


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
        m, u = _solve_group(sorted(t.name for t in ts), sorted(s.name for s in ss), t_order, s_order, ts[0])
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
    by_scope: Dict[str, List[Match]] = {}
    for m in matches:
        by_scope.setdefault(_scope(m.name), []).append(m)
    src_count: Dict[str, int] = {}
    for n in source_names:
        src_count[_scope(n)] = src_count.get(_scope(n), 0) + 1
    tgt_count: Dict[str, int] = {}
    for n in target_names:
        tgt_count[_scope(n)] = tgt_count.get(_scope(n), 0) + 1
    entries: List[Entry] = []
    for scope, ms in by_scope.items():
        tscopes = {_scope(m.target) for m in ms}
        whole = (scope and len(tscopes) == 1 and len(ms) == src_count.get(scope, 0)
                 and all(_leaf(m.name) == _leaf(m.target) for m in ms))
        tscope = next(iter(tscopes))
        if whole and tscope and len(ms) == tgt_count.get(tscope, 0) and len(ms) > 1:
            evidence = sorted({e for m in ms for e in m.evidence[1:]})[:4]
            entries.append(Entry(scope, tscope, min(m.confidence for m in ms),
                                 tuple(["shapes of all " + plural(len(ms), "variable")] + evidence), len(ms)))
        else:
            entries += [Entry(m.name, m.target, m.confidence, m.evidence) for m in ms]
    entries.sort(key=lambda e: e.target)
    return entries

