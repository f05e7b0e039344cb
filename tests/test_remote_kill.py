"""``ckptmerge merge --force`` to S3, killed or interrupted at every write (issue 24, item 5).

A real ``python -m ckptmerge merge`` replaces a checkpoint at ``s3://ckpts/kill/model`` on a moto
server behind a proxy (tests/_remote_util.py). The proxy counts the merge's writes to that prefix
(the lock, the data objects, the index, the state file, the deletes) and, at the k-th, sends the
process SIGKILL (before the write reaches the store, or after it landed but before the process
hears the answer) or SIGINT (Ctrl-C). SIGKILL sweeps every write. After each kill the prefix must read as
exactly the old or exactly the new checkpoint; the next merge on this machine must succeed
without anyone deleting a lock by hand and leave exactly the new checkpoint's objects (no
orphan). After Ctrl-C the process must exit 130 without a traceback, having removed its lock and
every object it wrote (or, past the index, the old ones), and its temporary folder.
"""

from __future__ import annotations

import glob
import os
import signal
import tempfile
import threading
from pathlib import Path

import numpy as np
import pytest
from _forkserver import ForkServer
from _remote_util import start_s3, write_run

import ckptmerge as cm

REPO = Path(__file__).resolve().parents[1]
W = np.arange(12, dtype=np.float32).reshape(3, 4)
BIG = np.random.default_rng(2).standard_normal((64, 256)).astype(np.float32)
OUT = "s3://ckpts/kill/model"
WRITES = ("PUT", "POST", "DELETE")


@pytest.fixture(scope="module", autouse=True)
def private_temp(tmp_path_factory):
    """A temporary folder of this module's own, for its merges and the ones they start: another
    test's remote merge (the suite runs in parallel) removes the temporary folders of merges that
    are gone, and would take the killed merge's before this module looks for it."""
    folder = str(tmp_path_factory.mktemp("tmp"))
    old_env, old_dir = os.environ.get("TMPDIR"), tempfile.tempdir
    os.environ["TMPDIR"], tempfile.tempdir = folder, folder
    yield folder
    tempfile.tempdir = old_dir
    if old_env is None:
        os.environ.pop("TMPDIR", None)
    else:
        os.environ["TMPDIR"] = old_env


@pytest.fixture(scope="module")
def s3(tmp_path_factory):
    d = tmp_path_factory.mktemp("run")
    write_run(d, W, BIG)
    yield from start_s3(d)


# What `python -m ckptmerge merge` imports to merge to S3, imported once in the fork server.
PRELOAD = ["ckptmerge.cli", "ckptmerge.merging.remote", "ckptmerge.merging.local", "s3fs", "aiobotocore.session"]


@pytest.fixture(scope="module")
def server(s3, private_temp):
    """Each merge is a real process of its own (killed by real signals), forked from a warm
    interpreter (tests/_forkserver.py), so the sweep pays Python's and ckptmerge's start-up once."""
    with ForkServer(PRELOAD, env=dict(os.environ, PYTHONPATH=str(REPO), **s3["env"])) as forks:
        yield forks


def _objects(fs):
    fs.invalidate_cache()
    return sorted(p.rsplit("/", 1)[-1] for p in fs.ls("ckpts/kill", detail=False)) if fs.exists("ckpts/kill") else []


def _reads_as(url):
    values = cm.load(url)
    np.testing.assert_array_equal(values["big"], BIG)
    factor = float(values["w"][0, 1])
    np.testing.assert_array_equal(values["w"], W * factor)
    return factor


def _fresh_old(s3):
    """The old checkpoint (step 100, w = W) at OUT, alone, with a state file naming it (merged once,
    then copied in the store for each test)."""
    fs = s3["fs"]
    if not fs.exists("ckpts/old/checkpoint"):
        cm.merge([cm.Source(s3["url"], step=100)], "s3://ckpts/old/model", update_state=True)
    if fs.exists("ckpts/kill"):
        fs.rm("ckpts/kill", recursive=True)
    for name in ("checkpoint", "model.data-00000-of-00001", "model.index"):
        fs.copy(f"ckpts/old/{name}", f"ckpts/kill/{name}")
    return _objects(fs)


def _config(tmp_path, s3):
    config = tmp_path / "m.yaml"
    config.write_text(f"sources:\n  - path: {s3['url']}\n    step: 200\n")
    return config


