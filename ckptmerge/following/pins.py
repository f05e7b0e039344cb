"""Pins: keep a checkpoint readable while a trainer's cleanup deletes it, without copying it.

A trainer keeping ``max_to_keep`` checkpoints deletes the oldest as it writes a new one, often
while an evaluator is still reading it (TF #39033). A :class:`Pin` holds a checkpoint's files:

- on a local file system, by **hard links** in a private folder on the same device (the system
  temporary directory when it is on that device, else a hidden ``.ckptmerge-pins-*`` folder
  beside the checkpoint). A link is a second name of the same bytes, so deleting the trainer's
  name frees nothing until the pin is released; nothing is copied. Each link is checked to name
  the very file (device, inode, size, modification time) that was found complete;
- where links are impossible (a file system without them, no writable folder on the device), by
  **reading the bytes** into memory (an fsspec ``memory://`` folder the readers read like any
  URL), done only for the checkpoint about to be read;
- on object storage nothing can hold an object: the pin is the bytes a restore has already
  read (a restore reads every tensor before it assigns any), and a read that finds an object
  gone fails with an error naming the checkpoint.

:class:`PinFolders` makes and removes the private folders (at :meth:`PinFolders.close`, at
interpreter exit, and, for folders of this host's processes that died, when a new one is made).
Nothing here imports TensorFlow.
"""

from __future__ import annotations

import atexit
import errno
import itertools
import os
import shutil
import socket
import tempfile
import threading
import uuid
import weakref
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple

from ..core import limits
from ..core.errors import CheckpointNotFoundError
from ..core.redact import get_logger
from ..core.text import quote_name

__all__ = ["Pin", "PinFolders", "FileSig", "file_sig", "pin_of", "PIN_PREFIX", "LinksImpossible", "FilesChanged"]

logger = get_logger(__name__)

#: Name prefix of the private pin folders (hidden; watchers never list them).
PIN_PREFIX = ".ckptmerge-pins-"

#: ``(device, inode, size, modification time in ns)`` of a file: what a pin must keep naming.
FileSig = Tuple[int, int, int, int]

# Errors of os.link that say "no links here" (rather than "the file is gone").
_NO_LINKS = {getattr(errno, n) for n in ("EXDEV", "EPERM", "EACCES", "ENOTSUP", "EOPNOTSUPP", "EMLINK",
                                          "EROFS", "ENOSYS", "ENOSPC", "EDQUOT") if hasattr(errno, n)}


class LinksImpossible(Exception):
    """Hard links cannot be made for this checkpoint (the caller reads its bytes instead)."""


class FilesChanged(Exception):
    """A file of the checkpoint changed since it was listed (still being written): look again."""


def file_sig(path: str) -> FileSig:
    """The :data:`FileSig` of a local file (``OSError`` if it is gone).

    Example:
        >>> file_sig("setup.py")[2] > 0  # doctest: +SKIP
        True
    """
    st = os.stat(path)
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


