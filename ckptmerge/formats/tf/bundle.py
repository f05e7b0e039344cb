"""Read TensorFlow V2 checkpoints (tensor bundles) with numpy only, no TensorFlow.

A bundle is ``<prefix>.index`` plus ``<prefix>.data-NNNNN-of-MMMMM`` shard files. The index is
a LevelDB-format table (sorted string keys, prefix-compressed blocks, each followed by a
compression byte and a masked CRC32C, and a 48-byte footer ending in a magic number). Its entry
with the empty key is a ``BundleHeaderProto``; every other entry is a ``BundleEntryProto`` saying
where a tensor's bytes are (shard, offset, size), its dtype, shape and masked CRC32C. Numeric tensors are stored as raw little-endian bytes; strings as varint
lengths, a masked checksum of the lengths, then the bytes. A partitioned variable has one entry
without data listing its ``slices``, each slice stored under a key made with TF's
``EncodeTensorNameSlice`` (OrderedCode). Layouts follow TensorFlow's
``core/util/tensor_bundle``; the table itself is read by :mod:`ckptmerge.formats.tf.table`, slice
keys and the check that slices tile their tensor are :mod:`ckptmerge.formats.tf.slices`.

Every problem in a file (truncation, bad checksum, bad varint, out-of-range offset) raises
:class:`~ckptmerge.core.errors.CheckpointFormatError` naming the file; sizes are always checked
against file lengths before anything is allocated, and a partitioned tensor is read only when
its slices tile it exactly (see :mod:`ckptmerge.formats.tf.regions`).
"""

from __future__ import annotations

import bisect
import os
import re
import struct
from concurrent.futures import ThreadPoolExecutor
from typing import (
    Dict,
    Iterable,
    Iterator,
    List,
    Mapping,
    Optional,
    Tuple,
)

import numpy as np

from ckptmerge.core import limits
from ckptmerge.core.errors import CheckpointFormatError, CheckpointNotFoundError
from ckptmerge.formats.base import (
    CheckpointReader,
    aligned_empty,
    too_large_for_numpy,
    unreadable_dtype_error,
)
from ckptmerge.formats.dtypes import DT_STRING, TF_ITEMSIZE, TF_TO_NUMPY, tf_dtype_name
from ckptmerge.formats.io.fileio import Descriptors, pread_into
from ckptmerge.formats.io.localfile import NotARegularFileError, regular_size
from ckptmerge.formats.io.storage import (
    REMOTE_CONCURRENCY,
    is_url,
    read_small,
    remote_size,
)
from ckptmerge.formats.io.urlpath import add_suffix, basename
from ckptmerge.formats.ranges import TensorRanges
from ckptmerge.formats.tf.bundleindex import (
    OFFSET,
    SHARD,
    SIZE,
    BundleEntry,
    EntriesByKey,
    EntriesByRawKey,
    EntryColumns,
    decode_fields,
    parse_entry_checked,
    parse_header,
    shape_column,
)
from ckptmerge.formats.tf.crc import crc32c_combine, string_lengths_crc
from ckptmerge.formats.tf.objectgraph import (
    OBJECT_GRAPH_KEY,
    ObjectGraph,
    name_based_kinds,
    parse_object_graph,
)
from ckptmerge.formats.tf.partitioned import Part, PartitionedReads
from ckptmerge.formats.tf.protowire import DecodeError, read_varint
from ckptmerge.formats.tf.readplan import allocate_many, read_units
from ckptmerge.formats.tf.slices import (
    encode_tensor_name_slice,
    numel,
)
from ckptmerge.formats.tf.table import (
    TABLE_MAGIC,
    Columns,
    Table,
    TableError,
    crc32c,
    is_leveldb_table,
    mask_crc,
    read_table,
    unmask_crc,
)
from ckptmerge.core.gcpause import paused_gc
from ckptmerge.core.redact import get_logger
from ckptmerge.core.specs import VariableInfo, trusted_info

__all__ = [
    "BundleReader",
    "BundleEntry",
    "ShortShardError",
    "TABLE_MAGIC",
    "read_table",
    "mask_crc",
    "unmask_crc",
    "crc32c",
    "crc32c_combine",
    "encode_tensor_name_slice",
    "data_file_name",
    "DATA_RE",
    "is_leveldb_table",
]

