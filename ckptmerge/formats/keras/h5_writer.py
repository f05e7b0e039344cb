"""Write a Keras ``.weights.h5`` file atomically and in bounded memory, without TensorFlow.

Each tensor name is written as the path of an HDF5 dataset (``layers/dense/vars/0``), the
layout Keras 3's ``model.load_weights`` reads: the names a ``.weights.h5`` file has when
ckptmerge reads it (so a merge or combination of ``.weights.h5`` files writes one that Keras
loads back). ``bfloat16`` and the other ``ml_dtypes`` types are stored as Keras stores them:
opaque bytes with a ``dtype`` attribute. Tensors arrive whole (``add``) or as a stream of flat
pieces in C order (``add_raw``), each piece written to the boxes of the dataset it covers, so
memory holds a piece. The file is written under a hidden temporary name beside the output and
published with one rename (a hard link without ``overwrite``): a failed or killed write leaves
no file at the output. The methods are those of
:class:`~ckptmerge.formats.safetensors.writer.SafetensorsWriter`, so a merge writes either.
"""

from __future__ import annotations

import math
import os
from typing import Any, Iterable, Iterator, List, Optional, Sequence, Tuple, Union

import crc32c as _crc32c
import numpy as np

from ckptmerge.core import limits
from ckptmerge.core.errors import ArgumentError, CheckpointWriteError, OutputExistsError
from ckptmerge.formats.dtypes import TF_TO_NUMPY, dtype_name, tf_dtype_name
from ckptmerge.formats.io.output_prefix import remove_quietly
from ckptmerge.formats.io.publish import SingleFileWriter, publish_file, temp_path
from ckptmerge.formats.tf.bundle import mask_crc
from ckptmerge.core.text import quote_name

__all__ = ["H5Writer", "flat_boxes", "h5_unsupported"]

BytesLike = Union[bytes, bytearray, memoryview]
Spec = Tuple[str, str, Sequence[int]]
Box = Tuple[Tuple[Union[int, slice], ...], Tuple[int, ...], int, int]


def h5_unsupported(specs: Iterable[Spec]) -> List[Tuple[str, str]]:
    """The ``(name, problem)`` of tensors a Keras weights file cannot hold as they are: strings,
    quantized or unknown dtypes, names that are not HDF5 paths.

    Example:
        >>> h5_unsupported([("a/vars/0", "float32", (2,)), ("vocab", "string", (3,)), ("a//b", "float32", ())])
        [('vocab', 'dtype string'), ('a//b', 'an empty path component')]
    """
    bad = []
    known = {dtype_name(dt) for dt in TF_TO_NUMPY.values()}
    for name, dtype, _ in specs:
        if dtype == "string" or dtype not in known or dtype.startswith(("q", "resource", "variant")):
            bad.append((name, f"dtype {dtype}"))
        elif not name or any(part in ("", ".") for part in name.split("/")):
            bad.append((name, "an empty path component"))
    return bad


def flat_boxes(shape: Sequence[int], start: int, stop: int) -> Iterator[Box]:
    """The boxes of an array of ``shape`` that the C-order flat range ``[start, stop)`` covers:
    ``(selection, box shape, flat start, flat stop)`` each, at most ``2 * ndim - 1`` of them.

    Example:
        >>> [(b[1], b[2], b[3]) for b in flat_boxes((3, 4), 2, 11)]
        [((2,), 2, 4), ((1, 4), 4, 8), ((3,), 8, 11)]
    """
    shape = tuple(int(d) for d in shape)
    if start >= stop:
        return
    if not shape:
        yield (), (), start, stop
        return
    inner = math.prod(shape[1:])
    rest = shape[1:]
    first, last = start // inner, (stop - 1) // inner
    if first == last:  # inside one row: recurse into it
        for sel, bshape, a, b in flat_boxes(rest, start - first * inner, stop - first * inner):
            yield (first,) + sel, bshape, a + first * inner, b + first * inner
        return
    if start % inner:
        yield from flat_boxes(shape, start, (first + 1) * inner)
        first += 1
    full_end = stop // inner
    if full_end > first:
        yield ((slice(first, full_end),) + tuple(slice(None) for _ in rest), (full_end - first,) + rest,
               first * inner, full_end * inner)
    if stop % inner and full_end * inner < stop:
        yield from flat_boxes(shape, full_end * inner, stop)


