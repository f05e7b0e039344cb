"""Merge jobs: one per written tensor, made from a plan, each knowing where its bytes come from.

A job copies raw bytes from a source's ``.data`` shard when no cast or transform applies (in
:data:`PIECE`-sized pieces, CRC32C checked on the way), streams a cast in the same pieces, or reads
the whole tensor when a transform, a string or a partitioned variable needs it. Jobs are made
lazily (:func:`iter_jobs`) for a dry run's tally, or all at once (:func:`build_jobs`) for a write.
"""

from __future__ import annotations

import collections
import os
from dataclasses import dataclass
from typing import (
    Any,
    Callable,
    Dict,
    Iterable,
    Iterator,
    List,
    Optional,
    Sequence,
    Tuple,
)

import numpy as np

from ..core.errors import (
    CheckpointFormatError,
    CkptMergeError,
)
from ..formats.dtypes import DT_STRING, TF_TO_NUMPY, numpy_to_tf
from ..formats.tf.bundle import (
    BundleReader,
    crc32c,
    data_file_name,
    unmask_crc,
)
from ..formats.tf.objectgraph import OBJECT_GRAPH_KEY
from ..formats.tf.writer import BundleWriter
from ..planning.planner import Plan
from ..planning.transforms import TransformError, cast_array, numpy_dtype
from ..planning.chains import chain_apply
from ..sources.composed import ComposedHandle
from ..sources.handles import CheckpointHandle, SourceHandle
from ..core.specs import (
    VariableInfo,
    frozen_slots,
    trusted_maker,
)
from ..core.text import escape_name, plural, quote_name

__all__ = ["Job", "RawFiles", "Tally", "build_jobs", "iter_jobs", "out_nbytes", "source_origin",
           "unassigned_reasons", "PIECE", "TEMPLATE_LABEL", "GRAPH_NOT_COPIED"]

PIECE = 4 << 20  # raw copies and streamed casts move this many bytes at a time
TEMPLATE_LABEL = "(template)"
#: Why the input's ``_CHECKPOINTABLE_OBJECT_GRAPH`` is not copied as a tensor (a TF output writes its own).
GRAPH_NOT_COPIED = "the object graph of an object-based checkpoint is not copied"


def source_origin(label: str) -> str:
    """How a job's origin names a source in messages (and in the report's per-source counts)."""
    return f"source {quote_name(label)}"


# --------------------------------------------------------------------------------------------
# Jobs: one per written tensor
# --------------------------------------------------------------------------------------------


class RawFiles:
    """Raw access to the data shards of one bundle reader (through the reader's descriptors)."""

    def __init__(self, reader: BundleReader) -> None:
        self.reader = reader
        self.entries = reader.entries
        self._advised: set = set()

    def path(self, shard: int) -> str:
        return data_file_name(self.reader.path, shard, self.reader.num_shards)

    def fd(self, shard: int) -> int:
        """The reader's descriptor of a data shard, advised for one sequential pass."""
        fd = self.reader.data_fd(shard)
        if shard not in self._advised and hasattr(os, "posix_fadvise"):
            self._advised.add(shard)
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_SEQUENTIAL)
            except OSError:  # pragma: no cover - advisory only
                pass
        return fd

    def pieces(self, e: Any, label: str, buf: memoryview) -> Iterator[memoryview]:
        """Yield the entry's bytes in pieces of ``len(buf)`` (the buffer is reused)."""
        self.fd(e.shard_id)  # advise one sequential pass
        for pos in range(0, e.size, len(buf)):
            view = buf[:min(len(buf), e.size - pos)]
            self.reader.read_into(e.shard_id, e.offset + pos, view, e.key, label)
            yield view

    def crc_error(self, e: Any, label: str, source: str) -> CheckpointFormatError:
        path = self.path(e.shard_id)
        return CheckpointFormatError(
            f"Checksum mismatch for tensor {quote_name(label)} of {source} in {escape_name(os.path.basename(path))} "
            f"(expected 0x{unmask_crc(e.crc32c):08x}): the file is corrupt or was modified. Re-copy it, or pass "
            f"verify=False to copy it anyway. Nothing was written. (File: {escape_name(path)})", path=path, key=e.key)

    def close(self) -> None:
        """Nothing to release: the descriptors belong to the reader."""


