"""Checkpoints in object storage: a real S3 API on localhost (moto's server), and memory://.

The S3 tests run moto's server on a free loopback port behind a small proxy that injects faults
(HTTP 500 and dropped connections on ranged reads) for the retry and atomicity tests
(tests/_remote_util.py): the same HTTP API a bucket speaks, no mocks of ckptmerge.
"""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from _forkserver import ForkServer
from _remote_util import start_s3, write_run

import ckptmerge as cm
from ckptmerge.core.errors import (
    CheckpointFormatError,
    CheckpointNotFoundError,
    RestoreError,
)

REPO = Path(__file__).resolve().parents[1]
W = np.arange(12, dtype=np.float32).reshape(3, 4)
BIG = np.random.default_rng(0).standard_normal((512, 1024)).astype(np.float32)  # 2 MiB




@pytest.fixture(scope="module")
def local_run(tmp_path_factory):
    d = tmp_path_factory.mktemp("run")
    write_run(d, W, BIG)
    return d


def _upload(fs, local: Path, url: str) -> None:
    for f in sorted(local.iterdir()):
        fs.pipe(f"{url}/{f.name}", f.read_bytes())


# -- memory:// (fast) -------------------------------------------------------------------------


@pytest.fixture
def memory_run(local_run):
    import fsspec

    fs = fsspec.filesystem("memory")
    url = f"memory://runs-{os.getpid()}-{id(local_run)}"
    _upload(fs, local_run, url)
    yield url
    fs.rm(url, recursive=True)


def test_memory_url_resolves_latest_step_and_lists_checkpoints(memory_run):
    assert [c.step for c in cm.checkpoints(memory_run)] == [100, 200]
    assert [c.latest for c in cm.checkpoints(memory_run)] == [False, True]
    np.testing.assert_array_equal(cm.load(memory_run, ["w"])["w"], W * 2)
    np.testing.assert_array_equal(cm.load(memory_run, ["w"], step=100)["w"], W)
    np.testing.assert_array_equal(cm.load(memory_run + "/ckpt-100.index", ["big"])["big"], BIG)


def test_state_file_with_absolute_paths_from_another_machine_resolves_by_basename(memory_run):
    import fsspec

    fs = fsspec.filesystem("memory")
    fs.pipe(f"{memory_run}/checkpoint", b'model_checkpoint_path: "/home/other/run/ckpt-100"\n'
                                        b'all_model_checkpoint_paths: "/home/other/run/ckpt-100"\n')
    resolved = cm.Source(memory_run).resolve()
    assert resolved.prefix == f"{memory_run}/ckpt-100" and resolved.step == 100


def test_missing_remote_checkpoint_and_step_are_clear_errors(memory_run):
    with pytest.raises(CheckpointNotFoundError, match="no checkpoint of step 7 .* steps there: 100, 200"):
        cm.Source(memory_run, step=7).resolve()
    with pytest.raises(CheckpointNotFoundError, match="does not exist"):
        cm.Source(memory_run + "-nope/ckpt-1").resolve()


def test_restore_from_memory_url_and_merge_to_local(tmp_path, memory_run):
    import tensorflow as tf

    w = tf.Variable(np.zeros((3, 4), np.float32))
    cm.restore({"w": w}, [cm.Source(memory_run, step=100)])
    np.testing.assert_array_equal(w.numpy(), W)
    cm.merge([cm.Source(memory_run)], str(tmp_path / "out" / "merged"))
    merged = tf.train.load_checkpoint(str(tmp_path / "out" / "merged"))
    np.testing.assert_array_equal(merged.get_tensor("model/big/.ATTRIBUTES/VARIABLE_VALUE"), BIG)  # (object-based)


# -- S3 on localhost --------------------------------------------------------------------------


@pytest.fixture(scope="module")
def s3(local_run):
    """A moto S3 server on localhost (behind a fault-injecting proxy) holding bucket 'ckpts'; its
    ``forks`` start the CLI runs (tests/_forkserver.py: each a process of its own, configured only
    by the environment, without paying Python's and ckptmerge's start-up each time)."""
    for s3 in start_s3(local_run):
        with ForkServer(CLI_PRELOAD, env=dict(os.environ, PYTHONPATH=str(REPO), **s3["env"])) as forks:
            yield dict(s3, forks=forks)


