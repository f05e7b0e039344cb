"""Read TensorFlow V1 checkpoints (the ``SavedTensorSlices`` table format) without TensorFlow.

A V1 checkpoint is what TF 0.x and ``tf.compat.v1.train.Saver(write_version=SaverDef.V1)``
write (TF Serving's ``SessionBundle`` exports too): one LevelDB-format table per shard, either a
single file (``model.ckpt-1000``) or a sharded set ``model.ckpt-1000-00000-of-00002`` ... whose
``checkpoint`` state file records the pattern ``model.ckpt-1000-?????-of-00002``. Every value of
the table is a ``SavedTensorSlices`` proto (``tensorflow/core/protobuf/saved_tensor_slice.proto``):
the entry with the empty key holds a ``SavedTensorSliceMeta`` listing each tensor's name, shape,
dtype and slices; every other entry, keyed by ``EncodeTensorNameSlice(name, slice)``, holds one
slice's values as a ``TensorProto``. A plain variable is one slice covering the whole tensor; a
partitioned variable has one slice per partition, possibly in different shards.

The reader opens the tables lazily (:class:`~ckptmerge.formats.tf.table.Table`) and reads a tensor's
blocks only when the tensor is read; values come out bit for bit as ``tf.train.load_checkpoint``
gives them. Every problem raises :class:`~ckptmerge.core.errors.CheckpointFormatError` naming the file
and the tensor; nothing is allocated before the data it describes has been read and checked.
"""

from __future__ import annotations

import os
import re
import threading
from typing import Dict, List, Optional, Tuple

import numpy as np

from ckptmerge.core import limits
from ckptmerge.core.errors import CheckpointFormatError, CheckpointNotFoundError
from ckptmerge.formats.base import CheckpointReader, too_large_for_numpy, unreadable_dtype_error
from ckptmerge.formats.dtypes import TF_ITEMSIZE, TF_TO_NUMPY, tf_dtype_name
from ckptmerge.formats.io import storage
from ckptmerge.formats.io.urlpath import split_tail
from ckptmerge.formats.tf.objectgraph import name_based_kind
from ckptmerge.formats.tf.protowire import (
    WIRE_BYTES,
    WIRE_VARINT,
    DecodeError,
    iter_fields,
)
from ckptmerge.formats.tf.regions import volume
from ckptmerge.formats.tf.slices import (
    Extents,
    SliceError,
    encode_tensor_name_slice,
    numel,
    slice_boxes,
)
from ckptmerge.formats.tf.table import Table, TableError
from ckptmerge.formats.tf.tfproto import (
    decode_tensor_values,
    int64_field,
    parse_shape,
    parse_slice,
)
from ckptmerge.core.redact import get_logger
from ckptmerge.core.specs import VariableInfo
from ckptmerge.core.text import escape_name

__all__ = ["V1Reader", "V1_SHARD_RE", "V1_PATTERN_RE", "v1_pattern", "v1_shard_files"]

logger = get_logger(__name__)

#: A shard of a sharded V1 checkpoint: ``<prefix>-00000-of-00002``.
V1_SHARD_RE = re.compile(r"-(\d{5})-of-(\d{5})$")
#: The pattern naming a whole sharded V1 checkpoint: ``<prefix>-?????-of-00002``.
V1_PATTERN_RE = re.compile(r"-\?{5}-of-(\d{5})$")
_CHECKPOINT_VERSION = 1  # TF's TF_CHECKPOINT_VERSION: the consumer version this reader is


def v1_pattern(shard_path: str) -> Optional[str]:
    """The pattern of the sharded set a shard file belongs to, or ``None`` for another name.

    Example:
        >>> v1_pattern("runs/model.ckpt-10-00001-of-00002")
        'runs/model.ckpt-10-?????-of-00002'
    """
    head, tail = split_tail(shard_path)  # a URL's query stays after the name
    m = V1_SHARD_RE.search(head)
    return None if m is None else f"{head[:m.start()]}-?????-of-{m.group(2)}{tail}"


def v1_shard_files(pattern: str) -> List[str]:
    """The shard files a pattern ``<prefix>-?????-of-NNNNN`` names, in order (existing or not).

    Example:
        >>> v1_shard_files("m-?????-of-00002")
        ['m-00000-of-00002', 'm-00001-of-00002']
    """
    head, tail = split_tail(pattern)  # a URL's query stays after each name
    m = V1_PATTERN_RE.search(head)
    if m is None:
        return [pattern]
    n = int(m.group(1))
    return [f"{head[:m.start()]}-{i:05d}-of-{n:05d}{tail}" for i in range(n)]


