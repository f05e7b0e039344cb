"""mergekit configs read as written (``cm.from_mergekit``, ``ckptmerge combine --mergekit``), with
mergekit's conventions, against an independent NumPy implementation of mergekit 0.1.5's formulas.

The models are tiny Hugging Face folders (``model.safetensors`` + ``config.json``) written here;
the configs are mergekit's own examples and README configs, with the Hub ids replaced by those
folders, and run unchanged otherwise. DARE is checked with the seed semantics documented in
docs/merging.md (a Philox generator per ``(seed, crc32(name), input, block)``, reimplemented
here) and in distribution.
"""

from __future__ import annotations

import json
import textwrap
import zlib

import numpy as np
import pytest
from _cli_util import assert_one_line_error, run
from safetensors.numpy import save_file

import ckptmerge as cm
from ckptmerge.core.errors import ConfigError

LAYERS = 2


def shapes(layers=LAYERS):
    out = {"model.embed_tokens.weight": (16, 8), "model.norm.weight": (8,), "lm_head.weight": (16, 8)}
    for i in range(layers):
        for part, shape in (("self_attn.q_proj.weight", (8, 8)), ("self_attn.o_proj.weight", (8, 8)),
                            ("mlp.up_proj.weight", (12, 8)), ("mlp.down_proj.weight", (8, 12)),
                            ("input_layernorm.weight", (8,))):
            out[f"model.layers.{i}.{part}"] = shape
    return out


def write_model(folder, seed, base=None, scale=0.05, zero=(), layers=LAYERS):
    """A tiny llama-like model: random, or ``base`` plus a random offset; ``zero``: names set to 0."""
    rng = np.random.default_rng(seed)
    tensors = {}
    for name, shape in shapes(layers).items():
        if base is None:
            v = rng.standard_normal(shape)
        else:
            v = base[name].astype(np.float64) + scale * rng.standard_normal(shape)
        tensors[name] = np.zeros(shape, np.float32) if name in zero else v.astype(np.float32)
    folder.mkdir(parents=True)
    save_file(tensors, str(folder / "model.safetensors"))
    (folder / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"],
                                                    "num_hidden_layers": layers}))
    return tensors


@pytest.fixture
def models(tmp_path):
    base = write_model(tmp_path / "models" / "base", 0)
    fts = {f"ft{i}": write_model(tmp_path / "models" / f"ft{i}", 10 + i, base) for i in range(1, 4)}
    return tmp_path, base, fts


def config(tmp_path, text, name="merge.yml"):
    p = tmp_path / name
    p.write_text(textwrap.dedent(text))
    return p


def merged(cfg, tmp_path, **kw):
    out = tmp_path / "out.safetensors"
    cm.merge(cm.from_mergekit(cfg, **kw), str(out), overwrite=True)
    return cm.load(str(out))


def f64(x):
    return np.asarray(x, np.float64)


def close(got, want, dtype=np.float32):
    """Within float32 rounding: the float64 reference rounded once, two ulps of the largest value."""
    want = f64(want)
    tol = 2 * np.spacing(np.float32(np.abs(want).max() or 1.0))
    assert got.dtype == dtype
    np.testing.assert_allclose(f64(got), want, rtol=0, atol=float(tol))


# -- mergekit 0.1.5's formulas, independently in NumPy (merge_methods/*.py, sparsify.py) -------------


def mk_filter(setting, name):
    """mergekit's evaluate_setting for a value or a filter list (substring match, '*' or none: all)."""
    if not isinstance(setting, list):
        return setting
    for cond in setting:
        f = cond.get("filter")
        if f is None or f == "*" or f in name:
            return cond["value"]
    return None


def mk_linear(xs, ws):
    w = np.asarray(ws, np.float64).reshape((-1,) + (1,) * xs[0].ndim)
    return (w * np.stack([f64(x) for x in xs])).sum(0) / w.sum(0)


def mk_magnitude(d, density):
    if density >= 1:
        return d
    k = int(density * d.size)
    mask = np.zeros(d.size)
    mask[np.argsort(-np.abs(d).reshape(-1), kind="stable")[:k]] = 1
    return d * mask.reshape(d.shape)


