"""Regex rules in the inverse direction (issue 19, section 3): a source's ``regex`` rewrites its
Keras names into the template's, in PyTorch's spelling (``encoder.layer.0.attention.self.query.weight``),
in the layout's (``encoder/layer/0/attention/self/query/kernel``) or as a dotted scope with the
layout's path below it, with the semantics of the forward direction: a conflict and a mismatch are
reported before anything is written, a name the template does not have fails with "did you mean",
and nothing is transposed to fit. API, config file and CLI; each output is compared bit for bit with
the committed PyTorch fixture (tests/test_xframe_inverse.py has PyTorch load one with
``load_state_dict(strict=True)`` in its own process). Pure otherwise: the Keras side is the fixture
read forward through the torch layout.
"""

from __future__ import annotations

import json
import re

import numpy as np
import pytest

import _xframe as X
import ckptmerge as cm
from _cli_util import run, write_config

tensors, assert_same_tensors = X.tensors, X.assert_same_tensors

RULES = X.BERT_REGEX


@pytest.fixture(scope="module")
def keras_side(tmp_path_factory):
    """The BERT and GPT-2 fixtures' tensors under Keras names (kernels ``(in, out)``)."""
    d = tmp_path_factory.mktemp("keras-side")
    out = {}
    for name in ("bert", "gpt2"):
        path = d / f"{name}.safetensors"
        cm.merge([cm.Source(X.weights_file(name), layout="torch")], path)
        out[name] = tensors(path)
    out["keras_hub"] = X.keras_hub_named(out["bert"])
    return out


def _merge(values, out, **kw):
    return cm.merge([cm.Source.from_values(values, regex=kw.pop("regex", None), **kw.pop("rules", {}))], out,
                    layout="torch", template=X.weights_file("bert"), **kw)


def _swapped(keras_side):
    """BERT's two layers under scopes whose numbers say the opposite of the truth."""
    return {n.replace("encoder/layer/0/", "L1/").replace("encoder/layer/1/", "L0/"): v
            for n, v in keras_side["bert"].items()}


# -- what a regex makes of a name is read as the template's -----------------------------------------

def test_regex_onto_the_template_in_every_spelling_gives_the_pytorch_file(keras_side, tmp_path):
    out = tmp_path / "bert.safetensors"
    report = _merge(keras_side["keras_hub"], out, regex=RULES)
    assert_same_tensors(tensors(out), tensors(X.weights_file("bert")))
    text = report.render(limit=None)
    assert "matched by structure" not in text  # every tensor paired by the name its rule gave it
    line = next(x for x in text.splitlines() if x.startswith("  encoder.layer.1.attention.self.query.weight <-"))
    assert ("is memory:'transformer_layer_1/self_attention/query/kernel' by regex "
            "'transformer_layer_(\\d+)/self_attention/(query|key|value)/kernel'") in line
    assert "transposed (in,out)->(out,in)" in line


def test_a_dotted_scope_regex_undoes_a_swap_that_the_names_hide(keras_side, tmp_path):
    # (the regex's 'encoder.layer.1.attention/output/LayerNorm/gamma' was left to alignment, which
    # swapped each layer's two LayerNorms: 8 wrong tensors, written without a word)
    rules = [(r"L0/(.*)", r"encoder.layer.1.\1"), (r"L1/(.*)", r"encoder.layer.0.\1"),
             (r"(embeddings|pooler)/(.*)", r"\1/\2")]
    out = tmp_path / "bert.safetensors"
    report = _merge(_swapped(keras_side), out, regex=rules)
    assert_same_tensors(tensors(out), tensors(X.weights_file("bert")))
    assert "matched by structure" not in report.render(limit=None)


def test_a_misspelled_template_name_fails_with_did_you_mean(keras_side, tmp_path):
    out = tmp_path / "o.safetensors"
    slash = [(r"L0/(.*)/kernel", r"encoder/layer/1/\1/weight"),
             (r"L0/(.*)/(bias|beta|gamma)", r"encoder/layer/1/\1/\2"),
             (r"L1/(.*)", r"encoder/layer/0/\1"), (r"(embeddings|pooler)/(.*)", r"\1/\2")]
    with pytest.raises(cm.RuleError) as e:
        _merge(_swapped(keras_side), out, regex=slash)
    text = str(e.value)
    assert text.startswith("6 rule targets name the template wrongly")  # every kernel of layer 1, at once
    assert ("regex 'L0/(.*)/kernel' -> 'encoder/layer/1/\\1/weight' in source 'memory' makes "
            "'encoder/layer/1/attention/self/query/weight' of 'L0/attention/self/query/kernel': spells the template's "
            "'encoder.layer.1.attention.self.query.weight' with '/', but layout 'torch' names that tensor "
            "'encoder/layer/1/attention/self/query/kernel'. Did you mean 'encoder/layer/1/attention/self/query/kernel' "
            "or 'encoder.layer.1.attention.self.query.weight'?") in text
    # (the typo is reported before the two rules' disagreement over that name is)
    typo = [(r"L0/attention/self/query/kernel", "encoder.layer.1.attention.self.quary.weight"),
            (r"L0/(.*)", r"encoder/layer/1/\1"), (r"L1/(.*)", r"encoder/layer/0/\1"),
            (r"(embeddings|pooler)/(.*)", r"\1/\2")]
    with pytest.raises(cm.RuleError, match=re.escape(
            "makes 'encoder.layer.1.attention.self.quary.weight' of 'L0/attention/self/query/kernel': names no tensor "
            "of the template. Did you mean 'encoder.layer.1.attention.self.query.weight'")):
        _merge(_swapped(keras_side), out, regex=typo)
    assert not out.exists()


