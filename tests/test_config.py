"""Warm-start config files: schema, round trips across formats, and every validation problem.

Pure tests: no TensorFlow, no checkpoint is opened (a checkpoint "exists" when its path or
``prefix.index`` exists, so empty files stand in for checkpoints).
"""

from __future__ import annotations

import inspect
import json
import os
import textwrap

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from ckptmerge.config import SOURCE_KEYS, TOP_LEVEL_KEYS, SourceConfig, load_config
from ckptmerge.core.errors import CkptMergeError, ConfigError
from ckptmerge.planning.transforms import Slice, VocabRemap


@pytest.fixture
def project(tmp_path):
    """A folder with two stand-in checkpoints and two vocabulary files."""
    (tmp_path / "runs" / "bert-base").mkdir(parents=True)
    (tmp_path / "runs" / "classifier").mkdir()
    (tmp_path / "runs" / "classifier" / "ckpt-12.index").write_bytes(b"")
    (tmp_path / "vocab_v1.txt").write_text("the\nnew york\nold\n", encoding="utf-8")
    (tmp_path / "vocab_v2.txt").write_text("new york\nthe\nfresh\n", encoding="utf-8")
    return tmp_path


def write(folder, name, text):
    path = folder / name
    path.write_text(textwrap.dedent(text).lstrip("\n"), encoding="utf-8")
    return str(path)


def problems(source, **kwargs):
    with pytest.raises(ConfigError) as e:
        load_config(source, **kwargs)
    return e.value.problems


def one_problem(source, **kwargs):
    found = problems(source, **kwargs)
    assert len(found) == 1, found
    return found[0]


WARM_YAML = r"""
sources:
  - name: encoder
    path: ${RUNS}/bert-base
    step: 200000
    map: {"bert/encoder/": "model/encoder/"}
    exclude: ["*/adam_*"]
  - name: head
    path: runs/classifier/ckpt-12
    regex: [["^head/(.*)$", "model/head/\\1"], ["^opt/.*", null]]
    include: "head/*"
    optimizer: true
    cast: true
    vocab:
      - name: model/embed/embeddings
        old_vocab: vocab_v1.txt
        new_vocab: vocab_v2.txt
        axis: 0
        init: zeros
    slice:
      - name: model/head/kernel
        axis: 1
allow_missing: ["model/head/new_bias"]
on_conflict: first
on_shape_mismatch: skip
cast: false
strict: false
target: runs/bert-base
output: out/merged
"""

WARM_TOML = r"""
allow_missing = ["model/head/new_bias"]
on_conflict = "first"
on_shape_mismatch = "skip"
cast = false
strict = false
target = "runs/bert-base"
output = "out/merged"

[[sources]]
name = "encoder"
path = "${RUNS}/bert-base"
step = 200000
exclude = ["*/adam_*"]

[sources.map]
"bert/encoder/" = "model/encoder/"

[[sources]]
name = "head"
path = "runs/classifier/ckpt-12"
regex = [["^head/(.*)$", "model/head/\\1"], ["^opt/.*", false]]
include = "head/*"
optimizer = true
cast = true

[[sources.vocab]]
name = "model/embed/embeddings"
old_vocab = "vocab_v1.txt"
new_vocab = "vocab_v2.txt"
axis = 0
init = "zeros"

[[sources.slice]]
name = "model/head/kernel"
axis = 1
"""

WARM_JSON = r"""
{
  "sources": [
    {"name": "encoder", "path": "${RUNS}/bert-base", "step": 200000,
     "map": {"bert/encoder/": "model/encoder/"}, "exclude": ["*/adam_*"]},
    {"name": "head", "path": "runs/classifier/ckpt-12",
     "regex": [["^head/(.*)$", "model/head/\\1"], ["^opt/.*", null]],
     "include": "head/*", "optimizer": true, "cast": true,
     "vocab": [{"name": "model/embed/embeddings", "old_vocab": "vocab_v1.txt",
                "new_vocab": "vocab_v2.txt", "axis": 0, "init": "zeros"}],
     "slice": [{"name": "model/head/kernel", "axis": 1}]}
  ],
  "allow_missing": ["model/head/new_bias"],
  "on_conflict": "first",
  "on_shape_mismatch": "skip",
  "cast": false,
  "strict": false,
  "target": "runs/bert-base",
  "output": "out/merged"
}
"""


def env_for(project):
    return {"RUNS": str(project / "runs")}


# --------------------------------------------------------------------------------------------
# Loading and round trips


def test_yaml_config_loads_every_option(project):
    cfg = load_config(write(project, "warm.yaml", WARM_YAML), env=env_for(project))
    enc, head = cfg.sources
    assert enc == SourceConfig(path=str(project / "runs" / "bert-base"), name="encoder", step=200000,
                               map={"bert/encoder/": "model/encoder/"}, exclude=["*/adam_*"])
    assert head.path == str(project / "runs" / "classifier" / "ckpt-12")
    assert head.regex == [("^head/(.*)$", "model/head/\\1"), ("^opt/.*", None)]
    assert head.include == ["head/*"] and head.optimizer is True and head.cast is True
    assert head.vocab == (VocabRemap("model/embed/embeddings", str(project / "vocab_v1.txt"),
                                     str(project / "vocab_v2.txt")),)
    assert head.slice == (Slice("model/head/kernel", 1, init="keep"),)
    assert cfg.plan_options == {"allow_missing": ["model/head/new_bias"], "on_conflict": "first",
                                "on_shape_mismatch": "skip", "skip_mismatch": False, "cast": False, "verify": True}
    assert cfg.strict is False
    assert cfg.target == str(project / "runs" / "bert-base")
    assert cfg.output == str(project / "out" / "merged")
    assert cfg.path == str(project / "warm.yaml")


def test_same_config_in_yaml_toml_and_json_loads_equal(project):
    env = env_for(project)
    from_yaml = load_config(write(project, "warm.yaml", WARM_YAML), env=env)
    from_toml = load_config(write(project, "warm.toml", WARM_TOML), env=env)
    from_json = load_config(write(project, "warm.json", WARM_JSON), env=env)
    assert from_yaml == from_toml == from_json
    assert (from_yaml.path, from_toml.path) == (str(project / "warm.yaml"), str(project / "warm.toml"))