def mk_rescale_l1(d, mask):
    masked = d * mask
    before, after = np.abs(d).sum(), np.abs(masked).sum()
    if before < 1e-7 or after < 1e-7:
        return masked
    return masked * (before / after)


def mk_gta(base, xs, ws, densities, *, consensus, sparsify, normalize, rescale=False, lam=1.0, masks=None):
    b = f64(base)
    deltas = []
    for i, (x, d) in enumerate(zip(xs, densities)):
        delta = f64(x) - b
        if sparsify == "magnitude":
            delta = mk_magnitude(delta, d)
        elif sparsify == "random" and d < 1:
            delta = mk_rescale_l1(delta, masks[i]) if rescale else delta * masks[i]
        deltas.append(delta)
    dl = np.stack(deltas)
    w = np.asarray(ws, np.float64).reshape((-1,) + (1,) * b.ndim)
    wd = dl * w
    if consensus:
        majority = np.where(wd.sum(0) >= 0, 1.0, -1.0)
        mask = np.sign(wd) == majority
        mixed = (wd * mask).sum(0)
        div = (w * mask).sum(0)
        div[div == 0] = 1
    else:
        mixed = wd.sum(0)
        div = w.sum(0) * np.ones_like(b)
        div[np.abs(div) < 1e-8] = 1
    if normalize:
        mixed = mixed / div
    return b + mixed * lam


def mk_slerp(t, v0, v1, eps=1e-8):
    a, b = f64(v0).reshape(-1), f64(v1).reshape(-1)
    na, nb = np.linalg.norm(a), np.linalg.norm(b)
    an = a / na if na > eps else a
    bn = b / nb if nb > eps else b
    dot = np.sum(an * bn)
    if abs(dot) > 0.9995:
        return ((1 - t) * a + t * b).reshape(np.shape(v0))
    th = np.arccos(dot)
    return ((np.sin(th - th * t) * a + np.sin(th * t) * b) / np.sin(th)).reshape(np.shape(v0))


def mk_model_stock(base, xs):
    w0 = f64(base).reshape(-1)
    ws = [f64(x).reshape(-1) for x in xs]
    offs = [w - w0 for w in ws]
    cos = []
    for i in range(len(offs)):
        for j in range(i + 1, len(offs)):
            prod = max(np.linalg.norm(offs[i]) * np.linalg.norm(offs[j]), 1e-6)
            cos.append(np.clip(np.dot(offs[i], offs[j]) / prod, -1, 1))
    c = np.mean(cos)
    n = len(ws)
    t = n * c / (1 + (n - 1) * c)
    return (t * (sum(ws) / n) + (1 - t) * w0).reshape(np.shape(base))


