"""Sources: where values come from (a checkpoint, or values held in memory) plus their rules.

A :class:`Source` is a description: a path (or in-memory values) and the rename/selection rules
that say which checkpoint variable feeds which target. It is validated when it is made (a bad
regex fails at once), and opened when a plan is made: :meth:`Source.open` resolves the path
(latest checkpoint, a step, a SavedModel, ...), opens a TensorFlow-free reader and lists the
variables, keeping optimizer state and bookkeeping out unless ``optimizer=True``; the opened
handles are :mod:`ckptmerge.sources.handles` (and :mod:`ckptmerge.sources.layout` for a framework
layout).
"""

from __future__ import annotations

import os
from typing import (
    Any,
    Dict,
    List,
    Mapping,
    Optional,
    Sequence,
    Tuple,
    Union,
)

import numpy as np

from ..core.args import check_bool, check_path, check_step, check_str
from ..core.errors import ArgumentTypeError, CkptMergeError, RuleError, did_you_mean
from ..planning.rules import Rules, map_pairs
from ..core.redact import get_logger, redact_cached
from ..core.specs import normalize_name
from ..core.text import quote_name
from .handles import CheckpointHandle, MemoryHandle, SourceHandle
from .layout import LayoutHandle

__all__ = ["Source"]

log = get_logger(__name__)

PathLike = Union[str, "os.PathLike[str]"]


def _map_display(value: Any) -> str:
    if isinstance(value, str):
        return value
    name = getattr(value, "path", None) or getattr(value, "name", None)
    return f"<variable {name}>"


def _map_values(value: Any) -> List[Any]:
    """The targets one map value names: a name or variable; a list of them (several targets, or
    the partitions of one variable); a ``PartitionedVariable`` (its partitions)."""
    if isinstance(value, str):
        return [value]
    if hasattr(value, "_get_variable_list"):  # a TF1 PartitionedVariable
        return list(value._get_variable_list())
    if isinstance(value, (list, tuple)):
        return [v for item in value for v in _map_values(item)]
    return [value]


def _joining_entries(pairs: List[Tuple[Any, Any]]) -> Tuple[List[Tuple[Any, Any]], List[Any]]:
    """Map entries whose key is a tuple of checkpoint names, ``("q", "k", "v"): "qkv/kernel"``, as
    :class:`~ckptmerge.alignment.tensorops.Concat` transforms (along the axis that gives the target's
    shape), each kept in the map under its joined name (so the map still selects it)."""
    from ..alignment.tensorops import Concat

    kept, joined = [], []
    for key, value in pairs:
        if not isinstance(key, (tuple, list)):
            kept.append((key, value))
            continue
        if not isinstance(value, str):
            raise RuleError(f"map entry {tuple(key)!r:.120} joins several checkpoint tensors, so its value must be the "
                            f"one target's name (a str). Received: {value!r:.80}")
        c = Concat(value, tuple(key))
        joined.append(c)
        kept.append((c.name, value))
    return kept, joined


def _check_whole_partitions(key: str, label: str, values: List[Any]) -> None:
    """Partitions given as map values must cover their variable: ckptmerge restores a partitioned
    variable whole (TF would restore only the partitions listed)."""
    covered: Dict[str, List[int]] = {}
    for v in values:
        info = getattr(v, "_save_slice_info", None)
        if info is None or isinstance(v, str):
            continue
        full = covered.setdefault(normalize_name(info.full_name), [0, int(np.prod(info.full_shape))])
        full[0] += int(np.prod(info.var_shape))
    for name, (got, total) in sorted(covered.items()):
        if got != total:
            raise RuleError(
                f"map value for {quote_name(key)} in source {quote_name(label)} lists partitions of "
                f"{quote_name(name)} that hold {got:,} of its {total:,} values; ckptmerge restores a "
                "partitioned variable whole. Pass all of its partitions (v._get_variable_list()), the "
                "PartitionedVariable itself or its name.")