def _start(server, config):
    return server.start(["-m", "ckptmerge", "merge", config, "-o", OUT, "--force", "--update-state", "-q"])


def _arm(s3, k, what, child):
    """Make the proxy act at the k-th write to the prefix: ``kill-before``, ``kill-after`` or ``sigint``."""
    proxy, count, fired = s3["proxy"], [0], threading.Event()

    def is_write(method, path):
        return method in WRITES and "/ckpts/kill/" in path

    def hook(method, path):
        if not is_write(method, path) or fired.is_set():
            return None
        count[0] += 1
        if count[0] != k:
            return None
        fired.set()
        if what == "kill-before":
            child.kill()
            child.wait(30)
            return "drop"
        if what == "sigint":
            child.send_signal(signal.SIGINT)
        return None

    def after(method, path, status):
        if what == "kill-after" and fired.is_set() and child.poll() is None and is_write(method, path):
            child.kill()
            child.wait(30)
            return "drop"
        return None

    proxy.hook, proxy.after = hook, (after if what == "kill-after" else None)
    return fired


def _disarm(s3):
    s3["proxy"].hook = s3["proxy"].after = None


def _temp_folders(pid):
    return glob.glob(os.path.join(tempfile.gettempdir(), f"ckptmerge-upload-*-{pid}-*"))


def _writes_of_a_whole_merge(s3, server, tmp_path):
    """The writes one undisturbed merge makes, in order (method, object)."""
    _fresh_old(s3)
    log = s3["proxy"].log
    start = len(log)
    child = _start(server, _config(tmp_path, s3))
    out, err = child.communicate(timeout=120)
    assert child.returncode == 0, err
    return [(m, p.split("?")[0].rsplit("/", 1)[-1]) for m, p, _ in log[start:] if m in WRITES and "/ckpts/kill/" in p]


@pytest.fixture(scope="module")
def writes(s3, server, tmp_path_factory):
    return _writes_of_a_whole_merge(s3, server, tmp_path_factory.mktemp("count"))


def test_an_undisturbed_overwrite_writes_data_then_the_index_then_deletes_the_old_data(writes):
    assert writes == [("PUT", "model.lock"), ("PUT", "model.data-00000-of-00002"), ("PUT", "model.data-00001-of-00002"),
                      ("PUT", "model.index"), ("DELETE", "model.data-00000-of-00001"), ("PUT", "checkpoint"),
                      ("DELETE", "model.lock")]


def _assert_one_checkpoint(names):
    """Exactly one checkpoint's objects: the state file, the index, and every data shard of one
    shard count (which count depends on the names the killed merge left): no orphan, no lock."""
    data = [n for n in names if n.startswith("model.data-")]
    count = int(data[0].rsplit("-of-", 1)[1]) if data else 0
    assert names == sorted(["checkpoint", "model.index"] + [f"model.data-{i:05d}-of-{count:05d}" for i in range(count)])


NEW = ["checkpoint", "model.data-00000-of-00002", "model.data-00001-of-00002", "model.index"]
OLD = ["checkpoint", "model.data-00000-of-00001", "model.index"]


# Killed before each write reaches the store, and after the last one (the lock's DELETE) landed.
# A kill after write k landed leaves the store as a kill before write k + 1 does (the killed
# process hears nothing either way), so one kill after a write in the middle (the index PUT,
# whose answer the process never hears) stands for the others.
KILLS = [(k, "kill-before") for k in range(1, 8)] + [(4, "kill-after"), (7, "kill-after")]


@pytest.mark.slow
@pytest.mark.parametrize("k, what", KILLS)
def test_sigkill_at_any_write_leaves_old_or_new_and_the_next_merge_recovers(s3, server, tmp_path, writes, k, what):
    assert len(writes) == 7
    _fresh_old(s3)
    child = _start(server, _config(tmp_path, s3))
    fired = _arm(s3, k, what, child)
    try:
        child.communicate(timeout=120)
    finally:
        _disarm(s3)
    assert fired.is_set() and child.returncode == -signal.SIGKILL
    factor = _reads_as(OUT)  # whatever was killed, one whole checkpoint
    index_landed = k > 4 or (k == 4 and what == "kill-after")
    assert factor == (2.0 if index_landed else 1.0)
    assert _temp_folders(child.pid)  # the killed merge could not clean up ...
    cm.merge([cm.Source(s3["url"], step=200)], OUT, overwrite=True, update_state=True)  # ... the next one does
    assert _reads_as(OUT) == 2.0
    _assert_one_checkpoint(_objects(s3["fs"]))
    assert not _temp_folders(child.pid)
    np.testing.assert_array_equal(cm.load("s3://ckpts/kill")["w"], W * 2)  # the state file names it


