"""Cross-framework transfers with no map (issue 19): PyTorch / Hugging Face fixtures into KerasHub
backbones and a Keras ResNet-18 twin, scored tensor by tensor against the ground truth of
tests/_xframe.py (KerasHub's own converters), plus the pure pieces they rest on."""

from __future__ import annotations

import numpy as np
import pytest

import _xframe as X
import ckptmerge as cm
from ckptmerge.alignment.align import align
from ckptmerge.alignment.conventions import Convention, add_convention, rewrite
from ckptmerge.alignment.layouts import torch_layout
from ckptmerge.alignment.tensorops import Reshape, Split, glob_escape, refines
from ckptmerge.core.errors import RuleError, TransformError
from ckptmerge.core.specs import VariableInfo


def f32(name, *shape):
    return VariableInfo(name, tuple(shape), "float32")


# -- the pairs ---------------------------------------------------------------------------------

@pytest.fixture(scope="module", params=X.PAIRS)
def restored(request):
    pytest.importorskip("keras_hub", reason="keras-hub is in the test extra: pip install -e '.[test]'")
    name = request.param
    model, truth = X.target_and_truth(name)
    plan = cm.plan(model, [cm.Source(X.weights_file(name), layout="torch", align="structure")])
    plan.restore(strict=False)
    return name, model, truth, plan, X.score_values(model, truth, list(plan.assignments))


def test_every_pair_is_complete_never_wrong_and_reproduces_pytorch(restored):
    name, model, truth, plan, score = restored
    assert score.wrong == []
    assert set(truth) - set(plan.assignments) == set()
    assert X.output_difference(name, model) <= 1e-4


def test_every_pair_accounts_for_every_target_and_source_tensor(restored):
    name, model, truth, plan, _ = restored
    c = plan.coverage()
    assert c["targets"]["assigned"] == len(truth) and c["targets"]["unresolved"] == 0
    src = c["sources"][0]
    assert src["used"] + src["unused"] == src["tensors"] and src["used"] > 0
    assert "Coverage: " in plan.report() and plan.to_dict()["coverage"] == c


def test_restored_tensors_equal_keras_hub_from_preset(restored):
    name, model, truth, plan, _ = restored
    if name == "resnet18":
        pytest.skip("KerasHub has no converter for torchvision's ResNet")
    values = {v.path: np.asarray(v.numpy()) for v in model.weights}
    for target in plan.assignments:
        np.testing.assert_array_equal(values[target], truth[target].value, err_msg=target)


def test_reshaped_and_split_tensors_say_so_in_the_report(restored):
    name, model, truth, plan, _ = restored
    if name != "gpt2":
        pytest.skip("GPT-2 has both: a fused c_attn split and heads reshaped")
    query = plan.assignments["transformer_layer_0/self_attention/query/kernel"]
    assert query.key == "h.0.attn.c_attn.weight"
    assert any(t.startswith("reshaped (16, 16)->(16, 4, 4)") for t in query.transforms)
    report = plan.report(limit=None)
    assert "columns 0..15 of 48" in report and "reshaped (16, 16)->(16, 4, 4)" in report


def test_phi3s_fused_qkv_and_gate_up_are_split_and_their_report_lines_say_which_rows(restored):
    name, model, truth, plan, _ = restored
    if name != "phi3":
        pytest.skip("Phi-3 fuses a grouped-query qkv_proj and a gate_up_proj")
    key = plan.assignments["transformer_layer_0/attention/key/kernel"]
    assert key.key == "model.layers.0.self_attn.qkv_proj.weight"
    gate = plan.assignments["transformer_layer_1/feedforward_gate_dense/kernel"]
    up = plan.assignments["transformer_layer_1/feedforward_intermediate_dense/kernel"]
    assert gate.key == up.key == "model.layers.1.mlp.gate_up_proj.weight"
    report = plan.report(limit=None)
    assert "fused q,k,v Linear weight (16+8+8,in): rows 16..23 of 32, transposed" in report
    assert "fused gate_proj,up_proj Linear weight (2*out,in): rows 40..79 of 80, transposed" in report


def test_the_vit_position_table_is_squeezed_and_its_report_line_says_so(restored):
    name, model, truth, plan, _ = restored
    if name != "vit":
        pytest.skip("ViT's position table is (1, tokens, hidden) in PyTorch, (tokens, hidden) in KerasHub")
    (a,) = [a for a in plan.assignments.values() if a.key.endswith("embeddings.position_embeddings")]
    want = f"squeezed axis 0 {tuple(a.spec.shape)}->{tuple(a.target_spec.shape)}"
    assert a.transforms == (want,)
    line = next(x for x in plan.report(limit=None).splitlines() if x.strip().startswith(a.target + " <-"))
    assert want in line and f"raw key '{a.key}'" in line


