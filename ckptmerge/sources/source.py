"""Sources: where values come from (a checkpoint, or values held in memory) plus their rules.

A :class:`Source` is a description: a path (or in-memory values) and the rename/selection rules
that say which checkpoint variable feeds which target. It is validated when it is made (a bad
regex fails at once), and opened when a plan is made: :meth:`Source.open` resolves the path
(latest checkpoint, a step, a SavedModel, ...), opens a TensorFlow-free reader and lists the
variables, keeping optimizer state and bookkeeping out unless ``optimizer=True``.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import operator
import os
import sys
import types
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import (
    TYPE_CHECKING,
    Any,
    Dict,
    Iterator,
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
from ..planning.rules import MapRule, Rules, map_pairs
from ..core.redact import get_logger, redact_cached
from ..core.specs import VariableInfo, by_name, model_variables, normalize_name
from ..core.text import quote_name

if TYPE_CHECKING:  # pragma: no cover
    from ..planning.planner import SourceView

__all__ = ["Source", "SourceHandle"]

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

    def _map_items(self) -> List[Tuple[Any, Any]]:
        if self.map is None:
            return []
        return list(self.map.items()) if isinstance(self.map, dict) else list(self.map)

    def _check_map_keys(self) -> None:
        for k, _ in self._map_items():
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
            for k, value in self._map_items():
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
        for attr in ("step", "map", "regex", "include", "exclude", "name", "layout", "align"):
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

        return resolve_checkpoint(self.path, step=self.step)

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

            resolved, reader = open_resolved(self.path, step=self.step, verify=verify, resolved=resolved)
            handle = CheckpointHandle(self, resolved.prefix, resolved.note, reader)
        if self.layout is not None:
            handle = LayoutHandle(handle)
        if any(getattr(t, "kind", None) == "concat" for t in self.transforms):  # (several tensors joined)
            from .composed import ComposedHandle, concat_entries

            handle = ComposedHandle(handle, concat_entries(self.transforms))
        return handle


@dataclass
class SourceHandle:
    """An opened source: what it resolved to and the variables it offers.

    Attributes:
        source: the :class:`Source` it came from.
        path: the resolved checkpoint prefix (or ``"<memory>"``).
        note: how the path was resolved, for reports.
        all_variables: every tensor, optimizer state and bookkeeping included.
        findings: structure findings (see :class:`~ckptmerge.planning.model.SourceView`), with
            ``finding_targets`` and ``finding_names`` saying what settles each.
        superseded: names left out because the format's own load overwrites them with others.
        keras: what Keras's ``load_weights`` would do with this source (a Keras weights file
            restored into a Keras model), else ``None``.
        drift: for such a source with ``align="structure"``, which file layer fed which model
            layer (a :class:`~ckptmerge.alignment.keraspaths.PathAlignment`), else ``None``.
    """

    source: Source
    path: str
    note: str
    all_variables: List[VariableInfo] = field(default_factory=list)
    notes: Dict[str, str] = field(default_factory=dict)
    findings: List[str] = field(default_factory=list)
    finding_targets: Dict[str, Tuple[str, ...]] = field(default_factory=dict)
    finding_names: Dict[str, Tuple[str, ...]] = field(default_factory=dict)
    superseded: Tuple[str, ...] = ()
    keras: Any = None
    drift: Any = None

    @property
    def label(self) -> str:
        """The source's report label."""
        return self.source.label

    @property
    def renamed(self) -> Dict[str, str]:
        """``{raw key: name}`` of the tensors :meth:`CheckpointHandle.rename` renamed."""
        return {}

    @property
    def format(self) -> Optional[str]:
        """The checkpoint format the names come from (``"keras-h5"``, ``"tf-bundle"``, ...), or ``None``."""
        return getattr(getattr(self, "reader", None), "format", None)

    @property
    def order(self) -> Optional[Tuple[str, ...]]:
        """Names in the order the checkpoint saved them, where it records one (see
        :meth:`CheckpointHandle.order`); evidence for structural alignment."""
        return None

    def supersede(self, names: Sequence[str]) -> None:
        """Leave out tensors that the format's own load overwrites with another (by name)."""
        self.superseded = tuple(sorted(set(self.superseded) | set(names)))

    def selectable(self) -> Dict[str, VariableInfo]:
        """Variables the rules may use: all of them with ``optimizer=True``, else model variables;
        never the :attr:`superseded` ones (entries a later one overwrites in the format's own load)."""
        chosen = by_name(self.all_variables if self.source.optimizer else model_variables(self.all_variables))
        for name in self.superseded:
            chosen.pop(name, None)
        return chosen

    def view(self, rules: Rules) -> "SourceView":
        """What the planner needs of this source: label, path, note, variables, rules, ...

        ``rules`` are this source's compiled rules (map values that were variables already
        named, see :meth:`Source.rules`). The saving :attr:`order` is left out: alignment, the
        only one to use it, asks for it when it runs.
        """
        from ..planning.planner import SourceView

        selectable = self.selectable()
        names = [v.name for v in self.all_variables] if len(selectable) != len(self.all_variables) else []
        hidden = tuple(itertools.compress(names, map(operator.not_, map(selectable.__contains__, names))))
        # (a read-only view of a dict nothing else holds: SourceView keeps it without a copy)
        return SourceView(label=self.label, path=self.path, note=self.note,
                          variables=types.MappingProxyType(selectable),
                          rules=rules, transforms=tuple(self.source.transforms), cast=self.source.cast,
                          hidden=hidden, notes=self.notes, findings=tuple(self.findings),
                          finding_targets=self.finding_targets, finding_names=self.finding_names,
                          keras=self.keras, drift=self.drift)

    def read(self, names: Sequence[str]) -> Dict[str, Any]:
        """Read the named tensors (numpy arrays, 64-byte aligned where possible)."""
        raise NotImplementedError

    #: Whether :meth:`iter_chunks` streams (a merge then writes the tensor piece by piece).
    streams = False

    def iter_chunks(self, name: str, max_elements: int) -> Iterator[np.ndarray]:
        """The values of ``name`` in C order, as flat pieces of at most ``max_elements``.

        This one reads the whole value, then hands it out in pieces; checkpoints stream from
        their files (see :meth:`ckptmerge.formats.base.CheckpointReader.iter_chunks`).
        """
        flat = np.asarray(self.read([name])[name]).reshape(-1)
        return map(flat.__getitem__, (slice(s, s + max_elements) for s in range(0, flat.size, max_elements)))

    def ranges(self, name: str) -> Any:
        """``name`` as :class:`~ckptmerge.formats.ranges.TensorRanges` (ranges of elements read
        straight into the caller's buffers), or ``None``: then use :meth:`iter_chunks`. Only
        local checkpoints whose format stores the tensor in one piece give them."""
        return None

    def read_order(self, names: Sequence[str]) -> None:
        """A hint: the names a merge will ask :meth:`iter_chunks` for, in this order. A source
        that makes its values (a combination) starts on the next one while the merge writes the
        one before; this one ignores it (asking in another order is never wrong, only slower)."""

    def close(self) -> None:
        """Release files."""


