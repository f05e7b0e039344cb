"""Restore benchmark: ckptmerge vs hand-written Savers vs the physical floor, side by side.

Workload (core issue): two checkpoints, each 16 float32 tensors of 1024x4096 (256 MB each,
512 MB in all), restored into one model. Every contender runs in this one process, interleaved
round by round, from page cache (one warm-up read first); medians of ROUNDS rounds.

Contenders:
- graph, canonical: one tf.compat.v1.train.Saver per source from a {checkpoint_name: variable}
  dict, saver.restore() each, one after the other (Savers built once, outside the timing);
- graph, ckptmerge: plan once, plan.restore(session) each round;
- eager, canonical: the same Saver code in eager mode;
- eager, ckptmerge: plan once, plan.restore() each round;
- floor: numpy.fromfile of the same .data files.
- eager, from safetensors: the same tensors as .safetensors files (written once), restored with
  the same plan options, beside eager ckptmerge from the TF checkpoints (target <= 1.1x).
With --repeat (issue 5) it also measures a Restorer's 1st vs 100th restore, a Saver rebuilt per
restore, and restoring from an in-memory snapshot.

Run: python scripts/bench_restore.py [--rounds 11] [--dir /tmp/ckptmerge-bench] [--repeat]
"""

from __future__ import annotations

import argparse
import glob
import os
import statistics
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import numpy as np  # noqa: E402

N_TENSORS, SHAPE = 16, (1024, 4096)


def write_checkpoints(root: str) -> list:
    """Write checkpoints A and B once (reused across runs)."""
    import tensorflow as tf

    prefixes = []
    for label in ("A", "B"):
        prefix = os.path.join(root, label, "model")
        if not os.path.exists(prefix + ".index"):
            os.makedirs(os.path.dirname(prefix), exist_ok=True)
            rng = np.random.default_rng(ord(label))
            graph = tf.Graph()
            with graph.as_default():
                vs = {f"{label.lower()}{i}": tf.compat.v1.get_variable(
                    f"{label.lower()}{i}", initializer=rng.standard_normal(SHAPE, dtype=np.float32))
                    for i in range(N_TENSORS)}
                with tf.compat.v1.Session(graph=graph) as sess:
                    sess.run(tf.compat.v1.global_variables_initializer())
                    tf.compat.v1.train.Saver(vs).save(sess, prefix)
        prefixes.append(prefix)
    return prefixes


def median_time(fn, rounds: int) -> float:
    times = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def interleaved(contenders: dict, rounds: int) -> dict:
    """Run every contender once per round, in turn, and return medians."""
    times = {k: [] for k in contenders}
    for fn in contenders.values():  # warm-up (page cache, graph building)
        fn()
    order = list(contenders.items())
    for r in range(rounds):
        # Alternate the order each round: whoever runs second inherits the first one's freed
        # buffers and page-cache state, which otherwise biases a fixed order.
        for k, fn in (order if r % 2 == 0 else order[::-1]):
            t0 = time.perf_counter()
            fn()
            times[k].append(time.perf_counter() - t0)
    return {k: statistics.median(v) for k, v in times.items()}


def model_c_names(prefixes):
    """{checkpoint name: target name} for both sources: a{i} -> c/x{i}, b{i} -> c/y{i}."""
    maps = []
    for label, _ in zip("ab", prefixes):
        maps.append({f"{label}{i}": f"c/{'x' if label == 'a' else 'y'}{i}" for i in range(N_TENSORS)})
    return maps


def floor(prefixes):
    files = sorted(f for p in prefixes for f in glob.glob(p + ".data-*"))

    def run():
        for f in files:
            np.fromfile(f, dtype=np.uint8)
    return run


