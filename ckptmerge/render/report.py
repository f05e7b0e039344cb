"""Plain-text rendering of plans, and the :class:`Report` a restore returns.

Everything here is deterministic (sorted, no timestamps beyond what it is given) so that the
CLI tests can assert exact output. Nothing here reads files or imports TensorFlow.
"""

from __future__ import annotations

import collections
import operator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Optional, Sequence, Tuple

from ..alignment.align import CONFIDENCE_FLOOR
from ..core.args import describe_value
from ..core.errors import OptionError
from ..core.redact import redact, redacted_repr
from ..core.text import escape_name, human_bytes, join_lines, plural, quote_name
from .labels import ShortLabels
from .verdicts import align_hint, verdict

if TYPE_CHECKING:  # pragma: no cover
    from ..planning.planner import Plan
    from ..planning.suggestion import Suggestion

__all__ = ["render_plan", "align_hint", "coverage_line", "Report", "RESTORE_MODES"]

_SOURCE = operator.attrgetter("source")

#: Valid values of :attr:`Report.mode`.
RESTORE_MODES = ("graph", "eager", "keras", "offline")
#: Fields of a report's per-source records that may hold a path (redacted: see ckptmerge.core.redact).
_SHOWN_PATHS = ("label", "path", "note")


def section(title: str, lines: Sequence[Any], limit: Optional[int], hint: str = "",
             render: Optional[Callable[[Any], str]] = None) -> List[str]:
    """``Title (N):`` (plus an optional hint) then the lines indented, truncated at ``limit``.

    With ``render``, ``lines`` are items and only the shown ones are rendered (a plan of 100,000
    assignments renders the 50 it shows).
    """
    if not lines:
        return []
    head = f"{title} ({len(lines)}):" if not hint else f"{title} ({len(lines)}) - {hint}:"
    shown = lines if limit is None else lines[:limit]
    out = [head] + [f"  {line if render is None else render(line)}" for line in shown]
    if len(shown) < len(lines):
        out.append(f"  ... and {len(lines) - len(shown)} more")
    return out


def _describe(item: Any) -> str:
    return item.describe()


