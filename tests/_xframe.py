"""Cross-framework fixtures and their ground truth (issue 19), for the tests and scripts/bench_xframe.py.

The fixtures (tests/fixtures/xframe/, made by scripts/make_xframe_fixtures.py in a torch venv)
are tiny PyTorch / Hugging Face models saved as safetensors, with PyTorch's outputs on fixed
inputs. The ground truth of "which source tensor belongs in which target variable, and how" is
not written here by hand where KerasHub has a converter: :func:`keras_hub_truth` runs KerasHub's
own ``Backbone.from_preset(fixture_dir)`` and records every ``port_weight`` call it makes (target
variable, source key, the value it assigned). For torchvision's ResNet-18, which KerasHub does
not convert, :func:`resnet18_twin` builds the Keras twin with default layer names and returns its
truth beside it, recorded as each layer is made.

Nothing here imports torch. Importing keras_hub imports Keras (and TF through the backend).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Tuple

import numpy as np

FIXTURES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures", "xframe")

#: pair name -> KerasHub backbone class name, for the pairs KerasHub converts from a Hugging Face
#: folder (phi3: KerasHub's Phi3Backbone, built from the fixture's config; resnet18: the Keras twin below).
BACKBONES = {"bert": "BertBackbone", "gpt2": "GPT2Backbone", "llama": "LlamaBackbone", "vit": "ViTBackbone"}
PAIRS = (*BACKBONES, "phi3", "resnet18")


def fixture_dir(name: str) -> str:
    return os.path.join(FIXTURES, name)


def weights_file(name: str) -> str:
    return os.path.join(FIXTURES, name, "model.safetensors")


def tensors(path: Any) -> Dict[str, np.ndarray]:
    """A safetensors file's tensors (read with the safetensors package)."""
    from safetensors.numpy import load_file

    return load_file(str(path))


def assert_same_tensors(got: Dict[str, np.ndarray], want: Dict[str, np.ndarray]) -> None:
    """The same names, and per name the same dtype, shape and values, bit for bit."""
    assert sorted(got) == sorted(want)
    for k, v in want.items():
        assert (got[k].dtype, got[k].shape) == (v.dtype, v.shape), k
        assert np.array_equal(got[k], v), k


def reference(name: str) -> Dict[str, np.ndarray]:
    """The fixed inputs and PyTorch's outputs of a fixture."""
    with np.load(os.path.join(FIXTURES, name, "reference.npz")) as z:
        return {k: z[k] for k in z.files}


def source_tensors(name: str) -> Dict[str, np.ndarray]:
    """The fixture's raw tensors, by PyTorch key (read with the safetensors package)."""
    from safetensors.numpy import load_file

    return load_file(weights_file(name))


# -- the inverse direction: a Keras user's BERT names and the regex rules back onto the template --------

#: The forward layout's BERT names -> KerasHub BertBackbone-like names (what a Keras user has).
KERAS_HUB_BERT = [
    (r"encoder/layer/(\d+)/attention/self/(query|key|value)/", r"transformer_layer_\1/self_attention/\2/"),
    (r"encoder/layer/(\d+)/attention/output/dense/", r"transformer_layer_\1/self_attention/attention_output/"),
    (r"encoder/layer/(\d+)/attention/output/LayerNorm/", r"transformer_layer_\1/self_attention_layer_norm/"),
    (r"encoder/layer/(\d+)/intermediate/dense/", r"transformer_layer_\1/feedforward_intermediate_dense/"),
    (r"encoder/layer/(\d+)/output/dense/", r"transformer_layer_\1/feedforward_output_dense/"),
    (r"encoder/layer/(\d+)/output/LayerNorm/", r"transformer_layer_\1/feedforward_layer_norm/"),
    (r"embeddings/word_embeddings/", "token_embedding/"), (r"embeddings/position_embeddings/", "position_embedding/"),
    (r"embeddings/token_type_embeddings/", "segment_embedding/"), (r"embeddings/LayerNorm/", "embeddings_layer_norm/"),
    (r"pooler/dense/", "pooled_dense/")]

