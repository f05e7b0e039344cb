"""Benchmark: checkpoint arithmetic (ckptmerge.combine) against its baselines, side by side.

The default run (issue 34, item 6), page cache warm, in one run:

- averaging 8 safetensors inputs of 64 MiB (float32) with ``cm.merge(cm.combine(paths), out)``
  into a ``.safetensors`` file, and 8 TF bundles of 256 MiB (checksums verified) into a bundle;
- each against a warm ``cat`` of the same inputs to /dev/null, and against a no-ckptmerge NumPy
  floor (the inputs read a chunk at a time with ``np.fromfile``, the mean taken in float64 and
  rounded to float32, written to a file; for TF bundles the data files' CRC32C computed too);
- every timing the median of 3 rounds (interleaved; the machine is shared, so the load average is
  printed), each measured run a fresh process reporting its own time and peak RSS (VmHWM); the
  peak RSS of averaging 2 inputs against 8 shows it does not grow with N.

Targets (issue 34): safetensors <= 1.6x ``cat``, TF bundles <= 2.0x ``cat``; peak RSS independent
of N. Inputs are written under /tmp and deleted at the end.

    python scripts/bench_combine.py            # 8 x 64 MiB safetensors, 8 x 256 MiB TF bundles
    python scripts/bench_combine.py --small    # 8 x 8 MiB and 8 x 32 MiB, 1 round: a quick check
    python scripts/bench_combine.py --detail   # the older bench: TF floor's parts, NumPy load-all, mergekit

The older bench (``--detail``):

1. Averaging N checkpoints of SIZE MiB each (TF bundles the bench writes in a temp dir, with
   ckptmerge's TF-free writer): ``ckptmerge.merge(ckptmerge.combine(run, last=N), out)``
   against "load all with numpy, then mean" (peak RSS and time) and against reading every
   input once (``cat`` of the files to /dev/null, page cache warm: the floor for any averager).
2. TIES and linear merges of safetensors inputs (a base and 3 fine-tunes of SIZE MiB) against
   mergekit's ``mergekit-pytorch`` on the same files, where mergekit is installed (a venv, by
   default /work/venvs/mergekit): the times, and the largest difference between the results.

Each measured run is a fresh Python process, which reports its own time and peak RSS (VmHWM)
and its RSS after the imports. Targets (issue 21): peak RSS <= 64 MiB + 4x the largest chunk for
any N; averaging time <= 1.3x reading every input once; TIES <= 1.0x mergekit's time.

    python scripts/bench_combine.py --detail                  # 8 x 256 MiB, mergekit if found
    python scripts/bench_combine.py --detail --n 4 --size-mib 64 --mergekit none
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from ckptmerge.formats.base import CHUNK_ELEMENTS  # noqa: E402

_MEASURE = textwrap.dedent("""
    import json, sys, time
    def status(key):
        for line in open('/proc/self/status'):
            if line.startswith(key):
                return int(line.split()[1])
    {imports}
    import resource
    def cpu():
        r = resource.getrusage(resource.RUSAGE_SELF)
        return r.ru_utime + r.ru_stime
    rss0 = status('VmRSS:')
    t0, c0 = time.perf_counter(), cpu()
    {body}
    dt, dc = time.perf_counter() - t0, cpu() - c0
    print(json.dumps({{"time": dt, "cpu": dc, "hwm_kib": status('VmHWM:'), "rss0_kib": rss0,
                      "children_kib": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss}}))