def _import_h5py() -> Any:
    try:
        import h5py
    except ImportError:  # pragma: no cover - h5py is a dependency
        raise CheckpointWriteError("Writing Keras .weights.h5 files needs the 'h5py' package: pip install h5py") from None
    return h5py


class H5Writer(SingleFileWriter):
    """Write one Keras ``.weights.h5`` file whose tensors are known up front.

    Args:
        path: the output file (``out/model.weights.h5``); missing parent folders are created.
        specs: ``(name, dtype, shape)`` of every tensor; each name is its dataset's path.
        overwrite: replace an existing file at ``path``.
        durable: fsync the file and its folder when publishing.

    Raises:
        OutputExistsError: ``path`` exists and ``overwrite`` is false.
        ArgumentError: a dtype or name the file cannot hold, a name that is also a group.
        CheckpointWriteError: the output folder cannot be written.

    Example:
        >>> with H5Writer("out/model.weights.h5", [("layers/dense/vars/0", "float32", (2, 3))]) as w:  # doctest: +SKIP
        ...     w.add("layers/dense/vars/0", np.ones((2, 3), np.float32))
    """

    def __init__(self, path: Union[str, "os.PathLike[str]"], specs: Sequence[Spec], *, overwrite: bool = False,
                 durable: bool = False) -> None:
        self._set_output(path, overwrite, durable)
        bad = h5_unsupported(specs)
        if bad:
            raise ArgumentError(f"A Keras weights file cannot hold {len(bad)} of these tensors, e.g. {quote_name(bad[0][0])} "
                                f"({bad[0][1]}). Exclude them, or write a TF checkpoint instead.")
        self._layout = {}
        for name, dtype, shape in specs:
            if name in self._layout:
                raise ArgumentError(f"tensor name {quote_name(name)} is given twice")
            self._layout[name] = (dtype, tuple(int(d) for d in shape))
        groups = {"/".join(n.split("/")[:i]) for n in self._layout for i in range(1, n.count("/") + 1)}
        clash = sorted(groups & set(self._layout))
        if clash:
            raise ArgumentError(f"{quote_name(clash[0])} is both a tensor and the scope of others (e.g. "
                                f"{quote_name(next(n for n in self._layout if n.startswith(clash[0] + '/')))}); an HDF5 "
                                "file cannot hold a dataset and a group of one name. Rename one of them.")
        self._written: set = set()
        self._state = "open"
        if not self._overwrite and os.path.lexists(self._abs):
            raise OutputExistsError(f"A file already exists at {quote_name(self.path)}. Choose another output, or pass "
                                    "overwrite=True (--force) to replace it.", path=self.path)
        self._tmp = temp_path(self._abs)
        h5py = _import_h5py()
        try:
            os.makedirs(os.path.dirname(self._abs), exist_ok=True)
            self._file = h5py.File(self._tmp, "w-")
        except OSError as e:
            self._state = "aborted"
            remove_quietly(self._tmp)
            limits.check(e, self._tmp, doing="create")
            raise CheckpointWriteError(f"Cannot create {self._tmp!r} to write {self.path!r}: {e}", path=self._tmp) from e

    # -- adding tensors --------------------------------------------------------------------
    def _dataset(self, key: str, dtype: str, shape: Sequence[int]) -> Tuple[Any, np.dtype]:
        if self._state != "open":
            raise ArgumentError(f"This H5Writer for {quote_name(self.path)} is already {self._state}.")
        spec = self._layout.get(key)
        if spec is None:
            raise ArgumentError(f"tensor {key!r} was not declared when the writer was created")
        if key in self._written:
            raise ArgumentError(f"tensor {key!r} was already written")
        if dtype != spec[0] or tuple(int(d) for d in shape) != spec[1]:
            raise ArgumentError(f"tensor {key!r} is {dtype} {tuple(shape)}, declared as {spec[0]} {spec[1]}")
        dt = next(d for d in TF_TO_NUMPY.values() if dtype_name(d) == dtype).newbyteorder("<")
        stored = np.dtype(f"V{dt.itemsize}") if dt.kind == "V" else dt  # ml_dtypes: opaque, as Keras
        try:
            ds = self._file.create_dataset(key, shape=spec[1], dtype=stored)
            if stored is not dt:
                ds.attrs["dtype"] = dtype
        except (OSError, ValueError, TypeError) as e:
            self.abort()
            raise CheckpointWriteError(f"Cannot write tensor {quote_name(key)} to {self.path!r}: {e}", path=self._tmp) from e
        return ds, stored

    def _put(self, ds: Any, sel: Tuple[Any, ...], values: np.ndarray) -> None:
        try:
            ds[sel] = values
        except (OSError, ValueError, TypeError) as e:
            self.abort()
            raise CheckpointWriteError(f"Cannot write {self.path!r} (temporary file {self._tmp!r}): {e}",
                                       path=self._tmp) from e

    def add(self, key: str, value: np.ndarray) -> None:
        """Write a whole array.

        Example:
            >>> w.add("layers/dense/vars/1", np.zeros(3, np.float32))  # doctest: +SKIP
        """
        value = np.asarray(value)
        ds, stored = self._dataset(key, dtype_name(value.dtype), value.shape)
        if value.size:
            self._put(ds, (), np.ascontiguousarray(value).view(stored) if stored.kind == "V" else value)
        self._written.add(key)

    def add_raw(self, key: str, dtype_enum: int, shape: Sequence[int], chunks: Iterable[BytesLike], *,
                expected_crc32c: Optional[int] = None) -> None:
        """Write a tensor from its raw little-endian bytes in C order, streamed (any piece sizes).

        Example:
            >>> w.add_raw("layers/emb/vars/0", 1, (1000, 64), pieces)  # doctest: +SKIP
        """
        dtype = dtype_name(TF_TO_NUMPY[dtype_enum]) if dtype_enum in TF_TO_NUMPY else tf_dtype_name(dtype_enum)
        ds, stored = self._dataset(key, dtype, shape)
        dims = tuple(int(d) for d in shape)
        total = math.prod(dims)
        pos, crc, carry = 0, 0, b""
        for chunk in chunks:
            view = memoryview(chunk).cast("B")
            crc = _crc32c.crc32c(view, crc)
            data = carry + bytes(view) if carry else view
            whole = len(data) - len(data) % stored.itemsize
            carry = bytes(data[whole:])
            n = whole // stored.itemsize
            if pos + n > total:
                self.abort()
                raise ArgumentError(f"tensor {key!r}: the chunks hold more than its {total} elements")
            flat = np.frombuffer(data[:whole], dtype=stored)
            for sel, bshape, a, b in flat_boxes(dims, pos, pos + n):
                self._put(ds, sel, flat[a - pos:b - pos].reshape(bshape))
            pos += n
        if pos != total or carry:
            self.abort()
            raise ArgumentError(f"tensor {key!r}: the chunks held {pos} of its {total} elements")
        self._check_crc(key, mask_crc(crc), expected_crc32c)
        self._written.add(key)

    # -- publishing ------------------------------------------------------------------------
    def finish(self) -> None:
        """Check every declared tensor was written, close the file and move it into place.

        Raises:
            ArgumentError: a declared tensor was never written (nothing is published).
            OutputExistsError: a file appeared at the output meanwhile (without ``overwrite``).
        """
        self._check_all_written()
        try:
            self._file.close()
        except (OSError, ValueError) as e:
            self.abort()
            raise CheckpointWriteError(f"Cannot write {self.path!r}: {e}", path=self._tmp) from e
        try:
            publish_file(self._tmp, self._abs, self.path, overwrite=self._overwrite, durable=self._durable)
        except BaseException:
            self._state = "aborted"
            raise
        self._state = "finished"

    def abort(self) -> None:
        """Close and remove the temporary file; nothing appears at the output."""
        if self._state != "open":
            return
        self._state = "aborted"
        try:
            self._file.close()
        except Exception:  # pragma: no cover - a file h5py could not finish
            pass
        remove_quietly(self._tmp)
