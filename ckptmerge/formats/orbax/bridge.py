"""The loopback HTTP server through which TensorStore reads Orbax checkpoints at URLs with fsspec.

TensorStore's own drivers speak to a few stores with their own credentials, retries and
timeouts; ckptmerge reads every URL through fsspec and :mod:`ckptmerge.formats.io.storage`, so that
one set of rules (retries with backoff, time limits, redaction, each filesystem's credentials)
holds for every remote reader. TensorStore reads through its ``http`` driver from this server,
which binds ``127.0.0.1`` on a free port, serves each open checkpoint under a random secret
path (:func:`secrets.token_urlsafe`), answers ``GET``/``HEAD`` with or without a byte
``Range`` by fetching exactly those bytes with fsspec, and refuses any key outside the
checkpoint (``..``, absolute, backslash, NUL). An fsspec error (after its retries) is kept for
the reader to raise, and answered with a 4xx so that TensorStore does not retry again.
"""

from __future__ import annotations

import re
import secrets
import threading
import urllib.parse
from typing import Any, Dict, Optional

from ckptmerge.core.errors import CheckpointFormatError, CheckpointNotFoundError, CkptMergeError
from ckptmerge.formats.io import storage
from ckptmerge.core.text import escape_name, quote_name

__all__ = ["Bridge", "bridge", "safe_key"]


_BAD_COMPONENT = re.compile(r"^\.{1,2}$|[\\\x00]")


def safe_key(key: str) -> bool:
    """Whether ``key`` names something inside a checkpoint folder: a relative path of non-empty
    components, none of them ``.`` or ``..``, with no backslash or NUL.

    Example:
        >>> safe_key("params.Dense_0.kernel"), safe_key("../etc"), safe_key("/abs")
        (True, False, False)
    """
    if not isinstance(key, str) or not key or key.startswith("/"):
        return False
    return all(part and not _BAD_COMPONENT.search(part) for part in key.split("/"))


class Bridge:
    """The loopback HTTP server through which TensorStore reads URLs with fsspec (see the module
    docstring). Each registered root gets a random token; requests outside a token's root, or
    with ``..``, are refused."""

    def __init__(self) -> None:
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer  # (only when a URL is read)

        self.roots: Dict[str, str] = {}
        self.errors: Dict[str, CkptMergeError] = {}
        self.sizes: Dict[str, Dict[str, int]] = {}  # token -> {url: size}
        self.lock = threading.Lock()
        bridge = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:  # no stderr output from a library
                pass

            def do_HEAD(self) -> None:  # noqa: N802 - http.server's naming
                bridge.serve(self, body=False)

            def do_GET(self) -> None:  # noqa: N802
                bridge.serve(self, body=True)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, name="ckptmerge-orbax-bridge", daemon=True).start()

    def register(self, root: str) -> str:
        token = secrets.token_urlsafe(16)
        with self.lock:
            self.roots[token] = storage.strip_slash(root)
            self.sizes[token] = {}
        return token

    def unregister(self, token: str) -> None:
        with self.lock:
            self.roots.pop(token, None)
            self.errors.pop(token, None)
            self.sizes.pop(token, None)

    def pop_error(self, token: str) -> Optional[CkptMergeError]:
        """The fsspec error met while serving ``token`` (forgotten once asked for)."""
        with self.lock:
            return self.errors.pop(token, None)

    def base_url(self, token: str) -> str:
        return f"http://127.0.0.1:{self.port}/{token}/"

    def _reply(self, h: Any, code: int, data: bytes = b"", headers: Any = (),
               length: Optional[int] = None) -> None:
        h.send_response(code)
        for k, v in headers:
            h.send_header(k, v)
        h.send_header("Content-Length", str(len(data) if length is None else length))
        h.end_headers()
        if data:
            h.wfile.write(data)

    def serve(self, h: Any, *, body: bool) -> None:
        token, _, rest = h.path.lstrip("/").partition("/")
        with self.lock:
            root = self.roots.get(token)
        key = urllib.parse.unquote(rest.split("?", 1)[0])
        if root is None or not safe_key(key):
            return self._reply(h, 403)
        url = storage.join(root, key)
        try:
            with self.lock:
                size = self.sizes.get(token, {}).get(url)
            if size is None:  # one request: a missing object is a CheckpointNotFoundError
                size = storage.remote_size(url)
                with self.lock:
                    self.sizes.setdefault(token, {})[url] = size
            m = re.fullmatch(r"bytes=(\d+)-(\d*)", h.headers.get("Range") or "")
            start = int(m.group(1)) if m else 0
            end = min(int(m.group(2)) + 1 if m and m.group(2) else size, size)
            if m and start >= size:
                return self._reply(h, 416, headers=[("Content-Range", f"bytes */{size}")])
            code = 206 if m else 200
            ranged = [("Content-Range", f"bytes {start}-{max(start, end) - 1}/{size}")] if m else []
            if not body:
                return self._reply(h, code, length=end - start, headers=ranged)
            buf = bytearray(end - start)
            got = storage.RemoteFile(url).readinto(start, memoryview(buf)) if buf else 0
            if m:
                ranged = [("Content-Range", f"bytes {start}-{start + got - 1}/{size}")]
            return self._reply(h, code, bytes(buf[:got]), ranged)
        except CheckpointNotFoundError:  # gone meanwhile: TensorStore reports the missing data
            return self._reply(h, 404)
        except CkptMergeError as e:  # retried already: tell TensorStore not to retry (a 4xx)
            with self.lock:
                self.errors[token] = e
            return self._reply(h, 400)
        except Exception as e:  # noqa: BLE001 - a broken request must not kill the server
            with self.lock:
                self.errors[token] = CheckpointFormatError(
                    f"Reading {quote_name(url)} failed: {type(e).__name__}: {escape_name(e)}", path=url)
            return self._reply(h, 400)


_BRIDGE: Optional[Bridge] = None
_BRIDGE_LOCK = threading.Lock()


def bridge() -> Bridge:
    """The process's bridge, started on first use.

    Example:
        >>> url = bridge().base_url(bridge().register("memory://run/100/state"))  # doctest: +SKIP
    """
    global _BRIDGE
    with _BRIDGE_LOCK:
        if _BRIDGE is None:
            _BRIDGE = Bridge()
        return _BRIDGE
