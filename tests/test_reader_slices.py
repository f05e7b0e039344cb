"""Partitioned (sliced) tensors: exact tiling, sizes checked before allocating, streaming reads.

A partitioned tensor is one index entry listing its slices plus one entry per slice. The
hand-made bundles here (tests/_reader_util.py ``write_partitioned_bundle``) are laid out as
TensorFlow lays them out, which the first test checks against TensorFlow itself; the others
then break the slice metadata the way a damaged or hostile file could.
"""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import ckptmerge as cm
from _cli_util import assert_one_line_error, run
from _reader_util import (entry_proto, partitioned_entry_proto, random_value, tf, traced_peak, write_bundle,
                          write_partitioned_bundle, write_saver_checkpoint)
from ckptmerge.core.errors import ArgumentError, CheckpointFormatError
from ckptmerge.formats import open_checkpoint
from ckptmerge.formats.tf.bundle import crc32c, encode_tensor_name_slice, mask_crc
from ckptmerge.formats.dtypes import numpy_to_tf
from ckptmerge.formats.tf.regions import c_order_blocks, contiguous_span, first_overlap, intersect, volume

V = np.arange(12, dtype=np.float32).reshape(4, 3)
F32 = numpy_to_tf(np.dtype(np.float32))


def _rows(start: int, stop: int):
    """A slice of whole rows [start, stop) of V."""
    return [(start, stop - start), (0, -1)], V[start:stop]


def test_hand_made_partitioned_bundle_reads_like_tensorflow(tmp_path):
    by_rows = write_partitioned_bundle(str(tmp_path / "rows"), "w", (4, 3), [_rows(0, 1), _rows(1, 4)])
    by_cols = write_partitioned_bundle(str(tmp_path / "cols"), "w", (4, 3), [
        ([(0, -1), (0, 2)], V[:, :2]), ([(0, -1), (2, 1)], V[:, 2:])])
    for prefix in (by_rows, by_cols):
        np.testing.assert_array_equal(tf().train.load_checkpoint(prefix).get_tensor("w"), V)
        np.testing.assert_array_equal(cm.load(prefix)["w"], V)


# --------------------------------------------------------------------------------------------
# Slices must tile the tensor exactly
# --------------------------------------------------------------------------------------------
@pytest.fixture
def twice(tmp_path):
    """Rows 0-1 and 1-2: 12 elements in all, as many as the tensor has, but row 1 twice and
    row 3 never."""
    return write_partitioned_bundle(str(tmp_path / "twice"), "w", (4, 3), [_rows(0, 2), _rows(1, 3)])


_OVERLAP = "slices [(0, 2), (0, -1)] and [(1, 2), (0, -1)] of tensor 'w' overlap"


def test_slices_covering_a_region_twice_are_refused_by_load(twice):
    with pytest.raises(CheckpointFormatError) as err:
        cm.load(twice)
    assert _OVERLAP in str(err.value)
    assert err.value.key == "w"
    assert err.value.path == twice + ".index"


def test_slices_covering_a_region_twice_are_refused_by_every_read_path(twice):
    with open_checkpoint(twice) as reader:
        for read in (lambda: reader.get("w"), lambda: reader.read_many(["w"]),
                     lambda: reader.iter_chunks("w")):
            with pytest.raises(CheckpointFormatError, match="overlap"):
                read()


def test_show_of_slices_covering_a_region_twice_exits_2(twice):
    assert_one_line_error(run("show", twice, "w"), _OVERLAP, "re-copy it")


def test_merge_refuses_slices_covering_a_region_twice_and_writes_nothing(twice, tmp_path):
    out = tmp_path / "out" / "merged"
    with pytest.raises(CheckpointFormatError, match="overlap"):
        cm.merge([twice], str(out))
    assert not list(tmp_path.glob("out/merged*"))


def test_one_slice_listed_twice_is_an_overlap(tmp_path):
    prefix = write_partitioned_bundle(str(tmp_path / "dup"), "w", (4, 3), [_rows(0, 2), _rows(0, 2)])
    with pytest.raises(CheckpointFormatError, match=r"\[\(0, 2\), \(0, -1\)\] and \[\(0, 2\), \(0, -1\)\]"):
        cm.load(prefix)


def test_slices_leaving_a_gap_are_refused(tmp_path):
    prefix = write_partitioned_bundle(str(tmp_path / "gap"), "w", (4, 3), [_rows(0, 1), _rows(2, 4)])
    with pytest.raises(CheckpointFormatError, match="the slices of tensor 'w' cover 9 of its 12 elements"):
        cm.load(prefix)