CLI_PRELOAD = ["ckptmerge.cli", "ckptmerge.merging.remote", "ckptmerge.merging.local", "s3fs", "aiobotocore.session"]


def _cli(s3, *args):
    out = s3["forks"].run(["-m", "ckptmerge", *args], timeout=120)
    return out.returncode, out.stdout, out.stderr


def test_cli_over_s3_ls_show_diff_checkpoints_plan_merge(s3, tmp_path):
    url = s3["url"]
    code, out, err = _cli(s3, "checkpoints", url)
    assert code == 0, err
    assert "ckpt-100" in out and "ckpt-200" in out
    code, out, err = _cli(s3, "ls", url)
    assert code == 0 and "big" in out and "(512, 1024)" in out, err
    code, out, err = _cli(s3, "show", url, "w", "--json")
    assert code == 0, err
    assert np.array_equal(np.float32(json.loads(out)["value"]), W * 2)
    code, out, err = _cli(s3, "diff", f"{url}/ckpt-100", f"{url}/ckpt-200", "--values")
    assert code == 1 and "w" in out, err
    config = tmp_path / "warm.yaml"
    config.write_text(f"sources:\n  - path: {url}\n    step: 100\n    include: ['w']\n")
    code, out, err = _cli(s3, "plan", config, "--target", f"{url}/ckpt-200")
    assert code in (0, 1) and "w <-" in out, err
    code, out, err = _cli(s3, "merge", config, "-o", tmp_path / "merged" / "out", "-q")
    assert code == 0, err
    np.testing.assert_array_equal(cm.load(str(tmp_path / "merged" / "out"))["w"], W)


def test_a_denied_lookup_beside_a_file_is_taken_as_absent(s3):
    """S3 answers 403, not 404, for a missing key to a client that may not list the bucket: the
    '<file>.index' probe (is it a TF prefix?) must not stop a safetensors file from being read."""
    s3["fs"].pipe(f"{s3['url']}/solo.safetensors", _safetensors_bytes({"w": W}))
    s3["proxy"].hook = lambda method, path: 403 if path.split("?")[0].endswith(".index") else None
    try:
        np.testing.assert_array_equal(cm.load(f"{s3['url']}/solo.safetensors")["w"], W)
    finally:
        s3["proxy"].hook = None


def _safetensors_bytes(values):
    from safetensors.numpy import save

    return save(values)


def test_restore_over_s3_reads_ranges_several_in_flight(s3):
    import tensorflow as tf

    big = tf.Variable(np.zeros_like(BIG))
    w = tf.Variable(np.zeros_like(W))
    before = s3["proxy"].ranged_gets
    report = cm.restore({"big": big, "w": w}, [cm.Source(s3["url"], step=100)])
    assert report.restored == ["big", "w"]
    np.testing.assert_array_equal(big.numpy(), BIG)
    np.testing.assert_array_equal(w.numpy(), W)
    assert s3["proxy"].ranged_gets > before  # tensors came by ranged reads, not whole-file downloads


@pytest.mark.parametrize("mode", ["500", "drop"])
def test_transient_s3_faults_mid_read_are_retried(s3, mode):
    s3["proxy"].mode, s3["proxy"].fail_ranged = mode, 2
    np.testing.assert_array_equal(cm.load(s3["url"], ["big"], step=100)["big"], BIG)
    assert s3["proxy"].fail_ranged == 0


def test_persistent_s3_failure_is_a_clear_error_and_restores_nothing(s3, monkeypatch):
    import tensorflow as tf

    monkeypatch.setenv("CKPTMERGE_REMOTE_RETRIES", "2")  # bounded either way; fewer waits in the test

    big = tf.Variable(np.full_like(BIG, 7.0))
    w = tf.Variable(np.full_like(W, 7.0))
    plan = cm.plan({"big": big, "w": w}, [cm.Source(s3["url"], step=100)])  # opened: index read
    s3["proxy"].mode, s3["proxy"].fail_ranged = "500", 10_000
    try:
        with pytest.raises(RestoreError) as info:
            plan.restore()
    finally:
        s3["proxy"].fail_ranged = 0
    assert "s3://ckpts/run/ckpt-100.data-00000-of-00001" in str(info.value)
    assert (big.numpy() == 7).all() and (w.numpy() == 7).all()


