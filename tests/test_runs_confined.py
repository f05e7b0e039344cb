"""A run is read only inside its folder: symbolic links and state files that point outside.

The rule reading follows (docs/security.md): a file a folder leads to, not one the user named,
must be a regular file inside that folder. Listing and following a run apply it to every file of
every checkpoint (an index, a data shard, a single file, a step folder and every file below it,
the ``checkpoint`` state file) and to every path a state file names: TensorFlow follows
``model_checkpoint_path: "../elsewhere/ckpt-99"`` and absolute paths; ckptmerge uses a
checkpoint outside the folder only when the user names it. Each case is checked for
``checkpoints``, the latest of the directory (``cm.load``), ``step=``, ``average --last`` and
``watch``, and the outside checkpoint's value (999) must never be read.
"""

from __future__ import annotations

import logging
import os
import shutil

import pytest

import ckptmerge as cm
from _cli_util import run as cli
from _runs_util import loaded, names, write_bundle, write_keras, write_run, write_safetensors
from ckptmerge.core.errors import CheckpointNotFoundError, CkptMergeError, UnsafeCheckpointError
from ckptmerge.sources.resolve import read_state_file, resolve_checkpoint

OUTSIDE = 999.0


@pytest.fixture
def places(tmp_path):
    """``(run, elsewhere)``: the run holds steps 1 and 2; elsewhere holds checkpoints of 999."""
    run, elsewhere = tmp_path / "run", tmp_path / "elsewhere"
    write_run(run, "tf-bundles", [1, 2])
    elsewhere.mkdir()
    return run, elsewhere


# -- symbolic links out of the run (30.2) ------------------------------------------------------------


def _bundle_index_out(run, elsewhere):
    p = write_bundle(elsewhere / "ckpt-9", OUTSIDE)
    os.symlink(p + ".index", run / "ckpt-9.index")
    os.symlink(p + ".data-00000-of-00001", run / "ckpt-9.data-00000-of-00001")
    return "ckpt-9"


def _bundle_shard_out(run, elsewhere):
    p = write_bundle(elsewhere / "ckpt-9", OUTSIDE)
    shutil.copy(p + ".index", run / "ckpt-9.index")
    os.symlink(p + ".data-00000-of-00001", run / "ckpt-9.data-00000-of-00001")
    return "ckpt-9"


def _relative_links(run, elsewhere):
    write_bundle(elsewhere / "ckpt-9", OUTSIDE)
    os.symlink("../elsewhere/ckpt-9.index", run / "ckpt-9.index")
    os.symlink("../elsewhere/ckpt-9.data-00000-of-00001", run / "ckpt-9.data-00000-of-00001")
    return "ckpt-9"


def _safetensors_file_out(run, elsewhere):
    os.symlink(write_safetensors(elsewhere / "x.safetensors", OUTSIDE), run / "model-9.safetensors")
    return "model-9.safetensors"


def _keras_file_out(run, elsewhere):
    os.symlink(write_keras(elsewhere / "x.weights.h5", OUTSIDE), run / "ckpt-9.weights.h5")
    return "ckpt-9.weights.h5"


def _step_folder_out(run, elsewhere):
    write_run(elsewhere, "hf-step-folders", [OUTSIDE], name="checkpoint-x")
    os.symlink(elsewhere / "checkpoint-x", run / "checkpoint-9")
    return "checkpoint-9"


def _file_in_step_folder_out(run, elsewhere):
    (run / "checkpoint-9").mkdir()
    os.symlink(write_safetensors(elsewhere / "x.safetensors", OUTSIDE), run / "checkpoint-9" / "model.safetensors")
    return "checkpoint-9"


def _subfolder_in_step_folder_out(run, elsewhere):
    (run / "step_9").mkdir()
    write_bundle(elsewhere / "ckpt", OUTSIDE)
    os.symlink(elsewhere, run / "step_9" / "inner")
    write_safetensors(run / "step_9" / "model.safetensors", 9)  # (so the folder is not empty)
    return "step_9"


LINKS_OUT = {f.__name__[1:]: f for f in (_bundle_index_out, _bundle_shard_out, _relative_links, _safetensors_file_out,
                                          _keras_file_out, _step_folder_out, _file_in_step_folder_out,
                                          _subfolder_in_step_folder_out)}


@pytest.mark.parametrize("case", sorted(LINKS_OUT))
def test_watch_never_follows_a_link_out_of_the_run_and_reports_it(case, places):
    run, elsewhere = places
    name = LINKS_OUT[case](run, elsewhere)
    skipped = []
    got = [(i.step, loaded(i.read_path)) for i in cm.watch(run, timeout=0, on_skip=lambda i, e: skipped.append((i, e)))]
    assert got == [(1, 1.0), (2, 2.0)]
    assert [os.path.basename(i.path) for i, _ in skipped] == [name]
    err = skipped[0][1]
    assert isinstance(err, UnsafeCheckpointError), err
    assert "outside" in str(err) and str(elsewhere) in str(err)


