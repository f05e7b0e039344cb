"""Scale benchmark: planning 10k and 100k variables, side by side with TF's C++ checkpoint reader.

Workload (issue "Beyond one disk and one process"): a source checkpoint and a target checkpoint
with N variables each (``layer_i/dense/kernel`` and ``bias``, small float32 tensors, written by
ckptmerge's TF-free writer), and a realistic warm-start config: a scope map (``src/`` ->
``model/``) plus an exclude. Measured, each as a whole fresh process, median of ROUNDS:

- ``ckptmerge plan CONFIG --target T`` (TF-free): wall time and peak RSS;
- ``ckptmerge ls``, ``diff`` and ``merge --dry-run`` on the same checkpoints, and ``plan --json``
  (the whole plan as JSON, written a piece at a time);
- ``python -m ckptmerge --version``: the fixed start-up cost (interpreter, imports) inside each
  of the rows above, so the reader sees what part of a small run is start-up;
- baseline: ``tf.train.list_variables`` of both checkpoints in a process that already imported
  TensorFlow (only the two calls are timed), once per round, between the rows: medians of
  the same rounds are compared, so a machine whose speed drifts during the run (a shared VM)
  shifts both sides alike.

The processes run with Python's bytecode cache on (in ``DIR/pycache``, compiled first, untimed),
as an installed package does: with ``PYTHONDONTWRITEBYTECODE=1`` every process would compile
ckptmerge's sources again (about 0.2 s more per row).

Targets: every row <= 1.0x the baseline at 100k; plan 100k / 10k time <= 11; peak RSS <= 4x the
two index files + 100 MB. Each row prints its ratio to the baseline and its RSS verdict.
Run: python scripts/bench_scale.py [--sizes 10000 100000] [--rounds 3] [--dir /tmp/ckptmerge-scale]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def write_pair(root: str, n: int) -> tuple:
    """The source and target checkpoints of ``n`` variables (written once, reused), and the config."""
    sys.path.insert(0, REPO)
    from ckptmerge.formats.tf.writer import BundleWriter

    out = []
    for side, scope in (("source", "src"), ("target", "model")):
        prefix = os.path.join(root, f"{n}", side, "ckpt")
        if not os.path.exists(prefix + ".index"):
            os.makedirs(os.path.dirname(prefix), exist_ok=True)
            with BundleWriter(prefix) as w:
                for i in range(n // 2):
                    w.add(f"{scope}/layer_{i}/dense/kernel", np.zeros((4, 4), np.float32))
                    w.add(f"{scope}/layer_{i}/dense/bias", np.zeros((4,), np.float32))
                if side == "source":
                    w.add("src/global_step", np.array(1, np.int64))
        out.append(prefix)
    config = os.path.join(root, f"{n}", "warm.yaml")
    with open(config, "w") as f:
        f.write(f"sources:\n  - path: {out[0]}\n    map: {{'src/': 'model/'}}\n    exclude: ['*/global_step']\n")
    return out[0], out[1], config


def run_process(args: list, cache: str) -> tuple:
    """Wall time, peak RSS (bytes) and exit code of one fresh ``python -m ckptmerge ARGS``."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env.update(PYTHONPATH=REPO, PYTHONPYCACHEPREFIX=cache)
    t0 = time.perf_counter()
    # (cwd=REPO: ``python -m`` imports from the working directory first, so run from another
    # checkout this would measure that checkout's package, not this one's)
    proc = subprocess.Popen([sys.executable, "-m", "ckptmerge", *args], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, env=env, cwd=REPO)
    _, status, usage = os.wait4(proc.pid, 0)
    return time.perf_counter() - t0, usage.ru_maxrss * 1024, os.waitstatus_to_exitcode(status)


