"""The never-wrong rules of cross-framework alignment (issue 19), on literal names and specs: the
confidence floor and what suggest marks for review, the traps that must stay unresolved, random
layered models renamed, reordered and re-nested (0 wrong), and the plan's coverage. Pure: no TF."""

from __future__ import annotations

import numpy as np
import pytest

from ckptmerge.alignment.align import CONFIDENCE_FLOOR, align, below_floor
from ckptmerge.planning.planner import SourceView, make_plan
from ckptmerge.planning.suggestion import aligned_views, make_suggestion
from ckptmerge.core.specs import VariableInfo


def f32(name, *shape):
    return VariableInfo(name, tuple(shape), "float32")


def view(label, infos):
    return SourceView(label, "runs/" + label, "", {v.name: v for v in infos})


# -- the confidence floor ----------------------------------------------------------------------------

#: two pairs of one shape: ``enc/x`` ~ ``enc/y`` by scope and leaf; the other only by half a leaf
#: (``my_kernel`` ~ ``kernel``) and what is left: confidence 0.23
WEAK_T = [f32("enc/x/kernel", 4, 4), f32("a/b/kernel", 4, 4)]
WEAK_S = [f32("enc/y/kernel", 4, 4), f32("p/my_kernel", 4, 4)]


def test_a_match_below_the_confidence_floor_is_not_applied_and_stays_unresolved_with_its_candidate():
    found = align(WEAK_T, WEAK_S)
    assert {m.target: m.confidence for m in found.matches} == {"a/b/kernel": 0.23, "enc/x/kernel": 0.61}
    assert CONFIDENCE_FLOOR == 0.25
    kept, weak = below_floor(found)
    assert kept.mapping == {"enc/y/kernel": "enc/x/kernel"}
    assert weak[0].targets == ("a/b/kernel",) and weak[0].names == ("p/my_kernel",)
    assert "confidence 0.23 is below the floor 0.25" in weak[0].reason
    plan = make_plan(WEAK_T, [view("A", WEAK_S)])
    views = aligned_views(plan, plan.sources, [True])
    assert dict(views[0].aligned) == {"enc/y/kernel": "enc/x/kernel"}
    assert [u.names for u in views[0].unresolved] == [("p/my_kernel",)]
    assert make_plan(WEAK_T, views).missing == ["a/b/kernel"]


def test_suggest_marks_what_align_structure_would_not_apply_as_review_never_as_certain():
    targets = WEAK_T + [f32("enc/z/kernel", 2, 3), f32("enc/z/bias", 3)]
    names = WEAK_S + [f32("old/z/kernel", 2, 3), f32("old/z/bias", 3)]
    s = make_suggestion(make_plan(targets, [view("A", names)]))
    src = s.sources[0]
    assert [(e.name, e.review) for e in src.entries] == [
        ("p/my_kernel", True), ("enc/y/kernel", False), ("old/z/", False)]
    assert src.map() == {"enc/y/kernel": "enc/x/kernel", "old/z/": "enc/z/"}  # only what is certain
    assert s.n_proposed == 3 and s.missing == ["a/b/kernel"]
    assert [e["review"] for e in src.to_dict()["entries"]] == [True, False, False]
    report = s.report()
    assert "For review (1) - confidence below 0.25" in report and "REVIEW 'p/my_kernel' -> 'a/b/kernel'" in report
    assert "REVIEW 'p/my_kernel'" in s.to_yaml() and "add it once checked" in s.to_yaml()
    assert "<td>review</td>" in s._repr_html_()


# -- property: random layered models renamed, reordered, re-nested -----------------------------------

_KINDS = {"dense": (("kernel", "io"), ("bias", "o")), "norm": (("gamma", "o"), ("beta", "o")),
          "conv": (("kernel", "kkio"), ("bias", "o"))}
#: the target's words for each module kind and leaf (synonyms and convention names among them)
_WORDS = {"dense": ["dense", "linear", "fc"], "norm": ["layer_norm", "layernorm", "norm"], "conv": ["conv", "conv2d"]}
_LEAVES = {"kernel": ["kernel", "weights", "w"], "bias": ["bias", "b", "biases"], "gamma": ["gamma", "scale"],
           "beta": ["beta", "offset", "center"]}


