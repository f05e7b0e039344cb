"""Eager-mode restore: read every source concurrently, then assign without copies.

Why this shape: TF's own ``RestoreV2`` reads the tensors of one checkpoint one after another on
one thread, and ``Variable.assign(numpy_array)`` copies every byte once more. Here each source is
read by ckptmerge's TF-free reader on its own thread (``readinto`` + CRC32C, both release the
GIL) into fresh 64-byte-aligned buffers, which become tensors through DLPack without a copy;
assigning such a tensor hands its buffer to the variable. Nothing is assigned until every read has
succeeded, and the previous values are kept (reading a resource variable shares its buffer, so
this costs nothing) to put everything back if an assignment fails half-way or Ctrl-C lands
(:func:`~ckptmerge.restoring.backends.common.assign_all`).
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Dict, List, Optional, Tuple

from ...core.errors import CkptMergeError, RestoreError
from ...core.redact import get_logger
from ...core.text import quote_name
from .common import Progress, assign_all, make_report
from .tensors import part_value, read_variable, to_numpy, to_tensor

__all__ = ["restore_eager", "read_sources", "prepare_values"]

log = get_logger(__name__)


def _by_source(plan: Any) -> Dict[str, List[Any]]:
    groups: Dict[str, List[Any]] = {}
    for a in plan.assignments.values():
        groups.setdefault(a.source, []).append(a)
    return groups


def read_sources(plan: Any, binding: Any, progress: Optional[Progress] = None) -> Tuple[Dict[Tuple[str, str], Any], int]:
    """Read every assigned tensor, one thread per source; raise before anything is assigned.

    Returns:
        ``({(source_label, checkpoint_name): value}, bytes_read)``.
    """
    # One checkpoint name may feed several targets: read it once.
    groups = {label: list({a.name: a for a in g}.values()) for label, g in _by_source(plan).items()}
    handles = {h.label: h for h in binding.handles}
    total = sum(a.spec.nbytes for g in groups.values() for a in g)
    values: Dict[Tuple[str, str], Any] = {}
    if not groups:
        return values, 0
    with ThreadPoolExecutor(max_workers=len(groups), thread_name_prefix="ckptmerge-read") as pool:
        futures = {label: pool.submit(handles[label].read, [a.name for a in g]) for label, g in groups.items()}
        done = 0
        errors = []
        for label, fut in futures.items():
            try:
                got = fut.result()
            except CkptMergeError as exc:
                errors.append((label, exc))
                continue
            for name, val in got.items():
                values[(label, name)] = val
            done += sum(a.spec.nbytes for a in groups[label])
            if progress is not None:
                progress(done, total)
    if errors:
        label, exc = errors[0]
        raise RestoreError(
            f"Reading source {quote_name(label)} failed, so no target variable was changed: {exc}",
            path=getattr(exc, "path", None), key=getattr(exc, "key", None),
        ) from exc
    return values, done


def prepare_values(plan: Any, binding: Any, values: Dict[Tuple[str, str], Any], *,
                   as_numpy: bool) -> Dict[Tuple[str, Optional[str]], Any]:
    """Cast, transform and split the read values per target part.

    Returns ``{(target name, part spec): value}``: TF tensors (zero-copy where the buffer is
    ours) in eager mode, 64-byte-aligned numpy arrays for graph-mode feeds.
    """
    owned = {h.label: not h.source.in_memory for h in binding.handles}
    uses: Dict[Tuple[str, str], int] = {}
    for a in plan.assignments.values():
        uses[(a.source, a.name)] = uses.get((a.source, a.name), 0) + 1
    out: Dict[Tuple[str, Optional[str]], Any] = {}
    for a in plan.assignments.values():
        raw = values[(a.source, a.name)]
        value = binding.transform(a, raw)  # cast, then vocab remap / slicing
        # A buffer read once but feeding several targets must not become two variables' storage.
        fresh = (owned[a.source] and uses[(a.source, a.name)] == 1) or value is not raw
        for _, spec in binding.targets.variables[a.target].parts:
            piece = part_value(value, spec)
            mine = fresh or spec is not None
            out[(a.target, spec)] = to_numpy(piece, owned=mine) if as_numpy else to_tensor(piece, owned=mine)
    return out


def _fast_ops() -> Tuple[Any, Any]:
    """``(read, assign)`` for variables: the raw ops for plain resource variables (a restore of
    many small variables is otherwise dominated by Python-side overhead of ``read_value`` and
    ``assign``), the public methods for everything else (distributed, Keras-wrapped, ...)."""
    import tensorflow as tf
    from tensorflow.python.ops.resource_variable_ops import ResourceVariable

    raw_read, raw_assign = tf.raw_ops.ReadVariableOp, tf.raw_ops.AssignVariableOp

    def read(var: Any) -> Any:
        if type(var) is ResourceVariable:
            return raw_read(resource=var.handle, dtype=var.dtype)
        return read_variable(var)  # (a ShardedVariable has no read_value)

    def assign(var: Any, value: Any) -> None:
        if type(var) is ResourceVariable:
            raw_assign(resource=var.handle, value=value)
        else:
            var.assign(value, read_value=False)
    return read, assign


def restore_eager(plan: Any, binding: Any, progress: Optional[Progress] = None) -> Any:
    """Carry out ``plan`` in eager mode; see the module docstring."""
    t0 = time.perf_counter()
    values, nbytes = read_sources(plan, binding, progress)
    prepared = prepare_values(plan, binding, values, as_numpy=False)
    work = [(var, prepared[(a.target, spec)]) for a in plan.assignments.values()
            for var, spec in binding.targets.variables[a.target].parts]
    read, assign = _fast_ops()
    assign_all(work, assign, read, lambda var, old: var.assign(old, read_value=False))
    return make_report(plan, binding, mode="eager", elapsed=time.perf_counter() - t0, bytes_read=nbytes)
