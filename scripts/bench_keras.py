"""Keras weights-file benchmark (issue 20): a ``.weights.h5`` restore vs Keras's own ``load_weights``.

Workloads, each a Keras 3 model on the TensorFlow backend and the ``.weights.h5`` file it saved:
- ResNet50 (``keras.applications.ResNet50(weights=None)``: 320 variables, 25.6 M parameters,
  98 MiB of float32): a real architecture, functional, with BatchNormalization;
- ResNet50 with its built Adam optimizer, restored with ``optimizer=True`` / by ``load_weights``
  (the file then holds three times the variables);
- a Sequential of 400 small Dense layers (800 variables, 6 MiB): the walk of the model, not the
  reading, is the cost.

Contenders, each into the same model, interleaved round by round (the order alternating), from
page cache (one warm-up round first); medians of ROUNDS rounds:
- ``load_weights``: ``model.load_weights(path)``;
- ``cm.restore``: ``cm.restore(model, [cm.Source(path)])``: names every entry by the model's own
  walk, plans, reads and assigns, every round (what one call of ``load_weights`` does);
- ``plan once``: the plan made once, ``plan.restore()`` each round (a ``Restorer``'s repeated
  restores).
The ratio is ckptmerge's time over ``load_weights``' (below 1: ckptmerge is faster).

Run: python scripts/bench_keras.py [--rounds 7] [--dir /tmp/ckptmerge-bench-keras]
"""

from __future__ import annotations

import argparse
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench_restore import interleaved  # noqa: E402 - the same rounds, order alternating, medians


def _resnet(keras, optimizer: bool):
    model = keras.applications.ResNet50(weights=None, input_shape=(224, 224, 3))
    if optimizer:
        model.compile(optimizer="adam", loss="mse")
        model.optimizer.build(model.trainable_variables)
    return model


def _dense_stack(keras, optimizer: bool):
    return keras.Sequential([keras.Input((32,))] + [keras.layers.Dense(32) for _ in range(400)])


WORKLOADS = [("ResNet50 (320 variables, 98 MiB)", _resnet, False),
             ("ResNet50 + Adam, optimizer=True", _resnet, True),
             ("400 Dense layers (800 variables, 6 MiB)", _dense_stack, False)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--dir", default="/tmp/ckptmerge-bench-keras")
    args = parser.parse_args()
    import keras
    import numpy as np

    import ckptmerge as cm

    os.makedirs(args.dir, exist_ok=True)
    print(f"Keras {keras.__version__}, backend {keras.backend.backend()}; medians of {args.rounds} rounds")
    print(f"{'workload':42} {'load_weights':>13} {'cm.restore':>11} {'ratio':>6} {'plan once':>10} {'ratio':>6}")
    for title, build, optimizer in WORKLOADS:
        model = build(keras, optimizer)
        rng = np.random.default_rng(0)
        for v in model.weights:
            v.assign(rng.standard_normal(tuple(v.shape)).astype(v.dtype))
        path = os.path.join(args.dir, f"{build.__name__.strip('_')}{'-opt' if optimizer else ''}.weights.h5")
        model.save_weights(path)
        target = build(keras, optimizer)
        plan = cm.plan(target, [cm.Source(path, optimizer=optimizer)])
        assert plan.ok, plan.report()
        times = interleaved({
            "load_weights": lambda: target.load_weights(path),
            "cm.restore": lambda: cm.restore(target, [cm.Source(path, optimizer=optimizer)]),
            "plan once": lambda: plan.restore(),
        }, args.rounds)
        for a, b in zip(model.weights, target.weights):  # the same values, both ways
            assert np.array_equal(a.numpy(), b.numpy())
        base = times["load_weights"]
        print(f"{title:42} {base:12.3f}s {times['cm.restore']:10.3f}s {times['cm.restore'] / base:5.2f}x "
              f"{times['plan once']:9.3f}s {times['plan once'] / base:5.2f}x", flush=True)
        plan._binding.close()


if __name__ == "__main__":
    main()
