"""The checkpoints of a run: one listing of a training directory, for every command.

A training directory (a *run*) holds the checkpoints a trainer saved over time. This module says
which checkpoints are in it and of which step each is, and
:func:`ckptmerge.sources.listing.list_run` (one look: one ``scandir``, or one listing by URL)
finds them; it is the one answer for every command: ``checkpoints`` lists it,
``combine``/``average --last/--steps/--every`` select from it (:func:`select_steps`), ``watch``
follows it, and a directory's latest checkpoint and ``step=N`` (``cm.load``, ``Source``, ``ls``)
are picked from it (:meth:`Run.pick`), locally and by URL. A run's checkpoints are:

- **TF bundles**: ``NAME.index`` with its ``NAME.data-*`` shards; the step is the trailing
  ``-N`` of ``NAME`` (``ckpt-10``, ``model.ckpt-500``);
- **TF V1 checkpoints** (local): a LevelDB table file, or a sharded set;
- **Keras weights files**: ``ckpt-3.weights.h5``, ``.h5``, ``.hdf5``, ``.keras``, and a sharded
  set by its ``.weights.json``;
- **safetensors files with a step** (``model-300.safetensors``; shards ``-00001-of-00002`` and
  files without a step are parts of a folder that is one checkpoint, not of a run);
- **step folders**: ``checkpoint-500/``, ``step_100/``, ``ckpt_100/``, ``100/`` holding one checkpoint
  (safetensors, a bundle, a Keras file, an Orbax step: :func:`folder_format`), never one under a
  temporary name (``tmp-checkpoint-500``, ``100.orbax-checkpoint-tmp-1733``); a step folder with
  nothing recognisable in it yet is *pending* (``watch`` waits for it; it is listed by nobody);
- a **SavedModel**'s variables (no step), and checkpoints the ``checkpoint`` state file names in
  folders below the directory.

Three rules hold for every command, because they hold here:

- **Confined.** Every file of a checkpoint must be a regular file inside the directory (links
  inside are followed): a link that resolves outside it (a file, a data shard, a step folder,
  anything below a step folder) leaves the checkpoint out, reported in :attr:`Run.unsafe`
  (docs/security.md). The directory itself may be a link: it was named.
- **State files name checkpoints inside.** What a ``checkpoint`` state file names outside the
  directory is not used (:mod:`ckptmerge.sources.state` sets it apart in ``outside``; TensorFlow
  would follow it), unless the same base name is in the directory (a copied run).
- **One checkpoint per step.** Two checkpoints of one step (``model-007`` beside ``model-7``) are
  both listed, and :meth:`Run.pick`, :func:`select_steps` and a watcher refuse that step, naming both.

How to extend it: a new file naming goes into :func:`classify`; a new kind of step folder (an
Orbax release's layout) into :func:`folder_step` (its name) and :func:`folder_format` (what it
holds). Nothing here reads tensors or imports TensorFlow.
"""

from __future__ import annotations

import os
import posixpath
import re
from dataclasses import dataclass, field
from typing import Any, Dict, Iterable, List, Optional, Sequence, Set, Tuple

from ..core.args import describe_value
from ..core.errors import (
    ArgumentError,
    ArgumentTypeError,
    CheckpointNotFoundError,
    CombineError,
    UnsafeCheckpointError,
    format_list,
)
from ..formats.io import storage
from ..formats.orbax.layout import CHECKPOINT_METADATA_FILE, METADATA_FILE
from ..formats.tf.bundle import DATA_RE
from ..core.redact import get_logger
from ..core.text import escape_name, plural, quote_name, quoted_command
from .files import (
    FORMAT_KERAS_H5,
    FORMAT_NUMPY,
    FORMAT_SAFETENSORS,
    FORMAT_TF_BUNDLE,
    FORMAT_TF_V1,
    INDEX,
    KERAS_SHARDS,
    NOT_V1_SUFFIXES,
    STATE_FILE,
    keras_weight_files,
    step_of,
)
from .orbax import FORMAT_ORBAX
from .resolved import CheckpointInfo
from .state import CheckpointState

