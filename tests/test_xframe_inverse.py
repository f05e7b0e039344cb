"""The inverse direction (issue 19): Keras/KerasHub weights written under a PyTorch template's names,
shapes and layouts (``cm.merge(..., layout="torch", template=...)``), round-tripped bit-exactly
against the committed PyTorch fixtures, loaded by PyTorch itself in a separate process, and the
pure inverse of every layout operation on literal arrays."""

from __future__ import annotations

import json
import subprocess

import numpy as np
import pytest

import _xframe as X
import ckptmerge as cm
from _cli_util import REPO, run, write_config
from _torch import REASON as TORCH_REASON
from _torch import torch_python
from ckptmerge.alignment.inverse import apply_recipe, invert_layout
from ckptmerge.alignment.layouts import apply_entry, torch_layout
from ckptmerge.core.specs import VariableInfo

TORCH_PYTHON = torch_python()

#: Template tensors the Keras side has no counterpart of: ViTBackbone has no classifier head.
NO_COUNTERPART = {"vit": ["classifier.*"]}


def f32(name, *shape):
    return VariableInfo(name, tuple(shape), "float32")


tensors, assert_same_tensors = X.tensors, X.assert_same_tensors


@pytest.fixture(scope="module")
def restored():
    """Each fixture restored into its Keras target with no map (the forward path), by name."""
    pytest.importorskip("keras_hub", reason="keras-hub is in the test extra: pip install -e '.[test]'")
    out = {}
    for name in X.PAIRS:
        model = X.resnet18_twin()[0] if name == "resnet18" else X.fresh_backbone(name)
        cm.plan(model, [cm.Source(X.weights_file(name), layout="torch", align="structure")]).restore()
        out[name] = model
    return out


@pytest.fixture(scope="module")
def written(restored, tmp_path_factory):
    """Each restored model merged back out with layout='torch' and the fixture as the template."""
    d = tmp_path_factory.mktemp("inverse")
    out = {}
    for name, model in restored.items():
        path = str(d / f"{name}.safetensors")
        report = cm.merge([cm.Source.from_values(model)], path, layout="torch", template=X.weights_file(name),
                          allow_missing=NO_COUNTERPART.get(name, ()))
        out[name] = (path, report)
    return out


@pytest.mark.parametrize("name", X.PAIRS)
def test_restore_then_merge_back_gives_the_pytorch_file_bit_for_bit(written, name):
    path, report = written[name]
    assert_same_tensors(tensors(path), tensors(X.weights_file(name)))
    taken = sorted(n for n, _ in report.from_template)
    assert taken == {"vit": ["classifier.bias", "classifier.weight"]}.get(name, [])
    if name == "resnet18":  # PyTorch's BatchNorm counters, which Keras has no variable for
        assert sum("num_batches_tracked" in n for n in taken) == 0
        assert "bookkeeping: the template's own value" in report.plan.report(limit=None)


def test_the_report_names_each_keras_tensor_and_what_was_undone(written):
    text = written["gpt2"][1].render(limit=None)
    line = next(x for x in text.splitlines() if "h.0.attn.c_attn.weight" in x)
    assert "transformer_layer_0/self_attention/query/kernel" in line and "joined along axis 1" in line
    bert = written["bert"][1].render(limit=None)
    line = next(x for x in bert.splitlines() if "encoder.layer.0.attention.self.query.weight <-" in x)
    assert "reshaped (16, 4, 4)->(16, 16)" in line and "transposed (in,out)->(out,in)" in line


def test_a_folder_and_a_list_of_specs_serve_as_templates(restored, tmp_path):
    src = cm.Source.from_values(restored["gpt2"])
    want = tensors(X.weights_file("gpt2"))
    cm.merge([src], tmp_path / "folder.safetensors", layout="torch", template=X.fixture_dir("gpt2"))
    assert_same_tensors(tensors(tmp_path / "folder.safetensors"), want)
    specs = cm.list_variables(X.weights_file("gpt2"))
    cm.merge([src], tmp_path / "specs.safetensors", layout="torch", template=specs)
    assert_same_tensors(tensors(tmp_path / "specs.safetensors"), want)


def test_bookkeeping_is_zero_with_a_template_of_specs(restored, tmp_path):
    out = tmp_path / "r.safetensors"
    cm.merge([cm.Source.from_values(restored["resnet18"])], out, layout="torch",
             template=cm.list_variables(X.weights_file("resnet18")))
    got, want = tensors(out), tensors(X.weights_file("resnet18"))
    assert sorted(got) == sorted(want)
    counters = [k for k in want if k.endswith("num_batches_tracked")]
    assert counters and all(got[k].dtype == np.int64 and got[k] == 0 for k in counters)
    assert_same_tensors({k: v for k, v in got.items() if k not in counters},
                        {k: v for k, v in want.items() if k not in counters})


def test_unresolved_template_tensors_block_the_merge_and_say_why(restored, tmp_path):
    out = tmp_path / "vit.safetensors"
    with pytest.raises(cm.PlanError) as e:
        cm.merge([cm.Source.from_values(restored["vit"])], out, layout="torch", template=X.weights_file("vit"))
    text = str(e.value)
    assert "'classifier.weight': no Keras tensor was aligned with it (as classifier/kernel)" in text
    assert "allow_missing" in text and "Nothing was written" in text
    assert not out.exists()