#: A user's regex rules from those names back onto the template, in each spelling: PyTorch's
#: names, the layout's names, and a dotted scope followed by the layout's path.
BERT_REGEX = [
    (r"transformer_layer_(\d+)/self_attention/(query|key|value)/kernel", r"encoder.layer.\1.attention.self.\2.weight"),
    (r"transformer_layer_(\d+)/self_attention/(query|key|value)/bias", r"encoder.layer.\1.attention.self.\2.bias"),
    (r"transformer_layer_(\d+)/self_attention/attention_output/(kernel|bias)",
     r"encoder/layer/\1/attention/output/dense/\2"),
    (r"transformer_layer_(\d+)/self_attention_layer_norm/(gamma|beta)", r"encoder.layer.\1.attention.output.LayerNorm/\2"),
    (r"transformer_layer_(\d+)/feedforward_intermediate_dense/(.*)", r"encoder.layer.\1.intermediate.dense/\2"),
    (r"transformer_layer_(\d+)/feedforward_output_dense/(.*)", r"encoder.layer.\1.output.dense/\2"),
    (r"transformer_layer_(\d+)/feedforward_layer_norm/(.*)", r"encoder.layer.\1.output.LayerNorm/\2"),
    (r"token_embedding/embeddings", "embeddings.word_embeddings.weight"),
    (r"position_embedding/embeddings", "embeddings.position_embeddings.weight"),
    (r"segment_embedding/embeddings", "embeddings.token_type_embeddings.weight"),
    (r"embeddings_layer_norm/gamma", "embeddings.LayerNorm.weight"),
    (r"embeddings_layer_norm/beta", "embeddings.LayerNorm.bias"),
    (r"pooled_dense/kernel", "pooler.dense.weight"), (r"pooled_dense/bias", "pooler.dense.bias")]


def keras_hub_name(name: str) -> str:
    """A forward-layout BERT name under the KerasHub-like name :data:`KERAS_HUB_BERT` gives it."""
    for pattern, repl in KERAS_HUB_BERT:
        new = re.sub("^" + pattern, repl, name)
        if new != name:
            return new
    raise KeyError(name)


def keras_hub_named(values: Dict[str, np.ndarray]) -> Dict[str, np.ndarray]:
    """The BERT fixture's Keras-side tensors (the forward layout's names) under KerasHub-like names."""
    return {keras_hub_name(n): v for n, v in values.items()}


@dataclass(frozen=True)
class Truth:
    """Where one target variable's value comes from.

    Attributes:
        key: the source tensor's raw (PyTorch) key.
        op: how its value is made: ``"copy"``, ``"transpose"`` or ``"other"`` (reshapes, slices,
            permutations: whatever the converter's hook did), found by comparing values.
        value: the value the reference put into the target.
    """

    key: str
    op: str
    value: np.ndarray


def _op_of(raw: np.ndarray, value: np.ndarray) -> str:
    if raw.shape == value.shape and np.array_equal(raw, value):
        return "copy"
    if raw.ndim == 2 and raw.T.shape == value.shape and np.array_equal(raw.T, value):
        return "transpose"
    return "other"


def keras_hub_truth(name: str) -> Tuple[Any, Dict[str, Truth]]:
    """Build the fixture's KerasHub backbone with ``from_preset(fixture_dir)`` and record, for
    every target variable KerasHub's converter fills, the source key and value.

    Returns:
        ``(backbone, {variable.path: Truth})``.
    """
    import keras_hub
    from keras_hub.src.utils.transformers import safetensor_utils

    loader_cls = safetensor_utils.SafetensorLoader
    original = loader_cls.port_weight
    raw = source_tensors(name)
    truth: Dict[str, Truth] = {}

    def recording(self: Any, keras_variable: Any, hf_weight_key: str, hook_fn: Optional[Callable] = None) -> None:
        original(self, keras_variable, hf_weight_key, hook_fn)
        key = self.get_prefixed_key(hf_weight_key, raw)
        value = np.asarray(keras_variable.numpy())
        truth[keras_variable.path] = Truth(key, _op_of(raw[key], value), value)

    loader_cls.port_weight = recording
    try:
        backbone = getattr(keras_hub.models, BACKBONES[name]).from_preset(fixture_dir(name))
    finally:
        loader_cls.port_weight = original
    return backbone, truth


def backbone_inputs(name: str, ref: Optional[Dict[str, np.ndarray]] = None) -> Any:
    """The reference inputs in the form the Keras model takes them."""
    ref = reference(name) if ref is None else ref
    if name in ("vit", "resnet18"):
        return ref["images"]
    keys = ("token_ids", "segment_ids", "padding_mask") if name == "bert" else ("token_ids", "padding_mask")
    return {k: ref[k] for k in keys}


def reference_outputs(name: str, ref: Optional[Dict[str, np.ndarray]] = None) -> Dict[str, np.ndarray]:
    """PyTorch's outputs, keyed as the Keras model names them (``"output"`` for a single one)."""
    ref = reference(name) if ref is None else ref
    if name == "bert":
        return {"sequence_output": ref["sequence_output"], "pooled_output": ref["pooled_output"]}
    if name == "resnet18":
        return {"output": ref["logits"]}
    return {"output": ref["sequence_output"]}