def bench_graph(prefixes, maps, rounds):
    import tensorflow as tf

    import ckptmerge as cm

    graph = tf.Graph()
    with graph.as_default():
        tvars = {t: tf.compat.v1.get_variable(t, shape=SHAPE, initializer=tf.compat.v1.zeros_initializer())
                 for m in maps for t in m.values()}
        savers = [tf.compat.v1.train.Saver({k: tvars[t] for k, t in m.items()}) for m in maps]
        sess = tf.compat.v1.Session(graph=graph)
        sess.run(tf.compat.v1.global_variables_initializer())
        plan = cm.plan(None, [cm.Source(p, map=m) for p, m in zip(prefixes, maps)])

        def canonical():
            for s, p in zip(savers, prefixes):
                s.restore(sess, p)

        def ours():
            plan.restore(session=sess)

        res = interleaved({"graph canonical Savers": canonical, "graph ckptmerge": ours,
                           "floor numpy.fromfile": floor(prefixes)}, rounds)
        check = sess.run(tvars["c/x3"])
    return res, check


def bench_eager(prefixes, maps, rounds):
    import tensorflow as tf

    import ckptmerge as cm

    tvars = {t: tf.Variable(tf.zeros(SHAPE), name=t) for m in maps for t in m.values()}
    savers = [tf.compat.v1.train.Saver({k: tvars[t] for k, t in m.items()}) for m in maps]
    plan = cm.plan(tvars, [cm.Source(p, map=m) for p, m in zip(prefixes, maps)])

    def canonical():
        for s, p in zip(savers, prefixes):
            s.restore(None, p)

    def ours():
        plan.restore()

    res = interleaved({"eager canonical Savers": canonical, "eager ckptmerge": ours,
                       "floor numpy.fromfile": floor(prefixes)}, rounds)
    return res, tvars["c/x3"].numpy()


def write_safetensors(prefixes) -> list:
    """The same tensors as each checkpoint, as ``<prefix>.safetensors`` (written once)."""
    import ckptmerge as cm
    from ckptmerge.formats.safetensors.writer import SafetensorsWriter

    paths = []
    for p in prefixes:
        path = p + ".safetensors"
        if not os.path.exists(path):
            values = cm.load(p)
            with SafetensorsWriter(path, [(k, str(v.dtype), v.shape) for k, v in values.items()]) as w:
                for k, v in values.items():
                    w.add(k, v)
        paths.append(path)
    return paths


def bench_safetensors(prefixes, maps, rounds):
    """Eager restore of the same tensors from TF checkpoints and from safetensors files."""
    import tensorflow as tf

    import ckptmerge as cm

    st_paths = write_safetensors(prefixes)
    tvars = {t: tf.Variable(tf.zeros(SHAPE), name=t) for m in maps for t in m.values()}
    from_tf = cm.plan(tvars, [cm.Source(p, map=m) for p, m in zip(prefixes, maps)])
    from_st = cm.plan(tvars, [cm.Source(p, map=m) for p, m in zip(st_paths, maps)])
    res = interleaved({"eager from TF checkpoint": from_tf.restore, "eager from safetensors": from_st.restore},
                      max(rounds, 21))  # two nearly equal contenders: more rounds for a stable median
    return res, tvars["c/x3"].numpy()


