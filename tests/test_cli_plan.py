"""The config commands ``ckptmerge check`` and ``ckptmerge plan``, and ``ckptmerge demo``.

Scenario (core issue): checkpoints A (a1, a2, a3) and B (b1, b2, b3) written by TF's Saver; the
target C needs a1 as c/x1 and b1 as c/y1, plus its own c/z. The target is given as a checkpoint
(--target), as a function building a tf.Module (--model, imports TF), or by the config's
``target`` key.
"""

from __future__ import annotations

import json
import sys

import numpy as np
import pytest
from _cli_util import MODELS_PY, assert_one_line_error, run, save_tf1, write_config

import ckptmerge as cm
from ckptmerge.config import load_config



@pytest.fixture(scope="module")
def ws(tmp_path_factory):
    """A workspace: checkpoints A (dir), B (prefix), target C, models.py and configs."""
    root = tmp_path_factory.mktemp("plan")
    for d in ("A", "B", "C"):
        (root / d).mkdir()
    save_tf1(root / "A" / "model", {"a1": np.ones((3, 4), np.float32), "a2": np.ones(4, np.float32),
                                    "a3": np.ones((2, 2), np.float32)}, step=10)
    save_tf1(root / "B" / "model", {"b1": np.ones(4, np.float32), "b2": np.ones(5, np.float32),
                                    "b3": np.ones(6, np.float32)}, step=10)
    save_tf1(root / "C" / "model", {"c/x1": np.zeros((3, 4), np.float32), "c/y1": np.zeros(4, np.float32),
                                    "c/z": np.zeros(2, np.float32)}, optimizer_slots=True)
    (root / "cm_test_models.py").write_text(MODELS_PY)
    write_config(root / "warm.yaml", """
        sources:
          - name: A
            path: A
            map: {a1: c/x1}
          - name: B
            path: B/model-10
            map: {b1: c/y1}
        allow_missing: [c/z]
    """)
    write_config(root / "nomissing.yaml", """
        sources:
          - {name: A, path: A, map: {a1: c/x1}}
          - {name: B, path: B/model-10, map: {b1: c/y1}}
    """)
    write_config(root / "withtarget.toml", """
        target = "C/model"
        allow_missing = ["c/z"]
        [[sources]]
        name = "A"
        path = "A"
        map = {a1 = "c/x1"}
        [[sources]]
        name = "B"
        path = "B/model-10"
        map = {b1 = "c/y1"}
    """)
    write_config(root / "lenient.json", json.dumps({
        "sources": [{"name": "A", "path": "A", "map": {"a1": "c/x1"}}], "strict": False, "target": "C/model"}))
    write_config(root / "bad.yaml", """
        sources:
          - name: A
            paht: A
            regex: [["^head/(.*", "x"]]
        on_conflict: frist
    """)
    return root


def _sources(config):
    cfg = load_config(config)
    return cfg, [cm.Source(**kw) for kw in cfg.source_kwargs()]


# --------------------------------------------------------------------------------------------
# check
# --------------------------------------------------------------------------------------------


def test_check_valid_config_prints_ok_with_the_number_of_sources(ws):
    r = run("check", ws / "warm.yaml")
    assert r.exit_code == 0, r.output
    assert r.stdout == "OK: 2 sources\nContacts no remote host: every path is local.\n"
    assert run("check", ws / "lenient.json").stdout.splitlines()[0] == "OK: 1 source"


def test_check_lists_every_problem_with_file_line_and_key_and_exits_2(ws):
    r = run("check", ws / "bad.yaml")
    assert r.exit_code == 2
    assert r.stdout == ""
    assert r.stderr == (
        "Error: 3 problems in " + str(ws / "bad.yaml") + ":\n"
        "  bad.yaml:3 sources[0]: unknown key 'paht'. Did you mean 'path'?\n"
        "  bad.yaml:4 sources[0].regex[0]: unbalanced parenthesis in '^head/(.*'\n"
        "  bad.yaml:5 on_conflict: expected one of 'error', 'first', 'last', received string 'frist'. "
        "Did you mean 'first'?\n")


