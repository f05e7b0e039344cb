"""Replacing a checkpoint in object storage never leaves the prefix without one (issue 24, items 5, 6).

``merge --force`` to a URL used to delete the old index before uploading: a failed upload, a kill
or Ctrl-C left no checkpoint at the prefix. Now the new data objects take names the old index
does not use, the index PUT switches readers from old to new, and only then are the old objects
removed. These tests sweep every write a merge makes to ``memory://`` (in this process: a read
after each one, a failure at each one, Ctrl-C at each one); tests/test_remote_kill.py does the
same against S3 on localhost with SIGKILL and SIGINT of a real ``ckptmerge`` process.

An output URL that is a source or the template is refused however it is spelt, before its lock
is taken.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import signal
import time
from pathlib import Path
from typing import Callable, List, Optional, Tuple

import numpy as np
import pytest
from _remote_util import write_run

import ckptmerge as cm
from ckptmerge.core.errors import (
    CheckpointFormatError,
    CheckpointWriteError,
    OutputLockedError,
)

W = np.arange(12, dtype=np.float32).reshape(3, 4)
BIG = np.random.default_rng(1).standard_normal((64, 256)).astype(np.float32)


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> Path:
    """A CheckpointManager folder: step 100 (w = W) and step 200 (w = 2W)."""
    d = tmp_path_factory.mktemp("run")
    write_run(d, W, BIG)
    return d


@pytest.fixture
def mem(run_dir, tmp_path):
    """``(fs, source URL, output URL)``: the run copied to memory://, and an output beside it."""
    import fsspec

    fs = fsspec.filesystem("memory")
    root = f"memory://ow-{os.getpid()}-{tmp_path.name}"
    for f in sorted(run_dir.iterdir()):
        fs.pipe(f"{root}/run/{f.name}", f.read_bytes())
    yield fs, f"{root}/run", f"{root}/out/model"
    fs.rm(root, recursive=True)


def _names(fs, url: str) -> List[str]:
    parent = url.rsplit("/", 1)[0]
    return sorted(p.rsplit("/", 1)[-1] for p in fs.ls(parent, detail=False)) if fs.exists(parent) else []


def _reads_as(url: str) -> Optional[float]:
    """What the prefix reads as: the factor of w (1 old, 2 new), None for no checkpoint; a mix fails."""
    try:
        values = cm.load(url)
    except cm.CheckpointNotFoundError:
        return None
    np.testing.assert_array_equal(values["big"], BIG)
    factor = float(values["w"][0, 1])
    np.testing.assert_array_equal(values["w"], W * factor)
    return factor


class _Writes:
    """Every write of memory:// (put_file, pipe_file, rm_file) in order, with ``action(i, name)``
    called before (``when="before"``) or after each one."""

    def __init__(self, monkeypatch, action: Optional[Callable[[int, str], None]] = None, when: str = "after"):
        from fsspec.implementations.memory import MemoryFileSystem

        self.done: List[Tuple[str, str]] = []
        writes = self

        def wrap(method):
            real = getattr(MemoryFileSystem, method)

            @functools.wraps(real)  # the same signature: create_exclusive looks at pipe_file's
            def call(fs, path, *a, **kw):
                name = (method, str(path).rsplit("/", 1)[-1])
                i = len(writes.done)
                writes.done.append(name)
                if action is not None and when == "before":
                    action(i, name)
                out = real(fs, path, *a, **kw)
                if action is not None and when == "after":
                    action(i, name)
                return out

            monkeypatch.setattr(MemoryFileSystem, method, call)

        for method in ("put_file", "pipe_file", "rm_file"):
            wrap(method)


def _old(fs, src, out):
    cm.merge([cm.Source(src, step=100)], out)
    return _names(fs, out)


