"""layout="torch": PyTorch state_dicts restored into Keras models, values checked by their outputs.

The PyTorch-side tensors are plain NumPy arrays in PyTorch's names and shapes, written with the
safetensors package; reference outputs are computed with NumPy from those arrays using PyTorch's
own formulas, so no PyTorch install is needed.
"""

from __future__ import annotations

import os
import re

import numpy as np
import pytest
import safetensors.numpy as st_numpy

import ckptmerge as cm
from ckptmerge.alignment.layouts import apply_entry, torch_layout
from ckptmerge.core.specs import VariableInfo

RNG = np.random.default_rng(2024)


def _f32(*shape):
    return RNG.standard_normal(shape).astype(np.float32)


def _specs(state):
    return [VariableInfo(k, v.shape, str(v.dtype), k, nbytes=v.nbytes) for k, v in state.items()]


# -- the pure layout --------------------------------------------------------------------------


def test_layout_names_shapes_and_notes_per_module_kind():
    state = {"emb.weight": _f32(10, 8), "fc.weight": _f32(16, 8), "fc.bias": _f32(16),
             "conv.weight": _f32(5, 3, 3, 3), "conv.bias": _f32(5), "ln.weight": _f32(16), "ln.bias": _f32(16),
             "bn.weight": _f32(5), "bn.bias": _f32(5), "bn.running_mean": _f32(5), "bn.running_var": _f32(5),
             "bn.num_batches_tracked": np.array(3, np.int64)}
    lay = torch_layout(_specs(state))
    got = {n: (e.info.shape, e.note, e.info.kind) for n, e in lay.entries.items()}
    assert got["emb/embeddings"][:2] == ((10, 8), "")
    assert got["fc/kernel"][:2] == ((8, 16), "transposed (out,in)->(in,out)")
    assert got["conv/kernel"][:2] == ((3, 3, 3, 5), "conv (O,I,*k)->(*k,I,O)")
    assert got["ln/gamma"][1] == "weight -> gamma" and got["bn/moving_variance"][1] == "running_var -> moving_variance"
    assert got["bn/num_batches_tracked"][2] == "bookkeeping"
    assert lay.undecided == []


def test_a_square_weight_without_bias_or_telling_name_is_undecided_not_guessed():
    lay = torch_layout(_specs({"block.w_a.weight": _f32(8, 8), "q_proj.weight": _f32(8, 8)}))
    assert [n for n, _ in lay.undecided] == ["block/w_a/weight"]
    assert "block/w_a/weight" in lay.entries and lay.entries["block/w_a/weight"].op == "copy"
    assert lay.entries["q_proj/kernel"].op == "transpose"  # the name says Linear


def test_layout_values_round_trip_the_permutations():
    w = _f32(5, 3, 2, 4)
    e = torch_layout(_specs({"c.weight": w})).entries["c/kernel"]
    np.testing.assert_array_equal(apply_entry(e, [w]), np.transpose(w, (2, 3, 1, 0)))


# -- restores into Keras models, checked by outputs --------------------------------------------


def _layer_norm(x, g, b, eps=1e-5):
    mu, var = x.mean(-1, keepdims=True), x.var(-1, keepdims=True)
    return (x - mu) / np.sqrt(var + eps) * g + b


def _conv2d_nchw(x, w, b):
    n, c, h, wd = x.shape
    o, _, kh, kw = w.shape
    out = np.zeros((n, o, h - kh + 1, wd - kw + 1), np.float64)
    for i in range(h - kh + 1):
        for j in range(wd - kw + 1):
            patch = x[:, :, i:i + kh, j:j + kw]
            out[:, :, i, j] = np.einsum("nchw,ochw->no", patch, w)
    return out + b[None, :, None, None]