def test_missing_bucket_is_a_clear_error(s3):
    with pytest.raises((CheckpointNotFoundError, CheckpointFormatError), match="s3://no-such-bucket"):
        cm.load("s3://no-such-bucket/run")


# -- merge outputs in object storage ------------------------------------------------------------


def test_merge_to_memory_url_publishes_data_then_index_and_tf_reads_it_back(tmp_path, memory_run):
    import fsspec

    out = memory_run + "-out/merged"
    report = cm.merge([cm.Source(memory_run, step=100)], out)
    assert report.output == out
    fs = fsspec.filesystem("memory")
    assert sorted(n.rsplit("/", 1)[-1] for n in fs.ls(memory_run + "-out", detail=False)) == [
        "merged.data-00000-of-00001", "merged.index"]
    np.testing.assert_array_equal(cm.load(out, ["big"])["big"], BIG)
    with pytest.raises(cm.CkptMergeError, match="already exists"):
        cm.merge([cm.Source(memory_run)], out)
    cm.merge([cm.Source(memory_run)], out, overwrite=True)  # step 200: w doubled
    np.testing.assert_array_equal(cm.load(out, ["w"])["w"], W * 2)
    fs.rm(memory_run + "-out", recursive=True)


def test_an_interrupted_upload_leaves_no_index_and_removes_its_objects(memory_run, monkeypatch):
    import fsspec
    from fsspec.implementations.memory import MemoryFileSystem

    from ckptmerge.core.errors import CheckpointWriteError

    real = MemoryFileSystem.put_file
    calls = []

    def failing(self, lpath, rpath, *a, **kw):
        calls.append(rpath)
        if rpath.endswith(".index"):
            raise ConnectionResetError("connection reset by peer")
        return real(self, lpath, rpath, *a, **kw)

    monkeypatch.setattr(MemoryFileSystem, "put_file", failing)
    out = memory_run + "-broken/merged"
    with pytest.raises(CheckpointWriteError, match="objects it wrote were removed"):
        cm.merge([cm.Source(memory_run)], out)
    assert calls and calls[-1].endswith(".index") and calls[0].endswith(".data-00000-of-00001")
    fs = fsspec.filesystem("memory")
    assert not fs.exists(memory_run + "-broken/merged.index")
    assert not fs.exists(memory_run + "-broken/merged.data-00000-of-00001")


def test_cli_merge_to_s3(s3, tmp_path):
    config = tmp_path / "m.yaml"
    config.write_text(f"sources:\n  - path: {s3['url']}\n    step: 100\n")
    code, out, err = _cli(s3, "merge", config, "-o", "s3://ckpts/release/model", "-q")
    assert code == 0, err
    code, out, err = _cli(s3, "show", "s3://ckpts/release/model", "w", "--json")
    assert code == 0, err
    assert np.array_equal(np.float32(json.loads(out)["value"]), W)
    code, out, err = _cli(s3, "merge", config, "-o", "s3://ckpts/release/model")
    assert code == 2 and "--force" in err


def test_cli_merge_layout_torch_to_s3_writes_the_pytorch_file(s3, tmp_path):
    # (issue 19: the inverse direction to a URL; the fixture is what PyTorch loads strictly)
    import _xframe as X
    from safetensors.numpy import load, load_file

    keras = tmp_path / "keras.safetensors"  # the fixture's tensors under Keras names and layouts
    cm.merge([cm.Source(X.weights_file("bert"), layout="torch")], keras)
    config = tmp_path / "k.yaml"
    config.write_text(f"sources:\n  - path: {keras}\n")
    url = "s3://ckpts/xframe/model.safetensors"
    args = ["merge", config, "-o", url, "--layout", "torch", "--template", X.weights_file("bert")]
    code, out, err = _cli(s3, *args, "-q")
    assert code == 0, err
    got, want = load(s3["fs"].cat(url)), load_file(X.weights_file("bert"))
    assert sorted(got) == sorted(want)
    assert all(got[k].dtype == want[k].dtype and np.array_equal(got[k], want[k]) for k in want)
    code, out, err = _cli(s3, *args)
    assert code == 2 and "--force" in err


