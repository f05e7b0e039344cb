"""Listing benchmark: ``ckptmerge checkpoints DIR`` for 2,500 and 5,000 checkpoints, side by side
with a baseline version of ckptmerge (default: a346745, which re-listed the directory for every
checkpoint and scanned the state file for every timestamp: quadratic).

Workload (hardening issue, item 12): a training directory of N checkpoints ``model-STEP`` (an
``.index`` and one ``.data`` shard each: hard links to one tiny checkpoint written by
TensorFlow's ``Saver``), and a ``checkpoint`` state file written by
``tf.compat.v1.train.update_checkpoint_state`` that lists all N with their timestamps. Built
once and cached (default ``/tmp/ckptmerge-bench-checkpoints``). Each round runs
``python -m ckptmerge checkpoints DIR`` as a fresh subprocess (output to /dev/null) with this
tree's ckptmerge and with the baseline's (``git archive REF ckptmerge``), one after the other;
medians of ``--rounds`` rounds after one warm-up. A sanity check first makes sure both list the
same N checkpoints.

Target: linear, i.e. time(5,000) / time(2,500) <= 2.5 (a quadratic listing gives about 4).

Run: python scripts/bench_checkpoints.py [--rounds 5] [--baseline a346745] [--dir /tmp/ckptmerge-bench-checkpoints]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, Sequence

REPO = Path(__file__).resolve().parents[1]
SIZES = (2_500, 5_000)
LINEAR_TARGET = 2.5


def build_directory(root: Path, n: int) -> Path:
    """Write (once) a directory of ``n`` checkpoints and a state file listing them; return it."""
    directory = root / f"run-{n}"
    if (directory / "checkpoint").exists():
        return directory
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    import numpy as np
    import tensorflow as tf

    seed = root / "seed"
    if not (seed / "model.index").exists():
        seed.mkdir(parents=True, exist_ok=True)
        graph = tf.Graph()
        with graph.as_default():
            tf.compat.v1.get_variable("w", initializer=np.zeros((4,), np.float32))
            saver = tf.compat.v1.train.Saver()
            with tf.compat.v1.Session(graph=graph) as sess:
                sess.run(tf.compat.v1.global_variables_initializer())
                saver.save(sess, str(seed / "model"))
    tmp = root / f"run-{n}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    prefixes = []
    for i in range(n):
        step = (i + 1) * 100
        for ext in (".index", ".data-00000-of-00001"):
            os.link(seed / f"model{ext}", tmp / f"model-{step}{ext}")
        prefixes.append(str(tmp / f"model-{step}"))
    now = time.time()
    tf.compat.v1.train.update_checkpoint_state(
        str(tmp), prefixes[-1], all_model_checkpoint_paths=prefixes,
        all_model_checkpoint_timestamps=[now - n + i for i in range(n)])
    # the state file records absolute paths: rewrite them for the final name of the directory
    text = (tmp / "checkpoint").read_text().replace(str(tmp), str(directory))
    (tmp / "checkpoint").write_text(text)
    tmp.rename(directory)
    return directory


def baseline_tree(root: Path, ref: str) -> Path:
    """The baseline's ``ckptmerge`` package, extracted (once) from git."""
    out = root / f"baseline-{ref}"
    if not (out / "ckptmerge" / "__init__.py").exists():
        out.mkdir(parents=True, exist_ok=True)
        archive = subprocess.run(["git", "-C", str(REPO), "archive", ref, "ckptmerge"], check=True,
                                 capture_output=True).stdout
        subprocess.run(["tar", "-x", "-C", str(out)], input=archive, check=True)
    return out


def env_for(tree: Path) -> Dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(tree)
    env.pop("PYTHONDONTWRITEBYTECODE", None)  # .pyc files as for an installed package
    return env


def run_once(tree: Path, directory: Path) -> float:
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-m", "ckptmerge", "checkpoints", str(directory)], env=env_for(tree),
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True, cwd="/")
    return time.perf_counter() - t0


def sanity_check(trees: Dict[str, Path], directory: Path, n: int) -> None:
    for label, tree in trees.items():
        out = subprocess.run([sys.executable, "-m", "ckptmerge", "checkpoints", str(directory), "--json"],
                             env=env_for(tree), capture_output=True, text=True, check=True, cwd="/").stdout
        rows = json.loads(out)
        if len(rows) != n or sum(r["latest"] for r in rows) != 1:
            raise SystemExit(f"sanity check failed: {label} lists {len(rows)} checkpoints of {n}")


def main(argv: Sequence[str] = ()) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=5, help="timed rounds (median reported)")
    ap.add_argument("--baseline", default="a346745", help="git ref of the baseline ckptmerge")
    ap.add_argument("--dir", default="/tmp/ckptmerge-bench-checkpoints", help="cache folder")
    args = ap.parse_args(list(argv) or None)

    root = Path(args.dir)
    trees = {"this tree": REPO, f"baseline {args.baseline}": baseline_tree(root, args.baseline)}
    dirs = {n: build_directory(root, n) for n in SIZES}
    for n, d in dirs.items():
        sanity_check(trees, d, n)

    med: Dict[str, Dict[int, float]] = {k: {} for k in trees}
    for label, tree in trees.items():
        for n, d in dirs.items():
            run_once(tree, d)  # warm-up: page cache, .pyc files
            med[label][n] = statistics.median(run_once(tree, d) for _ in range(args.rounds))

    print(f"ckptmerge checkpoints DIR: medians of {args.rounds} rounds (fresh subprocess, output to /dev/null)")
    print(f"  {'':22}" + "".join(f"{f'{n:,} ckpts':>14}" for n in SIZES) + f"{'5,000/2,500':>13}")
    for label in trees:
        t = med[label]
        print(f"  {label:22}" + "".join(f"{t[n]:>12.3f} s" for n in SIZES) + f"{t[SIZES[1]] / t[SIZES[0]]:>13.2f}")
    base = med[f"baseline {args.baseline}"]
    ours = med["this tree"]
    print("  speed-up vs baseline: " + ", ".join(f"{n:,}: {base[n] / ours[n]:.1f}x" for n in SIZES))
    growth = ours[SIZES[1]] / ours[SIZES[0]]
    ok = growth <= LINEAR_TARGET
    print(f"  growth 5,000/2,500 {growth:.2f} (target <= {LINEAR_TARGET}, linear: {'met' if ok else 'MISSED'})")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
