"""Error paths of the core API: each a clear error saying what, where and how to fix."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

import ckptmerge as cm
from ckptmerge.planning.planner import OptionError
from ckptmerge.planning.transforms import TransformError


def test_import_ckptmerge_does_not_import_tensorflow():
    code = "import ckptmerge, sys; assert 'tensorflow' not in sys.modules, 'tensorflow imported'"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_missing_path_is_checkpoint_not_found(tf, tmp_path):
    with pytest.raises(cm.CheckpointNotFoundError) as err:
        cm.plan({"x": tf.Variable(1.0)}, [cm.Source(str(tmp_path / "nope"))])
    assert isinstance(err.value, FileNotFoundError)
    assert "nope" in str(err.value)


def test_directory_without_checkpoint_is_a_clear_error(tf, tmp_path):
    with pytest.raises(cm.CheckpointNotFoundError) as err:
        cm.plan({"x": tf.Variable(1.0)}, [cm.Source(str(tmp_path))])
    assert str(tmp_path.name) in str(err.value)


def test_missing_step_lists_the_steps_that_exist(tf, ab_checkpoints):
    with pytest.raises(cm.CheckpointNotFoundError) as err:
        cm.plan({"x": tf.Variable(1.0)}, [cm.Source(ab_checkpoints["A"], step=7)])
    assert "7" in str(err.value) and "5" in str(err.value) and "10" in str(err.value)


def test_misspelt_map_key_suggests_the_close_name(tf, ab_checkpoints):
    c = {"c/x1": tf.Variable(np.zeros((3, 4), np.float32))}
    with pytest.raises(cm.PlanError) as err:
        cm.restore(c, [cm.Source(ab_checkpoints["A"], map={"a_1": "c/x1"})], strict=False)
    assert "Did you mean 'a1'?" in str(err.value)
    assert err.value.plan.unmatched_rules


def test_bad_regex_fails_when_the_source_is_made():
    with pytest.raises(cm.RuleError) as err:
        cm.Source("x", regex=[("^head/(.*", "c/\\1")])
    assert "^head/(.*" in str(err.value)
    assert isinstance(err.value, ValueError)


def test_duplicate_target_names_are_listed(tf, ab_checkpoints):
    vs = [tf.Variable(1.0), tf.Variable(2.0)]  # both eager-named 'Variable'
    with pytest.raises(cm.PlanError) as err:
        cm.plan(vs, [ab_checkpoints["A"]])
    assert "'Variable' (2x)" in str(err.value)
    assert "dict" in str(err.value)


def test_target_none_in_eager_mode_says_what_to_pass(tf, ab_checkpoints):
    with pytest.raises(cm.CkptMergeError, match="graph mode"):
        cm.plan(None, [ab_checkpoints["A"]])


def test_graph_mode_restore_without_session_says_how(tf, ab_checkpoints):
    with tf.Graph().as_default():
        tf.compat.v1.get_variable("a1", shape=(3, 4))
        plan = cm.plan(None, [ab_checkpoints["A"]])
        with pytest.raises(cm.CkptMergeError, match="session=sess"):
            plan.restore()


def test_v1_format_checkpoint_is_listed(tf):
    from _corpus import corpus

    names = [v.name for v in cm.list_variables(str(corpus() / "tf0x-v1format-nxt" / "model.ckpt"))]
    assert names[:3] == ["beta1_power", "beta2_power", "mbias"] and len(names) == 14


def test_a_list_of_specs_is_a_tf_free_target_that_reports_but_does_not_restore(ab_checkpoints):
    specs = [cm.VariableInfo("c/x1", (3, 4), "float32"), cm.VariableInfo("c/q", (2,), "float32")]
    plan = cm.plan(specs, [cm.Source(ab_checkpoints["A"], map={"a1": "c/x1"})])
    assert list(plan.assignments) == ["c/x1"] and plan.missing == ["c/q"]
    with pytest.raises(cm.CkptMergeError, match="not restored"):
        plan.restore(strict=False)


def test_open_keeps_a_reader_with_names_spec_and_get(ab_checkpoints):
    with cm.open(ab_checkpoints["A"]) as reader:
        assert reader.names(optimizer=False) == ["a1", "a2", "a3"]
        assert reader.spec("a1").shape == (3, 4) and reader.spec("a1").dtype == "float32"
        np.testing.assert_array_equal(reader.get("a1"), ab_checkpoints["a"]["a1"])
        with pytest.raises(cm.UnknownTensorError) as err:
            reader.get("a_1")
    assert "Did you mean 'a1'?" in str(err.value) and isinstance(err.value, KeyError)
    assert cm.load(ab_checkpoints["A"], ["a2"])["a2"].tolist() == ab_checkpoints["a"]["a2"].tolist()
    assert [v.name for v in cm.list_variables(ab_checkpoints["A"], optimizer=False)] == ["a1", "a2", "a3"]


def test_a_resolution_error_names_the_source_it_belongs_to(tf, ab_checkpoints):
    srcs = [cm.Source(ab_checkpoints["A"], name="encoder"), cm.Source(ab_checkpoints["A"], step=7, name="head")]
    with pytest.raises(cm.CheckpointNotFoundError) as err:
        cm.plan({"a1": tf.Variable(np.zeros((3, 4), np.float32))}, srcs)
    assert str(err.value).startswith("source 'head': ")


# -- every input error is also a ValueError, as init_from_checkpoint's are -------------------


def _raises_value_error(fn):
    """Run ``fn``, catching with ``except ValueError`` as TF users do; return the error."""
    try:
        fn()
    except ValueError as e:
        return e
    raise AssertionError("no ValueError raised")


def test_plan_error_is_a_value_error(tf, ab_checkpoints):
    c = {"c/x1": tf.Variable(np.zeros((3, 4), np.float32))}
    e = _raises_value_error(lambda: cm.restore(c, [cm.Source(ab_checkpoints["A"], map={"a_1": "c/x1"})]))
    assert isinstance(e, cm.PlanError) and isinstance(e, cm.CkptMergeError)


def test_rule_error_is_a_value_error():
    e = _raises_value_error(lambda: cm.Source("x", map={"a/": "b"}))
    assert isinstance(e, cm.RuleError) and isinstance(e, cm.CkptMergeError)


def test_option_error_is_a_value_error(tf, ab_checkpoints):
    c = {"a1": tf.Variable(np.zeros((3, 4), np.float32))}
    e = _raises_value_error(lambda: cm.plan(c, [ab_checkpoints["A"]], on_conflict="frist"))
    assert isinstance(e, OptionError) and isinstance(e, cm.CkptMergeError)


def test_config_error_is_a_value_error():
    e = _raises_value_error(lambda: cm.load_config({"sources": [{"path": 3}]}))
    assert isinstance(e, cm.ConfigError) and isinstance(e, cm.CkptMergeError)


def test_transform_error_is_a_value_error():
    e = _raises_value_error(lambda: cm.VocabRemap("e", ["a", "a"], ["a"]))
    assert isinstance(e, TransformError) and isinstance(e, cm.CkptMergeError)
