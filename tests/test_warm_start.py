"""Config-driven warm starts end to end: a config file, real checkpoints, a real model."""

from __future__ import annotations

import textwrap

import numpy as np
import pytest

import ckptmerge as cm
from conftest import save_tf1


def _keras_model(n_classes, name):
    import keras

    inp = keras.Input((4,))
    h = keras.layers.Dense(6, name="enc1")(inp)
    out = keras.layers.Dense(n_classes, name="head")(h)
    return keras.Model(inp, out, name=name)


def test_warm_start_of_a_keras_model_from_two_sources_through_a_yaml_config(tf, tmp_path, monkeypatch):
    enc, cls, fresh = _keras_model(3, "enc"), _keras_model(2, "cls"), _keras_model(5, "fresh")
    tf.train.Checkpoint(model=enc).write(str(tmp_path / "runs" / "enc" / "ckpt"))
    tf.train.Checkpoint(model=cls).write(str(tmp_path / "runs" / "cls" / "ckpt"))
    head_bias_before = fresh.get_layer("head").bias.numpy().copy()
    (tmp_path / "warm.yaml").write_text(textwrap.dedent("""\
        sources:
          - name: encoder
            path: ${RUNS}/enc/ckpt
            include: ["enc1/*"]
          - name: head
            path: runs/cls/ckpt
            include: ["head/*"]
            slice:
              - {name: "head/kernel", axis: 1, init: keep}
              - {name: "head/bias", axis: 0, init: keep}
        """))
    monkeypatch.setenv("RUNS", str(tmp_path / "runs"))
    report = cm.warm_start(fresh, str(tmp_path / "warm.yaml"))
    np.testing.assert_array_equal(fresh.get_layer("enc1").kernel.numpy(), enc.get_layer("enc1").kernel.numpy())
    # 2 old classes copied into the first 2 of 5 columns; the other 3 keep their values.
    np.testing.assert_array_equal(fresh.get_layer("head").kernel.numpy()[:, :2], cls.get_layer("head").kernel.numpy())
    np.testing.assert_array_equal(fresh.get_layer("head").bias.numpy()[2:], head_bias_before[2:])
    assert "slice" in report.plan.report()


def test_vocab_remap_through_the_api_matches_a_hand_computed_expectation(tf, tmp_path):
    old = ["<pad>", "cat", "dog", "emu"]
    new = ["<pad>", "dog", "fox", "cat"]
    emb = np.arange(8, dtype=np.float32).reshape(4, 2)  # row i = [2i, 2i+1]
    prefix = save_tf1(tmp_path / "m", {"embed": emb})
    target = {"embed": tf.Variable(np.full((4, 2), -1, np.float32))}
    remap = cm.VocabRemap("embed", old_vocab=old, new_vocab=new, axis=0, init="keep")
    report = cm.restore(target, [cm.Source(prefix, transforms=[remap])])
    want = np.array([[0, 1], [4, 5], [-1, -1], [2, 3]], np.float32)
    np.testing.assert_array_equal(target["embed"].numpy(), want)
    assert "vocab remap" in report.plan.report()


def test_float16_checkpoint_casts_per_source_from_config(tf, tmp_path):
    prefix = save_tf1(tmp_path / "m", {"w": np.array([1.5, 2.5], np.float16)})
    target = {"w": tf.Variable(np.zeros(2, np.float32))}
    cm.warm_start(target, {"sources": [{"path": prefix, "cast": True}]})
    np.testing.assert_array_equal(target["w"].numpy(), [1.5, 2.5])


def test_a_transform_that_reaches_no_variable_is_an_unmatched_rule(tf, tmp_path):
    prefix = save_tf1(tmp_path / "m", {"w": np.zeros(2, np.float32)})
    target = {"w": tf.Variable(np.zeros(2, np.float32))}
    plan = cm.plan(target, [cm.Source(prefix, transforms=[cm.Slice("head/*", axis=0)])])
    assert [u.kind for u in plan.unmatched_rules] == ["transform"]
    with pytest.raises(cm.PlanError, match="head/"):
        plan.restore()


def test_bad_config_raises_config_error_before_any_checkpoint_is_opened(tf, tmp_path):
    (tmp_path / "bad.yaml").write_text("sources:\n  - path: nowhere\n    regx: []\n")
    with pytest.raises(cm.ConfigError) as err:
        cm.warm_start({"w": tf.Variable(1.0)}, str(tmp_path / "bad.yaml"))
    assert "regex" in str(err.value) and "bad.yaml:3" in str(err.value)
