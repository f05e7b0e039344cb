"""What every restore backend shares: the progress callback's type, the all-or-nothing
assignment loop, the targets a restore leaves as they were, and the report of a finished restore.
"""

from __future__ import annotations

from typing import Any, Callable, List, Sequence, Tuple

from ...core.errors import RestoreError
from ...formats.io.interrupts import HeldInterrupts
from ...core.text import quote_name

__all__ = ["Progress", "assign_all", "skipped_targets", "make_report"]

#: A progress callback: ``progress(done_bytes, total_bytes)``.
Progress = Callable[[int, int], None]


def assign_all(work: Sequence[Tuple[Any, Any]], assign: Callable[[Any, Any], None],
               current: Callable[[Any], Any], put_back: Callable[[Any, Any], None]) -> None:
    """Assign every ``(variable, value)`` of ``work``, or none of them.

    The previous values are taken first (``current(variable)``). Ctrl-C is held back for the
    whole loop and checked after each assignment; an interrupt, or any exception an assignment
    raises, puts back every variable assigned so far *and the one in flight* (it may have been
    changed before the error), then the interrupt is delivered (``KeyboardInterrupt``) or the
    error raised as a :class:`~ckptmerge.core.errors.RestoreError`.

    Example:
        >>> store = {"a": 0, "b": 0}
        >>> assign_all([("a", 1), ("b", 2)], store.__setitem__, store.get, store.__setitem__)
        >>> store
        {'a': 1, 'b': 2}
    """
    with HeldInterrupts() as held:
        backups = [current(var) for var, _ in work]
        done = 0
        try:
            for var, value in work:
                if held.pending:
                    break
                assign(var, value)
                done += 1
        except BaseException as exc:
            unrestored = _put_back(work, backups, done + 1, put_back)
            if not isinstance(exc, Exception):
                raise
            raise RestoreError(
                f"Assigning target variable {done + 1} of {len(work)} failed; "
                + (f"{unrestored} target(s) could not be put back" if unrestored else
                   "every target was put back as it was") + f". Cause: {exc}") from exc
        if held.pending:  # Ctrl-C: put everything back, then let the interrupt through
            _put_back(work, backups, done, put_back)


def _put_back(work: Sequence[Tuple[Any, Any]], backups: Sequence[Any], count: int,
              put_back: Callable[[Any, Any], None]) -> int:
    """Put the first ``count`` variables back; return how many could not be."""
    failed = 0
    for (var, _), old in zip(work[:count], backups):
        try:
            put_back(var, old)
        except Exception:  # keep putting the others back; the count goes into the error
            failed += 1
    return failed


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
