"""Helpers for the reader tests (tests/test_reader_*.py): real TF writers and tiny hand-made tables.

The TF helpers write checkpoints with TensorFlow itself (graph-mode ``Saver`` with partitioners
and several CPU devices for sharding, ``tf.train.Checkpoint``); the table helpers build small
LevelDB-format index files byte by byte, for headers TensorFlow never writes (big-endian, future
versions) and for the fuzz tests that re-checksum mutated blocks.
"""

from __future__ import annotations

import hashlib
import os
import struct
import tracemalloc
from pathlib import Path
from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence, Tuple

import numpy as np

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

from ckptmerge.formats import protowire as pw  # noqa: E402
from ckptmerge.formats.tf.bundle import crc32c, encode_tensor_name_slice, mask_crc  # noqa: E402

#: Every dtype the property test writes (numpy-style names as ckptmerge reports them).
ALL_DTYPES = ["float16", "float32", "float64", "bfloat16", "int8", "int16", "int32", "int64",
              "uint8", "uint16", "uint32", "uint64", "bool", "complex64", "complex128", "string",
              "float8_e5m2", "float8_e4m3fn", "int4", "uint4"]


def traced_peak(fn: Callable[[], Any]) -> Tuple[Any, int]:
    """(result of ``fn()``, peak bytes Python allocated while it ran, per ``tracemalloc``)."""
    tracemalloc.start()
    try:
        out = fn()
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    return out, peak


def tf():
    """Import TensorFlow (quietly) only when a test needs it."""
    import tensorflow

    return tensorflow


def digest(arr: np.ndarray) -> str:
    """sha256 of a tensor as corpus reference.json computes it (strings: concatenated bytes)."""
    if arr.dtype == object:
        return hashlib.sha256(b"".join(arr.reshape(-1).tolist())).hexdigest()
    return hashlib.sha256(np.ascontiguousarray(arr).tobytes()).hexdigest()


def same_value(a: np.ndarray, b: np.ndarray) -> bool:
    """Bitwise equality (NaN-safe), with matching shapes; strings elementwise."""
    a, b = np.asarray(a), np.asarray(b)
    if a.shape != b.shape:
        return False
    if a.dtype == object or b.dtype == object:
        return [bytes(x) for x in a.reshape(-1)] == [bytes(x) for x in b.reshape(-1)]
    if a.dtype.name in ("int4", "uint4", "int2", "uint2"):  # the unused high bits may differ
        return a.dtype == b.dtype and np.array_equal(a.astype(np.int8), b.astype(np.int8))
    return a.dtype.itemsize == b.dtype.itemsize and a.tobytes() == b.tobytes()


def random_value(rng: np.random.Generator, dtype: str, shape: Tuple[int, ...]) -> np.ndarray:
    """Random test data of a ckptmerge dtype name (strings: bytes incl. NUL/0xff, some long)."""
    import ml_dtypes

    n = int(np.prod(shape, dtype=np.int64))
    if dtype == "string":
        items = []
        for i in range(n):
            length = 200 if i == 1 else int(rng.integers(0, 12))  # 200 needs a 2-byte varint
            items.append(bytes(rng.integers(0, 256, size=length, dtype=np.uint8)))
        out = np.empty(n, dtype=object)
        out[:] = items
        return out.reshape(shape)
    if dtype == "bool":
        return rng.integers(0, 2, size=shape).astype(bool)
    if dtype in ("int4", "uint4"):
        lo, hi = (-8, 8) if dtype == "int4" else (0, 16)
        return rng.integers(lo, hi, size=shape).astype(getattr(ml_dtypes, dtype))
    if dtype.startswith(("int", "uint")):
        info = np.iinfo(dtype)
        return rng.integers(info.min, info.max, size=shape, dtype=dtype, endpoint=True)
    if dtype.startswith("complex"):
        return (rng.standard_normal(shape) + 1j * rng.standard_normal(shape)).astype(dtype)
    np_dtype = getattr(ml_dtypes, dtype) if hasattr(ml_dtypes, dtype) else np.dtype(dtype)
    return (rng.standard_normal(shape) * 4).astype(np_dtype)


def _partition_initializer(full: np.ndarray):
    """An initializer giving each partition of a partitioned variable its part of ``full``."""
    t = tf()

    def init(shape, dtype=None, partition_info=None):
        if partition_info is None:
            return t.constant(full, dtype=dtype)
        idx = tuple(slice(o, o + s) for o, s in zip(partition_info.var_offset, shape))
        return t.constant(full[idx], dtype=dtype)

    return init