def _random_pair(seed):
    """A random stack of Dense, norm and conv layers in 1-3 blocks of 1-3 layers (widths 4 or 8,
    so that shapes collide), as a checkpoint (``net/block_B/normJ/gamma``) and a target renamed,
    re-nested and listed in another order: ``model/stage_{B+1}/layernorm_J/scale``,
    ``root/enc/stageB/inner/...``, or flat Keras default names (``conv``, ``conv_1``, ...) with
    their creation order. Returns (targets, names, truth, target_order, source_order)."""
    rng = np.random.default_rng(seed)
    layers, width = [], int(rng.choice([4, 8]))
    for b in range(int(rng.integers(1, 4))):
        for j in range(int(rng.integers(1, 4))):
            kind = str(rng.choice(list(_KINDS)))
            out = width if kind == "norm" else int(rng.choice([4, 8]))
            layers.append((b, j, kind, width, out))
            width = out
    style = int(rng.integers(0, 3))
    words = {k: str(rng.choice(v)) for k, v in _WORDS.items()}
    leaves = {k: str(rng.choice(v)) for k, v in _LEAVES.items()}
    targets, names, truth, counters = [], [], {}, {}
    for b, j, kind, i, o in layers:
        n = counters[kind] = counters.get(kind, -1) + 1
        scope = (f"model/stage_{b + 1}/{words[kind]}_{j}", f"root/enc/stage{b}/inner/{words[kind]}_{j}",
                 words[kind] if n == 0 else f"{words[kind]}_{n}")[style]
        for leaf, dims in _KINDS[kind]:
            shape = {"io": (i, o), "o": (o,), "kkio": (3, 3, i, o)}[dims]
            s, t = f32(f"net/block_{b}/{kind}{j}/{leaf}", *shape), f32(f"{scope}/{leaves[leaf]}", *shape)
            names.append(s)
            targets.append(t)
            truth[t.name] = s.name
    order_t, order_s = [t.name for t in targets], [s.name for s in names]
    rng.shuffle(names)
    rng.shuffle(targets)
    return targets, names, truth, order_t if style == 2 else None, order_s if rng.random() < 0.5 else None


@pytest.mark.parametrize("seeds", [range(0, 40), range(40, 80)])
def test_random_layered_models_are_never_wrong_and_every_target_is_assigned_or_unresolved(seeds):
    assigned = total = 0
    for seed in seeds:
        targets, names, truth, order_t, order_s = _random_pair(seed)
        found = align(targets, names, target_order=order_t, source_order=order_s)
        wrong = [m.describe() for m in found.matches if truth[m.target] != m.name]
        assert wrong == [], f"seed {seed}"
        unresolved = {t for u in found.unresolved for t in u.targets}
        assert {m.target for m in found.matches} | unresolved == set(truth), f"seed {seed}"
        assigned += len(found.matches)
        total += len(truth)
    assert assigned > 0.6 * total  # (the property holds of a test that pairs something)


# -- traps that stay unresolved ----------------------------------------------------------------------

def test_the_swapped_norm_trap_stays_unresolved_with_both_candidates():
    # two equal norms in one block, named by position only on one side and by nothing on the other
    targets = [f32("block_0/norm_a/gamma", 8), f32("block_0/norm_b/gamma", 8)]
    names = [f32("layers/0/ln_x/weight", 8), f32("layers/0/ln_y/weight", 8)]
    found = align(targets, names)
    assert list(found.matches) == []
    assert [(u.targets, u.names) for u in found.unresolved] == [
        (("block_0/norm_a/gamma", "block_0/norm_b/gamma"), ("layers/0/ln_x/weight", "layers/0/ln_y/weight"))]


def test_numbered_norms_are_positions_not_the_roles_of_norm1_and_norm2():
    # ``norm1``/``norm2`` are timm's attention/MLP norms, but beside ``norm0`` they are only numbers
    targets = [f32(f"stage/layer_norm_{j}/gamma", 8) for j in (1, 2, 3)]
    names = [f32(f"block/norm{j}/gamma", 8) for j in (0, 1, 2)]
    found = align(targets, names)
    assert found.mapping == {"block/norm0/gamma": "stage/layer_norm_1/gamma",
                             "block/norm1/gamma": "stage/layer_norm_2/gamma",
                             "block/norm2/gamma": "stage/layer_norm_3/gamma"}


# -- coverage ------------------------------------------------------------------------------------------