# -- remote merge outputs: the state file and the lock -------------------------------------------


def test_update_state_to_a_url_publishes_data_then_index_then_state_file(memory_run, monkeypatch):
    import fsspec
    from fsspec.implementations.memory import MemoryFileSystem

    order = []
    real_put, real_pipe = MemoryFileSystem.put_file, MemoryFileSystem.pipe_file

    def put(self, lpath, rpath, *a, **kw):
        order.append(rpath.rsplit("/", 1)[-1])
        return real_put(self, lpath, rpath, *a, **kw)

    def pipe(self, path, value, mode="overwrite", **kw):
        order.append(path.rsplit("/", 1)[-1])
        return real_pipe(self, path, value, mode, **kw)

    monkeypatch.setattr(MemoryFileSystem, "put_file", put)
    monkeypatch.setattr(MemoryFileSystem, "pipe_file", pipe)
    report = cm.merge([cm.Source(memory_run, step=100)], memory_run + "/merged", update_state=True)
    assert report.state_file == memory_run + "/checkpoint"
    assert order == ["merged.lock", "merged.data-00000-of-00001", "merged.index", "checkpoint"]
    text = fsspec.filesystem("memory").cat_file(memory_run + "/checkpoint").decode()
    assert text.splitlines()[0] == 'model_checkpoint_path: "merged"'
    assert 'all_model_checkpoint_paths: "ckpt-100"' in text  # the earlier entries are kept
    resolved = cm.Source(memory_run).resolve()
    assert resolved.prefix == memory_run + "/merged"
    np.testing.assert_array_equal(cm.load(memory_run, ["w"])["w"], W)
    assert [c.latest for c in cm.checkpoints(memory_run) if c.path.endswith("merged")] == [True]


def test_a_broken_remote_state_file_fails_before_anything_is_uploaded(memory_run):
    import fsspec

    fs = fsspec.filesystem("memory")
    fs.pipe(f"{memory_run}/checkpoint", b"model_checkpoint_path: ")
    with pytest.raises(CheckpointFormatError, match="checkpoint"):
        cm.merge([cm.Source(memory_run, step=100)], memory_run + "/merged", update_state=True)
    assert not fs.exists(memory_run + "/merged.index")
    assert not fs.exists(memory_run + "/merged.data-00000-of-00001")
    assert not fs.exists(memory_run + "/merged.lock")


def test_update_state_is_refused_for_a_safetensors_url(memory_run):
    with pytest.raises(cm.ArgumentError, match="update_state applies to TF checkpoints"):
        cm.merge([cm.Source(memory_run, step=100)], memory_run + "-st/model.safetensors", update_state=True)


def test_a_held_lock_on_s3_stops_a_second_merge_and_names_its_holder(s3):
    import fsspec

    from ckptmerge.core.errors import OutputLockedError

    fs = fsspec.filesystem("s3")
    out = "s3://ckpts/locked/model"
    fs.pipe(out + ".lock", json.dumps({"host": "trainer-7", "pid": 4242, "started": time.time(), "token": "t",
                                       "output": out, "machine": "another-boot/1"}).encode())
    with pytest.raises(OutputLockedError) as info:
        cm.merge([cm.Source(s3["url"], step=100)], out)
    assert info.value.path == out + ".lock"
    assert "process 4242 on host 'trainer-7'" in str(info.value) and "delete the object" in str(info.value)
    assert not fs.exists(out + ".index") and not fs.exists(out + ".data-00000-of-00001")
    assert fs.exists(out + ".lock")  # someone else's lock is never removed
    fs.rm(out + ".lock")  # as the message says: the holder is gone, delete it
    cm.merge([cm.Source(s3["url"], step=100)], out)
    assert fs.exists(out + ".index") and not fs.exists(out + ".lock")