def test_llama_untied_output_projection_is_lm_head_transposed_as_keras_hub_ports_it(restored):
    name, model, truth, plan, _ = restored
    if name != "llama":
        pytest.skip("only Llama has an untied lm_head")
    reverse = plan.assignments["token_embedding/reverse_embeddings"]
    assert reverse.key == truth["token_embedding/reverse_embeddings"].key == "lm_head.weight"
    assert truth["token_embedding/reverse_embeddings"].op == "transpose"


def test_resnet18_downsample_norms_are_placed_by_the_layer_that_feeds_them(restored):
    name, model, truth, plan, _ = restored
    if name != "resnet18":
        pytest.skip("only ResNet-18")
    downsample = [t for t, v in truth.items() if ".downsample.1." in v.key]
    assert len(downsample) == 12
    for t in downsample:
        assert "fed by" in plan.assignments[t].describe() and "downsample/0" in plan.assignments[t].describe()


# -- never wrong: the traps -----------------------------------------------------------------------

def test_two_equal_norms_with_no_role_in_their_names_stay_unresolved_with_both_candidates():
    targets = [f32("block/norm_a/gamma", 8), f32("block/norm_b/gamma", 8)]
    names = [f32("layer/ln_x/gamma", 8), f32("layer/ln_y/gamma", 8)]
    found = align(targets, names)
    assert found.matches == []
    assert [set(u.names) for u in found.unresolved] == [{"layer/ln_x/gamma", "layer/ln_y/gamma"}]


def test_swapped_norm_names_follow_their_roles_not_the_word_attention():
    targets = [f32("t_0/self_attention_layernorm/scale", 8), f32("t_0/feedforward_layernorm/scale", 8)]
    names = [f32("layers/0/post_attention_layernorm/gamma", 8), f32("layers/0/input_layernorm/gamma", 8)]
    assert align(targets, names).mapping == {"layers/0/input_layernorm/gamma": "t_0/self_attention_layernorm/scale",
                                             "layers/0/post_attention_layernorm/gamma": "t_0/feedforward_layernorm/scale"}


def test_a_square_conv1d_named_weight_without_evidence_is_left_undecided():
    lay = torch_layout([f32("h.0.c_proj.weight", 8, 8), f32("h.0.c_proj.bias", 8)])
    assert "h/0/c_proj/kernel" not in lay.entries
    assert [n for n, _ in lay.undecided] == ["h/0/c_proj/weight"]


def test_conv1d_is_read_by_its_bias_and_never_transposed():
    lay = torch_layout([f32("h.0.mlp.c_fc.weight", 4, 16), f32("h.0.mlp.c_fc.bias", 16),
                        f32("h.0.attn.c_proj.weight", 4, 4), f32("h.0.attn.c_proj.bias", 4)])
    assert lay.entries["h/0/mlp/c_fc/kernel"].info.shape == (4, 16)
    assert lay.entries["h/0/mlp/c_fc/kernel"].op == "copy"
    assert lay.entries["h/0/attn/c_proj/kernel"].op == "copy"  # square: decided by its sibling


def test_fused_qkv_splits_into_query_key_value_in_order():
    lay = torch_layout([f32("attn.c_attn.weight", 4, 12), f32("attn.c_attn.bias", 12)])
    w = np.arange(48.0).reshape(4, 12)
    from ckptmerge.alignment.layouts import apply_entry

    key = apply_entry(lay.entries["attn/c_attn/key/kernel"], [w])
    np.testing.assert_array_equal(key, w[:, 4:8])
    assert "columns 4..7 of 12" in lay.entries["attn/c_attn/key/kernel"].note


def test_one_layer_fed_by_two_modules_keeps_none_of_them():
    targets = [f32("pooled_dense/kernel", 6, 6), f32("pooled_dense/bias", 6)]
    names = [f32("pooler/dense/bias", 6), f32("encoder/out/kernel", 6, 6)]
    found = align(targets, names)
    assert found.matches == []
    assert any("layers are units" in u.reason for u in found.unresolved)


def _torchvision_block(stage, block, planes, downsample, bottleneck=False):
    """A torchvision ResNet block's BatchNorm tensors (after the torch layout), by module."""
    names = [f"bn{i}" for i in ((1, 2, 3) if bottleneck else (1, 2))]
    if downsample:
        names.append("downsample/1")
    out = {}
    for n in names:
        width = planes * (4 if bottleneck and n in ("bn3", "downsample/1") else 1)
        out[f"layer{stage}/{block}/{n}"] = width
    return out


