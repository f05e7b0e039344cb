"""Repeated restores, any checkpoint, in-memory snapshots, partitioned and mirrored variables."""

from __future__ import annotations

import numpy as np
import pytest

import ckptmerge as cm
from conftest import save_tf1


def test_graph_restorer_adds_no_op_after_the_first_of_1000_restores(tf, ab_checkpoints):
    ab = ab_checkpoints
    with tf.Graph().as_default() as g:
        x1 = tf.compat.v1.get_variable("c/x1", shape=(3, 4))
        with tf.compat.v1.Session(graph=g) as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            r = cm.Restorer(None, [cm.Source(ab["A"], map={"a1": "c/x1"})], session=sess)
            r.restore()
            n_ops = len(g.get_operations())
            for _ in range(1000):
                r.restore()
            assert len(g.get_operations()) == n_ops
            np.testing.assert_array_equal(sess.run(x1), ab["a"]["a1"])
    assert r.count == 1001


def test_restore_step_switches_to_another_checkpoint_without_replanning(tf, ab_checkpoints):
    ab = ab_checkpoints
    v = {"c/x1": tf.Variable(np.full((3, 4), 3, np.float32))}
    with cm.Restorer(v, [cm.Source(ab["A"], map={"a1": "c/x1"})]) as r:
        r.restore(step=5)
        np.testing.assert_array_equal(v["c/x1"].numpy(), np.zeros((3, 4), np.float32))
        r.restore(step=10)
        np.testing.assert_array_equal(v["c/x1"].numpy(), ab["a"]["a1"])


def test_restore_path_with_another_layout_is_a_clear_error(tf, ab_checkpoints, tmp_path):
    ab = ab_checkpoints
    other = save_tf1(tmp_path / "other", {"a1": np.zeros((5,), np.float32)})
    v = {"c/x1": tf.Variable(np.zeros((3, 4), np.float32))}
    r = cm.Restorer(v, [cm.Source(ab["A"], map={"a1": "c/x1"})])
    with pytest.raises(cm.PlanError, match=r"layout.*'a1' is float32 \(5,\)"):
        r.restore(path=other)


def test_restore_missing_step_lists_the_steps(tf, ab_checkpoints):
    v = {"c/x1": tf.Variable(np.zeros((3, 4), np.float32))}
    r = cm.Restorer(v, [cm.Source(ab_checkpoints["A"], map={"a1": "c/x1"})])
    with pytest.raises(cm.CheckpointNotFoundError, match="5, 10"):
        r.restore(step=99)


def test_checkpoints_lists_every_step_with_the_latest_flagged(ab_checkpoints):
    infos = cm.checkpoints(ab_checkpoints["A"])
    assert [i.step for i in infos] == [5, 10]
    assert [i.latest for i in infos] == [False, True]
    assert all(i.size > 0 for i in infos)


def test_maml_pattern_snapshot_finetune_predict_restore_without_disk_io(tf):
    import keras

    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
    model.compile(keras.optimizers.SGD(0.5), "mse")
    x, y = np.ones((8, 4), np.float32), np.ones((8, 2), np.float32)
    generic = {v.path: v.numpy().copy() for v in model.weights}
    snap = cm.snapshot(model)
    restorer = cm.Restorer(model, [snap])
    for task in range(3):
        model.fit(x * (task + 1), y, epochs=2, verbose=0)  # fine-tune in memory
        model.predict(x, verbose=0)
        assert not all(np.array_equal(v.numpy(), generic[v.path]) for v in model.weights)
        restorer.restore()  # back to the generic weights: no file is involved
        for v in model.weights:
            np.testing.assert_array_equal(v.numpy(), generic[v.path])
    assert restorer.plan.sources[0].path == "<memory>"


def test_dict_of_numpy_arrays_mixes_with_checkpoint_sources(tf, ab_checkpoints):
    ab = ab_checkpoints
    v = {"c/x1": tf.Variable(np.zeros((3, 4), np.float32)), "c/z": tf.Variable(np.zeros(2, np.float32))}
    mem = cm.Source.from_values({"z": np.array([4.0, 5.0], np.float32)}, map={"z": "c/z"}, name="mem")
    cm.restore(v, [cm.Source(ab["A"], map={"a1": "c/x1"}), mem])
    np.testing.assert_array_equal(v["c/z"].numpy(), [4.0, 5.0])
    np.testing.assert_array_equal(v["c/x1"].numpy(), ab["a"]["a1"])


def test_snapshot_in_graph_mode_restores_through_feeds(tf):
    with tf.Graph().as_default() as g:
        w = tf.compat.v1.get_variable("w", initializer=np.arange(3, dtype=np.float32))
        with tf.compat.v1.Session(graph=g) as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            snap = cm.snapshot(None, session=sess)
            r = cm.Restorer(None, [snap], session=sess)
            for _ in range(2):  # an update after a restore must not leak into the snapshot
                sess.run(w.assign([9.0, 9.0, 9.0]))
                r.restore()
                np.testing.assert_array_equal(sess.run(w), [0.0, 1.0, 2.0])
                sess.run(w.assign_add([1.0, 1.0, 1.0]))


