"""One set of rules for every local path, however it is named: a ``file://`` URL is the local path
it names, and a file that a folder scan or a safetensors index leads to must be a regular file
inside that folder (no symbolic link out of it, no FIFO, no device).

The exception that real users need: the Hugging Face hub cache, whose snapshot files are links
into the same cached repository's ``blobs`` folder.
"""

from __future__ import annotations

import json
import os
import threading
import time

import numpy as np
import pytest

import ckptmerge as cm
from ckptmerge.core.args import local_path
from ckptmerge.core.errors import CheckpointFormatError
from ckptmerge.formats import open_checkpoint
from ckptmerge.formats.io.localfile import NotARegularFileError, link_problem, open_regular
from ckptmerge.formats.safetensors.writer import SafetensorsWriter

from _cli_util import assert_one_line_error, run, run_subprocess

W = np.arange(6, dtype=np.float32).reshape(2, 3)


def _write(path, values):
    path.parent.mkdir(parents=True, exist_ok=True)
    with SafetensorsWriter(str(path), [(n, "float32", v.shape) for n, v in values.items()], overwrite=True) as w:
        for n, v in values.items():
            w.add(n, v)
    return path


def _index(folder, weight_map):
    path = folder / "model.safetensors.index.json"
    path.write_text(json.dumps({"metadata": {}, "weight_map": weight_map}), encoding="utf-8")
    return path


class _Unblocker:
    """If a test regresses to a blocking open of a FIFO, open its other end after a while so the
    test fails instead of hanging the suite."""

    def __init__(self, fifo, after=20.0):
        self.fifo, self.after, self.done = str(fifo), after, threading.Event()

    def __enter__(self):
        def unblock():
            if not self.done.wait(self.after):
                fd = os.open(self.fifo, os.O_WRONLY | os.O_NONBLOCK)
                os.close(fd)

        self.start = time.monotonic()
        threading.Thread(target=unblock, daemon=True).start()
        return self

    def __exit__(self, *exc):
        self.done.set()
        assert time.monotonic() - self.start < self.after, "the FIFO was opened in a blocking way"


# -- file:// is a local path --------------------------------------------------------------------


@pytest.mark.parametrize("url, path", [("file:///data/run", "/data/run"), ("FILE:///x", "/x"),
                                       ("file://localhost/data/run", "/data/run"), ("local:///y", "/y"),
                                       ("file://rel/ckpt", "rel/ckpt"), ("file://", "."),
                                       ("s3://b/run", "s3://b/run"), ("runs/A", "runs/A"),
                                       ("file:///a%20b?x=1", "/a%20b?x=1")])
def test_local_path_of_a_file_url(url, path):
    assert local_path(url) == path


def test_a_file_url_reads_as_the_local_path_it_names(tmp_path):
    f = _write(tmp_path / "m.safetensors", {"w": W})
    for given in (f"file://{f}", f"file://localhost{f}"):
        np.testing.assert_array_equal(cm.load(given)["w"], W)
        assert [v.name for v in cm.list_variables(given)] == ["w"]
        with open_checkpoint(given) as r:
            assert r.files == [str(f)]
    r = run("ls", f"file://{f}")
    assert r.exit_code == 0 and f"Checkpoint: {f} " in r.stdout


def test_a_file_url_folder_refuses_a_link_out_of_it_as_a_local_folder_does(tmp_path, caplog):
    secret = _write(tmp_path / "private" / "secret.safetensors", {"w": W})
    folder = tmp_path / "run"
    folder.mkdir()
    (folder / "model.safetensors").symlink_to(secret)
    for given in (str(folder), f"file://{folder}"):
        caplog.clear()
        r = run("ls", given)
        assert r.exit_code == 2 and "No .safetensors file in directory" in r.stderr, r.output
        assert "skipping model.safetensors, which is a symbolic link to" in caplog.text
        assert "outside the folder" in caplog.text


