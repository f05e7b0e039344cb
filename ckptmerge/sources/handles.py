"""An opened source: the handles that list a source's variables and read their values.

:meth:`~ckptmerge.Source.open` returns a :class:`SourceHandle`: a :class:`CheckpointHandle` over a
TensorFlow-free reader of one checkpoint, or a :class:`MemoryHandle` over values held in memory
(numpy arrays, TF or Keras variables, read when asked for); a framework layout wraps either in a
:class:`~ckptmerge.sources.layout.LayoutHandle`. A handle offers every tensor with its spec, the
view the planner sees through the source's rules, and reads by name, in chunks or as element
ranges.
"""

from __future__ import annotations

import itertools
import operator
import sys
import types
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
)

import numpy as np

from ..core.errors import CkptMergeError
from ..planning.rules import Rules
from ..core.specs import VariableInfo, by_name, model_variables, normalize_name
from ..core.text import quote_name

if TYPE_CHECKING:  # pragma: no cover
    from ..planning.planner import SourceView
    from .source import Source

__all__ = ["SourceHandle", "CheckpointHandle", "MemoryHandle"]


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
