"""Fuzzing: mutated index and data files only ever give CheckpointFormatError (or a result).

Thousands of byte flips, truncations, insertions and deletions are applied to small real
checkpoints written by TF (one name-based with a partitioned and a string tensor, one
object-based with its object graph, one in the V1 table format). Half of the mutated index (and V1)
files get their block checksums recomputed, so the table, entry, object-graph and TensorProto
parsers see the damage instead of the CRC check stopping it. Each example runs under a timer, so a
hang fails the test.
"""

from __future__ import annotations

import contextlib
import shutil
import signal
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from _reader_util import block_spans, random_value, rechecksum, tf, write_saver_checkpoint
from ckptmerge.core.errors import CheckpointFormatError
from ckptmerge.formats import open_checkpoint
from ckptmerge.formats.tf.objectgraph import parse_object_graph


class _Hang(Exception):
    pass


@contextlib.contextmanager
def _time_limit(seconds: float):
    if not hasattr(signal, "setitimer"):  # pragma: no cover - Windows: no hang guard
        yield
        return

    def on_alarm(signum, frame):
        raise _Hang(f"reader did not finish within {seconds} s")

    old = signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def _read_everything(prefix: str, verify: bool) -> None:
    """Open, list and read every tensor; only CheckpointFormatError may escape."""
    try:
        with open_checkpoint(prefix, verify=verify) as reader:
            names = [v.name for v in reader.variables()]
            for name in names:
                try:
                    reader.get(name)
                except CheckpointFormatError:
                    pass
            try:
                reader.read_many(names)
            except CheckpointFormatError:
                pass
    except CheckpointFormatError:
        pass


@pytest.fixture(scope="module")
def sources(tmp_path_factory):
    """Two small real checkpoints: {label: (folder, prefix name)}."""
    t = tf()
    rng = np.random.default_rng(11)
    name_based = tmp_path_factory.mktemp("fuzz_v1")
    write_saver_checkpoint(str(name_based / "m"), [
        {"name": "a/kernel", "dtype": "float32", "value": random_value(rng, "float32", (3, 2))},
        {"name": "emb", "dtype": "int32", "partitions": 2, "value": random_value(rng, "int32", (4, 2))},
        {"name": "vocab", "dtype": "string", "value": random_value(rng, "string", (3,))},
        {"name": "global_step", "dtype": "int64", "value": np.array(7, np.int64)}])
    object_based = tmp_path_factory.mktemp("fuzz_v2")
    module = t.Module()
    module.w = t.Variable(np.ones((2, 3), np.float32), name="dense/kernel")
    module.b = t.Variable(np.zeros(3, np.float32))
    t.train.Checkpoint(model=module).write(str(object_based / "m"))
    v1 = tmp_path_factory.mktemp("fuzz_v1format")
    write_saver_checkpoint(str(v1 / "m"), [
        {"name": "a/kernel", "dtype": "float32", "value": random_value(rng, "float32", (3, 2))},
        {"name": "emb", "dtype": "int32", "partitions": 2, "value": random_value(rng, "int32", (4, 2))},
        {"name": "half", "dtype": "float16", "value": random_value(rng, "float16", (3,))},
        {"name": "vocab", "dtype": "string", "value": random_value(rng, "string", (3,))},
        {"name": "global_step", "dtype": "int64", "value": np.array(7, np.int64)}], v1=True)
    return {"name-based": name_based, "object-based": object_based, "v1": v1}


_MUTATION = st.one_of(
    st.tuples(st.just("flip"), st.integers(0, 10_000), st.integers(1, 255)),
    st.tuples(st.just("truncate"), st.integers(0, 10_000)),
    st.tuples(st.just("insert"), st.integers(0, 10_000), st.binary(min_size=1, max_size=8)),
    st.tuples(st.just("delete"), st.integers(0, 10_000), st.integers(1, 16)),
    st.tuples(st.just("varint"), st.integers(0, 10_000)),
)


def _mutate(data: bytes, mutations) -> bytearray:
    out = bytearray(data)
    for m in mutations:
        if not out:
            break
        pos = m[1] % (len(out) + 1)
        if m[0] == "flip" and pos < len(out):
            out[pos] ^= m[2]
        elif m[0] == "truncate":
            del out[pos:]
        elif m[0] == "insert":
            out[pos:pos] = m[2]
        elif m[0] == "delete":
            del out[pos:pos + m[2]]
        elif m[0] == "varint" and pos < len(out):
            out[pos] |= 0x80  # turns a varint's last byte into a continuation byte
    return out


@settings(max_examples=600, deadline=None, derandomize=True, database=None,
          suppress_health_check=list(HealthCheck))
@given(which=st.sampled_from(["name-based", "object-based", "v1"]), mutations=st.lists(_MUTATION, min_size=1, max_size=4),
       fix_checksums=st.booleans(), verify=st.booleans())
def test_mutated_table_gives_only_format_errors(sources, tmp_path_factory, which, mutations, fix_checksums, verify):
    """The .index of a bundle, or the whole of a V1 checkpoint: both are tables."""
    folder = sources[which]
    work = _workdir(tmp_path_factory, folder)
    table = "m" if which == "v1" else "m.index"
    original = (folder / table).read_bytes()
    data = _mutate(original, mutations)
    if fix_checksums:
        rechecksum(data, block_spans(original))
    (work / table).write_bytes(bytes(data))
    with _time_limit(5.0):
        _read_everything(str(work / "m"), verify)


@settings(max_examples=150, deadline=None, derandomize=True, database=None,
          suppress_health_check=list(HealthCheck))
@given(which=st.sampled_from(["name-based", "object-based"]), mutations=st.lists(_MUTATION, min_size=1, max_size=3))
def test_mutated_data_file_gives_only_format_errors(sources, tmp_path_factory, which, mutations):
    folder = sources[which]
    work = _workdir(tmp_path_factory, folder)
    original = (folder / "m.data-00000-of-00001").read_bytes()
    (work / "m.data-00000-of-00001").write_bytes(bytes(_mutate(original, mutations)))
    with _time_limit(5.0):
        _read_everything(str(work / "m"), verify=False)
        _read_everything(str(work / "m"), verify=True)


@settings(max_examples=500, deadline=None, derandomize=True, database=None)
@given(blob=st.binary(max_size=200))
def test_object_graph_parser_gives_only_format_errors(blob):
    try:
        graph = parse_object_graph(blob)
    except CheckpointFormatError:
        return
    graph.name_keys(["x/.ATTRIBUTES/VARIABLE_VALUE", "_CHECKPOINTABLE_OBJECT_GRAPH"])


_WORKDIRS: dict = {}


def _workdir(tmp_path_factory, folder: Path) -> Path:
    """A scratch copy of ``folder`` reused across examples (restored before each one)."""
    work = _WORKDIRS.get(folder)
    if work is None:
        work = _WORKDIRS[folder] = tmp_path_factory.mktemp("fuzz_work")
    for f in folder.iterdir():
        shutil.copy(f, work / f.name)
    return work
