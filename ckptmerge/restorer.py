"""Repeated restores: plan once, restore thousands of times, from any checkpoint or from memory.

A :class:`Restorer` plans and validates once, keeps its readers open, builds its graph ops once
(graph mode) and then restores as often as needed, optionally switching a source to another
checkpoint of the same layout (``restore(step=N)`` / ``restore(path=...)``), re-validated cheaply.
:func:`snapshot` captures a target's current values in host memory as a :class:`Source`; in eager
mode it holds TF tensors (sharing the variables' buffers, which TF copies on the next write), so
restoring a snapshot is a buffer hand-over, not a copy.
"""

from __future__ import annotations

import functools
import logging
import threading
from typing import TYPE_CHECKING, Any, Callable, Dict, Optional, TypeVar

import numpy as np

from .api import Binding, SourcesArg
from .args import check_bool, check_callable, check_options, check_step, check_str
from .errors import CkptMergeError, PlanError
from .restoring.backends.tensors import join_parts, read_variable
from .sources.source import Source, SourceHandle
from .text import quote_name

if TYPE_CHECKING:  # pragma: no cover
    from .render.report import Report

__all__ = ["Restorer", "snapshot"]

log = logging.getLogger(__name__)
_F = TypeVar("_F", bound=Callable[..., Any])


def snapshot(target: Any, *, session: Any = None, name: str = "snapshot") -> Source:
    """Capture the current values of ``target``'s variables in memory, as a :class:`Source`.

    Names are the target names (see docs/names.md), so the snapshot restores into the same
    target with no rules. Nothing touches the disk.

    Args:
        target: anything :func:`ckptmerge.plan` accepts as a target.
        session: the session holding the values (graph mode).
        name: the source's report label.

    Example:
        >>> generic = snapshot(model)             # doctest: +SKIP
        >>> # ... fine-tune a few steps, predict ...
        >>> restore(model, [generic])             # back to the generic weights, no disk I/O
    """
    from .restoring.targets import collect_targets

    check_str(name, "name")
    targets = collect_targets(target)
    values: Dict[str, Any] = {}
    if targets.mode == "keras":  # another Keras backend: host copies, no TensorFlow
        from .restoring.backends.keras_native import keras_numpy

        values = {n: np.array(keras_numpy(t.parts[0][0])) for n, t in targets.variables.items()}
        return Source(None, name=name, _values=values)
    import tensorflow as tf

    if targets.mode == "graph":
        if session is None:
            session = tf.compat.v1.get_default_session()
        if session is None:
            raise CkptMergeError("snapshot() in graph mode needs session=sess (or a default session).")
        flat = [(n, v) for n, t in targets.variables.items() for v, _ in t.parts]
        fetched = session.run([v for _, v in flat])
        for (n, _), val in zip(flat, fetched):
            values.setdefault(n, []).append(val)
        for n, t in targets.variables.items():
            values[n] = join_parts(t, values[n])
    else:
        with tf.device("/CPU:0"):
            for n, t in targets.variables.items():
                if not t.partitioned:
                    values[n] = tf.identity(read_variable(t.parts[0][0]))
                else:
                    values[n] = join_parts(t, [v.numpy() for v, _ in t.parts])
    return Source(None, name=name, _values=values)


def _serialised(method: _F) -> _F:
    """Run a :class:`Restorer` method under the restorer's lock (one call at a time, whole)."""

    @functools.wraps(method)
    def locked(self: "Restorer", *args: Any, **kwargs: Any) -> Any:
        with self._lock:
            return method(self, *args, **kwargs)

    return locked  # type: ignore[return-value]


