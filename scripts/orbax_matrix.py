"""Write the Orbax release matrix fixtures: one small checkpoint per way of saving, as the Orbax
release this runs under writes it, with Orbax's own restore beside it (issue 36 item 1).

Run it with the Python of a virtual environment that has the release (and the JAX it needs):

    python -m venv /work/venvs/orbax-0.5
    /work/venvs/orbax-0.5/bin/pip install orbax-checkpoint==0.5.9 jax==0.4.26 jaxlib==0.4.26 "numpy<2"
    /work/venvs/orbax-0.5/bin/python scripts/orbax_matrix.py tests/fixtures/orbax_matrix

It writes ``OUT/<orbax version>/<case>/``: the checkpoint (``ckpt/``), ``reference.npz`` (every
array Orbax restores, named as ckptmerge names it: tree paths joined with ``/``, the item first in
a step of several items), ``strings.json`` (string leaves) and ``case.json`` (how it was saved,
which path and step to read, the steps of a manager root). A case the release cannot save is
listed in ``OUT/<version>/skipped.json`` with the reason. tests/test_orbax_matrix.py reads every
fixture without JAX and compares it with the reference bit for bit.

The cases: ``PyTreeCheckpointer`` (the release's default), ``Checkpointer`` with
``PyTreeCheckpointHandler(use_ocdbt=True/False)``, ``StandardCheckpointer``, ``AsyncCheckpointer``,
``save_args`` with dtype casts, trees of lists, tuples, ``None``, empty nodes, scalars and strings,
``CheckpointManager`` with the old item API (params, opt_state and a JSON item) and with the
``args=`` API, ``Composite``, the legacy msgpack aggregate (``checkpoint`` with small arrays
inline, the release's own restore of it), and arrays sharded over a 2x4 mesh of 8 host devices
(rows, columns, replicated, bfloat16), OCDBT on and off.
"""

from __future__ import annotations

import os

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import json  # noqa: E402
import shutil  # noqa: E402
import sys  # noqa: E402
import traceback  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any, Callable, Dict, List, Optional  # noqa: E402

import numpy as np  # noqa: E402


def _flat(tree: Any, prefix: tuple = ()) -> Dict[tuple, Any]:
    if isinstance(tree, dict):
        items = list(tree.items())
    elif isinstance(tree, (list, tuple)):
        items = list(enumerate(tree))
    else:
        return {prefix: tree}
    out: Dict[tuple, Any] = {}
    for k, v in items:
        out.update(_flat(v, prefix + (str(k),)))
    return out


def _params(seed: int) -> Dict[str, Any]:
    rng = np.random.default_rng(seed)
    return {"Dense_0": {"kernel": rng.standard_normal((4, 3)).astype(np.float32),
                        "bias": rng.standard_normal(3).astype(np.float32)},
            "embed": rng.integers(-100, 100, size=(5, 2)).astype(np.int32)}


def _state(seed: int, scalar: bool = True) -> Dict[str, Any]:
    """A training state; ``scalar=False``: the step as a 0-d array (``StandardSave`` of older
    releases takes no NumPy scalars)."""
    step = np.int64(seed) if scalar else np.asarray(seed, np.int64)
    return {"params": _params(seed), "opt_state": {"mu": _params(seed + 1)}, "step": step}


