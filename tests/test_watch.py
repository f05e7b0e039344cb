"""``cm.watch``: each new complete checkpoint of a training directory, in step order, pinned.

TensorFlow's own ``checkpoints_iterator`` / ``wait_for_new_checkpoint`` tests
(``tensorflow/python/training/checkpoint_utils_test.py`` and its iterator tests) come first,
ported as behaviour tests; then what TF's iterator gets wrong (backlogs, ``timeout_fn`` only on
a timeout, checkpoints still being written, damaged ones, cleanup racing the reader). Files are
written by TensorFlow, Keras and safetensors themselves, or by ckptmerge's TF-free bundle writer
where a test writes many. Polls are short; nothing waits on a sleep: writers signal what they
did, and deadlines are generous for a loaded machine.
"""

from __future__ import annotations

import os
import pathlib
import shutil
import threading
import time

import numpy as np
import pytest

import ckptmerge as cm
from ckptmerge.core.errors import ArgumentError, CheckpointFormatError, CheckpointNotFoundError
from ckptmerge.formats import open_checkpoint
from ckptmerge.formats.tf.writer import BundleWriter
from ckptmerge.following import watch as watch_module
from ckptmerge.following.pins import PIN_PREFIX
from ckptmerge.following.watch import intact

POLL = 0.02
DEADLINE = 120.0  # seconds: generous, the machine is shared


def bundle(directory, step, value=None, name="ckpt"):
    """A name-based TF checkpoint ``ckpt-STEP`` holding ``w`` = ``value`` (default: step)."""
    prefix = os.path.join(str(directory), f"{name}-{step}")
    with BundleWriter(prefix) as w:
        w.add("w", np.full(4, step if value is None else value, np.float32))
    return prefix


def read_w(path):
    with open_checkpoint(path) as r:
        return r.get("w")


def steps(loop):
    return [info.step for info in loop]


def wait_for(condition, what):
    deadline = time.monotonic() + DEADLINE
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}")
        time.sleep(0.01)


# -- TensorFlow's own tests, ported ----------------------------------------------------------------


def test_returns_empty_if_no_checkpoints_found(tmp_path):
    assert steps(cm.watch(tmp_path / "no_checkpoints_found", timeout=0)) == []


def test_returns_single_checkpoint_if_one_checkpoint_found(tf, tmp_path):
    a = tf.Variable(5)
    tf.train.Checkpoint(a=a).save(file_prefix=str(tmp_path / "one_checkpoint_found" / "model.ckpt"))
    found = list(cm.watch(str(tmp_path / "one_checkpoint_found"), timeout=0))
    assert [i.step for i in found] == [1]
    assert found[0].path == str(tmp_path / "one_checkpoint_found" / "model.ckpt-1")


def test_works_with_fspath(tf, tmp_path):
    directory = pathlib.Path(tmp_path) / "one_checkpoint_found"
    tf.train.Checkpoint(a=tf.Variable(5)).save(file_prefix=directory / "model.ckpt")
    assert steps(cm.watch(directory, timeout=0)) == [1]


def test_returns_single_checkpoint_if_one_sharded_checkpoint(tf, tmp_path):
    directory = tmp_path / "one_checkpoint_found_sharded"
    directory.mkdir()
    with tf.Graph().as_default():
        global_step = tf.compat.v1.Variable(0, name="v0")
        with tf.device("/cpu:0"):
            tf.compat.v1.Variable(10, name="v1")
        with tf.device("/cpu:1"):
            tf.compat.v1.Variable(20, name="v2")
        saver = tf.compat.v1.train.Saver(sharded=True)
        config = tf.compat.v1.ConfigProto(device_count={"CPU": 2})
        with tf.compat.v1.Session(config=config) as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            saver.save(sess, str(directory / "model.ckpt"), global_step=global_step)
    assert len(list(directory.glob("model.ckpt-0.data-*"))) >= 2  # really sharded
    assert steps(cm.watch(directory, timeout=0)) == [0]


