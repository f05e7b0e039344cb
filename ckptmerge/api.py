"""The public functions: plan and restore, plus TF-free inspection helpers.

``plan`` is the one place where the three worlds meet: it names the target variables
(``targets``), opens the sources (``source``: resolution and TF-free readers), hands names and
specs to the pure engine (``plan.make_plan``) and attaches the live objects to the result so that
``Plan.restore`` can run a backend (``restore``). Everything else here is a thin convenience.
"""

from __future__ import annotations

import dataclasses
import itertools
from dataclasses import dataclass, field
from typing import (
    TYPE_CHECKING,
    Any,
    Dict,
    Iterable,
    List,
    Optional,
    Sequence,
    Tuple,
    Union,
)

import numpy as np

from .core.args import (
    check_bool,
    check_callable,
    check_names,
    check_options,
    check_specs,
)
from .core.gcpause import paused_gc
from .planning.fusion import concat_entries_of
from .planning.planner import Plan, make_plan
from .restoring.backends.tensors import cast_value
from .sources.opening import (
    SourcesArg,
    as_sources,
    check_unique_labels,
    open_sources,
)
from .sources.composed import ComposedHandle
from .sources.source import Source
from .sources.handles import SourceHandle
from .core.specs import KIND_VARIABLE, VariableInfo, by_name, model_variables

if TYPE_CHECKING:  # pragma: no cover
    from .planning.suggestion import Suggestion
    from .render.report import Report

__all__ = ["plan", "suggest", "restore", "warm_start", "list_variables", "open", "load", "Binding", "PLAN_OPTIONS"]

#: The options of :func:`plan` that :func:`restore` and :class:`~ckptmerge.Restorer` pass on.
PLAN_OPTIONS = ("allow_missing", "on_conflict", "on_shape_mismatch", "skip_mismatch", "cast", "verify")


@dataclass
class Binding:
    """The live objects behind a plan: target variables, opened sources, cached graph ops."""

    targets: Any
    handles: List[SourceHandle]
    graph_ops: Any = None
    savers: Any = None
    session: Any = None
    #: label -> the transforms of the plan's view of that source, where alignment added some
    #: (the reshapes it inferred) to the source's own.
    view_transforms: Optional[Dict[str, Tuple[Any, ...]]] = None
    _indexes: Optional[Dict[str, Any]] = field(default=None, repr=False)

    def _transforms(self, assignment: Any) -> List[Any]:
        from .planning.chains import TransformIndex, select

        if self.view_transforms and assignment.source in self.view_transforms:
            if self._indexes is None:
                self._indexes = {label: TransformIndex(ts) for label, ts in self.view_transforms.items()}
            return self._indexes[assignment.source].select(assignment.target)
        for h in self.handles:
            if h.label == assignment.source:
                return select(h.source.transforms, assignment.target)
        return []

    def has_transform(self, assignment: Any) -> bool:
        """True when value transforms (vocab remap, slicing) apply to this assignment."""
        return bool(self._transforms(assignment))

    def transform(self, assignment: Any, value: Any, current: Optional[np.ndarray] = None) -> Any:
        """Cast if the plan says so, then apply the assignment's transforms, in order.

        ``current`` is the target's current value when the caller has it (else it is read when a
        transform needs it)."""
        if assignment.cast:
            value = cast_value(value, assignment.target_spec.dtype)
        transforms = self._transforms(assignment)
        if not transforms:
            return value
        from .planning.chains import chain_apply

        needs = any(getattr(t, "needs_current", True) for t in transforms)
        if needs and current is None:
            current = self.current_value(assignment.target)
        if self.targets.mode == "graph" and any(callable(getattr(t, "init", None)) for t in transforms):
            # A TF backup initializer builds graph tensors here: evaluate them in our session.
            with self.targets.graph.as_default(), self.session.as_default():
                return chain_apply(transforms, np.asarray(value), current,
                                   target_shape=assignment.target_spec.shape)
        return chain_apply(transforms, np.asarray(value), current, target_shape=assignment.target_spec.shape)

    def current_value(self, name: str) -> np.ndarray:
        """The target variable's current value as numpy (whole, parts reassembled)."""
        target = self.targets.variables[name]
        if self.targets.mode == "graph":
            vals = self.session.run([v for v, _ in target.parts]) if self.session is not None else None
        elif self.targets.mode == "keras":
            from .restoring.backends.keras_native import keras_numpy

            vals = [keras_numpy(v) for v, _ in target.parts]
        else:
            vals = [v.numpy() for v, _ in target.parts]
        from .restoring.backends.tensors import join_parts

        return join_parts(target, vals)

    def close(self) -> None:
        """Close every source's files."""
        for h in self.handles:
            h.close()


