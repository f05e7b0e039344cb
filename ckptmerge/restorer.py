"""Repeated restores: plan once, restore thousands of times, from any checkpoint or from memory.

A :class:`Restorer` plans and validates once, keeps its readers open, builds its graph ops once
(graph mode) and then restores as often as needed, optionally switching a source to another
checkpoint of the same layout (``restore(step=N)`` / ``restore(path=...)``), re-validated cheaply.
:meth:`Restorer.follow` restores each new checkpoint of a training run as it arrives (the
actor/learner loop), through :func:`ckptmerge.watch`.
:func:`snapshot` captures a target's current values in host memory as a :class:`Source`; in eager
mode it holds TF tensors (sharing the variables' buffers, which TF copies on the next write), so
restoring a snapshot is a buffer hand-over, not a copy.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import threading
from typing import TYPE_CHECKING, Any, Callable, Dict, Iterator, List, Optional, TypeVar

import numpy as np

from .api import Binding, SourcesArg
from .core.args import check_bool, check_callable, check_options, check_step, check_str
from .core.errors import CkptMergeError, PlanError, ResourceLimitError, RestoreError
from .core.redact import get_logger
from .restoring.backends.tensors import join_parts, read_variable
from .sources.composed import ComposedHandle, composed_like
from .sources.opening import as_sources
from .sources.resolved import CheckpointInfo
from .sources.source import Source
from .sources.handles import SourceHandle
from .following.watch import WATCH_OPTIONS, check_watch_options, intact, watch_checked
from .core.text import and_list, quote_name

if TYPE_CHECKING:  # pragma: no cover
    from .render.report import Report

__all__ = ["Restorer", "snapshot"]

log = get_logger(__name__)
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
        self._target = target
        self._sources = as_sources(sources)
        self._plan_options = dict(plan_options)
        self.plan = make(target, self._sources, **plan_options)
        self.plan.check(strict=strict)
        self.strict = strict
        self.session = session
        self.count = 0
        self._lock = threading.RLock()
        binding = self.plan._binding
        # Each checkpoint source's path as first given (a directory, typically): switching by
        # step resolves against it even after a switch by path.
        self._origin = {h.label: h.source.path for h in binding.handles if not h.source.in_memory}
        self._build_ops()

    def _build_ops(self) -> None:
        binding = self.plan._binding
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
        handle = composed_like(old, _like(old.source, base, step=step).open())  # (joining what the old one joined)
        if old.renamed:  # a Keras weights file named by the model's walk: the same names
            handle.rename(old.renamed, old.notes)
        new_vars = {v.name: v for v in handle.all_variables}
        if isinstance(handle, ComposedHandle):
            new_vars.update(handle.joined_specs())
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

    def follow(self, directory: Any, *, source: Optional[str] = None, progress: Any = None,
               **watch_options: Any) -> Iterator["Report"]:
        """Restore each new checkpoint of ``directory`` as it arrives, and yield its report.

        The actor/learner loop in one line: :func:`ckptmerge.watch` finds each new complete
        checkpoint (in increasing step order, pinned while it is read) and this restorer
        restores it into the target, atomically: a checkpoint that cannot be read leaves every
        variable as it was, is reported (``on_skip``, else a warning) and skipped. The plan is
        kept while the checkpoints' names, shapes and dtypes stay the same; when they change it
        is made again, and the report's ``replanned`` says why (a new plan with findings that
        ``strict`` rejects skips that checkpoint, the old plan stays).

        Args:
            directory: the training directory (or URL) to follow.
            source: the label of the source the checkpoints replace; needed when there are several.
            progress: optional ``progress(done_bytes, total_bytes)`` callback for each restore.
            **watch_options: :func:`ckptmerge.watch`'s options (``after``, ``backlog``,
                ``until_step``, ``timeout``, ``timeout_fn``, ``poll``, ``on_skip``, ``notify``).

        Yields:
            The :class:`ckptmerge.render.report.Report` of each restore, with ``checkpoint``
            (the :class:`~ckptmerge.CheckpointInfo` restored) and ``replanned`` set.

        Raises:
            ArgumentError, ArgumentTypeError: bad options (raised by this call, before the loop).
            CkptMergeError: several checkpoint sources and no ``source``.

        Example:
            >>> r = Restorer(actor, [Source("runs/learner")])             # doctest: +SKIP
            >>> for report in r.follow("runs/learner", timeout=3600):     # doctest: +SKIP
            ...     act(actor, steps=1000)
        """
        check_options(watch_options, WATCH_OPTIONS, "Restorer.follow()")
        check_callable(progress, "progress")
        options = check_watch_options(directory, **watch_options)
        label = self._handle(source).label
        return self._follow(options, label, progress)

    def _follow(self, options: Dict[str, Any], label: str, progress: Any) -> Iterator["Report"]:
        on_skip = options["on_skip"]
        for info in watch_checked(options):
            try:
                report = self._restore_followed(label, info, options["given"], progress)
            except ResourceLimitError:  # out of open files or memory: not this file's fault, never skipped
                raise
            except CkptMergeError as e:
                err = _followed_error(info, e)
                if on_skip is not None:
                    on_skip(info, err)
                else:
                    log.warning("%s", err)
                continue
            yield report

    @_serialised
    def _restore_followed(self, label: str, info: CheckpointInfo, given: str, progress: Any) -> "Report":
        """Restore the followed checkpoint ``info`` into the target: the same plan when its layout
        is the same, else a new one (see :meth:`follow`)."""
        from .restoring.backends import run_plan

        old = self._handle(label)
        new_source = _like(old.source, info.read_path)
        handle = composed_like(old, new_source.open())
        try:
            if old.renamed:  # a Keras weights file named by the model's walk: the same names
                handle.rename(old.renamed, old.notes)
            if callable(getattr(handle, "name_targets", None)):  # (a layout's fused split follows the targets)
                handle.name_targets(self.binding.targets.infos)
            why = _layout_change(old, handle, info)
        except BaseException:
            handle.close()
            raise
        note = f"step {info.step} of {given}" + (" (pinned while read)" if info.pinned else "")
        if why is None:
            handle.path, handle.note = info.path, note
            handles = self.binding.handles
            handles[handles.index(old)] = handle
            old.close()
        else:
            handle.close()
            self._replan(label, new_source, why)
            for h in self.binding.handles:
                if h.label == label:
                    h.path, h.note = info.path, note
        report = run_plan(self.plan, self.session, strict=self.strict, progress=progress)
        self.count += 1
        return dataclasses.replace(report, checkpoint=info, replanned=why)

    def _replan(self, label: str, new_source: Source, why: str) -> None:
        """Plan again with ``new_source`` in place of the source ``label`` (the old plan stays
        when the new one has findings ``strict`` rejects)."""
        from .api import plan as make

        sources = [new_source if s.label == label else s for s in self._sources]
        log.info("re-planning: %s", why)
        graph = self.binding.targets.graph  # graph mode: the graph planned for, whichever is the default now
        with graph.as_default() if graph is not None else contextlib.nullcontext():
            plan = make(self._target, sources, **self._plan_options)
        try:
            plan.check(strict=self.strict)
        except PlanError as e:
            plan._binding.close()
            raise PlanError(f"{why}; the new plan has findings, so this checkpoint was not restored and the "
                            f"old plan stays: {e}", plan=plan) from None
        self.plan._binding.close()
        self.plan = plan
        self._build_ops()

    @_serialised
    def close(self) -> None:
        """Close the readers (after the restore another thread may be running)."""
        self.binding.close()

    def __enter__(self) -> "Restorer":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def _like(source: Source, path: Any, *, step: Optional[int] = None) -> Source:
    """A source with ``source``'s rules and label, reading another checkpoint."""
    return Source(path, step=step, map=source.map, regex=source.regex, include=source.include,
                  exclude=source.exclude, optimizer=source.optimizer, name=source.label, cast=source.cast,
                  transforms=source.transforms, layout=source.layout, align=source.align, item=source.item)


