"""Tests of ckptmerge.planning.rules: pure rule objects on literal names (no TF, no files)."""

from __future__ import annotations

import json
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ckptmerge.core.errors import RuleError
from ckptmerge.planning.rules import (Ambiguity, GlobFilter, MapRule, RegexRule, Rules, UnmatchedRule,
                             did_you_mean_text, suggest)


# ------------------------------------------------------------------------------ MapRule


def test_map_rule_exact_renames_one_name():
    rule = MapRule("a1", "c/x1")
    assert not rule.is_scope
    assert rule.matches("a1") and not rule.matches("a10")
    assert rule.rename("a1") == "c/x1"


def test_map_rule_scope_renames_every_name_under_the_scope():
    rule = MapRule("a/", "c/encoder/")
    assert rule.is_scope
    assert rule.rename("a/dense/kernel") == "c/encoder/dense/kernel"
    assert not rule.matches("ab/x")
    assert not rule.matches("a")


def test_map_rule_root_source_covers_all_names():
    rule = MapRule("/", "c/")
    assert rule.matches("x") and rule.matches("a/b")
    assert rule.rename("a/b") == "c/a/b"


def test_map_rule_root_target_strips_the_scope():
    assert MapRule("a/", "/").rename("a/dense/kernel") == "dense/kernel"


def test_map_rule_normalises_output_suffix_and_leading_slash():
    rule = MapRule("a1:0", "/c/x1:0")
    assert (rule.source, rule.target) == ("a1", "c/x1")


def test_map_rule_scope_on_one_side_only_is_rule_error():
    with pytest.raises(RuleError) as e:
        MapRule("a/", "c/encoder")
    msg = str(e.value)
    assert "'a/' -> 'c/encoder'" in msg
    assert "both sides to end with '/'" in msg
    assert "Write 'a/' -> 'c/encoder/'" in msg
    with pytest.raises(RuleError, match="both sides to end with '/'"):
        MapRule("a", "c/")


def test_map_rule_target_not_a_str_is_rule_error_naming_received_type():
    with pytest.raises(RuleError) as e:
        MapRule("a1", 3)
    assert "target must be a name (str)" in str(e.value)
    assert "received 3 (type int)" in str(e.value)
    assert "v.name" in str(e.value)


def test_map_rule_empty_name_is_rule_error():
    with pytest.raises(RuleError, match="empty name; use '/' for the root scope"):
        MapRule("", "c/x")


# ------------------------------------------------------------------------------ RegexRule


def test_regex_rule_uses_fullmatch_not_search():
    rule = RegexRule(r"head/(.*)", r"new/\1")
    assert rule.matches("head/k")
    assert not rule.matches("x/head/k")


def test_regex_rule_expands_numbered_and_named_backreferences():
    assert RegexRule(r"^head/(.*)", r"new_head/\1").rename("head/kernel") == "new_head/kernel"
    assert RegexRule(r"(?P<s>\w+)/(?P<v>\w+)", r"\g<v>/\g<s>").rename("a/b") == "b/a"


def test_regex_rule_none_replacement_drops():
    assert RegexRule(r".*/Adam(_1)?", None).rename("k/Adam_1") is None


def test_regex_rule_rename_of_a_non_matching_name_is_rule_error():
    with pytest.raises(RuleError, match="does not match 'zz'"):
        RegexRule("a", "b").rename("zz")


def test_regex_rule_invalid_pattern_is_rule_error_with_position():
    with pytest.raises(RuleError) as e:
        RegexRule("^head/(.*", r"x/\1")
    assert str(e.value) == "invalid regex '^head/(.*': missing ), unterminated subpattern at position 6"


def test_regex_rule_backreference_to_missing_group_fails_at_construction():
    with pytest.raises(RuleError) as e:
        RegexRule(r"^head/(.*)", r"new/\2")
    msg = str(e.value)
    assert "invalid replacement 'new/\\2' for regex '^head/(.*)'" in msg
    assert "invalid group reference 2" in msg
    assert "the pattern has 1 group" in msg


