"""Inspection benchmark: ``ckptmerge ls`` vs TensorFlow's ``inspect_checkpoint``, side by side.

Workload (inspection issue): one name-based checkpoint of 10,000 small variables, written once
with ``tf.compat.v1.train.Saver`` and cached (default ``/tmp/ckptmerge-bench-inspect``). Each
round runs, one after the other, as fresh subprocesses with the same environment:

- TF:        ``python -m tensorflow.python.tools.inspect_checkpoint --file_name=PREFIX``
- ckptmerge: ``python -m ckptmerge ls PREFIX``

Both write to ``/dev/null`` (printing is part of the job, a terminal's speed is not), both with
byte-code caching on (as for an installed package; ``PYTHONDONTWRITEBYTECODE`` is dropped for
the children). Wall time is
measured around spawn + exit; peak RSS is the child's own ``ru_maxrss`` from ``os.wait4`` (so
neither the parent nor the other contender counts). One warm-up round first (page cache,
``.pyc`` files), then medians of ``--rounds`` rounds. A sanity check first makes sure both list
the same 10,000 names.

Targets: time ratio <= 0.1, peak RSS ratio <= 0.2.

Run: python scripts/bench_inspect.py [--rounds 7] [--dir /tmp/ckptmerge-bench-inspect] [--n 10000]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, List, Sequence, Tuple

REPO = Path(__file__).resolve().parents[1]
TIME_TARGET, RSS_TARGET = 0.1, 0.2


def build_checkpoint(root: Path, n: int) -> str:
    """Write (once) a checkpoint of ``n`` small float32 variables; return its prefix."""
    prefix = root / f"model-{n}vars"
    if (root / f"model-{n}vars.index").exists():
        return str(prefix)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    import numpy as np
    import tensorflow as tf

    root.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    graph = tf.Graph()
    with graph.as_default():
        variables = {}
        for i in range(n):
            # 100 blocks x 10 layers x (kernel, bias, gamma, beta, moving stats): a deep model's
            # naming, small tensors so the index dominates (as it does for inspection).
            name = f"model/block_{i // 100:03d}/layer_{(i // 10) % 10}/var_{i % 10}"
            shape = (4, 4) if i % 2 == 0 else (4,)
            variables[name] = tf.compat.v1.get_variable(
                name, initializer=rng.standard_normal(shape).astype(np.float32))
        saver = tf.compat.v1.train.Saver(variables)
        with tf.compat.v1.Session(graph=graph) as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            saver.save(sess, str(prefix))
    return str(prefix)


def commands(prefix: str) -> Dict[str, List[str]]:
    return {
        "TF inspect_checkpoint": [sys.executable, "-m", "tensorflow.python.tools.inspect_checkpoint",
                                  f"--file_name={prefix}"],
        "ckptmerge ls": [sys.executable, "-m", "ckptmerge", "ls", prefix],
    }


def child_env() -> Dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env["TF_CPP_MIN_LOG_LEVEL"] = "3"  # same for both: TF's start-up chatter is not the job
    # An installed package has .pyc files (pip compiles them; TF's are in site-packages): let
    # the warm-up round write ckptmerge's (to the git-ignored __pycache__) so neither tool pays
    # for compiling its sources in the timed rounds.
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    return env


def run_once(cmd: Sequence[str], env: Dict[str, str]) -> Tuple[float, int]:
    """Run ``cmd`` with output to /dev/null; return (wall seconds, peak RSS bytes of the child)."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env, cwd=REPO)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} exited with {proc.returncode}")
    return wall, usage.ru_maxrss * 1024  # Linux reports kilobytes


def sanity_check(cmds: Dict[str, List[str]], env: Dict[str, str], n: int) -> None:
    """Both tools must list the same n names (TF prints 'name (DT_FLOAT) [4, 4]' lines)."""
    tf_out = subprocess.run(cmds["TF inspect_checkpoint"], capture_output=True, text=True, env=env,
                            cwd=REPO, check=True).stdout
    tf_names = {line.split(" (DT_")[0] for line in tf_out.splitlines() if " (DT_" in line}
    cm_out = subprocess.run(cmds["ckptmerge ls"][:-1] + ["--json", cmds["ckptmerge ls"][-1]],
                            capture_output=True, text=True, env=env, cwd=REPO, check=True).stdout
    import json

    cm_names = {v["name"] for v in json.loads(cm_out)}
    if len(cm_names) != n or cm_names != tf_names:
        raise SystemExit(f"sanity check failed: TF lists {len(tf_names)} names, ckptmerge "
                         f"{len(cm_names)}, {len(cm_names ^ tf_names)} differ")


def main(argv: Sequence[str] = ()) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=7, help="timed rounds (median reported; >= 5)")
    ap.add_argument("--dir", default="/tmp/ckptmerge-bench-inspect", help="checkpoint cache folder")
    ap.add_argument("--n", type=int, default=10_000, help="number of variables")
    args = ap.parse_args(list(argv) or None)

    t0 = time.perf_counter()
    prefix = build_checkpoint(Path(args.dir), args.n)
    print(f"checkpoint: {prefix} ({args.n} variables; ready in {time.perf_counter() - t0:.1f} s)")
    env = child_env()
    cmds = commands(prefix)
    sanity_check(cmds, env, args.n)

    samples: Dict[str, List[Tuple[float, int]]] = {k: [] for k in cmds}
    for k, cmd in cmds.items():  # warm-up: page cache, .pyc files
        run_once(cmd, env)
    for _ in range(args.rounds):
        for k, cmd in cmds.items():
            samples[k].append(run_once(cmd, env))

    med = {k: (statistics.median(t for t, _ in v), statistics.median(r for _, r in v))
           for k, v in samples.items()}
    print(f"medians of {args.rounds} rounds (each a fresh subprocess, output to /dev/null):")
    print(f"  {'':24} {'wall time':>10} {'peak RSS':>10}")
    for k, (t, r) in med.items():
        print(f"  {k:24} {t:>8.3f} s {r / 2**20:>6.1f} MiB")
    (t_tf, r_tf), (t_cm, r_cm) = med["TF inspect_checkpoint"], med["ckptmerge ls"]
    t_ratio, r_ratio = t_cm / t_tf, r_cm / r_tf
    ok_t, ok_r = t_ratio <= TIME_TARGET, r_ratio <= RSS_TARGET
    print(f"  ratio ckptmerge/TF: time {t_ratio:.3f} (target <= {TIME_TARGET}: {'met' if ok_t else 'MISSED'}), "
          f"RSS {r_ratio:.3f} (target <= {RSS_TARGET}: {'met' if ok_r else 'MISSED'})")
    return 0 if ok_t and ok_r else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
