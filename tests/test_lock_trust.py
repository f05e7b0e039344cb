"""A forged or damaged lock is reported, never judged stale, ignored or overwritten (issue 30).

The lock object of a remote merge (``<prefix>.lock``) is broken by the next merge when its
holder is provably gone (a process of this machine that ended). A lock with a start time of
``1e300``, ``NaN``, ``Infinity`` or ``-1`` was taken for such a lock and overwritten. Now only a
lock that is exactly what a merge writes is judged; every variant below (a start time, a pid or
a field that is not one, a missing field, another output, not JSON, too large) is a clear error
naming the lock and how to remove it, and the lock stays byte for byte. Each variant damages a
lock that would otherwise be broken (a dead process of this machine): the undamaged one is, as
the first test shows. The same holds on S3 (moto on localhost) through the CLI.

The local lock (``.NAME.ckptmerge-lock``, a ``flock`` that a merge creates empty) is refused
when anything else is at its path: content, a link (to a file, a folder, nowhere), a FIFO, a
folder, a file with another hard link. Nothing is written, the thing at the path is unchanged
(a link's target neither created nor changed), and the empty file a killed merge leaves is
reused as before.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from _cli_util import assert_one_line_error, run
from _remote_util import start_s3, write_run

import ckptmerge as cm
from ckptmerge.core.errors import OutputLockedError
from ckptmerge.formats.io.output_prefix import machine_tag

W = np.arange(12, dtype=np.float32).reshape(3, 4)
BIG = np.zeros((8, 8), np.float32)


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("run")
    write_run(d, W, BIG)
    return d


@pytest.fixture(scope="module")
def dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


@pytest.fixture
def mem(run_dir, tmp_path):
    import fsspec

    fs = fsspec.filesystem("memory")
    root = f"memory://lock-{os.getpid()}-{tmp_path.name}"
    for f in sorted(run_dir.iterdir()):
        fs.pipe(f"{root}/run/{f.name}", f.read_bytes())
    yield fs, f"{root}/run", f"{root}/out/model"
    fs.rm(root, recursive=True)


def _stale(out: str, pid: int) -> dict:
    """The lock a merge on this machine left when it was killed: broken by the next merge."""
    return {"host": "here", "pid": pid, "started": time.time() - 600, "token": "0123456789abcdef", "output": out,
            "machine": machine_tag()}


def _names(fs, url):
    parent = url.rsplit("/", 1)[0]
    fs.invalidate_cache()
    return sorted(p.rsplit("/", 1)[-1] for p in fs.ls(parent, detail=False)) if fs.exists(parent) else []


def test_the_undamaged_lock_of_a_dead_merge_is_broken(mem, dead_pid, caplog):
    fs, src, out = mem
    fs.pipe(out + ".lock", json.dumps(_stale(out, dead_pid)).encode())
    caplog.set_level(logging.WARNING)
    cm.merge([cm.Source(src, step=100)], out)
    assert "no longer running" in caplog.text
    assert _names(fs, out) == ["model.data-00000-of-00001", "model.index"]


def _field(name, value):
    return lambda lock: {**lock, name: value}


def _without(name):
    return lambda lock: {k: v for k, v in lock.items() if k != name}


#: Each turns the stale lock's dict into the damaged object's bytes.
DAMAGED = {
    **{f"started={v!r}": _field("started", v) for v in
       (1e300, float("nan"), float("inf"), float("-inf"), -1, 0, -1e300, 10 ** 30, 10 ** 400, 1.5,
        "yesterday", True, None, [1], {"t": 1})},
    "started=future": lambda lock: {**lock, "started": time.time() + 30 * 86400},
    **{f"pid={v!r}": _field("pid", v) for v in (-1, 0, 10 ** 30, 1 << 31, 1.5, "4242", True, None, [1])},
    **{f"no {name}": _without(name) for name in ("host", "pid", "started", "token", "output", "machine")},
    "token=5": _field("token", 5), "token=''": _field("token", ""), "token=long": _field("token", "x" * 65),
    "host=list": _field("host", ["h"]), "host=long": _field("host", "h" * 300), "machine=7": _field("machine", 7),
    "another output": _field("output", "memory://elsewhere/model"),
}
RAW = {
    "empty": b"", "not json": b"locked by bob", "truncated": b'{"host": "here", "pid": 1',
    "list": b"[]", "string": b'"lock"', "null": b"null", "number": b"1e300", "NaN": b"NaN",
    "latin-1": b"\xff\xfe{}", "nested": b"[" * 100000 + b"]" * 100000, "oversized": None, "twice": None,
}


def _bytes(case, out, pid):
    if case in DAMAGED:
        return json.dumps(DAMAGED[case](_stale(out, pid))).encode()
    if case == "oversized":  # a valid stale lock, padded past any lock's size
        return json.dumps({**_stale(out, pid), "pad": " " * 70000}).encode()
    if case == "twice":  # a valid stale lock naming its pid twice
        return json.dumps(_stale(out, pid))[:-1].encode() + f', "pid": {pid}}}'.encode()
    return RAW[case]


@pytest.mark.parametrize("case", list(DAMAGED) + list(RAW))
def test_a_forged_or_damaged_lock_object_is_reported_and_left_as_it_is(mem, dead_pid, case):
    fs, src, out = mem
    body = _bytes(case, out, dead_pid)
    fs.pipe(out + ".lock", body)
    with pytest.raises(OutputLockedError) as info:
        cm.merge([cm.Source(src, step=100)], out)
    text = str(info.value)
    assert info.value.path == out + ".lock"
    assert "cannot be trusted" in text and f"delete the object '{out}.lock'" in text, text
    assert len(text) < 1000 and "\n" not in text, text  # a forged field is cut short and escaped
    assert _names(fs, out) == ["model.lock"] and fs.cat_file(out + ".lock") == body


def test_a_lock_of_another_machine_is_still_named_with_its_holder(mem, dead_pid):
    fs, src, out = mem
    fs.pipe(out + ".lock", json.dumps({**_stale(out, dead_pid), "host": "trainer-7",
                                       "machine": "another-boot/1"}).encode())
    with pytest.raises(OutputLockedError, match=r"held by process \d+ on host 'trainer-7', started .* min ago"):
        cm.merge([cm.Source(src, step=100)], out)


def test_a_lock_that_vanishes_before_it_is_read_is_created_again(mem, monkeypatch):
    """The holder ended between our create and our look: the lock is taken, not an 'unknown writer'."""
    from ckptmerge.merging import remote

    fs, src, out = mem
    real, calls = remote.create_exclusive, []

    def first_loses(url, data):
        calls.append(url)
        return real(url, data) if len(calls) > 1 else False

    monkeypatch.setattr(remote, "create_exclusive", first_loses)
    cm.merge([cm.Source(src, step=100)], out)
    assert len(calls) == 2 and _names(fs, out) == ["model.data-00000-of-00001", "model.index"]


def test_parse_lock_takes_what_a_merge_writes():
    from ckptmerge.merging.remote import UntrustedLock, parse_lock

    lock = {"host": "h", "pid": 7, "started": time.time(), "token": "ab", "output": "s3://b/m", "machine": None}
    assert parse_lock(json.dumps(lock).encode(), "s3://b/m") == lock
    with pytest.raises(UntrustedLock, match="start time"):
        parse_lock(json.dumps({**lock, "started": 1e300}).encode(), "s3://b/m")


# -- the same on S3, through the CLI ---------------------------------------------------------------


@pytest.fixture(scope="module")
def s3(run_dir):
    yield from start_s3(run_dir)


@pytest.mark.parametrize("case", ["started=1e+300", "started=nan", "started=inf", "started=-1", f"pid={10 ** 30!r}",
                                  "no token", "not json", "oversized", "nested"])
def test_on_s3_a_damaged_lock_is_a_one_line_error_and_stays(s3, dead_pid, tmp_path, case):
    fs, out = s3["fs"], f"s3://ckpts/trust-{tmp_path.name}/model"
    body = _bytes(case, out, dead_pid)
    fs.pipe(out + ".lock", body)
    config = tmp_path / "m.yaml"
    config.write_text(f"sources:\n  - path: {s3['url']}\n    step: 100\n")
    r = run("merge", config, "-o", out, "-q")
    assert_one_line_error(r, f"'{out}.lock'", "cannot be trusted", "delete the object")
    fs.invalidate_cache()
    assert fs.cat_file(out + ".lock") == body and not fs.exists(out + ".index")
    fs.rm(out + ".lock")  # as the message says
    assert run("merge", config, "-o", out, "-q").exit_code == 0
    fs.invalidate_cache()
    assert fs.exists(out + ".index") and not fs.exists(out + ".lock")


# -- the local lock file ----------------------------------------------------------------------------


def _forge(kind: str, lock: Path, tmp_path: Path):
    """Put ``kind`` at the lock's path; return a function that tells it is unchanged."""
    other = tmp_path / "elsewhere"
    other.mkdir(exist_ok=True)
    if kind.startswith("content:"):
        data = {"1e300": b"1e300", "nan": b'{"started": NaN}', "big": b"x" * (1 << 20), "one": b"\0"}[kind[8:]]
        lock.write_bytes(data)
        return lambda: lock.read_bytes() == data
    if kind == "link-to-file":
        (other / "mine.txt").write_bytes(b"keep me")
        lock.symlink_to(other / "mine.txt")
        return lambda: lock.is_symlink() and (other / "mine.txt").read_bytes() == b"keep me"
    if kind == "dangling-link":
        lock.symlink_to(other / "created-by-nobody")
        return lambda: lock.is_symlink() and not (other / "created-by-nobody").exists()
    if kind == "link-to-folder":
        lock.symlink_to(other)
        return lambda: lock.is_symlink() and lock.resolve() == other.resolve()
    if kind == "fifo":
        os.mkfifo(lock)
        return lambda: lock.is_fifo()
    if kind == "folder":
        lock.mkdir()
        return lambda: lock.is_dir()
    if kind == "hard-link":
        (other / "data.bin").write_bytes(b"")
        os.link(other / "data.bin", lock)
        return lambda: os.stat(lock).st_nlink == 2 and os.path.samefile(lock, other / "data.bin")
    raise AssertionError(kind)