def test_two_names_onto_one_template_tensor_are_a_conflict_before_writing(keras_side, tmp_path):
    out = tmp_path / "o.safetensors"
    # layer 1's and layer 0's query kernels both onto layer 1's, in two spellings of one name
    rules = [(r"L0/attention/self/query/kernel", "encoder.layer.1.attention.self.query.weight"),
             (r"L1/attention/self/query/kernel", "encoder/layer/1/attention/self/query/kernel"),
             (r"L0/(attention/(output|self/(key|value))|intermediate|output)/(.*)", r"encoder/layer/1/\1/\4"),
             (r"L0/attention/self/query/bias", "encoder.layer.1.attention.self.query.bias"),
             (r"L1/(attention/(output|self/(key|value))|intermediate|output)/(.*)", r"encoder/layer/0/\1/\4"),
             (r"L1/attention/self/query/bias", "encoder.layer.0.attention.self.query.bias"),
             (r"(embeddings|pooler)/(.*)", r"\1/\2")]
    with pytest.raises(cm.PlanError) as e:
        _merge(_swapped(keras_side), out, regex=rules)
    assert ("conflict: target 'encoder/layer/1/attention/self/query/kernel' is provided by "
            "memory:'L0/attention/self/query/kernel' and memory:'L1/attention/self/query/kernel'") in str(e.value)
    assert "Nothing was written" in str(e.value) and not out.exists()


def test_a_regex_target_of_the_wrong_shape_is_a_mismatch_not_a_transpose(keras_side, tmp_path):
    values = dict(keras_side["keras_hub"])
    name = "transformer_layer_1/feedforward_intermediate_dense/kernel"
    values[name] = values[name].T.copy()  # (40, 16): PyTorch's layout, where the Keras kernel is (16, 40)
    out = tmp_path / "o.safetensors"
    with pytest.raises(cm.PlanError) as e:
        _merge(values, out, regex=RULES)
    text = str(e.value)
    assert text.startswith("1 template tensor with a Keras tensor of another shape or dtype named for it")
    assert (f"'encoder.layer.1.intermediate.dense.weight': shape mismatch: memory:'{name}' (named "
            "'encoder/layer/1/intermediate/dense/kernel' by regex "
            "'transformer_layer_(\\d+)/feedforward_intermediate_dense/(.*)' -> "
            "'encoder.layer.\\1.intermediate.dense/\\2') is (40, 16) float32; layout 'torch' makes PyTorch's "
            "'encoder.layer.1.intermediate.dense.weight' (40, 16) of a Keras 'encoder/layer/1/intermediate/dense/kernel' "
            "(16, 40) float32 (its layout: transposed "
            "(out,in)->(in,out)). It is not transposed or reshaped to fit") in text
    assert not out.exists()
    # skipped: left as the template has it (and said so); no other tensor is aligned into its place
    report = _merge(values, out, regex=RULES, on_shape_mismatch="skip")
    want = tensors(X.weights_file("bert"))
    assert_same_tensors(tensors(out), want)
    (taken, why), = report.from_template
    assert taken == "encoder.layer.1.intermediate.dense.weight" and why.startswith("shape mismatch: memory:")


def test_a_regex_onto_a_fused_pytorch_tensor_names_its_parts(keras_side, tmp_path):
    rules = [(r"h/(\d+)/attn/c_attn/query/kernel", r"h.\1.attn.c_attn.weight"), (r"(.*)", r"\1")]
    with pytest.raises(cm.RuleError) as e:
        cm.merge([cm.Source.from_values(keras_side["gpt2"], regex=rules)], tmp_path / "o.safetensors",
                 layout="torch", template=X.weights_file("gpt2"))
    assert ("makes 'h.0.attn.c_attn.weight' of 'h/0/attn/c_attn/query/kernel': the template's 'h.0.attn.c_attn.weight' "
            "is made of 3 tensors by layout 'torch' ('h/0/attn/c_attn/key/kernel', 'h/0/attn/c_attn/query/kernel', "
            "'h/0/attn/c_attn/value/kernel'); map one Keras tensor onto each of those names instead") in str(e.value)
    assert not (tmp_path / "o.safetensors").exists()


