"""Hostile tensor names cannot forge output: one name is always one visible line.

Names come from files, so they may hold ESC (ANSI CSI/OSC sequences: clear screen, window title),
newlines, carriage returns and bidi overrides. Text output (tables, trees, reports, error
messages) shows them escaped; ``--json`` and the library keep the exact names. The checkpoints
are written by TensorFlow's own ``SaveV2`` op, which stores any key it is given.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from _cli_util import assert_one_line_error, run, run_subprocess

import ckptmerge as cm
from ckptmerge.merging.local import MergeReport
from ckptmerge.planning.planner import SourceView, make_plan
from ckptmerge.render.report import render_plan
from ckptmerge.planning.rules import Rules
from ckptmerge.core.specs import VariableInfo as V
from ckptmerge.core.text import escape_name, escape_text, join_lines, quote_name
from ckptmerge.core.errors import CheckpointFormatError, TransformError
from ckptmerge.planning.transforms import read_vocab

#: The audit's forged row: a title-setting OSC sequence, then a newline and a fake table row.
FORGED = "x\x1b]0;t\x07\nhidden_backdoor  float32  (1,)  4 B"
CLEAR = "dense/kernel\x1b[2J\x1b[H"
BIDI = "admin\u202egnp.exe"
CR = "ok\rbad"
HOSTILE = [FORGED, CLEAR, BIDI, CR]


def assert_clean(text: str) -> None:
    """No control, format or separator character other than newlines reaches the output."""
    bad = [c for c in text if c != "\n" and not c.isprintable()]
    assert not bad, (bad, text)
    assert "hidden_backdoor  float32" not in text.splitlines()


def save_v2(tf, prefix, values):
    """Write a checkpoint with TensorFlow's SaveV2 op: keys are stored exactly as given."""
    names = sorted(values)
    tf.raw_ops.SaveV2(prefix=str(prefix), tensor_names=names, shape_and_slices=[""] * len(names),
                      tensors=[tf.constant(values[n]) for n in names])
    return str(prefix)


@pytest.fixture
def hostile(tmp_path, tf):
    values = {n: np.ones((1,), np.float32) for n in HOSTILE}
    values["dense/bias"] = np.zeros((2,), np.float32)
    return save_v2(tf, tmp_path / "hostile", values)


# --------------------------------------------------------------------------------------------
# the function


@pytest.mark.parametrize("name,shown", [
    (FORGED, "x\\x1b]0;t\\x07\\nhidden_backdoor  float32  (1,)  4 B"),
    (CLEAR, "dense/kernel\\x1b[2J\\x1b[H"),
    (BIDI, "admin\\u202egnp.exe"),
    (CR, "ok\\rbad"),
    ("a\tb\x7f\x9b31m", "a\\tb\\x7f\\x9b31m"),           # DEL and the 8-bit CSI (C1)
    ("a\u2066b\u2069\u200b\u2028\ufeff", "a\\u2066b\\u2069\\u200b\\u2028\\ufeff"),
    ("bad\udcff", "bad\\udcff"),                         # a lone surrogate (undecodable file name)
    ("tag\U000e0041", "tag\\U000e0041"),
])
def test_escape_name_writes_every_unprintable_character_as_an_escape(name, shown):
    assert escape_name(name) == shown
    assert_clean(escape_name(name))


@pytest.mark.parametrize("name", ["encoder/dense/kernel", "слой/ядро", "層/カーネル", "a b\\1", ""])
def test_escape_name_keeps_printable_names_as_they_are(name):
    assert escape_name(name) == name


@pytest.mark.parametrize("name", HOSTILE)
def test_escaping_is_idempotent_so_escaped_text_can_be_escaped_again(name):
    assert escape_name(escape_name(name)) == escape_name(name)


def test_escape_text_keeps_newlines_quote_and_join_escape_each_name():
    assert escape_text("a\x1b[2J\nb\r") == "a\\x1b[2J\nb\\r"
    assert quote_name("a\nb") == "'a\\nb'" and quote_name(None) == "None"
    assert join_lines(["x", FORGED]).splitlines()[1] == escape_name(FORGED)


# --------------------------------------------------------------------------------------------
# the command line


@pytest.mark.parametrize("args", [[], ["--all"], ["--tree"], ["--stats"], ["--sort", "size"]])
def test_ls_shows_each_hostile_name_on_one_escaped_row(hostile, args):
    r = run("ls", hostile, *args)
    assert r.exit_code == 0, r.output
    assert_clean(r.stdout)
    lines = r.stdout.splitlines()
    for name in HOSTILE:
        shown = escape_name(name.rsplit("/", 1)[-1] if args == ["--tree"] else name)  # leaves under scopes
        assert sum(shown in line for line in lines) == 1, (name, r.stdout)
    assert lines[-1].startswith("5 ")


