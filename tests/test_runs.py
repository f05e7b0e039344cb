"""One notion of "the checkpoints of a run" for every command.

A training directory is listed by one piece of code (``ckptmerge.sources.runs``), so
``checkpoints``, ``combine``/``average --last``, ``watch``, the latest checkpoint of a directory
(``cm.load``, ``Source``) and ``step=`` see the same checkpoints with the same steps, whatever the
trainer named them: TF bundles, Keras weights files, ``model-N.safetensors`` files, step folders
(``checkpoint-500/``, ``step_100/``, ``100/``). Two checkpoints of one step are never silently
reduced to one: every command that would pick that step refuses it, naming both.
"""

from __future__ import annotations

import json
import logging
import os

import numpy as np
import pytest

import ckptmerge as cm
from _cli_util import run as cli
from _runs_util import KINDS, loaded, names, write_bundle, write_run, write_safetensors
from ckptmerge.core.errors import ArgumentError, CkptMergeError
from ckptmerge.sources.resolve import resolve_checkpoint

STEPS = (3, 10, 20)  # 3 < 10 < 20 as numbers, "10" < "20" < "3" as text: order is by number


def _expected(kind, run):
    pattern = KINDS[kind][0]
    return [(pattern.format(s), s) for s in STEPS]


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_every_command_sees_the_same_checkpoints_of_a_run(kind, tmp_path):
    run = tmp_path / "run"
    paths = write_run(run, kind, STEPS)
    expected = _expected(kind, run)
    assert names(cm.checkpoints(run), run) == expected
    assert names(cm.watch(run, timeout=0), run) == expected
    assert [(i.path, i.step) for i in cm.watch(run, timeout=0)] == [(paths[s], s) for s in STEPS]
    listed = cli("checkpoints", run, "--json")
    assert listed.exit_code == 0, listed.output
    assert [(c["name"], c["step"]) for c in json.loads(listed.stdout)] == expected
    # the latest of the directory (no state file: the highest step), and each step by number
    assert loaded(run) == 20.0
    assert resolve_checkpoint(run).step == 20
    for s in STEPS:
        assert loaded(run, step=s) == float(s)
        assert resolve_checkpoint(run, step=s).step == s
    # average --last N: the N highest steps
    out = tmp_path / "avg.safetensors"
    res = cli("average", run, "--last", "2", "-o", out, "--quiet")
    assert res.exit_code == 0, res.output
    assert loaded(out) == 15.0
    src = cm.combine(str(run), last=2)
    assert sorted(s.path for s in src.inputs) == sorted(paths[s] for s in (10, 20))


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_a_step_not_in_the_run_is_not_found_and_the_steps_there_are_listed(kind, tmp_path):
    write_run(tmp_path, kind, STEPS)
    with pytest.raises(cm.CheckpointNotFoundError, match="steps there: 3, 10, 20"):
        resolve_checkpoint(tmp_path, step=4)


def test_checkpoints_of_several_kinds_in_one_run_are_listed_together_by_step(tmp_path):
    write_bundle(tmp_path / "ckpt-1", 1)
    write_safetensors(tmp_path / "model-2.safetensors", 2)
    write_run(tmp_path, "hf-step-folders", [3])
    assert names(cm.checkpoints(tmp_path), tmp_path) == [("ckpt-1", 1), ("model-2.safetensors", 2),
                                                         ("checkpoint-3", 3)]
    assert names(cm.watch(tmp_path, timeout=0), tmp_path) == [("ckpt-1", 1), ("model-2.safetensors", 2),
                                                              ("checkpoint-3", 3)]


def test_a_folder_with_a_step_in_its_name_that_holds_no_checkpoint_is_not_one(tmp_path):
    write_run(tmp_path, "tf-bundles", [1, 2])
    (tmp_path / "logs_7").mkdir()
    (tmp_path / "logs_7" / "events.out.tfevents.1.host").write_bytes(b"x" * 10)
    (tmp_path / "eval_9").mkdir()
    assert names(cm.checkpoints(tmp_path), tmp_path) == [("ckpt-1", 1), ("ckpt-2", 2)]
    assert loaded(tmp_path) == 2.0


def test_shards_of_one_safetensors_set_are_not_steps(tmp_path):
    write_safetensors(tmp_path / "model-00001-of-00002.safetensors", 1)
    write_run(tmp_path, "safetensors-files", [5])
    assert names(cm.checkpoints(tmp_path), tmp_path) == [("model-5.safetensors", 5)]


