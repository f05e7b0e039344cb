"""Damaged, missing and unsupported checkpoint files: always a clear error from ckptmerge's family.

Checkpoints are written by TF in the test, then truncated, flipped or deleted; a few headers
TensorFlow never writes (big-endian, future versions, Snappy with a bogus size) are built by hand
with tests/_reader_util.py.
"""

from __future__ import annotations

import shutil
import struct
from pathlib import Path

import numpy as np
import pytest

from _corpus import corpus
from _reader_util import (header_proto, random_value, table_bytes, write_float_bundle,
                          write_saver_checkpoint)
from ckptmerge.core.errors import CheckpointFormatError, CheckpointNotFoundError
from ckptmerge.formats import open_checkpoint


@pytest.fixture(scope="module")
def pristine(tmp_path_factory):
    """A small 2-shard TF checkpoint (written once; tests copy it)."""
    rng = np.random.default_rng(3)
    specs = [{"name": "dense/kernel", "dtype": "float32", "device": 0, "value": random_value(rng, "float32", (64, 32))},
             {"name": "dense/bias", "dtype": "float32", "device": 0, "value": random_value(rng, "float32", (32,))},
             {"name": "emb", "dtype": "float32", "device": 1, "partitions": 2, "value": random_value(rng, "float32", (8, 4))},
             {"name": "words", "dtype": "string", "device": 1, "value": random_value(rng, "string", (5,))}]
    folder = tmp_path_factory.mktemp("pristine")
    write_saver_checkpoint(str(folder / "model.ckpt"), specs, sharded=True)
    return folder


@pytest.fixture
def ckpt(pristine, tmp_path):
    """A fresh copy of the pristine checkpoint; returns its prefix as a Path."""
    for f in pristine.iterdir():
        shutil.copy(f, tmp_path / f.name)
    return tmp_path / "model.ckpt"


def _data_file(prefix: Path, shard: int) -> Path:
    return prefix.with_name(f"{prefix.name}.data-{shard:05d}-of-00002")


def _flip(path: Path, offset: int) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 0x40
    path.write_bytes(bytes(data))


def _offset_of(prefix: Path, name: str) -> int:
    with open_checkpoint(str(prefix)) as reader:
        return reader.entries[name].offset


def test_missing_checkpoint_names_the_index_file(tmp_path):
    with pytest.raises(CheckpointNotFoundError) as err:
        open_checkpoint(str(tmp_path / "model.ckpt-5"))
    assert isinstance(err.value, FileNotFoundError)
    assert str(tmp_path / "model.ckpt-5.index") in str(err.value)
    assert err.value.path == str(tmp_path / "model.ckpt-5")


def test_missing_weights_file_is_not_found(tmp_path):
    with pytest.raises(CheckpointNotFoundError) as err:
        open_checkpoint(str(tmp_path / "model.weights.h5"))
    assert str(err.value) == f"Keras weights file '{tmp_path / 'model.weights.h5'}' does not exist."


def test_keras_archive_with_corrupt_weights_is_a_format_error(tmp_path):
    import zipfile

    with zipfile.ZipFile(tmp_path / "m.keras", "w") as z:
        z.writestr("config.json", "{}")
        z.writestr("model.weights.h5", b"\x89HDF\r\n\x1a\n" + b"\x00" * 100)
    with pytest.raises(CheckpointFormatError) as err:
        open_checkpoint(str(tmp_path / "m.keras"))
    assert "Cannot read Keras weights file m.keras" in str(err.value)


def test_directory_instead_of_prefix_is_not_found_with_example(tmp_path):
    with pytest.raises(CheckpointNotFoundError) as err:
        open_checkpoint(str(tmp_path))
    assert "is a directory" in str(err.value) and "model.ckpt-1000" in str(err.value)


def test_index_file_instead_of_prefix_suggests_the_prefix(ckpt):
    with pytest.raises(CheckpointFormatError) as err:
        open_checkpoint(str(ckpt) + ".index")
    assert f"without '.index': '{ckpt}'" in str(err.value)


