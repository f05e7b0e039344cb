"""Restores are all or nothing under Ctrl-C and under any exception raised mid-loop (issue 24, 13).

Eager TF and Keras on JAX assign one variable after another. An exception raised by the k-th
assignment, for every k, and raised after the assignment took effect as well as before, leaves
every variable as it was; so does a real SIGINT delivered at points swept across the whole
restore (it lands between two bytecodes, often just after an assignment returned: the variable in
flight is put back too). A restore that was not interrupted leaves every variable new; nothing in
between, ever. The SIGINT rounds run in a child interpreter (the signal must not reach pytest).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[1]


def _child(script: str, *args, backend: str = "tensorflow", timeout: float = 600) -> dict:
    env = dict(os.environ, PYTHONPATH=str(REPO), TF_CPP_MIN_LOG_LEVEL="3", KERAS_BACKEND=backend)
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(script), *map(str, args)], env=env,
                          capture_output=True, text=True, timeout=timeout, cwd=REPO)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


# -- exceptions at every position -------------------------------------------------------------


@pytest.fixture
def module_and_checkpoint(tmp_path, tf):
    n = 9
    src = tf.Module()
    src.vs = [tf.Variable(np.full((4,), i + 1.0, np.float32)) for i in range(n)]
    prefix = tf.train.Checkpoint(model=src).write(str(tmp_path / "ckpt"))
    target = tf.Module()
    target.vs = [tf.Variable(np.zeros((4,), np.float32)) for _ in range(n)]
    return target, prefix, n


def _failing_ops(real, k: int, when: str, error: BaseException):
    """``_fast_ops`` whose ``k``-th assignment raises ``error``, before or after it took effect."""
    calls = {"n": 0}

    def ops():
        read, assign = real()

        def failing(var, value):
            calls["n"] += 1
            if calls["n"] == k and when == "before":
                raise error
            assign(var, value)
            if calls["n"] == k:
                raise error
        return read, failing
    return ops


@pytest.mark.parametrize("when", ["before", "after"])
@pytest.mark.parametrize("kind", ["exception", "KeyboardInterrupt"])
def test_an_exception_at_any_assignment_leaves_every_variable_as_it_was(module_and_checkpoint, monkeypatch,
                                                                       when, kind):
    import ckptmerge as cm
    from ckptmerge.restoring.backends import eager

    target, prefix, n = module_and_checkpoint
    real = eager._fast_ops
    for k in range(1, n + 1):
        error = RuntimeError(f"injected at assignment {k}") if kind == "exception" else KeyboardInterrupt()
        monkeypatch.setattr(eager, "_fast_ops", _failing_ops(real, k, when, error))
        expected = (cm.RestoreError, f"Assigning target variable {k} of {n} failed; every target was put back "
                                     "as it was") if kind == "exception" else (KeyboardInterrupt, None)
        with pytest.raises(expected[0], match=expected[1]) as err:
            cm.restore(target, [cm.Source(prefix, map={"model/": "/"})])
        if kind == "exception":
            assert "injected" in str(err.value.__cause__)
        assert all(not v.numpy().any() for v in target.vs), (k, [v.numpy()[0] for v in target.vs])
    monkeypatch.setattr(eager, "_fast_ops", real)
    cm.restore(target, [cm.Source(prefix, map={"model/": "/"})])
    assert [float(v.numpy()[0]) for v in target.vs] == [i + 1.0 for i in range(n)]


def test_assign_all_puts_back_the_variable_in_flight():
    from ckptmerge.core.errors import RestoreError
    from ckptmerge.restoring.backends.common import assign_all

    store = {"a": 0, "b": 0, "c": 0}

    def assign(var, value):
        store[var] = value
        if var == "b":
            raise ValueError("b failed after it changed")

    with pytest.raises(RestoreError, match="variable 2 of 3 failed; every target was put back"):
        assign_all([("a", 1), ("b", 2), ("c", 3)], assign, store.get, store.__setitem__)
    assert store == {"a": 0, "b": 0, "c": 0}

    def broken_put_back(var, old):
        if var == "a":
            raise OSError("gone")
        store[var] = old

    with pytest.raises(RestoreError, match="1 target"):
        assign_all([("a", 1), ("b", 2)], assign, store.get, broken_put_back)


KERAS_INJECT = """
import json, sys
import numpy as np, keras
import ckptmerge as cm
n = 8
model = keras.Sequential([keras.Input((2,))] + [keras.layers.Dense(2, name=f"d{i}") for i in range(n // 2)], name="m")
new = {w.path: np.full(w.shape, 7.0, "float32") for w in model.weights}
old = {w.path: np.array(w.numpy()) for w in model.weights}
cls = type(model.weights[0])
real = cls.assign
results = []
for when in ("before", "after"):
    for k in range(1, n + 1):
        calls = [0]
        def assign(self, value, *a, **kw):
            calls[0] += 1
            if calls[0] == k and when == "before":
                raise RuntimeError("injected")
            out = real(self, value, *a, **kw)
            if calls[0] == k:
                raise RuntimeError("injected")
            return out
        cls.assign = assign
        try:
            cm.restore(model, [cm.Source.from_values(new)])
            error = ""
        except cm.RestoreError as e:
            error = str(e)
        finally:
            cls.assign = real
        same = all(np.array_equal(w.numpy(), old[w.path]) for w in model.weights)
        results.append([when, k, same, error[:60]])
cm.restore(model, [cm.Source.from_values(new)])
print(json.dumps({"backend": keras.backend.backend(), "results": results,
                  "restored": all(np.array_equal(w.numpy(), new[w.path]) for w in model.weights)}))
"""


def test_keras_on_jax_an_exception_at_any_assignment_leaves_every_variable_as_it_was():
    pytest.importorskip("jax")
    out = _child(KERAS_INJECT, backend="jax")
    assert out["backend"] == "jax" and out["restored"]
    assert len(out["results"]) == 16
    for when, k, same, error in out["results"]:
        assert same and error.startswith(f"Assigning target variable {k} of 8 failed"), (when, k, error)


# -- real SIGINT, swept across the restore ----------------------------------------------------

SWEEP = """
import json, os, signal, sys, threading, time
import numpy as np
backend, n, rounds, prefix = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
import ckptmerge as cm
if backend == "tensorflow":
    import tensorflow as tf
    src = tf.Module(); src.vs = [tf.Variable(np.ones((8,), np.float32)) for _ in range(n)]
    prefix = tf.train.Checkpoint(model=src).write(prefix)
    target = tf.Module(); target.vs = [tf.Variable(np.zeros((8,), np.float32)) for _ in range(n)]
    variables = target.vs
    source = cm.Source(prefix, map={"model/": "/"})
    def reset():
        for v in variables:
            v.assign(np.zeros((8,), np.float32))
    def count_new():
        return sum(int(v.numpy()[0] == 1.0) for v in variables)
else:
    import keras
    target = keras.Sequential([keras.Input((2,))] + [keras.layers.Dense(2, name=f"d{i}") for i in range(n // 2)])
    variables = target.weights
    source = cm.Source.from_values({w.path: np.ones(w.shape, "float32") for w in variables})
    def reset():
        for w in variables:
            w.assign(np.zeros(w.shape, "float32"))
    def count_new():
        return sum(int(np.all(np.asarray(w.numpy()) == 1.0)) for w in variables)
reset(); cm.restore(target, [source]); reset()
t0 = time.perf_counter(); cm.restore(target, [source]); duration = time.perf_counter() - t0
outcomes = []
for r in range(rounds):
    reset()
    delay = duration * (r + 0.5) / rounds * 1.2
    timer = threading.Timer(delay, os.kill, (os.getpid(), signal.SIGINT))
    interrupted = False
    try:
        timer.start()
        try:
            cm.restore(target, [source])
        finally:
            timer.join()
    except KeyboardInterrupt:
        interrupted = True
    except RuntimeError as e:  # CPython: a SIGINT inside Thread.start() of a reader thread can
        if "lock" not in str(e):  # surface as "release unlocked lock"; the model must still be whole
            raise
        interrupted = True
    outcomes.append([interrupted, count_new()])
print(json.dumps({"n": len(variables), "duration": duration, "outcomes": outcomes}))
"""


@pytest.mark.parametrize("backend,n,rounds", [("tensorflow", 500, 12), ("jax", 200, 8)])
def test_a_real_sigint_anywhere_in_a_restore_leaves_all_old_or_all_new(tmp_path, backend, n, rounds):
    if backend == "jax":
        pytest.importorskip("jax")
    out = _child(SWEEP, backend, n, rounds, tmp_path / "ckpt", backend=backend)
    total = out["n"]
    partial = [(i, new) for i, (_, new) in enumerate(out["outcomes"]) if new not in (0, total)]
    assert not partial, f"rounds that left a half-restored model ({total} variables): {partial}"
    rolled_back = sum(1 for interrupted, new in out["outcomes"] if interrupted and new == 0)
    assert rolled_back >= 1, out  # the sweep did interrupt restores, and they were undone