def test_ls_json_keeps_the_exact_names(hostile):
    r = run("ls", hostile, "--json")
    assert {v["name"] for v in json.loads(r.stdout)} == {*HOSTILE, "dense/bias"}


def test_show_prints_a_hostile_name_escaped(hostile):
    r = run("show", hostile, CLEAR)
    assert r.exit_code == 0, r.output
    assert_clean(r.stdout)
    assert r.stdout.splitlines()[0].startswith("dense/kernel\\x1b[2J\\x1b[H  float32  (1,)")


def test_did_you_mean_of_a_hostile_name_is_one_escaped_error_line(hostile):
    r = run("show", hostile, "dense/kernel\x1b[2J\x1b[J")
    assert_one_line_error(r, "Variable 'dense/kernel\\x1b[2J\\x1b[J' not found",
                          "Did you mean 'dense/kernel\\x1b[2J\\x1b[H'?")
    assert_clean(r.stderr)


def test_diff_lists_hostile_names_escaped(hostile, tmp_path, tf):
    other = save_v2(tf, tmp_path / "other", {"dense/bias": np.zeros((3,), np.float32)})
    r = run("diff", hostile, other)
    assert r.exit_code == 1, r.output
    assert_clean(r.stdout)
    assert "Only in A (4):" in r.stdout and f"  {escape_name(FORGED)}  float32  (1,)" in r.stdout


def test_checkpoints_lists_a_hostile_file_name_escaped(tmp_path, tf):
    save_v2(tf, tmp_path / "model-1\x1b[2J", {"v": np.zeros((1,), np.float32)})
    r = run("checkpoints", tmp_path)
    assert r.exit_code == 0, r.output
    assert_clean(r.stdout)
    assert "model-1\\x1b[2J" in r.stdout


# --------------------------------------------------------------------------------------------
# reports and library messages


def _hostile_plan():
    src = SourceView("A", "runs/A\x1b[2J", "", {n: V(n, (1,), "float32") for n in HOSTILE}, Rules())
    targets = [V(FORGED, (1,), "float32"), V("c/missing\nfake", (), "int64"), V(BIDI, (2,), "float32")]
    return make_plan(targets, [src])


def test_plan_report_shows_each_name_on_one_escaped_line():
    text = render_plan(_hostile_plan())
    assert_clean(text)
    assert "  c/missing\\nfake" in text.splitlines()
    assert f"  {escape_name(FORGED)} <- A:'{escape_name(FORGED)}' float32 (1,)" in text.splitlines()


def test_plan_error_lists_each_finding_on_one_escaped_line():
    with pytest.raises(cm.PlanError) as err:
        _hostile_plan().check()
    lines = str(err.value).splitlines()
    assert_clean(str(err.value))
    assert lines[0] == "2 blocking findings in the plan (strict=True):"
    assert [line[:4] for line in lines[1:]] == ["  - ", "  - ", "Pass"]
    assert "'c/missing\\nfake'" in lines[1]


def test_merge_report_escapes_names_and_output():
    plan = _hostile_plan()
    report = MergeReport(plan, "offline", list(plan.assignments), [], 0.1, 4, [], output="out\n/m")
    assert_clean(report.render())
    assert report.summary().endswith("to 'out\\n/m' in 0.10 s")


def test_unknown_tensor_error_escapes_the_suggestions(hostile):
    with pytest.raises(cm.UnknownTensorError) as err:
        cm.load(hostile, ["dense/kernel\x1b[2J\x1b[J"])
    assert_clean(str(err.value))
    assert "Did you mean 'dense/kernel\\x1b[2J\\x1b[H'?" in str(err.value)


def test_a_state_file_naming_a_hostile_missing_checkpoint_is_one_escaped_error_line(tmp_path, tf):
    save_v2(tf, tmp_path / "model-1", {"v": np.zeros((1,), np.float32)})
    tf.compat.v1.train.update_checkpoint_state(str(tmp_path), str(tmp_path / "model-2\x1b[2J\nfake"))
    r = run("ls", tmp_path)
    assert_one_line_error(r, "names '", "model-2\\x1b[2J\\nfake' as the latest")
    assert_clean(r.stderr)
    with pytest.raises(cm.CheckpointNotFoundError) as err:
        cm.list_variables(tmp_path)
    assert_clean(str(err.value))
    assert len(str(err.value).splitlines()) == 1


