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


def test_basename_dirname_and_join_ignore_the_query():
    url = "https://h/run/model.safetensors.index.json?download=true"
    assert up.basename(url) == "model.safetensors.index.json"
    assert up.dirname(url) == "https://h/run"
    assert up.join(up.dirname(url), "model-00001-of-00002.safetensors") == \
        "https://h/run/model-00001-of-00002.safetensors"
    assert up.dirname("s3://bucket") == "s3://bucket" and up.basename("s3://b/run/") == "run"
    assert up.relative_to("s3://b/run/ckpt-1", "s3://b/run/") == "ckpt-1"
    assert up.relative_to("s3://other/ckpt-1", "s3://b/run") == "s3://other/ckpt-1"


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
