"""Check ckptmerge's Keras weights-file restores against the installed Keras's own ``load_weights``.

For verifying another Keras release (docs/names.md names the verified ones): run it with that
Keras installed, on any backend (``KERAS_BACKEND=jax``, ``numpy``, ``torch`` or ``tensorflow``),
e.g. in a venv that has no TensorFlow:

    KERAS_BACKEND=jax PYTHONPATH=. /path/to/venv/bin/python scripts/keras_parity.py

Each scenario (a subset of tests/test_keras_parity.py, which the test suite runs with the
project's own Keras): Keras saves a model with random values, ckptmerge and ``load_weights`` each
load the file into a fresh twin, and every variable (optimizer state included where the file has
it) must be equal. Prints one line per scenario and exits 1 when one differs.
"""

from __future__ import annotations

import os
import sys
import tempfile
import traceback

_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [_REPO, os.path.join(_REPO, "tests")]

import numpy as np  # noqa: E402
from _keras_models import (  # noqa: E402 - the models the tests use too
    nested_functional_model, property_models, reused_layer_model, rich_model)


_OPTIMIZERS = ("Adam", "AdamW", "SGD", "RMSprop", "Adagrad", "Adadelta", "Adamax", "Nadam", "Ftrl", "Lion", "Lamb",
               "Adafactor", "Muon", "ScheduleFreeAdamW")


def _scenarios(keras):  # noqa: C901 - one small builder per scenario
    class Inner(keras.layers.Layer):
        def __init__(self, **kw):
            super().__init__(**kw)
            self.nested_layer = keras.layers.Dense(2, name="dense")

        def build(self, shape):
            self.extra = [self.add_weight(shape=(), name="w1"), self.add_weight(shape=(), name="w2")]
            self.in_dict = {"w": self.add_weight(shape=(), name="w3")}
            self.nested_layer.build(shape)

        def call(self, x):
            return self.nested_layer(x)

    class Subclassed(keras.Model):
        def __init__(self, **kw):
            super().__init__(**kw)
            self.dense1, self.dense2 = Inner(), Inner()

        def call(self, x):
            return self.dense2(self.dense1(x))

    Normal, Weird = property_models(keras)

    class Containers(keras.Model):
        def __init__(self):
            super().__init__()
            self.blocks = {"a": [keras.layers.Dense(3), keras.layers.Dense(3)], "b": [keras.layers.Dense(3)]}
            self.out = keras.layers.Dense(2)

        def call(self, x):
            for block in self.blocks.values():
                for layer in block:
                    x = layer(x)
            return self.out(x)

    def built(model, shape):
        model(np.zeros(shape, "float32"))
        return model

    def sequential():
        return keras.Sequential([keras.Input((4,)), keras.layers.Dense(3), keras.layers.Dense(2)])

    def lora():
        model = sequential()
        model.layers[0].enable_lora(2)
        return model

    def compiled(optimizer):
        def build():
            model = sequential()
            model.compile(optimizer=optimizer(), loss="mse")
            model.optimizer.build(model.trainable_variables)
            return model
        return build

    def nested():
        return nested_functional_model(keras)

    out = [("sequential", sequential, ".weights.h5", False),
           ("functional, shared layer", lambda: reused_layer_model(keras), ".weights.h5", False),
           ("nested functional", nested, ".weights.h5", False), ("nested functional, .keras", nested, ".keras", False),
           ("subclassed, weights in a list and a dict", lambda: built(Subclassed(), (2, 4)), ".weights.h5", False),
           ("layers in a dict of lists", lambda: built(Containers(), (2, 3)), ".weights.h5", False),
           ("Embedding, LSTM, GRU, MultiHeadAttention, BatchNorm", lambda: rich_model(keras), ".weights.h5", False),
           ("LoRA", lora, ".weights.h5", False), ("legacy .h5 by topology", sequential, ".h5", False),
           ("a layer behind a property", ("property", lambda: built(Normal(), (2, 2)), lambda: built(Weird(), (2, 2))),
            ".weights.h5", False)]
    for name in _OPTIMIZERS:  # every built-in optimizer this Keras has (the tests run the ones that differ)
        if hasattr(keras.optimizers, name):
            out.append((f"optimizer {name}", compiled(getattr(keras.optimizers, name)), ".weights.h5", True))
    out.append(("LossScaleOptimizer", compiled(lambda: keras.optimizers.LossScaleOptimizer(keras.optimizers.Adam())),
                ".weights.h5", True))
    out.append(("sharded weights", sequential, ".weights.json", False))
    return out


def _save(model, path):
    if path.endswith(".keras"):
        model.save(path)
    elif path.endswith(".weights.json"):
        model.save_weights(path, max_shard_size=0.00000005)
    elif path.endswith(".weights.h5"):
        model.save_weights(path)
    else:
        import h5py
        from keras.src.legacy.saving import legacy_h5_format

        with h5py.File(path, "w") as f:
            legacy_h5_format.save_weights_to_hdf5_group(f, model)


def _variables(model, optimizer):
    return list(model.weights) + (list(model.optimizer.variables) if optimizer else [])


def main() -> int:
    import keras

    import ckptmerge as cm

    rng = np.random.default_rng(0)
    folder = tempfile.mkdtemp(prefix="ckptmerge-keras-parity-")
    print(f"Keras {keras.__version__}, backend {keras.backend.backend()}")
    failed = 0
    for title, build, ext, optimizer in _scenarios(keras):
        saved_build, fresh_build = (build[1], build[2]) if isinstance(build, tuple) else (build, build)
        try:
            saved = saved_build()
            for v in _variables(saved, optimizer):
                kind = np.dtype(str(v.dtype)).kind if str(v.dtype) != "bfloat16" else "f"
                v.assign(rng.integers(1, 50, tuple(v.shape)).astype(str(v.dtype)) if kind in "iu"
                         else rng.uniform(0.1, 1, tuple(v.shape)).astype("float32"))
            path = os.path.join(folder, title.replace(" ", "_").replace(",", "").replace(".", "") + ext)
            try:
                _save(saved, path)
            except TypeError as e:  # a format this Keras does not write (sharding before 3.10)
                print(f"  {title:55} not written by this Keras ({str(e).splitlines()[0][:80]})")
                continue
            theirs, ours = fresh_build(), fresh_build()
            theirs.load_weights(path)
            cm.restore(ours, [cm.Source(path, optimizer=optimizer)])
            diff = [a.path for a, b in zip(_variables(ours, optimizer), _variables(theirs, optimizer))
                    if not np.array_equal(np.asarray(a.numpy()), np.asarray(b.numpy()))]
            status = "same as load_weights" if not diff else f"DIFFERS in {len(diff)}: {diff[:3]}"
        except Exception as e:  # a scenario this Keras cannot run (e.g. no sharding before 3.10)
            status = f"error: {type(e).__name__}: {str(e).splitlines()[0][:160]}"
            if os.environ.get("CKPTMERGE_TRACE"):
                traceback.print_exc()
        failed += not status.startswith("same")
        print(f"  {title:55} {status}", flush=True)
    print("all same as load_weights" if not failed else f"{failed} scenario(s) not the same")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
