"""What every restore backend shares: the progress callback's type, the targets a restore leaves
as they were, and the report of a finished restore.
"""

from __future__ import annotations

from typing import Any, Callable, List, Tuple

from ...text import quote_name

__all__ = ["Progress", "skipped_targets", "make_report"]

#: A progress callback: ``progress(done_bytes, total_bytes)``.
Progress = Callable[[int, int], None]


def skipped_targets(plan: Any) -> List[Tuple[str, str]]:
    """``(target, reason)`` for every target a restore of ``plan`` leaves as it was.

    Mismatches (skipped by ``on_shape_mismatch='skip'``, or by ``strict=False``), unresolved
    conflicts and ambiguities, and missing targets (``strict=False``); allowed-missing targets
    are counted apart, in the report's summary.
    """
    why = "on_shape_mismatch='skip'" if plan.on_shape_mismatch == "skip" else "strict=False"
    out = [(m.target, f"{m.describe()} ({why})") for m in plan.mismatched]
    out += [(c.target, c.message().split(" (pass")[0] + " (strict=False)")
            for c in plan.conflicts if c.blocking]
    for amb in getattr(plan, "ambiguous", ()):
        if not amb.resolved:
            out += [(t, f"checkpoint name {quote_name(amb.name)} is renamed ambiguously (strict=False)")
                    for t in amb.targets if t is not None and t not in plan.assignments]
    out += [(name, "provided by no source (strict=False)") for name in plan.missing]
    return sorted(set(out))


def make_report(plan: Any, binding: Any, *, mode: str, elapsed: float, bytes_read: int) -> Any:
    """Build the :class:`ckptmerge.render.report.Report` of a finished restore."""
    from ...render.report import Report

    restored = sorted(plan.assignments)
    skipped = skipped_targets(plan)
    per_source = []
    for h in binding.handles:
        mine = [a for a in plan.assignments.values() if a.source == h.label]
        per_source.append({"label": h.label, "path": h.path, "note": h.note,
                           "n_restored": len(mine), "bytes": sum(a.spec.nbytes for a in mine)})
    return Report(plan=plan, mode=mode, restored=restored, skipped=skipped, elapsed=elapsed,
                  bytes_read=bytes_read, sources=per_source)
