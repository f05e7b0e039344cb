"""TensorFlow ``DataType`` enum values and their numpy dtypes, without importing TensorFlow.

Checkpoint bundles record each tensor's dtype as the integer of TF's ``DataType`` enum
(``tensorflow/core/framework/types.proto``). This module maps those integers to numpy dtypes and
back, and gives the short numpy-style names ckptmerge uses everywhere (``"float32"``,
``"bfloat16"``, ``"string"``). ``bfloat16``, the float8 family and ``int4`` come from
``ml_dtypes``, the same package TensorFlow and JAX use, so arrays are bit-compatible with theirs.
``ml_dtypes`` is imported on first use, not with this module (its import costs about a second
of CPU, more than the rest of ``ckptmerge ls``): names and sizes (:data:`ML_ITEMSIZE`) are known
without it, so listing a checkpoint never needs it; :data:`TF_TO_NUMPY` (a :class:`LazyDtypes`)
imports it the first time one of its types is asked for.
Strings are numpy ``object`` arrays of ``bytes``, as ``tf.train.load_checkpoint`` returns them.
The bundle writer reuses this module.
"""

from __future__ import annotations

from typing import Any, Dict, Hashable, Iterator, Mapping, Optional

import numpy as np

from ckptmerge.core.errors import CheckpointFormatError

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
    "ML_ITEMSIZE",
    "ml_dtype",
    "LazyDtypes",
    "TF_ITEMSIZE",
    "as_dtype",
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

#: The ``ml_dtypes`` types ckptmerge knows, by name, with the bytes one element takes in memory
#: (sub-byte types take one byte each, as in ml_dtypes): enough to list a checkpoint without it.
ML_ITEMSIZE: Dict[str, int] = {
    "bfloat16": 2, "float8_e3m4": 1, "float8_e4m3": 1, "float8_e4m3fn": 1, "float8_e4m3fnuz": 1,
    "float8_e4m3b11fnuz": 1, "float8_e5m2": 1, "float8_e5m2fnuz": 1, "float8_e8m0fnu": 1, "float4_e2m1fn": 1,
    "float6_e2m3fn": 1, "float6_e3m2fn": 1, "int2": 1, "int4": 1, "uint2": 1, "uint4": 1,
}

_ML: Any = None


def ml_dtype(name: str) -> Optional[np.dtype]:
    """The numpy dtype of the ``ml_dtypes`` type ``name`` (``"bfloat16"``), or ``None`` if the
    installed ml_dtypes has no such type; ml_dtypes is imported on the first call.

    Raises:
        CheckpointFormatError: ml_dtypes is not installed (it comes with TensorFlow and JAX).

    Example:
        >>> ml_dtype("bfloat16").itemsize, ml_dtype("float99")
        (2, None)
    """
    global _ML
    if _ML is None:
        try:
            import ml_dtypes
        except ImportError:  # pragma: no cover - a dependency of ckptmerge, TensorFlow and JAX
            raise CheckpointFormatError(f"Reading or writing {name} values needs the 'ml_dtypes' package: "
                                        "pip install ml_dtypes") from None
        _ML = ml_dtypes
    if name not in ML_ITEMSIZE:
        return None
    t = getattr(_ML, name, None)
    return None if t is None else np.dtype(t)


def as_dtype(dtype: Any) -> np.dtype:
    """``np.dtype(dtype)``, with the ml_dtypes names (``"bfloat16"``) understood whether or not
    ml_dtypes was imported yet (numpy knows them only after).

    Example:
        >>> as_dtype("bfloat16").itemsize, as_dtype("<f4")
        (2, dtype('float32'))
    """
    if isinstance(dtype, str) and dtype in ML_ITEMSIZE:
        dt = ml_dtype(dtype)
        if dt is not None:
            return dt
    return np.dtype(dtype)


