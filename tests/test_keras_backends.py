"""Keras 3 on JAX (and PyTorch, where installed): restore, Restorer, snapshot and warm_start.

Keras picks its backend once per process, so the scenarios run in a child interpreter with
``KERAS_BACKEND`` set: one child per backend runs all four (importing Keras and JAX once, not once
per scenario), each on a model of its own and each reporting on its own, so one that fails does
not hide the others. Checkpoints are written here by TensorFlow (or by the safetensors package);
the child restores them through ckptmerge, reports the values as JSON, and says whether
TensorFlow was imported by then (it must not be).
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

# Each scenario's model: Dense 4->3 ('h0') and Dense 3->2 ('logits') in a Sequential named 'clf'.
MODEL = """
model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3, name="h0"),
                          keras.layers.Dense(2, name="logits")], name="clf")
"""

MAP = {"dnn/hiddenlayer_0/": "clf/h0/", "dnn/logits/": "clf/logits/"}

#: Each scenario: code that reads its inputs from ``args`` and sets ``result``.
SCENARIOS = {
    "tf1_warm_start": f"""
        x = np.ones((1, 4), "float32")
        report = cm.restore(model, [cm.Source(args["prefix"], map={MAP!r})])
        result = {{"mode": report.mode, "restored": report.restored,
                   "kernel": model.get_layer("h0").kernel.numpy().tolist(),
                   "out": keras.ops.convert_to_numpy(model(x)).tolist()}}
    """,
    "safetensors_config": """
        report = cm.warm_start(model, args["config"])
        result = {"restored": report.restored, "kernel": model.get_layer("h0").kernel.numpy().tolist(),
                  "bias": model.get_layer("h0").bias.numpy().tolist()}
    """,
    "restorer_steps": """
        kernel = model.get_layer("h0").kernel
        r = cm.Restorer(model, [cm.Source(args["run"], step=1, map={"dnn/hiddenlayer_0/": "clf/h0/"})],
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
    """,
    "failed_read": """
        before = [w.numpy().tolist() for w in model.weights]
        try:
            cm.restore(model, [cm.Source(args["prefix"], map={"dnn/hiddenlayer_0/": "clf/h0/"}),
                               cm.Source(args["bad"], map={"logits.weight": "clf/logits/kernel"})],
                       allow_missing=["clf/logits/bias"])
            error = None
        except cm.CkptMergeError as e:
            error = type(e).__name__
        result = {"error": error, "unchanged": before == [w.numpy().tolist() for w in model.weights]}
    """,
}

# The child: each scenario in a function of its own (a fresh model, its own failure), then one line
# of JSON: {scenario: result, or {"failed": traceback}}, with "tensorflow_imported" after each.
DRIVER = """
import json, sys, traceback
import numpy as np
import keras
import ckptmerge as cm
args = json.loads(sys.argv[1])
scenarios = json.loads(sys.argv[2])
results = {}
for name, code in scenarios.items():
    space = {"keras": keras, "np": np, "cm": cm, "args": args}
    try:
        exec(code, space)
        results[name] = space["result"]
    except BaseException:
        results[name] = {"failed": traceback.format_exc()[-3000:]}
    results[name]["tensorflow_imported"] = "tensorflow" in sys.modules
print(json.dumps(results))
"""


def _child(backend: str, argv: list) -> dict:
    """Run ``python ARGV`` with ``KERAS_BACKEND=backend``; return the JSON it prints last."""
    env = dict(os.environ, KERAS_BACKEND=backend, PYTHONPATH=str(REPO), TF_CPP_MIN_LOG_LEVEL="3")
    out = subprocess.run([sys.executable, *map(str, argv)], cwd=REPO, env=env, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def run_scenarios(backend: str, args: dict) -> dict:
    """Run every scenario with ``KERAS_BACKEND=backend`` in one child; return its results."""
    codes = {name: textwrap.dedent(MODEL) + textwrap.dedent(code) for name, code in SCENARIOS.items()}
    return _child(backend, ["-c", DRIVER, json.dumps(args), json.dumps(codes)])


def run_backend(backend: str, code: str, *args) -> dict:
    """Run ``code`` (after ``import keras`` and the model) in a child of its own with
    ``KERAS_BACKEND=backend``; return its ``result``, with ``tensorflow_imported``."""
    script = "import keras\n" + textwrap.dedent(MODEL) + textwrap.dedent(code) + textwrap.dedent("""
        import json, sys
        result["tensorflow_imported"] = "tensorflow" in sys.modules
        print(json.dumps(result))
    """)
    return _child(backend, ["-c", script, *args])


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    """Every scenario's files, written once: a TF1 Estimator-style checkpoint, a safetensors file
    with a warm-start config, a run of two steps, and a truncated safetensors file."""
    tmp = tmp_path_factory.mktemp("backends")
    rng = np.random.default_rng(5)
    dnn = {"dnn/hiddenlayer_0/kernel": rng.standard_normal((4, 3)).astype(np.float32),
           "dnn/hiddenlayer_0/bias": rng.standard_normal(3).astype(np.float32),
           "dnn/logits/kernel": rng.standard_normal((3, 2)).astype(np.float32),
           "dnn/logits/bias": rng.standard_normal(2).astype(np.float32)}
    prefix = save_tf1(tmp / "est" / "model.ckpt", dnn, step=100)

    rng = np.random.default_rng(9)
    weights = {"h0.weight": rng.standard_normal((4, 3)).astype(np.float32),
               "h0.bias": rng.standard_normal(3).astype(np.float32)}
    st_numpy.save_file(weights, str(tmp / "enc.safetensors"))
    (tmp / "warm.yaml").write_text(textwrap.dedent(f"""
        sources:
          - path: {tmp / 'enc.safetensors'}
            map: {{h0.weight: clf/h0/kernel, h0.bias: clf/h0/bias}}
        allow_missing: ["clf/logits/*"]
    """))

    rng = np.random.default_rng(11)
    steps = {}
    for step in (1, 2):
        steps[step] = {"dnn/hiddenlayer_0/kernel": rng.standard_normal((4, 3)).astype(np.float32),
                       "dnn/hiddenlayer_0/bias": rng.standard_normal(3).astype(np.float32)}
        save_tf1(tmp / "run" / "model.ckpt", steps[step], step=step)

    bad = tmp / "bad.safetensors"
    st_numpy.save_file({"logits.weight": np.ones((3, 2), np.float32)}, str(bad))
    with open(bad, "r+b") as f:  # drop the tensor's last bytes: the read fails, after the other source's
        f.truncate(os.path.getsize(bad) - 4)
    args = {"prefix": prefix, "config": str(tmp / "warm.yaml"), "run": str(tmp / "run"), "bad": str(bad)}
    return args, {"dnn": dnn, "weights": weights, "steps": steps}


@pytest.fixture(scope="module", params=BACKENDS)
def results(request, inputs):
    return run_scenarios(request.param, inputs[0])


def scenario(results: dict, name: str) -> dict:
    result = results[name]
    assert "failed" not in result, result["failed"]
    return result


def test_tf1_checkpoint_warm_starts_a_keras_model_on_another_backend(results, inputs):
    values = inputs[1]["dnn"]
    result = scenario(results, "tf1_warm_start")
    assert result["mode"] == "keras" and not result["tensorflow_imported"]
    assert result["restored"] == ["clf/h0/bias", "clf/h0/kernel", "clf/logits/bias", "clf/logits/kernel"]
    np.testing.assert_array_equal(np.float32(result["kernel"]), values["dnn/hiddenlayer_0/kernel"])
    h = np.ones((1, 4), np.float32) @ values["dnn/hiddenlayer_0/kernel"] + values["dnn/hiddenlayer_0/bias"]
    want = h @ values["dnn/logits/kernel"] + values["dnn/logits/bias"]
    np.testing.assert_allclose(np.float32(result["out"]), want, rtol=1e-5)


def test_safetensors_warm_start_config_into_keras_on_another_backend(results, inputs):
    weights = inputs[1]["weights"]
    result = scenario(results, "safetensors_config")
    assert not result["tensorflow_imported"]
    assert result["restored"] == ["clf/h0/bias", "clf/h0/kernel"]
    np.testing.assert_array_equal(np.float32(result["kernel"]), weights["h0.weight"])
    np.testing.assert_array_equal(np.float32(result["bias"]), weights["h0.bias"])


def test_restorer_switches_steps_and_snapshots_restore_on_another_backend(results, inputs):
    steps = inputs[1]["steps"]
    result = scenario(results, "restorer_steps")
    assert not result["tensorflow_imported"]
    np.testing.assert_array_equal(np.float32(result["at1"]), steps[1]["dnn/hiddenlayer_0/kernel"])
    for key in ("at2", "back", "twin"):
        np.testing.assert_array_equal(np.float32(result[key]), steps[2]["dnn/hiddenlayer_0/kernel"], err_msg=key)


def test_a_failed_read_changes_nothing_on_another_backend(results):
    result = scenario(results, "failed_read")
    assert result["error"] in ("RestoreError", "CheckpointFormatError")
    assert result["unchanged"] and not result["tensorflow_imported"]