def test_to_dict_round_trips(project):
    cfg = load_config(write(project, "warm.yaml", WARM_YAML), env=env_for(project))
    data = cfg.to_dict()
    assert load_config(data, env={}) == cfg
    assert load_config(json.loads(json.dumps(data)), env={}) == cfg
    assert load_config(yaml.safe_load(yaml.safe_dump(data)), env={}) == cfg


def test_to_dict_round_trips_through_toml_with_false_for_drop(project, tmp_path):
    import tomli_w

    cfg = load_config(write(project, "warm.yaml", WARM_YAML), env=env_for(project))
    data = cfg.to_dict()
    for s in data["sources"]:
        s["regex"] = [[p, False if r is None else r] for p, r in s.get("regex", [])] or s.pop("regex", None)
        if s.get("regex") is None:
            s.pop("regex", None)
    path = tmp_path / "again.toml"
    path.write_text(tomli_w.dumps(data), encoding="utf-8")
    assert load_config(str(path), env={}) == cfg


def test_to_dict_escapes_a_literal_dollar(tmp_path):
    folder = tmp_path / "a$b"
    folder.mkdir()
    cfg = load_config({"sources": [{"path": "a$$b"}]}, base_dir=tmp_path, env={})
    assert cfg.sources[0].path == str(folder)
    assert cfg.to_dict()["sources"][0]["path"] == str(folder).replace("$", "$$")
    assert load_config(cfg.to_dict(), env={}) == cfg


def test_minimal_config_defaults(project):
    cfg = load_config({"sources": [{"path": "runs/bert-base"}]}, base_dir=project)
    assert cfg.sources == [SourceConfig(path=str(project / "runs" / "bert-base"))]
    assert cfg.plan_options == {"allow_missing": [], "on_conflict": "error", "on_shape_mismatch": "error",
                                "skip_mismatch": False, "cast": False, "verify": True}
    assert (cfg.strict, cfg.target, cfg.output, cfg.path) == (True, None, None, None)
    assert cfg.to_dict() == {"sources": [{"path": str(project / "runs" / "bert-base")}], "allow_missing": [],
                             "on_conflict": "error", "on_shape_mismatch": "error", "cast": False,
                             "verify": True, "strict": True}


def test_source_cast_null_means_as_the_plan():
    assert load_config({"sources": [{"path": ".", "cast": None}]}).sources[0].cast is None


def test_source_kwargs_are_the_source_arguments(project):
    cfg = load_config(write(project, "warm.yaml", WARM_YAML), env=env_for(project))
    enc, head = cfg.source_kwargs()
    assert enc == {"path": str(project / "runs" / "bert-base"), "step": 200000,
                   "map": {"bert/encoder/": "model/encoder/"}, "regex": None, "include": None,
                   "exclude": ["*/adam_*"], "optimizer": False, "name": "encoder", "cast": None,
                   "transforms": [], "align": None, "layout": None, "item": None}
    assert head["regex"] == [("^head/(.*)$", "model/head/\\1"), ("^opt/.*", None)]
    assert head["cast"] is True
    assert head["transforms"] == [cfg.sources[1].vocab[0], cfg.sources[1].slice[0]]


def test_source_kwargs_build_a_source(project):
    from ckptmerge.sources.source import Source

    cfg = load_config(write(project, "warm.yaml", WARM_YAML), env=env_for(project))
    for kwargs, sc in zip(cfg.source_kwargs(), cfg.sources, strict=True):
        src = Source(**kwargs)
        assert (src.path, src.name, src.cast) == (sc.path, sc.name, sc.cast)
        assert list(src.transforms) == sc.transforms


def test_every_source_option_is_a_config_key_and_back():
    from ckptmerge.sources.source import Source

    params = {p for p in inspect.signature(Source.__init__).parameters if p != "self" and not p.startswith("_")}
    kwargs = set(SourceConfig(path="x").source_kwargs())
    assert kwargs == params
    ops = {"vocab", "slice", "reshape", "split", "transpose", "squeeze", "expand_dims", "concat"}
    assert set(SOURCE_KEYS) - ops | {"transforms"} == params


def test_every_plan_option_is_a_config_key_and_back():
    from ckptmerge.api import plan

    params = {p for p in inspect.signature(plan).parameters if p not in ("target", "sources")}
    cfg = load_config({"sources": [{"path": "."}]})
    assert set(cfg.plan_options) == params
    assert params <= set(TOP_LEVEL_KEYS)


def test_load_config_accepts_a_config():
    cfg = load_config({"sources": [{"path": "."}]})
    assert load_config(cfg) is cfg


def test_yml_extension_and_pathlike(project):
    path = project / "warm.yml"
    path.write_text("sources: [{path: runs/bert-base}]\n", encoding="utf-8")
    assert load_config(path).sources[0].path == str(project / "runs" / "bert-base")


def test_toml_false_and_yaml_false_drop_like_null(project):
    cfg = load_config({"sources": [{"path": "runs/bert-base", "regex": [["^opt/.*", False], ["^x$", None]]}]},
                      base_dir=project)
    assert cfg.sources[0].regex == [("^opt/.*", None), ("^x$", None)]


def test_include_exclude_and_allow_missing_accept_a_single_glob(project):
    cfg = load_config({"sources": [{"path": ".", "include": "a/*", "exclude": "*/Adam"}],
                       "allow_missing": "c/z"}, base_dir=project)
    assert (cfg.sources[0].include, cfg.sources[0].exclude) == (["a/*"], ["*/Adam"])
    assert cfg.plan_options["allow_missing"] == ["c/z"]


def test_vocab_given_as_token_lists(project):
    cfg = load_config({"sources": [{"path": ".", "vocab": [
        {"name": "e", "old_vocab": ["a", "b"], "new_vocab": ["b", "c"], "axis": 1, "init": "keep"}]}]},
        base_dir=project)
    assert cfg.sources[0].vocab == (VocabRemap("e", ("a", "b"), ("b", "c"), axis=1, init="keep"),)
    assert cfg.to_dict()["sources"][0]["vocab"] == [
        {"name": "e", "old_vocab": ["a", "b"], "new_vocab": ["b", "c"], "axis": 1, "init": "keep"}]


