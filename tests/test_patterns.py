"""User patterns run on RE2: bounded time, Python's replacement templates, clear refusals.

Pure tests (no TensorFlow) for :mod:`ckptmerge.patterns`, plus the commands that hung before:
``plan`` with a catastrophic ``regex`` rule and ``ls --regex``, run in a fresh interpreter with a
time limit so that a regression fails instead of hanging the suite.
"""

from __future__ import annotations

import re

import numpy as np
import pytest
from _cli_util import assert_one_line_error, run, run_subprocess, save_tf1, write_config
from conftest import run_child
from hypothesis import given, settings
from hypothesis import strategies as st

from ckptmerge.config import load_config
from ckptmerge.errors import ConfigError, RuleError
from ckptmerge.patterns import PatternError, compile_pattern
from ckptmerge.rules import RegexRule

#: 41 characters that make ``(a+)+$`` backtrack through 2**41 ways in Python's re.
LONG_NAME = "a" * 40 + "_b"


def test_catastrophic_pattern_is_matched_at_once():
    # In a child process with a time limit: with a backtracking engine this runs for minutes.
    found = run_child("""
        import json, sys
        from ckptmerge.rules import RegexRule, Rules
        rule = RegexRule("(a+)+$", "x")
        result = Rules.from_options(regex=[("(a+)+$", "x")]).apply([sys.argv[1]])
        print(json.dumps([rule.try_rename(sys.argv[1]), rule.try_rename("aaaa"), result.dropped]))
        """, LONG_NAME)
    assert found == [[False, None], [True, "x"], [LONG_NAME]]


@pytest.fixture(scope="module")
def long_named(tmp_path_factory, tf):
    """A checkpoint whose one variable has a name on which ``(a+)+$`` backtracks."""
    root = tmp_path_factory.mktemp("patterns")
    prefix = save_tf1(root / "src" / "model", {LONG_NAME: np.zeros(2, np.float32)})
    target = save_tf1(root / "tgt" / "model", {"x": np.zeros(2, np.float32)})
    write_config(root / "warm.yaml", f"""
        sources:
          - path: {prefix}
            regex: [["(a+)+$", "x"]]
        target: {target}
        """)
    return root, prefix


def test_plan_with_a_catastrophic_regex_finishes(long_named):
    root, _ = long_named
    result = run_subprocess(["plan", "warm.yaml"], root, timeout=120)
    assert result["code"] == 1, result["stderr"]  # the rule matches nothing: a finding
    assert "regex '(a+)+$' -> 'x'" in result["stdout"]


def test_ls_with_a_catastrophic_regex_finishes(long_named):
    root, prefix = long_named
    result = run_subprocess(["ls", prefix, "--regex", "(a+)+$", "--json"], root, timeout=120)
    assert result["code"] == 0, result["stderr"]
    assert result["stdout"].strip() == "[]"
    result = run_subprocess(["ls", prefix, "--regex", "^(a+)+_b$", "--json"], root, timeout=120)
    assert [v["name"] for v in __import__("json").loads(result["stdout"])] == [LONG_NAME]


# --------------------------------------------------------------------------------------------
# Refused constructs
# --------------------------------------------------------------------------------------------


UNSUPPORTED = [
    (r"(a)\1", "a backreference"),
    (r"(?P<x>a)(?P=x)", "a named backreference"),
    (r"enc/(?!tmp).*", "a lookahead"),
    (r"(?<=enc/)kernel", "a lookbehind"),
    (r"(?>a+)b", "an atomic group"),
    (r"a++", "a possessive quantifier"),
    (r"(a)?(?(1)b|c)", "a conditional group"),
    (r"a{1001}", "a repetition count above 1000"),
    (r"kernel\Z", r"'\Z' (write '\z' for the end of the name)"),
]
WHY = ("which ckptmerge does not support: user patterns are matched with RE2, in time linear in the "
       "name's length, so that no pattern can hang a plan; RE2 has no constructs that need "
       "backtracking; rewrite it without")


@pytest.mark.parametrize("pattern,what", UNSUPPORTED)
def test_unsupported_construct_is_a_rule_error_naming_it(pattern, what):
    with pytest.raises(PatternError) as e:
        RegexRule(pattern, None)
    assert isinstance(e.value, RuleError) and isinstance(e.value, ValueError)
    assert str(e.value) == f"invalid regex '{pattern}': it uses {what}, {WHY}"
    assert e.value.problem == f"'{pattern}' uses {what}, {WHY}"


