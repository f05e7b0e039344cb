"""``cm.watch`` and ``Restorer.follow`` over object storage: ``memory://`` and a real S3 API on
localhost (moto's server; s3fs with its listing cache on, as users run it).

Objects appear whole, but a checkpoint's objects arrive one by one and in any order (an index
before its data), and a trainer's cleanup deletes them; nothing can be pinned in a bucket, so a
checkpoint deleted before its read is a clear error naming it, and nothing is restored from it.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import ckptmerge as cm
from ckptmerge.core.errors import RestoreError
from ckptmerge.formats.io import storage
from ckptmerge.formats.tf.writer import BundleWriter

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
POLL = 0.05
DEADLINE = 120.0


def bundle_files(tmp, step, value=None, shape=(4,)):
    """``{name: bytes}`` of a TF checkpoint ``ckpt-STEP`` holding ``w`` (default: all ``step``)."""
    prefix = os.path.join(str(tmp), f"ckpt-{step}")
    with BundleWriter(prefix, overwrite=True) as w:
        w.add("w", np.full(shape, step if value is None else value, np.float32))
    out = {}
    for name in sorted(os.listdir(tmp)):
        if name.startswith(f"ckpt-{step}."):
            with open(os.path.join(tmp, name), "rb") as f:
                out[name] = f.read()
    return out


# -- memory:// ---------------------------------------------------------------------------------------


@pytest.fixture
def memory_dir():
    import fsspec

    fs = fsspec.filesystem("memory")
    url = f"memory://watch-{os.getpid()}-{id(fs)}-{os.urandom(4).hex()}"
    fs.mkdir(url)
    yield fs, url
    if fs.exists(url):
        fs.rm(url, recursive=True)


def test_an_index_uploaded_before_its_data_is_waited_for(memory_dir, tmp_path):
    fs, url = memory_dir
    files = bundle_files(tmp_path, 1)
    index = [n for n in files if n.endswith(".index")][0]
    fs.pipe(f"{url}/{index}", files[index])  # the index first: incomplete
    loop = cm.watch(url, timeout=DEADLINE, poll=POLL)
    assert list(cm.watch(url, timeout=0)) == []  # not yielded, no error
    for name, data in files.items():
        if name != index:
            fs.pipe(f"{url}/{name}", data)
    info = next(loop)
    assert info.step == 1 and info.path == f"{url}/ckpt-1" and info.pinned is None
    np.testing.assert_array_equal(cm.load(info.read_path)["w"], np.ones(4, np.float32))
    loop.close()


def test_an_orbax_step_where_orbax_commits_by_marker_is_waited_for_until_its_marker(memory_dir, tmp_path,
                                                                                      monkeypatch):
    pytest.importorskip("tensorstore")
    from ckptmerge.formats.orbax.writer import OrbaxWriter
    from ckptmerge.following import scan as watchscan

    fs, url = memory_dir
    monkeypatch.setattr(watchscan, "ORBAX_COMMIT_SCHEMES", ("memory://",))  # memory:// stands in for gs://
    marker = {}
    for s in (100, 200):  # on GCS, Orbax writes a step in place and marks it finished last
        local = tmp_path / str(s)
        with OrbaxWriter(local, [("params/w", "float32", (4,))]) as w:
            w.add("params/w", np.full(4, s, np.float32))
        for f in sorted(p for p in local.rglob("*") if p.is_file()):
            if f.name == "commit_success.txt":
                marker[s] = f.read_bytes()
            else:
                fs.pipe(f"{url}/{s}/{f.relative_to(local).as_posix()}", f.read_bytes())
    fs.pipe(f"{url}/100/commit_success.txt", marker[100])
    assert [i.step for i in cm.watch(url, timeout=0)] == [100]  # 200 has all its files but no marker yet
    fs.pipe(f"{url}/200/commit_success.txt", marker[200])
    info = list(cm.watch(url, after=100, timeout=0))[0]
    assert info.step == 200 and float(cm.load(info.read_path)["params/w"][0]) == 200.0


def test_follow_over_a_url_restores_each_step(tf, memory_dir, tmp_path):
    fs, url = memory_dir
    template = tmp_path / "template"
    template.mkdir()
    bundle_files(template, 0)
    w = tf.Variable(np.zeros(4, np.float32))
    r = cm.Restorer({"w": w}, [cm.Source(str(template / "ckpt-0"))])
    for s in (1, 2):
        for name, data in bundle_files(tmp_path, s).items():
            fs.pipe(f"{url}/{name}", data)
    got = [(rep.checkpoint.step, float(w.numpy()[0])) for rep in r.follow(url, timeout=0)]
    assert got == [(1, 1.0), (2, 2.0)]


# -- S3 on localhost ---------------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def s3():
    """A moto S3 server on localhost with bucket 'watch'; s3fs caches listings (the default)."""
    import fsspec
    from moto.server import ThreadedMotoServer

    port = _free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    endpoint = f"http://127.0.0.1:{port}"
    env = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1",
           "AWS_ENDPOINT_URL": endpoint}
    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    old_conf = fsspec.config.conf.get("s3")
    fsspec.config.conf["s3"] = {"client_kwargs": {"endpoint_url": endpoint}}
    fs = fsspec.filesystem("s3")
    fs.mkdir("watch")
    yield {"fs": fs, "env": env}
    if old_conf is None:
        fsspec.config.conf.pop("s3", None)
    else:
        fsspec.config.conf["s3"] = old_conf
    for k, v in old.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v
    server.stop()


def test_over_s3_new_objects_are_seen_through_the_listing_cache(s3, tmp_path):
    import fsspec

    url = "s3://watch/cache"
    fs = fsspec.filesystem("s3", skip_instance_cache=True)  # another writer: it cannot clear our cache
    for name, data in bundle_files(tmp_path, 1).items():
        fs.pipe(f"{url}/{name}", data)
    s3["fs"].ls(url)  # the listing is cached now, in the instance ckptmerge uses
    loop = cm.watch(url, timeout=DEADLINE, poll=POLL)
    assert next(loop).step == 1
    files = bundle_files(tmp_path, 2)
    for name in sorted(files, key=lambda n: not n.endswith(".index")):  # index first
        fs.pipe(f"{url}/{name}", files[name])
    info = next(loop)
    assert info.step == 2
    np.testing.assert_array_equal(cm.load(info.read_path)["w"], np.full(4, 2, np.float32))
    loop.close()


def test_over_s3_a_checkpoint_deleted_before_its_read_is_a_clear_error_and_nothing_changes(
        tf, s3, tmp_path, monkeypatch):
    fs, url = s3["fs"], "s3://watch/deleted"
    template = tmp_path / "template"
    template.mkdir()
    bundle_files(template, 0)
    for s in (1, 2):
        for name, data in bundle_files(tmp_path, s).items():
            fs.pipe(f"{url}/{name}", data)
    w = tf.Variable(np.full(4, 7, np.float32))
    r = cm.Restorer({"w": w}, [cm.Source(str(template / "ckpt-0"))])
    real = storage.RemoteFile.readinto

    def cleanup_races_the_read(self, offset, view, **kw):  # max_to_keep deletes step 1 as it is read
        if "ckpt-1.data" in self.url:
            fs.rm(f"{url}/ckpt-1.data-00000-of-00001")
        return real(self, offset, view, **kw)

    monkeypatch.setattr(storage.RemoteFile, "readinto", cleanup_races_the_read)
    skipped = []
    reports = list(r.follow(url, timeout=0, on_skip=lambda i, e: skipped.append((i, e))))
    assert [rep.checkpoint.step for rep in reports] == [2]
    info, err = skipped[0]
    assert info.step == 1 and isinstance(err, RestoreError) and err.path == f"{url}/ckpt-1"
    assert f"'{url}/ckpt-1' (step 1) was deleted while it was being read, so it was skipped" in str(err)
    np.testing.assert_array_equal(w.numpy(), np.full(4, 2, np.float32))


UPLOADER = textwrap.dedent("""
    import os, sys, tempfile, time
    import numpy as np
    import fsspec
    from ckptmerge.formats.tf.writer import BundleWriter
    url, steps, progress = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    fs = fsspec.filesystem("s3")
    local = tempfile.mkdtemp()

    def followed():
        try:
            with open(progress) as f:
                return int(f.read() or 0)
        except (OSError, ValueError):
            return 0

    for step in range(1, steps + 1):
        prefix = os.path.join(local, f"ckpt-{step}")
        with BundleWriter(prefix, max_shard_bytes=40000) as w:  # two data shards
            w.add("a", np.full((100, 100), step, np.float32))
            w.add("b", np.full((50, 50), -step, np.float32))
        names = sorted(n for n in os.listdir(local) if n.startswith(f"ckpt-{step}."))
        # out of order, as a copy tool may: the index first, then the data shards last to first
        for name in sorted(names, key=lambda n: (not n.endswith(".index"), [-ord(c) for c in n])):
            with open(os.path.join(local, name), "rb") as f:
                fs.pipe(f"{url}/{name}", f.read())
        for old in fs.ls(url):  # max_to_keep=2
            base = old.rsplit("/", 1)[-1]
            if base.startswith(f"ckpt-{step - 2}."):
                fs.rm(old)
        deadline = time.monotonic() + 120
        while followed() < step - 1:  # the next upload deletes step - 1: not before it is restored
            if time.monotonic() > deadline:
                sys.exit(f"step {step - 1} was never restored")
            time.sleep(0.01)
    print("uploaded", steps)
