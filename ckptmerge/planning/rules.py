"""Rename and selection rules: which checkpoint names go to which target names.

This is the pure half of the mapping engine (the other half is :mod:`ckptmerge.planning.planner`): names
in, a :class:`RuleResult` out, no files and no TensorFlow. A source's :class:`Rules` hold

* ``include`` / ``exclude`` globs (:class:`GlobFilter`, :func:`fnmatch.fnmatchcase` syntax) that
  select checkpoint names first;
* ``map`` entries (:class:`MapRule`) with the semantics of
  ``tf.compat.v1.train.init_from_checkpoint``'s ``assignment_map``: an exact entry
  ``"a1" -> "c/x1"`` renames one name, a scope entry ``"a/" -> "c/encoder/"`` renames every
  name under ``a/``, ``"/"`` stands for the root. As in TF, every entry that covers a name
  applies: an exact entry and a covering scope entry both do, so one checkpoint name may feed
  several targets (a list of targets as a map value, or a list of pairs, does the same);
* ``regex`` rules (:class:`RegexRule`): a full match over checkpoint names and
  ``match.expand(replacement)``; a ``None`` replacement drops the name. Patterns run on RE2
  (:mod:`ckptmerge.planning.patterns`), in time linear in the name's length.

Without ``map`` and ``regex`` every selected name keeps its name (identity). With them, a name
no rule covers is dropped. Rules that match nothing come back as :class:`UnmatchedRule`, and a
name that two regex rules rename differently comes back as an :class:`Ambiguity`; neither is
ever resolved silently here (the plan decides, see ``on_conflict`` and ``strict``).
"""

from __future__ import annotations

import bisect
import itertools
import operator
from dataclasses import dataclass, field
from typing import (
    Any,
    Dict,
    FrozenSet,
    List,
    Mapping,
    NamedTuple,
    Optional,
    Sequence,
    Tuple,
    Union,
)

from ..core.args import describe_value
from ..core.errors import RuleError, did_you_mean_text, suggest  # noqa: F401 - re-exported for rules users
from ..core.text import escape_name, quote_name
from .rulekinds import SCOPE_ENDS, GlobFilter, MapRule, RegexRule, scopes_of  # noqa: F401 - re-exported

__all__ = [
    "MapRule",
    "RegexRule",
    "GlobFilter",
    "Rules",
    "RuleResult",
    "UnmatchedRule",
    "Ambiguity",
    "suggest",
]

_UNMATCHED_KINDS = ("map", "map-scope", "regex", "include", "allow_missing", "transform")
_REGEX_EXAMPLE = r"[('^head/(.*)', r'new_head/\1'), ('^tmp/.*', None)]"




# --------------------------------------------------------------------------------------------
# Findings
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class UnmatchedRule:
    """A rule that did nothing (or named something that does not exist).

    Attributes:
        kind: ``"map"`` (exact entry), ``"map-scope"``, ``"regex"``, ``"include"``,
            ``"allow_missing"`` or ``"transform"``.
        rule: display form, e.g. ``"map 'a1' -> 'c/x1'"``.
        suggestions: close names, best first (may be empty).
        explicit: ``True`` for exact map entries: those block even a non-strict restore.
        source: the label of the source the rule belongs to (``None`` for ``allow_missing``).
        reason: what went wrong, completing the sentence ``"<rule> in source 'A' <reason>"``.

    Example:
        >>> UnmatchedRule("map", "map 'a1' -> 'c/x1'", ("a_1",), True, "A").message()
        "map 'a1' -> 'c/x1' in source 'A' matched no checkpoint variable. Did you mean 'a_1'?"
    """

    kind: str
    rule: str
    suggestions: Tuple[str, ...] = ()
    explicit: bool = False
    source: Optional[str] = None
    reason: str = "matched no checkpoint variable"

    def __post_init__(self) -> None:
        if self.kind not in _UNMATCHED_KINDS:
            raise RuleError(f"unknown unmatched-rule kind {quote_name(self.kind)}; "
                            f"expected one of {', '.join(_UNMATCHED_KINDS)}.")
        object.__setattr__(self, "suggestions", tuple(self.suggestions))

    def message(self) -> str:
        """One line saying what did not match and how to fix it."""
        where = f" in source {quote_name(self.source)}" if self.source is not None else ""
        text = f"{self.rule}{where} {self.reason}."
        dym = did_you_mean_text(self.suggestions)
        if dym:
            text += dym
        elif self.explicit:
            text += " Fix or remove the entry."
        else:
            text += " Fix or remove it."
        if not self.explicit:
            text += " (strict=False ignores this.)"
        return text

    def to_dict(self) -> dict:
        """JSON-ready dict with every field (suggestions as a list)."""
        return {"kind": self.kind, "rule": self.rule, "source": self.source,
                "reason": self.reason, "explicit": self.explicit,
                "suggestions": list(self.suggestions), "message": self.message()}


