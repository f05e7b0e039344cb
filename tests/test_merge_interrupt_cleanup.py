"""Ctrl-C during a local merge leaves no ``.ckptmerge-lock`` and no temporary file (issue 24, 13).

The regression: the publish lock (``.<name>.ckptmerge-lock``, a flock taken while the output is
moved into place) and the state file's temporary copy were left behind when the interrupt landed
while the lock was being taken or released, or while the ``checkpoint`` file was written. Here a
real SIGINT is raised in the merging thread just before, and just after, every ``os`` call a merge
makes (where an interrupt lands: between two bytecodes), for TF, safetensors and Orbax outputs, new and
``--force``: afterwards the folder holds exactly the old checkpoint or the complete new one, no
temporary file and no lock, and the next merge runs. A second test interrupts a merge that waits
for another writer's lock.
"""

from __future__ import annotations

import fcntl
import importlib.util
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

import ckptmerge as cm
from _cli_util import REPO, write_config

CALLS = ("open", "close", "replace", "rename", "link", "remove", "unlink", "fsync", "stat", "fstat", "listdir",
         "scandir", "makedirs", "ftruncate", "pwrite", "write")


class _SigintAt:
    """Raise a real SIGINT in the main thread at the ``k``-th ``os`` call (and ``fcntl.flock``)."""

    def __init__(self, k: int, when: str) -> None:
        self.k, self.when, self.calls, self.where = k, when, 0, ""

    def __enter__(self) -> "_SigintAt":
        self.real = {n: getattr(os, n) for n in CALLS}
        self.real_flock = fcntl.flock
        for n in CALLS:
            setattr(os, n, self._wrap(n, self.real[n]))
        fcntl.flock = self._wrap("flock", self.real_flock)
        return self

    def __exit__(self, *exc) -> None:
        for n, f in self.real.items():
            setattr(os, n, f)
        fcntl.flock = self.real_flock

    def _wrap(self, name, fn):
        def call(*args, **kwargs):
            if threading.current_thread() is not threading.main_thread():
                return fn(*args, **kwargs)
            self.calls += 1
            hit = self.calls == self.k
            if hit:
                self.where = name
                if self.when == "before":
                    signal.raise_signal(signal.SIGINT)
            try:
                return fn(*args, **kwargs)
            finally:  # (after a call that raised too: the interrupt lands in its handling)
                if hit and self.when == "after":
                    signal.raise_signal(signal.SIGINT)
        return call


VALUES = {f"v{i}": np.full(300, i, np.float32) for i in range(4)}
OLD = {f"v{i}": np.full(300, -i, np.float32) for i in range(4)}


def _junk(folder: Path):
    return sorted(n for n in os.listdir(folder) if "ckptmerge" in n)


def _holds(out: Path, values) -> bool:
    try:
        got = cm.load(str(out))
    except cm.CkptMergeError:
        return False
    return sorted(got) == sorted(values) and all(np.array_equal(got[k], v) for k, v in values.items())


_ORBAX = pytest.mark.skipif(importlib.util.find_spec("tensorstore") is None, reason="needs tensorstore")
#: (when, force, output name): TF and safetensors interrupted before and after each call; an Orbax
#: folder (many more calls) after each one, which is also before the next.
CASES = [pytest.param(when, force, name, id=f"{when}-{'force' if force else 'new'}-{name}")
         for name in ("model", "model.safetensors") for force in (False, True) for when in ("before", "after")] + \
        [pytest.param("after", force, "orbax", id=f"after-{'force' if force else 'new'}-orbax", marks=_ORBAX)
         for force in (False, True)]


@pytest.mark.parametrize("when, force, name", CASES)
def test_sigint_at_any_step_of_a_merge_leaves_no_lock_and_no_temporary_file(tmp_path, name, force, when):
    new_src, old_src = tmp_path / "new.npz", tmp_path / "old.npz"
    np.savez(new_src, **VALUES)
    np.savez(old_src, **OLD)
    folder = tmp_path / "out"
    out = folder / name
    state = name == "model"
    fmt = {"format": "orbax"} if name == "orbax" else {}  # an Orbax output is a folder published with one rename
    steps = 0
    for k in range(1, 400):
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir()
        if force:
            cm.merge([str(old_src)], str(out), update_state=state, **fmt)
        interrupted = False
        with _SigintAt(k, when) as probe:
            try:
                cm.merge([str(new_src)], str(out), overwrite=force, update_state=state, **fmt)
            except KeyboardInterrupt:
                interrupted = True
        assert _junk(folder) == [], (k, when, probe.where, os.listdir(folder))
        if interrupted:
            steps += 1
            assert _holds(out, VALUES) or (_holds(out, OLD) if force else not os.listdir(folder)), \
                (k, probe.where, os.listdir(folder))
        else:
            assert probe.calls < k and _holds(out, VALUES)
            break
        cm.merge([str(new_src)], str(out), overwrite=True, update_state=state, **fmt)  # the next merge runs
        assert _holds(out, VALUES) and _junk(folder) == []
    assert steps > 10, steps  # the sweep really went through the merge


def test_ctrl_c_while_waiting_for_another_writers_lock_leaves_nothing(tmp_path):
    np.savez(tmp_path / "new.npz", **VALUES)
    config = write_config(tmp_path / "m.yaml", f"sources:\n  - path: {tmp_path / 'new.npz'}\n")
    folder = tmp_path / "out"
    folder.mkdir()
    lock_path = folder / ".model.ckptmerge-lock"
    fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o644)
    fcntl.flock(fd, fcntl.LOCK_EX)  # another writer is publishing model
    try:
        env = dict(os.environ, PYTHONPATH=str(REPO))
        proc = subprocess.Popen([sys.executable, "-m", "ckptmerge", "-v", "merge", str(config), "-o",
                                 str(folder / "model")], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True, env=env, cwd=tmp_path)
        lines = []
        reader = threading.Thread(target=lambda: lines.extend(proc.stderr), daemon=True)
        reader.start()
        deadline = time.monotonic() + 120
        while not any("waiting for another writer" in line for line in lines):  # -v says it waits
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                pytest.fail(f"the merge never waited for the lock: {lines}")
            time.sleep(0.05)
        time.sleep(0.5)
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=60)
        reader.join(timeout=10)
        err = "".join(lines)
        assert proc.returncode == 130, err
        assert err.splitlines()[-1] == "Aborted!" and "Traceback" not in err, err
        assert sorted(os.listdir(folder)) == [lock_path.name]  # the other writer's lock only
    finally:
        os.remove(lock_path)
        os.close(fd)
    assert cm.merge([str(tmp_path / "new.npz")], str(folder / "model")).restored
    assert sorted(n for n in os.listdir(folder)) == ["model.data-00000-of-00001", "model.index"]
