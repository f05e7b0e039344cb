"""Offline merge: write one new checkpoint assembled from several, without building a model.

:func:`merge` takes the same sources and rules as :func:`ckptmerge.plan` and writes a standard
TensorFlow checkpoint (``<out>.index`` + ``<out>.data-*``) that ``tf.train.load_checkpoint``,
``tf.compat.v1.train.Saver`` and ckptmerge itself read back with bit-identical values. It renames
scopes, combines models and drops optimizer state with no model code and no TensorFlow: sources
are read with ckptmerge's reader and written with :class:`~ckptmerge.formats.writer.BundleWriter`.

What the output holds:

* **No template**: every name the sources produce after their rules (optimizer state and
  bookkeeping are left out unless a source says ``optimizer=True``). Two sources or rules that
  produce one name are a conflict finding, resolved by ``on_conflict="first"``/``"last"``.
* **A template checkpoint** (``template="runs/C"``): exactly its model variables (names,
  shapes, dtypes), with every plan finding (missing, mismatched, ...). A template variable no
  source provides (``allow_missing``, or any finding with ``strict=False``) keeps the
  template's own value, and the template's values are the "current" values of transforms with
  ``init="keep"``.
* **A template given as specs** (a list of :class:`~ckptmerge.specs.VariableInfo`, e.g. from a
  model built by ``ckptmerge merge --model``): exactly those names and shapes; a variable no
  source provides has no value to write, so it is left out of the output and listed in
  ``report.skipped`` (allow it with ``allow_missing``, or it blocks a strict merge).

How it is written: one tensor at a time. Tensors that need no cast and no transform are copied
as raw bytes from the source's ``.data`` file to the writer in 4 MiB pieces, never decoded, their
CRC32C checked on the way (so peak memory stays a few MiB whatever the size); casts stream in the
same pieces; only vocabulary remaps, slices, strings, partitioned variables and Keras ``.h5``
sources read a whole tensor. The writer streams into hidden temporary files and renames them into
place only when complete: a merge that fails or is killed leaves the output prefix as it was,
and with ``overwrite`` the prefix reads as exactly the old or exactly the new checkpoint at every
instant. Merges to one prefix publish one at a time (see :mod:`ckptmerge.formats.writer`).
Nothing here imports TensorFlow.
"""

from __future__ import annotations

import collections
import errno
import json
import logging
import operator
import os
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Iterable, Iterator, List, Optional, Sequence, Tuple, Union

import numpy as np

from .api import SourcesArg, as_sources, check_unique_labels, open_sources
from .errors import (
    ArgumentError,
    ArgumentTypeError,
    CheckpointFormatError,
    CheckpointWriteError,
    CkptMergeError,
    OutputExistsError,
    PlanError,
)
from .formats import open_checkpoint
from .formats.bundle import DATA_RE, BundleReader, crc32c, data_file_name, unmask_crc
from .formats.dtypes import DT_STRING, TF_TO_NUMPY, numpy_to_tf
from .formats.objectgraph import OBJECT_GRAPH_KEY
from .formats.output_prefix import check_no_output
from .formats.storage import is_url
from .formats.writer import BundleWriter
from .gcpause import paused_gc
from .planner import Plan, SourceView, make_plan
from .report import Report, _section
from .resolve import STATE_FILE, read_state_file, resolve_checkpoint
from .source import CheckpointHandle, SourceHandle
from .specs import KIND_VARIABLE, VariableInfo, frozen_slots, trusted_info, trusted_maker
from .text import escape_name, human_bytes, join_lines, plural, quote_name
from .transforms import (
    Slice,
    TransformError,
    cast_array,
    chain_apply,
    chain_output_shape,
    numpy_dtype,
    select,
)

__all__ = ["merge", "MergeReport", "Progress"]

logger = logging.getLogger(__name__)

#: A progress callback: ``progress(done_bytes, total_bytes)`` (bytes read from the sources).
Progress = Callable[[int, int], None]
TemplateArg = Union[None, str, "os.PathLike[str]", Sequence[VariableInfo]]

_PIECE = 4 << 20  # raw copies and streamed casts move this many bytes at a time
_TEMPLATE_LABEL = "(template)"
_REPLACE_HINT = "pass overwrite=True (ckptmerge merge --force)"


# --------------------------------------------------------------------------------------------
# The report
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class MergeReport(Report):
    """What :func:`merge` did (or, with ``dry_run``, would do); a :class:`~ckptmerge.report.Report`.

    ``mode`` is ``"offline"``; ``restored`` lists every name written to the output (sorted),
    those copied from a template checkpoint included; ``skipped`` lists ``(name, reason)`` of
    target names left out of the output.

    Attributes:
        output: the output prefix as given.
        dry_run: ``True`` when nothing was written.
        bytes_written: size of the written ``.index`` and ``.data-*`` files (0 for a dry run).
        from_template: ``(name, reason)`` of the names whose value came from the template
            checkpoint (sorted).
        state_file: the ``checkpoint`` state file written (``update_state=True``), else ``None``.

    Example:
        >>> from ckptmerge.planner import make_plan
        >>> MergeReport(make_plan([], []), "offline", [], [], 0.5, 0, [], output="out/m").summary()
        "wrote 0 variables from 0 sources to 'out/m' in 0.50 s"
    """

    output: str = ""
    dry_run: bool = False
    bytes_written: int = 0
    from_template: List[Tuple[str, str]] = field(default_factory=list)
    state_file: Optional[str] = None

    def __post_init__(self) -> None:
        super().__post_init__()
        object.__setattr__(self, "from_template", sorted((str(n), str(r)) for n, r in self.from_template))

    def summary(self) -> str:
        """One line, e.g. ``"wrote 12 variables (2 from the template) from 2 sources to 'out/m' in 0.40 s"``."""
        n = plural(len(self.restored), "variable")
        if self.from_template:
            n += f" ({len(self.from_template)} from the template)"
        text = (f"{'would write' if self.dry_run else 'wrote'} {n} from "
                f"{plural(self.n_sources_used, 'source')} to {quote_name(self.output)}")
        if not self.dry_run:
            text += f" in {self.elapsed:.2f} s"
        if self.skipped:
            text += f"; {len(self.skipped)} left out"
        return text

    def render(self, *, limit: Optional[int] = 50) -> str:
        """Plain text: the summary, bytes, per-source lines, written, from template, left out."""
        written = (f"; wrote {human_bytes(self.bytes_written)}" if not self.dry_run
                   else " (dry run: nothing written)")
        out = [self.summary(), f"Mode: offline; read {human_bytes(self.bytes_read)}{written}"]
        out += self._source_lines("written")
        by_target = self.plan.assignments
        out += _section("Would write" if self.dry_run else "Written", self.restored, limit,
                        render=lambda t: by_target[t].describe() if t in by_target else f"{t} <- {_TEMPLATE_LABEL}")
        out += _section("From the template", [f"{t}: {r}" for t, r in self.from_template], limit)
        out += _section("Left out", [f"{t}: {r}" for t, r in self.skipped], limit)
        if self.state_file:
            out.append(f"State file: {self.state_file}")
        return join_lines(out)

    def to_dict(self, *, lazy: bool = False) -> dict:
        """JSON-ready: :meth:`Report.to_dict` plus ``output``, ``dry_run``, ``bytes_written``,
        ``from_template`` (``[{"name", "reason"}]``) and ``state_file``."""
        d = super().to_dict(lazy=lazy)
        d.update({"output": self.output, "dry_run": self.dry_run, "bytes_written": int(self.bytes_written),
                  "from_template": [{"name": n, "reason": r} for n, r in self.from_template],
                  "state_file": self.state_file})
        return d


# --------------------------------------------------------------------------------------------
# Argument checks (all before any checkpoint is read)
# --------------------------------------------------------------------------------------------


def _check_flag(name: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise ArgumentTypeError(f"{name} must be True or False. Received: {name}={value!r}")
    return value


def _check_out_prefix(out_prefix: Any) -> str:
    if isinstance(out_prefix, bool) or not isinstance(out_prefix, (str, os.PathLike)):
        raise ArgumentTypeError("out_prefix must be a checkpoint prefix (str or os.PathLike), e.g. "
                                f"'out/merged'. Received: out_prefix={out_prefix!r:.80}")
    given = os.fspath(out_prefix)
    if not isinstance(given, str) or not given:
        raise ArgumentError(f"out_prefix must be a non-empty path. Received: out_prefix={out_prefix!r}")
    if given.endswith(("/", os.sep)) or os.path.isdir(given):
        example = os.path.join(given.rstrip("/" + os.sep) or ".", "merged")
        raise ArgumentError(
            f"out_prefix must be a checkpoint prefix, not a directory: the merge writes "
            f"'<prefix>.index' and '<prefix>.data-*'. Pass a prefix inside the directory, e.g. "
            f"{quote_name(example)}. Received: out_prefix={given!r}")
    if given.endswith(".index") or DATA_RE.search(given):
        stem = given[:-len(".index")] if given.endswith(".index") else given[:DATA_RE.search(given).start()]
        raise ArgumentError(f"out_prefix must be the checkpoint prefix without '.index' or '.data-*', "
                            f"e.g. {quote_name(stem)}. Received: out_prefix={given!r}")
    return given


def _check_template(template: Any) -> Tuple[str, Any]:
    """Classify the template: ``("none", None)``, ``("path", str)`` or ``("specs", [VariableInfo])``."""
    if template is None:
        return "none", None
    if isinstance(template, (str, os.PathLike)):
        return "path", os.fspath(template)
    if isinstance(template, (list, tuple)):
        bad = [i for i, t in enumerate(template) if not isinstance(t, VariableInfo)]
        if bad:
            raise ArgumentTypeError(
                "template must be None, a checkpoint path, or a list of ckptmerge.VariableInfo; "
                f"template[{bad[0]}] is {template[bad[0]]!r:.80} (type {type(template[bad[0]]).__name__}).")
        if not template:
            raise ArgumentError("template is an empty list: the output would hold no variables. "
                                "Pass template=None to write every name the sources produce.")
        return "specs", list(template)
    raise ArgumentTypeError("template must be None, a checkpoint path, or a list of ckptmerge.VariableInfo "
                            f"(e.g. ckptmerge.list_variables(path)). Received: {template!r:.80} "
                            f"(type {type(template).__name__})")


def _same_prefix(a: str, b: str) -> bool:
    if is_url(a) or is_url(b):  # object storage: no links, no case folding
        return a.rstrip("/") == b.rstrip("/")
    return os.path.normcase(os.path.realpath(a)) == os.path.normcase(os.path.realpath(b))


def _check_not_an_input(out_abs: str, given: str, inputs: Sequence[Tuple[str, str]]) -> None:
    """Refuse an output prefix that is one of the inputs: writing would destroy what is read."""
    for label, prefix in inputs:
        if _same_prefix(out_abs, prefix):
            raise ArgumentError(
                f"The output prefix {quote_name(given)} is the checkpoint of {label} ({escape_name(prefix)}): "
                "merging into a checkpoint that is being read would destroy it, even with overwrite=True. "
                "Write to another prefix, then move the result if you want to replace the input.")


# --------------------------------------------------------------------------------------------
# Targets
# --------------------------------------------------------------------------------------------


def _produced_targets(views: Sequence[SourceView], on_conflict: str) -> List[VariableInfo]:
    """The target specs of a merge without a template: every name the rules produce.

    A name produced more than once takes the spec of the provider ``on_conflict`` would pick
    (the first one for ``"error"``: the conflict blocks anyway); the planner then reports the
    conflict. Names that regex rules rename ambiguously produce a target only when
    ``on_conflict`` resolves the ambiguity, as in the plan.

    Raises:
        TransformError: a :class:`~ckptmerge.transforms.Slice` applies to a produced name (a
            slice needs a target shape, which only a template gives).
    """
    if len(views) == 1 and not views[0].transforms:
        one = _produced_by_one(views[0], on_conflict)
        if one is not None:
            return one
    chosen: Dict[str, Tuple[Tuple[int, str], VariableInfo, SourceView]] = {}
    for si, view in enumerate(views):
        res = view.rules._apply(list(view.variables))
        pairs = list(zip(res.names, res.targets))
        if on_conflict != "error":
            for amb in res.ambiguous:
                picked = amb.targets[0 if on_conflict == "first" else -1]
                if picked is not None:
                    pairs.append((amb.name, picked))
        for name, tname in pairs:
            order = (si, name)
            prev = chosen.get(tname)
            if prev is None or (order > prev[0] if on_conflict == "last" else order < prev[0]):
                chosen[tname] = (order, view.variables[name], view)
    specs: List[VariableInfo] = []
    slices: List[str] = []
    for tname in sorted(chosen):
        _, spec, view = chosen[tname]
        shape = tuple(spec.shape)
        ts = select(view.transforms, tname)
        if any(isinstance(t, Slice) for t in ts):
            slices.append(f"{view.label}: Slice for {quote_name(next(t.target for t in ts if isinstance(t, Slice)))} "
                          f"applies to {quote_name(tname)}")
            continue
        if ts:
            try:
                shape = tuple(chain_output_shape(ts, shape, shape))  # e.g. the new vocabulary's size
            except TransformError:
                pass  # the plan reports the transform mismatch with its reason
        nbytes = spec.nbytes if shape == tuple(spec.shape) else 0
        specs.append(trusted_info(tname, shape, spec.dtype, tname, spec.kind, nbytes))
    if slices:
        raise TransformError(
            f"{plural(len(slices), 'slice transform')} cannot apply in a merge without a template: a "
            "slice copies the overlap with the target's shape, and without a template there is no "
            "target shape (" + "; ".join(slices[:5]) + (f"; ... and {len(slices) - 5} more" if len(slices) > 5 else "")
            + "). Pass template=<checkpoint or list of VariableInfo> with the shapes you want, or "
            "remove the slice.")
    return specs


def _produced_by_one(view: SourceView, on_conflict: str) -> Optional[List[VariableInfo]]:
    """:func:`_produced_targets` of one source without transforms whose rules give each target
    one name (the usual merge), in passes at C speed; ``None`` when that is not the case."""
    res = view.rules._apply(list(view.variables))
    if res.ambiguous and on_conflict != "error":  # (picks to add: the general way)
        return None
    names, tnames = res.names, res.targets
    del res
    if not all(map(operator.lt, tnames, tnames[1:])):  # a target named twice: a conflict to report
        return None
    specs = list(map(view.variables.__getitem__, names))
    del names
    return list(map(trusted_info, tnames, map(_SHAPE, specs), map(_DTYPE, specs), tnames, map(_KIND, specs),
                    map(_NBYTES, specs)))


_SHAPE, _DTYPE = operator.attrgetter("shape"), operator.attrgetter("dtype")
_KIND, _NBYTES = operator.attrgetter("kind"), operator.attrgetter("nbytes")


def _source_origin(label: str) -> str:
    """How a job's origin names a source in messages (and in the report's per-source counts)."""
    return f"source {quote_name(label)}"


def _template_targets(reader: Any, prefix: str) -> List[VariableInfo]:
    specs = [v for v in reader.variables() if v.kind == KIND_VARIABLE]
    if not specs:
        raise CkptMergeError(f"The template checkpoint {quote_name(prefix)} has no model variables (only optimizer "
                             "state or bookkeeping), so the output would be empty. Pass another template, "
                             "or template=None to write every name the sources produce.")
    return specs


# --------------------------------------------------------------------------------------------
# Jobs: one per written tensor
# --------------------------------------------------------------------------------------------


class _RawFiles:
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
class _Job:
    """One output tensor: where its value comes from and what happens to it on the way (slotted,
    and made by :data:`_make_job` where a merge makes one per tensor)."""

    target: VariableInfo
    origin: str                      # source label, or _TEMPLATE_LABEL
    name: str                        # name in the origin checkpoint
    nbytes: int                      # bytes read from the origin (progress, report)
    read: Callable[[str], Any]       # name -> whole value (decode path); one per origin, not per job
    raw: Optional[_RawFiles] = None  # set when the bytes can be streamed from a bundle shard
    key: Optional[str] = None        # raw key in the origin checkpoint
    cast: bool = False
    transforms: Tuple[Any, ...] = ()
    current: Optional[Callable[[], np.ndarray]] = None
    sort_key: Tuple[int, int, int, str] = (0, 0, 0, "")

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

    def _write_decoded(self, writer: BundleWriter) -> None:
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


def _entry_order(raw: Optional[_RawFiles], key: str) -> Tuple[int, int]:
    if raw is None:
        return 0, 0
    where = raw.entries.location(key)
    return (0, 0) if where is None else where


def _no_order(raw: Optional[_RawFiles], key: str) -> Tuple[int, int]:
    return 0, 0


def _unassigned_reasons(plan: Plan) -> Dict[str, str]:
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


#: ``_make_job(target, origin, name, nbytes, read, raw, key, cast, transforms, current, sort_key)``
#: (every field, checked by the caller: see :func:`ckptmerge.specs.trusted_maker`).
_make_job = trusted_maker(_Job)


def _build_jobs(plan: Plan, handles: Sequence[SourceHandle], kind: str, template: Optional[Any],
                template_prefix: str) -> Tuple[List[_Job], List[Tuple[str, str]], List[Tuple[str, str]]]:
    """The write jobs in read order (by source, then where each tensor is stored), the names
    taken from the template, and those left out."""
    from_template: List[Tuple[str, str]] = []
    skipped: List[Tuple[str, str]] = []
    jobs = list(_iter_jobs(plan, handles, kind, template, template_prefix, from_template, skipped, _entry_order))
    jobs.sort(key=lambda j: j.sort_key)
    return jobs, from_template, skipped


class _Tally:
    """What a merge writes, per origin: the report's counts without keeping a job per tensor
    (a dry run tallies the jobs as they are made)."""

    def __init__(self, jobs: Iterable[_Job]) -> None:
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


def _iter_jobs(plan: Plan, handles: Sequence[SourceHandle], kind: str, template: Optional[Any],
               template_prefix: str, from_template: List[Tuple[str, str]], skipped: List[Tuple[str, str]],
               entry_order: Callable[[Optional["_RawFiles"], str], Tuple[int, int]] = _no_order) -> Iterator[_Job]:
    """The write jobs, made one at a time (sources first, then the template), appending the
    names taken from the template to ``from_template`` and those left out to ``skipped``;
    ``entry_order`` gives a job's place in its file (for sorting: a dry run needs none).

    Raises:
        TransformError: an ``init="keep"`` transform without a template to give the current value
            (after the sources' jobs).
    """
    raws: Dict[str, Optional[_RawFiles]] = {}
    for h in handles:
        reader = getattr(h, "reader", None) if isinstance(h, CheckpointHandle) else None
        local = isinstance(reader, BundleReader) and not reader.remote  # remote: ranged reads, decoded path
        raws[h.label] = _RawFiles(reader) if local else None
    t_raw = _RawFiles(template) if isinstance(template, BundleReader) and not template.remote else None
    views = {v.label: v for v in plan.sources}

    needs_current: List[str] = []

    def template_value(name: str) -> Callable[[], np.ndarray]:
        return lambda: template.get(name)

    # One origin text and one read function per source (not per job: a merge makes 100,000s).
    # (source index, origin, read, raw files, transforms) per source label
    per_source = {h.label: (i, _source_origin(h.label), (lambda n, h=h: h.read([n])[n]), raws[h.label],
                            views[h.label].transforms) for i, h in enumerate(handles)}
    make = _make_job
    for a in plan.assignments.values():
        si, origin, read, raw, transforms = per_source[a.source]
        key, target = a.key, a.target
        if key == OBJECT_GRAPH_KEY:
            skipped.append((target, "the object graph of an object-based checkpoint is not copied: the "
                                    "merged checkpoint is name-based (its keys are variable names)"))
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
                   (si, order[0], order[1], target))
    if needs_current:
        raise TransformError(
            f"{plural(len(needs_current), 'transform')} with init='keep' need the target's current "
            "value, which a merge takes from a template checkpoint, and there is none: "
            + ", ".join(needs_current[:5]) + (f" ... and {len(needs_current) - 5} more" if len(needs_current) > 5 else "")
            + ". Use init='zeros', or pass template=<checkpoint> whose values fill the rest.")

    reasons = _unassigned_reasons(plan)
    n_sources = len(handles)
    template_origin = f"the template {quote_name(template_prefix)}"
    for spec in plan.targets:
        if spec.name in plan.assignments:
            continue
        why = reasons.get(spec.name, "not provided")
        if template is None:
            if kind == "specs":
                why += "; a template given as specs has no value to write"
            skipped.append((spec.name, why))
            continue
        info = template.info(spec.name)
        from_template.append((spec.name, why))
        yield _Job(target=spec, origin=template_origin, name=spec.name,
                   nbytes=info.nbytes, read=template.get, raw=t_raw, key=info.raw_key,
                   sort_key=(n_sources, *entry_order(t_raw, info.raw_key), spec.name))


# --------------------------------------------------------------------------------------------
# Disk space and the state file
# --------------------------------------------------------------------------------------------


def _out_nbytes(spec: VariableInfo, job_nbytes: int) -> int:
    if spec.dtype == "string":
        return job_nbytes
    try:
        return spec.size * numpy_dtype(spec.dtype).itemsize
    except TransformError:  # quantized and other exotic dtypes: same size as read
        return job_nbytes


def _check_space(out_abs: str, given: str, needed: int) -> None:
    """Refuse before writing when the disk clearly lacks room (quotas are caught while writing)."""
    probe = os.path.dirname(out_abs)
    while probe and not os.path.isdir(probe):
        parent = os.path.dirname(probe)
        if parent == probe:
            return
        probe = parent
    try:
        st = os.statvfs(probe)
    except (OSError, AttributeError):  # pragma: no cover - Windows or odd filesystems
        return
    if st.f_blocks == 0:  # a pseudo filesystem (/proc, ...) reports no size: let the write say why
        return
    free = st.f_bavail * st.f_frsize
    if needed > free:
        raise CheckpointWriteError(
            f"Not enough space to write checkpoint {quote_name(given)}: it needs about {human_bytes(needed)} but "
            f"only {human_bytes(free)} is free on the disk of {quote_name(probe)}. Free some space on that disk, "
            "or write the checkpoint elsewhere. No checkpoint was written.", path=probe, errno_=errno.ENOSPC)


def _text_escape(path: str) -> str:
    """Quote a path for a text-format proto string, as protobuf's CEscape does."""
    out = []
    for b in os.fsencode(path):
        c = chr(b)
        if c in "\\\"'":
            out.append("\\" + c)
        elif c == "\n":
            out.append("\\n")
        elif c == "\r":
            out.append("\\r")
        elif c == "\t":
            out.append("\\t")
        elif 0x20 <= b < 0x7F:
            out.append(c)
        else:
            out.append(f"\\{b:03o}")
    return '"' + "".join(out) + '"'


def _state_text(out_abs: str, state: Any) -> str:
    """The new ``checkpoint`` state file: the output is the latest; earlier entries are kept.

    Earlier paths keep the strings they were recorded with; the new checkpoint is recorded by
    its base name (relative to the directory, as TensorFlow records checkpoints it saves there).
    Timestamps are written when the earlier ones line up with their paths (or there are none).
    """
    paths: List[str] = []
    stamps: List[float] = []
    keep_stamps = True
    if state is not None:
        old_stamps = state.all_model_checkpoint_timestamps
        keep_stamps = len(old_stamps) == len(state.all_model_checkpoint_paths)
        for i, (recorded, resolved) in enumerate(zip(state.recorded_all_model_checkpoint_paths,
                                                     state.all_model_checkpoint_paths)):
            if _same_prefix(resolved, out_abs) or recorded in paths:
                continue
            paths.append(recorded)
            if keep_stamps:
                stamps.append(old_stamps[i])
    new = os.path.basename(out_abs)
    paths.append(new)
    stamps.append(time.time())
    lines = [f"model_checkpoint_path: {_text_escape(new)}"]
    lines += [f"all_model_checkpoint_paths: {_text_escape(p)}" for p in paths]
    if keep_stamps:
        lines += [f"all_model_checkpoint_timestamps: {t!r}" for t in stamps]
    if state is not None and state.last_preserved_timestamp is not None:
        lines.append(f"last_preserved_timestamp: {state.last_preserved_timestamp!r}")
    return "\n".join(lines) + "\n"


def _write_state(out_abs: str, given: str, state: Any) -> str:
    """Write the output directory's ``checkpoint`` file atomically (temp file, fsync, rename)."""
    directory = os.path.dirname(out_abs)
    final = os.path.join(directory, STATE_FILE)
    tmp = os.path.join(directory, f".{STATE_FILE}.ckptmerge-tmp-{os.getpid()}-{os.urandom(4).hex()}")
    text = _state_text(out_abs, state)
    try:
        with open(tmp, "x", encoding="utf-8", errors="surrogateescape") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, final)
    except OSError as e:
        try:
            os.remove(tmp)
        except OSError:
            pass
        raise CheckpointWriteError(
            f"The checkpoint {quote_name(given)} was written, but its directory's state file {quote_name(final)} "
            f"could not be updated: {escape_name(e.strerror or e)}. Check that you may write to "
            f"{quote_name(directory)}; the checkpoint itself is "
            "complete and can be used by its prefix.", path=final, errno_=e.errno) from e
    return final


# --------------------------------------------------------------------------------------------
# merge
# --------------------------------------------------------------------------------------------


FORMAT_TF = "tf"
FORMAT_SAFETENSORS = "safetensors"
_FORMATS = (FORMAT_TF, FORMAT_SAFETENSORS)


def _check_format(format: Any, given: str) -> str:
    if format is None:
        return FORMAT_SAFETENSORS if given.endswith(".safetensors") else FORMAT_TF
    if format not in _FORMATS:
        raise ArgumentError(f"format must be one of {', '.join(map(repr, _FORMATS))} or None (by the output's "
                            f"suffix). Received: format={format!r:.80}")
    return format


def _open_writer(fmt: str, given: str, jobs: Sequence["_Job"], handles: Sequence[SourceHandle], plan: Plan, *,
                 overwrite: bool, durable: bool) -> Any:
    """The writer for the output format; both take the jobs' tensors the same way."""
    if fmt == FORMAT_TF:
        return BundleWriter(given, overwrite=overwrite, durable=durable)
    from .formats.safetensors_writer import SafetensorsWriter, unsupported_dtypes

    specs = [(j.target.name, j.target.dtype, j.target.shape) for j in jobs]
    bad = unsupported_dtypes(specs)
    if bad:
        names = ", ".join(f"{quote_name(n)} ({d})" for n, d in bad[:5]) + (f" and {len(bad) - 5} more" if len(bad) > 5 else "")
        raise ArgumentError(f"safetensors cannot store {plural(len(bad), 'tensor')} of this merge: {names}. "
                            "Exclude them (Source(..., exclude=[...])), or write a TF checkpoint.")
    sources = [{"label": h.label, "path": h.path, "note": h.note} for h in handles]
    assigned = {t: f"{a.source}:{a.name}" for t, a in sorted(plan.assignments.items())}
    metadata = {"ckptmerge.sources": json.dumps(sources), "ckptmerge.plan": json.dumps(assigned)}
    return SafetensorsWriter(given, specs, metadata=metadata, overwrite=overwrite, durable=durable)


def merge(
    sources: SourcesArg,
    out_prefix: Union[str, "os.PathLike[str]"],
    *,
    template: TemplateArg = None,
    allow_missing: Union[str, Sequence[str]] = (),
    on_conflict: str = "error",
    on_shape_mismatch: str = "error",
    cast: bool = False,
    strict: bool = True,
    overwrite: bool = False,
    dry_run: bool = False,
    update_state: bool = False,
    progress: Optional[Progress] = None,
    verify: bool = True,
    durable: bool = False,
    format: Optional[str] = None,
) -> Report:
    """Write a new checkpoint assembled from ``sources``, without TensorFlow.

    The sources and their rules are those of :func:`ckptmerge.plan`; the plan is computed (and,
    with ``strict``, checked) before a single byte is written. See the module docstring for what
    the output holds with and without a template.

    Args:
        sources: :class:`~ckptmerge.Source` objects (or checkpoint paths), in priority order.
        out_prefix: the checkpoint prefix to write, e.g. ``"out/merged"`` writes
            ``out/merged.index`` and ``out/merged.data-00000-of-00001``; missing directories
            are created. It must not be a source's (or the template's) own prefix.
        template: ``None`` (write every name the sources produce); a checkpoint path (exactly its
            model variables; its values fill what no source provides and are the current values
            of ``init="keep"`` transforms); or a list of :class:`~ckptmerge.VariableInfo` (exactly
            those names and shapes; unprovided names are left out and reported).
        allow_missing: glob(s) of template names no source needs to provide.
        on_conflict: ``"error"``, ``"first"`` or ``"last"`` when two sources or rules provide a name.
        on_shape_mismatch: ``"error"`` or ``"skip"`` (keep the template's value, or leave it out).
        cast: convert dtypes to the template's (e.g. float16 -> float32).
        strict: raise :class:`~ckptmerge.PlanError` for any finding other than ``unused``, before
            anything is written. ``False`` writes what matches and reports the rest.
        overwrite: replace an existing checkpoint at ``out_prefix``. At every instant, even if
            the merge is killed, the prefix reads as exactly the old or exactly the new
            checkpoint; of several merges racing to one prefix, the last to finish wins.
        dry_run: plan and report, write nothing.
        update_state: also write the output directory's ``checkpoint`` state file, naming the
            new checkpoint as the latest (earlier entries are kept), so ``tf.train.latest_checkpoint``
            finds it.
        progress: called as ``progress(done_bytes, total_bytes)`` once before the first tensor
            and after each tensor (bytes read from the sources).
        verify: check every CRC32C while reading (``False`` copies corrupt tensors as they are).
        durable: fsync every output file before it is renamed into place, so the checkpoint also
            survives a power loss (slower: it waits for the disk). Without it the output is still
            all-or-nothing for the process: a merge killed half-way leaves the prefix as it was.
        format: ``"tf"`` (a TF checkpoint) or ``"safetensors"`` (one ``.safetensors`` file whose
            metadata records the sources and the plan); default: ``"safetensors"`` when
            ``out_prefix`` ends with ``.safetensors``, else ``"tf"``.

    Returns:
        A :class:`MergeReport` (a :class:`~ckptmerge.report.Report` with ``mode="offline"``):
        ``restored`` lists the written names, ``skipped`` the names left out and why.

    Raises:
        OutputExistsError: a checkpoint (or leftover data files) exists at ``out_prefix`` and
            ``overwrite`` is False: raised before any checkpoint is read, or after writing when
            another run published there first (of racing merges without ``overwrite``, exactly
            one publishes).
        ArgumentError: ``out_prefix`` is a directory, ends with ``.index``, or is an input's prefix.
        PlanError: ``strict`` and the plan has findings (``e.plan`` has them all); nothing written.
        TransformError: a transform cannot run in this merge (a slice without a template, or
            ``init="keep"`` without a template checkpoint).
        CheckpointNotFoundError, CheckpointFormatError: a source cannot be found or is corrupt.
        CheckpointWriteError: the disk is full, a file is too large, or permission is denied;
            no file is left at ``out_prefix``.

    Example:
        >>> import ckptmerge as cm
        >>> from ckptmerge.offline import merge
        >>> report = merge([cm.Source("runs/A", map={"encoder/": "model/encoder/"}),
        ...                 cm.Source("runs/B", include=["head/*"])],
        ...                "runs/C/merged")                               # doctest: +SKIP
        >>> print(report.summary())                                       # doctest: +SKIP
        wrote 6 variables from 2 sources to 'runs/C/merged' in 0.02 s
    """
    if is_url(out_prefix):  # object storage: merge locally, then upload (data first, index last)
        from .offline_remote import merge_to_url

        return merge_to_url(merge, sources, out_prefix, template=template, allow_missing=allow_missing,
                            on_conflict=on_conflict, on_shape_mismatch=on_shape_mismatch, cast=cast,
                            strict=strict, overwrite=overwrite, dry_run=dry_run, update_state=update_state,
                            progress=progress, verify=verify, durable=durable, format=format)
    t0 = time.perf_counter()
    given = _check_out_prefix(out_prefix)
    fmt = _check_format(format, given)
    if fmt == FORMAT_SAFETENSORS and update_state:
        raise ArgumentError("update_state applies to TF checkpoints (the 'checkpoint' state file names a "
                            f"prefix); a safetensors output has none. Received: out_prefix={given!r}, "
                            "update_state=True")
    for flag, value in (("strict", strict), ("overwrite", overwrite), ("dry_run", dry_run),
                        ("update_state", update_state), ("verify", verify), ("cast", cast)):
        _check_flag(flag, value)
    if progress is not None and not callable(progress):
        raise ArgumentTypeError(f"progress must be a callable progress(done_bytes, total_bytes) or None. "
                                f"Received: progress={progress!r:.80}")
    kind, tvalue = _check_template(template)
    srcs = as_sources(sources)
    check_unique_labels(srcs)
    out_abs = os.path.abspath(given)

    # Resolve every input (no checkpoint is read), then refuse to write over one of them.
    resolved = [s.resolve() for s in srcs]  # once: opening below takes these, not a new look
    inputs = [(_source_origin(s.label), r.prefix) for s, r in zip(srcs, resolved) if r is not None]
    template_prefix = ""
    if kind == "path":
        template_prefix = resolve_checkpoint(tvalue).prefix
        inputs.append((f"the template {quote_name(tvalue)}", template_prefix))
    _check_not_an_input(out_abs, given, inputs)
    if not overwrite:  # a TF checkpoint is checked again while publishing, under the output's lock
        if fmt == FORMAT_TF:
            check_no_output(out_abs, given, _REPLACE_HINT)
        elif os.path.lexists(out_abs):
            raise OutputExistsError(f"A file already exists at {quote_name(given)}. Choose another output, or "
                                    f"{_REPLACE_HINT} to replace it.", path=given)
    state = None
    if update_state and os.path.isdir(os.path.dirname(out_abs)):
        state = read_state_file(os.path.dirname(out_abs))  # a broken state file fails before writing

    handles = open_sources(srcs, verify=verify, resolved=resolved)
    treader: Any = None
    jobs: List[_Job] = []
    try:
        if kind == "path":
            treader = open_checkpoint(template_prefix, verify=verify)
        with paused_gc():  # one small object per tensor, several times over: see ckptmerge.gcpause
            views = [h.view(h.source.rules(None)) for h in handles]
            if kind == "none":
                targets = _produced_targets(views, on_conflict)
            elif kind == "path":
                targets = _template_targets(treader, tvalue)
            else:
                targets = tvalue
            plan = make_plan(targets, views, allow_missing=allow_missing, on_conflict=on_conflict,
                             on_shape_mismatch=on_shape_mismatch, cast=cast)
            try:
                plan.check(strict=strict, action="write")
            except PlanError as e:
                raise PlanError(f"{e}\nNothing was written to {quote_name(given)}.", plan=e.plan) from None
            if dry_run:  # (tallied as made: no job per tensor is kept)
                from_template, skipped = [], []
                tally = _Tally(_iter_jobs(plan, handles, kind, treader, template_prefix, from_template, skipped))
            else:
                jobs, from_template, skipped = _build_jobs(plan, handles, kind, treader, template_prefix)
                tally = _Tally(jobs)
        if not tally.names:
            raise CkptMergeError(
                f"Nothing to write to {quote_name(given)}: no variable is left after the rules and the plan"
                + (f" ({len(skipped)} left out: {quote_name(skipped[0][0])}: {skipped[0][1]})" if skipped else "")
                + ". Check the sources' include/exclude and map; optimizer state and bookkeeping are "
                "left out unless Source(..., optimizer=True).")
        total = tally.total
        bytes_written = 0
        state_path = None
        if not dry_run:
            _check_space(out_abs, given, sum(_out_nbytes(j.target, j.nbytes) for j in jobs))
            writer = None
            buf = memoryview(bytearray(_PIECE))
            try:
                writer = _open_writer(fmt, given, jobs, handles, plan, overwrite=overwrite, durable=durable)
                done = 0
                if progress is not None:
                    progress(0, total)
                for job in jobs:
                    job.write(writer, buf, verify)
                    done += job.nbytes
                    if progress is not None:
                        progress(done, total)
                writer.finish()
            except OutputExistsError as e:
                if fmt != FORMAT_TF:
                    raise
                raise OutputExistsError(  # another run published first (checked under the lock)
                    f"A checkpoint appeared at {quote_name(given)} ({quote_name(e.path)}) while this merge was "
                    "running: another run wrote it first, and it was kept. Nothing was written. Choose another "
                    f"output prefix, or {_REPLACE_HINT} to replace it.", path=e.path) from None
            except BaseException:
                if writer is not None:
                    writer.abort()
                raise
            bytes_written = writer.bytes_written if fmt == FORMAT_TF else os.path.getsize(out_abs)
            if update_state:
                state_path = _write_state(out_abs, given, state)
            logger.info("merged %d tensors from %d source(s) into %s (%d bytes)", len(jobs), len(handles),
                        given, bytes_written)
    finally:
        for j in jobs:
            if j.raw is not None:
                j.raw.close()
        for h in handles:
            h.close()
        if treader is not None:
            treader.close()

    written, count, nbytes = tally.names, tally.count, tally.nbytes
    per_source = []
    for h in handles:
        origin = _source_origin(h.label)
        per_source.append({"label": h.label, "path": h.path, "note": h.note, "n_restored": count[origin],
                           "bytes": nbytes[origin]})
    if from_template:
        mine = [o for o in count if o.startswith("the template")]
        per_source.append({"label": _TEMPLATE_LABEL, "path": template_prefix, "note": "template checkpoint",
                           "n_restored": sum(count[o] for o in mine), "bytes": sum(nbytes[o] for o in mine)})
    return MergeReport(plan=plan, mode="offline", restored=written, skipped=skipped,
                       elapsed=time.perf_counter() - t0, bytes_read=0 if dry_run else total,
                       sources=per_source, output=given, dry_run=dry_run, bytes_written=bytes_written,
                       from_template=from_template, state_file=state_path)
