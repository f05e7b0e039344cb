"""One look at a run: :func:`list_run` lists a training directory (local, or by URL) as
:mod:`ckptmerge.sources.runs` defines its checkpoints.

Locally one ``scandir`` finds every checkpoint (a step folder is walked, each file below it
checked), each file's signature comes from the same look, and every file is confined to the
directory (:func:`ckptmerge.formats.io.localfile.link_problem`: a link out of it leaves the
checkpoint out, in ``Run.unsafe``). By URL one listing of the directory, plus one per step folder
(down to four levels: Orbax items and their arrays). The ``checkpoint`` state file is read here
too, with its paths confined (:mod:`ckptmerge.sources.state`). Nothing here reads tensors or
imports TensorFlow.
"""

from __future__ import annotations

import os
import posixpath
import stat
from typing import Any, Dict, List, Optional, Sequence, Tuple

from ..core.errors import ArgumentError, CheckpointNotFoundError, CkptMergeError, ResourceLimitError
from ..formats.io import storage
from ..formats.io.localfile import link_problem
from ..formats.orbax.layout import COMMIT_FILE, METADATA_FILE
from ..formats.tf.bundle import DATA_RE
from ..core.redact import get_logger
from ..core.text import quote_name, quoted_command
from .files import (
    FORMAT_KERAS_H5,
    FORMAT_TF_BUNDLE,
    FORMAT_TF_V1,
    INDEX,
    KERAS_SHARDS,
    STATE_FILE,
    index_exists,
    keras_weight_files,
    step_of,
    v1_files,
    v1_format,
)
from .orbax import FORMAT_ORBAX
from .runs import (
    KIND_BUNDLE,
    KIND_FILE,
    KIND_FOLDER,
    KIND_SAVED_MODEL,
    KIND_V1,
    MAX_FOLDER_FILES,
    ORBAX_COMMIT_SCHEMES,
    Run,
    RunCheckpoint,
    Sig,
    Unsafe,
    classify,
    folder_format,
    sort_key,
)
from .state import CheckpointState, read_state, state_from_text

__all__ = ["list_run", "read_state_url", "sig_of"]

logger = get_logger(__name__)

_FOLDER_DEPTH = 4  # levels below a step folder listed by URL (Orbax items, their arrays)


#: Hidden names a checkpoint's step folder needs: zarr's metadata files (an Orbax array folder of
#: zarr v2 holds ``.zarray``); every other hidden name is left out of a step folder's files.
_ZARR_HIDDEN = frozenset((".zarray", ".zattrs", ".zgroup", ".zmetadata"))


def _kept(name: str) -> bool:
    return not name.startswith(".") or name in _ZARR_HIDDEN


def list_run(directory: str, *, given: Optional[str] = None, above: Optional[int] = None, steps_only: bool = False,
             state: bool = True, fresh: bool = False) -> Run:
    """Look at the run in ``directory`` (a local path or a URL) once: every checkpoint of it, as
    :mod:`ckptmerge.sources.runs` defines them, with the files each is made of.

    Args:
        directory: the directory (a ``file://`` URL is a local path).
        given: the directory as the user wrote it, for messages (default: ``directory``).
        above: only checkpoints whose step is above this (a watcher's floor: nothing at or below
            it is looked at); implies ``steps_only``.
        steps_only: only checkpoints with a step (names of stepless files go to ``Run.stepless``).
        state: read the ``checkpoint`` state file (its latest, and checkpoints it names in folders
            below the directory).
        fresh: by URL, drop the store's cached listings first (a watcher must see new objects).

    Returns:
        The :class:`~ckptmerge.sources.runs.Run` (a directory that does not exist holds none:
        ``exists`` is False).

    Raises:
        ArgumentError: ``directory`` is a file.
        OSError: the directory cannot be listed (permissions).
        CheckpointFormatError: the state file cannot be parsed.

    Example:
        >>> [c.step for c in list_run("/abs/runs/A", above=5).checkpoints]  # doctest: +SKIP
        [6, 7]
    """
    steps_only = steps_only or above is not None
    if storage.is_url(directory):
        return _Remote(storage.strip_slash(directory), given or directory, above, steps_only).run(state, fresh)
    return _Local(directory, given or directory, above, steps_only).run(state)


