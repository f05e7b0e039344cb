"""The plan: which target variable gets which checkpoint variable, computed before any restore.

:func:`make_plan` is pure: it takes target specs and one :class:`SourceView` per checkpoint
(names, specs and :class:`~ckptmerge.planning.rules.Rules`, no readers) and returns a :class:`Plan`
holding the :class:`Assignment` of every target that can be restored plus every finding:
``missing``, ``allowed_missing``, ``unused``, ``dropped``, ``mismatched`` (with ``skipped``),
``conflicts``, ``ambiguous`` and ``unmatched_rules``. Nothing is resolved silently:
:meth:`Plan.blocking` turns the findings into one fix-it line each, and :meth:`Plan.check`
raises one :class:`~ckptmerge.core.errors.PlanError` listing all of them.

Every target lands in exactly one of ``assignments``, ``missing``, ``allowed_missing``,
``skipped`` (a provider exists but does not fit) or :attr:`Plan.unresolved_conflicts`.

The planning is here; what it works with lives below it, and is re-exported here:
:mod:`ckptmerge.planning.model` (:class:`SourceView`, :class:`Plan`, :class:`OptionError`),
:mod:`ckptmerge.planning.findings` (:class:`Assignment`, :class:`Mismatch`, :class:`Conflict`) and
:mod:`ckptmerge.planning.nameshifts` (a Keras model's root name and auto-name shifts).
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import operator
from dataclasses import dataclass, field
from typing import (
    Any,
    Dict,
    Iterable,
    List,
    Mapping,
    NamedTuple,
    Optional,
    Sequence,
    Set,
    Tuple,
    Union,
)

from ..core.args import describe_value
from ..core.errors import PlanError, RuleError
from ..core.gcpause import paused_gc
from ..core.specs import VariableInfo, by_name
from ..core.text import quote_name
from .findings import Assignment, Conflict, Mismatch, trusted_assignment  # noqa: F401 - re-exported
from .model import CHECK_LIMIT, OptionError, Plan, SourceView  # noqa: F401 - re-exported
from .nameshifts import rerooted, root_swaps, series_shifts
from .rules import (
    Ambiguity,
    GlobFilter,
    MapRule,
    RegexRule,
    UnmatchedRule,
    did_you_mean_text,
    scopes_of,
    suggest,
)
from .transforms import TransformError, cast_problem
from .chains import TransformIndex, chain_output_shape

__all__ = [
    "OptionError",
    "SourceView",
    "Assignment",
    "Mismatch",
    "Conflict",
    "Plan",
    "make_plan",
    "root_swaps",
    "series_shifts",
    "ON_CONFLICT",
    "ON_SHAPE_MISMATCH",
]

#: Valid values of ``on_conflict``.
ON_CONFLICT = ("error", "first", "last")
#: Valid values of ``on_shape_mismatch``.
ON_SHAPE_MISMATCH = ("error", "skip")


def _check_choice(option: str, value: Any, choices: Sequence[str]) -> None:
    if not isinstance(value, str) or value not in choices:
        valid = ", ".join(quote_name(c) for c in choices)
        dym = did_you_mean_text(suggest(value, choices, cutoff=0.6)) if isinstance(value, str) else ""
        raise OptionError(f"{option} must be one of {valid}; received {value!r}.{dym}")


# --------------------------------------------------------------------------------------------
# make_plan
# --------------------------------------------------------------------------------------------


def _as_allow_missing(value: Any) -> Tuple[GlobFilter, ...]:
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, (list, tuple)):
        raise OptionError("allow_missing must be a glob (str) or a list of globs over target "
                          f"names, e.g. ['head/*']; received {describe_value(value)}.")
    out = []
    for i, pat in enumerate(value):
        try:
            out.append(GlobFilter(pat))
        except RuleError as e:
            raise OptionError(f"allow_missing[{i}]: {e}") from None
    return tuple(dict.fromkeys(out))


class _Candidate(NamedTuple):
    """A checkpoint name that lands on a target but does not fit it as it is (a transform, a
    cast or a shape to check): the planner decides. Names that fit become an
    :class:`Assignment` at once; both have ``target``, ``source``, ``name`` and ``via``."""

    target: str
    source: str
    name: str
    rule: Optional[Union[MapRule, RegexRule]]
    via: Optional[str] = None


@dataclass
class _SourceMatch:
    candidates: List[Union[_Candidate, Assignment]]
    unmatched: List[UnmatchedRule]
    ambiguous: List[Ambiguity]
    dropped: List[str]
    not_landed: Set[str]  # selected (not dropped) names that landed on no target
    structure: List[str] = field(default_factory=list)


_new_tuple = tuple.__new__
_NAME_AND_TARGET = operator.itemgetter(0, 1)
_SHAPE, _DTYPE = operator.attrgetter("shape"), operator.attrgetter("dtype")
_TARGET = operator.attrgetter("target")
_KEY = operator.attrgetter("key")
_NAME = operator.attrgetter("name")

def _stored_key_hint(src: SourceView, rule: UnmatchedRule) -> str:
    """For a regex that matched no name of a laid-out source (``layout="torch"``: names are the
    converted ones) but matches a stored key whole: the hint to write it against the names."""
    if rule.kind in ("map", "map-scope"):
        return _stored_map_hint(src, rule)
    regex = next((r for r in src.rules.regexes if r.describe() == rule.rule), None)
    if rule.kind != "regex" or regex is None:
        return ""
    for v in src.variables.values():
        if v.raw_key != v.name and regex.matches(v.raw_key):
            return (f"; it matches the stored key {quote_name(v.raw_key)}, but rules match this source's "
                    f"names as its layout converts them: write it against {quote_name(v.name)}")
    return ""


def _stored_map_hint(src: SourceView, rule: UnmatchedRule) -> str:
    """For a map entry of a laid-out source written on a stored key (or a scope of stored keys)
    that the source could not put in its layout's spelling with certainty: say that the layout
    renamed it, and how the layout spells it."""
    entry = next((m for m in src.rules.maps if m.describe() == rule.rule), None)
    if entry is None:
        return ""
    renamed = [v for v in src.variables.values() if v.raw_key != v.name]
    if not renamed:
        return ""
    for v in renamed:
        if entry.is_scope and v.raw_key.startswith(entry.source) or v.raw_key == entry.source:
            how = f"layout={src.layout!r}" if src.layout else "the source's layout"
            return (f"; {how} renames the stored names ({quote_name(v.raw_key)} is {quote_name(v.name)} "
                    "here): write the entry as the layout names it")
    return ""


def _match_source(src: SourceView, target_by_name: Mapping[str, VariableInfo],
                  on_conflict: str, model_root: Optional[str] = None) -> _SourceMatch:
    """Apply one source's rules and match the results against the target names."""
    res = src.rules._apply(list(src.variables), src.hidden, target_by_name)
    label = src.label
    target_names = list(target_by_name)
    unmatched = [dataclasses.replace(u, source=label, reason=u.reason + _stored_key_hint(src, u))
                 for u in res.unmatched]
    ambiguous: List[Ambiguity] = []
    drop = list(res.dropped)
    # The renames as columns (name, target, rule), sorted by name and target: no tuple per name.
    names, tnames, rules = res.names, res.targets, res.rules
    unresolved: List[str] = []  # ambiguous names left on no target
    picks: List[Tuple[str, str, Optional[Union[MapRule, RegexRule]]]] = []
    for amb in res.ambiguous:
        if on_conflict == "error":
            ambiguous.append(dataclasses.replace(amb, source=label))
            unresolved.append(amb.name)
            continue
        chosen = amb.targets[0 if on_conflict == "first" else -1]
        ambiguous.append(dataclasses.replace(amb, source=label, resolved=True, resolved_to=chosen))
        if chosen is None:
            drop.append(amb.name)
        else:
            picks.append((amb.name, chosen, None))
    del res

    structure: List[str] = []
    via = dict(src.notes)
    # structural matches, and joined tensors (sources.composed) onto their targets
    placed = {**src.aligned, **src.joined} if src.joined else src.aligned
    if picks or model_root is not None or placed:  # (rare: these rework the renames as triples)
        pairs = list(zip(names, tnames, rules)) + picks
        if model_root is not None:  # a Keras target: its model's own name is no barrier
            lost = [n for n, t, rule in pairs if rule is None and t not in target_by_name]
            swaps, structure = root_swaps(lost, target_names, model_root)
            pairs = [(n, swaps.get(n, t), rule) for n, t, rule in pairs]
            for n, t in swaps.items():
                via[n] = f"model root: {quote_name(n)} as {quote_name(t)}"
            # names still lost are offered to the shift with the model's root: both may have moved
            forms = rerooted([n for n in lost if n not in swaps], model_root)
            offered = [forms.get(n, t) if rule is None else t for n, t, rule in pairs]
            shifted = series_shifts([o for o, (_, _, rule) in zip(offered, pairs) if rule is None],
                                    target_names, model_root)
            if shifted:  # layers numbered from where another model in the saving process left off
                pairs = [(n, shifted.get(o, t) if rule is None else t, rule) for o, (n, t, rule) in zip(offered, pairs)]
                moved = set(shifted.values())
                for n, t, rule in pairs:
                    if rule is None and n not in via and t != n and t in moved:
                        what = "model root and auto-name shift" if n in forms else "auto-name shift"
                        via[n] = f"{what}: {quote_name(n)} as {quote_name(t)}"
        if placed:  # structural alignment, for names no rule put on a target (rules win)
            # (the alignment already left out what include/exclude or a None regex drop on purpose)
            landed_set = {n for n, t, _ in pairs if t in target_by_name}
            pairs = [(n, placed[n], None) if n in placed and n not in landed_set else (n, t, rule)
                     for n, t, rule in pairs]
            listed = {n for n, _, _ in pairs}
            extra = [n for n in placed if n not in listed]
            pairs += [(n, placed[n], None) for n in extra]
            drop = [n for n in drop if n not in placed]
        pairs.sort(key=_NAME_AND_TARGET)
        names, tnames, rules = (list(c) for c in zip(*pairs)) if pairs else ([], [], [])
        del pairs
    hit = list(map(target_by_name.__contains__, tnames))
    lost: List[Tuple[str, str, Optional[Union[MapRule, RegexRule]]]] = []
    if not all(hit):
        missed = list(map(operator.not_, hit))
        lost = list(zip(itertools.compress(names, missed), itertools.compress(tnames, missed),
                        itertools.compress(rules, missed)))
        names, tnames, rules = (list(itertools.compress(c, hit)) for c in (names, tnames, rules))
    del hit
    # How a name met its target: shown when no rule says so, and always for what a source's
    # layout did to the value (a transpose is worth seeing beside any rule), or a Concat.
    notes: Iterable[Optional[str]] = itertools.repeat(None)
    if via:
        notes = [note if rule is None or (note or "").startswith(("layout:", "concat axis ")) else None
                 for note, rule in zip(map(via.get, names), rules)]
    not_landed = set(unresolved)
    if lost:
        landed_names = set(names)
        not_landed.update(n for n, _, _ in lost if n not in landed_names)
        del landed_names
    described = {i: r.describe() for i, r in dict(zip(map(id, rules), rules)).items() if r is not None}
    landed_rules = set(described.values())
    # A name whose spec fits its target as it is (no transform, same shape and dtype: nearly
    # all of them) becomes its Assignment now; the planner only settles conflicts and misfits.
    # Each holds its target's own name string. (tuple.__new__ skips the namedtuple's Python-level
    # __new__: one per misfit)
    variables, plain = src.variables, not src.transforms
    tspecs = list(map(target_by_name.__getitem__, tnames))
    del tnames
    specs = list(map(variables.__getitem__, names))
    texts = list(map(described.get, map(id, rules)))  # (None for no rule)
    keys = list(map(_KEY, specs))
    if None in keys:  # (spec.raw_key, without a property call per name)
        keys = [s.raw_key for s in specs]
    fit = plain and all(map(operator.eq, map(_SHAPE, specs), map(_SHAPE, tspecs))) and all(
        map(operator.eq, map(_DTYPE, specs), map(_DTYPE, tspecs)))
    candidates: List[Union[_Candidate, Assignment]]
    if fit:  # (in one pass at C speed)
        candidates = list(map(trusted_assignment, map(_NAME, tspecs), itertools.repeat(label), names, keys, specs,
                              tspecs, itertools.repeat(False), texts, itertools.repeat(()), notes))
    else:
        candidates = []
        for tspec, spec, n, key, text, rule, note in zip(tspecs, specs, names, keys, texts, rules, notes):
            if plain and spec.shape == tspec.shape and spec.dtype == tspec.dtype:
                candidates.append(trusted_assignment(tspec.name, label, n, key, spec, tspec, False, text, (), note))
            else:
                candidates.append(_new_tuple(_Candidate, (tspec.name, label, n, rule, note)))
    del tspecs, specs, texts, keys, names, rules
    for name, tname, rule in lost:
        if isinstance(rule, MapRule) and not rule.is_scope:
            unmatched.append(UnmatchedRule(
                "map", rule.describe(), tuple(suggest(tname, target_names)), True, label,
                reason=f"names no target variable {quote_name(tname)}"))
    for name, tname in src.joined.items():  # a Concat whose target is not one
        if tname not in target_by_name:
            unmatched.append(UnmatchedRule(
                "transform", f"Concat for {quote_name(tname)}", tuple(suggest(tname, target_names)), True, label,
                reason=f"(of {quote_name(name)}) names no target variable"))
    # A scope or regex rule that renamed names but put none on a target does nothing.
    renamed_by: Dict[str, List[Tuple[str, str]]] = {}  # rule display -> [(name, target)], none landed
    rule_of: Dict[str, Union[MapRule, RegexRule]] = {}
    for name, tname, rule in lost:
        if rule is None or (isinstance(rule, MapRule) and not rule.is_scope):
            continue
        d = rule.describe()
        if d not in landed_rules:
            rule_of.setdefault(d, rule)
            renamed_by.setdefault(d, []).append((name, tname))
    for d, renamed in renamed_by.items():
        rule = rule_of[d]
        n0, t0 = renamed[0]
        k = len(renamed)
        if isinstance(rule, MapRule):
            kind, sugg = "map-scope", suggest(rule.target, scopes_of(target_names))
        else:
            kind, sugg = "regex", suggest(t0, target_names)
        unmatched.append(UnmatchedRule(
            kind, d, tuple(sugg), False, label,
            reason=(f"renamed {k} checkpoint variable{'s' if k != 1 else ''} but none to a "
                    f"target variable (e.g. {quote_name(n0)} -> {quote_name(t0)})")))
    return _SourceMatch(candidates, unmatched, ambiguous, sorted(drop), not_landed,
                        list(src.findings) + structure)