def test_overwrite_reads_as_old_or_new_after_every_write_and_deletes_only_after_the_switch(mem, monkeypatch):
    fs, src, out = mem
    before = _old(fs, src, out)
    assert before == ["model.data-00000-of-00001", "model.index"]
    seen = []
    writes = _Writes(monkeypatch, lambda i, name: seen.append(_reads_as(out)))
    cm.merge([cm.Source(src, step=200)], out, overwrite=True)
    assert writes.done == [("pipe_file", "model.lock"),
                           ("put_file", "model.data-00000-of-00002"), ("put_file", "model.data-00001-of-00002"),
                           ("put_file", "model.index"),  # the switch
                           ("rm_file", "model.data-00000-of-00001"),  # the old data, only now
                           ("rm_file", "model.lock")]
    assert seen == [1.0, 1.0, 1.0, 2.0, 2.0, 2.0]
    assert _names(fs, out) == ["model.data-00000-of-00002", "model.data-00001-of-00002", "model.index"]


def test_the_padded_shard_is_empty_the_next_overwrite_returns_to_one_shard_and_tf_reads_both(mem, tmp_path):
    import tensorflow as tf

    fs, src, out = mem
    _old(fs, src, out)
    cm.merge([cm.Source(src, step=200)], out, overwrite=True)
    assert fs.info(out + ".data-00001-of-00002")["size"] == 0
    for step, factor, shards in ((200, 2, 2), (100, 1, 1)):
        if step == 100:
            cm.merge([cm.Source(src, step=100)], out, overwrite=True)
        local = tmp_path / f"copy-{step}"
        local.mkdir()
        names = _names(fs, out)
        assert len([n for n in names if ".data-" in n]) == shards and "model.lock" not in names
        for n in names:
            (local / n).write_bytes(fs.cat_file(f"{out.rsplit('/', 1)[0]}/{n}"))
        reader = tf.train.load_checkpoint(str(local / "model"))
        np.testing.assert_array_equal(reader.get_tensor("model/w/.ATTRIBUTES/VARIABLE_VALUE"), W * factor)


def _deny(target: Tuple[str, str]):
    """An action raising a 403-like PermissionError at the write ``target`` (before or after it lands)."""
    def action(i, name):
        if name == target:
            raise PermissionError(13, "Forbidden (injected)")
    return action


_FORCE_WRITES = [("pipe_file", "model.lock"), ("put_file", "model.data-00000-of-00002"),
                 ("put_file", "model.data-00001-of-00002"), ("put_file", "model.index"),
                 ("rm_file", "model.data-00000-of-00001"), ("rm_file", "model.lock")]


@pytest.mark.parametrize("when", ["before", "after"])
@pytest.mark.parametrize("target", _FORCE_WRITES, ids=lambda t: f"{t[0]}-{t[1]}")
def test_a_write_refused_at_any_step_leaves_old_or_new_and_nothing_else(mem, monkeypatch, caplog, target, when):
    fs, src, out = mem
    _old(fs, src, out)
    _Writes(monkeypatch, _deny(target), when)
    caplog.set_level(logging.WARNING)
    step = _FORCE_WRITES.index(target)
    published = step > 3 or (step == 3 and when == "after")  # the index landed
    try:
        cm.merge([cm.Source(src, step=200)], out, overwrite=True)
        failed = None
    except (CheckpointWriteError, CheckpointFormatError) as e:
        failed = e
    monkeypatch.undo()
    names = _names(fs, out)
    if published:  # the new checkpoint is complete; a refused cleanup is a warning naming what is left
        assert failed is None
        assert _reads_as(out) == 2.0
        if target[1] == "model.lock" and when == "before":
            assert "model.lock" in names and "could not remove the lock" in caplog.text
        elif target[1] == "model.data-00000-of-00001" and when == "before":
            assert "model.data-00000-of-00001" in names and "could not remove 1 object(s)" in caplog.text
        else:
            assert names == ["model.data-00000-of-00002", "model.data-00001-of-00002", "model.index"]
    else:  # nothing but the old checkpoint, as it was, and no lock
        assert failed is not None and out in str(failed)
        assert _reads_as(out) == 1.0
        assert names == ["model.data-00000-of-00001", "model.index"]