def _layout_change(old: SourceHandle, new: SourceHandle, info: CheckpointInfo) -> Optional[str]:
    """Why ``new`` cannot use the plan made for ``old``: the names, shapes or dtypes of the
    variables the rules may use differ (optimizer state and bookkeeping count only with
    ``optimizer=True``, as in the plan); None when they are the same."""
    before = {n: (v.shape, v.dtype) for n, v in old.selectable().items()}
    after = {n: (v.shape, v.dtype) for n, v in new.selectable().items()}
    if before == after:
        return None
    added = sorted(set(after) - set(before))
    removed = sorted(set(before) - set(after))
    changed = sorted(n for n in set(before) & set(after) if before[n] != after[n])
    parts: List[str] = []
    for what, names in (("new", added), ("gone", removed)):
        if names:
            parts.append(f"{len(names)} {what} ({_names(names)})")
    if changed:
        shown = [f"{quote_name(n)} {before[n][1]} {before[n][0]} -> {after[n][1]} {after[n][0]}" for n in changed[:3]]
        parts.append(f"{len(changed)} with another shape or dtype ({', '.join(shown)}"
                     f"{', ...' if len(changed) > 3 else ''})")
    return f"step {info.step} changed the checkpoint's variables: {and_list(parts)}"


def _names(names: List[str]) -> str:
    shown = ", ".join(quote_name(n) for n in names[:3])
    return shown + (f" and {len(names) - 3} more" if len(names) > 3 else "")


def _followed_error(info: CheckpointInfo, e: CkptMergeError) -> CkptMergeError:
    """The error reported for a followed checkpoint that was not restored: one naming it, and
    saying so when its files were deleted while it was read."""
    if isinstance(e, PlanError):
        e.args = (f"Checkpoint {quote_name(info.path)} (step {info.step}) was not restored: {e}",)
        return e
    gone = not intact(info)
    if gone:
        how = (f" although it was pinned (its pinned copy {quote_name(info.pinned)} was removed too)"
               if info.pinned else "")
        message = (f"Checkpoint {quote_name(info.path)} (step {info.step}) was deleted while it was being "
                   f"read{how}, so it was skipped and no target variable was changed. A trainer's cleanup "
                   f"(max_to_keep) removed it; keep more checkpoints, or follow a local copy. Cause: {e}")
    else:
        message = (f"Checkpoint {quote_name(info.path)} (step {info.step}) could not be restored, so it was "
                   f"skipped and no target variable was changed: {e}")
    err = RestoreError(message, path=info.path)
    err.__cause__ = e
    return err


def _is_dir(path: Any) -> bool:
    import os

    return path is not None and os.path.isdir(path)
