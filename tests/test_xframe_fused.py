"""Fused PyTorch modules split by convention (issue 19): Phi-3's grouped-query ``qkv_proj`` and its
``gate_up_proj``, the table they come from (ckptmerge/alignment/fused.py), and the traps that must
stay unresolved. Pure: names, shapes and literal arrays, no TensorFlow."""

from __future__ import annotations

import numpy as np
import pytest

from ckptmerge.alignment.align import align
from ckptmerge.alignment.fused import FusedConvention, add_fused_convention, fused_row, part_sizes
from ckptmerge.alignment.inverse import apply_recipe, invert_layout
from ckptmerge.alignment.layouts import apply_entry, torch_layout
from ckptmerge.core.errors import RuleError
from ckptmerge.core.specs import VariableInfo


def f32(name, *shape):
    return VariableInfo(name, tuple(shape), "float32")


def phi3_block(i=0, hidden=16, heads=4, kv=2, inter=40):
    """One Phi-3 decoder layer's tensors as Hugging Face names them."""
    d = hidden // heads
    p = f"model.layers.{i}."
    return [f32(p + "self_attn.qkv_proj.weight", (heads + 2 * kv) * d, hidden),
            f32(p + "self_attn.o_proj.weight", hidden, heads * d),
            f32(p + "mlp.gate_up_proj.weight", 2 * inter, hidden), f32(p + "mlp.down_proj.weight", hidden, inter),
            f32(p + "input_layernorm.weight", hidden), f32(p + "post_attention_layernorm.weight", hidden)]


def keras_phi3_block(i=0, hidden=16, heads=4, kv=2, inter=40, gate="feedforward_gate_dense",
                     up="feedforward_intermediate_dense"):
    """The same layer as KerasHub's Phi3Decoder names its variables."""
    d = hidden // heads
    t = f"transformer_layer_{i}/"
    return [f32(t + "attention/query/kernel", hidden, heads, d), f32(t + "attention/key/kernel", hidden, kv, d),
            f32(t + "attention/value/kernel", hidden, kv, d), f32(t + "attention/attention_output/kernel", heads, d, hidden),
            f32(t + f"{gate}/kernel", hidden, inter), f32(t + f"{up}/kernel", hidden, inter),
            f32(t + "feedforward_output_dense/kernel", inter, hidden),
            f32(t + "pre_attention_layernorm/scale", hidden), f32(t + "post_attention_layernorm/scale", hidden)]


# -- the table ------------------------------------------------------------------------------------

def test_the_table_names_phi3s_fused_modules_with_their_parts_in_order():
    assert fused_row("gate_up_proj").parts == ("gate_proj", "up_proj") and fused_row("gate_up_proj").equal
    assert fused_row("qkv_proj").parts == ("query", "key", "value") and not fused_row("qkv_proj").equal
    assert fused_row("c_attn").equal and fused_row("up_gate_proj") is None and fused_row("query_key_value") is None


def test_grouped_query_sizes_come_from_the_targets_and_must_agree():
    row = fused_row("qkv_proj")
    targets = keras_phi3_block(0) + keras_phi3_block(1)
    assert part_sizes(row, 32, 16, targets)[0] == (16, 8, 8)
    assert part_sizes(row, 32, 16, [])[0] is None
    assert part_sizes(row, 32, 8, targets)[0] is None  # no target has 8 inputs
    # two layers whose parts add up to 32 differently: the sizes are not known
    odd = [f32("b/attention/query/kernel", 16, 8), f32("b/attention/key/kernel", 16, 12),
           f32("b/attention/value/kernel", 16, 12)]
    sizes, why = part_sizes(row, 32, 16, targets + odd)
    assert sizes is None and "2 different sizes" in why


