"""Gradient lists for any parameter, linear without normalising and Model Stock's filter_wise,
through the API, config files and the CLI (issue 34 item 3), against hand-computed values on
small arrays.

A gradient ``[v_0, ..., v_m]`` spreads over the numbered layers as mergekit spreads it: layer
``i`` of ``n`` sits at ``t = i / (n - 1)``, and the value is interpolated at ``t * m`` between
its neighbours (numbers), or the entry at ``int(t * m)`` (integers, bools, strings)."""

from __future__ import annotations

import numpy as np
import pytest
from _cli_util import run
from test_combine import write

import ckptmerge as cm
from ckptmerge.combining.methods import combine_arrays
from ckptmerge.combining.params import Gradient, layer_index, layer_positions
from ckptmerge.core.errors import CombineError

LAYERS = [f"model.layers.{i}.w" for i in range(4)]


def arrays(seed):
    rng = np.random.default_rng(seed)
    return {n: rng.standard_normal(6).astype(np.float32) for n in LAYERS + ["lm_head.w"]}


@pytest.fixture
def models(tmp_path):
    base, a, b = arrays(0), arrays(1), arrays(2)
    return (write(tmp_path / "base", base), write(tmp_path / "a", a), write(tmp_path / "b", b)), (base, a, b)


def read(src):
    h = src.open()
    try:
        return h.read(sorted(e for e in h.entries))
    finally:
        h.close()


# -- the rule, by hand ----------------------------------------------------------------------------


def test_layer_index_takes_the_first_numbered_part_of_the_name():
    assert layer_index("model.layers.12.self_attn.q_proj.weight") == 12
    assert layer_index("transformer.h.3.mlp.c_fc.weight") == 3
    assert layer_index("encoder/layer/7/attention/output/dense/kernel") == 7
    assert layer_index("model.layers.2.mlp.experts.5.w1") == 2
    for outside in ("lm_head.weight", "model.embed_tokens.weight", "dense_1/kernel", "layers/dense/vars/0",
                    "block_3/conv"):
        assert layer_index(outside) is None, outside


def test_positions_spread_layers_over_zero_to_one():
    pos, n = layer_positions(LAYERS + ["lm_head.w"])
    assert n == 4 and [pos[x] for x in LAYERS] == [0.0, 1 / 3, 2 / 3, 1.0] and "lm_head.w" not in pos
    assert layer_positions(["h.0.w", "wte"]) == ({"h.0.w": 1.0}, 1)  # one layer: t = 1, as mergekit


def test_gradient_values_by_hand():
    g = Gradient((0.0, 1.0, 3.0))
    assert [g.at(t) for t in (0, 1 / 3, 2 / 3, 1)] == pytest.approx([0, 2 / 3, 5 / 3, 3])
    assert [Gradient((1, 2), False).at(t) for t in (0, 1 / 3, 2 / 3, 1)] == [1, 1, 1, 2]
    assert [Gradient((True, False, True)).at(t) for t in (0, 0.4, 0.5, 0.9, 1)] == [True, True, False, False, True]


# -- the API ----------------------------------------------------------------------------------------

SCALES = [0.0, 2 / 3, 5 / 3, 3.0]  # [0, 1, 3] at the four layers


def test_a_scale_gradient_over_the_layers(models):
    (pb, pa, _), (base, a, _) = models
    got = read(cm.combine([pa], "task_arithmetic", base=pb, scale={"*layers*": [0, 1, 3], "*": 1.0}))
    for name, s in zip(LAYERS, SCALES):
        want = base[name].astype(np.float64) + s * (a[name].astype(np.float64) - base[name])
        np.testing.assert_allclose(got[name], want.astype(np.float32), rtol=1e-6, atol=1e-6)
    np.testing.assert_array_equal(got["lm_head.w"], a["lm_head.w"])


def test_a_gradient_over_a_tensor_outside_the_layers_is_refused_by_name(models):
    (pb, pa, _), _ = models
    with pytest.raises(CombineError) as e:
        read(cm.combine([pa], "task_arithmetic", base=pb, scale=[0, 1, 3]))
    msg = str(e.value)
    assert "'lm_head.w': scale=[0, 1, 3] is a gradient over the layers, and this tensor is in no numbered layer" in msg
    assert "scale={'*layers*': [0, 1, 3], '*': 3.0}" in msg


def test_slerp_t_gradient_from_the_first_model_to_the_second(models):
    (_, pa, pb), (_, a, b) = models
    got = read(cm.combine([pa, pb], "slerp", t={"*layers*": [0, 1], "*": 0.5}))
    np.testing.assert_array_equal(got[LAYERS[0]], a[LAYERS[0]])
    np.testing.assert_array_equal(got[LAYERS[3]], b[LAYERS[3]])
    for name, t in zip(LAYERS[1:3], (1 / 3, 2 / 3)):
        want = combine_arrays("slerp", [a[name], b[name]], t=t).astype(np.float32)
        np.testing.assert_array_equal(got[name], want)