def test_check_missing_config_file_exits_2(ws):
    r = run("check", ws / "nope.yaml")
    assert r.exit_code == 2 and "Traceback" not in r.stderr
    assert "config file not found" in r.stderr


# --------------------------------------------------------------------------------------------
# plan
# --------------------------------------------------------------------------------------------


def test_plan_against_a_target_checkpoint_prints_the_report_and_exits_0_when_clean(ws):
    r = run("plan", ws / "warm.yaml", "--target", ws / "C")
    assert r.exit_code == 0, r.output
    cfg, sources = _sources(ws / "warm.yaml")
    expected = cm.plan(cm.list_variables(ws / "C", optimizer=False), sources, **cfg.plan_options).report(limit=50)
    assert r.stdout == expected + "\n"
    assert "  c/x1 <- A:'a1' float32 (3, 4)\n  c/y1 <- B:'b1' float32 (4,)\n" in r.stdout
    assert r.stdout.splitlines()[-1] == "OK: nothing blocks a strict restore"


def test_plan_target_leaves_out_the_target_checkpoints_optimizer_state(ws):
    d = json.loads(run("plan", ws / "warm.yaml", "--target", ws / "C", "--json").stdout)
    assert [t["name"] for t in d["targets"]] == ["c/x1", "c/y1", "c/z"]


def test_plan_with_strict_findings_exits_1(ws):
    r = run("plan", ws / "nomissing.yaml", "--target", ws / "C")
    assert r.exit_code == 1, r.output
    assert "Missing (1) - map a checkpoint variable to each, or pass allow_missing:\n  c/z\n" in r.stdout
    assert r.stdout.splitlines()[-1] == "1 blocking finding (strict); 0 with strict=False"


def test_plan_json_is_the_plan_as_data(ws):
    r = run("plan", ws / "nomissing.yaml", "--target", ws / "C", "--json")
    assert r.exit_code == 1
    d = json.loads(r.stdout)
    assert d["ok"] is False and d["missing"] == ["c/z"]
    assert d["assignments"]["c/x1"]["source"] == "A" and d["assignments"]["c/x1"]["name"] == "a1"
    assert {"ok", "blocking", "options", "targets", "sources", "assignments", "missing", "mismatched",
            "conflicts", "unmatched_rules", "unused"} <= set(d)


def test_plan_takes_the_target_from_the_configs_target_key(ws):
    r = run("plan", ws / "withtarget.toml")
    assert r.exit_code == 0, r.output
    assert r.stdout.splitlines()[-1] == "OK: nothing blocks a strict restore"


def test_plan_with_strict_false_in_the_config_exits_0_when_only_strict_findings_remain(ws):
    r = run("plan", ws / "lenient.json")
    assert r.exit_code == 0, r.output
    assert r.stdout.splitlines()[-2:] == ["2 blocking findings (strict); 0 with strict=False",
                                          "strict: false in the config: nothing blocks the restore."]


def test_plan_without_a_target_is_an_error(ws):
    assert_one_line_error(run("plan", ws / "warm.yaml"), "no target to plan against", "--target PATH",
                          "--model MODULE:FUNCTION")


def test_plan_target_and_model_together_is_an_error(ws):
    assert_one_line_error(run("plan", ws / "warm.yaml", "--target", ws / "C", "--model", "m:f"),
                          "either --target PATH or --model MODULE:FUNCTION")


def test_plan_missing_target_checkpoint_is_a_one_line_error(ws):
    assert_one_line_error(run("plan", ws / "warm.yaml", "--target", ws / "nowhere"), "does not exist")


def test_plan_bad_config_lists_every_problem_and_exits_2(ws):
    r = run("plan", ws / "bad.yaml", "--target", ws / "C")
    assert r.exit_code == 2 and r.stdout == ""
    assert r.stderr.startswith(f"Error: 3 problems in {ws / 'bad.yaml'}:\n")
    assert "  bad.yaml:3 sources[0]: unknown key 'paht'. Did you mean 'path'?\n" in r.stderr