class CheckpointHandle(SourceHandle):
    """A source backed by a checkpoint on disk, read with ckptmerge's TF-free reader."""

    def __init__(self, source: Source, path: str, note: str, reader: Any) -> None:
        super().__init__(source, path, note, list(reader.variables()))
        self.reader = reader
        self._key_of: Dict[str, str] = {}
        self._supplied: Dict[str, np.ndarray] = {}

    @property
    def renamed(self) -> Dict[str, str]:
        """``{raw key: name}`` of the tensors :meth:`rename` renamed."""
        return {k: n for n, k in self._key_of.items()}

    @property
    def order(self) -> Optional[Tuple[str, ...]]:
        """A TF2 object-based checkpoint's names in saving order: its object graph walked from
        the root, children in the order they were tracked (layers in the order they were built).
        ``None`` for checkpoints without an object graph."""
        graph = getattr(self.reader, "object_graph", None)
        if graph is None:
            return None
        name_of = {v.raw_key: v.name for v in self.all_variables}
        return tuple(name_of[k] for k in graph.saving_order() if k in name_of)

    def rename(self, names: Mapping[str, str], notes: Mapping[str, str] = {}) -> None:
        """Give tensors new names (``{raw key: name}``, e.g. by a Keras model's own walk).

        Reads go by raw key, so the reader is unaffected; ``notes`` (by new name) are shown
        beside the assignments.
        """
        renamed = []
        for v in self.all_variables:
            new = names.get(v.raw_key)
            if new is not None and new != v.name:
                self._key_of[new] = v.raw_key
                v = VariableInfo(new, v.shape, v.dtype, v.raw_key, v.kind, v.nbytes)
            renamed.append(v)
        self.all_variables = sorted(renamed, key=lambda v: v.name)
        self.notes.update(notes)

    def supply(self, values: Mapping[str, np.ndarray], notes: Mapping[str, str] = {}) -> None:
        """Offer values the file does not hold but its format's own load writes (``{name: array}``,
        e.g. the zeros Keras's ``load_weights`` gives a LoRA layer's factors); ``notes`` (by
        name) say why, beside the assignments. Each is read from memory, never from the file.

        Example:
            >>> handle.supply({"dense/lora_kernel_a": np.zeros((4, 2), np.float32)})  # doctest: +SKIP
        """
        taken = {v.name for v in self.all_variables}
        for name, value in values.items():
            if name in taken:
                raise CkptMergeError(f"cannot supply {quote_name(name)}: source {quote_name(self.label)} "
                                     "holds a tensor of that name already")
            self._supplied[name] = value
            self.all_variables.append(VariableInfo(name, tuple(value.shape), str(value.dtype), name,
                                                   nbytes=int(value.nbytes)))
        self.all_variables.sort(key=lambda v: v.name)
        self.notes.update(notes)

    def read(self, names: Sequence[str]) -> Dict[str, Any]:
        """Read the named tensors with CRC checks; see ``CheckpointReader.read_many``."""
        names = list(names)
        supplied = {n: self._supplied[n].copy() for n in names if n in self._supplied}
        if supplied:
            names = [n for n in names if n not in supplied]
        if not self._key_of:
            return {**self.reader.read_many(names), **supplied}
        arrays = self.reader.read_many([self._key_of.get(n, n) for n in names])
        return {**{n: arrays[self._key_of.get(n, n)] for n in names}, **supplied}

    def iter_chunks(self, name: str, max_elements: int) -> Iterator[np.ndarray]:
        """The values of ``name`` as flat pieces, read from the file as they are asked for."""
        return self.reader.iter_chunks(self._key_of.get(name, name), max_elements)

    def ranges(self, name: str) -> Any:
        """The reader's :meth:`~ckptmerge.formats.base.CheckpointReader.ranges` of ``name``."""
        ranges = getattr(self.reader, "ranges", None)
        if ranges is None or name in self._supplied:  # (a supplied tensor is in memory, not in the file)
            return None
        return ranges(self._key_of.get(name, name))

    def close(self) -> None:
        """Close the reader's files."""
        self.reader.close()