def bench_repeat(prefixes, maps, rounds):
    """Issue 5: a Restorer's 1st vs 100th restore, a Saver rebuilt per restore, snapshots."""
    import tensorflow as tf

    import ckptmerge as cm

    print("repeated restores (graph mode):")
    graph = tf.Graph()
    with graph.as_default():
        tvars = {t: tf.compat.v1.get_variable(t, shape=SHAPE, initializer=tf.compat.v1.zeros_initializer())
                 for m in maps for t in m.values()}
        sess = tf.compat.v1.Session(graph=graph)
        sess.run(tf.compat.v1.global_variables_initializer())
        restorer = cm.Restorer(None, [cm.Source(p, map=m) for p, m in zip(prefixes, maps)], session=sess)
        t0 = time.perf_counter()
        restorer.restore()
        first = time.perf_counter() - t0
        ops_after_first = len(graph.get_operations())
        times = []
        for i in range(2, 101 + rounds // 2):
            t0 = time.perf_counter()
            restorer.restore()
            if i >= 100 - rounds // 2:
                times.append(time.perf_counter() - t0)
        hundredth = statistics.median(times)
        print(f"  Restorer 1st restore {first * 1000:.1f} ms, 100th (median of restores "
              f"{100 - rounds // 2}-{100 + rounds // 2}) {hundredth * 1000:.1f} ms: ratio "
              f"{hundredth / first:.2f} (target <= 1.05); graph ops {ops_after_first} -> "
              f"{len(graph.get_operations())} after {restorer.count} restores")
        n0 = len(graph.get_operations())
        per = []
        for _ in range(rounds):
            t0 = time.perf_counter()
            for p, m in zip(prefixes, maps):
                tf.compat.v1.train.Saver({k: tvars[t] for k, t in m.items()}).restore(sess, p)
            per.append(time.perf_counter() - t0)
        print(f"  Saver rebuilt per restore: {statistics.median(per) * 1000:.1f} ms per restore; graph ops "
              f"{n0} -> {len(graph.get_operations())} after {rounds} restores (+"
              f"{(len(graph.get_operations()) - n0) // rounds} per restore)")
    print("in-memory snapshot vs disk (eager mode):")
    evars = {t: tf.Variable(tf.zeros(SHAPE), name=t) for m in maps for t in m.values()}
    disk = cm.Restorer(evars, [cm.Source(p, map=m) for p, m in zip(prefixes, maps)])
    disk.restore()
    snap = cm.Restorer(evars, [cm.snapshot(evars)])
    res = interleaved({"disk": disk.restore, "snapshot": snap.restore}, rounds)
    print(f"  restore from disk {res['disk'] * 1000:.1f} ms, from snapshot {res['snapshot'] * 1000:.2f} ms: "
          f"ratio {res['snapshot'] / res['disk']:.3f} (target <= 0.1)")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=11)
    ap.add_argument("--dir", default="/tmp/ckptmerge-bench")
    ap.add_argument("--repeat", action="store_true", help="also run the repeated/snapshot benchmarks")
    args = ap.parse_args(argv)
    prefixes = write_checkpoints(args.dir)
    maps = model_c_names(prefixes)
    import ckptmerge as cm

    want = cm.load(prefixes[0], ["a3"])["a3"]
    print(f"workload: 2 checkpoints x {N_TENSORS} float32 {SHAPE} = "
          f"{2 * N_TENSORS * np.prod(SHAPE) * 4 / 2**20:.0f} MiB; medians of {args.rounds} rounds")
    g, gcheck = bench_graph(prefixes, maps, args.rounds)
    e, echeck = bench_eager(prefixes, maps, args.rounds)
    assert np.array_equal(gcheck, want) and np.array_equal(echeck, want), "restored values differ"
    for section in (g, e):
        for k, v in section.items():
            print(f"  {k:<28} {v * 1000:8.1f} ms")
    print("ratios (target: vs canonical <= 0.90, vs floor <= 1.15):")
    print(f"  graph ckptmerge / canonical  {g['graph ckptmerge'] / g['graph canonical Savers']:.2f}")
    print(f"  eager ckptmerge / canonical  {e['eager ckptmerge'] / e['eager canonical Savers']:.2f}")
    print(f"  graph ckptmerge / floor      {g['graph ckptmerge'] / g['floor numpy.fromfile']:.2f}")
    print(f"  eager ckptmerge / floor      {e['eager ckptmerge'] / e['floor numpy.fromfile']:.2f}")
    st, stcheck = bench_safetensors(prefixes, maps, args.rounds)
    assert np.array_equal(stcheck, want), "values restored from safetensors differ"
    for k, v in st.items():
        print(f"  {k:<28} {v * 1000:8.1f} ms")
    print(f"  safetensors / TF checkpoint  {st['eager from safetensors'] / st['eager from TF checkpoint']:.2f} "
          "(target <= 1.10)")
    if args.repeat:
        bench_repeat(prefixes, maps, args.rounds)
    return 0


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    sys.exit(main())
