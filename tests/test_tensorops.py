"""The tensor operations of issue 19, section 3, that join and shape tensors by hand: cm.Concat
(several checkpoint tensors into one target), cm.Squeeze and cm.ExpandDims (unit axes), and
cm.Transpose(perm=...) (any permutation); each in the API, the config, the report line of the
tensor it touches, restores (TF1, TF2, Keras) and merges (TF bundle, safetensors, .weights.h5)."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

import ckptmerge as cm
from ckptmerge.config import load_config
from ckptmerge.core.errors import ConfigError, PlanError, TransformError

RNG = np.random.default_rng(19)
Q, K, V = (RNG.standard_normal((8, 4)).astype("float32") for _ in range(3))
BQ, BK, BV = (RNG.standard_normal(4).astype("float32") for _ in range(3))
FUSED = np.concatenate([Q, K, V], axis=1)
PARTS = ["attn/q/kernel", "attn/k/kernel", "attn/v/kernel"]


@pytest.fixture(scope="module")
def torch_file(tmp_path_factory):
    """Separate q/k/v Linear weights and biases as PyTorch saves them ((out, in) weights)."""
    from safetensors.numpy import save_file

    path = str(tmp_path_factory.mktemp("concat") / "model.safetensors")
    save_file({"attn.q.weight": Q.T.copy(), "attn.k.weight": K.T.copy(), "attn.v.weight": V.T.copy(),
               "attn.q.bias": BQ, "attn.k.bias": BK, "attn.v.bias": BV, "extra.bias": np.ones(5, "float32")},
              path)
    return path


@pytest.fixture(scope="module")
def plain_file(tmp_path_factory):
    from safetensors.numpy import save_file

    path = str(tmp_path_factory.mktemp("plain") / "parts.safetensors")
    save_file({"attn/q/kernel": Q, "attn/k/kernel": K, "attn/v/kernel": V, "other": np.arange(3, dtype="float32"),
               "half": np.zeros((8, 4), "float16"), "wide": np.zeros((9, 4), "float32")}, path)
    return path


def _fused_source(path, **kw):
    return cm.Source(path, layout="torch", transforms=[
        cm.Concat("qkv/kernel", PARTS, axis=1),
        cm.Concat("qkv/bias", ["attn.q.bias", "attn.k.bias", "attn.v.bias"])], **kw)


# -- the operations on literal arrays ------------------------------------------------------------


def test_concat_joins_its_parts_along_the_axis_and_names_the_rows_each_fills():
    c = cm.Concat("qkv", ["q", "k", "v"], axis=-1)
    assert np.array_equal(c.apply([Q, K, V]), FUSED)
    assert c.output_shape([(8, 4), (8, 2), (8, 2)]) == (8, 8)
    assert c.describe([(8, 4), (8, 2), (8, 2)]) == ("concat axis 1 of 3 parts: columns 0..3 <- q (8, 4), "
                                                    "4..5 <- k (8, 2), 6..7 <- v (8, 2) -> (8, 8)")
    assert c.to_dict() == {"kind": "concat", "target": "qkv", "sources": ["q", "k", "v"], "axis": -1}
    assert c.name == "q+k+v" and not c.applies_to("qkv")


def test_concat_without_an_axis_takes_the_one_the_shapes_allow_and_refuses_a_guess():
    c = cm.Concat("qkv", ["q", "k", "v"])
    assert c.axes([(8, 4), (8, 2), (8, 2)]) == (1,)  # only axis 1 joins parts of unequal width
    assert c.axes([(8, 4)] * 3, (8, 12)) == (1,) and c.axes([(8, 4)] * 3, (24, 4)) == (0,)
    with pytest.raises(TransformError, match=r"along axis 0 or 1; give axis=\.\.\."):
        c.axes([(8, 4)] * 3)


def test_concat_inverse_is_one_split_per_part_giving_each_back():
    c = cm.Concat("qkv", ["q", "k", "v"], axis=1)
    splits = c.inverse()
    assert [type(s).__name__ for s in splits] == ["Split"] * 3
    for s, part in zip(splits, (Q, K, V)):
        assert np.array_equal(s.apply(FUSED), part)
    gqa = np.concatenate([Q, K[:, :2], V[:, :2]], axis=1)  # a narrower key and value
    splits = c.inverse([(8, 4), (8, 2), (8, 2)])
    assert [s.sizes for s in splits] == [(4, 2, 2)] * 3
    for s, part in zip(splits, (Q, K[:, :2], V[:, :2])):
        assert np.array_equal(s.apply(gqa), part)
    assert splits[2].describe((8, 8)) == "split axis 1 into 3: columns 6..7 of 8 (part 3 of 3) -> (8, 2)"
    with pytest.raises(TransformError, match=r"does not hold parts of sizes \[4, 2, 2\]"):
        splits[0].output_shape((8, 9))
    with pytest.raises(TransformError, match="one size per part"):
        cm.Split("q", 1, 0, 3, sizes=(4, 2))


@pytest.mark.parametrize("args, message", [
    (("qkv", ["q"]), "at least two"),
    (("qkv", "q"), "must be a list of checkpoint names"),
    (("qkv", ["q", "q"]), "more than once"),
    (("qkv", ["q", "k"], 1.5), "axis must be an integer"),
    (("", ["q", "k"]), "non-empty variable name"),
])
def test_a_bad_concat_is_refused_when_it_is_made(args, message):
    with pytest.raises(TransformError, match=message):
        cm.Concat(*args)


def test_concat_refuses_parts_that_disagree_off_the_axis():
    with pytest.raises(TransformError, match=r"cannot be joined along axis 1: every other axis must agree"):
        cm.Concat("qkv", ["q", "k"], axis=1).output_shape([(8, 4), (9, 4)])
    with pytest.raises(TransformError, match="different numbers of dimensions"):
        cm.Concat("qkv", ["q", "k"]).output_shape([(8, 4), (8,)])


@pytest.mark.parametrize("parts", [2, 3, 5])
@pytest.mark.parametrize("given", [0, 1, 2, 4, 6])
def test_concat_refuses_any_number_of_shapes_but_one_per_part(parts, given):
    """Issue 30.12: one shape for two or three parts gave equal Splits (zip stopped early).
    Every method taking the parts' shapes refuses a count that is not one per part, naming it."""
    names = [f"p{i}" for i in range(parts)]
    rng = np.random.default_rng(parts * 10 + given)
    shapes = [(4, int(rng.integers(1, 5))) for _ in range(given)]
    c = cm.Concat("fused", names, axis=1)
    calls = [lambda: c.inverse(shapes), lambda: c.output_shape(shapes), lambda: c.describe(shapes),
             lambda: c.axes(shapes), lambda: cm.Concat("fused", names).inverse(shapes)]
    if given == parts:
        assert len(c.inverse(shapes)) == parts and c.output_shape(shapes)[1] == sum(s[1] for s in shapes)
        return
    for call in calls:
        with pytest.raises(TransformError, match=rf"concat of 'fused': {given} shapes? given for the {parts} "
                                                 r"parts \('p0', .*give one shape per part"):
            call()


