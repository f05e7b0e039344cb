"""Orbax outputs restore with Orbax's own checkpointers (issue 33): a ``tf.train.Checkpoint`` run
averaged with ``--format orbax`` (CLI) or ``format="orbax"`` (API) restores with
``PyTreeCheckpointer().restore``, ``StandardCheckpointer().restore`` given an abstract tree of
the expected shapes and dtypes, and Orbax's V1 ``load``; values compared with a NumPy mean.

Orbax runs in its own process (it starts JAX; TF is in this one): the checks print JSON.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import ckptmerge as cm
from _cli_util import run

pytest.importorskip("orbax.checkpoint")

CHECK = textwrap.dedent('''
    import json, sys
    import jax, numpy as np
    import orbax.checkpoint as ocp
    import orbax.checkpoint.experimental.v1 as ocp1
    folder, expected = sys.argv[1], json.loads(sys.argv[2])
    def flat(tree, prefix=""):
        out = {}
        for k, v in tree.items():
            if isinstance(v, dict):
                out.update(flat(v, prefix + k + "/"))
            else:
                out[prefix + k] = np.asarray(v)
        return out
    v0 = flat(ocp.PyTreeCheckpointer().restore(folder + "/pytree"))
    abstract = jax.tree_util.tree_map(lambda x: jax.ShapeDtypeStruct(np.shape(x), np.asarray(x).dtype),
                                      ocp.PyTreeCheckpointer().restore(folder + "/pytree"))
    standard = flat(ocp.StandardCheckpointer().restore(folder + "/pytree", abstract))
    v1 = flat(ocp1.load(folder))
    rows = {}
    for how, got in (("v0", v0), ("standard", standard), ("v1", v1)):
        rows[how] = {"names": sorted(got), "close": all(np.allclose(got[k], np.asarray(v), rtol=1e-6)
                                                         for k, v in expected.items() if k in got)}
    print(json.dumps(rows))
''')


def save_run(tf, directory, steps=(100, 200, 300)):
    m = tf.Module()
    m.enc = tf.Module()
    m.enc.kernel = tf.Variable(np.zeros((3, 4), np.float32), name="enc/kernel")
    m.enc.bias = tf.Variable(np.zeros(4, np.float32), name="enc/bias")
    m.head = tf.Variable(np.zeros((4, 2), np.float32), name="head/kernel")
    mgr = tf.train.CheckpointManager(tf.train.Checkpoint(model=m), str(directory), max_to_keep=10)
    saved = []
    for i, s in enumerate(steps):
        rng = np.random.RandomState(i)
        for v in (m.enc.kernel, m.enc.bias, m.head):
            v.assign(rng.standard_normal(v.shape).astype(np.float32))
        saved.append({"enc/kernel": m.enc.kernel.numpy(), "enc/bias": m.enc.bias.numpy(), "head/kernel": m.head.numpy()})
        mgr.save(checkpoint_number=s)
    return saved


def orbax_check(folder, expected):
    proc = subprocess.run([sys.executable, "-c", CHECK, str(folder),
                           json.dumps({k: v.tolist() for k, v in expected.items()})],
                          capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_cli_and_api_orbax_averages_restore_with_orbax(tf, tmp_path):
    saved = save_run(tf, tmp_path / "run")
    mean = {k: np.mean([s[k] for s in saved], axis=0) for k in saved[0]}
    result = run("average", tmp_path / "run", "--last", "3", "--format", "orbax", "-o", tmp_path / "cli")
    assert result.exit_code == 0, result.output
    cm.merge([cm.combine(str(tmp_path / "run"), "mean", last=3)], tmp_path / "api", format="orbax")
    for folder in (tmp_path / "cli", tmp_path / "api"):
        rows = orbax_check(folder, mean)
        for how, row in rows.items():
            assert row == {"names": sorted(mean), "close": True}, (folder, how, row)
