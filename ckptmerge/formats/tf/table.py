"""LevelDB-format tables as TensorFlow writes them, read without TensorFlow.

TF stores two things in this format (``tensorflow/core/lib/io``: ``format.cc``, ``block.cc``,
``table.cc``): the ``.index`` file of a V2 tensor bundle and the whole of a V1 checkpoint. A table
is a run of prefix-compressed blocks of sorted ``(key, value)`` pairs, each block followed by a
compression byte and a masked CRC32C, then an index block (one ``(separator key, block handle)``
per data block) and a 48-byte footer ending in a magic number.

:class:`Table` reads lazily through a ``read_at(offset, size)`` function: the footer and index
block first, then data blocks on demand, so a V1 checkpoint of gigabytes is never held in memory
at once. Every size is checked against the file length before anything is read or allocated,
and every problem raises :class:`TableError`, which readers turn into a
:class:`~ckptmerge.core.errors.CheckpointFormatError` naming their file.
"""

from __future__ import annotations

import bisect
import operator
import os
import struct
from typing import Any, Callable, Dict, List, NamedTuple, Optional, Tuple

import crc32c as _crc32c
import numpy as np

from ckptmerge.core import limits
from ckptmerge.core.errors import CheckpointFormatError
from ckptmerge.formats.io.storage import SNIFF_BLOCK, open_binary
from ckptmerge.formats.tf.protowire import (
    DecodeError,
    padded_bytes,
    read_varint,
    varints_at,
)

__all__ = [
    "Table",
    "Columns",
    "TableError",
    "TABLE_MAGIC",
    "FOOTER_SIZE",
    "read_table",
    "is_leveldb_table",
    "crc32c",
    "mask_crc",
    "unmask_crc",
]

#: The magic number ending every LevelDB-format table (TF's ``kTableMagicNumber``).
TABLE_MAGIC = 0xDB4775248B80FB57
_MAGIC_BYTES = struct.pack("<Q", TABLE_MAGIC)
#: Two block handles padded to 40 bytes, then 8 bytes of magic.
FOOTER_SIZE = 48
_TRAILER_SIZE = 5  # 1 byte compression type + 4 bytes masked crc32c
_MASK_DELTA = 0xA282EAD8
_U32 = struct.Struct("<I")
_CACHE_LIMIT = 4 << 20  # Table.get keeps the last block it read when it is at most this big

crc32c = _crc32c.crc32c


class TableError(Exception):
    """A problem in a table; the reader that hit it adds its file name."""


def mask_crc(crc: int) -> int:
    """Mask a CRC32C the way LevelDB and TF store them (rotate right 15, add a constant).

    Example:
        >>> unmask_crc(mask_crc(123456789))
        123456789
    """
    crc &= 0xFFFFFFFF
    return ((((crc >> 15) | (crc << 17)) & 0xFFFFFFFF) + _MASK_DELTA) & 0xFFFFFFFF


def unmask_crc(masked: int) -> int:
    """Invert :func:`mask_crc`.

    Example:
        >>> unmask_crc(mask_crc(0))
        0
    """
    rot = (masked - _MASK_DELTA) & 0xFFFFFFFF
    return ((rot >> 17) | (rot << 15)) & 0xFFFFFFFF


def is_leveldb_table(path: str) -> bool:
    """True if ``path`` is a file at least a footer long ending with the LevelDB table magic.

    Example:
        >>> is_leveldb_table("/nonexistent")
        False
    """
    try:
        with open_binary(path, SNIFF_BLOCK) as f:
            f.seek(0, os.SEEK_END)
            if f.tell() < FOOTER_SIZE:
                return False
            f.seek(-8, os.SEEK_END)
            return f.read(8) == _MAGIC_BYTES
    except OSError as e:
        limits.check(e, path)
        return False


def _block_spans(block: bytes, what: str) -> Tuple[List[bytes], List[int], List[int]]:
    """Every key of a block, and where its value starts and ends, entry by entry (any layout)."""
    n = len(block)
    if n < 4:
        raise TableError(f"{what} is only {n} bytes long")
    num_restarts = _U32.unpack_from(block, n - 4)[0]
    if num_restarts > (n - 4) // 4:
        raise TableError(f"{what} claims {num_restarts} restart points but is only {n} bytes")
    limit = n - 4 - 4 * num_restarts
    keys: List[bytes] = []
    starts: List[int] = []
    ends: List[int] = []
    prev = b""
    pos = 0
    try:
        while pos < limit:
            shared, pos = read_varint(block, pos, limit)
            non_shared, pos = read_varint(block, pos, limit)
            value_len, pos = read_varint(block, pos, limit)
            if shared > len(prev) or non_shared + value_len > limit - pos:
                raise TableError(f"{what} has an entry running past its end (at byte {pos})")
            key = prev[:shared] + block[pos:pos + non_shared]
            pos += non_shared
            keys.append(key)
            starts.append(pos)
            ends.append(pos + value_len)
            pos += value_len
            prev = key
    except DecodeError as e:
        raise TableError(f"{what} has a bad entry header: {e}") from None
    return keys, starts, ends


