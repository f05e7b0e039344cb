"""Following a training run (issue 22): ckptmerge's ``Restorer.follow`` vs TensorFlow's
``tf.train.checkpoints_iterator`` + ``tf.train.Checkpoint.restore``, side by side.

A trainer runs in a child process: TensorFlow's ``CheckpointManager`` saving one float32
variable of ``--mib`` MiB (filled with the step number) every ``--interval`` seconds, keeping
``max_to_keep`` checkpoints (it deletes the older ones as it saves). The follower runs in another
child process, one contender at a time:

- ``ckptmerge``: ``cm.Restorer(...).follow(dir, poll=POLL)``, file-system notifications on (Linux);
- ``ckptmerge-poll``: the same with ``notify=False`` (polling only, backing off to ``POLL``);
- ``tf``: ``for path in tf.train.checkpoints_iterator(dir): ckpt.restore(path)`` (a fixed 1 s poll
  of the ``checkpoint`` state file, the newest checkpoint only).

Three measurements:

1. **latency**: from a checkpoint's final file appearing (the newest modification time of its
   ``.index`` and data files) to the follower holding its restore, per checkpoint (median and max
   over ``--count`` checkpoints at ``--interval`` s, after one warm-up checkpoint), beside the
   restore time itself; target:
   latency <= one poll interval + the restore time.
2. **idle CPU**: a follower of a directory holding 100 old checkpoints where nothing happens, for
   ``--idle`` seconds: CPU seconds of the follower's process (all threads) per wall second;
   target < 1% of one core.
3. **cleanup racing the reader**: ``--steps`` (1,000) trainer steps saving as fast as TF saves,
   ``max_to_keep=2``; the follower restores each checkpoint it gets and checks that every value is
   the step's (a mix would be a torn restore). Reported: restored, skipped (never restored),
   failed (the restore raised, e.g. the files were deleted under it), torn. Target for
   ``backlog="all"``: 0 torn, 0 skipped. ("Skipped" counts steps never restored; ckptmerge reports
   those it saw and could not pin or read, "reported"; one written and deleted between two looks is
   never seen.)

Run: python scripts/bench_watch.py [--dir /tmp/ckptmerge-bench-watch] [--poll 1.0] [--count 10]
     [--interval 1.5] [--idle 30] [--steps 1000] [--mib 1] [--only latency,idle,race]
     [--modes ckptmerge,ckptmerge-poll,tf]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import textwrap

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ENV = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", PYTHONPATH=REPO)

TRAINER = textwrap.dedent("""
    import os, sys, time
    import numpy as np
    import tensorflow as tf
    directory, steps, interval, keep, mib, ready = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), \\
        int(sys.argv[4]), float(sys.argv[5]), sys.argv[6]
    n = int(mib * (1 << 20) // 4)
    v = tf.Variable(np.zeros(n, np.float32))
    manager = tf.train.CheckpointManager(tf.train.Checkpoint(v=v), directory, max_to_keep=keep)
    while not os.path.exists(ready):  # the follower is up and watching
        time.sleep(0.01)
    for step in range(1, steps + 1):
        v.assign(np.full(n, step, np.float32))
        manager.save(checkpoint_number=step)
        if interval:
            time.sleep(interval)
    print("trained", steps, flush=True)
""")

FOLLOWER = textwrap.dedent("""
    import json, os, sys, time
    import numpy as np
    import tensorflow as tf
    import ckptmerge as cm
    mode, directory, template, poll, timeout, limit, ready, idle = sys.argv[1], sys.argv[2], sys.argv[3], \\
        float(sys.argv[4]), float(sys.argv[5]), int(sys.argv[6]), sys.argv[7], sys.argv[8] == "idle"
    v = tf.Variable(np.zeros(tf.train.load_checkpoint(template).get_variable_to_shape_map()["v/.ATTRIBUTES/VARIABLE_VALUE"],
                             np.float32))
    out = {"restores": [], "failed": [], "reported": [], "torn": []}

    def skipped(info, err):  # ckptmerge's report of a checkpoint it did not restore
        out["failed" if isinstance(err, cm.RestoreError) else "reported"].append(info.step)

    def last_file_time(prefix):
        d, base = os.path.split(prefix)
        times = [os.stat(os.path.join(d, f)).st_mtime for f in os.listdir(d) if f.startswith(base + ".")]
        return max(times) if times else None

    def check(step):
        values = v.numpy()
        if not (values == step).all():
            out["torn"].append(step)

    if mode.startswith("ckptmerge"):
        restorer = cm.Restorer({"v": v}, [cm.Source(template)])
        after = limit if idle else 0  # idle: the old checkpoints are not new
        open(ready, "w").close()
        cpu0, wall0 = time.process_time(), time.time()
        for report in restorer.follow(directory, poll=poll, timeout=timeout, notify=(mode == "ckptmerge"),
                                      after=after, on_skip=skipped):
            now = time.time()
            step = report.checkpoint.step
            final = report.checkpoint.time  # the index's time: TF writes it after the data
            out["restores"].append([step, now - final, report.elapsed])
            check(step)
            if step >= limit:
                break
    else:
        ckpt = tf.train.Checkpoint(v=v)
        open(ready, "w").close()
        cpu0, wall0 = time.process_time(), time.time()
        for path in tf.train.checkpoints_iterator(directory, timeout=timeout):
            step = int(path.rsplit("-", 1)[1])
            final = last_file_time(path)
            t0 = time.time()
            try:
                ckpt.restore(path).assert_existing_objects_matched()
            except Exception as e:
                out["failed"].append(step)
                continue
            now = time.time()
            out["restores"].append([step, (now - final) if final else None, now - t0])
            check(step)
            if idle:  # the latest old one is restored once: count the idle time from here
                cpu0, wall0 = time.process_time(), time.time()
                continue
            if step >= limit:
                break
    out["cpu"], out["wall"] = time.process_time() - cpu0, time.time() - wall0
    print(json.dumps(out))
""")


def _template(root: str, mib: float) -> str:
    import numpy as np
    import tensorflow as tf

    path = os.path.join(root, f"template-{mib:g}", "ckpt")
    if not os.path.exists(path + ".index"):
        tf.train.Checkpoint(v=tf.Variable(np.zeros(int(mib * (1 << 20) // 4), np.float32))).write(path)
    return path


def _run(mode: str, root: str, template: str, *, poll: float, steps: int, interval: float, keep: int,
         mib: float, timeout: float, idle: bool = False, prefill: int = 0) -> dict:
    run = os.path.join(root, f"run-{mode}")
    shutil.rmtree(run, ignore_errors=True)
    os.makedirs(run)
    ready = os.path.join(root, f"ready-{mode}")
    if os.path.exists(ready):
        os.unlink(ready)
    trainer = None
    if prefill:  # old checkpoints, then nothing new: the idle case
        subprocess.run([sys.executable, "-c", TRAINER, run, str(prefill), "0", str(prefill), str(mib), run],
                       env=ENV, check=True, capture_output=True)
    else:
        trainer = subprocess.Popen([sys.executable, "-c", TRAINER, run, str(steps), str(interval), str(keep),
                                    str(mib), ready], env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    limit = prefill if idle else steps
    follower = subprocess.run([sys.executable, "-c", FOLLOWER, mode, run, template, str(poll), str(timeout),
                               str(limit), ready, "idle" if idle else "run"], env=ENV, capture_output=True,
                              text=True, timeout=timeout + 600)
    if trainer is not None:
        trainer.wait(600)
    if follower.returncode != 0:
        raise SystemExit(f"{mode} follower failed:\n{follower.stderr[-3000:]}")
    return json.loads(follower.stdout.strip().splitlines()[-1])


MODES = ("ckptmerge", "ckptmerge-poll", "tf")


def latency(args, template):
    print(f"\n1. Latency: {args.count} checkpoints of {args.mib:g} MiB, one every {args.interval:g} s "
          f"(poll={args.poll:g} s for ckptmerge; TF polls every 1 s)")
    print(f"{'follower':<16}{'median':>10}{'max':>10}{'restore (median)':>18}{'latency - restore, max':>24}")
    base = None
    for mode in args.modes:
        out = _run(mode, args.dir, template, poll=args.poll, steps=args.count + 1, interval=args.interval, keep=3,
                   mib=args.mib, timeout=args.interval * 4 + 30)
        rows = [r for r in out["restores"] if r[1] is not None and r[0] > 1]  # step 1: the warm-up
        lat = [r[1] for r in rows]
        med = statistics.median(lat)
        base = med if mode == "tf" else base
        extra = max(r[1] - r[2] for r in rows)
        print(f"{mode:<16}{med * 1e3:>8.0f}ms{max(lat) * 1e3:>8.0f}ms{statistics.median(r[2] for r in rows) * 1e3:>16.0f}ms"
              f"{extra * 1e3:>22.0f}ms   ({len(rows)} restores)")
        args.results.setdefault("latency", {})[mode] = {"median": med, "max": max(lat), "extra_max": extra}
    for mode in [m for m in args.modes if m != "tf" and "tf" in args.modes]:
        r = args.results["latency"][mode]["median"] / args.results["latency"]["tf"]["median"]
        print(f"  {mode}: median latency {r:.2f}x TF's")


def idle(args, template):
    print(f"\n2. Idle: 100 old checkpoints, nothing new, {args.idle:g} s (poll={args.poll:g} s)")
    for mode in args.modes:
        out = _run(mode, args.dir, _template(args.dir, 0.01), poll=args.poll, steps=0, interval=0, keep=100,
                   mib=0.01, timeout=args.idle, idle=True, prefill=100)
        share = out["cpu"] / out["wall"]
        print(f"{mode:<16}{out['cpu']:>8.3f} CPU s in {out['wall']:.1f} s = {share * 100:.3f}% of a core")
        args.results.setdefault("idle", {})[mode] = share


def race(args, template):
    print(f"\n3. Cleanup racing the reader: {args.steps} steps as fast as TF saves, max_to_keep=2, "
          f"{args.mib:g} MiB each")
    print(f"{'follower':<16}{'restored':>10}{'skipped':>10}{'of them reported':>18}{'failed':>8}{'torn':>6}{'wall':>8}")
    for mode in args.modes:
        out = _run(mode, args.dir, template, poll=min(args.poll, 0.05), steps=args.steps, interval=0, keep=2,
                   mib=args.mib, timeout=60)
        got = {r[0] for r in out["restores"]}
        skipped = args.steps - len(got)
        print(f"{mode:<16}{len(got):>10}{skipped:>10}{len(out['reported']):>18}{len(out['failed']):>8}"
              f"{len(out['torn']):>6}{out['wall']:>7.1f}s")
        args.results.setdefault("race", {})[mode] = {"restored": len(got), "skipped": skipped,
                                                     "reported": len(out["reported"]),
                                                     "failed": len(out["failed"]), "torn": len(out["torn"])}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dir", default=os.path.join("/tmp", "ckptmerge-bench-watch"))
    p.add_argument("--poll", type=float, default=1.0, help="ckptmerge's poll upper bound (s)")
    p.add_argument("--count", type=int, default=10, help="checkpoints for the latency run")
    p.add_argument("--interval", type=float, default=1.5, help="seconds between checkpoints (latency run)")
    p.add_argument("--idle", type=float, default=30.0, help="seconds of the idle run")
    p.add_argument("--steps", type=int, default=1000, help="trainer steps of the race run")
    p.add_argument("--mib", type=float, default=1.0, help="checkpoint size (MiB)")
    p.add_argument("--only", default="latency,idle,race")
    p.add_argument("--modes", default=",".join(MODES), help="followers to run (default: all three)")
    args = p.parse_args()
    args.results = {}
    args.modes = args.modes.split(",")
    os.makedirs(args.dir, exist_ok=True)
    with open("/proc/loadavg") if os.path.exists("/proc/loadavg") else open(os.devnull) as f:
        print(f"load average at start: {f.read().split(' ')[:3]}")
    template = _template(args.dir, args.mib)
    parts = args.only.split(",")
    for name, fn in (("latency", latency), ("idle", idle), ("race", race)):
        if name in parts:
            fn(args, template)
    print("\n" + json.dumps(args.results))


if __name__ == "__main__":
    main()