def test_a_file_url_to_a_fifo_is_refused_without_waiting(tmp_path):
    fifo = tmp_path / "model.safetensors"
    os.mkfifo(fifo)
    r = run_subprocess(["ls", f"file://{fifo}"], tmp_path, timeout=60)
    assert r["code"] == 2 and "is a FIFO (named pipe), not a regular file" in r["stderr"], r["stderr"]
    assert "Traceback" not in r["stderr"]


def test_a_file_url_to_a_device_is_refused(tmp_path):
    r = run("ls", "file:///dev/zero")
    assert r.exit_code == 2 and "'/dev/zero' is a character device" in r.stderr, r.output


def test_a_file_url_directory_lists_its_checkpoints_as_the_folder_does(tmp_path, tf):
    m = tf.Module()
    m.w = tf.Variable(W, name="w")
    mgr = tf.train.CheckpointManager(tf.train.Checkpoint(m=m), str(tmp_path / "run"), max_to_keep=3)
    mgr.save(1)
    mgr.save(2)
    assert [c.path for c in cm.checkpoints(f"file://{tmp_path}/run")] == [c.path for c in cm.checkpoints(str(tmp_path / "run"))]
    np.testing.assert_array_equal(cm.load(f"file://{tmp_path}/run", ["m/w/.ATTRIBUTES/VARIABLE_VALUE"])[
        "m/w/.ATTRIBUTES/VARIABLE_VALUE"], W)


def test_a_file_url_in_a_config_is_a_local_path(tmp_path, monkeypatch):
    """A config's ``file://`` path gets the local rules too: its variables expand without being
    allowed (nothing is sent anywhere), it must exist, and check contacts no host for it."""
    f = _write(tmp_path / "data" / "m.safetensors", {"w": W})
    monkeypatch.setenv("DATA_DIR", str(f.parent))
    monkeypatch.delenv("CKPTMERGE_ALLOW_ENV", raising=False)
    cfg = tmp_path / "warm.yaml"
    cfg.write_text("sources:\n  - path: file://${DATA_DIR}/m.safetensors\n    name: a\n"
                   "  - path: 'file://localhost%s'\n    name: b\n" % f, encoding="utf-8")
    loaded = cm.load_config(str(cfg))
    assert [s.path for s in loaded.sources] == [str(f), str(f)] and loaded.urls == () and loaded.hosts == []
    r = run("check", cfg)
    assert r.exit_code == 0 and "Contacts no remote host: every path is local." in r.stdout, r.output
    cfg.write_text("sources:\n  - path: file://${DATA_DIR}/gone.safetensors\n", encoding="utf-8")
    r = run("check", cfg)
    assert r.exit_code == 2 and "checkpoint 'file://${DATA_DIR}/gone.safetensors' not found" in r.stderr, r.output
    assert str(f.parent) not in r.stderr  # as written: not the variable's value


# -- a safetensors index follows the folder's rules ---------------------------------------------


def test_an_index_naming_a_shard_that_links_out_of_the_folder_is_refused(tmp_path):
    secret = _write(tmp_path / "elsewhere" / "private.safetensors", {"b": W})
    folder = tmp_path / "model"
    _write(folder / "model-00001-of-00002.safetensors", {"a": W})
    (folder / "model-00002-of-00002.safetensors").symlink_to(secret)
    index = _index(folder, {"a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors"})
    for given in (index, folder, f"file://{index}"):
        with pytest.raises(CheckpointFormatError) as info:
            cm.list_variables(str(given))
        text = str(info.value)
        assert "shard model-00002-of-00002.safetensors named by its index is a symbolic link to" in text
        assert "outside the folder" in text and str(secret) in text
    assert_one_line_error(run("ls", index), "model-00002-of-00002.safetensors", "outside the folder")