def test_regex_rule_unknown_group_name_fails_at_construction():
    with pytest.raises(RuleError) as e:
        RegexRule(r"(?P<a>x)", r"\g<b>")
    assert "unknown group name 'b'" in str(e.value)
    assert "(named: 'a')" in str(e.value)


def test_regex_rule_bad_escape_in_replacement_is_rule_error():
    with pytest.raises(RuleError, match=r"bad escape \\q"):
        RegexRule("(x)", r"\q")


def test_regex_rule_wrong_types_are_rule_errors():
    with pytest.raises(RuleError, match="pattern must be a str; received 1 \\(type int\\)"):
        RegexRule(1, "x")
    with pytest.raises(RuleError, match="must be a str or None \\(drop\\); received 2"):
        RegexRule("x", 2)


# ------------------------------------------------------------------------------ GlobFilter


def test_glob_star_crosses_slashes_and_is_case_sensitive():
    g = GlobFilter("enc/*")
    assert g.matches("enc/a/b")
    assert not g.matches("ENC/a")


def test_glob_empty_is_rule_error():
    with pytest.raises(RuleError, match="non-empty str; received ''"):
        GlobFilter("")


# ------------------------------------------------------------------------------ from_options


def test_from_options_map_not_a_dict_is_rule_error_naming_received():
    with pytest.raises(RuleError) as e:
        Rules.from_options(map=["a"])
    assert "map must be a dict" in str(e.value)
    assert "received ['a'] (type list)" in str(e.value)


def test_from_options_regex_single_pair_is_rule_error_with_fix():
    with pytest.raises(RuleError) as e:
        Rules.from_options(regex=("^a/(.*)", r"b/\1"))
    assert "received a single pair" in str(e.value)
    assert "write [('^a/(.*)', 'b/\\\\1')]" in str(e.value)


def test_from_options_regex_not_a_list_is_rule_error_with_example():
    with pytest.raises(RuleError) as e:
        Rules.from_options(regex={"a": "b"})
    assert "regex must be a list of (pattern, replacement) pairs, e.g." in str(e.value)
    assert "(type dict)" in str(e.value)


def test_from_options_regex_entry_not_a_pair_is_rule_error_with_index():
    with pytest.raises(RuleError, match=r"regex\[1\] must be a \(pattern, replacement\) pair"):
        Rules.from_options(regex=[("a", "b"), ("a", "b", "c")])


def test_from_options_accepts_lists_as_pairs_and_a_single_glob_str():
    r = Rules.from_options(regex=[["a", "b"]], include="x*", exclude=["y"])
    assert r.regexes == (RegexRule("a", "b"),)
    assert r.include == (GlobFilter("x*"),)
    assert r.exclude == (GlobFilter("y"),)


def test_from_options_non_str_glob_is_rule_error_with_index():
    with pytest.raises(RuleError, match=r"include\[1\]: a glob must be a non-empty str; received 3"):
        Rules.from_options(include=["a", 3])


def test_from_options_include_wrong_type_is_rule_error():
    with pytest.raises(RuleError, match="include must be a glob \\(str\\) or a list of globs"):
        Rules.from_options(include=3)


def test_from_options_reports_every_problem_at_once():
    with pytest.raises(RuleError) as e:
        Rules.from_options(map={"a/": "b"}, regex=[("(", "x")], exclude=[""])
    msg = str(e.value)
    assert msg.startswith("3 invalid rules:")
    assert "map['a/']" in msg and "regex[0]: invalid regex '('" in msg and "exclude[0]" in msg


def test_from_options_same_source_twice_after_normalisation_feeds_both_targets():
    rules = Rules.from_options(map={"a": "x", "a:0": "y"})
    assert rules.apply(["a"]).mapping == {"a": ("x", "y")}


def test_from_options_list_of_targets_and_list_of_pairs_are_the_same_rules():
    assert Rules.from_options(map={"a": ["x", "y"]}) == Rules.from_options(map=[("a", "x"), ("a", "y")])
    assert Rules.from_options(map={"a": ["x", "y"]}).to_dict() == {"map": {"a": ["x", "y"]}}


def test_from_options_empty_list_of_targets_is_rule_error():
    with pytest.raises(RuleError, match="list of targets is empty"):
        Rules.from_options(map={"a": []})