def test_timeout_fn_is_called_until_it_says_stop(tmp_path):
    calls = [0]

    def timeout_fn():
        calls[0] += 1
        return calls[0] > 3

    assert list(cm.watch(tmp_path / "non-existent-dir", timeout=0.1, timeout_fn=timeout_fn, poll=POLL)) == []
    assert calls[0] == 4


def test_wait_for_new_checkpoint_returns_none_after_the_timeout(tmp_path):
    start = time.monotonic()
    assert next(cm.watch(tmp_path / "non-existent-dir", timeout=0.2, poll=0.05), None) is None
    elapsed = time.monotonic() - start
    assert elapsed >= 0.2  # it waited the whole timeout
    assert elapsed < 0.2 + 30  # and then stopped (generous: the machine is shared)


# -- backlog, order, after, until_step ------------------------------------------------------------------


def test_backlog_all_yields_every_checkpoint_oldest_first_and_latest_only_the_newest(tmp_path):
    for s in (3, 1, 20, 7):
        bundle(tmp_path, s)
    assert steps(cm.watch(tmp_path, timeout=0)) == [1, 3, 7, 20]
    assert steps(cm.watch(tmp_path, timeout=0, backlog="latest")) == [20]


def test_after_and_until_step_bound_the_steps(tmp_path):
    for s in (1, 2, 3, 4, 5):
        bundle(tmp_path, s)
    assert steps(cm.watch(tmp_path, after=2, timeout=0)) == [3, 4, 5]
    assert steps(cm.watch(tmp_path, until_step=3, timeout=30)) == [1, 2, 3]  # stops there, no wait
    infos = list(cm.watch(tmp_path, timeout=0))
    assert steps(cm.watch(tmp_path, after=infos[3], timeout=0)) == [5]


def test_new_checkpoints_come_as_they_are_written_and_each_value_is_its_own(tmp_path):
    bundle(tmp_path, 1)
    seen = []
    for info in cm.watch(tmp_path, timeout=DEADLINE, poll=POLL, until_step=4):
        seen.append((info.step, float(read_w(info.read_path)[0])))
        if info.step < 4:
            bundle(tmp_path, info.step + 1)
    assert seen == [(1, 1.0), (2, 2.0), (3, 3.0), (4, 4.0)]


def test_new_means_a_higher_step_not_another_path(tmp_path):
    bundle(tmp_path, 5)
    loop = cm.watch(tmp_path, timeout=DEADLINE, poll=POLL)
    assert next(loop).step == 5
    bundle(tmp_path, 3)  # a lower step written later (e.g. a restarted trainer) is not "new"
    bundle(tmp_path, 6)
    assert next(loop).step == 6
    loop.close()


def test_timeout_fn_is_called_only_on_a_timeout(tmp_path):
    for s in (1, 2, 3):
        bundle(tmp_path, s)
    calls = []
    found = steps(cm.watch(tmp_path, timeout=0.2, poll=POLL, timeout_fn=lambda: calls.append(1) or True))
    assert found == [1, 2, 3] and calls == [1]  # not once per checkpoint, as TF's loop did


def test_timeout_fn_false_keeps_waiting_for_the_next_checkpoint(tmp_path):
    calls = []

    def timeout_fn():
        calls.append(1)
        if len(calls) == 1:
            bundle(tmp_path, 9)  # arrives after the first timeout
            return False
        return True

    assert steps(cm.watch(tmp_path, timeout=0.1, poll=POLL, timeout_fn=timeout_fn)) == [9]
    assert len(calls) == 2


