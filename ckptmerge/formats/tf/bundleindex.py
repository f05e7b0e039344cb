"""The entries of a V2 tensor bundle's index, decoded in bulk and kept as columns.

Every entry but the header of a ``.index`` table is a ``BundleEntryProto``
(``tensorflow/core/protobuf/tensor_bundle.proto``): dtype, shape, shard, offset, size, masked
CRC32C and, for a partitioned tensor, its slices. A checkpoint of 100,000 variables has 100,000
of them, so they are not decoded one Python object at a time: :func:`decode_fields` walks all
of them at once with numpy (one step per field, about six), and :class:`EntryColumns` keeps the
results as arrays, building a :class:`BundleEntry` only for an entry that is asked for.

An entry the bulk walk does not recognise (slices, fields out of order or repeated, unknown
fields, varints of 10 bytes, negative int64 values, truncation) is decoded by
:func:`parse_entry_checked`, which gives the precise error. The two always agree: the bulk walk
only accepts what the careful parser reads the same way.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass
from typing import Dict, Iterator, List, Mapping, Optional, Tuple

import numpy as np

from ckptmerge.formats.tf.protowire import (
    WIRE_BYTES,
    WIRE_FIXED32,
    WIRE_VARINT,
    DecodeError,
    iter_fields,
    padded_bytes,
    varints_at,
)
from ckptmerge.formats.tf.tfproto import int64_field, parse_shape, parse_slice

__all__ = ["BundleEntry", "EntryColumns", "EntriesByKey", "EntriesByRawKey", "decode_fields",
           "parse_entry_checked", "parse_header", "shape_column"]


@dataclass(frozen=True)
class BundleEntry:
    """One decoded ``BundleEntryProto``.

    ``slices`` holds ``(start, length)`` per dimension for each slice of a partitioned tensor
    (``length`` is ``-1`` for a full dimension); such an entry has no data of its own.

    Example:
        >>> e = BundleReader("model.ckpt").entries["dense/kernel"]  # doctest: +SKIP
        >>> (e.dtype, e.shape, e.shard_id, e.offset, e.size)  # doctest: +SKIP
        (1, (784, 128), 0, 0, 401408)
    """

    key: str
    dtype: int
    shape: Tuple[int, ...]
    shard_id: int
    offset: int
    size: int
    crc32c: int  # masked, as stored
    slices: Tuple[Tuple[Tuple[int, int], ...], ...] = ()


def parse_entry_checked(key: str, buf: bytes) -> BundleEntry:
    """Decode one ``BundleEntryProto`` field by field (any layout; precise errors).

    Raises:
        DecodeError: a malformed field, or a negative shard, offset or size.

    Example:
        >>> parse_entry_checked("w", b"\\x08\\x01\\x12\\x00\\x28\\x04").size
        4
    """
    dtype = shard = offset = size = crc = 0
    shape: Tuple[int, ...] = ()
    slices: List[Tuple[Tuple[int, int], ...]] = []
    for no, wire, value in iter_fields(buf):
        if no == 1 and wire == WIRE_VARINT:
            dtype = value  # type: ignore[assignment]
        elif no == 2 and wire == WIRE_BYTES:
            shape = parse_shape(value)  # type: ignore[arg-type]
        elif no == 3 and wire == WIRE_VARINT:
            shard = int64_field(value, "shard_id")
        elif no == 4 and wire == WIRE_VARINT:
            offset = int64_field(value, "offset")
        elif no == 5 and wire == WIRE_VARINT:
            size = int64_field(value, "size")
        elif no == 6 and wire == WIRE_FIXED32:
            crc = value  # type: ignore[assignment]
        elif no == 7 and wire == WIRE_BYTES:
            slices.append(parse_slice(value))  # type: ignore[arg-type]
        elif no <= 7:
            raise DecodeError(f"BundleEntryProto field {no} has wire type {wire}")
    if shard < 0 or offset < 0 or size < 0:
        raise DecodeError(f"negative shard/offset/size ({shard}/{offset}/{size})")
    return BundleEntry(key, dtype, shape, shard, offset, size, crc, tuple(slices))


def parse_header(buf: bytes) -> Tuple[int, int, int, List[int]]:
    """``(num_shards, endianness, min_consumer, bad_consumers)`` of a ``BundleHeaderProto``.

    Example:
        >>> parse_header(b"\\x08\\x01")
        (1, 0, 0, [])
    """
    num_shards, endianness, min_consumer, bad = 0, 0, 0, []
    for no, wire, value in iter_fields(buf):
        if no == 1 and wire == WIRE_VARINT:
            num_shards = int64_field(value, "num_shards")
        elif no == 2 and wire == WIRE_VARINT:
            endianness = value  # type: ignore[assignment]
        elif no == 3 and wire == WIRE_BYTES:
            for vno, vwire, vval in iter_fields(value):  # type: ignore[arg-type]
                if vno == 2 and vwire == WIRE_VARINT:
                    min_consumer = int64_field(vval, "min_consumer")
                elif vno == 3 and vwire == WIRE_VARINT:
                    bad.append(int64_field(vval, "bad_consumers"))
    return num_shards, endianness, min_consumer, bad


#: Rows of the ``fields`` array of :func:`decode_fields` and :class:`EntryColumns`.
DTYPE, SHARD, OFFSET, SIZE, CRC = range(5)
# Tag byte -> row, for the varint fields (1 dtype, 3 shard_id, 4 offset, 5 size).
_VARINT_ROW = np.full(256, -1, np.int64)
_VARINT_ROW[[0x08, 0x18, 0x20, 0x28]] = [DTYPE, SHARD, OFFSET, SIZE]
_KNOWN_TAG = np.zeros(256, bool)
_KNOWN_TAG[[0x08, 0x12, 0x18, 0x20, 0x28, 0x35]] = True  # 2 shape (bytes), 6 crc32c (fixed32)


def decode_fields(data: bytes, starts: np.ndarray, ends: np.ndarray
                  ) -> Tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Decode the entries ``data[starts[i]:ends[i]]`` all at once.

    Returns:
        ``(fields, shape_starts, shape_ends, careful)``: ``fields[row, i]`` (rows ``DTYPE``,
        ``SHARD``, ``OFFSET``, ``SIZE``, ``CRC``; 0 when absent), where entry ``i``'s
        ``TensorShapeProto`` lies in ``data`` (an empty span when absent), and the sorted indices
        of the entries to decode with :func:`parse_entry_checked` instead (their other values
        are meaningless).

    Example:
        >>> f, a, b, careful = decode_fields(b"\\x08\\x01\\x28\\x04", np.array([0]), np.array([4]))
        >>> f[:, 0].tolist(), careful.tolist()
        ([1, 0, 0, 4, 0], [])
    """
    n = len(starts)
    buf = padded_bytes(data, len(data))
    fields = np.zeros((5, n), np.int64)
    shape_starts = np.zeros(n, np.int64)
    shape_ends = np.zeros(n, np.int64)
    careful = np.zeros(n, bool)
    pos = np.asarray(starts, np.int64).copy()
    ends = np.asarray(ends, np.int64)
    last_tag = np.zeros(n, np.int64)
    active = np.flatnonzero(pos < ends)
    while active.size:
        at = pos[active]
        tag = buf[at].astype(np.int64)
        ok = _KNOWN_TAG[tag] & (tag > last_tag[active])  # TF writes each field once, in order
        careful[active[~ok]] = True
        active, at, tag = active[ok], at[ok] + 1, tag[ok]
        last_tag[active] = tag
        sel = tag & 7 == 0  # varint fields
        idx = active[sel]
        if idx.size:
            got = varints_at(buf, at[sel])
            if got is None:  # a 10-byte varint somewhere among them: all of them the careful way
                careful[idx] = True
                pos[idx] = ends[idx]
            else:
                fields[_VARINT_ROW[tag[sel]], idx] = got[0]
                pos[idx] = got[1]
        sel = tag == 0x12  # the shape
        idx = active[sel]
        if idx.size:
            got = varints_at(buf, at[sel])
            if got is None:
                careful[idx] = True
                pos[idx] = ends[idx]
            else:
                after = got[1]
                end = after + np.minimum(got[0], ends[idx] - after + 1)  # past the end stays past it
                shape_starts[idx] = after
                shape_ends[idx] = end
                pos[idx] = end
        crc_tags = tag == 0x35
        idx = active[crc_tags]
        if idx.size:
            a = at[crc_tags]
            fields[CRC, idx] = (buf[a].astype(np.int64) | buf[a + 1].astype(np.int64) << 8
                                | buf[a + 2].astype(np.int64) << 16 | buf[a + 3].astype(np.int64) << 24)
            pos[idx] = a + 4
        over = pos[active] > ends[active]
        careful[active[over]] = True
        active = active[pos[active] < ends[active]]
    return fields, shape_starts, shape_ends, np.flatnonzero(careful)


