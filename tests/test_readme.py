"""Every Python example of the README and of the docs pages runs, against the small world it talks about.

Each example block in README.md and docs/*.md is preceded by ``<!-- readme-test: NAME -->``; NAME
(unique across the pages) picks the test that runs it, in the world it talks about (the
checkpoints ``runs/A``, ``runs/B/model-10``, ... it names). A block that stops working, an example
added without a tag, or a tag that no test runs fails here. A new page in docs/ is picked up
without a change here. How tags are found and outputs compared: tests/_examples.py; the Recipes
page's examples run in tests/test_recipes.py.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import yaml

import test_recipes  # noqa: F401  (its @runs marks count for the check below)
from _examples import TESTED, blocks, runs
from _examples import block as _block
from conftest import save_tf1

ROOT = Path(__file__).resolve().parents[1]


def test_every_python_example_is_tagged():
    _, untagged, _ = blocks()
    assert untagged == [], f"python blocks without a readme-test tag at {untagged}"


def test_every_tag_is_unique_and_run_by_a_test():
    tagged, _, repeated = blocks()
    assert repeated == [], f"readme-test tags used twice: {repeated}"
    assert sorted(set(tagged) - TESTED) == [], "tagged examples that no test runs"
    assert sorted(TESTED - set(tagged)) == [], "tests whose tagged example no page has any more"


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


GRAPH_TAGS = ("graph", "restore-graph")  # the README's example and its page's


@runs(*GRAPH_TAGS)
@pytest.mark.parametrize("tag", GRAPH_TAGS)
def test_graph_example(tf, runs_ab, tag):
    import ckptmerge as cm

    with tf.Graph().as_default() as g:
        with tf.compat.v1.variable_scope("c"):
            x1 = tf.compat.v1.get_variable("x1", shape=(3, 4))
            tf.compat.v1.get_variable("y1", shape=(4,))
            tf.compat.v1.get_variable("z", shape=(2,))
        with tf.compat.v1.Session(graph=g) as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            exec(_block(tag), {"cm": cm, "sess": sess, "print": lambda *a: None})
            np.testing.assert_array_equal(sess.run(x1), runs_ab["a1"])


@runs("tensor-operations")
def test_tensor_operations_example(tmp_path, monkeypatch):
    from safetensors.numpy import save_file

    import ckptmerge as cm

    rng = np.random.default_rng(0)
    parts = {k: rng.standard_normal((8, 8)).astype("float32") for k in ("query", "key", "value")}
    table = rng.standard_normal((1, 17, 8)).astype("float32")
    (tmp_path / "vit").mkdir()
    save_file({**{f"attn.{k}.weight": w for k, w in parts.items()},
               **{f"attn.{k}.bias": np.zeros(8, "float32") for k in parts},
               "position_embedding.embeddings": table}, str(tmp_path / "vit" / "model.safetensors"))
    monkeypatch.chdir(tmp_path)
    model = [cm.VariableInfo("block/qkv/kernel", (8, 24), "float32"),
             cm.VariableInfo("position_embedding/embeddings", (17, 8), "float32")]
    ns = {"cm": cm, "model": model, "print": lambda *a: None}
    exec(_block("tensor-operations"), ns)
    plan = ns["plan"]
    assert sorted(plan.assignments) == ["block/qkv/kernel", "position_embedding/embeddings"]
    out = str(tmp_path / "out.safetensors")
    cm.merge([src := ns["src"]], out, template=model)
    assert src.layout == "torch"
    values = cm.load(out, ["block/qkv/kernel", "position_embedding/embeddings"])
    np.testing.assert_array_equal(values["block/qkv/kernel"], np.concatenate([w.T for w in parts.values()], 1))
    np.testing.assert_array_equal(values["position_embedding/embeddings"], table[0])


@runs("initializers")
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


@runs("eager")
def test_eager_example(tf, runs_ab):
    import ckptmerge as cm

    model = {k: tf.Variable(np.zeros_like(v)) for k, v in runs_ab.items()}
    exec(_block("eager"), {"cm": cm, "model": model, "array": np.zeros(3)})
    np.testing.assert_array_equal(model["a1"].numpy(), runs_ab["a1"])  # the last restore: model-2000


@runs("follow")
def test_follow_example(tf, runs_ab):
    import ckptmerge as cm

    model = {k: tf.Variable(np.zeros_like(v)) for k, v in runs_ab.items()}
    seen = []
    ns = {"cm": cm, "model": model, "num_steps": 2000,
          "evaluate": lambda m, step: seen.append((step, m["a1"].numpy().copy()))}
    exec(_block("follow"), ns)
    assert [s for s, _ in seen] == [1000, 2000]  # every checkpoint, oldest first
    np.testing.assert_array_equal(seen[1][1], runs_ab["a1"])
    np.testing.assert_array_equal(seen[0][1], runs_ab["a1"] + 1)


@runs("watch")
def test_watch_example(runs_ab):
    import ckptmerge as cm

    ns = {"cm": cm}
    exec(_block("watch"), ns)
    assert sorted(v.name for v in ns["names"]) == ["a1", "a2", "a3"]  # the latest only, read while pinned


@runs("files")
def test_files_example(runs_ab):
    import ckptmerge as cm

    ns = {"cm": cm}
    exec(_block("files"), ns)
    np.testing.assert_array_equal(ns["kernel"], runs_ab["a1"])


@pytest.fixture
def warm_world(tf, tmp_path, monkeypatch):
    """The world of the README's warm-start config (written as warm.yaml) and a model for it."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("RUNS", str(tmp_path / "pretrained"))
    (tmp_path / "pretrained" / "bert-base").mkdir(parents=True)
    (tmp_path / "runs" / "classifier").mkdir(parents=True)
    save_tf1(tmp_path / "pretrained" / "bert-base" / "model", WARM_ENCODER, step=200000)
    save_tf1(tmp_path / "runs" / "classifier" / "ckpt", {"head/kernel": np.full((4, 2), 3, np.float32),
                                                         "head/bias": np.full(2, 3, np.float32)}, step=12)
    (tmp_path / "warm.yaml").write_text(_block("warm-config"))
    return {"model/encoder/w": tf.Variable(np.zeros((4, 4), np.float32)),
            "model/encoder/b": tf.Variable(np.zeros(4, np.float32)),
            "model/head/kernel": tf.Variable(np.zeros((4, 3), np.float32)),  # one class more
            "model/head/bias": tf.Variable(np.zeros(2, np.float32)),
            "model/head/new_bias": tf.Variable(np.zeros(1, np.float32))}


