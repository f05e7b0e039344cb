"""Tests of ckptmerge.render.report: exact plain-text rendering of plans and restore reports."""

from __future__ import annotations

import json

import pytest

from ckptmerge.planning.planner import OptionError, SourceView, make_plan
from ckptmerge.render.report import Report, render_plan, verdict
from ckptmerge.planning.rules import Rules
from ckptmerge.core.specs import VariableInfo as V


def _mixed_plan(**options):
    a = SourceView("A", "runs/A/model-10", "latest checkpoint per runs/A/checkpoint (step 10)",
                   {"a1": V("a1", (3, 4), "float32"), "a2": V("a2", (4,), "float16"),
                    "a3": V("a3", (2, 2), "float32"), "a1/Adam": V("a1/Adam", (3, 4), "float32")},
                   Rules.from_options(map={"a1": "c/x1", "a2": "c/h", "a3": "x"}, exclude="*/Adam"))
    b = SourceView("B", "runs/B/model-10", "",
                   {"b1": V("b1", (4,), "float32"), "x": V("x", (2, 2), "float32"),
                    "head/kernel": V("head/kernel", (8, 5), "float32")}, Rules())
    targets = [V("c/x1", (3, 4), "float32"), V("c/h", (4,), "float32"), V("x", (2, 2), "float32"),
               V("head/kernel", (8, 10), "float32"), V("c/z", (), "int64"), V("opt/iter", (), "int64")]
    return make_plan(targets, [a, b], allow_missing=["opt/*"], cast=True, **options)


MIXED = """\
Plan: 6 targets, 2 sources, 2 assigned
Options: on_conflict='error', on_shape_mismatch='error', cast=True, allow_missing=['opt/*']
Sources:
  A: runs/A/model-10 (latest checkpoint per runs/A/checkpoint (step 10))
    rules: exclude '*/Adam'; map 'a1' -> 'c/x1'; map 'a2' -> 'c/h'; map 'a3' -> 'x'
    4 variables: 2 used, 2 unused (1 left out by rules)
  B: runs/B/model-10
    rules: identity (every name is kept as it is)
    3 variables: 0 used, 3 unused (0 left out by rules)
Assignments (2):
  c/h <- A:'a2' float16 (4,) cast float16->float32
  c/x1 <- A:'a1' float32 (3, 4)
Missing (1) - map a checkpoint variable to each, or pass allow_missing:
  c/z
Allowed missing (1):
  opt/iter
Mismatched (1):
  shape mismatch: target 'head/kernel' (8, 10) <- B:'head/kernel' (8, 5) (pass on_shape_mismatch='skip' to leave it as it is)
Conflicts (1):
  conflict: target 'x' is provided by A:'a3' and B:'x' (pass on_conflict='first' or 'last', or narrow a source with include/exclude)
Unused (5) - checkpoint variables no target takes:
  A: a1/Adam (left out by rules)
  A: a3
  B: b1
  B: head/kernel
  B: x
3 blocking findings (strict); 0 with strict=False"""


def test_render_plan_shows_every_section_exactly():
    assert render_plan(_mixed_plan()) == MIXED


def test_plan_report_delegates_to_render_plan():
    plan = _mixed_plan()
    assert plan.report() == MIXED
    assert plan.report(limit=1) == render_plan(plan, limit=1)


def test_render_plan_truncates_sections_at_limit():
    text = render_plan(_mixed_plan(), limit=1)
    assert "Assignments (2):\n  c/h <- A:'a2' float16 (4,) cast float16->float32\n  ... and 1 more\n" in text
    assert "Unused (5) - checkpoint variables no target takes:\n  A: a1/Adam (left out by rules)\n  ... and 4 more\n" in text


def test_render_plan_limit_none_shows_everything():
    targets = [V(f"t{i:03d}", (), "int64") for i in range(120)]
    text = render_plan(make_plan(targets, []), limit=None)
    assert "  t119\n" in text and "more" not in text
    assert "  ... and 70 more\n" in render_plan(make_plan(targets, []))