# --------------------------------------------------------------------------------------------
# paths the user typed


#: A path that would colour the terminal red and start a forged line if printed raw.
RED = "runs\x1b[31m\nError: forged"


def test_a_missing_checkpoint_path_is_one_escaped_error_line(tmp_path):
    path = tmp_path / RED / "model"
    r = run("ls", path)
    assert_one_line_error(r, "Checkpoint path '", "runs\\x1b[31m\\nError: forged/model' does not exist")
    assert_clean(r.stderr)
    with pytest.raises(cm.CheckpointNotFoundError) as err:
        cm.list_variables(str(path))
    assert_clean(str(err.value))
    assert len(str(err.value).splitlines()) == 1


def test_a_directory_without_checkpoints_is_named_escaped(tmp_path):
    (tmp_path / RED).mkdir()
    r = run("ls", tmp_path / RED, "--step", 3)
    assert_one_line_error(r, "runs\\x1b[31m\\nError: forged")
    assert_clean(r.stderr)
    r = run("checkpoints", tmp_path / RED / "nothing")
    assert_one_line_error(r, "runs\\x1b[31m\\nError: forged/nothing' does not exist")
    assert_clean(r.stderr)


def test_a_file_that_is_not_a_checkpoint_is_named_escaped(tmp_path):
    (tmp_path / RED).mkdir()
    (tmp_path / RED / "notes.txt").write_text("hello")
    r = run("ls", tmp_path / RED / "notes.txt")
    assert_one_line_error(r, "runs\\x1b[31m\\nError: forged/notes.txt' is a file but not a checkpoint")
    assert_clean(r.stderr)


def test_a_config_path_is_escaped_in_the_problem_header(tmp_path):
    (tmp_path / RED).mkdir()
    config = tmp_path / RED / "warm.yaml"
    r = run("check", config)
    assert r.exit_code == 2, r.output
    assert_clean(r.stderr)
    assert r.stderr.splitlines()[0].endswith("runs\\x1b[31m\\nError: forged/warm.yaml:")
    assert r.stderr.splitlines()[1:] == ["  warm.yaml: config file not found: "
                                         f"'{escape_name(str(config))}'"]
    assert not any(line.startswith("Error: forged") for line in r.stderr.splitlines())


# --------------------------------------------------------------------------------------------
# paths the user typed, in the CLI's own messages and output lines


def no_forged_line(text: str) -> None:
    assert_clean(text)
    assert not any(line.startswith("Error: forged") for line in text.splitlines()), text


@pytest.fixture
def red_dir(tmp_path, tf):
    """A folder whose name holds ESC and a newline, with checkpoint 'model' (variable 'v')."""
    red = tmp_path / RED
    red.mkdir()
    save_v2(tf, red / "model", {"v": np.ones((2,), np.float32)})
    return red


def test_suggest_names_its_output_file_escaped(red_dir):
    out = red_dir / "map.yaml"
    r = run("suggest", red_dir / "model", "--target", red_dir / "model", "-o", out)
    assert r.exit_code == 0, r.output
    no_forged_line(r.stdout)
    wrote = r.stdout.splitlines()[-1]
    # (a path with control characters: shell-quoted inside the command, the command in double quotes)
    assert wrote.startswith(f"Wrote {escape_name(str(out))}: check it with \"ckptmerge check '")
    assert out.exists()


def test_suggest_cannot_write_its_output_names_it_escaped(red_dir):
    r = run("suggest", red_dir / "model", "--target", red_dir / "model", "-o", red_dir / "no" / "map.yaml")
    assert_one_line_error(r, "cannot write '", "runs\\x1b[31m\\nError: forged/no/map.yaml'")
    no_forged_line(r.stderr)


@pytest.mark.parametrize("command,key", [("plan", "target"), ("merge", "output")])
def test_a_config_without_target_or_output_is_named_escaped(red_dir, command, key):
    config = red_dir / "warm.yaml"
    config.write_text("sources:\n  - name: A\n    path: model\n")
    r = run(command, config)
    assert_one_line_error(r, f"in '{escape_name(str(config))}'.")
    no_forged_line(r.stderr)


def test_an_unknown_tensor_names_the_typed_path_escaped_in_the_hint(red_dir):
    r = run("show", red_dir / "model", "w")
    assert_one_line_error(r, "Variable 'w' not found in checkpoint '", "Run \"ckptmerge ls '",
                          "runs\\x1b[31m\\nError: forged/model'")
    no_forged_line(r.stderr)