class TFListing:
    """A process that imported TensorFlow once and times ``tf.train.list_variables`` of both
    checkpoints whenever asked: the baseline is measured between the ckptmerge rows of every
    round, so a machine that speeds up or slows down during the run shifts both alike."""

    CODE = ("import sys, time, os\nos.environ['TF_CPP_MIN_LOG_LEVEL']='3'\nimport tensorflow as tf\n"
            "print('ready', flush=True)\n"
            "for line in sys.stdin:\n    t0=time.perf_counter()\n"
            "    for p in sys.argv[1:]: tf.train.list_variables(p)\n"
            "    print(time.perf_counter()-t0, flush=True)\n")

    def __init__(self, prefixes: list) -> None:
        self.proc = subprocess.Popen([sys.executable, "-c", self.CODE, *prefixes], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        if self.proc.stdout.readline().strip() != "ready":
            raise RuntimeError("the TensorFlow baseline process did not start")

    def time(self) -> float:
        self.proc.stdin.write("go\n")
        self.proc.stdin.flush()
        return float(self.proc.stdout.readline())

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[10000, 100000])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--dir", default="/tmp/ckptmerge-scale")
    args = ap.parse_args(argv)
    args.dir = os.path.abspath(args.dir)  # the processes run in REPO
    plan_times = {}
    cache = os.path.join(args.dir, "pycache")
    subprocess.run([sys.executable, "-m", "compileall", "-q", os.path.join(REPO, "ckptmerge")], check=True,
                   env=dict(os.environ, PYTHONPYCACHEPREFIX=cache))  # as installing does, untimed
    startup = [run_process(["--version"], cache) for _ in range(max(args.rounds, 3))]
    start_s, start_rss = statistics.median(r[0] for r in startup), max(r[1] for r in startup)
    print(f"start-up (python -m ckptmerge --version): {start_s:.3f} s, peak RSS {start_rss / 2**20:.1f} MiB")
    for n in args.sizes:
        src, tgt, config = write_pair(args.dir, n)
        index_bytes = os.path.getsize(src + ".index") + os.path.getsize(tgt + ".index")
        commands = (("plan", ["plan", config, "--target", tgt]), ("plan --json", ["plan", config, "--target", tgt, "--json"]),
                    ("ls", ["ls", src]), ("diff", ["diff", src, tgt]),
                    ("merge --dry-run", ["merge", config, "-o", os.path.join(args.dir, f"{n}", "out", "m"),
                                         "--dry-run", "-q"]))
        runs: dict = {name: [] for name, _ in commands}
        base_runs = []
        tf_list = TFListing([src, tgt])
        try:
            for _ in range(args.rounds):  # round by round: the baseline, then every row
                base_runs.append(tf_list.time())
                for name, cmd in commands:
                    runs[name].append(run_process(cmd, cache))
        finally:
            tf_list.close()
        rows = {name: (statistics.median(r[0] for r in rs), max(r[1] for r in rs), rs[0][2])
                for name, rs in runs.items()}
        base = statistics.median(base_runs)
        plan_times[n] = rows["plan"][0]
        bound = 4 * index_bytes + 100 * 2**20
        print(f"{n:,} variables per checkpoint (index files {index_bytes / 2**20:.1f} MiB; "
              f"RSS bound 4x index + 100 MB = {bound / 2**20:.1f} MiB):")
        print(f"  TF list_variables x2 (TF imported): {base:.3f} s")
        for name, (wall, rss, code) in rows.items():
            print(f"  ckptmerge {name:<16} {wall:6.3f} s  peak RSS {rss / 2**20:6.1f} MiB "
                  f"({'ok' if rss <= bound else 'OVER'})  exit {code}  time/TF {wall / base:5.2f}  "
                  f"without start-up {max(wall - start_s, 0.0):6.3f} s")
    if len(plan_times) >= 2:
        small, big = min(plan_times), max(plan_times)
        print(f"plan {big:,} / {small:,} time ratio: {plan_times[big] / plan_times[small]:.1f} (target <= 11)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
