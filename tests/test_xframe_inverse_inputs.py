"""The inverse direction's inputs (issue 19, section 3): a hand-written map onto the template's
PyTorch names (API and config), templates given as hand-written specs and as a sharded
``save_pretrained`` folder. Each output is compared bit for bit with the committed PyTorch fixture
it was made from, which PyTorch loads with ``load_state_dict(strict=True)``
(tests/test_xframe_inverse.py checks that in a torch process). Pure: the Keras-side tensors are
the fixture read forward through the torch layout, merged to a Keras-named file; no TensorFlow.
"""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

import _xframe as X
import ckptmerge as cm
from _cli_util import run, write_config
from ckptmerge.alignment.layouts import torch_layout


tensors, assert_same_tensors = X.tensors, X.assert_same_tensors


@pytest.fixture(scope="module")
def keras_side(tmp_path_factory):
    """Per fixture: a Keras-named safetensors file of its tensors (the forward layout's names and
    layouts: kernels ``(in, out)``), and the layout (which PyTorch key each name came from)."""
    d = tmp_path_factory.mktemp("keras-side")
    out = {}
    for name in ("bert", "gpt2", "resnet18"):
        path = d / f"{name}.safetensors"
        cm.merge([cm.Source(X.weights_file(name), layout="torch")], path)
        out[name] = (path, torch_layout(cm.list_variables(X.weights_file(name))))
    return out


def _opaque(keras_side, name):
    """The Keras tensors under names that say nothing (``t0``, ``t1``, ...), and what each is."""
    path, layout = keras_side[name]
    values = tensors(path)
    names = sorted(values)
    return {f"t{i}": values[n] for i, n in enumerate(names)}, {f"t{i}": n for i, n in enumerate(names)}, layout


# -- a map onto the template's names ---------------------------------------------------------------

def test_a_map_onto_pytorch_names_guides_the_inverse_merge(keras_side, tmp_path):
    values, what, layout = _opaque(keras_side, "bert")
    with pytest.raises(cm.PlanError, match="Nothing was written"):  # names that say nothing: unresolved
        cm.merge([cm.Source.from_values(values)], tmp_path / "no-map.safetensors", layout="torch",
                 template=X.weights_file("bert"))
    # half the entries name the PyTorch tensor (its state_dict key), half the layout's name for it
    mapping = {o: layout.entries[n].sources[0] if i % 2 else n for i, (o, n) in enumerate(sorted(what.items()))}
    assert any("." in t for t in mapping.values()) and any("/" in t for t in mapping.values())
    out = tmp_path / "bert.safetensors"
    report = cm.merge([cm.Source.from_values(values, map=mapping)], out, layout="torch",
                      template=X.weights_file("bert"))
    assert_same_tensors(tensors(out), tensors(X.weights_file("bert")))
    assert "matched by structure" not in report.render(limit=None)


def test_a_dotted_scope_in_a_map_stands_for_the_scope_the_layout_writes(keras_side, tmp_path):
    path, _ = keras_side["bert"]
    values = tensors(path)
    # the two layers' tensors under scopes whose numbers say the opposite of the truth
    swapped = {n.replace("encoder/layer/0/", "L1/").replace("encoder/layer/1/", "L0/"): v for n, v in values.items()}
    out = tmp_path / "bert.safetensors"
    mapping = {"L0/": "encoder.layer.1.", "L1/": "encoder.layer.0.", "embeddings/": "embeddings.", "pooler/": "pooler/"}
    cm.merge([cm.Source.from_values(swapped, map=mapping)], out, layout="torch", template=X.weights_file("bert"))
    assert_same_tensors(tensors(out), tensors(X.weights_file("bert")))