def test_equal_parts_by_convention_yield_to_no_target_that_says_otherwise():
    row = fused_row("c_attn")
    assert part_sizes(row, 48, 16, [])[0] == (16, 16, 16)
    gqa = [f32("a/query/kernel", 16, 24), f32("a/key/kernel", 16, 12), f32("a/value/kernel", 16, 12)]
    sizes, why = part_sizes(row, 48, 16, gqa)
    assert sizes is None and "equal by convention" in why


def test_users_add_fused_modules_and_bad_rows_are_refused():
    add_fused_convention(["w13_fused"], ["gate_proj", "up_proj"], why="a model of mine")
    assert fused_row("W13_FUSED").parts == ("gate_proj", "up_proj")
    with pytest.raises(RuleError, match="two or more distinct parts"):
        FusedConvention(("x",), ("gate_proj",))
    with pytest.raises(RuleError, match="module names"):
        FusedConvention(("a.b",), ("gate_proj", "up_proj"))


# -- the layout -----------------------------------------------------------------------------------

def test_gate_up_is_split_in_halves_gate_first_and_qkv_waits_for_the_targets():
    lay = torch_layout(phi3_block())
    gate, up = (lay.entries[f"model/layers/0/mlp/gate_up_proj/{p}/kernel"] for p in ("gate_proj", "up_proj"))
    assert gate.info.shape == up.info.shape == (16, 40)
    assert "rows 0..39 of 80" in gate.note and "rows 40..79 of 80" in up.note
    assert "model/layers/0/self_attn/qkv_proj/kernel" in lay.entries and lay.needs_targets
    assert lay.unsplit == [("model/layers/0/self_attn/qkv_proj/weight", "the targets are not known yet")]
    w = np.arange(80 * 16, dtype=np.float32).reshape(80, 16)
    np.testing.assert_array_equal(apply_entry(gate, [w]), w[:40].T)
    np.testing.assert_array_equal(apply_entry(up, [w]), w[40:].T)


def test_grouped_query_qkv_is_split_by_the_targets_sizes_and_comes_back_bit_exact():
    template = phi3_block()
    lay = torch_layout(template, targets=keras_phi3_block())
    assert not lay.needs_targets and not lay.unsplit
    parts = [lay.entries[f"model/layers/0/self_attn/qkv_proj/{p}/kernel"] for p in ("query", "key", "value")]
    assert [e.info.shape for e in parts] == [(16, 16), (16, 8), (16, 8)]
    assert "(16+8+8,in): rows 16..23 of 32" in parts[1].note
    rng = np.random.default_rng(0)
    raw = {t.name: rng.standard_normal(t.shape).astype(np.float32) for t in template}
    w = raw["model.layers.0.self_attn.qkv_proj.weight"]
    got = [apply_entry(e, [w]) for e in parts]
    np.testing.assert_array_equal(got[0], w[:16].T)
    np.testing.assert_array_equal(got[2], w[24:].T)
    mapping = {n: "k/" + n for n in lay.entries}
    values = {"k/" + n: apply_entry(e, [raw[s] for s in e.sources]) for n, e in lay.entries.items()}
    recipes, missing = invert_layout(lay, template, mapping, {k: v.shape for k, v in values.items()})
    assert missing == []
    for key, r in recipes.items():
        back = apply_recipe(r, [values[p.name] for p in r.pieces])
        assert back.dtype == raw[key].dtype and np.array_equal(back, raw[key]), key


def test_fused_modules_of_a_whole_phi3_align_with_keras_hub_names_by_role():
    lay = torch_layout(phi3_block(0) + phi3_block(1), targets=keras_phi3_block(0) + keras_phi3_block(1))
    names = [e.info for e in lay.entries.values()]
    found = align(keras_phi3_block(0) + keras_phi3_block(1), names)
    assert found.unresolved == []
    for i in (0, 1):
        m = f"model/layers/{i}/mlp/gate_up_proj/"
        assert found.mapping[m + "gate_proj/kernel"] == f"transformer_layer_{i}/feedforward_gate_dense/kernel"
        assert found.mapping[m + "up_proj/kernel"] == f"transformer_layer_{i}/feedforward_intermediate_dense/kernel"


