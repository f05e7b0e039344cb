"""Offline merge benchmark: `ckptmerge merge` vs `cp` of the same bytes, side by side in one run.

Workload (offline merge issue): two checkpoints of 16 float32 tensors of 4M elements each
(256 MiB each, 512 MiB in all), merged into one new checkpoint. Each round runs, one after the
other and each in a fresh output directory:

- cp: ``cp A.index A.data-* B.index B.data-* OUT/`` (the same input bytes);
- merge: ``python -m ckptmerge merge CONFIG -o OUT/merged`` when the CLI exists, else
  ``python -c "import ckptmerge.merging.dispatch as m; m.merge([...], OUT)"`` (interpreter start-up included).

Both run under ``/usr/bin/time`` (which also gives the merge's peak RSS, file pages it maps
included). Dirty pages are flushed with ``os.sync()`` before each timing; the page cache is kept
warm for both (no drop_caches). Neither ``cp`` nor the merge fsyncs (the merge's ``--durable``
would). Byte-code caching is on for the children, as for an installed package. Medians of
``--rounds`` rounds (default 5); the target is a ratio <= 2.0 and a peak RSS under the largest
tensor + 200 MB.

Also printed, to explain the figures: where the merge's time goes (interpreter start-up, imports,
time inside ``merge()`` from the report's ``elapsed``), and ``cp`` followed by ``sync`` of the
copies, a reference as durable as the merge's output.

Run: python scripts/bench_merge.py [--rounds 5] [--dir /tmp/ckptmerge-bench-merge]
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

import numpy as np  # noqa: E402

N_TENSORS = 16
ELEMENTS = 4 << 20  # float32: 16 MiB per tensor, 256 MiB per checkpoint
TENSOR_BYTES = ELEMENTS * 4
RSS_SLACK = 200 * 10 ** 6


def write_inputs(root: str) -> list:
    """Write checkpoints A and B with ckptmerge's BundleWriter (numpy only), once; reuse after."""
    from ckptmerge.formats.tf.writer import BundleWriter

    prefixes = []
    for label in ("A", "B"):
        prefix = os.path.join(root, label, f"model-{label.lower()}")
        if not os.path.exists(prefix + ".index"):
            rng = np.random.default_rng(ord(label))
            with BundleWriter(prefix, overwrite=True) as w:
                for i in range(N_TENSORS):
                    w.add(f"{label.lower()}/layer{i:02d}/kernel",
                          rng.standard_normal(ELEMENTS, dtype=np.float32).reshape(2048, 2048))
        prefixes.append(prefix)
    return prefixes


def input_files(prefixes: list) -> list:
    files = []
    for p in prefixes:
        files += [p + ".index"] + sorted(glob.glob(p + ".data-*"))
    return files


def has_cli() -> bool:
    return os.path.exists(os.path.join(REPO, "ckptmerge", "cli.py")) and subprocess.run(
        [sys.executable, "-m", "ckptmerge", "merge", "--help"], cwd=REPO, capture_output=True).returncode == 0


def merge_command(prefixes: list, config: str, out: str, use_cli: bool) -> list:
    """The merge as a user runs it; it prints the report as JSON (its ``elapsed`` is the time
    spent inside ``merge()``, without interpreter start-up and imports)."""
    if use_cli:
        return [sys.executable, "-m", "ckptmerge", "merge", config, "-o", out, "--quiet", "--json"]
    code = ("import sys, json, ckptmerge.merging.dispatch as m; "
            "print(json.dumps(m.merge(sys.argv[1:3], sys.argv[3]).to_dict()))")
    return [sys.executable, "-c", code, prefixes[0], prefixes[1], out]


# An installed package has .pyc files (pip compiles them at install time): let the warm-up round
# write ckptmerge's (to the git-ignored __pycache__), so the timed rounds do not pay for compiling
# its sources, as scripts/bench_inspect.py does too.
_CHILD_ENV = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}


