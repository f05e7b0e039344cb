"""The reader interface every checkpoint format implements, and its lookup error.

:class:`CheckpointReader` is what :func:`ckptmerge.formats.open_checkpoint` returns: a lazy,
read-only view of one checkpoint that lists tensors as :class:`~ckptmerge.core.specs.VariableInfo`
and reads them as numpy arrays. Subclasses (:class:`~ckptmerge.formats.tf.bundle.BundleReader`,
:class:`~ckptmerge.formats.keras.h5.H5Reader`) implement ``_entries()`` and ``_read()``; name
lookup, ``"did you mean"`` errors, ``read_many`` and the context-manager protocol live here.
"""

from __future__ import annotations

import itertools
import math
import operator
import os
from typing import TYPE_CHECKING, Any, Callable, Dict, Iterable, Iterator, List, Optional

import numpy as np

from ckptmerge.core.errors import (
    ArgumentError,
    ArgumentTypeError,
    UnknownTensorError,
    UnreadableTensorError,
    did_you_mean,
)
from ckptmerge.formats.dtypes import as_dtype, tf_dtype_name
from ckptmerge.core.specs import VariableInfo, by_name
from ckptmerge.core.text import escape_name

if TYPE_CHECKING:  # (only a type hint: the readers that give ranges import it)
    from ckptmerge.formats.ranges import TensorRanges

__all__ = ["CheckpointReader", "UnknownTensorError", "aligned_empty", "contiguous_chunks", "unreadable_dtype_error",
           "too_large_for_numpy", "shape_problem", "ALIGN", "CHUNK_ELEMENTS", "MAX_RANK"]

#: Buffer alignment: TF tensors need 64 bytes (Eigen), so aligned arrays can become tensors
#: (DLPack, graph feeds) without a copy.
ALIGN = 64

_NAME = operator.attrgetter("name")
_KEY = operator.attrgetter("key")

#: Elements per piece :meth:`CheckpointReader.iter_chunks` yields by default (8 MiB of float64).
CHUNK_ELEMENTS = 1 << 20


def aligned_empty(shape: Any, dtype: Any) -> np.ndarray:
    """An uninitialised C-contiguous array whose data starts on a 64-byte boundary.

    Example:
        >>> aligned_empty((3, 5), "float32").ctypes.data % ALIGN
        0
    """
    dt = as_dtype(dtype)
    shape = tuple(shape) if isinstance(shape, (tuple, list)) else (int(shape),)
    n = math.prod(int(d) for d in shape) * dt.itemsize  # Python ints: no silent overflow
    buf = np.empty(n + ALIGN, np.uint8)
    off = (-buf.ctypes.data) % ALIGN
    return buf[off:off + n].view(dt).reshape(shape)


def too_large_for_numpy(shape: Any, itemsize: int) -> bool:
    """True if numpy cannot make an array of ``shape`` (even an empty one: numpy multiplies
    every dimension, zeros aside, so ``(0, 2**62)`` is refused too).

    Example:
        >>> too_large_for_numpy((0, 2**62), 4), too_large_for_numpy((3, 4), 4)
        (True, False)
    """
    n = max(itemsize, 1)
    for d in shape:
        n *= max(d, 1)
    return n >= 1 << 63


#: The most dimensions a tensor may declare (TensorFlow's limit is 254, numpy's 64).
MAX_RANK = 64