def test_checkpoints_of_a_folder_without_any_names_it_escaped(tmp_path):
    (tmp_path / RED).mkdir()
    r = run("checkpoints", tmp_path / RED)
    assert r.exit_code == 0, r.output
    assert r.stdout == f"No checkpoint in '{escape_name(str(tmp_path / RED))}'.\n"


def test_a_model_file_that_does_not_compile_is_one_escaped_error_line(red_dir):
    models = red_dir / f"{RED}.py"  # SyntaxError's message names the file
    models.write_text("def build(:\n")
    r = run("suggest", red_dir / "model", "--model", f"{models}:build")
    assert_one_line_error(r, "importing '", "raised SyntaxError")
    no_forged_line(r.stderr)


def test_demo_names_its_folder_escaped(tmp_path, tf):
    r = run("demo", "--dir", tmp_path / RED)
    assert r.exit_code == 0, r.output
    no_forged_line(r.stdout)
    assert f"Demo folder: {escape_name(str(tmp_path / RED))}" in r.stdout.splitlines()


def test_a_warning_names_a_hostile_file_on_one_escaped_line(tmp_path):
    folder = tmp_path / "weights"
    folder.mkdir()
    np.save(folder / "w.npy", np.ones(2, np.float32))
    np.save(tmp_path / "outside.npy", np.ones(2, np.float32))
    (folder / f"{RED}.npy").symlink_to(tmp_path / "outside.npy")  # out of the folder: skipped, with a warning
    r = run_subprocess(["ls", folder], tmp_path)
    assert r["code"] == 0, r["stderr"]
    warning = [line for line in r["stderr"].splitlines() if line.startswith("WARNING:")]
    assert len(warning) == 1 and warning[0].endswith("skipping symbolic link runs\\x1b[31m\\nError: forged.npy "
                                                     "(ckptmerge reads only files inside the directory)"), r["stderr"]
    no_forged_line(r["stderr"])


def test_merging_into_a_source_names_the_output_and_the_source_escaped(red_dir):
    config = red_dir / "warm.yaml"
    config.write_text("sources:\n  - name: A\n    path: model\n")
    r = run("merge", config, "-o", red_dir / "model")
    assert_one_line_error(r, "The output prefix '", "runs\\x1b[31m\\nError: forged/model' is the checkpoint of "
                          "source 'A' (", "runs\\x1b[31m\\nError: forged/model): merging into")
    no_forged_line(r.stderr)


def test_a_template_without_model_variables_is_named_escaped(red_dir, tf):
    save_v2(tf, red_dir / "steps", {"global_step": np.int64(7)})
    config = red_dir / "warm.yaml"
    config.write_text("sources:\n  - name: A\n    path: model\n")
    r = run("merge", config, "--template", red_dir / "steps", "-o", red_dir / "out")
    assert_one_line_error(r, "The template checkpoint '", "runs\\x1b[31m\\nError: forged/steps' has no model variables")
    no_forged_line(r.stderr)


@pytest.mark.parametrize("text,problem", [(None, "does not exist"), ("", "is empty"), ("a\na\n", "has the duplicate"),
                                          (b"\xff\n", "is not valid UTF-8")])
def test_a_vocab_file_is_named_escaped(tmp_path, text, problem):
    (tmp_path / RED).mkdir()
    path = tmp_path / RED / "vocab.txt"
    if isinstance(text, str):
        path.write_text(text)
    elif text is not None:
        path.write_bytes(text)
    with pytest.raises(TransformError) as err:
        read_vocab(str(path))
    message = str(err.value)
    assert message.startswith(f"vocab file {quote_name(str(path))} {problem}"), message
    assert len(message.splitlines()) == 1
    no_forged_line(message)
    # the CLI names it once, on the config problem's one line
    (tmp_path / RED / "model.txt").write_text("a\n")
    config = tmp_path / RED / "warm.yaml"
    config.write_text("sources:\n  - name: A\n    path: model\n    vocab:\n"
                      "      - {name: v, old_vocab: vocab.txt, new_vocab: model.txt}\n")
    r = run("check", config)
    assert r.exit_code == 2, r.output
    no_forged_line(r.stderr)
    assert f"{quote_name(str(path))} {problem}" in r.stderr


def test_a_vocab_remap_names_its_file_escaped(tmp_path):
    (tmp_path / RED).mkdir()
    old = tmp_path / RED / "old.txt"
    old.write_text("a\nb\n")
    with pytest.raises(TransformError) as err:
        cm.VocabRemap("v", str(old), ["b", "a"]).output_shape((1, 4))  # fewer rows than tokens
    assert f"the old vocabulary {quote_name(str(old))} has 2 tokens" in str(err.value), err.value
    no_forged_line(str(err.value))