__all__ = ["Run", "RunCheckpoint", "Unsafe", "classify", "file_step", "folder_step", "folder_format",
           "KIND_BUNDLE", "KIND_FILE", "KIND_FOLDER", "KIND_V1", "KIND_SAVED_MODEL", "MAX_FOLDER_FILES",
           "ORBAX_COMMIT_SCHEMES", "inside", "show_in", "sort_key", "duplicate_steps", "select_steps"]

logger = get_logger(__name__)

#: What a checkpoint of a run is on disk: a TF prefix, one file, a step folder, a V1 file or set,
#: a SavedModel's variables.
KIND_BUNDLE, KIND_FILE, KIND_FOLDER, KIND_V1, KIND_SAVED_MODEL = "bundle", "file", "folder", "v1", "saved-model"

#: Files looked at below one step folder (a bigger folder is not a checkpoint of a run).
MAX_FOLDER_FILES = 100_000
#: Where Orbax marks a finished step with ``commit_success.txt`` instead of renaming its folder.
ORBAX_COMMIT_SCHEMES = ("gs://", "gcs://")

_KERAS_FILES = (".weights.h5", ".h5", ".hdf5", ".keras")
_SINGLE = _KERAS_FILES + (".safetensors",)
_SHARD = re.compile(r"-(\d{5})-of-(\d{5})$")
_FOLDER_STEP = re.compile(r"(?:^|[-_])(\d+)$")
# A folder a trainer writes into and renames when it is whole: Hugging Face's tmp-checkpoint-500,
# Orbax's 100.orbax-checkpoint-tmp-1733, TF1's model.ckpt-100_temp_<uuid>.
_TEMPORARY = re.compile(r"(?:^|[-_.])(?:tmp|temp)(?:[-_.]|$)", re.IGNORECASE)
_ORBAX_MARKERS = (CHECKPOINT_METADATA_FILE, METADATA_FILE, "manifest.ocdbt", "orbax.checkpoint")

#: A file's signature: ``(device, inode, size, modification time in ns)`` (by URL ``(0, 0, size, mtime)``).
Sig = Tuple[Any, ...]


def file_step(name: str) -> Optional[int]:
    """The step of a checkpoint file's name (``ckpt-10.weights.h5`` -> 10); shards are no steps.

    Example:
        >>> file_step("ckpt-7.keras"), file_step("model-00001-of-00002.safetensors")
        (7, None)
    """
    base = name
    for suffix in _SINGLE:
        if base.lower().endswith(suffix):
            base = base[: -len(suffix)]
            break
    if _SHARD.search(base):
        return None
    return step_of(base)


def folder_step(name: str) -> Optional[int]:
    """The step of a step folder's name: ``checkpoint-500``, ``step_100``, ``100``. Names with a
    dot, and temporary folders a trainer renames when they are whole (``tmp-checkpoint-500``),
    have none.

    Example:
        >>> folder_step("checkpoint-500"), folder_step("100"), folder_step("logs")
        (500, 100, None)
        >>> folder_step("tmp-checkpoint-500"), folder_step("100.orbax-checkpoint-tmp-1733")
        (None, None)
    """
    if "." in name or _TEMPORARY.search(name):
        return None
    m = _FOLDER_STEP.search(name)
    return int(m.group(1)) if m else None


def classify(name: str, is_dir: bool) -> Optional[Tuple[str, Optional[int], str]]:
    """``(kind, step, format)`` of a directory entry by its name, or ``None`` when the name is
    no checkpoint of a run (a data shard, a shard of a set, the state file, a hidden name, a
    folder without a step). A step folder's format is ``""`` (what it holds says:
    :func:`folder_format`); a file with no known suffix is a V1 candidate (its bytes say).

    Example:
        >>> classify("ckpt-10.index", False), classify("checkpoint-500", True)
        (('bundle', 10, 'tf-bundle'), ('folder', 500, ''))
        >>> classify("model-30.safetensors", False), classify("model-00001-of-00002.safetensors", False)
        (('file', 30, 'safetensors'), None)
    """
    if name.startswith(".") or name == STATE_FILE:
        return None
    if is_dir:
        step = folder_step(name)
        return (KIND_FOLDER, step, "") if step is not None else None
    lower = name.lower()
    if name.endswith(INDEX):
        return (KIND_BUNDLE, step_of(name[: -len(INDEX)]), FORMAT_TF_BUNDLE) if len(name) > len(INDEX) else None
    if DATA_RE.search(name) is not None:
        return None
    if name.endswith(KERAS_SHARDS):
        return KIND_FILE, step_of(name), FORMAT_KERAS_H5
    if lower.endswith(_KERAS_FILES):
        return KIND_FILE, file_step(name), FORMAT_KERAS_H5
    if lower.endswith(".safetensors"):
        step = file_step(name)
        return (KIND_FILE, step, FORMAT_SAFETENSORS) if step is not None else None
    if name.endswith(NOT_V1_SUFFIXES):
        return None
    return KIND_V1, step_of(name), FORMAT_TF_V1


