"""Offline merge: write one new checkpoint assembled from several, without building a model.

:func:`merge` takes the same sources and rules as :func:`ckptmerge.plan` and writes a standard
TensorFlow checkpoint (``<out>.index`` + ``<out>.data-*``) that ``tf.train.load_checkpoint``,
``tf.compat.v1.train.Saver`` and ckptmerge itself read back with bit-identical values. It renames
scopes, combines models and drops optimizer state with no model code and no TensorFlow: sources
are read with ckptmerge's reader and written with :class:`~ckptmerge.formats.tf.writer.BundleWriter`.

What the output holds:

* **No template**: every name the sources produce after their rules (optimizer state and
  bookkeeping are left out unless a source says ``optimizer=True``). Two sources or rules that
  produce one name are a conflict finding, resolved by ``on_conflict="first"``/``"last"``.
* **A template checkpoint** (``template="runs/C"``): exactly its model variables (names,
  shapes, dtypes), with every plan finding (missing, mismatched, ...). A template variable no
  source provides (``allow_missing``, or any finding with ``strict=False``) keeps the
  template's own value, and the template's values are the "current" values of transforms with
  ``init="keep"``.
* **A template given as specs** (a list of :class:`~ckptmerge.core.specs.VariableInfo`, e.g. from a
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
instant. Merges to one prefix publish one at a time (see :mod:`ckptmerge.formats.tf.writer`).
Nothing here imports TensorFlow.
"""

from __future__ import annotations

import errno
import json
import operator
import os
import sys
import time
from dataclasses import dataclass, field
from typing import (
    Any,
    Callable,
    Dict,
    List,
    Optional,
    Sequence,
    Tuple,
    Union,
)

from ..alignment.layouts import torch_layout
from ..core.errors import (
    ArgumentError,
    ArgumentTypeError,
    CheckpointWriteError,
    CkptMergeError,
    OutputExistsError,
    PlanError,
)
from ..formats import open_checkpoint
from ..formats.io.output_prefix import check_no_output, remove_stale_temps, temp_name
from ..formats.io.storage import is_url
from ..formats.tf.bundle import (
    DATA_RE,
)
from ..formats.tf.writer import BundleWriter
from ..core.gcpause import paused_gc
from ..planning.planner import Plan, SourceView, make_plan
from ..planning.transforms import Slice, TransformError
from ..planning.chains import chain_output_shape, select
from ..core.redact import get_logger, redact, redact_optional, redacted_repr
from ..render.report import Report, section
from ..sources.files import STATE_FILE, files_read, refuse_overwriting_inputs
from ..sources.opening import SourcesArg, as_sources, check_unique_labels, open_sources
from ..sources.resolve import read_state_file, resolve_checkpoint
from ..sources.handles import SourceHandle
from ..sources.state import state_file_text
from ..core.specs import (
    KIND_VARIABLE,
    VariableInfo,
    trusted_info,
)
from ..core.text import escape_name, human_bytes, join_lines, plural, quote_name
from .inverse import (
    TorchInverseHandle,
    describe_unresolved,
    template_globs,
    template_specs,
    template_views,
    torch_inverse,
)
from .hfconfig import check_companions, companions, copy_companions
from .kerasout import h5_entries, missing_layers
from .objectgraph import NAME_BASED, OBJECT_BASED, KeyedWriter, ObjectLayout, object_layout
from .jobs import (
    GRAPH_NOT_COPIED,
    PIECE,
    TEMPLATE_LABEL,
    Job,
    Tally,
    build_jobs,
    iter_jobs,
    out_nbytes,
    source_origin,
)

__all__ = ["merge_local", "MergeReport", "Progress", "TemplateArg"]

logger = get_logger(__name__)

#: A progress callback: ``progress(done_bytes, total_bytes)`` (bytes read from the sources).
Progress = Callable[[int, int], None]
TemplateArg = Union[None, str, "os.PathLike[str]", Sequence[VariableInfo]]

_REPLACE_HINT = "pass overwrite=True (ckptmerge merge --force)"