def _is_spec_list(target: Any) -> bool:
    return (isinstance(target, (list, tuple)) and bool(target)
            and all(map(isinstance, target, itertools.repeat(VariableInfo))))


def _is_keras_model(target: Any) -> bool:
    from .restoring.targets import is_keras_object

    return target is not None and not isinstance(target, (list, tuple, dict)) and is_keras_object(target)


def _keras_names(target: Any, targets: Any, handles: List[SourceHandle]) -> Optional[str]:
    """For a Keras model target: name weights-file entries by its walk; return its root scope.

    ``None`` for other targets (names are matched as they are).
    """
    if not _is_keras_model(target):
        return None
    from .restoring.kerasfiles import model_root, name_weights_files

    name_weights_files(target, targets, handles)
    weights = [n for n in map(targets.name_of, target.weights) if n is not None]
    return model_root(target, weights)


def _collect(target: Any, optimizer: bool = False) -> Any:
    """Name the target's variables (a Keras model's optimizer too, with ``optimizer``); a list of
    VariableInfo is a spec-only target (no TF)."""
    if _is_spec_list(target):
        from .restoring.targets import TargetSet

        check_specs(target, "target")
        return TargetSet(variables=by_name(target), mode="specs")
    from .restoring.targets import collect_targets

    return collect_targets(target, optimizer=optimizer and _is_keras_model(target))


def plan(
    target: Any = None,
    sources: SourcesArg = (),
    *,
    allow_missing: Union[str, Sequence[str]] = (),
    on_conflict: str = "error",
    on_shape_mismatch: str = "error",
    cast: bool = False,
    verify: bool = True,
    skip_mismatch: bool = False,
) -> Plan:
    """Match sources to target variables and report every finding; change nothing.

    Args:
        target: ``None`` (the default graph's global variables, graph mode), a list or dict of
            variables, a ``tf.Module`` or a Keras model; or a list of :class:`VariableInfo`
            (e.g. ``list_variables(path)``) for a dry run without TensorFlow (such a plan can be
            reported and merged, not restored).
        sources: :class:`Source` objects (or plain checkpoint paths, or dicts of arrays held in
            memory), in priority order.
        allow_missing: glob(s) of target names that may stay as they are.
        on_conflict: ``"error"``, ``"first"`` or ``"last"`` when two sources provide a target.
        on_shape_mismatch: ``"error"`` or ``"skip"`` (leave mismatched targets as they are).
        skip_mismatch: ``True`` is ``on_shape_mismatch="skip"``, under Keras's name for it (a new
            head: every target whose shape fits is restored, the rest listed under Skipped).
        cast: cast values whose dtype differs from the target's (e.g. float16 -> float32).
        verify: check CRC32C checksums when reading.

    Returns:
        A :class:`Plan`; ``plan.report()`` renders it, ``plan.restore()`` carries it out.

    Example:
        >>> p = plan(model_c, [Source("runs/A", map={"a1": "c/x1"})], allow_missing=["c/z"])  # doctest: +SKIP
        >>> print(p.report())                                                               # doctest: +SKIP
        >>> p = plan(new_head_model, ["pretrained.weights.h5"], skip_mismatch=True)          # doctest: +SKIP
    """
    check_bool(skip_mismatch, "skip_mismatch")
    if skip_mismatch:
        on_shape_mismatch = "skip"
    srcs = as_sources(sources)
    check_unique_labels(srcs)
    allow = check_names(allow_missing, "allow_missing", noun="glob") or []
    check_bool(verify, "verify")
    with paused_gc():  # see ckptmerge.core.gcpause: 100,000s of small objects, no cycles
        return _plan(target, srcs, allow, on_conflict, on_shape_mismatch, cast, verify)