@pytest.mark.parametrize("shapes, message", [
    ("84", "shapes must be a list"),
    ([(8, 4), (8, -2)], r"the shape of part 'k' must be a list of non-negative integers"),
    ([(8, 4), "84"], r"the shape of part 'k' must be a list"),
    ([(8, 4), (8, 2.0)], r"the shape of part 'k'"),
])
def test_concat_refuses_shapes_that_are_not_shapes(shapes, message):
    with pytest.raises(TransformError, match=message):
        cm.Concat("qkv", ["q", "k"], axis=1).inverse(shapes)


@pytest.mark.parametrize("shape, source_shape", [((2, 3), (7,)), ((4,), (2, 3)), ((0, 3), (3,))])
def test_a_reshape_whose_two_shapes_differ_in_size_is_refused_when_made(shape, source_shape):
    with pytest.raises(TransformError, match="a reshape keeps every value"):
        cm.Reshape("q", shape, source_shape=source_shape)
    assert cm.Reshape("q", (6,), source_shape=(2, 3)).inverse() == cm.Reshape("q", (2, 3), source_shape=(6,))


def test_a_split_into_no_parts_is_refused_when_made():
    with pytest.raises(TransformError, match="parts must be at least 1"):
        cm.Split("q", 0, 0, 0)


def test_squeeze_and_expand_dims_drop_and_add_a_unit_axis_and_undo_each_other():
    table = RNG.standard_normal((1, 17, 64)).astype("float32")
    sq = cm.Squeeze("pos", axis=0)
    assert np.array_equal(sq.apply(table), table[0])
    assert sq.describe((1, 17, 64)) == "squeezed axis 0 (1, 17, 64)->(17, 64)"
    ex = sq.inverse()
    assert ex == cm.ExpandDims("pos", 0) and np.array_equal(ex.apply(table[0]), table)
    assert cm.ExpandDims("pos", -1).output_shape((17, 64)) == (17, 64, 1)
    with pytest.raises(TransformError, match="has size 17, not 1"):
        cm.Squeeze("pos", axis=1).output_shape((1, 17, 64))
    with pytest.raises(TransformError, match="out of range"):
        cm.ExpandDims("pos", 4).output_shape((17, 64))