# -- never wrong: the traps -------------------------------------------------------------------------

def test_equal_halves_with_no_convention_are_never_split_by_shape():
    # ChatGLM-style 'dense_h_to_4h': two equal halves, but no row of the table says which is the gate
    lay = torch_layout([f32("h.0.mlp.dense_h_to_4h.weight", 80, 16), f32("h.0.mlp.dense_h_to_4h.bias", 80)],
                       targets=keras_phi3_block())
    assert sorted(lay.entries) == ["h/0/mlp/dense_h_to_4h/bias", "h/0/mlp/dense_h_to_4h/kernel"]
    assert lay.entries["h/0/mlp/dense_h_to_4h/kernel"].info.shape == (16, 80) and lay.unsplit == []


def test_a_fused_name_in_the_other_order_is_no_gate_up():
    # 'up_gate_proj' lists the same words the other way round: read as gate_up it would swap them
    lay = torch_layout([f32("m.mlp.up_gate_proj.weight", 80, 16)])
    assert list(lay.entries) == ["m/mlp/up_gate_proj/kernel"]


def test_split_parts_without_role_names_on_the_target_side_stay_unresolved():
    lay = torch_layout(phi3_block())
    names = [e.info for n, e in lay.entries.items() if "gate_up_proj" in n]
    targets = [f32("block/dense_a/kernel", 16, 40), f32("block/dense_b/kernel", 16, 40)]
    found = align(targets, names)
    assert found.matches == []
    assert [sorted(u.names) for u in found.unresolved] == [sorted(n.name for n in names)]


# -- end to end: a plan and a suggestion with no map (no TensorFlow: targets as specs) ----------------

def _phi3_file(tmp_path, fused_name):
    """A one-layer Phi-3 state_dict whose gate_up_proj is called ``fused_name``."""
    from safetensors.numpy import save_file

    rng = np.random.default_rng(1)
    tensors = {t.name.replace("gate_up_proj", fused_name): rng.standard_normal(t.shape).astype(np.float32)
               for t in phi3_block()}
    path = tmp_path / f"{fused_name}.safetensors"
    save_file(tensors, str(path), metadata={"format": "pt"})
    return str(path)


GATE, UP = "transformer_layer_0/feedforward_gate_dense/kernel", "transformer_layer_0/feedforward_intermediate_dense/kernel"


@pytest.mark.parametrize("fused_name", ["fused_proj", "up_gate_proj"])
def test_a_fused_gate_up_no_convention_names_stays_unresolved_with_both_readings(tmp_path, fused_name):
    import ckptmerge as cm

    path = _phi3_file(tmp_path, fused_name)
    plan = cm.plan(keras_phi3_block(), [cm.Source(path, layout="torch", align="structure")])
    assert {GATE, UP} <= set(plan.missing) and not {GATE, UP} & set(plan.assignments)
    report = plan.report(limit=None)
    fused = f"model/layers/0/mlp/{fused_name}/kernel"
    line = next(x for x in report.splitlines() if fused in x and "readings" in x)
    assert f"columns 0..39 -> '{GATE}', columns 40..79 -> '{UP}'" in line
    assert f"columns 0..39 -> '{UP}', columns 40..79 -> '{GATE}'" in line
    assert plan.coverage()["targets"]["unresolved"] >= 2
    found = cm.suggest(keras_phi3_block(), [cm.Source(path, layout="torch")])
    (src,) = found.sources
    proposed = [e for e in src.entries if e.name == fused]
    assert sorted(e.target for e in proposed) == sorted([GATE, UP]) and all(e.review for e in proposed)
    assert "index=0" in proposed[0].evidence[1] and "index=1" in proposed[0].evidence[1]
    assert fused not in src.map() and "review" in found.report()
    # a reading is contiguous columns: the proposal warns of fusions interleaved head by head
    assert "interleaves its parts head by head" in proposed[0].evidence[2]
    assert "interleaves its parts head by head" in found.report(limit=None)
    assert "interleaves its parts head by head" in found.to_yaml()


