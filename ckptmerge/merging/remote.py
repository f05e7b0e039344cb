"""Merge outputs in object storage: ``cm.merge(sources, "s3://bucket/run/merged")``.

The merge itself runs exactly as for a local output, into a private temporary folder (so every
check, the plan, streaming and checksums are the same code). The files are then uploaded through
fsspec (``s3fs`` and friends upload large files as multipart uploads, streamed from disk, in
bounded memory) in the order a reader needs: **data objects first, the index last**, so no reader
ever sees an index whose data is incomplete. Object stores have no atomic rename, so replacing an
existing checkpoint (``overwrite=True``) first deletes its index: during the upload the prefix
reads as "no checkpoint", never as a mix of old and new. An upload that fails or is interrupted
removes the objects it wrote (an unfinished multipart upload is aborted by the filesystem
library) and leaves no index. With ``update_state`` the directory's ``checkpoint`` state file is
written last, after the index (earlier entries kept, as for a local output).

Two merges to one output are kept apart by a lock object, ``<prefix>.lock``, created with the
store's atomic create-if-absent (S3: a conditional PUT, ``If-None-Match: *``) before anything is
checked or written and deleted when the merge ends, however it ends. A second merge finds it and
fails at once, naming the holder (host, process, start time). A merge killed without a chance to
clean up (SIGKILL, a lost machine) leaves its lock behind: the error shows its age; delete the
object when that merge is known to be gone. Locks are never broken automatically: object stores
have no compare-and-delete, so two merges that both judged a lock stale could both proceed.
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
import tempfile
import time
from typing import Any, Callable, List, Optional

from ..errors import CheckpointWriteError, OutputExistsError, OutputLockedError
from ..formats.io.storage import (
    basename,
    create_exclusive,
    dirname,
    filesystem,
    join,
    read_small,
    remote_exists,
    remote_listdir,
)
from ..knobs import FlagSetting
from ..redact import get_logger
from ..sources.files import DATA_RE, INDEX
from ..sources.state import state_file_text
from ..text import escape_name, quote_name

__all__ = ["merge_to_url"]

logger = get_logger(__name__)



def _remote_checkpoint_objects(url: str) -> List[str]:
    """The index and data objects of a checkpoint at ``url`` (a prefix) that exist."""
    parent, base = dirname(url), basename(url)
    try:
        names = [e["name"] for e in remote_listdir(parent)]
    except Exception:  # noqa: BLE001 - no such "directory": nothing there
        return []
    return [join(parent, n) for n in names
            if n == base + INDEX or (n.startswith(base) and DATA_RE.fullmatch(n[len(base):]))]


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


class _RemoteLock:
    """``<url>.lock``, created atomically on entry and deleted on exit (see the module docstring)."""

    def __init__(self, url: str) -> None:
        self.url = url + ".lock"
        self.output = url
        self.token = os.urandom(8).hex()
        self.held = False

    def __enter__(self) -> "_RemoteLock":
        if not LOCK.get():
            return self
        body = json.dumps({"host": socket.gethostname(), "pid": os.getpid(), "started": time.time(),
                           "token": self.token, "output": self.output}).encode()
        if create_exclusive(self.url, body):
            self.held = True
            return self
        holder = self._holder()
        if holder.get("token") == self.token:  # our create landed but its answer was lost, then retried
            self.held = True
            return self
        raise self._locked_error(holder)

    def _holder(self) -> dict:
        try:
            holder = json.loads(read_small(self.url, 1 << 16).decode("utf-8"))
        except Exception:  # noqa: BLE001 - gone, unreadable or not ours: still no holder to name
            return {}
        return holder if isinstance(holder, dict) else {}

    def _locked_error(self, h: dict) -> OutputLockedError:
        who = f"process {_field(h.get('pid'))} on host {_field(h.get('host'))}" if h else "an unknown writer"
        return OutputLockedError(
            f"Another merge to {quote_name(self.output)} is running: the lock {quote_name(self.url)} is held by "
            f"{who}{_lock_age(h.get('started'))}. Wait for it to finish, or choose another output. If that merge is no longer running "
            f"(killed without cleaning up), delete the object {quote_name(self.url)} and merge again.",
            path=self.url)

    def __exit__(self, *exc: Any) -> None:
        if not self.held:
            return
        self.held = False
        try:
            fs, path = filesystem(self.url)
            fs.rm_file(path)
        except Exception:  # noqa: BLE001 - the merge's own outcome matters more; say what is left
            logger.warning("could not remove the lock %s; delete it before the next merge to %s",
                           self.url, self.output)


def merge_to_url(merge: Callable[..., Any], sources: Any, url: str, **options: Any) -> Any:
    """Run ``merge(sources, <local temp prefix>, **options)``, then upload the result to ``url``.

    Raises:
        OutputLockedError: another merge to ``url`` holds its lock object.
        OutputExistsError: a checkpoint exists at ``url`` and ``overwrite`` is false.
        CheckpointWriteError: an upload failed; the objects it wrote are removed (or, after the
            index, the state file could not be written: the checkpoint itself is complete).

    Example:
        >>> merge_to_url(merge, [Source("runs/A")], "s3://bucket/release/model")  # doctest: +SKIP
    """
    from ..sources.remote import read_state_url

    fmt = options.get("format") or ("keras-h5" if url.endswith(".weights.h5") else
                                    "safetensors" if url.endswith(".safetensors") else "tf")
    update_state = bool(options.get("update_state")) and fmt == "tf"
    dry_run = options.get("dry_run")
    tmp = tempfile.mkdtemp(prefix="ckptmerge-upload-")
    try:
        with (contextlib.nullcontext() if dry_run else _RemoteLock(url)):
            existing = ([url] if remote_exists(url) else []) if fmt != "tf" else \
                _remote_checkpoint_objects(url)
            if existing and not options.get("overwrite"):
                raise OutputExistsError(f"A checkpoint already exists at {quote_name(url)} ({quote_name(existing[0])}). "
                                        "Choose another output, or pass overwrite=True (ckptmerge merge --force) to "
                                        "replace it.", path=existing[0])
            state = read_state_url(dirname(url)) if update_state else None  # a broken one fails first
            local = os.path.join(tmp, basename(url))
            # update_state goes through too, so its checks are the local merge's; the state file it
            # writes in the temporary folder is not uploaded (the remote one is written below)
            report = merge(sources, local, **{**options, "overwrite": True})
            state_file: Optional[str] = None
            if not dry_run:
                _upload(local, url, fmt, existing)
                if update_state:
                    state_file = _publish_state(url, state)
        return dataclasses.replace(report, output=url, state_file=state_file)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _publish_state(url: str, state: Any) -> str:
    """Write the output directory's ``checkpoint`` state file (one PUT: readers see the old or the new)."""
    target = join(dirname(url), "checkpoint")
    text = state_file_text(url, state)
    try:
        fs, path = filesystem(target)
        fs.pipe_file(path, text.encode("utf-8", "surrogateescape"))
    except Exception as e:  # noqa: BLE001 - every store raises its own types
        raise CheckpointWriteError(
            f"The checkpoint {quote_name(url)} was uploaded, but its directory's state file {quote_name(target)} "
            f"could not be updated ({type(e).__name__}: {e}). Check that you may write there; the checkpoint "
            "itself is complete and can be used by its prefix.", path=target) from e
    logger.info("updated %s", target)
    return target


