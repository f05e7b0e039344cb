"""What alignment gives: matches, unresolved groups, and the map entries folded from them.

:func:`~ckptmerge.alignment.align.align` returns an :class:`Alignment` (accepted :class:`Match`
pairs, held as :class:`Columns`, and :class:`Unresolved` groups); :func:`scope_entries` folds the
matches into the entries of a suggested map (:class:`Entry`), a scope wherever a whole scope moves
together. Pure: names in, tuples out.
"""

from __future__ import annotations

import collections
import collections.abc
import functools
import itertools
import operator
from dataclasses import dataclass, field
from typing import Any, Dict, Iterable, Iterator, List, NamedTuple, Optional, Sequence, Tuple

from ..core.text import plural, quote_name

__all__ = ["Match", "Unresolved", "Alignment", "Columns", "match_columns", "scopes_of", "Entry", "scope_entries"]


class Match(NamedTuple):
    """One proposed pair: checkpoint name -> target name, with its evidence (a named tuple: a
    10,000-variable model makes 10,000 of them, and a tuple is one cheap object).

    Attributes:
        target: the target name.
        name: the checkpoint name.
        confidence: 0..1: the evidence's score, discounted when the best alternative is close.
        evidence: one short phrase per piece of evidence (shape, leaf, scope tokens, order),
            shared by every match of one kind of block of a numbered series.
        position: where in a numbered series the pair sits (``"series position 3 of 12"``), or
            ``""``: evidence too, kept apart so that the rest can be shared.
    """

    target: str
    name: str
    confidence: float
    evidence: Tuple[str, ...] = ()
    position: str = ""

    @property
    def reasons(self) -> Tuple[str, ...]:
        """All the evidence: :attr:`evidence`, then :attr:`position` if any."""
        return self.evidence + (self.position,) if self.position else self.evidence

    def describe(self) -> str:
        """``"'name' -> 'target' (0.93: shape (3, 4) float32; leaf 'kernel'; ...)"``."""
        return f"{quote_name(self.name)} -> {quote_name(self.target)} ({self.confidence:.2f}: {'; '.join(self.reasons)})"


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

    def __post_init__(self) -> None:  # each name once, sorted, however the groups were gathered
        object.__setattr__(self, "targets", tuple(sorted(set(self.targets))))
        object.__setattr__(self, "names", tuple(sorted(set(self.names))))

    def describe(self) -> str:
        """One line: the targets, the names, and why.

        Example:
            >>> Unresolved(("b", "a"), ("y", "x", "y"), (2,), "float32", "a tie").describe()
            "'a', 'b' <- one of 'x', 'y' (float32 (2,)): a tie"
        """
        return (f"{', '.join(map(quote_name, self.targets))} <- one of "
                f"{', '.join(map(quote_name, self.names))} ({self.dtype} {self.shape}): {self.reason}")


@dataclass(frozen=True)
class Alignment:
    """The result of :func:`align` for one source.

    Attributes:
        matches: accepted pairs, sorted by target (a sequence of :class:`Match`).
        unresolved: groups the evidence cannot separate.
    """

    matches: Sequence[Match] = field(default_factory=list)
    unresolved: List[Unresolved] = field(default_factory=list)

    @property
    def mapping(self) -> Dict[str, str]:
        """``{checkpoint name: target}`` of the accepted pairs."""
        targets, names = match_columns(self.matches)[:2]
        return dict(zip(names, targets))


