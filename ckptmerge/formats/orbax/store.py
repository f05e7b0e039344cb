"""Where an Orbax checkpoint's bytes are, as TensorStore sees them: local folders and URLs.

Orbax keeps array data in TensorStore formats (zarr v2 or zarr3 arrays, inside an OCDBT
database or in one folder per array); ckptmerge lets ``tensorstore`` decode them and reads the
JSON around them itself. :class:`Location` is one item folder: small files (``_METADATA``,
``_strings.json``, zarr metadata of the folder layout) are read by ckptmerge with a size cap,
and :meth:`Location.kvstore` gives the TensorStore key-value store spec for the arrays.

Local folders use TensorStore's ``file`` driver; nothing below the folder may be a symbolic
link (TensorStore would follow it out of the checkpoint; its ``file`` driver already refuses
``..`` in keys). A URL (``s3://``, ``gs://``, ``memory://``, any fsspec filesystem) goes
through fsspec like every other remote reader, so its retries, timeouts, credentials and
redaction are those of :mod:`ckptmerge.formats.io.storage`: a small HTTP server on the loopback
interface (one per process, started on first use) serves TensorStore's
``http`` driver the byte ranges it asks for, each fetched with fsspec, only for keys inside
the checkpoint, under a random secret path per open checkpoint (:mod:`~ckptmerge.formats.orbax.bridge`). Every TensorStore future is
waited for with a time bound for URLs (:data:`REMOTE_TIMEOUT`, ``CKPTMERGE_REMOTE_DEADLINE``).
"""

from __future__ import annotations

import json
import os
import posixpath
import urllib.parse
import stat
from typing import Any, Dict, List, Optional, Tuple

from ckptmerge.core.errors import CheckpointFormatError, CheckpointNotFoundError, CkptMergeError, UnsafeCheckpointError
from ckptmerge.formats.io import storage
from ckptmerge.core import limits
from ckptmerge.formats.io.localfile import describe_kind, open_regular
from ckptmerge.formats.io.remote_policy import DEADLINE
from ckptmerge.formats.orbax.bridge import bridge
from ckptmerge.core.redact import get_logger
from ckptmerge.core.text import escape_name, quote_name

__all__ = ["load_tensorstore", "Location", "wait", "join_key", "REMOTE_TIMEOUT", "MAX_JSON", "INSTALL_HINT",
           "not_a_checkpoint_file"]

logger = get_logger(__name__)

#: How to install what reading Orbax checkpoints needs.
INSTALL_HINT = 'pip install "ckptmerge[orbax]"'
#: Largest JSON file (``_METADATA``, ``_strings.json``, zarr metadata) read: 512 MiB holds
#: the metadata of millions of arrays.
MAX_JSON = 512 << 20
#: Seconds one TensorStore read over a URL may take before it is given up: one remote read's
#: deadline (``CKPTMERGE_REMOTE_DEADLINE``, default 300), read and checked when a URL is read.
REMOTE_TIMEOUT = DEADLINE

_TS: Any = None


def load_tensorstore() -> Any:
    """The ``tensorstore`` module, imported on first use, with an install hint if it is missing.

    Raises:
        CkptMergeError: tensorstore is not installed.

    Example:
        >>> ts = load_tensorstore()  # doctest: +SKIP
    """
    global _TS
    if _TS is None:
        try:
            import tensorstore
        except ImportError as e:
            cause: Optional[BaseException] = e
            while cause is not None:  # Ctrl-C while its extension initialised: an interrupt, not a missing package
                if isinstance(cause, KeyboardInterrupt):
                    raise KeyboardInterrupt from None
                cause = cause.__cause__ or cause.__context__
            raise CkptMergeError(
                f"Reading or writing Orbax checkpoints needs the 'tensorstore' package ({escape_name(e)}). "
                f"Install it with: {INSTALL_HINT}") from None
        _TS = tensorstore
    return _TS


def wait(future: Any, what: str, where: "Location", *, key: Optional[str] = None) -> Any:
    """The result of a TensorStore future; a URL's wait is bounded by :data:`REMOTE_TIMEOUT`,
    and its errors name the URL rather than the loopback address they went through.

    Raises:
        CheckpointFormatError: TensorStore failed or the time ran out (naming ``what``).
    """
    limit = REMOTE_TIMEOUT.get() if where.is_url else None
    try:
        return future.result(timeout=limit)
    except TimeoutError:
        future.cancel()
        raise CheckpointFormatError(
            f"Timed out after {limit:g} s while {what} from {quote_name(where.display)} "
            "(CKPTMERGE_REMOTE_DEADLINE sets the limit).", path=where.root, key=key) from None
    except Exception as e:  # noqa: BLE001 - TensorStore raises ValueError, OSError, ...
        raise where.error_from(e, what, key=key) from None


