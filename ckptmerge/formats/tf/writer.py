"""Write TensorFlow V2 checkpoints (tensor bundles) without TensorFlow.

A tensor bundle is ``prefix.data-NNNNN-of-NNNNN`` shards holding the raw tensor bytes and a
``prefix.index`` file: a LevelDB-style sorted table mapping each tensor key to a
``BundleEntryProto`` (dtype, shape, shard, offset, size, masked CRC32C), plus a header entry
under the empty key. :class:`BundleWriter` writes the same bytes TensorFlow's own ``BundleWriter``
(``tf.raw_ops.SaveV2``) writes for the same tensors added in the same order, so
``tf.train.load_checkpoint``, ``tf.compat.v1.train.Saver`` and ckptmerge's reader all read it.

The write is atomic: tensors stream into hidden temporary files in the output directory, and
only :meth:`BundleWriter.finish` moves them into place. A reader therefore sees either no
checkpoint or a complete one, even if the process is killed mid-write; on any error the temporary
files are removed. With ``durable=True`` every file (and the directory) is also fsynced before its
rename, so the checkpoint survives a power loss too; that waits for the disk, which TensorFlow's
own writer (and ``cp``) do not, so it is off by default.

Replacing a checkpoint (``overwrite=True``) is atomic too: at every instant the prefix reads as
exactly the old checkpoint or exactly the new one, for any reader (TensorFlow included), even if
the writer is killed between two steps. The index names no data file (the prefix and the shard
count in its header do), so the new data shards must never take the old ones' names while the
old index is in place. The publish (:meth:`BundleWriter.finish`) therefore runs these steps, each
of which leaves a valid checkpoint at the prefix:

1. choose a shard count no data file at the prefix uses (the natural count, else one more, with
   empty trailing shards), and rename the new shards in under those unused names: the old index
   still reads the old shards;
2. ``os.replace`` the new index over the old one: the one atomic switch from old to new;
3. remove the data files the new index does not name (the old shards, leftovers of killed runs);
4. if shards were padded, hard-link the shards to their natural names, switch to an index with
   the natural count, and remove the padded names: the result is the same files a fresh write
   gives (where hard links are unsupported, the padded layout, as valid, is kept).

A kill at any step leaves only unreferenced data files, which the next ``overwrite`` removes;
without ``overwrite`` the next writer refuses, naming them. Publishes to one prefix are
serialised by an exclusive ``flock`` on ``.<name>.ckptmerge-lock`` beside it (removed when
released), held from the final existence check through the last step: two writers never
interleave, and without ``overwrite`` exactly one of two racing writers publishes (the other
raises :class:`~ckptmerge.core.errors.OutputExistsError`). A writer waits for the lock; it is held
only for the renames, not while tensors are written.

The ``.index`` table itself is written by :mod:`ckptmerge.formats.tf.table_writer`; the files at an
output prefix and its publish lock are :mod:`ckptmerge.formats.io.output_prefix`; moving and
checksumming tensor bytes is :mod:`ckptmerge.formats.io.bytecopy`.
"""

from __future__ import annotations

import math
import os
from typing import (
    Any,
    BinaryIO,
    Dict,
    Iterable,
    List,
    Optional,
    Sequence,
    Tuple,
    Union,
)

import crc32c as _crc32c
import numpy as np

from ckptmerge.core.errors import (
    ArgumentError,
    ArgumentTypeError,
    CheckpointFormatError,
    CheckpointWriteError,
    OutputExistsError,
)
from ckptmerge.formats.dtypes import DT_STRING, TF_TO_NUMPY, numpy_to_tf, tf_dtype_name
from ckptmerge.formats.io.bytecopy import (
    Checksum,
    array_chunks,
    kernel_copy,
    pread_pieces,
)
from ckptmerge.formats.io.interrupts import HeldInterrupts
from ckptmerge.formats.io.output_prefix import (
    OutputLock,
    check_no_output,
    existing_checkpoint_files,
    io_message,
    refuse_existing,
    remove_quietly,
    remove_stale_temps,
    shard_count,
    temp_name,
)
from ckptmerge.formats.tf.bundle import DATA_RE, data_file_name, mask_crc
from ckptmerge.formats.tf.crc import string_lengths_crc
from ckptmerge.formats.tf.entries import entry_proto, header_proto, pad_shards
from ckptmerge.formats.tf.protowire import encode_varint
from ckptmerge.formats.tf.table_writer import TF_BLOCK_SIZE, U32, TableWriter
from ckptmerge.core.redact import get_logger
from ckptmerge.core.text import quote_name