@dataclass(frozen=True)
class Ambiguity:
    """A checkpoint name that several regex rules rename to different results.

    Attributes:
        name: the checkpoint name.
        targets: what each matching rule gives, in rule order (``None``: the rule drops it).
        rules: the matching rules' display forms, in rule order.
        source: the source label (set by the plan).
        resolved: whether the plan picked one (``on_conflict='first'`` or ``'last'``).
        resolved_to: the picked result when resolved (``None`` means dropped).

    Example:
        >>> a = Ambiguity("x/k", ("a/k", "b/x"), ("regex 'x/(.*)' -> 'a/\\1'", "regex '(.*)/k' -> 'b/\\1'"))
        >>> a.resolved
        False
    """

    name: str
    targets: Tuple[Optional[str], ...]
    rules: Tuple[str, ...]
    source: Optional[str] = None
    resolved: bool = False
    resolved_to: Optional[str] = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "targets", tuple(self.targets))
        object.__setattr__(self, "rules", tuple(self.rules))

    def message(self) -> str:
        """One line naming every rule and result, and how to fix it."""
        where = f" in source {quote_name(self.source)}" if self.source is not None else ""
        parts = ", ".join(f"{r} gives {quote_name(t) if t is not None else 'a drop'}"
                          for r, t in zip(self.rules, self.targets))
        text = f"conflict: regex rules{where} rename {quote_name(self.name)} differently: {parts}"
        if self.resolved:
            chosen = quote_name(self.resolved_to) if self.resolved_to is not None else "a drop"
            return text + f"; resolved to {chosen} by on_conflict."
        return text + (" (pass on_conflict='first' or 'last' to pick by rule order, make the "
                       "patterns disjoint, or use exclude to drop names).")

    def to_dict(self) -> dict:
        """JSON-ready dict with every field."""
        return {"source": self.source, "name": self.name, "targets": list(self.targets),
                "rules": list(self.rules), "resolved": self.resolved,
                "resolved_to": self.resolved_to, "message": self.message()}


@dataclass(frozen=True)
class RuleResult:
    """What :meth:`Rules.apply` made of a list of checkpoint names (every list sorted).

    Attributes:
        mapping: checkpoint name -> its target names (sorted; several when several map entries
            cover the name, as with ``init_from_checkpoint``), for every selected name (sorted).
        dropped: names left out: by include/exclude, by a regex with a ``None`` replacement,
            or covered by no rule when ``map``/``regex`` rules exist.
        unmatched: rules that matched (renamed) no name.
        ambiguous: names that several regex rules rename differently (not in ``mapping``).
        explicit: names renamed by an exact map entry.
        via: ``(name, target)`` -> the rule that gave the pair (absent for identity and
            ambiguous names).
    """

    mapping: Dict[str, Tuple[str, ...]]
    dropped: List[str]
    unmatched: List[UnmatchedRule]
    ambiguous: List[Ambiguity]
    explicit: FrozenSet[str] = frozenset()
    via: Dict[Tuple[str, str], Union["MapRule", "RegexRule"]] = field(default_factory=dict)

    def pairs(self) -> List[Tuple[str, str]]:
        """Every ``(checkpoint name, target name)`` pair, sorted.

        Example:
            >>> Rules.from_options(map={"a": ["x", "y"]}).apply(["a"]).pairs()
            [('a', 'x'), ('a', 'y')]
        """
        return [(n, t) for n, ts in self.mapping.items() for t in ts]

    def triples(self) -> List[Tuple[str, str, Optional[Union["MapRule", "RegexRule"]]]]:
        """Every ``(checkpoint name, target name, rule)``, sorted as :meth:`pairs` (rule ``None``
        for identity).

        Example:
            >>> Rules().apply(["a"]).triples()
            [('a', 'a', None)]
        """
        via = self.via
        return [(n, t, via.get((n, t))) for n, ts in self.mapping.items() for t in ts]


