"""Every file of an Orbax checkpoint that ckptmerge or TensorStore would open is a regular file
inside the checkpoint (issue 30 item 1): a FIFO, a device, a folder or a symbolic link out of the
checkpoint, put where a chunk, an OCDBT data file, the manifest or the metadata belongs, is refused
by name before anything opens it, by the API and by every command (exit 2, no traceback, no hang).

Checkpoints are written by orbax-checkpoint in the test; each case replaces one of their files.
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("tensorstore", reason="the Orbax reader needs tensorstore (pip install 'ckptmerge[orbax]')")
pytest.importorskip("orbax.checkpoint", reason="the Orbax tests write checkpoints with orbax-checkpoint")

from _orbax_util import refuse_jax_from_ckptmerge, write_orbax  # noqa: E402,F401

import ckptmerge as cm  # noqa: E402
from ckptmerge.core.errors import UnsafeCheckpointError  # noqa: E402
from ckptmerge.formats.orbax.reader import OrbaxReader  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
LAYOUTS = ("zarr", "zarr3", "ocdbt+zarr", "ocdbt+zarr3", "msgpack")


def _tree(seed: int) -> dict:
    rng = np.random.default_rng(seed)
    return {"params": {"w": rng.standard_normal((3, 4)).astype(np.float32),
                       "b": rng.standard_normal(5).astype(np.float32)}, "step": np.int64(seed)}


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    base = tmp_path_factory.mktemp("orbax_files")
    return {layout: write_orbax(base / layout.replace("+", "_"), _tree(i), layout) for i, layout in enumerate(LAYOUTS)}


def _files(root: Path) -> list:
    """Every file of a checkpoint, relative to its folder (so each one gets replaced in turn)."""
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())


def _plant(path: Path, kind: str, outside: Path) -> None:
    """Replace the file ``path`` by ``kind``: a FIFO, a character device, a folder, a link out."""
    path.unlink()
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "device":
        try:
            os.mknod(path, stat.S_IFCHR | 0o600, os.makedev(1, 5))  # /dev/zero: a read never ends
        except PermissionError:
            pytest.skip("making a device node needs root")
    elif kind == "folder":
        path.mkdir()
        (path / "x").write_bytes(b"")
    else:
        outside.write_bytes(b"\0" * 64)
        path.symlink_to(outside)


def _is_read(rel: str, layout: str) -> bool:
    """Whether a read of the whole checkpoint (or its listing) would open this file: all but the
    markers Orbax writes for itself and OCDBT leftovers of a merged database (still refused, but
    by the listing's walk, which the folder case cannot reach)."""
    return not rel.endswith(("commit_success.txt", "orbax.checkpoint"))


def _cases():
    for layout in LAYOUTS:
        for kind in ("fifo", "device", "folder", "link"):
            yield layout, kind


@pytest.mark.parametrize("layout,kind", list(_cases()))
def test_every_file_replaced_by_a_fifo_device_folder_or_outside_link_is_refused_by_name(written, tmp_path, layout,
                                                                                        kind):
    src = written[layout]
    names = [r for r in _files(src) if _is_read(r, layout)]
    assert len(names) >= 3
    for i, rel in enumerate(names):
        ckpt = tmp_path / f"c{i}"
        shutil.copytree(src, ckpt)
        _plant(ckpt / rel, kind, tmp_path / f"outside{i}")
        with pytest.raises(UnsafeCheckpointError) as e:
            cm.load(str(ckpt), ["params/w"])
            pytest.fail(f"{rel} as a {kind} was read")
        assert str(ckpt / rel) in str(e.value), (rel, str(e.value))
        assert {"fifo": "FIFO", "device": "character device", "folder": "directory",
                "link": "symbolic link"}[kind] in str(e.value), (rel, str(e.value))


def _names(src: Path) -> list:
    with OrbaxReader(str(src)) as r:
        return r.names()


def test_a_chunk_folder_is_refused_and_folders_above_the_chunk_keys_are_not(written, tmp_path):
    # zarr3 chunk keys are c/<i>/<j>: c and c/0 are folders, c/0/0 is the chunk file
    ckpt = shutil.copytree(written["zarr3"], tmp_path / "z3")
    chunk = next(p for p in (ckpt / "params.w").rglob("*") if p.is_file() and p.name != "zarr.json")
    assert chunk.relative_to(ckpt / "params.w").parts == ("c", "0", "0")
    assert cm.load(str(ckpt), ["params/w"])["params/w"].shape == (3, 4)
    chunk.unlink()
    chunk.mkdir()
    with pytest.raises(UnsafeCheckpointError, match="is a directory where the Orbax checkpoint keeps a file"):
        cm.load(str(ckpt), ["params/w"])


def test_a_file_replaced_after_listing_is_refused_before_tensorstore_opens_it(written, tmp_path):
    for layout in ("zarr", "ocdbt+zarr"):
        ckpt = shutil.copytree(written[layout], tmp_path / layout.replace("+", "_"))
        with OrbaxReader(str(ckpt)) as r:
            data = [p for p in ckpt.rglob("*") if p.is_file() and (p.parent.name in ("d", "params.w"))
                    and p.name != ".zarray"]
            for p in data:
                p.unlink()
                os.mkfifo(p)
            with pytest.raises(UnsafeCheckpointError, match="FIFO"):
                r.get("params/w")


def _cli(*args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(REPO), TF_CPP_MIN_LOG_LEVEL="3")
    return subprocess.run([sys.executable, "-m", "ckptmerge", *args], capture_output=True, text=True, timeout=60,
                          env=env, cwd=str(REPO))


@pytest.mark.parametrize("layout,rel", [("zarr", "params.w/0.0"), ("zarr3", "params.w/c/0/0"),
                                        ("ocdbt+zarr", "d"), ("ocdbt+zarr", "manifest.ocdbt"),
                                        ("zarr", "_METADATA"), ("msgpack", "params.w/0.0")])
def test_cli_commands_exit_2_naming_the_fifo_without_a_traceback_or_a_hang(written, tmp_path, layout, rel):
    ckpt = shutil.copytree(written[layout], tmp_path / "ckpt")
    if rel == "d":  # the database's one data file
        rel = str(next((ckpt / "d").iterdir()).relative_to(ckpt))
    _plant(ckpt / rel, "fifo", tmp_path / "unused")
    good = shutil.copytree(written[layout], tmp_path / "good")
    config = tmp_path / "m.yaml"
    config.write_text(f"sources:\n  - name: a\n    path: {ckpt}\n")
    commands = [("show", str(ckpt), "params/w"), ("ls", str(ckpt)), ("diff", str(good), str(ckpt), "--values"),
                ("merge", str(config), "-o", str(tmp_path / "out" / "ckpt"), "-q")]
    for args in commands if rel.endswith("0.0") and layout == "zarr" else commands[:1]:
        res = _cli(*args)  # (a hang is the timeout's error)
        assert res.returncode == 2, (args, res.returncode, res.stdout, res.stderr)
        assert "Traceback" not in res.stderr and str(ckpt / rel) in res.stderr and "FIFO" in res.stderr, res.stderr
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())
