"""Shared fixtures: TF set-up, and small helpers that write real checkpoints with TensorFlow."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

REPO = Path(__file__).resolve().parents[1]

# A suite started as a background job of a non-interactive shell (`cmd &` in a script, CI steps)
# inherits SIGINT as ignored: Python then installs no handler of its own, and every child started
# with plain subprocess inherits the ignore, so the Ctrl-C tests' children never see their SIGINT
# and time out. Python's own handler, as an interactive start gives it, puts SIGINT back: pytest
# stops on Ctrl-C again, and as a handled signal it is reset to the default when a child execs.
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


def pytest_configure(config):
    """Split the CPU into two logical devices (for MirroredStrategy tests) before TF starts."""
    import tensorflow

    cpu = tensorflow.config.list_physical_devices("CPU")[0]
    conf = tensorflow.config.LogicalDeviceConfiguration()
    tensorflow.config.set_logical_device_configuration(cpu, [conf, conf])


@pytest.fixture(scope="session")
def tf():
    """TensorFlow, imported once (tests that do not need it never import it)."""
    import tensorflow

    return tensorflow


def save_tf1(prefix, values, step=None, *, optimizer_slots=False):
    """Write a name-based checkpoint with tf.compat.v1.train.Saver; return its prefix.

    ``values`` maps variable names to numpy values. With ``optimizer_slots`` an Adam train op
    runs once, so the checkpoint also holds ``*/Adam``, ``*/Adam_1``, ``beta1_power``, ...
    """
    import tensorflow as tf

    graph = tf.Graph()
    with graph.as_default():
        tvars = {n: tf.compat.v1.get_variable(n, initializer=np.asarray(v)) for n, v in values.items()}
        if optimizer_slots:
            floats = [v for v in tvars.values() if v.dtype.base_dtype.is_floating]
            loss = tf.add_n([tf.reduce_sum(tf.cast(v, tf.float32)) for v in floats])
            tf.compat.v1.train.get_or_create_global_step()
            train = tf.compat.v1.train.AdamOptimizer(0.1).minimize(loss)
        saver = tf.compat.v1.train.Saver(max_to_keep=10)
        with tf.compat.v1.Session(graph=graph) as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            if optimizer_slots:
                sess.run(train)
            return saver.save(sess, str(prefix), global_step=step)


@pytest.fixture
def ab_checkpoints(tmp_path, tf):
    """Checkpoints A (dir with a state file, step 10) and B (explicit prefix), and their values."""
    rng = np.random.default_rng(42)
    a = {"a1": rng.standard_normal((3, 4)).astype(np.float32),
         "a2": rng.standard_normal((4,)).astype(np.float32),
         "a3": rng.standard_normal((2, 2)).astype(np.float32)}
    b = {"b1": rng.standard_normal((4,)).astype(np.float32),
         "b2": rng.standard_normal((5,)).astype(np.float32),
         "b3": rng.standard_normal((6,)).astype(np.float32)}
    (tmp_path / "A").mkdir()
    (tmp_path / "B").mkdir()
    save_tf1(tmp_path / "A" / "model", {k: v * 0 for k, v in a.items()}, step=5)
    save_tf1(tmp_path / "A" / "model", a, step=10)
    b_prefix = save_tf1(tmp_path / "B" / "model", b, step=10)
    return {"A": str(tmp_path / "A"), "B": b_prefix, "a": a, "b": b, "root": tmp_path}


def run_child(code, *args, drop_root=False, preexec_fn=None):
    """Run a Python snippet from the repo (JSON on its last stdout line); ``drop_root`` runs it
    without root's capabilities, so file permissions apply."""
    cmd = [sys.executable, "-c", textwrap.dedent(code), *map(str, args)]
    if drop_root and os.geteuid() == 0:
        if not shutil.which("setpriv"):
            pytest.skip("running as root without setpriv: permissions are not enforced")
        cmd = ["setpriv", "--bounding-set=-all", "--inh-caps=-all", "--", *cmd]
    out = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=60, preexec_fn=preexec_fn)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.fixture
def small_tmpfs(tmp_path):
    """``make(size)``: mount a tmpfs of that size (e.g. "1m") to fill up; needs root and mount
    permission, else the test is skipped. Everything mounted is unmounted afterwards."""
    mounted = []

    def make(size):
        mnt = tmp_path / f"tmpfs-{len(mounted)}"
        mnt.mkdir()
        if os.geteuid() != 0 or subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(mnt)],
                                               capture_output=True).returncode != 0:
            pytest.skip("cannot mount a small tmpfs here")
        mounted.append(mnt)
        return mnt

    yield make
    for mnt in mounted:
        subprocess.run(["umount", str(mnt)], check=True)