def test_from_options_map_order_does_not_matter():
    assert Rules.from_options(map={"b": "y", "a": "x"}) == Rules.from_options(map={"a": "x", "b": "y"})


def test_rules_fields_must_hold_rule_objects():
    with pytest.raises(RuleError, match="Rules.maps must be a tuple of MapRule"):
        Rules(maps=({"a": "b"},))


def test_rules_duplicate_map_entries_are_rule_error():
    with pytest.raises(RuleError, match="map 'a' -> 'x' appears twice"):
        Rules(maps=(MapRule("a", "x"), MapRule("a", "x")))


# ------------------------------------------------------------------------------ apply


def test_apply_without_rules_is_identity():
    res = Rules().apply(["b", "a"])
    assert res.mapping == {"a": ("a",), "b": ("b",)}
    assert res.dropped == [] and res.unmatched == [] and res.ambiguous == []


def test_apply_include_selects_and_exclude_removes():
    res = Rules.from_options(include="enc/*", exclude="*/Adam*").apply(
        ["enc/k", "enc/k/Adam", "dec/k"])
    assert res.mapping == {"enc/k": ("enc/k",)}
    assert res.dropped == ["dec/k", "enc/k/Adam"]


def test_apply_empty_include_list_counts_as_not_given():
    assert Rules.from_options(include=[]).apply(["a"]).mapping == {"a": ("a",)}


def test_apply_exact_entry_and_covering_scope_entry_both_apply():
    # As init_from_checkpoint: {"scope/var1": "some_scope/my1", "scope/": "some_other_scope/"}
    res = Rules.from_options(map={"a/": "c/", "a/x": "special"}).apply(["a/x", "a/y"])
    assert res.mapping == {"a/x": ("c/x", "special"), "a/y": ("c/y",)}
    assert res.explicit == frozenset({"a/x"})
    assert res.unmatched == []


def test_apply_every_covering_scope_applies():
    res = Rules.from_options(map={"/": "r/", "a/": "c/", "a/b/": "d/"}).apply(["a/b/k", "a/k", "z"])
    assert res.mapping == {"a/b/k": ("c/b/k", "d/k", "r/a/b/k"), "a/k": ("c/k", "r/a/k"), "z": ("r/z",)}
    assert res.pairs()[0] == ("a/b/k", "c/b/k")


def test_apply_drops_names_no_rule_covers_when_map_given():
    res = Rules.from_options(map={"a1": "c/x1"}).apply(["a1", "a2"])
    assert res.mapping == {"a1": ("c/x1",)}
    assert res.dropped == ["a2"]


def test_apply_map_takes_precedence_over_regex():
    res = Rules.from_options(map={"a": "from_map"}, regex=[("a|b", "from_regex")]).apply(["a", "b"])
    assert res.mapping == {"a": ("from_map",), "b": ("from_regex",)}
    assert res.unmatched == []


def test_apply_regex_none_drops_names():
    res = Rules.from_options(regex=[(".*/Adam", None), ("k", "k")]).apply(["k", "k/Adam"])
    assert res.mapping == {"k": ("k",)}
    assert res.dropped == ["k/Adam"]


def test_apply_regex_rules_that_agree_are_not_ambiguous():
    res = Rules.from_options(regex=[("x/(.*)", r"y/\1"), ("(.*)/k", r"y/k")]).apply(["x/k"])
    assert res.mapping == {"x/k": ("y/k",)}
    assert res.ambiguous == []


def test_apply_regex_rules_that_disagree_are_ambiguous_and_not_mapped():
    rules = Rules.from_options(regex=[("x/(.*)", r"a/\1"), ("(.*)/k", r"b/\1")])
    res = rules.apply(["x/k"])
    assert res.mapping == {}
    assert res.dropped == []
    assert res.ambiguous == [Ambiguity("x/k", ("a/k", "b/x"),
                                       (r"regex 'x/(.*)' -> 'a/\1'", r"regex '(.*)/k' -> 'b/\1'"))]


def test_apply_regex_drop_and_rename_of_one_name_is_ambiguous():
    res = Rules.from_options(regex=[("k", None), (".*", "kept")]).apply(["k"])
    assert res.ambiguous[0].targets == (None, "kept")


