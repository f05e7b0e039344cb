"""Helpers for the Orbax tests: real Orbax checkpoints in every layout, Orbax's own restore, and
a guard that fails a test if ckptmerge's code imports JAX (or Flax, or Orbax).

TensorFlow 2.21 imports JAX by itself when it is installed, and the tests import Orbax (and so
JAX) to write checkpoints, so "JAX is not in ``sys.modules``" proves nothing here. The guard
wraps ``builtins.__import__`` and ``importlib.import_module`` and looks at who asks: an import
of ``jax``, ``jaxlib``, ``flax`` or ``orbax`` whose importing module is ``ckptmerge`` or one of
its submodules is recorded (and refused), whatever imported it first.
"""

from __future__ import annotations

import builtins
import importlib
import os
import shutil
import sys
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Dict, Iterator, List

import numpy as np
import pytest

FORBIDDEN = ("jax", "jaxlib", "flax", "orbax")
#: Every layout the reader knows, as written by orbax-checkpoint.
LAYOUTS = ["ocdbt+zarr3", "ocdbt+zarr", "zarr", "zarr3", "msgpack"]


def _caller_module(depth: int) -> str:
    frame = sys._getframe(depth)
    while frame is not None and frame.f_globals.get("__name__", "").startswith(("importlib", "_frozen_importlib")):
        frame = frame.f_back
    return frame.f_globals.get("__name__", "") if frame is not None else ""


@contextmanager
def no_jax_from_ckptmerge() -> Iterator[List[str]]:
    """Refuse (ImportError) and record every import of JAX/Flax/Orbax made by ckptmerge's code.

    Yields the list of ``"importer -> module"`` records; the caller asserts it stays empty.
    """
    seen: List[str] = []
    real_import, real_import_module = builtins.__import__, importlib.import_module

    def check(name: str, importer: str) -> None:
        if name.split(".")[0] in FORBIDDEN and (importer == "ckptmerge" or importer.startswith("ckptmerge.")):
            seen.append(f"{importer} -> {name}")
            raise ImportError(f"test guard: ckptmerge ({importer}) must not import {name}")

    def guarded_import(name: str, globals: Any = None, locals: Any = None, fromlist: Any = (), level: int = 0) -> Any:
        if level == 0:
            check(name, (globals or {}).get("__name__", "") if isinstance(globals, dict) else "")
        return real_import(name, globals, locals, fromlist, level)

    def guarded_import_module(name: str, package: Any = None) -> Any:
        check(name, _caller_module(2))
        return real_import_module(name, package)

    builtins.__import__, importlib.import_module = guarded_import, guarded_import_module
    try:
        yield seen
    finally:
        builtins.__import__, importlib.import_module = real_import, real_import_module


@pytest.fixture(autouse=True)
def refuse_jax_from_ckptmerge():
    """Autouse in the Orbax test modules (imported there): the test fails if ckptmerge's code
    imported JAX, Flax or Orbax while it ran."""
    with no_jax_from_ckptmerge() as seen:
        yield
    assert seen == [], f"ckptmerge imported JAX/Flax/Orbax: {seen}"


def sample_tree() -> Dict[str, Any]:
    """A Flax-like training state: params with every dtype Orbax writes, optimizer state, a step,
    scalars and a string."""
    import ml_dtypes

    rng = np.random.default_rng(0)
    dtypes = ["float16", "float32", "float64", "bfloat16", "int8", "int16", "int32", "int64", "uint8",
              "uint16", "uint32", "uint64", "complex64", "complex128", "float8_e4m3fn", "float8_e4m3fnuz",
              "float8_e4m3b11fnuz", "float8_e5m2", "float8_e5m2fnuz", "float8_e8m0fnu", "float8_e3m4",
              "int4", "int2", "float4_e2m1fn"]
    typed = {}
    for name in dtypes:
        dt = np.dtype(getattr(ml_dtypes, name, None) or name)
        typed[name] = (rng.integers(0, 3, size=(2, 3)) if dt.kind in "iu" or name.startswith(("int", "float4", "float8"))
                       else rng.standard_normal((2, 3))).astype(dt)
    typed["bool"] = np.array([[True, False, True], [False, False, True]])
    return {
        "params": {"Dense_0": {"kernel": rng.standard_normal((4, 3)).astype(np.float32),
                               "bias": np.zeros(3, np.float32)},
                   "Conv_0": {"kernel": rng.standard_normal((3, 3, 2, 4)).astype(np.float32)},
                   "layers": [np.arange(5, dtype=np.float32), np.ones((2, 2), np.float32)],
                   "typed": typed},
        "opt_state": [{"mu": {"Dense_0": {"kernel": np.ones((4, 3), np.float32)}}, "count": np.int32(3)}, None],
        "step": 7,
        "lr": 0.25,
        "name": "run-1",
    }