def test_config_check_refuses_unsupported_constructs_with_the_line(tmp_path):
    (tmp_path / "runs").mkdir()
    config = write_config(tmp_path / "warm.yaml", r"""
        sources:
          - path: runs
            regex:
              - ['^head/(.*)$', 'new/\1']
              - ['(a)\1', 'x']
        """)
    with pytest.raises(ConfigError) as e:
        load_config(config)
    assert e.value.problems == [f"warm.yaml:5 sources[0].regex[1]: '(a)\\1' uses a backreference, {WHY}"]
    result = run("check", config)
    assert result.exit_code == 2
    assert "warm.yaml:5 sources[0].regex[1]: '(a)\\1' uses a backreference" in result.stderr


def test_ls_regex_with_a_lookahead_is_a_one_line_error(long_named):
    _, prefix = long_named
    assert_one_line_error(run("ls", prefix, "--regex", "a(?=b)"),
                          "invalid --regex 'a(?=b)': it uses a lookahead, which ckptmerge does not support")


def test_syntax_errors_keep_pythons_message():
    with pytest.raises(PatternError) as e:
        compile_pattern("^head/(.*")
    assert str(e.value) == "invalid regex '^head/(.*': missing ), unterminated subpattern at position 6"
    assert e.value.problem == "unbalanced parenthesis in '^head/(.*'"


@pytest.mark.parametrize("name", ["enc/kernel", "énc/kernel", "enc/ker\u202enel"])
def test_ascii_and_other_names_match_alike(name):
    p = compile_pattern(r"(?P<scope>[^/]+)/(ker)(.*)")
    m = p.fullmatch(name)
    assert [m.group(i) for i in range(4)] == list(re.fullmatch(p.pattern, name).group(0, 1, 2, 3))
    assert p.search(name) and compile_pattern("ker").search(name) and not compile_pattern("^ker").search(name)
    assert p.fullmatch(name + "/") is not None and compile_pattern("enc").fullmatch(name) is None


def test_re2_only_syntax_is_accepted():
    assert compile_pattern(r"\pL+/kernel\z").fullmatch("dense/kernel")
    assert compile_pattern(r"(?P<layer>\w+)/kernel").groupindex == {"layer": 1}


# --------------------------------------------------------------------------------------------
# Replacement templates: Python's rules, RE2's groups
# --------------------------------------------------------------------------------------------


TEMPLATES = [
    r"\1", r"\g<1>", r"\g<leaf>", r"new/\2/\1", r"\1\n\t\\", r"\101\0", r"\g<0>", r"[\g<0>|\1]",
    "lit\ue000eral/\\1", r"\g<2>-opt", r"",
]


@pytest.mark.parametrize("template", TEMPLATES)
@pytest.mark.parametrize("name", ["enc/kernel", "enc/x/kernel", "enc/"])
def test_templates_expand_as_pythons_re_does(template, name):
    pattern = r"(?P<scope>enc)/(?:(x)/)?(?P<leaf>.*)"
    expected = re.fullmatch(pattern, name).expand(template)
    p = compile_pattern(pattern)
    assert p.template(template).expand(p.fullmatch(name)) == expected


def test_template_errors_are_pythons():
    p = compile_pattern(r"^a/(.*)$")
    with pytest.raises(re.error, match="invalid group reference 2"):
        p.template(r"x/\2")
    with pytest.raises((re.error, IndexError), match="unknown group name 'b'"):
        p.template(r"\g<b>")
    with pytest.raises(re.error, match=r"bad escape \\q"):
        p.template(r"\q")


@settings(max_examples=200, deadline=None)
@given(st.lists(st.sampled_from(["a", "/", "\\1", "\\2", "\\g<0>", "\\g<n>", "\\\\", "\\n", "\ue000", "\ue001", "é"]),
                max_size=8),
       st.text(alphabet="ab/\ue000é", max_size=8))
def test_any_template_expands_as_pythons_re_does(parts, name):
    pattern = r"(a*)/?(?P<n>.*)"
    template = "".join(parts)
    p = compile_pattern(pattern)
    assert p.template(template).expand(p.fullmatch(name)) == re.fullmatch(pattern, name).expand(template)
