"""TF outputs of object-based inputs keep the object graph, so ``tf.train.Checkpoint`` restores them.

``ckptmerge`` names the tensors of an object-based checkpoint (``tf.train.Checkpoint``,
``CheckpointManager``) by their variables' names (``dense/kernel``), not by their object paths
(``model/layer_with_weights-0/kernel/.ATTRIBUTES/VARIABLE_VALUE``). Written under those names, a
merge or an average would be a name-based checkpoint that ``tf.train.Checkpoint(...).restore``
matches to nothing (it falls back to TF1 name matching, and a Keras 3 model's variables are not
named that way), without an error unless the caller asserts. :func:`object_layout` decides,
before anything is written, under which keys a TF output writes each name and which object
graph it writes beside them:

* **A template checkpoint with an object graph**: its keys and its graph, pruned to the names
  written (the template is the layout of the model the output is meant for);
* **no template, or a template of specs or a model** (which choose the names and shapes): when every written tensor comes from object-based bundles (a combination's
  inputs included) whose graphs are the same once pruned to the written keys, and every name is
  the name that graph gives its key, with the stored shape and dtype: the inputs' keys and graph;
* otherwise the output is name-based (as name-based inputs and templates stay), and, when some
  input was object-based, :class:`ObjectLayout` ``note`` says why and what to pass.

:class:`KeyedWriter` wraps the TF writer: the jobs add tensors by name, it stores them under their
keys and adds the graph when it finishes. Pruning is :mod:`ckptmerge.formats.tf.graph_writer`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

from ..combining.combine import CombinedHandle
from ..core.specs import VariableInfo
from ..core.text import plural, quote_name
from ..formats.tf.bundle import BundleReader
from ..formats.tf.graph_writer import UnsupportedGraph, prune_object_graph
from ..formats.tf.objectgraph import OBJECT_GRAPH_KEY
from ..formats.tf.writer import BundleWriter
from ..sources.composed import ComposedHandle
from ..sources.handles import CheckpointHandle, SourceHandle

__all__ = ["ObjectLayout", "KeyedWriter", "object_layout", "NAME_BASED", "OBJECT_BASED"]

NAME_BASED = "name-based"
OBJECT_BASED = "object-based"

_RESTORE_HINT = ("tf.train.Checkpoint(...).restore cannot match its tensors to objects (it falls back to TF1 "
                 "name matching, which restores nothing into a Keras 3 model)")


@dataclass(frozen=True)
class ObjectLayout:
    """How a TF output is keyed.

    Attributes:
        kind: ``"object-based"`` (``keys`` and ``graph`` set) or ``"name-based"``.
        keys: ``{written name: checkpoint key}``.
        graph: the serialized object graph to write under ``_CHECKPOINTABLE_OBJECT_GRAPH``.
        origin: where the graph comes from (``"the inputs"``, ``"the template"``).
        extra: ``{key: value}`` written besides the jobs' tensors: the root's ``save_counter``
            (``tf.train.Checkpoint.restore`` creates one and expects a value for it), from the
            checkpoint the graph comes from (the last input), unless the merge writes it.
        note: for a name-based output of object-based inputs, why and what to pass; else ``""``.

    Example:
        >>> ObjectLayout(NAME_BASED).kind
        'name-based'
    """

    kind: str
    keys: Optional[Dict[str, str]] = None
    graph: bytes = b""
    origin: str = ""
    note: str = ""
    extra: Optional[Dict[str, Any]] = None


class KeyedWriter:
    """A writer (:class:`~ckptmerge.formats.tf.writer.BundleWriter`, a Keras ``.weights.h5``
    writer) that stores each name under its key, and ``extra`` tensors (an object graph, a save
    counter) when it finishes: the jobs add tensors by name.

    Example:
        >>> w = KeyedWriter(BundleWriter("out/m"), {"dense/kernel": "model/dense/kernel/.ATTRIBUTES/VARIABLE_VALUE"})  # doctest: +SKIP
    """

    def __init__(self, writer: Any, keys: Dict[str, str], extra: Optional[Dict[str, Any]] = None) -> None:
        self._writer, self._keys, self._extra = writer, keys, dict(extra or {})

    @classmethod
    def tf(cls, writer: BundleWriter, layout: ObjectLayout) -> "KeyedWriter":
        """The TF writer of an object-based ``layout``: its keys, its graph and its save counter."""
        assert layout.keys is not None
        return cls(writer, layout.keys, {**(layout.extra or {}), OBJECT_GRAPH_KEY: np.array(layout.graph, dtype=object)})

    def add(self, key: str, value: Any) -> None:
        self._writer.add(self._keys[key], value)

    def add_raw(self, key: str, *args: Any, **kwargs: Any) -> None:
        self._writer.add_raw(self._keys[key], *args, **kwargs)

    def add_range(self, key: str, *args: Any, **kwargs: Any) -> None:
        self._writer.add_range(self._keys[key], *args, **kwargs)

    def finish(self) -> None:
        for key, value in self._extra.items():
            self._writer.add(key, value)
        self._writer.finish()

    def abort(self) -> None:
        self._writer.abort()

    @property
    def bytes_written(self) -> int:
        return self._writer.bytes_written


def _graph_reader(h: Any) -> Optional[BundleReader]:
    reader = getattr(h, "reader", None) if isinstance(h, CheckpointHandle) else None
    return reader if isinstance(reader, BundleReader) and reader.object_graph is not None else None


class _Keys:
    """Where each source tensor is stored: ``[(object-based reader, key)]``, or ``None`` when some
    part of it is not a tensor of an object-based bundle."""

    def __init__(self) -> None:
        self._infos: Dict[int, Dict[str, VariableInfo]] = {}
        self._own: Dict[int, Dict[str, VariableInfo]] = {}

    def own(self, reader: BundleReader) -> Dict[str, VariableInfo]:
        """``{key: info}`` as the reader itself names its tensors (before any rename)."""
        own = self._own.get(id(reader))
        if own is None:
            own = self._own[id(reader)] = {v.raw_key: v for v in reader.variables()}
        return own

    def _info(self, h: SourceHandle, name: str) -> Optional[VariableInfo]:
        infos = self._infos.get(id(h))
        if infos is None:
            infos = self._infos[id(h)] = {v.name: v for v in h.all_variables}
        return infos.get(name)

    def of(self, h: Any, name: str) -> Optional[List[Tuple[BundleReader, str]]]:
        if isinstance(h, ComposedHandle):  # (a joined tensor's name is none of the inner handle's)
            h = h.inner
        if isinstance(h, CombinedHandle):
            entry = h.entries.get(name)
            if entry is None:
                return None
            out: List[Tuple[BundleReader, str]] = []
            for i, inner in entry.inputs:
                part = self.of(h.inputs[i], inner)
                if part is None:
                    return None
                out += part
            return out
        reader = _graph_reader(h)
        info = self._info(h, name) if reader is not None else None
        return None if info is None or reader is None else [(reader, info.raw_key)]

    def object_based(self, h: Any) -> bool:
        """Whether any input behind ``h`` is an object-based bundle."""
        if isinstance(h, ComposedHandle):
            h = h.inner
        if isinstance(h, CombinedHandle):
            return any(self.object_based(i) for i in h.inputs)
        return _graph_reader(h) is not None


def _graph_bytes(reader: BundleReader) -> bytes:
    return bytes(np.asarray(reader.get(OBJECT_GRAPH_KEY)).item())


def _save_counter(reader: BundleReader, keys: Dict[str, str]) -> Dict[str, Any]:
    """The root's ``save_counter`` (key: value) when the graph has one and ``keys`` lack it."""
    graph = reader.object_graph
    assert graph is not None
    written = set(keys.values())
    for ref in graph.nodes[0].children if graph.nodes else ():
        if ref.local_name == "save_counter":
            for attr in graph.nodes[ref.node_id].attributes:
                if attr.name == "VARIABLE_VALUE" and attr.checkpoint_key not in written:
                    info = next((v for v in reader.variables() if v.raw_key == attr.checkpoint_key), None)
                    if info is not None and info.shape == () and info.dtype.startswith("int"):
                        return {attr.checkpoint_key: np.asarray(reader.get(info.name))}
    return {}


