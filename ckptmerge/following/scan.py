"""One look at a training directory: the checkpoints it holds, and which of them are complete.

:func:`scan` lists a local directory (one ``scandir``) or a URL (one listing, the store's cache
dropped first) and returns every step-numbered checkpoint above a floor, with the files it is
made of and their signatures (local: device, inode, size, modification time; remote: size and
modification time), so that a watcher re-checks a checkpoint only when one of its files changed:

- a TF bundle: ``PREFIX.index`` with its ``PREFIX.data-*`` shards (the step is the ``-N`` of
  ``PREFIX``, as everywhere in ckptmerge);
- a single file: Keras ``.weights.h5`` / ``.h5`` / ``.hdf5`` / ``.keras``, or ``.safetensors``
  (``ckpt-10.weights.h5``, ``model-300.safetensors``; shards ``-00001-of-00002`` are not steps);
- a step folder: a directory named ``checkpoint-500``, ``step_100`` or ``100`` holding one
  checkpoint (safetensors files, a TF bundle, a Keras file, an Orbax step), every file below it
  included; an Orbax step on Google Cloud Storage only once its ``commit_success.txt`` is there.

:func:`check` decides whether a candidate is complete: every file whole (footers and headers,
:mod:`ckptmerge.formats.whole`) and the checkpoint opening with its own reader (the TF index
parsed with its CRCs checked, every data shard present and as long as its entries need, a
sharded safetensors set with all its shards). It never raises for a checkpoint: the verdict is
``COMPLETE``, ``INCOMPLETE`` (a file is missing or not whole yet: wait) or ``FAILING`` (the files
are all there but do not read: damaged, unless they are still changing). Hidden names (``.``)
are never listed, so the watcher's own pin folders stay out. Nothing here imports TensorFlow.
"""

from __future__ import annotations

import os
import re
import stat
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Set, Tuple

from ..core.errors import ArgumentError, CheckpointFormatError, CheckpointNotFoundError, CkptMergeError
from ..formats.io import storage
from ..formats.orbax.layout import COMMIT_FILE
from ..formats.tf.bundle import DATA_RE
from ..formats.whole import safetensors_unfinished, table_unfinished, unfinished
from ..core.text import escape_name, quote_name, quoted_command
from ..sources.files import FORMAT_KERAS_H5, FORMAT_SAFETENSORS, FORMAT_TF_BUNDLE, INDEX, step_of
from ..sources.orbax import FORMAT_ORBAX

__all__ = ["Candidate", "scan", "check", "COMPLETE", "INCOMPLETE", "FAILING", "KIND_BUNDLE", "KIND_FILE",
           "KIND_FOLDER", "MAX_FOLDER_FILES", "ORBAX_COMMIT_SCHEMES"]

COMPLETE, INCOMPLETE, FAILING = "complete", "incomplete", "failing"
KIND_BUNDLE, KIND_FILE, KIND_FOLDER = "bundle", "file", "folder"

#: Where Orbax marks a finished step with ``commit_success.txt`` instead of renaming its folder.
ORBAX_COMMIT_SCHEMES = ("gs://", "gcs://")

#: Files looked at below one step folder (a bigger folder is not a checkpoint a watcher follows).
MAX_FOLDER_FILES = 100_000

_SINGLE = (".weights.h5", ".h5", ".hdf5", ".keras", ".safetensors")
_SHARD = re.compile(r"-(\d{5})-of-(\d{5})$")
_FOLDER_STEP = re.compile(r"(?:^|[-_])(\d+)$")
# A folder a trainer writes into and renames when it is whole: Hugging Face's tmp-checkpoint-500,
# Orbax's 100.orbax-checkpoint-tmp-1733, TF1's model.ckpt-100_temp_<uuid>.
_TEMPORARY = re.compile(r"(?:^|[-_.])(?:tmp|temp)(?:[-_.]|$)", re.IGNORECASE)
_ST_SHARD = re.compile(r"^(.*)-(\d{5})-of-(\d{5})\.safetensors$")