@pytest.mark.parametrize("kwargs, error, match", [
    ({"backlog": "newest"}, ArgumentError, "backlog must be one of 'all', 'latest'"),
    ({"poll": 0}, ArgumentError, "poll must be positive"),
    ({"timeout": -1}, ArgumentError, "timeout must be zero or more"),
    ({"timeout": "5"}, cm.ArgumentTypeError, "timeout must be a number"),
    ({"after": 1.5}, cm.ArgumentTypeError, "after must be a step"),
    ({"timeout_fn": 3}, cm.ArgumentTypeError, "timeout_fn must be a callable"),
])
def test_bad_arguments_are_clear_errors_raised_by_the_call(tmp_path, kwargs, error, match):
    with pytest.raises(error, match=match):
        cm.watch(tmp_path, **kwargs)


def test_a_file_or_a_checkpoint_prefix_is_not_a_directory_to_watch(tmp_path):
    prefix = bundle(tmp_path, 1)
    with pytest.raises(ArgumentError, match="is a checkpoint prefix, not a directory.*ckptmerge watch"):
        cm.watch(prefix)
    with pytest.raises(ArgumentError, match="is not a directory"):
        cm.watch(prefix + ".index")


def test_a_directory_that_appears_later_is_watched(tmp_path):
    later = tmp_path / "run"
    loop = cm.watch(later, timeout=DEADLINE, poll=POLL)
    threading.Thread(target=lambda: bundle(later, 1)).start()  # BundleWriter makes the directory
    assert next(loop).step == 1
    loop.close()


def test_checkpoints_without_a_step_are_not_followed_and_said_so_once(tmp_path, caplog):
    prefix = os.path.join(tmp_path, "final")
    with BundleWriter(prefix) as w:
        w.add("w", np.zeros(2, np.float32))
    bundle(tmp_path, 2)
    with caplog.at_level("WARNING", logger="ckptmerge"):
        assert steps(cm.watch(tmp_path, timeout=0.1, poll=POLL)) == [2]
    said = [r for r in caplog.records if "final.index has no step" in r.getMessage()]
    assert len(said) == 1


# -- complete, never torn: checkpoints still being written ------------------------------------------------


def _whole_file(tmp_path, kind):
    import zipfile

    import h5py

    if kind == "index":
        return bundle(tmp_path, 1) + ".index"
    path = str(tmp_path / f"f.{kind}")
    if kind == "h5":
        with h5py.File(path, "w") as f:
            f.create_dataset("layers/dense/vars/0", data=np.ones((50, 40), np.float32))
    elif kind == "safetensors":
        from safetensors.numpy import save_file

        save_file({"a": np.ones((50, 40), np.float32)}, path)
    else:
        with zipfile.ZipFile(path, "w") as z:
            z.writestr("model.weights.h5", b"x" * 5000)
    return path