def not_a_directory(directory: str) -> ArgumentError:
    """The error for a run directory that is a file.

    Example:
        >>> str(not_a_directory("runs/A/ckpt-1.index")).split(":")[0]
        "'runs/A/ckpt-1.index' is not a directory"
    """
    return ArgumentError(
        f"{quote_name(directory)} is not a directory: pass the directory a trainer saves its checkpoints to. "
        f"{quoted_command('ls', directory)} inspects a single checkpoint.")


def sig_of(st: os.stat_result) -> Sig:
    """The signature of a local file's ``stat``: ``(device, inode, size, modification time in ns)``.

    Example:
        >>> sig_of(os.stat("setup.py"))[2] > 0  # doctest: +SKIP
        True
    """
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


class _Gone(Exception):
    """A file of a checkpoint vanished while it was looked at."""


class _Out(Exception):
    """A file of a checkpoint may not be read (args: the file, the reason)."""


class _Look:
    """What a local and a remote look share: the floor, and what they found."""

    def __init__(self, directory: str, given: str, above: Optional[int], steps_only: bool) -> None:
        self.directory = directory
        self.above = above
        self.steps_only = steps_only
        self.out = Run(directory, given)

    def wanted(self, step: Optional[int]) -> bool:
        if step is None:
            return not self.steps_only
        return self.above is None or step > self.above

    def entries(self, names: Sequence[str], is_dir: Dict[str, bool]) -> Tuple[List[Tuple[str, str, Optional[int], str]],
                                                                        Dict[str, List[str]]]:
        """``(picked, data)``: ``(name, kind, step, format)`` of each entry that is a wanted
        checkpoint, and the data shards of each bundle by its base name."""
        keras = set(keras_weight_files(names))
        data: Dict[str, List[str]] = {}
        picked = []
        for name in names:
            m = DATA_RE.search(name)
            if m is not None:
                data.setdefault(name[: m.start()], []).append(name)
                continue
            found = classify(name, is_dir.get(name, False))
            if found is None:
                continue
            kind, step, fmt = found
            if fmt == FORMAT_KERAS_H5 and not name.lower().endswith(".keras") and name not in keras:
                continue  # a shard of a Keras sharded set whose JSON is there
            if step is None and kind in (KIND_FILE, KIND_BUNDLE) and self.steps_only:
                self.out.stepless.append(name)
            if self.wanted(step):
                picked.append((name, kind, step, fmt))
        return picked, data

    def finish(self, state: Optional[CheckpointState]) -> Run:
        self.out.state = state
        if state is not None and state.model_checkpoint_path:
            self.out.latest_path = self.located(state.model_checkpoint_path)
        self.out.checkpoints.sort(key=sort_key)
        self.out.stepless.sort()
        return self.out

    def located(self, named: str) -> str:
        return named


