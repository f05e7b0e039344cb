"""The files at a checkpoint output prefix: what exists there, the publish lock, temp names.

Shared by the writers (:mod:`ckptmerge.formats.tf.writer`, :mod:`ckptmerge.formats.safetensors.writer`)
and the merge: which files of a checkpoint exist at a prefix, refusing to replace them without
being told to, the ``flock`` that serialises publishes to one prefix, how hidden temporary files
are named, and the messages for I/O errors while writing.
"""

from __future__ import annotations

import errno
import os
import stat
from typing import Any, List, Optional

import crc32c as _crc32c

from ckptmerge.core import limits
from ckptmerge.formats.io.interrupts import HeldInterrupts
from ckptmerge.core.errors import CheckpointWriteError, OutputExistsError, OutputLockedError
from ckptmerge.formats.tf.bundle import DATA_RE
from ckptmerge.core.redact import get_logger
from ckptmerge.core.text import quote_name

logger = get_logger(__name__)

TMP_MARK = ".ckptmerge-tmp-"
_LOCK_MARK = ".ckptmerge-lock"


# Temp files are named ".<base>.ckptmerge-tmp-<pid>-<host tag>-<random>.data-N" / ".index" (temp_name).
def _host_name() -> str:
    """This machine's name, without importing ``socket`` (start-up time matters for the CLI)."""
    if hasattr(os, "uname"):
        return os.uname().nodename
    return os.environ.get("COMPUTERNAME", "")  # pragma: no cover - Windows


def _pid_namespace() -> str:
    """This process-id namespace (its inode; the same across reboots for a machine's own, another
    for each container), or "" where that is unknown."""
    try:
        return str(os.stat("/proc/self/ns/pid").st_ino)
    except OSError:
        return ""


#: This machine and process-id namespace, as it names its temporary files: a writer judges only
#: temporary files with its own tag (a pid means nothing on another host or in another container).
HOST_TAG = f"{_crc32c.crc32c((_host_name() + '/' + _pid_namespace()).encode('utf-8', 'replace')):08x}"


def temp_name(abs_path: str, suffix: str = "") -> str:
    """A hidden temporary name beside ``abs_path``, unique to this process and call:
    ``.<name>.ckptmerge-tmp-<pid>-<host tag>-<random><suffix>`` (what :func:`remove_stale_temps`
    recognises).

    Example:
        >>> os.path.basename(temp_name("/out/model.safetensors")).startswith(".model.safetensors.ckptmerge-tmp-")
        True
    """
    directory, base = os.path.split(abs_path)
    return os.path.join(directory, f".{base}{TMP_MARK}{os.getpid()}-{HOST_TAG}-{os.urandom(4).hex()}{suffix}")


def remove_stale_temps(abs_path: str) -> List[str]:
    """Remove the temporary files (and folders) of the writers of ``abs_path`` that were killed:
    those named by :func:`temp_name` on this machine whose process is gone. Those of a writer
    that runs, or of another machine (whose pids mean nothing here), are left; a link is removed,
    never followed. Returns the names removed (each is logged).

    Example:
        >>> remove_stale_temps("/nowhere/model")
        []
    """
    import shutil
    import stat

    directory, base = os.path.split(abs_path)
    mark = f".{base}{TMP_MARK}"
    try:
        names = os.listdir(directory or ".")
    except OSError:
        return []
    removed = []
    for name in names:
        if not name.startswith(mark):
            continue
        parts = name[len(mark):].split("-", 2)
        if len(parts) < 3 or not parts[0].isdigit() or parts[1] != HOST_TAG or not process_gone(int(parts[0])):
            continue  # still running (or ourselves), or not ours to judge
        path = os.path.join(directory, name)
        try:
            if stat.S_ISDIR(os.lstat(path).st_mode):
                shutil.rmtree(path)
            else:
                os.remove(path)
        except OSError as e:
            logger.warning("could not remove the stale temporary file %s: %s", path, e)
            continue
        logger.info("removed the stale temporary file %s (its writer, process %s, was killed)", name, parts[0])
        removed.append(name)
    return removed


def process_gone(pid: int) -> bool:
    """Whether no process ``pid`` runs here any more (a zombie, killed but not yet reaped, is gone).

    Only meaningful for a pid recorded on this machine, in this process-id namespace (see
    :func:`machine_tag`); a pid that exists, even someone else's, is never judged gone.

    Example:
        >>> process_gone(os.getpid())
        False
    """
    if pid <= 0 or pid >= 1 << 31 or pid == os.getpid():
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except OSError:  # it exists, but is not ours to signal
        return False
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] == b"Z"
    except (OSError, IndexError):
        return False


def machine_tag() -> Optional[str]:
    """This boot of this machine and this process-id namespace, or ``None`` where that is unknown
    (not Linux): two processes see each other's pids only when their tags are equal, so a pid
    recorded with another tag (another machine, another container) is never judged.

    Example:
        >>> machine_tag() == machine_tag()
        True
    """
    try:
        with open("/proc/sys/kernel/random/boot_id", "rb") as f:
            boot = f.read().strip().decode("ascii", "replace")
        return f"{boot}/{os.stat('/proc/self/ns/pid').st_ino}"
    except OSError:
        return None


def io_message(e: OSError, path: str, action: str, prefix: str) -> str:
    reason = e.strerror or str(e)
    exhausted = limits.resource_error(e, path, doing=action)
    if exhausted is not None:  # too many files open: say so, and what to do
        return f"{exhausted} No checkpoint was written."
    if e.errno == errno.ENOSPC:
        fix = "Free some space on that disk, or write the checkpoint elsewhere."
    elif e.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        fix = (f"Check that you may write to the directory '{os.path.dirname(path) or '.'}', "
               "or choose another output prefix.")
    elif e.errno in (errno.EFBIG, errno.EDQUOT):
        fix = "The file or disk quota limit was reached; free space or raise the limit."
    else:
        fix = "Check the disk and the output directory, then try again."
    return (f"Cannot {action} {quote_name(path)} of checkpoint {quote_name(prefix)}: {reason}. {fix} "
            "No checkpoint was written.")


def existing_checkpoint_files(abs_prefix: str) -> List[str]:
    """The files of a checkpoint at ``abs_prefix`` that exist: its index (a dangling link
    counts) and its data shards.

    Example:
        >>> existing_checkpoint_files("/nowhere/model")
        []
    """
    directory, base = os.path.split(abs_prefix)
    found = [abs_prefix + ".index"] if os.path.lexists(abs_prefix + ".index") else []
    try:
        names = sorted(os.listdir(directory))
    except OSError:
        names = []
    return found + [os.path.join(directory, n) for n in names
                    if n.startswith(base) and DATA_RE.fullmatch(n[len(base):])]


def check_no_output(abs_prefix: str, prefix: str, how_to_replace: str = "pass overwrite=True") -> None:
    """Raise :class:`OutputExistsError` when any file of a checkpoint exists at ``abs_prefix``.

    Looks under the prefix's publish lock (waiting while a writer publishes there), so a publish
    in progress is never mistaken for anything but what it becomes. Data files without an index
    are named as what they are: not a readable checkpoint, but the leftover of an interrupted
    write, with how to get rid of them.

    Args:
        abs_prefix: the absolute output prefix.
        prefix: the prefix as the user gave it (shown in the message).
        how_to_replace: the words that tell the caller's user how to replace it.

    Example:
        >>> check_no_output("/nowhere/model", "model")
    """
    directory, base = os.path.split(abs_prefix)
    if not os.path.isdir(directory):
        return
    with OutputLock(directory, base, prefix, required=False):
        refuse_existing(abs_prefix, prefix, how_to_replace)


def refuse_existing(abs_prefix: str, prefix: str, how_to_replace: str) -> None:
    """:func:`check_no_output` for a caller that holds the publish lock."""
    found = existing_checkpoint_files(abs_prefix)
    if not found:
        return
    shown = [os.path.join(os.path.dirname(prefix), os.path.basename(p)) for p in found]
    raise existing_output_error(shown, prefix, how_to_replace)


def existing_output_error(found: List[str], prefix: str, how_to_replace: str, *, kind: str = "file") -> OutputExistsError:
    """The error for the files (or objects: ``kind="object"``) of a checkpoint found at an output
    prefix, index first if there is one: a checkpoint exists, or data without an index is left over.

    Example:
        >>> print(existing_output_error(["m.data-00000-of-00001"], "m", "pass overwrite=True"))  # doctest: +ELLIPSIS
        The output prefix 'm' has data files but no index ('m.data-00000-of-00001'): they are not ...
    """
    more = f" and {len(found) - 1} more {kind}(s)" if len(found) > 1 else ""
    if found[0].endswith(".index"):
        return OutputExistsError(
            f"A checkpoint already exists at {quote_name(prefix)} ({quote_name(found[0])}{more}). Choose "
            f"another output prefix, or {how_to_replace} to replace it.", path=found[0])
    listed = ", ".join(map(quote_name, found[:3])) + (f" and {len(found) - 3} more" if len(found) > 3 else "")
    return OutputExistsError(
        f"The output prefix {quote_name(prefix)} has data {kind}s but no index ({listed}): they are not a "
        "readable checkpoint, most likely the leftover of a write that was killed. Delete them, choose another "
        f"output prefix, or {how_to_replace} to replace them.", path=found[0])


def shard_count(path: str) -> int:
    """The ``N`` of a ``.data-NNNNN-of-N`` file name (one :func:`existing_checkpoint_files` lists)."""
    m = DATA_RE.search(path)
    assert m is not None
    return int(m.group(2))


