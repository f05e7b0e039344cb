"""Cross-framework benchmark (issue 19): PyTorch / Hugging Face weights into Keras and KerasHub with
no map, and back, against KerasHub's own converters.

Part 1, the committed fixtures (tests/fixtures/xframe: BERT, GPT-2, Llama, Phi-3, ViT, ResNet-18
as PyTorch saved them). Per pair: each fixture restored into its KerasHub backbone (or, for
ResNet-18, a Keras twin with default layer names) with ``Source(layout="torch",
align="structure")`` and no map; assigned / wrong / unresolved targets against the ground truth
of tests/_xframe.py (KerasHub's converters' own port_weight calls; for Phi-3 the mapping of
KerasHub's conversion script), the largest output difference
against PyTorch's outputs, and whether merging the restored model back out with
``layout="torch"`` and the fixture as the template gives the PyTorch file bit for bit.

Part 2, speed at BERT-base size (12 layers, hidden 768, 12 heads, intermediate 3072, vocabulary
30,522, 512 positions: 110M parameters, 418 MiB). A Hugging Face ``save_pretrained``-style folder
(``config.json`` + ``model.safetensors`` under BertModel's names) is written with seeded random
weights by the ``safetensors`` package (no torch). Timed, ``--rounds`` times in turn, each in this
one process:

- KerasHub: its BERT converter as ``BertBackbone.from_preset(folder)`` runs it once the model is
  built (``convert_bert.convert_weights(backbone, SafetensorLoader(folder), config)``: hand-written
  ``port_weight`` calls with transposing and reshaping hooks);
- ckptmerge: ``cm.restore(backbone, [Source(file, layout="torch", align="structure")])`` with no
  map: layout, planning, alignment, reading and assigning.

Both run on a backbone freshly built by ``from_preset(folder, load_weights=False)``, in turn,
wall time and this process's CPU time (steadier on a shared machine). Ratio = ckptmerge /
KerasHub, medians; target <= 1.0x. ``from_preset(folder)`` with its build, and the build plus
``cm.restore``, are also timed once.

Run: python scripts/bench_xframe.py [--rounds 3] [--skip-fixtures] [--skip-speed]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, List

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests"))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import numpy as np  # noqa: E402

import ckptmerge as cm  # noqa: E402

BERT_BASE = dict(vocab_size=30522, hidden_size=768, num_hidden_layers=12, num_attention_heads=12,
                 intermediate_size=3072, max_position_embeddings=512, type_vocab_size=2)


def fixtures() -> List[Dict[str, object]]:
    import _xframe as X
    from safetensors.numpy import load_file

    rows = []
    for name in X.PAIRS:
        model, truth = X.target_and_truth(name)
        plan = cm.plan(model, [cm.Source(X.weights_file(name), layout="torch", align="structure")])
        plan.restore(strict=False)
        score = X.score_values(model, truth, list(plan.assignments))
        diff = X.output_difference(name, model)
        with tempfile.TemporaryDirectory() as d:
            out = os.path.join(d, "back.safetensors")
            try:
                cm.merge([cm.Source.from_values(model)], out, layout="torch", template=X.weights_file(name),
                         allow_missing=["classifier.*"] if name == "vit" else ())
                a, b = load_file(X.weights_file(name)), load_file(out)
                exact = sorted(a) == sorted(b) and all(
                    a[k].dtype == b[k].dtype and a[k].shape == b[k].shape and np.array_equal(a[k], b[k]) for k in a)
            except cm.CkptMergeError as e:
                exact = f"refused: {str(e).splitlines()[0]}"
        rows.append({"pair": name, "targets": score.total, "assigned": score.assigned, "wrong": len(score.wrong),
                     "unresolved": score.unresolved, "output_diff": diff, "round_trip_exact": exact})
    return rows


def write_bert_base(folder: str, seed: int = 19) -> str:
    """A BERT-base ``save_pretrained``-style folder with seeded random weights, under BertModel's names."""
    from safetensors.numpy import save_file

    c = BERT_BASE
    h, inter = c["hidden_size"], c["intermediate_size"]
    rng = np.random.default_rng(seed)
    shapes = {"embeddings.word_embeddings.weight": (c["vocab_size"], h),
              "embeddings.position_embeddings.weight": (c["max_position_embeddings"], h),
              "embeddings.token_type_embeddings.weight": (c["type_vocab_size"], h),
              "embeddings.LayerNorm.weight": (h,), "embeddings.LayerNorm.bias": (h,),
              "pooler.dense.weight": (h, h), "pooler.dense.bias": (h,)}
    for i in range(c["num_hidden_layers"]):
        p = f"encoder.layer.{i}."
        for m in ("attention.self.query", "attention.self.key", "attention.self.value", "attention.output.dense"):
            shapes[p + m + ".weight"], shapes[p + m + ".bias"] = (h, h), (h,)
        shapes[p + "intermediate.dense.weight"], shapes[p + "intermediate.dense.bias"] = (inter, h), (inter,)
        shapes[p + "output.dense.weight"], shapes[p + "output.dense.bias"] = (h, inter), (h,)
        for n in ("attention.output.LayerNorm", "output.LayerNorm"):
            shapes[p + n + ".weight"], shapes[p + n + ".bias"] = (h,), (h,)
    tensors = {}
    for k, shape in shapes.items():
        if len(shape) == 1:
            base = 1.0 if k.endswith("LayerNorm.weight") else 0.0
            tensors[k] = (base + 0.02 * rng.standard_normal(shape)).astype(np.float32)
        else:
            tensors[k] = (rng.standard_normal(shape, dtype=np.float32) / np.sqrt(shape[1])).astype(np.float32)
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, "model.safetensors")
    save_file(tensors, path, metadata={"format": "pt"})
    config = {"architectures": ["BertModel"], "model_type": "bert", "hidden_act": "gelu", "layer_norm_eps": 1e-12,
              "hidden_dropout_prob": 0.1, "attention_probs_dropout_prob": 0.1, "pad_token_id": 0, **c}
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump(config, f, indent=1)
    return path