def render_plan(plan: "Plan", *, limit: Optional[int] = 50) -> str:
    """Render a plan as plain text for people (names escaped: one name is one visible line).

    Layout: a header line, the options, one block per source (path, note, rules, counts),
    then the sections Assignments, Missing, Allowed missing, Mismatched, Conflicts,
    Unmatched rules, Structure and Unused (empty ones left out; "No findings." when there is none),
    and a final verdict line.

    Args:
        plan: the plan.
        limit: at most this many lines per section, then ``... and N more``; ``None``
            shows all.

    Returns:
        The text, lines joined with ``"\\n"`` (no trailing newline).

    Example:
        >>> from ckptmerge.planning.planner import make_plan
        >>> print(render_plan(make_plan([], [])))
        Plan: 0 targets, 0 sources, 0 assigned
        Options: on_conflict='error', on_shape_mismatch='error', cast=False, allow_missing=[]
        No findings.
        OK: nothing blocks a strict restore
    """
    if limit is not None and (not isinstance(limit, int) or isinstance(limit, bool) or limit < 0):
        raise OptionError(f"limit must be a non-negative int or None; received {describe_value(limit)}.")
    out: List[str] = [
        f"Plan: {plural(len(plan.targets), 'target')}, {plural(len(plan.sources), 'source')}, "
        f"{len(plan.assignments)} assigned",
        f"Options: on_conflict={quote_name(plan.on_conflict)}, "
        f"on_shape_mismatch={quote_name(plan.on_shape_mismatch)}, cast={plan.cast}, "
        "allow_missing=[" + ", ".join(quote_name(g) for g in plan.allow_missing) + "]",
    ]
    # (each source variable is assigned or unused, so the used ones are counted, not collected)
    fed = collections.Counter(map(_SOURCE, plan.assignments.values()))
    if plan.sources:
        out.append("Sources:")
    labels = ShortLabels(s.label for s in plan.sources)  # a long path once, in its header line
    whole: List[int] = []
    for s in plan.sources:
        note = f" ({labels(s.note)})" if s.note else ""
        whole.append(len(out))
        out.append(f"  {labels.short(s.label)}: {s.path}{note}")
        out.append("    rules: " + "; ".join(s.rules.describe()))
        n_used = s.n_tensors - len(plan.unused.get(s.label, ()))
        feeds = (f" (feeding {fed[s.label]} targets)" if fed[s.label] > n_used else "")
        out.append(f"    {plural(s.n_tensors, 'variable')}: {n_used} used{feeds}, "
                   f"{len(plan.unused.get(s.label, []))} unused "
                   f"({len(plan.dropped.get(s.label, []))} left out by rules)")
        if s.keras is not None:  # what Keras's own load_weights would do, to compare before loading
            lines = s.keras.lines()
            out.append(f"    Keras: {lines[0]}")
            out += [f"      {line}" for line in lines[1:]]

    out += section("Assignments", list(plan.assignments.values()), limit, render=_describe)

    findings: List[str] = []
    findings += section("Missing", list(plan.missing), limit,
                         "map a checkpoint variable to each, or pass allow_missing")
    findings += section("Allowed missing", list(plan.allowed_missing), limit)
    if plan.on_shape_mismatch == "skip":  # as Keras's skip_mismatch: what stays as it is, by name
        findings += section("Skipped", [m.describe() for m in plan.mismatched], limit,
                            "shapes differ, left as they are (on_shape_mismatch='skip')")
    else:
        findings += section("Mismatched", [m.message() for m in plan.mismatched], limit)
    findings += section("Conflicts", [c.message() for c in plan.conflicts]
                         + [a.message() for a in plan.ambiguous], limit)
    findings += section("Unmatched rules", [u.message() for u in plan.unmatched_rules], limit)
    findings += section("Structure", [f"{label}: {text}" for label, text in plan.structure], limit,
                         "names that do not line up")
    drift = [f"{s.label}: {line}" for s in plan.sources if s.drift is not None for line in s.drift.lines()]
    out_drift = section("Path drift", drift, limit, "which file layer feeds which model layer (align='structure')")
    dropped_by = {label: set(names) for label, names in plan.dropped.items()}
    unused = [(label, name) for label, names in plan.unused.items() for name in names]
    findings += section("Unused", unused, limit, "checkpoint variables no target takes",
                         render=lambda item: f"{item[0]}: {item[1]}" + (" (left out by rules)"
                                                                       if item[1] in dropped_by[item[0]] else ""))
    out += out_drift
    if plan.across_frameworks:
        findings += section("Unresolved", [f"{label}: {u.describe()}" for label, u in _unresolved(plan)], limit,
                             "alignment found candidates but cannot tell which; map one to settle it")
    out += findings if findings else ["No findings."]
    if plan.across_frameworks:
        out.append(coverage_line(plan))
    hint = align_hint(plan)
    if hint:
        out.append(hint)
    out.append(verdict(plan))
    return join_lines(_shortened(out, labels, whole))


def _shortened(lines: List[str], labels: ShortLabels, whole: Sequence[int]) -> List[str]:
    """``lines`` with long source labels shortened, except the header lines ``whole``."""
    keep = set(whole)
    return [line if i in keep else labels(line) for i, line in enumerate(lines)]


def _unresolved(plan: "Plan") -> List[Tuple[str, Any]]:
    missing = set(plan.missing) | set(plan.allowed_missing)
    return [(s.label, u) for s in plan.sources for u in s.unresolved if any(t in missing for t in u.targets)]