def _bn_specs(scope, width):
    return [f32(f"{scope}/{leaf}", width) for leaf in ("gamma", "beta", "moving_mean", "moving_variance")]


def test_numbers_of_two_module_kinds_are_not_compared_as_positions():
    # ResNet-50's (2048,) norms: layer4.0.bn3 (4, 0, 3), layer4.0.downsample.1 (4, 0, 1), layer4.1.bn3,
    # layer4.2.bn3; a twin with default names creates the block's bn3 before its downsample norm.
    # Compared digit by digit the two sides sort these differently: never paired by position.
    modules = {}
    for b in range(3):
        modules.update(_torchvision_block(4, b, 512, b == 0, bottleneck=True))
    wide = [m for m, w in modules.items() if w == 2048]
    assert wide == ["layer4/0/bn3", "layer4/0/downsample/1", "layer4/1/bn3", "layer4/2/bn3"]
    names = [v for m, w in modules.items() for v in _bn_specs(m, w)]  # (bn1 (4, 0, 1) meets downsample/1)
    # the twin's norms in creation order: bn1, bn2, bn3, then the shortcut's, block by block
    built = [m for b in range(3) for m in (f"layer4/{b}/bn1", f"layer4/{b}/bn2", f"layer4/{b}/bn3")
             + ((f"layer4/{b}/downsample/1",) if b == 0 else ())]
    keras = {m: f"batch_normalization_{40 + i}" for i, m in enumerate(built)}
    targets = [f32(n.name.replace(n.name.rsplit("/", 1)[0], keras[n.name.rsplit("/", 1)[0]]), *n.shape)
               for n in names]
    truth = {t.name: n.name for t, n in zip(targets, names)}
    order = [t.name for m in built for t in targets if t.name.startswith(keras[m] + "/")]
    found = align(targets, names, target_order=order)
    assert all(truth[t] == n for n, t in found.mapping.items())
    assert not any(truth[t].startswith(("layer4/0/bn3", "layer4/0/downsample")) for t in found.mapping.values())


def test_the_layer_that_feeds_a_norm_places_it_beside_its_module():
    modules = _torchvision_block(4, 0, 8, True) | _torchvision_block(4, 1, 8, False)
    names = [v for m in modules for v in _bn_specs(m, 8)]
    names += [f32(f"layer4/{b}/{c}/kernel", 3, 3, 8, 8) for b in (0, 1) for c in ("conv1", "conv2")]
    names += [f32("layer4/0/downsample/0/kernel", 1, 1, 4, 8)]
    # the twin: conv, its norm, conv, its norm, then the shortcut's conv and norm; block 1 likewise
    order = ["layer4/0/conv1", "layer4/0/bn1", "layer4/0/conv2", "layer4/0/bn2", "layer4/0/downsample/0",
             "layer4/0/downsample/1", "layer4/1/conv1", "layer4/1/bn1", "layer4/1/conv2", "layer4/1/bn2"]
    keras = {m: f"{'conv2d' if 'conv' in m or m.endswith('/0') else 'batch_normalization'}_{30 + i}"
             for i, m in enumerate(order)}
    targets = [f32(n.name.replace(n.name.rsplit("/", 1)[0], keras[n.name.rsplit("/", 1)[0]]), *n.shape)
               for n in names]
    truth = {t.name: n.name for t, n in zip(targets, names)}
    target_order = [t.name for m in order for t in targets if t.name.startswith(keras[m] + "/")]
    inputs = {}
    for i, m in enumerate(order):
        if "conv" not in m and not m.endswith("/0"):
            feeder = keras[order[i - 1]]
            for t in targets:
                if t.name.startswith(keras[m] + "/"):
                    inputs[t.name] = (f"{feeder}/kernel",)
    without = align(targets, names, target_order=target_order)
    assert all(truth[t] == n for n, t in without.mapping.items()) and len(without.mapping) < len(targets)
    found = align(targets, names, target_order=target_order, target_inputs=inputs)
    assert {t: n for n, t in found.mapping.items()} == truth
    ds = next(m for m in found.matches if m.name == "layer4/0/downsample/1/gamma")
    assert any("fed by" in e and "downsample/0" in e for e in ds.evidence)


def test_a_reshape_joins_only_tensors_of_the_same_kind():
    # a (1, 1, 4, 8) conv kernel has the size of a (32,) norm scale: never its candidate
    targets = [f32("batch_normalization_3/gamma", 32), f32("conv2d_3/kernel", 1, 1, 4, 8)]
    names = [f32("layer2/0/downsample/1/gamma", 32), f32("layer2/0/downsample/0/kernel", 1, 1, 4, 8)]
    found = align(targets, names)
    assert found.mapping == {"layer2/0/downsample/1/gamma": "batch_normalization_3/gamma",
                             "layer2/0/downsample/0/kernel": "conv2d_3/kernel"}


