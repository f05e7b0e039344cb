"""Merge outputs in object storage: ``cm.merge(sources, "s3://bucket/run/merged")``.

The merge itself runs exactly as for a local output, into a private temporary folder (so every
check, the plan, streaming and checksums are the same code). The files are then uploaded through
fsspec (``s3fs`` and friends upload large files as multipart uploads, streamed from disk, in
bounded memory, which the store shows only once complete).

**The prefix always reads as one whole checkpoint, the old one or the new one.** A TF
checkpoint's index names no data object: the prefix and the shard count in its header do. So the
new data objects take names no object at the prefix has (the natural shard count, else one more
with an empty trailing shard: ``merged.data-00000-of-00002`` beside an old
``merged.data-00000-of-00001``), they are uploaded while the old index still reads the old data,
then one PUT of the index switches readers from old to new, and only then are the old data
objects removed. A failure or Ctrl-C before that PUT removes the objects this merge uploaded (the
old checkpoint is untouched); a PUT whose answer was lost is read back to tell whether it landed.
Nothing is deleted before the new checkpoint is complete. A single-file output (``.safetensors``,
``.weights.h5``) is one object, replaced by one upload. With ``update_state`` the directory's
``checkpoint`` state file is written last, after the index (earlier entries kept, as for a local
output). Ctrl-C is held back while a single request is in flight (an upload, the lock), so no
request lands after the merge has cleaned up: it takes effect between requests; from the index
PUT on, through the deletes of the replaced data objects and the state file, it waits until all
are done (an interrupt just after the switch would leave the old data beside the new).

A merge that is killed outright (SIGKILL, a lost machine) leaves at most data objects that no
index names, and its lock: the next merge with ``overwrite`` removes such objects (without it,
it refuses and names them, as for a local prefix).

Two merges to one output are kept apart by a lock object, ``<prefix>.lock``, created with the
store's atomic create-if-absent (S3: a conditional PUT, ``If-None-Match: *``) once the inputs are
resolved and checked, before anything is read or written, and deleted when the merge ends,
however it ends. A second merge finds it and fails at once, naming the holder (host, process,
start time). A lock whose holder provably no longer runs (recorded on this machine, in this
process-id namespace, by a process that is gone) is removed by the next merge, which says so;
any other lock is never broken automatically (object stores have no compare-and-delete, so two
merges on different machines that both judged a lock stale could both proceed): the error shows
its age, and the user deletes it once that merge is known to be gone. Only a lock that is exactly
what a merge writes is judged at all (:func:`parse_lock`): a forged or damaged one (not JSON, a
field missing or of the wrong type, a start time that is ``NaN``, ``1e300`` or negative, a pid
that is not one, another output's, too large) is reported as one that cannot be trusted, naming
it and how to remove it, and left as it is.

A ``file://`` output never comes here: it is a local path (:mod:`ckptmerge.merging.dispatch`).
Nothing here imports TensorFlow.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
import shutil
import socket
import stat
import tempfile
import time
from typing import Any, Callable, List, Optional, Sequence, Tuple

from ..core.errors import (
    CheckpointNotFoundError,
    CheckpointWriteError,
    OutputExistsError,
    OutputLockedError,
)
from ..formats.io.interrupts import HeldInterrupts
from ..formats.io.output_prefix import (
    existing_output_error,
    machine_tag,
    process_gone,
    shard_count,
)
from ..formats.io.storage import (
    create_exclusive,
    forget_listings,
    read_small,
    remote_exists,
    remote_size,
    remote_listdir,
    remove_object,
    upload_file,
    write_object,
)
from ..formats.io.urlpath import add_suffix, basename, dirname, has_suffix, sibling
from ..formats.tf.entries import pad_shards
from ..core.knobs import FlagSetting
from ..core.redact import get_logger
from ..sources.files import DATA_RE, INDEX, refuse_overwriting_inputs
from ..sources.state import state_file_text
from ..core.text import escape_name, quote_name

__all__ = ["merge_to_url", "parse_lock", "UntrustedLock"]

logger = get_logger(__name__)

_TEMP_PREFIX = "ckptmerge-upload-"
_REPLACE_HINT = "pass overwrite=True (ckptmerge merge --force)"


def _remote_checkpoint_objects(url: str) -> List[str]:
    """The index and data objects of a checkpoint at ``url`` (a prefix) that exist, index first."""
    parent, base = dirname(url), basename(url)
    try:
        names = sorted(e["name"] for e in remote_listdir(parent))
    except CheckpointNotFoundError:  # no such "directory": nothing there (any other failure stops the merge:
        return []                    # data names chosen without knowing what is there could be the live ones)
    index = [sibling(url, n) for n in names if n == base + INDEX]
    return index + [sibling(url, n) for n in names if n.startswith(base) and DATA_RE.fullmatch(n[len(base):])]


#: Whether remote merges take the lock object (``CKPTMERGE_REMOTE_LOCK=0``: keep writers apart yourself).
LOCK = FlagSetting("CKPTMERGE_REMOTE_LOCK", True, "whether a remote merge takes its output's lock object")


def _field(value: Any) -> str:
    """A lock object's field for the message: anyone can write the object, so any JSON may be
    there (a list, a 10 MB string, control characters): quoted, escaped and cut short."""
    text = value if isinstance(value, str) else json.dumps(value)
    text = text if len(text) <= 80 else text[:77] + "..."
    return quote_name(text) if isinstance(value, str) else escape_name(text)


def _lock_age(started: Any) -> str:
    """``", started 2024-05-01 12:00:00 UTC (3 min ago)"``; empty for a time that is not one (a
    string, a bool, NaN, 1e300, before 1970 or in the future)."""
    if isinstance(started, bool) or not isinstance(started, (int, float)):
        return ""
    now = time.time()
    if not (isinstance(started, int) or math.isfinite(started)) or not 0 <= started <= now + 86400:
        return ""
    return (f", started {time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime(started))} "
            f"({max(0.0, now - started) / 60:.0f} min ago)")


#: The largest lock object read (ours hold a few hundred bytes: host, pid, time, token, output).
_MAX_LOCK = 1 << 16
#: The earliest start time a lock may record (2000-01-01 UTC); the latest is a day from now (clock skew).
_EARLIEST = 946684800.0


class UntrustedLock(Exception):
    """A lock object whose content is not a lock ckptmerge wrote (why: :attr:`args` ``[0]``)."""


def _reject_constant(name: str) -> Any:
    raise UntrustedLock(f"it holds {name}, which is not JSON")


def _unique_keys(pairs: List[Tuple[str, Any]]) -> dict:
    keys = [k for k, _ in pairs]
    if len(set(keys)) != len(keys):
        raise UntrustedLock("it names a field twice")
    return dict(pairs)


def parse_lock(data: bytes, output: str, now: Optional[float] = None) -> dict:
    """The holder a lock object records, checked field by field; anything else is refused.

    A lock that is broken when its holder is gone must say exactly who holds it: a forged or
    damaged one (not JSON, a field missing or of the wrong type, a start time that is not a time,
    ``NaN``, ``1e300``, negative, a pid that is not one, another output, too large) is never
    judged stale, only reported.

    Raises:
        UntrustedLock: the content is not a lock ckptmerge wrote for ``output`` (the reason).

    Example:
        >>> parse_lock(b'{"host": "h", "pid": 7, "started": 1.7e9, "token": "ab", "output": "s3://b/m", '
        ...            b'"machine": null}', "s3://b/m")["pid"]
        7
    """
    if len(data) > _MAX_LOCK:
        raise UntrustedLock(f"it has {len(data)} bytes, more than a lock's {_MAX_LOCK}")
    try:
        holder = json.loads(data.decode("utf-8"), parse_constant=_reject_constant, object_pairs_hook=_unique_keys)
    except UntrustedLock:
        raise
    except (UnicodeDecodeError, ValueError, RecursionError):
        raise UntrustedLock("it is not JSON") from None
    if not isinstance(holder, dict):
        raise UntrustedLock(f"it is JSON {type(holder).__name__}, not an object")
    kinds = {"host": str, "pid": int, "started": (int, float), "token": str, "output": str, "machine": (str, type(None))}
    for name, kind in kinds.items():
        if name not in holder:
            raise UntrustedLock(f"its field {name!r} is missing")
        value = holder[name]
        if isinstance(value, bool) or not isinstance(value, kind):
            raise UntrustedLock(f"its field {name!r} is {_field(value)}, not a {name}")
    now = time.time() if now is None else now
    if not 0 < holder["pid"] < 1 << 31:
        raise UntrustedLock(f"its pid {_field(holder['pid'])} is not a process id")
    started = holder["started"]
    if not (isinstance(started, int) or math.isfinite(started)) or not _EARLIEST <= started <= now + 86400:
        raise UntrustedLock(f"its start time {_field(started)} is not a time (seconds since 1970, not in the future)")
    if not 0 < len(holder["token"]) <= 64 or len(holder["host"]) > 255 or len(holder["machine"] or "") > 255:
        raise UntrustedLock("its host, machine or token is not one ckptmerge writes")
    if holder["output"] != output:
        raise UntrustedLock(f"it names another output, {_field(holder['output'])}")
    return holder


class _RemoteLock:
    """``<url>.lock``, created atomically on entry and deleted on exit (see the module docstring)."""

    def __init__(self, url: str) -> None:
        self.url = add_suffix(url, ".lock")
        self.output = url
        self.token = os.urandom(8).hex()
        self.held = False

    def __enter__(self) -> "_RemoteLock":
        if not LOCK.get():
            return self
        body = json.dumps({"host": socket.gethostname(), "pid": os.getpid(), "started": time.time(),
                           "token": self.token, "output": self.output, "machine": machine_tag()}).encode()
        error: Optional[Exception] = None
        try:
            with HeldInterrupts():
                for _ in range(3):  # a lock that vanishes between the create and the look: create again
                    if create_exclusive(self.url, body):
                        self.held = True
                        return self
                    holder = self._holder()
                    if holder is None:
                        continue
                    if holder.get("token") == self.token:  # our create landed, its answer was lost, then retried
                        self.held = True
                        return self
                    if self._gone(holder) and self._break(holder, body):
                        self.held = True
                        return self
                    error = self._locked_error(holder)
                    break
                else:
                    error = self._locked_error({})
        except UntrustedLock as e:
            error = self._untrusted_error(str(e))
        except BaseException:
            if not self.held and self._ours():
                self.held = True  # a create that landed though it reported an error: ours to remove
            self.__exit__()
            raise
        raise error

    @staticmethod
    def _gone(holder: dict) -> bool:
        """Whether the holder is a process of this machine and process namespace that has ended."""
        mine = machine_tag()
        return mine is not None and holder["machine"] == mine and process_gone(holder["pid"])

    def _break(self, holder: dict, body: bytes) -> bool:
        """Replace the lock of a holder that is gone with ours. Breakers on this machine take
        turns (a ``flock``), and each looks again under it, so two never both win; a merge on
        another machine never breaks it, and can only win the create in between."""
        try:
            import fcntl
        except ImportError:  # pragma: no cover - not POSIX: machine_tag() is None there anyway
            return False
        with _turns() as f:
            if f is None:
                return False
            fcntl.flock(f, fcntl.LOCK_EX)
            now = self._holder()
            if now is None or now["token"] != holder["token"]:
                return False
            remove_object(self.url)
            if not create_exclusive(self.url, body):
                return False
        logger.warning("removed the lock %s of process %s on this machine, which is no longer running (killed "
                       "without cleaning up)", escape_name(self.url), holder.get("pid"))
        return True

    def _holder(self) -> Optional[dict]:
        """The lock's holder, checked (:func:`parse_lock`); None when there is no lock object.

        Raises:
            UntrustedLock: its content is not a lock ckptmerge wrote.
            CkptMergeError: it could not be read (the store's error, naming the lock).
        """
        forget_listings(self.url)  # another process made it since this one last looked
        try:
            size = remote_size(self.url)
            if size > _MAX_LOCK:
                raise UntrustedLock(f"it has {size} bytes, more than a lock's {_MAX_LOCK}")
            return parse_lock(read_small(self.url, _MAX_LOCK), self.output)
        except CheckpointNotFoundError:
            return None

    def _ours(self) -> bool:
        """Whether the lock object there now is this merge's (False when that cannot be told)."""
        try:
            holder = self._holder()
        except Exception:  # noqa: BLE001 - unreadable or not ours: not ours to remove
            return False
        return holder is not None and holder["token"] == self.token

    def _locked_error(self, h: dict) -> OutputLockedError:
        who = f"process {_field(h.get('pid'))} on host {_field(h.get('host'))}" if h else "an unknown writer"
        return OutputLockedError(
            f"Another merge to {quote_name(self.output)} is running: the lock {quote_name(self.url)} is held by "
            f"{who}{_lock_age(h.get('started'))}. Wait for it to finish, or choose another output. If that merge is no longer running "
            f"(killed without cleaning up), delete the object {quote_name(self.url)} and merge again.",
            path=self.url)

    def _untrusted_error(self, why: str) -> OutputLockedError:
        return OutputLockedError(
            f"The lock {quote_name(self.url)} of the output {quote_name(self.output)} cannot be trusted: {why}. "
            "It was damaged or not written by ckptmerge, so whether a merge holds it cannot be told, and it is "
            f"left as it is. If you are sure no merge to {quote_name(self.output)} is running, delete the object "
            f"{quote_name(self.url)} and merge again.", path=self.url)

    def __exit__(self, *exc: Any) -> None:
        if not self.held:
            return
        self.held = False
        try:
            with HeldInterrupts():
                remove_object(self.url)
        except Exception:  # noqa: BLE001 - the merge's own outcome matters more; say what is left
            logger.warning("could not remove the lock %s; delete it before the next merge to %s",
                           escape_name(self.url), escape_name(self.output))


@contextlib.contextmanager
def _turns() -> Any:
    """The file whose ``flock`` breakers of remote locks on this machine take turns on (in the
    shared temporary folder): never a link, a FIFO or a device someone put there (None then)."""
    path = os.path.join(tempfile.gettempdir(), "ckptmerge-lock-break")
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0),
                     0o666)
    except OSError as e:
        logger.warning("cannot use %s to break a lock (%s)", path, e)
        yield None
        return
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            logger.warning("%s is not a regular file; no lock is broken", path)
            yield None
        else:
            yield fd
    finally:
        os.close(fd)