def test_apply_unmatched_exact_map_entry_is_explicit_with_suggestions():
    res = Rules.from_options(map={"a1": "c/x1"}).apply(["a_1", "b"])
    assert res.unmatched == [UnmatchedRule("map", "map 'a1' -> 'c/x1'", ("a_1",), True)]
    assert res.unmatched[0].message() == (
        "map 'a1' -> 'c/x1' matched no checkpoint variable. Did you mean 'a_1'?")


def test_apply_exact_map_entry_for_an_excluded_name_says_so():
    res = Rules.from_options(map={"a1": "c/x1"}, exclude="a*").apply(["a1"])
    (u,) = res.unmatched
    assert u.explicit
    assert "'a1' exists but include/exclude leave it out" in u.message()


def test_apply_unmatched_scope_suggests_close_scopes():
    res = Rules.from_options(map={"encodr/": "c/"}).apply(["encoder/k"])
    (u,) = res.unmatched
    assert (u.kind, u.explicit, u.suggestions) == ("map-scope", False, ("encoder/",))


def test_apply_scope_covered_by_longer_scopes_still_renames():
    res = Rules.from_options(map={"a/": "c/", "a/b/": "d/"}).apply(["a/b/k"])
    assert res.unmatched == [] and res.mapping == {"a/b/k": ("c/b/k", "d/k")}


def test_apply_unmatched_regex_hints_at_partial_matches():
    res = Rules.from_options(regex=[("head", "h")]).apply(["model/head/k"])
    (u,) = res.unmatched
    assert u.kind == "regex"
    assert "must match whole names; it matches part of 'model/head/k'" in u.message()


def test_apply_unmatched_regex_matching_no_part_of_a_name_has_no_partial_hint():
    # (the hint named the first name whatever the pattern: a bool from UserPattern.search was
    # compared with None)
    res = Rules.from_options(regex=[("pooled_dense/kernel", "p")]).apply(["embeddings_layer_norm/beta"])
    (u,) = res.unmatched
    assert u.reason == "matched no checkpoint variable"
    assert RegexRule("head", "h").search("model/head/k") and not RegexRule("head", "h").search("model/k")


def test_apply_regex_shadowed_by_map_is_unmatched():
    res = Rules.from_options(map={"a": "x"}, regex=[("a", "y")]).apply(["a"])
    (u,) = res.unmatched
    assert "map entries cover all 1 names it matches" in u.reason


def test_apply_unmatched_include_suggests_close_globs_and_an_idle_exclude_is_no_finding():
    res = Rules.from_options(include=["encoder/*", "enc/*"], exclude="*/Adamm").apply(
        ["encoder/k", "encoder/k/Adam"])
    kinds = {u.kind: u for u in res.unmatched}
    assert kinds["include"].rule == "include 'enc/*'"
    assert kinds["include"].suggestions[0] == "encoder/*"
    assert not kinds["include"].explicit
    assert "exclude" not in kinds  # e.g. '*/Adam*' once optimizer state is already left out


def test_apply_records_the_rule_that_renamed_each_name():
    rules = Rules.from_options(map={"a/": "c/"}, regex=[("z", "y")])
    res = rules.apply(["a/k", "z"])
    assert res.via[("a/k", "c/k")] == MapRule("a/", "c/")
    assert res.via[("z", "y")] == RegexRule("z", "y")


def test_apply_ignores_duplicates_and_input_order():
    rules = Rules.from_options(map={"a/": "c/"}, regex=[("b(.*)", r"d\1")])
    assert rules.apply(["b1", "a/x", "q", "b1"]) == rules.apply(["q", "a/x", "b1"])


# ------------------------------------------------------------------------------ display


def test_describe_identity():
    assert Rules().describe() == ["identity (every name is kept as it is)"]


def test_describe_lists_rules_in_the_order_they_apply():
    r = Rules.from_options(map={"a/": "c/"}, regex=[("x", None)], include="a*", exclude="*/Adam")
    assert r.describe() == ["include 'a*'", "exclude '*/Adam'", "map 'a/' -> 'c/'",
                            "regex 'x' -> None (drop)"]