""")


def measure(imports: str, body: str, python: str = sys.executable) -> dict:
    code = _MEASURE.format(imports=imports, body=textwrap.indent(textwrap.dedent(body), "").replace("\n", "\n"))
    out = subprocess.run([python, "-c", code], capture_output=True, text=True, cwd=str(REPO),
                         env={**os.environ, "PYTHONPATH": str(REPO)})
    if out.returncode != 0:
        raise SystemExit(f"measured run failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def layout(size_mib: int) -> list:
    """Tensor shapes of one checkpoint of about ``size_mib`` MiB of float32: an embedding of an
    eighth of it, the rest in layers of 4 MiB (a 2-D kernel and a bias each) and a last 1-D tensor."""
    total = size_mib << 20 >> 2  # float32 elements
    emb_rows = max(1, total // 8 // 256)
    shapes = [("emb/embeddings", (emb_rows, 256))]
    left = total - emb_rows * 256
    i = 0
    while left >= 1024 * 1024:
        shapes.append((f"layer_{i}/kernel", (1024, 1024)))
        shapes.append((f"layer_{i}/bias", (1024,)))
        left -= 1024 * 1024 + 1024
        i += 1
    if left:
        shapes.append(("tail/kernel", (left,)))
    return shapes


def write_run(root: Path, n: int, size_mib: int) -> list:
    from ckptmerge.formats.tf.writer import BundleWriter

    shapes = layout(size_mib)
    prefixes = []
    for k in range(n):
        rng = np.random.default_rng(k)
        prefix = root / "run" / f"ckpt-{(k + 1) * 1000}"
        with BundleWriter(str(prefix)) as w:
            for name, shape in shapes:
                w.add(name, rng.standard_normal(shape, dtype=np.float32))
        prefixes.append(str(prefix))
    return prefixes


def write_safetensors(root: Path, size_mib: int) -> list:
    from safetensors.numpy import save_file

    shapes = [(name.replace("/", "."), shape) for name, shape in layout(size_mib)]
    rng = np.random.default_rng(99)
    base = {name: rng.standard_normal(shape, dtype=np.float32) for name, shape in shapes}
    paths = [str(root / "st" / "base.safetensors")]
    os.makedirs(root / "st", exist_ok=True)
    save_file(base, paths[0])
    for k in range(3):
        ft = {name: v + np.float32(0.01) * rng.standard_normal(v.shape, dtype=np.float32) for name, v in base.items()}
        paths.append(str(root / "st" / f"ft{k}.safetensors"))
        save_file(ft, paths[-1])
        del ft
    return paths


def cat_time(files: list) -> float:
    return cat_times(files)[0]


def cat_times(files: list) -> tuple:
    """``cat`` of the files to /dev/null, page cache warm: (wall time, CPU time)."""
    import resource

    subprocess.run(["cat", *files], stdout=subprocess.DEVNULL, check=True)  # warm the page cache
    r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    subprocess.run(["cat", *files], stdout=subprocess.DEVNULL, check=True)
    dt = time.perf_counter() - t0
    r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    return dt, (r1.ru_utime + r1.ru_stime) - (r0.ru_utime + r0.ru_stime)


# What any averager of these files must do, without ckptmerge, one thread: read each input's
# bytes once into a 128 KiB buffer (the copy cat makes), check their CRC32C (TF bundles keep one),
# add them into a float64 block and round the mean into float32. The files are read a block of
# each in turn, as the merge reads them.
_FLOOR = """
import os, numpy as np, crc32c
files = [f for f in {files!r} if ".data-" in f]
fds = [os.open(f, os.O_RDONLY) for f in files]
size = max(os.path.getsize(f) for f in files)
BLOCK = 1 << 15
buf = np.empty(BLOCK, np.float32)
view = memoryview(buf.view(np.uint8))
acc = np.empty(BLOCK, np.float64)
out = np.empty(BLOCK, np.float32)
crcs = [0] * len(fds)
for pos in range(0, size, view.nbytes):
    for j, fd in enumerate(fds):
        got = os.preadv(fd, [view], pos)
        if {crc}:
            crcs[j] = crc32c.crc32c(view[:got], crcs[j])
        if {add}:
            if j:
                np.add(acc, buf, out=acc)
            else:
                np.copyto(acc, buf)
    if {add}:
        np.divide(acc, len(fds), out=out, casting="unsafe")
