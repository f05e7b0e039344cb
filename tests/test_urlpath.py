"""URL path operations keep a query where it belongs (issue 24, item 8).

``https://host/w/model.safetensors?download=true`` must not become ``...?download=true.index``:
suffixes, base names and parents apply to the URL's path, the query stays. The pure helpers are
tested on literal strings; the readers against a local HTTP server that ignores queries (as many
do), so a mangled URL would be served the wrong file.
"""

from __future__ import annotations

import io
import json

import numpy as np
import pytest
from _http_server import FileServer

import ckptmerge as cm
from ckptmerge.formats.io import urlpath as up
from ckptmerge.formats.tf.bundle import data_file_name

W = np.arange(12, dtype=np.float32).reshape(3, 4)


# -- the helpers --------------------------------------------------------------------------------


@pytest.mark.parametrize("url, head, tail", [
    ("https://h/a/m.safetensors?download=true", "https://h/a/m.safetensors", "?download=true"),
    ("http://h/a/b#frag", "http://h/a/b", "#frag"),
    ("https://h/a/b?x=1#f?g", "https://h/a/b", "?x=1#f?g"),
    ("https://h/a/b", "https://h/a/b", ""),
    ("https://h/run/m.ckpt-?????-of-00002", "https://h/run/m.ckpt-?????-of-00002", ""),  # a V1 pattern
    ("https://h/run/m.ckpt-?????-of-00002?t=1", "https://h/run/m.ckpt-?????-of-00002", "?t=1"),
    ("s3://b/odd?key", "s3://b/odd?key", ""),  # in an object store '?' is part of the key
    ("memory://x/y#z", "memory://x/y#z", ""),
    ("runs/A/ckpt?1", "runs/A/ckpt?1", ""),  # a local path has no query
])
def test_split_tail_separates_only_an_http_query_and_fragment(url, head, tail):
    assert up.split_tail(url) == (head, tail)


def test_suffix_operations_apply_to_the_path_and_keep_the_query():
    url = "https://h/run/ckpt-1?download=true"
    assert up.add_suffix(url, ".index") == "https://h/run/ckpt-1.index?download=true"
    assert up.has_suffix("https://h/run/ckpt-1.index?download=true", ".index")
    assert not up.has_suffix("https://h/run/ckpt-1?x=.index", ".index")
    assert up.strip_suffix("https://h/run/ckpt-1.index?download=true", ".index") == url
    assert up.strip_suffix(url, ".index") == url  # not there: unchanged
    assert data_file_name(url, 0, 1) == "https://h/run/ckpt-1.data-00000-of-00001?download=true"
    assert up.add_suffix("runs/A/ckpt-1", ".index") == "runs/A/ckpt-1.index"  # local paths as before


def test_basename_is_a_name_and_dirname_join_and_sibling_keep_the_query():
    url = "https://h/run/model.safetensors.index.json?download=true"
    assert up.basename(url) == "model.safetensors.index.json"
    assert up.dirname(url) == "https://h/run?download=true"
    assert up.join(up.dirname(url), "model-00001-of-00002.safetensors") == \
        "https://h/run/model-00001-of-00002.safetensors?download=true"
    assert up.sibling(url, "model-00001-of-00002.safetensors") == \
        "https://h/run/model-00001-of-00002.safetensors?download=true"
    assert up.sibling("https://h/run/ckpt-1?X-Amz-Signature=s#f", "checkpoint") == \
        "https://h/run/checkpoint?X-Amz-Signature=s#f"
    assert up.dirname("https://h?x=1") == "https://h?x=1" and up.dirname("https://h/a?x=1") == "https://h?x=1"
    assert up.strip_slash("https://h/run/?x=1") == "https://h/run?x=1"
    assert up.dirname("s3://bucket") == "s3://bucket" and up.basename("s3://b/run/") == "run"
    assert up.sibling("s3://b/run/odd?key", "checkpoint") == "s3://b/run/checkpoint"  # no query in s3
    assert up.sibling("runs/A/ckpt-1?x", "checkpoint") == "runs/A/checkpoint"  # nor in a local path
    assert up.relative_to("s3://b/run/ckpt-1", "s3://b/run/") == "ckpt-1"
    assert up.relative_to("https://h/run/ckpt-1?t=1", "https://h/run?t=1") == "ckpt-1"
    assert up.relative_to("s3://other/ckpt-1", "s3://b/run") == "s3://other/ckpt-1"