def test_a_plan_across_frameworks_ends_with_its_coverage_in_text_dict_and_html():
    targets = WEAK_T + [f32("enc/z/kernel", 2, 3), f32("enc/q/bias", 7)]
    names = WEAK_S + [f32("old/z/kernel", 2, 3), f32("old/extra", 5)]
    plan = make_plan(targets, [view("A", names)])
    plan = make_plan(targets, aligned_views(plan, plan.sources, [True]))
    c = plan.coverage()
    assert c["targets"] == {"total": 4, "assigned": 2, "unresolved": 1, "missing": 1, "allowed_missing": 0,
                            "skipped": 0}
    assert c["sources"] == [{"label": "A", "tensors": 4, "used": 2, "unused": 2}]
    assert c["unresolved"][0]["targets"] == ["a/b/kernel"] and c["unresolved"][0]["names"] == ["p/my_kernel"]
    assert plan.to_dict()["coverage"] == c
    report = plan.report()
    assert ("Coverage: 4 targets: 2 assigned, 1 unresolved, 1 missing; source 'A': 4 tensors, 2 used, 2 unused"
            in report)
    assert "Unresolved (1)" in report and "'a/b/kernel' <- one of 'p/my_kernel'" in report
    html = plan._repr_html_()
    assert "<h4>Coverage</h4>" in html and "p/my_kernel" in html


def test_a_plan_by_names_alone_keeps_its_report_as_it_was():
    plan = make_plan([f32("x", 2)], [view("A", [f32("x", 2)])])
    assert "Coverage" not in plan.report() and plan.coverage()["targets"]["assigned"] == 1


def test_the_transposed_or_not_trap_stays_unresolved_with_both_readings():
    # a square bias-free weight the torch layout cannot decide: a Linear's (out, in) or an Embedding
    from ckptmerge.alignment.layouts import likely_target, torch_layout

    lay = torch_layout([f32("proj_a.weight", 8, 8)])
    assert [n for n, _ in lay.undecided] == ["proj_a/weight"]
    targets = [f32("enc/dense/kernel", 8, 8)]
    src = SourceView("w", "w.safetensors", "", {e.info.name: e.info for e in lay.entries.values()},
                     layout="torch", undecided=("proj_a/weight",))
    plan = make_plan(targets, [src])
    views = aligned_views(plan, plan.sources, [True])
    assert dict(views[0].aligned) == {}  # never paired, although its leaf and shape fit
    (u,) = views[0].unresolved
    assert u.targets == ("enc/dense/kernel",) and u.names == ("proj_a/weight",)
    assert "transposed" in u.reason and "both readings fit" in u.reason
    plan = make_plan(targets, views)
    assert plan.missing == ["enc/dense/kernel"] and plan.coverage()["targets"]["unresolved"] == 1
    assert make_suggestion(plan).sources[0].unresolved[0].names == ("proj_a/weight",)
    assert lay.findings("w", targets)[0].endswith(
        "Pass transforms=[cm.Transpose('enc/dense/kernel')] for a Linear, or map it to an 'embeddings' target")
    assert likely_target("proj_a/weight", (8, 8), targets + [f32("head/kernel", 8, 8)]) is None  # two fit alike


# -- conventions through the config ----------------------------------------------------------------------

def test_a_config_extends_the_convention_table():
    from ckptmerge.alignment.conventions import conventions, rewrite
    from ckptmerge.config import load_config

    cfg = load_config({"sources": [{"path": "."}],
                       "conventions": [{"names": ["pre_ffw_rmsnorm_x"], "role": "mlpnorm", "replace": True},
                                       {"names": "attn_in_rmsnorm_x", "role": "attnnorm", "why": "mine"}]})
    assert [c.role for c in cfg.conventions] == ["mlpnorm", "attnnorm"]
    assert load_config(cfg.to_dict()) == cfg
    cfg.make_sources()
    cfg.make_sources()  # (twice: each row added once)
    assert sum(c.names == ("pre_ffw_rmsnorm_x",) for c in conventions()) == 1
    assert rewrite("blocks/3/pre_ffw_rmsnorm_x/scale") == "blocks/3/mlpnorm/scale"
    assert rewrite("blocks/3/attn_in_rmsnorm_x/scale") == "blocks/3/attn_in_rmsnorm_x_attnnorm/scale"


