"""The inspection commands: ``ckptmerge ls``, ``show``, ``diff``, ``checkpoints``, plus help,
version, error handling (one line, exit 2, no traceback) and "no TensorFlow import".

Checkpoints are written by TensorFlow in a temporary folder (once per module) and taken from the
shared corpus of real-world checkpoints.
"""

from __future__ import annotations

import datetime
import json
import re
import shlex
import shutil
from pathlib import Path

import numpy as np
import pytest
from _cli_util import (
    assert_one_line_error,
    run,
    run_subprocess,
    save_module,
    save_tf1,
)
from _corpus import corpus, corpus_folders

from ckptmerge import __version__
from ckptmerge.cli import cli
from ckptmerge.sources.resolve import checkpoints as list_checkpoints

B_A1 = np.arange(12, dtype=np.float32).reshape(3, 4) / 4


@pytest.fixture(scope="module")
def ck(tmp_path_factory):
    """A: directory, steps 5 and 10 (10 with Adam slots); B, C: plain prefixes that differ;
    D: object-based tf.Module with one variable of each interesting dtype; K: Keras 3 model
    saved with tf.train.Checkpoint(model=..., optimizer=...)."""
    root = tmp_path_factory.mktemp("cli")
    (root / "A").mkdir()
    save_tf1(root / "A" / "model", {"a1": np.zeros((3, 4), np.float32), "a2": np.zeros(4, np.float32),
                                    "old_only": np.zeros(2, np.float32)}, step=5)
    save_tf1(root / "A" / "model", {"a1": B_A1, "a2": np.ones(4, np.float32),
                                    "enc/dense/kernel": np.full((2, 3), 0.5, np.float32),
                                    "enc/dense/bias": np.zeros(3, np.float32), "step_count": np.int64(7)},
             step=10, optimizer_slots=True)
    b_values = {"a1": B_A1, "a2": np.ones(4, np.float32), "enc/dense/kernel": np.full((2, 3), 0.5, np.float32),
                "enc/dense/bias": np.zeros(3, np.float32), "step_count": np.int64(7)}
    b = save_tf1(root / "B" / "model", b_values)
    c_a1 = B_A1.copy()
    c_a1[1, 2] += 0.25
    c = save_tf1(root / "C" / "model", {"a1": c_a1, "a2": np.ones(5, np.float32),
                                        "enc/dense/kernel": np.full((2, 3), 0.5, np.float32),
                                        "b_only": np.zeros((2, 2), np.float64), "step_count": np.int64(7)})
    b_copy = save_tf1(root / "Bcopy" / "model", b_values)

    import tensorflow as tf

    d = save_module(root / "D" / "ckpt", {
        "c64": np.array([1 + 2j, 3 - 4j], np.complex64), "text": tf.constant([b"hello", b"\xff\xfe"]),
        "bad": np.array([1, np.nan, np.inf, -np.inf], np.float32), "flag": np.array([True, False]),
        "bf": tf.constant([1.5, -2.0], tf.bfloat16), "big": np.arange(10000, dtype=np.float32).reshape(100, 100),
        "count": np.int64(42)})

    import keras

    inp = keras.Input((4,))
    out = keras.layers.Dense(2, name="head")(keras.layers.Dense(3, name="enc1")(inp))
    model = keras.Model(inp, out, name="net")
    # Named explicitly: an unnamed Adam is 'adam_1', 'adam_2', ... after other Keras tests in
    # the same process (Keras numbers default names globally).
    opt = keras.optimizers.Adam(0.01, name="adam")
    model.compile(optimizer=opt, loss="mse")
    model.fit(np.ones((4, 4), np.float32), np.ones((4, 2), np.float32), verbose=0, epochs=1)
    k = tf.train.Checkpoint(model=model, optimizer=opt).write(str(root / "K" / "ckpt"))
    return {"root": root, "A": str(root / "A"), "B": b, "C": c, "Bcopy": b_copy, "D": d, "K": k}


# --------------------------------------------------------------------------------------------
# ls
# --------------------------------------------------------------------------------------------


