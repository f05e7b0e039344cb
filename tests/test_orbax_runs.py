"""Runs, steps and items as every Orbax release since 0.5 lays them out (issue 36 items 2 and 4):
found by ``checkpoints``, ``ls``, ``show``, ``average --last``, ``watch``, ``cm.load`` and
``Source``; "no checkpoint" messages that name Orbax and say what almost matched; metadata of a
newer format refused by name, never read as the known one.

Layouts of older releases are built from item folders the installed Orbax writes, placed as the
release placed them. Orbax 0.5.9 (with JAX 0.4.26) ``CheckpointManager(run, {"state":
PyTreeCheckpointer()})`` wrote ``run/<step>/state/`` holding ``_METADATA``, the msgpack
``checkpoint`` file and the OCDBT database, and nothing else: no ``_CHECKPOINT_METADATA``, no
``commit_success.txt``, in the step folder; several items were sibling folders
(``run/5/params``, ``run/5/opt_state``), a ``JsonCheckpointHandler`` item a folder holding one
file, ``metadata``; ``step_prefix="checkpoint"`` named the step folder ``checkpoint_1000``; a step
being written was ``<step>.orbax-checkpoint-tmp-<timestamp>`` until renamed. (Seen with
orbax-checkpoint 0.5.9; tests/fixtures/orbax_matrix holds what that release itself wrote.)
"""

from __future__ import annotations

import json
import os
import shutil
import time
import struct
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("tensorstore", reason="the Orbax reader needs tensorstore (pip install 'ckptmerge[orbax]')")
pytest.importorskip("orbax.checkpoint", reason="the Orbax tests write checkpoints with orbax-checkpoint")

from _cli_util import run  # noqa: E402
from _orbax_util import refuse_jax_from_ckptmerge, write_orbax  # noqa: E402,F401

import ckptmerge as cm  # noqa: E402
from ckptmerge.core.errors import CheckpointFormatError, CheckpointNotFoundError  # noqa: E402
from ckptmerge.formats.orbax.layout import orbax_steps  # noqa: E402


def _tree(seed: int, n: int = 3) -> dict:
    rng = np.random.default_rng(seed)
    return {"params": {"w": rng.standard_normal((2, n)).astype(np.float32),
                       "b": rng.standard_normal(n).astype(np.float32)}}


def _item(folder: Path, tree: dict, layout: str = "ocdbt+zarr") -> Path:
    """A V0 PyTree item folder as Orbax writes it, without the step-level files Orbax 0.12 adds."""
    write_orbax(folder, tree, layout)
    for extra in ("_CHECKPOINT_METADATA", "commit_success.txt"):
        (folder / extra).unlink(missing_ok=True)
    return folder


def _old_run(root: Path, steps, *, prefix: str = "", item: str = "state", layout: str = "ocdbt+zarr") -> dict:
    """A CheckpointManager root as Orbax 0.5 wrote it: ``root/<prefix><step>/<item>/``."""
    trees = {}
    for s in steps:
        trees[s] = _tree(s)
        _item(root / f"{prefix}{s}" / item, trees[s], layout)
    return trees


@pytest.mark.parametrize("layout", ["ocdbt+zarr", "zarr"])
@pytest.mark.parametrize("prefix", ["", "checkpoint_"])
def test_a_run_whose_steps_carry_no_checkpoint_metadata_is_found_by_every_command(tmp_path, layout, prefix):
    root = tmp_path / "run"
    trees = _old_run(root, [1, 20, 300], prefix=prefix, layout=layout)
    # a step still being written, with a higher step: never picked
    _item(root / f"{prefix}4000.orbax-checkpoint-tmp-1733", _tree(4000), layout)
    assert [s.step for s in orbax_steps(str(root))] == [1, 20, 300]
    got = cm.load(str(root))
    assert sorted(got) == ["params/b", "params/w"]
    assert got["params/w"].tobytes() == trees[300]["params"]["w"].tobytes()
    assert cm.load(str(root), step=20)["params/w"].tobytes() == trees[20]["params"]["w"].tobytes()
    step_dir = root / f"{prefix}20"
    assert cm.load(str(step_dir))["params/b"].tobytes() == trees[20]["params"]["b"].tobytes()
    assert cm.load(str(step_dir / "state"))["params/b"].tobytes() == trees[20]["params"]["b"].tobytes()
    resolved = cm.Source(str(root), step=1).resolve()
    assert resolved.format == "orbax" and resolved.step == 1 and resolved.prefix == str(root / f"{prefix}1")
    with pytest.raises(CheckpointNotFoundError, match="no finalised Orbax step 4000"):
        cm.load(str(root), step=4000)

    res = run("checkpoints", root)
    assert res.exit_code == 0, res.output
    assert [ln.split()[-1] for ln in res.stdout.splitlines()[1:4]] == [f"{prefix}1", f"{prefix}20", f"{prefix}300"]
    assert "tmp" not in res.stdout
    res = run("ls", root)
    assert res.exit_code == 0 and f"step 300" in res.stdout and "params/w" in res.stdout, res.output
    res = run("show", root, "params/b", "--step", "20")
    assert res.exit_code == 0, res.output
    out = tmp_path / "avg" / "ckpt"
    res = run("average", root, "--last", "2", "-o", out, "-q")
    assert res.exit_code == 0, res.output
    want = (trees[20]["params"]["w"] + trees[300]["params"]["w"]) / 2
    assert np.allclose(cm.load(str(out))["params/w"], want, rtol=0, atol=1e-6)
    old = time.time() - 600  # (a run written minutes ago: watch holds back files still changing)
    for p in root.rglob("*"):
        os.utime(p, (old, old))
    res = run("watch", root, "--timeout", "0", "--json")
    assert res.exit_code == 0, res.output
    seen = [json.loads(line)["step"] for line in res.stdout.splitlines()]
    assert seen == [1, 20, 300], (res.stdout, res.stderr, sorted(p.name for p in root.iterdir()))