@pytest.fixture
def torch_model(tmp_path):
    """An MLP with LayerNorm, a conv layer and an embedding, in PyTorch's names and shapes."""
    state = {"embed.weight": _f32(10, 8),
             "conv.weight": _f32(5, 3, 3, 3), "conv.bias": _f32(5),
             "mlp.fc1.weight": _f32(16, 8), "mlp.fc1.bias": _f32(16),
             "mlp.norm.weight": _f32(16), "mlp.norm.bias": _f32(16),
             "mlp.fc2.weight": _f32(4, 16), "mlp.fc2.bias": _f32(4)}
    path = tmp_path / "model.safetensors"
    st_numpy.save_file(state, str(path))
    return path, state


def _keras_twin():
    import keras

    tokens = keras.Input((6,), dtype="int32", name="tokens")
    image = keras.Input((6, 6, 3), name="image")
    e = keras.layers.Embedding(10, 8, name="tok_emb")(tokens)
    h = keras.layers.Dense(16, activation="relu", name="hidden")(keras.ops.mean(e, axis=1))
    h = keras.layers.LayerNormalization(epsilon=1e-5, name="ln")(h)
    logits = keras.layers.Dense(4, name="out")(h)
    feat = keras.layers.Conv2D(5, 3, name="features")(image)
    return keras.Model([tokens, image], [logits, feat], name="twin")


def _reference(state, tokens, image_nhwc):
    e = state["embed.weight"][tokens].mean(axis=1)
    h = np.maximum(e @ state["mlp.fc1.weight"].T + state["mlp.fc1.bias"], 0)
    h = _layer_norm(h, state["mlp.norm.weight"], state["mlp.norm.bias"])
    logits = h @ state["mlp.fc2.weight"].T + state["mlp.fc2.bias"]
    feat = _conv2d_nchw(image_nhwc.transpose(0, 3, 1, 2), state["conv.weight"], state["conv.bias"])
    return logits, feat.transpose(0, 2, 3, 1)


