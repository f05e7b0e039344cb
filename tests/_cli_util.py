"""Helpers for the CLI tests (tests/test_cli_*.py): run the CLI, write small real checkpoints.

Checkpoints are written by TensorFlow itself: name-based ones with ``tf.compat.v1.train.Saver``
in a graph, object-based ones with ``tf.train.Checkpoint``. ``run`` invokes the click command
in-process (``CliRunner``, stdout and stderr kept apart); ``run_subprocess`` runs
``python -m ckptmerge`` in a process of its own and reports whether TensorFlow was imported.
"""

from __future__ import annotations

import atexit
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence

from _forkserver import ForkServer
from click.testing import CliRunner, Result

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

from ckptmerge.cli import cli  # noqa: E402

#: The repository root (so that ``python -m ckptmerge`` works without installing).
REPO = Path(__file__).resolve().parents[1]


#: Python source for a fresh interpreter's driver script (``python -c``): ``cli(*args)`` runs
#: ``ckptmerge ARGS`` in that interpreter, as the console script does, and returns ``[exit code,
#: stdout, stderr]``; the script can then look at ``sys.modules`` (what a command imported).
IN_PROCESS_CLI = """
import contextlib, io
from ckptmerge.cli import main  # (what the console script and python -m ckptmerge run)
def cli(*args):
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            main(list(args))
            code = 0
        except SystemExit as e:
            code = e.code
    return [code, out.getvalue(), err.getvalue()]
"""


def run(*args: Any) -> Result:
    """Run ``ckptmerge ARGS`` in-process; ``result.stdout`` / ``result.stderr`` are separate."""
    return CliRunner().invoke(cli, [str(a) for a in args], prog_name="ckptmerge")


def assert_one_line_error(result: Result, *parts: str) -> None:
    """Exit code 2, nothing on stdout, one ``Error: ...`` line on stderr containing ``parts``."""
    assert result.exit_code == 2, (result.exit_code, result.output)
    assert result.stdout == ""
    err = result.stderr
    assert err.startswith("Error: "), err
    assert err.count("\n") == 1, err
    assert "Traceback" not in err
    for p in parts:
        assert p in err, (p, err)


from conftest import save_tf1  # noqa: E402,F401 - re-exported for the CLI tests


def save_module(prefix: Path, values: Mapping[str, Any]) -> str:
    """Write an object-based checkpoint of a ``tf.Module`` with one named variable per value."""
    import tensorflow as tf

    module = tf.Module()
    for i, (name, value) in enumerate(values.items()):
        setattr(module, f"v{i}", tf.Variable(value, name=name))
    return tf.train.Checkpoint(model=module).write(str(prefix))


def write_config(path: Path, text: str) -> Path:
    """Write a config file (dedented) and return its path."""
    path.write_text(textwrap.dedent(text).lstrip(), encoding="utf-8")
    return path


_DRIVER = """
import json, runpy, sys
out, args = sys.argv[1], sys.argv[2:]
sys.argv = ["ckptmerge", *args]
code = 0
try:
    runpy.run_module("ckptmerge", run_name="__main__", alter_sys=True)
except SystemExit as e:
    code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
mods = [m for m in sys.modules if m == "tensorflow" or m.startswith(("tensorflow.", "keras"))]  # as _TF_MODULES
with open(out, "w") as f:
    json.dump({"code": code, "tf_modules": mods[:5]}, f)
"""


_TF_MODULES = "[m for m in sys.modules if m == 'tensorflow' or m.startswith(('tensorflow.', 'keras'))]"
_FORKS: List[ForkServer] = []


def _forks() -> ForkServer:
    """One warm interpreter per test process (tests/_forkserver.py) that imported ``ckptmerge.cli``,
    checked to have imported no TensorFlow or Keras doing so, so each run's ``tf_modules`` are its own."""
    if not _FORKS:
        server = ForkServer(["ckptmerge.cli"])
        probe = server.run(["-c", f"import sys; print({_TF_MODULES})"])
        assert probe.stdout == "[]\n", f"importing ckptmerge.cli imported TensorFlow or Keras: {probe.stdout}"
        atexit.register(server.close)
        _FORKS.append(server)
    return _FORKS[0]


def run_subprocess(args: Sequence[Any], tmp_path: Path, *, timeout: float = 120,
                   preexec_fn: Optional[Callable[[], None]] = None) -> Dict[str, Any]:
    """Run ``python -m ckptmerge ARGS`` in a process of its own, in ``tmp_path``: forked from a warm
    interpreter that imported the CLI (see :func:`_forks`), or with ``preexec_fn`` (run in the child
    first, e.g. to limit its memory) a fresh interpreter.

    Returns ``{"code": exit code, "tf_modules": [TF/Keras modules imported, first 5],
    "stdout": ..., "stderr": ...}``. Raises ``subprocess.TimeoutExpired`` after ``timeout``
    seconds.
    """
    out = tmp_path / "driver-result.json"
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    if preexec_fn is None:
        proc = _forks().run(["-c", _DRIVER, out, *args], env=env, cwd=tmp_path, timeout=timeout)
    else:
        proc = subprocess.run([sys.executable, "-c", _DRIVER, str(out), *[str(a) for a in args]],
                              capture_output=True, text=True, env=env, cwd=tmp_path, timeout=timeout,
                              preexec_fn=preexec_fn, check=False)
    assert out.exists(), proc.stderr
    result = json.loads(out.read_text())
    result.update(stdout=proc.stdout, stderr=proc.stderr)
    return result


# A module the --model tests import: build() makes model C; the others fail in each way.
MODELS_PY = """
import tensorflow as tf


def build():
    m = tf.Module()
    m.x1 = tf.Variable(tf.zeros((3, 4)), name="c/x1")
    m.y1 = tf.Variable(tf.zeros((4,)), name="c/y1")
    m.z = tf.Variable(tf.zeros((2,)), name="c/z")
    return m


def broken():
    raise RuntimeError("no GPU here")


def nothing():
    return None


def a_path():
    return "/tmp"
"""