class _Local(_Look):
    """One look at a local directory."""

    def __init__(self, directory: str, given: str, above: Optional[int], steps_only: bool) -> None:
        super().__init__(os.path.abspath(directory), given, above, steps_only)

    def run(self, with_state: bool) -> Run:
        out = self.out
        try:
            with os.scandir(self.directory) as it:
                found = {e.name: e for e in it if not e.name.startswith(".")}
        except FileNotFoundError:
            out.exists = False
            return out
        except NotADirectoryError:
            raise not_a_directory(out.given) from None
        is_dir = {}
        for name, e in found.items():
            try:
                is_dir[name] = e.is_dir()
            except OSError:
                is_dir[name] = False
        out.names = sorted(found)
        picked, data = self.entries(out.names, is_dir)
        for name, kind, step, fmt in picked:
            path = os.path.join(self.directory, name)
            shown = path[: -len(INDEX)] if kind == KIND_BUNDLE else path
            try:
                c = self.make(path, kind, step, fmt, data)
            except _Gone:
                out.vanished.append((shown, step))
                continue
            except _Out as x:
                out.unsafe.append(Unsafe(shown, step, *x.args))
                continue
            if c is not None:
                (out.pending if kind == KIND_FOLDER and not c.format else out.checkpoints).append(c)
        if not self.steps_only:
            self.saved_model(found)
        state = self.state() if with_state else None
        return self.finish(state)

    # -- confinement: a file the directory leads to, not one the user named ---------------------
    def add_file(self, c: RunCheckpoint, path: str) -> None:
        """Add ``path`` to ``c`` with its signature, if it is a regular file inside the directory."""
        try:
            st = os.lstat(path)
            if stat.S_ISLNK(st.st_mode):
                why = link_problem(self.directory, path)
                if why is not None:
                    raise _Out(path, why)
                st = os.stat(path)
        except FileNotFoundError:
            raise _Gone() from None
        if not stat.S_ISREG(st.st_mode):
            raise _Out(path, link_problem(self.directory, path) or "is not a regular file")
        c.files[path] = sig_of(st)
        c.newest = max(c.newest, st.st_mtime)
        if path == c.main_file:
            c.time = st.st_mtime

    # -- each kind --------------------------------------------------------------------------------
    def make(self, path: str, kind: str, step: Optional[int], fmt: str,
             data: Dict[str, List[str]]) -> Optional[RunCheckpoint]:
        if kind == KIND_BUNDLE:
            base = os.path.basename(path)[: -len(INDEX)]
            c = RunCheckpoint(path[: -len(INDEX)], step, kind, fmt)
            for f in [base + INDEX, *data.get(base, [])]:
                self.add_file(c, os.path.join(self.directory, f))
            return c
        if kind == KIND_FILE:
            c = RunCheckpoint(path, step, kind, fmt)
            self.add_file(c, path)
            if path.endswith(KERAS_SHARDS):
                for name in _shard_names(path):
                    if os.path.lexists(os.path.join(self.directory, name)):
                        self.add_file(c, os.path.join(self.directory, name))
            return c
        if kind == KIND_V1:
            if os.path.islink(path) and link_problem(self.directory, path) is not None:
                raise _Out(path, link_problem(self.directory, path))
            pattern = v1_format(path)
            if pattern is None or (pattern != path and any(c.path == pattern for c in self.out.checkpoints)):
                return None  # not a table file, or one more shard of a set already found
            return self.v1(pattern)
        return self.folder(path, step)

    def v1(self, pattern: str) -> RunCheckpoint:
        """A V1 checkpoint (one file, or a set's pattern); its time is its first file's."""
        c = RunCheckpoint(pattern, step_of(pattern), KIND_V1, FORMAT_TF_V1)
        for f in v1_files(pattern):
            self.add_file(c, f)
        first = min(c.files)
        c.time = os.stat(first).st_mtime
        return c

    def _real_dir(self) -> str:
        """The directory's real path (asked of the OS once per look)."""
        real = self.__dict__.get("_real")
        if real is None:
            real = self.__dict__["_real"] = os.path.realpath(self.directory)
        return real

    def folder(self, folder: str, step: Optional[int]) -> RunCheckpoint:
        """A step folder and every file below it (hidden names left out), each confined to the
        directory; links to folders inside it are followed once."""
        if os.path.islink(folder):
            why = link_problem(self.directory, folder) if not os.path.isdir(folder) else None
            real_dir = os.path.realpath(self.directory)
            real = os.path.realpath(folder)
            if why is not None or os.path.commonpath([real, real_dir]) != real_dir:
                raise _Out(folder, why or f"is a symbolic link to {quote_name(real)}, outside the folder "
                                          f"{quote_name(self.directory)} (ckptmerge reads only files inside the "
                                          "folder it is given)")
        try:
            c = RunCheckpoint(folder, step, KIND_FOLDER, newest=os.stat(folder).st_mtime)
        except FileNotFoundError:
            raise _Gone() from None
        real_dir = self._real_dir()
        parent, name = os.path.split(folder)
        top = os.path.join(real_dir, name) if parent == self.directory and not os.path.islink(folder) \
            else os.path.realpath(folder)
        seen = {top}
        # (folder, its real path, its path relative to the step folder): a folder that is no link
        # has its parent's real path and its name, so only links need realpath (1,000 steps list fast)
        stack = [(folder, top, "")]
        rel: List[str] = []
        while stack:
            here, real_here, under = stack.pop()
            try:
                with os.scandir(here) as it:
                    below = sorted((e for e in it if _kept(e.name)), key=lambda e: e.name)
            except FileNotFoundError:
                raise _Gone() from None
            for e in below:
                link = e.is_symlink()
                if link:
                    real = os.path.realpath(e.path)
                    if os.path.commonpath([real, real_dir]) != real_dir:
                        raise _Out(e.path, f"is a symbolic link to {quote_name(real)}, outside the folder "
                                           f"{quote_name(self.directory)} (ckptmerge reads only files inside the "
                                           "folder it is given)")
                try:
                    if e.is_dir():
                        real = os.path.realpath(e.path) if link else os.path.join(real_here, e.name)
                        if real not in seen:
                            seen.add(real)
                            stack.append((e.path, real, under + e.name + "/"))
                        continue
                    st = e.stat()
                except FileNotFoundError:
                    if link:
                        continue  # a dangling link: nothing there to read
                    raise _Gone() from None
                if not stat.S_ISREG(st.st_mode):
                    continue  # a FIFO or a socket below a folder is never read (readers refuse it)
                c.files[e.path] = sig_of(st)
                c.newest = max(c.newest, st.st_mtime)
                rel.append(under + e.name)
                if len(c.files) > MAX_FOLDER_FILES:
                    logger.warning("%s: more than %d files below %s: not a checkpoint of the run", self.out.given,
                                   MAX_FOLDER_FILES, folder)
                    c.files.clear()
                    return c
        c.format = folder_format(rel)
        c.time = c.newest
        return c

    def saved_model(self, found: Dict[str, Any]) -> None:
        if not {"saved_model.pb", "saved_model.pbtxt"}.intersection(found):
            return
        folder = os.path.join(self.directory, "variables")
        prefix = os.path.join(folder, "variables")
        c = RunCheckpoint(prefix, None, KIND_SAVED_MODEL, FORMAT_TF_BUNDLE)
        try:
            self.add_file(c, prefix + INDEX)
            for name in sorted(os.listdir(folder)):
                if name.startswith("variables.data-"):
                    self.add_file(c, os.path.join(folder, name))
        except (_Gone, OSError):
            return
        except _Out as x:
            self.out.unsafe.append(Unsafe(prefix, None, *x.args))
            return
        self.out.checkpoints.append(c)

    # -- the state file ---------------------------------------------------------------------------
    def state(self) -> Optional[CheckpointState]:
        """The state file (paths confined), and the checkpoints it names in folders below."""
        st = read_state(self.directory, self.out.given)
        if st is None:
            return None
        have = {c.path for c in self.out.checkpoints} | {u.path for u in self.out.unsafe}
        named = list(st.all_model_checkpoint_paths) + ([st.model_checkpoint_path] if st.model_checkpoint_path else [])
        for p in named:  # (normalised by the state file's reading)
            if p in have or os.path.dirname(p) == self.directory:
                continue  # one in the directory itself was found by the look (or is not there)
            have.add(p)
            c = self.named(p)
            if c is not None and self.wanted(c.step):
                self.out.checkpoints.append(c)
        return st

    def located(self, named: str) -> str:
        """The checkpoint of the run a state file path means (a V1 set named by its prefix)."""
        named = os.path.normpath(named)
        if any(c.path == named for c in self.out.checkpoints) or index_exists(named):
            return named
        return v1_format(named) or named

    def named(self, p: str) -> Optional[RunCheckpoint]:
        """A checkpoint the state file names in a folder below the directory, if it is there."""
        try:
            if index_exists(p):
                c = RunCheckpoint(p, step_of(p), KIND_BUNDLE, FORMAT_TF_BUNDLE)
                folder, base = os.path.split(p)
                self.add_file(c, p + INDEX)
                for name in sorted(os.listdir(folder)):
                    m = DATA_RE.search(name)
                    if m is not None and name[: m.start()] == base:
                        self.add_file(c, os.path.join(folder, name))
                return c
            kind = classify(os.path.basename(p), False)
            if kind is not None and kind[0] == KIND_FILE and os.path.isfile(p):
                c = RunCheckpoint(p, kind[1], KIND_FILE, kind[2])
                self.add_file(c, p)
                return c
            pattern = v1_format(p)
            if pattern is not None:
                return self.v1(pattern)
        except (_Gone, OSError):
            return None
        except _Out as x:
            self.out.unsafe.append(Unsafe(p, step_of(p), *x.args))
            return None
        logger.debug("state file lists %s but it does not exist", p)
        return None