def test_temporary_step_folders_are_not_checkpoints_of_the_run(tmp_path):
    write_run(tmp_path, "hf-step-folders", [1])
    write_run(tmp_path, "hf-step-folders", [2], name="tmp-checkpoint-{}")
    write_run(tmp_path, "numbered-folders", [3], name="{}.orbax-checkpoint-tmp-1733")
    assert names(cm.checkpoints(tmp_path), tmp_path) == [("checkpoint-1", 1)]
    assert loaded(tmp_path) == 1.0


def test_average_last_never_counts_a_checkpoint_without_a_step_as_a_late_one(tmp_path):
    # A stray 'best' checkpoint has no place in the order of steps: it is not one of the last N.
    write_run(tmp_path, "tf-bundles", [1, 2, 3])
    write_bundle(tmp_path / "best", 100)
    src = cm.combine(str(tmp_path), last=2)
    assert sorted(os.path.basename(s.path) for s in src.inputs) == ["ckpt-2", "ckpt-3"]


def test_a_folder_of_safetensors_step_files_is_a_run_not_one_checkpoint(tmp_path):
    # It read as one checkpoint whose files each held the same tensor ("stored twice").
    write_run(tmp_path, "safetensors-files", [1, 2])
    assert resolve_checkpoint(tmp_path).prefix == str(tmp_path / "model-2.safetensors")
    # a folder of one model's shards is still one checkpoint
    shards = tmp_path / "hf"
    shards.mkdir()
    write_safetensors(shards / "model-00001-of-00002.safetensors", 1)
    from safetensors.numpy import save_file

    save_file({"b": np.zeros(2, np.float32)}, str(shards / "model-00002-of-00002.safetensors"))
    r = resolve_checkpoint(shards)
    assert (r.prefix, r.format) == (str(shards), "safetensors")
    assert cm.checkpoints(shards) == []


# ---------------------------------------------------------------------------------------------
# two checkpoints of one step (30.11): never silently reduced to one

DUPLICATES = {
    "bundles-007-and-7": (lambda d: (write_bundle(d / "model-007", 70), write_bundle(d / "model-7", 7)),
                          ["model-007", "model-7"]),
    "safetensors-007-and-7": (lambda d: (write_safetensors(d / "model-007.safetensors", 70),
                                         write_safetensors(d / "model-7.safetensors", 7)),
                              ["model-007.safetensors", "model-7.safetensors"]),
    "folders-07-and-7": (lambda d: (write_run(d, "hf-step-folders", [70], name="checkpoint-07"),
                                    write_run(d, "hf-step-folders", [7], name="checkpoint-7")),
                         ["checkpoint-07", "checkpoint-7"]),
    "bundle-and-keras-file": (lambda d: (write_bundle(d / "ckpt-7", 70),
                                         write_run(d, "keras-weights", [7])),
                              ["ckpt-7", "ckpt-7.weights.h5"]),
}


@pytest.fixture(params=sorted(DUPLICATES))
def twice(request, tmp_path):
    """A run with steps 1 and 5, and two checkpoints of step 7 (the highest)."""
    make, both = DUPLICATES[request.param]
    write_run(tmp_path, "tf-bundles", [1, 5])
    make(tmp_path)
    return tmp_path, both


def _names_both(message, run, both):
    return all(os.path.join(str(run), n) in message or f"'{n}'" in message for n in both)


def test_two_checkpoints_of_one_step_are_both_listed_and_said(twice, caplog):
    run, both = twice
    with caplog.at_level(logging.WARNING, logger="ckptmerge"):
        infos = cm.checkpoints(run)
    assert sorted(n for n, s in names(infos, run) if s == 7) == sorted(both)
    assert any("step 7" in r.getMessage() and _names_both(r.getMessage(), run, both) for r in caplog.records)
    res = cli("checkpoints", run)
    assert res.exit_code == 0
    assert "2 checkpoints of step 7" in res.stdout and all(n in res.stdout for n in both)


def test_the_latest_of_a_run_whose_highest_step_is_twice_is_refused_naming_both(twice):
    run, both = twice
    for call in (lambda: cm.load(run), lambda: resolve_checkpoint(run), lambda: resolve_checkpoint(run, step=7)):
        with pytest.raises(ArgumentError) as err:
            call()
        assert "step 7" in str(err.value) and _names_both(str(err.value), run, both), str(err.value)
    assert loaded(run, step=5) == 5.0  # the other steps are still there


