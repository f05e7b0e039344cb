"""``ckptmerge merge``: the command-line front door of the offline merge (ckptmerge.merging.local.merge).

The merge itself (formats, atomicity, streaming) is tested in tests/test_merge.py; here: the
command's options, output, exit codes, the progress bar (on a real pseudo-terminal) and that a
merge without --model never imports TensorFlow.
"""

from __future__ import annotations

import json
import os
import pty
import subprocess
import sys

import numpy as np
import pytest
from _cli_util import (
    MODELS_PY,
    REPO,
    assert_one_line_error,
    run,
    run_subprocess,
    save_tf1,
    write_config,
)

import ckptmerge as cm

A1 = np.arange(12, dtype=np.float32).reshape(3, 4)
B1 = np.arange(4, dtype=np.float32) + 100



@pytest.fixture(scope="module")
def ws(tmp_path_factory):
    """Checkpoints A (dir) and B (prefix), template C, configs; outputs go to per-test folders."""
    root = tmp_path_factory.mktemp("merge")
    for d in ("A", "B", "C"):
        (root / d).mkdir()
    save_tf1(root / "A" / "model", {"a1": A1, "a2": np.ones(4, np.float32)}, step=10, optimizer_slots=False)
    save_tf1(root / "B" / "model", {"b1": B1, "b2": np.ones(5, np.float32)}, step=10)
    save_tf1(root / "C" / "model", {"c/x1": np.zeros((3, 4), np.float32), "c/y1": np.zeros(4, np.float32),
                                    "c/z": np.full(2, 7, np.float32)})
    (root / "cm_merge_models.py").write_text(MODELS_PY)
    write_config(root / "merge.yaml", """
        sources:
          - {name: A, path: A, map: {a1: c/x1}}
          - {name: B, path: B/model-10, map: {b1: c/y1}}
        allow_missing: [c/z]
    """)
    write_config(root / "scopes.yaml", """
        sources:
          - {name: A, path: A, map: {"/": "model_a/"}}
          - {name: B, path: B/model-10, include: ["b1"]}
    """)
    write_config(root / "conflict.yaml", """
        sources:
          - {name: A, path: A}
          - {name: A2, path: A}
    """)
    write_config(root / "withoutput.yaml", """
        output: out/from-config
        sources:
          - {name: B, path: B/model-10}
    """)
    return root


def test_merge_without_template_writes_every_name_the_sources_give(ws, tmp_path):
    out = tmp_path / "out" / "merged"
    r = run("merge", ws / "scopes.yaml", "-o", out)
    assert r.exit_code == 0, r.output
    assert r.stdout.startswith(f"wrote 3 variables from 2 sources to '{out}' in ")
    values = cm.load(out)
    assert sorted(values) == ["b1", "model_a/a1", "model_a/a2"]
    np.testing.assert_array_equal(values["model_a/a1"], A1)
    np.testing.assert_array_equal(values["b1"], B1)


def test_merge_with_a_template_checkpoint_holds_exactly_its_names(ws, tmp_path):
    out = tmp_path / "merged"
    r = run("merge", ws / "merge.yaml", "-o", out, "--template", ws / "C")
    assert r.exit_code == 0, r.output
    values = cm.load(out)
    assert sorted(values) == ["c/x1", "c/y1", "c/z"]
    np.testing.assert_array_equal(values["c/x1"], A1)
    np.testing.assert_array_equal(values["c/y1"], B1)
    np.testing.assert_array_equal(values["c/z"], np.full(2, 7, np.float32))  # the template's own value
    assert "From the template (1):\n  c/z: " in r.stdout


def test_merge_with_a_model_template_holds_its_variables(ws, tmp_path):
    out = tmp_path / "merged"
    r = run("merge", ws / "merge.yaml", "-o", out, "--model", f"{ws / 'cm_merge_models.py'}:build")
    assert r.exit_code == 0, r.output
    assert sorted(cm.load(out)) == ["c/x1", "c/y1"]
    assert "Left out (1):\n  c/z: " in r.stdout  # allowed missing: a model has no value to write


def test_merge_refuses_to_overwrite_an_output_without_force(ws, tmp_path):
    out = tmp_path / "merged"
    assert run("merge", ws / "scopes.yaml", "-o", out, "-q").exit_code == 0
    assert_one_line_error(run("merge", ws / "scopes.yaml", "-o", out), "already exists", "--force")
    r = run("merge", ws / "merge.yaml", "-o", out, "--template", ws / "C", "--force", "-q")
    assert r.exit_code == 0, r.output
    assert sorted(cm.load(out)) == ["c/x1", "c/y1", "c/z"]


def test_merge_dry_run_prints_the_plan_and_writes_nothing(ws, tmp_path):
    out = tmp_path / "merged"
    r = run("merge", ws / "merge.yaml", "-o", out, "--template", ws / "C", "--dry-run")
    assert r.exit_code == 0, r.output
    assert "OK: nothing blocks a strict restore\n" in r.stdout
    assert f"would write 3 variables (1 from the template) from 2 sources to '{out}'\n" in r.stdout
    assert not tmp_path.exists() or os.listdir(tmp_path) == []


def test_merge_blocked_by_findings_exits_1_and_writes_nothing(ws, tmp_path):
    out = tmp_path / "merged"
    r = run("merge", ws / "conflict.yaml", "-o", out)
    assert r.exit_code == 1, r.output
    assert r.stdout == ""
    assert r.stderr.startswith("Blocked: 2 blocking findings in the plan (strict=True):\n")
    assert "conflict: target 'a1' is provided by A:'a1' and A2:'a1'" in r.stderr
    assert r.stderr.rstrip().endswith("top-level keys: allow_missing, on_conflict, on_shape_mismatch, "
                                      "cast, strict, verify (see docs/config.md).")
    assert f"Nothing was written to '{out}'." in r.stderr
    assert not os.path.exists(f"{out}.index")