def _unsettled(structure: List[Tuple[str, str]], sources: Mapping[str, SourceView],
               assignments: Mapping[str, Assignment], allowed: Sequence[str],
               dropped: Mapping[str, Sequence[str]]) -> List[Tuple[str, str]]:
    """The structure findings nothing settled: a finding about targets is settled when each of
    them is restored (from any source) or allowed missing; one about checkpoint names when the
    source's rules dropped every one of them."""
    allowed_set = set(allowed)
    out = []
    for label, text in structure:
        src = sources[label]
        targets = src.finding_targets.get(text)
        names = src.finding_names.get(text)
        if targets and all(t in assignments or t in allowed_set for t in targets):
            continue
        if names and set(names) <= set(dropped.get(label, ())):
            continue
        out.append((label, text))
    return out


def make_plan(targets: Sequence[VariableInfo], sources: Sequence[SourceView], *,
              allow_missing: Union[str, Sequence[str]] = (), on_conflict: str = "error",
              on_shape_mismatch: str = "error", cast: bool = False,
              model_root: Optional[str] = None) -> Plan:
    """Work out which checkpoint variable restores which target, and every finding.

    Pure: no file access, no TensorFlow.

    Args:
        targets: the target variables' specs (names must be unique).
        sources: one :class:`SourceView` per checkpoint (labels must be unique); their order
            decides ``on_conflict='first'``/``'last'``.
        allow_missing: globs (:func:`fnmatch.fnmatchcase`) over target names that may stay
            unrestored without blocking.
        on_conflict: ``"error"`` (a target with several providers is not restored and
            blocks), ``"first"`` or ``"last"`` (pick by source order, then checkpoint name
            order; for regex ambiguity, by rule order).
        on_shape_mismatch: ``"error"`` (a mismatch blocks) or ``"skip"`` (leave the target
            as it is). Both leave a mismatched target unrestored (listed in ``skipped``).
        cast: convert dtypes to the target's dtype instead of reporting a dtype mismatch,
            where :func:`ckptmerge.planning.transforms.cast_problem` allows it (not string <-> number,
            not complex -> real).
        model_root: for a Keras model target, its root scope in the target names (``""``
            when they have none): checkpoint names that meet no target are matched with the
            model's own name replaceable (see :func:`root_swaps`). ``None``: names as they are.

    Returns:
        The :class:`Plan`.

    Raises:
        OptionError: an option has an invalid value or type, or two sources share a label.
        PlanError: two targets share a name (``e.plan`` is ``None``).

    Example:
        >>> from ckptmerge.planning.rules import Rules
        >>> t = [VariableInfo("c/x1", (3,), "float32")]
        >>> a = SourceView("A", "<memory>", "", {"a1": VariableInfo("a1", (3,), "float32")},
        ...                Rules.from_options(map={"a1": "c/x1"}))
        >>> make_plan(t, [a]).assignments["c/x1"].name
        'a1'
    """
    with paused_gc():  # hundreds of thousands of small acyclic objects: see ckptmerge.core.gcpause
        return _make_plan(targets, sources, allow_missing=allow_missing, on_conflict=on_conflict,
                          on_shape_mismatch=on_shape_mismatch, cast=cast, model_root=model_root)