def shape_problem(shape: Any, itemsize: int) -> Optional[str]:
    """Why no array can have the ``shape`` a file declares for a tensor of ``itemsize``-byte
    elements, as the end of a sentence whose subject is the tensor; ``None`` if it is fine.
    The one check of a declared shape every reader makes when it lists a file, so listing,
    showing and merging a file agree: a list or tuple of at most :data:`MAX_RANK` ints in
    ``[0, 2**62)`` that numpy can make an array of (:func:`too_large_for_numpy`).

    Example:
        >>> shape_problem((0, 2**61, 2**61), 4)[:60]
        'has shape (0, 2305843009213693952, 2305843009213693952), too'
        >>> shape_problem([3, -1], 4), shape_problem((3, 4), 4)
        ('has an invalid shape [3, -1]', None)
    """
    if (not isinstance(shape, (list, tuple)) or len(shape) > MAX_RANK
            or not all(type(d) is int and 0 <= d < 2 ** 62 for d in shape)):
        return f"has an invalid shape {escape_name(repr(shape)[:80])}"
    if too_large_for_numpy(shape, itemsize):
        return f"has shape {tuple(shape)}, too large for any array (its dimensions multiply past 2**63)"
    return None


def contiguous_chunks(dtype: np.dtype, count: int, max_elements: int,
                      fill: Callable[[int, memoryview], None]) -> Iterator[np.ndarray]:
    """Flat pieces of at most ``max_elements`` of a tensor of ``count`` elements stored
    contiguously in C order: ``fill(offset, view)`` reads the tensor's bytes from ``offset``
    (counted from its first byte) into ``view``. Each piece is read as it is asked for, so memory
    holds one piece, whatever the size of the tensor; the generator keeps no reference to a
    piece once it is yielded (many streams may be open at once: each holds none).

    Example:
        >>> data = np.arange(5, dtype="<i4").tobytes()
        >>> def fill(offset, view):
        ...     view[:] = data[offset:offset + len(view)]
        >>> [c.tolist() for c in contiguous_chunks(np.dtype("<i4"), 5, 2, fill)]
        [[0, 1], [2, 3], [4]]
    """
    for start in range(0, count, max_elements):
        yield _filled(dtype, start, min(max_elements, count - start), fill)


def _filled(dtype: np.dtype, start: int, n: int, fill: Callable[[int, memoryview], None]) -> np.ndarray:
    piece = aligned_empty(n, dtype)
    fill(start * dtype.itemsize, memoryview(piece.view(np.uint8)))
    return piece


def unreadable_dtype_error(checkpoint: str, key: str, dtype_enum: int, path: str) -> UnreadableTensorError:
    """The error for a tensor whose dtype holds no plain data (``resource``, ``variant``, ...):
    an :class:`~ckptmerge.core.errors.UnreadableTensorError`, which ``diff --values`` lists as not
    compared.

    Example:
        >>> str(unreadable_dtype_error("m", "h", 20, "m"))[:40]
        "Tensor 'h' of checkpoint m has dtype 're"
    """
    return UnreadableTensorError(
        f"Tensor {key!r} of checkpoint {os.path.basename(checkpoint)} has dtype "
        f"{tf_dtype_name(dtype_enum)!r}, which ckptmerge cannot read (only numeric, bool and "
        "string tensors are plain data). Exclude it from the restore.", path=path, key=key)