def test_merge_dry_run_with_findings_prints_the_whole_plan_and_exits_1(ws, tmp_path):
    r = run("merge", ws / "conflict.yaml", "-o", tmp_path / "merged", "--dry-run")
    assert r.exit_code == 1
    assert "Conflicts (2):\n" in r.stdout
    assert r.stdout.splitlines()[-1] == "2 blocking findings (strict); 0 with strict=False"


def test_merge_json_prints_the_report(ws, tmp_path):
    out = tmp_path / "merged"
    r = run("merge", ws / "merge.yaml", "-o", out, "--template", ws / "C", "--json")
    assert r.exit_code == 0, r.output
    d = json.loads(r.stdout)
    assert d["output"] == str(out) and d["dry_run"] is False and d["mode"] == "offline"
    assert d["restored"] == ["c/x1", "c/y1", "c/z"]
    assert d["plan"]["ok"] is True


def test_merge_quiet_prints_only_the_summary(ws, tmp_path):
    out = tmp_path / "merged"
    r = run("merge", ws / "scopes.yaml", "-o", out, "--quiet")
    assert r.exit_code == 0
    assert len(r.stdout.splitlines()) == 1 and r.stdout.startswith("wrote 3 variables")
    assert r.stderr == ""  # no progress bar when stderr is not a terminal


def test_merge_update_state_makes_the_output_the_latest_checkpoint(ws, tmp_path):
    out = tmp_path / "run" / "merged-5"
    assert run("merge", ws / "scopes.yaml", "-o", out, "--update-state", "-q").exit_code == 0
    rows = json.loads(run("checkpoints", tmp_path / "run", "--json").stdout)
    assert [(row["name"], row["step"], row["latest"]) for row in rows] == [("merged-5", 5, True)]


def test_merge_takes_the_output_from_the_config(ws, tmp_path):
    r = run("merge", ws / "withoutput.yaml", "-q")
    assert r.exit_code == 0, r.output
    assert sorted(cm.load(ws / "out" / "from-config")) == ["b1", "b2"]


def test_merge_without_an_output_is_an_error(ws):
    assert_one_line_error(run("merge", ws / "merge.yaml"), "no output: pass -o OUT_PREFIX")


def test_merge_template_and_model_together_is_an_error(ws, tmp_path):
    assert_one_line_error(run("merge", ws / "merge.yaml", "-o", tmp_path / "m", "--template", ws / "C",
                              "--model", "x:y"), "either --template PATH or --model MODULE:FUNCTION")


def test_merge_bad_config_exits_2(ws, tmp_path):
    bad = write_config(tmp_path / "bad.yaml", "sources: []\n")
    r = run("merge", bad, "-o", tmp_path / "m")
    assert r.exit_code == 2 and "expected at least one source" in r.stderr


def test_merge_without_model_does_not_import_tensorflow(ws, tmp_path):
    res = run_subprocess(["merge", ws / "merge.yaml", "-o", tmp_path / "m", "--template", ws / "C"], tmp_path)
    assert res["code"] == 0, res["stderr"]
    assert res["tf_modules"] == []


def _run_on_a_terminal(args, tmp_path):
    """Run ``python -m ckptmerge ARGS`` with stderr on a pseudo-terminal; return what it drew there."""
    master, slave = pty.openpty()
    env = dict(os.environ, PYTHONPATH=str(REPO), COLUMNS="100")
    proc = subprocess.Popen([sys.executable, "-m", "ckptmerge", *map(str, args)], stdout=subprocess.PIPE,
                            stderr=slave, env=env, cwd=tmp_path)
    os.close(slave)
    chunks = []
    while True:
        try:
            data = os.read(master, 4096)
        except OSError:  # EIO: the child closed the terminal
            break
        if not data:
            break
        chunks.append(data)
    proc.wait(timeout=60)
    os.close(master)
    return proc.returncode, b"".join(chunks).decode("utf-8", "replace")


def test_merge_shows_a_progress_bar_with_bytes_and_rate_on_a_terminal(ws, tmp_path):
    code, drawn = _run_on_a_terminal(["merge", ws / "scopes.yaml", "-o", tmp_path / "m"], tmp_path)
    assert code == 0, drawn
    assert "Merging" in drawn and "100%" in drawn
    assert "B/" in drawn and "/s" in drawn  # bytes done/total and the rate


def test_merge_quiet_shows_no_progress_bar_on_a_terminal(ws, tmp_path):
    code, drawn = _run_on_a_terminal(["merge", ws / "scopes.yaml", "-o", tmp_path / "m", "--quiet"], tmp_path)
    assert code == 0, drawn
    assert "Merging" not in drawn


def test_verbose_logs_what_the_library_does_on_stderr(ws, tmp_path):
    res = run_subprocess(["-v", "merge", ws / "scopes.yaml", "-o", tmp_path / "m", "-q"], tmp_path)
    assert res["code"] == 0, res["stderr"]
    assert "INFO: merged 3 tensors from 2 source(s)" in res["stderr"]
    quiet = run_subprocess(["merge", ws / "scopes.yaml", "-o", tmp_path / "m2", "-q"], tmp_path)
    assert "INFO:" not in quiet["stderr"]


def test_merge_durable_writes_the_same_checkpoint(ws, tmp_path):
    r = run("merge", ws / "scopes.yaml", "-o", tmp_path / "durable", "--durable", "-q")
    assert r.exit_code == 0, r.output
    assert run("merge", ws / "scopes.yaml", "-o", tmp_path / "plain", "-q").exit_code == 0
    assert run("diff", tmp_path / "durable", tmp_path / "plain", "--values").exit_code == 0
