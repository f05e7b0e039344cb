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
