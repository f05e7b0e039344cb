"""The conformance matrix (issue 32): every converter the installed KerasHub ships, as a test case.

For each architecture KerasHub converts from a Hugging Face folder (``keras_hub/src/utils/
transformers/convert_*.py``, dispatched by ``model_type``) or from timm (``utils/timm/``,
dispatched by the architecture's name), the matrix:

1. builds a tiny model in the torch venv (a subprocess: torch and TensorFlow cannot share a
   process) from the library's own config class, shrunk (hidden 32, 2 layers, 4 heads, ...), with
   every floating tensor drawn at random by a fixed seed (norm scales around 1, biases, BatchNorm
   statistics), so that a swapped tensor shows, and saves it with ``save_pretrained`` (timm:
   ``save_for_hf``) to a temporary folder;
2. in this environment, builds KerasHub's backbone from that folder's config, sets every float
   variable to NaN, and runs KerasHub's own converter (``convert_weights``): the variables it
   fills, with the values it gives them, are the ground truth; those it leaves NaN are not targets;
3. builds the same backbone afresh and restores it with ckptmerge and no map
   (``cm.Source(weights, layout="torch", align="structure")``, ``strict=False``), and compares
   every assigned variable with the converter's value bit for bit.

Per architecture it records the targets, assigned, **wrong** (an assigned value that differs
from the converter's, or a variable the converter leaves alone), the unresolved targets with
ckptmerge's reasons, the largest output difference between the two backbones on the same
inputs, and the wall time of ckptmerge's plan + restore against the converter's. An architecture
whose tiny model cannot be built (or whose converter fails on it) is a row with the reason.

Nothing is listed by hand: the converters are read from the installed keras-hub, so the
architectures a keras-hub upgrade brings appear in the matrix by themselves.

Run (from the checkout; the torch venv as for scripts/make_xframe_fixtures.py)::

    python scripts/conformance.py [--torch-python /work/venvs/torch/bin/python] [--only bert,gpt2]

It writes ``docs/conformance.json`` (the data tests/test_conformance.py reads) and
``docs/conformance.md`` (the page, rendered from the JSON: ``--render`` redoes only that).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

REPO = Path(__file__).resolve().parents[1]
JSON_PATH = REPO / "docs" / "conformance.json"
PAGE_PATH = REPO / "docs" / "conformance.md"
SEED = 32
ROW_TIMEOUT = 900

# -- the tiny configs (torch side) ------------------------------------------------------------

#: config attribute -> its tiny value, applied wherever a config (or a sub-config) has it as an int.
TINY = {
    "hidden_size": 32, "d_model": 32, "dim": 32, "n_embd": 32, "num_hidden_layers": 2, "n_layer": 2,
    "n_layers": 2, "encoder_layers": 2, "decoder_layers": 2, "num_attention_heads": 4, "n_head": 4,
    "n_heads": 4, "encoder_attention_heads": 4, "decoder_attention_heads": 4, "num_key_value_heads": 2,
    "head_dim": 8, "intermediate_size": 64, "hidden_dim": 64, "encoder_ffn_dim": 64, "decoder_ffn_dim": 64,
    "moe_intermediate_size": 32, "shared_expert_intermediate_size": 32, "vocab_size": 99,
    "max_position_embeddings": 64, "n_positions": 64, "embedding_size": 16, "num_local_experts": 4,
    "num_experts": 4, "num_experts_per_tok": 2, "image_size": 32, "patch_size": 8, "sliding_window": 16,
    "query_pre_attn_scalar": 8, "vocab_size_per_layer_input": 99, "hidden_size_per_layer_input": 8,
    "projection_dim": 32, "word_embed_proj_dim": 32, "pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2,
}
#: hierarchical vision models (Swin): stage lists and their dims.
TINY_STAGES = {"depths": [1, 1], "num_heads": [2, 4], "embed_dim": 16, "window_size": 2, "patch_size": 4}


def tiny_dict(d: Dict[str, Any]) -> Dict[str, Any]:
    """A config dict shrunk by :data:`TINY` (sub-configs too); per-layer lists cut to the layers."""
    out = dict(d)
    for k, v in d.items():
        if isinstance(v, dict) and "model_type" in v:
            out[k] = tiny_dict(v)
        elif k in TINY and (isinstance(v, int) and not isinstance(v, bool) or (k == "vocab_size" and v is None)):
            out[k] = TINY[k]  # (ESM's default vocabulary size is None)
    if isinstance(d.get("depths"), list):
        out.update(TINY_STAGES)
        out["num_layers"] = len(TINY_STAGES["depths"])
        out.pop("hidden_size", None)
        for k in ("stage_names", "out_features", "out_indices"):
            out.pop(k, None)
    layers = out.get("num_hidden_layers")
    if isinstance(layers, int):
        for k in ("layer_types", "no_rope_layers", "mlp_only_layers"):
            if isinstance(out.get(k), list) and out[k]:
                out[k] = (out[k] * layers)[:layers]
        for k in ("stage_names", "out_features", "out_indices"):
            out.pop(k, None)
        for k in ("max_window_layers",):
            if isinstance(out.get(k), int):
                out[k] = layers
    for k in ("torch_dtype", "dtype", "transformers_version", "architectures", "_name_or_path"):
        out.pop(k, None)
    return out


def build_hf(model_type: str, out: str) -> Dict[str, Any]:
    """(torch venv) A tiny seeded random ``model_type`` model saved in ``out``; what was built."""
    import numpy as np
    import torch
    import transformers
    from transformers import AutoConfig
    from transformers.models.auto import modeling_auto as auto

    sys.path.insert(0, str(REPO / "scripts"))
    from make_xframe_fixtures import randomise

    base = AutoConfig.for_model(model_type)
    config = type(base).from_dict(tiny_dict(base.to_dict()))
    # as checkpoints on the Hub are saved: an encoder with its masked-LM head (the converters read
    # "roberta.encoder...", a decoder with its LM head, anything else as the bare model
    if model_type in auto.MODEL_FOR_MASKED_LM_MAPPING_NAMES and not getattr(config, "is_encoder_decoder", False):
        cls = transformers.AutoModelForMaskedLM
    elif model_type in auto.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES and not getattr(config, "is_encoder_decoder", False):
        cls = transformers.AutoModelForCausalLM
    else:
        cls = transformers.AutoModel
    torch.manual_seed(SEED)
    model = cls.from_config(config).eval()
    randomise(model, SEED)
    model.save_pretrained(out, safe_serialization=True)
    prefix = getattr(model, "base_model_prefix", "")
    if cls is transformers.AutoModel and prefix:
        # a bare model under its task model's prefix ("deit.embeddings..."), as Hub checkpoints hold it:
        # the converters that ask for bare keys find them by their suffix
        from safetensors.torch import load_file, save_file

        weights = os.path.join(out, "model.safetensors")
        save_file({f"{prefix}.{k}": v for k, v in load_file(weights).items()}, weights, metadata={"format": "pt"})
    path = os.path.join(out, "config.json")  # the aliases a Hub config.json spells out (BART's num_hidden_layers)
    with open(path) as f:
        saved = json.load(f)
    heads = saved.get("num_attention_heads")
    if isinstance(heads, int) and "head_dim" not in saved and isinstance(saved.get("hidden_size"), int):
        saved["head_dim"] = getattr(config, "head_dim", None) or saved["hidden_size"] // heads  # (Qwen3-MoE's Hub configs)
    for alias, attr in getattr(config, "attribute_map", {}).items():
        if alias not in saved and isinstance(getattr(config, attr, None), (int, float, str)):
            saved[alias] = getattr(config, attr)
    with open(path, "w") as f:
        json.dump(saved, f, indent=1)
    n = sum(int(np.prod(t.shape)) for t in model.state_dict().values())
    return {"model": type(model).__name__, "parameters": n}


def build_timm(candidates: List[str], out: str) -> Dict[str, Any]:
    """(torch venv) The smallest of ``candidates`` that timm knows, seeded random, saved with
    ``save_for_hf`` in ``out``."""
    import numpy as np
    import timm
    import torch

    sys.path.insert(0, str(REPO / "scripts"))
    from make_xframe_fixtures import randomise

    known = [c for c in candidates if timm.is_model(c)]
    if not known:
        raise ValueError(f"timm knows none of the converter's architectures {candidates}")
    sizes = {}
    for name in known:
        with torch.device("meta"):
            m = timm.create_model(name, pretrained=False)
        sizes[name] = sum(p.numel() for p in m.state_dict().values())
    name = min(known, key=lambda c: (sizes[c], c))
    torch.manual_seed(SEED)
    model = timm.create_model(name, pretrained=False).eval()
    randomise(model, SEED)
    timm.models.save_for_hf(model, out, safe_serialization=True)
    return {"model": name, "parameters": sizes[name]}


# -- the converters KerasHub ships (main env, no import of keras_hub needed) --------------------

def keras_hub_utils() -> Path:
    """The installed keras-hub's ``src/utils`` folder (found without importing keras_hub)."""
    import importlib.util

    spec = importlib.util.find_spec("keras_hub")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("keras-hub is not installed: pip install -e '.[test]'")
    return Path(list(spec.submodule_search_locations)[0]) / "src" / "utils"