__all__ = [
    "BundleWriter",
    "OutputExistsError",
    "CheckpointWriteError",
    "TF_BLOCK_SIZE",
    "pad_shards",  # its home is ckptmerge.formats.tf.entries
]

logger = get_logger(__name__)

ShapeArg = Sequence[int]
BytesLike = Union[bytes, bytearray, memoryview]


# --------------------------------------------------------------------------------------------
# the writer


def _string_elements(key: str, value: np.ndarray) -> List[bytes]:
    flat = value.reshape(-1)
    out: List[bytes] = []
    for i, x in enumerate(flat.tolist() if value.dtype.kind in "SU" else flat):
        if isinstance(x, (bytes, bytearray, memoryview, np.bytes_)):
            out.append(bytes(x))
        elif isinstance(x, (str, np.str_)):
            out.append(str(x).encode("utf-8"))
        else:
            raise ArgumentTypeError(
                f"Cannot write key {quote_name(key)}: string tensors must hold bytes or str, but element "
                f"{i} is {type(x).__name__}. Received: {x!r}"
            )
    return out




class BundleWriter:
    """Write a TensorFlow V2 checkpoint (tensor bundle) atomically, without TensorFlow.

    Tensors are streamed to hidden temporary files in the output directory as they are
    added, so memory stays bounded by one tensor (or one chunk, with :meth:`add_raw`).
    :meth:`finish` writes the index and publishes the checkpoint (see the module docstring);
    until then no file appears at ``prefix``. Used as a context manager, it finishes on normal
    exit and aborts (removing the temporary files) on an exception.

    Args:
        prefix: the checkpoint prefix to write, e.g. ``"out/merged"`` writes
            ``out/merged.index`` and ``out/merged.data-00000-of-00001``. Missing parent
            directories are created.
        overwrite: replace an existing checkpoint at ``prefix``; at every instant the prefix
            reads as exactly the old or exactly the new checkpoint (see the module docstring).
        max_shard_bytes: start a new data shard when the current one would exceed this many
            bytes (a tensor never spans shards); ``None`` writes one shard.
        block_size: index block size; the default is TensorFlow's, which makes the index
            byte-identical to TensorFlow's.
        durable: fsync data, index and directory before each rename (power-loss safe).

    Raises:
        OutputExistsError: ``prefix.index`` or a ``prefix.data-*`` file exists and
            ``overwrite`` is false.
        CheckpointWriteError: the output directory cannot be written.

    Example:
        >>> with BundleWriter("out/merged") as w:  # doctest: +SKIP
        ...     w.add("dense/kernel", np.ones((3, 4), np.float32))
        ...     w.add("global_step", np.array(10, np.int64))
    """

    def __init__(self, prefix: Union[str, "os.PathLike[str]"], *, overwrite: bool = False,
                 max_shard_bytes: Optional[int] = None, block_size: int = TF_BLOCK_SIZE,
                 durable: bool = False) -> None:
        if isinstance(prefix, bool) or not isinstance(prefix, (str, os.PathLike)):
            raise ArgumentTypeError(f"prefix must be a str or os.PathLike. Received: prefix={prefix!r}")
        given = os.fspath(prefix)
        if not isinstance(given, str) or not given or given.endswith(("/", os.sep)):
            raise ArgumentError(
                f"prefix must name a checkpoint file prefix such as 'out/merged', not a "
                f"directory. Received: prefix={prefix!r}"
            )
        if given.endswith(".index") or DATA_RE.search(given):
            raise ArgumentError(
                f"prefix must be the checkpoint prefix without '.index' or '.data-*'. "
                f"Received: prefix={given!r}"
            )
        if max_shard_bytes is not None and (isinstance(max_shard_bytes, bool)
                                            or not isinstance(max_shard_bytes, int)
                                            or max_shard_bytes <= 0):
            raise ArgumentError(f"max_shard_bytes must be a positive int or None. "
                                f"Received: max_shard_bytes={max_shard_bytes!r}")
        if isinstance(block_size, bool) or not isinstance(block_size, int) or block_size < 64:
            raise ArgumentError(f"block_size must be an int >= 64. Received: block_size={block_size!r}")
        self.prefix = given
        self._abs = os.path.abspath(given)
        self._dir = os.path.dirname(self._abs)
        self._base = os.path.basename(self._abs)
        self._overwrite = bool(overwrite)
        self._max_shard = max_shard_bytes
        self._block_size = block_size
        self._durable = bool(durable)
        self._no_kernel_copy = False  # set once copy_file_range turns out unsupported here
        self._tmp_stem = temp_name(self._abs)
        self._shards: List[str] = []          # temp paths of the data shards
        self._shard_sizes: List[int] = []
        self._file: Optional[BinaryIO] = None  # the open current shard
        self._entries: Dict[bytes, bytes] = {}
        self._state = "open"                   # open -> finished | aborted
        #: Bytes of the published ``.index`` and ``.data-*`` files (set by :meth:`finish`).
        self.bytes_written = 0

        if not self._overwrite:
            check_no_output(self._abs, given)
        try:
            os.makedirs(self._dir, exist_ok=True)
        except OSError as e:
            raise CheckpointWriteError(io_message(e, self._dir, "create the output directory", given),
                                       path=self._dir, errno_=e.errno) from e
        self._remove_stale_temps()
        self._new_shard()

    # -- context manager ---------------------------------------------------------------------

    def __enter__(self) -> "BundleWriter":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is not None:
            self.abort()
        elif self._state == "open":
            self.finish()

    def __del__(self) -> None:  # never leave temp files behind for a forgotten writer
        try:
            if getattr(self, "_state", None) == "open":
                self.abort()
        except BaseException:  # noqa: BLE001 - interpreter shutdown, or a Ctrl-C that landed here
            pass               # (Python would only print it as "Exception ignored")

    # -- helpers -----------------------------------------------------------------------------

    def _existing_outputs(self) -> List[str]:
        return existing_checkpoint_files(self._abs)

    def _remove_stale_temps(self) -> None:
        """Remove temp files of this prefix left by writers whose process no longer exists."""
        remove_stale_temps(self._abs)

    def _fail(self, e: OSError, path: str, action: str) -> CheckpointWriteError:
        self.abort()
        return CheckpointWriteError(io_message(e, path, action, self.prefix), path=path,
                                    errno_=e.errno)

    def _check_open(self) -> None:
        if self._state != "open":
            raise ArgumentError(
                f"This BundleWriter for {quote_name(self.prefix)} is already {self._state}; create a new "
                "BundleWriter to write another checkpoint."
            )

    def _new_shard(self) -> None:
        if self._file is not None:
            self._close_current()
        path = f"{self._tmp_stem}.data-{len(self._shards)}"
        self._shards.append(path)  # before it exists: an abort (Ctrl-C just after the open) removes it
        self._shard_sizes.append(0)
        try:
            self._file = open(path, "xb+")  # read back by add_range to check what it copied
        except OSError as e:
            raise self._fail(e, path, "create the temporary data file") from e

    def _close_current(self) -> None:
        f, self._file = self._file, None
        if f is None:
            return
        try:
            f.flush()
            if self._durable:
                os.fsync(f.fileno())
        finally:
            f.close()

    def _check_key(self, key: object) -> bytes:
        if not isinstance(key, str):
            raise ArgumentTypeError(f"Tensor keys must be str. Received: key={key!r}")
        if key == "":
            raise ArgumentError("The empty key is reserved for the bundle header; give the tensor a name.")
        try:
            kb = key.encode("utf-8")
        except UnicodeEncodeError:
            raise ArgumentError(f"Tensor key {key!r} is not valid UTF-8 text.") from None
        if kb in self._entries:
            raise ArgumentError(
                f"Key {quote_name(key)} was already added to the checkpoint {quote_name(self.prefix)}; every key must "
                "be unique."
            )
        return kb

    def _reserve(self, nbytes: int) -> None:
        """Start a new shard if this tensor would overflow the current one."""
        if self._max_shard is not None and self._shard_sizes[-1] > 0 \
                and self._shard_sizes[-1] + nbytes > self._max_shard:
            self._new_shard()

    def _write_chunks(self, chunks: Iterable[BytesLike]) -> Tuple[int, int]:
        """Append chunks to the current shard; return (bytes written, crc32c)."""
        f = self._file
        assert f is not None
        crc = 0
        n = 0
        path = self._shards[-1]
        start = self._shard_sizes[-1]
        try:
            for chunk in chunks:
                mv = memoryview(chunk).cast("B")
                f.write(mv)
                crc = _crc32c.crc32c(mv, crc)
                n += len(mv)
        except OSError as e:
            raise self._fail(e, path, "write the temporary data file") from e
        except BaseException:
            # The chunk source failed (e.g. a reader error): drop the partial tensor so the
            # writer stays consistent and the caller may go on or abort.
            self._truncate_back(start)
            raise
        return n, crc

    def _record(self, kb: bytes, dtype: int, shape: Sequence[int], n: int, crc: int) -> None:
        offset = self._shard_sizes[-1]
        self._shard_sizes[-1] += n
        self._entries[kb] = entry_proto(dtype, shape, len(self._shards) - 1, offset, n,
                                         mask_crc(crc))

    # -- public API --------------------------------------------------------------------------

    def add(self, key: str, value: np.ndarray) -> None:
        """Add one tensor; its bytes are written to the temporary data file right away.

        Args:
            key: the checkpoint key, e.g. ``"dense/kernel"`` or
                ``"model/dense/kernel/.ATTRIBUTES/VARIABLE_VALUE"``.
            value: a numpy array or scalar of any dtype a checkpoint holds (float16/32/64,
                bfloat16 and other ``ml_dtypes``, int8..64, uint8..64, bool, complex64/128), or
                strings: an ``object`` array of ``bytes``/``str``, or a ``S``/``U`` array
                (``str`` is encoded as UTF-8; ``S`` items lose trailing NULs, as in numpy).

        Raises:
            ArgumentError: duplicate or empty key, unsupported dtype (``ArgumentTypeError``
                for wrong types).
            CheckpointWriteError: the data could not be written (the writer is aborted).

        Example:
            >>> w.add("dense/bias", np.zeros(4, np.float32))  # doctest: +SKIP
        """
        self._check_open()
        kb = self._check_key(key)
        if isinstance(value, np.generic):
            value = np.asarray(value)
        if not isinstance(value, np.ndarray):
            raise ArgumentTypeError(
                f"Cannot write key {quote_name(key)}: value must be a numpy array or scalar, got "
                f"{type(value).__name__}. Convert it with numpy.asarray(value, dtype=...) so the "
                "dtype is explicit."
            )
        shape = tuple(int(d) for d in value.shape)
        if value.dtype.kind in "OSU":
            self._add_strings(kb, key, value, shape)
            return
        dt = value.dtype
        if dt.names is None and dt.byteorder == ">":
            dt = dt.newbyteorder("<")
        try:
            dtype = numpy_to_tf(dt)
        except CheckpointFormatError as e:
            raise ArgumentError(f"Cannot write key {quote_name(key)}: {e}") from None
        self._reserve(value.nbytes)
        n, crc = self._write_chunks(array_chunks(value, dt))
        self._record(kb, dtype, shape, n, crc)

    def _add_strings(self, kb: bytes, key: str, value: np.ndarray, shape: Tuple[int, ...]) -> None:
        # TF's layout: varint64 length of every element, the masked CRC32C of the lengths,
        # then the bytes. The entry's CRC32C covers each length as a little-endian uint32
        # (uint64 if longer than 4 GiB), the masked length CRC, then the bytes - not the varints.
        elems = _string_elements(key, value)
        lengths = bytearray()
        for e in elems:
            lengths += encode_varint(len(e))
        crc = string_lengths_crc(len(e) for e in elems)
        length_crc = U32.pack(mask_crc(crc))
        total = len(lengths) + 4 + sum(len(e) for e in elems)
        self._reserve(total)
        path = self._shards[-1]
        f = self._file
        assert f is not None
        try:
            f.write(lengths)
            f.write(length_crc)
            crc = _crc32c.crc32c(length_crc, crc)
            for e in elems:
                f.write(e)
                crc = _crc32c.crc32c(e, crc)
        except OSError as e:
            raise self._fail(e, path, "write the temporary data file") from e
        self._record(kb, DT_STRING, shape, total, crc)

    def add_raw(self, key: str, dtype_enum: int, shape: ShapeArg, chunks: Iterable[BytesLike], *,
                expected_crc32c: Optional[int] = None) -> None:
        """Add a numeric tensor from its raw little-endian bytes, streamed chunk by chunk.

        Use it to copy a large tensor from another checkpoint without holding it in memory.

        Args:
            key: the checkpoint key.
            dtype_enum: TensorFlow ``DataType`` enum value (e.g. 1 for float32); not string.
            shape: the tensor shape; the chunks must add up to exactly its byte size.
            chunks: the tensor bytes in order (any bytes-like objects).
            expected_crc32c: the masked CRC32C recorded for these bytes in the source
                checkpoint; if given and different, the copy is refused as corrupt.

        Raises:
            ArgumentError: duplicate key, string or unknown dtype, bad shape, wrong byte count.
            CheckpointFormatError: the bytes do not match ``expected_crc32c``.
            CheckpointWriteError: the data could not be written.

        Example:
            >>> w.add_raw("emb", 1, (1000, 64), reader.iter_raw("emb"))  # doctest: +SKIP
        """
        kb, dtype_enum, dims, expected = self._check_raw(key, dtype_enum, shape)
        self._reserve(expected)
        start = self._shard_sizes[-1]
        n, crc = self._write_chunks(chunks)
        if n != expected:
            self._truncate_back(start)
            raise ArgumentError(
                f"Cannot add_raw key {quote_name(key)}: shape {dims} of {tf_dtype_name(dtype_enum)} needs "
                f"{expected} bytes, but the chunks held {n}.")
        self._check_crc(key, start, crc, expected_crc32c)
        self._record(kb, dtype_enum, dims, n, crc)

    def _check_crc(self, key: str, start: int, crc: int, expected: Optional[int]) -> None:
        """Refuse (and drop) a copied tensor whose bytes do not match the source's checksum."""
        if expected is not None and mask_crc(crc) != expected:
            self._truncate_back(start)
            raise CheckpointFormatError(
                f"Tensor {quote_name(key)} failed its checksum: its bytes have masked CRC32C "
                f"{mask_crc(crc):#010x}, the source recorded {expected:#010x}. The source "
                "checkpoint is corrupt (or was read wrongly); it was not copied.", key=key)

    def _check_raw(self, key: str, dtype_enum: Any, shape: ShapeArg) -> Tuple[bytes, int, Tuple[int, ...], int]:
        """Validate a raw tensor's key, dtype and shape; return ``(key bytes, dtype, dims, nbytes)``."""
        self._check_open()
        kb = self._check_key(key)
        if isinstance(dtype_enum, bool) or not isinstance(dtype_enum, (int, np.integer)):
            raise ArgumentTypeError(f"dtype_enum must be an int (TF DataType). Received: {dtype_enum!r}")
        dtype_enum = int(dtype_enum)
        if dtype_enum == DT_STRING:
            raise ArgumentError(f"Cannot add_raw key {quote_name(key)}: string tensors must be added with add().")
        if dtype_enum not in TF_TO_NUMPY:
            raise ArgumentError(
                f"Cannot add_raw key {quote_name(key)}: dtype {tf_dtype_name(dtype_enum)!r} "
                f"(DataType {dtype_enum}) is not a plain numeric type.")
        try:
            dims = tuple(int(d) for d in shape)
        except (TypeError, ValueError):
            raise ArgumentTypeError(f"shape must be a sequence of ints. Received: shape={shape!r}") from None
        if any(d < 0 for d in dims):
            raise ArgumentError(f"shape must have sizes >= 0. Received: shape={shape!r}")
        return kb, dtype_enum, dims, TF_TO_NUMPY[dtype_enum].itemsize * math.prod(dims)  # exact for any size

    def add_range(self, key: str, dtype_enum: int, shape: ShapeArg, src_fd: int, src_offset: int, *,
                  expected_crc32c: Optional[int] = None, verify: bool = True) -> None:
        """Add a numeric tensor by copying its raw bytes from a range of another file.

        The bytes are copied inside the kernel (``os.copy_file_range``, what ``cp`` uses) while
        another thread reads the source range in cache-sized pieces to compute its CRC32C; where
        the kernel cannot copy between these files, the bytes are streamed as :meth:`add_raw` does.

        Args:
            key, dtype_enum, shape: as for :meth:`add_raw`.
            src_fd: an open file descriptor of the source data file (not closed here).
            src_offset: where the tensor's bytes start in it.
            expected_crc32c: the masked CRC32C the source recorded.
            verify: refuse bytes that do not match ``expected_crc32c``. With ``False`` they are
                copied as they are, with a warning, and the output records their actual checksum
                (so the new checkpoint is readable; the CRC is computed either way).

        Raises:
            ArgumentError: as :meth:`add_raw`; or the source range is shorter than the tensor.
            CheckpointFormatError: the bytes do not match ``expected_crc32c``.
            CheckpointWriteError: the data could not be written.

        Example:
            >>> w.add_range("emb", 1, (1000, 64), fd, 4096, expected_crc32c=entry_crc)  # doctest: +SKIP
        """
        kb, dtype_enum, dims, expected = self._check_raw(key, dtype_enum, shape)
        self._reserve(expected)
        f = self._file
        assert f is not None
        start = self._shard_sizes[-1]
        path = self._shards[-1]
        if self._no_kernel_copy:  # found out on an earlier tensor: stream without a second read
            self.add_raw(key, dtype_enum, dims, pread_pieces(src_fd, src_offset, expected),
                         expected_crc32c=expected_crc32c if verify else None)
            return
        # The checksum of the source range is computed on another thread while the kernel
        # copies it (both release the GIL), so verifying costs next to nothing on 2+ cores.
        checksum = Checksum(src_fd, src_offset, expected)
        try:
            f.flush()
            copied = kernel_copy(src_fd, src_offset, f.fileno(), start, expected)
        except OSError as e:
            checksum.result()
            self._truncate_back(start)
            raise self._fail(e, path, "write the temporary data file") from e
        crc = checksum.result()
        if copied is None:  # no in-kernel copy here: stream it, and the next ones too
            self._no_kernel_copy = True
            self.add_raw(key, dtype_enum, dims, pread_pieces(src_fd, src_offset, expected),
                         expected_crc32c=expected_crc32c if verify else None)
            return
        if copied != expected:
            self._truncate_back(start)
            raise ArgumentError(f"Cannot add_range key {quote_name(key)}: the source holds {copied} of its {expected} bytes.")
        f.seek(start + expected)
        if verify:
            self._check_crc(key, start, crc, expected_crc32c)
        elif expected_crc32c is not None and mask_crc(crc) != expected_crc32c:
            logger.warning("tensor '%s' does not match its source checksum; copied as it is "
                           "(verify=False), with the checksum of the copied bytes", key)
        self._record(kb, dtype_enum, dims, expected, crc)

    def _truncate_back(self, size: int) -> None:
        """Drop bytes written for a rejected tensor so the shard stays consistent."""
        f = self._file
        assert f is not None
        try:
            f.flush()
            f.truncate(size)
            f.seek(size)
        except OSError as e:
            raise self._fail(e, self._shards[-1], "truncate the temporary data file") from e

    def finish(self) -> None:
        """Write the index and publish the checkpoint at the prefix (see the module docstring).

        Waits while another writer publishes to the same prefix. With ``overwrite`` the prefix
        reads as exactly the old or exactly the new checkpoint at every instant, whatever the
        data file names.

        Raises:
            OutputExistsError: a checkpoint appeared at ``prefix`` meanwhile (without overwrite).
            CheckpointWriteError: writing, syncing or renaming failed (temp files are removed).

        Example:
            >>> w.finish()  # doctest: +SKIP
        """
        self._check_open()
        try:
            self._close_current()
        except OSError as e:
            raise self._fail(e, self._shards[-1], "write the temporary data file") from e
        natural = len(self._shards)
        try:
            with OutputLock(self._dir, self._base, self.prefix), HeldInterrupts():
                # (the publish runs whole: a Ctrl-C meanwhile is delivered once it is done)
                if not self._overwrite:
                    refuse_existing(self._abs, self.prefix, "pass overwrite=True")
                num = self._publish(natural)
        except BaseException:
            self.abort()
            raise
        self._state = "finished"
        logger.info("wrote checkpoint %s (%d tensors, %d shard(s), %d bytes)", self.prefix,
                    len(self._entries), num, self.bytes_written)

    def _write_index(self, num: int) -> Tuple[str, int]:
        """Write the index (header saying ``num`` shards) to a temp file; return its path and size."""
        tmp_index = f"{self._tmp_stem}.index-{num}"
        self._shards.append(tmp_index)  # so abort() removes it
        try:
            with open(tmp_index, "xb") as f:
                table = TableWriter(f, self._block_size)
                table.add(b"", header_proto(num))
                for kb in sorted(self._entries):
                    table.add(kb, self._entries[kb])
                table.finish()
                f.flush()
                if self._durable:
                    os.fsync(f.fileno())
        except OSError as e:
            raise self._fail(e, tmp_index, "write the temporary index file") from e
        return tmp_index, table.offset

    def _publish(self, natural: int) -> int:
        """Move the ``natural`` temp shards and the index into place (the lock is held).

        Returns the shard count published (``natural`` unless hard links are unsupported).
        """
        index = self._abs + ".index"
        used = {shard_count(p) for p in self._existing_outputs() if p != index}
        num = natural
        while num in used:  # the new shards' names must not be any existing file's
            num += 1
        for i in range(natural, num):  # empty trailing shards; no tensor is in them
            path = f"{self._tmp_stem}.data-{i}"
            self._shards.insert(i, path)
            try:
                open(path, "xb").close()
            except OSError as e:
                raise self._fail(e, path, "create the temporary data file") from e
        tmp_index, size = self._write_index(num)
        natural_index, natural_size = self._write_index(natural) if num != natural else ("", size)
        final = [data_file_name(self._abs, i, num) for i in range(num)]
        moved: List[str] = []
        target = ""
        try:
            for tmp, dst in zip(self._shards[:num], final):
                target = dst
                os.replace(tmp, dst)  # a name no index refers to
                moved.append(dst)
            self._fsync_dir()
            target = index
            os.replace(tmp_index, index)  # the switch from the old checkpoint to the new one
        except OSError as e:
            for p in moved:  # unreferenced: the old checkpoint (if any) is intact
                remove_quietly(p)
            raise self._fail(e, target, "move the checkpoint into place at") from e
        self._shards = self._shards[num + 1:]  # the natural index, if written
        self._fsync_dir()
        self._remove_unreferenced(num)
        if num != natural and self._unpad(num, natural, natural_index):
            num, size = natural, natural_size
        self.bytes_written = sum(self._shard_sizes) + size
        return num

    def _remove_unreferenced(self, num: int) -> None:
        """Remove the prefix's data files that the published index (``num`` shards) does not name."""
        for p in self._existing_outputs():
            if not p.endswith(".index") and shard_count(p) != num:
                remove_quietly(p)

    def _unpad(self, padded: int, natural: int, natural_index: str) -> bool:
        """Give a padded checkpoint its natural shard names, staying valid at every step.

        The data shards get their natural names as hard links (names no index uses now), the
        index with the natural count replaces the padded one, then the padded names go.
        Returns whether it did (where hard links are unsupported, the padded layout stays).
        """
        linked: List[str] = []
        try:
            for i in range(natural):
                dst = data_file_name(self._abs, i, natural)
                os.link(data_file_name(self._abs, i, padded), dst)
                linked.append(dst)
            self._fsync_dir()
            os.replace(natural_index, self._abs + ".index")
        except OSError as e:
            logger.info("kept checkpoint %s with %d data shards (%d of them empty): %s", self.prefix,
                        padded, padded - natural, e)
            for p in linked + [natural_index]:
                remove_quietly(p)
            self._shards = []
            return False
        self._shards = []
        self._fsync_dir()
        self._remove_unreferenced(natural)
        return True

    def _fsync_dir(self) -> None:
        if not self._durable:
            return
        try:
            fd = os.open(self._dir, os.O_RDONLY)
        except OSError:
            return
        try:
            os.fsync(fd)
        except OSError:
            pass  # some filesystems do not support fsync on directories
        finally:
            os.close(fd)

    def abort(self) -> None:
        """Discard everything written so far: close and remove the temporary files.

        Safe to call more than once; does nothing after :meth:`finish`.

        Example:
            >>> w.abort()  # doctest: +SKIP
        """
        if self._state != "open":
            return
        self._state = "aborted"
        f, self._file = self._file, None
        if f is not None:
            try:
                f.close()
            except OSError:
                pass
        for p in self._shards:
            remove_quietly(p)
        self._shards = []

    @property
    def keys(self) -> List[str]:
        """The keys added so far, in sorted (index) order."""
        return [k.decode("utf-8") for k in sorted(self._entries)]