# --------------------------------------------------------------------------------------------
# Paths and environment variables


def test_relative_paths_are_relative_to_the_config_file(project, monkeypatch, tmp_path_factory):
    monkeypatch.chdir(tmp_path_factory.mktemp("elsewhere"))
    cfg = load_config(write(project, "warm.yaml", "sources: [{path: runs/bert-base}]\noutput: out\n"))
    assert cfg.sources[0].path == str(project / "runs" / "bert-base")
    assert cfg.output == str(project / "out")


def test_relative_paths_of_a_dict_are_relative_to_base_dir(project):
    cfg = load_config({"sources": [{"path": "runs/bert-base"}]}, base_dir=project)
    assert cfg.sources[0].path == str(project / "runs" / "bert-base")


def test_relative_paths_of_a_dict_default_to_the_current_directory(project, monkeypatch):
    monkeypatch.chdir(project / "runs")
    cfg = load_config({"sources": [{"path": "bert-base"}]})
    assert cfg.sources[0].path == str(project / "runs" / "bert-base")


def test_base_dir_overrides_the_config_files_folder(project, tmp_path_factory):
    other = tmp_path_factory.mktemp("cfgs")
    cfg = load_config(write(other, "warm.yaml", "sources: [{path: runs/bert-base}]\n"), base_dir=project)
    assert cfg.sources[0].path == str(project / "runs" / "bert-base")


def test_a_prefix_exists_when_its_index_file_exists(project):
    cfg = load_config({"sources": [{"path": "runs/classifier/ckpt-12"}]}, base_dir=project)
    assert cfg.sources[0].path == str(project / "runs" / "classifier" / "ckpt-12")


def test_env_vars_braced_and_bare_are_expanded(project):
    cfg = load_config({"sources": [{"path": "${ROOT}/runs/$NAME"}]},
                      env={"ROOT": str(project), "NAME": "bert-base"})
    assert cfg.sources[0].path == str(project / "runs" / "bert-base")


def test_env_defaults_to_os_environ(project, monkeypatch):
    monkeypatch.setenv("CKPTMERGE_TEST_RUNS", str(project / "runs"))
    cfg = load_config({"sources": [{"path": "$CKPTMERGE_TEST_RUNS/bert-base"}]})
    assert cfg.sources[0].path == str(project / "runs" / "bert-base")


def test_env_vars_are_expanded_in_vocab_files_target_and_output(project):
    env = {"P": str(project)}
    cfg = load_config({"sources": [{"path": "$P/runs/bert-base", "vocab": [
        {"name": "e", "old_vocab": "$P/vocab_v1.txt", "new_vocab": "${P}/vocab_v2.txt"}]}],
        "target": "$P/runs/classifier/ckpt-12", "output": "${P}/merged"}, env=env)
    assert cfg.sources[0].vocab[0].old_vocab == str(project / "vocab_v1.txt")
    assert cfg.target == str(project / "runs" / "classifier" / "ckpt-12")
    assert cfg.output == str(project / "merged")


def test_double_dollar_is_a_literal_dollar_and_lone_dollar_stays(tmp_path):
    (tmp_path / "$HOME").mkdir()
    (tmp_path / "a$-b").mkdir()
    cfg = load_config({"sources": [{"path": "$$HOME"}, {"path": "a$-b"}]}, base_dir=tmp_path, env={})
    assert [s.path for s in cfg.sources] == [str(tmp_path / "$HOME"), str(tmp_path / "a$-b")]


def test_env_vars_are_not_expanded_in_names_and_rules(project):
    cfg = load_config({"sources": [{"path": ".", "name": "$X", "regex": [["^a$", "b"]]}]},
                      base_dir=project, env={})
    assert cfg.sources[0].name == "$X" and cfg.sources[0].regex == [("^a$", "b")]


def test_remote_paths_are_neither_resolved_nor_checked(tmp_path):
    cfg = load_config({"sources": [{"path": "gs://bucket/runs/model-10"}]}, base_dir=tmp_path)
    assert cfg.sources[0].path == "gs://bucket/runs/model-10"


def test_output_need_not_exist(project):
    assert load_config({"sources": [{"path": "."}], "output": "new/dir/merged"},
                       base_dir=project).output == str(project / "new" / "dir" / "merged")


# --------------------------------------------------------------------------------------------
# Validation: each problem, its exact text and where it is


def test_regex_that_does_not_compile_names_file_line_and_keypath(project):
    path = write(project, "warm.yaml", r"""
        sources:
          - name: encoder
            path: runs/bert-base
          - name: head
            path: runs/classifier/ckpt-12
            regex:
              - ["^head/(.*", "model/head/\\1"]
        """)
    with pytest.raises(ConfigError) as e:
        load_config(path)
    assert e.value.problems == ["warm.yaml:7 sources[1].regex[0]: unbalanced parenthesis in '^head/(.*'"]
    assert str(e.value) == (f"1 problem in {path}:\n"
                            "  warm.yaml:7 sources[1].regex[0]: unbalanced parenthesis in '^head/(.*'")
    assert e.value.path == path


def test_config_error_is_a_value_error_and_a_ckptmerge_error():
    with pytest.raises(ValueError):
        load_config({})
    with pytest.raises(CkptMergeError):
        load_config({})


def test_regex_other_compile_errors_give_the_position():
    assert one_problem({"sources": [{"path": ".", "regex": [["*abc", "x"]]}]}) == (
        "sources[0].regex[0]: nothing to repeat at position 0 in '*abc'")


def test_regex_unbalanced_closing_parenthesis():
    assert one_problem({"sources": [{"path": ".", "regex": [["a)", "x"]]}]}) == (
        "sources[0].regex[0]: unbalanced parenthesis in 'a)'")


def test_backreference_to_a_missing_group():
    assert one_problem({"sources": [{"path": ".", "regex": [["^a/(.*)$", "x/\\2"]]}]}) == (
        "sources[0].regex[0]: replacement 'x/\\2' refers to group 2 but '^a/(.*)$' has 1 group")


def test_backreference_without_any_group_hints_at_parentheses():
    assert one_problem({"sources": [{"path": ".", "regex": [["^a/.*$", "x/\\1"]]}]}) == (
        "sources[0].regex[0]: replacement 'x/\\1' refers to group 1 but '^a/.*$' has 0 groups "
        "(add parentheses to capture)")