def converters() -> List[Dict[str, Any]]:
    """Every converter module the installed keras-hub ships, with the key that selects it.

    Returns:
        ``[{"id", "family": "transformers"|"timm", "converter", "model_type" | "candidates"}]``,
        one per Hugging Face ``model_type`` a transformers converter is dispatched by (read from
        the preset loader's source), one per timm converter (its candidates: every quoted
        architecture name in its source).
    """
    utils = keras_hub_utils()
    rows: List[Dict[str, Any]] = []
    loader = (utils / "transformers" / "preset_loader.py").read_text()
    dispatch = re.findall(r"model_type\s*(==|in)\s*(\([^)]*\)|\"[^\"]+\")\s*:\s*\n(?:\s*#[^\n]*\n)*\s*self\.converter\s*=\s*(\w+)",
                          loader)
    seen = set()
    for _, keys, module in dispatch:
        for model_type in re.findall(r"\"([^\"]+)\"", keys):
            rows.append({"id": model_type, "family": "transformers", "converter": module,
                         "model_type": model_type})
            seen.add(module)
    for path in sorted((utils / "transformers").glob("convert_*.py")):
        if path.stem not in seen:
            rows.append({"id": path.stem, "family": "transformers", "converter": path.stem, "model_type": None})
    timm_loader = (utils / "timm" / "preset_loader.py").read_text()
    prefixes: Dict[str, List[str]] = {}
    for keys, module in re.findall(r"startswith\(([^)]*\)?)\)\s*:\s*\n\s*self\.converter\s*=\s*(\w+)", timm_loader):
        prefixes.setdefault(module, []).extend(re.findall(r"\"([^\"]+)\"", keys))
    for path in sorted((utils / "timm").glob("convert_*.py")):
        quoted = set(re.findall(r"\"([a-z][a-z0-9_]*\d[a-z0-9_]*)\"", path.read_text()))
        own = tuple(prefixes.get(path.stem, [])) or ("",)
        names = sorted(n for n in quoted | {f"{p}_{q}" for p in own for q in quoted} if n.startswith(own))
        rows.append({"id": "timm:" + path.stem[len("convert_"):], "family": "timm", "converter": path.stem,
                     "candidates": names})
    return sorted(rows, key=lambda r: (r["family"] != "transformers", r["id"]))


