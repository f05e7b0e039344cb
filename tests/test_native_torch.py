"""PyTorch outputs load with PyTorch's own loaders (issue 33): ``layout="torch"`` merges onto a
Hugging Face ``save_pretrained`` folder's names load with ``load_state_dict(strict=True)``, and the
output folder (its ``config.json`` copied from the template's) with ``from_pretrained``.

The Keras side is each committed fixture read forward through the torch layout (no TensorFlow);
torch runs in its own process (tests/_torch.py), and those tests skip without it.
"""

from __future__ import annotations

import json
import os
import subprocess
import textwrap

import pytest

import _xframe as X
import ckptmerge as cm
from ckptmerge.core.errors import OutputExistsError
from _cli_util import run, write_config
from _torch import REASON, torch_python

TORCH_PYTHON = torch_python()

LOAD = textwrap.dedent('''
    import json, sys
    import torch, transformers
    from safetensors.torch import load_file
    for pair in sys.argv[1:]:
        fixture, folder = pair.split("=")
        cls = getattr(transformers, transformers.AutoConfig.from_pretrained(folder).architectures[0])
        model, info = cls.from_pretrained(folder, output_loading_info=True)
        original = cls.from_pretrained(fixture)
        a, b = model.state_dict(), original.state_dict()
        equal = sorted(a) == sorted(b) and all(torch.equal(a[k], b[k]) for k in a)
        strict = cls(transformers.AutoConfig.from_pretrained(fixture)).load_state_dict(
            load_file(folder + "/model.safetensors"), strict=True)
        print(json.dumps({"folder": folder, "missing": list(info["missing_keys"]),
                          "unexpected": list(info["unexpected_keys"]),
                          "mismatched": [str(m) for m in info.get("mismatched_keys", [])], "equal": equal,
                          "strict_missing": list(strict.missing_keys),
                          "strict_unexpected": list(strict.unexpected_keys)}))
''')


@pytest.fixture(scope="module")
def keras_side(tmp_path_factory):
    """Each fixture's tensors under the forward layout's (Keras) names, as a safetensors file."""
    d = tmp_path_factory.mktemp("keras")
    out = {}
    for name in ("bert", "gpt2"):
        out[name] = d / f"{name}.safetensors"
        cm.merge([cm.Source(X.weights_file(name), layout="torch")], out[name])
    return out


def test_output_folders_have_the_config_and_load_with_from_pretrained(keras_side, tmp_path):
    folders = []
    for name in ("bert", "gpt2"):  # the API
        out = tmp_path / name / "model.safetensors"
        report = cm.merge([keras_side[name]], out, layout="torch", template=X.fixture_dir(name))
        with open(os.path.join(X.fixture_dir(name), "config.json"), "rb") as f:
            assert (tmp_path / name / "config.json").read_bytes() == f.read()
        assert any("Copied config.json" in n for n in report.notes), report.notes
        assert "Note: Copied config.json" in report.render()
        folders.append((X.fixture_dir(name), out.parent))
    cfg = write_config(tmp_path / "m.yaml", f"sources:\n  - path: {keras_side['bert']}\n")  # the CLI
    result = run("merge", cfg, "-o", tmp_path / "cli" / "model.safetensors", "--layout", "torch",
                 "--template", X.fixture_dir("bert"))
    assert result.exit_code == 0, result.output
    assert "Note: Copied config.json" in result.stdout
    folders.append((X.fixture_dir("bert"), tmp_path / "cli"))
    if not TORCH_PYTHON:
        pytest.skip(REASON)
    proc = subprocess.run([TORCH_PYTHON, "-c", LOAD, *[f"{a}={b}" for a, b in folders]], capture_output=True,
                          text=True, timeout=600, check=False)  # (one torch process for all of them)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    assert len(rows) == len(folders)
    for row in rows:
        assert row.pop("folder") and row == {"missing": [], "unexpected": [], "mismatched": [], "equal": True,
                                              "strict_missing": [], "strict_unexpected": []}, row


def test_another_name_gets_a_note_and_no_config(keras_side, tmp_path):
    out = tmp_path / "o" / "bert-weights.safetensors"
    report = cm.merge([keras_side["bert"]], out, layout="torch", template=X.fixture_dir("bert"))
    assert not (tmp_path / "o" / "config.json").exists()
    assert any("'<folder>/model.safetensors'" in n for n in report.notes), report.notes


def test_a_different_config_in_the_output_folder_is_refused_before_writing(keras_side, tmp_path):
    (tmp_path / "hf").mkdir()
    (tmp_path / "hf" / "config.json").write_text('{"model_type": "other"}', encoding="utf-8")
    out = tmp_path / "hf" / "model.safetensors"
    with pytest.raises(OutputExistsError, match="another config.json"):
        cm.merge([keras_side["bert"]], out, layout="torch", template=X.fixture_dir("bert"))
    assert sorted(os.listdir(tmp_path / "hf")) == ["config.json"]
    cm.merge([keras_side["bert"]], out, layout="torch", template=X.fixture_dir("bert"), overwrite=True)
    assert json.loads((tmp_path / "hf" / "config.json").read_text())["model_type"] == "bert"
    again = cm.merge([keras_side["bert"]], out, layout="torch", template=X.fixture_dir("bert"), overwrite=True)
    assert not any("Copied" in n for n in again.notes)  # the same bytes are there already