def test_an_index_put_that_landed_but_reported_an_error_is_published(mem, monkeypatch):
    fs, src, out = mem
    _old(fs, src, out)
    _Writes(monkeypatch, lambda i, name: (_ for _ in ()).throw(ConnectionAbortedError("answer lost"))
            if name == ("put_file", "model.index") else None, "after")
    report = cm.merge([cm.Source(src, step=200)], out, overwrite=True)
    assert report.output == out
    monkeypatch.undo()
    assert _reads_as(out) == 2.0
    assert _names(fs, out) == ["model.data-00000-of-00002", "model.data-00001-of-00002", "model.index"]


def test_an_index_put_whose_outcome_cannot_be_read_back_leaves_everything_and_says_so(mem, monkeypatch):
    from fsspec.implementations.memory import MemoryFileSystem

    fs, src, out = mem
    _old(fs, src, out)
    real_cat = MemoryFileSystem.cat_file
    broken = {"on": False}

    def action(i, name):
        if name == ("put_file", "model.index"):
            broken["on"] = True  # the store stops answering right after the PUT was sent
            raise ConnectionAbortedError("connection lost")

    def cat(self, path, *a, **kw):
        if broken["on"] and str(path).endswith("model.index"):
            raise ConnectionAbortedError("connection lost")
        return real_cat(self, path, *a, **kw)

    monkeypatch.setattr(MemoryFileSystem, "cat_file", cat)
    _Writes(monkeypatch, action, "before")
    with pytest.raises(CheckpointWriteError, match="did not tell whether it landed") as info:
        cm.merge([cm.Source(src, step=200)], out, overwrite=True)
    assert out in str(info.value)
    monkeypatch.undo()
    assert _reads_as(out) == 1.0  # here it had not landed: the old checkpoint, and the new data beside it
    assert "model.lock" not in _names(fs, out)
    cm.merge([cm.Source(src, step=200)], out, overwrite=True)  # as the message says: merge again
    assert _reads_as(out) == 2.0
    assert _names(fs, out) == ["model.data-00000-of-00003", "model.data-00001-of-00003",  # the leftovers are
                               "model.data-00002-of-00003", "model.index"]                  # gone


@pytest.mark.parametrize("step", range(len(_FORCE_WRITES)))
def test_ctrl_c_at_any_write_leaves_old_or_new_no_orphan_and_no_lock(mem, monkeypatch, step):
    fs, src, out = mem
    _old(fs, src, out)
    _Writes(monkeypatch, lambda i, name: os.kill(os.getpid(), signal.SIGINT) if i == step else None, "before")
    with pytest.raises(KeyboardInterrupt):
        cm.merge([cm.Source(src, step=200)], out, overwrite=True)
    monkeypatch.undo()
    factor = _reads_as(out)
    names = _names(fs, out)
    assert "model.lock" not in names
    if step >= 3:  # Ctrl-C during the index PUT or after: the switch is done and finished cleanly
        assert factor == 2.0
        assert names == ["model.data-00000-of-00002", "model.data-00001-of-00002", "model.index"]
    else:
        assert factor == 1.0
        assert names == ["model.data-00000-of-00001", "model.index"]


def test_ctrl_c_while_merging_before_any_upload_removes_the_lock(mem):
    fs, src, out = mem
    _old(fs, src, out)

    def interrupt(done, total):
        if done:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        cm.merge([cm.Source(src, step=200)], out, overwrite=True, progress=interrupt)
    assert _names(fs, out) == ["model.data-00000-of-00001", "model.index"]


def test_data_objects_left_by_a_killed_merge_are_named_and_removed_by_force(mem):
    fs, src, out = mem
    fs.pipe(out + ".data-00000-of-00003", b"left over")  # no index names it
    with pytest.raises(cm.CkptMergeError, match=r"has data objects but no index \('.*model.data-00000-of-00003'\)"):
        cm.merge([cm.Source(src, step=100)], out)
    cm.merge([cm.Source(src, step=100)], out, overwrite=True)
    assert _names(fs, out) == ["model.data-00000-of-00001", "model.index"]
    assert _reads_as(out) == 1.0
    # beside a checkpoint, of its own shard count and another: the new one avoids both, then both go
    fs.pipe(out + ".data-00000-of-00002", b"left over")
    cm.merge([cm.Source(src, step=200)], out, overwrite=True)
    assert _names(fs, out) == ["model.data-00000-of-00003", "model.data-00001-of-00003",
                               "model.data-00002-of-00003", "model.index"]
    assert _reads_as(out) == 2.0


