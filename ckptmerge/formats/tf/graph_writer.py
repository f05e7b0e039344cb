"""Write the object graph of a TF2 checkpoint that holds only some of its inputs' tensors.

An object-based checkpoint (``tf.train.Checkpoint``, ``CheckpointManager``) is restored by
walking its ``_CHECKPOINTABLE_OBJECT_GRAPH`` from the root, edge name by edge name, and reading
each object's attributes under their ``checkpoint_key``. A merge or an average that writes a
subset of the keys (optimizer state and ``save_counter`` are left out by default) keeps that
walk working only if the graph it writes names exactly the keys written.
:func:`prune_object_graph` makes that graph from the input's one, at the protobuf wire level (no
TensorFlow): the attributes whose keys are not written are dropped, so are the slot references
whose slot or variable no longer holds a value, and the nodes left with no value below them;
nodes are renumbered in their old order (the root stays node 0) and every node's
``has_checkpoint_values`` is set as TensorFlow sets it when it saves (a node holds values when it
has attributes or slots, or when one of its children does). Every other field is copied as it is.
"""

from __future__ import annotations

from typing import Collection, Dict, List, Set

from ckptmerge.formats.tf.objectgraph import parse_object_graph
from ckptmerge.formats.tf.protowire import (
    WIRE_BYTES,
    WIRE_FIXED32,
    WIRE_FIXED64,
    field_bytes,
    field_fixed32,
    field_fixed64,
    field_varint,
    iter_fields,
)

__all__ = ["prune_object_graph", "UnsupportedGraph"]

_CHILDREN, _ATTRIBUTES, _SLOTS, _REGISTERED_SAVER, _HAS_VALUES = 1, 2, 3, 4, 5


class UnsupportedGraph(ValueError):
    """The graph holds objects whose values are not plain attributes (a registered saver)."""


def _field(no: int, wire: int, value: object) -> bytes:
    """One field encoded again as it was read."""
    if wire == WIRE_BYTES:
        return field_bytes(no, value)  # type: ignore[arg-type]
    if wire == WIRE_FIXED32:
        return field_fixed32(no, value)  # type: ignore[arg-type]
    if wire == WIRE_FIXED64:
        return field_fixed64(no, value)  # type: ignore[arg-type]
    return field_varint(no, value)  # type: ignore[arg-type]


def _attribute_key(buf: bytes) -> str:
    for no, wire, value in iter_fields(buf):
        if no == 3 and wire == WIRE_BYTES:
            return bytes(value).decode("utf-8")  # type: ignore[arg-type]
    return ""


def prune_object_graph(data: bytes, keep: Collection[str]) -> bytes:
    """The serialized ``TrackableObjectGraph`` ``data`` naming only the checkpoint keys ``keep``.

    Args:
        data: the input's ``_CHECKPOINTABLE_OBJECT_GRAPH`` value (serialized protobuf).
        keep: the checkpoint keys the output holds (keys the graph does not name are ignored).

    Raises:
        DecodeError: ``data`` is not a valid object graph.
        UnsupportedGraph: a node that would be kept saves its values through a registered saver
            (values under keys of its own, not attributes), which a subset cannot reproduce.

    Example:
        >>> from ckptmerge.formats.tf.protowire import field_bytes, field_varint
        >>> ref = lambda i, n: field_bytes(1, field_varint(1, i) + field_bytes(2, n))
        >>> attr = lambda k: field_bytes(2, field_bytes(1, "VARIABLE_VALUE") + field_bytes(3, k))
        >>> g = (field_bytes(1, ref(1, "a") + ref(2, "b")) + field_bytes(1, attr("a/.ATTRIBUTES/VARIABLE_VALUE"))
        ...      + field_bytes(1, attr("b/.ATTRIBUTES/VARIABLE_VALUE")))
        >>> [n.children for n in parse_object_graph(prune_object_graph(g, ["b/.ATTRIBUTES/VARIABLE_VALUE"])).nodes]
        [(ObjectReference(node_id=1, local_name='b'),), ()]
    """
    keep = set(keep)
    graph = parse_object_graph(data)
    raw_nodes: List[bytes] = []
    other: List[bytes] = []  # top-level fields besides the nodes (none today): copied
    for no, wire, value in iter_fields(data):
        if no == 1 and wire == WIRE_BYTES:
            raw_nodes.append(bytes(value))  # type: ignore[arg-type]
        else:
            other.append(_field(no, wire, value))
    nodes = graph.nodes
    if not nodes:
        return bytes(data)
    saver = {i for i, raw in enumerate(raw_nodes) if any(no == _REGISTERED_SAVER for no, _, _ in iter_fields(raw))}
    valued: Set[int] = {i for i, n in enumerate(nodes) if any(a.checkpoint_key in keep for a in n.attributes)}
    slots = {i: [s for s in n.slot_variables if s.slot_variable_node_id in valued
                 and s.original_variable_node_id in valued] for i, n in enumerate(nodes)}
    valued |= {i for i, kept in slots.items() if kept}
    parents: Dict[int, Set[int]] = {}
    for i, n in enumerate(nodes):
        for ref in n.children:
            parents.setdefault(ref.node_id, set()).add(i)
    todo = list(valued)
    while todo:  # a parent of a node with values has values
        for p in parents.get(todo.pop(), ()):
            if p not in valued:
                valued.add(p)
                todo.append(p)
    kept = sorted(valued | {0})
    bad = saver & set(kept)
    if bad:
        raise UnsupportedGraph(f"{len(bad)} object(s) of the graph save their values through a registered "
                               "saver, not as attributes")
    new_id = {old: new for new, old in enumerate(kept)}
    out: List[bytes] = []
    for old in kept:
        parts: List[bytes] = []
        for no, wire, value in iter_fields(raw_nodes[old]):
            if no == _CHILDREN and wire == WIRE_BYTES:
                child, name = 0, b""
                for cno, cwire, cval in iter_fields(value):  # type: ignore[arg-type]
                    if cno == 1:
                        child = int(cval)  # type: ignore[arg-type]
                    elif cno == 2:
                        name = bytes(cval)  # type: ignore[arg-type]
                if child in new_id:
                    parts.append(field_bytes(no, field_varint(1, new_id[child]) + field_bytes(2, name)))
            elif no == _ATTRIBUTES and wire == WIRE_BYTES:
                if _attribute_key(value) in keep:  # type: ignore[arg-type]
                    parts.append(_field(no, wire, value))
            elif no == _SLOTS or no == _HAS_VALUES:
                continue  # written below
            else:
                parts.append(_field(no, wire, value))
        for s in slots[old]:
            parts.append(field_bytes(_SLOTS, field_varint(1, new_id[s.original_variable_node_id])
                                     + field_bytes(2, s.slot_name) + field_varint(3, new_id[s.slot_variable_node_id])))
        parts.append(field_bytes(_HAS_VALUES, field_varint(1, 1 if old in valued else 0)))  # a BoolValue
        out.append(field_bytes(1, b"".join(parts)))
    result = b"".join(out + other)
    parse_object_graph(result)  # (what is written parses)
    return result