def test_describe_filters_only_keeps_other_names():
    assert Rules.from_options(exclude="x").describe() == ["exclude 'x'", "selected names keep their names"]


def test_is_identity_only_without_any_rule():
    assert Rules().is_identity
    assert not Rules.from_options(exclude="x").is_identity


def test_to_dict_round_trips_through_json_and_from_options():
    r = Rules.from_options(map={"a/": "c/", "a1": "x"}, regex=[(r"h/(.*)", r"n/\1"), ("t", None)],
                           include=["a*", "h*", "t"], exclude="*/Adam")
    d = json.loads(json.dumps(r.to_dict()))
    assert Rules.from_options(**d) == r


def test_unmatched_rule_message_for_non_explicit_rule_mentions_strict():
    u = UnmatchedRule("regex", "regex 'x' -> 'y'", source="A")
    assert u.message() == ("regex 'x' -> 'y' in source 'A' matched no checkpoint variable. "
                           "Fix or remove it. (strict=False ignores this.)")


def test_unmatched_rule_unknown_kind_is_rule_error():
    with pytest.raises(RuleError, match="unknown unmatched-rule kind 'mapp'"):
        UnmatchedRule("mapp", "x")


def test_suggest_falls_back_to_the_last_path_component():
    assert suggest("enc/kernal", ["encoder/dense/kernel", "encoder/dense/bias"]) == ["encoder/dense/kernel"]
    assert did_you_mean_text(["a", "b", "c"]) == " Did you mean 'a', 'b' or 'c'?"
    assert did_you_mean_text([]) == ""


# ------------------------------------------------------------------------------ laws

_seg = st.sampled_from(["a", "b", "enc", "dec", "k", "kernel", "bias", "Adam"])
_names = st.lists(st.lists(_seg, min_size=1, max_size=3).map("/".join), max_size=12)
_scope = st.lists(_seg, min_size=0, max_size=2).map(lambda p: "/".join(p) + "/")
_exact = st.lists(_seg, min_size=1, max_size=3).map("/".join)
_map_entry = st.one_of(st.tuples(_scope, _scope), st.tuples(_exact, _exact))
_regex_entry = st.tuples(
    st.sampled_from([r"(.*)/k", r"enc/(.*)", r"(.*)", r"a/(\w+)", r".*Adam.*"]),
    st.sampled_from([r"x/\1", r"\1/y", "fixed", None]))


@st.composite
def _rules(draw):
    maps = dict(draw(st.lists(_map_entry, max_size=4)))
    # a backreference needs a group: keep only valid (pattern, replacement) combinations
    regex = [(p, r) for p, r in draw(st.lists(_regex_entry, max_size=3))
             if "(" in p or r is None or "\\" not in r]
    return Rules.from_options(map=maps or None, regex=regex or None,
                              include=draw(st.one_of(st.none(), st.lists(_scope.map(lambda s: s + "*"), max_size=2))),
                              exclude=draw(st.one_of(st.none(), st.just(["*/Adam*"]))))


@settings(max_examples=150, deadline=None)
@given(_names)
def test_law_identity_rules_give_identity_mapping(names):
    res = Rules().apply(names)
    assert res.mapping == {n: (n,) for n in sorted(set(names))}


@settings(max_examples=150, deadline=None)
@given(_rules(), _names, st.randoms(use_true_random=False))
def test_law_renaming_is_deterministic_and_independent_of_input_order(rules, names, rnd):
    shuffled = list(names)
    rnd.shuffle(shuffled)
    first = rules.apply(names)
    assert first == rules.apply(shuffled)
    assert first == rules.apply(names)


@settings(max_examples=150, deadline=None)
@given(_rules(), _names)
def test_law_every_name_is_mapped_dropped_or_ambiguous_exactly_once(rules, names):
    res = rules.apply(names)
    parts = [set(res.mapping), set(res.dropped), {a.name for a in res.ambiguous}]
    assert sum(len(p) for p in parts) == len(set(names))
    assert set().union(*parts) == set(names)


@settings(max_examples=150, deadline=None)
@given(_rules())
def test_law_to_dict_round_trips(rules):
    assert Rules.from_options(**json.loads(json.dumps(rules.to_dict()))) == rules