def _sliced_init(full):
    """An initializer giving each partition its own slice of ``full``."""
    def init(shape, dtype=None, partition_info=None):
        off = partition_info.var_offset if partition_info is not None else [0] * len(shape)
        return full[tuple(slice(o, o + n) for o, n in zip(off, shape))]
    return init


def _partitioned_checkpoint(tf, prefix):
    full = np.arange(30, dtype=np.float32).reshape(10, 3)
    with tf.Graph().as_default() as g:
        tf.compat.v1.get_variable("emb", shape=(10, 3), initializer=_sliced_init(full),
                                  partitioner=tf.compat.v1.fixed_size_partitioner(3))
        with tf.compat.v1.Session(graph=g) as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            path = tf.compat.v1.train.Saver().save(sess, str(prefix))
    return path, full


def test_partitioned_checkpoint_restores_into_a_partitioned_target(tf, tmp_path):
    path, full = _partitioned_checkpoint(tf, tmp_path / "p")
    with tf.Graph().as_default() as g:
        pv = tf.compat.v1.get_variable("emb", shape=(10, 3), partitioner=tf.compat.v1.fixed_size_partitioner(2))
        with tf.compat.v1.Session(graph=g) as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            plan = cm.plan(None, [path])
            assert list(plan.assignments) == ["emb"]
            plan.restore(session=sess)
            np.testing.assert_array_equal(sess.run(tf.concat(list(pv), axis=0)), full)


def test_partitioned_checkpoint_restores_into_an_unpartitioned_target_in_both_modes(tf, tmp_path):
    path, full = _partitioned_checkpoint(tf, tmp_path / "p")
    with tf.Graph().as_default() as g:
        v = tf.compat.v1.get_variable("emb", shape=(10, 3))
        with tf.compat.v1.Session(graph=g) as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            cm.restore(None, [path], session=sess)
            np.testing.assert_array_equal(sess.run(v), full)
    ev = {"emb": tf.Variable(np.zeros((10, 3), np.float32))}
    cm.restore(ev, [path])
    np.testing.assert_array_equal(ev["emb"].numpy(), full)


def test_partitioned_target_snapshot_round_trips_in_graph_mode(tf):
    full = np.arange(30, dtype=np.float32).reshape(10, 3)
    with tf.Graph().as_default() as g:
        pv = tf.compat.v1.get_variable("emb", shape=(10, 3), initializer=_sliced_init(full),
                                       partitioner=tf.compat.v1.fixed_size_partitioner(4))
        with tf.compat.v1.Session(graph=g) as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            snap = cm.snapshot(None, session=sess)  # the parts are joined into one tensor
            sess.run([p.assign(tf.zeros_like(p)) for p in pv])
            cm.restore(None, [snap], session=sess)
            np.testing.assert_array_equal(sess.run(tf.concat(list(pv), axis=0)), full)


def test_mirrored_strategy_variables_get_every_replica_set(tf, ab_checkpoints):
    cpus = tf.config.list_logical_devices("CPU")
    if len(cpus) < 2:
        pytest.fail("conftest must configure two logical CPUs before TF initialises")
    strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    with strategy.scope():
        v = tf.Variable(np.zeros((3, 4), np.float32), name="c/x1")
    cm.restore({"c/x1": v}, [cm.Source(ab_checkpoints["A"], map={"a1": "c/x1"})])
    for replica_value in strategy.experimental_local_results(v):
        np.testing.assert_array_equal(replica_value.numpy(), ab_checkpoints["a"]["a1"])


def test_live_model_source_refreshes_the_actor_from_the_learner_each_restore(tf):
    import keras

    def net():
        return keras.Sequential([keras.Input((3,)), keras.layers.Dense(2, name="q")], name="net")

    learner, actor = net(), net()
    refresh = cm.Restorer(actor, [cm.Source.from_values(learner, name="learner")])
    for step in range(3):
        for v in learner.weights:
            v.assign(v.numpy() + step + 1.0)  # the learner trains
        before = [v.numpy().copy() for v in actor.weights]
        refresh.restore()
        for a, w in zip(actor.weights, learner.weights):
            np.testing.assert_array_equal(a.numpy(), w.numpy())
        learner.weights[0].assign_add(np.ones((3, 2), np.float32))  # a later update stays the learner's
        assert not np.array_equal(actor.weights[0].numpy(), learner.weights[0].numpy())
        assert not all(np.array_equal(b, a.numpy()) for b, a in zip(before, actor.weights))


def _truncate_second_source(ab):
    data = ab["B"] + ".data-00000-of-00001"
    with open(data, "r+b") as f:
        f.truncate(8)  # b1 starts at offset 0 and is 16 bytes long


