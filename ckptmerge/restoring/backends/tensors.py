"""Turning numpy values into TF tensors without copies, and small helpers both backends share."""

from __future__ import annotations

from typing import Any, List, Optional, Tuple

import numpy as np

from ...formats.base import ALIGN, aligned_empty

__all__ = ["to_tensor", "to_numpy", "read_variable", "aligned_empty", "parse_slice_spec", "cast_value", "join_parts", "ALIGN"]



def _aligned(arr: np.ndarray) -> bool:
    return arr.ctypes.data % ALIGN == 0 and arr.flags.c_contiguous


def to_numpy(value: Any, *, owned: bool) -> Any:
    """A numpy array TF can take as a feed without a copy (64-byte aligned, C-contiguous).

    ``owned`` says the array is ours alone; otherwise it is copied, because the variable will
    keep the fed buffer.
    """
    if not isinstance(value, np.ndarray):
        value = np.asarray(value)
    if value.dtype.kind in "OSU" or (owned and _aligned(value)):
        return value
    copy = aligned_empty(value.shape, value.dtype)
    copy[...] = value
    return copy


def to_tensor(value: Any, *, owned: bool) -> Any:
    """A TF tensor holding ``value``; zero-copy for owned, aligned numeric numpy arrays.

    ``owned`` says the array is ours alone (freshly read), so the tensor may alias it: the
    variable then takes over its buffer and assigning costs no copy at all.
    """
    import tensorflow as tf

    if isinstance(value, (tf.Tensor, tf.Variable)) or not isinstance(value, np.ndarray):
        return tf.convert_to_tensor(value)
    arr = value
    if arr.dtype.kind in "OSU":
        return tf.constant(arr)
    if not owned or not _aligned(arr) or arr.size == 0:
        copy = aligned_empty(arr.shape, arr.dtype)
        copy[...] = arr
        arr = copy
    from tensorflow.experimental import dlpack

    if arr.dtype.name == "bfloat16":  # DLPack has no bfloat16: ship the bits, bitcast in TF
        return tf.bitcast(dlpack.from_dlpack(arr.view(np.uint16).__dlpack__()), tf.bfloat16)
    return dlpack.from_dlpack(arr.__dlpack__())


def read_variable(var: Any) -> Any:
    """The value of a TF variable as a tensor: ``read_value()``, or for a ``ShardedVariable``
    (which has none: the value of a Keras variable made under a variable partitioner) its shards
    joined, as ``tf.convert_to_tensor`` gives them.

    Example:
        >>> read_variable(tf.Variable([1.0, 2.0])).numpy()  # doctest: +SKIP
        array([1., 2.], dtype=float32)
    """
    reader = getattr(var, "read_value", None)
    if reader is not None:
        return reader()
    import tensorflow as tf

    return tf.convert_to_tensor(var)


def parse_slice_spec(spec: str) -> Tuple[List[int], Tuple[slice, ...]]:
    """Parse TF's ``"full_shape slice"`` string, e.g. ``"10 3 0,5:-"``.

    Example:
        >>> parse_slice_spec("10 3 0,5:-")
        ([10, 3], (slice(0, 5, None), slice(None, None, None)))
    """
    parts = spec.split(" ")
    full = [int(x) for x in parts[:-1]]
    sls = []
    for ext in parts[-1].split(":"):
        if ext == "-":
            sls.append(slice(None))
        else:
            start, length = (int(x) for x in ext.split(","))
            sls.append(slice(start, start + length))
    return full, tuple(sls)


def cast_value(value: Any, dtype_name: str) -> Any:
    """Cast a numpy array (see :func:`ckptmerge.planning.transforms.cast_array`) or a TF tensor."""
    if isinstance(value, np.ndarray):
        from ...planning.transforms import cast_array

        return cast_array(value, dtype_name)
    import tensorflow as tf

    return tf.cast(value, dtype_name)


def join_parts(target: Any, values: List[Any]) -> np.ndarray:
    """The whole value of a target from its parts' values (a partitioned variable's slices).

    Example:
        >>> class T: parts = [(None, "4 0,2"), (None, "4 2,2")]; partitioned = True; info = type("I", (), {"shape": (4,)})
        >>> join_parts(T, [np.array([1, 2]), np.array([3, 4])]).tolist()
        [1, 2, 3, 4]
    """
    if not target.partitioned:
        return np.asarray(values[0])
    first = np.asarray(values[0])
    full = np.zeros(target.info.shape, dtype=first.dtype)
    for (_, spec), val in zip(target.parts, values):
        full[parse_slice_spec(spec)[1]] = np.asarray(val)
    return full


def part_value(value: np.ndarray, spec: Optional[str]) -> np.ndarray:
    """The piece of ``value`` that one part of a partitioned variable holds."""
    if spec is None:
        return value
    _, sls = parse_slice_spec(spec)
    return np.ascontiguousarray(value[sls])
