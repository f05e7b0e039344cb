"""The safetensors writer: files the reference reader reads back exactly, published atomically."""

from __future__ import annotations

import os

import ml_dtypes
import numpy as np
import pytest
import safetensors.numpy as st_numpy

from ckptmerge.core.errors import ArgumentError, OutputExistsError
from ckptmerge.formats.safetensors.reader import SafetensorsReader
from ckptmerge.formats.safetensors.writer import SafetensorsWriter

VALUES = {
    "w": np.arange(12, dtype=np.float32).reshape(3, 4),
    "half": np.arange(5, dtype=np.float16),
    "bf": np.arange(7, dtype=np.float32).astype(ml_dtypes.bfloat16),
    "f64_fortran": np.asfortranarray(np.random.default_rng(0).standard_normal((3, 5))),
    "big_endian": np.arange(4, dtype=">i4"),
    "empty": np.zeros((0, 2), np.int64),
    "flag": np.array(True),
}


def _specs(values):
    return [(k, np.dtype(v.dtype).newbyteorder("=").name if v.dtype.byteorder == ">" else str(v.dtype), v.shape)
            for k, v in values.items()]


def _write(path, values, order=None, **kw):
    with SafetensorsWriter(path, _specs(values), **kw) as w:
        for k in order or values:
            w.add(k, values[k])


def test_reference_reader_reads_every_tensor_back(tmp_path):
    path = tmp_path / "out.safetensors"
    _write(path, VALUES, order=list(reversed(VALUES)), metadata={"source": "test"})
    with SafetensorsReader(str(path)) as r:
        assert r.metadata == {"source": "test"}
        for k, v in VALUES.items():
            got = r.get(k)
            np.testing.assert_array_equal(got, v)
    ref = st_numpy.load_file(str(path))  # the reference implementation accepts the file
    np.testing.assert_array_equal(ref["w"], VALUES["w"])
    np.testing.assert_array_equal(ref["f64_fortran"], VALUES["f64_fortran"])


def test_data_starts_on_a_page_boundary(tmp_path):
    path = tmp_path / "out.safetensors"
    _write(path, VALUES)
    with SafetensorsReader(str(path)) as r:
        assert r._data_start[0] % 4096 == 0


def test_tensors_start_aligned_to_their_element_size(tmp_path):
    path = tmp_path / "out.safetensors"
    _write(path, VALUES)
    with SafetensorsReader(str(path)) as r:
        for name, e in r._entries.items():
            assert (r._data_start[0] + e.begin) % VALUES[name].dtype.itemsize == 0, name


def test_an_aborted_write_leaves_nothing(tmp_path):
    path = tmp_path / "out.safetensors"
    with pytest.raises(RuntimeError):
        with SafetensorsWriter(path, _specs(VALUES)) as w:
            w.add("w", VALUES["w"])
            raise RuntimeError("killed")
    assert os.listdir(tmp_path) == []


def test_a_tensor_never_written_publishes_nothing(tmp_path):
    path = tmp_path / "out.safetensors"
    w = SafetensorsWriter(path, _specs(VALUES))
    w.add("w", VALUES["w"])
    with pytest.raises(ArgumentError, match="never written"):
        w.finish()
    assert os.listdir(tmp_path) == []


def test_an_existing_output_is_kept_without_overwrite(tmp_path):
    path = tmp_path / "out.safetensors"
    path.write_bytes(b"keep me")
    with pytest.raises(OutputExistsError):
        SafetensorsWriter(path, _specs(VALUES))
    assert path.read_bytes() == b"keep me"


def test_an_output_that_appears_while_writing_is_not_replaced(tmp_path):
    path = tmp_path / "out.safetensors"
    w = SafetensorsWriter(path, _specs({"w": VALUES["w"]}))
    w.add("w", VALUES["w"])
    path.write_bytes(b"the other writer's")
    with pytest.raises(OutputExistsError, match="appeared"):
        w.finish()
    assert path.read_bytes() == b"the other writer's"
    assert sorted(os.listdir(tmp_path)) == ["out.safetensors"]


def test_overwrite_replaces_in_one_rename(tmp_path):
    path = tmp_path / "out.safetensors"
    path.write_bytes(b"old")
    _write(path, {"w": VALUES["w"]}, overwrite=True)
    with SafetensorsReader(str(path)) as r:
        np.testing.assert_array_equal(r.get("w"), VALUES["w"])


