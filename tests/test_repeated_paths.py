"""A Keras model whose variables repeat one ``.path`` is planned, not refused (issue 32).

Sublayers built outside their parent's name scope (a block that builds its ``o_proj`` in its
constructor) all get the path ``o_proj/kernel``. Such variables are targets named by their object
path (where Keras's saving walk keys them), and restore like any other.
"""

from __future__ import annotations

import numpy as np
import pytest

import ckptmerge as cm

keras = pytest.importorskip("keras")


class Block(keras.layers.Layer):
    def __init__(self, d, **kw):
        super().__init__(**kw)
        self.o_proj = keras.layers.Dense(d, name="o_proj")
        self.o_proj.build((None, d))  # built here, outside the block's own name scope

    def call(self, x):
        return x + self.o_proj(x)


class Net(keras.Model):
    def __init__(self, depth=4, **kw):
        super().__init__(**kw)
        self.blocks = [Block(4, name=f"layer_{i}") for i in range(depth)]
        self.head = keras.layers.Dense(2, name="head")

    def call(self, x):
        for b in self.blocks:
            x = b(x)
        return self.head(x)


def _net(seed):
    model = Net(name="net")
    model(np.zeros((1, 4), np.float32))
    rng = np.random.default_rng(seed)
    for v in model.weights:
        v.assign(rng.normal(size=tuple(v.shape)).astype(np.float32))
    return model


def test_the_model_has_repeated_paths_and_each_target_its_object_path():
    model = _net(0)
    paths = [v.path for v in model.weights]
    assert paths.count("o_proj/kernel") == 4
    plan = cm.plan(model, [cm.Source.from_values({"unrelated": np.zeros(3, np.float32)})])
    names = [t.name for t in plan.targets]
    assert len(set(names)) == len(names) == len(paths)
    assert {"blocks/block/o_proj/kernel", "blocks/block_3/o_proj/bias", "net/head/kernel"} <= set(names)
    # (a list of variables has no object paths: still refused, naming the duplicates)
    with pytest.raises(cm.PlanError, match="'o_proj/kernel' \\(4x\\)"):
        cm.plan(list(model.weights), [cm.Source.from_values({"unrelated": np.zeros(3, np.float32)})])


def test_a_weights_file_and_a_live_twin_restore_every_block_into_its_own_place(tmp_path):
    old, new = _net(1), _net(2)
    old.save_weights(str(tmp_path / "old.weights.h5"))
    cm.restore(new, [cm.Source(str(tmp_path / "old.weights.h5"))])
    for a, b in zip(old.weights, new.weights):
        np.testing.assert_array_equal(a.numpy(), b.numpy())
    other = _net(3)
    cm.restore(other, [cm.Source.from_values(old)])  # (a live source is named as a target is)
    for a, b in zip(old.weights, other.weights):
        np.testing.assert_array_equal(a.numpy(), b.numpy())


def test_pytorch_names_align_into_the_repeated_paths():
    old, new = _net(4), _net(5)
    sd = {}
    for i, block in enumerate(old.blocks):
        sd[f"model.layers.{i}.o_proj.weight"] = block.o_proj.kernel.numpy().T.copy()
        sd[f"model.layers.{i}.o_proj.bias"] = block.o_proj.bias.numpy()
    sd["model.head.weight"] = old.head.kernel.numpy().T.copy()
    sd["model.head.bias"] = old.head.bias.numpy()
    plan = cm.plan(new, [cm.Source.from_values(sd, layout="torch", align="structure")])
    assert plan.missing == [] and plan.ok
    cm.restore(new, [cm.Source.from_values(sd, layout="torch", align="structure")])
    for a, b in zip(old.weights, new.weights):
        np.testing.assert_array_equal(a.numpy(), b.numpy())