def test_data_file_instead_of_prefix_is_refused(ckpt):
    with pytest.raises(CheckpointFormatError) as err:
        open_checkpoint(str(_data_file(ckpt, 0)))
    assert "not a checkpoint ckptmerge can read" in str(err.value) and "'.data-'" in str(err.value)


def test_truncated_index_is_a_format_error(ckpt):
    index = ckpt.with_name("model.ckpt.index")
    index.write_bytes(index.read_bytes()[:-20])
    with pytest.raises(CheckpointFormatError) as err:
        open_checkpoint(str(ckpt))
    assert "Corrupt checkpoint index model.ckpt.index" in str(err.value)
    assert "magic" in str(err.value)
    assert err.value.path == str(index)


def test_index_cut_before_its_blocks_is_a_format_error(ckpt):
    index = ckpt.with_name("model.ckpt.index")
    data = index.read_bytes()
    index.write_bytes(data[:20] + data[-48:])  # a valid footer pointing past the end
    with pytest.raises(CheckpointFormatError) as err:
        open_checkpoint(str(ckpt))
    assert "runs past the end of the table" in str(err.value)


def test_wrong_magic_is_a_format_error(ckpt):
    index = ckpt.with_name("model.ckpt.index")
    _flip(index, len(index.read_bytes()) - 1)
    with pytest.raises(CheckpointFormatError) as err:
        open_checkpoint(str(ckpt))
    assert "bad table magic number" in str(err.value) and "model.ckpt.index" in str(err.value)


def test_flipped_byte_in_index_block_fails_the_block_checksum(ckpt):
    index = ckpt.with_name("model.ckpt.index")
    _flip(index, 10)
    with pytest.raises(CheckpointFormatError) as err:
        open_checkpoint(str(ckpt))
    assert "block checksum mismatch in data block 0" in str(err.value)
    assert "model.ckpt.index" in str(err.value)


def test_truncated_data_file_is_reported_at_open(ckpt):
    data = _data_file(ckpt, 0)
    data.write_bytes(data.read_bytes()[:100])
    with pytest.raises(CheckpointFormatError) as err:
        open_checkpoint(str(ckpt))
    msg = str(err.value)
    assert "model.ckpt.data-00000-of-00002 is too short" in msg and "dense/" in msg
    assert err.value.path == str(data)


def test_missing_shard_names_the_file_and_a_tensor(ckpt):
    _data_file(ckpt, 1).unlink()
    with pytest.raises(CheckpointFormatError) as err:
        open_checkpoint(str(ckpt))
    msg = str(err.value)
    assert "model.ckpt.data-00001-of-00002 (shard 2 of 2) is missing" in msg
    assert "Copy all 'model.ckpt.data-*' files" in msg


def test_flipped_byte_in_data_is_a_checksum_mismatch_naming_tensor_and_file(ckpt):
    _flip(_data_file(ckpt, 0), _offset_of(ckpt, "dense/kernel") + 5)
    with open_checkpoint(str(ckpt)) as reader:
        reader.get("dense/bias")  # other tensors still read
        for read in (lambda: reader.get("dense/kernel"), lambda: reader.read_many(["dense/bias", "dense/kernel"])):
            with pytest.raises(CheckpointFormatError) as err:
                read()
            msg = str(err.value)
            assert msg.startswith("checksum mismatch for tensor 'dense/kernel' in model.ckpt.data-00000-of-00002 (expected 0x")
            assert "read it anyway with verify=False" in msg
            assert err.value.key == "dense/kernel"


def test_flipped_byte_in_a_slice_names_the_partitioned_tensor(ckpt):
    with open_checkpoint(str(ckpt)) as reader:
        part = next(e for k, e in reader.entries.items() if k.startswith("\x00"))
    _flip(_data_file(ckpt, part.shard_id), part.offset)
    with open_checkpoint(str(ckpt)) as reader:
        with pytest.raises(CheckpointFormatError) as err:
            reader.get("emb")
    assert "checksum mismatch for tensor 'emb (slice [" in str(err.value)