def folder_format(names: Iterable[str]) -> str:
    """The format of the checkpoint a step folder holds, from the ``/``-joined names of the files
    below it (relative to it): ``""`` when nothing there is a checkpoint (yet).

    Example:
        >>> folder_format(["model.safetensors", "trainer_state.json"]), folder_format(["logs/events.1"])
        ('safetensors', '')
        >>> folder_format(["_CHECKPOINT_METADATA", "state/_METADATA"]), folder_format(["ckpt.index"])
        ('orbax', 'tf-bundle')
    """
    top: Set[str] = set()
    second: Set[str] = set()
    for n in names:
        head, sep, rest = n.partition("/")
        if not sep:
            top.add(n)
        elif "/" not in rest:
            second.add(rest)
    if top.intersection(_ORBAX_MARKERS) or second.intersection(_ORBAX_MARKERS):
        return FORMAT_ORBAX
    if any(n.endswith(INDEX) and len(n) > len(INDEX) for n in top) or (
            top.intersection(("saved_model.pb", "saved_model.pbtxt")) and "variables.index" in second):
        return FORMAT_TF_BUNDLE
    if any(n.endswith((".safetensors", ".safetensors.index.json")) for n in top):
        return FORMAT_SAFETENSORS
    if keras_weight_files(top) or any(n.lower().endswith(".keras") for n in top):
        return FORMAT_KERAS_H5
    if any(n.endswith((".npz", ".npy")) for n in top):
        return FORMAT_NUMPY
    return ""


@dataclass
class RunCheckpoint:
    """One checkpoint of a run.

    Attributes:
        path: the checkpoint as the trainer wrote it: a TF prefix, a file, a step folder, a V1
            file or set pattern, a SavedModel's ``variables/variables`` (absolute, or a URL).
        step: its step, or ``None`` when its name has none.
        kind: :data:`KIND_BUNDLE`, :data:`KIND_FILE`, :data:`KIND_FOLDER`, :data:`KIND_V1` or
            :data:`KIND_SAVED_MODEL`.
        format: the format its name or its files say (``"tf-bundle"``, ``"safetensors"``, ...).
        files: ``{file: signature}`` of every file it is made of (signatures: :data:`Sig`).
        newest: the newest modification time of its files (epoch seconds).
        time: its modification time: its index's, its file's (a folder's: its newest file's).

    Example:
        >>> c = list_run("runs/A").checkpoints[-1]   # doctest: +SKIP
        >>> c.path, c.step, c.kind, c.size           # doctest: +SKIP
        ('/abs/runs/A/ckpt-10', 10, 'bundle', 22074)
    """

    path: str
    step: Optional[int]
    kind: str
    format: str = ""
    files: Dict[str, Sig] = field(default_factory=dict)
    newest: float = 0.0
    time: float = 0.0

    @property
    def sig(self) -> Tuple[Tuple[str, Sig], ...]:
        """All files with their signatures: equal signatures mean nothing changed."""
        return tuple(sorted(self.files.items()))

    @property
    def size(self) -> int:
        """Bytes of all its files."""
        return sum(int(s[2]) for s in self.files.values())

    @property
    def main_file(self) -> str:
        """The file whose time is the checkpoint's: the index (a bundle), the file, else the path
        (a folder's time is its newest file's, a V1 set's its first shard's)."""
        if self.kind in (KIND_BUNDLE, KIND_SAVED_MODEL):
            return storage.add_suffix(self.path, INDEX)
        return self.path