"""


def floors(files: list) -> dict:
    """The floor's parts, each a fresh process: read; read + CRC32C; read + CRC32C + add (of
    the data files: their bytes are nearly all tensor values)."""
    return {what: measure("import numpy as np", _FLOOR.format(files=files, crc=crc, add=add))
            for what, crc, add in (("read", False, False), ("read_crc", True, False), ("read_crc_add", True, True))}


def data_files(prefixes: list) -> list:
    out = []
    for p in prefixes:
        d, b = os.path.split(p)
        out += sorted(os.path.join(d, f) for f in os.listdir(d) if f.startswith(b + ".") and not f.startswith("."))
    return out


def mib(kib: int) -> float:
    return kib / 1024


def bench_average(root: Path, n: int, size_mib: int) -> dict:
    prefixes = write_run(root, n, size_mib)
    files = data_files(prefixes)
    cat, cat_cpu = min(cat_times(files) for _ in range(2))
    out = root / "avg"
    imports = ("import ckptmerge as cm, ckptmerge.combining.combine, ckptmerge.merging.dispatch, "
               "ckptmerge.formats.tf.writer, ckptmerge.formats.safetensors.writer, ckptmerge.planning.planner")
    load0 = os.getloadavg()[0]
    ours = measure(imports, f"cm.merge(cm.combine({str(root / 'run')!r}, last={n}), {str(out)!r}, overwrite=True)")
    # the same combination, its chunks made but not written: the write's share of the time
    unwritten = measure(imports, f"""
    h = cm.combine({str(root / 'run')!r}, last={n}).open()
    for v in h.all_variables:
        for _ in h.iter_chunks(v.name):
            pass
    h.close()
    """)
    floor = floors(files)
    load1 = os.getloadavg()[0]
    two = measure(imports, f"cm.merge(cm.combine({str(root / 'run')!r}, last=2), {str(root / 'avg2')!r}, overwrite=True)")
    base = measure("import numpy as np, ckptmerge as cm, ckptmerge.api, ckptmerge.formats.tf.bundle", f"""
    arrays = [cm.load(p) for p in {prefixes!r}]
    mean = {{k: np.mean(np.stack([a[k] for a in arrays]), axis=0, dtype=np.float64).astype(np.float32) for k in arrays[0]}}
    """)
    # the two results are the same numbers: float64 mean rounded to float32
    import ckptmerge as cm

    got = cm.load(str(out), ["layer_0/kernel"])["layer_0/kernel"]
    want = np.mean([cm.load(p, ["layer_0/kernel"])["layer_0/kernel"].astype(np.float64) for p in prefixes], axis=0)
    assert np.array_equal(got, want.astype(np.float32)), "the average differs from NumPy's"
    chunk_mib = CHUNK_ELEMENTS * 8 / (1 << 20)
    return {"n": n, "size_mib": size_mib, "cat_s": cat, "cat_cpu_s": cat_cpu, "ours": ours, "ours_n2": two,
            "numpy": base, "unwritten": unwritten, "floor": floor, "chunk_mib": chunk_mib, "load": [load0, load1]}


def mergekit_config(method: str, paths: list, density: float) -> str:
    base, fts = paths[0], paths[1:]
    if method == "ties":
        models = "\n".join(f"  - model: {p}\n    parameters: {{density: {density}, weight: 1.0}}" for p in fts)
        return f"merge_method: ties\nbase_model: {base}\nmodels:\n{models}\ndtype: float32\n"
    models = "\n".join(f"  - model: {p}\n    parameters: {{weight: {w}}}" for p, w in zip(fts, (1.0, 2.0, 3.0)))
    return f"merge_method: linear\nmodels:\n{models}\ndtype: float32\n"


def bench_mergekit(root: Path, size_mib: int, venv: str) -> dict:
    exe = os.path.join(venv, "bin", "mergekit-pytorch")
    if not os.path.exists(exe):
        return {"skipped": f"mergekit not installed ({exe} not found)"}
    paths = write_safetensors(root, size_mib)
    cat_time(paths)
    py = os.path.join(venv, "bin", "python")
    t0 = time.perf_counter()
    subprocess.run([exe, "--help"], capture_output=True, check=True)
    startup = time.perf_counter() - t0
    results = {"mergekit_startup_s": startup, "size_mib": size_mib}
    for method in ("ties", "linear"):
        cfg = root / f"{method}.yml"
        cfg.write_text(mergekit_config(method, paths, 0.5))
        mk_out = root / f"mk-{method}"
        shutil.rmtree(mk_out, ignore_errors=True)
        mk = measure("import subprocess",
                     f"subprocess.run([{exe!r}, {str(cfg)!r}, {str(mk_out)!r}, '--no-copy-tokenizer', "
                     "'--no-write-model-card'], check=True, capture_output=True)")
        ours_out = root / f"ours-{method}.safetensors"
        if method == "ties":
            call = (f"cm.merge(cm.combine({paths[1:]!r}, 'ties', base={paths[0]!r}, density=0.5), "
                    f"{str(ours_out)!r}, overwrite=True)")
        else:
            call = f"cm.merge(cm.combine({paths[1:]!r}, weights=[1.0, 2.0, 3.0]), {str(ours_out)!r}, overwrite=True)"
        ours = measure("import ckptmerge as cm, ckptmerge.combining.combine, ckptmerge.merging.dispatch, "
                       "ckptmerge.formats.safetensors.writer, ckptmerge.planning.planner", call)
        diff = subprocess.run([py, "-c", textwrap.dedent(f"""
            import glob, numpy as np
            from safetensors.numpy import load_file
            mk = {{}}
            for f in glob.glob({str(mk_out)!r} + '/*.safetensors'):
                mk.update(load_file(f))
            ours = load_file({str(ours_out)!r})
            assert sorted(mk) == sorted(ours), (sorted(mk)[:3], sorted(ours)[:3])
            worst, beyond, total = 0.0, 0, 0
            for k in mk:
                scale = float(np.abs(mk[k]).max()) or 1.0
                rel = np.abs(mk[k].astype(np.float64) - ours[k]) / scale
                worst = max(worst, float(rel.max()))
                beyond += int(np.count_nonzero(rel > 1e-6))  # more than float32 rounding of the range
                total += rel.size
            print(worst, beyond, total)
        """)], capture_output=True, text=True)
        if diff.returncode != 0:
            raise SystemExit(diff.stderr[-2000:])
        rel, beyond, total = diff.stdout.split()
        results[method] = {"mergekit": mk, "ours": ours, "max_rel_diff": float(rel), "beyond_rounding": int(beyond),
                           "elements": int(total)}
    return results


# ---- issue 34: safetensors and TF bundles against cat and a NumPy floor, medians of rounds ----

# The no-ckptmerge floor: each input's tensor bytes (safetensors: after the header; TF bundles:
# the data files) read a chunk at a time with np.fromfile, added into a float64 chunk, the mean
# rounded to float32 and written to a file; with ``crc``, each chunk's CRC32C computed as well
# (what verifying a TF bundle's checksums costs at least).
_NP_FLOOR = """
import os, struct, numpy as np
files, out, crc = {files!r}, {out!r}, {crc!r}
if crc:
    import crc32c
