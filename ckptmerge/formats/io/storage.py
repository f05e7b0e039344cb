"""Where checkpoint bytes live: local files, or object storage through fsspec.

Local paths keep ckptmerge's fast path (``preadv`` into aligned buffers, ``copy_file_range``
for merges) and never touch this module's remote half. A URL (``s3://``, ``gs://``, ``az://``,
``abfs://``, ``hdfs://``, ``memory://``, ``file://``, ``https://``) is served by the fsspec
filesystem made for that store (``s3fs``, ``gcsfs``, ``adlfs``; optional extras, see
docs/remote.md): small files (an index, a state file) are fetched once and whole, tensors
with ranged reads (``fs.cat_file(path, start, end)``) that the readers issue from their thread
pools, several in flight at once. The other formats read a URL through the same seam:
:class:`~ckptmerge.formats.io.fileio.Descriptors` hands out a :class:`RemoteFile` where a local file
gets a descriptor (safetensors, ``.npy``, V1 tables: a header, then each tensor's range), and
:func:`open_binary` / :func:`open_zip` give h5py and zipfile a seekable, block-cached remote file
(Keras ``.h5``/``.keras``, ``.npz``); ``isfile``/``isdir``/``getsize``/``listdir`` answer for
local paths and URLs alike. Credentials are each library's own business: ckptmerge passes
none and reads none. Remote errors become :class:`~ckptmerge.core.errors.CheckpointFormatError` /
:class:`~ckptmerge.core.errors.CheckpointNotFoundError` naming the URL and saying what happened
("Timed out", the HTTP status); transient ones (a timeout, throttling, a reset connection, a 5xx)
are retried a bounded number of times with exponential backoff, within a deadline. Every
filesystem is opened with a per-request timeout, and every read is bounded in time, retries
included: :mod:`ckptmerge.formats.io.remote_policy`.
"""

from __future__ import annotations

import asyncio
import errno
import inspect
import os
import re
import threading
import time
import zipfile
from collections import OrderedDict
from typing import Any, Callable, Dict, List, Optional, Tuple, TypeVar

from ckptmerge.core.errors import (
    CheckpointFormatError,
    CheckpointNotFoundError,
    CkptMergeError,
)
from ckptmerge.formats.io.localfile import open_regular
from ckptmerge.formats.io.remote_policy import (
    DEADLINE_VAR,
    TIMEOUT_VAR,
    deadline_seconds,
    describe,
    http_status,
    is_timeout,
    is_transient,
    single_attempt,
    storage_options,
    timeout_seconds,
)
from ckptmerge.formats.io.urlpath import (
    add_suffix,
    basename,
    dirname,
    has_suffix,
    is_url,
    join,
    path_part,
    scheme_of,
    sibling,
    strip_slash,
)
from ckptmerge.core import limits
from ckptmerge.core.knobs import IntSetting
from ckptmerge.core.redact import get_logger
from ckptmerge.core.text import escape_name, quote_name

__all__ = ["is_url", "filesystem", "RemoteFile", "read_small", "remote_exists", "remote_isdir",
           "remote_listdir", "remote_size", "join", "basename", "dirname", "sibling", "strip_slash", "add_suffix",
           "has_suffix", "path_part", "create_exclusive", "RETRIES",
           "REMOTE_CONCURRENCY", "isfile", "isdir", "exists", "getsize", "listdir", "walk_files", "abspath",
           "open_binary", "open_zip", "REMOTE_BLOCK", "SNIFF_BLOCK", "upload_file", "write_object",
           "remove_object", "forget_listings", "probe_isfile", "AccessDeniedError"]

logger = get_logger(__name__)

#: Which pip extra brings the filesystem package of each scheme.
_EXTRAS = {"s3": "s3", "s3a": "s3", "gs": "gcs", "gcs": "gcs", "az": "azure", "abfs": "azure",
           "abfss": "azure", "adl": "azure", "http": "remote", "https": "remote", "hdfs": "remote"}
