"""Mechanisms the conformance matrix (issue 32, docs/conformance.md) called for, on literal names.

Each case is the class a matrix row showed, generated in variants (prefixes, depths, head names):
structure alone must place it right or leave it unresolved, never wrong.
"""

from __future__ import annotations

import itertools

import pytest

from ckptmerge.alignment.align import align
from ckptmerge.core.specs import VariableInfo


def f32(name, *shape):
    return VariableInfo(name, tuple(shape), "float32")


# -- the norm right after the embeddings (DistilBERT had it taken from its masked-LM head) -----------

def _encoder(prefix, head_norm, layers, hidden=8):
    targets, sources, truth = [], [], {}

    def pair(t, s, *shape):
        targets.append(f32(t, *shape))
        sources.append(f32(s, *shape))
        truth[t] = s

    for leaf in ("gamma", "beta"):
        pair(f"embeddings_layer_norm/{leaf}", f"{prefix}embeddings/LayerNorm/{leaf}", hidden)
        for i in range(layers):
            pair(f"transformer_layer_{i}/self_attention_layer_norm/{leaf}",
                 f"{prefix}transformer/layer/{i}/sa_layer_norm/{leaf}", hidden)
            pair(f"transformer_layer_{i}/feedforward_layer_norm/{leaf}",
                 f"{prefix}transformer/layer/{i}/output_layer_norm/{leaf}", hidden)
        sources.append(f32(f"{head_norm}/{leaf}", hidden))  # the head's norm: same shape, no target
    return targets, sources, truth


@pytest.mark.parametrize("prefix,head_norm,layers", list(itertools.product(
    ["distilbert/", "bert/", ""], ["vocab_layer_norm", "cls/predictions/transform/LayerNorm", "lm_head/layer_norm"],
    [1, 2, 3])))
def test_the_embedding_norm_is_the_embeddings_layernorm_never_a_heads_norm(prefix, head_norm, layers):
    targets, sources, truth = _encoder(prefix, head_norm, layers)
    found = align(targets, sources)
    assert {t: s for s, t in found.mapping.items() if t in truth and truth[t] != s} == {}
    assert found.mapping.get(f"{prefix}embeddings/LayerNorm/gamma") == "embeddings_layer_norm/gamma"
