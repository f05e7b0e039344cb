"""Restore backends: carry out a plan in graph mode or in eager mode.

:func:`run_plan` is what ``Plan.restore`` calls. It checks the plan's findings first (nothing
is touched when ``strict`` rejects the plan), then hands over to the graph backend (sources read
concurrently by the TF-free reader, then one fed assign op built once per plan), the eager
backend (the same reads, then assigned without copies) or the Keras-native one. All are atomic:
a read that fails changes no variable.

Holds: ``graph``, ``eager`` and ``keras_native`` (one backend each), ``tensors`` (values into
tensors: casts, partitions) and ``common`` (progress, skipped targets, the report).

May import: ``restoring.targets``, ``render``, ``planning``, ``alignment``, ``formats`` and the
bottom layer (``core``). TensorFlow and Keras only inside functions.
"""

from __future__ import annotations

from typing import Any, Optional

from ...core.errors import CkptMergeError
from .common import Progress
from ...core.redact import get_logger

__all__ = ["run_plan", "Progress"]

log = get_logger(__name__)

def run_plan(plan: Any, session: Any = None, *, strict: bool = True, progress: Optional[Progress] = None) -> Any:
    """Restore the variables of ``plan`` and return a :class:`ckptmerge.render.report.Report`.

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
            "reported or merged (ckptmerge.merging.local) but not restored. Plan against the model instead."
        )
    if binding.targets.mode == "graph":
        from .graph import restore_graph

        return restore_graph(plan, binding, session, progress=progress)
    if binding.targets.mode == "keras":
        from .keras_native import restore_keras

        return restore_keras(plan, binding, progress=progress)
    from .eager import restore_eager

    return restore_eager(plan, binding, progress=progress)
