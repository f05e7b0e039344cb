"""A small HTTP file server on localhost for the remote tests, with faults on demand.

It serves a dict of ``{"/path": bytes}`` as a plain static server does (HEAD, GET, ``Range``),
ignores query strings as many servers do (``?download=true``), records every request, and can
answer chosen requests with a status, a stall or a dropped connection:

    server.fault(status=500, method="GET", ranged=True, times=1)   # the first ranged GET fails
    server.fault(stall=True)                                        # every request hangs
    server.fault(partial=True, ranged=True)                         # bytes stop half-way

Stalls wait on an event that :meth:`FileServer.close` sets, bounded by ``stall_limit`` seconds,
so a test never leaves a thread hanging. Only 127.0.0.1 is ever bound.
"""

from __future__ import annotations

import re
import socket
import threading
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Dict, List, Optional, Tuple


@dataclass
class Fault:
    """Answer matching requests with ``status`` (and ``body``), a stall, or a dropped connection."""

    status: Optional[int] = None
    stall: bool = False
    partial: bool = False  # send the headers and half the body, then stall
    short: bool = False  # answer a range with half of it (a consistent, shorter 206)
    drop: bool = False
    method: Optional[str] = None  # "GET", "HEAD" or None for any
    ranged: Optional[bool] = None  # only ranged GETs (True), only whole ones (False), or any
    path: Optional[str] = None  # a regex the path (without query) must match
    times: Optional[int] = None  # how many requests it answers (None: all)
    body: bytes = b""
    headers: Tuple[Tuple[str, str], ...] = ()

    def matches(self, method: str, path: str, ranged: bool) -> bool:
        return (self.times is None or self.times > 0) and (self.method in (None, method)) and \
            (self.ranged is None or self.ranged == ranged) and (self.path is None or re.search(self.path, path) is not None)


class FileServer:
    """Serve ``files`` on ``http://127.0.0.1:<port>``; see the module docstring."""

    def __init__(self, files: Optional[Dict[str, bytes]] = None, *, stall_limit: float = 30.0) -> None:
        self.files: Dict[str, bytes] = dict(files or {})
        self.faults: List[Fault] = []
        self.requests: List[Tuple[str, str, Optional[str]]] = []
        self.stall_limit = stall_limit
        self._closing = threading.Event()
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a):  # quiet
                pass

            def do_HEAD(self):
                self._answer(head=True)

            def do_GET(self):
                self._answer(head=False)

            def _send(self, status: int, body: bytes, headers=(), head: bool = False) -> None:
                self.send_response(status)
                for k, v in headers:
                    self.send_header(k, v)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                if not head:
                    self.wfile.write(body)

            def _answer(self, head: bool) -> None:
                path = self.path.split("?", 1)[0].split("#", 1)[0]
                rng = self.headers.get("Range")
                server.requests.append((self.command, self.path, rng))
                fault = server._fault(self.command, path, rng is not None)
                if fault is not None and not (fault.partial or fault.short):
                    if fault.stall:
                        server._closing.wait(server.stall_limit)
                        self.close_connection = True
                        return
                    if fault.drop:
                        self.close_connection = True
                        self.connection.shutdown(socket.SHUT_RDWR)
                        return
                    self._send(fault.status or 500, fault.body, fault.headers, head)
                    return
                data = server.files.get(path)
                if data is None:
                    self._send(404, b"not found", head=head)
                    return
                if rng:
                    m = re.fullmatch(r"bytes=(\d+)-(\d*)", rng)
                    start = int(m.group(1))
                    end = min(int(m.group(2)) if m.group(2) else len(data) - 1, len(data) - 1)
                    if start >= len(data):
                        self._send(416, b"", (("Content-Range", f"bytes */{len(data)}"),), head)
                        return
                    body = data[start:end + 1]
                    if fault is not None and fault.short:
                        end = start + max(0, len(body) // 2 - 1)
                        body = body[: len(body) // 2]
                    if fault is not None and fault.partial:
                        self.send_response(206)
                        self.send_header("Content-Range", f"bytes {start}-{end}/{len(data)}")
                        self.send_header("Content-Length", str(len(body)))
                        self.end_headers()
                        self.wfile.write(body[: len(body) // 2])
                        self.wfile.flush()
                        server._closing.wait(server.stall_limit)
                        self.close_connection = True
                        return
                    self._send(206, body, (("Content-Range", f"bytes {start}-{end}/{len(data)}"),
                                           ("Accept-Ranges", "bytes")), head)
                    return
                if head:  # the size, as a static server tells it
                    self.send_response(200)
                    self.send_header("Content-Length", str(len(data)))
                    self.send_header("Accept-Ranges", "bytes")
                    self.end_headers()
                    return
                self._send(200, data, (("Accept-Ranges", "bytes"),))

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self._thread.start()

    def _fault(self, method: str, path: str, ranged: bool) -> Optional[Fault]:
        for f in self.faults:
            if f.matches(method, path, ranged):
                if f.times is not None:
                    f.times -= 1
                return f
        return None

    def fault(self, **kwargs) -> Fault:
        """Add a :class:`Fault` (first match wins) and return it."""
        f = Fault(**kwargs)
        self.faults.append(f)
        return f

    def close(self) -> None:
        self._closing.set()
        self.server.shutdown()
        self.server.server_close()