# --------------------------------------------------------------------------------------------
# Declared sizes are checked against the files before anything is allocated
# --------------------------------------------------------------------------------------------
@pytest.fixture
def huge(tmp_path):
    """A float32 tensor of shape (2**36,) (256 GiB) in one slice whose entry declares that shape
    but holds 4 bytes."""
    shape = (2 ** 36,)
    raw = np.float32(1).tobytes()
    return write_bundle(str(tmp_path / "huge"), [
        (b"w", partitioned_entry_proto(F32, shape, [[(0, -1)]])),
        (encode_tensor_name_slice("w", [(0, -1)]), entry_proto(F32, shape, 0, len(raw), mask_crc(crc32c(raw))))],
        raw)


def test_huge_declared_slice_is_refused_before_allocating(huge):
    def load():
        with pytest.raises(CheckpointFormatError,
                           match=r"index says 4 bytes but shape \(68719476736,\) of float32 needs 274877906944"):
            cm.load(huge)

    assert traced_peak(load)[1] < 1 << 20


@pytest.mark.parametrize("command", [["show", "{p}", "w"], ["diff", "{p}", "{p}", "--values"],
                                     ["ls", "{p}", "--stats"]])
def test_huge_declared_slice_exits_2_in_the_cli(huge, command):
    args = [a.format(p=huge) for a in command]
    _, peak = traced_peak(lambda: assert_one_line_error(run(*args), "Corrupt tensor 'w (slice [(0, -1)])'",
                                                        "needs 274877906944"))
    assert peak < 1 << 20


def test_slices_sharing_their_bytes_cannot_claim_more_than_the_data_file(tmp_path):
    """Three slices of 1,000 floats all pointing at the same 4,000 bytes: each fits in the
    file, together they claim three times what it holds."""
    raw = np.ones(1000, np.float32).tobytes()
    slices = [[(i, 1), (0, -1)] for i in range(3)]
    part = entry_proto(F32, (1, 1000), 0, len(raw), mask_crc(crc32c(raw)))
    prefix = write_bundle(str(tmp_path / "shared"), [(b"w", partitioned_entry_proto(F32, (3, 1000), slices))]
                          + [(encode_tensor_name_slice("w", s), part) for s in slices], raw)
    with pytest.raises(CheckpointFormatError,
                       match="the slices of tensor 'w' claim 12000 bytes of data file "
                             "shared.data-00000-of-00001, which has 4000"):
        cm.load(prefix)


# --------------------------------------------------------------------------------------------
# iter_chunks: the tensor in bounded pieces, in C order
# --------------------------------------------------------------------------------------------
def _tiling(draw, shape):
    """Random slices tiling ``shape``: cut every dimension at random places."""
    cuts = []
    for d in shape:
        inner = sorted(draw(st.sets(st.integers(1, d - 1), max_size=3))) if d > 1 else []
        cuts.append(list(zip([0] + inner, inner + [d])))
    return list(itertools.product(*cuts))


@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
@given(data=st.data(), dtype=st.sampled_from(["float32", "float64", "int8", "bool", "bfloat16", "complex64"]),
       shape=st.lists(st.integers(1, 5), min_size=1, max_size=3).map(tuple), max_elements=st.integers(1, 40))
def test_iter_chunks_of_a_tiled_tensor_concatenate_to_the_tensor(tmp_path_factory, data, dtype, shape, max_elements):
    value = random_value(np.random.default_rng(data.draw(st.integers(0, 2 ** 32 - 1))), dtype, shape)
    boxes = _tiling(data.draw, shape)
    folder = tmp_path_factory.mktemp("tiled")
    prefix = write_partitioned_bundle(
        str(folder / "m"), "w", shape,
        [([(a, b - a) for a, b in box], value[tuple(slice(a, b) for a, b in box)]) for box in boxes])
    with open_checkpoint(prefix) as reader:
        chunks = list(reader.iter_chunks("w", max_elements))
        assert all(0 < c.size <= max_elements and c.ndim == 1 for c in chunks)
        got = np.concatenate(chunks)
        assert got.dtype == value.dtype
        assert got.tobytes() == value.reshape(-1).tobytes()
        assert reader.get("w").tobytes() == value.tobytes()