def test_two_concurrent_merges_to_one_s3_prefix_one_fails_with_the_lock(s3):
    import fsspec

    from ckptmerge.core.errors import OutputLockedError

    out = "s3://ckpts/race/model"
    inside, release = threading.Event(), threading.Event()
    errors = []

    def slow_progress(done, total):
        inside.set()
        release.wait(60)

    def first():
        try:
            cm.merge([cm.Source(s3["url"], step=100)], out, progress=slow_progress)
        except Exception as e:  # noqa: BLE001
            errors.append(e)

    t = threading.Thread(target=first)
    t.start()
    try:
        assert inside.wait(60)  # the first merge holds the lock and is merging
        with pytest.raises(OutputLockedError, match=f"{os.getpid()}"):
            cm.merge([cm.Source(s3["url"])], out, overwrite=True)
    finally:
        release.set()
        t.join(60)
    assert errors == []
    fs = fsspec.filesystem("s3")
    assert not fs.exists(out + ".lock")
    np.testing.assert_array_equal(cm.load(out, ["w"])["w"], W)  # the first merge's output (step 100)


def test_a_failed_remote_merge_releases_its_lock(memory_run):
    import fsspec

    out = memory_run + "-fail/merged"
    with pytest.raises(cm.PlanError):
        cm.merge([cm.Source(memory_run, include=["nothing*"], map={"w": "x"})], out,
                 template=[cm.VariableInfo("y", (3, 4), "float32")])
    assert not fsspec.filesystem("memory").exists(out + ".lock")


def test_a_store_without_exclusive_create_is_a_clear_error(memory_run, monkeypatch):
    import fsspec
    from fsspec.implementations.memory import MemoryFileSystem
    from fsspec.spec import AbstractFileSystem

    class PlainMemory(MemoryFileSystem):  # fsspec's generic check-then-write: not atomic
        protocol = "plainmem"
        pipe_file = AbstractFileSystem.pipe_file

    fsspec.register_implementation("plainmem", PlainMemory, clobber=True)
    with pytest.raises(cm.CkptMergeError, match="no atomic create-if-absent.*CKPTMERGE_REMOTE_LOCK=0"):
        cm.merge([cm.Source(memory_run, step=100)], "plainmem://out/merged")
    monkeypatch.setenv("CKPTMERGE_REMOTE_LOCK", "0")
    cm.merge([cm.Source(memory_run, step=100)], "plainmem://out/merged")
    np.testing.assert_array_equal(cm.load("plainmem://out/merged", ["w"])["w"], W)


def test_cli_merge_to_s3_with_update_state(s3, tmp_path):
    config = tmp_path / "m.yaml"
    config.write_text(f"sources:\n  - path: {s3['url']}\n    step: 100\n")
    code, out, err = _cli(s3, "merge", config, "-o", "s3://ckpts/stated/model-5", "--update-state")
    assert code == 0, err
    assert "State file: s3://ckpts/stated/checkpoint" in out
    code, out, err = _cli(s3, "checkpoints", "s3://ckpts/stated")
    assert code == 0 and "model-5" in out, err


# -- every format by URL: safetensors, NumPy, Keras h5 / .keras, TF V1 ----------------------------


@pytest.fixture(scope="module")
def format_files(tmp_path_factory):
    """One small checkpoint of each single-file or folder format, written by its own library."""
    import keras
    from safetensors.numpy import save_file

    from tests._reader_util import write_saver_checkpoint

    d = tmp_path_factory.mktemp("formats")
    save_file({"w": W, "big": BIG}, str(d / "model.safetensors"))
    (d / "sharded").mkdir()
    save_file({"w": W}, str(d / "sharded" / "model-00001-of-00002.safetensors"))
    save_file({"big": BIG}, str(d / "sharded" / "model-00002-of-00002.safetensors"))
    (d / "sharded" / "model.safetensors.index.json").write_text(json.dumps(
        {"metadata": {}, "weight_map": {"w": "model-00001-of-00002.safetensors",
                                        "big": "model-00002-of-00002.safetensors"}}))
    np.savez(d / "arrays.npz", **{"w": W, "scope/big": BIG})
    np.savez_compressed(d / "packed.npz", w=W, big=BIG)
    (d / "npy" / "scope").mkdir(parents=True)
    np.save(d / "npy" / "w.npy", W)
    np.save(d / "npy" / "scope" / "big.npy", BIG)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3, name="d")], name="net")
    model.layers[0].kernel.assign(np.arange(12, dtype=np.float32).reshape(4, 3))
    model.save_weights(str(d / "net.weights.h5"))
    model.save(str(d / "net.keras"))
    model.save(str(d / "legacy.h5"))
    write_saver_checkpoint(str(d / "v1.ckpt"), [{"name": "w", "value": W, "dtype": "float32"},
                                                {"name": "big", "value": BIG, "dtype": "float32"}], v1=True)
    (d / "v1set").mkdir()
    write_saver_checkpoint(str(d / "v1set" / "model.ckpt-42"),
                           [{"name": "w", "value": W, "dtype": "float32", "device": 0},
                            {"name": "emb", "value": BIG[:9, :2].copy(), "dtype": "float32", "device": 1,
                             "partitions": 3}], sharded=True, v1=True)
    return d