def test_ls_prints_name_dtype_shape_size_and_totals(ck):
    r = run("ls", ck["A"])
    assert r.exit_code == 0, r.output
    assert r.stdout == (
        f"Checkpoint: {ck['A']}/model-10 (latest checkpoint per {ck['A']}/checkpoint (step 10))\n"
        "NAME              DTYPE    SHAPE   SIZE\n"
        "a1                float32  (3, 4)  48 B\n"
        "a2                float32  (4,)    16 B\n"
        "enc/dense/bias    float32  (3,)    12 B\n"
        "enc/dense/kernel  float32  (2, 3)  24 B\n"
        "step_count        int64    ()       8 B\n"
        "5 variables, 108 B; 11 optimizer/bookkeeping hidden (--all shows them)\n")


def test_ls_all_shows_optimizer_state_and_bookkeeping_with_kind_and_key(ck):
    r = run("ls", ck["A"], "--all")
    assert r.exit_code == 0, r.output
    lines = r.stdout.splitlines()
    assert lines[1].split() == ["NAME", "KIND", "DTYPE", "SHAPE", "SIZE", "KEY"]
    assert "a1/Adam                  optimizer    float32  (3, 4)  48 B  a1/Adam" in lines
    assert "global_step              bookkeeping  int64    ()       8 B  global_step" in lines
    assert "beta1_power              optimizer    float32  ()       4 B  beta1_power" in lines
    assert lines[-1] == "16 tensors, 324 B"


def test_ls_object_based_keras_checkpoint_names_variables_by_path_and_keeps_raw_keys(ck):
    r = run("ls", ck["K"], "--json")
    assert r.exit_code == 0, r.output
    rows = json.loads(r.stdout)
    assert [v["name"] for v in rows] == ["enc1/bias", "enc1/kernel", "head/bias", "head/kernel"]
    # Keras 3 keeps the model's weights under optimizer/_trainable_variables: still "variable".
    assert all(v["kind"] == "variable" for v in rows)
    assert all(v["key"].endswith("/.ATTRIBUTES/VARIABLE_VALUE") for v in rows)
    everything = json.loads(run("ls", ck["K"], "--all", "--json").stdout)
    kinds = {v["name"]: v["kind"] for v in everything}
    assert kinds["adam/iteration"] == "optimizer"
    assert kinds["_CHECKPOINTABLE_OBJECT_GRAPH"] == "bookkeeping"


def test_ls_json_gives_one_object_per_tensor_with_documented_keys(ck):
    r = run("ls", ck["B"], "--json")
    assert r.exit_code == 0, r.output
    rows = json.loads(r.stdout)
    assert rows[0] == {"name": "a1", "key": "a1", "dtype": "float32", "shape": [3, 4], "kind": "variable",
                       "nbytes": 48}
    assert [v["name"] for v in rows] == ["a1", "a2", "enc/dense/bias", "enc/dense/kernel", "step_count"]


def test_ls_match_keeps_names_matching_any_glob(ck):
    r = run("ls", ck["A"], "--match", "enc/*", "--match", "a2")
    assert r.exit_code == 0, r.output
    names = [line.split()[0] for line in r.stdout.splitlines()[2:-1]]
    assert names == ["a2", "enc/dense/bias", "enc/dense/kernel"]
    assert r.stdout.splitlines()[-1] == ("3 of 5 variables match, 52 B; "
                                         "4 hidden optimizer/bookkeeping tensors match too (--all shows them)")


def test_ls_regex_searches_names(ck):
    r = run("ls", ck["A"], "--regex", r"kernel$", "--json")
    assert r.exit_code == 0, r.output
    assert [v["name"] for v in json.loads(r.stdout)] == ["enc/dense/kernel"]


def test_ls_bad_regex_is_a_one_line_error(ck):
    assert_one_line_error(run("ls", ck["A"], "--regex", "enc/(dense"), "invalid --regex 'enc/(dense'",
                          "missing ), unterminated subpattern")


