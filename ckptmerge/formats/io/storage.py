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
none and reads none. Remote errors become :class:`~ckptmerge.errors.CheckpointFormatError` /
:class:`~ckptmerge.errors.CheckpointNotFoundError` naming the URL; transient ones (throttling,
a reset connection, a 5xx) are retried a bounded number of times with exponential backoff.
"""

from __future__ import annotations

import errno
import inspect
import os
import re
import threading
import time
import zipfile
from typing import Any, Callable, Dict, List, Optional, Tuple, TypeVar

from ckptmerge.errors import (
    CheckpointFormatError,
    CheckpointNotFoundError,
    CkptMergeError,
)
from ckptmerge.formats.io.localfile import open_regular
from ckptmerge.knobs import IntSetting
from ckptmerge.redact import get_logger
from ckptmerge.text import escape_name, quote_name

__all__ = ["is_url", "filesystem", "RemoteFile", "read_small", "remote_exists", "remote_isdir",
           "remote_listdir", "remote_size", "forget_listings", "join", "basename", "dirname", "create_exclusive", "RETRIES",
           "REMOTE_CONCURRENCY", "isfile", "isdir", "exists", "getsize", "listdir", "walk_files", "abspath",
           "open_binary", "open_zip", "REMOTE_BLOCK", "SNIFF_BLOCK"]

logger = get_logger(__name__)

_URL = re.compile(r"^([a-zA-Z][a-zA-Z0-9+.-]+)://")
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


def is_url(path: object) -> bool:
    """True for ``scheme://...`` paths (object storage and other fsspec filesystems).

    Example:
        >>> is_url("s3://bucket/run/ckpt-10"), is_url("runs/A")
        (True, False)
    """
    return isinstance(path, str) and _URL.match(path) is not None


def join(base: str, name: str) -> str:
    """``base/name`` for URLs and local paths alike.

    Example:
        >>> join("s3://b/run", "checkpoint")
        's3://b/run/checkpoint'
    """
    return base.rstrip("/") + "/" + name if is_url(base) else os.path.join(base, name)


def basename(path: str) -> str:
    """The last component of a URL or path (``s3://b/run/ckpt-1`` -> ``ckpt-1``)."""
    return path.rstrip("/").rsplit("/", 1)[-1] if is_url(path) else os.path.basename(path)


def dirname(path: str) -> str:
    """The parent of a URL or path (``s3://b/run/ckpt-1`` -> ``s3://b/run``)."""
    if is_url(path):
        head, _, _ = path.rstrip("/").rpartition("/")
        return head if "://" in head else path
    return os.path.dirname(path)


_FS_LOCK = threading.Lock()


def filesystem(url: str) -> Tuple[Any, str]:
    """``(fsspec filesystem, path within it)`` for a URL, with a clear error for a missing extra.

    Raises:
        CkptMergeError: fsspec or the scheme's filesystem package is not installed.

    Example:
        >>> fs, path = filesystem("memory://run/ckpt")  # doctest: +SKIP
    """
    scheme = _URL.match(url).group(1).lower() if is_url(url) else "file"
    extra = _EXTRAS.get(scheme, "remote")
    try:
        from fsspec.core import url_to_fs
    except ImportError:
        raise CkptMergeError(f"Reading {quote_name(url)} needs fsspec: pip install \"ckptmerge[{extra}]\"") from None
    try:
        with _FS_LOCK:
            fs, path = url_to_fs(url)
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


def _with_retries(what: str, url: str, fn: Callable[[], T], *, key: Optional[str] = None) -> T:
    delay = 0.05
    attempts = RETRIES.get()
    for attempt in range(1, attempts + 1):
        try:
            return fn()
        except FileNotFoundError:
            raise CheckpointNotFoundError(f"{quote_name(url)} does not exist (while {what}).", path=url) from None
        except PermissionError as e:
            raise CheckpointFormatError(f"Access denied to {quote_name(url)} while {what}: {escape_name(e)}. Check "
                                        "the credentials your storage library uses (ckptmerge passes none).", path=url,
                                        key=key) from None
        except CkptMergeError:
            raise
        except Exception as e:  # noqa: BLE001 - every library raises its own types
            if not _transient(e) or attempt == attempts:
                tail = f" after {attempt} attempts" if attempt > 1 else ""
                raise CheckpointFormatError(f"Remote error while {what} from {quote_name(url)}{tail}: "
                                            f"{type(e).__name__}: {escape_name(e)}", path=url, key=key) from None
            logger.info("retrying %s from %s after %s: %s (attempt %d of %d)", what, url, type(e).__name__,
                        e, attempt, attempts)
            time.sleep(delay)
            delay *= 4
    raise AssertionError("unreachable")  # pragma: no cover


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
    return _with_retries("fetching", url, lambda: fs.cat_file(path))


def remote_size(url: str) -> int:
    """The size in bytes of a remote file."""
    fs, path = filesystem(url)
    info = _with_retries("looking up", url, lambda: fs.info(path))
    if info.get("type") == "directory":
        raise CheckpointFormatError(f"{quote_name(url)} is a directory, not a file.", path=url)
    return int(info.get("size") or 0)


def remote_exists(url: str) -> bool:
    """Whether a remote file exists (a directory does not count)."""
    fs, path = filesystem(url)
    try:
        return bool(_with_retries("looking up", url, lambda: fs.isfile(path)))
    except CheckpointNotFoundError:
        return False


def remote_isdir(url: str) -> bool:
    """Whether a remote path is a directory (a prefix with objects below it)."""
    fs, path = filesystem(url)
    return bool(_with_retries("looking up", url, lambda: fs.isdir(path)))


def remote_listdir(url: str) -> List[Dict[str, Any]]:
    """``[{"name": basename, "size": int, "type": "file"|"directory", "mtime": float|None}]``."""
    fs, path = filesystem(url)
    entries = _with_retries("listing", url, lambda: fs.ls(path, detail=True))
    out = []
    for e in entries:
        name = str(e.get("name", "")).rstrip("/").rsplit("/", 1)[-1]
        mtime = e.get("mtime") or e.get("LastModified") or e.get("created")
        if hasattr(mtime, "timestamp"):
            mtime = mtime.timestamp()
        out.append({"name": name, "size": int(e.get("size") or 0), "type": e.get("type", "file"),
                    "mtime": float(mtime) if isinstance(mtime, (int, float)) else None})
    return out


def forget_listings(url: str) -> None:
    """Drop the filesystem's cached listings of ``url`` and below, so the next listing asks the
    store (fsspec caches directory listings; a watcher polling a prefix must see new objects).

    Example:
        >>> forget_listings("memory://run")  # doctest: +SKIP
    """
    fs, path = filesystem(url)
    try:
        fs.invalidate_cache(path)
    except (AttributeError, NotImplementedError):  # pragma: no cover - a filesystem without a cache
        pass


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
    if type(fs).__name__ == "LocalFileSystem":  # file://: O_EXCL is the exclusive create
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            return False
        except OSError as e:
            raise CheckpointFormatError(f"Cannot create {quote_name(url)}: {escape_name(e)}", path=url) from None
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        return True
    if not _has_exclusive_create(fs):
        raise CkptMergeError(
            f"Cannot create the lock {quote_name(url)}: the {type(fs).__name__} filesystem has no atomic "
            "create-if-absent, so two merges to one output could not be kept apart. Make sure only one "
            "merge writes there and set CKPTMERGE_REMOTE_LOCK=0 to merge without the lock.")

    def put() -> bool:
        try:
            fs.pipe_file(path, data, mode="create")
        except FileExistsError:
            return False
        return True

    return _with_retries("creating", url, put)


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
    found = _with_retries("listing", root, lambda: fs.find(base))
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
    an fsspec file that reads by ranges, keeping up to 32 blocks of ``block_size`` bytes
    (h5py and zipfile seek around: metadata, then the data they want; sniffing a format needs
    only :data:`SNIFF_BLOCK`).

    Raises:
        FileNotFoundError, OSError: as ``open`` does (readers turn them into their errors).
    """
    if not is_url(path):
        return os.fdopen(open_regular(path), "rb")  # (never a FIFO or a device)
    fs, fpath = filesystem(path)
    block_size = block_size or REMOTE_BLOCK.get()
    try:
        return _with_retries("opening", path, lambda: fs.open(fpath, "rb", block_size=block_size,
                                                              cache_type="blockcache",
                                                              cache_options={"maxblocks": 32}))
    except CheckpointNotFoundError:
        raise FileNotFoundError(path) from None
    except CkptMergeError as e:
        raise OSError(str(e)) from None


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
    return _OwningZip(open_binary(path, block_size)) if is_url(path) else zipfile.ZipFile(path)


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
        data = _with_retries(f"reading {n} bytes at offset {offset}" + (f" of tensor {key!r}" if key else ""),
                             self.url, lambda: self.fs.cat_file(self.path, start=offset, end=offset + n), key=key)
        got = min(len(data), n)
        view[:got] = data[:got]
        return got