# Ctrl-C of the real process at a data upload, at the switch and at a delete after it
# (tests/test_remote_overwrite.py interrupts every write in this process).
@pytest.mark.slow
@pytest.mark.parametrize("k", [2, 4, 5])
def test_ctrl_c_at_a_write_exits_130_and_leaves_old_or_new_with_nothing_else(s3, server, tmp_path, writes, k):
    _fresh_old(s3)
    child = _start(server, _config(tmp_path, s3))
    fired = _arm(s3, k, "sigint", child)
    try:
        out, err = child.communicate(timeout=120)
    finally:
        _disarm(s3)
    assert fired.is_set()
    assert "Traceback" not in err, err
    names = _objects(s3["fs"])
    if k >= 4:  # from the index PUT on, the switch is done: it is finished, old data removed
        assert child.returncode in (0, 130), err
        assert _reads_as(OUT) == 2.0
        assert names == NEW
    else:
        assert child.returncode == 130 and "Aborted!" in err, err
        assert _reads_as(OUT) == 1.0
        assert names == OLD
    assert not _temp_folders(child.pid)


def test_cli_403_on_the_index_put_is_a_one_line_error_and_keeps_the_old_checkpoint(s3, server, tmp_path):
    _fresh_old(s3)
    s3["proxy"].hook = lambda method, path: 403 if method == "PUT" and path.split("?")[0].endswith(
        "/ckpts/kill/model.index") else None
    try:
        child = _start(server, _config(tmp_path, s3))
        out, err = child.communicate(timeout=120)
    finally:
        _disarm(s3)
    assert child.returncode == 2, err
    assert err.startswith("Error: ") and err.count("\n") == 1 and "Traceback" not in err, err
    assert f"Uploading the merge to '{OUT}' failed" in err and "Access denied" in err
    assert _reads_as(OUT) == 1.0
    assert _objects(s3["fs"]) == OLD


def test_cli_403_on_a_data_put_and_a_persistent_500_on_the_index_keep_the_old_checkpoint(s3, server, tmp_path):
    for target, status in (("/ckpts/kill/model.data-00000-of-00002", 403), ("/ckpts/kill/model.index", 500)):
        _fresh_old(s3)
        s3["proxy"].hook = lambda method, path: status if method == "PUT" and path.split("?")[0].endswith(target) \
            else None
        try:
            child = _start(server, _config(tmp_path, s3))
            child.communicate(timeout=300)
        finally:
            _disarm(s3)
        assert child.returncode == 2
        assert _reads_as(OUT) == 1.0
        assert _objects(s3["fs"]) == OLD


def test_a_long_lived_process_sees_what_another_process_wrote_since_it_last_listed(s3, server, tmp_path, monkeypatch):
    # s3fs keeps listings for the life of the process. This process lists OUT's folder (the
    # one-shard old checkpoint), then another process replaces it (with a two-shard one, as the
    # one-shard names are taken). A merge here that trusted its listing would upload its data
    # under the names the live index reads: a mix. It must look again, lock or no lock.
    import fsspec

    from ckptmerge.formats.io.storage import filesystem

    conf = {k: v for k, v in fsspec.config.conf["s3"].items() if k != "skip_instance_cache"}
    monkeypatch.setitem(fsspec.config.conf, "s3", conf)  # one filesystem for the process, as by default
    _fresh_old(s3)
    assert [c.step for c in cm.checkpoints("s3://ckpts/kill")] == [None]  # this process lists the folder ...
    assert "ckpts/kill" in filesystem(OUT)[0].dircache  # ... and keeps the listing
    child = _start(server, _config(tmp_path, s3))  # the other process: step 200, two shards
    child.communicate(timeout=120)
    assert child.returncode == 0
    assert _objects(s3["fs"]) == NEW
    # this process again; without its lock (whose PUT would also drop the folder's listing)
    monkeypatch.setenv("CKPTMERGE_REMOTE_LOCK", "0")
    cm.merge([cm.Source(s3["url"], step=100)], OUT, overwrite=True)
    monkeypatch.undo()  # read back with a new filesystem, that has listed nothing yet
    assert _reads_as(OUT) == 1.0
    assert _objects(s3["fs"]) == OLD
