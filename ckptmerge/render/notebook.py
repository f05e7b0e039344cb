"""HTML for Jupyter: how plans, restore reports and suggestions show in a notebook.

``Plan``, ``Report`` and ``Suggestion`` define ``_repr_html_`` through these functions. Each
renders findings first (what blocks, what stays unresolved), then the assignments, as small
tables; every name is HTML-escaped (checkpoint names are untrusted input). Pure string building.
"""

from __future__ import annotations

import html
from typing import TYPE_CHECKING, Any, Iterable, List, Sequence

from ..core.text import plural
from .verdicts import align_hint, verdict

if TYPE_CHECKING:  # pragma: no cover
    from ..planning.planner import Plan
    from ..planning.suggestion import Suggestion
    from .report import Report

__all__ = ["html_table", "plan_html", "report_html", "suggestion_html"]


def html_table(headers: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    """An HTML table, every cell escaped.

    Example:
        >>> html_table(["name"], [["<b>"]])
        '<table><tr><th>name</th></tr><tr><td>&lt;b&gt;</td></tr></table>'
    """
    head = "".join(f"<th>{html.escape(str(h))}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in r) + "</tr>"
                   for r in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


def _heading(text: str) -> str:
    return f"<h4>{html.escape(text)}</h4>"


def _findings(plan: "Plan") -> List[str]:
    lines = plan.blocking(strict=True)
    if not lines:
        return [f"<p>{html.escape('No blocking findings.')}</p>"]
    return [_heading(f"Findings ({len(lines)})"), html_table(["finding"], [[x] for x in lines])]


def plan_html(plan: "Plan") -> str:
    """A plan as HTML: the verdict, findings, the alignment hint, then assignments (with how each
    name met its target: a rule, an h5 key, a model root swap, or the evidence of a structural match).

    Example:
        >>> from ckptmerge.planning.planner import make_plan
        >>> plan_html(make_plan([], [])).startswith("<div><p><b>")
        True
    """

    parts = [f"<p><b>{html.escape(verdict(plan))}</b>: {plural(len(plan.targets), 'target')}, "
             f"{len(plan.assignments)} assigned</p>"]
    parts += _findings(plan)
    hint = align_hint(plan)
    if hint:
        parts.append(f"<p>{html.escape(hint)}</p>")
    # (the raw key and the operations as the text report shows them: a column only when some have one)
    keyed = any(a.key != a.name for a in plan.assignments.values())
    operated = any(a.transforms or a.cast for a in plan.assignments.values())
    rows = [[a.target, a.source, a.name, *([a.key] if keyed else []), a.spec.dtype, tuple(a.spec.shape),
             *(["; ".join(([f"cast {a.spec.dtype}->{a.target_spec.dtype}"] if a.cast else []) + list(a.transforms))]
               if operated else []),
             "; ".join(x for x in (a.rule, a.via) if x)]
            for a in plan.assignments.values()]
    if rows:
        header = ["target", "source", "checkpoint name", *(["raw key"] if keyed else []), "dtype", "shape",
                  *(["operations"] if operated else []), "via"]
        parts += [_heading(f"Assignments ({len(rows)})"), html_table(header, rows)]
    if plan.across_frameworks:
        c = plan.coverage()
        parts += [_heading("Coverage"),
                  html_table(["targets", "assigned", "unresolved", "missing", "allowed missing", "skipped"],
                             [[c["targets"][k] for k in ("total", "assigned", "unresolved", "missing",
                                                          "allowed_missing", "skipped")]]),
                  html_table(["source", "tensors", "used", "unused"],
                             [[s["label"], s["tensors"], s["used"], s["unused"]] for s in c["sources"]])]
        if c["unresolved"]:
            parts += [_heading(f"Unresolved ({len(c['unresolved'])})"),
                      html_table(["source", "targets", "candidates", "why"],
                                 [[u["source"], ", ".join(u["targets"]), ", ".join(u["names"]), u["reason"]]
                                  for u in c["unresolved"]])]
    unused = [[label, n] for label, names in plan.unused.items() for n in names]
    if unused:
        parts += [_heading(f"Unused ({len(unused)})"), html_table(["source", "checkpoint name"], unused)]
    return "<div>" + "".join(parts) + "</div>"


def report_html(report: "Report") -> str:
    """A restore report as HTML: the summary, skipped targets first, then what was restored."""
    parts = [f"<p><b>{html.escape(report.summary())}</b></p>"]
    if report.skipped:
        parts += [_heading(f"Skipped ({len(report.skipped)})"),
                  html_table(["target", "reason"], report.skipped)]
    by_target = report.plan.assignments
    rows = [[t, by_target[t].source, by_target[t].name, by_target[t].via or ""] if t in by_target else [t, "", "", ""]
            for t in report.restored]
    if rows:
        parts += [_heading(f"Restored ({len(rows)})"),
                  html_table(["target", "source", "checkpoint name", "via"], rows)]
    return "<div>" + "".join(parts) + "</div>"


def suggestion_html(suggestion: "Suggestion") -> str:
    """A suggestion as HTML: unresolved names first, then each proposed entry with its evidence."""
    parts = [f"<p><b>{html.escape(suggestion.report().splitlines()[0])}</b></p>"]
    unresolved = [[s.label, ", ".join(u.targets), ", ".join(u.names), u.reason]
                  for s in suggestion.sources for u in s.unresolved]
    if unresolved:
        parts += [_heading(f"Unresolved ({len(unresolved)})"),
                  html_table(["source", "targets", "candidates", "why"], unresolved)]
    rows = [[s.label, e.name, e.target, e.count, f"{e.confidence:.2f}", "review" if e.review else "",
             "; ".join(e.evidence)] for s in suggestion.sources for e in s.entries]
    if rows:
        parts += [_heading(f"Proposed map ({len(rows)})"),
                  html_table(["source", "checkpoint name", "target", "variables", "confidence", "review",
                              "evidence"], rows)]
    if suggestion.missing:
        parts += [_heading(f"Still missing ({len(suggestion.missing)})"),
                  html_table(["target"], [[t] for t in suggestion.missing])]
    return "<div>" + "".join(parts) + "</div>"
