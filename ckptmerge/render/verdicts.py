"""The status lines every rendering of a plan ends with: the verdict, and the hint that names
may differ wholesale (shared by the text report and the notebook HTML).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..core.text import plural, quote_name

if TYPE_CHECKING:  # pragma: no cover
    from ..planning.planner import Plan

__all__ = ["verdict", "align_hint"]


def verdict(plan: "Plan") -> str:
    """The last line of a plan report.

    Example:
        >>> from ckptmerge.planning.planner import make_plan
        >>> verdict(make_plan([], []))
        'OK: nothing blocks a strict restore'
    """
    n = len(plan.blocking(strict=True))
    if not n:
        return "OK: nothing blocks a strict restore"
    m = len(plan.blocking(strict=False))
    return f"{plural(n, 'blocking finding')} (strict); {m} with strict=False"


def align_hint(plan: "Plan") -> str:
    """A line pointing at :func:`ckptmerge.suggest` when missing targets and unused checkpoint
    names share shapes (names that differ wholesale), else ``""``.

    Example:
        >>> from ckptmerge.planning.planner import make_plan
        >>> align_hint(make_plan([], []))
        ''
    """
    if not plan.missing:  # (no alignment module to load)
        return ""
    from ..planning.suggestion import alignable

    n, labels = alignable(plan)
    if not n:
        return ""
    keras = [s.label for s in plan.sources if s.label in labels and s.keras is not None and s.drift is None]
    if keras:  # a Keras weights file walked by the model: its layers moved (path drift)
        return (f"Hint: {plural(n, 'missing target')} and unused entries of Keras weights file "
                f"{', '.join(quote_name(x) for x in keras)} share shapes and dtypes, so layers may have moved "
                "(a renamed attribute, a swapped class, a sub-model): Source(..., align='structure') pairs "
                "the file's layers with the model's where that is unambiguous, and the report says which fed which.")
    return (f"Hint: {plural(n, 'missing target')} and unused checkpoint variables of "
            f"{', '.join(quote_name(x) for x in labels)} share shapes and dtypes, so the names may differ "
            "wholesale: cm.suggest(target, sources) or `ckptmerge suggest SOURCE... --target PATH` "
            "proposes a map by structure, and Source(..., align='structure') applies its "
            "unambiguous part.")