def test_a_step_of_several_items_names_each_leaf_by_its_item_and_each_item_reads_alone(tmp_path):
    root = tmp_path / "run"
    step = root / "5"
    params, opt = _tree(1), {"mu": _tree(2)["params"]}
    _item(step / "params", params["params"])
    _item(step / "opt_state", opt)
    (step / "meta").mkdir()
    (step / "meta" / "metadata").write_text('{"lr": 0.1}')  # a JsonCheckpointHandler item
    with cm.open(str(root)) as r:
        assert sorted(r.names(optimizer=True)) == ["opt_state/mu/b", "opt_state/mu/w", "params/b", "params/w"]
        assert r.info("opt_state/mu/w").kind == "optimizer" and r.items["meta"] == "json"
        assert r.get("params/w").tobytes() == params["params"]["w"].tobytes()
    alone = cm.load(str(step / "opt_state"), ["mu/w"])
    assert alone["mu/w"].tobytes() == opt["mu"]["w"].tobytes()
    res = run("ls", root, "--all")
    assert res.exit_code == 0 and "opt_state/mu/w" in res.stdout and "params/b" in res.stdout, res.output


def test_folders_that_are_not_steps_are_never_taken_for_one(tmp_path):
    root = tmp_path / "run"
    _old_run(root, [2])
    # per-process OCDBT folders are named like steps (ocdbt.process_0): never a step of a root
    item = _item(tmp_path / "bare", _tree(0))
    assert (item / "ocdbt.process_0").is_dir()
    assert cm.load(str(item))["params/w"].shape == (2, 3)
    assert orbax_steps(str(item)) == []
    # a step-named folder holding an item beside other files is not a step: the message says so
    (root / "7" / "state").parent.mkdir()
    _item(root / "7" / "state", _tree(7))
    (root / "7" / "notes.txt").write_text("x")
    assert [s.step for s in orbax_steps(str(root))] == [2]
    res = run("ls", root / "7")
    assert res.exit_code == 2 and "Orbax checkpoints (" in res.stderr, res.output
    assert "holds Orbax item(s) 'state' beside 'notes.txt'" in res.stderr and "Traceback" not in res.stderr


@pytest.mark.parametrize("case", ["tmp_only", "no_manifest", "commit_only", "empty"])
def test_a_folder_that_is_almost_an_orbax_checkpoint_says_what_it_saw(tmp_path, case):
    folder = tmp_path / "run"
    folder.mkdir()
    if case == "tmp_only":
        _item(folder / "3.orbax-checkpoint-tmp-99" / "state", _tree(3))
        want = "still being written (or left by a crash) are never read: '3.orbax-checkpoint-tmp-99'"
    elif case == "no_manifest":
        _item(folder / "x", _tree(1))
        for p in folder.glob("x/*"):
            shutil.move(str(p), folder)
        for name in ("manifest.ocdbt", "_METADATA"):
            (folder / name).unlink()
        want = "holds OCDBT data ('d/', 'ocdbt.process_N/') but no 'manifest.ocdbt'"
    elif case == "commit_only":
        (folder / "commit_success.txt").write_text("done")
        want = "holds only 'commit_success.txt'"
    else:
        want = "Orbax checkpoints ('_CHECKPOINT_METADATA', '_METADATA' or 'manifest.ocdbt'"
    res = run("ls", folder)
    assert res.exit_code == 2 and want in res.stderr and "Orbax checkpoints (" in res.stderr, res.stderr
    with pytest.raises(CheckpointNotFoundError, match="Orbax"):
        cm.load(str(folder))


# -- formats newer than the reader knows ------------------------------------------------------


def _rewrite_json(path: Path, **fields) -> None:
    data = json.loads(path.read_text())
    data.update(fields)
    path.write_text(json.dumps(data))