class Location:
    """One Orbax item (or step) folder: a local directory or a URL.

    Attributes:
        root: the absolute path or URL of the folder.
        is_url: whether it is read through fsspec.

    Example:
        >>> loc = Location("/ckpts/run/100/state")  # doctest: +SKIP
        >>> loc.read_json("_METADATA")["use_ocdbt"]     # doctest: +SKIP
        True
    """

    def __init__(self, root: str) -> None:
        self.is_url = storage.is_url(root)
        self.root = storage.strip_slash(root) if self.is_url else os.path.realpath(root)
        self.display = root
        self._token: Optional[str] = None
        self._listings: Dict[str, Optional[Dict[str, Dict[str, Any]]]] = {}

    # -- files ---------------------------------------------------------------------------------
    def path(self, rel: str = "") -> str:
        """The path or URL of ``rel`` below the folder."""
        if not rel:
            return self.root
        return storage.join(self.root, rel) if self.is_url else os.path.join(self.root, *rel.split("/"))

    def child(self, rel: str) -> "Location":
        """The Location of the folder ``rel`` below this one, knowing what this one listed."""
        out = Location(self.path(rel))
        rel = rel.strip("/")
        out._listings = {k[len(rel) + 1:] if k != rel else "": v for k, v in self._listings.items()
                         if k == rel or k.startswith(rel + "/")}
        return out

    # A URL's folders are listed once each (one request answers every exists/isdir/listdir below
    # it); a local folder asks the OS each time.
    def _listing(self, rel: str) -> Optional[Dict[str, Dict[str, Any]]]:
        if rel not in self._listings:
            try:
                entries = storage.remote_listdir(self.path(rel))
            except CheckpointNotFoundError:
                entries = None
            self._listings[rel] = {e["name"]: e for e in entries} if entries else None
        return self._listings[rel]

    def _entry(self, rel: str) -> Optional[Dict[str, Any]]:
        parent, _, name = rel.strip("/").rpartition("/")
        return (self._listing(parent) or {}).get(name)

    def exists(self, rel: str) -> bool:
        """Whether the file ``rel`` exists (a directory does not count)."""
        if self.is_url:
            e = self._entry(rel)
            return e is not None and e.get("type") != "directory"
        return os.path.isfile(self.path(rel))

    def isdir(self, rel: str = "") -> bool:
        """Whether ``rel`` is a directory."""
        if self.is_url:
            if not rel:
                return self._listing("") is not None
            e = self._entry(rel)
            return e is not None and e.get("type") == "directory"
        return os.path.isdir(self.path(rel))

    def listdir(self, rel: str = "") -> List[str]:
        """The names in directory ``rel``, sorted."""
        if self.is_url:
            return sorted(self._listing(rel.strip("/")) or {})
        return sorted(os.listdir(self.path(rel)))

    def read_bytes(self, rel: str, limit: int = MAX_JSON) -> Optional[bytes]:
        """The whole small file ``rel``, or ``None`` if it does not exist.

        Raises:
            CheckpointFormatError: it is larger than ``limit``, not a regular file, or unreadable.
        """
        p = self.path(rel)
        if self.is_url:
            entry = self._entry(rel)
            if entry is None or entry.get("type") == "directory":
                return None
            size = int(entry.get("size") or 0)
            if size > limit:
                raise CheckpointFormatError(f"{quote_name(p)} is larger than the {limit}-byte limit for a metadata "
                                            "file; it is not Orbax metadata.", path=p)
            buf = bytearray(size)
            got = storage.RemoteFile(p).readinto(0, memoryview(buf)) if size else 0
            return bytes(buf[:got])
        if not os.path.lexists(p):
            return None
        self.check_file(rel)
        try:
            with os.fdopen(open_regular(p), "rb") as f:
                data = f.read(limit + 1)
        except OSError as e:
            raise CheckpointFormatError(f"Cannot read {quote_name(p)}: {escape_name(e.strerror or e)}", path=p) from None
        if len(data) > limit:
            raise CheckpointFormatError(f"{quote_name(p)} is larger than the {limit}-byte limit for a metadata "
                                        "file; it is not Orbax metadata.", path=p)
        return data

    def read_range(self, rel: str, offset: int, length: int) -> bytes:
        """Exactly ``length`` bytes at ``offset`` of the file ``rel`` (an OCDBT node or value).

        Raises:
            CheckpointFormatError: the range goes past the file's end, or the file is missing or
                unreadable.
            UnsafeCheckpointError: it is not a regular file (a link, a directory or a device).
        """
        p = self.path(rel)
        if self.is_url:
            entry = self._entry(rel)
            size = int(entry.get("size") or 0) if entry is not None and entry.get("type") != "directory" else None
        else:
            self.check_file(rel)
            size = os.path.getsize(p) if os.path.exists(p) else None
        if size is None:
            raise CheckpointFormatError(f"{quote_name(p)} is missing; the checkpoint is incomplete. Re-copy it.",
                                        path=p)
        if offset < 0 or length < 0 or offset + length > size:
            raise CheckpointFormatError(f"{quote_name(p)} has {size} bytes, but the checkpoint's index points at "
                                        f"{length} bytes at offset {offset}; the file is truncated or damaged.",
                                        path=p)
        buf = bytearray(length)
        if self.is_url:
            got = storage.RemoteFile(p).readinto(offset, memoryview(buf)) if length else 0
        else:
            try:
                with os.fdopen(open_regular(p), "rb") as f:
                    got = f.readinto(memoryview(buf)) if f.seek(offset) == offset and length else 0
            except OSError as e:
                raise CheckpointFormatError(f"Cannot read {quote_name(p)}: {escape_name(e.strerror or e)}",
                                            path=p) from None
        if got != length:
            raise CheckpointFormatError(f"{quote_name(p)} ended after {got} of the {length} bytes at offset {offset}; "
                                        "the file is truncated.", path=p)
        return bytes(buf)

    def read_json(self, rel: str, limit: int = MAX_JSON) -> Any:
        """The parsed JSON file ``rel``, or ``None`` if it does not exist.

        Raises:
            CheckpointFormatError: it is not valid JSON (or as :meth:`read_bytes`).
        """
        data = self.read_bytes(rel, limit)
        if data is None:
            return None
        try:
            return json.loads(data.decode("utf-8"))
        except (UnicodeDecodeError, ValueError, RecursionError) as e:
            raise CheckpointFormatError(
                f"Orbax metadata file {quote_name(self.path(rel))} is not valid JSON ({type(e).__name__}: "
                f"{escape_name(str(e)[:80])}); the checkpoint is damaged. Re-copy it.", path=self.path(rel)) from None

    def tree_size(self, rel: str = "") -> int:
        """The bytes stored below ``rel`` (every file); for a local folder also checks that each
        entry is a regular file or a folder (:meth:`check_tree`).

        Raises:
            UnsafeCheckpointError: a symbolic link, FIFO, socket or device below the folder.
        """
        if self.is_url:
            top = self.path(rel)
            fs, path = storage.filesystem(top)
            try:
                return int(fs.du(path, total=True) or 0)
            except Exception as e:  # noqa: BLE001 - every filesystem raises its own
                raise CheckpointFormatError(f"Cannot list {quote_name(top)}: {type(e).__name__}: {escape_name(e)}",
                                            path=top) from None
        return self.check_tree(rel)[0]

    def check_tree(self, rel: str = "") -> Tuple[int, int, str]:
        """``(bytes, depth, folder)`` of the local folder ``rel``: the bytes of its files, and its
        deepest folder (``depth`` levels below ``rel``, 0 if none; ``folder`` its path).

        Every entry below must be a regular file or a folder: TensorStore opens the files of an
        array's chunks itself, and a FIFO would block it forever, a device never end, a symbolic
        link lead outside the checkpoint. Nothing but lstat is done (no file is opened).

        Raises:
            UnsafeCheckpointError: a symbolic link, FIFO, socket or device below the folder,
                naming it.

        Example:
            >>> Location("ckpt/state").check_tree("params.w")  # doctest: +SKIP
            (1372, 0, '')
        """
        top = self.path(rel)
        total, depth, deepest = 0, 0, ""
        base = top.rstrip(os.sep).count(os.sep)
        for dirpath, dirnames, filenames in os.walk(top, followlinks=False):
            for n in dirnames + filenames:
                p = os.path.join(dirpath, n)
                try:
                    st = os.lstat(p)
                except OSError:  # removed while we looked: TensorStore will find it missing
                    continue
                if stat.S_ISREG(st.st_mode):
                    total += st.st_size
                elif stat.S_ISDIR(st.st_mode):
                    d = p.count(os.sep) - base
                    if d > depth:
                        depth, deepest = d, p
                else:
                    raise not_a_checkpoint_file(p, st.st_mode)
        return total, depth, deepest

    def check_file(self, rel: str) -> None:
        """Refuse the local entry ``rel`` when it is there but is not a regular file (see
        :func:`not_a_checkpoint_file`); a missing one passes (the caller reports it).

        Raises:
            UnsafeCheckpointError: it is a link, folder, FIFO, socket or device.
        """
        if self.is_url:
            return
        p = self.path(rel)
        try:
            mode = os.lstat(p).st_mode
        except OSError:
            return
        if not stat.S_ISREG(mode):
            raise not_a_checkpoint_file(p, mode)

    # -- TensorStore ---------------------------------------------------------------------------
    def kvstore(self, rel: str = "") -> Dict[str, Any]:
        """The TensorStore kvstore spec of directory ``rel`` (with a trailing ``/``)."""
        if not self.is_url:
            return {"driver": "file", "path": self.path(rel).rstrip("/") + "/"}
        served = bridge()
        if self._token is None:
            self._token = served.register(self.root)
        base = served.base_url(self._token) + (urllib.parse.quote(rel.strip("/")) + "/" if rel else "")
        return {"driver": "http", "base_url": base}

    def error_from(self, e: BaseException, what: str, *, key: Optional[str] = None) -> CkptMergeError:
        """The error to raise for TensorStore's error ``e`` while ``what``: for a URL the fsspec error
        behind it when there was one; messages name the checkpoint, never the loopback address."""
        text = str(e)
        if self._token is not None:
            behind = bridge().pop_error(self._token)
            if behind is not None:
                return behind
            text = text.replace(bridge().base_url(self._token), self.root + "/")
        exhausted = limits.resource_error(e, self.display, doing="read")
        if exhausted is not None:  # TensorStore ran out of open files: nothing is damaged
            return exhausted
        return CheckpointFormatError(
            f"Cannot read Orbax checkpoint {quote_name(self.display)} while {what}: {escape_name(text[:400])}. "
            "The checkpoint is damaged or incomplete; re-copy it, or save it again with Orbax.",
            path=self.root, key=key)

    def close(self) -> None:
        """Stop serving this folder through the bridge (a local folder holds nothing open)."""
        if self._token is not None:
            bridge().unregister(self._token)
            self._token = None

    def __repr__(self) -> str:
        return f"<Location {self.display!r}>"


