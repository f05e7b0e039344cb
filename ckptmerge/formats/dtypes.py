"""TensorFlow ``DataType`` enum values and their numpy dtypes, without importing TensorFlow.

Checkpoint bundles record each tensor's dtype as the integer of TF's ``DataType`` enum
(``tensorflow/core/framework/types.proto``). This module maps those integers to numpy dtypes and
back, and gives the short numpy-style names ckptmerge uses everywhere (``"float32"``,
``"bfloat16"``, ``"string"``). ``bfloat16``, the float8 family and ``int4`` come from
``ml_dtypes``, the same package TensorFlow and JAX use, so arrays are bit-compatible with theirs.
Strings are numpy ``object`` arrays of ``bytes``, as ``tf.train.load_checkpoint`` returns them.
The bundle writer reuses this module.
"""

from __future__ import annotations

from typing import Any, Dict

import ml_dtypes
import numpy as np

from ckptmerge.errors import CheckpointFormatError

__all__ = [
    "TF_TO_NUMPY",
    "TF_DTYPE_NAMES",
    "DT_FLOAT",
    "DT_STRING",
    "DT_RESOURCE",
    "DT_VARIANT",
    "numpy_dtype",
    "numpy_to_tf",
    "dtype_name",
    "tf_dtype_name",
]

DT_INVALID = 0
DT_FLOAT = 1
DT_STRING = 7
DT_RESOURCE = 20
DT_VARIANT = 21

#: Every ``DataType`` enum value with its TF name (``tf.dtypes.DType.name``).
TF_DTYPE_NAMES: Dict[int, str] = {
    1: "float32", 2: "float64", 3: "int32", 4: "uint8", 5: "int16", 6: "int8", 7: "string",
    8: "complex64", 9: "int64", 10: "bool", 11: "qint8", 12: "quint8", 13: "qint32",
    14: "bfloat16", 15: "qint16", 16: "quint16", 17: "uint16", 18: "complex128", 19: "float16",
    20: "resource", 21: "variant", 22: "uint32", 23: "uint64", 24: "float8_e5m2",
    25: "float8_e4m3fn", 26: "float8_e4m3fnuz", 27: "float8_e4m3b11fnuz", 28: "float8_e5m2fnuz",
    29: "int4", 30: "uint4", 31: "int2", 32: "uint2", 33: "float4_e2m1fn",
}

_PLAIN = {1: np.float32, 2: np.float64, 3: np.int32, 4: np.uint8, 5: np.int16, 6: np.int8,
          8: np.complex64, 9: np.int64, 10: np.bool_, 17: np.uint16, 18: np.complex128,
          19: np.float16, 22: np.uint32, 23: np.uint64}
# Quantized types are structured dtypes with one named field, exactly as TensorFlow's
# ``DType.as_numpy_dtype`` gives them, so they never collide with the plain integer types.
_QUANTIZED = {11: ("qint8", "<i1"), 12: ("quint8", "<u1"), 13: ("qint32", "<i4"),
              15: ("qint16", "<i2"), 16: ("quint16", "<u2")}

#: ``DataType`` enum value -> numpy dtype, for every type a checkpoint can hold values of
#: (not ``resource``/``variant``, whose values are not plain data).
TF_TO_NUMPY: Dict[int, np.dtype] = {k: np.dtype(v) for k, v in _PLAIN.items()}
TF_TO_NUMPY[DT_STRING] = np.dtype(object)
TF_TO_NUMPY.update({k: np.dtype([(n, t)]) for k, (n, t) in _QUANTIZED.items()})
for _enum in range(14, 34):
    _name = TF_DTYPE_NAMES.get(_enum, "")
    if _enum not in TF_TO_NUMPY and hasattr(ml_dtypes, _name):  # older ml_dtypes lack some
        TF_TO_NUMPY[_enum] = np.dtype(getattr(ml_dtypes, _name))

_NAME_TO_TF: Dict[str, int] = {dtype_name_: enum for enum, dtype_name_ in TF_DTYPE_NAMES.items()}


def tf_dtype_name(tf_enum: int) -> str:
    """Return the numpy-style name of a ``DataType`` enum value, e.g. ``1 -> "float32"``.

    Unknown values give ``"dtype_<n>"`` rather than failing, so listing a checkpoint written by a
    newer TensorFlow still works.

    Example:
        >>> tf_dtype_name(14)
        'bfloat16'
    """
    return TF_DTYPE_NAMES.get(tf_enum, f"dtype_{tf_enum}")


def numpy_dtype(tf_enum: int) -> np.dtype:
    """Return the numpy dtype holding values of ``DataType`` ``tf_enum``.

    Raises:
        CheckpointFormatError: for ``resource``, ``variant`` and unknown enum values.

    Example:
        >>> numpy_dtype(1)
        dtype('float32')
    """
    try:
        return TF_TO_NUMPY[tf_enum]
    except (KeyError, TypeError):
        raise CheckpointFormatError(
            f"TensorFlow dtype {tf_dtype_name(tf_enum)!r} (DataType enum {tf_enum!r}) has no "
            "numpy equivalent; ckptmerge reads plain numeric, bool and string tensors only."
        ) from None


def numpy_to_tf(dtype: Any) -> int:
    """Return the ``DataType`` enum value for a numpy dtype (or anything ``np.dtype`` accepts).

    ``object``, ``bytes`` and ``str`` dtypes map to ``DT_STRING``.

    Raises:
        CheckpointFormatError: if TensorFlow checkpoints cannot hold this dtype.

    Example:
        >>> numpy_to_tf("float32"), numpy_to_tf(ml_dtypes.bfloat16)
        (1, 14)
    """
    try:
        dt = np.dtype(dtype)
    except TypeError:
        raise CheckpointFormatError(f"Not a dtype: {dtype!r}.") from None
    enum = _NAME_TO_TF.get(dtype_name(dt))
    if enum is None or enum not in TF_TO_NUMPY or (dt.names is None and enum in _QUANTIZED):
        raise CheckpointFormatError(
            f"numpy dtype {dt!r} cannot be stored in a TensorFlow checkpoint; use one of: "
            + ", ".join(sorted({dtype_name(d) for d in TF_TO_NUMPY.values()})) + "."
        )
    if dt.names is None and dt.byteorder == ">":
        raise CheckpointFormatError(
            f"numpy dtype {dt!r} is big-endian; checkpoints are little-endian. "
            "Convert with arr.astype(arr.dtype.newbyteorder('<')) first."
        )
    return enum


def dtype_name(dtype: Any) -> str:
    """Return ckptmerge's short name of a numpy dtype: ``"float32"``, ``"bfloat16"``, ``"string"``.

    Accepts a numpy dtype, anything ``np.dtype`` accepts, or a ``DataType`` enum ``int``.

    Example:
        >>> dtype_name(np.dtype(object)), dtype_name(ml_dtypes.bfloat16), dtype_name(np.bool_)
        ('string', 'bfloat16', 'bool')
    """
    if isinstance(dtype, (int, np.integer)) and not isinstance(dtype, bool):
        return tf_dtype_name(int(dtype))
    dt = np.dtype(dtype)
    if dt.kind in "OSU":
        return "string"
    if dt.names is not None and len(dt.names) == 1 and dt.names[0] in _NAME_TO_TF:
        return dt.names[0]  # quantized, e.g. [("qint8", "i1")]
    return dt.name

