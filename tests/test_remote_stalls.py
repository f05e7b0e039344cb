"""A stalled object store fails every command in seconds, at every stage of every read (issue 30).

With ``CKPTMERGE_REMOTE_TIMEOUT`` set (and the deadline left at its five minutes), a GET that
stalled on an S3 TF prefix still hung ``show``: botocore retried each request five times inside
each of s3fs's five attempts inside each of ckptmerge's, with backoffs, so one stalled read took
minutes. Here real ``python -m ckptmerge`` processes (forked from a warm interpreter,
tests/_forkserver.py) read a moto S3 server through the proxy of tests/_remote_util.py, which
stalls one kind of request at one stage: the connection (a listening socket that never accepts),
the answer's headers (a HEAD, a listing, a whole GET of an index or state file, a ranged GET of
a data object), or its body half-way. ``show``, ``ls`` and ``merge`` from the remote source must
each exit 2 with one clear "Timed out" line naming the URL, in seconds, and a merge must leave
no output behind.
"""

from __future__ import annotations

import os
import socket
import time
from pathlib import Path

import numpy as np
import pytest
from _forkserver import ForkServer
from _remote_util import start_s3, write_run

REPO = Path(__file__).resolve().parents[1]
PRELOAD = ["ckptmerge.cli", "ckptmerge.merging.local", "s3fs", "aiobotocore.session"]
TIMEOUT = 0.3


@pytest.fixture(scope="module")
def s3(tmp_path_factory):
    d = tmp_path_factory.mktemp("run")
    write_run(d, np.arange(12, dtype=np.float32).reshape(3, 4), np.zeros((64, 64), np.float32))
    yield from start_s3(d)


@pytest.fixture(scope="module")
def server(s3):
    # no CKPTMERGE_REMOTE_DEADLINE, and botocore's own retries left at their default (no
    # AWS_MAX_ATTEMPTS): only the per-request timeout may bound a stall
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CKPTMERGE_REMOTE", "AWS_MAX_ATTEMPTS"))}
    env.update({k: v for k, v in s3["env"].items() if k != "AWS_MAX_ATTEMPTS"})
    env.update(PYTHONPATH=str(REPO), CKPTMERGE_REMOTE_TIMEOUT=str(TIMEOUT))
    with ForkServer(PRELOAD, env=env) as forks:
        yield forks