def test_the_same_file_with_phi3s_own_name_is_split_gate_first():
    import ckptmerge as cm
    import tempfile, pathlib

    with tempfile.TemporaryDirectory() as d:
        path = _phi3_file(pathlib.Path(d), "gate_up_proj")
        plan = cm.plan(keras_phi3_block(), [cm.Source(path, layout="torch", align="structure")])
        assert plan.missing == []
        assert plan.assignments[GATE].name.endswith("gate_up_proj/gate_proj/kernel")
        assert plan.assignments[UP].name.endswith("gate_up_proj/up_proj/kernel")


# -- a fused tensor on the Keras side: split back into the template's parts, joined from the source's --

def _llama_like(rng, layers=2):
    """Separate q/k/v (grouped-query) and gate/up projections, as Llama's state_dict holds them."""
    out = {}
    for i in range(layers):
        p = f"model.layers.{i}."
        for n, s in (("self_attn.q_proj", (16, 16)), ("self_attn.k_proj", (8, 16)), ("self_attn.v_proj", (8, 16)),
                     ("self_attn.o_proj", (16, 16)), ("mlp.gate_proj", (40, 16)), ("mlp.up_proj", (40, 16)),
                     ("mlp.down_proj", (16, 40))):
            out[p + n + ".weight"] = rng.standard_normal(s).astype(np.float32)
    return out


def _fused_keras(torch_values, layers=2, gate_up="gate_up_proj"):
    """The same weights in a Keras model that fuses q/k/v and gate/up (kernels (in, out))."""
    out = {}
    for i in range(layers):
        p, t = f"model.layers.{i}.", f"layer_{i}/"
        def w(n):
            return torch_values[p + n + ".weight"].T
        out[t + "attention/qkv/kernel"] = np.concatenate([w("self_attn.q_proj"), w("self_attn.k_proj"),
                                                          w("self_attn.v_proj")], axis=1)
        out[t + "attention/attention_output/kernel"] = w("self_attn.o_proj").copy()
        out[t + f"mlp/{gate_up}/kernel"] = np.concatenate([w("mlp.gate_proj"), w("mlp.up_proj")], axis=1)
        out[t + "mlp/down_proj/kernel"] = w("mlp.down_proj").copy()
    return out


def test_a_fused_keras_tensor_is_split_back_into_the_templates_parts_bit_exact(tmp_path):
    import ckptmerge as cm
    from safetensors.numpy import load_file

    want = _llama_like(np.random.default_rng(2))
    out = tmp_path / "o.safetensors"
    report = cm.merge([_fused_keras(want)], out, layout="torch",
                      template=[f32(k, *v.shape) for k, v in want.items()])
    got = load_file(str(out))
    assert sorted(got) == sorted(want) and all(np.array_equal(got[k], v) for k, v in want.items())
    text = report.render(limit=None)
    line = next(x for x in text.splitlines() if x.strip().startswith("model.layers.1.self_attn.k_proj.weight <-"))
    assert "from 'layer_1/attention/qkv/kernel' (16, 32): split axis 1 into 3: columns 16..23 of 32" in line
    line = next(x for x in text.splitlines() if x.strip().startswith("model.layers.0.mlp.up_proj.weight <-"))
    assert "columns 40..79 of 80 (part 2 of 2)" in line


def test_a_fused_keras_tensor_no_convention_names_is_not_split_back(tmp_path):
    import ckptmerge as cm

    want = _llama_like(np.random.default_rng(3), layers=1)
    out = tmp_path / "o.safetensors"
    with pytest.raises(cm.PlanError) as e:
        cm.merge([_fused_keras(want, layers=1, gate_up="up_gate_proj")], out, layout="torch",
                 template=[f32(k, *v.shape) for k, v in want.items()])
    assert "model.layers.0.mlp.gate_proj.weight" in str(e.value) and "model.layers.0.mlp.up_proj.weight" in str(e.value)
    assert not out.exists()