@pytest.mark.parametrize("kind", ["fifo", "directory", "dangling"])
def test_an_index_naming_a_shard_that_is_not_a_regular_file_is_refused(tmp_path, kind):
    folder = tmp_path / "model"
    _write(folder / "model-00001-of-00002.safetensors", {"a": W})
    shard = folder / "model-00002-of-00002.safetensors"
    if kind == "fifo":
        os.mkfifo(shard)
    elif kind == "directory":
        shard.mkdir()
    else:
        shard.symlink_to(folder / "gone.safetensors")
    index = _index(folder, {"a": "model-00001-of-00002.safetensors", "b": shard.name})
    with _Unblocker(shard) if kind == "fifo" else _nothing():
        with pytest.raises(CheckpointFormatError, match={"fifo": "is a FIFO", "directory": "is a directory",
                                                          "dangling": "which does not exist"}[kind]):
            cm.list_variables(str(index))


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


@pytest.mark.parametrize("kind", ["outside", "fifo"])
def test_a_keras_weights_json_naming_a_shard_that_links_out_or_is_no_file_is_refused(tmp_path, kind):
    """A Keras 3 sharded set (``model.weights.json``) leads to its shards as an index does."""
    folder = tmp_path / "run"
    folder.mkdir()
    shard = folder / "model_00000.weights.h5"
    if kind == "outside":
        secret = tmp_path / "private" / "secret.h5"
        secret.parent.mkdir()
        secret.write_bytes(b"not for you")
        shard.symlink_to(secret)
    else:
        os.mkfifo(shard)
    index = folder / "model.weights.json"
    index.write_text(json.dumps({"weight_map": {"layers/dense": "model_00000.weights.h5"}}), encoding="utf-8")
    with _Unblocker(shard), pytest.raises(CheckpointFormatError, match="the shard model_00000.weights.h5 it names") as e:
        cm.list_variables(str(index))
    assert ("outside the folder" if kind == "outside" else "is a FIFO (named pipe)") in str(e.value)
    r = run("ls", index)
    assert r.exit_code == 2 and "Traceback" not in r.output and "model_00000.weights.h5" in r.stderr, r.output


def test_an_index_shard_linking_inside_its_folder_is_read(tmp_path):
    folder = tmp_path / "model"
    _write(folder / "real" / "shard-a.safetensors", {"a": W})
    (folder / "model-00001-of-00001.safetensors").symlink_to(folder / "real" / "shard-a.safetensors")
    index = _index(folder, {"a": "model-00001-of-00001.safetensors"})
    np.testing.assert_array_equal(cm.load(str(index))["a"], W)


def test_the_hugging_face_cache_layout_is_read_through_its_links(tmp_path):
    repo = tmp_path / "hub" / "models--org--tiny"
    blobs, snap = repo / "blobs", repo / "snapshots" / "0123abcd"
    blobs.mkdir(parents=True)
    snap.mkdir(parents=True)
    _write(blobs / "sha-a", {"a": W})
    _write(blobs / "sha-b", {"b": W * 2})
    for name, blob in (("model-00001-of-00002.safetensors", "sha-a"), ("model-00002-of-00002.safetensors", "sha-b")):
        (snap / name).symlink_to(os.path.join("..", "..", "blobs", blob))
    (blobs / "sha-index").write_text(json.dumps({"weight_map": {"a": "model-00001-of-00002.safetensors",
                                                                "b": "model-00002-of-00002.safetensors"}}))
    (snap / "model.safetensors.index.json").symlink_to(os.path.join("..", "..", "blobs", "sha-index"))
    for given in (snap, snap / "model.safetensors.index.json"):
        values = cm.load(str(given))
        np.testing.assert_array_equal(values["a"], W)
        np.testing.assert_array_equal(values["b"], W * 2)
    single = tmp_path / "hub" / "models--org--single"
    (single / "blobs").mkdir(parents=True)
    (single / "snapshots" / "r1").mkdir(parents=True)
    _write(single / "blobs" / "sha", {"w": W})
    (single / "snapshots" / "r1" / "model.safetensors").symlink_to("../../blobs/sha")
    np.testing.assert_array_equal(cm.load(str(single / "snapshots" / "r1"))["w"], W)