# -- one row (main env) ---------------------------------------------------------------------------

def _converter_module(row: Dict[str, Any]) -> Any:
    import importlib

    return importlib.import_module(f"keras_hub.src.utils.{row['family']}.{row['converter']}")


def _backbone(module: Any, folder: str, config: Dict[str, Any]) -> Any:
    import inspect

    from keras_hub.src.utils.preset_utils import PresetLoader  # noqa: F401  (keras_hub set up)

    cls = module.backbone_cls
    if len(inspect.signature(module.convert_backbone_config).parameters) != 1:
        keras_config = module.convert_backbone_config(config, cls)
    else:
        keras_config = module.convert_backbone_config(config)
    return cls(**keras_config)


def _inputs(backbone: Any, vocab: int) -> Any:
    import numpy as np

    rng = np.random.default_rng(SEED)
    specs = backbone.input if isinstance(backbone.input, dict) else {"": backbone.input}
    out = {}
    for name, spec in specs.items():
        shape = [2 if i == 0 else (d if d is not None else 8) for i, d in enumerate(spec.shape)]
        if "int" in str(spec.dtype) or "bool" in str(spec.dtype):
            if "mask" in name:
                value = np.ones(shape, "int32")
            elif "token" in name:
                value = rng.integers(3, max(vocab, 4), shape).astype("int32")
            else:
                value = np.zeros(shape, "int32")
        else:
            value = rng.standard_normal(shape).astype("float32")
        out[name] = value
    return out[""] if "" in out else out