WARM_ENCODER = {"bert/encoder/w": np.full((4, 4), 2, np.float32), "bert/encoder/b": np.full(4, 2, np.float32)}


def _assert_warm_started(model):
    np.testing.assert_array_equal(model["model/encoder/w"].numpy(), WARM_ENCODER["bert/encoder/w"])
    np.testing.assert_array_equal(model["model/head/kernel"].numpy()[:, :2], np.full((4, 2), 3, np.float32))
    np.testing.assert_array_equal(model["model/head/kernel"].numpy()[:, 2], np.zeros(4, np.float32))


@runs("warm-config", "warm")
def test_warm_start_example(warm_world):
    import ckptmerge as cm

    exec(_block("warm"), {"cm": cm, "model": warm_world})
    _assert_warm_started(warm_world)


@runs("config-api")
def test_config_api_example(warm_world):
    exec(_block("config-api"), {"model": warm_world, "print": lambda *a: None})
    _assert_warm_started(warm_world)


@runs("merge")
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


@runs("keras-jax")
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


@runs("drift")
def test_path_drift_example(tf, tmp_path, monkeypatch):
    import keras

    import ckptmerge as cm

    def model_with(attribute):
        class Model(keras.Model):
            def __init__(self):
                super().__init__()
                setattr(self, attribute, keras.layers.Dense(4))

            def call(self, x):
                return getattr(self, attribute)(x)

        model = Model()
        model(np.zeros((1, 3), np.float32))
        return model

    monkeypatch.chdir(tmp_path)
    old = model_with("attn")
    old.attn.kernel.assign(np.full((3, 4), 7, np.float32))
    old.save_weights("old.weights.h5")
    model = model_with("attention")
    printed = []
    exec(_block("drift"), {"cm": cm, "model": model, "print": printed.append})
    assert "Path drift (1)" in printed[0] and "file 'attn' -> model 'attention' (1.00: same 2 entries" in printed[0]
    np.testing.assert_array_equal(model.attention.kernel.numpy(), 7)


@runs("suggest")
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


