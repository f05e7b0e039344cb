"""Look up keys of an OCDBT database (TensorStore's B+tree over plain files) without tensorstore.

Orbax keeps the arrays of a checkpoint in an OCDBT database: ``manifest.ocdbt`` (the
configuration and the version tree), and log-structured data files (``d/<32 hex digits>``, also
``ocdbt.process_N/d/...`` after Orbax merges the per-process databases) that hold B+tree nodes
and the values too large to sit inline in a leaf. Listing a checkpoint needs only each array's
small zarr metadata value (``<param>/zarr.json`` or ``<param>/.zarray``), so this module reads
just that much: the manifest, the latest version's root node, and the nodes on the way down to
the keys asked for. Importing tensorstore (and the ml_dtypes it imports) costs over a second of
CPU; this costs a few file reads. Array data is still read by tensorstore.

The format is TensorStore's "OCDBT storage format" (``kvstore/ocdbt`` in its documentation):
every encoded manifest or node has a header (a big-endian magic number, its little-endian
64-bit length, a version and a compression varint: 0 none, 1 zstd), a body, and a CRC-32C
footer; nodes hold prefix-compressed keys and columns of varints.

Untrusted input: every length, count and offset is checked against the bytes present before
anything is allocated or sliced; varints are at most 10 bytes and 64 bits; a zstd body may
decode to at most 256 times its size (``zipmembers.MAX_EXPANSION``, the bound of every compressed
input; bodies under 1 MiB exempt), to at most the database's own ``max_decoded_node_bytes`` (never
past :data:`MAX_NODE`), and to exactly the size its frame declares; every CRC-32C is checked; the tree
is walked downward only, so its height bounds the reads; data file paths must stay inside the
database folder; a node's keys, spelled out, may take at most :data:`MAX_KEY_BYTES`. Damage raises
:class:`OcdbtError` naming the file; a feature this reader does not implement (a numbered
manifest, a format version other than 0, an unknown compression) or a node past those bounds
raises :class:`OcdbtUnsupported`, and the caller falls back to tensorstore.
"""

from __future__ import annotations

import bisect
import struct
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import crc32c as _crc32c
import numpy as np

from ckptmerge.core.errors import CheckpointFormatError
from ckptmerge.formats.io.zipmembers import MAX_EXPANSION, SMALL_MEMBER

__all__ = ["OcdbtError", "OcdbtUnsupported", "read_keys", "MANIFEST", "MAX_NODE", "MAX_VALUE", "MAX_KEY_BYTES"]

#: The manifest's file name, relative to the database folder.
MANIFEST = "manifest.ocdbt"
#: The most bytes one manifest or node may decode to, whatever the database's configuration says.
MAX_NODE = 256 << 20
#: The largest value :func:`read_keys` returns (zarr metadata is a few hundred bytes).
MAX_VALUE = 16 << 20
_MAX_MANIFEST = 64 << 20
_MAX_HEIGHT = 64
_MAX_PATH = 65535
#: Keys are stored prefix-compressed, so a node's keys may spell out many times its own size: one
#: node's keys (with the prefix the path to it gives) may add up to this much. A database past it
#: is read by tensorstore instead (:class:`OcdbtUnsupported`).
MAX_KEY_BYTES = 64 << 20

_MANIFEST_MAGIC = 0x0CDB3A2A
_VERSION_NODE_MAGIC = 0x0CDB1234
_BTREE_MAGIC = 0x0CDB20DE
_ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"

#: ``read_range(path, offset, length) -> bytes`` of a file below the database folder (``path``
#: relative to it, ``/``-separated); it must return exactly ``length`` bytes or raise.
ReadRange = Callable[[str, int, int], bytes]
#: ``read_file(path, limit) -> bytes or None`` (``None``: no such file).
ReadFile = Callable[[str, int], Optional[bytes]]


class OcdbtError(CheckpointFormatError):
    """An OCDBT manifest or node is damaged (or is not one): the message names the file."""


class OcdbtUnsupported(CheckpointFormatError):
    """The database uses a feature this reader does not implement; tensorstore can read it."""