def _is_keras_variable(v: Any) -> bool:
    keras = sys.modules.get("keras")
    return keras is not None and isinstance(v, getattr(keras, "Variable", ()))


def _value_info(name: str, value: Any) -> VariableInfo:
    shape = tuple(int(d) for d in getattr(value, "shape", np.shape(value)))
    dtype = getattr(value, "dtype", None)
    dname = getattr(dtype, "name", None) or np.asarray(value).dtype.name
    if dname in ("object", "bytes_") or dname.startswith("bytes") or dname.startswith("str"):
        dname = "string"
    nbytes = int(getattr(value, "nbytes", 0) or 0)
    return VariableInfo(name=name, shape=shape, dtype=dname, key=name, nbytes=nbytes)


class MemoryHandle(SourceHandle):
    """A source whose values live in memory (numpy arrays or TF tensors)."""

    def __init__(self, source: Source, values: Mapping[str, Any]) -> None:
        infos = sorted((_value_info(normalize_name(k), v) for k, v in values.items()), key=lambda i: i.name)
        super().__init__(source, "<memory>", "values held in memory", infos)
        self.values = {normalize_name(k): v for k, v in values.items()}

    @property
    def order(self) -> Optional[Tuple[str, ...]]:
        """A live model's variable names in creation order (see :attr:`Source.order`), else ``None``."""
        return self.source.order

    def read(self, names: Sequence[str]) -> Dict[str, Any]:
        """Return the held values themselves (no copy); variables are read now."""
        out = {}
        for n in names:
            v = self.values[n]
            if hasattr(v, "read_value") or type(v).__name__ == "ShardedVariable":
                from ..restoring.backends.tensors import read_variable

                v = read_variable(v)
            elif _is_keras_variable(v):  # a Keras variable on another backend: its value, on the host
                from ..restoring.backends.keras_native import keras_numpy

                v = np.array(keras_numpy(v))
            out[n] = v
        return out