def test_ls_tree_groups_by_scope_with_sizes(ck):
    r = run("ls", ck["A"], "--tree")
    assert r.exit_code == 0, r.output
    assert r.stdout.splitlines()[1:] == [
        "a1          float32  (3, 4)  48 B",
        "a2          float32  (4,)    16 B",
        "enc/                         36 B  (2 variables)",
        "  dense/                     36 B  (2 variables)",
        "    bias    float32  (3,)    12 B",
        "    kernel  float32  (2, 3)  24 B",
        "step_count  int64    ()       8 B",
        "5 variables, 108 B; 11 optimizer/bookkeeping hidden (--all shows them)",
    ]


def test_ls_sort_size_puts_the_largest_first(ck):
    r = run("ls", ck["D"], "--sort", "size", "--json")
    sizes = [v["nbytes"] for v in json.loads(r.stdout)]
    assert sizes == sorted(sizes, reverse=True)
    assert json.loads(r.stdout)[0]["name"] == "big"


def test_ls_stats_gives_min_max_mean_std_and_nan_inf_counts(ck):
    r = run("ls", ck["D"], "--stats")
    assert r.exit_code == 0, r.output
    assert r.stdout.splitlines()[1:] == [
        "NAME   DTYPE      SHAPE           SIZE  MIN   MAX    MEAN      STD  NAN  INF",
        "bad    float32    (4,)            16 B    1     1       1        0    1    2",
        "bf     bfloat16   (2,)             4 B   -2   1.5   -0.25     1.75    0    0",
        "big    float32    (100, 100)  39.1 KiB    0  9999  4999.5  2886.75    0    0",
        "c64    complex64  (2,)            16 B    -     -       -        -    -    -",
        "count  int64      ()               8 B   42    42      42        0    0    0",
        "flag   bool       (2,)             2 B    -     -       -        -    -    -",
        "text   string     (2,)            13 B    -     -       -        -    -    -",
        "7 variables, 39.1 KiB; 1 optimizer/bookkeeping hidden (--all shows them)",
    ]


def test_ls_stats_json_has_stats_per_tensor_and_null_for_non_numeric(ck):
    rows = {v["name"]: v for v in json.loads(run("ls", ck["D"], "--stats", "--json").stdout)}
    assert rows["bad"]["stats"] == {"min": 1.0, "max": 1.0, "mean": 1.0, "std": 0.0, "nan": 1, "inf": 2}
    assert rows["big"]["stats"]["std"] == pytest.approx(np.arange(10000).std())
    assert rows["text"]["stats"] is None


def test_ls_step_picks_that_checkpoint_of_a_directory(ck):
    r = run("ls", ck["A"], "--step", "5")
    assert r.exit_code == 0, r.output
    assert r.stdout.splitlines()[0] == f"Checkpoint: {ck['A']}/model-5 (step 5 of {ck['A']})"
    assert "old_only" in r.stdout


def test_ls_missing_step_lists_the_steps_there(ck):
    assert_one_line_error(run("ls", ck["A"], "--step", "7"), "no checkpoint of step 7", "steps there: 5, 10",
                          f"ckptmerge checkpoints {ck['A']}")


def test_ls_missing_path_is_a_one_line_error(tmp_path):
    assert_one_line_error(run("ls", tmp_path / "nope" / "model"), f"'{tmp_path / 'nope' / 'model'}' does not exist")


def test_ls_v1_checkpoint_lists_its_variables():
    r = run("ls", corpus() / "tf0x-v1format-nxt" / "model.ckpt")
    assert r.exit_code == 0, r.output
    assert r.stdout.splitlines()[0] == (f"Checkpoint: {corpus() / 'tf0x-v1format-nxt' / 'model.ckpt'} "
                                        f"(V1 checkpoint {corpus() / 'tf0x-v1format-nxt' / 'model.ckpt'})")
    assert "mweight   float32  (4, 10)" in r.stdout


