"""V1 checkpoint reading benchmark: ckptmerge's TF-free reader vs ``tf.train.load_checkpoint``.

Workload (issue 11, V1 checkpoints): one V1 checkpoint written once with
``tf.compat.v1.train.Saver(write_version=V1)`` and cached (default ``/tmp/ckptmerge-bench-v1``):
2,000 small float32 variables (16x16), one 48 MB float32 matrix (3000x4000) and one int64 matrix
of 1M elements (varint-encoded in the file, the slowest kind to decode). Each round reads every
tensor, in the same process, one contender after the other:

- TF:        ``tf.train.load_checkpoint(path)`` then ``get_tensor`` for each name
- ckptmerge: ``ckptmerge.formats.open_checkpoint(path)`` then ``read_many(all names)``

One warm-up round (page cache), then medians of ``--rounds`` rounds, and a check that both give
the same values. No target was set for V1 reading; the ratio is informational.

Run: python scripts/bench_v1.py [--rounds 5] [--dir /tmp/ckptmerge-bench-v1]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")


def build_checkpoint(root: Path) -> str:
    """Write (once) the V1 checkpoint of the workload; return its path."""
    path = root / "model.ckpt"
    if path.exists():
        return str(path)
    import numpy as np
    import tensorflow as tf

    root.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    values = {f"small/v{i}": rng.standard_normal((16, 16)).astype(np.float32) for i in range(2000)}
    values["big/kernel"] = rng.standard_normal((3000, 4000)).astype(np.float32)
    values["ids"] = rng.integers(-2**40, 2**40, size=(1000, 1000))
    graph = tf.Graph()
    with graph.as_default():
        for name, value in values.items():
            tf.compat.v1.get_variable(name, initializer=value)
        saver = tf.compat.v1.train.Saver(write_version=tf.compat.v1.train.SaverDef.V1)
        with tf.compat.v1.Session(graph=graph) as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            saver.save(sess, str(path), write_meta_graph=False)
    return str(path)


def read_tf(path: str) -> dict:
    import tensorflow as tf

    reader = tf.train.load_checkpoint(path)
    return {name: reader.get_tensor(name) for name in reader.get_variable_to_shape_map()}


def read_ckptmerge(path: str) -> dict:
    from ckptmerge.formats import open_checkpoint

    with open_checkpoint(path) as reader:
        return reader.read_many(reader.names())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--dir", default="/tmp/ckptmerge-bench-v1")
    args = parser.parse_args()
    import numpy as np

    path = build_checkpoint(Path(args.dir))
    size = os.path.getsize(path)
    theirs, ours = read_tf(path), read_ckptmerge(path)  # warm-up, and the sanity check
    assert sorted(theirs) == sorted(ours) and all(np.array_equal(theirs[k], ours[k]) for k in theirs)
    times = {"tf": [], "ckptmerge": []}
    for _ in range(args.rounds):
        for label, fn in (("tf", read_tf), ("ckptmerge", read_ckptmerge)):
            start = time.perf_counter()
            fn(path)
            times[label].append(time.perf_counter() - start)
    tf_s, cm_s = statistics.median(times["tf"]), statistics.median(times["ckptmerge"])
    print(f"V1 checkpoint: {len(ours)} tensors, {size / 2**20:.1f} MiB ({args.rounds} rounds, medians)")
    print(f"  tf.train.load_checkpoint  {tf_s:7.3f} s")
    print(f"  ckptmerge (TF-free)       {cm_s:7.3f} s")
    print(f"  time ratio ckptmerge/tf   {cm_s / tf_s:7.2f}")


if __name__ == "__main__":
    main()