def test_include_and_exclude_select_the_sources_own_names(keras_side, tmp_path):
    out = tmp_path / "o.safetensors"
    # an exclude leaves the template tensor unresolved: never filled from another tensor of its size
    with pytest.raises(cm.PlanError) as e:
        _merge(keras_side["keras_hub"], out, regex=RULES,
               rules={"exclude": ["transformer_layer_1/self_attention/query/kernel"]})
    assert ("'encoder.layer.1.attention.self.query.weight': no Keras tensor was aligned with it (as "
            "encoder/layer/1/attention/self/query/kernel); no Keras tensor of its size is left") in str(e.value)
    # an include written with the template's names selects nothing of the source, and says why
    with pytest.raises(cm.PlanError) as e:
        _merge(keras_side["keras_hub"], out, regex=RULES, rules={"include": ["encoder.layer.*"]})
    assert ("include 'encoder.layer.*' in source 'memory' matched no checkpoint variable; it matches 32 names of the "
            "template (e.g. 'encoder.layer.0.attention.output.LayerNorm.bias'), but include and exclude select the "
            "sources' own tensors (the Keras side)") in str(e.value)
    assert not out.exists()


def test_allow_missing_names_the_template_in_either_spelling(keras_side, tmp_path):
    values = {n: v for n, v in keras_side["keras_hub"].items() if not n.startswith("pooled_dense/")}
    rules = [r for r in RULES if not r[0].startswith("pooled_dense/")]
    for glob in ("pooler.*", "pooler/*"):  # PyTorch's names, and the layout's converted ones
        out = tmp_path / f"{'dotted' if '.' in glob else 'converted'}.safetensors"
        report = _merge(values, out, regex=rules, allow_missing=[glob])
        assert sorted(n for n, _ in report.from_template) == ["pooler.dense.bias", "pooler.dense.weight"]
        assert_same_tensors(tensors(out), tensors(X.weights_file("bert")))


# -- a config file's regex and the CLI ---------------------------------------------------------------

def _config(tmp_path, values, rules):
    from safetensors.numpy import save_file

    src = tmp_path / "keras.safetensors"
    save_file(values, str(src))
    lines = "".join(f"      - [{json.dumps(p)}, {json.dumps(r)}]\n" for p, r in rules)
    return write_config(tmp_path / "c.yaml", f"sources:\n  - path: {src}\n    regex:\n{lines}")


def test_a_config_regex_and_cli_merge_layout_torch(keras_side, tmp_path):
    config = _config(tmp_path, keras_side["keras_hub"], RULES)
    out = tmp_path / "bert.safetensors"
    result = run("merge", config, "-o", out, "--layout", "torch", "--template", X.weights_file("bert"), "-q")
    assert result.exit_code == 0, result.output
    assert result.stdout.startswith("wrote 39 variables from 1 source to")
    assert_same_tensors(tensors(out), tensors(X.weights_file("bert")))


def test_cli_errors_of_a_config_regex(keras_side, tmp_path):
    misspelled = [(p, r.replace(".weight", "/weight")) for p, r in RULES]
    config = _config(tmp_path, keras_side["keras_hub"], misspelled)
    out = tmp_path / "bert.safetensors"
    result = run("merge", config, "-o", out, "--layout", "torch", "--template", X.weights_file("bert"))
    assert result.exit_code == 2, result.output
    assert result.stderr.startswith("Error: 11 rule targets name the template wrongly")
    assert "Traceback" not in result.stderr and result.stdout == ""
    assert ("spells the template's 'embeddings.word_embeddings.weight' with '/', but layout 'torch' names that tensor "
            "'embeddings/word_embeddings/embeddings'. Did you mean 'embeddings/word_embeddings/embeddings' or "
            "'embeddings.word_embeddings.weight'?") in result.stderr
    values = dict(keras_side["keras_hub"])
    values["pooled_dense/kernel"] = np.zeros((16, 8), np.float32)
    config = _config(tmp_path, values, RULES)
    result = run("merge", config, "-o", out, "--layout", "torch", "--template", X.weights_file("bert"))
    assert result.exit_code == 1, result.output
    assert "'pooler.dense.weight': shape mismatch: " in result.stderr and "Nothing was written" in result.stderr
    assert not out.exists()
    # the tensor left out (in the layout's spelling): the template's own value, exit 0
    config = _config(tmp_path, {n: v for n, v in values.items() if n != "pooled_dense/kernel"},
                     [r for r in RULES if r[0] != "pooled_dense/kernel"])
    result = run("merge", config, "-o", out, "--layout", "torch", "--template", X.weights_file("bert"),
                 "--allow-missing", "pooler/dense/kernel", "-q")
    assert result.exit_code == 0, result.output
    assert "(1 from the template)" in result.stdout
    assert_same_tensors(tensors(out), tensors(X.weights_file("bert")))