def not_a_checkpoint_file(path: str, mode: int) -> UnsafeCheckpointError:
    """The error for ``path`` inside an Orbax checkpoint that is not a regular file or folder
    (``mode``: its lstat mode): what it is, that ckptmerge never opens it, and what to do.

    Example:
        >>> import stat
        >>> str(not_a_checkpoint_file("/c/state/d/ab12", stat.S_IFIFO))[:42]
        "'/c/state/d/ab12' is a FIFO (named pipe), "
    """
    if stat.S_ISLNK(mode):
        return UnsafeCheckpointError(
            f"{quote_name(path)} is a symbolic link; ckptmerge reads nothing outside the checkpoint folder, "
            "so an Orbax checkpoint may hold no links. Copy the files in place of the link.", path=path)
    kind = describe_kind(mode)
    if stat.S_ISDIR(mode):
        return UnsafeCheckpointError(
            f"{quote_name(path)} is a directory where the Orbax checkpoint keeps a file; ckptmerge never reads a "
            "folder as data (TensorStore would take it for missing data). Remove it, "
            "or copy the checkpoint again from where it was saved.", path=path)
    return UnsafeCheckpointError(
        f"{quote_name(path)} is {kind}, not a regular file; an Orbax checkpoint holds only files and folders, and "
        "ckptmerge never opens anything else as data (reading it could block forever or never end). Remove it, "
        "or copy the checkpoint again from where it was saved.", path=path)


def join_key(*parts: str) -> str:
    """``/``-joined key parts, without empty ones (``join_key("a", "", "b") == "a/b"``)."""
    return posixpath.join(*[p for p in parts if p]) if any(parts) else ""
