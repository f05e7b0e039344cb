"""Ctrl-C: ``ckptmerge`` exits 130 with ``Aborted!``, never 1 (1 means "different"/findings),
and an interrupted merge leaves no temporary file and no output.

Each test runs ``python -m ckptmerge`` as a real subprocess and sends it a real SIGINT. So that
the signal arrives mid-command every time, the child pauses inside the command (a wrapper
around one of ckptmerge's own functions creates a marker file, then sleeps) and the test waits
for the marker before it sends the signal.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
from _cli_util import REPO, save_tf1, write_config

#: ``python -c CHILD MODULE ATTR MARKER ARGS...``: pause in MODULE.ATTR (``Class.method`` too),
#: then run ``ckptmerge ARGS``.
CHILD = """
import importlib, pathlib, sys, time
module, attr, marker = sys.argv[1:4]
owner = importlib.import_module(module)
*path, name = attr.split(".")
for part in path:
    owner = getattr(owner, part)
real = getattr(owner, name)

def pausing(*args, **kwargs):
    pathlib.Path(marker).touch()
    time.sleep(120)
    return real(*args, **kwargs)

setattr(owner, name, pausing)
sys.argv = ["ckptmerge", *sys.argv[4:]]
from ckptmerge.cli import main
main()
"""


def interrupt(tmp_path, module, attr, *args):
    """Run ``ckptmerge ARGS``, SIGINT it once it pauses in ``module.attr``; return the process."""
    marker = tmp_path / "paused"
    env = dict(os.environ, PYTHONPATH=str(REPO))
    proc = subprocess.Popen([sys.executable, "-c", CHILD, module, attr, str(marker), *map(str, args)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=tmp_path)
    deadline = time.monotonic() + 60
    while not marker.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            pytest.fail(f"never paused in {module}.{attr}: {proc.communicate()}")
        time.sleep(0.05)
    return proc


@pytest.fixture
def two_checkpoints(tmp_path, tf):
    a = save_tf1(tmp_path / "A" / "model", {"w": np.zeros(4, np.float32)})
    b = save_tf1(tmp_path / "B" / "model", {"w": np.ones(4, np.float32)})
    return a, b


def test_ctrl_c_during_diff_exits_130_not_1(tmp_path, two_checkpoints):
    proc = interrupt(tmp_path, "ckptmerge.cli.inspect", "max_abs_diff", "diff", *two_checkpoints, "--values")
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, (proc.returncode, err)
    assert err.splitlines()[-1] == "Aborted!" and "Traceback" not in err, err
    assert out == ""


def test_ctrl_c_during_a_merge_exits_130_and_leaves_no_file(tmp_path, two_checkpoints):
    config = write_config(tmp_path / "merge.yaml", f"""
        sources:
          - {{name: A, path: {two_checkpoints[0]}}}
    """)
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    proc = interrupt(tmp_path, "ckptmerge.formats.tf.writer", "BundleWriter.add_range", "merge", config,
                     "-o", out_dir / "merged")
    assert os.listdir(out_dir), "the merge had not started writing"  # its temporary files
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, (proc.returncode, err)
    assert err.splitlines()[-1] == "Aborted!" and "Traceback" not in err, err
    assert os.listdir(out_dir) == []


def test_a_plain_subprocess_child_gets_sigint_as_the_interpreter_sets_it():
    """Regression: a suite started as a background job of a non-interactive shell inherited
    SIGINT as ignored, and so did every child, so each Ctrl-C test above timed out. conftest.py
    puts Python's own handler back, so a child starts with SIGINT at its default."""
    out = subprocess.run([sys.executable, "-c", "import signal; print(signal.getsignal(signal.SIGINT).__name__)"],
                         capture_output=True, text=True, timeout=60)
    assert signal.getsignal(signal.SIGINT) is not signal.SIG_IGN
    assert out.stdout.strip() == "default_int_handler", out