def test_name_tests_of_the_package_look_at_the_path_not_the_query():
    from ckptmerge.formats.keras.shards import is_keras_shards
    from ckptmerge.formats.tf.v1 import v1_pattern, v1_shard_files
    from ckptmerge.sources.files import is_h5_name, step_of, v1_pattern_of
    from ckptmerge.following.scan import Candidate

    q = "?download=true"
    assert step_of("https://h/run/ckpt-200" + q) == 200 and step_of("https://h/run/ckpt-7.weights.h5" + q) == 7
    assert is_h5_name("https://h/m.weights.h5" + q) and not is_h5_name("https://h/m?x=.h5")
    assert is_keras_shards("https://h/m.weights.json" + q) and not is_keras_shards("https://h/m?x=.weights.json")
    assert v1_pattern("https://h/m.ckpt-00001-of-00002" + q) == "https://h/m.ckpt-?????-of-00002" + q
    assert v1_pattern_of("https://h/m.ckpt-00001-of-00002" + q) == "https://h/m.ckpt-?????-of-00002" + q
    assert v1_shard_files("https://h/m.ckpt-?????-of-00002" + q) == [
        "https://h/m.ckpt-00000-of-00002" + q, "https://h/m.ckpt-00001-of-00002" + q]
    assert Candidate("https://h/run/ckpt-1" + q, 1, "bundle").main_file == "https://h/run/ckpt-1.index" + q


def test_an_output_url_is_the_input_whatever_its_query():
    from ckptmerge.sources.files import same_checkpoint_path

    assert same_checkpoint_path("https://h/m.safetensors?download=true", "HTTPS://H:443/m.safetensors")
    assert not same_checkpoint_path("https://h/m.safetensors?download=true", "https://h/n.safetensors?download=true")


@pytest.mark.parametrize("a, b", [
    ("S3A://bucket//run/ckpt-1/", "s3://bucket/run/ckpt-1"),
    ("gcs://Bucket/run/ckpt-1", "gs://bucket/run/ckpt-1"),
    ("az://c/run/x", "abfss://c/run/x"),
    ("memory://run/x", "memory:///run/x"),
    ("HTTPS://Host:443/a", "https://host/a"),
])
def test_canonical_url_folds_spellings_of_one_object(a, b):
    assert up.canonical_url(a) == up.canonical_url(b)


@pytest.mark.parametrize("a, b", [
    ("s3://bucket/run/ckpt-1", "s3://bucket/run/ckpt-10"),
    ("s3://bucket/run/Ckpt-1", "s3://bucket/run/ckpt-1"),  # keys are case-sensitive
    ("memory://run/x", "s3://run/x"),
    ("https://h/a", "http://h/a"),
])
def test_canonical_url_keeps_different_objects_apart(a, b):
    assert up.canonical_url(a) != up.canonical_url(b)


# -- readers over HTTP with a query ----------------------------------------------------------------


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """A TF checkpoint, a safetensors file, a sharded safetensors set and an .npz on a local server."""
    import tensorflow as tf
    from safetensors.numpy import save_file

    d = tmp_path_factory.mktemp("served")
    m = tf.Module()
    m.w = tf.Variable(W, name="w")
    prefix = tf.train.Checkpoint(model=m).write(str(d / "ckpt-1"))
    save_file({"w": W}, str(d / "model.safetensors"))
    save_file({"a": W}, str(d / "model-00001-of-00002.safetensors"))
    save_file({"b": W * 2}, str(d / "model-00002-of-00002.safetensors"))
    (d / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": {
        "a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors"}}))
    buf = io.BytesIO()
    np.savez(buf, w=W)
    files = {"/" + f.name: f.read_bytes() for f in d.iterdir() if f.is_file()}
    files["/arrays.npz"] = buf.getvalue()
    server = FileServer(files)
    yield server, prefix
    server.close()


@pytest.mark.parametrize("name, key", [("ckpt-1", "w"),
                                       ("model.safetensors", "w"),
                                       ("model.safetensors.index.json", "b"),
                                       ("arrays.npz", "w")])
def test_a_url_with_a_query_reads_the_files_its_path_names(served, name, key):
    server, _ = served
    url = f"{server.url}/{name}?download=true"
    del server.requests[:]
    values = cm.load(url)
    assert key in values
    np.testing.assert_array_equal(values[key], W * 2 if key == "b" else W)
    asked = [p for _, p, _ in server.requests]
    assert not any("?download=true." in p for p in asked), asked  # never a suffix after the query
    if name == "ckpt-1":  # the index and the data shard, each with the query kept
        assert f"/{name}.index?download=true" in asked
        assert f"/{name}.data-00000-of-00001?download=true" in asked


def test_cli_ls_of_a_url_with_a_query(served):
    from _cli_util import run

    server, _ = served
    r = run("ls", f"{server.url}/model.safetensors?download=true", "--json")
    assert r.exit_code == 0, r.output
    assert [v["name"] for v in json.loads(r.stdout)] == ["w"]


# -- files beside a file: shards of an index or of a Keras .weights.json, over HTTP ----------------


@pytest.fixture(scope="module")
def keras_set(tmp_path_factory):
    """A Keras sharded set (three .weights.h5 shards and their .weights.json) on a local server."""
    import keras

    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(8), keras.layers.Dense(8), keras.layers.Dense(2)])
    d = tmp_path_factory.mktemp("kset")
    model.save_weights(str(d / "model.weights.json"), max_shard_size=0.0000003)
    files = {"/w/" + f.name: f.read_bytes() for f in d.iterdir()}
    assert len(files) >= 3, sorted(files)  # the JSON and at least two shards
    server = FileServer(files)
    yield server, cm.load(str(d / "model.weights.json")), sorted(f for f in files if f.endswith(".h5"))
    server.close()


