"""The core scenario in graph mode (tf.compat.v1): plan, report, restore, exact values."""

from __future__ import annotations

import logging
from types import SimpleNamespace

import numpy as np
import pytest

import ckptmerge as cm
from conftest import save_tf1


def _model_c(tf):
    with tf.compat.v1.variable_scope("c"):
        x1 = tf.compat.v1.get_variable("x1", shape=(3, 4), initializer=tf.compat.v1.zeros_initializer())
        y1 = tf.compat.v1.get_variable("y1", shape=(4,), initializer=tf.compat.v1.zeros_initializer())
        z = tf.compat.v1.get_variable("z", shape=(2,), initializer=tf.compat.v1.ones_initializer())
    return x1, y1, z


@pytest.fixture
def c(tf):
    """Model C in its own graph and session, initialised: ``c.x1``, ``c.y1``, ``c.z``, ``c.sess``."""
    with tf.Graph().as_default() as g:
        x1, y1, z = _model_c(tf)
        with tf.compat.v1.Session(graph=g) as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            yield SimpleNamespace(graph=g, sess=sess, x1=x1, y1=y1, z=z)


def _sources(ab):
    return [cm.Source(ab["A"], map={"a1": "c/x1"}, name="A"), cm.Source(ab["B"], map={"b1": "c/y1"}, name="B")]


def test_abc_scenario_restores_exact_values_in_graph_mode(tf, c, ab_checkpoints):
    ab = ab_checkpoints
    plan = cm.plan(None, _sources(ab), allow_missing=["c/z"])
    assert sorted(plan.assignments) == ["c/x1", "c/y1"]
    assert plan.missing == []
    assert plan.unused == {"A": ["a2", "a3"], "B": ["b2", "b3"]}
    report = plan.restore(session=c.sess)
    vx, vy, vz = c.sess.run([c.x1, c.y1, c.z])
    np.testing.assert_array_equal(vx, ab["a"]["a1"])
    np.testing.assert_array_equal(vy, ab["b"]["b1"])
    np.testing.assert_array_equal(vz, np.ones(2, np.float32))
    assert sorted(report.restored) == ["c/x1", "c/y1"]


def test_directory_source_takes_latest_checkpoint_and_report_says_which(tf, ab_checkpoints):
    with tf.Graph().as_default():
        _model_c(tf)
        plan = cm.plan(None, _sources(ab_checkpoints), allow_missing=["c/z"])
    text = plan.report()
    assert "model-10" in text
    assert "latest" in text


def test_step_source_takes_that_step(tf, c, ab_checkpoints):
    ab = ab_checkpoints
    c.sess.run(c.x1.assign(np.full((3, 4), 9, np.float32)))
    cm.restore(None, [cm.Source(ab["A"], step=5, map={"a1": "c/x1"})], session=c.sess,
               allow_missing=["c/*"])
    np.testing.assert_array_equal(c.sess.run(c.x1), np.zeros((3, 4), np.float32))


def test_restoring_the_same_plan_again_adds_no_ops_to_the_graph(tf, c, ab_checkpoints):
    plan = cm.plan(None, _sources(ab_checkpoints), allow_missing=["c/z"])
    plan.restore(session=c.sess)
    n_ops = len(c.graph.get_operations())
    for _ in range(5):
        plan.restore(session=c.sess)
    assert len(c.graph.get_operations()) == n_ops


def test_strict_plan_error_lists_every_finding_and_changes_nothing(tf, c, ab_checkpoints):
    ab = ab_checkpoints
    before = c.sess.run([c.x1, c.y1, c.z])
    with pytest.raises(cm.PlanError) as err:
        cm.restore(None, _sources(ab), session=c.sess)  # c/z is missing and not allowed
    after = c.sess.run([c.x1, c.y1, c.z])
    assert err.value.plan.missing == ["c/z"]
    assert "c/z" in str(err.value)
    assert "allow_missing" in str(err.value)
    for b, a in zip(before, after):
        np.testing.assert_array_equal(b, a)