def _plan(target: Any, srcs: List[Source], allow: Sequence[str], on_conflict: str, on_shape_mismatch: str,
          cast: bool, verify: bool) -> Plan:
    targets = _collect(target, optimizer=any(s.optimizer for s in srcs))
    rules = [s.rules(targets.name_of) for s in srcs]
    handles = open_sources(srcs, verify=verify)
    added: Dict[str, Tuple[Any, ...]] = {}
    try:
        root = _keras_names(target, targets, handles)
        for h in handles:  # (a layout's findings name targets; a Concat's axis may follow its target)
            if callable(getattr(h, "name_targets", None)):
                h.name_targets(targets.infos)
        views = [h.view(r) for h, r in zip(handles, rules)]
        options = dict(allow_missing=allow, on_conflict=on_conflict, on_shape_mismatch=on_shape_mismatch,
                       cast=cast, model_root=root)
        result = make_plan(targets.infos, views, **options)
        # (Keras weights files walked by the model have aligned by layer already: see kerasfiles)
        which = [s.align == "structure" and h.drift is None for s, h in zip(srcs, handles)]
        if any(which) and result.missing:  # align only what names and rules left missing
            from .planning.suggestion import aligned_views
            from .restoring.targets import creation_order, input_layers

            views = aligned_views(result, views, which, target_order=creation_order(target, targets),
                                  source_orders=[h.order if on else None for h, on in zip(handles, which)],
                                  target_inputs=input_layers(target, targets))
            result = make_plan(targets.infos, views, **options)
            added = {v.label: v.transforms for v, h in zip(views, handles) if len(v.transforms) > len(h.source.transforms)}
            handles[:] = [_fused(h, v, targets.infos) for h, v in zip(handles, views)]
    except BaseException:
        for h in handles:
            h.close()
        raise
    return result.with_binding(Binding(targets=targets, handles=handles, view_transforms=added))


def _fused(handle: SourceHandle, view: Any, targets: Any) -> Any:
    """The handle that reads the joined tensors of ``view`` (Concats alignment inferred, beside the
    source's own): see :mod:`ckptmerge.planning.fusion`."""
    own = {c.name for c in handle.entries} if isinstance(handle, ComposedHandle) else set()
    new = [c for c in concat_entries_of(view) if c.name not in own]
    if not new:
        return handle
    inner, entries = (handle.inner, [*handle.entries, *new]) if isinstance(handle, ComposedHandle) else (handle, new)
    fused = ComposedHandle(inner, entries)
    fused.name_targets(targets)
    return fused


def suggest(target: Any = None, sources: SourcesArg = (), **plan_options: Any) -> "Suggestion":
    """Propose a map per source for the targets a plan leaves missing, by structure.

    Plans as :func:`plan` does (``plan_options`` are its options), then aligns, source by source,
    the missing targets with the checkpoint names nothing took: shapes and dtypes, scope trees,
    order (the target's creation order, numeric-aware name order) and name tokens, solved as one
    global assignment per shape (see :mod:`ckptmerge.alignment.align`). Nothing is restored.

    Returns:
        A :class:`~ckptmerge.planning.suggestion.Suggestion`: ``report()``, ``to_dict()``,
        ``to_config()`` and ``write(path)`` (a config ``ckptmerge plan`` uses as it is).

    Example:
        >>> s = cm.suggest(model, [cm.Source("runs/estimator")])    # doctest: +SKIP
        >>> print(s.report()); s.write("warm.yaml")                   # doctest: +SKIP
    """
    from .planning.suggestion import make_suggestion
    from .restoring.targets import creation_order, input_layers

    check_options(plan_options, PLAN_OPTIONS, "suggest()")
    p = plan(target, sources, **plan_options)
    try:
        with paused_gc():  # the alignment's small objects have no cycles either: see ckptmerge.core.gcpause
            found = make_suggestion(p, target_order=creation_order(target, p._binding.targets),
                                    source_orders=[h.order for h in p._binding.handles],
                                    target_inputs=input_layers(target, p._binding.targets))
        layouts = {h.label: h.source.layout for h in p._binding.handles if getattr(h.source, "layout", None)}
        return dataclasses.replace(found, layouts=layouts) if layouts else found
    finally:
        p._binding.close()


def restore(
    target: Any = None,
    sources: SourcesArg = (),
    *,
    session: Any = None,
    strict: bool = True,
    progress: Any = None,
    **plan_options: Any,
) -> "Report":
    """Plan and restore in one call; returns the :class:`ckptmerge.render.report.Report`.

    ``plan_options`` are those of :func:`plan`. With ``strict=True`` any finding other than
    ``unused`` raises :class:`ckptmerge.PlanError` before a single variable is changed.

    Example:
        >>> cm.restore(None, [cm.Source("runs/A", map={"a1": "c/x1"})], session=sess,
        ...            allow_missing=["c/z"])                                   # doctest: +SKIP
    """
    check_options(plan_options, PLAN_OPTIONS, "restore()")
    check_bool(strict, "strict")
    check_callable(progress, "progress")
    p = plan(target, sources, **plan_options)
    try:
        return p.restore(session=session, strict=strict, progress=progress)
    finally:
        p._binding.close()