class _Cursor:
    """Reads a bytes object front to back; every read is checked against its end."""

    __slots__ = ("data", "pos", "what")

    def __init__(self, data: bytes, what: str) -> None:
        self.data, self.pos, self.what = data, 0, what

    def fail(self, problem: str) -> OcdbtError:
        return OcdbtError(f"{self.what}: {problem}")

    def left(self) -> int:
        return len(self.data) - self.pos

    def varint(self, limit: int = (1 << 64) - 1, field: str = "a varint") -> int:
        data, pos, out, shift = self.data, self.pos, 0, 0
        for i in range(10):
            if pos + i >= len(data):
                raise self.fail(f"{field} runs past the end at byte {self.pos}")
            b = data[pos + i]
            out |= (b & 0x7F) << shift
            if not b & 0x80:
                self.pos = pos + i + 1
                if out > limit:
                    raise self.fail(f"{field} is {out}, more than {limit}")
                return out
            shift += 7
        raise self.fail(f"{field} at byte {pos} is longer than 10 bytes")

    def varints(self, n: int, limit: int = (1 << 64) - 1, field: str = "a varint") -> List[int]:
        return [self.varint(limit, field) for _ in range(n)]

    def count(self, field: str, each: int = 1) -> int:
        """A varint count of items that each take at least ``each`` byte: never more than the bytes left."""
        return self.varint(self.left() // max(each, 1), field)

    def take(self, n: int, field: str) -> bytes:
        if n < 0 or n > self.left():
            raise self.fail(f"{field} needs {n} bytes at byte {self.pos}, but {self.left()} are left")
        out = self.data[self.pos:self.pos + n]
        self.pos += n
        return out

    def u8(self, field: str) -> int:
        return self.take(1, field)[0]


def _zstd_content_size(frame: bytes) -> Optional[int]:
    """The decoded size a zstd frame header declares, or ``None`` if it declares none."""
    if len(frame) < 6 or frame[:4] != _ZSTD_MAGIC:
        return None
    fhd = frame[4]
    fcs_flag, single = fhd >> 6, (fhd >> 5) & 1
    pos = 5 + (0 if single else 1) + (0, 1, 2, 4)[fhd & 3]
    width = (1 if single else 0, 2, 4, 8)[fcs_flag]
    if width == 0 or pos + width > len(frame):
        return None
    value = int.from_bytes(frame[pos:pos + width], "little")
    return value + 256 if width == 2 else value


def _decompress(body: bytes, bound: int, what: str) -> bytes:
    """A zstd body decoded into at most ``bound`` bytes (exactly the size its frame declares)."""
    import cramjam

    declared = _zstd_content_size(body)
    if declared is not None and declared > bound:
        raise OcdbtError(f"{what}: its zstd body declares {declared} decoded bytes, more than the {bound} allowed")
    # An undeclared size gets the bound, as uninitialised (untouched) memory.
    out = bytearray(declared) if declared is not None else np.empty(bound, np.uint8)
    try:
        n = cramjam.zstd.decompress_into(body, out) if len(out) else 0
    except Exception as e:  # noqa: BLE001 - cramjam raises its own DecompressionError
        raise OcdbtError(f"{what}: its zstd body does not decode ({type(e).__name__}: {str(e)[:80]}), or decodes "
                         f"to more than {bound} bytes") from None
    if declared is not None and n != declared:
        raise OcdbtError(f"{what}: its zstd body decodes to {n} bytes, not the {declared} its frame declares")
    return bytes(out[:n])


def _envelope(data: bytes, magic: int, what: str, bound: int) -> bytes:
    """The decoded body of an encoded manifest or node (header, body, CRC-32C footer), checked."""
    if len(data) < 4 + 8 + 2 + 4:
        raise OcdbtError(f"{what}: {len(data)} bytes, too short for an OCDBT header and footer")
    found = struct.unpack_from(">I", data)[0]
    if found != magic:
        raise OcdbtError(f"{what}: magic number 0x{found:08x}, expected 0x{magic:08x}")
    length = struct.unpack_from("<Q", data, 4)[0]
    if length != len(data):
        raise OcdbtError(f"{what}: its header gives a length of {length} bytes, but it has {len(data)}")
    crc = struct.unpack_from("<I", data, len(data) - 4)[0]
    if _crc32c.crc32c(data[:-4]) != crc:
        raise OcdbtError(f"{what}: CRC-32C mismatch (the bytes are corrupt)")
    cur = _Cursor(data[:-4], what)
    cur.pos = 12
    version = cur.varint(field="the format version")
    if version != 0:
        raise OcdbtUnsupported(f"{what}: OCDBT format version {version} (this reader knows version 0)")
    compression = cur.varint(field="the compression format")
    body = data[cur.pos:-4]
    if compression == 0:
        return body
    if compression == 1:  # (the inflation bound every compressed input shares, and the database's own)
        return _decompress(body, min(bound, max(MAX_EXPANSION * len(body), SMALL_MEMBER)), what)
    raise OcdbtUnsupported(f"{what}: compression format {compression} (this reader knows 0 and 1, zstd)")


def _safe_path(path: bytes, what: str) -> str:
    try:
        text = path.decode("utf-8")
    except UnicodeDecodeError:
        raise OcdbtError(f"{what}: a data file path is not UTF-8") from None
    parts = text.split("/")
    if (not text or len(path) > _MAX_PATH or text.startswith("/") or "\\" in text or "\0" in text
            or any(p in ("", ".", "..") for p in parts)):
        raise OcdbtError(f"{what}: data file path {text[:80]!r} would lead outside the database folder")
    return text


def _file_table(cur: _Cursor, transitive: bytes) -> List[Tuple[bytes, bytes]]:
    """``[(full path, transitive path for its children)]`` of a data file table."""
    n = cur.count("the number of data files", 2)
    prefix = cur.varints(max(n - 1, 0), _MAX_PATH, "a path prefix length")
    suffix = cur.varints(n, _MAX_PATH, "a path suffix length")
    base = cur.varints(n, _MAX_PATH, "a base path length")
    out: List[Tuple[bytes, bytes]] = []
    prev = b""
    for i in range(n):
        keep = prefix[i - 1] if i else 0
        if keep > len(prev):
            raise cur.fail(f"data file {i} shares {keep} bytes with a {len(prev)}-byte path")
        path = prev[:keep] + cur.take(suffix[i], "a data file path")
        if base[i] > len(path):
            raise cur.fail(f"data file {i} has a {base[i]}-byte base path in a {len(path)}-byte path")
        full = transitive + path
        if len(full) > _MAX_PATH:
            raise cur.fail(f"data file {i}'s path is longer than {_MAX_PATH} bytes")
        out.append((full, transitive + path[:base[i]]))
        prev = path
    return out


class _Ref:
    """Where an encoded node (or an out-of-line value) is: a data file, an offset, a length."""

    __slots__ = ("path", "transitive", "offset", "length")

    def __init__(self, path: bytes, transitive: bytes, offset: int, length: int) -> None:
        self.path, self.transitive, self.offset, self.length = path, transitive, offset, length


def _ref(cur: _Cursor, table: List[Tuple[bytes, bytes]], file_id: int, offset: int, length: int) -> _Ref:
    if file_id >= len(table):
        raise cur.fail(f"data file {file_id} is not in its table of {len(table)}")
    return _Ref(table[file_id][0], table[file_id][1], offset, length)


class _Manifest:
    __slots__ = ("max_inline", "max_node", "root", "height")

    def __init__(self, max_inline: int, max_node: int, root: Optional[_Ref], height: int) -> None:
        self.max_inline, self.max_node, self.root, self.height = max_inline, max_node, root, height


def _manifest(data: bytes, what: str) -> _Manifest:
    cur = _Cursor(_envelope(data, _MANIFEST_MAGIC, what, _MAX_MANIFEST), what)
    cur.take(16, "the database uuid")
    kind = cur.varint(field="the manifest kind")
    if kind != 0:
        raise OcdbtUnsupported(f"{what}: manifest kind {kind} (numbered manifest files; this reader knows 0, a "
                               "single manifest, which Orbax writes)")
    max_inline = cur.varint(field="max_inline_value_bytes")
    max_node = cur.varint(field="max_decoded_node_bytes")
    arity = cur.u8("version_tree_arity_log2")
    if not 1 <= arity <= 16:
        raise cur.fail(f"version_tree_arity_log2 is {arity}")
    method = cur.varint(field="the compression method")
    if method == 1:
        cur.take(4, "the zstd level")
    elif method != 0:
        raise OcdbtUnsupported(f"{what}: compression method {method} (this reader knows 0 and 1, zstd)")
    table = _file_table(cur, b"")
    n = cur.count("the number of versions", 14)  # each version takes at least 14 bytes
    gens = cur.varints(n, field="a generation number")
    heights = [cur.u8("a root height") for _ in range(n)]
    files = cur.varints(n, field="a data file id")
    offsets = cur.varints(n, field="a data file offset")
    lengths = cur.varints(n, field="a data file length")
    cur.varints(3 * n, field="a version statistic")  # num_keys, num_tree_bytes, num_indirect_value_bytes
    cur.take(8 * n, "the commit times")
    if any(g == 0 for g in gens) or any(a >= b for a, b in zip(gens, gens[1:])):
        raise cur.fail("its generation numbers are not increasing from 1")
    if n == 0:
        return _Manifest(max_inline, max_node, None, 0)
    # The latest version is the last inline one: older ones (in version_nodes) are never needed.
    height = heights[-1]
    if height > _MAX_HEIGHT:
        raise cur.fail(f"the root node's height is {height}, more than {_MAX_HEIGHT}")
    if lengths[-1] == 0:  # an empty tree
        return _Manifest(max_inline, max_node, None, 0)
    return _Manifest(max_inline, max_node, _ref(cur, table, files[-1], offsets[-1], lengths[-1]), height)


def _prefixed_keys(cur: _Cursor, prefix: List[int], suffix: List[int], sub: Optional[List[int]] = None,
                   base: int = 0) -> List[bytes]:
    """A node's keys, spelled out (``base``: the length of the prefix each will be joined to)."""
    out: List[bytes] = []
    prev = b""
    total = 0
    for i, n in enumerate(suffix):
        keep = prefix[i - 1] if i else 0
        if keep > len(prev):
            raise cur.fail(f"key {i} shares {keep} bytes with a {len(prev)}-byte key")
        key = prev[:keep] + cur.take(n, "a key")
        total += len(key) + base
        if total > MAX_KEY_BYTES:
            raise OcdbtUnsupported(f"{cur.what}: its keys spell out more than {MAX_KEY_BYTES} bytes")
        if sub is not None and sub[i] > len(key):
            raise cur.fail(f"key {i} has a {sub[i]}-byte common subtree prefix but {len(key)} bytes")
        out.append(key)
        prev = key
    if any(a >= b for a, b in zip(out, out[1:])):
        raise cur.fail("its keys are not in increasing order")
    return out


class _Lookup:
    """One batched descent of the B+tree for a sorted set of keys."""

    def __init__(self, read_range: ReadRange, manifest: _Manifest, display: str) -> None:
        self.read_range, self.manifest, self.display = read_range, manifest, display
        self.bound = min(max(manifest.max_node, 1), MAX_NODE)
        self.found: Dict[bytes, Tuple[Optional[bytes], Optional[_Ref]]] = {}

    def _node(self, ref: _Ref, height: int) -> Tuple[_Cursor, List[Tuple[bytes, bytes]], int]:
        path = _safe_path(ref.path, f"a node of {self.display}")
        what = f"B+tree node at byte {ref.offset} of {self.display}/{path}"
        if ref.length > self.bound + 1024 or ref.length > MAX_NODE:
            raise OcdbtError(f"{what}: {ref.length} bytes, more than a node may take")
        data = self.read_range(path, ref.offset, ref.length)
        cur = _Cursor(_envelope(data, _BTREE_MAGIC, what, self.bound), what)
        found = cur.u8("the node height")
        if found != height:
            raise cur.fail(f"height {found}, but its parent says {height}")
        table = _file_table(cur, ref.transitive)
        n = cur.count("the number of entries")
        return cur, table, n

    def descend(self, ref: _Ref, height: int, prefix: bytes, wanted: List[bytes]) -> None:
        cur, table, n = self._node(ref, height)
        if height == 0:
            self._leaf(cur, table, n, prefix, wanted)
            return
        kp = cur.varints(max(n - 1, 0), field="a key prefix length")
        ks = cur.varints(n, cur.left(), "a key suffix length")
        sub = cur.varints(n, field="a subtree common prefix length")
        keys = _prefixed_keys(cur, kp, ks, sub, len(prefix))
        files = cur.varints(n, field="a data file id")
        offsets = cur.varints(n, field="a data file offset")
        lengths = cur.varints(n, field="a data file length")
        cur.varints(3 * n, field="a subtree statistic")
        full = [prefix + k for k in keys]
        groups: Dict[int, List[bytes]] = {}
        for key in wanted:
            i = bisect.bisect_right(full, key) - 1
            if i >= 0:
                groups.setdefault(i, []).append(key)
        for i, keys_here in sorted(groups.items()):
            child_prefix = prefix + keys[i][:sub[i]]
            keys_here = [k for k in keys_here if k.startswith(child_prefix)]
            if keys_here:
                self.descend(_ref(cur, table, files[i], offsets[i], lengths[i]), height - 1, child_prefix, keys_here)

    def _leaf(self, cur: _Cursor, table: List[Tuple[bytes, bytes]], n: int, prefix: bytes,
              wanted: List[bytes]) -> None:
        kp = cur.varints(max(n - 1, 0), field="a key prefix length")
        ks = cur.varints(n, cur.left(), "a key suffix length")
        keys = _prefixed_keys(cur, kp, ks, base=len(prefix))
        sizes = cur.varints(n, field="a value length")
        kinds = cur.varints(n, 1, "a value kind")
        indirect = [i for i in range(n) if kinds[i] == 1]
        files = cur.varints(len(indirect), field="a data file id")
        offsets = cur.varints(len(indirect), field="a data file offset")
        where = {i: (files[j], offsets[j]) for j, i in enumerate(indirect)}
        values: Dict[int, bytes] = {}
        for i in range(n):
            if kinds[i] == 0:
                values[i] = cur.take(sizes[i], "an inline value")
        if cur.left():
            raise cur.fail(f"{cur.left()} bytes follow its last value")
        index = {prefix + k: i for i, k in enumerate(keys)}
        for key in wanted:
            i = index.get(key)
            if i is None:
                continue
            if i in values:
                self.found[key] = (values[i], None)
            else:
                self.found[key] = (None, _ref(cur, table, where[i][0], where[i][1], sizes[i]))


def read_keys(read_file: ReadFile, read_range: ReadRange, keys: Sequence[str], display: str,
              *, limit: int = MAX_VALUE) -> Dict[str, Optional[bytes]]:
    """The values of ``keys`` in the OCDBT database whose files ``read_file``/``read_range`` read
    (``None`` for a key the latest version does not hold).

    Args:
        read_file: reads a whole small file of the database folder (the manifest).
        read_range: reads ``length`` bytes at ``offset`` of a file of the database folder.
        keys: the keys to look up (``"params.w/zarr.json"``).
        display: the database folder as messages name it.
        limit: the largest value returned; a bigger one is an :class:`OcdbtError`.

    Raises:
        OcdbtError: the manifest or a node is damaged, or a value is over ``limit``.
        OcdbtUnsupported: the database uses a feature this reader does not implement.

    Example:
        >>> read_keys(read_file, read_range, ["params.w/zarr.json"], "ckpt/state")  # doctest: +SKIP
        {'params.w/zarr.json': b'{"zarr_format": 3, ...}'}
    """
    data = read_file(MANIFEST, _MAX_MANIFEST)
    if data is None:
        raise OcdbtError(f"{display} has no {MANIFEST}")
    manifest = _manifest(data, f"{display}/{MANIFEST}")
    wanted = sorted({k.encode("utf-8", "surrogatepass") for k in keys})
    out: Dict[str, Optional[bytes]] = {k: None for k in keys}
    if manifest.root is None or not wanted:
        return out
    lookup = _Lookup(read_range, manifest, display)
    lookup.descend(manifest.root, manifest.height, b"", wanted)
    for key in keys:
        value, ref = lookup.found.get(key.encode("utf-8", "surrogatepass"), (None, None))
        if ref is not None:
            if ref.length > limit:
                raise OcdbtError(f"{display}: the value of {key!r} is {ref.length} bytes, over the {limit}-byte limit")
            path = _safe_path(ref.path, f"the value of {key!r} in {display}")
            value = read_range(path, ref.offset, ref.length)
        elif value is not None and len(value) > limit:
            raise OcdbtError(f"{display}: the value of {key!r} is {len(value)} bytes, over the {limit}-byte limit")
        out[key] = value
    return out