def test_allowed_unresolved_tensors_are_left_out_of_a_specs_template(restored, tmp_path):
    out = tmp_path / "vit.safetensors"
    report = cm.merge([cm.Source.from_values(restored["vit"])], out, layout="torch",
                      template=cm.list_variables(X.weights_file("vit")), allow_missing=["classifier.*"])
    assert [n for n, _ in report.skipped] == ["classifier.bias", "classifier.weight"]
    assert "no Keras tensor was aligned" in report.skipped[0][1]
    assert "classifier.weight" not in tensors(out)


def test_layout_torch_needs_a_template_and_a_safetensors_output(tmp_path):
    with pytest.raises(cm.ArgumentError, match="needs the model's state_dict as the template"):
        cm.merge([{"w": np.zeros(2)}], tmp_path / "o.safetensors", layout="torch")
    with pytest.raises(cm.ArgumentError, match="writes a .safetensors file"):
        cm.merge([{"w": np.zeros(2)}], tmp_path / "o", layout="torch", template=[f32("w", 2)])
    with pytest.raises(cm.ArgumentError, match="Did you mean 'torch'"):
        cm.merge([{"w": np.zeros(2)}], tmp_path / "o.safetensors", layout="pytorch", template=[f32("w", 2)])


def test_cli_merge_layout_torch_writes_the_template_names(restored, tmp_path):
    keras_file = tmp_path / "keras.safetensors"  # the Keras weights under their variable paths
    cm.merge([cm.Source.from_values(restored["gpt2"])], keras_file)
    config = write_config(tmp_path / "c.yaml", f"sources:\n  - path: {keras_file}\n")
    out = tmp_path / "torch.safetensors"
    result = run("merge", config, "-o", out, "--layout", "torch", "--template", X.weights_file("gpt2"), "-q")
    assert result.exit_code == 0, result.output
    assert result.stdout.startswith("wrote 28 variables from 1 source to")
    assert_same_tensors(tensors(out), tensors(X.weights_file("gpt2")))
    vit = tmp_path / "vit-keras.safetensors"
    cm.merge([cm.Source.from_values(restored["vit"])], vit)
    config = write_config(tmp_path / "v.yaml", f"sources:\n  - path: {vit}\n")
    blocked = run("merge", config, "-o", tmp_path / "v.safetensors", "--layout", "torch",
                  "--template", X.weights_file("vit"))
    assert blocked.exit_code == 1 and "'classifier.bias': no Keras tensor was aligned" in blocked.stderr
    allowed = run("merge", config, "-o", tmp_path / "v.safetensors", "--layout", "torch",
                  "--template", X.weights_file("vit"), "--allow-missing", "classifier.*", "-q")
    assert allowed.exit_code == 0, allowed.output
    assert "(2 from the template)" in allowed.stdout


@pytest.mark.skipif(not TORCH_PYTHON, reason=TORCH_REASON)
def test_pytorch_loads_every_output_strictly_in_its_own_process(written, tmp_path):
    args = [f"{name}={X.fixture_dir(name)}={path}" for name, (path, _) in written.items()]
    # and BERT under KerasHub-like names, written through regex rules onto PyTorch's names
    # (tests/test_xframe_inverse_regex.py)
    keras = tmp_path / "keras.safetensors"
    cm.merge([cm.Source(X.weights_file("bert"), layout="torch")], keras)
    cm.merge([cm.Source.from_values(X.keras_hub_named(tensors(keras)), regex=X.BERT_REGEX)],
             tmp_path / "regex.safetensors", layout="torch", template=X.weights_file("bert"))
    args.append(f"bert-regex={X.fixture_dir('bert')}={tmp_path / 'regex.safetensors'}")
    proc = subprocess.run([TORCH_PYTHON, str(REPO / "scripts" / "torch_load_check.py"), *args],
                          capture_output=True, text=True, timeout=300, check=False)
    rows = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    assert proc.returncode == 0, (proc.stdout, proc.stderr[-2000:])
    assert sorted(r["name"] for r in rows) == sorted([*X.PAIRS, "bert-regex"])
    assert all(r["equal"] and not r["missing"] and not r["unexpected"] for r in rows), rows


# -- the pure inverse, on literal arrays ------------------------------------------------------------

def _round_trip(template, keras_names=None):
    """Forward each template tensor through the layout, then back: the same arrays."""
    rng = np.random.default_rng(0)
    raw = {t.name: rng.standard_normal(t.shape).astype(np.float32) for t in template}
    lay = torch_layout(template)
    mapping = {n: keras_names.get(n, "k/" + n) if keras_names else "k/" + n for n in lay.entries}
    keras = {mapping[n]: apply_entry(e, [raw[k] for k in e.sources]) for n, e in lay.entries.items()}
    recipes, missing = invert_layout(lay, template, mapping, {n: v.shape for n, v in keras.items()})
    back = {k: apply_recipe(r, [keras[p.name] for p in r.pieces]) for k, r in recipes.items()}
    return raw, back, missing