def test_integer_and_density_gradients_for_dare_and_ties(models):
    (pb, pa, pc), (base, a, b) = models
    got = read(cm.combine([pa, pc], "dare", base=pb, seed={"*layers*": [5, 9], "*": 0},
                          density={"*layers*": [1.0, 0.5], "*": 0.5}))
    for name, seed, density in zip(LAYERS, (5, 5, 5, 9), (1.0, 5 / 6, 4 / 6, 0.5)):
        want = combine_arrays("dare", [a[name], b[name]], base[name], name=name, seed=seed, density=density)
        np.testing.assert_allclose(got[name], want.astype(np.float32), rtol=1e-6)
    got = read(cm.combine([pa, pc], "ties", base=pb, density={"*layers*": [0.2, 1.0], "*": 1.0}))
    for name, i in zip(LAYERS, range(4)):
        want = combine_arrays("ties", [a[name], b[name]], base[name], density=0.2 + 0.8 * i / 3)
        np.testing.assert_array_equal(got[name], want.astype(np.float32))


def test_the_report_says_where_each_value_came_from(models):
    (pb, pa, _), _ = models
    text = cm.combine([pa], "task_arithmetic", base=pb, scale={"*layers*": [0, 1, 3], "*": 1.0}).report().render()
    assert "scale from the gradient [0, 1, 3] at t=0.3333" in text


def test_linear_without_normalising_is_the_weighted_sum(models):
    (_, pa, pb), (_, a, b) = models
    got = read(cm.combine([pa, pb], weights=[0.5, 2.0], normalize=False))
    for name in LAYERS:
        want = 0.5 * a[name].astype(np.float64) + 2.0 * b[name]
        np.testing.assert_array_equal(got[name], want.astype(np.float32))
    got = read(cm.combine([pa, pb], weights=[1.0, 1.0], normalize=False))  # uniform: the plain sum
    np.testing.assert_array_equal(got[LAYERS[0]], (a[LAYERS[0]].astype(np.float64) + b[LAYERS[0]]).astype(np.float32))
    assert combine_arrays("mean", [np.ones(2), np.ones(2)], weights=[1.0, -1.0], normalize=False).tolist() == [0, 0]


def ref_model_stock_rows(base, xs):
    """mergekit's filter-wise Model Stock: one t per row (the last axis), pairwise cosines."""
    b = np.asarray(base, np.float64)
    offs = [np.asarray(x, np.float64) - b for x in xs]
    k = len(offs)
    cos = np.mean([np.clip((offs[i] * offs[j]).sum(-1) / np.maximum(
        np.linalg.norm(offs[i], axis=-1) * np.linalg.norm(offs[j], axis=-1), 1e-6), -1, 1)
        for i in range(k) for j in range(i + 1, k)], axis=0)[..., None]
    t = k * cos / (1 + (k - 1) * cos)
    return t * np.mean(np.stack(xs).astype(np.float64), axis=0) + (1 - t) * b


@pytest.mark.parametrize("shape", [(4, 5), (3, 2, 7), (1, 9), (6, 1)])
@pytest.mark.parametrize("chunk", [None, 1, 4, 13])
def test_model_stock_filter_wise_takes_one_ratio_per_row(shape, chunk):
    rng = np.random.default_rng(sum(shape))
    base = rng.standard_normal(shape)
    xs = [base + rng.standard_normal(shape) for _ in range(3)]
    got = combine_arrays("model_stock", xs, base, filter_wise=True, chunk=chunk)
    np.testing.assert_allclose(got, ref_model_stock_rows(base, xs), rtol=1e-12, atol=1e-12)
    whole = combine_arrays("model_stock", xs, base, chunk=chunk)
    assert not np.allclose(got, whole) or shape[0] == 1


def test_model_stock_filter_wise_through_files(tmp_path):
    rng = np.random.default_rng(5)
    base = rng.standard_normal((8, 64)).astype(np.float32)
    xs = [(base + rng.standard_normal((8, 64))).astype(np.float32) for _ in range(2)]
    pb = write(tmp_path / "base", {"k": base, "bias": base[0]})
    ps = [write(tmp_path / f"x{i}", {"k": x, "bias": x[0]}) for i, x in enumerate(xs)]
    got = read(cm.combine(ps, "model_stock", base=pb, filter_wise=True, chunk_elements=100))
    np.testing.assert_allclose(got["k"], ref_model_stock_rows(base, xs).astype(np.float32), rtol=2e-6, atol=1e-6)
    np.testing.assert_allclose(got["bias"], combine_arrays("model_stock", [x[0] for x in xs], base[0]).astype(np.float32),
                               rtol=1e-6)


# -- config files and the CLI -----------------------------------------------------------------------