@dataclass(frozen=True)
class Unsafe:
    """A checkpoint of a run left out because a file of it leads outside the directory (or is
    not a regular file): ``path`` (the checkpoint), ``step``, ``file`` (the file concerned) and
    ``reason``, completing ``"<file> <reason>"``."""

    path: str
    step: Optional[int]
    file: str
    reason: str

    def error(self, directory: str) -> UnsafeCheckpointError:
        """The error that says why it was left out."""
        return UnsafeCheckpointError(
            f"Checkpoint {quote_name(self.path)} of {quote_name(directory)} was left out: {escape_name(self.file)} "
            f"{self.reason}. ckptmerge reads a run only inside its folder; pass the checkpoint itself if you "
            "mean it, or copy it into the folder.", path=self.path)


@dataclass
class Run:
    """What one look at a training directory found (see the module docstring).

    Attributes:
        directory: the directory (absolute, or a URL).
        given: the directory as the caller wrote it (for messages).
        checkpoints: every checkpoint, by step (those without one last), then path.
        pending: step folders with no checkpoint in them yet (a trainer writing their first file).
        state: the ``checkpoint`` state file's content, if it was read and there is one.
        unsafe: checkpoints left out because a file leads outside the directory.
        vanished: ``(path, step)`` of checkpoints seen in the listing but gone before they could
            be looked at (a cleanup racing the look).
        stepless: names of checkpoint files without a step, of the kinds a watch follows by step.
        latest_path: what the state file names as the latest, located in the directory (``None``:
            no state file, none named, or named outside: ``state.outside`` says).
        names: the names the look saw directly in the directory (hidden ones left out).
        exists: whether the directory exists.

    Example:
        >>> run = list_run("runs/A")                          # doctest: +SKIP
        >>> [c.step for c in run.checkpoints], run.latest.step  # doctest: +SKIP
        ([1, 9, 10], 1)
    """

    directory: str
    given: str
    checkpoints: List[RunCheckpoint] = field(default_factory=list)
    pending: List[RunCheckpoint] = field(default_factory=list)
    state: Optional[CheckpointState] = None
    unsafe: List[Unsafe] = field(default_factory=list)
    vanished: List[Tuple[str, Optional[int]]] = field(default_factory=list)
    stepless: List[str] = field(default_factory=list)
    latest_path: Optional[str] = None
    names: List[str] = field(default_factory=list)
    exists: bool = True

    @property
    def latest(self) -> Optional[RunCheckpoint]:
        """The checkpoint the state file names as the latest (inside the directory); for a run of
        Orbax steps, which has no state file, the highest step (as Orbax's CheckpointManager has it)."""
        if self.latest_path:
            key = _key(self.latest_path)  # (the look's paths are normalised already)
            return next((c for c in self.checkpoints if c.path == key), None)
        if self.orbax_root:
            stepped = self.stepped()
            return stepped[-1] if stepped and len(self.with_step(stepped[-1].step)) == 1 else None
        return None

    @property
    def orbax_root(self) -> bool:
        """Whether the run is a CheckpointManager root of Orbax steps (every checkpoint an Orbax
        step folder, no state file): Orbax's own rules pick its latest and its steps
        (:mod:`ckptmerge.sources.orbax`)."""
        return self.state is None and bool(self.checkpoints) and all(c.format == FORMAT_ORBAX for c in self.checkpoints)

    def stepped(self) -> List[RunCheckpoint]:
        """The checkpoints with a step, by step."""
        return [c for c in self.checkpoints if c.step is not None]

    def with_step(self, step: Optional[int]) -> List[RunCheckpoint]:
        """The checkpoints of ``step`` (more than one: the step is ambiguous)."""
        return [c for c in self.checkpoints if c.step == step]

    @property
    def duplicates(self) -> Dict[int, List[RunCheckpoint]]:
        """``{step: [checkpoints]}`` of every step held by more than one checkpoint."""
        by: Dict[int, List[RunCheckpoint]] = {}
        for c in self.stepped():
            by.setdefault(c.step, []).append(c)  # type: ignore[arg-type]
        return {s: cs for s, cs in by.items() if len(cs) > 1}

    def steps_text(self) -> str:
        """The steps there, for messages (``"1, 9, 10"`` or ``"none"``)."""
        steps = sorted({c.step for c in self.stepped()})  # type: ignore[type-var]
        return ", ".join(map(str, steps)) if steps else "none"

    def shown(self, c: RunCheckpoint) -> str:
        """``c``'s path as the caller wrote the directory (``runs/A/ckpt-1``)."""
        return show_in(c.path, self.directory, self.given)

    def ambiguous(self, step: int, cands: Sequence[RunCheckpoint], what: str = "") -> ArgumentError:
        """The error for a step held by several checkpoints (``what`` says what wanted it)."""
        return ArgumentError(
            f"{len(cands)} checkpoints of step {step} in {quote_name(self.given)}{what}: "
            f"{format_list([self.shown(c) for c in cands])}. ckptmerge cannot tell which one is step {step}; "
            "pass the one you mean as a path, or move the other out of the directory.")

    def pick(self, step: int) -> RunCheckpoint:
        """The one checkpoint of ``step``.

        Raises:
            CheckpointNotFoundError: no checkpoint of that step (the message lists the steps there).
            ArgumentError: several checkpoints of that step (named).
        """
        found = self.with_step(step)
        if not found:
            raise CheckpointNotFoundError(
                f"no checkpoint of step {step} in {quote_name(self.given)}; steps there: {self.steps_text()}. "
                f"Run {quoted_command('checkpoints', self.given)} to list them.", path=self.given)
        if len(found) > 1:
            raise self.ambiguous(step, found)
        return found[0]

    def choose(self, why: str) -> Optional[Tuple[RunCheckpoint, str]]:
        """The checkpoint a directory means when no state file names its latest (``why`` says
        why not, for the note): the highest step, held by one checkpoint; without steps, the only
        one (TF checkpoints before stray Keras files). ``None`` when the run holds none.

        Raises:
            ArgumentError: the highest step is held by several checkpoints, several hold no step,
                or the directory is also a checkpoint of its own (:meth:`own_files`).

        Example:
            >>> list_run("runs/A").choose("no 'checkpoint' state file")[1]  # doctest: +SKIP
            "no 'checkpoint' state file in runs/A; took the highest step 10 of 3 checkpoints"
        """
        if not self.checkpoints:
            return None
        if self.own_files():
            raise self.both_error()
        stepped = self.stepped()
        if stepped:  # two checkpoints of one step are never reduced to one
            top: int = stepped[-1].step  # type: ignore[assignment]
            best = self.with_step(top)
            if len(best) > 1:
                raise self.ambiguous(top, best, " (the highest step, and no state file naming the latest)")
            if len(self.checkpoints) == 1:
                return best[0], f"only checkpoint in {self.given} ({why})"
            logger.info("%s: %s; taking the highest step %d", self.given, why, top)
            return best[0], f"{why} in {self.given}; took the highest step {top} of {len(self.checkpoints)} checkpoints"
        pool = [c for c in self.checkpoints if c.format in (FORMAT_TF_BUNDLE, FORMAT_TF_V1)] or self.checkpoints
        if len(pool) == 1:
            return pool[0], f"only checkpoint in {self.given} ({why})"
        raise ArgumentError(
            f"{quote_name(self.given)} holds {len(pool)} checkpoints ({format_list([self.shown(c) for c in pool])}) and "
            f"{why}, so ckptmerge cannot tell which one you mean. Pass one of them as a prefix, or a step "
            f"(run {quoted_command('checkpoints', self.given)} to list them).")

    def own_files(self) -> List[str]:
        """The names of the safetensors and ``.npy`` files directly in the directory that are no
        checkpoint of the run (one model's shards, files without a step): the folder's own checkpoint."""
        return [n for n in self.names if n.endswith((".safetensors", ".safetensors.index.json", ".npy"))
                and classify(n, False) is None]

    def both_error(self) -> ArgumentError:
        """The error for a directory that is one checkpoint (:meth:`own_files`) and holds a run too."""
        own = self.own_files()
        return ArgumentError(
            f"{quote_name(self.given)} holds a checkpoint of its own (its files such as "
            f"{quote_name(join_shown(self.given, own[0]))}) and the checkpoints of a run (steps {self.steps_text()}), "
            "so ckptmerge cannot tell which one you mean. Pass a step (step=N) for the run's, or the file you mean.")

    def warn(self) -> None:
        """Log what was left out, and steps held twice (once per call: a listing's warnings)."""
        for u in self.unsafe:
            logger.warning("%s: left out %s: %s %s", self.given, self.shown_path(u.path), u.file, u.reason)
        for recorded in self.state.outside if self.state is not None else ():
            logger.warning("%s names %s, which is outside %s: not used (ckptmerge reads only checkpoints inside "
                           "the directory whose state file names them)", join_shown(self.given, STATE_FILE),
                           quote_name(recorded), quote_name(self.given))
        for step, cands in sorted(self.duplicates.items()):
            logger.warning("%s holds %d checkpoints of step %d: %s; a command that picks step %d refuses it",
                           self.given, len(cands), step, format_list([self.shown(c) for c in cands]), step)

    def shown_path(self, path: str) -> str:
        """``path`` shown as under the directory the caller wrote."""
        return show_in(path, self.directory, self.given)

    def infos(self) -> List[CheckpointInfo]:
        """A :class:`~ckptmerge.CheckpointInfo` per checkpoint (its time the state file's record,
        when it has one), after logging what the look left out (:meth:`warn`): what
        :func:`ckptmerge.checkpoints` returns.

        Example:
            >>> [c.step for c in list_run("runs/A").infos()]   # doctest: +SKIP
            [1, 9, 10]
        """
        self.warn()
        latest, state = self.latest, self.state
        out = []
        for c in self.checkpoints:
            ts = state.timestamp_of(c.path) if state is not None and not storage.is_url(c.path) else None
            out.append(CheckpointInfo(path=c.path, step=c.step, time=float(ts if ts is not None else c.time),
                                      size=c.size, latest=c is latest))
        return out


