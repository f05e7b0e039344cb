"""The index of a tensor bundle as a writer encodes it, and the shard count of a finished one changed.

A bundle's ``.index`` maps each key to a ``BundleEntryProto`` (dtype, shape, shard, offset, size,
masked CRC32C) and holds a ``BundleHeaderProto`` under the empty key (the shard count, the format
version). :func:`entry_proto` and :func:`header_proto` encode them byte for byte as TensorFlow's
own ``BundleWriter`` does (proto3: fields at their default are left out, the shape always
present). :func:`pad_shards` gives a finished local bundle more data shards (renamed, empty ones
added, the header rewritten) so that its data files take names another checkpoint at the same
prefix does not use. :class:`~ckptmerge.formats.tf.writer.BundleWriter` writes the bundle.
"""

from __future__ import annotations

import os
from typing import List, Sequence

from ckptmerge.formats.io.output_prefix import shard_count
from ckptmerge.formats.tf.bundle import DATA_RE, data_file_name
from ckptmerge.formats.tf.protowire import field_bytes, field_fixed32, field_varint
from ckptmerge.formats.tf.table import read_table
from ckptmerge.formats.tf.table_writer import TF_BLOCK_SIZE, TableWriter

__all__ = ["TF_BUNDLE_VERSION", "shape_proto", "entry_proto", "header_proto", "pad_shards"]

#: The ``producer`` version written in the header (TF's ``kTensorBundleVersion``).
TF_BUNDLE_VERSION = 1


def shape_proto(shape: Sequence[int]) -> bytes:
    """A ``TensorShapeProto`` of ``shape``, as TF encodes it (a dimension of 0 is an empty ``dim``).

    Example:
        >>> shape_proto((2, 3))
        b'\\x12\\x02\\x08\\x02\\x12\\x02\\x08\\x03'
    """
    return b"".join(field_bytes(2, field_varint(1, d) if d else b"") for d in shape)


def entry_proto(dtype: int, shape: Sequence[int], shard: int, offset: int, size: int, crc: int) -> bytes:
    """A ``BundleEntryProto``: where a tensor's bytes are (shard, offset, size), its dtype, shape and masked CRC32C.

    Example:
        >>> entry_proto(1, (), 0, 0, 4, 0)
        b'\\x08\\x01\\x12\\x00(\\x04'
    """
    # proto3: fields equal to their default are omitted; the shape is always present.
    out = field_varint(1, dtype) + field_bytes(2, shape_proto(shape))
    if shard:
        out += field_varint(3, shard)
    if offset:
        out += field_varint(4, offset)
    if size:
        out += field_varint(5, size)
    if crc:
        out += field_fixed32(6, crc)
    return out


def header_proto(num_shards: int) -> bytes:
    """The ``BundleHeaderProto`` under the index's empty key: the shard count and the format version.

    Example:
        >>> header_proto(1)
        b'\\x08\\x01\\x1a\\x02\\x08\\x01'
    """
    # endianness LITTLE (0) is the default and omitted; version {producer: 1}.
    out = field_varint(1, num_shards) if num_shards else b""
    return out + field_bytes(3, field_varint(1, TF_BUNDLE_VERSION))


def pad_shards(prefix: str, num_shards: int) -> List[str]:
    """Give the finished local checkpoint at ``prefix`` ``num_shards`` data shards (more than it
    has): its shards are renamed to ``-of-<num_shards>`` names, empty trailing shards are added and
    the index is rewritten with the new count (its entries, shards and offsets unchanged), so its
    data files take names another checkpoint at the same prefix does not use. Returns the data
    files, in order. The files must be private to the caller (a temporary folder): this is not an
    atomic publish.

    Raises:
        OSError: a file cannot be read, renamed or written.

    Example:
        >>> pad_shards("/tmp/upload/merged", 2)  # doctest: +SKIP
        ['/tmp/upload/merged.data-00000-of-00002', '/tmp/upload/merged.data-00001-of-00002']
    """
    index = prefix + ".index"
    with open(index, "rb") as f:
        items = read_table(f.read())
    folder, base = os.path.split(prefix)
    counts = sorted({shard_count(n) for n in os.listdir(folder or ".")
                     if n.startswith(base) and DATA_RE.fullmatch(n[len(base):])})
    if len(counts) != 1 or counts[0] > num_shards:
        raise ValueError(f"{prefix!r} has data files of {counts} shards; cannot pad it to {num_shards}")
    natural = counts[0]
    files = [data_file_name(prefix, i, num_shards) for i in range(num_shards)]
    for i in range(num_shards):
        if i < natural:
            os.replace(data_file_name(prefix, i, natural), files[i])
        else:
            open(files[i], "xb").close()
    tmp = index + ".padded"
    with open(tmp, "wb") as f:
        table = TableWriter(f, TF_BLOCK_SIZE)
        for key, value in items:
            table.add(key, header_proto(num_shards) if key == b"" else value)
        table.finish()
    os.replace(tmp, index)
    return files