class Matrix:
    def __init__(self, out: Path) -> None:
        import jax
        import orbax.checkpoint as ocp

        self.ocp, self.jax = ocp, jax
        self.version = ocp.__version__
        self.out = out / self.version
        self.skipped: Dict[str, str] = {}

    # -- Orbax's own restore, flattened as ckptmerge names leaves -----------------------------------
    def restore_item(self, folder: Path) -> Dict[str, Any]:
        ocp = self.ocp
        try:
            tree = ocp.PyTreeCheckpointer().restore(str(folder))
        except Exception:  # noqa: BLE001 - sharded arrays without their devices: as numpy
            meta = ocp.PyTreeCheckpointer().metadata(str(folder))
            meta = getattr(meta, "tree", meta)
            args = self.jax.tree_util.tree_map(lambda _: ocp.RestoreArgs(restore_type=np.ndarray), meta)
            tree = ocp.PyTreeCheckpointer().restore(str(folder), restore_args=args)
        return {"/".join(k): v for k, v in _flat(tree).items() if v is not None}

    def write(self, name: str, how: str, save: Callable[[Path], Dict[str, Any]]) -> None:
        """Run ``save(ckpt_folder) -> case fields`` (``read``, ``items``, ``steps``...) and store
        the reference of what it saved."""
        case = self.out / name
        shutil.rmtree(case, ignore_errors=True)
        case.mkdir(parents=True)
        try:
            fields = save(case / "ckpt")
            read = case / fields["read"]
            step = read / fields["latest"] if fields.get("root") else read
            items: List[str] = fields.get("items") or [""]
            ref: Dict[str, Any] = {}
            for item in items:
                for k, v in self.restore_item(step / item if item else step).items():
                    ref[f"{item}/{k}" if len(items) > 1 or fields.get("prefixed") else k] = v
        except Exception as e:  # noqa: BLE001 - a way of saving this release does not have
            shutil.rmtree(case, ignore_errors=True)
            self.skipped[name] = f"{type(e).__name__}: {str(e)[:300]}"
            traceback.print_exc(limit=2)
            return
        arrays, strings = {}, {}
        for k, v in ref.items():
            if isinstance(v, str):
                strings[k] = v
            else:
                arr = np.asarray(v)
                if arr.dtype.name == "bfloat16" or arr.dtype.kind not in "biufc":
                    strings_dtype = arr.dtype.name
                    arrays[k + "@" + strings_dtype] = arr.view(np.uint16 if arr.itemsize == 2 else np.uint8)
                else:
                    arrays[k] = arr
        np.savez(case / "reference.npz", **{k.replace("/", "|"): v for k, v in arrays.items()})
        (case / "strings.json").write_text(json.dumps(strings, indent=1, sort_keys=True))
        fields = dict(fields, how=how, orbax=self.version, jax=self.jax.__version__)
        (case / "case.json").write_text(json.dumps(fields, indent=1, sort_keys=True))
        for dirpath, _, files in os.walk(case):  # (nothing a test does not read)
            for f in files:
                if f.endswith((".lock", ".tmp")):
                    os.remove(os.path.join(dirpath, f))

    # -- the ways of saving ----------------------------------------------------------------------
    def _save_pytree(self, ckptr: Any, path: Path, tree: Any, **kw: Any) -> None:
        ocp = self.ocp
        try:
            ckptr.save(str(path), args=ocp.args.PyTreeSave(tree, **kw))
        except (AttributeError, TypeError):
            ckptr.save(str(path), tree, **kw)

    def cases(self) -> None:
        ocp, jax = self.ocp, self.jax
        import jax.numpy as jnp

        def pytree_default(p: Path) -> dict:
            ocp.PyTreeCheckpointer().save(str(p), _state(1))
            return {"read": "ckpt"}

        def handler(use_ocdbt: bool) -> Callable[[Path], dict]:
            def save(p: Path) -> dict:
                self._save_pytree(ocp.Checkpointer(ocp.PyTreeCheckpointHandler(use_ocdbt=use_ocdbt)), p, _state(2))
                return {"read": "ckpt"}
            return save

        def standard(p: Path) -> dict:
            ckptr = ocp.StandardCheckpointer()
            try:
                ckptr.save(str(p), args=ocp.args.StandardSave(_state(3, False)))
            except (AttributeError, TypeError):
                ckptr.save(str(p), _state(3, False))
            ckptr.wait_until_finished() if hasattr(ckptr, "wait_until_finished") else None
            return {"read": "ckpt"}

        def async_save(p: Path) -> dict:
            ckptr = ocp.AsyncCheckpointer(ocp.PyTreeCheckpointHandler())
            self._save_pytree(ckptr, p, _state(4))
            ckptr.wait_until_finished()
            return {"read": "ckpt"}

        def cast(p: Path) -> dict:
            tree = {"params": _params(5)}
            save_args = jax.tree_util.tree_map(
                lambda x: ocp.SaveArgs(dtype=np.dtype(jnp.bfloat16) if x.dtype == np.float32 else np.dtype(np.int16)),
                tree)
            self._save_pytree(ocp.PyTreeCheckpointer(), p, tree, save_args=save_args)
            return {"read": "ckpt"}

        def containers(p: Path) -> dict:
            rng = np.random.default_rng(6)
            tree = {"layers": [rng.standard_normal(3).astype(np.float32), {"w": np.arange(4, dtype=np.int64)}],
                    "pair": (np.float32(1.5), rng.standard_normal((2, 2)).astype(np.float64)),
                    "none": None, "empty_dict": {}, "empty_list": [], "count": 7, "lr": 0.125,
                    "name": "run-6", "flag": np.asarray(True), "half": np.arange(3, dtype=np.float16)}
            ocp.PyTreeCheckpointer().save(str(p), tree)
            return {"read": "ckpt"}

        def manager_items(p: Path) -> dict:
            mgr = ocp.CheckpointManager(str(p), {"params": ocp.PyTreeCheckpointer(),
                                                 "opt_state": ocp.PyTreeCheckpointer(),
                                                 "meta": ocp.Checkpointer(ocp.JsonCheckpointHandler())},
                                        options=ocp.CheckpointManagerOptions(max_to_keep=5))
            for step in (10, 20):
                s = _state(step)
                mgr.save(step, {"params": s["params"], "opt_state": s["opt_state"], "meta": {"lr": 0.1, "step": step}})
            mgr.wait_until_finished()
            mgr.close() if hasattr(mgr, "close") else None
            return {"read": "ckpt", "root": True, "steps": [10, 20], "latest": "20",
                    "items": ["opt_state", "params"], "prefixed": True}

        def manager_args(p: Path) -> dict:
            mgr = ocp.CheckpointManager(str(p), options=ocp.CheckpointManagerOptions(max_to_keep=5),
                                        item_names=("state", "meta"))
            for step in (1, 2, 3):
                mgr.save(step, args=ocp.args.Composite(state=ocp.args.StandardSave(_state(step, False)),
                                                       meta=ocp.args.JsonSave({"step": step})))
            mgr.wait_until_finished()
            mgr.close() if hasattr(mgr, "close") else None
            return {"read": "ckpt", "root": True, "steps": [1, 2, 3], "latest": "3", "items": ["state"],
                    "prefixed": True}

        def manager_prefix(p: Path) -> dict:
            mgr = ocp.CheckpointManager(str(p), {"state": ocp.PyTreeCheckpointer()},
                                        options=ocp.CheckpointManagerOptions(step_prefix="checkpoint"))
            mgr.save(1000, {"state": _state(7)})
            mgr.wait_until_finished()
            mgr.close() if hasattr(mgr, "close") else None
            return {"read": "ckpt", "root": True, "steps": [1000], "latest": "checkpoint_1000", "items": ["state"]}

        def composite(p: Path) -> dict:
            try:
                handler = ocp.CompositeCheckpointHandler("state", "extra")
            except TypeError:
                handler = ocp.CompositeCheckpointHandler()
            ckptr = ocp.Checkpointer(handler)
            ckptr.save(str(p), args=ocp.args.Composite(state=ocp.args.StandardSave(_state(8, False)),
                                                       extra=ocp.args.StandardSave({"ema": _params(9)})))
            return {"read": "ckpt", "items": ["extra", "state"]}

        def aggregate(p: Path) -> dict:
            # The layout of Orbax before _METADATA: the msgpack 'checkpoint' file (small arrays
            # inline) beside one zarr folder per large array; this release's own restore reads it.
            tree = {"big": np.arange(40, dtype=np.float32).reshape(8, 5), "small": np.arange(3, dtype=np.int32),
                    "step": 5}
            save_args = {"big": ocp.SaveArgs(), "small": ocp.SaveArgs(aggregate=True),
                         "step": ocp.SaveArgs(aggregate=True)}
            self._save_pytree(ocp.Checkpointer(ocp.PyTreeCheckpointHandler(use_ocdbt=False)), p, tree,
                              save_args=save_args)
            if not (p / "checkpoint").exists():
                raise RuntimeError("this release writes no msgpack aggregate file")
            (p / "_METADATA").unlink()
            return {"read": "ckpt"}

        def sharded(use_ocdbt: bool) -> Callable[[Path], dict]:
            def save(p: Path) -> dict:
                from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

                devices = np.array(jax.devices())
                if devices.size < 8:
                    raise RuntimeError(f"{devices.size} devices (set XLA_FLAGS before importing jax)")
                mesh = Mesh(devices[:8].reshape(2, 4), ("x", "y"))
                rng = np.random.default_rng(10)

                def put(a: np.ndarray, spec: Any) -> Any:
                    return jax.device_put(a, NamedSharding(mesh, spec))

                tree = {"rows": put(rng.standard_normal((8, 6)).astype(np.float32), P("x", None)),
                        "cols": put(rng.standard_normal((3, 8)).astype(np.float32), P(None, "y")),
                        "both": put(rng.standard_normal((4, 8)).astype(np.float32), P("x", "y")),
                        "replicated": put(rng.standard_normal((5,)).astype(np.float32), P()),
                        "bf16": put(jnp.asarray(rng.standard_normal((6, 4)), dtype=jnp.bfloat16), P("x", "y"))}
                self._save_pytree(ocp.Checkpointer(ocp.PyTreeCheckpointHandler(use_ocdbt=use_ocdbt)), p, tree)
                return {"read": "ckpt"}
            return save

        self.write("pytree_default", "PyTreeCheckpointer().save(path, tree)", pytree_default)
        self.write("handler_ocdbt", "Checkpointer(PyTreeCheckpointHandler(use_ocdbt=True))", handler(True))
        self.write("handler_no_ocdbt", "Checkpointer(PyTreeCheckpointHandler(use_ocdbt=False))", handler(False))
        self.write("standard", "StandardCheckpointer().save(path, tree)", standard)
        self.write("async", "AsyncCheckpointer(PyTreeCheckpointHandler()) + wait_until_finished()", async_save)
        self.write("save_args_cast", "save_args=SaveArgs(dtype=bfloat16 / int16)", cast)
        self.write("containers", "lists, tuples, None, empty nodes, scalars, strings", containers)
        self.write("manager_items", "CheckpointManager(root, {params, opt_state, meta: JSON}) old item API",
                   manager_items)
        self.write("manager_args", "CheckpointManager(root) + save(step, args=Composite(state=StandardSave, "
                                   "meta=JsonSave))", manager_args)
        self.write("manager_prefix", "CheckpointManager(step_prefix='checkpoint')", manager_prefix)
        self.write("composite", "Checkpointer(CompositeCheckpointHandler) + args.Composite", composite)
        self.write("aggregate", "the msgpack 'checkpoint' file, _METADATA removed", aggregate)
        self.write("sharded_ocdbt", "NamedSharding over a 2x4 mesh of 8 host devices, OCDBT on", sharded(True))
        self.write("sharded_no_ocdbt", "NamedSharding over a 2x4 mesh of 8 host devices, OCDBT off", sharded(False))
        (self.out / "skipped.json").write_text(json.dumps(self.skipped, indent=1, sort_keys=True))


def main(argv: Optional[List[str]] = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    out = Path(argv[0] if argv else "tests/fixtures/orbax_matrix")
    m = Matrix(out)
    m.cases()
    print(f"orbax {m.version}: wrote {len(list(m.out.glob('*/case.json')))} cases to {m.out}; "
          f"skipped {sorted(m.skipped)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
