"""``ckptmerge combine`` / ``ckptmerge average`` and the ``combine:`` config section."""

from __future__ import annotations

import json
import os
import pty
import subprocess
import sys

import numpy as np
import pytest
from _cli_util import REPO, assert_one_line_error, run
from test_combine import STEPS, mean_of, values, write, write_run

import ckptmerge as cm
from ckptmerge.cli.combine import parse_params, parse_steps
from ckptmerge.core.errors import ConfigError
from ckptmerge.combining.methods import combine_arrays


@pytest.fixture
def run_dir(tmp_path):
    return write_run(tmp_path / "run")


def test_average_of_the_last_five_writes_the_mean(run_dir, tmp_path):
    r = run("average", run_dir, "--last", 5, "-o", tmp_path / "avg")
    assert r.exit_code == 0, r.output
    first, second = r.stdout.splitlines()[:2]  # which steps it averaged, in the text output too
    assert first == "mean of 5 inputs (steps 100, 200, 300, 400, 500): 4 tensors (1 copied (last))", first
    assert second.startswith("wrote 4 variables from 1 source to ")
    got = cm.load(str(tmp_path / "avg"))
    np.testing.assert_array_equal(got["dense/kernel"], mean_of(STEPS, "dense/kernel"))


def test_combine_ties_with_per_glob_parameters(run_dir, tmp_path):
    r = run("combine", run_dir / "ckpt-200", run_dir / "ckpt-300", "-m", "ties", "--base", run_dir / "ckpt-100",
            "--param", "density[dense/*]=0.3", "--param", "density=0.8", "-o", tmp_path / "t.safetensors", "-q")
    assert r.exit_code == 0, r.output
    assert r.stdout.strip().startswith("wrote 4 variables")
    got = cm.load(str(tmp_path / "t.safetensors"))
    want = combine_arrays("ties", [values(s)["dense/bias"] for s in (200, 300)], values(100)["dense/bias"], density=0.3)
    np.testing.assert_array_equal(got["dense/bias"], want.astype(np.float32))


def test_dry_run_json_names_each_input_and_writes_nothing(run_dir, tmp_path):
    r = run("average", run_dir, "--steps", "200:400", "--dry-run", "--json", "-o", tmp_path / "x")
    assert r.exit_code == 0, r.output
    data = json.loads(r.stdout)
    assert [d["step"] for d in data["combine"]["inputs"]] == [200, 300, 400]
    assert data["merge"]["dry_run"] is True and not list(tmp_path.glob("x*"))
    r = run("combine", run_dir, "--every", 200, "--dry-run")
    assert r.exit_code == 0 and "mean of 2 inputs (steps 200, 400): 4 tensors (1 copied (last))" in r.stdout and "'ckpt-400'" in r.stdout


def test_inputs_that_do_not_line_up_are_listed_at_once(run_dir, tmp_path):
    other = write(tmp_path / "other", {"dense/kernel": np.zeros((2, 2), np.float32)})
    r = run("combine", run_dir / "ckpt-100", other, "-o", tmp_path / "o")
    assert r.exit_code == 2 and r.stdout == ""
    assert "'dense/bias' is missing from" in r.stderr and "'dense/kernel' differs" in r.stderr
    assert "keys='intersection'" in r.stderr


def test_bad_options_are_one_line_errors(run_dir, tmp_path):
    assert_one_line_error(run("combine", run_dir, "--last", 9, "-o", tmp_path / "o"), "fewer than last=9")
    assert_one_line_error(run("combine", run_dir / "ckpt-100", run_dir / "ckpt-200", "--last", 1, "-o", "o"),
                          "exactly one directory")
    assert_one_line_error(run("combine", run_dir / "ckpt-100", run_dir / "ckpt-200", "-m", "ties", "-o", "o"),
                          "needs base=")
    assert_one_line_error(run("combine", run_dir, "--param", "density", "-o", "o"), "KEY=VALUE")
    assert_one_line_error(run("combine", run_dir, "--steps", "a:b", "-o", "o"), "--steps takes")
    assert_one_line_error(run("average", run_dir, "--last", 2), "no output")


def test_parsing_params_and_steps():
    assert parse_params(["t=0.3", "consensus=ties", "normalize=false"]) == {"t": 0.3, "consensus": "ties",
                                                                            "normalize": False}
    assert parse_steps("100:") == (100, None)


def test_progress_bar_draws_on_a_terminal(run_dir, tmp_path):
    master, slave = pty.openpty()
    proc = subprocess.run([sys.executable, "-m", "ckptmerge", "average", str(run_dir), "--last", "2", "-o",
                           str(tmp_path / "p")], stdin=slave, stdout=subprocess.PIPE, stderr=slave, cwd=str(REPO),
                          env={**os.environ, "PYTHONPATH": str(REPO)}, timeout=120)
    os.close(slave)
    err = b""
    try:
        while True:
            chunk = os.read(master, 65536)
            if not chunk:
                break
            err += chunk
    except OSError:
        pass
    os.close(master)
    assert proc.returncode == 0, err
    assert b"Combining" in err


# -- config -----------------------------------------------------------------------------------