@pytest.fixture(scope="module")
def unanswered():
    """A port that takes no connection: it listens, but its backlog is full and never accepted."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(0)
    port = srv.getsockname()[1]
    fill = []
    for _ in range(3):
        c = socket.socket()
        c.setblocking(False)
        try:
            c.connect(("127.0.0.1", port))
        except BlockingIOError:
            pass
        fill.append(c)
    yield f"http://127.0.0.1:{port}"
    for c in fill:
        c.close()
    srv.close()


def _command(what, s3, tmp_path):
    url = s3["url"]
    if what == "show":
        return ["show", f"{url}/ckpt-200", "w"]
    if what == "ls":
        return ["ls", url]  # a run folder: its listing, its state file, then the checkpoint
    config = tmp_path / "m.yaml"
    config.write_text(f"sources:\n  - path: {url}\n    step: 200\n")
    return ["merge", str(config), "-o", str(tmp_path / "out" / "model"), "-q"]


def _run(server, args, tmp_path, **env):
    (tmp_path / "out").mkdir(exist_ok=True)
    t0 = time.monotonic()
    child = server.start(["-m", "ckptmerge", *args], env=dict(server.env, **env))
    try:
        out, err = child.communicate(timeout=60)  # a hang fails here, it never blocks the suite
    except BaseException:
        child.kill()
        child.wait(30)
        raise
    return child.returncode, out, err, time.monotonic() - t0


def _assert_timed_out(rc, err, elapsed, url, tmp_path):
    assert rc == 2, err
    assert err.startswith("Error: Timed out") and err.count("\n") == 1 and "Traceback" not in err, err
    assert url in err, err
    assert elapsed < 20, (elapsed, err)  # a few timeouts and backoffs, never minutes
    assert list((tmp_path / "out").iterdir()) == []  # a merge left nothing behind


# (command, method, path pattern, action): the first request of that kind is stalled, every time
STAGES = [
    ("show", "HEAD", "/ckpt-200.index", "stall"),
    ("show", "GET", "/ckpt-200.index", "stall"),
    ("show", "GET", "/ckpt-200.index", "stall-body"),
    ("show", "GET", "/ckpt-200.data-", "stall"),
    ("show", "GET", "/ckpt-200.data-", "stall-body"),
    ("ls", "GET", "list-type", "stall"),
    ("ls", "GET", "list-type", "stall-body"),
    ("ls", "GET", "/run/checkpoint", "stall-body"),
    ("ls", "GET", "/ckpt-200.data-", "stall"),
    ("merge", "GET", "list-type", "stall"),
    ("merge", "GET", "/ckpt-200.index", "stall-body"),
    ("merge", "GET", "/ckpt-200.data-", "stall"),
    ("merge", "GET", "/ckpt-200.data-", "stall-body"),
]


@pytest.mark.parametrize("what, method, pattern, action", STAGES)
def test_a_stall_at_any_stage_is_a_timed_out_error_in_seconds(s3, server, tmp_path, what, method, pattern, action):
    proxy = s3["proxy"]
    stalled = []

    def hook(m, path):
        if m == method and pattern in path.split("?" if pattern != "list-type" else "\0")[0]:
            stalled.append(path)
            return action
        return None

    proxy.hook = hook
    try:
        rc, out, err, elapsed = _run(server, _command(what, s3, tmp_path), tmp_path, CKPTMERGE_REMOTE_RETRIES="2")
    finally:
        proxy.hook = None
    assert stalled, f"no {method} {pattern} request was made: {err}"
    _assert_timed_out(rc, err, elapsed, "s3://ckpts/run", tmp_path)


def test_with_the_default_retries_a_stalled_ranged_get_costs_seconds(s3, server, tmp_path):
    s3["proxy"].hook = lambda m, path: "stall" if m == "GET" and ".data-" in path else None
    try:
        rc, out, err, elapsed = _run(server, _command("show", s3, tmp_path), tmp_path)
    finally:
        s3["proxy"].hook = None
    _assert_timed_out(rc, err, elapsed, "s3://ckpts/run/ckpt-200.data-00000-of-00001", tmp_path)
    assert "after 4 attempts" in err, err


@pytest.mark.parametrize("what", ["show", "ls", "merge"])
def test_a_store_that_takes_no_connection_is_a_timed_out_error_in_seconds(s3, server, unanswered, tmp_path, what):
    rc, out, err, elapsed = _run(server, _command(what, s3, tmp_path), tmp_path, AWS_ENDPOINT_URL=unanswered,
                                 CKPTMERGE_REMOTE_RETRIES="2")
    _assert_timed_out(rc, err, elapsed, "s3://ckpts/run", tmp_path)


def test_botocore_and_s3fs_make_one_attempt_each_so_ckptmerge_retries_alone(monkeypatch):
    from ckptmerge.formats.io import remote_policy
    from ckptmerge.formats.io.storage import filesystem

    monkeypatch.setenv("CKPTMERGE_REMOTE_TIMEOUT", "7")
    assert remote_policy.storage_options("s3", {})["config_kwargs"]["retries"] == {"total_max_attempts": 1}
    theirs = {"config_kwargs": {"retries": {"max_attempts": 9}}}
    assert remote_policy.storage_options("s3", theirs)["config_kwargs"]["retries"] == {"max_attempts": 9}
    for k, v in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1",
                 "AWS_EC2_METADATA_DISABLED": "true"}.items():
        monkeypatch.setenv(k, v)
    fs, _ = filesystem("s3://bucket/one-attempt/ckpt-1")
    assert fs.retries == 1 and type(fs).retries > 1  # the class (anyone else's instances) untouched