def start(f):
    if f.endswith(".safetensors"):
        with open(f, "rb") as fh:
            return 8 + struct.unpack("<Q", fh.read(8))[0]
    return 0
handles = [open(f, "rb") for f in files]
for h, f in zip(handles, files):
    h.seek(start(f))
count = min((os.path.getsize(f) - start(f)) // 4 for f in files)
CHUNK = 1 << 20
acc = np.empty(CHUNK, np.float64)
crcs = [0] * len(files)
with open(out, "wb") as o:
    for pos in range(0, count, CHUNK):
        k = min(CHUNK, count - pos)
        a = acc[:k]
        for j, h in enumerate(handles):
            x = np.fromfile(h, np.float32, k)
            if crc:
                crcs[j] = crc32c.crc32c(x, crcs[j])
            if j:
                np.add(a, x, out=a)
            else:
                np.copyto(a, x)
        a /= len(files)
        a.astype(np.float32).tofile(o)
"""


def write_safetensors_inputs(root: Path, n: int, size_mib: int) -> list:
    """``n`` safetensors files of about ``size_mib`` MiB of float32 (the shapes of :func:`layout`)."""
    from safetensors.numpy import save_file

    shapes = [(name.replace("/", "."), shape) for name, shape in layout(size_mib)]
    os.makedirs(root / "st", exist_ok=True)
    paths = []
    for k in range(n):
        rng = np.random.default_rng(100 + k)
        paths.append(str(root / "st" / f"model-{k}.safetensors"))
        save_file({name: rng.standard_normal(shape, dtype=np.float32) for name, shape in shapes}, paths[-1])
    return paths


def median_row(rounds: list) -> dict:
    """The median of each figure over the rounds (3 rounds: the middle one of each)."""
    import statistics

    return {k: statistics.median(r[k] for r in rounds) for k in rounds[0]}


def bench_issue34(root: Path, kind: str, n: int, size_mib: int, rounds: int) -> dict:
    """One input kind ("safetensors" or "tf"): cat, the NumPy floor and ckptmerge, ``rounds``
    interleaved rounds each (medians), and the peak RSS of averaging 2 of the inputs."""
    if kind == "safetensors":
        inputs = write_safetensors_inputs(root, n, size_mib)
        files, floor_files = inputs, inputs
        out = str(root / "avg.safetensors")
        writer = "ckptmerge.formats.safetensors.writer"
    else:
        inputs = write_run(root, n, size_mib)
        files = data_files(inputs)
        floor_files = [f for f in files if ".data-" in f]
        out = str(root / "avg")
        writer = "ckptmerge.formats.tf.writer"
    imports = f"import ckptmerge as cm, ckptmerge.combining.combine, ckptmerge.merging.dispatch, {writer}"
    ours_body = f"cm.merge(cm.combine({inputs!r}), {out!r}, overwrite=True)"
    floor_body = _NP_FLOOR.format(files=floor_files, out=str(root / "floor.bin"), crc=kind == "tf")
    load = [os.getloadavg()[0]]
    subprocess.run(["cat", *files], stdout=subprocess.DEVNULL, check=True)  # warm the page cache
    cats, floor_runs, ours_runs = [], [], []
    for _ in range(rounds):
        t, c = cat_times(files)
        cats.append({"time": t, "cpu": c})
        floor_runs.append(measure("import numpy as np", floor_body))
        ours_runs.append(measure(imports, ours_body))
        load.append(os.getloadavg()[0])
    out2 = str(root / "two") + (".safetensors" if kind == "safetensors" else "")
    two = measure(imports, f"cm.merge(cm.combine({inputs[:2]!r}), {out2!r}, overwrite=True)")
    # the result is the float64 mean rounded to float32, as NumPy makes it
    import ckptmerge as cm

    key = "layer_0.kernel" if kind == "safetensors" else "layer_0/kernel"
    got = cm.load(out, [key])[key]
    want = np.mean([cm.load(p, [key])[key].astype(np.float64) for p in inputs], axis=0).astype(np.float32)
    assert np.array_equal(got, want), f"the {kind} average differs from NumPy's"
    total = sum(os.path.getsize(f) for f in files)
    return {"kind": kind, "n": n, "size_mib": size_mib, "input_mib": total / (1 << 20), "rounds": rounds,
            "cat": median_row(cats), "floor": median_row(floor_runs), "ours": median_row(ours_runs),
            "ours_all": ours_runs, "ours_n2": two, "load": load}


def print_issue34(results: list) -> None:
    print(f"Averaging, page cache warm: medians of {results[0]['rounds']} interleaved rounds, each measured run "
          "a fresh process (imports not timed); CPU = user + system, every thread; 2-core machine")
    head = f"  {'':40}{'wall':>8}{'x cat':>7}{'CPU':>8}{'x cat':>7}{'peak RSS':>10}"
    for r in results:
        target = 1.6 if r["kind"] == "safetensors" else 2.0
        what = "safetensors" if r["kind"] == "safetensors" else "TF bundles, checksums verified"
        print(f"{r['n']} x {r['size_mib']} MiB {what} ({r['input_mib']:.0f} MiB read); load average "
              + ", ".join(f"{x:.1f}" for x in r["load"]))
        print(head)
        cat = r["cat"]

        def row(label: str, m: dict, cat: dict = cat) -> None:
            rss = f"{mib(m['hwm_kib']):6.0f} MiB" if "hwm_kib" in m else ""
            print(f"  {label:40}{m['time']:7.2f}s{m['time'] / cat['time']:6.2f}x{m['cpu']:7.2f}s"
                  f"{m['cpu'] / max(cat['cpu'], 1e-9):6.2f}x{rss:>10}")

        row("cat inputs > /dev/null", cat)
        row("NumPy floor (fromfile, float64)" + (" + CRC" if r["kind"] == "tf" else ""), r["floor"])
        row(f"ckptmerge combine + merge, N={r['n']}", r["ours"])
        row("ckptmerge combine + merge, N=2", r["ours_n2"])
        ratio = r["ours"]["time"] / cat["time"]
        print(f"  ckptmerge: {ratio:.2f}x cat (target <= {target}x: {'met' if ratio <= target else 'NOT met'}), "
              f"{r['ours']['time'] / r['floor']['time']:.2f}x the NumPy floor; rounds "
              + ", ".join(f"{m['time']:.2f}s" for m in r["ours_all"])
              + f"; peak RSS N=2 {mib(r['ours_n2']['hwm_kib']):.0f} MiB, N={r['n']} {mib(r['ours']['hwm_kib']):.0f} MiB")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=8, help="checkpoints to average (default 8)")
    ap.add_argument("--size-mib", type=int, default=256, help="MiB per checkpoint (default 256)")
    ap.add_argument("--mergekit", default="/work/venvs/mergekit", help="mergekit's venv, or 'none'")
    ap.add_argument("--json", action="store_true", help="print the figures as JSON")
    ap.add_argument("--small", action="store_true", help="a quick run: 8 x 8 MiB safetensors, 8 x 32 MiB TF, 1 round")
    ap.add_argument("--rounds", type=int, default=None, help="rounds of each timing (default 3; 1 with --small)")
    ap.add_argument("--detail", action="store_true", help="the older bench (--n, --size-mib, --mergekit)")
    args = ap.parse_args()
    if not args.detail:
        rounds = args.rounds or (1 if args.small else 3)
        root = Path(tempfile.mkdtemp(prefix="bench-combine-", dir="/tmp"))
        results = []
        try:
            for kind, size in (("safetensors", 8 if args.small else 64), ("tf", 32 if args.small else 256)):
                results.append(bench_issue34(root / kind, kind, 8, size, rounds))
                shutil.rmtree(root / kind, ignore_errors=True)
        finally:
            shutil.rmtree(root, ignore_errors=True)
        if args.json:
            print(json.dumps(results, indent=2))
        else:
            print_issue34(results)
        return
    root = Path(tempfile.mkdtemp(prefix="bench-combine-", dir="/tmp"))
    try:
        avg = bench_average(root, args.n, args.size_mib)
        shutil.rmtree(root / "run")
        mk = {"skipped": "--mergekit none"} if args.mergekit == "none" else bench_mergekit(root, args.size_mib,
                                                                                         args.mergekit)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    if args.json:
        print(json.dumps({"average": avg, "mergekit": mk}, indent=2))
        return
    o, b = avg["ours"], avg["numpy"]
    target = 64 + 4 * avg["chunk_mib"]
    print(f"Averaging {avg['n']} checkpoints of {avg['size_mib']} MiB (TF bundles, float32; chunk = "
          f"{CHUNK_ELEMENTS:,} elements = {avg['chunk_mib']:.0f} MiB of float64 accumulator)")
    cat, cat_cpu = avg["cat_s"], avg["cat_cpu_s"]
    print(f"  (load average {avg['load'][0]:.1f} before, {avg['load'][1]:.1f} after; CPU time: user + system, "
          "every thread)")
    print(f"  {'':40}{'time':>8}{'x cat':>8}{'CPU':>8}{'x cat':>8}{'peak RSS':>10}{'after imports':>15}")

    def row(label: str, r: dict) -> None:
        rss = f"{mib(r['hwm_kib']):6.0f} MiB{mib(r['rss0_kib']):11.0f} MiB" if "hwm_kib" in r else ""
        print(f"  {label:40}{r['time']:7.2f}s{r['time'] / cat:7.2f}x{r['cpu']:7.2f}s{r['cpu'] / cat_cpu:7.2f}x{rss}")

    row("cat every input > /dev/null", {"time": cat, "cpu": cat_cpu})
    f = avg["floor"]
    row("floor: read each input once (1 thread)", f["read"])
    row("floor: + CRC32C", f["read_crc"])
    row("floor: + add into float64, mean", f["read_crc_add"])
    row("numpy: load all, then mean", b)
    row("ckptmerge combine + merge (TF)", o)
    row("  the same, not written", avg["unwritten"])
    row("  the same, of the last 2 only", avg["ours_n2"])
    w = avg["unwritten"]
    print(f"  time: {o['time'] / cat:.2f}x reading every input once (target <= 1.3x), "
          f"{o['time'] / b['time']:.2f}x numpy's; the write's share {max(0.0, o['time'] - w['time']):.2f}s "
          f"({max(0.0, o['time'] - w['time']) / o['time']:.0%}); the one-thread floor "
          f"{f['read_crc_add']['time'] / cat:.2f}x cat in time, {f['read_crc_add']['cpu'] / cat_cpu:.2f}x in CPU")
    print(f"  peak RSS: {mib(o['hwm_kib']):.0f} MiB (target <= 64 MiB + 4 x {avg['chunk_mib']:.0f} MiB = {target:.0f} MiB), "
          f"{o['hwm_kib'] / b['hwm_kib']:.3f}x numpy's; above the imports: {mib(o['hwm_kib'] - o['rss0_kib']):.0f} MiB")
    if "skipped" in mk:
        print(f"mergekit: skipped ({mk['skipped']})")
        return
    print(f"Against mergekit-pytorch ({mk['size_mib']} MiB safetensors: base + 3 fine-tunes; mergekit's startup "
          f"alone: {mk['mergekit_startup_s']:.1f}s)")
    for method in ("ties", "linear"):
        r = mk[method]
        work = r['mergekit']['time'] - mk['mergekit_startup_s']  # (its startup, timed once: noisy)
        print(f"  {method:7} mergekit {r['mergekit']['time']:6.2f}s  ckptmerge {r['ours']['time']:6.2f}s "
              f"({r['ours']['time'] / r['mergekit']['time']:.2f}x; against mergekit less its startup: "
              + (f"{r['ours']['time'] / work:.2f}x" if work > 0 else "n/a, its run took less than its startup alone")
              + ")  "
              f"peak RSS ckptmerge {mib(r['ours']['hwm_kib']):.0f} MiB, mergekit {mib(r['mergekit']['children_kib']):.0f} MiB")
        print(f"          results: largest difference {r['max_rel_diff']:.2e} of the tensor's range; "
              f"{r['beyond_rounding']:,} of {r['elements']:,} elements beyond float32 rounding (1e-6 of the range: "
              "TIES's ties, at the trim cut or a sign sum of 0, where the formula leaves the choice open)")


if __name__ == "__main__":
    main()