def _pruned(reader: BundleReader, keys: Sequence[str], what: str) -> Tuple[Optional[bytes], str]:
    try:
        return prune_object_graph(_graph_bytes(reader), keys), ""
    except UnsupportedGraph as e:
        return None, f"the object graph of {what} cannot be cut down to the tensors written: {e}"


def object_layout(jobs: Sequence[Any], handles: Sequence[SourceHandle], template: Any,
                  template_kind: str) -> ObjectLayout:
    """The keys and the object graph of a TF output of ``jobs`` (see the module docstring).

    ``jobs`` are the merge's write jobs (``target``, ``origin``, ``name``, ``key``), ``handles``
    the opened sources (by ``source_origin(label)``), ``template`` the opened template reader
    (``None`` without a template checkpoint), ``template_kind`` ``"none"``, ``"path"``, ``"specs"``
    or ``"model"``.

    Example:
        >>> object_layout([], [], None, "none").kind
        'name-based'
    """
    from .jobs import source_origin

    if template_kind == "path":
        if not isinstance(template, BundleReader) or template.object_graph is None:
            return ObjectLayout(NAME_BASED)  # a name-based template: the layout asked for
        return _from_template(jobs, template)
    by_origin = {source_origin(h.label): h for h in handles}
    where = _Keys()
    if not any(where.object_based(h) for h in handles):
        return ObjectLayout(NAME_BASED)  # name-based inputs stay name-based
    # (a template of specs or a model chooses the names and shapes; the keys stay the inputs' own,
    # under the conditions below: the same names, shapes and dtypes as the inputs' graph gives them)
    keys: Dict[str, str] = {}
    readers: Dict[int, BundleReader] = {}
    problems: List[str] = []
    for j in jobs:
        parts = where.of(by_origin.get(j.origin), j.name)
        if not parts:
            problems.append(f"{quote_name(j.target.name)} is not a tensor of an object-based checkpoint")
            continue
        found = {k for _, k in parts}
        if len(found) > 1:
            problems.append(f"{quote_name(j.target.name)} is stored under {len(found)} different keys in the inputs")
            continue
        key = found.pop()
        for reader, _ in parts:
            readers[id(reader)] = reader
            own = where.own(reader).get(key)
            if own is None or own.name != j.target.name:
                problems.append(f"{quote_name(j.target.name)} is renamed (the input's object graph names "
                                f"{quote_name(key)} {quote_name(own.name if own else key)})")
                break
            if tuple(own.shape) != tuple(j.target.shape) or own.dtype != j.target.dtype:
                problems.append(f"{quote_name(j.target.name)} is written as {j.target.dtype} "
                                f"{tuple(j.target.shape)}, its object is {own.dtype} {tuple(own.shape)}")
                break
        else:
            keys[j.target.name] = key
    if not problems and len(set(keys.values())) != len(keys):
        problems.append("two written names are stored under one key")
    graph = b""
    extra: Dict[str, Any] = {}
    if not problems:
        graphs = set()
        last = list(readers.values())[-1] if readers else None
        extra = _save_counter(last, keys) if last is not None else {}
        for reader in readers.values():
            g, why = _pruned(reader, [*keys.values(), *extra], quote_name(reader.path))
            if g is None:
                problems.append(why)
                break
            graphs.add(g)
        if len(graphs) > 1:
            problems.append(f"the inputs' object graphs differ ({plural(len(graphs), 'different graph')} "
                            "for the tensors written): their objects are not the same model's")
        elif graphs:
            graph = graphs.pop()
    if problems:
        more = f" (and {len(problems) - 3} more)" if len(problems) > 3 else ""
        return _name_based("; ".join(problems[:3]) + more,
                           "pass template=<an object-based checkpoint of the model the output is for> "
                           "(--template PATH): the output then takes its keys and its object graph")
    return ObjectLayout(OBJECT_BASED, keys=keys, graph=graph, origin="the inputs", extra=extra)


def _from_template(jobs: Sequence[Any], template: BundleReader) -> ObjectLayout:
    own = {v.name: v for v in template.variables()}
    keys: Dict[str, str] = {}
    for j in jobs:
        info = own.get(j.target.name)
        if info is None or tuple(info.shape) != tuple(j.target.shape) or info.dtype != j.target.dtype:
            return _name_based(f"{quote_name(j.target.name)} is not the template's own tensor",
                               "write what the template holds")
        keys[j.target.name] = info.raw_key
    extra = _save_counter(template, keys)
    graph, why = _pruned(template, [*keys.values(), *extra], "the template")
    if graph is None:
        return _name_based(why, "pass a template checkpoint saved by tf.train.Checkpoint")
    return ObjectLayout(OBJECT_BASED, keys=keys, graph=graph, origin="the template", extra=extra)


def _name_based(why: str, fix: str) -> ObjectLayout:
    return ObjectLayout(NAME_BASED, note=f"Written name-based (its keys are the variable names), so {_RESTORE_HINT}: "
                                         f"{why}. To keep an object graph, {fix}.")