def test_average_last_refuses_a_step_held_twice_naming_both(twice, tmp_path):
    run, both = twice
    with pytest.raises(CkptMergeError) as err:
        cm.combine(str(run), last=2)
    assert "step 7" in str(err.value) and _names_both(str(err.value), run, both)
    res = cli("average", run, "--last", "2", "-o", tmp_path / "avg.safetensors")
    assert res.exit_code == 2 and "step 7" in res.stderr
    cm.combine(str(run), steps=[1, 5])  # a selection without it is fine


def test_watch_reports_a_step_held_twice_naming_both_and_follows_the_others(twice):
    run, both = twice
    skipped = []
    got = [i.step for i in cm.watch(run, timeout=0, on_skip=lambda i, e: skipped.append((i.step, str(e))))]
    assert got == [1, 5]
    assert [s for s, _ in skipped] == [7]
    assert _names_both(skipped[0][1], run, both), skipped


def test_a_second_checkpoint_of_a_step_already_yielded_is_reported(tmp_path):
    write_run(tmp_path, "tf-bundles", [1, 7])
    skipped = []
    loop = cm.watch(tmp_path, timeout=5, poll=0.02, on_skip=lambda i, e: skipped.append((i.path, str(e))))
    assert [next(loop).step, next(loop).step] == [1, 7]
    write_bundle(tmp_path / "ckpt-07", 70)
    write_bundle(tmp_path / "ckpt-8", 8)
    assert next(loop).step == 8
    loop.close()
    assert [os.path.basename(p) for p, _ in skipped] == ["ckpt-07"]
    assert "ckpt-7" in skipped[0][1] and "step 7" in skipped[0][1]


# ---------------------------------------------------------------------------------------------
# file:// is the same folder


def test_checkpoints_of_a_file_url_lists_what_the_plain_path_lists(tmp_path):
    write_bundle(tmp_path / "ckpt-1", 1)
    write_run(tmp_path, "keras-weights", [2])
    write_run(tmp_path, "safetensors-files", [3])
    write_run(tmp_path, "hf-step-folders", [4])
    write_bundle(tmp_path / "best", 0)  # no step, no state file
    plain = cm.checkpoints(tmp_path)
    assert len(plain) == 5
    for url in (f"file://{tmp_path}", f"file://localhost{tmp_path}"):
        assert cm.checkpoints(url) == plain
        a, b = cli("checkpoints", tmp_path, "--json"), cli("checkpoints", url, "--json")
        assert json.loads(a.stdout) == json.loads(b.stdout)
        assert cli("checkpoints", url).stdout == cli("checkpoints", tmp_path).stdout
        assert loaded(url) == loaded(tmp_path) == 4.0


def test_a_folder_that_is_one_checkpoint_and_holds_a_run_is_ambiguous(tmp_path):
    write_safetensors(tmp_path / "model.safetensors", 100)  # the final model, beside the run's step folders
    write_run(tmp_path, "hf-step-folders", [1, 2])
    with pytest.raises(ArgumentError, match=r"holds a checkpoint of its own .*model.safetensors.*\(steps 1, 2\)"):
        cm.load(tmp_path)
    assert loaded(tmp_path, step=2) == 2.0
    assert loaded(tmp_path / "model.safetensors") == 100.0
    assert names(cm.checkpoints(tmp_path), tmp_path) == [("checkpoint-1", 1), ("checkpoint-2", 2)]


@pytest.fixture
def memory_copy(tmp_path):
    """``copy(local folder) -> URL``: the folder copied file by file to ``memory://``."""
    import fsspec

    fs = fsspec.filesystem("memory")
    base = f"memory://runs-{os.getpid()}-{tmp_path.name}"

    def copy(local):
        for root, _, files in os.walk(local):
            for f in files:
                p = os.path.join(root, f)
                fs.pipe_file(f"{base}/{os.path.relpath(p, local)}", open(p, "rb").read())
        return base

    yield copy
    if fs.exists(base):
        fs.rm(base, recursive=True)


@pytest.mark.parametrize("kind", ["tf-bundles", "safetensors-files", "hf-step-folders", "numbered-folders"])
def test_a_run_by_url_is_the_same_run(kind, tmp_path, memory_copy):
    run = tmp_path / "run"
    write_run(run, kind, STEPS)
    url = memory_copy(run)
    expected = [(f"{url}/{KINDS[kind][0].format(s)}", s) for s in STEPS]
    assert [(c.path, c.step) for c in cm.checkpoints(url)] == expected
    assert [(i.path, i.step) for i in cm.watch(url, timeout=0)] == expected
    assert loaded(url) == 20.0 and loaded(url, step=10) == 10.0
    assert sorted(s.path for s in cm.combine(url, last=2).inputs) == sorted(p for p, s in expected if s >= 10)