def test_every_invertible_layout_op_round_trips_exactly():
    template = [f32("fc.weight", 3, 5), f32("fc.bias", 3), f32("conv.weight", 8, 4, 3, 2),
                f32("dw.depthwise.weight", 6, 1, 3, 3), f32("emb.embed_tokens.weight", 7, 4),
                f32("ln.weight", 4), f32("ln.bias", 4),
                f32("attn.c_attn.weight", 4, 12), f32("attn.c_attn.bias", 12),
                f32("blk.qkv.weight", 12, 4), f32("blk.qkv.bias", 12),
                f32("gru.weight_ih_l0", 9, 5), f32("gru.weight_hh_l0", 9, 3), f32("gru.bias_ih_l0", 9),
                f32("gru.bias_hh_l0", 9), f32("lstm.weight_ih_l0", 8, 5), f32("lstm.weight_hh_l0", 8, 2)]
    raw, back, missing = _round_trip(template)
    assert missing == []
    assert sorted(back) == sorted(raw)
    for k in raw:
        np.testing.assert_array_equal(back[k], raw[k], err_msg=k)


def test_a_reshaped_keras_tensor_is_reshaped_back():
    template = [f32("q.weight", 8, 8), f32("q.bias", 8)]
    lay = torch_layout(template)
    w = np.arange(64.0, dtype=np.float32).reshape(8, 8)
    kernel = apply_entry(lay.entries["q/kernel"], [w]).reshape(8, 2, 4)  # EinsumDense (hidden, heads, head_dim)
    recipes, _ = invert_layout(lay, template, {"q/kernel": "att/query/kernel", "q/bias": "att/query/bias"},
                               {"att/query/kernel": (8, 2, 4), "att/query/bias": (2, 4)})
    np.testing.assert_array_equal(apply_recipe(recipes["q.weight"], [kernel]), w)
    assert recipes["q.weight"].note == "'att/query/kernel' (8, 2, 4): reshaped (8, 2, 4)->(8, 8), transposed (in,out)->(out,in)"


def test_summed_lstm_biases_and_undecided_weights_stay_unresolved():
    template = [f32("lstm.weight_ih_l0", 8, 5), f32("lstm.weight_hh_l0", 8, 2), f32("lstm.bias_ih_l0", 8),
                f32("lstm.bias_hh_l0", 8), f32("table.weight", 4, 4)]  # no bias, no telling name: Linear or Embedding?
    _, back, missing = _round_trip(template)
    why = dict(missing)
    assert sorted(why) == ["lstm.bias_hh_l0", "lstm.bias_ih_l0", "table.weight"]
    assert "cannot be told apart" in why["lstm.bias_ih_l0"]
    assert "a Linear needs transposing" in why["table.weight"]
    assert sorted(back) == ["lstm.weight_hh_l0", "lstm.weight_ih_l0"]


def test_a_fused_tensor_needs_all_its_parts():
    template = [f32("attn.c_attn.weight", 4, 12), f32("attn.c_attn.bias", 12)]
    lay = torch_layout(template)
    mapping = {n: "k/" + n for n in lay.entries if "value" not in n}
    recipes, missing = invert_layout(lay, template, mapping, {v: (4, 4) if v.endswith("kernel") else (4,)
                                                              for v in mapping.values()})
    assert recipes == {}
    assert dict(missing)["attn.c_attn.weight"] == "no Keras tensor was aligned with it (as attn/c_attn/value/kernel)"


# -- the speed pieces the layout and the planner rest on --------------------------------------------

def test_tiled_transposes_equal_numpy_for_any_shape():
    from ckptmerge.alignment.layouts import transpose_into

    rng = np.random.default_rng(1)
    for shape in ((300, 130), (64, 64), (5, 7), (1, 4096)):
        x = rng.standard_normal(shape).astype(np.float32)
        np.testing.assert_array_equal(transpose_into(x, (1, 0)), x.T)
    x = rng.standard_normal((4, 3, 2, 2)).astype(np.float32)
    out = np.empty((2, 2, 3, 4), np.float32)
    assert transpose_into(x, (2, 3, 1, 0), out) is out
    np.testing.assert_array_equal(out, np.transpose(x, (2, 3, 1, 0)))


def test_the_transform_index_selects_what_select_does():
    from ckptmerge.alignment.tensorops import Reshape, glob_escape
    from ckptmerge.planning.transforms import Slice
    from ckptmerge.planning.chains import TransformIndex, literal_glob, select

    ts = [Reshape(glob_escape("a[0]/k*"), (2, 2)), Slice("head/*", 0), Reshape("enc/q"), Slice("enc/q", 1),
          Reshape("x[ab]")]
    index = TransformIndex(ts)
    for name in ("a[0]/k*", "a0/kx", "head/b", "enc/q", "xa", "xb", "x[ab]", "other"):
        assert index.select(name) == select(ts, name), name
    assert literal_glob("x[ab]") is None and literal_glob("a[[]0]") == "a[0]"
