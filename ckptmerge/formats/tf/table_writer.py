"""Write a LevelDB-style sorted table exactly as TensorFlow's ``table::TableBuilder`` does.

A checkpoint's ``.index`` is such a table (no compression): prefix-compressed blocks with
restart points, an index block of shortest separators, and a fixed-size footer. Written byte
for byte as TensorFlow writes it, so :class:`ckptmerge.formats.tf.writer.BundleWriter`'s index files
equal TensorFlow's. The reading side is :mod:`ckptmerge.formats.tf.table`.
"""

from __future__ import annotations

import struct
from typing import BinaryIO, Optional

import crc32c as _crc32c

from ckptmerge.formats.tf.bundle import mask_crc
from ckptmerge.formats.tf.protowire import encode_varint

__all__ = ["TF_BLOCK_SIZE"]

#: TensorFlow's index block size (``table::Options::block_size``); using it makes the
#: ``.index`` byte-identical to TensorFlow's.
TF_BLOCK_SIZE = 262144
_BLOCK_RESTART_INTERVAL = 16
_TABLE_MAGIC = 0xDB4775248B80FB57
_FOOTER_HANDLES_LEN = 40  # 2 * BlockHandle::kMaxEncodedLength
_NO_COMPRESSION = 0
U32 = struct.Struct("<I")
_U64 = struct.Struct("<Q")


def _common_prefix_len(a: bytes, b: bytes) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


class _BlockBuilder:
    """A LevelDB block: prefix-compressed entries with restart points, then the restart array."""

    def __init__(self, restart_interval: int) -> None:
        self.restart_interval = restart_interval
        self.buf = bytearray()
        self.restarts = [0]
        self.counter = 0
        self.last_key = b""
        self.empty = True

    def add(self, key: bytes, value: bytes) -> None:
        shared = 0
        if self.counter < self.restart_interval:
            shared = _common_prefix_len(self.last_key, key)
        else:
            self.restarts.append(len(self.buf))
            self.counter = 0
        self.buf += encode_varint(shared)
        self.buf += encode_varint(len(key) - shared)
        self.buf += encode_varint(len(value))
        self.buf += key[shared:]
        self.buf += value
        self.last_key = key
        self.counter += 1
        self.empty = False

    def size_estimate(self) -> int:
        return len(self.buf) + 4 * len(self.restarts) + 4

    def finish(self) -> bytes:
        out = bytes(self.buf) + b"".join(U32.pack(r) for r in self.restarts) + U32.pack(len(self.restarts))
        self.buf = bytearray()
        self.restarts = [0]
        self.counter = 0
        self.last_key = b""
        self.empty = True
        return out


def _shortest_separator(start: bytes, limit: bytes) -> bytes:
    """LevelDB's bytewise FindShortestSeparator: a short key k with start <= k < limit."""
    i = _common_prefix_len(start, limit)
    if i >= min(len(start), len(limit)):
        return start
    b = start[i]
    if b < 0xFF and b + 1 < limit[i]:
        return start[:i] + bytes([b + 1])
    return start


def _short_successor(key: bytes) -> bytes:
    """LevelDB's bytewise FindShortSuccessor: a short key k >= key."""
    for i, b in enumerate(key):
        if b != 0xFF:
            return key[:i] + bytes([b + 1])
    return key


class TableWriter:
    """Writes a sorted table exactly as TensorFlow's ``table::TableBuilder`` (no compression)."""

    def __init__(self, f: BinaryIO, block_size: int) -> None:
        self.f = f
        self.block_size = block_size
        self.offset = 0
        self.data = _BlockBuilder(_BLOCK_RESTART_INTERVAL)
        self.index = _BlockBuilder(1)
        self.last_key = b""
        self.pending_handle: Optional[bytes] = None

    def _write_block(self, block: _BlockBuilder) -> bytes:
        contents = block.finish()
        trailer_type = bytes([_NO_COMPRESSION])
        crc = _crc32c.crc32c(trailer_type, _crc32c.crc32c(contents))
        self.f.write(contents)
        self.f.write(trailer_type + U32.pack(mask_crc(crc)))
        handle = encode_varint(self.offset) + encode_varint(len(contents))
        self.offset += len(contents) + 5
        return handle

    def add(self, key: bytes, value: bytes) -> None:
        if self.pending_handle is not None:
            self.index.add(_shortest_separator(self.last_key, key), self.pending_handle)
            self.pending_handle = None
        self.last_key = key
        self.data.add(key, value)
        if self.data.size_estimate() >= self.block_size:
            self._flush()

    def _flush(self) -> None:
        if self.data.empty:
            return
        self.pending_handle = self._write_block(self.data)

    def finish(self) -> None:
        self._flush()
        meta_handle = self._write_block(_BlockBuilder(_BLOCK_RESTART_INTERVAL))
        if self.pending_handle is not None:
            self.index.add(_short_successor(self.last_key), self.pending_handle)
            self.pending_handle = None
        index_handle = self._write_block(self.index)
        handles = meta_handle + index_handle
        footer = handles + b"\0" * (_FOOTER_HANDLES_LEN - len(handles)) + _U64.pack(_TABLE_MAGIC)
        self.f.write(footer)
        self.offset += len(footer)