@pytest.mark.parametrize("kind", ["index", "h5", "safetensors", "keras"])
def test_a_file_cut_anywhere_is_not_whole_and_the_whole_file_is(tmp_path, kind):
    from ckptmerge.formats.whole import unfinished

    path = _whole_file(tmp_path, kind)
    data = pathlib.Path(path).read_bytes()
    assert unfinished(path) is None
    cut = str(tmp_path / ("cut" + path[path.index("."):] if kind != "index" else "cut.index"))
    for n in sorted({0, 1, 8, 30, len(data) // 2, len(data) - 1}):
        pathlib.Path(cut).write_bytes(data[:n])
        assert unfinished(cut), (kind, n)  # a reason, never "whole"


def test_an_hdf5_file_still_open_for_writing_is_not_whole(tmp_path):
    import h5py

    from ckptmerge.formats.whole import hdf5_unfinished

    for libver in ("earliest", "latest"):
        path = str(tmp_path / f"w-{libver}.weights.h5")
        f = h5py.File(path, "w", libver=libver)
        f.create_dataset("x", data=np.zeros(100000))
        f.flush() if libver == "latest" else None  # a flushed v3 file still says it is open
        assert hdf5_unfinished(path), libver
        f.close()
        assert hdf5_unfinished(path) is None


def _slow_copy(files, dest, done, chunk=97):
    """Copy ``files`` (in the order given) into ``dest`` in small pieces, in place, as a slow
    uploader or ``cp`` would; set ``done`` after the last byte."""
    done.files = [(dest / os.path.basename(f), os.path.getsize(f)) for f in files]
    for f in files:
        data = pathlib.Path(f).read_bytes()
        with open(dest / os.path.basename(f), "wb") as out:
            for i in range(0, len(data), chunk):
                out.write(data[i:i + chunk])
                out.flush()
                time.sleep(0.002)  # the slow writer's pace (not a synchronisation)
    done.set()


def all_written(done):
    """Whether every file of a :func:`_slow_copy` is there with all its bytes."""
    return all(dst.exists() and dst.stat().st_size == size for dst, size in done.files)


def test_shards_written_slowly_and_out_of_order_are_waited_for_never_yielded_torn(tf, tmp_path):
    staging, watched = tmp_path / "staging", tmp_path / "run"
    staging.mkdir()
    watched.mkdir()
    rng = np.random.default_rng(0)
    values = {"v1": rng.standard_normal((64, 16)).astype(np.float32),
              "v2": rng.standard_normal((32, 16)).astype(np.float32)}
    with tf.Graph().as_default():
        with tf.device("/cpu:0"):
            v1 = tf.compat.v1.Variable(values["v1"], name="v1")
        with tf.device("/cpu:1"):
            v2 = tf.compat.v1.Variable(values["v2"], name="v2")
        saver = tf.compat.v1.train.Saver([v1, v2], sharded=True)
        with tf.compat.v1.Session(config=tf.compat.v1.ConfigProto(device_count={"CPU": 2})) as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            prefix = saver.save(sess, str(staging / "model.ckpt"), global_step=7, write_state=False)
    shards = sorted(staging.glob("model.ckpt-7.data-*"))
    assert len(shards) == 2
    # the index first, then the last shard, then the first: each slowly, in place
    done = threading.Event()
    writer = threading.Thread(target=_slow_copy, args=([prefix + ".index", shards[1], shards[0]], watched, done))
    skipped = []
    loop = cm.watch(watched, timeout=DEADLINE, poll=POLL, on_skip=lambda i, e: skipped.append(e))
    writer.start()
    info = next(loop)
    assert all_written(done)  # yielded only once the last byte was there
    assert info.step == 7 and skipped == []
    with open_checkpoint(info.read_path) as r:
        np.testing.assert_array_equal(r.get("v1"), values["v1"])
        np.testing.assert_array_equal(r.get("v2"), values["v2"])
    loop.close()
    writer.join()


def test_a_keras_weights_file_written_in_place_is_yielded_only_when_whole(tmp_path):
    import keras

    staging, watched = tmp_path / "staging", tmp_path / "run"
    staging.mkdir()
    watched.mkdir()
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(64), keras.layers.Dense(3)])
    model.save_weights(str(staging / "ckpt-3.weights.h5"))
    done = threading.Event()
    writer = threading.Thread(target=_slow_copy, args=([staging / "ckpt-3.weights.h5"], watched, done, 4096))
    loop = cm.watch(watched, timeout=DEADLINE, poll=POLL)
    writer.start()
    info = next(loop)
    assert all_written(done) and info.step == 3
    assert len(cm.list_variables(info.read_path)) == 4
    loop.close()
    writer.join()


def test_safetensors_step_folders_wait_for_every_shard(tmp_path):
    from safetensors.numpy import save_file

    staging, watched = tmp_path / "staging", tmp_path / "run"
    staging.mkdir()
    watched.mkdir()
    a, b = np.arange(3000, dtype=np.float32), np.ones((40, 50), np.float32)
    save_file({"a": a}, str(staging / "model-00001-of-00002.safetensors"))
    save_file({"b": b}, str(staging / "model-00002-of-00002.safetensors"))
    folder = watched / "checkpoint-500"
    folder.mkdir()
    done = threading.Event()
    writer = threading.Thread(target=_slow_copy, args=(
        [staging / "model-00002-of-00002.safetensors", staging / "model-00001-of-00002.safetensors"], folder, done, 2048))
    loop = cm.watch(watched, timeout=DEADLINE, poll=POLL)
    writer.start()
    info = next(loop)
    assert all_written(done) and info.step == 500 and info.path == str(folder)
    got = cm.load(info.read_path)
    np.testing.assert_array_equal(got["a"], a)
    np.testing.assert_array_equal(got["b"], b)
    loop.close()
    writer.join()