_FORMAT_PATHS = ["model.safetensors", "sharded", "sharded/model.safetensors.index.json", "arrays.npz",
                 "packed.npz", "npy", "net.weights.h5", "net.keras", "legacy.h5", "v1.ckpt",
                 "v1set/model.ckpt-42-?????-of-00002", "v1set/model.ckpt-42-00001-of-00002", "v1set"]


@pytest.fixture(scope="module")
def memory_formats(format_files):
    import fsspec

    fs = fsspec.filesystem("memory")
    url = f"memory://formats-{os.getpid()}"
    for f in sorted(format_files.rglob("*")):
        if f.is_file():
            fs.pipe(f"{url}/{f.relative_to(format_files).as_posix()}", f.read_bytes())
    yield url
    fs.rm(url, recursive=True)


@pytest.mark.parametrize("name", _FORMAT_PATHS)
def test_every_format_reads_by_url_as_from_disk(format_files, memory_formats, name):
    local, url = str(format_files / name), f"{memory_formats}/{name}"
    expected = cm.load(local)
    assert [(v.name, v.shape, v.dtype) for v in cm.list_variables(url)] == \
        [(v.name, v.shape, v.dtype) for v in cm.list_variables(local)]
    got = cm.load(url)
    assert sorted(got) == sorted(expected)
    for k in expected:
        np.testing.assert_array_equal(got[k], expected[k])


def test_safetensors_over_s3_restores_with_ranged_reads_and_merges(s3, format_files, tmp_path):
    import fsspec
    import tensorflow as tf

    fs = fsspec.filesystem("s3")
    fs.put_file(str(format_files / "model.safetensors"), "ckpts/st/model.safetensors")
    url = "s3://ckpts/st/model.safetensors"
    big, w = tf.Variable(np.zeros_like(BIG)), tf.Variable(np.zeros_like(W))
    before = s3["proxy"].ranged_gets
    cm.restore({"big": big, "w": w}, [cm.Source(url)])
    np.testing.assert_array_equal(big.numpy(), BIG)
    np.testing.assert_array_equal(w.numpy(), W)
    assert s3["proxy"].ranged_gets > before  # header, then each tensor's range
    cm.merge([cm.Source(url)], str(tmp_path / "merged"))
    np.testing.assert_array_equal(cm.load(str(tmp_path / "merged"), ["big"])["big"], BIG)


def test_cli_over_s3_reads_keras_npz_and_v1_files(s3, format_files):
    import fsspec

    fs = fsspec.filesystem("s3")
    for name in ("net.keras", "net.weights.h5", "arrays.npz", "v1.ckpt"):
        fs.put_file(str(format_files / name), f"ckpts/formats/{name}")
    code, out, err = _cli(s3, "ls", "s3://ckpts/formats/net.keras")
    assert code == 0 and "(4, 3)" in out, err
    code, out, err = _cli(s3, "show", "s3://ckpts/formats/arrays.npz", "scope/big", "--json")
    assert code == 0, err
    assert json.loads(out)["shape"] == [512, 1024]
    code, out, err = _cli(s3, "diff", "s3://ckpts/formats/net.weights.h5", format_files / "net.weights.h5",
                          "--values")
    assert code == 0, out + err  # the remote copy reads exactly as the local file
    code, out, err = _cli(s3, "show", "s3://ckpts/formats/v1.ckpt", "w", "--json")
    assert code == 0, err
    assert np.array_equal(np.float32(json.loads(out)["value"]), W)