def _flat(x: Any) -> List[Any]:
    import numpy as np

    if isinstance(x, dict):
        return [v for k in sorted(x) for v in _flat(x[k])]
    if isinstance(x, (list, tuple)):
        return [v for item in x for v in _flat(item)]
    return [np.asarray(x)]


def output_difference(a: Any, b: Any, inputs: Any) -> Optional[float]:
    """The largest difference between two backbones' outputs on ``inputs``: absolute, relative
    to the output's largest magnitude where that is over 1."""
    import numpy as np

    got, want = _flat(a(inputs)), _flat(b(inputs))
    worst = 0.0
    for g, w in zip(got, want):
        if not np.issubdtype(w.dtype, np.floating):
            continue
        scale = max(1.0, float(np.max(np.abs(w)))) if w.size else 1.0
        worst = max(worst, float(np.max(np.abs(g.astype("float64") - w))) / scale if w.size else 0.0)
    return worst


def _rounded_alike(got: Any, want: Any) -> bool:
    """Whether ``want`` is ``got`` rounded to float16 (and ``want`` holds only float16 values)."""
    import numpy as np

    with np.errstate(over="ignore"):
        half = got.astype(np.float16).astype(want.dtype)
    return bool(np.array_equal(half, want) and np.array_equal(want.astype(np.float16).astype(want.dtype), want))