@pytest.mark.parametrize("entry, message", [
    ({"role": "mlpnorm"}, "missing required key 'names'"),
    ({"names": ["x"], "role": "Bad-Role"}, "lower-case words"),
    ({"names": ["x"], "role": "r", "meaning": "r"}, "unknown key 'meaning'. Use 'role'"),
    ({"names": [3], "role": "r"}, "expected a list of name segments"),
])
def test_a_bad_convention_entry_is_a_config_error_naming_it(entry, message):
    from ckptmerge.config import load_config
    from ckptmerge.core.errors import ConfigError

    with pytest.raises(ConfigError, match="conventions") as e:
        load_config({"sources": [{"path": "."}], "conventions": [entry]})
    assert message in str(e.value)


# -- maps in PyTorch's names -----------------------------------------------------------------------------

def test_a_map_of_a_torch_layout_source_accepts_pytorch_dotted_names(tmp_path):
    import ckptmerge as cm
    from safetensors.numpy import save_file

    path = str(tmp_path / "model.safetensors")
    save_file({"model.embed_tokens.weight": np.arange(12, dtype=np.float32).reshape(6, 2),
               "model.layers.0.mlp.up_proj.weight": np.ones((4, 2), np.float32),
               "model.layers.0.mlp.up_proj.bias": np.zeros(4, np.float32)}, path)
    targets = [f32("tok/embeddings", 6, 2), f32("block/up/kernel", 2, 4), f32("block/up/bias", 4)]
    plan = cm.plan(targets, [cm.Source(path, layout="torch", map={"model.embed_tokens.weight": "tok/embeddings",
                                                                  "model.layers.0.mlp.up_proj.": "block/up/"})])
    assert plan.ok, plan.report()
    assert plan.assignments["tok/embeddings"].name == "model/embed_tokens/embeddings"
    assert plan.assignments["block/up/kernel"].key == "model.layers.0.mlp.up_proj.weight"
    assert plan.assignments["block/up/kernel"].spec.shape == (2, 4)  # transposed by the layout



STORED_KEY_HINT = ("it matches the stored key 'model.layers.0.mlp.up_proj.weight', but rules match this "
                   "source's names as its layout converts them: write it against 'model/layers/0/mlp/up_proj/kernel'")


def _torch_file(tmp_path):
    from safetensors.numpy import save_file

    path = str(tmp_path / "model.safetensors")
    save_file({"model.layers.0.mlp.up_proj.weight": np.ones((4, 2), np.float32)}, path)
    return path


def test_a_regex_written_against_a_torch_sources_stored_keys_says_which_names_rules_match(tmp_path):
    import ckptmerge as cm

    path = _torch_file(tmp_path)
    rx = [(r"model\.layers\.0\.mlp\.up_proj\.weight", "block/up/kernel")]
    plan = cm.plan([f32("block/up/kernel", 2, 4)], [cm.Source(path, layout="torch", regex=rx)])
    (rule,) = plan.unmatched_rules
    assert "matched no checkpoint variable; " + STORED_KEY_HINT in rule.message()
    # written against the converted name, the same rule renames it
    ok = cm.plan([f32("block/up/kernel", 2, 4)],
                 [cm.Source(path, layout="torch", regex=[(r"model/layers/0/mlp/up_proj/kernel", "block/up/kernel")])])
    assert ok.ok and not ok.unmatched_rules
    # a regex that matches no stored key either gets no such hint
    other = cm.plan([f32("block/up/kernel", 2, 4)], [cm.Source(path, layout="torch", regex=[(r"nothing", "x")])])
    assert "stored key" not in other.unmatched_rules[0].message()


def test_the_cli_plan_shows_the_stored_key_hint_and_fails(tmp_path):
    from safetensors.numpy import save_file

    from tests._cli_util import run

    path = _torch_file(tmp_path)
    target = str(tmp_path / "target.safetensors")
    save_file({"block/up/kernel": np.zeros((2, 4), np.float32)}, target)
    cfg = tmp_path / "c.yaml"
    cfg.write_text(f"sources:\n  - path: {path}\n    layout: torch\n    regex:\n"
                   "      - ['model\\.layers\\.0\\.mlp\\.up_proj\\.weight', 'block/up/kernel']\n")
    result = run("plan", cfg, "--target", target)
    assert result.exit_code == 1, result.output
    assert STORED_KEY_HINT in " ".join(result.output.split())
    assert "Traceback" not in result.output

# -- tensor operations as config keys --------------------------------------------------------------------