@dataclass
class Candidate:
    """A checkpoint seen in one look at the directory.

    Attributes:
        path: the checkpoint: a TF prefix, a file or a step folder (absolute, or a URL).
        step: its step.
        kind: ``"bundle"``, ``"file"`` or ``"folder"``.
        files: ``{file: signature}`` of every file it is made of; a signature is ``(device,
            inode, size, modification time)`` (remote: ``(0, 0, size, modification time)``).
        newest: the newest modification time (epoch seconds) of its files (or folder).
    """

    path: str
    step: int
    kind: str
    files: Dict[str, Tuple[Any, ...]] = field(default_factory=dict)
    newest: float = 0.0

    @property
    def sig(self) -> Tuple[Tuple[str, Tuple[Any, ...]], ...]:
        """All files with their signatures: equal signatures mean nothing changed."""
        return tuple(sorted(self.files.items()))

    @property
    def size(self) -> int:
        """Bytes of all its files."""
        return sum(int(s[2]) for s in self.files.values())

    @property
    def main_file(self) -> str:
        """The file whose time is the checkpoint's: the index, the file, the newest file."""
        if self.kind == KIND_BUNDLE:
            return storage.add_suffix(self.path, INDEX)
        return self.path


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


def _local_sig(st: os.stat_result) -> Tuple[int, int, int, int]:
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


# -- listing ---------------------------------------------------------------------------------------


@dataclass
class Listing:
    """What one look found: candidates above the floor, the names without a step, the step
    folders (to be notified of their changes)."""

    candidates: Dict[str, Candidate] = field(default_factory=dict)
    stepless: Set[str] = field(default_factory=set)
    folders: List[str] = field(default_factory=list)
    exists: bool = True


def scan(directory: str, floor: Optional[int]) -> Listing:
    """The checkpoints of ``directory`` (absolute path or URL) whose step is above ``floor``.

    A directory that does not exist (yet) holds none. Files that vanish while they are looked at
    leave their checkpoint out of this look.

    Raises:
        ArgumentError: ``directory`` is a file.
        OSError: the directory cannot be listed (permissions).

    Example:
        >>> sorted(c.step for c in scan("/abs/runs/A", 5).candidates.values())  # doctest: +SKIP
        [6, 7]
    """
    return _scan_url(directory, floor) if storage.is_url(directory) else _scan_local(directory, floor)


def _classify(name: str, is_dir: bool, floor: Optional[int], out: Listing) -> Optional[Tuple[str, int]]:
    """``(kind, step)`` of a directory entry that is a checkpoint above ``floor``; ``None`` for
    anything else (a checkpoint file without a step is recorded in ``out.stepless``)."""
    if is_dir:
        kind, step = KIND_FOLDER, folder_step(name)
    elif name.endswith(INDEX) and len(name) > len(INDEX):
        kind, step = KIND_BUNDLE, step_of(name[: -len(INDEX)])
    elif name.lower().endswith(_SINGLE):
        kind, step = KIND_FILE, file_step(name)
        if step is None and _SHARD.search(name.rsplit(".", 1)[0]):
            return None  # a shard of a set, not a checkpoint of its own
    else:
        return None
    if step is None:
        if kind != KIND_FOLDER:
            out.stepless.add(name)
        return None
    return (kind, step) if floor is None or step > floor else None


def _not_a_directory(directory: str) -> ArgumentError:
    return ArgumentError(
        f"{quote_name(directory)} is not a directory: watch follows the directory a trainer saves its "
        f"checkpoints to. {quoted_command('ls', directory)} inspects a single checkpoint.")


def _scan_local(directory: str, floor: Optional[int]) -> Listing:
    out = Listing()
    try:
        with os.scandir(directory) as it:
            entries = list(it)
    except FileNotFoundError:
        out.exists = False
        return out
    except NotADirectoryError:
        raise _not_a_directory(directory) from None
    data: Dict[str, List[os.DirEntry]] = {}
    picked: List[Tuple[os.DirEntry, str, int]] = []
    for e in entries:
        name = e.name
        if name.startswith("."):
            continue
        m = DATA_RE.search(name)
        if m is not None:
            data.setdefault(name[:m.start()], []).append(e)
            continue
        try:
            is_dir = e.is_dir()
        except OSError:
            continue
        found = _classify(name, is_dir, floor, out)
        if found is not None:
            picked.append((e, *found))
    for e, kind, step in picked:
        try:
            if kind == KIND_BUNDLE:
                prefix = e.path[: -len(INDEX)]
                c = Candidate(prefix, step, kind)
                for f in [e, *data.get(e.name[: -len(INDEX)], [])]:
                    st = f.stat()
                    c.files[f.path] = _local_sig(st)
                    c.newest = max(c.newest, st.st_mtime)
            elif kind == KIND_FILE:
                st = e.stat()
                if not stat.S_ISREG(st.st_mode):
                    continue
                c = Candidate(e.path, step, kind, {e.path: _local_sig(st)}, st.st_mtime)
            else:
                c = _local_folder(e.path, step)
                out.folders.append(e.path)
        except OSError:  # deleted while we looked: not in this look
            continue
        out.candidates[c.path] = c
    return out


