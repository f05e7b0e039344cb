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

import functools
import itertools
import re
from typing import (
    Any,
    Dict,
    Iterable,
    List,
    Mapping,
    Optional,
    Sequence,
    Tuple,
)

import numpy as np

from ..specs import VariableInfo
from ..text import quote_name
from .conventions import rewrite, rewrite_all
from .entries import Alignment, Columns, Entry, Match, Unresolved, scope_entries
from .tensorops import refines

__all__ = ["Match", "Unresolved", "Alignment", "Entry", "align", "tokens", "natural_key", "scope_entries",
           "ALIGN_MODES"]

#: Valid values of ``Source(align=...)``.
ALIGN_MODES = ("structure",)
#: Below this margin a pair is not separated from its best alternative: unresolved.
MARGIN = 1e-3
#: Below this score a pair has no evidence beyond its shape: not proposed.
MIN_SCORE = 0.25
#: A pair whose relative positions (0..1) on the two sides differ by more than this contradicts
#: its own order evidence: not applied.
ORDER_TOLERANCE = 0.5

_SPLIT = re.compile(r"[/_\-.:\s]+")
_CAMEL = re.compile(r"(?<=[a-z])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])|(?<=[A-Za-z])(?=\d)|(?<=\d)(?=[A-Za-z])")
_DIGITS = re.compile(r"[0-9]+")
#: Tokens that mean the same thing in the naming schemes of TF1, Keras 2/3 and Model Garden.
_SYNONYMS = {
    "weights": "kernel", "weight": "kernel", "w": "kernel", "kernel": "kernel",
    "biases": "bias", "b": "bias", "bias": "bias",
    "scale": "gamma", "gamma": "gamma", "offset": "beta", "center": "beta", "beta": "beta",
    "embedding": "embeddings", "embeddings": "embeddings",
    "hiddenlayer": "dense", "fc": "dense", "linear": "dense", "dense": "dense", "hidden": "dense",
    "layernorm": "norm", "norm": "norm", "ln": "norm", "normalization": "norm",
    "feedforward": "mlp", "ffn": "mlp", "mlp": "mlp", "attn": "attention", "attention": "attention",
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
    return _template_tokens(_DIGITS.sub("0", rewrite(name)))


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


_DIGITS_TO_ZERO = bytes.maketrans(b"0123456789", b"0" * 10)
_ZERO_RUN = re.compile(b"00+")
_DIGITS_ONLY = bytes(c if 48 <= c <= 57 else 32 for c in range(256))


@functools.lru_cache(maxsize=65536)
def _template_features(template: str) -> Tuple[Tuple[str, ...], Tuple[str, ...]]:
    """Leaf and scope tokens of a template (one split per template, not per name)."""
    cut = template.rfind("/") + 1
    return _template_tokens(template[cut:]), _template_tokens(template[:cut])


class _Features:
    """What alignment knows of each name: its template (each digit run as ``0``) and its scope
    numbers (the digit runs before the leaf, as ints; ``()`` for none).

    Built for all names at once with no Python step per name, since that is what a
    10,000-variable model pays for every name: the templates from the names joined by newlines
    and worked on as bytes (translate, one regex; UTF-8 keeps ASCII digits and newlines single
    bytes), then the numbers of each family of one template together (each name of a family has
    as many digit runs, the first ones in its scope), each distinct run of digits parsed once.
    """

    __slots__ = ("template", "numbers")

    def __init__(self, names: Sequence[str]) -> None:
        self.template: Dict[str, str] = {}
        self.numbers: Dict[str, Tuple[int, ...]] = {}
        # Names as the convention table reads them (``ln_1`` -> ``attnnorm``), before their
        # digits become series numbers: the numbers of a convention's names are not positions.
        written = rewrite_all(names)
        joined = "\n".join(written)
        if joined.count("\n") != len(names) - 1:  # a name holds a newline: one at a time
            for n, w in zip(names, written):
                self.template[n] = _DIGITS.sub("0", w)
                self.numbers[n] = tuple(map(int, _DIGITS.findall(w, 0, w.rfind("/") + 1)))
            return
        as_written = dict(zip(names, written))
        # (surrogatepass: a name that is not valid Unicode, e.g. a file name's undecodable byte, goes
        # through the bytes and back unchanged)
        raw = joined.encode("utf-8", "surrogatepass")
        templates = _ZERO_RUN.sub(b"0", raw.translate(_DIGITS_TO_ZERO)).decode("utf-8", "surrogatepass").split("\n")
        parsed: Dict[Tuple[bytes, ...], Tuple[int, ...]] = {}  # digit runs -> numbers
        families: Dict[str, List[str]] = {}
        for name, template in zip(names, templates):
            family = families.get(template)
            if family is None:
                families[template] = [name]
            else:
                family.append(name)
        for template, members in families.items():
            self.template.update(zip(members, itertools.repeat(template)))  # one object per family
            in_scope = template.count("0", 0, template.rfind("/") + 1)
            if not in_scope:
                self.numbers.update(zip(members, itertools.repeat(())))
                continue
            runs = template.count("0")
            joined_members = " ".join(map(as_written.__getitem__, members))
            digits = joined_members.encode("utf-8", "surrogatepass").translate(_DIGITS_ONLY).split()
            rows: List[Tuple[bytes, ...]] = list(zip(*[iter(digits)] * runs))
            if in_scope < runs:
                rows = [r[:in_scope] for r in rows]
            # Parse each distinct row once (a series repeats its positions family after family).
            for r in set(rows).difference(parsed):
                parsed[r] = tuple(map(int, r))
            self.numbers.update(zip(members, map(parsed.__getitem__, rows)))

    def tokens(self, name: str) -> Tuple[Tuple[str, ...], Tuple[str, ...]]:
        """Leaf and scope tokens of a name."""
        return _template_features(self.template[name])

    def stems(self, names: Sequence[str]) -> List[str]:
        """Per name: its template when it has scope numbers (its numbered series), else itself."""
        template, numbers = self.template, self.numbers
        return [template[n] if numbers[n] else n for n in names]

    def is_series(self, names: Sequence[str]) -> bool:
        """True when the names form a numbered series: two of them equal but for their scope
        numbers (``layer_0/...``, ``layer_1/...``)."""
        template, numbers = self.template, self.numbers
        stems = [template[n] for n in names if numbers[n]]
        return len(set(stems)) < len(stems)


def _ranks(names: Sequence[str], order: Optional[Mapping[str, int]], feats: _Features
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
    if feats.is_series(names):
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


def _by_series(tnames: List[str], snames: List[str], feats: _Features) -> List[_Block]:
    """Split one shape group by series position when both sides are numbered series with the same
    number of positions (the k-th ``layer_N`` of the checkpoint is the k-th ``transformer_M`` of
    the target); else the group as it is. Keeps large models linear: 12 x 600 equal layers are
    600 small problems, not one of 7,200 x 7,200. Names are given sorted."""
    numbers = feats.numbers
    if (not (feats.is_series(tnames) and feats.is_series(snames))
            or len(set(map(numbers.__getitem__, tnames))) != len(set(map(numbers.__getitem__, snames)))):
        return [(tnames, snames, "", None)]
    t_at, s_at = _at_positions(tnames, feats), _at_positions(snames, feats)
    n = len(t_at)
    if n < 2:
        return [(tnames, snames, "", None)]
    return [(tn, sn, f"series position {k + 1} of {n}", (tst, sst))
            for k, ((tst, tn), (sst, sn)) in enumerate(zip(t_at, s_at))]


def _at_positions(names: List[str], feats: _Features) -> List[Tuple[Tuple[str, ...], List[str]]]:
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
              feats: _Features) -> List[str]:
    shape = f"shape {tuple(spec.shape)} {spec.dtype}"
    evidence = [f"{shape}, the only candidate of its shape" if alone else shape]
    if leaf > 0:
        evidence.append(f"leaf {quote_name(_leaf(sname))} ~ {quote_name(_leaf(tname))}")
    if scope > 0:
        shared = sorted(set(feats.tokens(tname)[1]) & set(feats.tokens(sname)[1]))
        evidence.append("scope tokens " + ", ".join(map(quote_name, shared)))
    return evidence


_BLIND = "nothing but their shape relates them (no shared name tokens, no order evidence)"
_CONTRADICTED = ("the best pairing's own order evidence disagrees (the two sides hold these at different "
                 "positions), so it is not applied")
_TIED = "the evidence (names, scopes, order) fits more than one pairing equally well"


def _solve_pair(tname: str, sname: str, spec: VariableInfo, position: str, feats: _Features
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
                 feats: _Features) -> Tuple[List[Match], List[Unresolved]]:
    from scipy.optimize import linear_sum_assignment

    if len(tnames) == 1 and len(snames) == 1:  # the common case once split by series: no matrix
        return _solve_pair(tnames[0], snames[0], spec, position, feats)
    tf, sf = [feats.tokens(t) for t in tnames], [feats.tokens(s) for s in snames]
    leaf = _jaccard([f[0] for f in tf], [f[0] for f in sf])
    scope = _jaccard([f[1] for f in tf], [f[1] for f in sf])
    if position or (len(tnames) == 1 and len(snames) == 1):  # one rank on each side: no evidence
        rt, rs, use_order = np.zeros(len(tnames)), np.zeros(len(snames)), False
    else:
        rt, t_inf = _ranks(tnames, target_order, feats)
        rs, s_inf = _ranks(snames, source_order, feats)
        # Ranks compare only when both sides order their names as finely: a side that holds two
        # of them at one rank (``layer4/0/bn1`` and ``layer4/0/downsample/1`` both at 4, 0, 1)
        # against one that does not would pair by a scale that is not the same.
        use_order = t_inf and s_inf and len(set(rt.tolist())) == len(set(rs.tolist()))
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
                 spec: VariableInfo, memo: Dict[Any, Any], feats: _Features
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


def _families(names: List[str], feats: _Features
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


def _solve_regular(tnames: List[str], snames: List[str], spec: VariableInfo, feats: _Features,
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
    for (shape, dtype), (ts, ss, spec) in groups.items():
        for other in by_size.get((int(np.prod(shape, dtype=np.int64)), dtype), ()):
            if other != shape and refines(other, shape):
                ss.extend(s_groups[(other, dtype)][0])
                reshaped = True
    groups = {k: g for k, g in groups.items() if g[1]}
    feats = _Features(list(dict.fromkeys(n for ts, ss, _ in groups.values() for n in itertools.chain(ts, ss))))
    matches = Columns()
    unresolved: List[Unresolved] = []
    for tnames, snames, spec in groups.values():
        regular = _solve_regular(tnames, snames, spec, feats, matches)
        if regular is not None:
            unresolved += regular
            continue
        memo: Dict[Any, Any] = {}
        for block in _by_series(sorted(tnames), sorted(snames), feats):
            if block[0] and block[1]:
                m, u = _solve_block(block, t_order, s_order, spec, memo, feats)
                matches.extend(m)
                unresolved += u
    if reshaped:
        matches, unresolved = _one_target_each(matches, unresolved)
    matches, unresolved = _layers_as_units(matches, unresolved, {t.name: t for t in targets},
                                           {n.name: n for n in names})
    unresolved.sort(key=lambda u: u.targets)
    return Alignment(matches.sorted_by_target(), unresolved)


def _scope(name: str) -> str:
    return name[:name.rfind("/") + 1]


#: Leaf names (after synonym folding) of a layer's own parameters.
_LAYER_PARAMS = frozenset({"kernel", "bias", "gamma", "beta", "moving_mean", "moving_variance", "embeddings",
                           "recurrent_kernel", "reverse_embeddings", "running_mean", "running_var"})


def _tok_leaf(name: str) -> str:
    leaf = _leaf(name)
    return _SYNONYMS.get(leaf.lower(), leaf.lower())


def _one_target_each(matches: "Columns", unresolved: List[Unresolved]) -> Tuple["Columns", List[Unresolved]]:
    """Where one checkpoint tensor was matched in two shape groups (as itself and reshaped), keep
    its match that is clearly the more confident (by more than 0.05); else neither: both targets
    become unresolved, with both candidates named."""
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


def _layers_as_units(matches: "Columns", unresolved: List[Unresolved], tspecs: Mapping[str, VariableInfo],
                     sspecs: Mapping[str, VariableInfo]) -> Tuple["Columns", List[Unresolved]]:
    """Layers are units: the matched variables of one target layer (a scope: kernel and bias,
    gamma and beta and the moving statistics) come from one checkpoint module, and one module's
    tensors go to one target layer. A layer whose matches come from two modules (or a module
    whose tensors went to two layers) keeps none of them: its targets are unresolved, with the
    candidates named."""
    # Only layer parameters make a unit: a table held directly under a scope
    # (``bert/embeddings/position_embeddings``) is a tensor of its own.
    t_scope = [_scope(t) if _tok_leaf(t) in _LAYER_PARAMS else "" for t in matches.target]
    s_scope = [_scope(n) if _tok_leaf(n) in _LAYER_PARAMS else "" for n in matches.name]
    modules: Dict[str, set] = {}
    layers: Dict[str, set] = {}
    for t, s in zip(t_scope, s_scope):
        if t and s:
            modules.setdefault(t, set()).add(s)
            layers.setdefault(s, set()).add(t)
    bad_t = {t for t, ms in modules.items() if len(ms) > 1}
    bad_s = {s for s, ls in layers.items() if len(ls) > 1}
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