# The settings are read when a URL is used (``.get()``), never at import: a malformed value is a
# clear SettingError for the command that needs it, and local commands never look at them.
#: Attempts of one remote request before giving up (transient errors only).
RETRIES = IntSetting("CKPTMERGE_REMOTE_RETRIES", 4, 1, 100, "the attempts of one remote request (1: no retries)")
#: Ranged reads in flight at once per reader (default 16).
REMOTE_CONCURRENCY = IntSetting("CKPTMERGE_REMOTE_CONCURRENCY", 16, 1, 1024,
                                "the ranged reads in flight at once per remote reader")
#: Largest small file (index, state file, JSON) fetched whole.
MAX_SMALL = 1 << 31
#: Block size of the cached remote file objects that h5py and zipfile read through (bytes, default 4 MiB).
REMOTE_BLOCK = IntSetting("CKPTMERGE_REMOTE_BLOCK", 4 << 20, 1 << 16, 1 << 30,
                          "the block size in bytes of remote .h5/.keras/.npz reads")

T = TypeVar("T")


class AccessDeniedError(CheckpointFormatError):
    """The store refused access to a URL (HTTP 401 or 403, ``PermissionError``)."""


_FS_LOCK = threading.Lock()


def filesystem(url: str) -> Tuple[Any, str]:
    """``(fsspec filesystem, path within it)`` for a URL, with a clear error for a missing extra.

    Raises:
        CkptMergeError: fsspec or the scheme's filesystem package is not installed.

    Example:
        >>> fs, path = filesystem("memory://run/ckpt")  # doctest: +SKIP
    """
    scheme = scheme_of(url) or "file"
    extra = _EXTRAS.get(scheme, "remote")
    try:
        from fsspec.core import url_to_fs
    except ImportError:
        raise CkptMergeError(f"Reading {quote_name(url)} needs fsspec: pip install \"ckptmerge[{extra}]\"") from None
    try:
        options = storage_options(scheme)  # the per-request timeouts (remote_policy)
        with _FS_LOCK:  # a scheme is case-insensitive (RFC 3986); fsspec knows only lower case
            fs, path = url_to_fs(scheme + url[len(scheme):] if is_url(url) else url, **options)
            single_attempt(fs)  # ckptmerge's attempts are the retries (remote_policy)
    except (ImportError, ValueError) as e:
        raise CkptMergeError(f"Cannot open {quote_name(url)}: the filesystem for '{scheme}://' is not installed "
                             f"({escape_name(e)}). Install it with: pip install \"ckptmerge[{extra}]\"") from None
    return fs, path


_TRANSIENT_ERRNOS = {getattr(errno, n) for n in ("EREMOTEIO", "ECONNRESET", "ETIMEDOUT", "EPIPE", "ECONNABORTED",
                                                   "EAGAIN", "EBUSY") if hasattr(errno, n)}


def _transient(e: BaseException) -> bool:
    """Throttling, resets, timeouts and 5xx answers are worth another try; the rest are not."""
    if isinstance(e, (FileNotFoundError, PermissionError, IsADirectoryError, NotADirectoryError)):
        return False
    if isinstance(e, OSError) and e.errno in _TRANSIENT_ERRNOS:  # s3fs: a 5xx is EREMOTEIO
        return True
    text = f"{type(e).__name__} {e}".lower()
    return isinstance(e, (ConnectionError, TimeoutError)) or any(
        w in text for w in ("throttl", "slowdown", "slow down", "reset", "timeout", "timed out", "500",
                            "502", "503", "504", "internalerror", "serviceunavailable", "connection",
                            "broken pipe", "incomplete", "server disconnected"))


def _call(fs: Any, method: str, *args: Any, timeout: Optional[float] = None, **kwargs: Any) -> Any:
    """``fs.method(*args, **kwargs)``; on an async filesystem (s3fs, gcsfs, adlfs, http) its
    coroutine runs with ``timeout`` seconds in all (fsspec cancels it then), so no library retry
    loop outlasts the deadline."""
    coroutine = getattr(fs, "_" + method, None)
    if timeout is not None and getattr(fs, "async_impl", False) and not getattr(fs, "asynchronous", False) \
            and asyncio.iscoroutinefunction(coroutine):
        from fsspec.asyn import sync

        return sync(fs.loop, coroutine, *args, timeout=timeout, **kwargs)
    return getattr(fs, method)(*args, **kwargs)


