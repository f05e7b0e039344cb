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


# -- four norms a block, q/k norms, Gemma's MLP names: the convention says which is which ------------

_HF = {"attn": "input_layernorm", "mlp": "post_attention_layernorm"}
_HF4 = {"attn": "input_layernorm", "attnpost": "post_attention_layernorm", "mlp": "pre_feedforward_layernorm",
        "mlppost": "post_feedforward_layernorm", "q": "self_attn/q_norm", "k": "self_attn/k_norm"}
_KH4 = {"attn": "pre_attention_norm", "attnpost": "post_attention_norm", "mlp": "pre_ffw_norm",
        "mlppost": "post_ffw_norm", "q": "attention/query_norm", "k": "attention/key_norm"}


def _decoder(hf, kh, layers, prefix, tprefix, hidden=8):
    targets, sources, truth = [], [], {}
    for i in range(layers):
        for role in kh:
            t, s = f"{tprefix}{i}/{kh[role]}/scale", f"{prefix}layers/{i}/{hf[role]}/gamma"
            shape = (hidden // 2,) if role in ("q", "k") else (hidden,)
            targets.append(f32(t, *shape))
            sources.append(f32(s, *shape))
            truth[t] = s
        for tn, sn in (("ffw_gating", "mlp/gate_proj"), ("ffw_gating_2", "mlp/up_proj")):
            t, s = f"{tprefix}{i}/{tn}/kernel", f"{prefix}layers/{i}/{sn}/kernel"
            targets.append(f32(t, hidden, 3 * hidden))
            sources.append(f32(s, hidden, 3 * hidden))
            truth[t] = s
    return targets, sources, truth


@pytest.mark.parametrize("layers,prefix,tprefix,four", list(itertools.product(
    [1, 2, 4], ["model/", "", "language_model/model/"], ["decoder_block_", "layer_"], [True, False, "qwen3"])))
def test_each_norm_of_a_block_goes_by_its_role_in_two_or_four_norm_blocks(layers, prefix, tprefix, four):
    if four == "qwen3":  # KerasHub's Qwen3: two norms a block, and q/k norms named after their dense layers
        hf = {k: _HF4[k] for k in ("attn", "q", "k")}
        hf["mlp"] = "post_attention_layernorm"
        kh = {"attn": "self_attention_layernorm", "mlp": "feedforward_layernorm",
              "q": "self_attention/query_dense_layernorm", "k": "self_attention/key_dense_layernorm"}
    elif four:
        hf, kh = _HF4, _KH4
    else:
        hf, kh = _HF, {"attn": "pre_attention_norm", "mlp": "pre_ffw_norm"}
    targets, sources, truth = _decoder(hf, kh, layers, prefix, tprefix)
    found = align(targets, sources)
    assert {t: s for s, t in found.mapping.items() if truth[t] != s} == {}
    assert sorted(found.mapping.values()) == sorted(truth)  # complete


def test_post_attention_layernorm_is_the_mlps_norm_without_a_pre_feedforward_norm_beside_it():
    from ckptmerge.alignment.conventions import in_context

    names = ["m/layers/0/post_attention_layernorm/gamma", "m/layers/1/post_attention_layernorm/gamma",
             "m/layers/1/pre_feedforward_layernorm/gamma"]
    assert in_context(names) == ["m/layers/0/post_attention_layernorm/gamma", "m/layers/1/post_attention_norm/gamma",
                                 "m/layers/1/pre_feedforward_layernorm/gamma"]
    assert in_context(names[:1]) is names[:1] or in_context(names[:1]) == names[:1]


# -- a position table with reserved rows at its start, where the convention table says so -----------

def _offset_views(src_scope, rows, target_rows=64, hidden=8, tname="embeddings/position_embedding/embeddings",
                  types=""):
    from ckptmerge.planning.planner import SourceView, make_plan
    from ckptmerge.planning.suggestion import aligned_views

    targets = [f32(tname, target_rows, hidden), f32("token_embedding/embeddings", 50, hidden)]
    names = [f32(f"{src_scope}/embeddings/position_embeddings/embeddings", rows, hidden),
             f32(f"{src_scope}/embeddings/word_embeddings/embeddings", 50, hidden)]
    if types in ("source", "both"):
        names.append(f32(f"{src_scope}/embeddings/token_type_embeddings/embeddings", 1, hidden))
    if types == "both":
        targets.append(f32("segment_embedding/embeddings", 1, hidden))
    plan = make_plan(targets, [SourceView("A", "runs/A", "", {v.name: v for v in names})])
    (v,) = aligned_views(plan, plan.sources, [True])
    return make_plan(targets, [v]), v


@pytest.mark.parametrize("scope,tname,target_rows,types", list(itertools.product(
    ["roberta", "model/roberta", "xlm/roberta"], ["embeddings/position_embedding/embeddings",
                                                  "embeddings/position_embedding/position_embeddings"], [16, 64, 514],
    ["", "both"])))
def test_robertas_position_table_drops_its_two_reserved_rows(scope, tname, target_rows, types):
    import numpy as np

    plan, v = _offset_views(scope, target_rows + 2, target_rows, tname=tname, types=types)
    a = plan.assignments[tname]
    assert a.key == f"{scope}/embeddings/position_embeddings/embeddings"
    (op,) = [t for t in v.transforms if t.applies_to(tname)]
    table = np.arange((target_rows + 2) * 8, dtype="float32").reshape(target_rows + 2, 8)
    np.testing.assert_array_equal(op.apply(table, np.zeros((target_rows, 8), "float32"), target_shape=(target_rows, 8)), table[2:])


@pytest.mark.parametrize("scope,extra", [("bert", 2), ("encoder", 2), ("roberta", 1), ("roberta", 3), ("roberta", 0)])
def test_a_longer_position_table_without_the_conventions_offset_is_not_sliced(scope, extra):
    plan, v = _offset_views(scope, 64 + extra)
    if extra:
        assert "embeddings/position_embedding/embeddings" not in plan.assignments
    assert not [t for t in v.transforms if type(t).__name__ == "Slice"]


@pytest.mark.parametrize("scope,target_rows", [("roberta", 64), ("model/roberta", 16)])
def test_no_offset_is_certain_where_a_token_type_table_has_no_target_it_may_be_folded_in(scope, target_rows):
    # (KerasHub's XLM-R converter adds the token-type table's row 0 to the position table)
    plan, v = _offset_views(scope, target_rows + 2, target_rows, types="source")
    assert "embeddings/position_embedding/embeddings" not in plan.assignments
    assert not [t for t in v.transforms if type(t).__name__ == "Slice"]


# -- a module's own number: bn2 never takes bn1 while bn1's neighbour bn2 is free (timm MobileNetV3) ----

def _cols(pairs):
    from ckptmerge.alignment.entries import Columns, Match

    out = Columns()
    out.extend([Match(t, s, 0.6, ()) for t, s in pairs])
    return out


@pytest.mark.parametrize("word,sep,tscope,sscope", list(itertools.product(
    ["bn", "norm", "ln"], ["", "_"], ["block_2_0/block_2_0_", "stage1/unit_"], ["blocks/2/0/", "features/3/"])))
def test_a_pairing_against_the_modules_own_numbers_is_refused_while_the_right_one_is_free(word, sep, tscope, sscope):
    from ckptmerge.alignment.units import misnumbered

    t, s, right = f"{tscope}{word}{sep}2/gamma", f"{sscope}{word}1/gamma", f"{sscope}{word}2/gamma"
    assert misnumbered(_cols([(t, s)]), [s, right]) == {0}
    assert misnumbered(_cols([(t, s), (f"{tscope}{word}{sep}1/gamma", right)]), [s, right]) == set()  # not free
    assert misnumbered(_cols([(t, right)]), [s, right]) == set()  # numbers agree
    assert misnumbered(_cols([(t, s)]), [s, f"{sscope}{word}2/beta"]) == set()  # no tensor of that leaf
    assert misnumbered(_cols([(f"{tscope}conv{sep}2/gamma", s)]), [s, right]) == set()  # another word


def test_align_never_pairs_a_misnumbered_norm():
    found = align([f32("blk_0/blk_0_bn2/gamma", 8)], [f32("b/0/bn1/gamma", 8), f32("b/0/bn2/gamma", 8)])
    assert found.mapping in ({"b/0/bn2/gamma": "blk_0/blk_0_bn2/gamma"}, {})


# -- names and order disagreeing about two pairings of one shape: neither is kept ----------------------

@pytest.mark.parametrize("stage", [1, 2, 3])
def test_two_pairings_whose_names_point_the_other_way_round_are_refused(stage):
    from ckptmerge.alignment.units import name_swaps

    def toks(n):
        return frozenset(n.replace("_", "/").split("/")[:-1])

    t1, t2 = f"stage_{stage}_csp_conv_down_1/kernel", f"stage_{stage}_block_0_bottleneck_block_conv_2/kernel"
    s1, s2 = f"stages/{stage}/conv_down/conv/kernel", f"stages/{stage}/blocks/0/conv2/conv/kernel"
    shapes = {t1: (3, 3, 8, 256), t2: (3, 3, 8, 256)}
    assert name_swaps(_cols([(t1, s2), (t2, s1)]), shapes, toks) == {0, 1}
    assert name_swaps(_cols([(t1, s1), (t2, s2)]), shapes, toks) == set()
    assert name_swaps(_cols([(t1, s2), (t2, s1)]), {t1: (1,), t2: (2,)}, toks) == set()  # two shapes: no swap