def test_ls_corrupt_index_is_a_one_line_error(ck, tmp_path):
    shutil.copytree(Path(ck["B"]).parent, tmp_path / "B")
    index = tmp_path / "B" / "model.index"
    data = bytearray(index.read_bytes())
    data[len(data) // 3] ^= 0xFF
    index.write_bytes(bytes(data))
    assert_one_line_error(run("ls", tmp_path / "B" / "model"), "model.index")


def test_ls_stats_on_corrupt_data_is_a_one_line_error(ck, tmp_path):
    shutil.copytree(Path(ck["B"]).parent, tmp_path / "B")
    shard = tmp_path / "B" / "model.data-00000-of-00001"
    data = bytearray(shard.read_bytes())
    data[0] ^= 0xFF  # first bytes of a1
    shard.write_bytes(bytes(data))
    assert run("ls", tmp_path / "B" / "model").exit_code == 0  # listing reads the index only
    assert_one_line_error(run("ls", tmp_path / "B" / "model", "--stats"), "model.data-00000-of-00001")


CORPUS_FOLDERS = [f for f in corpus_folders() if f != "tf0x-v1format-nxt"]


@pytest.mark.parametrize("folder", CORPUS_FOLDERS)
def test_ls_lists_every_tensor_of_corpus_checkpoints_as_tensorflow_does(folder):
    ref = json.loads((corpus() / folder / "reference.json").read_text())
    r = run("ls", corpus() / folder, "--all", "--json")
    assert r.exit_code == 0, r.output
    rows = json.loads(r.stdout)
    assert sorted((v["key"], tuple(v["shape"])) for v in rows) == \
        sorted((v["name"], tuple(v["shape"])) for v in ref["variables"])
    shown = json.loads(run("ls", corpus() / folder, "--json").stdout)
    assert shown and all(v["kind"] == "variable" for v in shown)


def test_ls_reads_a_keras3_weights_h5_file_and_a_savedmodel_dir():
    r = run("ls", corpus() / "keras3-weights-h5-churn" / "model.weights.h5")
    assert r.exit_code == 0, r.output
    assert "layers/dense/vars/0    float32  (12, 64)  3.0 KiB" in r.stdout.splitlines()
    r = run("ls", corpus() / "tf18sm-iris-keras")
    assert r.exit_code == 0, r.output
    assert "dense_1/kernel  float32  (4, 8)  128 B" in r.stdout.splitlines()


# --------------------------------------------------------------------------------------------
# show
# --------------------------------------------------------------------------------------------


def test_show_prints_small_tensors_in_full(ck):
    r = run("show", ck["B"], "a1")
    assert r.exit_code == 0, r.output
    assert r.stdout == ("a1  float32  (3, 4)  48 B\n"
                        "[[0.  , 0.25, 0.5 , 0.75],\n"
                        " [1.  , 1.25, 1.5 , 1.75],\n"
                        " [2.  , 2.25, 2.5 , 2.75]]\n")


def test_show_summarises_large_tensors(ck):
    r = run("show", ck["D"], "big")
    assert r.exit_code == 0, r.output
    lines = r.stdout.splitlines()
    assert lines[0] == "big  float32  (100, 100)  39.1 KiB  key=model/v5/.ATTRIBUTES/VARIABLE_VALUE"
    assert "..." in r.stdout and len(lines) < 20


def test_show_accepts_a_raw_checkpoint_key(ck):
    r = run("show", ck["D"], "model/v6/.ATTRIBUTES/VARIABLE_VALUE")
    assert r.exit_code == 0, r.output
    assert r.stdout == "count  int64  ()  8 B  key=model/v6/.ATTRIBUTES/VARIABLE_VALUE\n42\n"


def test_show_json_gives_name_dtype_shape_and_nested_list_value(ck):
    r = run("show", ck["B"], "a1", "--json")
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout) == {"name": "a1", "key": "a1", "kind": "variable", "dtype": "float32",
                                    "shape": [3, 4], "value": B_A1.tolist()}