def _check_outputs(model, state):
    tokens = RNG.integers(0, 10, size=(2, 6)).astype(np.int32)
    image = RNG.standard_normal((2, 6, 6, 3)).astype(np.float32)
    logits, feat = (np.asarray(t) for t in model([tokens, image]))
    want_logits, want_feat = _reference(state, tokens, image)
    np.testing.assert_allclose(logits, want_logits, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(feat, want_feat, rtol=1e-4, atol=1e-4)


def test_pytorch_model_restores_into_keras_with_layout_and_a_scope_map(torch_model):
    path, state = torch_model
    model = _keras_twin()
    source = cm.Source(str(path), layout="torch",
                       map={"embed/": "tok_emb/", "conv/": "features/", "mlp/fc1/": "hidden/",
                            "mlp/norm/": "ln/", "mlp/fc2/": "out/"})
    report = cm.restore(model, [source])
    assert len(report.restored) == 9
    text = report.plan.report()
    # the report line names the raw key and its stored shape, then the operation
    assert ": transposed (out,in)->(in,out)" in text and ": conv (O,I,*k)->(*k,I,O)" in text
    assert re.search(r"layout: [a-z0-9_.]+\.weight \(\d+, \d+\): transposed", text)
    _check_outputs(model, state)


def test_batchnorm_in_inference_matches_pytorch_formula(tmp_path):
    import keras

    state = {"bn.weight": _f32(4), "bn.bias": _f32(4), "bn.running_mean": _f32(4),
             "bn.running_var": np.abs(_f32(4)) + 0.5, "bn.num_batches_tracked": np.array(7, np.int64)}
    st_numpy.save_file(state, str(tmp_path / "bn.safetensors"))
    model = keras.Sequential([keras.Input((4,)), keras.layers.BatchNormalization(epsilon=1e-5, name="bn")], name="m")
    report = cm.restore(model, [cm.Source(str(tmp_path / "bn.safetensors"), layout="torch", map={"bn/": "m/bn/"})])
    assert len(report.restored) == 4  # num_batches_tracked is bookkeeping, left out
    x = _f32(3, 4)
    want = (x - state["bn.running_mean"]) / np.sqrt(state["bn.running_var"] + 1e-5) * state["bn.weight"] + state["bn.bias"]
    np.testing.assert_allclose(np.asarray(model(x, training=False)), want, rtol=1e-5, atol=1e-5)


def _sigmoid(x):
    return 1 / (1 + np.exp(-x))


def _torch_lstm(x, s):
    h = np.zeros((x.shape[0], s["rnn.weight_hh_l0"].shape[1]))
    c = np.zeros_like(h)
    for t in range(x.shape[1]):
        g = x[:, t] @ s["rnn.weight_ih_l0"].T + s["rnn.bias_ih_l0"] + h @ s["rnn.weight_hh_l0"].T + s["rnn.bias_hh_l0"]
        i, f, gg, o = np.split(g, 4, axis=1)
        c = _sigmoid(f) * c + _sigmoid(i) * np.tanh(gg)
        h = _sigmoid(o) * np.tanh(c)
    return h


def _torch_gru(x, s):
    h = np.zeros((x.shape[0], s["rnn.weight_hh_l0"].shape[1]))
    for t in range(x.shape[1]):
        gi = x[:, t] @ s["rnn.weight_ih_l0"].T + s["rnn.bias_ih_l0"]
        gh = h @ s["rnn.weight_hh_l0"].T + s["rnn.bias_hh_l0"]
        ir, iz, inn = np.split(gi, 3, axis=1)
        hr, hz, hn = np.split(gh, 3, axis=1)
        r, z = _sigmoid(ir + hr), _sigmoid(iz + hz)
        n = np.tanh(inn + r * hn)
        h = (1 - z) * n + z * h
    return h


@pytest.mark.parametrize("kind", ["lstm", "gru"])
def test_rnn_weights_and_gates_match_pytorch(tmp_path, kind):
    import keras

    hidden, feat, gates = 5, 3, 4 if kind == "lstm" else 3
    state = {"rnn.weight_ih_l0": _f32(gates * hidden, feat), "rnn.weight_hh_l0": _f32(gates * hidden, hidden),
             "rnn.bias_ih_l0": _f32(gates * hidden), "rnn.bias_hh_l0": _f32(gates * hidden)}
    st_numpy.save_file(state, str(tmp_path / "rnn.safetensors"))
    layer = keras.layers.LSTM(hidden, name="rnn") if kind == "lstm" else keras.layers.GRU(hidden, name="rnn")
    model = keras.Sequential([keras.Input((7, feat)), layer], name="m")
    cell = f"m/rnn/{kind}_cell/"
    report = cm.restore(model, [cm.Source(str(tmp_path / "rnn.safetensors"), layout="torch", map={"rnn/l0/": cell})])
    assert sorted(report.restored) == [cell + "bias", cell + "kernel", cell + "recurrent_kernel"]
    x = _f32(2, 7, feat)
    want = _torch_lstm(x, state) if kind == "lstm" else _torch_gru(x, state)
    np.testing.assert_allclose(np.asarray(model(x)), want, rtol=1e-4, atol=1e-5)


def test_undecided_weight_is_a_finding_settled_by_an_explicit_transpose(tmp_path):
    import keras

    state = {"proj_a.weight": _f32(6, 6)}  # square, no bias, no telling name
    st_numpy.save_file(state, str(tmp_path / "w.safetensors"))
    model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(6, use_bias=False, name="d")], name="m")
    source = cm.Source(str(tmp_path / "w.safetensors"), layout="torch", map={"proj_a/weight": "m/d/kernel"})
    plan = cm.plan(model, [source])
    assert any("proj_a/weight" in f and "Transpose" in f for f in plan.report().splitlines())
    with pytest.raises(cm.PlanError):
        plan.restore()
    settled = cm.Source(str(tmp_path / "w.safetensors"), layout="torch", map={"proj_a/weight": "m/d/kernel"},
                        transforms=[cm.Transpose("m/d/kernel")])
    cm.restore(model, [settled])  # strict: the Transpose settles the finding
    x = _f32(2, 6)
    np.testing.assert_allclose(np.asarray(model(x)), x @ state["proj_a.weight"].T, rtol=1e-5)


