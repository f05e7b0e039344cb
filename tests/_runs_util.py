"""Helpers for the tests of runs (tests/test_runs*.py): write a training directory's checkpoints
in each of the ways trainers name them, each holding one tensor whose value is its step.

Every writer is TF-free and real: ckptmerge's bundle and ``.weights.h5`` writers (their files are
checked against TensorFlow's and Keras's own elsewhere) and the safetensors package.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Callable, Dict, Union

import numpy as np

from ckptmerge.formats.tf.writer import BundleWriter

PathLike = Union[str, "os.PathLike[str]"]


def value(step: float) -> np.ndarray:
    """The tensor a checkpoint of ``step`` holds."""
    return np.full(4, float(step), np.float32)


def write_bundle(path: PathLike, step: float) -> str:
    """A TF bundle at the prefix ``path``; returns the prefix."""
    with BundleWriter(str(path)) as w:
        w.add("w", value(step))
    return str(path)


def write_safetensors(path: PathLike, step: float) -> str:
    from safetensors.numpy import save_file

    save_file({"w": value(step)}, str(path))
    return str(path)


def write_keras(path: PathLike, step: float) -> str:
    from ckptmerge.formats.keras.h5_writer import H5Writer

    with H5Writer(str(path), [("w", "float32", (4,))]) as w:
        w.add("w", value(step))
    return str(path)


def _in_folder(write: Callable[[PathLike, float], str], name: str) -> Callable[[PathLike, float], str]:
    def make(folder: PathLike, step: float) -> str:
        os.makedirs(folder, exist_ok=True)
        write(os.path.join(folder, name), step)
        return str(folder)
    return make


#: ``kind: (name of step N's checkpoint, writer)``: the path a trainer gives each checkpoint of a
#: run and how it is written. The path a listing shows is the one named (a prefix, a file, a folder).
KINDS: Dict[str, tuple] = {
    "tf-bundles": ("ckpt-{}", write_bundle),
    "keras-weights": ("ckpt-{}.weights.h5", write_keras),
    "safetensors-files": ("model-{}.safetensors", write_safetensors),
    "hf-step-folders": ("checkpoint-{}", _in_folder(write_safetensors, "model.safetensors")),
    "step_-folders-of-bundles": ("step_{}", _in_folder(write_bundle, "ckpt")),
    "numbered-folders": ("{}", _in_folder(write_safetensors, "model.safetensors")),
}


def write_run(run: PathLike, kind: str, steps, *, name: str = "") -> Dict[int, str]:
    """Write one checkpoint per step into ``run`` as ``kind`` names them; ``{step: path}``."""
    pattern, write = KINDS[kind]
    os.makedirs(run, exist_ok=True)
    return {s: write(os.path.join(str(run), (name or pattern).format(s)), s) for s in steps}


def loaded(path: PathLike, **kw) -> float:
    """The value of the one tensor of the checkpoint at ``path`` (its step)."""
    import ckptmerge as cm

    (arr,) = cm.load(path, **kw).values()
    return float(np.asarray(arr).ravel()[0])


def names(infos, run: PathLike) -> list:
    """``(path relative to run, step)`` of listed checkpoints."""
    return [(os.path.relpath(i.path, str(run)), i.step) for i in infos]


def tree(path: Path) -> Dict[str, int]:
    """``{relative path: size}`` of every file below ``path`` (links not followed)."""
    out = {}
    for root, _, files in os.walk(path):
        for f in files:
            p = os.path.join(root, f)
            out[os.path.relpath(p, path)] = os.lstat(p).st_size
    return out