def _sweep_stale_temps() -> None:
    """Remove the temporary folders of remote merges on this machine whose process is gone (killed)."""
    tag = machine_tag()
    if tag is None:
        return
    mark = f"{_TEMP_PREFIX}{tag.rsplit('/', 1)[-1]}-"
    root = tempfile.gettempdir()
    try:
        names = os.listdir(root)
    except OSError:
        return
    for name in names:
        pid = name[len(mark):].split("-", 1)[0] if name.startswith(mark) else ""
        if pid.isdigit() and process_gone(int(pid)):
            shutil.rmtree(os.path.join(root, name), ignore_errors=True)


def _temp_folder() -> str:
    tag = machine_tag()
    ns = f"{tag.rsplit('/', 1)[-1]}-" if tag else ""
    return tempfile.mkdtemp(prefix=f"{_TEMP_PREFIX}{ns}{os.getpid()}-")


def merge_to_url(merge: Callable[..., Any], sources: Any, url: str, **options: Any) -> Any:
    """Run ``merge(sources, <local temp prefix>, **options)``, then upload the result to ``url``.

    ``merge`` (:func:`~ckptmerge.merging.local.merge_local`) calls back once the inputs are
    resolved: the URL is checked against each of them, then the lock is taken and the output
    checked, before any checkpoint is read.

    Raises:
        ArgumentError: ``url`` is the checkpoint of a source or of the template.
        OutputLockedError: another merge to ``url`` holds its lock object.
        OutputExistsError: a checkpoint (or data left by a killed merge) is at ``url`` and
            ``overwrite`` is false.
        CheckpointWriteError: an upload failed; the prefix reads as its old checkpoint (or, once
            the index is published, the old data objects or the state file could not be
            updated: the new checkpoint itself is complete).

    Example:
        >>> merge_to_url(merge, [Source("runs/A")], "s3://bucket/release/model")  # doctest: +SKIP
    """
    from ..sources.remote import read_state_url

    fmt = options.get("format") or ("keras-h5" if has_suffix(url, ".weights.h5") else
                                    "safetensors" if has_suffix(url, ".safetensors") else "tf")
    update_state = bool(options.get("update_state")) and fmt == "tf"
    dry_run = options.get("dry_run")
    found: List[str] = []
    state: Any = None
    _sweep_stale_temps()
    with contextlib.ExitStack() as stack:
        with HeldInterrupts():  # made and sure to be removed, or neither
            tmp = _temp_folder()
            stack.callback(shutil.rmtree, tmp, ignore_errors=True)

        def claim(inputs: Sequence[Tuple[str, str]]) -> None:
            nonlocal found, state
            refuse_overwriting_inputs(url, url, fmt, inputs, noun="output", then="copy")
            if not dry_run:
                stack.enter_context(_RemoteLock(url))
            forget_listings(url)  # what other processes wrote since this one last listed the folder counts
            found = ([url] if remote_exists(url) else []) if fmt != "tf" else _remote_checkpoint_objects(url)
            if found and not options.get("overwrite"):
                if fmt != "tf":
                    raise OutputExistsError(f"A file already exists at {quote_name(url)}. Choose another output, or "
                                            f"{_REPLACE_HINT} to replace it.", path=url)
                raise existing_output_error(found, url, _REPLACE_HINT, kind="object")
            if update_state:
                state = read_state_url(dirname(url))  # a broken state file fails before anything is written

        local = os.path.join(tmp, basename(url))
        # update_state goes through too, so its checks are the local merge's; the state file it
        # writes in the temporary folder is not uploaded (the remote one is written below)
        report = merge(sources, local, **{**options, "overwrite": True}, claim_output=claim)
        state_file: Optional[str] = None
        if not dry_run:
            if fmt != "tf":  # one file (.safetensors, .weights.h5): one object
                _upload_object(local, url)
            elif update_state:  # written in the step that switches the index (no Ctrl-C between them)
                state_file = sibling(url, "checkpoint")
                _upload_checkpoint(local, url, [u for u in found if DATA_RE.search(u)],
                                   then=lambda: _publish_state(url, state))
            else:
                _upload_checkpoint(local, url, [u for u in found if DATA_RE.search(u)])
    return dataclasses.replace(report, output=url, state_file=state_file)