@pytest.mark.parametrize("file,field,value", [("_METADATA", "format_version", 2), ("_METADATA", "version", "1.0"),
                                              ("_CHECKPOINT_METADATA", "metadata_version", 3)])
def test_metadata_with_a_version_field_is_refused_naming_it_and_what_to_upgrade(tmp_path, file, field, value):
    ckpt = write_orbax(tmp_path / "c", _tree(0), "ocdbt+zarr")
    _rewrite_json(ckpt / file, **{field: value})
    with pytest.raises(CheckpointFormatError) as e:
        cm.load(str(ckpt))
    assert f"'{field}' = {value!r}" in str(e.value) and "pip install -U ckptmerge tensorstore" in str(e.value)
    res = run("ls", ckpt)
    assert res.exit_code == 2 and field in res.stderr and "newer Orbax" in res.stderr, res.output


@pytest.mark.parametrize("layout,meta", [("zarr", "params.w/.zarray"), ("zarr3", "params.w/zarr.json")])
def test_a_zarr_format_past_3_is_refused_as_newer(tmp_path, layout, meta):
    ckpt = write_orbax(tmp_path / "c", _tree(0), layout)
    _rewrite_json(ckpt / meta, zarr_format=4)
    with pytest.raises(CheckpointFormatError, match="'params.w' is zarr format 4 .*newer Orbax"):
        cm.load(str(ckpt))


def test_an_ocdbt_manifest_of_a_newer_format_version_is_refused_naming_the_version(tmp_path):
    import crc32c

    ckpt = write_orbax(tmp_path / "c", _tree(0), "ocdbt+zarr")
    data = bytearray((ckpt / "manifest.ocdbt").read_bytes())
    assert data[12] == 0  # the format version varint, after magic (4) and length (8)
    data[12] = 5
    struct.pack_into("<I", data, len(data) - 4, crc32c.crc32c(bytes(data[:-4])))
    (ckpt / "manifest.ocdbt").write_bytes(bytes(data))
    with pytest.raises(CheckpointFormatError) as e:
        cm.load(str(ckpt))
    assert "OCDBT format version 5" in str(e.value) and "pip install -U" in str(e.value), str(e.value)
    res = run("ls", ckpt)
    assert res.exit_code == 2 and "OCDBT format version 5" in res.stderr and "Traceback" not in res.stderr


MATRIX = Path(__file__).resolve().parent / "fixtures" / "orbax_matrix"


@pytest.mark.parametrize("release", sorted(p.name for p in MATRIX.iterdir()) if MATRIX.is_dir() else [])
def test_by_url_a_root_its_steps_and_items_read_as_on_disk(release):
    from _orbax_util import copy_tree_to_memory

    local = MATRIX / release / "manager_items" / "ckpt"
    url = f"memory://orbax-runs-{release}/run"
    copy_tree_to_memory(local, url)
    for rel, step in (("", None), ("", 10), ("20", None), ("20/params", None)):
        want = cm.load(str(local / rel) if rel else str(local), step=step)
        got = cm.load(f"{url}/{rel}" if rel else url, step=step)
        assert sorted(got) == sorted(want) and all(got[k].tobytes() == want[k].tobytes() for k in want), (rel, step)


def test_source_item_picks_one_item_of_a_step_and_a_wrong_one_lists_the_items(tmp_path):
    from ckptmerge.core.errors import ArgumentError

    root = tmp_path / "run"
    for step in (4, 5):
        _item(root / str(step) / "params", _tree(step)["params"])
        _item(root / str(step) / "opt_state", {"mu": _tree(step + 10)["params"]})
    src = cm.Source(str(root), item="opt_state")
    assert src.resolve().prefix == str(root / "5" / "opt_state") and "item=" in repr(src)
    handle = src.open()
    try:
        assert sorted(handle.reader.names()) == ["mu/b", "mu/w"]
    finally:
        handle.reader.close()
    assert cm.Source(str(root), step=4, item="params").resolve().prefix == str(root / "4" / "params")
    with pytest.raises(ArgumentError, match="its items are 'opt_state', 'params'.*Did you mean 'params'"):
        cm.Source(str(root), item="param").resolve()
    with pytest.raises(ArgumentError, match="single item folder"):
        cm.Source(str(root / "5" / "params"), item="params").resolve()
    # in a config file, and through a merge
    config = tmp_path / "m.yaml"
    config.write_text(f"sources:\n  - name: a\n    path: {root}\n    step: 4\n    item: params\n")
    out = tmp_path / "out" / "ckpt"
    res = run("merge", config, "-o", out, "-q")
    assert res.exit_code == 0, res.output
    got = cm.load(str(out))
    assert sorted(got) == ["b", "w"] and got["w"].tobytes() == _tree(4)["params"]["w"].tobytes()