class Columns(collections.abc.Sequence):
    """Matches held as five columns (one list per field of :class:`Match`); a :class:`Match` is
    built only when one is read. A 10,000-variable model's matches are then a few lists, not
    10,000 objects for the garbage collector to walk."""

    __slots__ = ("target", "name", "confidence", "evidence", "position", "scopes")
    _FIELDS = ("target", "name", "confidence", "evidence", "position")

    def __init__(self) -> None:
        self.target: List[str] = []
        self.name: List[str] = []
        self.confidence: List[float] = []
        self.evidence: List[Tuple[str, ...]] = []
        self.position: List[str] = []
        #: the scopes of ``target`` and ``name`` (each name up to its last ``/``), where someone
        #: computed them already (``None`` otherwise): see :func:`scopes_of`.
        self.scopes: Optional[Tuple[List[str], List[str]]] = None

    def extend(self, matches: Iterable[Match]) -> None:
        self.scopes = None
        for m in matches:
            self.target.append(m.target)
            self.name.append(m.name)
            self.confidence.append(m.confidence)
            self.evidence.append(m.evidence)
            self.position.append(m.position)

    def sorted_by_target(self) -> "Columns":
        out = Columns()
        order = sorted(range(len(self.target)), key=self.target.__getitem__)
        for f in self._FIELDS:
            setattr(out, f, list(map(getattr(self, f).__getitem__, order)))
        if self.scopes is not None:
            out.scopes = (list(map(self.scopes[0].__getitem__, order)), list(map(self.scopes[1].__getitem__, order)))
        return out

    def without(self, drop: set) -> "Columns":
        """These matches but those at the indices in ``drop``."""
        if not drop:
            return self
        out = Columns()
        keep = [i for i in range(len(self)) if i not in drop]
        for f in self._FIELDS:
            setattr(out, f, list(map(getattr(self, f).__getitem__, keep)))
        if self.scopes is not None:
            out.scopes = (list(map(self.scopes[0].__getitem__, keep)), list(map(self.scopes[1].__getitem__, keep)))
        return out

    def __len__(self) -> int:
        return len(self.target)

    def __getitem__(self, i: Any) -> Any:
        if isinstance(i, slice):
            return list(self)[i]
        return _MATCH((self.target[i], self.name[i], self.confidence[i], self.evidence[i], self.position[i]))

    def __iter__(self) -> Iterator[Match]:
        return map(_MATCH, zip(self.target, self.name, self.confidence, self.evidence, self.position))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, collections.abc.Sequence) and list(self) == list(other)

    def __repr__(self) -> str:
        return repr(list(self))


def scopes_of(matches: Sequence[Match]) -> Tuple[List[str], List[str]]:
    """The scopes (each name up to its last ``/``) of the matches' targets and names, computed
    once per :class:`Columns` (alignment reads them to keep layers as units, and suggestions to
    fold scopes): kept on the columns, carried through :meth:`Columns.sorted_by_target` and
    :meth:`Columns.without`, dropped when matches are added."""
    targets, names = match_columns(matches)[:2]
    cached = getattr(matches, "scopes", None)
    if cached is not None and len(cached[0]) == len(targets) and len(cached[1]) == len(names):
        return cached
    found = ([t[:t.rfind("/") + 1] for t in targets], [n[:n.rfind("/") + 1] for n in names])
    if isinstance(matches, Columns):
        matches.scopes = found
    return found


def match_columns(matches: Sequence[Match]) -> Tuple[List[str], List[str], List[float], List[Tuple[str, ...]], List[str]]:
    """The five columns (target, name, confidence, evidence, position) of some matches."""
    if isinstance(matches, Columns):
        return matches.target, matches.name, matches.confidence, matches.evidence, matches.position
    if not matches:
        return [], [], [], [], []
    return tuple(map(list, zip(*matches)))  # type: ignore[return-value]


#: Build a Match from a tuple of all its fields, in C.
_MATCH = functools.partial(tuple.__new__, Match)


class Entry(NamedTuple):
    """One map entry of a suggestion: a scope (``"a/"`` -> ``"b/"``) or one variable (a named
    tuple, like :class:`Match`).

    Attributes:
        name: checkpoint name or scope (ending in ``/``).
        target: target name or scope.
        confidence: the lowest confidence of the variables it covers.
        evidence: the evidence (for a scope: of its variables, summarised).
        count: how many variables it covers.
        review: True when ``Source(align="structure")`` would not apply it (its confidence is
            below :data:`~ckptmerge.alignment.align.CONFIDENCE_FLOOR`): proposed for a person to
            check, never as certain (a suggestion's config leaves it out of the map).
    """

    name: str
    target: str
    confidence: float
    evidence: Tuple[str, ...]
    count: int = 1
    review: bool = False

    @property
    def is_scope(self) -> bool:
        """True for a scope-to-scope entry."""
        return self.name.endswith("/")

    def describe(self) -> str:
        """``"'a/' -> 'b/' (3 variables, 0.90: ...)"``."""
        what = f"{plural(self.count, 'variable')}, " if self.is_scope else ""
        return (f"{'REVIEW ' if self.review else ''}{quote_name(self.name)} -> {quote_name(self.target)} "
                f"({what}{self.confidence:.2f}: {'; '.join(self.evidence)})")

    def to_dict(self) -> dict:
        """JSON-ready: name, target, confidence, evidence, count, review."""
        return {"name": self.name, "target": self.target, "confidence": self.confidence,
                "evidence": list(self.evidence), "count": self.count, "review": self.review}


#: Build an Entry from a tuple of all its fields, in C.
_ENTRY = functools.partial(tuple.__new__, Entry)