def _upload(local: str, url: str, fmt: str, existing: List[str]) -> None:
    fs, _ = filesystem(url)
    folder, base = os.path.dirname(local), os.path.basename(local)
    files = sorted(n for n in os.listdir(folder) if n == base or n.startswith(base + "."))
    index = [n for n in files if n.endswith(".index")]
    order = [n for n in files if n not in index] + index  # data first, the index last
    uploaded: List[str] = []
    target_dir = dirname(url)
    old_index = [u for u in existing if u.endswith(".index")]
    try:
        for u in old_index:  # from here until the new index lands, the prefix reads as "nothing"
            fs.rm_file(filesystem(u)[1])
        for name in order:
            dest = join(target_dir, name)
            fs.put_file(os.path.join(folder, name), filesystem(dest)[1])
            uploaded.append(dest)
            logger.info("uploaded %s", dest)
    except BaseException as e:
        for dest in reversed(uploaded):
            try:
                fs.rm_file(filesystem(dest)[1])
            except Exception:  # noqa: BLE001 - best effort; the index (uploaded last) is what counts
                logger.warning("could not remove %s after a failed upload", dest)
        if isinstance(e, Exception):
            raise CheckpointWriteError(f"Uploading the merge to {quote_name(url)} failed ({type(e).__name__}: {e}); "
                                       "the objects it wrote were removed, so no index points at incomplete data.",
                                       path=url) from e
        raise
    stale = [u for u in existing if not u.endswith(".index") and basename(u) not in order]
    for u in stale:  # data shards of the replaced checkpoint that the new one does not have
        try:
            fs.rm_file(filesystem(u)[1])
        except Exception:  # noqa: BLE001
            logger.warning("could not remove stale object %s", u)