# --------------------------------------------------------------------------------------------
# The report
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class MergeReport(Report):
    """What :func:`merge` did (or, with ``dry_run``, would do); a :class:`~ckptmerge.render.report.Report`.

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
        tf_layout: for a TF output, ``"object-based"`` (keyed by object paths, with an object
            graph: ``tf.train.Checkpoint(...).restore`` reads it) or ``"name-based"`` (keyed by
            variable names); ``""`` for the other formats.
        notes: what a user loading the output should know (e.g. why a TF output of object-based
            inputs is name-based, and what to pass instead).

    Example:
        >>> from ckptmerge.planning.planner import make_plan
        >>> MergeReport(make_plan([], []), "offline", [], [], 0.5, 0, [], output="out/m").summary()
        "wrote 0 variables from 0 sources to 'out/m' in 0.50 s"
    """

    __repr__ = redacted_repr  # (a REPL, a notebook or a log line shows no credential)

    output: str = ""
    dry_run: bool = False
    bytes_written: int = 0
    from_template: List[Tuple[str, str]] = field(default_factory=list)
    state_file: Optional[str] = None
    tf_layout: str = ""
    notes: List[str] = field(default_factory=list)

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
        labels = self.short_labels()  # (a long source path once, in its header line)
        out += self._source_lines("written", labels)
        by_target = self.plan.assignments
        rest = section("Would write" if self.dry_run else "Written", self.restored, limit,
                       render=lambda t: by_target[t].describe() if t in by_target else f"{t} <- {TEMPLATE_LABEL}")
        rest += section("From the template", [f"{t}: {r}" for t, r in self.from_template], limit)
        rest += section("Left out", [f"{t}: {r}" for t, r in self.skipped], limit)
        out += labels.lines(rest)
        if self.tf_layout == OBJECT_BASED:
            out.append("Layout: object-based (keyed by object paths, with its object graph: "
                       "tf.train.Checkpoint(...).restore reads it)")
        out += labels.lines([f"Note: {n}" for n in self.notes])
        if self.state_file:
            out.append(f"State file: {self.state_file}")
        return join_lines(out)

    def to_dict(self, *, lazy: bool = False) -> dict:
        """JSON-ready: :meth:`Report.to_dict` plus ``output``, ``dry_run``, ``bytes_written``,
        ``from_template`` (``[{"name", "reason"}]``) and ``state_file``."""
        d = super().to_dict(lazy=lazy)
        d.update({"output": redact(self.output), "dry_run": self.dry_run, "bytes_written": int(self.bytes_written),
                  "from_template": [{"name": n, "reason": r} for n, r in self.from_template],
                  "state_file": redact_optional(self.state_file), "tf_layout": self.tf_layout or None,
                  "notes": list(self.notes)})
        return d


# --------------------------------------------------------------------------------------------
# Argument checks (all before any checkpoint is read)
# --------------------------------------------------------------------------------------------