def coverage_line(plan: "Plan") -> str:
    """One line of :meth:`Plan.coverage <ckptmerge.Plan.coverage>`, as a report ends with it.

    Example:
        >>> from ckptmerge.planning.planner import make_plan
        >>> coverage_line(make_plan([], []))
        'Coverage: 0 targets: 0 assigned, 0 unresolved, 0 missing'
    """
    c = plan.coverage()
    t = c["targets"]
    parts = [f"{t['assigned']} assigned", f"{t['unresolved']} unresolved", f"{t['missing']} missing"]
    parts += [f"{t[k]} {k.replace('_', ' ')}" for k in ("allowed_missing", "skipped") if t[k]]
    line = f"Coverage: {plural(t['total'], 'target')}: {', '.join(parts)}"
    for s in c["sources"]:
        line += f"; source {quote_name(s['label'])}: {plural(s['tensors'], 'tensor')}, {s['used']} used, {s['unused']} unused"
    return line


@dataclass(frozen=True)
class Report:
    """What a restore did (built by the restore backends).

    Attributes:
        plan: the plan that was run.
        mode: ``"graph"``, ``"eager"``, ``"keras"`` (a Keras 3 model on another backend) or ``"offline"``.
        restored: target names that were assigned (stored sorted).
        skipped: ``(target, reason)`` pairs of targets left as they were (stored sorted).
        elapsed: seconds the restore took.
        bytes_read: bytes read from all checkpoints.
        sources: one dict per source: ``label``, ``path``, ``note``, ``n_restored``, ``bytes``.
        checkpoint: the :class:`~ckptmerge.CheckpointInfo` restored, for a restore made by
            ``Restorer.follow`` (else ``None``).
        replanned: why ``Restorer.follow`` planned again before this restore (the followed
            checkpoint's names, shapes or dtypes changed), else ``None``.

    Raises:
        OptionError: ``mode`` is not one of :data:`RESTORE_MODES`.

    Example:
        >>> from ckptmerge.planning.planner import make_plan
        >>> Report(make_plan([], []), "eager", [], [], 0.5, 0, []).summary()
        'restored 0 variables from 0 sources in 0.50 s; 0 allowed missing; 0 skipped'
    """

    __repr__ = redacted_repr  # (a REPL, a notebook or a log line shows no credential)

    plan: "Plan"
    mode: str
    restored: List[str]
    skipped: List[Tuple[str, str]]
    elapsed: float
    bytes_read: int
    sources: List[Dict[str, Any]]
    checkpoint: Any = None
    replanned: Optional[str] = None

    def __post_init__(self) -> None:
        if self.mode not in RESTORE_MODES:
            raise OptionError(f"mode must be one of {', '.join(quote_name(m) for m in RESTORE_MODES)}; "
                              f"received {self.mode!r}.")
        object.__setattr__(self, "restored", sorted(self.restored))
        object.__setattr__(self, "skipped", sorted((str(t), str(r)) for t, r in self.skipped))
        # (the per-source records are output only: shown and written with credentials redacted)
        object.__setattr__(self, "sources", [{k: redact(v) if k in _SHOWN_PATHS and isinstance(v, str) else v
                                              for k, v in s.items()} for s in self.sources])

    @property
    def n_sources_used(self) -> int:
        """How many sources provided at least one restored variable."""
        by_target = self.plan.assignments
        return len({by_target[t].source for t in self.restored if t in by_target})

    def summary(self) -> str:
        """One line, e.g. ``"restored 2 variables from 2 sources in 0.12 s; 1 allowed missing; 0 skipped"``."""
        return (f"restored {plural(len(self.restored), 'variable')} from "
                f"{plural(self.n_sources_used, 'source')} in {self.elapsed:.2f} s; "
                f"{len(self.plan.allowed_missing)} allowed missing; {len(self.skipped)} skipped")

    def short_labels(self) -> ShortLabels:
        """The short labels of this report's sources (see :mod:`ckptmerge.render.labels`)."""
        return ShortLabels(str(s.get("label", "?")) for s in self.sources)

    def _source_lines(self, verb: str, labels: ShortLabels) -> List[str]:
        """``Sources:`` and one line per source: label, path, note, how many ``verb``, bytes."""
        out = ["Sources:"] if self.sources else []
        for s in self.sources:
            note = f" ({labels(str(s['note']))})" if s.get("note") else ""
            out.append(f"  {labels.short(str(s.get('label', '?')))}: {s.get('path', '?')}{note}: "
                       f"{s.get('n_restored', 0)} {verb}, {human_bytes(int(s.get('bytes', 0)))}")
        return out

    def render(self, *, limit: Optional[int] = 50) -> str:
        """Plain text: the summary, mode and bytes, per-source lines, restored and skipped."""
        out = [self.summary(), f"Mode: {self.mode}; read {human_bytes(self.bytes_read)}"]
        if self.checkpoint is not None:
            out.append(f"Checkpoint: step {self.checkpoint.step} ({escape_name(self.checkpoint.path)})")
        if self.replanned:
            out.append(f"Re-planned: {self.replanned}")
        labels = self.short_labels()
        out += self._source_lines("restored", labels)
        by_target = self.plan.assignments
        rest = section("Restored", self.restored, limit,
                       render=lambda t: t if t not in by_target else by_target[t].describe())
        rest += section("Skipped", [f"{t}: {r}" for t, r in self.skipped], limit)
        rest += section("Allowed missing", list(self.plan.allowed_missing), limit)
        return join_lines(out + labels.lines(rest))

    def __str__(self) -> str:
        return self.render()

    def _repr_html_(self) -> str:
        from .notebook import report_html

        return report_html(self)

    def to_dict(self, *, lazy: bool = False) -> dict:
        """JSON-ready dict (``lazy``: the plan's as :meth:`Plan.to_dict(lazy=True) <ckptmerge.Plan.to_dict>`).

        Schema::

            {"summary": str, "mode": str, "restored": [str],
             "skipped": [{"target": str, "reason": str}], "elapsed": float,
             "bytes_read": int, "sources": [{"label", "path", "note", "n_restored", "bytes"}],
             "plan": Plan.to_dict()}

        plus, for a restore made by ``Restorer.follow``, ``"checkpoint": {"path", "step"}`` and
        ``"replanned": str | None``.
        """
        out = {"summary": self.summary(), "mode": self.mode, "restored": list(self.restored),
               "skipped": [{"target": t, "reason": r} for t, r in self.skipped],
               "elapsed": float(self.elapsed), "bytes_read": int(self.bytes_read),
               "sources": [dict(s) for s in self.sources], "plan": self.plan.to_dict(lazy=lazy)}
        if self.checkpoint is not None:
            out["checkpoint"] = {"path": self.checkpoint.path, "step": self.checkpoint.step}
            out["replanned"] = self.replanned
        return out