@pytest.mark.parametrize("name, value", [
    ("c64", [[1.0, 2.0], [3.0, -4.0]]),         # complex: [re, im] pairs
    ("text", ["hello", [255, 254]]),            # bytes: text if UTF-8, else the byte values
    ("bad", [1.0, "nan", "inf", "-inf"]),       # no NaN/Infinity literals: strict JSON
    ("bf", [1.5, -2.0]),
    ("flag", [True, False]),
    ("count", 42),
])
def test_show_json_encodes_every_dtype_as_documented(ck, name, value):
    r = run("show", ck["D"], name, "--json")
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["value"] == value


def test_show_unknown_name_suggests_the_near_name_and_the_ls_hint_works(ck):
    r = run("show", ck["A"], "enc/dense/kernal")
    assert_one_line_error(r, "Variable 'enc/dense/kernal' not found in checkpoint", "Did you mean 'enc/dense/kernel'")
    hint = re.search(r"Run '(ckptmerge [^']+)' to list its (\d+) variables\.", r.stderr)
    assert hint, r.stderr
    args = shlex.split(hint.group(1))[1:]
    listed = run(*args)
    assert listed.exit_code == 0
    assert listed.stdout.splitlines()[-1].startswith(f"{hint.group(2)} variables, ")


def test_missing_step_error_names_the_steps_and_its_checkpoints_hint_works(ck):
    r = run("ls", ck["A"], "--step", "7")
    assert_one_line_error(r, "step 7", "5, 10")
    hint = re.search(r"Run '(ckptmerge checkpoints [^']+)'", r.stderr)
    assert hint, r.stderr
    listed = run(*shlex.split(hint.group(1))[1:])
    assert listed.exit_code == 0
    assert [line.split()[-1] for line in listed.stdout.splitlines()[1:3]] == ["model-5", "model-10"]


def test_show_unknown_name_hint_keeps_the_step(ck):
    r = run("show", ck["A"], "nothing_like_it", "--step", "5")
    assert_one_line_error(r, f"Run 'ckptmerge ls {ck['A']} --step 5' to list its 3 variables.")


# --------------------------------------------------------------------------------------------
# diff
# --------------------------------------------------------------------------------------------


def test_diff_of_equal_checkpoints_exits_0(ck):
    r = run("diff", ck["B"], ck["Bcopy"], "--values")
    assert r.exit_code == 0, r.output
    assert r.stdout.splitlines()[2:] == ["Equal: 5 variables, same names, dtypes, shapes and values (5 compared)"]


def test_diff_reports_names_only_in_one_and_shape_differences_and_exits_1(ck):
    r = run("diff", ck["B"], ck["C"])
    assert r.exit_code == 1, r.output
    assert r.stdout == (
        f"A: {ck['B']} (checkpoint prefix {ck['B']})\n"
        f"B: {ck['C']} (checkpoint prefix {ck['C']})\n"
        "Only in A (1):\n"
        "  enc/dense/bias  float32  (3,)\n"
        "Only in B (1):\n"
        "  b_only  float64  (2, 2)\n"
        "Shape/dtype differ (1):\n"
        "  a2: A float32 (4,), B float32 (5,)\n"
        "Different: 1 only in A, 1 only in B, 1 with another shape/dtype\n")


def test_diff_values_gives_the_max_absolute_difference(ck):
    r = run("diff", ck["B"], ck["C"], "--values")
    assert r.exit_code == 1
    assert "Values differ (1):\n  a1: max abs diff 0.25\n" in r.stdout
    assert r.stdout.splitlines()[-1] == ("Different: 1 only in A, 1 only in B, 1 with another shape/dtype, "
                                         "1 of 3 compared with other values")


def test_diff_values_alone_make_checkpoints_different(ck, tmp_path):
    values = {"a1": B_A1, "a2": np.ones(4, np.float32), "enc/dense/kernel": np.full((2, 3), 0.5, np.float32),
              "enc/dense/bias": np.zeros(3, np.float32), "step_count": np.int64(8)}
    other = save_tf1(tmp_path / "model", values)
    assert run("diff", ck["B"], other).exit_code == 0  # same names, dtypes, shapes
    r = run("diff", ck["B"], other, "--values")
    assert r.exit_code == 1
    assert "  step_count: max abs diff 1\n" in r.stdout


