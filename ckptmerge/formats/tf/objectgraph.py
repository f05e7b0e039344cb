"""TF2 object graphs: parse ``_CHECKPOINTABLE_OBJECT_GRAPH`` and name and classify its tensors.

Object-based checkpoints (``tf.train.Checkpoint``, Keras ``save_weights`` in TF format,
SavedModel variables) store tensors under object-path keys such as
``model/layer-1/kernel/.ATTRIBUTES/VARIABLE_VALUE`` and a serialized
``tensorflow.TrackableObjectGraph`` proto (``trackable_object_graph.proto``) describing the
objects. This module decodes that proto with :mod:`ckptmerge.formats.tf.protowire` and implements
ckptmerge's naming rule (see the team brief, "Names"):

* a variable's name is the ``full_name`` TensorFlow recorded (``dense/kernel`` for Keras),
  unless it is missing, automatic (``Variable``, ``Variable_3``, ``ShardedVariable``) or shared
  by two variables;
  then it is the object path (the key without ``/.ATTRIBUTES/VARIABLE_VALUE``);
* its kind is ``"optimizer"`` for slot variables and for variables reachable from the root only
  through an edge named like ``optimizer``; ``"bookkeeping"`` for the graph itself, the root's
  ``save_counter`` and ``global_step``; otherwise ``"variable"``.
"""

from __future__ import annotations

import re
from collections import Counter, deque
from dataclasses import dataclass
from typing import Dict, Iterable, List, Optional, Set, Tuple

from ckptmerge.formats.tf.protowire import WIRE_BYTES, DecodeError, iter_fields
from ckptmerge.core.specs import (
    KIND_BOOKKEEPING,
    KIND_OPTIMIZER,
    KIND_VARIABLE,
    normalize_name,
)

__all__ = [
    "OBJECT_GRAPH_KEY",
    "VARIABLE_VALUE_SUFFIX",
    "ObjectReference",
    "SerializedTensor",
    "SlotVariableReference",
    "TrackableObject",
    "ObjectGraph",
    "parse_object_graph",
    "name_based_kind",
    "name_based_kinds",
    "is_optimizer_edge",
]

#: The bundle key holding the serialized object graph.
OBJECT_GRAPH_KEY = "_CHECKPOINTABLE_OBJECT_GRAPH"
#: The suffix of a variable's value key in object-based checkpoints.
VARIABLE_VALUE_SUFFIX = "/.ATTRIBUTES/VARIABLE_VALUE"

# TF's automatic names; a ShardedVariable (ParameterServerStrategy) records its class name.
_AUTOMATIC_NAME = re.compile(r"(Sharded)?Variable(_\d+)?")
# Edges that lead to optimizer state: "optimizer" (Keras, tf.train.Checkpoint convention) and
# the common spellings "optimizer_1", "gen_optimizer", "compensator_optimizer", "opt".
_OPTIMIZER_EDGE = re.compile(r"(?:.*[_\-.])?optimizer(?:[_\-.]?\d+)?|opt", re.IGNORECASE)

# Name-based (TF1) optimizer slot and accumulator names, matched on the last path component.
_SLOT_LEAF = re.compile(
    r"(?:Adam|AdamW|Adamax|Nadam|LazyAdam|Momentum|RMSProp|Adagrad|AdagradDA|ProximalAdagrad|"
    r"Ftrl|Adadelta|Lamb|LARS|Lion)(?:_\d+)?|beta[12]_power(?:_\d+)?"
)
# Keras 2 in TF1 graph mode: "Adam/iterations", "training/Adam/Variable_3", "SGD/lr".
_KERAS_OPTIMIZER_SCOPE = re.compile(
    r"(?:training(?:_\d+)?/)?(?:Adam|AdamW|Adamax|Nadam|SGD|RMSprop|Adagrad|Adadelta|Ftrl|Lion|"
    r"Adafactor)(?:_\d+)?/.*"
)
_BOOKKEEPING_NAMES = {OBJECT_GRAPH_KEY, "global_step", "save_counter"}