def _check_flag(name: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise ArgumentTypeError(f"{name} must be True or False. Received: {name}={value!r}")
    return value


def _check_out_prefix(out_prefix: Any, *, folder: bool = False) -> str:
    if isinstance(out_prefix, bool) or not isinstance(out_prefix, (str, os.PathLike)):
        raise ArgumentTypeError("out_prefix must be a checkpoint prefix (str or os.PathLike), e.g. "
                                f"'out/merged'. Received: out_prefix={out_prefix!r:.80}")
    given = os.fspath(out_prefix)
    if not isinstance(given, str) or not given:
        raise ArgumentError(f"out_prefix must be a non-empty path. Received: out_prefix={out_prefix!r}")
    if folder:  # an Orbax output is a folder: an existing one is replaced only with overwrite
        return given.rstrip("/" + os.sep) or given
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
    """Classify the template: ``("none", None)``, ``("path", str)``, ``("specs", [VariableInfo])`` or
    ``("model", model)`` (a Keras model or ``tf.Module``, already built by the caller)."""
    if template is None:
        return "none", None
    if isinstance(template, (str, os.PathLike)):
        return "path", os.fspath(template)
    if _is_model(template):
        return "model", template
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
    raise ArgumentTypeError("template must be None, a checkpoint path, a list of ckptmerge.VariableInfo "
                            "(e.g. ckptmerge.list_variables(path)), or a built Keras model or tf.Module. "
                            f"Received: {template!r:.80} "
                            f"(type {type(template).__name__})")


def _is_model(obj: Any) -> bool:
    """Whether ``obj`` is a Keras model or layer, or a ``tf.Module`` (no import: only a caller that
    built one has Keras or TensorFlow loaded)."""
    keras, tf = sys.modules.get("keras"), sys.modules.get("tensorflow")
    if keras is not None and isinstance(obj, getattr(keras, "Layer", ())):
        return True
    return tf is not None and isinstance(obj, getattr(tf, "Module", ()))


def _model_targets(model: Any, handles: Sequence[SourceHandle]) -> Tuple[List[VariableInfo], Optional[str]]:
    """A model template's variables as specs, and its root scope; Keras weights files among the
    sources named by the model's own walk first (their names depend on the model, as in
    :func:`ckptmerge.plan`), so one config serves ``plan --model`` and ``merge --model``."""
    from ..restoring.kerasfiles import model_root, name_weights_files
    from ..restoring.targets import collect_targets, is_keras_object

    found = collect_targets(model)
    if not is_keras_object(model):
        return list(found.infos), None
    name_weights_files(model, found, handles)
    return list(found.infos), model_root(model, [n for n in map(found.name_of, model.weights) if n is not None])


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
        TransformError: a :class:`~ckptmerge.planning.transforms.Slice` applies to a produced name (a
            slice needs a target shape, which only a template gives).
    """
    if len(views) == 1 and not views[0].transforms and not views[0].joined:
        one = _produced_by_one(views[0], on_conflict)
        if one is not None:
            return one
    chosen: Dict[str, Tuple[Tuple[int, str], VariableInfo, SourceView]] = {}
    for si, view in enumerate(views):
        res = view.rules._apply(list(view.variables))
        pairs = list(zip(res.names, res.targets))
        if view.joined:  # a joined tensor (a Concat) is written as its target only
            pairs = [(n, t) for n, t in pairs if n not in view.joined] + list(view.joined.items())
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


def _template_targets(reader: Any, prefix: str) -> List[VariableInfo]:
    specs = [v for v in reader.variables() if v.kind == KIND_VARIABLE]
    if not specs:
        raise CkptMergeError(f"The template checkpoint {quote_name(prefix)} has no model variables (only optimizer "
                             "state or bookkeeping), so the output would be empty. Pass another template, "
                             "or template=None to write every name the sources produce.")
    return specs


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


def _write_state(out_abs: str, given: str, state: Any) -> str:
    """Write the output directory's ``checkpoint`` file atomically (temp file, fsync, rename)."""
    directory = os.path.dirname(out_abs)
    final = os.path.join(directory, STATE_FILE)
    remove_stale_temps(final)  # the copies of writers that were killed
    tmp = temp_name(final)
    text = state_file_text(out_abs, state)
    try:
        with open(tmp, "x", encoding="utf-8", errors="surrogateescape") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, final)
    except BaseException as e:  # an error, or Ctrl-C: leave no temporary file
        try:
            os.remove(tmp)
        except OSError:
            pass
        if not isinstance(e, OSError):
            raise
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
FORMAT_KERAS_H5 = "keras-h5"
FORMAT_ORBAX = "orbax"
_FORMATS = (FORMAT_TF, FORMAT_SAFETENSORS, FORMAT_KERAS_H5, FORMAT_ORBAX)


def _check_format(format: Any, given: str) -> str:
    if format is None:
        if given.endswith(".weights.h5"):
            return FORMAT_KERAS_H5
        if given.endswith(".keras"):  # (not a TF prefix named like an archive Keras would refuse)
            raise ArgumentError(f"ckptmerge does not write .keras archives (a model's config with its weights). Write "
                                f"the weights as '{given[:-len('.keras')]}.weights.h5' with the model as the template "
                                "(template=model, --model MODULE:FUNCTION), then model.load_weights(...) and "
                                f"model.save({given!r}) if you need the archive. Received: out_prefix={given!r}")
        return FORMAT_SAFETENSORS if given.endswith(".safetensors") else FORMAT_TF
    if format not in _FORMATS:
        raise ArgumentError(f"format must be one of {', '.join(map(repr, _FORMATS))} or None (by the output's "
                            f"suffix). Received: format={format!r:.80}")
    return format


