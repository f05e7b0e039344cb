"""Load ckptmerge's inverse-direction outputs into the real PyTorch models, strictly (issue 19).

Runs in the torch venv, in its own process (torch and TensorFlow imported into one process
segfault with the default wheels); tests/test_xframe_inverse.py calls it.

    /work/venvs/torch/bin/python scripts/torch_load_check.py NAME=FIXTURE_DIR=OUT.safetensors ...

For each triple it builds the fixture's PyTorch model (the Hugging Face class named by
``config.json``'s ``architectures``, or torchvision's ResNet-18 as scripts/make_xframe_fixtures.py
narrows it), calls ``load_state_dict(load_file(OUT), strict=True)``, and checks that every tensor
PyTorch now holds equals the fixture's own ``model.safetensors`` bit for bit. Where transformers
renames an architecture's keys on load, so that not even the fixture's own file loads by name
(ViT in transformers v5), it loads OUT with ``from_pretrained`` instead and compares with the
fixture loaded the same way. It prints one JSON line per model: ``{"name", "missing",
"unexpected", "equal", "via"}``, and exits 1 if any fails.
"""

from __future__ import annotations

import json
import os
import shutil
import sys

import torch
from safetensors.torch import load_file

HERE = os.path.dirname(os.path.abspath(__file__))


def build(fixture_dir: str) -> torch.nn.Module:
    with open(os.path.join(fixture_dir, "config.json")) as f:
        config = json.load(f)
    if config.get("architecture") == "torchvision.models.resnet18":
        sys.path.insert(0, HERE)
        from make_xframe_fixtures import narrow_resnet18

        return narrow_resnet18(config["width_divisor"], config["num_classes"])
    import transformers

    cfg = transformers.AutoConfig.from_pretrained(fixture_dir)
    return getattr(transformers, cfg.architectures[0])(cfg)


def _equal(a: dict, b: dict) -> bool:
    return sorted(a) == sorted(b) and all(a[k].dtype == b[k].dtype and torch.equal(a[k], b[k]) for k in a)


def _from_pretrained(fixture_dir: str, out: str) -> dict:
    """Load OUT as the folder's weights with ``from_pretrained``: transformers v5 renames some
    architectures' keys on load (ViT's ``encoder.layer.N.attention.attention.query`` becomes
    ``layers.N.attention.q_proj``), so their files never match ``state_dict()`` by name."""
    import tempfile

    import transformers

    cls = getattr(transformers, transformers.AutoConfig.from_pretrained(fixture_dir).architectures[0])
    with tempfile.TemporaryDirectory() as d:
        shutil.copy(os.path.join(fixture_dir, "config.json"), d)
        shutil.copy(out, os.path.join(d, "model.safetensors"))
        model, info = cls.from_pretrained(d, output_loading_info=True)
    original = cls.from_pretrained(fixture_dir)
    return {"missing": list(info["missing_keys"]), "unexpected": list(info["unexpected_keys"]) +
            [str(m) for m in info.get("mismatched_keys", [])],
            "equal": _equal(model.state_dict(), original.state_dict()), "via": "from_pretrained"}


def check(name: str, fixture_dir: str, out: str) -> dict:
    model = build(fixture_dir).eval()
    original = load_file(os.path.join(fixture_dir, "model.safetensors"))
    try:
        build(fixture_dir).load_state_dict(original, strict=True)
    except RuntimeError:  # the original file does not load by name either: transformers renames on load
        return {"name": name, **_from_pretrained(fixture_dir, out)}
    result = model.load_state_dict(load_file(out), strict=True)
    state = model.state_dict()
    equal = all(k in state and state[k].dtype == v.dtype and torch.equal(state[k], v) for k, v in original.items())
    return {"name": name, "missing": list(result.missing_keys), "unexpected": list(result.unexpected_keys),
            "equal": bool(equal), "via": "load_state_dict(strict=True)"}


def main(argv: list) -> int:
    ok = True
    for arg in argv:
        name, fixture_dir, out = arg.split("=", 2)
        try:
            row = check(name, fixture_dir, out)
        except Exception as e:  # strict=True raises RuntimeError listing missing/unexpected keys
            row = {"name": name, "error": f"{type(e).__name__}: {e}"}
        ok = ok and "error" not in row and row["equal"] and not row["missing"] and not row["unexpected"]
        print(json.dumps(row), flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
