"""Ctrl-C while ``ckptmerge`` starts (issue 30.7): from the program's first line on, every command
exits 130 with ``Aborted!`` and no traceback, however early the SIGINT comes.

A real subprocess of each entry point (``python -m ckptmerge`` and the console script as pip
writes it from setup.py's entry point) gets a real SIGINT at several delays, during the imports
of the command line (half a second or more), its parsing, the command and the way out. The
delays count from the moment ckptmerge's handler is in place, the first thing the package does:
a ``sitecustomize`` of the test's writes a byte to a pipe at the first import after it. Before
that point lie the interpreter's own start (``site`` and ``.pth`` files) and the loading of
ckptmerge's first module, which no program can handle (see ckptmerge/core/interrupts.py).
"""

from __future__ import annotations

import os
import re
import select
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
from _cli_util import REPO

from ckptmerge.core import interrupts

DELAYS = (0.0, 0.05, 0.1, 0.2, 0.5)

#: Writes a byte to the test's pipe at the first import after ckptmerge installed its SIGINT
#: handler (the first thing ckptmerge does), then steps aside.
SITECUSTOMIZE = """
import os, signal, sys
class _Started:
    fd = os.environ.pop("CKPTMERGE_TEST_STARTED_FD", None)
    @classmethod
    def find_spec(cls, name, path=None, target=None):
        if cls.fd is not None and signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
            fd, cls.fd = int(cls.fd), None
            os.write(fd, b"+")
            os.close(fd)
        return None
sys.meta_path.insert(0, _Started)
"""


def console_script(folder):
    """The ``ckptmerge`` script pip writes for setup.py's ``console_scripts`` entry."""
    setup = (REPO / "setup.py").read_text(encoding="utf-8")
    module, func = re.search(r'"ckptmerge=([\w.]+):(\w+)"', setup).groups()
    script = folder / "ckptmerge"
    script.write_text(f"import re\nimport sys\nfrom {module} import {func}\nif __name__ == '__main__':\n"
                      f"    sys.argv[0] = re.sub(r'(-script\\.pyw|\\.exe)?$', '', sys.argv[0])\n"
                      f"    sys.exit({func}())\n", encoding="utf-8")
    return script


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    from safetensors.numpy import save_file

    root = tmp_path_factory.mktemp("startup")
    run = root / "run"
    run.mkdir()
    for step in (1, 2):
        save_file({"w": np.full(4, step, np.float32)}, str(run / f"model-{step}.safetensors"))
    site = root / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(SITECUSTOMIZE, encoding="utf-8")
    a, b = run / "model-1.safetensors", run / "model-2.safetensors"
    commands = [["ls", a], ["diff", a, b, "--values"], ["checkpoints", run], ["watch", run], ["show", a, "w"],
                ["average", a, b, "-o", root / "avg.safetensors"]]
    return {"root": root, "site": site, "commands": commands, "script": console_script(root)}


def interrupt_at(world, entry, args, delay):
    read, write = os.pipe()
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(world["site"]), str(REPO)]),
               CKPTMERGE_TEST_STARTED_FD=str(write))
    head = [sys.executable, "-m", "ckptmerge"] if entry == "-m" else [sys.executable, str(world["script"])]
    proc = subprocess.Popen([*head, *map(str, args)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=env, pass_fds=(write,), cwd=world["root"])
    os.close(write)
    try:
        ready, _, _ = select.select([read], [], [], 120)
        assert ready and os.read(read, 1) == b"+", "the interpreter never started"
    finally:
        os.close(read)
    time.sleep(delay)
    running = proc.poll() is None
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    return running, proc.returncode, out, err


@pytest.mark.parametrize("entry", ["-m", "console script"])
def test_ctrl_c_at_any_moment_of_the_start_exits_130_with_one_line(world, entry):
    offset = 0 if entry == "-m" else 3  # each command meets each delay across the two entries
    cases = [(world["commands"][(i + offset) % len(world["commands"])], d) for i, d in enumerate(DELAYS * 2)]
    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(lambda c: (c, interrupt_at(world, entry, *c)), cases))
    interrupted = 0
    for (args, delay), (running, rc, out, err) in results:
        what = f"{entry} {args[0]} at {delay}s: rc={rc} stderr={err[-600:]!r}"
        assert "Traceback" not in err and "KeyboardInterrupt" not in err, what
        if rc == 0 and args[0] != "watch":  # it had finished when the signal came
            continue
        assert running and rc == 130, what
        assert err.strip().splitlines()[-1:] == ["Aborted!"], what
        assert err.count("Aborted!") == 1, what
        interrupted += 1
    assert interrupted >= len(cases) // 2, results  # the signal came while it ran, most times


@pytest.mark.parametrize("argv, orig_argv, expected", [
    (["/venv/bin/ckptmerge", "ls"], [], True),
    (["C:\\venv\\Scripts\\ckptmerge.exe"], [], os.sep == "\\"),
    (["-m"], ["python", "-m", "ckptmerge", "ls"], True),
    (["-m"], ["python", "-u", "-W", "ignore", "-X", "utf8", "-mckptmerge"], True),
    (["-m"], ["python", "-m", "pytest"], False),
    (["train.py"], ["python", "train.py", "-m", "ckptmerge"], False),
    (["-c"], ["python", "-c", "import ckptmerge", "-m", "ckptmerge"], False),
    (["ckptmerge.py"], ["python", "ckptmerge.py"], False),
    ([], [], False),
])
def test_the_program_is_told_from_a_library_import(argv, orig_argv, expected):
    assert interrupts.started_as_program(argv, orig_argv) is expected


def test_importing_ckptmerge_as_a_library_changes_no_signal_handler():
    code = "import signal, ckptmerge, ckptmerge.cli; print(signal.getsignal(signal.SIGINT).__name__)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         env=dict(os.environ, PYTHONPATH=str(REPO)))
    assert out.stdout.strip() == "default_int_handler", out


def test_a_program_that_ignores_sigint_keeps_it_ignored():
    """A background job of a non-interactive shell starts with SIGINT ignored: it stays so."""
    code = ("import signal, sys; signal.signal(signal.SIGINT, signal.SIG_IGN); sys.argv = ['ckptmerge']\n"
            "import ckptmerge\nfrom ckptmerge.core import interrupts\n"
            "print(interrupts.install(), signal.getsignal(signal.SIGINT) is signal.SIG_IGN)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         env=dict(os.environ, PYTHONPATH=str(REPO)))
    assert out.stdout.split() == ["False", "True"], out