def test_backreference_to_an_unknown_group_name():
    assert one_problem({"sources": [{"path": ".", "regex": [["^(?P<rest>.*)$", "x/\\g<rets>"]]}]}) == (
        "sources[0].regex[0]: replacement 'x/\\g<rets>' refers to the unknown group 'rets'; "
        "'^(?P<rest>.*)$' has the named groups 'rest'. Did you mean 'rest'?")


def test_bad_escape_in_replacement():
    assert one_problem({"sources": [{"path": ".", "regex": [["^(a)$", "\\q"]]}]}) == (
        "sources[0].regex[0]: invalid replacement '\\q' for '^(a)$': bad escape \\q at position 0")


def test_regex_not_a_list_of_pairs():
    found = problems({"sources": [{"path": ".", "regex": ["^a", "b"]}, {"path": ".", "name": "2",
                                                                          "regex": "^a"}]})
    hint = "(regex is a list of pairs: [['^head/(.*)$', 'model/head/\\1']])"
    assert found == [
        f"sources[0].regex[0]: expected a [pattern, replacement] pair, received string '^a' {hint}",
        f"sources[0].regex[1]: expected a [pattern, replacement] pair, received string 'b' {hint}",
        "sources[1].regex: expected a list of [pattern, replacement] pairs, e.g. "
        "[['^head/(.*)$', 'model/head/\\1']], received string '^a'",
    ]


def test_regex_replacement_of_wrong_type():
    assert one_problem({"sources": [{"path": ".", "regex": [["^b$", 3]]}]}) == (
        "sources[0].regex[0]: expected the replacement to be a string, or null (false in TOML) to "
        "drop the matching names, received integer 3")


def test_regex_empty_replacement_points_to_null():
    assert one_problem({"sources": [{"path": ".", "regex": [["^b$", ""]]}]}) == (
        "sources[0].regex[0]: empty replacement for '^b$': to drop the matching names write null "
        "(false in TOML)")


def test_regex_pattern_of_wrong_type():
    assert one_problem({"sources": [{"path": ".", "regex": [[1, "x"]]}]}) == (
        "sources[0].regex[0]: expected the pattern to be a non-empty string, received integer 1")


def test_unknown_key_with_did_you_mean(project):
    path = write(project, "warm.yaml", """
        sources:
          - path: runs/bert-base
            exlude: ["*/adam_*"]
        on_conflit: first
        """)
    assert problems(path) == [
        "warm.yaml:3 sources[0]: unknown key 'exlude'. Did you mean 'exclude'?",
        "warm.yaml:4: unknown key 'on_conflit'. Did you mean 'on_conflict'?",
    ]


def test_unknown_key_without_a_close_match_lists_the_valid_keys():
    assert one_problem({"sources": [{"path": ".", "colour": "red"}]}) == (
        "sources[0]: unknown key 'colour'. Valid keys: name, path, step, item, map, regex, include, "
        "exclude, optimizer, cast, align, layout, vocab, slice, reshape, split, transpose, squeeze, expand_dims, "
        "concat")
    assert one_problem({"sources": [{"path": ".", "vocab": [{"name": "e", "old_vocab": ["a"],
                                                              "new_vocab": ["a"], "colour": 3}]}]}) == (
        "sources[0].vocab[0]: unknown key 'colour'. Valid keys: name, old_vocab, new_vocab, axis, init, "
        "old_vocab_size, new_vocab_size, num_oov_buckets")


def test_unknown_key_known_from_tf_names_the_ckptmerge_key():
    assert one_problem({"sources": [{"path": ".", "assignment_map": {"a/": "b/"}}]}) == (
        "sources[0]: unknown key 'assignment_map'. Use 'map' (ckptmerge's name for 'assignment_map')")


def test_top_level_key_inside_a_source_and_source_key_at_top_level():
    assert problems({"sources": [{"path": ".", "on_conflict": "first"}], "exclude": ["x"]}) == [
        "unknown key 'exclude'. It is an option of a source: put it inside an entry of 'sources'",
        "sources[0]: unknown key 'on_conflict'. It is a top-level option: move it out of 'sources'",
    ]


def test_misspelt_required_key_is_not_also_reported_missing():
    assert problems({"sources": [{"paht": "."}]}) == ["sources[0]: unknown key 'paht'. Did you mean 'path'?"]
    assert problems({"source": [{"path": "."}]}) == ["unknown key 'source'. Did you mean 'sources'?"]


def test_unknown_keys_in_vocab_and_slice_entries():
    assert problems({"sources": [{"path": ".", "vocab": [{"target": "e", "old_vocab": ["a"],
                                                            "new_vocab": ["a"]}],
                                  "slice": [{"name": "k", "axis": 0, "int": "keep"}]}]}) == [
        "sources[0].vocab[0]: unknown key 'target'. Use 'name' (ckptmerge's name for 'target')",
        "sources[0].slice[0]: unknown key 'int'. Did you mean 'init'?",
    ]


def test_wrong_types_say_expected_and_received():
    found = problems({"sources": [{"path": ".", "step": "200k", "optimizer": "yes", "include": 3,
                                   "exclude": ["ok", ""], "name": 7, "cast": 1,
                                   "map": ["a", "b"]}],
                      "strict": "true", "verify": None})
    assert found == [
        "sources[0].name: expected a source name (a non-empty string), received integer 7",
        "sources[0].step: expected a global step (an integer >= 0), or null for the latest, received string '200k'",
        "sources[0].map: expected a mapping {checkpoint_name: target_name}, e.g. "
        "{'bert/encoder/': 'model/encoder/'}, received list ['a', 'b']",
        "sources[0].include: expected a glob or a list of globs (e.g. ['encoder/*']), received integer 3",
        "sources[0].exclude[1]: expected a glob (a non-empty string), received string ''",
        "sources[0].optimizer: expected true or false, received string 'yes'",
        "sources[0].cast: expected true or false, received integer 1",
        "verify: expected true or false, received null",
        "strict: expected true or false, received string 'true'",
    ]