def test_combine_section_is_validated_with_file_and_line(tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("combine:\n  method: ties\n  base: b\n  models:\n    - path: a\n      weight: heavy\n"
                   "  parameters:\n    density: {'*attn*': 0.3, '*': 1.5}\n    denisty: 3\n  keys: strickt\n")
    with pytest.raises(ConfigError) as e:
        cm.load_config(str(cfg))
    text = str(e.value)
    assert "c.yaml:3 combine.base.path: checkpoint 'b' not found" in text
    assert "c.yaml:6 combine.models[0].weight: expected a number or a gradient list of numbers, received string 'heavy'" in text
    assert "c.yaml:8 combine.parameters.density['*']: density must be a number in (0, 1]; received 1.5 (type float)" in text
    assert "c.yaml:9 combine.parameters.denisty: method 'ties' has no parameter 'denisty'" in text
    assert "Did you mean 'density'?" in text
    assert "c.yaml:10 combine.keys: expected one of 'strict', 'intersection', 'union'" in text
    with pytest.raises(ConfigError, match="either 'models'.*or 'run'"):
        cm.load_config({"combine": {"method": "mean"}})


def test_combine_section_round_trips_and_makes_the_source(run_dir, tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text(f"combine:\n  method: ties\n  base: {run_dir}/ckpt-100\n  models:\n"
                   f"    - path: {run_dir}/ckpt-200\n      weight: 0.7\n"
                   f"    - {{path: {run_dir}/ckpt-300, weight: {{'dense/*': 0.2, '*': 0.4}}}}\n"
                   "  parameters:\n    density: {'*kernel*': 0.3, '*': 0.5}\n  dtype: float16\n"
                   f"output: {tmp_path}/out\n")
    c = cm.load_config(str(cfg))
    assert cm.load_config(c.to_dict()) == c
    [src] = c.make_sources()
    rep = src.report()
    assert rep.method == "ties" and [d["weight"] for d in rep.inputs] == [0.7, {"dense/*": 0.2, "*": 0.4}]
    r = run("merge", cfg)
    assert r.exit_code == 0, r.output
    got = cm.load(str(tmp_path / "out"))
    assert got["dense/kernel"].dtype == np.float16
    toml = tmp_path / "r.toml"
    toml.write_text(f'[combine]\nrun = "{run_dir}"\nlast = 2\nsteps = {{from = 100, to = 400}}\n')
    assert [d["step"] for d in cm.load_config(str(toml)).make_sources()[0].report().inputs] == [300, 400]


def test_warm_start_from_an_average(run_dir, tf):
    m = tf.Module()
    m.kernel = tf.Variable(tf.zeros((64, 33)))
    cfg = {"combine": {"run": str(run_dir), "last": 3, "include": ["dense/kernel"], "map": {"dense/kernel": "k"}}}
    report = cm.warm_start({"k": m.kernel}, cfg)
    assert report.restored == ["k"]
    np.testing.assert_array_equal(m.kernel.numpy(), mean_of((300, 400, 500), "dense/kernel"))


def test_docs_combine_example_loads(tmp_path):
    import re

    text = (REPO / "docs" / "config.md").read_text(encoding="utf-8")
    [block] = re.findall(r"<!-- tested: combine-example -->\n```yaml\n(.*?)```", text, re.S)
    for name in ("pretrained", "ft-qa", "ft-nli"):
        write(tmp_path / "runs" / name, values(100))
    (tmp_path / "c.yaml").write_text(block)
    cfg = cm.load_config(str(tmp_path / "c.yaml"))
    assert cfg.combine.method == "ties" and [w for _, w in cfg.combine.models] == [0.6, {"*attention*": 0.2, "*": 0.4}]
    assert cfg.make_sources()[0].report().method == "ties"


@pytest.mark.parametrize("keys,written,listed", [("union", {"x": 2.0, "y": 1.0}, "Combined over fewer inputs (1):\n  y: 1 of 2"),
                                                 ("intersection", {"x": 2.0}, "Left out (1):\n  y: in 1 of 2 inputs")])
def test_keys_union_and_intersection_write_from_the_cli_and_list_each_name(tmp_path, keys, written, listed):
    """Issue 30.9: the policy the command was given is the consent; nothing advises strict=False."""
    a = write(tmp_path / "a", {"x": np.ones(3, np.float32), "y": np.ones(2, np.float32)})
    b = write(tmp_path / "b", {"x": np.full(3, 3, np.float32)})
    out = tmp_path / "o.safetensors"
    r = run("combine", a, b, "--keys", keys, "-o", out)
    assert r.exit_code == 0, r.output
    assert listed in r.stdout and "strict=False" not in r.output
    got = cm.load(str(out))
    assert sorted(got) == sorted(written)
    for k, v in written.items():
        np.testing.assert_array_equal(got[k], np.full(got[k].shape, v, np.float32))
    r = run("combine", a, b, "-o", tmp_path / "strict.safetensors")  # the default still refuses, listing why
    assert r.exit_code == 2 and "'y' is missing from" in r.stderr and not list(tmp_path.glob("strict*"))