def _shard_names(index: str) -> List[str]:
    """The shard file names a Keras sharded set's JSON names (none if it cannot be read: it is
    listed with its own size, and refused when opened)."""
    from ..formats.keras.shards import shard_files

    try:
        return shard_files(index)[1]
    except ResourceLimitError:  # out of open files or memory: not this file's fault, never skipped
        raise
    except CkptMergeError:
        return []


# -- by URL ------------------------------------------------------------------------------------------


def remote_sig(e: Dict[str, Any]) -> Sig:
    """A remote file's signature, shaped as a local one: ``(0, 0, size, modification time)``."""
    return (0, 0, int(e["size"]), e["mtime"] or 0.0)


class _Remote(_Look):
    """One look at a directory by URL (objects cannot be links: confinement is of state files)."""

    def run(self, with_state: bool, fresh: bool) -> Run:
        out, url = self.out, self.directory
        if fresh:
            storage.forget_listings(url)
        try:
            listed = storage.remote_listdir(url)
        except CheckpointNotFoundError:
            out.exists = False
            return out
        if len(listed) == 1 and listed[0]["type"] != "directory" and listed[0]["name"] == storage.basename(url):
            raise not_a_directory(out.given)
        by_name = {e["name"]: e for e in listed if not e["name"].startswith(".")}
        out.names = sorted(by_name)
        picked, data = self.entries(sorted(by_name), {n: e["type"] == "directory" for n, e in by_name.items()})
        for name, kind, step, fmt in picked:
            e, path = by_name[name], storage.join(url, name)
            if kind == KIND_V1:
                continue  # by URL, V1 checkpoints are found through the state file only
            if kind == KIND_BUNDLE:
                c = RunCheckpoint(storage.join(url, name[: -len(INDEX)]), step, kind, fmt)
                for f in [name, *data.get(name[: -len(INDEX)], [])]:
                    self.add(c, storage.join(url, f), by_name[f])
            elif kind == KIND_FILE:
                c = RunCheckpoint(path, step, kind, fmt)
                self.add(c, path, e)
                if name.endswith(KERAS_SHARDS):
                    for shard in _shard_names(path):
                        if shard in by_name:
                            self.add(c, storage.join(url, shard), by_name[shard])
            else:
                try:
                    c = self.folder(path, step)
                except CheckpointNotFoundError:
                    out.vanished.append((path, step))
                    continue
            (out.pending if kind == KIND_FOLDER and not c.format else out.checkpoints).append(c)
        orbax_item = METADATA_FILE in by_name or "manifest.ocdbt" in by_name  # ('checkpoint': its msgpack aggregate)
        state = read_state_url(url) if with_state and STATE_FILE in by_name and not orbax_item else None
        if not self.steps_only and "saved_model.pb" in by_name and "variables" in by_name:
            self.saved_model(url)
        return self.finish(state)

    def add(self, c: RunCheckpoint, path: str, e: Dict[str, Any]) -> None:
        c.files[path] = remote_sig(e)
        c.newest = max(c.newest, e["mtime"] or 0.0)
        if path == c.main_file:
            c.time = e["mtime"] or 0.0

    def folder(self, folder: str, step: Optional[int]) -> RunCheckpoint:
        c = RunCheckpoint(folder, step, KIND_FOLDER)
        rel: List[str] = []
        self._walk(folder, c, rel, "", 0)
        fmt = folder_format(rel)
        if fmt == FORMAT_ORBAX and folder.lower().startswith(ORBAX_COMMIT_SCHEMES) and COMMIT_FILE not in rel:
            fmt = ""  # Orbax writes commit_success.txt there when the step is finished: pending until then
        c.format, c.time = fmt, c.newest
        return c

    def _walk(self, folder: str, c: RunCheckpoint, rel: List[str], under: str, depth: int) -> None:
        for e in storage.remote_listdir(folder):
            if not _kept(e["name"]):
                continue
            path, name = storage.join(folder, e["name"]), under + e["name"]
            if e["type"] == "directory":
                if depth < _FOLDER_DEPTH:
                    self._walk(path, c, rel, name + "/", depth + 1)
                continue
            self.add(c, path, e)
            rel.append(name)
            if len(c.files) > MAX_FOLDER_FILES:
                return

    def saved_model(self, url: str) -> None:
        folder = storage.join(url, "variables")
        try:
            listed = {e["name"]: e for e in storage.remote_listdir(folder)}
        except CheckpointNotFoundError:
            return
        if "variables.index" not in listed:
            return
        c = RunCheckpoint(storage.join(folder, "variables"), None, KIND_SAVED_MODEL, FORMAT_TF_BUNDLE)
        for name, e in listed.items():
            if name == "variables.index" or name.startswith("variables.data-"):
                self.add(c, storage.join(folder, name), e)
        self.out.checkpoints.append(c)