def test_flipped_byte_in_string_tensor_is_a_checksum_mismatch(ckpt):
    with open_checkpoint(str(ckpt)) as reader:
        e = reader.entries["words"]
    _flip(_data_file(ckpt, e.shard_id), e.offset + e.size - 1)
    with open_checkpoint(str(ckpt)) as reader:
        with pytest.raises(CheckpointFormatError) as err:
            reader.get("words")
    assert "checksum mismatch for tensor 'words'" in str(err.value)


def test_verify_false_reads_despite_data_corruption(ckpt):
    with open_checkpoint(str(ckpt)) as reader:
        before = reader.get("dense/kernel")
    _flip(_data_file(ckpt, 0), _offset_of(ckpt, "dense/kernel") + 5)
    with open_checkpoint(str(ckpt), verify=False) as reader:
        after = reader.get("dense/kernel")
        assert reader.read_many(["dense/kernel"])["dense/kernel"].tobytes() == after.tobytes()
    assert (before != after).sum() == 1


def test_data_file_truncated_after_open_is_a_format_error(ckpt):
    with open_checkpoint(str(ckpt)) as reader:
        data = _data_file(ckpt, 0)
        data.write_bytes(b"")
        with pytest.raises(CheckpointFormatError) as err:
            reader.get("dense/kernel")
    assert "ended early while reading tensor 'dense/kernel'" in str(err.value)


def test_big_endian_checkpoint_is_refused(tmp_path):
    prefix = write_float_bundle(str(tmp_path / "be"), {"w": np.ones(2, np.float32)},
                                header=header_proto(endianness=1))
    with pytest.raises(CheckpointFormatError) as err:
        open_checkpoint(prefix)
    assert "big-endian" in str(err.value) and "be.index" in str(err.value)


def test_checkpoint_from_a_future_bundle_version_is_refused(tmp_path):
    prefix = write_float_bundle(str(tmp_path / "new"), {"w": np.ones(2, np.float32)},
                                header=header_proto(min_consumer=7))
    with pytest.raises(CheckpointFormatError) as err:
        open_checkpoint(prefix)
    assert "needs a reader of bundle version >= 7" in str(err.value) and "newer TensorFlow" in str(err.value)


def test_hand_made_snappy_bundle_reads(tmp_path):
    value = np.arange(12, dtype=np.int32).reshape(3, 4)
    prefix = write_float_bundle(str(tmp_path / "s"), {"x": value, "y": value[0]}, snappy=True)
    with open_checkpoint(prefix) as reader:
        np.testing.assert_array_equal(reader.get("x"), value)


def test_snappy_block_claiming_a_huge_size_is_refused(tmp_path):
    # varint 2**40 as uncompressed length, then garbage; checksum valid
    from _reader_util import _trailer, block_bytes, MAGIC
    import ckptmerge.formats.tf.protowire as pw

    bogus = pw.encode_varint(1 << 40) + b"\x00" * 8
    out = bogus + _trailer(bogus, 1)
    meta = block_bytes([])
    meta_handle = pw.encode_varint(len(out)) + pw.encode_varint(len(meta))
    out += meta + _trailer(meta)
    index = block_bytes([(b"\xff", pw.encode_varint(0) + pw.encode_varint(len(bogus)))])
    index_handle = pw.encode_varint(len(out)) + pw.encode_varint(len(index))
    out += index + _trailer(index)
    footer = meta_handle + index_handle
    (tmp_path / "z.index").write_bytes(out + footer + b"\x00" * (40 - len(footer)) + MAGIC)
    with pytest.raises(CheckpointFormatError) as err:
        open_checkpoint(str(tmp_path / "z"))
    assert "corrupt Snappy header" in str(err.value)


def test_index_without_header_entry_is_refused(tmp_path):
    (tmp_path / "h.index").write_bytes(table_bytes([(b"a", b"")]))
    with pytest.raises(CheckpointFormatError) as err:
        open_checkpoint(str(tmp_path / "h"))
    assert "no bundle header entry" in str(err.value)


