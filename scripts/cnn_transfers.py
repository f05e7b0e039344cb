"""torchvision / timm CNNs into keras.applications and KerasHub with no map (issue 32): targets,
assigned, WRONG, output difference per model; writes docs/cnn_transfers.md.

The torch half (scripts/_cnn_torch.py, run in the torch venv) builds each model with seeded random
weights (weights=None / pretrained=False, every BatchNorm randomised) and saves safetensors plus
PyTorch's output on a fixed input. This half plans ``cm.Source(path, layout="torch",
align="structure")`` into the Keras model and scores every assigned tensor against a ground truth
made independently of ckptmerge:

- KerasHub rows (timm models): KerasHub's own timm converter, recorded ``port_weight`` call by call.
- keras.applications rows (torchvision models): the i-th tensor of a role (conv/linear kernel, its
  bias, BatchNorm gamma/beta/mean/variance, LayerNorm gamma/beta, layer scale) in PyTorch's
  state-dict order goes to the i-th Keras variable of that role in creation order; that mapping is
  itself checked by loading it into a fresh model and comparing with PyTorch's output
  ("truth diff" column).

Usage: python scripts/cnn_transfers.py [--torch-python PY] [--work DIR] [--reuse] [--only NAME]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from typing import Any, Dict, List, Tuple

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, ROOT)

import ckptmerge as cm  # noqa: E402

#: name -> (target label, builder of the Keras model (weights=None), how the input is fed)
def _apps() -> Dict[str, Tuple[str, Any, float]]:
    import keras

    A = keras.applications
    return {
        "tv_densenet121": ("keras.applications.DenseNet121",
                           lambda s: A.DenseNet121(weights=None, input_shape=(s, s, 3), classifier_activation=None), 1.0),
        "tv_mobilenet_v2": ("keras.applications.MobileNetV2",
                            lambda s: A.MobileNetV2(weights=None, input_shape=(s, s, 3), classifier_activation=None), 1.0),
        "tv_mobilenet_v3_small": ("keras.applications.MobileNetV3Small",
                                  lambda s: A.MobileNetV3Small(weights=None, input_shape=(s, s, 3),
                                                               include_preprocessing=False,
                                                               classifier_activation=None), 1.0),
        "tv_efficientnet_b0": ("keras.applications.EfficientNetB0",
                               lambda s: A.EfficientNetB0(weights=None, input_shape=(s, s, 3),
                                                          classifier_activation=None), 255.0),
        "tv_convnext_tiny": ("keras.applications.ConvNeXtTiny",
                             lambda s: A.ConvNeXtTiny(weights=None, input_shape=(s, s, 3), include_preprocessing=False,
                                                      classifier_activation=None), 1.0),
    }


HUB = {"timm_resnet18": "ResNetBackbone", "timm_densenet121": "DenseNetBackbone",
       "timm_efficientnet_b0": "EfficientNetBackbone", "timm_mobilenetv3_small_050": "MobileNetBackbone"}


def _tensors(d: str) -> Dict[str, np.ndarray]:
    from safetensors.numpy import load_file

    return load_file(os.path.join(d, "model.safetensors"))


# -- ground truth ---------------------------------------------------------------------------------

_TORCH_ROLE = {("Conv2d", "weight"): "kernel", ("Linear", "weight"): "kernel", ("Conv2d", "bias"): "kbias",
               ("Linear", "bias"): "kbias", ("BatchNorm2d", "weight"): "bn_w", ("BatchNorm2d", "bias"): "bn_b",
               ("BatchNorm2d", "running_mean"): "bn_m", ("BatchNorm2d", "running_var"): "bn_v",
               ("LayerNorm", "weight"): "ln_w", ("LayerNorm", "bias"): "ln_b", ("LayerNorm2d", "weight"): "ln_w",
               ("LayerNorm2d", "bias"): "ln_b", ("CNBlock", "layer_scale"): "scale"}
_KERAS_ROLE = {("Conv2D", "kernel"): "kernel", ("DepthwiseConv2D", "kernel"): "kernel",
               ("Dense", "kernel"): "kernel", ("Conv2D", "bias"): "kbias", ("DepthwiseConv2D", "bias"): "kbias",
               ("Dense", "bias"): "kbias", ("BatchNormalization", "gamma"): "bn_w",
               ("BatchNormalization", "beta"): "bn_b", ("BatchNormalization", "moving_mean"): "bn_m",
               ("BatchNormalization", "moving_variance"): "bn_v", ("LayerNormalization", "gamma"): "ln_w",
               ("LayerNormalization", "beta"): "ln_b", ("LayerScale", "gamma"): "scale", ("LayerScale", "variable"): "scale"}


def _to_keras(v: np.ndarray, layer_cls: str, shape: Tuple[int, ...]) -> np.ndarray:
    if v.ndim == 4:
        v = np.transpose(v, (2, 3, 0, 1) if layer_cls == "DepthwiseConv2D" else (2, 3, 1, 0))
    elif v.ndim == 2:
        v = v.T
    return np.ascontiguousarray(v.reshape(shape))


def _leaves(layer: Any) -> List[Any]:
    """The layers holding variables, in creation order (nested Sequential blocks opened)."""
    inner = getattr(layer, "layers", None)
    if not inner:
        return [layer]
    return [leaf for sub in inner for leaf in _leaves(sub)]


def order_truth(model: Any, d: str) -> Tuple[Dict[str, Tuple[str, np.ndarray]], List[str]]:
    """``{variable.path: (torch key, value)}`` by role and order, and the roles whose counts or shapes
    disagree (left out of the truth)."""
    with open(os.path.join(d, "modules.json")) as f:
        meta = json.load(f)
    raw = _tensors(d)
    by_role: Dict[str, List[str]] = {}
    for key in meta["order"]:
        role = _TORCH_ROLE.get((meta["modules"][key], key.rsplit(".", 1)[-1]))
        if role:
            by_role.setdefault(role, []).append(key)
    kvars: Dict[str, List[Tuple[Any, str]]] = {}
    for layer in _leaves(model):
        for v in layer.weights:
            leaf = v.path.rsplit("/", 1)[-1].replace("depthwise_", "")
            leaf = "variable" if leaf.startswith("variable") else leaf  # LayerScale's variable, variable_1, ...
            role = _KERAS_ROLE.get((type(layer).__name__, leaf))
            if role:
                kvars.setdefault(role, []).append((v, type(layer).__name__))
    truth, bad = {}, []
    for role in sorted(set(by_role) | set(kvars)):
        keys, vars_ = by_role.get(role, []), kvars.get(role, [])
        if len(keys) != len(vars_):
            bad.append(f"{role}: {len(keys)} torch vs {len(vars_)} keras")
            continue
        part = {}
        for key, (v, cls) in zip(keys, vars_):
            if int(np.prod(raw[key].shape)) != int(np.prod(v.shape)):
                bad.append(f"{role}: {key} {raw[key].shape} vs {v.path} {tuple(v.shape)}")
                part = None
                break
            part[v.path] = (key, _to_keras(raw[key], cls, tuple(v.shape)))
        if part:
            truth.update(part)
    return truth, bad


def hub_truth(name: str, d: str) -> Tuple[Any, Dict[str, Tuple[str, np.ndarray]]]:
    """KerasHub's timm converter run on the folder, every ``port_weight`` recorded."""
    import keras_hub
    from keras_hub.src.utils.transformers import safetensor_utils

    loader_cls = safetensor_utils.SafetensorLoader
    original = loader_cls.port_weight
    truth: Dict[str, Tuple[str, np.ndarray]] = {}

    def recording(self: Any, keras_variable: Any, hf_weight_key: str, hook_fn: Any = None) -> None:
        original(self, keras_variable, hf_weight_key, hook_fn)
        truth[keras_variable.path] = (hf_weight_key, np.asarray(keras_variable.numpy()))

    loader_cls.port_weight = recording
    try:
        backbone = getattr(keras_hub.models, HUB[name]).from_preset(d)
    finally:
        loader_cls.port_weight = original
    return backbone, truth