def test_a_truncated_remote_safetensors_or_npz_is_a_clear_error(format_files, memory_formats):
    import fsspec

    fs = fsspec.filesystem("memory")
    data = (format_files / "model.safetensors").read_bytes()
    fs.pipe(f"{memory_formats}-bad/cut.safetensors", data[: len(data) // 2])
    with pytest.raises(CheckpointFormatError, match=r"cut\.safetensors.*ends at byte"):
        cm.list_variables(f"{memory_formats}-bad/cut.safetensors")
    fs.pipe(f"{memory_formats}-bad/huge.safetensors", (10 ** 9).to_bytes(8, "little") + data[8:64])
    with pytest.raises(CheckpointFormatError, match=r"huge\.safetensors: the header claims 1000000000 bytes"):
        cm.list_variables(f"{memory_formats}-bad/huge.safetensors")  # named .safetensors: it says what is wrong
    npz = (format_files / "arrays.npz").read_bytes()
    fs.pipe(f"{memory_formats}-bad/cut.npz", npz[: len(npz) - 100])
    with pytest.raises(CheckpointFormatError, match="cut.npz"):
        cm.load(f"{memory_formats}-bad/cut.npz")
    fs.rm(f"{memory_formats}-bad", recursive=True)


def test_a_keras_model_restores_from_a_remote_keras_archive(memory_formats):
    import keras

    fresh = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3, name="d")], name="net")
    report = cm.restore(fresh, [cm.Source(f"{memory_formats}/net.keras")])
    assert sorted(report.restored) == ["net/d/bias", "net/d/kernel"]
    np.testing.assert_array_equal(fresh.layers[0].kernel.numpy(), np.arange(12, dtype=np.float32).reshape(4, 3))


def test_a_file_url_output_is_a_local_merge_into_folders_it_creates(memory_run, tmp_path):
    # file:// is a local path: the folders are created, the publish is the local atomic one
    # (its flock, no lock object), and a local source is refused as the output however it is named
    out = f"file://{tmp_path}/new/deeper/merged"
    report = cm.merge([cm.Source(memory_run, step=100)], out)
    assert report.output == out
    assert sorted(p.name for p in (tmp_path / "new" / "deeper").iterdir()) == [
        "merged.data-00000-of-00001", "merged.index"]
    np.testing.assert_array_equal(cm.load(str(tmp_path / "new" / "deeper" / "merged"), ["w"])["w"], W)
    with pytest.raises(cm.CkptMergeError, match="already exists"):
        cm.merge([cm.Source(memory_run, step=100)], out)
    local = str(tmp_path / "new" / "deeper" / "merged")
    for source, output in ((local, out), (out, local), (out, f"file://{tmp_path}/new/../new/deeper/merged")):
        with pytest.raises(cm.ArgumentError, match="is the checkpoint of"):
            cm.merge([cm.Source(source)], output, overwrite=True)
    np.testing.assert_array_equal(cm.load(local, ["w"])["w"], W)


def test_cli_merge_to_a_file_url_in_a_missing_folder(memory_run, tmp_path):
    import fsspec
    from _cli_util import run, write_config

    local = tmp_path / "src"
    local.mkdir()
    for name in fsspec.filesystem("memory").ls(memory_run, detail=False):
        (local / name.rsplit("/", 1)[-1]).write_bytes(fsspec.filesystem("memory").cat_file(name))
    config = write_config(tmp_path / "m.yaml", f"sources:\n  - path: {local}\n    step: 100\n")
    r = run("merge", config, "-o", f"file://{tmp_path}/out/sub/merged", "-q")
    assert r.exit_code == 0, r.output
    np.testing.assert_array_equal(cm.load(str(tmp_path / "out" / "sub" / "merged"), ["w"])["w"], W)