class CheckpointReader:
    """A read-only checkpoint: list its tensors, read them as numpy arrays.

    Files are opened lazily and kept open until :meth:`close` (also a context manager).
    Readers are safe to use from several threads.

    Attributes:
        path: the checkpoint prefix or file, as given to :func:`open_checkpoint`.
        format: ``"tf-bundle"`` or ``"keras-h5"``.
        object_graph: the parsed :class:`~ckptmerge.formats.tf.objectgraph.ObjectGraph` of a TF2
            object-based checkpoint, else ``None``.

    Example:
        >>> from ckptmerge.formats import open_checkpoint  # doctest: +SKIP
        >>> with open_checkpoint("runs/base/model.ckpt-1000") as r:  # doctest: +SKIP
        ...     kernel = r.get("dense/kernel")
    """

    format: str = ""
    object_graph: Any = None

    def __init__(self, path: str) -> None:
        self.path = str(path)
        self._ordered: List[VariableInfo] = []  # sorted by name, names unique
        self._by_name: Optional[Dict[str, VariableInfo]] = {}  # None: not made yet (see _infos)
        self._by_key: Dict[str, str] = {}

    # -- to be provided by subclasses ------------------------------------------------------
    def _read(self, info: VariableInfo) -> np.ndarray:  # pragma: no cover - abstract
        raise NotImplementedError

    def _set_infos(self, infos: Iterable[VariableInfo]) -> None:
        infos = list(infos)
        names, keys = list(map(_NAME, infos)), list(map(_KEY, infos))
        if all(map(operator.lt, names, names[1:])):  # (sorted and unique, as indexes give them)
            self._ordered, self._by_name = infos, None  # a listing never needs the dict: made when looked up
        else:
            self._by_name = by_name(infos)
            self._ordered = list(self._by_name.values())
        # raw key -> name, for the keys that differ from their names (lookups try names first)
        differ = list(map(operator.ne, keys, names))
        self._by_key = ({k: n for k, n in itertools.compress(zip(keys, names), differ) if k is not None}
                        if any(differ) else {})

    @property
    def _infos(self) -> Dict[str, VariableInfo]:
        """Name -> info, sorted by name (made at the first lookup; a race makes it twice, alike)."""
        d = self._by_name
        if d is None:
            d = self._by_name = dict(zip(map(_NAME, self._ordered), self._ordered))
        return d

    # -- public API ------------------------------------------------------------------------
    def variables(self) -> List[VariableInfo]:
        """Every tensor of the checkpoint (optimizer and bookkeeping included), sorted by name.

        Example:
            >>> [v.name for v in reader.variables()]  # doctest: +SKIP
            ['dense/bias', 'dense/kernel', 'save_counter']
        """
        return list(self._ordered)

    def names(self, *, optimizer: bool = True) -> List[str]:
        """The tensor names, sorted; ``optimizer=False`` leaves out optimizer state and bookkeeping.

        Example:
            >>> reader.names(optimizer=False)  # doctest: +SKIP
            ['dense/bias', 'dense/kernel']
        """
        return [v.name for v in self._ordered if optimizer or v.kind == "variable"]

    def spec(self, name: str) -> VariableInfo:
        """Name, shape, dtype, raw key and kind of tensor ``name`` (same as :meth:`info`).

        Example:
            >>> reader.spec("dense/kernel").shape  # doctest: +SKIP
            (784, 128)
        """
        return self.info(name)

    def __contains__(self, name: object) -> bool:
        return name in self._infos or name in self._by_key

    def __len__(self) -> int:
        return len(self._ordered)

    def info(self, name: str) -> VariableInfo:
        """Return the :class:`VariableInfo` of tensor ``name`` (a name or a raw checkpoint key).

        Raises:
            UnknownTensorError: if there is no such tensor (with a "did you mean" hint).

        Example:
            >>> reader.info("dense/kernel").shape  # doctest: +SKIP
            (784, 128)
        """
        info = self._infos.get(name)
        if info is None:
            other = self._by_key.get(name)
            if other is None:
                raise UnknownTensorError(
                    f"Tensor {name!r} not found in checkpoint {self.path!r} "
                    f"({len(self._infos)} tensors).{did_you_mean(name, self._infos)} "
                    "ckptmerge.list_variables(path) lists them.",
                    name=name, path=self.path)
            info = self._infos[other]
        return info

    def get(self, name: str) -> np.ndarray:
        """Read tensor ``name`` as a fresh, writeable, C-contiguous numpy array.

        Strings come back as an ``object`` array of ``bytes``, as TensorFlow returns them.

        Raises:
            UnknownTensorError: if there is no such tensor.
            CheckpointFormatError: if the data is corrupt (checksum mismatch, truncation) or of a
                type ckptmerge cannot read (``variant``, ``resource``).

        Example:
            >>> reader.get("dense/bias").shape  # doctest: +SKIP
            (128,)
        """
        return self._read(self.info(name))

    def iter_chunks(self, name: str, max_elements: int = CHUNK_ELEMENTS) -> Iterator[np.ndarray]:
        """Yield the values of tensor ``name`` in C order as flat arrays of at most
        ``max_elements`` elements each (none for an empty tensor).

        Their concatenation is ``get(name).reshape(-1)``. The TF bundle reader reads each piece
        from the file as it is asked for (checksums are checked as the pieces go by, the last
        one before the last piece is yielded), so statistics and comparisons of any tensor
        need memory for a piece, not for the tensor; so do the Keras h5 reader (one hyperslab
        per piece), the safetensors reader and the NumPy reader (``.npy`` files and ``.npz``
        members in C order; compressed members are decompressed piece by piece). Other tensors
        (Fortran-order NumPy arrays, V1 checkpoints, strings, packed ``F4``) are read whole once,
        then handed out in pieces.
        Name and size problems are raised by this call, before any piece is read.

        Raises:
            UnknownTensorError: if there is no such tensor.
            ArgumentTypeError: if ``max_elements`` is not an int; ``ArgumentError`` if it is
                below 1.
            CheckpointFormatError: as :meth:`get`.

        Example:
            >>> total = sum(float(c.sum()) for c in reader.iter_chunks("dense/kernel"))  # doctest: +SKIP
        """
        info = self.info(name)
        if not isinstance(max_elements, int) or isinstance(max_elements, bool):
            raise ArgumentTypeError(f"max_elements must be an int. Received: max_elements={max_elements!r}")
        if max_elements < 1:
            raise ArgumentError(f"max_elements must be at least 1. Received: max_elements={max_elements!r}")
        return self._iter_chunks(info, max_elements)

    def _iter_chunks(self, info: VariableInfo, max_elements: int) -> Iterator[np.ndarray]:
        """Pieces of the whole value, read at once (formats that can read ranges override this)."""
        flat = self._read(info).reshape(-1)
        return (flat[start:start + max_elements] for start in range(0, flat.size, max_elements))

    def ranges(self, name: str) -> Optional["TensorRanges"]:
        """Tensor ``name`` as a :class:`~ckptmerge.formats.ranges.TensorRanges` (element ranges
        read by any thread straight into the caller's buffers, its checksum checked once every
        byte was read), or ``None`` when the format does not store it so; then use
        :meth:`iter_chunks`. This base reader returns ``None``; the TF bundle, safetensors and
        Keras weights-file readers give the numeric tensors of local files stored in one piece.

        Raises:
            UnknownTensorError: if there is no such tensor.

        Example:
            >>> r = reader.ranges("dense/kernel")                          # doctest: +SKIP
            >>> r.span(0, 4).read(np.empty(4, r.dtype))                    # doctest: +SKIP
        """
        self.info(name)
        return None

    def read_many(self, names: Iterable[str], *, max_workers: Optional[int] = None) -> Dict[str, np.ndarray]:
        """Read several tensors at once; returns ``{name: array}`` in the order given.

        The base implementation reads one after the other; formats with a faster path (the
        TF bundle reader reads in parallel, in file order) override it.

        Example:
            >>> arrays = reader.read_many(["dense/kernel", "dense/bias"])  # doctest: +SKIP
        """
        names = list(names)
        infos = [self.info(n) for n in names]
        return {n: self._read(i) for n, i in zip(names, infos)}

    def close(self) -> None:
        """Close open files. Reading again reopens them."""

    def __del__(self) -> None:  # a forgotten reader still releases its files
        try:
            self.close()
        except BaseException:  # noqa: BLE001 - interpreter shutdown, a half-built reader, or a Ctrl-C
            pass               # that landed here: Python would only print it as "Exception ignored"

    def __enter__(self) -> "CheckpointReader":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        return (f"<{type(self).__name__} {os.path.basename(self.path)!r} format={self.format!r} "
                f"tensors={len(self._ordered)}>")