def _make_plan(targets: Sequence[VariableInfo], sources: Sequence[SourceView], *,
               allow_missing: Union[str, Sequence[str]], on_conflict: str, on_shape_mismatch: str,
               cast: bool, model_root: Optional[str]) -> Plan:
    _check_choice("on_conflict", on_conflict, ON_CONFLICT)
    _check_choice("on_shape_mismatch", on_shape_mismatch, ON_SHAPE_MISMATCH)
    if not isinstance(cast, bool):
        raise OptionError(f"cast must be True or False; received {describe_value(cast)}.")
    if model_root is not None and not isinstance(model_root, str):
        raise OptionError(f"model_root must be a str or None; received {describe_value(model_root)}.")
    allow = _as_allow_missing(allow_missing)
    if isinstance(targets, (str, bytes, Mapping)) or not isinstance(targets, Iterable):
        raise OptionError("targets must be a list of VariableInfo; received "
                          f"{describe_value(targets)}.")
    targets = list(targets)
    bad = [] if all(map(isinstance, targets, itertools.repeat(VariableInfo))) else [
        i for i, t in enumerate(targets) if not isinstance(t, VariableInfo)]
    if bad:
        raise OptionError(f"targets must be VariableInfo objects; targets[{bad[0]}] is "
                          f"{describe_value(targets[bad[0]])} ({len(bad)} bad in all).")
    if isinstance(sources, (str, bytes, Mapping)) or not isinstance(sources, Iterable):
        raise OptionError(f"sources must be a list of SourceView; received {describe_value(sources)}.")
    sources = list(sources)
    bad = [i for i, s in enumerate(sources) if not isinstance(s, SourceView)]
    if bad:
        raise OptionError(f"sources must be SourceView objects; sources[{bad[0]}] is "
                          f"{describe_value(sources[bad[0]])}.")

    target_by_name = by_name(targets)
    if len(target_by_name) != len(targets):
        counts: Dict[str, int] = {}
        for t in targets:
            counts[t.name] = counts.get(t.name, 0) + 1
        dups = sorted(n for n, c in counts.items() if c > 1)
        raise PlanError(f"{len(dups)} target name{'s are' if len(dups) != 1 else ' is'} used by "
                        "more than one target variable: " + ", ".join(quote_name(d) for d in dups)
                        + ". Target names must be unique; rename the variables or restore them "
                        "in separate calls.", plan=None)
    labels: Dict[str, int] = {}
    for s in sources:
        labels[s.label] = labels.get(s.label, 0) + 1
    dup_labels = [lb for lb, c in labels.items() if c > 1]
    if dup_labels:
        raise OptionError("source labels must be unique; " + ", ".join(quote_name(d) for d in dup_labels)
                          + " appear" + ("s" if len(dup_labels) == 1 else "")
                          + " more than once. Give each source its own label.")

    source_by_label = {s.label: s for s in sources}
    target_names = list(target_by_name)
    first: Dict[str, _Candidate] = {}  # target -> its first candidate
    more: Dict[str, List[_Candidate]] = {}  # target -> all its candidates, when it has several
    unmatched: List[UnmatchedRule] = []
    ambiguous: List[Ambiguity] = []
    dropped: Dict[str, List[str]] = {}
    not_landed: Dict[str, Set[str]] = {}
    structure: List[Tuple[str, str]] = []

    for src in sources:
        found = _match_source(src, target_by_name, on_conflict, model_root)
        structure += [(src.label, text) for text in found.structure]
        cands = found.candidates
        at_once = False
        if not first:  # the first source with candidates: its targets are usually distinct (C speed)
            first = dict(zip(map(_TARGET, cands), cands))
            at_once = len(first) == len(cands)
            if not at_once:  # a target twice: one by one, to record the conflict
                first = {}
        if not at_once:
            for c in cands:
                prev = first.setdefault(c.target, c)
                if prev is not c:
                    more.setdefault(c.target, [prev]).append(c)
        unmatched.extend(found.unmatched)
        ambiguous.extend(found.ambiguous)
        dropped[src.label] = found.dropped
        not_landed[src.label] = found.not_landed
        found.candidates.clear()  # `first` holds them now; each goes as its target is decided

    assignments: Dict[str, Assignment] = {}
    conflicts: List[Conflict] = []
    mismatched: List[Mismatch] = []
    skipped: List[str] = []
    missing: List[str] = []
    allowed: List[str] = []
    plain = {s.label: not s.transforms for s in sources}  # no value transforms: the usual case
    variables = {s.label: s.variables for s in sources}
    order = {s.label: i for i, s in enumerate(sources)}
    untaken: List[Union[_Candidate, Assignment]] = []  # candidates that restore nothing
    indexes: Dict[str, TransformIndex] = {}  # per source label, made when a misfit needs one

    def unprovided(tname: str) -> None:
        (allowed if any(g.matches(tname) for g in allow) else missing).append(tname)

    landed_names = list(first)
    if not more and all(map(operator.lt, landed_names, landed_names[1:])) and all(
            map(operator.is_, map(type, first.values()), itertools.repeat(Assignment))):
        # The usual warm start: one provider per target, each fitting as it is, found in target
        # order: `first` is the assignments (no second dict), what it lacks is missing.
        assignments, first = first, {}
        if len(assignments) < len(target_by_name):
            for tname in itertools.compress(target_names, map(operator.not_, map(assignments.__contains__,
                                                                                   target_names))):
                unprovided(tname)
    del landed_names
    for tname, tspec in target_by_name.items() if first else ():
        chosen: Optional[Union[_Candidate, Assignment]] = first.pop(tname, None)  # (popped: the plan's peak memory)
        if chosen is None:
            unprovided(tname)
            continue
        if tname in more:
            cands = sorted(more[tname], key=lambda c: (order[c.source], c.name))
            chosen = {"first": cands[0], "last": cands[-1]}.get(on_conflict)
            conflicts.append(Conflict(
                tname, tuple((c.source, c.name) for c in cands),
                None if chosen is None else (chosen.source, chosen.name)))
            untaken += [c for c in cands if c is not chosen]
            if chosen is None:
                continue
        if type(chosen) is Assignment:  # it fits as it is (see _match_source)
            assignments[tname] = chosen
            continue
        spec = variables[chosen.source][chosen.name]
        rule = chosen.rule.describe() if chosen.rule else None
        src = source_by_label[chosen.source]
        src_shape, tgt_shape = tuple(spec.shape), tuple(tspec.shape)
        mismatch = functools.partial(Mismatch, tname, chosen.source, chosen.name, spec.raw_key,
                                     tgt_shape, src_shape, tspec.dtype, spec.dtype)
        # Cast first, then the value transforms (as the backends do).
        dtype_differs = spec.dtype != tspec.dtype
        problem = cast_problem(spec.dtype, tspec.dtype) if dtype_differs else None
        dtype_bad = dtype_differs and (not (cast if src.cast is None else src.cast) or problem is not None)
        index = indexes.get(src.label)
        if index is None:
            index = indexes[src.label] = TransformIndex(src.transforms)
        ts = index.select(tname)
        out_shape, detail = src_shape, problem or ""
        if ts:
            try:
                out_shape = tuple(chain_output_shape(ts, src_shape, tgt_shape))
            except TransformError as e:
                mismatched.append(mismatch("transform", str(e)))
                skipped.append(tname)
                untaken.append(chosen)
                continue
            if out_shape != tgt_shape:
                detail = "; ".join(x for x in (problem, f"{out_shape} after the transforms") if x)
        shape_differs = out_shape != tgt_shape
        if shape_differs or dtype_bad:
            kind = "shape+dtype" if shape_differs and dtype_bad else ("shape" if shape_differs else "dtype")
            mismatched.append(mismatch(kind, detail))
            skipped.append(tname)
            untaken.append(chosen)
            continue
        assignments[tname] = Assignment(
            tname, chosen.source, chosen.name, spec.raw_key, spec, tspec, cast=dtype_differs,
            rule=rule, via=chosen.via,
            transforms=tuple(t.describe(src_shape, tgt_shape) if hasattr(t, "describe") else repr(t)
                             for t in ts))

    for g in allow:
        if not any(g.matches(t) for t in target_names):
            cands = [s + "*" for s in scopes_of(target_names)] + target_names
            unmatched.append(UnmatchedRule("allow_missing", f"allow_missing {quote_name(g.pattern)}",
                                           tuple(suggest(g.pattern, cands, cutoff=0.6)), False,
                                           None, reason="matched no target variable"))

    # A value transform (vocab remap, slice) whose target glob reaches no variable this source
    # provides is a typo or a stale config: report it, as an unmatched rule.
    if not all(plain.values()):
        provided: Dict[str, List[str]] = {}
        for a in assignments.values():
            provided.setdefault(a.source, []).append(a.target)
        for m in mismatched:
            provided.setdefault(m.source, []).append(m.target)
        for src in sources:
            for t in src.transforms:
                if not any(t.applies_to(n) for n in provided.get(src.label, ())):
                    unmatched.append(UnmatchedRule(
                        "transform", f"{type(t).__name__} for {quote_name(getattr(t, 'target', '?'))}",
                        tuple(suggest(getattr(t, "target", ""), target_names, cutoff=0.6)), False, src.label,
                        reason="applies to no variable this source provides"))

    # "unused" is every name nothing took (the definition): the dropped ones, those that
    # landed on no target, and those whose every candidate restores nothing (a lost conflict, a
    # misfit), which only a check against what was taken tells (no set of every name taken unless
    # some candidate was left). "dropped" says which the rules left out on purpose.
    unused = {s.label: not_landed[s.label] | set(dropped[s.label]) for s in sources}
    if untaken:
        taken: Dict[str, Set[str]] = {}
        for a in assignments.values():
            taken.setdefault(a.source, set()).add(a.name)
        for c in untaken:
            if c.name not in taken.get(c.source, ()):
                unused[c.source].add(c.name)
    for src in sources:  # a joined tensor nothing took leaves its parts unused (see sources.composed)
        if src.composed and unused[src.label] & src.composed.keys():
            names = unused[src.label]
            left = names & src.composed.keys()
            taken_parts = {p for j, parts in src.composed.items() if j not in left for p in parts}
            for joined in left:
                names.discard(joined)
                names.update(p for p in src.composed[joined] if p not in taken_parts)
    unused_sorted = {label: sorted(names) for label, names in unused.items()}
    if structure:  # (the parts of a restored Concat settle a finding about them, as dropping them would)
        settled = dict(dropped)
        for src in sources:
            if src.composed:
                took = {a.name for a in assignments.values() if a.source == src.label}
                settled[src.label] = [*dropped[src.label], *(p for j, ps in src.composed.items() if j in took for p in ps)]
        structure = _unsettled(structure, source_by_label, assignments, allowed, settled)
    ambiguous.sort(key=lambda a: (order[a.source], a.name))

    return Plan(
        targets=list(target_by_name.values()),
        sources=list(sources),
        assignments=assignments,
        missing=missing,
        allowed_missing=allowed,
        unused=unused_sorted,
        dropped=dropped,
        mismatched=mismatched,
        skipped=skipped,
        conflicts=conflicts,
        ambiguous=ambiguous,
        unmatched_rules=unmatched,
        allow_missing=tuple(g.pattern for g in allow),
        on_conflict=on_conflict,
        on_shape_mismatch=on_shape_mismatch,
        cast=cast,
        structure=structure,
        model_root=model_root,
    )
