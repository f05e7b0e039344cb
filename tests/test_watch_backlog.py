"""``backlog="all"``: none skipped, even when the trainer's cleanup races the start of the watch.

Every checkpoint that is there when a watch starts is pinned before the first one is yielded,
so a trainer that deletes the old ones while the caller is busy with the first (``max_to_keep``)
takes nothing away; and one deleted while the first look is still pinning is reported by name,
never lost without a word. Each race is run many times with a real racing thread.
"""

from __future__ import annotations

import os
import random
import threading

import pytest

import ckptmerge as cm
from _runs_util import loaded, write_bundle, write_run
from ckptmerge.following import scan as watchscan

TRIALS = 25


def _delete(run, name):
    for f in os.listdir(run):
        if f == name or f.startswith(name + "."):
            p = os.path.join(run, f)
            if os.path.isdir(p):
                import shutil

                shutil.rmtree(p, ignore_errors=True)
            else:
                try:
                    os.unlink(p)
                except FileNotFoundError:
                    pass


@pytest.mark.parametrize("kind", ["tf-bundles", "hf-step-folders", "safetensors-files"])
def test_the_backlog_survives_a_cleanup_during_the_first_step(kind, tmp_path):
    for trial in range(TRIALS):
        run = tmp_path / f"t{trial}"
        paths = write_run(run, kind, range(1, 9))
        got = []
        for info in cm.watch(run, timeout=0.2, poll=0.01):
            if not got:  # the caller's first step: the trainer keeps only the newest
                for s in range(1, 8):
                    _delete(run, os.path.basename(paths[s]))
            got.append((info.step, loaded(info.read_path)))
        assert got == [(s, float(s)) for s in range(1, 9)], (trial, got)


def test_a_checkpoint_deleted_while_the_first_look_pins_is_reported_by_name(tmp_path, monkeypatch):
    # The trainer's cleanup runs from the moment the watch starts. What the first look listed is
    # either yielded, readable, or reported by name: never lost without a word.
    listed = []
    real_scan = watchscan.scan

    def recording(directory, floor, *a, **kw):
        out = real_scan(directory, floor, *a, **kw)
        if not listed:
            listed.append({c.step for c in out.candidates.values()} | {s for _, s in out.vanished})
        return out

    monkeypatch.setattr(watchscan, "scan", recording)
    from ckptmerge.following import watch as watch_module

    monkeypatch.setattr(watch_module, "scan", recording)
    rng = random.Random(7)
    lost_total = 0
    for trial in range(TRIALS):
        run = tmp_path / f"t{trial}"
        for s in range(1, 13):
            write_bundle(run / f"ckpt-{s}", s)
        listed.clear()
        go = threading.Event()

        def trainer():
            go.wait()
            for s in range(1, 12):
                _delete(run, f"ckpt-{s}")
                if rng.random() < 0.5:
                    os.sched_yield()

        t = threading.Thread(target=trainer)
        t.start()
        skipped, got = [], []
        loop = cm.watch(run, timeout=0.3, poll=0.01, on_skip=lambda i, e: skipped.append((i.step, str(e))))
        go.set()
        for info in loop:
            got.append((info.step, loaded(info.read_path)))
        t.join()
        assert all(v == float(s) for s, v in got), got  # every one yielded reads whole
        yielded, reported = {s for s, _ in got}, {s for s, _ in skipped}
        assert not yielded & reported, (got, skipped)
        assert listed and listed[0] <= yielded | reported, (trial, sorted(listed[0]), got, skipped)
        assert all(f"ckpt-{s}" in e for s, e in skipped), skipped  # each by name
        assert 12 in yielded
        lost_total += len(reported)
    # (how many were reported varies with the machine's load; the invariant is what counts)
