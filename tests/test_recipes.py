"""Every recipe of docs/recipes.md runs, against the files it talks about, and prints what it shows.

One world is written per test module (``runs/A``: a pretraining run of steps 100 to 500,
``runs/B``: a fine-tune, ``runs/old``: the model under its old names, ``hf/bert``: a tiny Hugging
Face BERT, ``jax/ckpt``: a Flax run saved by Orbax, ``warm.yaml``: the page's config), with fixed
file times, in UTC. Each tagged block of the page runs there, from a fresh copy of the world's
state: a Python recipe in a namespace of its own (then the check below that looks at what it
restored or wrote), a console recipe command by command through the CLI; the output shown under
each must be what it printed (tests/_examples.py says how outputs are compared).
"""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

import numpy as np
import pytest

from _examples import ROOT, blocks, check_console, check_python, example, runs

PAGE = ROOT / "docs" / "recipes.md"
TAGS = sorted(blocks([PAGE])[0])
#: 2026-12-01 09:00 UTC, the time of every file of the world
MTIME = 1796115600
#: the world's folder as the outputs shown on the page spell it
HOME = "/home/me"

runs(*TAGS)


def _values(rng, scale):
    return {"encoder/kernel": (rng.standard_normal((4, 8)) * scale).astype(np.float32),
            "encoder/bias": (rng.standard_normal(8) * scale).astype(np.float32),
            "head/kernel": (rng.standard_normal((8, 3)) * scale).astype(np.float32),
            "head/bias": (rng.standard_normal(3) * scale).astype(np.float32)}


OLD_NAMES = {"encoder/": "dnn/hiddenlayer_0/", "head/": "dnn/logits/"}


@pytest.fixture(scope="module")
def world(tmp_path_factory, tf):
    from conftest import save_tf1

    root = tmp_path_factory.mktemp("recipes")
    rng = np.random.default_rng(7)
    truth = {}
    for d in ("runs/A", "runs/B", "runs/old", "jax"):
        (root / d).mkdir(parents=True)
    for step in range(100, 501, 100):
        truth[f"A-{step}"] = _values(rng, 1.0)
        save_tf1(root / "runs" / "A" / "model", truth[f"A-{step}"], step=step)
    truth["B"] = _values(rng, 0.5)
    save_tf1(root / "runs" / "B" / "model", truth["B"], step=10)
    truth["old"] = _values(rng, 2.0)
    save_tf1(root / "runs" / "old" / "model", {name.replace(a, b, 1): v for name, v in truth["old"].items()
                                                for a, b in OLD_NAMES.items() if name.startswith(a)}, step=1)
    shutil.copytree(ROOT / "tests" / "fixtures" / "xframe" / "bert", root / "hf" / "bert")
    shutil.copytree(ROOT / "tests" / "fixtures" / "flax" / "linen_cnn" / "ckpt", root / "jax" / "ckpt")
    (root / "warm.yaml").write_text(example("recipe-warm-config").code, encoding="utf-8")
    for state in root.glob("runs/*/checkpoint"):  # relative paths, as CheckpointManager writes them
        state.write_text(state.read_text().replace(f"{state.parent}/", ""))
    for path in root.rglob("*"):
        os.utime(path, (MTIME, MTIME))
    return root, truth


@pytest.fixture
def here(world, tmp_path, monkeypatch):
    """A fresh copy of the world as the current folder, in UTC; (folder, truth)."""
    root, truth = world
    copy = tmp_path / "me"
    shutil.copytree(root, copy, symlinks=True)
    for path in copy.rglob("*"):
        os.utime(path, (MTIME, MTIME))
    monkeypatch.chdir(copy)
    monkeypatch.setenv("TZ", "UTC")
    time.tzset()
    yield copy, truth
    monkeypatch.undo()
    time.tzset()


def _weights(model):
    return {v.path.split("/", 1)[1]: np.asarray(v) for v in model.weights}


def _assert_values(got, want, names):
    for name in names:
        np.testing.assert_array_equal(got[name], want[name], err_msg=name)


ENCODER, HEAD = ["encoder/kernel", "encoder/bias"], ["head/kernel", "head/bias"]


def check_encoder_head(ns, truth):
    _assert_values(_weights(ns["model"]), truth["A-500"], ENCODER)
    _assert_values(_weights(ns["model"]), truth["B"], HEAD)


def check_warm(ns, truth):
    _assert_values(_weights(ns["model"]), truth["A-300"], ENCODER)
    _assert_values(_weights(ns["model"]), truth["B"], HEAD)


def check_graph(ns, truth):
    got = {name: ns["sess"].run(v) for name, v in ns["variables"].items()}
    _assert_values(got, truth["A-500"], ENCODER)
    ns["sess"].close()