def recorded_sources(handles: Sequence[SourceHandle], plan: Plan, *,
                     record_paths: bool) -> Tuple[List[Dict[str, str]], Dict[str, str]]:
    """What a safetensors or Orbax output records about its inputs: the sources (each one's
    label, path and how it was resolved: ``ckptmerge.sources``) and the plan (``{target:
    "label:name"}``: ``ckptmerge.plan``). URL credentials are redacted; with
    ``record_paths=False`` no path is kept at all (a local absolute path says who made the file,
    and where): each source is its ``name``, or ``source N`` (in order) when it has none.

    Example:
        >>> recorded_sources([], make_plan([], []), record_paths=False)
        ([], {})
    """
    shown = {h.label: redact(h.label) if record_paths or h.source.name else f"source {i}"
             for i, h in enumerate(handles, 1)}
    sources = [{"label": shown[h.label], "path": redact(h.path), "note": redact(h.note)} if record_paths
               else {"label": shown[h.label]} for h in handles]
    assigned = {t: f"{shown.get(a.source, a.source)}:{a.name}" for t, a in sorted(plan.assignments.items())}
    return sources, assigned


def _open_writer(fmt: str, given: str, jobs: Sequence["Job"], handles: Sequence[SourceHandle], plan: Plan, *,
                 overwrite: bool, durable: bool, record_paths: bool, layout: ObjectLayout,
                 entries: Optional[Dict[str, str]] = None) -> Any:
    """The writer for the output format; both take the jobs' tensors the same way."""
    if fmt == FORMAT_TF:
        bundle = BundleWriter(given, overwrite=overwrite, durable=durable)
        return KeyedWriter.tf(bundle, layout) if layout.kind == OBJECT_BASED else bundle
    specs = [(j.target.name, j.target.dtype, j.target.shape) for j in jobs]
    if fmt == FORMAT_KERAS_H5:
        if entries is not None:
            specs = [(entries[n], dtype, shape) for n, dtype, shape in specs]
        from ..formats.keras.h5_writer import H5Writer, h5_unsupported

        problems = h5_unsupported(specs)
        if problems:
            names = ", ".join(f"{quote_name(n)} ({why})" for n, why in problems[:5])
            raise ArgumentError(f"A Keras .weights.h5 file cannot hold {plural(len(problems), 'tensor')} of this merge: "
                                f"{names}{f' and {len(problems) - 5} more' if len(problems) > 5 else ''}. Exclude them "
                                "(Source(..., exclude=[...])), or write a TF checkpoint.")
        h5 = H5Writer(given, specs, overwrite=overwrite, durable=durable)
        return h5 if entries is None else KeyedWriter(h5, entries)
    if fmt == FORMAT_ORBAX:
        from ..formats.orbax.writer import OrbaxWriter, unsupported_dtypes
    else:
        from ..formats.safetensors.writer import SafetensorsWriter, unsupported_dtypes

    bad = unsupported_dtypes(specs)
    if bad:
        names = ", ".join(f"{quote_name(n)} ({d})" for n, d in bad[:5]) + (f" and {len(bad) - 5} more" if len(bad) > 5 else "")
        what = "An Orbax checkpoint" if fmt == FORMAT_ORBAX else "safetensors"
        raise ArgumentError(f"{what} cannot store {plural(len(bad), 'tensor')} of this merge: {names}. "
                            "Exclude them (Source(..., exclude=[...])), or write a TF checkpoint.")
    sources, assigned = recorded_sources(handles, plan, record_paths=record_paths)
    if fmt == FORMAT_ORBAX:
        return OrbaxWriter(given, specs, metadata={"ckptmerge": {"sources": sources, "plan": assigned}},
                           overwrite=overwrite, durable=durable)
    metadata = {"ckptmerge.sources": json.dumps(sources), "ckptmerge.plan": json.dumps(assigned)}
    return SafetensorsWriter(given, specs, metadata=metadata, overwrite=overwrite, durable=durable)


def _check_layout(layout: Any, kind: str, fmt: str, given: str) -> None:
    """``layout="torch"`` writes a safetensors file under a template's PyTorch names."""
    if layout is None:
        return
    if layout != "torch":
        raise ArgumentError(f"layout must be 'torch' or None. Received: layout={layout!r:.80}."
                            + (" Did you mean 'torch'?" if isinstance(layout, str) and layout.lower() in
                               ("pytorch", "torch", "pt", "hf") else ""))
    if kind in ("none", "model"):
        raise ArgumentError("layout='torch' writes the sources' tensors under a PyTorch model's names, shapes and "
                            "layouts, so it needs the model's state_dict as the template: pass "
                            "template='hf/model.safetensors' (a file or a save_pretrained folder) or a list of "
                            "ckptmerge.VariableInfo (ckptmerge merge --template FILE).")
    if fmt != FORMAT_SAFETENSORS:
        raise ArgumentError(f"layout='torch' writes a .safetensors file (what PyTorch loads); the output is a {fmt} "
                            f"output. Name it like 'out/model.safetensors'. Received: out_prefix={given!r}")


def merge_local(
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
    layout: Optional[str] = None,
    record_paths: bool = True,
    claim_output: Optional[Callable[[List[Tuple[str, str]]], None]] = None,
) -> Report:
    """:func:`ckptmerge.merge` to a local prefix (the arguments are its own; see
    :mod:`ckptmerge.merging.dispatch`).

    ``claim_output`` (for :func:`~ckptmerge.merging.remote.merge_to_url`, whose local prefix is
    a temporary one) is called with the resolved inputs, ``[(label, prefix)]``, once they are known
    and before any checkpoint is opened: it checks the real output against them and locks it.

    Example:
        >>> merge_local([Source("runs/A")], "runs/C/merged")   # doctest: +SKIP
    """
    t0 = time.perf_counter()
    given = _check_out_prefix(out_prefix, folder=format == FORMAT_ORBAX)
    fmt = _check_format(format, given)
    if fmt != FORMAT_TF and update_state:
        raise ArgumentError("update_state applies to TF checkpoints (the 'checkpoint' state file names a "
                            f"prefix); a {fmt} output has none. Received: out_prefix={given!r}, "
                            "update_state=True")
    for flag, value in (("strict", strict), ("overwrite", overwrite), ("dry_run", dry_run),
                        ("update_state", update_state), ("verify", verify), ("cast", cast),
                        ("record_paths", record_paths)):
        _check_flag(flag, value)
    if progress is not None and not callable(progress):
        raise ArgumentTypeError(f"progress must be a callable progress(done_bytes, total_bytes) or None. "
                                f"Received: progress={progress!r:.80}")
    kind, tvalue = _check_template(template)
    _check_layout(layout, kind, fmt, given)
    srcs = as_sources(sources)
    check_unique_labels(srcs)
    out_abs = os.path.abspath(given)

    # Resolve every input (no checkpoint is read), then refuse to write over one of them.
    resolved = [s.resolve() for s in srcs]  # once: opening below takes these, not a new look
    read = [(source_origin(s.label), r) for s, r in zip(srcs, resolved) if r is not None]
    for s in srcs:  # a combination reads its inputs (and base) while the output is written
        for inner in s.read_sources():
            r = inner.resolve() if inner is not s else None
            if r is not None:
                read.append((f"input {quote_name(inner.label)} of {source_origin(s.label)}", r))
    template_prefix = ""
    if kind == "path":
        template = resolve_checkpoint(tvalue)
        template_prefix = template.prefix
        read.append((f"the template {quote_name(tvalue)}", template))
    # every file each input is read from (a shard of a set too), its prefix first
    inputs = [(label, f) for label, r in read for f in dict.fromkeys([r.prefix, *files_read(r.prefix, r.format)])]
    refuse_overwriting_inputs(out_abs, given, fmt, inputs)
    hf_pairs, hf_note = [], ""  # a Hugging Face template folder: its config.json beside the output
    if layout is not None and kind == "path" and claim_output is None and not is_url(tvalue):
        hf_pairs, hf_note = companions(tvalue, template_prefix, out_abs)
        check_companions(hf_pairs, overwrite)
    if claim_output is not None:
        claim_output(inputs)
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
    root: Optional[str] = None
    jobs: List[Job] = []
    inverse: Optional[TorchInverseHandle] = None
    try:
        if kind == "path":
            treader = open_checkpoint(template_prefix, verify=verify)
        with paused_gc():  # one small object per tensor, several times over: see ckptmerge.core.gcpause
            job_handles: Sequence[SourceHandle] = handles
            if layout is not None:  # Keras tensors under the template's PyTorch names (merging/inverse.py)
                targets = template_specs(treader.variables() if kind == "path" else tvalue)
                tlayout = torch_layout(targets)  # (map targets may be its PyTorch names)
                views = template_views(handles, tlayout)
                produced = _produced_targets(views, on_conflict)
                if tlayout.needs_targets:  # a fused module whose parts' sizes the Keras tensors give
                    tlayout = torch_layout(targets, targets=produced)
                inverse, keras_plan = torch_inverse(
                    handles, views, produced, targets, template_reader=treader,
                    template_label=str(tvalue) if kind == "path" else "the template's specs",
                    on_conflict=on_conflict, cast=cast, layout=tlayout)
                try:
                    keras_plan.check(strict=strict, action="write")
                except PlanError as e:
                    raise PlanError(f"The sources' own tensors: {e}\nNothing was written to {quote_name(given)}.",
                                    plan=e.plan) from None
                inverse.check_mismatches(strict, on_shape_mismatch, given)
                allow_missing = template_globs(allow_missing, tlayout, targets)  # (in either spelling)
                if on_shape_mismatch == "skip":  # left as the template has it (or out), as a skipped mismatch is
                    allow_missing = inverse.allow_mismatched(allow_missing)
                views, job_handles = [inverse.view(inverse.source.rules(None))], [inverse]
            else:
                views = [h.view(h.source.rules(None)) for h in handles]
                if kind == "none":
                    targets = _produced_targets(views, on_conflict)
                elif kind == "path":
                    targets = _template_targets(treader, tvalue)
                elif kind == "model":
                    targets, root = _model_targets(tvalue, handles)
                    views = [h.view(h.source.rules(None)) for h in handles]  # (named by the model now)
                else:
                    targets = tvalue
            plan = make_plan(targets, views, allow_missing=allow_missing, on_conflict=on_conflict,
                             on_shape_mismatch=on_shape_mismatch, cast=cast, model_root=root)
            try:
                plan.check(strict=strict, action="write")
            except PlanError as e:
                why = describe_unresolved(inverse, plan.missing) if inverse is not None else []
                if why:
                    why = ["Unresolved in the PyTorch template (alignment pairs only what its evidence "
                           "decides; an incomplete PyTorch file is written only when you allow it: "
                           "allow_missing=[globs] / --allow-missing, or strict=False):", *why]
                raise PlanError("\n".join([str(e), *why, f"Nothing was written to {quote_name(given)}."]),
                                plan=e.plan) from None
            layout = ObjectLayout(NAME_BASED)
            if dry_run:  # (tallied as made: no job per tensor is kept, but for a TF output's keys)
                from_template, skipped = [], []
                made = iter_jobs(plan, job_handles, kind, treader, template_prefix, from_template, skipped)
                if fmt == FORMAT_TF:
                    made = list(made)
                    layout = object_layout(made, job_handles, treader, kind)
                tally = Tally(made)
            else:
                jobs, from_template, skipped = build_jobs(plan, job_handles, kind, treader, template_prefix)
                if fmt == FORMAT_TF:
                    layout = object_layout(jobs, job_handles, treader, kind)
                tally = Tally(jobs)
            if layout.kind == OBJECT_BASED:  # the output's own graph is written, not the input's
                skipped = [(n, r) for n, r in skipped if not r.startswith(GRAPH_NOT_COPIED)]
            if inverse is not None:  # say why alignment left each one out, not only that no source gave it
                from_template = [(n, inverse.why(n, r)) for n, r in from_template]
                skipped = [(n, inverse.why(n, r)) for n, r in skipped]
        if not tally.names:
            raise CkptMergeError(
                f"Nothing to write to {quote_name(given)}: no variable is left after the rules and the plan"
                + (f" ({len(skipped)} left out: {quote_name(skipped[0][0])}: {skipped[0][1]})" if skipped else "")
                + ". Check the sources' include/exclude and map; optimizer state and bookkeeping are "
                "left out unless Source(..., optimizer=True).")
        total = tally.total
        model_keys = None
        if fmt == FORMAT_KERAS_H5 and kind == "model":  # where the model's own walk reads each name
            from ..restoring.kerasfiles import weights_file_entries

            model_keys = weights_file_entries(tvalue)
        entries = h5_entries(tally.names, model_keys, given) if fmt == FORMAT_KERAS_H5 else None
        notes = [n for n in (layout.note, hf_note) if n]
        lacking = missing_layers(entries or {}, model_keys)
        if lacking:
            notes.append(f"model.load_weights raises for {plural(len(lacking), 'layer')} of the model whose variables "
                         f"this file leaves out ({', '.join(f'{quote_name(g)}: {n}' for g, n in lacking[:3])}"
                         f"{' ...' if len(lacking) > 3 else ''}) unless it skips them (skip_mismatch=True).")
        bytes_written = 0
        state_path = None
        if not dry_run:
            _check_space(out_abs, given, sum(out_nbytes(j.target, j.nbytes) for j in jobs))
            writer = None
            buf = memoryview(bytearray(PIECE))
            try:
                writer = _open_writer(fmt, given, jobs, handles, plan, overwrite=overwrite, durable=durable,
                                      record_paths=record_paths, layout=layout, entries=entries)
                done = 0
                if progress is not None:
                    progress(0, total)
                for i, h in enumerate(job_handles):  # (jobs are sorted by source first)
                    if h.streams:
                        h.read_order([j.name for j in jobs if j.sort_key[0] == i and j.chunks is not None])
                for job in jobs:
                    job.write(writer, buf, verify)
                    done += job.nbytes
                    if progress is not None:
                        progress(done, total)
                writer.finish()
                if hf_pairs:
                    copied = copy_companions(hf_pairs, durable=durable)
                    if copied:
                        notes.append(f"Copied {', '.join(os.path.basename(p) for p in copied)} from the template's "
                                     "folder beside the weights, so from_pretrained loads the folder.")
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
            bytes_written = writer.bytes_written if fmt in (FORMAT_TF, FORMAT_ORBAX) else os.path.getsize(out_abs)
            if update_state:
                state_path = _write_state(out_abs, given, state)
            logger.info("merged %d tensors from %d source(s) into %s (%d bytes)", len(jobs), len(handles),
                        given, bytes_written)
        if layout.note:
            logger.warning("%s: %s", given, layout.note)
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
    for h in (handles if inverse is None else [inverse]):
        origin = source_origin(h.label)
        per_source.append({"label": h.label, "path": h.path, "note": h.note, "n_restored": count[origin],
                           "bytes": nbytes[origin]})
    if from_template:
        mine = [o for o in count if o.startswith("the template")]
        per_source.append({"label": TEMPLATE_LABEL, "path": template_prefix, "note": "template checkpoint",
                           "n_restored": sum(count[o] for o in mine), "bytes": sum(nbytes[o] for o in mine)})
    return MergeReport(plan=plan, mode="offline", restored=written, skipped=skipped,
                       elapsed=time.perf_counter() - t0, bytes_read=0 if dry_run else total,
                       sources=per_source, output=given, dry_run=dry_run, bytes_written=bytes_written,
                       from_template=from_template, state_file=state_path,
                       tf_layout=layout.kind if fmt == FORMAT_TF else "", notes=notes)