def _with_retries(what: str, url: str, fn: Callable[[Optional[float]], T], *, key: Optional[str] = None,
                  bounded: bool = True) -> T:
    """``fn(seconds left)``, retried on transient failures until ``CKPTMERGE_REMOTE_RETRIES``
    attempts or the ``CKPTMERGE_REMOTE_DEADLINE`` run out (``bounded=False``: uploads, which may
    rightly last longer, get no deadline, only the per-request timeout); every failure becomes a
    :class:`~ckptmerge.core.errors.CkptMergeError` naming the URL and saying what happened."""
    delay = 0.05
    attempts = RETRIES.get()
    start = time.monotonic()
    deadline = deadline_seconds() if bounded else None
    for attempt in range(1, attempts + 1):
        left = None if deadline is None else max(0.001, deadline - (time.monotonic() - start))
        try:
            return fn(left)
        except CkptMergeError:
            raise
        except Exception as e:  # noqa: BLE001 - every library raises its own types
            status, timed_out = http_status(e), is_timeout(e)
            if status in (404, 410) or (isinstance(e, FileNotFoundError) and not timed_out and status is None):
                raise CheckpointNotFoundError(f"{quote_name(url)} does not exist (while {what}).", path=url) from None
            if isinstance(e, PermissionError) or status in (401, 403):
                reason = describe(status) if status else f"{escape_name(e)}. Check the credentials your storage " \
                                                         "library uses (ckptmerge passes none)."
                raise AccessDeniedError(f"Access denied to {quote_name(url)} while {what}: {reason}", path=url,
                                        key=key) from None
            transient = is_transient(e)
            if transient is None:
                transient = _transient(e)
            elapsed = time.monotonic() - start
            out_of_time = deadline is not None and elapsed + delay >= deadline
            if not transient or attempt == attempts or out_of_time:
                raise _final_error(what, url, e, attempt, elapsed, status, timed_out, key) from None
            logger.info("retrying %s from %s after %s: %s (attempt %d of %d)", what, url, type(e).__name__,
                        e, attempt, attempts)
            time.sleep(delay)
            delay *= 4
    raise AssertionError("unreachable")  # pragma: no cover


def _final_error(what: str, url: str, e: BaseException, attempts: int, elapsed: float, status: Optional[int],
                 timed_out: bool, key: Optional[str]) -> CheckpointFormatError:
    tail = f" after {attempts} attempts in {elapsed:.0f} s" if attempts > 1 else ""
    if timed_out:
        return CheckpointFormatError(
            f"Timed out while {what} from {quote_name(url)}{tail}: the server did not answer within "
            f"{timeout_seconds():g} s ({TIMEOUT_VAR}; {deadline_seconds():g} s in all, {DEADLINE_VAR}). Check that it "
            "is reachable and answering, or raise those limits.", path=url, key=key)
    reason = describe(status) if status else f"{type(e).__name__}: {escape_name(e)}"
    return CheckpointFormatError(f"Remote error while {what} from {quote_name(url)}{tail}: {reason}", path=url, key=key)


def read_small(url: str, limit: int = MAX_SMALL) -> bytes:
    """Fetch a whole small file (an index, a state file), at most ``limit`` bytes.

    Example:
        >>> data = read_small("s3://bucket/run/ckpt-10.index")  # doctest: +SKIP
    """
    fs, path = filesystem(url)
    size = remote_size(url)
    if size > limit:
        raise CheckpointFormatError(f"{quote_name(url)} has {size} bytes, more than the {limit}-byte limit for "
                                    "this file.", path=url)
    return _with_retries("fetching", url, lambda t: _call(fs, "cat_file", path, timeout=t))


def remote_size(url: str) -> int:
    """The size in bytes of a remote file."""
    fs, path = filesystem(url)
    info = _with_retries("looking up", url, lambda t: _call(fs, "info", path, timeout=t))
    if info.get("type") == "directory":
        raise CheckpointFormatError(f"{quote_name(url)} is a directory, not a file.", path=url)
    return int(info.get("size") or 0)


