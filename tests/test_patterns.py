"""User patterns run on RE2: bounded time, Python's replacement templates, clear refusals.

Pure tests (no TensorFlow) for :mod:`ckptmerge.planning.patterns`, plus the commands that hung before:
``plan`` with a catastrophic ``regex`` rule and ``ls --regex``, run in a fresh interpreter with a
time limit so that a regression fails instead of hanging the suite.
"""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
from _cli_util import assert_one_line_error, run, run_subprocess, save_tf1, write_config
from conftest import run_child
from hypothesis import given, settings
from hypothesis import strategies as st

from ckptmerge.config import load_config
from ckptmerge.core.errors import ConfigError, RuleError
from ckptmerge.planning.patterns import PatternError, compile_pattern
from ckptmerge.planning.rules import RegexRule

#: 41 characters that make ``(a+)+$`` backtrack through 2**41 ways in Python's re.
LONG_NAME = "a" * 40 + "_b"


def test_catastrophic_pattern_is_matched_at_once():
    # In a child process with a time limit: with a backtracking engine this runs for minutes.
    found = run_child("""
        import json, sys
        from ckptmerge.planning.rules import RegexRule, Rules
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


# --------------------------------------------------------------------------------------------
# Where RE2 reads Python's syntax otherwise: never silently
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("pattern,found,fix", [
    ("a{,3}", "{,3}", "{0,3}"), ("enc/x{,}", "{,}", "{0,}"), ("{,3}", "{,3}", "{0,3}"),
])
def test_an_open_lower_bound_is_refused_with_the_fix(pattern, found, fix):
    with pytest.raises(PatternError) as e:
        compile_pattern(pattern)
    assert e.value.problem.startswith(f"'{pattern}': '{found}' means 0 ")
    assert f"but is literal text in RE2, which matches user patterns; write '{fix}' to repeat, or " \
           f"'\\{found}' for the text" in str(e.value)


@pytest.mark.parametrize("pattern,text", [
    ("a{0,3}", "aaa"), (r"a\{,3}", "a{,3}"), ("a[{,3}]", "a,"), (r"\Q{,3}\E", "{,3}"), ("a{ ,3}", "a{ ,3}"),
])
def test_repetitions_python_and_re2_read_alike_are_accepted(pattern, text):
    assert compile_pattern(pattern).fullmatch(text) is not None


def test_config_check_refuses_an_open_lower_bound_with_the_line(tmp_path):
    (tmp_path / "runs").mkdir()
    config = write_config(tmp_path / "warm.yaml", r"""
        sources:
          - path: runs
            regex: [['^layer_(\d{,2})/(.*)$', 'layers/\1/\2']]
        """)
    result = run("check", config)
    assert result.exit_code == 2
    assert ("warm.yaml:3 sources[0].regex[0]: '^layer_(\\d{,2})/(.*)$': '{,2}' means 0 to 2 repetitions "
            "in Python's re but is literal text in RE2") in result.stderr


def test_a_non_ascii_name_matched_otherwise_than_by_python_is_an_error_with_the_fix():
    p = compile_pattern(r"layer_(\d+)")
    assert p.fullmatch("layer_12").group(1) == "12"
    with pytest.raises(PatternError) as e:
        p.fullmatch("layer_\u0663")  # ARABIC-INDIC DIGIT THREE: a digit to Python's \d
    assert str(e.value) == ("invalid regex 'layer_(\\d+)': it matches the name 'layer_\u0663' differently "
                            "than Python's re would; '\\d' matches ASCII digits only in RE2 (any Unicode "
                            "digits in Python's re): write '[0-9]' for ASCII only, or '\\p{Nd}' for any")
    assert isinstance(e.value, RuleError)
    # Both fixes are unambiguous, and a hostile name is escaped in the message.
    assert compile_pattern(r"layer_([0-9]+)").fullmatch("layer_\u0663") is None
    assert compile_pattern(r"layer_(\p{Nd}+)").fullmatch("layer_\u0663").group(1) == "\u0663"
    with pytest.raises(PatternError, match=re.escape("'\\x1b[2J\u0663'")):
        compile_pattern(r".*(\d)").fullmatch("\x1b[2J\u0663")


def test_a_non_ascii_name_matched_alike_is_no_error():
    assert compile_pattern(r"layer_(\d+)").fullmatch("l\u00e4yer_12") is None
    assert compile_pattern(r"\d+").search("\u00e9nc_12")
    assert compile_pattern(r"[^\W\d]+/(\s*)").fullmatch("enc/").group(1) == ""


def test_word_boundaries_are_refused_for_names_with_non_ascii_letters():
    p = compile_pattern(r"\bkernel\b")
    assert p.search("enc/kernel") and p.search("enc\u202e/kernel")  # no non-ASCII letter: alike
    with pytest.raises(PatternError, match=r"may match the name '\\u00fc/kernel'|may match the name 'ü/kernel'"):
        p.search("\u00fc/kernel")
    with pytest.raises(PatternError, match=re.escape("match the separators instead, e.g. '(^|/)kernel($|/)'")):
        p.search("\u00fc/kernel")


def test_dollar_matches_only_at_the_very_end_of_a_name():
    # Python's '$' also matches before a final newline; a name ending in a newline does not end
    # in 'kernel' (documented in docs/config.md).
    assert re.search("kernel$", "enc/kernel\n") and not compile_pattern("kernel$").search("enc/kernel\n")
    assert compile_pattern("kernel$").search("enc/kernel")


NAME_PATTERNS = [r"\d+", r"(\w+)/(\d)", r"[\w/]+", r"(\S+)\s(\D*)", r"[^\W_]+", r"a\W", r"(\s*)\w$", r"\bb"]


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(NAME_PATTERNS),
       st.text(alphabet="ab1_/ \u0663\u00e9\u00a0\u2028\u00b2\u202e", max_size=6))
def test_a_name_is_matched_as_pythons_re_matches_it_or_refused(pattern, name):
    p = compile_pattern(pattern)
    try:
        found, full = p.search(name), p.fullmatch(name)
    except PatternError as e:
        assert not name.isascii() and "differently than Python's re would" in str(e)
        return
    m = re.fullmatch(pattern, name)
    assert found == (re.search(pattern, name) is not None)
    assert (full is None) == (m is None)
    if m is not None:
        assert [full.group(i) for i in range(m.re.groups + 1)] == [m.group(i) for i in range(m.re.groups + 1)]


def test_ls_regex_refuses_what_python_would_read_otherwise(tmp_path, tf):
    prefix = str(tmp_path / "model")
    names = ["layer_1/kernel", "layer_\u0663/kernel"]  # SaveV2 stores any key it is given
    tf.raw_ops.SaveV2(prefix=prefix, tensor_names=names, shape_and_slices=["", ""],
                      tensors=[tf.constant([1.0]), tf.constant([2.0])])
    assert_one_line_error(run("ls", prefix, "--regex", r"layer_\d/"),
                          "invalid regex 'layer_\\d/': it matches the name 'layer_\u0663/kernel' differently",
                          "write '[0-9]' for ASCII only, or '\\p{Nd}' for any")
    r = run("ls", prefix, "--regex", r"layer_[0-9]/", "--json")
    assert r.exit_code == 0 and [v["name"] for v in json.loads(r.stdout)] == ["layer_1/kernel"]
    r = run("ls", prefix, "--regex", r"layer_\p{Nd}/", "--json")
    assert r.exit_code == 0 and [v["name"] for v in json.loads(r.stdout)] == names
    assert_one_line_error(run("ls", prefix, "--regex", "1{,3}"), "invalid --regex '1{,3}': '{,3}' means 0 to 3",
                          "write '{0,3}' to repeat")