# -- one row --------------------------------------------------------------------------------------

def _diff(got: Any, want: np.ndarray) -> float:
    got = np.asarray(got)
    if got.shape != want.shape and got.size == want.size:
        got = got.reshape(want.shape)
    if got.shape != want.shape:
        return float("nan")
    return float(np.max(np.abs(got - want)) / max(1.0, float(np.max(np.abs(want)))))


def _output(name: str, model: Any, ref: Dict[str, np.ndarray], scale: float) -> float:
    x = np.transpose(ref["images"], (0, 2, 3, 1)) * scale
    out = np.asarray(model(x))
    if name.startswith("timm"):
        return _diff(out, np.transpose(ref["features"], (0, 2, 3, 1)))
    return _diff(out, ref["logits"])


def row(name: str, d: str) -> Dict[str, Any]:
    ref = dict(np.load(os.path.join(d, "reference.npz")))
    image = ref["images"].shape[-1]
    if name in HUB:
        import keras_hub

        ref_model, truth = hub_truth(name, d)
        label, scale = f"keras_hub {HUB[name]}", 1.0
        truth_diff = _output(name, ref_model, ref, scale)
        model = getattr(keras_hub.models, HUB[name]).from_preset(d, load_weights=False)
        bad: List[str] = []
    else:
        label, make, scale = _apps()[name]
        model = make(image)
        truth, bad = order_truth(model, d)
        check = make(image)
        index = {v.path: i for i, v in enumerate(model.weights)}  # (variable paths differ between builds)
        for path, (_, value) in truth.items():
            check.weights[index[path]].assign(value)
        truth_diff = _output(name, check, ref, scale)
    before = {v.path: np.array(v.numpy()) for v in model.weights}
    t0 = time.perf_counter()
    plan = cm.plan(model, [cm.Source(os.path.join(d, "model.safetensors"), layout="torch", align="structure")])
    plan.restore(strict=False)
    seconds = time.perf_counter() - t0
    values = {v.path: np.asarray(v.numpy()) for v in model.weights}
    assigned = list(plan.assignments)
    changed = {t for t, v in values.items() if not np.array_equal(v, before[t])} | set(assigned)
    wrong = sorted(t for t in changed if t not in truth or not np.array_equal(values[t], truth[t][1]))
    right = sorted(t for t in changed if t in truth and np.array_equal(values[t], truth[t][1]))
    missing = sorted(set(truth) - set(right))
    return {"name": name, "target": label, "variables": len(model.weights), "targets": len(truth),
            "assigned": len(assigned), "right": len(right), "wrong": len(wrong), "wrong_targets": wrong[:20],
            "missing": len(missing), "missing_examples": missing[:8], "truth_gaps": bad,
            "truth_diff": truth_diff, "output_diff": _output(name, model, ref, scale), "seconds": round(seconds, 2)}


