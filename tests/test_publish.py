"""Publishing a merged checkpoint: crash-safe replacement and concurrent merges to one prefix.

A merge replaces its output in several file-system steps. These tests stop a real merge (a child
process) with SIGKILL just before each of those steps in turn, and check that the output prefix
then reads, with ckptmerge's reader and with TensorFlow, as exactly the old or exactly the new
checkpoint, and that the next run is not blocked (or says how to proceed). Concurrent merges are
real processes racing to one prefix, with every rename slowed down so that the steps of
different processes would interleave if nothing kept them apart.
"""

from __future__ import annotations

import os
import re
import subprocess
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

import ckptmerge as cm
from _cli_util import write_config
from _forkserver import ForkServer
from ckptmerge.core.errors import CheckpointNotFoundError, OutputExistsError
from ckptmerge.formats.tf.writer import BundleWriter
from ckptmerge.merging.dispatch import merge
from conftest import save_tf1

REPO = Path(__file__).resolve().parents[1]
NAMES = ("dense/kernel", "dense/bias", "head/w")
CLEAN = ["m.data-00000-of-00001", "m.index"]

# Before each rename, link or unlink of a file in the output directory, the child counts the step;
# at step KILL_AT it kills itself (no clean-up code runs, as with a power cut or `kill -9`).
# It prints every step it passed, so a run with KILL_AT=0 lists all steps.
KILL_AT_STEP = """
    import os, signal, sys
    from ckptmerge.merging.dispatch import merge

    src, out, kill_at = sys.argv[1], sys.argv[2], int(sys.argv[3])
    out_dir = os.path.dirname(os.path.abspath(out))
    steps = []

    def counted(name):
        real = getattr(os, name)
        def step(*args, **kwargs):
            if os.path.dirname(os.path.abspath(str(args[0]))) == out_dir:
                steps.append(name + " " + " ".join(os.path.basename(str(a)) for a in args[:2]))
                if len(steps) == kill_at:
                    os.kill(os.getpid(), signal.SIGKILL)
            return real(*args, **kwargs)
        setattr(os, name, step)

    for name in ("replace", "rename", "remove", "unlink", "link"):
        counted(name)
    merge([src], out, overwrite=True)
    print("\\n".join(steps))
"""


def files(d) -> list:
    return sorted(os.listdir(d)) if os.path.isdir(d) else []


def values(seed: float) -> dict:
    return {"dense/kernel": np.full((64, 32), seed, np.float32), "dense/bias": np.arange(32, dtype=np.float32) + seed,
            "head/w": np.full((5,), -seed, np.float32)}


@pytest.fixture(scope="module")
def sources(tmp_path_factory):
    """Checkpoints A to D written by TensorFlow: the same names, shapes and sizes, other values."""
    root = tmp_path_factory.mktemp("publish")
    return {label: (save_tf1(root / label / "model", values(seed)), values(seed))
            for label, seed in (("A", 1.0), ("B", 2.0), ("C", 3.0), ("D", 4.0))}


def read_state(tf, prefix: Path, candidates: dict) -> str:
    """Which checkpoint ``prefix`` reads as ("none" or a key of ``candidates``), with ckptmerge's
    reader (checksums checked) and with TensorFlow; fails if it is anything else."""
    try:
        ours = cm.load(str(prefix))
    except CheckpointNotFoundError:
        ours = None
    try:
        reader = tf.train.load_checkpoint(str(prefix))
        theirs = {n: reader.get_tensor(n) for n in reader.get_variable_to_shape_map()}
    except (ValueError, tf.errors.NotFoundError):
        theirs = None
    assert (ours is None) == (theirs is None), (ours, theirs)
    if ours is None:
        return "none"
    for label, want in candidates.items():
        if sorted(ours) == sorted(want) and all(np.array_equal(ours[n], want[n]) for n in want):
            assert all(np.array_equal(theirs[n], want[n]) for n in want)
            return label
    raise AssertionError(f"{prefix} reads as neither of {sorted(candidates)}: {ours}")


@pytest.fixture(scope="module")
def forks():
    """Each killed merge and each racer is a real process of its own, forked from a warm
    interpreter (tests/_forkserver.py) that imported ckptmerge's merge and CLI once."""
    with ForkServer(["ckptmerge.merging.dispatch", "ckptmerge.merging.local", "ckptmerge.cli"]) as server:
        yield server


def merge_killed_at(forks, src: str, out: Path, kill_at: int) -> subprocess.CompletedProcess:
    return forks.run(["-c", textwrap.dedent(KILL_AT_STEP), src, out, kill_at], timeout=120)


def publish_steps(forks, src: str, out: Path) -> list:
    done = merge_killed_at(forks, src, out, 0)
    assert done.returncode == 0, done.stderr
    return done.stdout.splitlines()