def test_a_cache_lookalike_may_not_link_anywhere_else(tmp_path):
    snap = tmp_path / "models--x" / "snapshots" / "r1"
    (tmp_path / "models--x" / "blobs").mkdir(parents=True)
    snap.mkdir(parents=True)
    _write(tmp_path / "elsewhere.safetensors", {"w": W})
    (snap / "model.safetensors").symlink_to(tmp_path / "elsewhere.safetensors")
    assert "outside the folder" in link_problem(str(snap), str(snap / "model.safetensors"))


def test_a_folder_scan_skips_an_index_that_links_out_of_the_folder(tmp_path, caplog):
    (tmp_path / "outside").mkdir()
    outside_index = _index(tmp_path / "outside", {"w": "model.safetensors"})
    folder = tmp_path / "model"
    _write(folder / "model.safetensors", {"w": W})
    (folder / "model.safetensors.index.json").symlink_to(outside_index)
    r = run("ls", folder)
    assert r.exit_code == 0 and "skipping model.safetensors.index.json" in caplog.text, r.output


# -- npy folders: links inside the folder read, others skipped -----------------------------------


def test_an_npy_folder_reads_links_inside_it_and_skips_links_out_of_it(tmp_path, caplog):
    folder = tmp_path / "weights"
    (folder / "sub").mkdir(parents=True)
    np.save(folder / "sub" / "w.npy", W)
    np.save(tmp_path / "secret.npy", W * 9)
    (folder / "alias.npy").symlink_to(folder / "sub" / "w.npy")
    (folder / "leak.npy").symlink_to(tmp_path / "secret.npy")
    r = run("ls", folder)
    assert r.exit_code == 0, r.output
    assert "alias" in r.stdout and "sub/w" in r.stdout and "leak" not in r.stdout
    assert "skipping symbolic link leak.npy" in caplog.text


# -- the one open that every local data file goes through ---------------------------------------


def test_open_regular_refuses_a_fifo_at_once_and_a_device(tmp_path):
    fifo = tmp_path / "f"
    os.mkfifo(fifo)
    with _Unblocker(fifo):
        with pytest.raises(NotARegularFileError, match="is a FIFO"):
            open_regular(str(fifo))
    with pytest.raises(NotARegularFileError, match="is a character device"):
        open_regular("/dev/zero")
    with pytest.raises(NotARegularFileError, match="is a directory"):
        open_regular(str(tmp_path))
    f = tmp_path / "ok"
    f.write_bytes(b"abc")
    fd = open_regular(str(f))
    try:
        assert os.read(fd, 3) == b"abc" and os.get_blocking(fd)
    finally:
        os.close(fd)


def test_a_npz_or_keras_path_that_is_a_fifo_is_refused_by_the_reader_itself(tmp_path):
    from ckptmerge.formats.io import storage

    fifo = tmp_path / "w.npz"
    os.mkfifo(fifo)
    with _Unblocker(fifo):
        with pytest.raises(OSError, match="is a FIFO"):
            storage.open_binary(str(fifo))


@pytest.mark.parametrize("kind", ["fifo", "directory", "device"])
def test_a_tf_data_shard_that_is_not_a_regular_file_is_named_for_what_it_is(tmp_path, tf, kind):
    m = tf.Module()
    m.w = tf.Variable(W, name="w")
    prefix = tf.train.Checkpoint(m=m).write(str(tmp_path / "ckpt-1"))
    data = tmp_path / "ckpt-1.data-00000-of-00001"
    data.unlink()
    if kind == "fifo":
        os.mkfifo(data)
    elif kind == "directory":
        data.mkdir()
    else:
        data.symlink_to("/dev/zero")
    for given in (prefix, f"file://{prefix}"):
        r = run("ls", given, "--stats")
        assert r.exit_code == 2 and "Traceback" not in r.output, r.output
        assert "ckpt-1.data-00000-of-00001 (shard 1 of 1) is a" in r.stderr and "not a regular file" in r.stderr, r.stderr