def test_a_map_onto_a_fused_pytorch_tensor_names_its_parts(keras_side, tmp_path):
    path, _ = keras_side["gpt2"]
    with pytest.raises(cm.RuleError) as e:
        cm.merge([cm.Source(path, map={"h/0/attn/c_attn/query/kernel": "h.0.attn.c_attn.weight"})],
                 tmp_path / "o.safetensors", layout="torch", template=X.weights_file("gpt2"))
    text = str(e.value)
    assert "'h.0.attn.c_attn.weight' is made of 3 tensors by layout 'torch'" in text
    assert "'h/0/attn/c_attn/key/kernel'" in text and "map one Keras tensor onto each" in text
    assert not (tmp_path / "o.safetensors").exists()


def test_a_config_map_onto_pytorch_names_and_cli_merge_layout_torch(keras_side, tmp_path):
    values, what, layout = _opaque(keras_side, "bert")
    from safetensors.numpy import save_file

    opaque = tmp_path / "opaque.safetensors"
    save_file(values, str(opaque))
    lines = "".join(f"      {o}: {layout.entries[n].sources[0]}\n" for o, n in sorted(what.items()))
    config = write_config(tmp_path / "c.yaml", f"sources:\n  - path: {opaque}\n    map:\n{lines}")
    out = tmp_path / "bert.safetensors"
    result = run("merge", config, "-o", out, "--layout", "torch", "--template", X.weights_file("bert"), "-q")
    assert result.exit_code == 0, result.output
    assert result.stdout.startswith(f"wrote {len(values)} variables from 1 source to")
    assert_same_tensors(tensors(out), tensors(X.weights_file("bert")))


# -- templates: hand-written specs, a sharded save_pretrained folder -----------------------------

def test_a_template_of_hand_written_names_and_specs(keras_side, tmp_path):
    for name in ("bert", "resnet18"):
        want = tensors(X.weights_file(name))
        # what a user writes from a state_dict: {k: (v.shape, v.dtype)}, nothing else
        specs = [cm.VariableInfo(k, tuple(v.shape), str(v.dtype)) for k, v in want.items()]
        out = tmp_path / f"{name}.safetensors"
        cm.merge([cm.Source(keras_side[name][0])], out, layout="torch", template=specs)
        got = tensors(out)
        counters = [k for k in want if k.endswith("num_batches_tracked")]
        assert bool(counters) == (name == "resnet18")
        assert all(got[k].dtype == np.int64 and got[k].shape == () and got[k] == 0 for k in counters)
        assert_same_tensors(got, {k: v if k not in counters else got[k] for k, v in want.items()})


def _sharded(name, folder):
    """The fixture as ``save_pretrained(max_shard_size=...)`` writes it: two shards, their index
    (``model.safetensors.index.json``) and the model's config."""
    from safetensors.numpy import save_file

    want = tensors(X.weights_file(name))
    keys = sorted(want)
    shards = {"model-00001-of-00002.safetensors": keys[:len(keys) // 2],
              "model-00002-of-00002.safetensors": keys[len(keys) // 2:]}
    folder.mkdir()
    for file, ks in shards.items():
        save_file({k: want[k] for k in ks}, str(folder / file), metadata={"format": "pt"})
    index = {"metadata": {"total_size": int(sum(v.nbytes for v in want.values()))},
             "weight_map": {k: file for file, ks in shards.items() for k in ks}}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    shutil.copy(X.fixture_dir(name) + "/config.json", folder / "config.json")
    return want


def test_a_sharded_save_pretrained_folder_serves_as_the_template(keras_side, tmp_path):
    for name in ("bert", "resnet18"):  # (resnet18: num_batches_tracked comes from the shards' own values)
        want = _sharded(name, tmp_path / name)
        out = tmp_path / f"{name}.safetensors"
        cm.merge([cm.Source(keras_side[name][0])], out, layout="torch", template=tmp_path / name)
        assert_same_tensors(tensors(out), want)
    config = write_config(tmp_path / "c.yaml", f"sources:\n  - path: {keras_side['bert'][0]}\n")
    result = run("merge", config, "-o", tmp_path / "cli.safetensors", "--layout", "torch",
                 "--template", tmp_path / "bert", "-q")
    assert result.exit_code == 0, result.output
    assert_same_tensors(tensors(tmp_path / "cli.safetensors"), tensors(X.weights_file("bert")))
