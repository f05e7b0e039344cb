"""Bulk reading of a bundle index agrees with reading it entry by entry.

:meth:`Table.columns` walks each block from all its restart points at once and
:func:`decode_fields` decodes every ``BundleEntryProto`` at once; whatever they do not recognise
goes to the entry-by-entry parsers. These property tests feed both paths the same bytes (tables
written as TensorFlow writes them, then damaged with their checksums fixed; hand-made entry
protos with fields in any order, repeated, unknown, long or negative) and require the same
result or the same error.
"""

from __future__ import annotations

import struct

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from _reader_util import block_spans, rechecksum
from ckptmerge.formats import protowire as pw
from ckptmerge.formats.tf.bundleindex import (CRC, DTYPE, OFFSET, SHARD, SIZE, decode_fields, parse_entry_checked,
                                           shape_column)
from ckptmerge.formats.tf.table import Table, TableError
from ckptmerge.formats.tf.protowire import DecodeError
from ckptmerge.formats.tf.tfproto import parse_shape
from ckptmerge.formats.tf.writer import BundleWriter

_SETTINGS = dict(deadline=None, derandomize=True, database=None, suppress_health_check=list(HealthCheck))


@pytest.fixture(scope="module")
def index_bytes(tmp_path_factory):
    """A real index of 300 tensors (several blocks, restart points every 16 entries)."""
    prefix = str(tmp_path_factory.mktemp("bulk") / "m")
    with BundleWriter(prefix) as w:
        for i in range(150):
            w.add(f"scope_{i % 7}/layer_{i}/kernel", np.zeros((i % 5 + 1, 3), np.float32))
            w.add(f"scope_{i % 7}/layer_{i}/bias", np.zeros((3,), np.float64))
    with open(prefix + ".index", "rb") as f:
        return f.read()


def _both(data: bytes):
    """(columns as pairs, or the error text) and (items, or the error text)."""
    out = []
    for how in ("columns", "text columns", "items"):
        try:
            table = Table(len(data), lambda o, n: data[o:o + n])
            if how == "items":
                out.append(table.items())
            else:  # keys read as Latin-1 text must be the stored bytes, one character each
                c = table.columns(text=how == "text columns")
                keys = [k.encode("latin-1") if isinstance(k, str) else k for k in c.keys]
                out.append([(k, c.data[a:b]) for k, a, b in zip(keys, c.starts.tolist(), c.ends.tolist())])
        except TableError as e:
            out.append(f"error: {e}")
    bulk, text, one_by_one = out
    assert text == bulk
    return bulk, one_by_one


def test_bulk_table_reading_equals_entry_by_entry_reading(index_bytes):
    bulk, one_by_one = _both(index_bytes)
    assert isinstance(bulk, list) and len(bulk) == 301 and bulk == one_by_one


@settings(max_examples=400, **_SETTINGS)
@given(flips=st.lists(st.tuples(st.integers(0, 100_000), st.integers(1, 255)), min_size=1, max_size=3))
def test_damaged_table_reads_the_same_in_bulk_and_entry_by_entry(index_bytes, flips):
    data = bytearray(index_bytes)
    spans = block_spans(index_bytes)
    body = [off for off, size in spans[:-1] for off in range(off, off + size)]  # data blocks only
    for at, mask in flips:
        data[body[at % len(body)]] ^= mask
    rechecksum(data, spans)
    bulk, one_by_one = _both(bytes(data))
    assert bulk == one_by_one


def test_a_block_whose_restart_points_are_not_entry_starts_still_reads(index_bytes):
    # Restart points are only a search aid: a block whose restart array is wrong but whose
    # entries are fine is read entry by entry, as before.
    data = bytearray(index_bytes)
    off, size = block_spans(index_bytes)[0]
    n = struct.unpack_from("<I", data, off + size - 4)[0]
    struct.pack_into("<I", data, off + size - 4 - 4 * n + 4, 3)  # second restart point: mid-entry
    rechecksum(data, block_spans(index_bytes))
    bulk, one_by_one = _both(bytes(data))
    assert isinstance(bulk, list) and bulk == one_by_one