@pytest.mark.parametrize("old", ["same-names", "two-shards", "none"])
def test_a_merge_killed_at_any_step_leaves_the_old_or_the_new_checkpoint(tf, sources, forks, tmp_path, old):
    """Kill ``merge --force`` before each rename/link/unlink; the prefix is always old or new."""
    (a, a_values), (b, b_values) = sources["A"], sources["B"]
    candidates = {"old": a_values, "new": b_values}

    def make_old(out: Path) -> None:
        if old == "same-names":  # the new data file takes the very name of the old one
            merge([a], out)
        elif old == "two-shards":
            with BundleWriter(str(out), max_shard_bytes=8192) as w:
                for name in NAMES:
                    w.add(name, a_values[name])
            assert len(files(out.parent)) == 3

    make_old(tmp_path / "count" / "m")
    n_steps = len(publish_steps(forks, b, tmp_path / "count" / "m"))
    seen = []
    for kill_at in range(1, n_steps + 1):
        out = tmp_path / f"kill-{kill_at}" / "m"
        make_old(out)
        assert read_state(tf, out, candidates) == ("none" if old == "none" else "old")
        killed = merge_killed_at(forks, b, out, kill_at)
        assert killed.returncode == -9, (kill_at, killed.stderr)
        state = read_state(tf, out, candidates)
        assert state in ("none" if old == "none" else "old", "new"), (kill_at, files(out.parent))
        seen.append(state)

        # What the killed run left never blocks the next one without saying how to proceed.
        leftovers = [n for n in files(out.parent) if n.startswith("m.")]
        if leftovers:
            with pytest.raises(OutputExistsError) as err:
                merge([b], out)
            message = str(err.value)
            if "m.index" in leftovers:
                assert f"A checkpoint already exists at '{out}'" in message
            else:
                assert f"The output prefix '{out}' has data files but no index ('{out.parent}/" in message
                assert "leftover of a write that was killed" in message
            assert "Delete them" in message or "Choose another output prefix" in message
            assert "pass overwrite=True (ckptmerge merge --force) to replace" in message
        merge([b], out, overwrite=True)
        assert read_state(tf, out, candidates) == "new"
        assert files(out.parent) == CLEAN  # leftovers and the lock file are gone
    # Old until the one switch, new from then on: both happen, never back.
    assert seen == sorted(seen, key=lambda s: s == "new") and seen[-1] == "new" and seen[0] != "new"


def test_replacing_a_checkpoint_with_the_same_file_names_ends_with_its_natural_names(tf, sources, tmp_path):
    (a, _), (b, b_values) = sources["A"], sources["B"]
    out = tmp_path / "out" / "m"
    merge([a], out)
    report = merge([b], out, overwrite=True)
    assert files(out.parent) == CLEAN
    assert report.bytes_written == sum(os.path.getsize(out.parent / n) for n in CLEAN)
    assert read_state(tf, out, {"new": b_values}) == "new"
    # The result is the very bytes a fresh write gives.
    fresh = tmp_path / "fresh" / "m"
    merge([b], fresh)
    for name in CLEAN:
        assert (out.parent / name).read_bytes() == (fresh.parent / name).read_bytes()


def test_without_hard_links_the_padded_checkpoint_is_kept(tf, sources, tmp_path, monkeypatch):
    (a, _), (b, b_values) = sources["A"], sources["B"]
    out = tmp_path / "out" / "m"
    merge([a], out)

    def no_links(src, dst):
        raise PermissionError(1, "Operation not permitted")

    monkeypatch.setattr(os, "link", no_links)
    report = merge([b], out, overwrite=True)
    assert files(out.parent) == ["m.data-00000-of-00002", "m.data-00001-of-00002", "m.index"]
    assert os.path.getsize(out.parent / "m.data-00001-of-00002") == 0
    assert report.bytes_written == sum(os.path.getsize(out.parent / n) for n in files(out.parent))
    assert read_state(tf, out, {"new": b_values}) == "new"
    monkeypatch.undo()
    merge([a], out, overwrite=True)  # and replacing that layout needs no padding
    assert files(out.parent) == CLEAN


def test_data_files_without_an_index_are_named_with_the_fix(sources, tmp_path):
    out = tmp_path / "out" / "m"
    out.parent.mkdir()
    (out.parent / "m.data-00000-of-00001").write_bytes(b"partial")
    with pytest.raises(OutputExistsError) as err:
        merge([sources["A"][0]], out)
    assert str(err.value) == (
        f"The output prefix '{out}' has data files but no index ('{out}.data-00000-of-00001'): they are not a "
        "readable checkpoint, most likely the leftover of a write that was killed. Delete them, choose another "
        "output prefix, or pass overwrite=True (ckptmerge merge --force) to replace them.")
    merge([sources["A"][0]], out, overwrite=True)
    assert files(out.parent) == CLEAN