def write_doc(rows: List[Dict[str, Any]], path: str) -> None:
    lines = [
        "# CNN transfers: torchvision and timm into keras.applications and KerasHub",
        "",
        "Made by `python scripts/cnn_transfers.py` (issue 32): each source model is built in the torch venv",
        "with seeded random weights (no downloads, every BatchNorm's weight, bias and running statistics",
        "randomised, BatchNorm epsilon set to the Keras target's) and restored with no map:",
        "`cm.Source(path, layout=\"torch\", align=\"structure\")`, `restore(strict=False)`.",
        "",
        "*Targets* are the Keras variables that have a source tensor in the ground truth: KerasHub's own timm",
        "converter for the KerasHub rows; for keras.applications, PyTorch's state-dict order matched role by role",
        "(conv/linear kernel, bias, BatchNorm, LayerNorm, layer scale) to Keras's creation order, a mapping checked",
        "by its *truth diff* (the fresh model loaded with it against PyTorch's output). *Wrong* counts assigned",
        "variables whose value is not the truth's, bit for bit (or that have no truth). *Output diff* is the",
        "restored model against PyTorch (max absolute difference, relative when outputs exceed 1).",
        "",
        "| source | target | targets | assigned | right | wrong | missing | truth diff | output diff |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(f"| {r['name']} | {r['target']} | {r['targets']} | {r['assigned']} | {r['right']} | **{r['wrong']}** | "
                     f"{r['missing']} | {r['truth_diff']:.1e} | {r['output_diff']:.1e} |")
    lines += [
        "",
        "Reading the table: *wrong* is the never-wrong rule and is 0 on every row. *Missing* targets stay",
        "unresolved (a strict restore refuses them; with `strict=False` they keep their initial values).",
        "An output difference alone does not prove completeness on these deep random networks: a few",
        "missing early tensors can leave the output almost unchanged (MobileNetV2, EfficientNetB0), so",
        "the per-tensor comparison is what counts. For the KerasHub rows the truth diff is KerasHub's own",
        "converter against timm's `forward_features` (DenseNet and MobileNetV3 differ there already: the",
        "backbone's last stage is not timm's), so their output diff is not expected to reach 0.",
        "",
        "Rows where a truth role could not be matched by order are listed with the gap:", ""]
    lines += [f"- {r['name']}: {'; '.join(r['truth_gaps'])}" for r in rows if r["truth_gaps"]] or ["- none"]
    lines.append("")
    with open(path, "w") as f:
        f.write("\n".join(lines))


def main(argv: List[str] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--torch-python", default=os.environ.get("CKPTMERGE_TORCH_PYTHON", "/work/venvs/torch/bin/python"))
    p.add_argument("--work", default="/tmp/cnn_transfers")
    p.add_argument("--reuse", action="store_true", help="reuse the models already in --work")
    p.add_argument("--only", action="append", default=[])
    p.add_argument("--doc", default=os.path.join(ROOT, "docs", "cnn_transfers.md"))
    a = p.parse_args(argv)
    if not a.reuse:
        subprocess.run([a.torch_python, os.path.join(HERE, "_cnn_torch.py"), a.work], check=True)
    names = a.only or sorted(n for n in os.listdir(a.work) if os.path.isdir(os.path.join(a.work, n)))
    rows = []
    for name in names:
        r = row(name, os.path.join(a.work, name))
        print(json.dumps(r), flush=True)
        rows.append(r)
    if not a.only:
        write_doc(rows, a.doc)
        with open(os.path.join(a.work, "rows.json"), "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