def remote_exists(url: str) -> bool:
    """Whether a remote file exists (a directory does not count). A server that does not answer is
    an error, not "no": ``fs.isfile`` would say False for a timeout or a 500."""
    fs, path = filesystem(url)
    try:
        info = _with_retries("looking up", url, lambda t: _call(fs, "info", path, timeout=t))
    except CheckpointNotFoundError:
        return False
    return info.get("type", "file") == "file"


def probe_isfile(path: str) -> bool:
    """Whether a file the user did not name exists beside one they did (``<prefix>.index``, a
    sharded set's JSON, a folder's marker or state file): :func:`isfile`, except that a URL the
    store denies counts as absent. S3 answers 403 for a missing key to a client that may not list
    the bucket, and a presigned URL's signature is refused for any other key, so a denied probe
    must not stop the lookup: what the user named is read next, and a denial of that is the error.

    Example:
        >>> probe_isfile("/nonexistent/ckpt-1.index")
        False
    """
    if not is_url(path):
        return os.path.isfile(path)
    try:
        return remote_exists(path)
    except AccessDeniedError:
        logger.info("%s: access denied; taken as absent (it was only looked for)", path)
        return False
    except CheckpointFormatError as e:  # a 400, a 5xx, a timeout: say which URL was probed, and why
        raise CheckpointFormatError(
            f"{e} (ckptmerge looks for that file beside the checkpoint named, to tell what the checkpoint is; "
            "the server must answer such a lookup, with 404 when there is no such file.)", path=e.path,
            key=e.key) from None


def remote_isdir(url: str) -> bool:
    """Whether a remote path is a directory (a prefix with objects below it)."""
    fs, path = filesystem(url)
    return bool(_with_retries("looking up", url, lambda t: _call(fs, "isdir", path, timeout=t)))


def remote_listdir(url: str) -> List[Dict[str, Any]]:
    """``[{"name": basename, "size": int, "type": "file"|"directory", "mtime": float|None}]``."""
    fs, path = filesystem(url)
    entries = _with_retries("listing", url, lambda t: _call(fs, "ls", path, detail=True, timeout=t))
    out = []
    for e in entries:
        name = str(e.get("name", ""))
        name = basename(name) if is_url(name) else name.rstrip("/").rsplit("/", 1)[-1]  # (http: full URLs)
        mtime = e.get("mtime") or e.get("LastModified") or e.get("created")
        if hasattr(mtime, "timestamp"):
            mtime = mtime.timestamp()
        out.append({"name": name, "size": int(e.get("size") or 0), "type": e.get("type", "file"),
                    "mtime": float(mtime) if isinstance(mtime, (int, float)) else None})
    return out


# Filesystems whose pipe_file takes ``mode="create"`` through ``**kwargs`` and honours it from a
# version on: adlfs (an Azure conditional upload) since 2024.12.0 (fsspec/adlfs#491).
_CREATE_BY_KWARGS = {"adlfs": (2024, 12, 0)}


def _has_exclusive_create(fs: Any) -> bool:
    """Whether ``fs.pipe_file(..., mode="create")`` is an atomic create-if-absent on this store:
    the filesystem implements ``mode`` itself (s3fs: a conditional PUT with ``If-None-Match: *``;
    gcsfs: a conditional upload, ``ifGenerationMatch=0``; memory://), or is a known one that
    takes it through ``**kwargs`` (adlfs from 2024.12.0), rather than inheriting fsspec's generic
    check-then-write."""
    from fsspec.asyn import AsyncFileSystem
    from fsspec.spec import AbstractFileSystem

    for name, base in (("_pipe_file", AsyncFileSystem), ("pipe_file", AbstractFileSystem)):
        own = getattr(type(fs), name, None)
        if own is not None and own is not getattr(base, name, None) and \
                "mode" in inspect.signature(own).parameters:
            return True
    package = type(fs).__module__.split(".")[0]
    since = _CREATE_BY_KWARGS.get(package)
    if since is not None:
        from importlib.metadata import PackageNotFoundError, version

        try:
            found = tuple(int(p) for p in re.findall(r"\d+", version(package))[:3])
        except PackageNotFoundError:
            return False
        return found >= since
    return False


