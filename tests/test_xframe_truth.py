"""The cross-framework fixtures and their ground truth (issue 19).

These tests pin the yardstick the alignment tests measure against: KerasHub's own converter
(``Backbone.from_preset(fixture_dir)``) reproduces PyTorch's outputs on the committed fixtures,
and so does the Keras twin of torchvision's ResNet-18 with the ground truth written beside it.
If one of these fails, the fixtures or the truth are broken, not the alignment.
"""

from __future__ import annotations

import json
import os

import pytest

import _xframe as X

pytest.importorskip("keras_hub", reason="keras-hub is in the test extra: pip install -e '.[test]'")


@pytest.fixture(scope="module", params=X.PAIRS)
def pair(request):
    name = request.param
    model, truth = X.target_and_truth(name)
    return name, model, truth


def test_fixtures_are_small_and_complete():
    total = 0
    for name in X.PAIRS:
        files = sorted(os.listdir(X.fixture_dir(name)))
        assert {"config.json", "model.safetensors", "reference.npz"} <= set(files), name
        assert set(files) <= {"config.json", "generation_config.json", "model.safetensors", "reference.npz"}, name
        total += sum(os.path.getsize(os.path.join(X.fixture_dir(name), f)) for f in files)
    assert total < 600 * 1024, f"fixtures grew to {total / 1024:.0f} KiB"
    with open(os.path.join(X.fixture_dir("bert"), "config.json")) as f:
        assert json.load(f)["model_type"] == "bert"


def test_truth_covers_every_target_variable(pair):
    name, model, truth = pair
    assert sorted(v.path for v in model.weights) == sorted(truth)
    raw = X.source_tensors(name)
    assert all(t.key in raw for t in truth.values())
    # a tensor feeds two targets only when it is split (GPT-2's fused c_attn and Phi-3's qkv_proj
    # into query, key, value; Phi-3's gate_up_proj into gate and up)
    shared = {}
    for path, t in truth.items():
        shared.setdefault(t.key, []).append(t.op)
    assert all(len(ops) == 1 or set(ops) == {"other"} for ops in shared.values())
    assert any(len(ops) == 3 for ops in shared.values()) == (name in ("gpt2", "phi3"))
    assert any(len(ops) == 2 for ops in shared.values()) == (name == "phi3")


def test_truth_reproduces_pytorch_outputs(pair):
    name, model, truth = pair
    before = X.output_difference(name, model)
    for v in model.weights:
        v.assign(truth[v.path].value)
    assert X.output_difference(name, model) <= 1e-4
    assert before > 1e-2  # random weights are visibly different: the comparison can fail


@pytest.mark.parametrize("name", list(X.BACKBONES))
def test_keras_hub_converter_reproduces_pytorch_outputs(name):
    backbone, truth = X.keras_hub_truth(name)
    assert X.output_difference(name, backbone) <= 1e-4
    ops = {t.op for t in truth.values()}
    assert "copy" in ops and ("other" in ops or "transpose" in ops)


def test_score_counts_a_swapped_tensor_as_wrong():
    model, truth = X.target_and_truth("llama")
    for v in model.weights:
        v.assign(truth[v.path].value)
    a, b = "transformer_layer_0/self_attention_layernorm/scale", "transformer_layer_0/feedforward_layernorm/scale"
    weights = {v.path: v for v in model.weights}
    weights[a].assign(truth[b].value)
    weights[b].assign(truth[a].value)
    score = X.score_values(model, truth, sorted(truth))
    assert score.wrong == sorted([a, b]) and score.unresolved == 0