def _local_folder(folder: str, step: int) -> Candidate:
    c = Candidate(folder, step, KIND_FOLDER, newest=os.stat(folder).st_mtime)
    for root, dirs, files in os.walk(folder):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        for name in files:
            if name.startswith("."):
                continue
            path = os.path.join(root, name)
            st = os.stat(path)
            if not stat.S_ISREG(st.st_mode):
                continue
            c.files[path] = _local_sig(st)
            c.newest = max(c.newest, st.st_mtime)
            if len(c.files) > MAX_FOLDER_FILES:
                raise OSError(f"more than {MAX_FOLDER_FILES} files below {folder}")
    return c


def _scan_url(url: str, floor: Optional[int]) -> Listing:
    out = Listing()
    url = storage.strip_slash(url)
    storage.forget_listings(url)
    try:
        entries = storage.remote_listdir(url)
    except CheckpointNotFoundError:
        out.exists = False
        return out
    if len(entries) == 1 and entries[0]["type"] != "directory" and entries[0]["name"] == storage.basename(url):
        raise _not_a_directory(url)
    by_name = {e["name"]: e for e in entries}
    data: Dict[str, List[str]] = {}
    for name in by_name:
        m = DATA_RE.search(name)
        if m is not None:
            data.setdefault(name[:m.start()], []).append(name)
    for name, e in by_name.items():
        if name.startswith(".") or DATA_RE.search(name):
            continue
        found = _classify(name, e["type"] == "directory", floor, out)
        if found is None:
            continue
        kind, step = found
        path = storage.join(url, name)
        if kind == KIND_BUNDLE:
            c = Candidate(storage.join(url, name[: -len(INDEX)]), step, kind)
            for f in [name, *data.get(name[: -len(INDEX)], [])]:
                c.files[storage.join(url, f)] = _remote_sig(by_name[f])
                c.newest = max(c.newest, by_name[f]["mtime"] or 0.0)
        elif kind == KIND_FILE:
            c = Candidate(path, step, kind, {path: _remote_sig(e)}, e["mtime"] or 0.0)
        else:
            try:
                c = _remote_folder(path, step)
            except CheckpointNotFoundError:
                continue
        out.candidates[c.path] = c
    return out


def _remote_sig(e: Dict[str, Any]) -> Tuple[Any, ...]:
    """A remote file's signature, shaped as a local one: ``(0, 0, size, modification time)``."""
    return (0, 0, int(e["size"]), e["mtime"] or 0.0)


def _remote_folder(folder: str, step: int, depth: int = 0, c: Optional[Candidate] = None) -> Candidate:
    c = c or Candidate(folder, step, KIND_FOLDER)
    for e in storage.remote_listdir(folder):
        if e["name"].startswith("."):
            continue
        path = storage.join(folder, e["name"])
        if e["type"] == "directory":
            if depth < 4:
                _remote_folder(path, step, depth + 1, c)
            continue
        c.files[path] = _remote_sig(e)
        c.newest = max(c.newest, e["mtime"] or 0.0)
        if len(c.files) > MAX_FOLDER_FILES:
            break
    return c


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
        if c.kind == KIND_FILE:
            why = unfinished(c.path)
            if why:
                return INCOMPLETE, f"{storage.basename(c.path)}: {why}"
            fmt = FORMAT_SAFETENSORS if c.path.lower().endswith(".safetensors") else FORMAT_KERAS_H5
            _open(c.path)
            return COMPLETE, fmt
        return _check_folder(c)
    except CheckpointNotFoundError as e:  # something it needs is not there (yet), or vanished
        return INCOMPLETE, _short(e)
    except (CkptMergeError, OSError, ValueError) as e:
        return FAILING, e


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