def write_saver_checkpoint(prefix: str, variables: Sequence[dict], *, sharded: bool = False,
                           v1: bool = False) -> str:
    """Write a TF1 name-based checkpoint with ``tf.compat.v1.train.Saver`` (graph mode).

    Args:
        prefix: where to save.
        variables: dicts with ``name``, ``value`` (numpy array), ``dtype`` (ckptmerge name),
            optional ``partitions`` (int, fixed_size_partitioner) and ``device`` (0 or 1).
        sharded: ``Saver(sharded=True)``: one data shard per device used.
        v1: ``Saver(write_version=SaverDef.V1)``: the V1 table format.

    Returns:
        The saved prefix (for a sharded V1 checkpoint, its ``-?????-of-NNNNN`` pattern).
    """
    t = tf()
    os.makedirs(os.path.dirname(prefix), exist_ok=True)
    graph = t.Graph()
    with graph.as_default():
        for spec in variables:
            value = spec["value"]
            with t.device(f"/cpu:{spec.get('device', 0)}"):
                parts = spec.get("partitions") or 0
                t.compat.v1.get_variable(
                    spec["name"], shape=value.shape, dtype=t.as_dtype(spec["dtype"]),
                    initializer=_partition_initializer(value),
                    partitioner=t.compat.v1.fixed_size_partitioner(parts) if parts > 1 else None,
                    use_resource=True)
        version = t.compat.v1.train.SaverDef.V1 if v1 else t.compat.v1.train.SaverDef.V2
        saver = t.compat.v1.train.Saver(sharded=sharded, write_version=version)
        config = t.compat.v1.ConfigProto(device_count={"CPU": 2})
        with t.compat.v1.Session(graph=graph, config=config) as sess:
            sess.run(t.compat.v1.global_variables_initializer())
            return saver.save(sess, prefix, write_meta_graph=False)


def tf_tensors(prefix: str) -> Dict[str, object]:
    """``{key: value or exception}`` as ``tf.train.load_checkpoint`` returns them."""
    reader = tf().train.load_checkpoint(prefix)
    out: Dict[str, object] = {}
    for key in reader.get_variable_to_shape_map():
        try:
            out[key] = reader.get_tensor(key)
        except Exception as e:  # TF cannot read some partitioned dtypes back
            out[key] = e
    return out


# --------------------------------------------------------------------------------------------
# Hand-made tables
# --------------------------------------------------------------------------------------------
MAGIC = struct.pack("<Q", 0xDB4775248B80FB57)


def block_bytes(entries: Iterable[Tuple[bytes, bytes]]) -> bytes:
    """A LevelDB block: every entry a restart point (no prefix sharing), then the restarts."""
    body = bytearray()
    restarts = []
    for key, value in entries:
        restarts.append(len(body))
        body += pw.encode_varint(0) + pw.encode_varint(len(key)) + pw.encode_varint(len(value))
        body += key + value
    restarts = restarts or [0]
    for r in restarts:
        body += struct.pack("<I", r)
    body += struct.pack("<I", len(restarts))
    return bytes(body)


def _trailer(contents: bytes, ctype: int = 0) -> bytes:
    return bytes([ctype]) + struct.pack("<I", mask_crc(crc32c(bytes([ctype]), crc32c(contents))))


def table_bytes(entries: Sequence[Tuple[bytes, bytes]], *, snappy: bool = False) -> bytes:
    """A whole table with one data block (optionally Snappy-compressed) and its index block."""
    out = bytearray()
    data = block_bytes(entries)
    ctype = 0
    if snappy:
        import cramjam

        data, ctype = bytes(cramjam.snappy.compress_raw(data)), 1
    data_handle = pw.encode_varint(0) + pw.encode_varint(len(data))
    out += data + _trailer(data, ctype)
    meta = block_bytes([])
    meta_handle = pw.encode_varint(len(out)) + pw.encode_varint(len(meta))
    out += meta + _trailer(meta)
    last_key = entries[-1][0] if entries else b""
    index = block_bytes([(last_key + b"\xff", data_handle)])
    index_handle = pw.encode_varint(len(out)) + pw.encode_varint(len(index))
    out += index + _trailer(index)
    footer = meta_handle + index_handle
    out += footer + b"\x00" * (40 - len(footer)) + MAGIC
    return bytes(out)


def header_proto(num_shards: int = 1, endianness: int = 0, min_consumer: int = 0) -> bytes:
    """A BundleHeaderProto."""
    version = pw.field_varint(1, 1) + (pw.field_varint(2, min_consumer) if min_consumer else b"")
    return (pw.field_varint(1, num_shards) + (pw.field_varint(2, endianness) if endianness else b"")
            + pw.field_bytes(3, version))


def entry_proto(dtype: int, shape: Sequence[int], offset: int, size: int, crc: int, shard: int = 0) -> bytes:
    """A BundleEntryProto of an unpartitioned tensor."""
    dims = b"".join(pw.field_bytes(2, pw.field_varint(1, d)) for d in shape)
    return (pw.field_varint(1, dtype) + pw.field_bytes(2, dims) + (pw.field_varint(3, shard) if shard else b"")
            + (pw.field_varint(4, offset) if offset else b"") + pw.field_varint(5, size)
            + pw.field_fixed32(6, crc))


