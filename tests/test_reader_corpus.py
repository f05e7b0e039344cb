"""The reader against real checkpoints written by other people (TF 0.12 to 2.x, Keras 3).

Each corpus folder has a reference.json written with TensorFlow 2.21; names (raw keys), shapes,
dtypes and sha256 of every value must match it exactly, the 2016 V1-format checkpoint included.
"""

from __future__ import annotations

import json

import pytest

from _corpus import corpus, corpus_folders
from _reader_util import digest
from ckptmerge.formats import BundleReader, open_checkpoint
from ckptmerge.core.specs import KIND_BOOKKEEPING, KIND_OPTIMIZER, KIND_VARIABLE

READABLE = corpus_folders()
# keras3-*: one .weights.h5 file; tf0x-v1format-*: one V1 table file
BUNDLES = [f for f in READABLE if not f.startswith(("keras3-", "tf0x-v1format-"))]


def prefixes(folder):
    """Every checkpoint of a corpus folder with its reference: (prefix or h5 file, reference)."""
    ref = json.loads((corpus() / folder / "reference.json").read_text())
    main = ref.get("prefix") or ref["h5file"]
    return [(main, ref), *sorted(ref.get("other_prefixes", {}).items())]


def test_corpus_is_present():
    assert (corpus() / "README.md").is_file(), f"no README.md in the corpus at {corpus()}"
    assert len([p for p in corpus().iterdir() if p.is_dir()]) >= 9


@pytest.mark.parametrize("folder", READABLE)
def test_corpus_checkpoint_matches_reference(folder):
    for prefix, ref in prefixes(folder):
        with open_checkpoint(str(corpus() / folder / prefix)) as reader:
            by_key = {v.raw_key: v for v in reader.variables()}
            expected = {v["name"]: v for v in ref["variables"]}
            assert sorted(by_key) == sorted(expected), prefix
            arrays = reader.read_many([by_key[k].name for k in sorted(expected)])
            for key, want in expected.items():
                info = by_key[key]
                assert list(info.shape) == want["shape"], (prefix, key)
                assert info.dtype == want["dtype"], (prefix, key)
                value = reader.get(info.name)
                assert list(value.shape) == want["shape"], (prefix, key)
                assert digest(value) == want["sha256"], (prefix, key)
                assert digest(arrays[info.name]) == want["sha256"], (prefix, key)


@pytest.mark.parametrize("folder", BUNDLES)
def test_corpus_index_entries_match_reference(folder):
    for prefix, ref in prefixes(folder):
        with BundleReader(str(corpus() / folder / prefix)) as reader:
            assert reader.num_shards == ref["index"]["header"]["num_shards"], prefix
            entries = reader.entries
            for want in ref["index"]["entries"]:
                got = entries[want["key"]]
                assert (got.shard_id, got.offset, got.size, got.crc32c, list(got.shape)) == (
                    want["shard_id"], want["offset"], want["size"], want["crc32c"], want["shape"]), (prefix, want["key"])


def test_v1_format_checkpoint_of_2016_is_read_by_the_v1_reader():
    with open_checkpoint(str(corpus() / "tf0x-v1format-nxt" / "model.ckpt")) as reader:
        assert reader.format == "tf-v1"
        assert reader.info("mweight").shape == (4, 10)
        assert reader.info("mweight/Adam").kind == KIND_OPTIMIZER
        assert reader.info("mbias").kind == KIND_VARIABLE


def test_snappy_compressed_index_block_reads():
    folder = corpus() / "tfserving-tf214-half-plus-two"
    assert "snappy" in json.loads((folder / "reference.json").read_text())["index"]["block_compression"]
    with open_checkpoint(str(folder / "variables")) as reader:
        assert {v.name: float(reader.get(v.name)) for v in reader.variables() if v.dtype == "float32"} == {
            "a": 0.5, "b": 2.0, "c": 3.0}


def test_estimator_directory_has_two_checkpoints_with_two_shards():
    folder = corpus() / "tf114-estimator-sharded-adult"
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
    with open_checkpoint(str(corpus() / "keras2-tfweights-cp-charity" / "cp.ckpt")) as reader:
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
    with open_checkpoint(str(corpus() / "tf2obj-2025-ckptmanager-comp" / "ckpt-10")) as reader:
        kinds = {v.raw_key: v.kind for v in reader.variables()}
        assert kinds["compensator_optimizer/_iterations/.ATTRIBUTES/VARIABLE_VALUE"] == KIND_OPTIMIZER
        assert kinds["compensator/fc1/_kernel/.ATTRIBUTES/VARIABLE_VALUE"] == KIND_VARIABLE
        assert kinds["save_counter/.ATTRIBUTES/VARIABLE_VALUE"] == KIND_BOOKKEEPING
        assert int(reader.get("save_counter")) == 10


def test_name_based_keras_in_tf1_optimizer_scopes_are_optimizer_state():
    with open_checkpoint(str(corpus() / "tf18sm-iris-keras" / "variables")) as reader:
        kinds = {v.name: v.kind for v in reader.variables()}
    assert kinds["training/Adam/Variable_3"] == KIND_OPTIMIZER
    assert kinds["Adam/iterations"] == KIND_OPTIMIZER
    assert kinds["dense_1/kernel"] == KIND_VARIABLE


def test_keras3_weights_h5_names_are_dataset_paths():
    with open_checkpoint(str(corpus() / "keras3-weights-h5-churn" / "model.weights.h5")) as reader:
        assert reader.format == "keras-h5"
        assert reader.info("layers/dense/vars/0").shape == (12, 64)
        assert reader.info("layers/dense/vars/0").kind == KIND_VARIABLE
        assert reader.info("optimizer/vars/3").kind == KIND_OPTIMIZER
        assert reader.object_graph is None
