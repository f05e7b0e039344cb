"""Minimal protobuf wire-format decoding and encoding, hand-written (no ``protobuf`` package).

Checkpoint bundles store a few small protos (``BundleHeaderProto``, ``BundleEntryProto``,
``TrackableObjectGraph``). Reading them needs only the wire format: varints, fixed32/fixed64 and
length-delimited fields (https://protobuf.dev/programming-guides/encoding/). Decoding is strict
and bounds-checked: any malformed input raises :class:`DecodeError` (a
:class:`~ckptmerge.core.errors.CheckpointFormatError`), never ``IndexError`` or ``struct.error``.
The encoder helpers return ``bytes`` and are used by the bundle writer and by tests.
"""

from __future__ import annotations

import struct
from typing import Dict, Iterator, List, Optional, Tuple, Union

import numpy as np

from ckptmerge.core.errors import CheckpointFormatError

__all__ = [
    "DecodeError",
    "WIRE_VARINT",
    "WIRE_FIXED64",
    "WIRE_BYTES",
    "WIRE_FIXED32",
    "read_varint",
    "varints_at",
    "iter_fields",
    "parse_fields",
    "to_signed64",
    "encode_varint",
    "field_varint",
    "field_bytes",
    "field_fixed32",
    "field_fixed64",
]

WIRE_VARINT = 0
WIRE_FIXED64 = 1
WIRE_BYTES = 2
WIRE_FIXED32 = 5

_U32 = struct.Struct("<I")
_U64 = struct.Struct("<Q")

Buffer = Union[bytes, bytearray, memoryview]
FieldValue = Union[int, bytes]


class DecodeError(CheckpointFormatError):
    """Malformed protobuf or varint data (callers re-raise with the file name)."""


def read_varint(buf: Buffer, pos: int = 0, limit: int = -1) -> Tuple[int, int]:
    """Decode a base-128 varint (at most 10 bytes, < 2**64) at ``pos``.

    Args:
        buf: the bytes.
        pos: where the varint starts.
        limit: end of the readable region (default: ``len(buf)``).

    Returns:
        ``(value, next_pos)``; ``value`` is unsigned (see :func:`to_signed64`).

    Raises:
        DecodeError: if the varint is truncated, longer than 10 bytes or >= 2**64.

    Example:
        >>> read_varint(b"\\xac\\x02")
        (300, 2)
    """
    end = len(buf) if limit < 0 else min(limit, len(buf))
    if pos < end and buf[pos] < 0x80:  # fast path: one byte
        return buf[pos], pos + 1
    result = 0
    shift = 0
    while True:
        if pos >= end:
            raise DecodeError("truncated varint")
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            break
        shift += 7
        if shift >= 70:
            raise DecodeError("varint longer than 10 bytes")
    if result >> 64:
        raise DecodeError("varint does not fit in 64 bits")
    return result, pos


def padded_bytes(data: bytes, length: int) -> np.ndarray:
    """The first ``length`` bytes of ``data`` as a ``uint8`` array followed by 32 zero bytes, as
    :func:`varints_at` reads them (a varint read past the end stops in the padding).

    Example:
        >>> padded_bytes(b"\\x01\\x02\\x03", 2)[:4].tolist()
        [1, 2, 0, 0]
    """
    buf = np.zeros(length + 32, np.uint8)
    buf[:length] = np.frombuffer(data, np.uint8, length)
    return buf


def varints_at(buf: np.ndarray, pos: np.ndarray) -> Optional[Tuple[np.ndarray, np.ndarray]]:
    """Decode the varints starting at every position of ``pos`` at once (numpy, vectorised).

    Args:
        buf: ``uint8`` array, zero-padded by at least 10 bytes past the last byte to read.
        pos: ``int64`` array of positions.

    Returns:
        ``(values, positions after them)`` as ``int64`` arrays, or ``None`` when one of them is
        longer than 9 bytes (``>= 2**63``, or a negative int64): callers then decode those
        the careful way (:func:`read_varint`).

    Example:
        >>> import numpy as np
        >>> values, after = varints_at(np.frombuffer(b"\\x01\\xac\\x02" + bytes(10), np.uint8), np.array([0, 1]))
        >>> values.tolist(), after.tolist()
        ([1, 300], [1, 3])
    """
    b = buf[pos]
    value = b.astype(np.int64)
    after = pos + 1
    more = np.flatnonzero(b >= 0x80)
    if not more.size:
        return value, after
    value &= 0x7F
    shift = 7
    while more.size:
        if shift > 56:
            return None
        b = buf[after[more]]
        value[more] |= (b & 0x7F).astype(np.int64) << shift
        after[more] += 1
        more = more[b >= 0x80]
        shift += 7
    return value, after


def to_signed64(value: int) -> int:
    """Reinterpret an unsigned 64-bit varint value as a two's-complement ``int64``.

    Example:
        >>> to_signed64(2**64 - 1)
        -1
    """
    return value - (1 << 64) if value >> 63 else value


