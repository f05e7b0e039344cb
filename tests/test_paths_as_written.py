"""Messages name a config's paths as written (issue 24, item 1), also after the config was read.

A config's ``path: ${DATA}/run/m.safetensors`` (or ``~/run/m``) is expanded before anything is
read. A problem found later (a damaged or truncated file, a file that is no checkpoint, an output
that exists, a missing shard) is raised by a reader that knows only the expanded path; every
message, report and log line still names the path as the config wrote it
(:func:`ckptmerge.core.redact.show_path_as`), never the variable's value. CLI runs assert the exit
code, no traceback and the spelling as written, for check, plan, merge and a restore.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from _cli_util import run

import ckptmerge as cm
from ckptmerge.core.redact import redact

W = np.arange(6, dtype=np.float32).reshape(2, 3)


@pytest.fixture
def data(tmp_path, monkeypatch):
    """``$DATA`` (its value: a folder with a good, a damaged and a non-checkpoint file) and a config writer."""
    from safetensors.numpy import save_file

    root = tmp_path / "secret-mount-7f3a"
    (root / "run").mkdir(parents=True)
    save_file({"w": W}, str(root / "run" / "good.safetensors"))
    good = (root / "run" / "good.safetensors").read_bytes()
    (root / "run" / "bad.safetensors").write_bytes(good[:-4])  # truncated: its header claims more
    (root / "run" / "notes.bin").write_bytes(b"not a checkpoint at all " * 8)
    monkeypatch.setenv("DATA", str(root))

    def config(path: str, **extra: str) -> str:
        lines = [f"{k}: {v}" for k, v in extra.items()]
        cfg = tmp_path / "c.yaml"
        cfg.write_text("\n".join(lines + ["sources:", f"  - path: {path}", ""]))
        return str(cfg)

    return root, config


def _names_as_written(r, written: str, value: str, code: int = 2) -> str:
    assert r.exit_code == code, (r.exit_code, r.output)
    assert "Traceback" not in r.output
    assert written in r.stderr, r.stderr
    assert value not in r.output, r.output  # the variable's value is never shown
    return r.stderr


@pytest.mark.parametrize("command", ["check", "plan", "merge"])
def test_a_missing_source_is_named_as_written_by_every_command(data, command, tmp_path):
    root, config = data
    cfg = config("${DATA}/run/nothere.safetensors")
    args = ["-o", tmp_path / "out.safetensors"] if command == "merge" else []
    _names_as_written(run(command, cfg, *args), "'${DATA}/run/nothere.safetensors'", str(root))


@pytest.mark.parametrize("name, says", [("bad.safetensors", "Cannot read safetensors file"),
                                        ("notes.bin", "is a file but not a checkpoint")])
def test_a_damaged_source_found_at_merge_time_is_named_as_written(data, tmp_path, name, says):
    root, config = data
    cfg = config(f"${{DATA}}/run/{name}")
    assert run("check", cfg).exit_code == 0  # the config is fine: the file is found, not read
    err = _names_as_written(run("merge", cfg, "-o", tmp_path / "out.safetensors"), f"${{DATA}}/run/{name}", str(root))
    assert says in err
    assert not (tmp_path / "out.safetensors").exists()


def test_a_damaged_source_found_at_plan_time_is_named_as_written(data, tmp_path):
    root, config = data
    from safetensors.numpy import save_file

    save_file({"w": W}, str(tmp_path / "target.safetensors"))
    cfg = config("${DATA}/run/bad.safetensors", target=str(tmp_path / "target.safetensors"))
    err = _names_as_written(run("plan", cfg), "${DATA}/run/bad.safetensors", str(root))
    assert "Cannot read safetensors file" in err


def test_an_existing_output_written_with_a_variable_is_named_as_written(data, tmp_path, monkeypatch):
    root, config = data
    out = tmp_path / "out-folder-9c1d"
    out.mkdir()
    (out / "merged.safetensors").write_bytes(b"old")
    monkeypatch.setenv("OUT", str(out))
    cfg = config("${DATA}/run/good.safetensors", output="${OUT}/merged.safetensors")
    err = _names_as_written(run("merge", cfg), "${OUT}/merged.safetensors", str(out))
    assert "--force" in err
    assert (out / "merged.safetensors").read_bytes() == b"old"


def test_a_home_path_is_named_with_its_tilde(data, tmp_path, monkeypatch):
    _, config = data
    home = tmp_path / "home-of-someone"
    (home / "run").mkdir(parents=True)
    (home / "run" / "notes.bin").write_bytes(b"not a checkpoint at all " * 8)
    monkeypatch.setenv("HOME", str(home))
    for path in ("~/run/missing.safetensors", "~/run/notes.bin"):
        cfg = config(path)
        _names_as_written(run("merge", cfg, "-o", tmp_path / "out.safetensors"), path, str(home))


def test_a_restore_from_a_config_names_the_source_as_written(data, tmp_path, tf):
    root, config = data
    from ckptmerge.config import load_config

    cfg = load_config(config("${DATA}/run/bad.safetensors"))
    target = {"w": tf.Variable(np.zeros((2, 3), np.float32))}
    with pytest.raises(cm.CheckpointFormatError) as e:
        cm.restore(target, cfg.make_sources())
    assert "${DATA}/run/bad.safetensors" in str(e.value) and str(root) not in str(e.value)
    assert e.value.path == str(root / "run" / "bad.safetensors")  # the data keeps the real path


def test_reports_and_json_name_the_source_as_written(data, tmp_path):
    root, config = data
    cfg = config("${DATA}/run/good.safetensors")
    r = run("merge", cfg, "-o", tmp_path / "out.safetensors", "--json")
    assert r.exit_code == 0, r.output
    assert str(root) not in r.stdout and "${DATA}/run/good.safetensors" in r.stdout
    assert json.dumps(str(root)) not in r.stdout
    from safetensors import safe_open

    with safe_open(str(tmp_path / "out.safetensors"), "np") as f:
        assert str(root) not in json.dumps(f.metadata())  # nor in what the output records


def test_only_whole_components_of_the_folder_are_shown_as_written(data):
    root, config = data
    from ckptmerge.config import load_config

    load_config(config("${DATA}/run/good.safetensors"))
    assert redact(f"{root}/run/x.index") == "${DATA}/run/x.index"
    assert redact(f"{root}-other/x") == f"{root}-other/x"  # another folder that starts alike
    assert redact(f"/elsewhere{root}/x") == f"/elsewhere{root}/x"