def test_lenient_restore_restores_what_matches_and_logs_a_warning(tf, c, ab_checkpoints, caplog):
    with caplog.at_level(logging.WARNING, logger="ckptmerge"):
        report = cm.restore(None, _sources(ab_checkpoints), session=c.sess, strict=False)
    np.testing.assert_array_equal(c.sess.run(c.x1), ab_checkpoints["a"]["a1"])
    np.testing.assert_array_equal(c.sess.run(c.z), np.ones(2, np.float32))  # missing: left as it was
    assert sorted(report.restored) == ["c/x1", "c/y1"]
    assert report.skipped == [("c/z", "provided by no source (strict=False)")]
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "1 finding(s) not enforced (strict=False)" in warnings[0] and "'c/z'" in warnings[0]


def test_scope_map_moves_a_whole_scope(tf, tmp_path):
    vals = {"a/w": np.arange(6, dtype=np.float32).reshape(2, 3), "a/b": np.ones(3, np.float32)}
    prefix = save_tf1(tmp_path / "m", vals)
    with tf.Graph().as_default() as g:
        with tf.compat.v1.variable_scope("c/encoder"):
            w = tf.compat.v1.get_variable("w", shape=(2, 3))
            b = tf.compat.v1.get_variable("b", shape=(3,))
        with tf.compat.v1.Session(graph=g) as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            cm.restore(None, [cm.Source(prefix, map={"a/": "c/encoder/"})], session=sess)
            np.testing.assert_array_equal(sess.run(w), vals["a/w"])
            np.testing.assert_array_equal(sess.run(b), vals["a/b"])


def test_root_scope_map_prefixes_every_name(tf, tmp_path):
    prefix = save_tf1(tmp_path / "m", {"w": np.float32(3.0)})
    with tf.Graph().as_default() as g:
        v = tf.compat.v1.get_variable("c/w", shape=())
        with tf.compat.v1.Session(graph=g) as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            cm.restore(None, [cm.Source(prefix, map={"/": "c/"})], session=sess)
            assert sess.run(v) == 3.0


def test_optimizer_slots_are_left_out_unless_asked_for(tf, tmp_path):
    prefix = save_tf1(tmp_path / "m", {"w": np.ones((2,), np.float32)}, optimizer_slots=True)
    with tf.Graph().as_default():
        tf.compat.v1.get_variable("w", shape=(2,))
        plan = cm.plan(None, [cm.Source(prefix)])
        assert plan.unused == {prefix: []}
        plan_all = cm.plan(None, [cm.Source(prefix, optimizer=True)])
        assert "w/Adam" in plan_all.unused[prefix]
        assert "global_step" in plan_all.unused[prefix]


def test_cast_restores_float16_checkpoint_into_float32_graph_variable(tf, tmp_path):
    vals = np.array([1.5, -2.25], np.float16)
    prefix = save_tf1(tmp_path / "m", {"w": vals})
    with tf.Graph().as_default() as g:
        v = tf.compat.v1.get_variable("w", shape=(2,), dtype=tf.float32)
        with tf.compat.v1.Session(graph=g) as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            with pytest.raises(cm.PlanError, match="dtype"):
                cm.restore(None, [prefix], session=sess)
            cm.restore(None, [prefix], session=sess, cast=True)
            np.testing.assert_array_equal(sess.run(v), vals.astype(np.float32))


def test_corrupt_second_source_fails_and_changes_no_variable_in_graph_mode(tf, c, ab_checkpoints):
    ab = ab_checkpoints
    data = ab["B"] + ".data-00000-of-00001"
    raw = open(data, "rb").read()
    open(data, "wb").write(bytes(x ^ 0xFF for x in raw))  # every tensor's CRC now fails
    before = c.sess.run([c.x1, c.y1])
    with pytest.raises(cm.RestoreError):
        cm.restore(None, _sources(ab), session=c.sess, allow_missing=["c/z"])
    after = c.sess.run([c.x1, c.y1])
    for b, a in zip(before, after):
        np.testing.assert_array_equal(b, a)


