"""One look at a training directory for a watcher: its step-numbered checkpoints, and which are complete.

:func:`scan` is :func:`~ckptmerge.sources.listing.list_run` (the one notion of a run's
checkpoints, :mod:`ckptmerge.sources.runs`: TF bundles, V1 checkpoints, Keras files,
``model-300.safetensors`` files, step folders such as ``checkpoint-500/``) above a floor, with
the files each is made of and their signatures (local: device, inode, size, modification time;
remote: size and modification time), so that a watcher re-checks a checkpoint only when one of
its files changed. Checkpoints with a file that leads outside the directory are left out and
named (``unsafe``); so are ones that vanished while they were looked at (``vanished``).

:func:`check` decides whether a candidate is complete: every file whole (footers and headers,
:mod:`ckptmerge.formats.whole`) and the checkpoint opening with its own reader (the TF index
parsed with its CRCs checked, every data shard present and as long as its entries need, a
sharded safetensors set with all its shards). It never raises for a checkpoint: the verdict is
``COMPLETE``, ``INCOMPLETE`` (a file is missing or not whole yet: wait) or ``FAILING`` (the files
are all there but do not read: damaged, unless they are still changing). Hidden names (``.``)
are never listed, so the watcher's own pin folders stay out. Nothing here imports TensorFlow.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Set, Tuple

from ..core.errors import ArgumentError, CheckpointFormatError, CheckpointNotFoundError, CkptMergeError, ResourceLimitError
from ..formats.io import storage
from ..formats.orbax.layout import COMMIT_FILE
from ..formats.tf.bundle import DATA_RE
from ..formats.whole import safetensors_unfinished, table_unfinished, unfinished
from ..core.text import escape_name
from ..sources.files import FORMAT_KERAS_H5, FORMAT_SAFETENSORS, FORMAT_TF_BUNDLE, INDEX
from ..sources.listing import list_run
from ..sources.orbax import FORMAT_ORBAX
from ..sources.runs import (
    KIND_BUNDLE,
    KIND_FILE,
    KIND_FOLDER,
    KIND_V1,
    MAX_FOLDER_FILES,
    ORBAX_COMMIT_SCHEMES,
    RunCheckpoint,
    Unsafe,
    file_step,
    folder_step,
)

__all__ = ["Candidate", "Listing", "scan", "check", "COMPLETE", "INCOMPLETE", "FAILING", "KIND_BUNDLE", "KIND_FILE",
           "KIND_FOLDER", "MAX_FOLDER_FILES", "ORBAX_COMMIT_SCHEMES", "file_step", "folder_step"]

COMPLETE, INCOMPLETE, FAILING = "complete", "incomplete", "failing"

#: A checkpoint seen in one look at the directory (a :class:`~ckptmerge.sources.runs.RunCheckpoint`
#: with a step).
Candidate = RunCheckpoint

_ST_SHARD = re.compile(r"^(.*)-(\d{5})-of-(\d{5})\.safetensors$")


@dataclass
class Listing:
    """What one look found: candidates above the floor (complete or not), the names without a
    step, the step folders (to be notified of their changes), checkpoints left out because a file
    leads outside the directory, and checkpoints that vanished while they were looked at."""

    candidates: Dict[str, Candidate] = field(default_factory=dict)
    stepless: Set[str] = field(default_factory=set)
    folders: List[str] = field(default_factory=list)
    unsafe: List[Unsafe] = field(default_factory=list)
    vanished: List[Tuple[str, Optional[int]]] = field(default_factory=list)
    exists: bool = True


def scan(directory: str, floor: Optional[int]) -> Listing:
    """The checkpoints of ``directory`` (absolute path or URL) whose step is above ``floor``.

    A directory that does not exist (yet) holds none. Files that vanish while they are looked at
    leave their checkpoint out of this look (named in ``vanished``).

    Raises:
        ArgumentError: ``directory`` is a file.
        OSError: the directory cannot be listed (permissions).

    Example:
        >>> sorted(c.step for c in scan("/abs/runs/A", 5).candidates.values())  # doctest: +SKIP
        [6, 7]
    """
    run = list_run(directory, above=floor, steps_only=True, state=False, fresh=True)
    out = Listing(exists=run.exists, stepless=set(run.stepless), unsafe=run.unsafe, vanished=run.vanished)
    for c in run.checkpoints + run.pending:
        out.candidates[c.path] = c
        if c.kind == KIND_FOLDER:
            out.folders.append(c.path)
    return out


# -- completeness ----------------------------------------------------------------------------------


def check(c: Candidate) -> Tuple[str, Any]:
    """Whether ``c`` is complete: ``(COMPLETE, format)``, ``(INCOMPLETE, reason)`` or
    ``(FAILING, error)``; see the module docstring. Never raises for the checkpoint's content.

    Example:
        >>> check(scan("/abs/runs/A", None).candidates["/abs/runs/A/ckpt-10"])  # doctest: +SKIP
        ('complete', 'tf-bundle')
    """
    try:
        if c.kind == KIND_BUNDLE:
            return _check_bundle(c.path)
        if c.kind == KIND_V1:
            return _check_v1(c)
        if c.kind == KIND_FILE:
            for f in sorted(c.files):  # the file (a sharded Keras set: its JSON and every shard)
                why = unfinished(f)
                if why:
                    return INCOMPLETE, f"{storage.basename(f)}: {why}"
            fmt = FORMAT_SAFETENSORS if c.path.lower().endswith(".safetensors") else FORMAT_KERAS_H5
            _open(c.path)
            return COMPLETE, fmt
        return _check_folder(c)
    except CheckpointNotFoundError as e:  # something it needs is not there (yet), or vanished
        return INCOMPLETE, _short(e)
    except ResourceLimitError:  # out of open files or memory: not this file's fault, never skipped
        raise
    except (CkptMergeError, OSError, ValueError) as e:
        return FAILING, e


def _check_v1(c: Candidate) -> Tuple[str, Any]:
    """A V1 checkpoint: every file a whole table, and the checkpoint opening."""
    for f in sorted(c.files):
        why = table_unfinished(f)
        if why:
            return INCOMPLETE, f"{storage.basename(f)}: {why}"
    _open(c.path)
    return COMPLETE, "tf-v1"


def _short(e: BaseException) -> str:
    return escape_name(str(e).split(". ")[0])


def _open(path: str) -> None:
    from ..formats import open_checkpoint

    with open_checkpoint(path, verify=True):
        pass


def _check_bundle(prefix: str) -> Tuple[str, Any]:
    from ..formats.tf.bundle import BundleReader, ShortShardError

    index = storage.add_suffix(prefix, INDEX)
    why = table_unfinished(index)
    if why:
        return INCOMPLETE, f"{storage.basename(index)}: {why}"
    try:
        with BundleReader(prefix, verify=True):
            pass
    except ShortShardError as e:  # a data shard still being written (or uploaded) in place
        return INCOMPLETE, f"data shard {storage.basename(str(e.path))} is shorter than its index needs"
    except CheckpointFormatError as e:
        shard = e.path if isinstance(e.path, str) and DATA_RE.search(storage.path_part(e.path)) else None
        if shard is not None and not storage.exists(shard):  # a data shard not written (or uploaded) yet
            return INCOMPLETE, f"data shard {storage.basename(shard)} is not there yet"
        return FAILING, e
    return COMPLETE, FORMAT_TF_BUNDLE


def _check_folder(c: Candidate) -> Tuple[str, Any]:
    from ..sources.resolve import open_resolved, resolve_checkpoint

    if not c.files:
        return INCOMPLETE, "the folder is empty"
    try:
        resolved = resolve_checkpoint(c.path)
    except ArgumentError as e:  # several checkpoints in one step folder: not one to follow
        return FAILING, e
    if resolved.format == FORMAT_TF_BUNDLE:
        return _check_bundle(resolved.prefix)
    if resolved.format == FORMAT_SAFETENSORS:
        why = _safetensors_set_unfinished(c)
        if why:
            return INCOMPLETE, why
    elif resolved.format == FORMAT_ORBAX:
        if c.path.lower().startswith(ORBAX_COMMIT_SCHEMES) and storage.join(c.path, COMMIT_FILE) not in c.files:
            return INCOMPLETE, f"no {COMMIT_FILE} yet (Orbax writes it there when the step is finished)"
    else:
        why = unfinished(resolved.prefix)
        if why:
            return INCOMPLETE, f"{storage.basename(resolved.prefix)}: {why}"
    _, reader = open_resolved(c.path, resolved=resolved)
    reader.close()
    return COMPLETE, resolved.format


def _safetensors_set_unfinished(c: Candidate) -> Optional[str]:
    """Why a folder's safetensors files are not all whole yet: a file not whole, or a shard of a
    ``-NNNNN-of-MMMMM`` set not there yet."""
    shards: Dict[Tuple[str, int], Set[int]] = {}
    for f in c.files:
        name = storage.basename(f)
        if not name.endswith(".safetensors"):
            continue
        why = safetensors_unfinished(f)
        if why:
            return f"{name}: {why}"
        m = _ST_SHARD.match(name)
        if m:
            shards.setdefault((storage.sibling(f, m.group(1)), int(m.group(3))), set()).add(
                int(m.group(2)))
    for (stem, total), have in shards.items():
        if len(have) < total:
            return f"{len(have)} of the {total} shards of {storage.basename(stem)} are there"
    return None