def timed(cmd: list) -> tuple:
    """Run ``cmd`` under /usr/bin/time after flushing dirty pages; return (wall s, peak RSS bytes, stdout)."""
    with tempfile.NamedTemporaryFile("r", suffix=".time") as tf:
        os.sync()
        t0 = time.perf_counter()
        res = subprocess.run(["/usr/bin/time", "-f", "%M", "-o", tf.name, *cmd], cwd=REPO,
                             capture_output=True, text=True, env=_CHILD_ENV)
        wall = time.perf_counter() - t0
        if res.returncode != 0:
            raise SystemExit(f"command failed ({res.returncode}): {' '.join(cmd)}\n{res.stderr}")
        rss_kib = int(tf.read().strip().splitlines()[-1])
    return wall, rss_kib * 1024, res.stdout


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--dir", default=os.path.join(tempfile.gettempdir(), "ckptmerge-bench-merge"))
    args = ap.parse_args()
    if not os.path.exists("/usr/bin/time"):
        raise SystemExit("/usr/bin/time is missing: apt-get install -y time")

    os.makedirs(args.dir, exist_ok=True)
    prefixes = write_inputs(args.dir)
    files = input_files(prefixes)
    in_bytes = sum(os.path.getsize(f) for f in files)
    config = os.path.join(args.dir, "merge.json")
    with open(config, "w") as f:
        json.dump({"sources": [{"path": prefixes[0], "name": "A"}, {"path": prefixes[1], "name": "B"}]}, f)
    use_cli = has_cli()
    out_root = os.path.join(args.dir, "out")

    for f in files:  # warm the page cache for both contenders
        with open(f, "rb") as fh:
            while fh.read(64 << 20):
                pass
    bare = statistics.median(timed([sys.executable, "-c", "pass"])[0] for _ in range(5))
    start = statistics.median(timed([sys.executable, "-c", "import ckptmerge.merging.dispatch"])[0] for _ in range(5))

    cp_times, cps_times, merge_times, inner, rss = [], [], [], [], []
    copies = " ".join(os.path.join(out_root, os.path.basename(f)) for f in files)
    for r in range(args.rounds + 1):  # round 0 is a warm-up, not counted
        for name in ("cp", "cp+sync", "merge"):
            shutil.rmtree(out_root, ignore_errors=True)
            os.makedirs(out_root)
            if name == "cp":
                wall, _, _ = timed(["cp", *files, out_root])
                if r:
                    cp_times.append(wall)
            elif name == "cp+sync":  # reference only: cp made as durable as the merge's output
                wall, _, _ = timed(["sh", "-c", f"cp {' '.join(files)} {out_root} && sync {copies}"])
                if r:
                    cps_times.append(wall)
            else:
                wall, peak, out = timed(merge_command(prefixes, config, os.path.join(out_root, "merged"), use_cli))
                if r:
                    merge_times.append(wall)
                    rss.append(peak)
                    inner.append(json.loads(out)["elapsed"])
    shutil.rmtree(out_root, ignore_errors=True)
    os.sync()

    cp_med, merge_med = statistics.median(cp_times), statistics.median(merge_times)
    bound = TENSOR_BYTES + RSS_SLACK
    how = "python -m ckptmerge merge CONFIG -o OUT" if use_cli else "python -c 'ckptmerge.merge(...)'"
    print(f"workload: 2 checkpoints x {N_TENSORS} float32 tensors of {ELEMENTS:,} elements "
          f"= {in_bytes / 2**20:.0f} MiB in; {args.rounds} rounds, medians; page cache warm, os.sync() before each")
    runs = lambda ts: ", ".join(f"{t:.3f}" for t in ts)  # noqa: E731
    print(f"  cp (index + data of both)        : {cp_med:.3f} s   (runs: {runs(cp_times)})")
    print(f"  merge: {how}")
    print(f"                                     {merge_med:.3f} s   (runs: {runs(merge_times)})")
    ratio = merge_med / cp_med
    print(f"  ratio merge / cp                 : {ratio:.2f}x   (target <= 2.00x: {'OK' if ratio <= 2 else 'MISSED'})")
    print("  where the merge's time goes (medians):")
    print(f"    interpreter start-up (python -c pass)        : {bare:.3f} s")
    print(f"    + imports (python -c 'import ckptmerge.merging.dispatch'): {start - bare:.3f} s")
    print(f"    inside merge() (report.elapsed)               : {statistics.median(inner):.3f} s")
    print(f"  reference: cp + sync of the copies (durable, like merge --durable): "
          f"{statistics.median(cps_times):.3f} s -> merge / (cp + sync) = {merge_med / statistics.median(cps_times):.2f}x")
    print(f"  merge peak RSS (/usr/bin/time)  : {max(rss) / 2**20:.1f} MiB max, {statistics.median(rss) / 2**20:.1f} MiB median"
          f"   (bound: largest tensor {TENSOR_BYTES / 2**20:.0f} MiB + 200 MB = {bound / 2**20:.0f} MiB: "
          f"{'OK' if max(rss) <= bound else 'MISSED'})")


if __name__ == "__main__":
    main()