def _write_error(url: str, e: BaseException, what: str) -> CheckpointWriteError:
    return CheckpointWriteError(f"Uploading the merge to {quote_name(url)} failed ({type(e).__name__}: "
                                f"{escape_name(e)}); {what}", path=url)


def _upload_object(local: str, url: str) -> None:
    """One object (a .safetensors or .weights.h5 output): one upload replaces it whole, or leaves it as it was."""
    try:
        with HeldInterrupts():
            upload_file(local, url)
    except Exception as e:  # noqa: BLE001 - every store raises its own types
        raise _write_error(url, e, "the object there, if any, is whole: the old one, unless the upload landed "
                                   "before the error.") from e
    logger.info("uploaded %s", url)


def _upload_checkpoint(local: str, url: str, old_data: List[str], then: Optional[Callable[[], Any]] = None) -> None:
    """Upload the TF checkpoint at the local prefix ``local`` to ``url`` next to ``old_data``
    (the data objects there now), publish its index, then remove ``old_data`` and call ``then``
    (the state file). From the index PUT to the end is one step that Ctrl-C waits for: an
    interrupt in between would leave the replaced data objects beside the new ones, or the new
    checkpoint without its state file."""
    folder, base = os.path.split(local)
    natural = sorted(n for n in os.listdir(folder) if n.startswith(base) and DATA_RE.fullmatch(n[len(base):]))
    count = shard_count(natural[0])
    used = {shard_count(u) for u in old_data}
    num = count
    while num in used:  # the new data objects must not take a name an existing object has
        num += 1
    files = pad_shards(local, num) if num != count else [os.path.join(folder, n) for n in natural]
    uploaded: List[str] = []
    index = add_suffix(url, INDEX)
    published: Optional[bool] = False
    replaced = False
    try:
        for path in files:
            dest = add_suffix(url, path[len(local):])
            uploaded.append(dest)  # before the upload: one that lands despite an interrupt is removed too
            with HeldInterrupts():
                upload_file(path, dest)
            logger.info("uploaded %s", dest)
        with HeldInterrupts():  # the switch, knowing that it happened, and removing what it replaced: one step
            published = _publish_index(local + INDEX, index)
            if published:
                logger.info("published %s", index)
                _remove(old_data, "of the replaced checkpoint")  # no index names them any more
                replaced = True
                if then is not None:
                    then()
    except BaseException as e:
        if published:  # the switch happened: finish it (an interrupt waited for it), then stop
            if not replaced:
                _remove(old_data, "of the replaced checkpoint")
            raise
        _remove(uploaded, "after a failed upload")
        if isinstance(e, Exception):
            raise _write_error(url, e, "the objects it wrote were removed, and the checkpoint there, if any, is "
                                       "as it was.") from e
        raise
    if published is None:  # the index PUT failed, and reading it back did not tell whether it landed
        raise CheckpointWriteError(
            f"Uploading the index {quote_name(index)} failed, and reading it back did not tell whether it landed. "
            f"The prefix {quote_name(url)} reads as the old checkpoint or as the complete new one; its data "
            "objects were left in place. Merge again with overwrite=True (ckptmerge merge --force) to finish.",
            path=index)


