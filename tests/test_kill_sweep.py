"""Ctrl-C or SIGKILL at any instant of a merge loses nothing and leaves nothing (issue 30).

A killed ``.safetensors`` or ``.weights.h5`` merge left its temporary file beside the output for
good (only the TF writer removed those of killed writers); a Ctrl-C while the TF writer opened a
new shard could leave ``.NAME.ckptmerge-tmp-....data-0``; a Ctrl-C just after a remote ``--force``
switched the index left the replaced data objects beside the new ones. Here real ``ckptmerge``
processes (forked from a warm interpreter, tests/_forkserver.py) replace an old output and are
interrupted or killed at times sampled across the whole run, for TF (with and without the state
file) and safetensors outputs of ``average`` and ``merge``, local and on S3. After each, the
output reads as exactly the old or exactly the new one; after Ctrl-C nothing else is there (no
temporary file, no lock, exit 130 or 0 without a traceback); after SIGKILL the next run leaves
nothing else either. A temporary file is judged only by its own machine's writers: one of a
process that runs, or of another machine, is left.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import threading
import time
import zlib
from pathlib import Path

import numpy as np
import pytest
from _forkserver import ForkServer
from _remote_util import start_s3

import ckptmerge as cm

REPO = Path(__file__).resolve().parents[1]
PRELOAD = ["ckptmerge.cli", "ckptmerge.merging.local", "ckptmerge.merging.remote", "ckptmerge.combining",
           "s3fs", "aiobotocore.session"]
SAMPLES = 10


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> Path:
    """Steps 1, 2, 3 of a run: every tensor of step s is full of ``i + s``."""
    import tensorflow as tf

    d = tmp_path_factory.mktemp("run")
    m = tf.Module()
    for i in range(24):
        setattr(m, f"v{i}", tf.Variable(np.zeros((64, 64), np.float32), name=f"v{i}"))
    mgr = tf.train.CheckpointManager(tf.train.Checkpoint(model=m), str(d), max_to_keep=5)
    for step in (1, 2, 3):
        for i in range(24):
            getattr(m, f"v{i}").assign(np.full((64, 64), i + step, np.float32))
        mgr.save(step)
    return d


@pytest.fixture(scope="module")
def forks(tmp_path_factory):
    folder = str(tmp_path_factory.mktemp("tmp"))  # remote merges' temporary folders: this module's own
    with ForkServer(PRELOAD, env=dict(os.environ, PYTHONPATH=str(REPO), TMPDIR=folder)) as server:
        yield server


def _values(path: str):
    return cm.load(path)


def _old_new(path: str, old: float, new: float) -> float:
    """The output's v0 value, which must be the old or the new one (a mix fails: every tensor agrees)."""
    values = _values(path)
    v0 = float(values["v0"][0, 0])
    assert v0 in (old, new), v0
    for i in range(24):
        np.testing.assert_array_equal(values[f"v{i}"], np.full((64, 64), i + v0, np.float32))
    return v0


KINDS = {  # name: (output file, the command's arguments after the run folder/config, the new v0)
    "tf": ("model", ["average", "{run}", "--last", "2", "-o", "{out}", "--force", "-q"], 2.5),
    "tf-state": ("model", ["merge", "{config}", "-o", "{out}", "--force", "--update-state", "-q"], 3.0),
    "safetensors": ("model.safetensors", ["average", "{run}", "--last", "2", "-o", "{out}", "--force", "-q"], 2.5),
}


def _command(kind, run_dir, out, config):
    return ["-m", "ckptmerge"] + [a.format(run=run_dir, out=out, config=config) for a in KINDS[kind][1]]


def _sweep_times(duration: float, seed: int):
    """SAMPLES times spread over the whole run (one in each slice, at a random point of it)."""
    rng = random.Random(seed)
    return [(i + rng.random()) / SAMPLES * duration * 1.1 for i in range(SAMPLES)]


@pytest.mark.parametrize("how", ["sigint", "sigkill"])
@pytest.mark.parametrize("kind", list(KINDS))
def test_a_local_merge_stopped_at_any_instant_keeps_the_old_output_and_leaves_nothing(run_dir, forks, tmp_path,
                                                                                      kind, how):
    name, _, new = KINDS[kind]
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    out = out_dir / name
    config = tmp_path / "m.yaml"
    config.write_text(f"sources:\n  - path: {run_dir}\n")
    cm.merge([cm.Source(str(run_dir), step=1)], str(out), **({"update_state": True} if kind == "tf-state" else {}))
    old_names = sorted(os.listdir(out_dir))
    cmd = _command(kind, run_dir, out, config)
    assert forks.run(cmd).returncode == 0  # (warm: what a first run loads lazily is loaded)
    t0 = time.monotonic()
    assert forks.run(cmd).returncode == 0
    duration = time.monotonic() - t0
    new_names = sorted(os.listdir(out_dir))
    cm.merge([cm.Source(str(run_dir), step=1)], str(out), overwrite=True,
             **({"update_state": True} if kind == "tf-state" else {}))
    seen = set()
    for t in _sweep_times(duration, seed=zlib.crc32(f'{kind}/{how}'.encode())):
        child = forks.start(cmd)
        time.sleep(t)
        try:
            child.send_signal(signal.SIGINT if how == "sigint" else signal.SIGKILL)
        except ProcessLookupError:  # the run ended first (a quiet machine): its output is the new one
            pass
        _, err = child.communicate(timeout=60)
        v0 = _old_new(str(out), 1.0, new)
        seen.add(v0)
        names = sorted(os.listdir(out_dir))
        if how == "sigint":
            # (a SIGINT in the first milliseconds, before the forked child has run a line of its own,
            # kills it as it would any process: silently, nothing written; from ckptmerge's first line
            # on it is 130, as tests/test_cli_interrupt.py checks)
            # (the fork server's own lines before it runs ckptmerge may print the interpreter's traceback)
            early = child.returncode == -signal.SIGINT and "ckptmerge" not in err
            assert child.returncode in (0, 130) or early, (t, child.returncode, err)
            assert early or "Traceback" not in err, (t, child.returncode, err)
            assert names == (new_names if v0 == new else old_names), (t, names)
        else:  # the next run removes what the killed one left
            # (at most: its temporary files, its lock file, and data files no index names, which a
            # kill between the data and the index switch leaves; the next --force removes them)
            assert all(n in old_names or n in new_names or ".ckptmerge-" in n or ".data-" in n for n in names), names
            again = forks.run(cmd)
            assert again.returncode == 0, again.stderr
            assert sorted(os.listdir(out_dir)) == new_names, (t, names, os.listdir(out_dir))
            assert _old_new(str(out), 1.0, new) == new
        if v0 == new:  # back to the old output for the next sample
            cm.merge([cm.Source(str(run_dir), step=1)], str(out), overwrite=True,
                     **({"update_state": True} if kind == "tf-state" else {}))
    assert 1.0 in seen  # (stopped before the switch at least once: the sweep covered the run)