def test_render_plan_without_findings_says_so():
    plan = make_plan([V("x", (2,), "float32")],
                     [SourceView("A", "<memory>", "", {"x": V("x", (2,), "float32")})])
    assert render_plan(plan) == (
        "Plan: 1 target, 1 source, 1 assigned\n"
        "Options: on_conflict='error', on_shape_mismatch='error', cast=False, allow_missing=[]\n"
        "Sources:\n"
        "  A: <memory>\n"
        "    rules: identity (every name is kept as it is)\n"
        "    1 variable: 1 used, 0 unused (0 left out by rules)\n"
        "Assignments (1):\n"
        "  x <- A:'x' float32 (2,)\n"
        "No findings.\n"
        "OK: nothing blocks a strict restore")


def test_render_plan_marks_skipped_mismatches_and_resolved_conflicts():
    a = SourceView("A", "<memory>", "", {"k": V("k", (3,), "float32")})
    b = SourceView("B", "<memory>", "", {"y": V("y", (2,), "float32")},
                   Rules.from_options(regex=[("y", "x"), ("(y)", r"\1")]))
    plan = make_plan([V("k", (2,), "float32"), V("x", (2,), "float32"), V("y", (2,), "float32")],
                     [a, b], on_shape_mismatch="skip", on_conflict="last", allow_missing="x")
    text = render_plan(plan)
    assert ("Skipped (1) - shapes differ, left as they are (on_shape_mismatch='skip'):\n"
            "  shape mismatch: target 'k' (2,) <- A:'k' (3,)\n") in text
    assert ("Conflicts (1):\n  conflict: regex rules in source 'B' rename 'y' differently: "
            r"regex 'y' -> 'x' gives 'x', regex '(y)' -> '\1' gives 'y'; resolved to 'y' by "
            "on_conflict.\n") in text
    assert text.endswith("\nOK: nothing blocks a strict restore")


def test_render_plan_lists_unmatched_rules():
    a = SourceView("A", "<memory>", "", {"a_1": V("a_1", (), "int64")},
                   Rules.from_options(map={"a1": "x"}))
    text = render_plan(make_plan([V("x", (), "int64")], [a], allow_missing="x"))
    assert ("Unmatched rules (1):\n  map 'a1' -> 'x' in source 'A' matched no checkpoint variable. "
            "Did you mean 'a_1'?\n") in text
    assert text.endswith("\n1 blocking finding (strict); 1 with strict=False")


def test_render_plan_bad_limit_is_option_error():
    with pytest.raises(OptionError, match="limit must be a non-negative int or None; received -1"):
        render_plan(make_plan([], []), limit=-1)


def test_verdict_counts_strict_and_non_strict_findings():
    assert verdict(make_plan([], [])) == "OK: nothing blocks a strict restore"
    assert verdict(_mixed_plan()) == "3 blocking findings (strict); 0 with strict=False"


# ------------------------------------------------------------------------------ Report


def _report(**overrides):
    plan = _mixed_plan(on_shape_mismatch="skip", on_conflict="first")
    fields = dict(plan=plan, mode="eager", restored=["x", "c/x1", "c/h"],
                  skipped=[("head/kernel", "shape mismatch (on_shape_mismatch='skip')")],
                  elapsed=0.1234, bytes_read=1536,
                  sources=[{"label": "A", "path": "runs/A/model-10", "note": "step 10",
                            "n_restored": 3, "bytes": 1536},
                           {"label": "B", "path": "runs/B/model-10", "note": "",
                            "n_restored": 0, "bytes": 0}])
    fields.update(overrides)
    return Report(**fields)


def test_report_summary_is_one_line():
    assert _report().summary() == (
        "restored 3 variables from 1 source in 0.12 s; 1 allowed missing; 1 skipped")