def test_apply_on_a_large_checkpoint_maps_every_name():
    # Speed is measured in scripts/bench_scale.py, not here: a timed test fails on a busy machine.
    names = [f"layer_{i}/dense/{v}" for i in range(2000) for v in ("kernel", "bias")]
    random.Random(0).shuffle(names)
    rules = Rules.from_options(map={"layer_1/": "l1/"}, regex=[(r"layer_(\d+)/(.*)", r"L\1/\2")],
                               exclude="*/bias")
    res = rules.apply(names)
    assert len(res.mapping) == 2000


def test_dot_scopes_map_pytorch_names_like_slash_scopes():
    from ckptmerge.planning.rules import MapRule

    rule = MapRule("encoder.", "encoder/")
    assert rule.is_scope and rule.rename("encoder.layer.0.weight") == "encoder/layer.0.weight"
    assert not rule.matches("decoder.layer.0.weight")
    with pytest.raises(RuleError, match="'/' or '.'"):
        MapRule("encoder.", "encoder")


def test_dot_scope_map_in_a_plan_of_safetensors_names():
    from ckptmerge.planning.planner import SourceView, make_plan
    from ckptmerge.core.specs import VariableInfo

    src = [VariableInfo("encoder.layer.0.weight", (2, 2), "float32"), VariableInfo("head.bias", (2,), "float32")]
    view = SourceView(label="st", path="st", note="", variables={v.name: v for v in src},
                      rules=Rules.from_options(map={"encoder.": "model/encoder/"}))
    plan = make_plan([VariableInfo("model/encoder/layer.0.weight", (2, 2), "float32")], [view])
    assert plan.assignments["model/encoder/layer.0.weight"].name == "encoder.layer.0.weight"


# --------------------------------------------------------------------------------------------
# Fast paths (scope ranges found by bisection, literal globs as string tests) agree with the rules
# applied one name and one entry at a time.
# --------------------------------------------------------------------------------------------

_PARTS = st.sampled_from(["a", "b", "ab", "a.b", "x", "global_step", "kernel", "Adam"])
_NAME = st.lists(_PARTS, min_size=1, max_size=4).map("/".join)
_SCOPE = st.lists(_PARTS, min_size=1, max_size=2).map(lambda p: "/".join(p) + "/")
_GLOB = st.one_of(_NAME, _NAME.map(lambda n: "*" + n), _NAME.map(lambda n: n + "*"),
                  _NAME.map(lambda n: "*" + n + "*"), st.sampled_from(["*", "**", "a?", "[ab]/*", "*/global_step"]))


@settings(max_examples=300, deadline=None, derandomize=True, database=None)
@given(names=st.lists(_NAME, max_size=30), glob=_GLOB)
def test_glob_select_equals_matching_each_name(names, glob):
    g = GlobFilter(glob)
    assert g.select(names) == [n for n in names if g.matches(n)]


@settings(max_examples=300, deadline=None, derandomize=True, database=None)
@given(names=st.lists(_NAME, max_size=30), scopes=st.lists(st.tuples(_SCOPE, _SCOPE), min_size=1, max_size=4),
       exact=st.lists(st.tuples(_NAME, _NAME), max_size=3), root=st.booleans())
def test_map_rules_give_every_covering_entry_target_as_init_from_checkpoint_does(names, scopes, exact, root):
    entries = scopes + exact + ([("/", "r/")] if root else [])
    rules = Rules.from_options(map=entries)
    res = rules.apply(names)
    for n in sorted(set(names)):
        covering = [m for m in rules.maps if m.matches(n)]
        if not covering:
            assert n in res.dropped and n not in res.mapping
            continue
        assert res.mapping[n] == tuple(sorted({m.rename(n) for m in covering}))
        for t in res.mapping[n]:
            assert res.via[(n, t)].rename(n) == t
    assert res.triples() == [(n, t, res.via[(n, t)]) for n, t in res.pairs()]
    used = {m for m in rules.maps if any(m.matches(n) for n in names)}
    assert {u.rule for u in res.unmatched} == {m.describe() for m in rules.maps if m not in used}