def name_based_kind(name: str) -> str:
    """Return the kind of a name-based (TF1) checkpoint key, from the usual naming conventions.

    Example:
        >>> name_based_kind("dense/kernel/Adam_1"), name_based_kind("global_step")
        ('optimizer', 'bookkeeping')
    """
    leaf = name.rsplit("/", 1)[-1]
    if name in _BOOKKEEPING_NAMES or leaf == "global_step":
        return KIND_BOOKKEEPING
    if (_SLOT_LEAF.fullmatch(leaf) or _KERAS_OPTIMIZER_SCOPE.fullmatch(name)
            or "/.OPTIMIZER_SLOT/" in name):
        return KIND_OPTIMIZER
    return KIND_VARIABLE


# Every name that is not a plain variable contains one of these (each alternative of the patterns
# above does: "Ada" stands for Adam, Adagrad, Adadelta and Adafactor, "RMS" for RMSProp and
# RMSprop), so name_based_kinds only looks closer at names holding one. Each is one scan of
# every name: the fewer, the faster.
_NOT_VARIABLE_WORDS = ("Ada", "Nadam", "Momentum", "RMS", "Ftrl", "Lamb", "LARS", "Lion", "_power", "SGD",
                       "global_step", "save_counter", OBJECT_GRAPH_KEY, "/.OPTIMIZER_SLOT/")


def name_based_kinds(names: List[str]) -> List[str]:
    """:func:`name_based_kind` of every name, looking closer only at names that hold one of the
    words an optimizer or bookkeeping name holds (found with a few substring scans over all the
    names at once, so 100,000 plain variables cost a few passes, not 100,000 matches).

    Example:
        >>> name_based_kinds(["dense/kernel", "dense/kernel/Adam", "global_step"])
        ['variable', 'optimizer', 'bookkeeping']
    """
    text = "\n".join(names)
    if text.count("\n") != max(len(names) - 1, 0):  # a name holding a newline: one at a time
        return [name_based_kind(n) for n in names]
    maybe = set()
    for word in _NOT_VARIABLE_WORDS:
        at = text.find(word)
        while at >= 0:
            start = text.rfind("\n", 0, at) + 1
            end = text.find("\n", at)
            end = len(text) if end < 0 else end
            maybe.add(text[start:end])
            at = text.find(word, end)
    return [name_based_kind(n) if n in maybe else KIND_VARIABLE for n in names]


def is_optimizer_edge(local_name: str) -> bool:
    """True for object-graph edges that lead to optimizer state (``optimizer``, ``gen_optimizer``).

    Example:
        >>> is_optimizer_edge("optimizer"), is_optimizer_edge("compensator_optimizer")
        (True, True)
    """
    return bool(_OPTIMIZER_EDGE.fullmatch(local_name))


@dataclass(frozen=True)
class ObjectReference:
    """An edge of the object graph: ``parent.<local_name> -> nodes[node_id]``."""

    node_id: int
    local_name: str


@dataclass(frozen=True)
class SerializedTensor:
    """One saved attribute of an object (``name`` is usually ``VARIABLE_VALUE``)."""

    name: str
    full_name: str
    checkpoint_key: str


@dataclass(frozen=True)
class SlotVariableReference:
    """An optimizer slot (e.g. Adam's ``m``) of the variable ``original_variable_node_id``."""

    original_variable_node_id: int
    slot_name: str
    slot_variable_node_id: int


@dataclass(frozen=True)
class TrackableObject:
    """One node of the object graph."""

    children: Tuple[ObjectReference, ...]
    attributes: Tuple[SerializedTensor, ...]
    slot_variables: Tuple[SlotVariableReference, ...]


def _text(value: object, what: str) -> str:
    if not isinstance(value, bytes):
        raise DecodeError(f"{what} has the wrong wire type")
    try:
        return value.decode("utf-8")
    except UnicodeDecodeError:
        raise DecodeError(f"{what} is not valid UTF-8") from None


def _int(value: object, what: str) -> int:
    if not isinstance(value, int):
        raise DecodeError(f"{what} has the wrong wire type")
    return value