def run_row(row: Dict[str, Any], folder: str) -> Dict[str, Any]:
    """(main env) Ground truth from KerasHub's converter and ckptmerge's transfer, for one built folder."""
    import numpy as np

    import ckptmerge as cm
    from keras_hub.src.utils.transformers.safetensor_utils import SafetensorLoader

    module = _converter_module(row)
    with open(os.path.join(folder, "config.json")) as f:
        config = json.load(f)
    weights = os.path.join(folder, "model.safetensors")
    result: Dict[str, Any] = {"backbone": module.backbone_cls.__name__}

    truth_model = _backbone(module, folder, config)
    for v in truth_model.weights:
        if "float" in str(v.dtype):
            v.assign(np.full(tuple(v.shape), np.nan, dtype=str(v.dtype)))
    prefix = "" if row["family"] == "timm" else None
    t0 = time.perf_counter()
    with SafetensorLoader(folder, prefix=prefix) as loader:
        module.convert_weights(truth_model, loader, config)
    result["converter_seconds"] = time.perf_counter() - t0
    truth, partial, left = {}, [], []
    for v in truth_model.weights:
        value = np.asarray(v.numpy())
        if "float" not in str(v.dtype):
            continue
        nan = np.isnan(value)
        if nan.all() and value.size:
            left.append(v.path)
        elif nan.any():
            partial.append(v.path)
        else:
            truth[v.path] = value

    model = _backbone(module, folder, config)
    t0 = time.perf_counter()
    plan = cm.plan(model, [cm.Source(weights, layout="torch", align="structure")])
    plan.restore(strict=False)
    result["ckptmerge_seconds"] = time.perf_counter() - t0
    values = {v.path: np.asarray(v.numpy()) for v in model.weights}
    assigned = [t for t in plan.assignments if t in truth]
    differ = [t for t in assigned if not np.array_equal(values[t], truth[t])]
    # KerasHub's Mistral converter rounds every tensor to float16 on its way in (hf_tensor.astype(
    # np.float16)): a value that is the converter's once rounded as the converter rounds is the same
    # tensor, counted apart ("rounded"); any other difference is wrong
    rounded = sorted(t for t in differ if _rounded_alike(values[t], truth[t]))
    wrong = sorted(set(differ) - set(rounded))
    extra = sorted(t for t in plan.assignments if t in left)
    coverage = plan.coverage()
    reasons: Dict[str, str] = {}
    for u in coverage["unresolved"]:
        for t in u["targets"]:
            reasons.setdefault(t, f"{u['reason']} (candidates: {', '.join(u['names'][:6])}"
                                  f"{' ...' if len(u['names']) > 6 else ''})")
    unresolved = {t: reasons.get(t, "no source tensor of its shape and role") for t in sorted(truth)
                  if t not in plan.assignments}
    vocab = int(config.get("vocab_size") or (config.get("text_config") or {}).get("vocab_size") or 99)
    try:
        diff = output_difference(model, truth_model, _inputs(model, vocab)) if not partial else None
    except Exception as e:  # a backbone whose inputs we cannot make up: the row still counts tensors
        diff = None
        result["output_error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:160] if str(e) else ''}"
    result.update({"targets": len(truth), "assigned": len(assigned), "wrong": len(wrong), "wrong_targets": wrong,
                   "rounded_by_converter": len(rounded),
                   "extra": len(extra), "extra_targets": extra, "unresolved": len(unresolved),
                   "unresolved_targets": unresolved, "converter_leaves": len(left), "partial": partial,
                   "output_difference": diff,
                   "source_tensors": coverage["sources"][0]["tensors"], "source_unused": coverage["sources"][0]["unused"]})
    return result


# -- driving ------------------------------------------------------------------------------------

def _error_line(text: str) -> str:
    lines = [x.strip() for x in text.strip().splitlines() if x.strip()]
    errs = [x for x in lines if re.match(r"^[A-Za-z_.]*(Error|Exception)\b", x)]
    return (errs[-1] if errs else (lines[-1] if lines else "failed"))[:300]


def _run(cmd: List[str], timeout: int = ROW_TIMEOUT) -> Tuple[Optional[Dict[str, Any]], str]:
    env = dict(os.environ, PYTHONPATH=str(REPO), TF_CPP_MIN_LOG_LEVEL="3", CUDA_VISIBLE_DEVICES="")
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        return None, f"timed out after {timeout} s"
    marker = [x for x in p.stdout.splitlines() if x.startswith("CONFORMANCE ")]
    if p.returncode != 0 or not marker:
        return None, _error_line(p.stderr or p.stdout)
    return json.loads(marker[-1][len("CONFORMANCE "):]), ""


def build(row: Dict[str, Any], folder: str, torch_python: str) -> Tuple[Optional[Dict[str, Any]], str]:
    """Build a row's tiny model in the torch venv (a subprocess)."""
    if row["family"] == "timm":
        arg = ["--build-timm", ",".join(row["candidates"])]
    elif row.get("model_type"):
        arg = ["--build-hf", row["model_type"]]
    else:
        return None, "no model_type dispatches to this converter in the preset loader"
    return _run([torch_python, str(Path(__file__).resolve()), *arg, folder])


def evaluate(row: Dict[str, Any], folder: str) -> Tuple[Optional[Dict[str, Any]], str]:
    """Ground truth and ckptmerge for a built row, in a fresh main-env process."""
    return _run([sys.executable, str(Path(__file__).resolve()), "--row", json.dumps(row), folder])


def matrix_row(row: Dict[str, Any], torch_python: str) -> Dict[str, Any]:
    """One row of the matrix: build, convert, transfer, score (each step in its own process)."""
    out = {"id": row["id"], "family": row["family"], "converter": row["converter"]}
    with tempfile.TemporaryDirectory(prefix="ckptmerge-conformance-") as folder:
        built, why = build(row, folder, torch_python)
        if built is None:
            return {**out, "status": "not built", "reason": why}
        out.update(built)
        got, why = evaluate(row, folder)
        if got is None:  # (the converter failed, or ckptmerge refused to plan: its own error says which)
            return {**out, "status": "refused by ckptmerge" if "ckptmerge." in why else "not converted", "reason": why}
        out.update(got)
    complete = got["wrong"] == 0 and got["extra"] == 0 and got["unresolved"] == 0
    out["status"] = "complete" if complete else "wrong" if got["wrong"] or got["extra"] else "partial"
    return out


def render(data: Dict[str, Any]) -> str:
    """``docs/conformance.md`` from the matrix's JSON (the test checks the committed page is this)."""
    rows = data["rows"]
    ran = [r for r in rows if "targets" in r]
    lines = [
        "# Conformance matrix",
        "",
        "Every converter the installed KerasHub ships (its `utils/transformers/` and `utils/timm/` modules) is",
        "a test case: a tiny model with seeded random weights (every norm scale and bias drawn, so that a swap",
        "shows) is built from the library's own config class and saved as PyTorch saves it; KerasHub's converter",
        "gives the ground truth; ckptmerge restores the same backbone with **no map**:",
        "",
        "```text",
        'cm.restore(backbone, [cm.Source("model.safetensors", layout="torch", align="structure")], strict=False)',
        "```",
        "",
        "and every restored tensor is compared with the converter's, bit for bit. *Wrong* counts a tensor",
        "restored with another value than the converter's (or into a variable the converter leaves alone): it",
        "must be 0 on every row. *Output* is the largest difference between the two backbones' outputs on the",
        "same inputs (relative where outputs exceed 1): 0 when the transfer is complete. *Time* is ckptmerge's",
        "plan + restore against the converter's `convert_weights` on the tiny model.",
        "",
        f"keras-hub {data['keras_hub']}, transformers {data['transformers']}, timm {data['timm']}; "
        f"{len(ran)} of {len(rows)} architectures built and converted, "
        f"{sum(r['status'] == 'complete' for r in ran)} complete, "
        f"{sum(r.get('wrong', 0) + r.get('extra', 0) for r in ran)} wrong tensors in all. "
        "Regenerate with `python scripts/conformance.py` (tests/test_conformance.py reads "
        "`docs/conformance.json`).",
        "",
        "| Architecture | Backbone | Targets | Assigned | Wrong | Unresolved | Output | Time vs converter |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in ran:
        diff = "n/a" if r.get("output_difference") is None else f"{r['output_difference']:.1e}"
        ratio = r["ckptmerge_seconds"] / max(r["converter_seconds"], 1e-9)
        mark = " (rounded)" if r.get("rounded_by_converter") else ""
        lines.append(f"| `{r['id']}`{mark} | {r['backbone']} | {r['targets']} | {r['assigned']} | "
                     f"{r['wrong'] + r['extra']} | {r['unresolved']} | {diff} | {ratio:.1f}x |")
    if any(r.get("rounded_by_converter") for r in ran):
        lines += ["", "*(rounded)*: that converter rounds every tensor to float16 on its way in (KerasHub's Mistral "
                  "converter: `hf_tensor.astype(np.float16)`); ckptmerge keeps the checkpoint's float32 values, "
                  "which equal the converter's once rounded the same way (counted right, not wrong), and the "
                  "output difference is that rounding."]
    rest = [r for r in rows if "targets" not in r]
    if rest:
        lines += ["", "## Not in the table", "",
                  "Architectures whose tiny model could not be built, whose converter failed on it, or that "
                  "ckptmerge refused to plan:", "",
                  "| Architecture | Converter | Status | Reason |", "|---|---|---|---|"]
        for r in rest:
            reason = r["reason"].replace("|", "\\|").replace("\n", " ")
            lines.append(f"| `{r['id']}` | `{r['converter']}` | {r['status']} | {reason} |")
    part = [r for r in ran if r["unresolved"]]
    if part:
        lines += ["", "## What is left unresolved", "",
                  "Per architecture, the targets ckptmerge leaves as they are, with its reason (first five):", ""]
        for r in part:
            lines.append(f"- `{r['id']}` ({r['unresolved']} of {r['targets']}):")
            for t, why in list(r["unresolved_targets"].items())[:5]:
                lines.append(f"    - `{t}`: {why}")
    return "\n".join(lines) + "\n"


def _versions(torch_python: str) -> Dict[str, str]:
    import importlib.metadata as md

    out = {"keras_hub": md.version("keras-hub")}
    code = "import transformers, timm; print(transformers.__version__, timm.__version__)"
    try:
        p = subprocess.run([torch_python, "-c", code], capture_output=True, text=True, timeout=300)
        out["transformers"], out["timm"] = p.stdout.split()[-2:]
    except Exception:
        out["transformers"] = out["timm"] = "?"
    return out


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--torch-python", default=os.environ.get("CKPTMERGE_TORCH_PYTHON", "/work/venvs/torch/bin/python"))
    ap.add_argument("--only", default="", help="comma-separated row ids (the others keep their committed rows)")
    ap.add_argument("--render", action="store_true", help="only rewrite docs/conformance.md from the JSON")
    ap.add_argument("--build-hf", nargs=2, metavar=("MODEL_TYPE", "DIR"), help=argparse.SUPPRESS)
    ap.add_argument("--build-timm", nargs=2, metavar=("CANDIDATES", "DIR"), help=argparse.SUPPRESS)
    ap.add_argument("--row", nargs=2, metavar=("ROW_JSON", "DIR"), help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.build_hf:
        print("CONFORMANCE " + json.dumps(build_hf(*a.build_hf)))
        return 0
    if a.build_timm:
        print("CONFORMANCE " + json.dumps(build_timm(a.build_timm[0].split(","), a.build_timm[1])))
        return 0
    if a.row:
        print("CONFORMANCE " + json.dumps(run_row(json.loads(a.row[0]), a.row[1])))
        return 0
    if a.render:
        PAGE_PATH.write_text(render(json.loads(JSON_PATH.read_text())))
        return 0
    only = {x for x in a.only.split(",") if x}
    old = {r["id"]: r for r in json.loads(JSON_PATH.read_text())["rows"]} if only and JSON_PATH.exists() else {}
    rows = []
    for row in converters():
        if only and row["id"] not in only:
            if row["id"] in old:
                rows.append(old[row["id"]])
            continue
        t0 = time.perf_counter()
        r = matrix_row(row, a.torch_python)
        sys.stderr.write(f"{r['id']:<22} {r['status']:<14} {r.get('assigned', '-')}/{r.get('targets', '-')} "
                         f"wrong {r.get('wrong', '-')} extra {r.get('extra', '-')} ({time.perf_counter() - t0:.0f} s) "
                         f"{r.get('reason', '')}\n")
        rows.append(r)
    data = {**_versions(a.torch_python), "seed": SEED, "rows": rows}
    JSON_PATH.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
    PAGE_PATH.write_text(render(data))
    return 0


if __name__ == "__main__":
    sys.exit(main())