def warm_start(target: Any, config: Any, *, session: Any = None, strict: Optional[bool] = None,
               progress: Any = None) -> "Report":
    """Restore ``target`` as a config file (YAML, TOML, JSON) or dict describes.

    The config is validated before any checkpoint is opened (every problem at once, as a
    :class:`ckptmerge.ConfigError`).

    Args:
        target: as for :func:`plan`.
        config: a config file path (``.yaml``, ``.yml``, ``.toml``, ``.json``) or a dict.
        session: graph mode: the session to restore in.
        strict: reject findings other than ``unused``; ``None`` (the default) takes the config's
            ``strict`` key, which is ``true`` unless the file says otherwise.
        progress: optional ``progress(done_bytes, total_bytes)`` callback.

    Returns:
        The :class:`ckptmerge.render.report.Report` of the restore.

    Raises:
        ConfigError: the config is invalid (every problem listed).
        PlanError: ``strict`` and the plan has findings; nothing was changed.

    Example:
        >>> warm_start(model, "warm.yaml")                      # doctest: +SKIP
    """
    from .config.load import load_config

    check_bool(strict, "strict", optional=True)
    check_callable(progress, "progress")
    cfg = load_config(config)
    sources = cfg.make_sources()
    return restore(target, sources, session=session, strict=cfg.strict if strict is None else strict,
                   progress=progress, **cfg.plan_options)


def _resolve_reader(path: Any, step: Optional[int], verify: bool) -> Any:
    from .sources.resolve import open_resolved

    return open_resolved(path, step=step, verify=verify)[1]


def list_variables(path: Any, *, step: Optional[int] = None, optimizer: bool = True) -> List[VariableInfo]:
    """List a checkpoint's variables (name, shape, dtype, key, kind), sorted by name. No TF needed.

    Args:
        path: anything :class:`Source` accepts (prefix, directory, SavedModel, ``.weights.h5``).
        step: take this step's checkpoint from a directory.
        optimizer: include optimizer state and bookkeeping (as TF's ``list_variables`` does).

    Example:
        >>> [v.name for v in list_variables("runs/A")]          # doctest: +SKIP
        ['a1', 'a2', 'a3']
    """
    check_bool(optimizer, "optimizer")
    with _resolve_reader(path, step, True) as reader:
        infos = reader.variables()  # (sorted by name)
    return infos if optimizer else model_variables(infos)


def open(path: Any, *, step: Optional[int] = None, verify: bool = True) -> Any:  # noqa: A001
    """Open a checkpoint for reading without TensorFlow; use it as a context manager.

    The reader keeps its files open across calls: ``names()``, ``spec(name)``, ``get(name)``.

    Example:
        >>> with open("runs/A") as r:                          # doctest: +SKIP
        ...     kernel = r.get("dense/kernel")
    """
    check_bool(verify, "verify")
    return _resolve_reader(path, step, verify)


def load(path: Any, names: Union[str, Iterable[str], None] = None, *, step: Optional[int] = None,
         verify: bool = True) -> Dict[str, np.ndarray]:
    """Read tensors into a dict of numpy arrays (all model variables when ``names`` is None).

    Args:
        path: anything :class:`Source` accepts (prefix, directory, SavedModel, ``.weights.h5``).
        names: the names (or raw keys) to read: a list, or one name as a str (still a dict of
            one entry); ``None``: every model variable.
        step: take this step's checkpoint from a directory.
        verify: check CRC32C checksums.

    Raises:
        ArgumentTypeError: ``names`` is neither a str nor a list of str (e.g. ``[1]``).
        UnknownTensorError: a name is not in the checkpoint.

    Example:
        >>> load("runs/A", ["a1"])["a1"].shape                  # doctest: +SKIP
        (3, 4)
        >>> load("runs/A", "a1")["a1"].shape                    # doctest: +SKIP
        (3, 4)
    """
    wanted = check_names(names)
    check_bool(verify, "verify")
    with _resolve_reader(path, step, verify) as reader:
        if wanted is None:
            wanted = [v.name for v in reader.variables() if v.kind == KIND_VARIABLE]
        return reader.read_many(wanted)
