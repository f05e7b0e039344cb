"""Restore backends: carry out a plan in graph mode or in eager mode.

:func:`run_plan` is what ``Plan.restore`` calls. It checks the plan's findings first (nothing
is touched when ``strict`` rejects the plan), then hands over to the graph backend (one
``RestoreV2`` per source, built once, assignments gated on every read) or the eager backend
(sources read concurrently by the TF-free reader, then assigned without copies). Both are
atomic: a read that fails changes no variable.
"""

from __future__ import annotations

import logging
from typing import Any, Callable, List, Optional, Tuple

from ..errors import CkptMergeError
from ..text import quote_name

__all__ = ["run_plan", "Progress"]

log = logging.getLogger(__name__)

#: A progress callback: ``progress(done_bytes, total_bytes)``.
Progress = Callable[[int, int], None]


def run_plan(plan: Any, session: Any = None, *, strict: bool = True, progress: Optional[Progress] = None) -> Any:
    """Restore the variables of ``plan`` and return a :class:`ckptmerge.report.Report`.

    Args:
        plan: a plan made by :func:`ckptmerge.plan` (it carries the live targets and sources).
        session: the ``tf.compat.v1.Session`` in graph mode (default: the default session).
        strict: raise :class:`ckptmerge.PlanError` for any finding other than ``unused``.
        progress: optional ``progress(done_bytes, total_bytes)`` callback.

    Raises:
        PlanError: the plan has blocking findings; nothing was changed.
        RestoreError: reading failed; every target variable kept its value.
    """
    binding = plan._binding
    if binding is None:
        raise CkptMergeError(
            "This plan has no live target or sources (it was built from specs alone). "
            "Make it with ckptmerge.plan(target, sources) to restore it."
        )
    plan.check(strict=strict, action="restore")
    if binding.targets.mode == "specs":
        raise CkptMergeError(
            "This plan's target is a list of specs (names and shapes), not variables, so it can be "
            "reported or merged (ckptmerge.offline) but not restored. Plan against the model instead."
        )
    if binding.targets.mode == "graph":
        from .graph import restore_graph

        return restore_graph(plan, binding, session, progress=progress)
    if binding.targets.mode == "keras":
        from .keras_native import restore_keras

        return restore_keras(plan, binding, progress=progress)
    from .eager import restore_eager

    return restore_eager(plan, binding, progress=progress)


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
    """Build the :class:`ckptmerge.report.Report` of a finished restore."""
    from ..report import Report

    restored = sorted(plan.assignments)
    skipped = skipped_targets(plan)
    per_source = []
    for h in binding.handles:
        mine = [a for a in plan.assignments.values() if a.source == h.label]
        per_source.append({"label": h.label, "path": h.path, "note": h.note,
                           "n_restored": len(mine), "bytes": sum(a.spec.nbytes for a in mine)})
    return Report(plan=plan, mode=mode, restored=restored, skipped=skipped, elapsed=elapsed,
                  bytes_read=bytes_read, sources=per_source)