def create_exclusive(url: str, data: bytes) -> bool:
    """Create the object ``url`` holding ``data`` only if it does not exist (atomically).

    Returns:
        True if this call created it, False if it already existed.

    Raises:
        CkptMergeError: the store has no atomic create-if-absent (the message says so and how to
            go on without it), or a remote error outlasted the retries.

    Example:
        >>> create_exclusive("memory://locks/run.lock", b"me")  # doctest: +SKIP
        True
    """
    fs, path = filesystem(url)
    if not _has_exclusive_create(fs):
        raise CkptMergeError(
            f"Cannot create the lock {quote_name(url)}: the {type(fs).__name__} filesystem has no atomic "
            "create-if-absent, so two merges to one output could not be kept apart. Make sure only one "
            "merge writes there and set CKPTMERGE_REMOTE_LOCK=0 to merge without the lock.")

    def put(timeout: Optional[float]) -> bool:
        try:
            _call(fs, "pipe_file", path, data, mode="create", timeout=timeout)
        except FileExistsError:
            return False
        return True

    return _with_retries("creating", url, put)


# -- writes (merge outputs) ---------------------------------------------------------------------
# Each is one request (or one multipart upload) that the store applies whole: an object reads as
# before or as after, never half-written. Transient failures are retried as reads are.


def upload_file(local: str, url: str) -> None:
    """Upload the local file ``local`` to the object ``url`` (replacing it; large files as a
    multipart upload streamed from disk, which the store shows only once complete).

    Raises:
        CheckpointFormatError: the upload failed (access denied, or an error outlasting the retries).

    Example:
        >>> upload_file("/tmp/out/merged.index", "s3://bucket/run/merged.index")  # doctest: +SKIP
    """
    fs, path = filesystem(url)
    _with_retries("uploading", url, lambda t: fs.put_file(local, path), bounded=False)


def write_object(url: str, data: bytes) -> None:
    """Write the small object ``url`` holding ``data`` (replacing it) in one request."""
    fs, path = filesystem(url)
    _with_retries("writing", url, lambda t: _call(fs, "pipe_file", path, data, timeout=t))


def forget_listings(url: str) -> None:
    """Drop what this process's filesystem keeps about ``url`` and the folders above it (s3fs,
    gcsfs and adlfs keep listings, and answer lookups from them, for as long as the process
    lives), so the next look is the store's answer now, with what other processes wrote since
    (a watcher polling a prefix must see new objects).

    Example:
        >>> forget_listings("memory://run")  # doctest: +SKIP
    """
    fs, path = filesystem(url)
    try:
        fs.invalidate_cache(path)
    except Exception:  # noqa: BLE001 - a filesystem without a cache has nothing to forget
        pass


def remove_object(url: str) -> bool:
    """Delete the object ``url``; False if it did not exist.

    Raises:
        CheckpointFormatError: it could not be deleted (access denied, or an error outlasting the retries).
    """
    fs, path = filesystem(url)
    try:
        _with_retries("deleting", url, lambda t: _call(fs, "rm_file", path, timeout=t))
    except CheckpointNotFoundError:
        return False
    return True


# -- the same questions of a local path or a URL ------------------------------------------------
# Readers of single files (safetensors, NumPy, Keras h5) ask these instead of ``os.path``: a local
# path gets the ``os`` answer (the same code and speed as before), a URL the fsspec one.


def isfile(path: str) -> bool:
    """``os.path.isfile`` for a local path; for a URL, whether the object exists."""
    return remote_exists(path) if is_url(path) else os.path.isfile(path)


def isdir(path: str) -> bool:
    """``os.path.isdir`` for a local path; for a URL, whether objects lie below it."""
    if not is_url(path):
        return os.path.isdir(path)
    try:
        return remote_isdir(path)
    except CheckpointNotFoundError:
        return False