def _parse_block(block: bytes, what: str) -> List[Tuple[bytes, bytes]]:
    keys, starts, ends = _block_spans(block, what)
    return [(k, block[a:b]) for k, a, b in zip(keys, starts, ends)]


_MAX_RUN = 128  # the fast path walks at most this many entries from each restart point


def _block_spans_fast(block: bytes, text: bool = False) -> Optional[Tuple[List[Any], np.ndarray, np.ndarray]]:
    """:func:`_block_spans` for a well-formed block, walking from every restart point at once
    (numpy, one step per entry of the longest run), so its cost hardly grows with the entry count.
    With ``text``, the keys are Latin-1 text (see :meth:`Table.columns`).

    Returns ``None`` whenever anything is unusual (restart points that do not start entries,
    entries crossing them, long varints, long runs): :func:`_block_spans` then reads the block
    entry by entry and reports any problem precisely. The keys are built the same way.
    """
    n = len(block)
    if n < 8:
        return None
    num_restarts = _U32.unpack_from(block, n - 4)[0]
    if not 0 < num_restarts <= (n - 4) // 4:
        return None
    limit = n - 4 - 4 * num_restarts
    restarts = np.frombuffer(block, "<u4", num_restarts, limit).astype(np.int64)
    if restarts[0] != 0 or restarts[-1] >= limit or (num_restarts > 1 and (np.diff(restarts) <= 0).any()):
        return None
    ends = np.append(restarts[1:], limit)
    buf = padded_bytes(block, limit)
    pos = restarts.copy()
    key_len = np.zeros(num_restarts, np.int64)
    active = np.arange(num_restarts)
    steps = []
    for step in range(_MAX_RUN):
        if not active.size:
            break
        at = pos[active]
        shared_r = varints_at(buf, at)
        if shared_r is None:
            return None
        non_shared_r = varints_at(buf, shared_r[1])
        if non_shared_r is None:
            return None
        value_len_r = varints_at(buf, non_shared_r[1])
        if value_len_r is None:
            return None
        shared, non_shared, value_len, key_start = shared_r[0], non_shared_r[0], value_len_r[0], value_len_r[1]
        if (non_shared > limit).any() or (value_len > limit).any():  # also keeps the sums below in range
            return None
        value_start = key_start + non_shared
        value_end = value_start + value_len
        end = ends[active]
        if (value_end > end).any() or (shared > (0 if step == 0 else key_len[active])).any():
            return None
        key_len[active] = shared + non_shared
        steps.append((active, shared, key_start, value_start, value_end))
        pos[active] = value_end
        active = active[value_end < end]
    if active.size:
        return None
    group = np.concatenate([s[0] for s in steps])
    order = np.argsort(group, kind="stable")  # steps are in entry order within each run
    shared_l = np.concatenate([s[1] for s in steps])[order].tolist()
    key_start_l = np.concatenate([s[2] for s in steps])[order].tolist()
    value_start = np.concatenate([s[3] for s in steps])[order]
    value_end = np.concatenate([s[4] for s in steps])[order]
    keys: List[Any] = []
    append = keys.append
    source: Any = block.decode("latin-1") if text else block  # (one character per byte)
    prev = source[:0]
    for shared_n, a, b in zip(shared_l, key_start_l, value_start.tolist()):
        prev = prev[:shared_n] + source[a:b]
        append(prev)
    return keys, value_start, value_end


def _snappy_decompress(data: bytes, what: str) -> bytes:
    try:
        import cramjam
    except ImportError:  # pragma: no cover - cramjam is a dependency
        raise TableError(
            f"{what} is Snappy-compressed and the 'cramjam' package is not installed; "
            "install it with: pip install cramjam") from None
    try:
        expected, _ = read_varint(data, 0)
    except DecodeError:
        raise TableError(f"{what}: corrupt Snappy header") from None
    # Snappy cannot expand more than ~22x; a bigger claimed size is corruption, and refusing it
    # keeps a corrupt header from allocating gigabytes.
    if expected > 32 * len(data) + 64:
        raise TableError(f"{what}: corrupt Snappy header (claims {expected} bytes "
                         f"from {len(data)} compressed bytes)")
    try:
        out = bytes(cramjam.snappy.decompress_raw(data))
    except Exception as e:  # cramjam raises its own DecompressionError
        raise TableError(f"{what}: Snappy decompression failed ({e})") from None
    if len(out) != expected:
        raise TableError(f"{what}: Snappy data decompressed to {len(out)} bytes, expected {expected}")
    return out