""")


def test_over_s3_a_trainer_uploading_out_of_order_and_deleting_while_the_follower_restores(tf, s3, tmp_path):
    steps, url = 8, "s3://watch/trainer"
    template = tmp_path / "template"
    with BundleWriter(str(template / "ckpt-0")) as w:
        w.add("a", np.zeros((100, 100), np.float32))
        w.add("b", np.zeros((50, 50), np.float32))
    a, b = tf.Variable(np.zeros((100, 100), np.float32)), tf.Variable(np.zeros((50, 50), np.float32))
    r = cm.Restorer({"a": a, "b": b}, [cm.Source(str(template / "ckpt-0"))])
    progress = tmp_path / "restored"
    trainer = subprocess.Popen([sys.executable, "-c", UPLOADER, url, str(steps), str(progress)], cwd=REPO,
                               env=dict(os.environ, PYTHONPATH=REPO, **s3["env"]), stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
    restored, skipped = [], []
    try:
        for report in r.follow(url, timeout=DEADLINE, poll=POLL, until_step=steps,
                               on_skip=lambda i, e: skipped.append((i.step, str(e)))):
            step = report.checkpoint.step
            assert (a.numpy() == step).all() and (b.numpy() == -step).all(), step  # never torn or mixed
            restored.append(step)
            progress.write_text(str(step))
    finally:
        out, err = trainer.communicate(timeout=DEADLINE)
    assert trainer.returncode == 0, err
    assert skipped == [] and restored == list(range(1, steps + 1))