def test_negative_step_and_boolean_step():
    assert problems({"sources": [{"path": ".", "step": -1}, {"path": ".", "name": "b", "step": True}]}) == [
        "sources[0].step: expected a global step (an integer >= 0), or null for the latest, received integer -1",
        "sources[1].step: expected a global step (an integer >= 0), or null for the latest, received boolean true",
    ]


def test_map_values_must_be_names():
    assert one_problem({"sources": [{"path": ".", "map": {"a": None}}]}) == (
        "sources[0].map.a: expected a target name or scope (a string), or a non-empty list of "
        "them (one checkpoint name feeding several targets), received null")


def test_map_value_may_be_a_list_of_targets():
    cfg = load_config({"sources": [{"path": ".", "map": {"a": ["x", "y"]}}]})
    assert cfg.sources[0].map == {"a": ["x", "y"]}


def test_map_entry_mixing_a_scope_and_a_name():
    assert one_problem({"sources": [{"path": ".", "map": {"bert/encoder/": "model/encoder"}}]}) == (
        "sources[0].map['bert/encoder/']: map entry 'bert/encoder/' -> 'model/encoder' mixes a scope "
        "and a variable name: a scope entry needs both sides to end with '/' or '.' (and an exact entry "
        "neither). Write 'bert/encoder/' -> 'model/encoder/' to map a scope, or drop the '/' to map "
        "one variable")


def test_map_keys_equal_once_normalised():
    assert one_problem({"sources": [{"path": ".", "map": {"a": "x", "a:0": "x"}}]}) == (
        "sources[0].map['a:0']: 'a:0' is the same checkpoint name as 'a' once normalised; keep one entry")


def test_missing_required_keys():
    assert problems({"sources": [{"name": "a"}, {"path": ".", "vocab": [{"axis": 0}],
                                                 "slice": [{"name": "k"}]}]}) == [
        "sources[0]: missing required key 'path' (the checkpoint prefix or directory)",
        "sources[1].vocab[0]: missing required key 'name' (the target variable name or glob)",
        "sources[1].vocab[0]: missing required key 'old_vocab' (a vocabulary file, one token per "
        "line, or a list of tokens)",
        "sources[1].vocab[0]: missing required key 'new_vocab' (a vocabulary file, one token per "
        "line, or a list of tokens)",
        "sources[1].slice[0]: missing required key 'axis' (the one axis along which the shapes differ)",
    ]
    assert problems({}) == ["missing required key 'sources' (a list of sources, each with at least 'path'), or a "
                            "'combine' section"]


def test_sources_must_be_a_non_empty_list_of_mappings():
    assert problems({"sources": {"path": "."}}) == [
        "sources: expected a list of sources (each a mapping with at least 'path'), received mapping {'path': '.'}"]
    assert problems({"sources": []}) == ["sources: expected at least one source, received an empty list"]
    assert problems({"sources": ["runs/A"]}) == [
        "sources[0]: expected a source (a mapping with at least 'path'), received string 'runs/A'"]


def test_bad_enum_values_suggest():
    assert problems({"sources": [{"path": ".", "vocab": [{"name": "e", "old_vocab": ["a"],
                                                            "new_vocab": ["a"], "init": "zero"}],
                                  "slice": [{"name": "k", "axis": 0, "init": "kept"}]}],
                     "on_conflict": "frist", "on_shape_mismatch": "ignore"}) == [
        "sources[0].vocab[0].init: expected one of 'zeros', 'keep', 'ones', received string 'zero'. Did you mean 'zeros'?",
        "sources[0].slice[0].init: expected one of 'keep', 'zeros', received string 'kept'. Did you mean 'keep'?",
        "on_conflict: expected one of 'error', 'first', 'last', received string 'frist'. Did you mean 'first'?",
        "on_shape_mismatch: expected one of 'error', 'skip', received string 'ignore'",
    ]


def test_vocab_and_slice_axis_must_be_non_negative_integers():
    assert problems({"sources": [{"path": ".", "vocab": [{"name": "e", "old_vocab": ["a"],
                                                            "new_vocab": ["a"], "axis": -1}],
                                  "slice": [{"name": "k", "axis": "1"}]}]}) == [
        "sources[0].vocab[0].axis: expected an axis (an integer >= 0; 0: rows, 1: columns), received integer -1",
        "sources[0].slice[0].axis: expected an axis (an integer >= 0), received string '1'",
    ]


def test_vocab_and_slice_must_be_lists():
    assert problems({"sources": [{"path": ".", "slice": {"name": "k", "axis": 1}, "vocab": "v.txt"}]}) == [
        "sources[0].vocab: expected a list of mappings, e.g. [{name: model/embed/embeddings, "
        "old_vocab: v1.txt, new_vocab: v2.txt}], received string 'v.txt'",
        "sources[0].slice: expected a list of mappings, e.g. [{name: model/head/kernel, axis: 1}], "
        "received mapping {'name': 'k', 'axis': 1} (write it as a list: slice: [{...}])",
    ]


def test_vocab_token_lists_must_be_unique_strings():
    assert problems({"sources": [{"path": ".", "vocab": [{"name": "e", "old_vocab": ["a", "b", "a"],
                                                            "new_vocab": ["a", 1]}]}]}) == [
        "sources[0].vocab[0].old_vocab: duplicate token 'a' at positions 0 and 2; every token must be unique",
        "sources[0].vocab[0].new_vocab: expected a vocabulary file or a non-empty list of token "
        "strings, received list ['a', 1]",
    ]


def test_vocab_file_with_duplicate_tokens(project):
    (project / "dup.txt").write_text("a\nb\na\n", encoding="utf-8")
    path = write(project, "warm.yaml", """
        sources:
          - path: runs/bert-base
            vocab:
              - name: e
                old_vocab: dup.txt
                new_vocab: vocab_v2.txt
        """)
    assert problems(path) == [
        f"warm.yaml:5 sources[0].vocab[0].old_vocab: vocab file '{project / 'dup.txt'}' has the "
        "duplicate token 'a' on lines 1 and 3; every token must be unique"]


def test_missing_vocab_files(project):
    found = problems({"sources": [{"path": ".", "vocab": [{"name": "e", "old_vocab": "nope.txt",
                                                            "new_vocab": str(project / "gone.txt")}]}]},
                     base_dir=project)
    assert found == [
        f"sources[0].vocab[0].old_vocab: vocab file 'nope.txt' not found: '{project / 'nope.txt'}' "
        "does not exist (relative to base_dir)",
        f"sources[0].vocab[0].new_vocab: vocab file '{project / 'gone.txt'}' does not exist",
    ]


