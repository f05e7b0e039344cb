"""Keras 3 sharded weights (issue 20, 2): a ``*.weights.json`` and its ``*_NNNNN.weights.h5`` shards.

``save_weights(path, max_shard_size=...)`` writes them; everywhere a path is accepted (``ls``,
``diff``, ``merge``, plan, restore; by path and by URL) they read as one file, shard by shard.
"""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
from _cli_util import run

import ckptmerge as cm


@pytest.fixture(scope="module")
def saved(tmp_path_factory, tf):
    """A model saved twice: as three shards (one layer split between two) and as one file."""
    import keras

    def build():
        return keras.Sequential([keras.Input((4,))] + [keras.layers.Dense(16) for _ in range(5)]
                                + [keras.layers.Dense(2)])

    root = tmp_path_factory.mktemp("shards")
    model = build()
    rng = np.random.default_rng(2)
    for v in model.weights:
        v.assign(rng.standard_normal(v.shape).astype(np.float32))
    (root / "set").mkdir()
    model.save_weights(str(root / "set" / "model.weights.json"), max_shard_size=0.000002)
    model.save_weights(str(root / "one.weights.h5"))
    return {"root": root, "json": root / "set" / "model.weights.json", "one": root / "one.weights.h5",
            "model": model, "build": build}


def test_save_weights_wrote_several_shards_and_a_split_layer(saved):
    names = sorted(os.listdir(saved["root"] / "set"))
    assert names == ["model.weights.json", "model_00000.weights.h5", "model_00001.weights.h5",
                     "model_00002.weights.h5"]
    weight_map = json.loads(saved["json"].read_text())["weight_map"]
    assert any(isinstance(v, list) and len(v) == 2 for v in weight_map.values())


def test_a_sharded_set_lists_and_reads_as_the_unsharded_file(saved):
    sharded = cm.list_variables(saved["json"])
    whole = cm.list_variables(saved["one"])
    assert [(v.name, v.shape, v.dtype) for v in sharded] == [(v.name, v.shape, v.dtype) for v in whole]
    a, b = cm.load(saved["json"]), cm.load(saved["one"])
    assert a.keys() == b.keys()
    for k in a:
        np.testing.assert_array_equal(a[k], b[k], err_msg=k)
    with cm.open(saved["json"]) as reader:
        assert [os.path.basename(f) for f in reader.files] == [
            "model_00000.weights.h5", "model_00001.weights.h5", "model_00002.weights.h5"]
        assert sum(c.size for c in reader.iter_chunks("layers/dense_3/vars/0", 7)) == 256


def test_a_sharded_set_restores_as_load_weights_does(saved):
    theirs, ours = saved["build"](), saved["build"]()
    theirs.load_weights(str(saved["json"]))
    report = cm.restore(ours, [cm.Source(saved["json"])])
    assert len(report.restored) == 12
    for a, b, c in zip(ours.weights, theirs.weights, saved["model"].weights):
        np.testing.assert_array_equal(a.numpy(), b.numpy())
        np.testing.assert_array_equal(a.numpy(), c.numpy())


def test_a_shard_or_the_folder_means_the_whole_set(saved):
    shard = saved["root"] / "set" / "model_00001.weights.h5"
    resolved = cm.Source(shard).resolve()
    assert resolved.prefix == str(saved["json"]) and resolved.note.startswith("all shards of Keras sharded weights")
    folder = cm.Source(saved["root"] / "set").resolve()
    assert folder.prefix == str(saved["json"])
    (info,) = cm.checkpoints(saved["root"] / "set")
    assert info.path == str(saved["json"])
    assert info.size == sum(os.path.getsize(saved["root"] / "set" / n) for n in os.listdir(saved["root"] / "set"))


def test_ls_diff_and_merge_take_a_sharded_set(saved, tmp_path):
    r = run("ls", saved["json"])
    assert r.exit_code == 0, r.output
    assert "layers/dense_3/vars/0" in r.stdout and "12 variables" in r.stdout
    r = run("diff", saved["json"], saved["one"], "--values")
    assert r.exit_code == 0, r.output
    out = tmp_path / "merged" / "ckpt"
    cm.merge([cm.Source(saved["json"])], out)
    merged = cm.load(out)
    for k, v in cm.load(saved["one"]).items():
        np.testing.assert_array_equal(merged[k], v)


def test_a_sharded_set_reads_by_url(saved):
    import fsspec

    fs = fsspec.filesystem("memory")
    url = f"memory://shards-{os.getpid()}"
    for name in os.listdir(saved["root"] / "set"):
        fs.pipe(f"{url}/{name}", (saved["root"] / "set" / name).read_bytes())
    try:
        values = cm.load(f"{url}/model.weights.json")
        np.testing.assert_array_equal(values["layers/dense_5/vars/0"], saved["model"].layers[5].kernel.numpy())
        assert cm.Source(url).resolve().prefix == f"{url}/model.weights.json"
        assert cm.Source(f"{url}/model_00002.weights.h5").resolve().prefix == f"{url}/model.weights.json"
        (info,) = cm.checkpoints(url)
        assert info.size == sum(os.path.getsize(saved["root"] / "set" / n) for n in os.listdir(saved["root"] / "set"))
        ours = saved["build"]()
        cm.restore(ours, [cm.Source(f"{url}/model.weights.json")])
        for a, b in zip(ours.weights, saved["model"].weights):
            np.testing.assert_array_equal(a.numpy(), b.numpy())
    finally:
        fs.rm(url, recursive=True)


