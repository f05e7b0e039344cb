"""Restores into the variables TF distribution strategies create, on real in-process clusters.

- ``ParameterServerStrategy`` with a variable partitioner makes ``ShardedVariable``s whose shards
  live on parameter servers: an in-process cluster (``tf.distribute.Server`` for the workers and
  parameter servers, the test process as chief) runs in a child interpreter, so its servers end
  with it.
- ``MultiWorkerMirroredStrategy`` with two workers: two local processes with ``TF_CONFIG``, each
  restoring the same plan into its ``MirroredVariable``s; both must end with the checkpoint's
  values (checked across workers with an all-reduce too).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[1]

EMB = np.arange(24, dtype=np.float32).reshape(6, 4)
BIAS = np.array([0.5, -1.0, 2.0], np.float32)


def _free_ports(n: int) -> list:
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("localhost", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


def _env(**extra: str) -> dict:
    return dict(os.environ, PYTHONPATH=str(REPO), TF_CPP_MIN_LOG_LEVEL="3", **extra)


PSS_PRELUDE = """
import json, sys
import numpy as np, tensorflow as tf
import ckptmerge as cm
ports = json.loads(sys.argv[1])
spec = {"worker": [f"localhost:{ports[0]}"], "ps": [f"localhost:{ports[1]}", f"localhost:{ports[2]}"],
        "chief": [f"localhost:{ports[3]}"]}
cluster = tf.train.ClusterSpec(spec)
servers = [tf.distribute.Server(cluster, job_name=job, task_index=i, protocol="grpc", start=True)
           for job in ("worker", "ps") for i in range(len(spec[job]))]
resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(cluster, rpc_layer="grpc",
                                                                 task_type="chief", task_id=0)

def sharded_module(shards):
    strategy = tf.distribute.experimental.ParameterServerStrategy(
        resolver, variable_partitioner=tf.distribute.experimental.partitioners.FixedShardsPartitioner(shards))
    with strategy.scope():
        m = tf.Module()
        m.emb = tf.Variable(tf.zeros((6, 4)), name="emb")
        m.bias = tf.Variable(tf.zeros((3,)), name="bias")
    return m

def plain_module():
    m = tf.Module()
    m.emb = tf.Variable(tf.zeros((6, 4)), name="emb")
    m.bias = tf.Variable(tf.zeros((3,)), name="bias")
    return m

def values(m):
    out = {}
    for name in ("emb", "bias"):
        v = getattr(m, name)
        out[name] = tf.concat([s.read_value() for s in v.variables], 0).numpy().tolist() \\
            if hasattr(v, "_var_offsets") else v.numpy().tolist()
    return out
"""


def run_pss(scenarios: dict, *args) -> dict:
    """Run each scenario's code (a function body returning a JSON-able dict) on one in-process
    cluster in one child: one TF start, one cluster. Return ``{name: its dict, or its traceback}``."""
    body = ["import traceback", "results = {}"]
    for name, code in scenarios.items():
        body += [f"def scenario_{name}():", textwrap.indent(textwrap.dedent(code), "    "),
                 "try:", f"    results[{name!r}] = scenario_{name}()",
                 "except Exception:", f"    results[{name!r}] = {{'error': traceback.format_exc()}}"]
    body.append("print(json.dumps(results))")
    script = textwrap.dedent(PSS_PRELUDE) + "\n".join(body) + "\n"
    out = subprocess.run([sys.executable, "-c", script, json.dumps(_free_ports(4)), *map(str, args)],
                         cwd=REPO, env=_env(), capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def scenario(results: dict, name: str) -> dict:
    result = results[name]
    assert "error" not in result, result.get("error")
    return result


@pytest.fixture(scope="module")
def unsharded_checkpoint(tmp_path_factory):
    """An ordinary object-based checkpoint of a module with 'emb' and 'bias'."""
    import tensorflow as tf

    m = tf.Module()
    m.emb = tf.Variable(EMB, name="emb")
    m.bias = tf.Variable(BIAS, name="bias")
    return tf.train.Checkpoint(model=m).write(str(tmp_path_factory.mktemp("plain") / "ckpt"))


UNSHARDED_INTO_SHARDED = """
    m = sharded_module(2)
    report = cm.restore(m, [cm.Source(sys.argv[2])])
    return {"restored": report.restored, "kinds": type(m.emb).__name__,
            "shards": [list(s.shape) for s in m.emb.variables], **values(m)}
