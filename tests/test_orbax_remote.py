"""Orbax checkpoints in object storage: an S3 API on localhost (moto, behind the fault-injecting
proxy of tests/test_remote.py), read through fsspec and the loopback bridge TensorStore reads from.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("tensorstore", reason="the Orbax reader needs tensorstore (pip install 'ckptmerge[orbax]')")
pytest.importorskip("moto", reason="the S3 tests run moto's server")

from _orbax_util import no_jax_from_ckptmerge, refuse_jax_from_ckptmerge  # noqa: E402,F401 - autouse guard
from test_remote import local_run, s3  # noqa: E402,F401 - the S3 server fixtures

import ckptmerge as cm  # noqa: E402
from ckptmerge.core.errors import CheckpointFormatError  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
ROOT = REPO / "tests" / "fixtures" / "flax" / "linen_mlp" / "ckpt"
URL = "s3://ckpts/orbax"


@pytest.fixture(scope="module")
def orbax_s3(s3):  # noqa: F811 - the fixture imported above
    import fsspec

    # One S3 filesystem for the module (fsspec's instance cache, as outside the tests): a new one
    # per request, as test_remote.py's fixture asks, costs a second of client set-up each time.
    fsspec.config.conf["s3"]["skip_instance_cache"] = False
    fs = fsspec.filesystem("s3")
    for dirpath, _, files in os.walk(ROOT):
        for n in files:
            p = Path(dirpath) / n
            fs.pipe(f"{URL}/{p.relative_to(ROOT).as_posix()}", p.read_bytes())
    yield s3
    fs.rm("s3://ckpts", recursive=True)  # moto's buckets are process-wide: test_remote.py makes its own
    fsspec.config.conf["s3"]["skip_instance_cache"] = True


def _local():
    with cm.open(str(ROOT)) as r:
        return {n: r.get(n) for n in r.names()}


def test_an_orbax_root_in_s3_reads_as_on_disk_by_ranged_reads(orbax_s3):
    before = orbax_s3["proxy"].ranged_gets
    with cm.open(URL) as r:
        got = {n: r.get(n) for n in r.names()}
    local = _local()
    assert sorted(got) == sorted(local)
    for n in local:
        np.testing.assert_array_equal(got[n], local[n])
    assert orbax_s3["proxy"].ranged_gets > before


def test_transient_s3_faults_while_tensorstore_reads_are_retried(orbax_s3, mode="500"):
    # (dropped connections take the same retry path: tests/test_remote.py covers both for every format)
    with cm.open(URL) as r:
        orbax_s3["proxy"].mode, orbax_s3["proxy"].fail_ranged = mode, 2
        value = r.get("params/Dense_0/kernel")
    assert orbax_s3["proxy"].fail_ranged == 0
    np.testing.assert_array_equal(value, _local()["params/Dense_0/kernel"])


def test_a_persistent_s3_failure_names_the_url_and_never_the_loopback_bridge(orbax_s3, monkeypatch):
    import fsspec
    import s3fs

    monkeypatch.setenv("CKPTMERGE_REMOTE_RETRIES", "2")
    # (s3fs's and botocore's own retries sleep seconds each: leave the retrying to ckptmerge's)
    monkeypatch.setattr(s3fs.S3FileSystem, "retries", 1)
    monkeypatch.setitem(fsspec.config.conf["s3"], "config_kwargs", {"retries": {"max_attempts": 1}})
    with cm.open(URL) as r:
        orbax_s3["proxy"].mode, orbax_s3["proxy"].fail_ranged = "500", 10_000
        try:
            with pytest.raises(CheckpointFormatError) as info:
                r.read_many(r.names())
        finally:
            orbax_s3["proxy"].fail_ranged = 0
    assert URL in str(info.value) and "127.0.0.1" not in str(info.value)


def test_cli_ls_and_checkpoints_of_an_orbax_root_in_s3(orbax_s3):
    assert [(c.step, c.latest) for c in cm.checkpoints(URL)] == [(3, True)]
    env = dict(os.environ, PYTHONPATH=str(REPO), **orbax_s3["env"])
    out = subprocess.run([sys.executable, "-m", "ckptmerge", "ls", URL], cwd=REPO, env=env, capture_output=True,
                         text=True, timeout=180)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith(f"Checkpoint: {URL}/3 (latest finalised Orbax step of {URL}")
    assert "params/Embed_0/embedding" in out.stdout and "127.0.0.1" not in out.stdout
