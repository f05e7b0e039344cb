"""``Restorer.follow`` and ``ckptmerge watch``: restore (or announce) each new checkpoint of a run.

The race tests run a real trainer in another process: TensorFlow's ``CheckpointManager`` with
``max_to_keep=1``, which deletes each checkpoint as soon as it writes the next, while this
process restores every one. The trainer moves on as soon as the follower has pinned a
checkpoint (its index has a second link), not when it has read it, so deletions really land
while the follower reads: every restore must still equal what was saved at its step, and none
may be skipped.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import ckptmerge as cm
from ckptmerge.core.errors import PlanError, RestoreError
from ckptmerge.formats.io import fileio
from ckptmerge.formats.tf.writer import BundleWriter

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
POLL = 0.02
DEADLINE = 120.0


def bundle(directory, step, values=None):
    prefix = os.path.join(str(directory), f"ckpt-{step}")
    with BundleWriter(prefix) as w:
        for name, value in (values or {"w": np.full(4, step, np.float32)}).items():
            w.add(name, value)
    return prefix


@pytest.fixture
def run(tmp_path):
    """A template checkpoint (the layout) and an empty run directory."""
    template = bundle(tmp_path / "template", 0)
    (tmp_path / "run").mkdir()
    return {"template": template, "dir": tmp_path / "run"}


def test_follow_restores_each_new_checkpoint_with_the_same_plan(tf, run):
    w = tf.Variable(np.zeros(4, np.float32))
    r = cm.Restorer({"w": w}, [cm.Source(run["template"])])
    plan = r.plan
    for s in (1, 2):
        bundle(run["dir"], s)
    seen = []
    for report in r.follow(run["dir"], timeout=DEADLINE, poll=POLL, until_step=3):
        seen.append((report.checkpoint.step, float(w.numpy()[0]), report.replanned))
        assert report.restored == ["w"] and r.plan is plan  # no re-planning: the same layout
        assert report.sources[0]["path"] == report.checkpoint.path  # the trainer's name, not the pin
        if report.checkpoint.step == 2:
            bundle(run["dir"], 3)
    assert seen == [(1, 1.0, None), (2, 2.0, None), (3, 3.0, None)]
    assert r.count == 3


def test_follow_replans_when_the_layout_changes_and_says_why(tf, run):
    w = tf.Variable(np.zeros(4, np.float32))
    b = tf.Variable(np.zeros(2, np.float32))
    r = cm.Restorer({"w": w, "b": b}, [cm.Source(run["template"])], allow_missing=["b"])
    bundle(run["dir"], 1)
    bundle(run["dir"], 2, {"w": np.full(4, 2, np.float32), "b": np.full(2, 5, np.float32)})
    bundle(run["dir"], 3, {"w": np.full(4, 3, np.float32), "b": np.full(2, 6, np.float32)})
    reports = list(r.follow(run["dir"], timeout=0))
    assert [rep.checkpoint.step for rep in reports] == [1, 2, 3]
    assert reports[0].replanned is None
    assert reports[1].replanned == "step 2 changed the checkpoint's variables: 1 new ('b')"
    assert reports[1].restored == ["b", "w"] and "Re-planned: step 2" in reports[1].render()
    assert reports[2].replanned is None  # the new plan is kept while the layout stays
    np.testing.assert_array_equal(b.numpy(), np.full(2, 6, np.float32))
    assert reports[1].to_dict()["replanned"].startswith("step 2 changed")


def test_follow_into_a_tf1_graph_reuses_its_ops_and_rebuilds_them_on_a_new_plan(tf, run):
    with tf.Graph().as_default() as g:
        w = tf.compat.v1.get_variable("w", shape=(4,), initializer=tf.compat.v1.zeros_initializer())
        b = tf.compat.v1.get_variable("b", shape=(2,), initializer=tf.compat.v1.zeros_initializer())
        sess = tf.compat.v1.Session(graph=g)
        sess.run(tf.compat.v1.global_variables_initializer())
        r = cm.Restorer(None, [cm.Source(run["template"])], session=sess, allow_missing=["b"])
    bundle(run["dir"], 1)
    bundle(run["dir"], 2)
    bundle(run["dir"], 3, {"w": np.full(4, 3, np.float32), "b": np.full(2, 7, np.float32)})
    got, ops = [], []
    for rep in r.follow(run["dir"], timeout=0):  # outside the graph's context: the re-plan still uses it
        got.append((rep.checkpoint.step, float(sess.run(w)[0]), rep.replanned is not None))
        ops.append(len(g.get_operations()))
    assert got == [(1, 1.0, False), (2, 2.0, False), (3, 3.0, True)]
    assert ops[1] == ops[0]  # the same plan, the same ops: none added for step 2
    np.testing.assert_array_equal(sess.run(b), np.full(2, 7, np.float32))
    sess.close()


def test_follow_a_keras_weights_series_restores_each_epoch(tf, tmp_path):
    import keras

    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    model.save_weights(str(tmp_path / "template.weights.h5"))
    r = cm.Restorer(model, [cm.Source(str(tmp_path / "template.weights.h5"))])
    run = tmp_path / "run"
    run.mkdir()
    for epoch in (1, 2):  # what keras.callbacks.ModelCheckpoint("run/ckpt-{epoch}.weights.h5") writes
        model.set_weights([np.full(w.shape, epoch, np.float32) for w in model.get_weights()])
        model.save_weights(str(run / f"ckpt-{epoch}.weights.h5"))
    model.set_weights([np.zeros(w.shape, np.float32) for w in model.get_weights()])
    got = [(rep.checkpoint.step, [float(w.mean()) for w in model.get_weights()], rep.replanned)
           for rep in r.follow(run, timeout=0)]
    assert got == [(1, [1.0, 1.0], None), (2, [2.0, 2.0], None)]


def test_follow_safetensors_step_folders(tf, tmp_path):
    from safetensors.numpy import save_file

    save_file({"w": np.zeros(4, np.float32)}, str(tmp_path / "template.safetensors"))
    w = tf.Variable(np.zeros(4, np.float32))
    r = cm.Restorer({"w": w}, [cm.Source(str(tmp_path / "template.safetensors"))])
    for s in (100, 200):  # what a Hugging Face Trainer writes: checkpoint-STEP/model.safetensors
        (tmp_path / "run" / f"checkpoint-{s}").mkdir(parents=True)
        save_file({"w": np.full(4, s, np.float32)}, str(tmp_path / "run" / f"checkpoint-{s}" / "model.safetensors"))
    got = [(rep.checkpoint.step, float(w.numpy()[0]), rep.replanned) for rep in r.follow(tmp_path / "run", timeout=0)]
    assert got == [(100, 100.0, None), (200, 200.0, None)]


def test_follow_a_torch_layout_whose_fused_split_needs_the_targets_keeps_its_plan(tf, tmp_path):
    from safetensors.numpy import save_file

    def qkv(step):  # Phi-3's grouped-query qkv_proj: query 8 rows, key and value 4 each
        return {"attn.qkv_proj.weight": np.full((16, 8), step, np.float32)}

    save_file(qkv(0), str(tmp_path / "template.safetensors"))
    names = {"attention/query/kernel": (8, 8), "attention/key/kernel": (8, 4), "attention/value/kernel": (8, 4)}
    target = {n: tf.Variable(np.zeros(s, np.float32)) for n, s in names.items()}
    r = cm.Restorer(target, [cm.Source(str(tmp_path / "template.safetensors"), layout="torch", align="structure")])
    assert sorted(r.plan.assignments) == sorted(names)
    for s in (1, 2):
        (tmp_path / "run" / f"checkpoint-{s}").mkdir(parents=True)
        save_file(qkv(s), str(tmp_path / "run" / f"checkpoint-{s}" / "model.safetensors"))
    got = [(rep.checkpoint.step, float(target["attention/key/kernel"].numpy()[0, 0]), rep.replanned)
           for rep in r.follow(tmp_path / "run", timeout=0)]
    assert got == [(1, 1.0, None), (2, 2.0, None)]


def test_a_new_layout_the_plan_rejects_is_skipped_and_the_target_kept(tf, run):
    w = tf.Variable(np.zeros(4, np.float32))
    r = cm.Restorer({"w": w}, [cm.Source(run["template"])])
    bundle(run["dir"], 1)
    bundle(run["dir"], 2, {"w": np.zeros(7, np.float32)})  # another shape: a mismatch
    bundle(run["dir"], 3)
    skipped = []
    steps = [rep.checkpoint.step for rep in r.follow(run["dir"], timeout=0, on_skip=lambda i, e: skipped.append((i, e)))]
    assert steps == [1, 3]
    info, err = skipped[0]
    assert info.step == 2 and isinstance(err, PlanError)
    assert "ckpt-2" in str(err) and "another shape or dtype ('w' float32 (4,) -> float32 (7,))" in str(err)
    np.testing.assert_array_equal(w.numpy(), np.full(4, 3, np.float32))


def test_cleanup_during_the_restore_cannot_tear_it_the_pin_holds(tf, run, monkeypatch):
    w = tf.Variable(np.zeros(4, np.float32))
    r = cm.Restorer({"w": w}, [cm.Source(run["template"])])
    prefix = bundle(run["dir"], 1)
    real = fileio.Descriptors.get

    def cleanup_then_open(self, key, path):  # the trainer deletes the checkpoint as the read starts
        for suffix in (".index", ".data-00000-of-00001"):
            if os.path.exists(prefix + suffix):
                os.unlink(prefix + suffix)
        return real(self, key, path)

    monkeypatch.setattr(fileio.Descriptors, "get", cleanup_then_open)
    reports = list(r.follow(run["dir"], timeout=0))
    assert [rep.checkpoint.step for rep in reports] == [1] and not os.path.exists(prefix + ".index")
    np.testing.assert_array_equal(w.numpy(), np.ones(4, np.float32))


def test_a_pinned_read_that_finds_its_files_gone_is_a_clear_error_and_changes_nothing(tf, run, monkeypatch):
    import shutil

    w = tf.Variable(np.full(4, 9, np.float32))
    r = cm.Restorer({"w": w}, [cm.Source(run["template"])])
    bundle(run["dir"], 1)
    real = fileio.Descriptors.get

    def pin_removed_then_open(self, key, path):  # someone removes the private pin folder too
        if ".ckptmerge-pins-" in path and os.path.exists(os.path.dirname(path)):
            shutil.rmtree(os.path.dirname(path))
        return real(self, key, path)

    monkeypatch.setattr(fileio.Descriptors, "get", pin_removed_then_open)
    skipped = []
    assert list(r.follow(run["dir"], timeout=0, on_skip=lambda i, e: skipped.append((i, e)))) == []
    info, err = skipped[0]
    assert isinstance(err, RestoreError) and err.path == info.path
    assert f"'{info.path}' (step 1) was deleted while it was being read although it was pinned" in str(err)
    assert "no target variable was changed" in str(err)
    np.testing.assert_array_equal(w.numpy(), np.full(4, 9, np.float32))  # never half-restored


def test_follow_checks_its_options_before_the_loop(tf, run):
    r = cm.Restorer({"w": tf.Variable(np.zeros(4, np.float32))}, [cm.Source(run["template"])])
    with pytest.raises(cm.ArgumentError, match="backlog"):
        r.follow(run["dir"], backlog="some")
    with pytest.raises(cm.ArgumentError, match="poll_interval"):
        r.follow(run["dir"], poll_interval=1)
    with pytest.raises(cm.CkptMergeError, match="No checkpoint source labelled 'other'"):
        r.follow(run["dir"], source="other")


TRAINER = textwrap.dedent("""
    import os, sys, time
    import numpy as np
    import tensorflow as tf
    directory, steps, progress = sys.argv[1], int(sys.argv[2]), sys.argv[3]

    def followed(step):  # the follower restored it (and may have released its pin already)
        try:
            with open(progress) as f:
                return int(f.read() or -1) >= step
        except (OSError, ValueError):
            return False

    v = tf.Variable(np.zeros((64, 64), np.float32))
    manager = tf.train.CheckpointManager(tf.train.Checkpoint(v=v), directory, max_to_keep=1)
    for step in range(1, steps + 1):
        v.assign(np.full((64, 64), step, np.float32))
        path = manager.save(checkpoint_number=step)  # deletes the previous checkpoint
        deadline = time.monotonic() + 120
        # go on once the follower has pinned it (a second link), not once it has read it
        while os.stat(path + ".index").st_nlink < 2 and not followed(step):
            if time.monotonic() > deadline:
                sys.exit(f"step {step} was never pinned")
            time.sleep(0.002)
    print("trained", steps)
