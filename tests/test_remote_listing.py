"""``ckptmerge checkpoints URL``: the table and --json for every kind of remote folder (issue 24, item 9).

The table's last line says which checkpoint is the latest, or why none is: that needs the state
file, which for a URL must be read by URL (it was read as a local path, so every remote folder
where no listed checkpoint is the latest failed). Each folder is written on disk, copied to
``memory://``, and listed both ways: the same rows, the same last line.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
from _cli_util import assert_one_line_error, run

W = np.arange(12, dtype=np.float32).reshape(3, 4)


def _tf_run(d: Path) -> None:
    """A CheckpointManager folder: ckpt-100 and ckpt-200, its state file naming ckpt-200."""
    import tensorflow as tf

    m = tf.Module()
    m.w = tf.Variable(W)
    mgr = tf.train.CheckpointManager(tf.train.Checkpoint(model=m), str(d), max_to_keep=5)
    mgr.save(100)
    mgr.save(200)


def _keras_files(d: Path) -> None:
    import keras

    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3)])
    model.save_weights(str(d / "model-3.weights.h5"))
    model.save_weights(str(d / "model-7.weights.h5"))


def _kind(d: Path, kind: str) -> str:
    """Make the folder ``kind`` in ``d``; return what the table's last line must say."""
    if kind == "keras":
        _keras_files(d)
        return "; no latest recorded (no 'checkpoint' state file naming one)"
    _tf_run(d)
    if kind == "tf-latest":
        return ""
    if kind == "tf-no-state":
        (d / "checkpoint").unlink()
        return "; no latest recorded (no 'checkpoint' state file naming one)"
    if kind == "tf-latest-missing":  # the state file names ckpt-200, whose files are gone
        for f in d.glob("ckpt-200.*"):
            f.unlink()
        return "; the 'checkpoint' state file names 'ckpt-200' as latest, which is missing"
    if kind == "tf-other-machine":  # absolute paths of another machine: looked up by base name
        (d / "checkpoint").write_text('model_checkpoint_path: "/home/other/run/ckpt-100"\n'
                                      'all_model_checkpoint_paths: "/home/other/run/ckpt-100"\n')
        return ""
    raise AssertionError(kind)


KINDS = ["keras", "tf-latest", "tf-no-state", "tf-latest-missing", "tf-other-machine"]


@pytest.fixture
def folders(tmp_path, request):
    import fsspec

    fs = fsspec.filesystem("memory")
    url = f"memory://listing-{os.getpid()}-{tmp_path.name}"
    yield fs, url
    if fs.exists(url):
        fs.rm(url, recursive=True)


def _both(folders, tmp_path: Path, kind: str):
    """``(fs, url, local folder, tail)``: the folder ``kind`` on disk and its copy at the URL."""
    fs, url = folders
    local = tmp_path / "run"
    local.mkdir()
    tail = _kind(local, kind)
    for f in sorted(local.iterdir()):
        fs.pipe(f"{url}/{f.name}", f.read_bytes())
    return fs, url, local, tail


@pytest.mark.parametrize("kind", KINDS)
def test_checkpoints_table_of_a_remote_folder_reads_as_the_local_one(folders, tmp_path, kind):
    fs, url, local, tail = _both(folders, tmp_path, kind)
    rows = {}
    for where in (str(local), url):
        r = run("checkpoints", where)
        assert r.exit_code == 0, r.output
        assert "Traceback" not in r.output
        lines = r.stdout.splitlines()
        assert lines[0].split() == ["LATEST", "STEP", "TIME", "SIZE", "NAME"]
        assert lines[-1].endswith(tail) and lines[-1].startswith("2 checkpoints" if kind != "tf-latest-missing"
                                                                 else "1 checkpoint")
        rows[where] = [(line.split()[0] == "*", line.split()[-1]) for line in lines[1:-1]]
    assert rows[url] == rows[str(local)]  # the same names, the same latest mark
    names = [n for _, n in rows[url]]
    assert names == {"keras": ["model-3.weights.h5", "model-7.weights.h5"],
                     "tf-latest-missing": ["ckpt-100"]}.get(kind, ["ckpt-100", "ckpt-200"])
    latest = [n for mark, n in rows[url] if mark]
    assert latest == {"tf-latest": ["ckpt-200"], "tf-other-machine": ["ckpt-100"]}.get(kind, [])


@pytest.mark.parametrize("kind", KINDS)
def test_checkpoints_json_of_a_remote_folder_names_each_relative_to_it(folders, tmp_path, kind):
    fs, url, local, _ = _both(folders, tmp_path, kind)
    got = {}
    for where in (str(local), url):
        r = run("checkpoints", where, "--json")
        assert r.exit_code == 0, r.output
        got[where] = json.loads(r.stdout)
    remote = got[url]
    assert [(c["name"], c["step"], c["latest"], c["size"]) for c in remote] == \
        [(c["name"], c["step"], c["latest"], c["size"]) for c in got[str(local)]]
    assert all(c["path"] == f"{url}/{c['name']}" for c in remote)


def test_checkpoints_of_a_url_with_a_trailing_slash_names_them_relative_to_it(folders, tmp_path):
    fs, url, local, _ = _both(folders, tmp_path, "tf-no-state")
    rows = json.loads(run("checkpoints", url + "/", "--json").stdout)
    assert [c["name"] for c in rows] == ["ckpt-100", "ckpt-200"]


def test_read_state_file_of_a_url_reads_it_by_url(folders, tmp_path):
    from ckptmerge.sources.resolve import read_state_file

    fs, url, local, _ = _both(folders, tmp_path, "tf-latest")
    for given in (url, url + "/checkpoint"):
        assert read_state_file(given).model_checkpoint_path == f"{url}/ckpt-200"
    fs.rm(f"{url}/checkpoint")
    assert read_state_file(url) is None


def test_checkpoints_of_a_url_with_nothing_below_it_is_a_one_line_error(folders):
    _, url = folders
    assert_one_line_error(run("checkpoints", url + "-nothing"), "is not a directory", url + "-nothing")


def test_checkpoints_of_a_remote_folder_with_a_broken_state_file_is_a_one_line_error(folders, tmp_path):
    fs, url, _, _ = _both(folders, tmp_path, "tf-latest")
    fs.pipe(f"{url}/checkpoint", b"model_checkpoint_path: ")
    assert_one_line_error(run("checkpoints", url), "Cannot parse the checkpoint state file", f"{url}/checkpoint")