# Encoded shapes of up to this many bytes (a shape of up to about seven dimensions) are compared
# as two 64-bit words; longer ones, rare, one at a time.
_SHORT_SHAPE = 16


def shape_column(data: bytes, starts: np.ndarray, ends: np.ndarray
                 ) -> Tuple[List[Tuple[int, ...]], np.ndarray, List[int]]:
    """Parse every entry's ``TensorShapeProto`` (``data[starts[i]:ends[i]]``), each distinct
    encoding once: 100,000 entries usually hold a handful of shapes.

    Returns:
        ``(table, ids, bad)``: entry ``i``'s shape is ``table[ids[i]]``; ``bad`` lists the entries
        whose shape does not parse (``ids`` points them at ``()``: the careful parser explains them).

    Example:
        >>> table, ids, bad = shape_column(b"\\x12\\x02\\x08\\x03", np.array([0, 0]), np.array([4, 0]))
        >>> [table[i] for i in ids], bad
        ([(3,), ()], [])
    """
    n = len(starts)
    starts = np.asarray(starts, np.int64)
    lens = np.asarray(ends, np.int64) - starts
    table: List[Tuple[int, ...]] = [()]
    index: Dict[bytes, int] = {b"": 0}
    bad: List[int] = []

    def intern(i: int) -> int:
        raw = data[starts[i]:starts[i] + lens[i]]
        sid = index.get(raw)
        if sid is None:
            try:
                shape = parse_shape(raw)
            except DecodeError:
                bad.append(i)
                return 0
            sid = index[raw] = len(table)
            table.append(shape)
        return sid

    ids = np.zeros(n, np.int64)
    short = np.flatnonzero((lens >= 0) & (lens <= _SHORT_SHAPE))
    if short.size and data:
        view, last = np.frombuffer(data, np.uint8), len(data) - 1
        length, at = lens[short], starts[short]
        words = np.zeros((2, len(short)), np.uint64)  # with the length, one encoding
        for j in range(_SHORT_SHAPE):  # (a byte column at a time; bytes past an encoding are masked)
            byte = view[np.minimum(at + j, last)].astype(np.uint64)
            byte[length <= j] = 0
            words[j // 8] |= byte << np.uint64(8 * (j % 8))
        order = np.lexsort((words[1], words[0], length))
        w0, w1, ln = words[0, order], words[1, order], length[order]
        new = np.ones(len(order), bool)
        new[1:] = (w0[1:] != w0[:-1]) | (w1[1:] != w1[:-1]) | (ln[1:] != ln[:-1])
        firsts = short[order[new]]
        n_bad = len(bad)
        group_ids = np.array([intern(i) for i in firsts.tolist()], np.int64)
        group = np.cumsum(new) - 1
        ids[short[order]] = group_ids[group]
        if len(bad) > n_bad:  # every entry of an encoding that does not parse
            broken = np.isin(group, np.flatnonzero(np.isin(firsts, bad[n_bad:])))
            del bad[n_bad:]
            bad += short[order[broken]].tolist()
    for i in np.flatnonzero((lens < 0) | (lens > _SHORT_SHAPE)).tolist():
        ids[i] = intern(i)
    bad.sort()
    return table, ids, bad


class EntryColumns:
    """Every entry of a bundle index (header left out), in key order, as columns.

    Attributes:
        keys: the keys as text, sorted (UTF-8; slice keys, which start with ``\\x00``, as
            Latin-1: both keep the order of the stored bytes, so they are searched by bisection).
        fields: ``int64`` array of rows ``DTYPE``, ``SHARD``, ``OFFSET``, ``SIZE``, ``CRC``.
        shape_table: the distinct shapes (tuples); ``shape_ids``: entry ``i``'s shape is
            ``shape_table[shape_ids[i]]`` (see :func:`shape_column`).
        special: entry index -> its :class:`BundleEntry`, for entries decoded the careful way
            (every partitioned tensor is one); their ``fields`` hold shard, offset and size only.

    Example:
        >>> cols = reader._columns  # doctest: +SKIP
        >>> cols.entry(cols.find(b"dense/kernel")).shape  # doctest: +SKIP
        (784, 128)
    """

    __slots__ = ("keys", "fields", "shape_table", "shape_ids", "special")

    def __init__(self, keys: List[str], fields: np.ndarray, shape_table: List[Tuple[int, ...]],
                 shape_ids: np.ndarray, special: Dict[int, BundleEntry]) -> None:
        self.keys = keys
        self.fields = fields
        self.shape_table = shape_table
        self.shape_ids = shape_ids
        self.special = special

    def __len__(self) -> int:
        return len(self.keys)

    def find(self, key: str) -> Optional[int]:
        """The index of ``key`` (as text), or ``None``."""
        i = bisect.bisect_left(self.keys, key)
        return i if i < len(self.keys) and self.keys[i] == key else None

    def find_raw(self, raw_key: bytes) -> Optional[int]:
        """The index of ``raw_key`` (as stored), or ``None``."""
        try:
            key = raw_key.decode("latin-1") if raw_key.startswith(b"\x00") else raw_key.decode("utf-8")
        except UnicodeDecodeError:
            return None
        return self.find(key)

    def entry(self, i: int) -> BundleEntry:
        """Entry ``i`` as a :class:`BundleEntry`."""
        e = self.special.get(i)
        if e is not None:
            return e
        dtype, shard, offset, size, crc = self.fields[:, i].tolist()
        return BundleEntry(self.keys[i], dtype, self.shape_table[self.shape_ids[i]], shard, offset, size, crc, ())

    def dtypes(self, indices: range) -> List[int]:
        """The dtype enum of each entry of ``indices`` (a range of entry positions)."""
        out = self.fields[DTYPE, indices].tolist()
        for i, e in self.special.items():  # entries decoded one by one: a few, not every entry
            if i in indices:
                out[indices.index(i)] = e.dtype
        return out


class EntriesByKey(Mapping):
    """A read-only ``{key (str): BundleEntry}`` view of :class:`EntryColumns` (slice keys
    included: they start with ``\\x00``); entries are built when looked up.

    Example:
        >>> EntriesByKey(cols)["dense/kernel"].size  # doctest: +SKIP
        401408
    """

    def __init__(self, columns: EntryColumns) -> None:
        self._cols = columns

    def _find(self, key: object) -> Optional[int]:
        return self._cols.find(key) if isinstance(key, str) else None

    def __getitem__(self, key: str) -> BundleEntry:
        i = self._find(key)
        if i is None:
            raise KeyError(key)
        return self._cols.entry(i)

    def location(self, key: str) -> Optional[Tuple[int, int]]:
        """``(shard_id, offset)`` of entry ``key`` without building it, or ``None``."""
        i = self._find(key)
        if i is None:
            return None
        return int(self._cols.fields[SHARD, i]), int(self._cols.fields[OFFSET, i])

    def __iter__(self) -> Iterator[str]:
        return iter(self._cols.keys)

    def __len__(self) -> int:
        return len(self._cols)


class EntriesByRawKey(EntriesByKey):
    """:class:`EntriesByKey` keyed by the keys as stored (bytes).

    Example:
        >>> EntriesByRawKey(cols)[b"dense/kernel"].size  # doctest: +SKIP
        401408
    """

    def _find(self, key: object) -> Optional[int]:
        return self._cols.find_raw(key) if isinstance(key, bytes) else None

    def __iter__(self) -> Iterator[bytes]:  # type: ignore[override]
        return (k.encode("latin-1" if k.startswith("\x00") else "utf-8") for k in self._cols.keys)