class _Applied(NamedTuple):
    """What :meth:`Rules._apply` found (the parts of a :class:`RuleResult`): the renames as three
    columns (checkpoint name, target, rule; sorted by name and target), not a tuple per name."""

    names: List[str]
    targets: List[str]
    rules: List[Optional[Union[MapRule, RegexRule]]]
    dropped: List[str]
    unmatched: List[UnmatchedRule]
    ambiguous: List[Ambiguity]
    explicit: FrozenSet[str]


# --------------------------------------------------------------------------------------------
# Rules
# --------------------------------------------------------------------------------------------


def _sorted_unique(names: Sequence[str]) -> List[str]:
    """The names sorted, without duplicates (one pass when they already are: they usually are)."""
    out = list(names)
    if all(map(operator.lt, out, out[1:])):
        return out
    return sorted(set(out))


def _in_sorted(names: Sequence[str], name: str) -> bool:
    """Whether ``name`` is one of the sorted ``names`` (by bisection)."""
    i = bisect.bisect_left(names, name)
    return i < len(names) and names[i] == name


def _scope_owners(names: List[str], scopes: Sequence[MapRule]) -> List[Tuple[int, int, MapRule]]:
    """The runs ``names[lo:hi]`` of the sorted ``names`` that exactly one scope entry covers, as
    ``(lo, hi, entry)`` in order (names under several entries, or none, are looked at one by one)."""
    owned: List[Tuple[int, int, MapRule]] = []
    ranges = []
    for m in scopes:
        prefix = m._source_prefix
        lo = bisect.bisect_left(names, prefix)
        # the names starting with prefix are those in [prefix, prefix with its last char + 1)
        hi = bisect.bisect_left(names, prefix[:-1] + chr(ord(prefix[-1]) + 1)) if prefix else len(names)
        if lo < hi:
            ranges.append((lo, hi, m))
    ranges.sort(key=operator.itemgetter(0, 1))
    reach = 0  # the furthest end of the ranges so far
    for k, (lo, hi, m) in enumerate(ranges):
        overlaps = reach > lo or (k + 1 < len(ranges) and ranges[k + 1][0] < hi)
        reach = max(reach, hi)
        if not overlaps:  # (overlapping scopes' names are looked at name by name)
            owned.append((lo, hi, m))
    return owned


def _as_globs(option: str, value: Any, problems: List[str]) -> Tuple[GlobFilter, ...]:
    if value is None:
        return ()
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, (list, tuple)):
        problems.append(f"{option} must be a glob (str) or a list of globs, e.g. "
                        f"['encoder/*']; received {describe_value(value)}.")
        return ()
    out = []
    for i, pat in enumerate(value):
        try:
            out.append(GlobFilter(pat))
        except RuleError as e:
            problems.append(f"{option}[{i}]: {e}")
    return tuple(dict.fromkeys(out))


def map_pairs(value: Any) -> Optional[List[Tuple[Any, Any]]]:
    """The ``(key, value)`` pairs of a map given as a dict or, as TF's ``assignment_map`` may be,
    as a list of pairs; ``None`` when it is neither."""
    if isinstance(value, Mapping):
        return list(value.items())
    if isinstance(value, (list, tuple)) and all(isinstance(p, (list, tuple)) and len(p) == 2
                                                for p in value):
        return [tuple(p) for p in value]
    return None