@pytest.mark.parametrize("bad,match", [
    (lambda w: w.add("nope", np.zeros(1, np.float32)), "not declared"),
    (lambda w: w.add("w", np.zeros((4, 3), np.float32)), "declared as"),
    (lambda w: w.add_raw("w", 1, (3, 4), [b"\0" * 8]), "held 8 of its 48"),
])
def test_writes_that_contradict_the_declaration_are_refused(tmp_path, bad, match):
    w = SafetensorsWriter(tmp_path / "o.safetensors", _specs({"w": VALUES["w"]}))
    with pytest.raises(ArgumentError, match=match):
        bad(w)
    w.abort()


def test_string_tensors_cannot_be_declared(tmp_path):
    with pytest.raises(ArgumentError, match="cannot store"):
        SafetensorsWriter(tmp_path / "o.safetensors", [("vocab", "string", (3,))])


# -- merge: any sources -> safetensors, and back -----------------------------------------------


@pytest.fixture
def tf1_checkpoint(tmp_path):
    from conftest import save_tf1

    rng = np.random.default_rng(7)
    values = {"enc/kernel": rng.standard_normal((6, 4)).astype(np.float32),
              "enc/bias": rng.standard_normal(4).astype(np.float16),
              "emb": rng.standard_normal((5, 3)).astype(np.float64),
              "steps": np.arange(3, dtype=np.int64),
              "mask": np.array([True, False])}
    return save_tf1(tmp_path / "src" / "model", values), values


def test_tf_checkpoint_to_safetensors_to_tf_checkpoint_is_bit_exact(tmp_path, tf1_checkpoint):
    import tensorflow as tf

    import ckptmerge as cm

    prefix, values = tf1_checkpoint
    st_path = tmp_path / "out" / "model.safetensors"
    report = cm.merge([cm.Source(prefix)], str(st_path))
    assert report.bytes_written == os.path.getsize(st_path)
    back = tmp_path / "back" / "model"
    cm.merge([cm.Source(str(st_path))], str(back))
    original, roundtrip = tf.train.load_checkpoint(prefix), tf.train.load_checkpoint(str(back))
    for name, value in values.items():
        a, b = np.asarray(original.get_tensor(name)), np.asarray(roundtrip.get_tensor(name))
        assert a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes(), name


def test_safetensors_output_metadata_records_sources_and_plan(tmp_path, tf1_checkpoint):
    import json

    import ckptmerge as cm

    prefix, _ = tf1_checkpoint
    st_path = tmp_path / "m.safetensors"
    cm.merge([cm.Source(prefix, map={"enc/": "encoder/"}, name="base")], str(st_path))
    with SafetensorsReader(str(st_path)) as r:
        assert r.names() == ["encoder/bias", "encoder/kernel"]
        sources = json.loads(r.metadata["ckptmerge.sources"])
        plan = json.loads(r.metadata["ckptmerge.plan"])
    assert [s["label"] for s in sources] == ["base"]
    assert plan == {"encoder/bias": "base:enc/bias", "encoder/kernel": "base:enc/kernel"}


def test_string_tensors_cannot_go_to_safetensors_and_nothing_is_written(tmp_path):
    import ckptmerge as cm

    out = tmp_path / "o.safetensors"
    with pytest.raises(ArgumentError, match="'vocab' \\(string\\)"):
        cm.merge([{"vocab": np.array([b"a", b"b"], dtype=object), "w": np.ones(2, np.float32)}], str(out))
    assert not out.exists()


def test_cli_merge_writes_safetensors_by_suffix_or_format(tmp_path, tf1_checkpoint):
    from _cli_util import assert_one_line_error, run

    prefix, values = tf1_checkpoint
    config = tmp_path / "c.yaml"
    config.write_text(f"sources:\n  - path: {prefix}\n")
    res = run("merge", config, "-o", tmp_path / "a.safetensors", "-q")
    assert res.exit_code == 0, res.output
    res = run("merge", config, "-o", tmp_path / "b.bin", "--format", "safetensors", "-q")
    assert res.exit_code == 0, res.output
    for f in ("a.safetensors", "b.bin"):
        with SafetensorsReader(str(tmp_path / f)) as r:
            np.testing.assert_array_equal(r.get("enc/kernel"), values["enc/kernel"])
    assert_one_line_error(run("merge", config, "-o", tmp_path / "a.safetensors"), "already exists", "--force")
    res = run("merge", config, "-o", tmp_path / "a.safetensors", "--update-state")
    assert res.exit_code == 2 and "update_state" in res.stderr