def test_report_render_is_exact_and_str_is_render():
    r = _report()
    assert r.render() == (
        "restored 3 variables from 1 source in 0.12 s; 1 allowed missing; 1 skipped\n"
        "Mode: eager; read 1.5 KiB\n"
        "Sources:\n"
        "  A: runs/A/model-10 (step 10): 3 restored, 1.5 KiB\n"
        "  B: runs/B/model-10: 0 restored, 0 B\n"
        "Restored (3):\n"
        "  c/h <- A:'a2' float16 (4,) cast float16->float32\n"
        "  c/x1 <- A:'a1' float32 (3, 4)\n"
        "  x <- A:'a3' float32 (2, 2)\n"
        "Skipped (1):\n"
        "  head/kernel: shape mismatch (on_shape_mismatch='skip')\n"
        "Allowed missing (1):\n"
        "  opt/iter")
    assert str(r) == r.render()


def test_report_sorts_restored_and_skipped():
    r = _report(skipped=[("b", "r"), ("a", "r")])
    assert r.restored == ["c/h", "c/x1", "x"]
    assert r.skipped == [("a", "r"), ("b", "r")]


def test_report_to_dict_is_json_ready():
    d = json.loads(json.dumps(_report().to_dict()))
    assert d["summary"].startswith("restored 3 variables")
    assert d["skipped"] == [{"target": "head/kernel",
                             "reason": "shape mismatch (on_shape_mismatch='skip')"}]
    assert d["plan"]["assignments"]["c/x1"]["shape"] == [3, 4]
    assert (d["mode"], d["bytes_read"], d["elapsed"]) == ("eager", 1536, 0.1234)


def test_report_bad_mode_is_option_error():
    with pytest.raises(OptionError, match="mode must be one of 'graph', 'eager', 'keras', 'offline'; received 'lazy'"):
        _report(mode="lazy")


def test_report_render_truncates_at_limit():
    assert "Restored (3):\n  c/h <- A:'a2' float16 (4,) cast float16->float32\n  ... and 2 more" in (
        _report().render(limit=1))


def test_report_bytes_are_human_readable():
    assert "read 3.0 MiB" in _report(bytes_read=3 * 1024 * 1024).render()
    assert "read 12 B" in _report(bytes_read=12).render()


# --- long source paths shown once (issue 33 item 7) ------------------------------------------

import numpy as np  # noqa: E402

from ckptmerge.render.labels import ShortLabels  # noqa: E402


@pytest.mark.parametrize("seed", range(5))
def test_short_labels_tell_sources_apart(seed):
    rng = np.random.default_rng(seed)
    roots = ["/data/runs", "/home/me/exp", "s3://bucket/x"]
    labels = sorted({f"{rng.choice(roots)}/{rng.choice(['a', 'b', 'c'])}/ckpt-{rng.integers(1, 3)}"
                     for _ in range(6)}) + ["B", "ckpt-1"]
    short = ShortLabels(labels)
    shown = [short.short(label) for label in labels]
    assert len(set(shown)) == len(shown), shown           # never two sources under one label
    assert short.short("B") == "B" and short.short("ckpt-1") == "ckpt-1"  # a name stays as given
    for label in labels:
        assert label.endswith(short.short(label))
        assert short(f"x <- {label}:'k'") == f"x <- {short.short(label)}:'k'"
        assert short(f"{label}x/y") == f"{label}x/y"        # only whole labels


def test_plan_report_shows_a_long_path_once(tmp_path):
    long = str(tmp_path / "very" / "deep" / "runs" / "A" / "model-10")
    a = SourceView(long, long, "checkpoint prefix " + long, {"k": V("k", (3,), "float32"),
                                                             "u": V("u", (2,), "float32")})
    plan = make_plan([V("k", (3,), "float32"), V("m", (2,), "float32")], [a])
    text = render_plan(plan)
    assert text.count(long) == 1, text                      # in the Sources header, once
    assert f"  model-10: {long} (checkpoint prefix model-10)" in text
    assert "k <- model-10:'k'" in text and "model-10: u" in text
    assert plan.to_dict()["sources"][0]["label"] == long    # JSON keeps the label as it is