def write_orbax(path: Path, tree: Dict[str, Any], layout: str) -> Path:
    """Write ``tree`` with orbax-checkpoint in ``layout``; returns the folder to read.

    ``ocdbt+zarr3`` is Orbax V1's ``save_pytree`` (a step folder with one item, ``state`` in
    orbax-checkpoint 0.12); the others are V0 ``PyTreeCheckpointHandler`` item folders; ``msgpack`` is the
    pre-``_METADATA`` layout: zarr folders plus the aggregate ``checkpoint`` file, made with
    Orbax's own msgpack encoder.
    """
    import orbax.checkpoint as ocp

    path = Path(path).absolute()
    if layout == "ocdbt+zarr3":
        import orbax.checkpoint.experimental.v1 as ocp1

        ocp1.save_pytree(str(path), _orbax_leaves(tree))
        return path
    use_ocdbt = layout.startswith("ocdbt")
    use_zarr3 = layout.endswith("zarr3")
    handler = ocp.PyTreeCheckpointHandler(use_ocdbt=use_ocdbt, use_zarr3=use_zarr3)
    if layout != "msgpack":
        ocp.Checkpointer(handler).save(str(path), args=ocp.args.PyTreeSave(tree))
        return path
    from orbax.checkpoint import msgpack_utils

    arrays = {k: v for k, v in _flat(tree).items() if isinstance(v, np.ndarray) and v.size > 5}  # small ones inline
    nested: Dict[str, Any] = {}
    for key in arrays:
        _set(nested, key, arrays[key])
    ocp.Checkpointer(ocp.PyTreeCheckpointHandler(use_ocdbt=False, use_zarr3=False)).save(
        str(path), args=ocp.args.PyTreeSave(nested))
    os.remove(path / "_METADATA")
    aggregate = _map_leaves(tree, lambda key, v: ("PLACEHOLDER://" + ".".join(key)) if key in arrays else v)
    (path / "checkpoint").write_bytes(msgpack_utils.msgpack_serialize(aggregate))
    return path


def _orbax_leaves(tree: Any) -> Any:
    """Orbax V1 takes no NumPy scalars: make them 0-d arrays."""
    return _map_leaves(tree, lambda _, v: np.asarray(v) if isinstance(v, np.generic) else v)


def _flat(tree: Any, prefix: tuple = ()) -> Dict[tuple, Any]:
    out: Dict[tuple, Any] = {}
    items = tree.items() if isinstance(tree, dict) else enumerate(tree) if isinstance(tree, (list, tuple)) else None
    if items is None:
        out[prefix] = tree
        return out
    for k, v in items:
        out.update(_flat(v, prefix + (str(k),)))
    return out


def _set(nested: Dict[str, Any], key: tuple, value: Any) -> None:
    for part in key[:-1]:
        nested = nested.setdefault(part, {})
    nested[key[-1]] = value


def _map_leaves(tree: Any, fn: Any, prefix: tuple = ()) -> Any:
    if isinstance(tree, dict):
        return {k: _map_leaves(v, fn, prefix + (str(k),)) for k, v in tree.items()}
    if isinstance(tree, (list, tuple)):
        return type(tree)(_map_leaves(v, fn, prefix + (str(i),)) for i, v in enumerate(tree))
    return fn(prefix, tree)


def orbax_restore(path: Path, item: str = "") -> Dict[str, np.ndarray]:
    """What Orbax itself restores, flattened to ``{"a/b": array}`` (``None`` leaves left out)."""
    import orbax.checkpoint as ocp

    folder = Path(path) / item if item else Path(path)
    if not any((folder / f).exists() for f in ("_METADATA", "checkpoint", "manifest.ocdbt")):
        import orbax.checkpoint.experimental.v1 as ocp1

        tree = ocp1.load(str(folder))
    else:
        tree = ocp.Checkpointer(ocp.PyTreeCheckpointHandler()).restore(str(folder))
    out = {}
    for key, value in _flat(tree).items():
        if value is None:
            continue
        if isinstance(value, str):
            value = np.array(value.encode(), dtype=object)
        out["/".join(key)] = np.asarray(value)
    return out


def copy_tree_to_memory(local: Path, url: str) -> None:
    """Upload every file below ``local`` to the fsspec ``memory://`` URL ``url``."""
    import fsspec

    fs = fsspec.filesystem("memory")
    for dirpath, _, files in os.walk(local):
        for n in files:
            p = Path(dirpath) / n
            fs.pipe(f"{url}/{p.relative_to(local).as_posix()}", p.read_bytes())


def copy_folder(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst
