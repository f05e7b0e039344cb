"""Reading small local files the user names (config files, vocabularies) without surprises.

A path is untrusted: it may be a FIFO (reading blocks forever), a device such as ``/dev/zero``
(reading never ends), a directory or a symbolic link to any of them. :func:`read_regular_file`
looks at what the path is before opening it, opens it without blocking, checks again on the open
file (the path may have changed in between) and reads at most a given number of bytes.
"""

from __future__ import annotations

import os
import stat
from typing import Optional, Union

from ...core import limits
from ...core.errors import CkptMergeError
from ...core.text import human_bytes, quote_name

__all__ = ["NotARegularFileError", "read_regular_file", "describe_kind", "open_regular", "link_problem", "regular_size"]

_KINDS = (
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISFIFO, "a FIFO (named pipe)"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)


class NotARegularFileError(CkptMergeError, OSError):
    """A path that should be a regular file is something else, is too large, or cannot be read.

    Attributes:
        path: the path as given.
        reason: what the path is, completing the sentence ``"<path> <reason>"``, e.g.
            ``"is a FIFO (named pipe), not a regular file"``.
        is_directory: whether the path is (or links to) a directory.
    """

    def __init__(self, path: str, reason: str, *, is_directory: bool = False) -> None:
        super().__init__(f"{quote_name(path)} {reason}.")
        self.path = path
        self.reason = reason
        self.is_directory = is_directory

    def __str__(self) -> str:  # OSError would otherwise format errno/filename
        return str(self.args[0]) if self.args else ""


def describe_kind(mode: int) -> str:
    """What a file of this ``st_mode`` is, with an article: ``"a directory"``, ``"a socket"``.

    Example:
        >>> import stat
        >>> describe_kind(stat.S_IFIFO | 0o644)
        'a FIFO (named pipe)'
    """
    for test, kind in _KINDS:
        if test(mode):
            return kind
    return "a regular file" if stat.S_ISREG(mode) else "a special file"


#: Read-only, and never waiting: O_NONBLOCK makes the open of a FIFO return at once (to be
#: refused by fstat) instead of waiting for a writer; it changes nothing for regular files.
_READ_FLAGS = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_BINARY", 0)


def _require_regular(path: str, st: os.stat_result) -> None:
    if stat.S_ISREG(st.st_mode):
        return
    kind = describe_kind(st.st_mode)
    is_dir = stat.S_ISDIR(st.st_mode)
    if os.path.islink(path):
        what = f"is a symbolic link to '{os.path.realpath(path)}', which is {kind}, not a regular file"
    else:
        what = f"is {kind}" if is_dir else f"is {kind}, not a regular file"
    raise NotARegularFileError(path, what, is_directory=is_dir)


def _too_large(path: str, size: str, limit: int) -> NotARegularFileError:
    return NotARegularFileError(path, f"is {size}, larger than the {human_bytes(limit)} "
                                      f"({limit:,} bytes) accepted for this kind of file")


def read_regular_file(path: Union[str, "os.PathLike[str]"], *, limit: Optional[int] = None) -> bytes:
    """The bytes of a regular file, refusing anything else and anything larger than ``limit``.

    Symbolic links are followed, but what they point to must be a regular file too. FIFOs are
    never opened in a blocking way, and nothing is read from devices.

    Args:
        path: the file.
        limit: the largest size accepted, in bytes (``None``: no limit).

    Returns:
        The file's content.

    Raises:
        FileNotFoundError: nothing exists at ``path`` (and it is not a dangling link).
        NotARegularFileError: ``path`` is a directory, FIFO, device, socket or a dangling link,
            is larger than ``limit``, or cannot be read (``e.reason`` says which).

    Example:
        >>> import tempfile, os
        >>> p = os.path.join(tempfile.mkdtemp(), "a.txt")
        >>> _ = open(p, "w").write("hi")
        >>> read_regular_file(p, limit=16)
        b'hi'
    """
    path = os.fspath(path)
    try:
        st = os.stat(path)
    except FileNotFoundError:
        if os.path.islink(path):
            raise NotARegularFileError(
                path, f"is a symbolic link to '{os.readlink(path)}', which does not exist") from None
        raise
    except OSError as e:
        limits.check(e, path, doing="read")
        raise NotARegularFileError(path, f"cannot be read: {e.strerror or e}") from None
    _require_regular(path, st)
    if limit is not None and st.st_size > limit:
        raise _too_large(path, f"{st.st_size:,} bytes", limit)
    # (if the path was swapped for a FIFO since the stat above, the open must not wait: _READ_FLAGS)
    try:
        fd = os.open(path, _READ_FLAGS)
    except OSError as e:
        limits.check(e, path)
        raise NotARegularFileError(path, f"cannot be read: {e.strerror or e}") from None
    try:
        _require_regular(path, os.fstat(fd))
        want = (limit + 1) if limit is not None else None
        chunks = []
        got = 0
        while want is None or got < want:
            chunk = os.read(fd, 1 << 20 if want is None else min(1 << 20, want - got))
            if not chunk:
                break
            chunks.append(chunk)
            got += len(chunk)
    finally:
        os.close(fd)
    if limit is not None and got > limit:  # the file grew after the stat
        raise _too_large(path, f"more than {limit:,} bytes", limit)
    return b"".join(chunks)