def iter_fields(buf: Buffer) -> Iterator[Tuple[int, int, FieldValue]]:
    """Yield ``(field_no, wire_type, value)`` for every field of a serialized message.

    ``value`` is an ``int`` for varint, fixed32 and fixed64 fields (unsigned) and ``bytes`` for
    length-delimited ones (sub-messages, strings, packed repeated fields); a ``memoryview``
    message gives ``memoryview`` slices instead, without copying.

    Raises:
        DecodeError: on a truncated field, a bad tag, field number 0, or group wire types.

    Example:
        >>> list(iter_fields(field_varint(1, 150) + field_bytes(2, b"hi")))
        [(1, 0, 150), (2, 2, b'hi')]
    """
    n = len(buf)
    pos = 0
    view = isinstance(buf, memoryview)
    while pos < n:
        tag = buf[pos]
        if tag < 0x80:  # fast path: one-byte tag (field numbers 1-15)
            pos += 1
        else:
            tag, pos = read_varint(buf, pos)
        field_no, wire = tag >> 3, tag & 7
        if field_no == 0 or field_no > 0x1FFFFFFF:
            raise DecodeError(f"invalid protobuf field number {field_no}")
        if wire == WIRE_VARINT:
            value, pos = read_varint(buf, pos)
            yield field_no, wire, value
        elif wire == WIRE_BYTES:
            size, pos = read_varint(buf, pos)
            if size > n - pos:
                raise DecodeError(f"protobuf field {field_no} of {size} bytes runs past the "
                                  f"end of the message ({n - pos} bytes left)")
            yield field_no, wire, buf[pos:pos + size] if view else bytes(buf[pos:pos + size])
            pos += size
        elif wire == WIRE_FIXED32:
            if pos + 4 > n:
                raise DecodeError(f"truncated fixed32 protobuf field {field_no}")
            yield field_no, wire, _U32.unpack_from(buf, pos)[0]
            pos += 4
        elif wire == WIRE_FIXED64:
            if pos + 8 > n:
                raise DecodeError(f"truncated fixed64 protobuf field {field_no}")
            yield field_no, wire, _U64.unpack_from(buf, pos)[0]
            pos += 8
        else:
            raise DecodeError(f"unsupported protobuf wire type {wire} for field {field_no}")


def parse_fields(buf: Buffer) -> Dict[int, List[Tuple[int, FieldValue]]]:
    """Group a message's fields by number: ``{field_no: [(wire_type, value), ...]}``.

    Example:
        >>> parse_fields(field_varint(1, 7) + field_varint(1, 8))
        {1: [(0, 7), (0, 8)]}
    """
    out: Dict[int, List[Tuple[int, FieldValue]]] = {}
    for no, wire, value in iter_fields(buf):
        out.setdefault(no, []).append((wire, value))
    return out


def encode_varint(value: int) -> bytes:
    """Encode an int as a varint; negative values as 10-byte two's complement (like int64).

    Example:
        >>> encode_varint(300)
        b'\\xac\\x02'
    """
    if value < 0:
        value += 1 << 64
    if not 0 <= value < (1 << 64):
        raise ValueError(f"varint value out of range: {value!r}")
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _tag(field_no: int, wire: int) -> bytes:
    return encode_varint((field_no << 3) | wire)


def field_varint(field_no: int, value: int) -> bytes:
    """Encode a varint field (int32/int64/uint64/bool/enum).

    Example:
        >>> field_varint(1, 150)
        b'\\x08\\x96\\x01'
    """
    return _tag(field_no, WIRE_VARINT) + encode_varint(int(value))


def field_bytes(field_no: int, value: Union[bytes, bytearray, memoryview, str]) -> bytes:
    """Encode a length-delimited field (bytes, string - UTF-8 encoded - or a sub-message).

    Example:
        >>> field_bytes(2, "hi")
        b'\\x12\\x02hi'
    """
    data = value.encode("utf-8") if isinstance(value, str) else bytes(value)
    return _tag(field_no, WIRE_BYTES) + encode_varint(len(data)) + data


def field_fixed32(field_no: int, value: int) -> bytes:
    """Encode a fixed32 field (unsigned, little-endian).

    Example:
        >>> field_fixed32(6, 1)
        b'5\\x01\\x00\\x00\\x00'
    """
    return _tag(field_no, WIRE_FIXED32) + _U32.pack(value & 0xFFFFFFFF)


def field_fixed64(field_no: int, value: int) -> bytes:
    """Encode a fixed64 field (unsigned, little-endian).

    Example:
        >>> field_fixed64(1, 1)
        b'\\t\\x01\\x00\\x00\\x00\\x00\\x00\\x00\\x00'
    """
    return _tag(field_no, WIRE_FIXED64) + _U64.pack(value & 0xFFFFFFFFFFFFFFFF)
