"""The tensorstore-free OCDBT reader (ckptmerge.formats.orbax.ocdbt): every value equals what tensorstore
reads from databases tensorstore wrote (deep trees, out-of-line values, several commits, zstd or
not), and hostile manifests and nodes are clear errors naming the file, never a crash, a hang or a
huge allocation. An Orbax checkpoint whose database this reader does not implement (numbered
manifests) is listed through tensorstore instead, with the reason logged.
"""

from __future__ import annotations

import logging
import random
import shutil
import struct
from pathlib import Path
from typing import List, Tuple

import cramjam
import crc32c
import pytest

ts = pytest.importorskip("tensorstore", reason="the comparison needs tensorstore (pip install 'ckptmerge[orbax]')")

from ckptmerge.core.errors import CheckpointFormatError  # noqa: E402
from ckptmerge.formats.orbax.ocdbt import OcdbtError, OcdbtUnsupported, read_keys  # noqa: E402
from ckptmerge.formats.orbax.store import Location  # noqa: E402


class _Counting:
    """A folder's reads for read_keys, counted."""

    def __init__(self, root: Path) -> None:
        self.loc, self.ranges = Location(str(root)), 0

    def read_range(self, rel: str, offset: int, length: int) -> bytes:
        self.ranges += 1
        return self.loc.read_range(rel, offset, length)

    def keys(self, keys: List[str]):
        return read_keys(self.loc.read_bytes, self.read_range, keys, str(self.loc.root))


@pytest.fixture(scope="module", params=["zstd", "none"])
def database(request, tmp_path_factory):
    """A database written by tensorstore with tiny nodes (a tree many levels deep), values inline
    and out of line, and a second commit that overwrites some; and what it holds."""
    root = tmp_path_factory.mktemp(f"ocdbt-{request.param}")
    config = {"max_decoded_node_bytes": 300, "max_inline_value_bytes": 20,
              "compression": {"id": "zstd"} if request.param == "zstd" else None}
    kv = ts.KvStore.open({"driver": "ocdbt", "base": f"file://{root}/", "config": config}).result()
    rng = random.Random(0)
    values = {}
    for i in range(300):
        key = f"params.{rng.choice(['a', 'bb', 'layer'])}_{i:04d}/{rng.choice(['zarr.json', '.zarray', 'c/0/0'])}"
        values[key] = rng.randbytes(rng.choice([0, 3, 19, 21, 200]))
    with ts.Transaction() as txn:
        for k, v in values.items():
            kv.with_transaction(txn)[k] = v
    for k in list(values)[:40]:
        values[k] = b"second commit " + values[k]
        kv[k] = values[k]
    for k, v in values.items():
        assert kv[k] == v  # (what tensorstore reads)
    return root, values


def test_every_value_equals_what_tensorstore_reads_and_absent_keys_are_none(database):
    root, values = database
    absent = ["params.zz/zarr.json", "", "params.a", "params.a_0001/zarr.jso", "\U0001f600/zarr.json"]
    reader = _Counting(root)
    got = reader.keys(list(values) + absent)
    assert {k: got[k] for k in values} == values
    assert all(got[k] is None for k in absent)
    assert reader.ranges > 3  # the tree has interior nodes (and out-of-line values were read)


