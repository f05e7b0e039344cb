"""JSON text written a piece at a time, so that a 100,000-variable listing or plan is never held
whole, neither as records nor as text.

A value to write may hold :class:`Records` (a JSON array) and :class:`Entries` (a JSON object)
whose items are made only while they are written: :func:`json_pieces` yields the text in pieces,
:func:`materialize` turns such a value into plain lists and dicts. The layout is the CLI's: the
first ``expand`` levels of containers one item per line, deeper ones compact on their line, and
strict JSON (NaN and infinities are refused, as ``json.dumps(..., allow_nan=False)`` does).
Nothing here reads files or imports TensorFlow.
"""

from __future__ import annotations

import itertools
import json
from typing import Any, Iterable, Iterator, Tuple

__all__ = ["Records", "Entries", "json_pieces", "materialize"]


class Records:
    """A JSON array whose items come from ``items`` when it is written (once).

    Example:
        >>> "".join(json_pieces({"xs": Records(i * i for i in range(3))}, expand=1))
        '{\\n  "xs": [0, 1, 4]\\n}'
    """

    __slots__ = ("items",)

    def __init__(self, items: Iterable[Any]) -> None:
        self.items = items


class Entries:
    """A JSON object whose ``(key, value)`` pairs come from ``pairs`` when it is written (once).

    Example:
        >>> materialize(Entries((k, len(k)) for k in ["a", "bb"]))
        {'a': 1, 'bb': 2}
    """

    __slots__ = ("pairs",)

    def __init__(self, pairs: Iterable[Tuple[str, Any]]) -> None:
        self.pairs = pairs


def materialize(value: Any) -> Any:
    """``value`` with every :class:`Records` made a list and every :class:`Entries` a dict
    (plain values, lists and dicts are looked into as well).

    Example:
        >>> materialize({"a": Records([Entries([("k", 1)])])})
        {'a': [{'k': 1}]}
    """
    if isinstance(value, Records):
        return [materialize(v) for v in value.items]
    if isinstance(value, Entries):
        return {k: materialize(v) for k, v in value.pairs}
    if isinstance(value, dict):
        return {k: materialize(v) for k, v in value.items()}
    if isinstance(value, list):
        return [materialize(v) for v in value]
    return value


def _lazy(o: Any) -> Any:
    """The encoder's hook for the lazy containers (``json`` calls it for types it does not know)."""
    if isinstance(o, Records):
        return list(o.items)
    if isinstance(o, Entries):
        return dict(o.pairs)
    raise TypeError(f"Object of type {type(o).__name__} is not JSON serializable")


# One strict encoder for every piece (json.dumps with options would build one per call).
_dumps = json.JSONEncoder(allow_nan=False, default=_lazy).encode


def _items(value: Any) -> Tuple[bool, Iterator[Tuple[Any, Any]]]:
    """(is an object, its (key, value) pairs; keys ``None`` for an array's items)."""
    if isinstance(value, (dict, Entries)):
        return True, iter(value.items() if isinstance(value, dict) else value.pairs)
    items = value.items if isinstance(value, Records) else value
    return False, ((None, v) for v in items)


def json_pieces(data: Any, *, expand: int = 2, depth: int = 0) -> Iterator[str]:
    """The JSON text of ``data`` in pieces: the first ``expand`` levels of containers one item
    per line (indented two spaces a level), deeper ones compact; no trailing newline.

    Raises:
        ValueError: a float is NaN or infinite (strict JSON has no such numbers).
        TypeError: a value JSON cannot hold.

    Example:
        >>> print("".join(json_pieces({"a": [1, 2], "b": {}}, expand=1)))
        {
          "a": [1, 2],
          "b": {}
        }
    """
    if not isinstance(data, (dict, list, Records, Entries)):
        yield _dumps(data)
        return
    if depth >= expand and not isinstance(data, (Records, Entries)):
        yield _dumps(data)  # compact, as json.dumps writes it
        return
    is_object, pairs = _items(data)
    if depth >= expand:  # a lazy container, compact, item by item
        yield "{" if is_object else "["
        for i, (key, value) in enumerate(pairs):
            yield (", " if i else "") + (_dumps(str(key)) + ": " if is_object else "") + _dumps(value)
        yield "}" if is_object else "]"
        return
    first = next(pairs, None)
    if first is None:
        yield "{}" if is_object else "[]"
        return
    pad, inner = "  " * depth, "  " * (depth + 1)
    yield "{\n" if is_object else "[\n"
    sep = ""
    for key, value in itertools.chain((first,), pairs):
        yield sep + inner + (_dumps(str(key)) + ": " if is_object else "")
        yield from json_pieces(value, expand=expand, depth=depth + 1)
        sep = ",\n"
    yield f"\n{pad}}}" if is_object else f"\n{pad}]"