def exists(path: str) -> bool:
    """``os.path.exists`` for a local path; for a URL, a file or a directory there."""
    return isfile(path) or isdir(path) if is_url(path) else os.path.exists(path)


def getsize(path: str) -> int:
    """The size in bytes of a local or remote file."""
    return remote_size(path) if is_url(path) else os.path.getsize(path)


def listdir(path: str) -> List[str]:
    """The names in a local directory, or below a remote prefix (one level)."""
    return [e["name"] for e in remote_listdir(path)] if is_url(path) else os.listdir(path)


def walk_files(root: str) -> List[Tuple[str, str]]:
    """``[(path relative to root with '/', URL)]`` for every object below a remote ``root``."""
    fs, base = filesystem(root)
    found = _with_retries("listing", root, lambda t: _call(fs, "find", base, timeout=t))
    base = base.rstrip("/") + "/"
    out = []
    for name in sorted(found):
        rel = str(name)[len(base):] if str(name).startswith(base) else basename(str(name))
        out.append((rel, join(root, rel)))
    return out


def abspath(path: str) -> str:
    """``os.path.abspath`` for a local path; a URL is already absolute."""
    return path if is_url(path) else os.path.abspath(path)


#: Block size for sniffing a file's format (a few bytes at its start or end).
SNIFF_BLOCK = 1 << 16


def open_binary(path: str, block_size: Optional[int] = None) -> Any:
    """A readable, seekable binary file object: ``open(path, "rb")`` for a local path; for a URL
    a file that reads by ranges, keeping up to 32 blocks of ``block_size`` bytes (h5py and
    zipfile seek around: metadata, then the data they want; sniffing a format needs only
    :data:`SNIFF_BLOCK`). Its reads are those of :class:`RemoteFile`: retried, within the
    deadline, and a failure is a :class:`~ckptmerge.core.errors.CkptMergeError` naming the URL.

    Raises:
        FileNotFoundError, OSError: as ``open`` does (readers turn them into their errors).
    """
    if not is_url(path):
        return os.fdopen(open_regular(path), "rb")  # (never a FIFO or a device)
    block_size = block_size or REMOTE_BLOCK.get()
    try:
        return _RemoteReads(path, block_size)
    except CheckpointNotFoundError:
        raise FileNotFoundError(path) from None
    except CkptMergeError as e:
        raise OSError(str(e)) from None


class _RemoteReads:
    """A seekable read-only file over a :class:`RemoteFile`, with an LRU cache of 32 blocks.

    Every read is a :meth:`RemoteFile.readinto` (retried, bounded by the deadline, refusing a
    short answer), so h5py and zipfile read a URL under the same rules as every other reader,
    and a failure says what happened instead of raising a storage library's own exception.
    """

    def __init__(self, url: str, block_size: int, max_blocks: int = 32) -> None:
        self.url = url
        self._file = RemoteFile(url)
        self.size = self._file.size
        self._block = max(1, block_size)
        self._max = max_blocks
        self._blocks: "OrderedDict[int, bytes]" = OrderedDict()
        self._pos = 0
        self.closed = False

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def writable(self) -> bool:
        return False

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = 0) -> int:
        base = {0: 0, 1: self._pos, 2: self.size}[whence]
        self._pos = max(0, base + offset)
        return self._pos

    def _get(self, i: int) -> bytes:
        block = self._blocks.get(i)
        if block is not None:
            self._blocks.move_to_end(i)
            return block
        start = i * self._block
        buf = bytearray(min(self._block, self.size - start))
        try:
            got = self._file.readinto(start, memoryview(buf))
        except CheckpointNotFoundError:  # it was there when opened: not "no such file" for a sniffer
            raise CheckpointFormatError(f"{quote_name(self.url)} vanished while it was read (the server no longer "
                                        "finds it): deleted or replaced meanwhile? Try again.", path=self.url) from None
        block = self._blocks[i] = bytes(buf[:got])  # short only at the object's end (RemoteFile refuses less)
        if len(self._blocks) > self._max:
            self._blocks.popitem(last=False)
        return block

    def read(self, size: int = -1) -> bytes:
        end = self.size if size is None or size < 0 else min(self.size, self._pos + size)
        out = []
        while self._pos < end:
            i, off = divmod(self._pos, self._block)
            piece = self._get(i)[off: off + end - self._pos]
            if not piece:  # pragma: no cover - RemoteFile refuses a short answer; never spin on one
                break
            out.append(piece)
            self._pos += len(piece)
        return b"".join(out)

    def readinto(self, buf: Any) -> int:
        view = memoryview(buf).cast("B")
        data = self.read(len(view))
        view[:len(data)] = data
        return len(data)

    def close(self) -> None:
        self.closed = True
        self._blocks.clear()

    def __enter__(self) -> "_RemoteReads":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class _OwningZip(zipfile.ZipFile):
    """A ``ZipFile`` over a file object it opened itself, and closes with itself."""

    def __init__(self, fileobj: Any) -> None:
        self._owned = fileobj
        try:
            super().__init__(fileobj)
        except BaseException:
            fileobj.close()
            raise

    def close(self) -> None:
        try:
            super().close()
        finally:
            self._owned.close()