class OutputLock:
    """An exclusive ``flock`` on ``.<base>.ckptmerge-lock`` beside a checkpoint prefix.

    It serialises publishes to one prefix across processes (and across writers in one process:
    each holds its own open file). The lock file is removed on release while still locked; a
    waiter that then gets a lock on the removed file notices (the path names another inode, or
    none) and locks again, so two holders never coexist. A killed holder's lock is released by the
    kernel; the file it leaves is reused. With ``required=False`` a lock file that cannot be
    created (a read-only directory: no writer can publish there either) means no lock.

    A lock file is always empty: anything else at its path (content, a symbolic link, a FIFO, a
    device, a folder, a file with other hard links) was not made by a writer, so it is reported
    (:class:`~ckptmerge.core.errors.OutputLockedError`, naming it and how to remove it), never
    used, overwritten or removed.
    """

    def __init__(self, directory: str, base: str, prefix: str, *, required: bool = True) -> None:
        self.path = os.path.join(directory, f".{base}{_LOCK_MARK}")
        self.prefix = prefix
        self.required = required
        self.fd: Optional[int] = None

    def __enter__(self) -> "OutputLock":
        try:
            import fcntl
        except ImportError:  # pragma: no cover - Windows: no flock; publishes are not serialised
            return self
        while True:
            # Ctrl-C is held back wherever the lock could be taken and not recorded (or the file
            # made and not removed); only the wait for another holder stays interruptible.
            with HeldInterrupts() as held:
                fd = self._open()
                if fd is None:
                    return self
                got = self._try(fcntl, fd)
                if got and self._settle(fd, held):
                    return self
                if not got and held.pending:
                    os.close(fd)  # (the interrupt is delivered as the block ends)
            if got:
                continue  # the file was replaced under us: lock the current one
            try:
                logger.info("waiting for another writer of %s to finish moving it into place", self.prefix)
                fcntl.flock(fd, fcntl.LOCK_EX)
            except BaseException:  # Ctrl-C while waiting: leave no lock file of ours behind
                with HeldInterrupts():
                    self._abandon(fcntl, fd)
                raise
            with HeldInterrupts() as held:
                if self._settle(fd, held):
                    return self

    def _open(self) -> Optional[int]:
        """Open (or create) the lock file; refuse anything at its path that no writer made."""
        flags = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)
        try:
            fd = os.open(self.path, flags, 0o644)
        except OSError as e:
            if e.errno == errno.ELOOP:
                raise self._untrusted("it is a symbolic link") from None
            if e.errno == errno.EISDIR:
                raise self._untrusted("it is a folder") from None
            if not self.required:
                return None
            raise CheckpointWriteError(io_message(e, self.path, "create the lock file", self.prefix),
                                       path=self.path, errno_=e.errno) from e
        try:
            st = os.fstat(fd)
            why = ("it is not a regular file (a FIFO, a device or a socket)" if not stat.S_ISREG(st.st_mode) else
                   f"it holds {st.st_size} bytes (a lock file is empty)" if st.st_size else
                   f"it has {st.st_nlink} hard links (it is another file too)" if st.st_nlink > 1 else None)
        except BaseException:
            os.close(fd)
            raise
        if why is not None:
            os.close(fd)
            raise self._untrusted(why)
        return fd

    def _untrusted(self, why: str) -> OutputLockedError:
        shown = os.path.join(os.path.dirname(self.prefix), os.path.basename(self.path))
        return OutputLockedError(
            f"The lock file {quote_name(shown)} of the output {quote_name(self.prefix)} cannot be trusted: {why}. "
            "ckptmerge never makes such a lock file, so it is left as it is and nothing is written. If you are "
            f"sure nothing else writes to {quote_name(self.prefix)}, delete {quote_name(shown)} and try again.",
            path=self.path)

    @staticmethod
    def _try(fcntl: Any, fd: int) -> bool:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        except BaseException:
            os.close(fd)
            raise
        return True

    def _names(self, fd: int) -> bool:
        """Whether the lock path still names the file ``fd`` holds."""
        st = os.fstat(fd)
        try:
            now = os.stat(self.path)
        except FileNotFoundError:
            return False
        return (now.st_dev, now.st_ino) == (st.st_dev, st.st_ino)

    def _settle(self, fd: int, held: HeldInterrupts) -> bool:
        """With the flock on ``fd`` taken: keep it if the path still names it (True), else close
        it (False, lock again). A Ctrl-C that arrived meanwhile releases it at once."""
        try:
            mine = self._names(fd)
        except BaseException:
            os.close(fd)
            raise
        if not mine:
            os.close(fd)  # the holder we waited for removed this file: lock the current one
            return False
        self.fd = fd
        if held.pending:  # interrupted while taking it: release it before the interrupt is delivered
            self._release()
        return True

    def _abandon(self, fcntl: Any, fd: int) -> None:
        """Give up ``fd`` after an interrupt: if the flock is (now) ours, remove the file as a release does."""
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            if self._names(fd):
                remove_quietly(self.path)
        except OSError:
            pass  # another writer holds it: its file is not ours to remove
        finally:
            os.close(fd)

    def _release(self) -> None:
        fd, self.fd = self.fd, None
        if fd is not None:
            remove_quietly(self.path)  # while still locked (see the class docstring)
            os.close(fd)

    def __exit__(self, *exc: Any) -> None:
        with HeldInterrupts():  # a Ctrl-C here must not leave the file behind
            self._release()


def remove_quietly(path: str) -> None:
    try:
        os.remove(path)
    except FileNotFoundError:
        pass
    except OSError as e:
        logger.warning("could not remove %s: %s", path, e)