@pytest.mark.parametrize("when", ["before the writer opens", "while tensors are written"])
def test_a_checkpoint_another_run_publishes_meanwhile_is_kept_with_the_merge_hint(tf, sources, tmp_path,
                                                                                 monkeypatch, when):
    import ckptmerge.merging.local as offline

    out = tmp_path / "out" / "m"
    published = []

    def other_run_publishes(*args):
        if not published:
            published.append(True)
            merge([sources["B"][0]], out)  # the other run wins the race here

    if when == "before the writer opens":  # after merge's own early check, before the writer's
        real = offline._check_space
        monkeypatch.setattr(offline, "_check_space", lambda *a: (other_run_publishes(), real(*a))[1])
        progress = None
    else:
        progress = other_run_publishes
    with pytest.raises(OutputExistsError) as err:
        merge([sources["A"][0]], out, progress=progress)
    assert str(err.value) == (
        f"A checkpoint appeared at '{out}' ('{out}.index') while this merge was running: another run wrote it "
        "first, and it was kept. Nothing was written. Choose another output prefix, or pass overwrite=True "
        "(ckptmerge merge --force) to replace it.")
    assert read_state(tf, out, {"B": sources["B"][1]}) == "B"
    assert files(out.parent) == CLEAN


# --------------------------------------------------------------------------------------------
# concurrent merges to one prefix

# Each racer runs `ckptmerge merge CONFIG -o OUT [--force]`. The racers start at one instant,
# their first rename into the output directory waits for a second common instant (so all of them
# are publishing at once, whatever the machine's load), and every such rename is delayed by a
# random 0-100 ms, so that unserialised publishes interleave in ever other orders. Each rename
# is logged (pid, start, end) so that the test sees whether two publishes overlapped.
RACER = """
    import os, random, runpy, sys, time
    start, log, args = float(sys.argv[1]), sys.argv[2], sys.argv[3:]
    out_dir = os.path.dirname(os.path.abspath(args[args.index("-o") + 1]))
    real_replace = os.replace

    def wait_until(t):
        while time.time() < t:
            time.sleep(0.001)

    def slow_replace(src, dst, **kwargs):
        if os.path.dirname(os.path.abspath(str(dst))) == out_dir:
            wait_until(start + 2)
            time.sleep(random.uniform(0, 0.1))
            t0 = time.time()
            real_replace(src, dst, **kwargs)
            with open(log, "a") as f:
                f.write(f"{os.getpid()} {t0} {time.time()}\\n")
            return None
        return real_replace(src, dst, **kwargs)

    os.replace = slow_replace
    import ckptmerge.cli, ckptmerge.merging.local  # imported before the start, so the racers start together
    wait_until(start)
    sys.argv = ["ckptmerge", *args]
    runpy.run_module("ckptmerge", run_name="__main__", alter_sys=True)
"""
RACERS = "ABCD"  # each racer merges its own source, so any mix of two is visible


def race(forks, tmp_path: Path, sources: dict, out: Path, force: bool) -> list:
    """Start one merge per racer at the same instant; return their (exit code, stdout, stderr).

    Fails if the renames of two racers' publishes interleaved in time.
    """
    procs = []
    log = tmp_path / f"{out.parent.name}.log"
    start = time.time() + 1  # forked warm: each racer is waiting for the start well before it
    for label in RACERS:
        config = write_config(tmp_path / f"{label}.yaml", f"""
            sources:
              - {{name: {label}, path: {sources[label][0]}}}
        """)
        procs.append(forks.start(["-c", textwrap.dedent(RACER), start, log, "merge", config, "-o", out, "-q"]
                                 + (["--force"] if force else [])))
    results = [(p.returncode, out_, err) for p in procs for out_, err in [p.communicate(timeout=120)]]
    spans: dict = {}
    for line in log.read_text().splitlines():
        pid, t0, t1 = line.split()
        lo, hi = spans.get(pid, (float(t0), float(t1)))
        spans[pid] = (min(lo, float(t0)), max(hi, float(t1)))
    ordered = sorted(spans.values())
    assert all(a[1] <= b[0] for a, b in zip(ordered, ordered[1:])), f"publishes interleaved: {ordered}"
    return results


def test_concurrent_forced_merges_to_one_prefix_publish_one_whole_checkpoint(tf, sources, forks, tmp_path):
    candidates = {label: sources[label][1] for label in RACERS}
    for r in range(1):
        out = tmp_path / f"round-{r}" / "m"
        merge([sources["A"][0]], out)
        results = race(forks, tmp_path, sources, out, force=True)
        assert [code for code, _, _ in results] == [0] * len(RACERS), results  # each waits its turn
        assert read_state(tf, out, candidates) in RACERS
        assert files(out.parent) == CLEAN


def test_concurrent_merges_without_force_exactly_one_publishes(tf, sources, forks, tmp_path):
    candidates = {label: sources[label][1] for label in RACERS}
    for r in range(1):
        out = tmp_path / f"round-{r}" / "m"
        results = race(forks, tmp_path, sources, out, force=False)
        codes = sorted(code for code, _, _ in results)
        assert codes == [0] + [2] * (len(RACERS) - 1), results
        winner = next(i for i, (code, _, _) in enumerate(results) if code == 0)
        for code, stdout, stderr in results:
            if code:
                # Refused before writing, or after: the winner published while this run wrote.
                assert stdout == "" and re.match(f"Error: A checkpoint (already exists|appeared) at '{out}' ",
                                                 stderr), stderr
                assert "pass overwrite=True (ckptmerge merge --force)" in stderr and stderr.count("\n") == 1
        assert read_state(tf, out, candidates) == RACERS[winner]
        assert files(out.parent) == CLEAN