def _asked(server):
    return [p for _, p, _ in server.requests]


def test_keras_shards_named_by_a_json_with_a_query_are_asked_for_with_it(keras_set):
    server, values, shards = keras_set
    del server.requests[:]
    got = cm.load(f"{server.url}/w/model.weights.json?download=true")
    assert got.keys() == values.keys()
    for k in values:
        np.testing.assert_array_equal(got[k], values[k])
    asked = _asked(server)
    assert all(p.endswith("?download=true") for p in asked), asked
    probe = "/w/model.weights.json.index"  # (is it a TF prefix? asked first, with the query too)
    assert {p.split("?")[0] for p in asked} - {probe} == {"/w/model.weights.json", *shards}


def test_one_keras_shard_with_a_query_means_its_whole_set(keras_set):
    server, values, shards = keras_set
    resolved = cm.Source(f"{server.url}{shards[1]}?download=true").resolve()
    assert resolved.prefix == f"{server.url}/w/model.weights.json?download=true"
    assert resolved.note == f"all shards of Keras sharded weights {server.url}/w/model.weights.json?download=true"
    assert cm.load(f"{server.url}{shards[1]}?download=true").keys() == values.keys()


def test_safetensors_shards_named_by_an_index_with_a_query_are_asked_for_with_it(served):
    server, _ = served
    del server.requests[:]
    cm.load(f"{server.url}/model.safetensors.index.json?download=true")
    asked = _asked(server)
    assert "/model-00001-of-00002.safetensors?download=true" in asked
    assert "/model-00002-of-00002.safetensors?download=true" in asked
    assert all(p.endswith("?download=true") for p in asked), asked


def test_a_missing_shard_of_a_signed_url_is_named_without_the_signature(keras_set):
    from _cli_util import run

    server, _, shards = keras_set
    kept = server.files.pop(shards[0])
    try:
        url = f"{server.url}/w/model.weights.json?X-Amz-Signature=s3cr3tsig&X-Amz-Date=1"
        r = run("ls", url)
    finally:
        server.files[shards[0]] = kept
    assert r.exit_code == 2, r.output
    assert "Traceback" not in r.output and "s3cr3tsig" not in r.output
    assert shards[0].rsplit("/", 1)[1] in r.stderr and "X-Amz-Signature=***" in r.stderr, r.stderr


def test_cli_ls_and_plan_of_a_keras_set_by_a_url_with_a_query(keras_set):
    from _cli_util import run

    server, values, _ = keras_set
    r = run("ls", f"{server.url}/w/model.weights.json?download=true", "--json")
    assert r.exit_code == 0, r.output
    assert sorted(v["name"] for v in json.loads(r.stdout)) == sorted(values)


@pytest.mark.parametrize("shard", ["..%2Fsecret.safetensors", "a.safetensors?x=../../s", "a#b.safetensors",
                                   "..\\secret.safetensors"])
def test_an_index_by_url_naming_a_shard_a_server_could_read_elsewhere_is_refused(served, shard):
    server, _ = served
    server.files["/evil.safetensors.index.json"] = json.dumps({"weight_map": {"a": shard}}).encode()
    del server.requests[:]
    with pytest.raises(cm.CheckpointFormatError, match="not a file name in the index's own directory"):
        cm.load(f"{server.url}/evil.safetensors.index.json")
    assert [p for _, p, _ in server.requests if "evil" not in p] == []  # the shard was never asked for


# -- a presigned URL: its signature opens its own key only ----------------------------------------


@pytest.mark.parametrize("name, key", [("model.safetensors", "w"), ("arrays.npz", "w")])
def test_a_presigned_url_is_read_though_every_other_key_is_refused(served, name, key):
    """A presigned query signs one key: the store answers 403 for every file looked for beside it
    (``<name>.index`` is probed to see whether it is a TF prefix). The probe counts as absent."""
    from _cli_util import run
    from _http_server import Fault

    server, _ = served
    server.faults[:] = [Fault(status=403, path=rf"^(?!/{name}$)")]
    try:
        url = f"{server.url}/{name}?X-Amz-Signature=s1gnature&X-Amz-Expires=60"
        np.testing.assert_array_equal(cm.load(url)[key], W)
        r = run("ls", url)
        assert r.exit_code == 0 and "s1gnature" not in r.output, r.output
        server.faults[:] = [Fault(status=403)]  # the file itself refused: that is the error
        r = run("ls", url)
    finally:
        server.faults[:] = []
    assert r.exit_code == 2 and "Traceback" not in r.output, r.output
    assert f"Access denied to '{server.url}/{name}?X-Amz-Signature=***" in r.stderr, r.stderr