def partitioned_entry_proto(dtype: int, shape: Sequence[int],
                            slices: Sequence[Sequence[Tuple[int, int]]]) -> bytes:
    """The BundleEntryProto of a partitioned tensor: dtype, full shape and its slices
    (``(start, length)`` per dimension, ``length == -1`` for a full dimension); no data."""
    dims = b"".join(pw.field_bytes(2, pw.field_varint(1, d)) for d in shape)
    protos = []
    for extents in slices:
        extent_protos = (pw.field_bytes(1, (pw.field_varint(1, start) if start else b"")
                                        + (pw.field_varint(2, length) if length != -1 else b""))
                         for start, length in extents)
        protos.append(pw.field_bytes(7, b"".join(extent_protos)))
    return pw.field_varint(1, dtype) + pw.field_bytes(2, dims) + b"".join(protos)


def write_bundle(prefix: str, entries: Sequence[Tuple[bytes, bytes]], data: bytes) -> str:
    """Write a one-shard bundle from hand-made index entries (sorted here) and its data bytes."""
    table = [(b"", header_proto())] + sorted(entries)
    Path(prefix + ".index").write_bytes(table_bytes(table))
    Path(prefix + ".data-00000-of-00001").write_bytes(bytes(data))
    return prefix


def write_partitioned_bundle(prefix: str, name: str, shape: Sequence[int],
                             parts: Sequence[Tuple[Sequence[Tuple[int, int]], np.ndarray]]) -> str:
    """Write a one-shard bundle holding one partitioned numeric tensor as TF lays it out: the
    full entry listing the slices, and one entry per slice (keyed by TF's
    ``EncodeTensorNameSlice``) with that slice's data. ``parts`` are ``(extents, value)``;
    nothing checks that they tile the tensor (that is the point: tests craft bad tilings)."""
    from ckptmerge.formats.dtypes import numpy_to_tf

    dtype = numpy_to_tf(parts[0][1].dtype)
    data = bytearray()
    entries = [(name.encode(), partitioned_entry_proto(dtype, shape, [ext for ext, _ in parts]))]
    keys = set()
    for extents, value in parts:
        key = encode_tensor_name_slice(name, extents)
        if key in keys:  # a slice listed twice has one entry (keys are unique)
            continue
        keys.add(key)
        raw = np.ascontiguousarray(value).tobytes()
        entries.append((key,
                        entry_proto(dtype, value.shape, len(data), len(raw), mask_crc(crc32c(raw)))))
        data += raw
    return write_bundle(prefix, entries, bytes(data))


def write_float_bundle(prefix: str, tensors: Dict[str, np.ndarray], *, header: Optional[bytes] = None,
                       snappy: bool = False) -> str:
    """Write a one-shard bundle of little-endian numeric tensors with hand-made index bytes."""
    from ckptmerge.formats.dtypes import numpy_to_tf

    data = bytearray()
    entries: List[Tuple[bytes, bytes]] = [(b"", header if header is not None else header_proto())]
    for name in sorted(tensors):
        raw = np.ascontiguousarray(tensors[name]).tobytes()
        entries.append((name.encode(), entry_proto(numpy_to_tf(tensors[name].dtype), tensors[name].shape,
                                                   len(data), len(raw), mask_crc(crc32c(raw)))))
        data += raw
    Path(prefix + ".index").write_bytes(table_bytes(entries, snappy=snappy))
    Path(prefix + ".data-00000-of-00001").write_bytes(bytes(data))
    return prefix


def block_spans(index: bytes) -> List[Tuple[int, int]]:
    """(offset, size) of every block of a table (index block last), read from its footer."""
    footer = index[-48:]
    _, pos = pw.read_varint(footer, 0)
    _, pos = pw.read_varint(footer, pos)
    ioff, pos = pw.read_varint(footer, pos)
    isize, pos = pw.read_varint(footer, pos)
    spans = []
    block = index[ioff:ioff + isize]
    nrest = struct.unpack_from("<I", block, len(block) - 4)[0]
    limit = len(block) - 4 - 4 * nrest
    p, prev = 0, b""
    while p < limit:
        shared, p = pw.read_varint(block, p)
        non_shared, p = pw.read_varint(block, p)
        vlen, p = pw.read_varint(block, p)
        prev = prev[:shared] + block[p:p + non_shared]
        p += non_shared
        off, q = pw.read_varint(block, p)
        size, _ = pw.read_varint(block, q)
        spans.append((off, size))
        p += vlen
    return spans + [(ioff, isize)]


def rechecksum(index: bytearray, spans: Sequence[Tuple[int, int]]) -> None:
    """Recompute the trailer CRC of every block in ``spans`` that still fits in ``index``."""
    for off, size in spans:
        end = off + size
        if end + 5 <= len(index):
            index[end + 1:end + 5] = struct.pack(
                "<I", mask_crc(crc32c(bytes(index[end:end + 1]), crc32c(bytes(index[off:end])))))