def test_vocab_file_that_is_a_directory(project):
    assert one_problem({"sources": [{"path": ".", "vocab": [{"name": "e", "old_vocab": "runs",
                                                              "new_vocab": ["a"]}]}]}, base_dir=project) == (
        "sources[0].vocab[0].old_vocab: vocab file 'runs' is a directory; expected a text file with "
        "one token per line")


def test_missing_checkpoint_relative_to_the_config_file(project):
    path = write(project, "warm.yaml", "sources:\n  - path: runs/missing\n")
    missing = project / "runs" / "missing"
    assert problems(path) == [
        f"warm.yaml:2 sources[0].path: checkpoint 'runs/missing' not found: neither '{missing}' nor "
        f"'{missing}.index' exists (relative to the config file's folder)"]


def test_missing_checkpoint_absolute_path(tmp_path):
    missing = tmp_path / "nope"
    assert one_problem({"sources": [{"path": str(missing)}]}) == (
        f"sources[0].path: checkpoint '{missing}' not found: neither it nor '{missing}.index' exists")


def test_missing_checkpoint_relative_to_the_current_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert one_problem({"sources": [{"path": "nope"}]}) == (
        f"sources[0].path: checkpoint 'nope' not found: neither '{tmp_path / 'nope'}' nor "
        f"'{tmp_path / 'nope'}.index' exists (relative to the current directory)")


def test_missing_target_checkpoint(project):
    assert one_problem({"sources": [{"path": "."}], "target": "runs/none"}, base_dir=project) == (
        f"target: checkpoint 'runs/none' not found: neither '{project / 'runs' / 'none'}' nor "
        f"'{project / 'runs' / 'none'}.index' exists (relative to base_dir)")


def test_paths_of_wrong_type():
    assert problems({"sources": [{"path": 3}], "output": ""}) == [
        "sources[0].path: expected a path (a non-empty string), received integer 3",
        "output: expected a path (a non-empty string), received string ''",
    ]


def test_unset_environment_variable(project):
    path = write(project, "warm.yaml", """
        sources:
          - name: encoder
            path: ${RUNS}/bert-base
        """)
    assert problems(path, env={}) == [
        "warm.yaml:3 sources[0].path: environment variable 'RUNS' is not set (used in '${RUNS}/bert-base')"]


def test_several_unset_environment_variables_in_one_value():
    assert one_problem({"sources": [{"path": "$A/${B}/$A"}]}, env={}) == (
        "sources[0].path: environment variables 'A' and 'B' are not set (used in '$A/${B}/$A')")


def test_unset_environment_variable_in_vocab_and_output(project):
    assert problems({"sources": [{"path": ".", "vocab": [{"name": "e", "old_vocab": "$V/a.txt",
                                                            "new_vocab": ["a"]}]}],
                     "output": "${OUT}/m"}, base_dir=project, env={}) == [
        "sources[0].vocab[0].old_vocab: environment variable 'V' is not set (used in '$V/a.txt')",
        "output: environment variable 'OUT' is not set (used in '${OUT}/m')",
    ]


def test_malformed_variable_references():
    assert problems({"sources": [{"path": "${RUNS/x"}, {"path": "${1x}", "name": "b"}]}, env={}) == [
        "sources[0].path: unterminated '${' in '${RUNS/x' (write '$$' for a literal '$')",
        "sources[1].path: invalid environment variable name '1x' in '${1x}' (write '$$' for a literal '$')",
    ]


def test_duplicate_source_names(project):
    path = write(project, "warm.yaml", """
        sources:
          - name: encoder
            path: runs/bert-base
          - name: encoder
            path: runs/classifier/ckpt-12
        """)
    assert problems(path) == [
        "warm.yaml:4 sources[1].name: duplicate source name 'encoder' (also sources[0]); give each "
        "source a distinct name"]


def test_unnamed_sources_reading_the_same_checkpoint(project):
    assert one_problem({"sources": [{"path": "runs/bert-base"}, {"path": "runs/../runs/bert-base"}]},
                       base_dir=project) == (
        "sources[1]: reads the same checkpoint as sources[0] and neither has a 'name'; give each a "
        "distinct name")


def test_same_checkpoint_twice_with_names_is_fine(project):
    cfg = load_config({"sources": [{"path": ".", "name": "a"}, {"path": ".", "name": "b"}]}, base_dir=project)
    assert [s.name for s in cfg.sources] == ["a", "b"]


def test_top_level_must_be_a_mapping(project):
    assert problems(write(project, "warm.yaml", "- path: runs/bert-base\n")) == [
        "warm.yaml:1: expected a mapping of options (sources, allow_missing, ...) at the top level, "
        "received list [{'path': 'runs/bert-base'}]"]


def test_empty_file(project):
    assert problems(write(project, "warm.yaml", "# nothing yet\n")) == [
        "warm.yaml: the config is empty; expected a mapping with at least 'sources', e.g. "
        "sources: [{path: runs/A}]"]


# --------------------------------------------------------------------------------------------
# Syntax errors, duplicate keys, files


def test_yaml_syntax_error_gives_line_and_column(project):
    path = write(project, "warm.yaml", """
        sources:
          - path: runs/bert-base
           name: encoder
        """)
    with pytest.raises(ConfigError) as e:
        load_config(path)
    assert e.value.problems == [
        "warm.yaml:3:4: invalid YAML: expected <block end>, but found '<block mapping start>' "
        "(while parsing a block collection at line 2)"]
    assert str(e.value).startswith(f"1 problem in {path}:\n  warm.yaml:3:4: invalid YAML")


def test_toml_syntax_error_gives_line_and_column(project):
    path = write(project, "warm.toml", """
        [[sources]]
        path = "runs/bert-base
        """)
    assert problems(path) == ["warm.toml:2:23: invalid TOML: Illegal character '\\n'"]


def test_json_syntax_error_gives_line_and_column(project):
    path = write(project, "warm.json", """
        {"sources": [
          {"path": "runs/bert-base",}
        ]}
        """)
    assert problems(path) == ["warm.json:2:29: invalid JSON: Expecting property name enclosed in double quotes"]


