"""The built-in demo behind ``ckptmerge demo``: the A/B/C scenario on data it makes itself.

Model A (``a1``, ``a2``, ``a3``) and model B (``b1``, ``b2``, ``b3``) are trained "separately" and
saved with ``tf.compat.v1.train.Saver``. Model C needs ``a1`` as ``c/x1`` and ``b1`` as ``c/y1``,
plus a fresh variable ``c/z``. The demo plans, shows the report, restores in graph mode and checks
every value; then does the same in eager mode for a Keras model whose encoder comes from one
checkpoint and whose head comes from another. It returns its results; the CLI prints them.
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass, field
from typing import Callable, List, Optional, Tuple

import numpy as np

__all__ = ["DemoResult", "run_demo"]


@dataclass
class DemoResult:
    """What the demo did: the rendered plans and reports, and every value check.

    Attributes:
        workdir: where checkpoints A and B were written (a temporary folder, removed when the demo
            ends, unless a ``workdir`` was given).
        kept: whether ``workdir`` is still there (the caller's folder) or was removed.
        steps: ``(title, text)`` pairs in order, for the CLI to print.
        checks: ``(description, passed)`` pairs.
    """

    workdir: str
    kept: bool = True
    steps: List[Tuple[str, str]] = field(default_factory=list)
    checks: List[Tuple[str, bool]] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """True when every check passed."""
        return bool(self.checks) and all(ok for _, ok in self.checks)


def _save_tf1(path_prefix: str, values: dict, step: int) -> str:
    import tensorflow as tf

    graph = tf.Graph()
    with graph.as_default():
        tf_vars = {n: tf.compat.v1.get_variable(n, initializer=v) for n, v in values.items()}
        saver = tf.compat.v1.train.Saver(tf_vars)
        with tf.compat.v1.Session(graph=graph) as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            return saver.save(sess, path_prefix, global_step=step)


def _graph_scenario(root: str, result: DemoResult) -> None:
    import tensorflow as tf

    import ckptmerge as cm

    rng = np.random.default_rng(0)
    a = {"a1": rng.standard_normal((3, 4)).astype(np.float32),
         "a2": rng.standard_normal((4,)).astype(np.float32),
         "a3": rng.standard_normal((2, 2)).astype(np.float32)}
    b = {"b1": rng.standard_normal((4,)).astype(np.float32),
         "b2": rng.standard_normal((5,)).astype(np.float32),
         "b3": np.int64(7)}
    os.makedirs(os.path.join(root, "A"))
    os.makedirs(os.path.join(root, "B"))
    _save_tf1(os.path.join(root, "A", "model"), a, step=10)
    b_prefix = _save_tf1(os.path.join(root, "B", "model"), b, step=10)

    graph = tf.Graph()
    with graph.as_default():
        with tf.compat.v1.variable_scope("c"):
            x1 = tf.compat.v1.get_variable("x1", shape=(3, 4), initializer=tf.compat.v1.zeros_initializer())
            y1 = tf.compat.v1.get_variable("y1", shape=(4,), initializer=tf.compat.v1.zeros_initializer())
            z = tf.compat.v1.get_variable("z", shape=(2,), initializer=tf.compat.v1.ones_initializer())
        sources = [cm.Source(os.path.join(root, "A"), map={"a1": "c/x1"}, name="A"),
                   cm.Source(b_prefix, map={"b1": "c/y1"}, name="B")]
        with tf.compat.v1.Session(graph=graph) as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            plan = cm.plan(None, sources, allow_missing=["c/z"])
            result.steps.append(("Plan for model C (graph mode, before anything is restored)", plan.report()))
            report = plan.restore(session=sess)
            result.steps.append(("Restored (graph mode)", report.summary()))
            x1v, y1v, zv = sess.run([x1, y1, z])
    result.checks.append(("c/x1 == A:a1 (exact)", np.array_equal(x1v, a["a1"])))
    result.checks.append(("c/y1 == B:b1 (exact)", np.array_equal(y1v, b["b1"])))
    result.checks.append(("c/z kept its own initial value", np.array_equal(zv, np.ones(2, np.float32))))


def _keras_scenario(root: str, result: DemoResult) -> None:
    import keras
    import tensorflow as tf

    import ckptmerge as cm

    def model(n_classes: int, name: str) -> "keras.Model":
        inp = keras.Input((8,))
        h = keras.layers.Dense(16, name="enc1")(inp)
        out = keras.layers.Dense(n_classes, name="head")(h)
        return keras.Model(inp, out, name=name)

    encoder_model = model(3, "pretrained")
    classifier = model(2, "classifier")
    enc_ckpt = tf.train.Checkpoint(model=encoder_model).write(os.path.join(root, "enc", "ckpt"))
    head_ckpt = tf.train.Checkpoint(model=classifier).write(os.path.join(root, "head", "ckpt"))
    fresh = model(2, "fresh")
    plan = cm.plan(fresh, [cm.Source(enc_ckpt, include=["enc1/*"], name="encoder"),
                           cm.Source(head_ckpt, include=["head/*"], name="head")])
    result.steps.append(("Plan for a Keras model (eager mode): encoder from one checkpoint, head from another",
                         plan.report()))
    report = plan.restore()
    result.steps.append(("Restored (eager mode)", report.summary()))
    same_enc = all(np.array_equal(a.numpy(), b.numpy()) for a, b in
                   zip(fresh.get_layer("enc1").weights, encoder_model.get_layer("enc1").weights))
    same_head = all(np.array_equal(a.numpy(), b.numpy()) for a, b in
                    zip(fresh.get_layer("head").weights, classifier.get_layer("head").weights))
    result.checks.append(("Keras enc1 == encoder checkpoint (exact)", same_enc))
    result.checks.append(("Keras head == head checkpoint (exact)", same_head))


def run_demo(workdir: Optional[str] = None, *, on_step: Optional[Callable[[str, str], None]] = None) -> DemoResult:
    """Run the demo in ``workdir`` and return what happened. Without ``workdir`` the demo writes
    into a new temporary folder and removes it when it ends (``result.kept`` is then ``False``).

    Example:
        >>> res = run_demo()          # doctest: +SKIP
        >>> res.ok                    # doctest: +SKIP
        True
    """
    if workdir is None:
        with tempfile.TemporaryDirectory(prefix="ckptmerge-demo-") as root:
            result = _run_in(root, on_step)
        result.kept = False
        return result
    return _run_in(workdir, on_step)


def _run_in(root: str, on_step: Optional[Callable[[str, str], None]]) -> DemoResult:
    result = DemoResult(workdir=root)
    _graph_scenario(root, result)
    _keras_scenario(root, result)
    if on_step is not None:
        for title, text in result.steps:
            on_step(title, text)
    return result