@pytest.mark.parametrize("case", sorted(LINKS_OUT))
def test_listing_a_run_skips_a_link_out_of_it_with_a_warning(case, places, caplog):
    run, elsewhere = places
    name = LINKS_OUT[case](run, elsewhere)
    with caplog.at_level(logging.WARNING, logger="ckptmerge"):
        assert names(cm.checkpoints(run), run) == [("ckpt-1", 1), ("ckpt-2", 2)]
    assert any(name in r.getMessage() and "outside" in r.getMessage() for r in caplog.records)
    assert loaded(run) == 2.0  # the highest step inside, not the 9 outside
    with pytest.raises(CkptMergeError):
        resolve_checkpoint(run, step=9)
    assert sorted(loaded(s.path) for s in cm.combine(str(run), last=2).inputs) == [1.0, 2.0]


def test_follow_restores_nothing_from_outside_the_run(tf, places):
    run, elsewhere = places
    _bundle_index_out(run, elsewhere)
    w = tf.Variable([0.0] * 4)
    r = cm.Restorer({"w": w}, [cm.Source(str(run / "ckpt-1"))])
    seen = []
    for rep in r.follow(run, timeout=0, on_skip=lambda i, e: seen.append(i.step)):
        assert float(w.numpy()[0]) == rep.checkpoint.step
    assert seen == [9] and float(w.numpy()[0]) == 2.0


def test_the_cli_watch_says_what_it_skipped(places):
    run, elsewhere = places
    _step_folder_out(run, elsewhere)
    res = cli("watch", run, "--timeout", "0")
    assert res.exit_code == 0, res.output
    assert [line.split(":")[0] for line in res.stdout.splitlines()] == ["step 1", "step 2"]
    assert "checkpoint-9" in res.stderr and "outside" in res.stderr


def test_links_inside_the_run_are_followed(places):
    run, _ = places
    store = run / "store"
    write_bundle(store / "ckpt-5", 5)
    os.symlink("store/ckpt-5.index", run / "ckpt-5.index")
    os.symlink(store / "ckpt-5.data-00000-of-00001", run / "ckpt-5.data-00000-of-00001")
    write_run(store, "hf-step-folders", [6], name="real-6")
    os.symlink(store / "real-6", run / "checkpoint-6")
    assert [(i.step, loaded(i.read_path)) for i in cm.watch(run, timeout=0)] == [(1, 1.0), (2, 2.0), (5, 5.0),
                                                                                   (6, 6.0)]
    assert [s for _, s in names(cm.checkpoints(run), run)] == [1, 2, 5, 6]


def test_a_run_folder_that_is_itself_a_link_is_the_folder_named(places, tmp_path):
    run, _ = places
    os.symlink(run, tmp_path / "alias")
    assert [i.step for i in cm.watch(tmp_path / "alias", timeout=0)] == [1, 2]
    assert loaded(tmp_path / "alias") == 2.0


# -- state files that point outside (30.3) ---------------------------------------------------------

OUTSIDE_PATHS = {
    "relative-up": lambda run, elsewhere: "../elsewhere/ckpt-99",
    "absolute": lambda run, elsewhere: str(elsewhere / "ckpt-99"),
    "relative-through-a-subfolder": lambda run, elsewhere: "sub/../../elsewhere/ckpt-99",
    "a-subfolder-that-links-out": lambda run, elsewhere: (os.symlink(elsewhere, run / "sub"), "sub/ckpt-99")[1],
}


@pytest.fixture(params=sorted(OUTSIDE_PATHS))
def pointing_out(request, places):
    """A run whose state file names a checkpoint outside it as the latest (and kept)."""
    run, elsewhere = places
    write_bundle(elsewhere / "ckpt-99", OUTSIDE)
    recorded = OUTSIDE_PATHS[request.param](run, elsewhere)
    (run / "checkpoint").write_text(f'model_checkpoint_path: "{recorded}"\n'
                                    f'all_model_checkpoint_paths: "ckpt-1"\n'
                                    f'all_model_checkpoint_paths: "{recorded}"\n')
    return run, recorded


def test_the_latest_of_a_state_file_pointing_outside_is_refused_with_the_reason(pointing_out):
    run, recorded = pointing_out
    for call in (lambda: cm.load(run), lambda: resolve_checkpoint(run), lambda: cm.list_variables(run)):
        with pytest.raises(UnsafeCheckpointError) as err:
            call()
        msg = str(err.value)
        assert f"'{recorded}'" in msg and "outside" in msg and str(run) in msg, msg
        assert "step" in msg and "ckptmerge checkpoints" in msg  # how to go on
    res = cli("ls", run)
    assert res.exit_code == 2 and "outside" in res.stderr and res.stderr.count("\n") == 1
    assert loaded(run, step=2) == 2.0  # a step inside is still fine


