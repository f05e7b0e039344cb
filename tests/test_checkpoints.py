"""Checkpoint resolution: prefixes, files, directories, steps, SavedModels and state files.

Real checkpoints only: the corpus (written by other people with TF 0.x to 2.x and Keras 3) and
checkpoints written by TensorFlow in the test. Mutating tests copy corpus folders to tmp_path.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
from pathlib import Path

import numpy as np
import pytest

from _corpus import corpus
from ckptmerge.sources.resolve import (
    ArgumentError,
    ArgumentTypeError,
    CheckpointInfo,
    ResolvedCheckpoint,
    checkpoints,
    read_state_file,
    resolve_checkpoint,
)
from ckptmerge.core.errors import CheckpointFormatError, CheckpointNotFoundError, CkptMergeError

BUNDLE_FOLDERS = [
    "keras2-tfweights-cp-charity",
    "tf012-saver-lenet",
    "tf114-estimator-sharded-adult",
    "tf18sm-iris-keras",
    "tf21sm-sharded-ocr",
    "tf2obj-2025-ckptmanager-comp",
    "tfserving-tf214-half-plus-two",
]
COMP = "tf2obj-2025-ckptmanager-comp"
EST = "tf114-estimator-sharded-adult"
V1 = "tf0x-v1format-nxt"


def reference(folder):
    return json.loads((corpus() / folder / "reference.json").read_text())


def copy_folder(folder, dest: Path) -> Path:
    """Copy a read-only corpus folder into tmp_path and make it writable."""
    out = dest / folder
    shutil.copytree(corpus() / folder, out)
    for p in [out, *out.iterdir()]:
        p.chmod(p.stat().st_mode | stat.S_IWUSR)
    return out


@pytest.fixture
def in_corpus(monkeypatch):
    """Run with the corpus as current directory, so paths can be given relative."""
    monkeypatch.chdir(corpus())


# ---------------------------------------------------------------------------------------------
# the corpus


@pytest.mark.parametrize("folder", BUNDLE_FOLDERS)
def test_corpus_directory_resolves_to_the_reference_prefix(folder):
    r = resolve_checkpoint(corpus() / folder)
    assert r == ResolvedCheckpoint(str(corpus() / folder / reference(folder)["prefix"]), "tf-bundle",
                                   r.step, r.note)
    assert r.note


@pytest.mark.parametrize("folder", BUNDLE_FOLDERS)
def test_corpus_prefix_resolves_to_itself(folder):
    prefix = corpus() / folder / reference(folder)["prefix"]
    r = resolve_checkpoint(str(prefix))
    assert r.prefix == str(prefix) and r.format == "tf-bundle"
    assert r.note == f"checkpoint prefix {prefix}"


def test_keras3_weights_directory_and_file_resolve_to_keras_h5():
    h5 = corpus() / "keras3-weights-h5-churn" / "model.weights.h5"
    assert resolve_checkpoint(h5) == ResolvedCheckpoint(str(h5), "keras-h5", None,
                                                        f"Keras HDF5 weights file {h5}")
    r = resolve_checkpoint(corpus() / "keras3-weights-h5-churn")
    assert (r.prefix, r.format) == (str(h5), "keras-h5")


def test_latest_comes_from_the_state_file_not_the_largest_step(in_corpus):
    r = resolve_checkpoint(COMP)
    assert r.prefix == str(corpus() / COMP / "ckpt-1")
    assert r.step == 1
    assert r.note == f"latest checkpoint per {COMP}/checkpoint (step 1)"


def test_step_picks_that_checkpoint_from_a_directory(in_corpus):
    r = resolve_checkpoint(EST, step=0)
    assert r == ResolvedCheckpoint(str(corpus() / EST / "model.ckpt-0"), "tf-bundle", 0, f"step 0 of {EST}")
    assert resolve_checkpoint(COMP, step=10).prefix == str(corpus() / COMP / "ckpt-10")


def test_missing_step_lists_the_steps_there_and_never_falls_back(in_corpus):
    with pytest.raises(CheckpointNotFoundError) as err:
        resolve_checkpoint(EST, step=7)
    assert str(err.value) == (
        f"no checkpoint of step 7 in '{EST}'; steps there: 0, 5000. "
        f"Run 'ckptmerge checkpoints {EST}' to list them."
    )
    assert isinstance(err.value, FileNotFoundError) and err.value.path == EST


@pytest.mark.parametrize("name", ["model.ckpt-0.index", "model.ckpt-0.data-00001-of-00002"])
def test_index_or_data_file_means_its_prefix(in_corpus, name):
    r = resolve_checkpoint(f"{EST}/{name}")
    assert (r.prefix, r.step) == (str(corpus() / EST / "model.ckpt-0"), 0)
    assert r.note == f"prefix of {EST}/{name}"


def test_step_contradicting_the_prefix_is_an_error(in_corpus):
    with pytest.raises(ArgumentError) as err:
        resolve_checkpoint(f"{COMP}/ckpt-10", step=9)
    msg = str(err.value)
    assert f"step=9 was given, but checkpoint '{COMP}/ckpt-10' is step 10" in msg
    assert f"Source('{COMP}', step=9)" in msg and f"'ckptmerge ls {COMP} --step 9'" in msg
    assert isinstance(err.value, ValueError)


def test_step_with_a_prefix_without_step_is_an_error(in_corpus):
    with pytest.raises(ArgumentError, match="has no step in its name"):
        resolve_checkpoint("tf012-saver-lenet/model.ckpt", step=1)


def test_step_matching_the_prefix_is_accepted(in_corpus):
    assert resolve_checkpoint(f"{COMP}/ckpt-9", step=9).step == 9


def test_v1_file_resolves_to_itself(in_corpus):
    r = resolve_checkpoint(f"{V1}/model.ckpt")
    assert (r.prefix, r.format, r.step) == (str(corpus() / V1 / "model.ckpt"), "tf-v1", None)
    assert r.note == f"V1 checkpoint {V1}/model.ckpt"


def test_v1_directory_resolves_to_its_only_checkpoint(in_corpus):
    r = resolve_checkpoint(V1)
    assert (r.prefix, r.format) == (str(corpus() / V1 / "model.ckpt"), "tf-v1")
    assert [c.path for c in checkpoints(V1)] == [str(corpus() / V1 / "model.ckpt")]


def test_v1_sharded_checkpoint_named_by_its_prefix_in_a_state_file_resolves_to_the_set(tmp_path):
    # TF 0.x with Saver(sharded=True) wrote model.ckpt-100-00000-of-00001 and named
    # model.ckpt-100 in the state file.
    shutil.copy(corpus() / V1 / "model.ckpt", tmp_path / "model.ckpt-100-00000-of-00001")
    (tmp_path / "checkpoint").write_text('model_checkpoint_path: "model.ckpt-100"\n')
    pattern = f"{tmp_path}/model.ckpt-100-?????-of-00001"
    for path in (tmp_path, tmp_path / "model.ckpt-100", tmp_path / "model.ckpt-100-00000-of-00001", pattern):
        r = resolve_checkpoint(path)
        assert (r.prefix, r.format, r.step) == (pattern, "tf-v1", 100), path


@pytest.mark.parametrize("folder", ["keras2-tfweights-cp-charity", "tf012-saver-lenet", EST, COMP])
def test_read_state_file_matches_tensorflows_reading(folder):
    ref = reference(folder)["checkpoint_state_file"]
    st = read_state_file(corpus() / folder)
    d = str(corpus() / folder)
    assert st.path == os.path.join(d, "checkpoint") and st.directory == d
    assert st.model_checkpoint_path == os.path.join(d, ref["model_checkpoint_path"])
    assert st.all_model_checkpoint_paths == tuple(os.path.join(d, p) for p in ref["all_model_checkpoint_paths"])
    assert st.recorded_all_model_checkpoint_paths == tuple(ref["all_model_checkpoint_paths"])
    assert list(st.all_model_checkpoint_timestamps) == ref["all_model_checkpoint_timestamps"]
    assert (st.last_preserved_timestamp or 0.0) == ref["last_preserved_timestamp"]


def test_read_state_file_of_a_directory_without_one_is_none():
    assert read_state_file(corpus() / "tf18sm-iris-keras") is None


def test_checkpoints_lists_steps_latest_times_and_sizes():
    d = corpus() / COMP
    infos = checkpoints(d)
    assert [os.path.basename(c.path) for c in infos] == ["ckpt-1", "ckpt-9", "ckpt-10"]
    assert [c.step for c in infos] == [1, 9, 10]
    assert [c.latest for c in infos] == [True, False, False]
    ts = reference(COMP)["checkpoint_state_file"]["all_model_checkpoint_timestamps"]
    assert [c.time for c in infos] == [ts[2], ts[0], ts[1]]  # recorded times beat mtimes
    assert all(c.size == 1354 + 20720 for c in infos)
    assert all(isinstance(c, CheckpointInfo) for c in infos)


def test_checkpoint_size_counts_the_index_and_every_shard():
    infos = checkpoints(corpus() / EST)
    assert [(c.step, c.size, c.latest) for c in infos] == [(0, 1736 + 8 + 1284, False), (5000, 1736 + 8 + 1284, True)]


def test_checkpoint_time_is_the_index_mtime_without_recorded_times():
    (info,) = checkpoints(corpus() / "tf012-saver-lenet")
    assert info.time == os.path.getmtime(corpus() / "tf012-saver-lenet" / "model.ckpt.index")
    assert info.step is None and info.latest


def test_checkpoints_work_is_linear_in_the_number_of_checkpoints(tf, tmp_path, monkeypatch):
    # Regression: the directory was listed again for every checkpoint (its data shards) and the
    # state file scanned for every timestamp, so 5,000 checkpoints took 20 s. Count the work.
    from conftest import save_tf1

    seed = save_tf1(tmp_path / "seed" / "model", {"w": np.zeros(4, np.float32)})
    run = tmp_path / "run"
    run.mkdir()
    n = 40
    prefixes = [str(run / f"model-{100 * (i + 1)}") for i in range(n)]
    for p in prefixes:
        for ext in (".index", ".data-00000-of-00001"):
            os.link(seed + ext, p + ext)
    tf.compat.v1.train.update_checkpoint_state(str(run), prefixes[-1], all_model_checkpoint_paths=prefixes,
                                               all_model_checkpoint_timestamps=[float(i) for i in range(n)])
    calls = {"listdir": 0, "normpath": 0}

    def counting(name, real):
        def wrapper(*args, **kwargs):
            calls[name] += 1
            return real(*args, **kwargs)
        return wrapper

    monkeypatch.setattr(os, "listdir", counting("listdir", os.listdir))
    monkeypatch.setattr(os.path, "normpath", counting("normpath", os.path.normpath))
    infos = checkpoints(run)
    monkeypatch.undo()
    assert [c.path for c in infos] == prefixes
    assert [c.time for c in infos] == [float(i) for i in range(n)]
    assert all(c.size == infos[0].size > 0 for c in infos) and infos[-1].latest
    assert calls["listdir"] <= 2, calls  # once to find the checkpoints, once for their shards
    assert calls["normpath"] <= 5 * n, calls  # not one scan of the state file per checkpoint


def test_checkpoints_of_a_directory_without_checkpoints_is_empty(tmp_path):
    assert checkpoints(tmp_path) == []


def test_checkpoints_of_a_missing_directory_is_not_found(tmp_path):
    with pytest.raises(CheckpointNotFoundError, match="does not exist"):
        checkpoints(tmp_path / "nope")


def test_checkpoints_of_a_file_is_an_argument_error():
    with pytest.raises(ArgumentError, match="is not a directory"):
        checkpoints(corpus() / COMP / "checkpoint")


# ---------------------------------------------------------------------------------------------
# directories without a state file, and broken ones


def test_single_prefix_without_state_file_is_taken(in_corpus):
    r = resolve_checkpoint("tf18sm-iris-keras")
    assert r.prefix == str(corpus() / "tf18sm-iris-keras" / "variables")
    assert r.note == "only checkpoint in tf18sm-iris-keras (no 'checkpoint' state file)"


def test_without_state_file_the_highest_step_is_taken_and_said(tmp_path, monkeypatch):
    copy_folder(COMP, tmp_path)
    (tmp_path / COMP / "checkpoint").unlink()
    monkeypatch.chdir(tmp_path)
    r = resolve_checkpoint(COMP)
    assert r.prefix == str(tmp_path / COMP / "ckpt-10") and r.step == 10
    assert r.note == f"no 'checkpoint' state file in {COMP}; took the highest step 10 of 3 checkpoints"


def test_several_unnumbered_prefixes_without_state_file_are_ambiguous(tmp_path):
    for name in ("a", "b"):
        for ext in (".index", ".data-00000-of-00001"):
            shutil.copy(corpus() / "tf18sm-iris-keras" / f"variables{ext}", tmp_path / f"{name}{ext}")
    with pytest.raises(ArgumentError) as err:
        resolve_checkpoint(tmp_path)
    msg = str(err.value)
    assert "holds 2 checkpoints" in msg and f"'{tmp_path}/a'" in msg and "cannot tell" in msg


def test_state_file_naming_a_missing_index_names_both(tmp_path, monkeypatch):
    d = copy_folder(COMP, tmp_path)
    (d / "ckpt-1.index").unlink()
    monkeypatch.chdir(tmp_path)
    with pytest.raises(CheckpointNotFoundError) as err:
        resolve_checkpoint(COMP)
    msg = str(err.value)
    assert f"'{COMP}/checkpoint' names 'ckpt-1' as the latest checkpoint" in msg
    assert f"'{COMP}/ckpt-1.index' does not exist" in msg
    assert "Steps there: 9, 10" in msg


def test_absolute_state_paths_from_another_machine_fall_back_to_the_directory(tmp_path):
    d = copy_folder(EST, tmp_path)
    (d / "checkpoint").write_text(
        'model_checkpoint_path: "/home/someone/adult/model.ckpt-5000"\n'
        'all_model_checkpoint_paths: "/home/someone/adult/model.ckpt-0"\n'
        'all_model_checkpoint_paths: "/home/someone/adult/model.ckpt-5000"\n'
    )
    st = read_state_file(d)
    assert st.model_checkpoint_path == str(d / "model.ckpt-5000")
    assert st.all_model_checkpoint_paths == (str(d / "model.ckpt-0"), str(d / "model.ckpt-5000"))
    assert st.recorded_model_checkpoint_path == "/home/someone/adult/model.ckpt-5000"
    r = resolve_checkpoint(d)
    assert r.prefix == str(d / "model.ckpt-5000")
    assert "recorded as '/home/someone/adult/model.ckpt-5000'" in r.note
    assert [c.latest for c in checkpoints(d)] == [False, True]


def test_absolute_state_path_missing_everywhere_names_both_places(tmp_path):
    d = copy_folder(EST, tmp_path)
    (d / "checkpoint").write_text('model_checkpoint_path: "/elsewhere/model.ckpt-9"\n')
    with pytest.raises(CheckpointNotFoundError) as err:
        resolve_checkpoint(d)
    assert "'/elsewhere/model.ckpt-9.index' does not exist" in str(err.value)
    assert f"(nor does '{d}/model.ckpt-9.index')" in str(err.value)


def test_unparsable_state_file_is_a_format_error_with_the_line(tmp_path):
    d = copy_folder(EST, tmp_path)
    (d / "checkpoint").write_text('model_checkpoint_path: "model.ckpt-0"\nthis is not a proto\n')
    with pytest.raises(CheckpointFormatError) as err:
        resolve_checkpoint(d)
    assert err.value.path == f"{d}/checkpoint"
    assert "at line 2" in str(err.value) and "Cannot parse the checkpoint state file" in str(err.value)


def test_state_file_written_by_tensorflow_with_escapes_reads_like_tensorflow(tf, tmp_path):
    names = ["caf\u00e9-1", 'we"ird\\name-2', "plain-3"]
    tf.compat.v1.train.update_checkpoint_state(
        str(tmp_path), names[-1], all_model_checkpoint_paths=names,
        all_model_checkpoint_timestamps=[1.5, 2.25, 1e9], last_preserved_timestamp=0.5)
    ours = read_state_file(tmp_path)
    theirs = tf.train.get_checkpoint_state(str(tmp_path))
    assert ours.model_checkpoint_path == theirs.model_checkpoint_path
    assert list(ours.all_model_checkpoint_paths) == list(theirs.all_model_checkpoint_paths)
    assert list(ours.all_model_checkpoint_timestamps) == list(theirs.all_model_checkpoint_timestamps)
    assert ours.last_preserved_timestamp == theirs.last_preserved_timestamp


def test_state_file_given_directly_means_its_directory(in_corpus):
    assert resolve_checkpoint(f"{COMP}/checkpoint").prefix == str(corpus() / COMP / "ckpt-1")


def test_data_shard_without_its_index_is_not_found(tmp_path):
    d = copy_folder(EST, tmp_path)
    (d / "model.ckpt-0.index").unlink()
    shard = d / "model.ckpt-0.data-00000-of-00002"
    with pytest.raises(CheckpointNotFoundError, match=r"is a data shard, but its index file .*model\.ckpt-0\.index"):
        resolve_checkpoint(shard)


# ---------------------------------------------------------------------------------------------
# paths that are not there, or not checkpoints


def test_misspelt_prefix_suggests_the_sibling(tmp_path, monkeypatch):
    (tmp_path / "runs" / "A").mkdir(parents=True)
    for step in (1, 9, 10):
        for ext in (".index", ".data-00000-of-00001"):
            shutil.copy(corpus() / COMP / f"ckpt-1{ext}", tmp_path / "runs" / "A" / f"model-{step}{ext}")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(CheckpointNotFoundError) as err:
        resolve_checkpoint("runs/A/model-1O")
    msg = str(err.value)
    assert msg.startswith("Checkpoint path 'runs/A/model-1O' does not exist")
    assert "Did you mean 'runs/A/model-10'?" in msg
    assert "Run 'ckptmerge checkpoints runs/A' to list the checkpoints there." in msg
    assert err.value.path == "runs/A/model-1O"


def _make_odd(path, kind):
    """Put something that is not a regular file at ``path``."""
    if kind == "a directory":
        path.mkdir()
    elif kind == "a FIFO (named pipe)":
        os.mkfifo(path)
    elif kind == "a dangling symbolic link":
        path.symlink_to(path.parent / "gone")
    else:  # a symbolic link to a directory
        path.symlink_to(path.parent)


ODD = ["a directory", "a FIFO (named pipe)", "a dangling symbolic link", "a symbolic link"]


@pytest.mark.parametrize("kind", ODD)
def test_index_that_is_not_a_regular_file_says_what_it_is(tmp_path, kind):
    # Regression: "'x/model-10' does not exist. Did you mean 'x/model-10'?"
    _make_odd(tmp_path / "model-10.index", kind)
    with pytest.raises(CheckpointNotFoundError) as err:
        resolve_checkpoint(tmp_path / "model-10")
    msg = str(err.value)
    assert f"'{tmp_path / 'model-10.index'}' is {kind}" in msg and "not a regular file" in msg, msg
    assert "does not exist" not in msg and "Did you mean" not in msg, msg


@pytest.mark.parametrize("kind", ["a FIFO (named pipe)", "a dangling symbolic link"])
@pytest.mark.parametrize("name", ["model-10.index", "model.weights.h5"])
def test_checkpoint_file_that_is_not_a_regular_file_says_what_it_is(tmp_path, kind, name):
    _make_odd(tmp_path / name, kind)
    with pytest.raises(CheckpointNotFoundError) as err:
        resolve_checkpoint(tmp_path / name)
    msg = str(err.value)
    assert f"Checkpoint path '{tmp_path / name}' is {kind}" in msg and "Did you mean" not in msg, msg


def test_a_misspelt_path_never_suggests_itself(tmp_path):
    (tmp_path / "model-10.data-00000-of-00001").write_bytes(b"")  # a shard without its index
    with pytest.raises(CheckpointNotFoundError) as err:
        resolve_checkpoint(tmp_path / "model-10")
    assert f"Did you mean '{tmp_path / 'model-10'}'" not in str(err.value)


def test_path_whose_directory_is_missing_says_so(tmp_path):
    with pytest.raises(CheckpointNotFoundError, match="nor does its directory"):
        resolve_checkpoint(tmp_path / "nope" / "model-10")


def test_empty_directory_says_what_was_looked_for(tmp_path):
    with pytest.raises(CheckpointNotFoundError) as err:
        resolve_checkpoint(tmp_path)
    msg = str(err.value)
    assert f"No checkpoint in directory '{tmp_path}'" in msg
    for looked_for in ("'checkpoint' state file", "'*.index'", "SavedModel", "'*.h5'"):
        assert looked_for in msg


def test_directory_whose_subdirectories_hold_checkpoints_points_at_them(tmp_path):
    copy_folder(COMP, tmp_path)
    with pytest.raises(CheckpointNotFoundError, match=f"Its subdirectories '{tmp_path}/{COMP}' hold checkpoints"):
        resolve_checkpoint(tmp_path)


def test_meta_file_suggests_the_prefix(tmp_path):
    d = copy_folder(EST, tmp_path)
    (d / "model.ckpt-0.meta").write_bytes(b"\x0a\x00graph")
    with pytest.raises(CheckpointFormatError) as err:
        resolve_checkpoint(d / "model.ckpt-0.meta")
    assert f"Did you mean the checkpoint prefix '{d}/model.ckpt-0'?" in str(err.value)


def test_damaged_keras_archive_is_a_clear_error(tmp_path):
    (tmp_path / "model.keras").write_bytes(b"PK\x03\x04")
    with pytest.raises(CheckpointFormatError, match="model.weights.h5"):
        resolve_checkpoint(tmp_path / "model.keras")


def test_other_file_is_not_a_checkpoint(in_corpus):
    with pytest.raises(CheckpointFormatError, match="is a file but not a checkpoint"):
        resolve_checkpoint("README.md")


def test_saved_model_without_variables_is_not_found(tmp_path):
    (tmp_path / "saved_model.pb").write_bytes(b"")
    with pytest.raises(CheckpointNotFoundError, match="SavedModel directory without variables"):
        resolve_checkpoint(tmp_path)


@pytest.mark.parametrize("step", [True, "10", 1.0])
def test_step_of_the_wrong_type_is_a_type_error(tmp_path, step):
    with pytest.raises(ArgumentTypeError) as err:
        resolve_checkpoint(tmp_path, step=step)
    assert isinstance(err.value, TypeError) and isinstance(err.value, CkptMergeError)
    assert f"Received: step={step!r}" in str(err.value)


def test_negative_step_is_a_value_error(tmp_path):
    with pytest.raises(ArgumentError, match=r"step must be >= 0. Received: step=-1") as err:
        resolve_checkpoint(tmp_path, step=-1)
    assert isinstance(err.value, ValueError)


@pytest.mark.parametrize("path", [None, 3, ""])
def test_path_of_the_wrong_type_or_empty_is_an_argument_error(path):
    with pytest.raises(ArgumentError, match="Received: path="):
        resolve_checkpoint(path)


def test_relative_paths_are_echoed_but_results_are_absolute(in_corpus):
    r = resolve_checkpoint(Path(EST), step=5000)
    assert os.path.isabs(r.prefix) and r.note == f"step 5000 of {EST}"


# ---------------------------------------------------------------------------------------------
# checkpoints written by TensorFlow in the test


def _manager_checkpoints(tf, directory, steps, max_to_keep=3):
    v = tf.Variable(np.zeros(3, np.float32))
    ckpt = tf.train.Checkpoint(v=v)
    manager = tf.train.CheckpointManager(ckpt, str(directory), max_to_keep=max_to_keep)
    for s in steps:
        v.assign(np.full(3, s, np.float32))
        manager.save(checkpoint_number=s)
    return manager


def test_checkpoint_manager_directory_resolves_like_tensorflow(tf, tmp_path):
    _manager_checkpoints(tf, tmp_path, [100, 200, 300, 400])
    r = resolve_checkpoint(tmp_path)
    assert r.prefix == tf.train.latest_checkpoint(str(tmp_path)) == str(tmp_path / "ckpt-400")
    assert [c.step for c in checkpoints(tmp_path)] == [200, 300, 400]  # 100 was rotated out
    assert resolve_checkpoint(tmp_path, step=200).prefix == str(tmp_path / "ckpt-200")
    with pytest.raises(CheckpointNotFoundError, match="steps there: 200, 300, 400"):
        resolve_checkpoint(tmp_path, step=100)


def test_checkpoint_manager_restart_makes_a_lower_step_the_latest(tf, tmp_path):
    _manager_checkpoints(tf, tmp_path, [9, 10])
    _manager_checkpoints(tf, tmp_path, [1])  # a restarted run numbering from 1 again
    r = resolve_checkpoint(tmp_path)
    assert r.step == 1 and r.prefix == tf.train.latest_checkpoint(str(tmp_path))
    assert [(c.step, c.latest) for c in checkpoints(tmp_path)] == [(1, True), (9, False), (10, False)]


def test_saver_with_global_step_resolves_by_step(tf, tmp_path):
    graph = tf.Graph()
    with graph.as_default():
        tf.compat.v1.get_variable("w", initializer=np.ones((2, 2), np.float32))
        saver = tf.compat.v1.train.Saver()
        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            for step in (0, 5000):
                saver.save(sess, str(tmp_path / "model.ckpt"), global_step=step)
    r = resolve_checkpoint(tmp_path)
    assert (r.prefix, r.step) == (tf.train.latest_checkpoint(str(tmp_path)), 5000)
    assert resolve_checkpoint(tmp_path, step=0).prefix == str(tmp_path / "model.ckpt-0")
    assert [c.step for c in checkpoints(tmp_path)] == [0, 5000]


def test_saved_model_directory_resolves_to_its_variables(tf, tmp_path):
    module = tf.Module()
    module.w = tf.Variable([1.0, 2.0])
    tf.saved_model.save(module, str(tmp_path / "sm"))
    r = resolve_checkpoint(tmp_path / "sm")
    assert r == ResolvedCheckpoint(str(tmp_path / "sm" / "variables" / "variables"), "tf-bundle", None,
                                   f"variables of SavedModel {tmp_path / 'sm'}")
    assert [c.path for c in checkpoints(tmp_path / "sm")] == [r.prefix]
    with pytest.raises(ArgumentError, match="SavedModel directory, which holds one set of variables and no steps"):
        resolve_checkpoint(tmp_path / "sm", step=3)


def test_resolving_does_not_import_tensorflow(ab_checkpoints):
    import subprocess
    import sys

    a = ab_checkpoints["A"]
    code = ("import sys; from ckptmerge.sources.resolve import resolve_checkpoint, checkpoints; "
            f"resolve_checkpoint({a!r}); assert len(checkpoints({a!r})) == 2; "
            "assert 'tensorflow' not in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=Path(__file__).parents[1])