def test_a_config_source_takes_reshape_split_transpose_and_an_offset_slice():
    from ckptmerge.alignment.tensorops import Reshape, Split
    from ckptmerge.config import load_config
    from ckptmerge.planning.transforms import Slice, Transpose

    cfg = load_config({"sources": [{"path": ".", "reshape": [{"name": "q/kernel", "shape": [16, 4, 4]}],
                                    "split": [{"name": "k/kernel", "axis": 1, "index": 1, "parts": 3}],
                                    "transpose": [{"name": "p/kernel", "perm": [2, 0, 1]}],
                                    "slice": [{"name": "pos/embeddings", "axis": 0, "start": 2}]}]})
    assert cfg.sources[0].transforms == [Slice("pos/embeddings", 0, start=2), Reshape("q/kernel", (16, 4, 4)),
                                         Split("k/kernel", 1, 1, 3), Transpose("p/kernel", (2, 0, 1))]
    assert load_config(cfg.to_dict()) == cfg
    assert list(cfg.make_sources()[0].transforms) == cfg.sources[0].transforms


@pytest.mark.parametrize("entry, message", [
    ({"split": [{"name": "k", "axis": 1}]}, "missing required keys 'index', 'parts'"),
    ({"split": [{"name": "k", "axis": 0, "index": 3, "parts": 3}]}, "index must be in 0..2"),
    ({"transpose": [{"name": "k", "perm": [0, 0]}]}, "perm must be a permutation"),
    ({"reshape": [{"name": "k", "new_shape": [2]}]}, "unknown key 'new_shape'. Use 'shape'"),
    ({"slice": [{"name": "k", "axis": 0, "start": -1}]}, "a start entry"),
])
def test_a_bad_tensor_operation_is_a_config_error_naming_it(entry, message):
    from ckptmerge.config import load_config
    from ckptmerge.core.errors import ConfigError

    with pytest.raises(ConfigError) as e:
        load_config({"sources": [{"path": ".", **entry}]})
    assert message in str(e.value)


def test_an_offset_slice_copies_rows_from_its_start_and_names_them():
    from ckptmerge.planning.transforms import Slice

    table = np.arange(66 * 2, dtype=np.float32).reshape(66, 2)
    s = Slice("pos/embeddings", axis=0, start=2)
    np.testing.assert_array_equal(s.apply(table, np.zeros((64, 2), np.float32)), table[2:66])
    assert s.describe((66, 2), (64, 2)) == ("slice axis 0: 64 of 64 rows copied (checkpoint rows 2..65 of 66), "
                                            "2 checkpoint rows dropped")
    with pytest.raises(Exception, match="start 66 is past"):
        Slice("p", axis=0, start=66).output_shape((66, 2), (64, 2))


def test_grouped_query_attention_heads_are_a_reshape_the_planner_infers():
    from ckptmerge.alignment.tensorops import refines

    # Llama's k_proj (kv_heads * head_dim, hidden) = (8, 16), transposed by the layout to (16, 8),
    # is KerasHub's key kernel (hidden, kv_heads, head_dim) = (16, 2, 4)
    assert refines((16, 8), (16, 2, 4)) and refines((8,), (2, 4))
    found = align([f32("t_0/self_attention/key/kernel", 16, 2, 4), f32("t_0/self_attention/query/kernel", 16, 4, 4)],
                  [f32("layers/0/self_attn/k_proj/kernel", 16, 8), f32("layers/0/self_attn/q_proj/kernel", 16, 16)])
    assert found.mapping == {"layers/0/self_attn/k_proj/kernel": "t_0/self_attention/key/kernel",
                             "layers/0/self_attn/q_proj/kernel": "t_0/self_attention/query/kernel"}


def test_suggest_proposes_an_offset_slice_for_review_naming_both_readings():
    targets = [f32("embeddings/position_embedding/embeddings", 64, 8), f32("embeddings/token_embedding/embeddings", 50, 8)]
    # (a scope the convention table gives no offset for: RoBERTa's own is decided, tests/test_align_matrix.py)
    names = [f32("encoder/embeddings/position_embeddings", 66, 8), f32("encoder/embeddings/word_embeddings", 50, 8)]
    s = make_suggestion(make_plan(targets, [view("A", names)]))
    (slice_entry,) = [e for e in s.sources[0].entries if e.review]
    assert slice_entry.name == "encoder/embeddings/position_embeddings"
    assert "start=2) copies rows 2..65 of 66, start=0 rows 0..63" in slice_entry.describe()
    assert "encoder/embeddings/position_embeddings" not in s.sources[0].map()  # for review: never certain
    assert s.missing == ["embeddings/position_embedding/embeddings"]