def dare_masks(seed, name, inputs, size, density, block=1 << 16):
    """The keep masks docs/merging.md documents: uniform draws of Philox(SeedSequence([seed,
    crc32(name), input, block])) for each block of 65536 elements, kept where below density."""
    out = []
    for j in inputs:
        draws = np.concatenate([np.random.Generator(np.random.Philox(np.random.SeedSequence(
            [seed, zlib.crc32(name.encode()), j, k]))).random(min(block, size - k * block))
            for k in range(-(-size // block))])
        out.append((draws < density).astype(np.float64))
    return out


# -- the ported configs ----------------------------------------------------------------------------


def test_linear_example_runs_as_written(models):
    tmp, base, fts = models
    cfg = config(tmp, """\
        models:
          - model: models/ft1
            parameters:
              weight: 1.0
          - model: models/ft2
            parameters:
              weight: 0.3
          - model: models/ft3
            parameters:
              weight: 0.5
        merge_method: linear
        dtype: float16
        """)
    got = merged(cfg, tmp)
    for name in shapes():
        want = mk_linear([fts[f"ft{i}"][name] for i in (1, 2, 3)], [1.0, 0.3, 0.5])
        assert got[name].dtype == np.float16
        np.testing.assert_array_equal(got[name], want.astype(np.float16))


def test_task_arithmetic_with_lambda_and_normalize(models):
    tmp, base, fts = models
    for normalize in (False, True):
        cfg = config(tmp, f"""\
            models:
              - model: models/base
              - model: models/ft1
                parameters:
                  weight: 0.7
              - model: models/ft2
                parameters:
                  weight: 0.5
            merge_method: task_arithmetic
            base_model: models/base
            parameters:
              lambda: 0.8
              normalize: {str(normalize).lower()}
            """, f"ta{normalize}.yml")
        got = merged(cfg, tmp)
        for name in shapes():
            want = mk_gta(base[name], [fts["ft1"][name], fts["ft2"][name]], [0.7, 0.5], [1, 1], consensus=False,
                          sparsify=None, normalize=normalize, lam=0.8)
            close(got[name], want)


def test_ties_readme_config_with_filters_and_per_model_density(models):
    tmp, base, fts = models
    cfg = config(tmp, """\
        models:
          - model: models/ft1
            parameters:
              density: 0.5
              weight: 1.0
          - model: models/ft2
            parameters:
              density: 0.5
              weight:
                - filter: mlp
                  value: 0.5
                - value: 0.3
          - model: models/ft3
            parameters:
              density: 0.33
              weight:
                - filter: self_attn
                  value: 0.2
        merge_method: ties
        base_model: models/base
        parameters:
          normalize: true
          int8_mask: true
          weight: 0.9
        dtype: float32
        """)
    src = cm.from_mergekit(cfg)
    text = src.report().render()
    assert "Conventions: mergekit" in text and "filters: substrings (mergekit)" in text
    got = merged(cfg, tmp)
    for name in shapes():
        ws = [1.0, mk_filter([{"filter": "mlp", "value": 0.5}, {"value": 0.3}], name),
              mk_filter([{"filter": "self_attn", "value": 0.2}], name) or 0.9]  # then the merge-wide weight
        want = mk_gta(base[name], [fts[f"ft{i}"][name] for i in (1, 2, 3)], ws, [0.5, 0.5, 0.33], consensus=True,
                      sparsify="magnitude", normalize=True)
        close(got[name], want)


def test_ties_without_density_trims_nothing_as_mergekit(models):
    tmp, base, fts = models
    cfg = config(tmp, """\
        models:
          - model: models/ft1
            parameters: {weight: 1.0}
          - model: models/ft2
            parameters: {weight: 1.0}
        merge_method: ties
        base_model: models/base
        """)
    got = merged(cfg, tmp)
    name = "model.layers.0.mlp.up_proj.weight"
    want = mk_gta(base[name], [fts["ft1"][name], fts["ft2"][name]], [1, 1], [1, 1], consensus=True,
                  sparsify="magnitude", normalize=True)
    close(got[name], want)
    assert "density: mergekit's default 1.0" in cm.from_mergekit(cfg).report().render()


@pytest.mark.parametrize("method", ["dare_linear", "dare_ties"])
@pytest.mark.parametrize("rescale", [None, False])
def test_dare_with_the_documented_draws_and_mergekit_rescale(models, method, rescale):
    tmp, base, fts = models
    extra = "" if rescale is None else "\n          rescale: false"
    cfg = config(tmp, f"""\
        models:
          - model: models/base
            # no parameters necessary for base model
          - model: models/ft1
            parameters:
              density: 0.53
              weight: 0.4
          - model: models/ft2
            parameters:
              density: 0.53
              weight: 0.3
        merge_method: {method}
        base_model: models/base
        parameters:
          int8_mask: true{extra}
        dtype: float32
        """, f"{method}.yml")
    got = merged(cfg, tmp, seed=5)
    out = tmp / "cli.safetensors"
    r = run("combine", "--mergekit", cfg, "--param", "seed=5", "-o", out, "-q")
    assert r.exit_code == 0, r.output
    cli = cm.load(str(out))
    assert all(np.array_equal(cli[n], got[n]) for n in shapes())
    assert_one_line_error(run("combine", "--mergekit", cfg, "--param", "density=0.5", "-o", out), "--param density")
    for name, shape in shapes().items():
        size = int(np.prod(shape))
        masks = [m.reshape(shape) for m in dare_masks(5, name, [0, 1], size, 0.53)]
        want = mk_gta(base[name], [fts["ft1"][name], fts["ft2"][name]], [0.4, 0.3], [0.53, 0.53],
                      consensus=method == "dare_ties", sparsify="random", normalize=False,
                      rescale=rescale is None, masks=masks)
        close(got[name], want)


def test_dare_in_distribution_and_l1_rescale(tmp_path):
    """One large tensor: the kept fraction is density, and the kept offsets keep the L1 norm."""
    rng = np.random.default_rng(3)
    b = rng.standard_normal(200_000).astype(np.float32)
    x = (b + 0.1 * rng.standard_normal(b.size)).astype(np.float32)
    for n, v in (("base", b), ("ft", x)):
        (tmp_path / n).mkdir()
        save_file({"w": v}, str(tmp_path / n / "model.safetensors"))
    for seed in (0, 1, 2):
        cfg = config(tmp_path, """\
            models:
              - model: ft
                parameters: {weight: 1.0, density: 0.3}
            merge_method: dare_linear
            base_model: base
            """)
        got = merged(cfg, tmp_path, seed=seed)["w"].astype(np.float64)
        kept = got != b
        frac = kept.mean()
        assert abs(frac - 0.3) < 4 * np.sqrt(0.3 * 0.7 / b.size)  # a binomial within 4 sigma
        d = x.astype(np.float64) - b
        np.testing.assert_allclose(np.abs(got - b).sum(), np.abs(d).sum(), rtol=1e-5)
        again = merged(cfg, tmp_path, seed=seed)["w"]
        np.testing.assert_array_equal(again, got.astype(np.float32))  # a seed gives the same draws


def test_slerp_gradient_example_structure_with_scalar_t_and_a_zero_tensor(tmp_path):
    """mergekit's slerp slices example (one t): a zero tensor in one model follows mergekit's
    quarter circle, not ckptmerge's straight line."""
    a = write_model(tmp_path / "models" / "a", 1)
    b = write_model(tmp_path / "models" / "b", 2, zero=("model.norm.weight",))
    cfg = config(tmp_path, """\
        slices:
          - sources:
              - model: models/a
                layer_range: [0, 2]
              - model: models/b
                layer_range: [0, 2]
        merge_method: slerp
        base_model: models/a
        parameters:
          t:
            - filter: self_attn
              value: 0.3
            - filter: mlp
              value: 0.7
            - value: 0.5
        dtype: float32
        """)
    got = merged(cfg, tmp_path)
    ts = [{"filter": "self_attn", "value": 0.3}, {"filter": "mlp", "value": 0.7}, {"value": 0.5}]
    for name in shapes():
        close(got[name], mk_slerp(mk_filter(ts, name), a[name], b[name]))
    z = got["model.norm.weight"].astype(np.float64)
    np.testing.assert_allclose(z, np.cos(np.pi / 4) * a["model.norm.weight"], rtol=1e-6)
    lin = merged(cfg, tmp_path, conventions="ckptmerge")["model.norm.weight"]
    np.testing.assert_allclose(lin, 0.5 * a["model.norm.weight"], rtol=1e-6)


def test_model_stock(models):
    tmp, base, fts = models
    cfg = config(tmp, """\
        models:
          - model: models/ft1
          - model: models/ft2
          - model: models/ft3
        merge_method: model_stock
        base_model: models/base
        dtype: float32
        """)
    got = merged(cfg, tmp)
    for name in shapes():
        close(got[name], mk_model_stock(base[name], [fts[f"ft{i}"][name] for i in (1, 2, 3)]))
    assert cm.combine.from_mergekit(cfg).report().method == "model_stock"  # (the spelling)


# -- refused keys: each named, with the file ---------------------------------------------------------


REFUSED = [
    ("tokenizer_source: union\n", "tokenizer_source", "builds no tokenizer"),
    ("chat_template: chatml\n", "chat_template", "tokenizer"),
    ("merge_methd: ties\n", "merge_methd", "Did you mean 'merge_method'"),
    ("parameters:\n  densty: 0.5\n", "densty", "Did you mean 'density'"),
    ("parameters:\n  t: 0.5\n", "parameters.t", "not a parameter of ties"),
    ("parameters:\n  weight: [0, 0.5, 1]\n", "parameters.weight", "gradient lists of weight are not yet supported"),
    ("parameters:\n  weight:\n    - pattern: mlp\n      value: 1\n", "pattern", "old spelling of 'filter'"),
    ("dtype: float8\n", "dtype", "float16"),
]


@pytest.mark.parametrize("extra,key,why", REFUSED)
def test_each_refused_key_is_one_error_line_naming_it_and_the_file(models, extra, key, why):
    tmp, _, _ = models
    body = "models:\n  - model: models/ft1\n    parameters: {weight: 1.0}\nmerge_method: ties\nbase_model: models/base\n"
    if extra.startswith("merge_methd"):
        body = body.replace("merge_method: ties\n", "")
    if extra.startswith("parameters"):
        body += extra
    else:
        body += extra
    cfg = tmp / "bad.yml"
    cfg.write_text(body)
    with pytest.raises(ConfigError) as e:
        cm.from_mergekit(cfg)
    assert key in str(e.value) and why in str(e.value) and str(cfg) in str(e.value)
    r = run("combine", "--mergekit", cfg, "-o", tmp / "o.safetensors")
    assert_one_line_error(r, key, why, str(cfg))
    assert not (tmp / "o.safetensors").exists()


REFUSED_SHAPES = [
    ("merge_method: della\nbase_model: models/base\nmodels:\n  - model: models/ft1\n", "merge_method",
     "mergekit's 'della' is not supported"),
    ("merge_method: ties\nbase_model: models/base\nmodels:\n  - model: models/ft1\n    parameters:\n      "
     "normalize: false\n      weight: 1\n", "models[0].parameters.normalize", "merge-wide parameter"),
    ("merge_method: ties\nbase_model: models/base\nmodels:\n  - model: models/ft1\n", "models[0]", "has no weight"),
    ("merge_method: ties\nmodels:\n  - model: models/ft1\n    parameters: {weight: 1}\n", "merge.yml",
     "needs a base_model"),
    ("merge_method: slerp\nbase_model: models/base\nmodels:\n  - model: models/ft1\n", "parameters",
     "needs the parameter t"),
    ("merge_method: task_arithmetic\nbase_model: models/base\nmodels:\n  - model: models/ft1\n    parameters:\n"
     "      weight: 1\n      density: 0.5\n", "models", "does not sparsify"),
    ("merge_method: ties\nbase_model: mistralai/Mistral-7B-v0.1\nmodels:\n  - model: models/ft1\n    parameters: "
     "{weight: 1}\n", "base_model", "Hugging Face Hub"),
    ("merge_method: ties\nbase_model: models/base\nmodels:\n  - model: models/ft1+loras/x\n    parameters: "
     "{weight: 1}\n", "models[0].model", "LoRA"),
    ("merge_method: ties\nbase_model: models/base\nmodels:\n  - model: ../../etc\n    parameters: {weight: 1}\n",
     "models[0].model", "not found"),
    ("merge_method: slerp\nbase_model: models/ft1\nslices:\n  - sources:\n      - model: models/ft1\n        "
     "layer_range: [0, 2]\n      - model: models/ft2\n        layer_range: [0, 1]\nparameters: {t: 0.5}\n",
     "slices[0].sources", "take different layers"),
    ("merge_method: slerp\nbase_model: models/ft1\nslices:\n  - sources:\n      - model: models/ft1\n        "
     "layer_range: [0, 1]\n      - model: models/ft2\n        layer_range: [0, 1]\nparameters: {t: 0.5}\n",
     "layer_range", "drops layers"),
    ("merge_method: slerp\nbase_model: models/ft1\nslices:\n  - sources:\n      - model: models/ft1\n        "
     "layer_range: [0, 2]\n      - model: models/ft2\n        layer_range: [0, 2]\n    residual_weight: 0.1\n"
     "parameters: {t: 0.5}\n", "residual_weight", "not supported"),
    ("merge_method: ties\nbase_model: models/base\nmodules:\n  text: {}\n", "modules", "not supported"),
]


@pytest.mark.parametrize("body,key,why", REFUSED_SHAPES)
def test_each_unsupported_form_is_refused_by_name(models, body, key, why):
    tmp, _, _ = models
    cfg = tmp / "merge.yml"
    cfg.write_text(body)
    r = run("combine", "--mergekit", cfg, "-o", tmp / "o.safetensors")
    assert r.exit_code == 2 and str(cfg) in r.stderr and key in r.stderr and why in r.stderr, r.stderr
    assert r.stderr.startswith("Error: ") and r.stderr.count("Error:") == 1


def test_cli_writes_the_merge_and_reports_the_conventions(models):
    tmp, base, fts = models
    cfg = config(tmp, """\
        models:
          - model: models/ft1
            parameters: {weight: 1.0, density: 0.5}
          - model: models/ft2
            parameters: {weight: 1.0}
        merge_method: ties
        base_model: models/base
        """)
    r = run("combine", "--mergekit", cfg, "--dry-run")
    assert r.exit_code == 0, r.output
    assert "Conventions: mergekit" in r.stdout and "density: set" in r.stdout and "rescale: mergekit's default false" \
        in r.stdout
    out = tmp / "o.safetensors"
    r = run("combine", "--mergekit", cfg, "-o", out, "-q")
    assert r.exit_code == 0, r.output
    name = "lm_head.weight"
    want = mk_gta(base[name], [fts["ft1"][name], fts["ft2"][name]], [1, 1], [0.5, 1.0], consensus=True,
                  sparsify="magnitude", normalize=True)
    close(cm.load(str(out))[name], want)
    r = run("combine", "--mergekit", cfg, "-m", "ties", "-o", out)
    assert_one_line_error(r, "--mergekit", "--method")


def test_combine_api_takes_mergekit_conventions():
    from ckptmerge.combining.methods import combine_arrays

    rng = np.random.default_rng(0)
    b = rng.standard_normal(50)
    x = b + rng.standard_normal(50)
    got = combine_arrays("ties", [x], b, conventions="mergekit")  # density 1.0: nothing trimmed
    np.testing.assert_allclose(got, x)
    got = combine_arrays("ties", [x], b)  # ckptmerge's 0.5
    assert np.count_nonzero(got != b) == 25


def test_docs_table_lists_every_difference_between_the_conventions():
    from pathlib import Path

    from ckptmerge.combining.conventions import DIFFERENCES

    text = (Path(__file__).resolve().parents[1] / "docs" / "merging.md").read_text(encoding="utf-8")
    for what, ours, theirs in DIFFERENCES:
        assert f"| {what} | {ours} | {theirs} |" in text, what


def mk_gradient(values, t):
    """mergekit's evaluate_setting of a gradient list at t."""
    scaled = t * (len(values) - 1)
    i0 = int(scaled)
    i1 = min(len(values) - 1, i0 + 1)
    return (1 - (scaled - i0)) * values[i0] + (scaled - i0) * values[i1]


def test_gradient_slerp_readme_config_spreads_t_over_the_layers(tmp_path):
    """mergekit's gradient SLERP (README): t per layer i of n at i/(n-1), by filter, 0.5 elsewhere."""
    a = write_model(tmp_path / "models" / "a", 1, layers=4)
    b = write_model(tmp_path / "models" / "b", 2, layers=4)
    cfg = config(tmp_path, """\
        slices:
          - sources:
              - model: models/a
                layer_range: [0, 4]
              - model: models/b
                layer_range: [0, 4]
        merge_method: slerp
        base_model: models/a
        parameters:
          t:
            - filter: self_attn
              value: [0, 0.5, 0.3, 0.7, 1]
            - filter: mlp
              value: [1, 0.5, 0.7, 0.3, 0]
            - value: 0.5 # fallback for rest of tensors
        dtype: bfloat16
        """)
    got = merged(cfg, tmp_path)
    for name in shapes(4):
        layer = int(name.split(".")[2]) if name.startswith("model.layers.") else None
        t = 0.5
        if layer is not None and "self_attn" in name:
            t = mk_gradient([0, 0.5, 0.3, 0.7, 1], layer / 3)
        elif layer is not None and "mlp" in name:
            t = mk_gradient([1, 0.5, 0.7, 0.3, 0], layer / 3)
        want = mk_slerp(t, a[name], b[name])
        g = got[name].astype(np.float64)
        np.testing.assert_allclose(g, want, rtol=0, atol=np.abs(want).max() * 2 ** -7)


def test_a_gradient_over_tensors_outside_the_layers_is_refused_naming_them(models):
    tmp, _, _ = models
    cfg = config(tmp, """\
        models:
          - model: models/ft1
            parameters:
              density: [1, 0.7, 0.1] # density gradient
              weight: 1.0
        merge_method: ties
        base_model: models/base
        """)
    r = run("combine", "--mergekit", cfg, "-o", tmp / "o.safetensors")
    assert r.exit_code == 2 and "'lm_head.weight'" in r.stderr and "- filter: layers" in r.stderr, r.stderr
    cfg.write_text(cfg.read_text().replace("density: [1, 0.7, 0.1]", "density:\n        - filter: layers\n"
                                           "          value: [1, 0.7, 0.5]\n        - value: 0.5"))
    src = cm.from_mergekit(cfg)
    assert "density from the gradient [1, 0.7, 0.5]" in src.report().render()
    got = merged(cfg, tmp)
    _, base, fts = models
    for name in shapes():
        d = mk_gradient([1, 0.7, 0.5], int(name.split(".")[2]) / (LAYERS - 1)) if "layers" in name else 0.5
        want = mk_gta(base[name], [fts["ft1"][name]], [1.0], [d], consensus=True, sparsify="magnitude", normalize=True)
        close(got[name], want)


def test_cli_conventions_option_on_plain_inputs(models):
    tmp, base, fts = models
    out = tmp / "c.safetensors"
    args = ["combine", tmp / "models/ft1/model.safetensors", "-m", "ties", "--base", tmp / "models/base", "-o", out, "-q", "--force"]
    r = run(*args, "--conventions", "mergekit")
    assert r.exit_code == 0, r.output
    name = "model.layers.0.mlp.up_proj.weight"
    np.testing.assert_array_equal(cm.load(str(out))[name], fts["ft1"][name])  # density 1.0: nothing trimmed
    r = run(*args)
    assert r.exit_code == 0, r.output
    assert np.count_nonzero(cm.load(str(out))[name] != base[name]) == fts["ft1"][name].size // 2  # ckptmerge's 0.5
    r = run(*args, "--conventions", "mergekitt")
    assert r.exit_code == 2 and "mergekit" in r.stderr
    with pytest.raises(cm.ArgumentError, match="conventions must be one of"):
        cm.combine([str(tmp / "models/ft1")], "ties", base=str(tmp / "models/base"), conventions="mk")
    with pytest.raises(cm.ArgumentError, match="'rescale'"):
        cm.combine([str(tmp / "models/ft1")], "ties", base=str(tmp / "models/base"), rescale=True)


def test_model_stock_with_tiny_offsets_follows_mergekits_clamped_cosine(tmp_path):
    base = write_model(tmp_path / "models" / "base", 0)
    fts = [write_model(tmp_path / "models" / f"ft{i}", 20 + i, base, scale=3e-5) for i in (1, 2)]
    cfg = config(tmp_path, """\
        models:
          - model: models/ft1
          - model: models/ft2
        merge_method: model_stock
        base_model: models/base
        """)
    got = merged(cfg, tmp_path)
    for name in shapes():
        close(got[name], mk_model_stock(base[name], [f[name] for f in fts]))
    ours = merged(cfg, tmp_path, conventions="ckptmerge")
    assert any(not np.array_equal(ours[n], got[n]) for n in shapes())  # (the two cosines differ here)


def test_config_combine_section_takes_mergekit_conventions(models):
    tmp, base, fts = models
    doc = {"combine": {"method": "ties", "conventions": "mergekit", "base": str(tmp / "models/base"),
                       "models": [str(tmp / "models/ft1/model.safetensors")],
                       "parameters": {"rescale": False, "density": {"mlp": 0.5, "*": 1.0}}}}
    cfg = cm.load_config(doc)
    assert cfg.to_dict()["combine"]["conventions"] == "mergekit"
    src = cfg.combine.make_source()
    out = tmp / "cfg.safetensors"
    cm.merge(src, str(out))
    got = cm.load(str(out))
    name = "model.layers.0.self_attn.q_proj.weight"  # no 'mlp' in it: density 1.0
    np.testing.assert_array_equal(got[name], fts["ft1"][name])
    name = "model.layers.0.mlp.up_proj.weight"
    close(got[name], mk_gta(base[name], [fts["ft1"][name]], [1.0], [0.5], consensus=True, sparsify="magnitude",
                            normalize=True))
    with pytest.raises(ConfigError, match="no parameter 'rescale'.*add 'conventions: mergekit'"):
        cm.load_config({"combine": {**doc["combine"], "conventions": "ckptmerge"}})


def test_contiguous_identical_slices_merge_as_models_do(models):
    tmp, base, fts = models
    src = textwrap.dedent("""\
        merge_method: ties
        base_model: models/base
        parameters:
          density: 0.5
        dtype: float32
        """)
    sliced = config(tmp, src + "slices:\n" + "".join(
        f"  - sources:\n      - model: models/base\n        layer_range: [{a}, {a + 1}]\n"
        f"      - model: models/ft1\n        layer_range: [{a}, {a + 1}]\n        parameters: {{weight: 0.7}}\n"
        for a in range(LAYERS)), "sliced.yml")
    whole = config(tmp, src + "models:\n  - model: models/ft1\n    parameters: {weight: 0.7}\n", "whole.yml")
    a, b = merged(sliced, tmp), dict(merged(whole, tmp))
    for name in shapes():
        np.testing.assert_array_equal(a[name], b[name])


def test_model_paths_are_untrusted_as_in_every_config(models, monkeypatch):
    tmp, _, _ = models
    monkeypatch.setenv("MODELS", str(tmp / "models"))
    monkeypatch.setenv("SECRET", "s3cr3t")
    cfg = config(tmp, """\
        models:
          - model: ${MODELS}/ft1
            parameters: {weight: 1.0}
        merge_method: ties
        base_model: s3://bucket-${SECRET}/base
        """)
    r = run("combine", "--mergekit", cfg, "--dry-run")
    assert_one_line_error(r, "base_model", str(cfg), "--allow-env SECRET")
    assert "s3cr3t" not in r.stderr
    elsewhere = tmp / "sub"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)  # relative paths: from the config file's folder, not the current one
    cfg.write_text(cfg.read_text().replace("s3://bucket-${SECRET}/base", "models/base"))
    assert cm.from_mergekit(cfg).report().base["path"].endswith("base")


def mk_model_stock_rows(base, xs):
    """mergekit's filter_wise Model Stock: one ratio per row (last axis); a vector as one row."""
    w0 = f64(base).reshape(1, -1) if np.ndim(base) == 1 else f64(base)
    ws = [f64(x).reshape(w0.shape) for x in xs]
    offs = [w - w0 for w in ws]
    cos = []
    for i in range(len(offs)):
        for j in range(i + 1, len(offs)):
            prod = np.maximum(np.linalg.norm(offs[i], axis=-1) * np.linalg.norm(offs[j], axis=-1), 1e-6)
            cos.append(np.clip((offs[i] * offs[j]).sum(-1) / prod, -1, 1))
    c = np.mean(cos, axis=0)[..., None]
    n = len(ws)
    t = n * c / (1 + (n - 1) * c)
    return (t * (sum(ws) / n) + (1 - t) * w0).reshape(np.shape(base))


def test_model_stock_filter_wise_and_linear_without_normalizing(models):
    tmp, base, fts = models
    cfg = config(tmp, """\
        models:
          - model: models/ft1
          - model: models/ft2
          - model: models/ft3
        merge_method: model_stock
        base_model: models/base
        parameters:
          filter_wise: true
        """)
    got = merged(cfg, tmp)
    for name in shapes():
        close(got[name], mk_model_stock_rows(base[name], [fts[f"ft{i}"][name] for i in (1, 2, 3)]))
    cfg = config(tmp, """\
        models:
          - model: models/ft1
            parameters:
              weight: 0.6
          - model: models/ft2
            parameters:
              weight: 0.3
        merge_method: linear
        parameters:
          normalize: false
        """, "linear.yml")
    got = merged(cfg, tmp)
    for name in shapes():
        close(got[name], 0.6 * f64(fts["ft1"][name]) + 0.3 * f64(fts["ft2"][name]))
