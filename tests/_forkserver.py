"""A warm interpreter that forks one real process per run, for tests that start many short Python
processes (the kill and interrupt sweeps).

Each run is a process of its own: its own pid, killed or interrupted by real signals, its exit
status seen as ``subprocess`` reports it (negative: killed by that signal), its stdout and stderr
kept apart. What it saves is the start-up: the server imports ``preload`` (ckptmerge's CLI, s3fs,
...) once, and every child forked from it starts with them imported, as a ``python -m ckptmerge``
process would have them after its first second or two.

A child takes the run's arguments (as after ``python``: ``-m module args...`` or ``-c code
args...``), environment and working directory, runs the code as ``__main__``, then exits as an
interpreter does: ``SystemExit`` codes, a traceback and 1 for an exception, killed by SIGINT for
an uncaught ``KeyboardInterrupt``, after the ``atexit`` handlers and non-daemon threads.

Only the server's main thread exists when it forks (it starts none), so no child inherits a lock
held by another thread.

Example::

    with ForkServer(["ckptmerge.cli"], env=env) as server:
        child = server.start(["-m", "ckptmerge", "ls", path])
        out, err = child.communicate(timeout=60)
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
from pathlib import Path
from typing import Any, Dict, Mapping, Optional, Sequence, Tuple

REPO = Path(__file__).resolve().parents[1]

_SERVER = r"""
import json, os, select, signal, sys
for _name in sys.argv[1:]:
    __import__(_name)
import atexit, runpy, tempfile, threading, traceback

_answers = os.fdopen(os.dup(1), "w", buffering=1)
_null = os.open(os.devnull, os.O_RDWR)
os.dup2(_null, 1)  # nothing the server (or a preloaded module) prints mixes with the answers


def _child(req):
    _answers.close()
    os.chdir(req["cwd"])
    os.environ.clear()
    os.environ.update(req["env"])
    tempfile.tempdir = None
    os.dup2(_null, 0)
    for fd, path in ((1, req["stdout"]), (2, req["stderr"])):
        os.dup2(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), fd)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    args, code = req["args"], 0
    try:
        try:
            if args[0] == "-m":
                sys.argv = [args[1], *args[2:]]
                runpy.run_module(args[1], run_name="__main__", alter_sys=True)
            else:
                sys.argv = ["-c", *args[2:]]
                exec(compile(args[1], "<string>", "exec"), {"__name__": "__main__", "__builtins__": __builtins__})
        except SystemExit as e:
            if e.code is None or isinstance(e.code, int):
                code = e.code or 0
            else:
                print(e.code, file=sys.stderr)
                code = 1
        except BaseException as e:  # the traceback as the interpreter prints it: without this frame
            traceback.print_exception(type(e), e, e.__traceback__.tb_next)
            code = -signal.SIGINT if isinstance(e, KeyboardInterrupt) else 1
        getattr(threading, "_shutdown", lambda: None)()
        atexit._run_exitfuncs()
        sys.stdout.flush()
        sys.stderr.flush()
    finally:
        if code == -signal.SIGINT:  # as the interpreter does for an uncaught KeyboardInterrupt
            signal.signal(signal.SIGINT, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGINT)
        os._exit(code if code >= 0 else 1)


_pending, _buffer = {}, b""
while True:
    ready, _, _ = select.select([0], [], [], 0.005 if _pending else 0.2)
    if ready:
        data = os.read(0, 65536)
        if not data:
            break
        _buffer += data
        while b"\n" in _buffer:
            line, _buffer = _buffer.split(b"\n", 1)
            req = json.loads(line)
            sys.stdout.flush()
            sys.stderr.flush()
            pid = os.fork()
            if pid == 0:
                _child(req)
            _pending[pid] = req["id"]
            _answers.write(json.dumps({"id": req["id"], "pid": pid}) + "\n")
    while _pending:
        pid, status = os.waitpid(-1, os.WNOHANG)
        if pid == 0:
            break
        code = -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)
        _answers.write(json.dumps({"id": _pending.pop(pid), "returncode": code}) + "\n")
