"""Orbax benchmark: ckptmerge's reader vs Orbax's own V1 ``load`` vs TensorStore alone, side by side,
and the start-up cost of ``ckptmerge ls`` on an Orbax checkpoint.

Workload (issue 23): one Orbax checkpoint of 256 MiB, written once with orbax-checkpoint's V1
``save_pytree`` (OCDBT + zarr3, Orbax's defaults: zstd) and cached (default
``/tmp/ckptmerge-bench-orbax``): 16 float32 ``jax.Array`` leaves of 16 MiB each, random normal
values (weights do not compress). Each round reads every array, in this process, with the page
cache warm (one warm-up round first), in turn:

- Orbax V1:    ``orbax.checkpoint.experimental.v1.load(path)`` (arrays as saved, on the CPU)
- TensorStore: ``ts.open`` of each array (zarr3 over the OCDBT kvstore, as Orbax opens them),
  every read started, then all awaited: the floor for any reader built on TensorStore
- ckptmerge:   ``open_checkpoint(path).read_many(names)`` (metadata parsed and checked, every
  array read into a 64-byte aligned buffer)

Times are medians of ``--rounds`` rounds, each contender timed from "open the checkpoint" to
"all arrays in memory". Then ``python -m ckptmerge ls PATH`` runs ``--rounds`` times as a fresh
subprocess (stdout to /dev/null), started by a small fresh interpreter: wall time around spawn +
exit, the child's own peak RSS (``ru_maxrss`` from ``os.wait4``) and CPU time (user + system, which
a loaded machine inflates far less than wall time), medians, with the load average; beside it the
same for a TF checkpoint of the same arrays, which modules the ``ls`` process imported of
tensorstore, ml_dtypes, JAX and TensorFlow (none: it reads Orbax's JSON and the OCDBT index
itself), and the CPU time of the start-up no reader avoids, Python with NumPy, next to what
importing ml_dtypes and tensorstore on top of it would cost.

Targets: ckptmerge <= 1.0x Orbax V1 load, <= 1.2x TensorStore alone; ``ckptmerge ls`` < 1 s wall
and < 200 MB peak RSS.

Run: python scripts/bench_orbax.py [--rounds 5] [--dir /tmp/ckptmerge-bench-orbax] [--mib 256]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable, Dict, List, Tuple

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
ORBAX_TARGET, TS_TARGET, LS_SECONDS, LS_MB = 1.0, 1.2, 1.0, 200.0
ARRAYS = 16


def build(root: Path, mib: int) -> Path:
    """Write (once) the checkpoint: ``ARRAYS`` float32 jax.Arrays adding up to ``mib`` MiB."""
    path = root / f"orbax-{mib}mib"
    if (path / "_CHECKPOINT_METADATA").exists():
        return path
    import jax.numpy as jnp
    import numpy as np
    import orbax.checkpoint.experimental.v1 as ocp1

    root.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    per = mib * (1 << 20) // ARRAYS // 4
    cols = 1024
    tree = {"params": {f"layer_{i:02d}": {"kernel": jnp.asarray(rng.standard_normal((per // cols, cols),
                                                                                    dtype=np.float32))}
                       for i in range(ARRAYS)}}
    ocp1.save_pytree(str(path), tree)
    return path


def orbax_load(path: Path) -> int:
    import jax
    import orbax.checkpoint.experimental.v1 as ocp1

    tree = ocp1.load(str(path))
    leaves = jax.tree_util.tree_leaves(tree)
    jax.block_until_ready(leaves)
    return sum(int(x.nbytes) for x in leaves)


def tensorstore_alone(path: Path) -> int:
    import tensorstore as ts

    item = next(p for p in path.iterdir() if (p / "_METADATA").exists())
    ctx = ts.Context({"file_io_concurrency": {"limit": 128}, "cache_pool#ocdbt": {"total_bytes_limit": 100_000_000}})
    names = [f"params.layer_{i:02d}.kernel" for i in range(ARRAYS)]
    stores = [ts.open({"driver": "zarr3", "kvstore": {"driver": "ocdbt", "base": f"file://{item}/", "path": n,
                                                       "cache_pool": "cache_pool#ocdbt"},
                       "recheck_cached_data": False, "recheck_cached_metadata": False},
                      open=True, context=ctx) for n in names]
    futures = [s.result().read() for s in stores]
    return sum(int(f.result().nbytes) for f in futures)


def ckptmerge_read(path: Path) -> int:
    from ckptmerge.formats import open_checkpoint

    with open_checkpoint(str(path)) as r:
        arrays = r.read_many(r.names())
    return sum(int(a.nbytes) for a in arrays.values())


def timed_rounds(path: Path, rounds: int) -> Dict[str, List[float]]:
    contenders: Dict[str, Callable[[Path], int]] = {"Orbax V1 load": orbax_load, "TensorStore alone": tensorstore_alone,
                                                    "ckptmerge": ckptmerge_read}
    sizes = {name: fn(path) for name, fn in contenders.items()}  # warm-up, and the same bytes each
    if len(set(sizes.values())) != 1:
        raise SystemExit(f"contenders read different amounts: {sizes}")
    times: Dict[str, List[float]] = {name: [] for name in contenders}
    for r in range(rounds):
        order = list(contenders.items())
        if r % 2:
            order.reverse()
        for name, fn in order:
            t0 = time.perf_counter()
            fn(path)
            times[name].append(time.perf_counter() - t0)
    return times


# Each `ckptmerge ls` is started by this small, fresh interpreter, which reports the child's wall time
# and peak RSS: a child forked from the benchmark itself (JAX, 256 MiB of arrays) would count the
# parent's pages in its ru_maxrss.
_SPAWN = """
import os, subprocess, sys, time
t0 = time.perf_counter()
with open(os.devnull, "wb") as null:
    proc = subprocess.Popen(sys.argv[1:], stdout=null, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(proc.pid, 0)
wall = time.perf_counter() - t0
err = proc.stderr.read().decode(errors="replace")
print(os.waitstatus_to_exitcode(status), wall, usage.ru_maxrss / 1024.0, usage.ru_utime + usage.ru_stime,
      repr(err[-500:]))
"""


def spawn_rounds(args: List[str], rounds: int) -> Tuple[List[float], List[float], List[float]]:
    """Wall seconds, peak RSS (MB) and CPU seconds (user + system) of ``python ARGS``, fresh each time."""
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    walls, rss, cpu = [], [], []
    for r in range(rounds + 1):  # the first writes the .pyc files
        out = subprocess.run([sys.executable, "-c", _SPAWN, sys.executable, *args],
                             capture_output=True, text=True, env=env, cwd=str(REPO), check=True).stdout.split(" ", 4)
        if out[0] != "0":
            raise SystemExit(f"python {' '.join(args)} failed: {out[4]}")
        if r:
            walls.append(float(out[1]))
            rss.append(float(out[2]))  # KiB on Linux -> MiB
            cpu.append(float(out[3]))
    return walls, rss, cpu


def ls_rounds(path: str, rounds: int) -> Tuple[List[float], List[float], List[float]]:
    return spawn_rounds(["-m", "ckptmerge", "ls", path], rounds)


_IMPORTED = """
import runpy, sys
sys.argv = ["ckptmerge", "ls", sys.argv[1]]
try:
    runpy.run_module("ckptmerge", run_name="__main__")
except SystemExit as e:
    assert not e.code, e.code
print("imported:" + ",".join(sorted({m.split(".")[0] for m in sys.modules} & {"tensorstore", "ml_dtypes", "jax", "tensorflow"})))
"""


def imported_by_ls(path: str) -> str:
    """Which of tensorstore, ml_dtypes, JAX and TensorFlow ``ckptmerge ls PATH`` imports (fresh process)."""
    env = dict(os.environ, PYTHONPATH=str(REPO))
    out = subprocess.run([sys.executable, "-c", _IMPORTED, path], capture_output=True, text=True, env=env,
                         cwd=str(REPO), check=True).stdout
    return next(line for line in out.splitlines() if line.startswith("imported:"))[len("imported:"):]


def tf_twin(path: Path) -> str:
    """The same arrays as a TF checkpoint (written once by ckptmerge's merge): the baseline of `ls`."""
    prefix = path.parent / f"{path.name}-tf" / "ckpt"
    if not (prefix.parent / "ckpt.index").exists():
        import ckptmerge as cm

        cm.merge([cm.Source(str(path))], str(prefix))
    return str(prefix)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--dir", default="/tmp/ckptmerge-bench-orbax")
    parser.add_argument("--mib", type=int, default=256)
    args = parser.parse_args()
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    path = build(Path(args.dir), args.mib)
    times = timed_rounds(path, args.rounds)
    med = {k: statistics.median(v) for k, v in times.items()}
    print(f"Reading {args.mib} MiB ({ARRAYS} arrays, OCDBT + zarr3) from {path}, median of {args.rounds} rounds:")
    for name, t in med.items():
        print(f"  {name:<18} {t:7.3f} s  ({args.mib / t:7.1f} MiB/s)")
    r_orbax, r_ts = med["ckptmerge"] / med["Orbax V1 load"], med["ckptmerge"] / med["TensorStore alone"]
    print(f"  ckptmerge / Orbax V1 load   = {r_orbax:.2f}x (target <= {ORBAX_TARGET}x) "
          f"{'OK' if r_orbax <= ORBAX_TARGET else 'MISSED'}")
    print(f"  ckptmerge / TensorStore     = {r_ts:.2f}x (target <= {TS_TARGET}x) "
          f"{'OK' if r_ts <= TS_TARGET else 'MISSED'}")
    walls, rss, cpu = ls_rounds(str(path), args.rounds)
    tf_walls, tf_rss, tf_cpu = ls_rounds(tf_twin(path), args.rounds)
    wall, mb = statistics.median(walls), statistics.median(rss)
    print(f"ckptmerge ls, median of {args.rounds} fresh processes:")
    print(f"  Orbax checkpoint  {wall:5.2f} s wall (target < {LS_SECONDS} s) {'OK' if wall < LS_SECONDS else 'MISSED'}, "
          f"{mb:4.0f} MB peak RSS (target < {LS_MB:.0f} MB) {'OK' if mb < LS_MB else 'MISSED'}, "
          f"{statistics.median(cpu):5.2f} s CPU")
    print(f"  TF checkpoint     {statistics.median(tf_walls):5.2f} s wall, {statistics.median(tf_rss):4.0f} MB peak RSS, "
          f"{statistics.median(tf_cpu):5.2f} s CPU (the same arrays)")
    print(f"  imported by ls: {imported_by_ls(str(path)) or 'none'} of tensorstore, ml_dtypes, jax, tensorflow; "
          f"load average {', '.join(f'{x:.1f}' for x in os.getloadavg())}")
    # What no reader avoids (Python, NumPy), and what ls no longer imports (ml_dtypes; tensorstore imports it).
    floor = {what: statistics.median(spawn_rounds(["-c", code], args.rounds)[2])
             for what, code in (("python + numpy", "import numpy"), ("+ ml_dtypes", "import numpy, ml_dtypes"),
                                ("+ tensorstore", "import numpy, tensorstore"))}
    print("  start-up CPU: " + ", ".join(f"{k} {v:.2f} s" for k, v in floor.items())
          + " (ls imports only the first)")


if __name__ == "__main__":
    main()