def test_one_key_reads_only_the_nodes_on_its_path(database):
    root, values = database
    everything, one = _Counting(root), _Counting(root)
    everything.keys(list(values))
    key = sorted(values)[len(values) // 2]
    assert one.keys([key]) == {key: values[key]}
    assert one.ranges < everything.ranges / 4


# -- hostile bytes ------------------------------------------------------------------------------

_MANIFEST, _BTREE = 0x0CDB3A2A, 0x0CDB20DE


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        out.append((n & 0x7F) | (0x80 if n > 0x7F else 0))
        n >>= 7
        if not n:
            return bytes(out)


def _envelope(magic: int, body: bytes, compression: int = 0, version: int = 0) -> bytes:
    head = struct.pack(">I", magic) + b"\0" * 8 + _varint(version) + _varint(compression)
    data = head + body
    data = data[:4] + struct.pack("<Q", len(data) + 4) + data[12:]
    return data + struct.pack("<I", crc32c.crc32c(data))


def _file_table(paths: List[bytes]) -> bytes:
    return (_varint(len(paths)) + b"\0" * max(len(paths) - 1, 0) + b"".join(_varint(len(p)) for p in paths)
            + b"\0" * len(paths) + b"".join(paths))


def _manifest_body(path: bytes, length: int, *, kind: int = 0, height: int = 0, files: int = -1) -> bytes:
    config = b"u" * 16 + _varint(kind) + _varint(1024) + _varint(1 << 20) + bytes([4]) + _varint(0)
    table = _file_table([path]) if files < 0 else _varint(files)
    version = (_varint(1) + _varint(1) + bytes([height]) + _varint(0) + _varint(0) + _varint(length)
               + _varint(1) + _varint(length) + _varint(0) + b"\0" * 8)
    return config + table + version + _varint(0)


def _leaf(entries: List[Tuple[bytes, bytes]], height: int = 0) -> bytes:
    n = len(entries)
    return _envelope(_BTREE, bytes([height]) + _file_table([]) + _varint(n) + b"\0" * max(n - 1, 0)
                     + b"".join(_varint(len(k)) for k, _ in entries) + b"".join(k for k, _ in entries)
                     + b"".join(_varint(len(v)) for _, v in entries) + b"\0" * n + b"".join(v for _, v in entries))


def _write(root: Path, manifest: bytes, node: bytes = b"") -> _Counting:
    (root / "d").mkdir(parents=True, exist_ok=True)
    (root / "manifest.ocdbt").write_bytes(manifest)
    (root / "d" / "x").write_bytes(node)
    return _Counting(root)


def test_a_hand_made_database_reads_and_is_the_base_of_the_hostile_ones(tmp_path):
    node = _leaf([(b"a/zarr.json", b"{}"), (b"b/zarr.json", b"[1]")])
    db = _write(tmp_path, _envelope(_MANIFEST, _manifest_body(b"d/x", len(node))), node)
    assert db.keys(["a/zarr.json", "b/zarr.json", "c"]) == {"a/zarr.json": b"{}", "b/zarr.json": b"[1]", "c": None}


@pytest.mark.parametrize("damage, message", [
    (lambda m: b"\x0c\xdb\x3a\x2b" + m[4:], r"magic number 0x0cdb3a2b, expected 0x0cdb3a2a"),
    (lambda m: m[:-7], r"its header gives a length of \d+ bytes, but it has"),
    (lambda m: m[:30] + bytes([m[30] ^ 1]) + m[31:], r"CRC-32C mismatch"),
    (lambda m: m[:10], r"10 bytes, too short for an OCDBT header"),
])
def test_a_damaged_manifest_is_an_error_naming_the_file(tmp_path, damage, message):
    node = _leaf([(b"a/zarr.json", b"{}")])
    db = _write(tmp_path, damage(_envelope(_MANIFEST, _manifest_body(b"d/x", len(node)))), node)
    with pytest.raises(OcdbtError, match=r"manifest\.ocdbt: " + message):
        db.keys(["a/zarr.json"])


def test_counts_lengths_and_varints_are_bounded_by_the_bytes_present(tmp_path):
    node = _leaf([(b"a/zarr.json", b"{}")])
    cases = [
        (_manifest_body(b"d/x", len(node), files=1 << 60), r"the number of data files is \d+, more than \d+"),
        (_manifest_body(b"d/x", len(node))[:16 + 8] + _file_table([]) + b"\xff" * 11 + b"\0" * 20,
         r"the number of versions at byte \d+ is longer than 10 bytes"),
        (_manifest_body(b"d/x", len(node))[:-30], r"runs past the end|needs \d+ bytes"),
    ]
    for body, message in cases:
        db = _write(tmp_path, _envelope(_MANIFEST, body), node)
        with pytest.raises(OcdbtError, match=message):
            db.keys(["a/zarr.json"])


@pytest.mark.parametrize("path", [b"../../etc/passwd", b"/etc/passwd", b"d/../../x", b"d//x", b"d\\x", b"d/\xff"])
def test_a_data_file_path_leading_outside_the_database_is_refused(tmp_path, path):
    node = _leaf([(b"a/zarr.json", b"{}")])
    db = _write(tmp_path, _envelope(_MANIFEST, _manifest_body(path, len(node))), node)
    with pytest.raises(OcdbtError, match=r"would lead outside the database folder|not UTF-8"):
        db.keys(["a/zarr.json"])


def test_a_zstd_body_declaring_more_than_allowed_is_refused_before_it_is_decoded(tmp_path):
    bomb = bytes(cramjam.zstd.compress(b"\0" * (16 << 20)))  # 16 MiB of zeros in a few hundred bytes
    db = _write(tmp_path, _envelope(_MANIFEST, bomb, compression=1))
    with pytest.raises(OcdbtError, match=r"declares 16777216 decoded bytes, more than the 1048576 allowed"):
        db.keys(["a/zarr.json"])
    db = _write(tmp_path, _envelope(_MANIFEST, b"\x28\xb5\x2f\xfd garbage", compression=1))
    with pytest.raises(OcdbtError, match=r"zstd body does not decode"):
        db.keys(["a/zarr.json"])


def test_nodes_that_lie_about_their_height_order_or_end_are_refused(tmp_path):
    good = [(b"a/zarr.json", b"{}"), (b"b/zarr.json", b"[]")]
    for node, height, message in [
        (_leaf(good, height=1), 0, r"height 1, but its parent says 0"),
        (_leaf(list(reversed(good))), 0, r"its keys are not in increasing order"),
        (_leaf(good)[:20] + bytes([_leaf(good)[20] ^ 1]) + _leaf(good)[21:], 0, r"CRC-32C mismatch"),
    ]:
        db = _write(tmp_path, _envelope(_MANIFEST, _manifest_body(b"d/x", len(node), height=height)), node)
        with pytest.raises(OcdbtError, match=r"B\+tree node at byte 0 of .*d/x: " + message):
            db.keys(["a/zarr.json"])
    node = _leaf(good)
    db = _write(tmp_path, _envelope(_MANIFEST, _manifest_body(b"d/x", len(node) + 100)), node)
    with pytest.raises(CheckpointFormatError, match=r"has \d+ bytes, but the checkpoint's index points at"):
        db.keys(["a/zarr.json"])


def test_keys_that_spell_out_far_more_than_their_node_are_left_to_tensorstore(tmp_path):
    # Each key repeats the one before and adds a byte: 12,000 keys stored in 60 KB spell out 72 MB.
    n = 12000
    body = (bytes([0]) + _file_table([]) + _varint(n) + b"".join(_varint(i) for i in range(1, n))
            + _varint(1) * n + b"a" * n + _varint(0) * n + _varint(0) * n)
    node = _envelope(_BTREE, body)
    db = _write(tmp_path, _envelope(_MANIFEST, _manifest_body(b"d/x", len(node))), node)
    with pytest.raises(OcdbtUnsupported, match=r"its keys spell out more than 67108864 bytes"):
        db.keys(["a/zarr.json"])


def test_features_this_reader_does_not_implement_are_unsupported_not_damage(tmp_path):
    node = _leaf([(b"a/zarr.json", b"{}")])
    for manifest in (_envelope(_MANIFEST, _manifest_body(b"d/x", len(node), kind=1)),
                     _envelope(_MANIFEST, _manifest_body(b"d/x", len(node)), version=1),
                     _envelope(_MANIFEST, _manifest_body(b"d/x", len(node)), compression=7)):
        db = _write(tmp_path, manifest, node)
        with pytest.raises(OcdbtUnsupported):
            db.keys(["a/zarr.json"])


# -- through the Orbax reader -------------------------------------------------------------------


@pytest.fixture(scope="module")
def orbax_item(tmp_path_factory):
    pytest.importorskip("orbax.checkpoint", reason="the Orbax checkpoint is written with orbax-checkpoint")
    import numpy as np
    from _orbax_util import write_orbax

    base = tmp_path_factory.mktemp("orbax-ocdbt")
    tree = {"params": {"w": np.arange(12, dtype=np.float32).reshape(3, 4), "b": np.ones(4, np.int8)}}
    return write_orbax(base / "ckpt", tree, "ocdbt+zarr")


def test_a_damaged_manifest_of_an_orbax_checkpoint_is_a_clear_error(orbax_item, tmp_path):
    from ckptmerge.formats.orbax.reader import OrbaxReader

    copy = tmp_path / "copy"
    shutil.copytree(orbax_item, copy)
    data = bytearray((copy / "manifest.ocdbt").read_bytes())
    data[-10] ^= 0xFF
    (copy / "manifest.ocdbt").write_bytes(bytes(data))
    with pytest.raises(CheckpointFormatError, match=r"Cannot read Orbax checkpoint .*: its OCDBT database is damaged "
                                                    r"\(.*manifest\.ocdbt: CRC-32C mismatch"):
        OrbaxReader(str(copy))


def test_a_numbered_manifest_is_listed_through_tensorstore_with_the_reason_logged(orbax_item, tmp_path, caplog):
    from ckptmerge.formats.orbax.reader import OrbaxReader

    copy = tmp_path / "numbered"
    shutil.copytree(orbax_item, copy, ignore=shutil.ignore_patterns("manifest.ocdbt", "d", "ocdbt.process_*"))
    src = ts.KvStore.open({"driver": "ocdbt", "base": f"file://{orbax_item}/"}).result()
    dst = ts.KvStore.open({"driver": "ocdbt", "base": f"file://{copy}/",
                           "config": {"manifest_kind": "numbered"}}).result()
    with ts.Transaction() as txn:
        for key in src.list().result():
            dst.with_transaction(txn)[key] = src[key]
    with caplog.at_level(logging.INFO, logger="ckptmerge.formats.orbax.reader"):
        with OrbaxReader(str(copy)) as r:
            assert r.info("params/w").shape == (3, 4) and r.info("params/b").dtype == "int8"
            assert r.get("params/w").tolist() == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11]]
    assert any("through tensorstore" in m and "manifest kind 1" in m for m in caplog.messages), caplog.messages