"""


class Child:
    """One forked run: ``pid``, ``returncode`` (None while it runs) and the ``Popen`` methods the
    tests use (``poll``, ``wait``, ``communicate``, ``kill``, ``send_signal``)."""

    def __init__(self, folder: str) -> None:
        self.pid: Optional[int] = None
        self.returncode: Optional[int] = None
        self.stdout_path = os.path.join(folder, "stdout")
        self.stderr_path = os.path.join(folder, "stderr")
        self.started, self.done = threading.Event(), threading.Event()

    def poll(self) -> Optional[int]:
        return self.returncode

    def wait(self, timeout: Optional[float] = None) -> int:
        if not self.done.wait(timeout):
            raise subprocess.TimeoutExpired("forked child", timeout)
        return self.returncode

    def communicate(self, timeout: Optional[float] = None) -> Tuple[str, str]:
        self.wait(timeout)
        return (Path(self.stdout_path).read_text(errors="replace"),
                Path(self.stderr_path).read_text(errors="replace"))

    def send_signal(self, sig: int) -> None:
        if self.returncode is None:  # not reaped yet: the pid is still this child's
            os.kill(self.pid, sig)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


class ForkServer:
    """Start the server (``preload``: modules to import once; ``env``: its environment and the
    children's default). Use as a context manager, or call :meth:`close`."""

    def __init__(self, preload: Sequence[str] = (), *, env: Optional[Mapping[str, str]] = None,
                 cwd: Path = REPO) -> None:
        self.env = dict(os.environ if env is None else env)
        self.env.setdefault("PYTHONPATH", str(REPO))
        self.cwd = str(cwd)
        self.folder = tempfile.mkdtemp(prefix="forkserver-")
        self.children: Dict[int, Child] = {}
        self.lock = threading.Lock()
        self.log = os.path.join(self.folder, "server.log")
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen([sys.executable, "-c", _SERVER, *preload], stdin=subprocess.PIPE,
                                         stdout=subprocess.PIPE, stderr=log, cwd=self.cwd, env=self.env)
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            msg = json.loads(line)
            child = self.children[msg["id"]]
            if "pid" in msg:
                child.pid = msg["pid"]
                child.started.set()
            else:
                child.returncode = msg["returncode"]
                child.done.set()
        for child in self.children.values():  # the server died: nothing more will finish
            child.started.set()
            child.done.set()

    def start(self, args: Sequence[Any], *, env: Optional[Mapping[str, str]] = None,
              cwd: Optional[Path] = None) -> Child:
        """Fork a run of ``python ARGS`` (``-m module ...`` or ``-c code ...``); return at once."""
        args = [str(a) for a in args]
        if args[0] not in ("-m", "-c"):
            raise ValueError(f"expected -m or -c, got {args[0]!r}")
        with self.lock:
            ident = len(self.children)
            folder = os.path.join(self.folder, str(ident))
            os.mkdir(folder)
            child = self.children[ident] = Child(folder)
            for path in (child.stdout_path, child.stderr_path):  # there from the start, as a pipe is
                open(path, "w").close()
            req = {"id": ident, "args": args, "env": dict(self.env if env is None else env),
                   "cwd": str(cwd or self.cwd), "stdout": child.stdout_path, "stderr": child.stderr_path}
            self.proc.stdin.write((json.dumps(req) + "\n").encode())
            self.proc.stdin.flush()
        if not child.started.wait(300) or child.pid is None:  # the first waits for the preload
            raise RuntimeError(f"the fork server did not start the run: {Path(self.log).read_text()[-2000:]}")
        return child

    def run(self, args: Sequence[Any], *, env: Optional[Mapping[str, str]] = None, cwd: Optional[Path] = None,
            timeout: float = 120) -> subprocess.CompletedProcess:
        """Run ``python ARGS`` in a forked child to the end, like ``subprocess.run(capture_output=True, text=True)``."""
        child = self.start(args, env=env, cwd=cwd)
        try:
            out, err = child.communicate(timeout)
        except subprocess.TimeoutExpired:  # as subprocess.run does: kill it, then raise
            child.kill()
            child.wait(30)
            raise
        return subprocess.CompletedProcess(["python", *map(str, args)], child.returncode, out, err)

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.stdin.close()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc.stdout.close()
        shutil.rmtree(self.folder, ignore_errors=True)

    def __enter__(self) -> "ForkServer":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