def _as_maps(value: Any, problems: List[str]) -> Tuple[MapRule, ...]:
    if value is None:
        return ()
    pairs = map_pairs(value)
    if pairs is None:
        problems.append("map must be a dict of checkpoint name/scope -> target name/scope (or a "
                        "list of targets), or a list of such pairs, e.g. "
                        f"{{'a/': 'c/encoder/', 'a1': 'c/x1'}}; received {describe_value(value)}.")
        return ()
    out: Dict[Tuple[str, str], MapRule] = {}
    for src, tgts in pairs:
        if isinstance(tgts, (list, tuple)):
            if not tgts:
                problems.append(f"map[{src!r}]: the list of targets is empty; name at least one "
                                "target, or remove the entry.")
            targets = list(tgts)
        else:
            targets = [tgts]
        for tgt in targets:
            try:
                rule = MapRule(src, tgt)
            except RuleError as e:
                problems.append(f"map[{src!r}]: {e}")
                continue
            out.setdefault((rule.source, rule.target), rule)
    return tuple(out[k] for k in sorted(out))


def _as_regexes(value: Any, problems: List[str]) -> Tuple[RegexRule, ...]:
    if value is None:
        return ()
    if (isinstance(value, tuple) and len(value) == 2 and isinstance(value[0], str)
            and (value[1] is None or isinstance(value[1], str))):
        problems.append("regex must be a list of (pattern, replacement) pairs; received a single "
                        f"pair {value!r}: write [{value!r}].")
        return ()
    if not isinstance(value, (list, tuple)):
        problems.append("regex must be a list of (pattern, replacement) pairs, e.g. "
                        f"{_REGEX_EXAMPLE}; received {describe_value(value)}.")
        return ()
    out = []
    for i, pair in enumerate(value):
        if not isinstance(pair, (list, tuple)) or len(pair) != 2:
            problems.append(f"regex[{i}] must be a (pattern, replacement) pair, e.g. "
                            f"('^head/(.*)', r'new_head/\\1'); received {describe_value(pair)}.")
            continue
        try:
            out.append(RegexRule(pair[0], pair[1]))
        except RuleError as e:
            problems.append(f"regex[{i}]: {e}")
    return tuple(out)