def test_a_safetensors_output_is_replaced_by_one_upload_or_left_as_it_was(mem, monkeypatch):
    fs, src, out = mem
    st = out + ".safetensors"
    cm.merge([cm.Source(src, step=100)], st)
    _Writes(monkeypatch, _deny(("put_file", "model.safetensors")), "before")
    with pytest.raises(CheckpointWriteError, match="is whole: the old one"):
        cm.merge([cm.Source(src, step=200)], st, overwrite=True)
    monkeypatch.undo()
    np.testing.assert_array_equal(cm.load(st)["w"], W)
    writes = _Writes(monkeypatch)
    cm.merge([cm.Source(src, step=200)], st, overwrite=True)
    assert writes.done == [("pipe_file", "model.safetensors.lock"), ("put_file", "model.safetensors"),
                           ("rm_file", "model.safetensors.lock")]
    np.testing.assert_array_equal(cm.load(st)["w"], W * 2)


# -- the lock of a merge that was killed --------------------------------------------------------


def _dead_pid() -> int:
    import subprocess
    import sys

    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def test_the_lock_of_a_dead_process_on_this_machine_is_removed_by_the_next_merge(mem, caplog):
    from ckptmerge.formats.io.output_prefix import machine_tag

    fs, src, out = mem
    pid = _dead_pid()
    fs.pipe(out + ".lock", json.dumps({"host": "here", "pid": pid, "started": time.time() - 60, "token": "t",
                                       "output": out, "machine": machine_tag()}).encode())
    caplog.set_level(logging.WARNING)
    cm.merge([cm.Source(src, step=100)], out)
    assert f"of process {pid} on this machine, which is no longer running" in caplog.text
    assert _names(fs, out) == ["model.data-00000-of-00001", "model.index"]


@pytest.mark.parametrize("holder", ["alive", "other-machine", "no-machine", "not-an-int"])
def test_any_other_lock_is_never_broken(mem, holder):
    from ckptmerge.formats.io.output_prefix import machine_tag

    fs, src, out = mem
    body = {"host": "h", "pid": _dead_pid(), "started": time.time(), "token": "t", "output": out,
            "machine": machine_tag()}
    if holder == "alive":
        body["pid"] = os.getppid()
    elif holder == "other-machine":
        body["machine"] = "another-boot/4026531836"
    elif holder == "no-machine":
        del body["machine"]
    else:
        body["pid"] = str(body["pid"])
    fs.pipe(out + ".lock", json.dumps(body).encode())
    with pytest.raises(OutputLockedError, match="delete the object"):
        cm.merge([cm.Source(src, step=100)], out)
    assert _names(fs, out) == ["model.lock"]


# -- an output that is an input -------------------------------------------------------------------


@pytest.mark.parametrize("spelling", ["{run}/ckpt-200", "{run}/ckpt-200/", "{run}//ckpt-200", "MEMORY://{path}/ckpt-200"])
def test_an_output_url_that_is_a_source_is_refused_before_the_lock(mem, spelling):
    fs, src, out = mem
    target = spelling.format(run=src, path=src[len("memory://"):])
    fs.pipe(target.rstrip("/").replace("MEMORY://", "memory://").replace("//ckpt", "/ckpt") + ".lock",
            b'{"host": "someone"}')  # held: the input check must come first
    before = {n: fs.cat_file(f"{src}/{n}") for n in _names(fs, src + "/x")}
    for sources, kwargs in (([cm.Source(src)], {}),  # the directory resolves to its latest, ckpt-200
                            ([cm.Source(src + "/ckpt-200.index")], {}),
                            ([cm.Source(src, step=100)], {"template": src + "/ckpt-200"})):
        with pytest.raises(cm.ArgumentError, match="is the checkpoint of") as info:
            cm.merge(sources, target, overwrite=True, **kwargs)
        assert "even with overwrite=True" in str(info.value)
    assert {n: fs.cat_file(f"{src}/{n}") for n in _names(fs, src + "/x") if n in before} == before