#: Bytes of layout outputs computed per batch while the next batch is read (see LayoutHandle.read).
_LAYOUT_BATCH = 64 << 20
#: Threads that read and transpose 2-D weights band by band (see LayoutHandle.read).
_TRANSPOSERS = 4


class LayoutHandle(SourceHandle):
    """A source seen through a framework layout (``Source(..., layout="torch")``): renamed, with
    kernels transposed and RNN gates reordered on the way (see :mod:`ckptmerge.alignment.layouts`)."""

    def __init__(self, inner: SourceHandle) -> None:
        from ..alignment.layouts import layout_of

        layout = self._settle(layout_of(inner.source.layout, inner.all_variables), inner.source)
        infos, notes = self._listing(layout, inner)
        super().__init__(inner.source, inner.path, inner.note, infos, notes,
                         [*inner.findings, *layout.findings(inner.label)])
        self.inner = inner
        self.entries = layout.entries
        self._layout = layout
        self._by_key = {v.raw_key: v.name for v in inner.all_variables}

    @staticmethod
    def _settle(layout: Any, src: Source) -> Any:
        # An undecided 2-D weight is settled by the user: a Transpose on its target, or a map
        # onto an Embedding's 'embeddings'.
        layout.undecided = [(n, why) for n, why in layout.undecided if not _settled(src, n)]
        return layout

    @staticmethod
    def _listing(layout: Any, inner: SourceHandle) -> Tuple[List[VariableInfo], Dict[str, str]]:
        infos = sorted((e.info for e in layout.entries.values()), key=lambda v: v.name)
        stored = {v.raw_key: tuple(v.shape) for v in inner.all_variables}
        notes = {n: f"layout: {', '.join(e.sources)} {stored.get(e.sources[0], ())}: {e.note}"
                 for n, e in layout.entries.items() if e.note}
        return infos, {**inner.notes, **notes}

    def name_targets(self, targets: Sequence[VariableInfo]) -> None:
        """Let the layout's findings name the target each undecided tensor most likely belongs to,
        and split the fused modules whose parts' sizes only the targets give (a grouped-query
        ``qkv_proj``: see :mod:`ckptmerge.alignment.fused`)."""
        if self._layout.needs_targets:
            from ..alignment.layouts import torch_layout

            layout = self._settle(torch_layout(self.inner.all_variables, targets=targets), self.source)
            self.all_variables, self.notes = self._listing(layout, self.inner)
            self.entries, self._layout = layout.entries, layout
            self.findings = [*self.inner.findings, *layout.findings(self.inner.label)]
        if self._layout.undecided:
            self.findings = [*self.inner.findings, *self._layout.findings(self.inner.label, targets)]

    def view(self, rules: Rules) -> "SourceView":
        """As :meth:`SourceHandle.view`, naming the layout and the tensors it could not decide.

        ``map`` keys may be PyTorch's own names: a raw key that the layout turns into one tensor
        (``model.embed_tokens.weight`` -> ``model/embed_tokens/embeddings``) stands for it, and a
        dotted scope (``model.layers.0.``) for the ``/`` scope the layout writes."""
        return dataclasses.replace(super().view(self._torch_names(rules)), layout=self.source.layout,
                                   undecided=tuple(n for n, _ in self._layout.undecided))

    def _torch_names(self, rules: Rules) -> Rules:
        if not rules.maps or not any("." in m.source for m in rules.maps):
            return rules
        outputs: Dict[str, List[str]] = {}
        for name, e in self.entries.items():
            for k in e.sources:
                outputs.setdefault(k, []).append(name)
        raw = set(self._by_key)
        maps = []
        for m in rules.maps:
            source = m.source
            if source not in self.entries:
                if len(outputs.get(source, ())) == 1:
                    source = outputs[source][0]
                elif source.endswith(".") and any(k.startswith(source) for k in raw):
                    source = source.replace(".", "/")
            maps.append(m if source == m.source else MapRule(source, m.target))
        return dataclasses.replace(rules, maps=tuple(dict.fromkeys(maps)))

    def read(self, names: Sequence[str]) -> Dict[str, Any]:
        """Read the source tensors the named outputs need, then compute each output.

        A transposed 2-D weight that the wrapped source can read in ranges (a local file) is
        read a band of rows at a time and transposed as it comes (no copy of it as stored), on
        a few threads while this one reads the other tensors."""
        streamed = {}
        for n in names:
            ranges = self._band_ranges(self.entries[n])
            if ranges is not None:
                streamed[n] = ranges
        if not streamed:
            return self._read_whole(names)
        workers = min(len(streamed), _TRANSPOSERS, os.cpu_count() or 1)
        pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="ckptmerge-layout")
        try:
            futures = {n: pool.submit(self._transposed, self.entries[n], r) for n, r in streamed.items()}
            out = self._read_whole([n for n in names if n not in streamed])
            for n, fut in futures.items():
                out[n] = fut.result()
        finally:  # (after an error, the transposes not begun are dropped)
            pool.shutdown(wait=True, cancel_futures=True)
        return out

    def _band_ranges(self, e: Any) -> Any:
        """The wrapped source's ranges of the tensor a plain 2-D transpose reads, else ``None``."""
        if e.op != "transpose" or tuple(e.perm) != (1, 0) or len(e.info.shape) != 2:
            return None
        ranges = self.inner.ranges(self._by_key.get(e.sources[0], e.sources[0]))
        if ranges is None or ranges.count != math.prod(e.info.shape) or not ranges.dtype.isnative:
            return None
        return ranges

    @staticmethod
    def _transposed(e: Any, ranges: Any) -> np.ndarray:
        """The transpose of a stored ``(out, in)`` weight, read in bands from ``ranges``."""
        from ..alignment.layouts import transpose_rows_into
        from ..formats.base import aligned_empty

        cols, rows = e.info.shape  # (the output's shape is the stored one reversed)
        span, flat = ranges.span(0, ranges.count), None

        def band(i: int, j: int) -> np.ndarray:
            nonlocal flat
            if flat is None:
                flat = np.empty(min(j - i, rows) * cols, ranges.dtype)
            return span.read(flat[:(j - i) * cols]).reshape(j - i, cols)

        return transpose_rows_into(band, (rows, cols), ranges.dtype, aligned_empty(e.info.shape, ranges.dtype))

    def _read_whole(self, names: Sequence[str]) -> Dict[str, Any]:
        """Read whole source tensors, then compute each output from them."""
        from ..alignment.layouts import apply_entry
        from ..formats.base import aligned_empty

        batches: List[List[Tuple[str, Any]]] = [[]]
        size = 0
        for n in names:  # about _LAYOUT_BATCH bytes each, so reading and transposing overlap
            e = self.entries[n]
            if size >= _LAYOUT_BATCH:
                batches.append([])
                size = 0
            batches[-1].append((n, e))
            size += e.info.nbytes
        out: Dict[str, Any] = {}

        def compute(batch: List[Tuple[str, Any]], raw: Mapping[str, Any]) -> None:
            for n, e in batch:
                values = [np.asarray(raw[self._by_key.get(k, k)]) for k in e.sources]
                # fresh arrays go straight into the aligned buffers restores take without a copy
                buffer = None if e.op == "copy" else aligned_empty(e.info.shape, np.result_type(*values))
                out[n] = apply_entry(e, values, buffer)

        def read(batch: List[Tuple[str, Any]]) -> Mapping[str, Any]:
            return self.inner.read(sorted({self._by_key.get(k, k) for _, e in batch for k in e.sources}))

        if len(batches) == 1:
            compute(batches[0], read(batches[0]))
            return out
        # The next batch is read (by the reader's own threads) while this one is transposed.
        with ThreadPoolExecutor(max_workers=1, thread_name_prefix="ckptmerge-layout") as pool:
            pending = None
            for batch in batches:
                raw = read(batch)
                if pending is not None:
                    pending.result()
                pending = pool.submit(compute, batch, raw)
            pending.result()
        return out

    def close(self) -> None:
        """Close the wrapped source."""
        self.inner.close()


def _settled(source: Source, name: str) -> bool:
    """Whether the user decided an undecided layout tensor: its map target has a Transpose, or is
    an Embedding's ``embeddings``."""
    mapping = dict(source._map_items())
    target = mapping.get(name, mapping.get(name.replace("/", ".")))  # (its own name, or PyTorch's)
    if not isinstance(target, str):
        return False
    if target.rsplit("/", 1)[-1] == "embeddings":
        return True
    from ..planning.transforms import Transpose

    return any(isinstance(t, Transpose) and t.applies_to(target) for t in source.transforms)