class Source:
    """One source of values for a plan: a checkpoint (or in-memory values) plus rules.

    Args:
        path: a checkpoint prefix; a directory with a ``checkpoint`` state file (its latest
            checkpoint); a directory plus ``step``; a SavedModel directory; a path ending in
            ``.index`` or ``.data-*``; a Keras ``.weights.h5``/``.h5`` file or ``.keras`` archive
            (restoring into a Keras model, its entries are named by the model's own walk).
        step: take the checkpoint of this global step from the directory (error if absent).
        map: ``{checkpoint_name: target_name_or_variable}``; keys and values ending in ``/``
            map a scope to a scope (``{"a/": "c/encoder/"}``; ``{"/": "c/"}`` for the root).
            As with ``init_from_checkpoint``'s ``assignment_map``, every entry that covers a
            name applies; a value may be a list of targets, a ``PartitionedVariable`` or a list
            of its partitions, and the map may be a list of ``(name, target)`` pairs.
        regex: list of ``(pattern, replacement)`` over checkpoint names (a full match in RE2
            syntax; ``\\1``-style references in the replacement); a ``None`` replacement drops
            the name.
        include: glob pattern(s) a checkpoint name must match to be used.
        exclude: glob pattern(s) that drop checkpoint names.
        optimizer: also use optimizer state and bookkeeping (``global_step``, slots, ...).
        name: the label used in reports (default: the path as given).
        cast: per-source override of the plan's ``cast`` option.
        transforms: value transforms (``ckptmerge.planning.transforms``) applied to this source's values.
        layout: ``"torch"`` reads a PyTorch ``state_dict`` as Keras/TF holds it: ``/`` scopes,
            ``kernel``/``gamma``/``beta``/``embeddings`` names, Linear and conv kernels
            transposed, RNN gates reordered; ``"flax"`` reads a Flax (Linen or NNX) tree as Keras
            names it: collections and NNX's ``/value`` dropped, ``scale``/``bias`` of norms as
            ``gamma``/``beta``, ``embedding`` as ``embeddings`` (see :mod:`ckptmerge.alignment.layouts`;
            the report notes each).
        item: for an Orbax step of several items (``state``, ``params``, ``opt_state``...), read
            this item alone, named as in its item folder (``Source("run", step=2, item="state")``
            is ``Source("run/2/state")``); an error lists the step's items when it has no such one.
        align: ``"structure"``: targets no name or rule reaches take the checkpoint variables
            structural alignment pairs them with, where that is unambiguous (see
            :func:`ckptmerge.suggest`); each is marked "matched by structure" in the report.
            Explicit ``map``/``regex`` entries always win.

    Example:
        >>> src = Source("runs/A", map={"a1": "c/x1"})
        >>> src.label
        'runs/A'
    """

    def __init__(
        self,
        path: Optional[PathLike],
        *,
        step: Optional[int] = None,
        map: Optional[Any] = None,  # noqa: A002 - public name from the issue
        regex: Optional[Sequence[Tuple[str, Optional[str]]]] = None,
        include: Union[str, Sequence[str], None] = None,
        exclude: Union[str, Sequence[str], None] = None,
        optimizer: bool = False,
        name: Optional[str] = None,
        cast: Optional[bool] = None,
        transforms: Sequence[Any] = (),
        layout: Optional[str] = None,
        align: Optional[str] = None,
        item: Optional[str] = None,
        _values: Optional[Mapping[str, Any]] = None,
    ) -> None:
        if path is None and _values is None:
            raise ArgumentTypeError("Source needs a checkpoint path (a prefix or a directory). Received: path=None")
        if path is not None:
            check_path(path)
        check_step(step)
        check_bool(optimizer, "optimizer")
        check_bool(cast, "cast", optional=True)
        check_str(name, "name", optional=True)
        check_str(item, "item", optional=True)
        pairs = map_pairs(map) if map is not None else None
        if map is not None and pairs is None:
            raise RuleError(
                "map must be a dict {checkpoint_name: target_name_or_variable}, e.g. {'a1': 'c/x1'}, "
                "or a list of (checkpoint_name, target) pairs as TF's assignment_map may be. "
                f"Received: map={map!r:.80}"
            )
        if pairs is not None and any(isinstance(k, (tuple, list)) for k, _ in pairs):
            pairs, joined = _joining_entries(pairs)
            transforms = (*transforms, *joined)
        self.path = os.fspath(path) if path is not None else None
        self.step = step
        # A list of pairs may repeat a checkpoint name (one name, several targets): keep the pairs.
        self.map = (dict(pairs) if isinstance(map, Mapping) else pairs) if pairs is not None else None
        self.regex = [tuple(r) for r in regex] if isinstance(regex, (list, tuple)) else regex
        self.include = include
        self.exclude = exclude
        self.optimizer = bool(optimizer)
        self.name = name
        self.cast = cast
        self.transforms = tuple(transforms)
        if layout is not None:  # (the modules are loaded only for a source that names one)
            from ..alignment.layouts import LAYOUTS

            if layout not in LAYOUTS:  # (``map`` is the argument here, not the builtin)
                known = ", ".join(repr(name) for name in LAYOUTS)
                hint = did_you_mean(layout, LAYOUTS) if isinstance(layout, str) else ""
                raise RuleError(f"Unknown layout: layout must be one of {known} or None. Received: "
                                f"layout={layout!r:.80}.{hint}")
        self.layout = layout
        if align is not None:
            from ..alignment.align import ALIGN_MODES

            if align not in ALIGN_MODES:
                raise RuleError(f"align must be one of {', '.join(repr(m) for m in ALIGN_MODES)} or None. "
                                f"Received: align={align!r}.{did_you_mean(str(align), ALIGN_MODES, cutoff=0.5)}")
        self.align = align
        self.item = item
        self._values = dict(_values) if _values is not None else None
        #: For a source made from a live model (:meth:`from_values`): its variables' names in
        #: creation order, evidence for structural alignment; else ``None``.
        self.order: Optional[Tuple[str, ...]] = None
        #: For a source made from a live functional Keras model: per variable, the variables of
        #: the layer that feeds its layer (see :func:`ckptmerge.restoring.targets.input_layers`);
        #: evidence for structural alignment; else ``None``.
        self.inputs: Optional[Dict[str, Tuple[str, ...]]] = None
        # Validate every rule now, so a bad regex fails where the source is written.
        self._check_map_keys()
        self.rules(None)

    def map_items(self) -> List[Tuple[Any, Any]]:
        if self.map is None:
            return []
        return list(self.map.items()) if isinstance(self.map, dict) else list(self.map)

    def _check_map_keys(self) -> None:
        for k, _ in self.map_items():
            if not isinstance(k, str):
                raise RuleError(f"map keys must be checkpoint names (str). Received key {k!r} in map={self.map!r:.120}")

    @classmethod
    def from_values(cls, values: Any, **rules: Any) -> "Source":
        """A source whose values are in memory: a dict, or a live model / variable list.

        ``values`` is a dict ``{name: numpy array, tensor or variable}``, or anything
        :func:`ckptmerge.plan` takes as a target (a Keras model, a ``tf.Module``, a list of
        variables), named as a target would be. Variables are read at each restore (a *live*
        source: e.g. an acting network refreshed from a learner's current weights); arrays are
        copied into tensors at restore time, so they stay yours. Use :func:`ckptmerge.snapshot`
        to freeze values instead. ``rules`` are the keyword arguments of :class:`Source` (``map``,
        ``regex``, ``include``, ``exclude``, ``name``, ``cast``, ``transforms``).

        Example:
            >>> src = Source.from_values({"w": np.zeros(3)}, map={"w": "model/w"}, name="init")
            >>> src.in_memory
            True
        """
        order = inputs = None
        if not isinstance(values, Mapping):
            from ..restoring.targets import collect_targets, creation_order, input_layers

            targets = collect_targets(values)
            split = sorted(n for n, t in targets.variables.items() if t.partitioned)
            if split:
                raise CkptMergeError(
                    f"Partitioned variables cannot be a live source ({', '.join(split[:5])}); "
                    "take a ckptmerge.snapshot() of them instead.")
            order, inputs = creation_order(values, targets), input_layers(values, targets)
            values = {n: t.parts[0][0] for n, t in targets.variables.items()}
        rules.setdefault("name", "memory")
        source = cls(None, _values=values, **rules)
        source.order = tuple(order) if order else None
        source.inputs = dict(inputs) if inputs else None
        return source

    # -- description -------------------------------------------------------------------------
    @property
    def label(self) -> str:
        """The name used in reports: ``name`` if given, else the path as given (a URL's
        credentials redacted: the label is shown and written everywhere)."""
        if self.name:
            return self.name
        # (cached: plans and reports ask for a label once per assignment)
        return redact_cached(self.path) if self.path is not None else "memory"

    @property
    def in_memory(self) -> bool:
        """True for sources made from values in memory (:func:`ckptmerge.snapshot`)."""
        return self._values is not None

    def rules(self, name_of: Any) -> Rules:
        """The compiled rules; ``name_of(variable)`` names map values given as variables.

        A map value may be a target name, a variable, a ``PartitionedVariable`` or a list of
        these (its partitions, as ``init_from_checkpoint`` takes them, or several targets).
        """
        mapping = None
        if self.map is not None:
            mapping = []
            for k, value in self.map_items():
                names: List[str] = []
                for v in _map_values(value):
                    if isinstance(v, str):
                        name = v
                    elif name_of is None:
                        name = _map_display(v)
                    else:
                        name = name_of(v)
                        if name is None:
                            raise RuleError(
                                f"map value for {quote_name(k)} in source {quote_name(self.label)} is a variable "
                                f"({_map_display(v)}) that is not part of the target. Add it to the "
                                "target, or map to a target name instead."
                            )
                    if name not in names:  # the partitions of one variable name it once
                        names.append(name)
                _check_whole_partitions(k, self.label, _map_values(value))
                mapping.append((k, names))
        return Rules.from_options(map=mapping, regex=self.regex, include=self.include, exclude=self.exclude)

    def __repr__(self) -> str:
        parts = [repr(redact_cached(self.path)) if self.path is not None else "<memory>"]
        for attr in ("step", "item", "map", "regex", "include", "exclude", "name", "layout", "align"):
            val = getattr(self, attr)
            if val is not None:
                parts.append(f"{attr}={val!r}")
        if self.optimizer:
            parts.append("optimizer=True")
        return f"Source({', '.join(parts)})"

    def read_sources(self) -> List["Source"]:
        """The sources whose checkpoints this one reads: itself (a combination: its inputs).

        Example:
            >>> [s.label for s in Source("runs/A").read_sources()]
            ['runs/A']
        """
        return [self]

    # -- opening -----------------------------------------------------------------------------
    def resolve(self) -> Any:
        """Which checkpoint this source means now (a :class:`ckptmerge.sources.resolve.ResolvedCheckpoint`);
        ``None`` for values in memory. Reads no checkpoint data."""
        if self._values is not None:
            return None
        from .resolve import resolve_checkpoint

        resolved = resolve_checkpoint(self.path, step=self.step)
        if self.item is not None:
            from .orbax import orbax_item

            resolved = orbax_item(resolved, self.item, self.label)
        return resolved

    def open(self, *, verify: bool = True, resolved: Any = None) -> "SourceHandle":
        """Resolve the path (unless ``resolved`` is given) and open a reader (no TensorFlow needed).

        Raises:
            CheckpointNotFoundError: the path, the latest checkpoint or the step does not exist.
            CheckpointFormatError: the files are corrupt or in an unsupported format.
        """
        handle: SourceHandle
        if self._values is not None:
            handle = MemoryHandle(self, self._values)
        else:
            from .resolve import open_resolved

            if resolved is None and self.item is not None:
                resolved = self.resolve()
            resolved, reader = open_resolved(self.path, step=self.step, verify=verify, resolved=resolved)
            handle = CheckpointHandle(self, resolved.prefix, resolved.note, reader)
        if self.layout is not None:
            handle = LayoutHandle(handle)
        if any(getattr(t, "kind", None) == "concat" for t in self.transforms):  # (several tensors joined)
            from .composed import ComposedHandle, concat_entries

            handle = ComposedHandle(handle, concat_entries(self.transforms))
        return handle