def test_a_fused_keras_target_is_joined_from_separate_gate_and_up_projections(tmp_path):
    import ckptmerge as cm
    from safetensors.numpy import save_file

    values = _llama_like(np.random.default_rng(4))
    path = tmp_path / "llama.safetensors"
    save_file(values, str(path), metadata={"format": "pt"})
    targets = [f32(k, *v.shape) for k, v in _fused_keras(values).items()]
    plan = cm.plan(targets, [cm.Source(str(path), layout="torch", align="structure")])
    assert plan.missing == []
    gate_up = plan.assignments["layer_1/mlp/gate_up_proj/kernel"]
    assert gate_up.name == "model/layers/1/mlp/gate_proj/kernel+model/layers/1/mlp/up_proj/kernel"


def test_meta_style_w1_is_the_gate_and_w3_the_up_projection():
    # w2(silu(w1(x)) * w3(x)): Meta's Llama, Mixtral's experts, transformers' LFM2
    names = [f32("layers/0/feed_forward/w1/kernel", 16, 40), f32("layers/0/feed_forward/w3/kernel", 16, 40),
             f32("layers/0/feed_forward/w2/kernel", 40, 16)]
    targets = [f32("transformer_layer_0/feedforward_gate_dense/kernel", 16, 40),
               f32("transformer_layer_0/feedforward_intermediate_dense/kernel", 16, 40),
               f32("transformer_layer_0/feedforward_output_dense/kernel", 40, 16)]
    mapping = align(targets, names).mapping
    assert mapping["layers/0/feed_forward/w1/kernel"] == "transformer_layer_0/feedforward_gate_dense/kernel"
    assert mapping["layers/0/feed_forward/w3/kernel"] == "transformer_layer_0/feedforward_intermediate_dense/kernel"


# -- the config key ---------------------------------------------------------------------------------

def test_a_config_adds_fused_modules_and_round_trips_them(tmp_path):
    from ckptmerge.config import load_config

    data = {"sources": [{"path": str(tmp_path)}],
            "conventions": [{"names": ["w13_cfg"], "parts": ["gate_proj", "up_proj"], "why": "mine"},
                            {"names": ["wqkv_cfg"], "parts": ["query", "key", "value"], "equal": False}]}
    cfg = load_config(data)
    assert [type(c).__name__ for c in cfg.conventions] == ["FusedConvention", "FusedConvention"]
    assert load_config(cfg.to_dict()) == cfg
    assert cfg.to_dict()["conventions"][1] == {"names": ["wqkv_cfg"], "parts": ["query", "key", "value"],
                                               "equal": False}
    cfg.make_sources()
    assert fused_row("w13_cfg").parts == ("gate_proj", "up_proj") and not fused_row("wqkv_cfg").equal


@pytest.mark.parametrize("entry, message", [
    ({"names": ["x"], "parts": ["gate_proj"]}, "two or more distinct parts"),
    ({"names": ["x"], "parts": "gate_proj"}, "expected a list of part names"),
    ({"names": ["x"], "parts": ["gate_proj", "up_proj"], "role": "mlpin"}, "'role' belongs to a naming convention"),
    ({"names": ["x"], "parts": ["gate_proj", "up_proj"], "equal": "yes"}, "equal"),
])
def test_a_bad_fused_entry_in_a_config_says_what_is_wrong(tmp_path, entry, message):
    from ckptmerge.config import load_config
    from ckptmerge.core.errors import ConfigError

    with pytest.raises(ConfigError, match=message):
        load_config({"sources": [{"path": str(tmp_path)}], "conventions": [entry]})