def test_checkpoints_never_lists_what_a_state_file_names_outside(pointing_out, caplog):
    run, recorded = pointing_out
    with caplog.at_level(logging.WARNING, logger="ckptmerge"):
        infos = cm.checkpoints(run)
    assert [(n, s, i.latest) for (n, s), i in zip(names(infos, run), infos)] == [("ckpt-1", 1, False),
                                                                              ("ckpt-2", 2, False)]
    assert any(recorded in r.getMessage() and "outside" in r.getMessage() for r in caplog.records)
    res = cli("checkpoints", run)
    assert res.exit_code == 0 and recorded in res.stdout and "outside" in res.stdout
    assert "999" not in res.stdout


def test_average_and_watch_never_take_what_a_state_file_names_outside(pointing_out):
    run, _ = pointing_out
    assert sorted(loaded(s.path) for s in cm.combine(str(run), last=2).inputs) == [1.0, 2.0]
    assert sorted(loaded(s.path) for s in cm.combine(str(run)).inputs) == [1.0, 2.0]
    infos = list(cm.watch(run, timeout=0))
    assert [(i.step, i.latest) for i in infos] == [(1, False), (2, False)]
    with pytest.raises(CheckpointNotFoundError):
        resolve_checkpoint(run, step=99)


def test_a_state_file_pointing_outside_is_parsed_with_the_outside_paths_set_apart(pointing_out):
    run, recorded = pointing_out
    st = read_state_file(run)
    assert st.model_checkpoint_path is None
    assert st.all_model_checkpoint_paths == (str(run / "ckpt-1"),)
    assert st.recorded_model_checkpoint_path == recorded
    assert st.outside == (recorded,)


def test_an_outside_path_whose_name_is_in_the_run_means_the_runs_own_copy(places):
    # A run copied from elsewhere on the same machine: its state file still names the original.
    run, elsewhere = places
    write_bundle(elsewhere / "ckpt-2", OUTSIDE)
    (run / "checkpoint").write_text(f'model_checkpoint_path: "{elsewhere}/ckpt-2"\n')
    r = resolve_checkpoint(run)
    assert r.prefix == str(run / "ckpt-2") and f"recorded as '{elsewhere}/ckpt-2'" in r.note
    assert loaded(run) == 2.0
    assert [c.latest for c in cm.checkpoints(run)] == [False, True]
    assert [i.latest for i in cm.watch(run, timeout=0)] == [False, True]


def test_absolute_paths_inside_the_run_are_used_as_written(places):
    run, _ = places
    (run / "checkpoint").write_text(f'model_checkpoint_path: "{run}/ckpt-1"\n')
    assert loaded(run) == 1.0 and [c.latest for c in cm.checkpoints(run)] == [True, False]


def test_a_state_file_that_is_a_link_out_of_the_run_is_not_read(places, caplog):
    run, elsewhere = places
    write_bundle(elsewhere / "ckpt-1", OUTSIDE)
    (elsewhere / "checkpoint").write_text('model_checkpoint_path: "ckpt-1"\n')
    os.symlink(elsewhere / "checkpoint", run / "checkpoint")
    with caplog.at_level(logging.WARNING, logger="ckptmerge"):
        r = resolve_checkpoint(run)
    assert r.step == 2 and "state file" in r.note  # the highest step: the link is no state file of the run
    assert any("outside" in rec.getMessage() for rec in caplog.records)


def test_a_remote_state_file_naming_another_prefix_is_refused(tmp_path):
    pytest.importorskip("fsspec")
    import fsspec

    mem = fsspec.filesystem("memory")
    base = f"memory://confined-{os.getpid()}"
    try:
        for s in (1, 2):
            p = write_bundle(tmp_path / f"ckpt-{s}", s)
            for ext in (".index", ".data-00000-of-00001"):
                mem.pipe_file(f"{base}/run/ckpt-{s}{ext}", open(p + ext, "rb").read())
        p = write_bundle(tmp_path / "ckpt-99", OUTSIDE)
        for ext in (".index", ".data-00000-of-00001"):
            mem.pipe_file(f"{base}/other/ckpt-99{ext}", open(p + ext, "rb").read())
        for recorded in ("../other/ckpt-99", f"{base}/other/ckpt-99"):
            mem.pipe_file(f"{base}/run/checkpoint", f'model_checkpoint_path: "{recorded}"\n'.encode())
            with pytest.raises(UnsafeCheckpointError, match="outside"):
                cm.load(f"{base}/run")
            assert [c.step for c in cm.checkpoints(f"{base}/run")] == [1, 2]
            assert loaded(f"{base}/run", step=2) == 2.0
    finally:
        mem.rm(base, recursive=True)


@pytest.mark.parametrize("case", ["bundle_index_out", "bundle_shard_out", "keras_file_out", "step_folder_out"])
def test_a_latest_named_by_the_state_file_whose_files_lead_outside_is_refused(case, places):
    run, elsewhere = places
    name = LINKS_OUT[case](run, elsewhere)
    (run / "checkpoint").write_text(f'model_checkpoint_path: "{name}"\n')
    with pytest.raises(UnsafeCheckpointError, match="outside"):
        cm.load(run)
    assert [c.latest for c in cm.checkpoints(run)] == [False, False]
    res = cli("checkpoints", run)
    assert res.exit_code == 0 and f"names '{name}' as latest, which is left out (a file of it leads outside" in res.stdout
