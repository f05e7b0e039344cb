"""Remote reads time out, and every HTTP status is a clear error (issue 24, item 7).

A stalled server hung ``ls`` for 1,205 s (four attempts of aiohttp's default five minutes), then
said "not a checkpoint"; a 500 on the first ranged GET of ``ls http://...`` gave a raw
``ClientResponseError`` traceback. Here a local HTTP server (tests/_http_server.py) stalls, stops
half-way or answers each status class, with timeouts of a fraction of a second: every command
ends in seconds with an error that says what happened and names the URL. The per-request timeout
reaches each filesystem's own options (s3fs, gcsfs, adlfs, http), and the deadline bounds the
library's own retries too (s3fs against a stalled "S3" endpoint).
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from _cli_util import assert_one_line_error, run
from _http_server import FileServer

import ckptmerge as cm
from ckptmerge.formats.io import remote_policy

REPO = Path(__file__).resolve().parents[1]
W = np.arange(12, dtype=np.float32).reshape(3, 4)


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """A TF checkpoint, a safetensors file and an .npz, as bytes by path."""
    import tensorflow as tf
    from safetensors.numpy import save_file

    d = tmp_path_factory.mktemp("served")
    m = tf.Module()
    m.w = tf.Variable(W, name="w")
    tf.train.Checkpoint(model=m).write(str(d / "ckpt-1"))
    save_file({"w": W}, str(d / "model.safetensors"))
    buf = io.BytesIO()
    np.savez(buf, w=W)
    out = {"/" + f.name: f.read_bytes() for f in d.iterdir() if f.is_file()}
    out["/arrays.npz"] = buf.getvalue()
    return out


@pytest.fixture
def server(files):
    s = FileServer(files, stall_limit=20)
    yield s
    s.close()


@pytest.fixture
def short(monkeypatch):
    """Timeouts of a fraction of a second."""
    monkeypatch.setenv("CKPTMERGE_REMOTE_TIMEOUT", "0.5")
    monkeypatch.setenv("CKPTMERGE_REMOTE_DEADLINE", "2")


NAMES = ["ckpt-1", "model.safetensors", "arrays.npz"]


# -- the knobs and the options they become --------------------------------------------------------


def test_the_timeouts_default_to_a_minute_and_five_minutes(monkeypatch):
    monkeypatch.delenv("CKPTMERGE_REMOTE_TIMEOUT", raising=False)
    monkeypatch.delenv("CKPTMERGE_REMOTE_DEADLINE", raising=False)
    assert remote_policy.timeout_seconds() == 60.0 and remote_policy.deadline_seconds() == 300.0


@pytest.mark.parametrize("value", ["0", "-1", "nan", "inf", "soon", "1e9"])
def test_a_malformed_timeout_is_a_clear_error_when_a_url_is_used(monkeypatch, value, tmp_path):
    monkeypatch.setenv("CKPTMERGE_REMOTE_TIMEOUT", value)
    with pytest.raises(cm.CkptMergeError, match=f"CKPTMERGE_REMOTE_TIMEOUT={value!r} is not valid"):
        cm.list_variables("http://127.0.0.1:9/x.safetensors")
    from safetensors.numpy import save_file

    save_file({"w": W}, str(tmp_path / "w.safetensors"))  # local paths never read it
    assert [v.name for v in cm.list_variables(str(tmp_path / "w.safetensors"))] == ["w"]


@pytest.mark.parametrize("scheme, key, check", [
    ("s3", "config_kwargs", lambda v: v == {"connect_timeout": 7.0, "read_timeout": 7.0,
                                            "retries": {"total_max_attempts": 1}}),
    ("gs", "requests_timeout", lambda v: (v.total, v.sock_connect, v.sock_read) == (None, 7.0, 7.0)),
    ("abfs", "read_timeout", lambda v: v == 7.0),
    ("az", "connection_timeout", lambda v: v == 7.0),
    ("https", "client_kwargs", lambda v: (v["timeout"].total, v["timeout"].sock_read) == (None, 7.0)),
])
def test_every_filesystem_gets_the_timeout_in_its_own_options(monkeypatch, scheme, key, check):
    monkeypatch.setenv("CKPTMERGE_REMOTE_TIMEOUT", "7")
    assert check(remote_policy.storage_options(scheme, {})[key])


def test_fsspec_configuration_wins_key_by_key(monkeypatch):
    monkeypatch.setenv("CKPTMERGE_REMOTE_TIMEOUT", "7")
    opts = remote_policy.storage_options("https", {"client_kwargs": {"trust_env": True}})
    assert opts["client_kwargs"]["trust_env"] is True and opts["client_kwargs"]["timeout"].sock_read == 7.0
    opts = remote_policy.storage_options("gs", {"requests_timeout": 99})
    assert "requests_timeout" not in opts  # theirs stands (fsspec applies it)
    opts = remote_policy.storage_options("s3", {"config_kwargs": {"read_timeout": 1}})
    assert opts["config_kwargs"] == {"connect_timeout": 7.0, "read_timeout": 1, "retries": {"total_max_attempts": 1}}


def test_the_filesystems_opened_for_urls_carry_the_timeouts(monkeypatch, server):
    from ckptmerge.formats.io.storage import filesystem

    monkeypatch.setenv("CKPTMERGE_REMOTE_TIMEOUT", "7")
    for k, v in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1",
                 "AWS_EC2_METADATA_DISABLED": "true"}.items():
        monkeypatch.setenv(k, v)
    fs, _ = filesystem("s3://bucket/run/ckpt-1")
    assert fs.config_kwargs["read_timeout"] == 7.0 and fs.config_kwargs["connect_timeout"] == 7.0
    fs, _ = filesystem(server.url + "/model.safetensors")
    assert fs.client_kwargs["timeout"].sock_read == 7.0


# -- a stalled server -----------------------------------------------------------------------------


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("how", ["stall", "partial"])
def test_a_stalled_server_times_out_in_seconds_naming_the_url(server, short, name, how):
    url = f"{server.url}/{name}"
    if how == "stall":
        server.fault(stall=True)
    else:
        server.fault(partial=True, ranged=True)
    t0 = time.monotonic()
    with pytest.raises(cm.CkptMergeError) as info:
        cm.load(url)
    elapsed = time.monotonic() - t0
    assert "Timed out" in str(info.value) and server.url in str(info.value), str(info.value)
    assert "CKPTMERGE_REMOTE_TIMEOUT" in str(info.value)
    assert elapsed < 20, elapsed  # a few deadlines at most, never minutes


def test_cli_ls_of_a_stalled_server_is_a_one_line_timed_out_error_within_the_deadline(server, tmp_path):
    server.fault(stall=True)
    env = dict(os.environ, PYTHONPATH=str(REPO), CKPTMERGE_REMOTE_TIMEOUT="0.5", CKPTMERGE_REMOTE_DEADLINE="2")
    t0 = time.monotonic()
    out = subprocess.run([sys.executable, "-m", "ckptmerge", "ls", f"{server.url}/model.safetensors"], cwd=REPO,
                         env=env, capture_output=True, text=True, timeout=120)
    elapsed = time.monotonic() - t0
    assert out.returncode == 2, out.stderr
    assert out.stderr.startswith("Error: Timed out") and out.stderr.count("\n") == 1, out.stderr
    assert f"{server.url}/model.safetensors" in out.stderr and "Traceback" not in out.stderr
    assert elapsed < 60, elapsed


def test_a_server_that_recovers_within_the_retries_is_read(server, short):
    server.fault(stall=True, times=1)
    np.testing.assert_array_equal(cm.load(f"{server.url}/model.safetensors")["w"], W)


def test_the_deadline_bounds_the_retries_of_s3fs_itself(monkeypatch, server):
    # botocore and s3fs retry a read timeout themselves (5 x 5 attempts): the deadline cancels them
    import fsspec

    for k, v in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1",
                 "AWS_EC2_METADATA_DISABLED": "true", "CKPTMERGE_REMOTE_TIMEOUT": "0.5",
                 "CKPTMERGE_REMOTE_DEADLINE": "2"}.items():
        monkeypatch.setenv(k, v)
    monkeypatch.setitem(fsspec.config.conf, "s3", {"client_kwargs": {"endpoint_url": server.url},
                                                   "skip_instance_cache": True})
    server.fault(stall=True)
    t0 = time.monotonic()
    with pytest.raises(cm.CkptMergeError, match=r"Timed out .*s3://stalled/run/ckpt-1") as info:
        cm.load("s3://stalled/run/ckpt-1")
    assert time.monotonic() - t0 < 30, str(info.value)


# -- every status class ---------------------------------------------------------------------------


@pytest.mark.parametrize("status, words", [
    (400, "HTTP 400 Bad Request"), (401, "HTTP 401 Unauthorized"), (403, "HTTP 403 Forbidden"),
    (404, "does not exist"), (410, "does not exist"), (405, "HTTP 405 Method Not Allowed"),
    (416, "HTTP 416 Requested Range Not Satisfiable"), (418, "HTTP 418"),
    (429, "HTTP 429 Too Many Requests"), (500, "HTTP 500 Internal Server Error"),
    (502, "HTTP 502 Bad Gateway"), (503, "HTTP 503 Service Unavailable"), (504, "HTTP 504 Gateway Timeout"),
])
@pytest.mark.parametrize("where", ["every", "ranged"])
def test_every_http_status_is_a_one_line_error_naming_the_url(server, status, words, where):
    url = f"{server.url}/model.safetensors"
    server.fault(status=status, ranged=True if where == "ranged" else None)
    r = run("ls", url)
    assert r.exit_code == 2, r.output
    assert "Traceback" not in r.stderr and r.stderr.startswith("Error: "), r.stderr
    if where == "ranged" and status in (404, 410):  # it was there when looked up, then its bytes are not
        words = "vanished while it was read"
    assert_one_line_error(r, url, words)


def test_a_500_on_the_first_ranged_get_is_retried(server):
    url = f"{server.url}/model.safetensors"
    server.fault(status=500, ranged=True, times=1)
    r = run("ls", url, "--json")
    assert r.exit_code == 0, r.output
    assert [v["name"] for v in json.loads(r.stdout)] == ["w"]


@pytest.mark.parametrize("status", [403, 500, 503])
@pytest.mark.parametrize("name", NAMES)
def test_each_format_names_the_url_and_status_of_a_failed_read(server, status, name):
    server.fault(status=status, ranged=True)
    with pytest.raises(cm.CkptMergeError) as info:
        cm.load(f"{server.url}/{name}")
    assert server.url in str(info.value) and f"HTTP {status}" in str(info.value), str(info.value)


def test_a_restore_whose_reads_time_out_changes_nothing(server, short):
    import tensorflow as tf

    w = tf.Variable(np.full_like(W, 7.0))
    plan = cm.plan({"w": w}, [cm.Source(f"{server.url}/ckpt-1")])
    server.fault(stall=True, ranged=True)
    with pytest.raises(cm.CkptMergeError, match="Timed out"):
        plan.restore()
    assert (w.numpy() == 7).all()


def test_an_answer_shorter_than_the_range_asked_for_is_refused_not_taken_for_the_end(server):
    server.fault(short=True, ranged=True)
    for name in NAMES:  # (the TF reader, which knows each tensor's size, says so in its own words)
        with pytest.raises(cm.CkptMergeError, match=r"The server sent \d+ of the \d+ bytes asked for|ended early"
                           ) as info:
            cm.load(f"{server.url}/{name}")
        assert f"{server.url}/{name}" in str(info.value)


@pytest.mark.parametrize("status", [400, 500, 503])
@pytest.mark.parametrize("name", ["model.safetensors", "arrays.npz"])
def test_a_failed_index_probe_names_the_index_url_it_probed_redacted(server, status, name):
    """To tell a TF prefix from a file, ckptmerge looks up '<url>.index' first: a 400 or 5xx on
    that lookup (retried, then an error) names the .index URL, not only the URL given, keeps the
    query after the suffix and shows none of its secrets, and says why it was looked up."""
    server.fault(status=status, path=r"\.index$")
    url = f"{server.url}/{name}?X-Amz-Signature=SECRETSIG&X-Amz-Credential=AKIDSECRET&download=true"
    r = run("ls", url)
    probed = f"'{server.url}/{name}.index?X-Amz-Signature=***&X-Amz-Credential=***&download=true'"
    assert_one_line_error(r, probed, f"HTTP {status}", "looks for that file beside the checkpoint named")
    assert "SECRET" not in r.stderr
    assert any(path.split("?")[0] == f"/{name}.index" for _, path, _ in server.requests)
    server.faults.clear()  # the probe answered (404): the file itself is read
    assert run("ls", url).exit_code == 0