def test_input_layers_name_the_one_weighted_layer_feeding_each_layer():
    keras = pytest.importorskip("keras")
    from ckptmerge.restoring.targets import collect_targets, input_layers

    x = keras.Input((8, 8, 3))
    a = keras.layers.Conv2D(4, 3, padding="same", name="c1")(x)
    b = keras.layers.BatchNormalization(name="n1")(keras.layers.ReLU()(a))
    c = keras.layers.Conv2D(4, 1, name="c2")(x)
    d = keras.layers.Dense(2, name="head")(keras.layers.Add()([b, c]))
    model = keras.Model(x, d)
    found = input_layers(model, collect_targets(model))
    assert found["n1/gamma"] == ("c1/kernel", "c1/bias")
    assert "head/kernel" not in found  # fed by n1 and c2 through the Add: no single feeder
    assert "c1/kernel" not in found  # fed by the input


def test_keras_hub_reverse_embeddings_reads_as_the_lm_head_module():
    targets = [f32("token_embedding/embeddings", 50, 16), f32("token_embedding/reverse_embeddings", 16, 50)]
    names = [f32("model/embed_tokens/embeddings", 50, 16), f32("lm_head/kernel", 16, 50)]
    assert align(targets, names).mapping == {"model/embed_tokens/embeddings": "token_embedding/embeddings",
                                             "lm_head/kernel": "token_embedding/reverse_embeddings"}
    # tied: the target has no output projection of its own, and lm_head stays unused, not forced
    assert align(targets[:1], names).mapping == {"model/embed_tokens/embeddings": "token_embedding/embeddings"}


# -- tensor operations on literal arrays -----------------------------------------------------------

def test_refines_accepts_head_splits_and_unit_axes_only():
    assert refines((64, 64), (64, 4, 16)) and refines((64,), (4, 16)) and refines((64, 64), (4, 16, 64))
    assert refines((1, 17, 64), (17, 64))
    assert not refines((4, 16, 64), (64, 4, 16)) and not refines((6, 4), (4, 6)) and not refines((3,), (4,))


def test_reshape_and_its_inverse_round_trip():
    r = Reshape("q/kernel", (2, 2, 3), source_shape=(2, 6))
    x = np.arange(12.0).reshape(2, 6)
    y = r.apply(x)
    assert y.shape == (2, 2, 3) and y[1, 1, 2] == x[1, 5]
    np.testing.assert_array_equal(r.inverse().apply(y), x)
    assert r.describe((2, 6)) == "reshaped (2, 6)->(2, 2, 3)"
    with pytest.raises(TransformError, match="keeps every value"):
        Reshape("q", (5,)).output_shape((2, 3))


def test_split_takes_one_piece_and_names_its_rows():
    s = Split("v", axis=0, index=2, parts=3)
    np.testing.assert_array_equal(s.apply(np.arange(6.0)), [4.0, 5.0])
    assert s.describe((6, 2)) == "split axis 0 into 3: rows 4..5 of 6 (part 3 of 3) -> (2, 2)"
    with pytest.raises(TransformError, match="does not divide"):
        s.output_shape((7,))
    with pytest.raises(TransformError, match="index must be"):
        Split("v", 0, 3, 3)


def test_glob_escape_matches_only_the_name():
    import fnmatch

    assert fnmatch.fnmatchcase("a[0]/k*", glob_escape("a[0]/k*"))
    assert not fnmatch.fnmatchcase("a0/kx", glob_escape("a[0]/k*"))


# -- conventions --------------------------------------------------------------------------------------

def test_conventions_rewrite_roles_and_users_extend_the_table():
    assert rewrite("model/layers/3/post_attention_layernorm/gamma") == "model/layers/3/mlpnorm/gamma"
    assert rewrite("h/0/ln_2/beta") == "h/0/mlpnorm/beta"
    add_convention(["my_pre_ffn_norm"], "mlpnorm", replace=True)
    assert rewrite("b/1/my_pre_ffn_norm/scale") == "b/1/mlpnorm/scale"
    with pytest.raises(RuleError, match="lower-case words"):
        Convention(("x",), "Bad-Role")
    with pytest.raises(RuleError, match="leaf must be a variable name"):
        Convention(("x",), "role", leaf="Bad/Leaf")
    assert rewrite("token_embedding/reverse_embeddings") == "token_embedding_tokemb/lmhead/kernel"