def _parse_node(buf: bytes) -> TrackableObject:
    children: List[ObjectReference] = []
    attributes: List[SerializedTensor] = []
    slots: List[SlotVariableReference] = []
    for no, wire, value in iter_fields(buf):
        if no == 1 and wire == WIRE_BYTES:
            node_id, local_name = 0, ""
            for cno, cwire, cval in iter_fields(value):  # type: ignore[arg-type]
                if cno == 1:
                    node_id = _int(cval, "ObjectReference.node_id")
                elif cno == 2:
                    local_name = _text(cval, "ObjectReference.local_name")
            children.append(ObjectReference(node_id, local_name))
        elif no == 2 and wire == WIRE_BYTES:
            fields = {1: "", 2: "", 3: ""}
            for ano, _, aval in iter_fields(value):  # type: ignore[arg-type]
                if ano in fields:
                    fields[ano] = _text(aval, "SerializedTensor field")
            attributes.append(SerializedTensor(fields[1], fields[2], fields[3]))
        elif no == 3 and wire == WIRE_BYTES:
            orig, slot_name, slot_node = 0, "", 0
            for sno, _, sval in iter_fields(value):  # type: ignore[arg-type]
                if sno == 1:
                    orig = _int(sval, "SlotVariableReference.original_variable_node_id")
                elif sno == 2:
                    slot_name = _text(sval, "SlotVariableReference.slot_name")
                elif sno == 3:
                    slot_node = _int(sval, "SlotVariableReference.slot_variable_node_id")
            slots.append(SlotVariableReference(orig, slot_name, slot_node))
        elif no in (1, 2, 3):
            raise DecodeError(f"TrackableObject field {no} has wire type {wire}")
        # registered_saver (4), has_checkpoint_values (5) and later fields are not needed.
    return TrackableObject(tuple(children), tuple(attributes), tuple(slots))


def parse_object_graph(data: bytes) -> "ObjectGraph":
    """Decode a serialized ``TrackableObjectGraph``.

    Raises:
        DecodeError: (a ``CheckpointFormatError``) if the bytes are not a valid graph.

    Example:
        >>> parse_object_graph(b"").nodes
        ()
    """
    nodes: List[TrackableObject] = []
    for no, wire, value in iter_fields(data):
        if no == 1:
            if wire != WIRE_BYTES:
                raise DecodeError("TrackableObjectGraph.nodes has the wrong wire type")
            nodes.append(_parse_node(value))  # type: ignore[arg-type]
    graph = ObjectGraph(tuple(nodes))
    n = len(nodes)
    for node in nodes:
        for ref in node.children:
            if ref.node_id >= n:
                raise DecodeError(f"object graph edge {ref.local_name!r} points to node "
                                  f"{ref.node_id} but the graph has {n} nodes")
        for slot in node.slot_variables:
            if slot.slot_variable_node_id >= n or slot.original_variable_node_id >= n:
                raise DecodeError(f"object graph slot {slot.slot_name!r} points past the "
                                  f"{n} nodes of the graph")
    return graph