def test_config_gradients_normalize_and_filter_wise(models, tmp_path):
    (pb, pa, pc), (base, a, b) = models
    cfg = tmp_path / "c.yaml"
    cfg.write_text(f"combine:\n  method: task_arithmetic\n  base: {pb}\n  models: [{pa}]\n  parameters:\n"
                   "    scale: {'*layers*': [0, 1, 3], '*': 1.0}\n")
    got = read(cm.load_config(str(cfg)).combine.make_source())
    for name, s in zip(LAYERS, SCALES):
        want = base[name].astype(np.float64) + s * (a[name].astype(np.float64) - base[name])
        np.testing.assert_allclose(got[name], want.astype(np.float32), rtol=1e-6, atol=1e-6)
    cfg.write_text(f"combine:\n  method: mean\n  models:\n    - {{path: {pa}, weight: 0.5}}\n    - {{path: {pc}, weight: 2}}\n"
                   "  parameters:\n    normalize: false\n")
    got = read(cm.load_config(str(cfg)).combine.make_source())
    np.testing.assert_array_equal(got[LAYERS[1]], (0.5 * a[LAYERS[1]].astype(np.float64) + 2 * b[LAYERS[1]]).astype(np.float32))
    cfg.write_text(f"combine:\n  method: model_stock\n  base: {pb}\n  models: [{pa}, {pc}]\n"
                   "  parameters:\n    filter_wise: true\n")
    assert cm.load_config(str(cfg)).combine.make_source().params == {"filter_wise": True}


def test_cli_gradients_normalize_and_filter_wise(models, tmp_path):
    (pb, pa, pc), (base, a, b) = models
    out = tmp_path / "g.safetensors"
    r = run("combine", pa, "-m", "task_arithmetic", "--base", pb, "--param", "scale[*layers*]=[0, 1, 3]",
            "--param", "scale=1", "-o", out, "-q")
    assert r.exit_code == 0, r.output
    got = cm.load(str(out))
    for name, s in zip(LAYERS, SCALES):
        want = base[name].astype(np.float64) + s * (a[name].astype(np.float64) - base[name])
        np.testing.assert_allclose(got[name], want.astype(np.float32), rtol=1e-6, atol=1e-6)
    r = run("combine", pa, pc, "--weights", "0.5,2", "--param", "normalize=false", "-o", tmp_path / "s.safetensors",
            "-q")
    assert r.exit_code == 0, r.output
    got = cm.load(str(tmp_path / "s.safetensors"))
    np.testing.assert_array_equal(got[LAYERS[2]], (0.5 * a[LAYERS[2]].astype(np.float64) + 2 * b[LAYERS[2]]).astype(np.float32))
    r = run("combine", pa, pc, "-m", "model_stock", "--base", pb, "--param", "filter_wise=true", "--dry-run")
    assert r.exit_code == 0 and "t per row from the fine-tunes' angles" in r.stdout, r.output
    r = run("combine", pa, "-m", "task_arithmetic", "--base", pb, "--param", "scale=[0, 1]", "-o", tmp_path / "x")
    assert r.exit_code == 2 and "'lm_head.w': scale=[0, 1] is a gradient over the layers" in r.stderr


def test_weight_gradients_per_input(models, tmp_path):
    """weights=[[1, 0], [0, 1]]: layer 0 all the first model, layer 3 all the second, a mean."""
    (_, pa, pb), (_, a, b) = models
    src = cm.combine([pa, pb], weights=[{"*layers*": [1.0, 0.0], "*": 1.0}, {"*layers*": [0.0, 1.0], "*": 1.0}])
    got = read(src)
    for name, i in zip(LAYERS, range(4)):
        wa, wb = 1 - i / 3, i / 3
        want = (wa * a[name].astype(np.float64) + wb * b[name]) / (wa + wb)
        np.testing.assert_allclose(got[name], want.astype(np.float32), rtol=1e-6, atol=1e-7)
    with pytest.raises(CombineError, match=r"'lm_head.w': weights\[0\]=\[1, 0\] is a gradient over the layers"):
        read(cm.combine([pa, pb], weights=[[1.0, 0.0], 1.0]))
    cfg = tmp_path / "w.yaml"
    cfg.write_text(f"combine:\n  method: mean\n  models:\n    - {{path: {pa}, weight: {{'*layers*': [1, 0], '*': 1}}}}\n"
                   f"    - {{path: {pb}, weight: {{'*layers*': [0, 1], '*': 1}}}}\n")
    got = read(cm.load_config(str(cfg)).combine.make_source())
    np.testing.assert_array_equal(got[LAYERS[0]], a[LAYERS[0]])
    np.testing.assert_array_equal(got[LAYERS[3]], b[LAYERS[3]])


def test_a_parameter_refusal_says_nothing_of_keys(models):
    (pb, pa, _), _ = models
    with pytest.raises(CombineError) as e:
        read(cm.combine([pa], "task_arithmetic", base=pb, scale=[0, 1, 3]))
    msg = str(e.value)
    assert msg.startswith("Cannot combine 1 input with 'task_arithmetic': the parameters do not fit 1 tensor:")
    assert "keys=" not in msg and e.value.differences == [msg.split("\n  ")[1]]
