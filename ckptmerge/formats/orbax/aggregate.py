"""The old Orbax (and Flax) msgpack aggregate file, parsed without JAX or Flax.

Orbax checkpoints written before ``_METADATA`` existed keep the tree in one msgpack file named
``checkpoint`` inside the item folder (Flax's ``flax.serialization`` encoding): small arrays and
scalars inline, and for each array written by TensorStore the string
``"PLACEHOLDER://<param name>"``. Inline arrays are msgpack extension values (code 1, a packed
``(shape, dtype name, raw bytes)``; code 3 a NumPy scalar; code 2 a Python complex; code 4 a
tuple), and arrays over 1 GiB are split into ``{"__msgpack_chunked_array__": True, "shape",
"chunks"}`` dicts. :func:`parse_aggregate` returns the flat leaves; every shape, dtype and
buffer size is checked before an array is made (the file is untrusted; object and structured
dtypes are refused: nothing here unpickles).
"""

from __future__ import annotations

import math
from typing import Any, Callable, Dict, List, Tuple

import numpy as np

from ckptmerge.core.errors import CheckpointFormatError, CkptMergeError
from ckptmerge.formats.base import shape_problem
from ckptmerge.formats.dtypes import ML_ITEMSIZE, ml_dtype
from ckptmerge.core.text import escape_name

__all__ = ["parse_aggregate", "Leaf", "numpy_dtype_named", "checked_dtype_name", "PLACEHOLDER", "AGGREGATED"]

#: Prefix of a leaf written by TensorStore (the rest is its param name).
PLACEHOLDER = "PLACEHOLDER://"
#: Another prefix Orbax reads as a placeholder.
AGGREGATED = "AGGREGATED://"

#: ``(tree path, kind, value)``: kind ``"array"`` (a NumPy array, read-only view of the file),
#: ``"stored"`` (value: the param name of a TensorStore array), ``"string"`` (value: bytes).
Leaf = Tuple[Tuple[str, ...], str, Any]


def checked_dtype_name(name: Any) -> Tuple[str, int]:
    """``(ckptmerge's name, bytes per element)`` of a plain numeric, bool or ``ml_dtypes`` dtype
    name (``"float32"``, ``"<f4"``, ``"bfloat16"``, ``"int4"``), without importing ml_dtypes;
    ``ValueError`` for anything else (objects, structs, strings, unknown names).

    Example:
        >>> checked_dtype_name("bfloat16"), checked_dtype_name("<i8")
        (('bfloat16', 2), ('int64', 8))
    """
    if not isinstance(name, str) or len(name) > 32:
        raise ValueError(f"not a dtype name: {name!r}")
    if name in ML_ITEMSIZE:
        return name, ML_ITEMSIZE[name]
    try:
        dt = np.dtype(name)
    except TypeError:
        raise ValueError(f"unknown dtype {name!r}") from None
    if dt.kind not in "biufc" or dt.names is not None or dt.subdtype is not None:
        raise ValueError(f"dtype {name!r} is not plain numeric data")
    return dt.name, dt.itemsize


def numpy_dtype_named(name: Any) -> np.dtype:
    """The NumPy dtype of a name :func:`checked_dtype_name` accepts (ml_dtypes is imported for
    its types); ``ValueError`` for anything else, and for an ml_dtypes type the installed
    ml_dtypes lacks.

    Example:
        >>> numpy_dtype_named("bfloat16").name, numpy_dtype_named("<i8").name
        ('bfloat16', 'int64')
    """
    checked_dtype_name(name)
    if name in ML_ITEMSIZE:
        dt = ml_dtype(name)
        if dt is None:
            raise ValueError(f"dtype {name!r} needs a newer ml_dtypes (pip install -U ml_dtypes)")
        return dt
    return np.dtype(name)


def _check_shape(shape: Any, itemsize: int) -> Tuple[int, ...]:
    problem = shape_problem(shape, itemsize)
    if problem:
        raise ValueError(f"an array {problem}")
    return tuple(shape)


def _array_from(data: bytes, msgpack: Any) -> np.ndarray:
    """An inline array (extension code 1 or 3): ``(shape, dtype name, bytes)``, checked."""
    parts = msgpack.unpackb(data, raw=True)
    if not isinstance(parts, (list, tuple)) or len(parts) != 3:
        raise ValueError("an inline array is not (shape, dtype, bytes)")
    shape, dtype_name, buf = parts
    dt = numpy_dtype_named(dtype_name.decode("ascii") if isinstance(dtype_name, bytes) else dtype_name)
    shape = _check_shape(shape, dt.itemsize)
    if not isinstance(buf, bytes):
        raise ValueError("an inline array's data is not bytes")
    need = math.prod(shape) * dt.itemsize
    if len(buf) != need:
        raise ValueError(f"an inline array of shape {shape} and dtype {dt.name} has {len(buf)} bytes, needs {need}")
    return np.frombuffer(buf, dtype=dt).reshape(shape)


