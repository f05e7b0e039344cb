"""Every Python example of the README runs, against the small world it talks about.

Each example block in README.md is preceded by ``<!-- readme-test: NAME -->``; NAME picks the
world it runs in (the checkpoints ``runs/A``, ``runs/B/model-10``, ... it names). A block that
stops working, or an example added without a tag, fails here.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
import yaml

from conftest import save_tf1

README = Path(__file__).resolve().parents[1] / "README.md"
BLOCK = re.compile(r"<!-- readme-test: ([\w-]+) -->\n```(\w+)\n(.*?)```", re.S)


def _blocks():
    text = README.read_text(encoding="utf-8")
    tagged = {m.start(3): (m.group(1), m.group(2), m.group(3)) for m in BLOCK.finditer(text)}
    untagged = [m.start() for m in re.finditer(r"```python\n", text) if m.end() not in tagged]
    return list(tagged.values()), untagged


def test_every_python_example_is_tagged():
    _, untagged = _blocks()
    assert untagged == [], f"README python blocks without a readme-test tag at offsets {untagged}"


def _block(name):
    return next(code for tag, _, code in _blocks()[0] if tag == name)


@pytest.fixture
def runs_ab(tmp_path, monkeypatch, tf):
    """runs/A (steps 1000 and 2000, a1 a2 a3) and runs/B/model-10 (b1 b2 b3); cwd = tmp_path."""
    monkeypatch.chdir(tmp_path)
    rng = np.random.default_rng(0)
    a = {"a1": rng.random((3, 4), np.float32), "a2": rng.random(4, np.float32), "a3": rng.random((2, 2), np.float32)}
    (tmp_path / "runs" / "A").mkdir(parents=True)
    (tmp_path / "runs" / "B").mkdir()
    save_tf1(tmp_path / "runs" / "A" / "model", {k: v + 1 for k, v in a.items()}, step=1000)
    save_tf1(tmp_path / "runs" / "A" / "model", a, step=2000)
    save_tf1(tmp_path / "runs" / "B" / "model", {"b1": np.ones(4, np.float32), "b2": np.ones(2, np.float32),
                                                 "b3": np.ones(1, np.float32)}, step=10)
    return a


def test_graph_example(tf, runs_ab):
    import ckptmerge as cm

    with tf.Graph().as_default() as g:
        with tf.compat.v1.variable_scope("c"):
            x1 = tf.compat.v1.get_variable("x1", shape=(3, 4))
            tf.compat.v1.get_variable("y1", shape=(4,))
            tf.compat.v1.get_variable("z", shape=(2,))
        with tf.compat.v1.Session(graph=g) as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            exec(_block("graph"), {"cm": cm, "sess": sess, "print": lambda *a: None})
            np.testing.assert_array_equal(sess.run(x1), runs_ab["a1"])


def test_initializers_example(tf, runs_ab, tmp_path):
    import ckptmerge as cm

    with tf.Graph().as_default():
        tf.compat.v1.train.get_or_create_global_step()
        with tf.compat.v1.variable_scope("model"):
            a1 = tf.compat.v1.get_variable("a1", shape=(3, 4))
            tf.compat.v1.get_variable("a2", shape=(4,))
            tf.compat.v1.get_variable("a3", shape=(2, 2))
        code = _block("initializers").replace("...", "result = sess.run(a1)")
        ns = {"cm": cm, "tf": tf, "out": str(tmp_path / "train"), "a1": a1}
        exec(code, ns)
    np.testing.assert_array_equal(ns["result"], runs_ab["a1"])


def test_eager_example(tf, runs_ab):
    import ckptmerge as cm

    model = {k: tf.Variable(np.zeros_like(v)) for k, v in runs_ab.items()}
    exec(_block("eager"), {"cm": cm, "model": model, "array": np.zeros(3)})
    np.testing.assert_array_equal(model["a1"].numpy(), runs_ab["a1"])  # the last restore: model-2000


def test_files_example(runs_ab):
    import ckptmerge as cm

    ns = {"cm": cm}
    exec(_block("files"), ns)
    np.testing.assert_array_equal(ns["kernel"], runs_ab["a1"])


def test_warm_start_example(tf, tmp_path, monkeypatch):
    import ckptmerge as cm

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("RUNS", str(tmp_path / "pretrained"))
    (tmp_path / "pretrained" / "bert-base").mkdir(parents=True)
    (tmp_path / "runs" / "classifier").mkdir(parents=True)
    enc = {"bert/encoder/w": np.full((4, 4), 2, np.float32), "bert/encoder/b": np.full(4, 2, np.float32)}
    save_tf1(tmp_path / "pretrained" / "bert-base" / "model", enc, step=200000)
    save_tf1(tmp_path / "runs" / "classifier" / "ckpt", {"head/kernel": np.full((4, 2), 3, np.float32),
                                                         "head/bias": np.full(2, 3, np.float32)}, step=12)
    (tmp_path / "warm.yaml").write_text(_block("warm-config"))
    model = {"model/encoder/w": tf.Variable(np.zeros((4, 4), np.float32)),
             "model/encoder/b": tf.Variable(np.zeros(4, np.float32)),
             "model/head/kernel": tf.Variable(np.zeros((4, 3), np.float32)),  # one class more
             "model/head/bias": tf.Variable(np.zeros(2, np.float32)),
             "model/head/new_bias": tf.Variable(np.zeros(1, np.float32))}
    exec(_block("warm"), {"cm": cm, "model": model})
    np.testing.assert_array_equal(model["model/encoder/w"].numpy(), enc["bert/encoder/w"])
    np.testing.assert_array_equal(model["model/head/kernel"].numpy()[:, :2], np.full((4, 2), 3, np.float32))
    np.testing.assert_array_equal(model["model/head/kernel"].numpy()[:, 2], np.zeros(4, np.float32))


def test_merge_example(tf, tmp_path, monkeypatch):
    import ckptmerge as cm

    monkeypatch.chdir(tmp_path)
    for d in ("A", "B", "C_init"):
        (tmp_path / "runs" / d).mkdir(parents=True)
    save_tf1(tmp_path / "runs" / "A" / "model", {"encoder/w": np.ones(3, np.float32),
                                                 "head/w": np.ones(2, np.float32)}, step=1, optimizer_slots=True)
    save_tf1(tmp_path / "runs" / "B" / "model", {"head/w": np.full(2, 5, np.float32)}, step=1)
    init = save_tf1(tmp_path / "runs" / "C_init" / "model", {"encoder/w": np.zeros(3, np.float32),
                                                               "head/w": np.full(2, 9, np.float32)})
    import os
    os.rename(init + ".index", tmp_path / "runs" / "C_init.index")  # the prefix runs/C_init
    os.rename(init + ".data-00000-of-00001", tmp_path / "runs" / "C_init.data-00000-of-00001")
    exec(_block("merge"), {"cm": cm, "print": lambda *a: None})
    assert sorted(cm.load("runs/C/merged")) == ["model/encoder/w", "model/head/w"]
    assert sorted(cm.load("release/model")) == ["encoder/w", "head/w"]
    assert "global_step" not in cm.load("release/model")
    warm = cm.load("runs/C/warm")
    assert warm["head/w"].tolist() == [9.0, 9.0]  # from the template
    np.testing.assert_array_equal(warm["encoder/w"], cm.load("runs/A", ["encoder/w"])["encoder/w"])
    assert tf.train.latest_checkpoint("runs/C").endswith("merged")


def test_keras_jax_example(tmp_path):
    from test_keras_backends import run_backend

    kernel = np.arange(12, dtype=np.float32).reshape(4, 3)
    (tmp_path / "runs" / "estimator").mkdir(parents=True)
    save_tf1(tmp_path / "runs" / "estimator" / "model.ckpt", {"dnn/hiddenlayer_0/kernel": kernel,
                                                              "dnn/hiddenlayer_0/bias": np.ones(3, np.float32)}, step=5)
    result = run_backend("jax", f"""
        import os, ckptmerge as cm
        os.chdir({str(tmp_path)!r})
        exec({_block("keras-jax")!r})
        result = {{"kernel": model.get_layer("h0").kernel.numpy().tolist()}}
    """)
    assert not result["tensorflow_imported"]
    np.testing.assert_array_equal(np.float32(result["kernel"]), kernel)


def test_suggest_example(tf, tmp_path, monkeypatch):
    import keras

    import ckptmerge as cm

    monkeypatch.chdir(tmp_path)
    (tmp_path / "runs" / "estimator").mkdir(parents=True)
    values = {"dnn/hiddenlayer_0/kernel": np.ones((4, 8), np.float32), "dnn/hiddenlayer_0/bias": np.ones(8, np.float32),
              "dnn/logits/kernel": np.full((8, 2), 2, np.float32), "dnn/logits/bias": np.full(2, 2, np.float32)}
    save_tf1(tmp_path / "runs" / "estimator" / "model.ckpt", values, step=5)
    inp = keras.Input((4,))
    model = keras.Model(inp, keras.layers.Dense(2, name="out")(keras.layers.Dense(8, name="h0")(inp)))
    exec(_block("suggest"), {"cm": cm, "model": model, "print": lambda *a: None})
    np.testing.assert_array_equal(model.get_layer("out").kernel.numpy(), values["dnn/logits/kernel"])
    cfg = yaml.safe_load((tmp_path / "warm.yaml").read_text())
    assert cfg["sources"][0]["map"] == {"dnn/hiddenlayer_0/": "h0/", "dnn/logits/": "out/"}
