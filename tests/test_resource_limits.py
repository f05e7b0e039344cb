"""Running out of file descriptors is said as such (issue 30.8), never "corrupt, re-copy it".

``combine``, ``average`` and ``merge`` hold each input open while they stream; with hundreds of
inputs under a low ``ulimit -n`` the next open fails with ``EMFILE``. Each test runs the command
in a subprocess whose limit of open files is lowered (``setrlimit``), over inputs of every local
format, and checks the one ``Error:`` line names the limit and the fix, blames no file, and
leaves no output behind.
"""

from __future__ import annotations

import errno
import os
import resource
import subprocess
import sys

import numpy as np
import pytest
from _cli_util import REPO, run, write_config
from _reader_util import write_float_bundle

from ckptmerge.core import limits
from ckptmerge.core.errors import CheckpointFormatError, ResourceLimitError

INPUTS = 48
WRONG = ("corrupt", "re-copy", "truncated", "damaged", "not an HDF5", "does not exist", "Traceback")


def _tensors(i):
    return {"dense/kernel": np.full((3, 2), i, np.float32), "dense/bias": np.arange(2, dtype=np.float32) + i}


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    """``INPUTS`` checkpoints of each local format, and a run folder of safetensors steps."""
    from safetensors.numpy import save_file

    root = tmp_path_factory.mktemp("fds")
    made = {}
    for fmt in ("safetensors", "tf", "npz", "h5", "run"):
        (root / fmt).mkdir()
    made["safetensors"] = [str(root / "safetensors" / f"m{i}.safetensors") for i in range(INPUTS)]
    made["tf"] = [write_float_bundle(str(root / "tf" / f"model-{i}"), _tensors(i)) for i in range(INPUTS)]
    made["npz"] = [str(root / "npz" / f"n{i}.npz") for i in range(INPUTS)]
    for i in range(INPUTS):
        save_file(_tensors(i), made["safetensors"][i])
        save_file(_tensors(i), str(root / "run" / f"model-{i + 1}.safetensors"))
        np.savez(made["npz"][i], **{k.replace("/", "_"): v for k, v in _tensors(i).items()})
    first = str(root / "h5" / "k0.weights.h5")  # written by Keras itself
    import keras

    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    model.save_weights(first)
    data = open(first, "rb").read()
    made["h5"] = [first] + [str(root / "h5" / f"k{i}.weights.h5") for i in range(1, INPUTS)]
    for p in made["h5"][1:]:
        with open(p, "wb") as f:
            f.write(data)
    made["run"] = [str(root / "run")]
    made["root"] = root
    return made


def _limited(args, limit, cwd):
    def lower():
        resource.setrlimit(resource.RLIMIT_NOFILE, (limit, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))

    return subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=300, cwd=cwd,
                          preexec_fn=lower, env=dict(os.environ, PYTHONPATH=str(REPO), TF_CPP_MIN_LOG_LEVEL="3"))


def _assert_out_of_files(proc, limit, out_dir):
    assert proc.returncode == 2, (proc.returncode, proc.stderr[-2000:])
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: "), proc.stderr[-2000:]
    assert "too many files open" in lines[0] and f"its limit is {limit} open files" in lines[0], lines[0]
    assert "ulimit -n" in lines[0] and "fewer inputs" in lines[0] and "nothing is wrong with the file" in lines[0]
    assert not any(w in lines[0] for w in WRONG), lines[0]
    assert os.listdir(out_dir) == [], os.listdir(out_dir)  # no output, no temporary file


CASES = [  # (command, input format, output name, limit): every format, each command, two limits
    ("average", "safetensors", "avg.safetensors", 24),
    ("average", "tf", "avg", 40),
    ("average", "npz", "avg", 24),  # (a .weights.h5 output needs the model: refused before reading)
    ("combine", "h5", "comb.safetensors", 40),
    ("combine", "tf", "comb.safetensors", 24),
    ("average", "run", "last.safetensors", 24),
]


@pytest.mark.parametrize("command, fmt, out, limit", CASES)
def test_combining_more_inputs_than_open_files_allow_says_so(inputs, tmp_path, command, fmt, out, limit):
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    extra = ["--last", str(INPUTS - 2)] if fmt == "run" else []
    proc = _limited(["-m", "ckptmerge", command, *inputs[fmt], *extra, "-o", str(out_dir / out)], limit, tmp_path)
    _assert_out_of_files(proc, limit, out_dir)


@pytest.mark.parametrize("fmt, limit", [("tf", 40), ("h5", 32)])
def test_a_merge_of_many_sources_that_run_out_of_open_files_says_so(inputs, tmp_path, fmt, limit):
    entries = "\n".join(f"  - {{name: s{i}, path: '{p}', map: {{'/': 's{i}/'}}}}" for i, p in enumerate(inputs[fmt]))
    config = write_config(tmp_path / "many.yaml", "sources:\n" + entries + "\n")
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    proc = _limited(["-m", "ckptmerge", "merge", str(config), "-o", str(out_dir / "merged.safetensors")], limit,
                    tmp_path)
    _assert_out_of_files(proc, limit, out_dir)


def test_the_api_raises_a_resource_limit_error_not_a_format_error(inputs, tmp_path):
    code = ("import ckptmerge as cm, sys\n"
            "from ckptmerge.core.errors import ResourceLimitError\n"
            "held = []\n"
            "try:\n"
            "    for p in sys.argv[1:]:\n"
            "        held.append(cm.open(p))\n"
            "except ResourceLimitError as e:\n"
            "    print('limit', e.errno, isinstance(e, cm.CkptMergeError), isinstance(e, OSError))\n")
    proc = _limited(["-c", code, *inputs["safetensors"], *inputs["npz"]], 24, tmp_path)
    assert proc.stdout.split() == ["limit", str(errno.EMFILE), "True", "False"], proc.stderr[-2000:]


@pytest.mark.parametrize("error, code", [
    (OSError(errno.EMFILE, "Too many open files"), errno.EMFILE),
    (OSError(errno.ENFILE, "Too many open files in system"), errno.ENFILE),
    (OSError(errno.ENOMEM, "Cannot allocate memory"), errno.ENOMEM),
    (OSError("Unable to synchronously open file (unable to open file: name = 'k.h5', errno = 24, "
             "error message = 'Too many open files', flags = 0)"), errno.EMFILE),  # h5py's words
    (ValueError("OPEN: Error opening \"ocdbt\" driver: Too many open files [source locations=...]"), errno.EMFILE),
    (OSError(errno.ENOENT, "No such file or directory"), None),
    (OSError(errno.EACCES, "Permission denied"), None),
    (OSError("Unable to open file (file signature not found)"), None),
    (CheckpointFormatError("tensor 'too many open files' is stored twice"), None),  # a name, not a cause
])
def test_only_running_out_of_files_or_memory_is_taken_for_it(error, code):
    assert limits.resource_errno(error) == code
    err = limits.resource_error(error, "runs/A/model.h5")
    assert (err is None) == (code is None)
    if err is not None:
        assert isinstance(err, ResourceLimitError) and err.errno == code and err.path == "runs/A/model.h5"
        assert str(err).startswith("Cannot open 'runs/A/model.h5': ") and "nothing is wrong with the file" in str(err)
        with pytest.raises(ResourceLimitError):
            with limits.checked("runs/A/model.h5"):
                raise error
    else:
        with pytest.raises(type(error)):
            with limits.checked("runs/A/model.h5"):
                raise error