def _unchunk(d: Dict[str, Any]) -> np.ndarray:
    shape, chunks = d.get("shape"), d.get("chunks")
    if not isinstance(shape, dict) or not isinstance(chunks, dict):
        raise ValueError("a chunked array has no 'shape' or 'chunks'")
    pieces = [chunks.get(str(i)) for i in range(len(chunks))]
    if not pieces or not all(isinstance(p, np.ndarray) and p.ndim == 1 and p.dtype == pieces[0].dtype for p in pieces):
        raise ValueError("a chunked array's chunks are not flat arrays of one dtype")
    dims = _check_shape([shape.get(str(i)) for i in range(len(shape))], pieces[0].dtype.itemsize)
    if sum(p.size for p in pieces) != math.prod(dims):
        raise ValueError(f"a chunked array's chunks do not add up to its shape {dims}")
    return np.concatenate(pieces).reshape(dims)


def parse_aggregate(data: bytes, where: str) -> List[Leaf]:
    """The leaves of an aggregate msgpack file's tree, in tree order.

    Dict keys and list positions become tree path components (``str``); empty dicts and lists,
    ``None`` and other empty leaves give no leaf.

    Raises:
        CkptMergeError: ``msgpack`` is not installed (with the install hint).
        CheckpointFormatError: the file is not a valid aggregate (naming ``where``).

    Example:
        >>> import msgpack
        >>> parse_aggregate(msgpack.packb({"params": {"w": "PLACEHOLDER://params.w"}}), "ckpt")
        [(('params', 'w'), 'stored', 'params.w')]
    """
    try:
        import msgpack
    except ImportError:
        raise CkptMergeError('Reading an old Orbax msgpack checkpoint needs the \'msgpack\' package. '
                             'Install it with: pip install "ckptmerge[orbax]"') from None

    def ext(code: int, payload: bytes) -> Any:
        if code in (1, 3):
            arr = _array_from(payload, msgpack)
            return arr if code == 1 else arr.reshape(())
        if code == 2:
            re_im = msgpack.unpackb(payload)
            if not (isinstance(re_im, (list, tuple)) and len(re_im) == 2
                    and all(isinstance(x, (int, float)) for x in re_im)):
                raise ValueError("a complex value is not (real, imag)")
            return np.array(complex(*re_im))
        if code == 4:
            return tuple(msgpack.unpackb(payload, raw=False, ext_hook=ext, strict_map_key=False))
        raise ValueError(f"unknown msgpack extension code {code}")

    try:
        tree = msgpack.unpackb(data, raw=False, ext_hook=ext, strict_map_key=False)
    except Exception as e:  # noqa: BLE001 - msgpack raises many types; the ext hook ValueError
        raise CheckpointFormatError(
            f"Orbax aggregate file {escape_name(where)} is not a valid msgpack checkpoint ({type(e).__name__}: "
            f"{escape_name(str(e)[:120])}); it is damaged or not an Orbax/Flax checkpoint.", path=where) from None
    out: List[Leaf] = []
    _flatten(tree, (), out, where, _unchunk)
    return out


def _flatten(node: Any, path: Tuple[str, ...], out: List[Leaf], where: str,
             unchunk: Callable[[Dict[str, Any]], np.ndarray]) -> None:
    stack = [(node, path)]
    while stack:
        node, path = stack.pop()
        if isinstance(node, dict):
            if node.get("__msgpack_chunked_array__") is True:
                try:
                    out.append((path, "array", unchunk(node)))
                except ValueError as e:
                    raise CheckpointFormatError(f"Orbax aggregate file {escape_name(where)}: {escape_name(e)} at "
                                                f"{escape_name('/'.join(path))}.", path=where) from None
                continue
            stack.extend((v, path + (str(k),)) for k, v in reversed(list(node.items())))
        elif isinstance(node, (list, tuple)):
            stack.extend((v, path + (str(i),)) for i, v in reversed(list(enumerate(node))))
        elif isinstance(node, np.ndarray):
            out.append((path, "array", node))
        elif isinstance(node, str):
            if node.startswith(PLACEHOLDER) or node.startswith(AGGREGATED):
                name = node.split("://", 1)[1]
                out.append((path, "stored", name))
            else:
                out.append((path, "string", node.encode("utf-8", "surrogatepass")))
        elif isinstance(node, bytes):
            out.append((path, "string", node))
        elif isinstance(node, bool):
            out.append((path, "array", np.array(node)))
        elif isinstance(node, int):
            out.append((path, "array", np.array(node, dtype=np.int64 if -2 ** 63 <= node < 2 ** 63 else np.uint64)))
        elif isinstance(node, float):
            out.append((path, "array", np.array(node, dtype=np.float64)))
        elif node is None:
            continue
        else:  # pragma: no cover - msgpack gives nothing else
            raise CheckpointFormatError(f"Orbax aggregate file {escape_name(where)} holds a {type(node).__name__} at "
                                        f"{escape_name('/'.join(path))}.", path=where)