def test_iter_chunks_of_a_tensorflow_partitioned_variable(tmp_path):
    value = random_value(np.random.default_rng(1), "float32", (10, 3))
    prefix = write_saver_checkpoint(str(tmp_path / "m"), [
        {"name": "emb", "dtype": "float32", "value": value, "partitions": 3}])
    with open_checkpoint(prefix) as reader:
        assert np.concatenate(list(reader.iter_chunks("emb", 4))).tobytes() == value.tobytes()


def test_get_reads_slices_of_whole_rows_straight_into_the_result(tmp_path):
    """Peak memory of reading a tensor partitioned by rows is the tensor, not tensor + a slice."""
    value = np.random.default_rng(2).standard_normal((1024, 512)).astype(np.float32)  # 2 MiB
    prefix = write_partitioned_bundle(str(tmp_path / "m"), "w", value.shape, [
        ([(0, 512), (0, -1)], value[:512]), ([(512, 512), (0, -1)], value[512:])])
    got = []
    with open_checkpoint(prefix) as reader:
        peak = traced_peak(lambda: got.append(reader.get("w")))[1]
    assert got[0].tobytes() == value.tobytes()
    assert peak < value.nbytes * 1.25, peak


def test_iter_chunks_checks_the_checksum_of_each_slice(tmp_path):
    prefix = write_partitioned_bundle(str(tmp_path / "m"), "w", (4, 3), [_rows(0, 2), _rows(2, 4)])
    data = Path(prefix + ".data-00000-of-00001")
    raw = bytearray(data.read_bytes())
    raw[-1] ^= 0x40  # last slice, last byte
    data.write_bytes(bytes(raw))
    with open_checkpoint(prefix) as reader:
        pieces = reader.iter_chunks("w", 2)
        with pytest.raises(CheckpointFormatError, match=r"checksum mismatch for tensor 'w \(slice \[\(2, 2\), \(0, -1\)\]\)'"):
            list(pieces)
    with open_checkpoint(prefix, verify=False) as reader:
        assert np.concatenate(list(reader.iter_chunks("w", 2)))[:-1].tobytes() == V.reshape(-1)[:-1].tobytes()


def test_iter_chunks_rejects_a_bad_piece_size(tmp_path):
    prefix = write_partitioned_bundle(str(tmp_path / "m"), "w", (4, 3), [_rows(0, 4)])
    with open_checkpoint(prefix) as reader:
        with pytest.raises(ArgumentError, match="Received: max_elements=0"):
            reader.iter_chunks("w", 0)
        with pytest.raises(TypeError, match="Received: max_elements=2.0"):
            reader.iter_chunks("w", 2.0)


# --------------------------------------------------------------------------------------------
# regions: the shape arithmetic, pure
# --------------------------------------------------------------------------------------------
_BOXES = st.lists(st.lists(st.tuples(st.integers(0, 6), st.integers(0, 3)), min_size=2, max_size=2)
                  .map(lambda dims: tuple((s, s + n) for s, n in dims)), max_size=6)


@settings(max_examples=300, deadline=None)
@given(boxes=_BOXES)
def test_first_overlap_agrees_with_comparing_every_pair(boxes):
    pairs = [(i, j) for i, j in itertools.combinations(range(len(boxes)), 2)
             if intersect(boxes[i], boxes[j]) is not None]
    found = first_overlap(boxes)
    assert (found is None) == (not pairs)
    if found is not None:
        assert found in pairs


def test_two_slices_of_a_scalar_overlap():
    assert first_overlap([(), ()]) == (0, 1)


@settings(max_examples=200, deadline=None)
@given(shape=st.lists(st.integers(0, 5), max_size=4).map(tuple), max_elements=st.integers(1, 50))
def test_c_order_blocks_walk_the_tensor_in_order_in_bounded_contiguous_blocks(shape, max_elements):
    flat = np.arange(int(np.prod(shape)), dtype=np.int64).reshape(shape)
    blocks = list(c_order_blocks(shape, max_elements))
    pieces = [flat[tuple(slice(a, b) for a, b in box)].reshape(-1) for box in blocks]
    assert all(0 < volume(box) <= max_elements for box in blocks)
    assert np.concatenate(pieces).tolist() == flat.reshape(-1).tolist() if pieces else flat.size == 0
    for box, piece in zip(blocks, pieces):
        assert contiguous_span(shape, box) == (int(piece[0]), piece.size)


def test_contiguous_span_refuses_a_box_that_is_not_contiguous():
    with pytest.raises(ValueError, match="not contiguous"):
        contiguous_span((4, 3), ((0, 2), (0, 2)))