class Restorer:
    """Plan once, then restore as often as needed.

    A restorer may be shared by threads. Its :meth:`switch`, :meth:`restore` and :meth:`close`
    run one at a time, each whole, under :attr:`lock`: ``restore(step=N)`` switches and restores
    in one go, so when it returns every target holds step N's values, never a mix of two
    checkpoints, and a switch made by another thread cannot close a reader a restore is using.
    Other threads' calls wait meanwhile. Hold :attr:`lock` (``with restorer.lock: ...``) to read
    the targets with no restore from another thread in between; variables read without it while a
    restore runs may show that restore half-done, as with any assignment.

    Args:
        target: as for :func:`ckptmerge.plan`.
        sources: as for :func:`ckptmerge.plan`.
        session: graph mode: the session to restore in (default: the default session at restore).
        strict: reject plans with findings (checked once, here).
        **plan_options: ``allow_missing``, ``on_conflict``, ``on_shape_mismatch``, ``cast``.

    Raises:
        PlanError: the plan has findings ``strict`` does not accept.

    Example:
        >>> r = Restorer(model, [Source("runs/A")])      # doctest: +SKIP
        >>> for step in (100, 200, 300):
        ...     r.restore(step=step)                      # same layout, no re-planning
    """

    def __init__(self, target: Any, sources: SourcesArg, *, session: Any = None, strict: bool = True,
                 **plan_options: Any) -> None:
        from .api import PLAN_OPTIONS
        from .api import plan as make

        check_options(plan_options, PLAN_OPTIONS, "Restorer()")
        check_bool(strict, "strict")
        self.plan = make(target, sources, **plan_options)
        self.plan.check(strict=strict)
        self.strict = strict
        self.session = session
        self.count = 0
        self._lock = threading.RLock()
        binding = self.plan._binding
        # Each checkpoint source's path as first given (a directory, typically): switching by
        # step resolves against it even after a switch by path.
        self._origin = {h.label: h.source.path for h in binding.handles if not h.source.in_memory}
        if binding.targets.mode == "graph":
            from .restoring.backends.graph import GraphOps

            binding.graph_ops = GraphOps(self.plan, binding)

    @property
    def lock(self) -> "threading.RLock":
        """The re-entrant lock that :meth:`switch`, :meth:`restore` and :meth:`close` hold.

        Example:
            >>> with restorer.lock:                          # doctest: +SKIP
            ...     restorer.restore(step=2000)
            ...     weights = [v.numpy() for v in model.weights]   # all of step 2000
        """
        return self._lock

    @property
    def binding(self) -> Binding:
        """The live targets, open readers and cached ops."""
        return self.plan._binding

    def _handle(self, source: Optional[str]) -> SourceHandle:
        disk = [h for h in self.binding.handles if not h.source.in_memory]
        if source is not None:
            for h in disk:
                if h.label == source:
                    return h
            raise CkptMergeError(
                f"No checkpoint source labelled {quote_name(source)}; sources: {', '.join(quote_name(h.label) for h in disk)}."
            )
        if len(disk) != 1:
            raise CkptMergeError(
                f"This restorer has {len(disk)} checkpoint sources; say which one to switch with "
                f"source=..., one of: {', '.join(repr(h.label) for h in disk)}."
            )
        return disk[0]

    @_serialised
    def switch(self, *, step: Optional[int] = None, path: Any = None, source: Optional[str] = None) -> SourceHandle:
        """Point one source at another checkpoint of the same layout (validated, not re-planned).

        Args:
            step: take this step from the source's directory (as first given).
            path: take this checkpoint (prefix, directory, ...) instead.
            source: the label of the source to switch; needed when there are several.

        Returns:
            The new opened source (the old one's files are closed).

        Raises:
            CheckpointNotFoundError: no such step or path (the error lists the steps there are).
            PlanError: the new checkpoint lacks a name the plan uses, or its shape/dtype differ.
            CkptMergeError: ``step`` for a source given as a prefix; several sources and no
                ``source``.

        Example:
            >>> restorer.switch(step=2000)                      # doctest: +SKIP
            >>> restorer.switch(path="runs/A/model-1000")       # doctest: +SKIP
        """
        old = self._handle(source)
        base = path if path is not None else self._origin[old.label]
        if path is None and step is not None and not _is_dir(base):
            raise CkptMergeError(
                f"Source {quote_name(old.label)} was given as the checkpoint prefix {base}; pass path=... to "
                "switch it, or make the source from its directory to switch by step."
            )
        new_source = Source(base, step=step, map=old.source.map, regex=old.source.regex,
                            include=old.source.include, exclude=old.source.exclude,
                            optimizer=old.source.optimizer, name=old.source.label, cast=old.source.cast,
                            transforms=old.source.transforms, align=old.source.align)
        handle = new_source.open()
        if old.renamed:  # a Keras weights file named by the model's walk: the same names
            handle.rename(old.renamed, old.notes)
        new_vars = {v.name: v for v in handle.all_variables}
        problems = []
        for a in self.plan.assignments.values():
            if a.source != old.label:
                continue
            got = new_vars.get(a.name)
            if got is None:
                problems.append(f"{quote_name(a.name)} is not in {quote_name(handle.path)}")
            elif got.shape != a.spec.shape or got.dtype != a.spec.dtype:
                problems.append(f"{quote_name(a.name)} is {got.dtype} {got.shape} in {quote_name(handle.path)}, "
                                f"was {a.spec.dtype} {a.spec.shape}")
        if problems:
            handle.close()
            raise PlanError(
                f"Checkpoint {quote_name(handle.path)} does not have the layout this restorer was planned for "
                f"({len(problems)} difference(s)): " + "; ".join(problems[:10])
                + ". Make a new Restorer for it.", plan=self.plan,
            )
        handles = self.binding.handles
        handles[handles.index(old)] = handle
        old.close()
        return handle

    @_serialised
    def restore(self, *, step: Optional[int] = None, path: Any = None, source: Optional[str] = None,
                progress: Any = None) -> "Report":
        """Restore now; with ``step`` or ``path`` first switch a source to that checkpoint.

        Args:
            step: first switch to this step of the source's directory (see :meth:`switch`).
            path: first switch to this checkpoint (prefix, directory, ...).
            source: the label of the source to switch; needed when there are several.
            progress: optional ``progress(done_bytes, total_bytes)`` callback.

        Returns:
            The :class:`ckptmerge.render.report.Report` of this restore.

        Raises:
            RestoreError: a read failed; every target variable kept its value.

        Example:
            >>> restorer.restore()             # doctest: +SKIP
            >>> restorer.restore(step=2000)    # doctest: +SKIP
        """
        check_step(step)
        check_str(source, "source", optional=True)
        check_callable(progress, "progress")
        if step is not None or path is not None:
            self.switch(step=step, path=path, source=source)
        from .restoring.backends import run_plan

        report = run_plan(self.plan, self.session, strict=self.strict, progress=progress)
        self.count += 1
        return report

    @_serialised
    def close(self) -> None:
        """Close the readers (after the restore another thread may be running)."""
        self.binding.close()

    def __enter__(self) -> "Restorer":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def _is_dir(path: Any) -> bool:
    import os

    return path is not None and os.path.isdir(path)