@runs("combine")
def test_combine_example(tf, tmp_path, monkeypatch):
    import ckptmerge as cm
    from ckptmerge.formats.tf.writer import BundleWriter

    monkeypatch.chdir(tmp_path)
    rng = np.random.default_rng(0)

    def ckpt(prefix, scale):
        with BundleWriter(prefix) as w:
            w.add("dense/kernel", (rng.standard_normal((4, 3)) * scale).astype(np.float32))
            w.add("self_attention/kernel", (rng.standard_normal((3, 3)) * scale).astype(np.float32))
            w.add("global_step", np.array(0, np.int64))

    for step in range(1000, 6001, 1000):
        ckpt(f"runs/A/ckpt-{step}", 1.0)
    for name in ("ft/a", "ft/b", "ft/c", "pretrained"):
        ckpt(name, 0.5)
    model = {"dense/kernel": tf.Variable(tf.zeros((4, 3))), "self_attention/kernel": tf.Variable(tf.zeros((3, 3)))}
    scope = {"cm": cm, "model": model, "print": lambda *a: None}
    exec(_block("combine"), scope)
    assert [d["step"] for d in scope["avg"].report().inputs] == [2000, 3000, 4000, 5000, 6000]
    assert sorted(cm.load("runs/A/avg-last5")) == ["dense/kernel", "self_attention/kernel"]
    assert sorted(cm.load("out/soup.safetensors")) == ["dense/kernel", "self_attention/kernel"]
    assert sorted(scope["report"].restored) == ["dense/kernel", "self_attention/kernel"]
    want = cm.combine([f"runs/A/ckpt-{s}" for s in range(2000, 6000, 1000)], "ema", decay=0.9).open()
    np.testing.assert_array_equal(model["dense/kernel"].numpy(), want.read(["dense/kernel"])["dense/kernel"])
    want.close()


@runs("mergekit")
def test_mergekit_example(tmp_path, monkeypatch):
    import ckptmerge as cm
    from safetensors.numpy import save_file

    monkeypatch.chdir(tmp_path)
    rng = np.random.default_rng(0)
    base = {"model.layers.0.mlp.up_proj.weight": rng.standard_normal((4, 3)).astype(np.float32)}
    for name, scale in (("base", 0.0), ("ft1", 0.1), ("ft2", 0.1)):
        (tmp_path / "models" / name).mkdir(parents=True)
        save_file({k: (v + scale * rng.standard_normal(v.shape)).astype(np.float32) for k, v in base.items()},
                  str(tmp_path / "models" / name / "model.safetensors"))
    (tmp_path / "configs").mkdir()
    (tmp_path / "configs" / "ties.yml").write_text(
        "models:\n  - model: ../models/ft1\n    parameters: {weight: 1.0, density: 0.5}\n"
        "  - model: ../models/ft2\n    parameters: {weight: 0.5}\n"
        "merge_method: ties\nbase_model: ../models/base\nparameters:\n  normalize: true\ndtype: float32\n")
    printed = []
    exec(_block("mergekit"), {"cm": cm, "print": printed.append})
    assert "Conventions: mergekit" in str(printed[0])
    assert sorted(cm.load("out/merged.safetensors")) == sorted(base)


@runs("merge-to-torch")
def test_merge_to_torch_example(tmp_path, monkeypatch):
    pytest.importorskip("keras_hub", reason="keras-hub is in the test extra: pip install -e '.[test]'")
    import shutil

    import _xframe as X
    import ckptmerge as cm
    from safetensors.numpy import load_file

    monkeypatch.chdir(tmp_path)
    shutil.copytree(X.fixture_dir("bert"), tmp_path / "hf" / "bert")
    backbone = X.fresh_backbone("bert")
    cm.restore(backbone, [cm.Source("hf/bert/model.safetensors", layout="torch", align="structure")])
    exec(_block("merge-to-torch"), {"backbone": backbone})
    got, want = load_file("out/model.safetensors"), load_file("hf/bert/model.safetensors")
    assert sorted(got) == sorted(want) and all(np.array_equal(got[k], want[k]) for k in want)


@runs("orbax-flax")
def test_orbax_flax_example(monkeypatch):
    pytest.importorskip("tensorstore")
    import keras

    monkeypatch.chdir(ROOT)
    twin = keras.Sequential([keras.Input((8, 8, 3)), keras.layers.Conv2D(6, 3, padding="same", activation="relu"),
                             keras.layers.Conv2D(4, 3, strides=2, padding="same"),
                             keras.layers.BatchNormalization(epsilon=1e-5), keras.layers.ReLU(),
                             keras.layers.GlobalAveragePooling2D(), keras.layers.Dense(5)])
    exec(_block("orbax-flax"), {"keras_twin": twin})
    io = np.load(ROOT / "tests" / "fixtures" / "flax" / "linen_cnn" / "io.npz")
    np.testing.assert_allclose(twin.predict(io["x"], verbose=0), io["y"], rtol=1e-5, atol=1e-5)