"""

SHARDED_TO_OTHERS = """
    src = sharded_module(2)
    cm.restore({"emb": src.emb, "bias": src.bias},        # a dict of ShardedVariables is a target too
               [cm.Source.from_values({"emb": np.arange(24, dtype="float32").reshape(6, 4),
                                       "bias": np.array([0.5, -1.0, 2.0], "float32")})])
    prefix = tf.train.Checkpoint(model=src).write(sys.argv[3])
    names = [v.name for v in cm.list_variables(prefix)]
    plain = plain_module()
    cm.restore(plain, [cm.Source(prefix, map={"model/": "/"})])
    three = sharded_module(3)
    cm.restore(three, [cm.Source(prefix, map={"model/": "/"})])
    return {"names": names, "plain": values(plain), "three": values(three),
            "three_shards": [list(s.shape) for s in three.emb.variables]}
"""


@pytest.fixture(scope="module")
def pss(unsharded_checkpoint, tmp_path_factory):
    """The ParameterServerStrategy scenarios below, on one in-process cluster in one child."""
    d = tmp_path_factory.mktemp("pss")
    return run_pss({"unsharded_into_sharded": UNSHARDED_INTO_SHARDED, "sharded_to_others": SHARDED_TO_OTHERS,
                    "keras": textwrap.dedent(KERAS_SHARDED) + KERAS_SHARDED_RESTORE},
                   unsharded_checkpoint, d / "sharded" / "ckpt", d / "plain.weights.h5")


def test_unsharded_checkpoint_restores_into_sharded_variables(pss):
    result = scenario(pss, "unsharded_into_sharded")
    assert result["kinds"] == "ShardedVariable" and result["shards"] == [[3, 4], [3, 4]]
    assert result["restored"] == ["bias", "emb"]
    np.testing.assert_array_equal(np.float32(result["emb"]), EMB)
    np.testing.assert_array_equal(np.float32(result["bias"]), BIAS)


def test_sharded_checkpoint_restores_unsharded_and_into_other_shard_counts(pss):
    result = scenario(pss, "sharded_to_others")
    assert "model/emb" in result["names"] and "ShardedVariable" not in result["names"]
    assert result["three_shards"] == [[2, 4], [2, 4], [2, 4]]
    for key in ("plain", "three"):
        np.testing.assert_array_equal(np.float32(result[key]["emb"]), EMB, err_msg=key)
        np.testing.assert_array_equal(np.float32(result[key]["bias"]), BIAS, err_msg=key)


KERAS_SHARDED = """
    import keras
    strategy = tf.distribute.experimental.ParameterServerStrategy(
        resolver, variable_partitioner=tf.distribute.experimental.partitioners.FixedShardsPartitioner(2))

    def build():
        return keras.Sequential([keras.Input((3,), dtype="int32"), keras.layers.Embedding(6, 4, name="emb"),
                                 keras.layers.Dense(3, name="d")], name="m")

    with strategy.scope():
        model = build()
    def joined(w):
        v = w.value
        return (tf.concat([s.read_value() for s in v.variables], 0) if hasattr(v, "_var_offsets") else v).numpy()
"""


KERAS_SHARDED_RESTORE = """
plain = build()
plain.get_layer("emb").embeddings.assign(np.arange(24, dtype="float32").reshape(6, 4))
plain.get_layer("d").kernel.assign(np.full((4, 3), 0.25, "float32"))
plain.get_layer("d").bias.assign(np.array([0.5, -1.0, 2.0], "float32"))
plain.save_weights(sys.argv[4])
kinds = sorted({type(w.value).__name__ for w in model.weights})
report = cm.restore(model, [cm.Source(sys.argv[4])])
after = {w.path: joined(w).tolist() for w in model.weights}
snap = cm.snapshot(model)  # the snapshot reads the sharded values too
for w in model.weights:
    w.assign(np.zeros(w.shape, "float32"))
