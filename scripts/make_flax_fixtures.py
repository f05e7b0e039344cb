"""Make the committed Flax fixtures of tests/fixtures/flax/: tiny Flax models (Linen and NNX, an
MLP with an embedding and a CNN with batch norm), trained for a few steps and saved with Orbax,
with an input batch and the outputs Flax computes for it.

The test suite restores each checkpoint into the model's Keras twin (tests/test_orbax_flax.py)
and checks the Keras outputs against Flax's, without JAX or Flax installed: only this script
needs them. Run it again (``pip install flax orbax-checkpoint``) to make the fixtures anew:

    python scripts/make_flax_fixtures.py tests/fixtures/flax

Layout of each fixture folder:

- ``linen_mlp/``, ``linen_cnn/``: ``ckpt/3/`` is a CheckpointManager step (Orbax V1 layout: OCDBT
  + zarr3) of the train state ``{"params", "batch_stats", "opt_state" (Adam), "step"}``;
- ``nnx_mlp/``, ``nnx_cnn/``: ``state/`` is ``nnx.state(model)`` saved with
  ``StandardCheckpointer`` (an item folder; NNX leaves end in ``/value``);
- ``io.npz``: ``x`` (the input batch) and ``y`` (Flax's output in inference mode).
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax
import orbax.checkpoint as ocp
from flax import linen as nn
from flax import nnx

STEPS = 3
TOKENS = np.random.default_rng(1).integers(0, 10, size=(6, 3)).astype(np.int32)
IMAGES = np.random.default_rng(2).standard_normal((4, 8, 8, 3)).astype(np.float32)


class LinenMLP(nn.Module):
    """Embed -> mean over tokens -> Dense(16) -> relu -> LayerNorm -> Dense(4)."""

    @nn.compact
    def __call__(self, tokens, train: bool = False):
        x = nn.Embed(10, 8)(tokens).mean(axis=1)
        x = nn.relu(nn.Dense(16)(x))
        x = nn.LayerNorm()(x)
        return nn.Dense(4)(x)


class LinenCNN(nn.Module):
    """Conv(6, 3x3) -> relu -> Conv(4, 3x3, stride 2) -> BatchNorm -> relu -> mean -> Dense(5)."""

    @nn.compact
    def __call__(self, x, train: bool = False):
        x = nn.relu(nn.Conv(6, (3, 3))(x))
        x = nn.Conv(4, (3, 3), strides=(2, 2))(x)
        x = nn.relu(nn.BatchNorm(use_running_average=not train)(x))
        return nn.Dense(5)(x.mean(axis=(1, 2)))


class NNXMLP(nnx.Module):
    def __init__(self, rngs: nnx.Rngs) -> None:
        self.embed = nnx.Embed(10, 8, rngs=rngs)
        self.hidden = nnx.Linear(8, 16, rngs=rngs)
        self.norm = nnx.LayerNorm(16, rngs=rngs)
        self.out = nnx.Linear(16, 4, rngs=rngs)

    def __call__(self, tokens):
        x = self.embed(tokens).mean(axis=1)
        return self.out(self.norm(nnx.relu(self.hidden(x))))


class NNXCNN(nnx.Module):
    def __init__(self, rngs: nnx.Rngs) -> None:
        self.conv1 = nnx.Conv(3, 6, (3, 3), rngs=rngs)
        self.conv2 = nnx.Conv(6, 4, (3, 3), strides=(2, 2), rngs=rngs)
        self.bn = nnx.BatchNorm(4, rngs=rngs)
        self.head = nnx.Linear(4, 5, rngs=rngs)

    def __call__(self, x):
        x = nnx.relu(self.conv1(x))
        x = nnx.relu(self.bn(self.conv2(x)))
        return self.head(x.mean(axis=(1, 2)))


def _linen(name: str, model: nn.Module, x: np.ndarray, out_dim: int, out: Path) -> None:
    variables = model.init(jax.random.PRNGKey(0), x)
    params, batch_stats = variables["params"], variables.get("batch_stats", {})
    tx = optax.adam(1e-2)
    opt_state = tx.init(params)
    target = jnp.asarray(np.random.default_rng(3).standard_normal((x.shape[0], out_dim)), jnp.float32)

    def loss(p, stats):
        y, updates = model.apply({"params": p, "batch_stats": stats}, x, train=True, mutable=["batch_stats"])
        return jnp.mean((y - target) ** 2), updates.get("batch_stats", {})

    for _ in range(STEPS):
        (_, batch_stats), grads = jax.value_and_grad(loss, has_aux=True)(params, batch_stats)
        updates, opt_state = tx.update(grads, opt_state, params)
        params = optax.apply_updates(params, updates)
    state = {"params": params, "opt_state": opt_state, "step": jnp.asarray(STEPS, jnp.int32)}
    if batch_stats:
        state["batch_stats"] = batch_stats
    y = model.apply({"params": params, "batch_stats": batch_stats}, x, train=False)
    folder = out / name
    mgr = ocp.CheckpointManager(str((folder / "ckpt").absolute()))
    mgr.save(STEPS, args=ocp.args.Composite(state=ocp.args.StandardSave(state)))
    mgr.wait_until_finished()
    mgr.close()
    np.savez(folder / "io.npz", x=x, y=np.asarray(y))


def _nnx(name: str, model: nnx.Module, x: np.ndarray, out_dim: int, out: Path) -> None:
    optimizer = nnx.Optimizer(model, optax.adam(1e-2), wrt=nnx.Param)
    target = jnp.asarray(np.random.default_rng(3).standard_normal((x.shape[0], out_dim)), jnp.float32)

    def loss(m):
        return jnp.mean((m(x) - target) ** 2)

    model.train()
    for _ in range(STEPS):
        grads = nnx.grad(loss)(model)
        optimizer.update(model, grads)
    model.eval()
    y = model(x)
    folder = out / name
    folder.mkdir(parents=True, exist_ok=True)
    ckpt = ocp.StandardCheckpointer()
    ckpt.save(str((folder / "state").absolute()), nnx.state(model))
    ckpt.wait_until_finished()
    ckpt.close()
    np.savez(folder / "io.npz", x=x, y=np.asarray(y))


def main(out: Path) -> None:
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    _linen("linen_mlp", LinenMLP(), TOKENS, 4, out)
    _linen("linen_cnn", LinenCNN(), IMAGES, 5, out)
    _nnx("nnx_mlp", NNXMLP(nnx.Rngs(0)), TOKENS, 4, out)
    _nnx("nnx_cnn", NNXCNN(nnx.Rngs(0)), IMAGES, 5, out)
    print(f"wrote {out}")


if __name__ == "__main__":
    main(Path(sys.argv[1] if len(sys.argv) > 1 else "tests/fixtures/flax"))