def test_entry_size_disagreeing_with_shape_is_a_format_error(tmp_path):
    from _reader_util import entry_proto

    (tmp_path / "b.data-00000-of-00001").write_bytes(b"\x00" * 64)
    (tmp_path / "b.index").write_bytes(table_bytes([(b"", header_proto()), (b"w", entry_proto(1, (4, 4), 0, 60, 0))]))
    with open_checkpoint(str(tmp_path / "b")) as reader:
        assert reader.info("w").shape == (4, 4)
        with pytest.raises(CheckpointFormatError) as err:
            reader.get("w")
    assert "index says 60 bytes but shape (4, 4) of float32 needs 64" in str(err.value)


def test_entry_pointing_past_its_shard_count_is_a_format_error(tmp_path):
    from _reader_util import entry_proto

    (tmp_path / "c.index").write_bytes(table_bytes([(b"", header_proto()), (b"w", entry_proto(1, (1,), 0, 4, 0, shard=3))]))
    with pytest.raises(CheckpointFormatError) as err:
        open_checkpoint(str(tmp_path / "c"))
    assert "tensor 'w' is in shard 3 but the header says there are 1 shards" in str(err.value)


def test_non_hdf5_weights_file_is_a_format_error(tmp_path):
    path = tmp_path / "model.weights.h5"
    path.write_bytes(b"this is not hdf5" * 10)
    with pytest.raises(CheckpointFormatError) as err:
        open_checkpoint(str(path))
    assert "is not an HDF5 file" in str(err.value) and "model.weights.h5" in str(err.value)


def test_truncated_hdf5_weights_file_is_a_format_error(tmp_path):
    path = tmp_path / "model.weights.h5"
    path.write_bytes((corpus() / "keras3-weights-h5-churn" / "model.weights.h5").read_bytes()[:3000])
    with pytest.raises(CheckpointFormatError) as err:
        open_checkpoint(str(path))
    assert "Cannot read Keras weights file model.weights.h5" in str(err.value)
    assert err.value.path == str(path)


def test_unrecognised_file_is_a_format_error(tmp_path):
    path = tmp_path / "notes.txt"
    path.write_text("hello")
    with pytest.raises(CheckpointFormatError) as err:
        open_checkpoint(str(path))
    assert "neither a TF checkpoint prefix" in str(err.value)


def test_header_with_bad_varint_is_a_format_error(tmp_path):
    (tmp_path / "v.index").write_bytes(table_bytes([(b"", b"\x08\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff")]))
    with pytest.raises(CheckpointFormatError) as err:
        open_checkpoint(str(tmp_path / "v"))
    assert "bad bundle header: varint longer than 10 bytes" in str(err.value)


def test_masked_crc_layout_matches_leveldb():
    from ckptmerge.formats.tf.bundle import crc32c, mask_crc

    # LevelDB's crc32c_test: masked crc of "foo" differs from the raw and round-trips
    raw = crc32c(b"foo")
    assert mask_crc(raw) == ((((raw >> 15) | (raw << 17)) & 0xFFFFFFFF) + 0xA282EAD8) & 0xFFFFFFFF
    assert struct.pack("<I", mask_crc(raw)) != struct.pack("<I", raw)


def test_a_shape_too_large_for_numpy_is_a_format_error(tmp_path):
    """Regression: an empty tensor of shape (0, 2**62) passed every size check, then numpy
    refused the array with a bare ValueError (a traceback from 'ckptmerge show')."""
    from _reader_util import entry_proto
    from ckptmerge.formats.tf.bundle import mask_crc

    (tmp_path / "m.index").write_bytes(table_bytes([(b"", header_proto()),
                                                    (b"w", entry_proto(1, (0, 2**62), 0, 0, mask_crc(0)))]))
    (tmp_path / "m.data-00000-of-00001").write_bytes(b"")
    with open_checkpoint(str(tmp_path / "m")) as reader:
        with pytest.raises(CheckpointFormatError, match=r"shape \(0, 4611686018427387904\) is too large"):
            reader.get("w")
        with pytest.raises(CheckpointFormatError, match="too large"):
            reader.read_many(["w"])