def duplicate_steps(checkpoints: Iterable[Any]) -> List[Tuple[int, List[str]]]:
    """``[(step, [path, ...])]`` of every step that more than one of ``checkpoints`` (anything
    with ``step`` and ``path``: :class:`RunCheckpoint`, :class:`~ckptmerge.CheckpointInfo`) holds,
    by step: a selection holding one of them is refused, naming all.

    Example:
        >>> from ckptmerge.sources.resolved import CheckpointInfo as I
        >>> duplicate_steps([I("r/m-7", 7, 0.0, 1, False), I("r/m-007", 7, 0.0, 1, False), I("r/m-8", 8, 0.0, 1, False)])
        [(7, ['r/m-007', 'r/m-7'])]
    """
    by: Dict[int, List[str]] = {}
    for c in checkpoints:
        if c.step is not None:
            by.setdefault(c.step, []).append(c.path)
    return [(s, sorted(ps)) for s, ps in sorted(by.items()) if len(ps) > 1]


def select_steps(infos: Sequence[Any], *, last: Optional[int] = None, steps: Any = None, every: Optional[int] = None,
                 where: str = "the directory") -> List[Any]:
    """The checkpoints of a run a selection keeps (``steps``, then ``every``, then ``last``), of
    anything with ``step`` and ``path`` in step order (:class:`~ckptmerge.CheckpointInfo`): what
    ``combine``/``average`` take from a training directory. ``last=N`` takes the N highest steps
    (a checkpoint without a step has no place in that order); a selection holding two checkpoints
    of one step is refused, naming both.

    Raises:
        CombineError: fewer checkpoints than ``last``, a listed step missing, nothing selected,
            or a step held twice.
        ArgumentError, ArgumentTypeError: a bad ``last``, ``steps`` or ``every``.

    Example:
        >>> from ckptmerge.sources.resolved import CheckpointInfo as I
        >>> [c.step for c in select_steps([I("r/m-1", 1, 0.0, 1, False), I("r/m-2", 2, 0.0, 1, False),
        ...                                I("r/best", None, 0.0, 1, False)], last=1)]
        [2]
    """
    picked = list(infos)
    if steps is not None:
        if isinstance(steps, range):
            keep = set(steps)
            picked = [c for c in picked if c.step is not None and c.step in keep]
        elif isinstance(steps, (tuple, list)) and len(steps) == 2 and not isinstance(steps, list):
            lo, hi = steps
            picked = [c for c in picked if c.step is not None and (lo is None or c.step >= lo)
                      and (hi is None or c.step <= hi)]
        elif isinstance(steps, (list, tuple, set, frozenset)):
            keep = {int(s) for s in steps}
            missing = sorted(keep - {c.step for c in picked})
            if missing:
                have = [c.step for c in infos if c.step is not None]
                raise CombineError(f"{where} has no checkpoint of step {', '.join(map(str, missing))}; it has steps "
                                   f"{', '.join(map(str, have[:20]))}{' ...' if len(have) > 20 else ''}.")
            picked = [c for c in picked if c.step in keep]
        else:
            raise ArgumentTypeError("steps must be a range (range(1000, 5001)), a (low, high) tuple (inclusive, "
                                    f"either may be None) or a list of steps. Received: steps={describe_value(steps)}")
    if every is not None:
        if isinstance(every, bool) or not isinstance(every, int) or every < 1:
            raise ArgumentError(f"every must be a positive int (keep the steps divisible by it). Received: every={every!r}")
        picked = [c for c in picked if c.step is not None and c.step % every == 0]
    if last is not None:
        if isinstance(last, bool) or not isinstance(last, int) or last < 1:
            raise ArgumentError(f"last must be a positive int. Received: last={last!r}")
        picked = [c for c in picked if c.step is not None]  # one without a step has no place in the order
        if len(picked) < last:
            raise CombineError(f"{where} has {plural(len(picked), 'checkpoint')} with a step matching the selection, "
                               f"fewer than last={last}. Run {quoted_command('checkpoints', where)} to list them.")
        picked = picked[-last:]
    if not picked:
        raise CombineError(f"No checkpoint of {where} matches the selection (last={last}, steps={steps!r}, every={every}). "
                           f"Run {quoted_command('checkpoints', where)} to list them.")
    twice = duplicate_steps(picked)
    if twice:
        step, paths = twice[0]
        raise CombineError(f"{len(paths)} checkpoints of step {step} in {escape_name(where)}: {format_list(paths)}. ckptmerge cannot "
                           f"tell which one is step {step}; pass the checkpoints you mean as a list, or move the other "
                           "out of the directory.")
    return picked