def _publish_index(local_index: str, index: str) -> Optional[bool]:
    """PUT the index (the switch from the old checkpoint to the new one). A failed PUT may still
    have landed (its answer lost): the object is read back. Returns True if the new index is in
    place, None if that cannot be told; raises if it is certainly not in place."""
    with open(local_index, "rb") as f:
        data = f.read()
    try:
        upload_file(local_index, index)
        return True
    except Exception as e:  # noqa: BLE001 - every store raises its own types
        try:
            forget_listings(index)
            landed = read_small(index, len(data) + 1) == data
        except CheckpointNotFoundError:  # no index there (there was none before): certainly not ours
            landed = False
        except Exception:  # noqa: BLE001 - the store does not answer: we cannot tell
            logger.warning("uploading %s failed (%s), and it could not be read back", escape_name(index), e)
            return None
        if landed:
            logger.info("uploading %s reported %s, but the new index is in place", escape_name(index), e)
            return True
        raise


def _remove(urls: List[str], why: str) -> None:
    """Delete objects, best effort (held from Ctrl-C until all are done); say which are left."""
    left = []
    with HeldInterrupts():  # all of them: a Ctrl-C in between would leave the rest behind
        for u in reversed(urls):
            try:
                remove_object(u)
            except Exception:  # noqa: BLE001 - best effort; they are named below
                left.append(u)
    if left:
        logger.warning("could not remove %d object(s) %s: %s; no index names them (merge again with --force to "
                       "remove them, or delete them)", len(left), why, ", ".join(escape_name(u) for u in left))


def _publish_state(url: str, state: Any) -> str:
    """Write the output directory's ``checkpoint`` state file (one PUT: readers see the old or the new)."""
    target = sibling(url, "checkpoint")
    text = state_file_text(url, state)
    try:
        with HeldInterrupts():
            write_object(target, text.encode("utf-8", "surrogateescape"))
    except Exception as e:  # noqa: BLE001 - every store raises its own types
        raise CheckpointWriteError(
            f"The checkpoint {quote_name(url)} was uploaded, but its directory's state file {quote_name(target)} "
            f"could not be updated ({type(e).__name__}: {escape_name(e)}). Check that you may write there; the "
            "checkpoint itself is complete and can be used by its prefix.", path=target) from e
    logger.info("updated %s", target)
    return target
