"""TensorFlow's framework protos that checkpoints embed, decoded without TensorFlow.

``TensorShapeProto`` and ``TensorSliceProto`` (``tensorflow/core/framework/tensor_shape.proto``,
``tensor_slice.proto``) appear in V2 bundle entries and in V1 metadata; ``TensorProto``
(``tensor.proto``) holds the values of V1 checkpoints, either in a typed repeated field
(``float_val``, ``int_val``, ``half_val``, ``string_val``, ...) or as raw bytes in
``tensor_content``. :func:`decode_tensor_values` turns one into a numpy array exactly as
TensorFlow's ``TensorSliceReader`` does (each C++ ``static_cast`` reproduced, ``half_val`` holding
the raw 16 bits). Malformed input raises :class:`~ckptmerge.formats.tf.protowire.DecodeError`.
"""

from __future__ import annotations

import functools
from typing import Dict, List, Tuple

import numpy as np

from ckptmerge.formats.dtypes import DT_STRING, TF_TO_NUMPY, tf_dtype_name
from ckptmerge.formats.tf.protowire import (
    WIRE_BYTES,
    WIRE_FIXED32,
    WIRE_FIXED64,
    WIRE_VARINT,
    DecodeError,
    iter_fields,
    to_signed64,
)

__all__ = ["int64_field", "parse_shape", "parse_slice", "decode_packed_varints", "decode_tensor_values"]


def int64_field(value: object, what: str) -> int:
    """A varint field's value as a signed ``int64`` (``DecodeError`` for another wire type).

    Example:
        >>> int64_field(2**64 - 1, "size")
        -1
    """
    if not isinstance(value, int):
        raise DecodeError(f"{what} has the wrong wire type")
    return to_signed64(value)


@functools.lru_cache(maxsize=4096)  # checkpoints repeat shapes a lot; parsing is pure
def parse_shape(buf: bytes) -> Tuple[int, ...]:
    """Decode a ``TensorShapeProto`` into a shape tuple (unknown rank and negative sizes refused).

    Example:
        >>> parse_shape(b"\\x12\\x02\\x08\\x03")
        (3,)
    """
    dims: List[int] = []
    for no, wire, value in iter_fields(buf):
        if no == 2:
            if wire != WIRE_BYTES:
                raise DecodeError("TensorShapeProto.dim has the wrong wire type")
            size = 0
            for dno, _, dval in iter_fields(value):  # type: ignore[arg-type]
                if dno == 1:
                    size = int64_field(dval, "dimension size")
            if size < 0:
                raise DecodeError(f"negative dimension size {size}")
            dims.append(size)
        elif no == 3 and value:
            raise DecodeError("tensor of unknown rank")
    return tuple(dims)


def parse_slice(buf: bytes) -> Tuple[Tuple[int, int], ...]:
    """Decode a ``TensorSliceProto`` into ``(start, length)`` per dimension (``-1``: full).

    Example:
        >>> parse_slice(b"\\x0a\\x00\\x0a\\x04\\x08\\x02\\x10\\x03")
        ((0, -1), (2, 3))
    """
    extents: List[Tuple[int, int]] = []
    for no, wire, value in iter_fields(buf):
        if no == 1:
            if wire != WIRE_BYTES:
                raise DecodeError("TensorSliceProto.extent has the wrong wire type")
            start, length = 0, -1
            for eno, _, eval_ in iter_fields(value):  # type: ignore[arg-type]
                if eno == 1:
                    start = int64_field(eval_, "slice start")
                elif eno == 2:
                    length = int64_field(eval_, "slice length")
            extents.append((start, length))
    return tuple(extents)