@frozen_slots
@dataclass(frozen=True)
class Job:
    """One output tensor: where its value comes from and what happens to it on the way (slotted,
    and made by :data:`_make_job` where a merge makes one per tensor)."""

    target: VariableInfo
    origin: str                      # source label, or TEMPLATE_LABEL
    name: str                        # name in the origin checkpoint
    nbytes: int                      # bytes read from the origin (progress, report)
    read: Callable[[str], Any]       # name -> whole value (decode path); one per origin, not per job
    raw: Optional[RawFiles] = None  # set when the bytes can be streamed from a bundle shard
    key: Optional[str] = None        # raw key in the origin checkpoint
    cast: bool = False
    transforms: Tuple[Any, ...] = ()
    current: Optional[Callable[[], np.ndarray]] = None
    sort_key: Tuple[int, int, int, str] = (0, 0, 0, "")
    chunks: Optional[Callable[[str], Iterator[np.ndarray]]] = None  # a source that streams (a combination)

    def _stream_entry(self) -> Any:
        """The bundle entry when the value can be streamed (no transform), else ``None``."""
        if self.raw is None or self.transforms:
            return None
        e = self.raw.entries.get(self.name if self.key is None else self.key)
        if e is None or e.slices or e.dtype == DT_STRING or e.dtype not in TF_TO_NUMPY:
            return None
        return e

    def write(self, writer: BundleWriter, buf: memoryview, verify: bool) -> None:
        e = self._stream_entry()
        if e is not None:
            self._write_streamed(writer, e, buf, verify)
        else:
            self._write_decoded(writer)

    def _write_streamed(self, writer: BundleWriter, e: Any, buf: memoryview, verify: bool) -> None:
        raw = self.raw
        assert raw is not None
        src_dt = TF_TO_NUMPY[e.dtype]
        numel = 1
        for d in e.shape:
            numel *= d
        if e.size != numel * src_dt.itemsize:
            path = raw.path(e.shard_id)
            raise CheckpointFormatError(
                f"Corrupt tensor {quote_name(self.name)} of {self.origin} in {escape_name(os.path.basename(path))}: "
                f"the index says {e.size} bytes but shape {e.shape} of {src_dt.name} needs "
                f"{numel * src_dt.itemsize}. (File: {escape_name(path)})", path=path, key=e.key)
        key = self.target.name
        if not self.cast:
            try:
                writer.add_range(key, e.dtype, e.shape, raw.fd(e.shard_id), e.offset,
                                 expected_crc32c=e.crc32c, verify=verify)
            except CheckpointFormatError as err:
                if err.path is None:  # the writer's checksum check: name the source file instead
                    raise raw.crc_error(e, self.name, self.origin) from None
                raise
            return
        # A streamed cast: convert each piece (whole elements), checking the source CRC as we go.
        target = self.target.dtype
        out_enum = numpy_to_tf(numpy_dtype(target))
        step = len(buf) - len(buf) % src_dt.itemsize

        def converted() -> Iterator[memoryview]:
            crc = 0
            for piece in raw.pieces(e, self.name, buf[:step]):
                if verify:
                    crc = crc32c(piece, crc)
                out = cast_array(np.frombuffer(piece, dtype=src_dt), target)
                yield memoryview(np.ascontiguousarray(out).view(np.uint8))
            if verify and crc != unmask_crc(e.crc32c):
                raise raw.crc_error(e, self.name, self.origin)

        writer.add_raw(key, out_enum, e.shape, converted())

    def _write_chunks(self, writer: BundleWriter) -> None:
        """Stream the source's chunks to the writer (cast on the way): memory for a chunk."""
        assert self.chunks is not None
        target = self.target.dtype
        pieces = self.chunks(self.name)
        if self.cast:
            pieces = (cast_array(c, target) for c in pieces)
        writer.add_raw(self.target.name, numpy_to_tf(numpy_dtype(target)), self.target.shape,
                       (memoryview(np.ascontiguousarray(c).reshape(-1).view(np.uint8)) for c in pieces))

    def _write_decoded(self, writer: BundleWriter) -> None:
        if self.chunks is not None and not self.transforms and self.target.dtype != "string":
            self._write_chunks(writer)
            return
        value = np.asarray(self.read(self.name))
        if self.cast:
            value = cast_array(value, self.target.dtype)
        if self.transforms:
            current = self.current() if self.current is not None else None
            value = chain_apply(self.transforms, value, current, target_shape=self.target.shape)
        if tuple(value.shape) != tuple(self.target.shape):  # pragma: no cover - the plan checked it
            raise CkptMergeError(f"Internal error: {quote_name(self.target.name)} has shape {tuple(value.shape)} "
                                 f"after reading, the plan expected {tuple(self.target.shape)}.")
        writer.add(self.target.name, value)


