"""Boxes of a tensor: exact tilings and C-order blocks, by shape arithmetic alone.

A partitioned tensor is stored as slices, each a box of the full tensor (a ``(start, stop)``
pair per dimension). Reading one is safe only when its slices tile the tensor exactly: every
element in exactly one slice, or part of the result would be uninitialised memory
(:func:`first_overlap` finds two slices sharing an element). Reading a tensor in bounded pieces
walks it in C order in blocks of whole rows (:func:`c_order_blocks`), each block meeting a
slice in bytes that are contiguous in that slice (:func:`contiguous_span`). No I/O here.
"""

from __future__ import annotations

import heapq
from typing import Iterator, List, Optional, Sequence, Tuple

__all__ = ["Box", "volume", "intersect", "first_overlap", "c_order_blocks", "contiguous_span"]

#: ``(start, stop)`` per dimension, half-open.
Box = Tuple[Tuple[int, int], ...]


def volume(box: Box) -> int:
    """The number of elements of ``box`` (1 for the box of a scalar).

    Example:
        >>> volume(((0, 2), (1, 4)))
        6
    """
    n = 1
    for start, stop in box:
        n *= max(stop - start, 0)
    return n


def intersect(a: Box, b: Box) -> Optional[Box]:
    """The box both ``a`` and ``b`` cover, or ``None`` when they share no element.

    Example:
        >>> intersect(((0, 4),), ((2, 6),))
        ((2, 4),)
        >>> intersect(((0, 2),), ((2, 4),)) is None
        True
    """
    out = tuple((max(a0, b0), min(a1, b1)) for (a0, a1), (b0, b1) in zip(a, b))
    if any(start >= stop for start, stop in out):
        return None
    return out


def first_overlap(boxes: Sequence[Box]) -> Optional[Tuple[int, int]]:
    """Indices ``(i, j)`` of two boxes sharing an element, or ``None`` if no two do.

    A sweep along the dimension where the boxes start at the most distinct places: a tensor
    partitioned along one axis is checked in ``O(n log n)``, a grid of partitions in
    ``O(n * row length)``.

    Example:
        >>> first_overlap([((0, 2),), ((2, 4),)]) is None
        True
        >>> first_overlap([((0, 2),), ((1, 3),)])
        (0, 1)
    """
    nonempty = [(i, b) for i, b in enumerate(boxes) if volume(b) > 0]
    if len(nonempty) < 2:
        return None
    rank = len(nonempty[0][1])
    if rank == 0:  # two slices of a scalar both hold its one element
        return nonempty[0][0], nonempty[1][0]
    axis = max(range(rank), key=lambda d: len({b[d][0] for _, b in nonempty}))
    nonempty.sort(key=lambda ib: (ib[1][axis][0], ib[0]))
    active: List[Tuple[int, int, Box]] = []  # heap of (stop along axis, index, box)
    for i, box in nonempty:
        while active and active[0][0] <= box[axis][0]:
            heapq.heappop(active)
        for _, j, other in active:
            if intersect(box, other) is not None:
                return min(i, j), max(i, j)
        heapq.heappush(active, (box[axis][1], i, box))
    return None


def c_order_blocks(shape: Sequence[int], max_elements: int) -> Iterator[Box]:
    """Split a tensor into consecutive blocks in C order, each of at most ``max_elements``.

    Each block is a run of whole rows: fixed indices in the leading dimensions, a range in the
    next one, and the full extent of every later dimension. So the block's part of any slice
    (any box) is contiguous in that slice's C-order storage, and the blocks, concatenated
    flat, are the tensor flattened. An empty tensor has no blocks.

    Example:
        >>> list(c_order_blocks((3, 2), 4))
        [((0, 2), (0, 2)), ((2, 3), (0, 2))]
        >>> list(c_order_blocks((2, 3), 2))[:2]
        [((0, 1), (0, 2)), ((0, 1), (2, 3))]
    """
    if max_elements < 1:
        raise ValueError(f"max_elements must be at least 1. Received: max_elements={max_elements!r}")
    shape = tuple(int(d) for d in shape)
    if any(d == 0 for d in shape):
        return
    rank = len(shape)
    trailing = 1  # elements of one row at level k: the product of shape[k:]
    k = rank
    while k > 0 and trailing * shape[k - 1] <= max_elements:
        k -= 1
        trailing *= shape[k]
    if k == 0:
        yield tuple((0, d) for d in shape)
        return
    rows = max_elements // trailing  # >= 1 rows of dimension k - 1 per block
    tail = tuple((0, d) for d in shape[k:])
    outer = [0] * (k - 1)
    while True:
        head = tuple((i, i + 1) for i in outer)
        for start in range(0, shape[k - 1], rows):
            yield head + ((start, min(start + rows, shape[k - 1])),) + tail
        for d in range(k - 2, -1, -1):  # next index of the leading dimensions, C order
            outer[d] += 1
            if outer[d] < shape[d]:
                break
            outer[d] = 0
        else:
            return


def contiguous_span(shape: Sequence[int], box: Box) -> Tuple[int, int]:
    """``(first element, element count)`` of ``box`` in the C-order storage of ``shape``.

    Raises:
        ValueError: if the box is not one contiguous run of that storage.

    Example:
        >>> contiguous_span((4, 3), ((1, 3), (0, 3)))
        (3, 6)
    """
    first = 0
    for (start, _), dim in zip(box, shape):
        first = first * dim + start
    extents = [stop - start for start, stop in box]
    # contiguous: one index in each dimension up to some j, a range in j, full dims after it
    j = next((d for d, n in enumerate(extents) if n != 1), len(extents))
    if any(box[d] != (0, shape[d]) for d in range(j + 1, len(shape))):
        raise ValueError(f"box {box} is not contiguous in C order within shape {tuple(shape)}")
    return first, volume(box)
