"""The reader against real checkpoints written by other people (TF 0.12 to 2.x, Keras 3).

Each corpus folder has a reference.json written with TensorFlow 2.21; names (raw keys), shapes,
dtypes and sha256 of every value must match it exactly.
"""

from __future__ import annotations

import json

import pytest

from _reader_util import CORPUS, digest
from ckptmerge.errors import CheckpointFormatError
from ckptmerge.formats import BundleReader, open_checkpoint
from ckptmerge.specs import KIND_BOOKKEEPING, KIND_OPTIMIZER, KIND_VARIABLE


def _cases():
    if not (CORPUS / "README.md").is_file():
        # Not a skip: the corpus is part of the test suite (see tests/_reader_util.py).
        return [pytest.param(None, None, None, id="corpus-missing")]
    cases = []
    for folder in sorted(p for p in CORPUS.iterdir() if p.is_dir()):
        ref = json.loads((folder / "reference.json").read_text())
        if folder.name == "tf0x-v1format-nxt":
            continue
        main = ref.get("prefix") or ref["h5file"]
        cases.append(pytest.param(folder, main, ref, id=f"{folder.name}:{main}"))
        for other, other_ref in sorted(ref.get("other_prefixes", {}).items()):
            cases.append(pytest.param(folder, other, other_ref, id=f"{folder.name}:{other}"))
    return cases


def test_corpus_is_present():
    assert (CORPUS / "README.md").is_file(), f"shared corpus not found at {CORPUS}"
    assert len([p for p in CORPUS.iterdir() if p.is_dir()]) >= 9


@pytest.mark.parametrize("folder,prefix,ref", _cases())
def test_corpus_checkpoint_matches_reference(folder, prefix, ref):
    assert folder is not None, f"shared corpus not found at {CORPUS}"
    with open_checkpoint(str(folder / prefix)) as reader:
        by_key = {v.raw_key: v for v in reader.variables()}
        expected = {v["name"]: v for v in ref["variables"]}
        assert sorted(by_key) == sorted(expected)
        arrays = reader.read_many([by_key[k].name for k in sorted(expected)])
        for key, want in expected.items():
            info = by_key[key]
            assert list(info.shape) == want["shape"], key
            assert info.dtype == want["dtype"], key
            value = reader.get(info.name)
            assert list(value.shape) == want["shape"], key
            assert digest(value) == want["sha256"], key
            assert digest(arrays[info.name]) == want["sha256"], key


@pytest.mark.parametrize("folder,prefix,ref", [c for c in _cases() if c.values[2] and "index" in c.values[2]])
def test_corpus_index_entries_match_reference(folder, prefix, ref):
    with BundleReader(str(folder / prefix)) as reader:
        assert reader.num_shards == ref["index"]["header"]["num_shards"]
        entries = reader.entries
        for want in ref["index"]["entries"]:
            got = entries[want["key"]]
            assert (got.shard_id, got.offset, got.size, got.crc32c, list(got.shape)) == (
                want["shard_id"], want["offset"], want["size"], want["crc32c"], want["shape"])


def test_v1_format_checkpoint_is_refused_with_conversion_hint():
    path = CORPUS / "tf0x-v1format-nxt" / "model.ckpt"
    with pytest.raises(CheckpointFormatError) as err:
        open_checkpoint(str(path))
    msg = str(err.value)
    assert "V1" in msg and "TensorFlow <= 0.11" in msg
    assert ".index" in msg and ".weights.h5" in msg and "tf.compat.v1.train.Saver" in msg
    assert err.value.path == str(path)


def test_snappy_compressed_index_block_reads():
    folder = CORPUS / "tfserving-tf214-half-plus-two"
    assert "snappy" in json.loads((folder / "reference.json").read_text())["index"]["block_compression"]
    with open_checkpoint(str(folder / "variables")) as reader:
        assert {v.name: float(reader.get(v.name)) for v in reader.variables() if v.dtype == "float32"} == {
            "a": 0.5, "b": 2.0, "c": 3.0}


def test_estimator_directory_has_two_checkpoints_with_two_shards():
    folder = CORPUS / "tf114-estimator-sharded-adult"
    for step in ("model.ckpt-0", "model.ckpt-5000"):
        with BundleReader(str(folder / step)) as reader:
            assert reader.num_shards == 2
            assert {e.shard_id for e in reader.entries.values()} == {0, 1}
            assert reader.info("global_step").kind == KIND_BOOKKEEPING
            assert reader.info("linear/linear_model/Age/weights/part_0/Ftrl").kind == KIND_OPTIMIZER
            assert reader.info("linear/linear_model/Age/weights").kind == KIND_VARIABLE
    with open_checkpoint(str(folder / "model.ckpt-5000")) as reader:
        assert int(reader.get("global_step")) == 5000


def test_keras2_object_graph_names_are_variable_names():
    with open_checkpoint(str(CORPUS / "keras2-tfweights-cp-charity" / "cp.ckpt")) as reader:
        kernel = reader.info("dense/kernel")
        assert kernel.raw_key == "layer_with_weights-0/kernel/.ATTRIBUTES/VARIABLE_VALUE"
        assert kernel.kind == KIND_VARIABLE
        slot = reader.info("layer_with_weights-0/kernel/.OPTIMIZER_SLOT/optimizer/m/.ATTRIBUTES/VARIABLE_VALUE")
        assert slot.kind == KIND_OPTIMIZER
        assert reader.info("optimizer/iter/.ATTRIBUTES/VARIABLE_VALUE").kind == KIND_OPTIMIZER
        assert reader.info("_CHECKPOINTABLE_OBJECT_GRAPH").kind == KIND_BOOKKEEPING
        assert reader.object_graph is not None and len(reader.object_graph.nodes) > 10


def test_optimizer_under_a_prefixed_edge_is_optimizer_state():
    # The 2025 CheckpointManager checkpoint names its optimizer edge "compensator_optimizer".
    with open_checkpoint(str(CORPUS / "tf2obj-2025-ckptmanager-comp" / "ckpt-10")) as reader:
        kinds = {v.raw_key: v.kind for v in reader.variables()}
        assert kinds["compensator_optimizer/_iterations/.ATTRIBUTES/VARIABLE_VALUE"] == KIND_OPTIMIZER
        assert kinds["compensator/fc1/_kernel/.ATTRIBUTES/VARIABLE_VALUE"] == KIND_VARIABLE
        assert kinds["save_counter/.ATTRIBUTES/VARIABLE_VALUE"] == KIND_BOOKKEEPING
        assert int(reader.get("save_counter")) == 10


def test_name_based_keras_in_tf1_optimizer_scopes_are_optimizer_state():
    with open_checkpoint(str(CORPUS / "tf18sm-iris-keras" / "variables")) as reader:
        kinds = {v.name: v.kind for v in reader.variables()}
    assert kinds["training/Adam/Variable_3"] == KIND_OPTIMIZER
    assert kinds["Adam/iterations"] == KIND_OPTIMIZER
    assert kinds["dense_1/kernel"] == KIND_VARIABLE


def test_keras3_weights_h5_names_are_dataset_paths():
    with open_checkpoint(str(CORPUS / "keras3-weights-h5-churn" / "model.weights.h5")) as reader:
        assert reader.format == "keras-h5"
        assert reader.info("layers/dense/vars/0").shape == (12, 64)
        assert reader.info("layers/dense/vars/0").kind == KIND_VARIABLE
        assert reader.info("optimizer/vars/3").kind == KIND_OPTIMIZER
        assert reader.object_graph is None