def test_pytorch_model_restores_into_keras_with_layout_and_structural_alignment(torch_model):
    """The cross-framework promise: PyTorch names and shapes in, a Keras model out, no map at all."""
    path, state = torch_model
    model = _keras_twin()
    report = cm.restore(model, [cm.Source(str(path), layout="torch", align="structure")])
    assert len(report.restored) == 9
    assert "matched by structure" in report.plan.report()
    _check_outputs(model, state)


def test_suggest_for_a_pytorch_model_writes_a_config_that_keeps_the_layout(torch_model, tmp_path):
    path, state = torch_model
    model = _keras_twin()
    suggestion = cm.suggest(model, [cm.Source(str(path), layout="torch")])
    config = suggestion.to_config()
    assert config["sources"][0]["layout"] == "torch" and config["sources"][0]["map"]
    suggestion.write(tmp_path / "warm.yaml")
    cm.warm_start(model, str(tmp_path / "warm.yaml"))
    _check_outputs(model, state)


# -- transposes read from a file a band of rows at a time --------------------------------------

_BANDED = {"fc1": (300, 130), "fc2": (129, 200), "fc3": (1, 40), "fc4": (5, 3), "fc5": (257, 64)}


def _linear_state(dtype=np.float32):
    state = {f"{k}.weight": _f32(*s).astype(dtype) for k, s in _BANDED.items()}
    state.update({f"{k}.bias": _f32(s[0]).astype(dtype) for k, s in _BANDED.items()})
    return state


def _write_bundle(prefix, state):
    from ckptmerge.formats.tf.writer import BundleWriter

    with BundleWriter(prefix) as w:
        for k, v in state.items():
            w.add(k, v)
    return prefix


@pytest.mark.parametrize("fmt", ["safetensors", "bundle"])
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_transposes_read_from_a_file_equal_numpys_and_restore_without_a_copy(tmp_path, fmt, dtype):
    state = _linear_state(dtype)
    if fmt == "safetensors":
        path = str(tmp_path / "model.safetensors")
        st_numpy.save_file(state, path)
    else:
        path = _write_bundle(str(tmp_path / "ckpt"), state)
    h = cm.Source(path, layout="torch").open()
    try:
        got = h.read([f"{k}/kernel" for k in _BANDED] + ["fc1/bias"])
    finally:
        h.close()
    for k in _BANDED:
        v = got[f"{k}/kernel"]
        np.testing.assert_array_equal(v, state[f"{k}.weight"].T)
        assert v.dtype == dtype and v.flags.c_contiguous and v.ctypes.data % 64 == 0  # (the restore takes it as is)
    np.testing.assert_array_equal(got["fc1/bias"], state["fc1.bias"])


def test_a_corrupt_transposed_tensor_fails_its_checksum(tmp_path):
    h = cm.Source(_write_bundle(str(tmp_path / "ckpt"), _linear_state()), layout="torch").open()
    try:
        data = next(tmp_path.glob("ckpt.data-*"))
        raw = bytearray(data.read_bytes())
        raw[len(raw) // 2] ^= 0xFF
        data.write_bytes(bytes(raw))
        with pytest.raises(cm.CkptMergeError, match="(?i)checksum|crc"):
            h.read([f"{k}/kernel" for k in _BANDED])
    finally:
        h.close()


def test_a_file_truncated_before_a_restore_leaves_every_variable_as_it_was(tmp_path):
    import keras

    state = _linear_state()
    path = tmp_path / "model.safetensors"
    st_numpy.save_file(state, str(path))
    inputs = keras.Input((130,))
    model = keras.Model(inputs, keras.layers.Dense(300, name="fc1")(inputs))
    before = [w.numpy().copy() for w in model.weights]
    plan = cm.plan(model, [cm.Source(str(path), layout="torch", map={"fc1/kernel": "fc1/kernel",
                                                                     "fc1/bias": "fc1/bias"})])
    header = int.from_bytes(path.read_bytes()[:8], "little")
    os.truncate(path, 8 + header + 64)  # (every tensor's data cut short)
    with pytest.raises(cm.RestoreError, match="ended early|truncated"):
        plan.restore(strict=False)
    for w, old in zip(model.weights, before):
        np.testing.assert_array_equal(w.numpy(), old)