def test_a_shard_truncated_under_an_open_restorer_changes_nothing_in_eager_mode(tf, ab_checkpoints):
    ab = ab_checkpoints
    c = {"c/x1": tf.Variable(np.full((3, 4), 5, np.float32)), "c/y1": tf.Variable(np.full(4, 5, np.float32))}
    r = cm.Restorer(c, [cm.Source(ab["A"], map={"a1": "c/x1"}), cm.Source(ab["B"], map={"b1": "c/y1"})])
    _truncate_second_source(ab)
    with pytest.raises(cm.RestoreError) as err:
        r.restore()
    assert "model-10.data-00000-of-00001" in str(err.value) and "b1" in str(err.value)
    np.testing.assert_array_equal(c["c/x1"].numpy(), np.full((3, 4), 5, np.float32))
    np.testing.assert_array_equal(c["c/y1"].numpy(), np.full(4, 5, np.float32))


def test_a_shard_truncated_under_an_open_restorer_changes_nothing_in_graph_mode(tf, ab_checkpoints):
    ab = ab_checkpoints
    with tf.Graph().as_default() as g:
        x1 = tf.compat.v1.get_variable("c/x1", initializer=np.full((3, 4), 5, np.float32))
        y1 = tf.compat.v1.get_variable("c/y1", initializer=np.full(4, 5, np.float32))
        with tf.compat.v1.Session(graph=g) as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            r = cm.Restorer(None, [cm.Source(ab["A"], map={"a1": "c/x1"}), cm.Source(ab["B"], map={"b1": "c/y1"})],
                            session=sess)
            _truncate_second_source(ab)
            with pytest.raises(cm.RestoreError, match="b1"):
                r.restore()
            np.testing.assert_array_equal(sess.run(x1), np.full((3, 4), 5, np.float32))
            np.testing.assert_array_equal(sess.run(y1), np.full(4, 5, np.float32))


def test_switch_by_step_still_works_after_a_switch_by_path(tf, ab_checkpoints):
    ab = ab_checkpoints
    v = {"c/x1": tf.Variable(np.zeros((3, 4), np.float32))}
    r = cm.Restorer(v, [cm.Source(ab["A"], map={"a1": "c/x1"})])
    r.restore(path=ab["A"] + "/model-10")
    np.testing.assert_array_equal(v["c/x1"].numpy(), ab["a"]["a1"])
    r.restore(step=5)
    np.testing.assert_array_equal(v["c/x1"].numpy(), np.zeros((3, 4), np.float32))


def test_switch_by_step_of_a_source_given_as_a_prefix_says_what_to_pass(tf, ab_checkpoints):
    v = {"c/y1": tf.Variable(np.zeros(4, np.float32))}
    r = cm.Restorer(v, [cm.Source(ab_checkpoints["B"], map={"b1": "c/y1"})])
    with pytest.raises(cm.CkptMergeError, match="pass path=..."):
        r.restore(step=5)


# --------------------------------------------------------------------------------------------
# one restorer shared by threads

STEPS = (1, 2, 3, 4)


@pytest.fixture
def steps_dir(tf, tmp_path):
    """A training directory with checkpoints at steps 1-4; every value of step s is s."""
    for s in STEPS:
        save_tf1(tmp_path / "run" / "model", {f"v{i}": np.full((128, 128), s, np.float32) for i in range(6)}, step=s)
    return tmp_path / "run"


def run_threads(n_threads, work):
    """Run ``work(thread_index)`` on real threads started together; re-raise the first error."""
    import threading

    errors = []
    barrier = threading.Barrier(n_threads)

    def body(t):
        try:
            barrier.wait()
            work(t)
        except BaseException as e:  # collected and re-raised in the test's thread
            errors.append(e)

    threads = [threading.Thread(target=body, args=(t,)) for t in range(n_threads)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    if errors:
        raise errors[0]


def test_eight_threads_restoring_steps_through_one_restorer_each_get_their_step(tf, steps_dir):
    v = {f"v{i}": tf.Variable(np.zeros((128, 128), np.float32)) for i in range(6)}
    r = cm.Restorer(v, [cm.Source(steps_dir)])
    rng = np.random.default_rng(0)
    plan = rng.choice(STEPS, size=(8, 12))

    def work(t):
        for s in plan[t]:
            report = r.restore(step=int(s))
            assert report.sources[0]["path"].endswith(f"model-{s}"), report.sources[0]["path"]

    run_threads(8, work)
    assert r.count == 8 * 12
    last = v["v0"].numpy()[0, 0]  # whichever restore ran last: all of one checkpoint
    assert last in STEPS and all(np.all(x.numpy() == last) for x in v.values())


def test_values_read_under_the_restorer_lock_are_all_from_the_step_restored(tf, steps_dir):
    v = {f"v{i}": tf.Variable(np.zeros((128, 128), np.float32)) for i in range(6)}
    r = cm.Restorer(v, [cm.Source(steps_dir)])

    def work(t):
        for k in range(10):
            s = STEPS[(t + k) % len(STEPS)]
            with r.lock:
                r.restore(step=s)
                for name, x in v.items():
                    assert np.all(x.numpy() == s), (name, s)

    run_threads(8, work)
    r.close()