def decode_packed_varints(buf: bytes) -> np.ndarray:
    """Decode back-to-back varints (a packed repeated field) into a ``uint64`` array, vectorised.

    Raises:
        DecodeError: a truncated varint, or one longer than 10 bytes or >= 2**64.

    Example:
        >>> decode_packed_varints(b"\\x01\\xac\\x02").tolist()
        [1, 300]
    """
    b = np.frombuffer(buf, np.uint8)
    if not len(b):
        return np.zeros(0, np.uint64)
    last = b < 0x80
    if not last[-1]:
        raise DecodeError("truncated varint in a packed field")
    if last.all():
        return b.astype(np.uint64)
    ends = np.flatnonzero(last)
    starts = np.empty_like(ends)
    starts[0] = 0
    starts[1:] = ends[:-1] + 1
    lengths = ends - starts + 1
    longest = int(lengths.max())
    if longest > 10:
        raise DecodeError("varint longer than 10 bytes in a packed field")
    if (b[ends[lengths == 10]] > 1).any():
        raise DecodeError("varint does not fit in 64 bits in a packed field")
    # One pass per byte position (at most 10), each over all varints at once.
    padded = np.concatenate([b, np.zeros(longest, np.uint8)])
    out = np.zeros(len(starts), np.uint64)
    for k in range(longest):
        group = (padded[starts + k] & 0x7F).astype(np.uint64)
        group[lengths <= k] = 0
        out |= group << np.uint64(7 * k)
    return out


# TensorProto field holding each dtype's values, as TF's SaveTypeTraits pick them
# (tensorflow/core/util/saved_tensor_slice_util.h), and how the wire values become the dtype.
_FLOAT, _DOUBLE, _INT, _STRING, _SCOMPLEX, _INT64, _BOOL, _DCOMPLEX, _HALF, _UINT32, _UINT64 = (
    5, 6, 7, 8, 9, 10, 11, 12, 13, 16, 17)
_TENSOR_CONTENT = 4
_VALUE_FIELD: Dict[int, int] = {
    1: _FLOAT, 2: _DOUBLE, 3: _INT, 4: _INT, 5: _INT, 6: _INT, 7: _STRING, 8: _SCOMPLEX,
    9: _INT64, 10: _BOOL, 11: _INT, 12: _INT, 13: _INT, 14: _HALF, 15: _INT, 16: _INT,
    17: _INT, 18: _DCOMPLEX, 19: _HALF, 22: _UINT32, 23: _UINT64,
}
_FIXED = {_FLOAT: ("<f4", WIRE_FIXED32), _DOUBLE: ("<f8", WIRE_FIXED64),
          _SCOMPLEX: ("<f4", WIRE_FIXED32), _DCOMPLEX: ("<f8", WIRE_FIXED64)}


def _fixed_values(chunks: List[Tuple[int, object]], dtype: str, wire: int, field: int) -> np.ndarray:
    item = np.dtype(dtype)
    if len(chunks) == 1 and chunks[0][0] == WIRE_BYTES and not len(chunks[0][1]) % item.itemsize:  # type: ignore[arg-type]
        return np.frombuffer(chunks[0][1], item)  # type: ignore[call-overload]  # the usual packed field
    parts = []
    for w, value in chunks:
        if w == WIRE_BYTES:
            if len(value) % item.itemsize:  # type: ignore[arg-type]
                raise DecodeError(f"packed TensorProto field {field} of {len(value)} bytes is not "  # type: ignore[arg-type]
                                  f"a whole number of {item.itemsize}-byte values")
            parts.append(bytes(value))  # type: ignore[call-overload]
        elif w == wire:
            parts.append(int(value).to_bytes(item.itemsize, "little"))  # type: ignore[call-overload]
        else:
            raise DecodeError(f"TensorProto field {field} has wire type {w}")
    return np.frombuffer(b"".join(parts), item)  # type: ignore[arg-type]


def _varint_values(chunks: List[Tuple[int, object]], field: int) -> np.ndarray:
    parts = []
    for w, value in chunks:
        if w == WIRE_BYTES:
            parts.append(decode_packed_varints(value))  # type: ignore[arg-type]
        elif w == WIRE_VARINT:
            parts.append(np.array([value], np.uint64))
        else:
            raise DecodeError(f"TensorProto field {field} has wire type {w}")
    return np.concatenate(parts) if len(parts) != 1 else parts[0]