""")


def test_a_trainer_deleting_under_max_to_keep_while_the_follower_restores_every_step(tf, tmp_path):
    steps = 15
    template = tmp_path / "template"
    m = tf.Module()
    m.v = tf.Variable(np.zeros((64, 64), np.float32))
    tf.train.Checkpoint(v=m.v).write(str(template / "ckpt"))
    run = tmp_path / "run"
    target = tf.Variable(np.full((64, 64), -1, np.float32))
    restorer = cm.Restorer({"v": target}, [cm.Source(str(template / "ckpt"))])
    progress = tmp_path / "restored"
    trainer = subprocess.Popen([sys.executable, "-c", TRAINER, str(run), str(steps), str(progress)], cwd=REPO,
                               env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"), stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
    restored, skipped = [], []
    try:
        for report in restorer.follow(run, timeout=DEADLINE, poll=POLL, until_step=steps,
                                      on_skip=lambda i, e: skipped.append((i.step, str(e)))):
            step = report.checkpoint.step
            values = target.numpy()
            assert (values == step).all(), (step, np.unique(values))  # complete, never torn or mixed
            restored.append(step)
            progress.write_text(str(step))
    finally:
        out, err = trainer.communicate(timeout=DEADLINE)
    assert trainer.returncode == 0, err
    assert skipped == []
    assert restored == list(range(1, steps + 1))  # none skipped
    assert len(list(run.glob("ckpt-*.index"))) == 1  # the trainer did delete all the others


# -- ckptmerge watch ------------------------------------------------------------------------------


def test_watch_prints_one_line_per_checkpoint_and_stops_at_the_timeout(tmp_path):
    from _cli_util import run

    for s in (2, 10):
        bundle(tmp_path, s)
    r = run("watch", tmp_path, "--timeout", "0")
    assert r.exit_code == 0, r.output
    lines = r.stdout.splitlines()
    assert [line.split(":")[0] for line in lines] == ["step 2", "step 10"]
    assert lines[1].startswith(f"step 10: {tmp_path}/ckpt-10 (")
    assert r.stderr == "Stopped: no new checkpoint in 0 s.\n"
    r = run("watch", tmp_path, "--timeout", "0", "--latest")
    assert [line.split(":")[0] for line in r.stdout.splitlines()] == ["step 10"]


def test_watch_json_is_one_object_per_line(tmp_path):
    from _cli_util import run

    for s in (1, 2, 3):
        bundle(tmp_path, s)
    r = run("watch", tmp_path, "--json", "--after", "1", "--until-step", "3", "--timeout", "60")
    assert r.exit_code == 0, r.output
    objects = [json.loads(line) for line in r.stdout.splitlines()]
    assert [o["step"] for o in objects] == [2, 3]
    assert objects[1]["path"] == os.path.join(str(tmp_path), "ckpt-3")
    assert objects[1]["name"] == os.path.join(str(tmp_path), "ckpt-3") and objects[1]["size"] > 0
    assert set(objects[0]) == {"path", "name", "step", "time", "time_iso", "size", "latest", "pinned"}
    assert r.stderr == ""


def test_watch_exec_runs_the_command_with_the_pinned_path(tmp_path):
    for s in (1, 2):
        bundle(tmp_path, s)
    out = tmp_path / "seen.txt"
    cmd = f'echo "$CKPTMERGE_STEP $CKPTMERGE_CHECKPOINT_PATH $CKPTMERGE_CHECKPOINT" >> {out}; ' \
          'test -f "$CKPTMERGE_CHECKPOINT.index"'
    from _cli_util import run

    done = run("watch", tmp_path, "--timeout", "0", "--json", "--exec", cmd)
    assert done.exit_code == 0, done.output
    assert [json.loads(line)["step"] for line in done.stdout.splitlines()] == [1, 2]
    rows = [line.split() for line in out.read_text().splitlines()]
    assert [(s, p) for s, p, _ in rows] == [("1", f"{tmp_path}/ckpt-1"), ("2", f"{tmp_path}/ckpt-2")]
    assert all(".ckptmerge-pins-" in pinned and pinned.endswith(f"ckpt-{s}") for s, _, pinned in rows)
    assert not any(os.path.exists(pinned + ".index") for _, _, pinned in rows)  # released after


def test_watch_exec_failure_is_a_warning_and_watching_goes_on(tmp_path):
    for s in (1, 2):
        bundle(tmp_path, s)
    from _cli_util import run

    done = run("watch", tmp_path, "--timeout", "0", "--exec", "exit 3")
    assert done.exit_code == 0
    assert done.stderr.count("Warning: the command exited with 3") == 2


def test_watch_of_a_file_is_a_one_line_error(tmp_path):
    from _cli_util import assert_one_line_error, run

    prefix = bundle(tmp_path, 1)
    assert_one_line_error(run("watch", prefix + ".index"), "is not a directory")


def test_watch_ctrl_c_exits_130_and_leaves_no_pin(tmp_path):
    bundle(tmp_path, 1)
    proc = subprocess.Popen([sys.executable, "-m", "ckptmerge", "watch", str(tmp_path), "--poll", "0.05",
                             "--exec", "sleep 60"], cwd=REPO, env=dict(os.environ, PYTHONPATH=REPO),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    first = proc.stdout.readline()  # printed before the command runs, the checkpoint pinned meanwhile
    assert first.startswith("step 1: "), first
    assert os.stat(tmp_path / "ckpt-1.index").st_nlink == 2
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=DEADLINE)
    assert proc.returncode == 130, err
    assert err.splitlines()[-1] == "Aborted!" and "Traceback" not in err
    assert os.stat(tmp_path / "ckpt-1.index").st_nlink == 1  # the pin was released on the way out