def output_difference(name: str, model: Any, ref: Optional[Dict[str, np.ndarray]] = None) -> float:
    """The largest absolute difference between the Keras model's outputs and PyTorch's."""
    ref = reference(name) if ref is None else ref
    out = model(backbone_inputs(name, ref))
    want = reference_outputs(name, ref)
    got = {k: out[k] for k in want} if isinstance(out, dict) else {"output": out}
    return max(float(np.max(np.abs(np.asarray(got[k]) - want[k]))) for k in want)


def fresh_backbone(name: str) -> Any:
    """The fixture's KerasHub backbone from its config alone (random weights, nothing ported)."""
    import keras_hub

    if name == "phi3":
        return phi3_backbone()
    return getattr(keras_hub.models, BACKBONES[name]).from_preset(fixture_dir(name), load_weights=False)


# ------------------------------------------------------------------------------------------------
# Phi-3: KerasHub has the backbone but no converter from a Hugging Face folder


def phi3_config() -> Dict[str, Any]:
    import json

    with open(os.path.join(FIXTURES, "phi3", "config.json")) as f:
        return json.load(f)


def phi3_backbone() -> Any:
    """``keras_hub.models.Phi3Backbone`` for the fixture's config (as KerasHub's
    tools/checkpoint_conversion/convert_phi3_checkpoints.py builds it), random weights."""
    import keras_hub

    c = phi3_config()
    return keras_hub.models.Phi3Backbone(
        vocabulary_size=c["vocab_size"], num_layers=c["num_hidden_layers"], hidden_dim=c["hidden_size"],
        intermediate_dim=c["intermediate_size"], num_query_heads=c["num_attention_heads"],
        num_key_value_heads=c["num_key_value_heads"], layer_norm_epsilon=c["rms_norm_eps"],
        max_sequence_length=c["max_position_embeddings"],
        pretraining_sequence_length=c["original_max_position_embeddings"],
        rope_max_wavelength=c["rope_parameters"]["rope_theta"], dtype="float32")


def phi3_truth() -> Dict[str, Truth]:
    """The ground truth of the Phi-3 pair, written after KerasHub's own Phi-3 conversion script
    (tools/checkpoint_conversion/convert_phi3_checkpoints.py): ``qkv_proj.weight.T`` split into
    query (the first heads * head_dim columns), key and value (kv_heads * head_dim each), reshaped
    into heads; ``gate_up_proj.weight.T`` split into the gate (first half) and
    ``feedforward_intermediate_dense`` (second half); ``lm_head.weight.T`` is
    ``reverse_embeddings``; ``o_proj.weight.T`` reshaped to (heads, head_dim, hidden)."""
    c = phi3_config()
    raw = source_tensors("phi3")
    heads, kv, hidden, inter = (c["num_attention_heads"], c["num_key_value_heads"], c["hidden_size"],
                                c["intermediate_size"])
    d = hidden // heads
    out = {"token_embedding/embeddings": ("model.embed_tokens.weight", raw["model.embed_tokens.weight"]),
           "token_embedding/reverse_embeddings": ("lm_head.weight", raw["lm_head.weight"].T),
           "sequence_output_layernorm/scale": ("model.norm.weight", raw["model.norm.weight"])}
    for i in range(c["num_hidden_layers"]):
        p, t = f"model.layers.{i}.", f"transformer_layer_{i}/"
        out[t + "pre_attention_layernorm/scale"] = (p + "input_layernorm.weight", raw[p + "input_layernorm.weight"])
        out[t + "post_attention_layernorm/scale"] = (p + "post_attention_layernorm.weight",
                                                     raw[p + "post_attention_layernorm.weight"])
        qkv = raw[p + "self_attn.qkv_proj.weight"].T
        out[t + "attention/query/kernel"] = (p + "self_attn.qkv_proj.weight", qkv[:, :heads * d].reshape(hidden, heads, d))
        out[t + "attention/key/kernel"] = (p + "self_attn.qkv_proj.weight",
                                           qkv[:, heads * d:(heads + kv) * d].reshape(hidden, kv, d))
        out[t + "attention/value/kernel"] = (p + "self_attn.qkv_proj.weight", qkv[:, (heads + kv) * d:].reshape(hidden, kv, d))
        out[t + "attention/attention_output/kernel"] = (p + "self_attn.o_proj.weight",
                                                        raw[p + "self_attn.o_proj.weight"].T.reshape(heads, d, hidden))
        gate_up = raw[p + "mlp.gate_up_proj.weight"].T
        out[t + "feedforward_gate_dense/kernel"] = (p + "mlp.gate_up_proj.weight", gate_up[:, :inter])
        out[t + "feedforward_intermediate_dense/kernel"] = (p + "mlp.gate_up_proj.weight", gate_up[:, inter:])
        out[t + "feedforward_output_dense/kernel"] = (p + "mlp.down_proj.weight", raw[p + "mlp.down_proj.weight"].T)
    return {path: Truth(key, _op_of(raw[key], value), np.ascontiguousarray(value)) for path, (key, value) in out.items()}