def test_transpose_takes_any_permutation_and_names_it():
    x = RNG.standard_normal((2, 3, 4))
    t = cm.Transpose("k", perm=(2, 0, 1))
    assert np.array_equal(t.apply(x), np.transpose(x, (2, 0, 1)))
    assert t.describe((2, 3, 4)) == "permuted axes (2, 0, 1) (2, 3, 4)->(4, 2, 3)"
    with pytest.raises(TransformError, match="permutation of 0..n-1"):
        cm.Transpose("k", perm=(0, 0, 1))


# -- plans and restores ---------------------------------------------------------------------------


def _fused_model():
    import keras

    inp = keras.Input((8,))
    out = keras.layers.Dense(2, name="head")(keras.layers.Dense(12, name="qkv")(inp))
    return keras.Model(inp, out)


def test_a_keras_layer_restores_its_fused_kernel_from_three_checkpoint_tensors(torch_file):
    model = _fused_model()
    plan = cm.plan(model, [_fused_source(torch_file)], allow_missing=["head/*"])
    plan.restore()
    layer = model.get_layer("qkv")
    assert np.array_equal(layer.kernel.numpy(), FUSED)
    assert np.array_equal(layer.bias.numpy(), np.concatenate([BQ, BK, BV]))
    x = RNG.standard_normal((3, 8)).astype("float32")
    hidden = model.get_layer("qkv")(x).numpy()
    np.testing.assert_allclose(hidden, x @ np.concatenate([Q, K, V], 1) + np.concatenate([BQ, BK, BV]), atol=1e-5)


def test_the_report_line_of_a_concat_names_every_part_raw_key_stored_shape_and_result(torch_file):
    plan = cm.plan(_fused_model(), [_fused_source(torch_file)], allow_missing=["head/*"])
    line = next(x for x in plan.report(limit=None).splitlines() if x.strip().startswith("qkv/kernel <-"))
    for raw in ("attn.q.weight (4, 8)", "attn.k.weight (4, 8)", "attn.v.weight (4, 8)"):
        assert raw in line
    assert "concat axis 1 of 3 parts: columns 0..3 <- 'attn/q/kernel'" in line and line.endswith("-> (8, 12)]")
    a = plan.to_dict()["assignments"]["qkv/kernel"]
    assert a["key"] == "attn.q.weight+attn.k.weight+attn.v.weight" and "attn.v.weight (4, 8)" in a["via"]
    assert "attn.q.weight (4, 8)" in plan._repr_html_()
    # each part counts as used; the extra bias is the one unused tensor
    cov = plan.coverage()["sources"][0]
    assert (cov["tensors"], cov["used"], cov["unused"]) == (7, 6, 1)
    assert plan.unused[plan.sources[0].label] == ["extra/bias"]