LOCAL = ["content:1e300", "content:nan", "content:big", "content:one", "link-to-file", "dangling-link",
         "link-to-folder", "fifo", "folder", "hard-link"]


@pytest.mark.parametrize("command", ["merge", "average"])
@pytest.mark.parametrize("kind", LOCAL)
def test_anything_but_an_empty_file_at_the_local_lock_is_reported(run_dir, tmp_path, kind, command):
    out = tmp_path / "out"
    out.mkdir()
    lock = out / ".model.ckptmerge-lock"
    unchanged = _forge(kind, lock, tmp_path)
    if command == "merge":
        config = tmp_path / "m.yaml"
        config.write_text(f"sources:\n  - path: {run_dir}\n    step: 100\n")
        r = run("merge", config, "-o", out / "model", "-q")
    else:
        r = run("average", run_dir, "--last", "2", "-o", out / "model", "-q")
    assert_one_line_error(r, "lock file", ".model.ckptmerge-lock", "cannot be trusted", "delete")
    assert unchanged()
    assert sorted(p.name for p in out.iterdir()) == [lock.name]  # nothing written, no temporary file


def test_the_empty_lock_file_a_killed_merge_left_is_reused(run_dir, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / ".model.ckptmerge-lock").write_bytes(b"")
    config = tmp_path / "m.yaml"
    config.write_text(f"sources:\n  - path: {run_dir}\n    step: 100\n")
    r = run("merge", config, "-o", out / "model", "-q")
    assert r.exit_code == 0, r.output
    assert sorted(p.name for p in out.iterdir()) == ["model.data-00000-of-00001", "model.index"]