def _cast_varints(raw: np.ndarray, dtype_enum: int, target: np.dtype) -> np.ndarray:
    """Wire values (uint64, sign-extended) to the dtype, as the C++ ``static_cast`` does."""
    if dtype_enum == 10:
        return raw != 0
    if dtype_enum in (14, 19):  # half_val holds the 16 raw bits
        return raw.astype(np.uint16).view(target)
    base = target.fields[target.names[0]][0] if target.names else target  # quantized: its int type
    out = raw.astype(np.dtype(f"u{base.itemsize}")).view(base)  # truncation = static_cast
    return out.view(target) if target.names else out


def decode_tensor_values(buf: bytes, dtype_enum: int, count: int) -> np.ndarray:
    """Decode the values of a serialized ``TensorProto`` into a 1-D array of ``count`` elements.

    Values come from the typed field TensorFlow's V1 writer uses for the dtype, or else from
    ``tensor_content`` (raw little-endian bytes). Strings come back as an ``object`` array of
    ``bytes``.

    Args:
        buf: the serialized ``TensorProto`` (a ``memoryview`` avoids copying its values).
        dtype_enum: the tensor's ``DataType`` (the proto's own ``dtype`` may be unset).
        count: the number of elements expected.

    Raises:
        DecodeError: malformed proto, another dtype, or not exactly ``count`` values.

    Example:
        >>> decode_tensor_values(b"\\x2a\\x04\\x00\\x00\\x80\\x3f", 1, 1)
        array([1.], dtype=float32)
    """
    target = TF_TO_NUMPY.get(dtype_enum)
    if target is None:
        raise DecodeError(f"values of dtype {tf_dtype_name(dtype_enum)!r} are not plain data")
    field = _VALUE_FIELD.get(dtype_enum, 0)
    chunks: List[Tuple[int, object]] = []
    content = b""
    for no, wire, value in iter_fields(buf):
        if no == 1:
            if int64_field(value, "TensorProto.dtype") not in (0, dtype_enum):
                raise DecodeError(f"values are of dtype {tf_dtype_name(value)!r}, the tensor is "  # type: ignore[arg-type]
                                  f"{tf_dtype_name(dtype_enum)!r}")
        elif no == field:
            chunks.append((wire, value))
        elif no == _TENSOR_CONTENT:
            if wire != WIRE_BYTES:
                raise DecodeError("TensorProto.tensor_content has the wrong wire type")
            content = value  # type: ignore[assignment]
    if dtype_enum == DT_STRING:
        if any(w != WIRE_BYTES for w, _ in chunks):
            raise DecodeError("TensorProto.string_val has the wrong wire type")
        values = np.empty(len(chunks), dtype=object)
        values[:] = [bytes(v) for _, v in chunks]  # type: ignore[call-overload]
    elif chunks and field in _FIXED:
        values = _fixed_values(chunks, _FIXED[field][0], _FIXED[field][1], field)
        if field in (_SCOMPLEX, _DCOMPLEX):
            if len(values) % 2:
                raise DecodeError(f"complex TensorProto field {field} holds an odd number of floats")
            values = values.view(target)
        values = values.astype(target, copy=True)  # writeable and aligned; a no-op dtype-wise
    elif chunks:
        values = _cast_varints(_varint_values(chunks, field), dtype_enum, target)
    elif content:
        if len(content) != count * target.itemsize:
            raise DecodeError(f"tensor_content has {len(content)} bytes, {count} values of "
                              f"{tf_dtype_name(dtype_enum)} need {count * target.itemsize}")
        values = np.frombuffer(content, target).copy()  # type: ignore[call-overload]
    else:
        values = np.zeros(0, target)
    if len(values) != count:
        raise DecodeError(f"{len(values)} values stored, the slice has {count} elements")
    return values
