"""Dtype names and casts: ckptmerge's dtype names, their numpy dtypes, and the casts a plan allows.

The plan's ``cast`` flag asks for a cast where a source tensor's dtype differs from its target's;
:func:`cast_problem` says whether one is possible (never string <-> number, never complex -> real)
and :func:`cast_array` does it, rounding as ``tf.cast`` does. Pure numpy; bfloat16 and float8
come from ``ml_dtypes``, imported only when needed. :mod:`ckptmerge.planning.transforms` re-exports these.
"""

from __future__ import annotations

from typing import Optional, Union

import numpy as np

from ..core.errors import TransformError, did_you_mean

__all__ = ["cast_array", "cast_problem", "numpy_dtype", "dtype_name"]


_NUMPY_NAMES = ("bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
                "float16", "float32", "float64", "complex64", "complex128")
_ML_DTYPES = ("bfloat16", "float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz",
              "float8_e4m3b11fnuz", "int4", "uint4")
_KNOWN = _NUMPY_NAMES + _ML_DTYPES + ("string",)


def _ml_dtypes():  # deferred: only bfloat16 and friends need it (it comes with TensorFlow)
    try:
        import ml_dtypes
    except ImportError:  # pragma: no cover - ml_dtypes is a TensorFlow dependency
        raise TransformError("bfloat16 and float8 casts need the 'ml_dtypes' package: "
                             "pip install ml_dtypes") from None
    return ml_dtypes


def numpy_dtype(name: str) -> np.dtype:
    """The numpy dtype of a ckptmerge dtype name (``"string"`` is ``object`` holding bytes).

    Raises:
        TransformError: an unknown name (with "did you mean").

    Example:
        >>> numpy_dtype("float16")
        dtype('float16')
    """
    if name == "string":
        return np.dtype(object)
    if name in _NUMPY_NAMES:
        return np.dtype(name)
    if name in _ML_DTYPES:
        return np.dtype(getattr(_ml_dtypes(), name))
    raise TransformError(f"unknown dtype {name!r}; expected one of {', '.join(_KNOWN)}."
                         f"{did_you_mean(str(name), _KNOWN)}")


def dtype_name(dtype: Union[np.dtype, type, str]) -> str:
    """The ckptmerge name of a numpy dtype (``object``, bytes and str arrays are ``"string"``).

    Example:
        >>> dtype_name(np.float32)
        'float32'
    """
    if isinstance(dtype, str) and dtype in _KNOWN:
        return dtype
    dt = np.dtype(dtype)
    if dt.kind in "OSU":
        return "string"
    return dt.name


def _category(name: str) -> str:
    if name == "string":
        return "string"
    if name == "bool":
        return "bool"
    if name.startswith("complex"):
        return "complex"
    if name.startswith(("int", "uint")):
        return "int"
    return "float"


def cast_problem(source_dtype: str, target_dtype: str) -> Optional[str]:
    """Why ``source_dtype`` cannot be cast to ``target_dtype``, or ``None`` if it can.

    Strings and numbers never convert into each other; complex to real would lose the imaginary
    part. Everything else converts as ``tf.cast`` does (floats round to nearest even).

    Example:
        >>> cast_problem("float16", "float32") is None
        True
        >>> cast_problem("string", "float32")
        'cannot cast string to float32: strings and numbers do not convert into each other'
    """
    for n in (source_dtype, target_dtype):
        if n not in _KNOWN:
            return f"cannot cast {source_dtype} to {target_dtype}: unknown dtype {n!r}"
    if source_dtype == target_dtype:
        return None
    a, b = _category(source_dtype), _category(target_dtype)
    if (a == "string") != (b == "string"):
        return f"cannot cast {source_dtype} to {target_dtype}: strings and numbers do not convert into each other"
    if a == "complex" and b != "complex":
        return f"cannot cast {source_dtype} to {target_dtype}: the imaginary part would be lost"
    return None


def cast_array(value: np.ndarray, dtype_name_: str) -> np.ndarray:
    """Cast ``value`` to the dtype named ``dtype_name_`` (``"float32"``, ``"bfloat16"``, ...).

    Float narrowing rounds to nearest even (float32 -> bfloat16 included, as ``tf.cast`` does);
    values too large for float16 become ``inf``. Returns ``value`` itself when no cast is needed.

    Raises:
        TransformError: an impossible cast (string <-> number, complex -> real) or unknown dtype.

    Example:
        >>> import numpy as np
        >>> cast_array(np.array([1.5], np.float16), "float32").dtype
        dtype('float32')
    """
    value = np.asarray(value)
    if dtype_name_ not in _KNOWN:
        numpy_dtype(dtype_name_)  # raises with "did you mean"
    src = dtype_name(value.dtype)
    problem = cast_problem(src, dtype_name_)
    if problem:
        raise TransformError(problem + ".")
    if src == dtype_name_:
        return value.astype(object) if src == "string" and value.dtype != object else value
    target = numpy_dtype(dtype_name_)
    src_is_ml = src in _ML_DTYPES
    if (src_is_ml or dtype_name_ in _ML_DTYPES) and "float32" not in (src, dtype_name_) \
            and _category(src) != "bool" and _category(dtype_name_) != "bool":
        # Go through float32, as Eigen's bfloat16 conversions (and so tf.cast) do, so that every
        # pair (int64 -> bfloat16, bfloat16 -> float16, ...) rounds the same way TF would.
        return value.astype(np.float32).astype(target)
    return value.astype(target)