def test_a_weight_map_naming_a_file_outside_its_folder_is_refused(saved, tmp_path):
    bad = tmp_path / "bad.weights.json"
    bad.write_text(json.dumps({"weight_map": {"/layers/dense/vars": "../set/model_00000.weights.h5"}}))
    with pytest.raises(cm.CheckpointFormatError, match="not a file name in the JSON's own folder"):
        cm.list_variables(bad)
    missing = tmp_path / "missing.weights.json"
    missing.write_text(json.dumps({"weight_map": {"/layers/dense/vars": "missing_00000.weights.h5"}}))
    with pytest.raises(cm.CheckpointNotFoundError, match="the set is incomplete"):
        cm.list_variables(missing)
    garbage = tmp_path / "garbage.weights.json"
    garbage.write_text("{not json")
    with pytest.raises(cm.CheckpointFormatError, match="not valid JSON"):
        cm.list_variables(garbage)
    listed = {os.path.basename(c.path): c.size for c in cm.checkpoints(tmp_path)}  # listed, refused when opened
    assert listed["garbage.weights.json"] == os.path.getsize(garbage) and len(listed) == 3


@pytest.fixture(scope="module")
def sets(saved, tmp_path_factory):
    """The fixture's set, and one more of another model cut into more shards (another base name)."""
    import keras

    root = tmp_path_factory.mktemp("more")
    model = keras.Sequential([keras.Input((6,))] + [keras.layers.Dense(8) for _ in range(4)])
    model.save_weights(str(root / "net.weights.json"), max_shard_size=0.0000004)
    return [(saved["root"] / "set", "model"), (root, "net")]


def _shards(folder, base):
    return sorted(n for n in os.listdir(folder) if n.startswith(base + "_") and n.endswith(".weights.h5"))


def _names_a_group(path):
    import h5py

    found = []
    with h5py.File(path, "r") as f:
        f.visititems(lambda n, o: found.append(n) if isinstance(o, h5py.Group) and "name" in o.attrs else None)
    return bool(found)


def _refused_as_lone(path, index_name):
    """The API and the CLI refuse ``path``: one Error line naming the set's JSON."""
    for call in (cm.list_variables, cm.load, lambda p: cm.Source(p).resolve()):
        with pytest.raises(cm.CheckpointFormatError) as err:
            call(path)
        text = str(err.value)
        assert "of a Keras sharded weights set" in text and f"index '{index_name}'" in text, text
        assert "one shard alone restores only part of a model" in text, text
    r = run("ls", path)
    assert r.exit_code == 2 and r.stdout == "" and r.stderr.count("\n") == 1, r.output
    assert index_name in r.stderr and "Traceback" not in r.stderr


def test_a_shard_copied_without_its_json_is_refused_naming_the_index(sets, tmp_path):
    """Issue 30 (holes): one shard opened by itself restored part of a model with no error."""
    for folder, base in sets:
        names = _shards(folder, base)
        assert len(names) >= 3, names
        for name in names:  # each shard alone in a folder
            if not _names_a_group(folder / name):
                continue  # only the rest of a split layer: told by its first shard beside it (below)
            alone = tmp_path / f"alone-{base}-{name}"
            alone.mkdir()
            (alone / name).write_bytes((folder / name).read_bytes())
            _refused_as_lone(alone / name, f"{base}.weights.json")
        together = tmp_path / f"no-json-{base}"  # every shard, the JSON forgotten
        together.mkdir()
        for name in names:
            (together / name).write_bytes((folder / name).read_bytes())
        for name in names:
            _refused_as_lone(together / name, f"{base}.weights.json")
        for name in names:  # with the JSON beside it, a shard still means its whole set
            assert cm.Source(folder / name).resolve().prefix == str(folder / f"{base}.weights.json")


def test_whole_files_numbered_like_shards_are_read_as_they_are(saved, tmp_path):
    one = saved["one"].read_bytes()
    for name in ("model_00001.weights.h5", "ep_00042.weights.h5"):  # ModelCheckpoint-style names
        (tmp_path / name).write_bytes(one)
        assert len(cm.list_variables(tmp_path / name)) == 12
    for name in ("avg_00000.weights.h5", "avg_00003.weights.h5"):  # ckptmerge's own outputs, numbered
        r = run("average", saved["one"], saved["json"], "-o", tmp_path / name)
        assert r.exit_code == 0, r.output
        assert len(cm.list_variables(tmp_path / name)) == 12
    (tmp_path / "whole_00000.weights.h5").write_bytes(one)  # Keras's first-shard name: told to rename
    with pytest.raises(cm.CheckpointFormatError, match=r"rename it so that its name does not end in _NNNNN"):
        cm.list_variables(tmp_path / "whole_00000.weights.h5")