def open_regular(path: str) -> int:
    """A read-only descriptor of the regular file ``path``: a FIFO (which would block the open
    until a writer comes), a device (``/dev/zero`` never ends) or a socket is refused, whatever
    led to the path (a prefix, an index, a folder, a ``file://`` URL).

    Raises:
        NotARegularFileError: (an ``OSError``) the path is not a regular file.
        OSError: it cannot be opened.
        ResourceLimitError: (not an ``OSError``) the process or the machine has too many files open.
    """
    with limits.checked(path):
        fd = os.open(path, _READ_FLAGS)  # (O_NONBLOCK: a FIFO's open returns at once, to be refused below)
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise NotARegularFileError(path, f"is {describe_kind(mode)}, not a regular file")
        if hasattr(os, "set_blocking"):
            os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd


def regular_size(path: str) -> int:
    """The size of the regular file ``path`` (links followed), from ``stat`` alone: nothing is opened.

    Raises:
        NotARegularFileError: it is a FIFO, a device, a socket or a directory.
        FileNotFoundError: it does not exist.
    """
    st = os.stat(path)
    if not stat.S_ISREG(st.st_mode):
        raise NotARegularFileError(path, f"is {describe_kind(st.st_mode)}, not a regular file")
    return st.st_size


def _within(path: str, folder: str) -> bool:
    return os.path.commonpath([path, folder]) == folder


def _hub_blobs(folder: str) -> Optional[str]:
    """The ``blobs`` folder of a Hugging Face hub cache snapshot (``<repo>/snapshots/<rev>``),
    where its files' symbolic links point; ``None`` for any other folder."""
    parent = os.path.dirname(folder)
    if os.path.basename(parent) != "snapshots":
        return None
    blobs = os.path.join(os.path.dirname(parent), "blobs")
    return blobs if os.path.isdir(blobs) else None


def link_problem(folder: str, path: str) -> Optional[str]:
    """Why ``path``, a file that a folder or an index in ``folder`` leads to (not one the user
    named), may not be read: ``None`` when it may.

    It must be a regular file, and a symbolic link must stay inside ``folder``: a link out of it
    (``model-00001.safetensors -> /home/me/.ssh/id_rsa``) would read what nobody named. The one
    exception is the layout of the Hugging Face hub cache, whose snapshot files link into the
    same cached repository's ``blobs`` folder.

    Returns:
        The reason, completing ``"<path> <reason>"`` (``"is a symbolic link to '/etc/passwd',
        outside the folder '/data/run'"``, ``"is a FIFO (named pipe), not a regular file"``), or
        ``None``; also ``None`` when nothing is at ``path`` (the caller says it is missing).

    Example:
        >>> import tempfile, os
        >>> d = tempfile.mkdtemp(); os.symlink("/etc/hostname", os.path.join(d, "x"))
        >>> link_problem(d, os.path.join(d, "x"))[:40]
        "is a symbolic link to '/etc/hostname', o"
    """
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return None
    except OSError as e:
        return f"cannot be read: {e.strerror or e}"
    if stat.S_ISLNK(st.st_mode):
        real_folder, target = os.path.realpath(folder), os.path.realpath(path)
        blobs = _hub_blobs(real_folder)
        if not (_within(target, real_folder) or (blobs is not None and _within(target, os.path.realpath(blobs)))):
            return (f"is a symbolic link to {quote_name(target)}, outside the folder {quote_name(folder)} "
                    "(ckptmerge reads only files inside the folder it is given)")
        try:
            st = os.stat(path)
        except OSError:
            return f"is a symbolic link to {quote_name(os.readlink(path))}, which does not exist"
    if not stat.S_ISREG(st.st_mode):
        return f"is {describe_kind(st.st_mode)}, not a regular file"
    return None