# --------------------------------------------------------------------------------------------
# URLs (object storage, through memory://)


@pytest.fixture
def red_url(tmp_path, tf):
    """A memory:// folder whose name holds ESC and a newline, with checkpoints ckpt-1 and ckpt-2."""
    import fsspec

    fs = fsspec.filesystem("memory")
    url = f"memory://escape-{tmp_path.name}/{RED}"
    for step in (1, 2):
        save_v2(tf, tmp_path / f"ckpt-{step}", {"v": np.ones((2,), np.float32)})
        for name in (f"ckpt-{step}.index", f"ckpt-{step}.data-00000-of-00001"):
            fs.pipe(f"{url}/{name}", (tmp_path / name).read_bytes())
    fs.pipe(f"{url}/notes.txt", b"hello")
    yield url
    fs.rm(f"memory://escape-{tmp_path.name}", recursive=True)


def test_a_missing_url_is_one_escaped_error_line_with_an_escaped_hint(red_url):
    r = run("ls", f"{red_url}/ckpt-9")
    assert_one_line_error(r, "Checkpoint '", "runs\\x1b[31m\\nError: forged/ckpt-9' does not exist: no object '",
                          "runs\\x1b[31m\\nError: forged/ckpt-9.index' and no directory there",
                          "run \"ckptmerge checkpoints 'memory://", "runs\\x1b[31m\\nError: forged'\" to list")
    no_forged_line(r.stderr)


def test_a_url_folder_without_the_step_or_a_state_file_is_named_escaped(red_url):
    r = run("ls", red_url, "--step", 7)
    assert_one_line_error(r, "no checkpoint of step 7 in '", "runs\\x1b[31m\\nError: forged'; steps there: 1, 2. "
                          "Run \"ckptmerge checkpoints 'memory://", "runs\\x1b[31m\\nError: forged'\" to list them.")
    no_forged_line(r.stderr)


def test_a_url_state_file_naming_a_missing_checkpoint_is_named_escaped(red_url):
    import fsspec

    fsspec.filesystem("memory").pipe(f"{red_url}/checkpoint", b'model_checkpoint_path: "ckpt-\x1b[2J5"\n')
    r = run("ls", red_url)
    assert_one_line_error(r, "runs\\x1b[31m\\nError: forged/checkpoint' names 'ckpt-\\x1b[2J5' as the latest "
                          "checkpoint, but '", "runs\\x1b[31m\\nError: forged/ckpt-\\x1b[2J5.index' does not exist")
    no_forged_line(r.stderr)


def test_a_url_that_is_not_a_checkpoint_is_named_escaped(red_url):
    r = run("ls", f"{red_url}/notes.txt")
    assert_one_line_error(r, "runs\\x1b[31m\\nError: forged/notes.txt' is a file but not a checkpoint")
    no_forged_line(r.stderr)


def test_storage_errors_quote_the_url_escaped(red_url):
    from ckptmerge.formats import storage

    with pytest.raises(cm.CheckpointNotFoundError) as err:
        storage.read_small(f"{red_url}/gone")
    assert str(err.value) == f"{quote_name(red_url + '/gone')} does not exist (while looking up)."
    no_forged_line(str(err.value))
    with pytest.raises(CheckpointFormatError) as err:
        storage.read_small(f"{red_url}/notes.txt", limit=2)
    assert str(err.value).startswith(f"{quote_name(red_url + '/notes.txt')} has 5 bytes, more than")
    no_forged_line(str(err.value))


def test_a_path_that_is_not_a_regular_file_is_named_escaped(tmp_path):
    from ckptmerge.formats.io.localfile import NotARegularFileError, read_regular_file

    (tmp_path / RED).mkdir()
    with pytest.raises(NotARegularFileError) as err:
        read_regular_file(str(tmp_path / RED))
    assert str(err.value).startswith(f"{quote_name(str(tmp_path / RED))} is a directory"), err.value
    no_forged_line(str(err.value))


def test_a_corrupt_safetensors_file_is_named_escaped(tmp_path):
    (tmp_path / RED).mkdir()
    path = tmp_path / RED / "model.safetensors"
    path.write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00{broken}")
    r = run("ls", path)
    assert_one_line_error(r, f"(File: {escape_name(str(path))})")
    no_forged_line(r.stderr)