def entry_order(raw: Optional[RawFiles], key: str) -> Tuple[int, int]:
    if raw is None:
        return 0, 0
    where = raw.entries.location(key)
    return (0, 0) if where is None else where


def no_order(raw: Optional[RawFiles], key: str) -> Tuple[int, int]:
    return 0, 0


def unassigned_reasons(plan: Plan) -> Dict[str, str]:
    """Why each target without an assignment has none."""
    reasons: Dict[str, str] = {}
    for t in plan.allowed_missing:
        reasons[t] = "allowed missing: no source provides it"
    for t in plan.missing:
        reasons[t] = "missing: no source provides it (strict=False)"
    for m in plan.mismatched:
        reasons[m.target] = m.describe() + (" (on_shape_mismatch='skip')" if plan.on_shape_mismatch == "skip"
                                            else " (strict=False)")
    for c in plan.conflicts:
        if c.blocking:
            reasons[c.target] = c.message().split(" (pass on_conflict")[0] + " (strict=False)"
    return reasons


#: ``_make_job(target, origin, name, nbytes, read, raw, key, cast, transforms, current, sort_key, chunks)``
#: (every field, checked by the caller: see :func:`ckptmerge.core.specs.trusted_maker`).
_make_job = trusted_maker(Job)


def build_jobs(plan: Plan, handles: Sequence[SourceHandle], kind: str, template: Optional[Any],
                template_prefix: str) -> Tuple[List[Job], List[Tuple[str, str]], List[Tuple[str, str]]]:
    """The write jobs in read order (by source, then where each tensor is stored), the names
    taken from the template, and those left out."""
    from_template: List[Tuple[str, str]] = []
    skipped: List[Tuple[str, str]] = []
    jobs = list(iter_jobs(plan, handles, kind, template, template_prefix, from_template, skipped, entry_order))
    jobs.sort(key=lambda j: j.sort_key)
    return jobs, from_template, skipped


class Tally:
    """What a merge writes, per origin: the report's counts without keeping a job per tensor
    (a dry run tallies the jobs as they are made)."""

    def __init__(self, jobs: Iterable[Job]) -> None:
        self.names: List[str] = []
        self.count: Dict[str, int] = collections.Counter()
        self.nbytes: Dict[str, int] = collections.Counter()
        append, count, nbytes = self.names.append, self.count, self.nbytes
        for j in jobs:
            append(j.target.name)
            origin = j.origin
            count[origin] += 1
            nbytes[origin] += j.nbytes
        self.total = sum(nbytes.values())