def join_shown(given: str, name: str) -> str:
    """``given/name`` for a directory as the user wrote it (a path or a URL)."""
    return storage.join(given, name)


def show_in(path: str, directory: str, given: str) -> str:
    """``path`` under ``directory`` shown as under ``given`` (as the user wrote it), else as it is."""
    if storage.is_url(path) or storage.is_url(directory):
        d = storage.strip_slash(directory)
        return storage.join(given, path[len(d) + 1:]) if path.startswith(d + "/") else path
    try:
        rel = os.path.relpath(path, directory)
    except ValueError:
        return path
    return path if rel.startswith(os.pardir) else os.path.join(given, rel)


def _key(path: str) -> str:
    return storage.strip_slash(path) if storage.is_url(path) else os.path.normpath(path)


def sort_key(c: RunCheckpoint) -> tuple:
    """The order of a run's checkpoints: by step (those without one last), then path."""
    return (c.step is None, c.step if c.step is not None else 0, c.path)


def inside(path: str, directory: str) -> bool:
    """Whether ``path`` (a checkpoint prefix, file or folder; it need not exist) lies inside
    ``directory``, links resolved, for local paths; for URLs, whether it is below the directory's
    URL (``..`` segments resolved).

    Example:
        >>> inside("/run/ckpt-1", "/run"), inside("/run/../elsewhere/ckpt-9", "/run")
        (True, False)
        >>> inside("s3://b/run/ckpt-1", "s3://b/run"), inside("s3://b/other/ckpt-1", "s3://b/run")
        (True, False)
    """
    if storage.is_url(path) or storage.is_url(directory):
        if not (storage.is_url(path) and storage.is_url(directory)):
            return False
        d = storage.strip_slash(directory)
        scheme, _, rest = path.partition("://")
        norm = scheme + "://" + posixpath.normpath(rest)
        return norm.startswith(d + "/")
    real_dir = os.path.realpath(directory)
    real = os.path.join(os.path.realpath(os.path.dirname(os.path.abspath(path))), os.path.basename(path))
    if os.path.islink(path):
        real = os.path.realpath(path)
    return os.path.commonpath([real, real_dir]) == real_dir and real != real_dir