def test_a_concat_whose_target_is_missing_blocks_and_leaves_its_parts_unused(plain_file):
    targets = [cm.VariableInfo("fused/kernel", (8, 12), "float32")]
    src = cm.Source(plain_file, transforms=[cm.Concat("fused/kernal", PARTS, axis=1)])
    plan = cm.plan(targets, [src])
    assert "fused/kernel" in plan.missing
    assert set(PARTS) <= set(plan.unused[src.label])
    text = plan.report()
    assert ("Concat for 'fused/kernal' in source" in text and "(of 'attn/q/kernel+attn/k/kernel+attn/v/kernel') "
            "names no target variable. Did you mean 'fused/kernel'" in text)
    with pytest.raises(PlanError):
        plan.check()


def test_a_concat_whose_result_does_not_fit_its_target_is_a_shape_mismatch(plain_file):
    targets = [cm.VariableInfo("fused/kernel", (8, 10), "float32")]
    plan = cm.plan(targets, [cm.Source(plain_file, transforms=[cm.Concat("fused/kernel", PARTS, axis=1)])])
    assert [(m.target, m.kind, m.source_shape) for m in plan.mismatched] == [("fused/kernel", "shape", (8, 12))]


@pytest.mark.parametrize("parts, message", [
    (["attn/q/kernel", "attn/q/kernal"], r"part 'attn/q/kernal' is not a tensor of the source\. Did you mean"),
    (["attn/q/kernel", "half"], r"different dtypes \('attn/q/kernel' float32, 'half' float16\)"),
    (["attn/q/kernel", "wide"], r"cannot be joined along axis 1"),
])
def test_a_concat_that_cannot_be_made_is_refused_before_anything_is_restored(plain_file, parts, message):
    targets = [cm.VariableInfo("fused/kernel", (8, 8), "float32")]
    with pytest.raises(TransformError, match=message) as e:
        cm.plan(targets, [cm.Source(plain_file, transforms=[cm.Concat("fused/kernel", parts, axis=1)])])
    assert "concat of 'fused/kernel'" in str(e.value)


def test_a_concat_beside_a_map_is_restored_although_the_map_lists_only_other_names(plain_file):
    targets = [cm.VariableInfo("fused/kernel", (8, 12), "float32"), cm.VariableInfo("o", (3,), "float32")]
    src = cm.Source(plain_file, map={"other": "o"}, transforms=[cm.Concat("fused/kernel", PARTS)])
    plan = cm.plan(targets, [src])
    assert sorted(plan.assignments) == ["fused/kernel", "o"] and not plan.blocking()


def test_tf2_variables_and_a_tf1_graph_restore_a_concat(plain_file):
    import tensorflow as tf

    src = cm.Source(plain_file, transforms=[cm.Concat("fused/kernel", PARTS, axis=1)])
    v = tf.Variable(tf.zeros((8, 12)), name="fused/kernel")
    cm.restore([v], [src], allow_missing=[], strict=True)
    assert np.array_equal(v.numpy(), FUSED)
    g = tf.Graph()
    with g.as_default():
        w = tf.compat.v1.get_variable("fused/kernel", (8, 12), initializer=tf.compat.v1.zeros_initializer())
        with tf.compat.v1.Session(graph=g) as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            cm.plan(None, [src]).restore(session=sess)
            assert np.array_equal(sess.run(w), FUSED)