def test_duplicate_keys_in_yaml_and_json(project):
    yaml_path = write(project, "warm.yaml", """
        sources:
          - path: runs/bert-base
            path: runs/classifier/ckpt-12
        """)
    json_path = write(project, "warm.json", """
        {"sources": [{"path": "runs/bert-base"}],
         "cast": true,
         "cast": false}
        """)
    assert problems(yaml_path) == ["warm.yaml:3 sources[0]: duplicate key 'path' (first at line 2); keep one"]
    assert problems(json_path) == ["warm.json:3: duplicate key 'cast' (first at line 2); keep one"]


def test_duplicate_keys_in_toml_are_a_syntax_error(project):
    path = write(project, "warm.toml", """
        cast = true
        cast = false
        """)
    assert problems(path) == ["warm.toml:2:13: invalid TOML: Cannot overwrite a value"]


def test_missing_config_file(tmp_path):
    path = str(tmp_path / "warm.yaml")
    assert problems(path) == [f"warm.yaml: config file not found: '{path}'"]


def test_unsupported_extension(tmp_path):
    path = tmp_path / "warm.ini"
    path.write_text("x")
    assert problems(str(path)) == ["warm.ini: unsupported config file extension '.ini'; expected "
                                   ".yaml, .yml, .toml or .json"]


def test_config_file_not_utf8(tmp_path):
    path = tmp_path / "warm.yaml"
    path.write_bytes(b"sources:\n  - path: \xff\n")
    assert problems(str(path)) == ["warm.yaml:2: the file is not valid UTF-8"]


def test_load_config_rejects_other_types():
    with pytest.raises(ConfigError, match=r"load_config expects a path to a .yaml, .yml, .toml or "
                                          r".json file, or a dict; received list \['a'\]"):
        load_config(["a"])


# --------------------------------------------------------------------------------------------
# Many problems at once, with lines in every format


BAD_YAML = r"""
sources:
  - name: encoder
    path: ${NOPE}/bert-base
    step: 200k
    exlude: ["*/adam_*"]
  - name: encoder
    path: runs/classifier/ckpt-12
    regex: [["^head/(.*", "model/head/\\1"]]
    vocab:
      - name: model/embed/embeddings
        old_vocab: vocab_v1.txt
        new_vocab: vocab_v2.txt
        init: zero
on_conflict: frist
cast: "no"
"""

BAD_TOML = r"""
on_conflict = "frist"
cast = "no"

[[sources]]
name = "encoder"
path = "${NOPE}/bert-base"
step = "200k"
exlude = ["*/adam_*"]

[[sources]]
name = "encoder"
path = "runs/classifier/ckpt-12"
regex = [["^head/(.*", "model/head/\\1"]]

[[sources.vocab]]
name = "model/embed/embeddings"
old_vocab = "vocab_v1.txt"
new_vocab = "vocab_v2.txt"
init = "zero"
"""

BAD_JSON = r"""
{
  "sources": [
    {"name": "encoder",
     "path": "${NOPE}/bert-base",
     "step": "200k",
     "exlude": ["*/adam_*"]},
    {"name": "encoder",
     "path": "runs/classifier/ckpt-12",
     "regex": [["^head/(.*", "model/head/\\1"]],
     "vocab": [{"name": "model/embed/embeddings", "old_vocab": "vocab_v1.txt",
                "new_vocab": "vocab_v2.txt",
                "init": "zero"}]}
  ],
  "on_conflict": "frist",
  "cast": "no"
}
"""

MESSAGES = [
    "sources[0].path: environment variable 'NOPE' is not set (used in '${NOPE}/bert-base')",
    "sources[0].step: expected a global step (an integer >= 0), or null for the latest, received string '200k'",
    "sources[0]: unknown key 'exlude'. Did you mean 'exclude'?",
    "sources[1].name: duplicate source name 'encoder' (also sources[0]); give each source a distinct name",
    "sources[1].regex[0]: unbalanced parenthesis in '^head/(.*'",
    "sources[1].vocab[0].init: expected one of 'zeros', 'keep', 'ones', received string 'zero'. Did you mean 'zeros'?",
    "on_conflict: expected one of 'error', 'first', 'last', received string 'frist'. Did you mean 'first'?",
    "cast: expected true or false, received string 'no'",
]


@pytest.mark.parametrize("name,text,lines", [
    ("bad.yaml", BAD_YAML, [3, 4, 5, 6, 8, 13, 14, 15]),
    ("bad.json", BAD_JSON, [4, 5, 6, 7, 9, 12, 14, 15]),
    ("bad.toml", BAD_TOML, [6, 7, 8, 11, 13, 19, 1, 2]),
], ids=["yaml", "json", "toml"])
def test_many_problems_in_one_file_are_reported_together(project, name, text, lines):
    path = write(project, name, text)
    with pytest.raises(ConfigError) as e:
        load_config(path, env={})
    expected = [f"{name}:{line} {msg}" for line, msg in zip(lines, MESSAGES, strict=True)]
    assert e.value.problems == sorted(expected, key=lambda p: int(p.split(":")[1].split()[0]))
    assert str(e.value).startswith(f"8 problems in {path}:\n  {e.value.problems[0]}\n")
    assert e.value.path == path


def test_dict_problems_have_no_file_prefix():
    with pytest.raises(ConfigError) as e:
        load_config({"sources": [{"path": ".", "step": "x"}], "cast": 1})
    assert str(e.value) == (
        "2 problems in the config:\n"
        "  sources[0].step: expected a global step (an integer >= 0), or null for the latest, received string 'x'\n"
        "  cast: expected true or false, received integer 1")
    assert e.value.path is None


def test_toml_lines_follow_tables_and_inline_values(project):
    path = write(project, "warm.toml", r"""
        [[sources]]
        path = "runs/bert-base"

        [[sources]]
        name = "b"
        path = "runs/bert-base"
        map = {"a/" = "b"}

        [sources.vocab_]
        x = 1

        [[sources.slice]]
        name = "k"
        axis = "1"
        """)
    assert problems(path) == [
        "warm.toml:7 sources[1].map['a/']: map entry 'a/' -> 'b' mixes a scope and a variable name: "
        "a scope entry needs both sides to end with '/' or '.' (and an exact entry neither). Write 'a/' -> "
        "'b/' to map a scope, or drop the '/' to map one variable",
        "warm.toml:9 sources[1]: unknown key 'vocab_'. Did you mean 'vocab'?",
        "warm.toml:14 sources[1].slice[0].axis: expected an axis (an integer >= 0), received string '1'",
    ]


