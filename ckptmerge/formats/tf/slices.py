"""Partitioned (sliced) tensors: TF's slice keys and the assembly of slices into a full tensor.

A partitioned variable is stored as slices of the full tensor, each under a key made by TF's
``EncodeTensorNameSlice`` (``tensorflow/core/util/saved_tensor_slice_util.cc``: the name and each
dimension's start and length in OrderedCode, ``tensorflow/core/lib/strings/ordered_code.cc``).
Both the V2 bundle and the V1 format use these keys. :func:`slice_boxes` checks that a set of
slices tiles the full tensor exactly (in bounds, no overlap, no gap) before anything is
allocated, and says where each slice goes (box arithmetic is :mod:`ckptmerge.formats.tf.regions`).
"""

from __future__ import annotations

from typing import List, Sequence, Tuple

from ckptmerge.formats.tf.regions import Box, first_overlap, volume

__all__ = ["Extents", "SliceError", "encode_tensor_name_slice", "slice_boxes", "numel"]

#: ``(start, length)`` per dimension; ``length == -1`` for a full dimension.
Extents = Tuple[Tuple[int, int], ...]

_LENGTH_TO_HEADER_BITS = ((0, 0), (0x80, 0), (0xC0, 0), (0xE0, 0), (0xF0, 0), (0xF8, 0),
                          (0xFC, 0), (0xFE, 0), (0xFF, 0), (0xFF, 0x80), (0xFF, 0xC0))


class SliceError(Exception):
    """Slices that do not tile their tensor; the reader adds its file name."""


def numel(shape: Sequence[int]) -> int:
    """The number of elements of ``shape`` (a Python int: no overflow).

    Example:
        >>> numel((3, 4)), numel(())
        (12, 1)
    """
    n = 1
    for d in shape:
        n *= d
    return n


def _num_increasing(value: int) -> bytes:
    body = value.to_bytes((value.bit_length() + 7) // 8, "big") if value else b""
    return bytes([len(body)]) + body


def _signed_num_increasing(value: int) -> bytes:
    x = ~value if value < 0 else value
    if x < 64:
        return bytes([(0x80 ^ value) & 0xFF])
    n = x.bit_length() // 7 + 1
    buf = bytearray((value & ((1 << 80) - 1)).to_bytes(10, "big"))[10 - n:]
    buf[0] ^= _LENGTH_TO_HEADER_BITS[n][0]
    buf[1] ^= _LENGTH_TO_HEADER_BITS[n][1]
    return bytes(buf)


def _ordered_string(value: bytes) -> bytes:
    return value.replace(b"\xff", b"\xff\x00").replace(b"\x00", b"\x00\xff") + b"\x00\x01"


def encode_tensor_name_slice(name: str, extents: Sequence[Tuple[int, int]]) -> bytes:
    """Return TF's key for one slice of a tensor (``EncodeTensorNameSlice``).

    Args:
        name: the full tensor's key.
        extents: ``(start, length)`` per dimension; ``length == -1`` for a full dimension.

    Example:
        >>> encode_tensor_name_slice("w", [(0, -1)])
        b'\\x00w\\x00\\x01\\x01\\x01\\x80\\x7f'
    """
    out = [_num_increasing(0), _ordered_string(name.encode("utf-8")), _num_increasing(len(extents))]
    for start, length in extents:
        out.append(_signed_num_increasing(start))
        out.append(_signed_num_increasing(length))
    return b"".join(out)


def slice_boxes(key: str, shape: Tuple[int, ...], slices: Sequence[Extents]) -> List[Box]:
    """The box of the full tensor each slice of tensor ``key`` covers, after checking that the
    slices tile it exactly (anything else would leave uninitialised memory in the result).

    Args:
        key: the tensor's key (for messages).
        shape: the full tensor's shape.
        slices: the extents of each slice.

    Returns:
        One :data:`~ckptmerge.formats.tf.regions.Box` per slice, in the order given.

    Raises:
        SliceError: a slice of the wrong rank or outside the shape, two slices sharing an
            element, or slices that leave part of the tensor uncovered.

    Example:
        >>> slice_boxes("w", (4, 2), [((0, 2), (0, -1)), ((2, 2), (0, -1))])
        [((0, 2), (0, 2)), ((2, 4), (0, 2))]
    """
    boxes: List[Box] = []
    for extents in slices:
        if len(extents) != len(shape):
            raise SliceError(f"tensor {key!r} of rank {len(shape)} has a slice of rank {len(extents)}")
        box = []
        for (start, length), dim in zip(extents, shape):
            stop = dim if length == -1 else start + length
            if start < 0 or length < -1 or stop > dim or (length == -1 and start != 0):
                raise SliceError(f"tensor {key!r} has slice {extents} outside its shape {shape}")
            box.append((start, stop))
        boxes.append(tuple(box))
    pair = first_overlap(boxes)
    if pair is not None:
        a, b = (list(slices[i]) for i in pair)
        raise SliceError(f"slices {a} and {b} of tensor {key!r} overlap (each element must be "
                         "stored in exactly one slice)")
    covered = sum(volume(b) for b in boxes)
    if covered != numel(shape):
        raise SliceError(f"the slices of tensor {key!r} cover {covered} of its {numel(shape)} elements")
    return boxes
