"""What structural alignment reads in a name: word tokens, its numbered-series template, positions.

:func:`tokens` splits a name into lower-case words with synonyms folded (``weights`` ~ ``kernel``,
``LayerNorm`` ~ ``layer_norm``) after the convention table has rewritten it
(:mod:`ckptmerge.alignment.conventions`). :class:`Features` holds, for every name of an alignment,
its *template* (each run of digits as ``0``: ``layer_0/attention``) and its scope numbers, and
tells which of those numbers are series positions. Pure, and built for 100,000 names at a time.
"""

from __future__ import annotations

import functools
import itertools
import os
import re
from typing import Any, Dict, FrozenSet, List, Mapping, Optional, Sequence, Tuple

import numpy as np

from .conventions import digit_sensitive, in_context, positional, rewrite, rewrite_all

__all__ = ["tokens", "natural_key", "leaf_of", "SYNONYMS", "Features", "refined_ranks", "leaf_kinds"]

_SPLIT = re.compile(r"[/_\-.:\s]+")
_CAMEL = re.compile(r"(?<=[a-z])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])|(?<=[A-Za-z])(?=\d)|(?<=\d)(?=[A-Za-z])")
_DIGITS = re.compile(r"[0-9]+")
#: Tokens that mean the same thing in the naming schemes of TF1, Keras 2/3 and Model Garden.
SYNONYMS = {
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
        >>> tokens("bert/encoder/layer_3/attention/output/LayerNorm")  # (a role of the convention table)
        ('bert', 'encoder', 'layer', 'attnnorm')
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
                out.append(SYNONYMS.get(t, t))
    return tuple(out)


def natural_key(name: str) -> Tuple[Any, ...]:
    """Sort key that orders numbers by value: ``layer_9`` before ``layer_10``.

    Example:
        >>> sorted(["l_10/k", "l_9/k", "l_1/k"], key=natural_key)
        ['l_1/k', 'l_9/k', 'l_10/k']
    """
    return tuple((0, int(p), "") if p.isdigit() else (1, 0, p) for p in re.split(r"(\d+)", name) if p)


def leaf_of(name: str) -> str:
    return name[name.rfind("/") + 1:]


_DIGITS_TO_ZERO = bytes.maketrans(b"0123456789", b"0" * 10)
_DIGITS_ONLY = bytes(c if 48 <= c <= 57 else 32 for c in range(256))


def _zero_runs(raw: bytes) -> bytes:
    """Each run of ``0`` bytes as one (what ``re.sub(b"00+", b"0", raw)`` gives, in a few C-speed
    passes: each halves every run, and runs of digits are short).

    Example:
        >>> _zero_runs(b"l00/0000/b0")
        b'l0/0/b0'
    """
    while b"00" in raw:
        raw = raw.replace(b"00", b"0")
    return raw


@functools.lru_cache(maxsize=65536)
def _template_features(template: str) -> Tuple[Tuple[str, ...], Tuple[str, ...]]:
    """Leaf and scope tokens of a template (one split per template, not per name)."""
    cut = template.rfind("/") + 1
    return _template_tokens(template[cut:]), _template_tokens(template[:cut])


class Features:
    """What alignment knows of each name: its template (each digit run as ``0``) and its scope
    numbers (the digit runs before the leaf, as ints; ``()`` for none).

    Built for all names at once with no Python step per name, since that is what a
    10,000-variable model pays for every name: the templates from the names joined by newlines
    and worked on as bytes (translate, one regex; UTF-8 keeps ASCII digits and newlines single
    bytes), then the numbers of each family of one template together (each name of a family has
    as many digit runs, the first ones in its scope), each distinct run of digits parsed once.
    """

    __slots__ = ("template", "numbers", "_dimensional")

    def __init__(self, names: Sequence[str]) -> None:
        self.template: Dict[str, str] = {}
        self.numbers: Dict[str, Tuple[int, ...]] = {}
        self._dimensional: Optional[bool] = None  # (see dimensional())
        read = in_context(names)  # (a segment its sibling reads as another role: CONTEXT)
        if read is not names:
            inner = Features(read)
            self.template = {n: inner.template[r] for n, r in zip(names, read)}
            self.numbers = {n: inner.numbers[r] for n, r in zip(names, read)}
            return
        # Names as the convention table reads them (``ln_1`` -> ``attnnorm``), before their
        # digits become series numbers: the numbers of a convention's names are not positions.
        joined = "\n".join(names)
        if joined.count("\n") != len(names) - 1:  # a name holds a newline: one at a time
            for n, w in zip(names, rewrite_all(names)):
                self.template[n] = _DIGITS.sub("0", w)
                self.numbers[n] = tuple(map(int, _DIGITS.findall(w, 0, w.rfind("/") + 1)))
            return
        # (surrogatepass: a name that is not valid Unicode, e.g. a file name's undecodable byte, goes
        # through the bytes and back unchanged)
        raw = joined.encode("utf-8", "surrogatepass")
        templates = _zero_runs(raw.translate(_DIGITS_TO_ZERO)).decode("utf-8", "surrogatepass").split("\n")
        # convention names that are members of a numbered family here (``norm0``, ``norm1``, ``norm2``)
        keep = positional(names, templates)
        # The table rewrites each distinct template once: names that differ only in their
        # numbers read alike, and keep their digits in order. Templates the table reads by their
        # digits (``ln_0``: ``ln_1`` or ``ln_2``) are rewritten name by name.
        distinct = list(dict.fromkeys(templates))
        sensitive = {t for t, odd in zip(distinct, digit_sensitive(distinct)) if odd}
        written = dict(zip(distinct, rewrite_all(distinct, keep)))
        as_written: Dict[str, str] = {}  # the names rewritten one by one
        if sensitive:
            odd = [n for n, t in zip(names, templates) if t in sensitive]
            as_written = dict(zip(odd, rewrite_all(odd, keep)))
            templates = [_DIGITS.sub("0", as_written[n]) if t in sensitive else written[t]
                         for n, t in zip(names, templates)]
        else:
            templates = list(map(written.__getitem__, templates))
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
            joined_members = " ".join(map(as_written.get, members, members) if as_written else members)
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

    @staticmethod
    def template_tokens(template: str) -> Tuple[Tuple[str, ...], Tuple[str, ...]]:
        """Leaf and scope tokens of a template (what :meth:`tokens` gives each name of it)."""
        return _template_features(template)

    def stems(self, names: Sequence[str]) -> List[str]:
        """Per name: its template when it has scope numbers (its numbered series), else itself."""
        template, numbers = self.template, self.numbers
        return [template[n] if numbers[n] else n for n in names]

    def hazards(self, names: Sequence[str]) -> FrozenSet[FrozenSet[str]]:
        """Pairs of scope templates whose numbers count different things, among one side's names:
        two scopes that hold a name at the same numbers (torchvision's ``layer4/0/bn1/`` and
        ``layer4/0/downsample/1/``, both at 4, 0, 1), where those numbers are not all in the
        scope the two share (``layer4/0/``). Their numbers do not compare as positions.

        Example:
            >>> f = Features(["l4/0/bn1/g", "l4/0/down/1/g", "l4/0/bn2/g"])
            >>> [sorted(p) for p in f.hazards(["l4/0/bn1/g", "l4/0/down/1/g", "l4/0/bn2/g"])]
            [['l0/0/bn0/', 'l0/0/down/0/']]
        """
        template, numbers = self.template, self.numbers
        scope_of = {t: t[:t.rfind("/") + 1] for t in set(map(template.__getitem__, names))}
        scopes = sorted({sc for sc in scope_of.values() if "0" in sc})
        pairs = [(a, b) for i, a in enumerate(scopes) for b in scopes[i + 1:]
                 if a.count("0") == b.count("0") and os.path.commonprefix([a, b]).count("0") < a.count("0")]
        if not pairs:
            return frozenset()
        involved = {x for p in pairs for x in p}
        held: Dict[str, set] = {x: set() for x in involved}
        for n in names:
            sc = scope_of[template[n]]
            if sc in involved:
                held[sc].add(numbers[n])
        return frozenset(frozenset(p) for p in pairs if held[p[0]] & held[p[1]])

    def with_positions(self, names: Sequence[str], hazards: FrozenSet[FrozenSet[str]] = frozenset()) -> "Features":
        """These features with each name's numbers cut to its series positions (see
        :func:`_side_positions`; ``hazards``: of the names' side, see :meth:`hazards`); ``self``
        when every scope number is one (the usual case)."""
        cut = _side_positions(names, self, hazards)
        if cut is None:
            return self
        view = Features.__new__(Features)
        view.template, view.numbers, view._dimensional = self.template, {**self.numbers, **cut}, self._dimensional
        return view

    def dimensional(self) -> bool:
        """Whether a numbered scope of any name holds a Keras class name's dimension (``conv0d``:
        see :func:`_side_positions`); found once, over the distinct templates."""
        if self._dimensional is None:
            self._dimensional = any(_DIMENSION.search(t[:t.rfind("/") + 1]) for t in set(self.template.values()))
        return self._dimensional

    def is_series(self, names: Sequence[str]) -> bool:
        """True when the names form a numbered series: two of them equal but for their scope
        numbers (``layer_0/...``, ``layer_1/...``)."""
        template, numbers = self.template, self.numbers
        stems = [template[n] for n in names if numbers[n]]
        return len(set(stems)) < len(stems)


#: A dimension in a layer class's name, as a template shows it (``conv0d``, ``pooling0d``).
_DIMENSION = re.compile(r"[a-z]0d(?![a-z])")


def _series_root(scope: str) -> str:
    """A scope template up to its first number (``layer0`` of ``layer0/0/bn0/``, ``conv0`` of
    ``conv0_block0_0_bn/``): the series it belongs to."""
    return scope[:scope.find("0") + 1]


def _side_positions(names: Sequence[str], feats: Features, hazards: FrozenSet[FrozenSet[str]]
                    ) -> Optional[Dict[str, Tuple[int, ...]]]:
    """Which scope numbers of one side's names (of one shape group) are series positions, where
    not all are.

    Names are compared by all their scope numbers, in order (``block1/unit_2/conv3`` after
    ``block1/unit_2/conv1``), unless the side holds two scopes whose numbers count different
    things (``hazards``): torchvision's ``layer4/0/bn1/`` and ``layer4/0/downsample/1/`` are both
    at 4, 0, 1, but the ``1`` of ``bn1`` is part of a name and the ``1`` of ``downsample/1`` an
    index into another module. Then only the numbers inside the scope prefix that every numbered
    scope of the side shares are positions (``4``, ``0``: the block); and numbers of two series
    (``batch_normalization_3`` beside ``dense_3``) are no positions at all (``()``).

    Returns:
        ``None`` when every scope number is a position; else ``{name: positions}``.
    """
    if not hazards and not feats.dimensional():  # (then every scope number is a position: below)
        return None
    template = feats.template
    scopes = set()
    for t in set(map(template.__getitem__, names)):
        scope = t[:t.rfind("/") + 1]
        if "0" in scope:  # (templates hold each run of digits as one "0")
            scopes.add(scope)
    if len(scopes) < 2:
        return None
    # A Keras class name's dimension (``conv2d_0`` beside ``norm_2`` in one stage) is a number of
    # one scope that the others lack: those scopes do not compare number by number either.
    dims = any(map(_DIMENSION.search, scopes)) and len({sc.count("0") for sc in scopes}) > 1
    if not dims and not any(p <= scopes for p in hazards):
        return None
    numbers = feats.numbers
    if len({_series_root(sc) for sc in scopes}) > 1:
        return {n: () for n in names if numbers[n]}
    # (a prefix cut inside a word holds no number: each run of digits is one "0")
    k = os.path.commonprefix(sorted(scopes)).count("0")
    if all(sc.count("0") == k for sc in scopes):
        return None
    return {n: numbers[n][:k] for n in names if numbers[n]}


def refined_ranks(tnames: Sequence[str], snames: Sequence[str], rt: np.ndarray, rs: np.ndarray,
                  t_order: Optional[Mapping[str, int]], s_order: Optional[Mapping[str, int]], feats: Features
                  ) -> Tuple[np.ndarray, np.ndarray]:
    """The ranks of ``align._ranks`` again, where the side that ranks its names more coarsely (a
    numbered series ``block_1``..``block_4`` holding four tensors a block, against a flat Keras
    counter ``dense_8``..``dense_23``) has a known order that refines its numbers: that order
    ranks it instead, so that the two sides compare. Only an order that never contradicts the
    series (its numbered names sorted by it have non-decreasing numbers; a name without numbers,
    a final norm beside the blocks, has no place in the series to contradict) refines it; else
    the ranks as they were (they do not compare, and no order evidence is used).

    Example:
        >>> t, s = ["b_1/q", "b_1/k"], ["dense_3/x", "dense_4/x"]
        >>> refined_ranks(t, s, np.zeros(2), np.array([0.0, 1.0]), {"b_1/q": 0, "b_1/k": 1}, None,
        ...               Features(t + s))[0].tolist()
        [0.0, 1.0]
    """
    coarse_t = len(set(rt.tolist())) < len(set(rs.tolist()))
    names, order = (tnames, t_order) if coarse_t else (snames, s_order)
    if order is None or not all(x in order for x in names):
        return rt, rs
    numbers = [feats.numbers[x] for x in sorted(names, key=order.__getitem__) if feats.numbers[x]]
    if any(a > b for a, b in zip(numbers, numbers[1:])):
        return rt, rs
    keys = sorted({order[x] for x in names})
    if len(keys) < 2:
        return rt, rs
    pos = {k: i / (len(keys) - 1) for i, k in enumerate(keys)}
    ranks = np.array([pos[order[x]] for x in names])
    return (ranks, rs) if coarse_t else (rt, ranks)


def leaf_kinds(tnames: List[str], snames: List[str], feats: Features
               ) -> Optional[List[Tuple[List[str], List[str]]]]:
    """``(targets, names)`` per leaf kind of a shape group, when both sides hold at least two kinds,
    the same ones, as many of each; else ``None``.

    Example:
        >>> leaf_kinds(["a/bias", "a/gamma"], ["x/bias", "y/gamma"], Features(["a/bias", "a/gamma", "x/bias", "y/gamma"]))
        [(['a/bias'], ['x/bias']), (['a/gamma'], ['y/gamma'])]
    """
    def split(names: List[str]) -> Dict[Tuple[str, ...], List[str]]:
        out: Dict[Tuple[str, ...], List[str]] = {}
        for n in names:
            out.setdefault(feats.tokens(n)[0], []).append(n)
        return out

    t, s = split(tnames), split(snames)
    if len(t) < 2 or set(t) != set(s) or any(len(t[k]) != len(s[k]) for k in t):
        return None
    return [(t[k], s[k]) for k in sorted(t)]