def test_an_output_url_that_is_an_input_of_a_combination_is_refused(mem):
    fs, src, out = mem
    before = fs.cat_file(f"{src}/ckpt-100.index")
    for spelling in (f"{src}/ckpt-100", f"{src}//ckpt-100/"):
        with pytest.raises(cm.ArgumentError, match="is the checkpoint of input"):
            cm.merge([cm.combine([f"{src}/ckpt-100", f"{src}/ckpt-200"])], spelling, overwrite=True)
    assert fs.cat_file(f"{src}/ckpt-100.index") == before and not fs.exists(f"{src}/ckpt-100.lock")


def test_an_output_url_that_is_a_safetensors_source_is_refused(mem):
    fs, src, out = mem
    st = out + ".safetensors"
    cm.merge([cm.Source(src, step=100)], st)
    with pytest.raises(cm.ArgumentError, match="is the checkpoint of"):
        cm.merge([cm.Source(st)], st, overwrite=True)
    with pytest.raises(cm.ArgumentError, match="is the checkpoint of the template"):
        cm.merge([cm.Source(src, step=200)], st.replace("memory://", "memory:///"), overwrite=True, template=st)
    np.testing.assert_array_equal(cm.load(st)["w"], W)


@pytest.mark.parametrize("given", ["{st}", "{st}/model.safetensors.index.json"])
def test_an_output_url_that_is_a_shard_of_a_source_is_refused(mem, given):
    from safetensors.numpy import save

    fs, src, out = mem
    st = out.rsplit("/", 1)[0] + "/st"
    fs.pipe(f"{st}/model-00001-of-00002.safetensors", save({"a": W}))
    fs.pipe(f"{st}/model-00002-of-00002.safetensors", save({"b": W}))
    fs.pipe(f"{st}/model.safetensors.index.json", json.dumps({"weight_map": {
        "a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors"}}).encode())
    before = fs.cat_file(f"{st}/model-00002-of-00002.safetensors")
    with pytest.raises(cm.ArgumentError, match="is the checkpoint of source"):
        cm.merge([cm.Source(given.format(st=st))], f"{st}/model-00002-of-00002.safetensors", overwrite=True)
    assert fs.cat_file(f"{st}/model-00002-of-00002.safetensors") == before
    assert not fs.exists(f"{st}/model-00002-of-00002.safetensors.lock")


def test_cli_merge_to_a_url_that_is_its_source_is_a_one_line_error(mem, tmp_path):
    from _cli_util import assert_one_line_error, run, write_config

    fs, src, out = mem
    config = write_config(tmp_path / "m.yaml", f"sources:\n  - path: {src}\n")
    r = run("merge", config, "-o", src + "/ckpt-200", "--force")
    assert_one_line_error(r, f"The output '{src}/ckpt-200' is the checkpoint of", "even with overwrite=True")
    assert not fs.exists(src + "/ckpt-200.lock")


def test_a_listing_that_fails_stops_the_merge_before_it_writes(mem, monkeypatch):
    # names chosen without knowing what is there could be the live checkpoint's own
    from fsspec.implementations.memory import MemoryFileSystem

    fs, src, out = mem
    _old(fs, src, out)
    real_ls = MemoryFileSystem.ls

    def ls(self, path, *a, **kw):
        if str(path).rstrip("/").endswith("/out"):
            raise PermissionError(13, "Forbidden (injected)")
        return real_ls(self, path, *a, **kw)

    monkeypatch.setattr(MemoryFileSystem, "ls", ls)
    writes = _Writes(monkeypatch)
    with pytest.raises(CheckpointFormatError, match="Access denied"):
        cm.merge([cm.Source(src, step=200)], out, overwrite=True)
    assert writes.done == [("pipe_file", "model.lock"), ("rm_file", "model.lock")]
    monkeypatch.undo()
    assert _reads_as(out) == 1.0 and _names(fs, out) == ["model.data-00000-of-00001", "model.index"]