class _Meta:
    """One tensor of the metadata: shape, dtype and where each of its slices is."""

    __slots__ = ("name", "shape", "dtype", "slices")

    def __init__(self, name: str, shape: Tuple[int, ...], dtype: int) -> None:
        self.name = name
        self.shape = shape
        self.dtype = dtype
        self.slices: List[Tuple[Extents, int]] = []  # (extents, file number)


def _parse_meta(buf: bytes) -> Tuple[List[Tuple[str, Tuple[int, ...], int, List[Extents]]], int, List[int]]:
    """Decode the ``SavedTensorSlices`` of the empty key: tensors, min_consumer, bad_consumers."""
    meta = None
    for no, wire, value in iter_fields(buf):
        if no == 1:
            if wire != WIRE_BYTES:
                raise DecodeError("SavedTensorSlices.meta has the wrong wire type")
            meta = value
    if meta is None:
        raise DecodeError("the empty key holds no SavedTensorSliceMeta")
    tensors = []
    min_consumer, bad = 0, []
    for no, wire, value in iter_fields(meta):  # type: ignore[arg-type]
        if wire != WIRE_BYTES:
            raise DecodeError(f"SavedTensorSliceMeta field {no} has the wrong wire type")
        if no == 1:
            name, shape, dtype, slices = b"", (), 0, []
            for tno, twire, tval in iter_fields(value):  # type: ignore[arg-type]
                if tno == 1 and twire == WIRE_BYTES:
                    name = tval  # type: ignore[assignment]
                elif tno == 2 and twire == WIRE_BYTES:
                    shape = parse_shape(tval)  # type: ignore[arg-type]
                elif tno == 3 and twire == WIRE_VARINT:
                    dtype = int64_field(tval, "SavedSliceMeta.type")
                elif tno == 4 and twire == WIRE_BYTES:
                    slices.append(parse_slice(tval))  # type: ignore[arg-type]
                elif tno <= 4:
                    raise DecodeError(f"SavedSliceMeta field {tno} has wire type {twire}")
            try:
                text = name.decode("utf-8")  # type: ignore[union-attr]
            except UnicodeDecodeError:
                raise DecodeError(f"tensor name {name!r} is not valid UTF-8") from None
            tensors.append((text, shape, dtype, slices))
        elif no == 2:  # VersionDef
            for vno, vwire, vval in iter_fields(value):  # type: ignore[arg-type]
                if vno == 2 and vwire == WIRE_VARINT:
                    min_consumer = int64_field(vval, "min_consumer")
                elif vno == 3 and vwire == WIRE_VARINT:
                    bad.append(int64_field(vval, "bad_consumers"))
    return tensors, min_consumer, bad


def _parse_saved_slice(buf: memoryview) -> Tuple[memoryview, Extents, memoryview]:
    """Decode a data entry's ``SavedTensorSlices.data`` (a ``SavedSlice``): name, slice, values
    (views into ``buf``: a tensor's values are not copied until they are decoded)."""
    data = None
    for no, wire, value in iter_fields(buf):
        if no == 2 and wire == WIRE_BYTES:
            data = value
    if data is None:
        raise DecodeError("the entry holds no SavedSlice")
    name, extents, values = memoryview(b""), (), memoryview(b"")
    for no, wire, value in iter_fields(data):  # type: ignore[arg-type]
        if wire != WIRE_BYTES:
            raise DecodeError(f"SavedSlice field {no} has the wrong wire type")
        if no == 1:
            name = value  # type: ignore[assignment]
        elif no == 2:
            extents = parse_slice(value)  # type: ignore[arg-type]
        elif no == 3:
            values = value  # type: ignore[assignment]
    return name, extents, values  # type: ignore[return-value]