class LazyDtypes(Mapping):
    """A read-only ``{key: numpy dtype}`` table whose ``ml_dtypes`` entries are made on first use.

    ``plain`` maps keys to dtypes numpy has; ``named`` maps keys to ml_dtypes type names. Asking
    for a plain key never imports ml_dtypes; asking for a named one (or iterating) does, and a
    name the installed ml_dtypes lacks is no entry.

    Example:
        >>> table = LazyDtypes({"F32": np.dtype("<f4")}, {"BF16": "bfloat16"})
        >>> table["F32"], table["BF16"].name, "F99" in table
        (dtype('float32'), 'bfloat16', False)
    """

    def __init__(self, plain: Mapping[Hashable, np.dtype], named: Mapping[Hashable, str]) -> None:
        self._plain, self._named = dict(plain), dict(named)
        self._made: Dict[Hashable, Optional[np.dtype]] = {}

    def plain(self) -> Dict[Hashable, np.dtype]:
        """The entries numpy has by itself (no ml_dtypes import)."""
        return dict(self._plain)

    def named(self) -> Dict[Hashable, str]:
        """The ml_dtypes entries, ``{key: ml_dtypes type name}`` (no ml_dtypes import)."""
        return dict(self._named)

    def __getitem__(self, key: Hashable) -> np.dtype:
        dt = self._plain.get(key)
        if dt is not None:
            return dt
        if key in self._named:
            if key not in self._made:
                self._made[key] = ml_dtype(self._named[key])
            dt = self._made[key]
            if dt is not None:
                return dt
        raise KeyError(key)

    def __iter__(self) -> Iterator[Hashable]:
        yield from self._plain
        for key in self._named:
            if key not in self._plain and key in self:
                yield key

    def __len__(self) -> int:
        return sum(1 for _ in self)

    def __repr__(self) -> str:
        return f"LazyDtypes({sorted(map(str, self._plain))} + {sorted(map(str, self._named))})"


_PLAIN = {1: np.float32, 2: np.float64, 3: np.int32, 4: np.uint8, 5: np.int16, 6: np.int8,
          8: np.complex64, 9: np.int64, 10: np.bool_, 17: np.uint16, 18: np.complex128,
          19: np.float16, 22: np.uint32, 23: np.uint64}
# Quantized types are structured dtypes with one named field, exactly as TensorFlow's
# ``DType.as_numpy_dtype`` gives them, so they never collide with the plain integer types.
_QUANTIZED = {11: ("qint8", "<i1"), 12: ("quint8", "<u1"), 13: ("qint32", "<i4"),
              15: ("qint16", "<i2"), 16: ("quint16", "<u2")}

_TF_PLAIN: Dict[int, np.dtype] = {k: np.dtype(v) for k, v in _PLAIN.items()}
_TF_PLAIN[DT_STRING] = np.dtype(object)
_TF_PLAIN.update({k: np.dtype([(n, t)]) for k, (n, t) in _QUANTIZED.items()})
#: ``DataType`` enum value -> numpy dtype, for every type a checkpoint can hold values of
#: (not ``resource``/``variant``, whose values are not plain data); the ml_dtypes ones (bfloat16,
#: float8, int4, ...) are made on first use.
TF_TO_NUMPY: LazyDtypes = LazyDtypes(_TF_PLAIN, {e: n for e, n in TF_DTYPE_NAMES.items()
                                                 if e not in _TF_PLAIN and n in ML_ITEMSIZE})
#: ``DataType`` enum value -> bytes per element in memory, for the same types (strings: 0), without
#: ml_dtypes: what listing needs.
TF_ITEMSIZE: Dict[int, int] = {e: (0 if e == DT_STRING else dt.itemsize) for e, dt in _TF_PLAIN.items()}
TF_ITEMSIZE.update({e: ML_ITEMSIZE[n] for e, n in TF_DTYPE_NAMES.items() if e not in _TF_PLAIN and n in ML_ITEMSIZE})

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
        >>> numpy_to_tf("float32"), numpy_to_tf(ml_dtype("bfloat16"))
        (1, 14)
    """
    try:
        dt = as_dtype(dtype)
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
        >>> dtype_name(np.dtype(object)), dtype_name(ml_dtype("bfloat16")), dtype_name(np.bool_)
        ('string', 'bfloat16', 'bool')
    """
    if isinstance(dtype, (int, np.integer)) and not isinstance(dtype, bool):
        return tf_dtype_name(int(dtype))
    if isinstance(dtype, str) and dtype in ML_ITEMSIZE:
        return dtype
    dt = np.dtype(dtype)
    if dt.kind in "OSU":
        return "string"
    if dt.names is not None and len(dt.names) == 1 and dt.names[0] in _NAME_TO_TF:
        return dt.names[0]  # quantized, e.g. [("qint8", "i1")]
    return dt.name