cm.restore(model, [snap])
again = {w.path: joined(w).tolist() for w in model.weights}
return {"kinds": kinds, "restored": report.restored, "after": after, "again": again,
        "shards": [list(s.shape) for s in model.get_layer("emb").embeddings.value.variables]}
"""


def test_unsharded_keras_weights_restore_into_a_sharded_keras_model(pss):
    """Keras variables made under a variable partitioner hold a ShardedVariable (no read_value)."""
    result = scenario(pss, "keras")
    assert result["kinds"] == ["ShardedVariable"] and result["shards"] == [[3, 4], [3, 4]]
    assert result["restored"] == ["m/d/bias", "m/d/kernel", "m/emb/embeddings"]
    for values in (result["after"], result["again"]):
        np.testing.assert_array_equal(np.float32(values["m/emb/embeddings"]), EMB)
        np.testing.assert_array_equal(np.float32(values["m/d/kernel"]), np.full((4, 3), 0.25, np.float32))
        np.testing.assert_array_equal(np.float32(values["m/d/bias"]), BIAS)


def test_sharded_checkpoint_is_named_by_object_path_not_class_name(tmp_path):
    import tensorflow as tf
    from tensorflow.python.distribute.sharded_variable import ShardedVariable

    import ckptmerge as cm

    m = tf.Module()
    m.emb = ShardedVariable([tf.Variable(EMB[:3], name="emb/part_0"), tf.Variable(EMB[3:], name="emb/part_1")])
    prefix = tf.train.Checkpoint(model=m).write(str(tmp_path / "ckpt"))
    assert [v.name for v in cm.list_variables(prefix) if v.kind == "variable"] == ["model/emb"]
    np.testing.assert_array_equal(cm.load(prefix, ["model/emb"])["model/emb"], EMB)


WORKER = """
import json, os, sys
import numpy as np, tensorflow as tf
import ckptmerge as cm
strategy = tf.distribute.MultiWorkerMirroredStrategy()
with strategy.scope():
    m = tf.Module()
    m.emb = tf.Variable(tf.zeros((6, 4)), name="emb")
    m.bias = tf.Variable(tf.zeros((3,)), name="bias")
report = cm.restore(m, [cm.Source(sys.argv[1])])
# Every replica of every worker must hold the checkpoint's values: sum them across the cluster.
total = strategy.reduce(tf.distribute.ReduceOp.SUM,
                        strategy.run(lambda: tf.reduce_sum(m.emb) + tf.reduce_sum(m.bias)), axis=None)
print(json.dumps({"kind": type(m.emb).__name__, "restored": report.restored,
                  "emb": m.emb.numpy().tolist(), "bias": m.bias.numpy().tolist(),
                  "cluster_sum": float(total), "replicas": strategy.num_replicas_in_sync}))
"""


def test_multi_worker_mirrored_workers_restore_the_same_plan(unsharded_checkpoint):
    ports = _free_ports(2)
    cluster = {"worker": [f"localhost:{p}" for p in ports]}
    procs = [subprocess.Popen([sys.executable, "-c", WORKER, unsharded_checkpoint], cwd=REPO,
                              env=_env(TF_CONFIG=json.dumps({"cluster": cluster, "task": {"type": "worker", "index": i}})),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for i in range(2)]
    results = []
    for p in procs:
        out, err = p.communicate(timeout=300)
        assert p.returncode == 0, err[-3000:]
        results.append(json.loads(out.strip().splitlines()[-1]))
    per_worker = float(EMB.sum() + BIAS.sum())
    for r in results:
        assert r["kind"] == "MirroredVariable" and r["restored"] == ["bias", "emb"]
        np.testing.assert_array_equal(np.float32(r["emb"]), EMB)
        np.testing.assert_array_equal(np.float32(r["bias"]), BIAS)
        assert r["cluster_sum"] == pytest.approx(per_worker * r["replicas"])