def check_new_head(ns, truth):
    weights = _weights(ns["model"])
    _assert_values(weights, truth["A-500"], ENCODER)
    assert weights["head/kernel"].shape == (8, 5) and not np.array_equal(weights["head/kernel"][:, :3],
                                                                          truth["A-500"]["head/kernel"])


def check_average(ns, truth):
    import ckptmerge as cm

    want = {k: np.mean([truth[f"A-{s}"][k] for s in (300, 400, 500)], axis=0) for k in truth["B"]}
    for out in ("out/avg-last3", "out/avg-last3.safetensors"):
        if Path(out + ".index").exists() or Path(out).exists():
            got = cm.load(out)
            assert sorted(got) == sorted(want)
            for k in want:
                np.testing.assert_allclose(got[k], want[k], rtol=1e-6, atol=1e-7)


def check_follow(ns, truth):
    assert ns["steps"] == [100, 200, 300, 400, 500]
    _assert_values(_weights(ns["model"]), truth["A-500"], [*ENCODER, *HEAD])


def check_orbax(ns, truth):
    import ckptmerge as cm

    assert ns["kernel"].shape == (4, 5)
    np.testing.assert_array_equal(ns["kernel"], cm.load("jax/ckpt", "params/Dense_0/kernel")["params/Dense_0/kernel"])


def check_merge(ns, truth):
    import ckptmerge as cm

    got = cm.load("out/merged.safetensors")
    assert sorted(got) == sorted(truth["B"])
    _assert_values(got, truth["A-500"], ENCODER)
    _assert_values(got, truth["B"], HEAD)


def check_suggest(ns, truth):
    _assert_values(_weights(ns["model"]), truth["old"], [*ENCODER, *HEAD])


def check_hf(ns, truth):
    import keras_hub

    want = keras_hub.models.BertBackbone.from_preset("hf/bert")   # KerasHub's own converter
    got = {v.path: np.asarray(v) for v in ns["backbone"].weights}
    assert sorted(got) == sorted(v.path for v in want.weights)
    for v in want.weights:
        np.testing.assert_array_equal(got[v.path], np.asarray(v), err_msg=v.path)


def check_notebook(ns, truth):
    assert ns["plan"].assignments and not ns["plan"].missing


def check_diff(ns, truth):
    assert sorted(ns["largest"]) == sorted(truth["B"])


def check_fix_yaml(ns, truth):
    import ckptmerge as cm

    cfg = cm.load_config("fix.yaml")
    assert [Path(s.path).parts[-3:] for s in cfg.sources] == [("runs", "old", "model-1")]


#: what each recipe's check looks at, after it ran (None: its output is the check)
CHECKS = {"recipe-inspect": None, "recipe-inspect-cli": None, "recipe-encoder-head": check_encoder_head,
          "recipe-warm": check_warm, "recipe-warm-cli": None, "recipe-graph": check_graph, "recipe-hf": check_hf,
          "recipe-new-head": check_new_head, "recipe-average": check_average, "recipe-average-cli": check_average,
          "recipe-follow": check_follow, "recipe-follow-cli": None, "recipe-orbax": check_orbax,
          "recipe-orbax-cli": None, "recipe-merge": check_merge, "recipe-merge-cli": None,
          "recipe-diff": check_diff, "recipe-diff-cli": None, "recipe-suggest": check_suggest,
          "recipe-suggest-cli": check_fix_yaml, "recipe-notebook": check_notebook}


def _cli(*args):
    from _cli_util import run

    return run(*args)


@pytest.mark.parametrize("tag", TAGS)
def test_recipe(here, tag):
    import ckptmerge as cm

    root, truth = here
    ex = example(tag)
    if ex.language == "yaml":
        assert [Path(s.path).relative_to(root).as_posix() for s in cm.load_config("warm.yaml").sources] == \
            ["runs/A", "runs/B"]
        return
    assert tag in CHECKS, f"{ex.where}: a recipe with no check in tests/test_recipes.py"
    normalise = lambda out: out.replace(str(root), HOME)  # noqa: E731
    ns: dict = {}
    if ex.language == "console":
        check_console(tag, _cli, normalise)
    else:
        assert ex.language == "python", f"{ex.where}: a recipe is python, console or yaml"
        if tag == "recipe-hf":
            pytest.importorskip("keras_hub", reason="keras-hub is in the test extra: pip install -e '.[test]'")
        check_python(tag, ns, normalise, notebook=tag == "recipe-notebook")
    if CHECKS[tag] is not None:
        CHECKS[tag](ns, truth)


def test_an_output_shown_must_be_the_output_printed():
    from _examples import assert_output

    assert_output("a 0.01 s\nb\nc\nd\n", "a ... s\n...\nd")      # '...' lines and '...' in a line
    for wrong in ("a 1 s\nb\n", "a 1 s\nd\nextra\n", "x 1 s\nd\n"):
        with pytest.raises(AssertionError, match="the output shown is not what runs"):
            assert_output(wrong, "a ... s\n...\nd")
