"""Alignment benchmark: how much ``align="structure"`` restores on realistic renamed pairs, how
often it is wrong, and what ``cm.suggest`` costs next to ``cm.plan``.

Part 1, coverage and correctness. Each pair is a real naming scheme on both sides, as names and
shapes (no TensorFlow: exactly what the planner sees), with the true answer known:

- ``estimator-dnn``: a TF1 Estimator ``DNNClassifier`` (``dnn/hiddenlayer_N``, ``dnn/logits``)
  into a Keras 3 ``Sequential`` of auto-named ``Dense`` layers;
- ``keras2-to-keras3``: a tf.keras 2 ``save_weights`` checkpoint (``dense`` ... ``dense_3``, the
  corpus' charity model) into a Keras 3 model with layers ``a``, ``b``, ``c``, ``d``;
- ``auto-name-shift``: 12 equal ``Dense(64)`` layers, ``sequential/dense`` ... into the same model
  rebuilt in one process (``sequential_1/dense_12`` ...; TF issue 46317);
- ``bert-base``: original BERT-Base TF1 names into TF2 Model-Garden names (12 layers, 768/3072);
- ``resnet50-slim``: TF-Slim ``resnet_v1_50`` into ``keras.applications.ResNet50`` names (Slim
  has no conv biases: those Keras targets have no counterpart and are not counted; its 1x1-conv
  classifier ``(1, 1, 2048, 1000)`` is the Dense kernel reshaped).

Each pair is planned as ``cm.plan`` does with ``Source(..., align="structure")``: a plan, the
alignment of what it leaves missing, a plan again (the planner and the alignment are pure, so
this is the same code path without files). Reported per pair: targets with a counterpart,
aligned, % aligned (target >= 90%) and wrong assignments (target: 0).

Part 2, speed. A BERT-like model with 10,000 variables (625 layers, tiny shapes) renamed
wholesale: ``cm.plan(specs, [source])`` vs ``cm.suggest(specs, [source])`` on the same inputs (an
in-memory source, a spec-list target: no TensorFlow), ``--rounds`` rounds of plan then suggest,
back to back, as wall time and as this process's CPU time (steadier on a machine shared with
other jobs); the ratio is the median of the rounds' suggest/plan ratios. Target: suggest < 2x
plan.

Run: python scripts/bench_align.py [--rounds 15] [--n 10000]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Dict, List, Optional, Tuple

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import numpy as np  # noqa: E402

import ckptmerge as cm  # noqa: E402
from ckptmerge.planning.planner import SourceView, make_plan  # noqa: E402
from ckptmerge.core.specs import VariableInfo  # noqa: E402
from ckptmerge.planning.suggestion import aligned_views  # noqa: E402

Pair = Tuple[List[VariableInfo], Dict[str, VariableInfo], Dict[str, str], Optional[List[str]], Optional[str]]


def v(name: str, *shape: int) -> VariableInfo:
    return VariableInfo(name, tuple(shape), "float32")


def mlp_pair(sizes: List[int], old: List[str], new: List[str]) -> Pair:
    """Dense layers ``old[i]`` (checkpoint) -> ``new[i]`` (a Keras ``Sequential`` named ``sequential``)."""
    src, tgt, truth = {}, [], {}
    for i, (o, n) in enumerate(zip(old, new)):
        for leaf, shape in (("kernel", (sizes[i], sizes[i + 1])), ("bias", (sizes[i + 1],))):
            src[f"{o}/{leaf}"] = v(f"{o}/{leaf}", *shape)
            tgt.append(v(f"sequential/{n}/{leaf}", *shape))
            truth[f"sequential/{n}/{leaf}"] = f"{o}/{leaf}"
    return tgt, src, truth, [t.name for t in tgt], "sequential"


def estimator_dnn() -> Pair:
    return mlp_pair([100, 256, 128, 64, 10], ["dnn/hiddenlayer_0", "dnn/hiddenlayer_1", "dnn/hiddenlayer_2", "dnn/logits"],
                    ["dense", "dense_1", "dense_2", "dense_3"])


def keras2_to_keras3() -> Pair:
    return mlp_pair([19, 90, 30, 10, 1], ["dense", "dense_1", "dense_2", "dense_3"], ["a", "b", "c", "d"])


def auto_name_shift() -> Pair:
    src, tgt, truth = {}, [], {}
    for i in range(12):
        old = "sequential/dense" + (f"_{i}" if i else "")
        new = f"sequential_1/dense_{i + 12}"
        for leaf, shape in (("kernel", (64, 64)), ("bias", (64,))):
            src[f"{old}/{leaf}"] = v(f"{old}/{leaf}", *shape)
            tgt.append(v(f"{new}/{leaf}", *shape))
            truth[f"{new}/{leaf}"] = f"{old}/{leaf}"
    return tgt, src, truth, [t.name for t in tgt], "sequential_1"


def bert(layers: int = 12, hidden: int = 768, inter: int = 3072, vocab: int = 30522) -> Pair:
    src: Dict[str, VariableInfo] = {}
    tgt: List[VariableInfo] = []
    truth: Dict[str, str] = {}

    def pair(old: str, new: str, *shape: int) -> None:
        src[old] = v(old, *shape)
        tgt.append(v(new, *shape))
        truth[new] = old

    pair("bert/embeddings/word_embeddings", "encoder/word_embeddings/embeddings", vocab, hidden)
    pair("bert/embeddings/position_embeddings", "encoder/position_embedding/embeddings", 512, hidden)
    pair("bert/embeddings/token_type_embeddings", "encoder/type_embeddings/embeddings", 2, hidden)
    for leaf in ("gamma", "beta"):
        pair(f"bert/embeddings/LayerNorm/{leaf}", f"encoder/embeddings/layer_norm/{leaf}", hidden)
    for n in range(layers):
        o, g = f"bert/encoder/layer_{n}/", f"encoder/transformer_{n}/"
        for q in ("query", "key", "value"):
            pair(o + f"attention/self/{q}/kernel", g + f"self_attention/{q}/kernel", hidden, hidden)
            pair(o + f"attention/self/{q}/bias", g + f"self_attention/{q}/bias", hidden)
        pair(o + "attention/output/dense/kernel", g + "self_attention/attention_output/kernel", hidden, hidden)
        pair(o + "attention/output/dense/bias", g + "self_attention/attention_output/bias", hidden)
        for leaf in ("gamma", "beta"):
            pair(o + f"attention/output/LayerNorm/{leaf}", g + f"self_attention_layer_norm/{leaf}", hidden)
        pair(o + "intermediate/dense/kernel", g + "intermediate/kernel", hidden, inter)
        pair(o + "intermediate/dense/bias", g + "intermediate/bias", inter)
        pair(o + "output/dense/kernel", g + "output/kernel", inter, hidden)
        pair(o + "output/dense/bias", g + "output/bias", hidden)
        for leaf in ("gamma", "beta"):
            pair(o + f"output/LayerNorm/{leaf}", g + f"output_layer_norm/{leaf}", hidden)
    pair("bert/pooler/dense/kernel", "encoder/pooler_transform/kernel", hidden, hidden)
    pair("bert/pooler/dense/bias", "encoder/pooler_transform/bias", hidden)
    return tgt, src, truth, [t.name for t in tgt], None


def resnet50_slim() -> Pair:
    src: Dict[str, VariableInfo] = {}
    tgt: List[VariableInfo] = []
    truth: Dict[str, str] = {}
    bn = ("gamma", "beta", "moving_mean", "moving_variance")

    def conv(old: str, new: str, k: int, cin: int, cout: int) -> None:
        src[f"{old}/weights"] = v(f"{old}/weights", k, k, cin, cout)
        tgt.append(v(f"{new}_conv/kernel", k, k, cin, cout))
        truth[f"{new}_conv/kernel"] = f"{old}/weights"
        tgt.append(v(f"{new}_conv/bias", cout))  # Slim convs have no bias: no counterpart
        for leaf in bn:
            src[f"{old}/BatchNorm/{leaf}"] = v(f"{old}/BatchNorm/{leaf}", cout)
            tgt.append(v(f"{new}_bn/{leaf}", cout))
            truth[f"{new}_bn/{leaf}"] = f"{old}/BatchNorm/{leaf}"

    conv("resnet_v1_50/conv1", "conv1", 7, 3, 64)
    cin = 64
    for s, (blocks, f) in enumerate(zip((3, 4, 6, 3), (64, 128, 256, 512)), start=1):
        for b in range(1, blocks + 1):
            old, new = f"resnet_v1_50/block{s}/unit_{b}/bottleneck_v1", f"conv{s + 1}_block{b}"
            if b == 1:
                conv(f"{old}/shortcut", f"{new}_0", 1, cin, 4 * f)
            conv(f"{old}/conv1", f"{new}_1", 1, cin if b == 1 else 4 * f, f)
            conv(f"{old}/conv2", f"{new}_2", 3, f, f)
            conv(f"{old}/conv3", f"{new}_3", 1, f, 4 * f)
            cin = 4 * f
    src["resnet_v1_50/logits/weights"] = v("resnet_v1_50/logits/weights", 1, 1, 2048, 1000)
    src["resnet_v1_50/logits/biases"] = v("resnet_v1_50/logits/biases", 1000)
    tgt += [v("predictions/kernel", 2048, 1000), v("predictions/bias", 1000)]
    truth["predictions/bias"] = "resnet_v1_50/logits/biases"
    # (the 1x1-conv classifier is the Dense kernel with two unit axes: a reshape alignment infers)
    truth["predictions/kernel"] = "resnet_v1_50/logits/weights"
    return tgt, src, truth, [t.name for t in tgt], None


PAIRS = {"estimator-dnn": estimator_dnn, "keras2-to-keras3": keras2_to_keras3,
         "auto-name-shift": auto_name_shift, "bert-base": bert, "resnet50-slim": resnet50_slim}


def aligned_plan(targets, src, order, root):
    """What cm.plan does for one Source(..., align='structure'): plan, align, plan again."""
    views = [SourceView("src", "<memory>", "", src)]
    plan = make_plan(targets, views, model_root=root)
    if plan.missing:
        views = aligned_views(plan, views, [True], target_order=order)
        plan = make_plan(targets, views, model_root=root)
    return plan


def coverage() -> bool:
    import scipy.optimize  # noqa: F401 - imported once before timing, as in a long-lived process

    print("Part 1: align='structure' on renamed pairs (targets with a counterpart)")
    print(f"{'pair':18} {'targets':>8} {'aligned':>8} {'%':>7} {'wrong':>6} {'missing':>8}  time")
    ok = True
    for name, make in PAIRS.items():
        targets, src, truth, order, root = make()
        t0 = time.perf_counter()
        plan = aligned_plan(targets, src, order, root)
        dt = time.perf_counter() - t0
        right = sum(1 for t, a in plan.assignments.items() if truth.get(t) == a.name)
        wrong = sum(1 for t, a in plan.assignments.items() if truth.get(t) != a.name)
        pct = 100.0 * right / len(truth)
        left = sum(1 for t in plan.missing if t in truth)
        ok &= pct >= 90.0 and wrong == 0
        print(f"{name:18} {len(truth):8d} {right:8d} {pct:6.1f}% {wrong:6d} {left:8d}  {dt * 1000:.0f} ms")
    return ok


def big_pair(n: int):
    layers = max(1, (n - 7) // 16)
    targets, src, _, _, _ = bert(layers=layers, hidden=4, inter=8, vocab=16)
    values = {k: np.zeros(s.shape, np.float32) for k, s in src.items()}
    return targets, values


def speed(n: int, rounds: int) -> bool:
    targets, values = big_pair(n)
    print(f"\nPart 2: cm.suggest vs cm.plan, {len(targets)} targets renamed wholesale, "
          f"{len(values)} source variables, medians of {rounds}")

    def timed(fns, clock):
        """Times of each function per round, rounds interleaved (plan, suggest, plan, ...) so that
        a change of load on a shared machine hits both alike."""
        out = [[] for _ in fns]
        for _ in range(rounds):
            for fn, times in zip(fns, out):
                t0 = clock()
                fn()
                times.append(clock() - t0)
        return out

    source = cm.Source.from_values(values, name="bert")
    sug = cm.suggest(targets, [source])  # warm-up (imports)
    ok = True
    # Wall time, and this process's CPU time (steadier on a machine shared with other jobs).
    for label, clock in (("wall", time.perf_counter), ("cpu", time.process_time)):
        plans, suggests = timed([lambda: cm.plan(targets, [source]), lambda: cm.suggest(targets, [source])], clock)
        # The ratio of each back-to-back pair, then their median: the pairs share the load of
        # their moment, which medians taken apart do not.
        ratio = statistics.median(s / p for p, s in zip(plans, suggests))
        print(f"  {label:4}: cm.plan {statistics.median(plans):.3f} s, cm.suggest {statistics.median(suggests):.3f} s "
              f"(medians); median ratio of back-to-back rounds {ratio:.2f} (target < 2)")
        ok &= ratio < 2.0
    print(f"  suggest: {sug.n_proposed} proposed, {len(sug.missing)} still missing, "
          f"{sum(len(s.entries) for s in sug.sources)} map entries")
    return ok


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--n", type=int, default=10000)
    args = ap.parse_args()
    ok = coverage()
    ok &= speed(args.n, args.rounds)
    print("\nPASS" if ok else "\nFAIL")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