def test_an_empty_step_folder_is_waited_for_not_an_error(tmp_path):
    # A trainer makes checkpoint-500/ first and copies its shards in afterwards: a look between
    # the two finds the folder with no file in it (this raised StopIteration from the pinning).
    (tmp_path / "checkpoint-500").mkdir()
    assert steps(cm.watch(tmp_path, timeout=0)) == []
    from safetensors.numpy import save_file

    save_file({"a": np.zeros(2, np.float32)}, str(tmp_path / "checkpoint-500" / "model.safetensors"))
    assert steps(cm.watch(tmp_path, timeout=0)) == [500]


def test_keras_weights_series_and_safetensors_files_are_followed_by_step(tmp_path):
    import keras
    from safetensors.numpy import save_file

    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    for epoch in (1, 2):
        model.save_weights(str(tmp_path / f"ckpt-{epoch}.weights.h5"))
    save_file({"x": np.zeros(2, np.float32)}, str(tmp_path / "model-30.safetensors"))
    save_file({"x": np.zeros(2, np.float32)}, str(tmp_path / "model-00001-of-00002.safetensors"))  # a shard
    assert steps(cm.watch(tmp_path, timeout=0)) == [1, 2, 30]


def test_orbax_step_folders_are_followed(tmp_path):
    pytest.importorskip("tensorstore")
    from ckptmerge.formats.orbax.writer import OrbaxWriter

    for s in (100, 200):  # what Orbax's CheckpointManager leaves: run/100, run/200 (renamed when whole)
        with OrbaxWriter(tmp_path / "run" / str(s), [("params/w", "float32", (4,))]) as w:
            w.add("params/w", np.full(4, s, np.float32))
    got = [(i.step, float(cm.load(i.read_path)["params/w"][0])) for i in cm.watch(tmp_path / "run", timeout=0)]
    assert got == [(100, 100.0), (200, 200.0)]


def test_a_step_folder_written_under_a_temporary_name_is_followed_once_renamed(tmp_path):
    from safetensors.numpy import save_file

    run = tmp_path / "run"
    for name in ("tmp-checkpoint-500", "700.orbax-checkpoint-tmp-1733"):  # Hugging Face's, Orbax's
        (run / name).mkdir(parents=True)
        save_file({"w": np.ones(2, np.float32)}, str(run / name / "model.safetensors"))
    assert steps(cm.watch(run, timeout=0)) == []  # a timestamp is no step, a folder being written no checkpoint
    (run / "tmp-checkpoint-500").rename(run / "checkpoint-500")
    assert [(i.step, i.path) for i in cm.watch(run, timeout=0)] == [(500, str(run / "checkpoint-500"))]


def test_a_lower_step_still_being_written_holds_back_a_complete_higher_one(tmp_path, monkeypatch):
    staging = tmp_path / "staging"
    prefix = bundle(staging, 5)
    watched = tmp_path / "run"
    watched.mkdir()
    shutil.copy(prefix + ".index", watched)  # step 5: index there, its shard not yet
    bundle(watched, 6)
    loop = cm.watch(watched, timeout=DEADLINE, poll=POLL)
    first = []
    reader = threading.Thread(target=lambda: first.append(next(loop)))
    reader.start()
    reader.join(0.5)
    assert not first  # 6 waits: 5 is being written (its index is fresh)
    shutil.copy(prefix + ".data-00000-of-00001", watched)
    reader.join(DEADLINE)
    assert first[0].step == 5 and next(loop).step == 6
    loop.close()