def _locate_url(recorded: str, directory: str) -> Optional[str]:
    """A recorded checkpoint path as a URL inside ``directory``, or ``None`` when it points
    outside it: a relative path is relative to the state file's directory (``..`` that leaves it
    is outside); an absolute local path (written on another machine) is looked up by base name
    there, as TensorFlow's ``checkpoint`` files of a moved run need; a URL must lie below the
    directory."""
    import re

    from .runs import inside

    if storage.is_url(recorded):
        return recorded if inside(recorded, directory) else None
    path = recorded.replace("\\", "/")
    if path.startswith("/") or re.match(r"^[A-Za-z]:/", path):
        return storage.join(directory, storage.basename("file:///" + path.lstrip("/")))
    scheme, _, rest = storage.join(directory, path).partition("://")
    joined = scheme + "://" + posixpath.normpath(rest)
    return joined if inside(joined, directory) else None


def read_state_url(directory: str) -> Optional[CheckpointState]:
    """Parse a remote directory's ``checkpoint`` state file; ``None`` when there is none. Paths
    are URLs inside the directory; what points outside is set apart in ``outside`` (see
    :mod:`ckptmerge.sources.state`).

    Raises:
        CheckpointFormatError: the state file cannot be read or parsed.

    Example:
        >>> read_state_url("s3://bucket/run").model_checkpoint_path  # doctest: +SKIP
        's3://bucket/run/ckpt-200'
    """
    directory = storage.strip_slash(directory)
    url = storage.join(directory, STATE_FILE)
    if not storage.remote_exists(url):
        return None
    return state_from_text(storage.read_small(url, 1 << 24).decode("utf-8", "surrogateescape"), url, url, directory,
                           _locate_url)
