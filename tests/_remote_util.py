"""Shared pieces of the remote tests: a training run to serve, and a real S3 API on localhost.

:func:`write_run` writes a CheckpointManager folder (steps 100 and 200) with TensorFlow.

:func:`start_s3` starts ``moto.server.ThreadedMotoServer`` on a free loopback port, puts
:class:`S3Proxy` in front of it and points s3fs at the proxy (``AWS_ENDPOINT_URL`` for child
processes, fsspec's config in this one): the same HTTP API a bucket speaks, no mocks of ckptmerge.

The proxy injects faults: ``fail_ranged`` ranged GETs answer 500 or drop the connection
(``mode``), and ``hook(method, path)`` is asked before each request is forwarded: ``None``
forwards it, an int answers with that status, ``"drop"`` closes the connection, ``"stall"``
answers nothing (until :meth:`S3Proxy.close`, at most ``stall_limit`` seconds), ``"stall-body"``
forwards it and sends the store's headers and half its body, then stalls; ``after(method,
path, status)`` runs once the store has answered, before the client hears it (return ``"drop"``
to keep the answer from it). The SIGKILL and SIGINT sweeps kill or interrupt a merge at a chosen
request through these.
"""

from __future__ import annotations

import http.client
import os
import socket
import threading
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple

_ERROR_BODY = {403: b"<Error><Code>AccessDenied</Code><Message>injected</Message></Error>",
               500: b"<Error><Code>InternalError</Code><Message>injected</Message></Error>"}


def write_run(directory: Path, w: Any, big: Any) -> None:
    """A CheckpointManager folder: steps 100 (``w``) and 200 (``2 * w``), a tensor ``big``, a state file."""
    import tensorflow as tf

    m = tf.Module()
    m.w = tf.Variable(w, name="w")
    m.big = tf.Variable(big, name="big")
    mgr = tf.train.CheckpointManager(tf.train.Checkpoint(model=m), str(directory), max_to_keep=5)
    mgr.save(100)
    m.w.assign(w * 2)
    mgr.save(200)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class S3Proxy:
    """Forwards HTTP to the S3 server, injecting the faults the module docstring describes."""

    def __init__(self, upstream_port: int) -> None:
        self.upstream = upstream_port
        self.fail_ranged = 0
        self.mode = "500"
        self.ranged_gets = 0
        self.hook: Optional[Callable[[str, str], Any]] = None
        self.after: Optional[Callable[[str, str, int], Any]] = None
        self.log: List[Tuple[str, str, int]] = []
        self.stall_limit = 30.0
        self._closing = threading.Event()
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a):  # quiet
                pass

            def _drop(self):
                self.close_connection = True
                try:
                    self.connection.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

            def _status(self, status: int) -> None:
                msg = _ERROR_BODY.get(status, b"")
                self.send_response(status)
                self.send_header("Content-Length", str(len(msg)))
                self.end_headers()
                if self.command != "HEAD":  # (a HEAD answer has no body: one would be read as the next answer)
                    self.wfile.write(msg)

            def _forward(self):
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else None
                action = proxy.hook(self.command, self.path) if proxy.hook else None
                if action == "drop":
                    return self._drop()
                if action == "stall":
                    proxy.log.append((self.command, self.path, 0))
                    proxy._closing.wait(proxy.stall_limit)
                    return self._drop()
                if isinstance(action, int):
                    proxy.log.append((self.command, self.path, action))
                    return self._status(action)
                if self.command == "GET" and "Range" in self.headers:
                    proxy.ranged_gets += 1
                    if proxy.fail_ranged > 0:
                        proxy.fail_ranged -= 1
                        if proxy.mode == "drop":
                            return self._drop()
                        return self._status(500)
                conn = http.client.HTTPConnection("127.0.0.1", proxy.upstream, timeout=30)
                conn.request(self.command, self.path, body=body, headers=dict(self.headers))
                resp = conn.getresponse()
                data = resp.read()
                conn.close()
                proxy.log.append((self.command, self.path, resp.status))
                if proxy.after is not None and proxy.after(self.command, self.path, resp.status) == "drop":
                    return self._drop()
                self.send_response(resp.status)
                head = self.command == "HEAD"  # keep the upstream's Content-Length: the object's size
                for k, v in resp.getheaders():
                    if k.lower() not in ("transfer-encoding", "connection") and (head or k.lower() != "content-length"):
                        self.send_header(k, v)
                if not head:
                    self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                if action == "stall-body":
                    self.wfile.write(data[: len(data) // 2])
                    self.wfile.flush()
                    proxy._closing.wait(proxy.stall_limit)
                    return self._drop()
                self.wfile.write(data)

            do_GET = do_PUT = do_POST = do_HEAD = do_DELETE = _forward

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self._closing.set()
        self.server.shutdown()
        self.server.server_close()


def start_s3(upload: Optional[Path] = None, *, bucket: str = "ckpts") -> Iterator[Dict[str, Any]]:
    """Yield ``{"proxy", "env", "url", "fs"}`` with a bucket (holding ``upload``'s files under
    ``s3://<bucket>/run``); for a module-scoped fixture: ``yield from start_s3(d)``."""
    import aiobotocore.session
    import fsspec
    from moto.server import ThreadedMotoServer

    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    # moto keeps its buckets in this process's memory, across servers: start from none
    urllib.request.urlopen(urllib.request.Request(f"http://127.0.0.1:{port}/moto-api/reset", method="POST"),
                           timeout=30).close()
    proxy = S3Proxy(port)
    endpoint = f"http://127.0.0.1:{proxy.port}"
    # AWS_MAX_ATTEMPTS=1: botocore's own retries (up to 5 attempts, backing off for seconds) would
    # hide the faults the proxy injects behind ckptmerge's retries, and make a persistent one slow
    env = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1",
           "AWS_ENDPOINT_URL": endpoint, "AWS_MAX_ATTEMPTS": "1"}
    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    # a new filesystem each time (no listing kept from before another process wrote), on one
    # botocore session: its loaded service models make each new client ~6x cheaper to create
    fsspec.config.conf["s3"] = {"client_kwargs": {"endpoint_url": endpoint}, "skip_instance_cache": True,
                                "session": aiobotocore.session.AioSession()}
    fs = fsspec.filesystem("s3")
    fs.mkdir(bucket)
    if upload is not None:
        for f in sorted(upload.iterdir()):
            fs.pipe(f"s3://{bucket}/run/{f.name}", f.read_bytes())
    try:
        yield {"proxy": proxy, "env": env, "url": f"s3://{bucket}/run", "fs": fs}
    finally:
        fsspec.config.conf.pop("s3", None)
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        proxy.close()
        server.stop()