def iter_jobs(plan: Plan, handles: Sequence[SourceHandle], kind: str, template: Optional[Any],
               template_prefix: str, from_template: List[Tuple[str, str]], skipped: List[Tuple[str, str]],
               entry_order: Callable[[Optional["RawFiles"], str], Tuple[int, int]] = no_order) -> Iterator[Job]:
    """The write jobs, made one at a time (sources first, then the template), appending the
    names taken from the template to ``from_template`` and those left out to ``skipped``;
    ``entry_order`` gives a job's place in its file (for sorting: a dry run needs none).

    Raises:
        TransformError: an ``init="keep"`` transform without a template to give the current value
            (after the sources' jobs).
    """
    raws: Dict[str, Optional[RawFiles]] = {}
    for h in handles:
        # (a source with Concat entries: its other tensors still copy as raw bytes; see below)
        base = h.inner if isinstance(h, ComposedHandle) else h
        reader = getattr(base, "reader", None) if isinstance(base, CheckpointHandle) else None
        local = isinstance(reader, BundleReader) and not reader.remote  # remote: ranged reads, decoded path
        raws[h.label] = RawFiles(reader) if local else None
    t_raw = RawFiles(template) if isinstance(template, BundleReader) and not template.remote else None
    views = {v.label: v for v in plan.sources}

    needs_current: List[str] = []

    def template_value(name: str) -> Callable[[], np.ndarray]:
        return lambda: template.get(name)

    # One origin text and one read function per source (not per job: a merge makes 100,000s).
    # (source index, origin, read, raw files, transforms) per source label
    per_source = {h.label: (i, source_origin(h.label), (lambda n, h=h: h.read([n])[n]), raws[h.label],
                            views[h.label].transforms, h.iter_chunks if h.streams else None)
                  for i, h in enumerate(handles)}
    make = _make_job
    for a in plan.assignments.values():
        si, origin, read, raw, transforms, chunks = per_source[a.source]
        key, target = a.key, a.target
        if raw is not None and a.name in views[a.source].composed:  # a joined tensor is made, not copied
            raw = None
        if key == OBJECT_GRAPH_KEY:
            skipped.append((target, GRAPH_NOT_COPIED + ": the merged checkpoint is name-based (its keys are "
                                    "variable names)"))
            continue
        ts: Tuple[Any, ...] = ()
        current = None
        if transforms:
            ts = tuple(t for t in transforms if t.applies_to(target))
            if any(getattr(t, "needs_current", False) for t in ts):
                if template is None:
                    needs_current.append(f"{quote_name(target)} ({'; '.join(a.transforms) or 'transform'})")
                else:
                    current = template_value(target)
        order = entry_order(raw, key)
        yield make(a.target_spec, origin, a.name, a.spec.nbytes, read, raw, key, a.cast, ts, current,
                   (si, order[0], order[1], target), chunks)
    if needs_current:
        raise TransformError(
            f"{plural(len(needs_current), 'transform')} with init='keep' need the target's current "
            "value, which a merge takes from a template checkpoint, and there is none: "
            + ", ".join(needs_current[:5]) + (f" ... and {len(needs_current) - 5} more" if len(needs_current) > 5 else "")
            + ". Use init='zeros', or pass template=<checkpoint> whose values fill the rest.")

    reasons = unassigned_reasons(plan)
    n_sources = len(handles)
    template_origin = f"the template {quote_name(template_prefix)}"
    for spec in plan.targets:
        if spec.name in plan.assignments:
            continue
        why = reasons.get(spec.name, "not provided")
        if template is None:
            if kind in ("specs", "model"):
                why += f"; a template given as {'specs' if kind == 'specs' else 'a model'} has no value to write"
            skipped.append((spec.name, why))
            continue
        info = template.info(spec.name)
        from_template.append((spec.name, why))
        yield Job(target=spec, origin=template_origin, name=spec.name,
                   nbytes=info.nbytes, read=template.get, raw=t_raw, key=info.raw_key,
                   sort_key=(n_sources, *entry_order(t_raw, info.raw_key), spec.name))


# --------------------------------------------------------------------------------------------
# Disk space and the state file
# --------------------------------------------------------------------------------------------


def out_nbytes(spec: VariableInfo, job_nbytes: int) -> int:
    if spec.dtype == "string":
        return job_nbytes
    try:
        return spec.size * numpy_dtype(spec.dtype).itemsize
    except TransformError:  # quantized and other exotic dtypes: same size as read
        return job_nbytes