def test_a_lower_step_abandoned_unfinished_is_reported_and_skipped(tmp_path, monkeypatch):
    monkeypatch.setattr(watch_module, "HOLD_BACK", 0.3)
    staging = tmp_path / "staging"
    prefix = bundle(staging, 5)
    watched = tmp_path / "run"
    watched.mkdir()
    shutil.copy(prefix + ".index", watched)  # a crashed writer: the shard never comes
    bundle(watched, 6)
    skipped = []
    found = steps(cm.watch(watched, timeout=0.5, poll=POLL, on_skip=lambda i, e: skipped.append((i.step, e))))
    assert found == [6]
    assert [s for s, _ in skipped] == [5]
    assert isinstance(skipped[0][1], CheckpointNotFoundError)
    assert "stayed incomplete" in str(skipped[0][1]) and "ckpt-5" in str(skipped[0][1])


# -- one bad checkpoint is reported and skipped ------------------------------------------------------------


@pytest.fixture
def settle_fast(monkeypatch):
    """A damaged checkpoint is called damaged after 50 ms unchanged, not the default second."""
    monkeypatch.setattr(watch_module, "SETTLE", 0.05)


def test_a_shard_stalled_half_written_is_waited_for_not_called_damaged(tmp_path, settle_fast):
    staging = tmp_path / "staging"
    prefix = bundle(staging, 4)
    shard = pathlib.Path(prefix + ".data-00000-of-00001").read_bytes()
    watched = tmp_path / "run"
    watched.mkdir()
    shutil.copy(prefix + ".index", watched)
    (watched / "ckpt-4.data-00000-of-00001").write_bytes(shard[: len(shard) // 2])  # an upload that paused
    skipped = []
    loop = cm.watch(watched, timeout=DEADLINE, poll=POLL, on_skip=lambda i, e: skipped.append(e))
    assert list(cm.watch(watched, timeout=0.3, poll=POLL, on_skip=lambda i, e: skipped.append(e))) == []
    assert skipped == []  # longer than SETTLE unchanged, yet not damaged: it is shorter than its index needs
    (watched / "ckpt-4.data-00000-of-00001").write_bytes(shard)
    info = next(loop)
    assert info.step == 4 and skipped == []
    np.testing.assert_array_equal(read_w(info.read_path), np.full(4, 4, np.float32))
    loop.close()


def test_a_damaged_checkpoint_is_reported_and_skipped_not_fatal(tmp_path, settle_fast):
    for s in (1, 2, 3):
        bundle(tmp_path, s)
    index = tmp_path / "ckpt-2.index"
    data = bytearray(index.read_bytes())
    data[10] ^= 0xFF  # a flipped bit in the first block: its CRC fails; the footer is whole
    index.write_bytes(bytes(data))
    skipped = []
    found = steps(cm.watch(tmp_path, timeout=0.5, poll=POLL, on_skip=lambda i, e: skipped.append((i, e))))
    assert found == [1, 3]
    assert len(skipped) == 1
    info, err = skipped[0]
    assert info.step == 2 and isinstance(err, CheckpointFormatError)
    assert "ckpt-2" in str(err) and "stopped changing" in str(err)


def test_without_on_skip_a_skipped_checkpoint_is_a_logged_warning(tmp_path, caplog, settle_fast):
    bundle(tmp_path, 1)
    (tmp_path / "ckpt-2.index").write_bytes(b"\0" * 40 + bytes.fromhex("57fb808b247547db"))
    with caplog.at_level("WARNING", logger="ckptmerge"):
        assert steps(cm.watch(tmp_path, timeout=0.5, poll=POLL)) == [1]
    assert any("skipped" in r.getMessage() and "ckpt-2" in r.getMessage() for r in caplog.records)


# -- pins: cleanup cannot take a checkpoint away mid-read ----------------------------------------------


def test_a_pinned_checkpoint_survives_the_trainers_cleanup_and_is_unpinned_after(tmp_path):
    prefix = bundle(tmp_path, 1, value=11.0)
    loop = cm.watch(tmp_path, timeout=DEADLINE, poll=POLL)
    info = next(loop)
    assert info.pinned and info.read_path == info.pinned and info.path == prefix
    assert os.stat(prefix + ".index").st_nlink == 2  # a hard link: no copy
    for f in tmp_path.glob("ckpt-1.*"):  # max_to_keep's cleanup
        f.unlink()
    np.testing.assert_array_equal(read_w(info.read_path), np.full(4, 11.0, np.float32))
    assert intact(info)
    bundle(tmp_path, 2)
    assert next(loop).step == 2
    assert not os.path.exists(info.pinned + ".index")  # released once the loop moved on
    loop.close()
    assert not any(n.startswith(PIN_PREFIX) for n in os.listdir(tmp_path))


def test_every_complete_checkpoint_is_pinned_when_seen_so_none_is_skipped(tmp_path):
    bundle(tmp_path, 1)
    loop = cm.watch(tmp_path, timeout=DEADLINE, poll=POLL, until_step=4)
    assert next(loop).step == 1
    for s in (2, 3, 4):  # written while the caller is busy with step 1 ...
        bundle(tmp_path, s)
        wait_for(lambda: os.stat(os.path.join(tmp_path, f"ckpt-{s}.index")).st_nlink == 2, f"step {s} pinned")
    for s in (1, 2, 3):  # ... and all but the newest deleted by the trainer's cleanup
        for f in tmp_path.glob(f"ckpt-{s}.*"):
            f.unlink()
    assert [(i.step, float(read_w(i.read_path)[0])) for i in loop] == [(2, 2.0), (3, 3.0), (4, 4.0)]


def test_a_checkpoint_deleted_before_it_could_be_pinned_is_reported(tmp_path, monkeypatch):
    import ckptmerge.following.pins as pins

    bundle(tmp_path, 1)
    bundle(tmp_path, 2)
    real = os.link

    def cleanup_wins(src, dst, **kw):  # the trainer deletes step 1 between the look and the link
        if "ckpt-1" in os.path.basename(src):
            for f in tmp_path.glob("ckpt-1.*"):
                f.unlink()
        return real(src, dst, **kw)

    monkeypatch.setattr(pins.os, "link", cleanup_wins)
    skipped = []
    assert steps(cm.watch(tmp_path, timeout=0.5, poll=POLL, on_skip=lambda i, e: skipped.append((i.step, e)))) == [2]
    assert [s for s, _ in skipped] == [1]
    assert "deleted before it could be pinned" in str(skipped[0][1])


def test_where_links_are_impossible_the_bytes_are_read_instead(tmp_path, monkeypatch):
    import errno

    import ckptmerge.following.pins as pins

    def no_links(src, dst, **kw):
        raise OSError(errno.EXDEV, "Invalid cross-device link")

    monkeypatch.setattr(pins.os, "link", no_links)
    prefix = bundle(tmp_path, 1, value=3.0)
    loop = cm.watch(tmp_path, timeout=DEADLINE, poll=POLL)
    info = next(loop)
    assert info.pinned.startswith("memory://")
    for f in tmp_path.glob("ckpt-1.*"):
        f.unlink()
    np.testing.assert_array_equal(read_w(info.read_path), np.full(4, 3.0, np.float32))
    loop.close()
    import fsspec

    assert not fsspec.filesystem("memory").exists(info.pinned + ".index")
    assert not os.path.exists(prefix + ".index")


def test_a_pin_whose_files_are_removed_anyway_is_no_longer_intact(tmp_path):
    bundle(tmp_path, 1)
    loop = cm.watch(tmp_path, timeout=DEADLINE, poll=POLL)
    info = next(loop)
    shutil.rmtree(os.path.dirname(info.pinned))  # someone removed the private folder
    assert not intact(info)
    with pytest.raises(CheckpointNotFoundError):
        read_w(info.read_path)
    loop.close()


def test_closing_the_loop_removes_every_pin_and_the_folder(tmp_path):
    import tempfile

    for s in (1, 2, 3):
        bundle(tmp_path, s)
    loop = cm.watch(tmp_path, timeout=DEADLINE, poll=POLL)
    info = next(loop)
    wait_for(lambda: os.stat(os.path.join(tmp_path, "ckpt-3.index")).st_nlink == 2, "the backlog pinned")
    root = os.path.dirname(os.path.dirname(info.pinned))
    assert os.path.basename(root).startswith(PIN_PREFIX) and os.path.dirname(root) == tempfile.gettempdir()
    loop.close()
    assert not os.path.exists(root)
    assert all(os.stat(f).st_nlink == 1 for f in tmp_path.glob("ckpt-*.index"))


def test_pin_folders_of_processes_that_ended_are_removed(tmp_path):
    import subprocess
    import sys

    bundle(tmp_path, 1)
    loop = cm.watch(tmp_path, timeout=DEADLINE)
    mine = os.path.dirname(os.path.dirname(next(loop).pinned))  # .ckptmerge-pins-HOST-PID-xxxx
    loop.close()
    host_and_pid = os.path.basename(mine)[len(PIN_PREFIX):].rsplit("-", 1)[0]
    assert host_and_pid.endswith(f"-{os.getpid()}")
    ended = int(subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                               capture_output=True, text=True).stdout)
    stale = os.path.join(os.path.dirname(mine), f"{PIN_PREFIX}{host_and_pid.rsplit('-', 1)[0]}-{ended}-abc")
    os.makedirs(os.path.join(stale, "0"))
    assert steps(cm.watch(tmp_path, timeout=0)) == [1]
    assert not os.path.exists(stale)


# -- notifications ---------------------------------------------------------------------------------------


def test_looks_back_off_to_poll_when_nothing_happens_and_come_fast_after_a_change(tmp_path, monkeypatch):
    from ckptmerge.formats.io.notify import Waker

    waits = []
    real = Waker.wait

    def recorded(self, timeout):
        waits.append(timeout)
        return real(self, timeout)

    monkeypatch.setattr(Waker, "wait", recorded)
    poll = 0.08
    loop = cm.watch(tmp_path, timeout=DEADLINE, poll=poll, notify=False)
    got = []
    reader = threading.Thread(target=lambda: got.append(next(loop)))
    reader.start()
    wait_for(lambda: sum(w > poll / 2 for w in waits) >= 3, "the looks to back off to poll")
    steady = len(waits)
    bundle(tmp_path, 1)
    reader.join(DEADLINE)
    loop.close()
    assert got[0].step == 1
    # a wait is the interval less the look's own time: 20 ms, 40 ms, then poll, doubling while
    # nothing happens, never longer than poll
    assert all(0 < w <= cap + 1e-9 for w, cap in zip(waits, [0.02, 0.04] + [poll] * len(waits)))
    assert pytest.approx(0.01) in waits[steady - 1:]  # the look that found step 1: the next comes fast


def test_a_new_file_wakes_the_watcher_before_its_next_poll(tmp_path):
    from ckptmerge.formats.io.notify import Waker

    if not Waker().notifying:
        pytest.skip("no file-system notifications on this platform")
    loop = cm.watch(tmp_path, timeout=DEADLINE, poll=DEADLINE)  # a poll as long as the deadline
    got = []
    reader = threading.Thread(target=lambda: got.append(next(loop)))
    reader.start()
    time.sleep(0.2)  # (not a synchronisation: the first look is likely over, so a notification is what wakes it)
    start = time.monotonic()
    bundle(tmp_path, 1)
    reader.join(DEADLINE)
    assert got and got[0].step == 1
    assert time.monotonic() - start < DEADLINE / 2  # woken by the notification, not the poll
    loop.close()