def _bytes(key: Any) -> bytes:
    """A key as stored (keys read as Latin-1 text go back to their bytes), for messages."""
    return key.encode("latin-1") if isinstance(key, str) else key


def _ordered(keys: List[Any], what: str) -> None:
    if all(map(operator.lt, keys, keys[1:])):  # (at C speed; the loop finds the culprit)
        return
    for a, b in zip(keys, keys[1:]):
        if a >= b:
            raise TableError(f"{what}: keys out of order ({_bytes(b)!r} after {_bytes(a)!r})")


class Columns(NamedTuple):
    """A whole table in bulk (:meth:`Table.columns`): value ``i`` of ``keys[i]`` is
    ``data[starts[i]:ends[i]]``."""

    keys: List[Any]  # bytes, or Latin-1 text (Table.columns(text=True))
    data: bytes
    starts: np.ndarray
    ends: np.ndarray


class Table:
    """A LevelDB-format table read lazily through ``read_at(offset, size) -> bytes``.

    Args:
        size: the length of the table file in bytes.
        read_at: returns exactly ``size`` bytes at ``offset`` (only ever called for ranges
            inside the file), or raises.
        verify: check the CRC32C of every block read.

    Raises:
        TableError: the footer or index block is malformed.

    Example:
        >>> data = open("model.ckpt", "rb").read()  # doctest: +SKIP
        >>> Table(len(data), lambda o, n: data[o:o + n]).get(b"")  # doctest: +SKIP
    """

    def __init__(self, size: int, read_at: Callable[[int, int], bytes], *, verify: bool = True) -> None:
        self.size = size
        self._read_at = read_at
        self.verify = verify
        if size < FOOTER_SIZE:
            raise TableError(f"file is {size} bytes long, shorter than a table footer ({FOOTER_SIZE} bytes)")
        footer = read_at(size - FOOTER_SIZE, FOOTER_SIZE)
        if footer[-8:] != _MAGIC_BYTES:
            raise TableError(f"bad table magic number 0x{struct.unpack('<Q', footer[-8:])[0]:016x} "
                             f"(expected 0x{TABLE_MAGIC:016x}); not a checkpoint table, or truncated")
        try:
            _, pos = read_varint(footer, 0, 40)  # metaindex offset
            _, pos = read_varint(footer, pos, 40)  # metaindex size
            start = pos
            _, pos = read_varint(footer, pos, 40)
            _, pos = read_varint(footer, pos, 40)
        except DecodeError as e:
            raise TableError(f"bad table footer: {e}") from None
        #: ``(separator key, block handle)`` per data block, in order.
        self.index = _parse_block(self._block(footer[start:pos], "index block"), "index block")
        self._index_keys = [k for k, _ in self.index]
        _ordered(self._index_keys, "index block")
        self._cached: Tuple[int, Optional[Dict[bytes, bytes]]] = (-1, None)

    def _block(self, handle: bytes, what: str) -> bytes:
        try:
            offset, pos = read_varint(handle, 0)
            size, pos = read_varint(handle, pos)
        except DecodeError as e:
            raise TableError(f"bad block handle for {what}: {e}") from None
        if offset + size + _TRAILER_SIZE > self.size - FOOTER_SIZE:
            raise TableError(
                f"{what} (offset {offset}, {size} bytes) runs past the end of the table "
                f"({self.size} bytes); the file is truncated or corrupt")
        raw = self._read_at(offset, size + _TRAILER_SIZE)
        contents = raw[:size]
        ctype = raw[size]
        if self.verify:
            stored = unmask_crc(_U32.unpack_from(raw, size + 1)[0])
            actual = crc32c(raw[size:size + 1], crc32c(contents))
            if stored != actual:
                raise TableError(f"block checksum mismatch in {what} at offset {offset} "
                                 f"(expected 0x{stored:08x}, got 0x{actual:08x})")
        if ctype == 0:
            return contents
        if ctype == 1:
            return _snappy_decompress(contents, what)
        raise TableError(f"{what} has unknown compression type {ctype} (0 = none and 1 = Snappy "
                         "are the only ones TensorFlow writes)")

    def _block_size(self, i: int) -> int:
        try:
            _, pos = read_varint(self.index[i][1], 0)
            return read_varint(self.index[i][1], pos)[0]
        except DecodeError:
            return 0  # block() reports it

    def block(self, i: int, after: Optional[bytes] = None) -> List[Tuple[bytes, bytes]]:
        """The sorted ``(key, value)`` pairs of data block ``i`` (whose keys must all come
        ``after`` that key, when given: the last key of the block before).

        Example:
            >>> table.block(0)[0][0]  # doctest: +SKIP
            b''
        """
        what = f"data block {i}"
        entries = _parse_block(self._block(self.index[i][1], what), what)
        self._check_order(i, [k for k, _ in entries], after)
        return entries

    def columns(self, *, text: bool = False) -> "Columns":
        """The whole table as :class:`Columns`: sorted keys, the data blocks' contents back to back,
        and where each value lies in them. Checked as :meth:`items` checks (same errors), but a
        well-formed block is read in bulk (see :func:`_block_spans_fast`), with no object per value.
        With ``text``, the keys are ``str`` decoded as Latin-1 (one character per byte, so the
        same order and lengths): a caller that wants text keys skips a bytes object per key.

        Example:
            >>> table.columns().keys[:1]  # doctest: +SKIP
            [b'']
        """
        keys: List[Any] = []
        blocks: List[bytes] = []
        starts: List[np.ndarray] = []
        ends: List[np.ndarray] = []
        base = 0
        for i in range(len(self.index)):
            what = f"data block {i}"
            block = self._block(self.index[i][1], what)
            spans = _block_spans_fast(block, text)
            if spans is None:
                block_keys, s, e = _block_spans(block, what)
                if text:
                    block_keys = [k.decode("latin-1") for k in block_keys]
                spans = block_keys, np.array(s, np.int64), np.array(e, np.int64)
            block_keys = spans[0]
            self._check_order(i, block_keys, keys[-1] if keys else None)
            keys.extend(block_keys)
            blocks.append(block)
            starts.append(spans[1] + base)
            ends.append(spans[2] + base)
            base += len(block)
        if not keys:
            return Columns([], b"", np.zeros(0, np.int64), np.zeros(0, np.int64))
        return Columns(keys, b"".join(blocks), np.concatenate(starts), np.concatenate(ends))

    def _check_order(self, i: int, keys: List[Any], last: Any) -> None:
        """Data block ``i``'s keys (bytes, or Latin-1 text) are sorted, none past its index key,
        and after ``last``."""
        what = f"data block {i}"
        _ordered(keys, what)
        index_key = self._index_keys[i]
        if keys and keys[-1] > (index_key.decode("latin-1") if isinstance(keys[-1], str) else index_key):
            raise TableError(f"{what} holds key {_bytes(keys[-1])!r}, past its index key "
                             f"{self._index_keys[i]!r}")
        if keys and last is not None and keys[0] <= last:
            raise TableError(f"data block {i} is out of order (key {_bytes(keys[0])!r} after {_bytes(last)!r})")

    def get(self, key: bytes) -> Optional[bytes]:
        """The value of ``key``, or ``None``; reads only the block that holds it (and keeps it
        for the next call when it is small: neighbouring keys usually share a block).

        Example:
            >>> table.get(b"")  # doctest: +SKIP
        """
        i = bisect.bisect_left(self._index_keys, key)
        if i >= len(self.index):
            return None
        cached_i, cached = self._cached
        if cached_i != i or cached is None:
            cached = dict(self.block(i))
            self._cached = (i, cached) if self._block_size(i) <= _CACHE_LIMIT else (-1, None)
        return cached.get(key)

    def items(self) -> List[Tuple[bytes, bytes]]:
        """Every ``(key, value)`` pair of the table, in key order.

        Example:
            >>> [k for k, _ in table.items()][:1]  # doctest: +SKIP
            [b'']
        """
        out: List[Tuple[bytes, bytes]] = []
        for i in range(len(self.index)):
            out.extend(self.block(i, out[-1][0] if out else None))
        return out


def read_table(data: bytes, *, verify: bool = True) -> List[Tuple[bytes, bytes]]:
    """Parse a whole LevelDB-format table held in memory; returns sorted ``(key, value)`` pairs.

    Raises:
        CheckpointFormatError: on any malformation (without a path: callers add it).

    Example:
        >>> read_table(b"short")
        Traceback (most recent call last):
        ...
        ckptmerge.core.errors.CheckpointFormatError: file is 5 bytes long, shorter than a table footer (48 bytes)
    """
    try:
        return Table(len(data), lambda offset, size: data[offset:offset + size], verify=verify).items()
    except TableError as e:
        raise CheckpointFormatError(str(e)) from None