_FIELD = st.one_of(
    st.tuples(st.sampled_from([1, 3, 4, 5]), st.just("varint"),
              st.one_of(st.integers(0, 300), st.integers(0, 2**64 - 1), st.integers(-5, -1))),
    st.tuples(st.just(2), st.just("bytes"), st.lists(st.integers(0, 2**40), max_size=4)),
    st.tuples(st.just(6), st.just("fixed32"), st.integers(0, 2**32 - 1)),
    st.tuples(st.sampled_from([1, 2, 6, 7, 9]), st.sampled_from(["varint", "bytes", "fixed32", "fixed64"]),
              st.integers(0, 2**32 - 1)),
)


def _encode(no, wire, value):
    if wire == "varint":
        return pw.field_varint(no, value)
    if wire == "fixed32":
        return pw.field_fixed32(no, value)
    if wire == "fixed64":
        return pw.field_fixed64(no, value)
    if isinstance(value, list):  # a shape
        return pw.field_bytes(no, b"".join(pw.field_bytes(2, pw.field_varint(1, d)) for d in value))
    return pw.field_bytes(no, pw.field_varint(1, value % 5))


@settings(max_examples=500, **_SETTINGS)
@given(entries=st.lists(st.tuples(st.lists(_FIELD, max_size=8), st.integers(0, 3)), min_size=1, max_size=12))
def test_bulk_entry_decoding_agrees_with_the_careful_parser(entries):
    protos = []
    for fields, cut in entries:
        proto = b"".join(_encode(*f) for f in fields)
        protos.append(proto[:len(proto) - cut] if cut < len(proto) else proto)
    data = b"".join(protos)
    ends = np.cumsum([len(p) for p in protos])
    starts = ends - [len(p) for p in protos]
    got, shape_starts, shape_ends, careful = decode_fields(data, starts, ends)
    careful = set(careful.tolist())
    for i, proto in enumerate(protos):
        try:
            want = parse_entry_checked("k", proto)
        except Exception:  # noqa: BLE001 - any error: the bulk path must have handed it over
            assert i in careful
            continue
        if i in careful:
            continue
        assert not want.slices
        assert got[[DTYPE, SHARD, OFFSET, SIZE, CRC], i].tolist() == [
            want.dtype, want.shard_id, want.offset, want.size, want.crc32c]
        assert parse_shape(data[shape_starts[i]:shape_ends[i]]) == want.shape


def test_usual_entries_are_all_decoded_in_bulk():
    from _reader_util import entry_proto

    protos = [entry_proto(1, (784, 128), 0, 401408, 7), entry_proto(9, (), 401408, 8, 2**32 - 1, shard=2)]
    data = b"".join(protos)
    fields, _, _, careful = decode_fields(data, np.array([0, len(protos[0])]), np.array([len(protos[0]), len(data)]))
    assert careful.tolist() == []
    assert fields[:, 1].tolist() == [9, 2, 401408, 8, 2**32 - 1]


_SHAPE_BYTES = st.one_of(
    st.lists(st.integers(0, 2**40), max_size=9).map(  # well formed, short and long
        lambda dims: b"".join(pw.field_bytes(2, pw.field_varint(1, d)) for d in dims)),
    st.binary(max_size=20),  # anything: most do not parse
)


@settings(max_examples=300, **_SETTINGS)
@given(encodings=st.lists(_SHAPE_BYTES, min_size=1, max_size=6), picks=st.lists(st.integers(0, 5), max_size=40))
def test_shape_column_parses_each_entry_as_parse_shape_does(encodings, picks):
    # entries repeat a few encodings (as a real index does), some longer than the 16 bytes
    # compared as words, some broken; each must read as parse_shape reads it alone
    raws = [encodings[p % len(encodings)] for p in picks] or encodings
    data = b"".join(raws)
    ends = np.cumsum([len(r) for r in raws])
    starts = ends - [len(r) for r in raws]
    table, ids, bad = shape_column(data, starts, ends)
    for i, raw in enumerate(raws):
        try:
            want = parse_shape(raw)
        except DecodeError:
            assert i in bad and table[ids[i]] == ()
            continue
        assert i not in bad and table[ids[i]] == want
    assert len(table) <= len(set(raws)) + 1  # each distinct encoding parsed once (plus ())