def test_exclude_of_optimizer_slots_already_left_out_does_not_block(tf, tmp_path):
    prefix = save_tf1(tmp_path / "m", {"enc/w": np.ones(2, np.float32)}, optimizer_slots=True)
    with tf.Graph().as_default():
        tf.compat.v1.get_variable("enc/w", shape=(2,))
        plan = cm.plan(None, [cm.Source(prefix, exclude="*/Adam*")])
    assert plan.ok and plan.unmatched_rules == []


def test_include_matching_only_optimizer_state_says_pass_optimizer_true(tf, tmp_path):
    prefix = save_tf1(tmp_path / "m", {"enc/w": np.ones(2, np.float32)}, optimizer_slots=True)
    with tf.Graph().as_default():
        tf.compat.v1.get_variable("enc/w/Adam", shape=(2,))
        with pytest.raises(cm.PlanError) as err:
            cm.plan(None, [cm.Source(prefix, include="*/Adam")]).check()
        assert "these are optimizer variables: pass optimizer=True" in str(err.value)
        assert "'enc/w/Adam'" in str(err.value) and "Did you mean" not in str(err.value)
        assert cm.plan(None, [cm.Source(prefix, include="*/Adam", optimizer=True)]).ok


def test_a_bare_dict_of_arrays_in_the_sources_list_is_a_source(tf, c, ab_checkpoints):
    extra = np.arange(4, dtype=np.float32)
    report = cm.restore(None, [cm.Source(ab_checkpoints["A"], map={"a1": "c/x1"}), {"c/y1": extra}],
                        session=c.sess, allow_missing=["c/z"])
    assert sorted(report.restored) == ["c/x1", "c/y1"]
    np.testing.assert_array_equal(c.sess.run(c.y1), extra)
    np.testing.assert_array_equal(c.sess.run(c.x1), ab_checkpoints["a"]["a1"])


def test_two_bare_dicts_are_labelled_by_position(tf, c):
    plan = cm.plan(None, [{"c/x1": np.ones((3, 4), np.float32)}, {"c/y1": np.ones(4, np.float32)}],
                   allow_missing=["c/z"])
    assert [s.label for s in plan.sources] == ["memory[0]", "memory[1]"]


def test_savers_are_one_canonical_saver_per_source_built_once(tf, c, ab_checkpoints):
    ab = ab_checkpoints
    plan = cm.plan(None, _sources(ab), allow_missing=["c/z"])
    savers = plan.savers()
    n_ops = len(c.graph.get_operations())
    assert plan.savers() is savers and len(c.graph.get_operations()) == n_ops
    assert sorted(savers) == ["A", "B"]
    assert all(isinstance(s, tf.compat.v1.train.Saver) for s in savers.values())
    paths = {s.label: s.path for s in plan.sources}
    for label, saver in savers.items():
        saver.restore(c.sess, paths[label])
    np.testing.assert_array_equal(c.sess.run(c.x1), ab["a"]["a1"])
    np.testing.assert_array_equal(c.sess.run(c.y1), ab["b"]["b1"])


def test_savers_refuse_a_plan_that_casts(tf, tmp_path):
    prefix = save_tf1(tmp_path / "m", {"w": np.array([1.5], np.float16)})
    with tf.Graph().as_default():
        tf.compat.v1.get_variable("w", shape=(1,), dtype=tf.float32)
        plan = cm.plan(None, [prefix], cast=True)
        with pytest.raises(cm.CkptMergeError, match="use plan.restore"):
            plan.savers()


def test_savers_refuse_a_checkpoint_key_that_feeds_two_variables(tf, ab_checkpoints):
    with tf.Graph().as_default():
        tf.compat.v1.get_variable("y1", shape=(4,))
        tf.compat.v1.get_variable("y2", shape=(4,))
        plan = cm.plan(None, [cm.Source(ab_checkpoints["B"], map={"b1": ["y1", "y2"]}, name="B")])
        with pytest.raises(cm.CkptMergeError, match="'b1' of source 'B' feeds several targets"):
            plan.savers()
