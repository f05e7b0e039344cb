"""The fork server of the kill sweeps (tests/_forkserver.py) reports each run as ``subprocess`` would."""

from __future__ import annotations

import signal
import time

import pytest
from _forkserver import ForkServer


@pytest.fixture(scope="module")
def forks():
    with ForkServer(["json"]) as server:
        yield server


def test_a_run_gets_its_arguments_environment_and_own_streams(forks, tmp_path):
    code = "import os, sys; print(sys.argv, os.getcwd(), os.environ['X']); print('err', file=sys.stderr)"
    done = forks.run(["-c", code, "a", 1], env={"X": "y"}, cwd=tmp_path)
    assert (done.returncode, done.stdout, done.stderr) == (0, f"['-c', 'a', '1'] {tmp_path} y\n", "err\n")
    assert forks.run(["-m", "json.tool", "--help"]).stdout.startswith("usage: python -m json.tool")


def test_exit_codes_exceptions_and_signals_are_reported_as_subprocess_does(forks):
    assert forks.run(["-c", "raise SystemExit(3)"]).returncode == 3
    failed = forks.run(["-c", "raise ValueError('boom')"])
    assert failed.returncode == 1 and failed.stderr.startswith("Traceback") and "ValueError: boom" in failed.stderr
    assert forks.run(["-c", "raise KeyboardInterrupt"]).returncode == -signal.SIGINT
    child = forks.start(["-c", "import time; print('up', flush=True); time.sleep(60)"])
    deadline = time.monotonic() + 30
    while open(child.stdout_path).read() != "up\n" and time.monotonic() < deadline:
        time.sleep(0.01)
    assert child.poll() is None
    child.kill()
    assert child.wait(30) == -signal.SIGKILL
    catching = "import time\ntry:\n    print('up', flush=True); time.sleep(60)\nexcept KeyboardInterrupt:\n    raise SystemExit(130)"
    child = forks.start(["-c", catching])
    while open(child.stdout_path).read() != "up\n":
        time.sleep(0.01)
    child.send_signal(signal.SIGINT)
    assert child.wait(30) == 130
