"""Keras weights-file outputs load with Keras's own ``model.load_weights`` (issue 33).

TF checkpoints of Keras models (``tf.train.Checkpoint`` / ``CheckpointManager`` runs, values set
from seeded random numbers) are averaged or merged into ``.weights.h5`` files laid out by the model
they are for (``template=model``, ``--model MODULE:FUNCTION``) and loaded by Keras itself, values
compared with a NumPy mean. Without the model the merge refuses before writing, saying what to pass.
"""

from __future__ import annotations

import os
import textwrap

import numpy as np
import pytest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

keras = pytest.importorskip("keras")

import ckptmerge as cm  # noqa: E402
from _cli_util import assert_one_line_error, run  # noqa: E402

MODELS = textwrap.dedent('''
    import keras
    import numpy as np


    def sequential():
        return keras.Sequential([keras.Input((4,)), keras.layers.Dense(3, name="d1"),
                                 keras.layers.BatchNormalization(), keras.layers.Dense(2)])


    def functional():
        inp = keras.Input((5,))
        x = keras.layers.Dense(6, name="enc")(inp)
        x = keras.layers.LayerNormalization(name="norm")(x)
        return keras.Model(inp, keras.layers.Dense(3, name="head")(x))
''')


@pytest.fixture
def models(tmp_path, monkeypatch):
    path = tmp_path / "models.py"
    path.write_text(MODELS, encoding="utf-8")
    scope: dict = {}
    exec(compile(MODELS, str(path), "exec"), scope)
    monkeypatch.chdir(tmp_path)
    return scope


def save_run(tf, directory, model, steps=(100, 200, 300), seed=0):
    """A CheckpointManager run of ``model``; returns the values saved at each step, in ``model.weights`` order."""
    ckpt = tf.train.Checkpoint(model=model)
    mgr = tf.train.CheckpointManager(ckpt, str(directory), max_to_keep=10)
    saved = []
    for i, s in enumerate(steps):
        rng = np.random.RandomState(seed + i)
        for v in model.weights:
            v.assign(rng.standard_normal(tuple(v.shape)).astype(np.dtype(v.dtype)))
        saved.append([np.array(v.numpy()) for v in model.weights])
        mgr.save(checkpoint_number=s)
    return saved


def check_loaded(model, saved):
    for v, values in zip(model.weights, zip(*saved)):
        np.testing.assert_allclose(v.numpy(), np.mean(values, axis=0), rtol=1e-6, err_msg=v.path)


@pytest.mark.parametrize("name", ["sequential", "functional"])
def test_cli_average_to_weights_h5_with_model_loads_with_keras(tf, tmp_path, models, name):
    saved = save_run(tf, tmp_path / "run", models[name](), seed=len(name))
    out = tmp_path / "avg.weights.h5"
    result = run("average", tmp_path / "run", "--last", "3", "--model", f"models.py:{name}", "-o", out)
    assert result.exit_code == 0, result.output
    model = models[name]()
    model.load_weights(str(out))  # Keras's own loader: it raises on anything it cannot place
    check_loaded(model, saved)


def test_weights_h5_of_tf_inputs_without_model_is_refused_before_writing(tf, tmp_path, models):
    save_run(tf, tmp_path / "run", models["sequential"]())
    out = tmp_path / "avg.weights.h5"
    result = run("average", tmp_path / "run", "--last", "2", "-o", out)
    assert_one_line_error(result, "load_weights", "are variable names ('sequential", "--model MODULE:FUNCTION",
                          "Nothing was written")
    assert not out.exists() and not [p for p in os.listdir(tmp_path) if "weights" in p]
    with pytest.raises(cm.CkptMergeError, match="template=<the Keras model>"):
        cm.merge([cm.combine(str(tmp_path / "run"), "mean", last=2)], out, dry_run=True)  # a dry run says so too


def test_api_merge_and_combine_with_model_template(tf, tmp_path, models):
    saved = save_run(tf, tmp_path / "run", models["functional"](), steps=(1, 2))
    out = tmp_path / "avg.weights.h5"
    report = cm.merge([cm.combine(str(tmp_path / "run"), "mean")], out, template=models["functional"]())
    assert report.notes == []
    model = models["functional"]()
    model.load_weights(str(out))
    check_loaded(model, saved)
    one = tmp_path / "one.weights.h5"  # a plain merge of one checkpoint: the same layout
    cm.merge([str(tmp_path / "run" / "ckpt-2")], one, template=models["functional"]())
    model = models["functional"]()
    model.load_weights(str(one))
    check_loaded(model, saved[1:])


def test_cli_merge_with_model_to_weights_h5(tf, tmp_path, models):
    saved = save_run(tf, tmp_path / "run", models["functional"](), steps=(5,))
    cfg = tmp_path / "m.yaml"
    cfg.write_text(f"sources:\n  - path: {tmp_path / 'run' / 'ckpt-5'}\n", encoding="utf-8")
    out = tmp_path / "m.weights.h5"
    result = run("merge", cfg, "--model", "models.py:functional", "-o", out)
    assert result.exit_code == 0, result.output
    model = models["functional"]()
    model.load_weights(str(out))
    check_loaded(model, saved)


def test_a_layer_left_out_is_said_before_writing(tf, tmp_path, models):
    save_run(tf, tmp_path / "run", models["functional"](), steps=(1,))
    src = cm.Source(str(tmp_path / "run" / "ckpt-1"), exclude=["*head*"])
    report = cm.merge([src], tmp_path / "m.weights.h5", template=models["functional"](), allow_missing=["*head*"],
                      dry_run=True)
    assert any("load_weights raises for 1 layer" in n and "'layers/dense_1': 2" in n for n in report.notes), report.notes
    assert "Note: model.load_weights raises" in report.render()


def test_weights_h5_inputs_need_no_model(tmp_path, models):
    """Keras files already hold entries: merged or averaged, they load as they are."""
    saved = []
    for i in range(2):
        model = models["sequential"]()
        for v in model.weights:
            v.assign(np.full(tuple(v.shape), float(i), np.float32))
        saved.append([np.array(v.numpy()) for v in model.weights])
        model.save_weights(str(tmp_path / f"w{i}.weights.h5"))
    out = tmp_path / "avg.weights.h5"
    result = run("combine", tmp_path / "w0.weights.h5", tmp_path / "w1.weights.h5", "-o", out)
    assert result.exit_code == 0, result.output
    model = models["sequential"]()
    model.load_weights(str(out))
    check_loaded(model, saved)


def test_keras_archive_output_is_refused_with_what_to_do(tf, tmp_path, models):
    save_run(tf, tmp_path / "run", models["sequential"](), steps=(1,))
    result = run("average", tmp_path / "run", "-o", tmp_path / "avg.keras")
    assert_one_line_error(result, ".keras archives", "avg.weights.h5", "--model")
    assert not [p for p in os.listdir(tmp_path) if p.startswith("avg")]