# --------------------------------------------------------------------------------------------
# docs/config.md: its examples load, so the reference page cannot drift from the code

DOCS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "docs", "config.md")


def doc_blocks():
    """(marker or None, language, text) of every fenced block of docs/config.md."""
    import re

    text = open(DOCS, encoding="utf-8").read()
    pattern = re.compile(r"(?:<!-- tested: (\S+) -->\n)?```(\w+)\n(.*?)```", re.S)
    return [(m.group(1), m.group(2), m.group(3)) for m in pattern.finditer(text)]


@pytest.fixture
def doc_project(project):
    (project / "runs" / "A").mkdir()
    return project


def test_docs_full_example_loads(doc_project):
    [(_, lang, text)] = [b for b in doc_blocks() if b[0] == "full-example"]
    cfg = load_config(write(doc_project, f"warm.{lang}", text), env=env_for(doc_project))
    assert [s.name for s in cfg.sources] == ["encoder", "head"]
    assert [type(t).__name__ for t in cfg.sources[1].transforms] == ["VocabRemap", "Slice"]


def test_docs_same_config_in_three_formats_loads_equal(doc_project):
    blocks = [b for b in doc_blocks() if b[0] == "same-config"]
    assert [lang for _, lang, _ in blocks] == ["yaml", "toml", "json"]
    configs = [load_config(write(doc_project, f"same.{lang}", text)) for _, lang, text in blocks]
    assert configs[0] == configs[1] == configs[2]


def test_docs_yaml_fragments_load(doc_project):
    fragments = [text for marker, lang, text in doc_blocks() if lang == "yaml" and marker is None]
    assert len(fragments) >= 4
    for text in fragments:
        data = yaml.safe_load(text)
        if set(data) <= {"vocab", "slice", "reshape", "split", "transpose", "squeeze", "expand_dims", "concat"}:
            data = {"sources": [{"path": ".", **data}]}
        data.setdefault("sources", [{"path": "."}])
        load_config(data, base_dir=doc_project, env={"OUT": str(doc_project), **env_for(doc_project)})


# --------------------------------------------------------------------------------------------
# Property: any valid config survives to_dict -> JSON -> load_config


_names = st.text("abcxyz_/0", min_size=1, max_size=8).map(lambda s: "v" + s.rstrip("/"))
_globs = st.lists(st.text("ab*?/", min_size=1, max_size=5), max_size=3)
_source = st.fixed_dictionaries({"path": st.just(".")}, optional={
    "step": st.integers(0, 10**9),
    "map": st.dictionaries(_names, _names, max_size=3),
    "regex": st.lists(st.tuples(_names.map(lambda n: "^" + n + "/(.*)$"),
                                st.one_of(st.none(), _names.map(lambda n: n + "/\\1"))).map(list), max_size=3),
    "include": _globs, "exclude": _globs, "optimizer": st.booleans(), "cast": st.booleans(),
    "slice": st.lists(st.fixed_dictionaries({"name": _names, "axis": st.integers(0, 3),
                                             "init": st.sampled_from(["keep", "zeros"])}), max_size=2),
})
_config = st.fixed_dictionaries({"sources": st.lists(_source, min_size=1, max_size=3)}, optional={
    "allow_missing": _globs, "on_conflict": st.sampled_from(["error", "first", "last"]),
    "on_shape_mismatch": st.sampled_from(["error", "skip"]), "cast": st.booleans(),
    "verify": st.booleans(), "strict": st.booleans(), "output": _names,
})


@settings(max_examples=60, deadline=None)
@given(_config)
def test_to_dict_round_trips_any_valid_config(tmp_path_factory, data):
    for i, s in enumerate(data["sources"]):
        s["name"] = f"s{i}"
    base = str(tmp_path_factory.getbasetemp())
    cfg = load_config(data, base_dir=base, env={})
    assert load_config(json.loads(json.dumps(cfg.to_dict())), env={}) == cfg


def test_align_key_is_a_source_option(project):
    cfg = load_config({"sources": [{"path": str(project / "runs" / "bert-base"), "align": "structure"}]})
    assert cfg.source_kwargs()[0]["align"] == "structure"
    with pytest.raises(ConfigError, match=r"sources\[0\].align: expected one of 'structure', received string 'structur'. Did you mean 'structure'\?"):
        load_config({"sources": [{"path": str(project / "runs" / "bert-base"), "align": "structur"}]})


def test_vocab_info_sizes_and_oov_buckets_are_config_keys():
    cfg = load_config({"sources": [{"path": ".", "vocab": [{
        "name": "e", "old_vocab": ["a", "b", "c"], "new_vocab": ["c", "a", "x"], "old_vocab_size": 2,
        "new_vocab_size": 2, "num_oov_buckets": 1, "init": "ones"}]}]})
    (remap,) = cfg.sources[0].vocab
    assert (remap.old_tokens, remap.new_tokens, remap.num_oov_buckets, remap.init) == (
        ("a", "b"), ("c", "a"), 1, "ones")
    assert load_config(cfg.to_dict()).sources[0].vocab == cfg.sources[0].vocab


def test_vocab_info_names_are_suggested_as_ckptmerge_keys():
    problem = one_problem({"sources": [{"path": ".", "vocab": [{
        "name": "e", "old_vocab": ["a"], "new_vocab": ["a"], "backup_initializer": "zeros"}]}]})
    assert "unknown key 'backup_initializer'" in problem and "'init'" in problem


def test_layout_key_reaches_the_source_and_bad_values_are_config_errors():
    cfg = load_config({"sources": [{"path": ".", "layout": "torch"}]})
    assert cfg.sources[0].layout == "torch" and cfg.make_sources()[0].layout == "torch"
    with pytest.raises(ConfigError, match="layout"):
        load_config({"sources": [{"path": ".", "layout": "pytorch"}]})