# ------------------------------------------------------------------------------------------------
# torchvision ResNet-18 and its Keras twin


def resnet18_twin(width: int = 4, num_classes: int = 10, image: int = 32) -> Tuple[Any, Dict[str, Tuple[str, str]]]:
    """A Keras functional ResNet-18 (torchvision's ``BasicBlock`` layout, channels last) with
    Keras's default layer names (``conv2d_7``, ``batch_normalization_7``), as a user would write it.

    Returns:
        ``(model, truth)`` where ``truth`` maps each target variable path to ``(torch key, op)``,
        recorded as the layers are made (``op``: ``"conv"`` (O,I,kh,kw)->(kh,kw,I,O),
        ``"transpose"``, ``"copy"``).
    """
    import keras
    from keras import layers

    truth: Dict[str, Tuple[str, str]] = {}

    def conv(x: Any, filters: int, k: int, stride: int, torch_name: str) -> Any:
        pad = k // 2
        if pad:
            x = layers.ZeroPadding2D(pad)(x)
        layer = layers.Conv2D(filters, k, strides=stride, use_bias=False)
        y = layer(x)
        truth[layer.kernel.path] = (torch_name + ".weight", "conv")
        return y

    def bn(x: Any, torch_name: str) -> Any:
        layer = layers.BatchNormalization(epsilon=1e-5, momentum=0.9)
        y = layer(x)
        for var, param in ((layer.gamma, "weight"), (layer.beta, "bias"), (layer.moving_mean, "running_mean"),
                           (layer.moving_variance, "running_var")):
            truth[var.path] = (f"{torch_name}.{param}", "copy")
        return y

    inputs = keras.Input((image, image, 3))
    x = conv(inputs, width, 7, 2, "conv1")
    x = layers.ReLU()(bn(x, "bn1"))
    x = layers.MaxPooling2D(3, strides=2)(layers.ZeroPadding2D(1)(x))
    channels = width
    for stage in range(4):
        planes = width * 2 ** stage
        for block in range(2):
            stride = 2 if stage and not block else 1
            name = f"layer{stage + 1}.{block}"
            y = layers.ReLU()(bn(conv(x, planes, 3, stride, name + ".conv1"), name + ".bn1"))
            y = bn(conv(y, planes, 3, 1, name + ".conv2"), name + ".bn2")
            if stride != 1 or channels != planes:
                x = bn(conv(x, planes, 1, stride, name + ".downsample.0"), name + ".downsample.1")
            x = layers.ReLU()(layers.Add()([y, x]))
            channels = planes
    x = layers.GlobalAveragePooling2D()(x)
    fc = layers.Dense(num_classes)
    out = fc(x)
    truth[fc.kernel.path] = ("fc.weight", "transpose")
    truth[fc.bias.path] = ("fc.bias", "copy")
    return keras.Model(inputs, out), truth


def resnet18_truth_values(truth: Dict[str, Tuple[str, str]]) -> Dict[str, Truth]:
    """:class:`Truth` per target of :func:`resnet18_twin`, with the values from the fixture."""
    raw = source_tensors("resnet18")
    out = {}
    for path, (key, op) in truth.items():
        v = raw[key]
        value = np.transpose(v, (2, 3, 1, 0)) if op == "conv" else v.T if op == "transpose" else v
        out[path] = Truth(key, "other" if op == "conv" else op, np.ascontiguousarray(value))
    return out


def target_and_truth(name: str) -> Tuple[Any, Dict[str, Truth]]:
    """A fresh target model for a pair (random weights) and its ground truth."""
    if name == "resnet18":
        model, truth = resnet18_twin()
        return model, resnet18_truth_values(truth)
    if name == "phi3":
        return phi3_backbone(), phi3_truth()
    _, truth = keras_hub_truth(name)
    return fresh_backbone(name), truth


@dataclass
class Score:
    """How a restore did against the ground truth."""

    assigned: int
    wrong: List[str]
    unresolved: int
    total: int

    @property
    def correct(self) -> int:
        return self.assigned - len(self.wrong)


def score_values(model: Any, truth: Dict[str, Truth], assigned: List[str]) -> Score:
    """Compare every assigned target's value with the ground truth's, tensor by tensor.

    Args:
        model: the restored model.
        truth: the ground truth (``{variable.path: Truth}``).
        assigned: the target names the plan assigned (variable paths).
    """
    values = {v.path: np.asarray(v.numpy()) for v in model.weights}
    wrong = [t for t in assigned if t in truth and not np.array_equal(values[t], truth[t].value)]
    wrong += [t for t in assigned if t not in truth]
    unresolved = len(set(truth) - set(assigned))
    return Score(len(assigned), sorted(wrong), unresolved, len(truth))