def test_plan_model_from_a_file_builds_the_target(ws):
    r = run("plan", ws / "warm.yaml", "--model", f"{ws / 'cm_test_models.py'}:build")
    assert r.exit_code == 0, r.output
    assert "  c/x1 <- A:'a1' float32 (3, 4)\n" in r.stdout
    assert r.stdout.splitlines()[-1] == "OK: nothing blocks a strict restore"


def test_plan_model_from_a_module_in_the_current_directory(ws, monkeypatch):
    monkeypatch.chdir(ws)
    monkeypatch.setattr(sys, "path", list(sys.path))
    monkeypatch.delitem(sys.modules, "cm_test_models", raising=False)
    r = run("plan", "warm.yaml", "--model", "cm_test_models:build", "--json")
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["ok"] is True
    sys.modules.pop("cm_test_models", None)


@pytest.mark.parametrize("spec, parts", [
    ("cm_test_models.py", ["--model expects MODULE:FUNCTION", "Received: 'cm_test_models.py'"]),
    ("{ws}/cm_test_models.py:biuld", ["has no function 'biuld'", "Did you mean 'build'?"]),
    ("{ws}/cm_test_models.py:broken", ["broken() raised RuntimeError: no GPU here"]),
    ("{ws}/cm_test_models.py:nothing", ["nothing() returned None"]),
    ("{ws}/cm_test_models.py:a_path", ["a_path() returned a str", "must return a Keras model, a tf.Module"]),
    ("{ws}/no_such_file.py:build", ["file", "no_such_file.py' does not exist"]),
    ("no_such_module_xyz:build", ["cannot import module 'no_such_module_xyz'"]),
])
def test_plan_model_errors_are_one_line(ws, spec, parts):
    assert_one_line_error(run("plan", ws / "warm.yaml", "--model", spec.format(ws=ws)), *parts)


# --------------------------------------------------------------------------------------------
# demo
# --------------------------------------------------------------------------------------------


def test_demo_prints_each_step_and_passes_every_check(tmp_path):
    r = run("demo", "--dir", tmp_path / "demo")
    assert r.exit_code == 0, r.output
    out = r.stdout
    assert out.startswith(f"Demo folder: {tmp_path / 'demo'}\n")
    assert "\n== Plan for model C (graph mode, before anything is restored) ==\n" in out
    assert "  c/x1 <- A:'a1' float32 (3, 4)\n" in out
    checks = out.split("\n== Checks ==\n")[1].splitlines()
    assert checks[-1].startswith("All ") and checks[-1].endswith(" checks passed.")
    assert all(line.startswith("PASS  ") for line in checks[:-1]) and len(checks) > 3


def test_plan_target_step_picks_a_step_of_the_target_directory(ws):
    assert_one_line_error(run("plan", ws / "warm.yaml", "--target", ws / "A", "--target-step", "99"),
                          "no checkpoint of step 99")
    assert_one_line_error(run("plan", ws / "warm.yaml", "--target-step", "10"), "--target-step needs --target PATH")
    r = run("plan", ws / "warm.yaml", "--target", ws / "A", "--target-step", "10", "--json")
    assert [t["name"] for t in json.loads(r.stdout)["targets"]] == ["a1", "a2", "a3"]


def test_demo_as_a_program_prints_no_tensorflow_start_up_chatter_and_removes_its_temporary_folder(tmp_path):
    import os
    import subprocess
    import sys

    env = dict(os.environ, TMPDIR=str(tmp_path))
    r = subprocess.run([sys.executable, "-m", "ckptmerge", "demo"], capture_output=True, text=True, timeout=300,
                       env=env)
    assert r.returncode == 0, r.stderr
    assert r.stderr.splitlines() == ["Running the ckptmerge demo (imports TensorFlow: a few seconds) ..."]
    assert r.stdout.rstrip().endswith("All 5 checks passed.")
    first = r.stdout.splitlines()[0]
    assert first.startswith(f"Demo folder: {tmp_path}{os.sep}ckptmerge-demo-") and first.endswith(
        " (temporary, removed; pass --dir to keep it)")
    assert not [n for n in os.listdir(tmp_path) if n.startswith("ckptmerge-demo-")]