def test_a_persistent_s3_failure_reading_safetensors_names_the_url_and_tensor(s3, format_files, monkeypatch):
    import fsspec

    from ckptmerge.formats import open_checkpoint

    monkeypatch.setenv("CKPTMERGE_REMOTE_RETRIES", "2")
    fsspec.filesystem("s3").put_file(str(format_files / "model.safetensors"), "ckpts/stfail/model.safetensors")
    url = "s3://ckpts/stfail/model.safetensors"
    reader = open_checkpoint(url)  # the header is read here
    s3["proxy"].mode, s3["proxy"].fail_ranged = "500", 10_000
    try:
        with pytest.raises(CheckpointFormatError) as info:
            reader.get("big")
    finally:
        s3["proxy"].fail_ranged = 0
        reader.close()
    assert url in str(info.value) and "'big'" in str(info.value)


def test_a_remote_directory_of_keras_weights_files_resolves_as_a_local_one(format_files, tmp_path):
    # the only .weights.h5 of a directory, the highest step of several, or the step asked for;
    # and `checkpoints` lists them: the same answers for the directory on disk and by URL
    import shutil

    import fsspec

    from ckptmerge.sources.resolve import resolve_checkpoint

    fs = fsspec.filesystem("memory")
    local = tmp_path / "kdir"
    local.mkdir()
    shutil.copy(format_files / "net.weights.h5", local / "model-3.weights.h5")
    url = f"memory://kdir-{tmp_path.name}"
    fs.pipe(f"{url}/model-3.weights.h5", (local / "model-3.weights.h5").read_bytes())
    try:
        for where in (str(local), url):
            assert resolve_checkpoint(where).prefix.endswith("model-3.weights.h5")
            np.testing.assert_array_equal(cm.load(where)["layers/dense/vars/0"], np.arange(12, dtype=np.float32).reshape(4, 3))
        shutil.copy(format_files / "net.weights.h5", local / "model-7.weights.h5")
        fs.pipe(f"{url}/model-7.weights.h5", (local / "model-7.weights.h5").read_bytes())
        for where in (str(local), url):
            assert resolve_checkpoint(where).step == 7
            assert resolve_checkpoint(where, step=3).prefix.endswith("model-3.weights.h5")
            assert [c.step for c in cm.checkpoints(where)] == [3, 7]
    finally:
        fs.rm(url, recursive=True)


@pytest.mark.parametrize("package, name", [("gcsfs", "GCSFileSystem"), ("adlfs", "AzureBlobFileSystem")])
def test_gcs_and_azure_filesystems_count_as_stores_with_an_atomic_create(package, name, monkeypatch):
    # the lock of a remote merge needs pipe_file(mode="create") to be a conditional upload: gcsfs
    # takes `mode` itself, adlfs through **kwargs from 2024.12.0 on (the real classes, looked at as
    # create_exclusive looks at them)
    import importlib

    from ckptmerge.formats import storage

    fs = object.__new__(getattr(importlib.import_module(package), name))
    assert storage._has_exclusive_create(fs)
    if package == "adlfs":  # an adlfs older than the one that honours mode="create" is refused
        monkeypatch.setitem(storage._CREATE_BY_KWARGS, "adlfs", (2999, 1, 0))
        assert not storage._has_exclusive_create(fs)


def test_a_url_whose_filesystem_is_not_installed_names_the_pip_command():
    # fsspec knows the scheme but cannot import its package: one clear error naming the extra
    import fsspec

    fsspec.register_implementation("nopkgfs", "ckptmerge_no_such_package.NoFileSystem", clobber=True,
                                   errtxt="install ckptmerge_no_such_package")
    for call in (lambda: cm.list_variables("nopkgfs://bucket/run/ckpt-1"),
                 lambda: cm.merge([cm.Source("nopkgfs://bucket/run/ckpt-1")], "out")):
        with pytest.raises(cm.CkptMergeError, match=r"the filesystem for 'nopkgfs://' is not installed.*"
                                                     r"pip install \"ckptmerge\[remote\]\""):
            call()
    from _cli_util import assert_one_line_error, run

    r = run("ls", "nopkgfs://bucket/run/ckpt-1")
    assert r.exit_code == 2
    assert_one_line_error(r, "the filesystem for 'nopkgfs://' is not installed", 'pip install "ckptmerge[remote]"')