@dataclass
class Pin:
    """One checkpoint held for reading.

    Attributes:
        path: the checkpoint as the trainer wrote it (prefix, file or step folder).
        read_path: where to read it while the pin is held: the same name inside the pin
            folder (links), a ``memory://`` URL (bytes), or ``path`` itself (object storage).
        how: ``"link"``, ``"memory"`` or ``"none"``.
        files: ``{original file: (pinned file, signature when pinned)}``.
    """

    path: str
    read_path: str
    how: str
    files: Dict[str, Tuple[str, Optional[FileSig]]] = field(default_factory=dict)
    _root: Optional[str] = None
    released: bool = False

    def __post_init__(self) -> None:
        if self.how != "none":
            _BY_READ_PATH[self.read_path] = self

    def missing(self) -> List[str]:
        """The original names of pinned files that are gone or changed since they were pinned
        (empty while the pin holds; always empty for object storage, whose pin is the bytes read).

        Example:
            >>> pin.missing()   # doctest: +SKIP
            []
        """
        if self.how == "memory":
            from ..formats.io.storage import remote_exists

            return [orig for orig, (pinned, _) in self.files.items() if not remote_exists(pinned)]
        out = []
        for orig, (pinned, sig) in self.files.items():
            try:
                now = file_sig(pinned)
            except OSError:
                out.append(orig)
                continue
            if sig is not None and now[1:] != sig[1:]:
                out.append(orig)
        return sorted(out)

    def release(self) -> None:
        """Drop the pin: remove its links or its bytes (the trainer's files are never touched)."""
        if self.released:
            return
        self.released = True
        if self.how == "link" and self._root is not None:
            shutil.rmtree(self._root, ignore_errors=True)
        elif self.how == "memory" and self._root is not None:
            try:
                import fsspec

                fsspec.filesystem("memory").rm(self._root, recursive=True)
            except (ImportError, OSError, ValueError):  # pragma: no cover - already gone
                pass


_BY_READ_PATH: "weakref.WeakValueDictionary[str, Pin]" = weakref.WeakValueDictionary()


def pin_of(read_path: str) -> Optional[Pin]:
    """The pin held at ``read_path`` (a ``CheckpointInfo.pinned``), if it is still held.

    Example:
        >>> pin_of("/nowhere") is None
        True
    """
    pin = _BY_READ_PATH.get(read_path)
    return pin if pin is not None and not pin.released else None


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # another user's process: alive
        return True
    return True