def speed(rounds: int) -> Dict[str, float]:
    import keras_hub
    from keras_hub.src.utils.transformers import convert_bert
    from keras_hub.src.utils.transformers.safetensor_utils import SafetensorLoader

    Backbone = keras_hub.models.BertBackbone
    with tempfile.TemporaryDirectory() as d:
        path = write_bert_base(d)
        with open(os.path.join(d, "config.json")) as f:
            config = json.load(f)
        size = os.path.getsize(path)

        def keras_hub_converter(model: object) -> None:  # what from_preset(d) runs once the model is built
            with SafetensorLoader(d) as loader:
                convert_bert.convert_weights(model, loader, config)

        def ckptmerge_restore(model: object) -> object:
            return cm.restore(model, [cm.Source(path, layout="torch", align="structure")])

        t0 = time.perf_counter()
        Backbone.from_preset(d)  # warm up both paths (imports, first calls); the build is timed once
        whole = time.perf_counter() - t0
        t0 = time.perf_counter()
        ckptmerge_restore(Backbone.from_preset(d, load_weights=False))
        build_restore = time.perf_counter() - t0
        times: Dict[str, List[float]] = {"keras_hub": [], "restore": [], "keras_hub_cpu": [], "restore_cpu": []}
        for _ in range(rounds):  # in turn, each on a freshly built model
            for key, run in (("keras_hub", keras_hub_converter), ("restore", ckptmerge_restore)):
                model = Backbone.from_preset(d, load_weights=False)
                t0, c0 = time.perf_counter(), time.process_time()
                result = run(model)
                times[key].append(time.perf_counter() - t0)
                times[key + "_cpu"].append(time.process_time() - c0)
                del model
            assert not result.plan.missing, result.plan.missing[:5]
    med = {k: statistics.median(v) for k, v in times.items()}
    med["ratios"] = statistics.median(r / k for r, k in zip(times["restore"], times["keras_hub"]))
    med.update(bytes=size, assigned=len(result.restored), whole=whole, build_restore=build_restore)
    return med


def main(argv: List[str] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--skip-fixtures", action="store_true")
    ap.add_argument("--skip-speed", action="store_true")
    args = ap.parse_args(argv)
    if not args.skip_fixtures:
        print("| pair | targets | assigned | wrong | unresolved | output diff vs PyTorch | back to PyTorch bit-exact |")
        print("|---|---|---|---|---|---|---|")
        for r in fixtures():
            print(f"| {r['pair']} | {r['targets']} | {r['assigned']} | {r['wrong']} | {r['unresolved']} | "
                  f"{r['output_diff']:.1e} | {r['round_trip_exact']} |")
    if not args.skip_speed:
        m = speed(args.rounds)
        mib = m["bytes"] / 2**20
        print(f"\nBERT-base ({m['assigned']} variables, {mib:.0f} MiB), medians of {args.rounds} rounds in turn:")
        print("| | KerasHub converter (convert_bert, as from_preset runs it) | cm.restore, no map | ratio |")
        print("|---|---|---|---|")
        print(f"| wall | {m['keras_hub']:.2f} s | {m['restore']:.2f} s | {m['restore'] / m['keras_hub']:.2f}x "
              f"(median of the rounds' ratios {m['ratios']:.2f}x) |")
        print(f"| CPU of this process | {m['keras_hub_cpu']:.2f} s | {m['restore_cpu']:.2f} s | "
              f"{m['restore_cpu'] / m['keras_hub_cpu']:.2f}x |")
        print(f"(once, with the build: from_preset(folder) {m['whole']:.1f} s; from_preset(load_weights=False) + "
              f"cm.restore {m['build_restore']:.1f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