def test_diff_json_has_documented_keys(ck):
    r = run("diff", ck["B"], ck["C"], "--values", "--json")
    assert r.exit_code == 1
    d = json.loads(r.stdout)
    assert d["equal"] is False
    assert d["only_in_a"] == ["enc/dense/bias"] and d["only_in_b"] == ["b_only"]
    assert d["mismatched"] == [{"name": "a2", "a": {"dtype": "float32", "shape": [4]},
                                "b": {"dtype": "float32", "shape": [5]}}]
    assert d["values"] == [{"name": "a1", "max_abs_diff": 0.25, "equal": False},
                           {"name": "enc/dense/kernel", "max_abs_diff": 0.0, "equal": True},
                           {"name": "step_count", "max_abs_diff": 0.0, "equal": True}]


def test_diff_all_includes_optimizer_state(ck):
    r = run("diff", ck["A"], ck["B"], "--all", "--json")
    d = json.loads(r.stdout)
    assert "a1/Adam" in d["only_in_a"] and "global_step" in d["only_in_a"]
    assert "a1/Adam" not in json.loads(run("diff", ck["A"], ck["B"], "--json").stdout)["only_in_a"]


def test_diff_step_a_picks_a_step(ck):
    r = run("diff", ck["A"], ck["A"], "--step-a", "5", "--json")
    d = json.loads(r.stdout)
    assert r.exit_code == 1 and d["only_in_a"] == ["old_only"]


def test_diff_missing_path_is_a_one_line_error(ck, tmp_path):
    assert_one_line_error(run("diff", ck["B"], tmp_path / "missing"), "does not exist")


# --------------------------------------------------------------------------------------------
# checkpoints
# --------------------------------------------------------------------------------------------


def _iso(t: float) -> str:
    return datetime.datetime.fromtimestamp(t).astimezone().isoformat(timespec="seconds")


def test_checkpoints_lists_step_time_size_and_latest(ck):
    infos = list_checkpoints(ck["A"])
    r = run("checkpoints", ck["A"])
    assert r.exit_code == 0, r.output
    t5, t10 = _iso(infos[0].time), _iso(infos[1].time)
    s5, s10 = infos[0].size, infos[1].size
    w = max(len(f"{s5} B"), len(f"{s10} B"), 4)
    assert r.stdout.splitlines() == [
        f"LATEST  STEP  TIME{' ' * (len(t5) - 4)}  {'SIZE'.rjust(w)}  NAME",
        f"           5  {t5}  {f'{s5} B'.rjust(w)}  model-5",
        f"*         10  {t10}  {f'{s10} B'.rjust(w)}  model-10",
        f"2 checkpoints, {s5 + s10} B" if s5 + s10 < 1024 else f"2 checkpoints, {(s5 + s10) / 1024:.1f} KiB",
    ]


def test_checkpoints_latest_comes_from_the_state_file_not_the_largest_step():
    rows = json.loads(run("checkpoints", corpus() / "tf2obj-2025-ckptmanager-comp", "--json").stdout)
    assert [(r["name"], r["step"], r["latest"]) for r in rows] == [
        ("ckpt-1", 1, True), ("ckpt-9", 9, False), ("ckpt-10", 10, False)]
    assert set(rows[0]) == {"name", "path", "step", "time", "time_iso", "size", "latest"}
    assert rows[0]["size"] == 1354 + 20720


def test_checkpoints_missing_directory_is_a_one_line_error(tmp_path):
    assert_one_line_error(run("checkpoints", tmp_path / "runs"), "does not exist")


def test_checkpoints_of_an_empty_directory_says_so(tmp_path):
    r = run("checkpoints", tmp_path)
    assert r.exit_code == 0
    assert r.stdout == f"No checkpoint in {str(tmp_path)!r}.\n"
    assert run("checkpoints", tmp_path, "--json").stdout == "[]\n"


# --------------------------------------------------------------------------------------------
# The whole command line
# --------------------------------------------------------------------------------------------