@pytest.mark.parametrize("out", ["out.safetensors", "out_ckpt", "out.weights.h5"])
def test_a_merge_writes_the_joined_tensor_under_its_target_and_leaves_out_its_parts(plain_file, tmp_path, out):
    # (a .weights.h5 file holds Keras entries, not variable names: merging/kerasout.py)
    fused, other = ("layers/fused/vars/0", "layers/other/vars/0") if out.endswith(".h5") else ("fused/kernel", "other")
    src = cm.Source(plain_file, include=["attn/*", "other"], transforms=[cm.Concat(fused, PARTS, axis=1)],
                    map={"other": other} if other != "other" else None)
    report = cm.merge([src], str(tmp_path / out))
    written = {v.name: v for v in cm.list_variables(str(tmp_path / out))}
    assert {n.rsplit(":", 1)[0] for n in written} >= {fused, other}
    assert not any(n.startswith("attn/") for n in written)
    name = next(n for n in written if n.startswith(fused))
    assert np.array_equal(cm.load(str(tmp_path / out), name)[name], FUSED)
    assert "concat axis 1 of 3 parts" in report.render()


def test_merge_json_names_the_parts_of_a_concat(plain_file, tmp_path):
    from _cli_util import run

    cfg = tmp_path / "merge.yaml"
    cfg.write_text(json.dumps({"sources": [{"path": plain_file, "include": ["attn/*"], "concat": [
        {"name": "fused/kernel", "sources": PARTS, "axis": 1}]}]}))
    result = run("merge", cfg, "-o", tmp_path / "m.safetensors", "--json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    a = data["plan"]["assignments"]["fused/kernel"]
    assert a["name"] == "+".join(PARTS) and "'attn/v/kernel' (8, 4)" in a["via"] and a["shape"] == [8, 12]


# -- config --------------------------------------------------------------------------------------


def test_a_config_source_takes_concat_squeeze_expand_dims_and_transpose_entries():
    cfg = load_config({"sources": [{"path": ".", "concat": [{"name": "qkv/kernel", "sources": PARTS, "axis": 1}],
                                    "split": [{"name": "v", "axis": 1, "index": 2, "parts": 3, "sizes": [4, 2, 2]}],
                                    "squeeze": [{"name": "vit/pos", "axis": 0}],
                                    "expand_dims": [{"name": "clf/pos", "axis": 0}],
                                    "transpose": [{"name": "k", "perm": [2, 0, 1]}]}]})
    ts = cfg.sources[0].transforms
    assert cm.Concat("qkv/kernel", PARTS, axis=1) in ts and cm.Squeeze("vit/pos", 0) in ts
    assert cm.ExpandDims("clf/pos", 0) in ts and cm.Transpose("k", (2, 0, 1)) in ts
    assert cm.Split("v", 1, 2, 3, sizes=(4, 2, 2)) in ts
    assert load_config(cfg.to_dict()) == cfg


@pytest.mark.parametrize("entry, message", [
    ({"concat": [{"name": "qkv"}]}, "missing required key 'sources'"),
    ({"concat": [{"name": "qkv", "sources": ["q"]}]}, "at least two"),
    ({"squeeze": [{"name": "p", "axis": "0"}]}, "axis must be an integer"),
])
def test_a_bad_concat_or_unit_axis_entry_is_a_config_error_naming_it(entry, message):
    with pytest.raises(ConfigError, match=message):
        load_config({"sources": [{"path": ".", **entry}]})


def test_a_hand_given_squeeze_and_reshape_name_their_operation_in_the_report_line(tmp_path):
    from safetensors.numpy import save_file

    path = str(tmp_path / "vit.safetensors")
    table = RNG.standard_normal((1, 17, 4)).astype("float32")
    save_file({"pos": table, "q": np.ones((4, 4), "float32")}, path)
    targets = [cm.VariableInfo("pos", (17, 4), "float32"), cm.VariableInfo("q", (4, 2, 2), "float32")]
    plan = cm.plan(targets, [cm.Source(path, transforms=[cm.Squeeze("pos", 0), cm.Reshape("q")])])
    text = plan.report(limit=None)
    assert "pos <- " in text and "(1, 17, 4); squeezed axis 0 (1, 17, 4)->(17, 4)" in text
    assert "q <- " in text and "(4, 4); reshaped (4, 4)->(4, 2, 2)" in text
    assert plan.to_dict()["assignments"]["pos"]["transforms"] == ["squeezed axis 0 (1, 17, 4)->(17, 4)"]
    assert "squeezed axis 0" in plan._repr_html_()
    assert os.path.exists(path)


def test_a_map_entry_keyed_by_several_names_joins_them_along_the_axis_the_target_needs(torch_file):
    model = _fused_model()
    src = cm.Source(torch_file, layout="torch", map={
        tuple(PARTS): "qkv/kernel", ("attn.q.bias", "attn.k.bias", "attn.v.bias"): "qkv/bias"})
    plan = cm.plan(model, [src], allow_missing=["head/*"])
    assert sorted(plan.assignments) == ["qkv/bias", "qkv/kernel"] and not plan.blocking()
    assert "concat axis 1 of 3 parts: columns 0..3 <- 'attn/q/kernel'" in plan.assignments["qkv/kernel"].describe()
    plan.restore()
    assert np.array_equal(model.get_layer("qkv").kernel.numpy(), FUSED)
    assert np.array_equal(model.get_layer("qkv").bias.numpy(), np.concatenate([BQ, BK, BV]))
    # the map still selects: the tensor it does not name is left out, not restored by its name
    assert plan.unused[src.label] == ["extra/bias"] and plan.dropped[src.label] == ["extra/bias"]


def test_a_map_entry_keyed_by_several_names_needs_one_target_name(torch_file):
    with pytest.raises(cm.RuleError, match="must be the one target's name"):
        cm.Source(torch_file, map={tuple(PARTS): ["a", "b"]})


def test_the_inverse_of_a_concat_splits_the_fused_tensor_back_bit_exactly(plain_file, tmp_path):
    concat = cm.Concat("fused/kernel", PARTS, axis=1)
    fused = str(tmp_path / "fused.safetensors")
    cm.merge([cm.Source(plain_file, include=["attn/*"], transforms=[concat])], fused)
    back = str(tmp_path / "back.safetensors")
    src = cm.Source(fused, map={"fused/kernel": PARTS}, transforms=concat.inverse())
    report = cm.merge([src], back, template=[cm.VariableInfo(p, (8, 4), "float32") for p in PARTS])
    values = cm.load(back, PARTS)
    for p, want in zip(PARTS, (Q, K, V)):
        assert np.array_equal(values[p], want)
    assert "split axis 1 into 3: columns 8..11 of 12 (part 3 of 3) -> (8, 4)" in report.render()


def test_a_keras_weights_file_concat_takes_the_entries_as_its_listing_names_them(tmp_path):
    import keras

    inp = keras.Input((8,))
    saved = keras.Model(inp, [keras.layers.Dense(4, name="q")(inp), keras.layers.Dense(4, name="k")(inp)])
    path = str(tmp_path / "two.weights.h5")
    saved.save_weights(path)
    assert [v.name for v in cm.list_variables(path)][::2] == ["layers/dense/vars/0", "layers/dense_1/vars/0"]
    inp = keras.Input((8,))
    model = keras.Model(inp, keras.layers.Dense(8, name="qk")(inp))
    src = cm.Source(path, transforms=[cm.Concat("qk/kernel", ["layers/dense/vars/0", "layers/dense_1/vars/0"]),
                                      cm.Concat("qk/bias", ["layers/dense/vars/1", "layers/dense_1/vars/1"])])
    plan = cm.plan(model, [src])
    assert not plan.blocking()  # the file's second layer, which the model's walk does not reach, is used
    plan.restore()
    q, k = saved.get_layer("q"), saved.get_layer("k")
    assert np.array_equal(model.get_layer("qk").kernel.numpy(), np.concatenate([q.kernel.numpy(), k.kernel.numpy()], 1))
    assert "[raw 'layers/dense/vars/0'] (8, 4)" in plan.report(limit=None)


def test_merge_reports_hand_given_operations_in_text_and_json(tmp_path):
    from _cli_util import run
    from safetensors.numpy import save_file

    save_file({"pos": np.arange(66 * 4, dtype="float32").reshape(66, 4), "q": np.ones((4, 4), "float32"),
               "vit": np.ones((1, 5, 4), "float32")}, str(tmp_path / "src.safetensors"))
    save_file({"pos": np.zeros((64, 4), "float32"), "q": np.zeros((4, 2, 2), "float32"),
               "vit": np.zeros((5, 4), "float32")}, str(tmp_path / "template.safetensors"))
    cfg = tmp_path / "ops.yaml"
    cfg.write_text(f"sources:\n  - path: {tmp_path / 'src.safetensors'}\n"
                   "    slice: [{name: pos, axis: 0, start: 2}]\n"
                   "    reshape: [{name: q}]\n    squeeze: [{name: vit, axis: 0}]\n")
    r = run("merge", cfg, "-o", tmp_path / "a.safetensors", "--template", tmp_path / "template.safetensors")
    assert r.exit_code == 0, r.output
    assert ("'pos' float32 (66, 4); slice axis 0: 64 of 64 rows copied (checkpoint rows 2..65 of 66), "
            "2 checkpoint rows dropped") in r.stdout
    assert "'q' float32 (4, 4); reshaped (4, 4)->(4, 2, 2)" in r.stdout
    assert "'vit' float32 (1, 5, 4); squeezed axis 0 (1, 5, 4)->(5, 4)" in r.stdout
    r = run("merge", cfg, "-o", tmp_path / "b.safetensors", "--template", tmp_path / "template.safetensors", "--json")
    a = json.loads(r.stdout)["plan"]["assignments"]["vit"]
    assert (a["key"], a["shape"], a["transforms"], a["target_shape"]) == (
        "vit", [1, 5, 4], ["squeezed axis 0 (1, 5, 4)->(5, 4)"], [5, 4])
    assert np.array_equal(cm.load(str(tmp_path / "a.safetensors"), "pos")["pos"],
                          np.arange(66 * 4, dtype="float32").reshape(66, 4)[2:])


# -- inferred concats ----------------------------------------------------------------------------


def _separate_qkv_file(path, blocks=2, roles=("query", "key", "value")):
    from safetensors.numpy import save_file

    rng = np.random.default_rng(7)
    d = {}
    for i in range(blocks):
        for r in roles:
            d[f"encoder.layer.{i}.attention.self.{r}.weight"] = rng.standard_normal((8, 8)).astype("float32")
            d[f"encoder.layer.{i}.attention.self.{r}.bias"] = rng.standard_normal(8).astype("float32")
    save_file(d, path)
    return d


def _qkv_model(blocks=2):
    import keras

    inp = keras.Input((8,))
    return keras.Model(inp, [keras.layers.Dense(24, name=f"block_{i}_qkv")(inp) for i in range(blocks)])


def test_structural_alignment_infers_the_concat_of_query_key_and_value_into_a_fused_kernel(tmp_path):
    path = str(tmp_path / "enc.safetensors")
    d = _separate_qkv_file(path)
    model = _qkv_model()
    plan = cm.plan(model, [cm.Source(path, layout="torch", align="structure")])
    assert sorted(plan.assignments) == [f"block_{i}_qkv/{leaf}" for i in range(2) for leaf in ("bias", "kernel")]
    assert not plan.blocking()
    plan.restore()
    for i in range(2):
        want = np.concatenate([d[f"encoder.layer.{i}.attention.self.{r}.weight"].T for r in ("query", "key", "value")],
                              axis=1)
        assert np.array_equal(model.get_layer(f"block_{i}_qkv").kernel.numpy(), want)
    line = plan.assignments["block_1_qkv/kernel"].describe()
    assert "concat axis 1 of 3 parts: columns 0..7 <- 'encoder/layer/1/attention/self/query/kernel'" in line
    assert "encoder.layer.1.attention.self.value.weight (8, 8)" in line
    s = cm.suggest(_qkv_model(), [cm.Source(path, layout="torch")])
    entry = s.to_config()["sources"][0]["concat"][0]
    assert entry == {"name": "block_0_qkv/bias", "axis": 0,
                     "sources": [f"encoder/layer/0/attention/self/{r}/bias" for r in ("query", "key", "value")]}
    assert not s.sources[0].review


def test_a_fused_target_two_scopes_fit_equally_is_proposed_for_review_and_never_applied(tmp_path):
    from safetensors.numpy import save_file

    rng = np.random.default_rng(3)
    save_file({f"{side}.{r}.weight": rng.standard_normal((8, 8)).astype("float32")
               for side in ("left", "right") for r in ("query", "key", "value")}, str(tmp_path / "two.safetensors"))
    targets = [cm.VariableInfo("qkv/kernel", (8, 24), "float32")]
    src = cm.Source(str(tmp_path / "two.safetensors"), layout="torch")
    plan = cm.plan(targets, [cm.Source(str(tmp_path / "two.safetensors"), layout="torch", align="structure")])
    assert plan.assignments == {} and plan.missing == ["qkv/kernel"]
    review = cm.suggest(targets, [src]).sources[0].review
    assert sorted(e.name.split("/")[0] for e in review) == ["left", "right"]
    assert all("another candidate fits as well: review" in e.evidence for e in review)


def test_parts_whose_names_do_not_say_query_key_value_are_never_joined(tmp_path):
    path = str(tmp_path / "abc.safetensors")
    _separate_qkv_file(path, blocks=1, roles=("a", "b", "c"))
    model = _qkv_model(1)
    plan = cm.plan(model, [cm.Source(path, layout="torch", align="structure")])
    assert "block_0_qkv/kernel" not in plan.assignments
    assert not [e for e in cm.suggest(_qkv_model(1), [cm.Source(path, layout="torch")]).sources[0].entries
                if "+" in e.name]


def test_a_restorer_switched_to_another_step_joins_the_same_parts(tmp_path):
    from safetensors.numpy import save_file

    for step, scale in ((1, 1.0), (2, 2.0)):
        save_file({p: v * scale for p, v in zip(PARTS, (Q, K, V))}, str(tmp_path / f"step{step}.safetensors"))
    v = cm.VariableInfo("fused/kernel", (8, 12), "float32")
    import tensorflow as tf

    var = tf.Variable(tf.zeros(v.shape), name="fused/kernel")
    r = cm.Restorer([var], [cm.Source(str(tmp_path / "step1.safetensors"),
                                      transforms=[cm.Concat("fused/kernel", PARTS, axis=1)])])
    r.restore()
    assert np.array_equal(var.numpy(), FUSED)
    r.restore(path=str(tmp_path / "step2.safetensors"))
    assert np.array_equal(var.numpy(), 2 * FUSED)


def test_a_merge_from_a_tf_bundle_joins_its_parts_and_copies_the_rest_as_stored(plain_file, tmp_path):
    bundle = str(tmp_path / "bundle")
    cm.merge([cm.Source(plain_file, include=["attn/*", "other"])], bundle)
    out = str(tmp_path / "joined")
    report = cm.merge([cm.Source(bundle, transforms=[cm.Concat("fused/kernel", PARTS, axis=1)])], out)
    values = cm.load(out, ["fused/kernel", "other"])
    assert np.array_equal(values["fused/kernel"], FUSED)
    assert np.array_equal(values["other"], np.arange(3, dtype="float32"))
    assert sorted(v.name for v in cm.list_variables(out)) == ["fused/kernel", "other"]
    assert "concat axis 1 of 3 parts" in report.render()
