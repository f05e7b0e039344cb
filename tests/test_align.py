"""Structural alignment: suggest, then apply only what is certain (issue 9, part 3).

Pure tests run on literal specs; the scenarios write real checkpoints with TensorFlow and check
restored values, in graph mode and into Keras models.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import yaml

import ckptmerge as cm
from _cli_util import run, save_tf1
from _corpus import corpus
from ckptmerge.alignment.align import align, natural_key, scope_entries, tokens
from ckptmerge.planning.planner import SourceView, make_plan
from ckptmerge.core.specs import VariableInfo as V
from ckptmerge.planning.suggestion import make_suggestion


def f32(name, *shape):
    return V(name, tuple(shape), "float32")


MLP_PY = """
import keras


def build():
    inp = keras.Input((4,))
    h = keras.layers.Dense(8, name="h0")(inp)
    h = keras.layers.Dense(8, name="h1")(h)
    return keras.Model(inp, keras.layers.Dense(3, name="out")(h))
"""


# -- pure ---------------------------------------------------------------------------------------

def test_tokens_fold_case_separators_and_synonyms():
    assert tokens("encoder/SelfAttn/LayerNorm") == tokens("encoder/self_attn/layer_norm")
    assert tokens("dnn/hiddenlayer_0/weights") == ("dnn", "dense", "kernel")
    assert sorted(["layer_10", "layer_9", "layer_1"], key=natural_key) == ["layer_1", "layer_9", "layer_10"]


def test_twelve_equal_layers_pair_by_numeric_order():
    targets = [f32(f"block_{i}/kernel", 8, 8) for i in range(12)] + [f32(f"block_{i}/bias", 8) for i in range(12)]
    names = [f32(f"layer_{i}/kernel", 8, 8) for i in (5, 0, 11, 3, 9, 1, 10, 2, 8, 4, 7, 6)]
    names += [f32(f"layer_{i}/bias", 8) for i in range(12)]
    got = align(targets, names).mapping
    assert got == {f"layer_{i}/{leaf}": f"block_{i}/{leaf}" for i in range(12) for leaf in ("kernel", "bias")}


def test_keras_auto_name_shift_pairs_dense_3_with_dense():
    targets = [f32("dense/kernel", 4, 4), f32("dense_1/kernel", 4, 4), f32("dense_2/kernel", 4, 4)]
    names = [f32("dense_3/kernel", 4, 4), f32("dense_4/kernel", 4, 4), f32("dense_5/kernel", 4, 4)]
    assert align(targets, names).mapping == {"dense_3/kernel": "dense/kernel", "dense_4/kernel": "dense_1/kernel",
                                              "dense_5/kernel": "dense_2/kernel"}


def test_equal_shapes_with_unrelated_names_and_no_order_stay_unresolved():
    result = align([f32("a", 3), f32("b", 3)], [f32("x", 3), f32("y", 3)])
    assert result.matches == []
    [u] = result.unresolved
    assert (u.targets, u.names, u.shape) == (("a", "b"), ("x", "y"), (3,))
    tied = align([f32("m/a/kernel", 3), f32("m/b/kernel", 3)], [f32("p/kernel", 3), f32("q/kernel", 3)])
    assert tied.matches == [] and tied.unresolved[0].targets == ("m/a/kernel", "m/b/kernel")


def test_the_global_assignment_beats_the_greedy_choice():
    # Alone, 'attention/output/LayerNorm' is closer to 'output_layer_norm' (more shared tokens);
    # only the pair as a whole says which is which.
    targets = [f32("t/self_attention_layer_norm/gamma", 8), f32("t/output_layer_norm/gamma", 8)]
    names = [f32("l/attention/output/LayerNorm/gamma", 8), f32("l/output/LayerNorm/gamma", 8)]
    assert align(targets, names).mapping == {
        "l/attention/output/LayerNorm/gamma": "t/self_attention_layer_norm/gamma",
        "l/output/LayerNorm/gamma": "t/output_layer_norm/gamma"}


def test_whole_scopes_fold_into_one_entry_and_each_entry_has_evidence():
    t = [f32("h0/kernel", 4, 8), f32("h0/bias", 8), f32("out/kernel", 8, 2), f32("out/bias", 2)]
    s = {n.name: n for n in [f32("dnn/hiddenlayer_0/kernel", 4, 8), f32("dnn/hiddenlayer_0/bias", 8),
                             f32("dnn/logits/kernel", 8, 2), f32("dnn/logits/bias", 2)]}
    sug = make_suggestion(make_plan(t, [SourceView("est", "runs/est", "", s)]))
    [src] = sug.sources
    assert src.map() == {"dnn/hiddenlayer_0/": "h0/", "dnn/logits/": "out/"}
    assert all(e.evidence and 0 < e.confidence <= 1 for e in src.entries)
    assert sug.missing == [] and sug.n_proposed == 4
    partial = scope_entries(align(t[:1], list(s.values())[:1]).matches, s, [x.name for x in t])
    assert [(e.name, e.target) for e in partial] == [("dnn/hiddenlayer_0/kernel", "h0/kernel")]


def test_plan_report_hints_at_suggest_when_structures_could_align():
    t = [f32("h0/kernel", 4, 8)]
    plan = make_plan(t, [SourceView("est", "runs/est", "", {"dnn/w": f32("dnn/w", 4, 8)})])
    hint = [line for line in plan.report().splitlines() if line.startswith("Hint:")]
    assert hint == ["Hint: 1 missing target and unused checkpoint variables of 'est' share shapes and "
                    "dtypes, so the names may differ wholesale: cm.suggest(target, sources) or "
                    "`ckptmerge suggest SOURCE... --target PATH` proposes a map by structure, and "
                    "Source(..., align='structure') applies its unambiguous part."]
    other = make_plan(t, [SourceView("est", "runs/est", "", {"dnn/w": f32("dnn/w", 5)})])
    assert "Hint:" not in other.report()


def test_html_reprs_put_findings_first_and_escape_names():
    t = [f32("<h0>/kernel", 4, 8), f32("x", 1)]
    s = {"dnn/<b>/kernel": f32("dnn/<b>/kernel", 4, 8), "x": f32("x", 1)}
    plan = make_plan(t, [SourceView("est", "runs/est", "", s)])
    page = plan._repr_html_()
    assert "&lt;h0&gt;/kernel" in page and "<h0>" not in page
    assert page.index("Findings") < page.index("Assignments")
    sug = make_suggestion(plan)
    page = sug._repr_html_()
    assert "dnn/&lt;b&gt;/kernel" in page and "Proposed map" in page and "shape (4, 8) float32" in page
    report = cm.Report(plan, "eager", ["x"], [("<h0>/kernel", "missing")], 0.1, 4, [])
    page = report._repr_html_()
    assert page.index("Skipped") < page.index("Restored") and "&lt;h0&gt;" in page


def test_source_align_must_be_a_known_mode():
    with pytest.raises(cm.RuleError, match="align must be one of 'structure' or None. Received: "
                                           "align='structur'. Did you mean 'structure'?"):
        cm.Source("runs/A", align="structur")


# -- TF1 Estimator DNN into a Keras MLP ---------------------------------------------------------

def _estimator_dnn(tmp_path):
    rng = np.random.default_rng(0)
    values = {"dnn/hiddenlayer_0/kernel": rng.standard_normal((4, 8)), "dnn/hiddenlayer_0/bias": rng.standard_normal(8),
              "dnn/hiddenlayer_1/kernel": rng.standard_normal((8, 8)), "dnn/hiddenlayer_1/bias": rng.standard_normal(8),
              "dnn/logits/kernel": rng.standard_normal((8, 3)), "dnn/logits/bias": rng.standard_normal(3)}
    values = {k: v.astype(np.float32) for k, v in values.items()}
    prefix = save_tf1(tmp_path / "est" / "model.ckpt", values, step=100, optimizer_slots=True)
    return prefix, cm.load(prefix)  # one Adam step ran: the values as saved


def _mlp():
    ns: dict = {}
    exec(MLP_PY, ns)  # the same builder the CLI test imports from a file
    return ns["build"]()


def test_estimator_dnn_names_restore_into_a_keras_mlp_by_structure(tmp_path, tf):
    prefix, values = _estimator_dnn(tmp_path)
    model = _mlp()
    plain = cm.plan(model, [cm.Source(prefix, name="est")])
    assert len(plain.assignments) == 0 and "Hint: 6 missing targets" in plain.report()
    sug = cm.suggest(model, [cm.Source(prefix, name="est")])
    assert sug.sources[0].map() == {"dnn/hiddenlayer_0/": "h0/", "dnn/hiddenlayer_1/": "h1/", "dnn/logits/": "out/"}
    plan = cm.plan(model, [cm.Source(prefix, name="est", align="structure")])
    assert plan.ok and len(plan.assignments) == 6
    assert plan.assignments["h1/bias"].via.startswith("matched by structure: shape (8,) float32; leaf 'bias' ~ 'bias'")
    assert "[matched by structure: " in plan.report()
    plan.restore()
    for layer, scope in (("h0", "hiddenlayer_0"), ("h1", "hiddenlayer_1"), ("out", "logits")):
        np.testing.assert_array_equal(model.get_layer(layer).kernel.numpy(), values[f"dnn/{scope}/kernel"])
        np.testing.assert_array_equal(model.get_layer(layer).bias.numpy(), values[f"dnn/{scope}/bias"])


def test_explicit_map_wins_over_alignment(tmp_path, tf):
    prefix, values = _estimator_dnn(tmp_path)
    model = _mlp()
    # Deliberately cross two layers: the map is obeyed, alignment fills only the rest, and never
    # half a layer: h1's kernel and bias would come from two modules, so h1 stays missing.
    plan = cm.plan(model, [cm.Source(prefix, align="structure", map={"dnn/hiddenlayer_1/bias": "h0/bias"})])
    assert plan.assignments["h0/bias"].name == "dnn/hiddenlayer_1/bias"
    assert plan.assignments["h0/bias"].via is None and plan.assignments["h0/bias"].rule is not None
    assert plan.assignments["out/kernel"].name == "dnn/logits/kernel"
    assert "h1/kernel" not in plan.assignments and "h1/bias" not in plan.assignments


def test_ckptmerge_suggest_writes_a_config_that_check_and_plan_use(tmp_path, tf):
    prefix, values = _estimator_dnn(tmp_path)
    target = save_tf1(tmp_path / "mlp" / "ckpt", {
        "h0/kernel": np.zeros((4, 8), np.float32), "h0/bias": np.zeros(8, np.float32),
        "h1/kernel": np.zeros((8, 8), np.float32), "h1/bias": np.zeros(8, np.float32),
        "out/kernel": np.zeros((8, 3), np.float32), "out/bias": np.zeros(3, np.float32)})
    out = tmp_path / "warm.yaml"
    r = run("suggest", prefix, "--target", target, "-o", out)
    assert r.exit_code == 0, r.output
    assert "'dnn/hiddenlayer_0/' -> 'h0/' (2 variables, " in r.stdout
    assert r.stdout.splitlines()[-1] == f"Wrote {out}: check it with 'ckptmerge check {out}', then 'ckptmerge plan {out} --target ...'."
    assert "Review the map" not in r.stdout  # written already: only what to do next
    r = run("suggest", prefix, "--target", target)
    assert r.stdout.splitlines()[-1] == ("Review the map, then write it as a config with 'ckptmerge suggest ... "
                                         "-o warm.yaml' and run 'ckptmerge plan warm.yaml'.")  # no Python to type
    assert "Suggestion.write" not in r.stdout
    cfg = yaml.safe_load(out.read_text())
    assert cfg["sources"][0]["map"] == {"dnn/hiddenlayer_0/": "h0/", "dnn/hiddenlayer_1/": "h1/", "dnn/logits/": "out/"}
    assert run("check", out).exit_code == 0
    r = run("plan", out, "--target", target)
    assert r.exit_code == 0, r.output
    assert "6 assigned" in r.stdout.splitlines()[0]
    r = run("suggest", prefix, "--target", target, "--json")
    assert json.loads(r.stdout)["n_proposed"] == 6


def test_ckptmerge_suggest_needs_exactly_one_target(tmp_path):
    r = run("suggest", "runs/x")
    assert r.exit_code == 2 and "pass exactly one of --target PATH" in r.stderr


def test_suggest_exits_1_when_names_stay_unresolved(tmp_path, tf):
    src = save_tf1(tmp_path / "s" / "ckpt", {"x": np.ones(3, np.float32), "y": np.zeros(3, np.float32)})
    tgt = save_tf1(tmp_path / "t" / "ckpt", {"a": np.ones(3, np.float32), "b": np.zeros(3, np.float32)})
    r = run("suggest", src, "--target", tgt)
    assert r.exit_code == 1
    assert "Unresolved (1) - the evidence cannot separate these:" in r.stdout
    assert "'a', 'b' <- one of 'x', 'y' (float32 (3,)): nothing but their shape relates them" in r.stdout
    plan = cm.plan(cm.list_variables(tgt), [cm.Source(src, align="structure")])
    assert plan.missing == ["a", "b"] and not plan.assignments  # never guessed


# -- Keras 2 object paths into Keras 3 ----------------------------------------------------------

def test_keras2_checkpoint_restores_into_keras3_layers_a_b_c_d(tf):
    import keras

    path = str(corpus() / "keras2-tfweights-cp-charity")
    model = keras.Sequential([keras.Input((19,)), keras.layers.Dense(90, name="a"), keras.layers.Dense(30, name="b"),
                              keras.layers.Dense(10, name="c"), keras.layers.Dense(1, name="d")])
    assert "Hint: 8 missing targets" in cm.plan(model, [cm.Source(path)]).report()
    report = cm.restore(model, [cm.Source(path, align="structure")])
    assert len(report.restored) == 8
    want = cm.load(path)
    for layer, old in zip("abcd", ("dense", "dense_1", "dense_2", "dense_3")):
        np.testing.assert_array_equal(model.get_layer(layer).kernel.numpy(), want[f"{old}/kernel"])
        np.testing.assert_array_equal(model.get_layer(layer).bias.numpy(), want[f"{old}/bias"])


# -- Keras auto-name shift (TF issue 46317) and 12 equal layers into Keras ----------------------

def test_auto_name_shift_restores_twelve_equal_layers_into_keras(tmp_path, tf):
    import keras

    def build():
        return keras.Sequential([keras.Input((6,))] + [keras.layers.Dense(6) for _ in range(12)])

    saved = build()
    rng = np.random.default_rng(1)
    for v in saved.weights:
        v.assign(rng.standard_normal(v.shape).astype(np.float32))
    prefix = tf.train.Checkpoint(model=saved).write(str(tmp_path / "ck"))
    fresh = build()  # built later in the same process: every layer name shifted by 12 (TF issue 46317)
    old = [layer.name for layer in saved.layers]
    assert not {layer.name for layer in fresh.layers} & set(old)
    # both the model's name and the layer numbers moved: undone by name, no alignment needed
    plain = cm.plan(fresh, [cm.Source(prefix)])
    assert plain.ok and len(plain.assignments) == 24
    assert plain.assignments[fresh.weights[0].path].via.startswith("model root and auto-name shift: ")
    # the same values under another layer family name: only structural alignment pairs them
    renamed = {n.replace("/dense", "/fc"): v for n, v in cm.load(prefix).items() if "/dense" in n}
    plain = cm.plan(fresh, [cm.Source.from_values(renamed)])
    assert len(plain.assignments) == 0 and "Hint: 24 missing targets" in plain.report()
    plan = cm.plan(fresh, [cm.Source.from_values(renamed, align="structure")])
    assert plan.ok and len(plan.assignments) == 24
    # numeric order decides: e.g. fc_9 before fc_10, as a string sort would not have it
    assert [plan.assignments[v.path].name.split("/")[1] for v in fresh.weights[::2]] == [
        n.replace("dense", "fc") for n in old]
    plan.restore()
    for a, b in zip(saved.weights, fresh.weights):
        np.testing.assert_array_equal(a.numpy(), b.numpy())


# -- TF2 object-graph order ----------------------------------------------------------------------

def test_object_graph_order_pairs_equal_layers_whose_names_say_nothing(tmp_path, tf):
    import keras

    saved = keras.Sequential([keras.Input((4,)), keras.layers.Dense(4, name="zeta"), keras.layers.Dense(4, name="alpha")])
    rng = np.random.default_rng(3)
    for v in saved.weights:
        v.assign(rng.standard_normal(v.shape).astype(np.float32))
    prefix = tf.train.Checkpoint(model=saved).write(str(tmp_path / "ck"))
    # 'alpha' sorts first, and no name relates to 'first'/'second': only the object graph's order
    # (zeta was built first) separates the two equal-shaped layers.
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(4, name="first"), keras.layers.Dense(4, name="second")])
    in_memory = cm.plan(model, [cm.Source.from_values(cm.load(prefix), name="m", align="structure")])
    assert len(in_memory.missing) == 4 and not in_memory.assignments
    suggestion = cm.suggest(model, [cm.Source(prefix)])
    assert suggestion.sources[0].map() == {saved.get_layer("zeta").path + "/": model.get_layer("first").path + "/",
                                           saved.get_layer("alpha").path + "/": model.get_layer("second").path + "/"}
    assert all(any(e.startswith("order ") for e in entry.evidence) for entry in suggestion.sources[0].entries)
    report = cm.restore(model, [cm.Source(prefix, align="structure")])
    assert len(report.restored) == 4
    for new, old in (("first", "zeta"), ("second", "alpha")):
        np.testing.assert_array_equal(model.get_layer(new).kernel.numpy(), saved.get_layer(old).kernel.numpy())
        np.testing.assert_array_equal(model.get_layer(new).bias.numpy(), saved.get_layer(old).bias.numpy())


# -- BERT TF1 names into TF2 Model-Garden names, graph mode ---------------------------------------

def _bert_tf1(hidden=8, inter=16, layers=2):
    rng = np.random.default_rng(7)
    out = {"bert/embeddings/word_embeddings": (30, hidden), "bert/embeddings/position_embeddings": (16, hidden),
           "bert/embeddings/token_type_embeddings": (2, hidden),
           "bert/embeddings/LayerNorm/gamma": (hidden,), "bert/embeddings/LayerNorm/beta": (hidden,),
           "bert/pooler/dense/kernel": (hidden, hidden), "bert/pooler/dense/bias": (hidden,)}
    for n in range(layers):
        p = f"bert/encoder/layer_{n}/"
        for q in ("query", "key", "value"):
            out[p + f"attention/self/{q}/kernel"] = (hidden, hidden)
            out[p + f"attention/self/{q}/bias"] = (hidden,)
        out[p + "attention/output/dense/kernel"] = (hidden, hidden)
        out[p + "attention/output/dense/bias"] = (hidden,)
        out[p + "attention/output/LayerNorm/gamma"] = (hidden,)
        out[p + "attention/output/LayerNorm/beta"] = (hidden,)
        out[p + "intermediate/dense/kernel"] = (hidden, inter)
        out[p + "intermediate/dense/bias"] = (inter,)
        out[p + "output/dense/kernel"] = (inter, hidden)
        out[p + "output/dense/bias"] = (hidden,)
        out[p + "output/LayerNorm/gamma"] = (hidden,)
        out[p + "output/LayerNorm/beta"] = (hidden,)
    return {k: rng.standard_normal(s).astype(np.float32) for k, s in out.items()}


def _tf1_to_garden(name):
    """The reference answer: BERT TF1 name -> Model Garden name."""
    table = [("bert/embeddings/word_embeddings", "encoder/word_embeddings/embeddings"),
             ("bert/embeddings/position_embeddings", "encoder/position_embedding/embeddings"),
             ("bert/embeddings/token_type_embeddings", "encoder/type_embeddings/embeddings"),
             ("bert/embeddings/LayerNorm/", "encoder/embeddings/layer_norm/"),
             ("bert/pooler/dense/", "encoder/pooler_transform/")]
    for old, new in table:
        if name.startswith(old):
            return new + name[len(old):]
    n, rest = name[len("bert/encoder/layer_"):].split("/", 1)
    rest = (rest.replace("attention/self/", "self_attention/")
            .replace("attention/output/dense/", "self_attention/attention_output/")
            .replace("attention/output/LayerNorm/", "self_attention_layer_norm/")
            .replace("intermediate/dense/", "intermediate/")
            .replace("output/dense/", "output/")
            .replace("output/LayerNorm/", "output_layer_norm/"))
    return f"encoder/transformer_{n}/{rest}"


def test_bert_tf1_names_restore_into_model_garden_names_in_graph_mode(tmp_path, tf):
    values = _bert_tf1()
    prefix = save_tf1(tmp_path / "bert" / "bert_model.ckpt", values)
    garden = {_tf1_to_garden(k): k for k in values}
    assert len(set(garden)) == len(values)
    graph = tf.Graph()
    with graph.as_default():
        for new, old in garden.items():  # created in Model Garden's own order
            tf.compat.v1.get_variable(new, shape=values[old].shape, initializer=tf.compat.v1.zeros_initializer())
        with tf.compat.v1.Session(graph=graph) as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            sug = cm.suggest(None, [cm.Source(prefix, name="bert")])
            proposed = {}
            for e in sug.sources[0].entries:
                assert not e.is_scope or e.count > 1
                proposed[e.name] = e.target
            assert sug.missing == [] and sug.sources[0].unresolved == [], [u.describe() for u in sug.sources[0].unresolved]
            plan = cm.plan(None, [cm.Source(prefix, name="bert", align="structure")])
            assert plan.ok, plan.report()
            wrong = {t: a.name for t, a in plan.assignments.items() if garden[t] != a.name}
            assert wrong == {} and len(plan.assignments) == len(values)
            plan.restore(session=sess)
            got = sess.run({v.op.name: v for v in tf.compat.v1.global_variables()})
    for new, old in garden.items():
        np.testing.assert_array_equal(got[new], values[old])


def test_ckptmerge_suggest_with_a_model_function(tmp_path, tf):
    prefix, _ = _estimator_dnn(tmp_path)
    (tmp_path / "mlp_models.py").write_text(MLP_PY)
    r = run("suggest", prefix, "--model", f"{tmp_path / 'mlp_models.py'}:build", "--json")
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["sources"][0]["map"] == {"dnn/hiddenlayer_0/": "h0/", "dnn/hiddenlayer_1/": "h1/",
                                                         "dnn/logits/": "out/"}


def test_ckptmerge_suggest_with_a_target_checkpoint_never_imports_tensorflow(tmp_path, tf):
    from _cli_util import run_subprocess

    src = save_tf1(tmp_path / "s" / "ckpt", {"dnn/hiddenlayer_0/kernel": np.ones((4, 8), np.float32)})
    tgt = save_tf1(tmp_path / "t" / "ckpt", {"h0/kernel": np.zeros((4, 8), np.float32)})
    out = run_subprocess(["suggest", src, "--target", tgt], tmp_path)
    assert out["code"] == 0, out
    assert out["tf_modules"] == []
    assert "'dnn/hiddenlayer_0/kernel' -> 'h0/kernel'" in out["stdout"]


def test_an_unresolved_group_names_each_candidate_once():
    from ckptmerge.alignment.entries import Unresolved

    u = Unresolved(("t/b", "t/a", "t/b"), ("c/kernel", "a/kernel", "c/kernel"), (3, 3), "float32", "a tie")
    assert u.targets == ("t/a", "t/b") and u.names == ("a/kernel", "c/kernel")
    assert u.describe().count("'c/kernel'") == 1