logger = get_logger(__name__)

_U32 = struct.Struct("<I")
_SUPPORTED_MIN_CONSUMER = 1  # TF's kTensorBundleVersion
_PIECE = 1 << 20  # read and checksum in pieces small enough to stay in the CPU cache


class ShortShardError(CheckpointFormatError):
    """A data shard is shorter than the entries of its index need: truncated, or (to a watcher)
    still being written or copied."""


#: A data file's name ending, ``.data-<shard>-of-<shards>`` (groups: shard, shard count).
DATA_RE = re.compile(r"\.data-(\d{5})-of-(\d{5})$")


def data_file_name(prefix: str, shard: int, num_shards: int) -> str:
    """Return the data file of ``shard``: ``<prefix>.data-00000-of-00002``.

    Example:
        >>> data_file_name("model.ckpt", 1, 2)
        'model.ckpt.data-00001-of-00002'
    """
    return add_suffix(prefix, f".data-{shard:05d}-of-{num_shards:05d}")  # before a URL's query


# --------------------------------------------------------------------------------------------
# The reader
# --------------------------------------------------------------------------------------------
class BundleReader(PartitionedReads, CheckpointReader):
    """Reader of a TF V2 checkpoint (``<prefix>.index`` + ``<prefix>.data-*``).

    Use :func:`ckptmerge.formats.open_checkpoint` rather than this class directly.

    Args:
        prefix: the checkpoint prefix (``.../model.ckpt-1000``).
        verify: check every CRC32C (index blocks and tensor data). ``False`` reads corrupt
            files anyway, for salvage.

    Raises:
        CheckpointNotFoundError: if the ``.index`` file does not exist.
        CheckpointFormatError: if the index is corrupt, a data shard is missing or too short.

    Example:
        >>> with BundleReader("runs/base/model.ckpt-1000") as r:  # doctest: +SKIP
        ...     r.get("dense/kernel").shape
        (784, 128)
    """

    format = "tf-bundle"

    def __init__(self, prefix: str, *, verify: bool = True) -> None:
        super().__init__(prefix)
        self.verify = verify
        self.index_path = add_suffix(self.path, ".index")
        self._fds = Descriptors()
        self._index_name = basename(self.index_path)
        #: True when the checkpoint is a URL (object storage through fsspec): ranged reads.
        self.remote = is_url(self.path)
        try:
            if self.remote:
                data = read_small(self.index_path)
            else:
                with open(self.index_path, "rb") as f:
                    data = f.read()
        except (FileNotFoundError, CheckpointNotFoundError):
            raise CheckpointNotFoundError(
                f"Checkpoint index file {self.index_path!r} does not exist. Pass the checkpoint "
                f"prefix (the path without '.index'), e.g. 'model.ckpt-1000'. Received: "
                f"path={self.path!r}", path=self.path) from None
        except OSError as e:
            limits.check(e, self.index_path)
            raise CheckpointFormatError(f"Cannot read checkpoint index {self.index_path!r}: {e}",
                                        path=self.index_path) from None
        with paused_gc():  # one small object per tensor: see ckptmerge.core.gcpause
            self._load_index(data)
            self._check_shards()
            self.object_graph: Optional[ObjectGraph] = self._load_object_graph()
            self._set_infos(self._make_infos())
        logger.debug("opened %s: %d tensors in %d shards", self.path, len(self._ordered), self.num_shards)

    # -- index -----------------------------------------------------------------------------
    def _index_error(self, problem: str, key: Optional[str] = None) -> CheckpointFormatError:
        return CheckpointFormatError(
            f"Corrupt checkpoint index {self._index_name}: {problem}. The file is damaged or "
            f"not a TensorFlow checkpoint index; re-copy it. (File: {self.index_path})",
            path=self.index_path, key=key)

    def _load_index(self, data: bytes) -> None:
        try:
            cols = Table(len(data), lambda offset, size: data[offset:offset + size],
                         verify=self.verify).columns(text=True)
        except TableError as e:
            raise self._index_error(str(e)) from None
        if not cols.keys or cols.keys[0] != "":
            raise self._index_error("no bundle header entry (empty key)")
        try:
            num_shards, endianness, min_consumer, bad = parse_header(cols.data[cols.starts[0]:cols.ends[0]])
        except DecodeError as e:
            raise self._index_error(f"bad bundle header: {e}") from None
        if endianness == 1:
            raise CheckpointFormatError(
                f"Checkpoint {self._index_name} was written on a big-endian machine; ckptmerge "
                "reads little-endian checkpoints only. TensorFlow reads it anywhere (it swaps "
                "bytes while reading): restore it with TensorFlow on a little-endian machine "
                "and save it again to get a little-endian copy.",
                path=self.index_path)
        if endianness != 0:
            raise self._index_error(f"unknown endianness {endianness}")
        if min_consumer > _SUPPORTED_MIN_CONSUMER or _SUPPORTED_MIN_CONSUMER in bad:
            need = (f"a reader of bundle version >= {min_consumer}" if min_consumer > _SUPPORTED_MIN_CONSUMER
                    else f"a reader other than bundle version {_SUPPORTED_MIN_CONSUMER} (marked bad)")
            raise CheckpointFormatError(
                f"Checkpoint {self._index_name} needs {need}; ckptmerge reads bundle version "
                f"{_SUPPORTED_MIN_CONSUMER}. It was written by a newer TensorFlow; upgrade "
                "ckptmerge, or read it with that TensorFlow.", path=self.index_path)
        self.num_shards = num_shards
        self._columns = self._decode_entries(cols)
        self._entries = EntriesByKey(self._columns)  # by key as text: names and keys are text
        self._raw_entries = EntriesByRawKey(self._columns)  # by key as stored: slice keys are bytes
        fields = self._columns.fields
        has_data = np.ones(len(self._columns), bool)
        for i, e in self._columns.special.items():
            has_data[i] = not e.slices
        if num_shards <= 0 and has_data.any():
            raise self._index_error(f"header says {num_shards} shards")
        beyond = np.flatnonzero(has_data & (fields[SHARD] >= num_shards))
        if beyond.size:
            e = self._columns.entry(int(beyond[0]))
            raise self._index_error(
                f"tensor {e.key!r} is in shard {e.shard_id} but the header says there "
                f"are {num_shards} shards", e.key)
        self._has_data = has_data

    def _decode_entries(self, cols: Columns) -> EntryColumns:
        """Decode every entry but the header (in bulk; see :mod:`ckptmerge.formats.tf.bundleindex`),
        raising the first problem in key order, as reading them one by one would."""
        raw_keys = cols.keys[1:]  # (as Latin-1 text: one character per stored byte)
        hidden = bisect.bisect_left(raw_keys, "\x01")  # slice keys start with \x00: binary, never shown
        keys = raw_keys[:hidden]
        bad_utf8 = len(raw_keys)
        if all(map(str.isascii, raw_keys[hidden:])):  # (then Latin-1 is UTF-8: the usual case)
            keys += raw_keys[hidden:]
        else:
            for i in range(hidden, len(raw_keys)):
                try:
                    keys.append(raw_keys[i].encode("latin-1").decode("utf-8"))
                except UnicodeDecodeError:
                    bad_utf8 = i
                    break
        data, starts, ends = cols.data, cols.starts[1:], cols.ends[1:]
        fields, shape_starts, shape_ends, careful = decode_fields(data, starts, ends)
        shape_table, shape_ids, redo = shape_column(data, shape_starts, shape_ends)
        if redo:  # the careful parser explains them
            careful = np.union1d(careful, redo).astype(np.int64)
        special: Dict[int, BundleEntry] = {}
        for i in careful.tolist():
            if i >= bad_utf8:
                break
            try:
                e = special[i] = parse_entry_checked(keys[i], data[starts[i]:ends[i]])
            except DecodeError as err:
                raise self._index_error(f"bad entry for tensor {keys[i]!r}: {err}", keys[i]) from None
            fields[SHARD, i], fields[OFFSET, i], fields[SIZE, i] = e.shard_id, e.offset, e.size
            shape_ids[i] = len(shape_table)  # (a few: no need to share them)
            shape_table.append(e.shape)
        if bad_utf8 < len(raw_keys):
            raise self._index_error(f"key {raw_keys[bad_utf8].encode('latin-1')!r} is not valid UTF-8") from None
        return EntryColumns(keys, fields, shape_table, shape_ids, special)

    def _check_shards(self) -> None:
        """Every data shard an entry needs exists and holds the entry's bytes (the first problem
        in key order is raised)."""
        self._shard_paths: Dict[int, str] = {}
        self._shard_sizes: Dict[int, int] = {}
        cols = self._columns
        with_data = np.flatnonzero(self._has_data)
        if not with_data.size:
            return
        shard_of = cols.fields[SHARD, with_data]
        used, first = np.unique(shard_of, return_index=True)
        sizes = np.full(len(used), -1, np.int64)
        problem: Optional[Tuple[int, CheckpointFormatError]] = None  # (entry position, error)
        for j, (shard, at) in enumerate(zip(used.tolist(), first.tolist())):
            path = self._shard_path(shard)
            try:
                sizes[j] = self._shard_sizes[shard] = remote_size(path) if self.remote else regular_size(path)
            except (FileNotFoundError, CheckpointNotFoundError, NotARegularFileError) as e:  # (a FIFO: never read)
                key = cols.keys[int(with_data[at])]
                err = CheckpointFormatError(
                    f"Checkpoint data file {basename(path)} (shard {shard + 1} of {self.num_shards}) "
                    f"{e.reason if isinstance(e, NotARegularFileError) else 'is missing'}; it holds tensor {key!r}. Copy all "
                    f"'{basename(self.path)}.data-*' files along with the .index. "
                    f"(File: {path})", path=path, key=key)
                problem = min(problem, (at, err), key=lambda p: p[0]) if problem else (at, err)
            except OSError as e:
                limits.check(e, path)
                key = cols.keys[int(with_data[at])]
                err = CheckpointFormatError(f"Cannot read checkpoint data file {path!r}: {e}", path=path, key=key)
                problem = min(problem, (at, err), key=lambda p: p[0]) if problem else (at, err)
        size_of = sizes[np.searchsorted(used, shard_of)]
        ends = cols.fields[OFFSET, with_data] + cols.fields[SIZE, with_data]
        short = np.flatnonzero((size_of >= 0) & (ends > size_of))
        if short.size and (problem is None or short[0] < problem[0]):
            e = cols.entry(int(with_data[short[0]]))
            path = self._shard_path(e.shard_id)
            raise ShortShardError(
                f"Checkpoint data file {basename(path)} is too short: tensor "
                f"{e.key!r} needs bytes {e.offset}..{e.offset + e.size} but the file has "
                f"{int(size_of[short[0]])}. The file is truncated or does not belong to this index; re-copy "
                f"it. (File: {path})", path=path, key=e.key)
        if problem is not None:
            raise problem[1]

    def _shard_path(self, shard: int) -> str:
        path = self._shard_paths.get(shard)
        if path is None:
            path = self._shard_paths[shard] = data_file_name(self.path, shard, self.num_shards)
        return path

    def _load_object_graph(self) -> Optional[ObjectGraph]:
        entry = self._entries.get(OBJECT_GRAPH_KEY)
        if entry is None or entry.dtype != DT_STRING or entry.shape != () or entry.slices:
            return None
        raw = self._read_entry(entry)[()]
        try:
            return parse_object_graph(raw)
        except DecodeError as e:
            raise CheckpointFormatError(
                f"Corrupt object graph ({OBJECT_GRAPH_KEY}) in checkpoint {basename(self.path)}: "
                f"{e}. (File: {self._shard_path(entry.shard_id)})",
                path=self._shard_path(entry.shard_id), key=OBJECT_GRAPH_KEY) from None

    def _make_infos(self) -> List[VariableInfo]:
        cols = self._columns
        first = bisect.bisect_left(cols.keys, "\x01")  # slice keys (\x00...) sort first
        keys = cols.keys[first:]
        if self.object_graph is not None:
            named = self.object_graph.name_keys(keys)
            names = [named[k][0] for k in keys]
            kinds = [named[k][1] for k in keys]
        else:
            names, kinds = keys, name_based_kinds(keys)
        # Described once per distinct (dtype, shape), not per entry: 100,000 entries hold a few.
        indices = range(first, len(cols))
        dtypes, shape_ids = np.array(cols.dtypes(indices), np.int64), cols.shape_ids[first:]
        distinct_dtypes, dtype_at = np.unique(dtypes, return_inverse=True)
        n_shapes = len(cols.shape_table)
        pairs, pair_at = np.unique(dtype_at.reshape(-1) * n_shapes + shape_ids, return_inverse=True)
        pair_at = pair_at.reshape(-1)
        dtype_names: List[str] = []
        nbytes: List[Optional[int]] = []  # None: the stored size (strings, unknown dtypes)
        for p in pairs.tolist():
            dtype, shape = int(distinct_dtypes[p // n_shapes]), cols.shape_table[p % n_shapes]
            item = TF_ITEMSIZE.get(dtype)  # (not TF_TO_NUMPY: listing needs no ml_dtypes)
            dtype_names.append(tf_dtype_name(dtype))
            nbytes.append(None if dtype == DT_STRING or item is None else numel(shape) * item)
        at = pair_at.tolist()
        entry_nbytes = list(map(nbytes.__getitem__, at))
        if None in nbytes:
            stored = cols.fields[SIZE, first:]
            for j in np.flatnonzero(np.array([b is None for b in nbytes])[pair_at]).tolist():
                e = cols.special.get(first + j)
                entry_nbytes[j] = 0 if e is not None and e.slices else int(stored[j])
        shapes = list(map(cols.shape_table.__getitem__, shape_ids.tolist()))
        return list(map(trusted_info, names, shapes, list(map(dtype_names.__getitem__, at)), keys, kinds,
                        entry_nbytes))

    @property
    def entries(self) -> Mapping[str, BundleEntry]:
        """Every decoded index entry by key, slice entries included (keys start with ``\\x00``),
        as a read-only mapping that builds each :class:`BundleEntry` when it is looked up."""
        return self._entries

    # -- file access -----------------------------------------------------------------------
    def data_fd(self, shard: int) -> int:
        """The read-only file descriptor of data shard ``shard``, opened once and owned by this
        reader (closed by :meth:`close`); for callers that copy raw tensor bytes themselves."""
        return self._fd(shard)

    def _fd(self, shard: int) -> int:
        if self.remote:  # callers that copy raw bytes by descriptor (merge) check .remote first
            raise CheckpointFormatError(f"{self._shard_path(shard)!r} is remote: it has no file descriptor.",
                                        path=self._shard_path(shard))
        path = self._shard_path(shard)
        try:
            return self._fds.get(shard, path)
        except OSError as e:
            raise CheckpointFormatError(f"Cannot open checkpoint data file {path!r}: {e}", path=path) from None

    def read_into(self, shard: int, offset: int, buf: memoryview, key: str, label: Optional[str] = None) -> None:
        """Fill ``buf`` (a writable byte view) with the raw bytes of data shard ``shard`` at
        ``offset``, for callers that copy tensor bytes themselves (no CRC check here).

        Raises:
            CheckpointFormatError: the read failed or the file ended early; the message names
                the tensor by ``label`` (default: its raw ``key``) and the file.
        """
        self._read_into(shard, offset, buf, key, label)

    def _read_into(self, shard: int, offset: int, buf: memoryview, key: str,
                   label: Optional[str] = None) -> None:
        """Fill ``buf`` (a writable byte view) with the shard's bytes at ``offset``."""
        shown = key if label is None else label
        n = len(buf)
        if self.remote:
            # a URL's handle is a RemoteFile, whose errors already name the URL and tensor
            done = pread_into(self._fds.get(shard, self._shard_path(shard)), offset, buf, key=key)
        else:
            try:
                done = pread_into(self._fd(shard), offset, buf)
            except OSError as e:
                path = self._shard_path(shard)
                raise CheckpointFormatError(f"Cannot read tensor {shown!r} from {path!r}: {e}",
                                            path=path, key=key) from None
        if done < n:
            path = self._shard_path(shard)
            raise CheckpointFormatError(
                f"Checkpoint data file {basename(path)} ended early while reading tensor "
                f"{shown!r} ({done} of {n} bytes at offset {offset}); the file was truncated after "
                f"the checkpoint was opened. (File: {path})", path=path, key=key)

    def _label(self, e: BundleEntry, label: Optional[str] = None) -> str:
        """The tensor as users know it: its name, or ``name (slice ...)``."""
        if label is None:
            label = self._by_key.get(e.key, e.key)
        return repr(label)

    def _crc_error(self, e: BundleEntry, actual: int, label: Optional[str] = None) -> CheckpointFormatError:
        path = self._shard_path(e.shard_id)
        return CheckpointFormatError(
            f"checksum mismatch for tensor {self._label(e, label)} in {basename(path)} "
            f"(expected 0x{unmask_crc(e.crc32c):08x}, got 0x{actual:08x}); the file is corrupt "
            f"or was modified; re-copy it, or read it anyway with verify=False ('ckptmerge show/ls/diff "
            f"--no-verify' on the command line). (File: {path})",
            path=path, key=e.key)

    def _data_error(self, e: BundleEntry, problem: str, label: Optional[str] = None) -> CheckpointFormatError:
        path = self._shard_path(e.shard_id)
        return CheckpointFormatError(
            f"Corrupt tensor {self._label(e, label)} in {basename(path)}: {problem}. (File: {path})",
            path=path, key=e.key)

    def _unreadable(self, e: BundleEntry) -> CheckpointFormatError:
        return unreadable_dtype_error(self.path, e.key, e.dtype, self.path)

    # -- reading tensors -------------------------------------------------------------------
    def _check_numeric(self, e: BundleEntry, label: Optional[str] = None) -> np.dtype:
        """Validate a numeric entry's size against its dtype and shape; return the dtype."""
        dt = TF_TO_NUMPY.get(e.dtype)
        if dt is None or e.dtype == DT_STRING:
            raise self._unreadable(e)
        self._check_shape(e, dt, label)
        expected = numel(e.shape) * dt.itemsize
        if e.size != expected:
            raise self._data_error(e, f"index says {e.size} bytes but shape {e.shape} of "
                                      f"{tf_dtype_name(e.dtype)} needs {expected}", label)
        return dt

    def _check_strings(self, e: BundleEntry, label: Optional[str] = None) -> None:
        """Validate a string entry's element count against its size."""
        self._check_shape(e, np.dtype(object), label)
        n = numel(e.shape)
        if n > e.size:  # every element needs at least a 1-byte length
            raise self._data_error(e, f"{n} strings cannot fit in {e.size} bytes", label)

    def _alloc(self, e: BundleEntry, label: Optional[str] = None) -> np.ndarray:
        """Validate a numeric entry; return an uninitialised array for it."""
        return aligned_empty(e.shape, self._check_numeric(e, label))

    def _read_crc(self, shard: int, offset: int, view: memoryview, key: str, verify: bool, crc: int = 0) -> int:
        """Fill ``view`` from the shard in cache-sized pieces; return the CRC32C continued from
        ``crc`` (0 unless ``verify``): each piece is checksummed while still in the CPU cache."""
        if self.remote:  # one ranged request, then the checksum: requests cost more than cache misses
            self._read_into(shard, offset, view, key)
            return crc32c(view, crc) if verify else crc
        for pos in range(0, len(view), _PIECE):
            piece = view[pos:pos + _PIECE]
            self._read_into(shard, offset + pos, piece, key)
            if verify:
                crc = crc32c(piece, crc)
        return crc

    def _read_entry(self, e: BundleEntry, label: Optional[str] = None) -> np.ndarray:
        if e.dtype == DT_STRING:
            return self._read_strings(e, label)
        arr = self._alloc(e, label)
        self._fill(e, memoryview(arr.reshape(-1).view(np.uint8)), label)
        return arr

    def _check_shape(self, e: BundleEntry, dt: np.dtype, label: Optional[str] = None) -> None:
        if too_large_for_numpy(e.shape, dt.itemsize):
            raise self._data_error(e, f"shape {e.shape} is too large for any array", label)

    def _fill(self, e: BundleEntry, view: memoryview, label: Optional[str] = None) -> None:
        """Read a checked numeric entry's bytes into ``view`` (exactly its size); verify its CRC."""
        actual = self._read_crc(e.shard_id, e.offset, view, e.key, self.verify) if e.size else 0
        if self.verify and actual != unmask_crc(e.crc32c):
            raise self._crc_error(e, actual, label)

    def _read_strings(self, e: BundleEntry, label: Optional[str] = None) -> np.ndarray:
        self._check_strings(e, label)
        n = numel(e.shape)
        raw = bytearray(e.size)
        if e.size:
            self._read_into(e.shard_id, e.offset, memoryview(raw), e.key)
        raw = bytes(raw)
        pos = 0
        lengths = []
        try:
            for _ in range(n):
                length, pos = read_varint(raw, pos)
                lengths.append(length)
        except DecodeError as err:
            raise self._data_error(e, f"bad string length: {err}", label) from None
        if pos + 4 + sum(lengths) != len(raw):
            raise self._data_error(e, f"string lengths add up to {pos + 4 + sum(lengths)} bytes "
                                      f"but the tensor has {len(raw)}", label)
        if self.verify:
            # TF checksums each length as a uint32 (uint64 when >= 2**32), not the varints.
            crc = string_lengths_crc(lengths)
            stored_len_crc = _U32.unpack_from(raw, pos)[0]
            rest = memoryview(raw)[pos:]  # the masked length CRC, then the bytes: no copy
            if unmask_crc(stored_len_crc) != crc:
                raise self._crc_error(e, crc32c(rest, crc), label)
            crc = crc32c(rest, crc)
            if crc != unmask_crc(e.crc32c):
                raise self._crc_error(e, crc, label)
        pos += 4
        out = np.empty(n, dtype=object)
        for i, length in enumerate(lengths):
            out[i] = raw[pos:pos + length]
            pos += length
        return out.reshape(e.shape)

    def _iter_chunks(self, info: VariableInfo, max_elements: int) -> Iterator[np.ndarray]:
        """Numeric tensors piece by piece, from their entry or their slices (checked first);
        strings whole (they are as big in memory as in the file)."""
        e = self._entries[info.raw_key]
        if e.dtype == DT_STRING:
            return super()._iter_chunks(info, max_elements)
        dt = TF_TO_NUMPY.get(e.dtype)
        if dt is None:
            raise self._unreadable(e)
        if e.slices:
            parts = self._slice_plan(e)
        else:
            self._check_numeric(e)
            parts = [Part(tuple((0, d) for d in e.shape), e, None)]
        return self._stream(e.shape, dt, parts, max_elements)

    def ranges(self, name: str) -> Optional[TensorRanges]:
        """A numeric tensor of a local bundle stored in one entry as
        :class:`~ckptmerge.formats.ranges.TensorRanges`, its CRC32C checked (unless
        ``verify=False``) once every byte was read; ``None`` for strings, partitioned variables,
        empty tensors and URLs (use :meth:`iter_chunks`). Raises as :meth:`get` for a bad entry.

        Example:
            >>> r = reader.ranges("dense/kernel")                          # doctest: +SKIP
        """
        e = self._entries[self.info(name).raw_key]
        dt = TF_TO_NUMPY.get(e.dtype)
        if self.remote or e.slices or e.dtype == DT_STRING or dt is None or not e.size:
            return None
        self._check_numeric(e)
        shard, start, key = e.shard_id, e.offset, e.key
        return TensorRanges(dt, e.size // dt.itemsize,
                            lambda offset, view: self._read_into(shard, start + offset, view, key),
                            unmask_crc(e.crc32c) if self.verify else None,
                            lambda actual: self._crc_error(e, actual), lambda: (self._fd(shard), start))

    def _read(self, info: VariableInfo) -> np.ndarray:
        e = self._entries[info.raw_key]
        if e.slices:
            return self._read_sliced(e)
        return self._read_entry(e)

    def read_many(self, names: Iterable[str], *, max_workers: Optional[int] = None) -> Dict[str, np.ndarray]:
        """Read several tensors at once, in parallel and in file order; returns ``{name: array}``.

        This is the fast path for restores. Numeric tensors are read straight into
        preallocated arrays by a thread pool: tensors of 4 MiB and more in segments of up to
        32 MiB, read in 1 MiB pieces that are checksummed while still in the CPU cache
        (``crc32c`` releases the GIL; segment checksums are combined); smaller tensors are
        packed into shared 64-byte-aligned buffers of up to 64 MiB (so they are views with
        ``owndata`` False, which avoids page-faulting thousands of small allocations) and
        runs of them that are contiguous in the file are read with one scatter read. Strings
        and partitioned tensors are read as :meth:`get` does.

        Args:
            names: names (or raw keys) of the tensors.
            max_workers: threads to use (default: ``min(8, 2 * cpu count)``; ``1`` reads
                sequentially).

        Raises:
            UnknownTensorError: for an unknown name (before anything is read).
            CheckpointFormatError: as :meth:`get`.

        Example:
            >>> arrays = reader.read_many(r.name for r in reader.variables())  # doctest: +SKIP
        """
        names = list(names)
        infos = [self.info(n) for n in names]
        out: Dict[str, np.ndarray] = {}
        by_key: Dict[str, BundleEntry] = {}
        for name, info in zip(names, infos):
            if name in out or info.raw_key in by_key:
                continue
            e = self._entries[info.raw_key]
            if e.slices or e.dtype == DT_STRING:
                out[name] = self._read(info)
            else:
                self._check_numeric(e)  # before anything is read
                by_key[e.key] = e
        plain = sorted(by_key.values(), key=lambda e: (e.shard_id, e.offset))
        arrays = allocate_many(plain)
        for name, info in zip(names, infos):
            if name not in out:
                out[name] = arrays[info.raw_key][0]
        units = read_units(plain, arrays)
        crcs: List[List[int]] = [[] for _ in units]
        verify = self.verify

        def run(j: int) -> None:
            unit = units[j]
            e0 = unit.entries[0]
            if not unit.segment:
                self._scatter_read(e0.shard_id, unit.offset, unit.views, e0.key)
                if verify:
                    crcs[j] = [crc32c(v) for v in unit.views]
            else:  # one segment of a big tensor
                crcs[j] = [self._read_crc(e0.shard_id, unit.offset, unit.views[0], e0.key, verify)]

        workers = max_workers or (REMOTE_CONCURRENCY.get() if self.remote else min(8, 2 * (os.cpu_count() or 1)))
        if workers <= 1 or len(units) <= 1:
            for j in range(len(units)):
                run(j)
        else:
            with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="ckptmerge-read") as pool:
                for _ in pool.map(run, range(len(units))):
                    pass
        if verify:
            actual: Dict[str, int] = {e.key: 0 for e in plain}
            for unit, unit_crcs in zip(units, crcs):
                e0 = unit.entries[0]
                if not unit.segment:
                    actual.update(zip((e.key for e in unit.entries), unit_crcs))
                elif unit.offset == e0.offset:
                    actual[e0.key] = unit_crcs[0]
                else:
                    actual[e0.key] = crc32c_combine(actual[e0.key], unit_crcs[0], len(unit.views[0]))
            for e in plain:
                if actual[e.key] != unmask_crc(e.crc32c):
                    raise self._crc_error(e, actual[e.key])
        return {n: out[n] for n in names}

    def _scatter_read(self, shard: int, offset: int, views: List[memoryview], key: str) -> None:
        """Fill ``views`` from consecutive bytes of the shard starting at ``offset``."""
        if self.remote and len(views) > 1:  # one ranged request for the run, split into the views
            total = sum(len(v) for v in views)
            buf = memoryview(bytearray(total))
            self._read_into(shard, offset, buf, key)
            pos = 0
            for v in views:
                v[:] = buf[pos:pos + len(v)]
                pos += len(v)
            return
        if hasattr(os, "preadv") and len(views) > 1 and not self.remote:
            total = sum(len(v) for v in views)
            try:
                got = os.preadv(self._fd(shard), views, offset)
            except OSError:
                got = -1
            if got == total:
                return
        for v in views:  # short read or no preadv: one at a time, with full error reporting
            self._read_into(shard, offset, v, key)
            offset += len(v)

    def close(self) -> None:
        """Close the shard files (reading again reopens them)."""
        self._fds.close()