class _File:
    """One table file, opened lazily; reads are positional and thread-safe."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._fd: Optional[int] = None
        self._lock = threading.Lock()
        #: A URL's file: each read is one ranged request (no descriptor, no lock).
        self._remote = storage.RemoteFile(path) if storage.is_url(path) else None
        try:
            self.size = self._remote.size if self._remote is not None else os.stat(path).st_size
        except FileNotFoundError:
            raise CheckpointNotFoundError(f"V1 checkpoint file {path!r} does not exist.", path=path) from None
        except OSError as e:
            limits.check(e, path)
            raise CheckpointFormatError(f"Cannot read checkpoint file {path!r}: {e}", path=path) from None

    def read_at(self, offset: int, size: int) -> bytes:
        if self._remote is not None:
            buf = bytearray(size)
            data = bytes(buf[:self._remote.readinto(offset, memoryview(buf))])
        else:
            data = self._pread(offset, size)
        if len(data) != size:
            raise CheckpointFormatError(
                f"Checkpoint file {escape_name(storage.basename(self.path))} ended early ({len(data)} of {size} "
                f"bytes at offset {offset}); it was truncated after it was opened. (File: {escape_name(self.path)})",
                path=self.path)
        return data

    def _pread(self, offset: int, size: int) -> bytes:
        with self._lock:
            try:
                if self._fd is None:
                    self._fd = os.open(self.path, os.O_RDONLY | getattr(os, "O_BINARY", 0))
                if hasattr(os, "pread"):
                    chunks = []
                    done = 0
                    while done < size:
                        chunk = os.pread(self._fd, size - done, offset + done)
                        if not chunk:
                            break
                        chunks.append(chunk)
                        done += len(chunk)
                    data = b"".join(chunks)
                else:  # pragma: no cover - Windows
                    os.lseek(self._fd, offset, os.SEEK_SET)
                    data = os.read(self._fd, size)
            except OSError as e:
                limits.check(e, self.path)
                raise CheckpointFormatError(f"Cannot read checkpoint file {self.path!r}: {e}",
                                            path=self.path) from None
        return data

    def close(self) -> None:
        with self._lock:
            fd, self._fd = self._fd, None
        if fd is not None:
            try:
                os.close(fd)
            except OSError:  # pragma: no cover
                pass


class V1Reader(CheckpointReader):
    """Reader of a TF V1 checkpoint: one table file, or a sharded set given by its pattern.

    Use :func:`ckptmerge.formats.open_checkpoint` rather than this class directly.

    Args:
        path: the checkpoint file (``model.ckpt-1000``), or the pattern of a sharded set
            (``model.ckpt-1000-?????-of-00002``, as the ``checkpoint`` state file records it),
            every shard of which must exist.
        verify: check the CRC32C of every table block read. ``False`` reads damaged files
            anyway, for salvage.

    Raises:
        CheckpointNotFoundError: no file (or no shard of the pattern) exists.
        CheckpointFormatError: a shard is missing, or a file is corrupt or not a V1 checkpoint.

    Example:
        >>> with V1Reader("old/model.ckpt-1000") as r:  # doctest: +SKIP
        ...     r.get("weights").shape
        (784, 10)
    """

    format = "tf-v1"

    def __init__(self, path: str, *, verify: bool = True) -> None:
        super().__init__(path)
        self.verify = verify
        self.files = v1_shard_files(self.path)
        missing = [f for f in self.files if not storage.isfile(f)]
        if len(missing) == len(self.files):  # also a pattern of 0 shards
            raise CheckpointNotFoundError(
                f"V1 checkpoint {self.path!r} does not exist"
                + (f" (no file {storage.basename(missing[0])!r})." if missing else "."), path=self.path)
        if missing:
            raise CheckpointFormatError(
                f"V1 checkpoint {storage.basename(self.path)} is incomplete: shard "
                f"{storage.basename(missing[0])} is missing ({len(missing)} of {len(self.files)} "
                f"shards missing). Copy every shard of the set. (File: {missing[0]})", path=missing[0])
        self._files: List[_File] = []
        self._tables: List[Table] = []
        self._tensors: Dict[str, _Meta] = {}
        try:
            for number, file_path in enumerate(self.files):
                f = _File(file_path)
                self._files.append(f)
                self._load(number, f)
        except BaseException:
            self.close()
            raise
        self._set_infos(self._make_infos())
        logger.debug("opened V1 checkpoint %s: %d tensors in %d files", self.path, len(self._tensors),
                      len(self.files))

    # -- opening ---------------------------------------------------------------------------
    def _error(self, file_path: str, problem: str, key: Optional[str] = None) -> CheckpointFormatError:
        return CheckpointFormatError(
            f"Corrupt V1 checkpoint {escape_name(storage.basename(file_path))}: {problem}. The file is damaged "
            f"or not a TensorFlow checkpoint; re-copy it. (File: {escape_name(file_path)})", path=file_path, key=key)

    def _load(self, number: int, f: _File) -> None:
        try:
            table = Table(f.size, f.read_at, verify=self.verify)
            raw_meta = table.get(b"")
        except TableError as e:
            raise self._error(f.path, str(e)) from None
        self._tables.append(table)
        if raw_meta is None:
            raise self._error(f.path, "no metadata entry (empty key)")
        try:
            tensors, min_consumer, bad = _parse_meta(raw_meta)
        except DecodeError as e:
            raise self._error(f.path, f"bad metadata: {e}") from None
        if min_consumer > _CHECKPOINT_VERSION or _CHECKPOINT_VERSION in bad:
            raise CheckpointFormatError(
                f"V1 checkpoint {storage.basename(f.path)} needs a reader of checkpoint version "
                f">= {min_consumer} (or other than {bad}); ckptmerge reads version "
                f"{_CHECKPOINT_VERSION}. Read it with the TensorFlow that wrote it.", path=f.path)
        seen = set()
        for name, shape, dtype, slices in tensors:
            if name in seen:
                raise self._error(f.path, f"tensor {name!r} is listed twice", name)
            seen.add(name)
            meta = self._tensors.get(name)
            if meta is None:
                meta = self._tensors[name] = _Meta(name, shape, dtype)
            elif (meta.shape, meta.dtype) != (shape, dtype):
                raise self._error(
                    f.path, f"tensor {name!r} is {tf_dtype_name(dtype)} {shape} here but "
                            f"{tf_dtype_name(meta.dtype)} {meta.shape} in another shard", name)
            meta.slices.extend((extents, number) for extents in slices)

    def _make_infos(self) -> List[VariableInfo]:
        infos = []
        for m in self._tensors.values():
            nbytes = numel(m.shape) * TF_ITEMSIZE.get(m.dtype, 0)  # (strings: 0; no ml_dtypes needed)
            infos.append(VariableInfo(m.name, m.shape, tf_dtype_name(m.dtype), m.name,
                                      name_based_kind(m.name), nbytes))
        return infos

    # -- reading ---------------------------------------------------------------------------
    def _read_slice(self, m: _Meta, extents: Extents, number: int, count: int) -> np.ndarray:
        file_path = self.files[number]
        label = m.name if len(m.slices) == 1 else f"{m.name} (slice {list(extents)})"
        key = encode_tensor_name_slice(m.name, extents)
        try:
            raw = self._tables[number].get(key)
        except TableError as e:
            raise self._error(file_path, f"{e} (reading tensor {label!r})", m.name) from None
        if raw is None:
            raise self._error(file_path, f"the data of tensor {label!r} is missing", m.name)
        try:
            name, stored_extents, values = _parse_saved_slice(memoryview(raw))
            if name != m.name.encode("utf-8") or stored_extents != tuple(extents):
                raise DecodeError(f"its entry holds {bytes(name)!r} slice {stored_extents}")
            return decode_tensor_values(values, m.dtype, count)
        except DecodeError as e:
            raise self._error(file_path, f"bad data for tensor {label!r}: {e}", m.name) from None

    def _read(self, info: VariableInfo) -> np.ndarray:
        m = self._tensors[info.raw_key]
        dt = TF_TO_NUMPY.get(m.dtype)
        first_file = self.files[m.slices[0][1]] if m.slices else self.files[0]
        if dt is None:
            raise unreadable_dtype_error(self.path, m.name, m.dtype, first_file)
        if too_large_for_numpy(m.shape, dt.itemsize):
            raise self._error(first_file, f"tensor {m.name!r} has shape {m.shape}, too large for any "
                                          "array", m.name)
        try:
            boxes = slice_boxes(m.name, m.shape, [extents for extents, _ in m.slices])
        except SliceError as e:
            raise self._error(first_file, str(e), m.name) from None
        # Decode every slice before allocating the full tensor: the metadata's shape is only
        # trusted once the data it describes has been read.
        parts = [self._read_slice(m, extents, number, volume(box))
                 for (extents, number), box in zip(m.slices, boxes)]
        if len(parts) == 1:
            return parts[0].reshape(m.shape)
        out = np.empty(m.shape, dtype=dt)
        for box, part in zip(boxes, parts):
            out[tuple(slice(a, b) for a, b in box)] = part.reshape(tuple(b - a for a, b in box))
        return out

    def close(self) -> None:
        """Close the files (reading again reopens them)."""
        for f in self._files:
            f.close()