def open_zip(path: str, block_size: Optional[int] = None) -> zipfile.ZipFile:
    """``zipfile.ZipFile(path)`` for a local or remote archive (remote: over :func:`open_binary`).

    Raises:
        zipfile.BadZipFile, OSError, ValueError: as ``zipfile.ZipFile`` does.
    """
    if is_url(path):
        return _OwningZip(open_binary(path, block_size))
    with limits.checked(path):
        return zipfile.ZipFile(path)


def _check_length(url: str, offset: int, got: int, asked: int, size: Optional[int], key: Optional[str] = None) -> None:
    """Refuse a read that ended before the object does: fsspec takes a refused range (HTTP 416) for
    the end of the file, and a server may cut an answer short."""
    if not isinstance(size, int) or size <= 0:
        return
    expected = size - offset if asked < 0 else min(asked, size - offset)
    if got < expected:
        raise CheckpointFormatError(
            f"The server sent {got} of the {expected} bytes asked for at offset {offset} of {quote_name(url)} "
            f"({size} bytes): it refused the range (HTTP 416), cut the answer short, or the object changed while "
            "it was read. Try again, or re-upload it.", path=url, key=key)


#: The largest range one request reads (a larger tensor takes several): each request then has
#: the whole ``CKPTMERGE_REMOTE_DEADLINE`` for at most this many bytes.
_PIECE = 64 << 20


class RemoteFile:
    """One remote data file, read by ranges (thread-safe: each read is its own request).

    Example:
        >>> f = RemoteFile("s3://bucket/run/ckpt-10.data-00000-of-00001")  # doctest: +SKIP
        >>> f.readinto(4096, memoryview(bytearray(1024)))                     # doctest: +SKIP
        1024
    """

    def __init__(self, url: str) -> None:
        self.url = url
        self.fs, self.path = filesystem(url)
        self._size: Optional[int] = None

    @property
    def size(self) -> int:
        """The object's size in bytes (looked up once)."""
        if self._size is None:
            self._size = remote_size(self.url)
        return self._size

    def readinto(self, offset: int, view: memoryview, *, key: Optional[str] = None) -> int:
        """Fill ``view`` with the bytes at ``offset``; return how many arrived (fewer: the file ended)."""
        n = len(view)
        if n == 0:
            return 0
        done = 0
        for start in range(offset, offset + n, _PIECE):  # each piece has the whole deadline
            end = min(start + _PIECE, offset + n)
            data = _with_retries(f"reading {end - start} bytes at offset {start}" +
                                 (f" of tensor {key!r}" if key else ""), self.url,
                                 lambda t, a=start, b=end: _call(self.fs, "cat_file", self.path, start=a, end=b,
                                                                 timeout=t),
                                 key=key)
            got = min(len(data), end - start)
            view[done:done + got] = data[:got]
            done += got
            if got < end - start:  # the object ended (or, if it is longer, the server cut the answer)
                _check_length(self.url, start, got, end - start, self._size, key)
                break
        return done