def render_suggestion(suggestion: "Suggestion", *, limit: Optional[int] = 50, next_step: bool = True) -> str:
    """Plain text for :meth:`Suggestion.report`: per source the proposed entries with evidence,
    then the names that stay unresolved, then (``next_step``) how to write and use the map.

    Example:
        >>> print(render_suggestion(cm.suggest(model, [cm.Source("old.h5")])))   # doctest: +SKIP
    """
    out = [f"Suggestion: {plural(suggestion.n_proposed, 'target')} aligned by structure of "
           f"{len(suggestion.plan.missing)} missing; {len(suggestion.missing)} would stay missing"]
    for s in suggestion.sources:
        out.append(f"Source {escape_name(s.label)}: {escape_name(s.path)}")
        out += [f"  {line}" for line in section(
            "Unresolved", [u.describe() for u in s.unresolved], limit, "the evidence cannot separate these")]
        out += [f"  {line}" for line in section("Proposed map", [e.describe() for e in s.entries if not e.review],
                                                 limit)]
        out += [f"  {line}" for line in section(
            "For review", [e.describe() for e in s.review], limit,
            f"confidence below {CONFIDENCE_FLOOR}: align='structure' would not apply these, and the map leaves them out")]
    out += section("Still missing", [escape_name(t) for t in suggestion.missing], limit)
    if suggestion.n_proposed and next_step:
        out.append("Review the map, then write it as a config (Suggestion.write('warm.yaml') or "
                   "`ckptmerge suggest ... -o warm.yaml`) and run `ckptmerge plan warm.yaml`.")
    return join_lines(out)
