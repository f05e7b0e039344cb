"""Orbax checkpoints as sources, end to end: Flax models (Linen and NNX) restored into their Keras
twins with ``layout="flax"`` and ``align="structure"``, outputs equal to Flax's; a Keras
``OrbaxCheckpoint`` restored exactly as Keras's ``load_weights`` restores it; the CLI (``ls``,
``show``, ``checkpoints``, ``diff``, ``merge --format orbax``) on Orbax checkpoints.

The Flax checkpoints and Flax's outputs are committed fixtures (tests/fixtures/flax, made by
scripts/make_flax_fixtures.py), so neither Flax nor JAX is needed here; every ckptmerge call runs
under ``no_jax_from_ckptmerge`` (TensorFlow may import JAX by itself; ckptmerge may not).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("tensorstore", reason="the Orbax reader needs tensorstore (pip install 'ckptmerge[orbax]')")

from _cli_util import run  # noqa: E402
from _orbax_util import no_jax_from_ckptmerge, orbax_restore, refuse_jax_from_ckptmerge  # noqa: E402,F401

import ckptmerge as cm  # noqa: E402
from ckptmerge.alignment.layouts import flax_layout  # noqa: E402
from ckptmerge.core.specs import VariableInfo  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
FLAX = REPO / "tests" / "fixtures" / "flax"


def _mlp():
    import keras

    return keras.Sequential([keras.Input((3,), dtype="int32"), keras.layers.Embedding(10, 8),
                             keras.layers.GlobalAveragePooling1D(), keras.layers.Dense(16, activation="relu"),
                             keras.layers.LayerNormalization(epsilon=1e-6), keras.layers.Dense(4)])


def _cnn():
    import keras

    return keras.Sequential([keras.Input((8, 8, 3)), keras.layers.Conv2D(6, 3, padding="same", activation="relu"),
                             keras.layers.Conv2D(4, 3, strides=2, padding="same"),
                             keras.layers.BatchNormalization(epsilon=1e-5), keras.layers.ReLU(),
                             keras.layers.GlobalAveragePooling2D(), keras.layers.Dense(5)])


# -- layout="flax" on literal specs ---------------------------------------------------------------


def _specs(**shapes):
    return [VariableInfo(n, s, "float32", kind="optimizer" if n.startswith("opt_state") else "variable")
            for n, s in shapes.items()]


def test_flax_layout_renames_norms_embeddings_and_batch_stats_into_one_keras_scope():
    lay = flax_layout([VariableInfo(n, s, "float32") for n, s in [
        ("params/Embed_0/embedding", (10, 8)), ("params/Dense_0/kernel", (8, 16)), ("params/Dense_0/bias", (16,)),
        ("params/LayerNorm_0/scale", (16,)), ("params/LayerNorm_0/bias", (16,)), ("params/Conv_0/kernel", (3, 3, 2, 4)),
        ("params/BatchNorm_0/scale", (4,)), ("params/BatchNorm_0/bias", (4,)), ("batch_stats/BatchNorm_0/mean", (4,)),
        ("batch_stats/BatchNorm_0/var", (4,))]])
    assert {n: (e.info.shape, e.op) for n, e in lay.entries.items()} == {
        "Embed_0/embeddings": ((10, 8), "copy"), "Dense_0/kernel": ((8, 16), "copy"), "Dense_0/bias": ((16,), "copy"),
        "LayerNorm_0/gamma": ((16,), "copy"), "LayerNorm_0/beta": ((16,), "copy"),
        "Conv_0/kernel": ((3, 3, 2, 4), "copy"), "BatchNorm_0/gamma": ((4,), "copy"),
        "BatchNorm_0/beta": ((4,), "copy"), "BatchNorm_0/moving_mean": ((4,), "copy"),
        "BatchNorm_0/moving_variance": ((4,), "copy")}
    assert lay.entries["BatchNorm_0/moving_mean"].sources == ("batch_stats/BatchNorm_0/mean",)
    assert lay.undecided == []


def test_flax_layout_reads_nnx_states_and_transposes_conv_transpose_kernels():
    lay = flax_layout([VariableInfo(n, s, "float32") for n, s in [
        ("linear/kernel/value", (3, 4)), ("norm/scale/value", (4,)), ("embed/embedding/value", (5, 3)),
        ("up/ConvTranspose_0/kernel", (3, 3, 8, 2))]])
    assert {n: e.info.shape for n, e in lay.entries.items()} == {
        "linear/kernel": (3, 4), "norm/gamma": (4,), "embed/embeddings": (5, 3),
        "up/ConvTranspose_0/kernel": (3, 3, 2, 8)}
    assert lay.entries["up/ConvTranspose_0/kernel"].perm == (0, 1, 3, 2)


def test_flax_layout_keeps_optimizer_state_apart_from_the_parameters():
    lay = flax_layout(_specs(**{"params/Dense_0/kernel": (2, 3), "opt_state/0/mu/params/Dense_0/kernel": (2, 3)}))
    assert sorted(lay.entries) == ["Dense_0/kernel", "opt_state/0/mu/params/Dense_0/kernel"]


# -- Flax models into their Keras twins -------------------------------------------------------------


@pytest.mark.parametrize("name, make, path", [
    ("linen_mlp", _mlp, "linen_mlp/ckpt"), ("linen_cnn", _cnn, "linen_cnn/ckpt"),
    ("nnx_mlp", _mlp, "nnx_mlp/state"), ("nnx_cnn", _cnn, "nnx_cnn/state")])
def test_a_flax_model_restores_into_its_keras_twin_with_flax_outputs(name, make, path):
    model = make()
    io = np.load(FLAX / name / "io.npz")
    plan = cm.plan(model, [cm.Source(str(FLAX / path), layout="flax", align="structure")])
    assert plan.missing == [] and plan.mismatched == [] and plan.conflicts == []
    plan.restore()
    np.testing.assert_allclose(model.predict(io["x"], verbose=0), io["y"], rtol=1e-5, atol=1e-5)


def test_without_the_flax_layout_the_names_do_not_line_up_and_nothing_is_restored():
    plan = cm.plan(_cnn(), [cm.Source(str(FLAX / "linen_cnn" / "ckpt"))])
    assert len(plan.missing) == 10 and not plan.assignments


# -- Keras OrbaxCheckpoint -------------------------------------------------------------------------


def _keras_model():
    import keras

    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(8, activation="relu", name="hidden"),
                              keras.layers.BatchNormalization(name="bn"), keras.layers.Dense(3, name="out")],
                             name="net")
    model.compile(optimizer="adam", loss="mse")
    return model


@pytest.fixture(scope="module")
def keras_orbax(tmp_path_factory):
    import keras

    directory = tmp_path_factory.mktemp("keras") / "ckpt"
    rng = np.random.default_rng(0)
    x, y = rng.standard_normal((32, 4)).astype("float32"), rng.standard_normal((32, 3)).astype("float32")
    with no_jax_from_ckptmerge():  # (Keras and Orbax write it; JAX comes in through them)
        model = _keras_model()
        model.fit(x, y, epochs=2, verbose=0, callbacks=[keras.callbacks.OrbaxCheckpoint(directory=str(directory))])
    return directory, model


def test_a_keras_orbax_checkpoint_restores_exactly_as_keras_load_weights(keras_orbax):
    directory, trained = keras_orbax
    with no_jax_from_ckptmerge():  # Keras's own reader (through Orbax and JAX)
        by_keras = _keras_model()
        by_keras.load_weights(str(directory))
    ours = _keras_model()
    report = cm.restore(ours, [cm.Source(str(directory))])
    assert len(report.restored) == len(ours.weights) == 8
    for a, b, c in zip(ours.weights, by_keras.weights, trained.weights):
        assert a.path == b.path
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
        np.testing.assert_array_equal(np.asarray(a), np.asarray(c))


def test_a_keras_orbax_step_names_variables_by_their_keras_path(keras_orbax):
    directory, _ = keras_orbax
    with cm.open(str(directory)) as r:
        names = r.names(optimizer=False)
        kinds = {v.name: v.kind for v in r.variables()}
    assert names == sorted(w.path for w in _keras_model().weights)
    optimizer = [n for n in kinds if n.startswith("optimizer_variables/")]  # (adam, adam_1, ...: Keras numbers them)
    assert optimizer and {kinds[n] for n in optimizer} == {"optimizer"}
    assert any(n.endswith("/iteration") for n in optimizer)
    assert kinds["model_config/config"] == "bookkeeping"


# -- the command line -----------------------------------------------------------------------------


def test_cli_ls_show_and_checkpoints_on_a_checkpoint_manager_root():
    root = FLAX / "linen_mlp" / "ckpt"
    res = run("ls", root)
    assert res.exit_code == 0, res.output
    assert res.stdout.splitlines()[0] == (f"Checkpoint: {root / '3'} (latest finalised Orbax step of {root} "
                                          "(step 3; steps there: 3))")
    assert "params/Embed_0/embedding  float32  (10, 8)" in res.stdout
    assert "7 variables, 1.3 KiB; 16 optimizer/bookkeeping hidden" in res.stdout
    res = run("show", root, "params/Dense_1/bias")
    assert res.exit_code == 0 and res.stdout.startswith("params/Dense_1/bias  float32  (4,)"), res.output
    res = run("checkpoints", root)
    assert res.exit_code == 0 and "1 checkpoint" in res.stdout and res.stdout.splitlines()[1].split()[:2] == ["*", "3"]
    res = run("ls", root, "--step", "4")
    assert res.exit_code == 2 and "no finalised Orbax step 4" in res.stderr and "steps there: 3" in res.stderr


def test_cli_merge_to_orbax_and_back_to_tf_and_diff_them(tmp_path):
    config = tmp_path / "m.yaml"
    config.write_text(f"sources:\n  - name: flax\n    path: {FLAX / 'linen_cnn' / 'ckpt'}\n")
    res = run("merge", config, "-o", tmp_path / "orbax", "--format", "orbax", "-q")
    assert res.exit_code == 0, res.output
    res = run("merge", config, "-o", tmp_path / "tf" / "ckpt", "-q")
    assert res.exit_code == 0, res.output
    res = run("diff", tmp_path / "orbax", tmp_path / "tf" / "ckpt", "--values")
    assert res.exit_code == 0 and "Equal: 10 variables" in res.stdout, res.output
    res = run("merge", config, "-o", tmp_path / "orbax", "--format", "orbax", "-q")
    assert res.exit_code == 2 and "already exists" in res.stderr


def test_merge_format_orbax_is_read_back_by_orbax_v1_load(tmp_path):
    pytest.importorskip("orbax.checkpoint")
    out = tmp_path / "out"
    report = cm.merge([cm.Source(str(FLAX / "nnx_mlp" / "state"), layout="flax")], str(out), format="orbax")
    assert report.bytes_written > 0 and sorted(report.restored)[0] == "embed/embeddings"
    with no_jax_from_ckptmerge():  # Orbax's V1 load (JAX in the test process; none from ckptmerge)
        by_orbax = orbax_restore(out)
    with cm.open(str(out)) as r:
        ours = {n: r.get(n) for n in r.names()}
    assert sorted(by_orbax) == sorted(ours) and by_orbax["embed/embeddings"].shape == (10, 8)
    for name, value in by_orbax.items():
        assert value.dtype == ours[name].dtype and value.tobytes() == ours[name].tobytes(), name
    meta = json.loads((out / "_CHECKPOINT_METADATA").read_text())
    assert meta["custom_metadata"]["ckptmerge"]["plan"]["embed/embeddings"] == f"{FLAX / 'nnx_mlp' / 'state'}:embed/embeddings"