@dataclass(frozen=True)
class ObjectGraph:
    """A parsed ``TrackableObjectGraph``; ``nodes[0]`` is the root.

    Example:
        >>> g = ObjectGraph((TrackableObject((ObjectReference(1, "v"),), (), ()),
        ...                  TrackableObject((), (SerializedTensor("VARIABLE_VALUE", "w",
        ...                      "v/.ATTRIBUTES/VARIABLE_VALUE"),), ())))
        >>> g.name_keys(["v/.ATTRIBUTES/VARIABLE_VALUE"])
        {'v/.ATTRIBUTES/VARIABLE_VALUE': ('w', 'variable')}
    """

    nodes: Tuple[TrackableObject, ...]

    def reachable(self, *, skip_optimizer_edges: bool) -> Set[int]:
        """Node ids reachable from the root, optionally not crossing optimizer edges."""
        if not self.nodes:
            return set()
        seen = {0}
        todo = deque([0])
        while todo:
            for ref in self.nodes[todo.popleft()].children:
                if ref.node_id in seen or (skip_optimizer_edges and is_optimizer_edge(ref.local_name)):
                    continue
                seen.add(ref.node_id)
                todo.append(ref.node_id)
        return seen

    def slot_variable_nodes(self) -> Set[int]:
        """Node ids of every optimizer slot variable."""
        return {s.slot_variable_node_id for node in self.nodes for s in node.slot_variables}

    def bookkeeping_nodes(self) -> Set[int]:
        """The root's ``save_counter`` and every node reached by an edge named ``global_step``."""
        out: Set[int] = set()
        for i, node in enumerate(self.nodes):
            for ref in node.children:
                if ref.local_name == "global_step" or (i == 0 and ref.local_name == "save_counter"):
                    out.add(ref.node_id)
        return out

    def saving_order(self) -> List[str]:
        """The checkpoint keys of the model's tensors in the order the objects were tracked.

        A node lists its children in the order its attributes were assigned (a Keras model's
        layers in the order they were built), so a depth-first walk from the root, children in
        order, meets the variables in creation order. Edges to optimizer state are not followed.

        Example:
            >>> g = ObjectGraph((TrackableObject((ObjectReference(2, "b"), ObjectReference(1, "a")), (), ()),
            ...                  TrackableObject((), (SerializedTensor("VARIABLE_VALUE", "a", "a/v"),), ()),
            ...                  TrackableObject((), (SerializedTensor("VARIABLE_VALUE", "b", "b/v"),), ())))
            >>> g.saving_order()
            ['b/v', 'a/v']
        """
        if not self.nodes:
            return []
        keys: List[str] = []
        seen = {0}
        todo = [0]
        while todo:
            node = self.nodes[todo.pop()]
            keys += [a.checkpoint_key for a in node.attributes]
            children = [r.node_id for r in node.children
                        if r.node_id not in seen and not is_optimizer_edge(r.local_name)]
            seen.update(children)
            todo += reversed(children)  # the first child is walked first
        return keys

    def name_keys(self, keys: Iterable[str]) -> Dict[str, Tuple[str, str]]:
        """Apply the naming rule: ``{checkpoint_key: (name, kind)}`` for every key in ``keys``.

        Keys the graph does not mention keep their key (without the ``VARIABLE_VALUE`` suffix)
        as name, and get a kind from :func:`name_based_kind`. Names are unique.
        """
        keys = list(keys)
        model = self.reachable(skip_optimizer_edges=True)
        slots = self.slot_variable_nodes()
        books = self.bookkeeping_nodes()
        owner: Dict[str, Tuple[int, SerializedTensor]] = {}
        for i, node in enumerate(self.nodes):
            for attr in node.attributes:
                owner.setdefault(attr.checkpoint_key, (i, attr))

        path_name = {k: k[: -len(VARIABLE_VALUE_SUFFIX)] if k.endswith(VARIABLE_VALUE_SUFFIX) and
                     len(k) > len(VARIABLE_VALUE_SUFFIX) else k for k in keys}
        full: Dict[str, Optional[str]] = {}
        kinds: Dict[str, str] = {}
        for k in keys:
            if k == OBJECT_GRAPH_KEY:
                full[k], kinds[k] = None, KIND_BOOKKEEPING
                continue
            if k not in owner:
                full[k], kinds[k] = None, name_based_kind(path_name[k])
                continue
            node_id, attr = owner[k]
            fn = normalize_name(attr.full_name) if attr.name == "VARIABLE_VALUE" else ""
            full[k] = fn if fn and not _AUTOMATIC_NAME.fullmatch(fn) else None
            if node_id in books or (full[k] or path_name[k]).rsplit("/", 1)[-1] == "global_step":
                kinds[k] = KIND_BOOKKEEPING
            elif node_id in slots or node_id not in model:
                kinds[k] = KIND_OPTIMIZER
            else:
                kinds[k] = KIND_VARIABLE

        # Full names shared by several tensors fall back to paths; repeat, since a fallback
        # path may itself equal somebody's full name.
        names = {k: full[k] if full[k] is not None else path_name[k] for k in keys}
        for _ in range(3):
            counts = Counter(names.values())
            clashing = [k for k in keys if counts[names[k]] > 1 and names[k] != path_name[k]]
            if not clashing:
                break
            for k in clashing:
                names[k] = path_name[k]
        counts = Counter(names.values())
        for k in keys:  # last resort: the raw key, which is unique by construction
            if counts[names[k]] > 1:
                names[k] = k
        return {k: (names[k], kinds[k]) for k in keys}