def test_version_prints_the_package_version():
    r = run("--version")
    assert r.exit_code == 0 and r.stdout == f"ckptmerge {__version__}\n"


@pytest.mark.parametrize("command", sorted(cli.commands))
def test_every_command_has_help_mentioning_its_arguments(command):
    r = run(command, "--help")
    assert r.exit_code == 0, r.output
    assert f"Usage: ckptmerge {command}" in r.stdout
    for param in cli.commands[command].params:
        if param.name == "help":
            continue
        shown = param.human_readable_name if param.param_type_name == "argument" else param.opts[0]
        assert shown in r.stdout, (command, shown)
    assert len(r.stdout.splitlines()) > 3


def test_main_help_lists_every_command():
    r = run("--help")
    assert r.exit_code == 0
    for command in cli.commands:
        assert f"  {command}" in r.stdout


def test_unknown_command_is_a_usage_error_with_exit_2():
    r = run("lst", "x")
    assert r.exit_code == 2
    assert "No such command 'lst'" in r.stderr and "Traceback" not in r.stderr


@pytest.mark.parametrize("args", [
    ["ls", "{B}"], ["ls", "{B}", "--stats"], ["show", "{B}", "a1"], ["diff", "{B}", "{C}", "--values"],
    ["checkpoints", "{A}"], ["watch", "{A}", "--timeout", "0"], ["check", "{config}"],
    ["plan", "{config}", "--target", "{B}"],
], ids=lambda a: " ".join(a[:1] + [x for x in a[2:] if x.startswith("--")]))
def test_inspection_commands_do_not_import_tensorflow(ck, tmp_path, args):
    config = tmp_path / "warm.yaml"
    config.write_text(f"sources:\n  - path: {ck['B']}\n")
    argv = [a.format(config=config, **{k: v for k, v in ck.items() if k != "root"}) for a in args]
    res = run_subprocess(argv, tmp_path)
    assert res["code"] in (0, 1), res["stderr"]
    assert res["tf_modules"] == [], res["tf_modules"]


def test_importing_the_cli_does_not_import_tensorflow(tmp_path):
    res = run_subprocess(["--help"], tmp_path)
    assert res["code"] == 0 and res["tf_modules"] == []
    assert "Usage: ckptmerge" in res["stdout"]


def test_python_m_ckptmerge_reports_errors_in_one_line_without_traceback(tmp_path):
    res = run_subprocess(["ls", str(tmp_path / "missing")], tmp_path)
    assert res["code"] == 2
    assert res["stdout"] == ""
    assert res["stderr"].startswith("Error: ") and res["stderr"].count("\n") == 1


def test_os_errors_on_input_files_are_one_line_errors(ck, monkeypatch):
    import ckptmerge.cli.inspect as cli_module

    def denied(path, step, **kw):
        raise PermissionError(13, "Permission denied", f"{path}/model.index")

    monkeypatch.setattr(cli_module, "open_checkpoint_arg", denied)
    assert_one_line_error(run("ls", ck["A"]), f"Error: Permission denied: '{ck['A']}/model.index'")