def _dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


@pytest.mark.parametrize("name", ["model.safetensors", "model"])
def test_temporary_files_are_judged_only_by_their_own_machine(run_dir, tmp_path, name):
    from ckptmerge.formats.io.output_prefix import HOST_TAG

    out = tmp_path / name
    dead, alive = _dead_pid(), os.getppid()
    suffix = ".data-0" if name == "model" else ""
    stale = tmp_path / f".{name}.ckptmerge-tmp-{dead}-{HOST_TAG}-0badf00d{suffix}"
    running = tmp_path / f".{name}.ckptmerge-tmp-{alive}-{HOST_TAG}-0badf00d{suffix}"
    elsewhere = tmp_path / f".{name}.ckptmerge-tmp-{dead}-00000000-0badf00d{suffix}"
    link = tmp_path / f".{name}.ckptmerge-tmp-{dead}-{HOST_TAG}-11111111{suffix}"
    target = tmp_path / "keep.txt"
    for p in (stale, running, elsewhere, target):
        p.write_bytes(b"x")
    link.symlink_to(target)
    cm.merge([cm.Source(str(run_dir), step=1)], str(out))
    assert not stale.exists() and not os.path.lexists(link) and target.read_bytes() == b"x"
    assert running.exists() and elsewhere.exists()


# -- remote --force, interrupted at any instant ---------------------------------------------------


@pytest.fixture(scope="module")
def s3(run_dir):
    yield from start_s3(run_dir)


def _objects(fs, folder):
    fs.invalidate_cache()
    return sorted(p.rsplit("/", 1)[-1] for p in fs.ls(folder, detail=False)) if fs.exists(folder) else []


def test_a_remote_force_merge_interrupted_at_any_instant_leaves_old_or_new_and_no_mix(s3, forks, tmp_path):
    """Ctrl-C a few milliseconds after the store answered one of the merge's writes (the lock, the
    data objects, the index switch, the delete of the replaced data, the state file, the lock's
    delete): between requests, where nothing holds it back."""
    fs, out = s3["fs"], "s3://ckpts/sweep/model"
    config = tmp_path / "m.yaml"
    config.write_text(f"sources:\n  - path: {s3['url']}\n    step: 3\n")
    env = dict(forks.env, **s3["env"])
    cmd = ["-m", "ckptmerge", "merge", str(config), "-o", out, "--force", "--update-state", "-q"]
    proxy = s3["proxy"]

    cm.merge([cm.Source(s3["url"], step=1)], "s3://ckpts/sweep-old/model", update_state=True)
    saved = _objects(fs, "ckpts/sweep-old")

    def old():  # the old checkpoint, alone (copied in the store)
        if fs.exists("ckpts/sweep"):
            fs.rm("ckpts/sweep", recursive=True)
        for name in saved:
            fs.copy(f"ckpts/sweep-old/{name}", f"ckpts/sweep/{name}")
        return _objects(fs, "ckpts/sweep")

    rng = random.Random(30)
    old_names, seen = old(), set()
    for k in range(1, 8):
        count, child = [0], None

        def after(method, path, status, k=k, delay=rng.uniform(0, 0.02)):
            if method in ("PUT", "POST", "DELETE") and "/ckpts/sweep/" in path:
                count[0] += 1
                if count[0] == k:
                    threading.Timer(delay, child.send_signal, (signal.SIGINT,)).start()
            return None

        child = forks.start(cmd, env=env)
        proxy.after = after
        try:
            _, err = child.communicate(timeout=120)
        finally:
            proxy.after = None
        assert child.returncode in (0, 130) and "Traceback" not in err, err
        v0 = _old_new(out, 1.0, 3.0)
        seen.add(v0)
        names = _objects(fs, "ckpts/sweep")
        assert "model.lock" not in names
        counts = {n.rsplit("-of-", 1)[1] for n in names if ".data-" in n}
        assert len(counts) == 1, (k, names)  # one checkpoint's data objects: none it replaced beside them
        if v0 == 3.0:
            assert fs.cat_file("ckpts/sweep/checkpoint").startswith(b'model_checkpoint_path: "model"')
            old_names = old()
        else:
            assert names == old_names, (k, names)
    assert seen == {1.0, 3.0}