class PinFolders:
    """The private folders one watcher pins into: one per device, made when first needed.

    Example:
        >>> folders = PinFolders(near="runs/A")              # doctest: +SKIP
        >>> pin = folders.link("runs/A/ckpt-10", files)      # doctest: +SKIP
        >>> pin.release(); folders.close()                   # doctest: +SKIP
    """

    def __init__(self, near: str) -> None:
        self.near = os.path.abspath(near)
        self._roots: Dict[int, Optional[str]] = {}  # device -> folder (None: links impossible there)
        self._lock = threading.Lock()
        self._count = itertools.count()
        self._tag = f"{_host()}-{os.getpid()}-"
        _LIVE.add(self)

    # -- folders ---------------------------------------------------------------------------------
    def _root_for(self, dev: int, beside: str) -> Optional[str]:
        with self._lock:
            if dev in self._roots:
                return self._roots[dev]
            root = None
            for base in (tempfile.gettempdir(), self.near, beside):
                try:
                    if os.stat(base).st_dev != dev:
                        continue
                    _remove_dead(base)
                    root = tempfile.mkdtemp(prefix=PIN_PREFIX + self._tag, dir=base)
                    break
                except OSError:
                    continue
            self._roots[dev] = root
            if root is None:
                logger.info("no writable folder on the device of %s for hard links; pinned checkpoints "
                            "there are read into memory", beside)
            return root

    def link(self, path: str, files: Dict[str, FileSig], base: str) -> Pin:
        """Pin the checkpoint ``path`` by hard links to ``files`` (``{file: signature found}``),
        keeping their names relative to ``base`` (the directory holding the checkpoint).

        Raises:
            LinksImpossible: no links on this device (read the bytes with :meth:`read_bytes`).
            CheckpointNotFoundError: a file is gone (the checkpoint was deleted before it could
                be pinned).
            FilesChanged: a file is no longer the one listed (written to, or replaced, since).
        """
        if not files:
            raise ValueError(f"nothing to pin for {path!r}: it lists no files")
        first = next(iter(files))
        dev = files[first][0]
        root = self._root_for(dev, base)
        if root is None:
            raise LinksImpossible(path)
        folder = os.path.join(root, str(next(self._count)))
        pin = Pin(path, os.path.join(folder, os.path.relpath(path, base)), "link", _root=folder)
        try:
            for src, sig in files.items():
                dst = os.path.join(folder, os.path.relpath(src, base))
                os.makedirs(os.path.dirname(dst), exist_ok=True)
                try:
                    os.link(src, dst, follow_symlinks=True)
                except FileNotFoundError:
                    raise _gone(path, src) from None
                except OSError as e:
                    if e.errno in _NO_LINKS:
                        raise LinksImpossible(path) from None
                    raise
                now = file_sig(dst)
                if now != sig:  # the name points to another file now, or it changed since it was listed
                    raise FilesChanged(src)
                pin.files[src] = (dst, now)
        except BaseException:
            pin.release()
            raise
        return pin

    def read_bytes(self, path: str, files: Dict[str, FileSig], base: str) -> Pin:
        """Pin ``path`` by reading its files into memory (where links are impossible); every file
        is opened before any is read, and each must still be the file that was checked.

        Raises:
            CheckpointNotFoundError: a file is gone or changed before it could be read.
        """
        try:
            import fsspec
        except ImportError:
            logger.warning("cannot pin %s: hard links are impossible there and fsspec (for the "
                           "in-memory copy) is not installed; a deletion while it is read fails that read",
                           path)
            return Pin(path, path, "none")
        folder = f"memory://ckptmerge-pins/{uuid.uuid4().hex}"
        mem = fsspec.filesystem("memory")
        pin = Pin(path, f"{folder}/{os.path.relpath(path, base).replace(os.sep, '/')}", "memory", _root=folder)
        opened = []
        try:
            for src, sig in files.items():
                try:
                    with limits.checked(src):
                        f = open(src, "rb")
                except FileNotFoundError:
                    raise _gone(path, src) from None
                opened.append((src, sig, f))
            for src, sig, f in opened:
                st = os.fstat(f.fileno())
                if (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns) != sig:
                    raise _gone(path, src, changed=True)
                dst = f"{folder}/{os.path.relpath(src, base).replace(os.sep, '/')}"
                mem.pipe_file(dst, f.read())
                pin.files[src] = (dst, None)
        except BaseException:
            pin.release()
            raise
        finally:
            for _, _, f in opened:
                f.close()
        return pin

    def close(self) -> None:
        """Remove every pin folder this object made (pins still held are released with them)."""
        with self._lock:
            roots, self._roots = [r for r in self._roots.values() if r], {}
        for r in roots:
            shutil.rmtree(r, ignore_errors=True)
        _LIVE.discard(self)


def _gone(path: str, file: str, *, changed: bool = False) -> CheckpointNotFoundError:
    what = "was replaced or changed" if changed else "was deleted"
    return CheckpointNotFoundError(
        f"Checkpoint {quote_name(path)} {what} before it could be pinned for reading "
        f"({quote_name(os.path.basename(file))}); a trainer's cleanup (max_to_keep) removes old "
        "checkpoints. Poll more often (poll=...) or keep more checkpoints to read every one.", path=path)


def _host() -> str:
    name = socket.gethostname() or "host"
    return "".join(c if c.isalnum() else "_" for c in name)[:40]


def _remove_dead(base: str) -> None:
    """Remove pin folders in ``base`` left by processes of this host that no longer run."""
    prefix = PIN_PREFIX + _host() + "-"
    try:
        names = os.listdir(base)
    except OSError:
        return
    for name in names:
        if not name.startswith(prefix):
            continue
        pid = name[len(prefix):].split("-", 1)[0]
        if pid.isdigit() and int(pid) != os.getpid() and not _pid_alive(int(pid)):
            logger.info("removing the pin folder %s of process %s, which ended", name, pid)
            shutil.rmtree(os.path.join(base, name), ignore_errors=True)


_LIVE: "weakref.WeakSet[PinFolders]" = weakref.WeakSet()


@atexit.register
def _close_all() -> None:  # a watcher never closed (its generator dropped): no folder outlives us
    for folders in list(_LIVE):
        folders.close()