def scope_entries(matches: Sequence[Match], source_names: Iterable[str],
                  target_names: Iterable[str]) -> List[Entry]:
    """Fold matches into scope-to-scope entries wherever a whole scope moves together.

    A checkpoint scope becomes one entry when every name under it (among ``source_names``) is
    matched, all into one target scope, each keeping its leaf, and no other target (among
    ``target_names``) lives in that target scope; everything else stays one entry per variable.
    The matches' names and targets are among ``source_names`` and ``target_names``.

    Example:
        >>> ms = [Match("h0/kernel", "dnn/l0/kernel", 0.9), Match("h0/bias", "dnn/l0/bias", 0.9)]
        >>> [e.name + " -> " + e.target for e in scope_entries(ms, ["dnn/l0/kernel", "dnn/l0/bias"],
        ...                                                     ["h0/kernel", "h0/bias"])]
        ['dnn/l0/ -> h0/']
    """
    if not len(matches):  # (nothing to fold: the names outside the matches need not be read)
        return []
    targets, names, confidence, evidence, position = match_columns(matches)
    tscopes, scopes = scopes_of(matches)
    # Whole when every name of the scope is matched, each into one target scope and keeping its
    # leaf, and that target scope holds nothing else. A scope holding a name (target) that no
    # match moves cannot move whole: the few names outside the matches decide, not a count over
    # every name.
    matched, taken = set(names), set(targets)
    blocked = {n[:n.rfind("/") + 1] for n in set(source_names).difference(matched)}
    blocked |= {"", *(t[:t.rfind("/") + 1] for t in set(target_names).difference(taken))}
    # (each name less its own scope is its leaf: C-speed passes)
    keep_leaf = list(map(str.__eq__, map(str.removeprefix, names, scopes), map(str.removeprefix, targets, tscopes)))
    per_scope, per_tscope = collections.Counter(scopes), collections.Counter(tscopes)
    whole = {sc: ts for (sc, ts), c in collections.Counter(itertools.compress(zip(scopes, tscopes), keep_leaf)).items()
             if c > 1 and c == per_scope[sc] == per_tscope[ts] and sc not in blocked and ts not in blocked}
    alone = list(map(operator.not_, map(whole.__contains__, scopes)))  # (the matches no scope entry covers)
    entries: List[Entry] = list(map(_ENTRY, [(n, t, c, e + (p,) if p else e, 1, False) for n, t, c, e, p in
                                             itertools.compress(zip(names, targets, confidence, evidence, position),
                                                                alone)])) if any(alone) else []
    summaries: Dict[Tuple[Tuple[str, ...], ...], Tuple[str, ...]] = {}

    def summary(key: Tuple[Tuple[str, ...], ...]) -> Tuple[str, ...]:
        """The evidence past each shape, sorted: once per kind of scope (the scopes of a numbered
        series share their evidence objects)."""
        summaries[key] = tuple(sorted({e for ev in key for e in ev[1:]})[:4])
        return summaries[key]

    one_position: Dict[str, Tuple[str, ...]] = {"": ()}

    def at(where: str) -> Tuple[str, ...]:
        found = one_position.get(where)
        if found is None:
            found = one_position[where] = (where,)
        return found

    # The scopes that move whole, as columns by size: the j-th match of every scope of size n is
    # column j, so each entry's fields come from C-speed passes, not a Python step per scope.
    moving: Dict[str, List[int]] = {sc: [] for sc in whole}
    others: List[int] = []  # (each index appended to its scope's list, in C: the rest go here)
    collections.deque(map(list.append, map(moving.get, scopes, itertools.repeat(others)), range(len(scopes))), maxlen=0)
    by_size: Dict[int, List[str]] = {}
    for sc, c in per_scope.items():
        if sc in whole:
            by_size.setdefault(c, []).append(sc)
    for n, names_of in by_size.items():
        columns = list(zip(*map(moving.__getitem__, names_of)))
        # (zip tuples consumed as they come and one tuple per position: few objects alive at once)
        lowest = map(min, zip(*[list(map(confidence.__getitem__, c)) for c in columns]))
        positions = [at(w[0]) if w.count(w[0]) == n else tuple(sorted(set(w) - {""}))
                     for w in zip(*[list(map(position.__getitem__, c)) for c in columns])]
        head = ("shapes of all " + plural(n, "variable"),)
        reasons = [head + (summaries.get(k) or summary(k)) + p
                   for k, p in zip(zip(*[list(map(evidence.__getitem__, c)) for c in columns]), positions)]
        entries += map(_ENTRY, zip(names_of, map(whole.__getitem__, names_of), lowest, reasons, itertools.repeat(n),
                                   itertools.repeat(False)))
    entries.sort(key=operator.itemgetter(1))  # by target
    return entries