@dataclass(frozen=True)
class Rules:
    """The selection and rename rules of one source.

    Build with :meth:`from_options`; the fields hold validated rule objects. Map entries are
    sorted (their order never matters; one source name may have several entries, one per
    target), regex rules keep their order (it only matters for ``on_conflict='first'``/``'last'``).

    Example:
        >>> r = Rules.from_options(map={"a/": "c/"}, exclude="*/Adam*")
        >>> r.apply(["a/x", "a/x/Adam", "b"]).mapping
        {'a/x': ('c/x',)}
    """

    maps: Tuple[MapRule, ...] = ()
    regexes: Tuple[RegexRule, ...] = ()
    include: Tuple[GlobFilter, ...] = ()
    exclude: Tuple[GlobFilter, ...] = ()
    _exact: Dict[str, Tuple[MapRule, ...]] = field(init=False, repr=False, compare=False)
    _scopes: Tuple[MapRule, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        for name, cls in (("maps", MapRule), ("regexes", RegexRule),
                          ("include", GlobFilter), ("exclude", GlobFilter)):
            value = getattr(self, name)
            if not isinstance(value, (list, tuple)) or not all(isinstance(x, cls) for x in value):
                raise RuleError(f"Rules.{name} must be a tuple of {cls.__name__}; received "
                                f"{describe_value(value)} (Rules.from_options builds them from "
                                "plain values).")
            object.__setattr__(self, name, tuple(value))
        if len(set(self.maps)) != len(self.maps):
            dup = next(m for i, m in enumerate(self.maps) if m in self.maps[:i])
            raise RuleError(f"{dup.describe()} appears twice; keep one.")
        exact: Dict[str, Tuple[MapRule, ...]] = {}
        for m in self.maps:
            if not m.is_scope:
                exact[m.source] = exact.get(m.source, ()) + (m,)
        object.__setattr__(self, "_exact", exact)
        # Exact entries, then the longest scope first: the order in which a name's targets are
        # listed when several entries cover it (all of them apply).
        scopes = sorted((m for m in self.maps if m.is_scope),
                        key=lambda m: (-len(m._source_prefix), m.source))
        object.__setattr__(self, "_scopes", tuple(scopes))

    @classmethod
    def from_options(cls, map: Optional[Any] = None,  # noqa: A002 (user-facing name)
                     regex: Optional[Sequence[Sequence[Optional[str]]]] = None,
                     include: Optional[Any] = None, exclude: Optional[Any] = None) -> "Rules":
        """Build and validate rules from plain values (as in a config file or API call).

        Every problem is collected and reported at once.

        Args:
            map: checkpoint name or scope -> target name or scope, or a list of them
                (``assignment_map`` style); or a list of such pairs.
            regex: a list of ``(pattern, replacement)`` pairs; ``replacement=None`` drops.
            include: a glob or a list of globs; only matching names are selected. An empty
                list counts as not given.
            exclude: a glob or a list of globs; matching names are left out.

        Returns:
            The validated :class:`Rules`.

        Raises:
            RuleError: listing every invalid option, with what was received.

        Example:
            >>> Rules.from_options(regex=[(r"^head/(.*)", r"new/\\1")]).describe()
            ["regex '^head/(.*)' -> 'new/\\\\1'"]
        """
        problems: List[str] = []
        maps = _as_maps(map, problems)
        regexes = _as_regexes(regex, problems)
        inc = _as_globs("include", include, problems)
        exc = _as_globs("exclude", exclude, problems)
        if problems:
            if len(problems) == 1:
                raise RuleError(f"Invalid rule: {problems[0]}")
            raise RuleError(f"{len(problems)} invalid rules:\n" + "\n".join(f"  - {escape_name(p)}" for p in problems))
        return cls(maps=maps, regexes=regexes, include=inc, exclude=exc)

    @property
    def is_identity(self) -> bool:
        """True when there is no rule at all: every name is selected and keeps its name."""
        return not (self.maps or self.regexes or self.include or self.exclude)

    @property
    def renames(self) -> bool:
        """True when ``map`` or ``regex`` rules exist (uncovered names are then dropped)."""
        return bool(self.maps or self.regexes)

    def describe(self) -> List[str]:
        """One display line per rule, in the order they apply.

        Example:
            >>> Rules().describe()
            ['identity (every name is kept as it is)']
        """
        lines = [f"include {quote_name(g.pattern)}" for g in self.include]
        lines += [f"exclude {quote_name(g.pattern)}" for g in self.exclude]
        lines += [m.describe() for m in self.maps]
        lines += [r.describe() for r in self.regexes]
        if not self.renames:
            lines.append("identity (every name is kept as it is)" if not lines
                         else "selected names keep their names")
        return lines

    def to_dict(self) -> dict:
        """JSON-ready options, round-trippable: ``Rules.from_options(**r.to_dict()) == r``.

        Schema: ``{"map": {src: tgt}, "regex": [[pattern, replacement|null]],
        "include": [glob], "exclude": [glob]}``; empty options are left out.

        Example:
            >>> Rules.from_options(map={"a/": "c/"}).to_dict()
            {'map': {'a/': 'c/'}}
        """
        out: dict = {}
        if self.maps:
            targets: Dict[str, List[str]] = {}
            for m in self.maps:
                targets.setdefault(m.source, []).append(m.target)
            out["map"] = {k: v[0] if len(v) == 1 else v for k, v in targets.items()}
        if self.regexes:
            out["regex"] = [[r.pattern, r.replacement] for r in self.regexes]
        if self.include:
            out["include"] = [g.pattern for g in self.include]
        if self.exclude:
            out["exclude"] = [g.pattern for g in self.exclude]
        return out

    def apply(self, names: Sequence[str], *, hidden: Sequence[str] = ()) -> RuleResult:
        """Select and rename checkpoint names.

        Order: include/exclude first; then, if there are no map/regex rules, identity;
        otherwise every map entry that covers the name (exact and scope entries alike, as
        ``init_from_checkpoint`` applies them: the name then feeds each target), else the regex
        rules (all of them: when they disagree the name is :class:`Ambiguity`, never silently
        resolved); names covered by no rule are dropped. The result does not depend on the
        order of ``names`` (duplicates are ignored).

        Args:
            names: checkpoint names of one source.
            hidden: names the source holds but does not offer (optimizer state left out), so
                that an ``include`` matching only those can say "pass optimizer=True".

        Returns:
            A :class:`RuleResult`.

        Example:
            >>> Rules.from_options(map={"a1": "c/x1"}).apply(["a1", "b"]).dropped
            ['b']
        """
        applied = self._apply(names, hidden)
        mapping: Dict[str, Tuple[str, ...]] = {}
        via: Dict[Tuple[str, str], Union[MapRule, RegexRule]] = {}
        for n, t, rule in zip(applied.names, applied.targets, applied.rules):
            mapping[n] = mapping[n] + (t,) if n in mapping else (t,)
            if rule is not None:
                via[(n, t)] = rule
        return RuleResult(mapping=mapping, dropped=applied.dropped, unmatched=applied.unmatched,
                          ambiguous=applied.ambiguous, explicit=applied.explicit, via=via)

    def _apply(self, names: Sequence[str], hidden: Sequence[str] = (),
               targets: Optional[Mapping[str, Any]] = None) -> "_Applied":
        """:meth:`apply` as columns of ``(name, target, rule)`` (sorted), without the mapping and
        ``via`` dicts: what a plan needs. With ``targets`` (name -> spec), a name a
        scope rule makes that is a target's holds the target's own string (``spec.name``): the
        100,000s of renamed names of a warm start are then not held twice."""
        all_names = _sorted_unique(names)
        dropped: List[str] = []
        unmatched: List[UnmatchedRule] = []

        # 1. include / exclude (each glob in one pass over the names; names kept and left out in
        # passes at C speed: 100,000s of names, a few globs)
        selected = all_names
        included = [g.select(all_names) for g in self.include]
        if self.include:
            keep = set().union(*included)
            selected = list(itertools.compress(all_names, map(keep.__contains__, all_names)))
        if self.exclude:
            out = set().union(*(g.select(selected) for g in self.exclude))
            if out:
                selected = list(itertools.compress(selected, map(operator.not_, map(out.__contains__, selected))))
        if len(selected) != len(all_names):
            kept = set(selected)
            dropped.extend(itertools.compress(all_names, map(operator.not_, map(kept.__contains__, all_names))))
        # An include that matches nothing leaves the source empty: report it. An exclude that
        # matches nothing is a safety filter with nothing to do (e.g. '*/Adam*' once optimizer
        # state is already left out), so it is not a finding.
        for g, hits in zip(self.include, included):
            if not hits:
                opt = [n for n in hidden if g.matches(n)]
                if opt:
                    k = len(opt)
                    unmatched.append(UnmatchedRule("include", f"include {quote_name(g.pattern)}", (), reason=(
                        f"matched only {k} optimizer/bookkeeping tensor{'s' if k != 1 else ''} "
                        f"(e.g. {quote_name(min(opt))}): these are optimizer variables: pass optimizer=True "
                        "to use them")))
                    continue
                cands = [s + "*" for s in scopes_of(all_names)] + all_names
                unmatched.append(UnmatchedRule("include", f"include {quote_name(g.pattern)}",
                                               tuple(suggest(g.pattern, cands, cutoff=0.6))))

        # 2. identity
        if not self.renames:
            return _Applied(selected, list(selected), [None] * len(selected), sorted(dropped), unmatched, [],
                            frozenset())

        # 3. map, then regex
        out_names: List[str] = []
        out_targets: List[str] = []
        out_rules: List[Optional[Union[MapRule, RegexRule]]] = []
        explicit = set()
        ambiguous: List[Ambiguity] = []
        used_maps = set()
        used_regexes = set()
        # A name under exactly one scope entry and no exact entry (the usual warm start: a whole
        # scope moves) is renamed without looking at the other entries: the scope entries'
        # ranges of the sorted names are found by bisection.
        exact_rules = self._exact
        target_spec = (targets or {}).get

        def rename_one(n: str) -> None:
            rules = exact_rules.get(n, ()) + tuple(s for s in self._scopes if s.matches(n))
            if rules:
                renamed: Dict[str, MapRule] = {}
                for rule in rules:
                    renamed.setdefault(rule.rename(n), rule)
                    used_maps.add(rule)
                for t in sorted(renamed):
                    out_names.append(n)
                    out_targets.append(t)
                    out_rules.append(renamed[t])
                if n in exact_rules:
                    explicit.add(n)
                return
            tries = [(i, r, r.try_rename(n)) for i, r in enumerate(self.regexes)]
            hits = [(i, r) for i, r, (ok, _) in tries if ok]
            if not hits:
                dropped.append(n)
                return
            used_regexes.update(i for i, _ in hits)
            results = [new for _, _, (ok, new) in tries if ok]
            if len(set(results)) > 1:
                ambiguous.append(Ambiguity(n, tuple(results), tuple(r.describe() for _, r in hits)))
            elif results[0] is None:
                dropped.append(n)
            else:
                out_names.append(n)
                out_targets.append(results[0])
                out_rules.append(hits[0][1])

        done = 0
        for lo, hi, owner in _scope_owners(selected, self._scopes) + [(len(selected), len(selected), None)]:
            for n in selected[done:lo]:
                rename_one(n)
            run = selected[lo:hi]
            done = hi
            if owner is None or not run:
                continue
            used_maps.add(owner)
            if exact_rules and any(map(exact_rules.__contains__, run)):
                for n in run:
                    rename_one(n)
                continue
            # The run moves as a whole (the usual warm start), its names renamed in one pass; a
            # renamed name that is a target's holds the target's own string.
            cut, prefix = len(owner._source_prefix), owner._target_prefix
            renamed_run = [prefix + n[cut:] for n in run]
            if targets:
                specs = list(map(target_spec, renamed_run))
                renamed_run = [t if spec is None else spec.name for t, spec in zip(renamed_run, specs)]
                del specs
            out_names += run
            out_targets += renamed_run
            out_rules += [owner] * len(run)

        for m in self.maps:
            if m in used_maps:
                continue
            if not m.is_scope:
                if _in_sorted(all_names, m.source) and not _in_sorted(selected, m.source):
                    reason = (f"matched no checkpoint variable ({quote_name(m.source)} exists but "
                              "include/exclude leave it out)")
                    unmatched.append(UnmatchedRule("map", m.describe(), (), True, reason=reason))
                else:
                    unmatched.append(UnmatchedRule("map", m.describe(),
                                                   tuple(suggest(m.source, all_names)), True))
            else:
                unmatched.append(UnmatchedRule("map-scope", m.describe(),
                                               tuple(suggest(m.source, scopes_of(all_names)))))
        for i, r in enumerate(self.regexes):
            if i in used_regexes:
                continue
            taken = sum(1 for n in selected if r.matches(n))
            partial = next((n for n in selected if r.search(n)), None)
            reason = "matched no checkpoint variable"
            if taken:
                reason = (f"renamed no checkpoint variable (map entries cover all {taken} "
                          "names it matches)")
            elif partial is not None:
                reason += (f" (the pattern must match whole names; it matches part of "
                           f"{quote_name(partial)})")
            unmatched.append(UnmatchedRule("regex", r.describe(), (), reason=reason))

        return _Applied(out_names, out_targets, out_rules, sorted(dropped), unmatched, ambiguous,
                        frozenset(explicit))
