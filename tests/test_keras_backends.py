"""Keras 3 on JAX (and PyTorch, where installed): restore, Restorer, snapshot and warm_start.

Each scenario runs in a child interpreter with ``KERAS_BACKEND`` set, since Keras picks its
backend once per process. Checkpoints are written here by TensorFlow (or by the safetensors
package); the child restores them through ckptmerge, reports the values as JSON, and says whether
TensorFlow was imported (it must not be).
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import safetensors.numpy as st_numpy

from conftest import save_tf1

REPO = Path(__file__).resolve().parents[1]

BACKENDS = [
    "jax",
    pytest.param("torch", marks=pytest.mark.skipif(
        importlib.util.find_spec("torch") is None,
        reason="PyTorch is not installed (pip install torch): the Keras torch backend is not tested")),
]

# The child's model: Dense 4->3 ('h0') and Dense 3->2 ('logits') in a Sequential named 'clf'.
MODEL = """
import keras
model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3, name="h0"),
                          keras.layers.Dense(2, name="logits")], name="clf")
"""


def run_backend(backend: str, code: str, *args) -> dict:
    """Run ``code`` with ``KERAS_BACKEND=backend``; return the JSON it prints last."""
    env = dict(os.environ, KERAS_BACKEND=backend, PYTHONPATH=str(REPO), TF_CPP_MIN_LOG_LEVEL="3")
    script = textwrap.dedent(MODEL) + textwrap.dedent(code) + textwrap.dedent("""
        import json, sys
        result["tensorflow_imported"] = "tensorflow" in sys.modules
        print(json.dumps(result))
    """)
    out = subprocess.run([sys.executable, "-c", script, *map(str, args)], cwd=REPO, env=env,
                         capture_output=True, text=True, timeout=240)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.fixture
def dnn_checkpoint(tmp_path):
    """An Estimator-style TF1 checkpoint: dnn/hiddenlayer_0 and dnn/logits, plus global_step."""
    rng = np.random.default_rng(5)
    values = {"dnn/hiddenlayer_0/kernel": rng.standard_normal((4, 3)).astype(np.float32),
              "dnn/hiddenlayer_0/bias": rng.standard_normal(3).astype(np.float32),
              "dnn/logits/kernel": rng.standard_normal((3, 2)).astype(np.float32),
              "dnn/logits/bias": rng.standard_normal(2).astype(np.float32)}
    return save_tf1(tmp_path / "est" / "model.ckpt", values, step=100), values


MAP = {"dnn/hiddenlayer_0/": "clf/h0/", "dnn/logits/": "clf/logits/"}


@pytest.mark.parametrize("backend", BACKENDS)
def test_tf1_checkpoint_warm_starts_a_keras_model_on_another_backend(backend, dnn_checkpoint):
    prefix, values = dnn_checkpoint
    result = run_backend(backend, f"""
        import sys, numpy as np, ckptmerge as cm
        x = np.ones((1, 4), "float32")
        report = cm.restore(model, [cm.Source(sys.argv[1], map={MAP!r})])
        result = {{"mode": report.mode, "restored": report.restored,
                   "kernel": model.get_layer("h0").kernel.numpy().tolist(),
                   "out": keras.ops.convert_to_numpy(model(x)).tolist()}}
    """, prefix)
    assert result["mode"] == "keras" and not result["tensorflow_imported"]
    assert result["restored"] == ["clf/h0/bias", "clf/h0/kernel", "clf/logits/bias", "clf/logits/kernel"]
    np.testing.assert_array_equal(np.float32(result["kernel"]), values["dnn/hiddenlayer_0/kernel"])
    h = np.ones((1, 4), np.float32) @ values["dnn/hiddenlayer_0/kernel"] + values["dnn/hiddenlayer_0/bias"]
    want = h @ values["dnn/logits/kernel"] + values["dnn/logits/bias"]
    np.testing.assert_allclose(np.float32(result["out"]), want, rtol=1e-5)


@pytest.mark.parametrize("backend", BACKENDS)
def test_safetensors_warm_start_config_into_keras_on_another_backend(backend, tmp_path):
    rng = np.random.default_rng(9)
    weights = {"h0.weight": rng.standard_normal((4, 3)).astype(np.float32),
               "h0.bias": rng.standard_normal(3).astype(np.float32)}
    st_numpy.save_file(weights, str(tmp_path / "enc.safetensors"))
    (tmp_path / "warm.yaml").write_text(textwrap.dedent(f"""
        sources:
          - path: {tmp_path / 'enc.safetensors'}
            map: {{h0.weight: clf/h0/kernel, h0.bias: clf/h0/bias}}
        allow_missing: ["clf/logits/*"]
    """))
    result = run_backend(backend, """
        import sys, ckptmerge as cm
        report = cm.warm_start(model, sys.argv[1])
        result = {"restored": report.restored, "kernel": model.get_layer("h0").kernel.numpy().tolist(),
                  "bias": model.get_layer("h0").bias.numpy().tolist()}
    """, tmp_path / "warm.yaml")
    assert not result["tensorflow_imported"]
    assert result["restored"] == ["clf/h0/bias", "clf/h0/kernel"]
    np.testing.assert_array_equal(np.float32(result["kernel"]), weights["h0.weight"])
    np.testing.assert_array_equal(np.float32(result["bias"]), weights["h0.bias"])


@pytest.mark.parametrize("backend", BACKENDS)
def test_restorer_switches_steps_and_snapshots_restore_on_another_backend(backend, tmp_path):
    rng = np.random.default_rng(11)
    steps = {}
    for step in (1, 2):
        steps[step] = {"dnn/hiddenlayer_0/kernel": rng.standard_normal((4, 3)).astype(np.float32),
                       "dnn/hiddenlayer_0/bias": rng.standard_normal(3).astype(np.float32)}
        save_tf1(tmp_path / "run" / "model.ckpt", steps[step], step=step)
    result = run_backend(backend, """
        import sys, numpy as np, ckptmerge as cm
        kernel = model.get_layer("h0").kernel
        r = cm.Restorer(model, [cm.Source(sys.argv[1], step=1, map={"dnn/hiddenlayer_0/": "clf/h0/"})],
                        allow_missing=["clf/logits/*"])
        r.restore()
        at1 = kernel.numpy().tolist()
        r.restore(step=2)
        at2 = kernel.numpy().tolist()
        snap = cm.snapshot(model)
        kernel.assign(np.zeros((4, 3), "float32"))
        cm.restore(model, [snap])
        back = kernel.numpy().tolist()
        twin = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3, name="h0"),
                                 keras.layers.Dense(2, name="logits")], name="clf")
        cm.restore(twin, [cm.Source.from_values(model)])   # a live source: another model's weights
        result = {"at1": at1, "at2": at2, "back": back, "twin": twin.get_layer("h0").kernel.numpy().tolist()}
    """, tmp_path / "run")
    assert not result["tensorflow_imported"]
    np.testing.assert_array_equal(np.float32(result["at1"]), steps[1]["dnn/hiddenlayer_0/kernel"])
    for key in ("at2", "back", "twin"):
        np.testing.assert_array_equal(np.float32(result[key]), steps[2]["dnn/hiddenlayer_0/kernel"], err_msg=key)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_failed_read_changes_nothing_on_another_backend(backend, dnn_checkpoint, tmp_path):
    prefix, _ = dnn_checkpoint
    bad = tmp_path / "bad.safetensors"
    st_numpy.save_file({"logits.weight": np.ones((3, 2), np.float32)}, str(bad))
    with open(bad, "r+b") as f:  # drop the tensor's last bytes: the read fails, after the other source's
        f.truncate(os.path.getsize(bad) - 4)
    result = run_backend(backend, """
        import sys, numpy as np, ckptmerge as cm
        before = [w.numpy().tolist() for w in model.weights]
        try:
            cm.restore(model, [cm.Source(sys.argv[1], map={"dnn/hiddenlayer_0/": "clf/h0/"}),
                               cm.Source(sys.argv[2], map={"logits.weight": "clf/logits/kernel"})],
                       allow_missing=["clf/logits/bias"])
            error = None
        except cm.CkptMergeError as e:
            error = type(e).__name__
        result = {"error": error, "unchanged": before == [w.numpy().tolist() for w in model.weights]}
    """, prefix, bad)
    assert result["error"] in ("RestoreError", "CheckpointFormatError")
    assert result["unchanged"] and not result["tensorflow_imported"]