def test_a_closed_pipe_ends_the_output_quietly(tmp_path):
    import os
    import subprocess
    import sys

    import tensorflow as tf

    module = tf.Module()
    module.vs = [tf.Variable(float(i), name=f"layer_{i}/w") for i in range(1000)]
    prefix = tf.train.Checkpoint(model=module).write(str(tmp_path / "ckpt"))
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[1]))
    proc = subprocess.Popen([sys.executable, "-m", "ckptmerge", "ls", prefix, "--all", "--json"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    assert proc.stdout.read(100)  # like `| head -c 100`: read a little, then hang up
    proc.stdout.close()
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=60) == 0
    assert err == ""


def test_diff_max_abs_difference_is_exact_for_int64_and_counts_nan_pairs_as_equal():
    from ckptmerge.cli import max_abs_diff

    big = np.array([2**62], np.int64)
    assert max_abs_diff(big, big + 1) == 1.0  # float64 would call these equal
    assert max_abs_diff(np.array([-(2**63)], np.int64), np.array([2**63 - 1], np.int64)) == float(2**64 - 1)
    assert max_abs_diff(np.array([1.0, np.nan]), np.array([1.0, np.nan])) == 0.0
    assert np.isnan(max_abs_diff(np.array([1.0, np.nan]), np.array([1.0, 2.0])))
    assert max_abs_diff(np.array([True, False]), np.array([0.5, 0.0])) == 0.5
    assert max_abs_diff(np.array([b"x"], object), np.array([b"y"], object)) is None


def test_checkpoints_of_a_prefix_points_to_its_directory_and_the_hint_works(ck):
    prefix = ck["A"] + "/model-10"
    r = run("checkpoints", prefix)
    assert_one_line_error(r, "is a checkpoint prefix, not a directory", f"'ckptmerge checkpoints {ck['A']}'")
    assert run("checkpoints", ck["A"]).exit_code == 0
    assert run("ls", prefix).exit_code == 0


def test_demo_refuses_a_folder_that_is_not_empty(tmp_path):
    (tmp_path / "x").write_text("mine")
    assert_one_line_error(run("demo", "--dir", tmp_path), "is not empty", "Pass another --dir")


def test_checkpoints_of_a_folder_with_only_a_v1_checkpoint_lists_it():
    r = run("checkpoints", corpus() / "tf0x-v1format-nxt")
    assert r.exit_code == 0, r.output
    assert r.stdout.splitlines()[1].endswith("1.9 KiB  model.ckpt")


def test_checkpoints_says_when_the_state_file_names_a_missing_latest(tmp_path, tf):
    save_tf1(tmp_path / "model", {"w": np.ones(2, np.float32)}, step=3)
    (tmp_path / "checkpoint").write_text('model_checkpoint_path: "model-9"\nall_model_checkpoint_paths: "model-3"\n')
    r = run("checkpoints", tmp_path)
    assert r.exit_code == 0, r.output
    assert r.stdout.rstrip().endswith("the 'checkpoint' state file names 'model-9' as latest, which is missing")


def test_a_checksum_error_names_no_verify_and_no_verify_reads_the_tensor(tmp_path, tf):
    prefix = save_tf1(tmp_path / "m", {"w": np.arange(4, dtype=np.float32)})
    data = prefix + ".data-00000-of-00001"
    raw = bytearray(open(data, "rb").read())
    raw[0] ^= 0x01  # w's first byte: a bit flip in its data
    open(data, "wb").write(bytes(raw))
    r = run("show", prefix, "w")
    assert_one_line_error(r, "checksum mismatch for tensor 'w'", "--no-verify")
    for args in (["show", prefix, "w"], ["ls", prefix, "--stats"], ["diff", prefix, prefix, "--values"]):
        ok = run(*args, "--no-verify")
        assert ok.exit_code == 0, (args, ok.output)


def test_ls_of_an_index_that_is_a_directory_says_so(tmp_path):
    (tmp_path / "model-10.index").mkdir()
    assert_one_line_error(run("ls", tmp_path / "model-10"), f"'{tmp_path / 'model-10.index'}' is a directory, "
                          "not a regular file")


def test_diff_walk_splits_two_sorted_listings_as_sets_would():
    from hypothesis import given, settings
    from hypothesis import strategies as st

    from ckptmerge.cli.inspect import _sorted_diff
    from ckptmerge.core.specs import VariableInfo

    @settings(max_examples=300, deadline=None)
    @given(a=st.sets(st.text("abc/", max_size=4)), b=st.sets(st.text("abc/", max_size=4)))
    def check(a, b):
        la = [VariableInfo(n, (1,), "float32") for n in sorted(a)]
        lb = [VariableInfo(n, (2,), "int32") for n in sorted(b)]
        only_a, only_b, common = _sorted_diff(la, lb)
        assert [v.name for v in only_a] == sorted(a - b)
        assert [v.name for v in only_b] == sorted(b - a)
        assert [(x.name, x.shape, y.shape) for x, y in common] == [(n, (1,), (2,)) for n in sorted(a & b)]

    check()
