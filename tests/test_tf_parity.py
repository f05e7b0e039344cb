"""Parity with TensorFlow: TF's own scenarios, run through TF and through ckptmerge, compared bit for bit.

The scenarios are those of TF's ``checkpoint_utils_test.py`` (``init_from_checkpoint``,
``load_variable``, ``list_variables``) and ``warm_starting_util_test.py`` (``warm_start``,
``VocabInfo``), rewritten here. Each builds the same graph twice (same graph-level seed, so the
variables that are not restored get the same random values), lets TF's function initialise one
and ckptmerge's documented equivalent the other, and compares every global variable's bytes.
"""

from __future__ import annotations

import os
import pathlib

import numpy as np
import pytest

import ckptmerge as cm


# --------------------------------------------------------------------------------------------
# harness


def _values(tf, sess):
    """Every global variable's value, by op name (a partitioned variable's parts one by one)."""
    gvars = tf.compat.v1.global_variables()
    return dict(zip([v.op.name for v in gvars], sess.run(gvars)))


def _assert_same(expected, got):
    assert sorted(got) == sorted(expected)
    for name in expected:
        e, g = np.asarray(expected[name]), np.asarray(got[name])
        assert (e.dtype, e.shape) == (g.dtype, g.shape), name
        if e.dtype == object:
            assert e.tolist() == g.tolist(), name
        else:
            assert e.tobytes() == g.tobytes(), name


def _save(tf, path, build, seed=7):
    """Build variables in a fresh graph, initialise them (seeded) and save them with a Saver."""
    with tf.Graph().as_default() as g:
        tf.compat.v1.set_random_seed(seed)
        build(tf)
        saver = tf.compat.v1.train.Saver()
        with tf.compat.v1.Session(graph=g) as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            return saver.save(sess, str(path))


def _with_tf(tf, build, warm):
    """Build the target graph, let TF's own function set it up (``warm(tf, built)``), initialise."""
    with tf.Graph().as_default() as g:
        tf.compat.v1.set_random_seed(1)
        built = build(tf)
        warm(tf, built)
        with tf.compat.v1.Session(graph=g) as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            return _values(tf, sess)


def _with_cm(tf, build, sources, **options):
    """Build the same graph, initialise it, restore with ckptmerge (``sources(built)``)."""
    options.setdefault("allow_missing", "*")
    with tf.Graph().as_default() as g:
        tf.compat.v1.set_random_seed(1)
        built = build(tf)
        with tf.compat.v1.Session(graph=g) as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            cm.restore(None, sources(built), session=sess, **options)
            return _values(tf, sess)


def _parity(tf, build, tf_warm, cm_sources, **options):
    expected = _with_tf(tf, build, tf_warm)
    got = _with_cm(tf, build, cm_sources, **options)
    _assert_same(expected, got)
    return got


def _get(tf, name, shape=None, **kw):
    return tf.compat.v1.get_variable(name, shape, **kw)


# --------------------------------------------------------------------------------------------
# checkpoints of checkpoint_utils_test.py


def _ckpt_vars(tf):
    _get(tf, "var1", [1, 10])
    _get(tf, "var2", [10, 10])
    _get(tf, "var3", [100, 100])
    with tf.compat.v1.variable_scope("useful_scope"):
        _get(tf, "var4", [9, 9])


def _partitioner(tf):
    return tf.compat.v1.min_max_variable_partitioner(max_partitions=5, axis=0, min_slice_size=8 << 10)


def _ckpt_partitioned(tf):
    _get(tf, "var1", [100, 100], partitioner=_partitioner(tf))


@pytest.fixture
def ckpt(tf, tmp_path):
    """checkpoint_utils_test's checkpoint: var1..var3 and useful_scope/var4, in a directory."""
    _save(tf, tmp_path / "model", _ckpt_vars)
    return str(tmp_path)


@pytest.fixture
def part_ckpt(tf, tmp_path):
    """A checkpoint holding var1 (100, 100) saved as 5 slices."""
    return _save(tf, tmp_path / "part", _ckpt_partitioned)


def _init(ckpt_path, *maps):
    """TF's side: one init_from_checkpoint call per map (maps may name built variables)."""
    def warm(tf, built):
        for m in maps:
            tf.compat.v1.train.init_from_checkpoint(ckpt_path, m(built) if callable(m) else m)
    return warm


# --------------------------------------------------------------------------------------------
# init_from_checkpoint


def _some_scope_model(tf):
    with tf.compat.v1.variable_scope("some_scope"):
        my1 = _get(tf, "my1", [1, 10])
        with tf.compat.v1.variable_scope("some_other_scope"):
            my2 = _get(tf, "my2", [10, 10])
            with tf.compat.v1.variable_scope("other_useful_scope"):
                my4 = _get(tf, "var4", [9, 9])
    my3 = _get(tf, "my3", [100, 100])
    return {"my1": my1, "my2": my2, "my3": my3, "my4": my4}


def test_init_from_checkpoint_names_scopes_and_variables(tf, ckpt):
    maps = [{"var1": "some_scope/my1",
             "useful_scope/": "some_scope/some_other_scope/other_useful_scope/"},
            lambda b: {"var2": "some_scope/some_other_scope/my2", "var3": b["my3"]}]
    _parity(tf, _some_scope_model, _init(ckpt, *maps),
            lambda b: [cm.Source(ckpt, map={**maps[0], **maps[1](b)})], allow_missing=())


def test_init_from_checkpoint_map_values_as_variable_objects(tf, ckpt):
    amap = lambda b: {"var1": b["my1"], "var2": b["my2"], "var3": b["my3"]}  # noqa: E731
    _parity(tf, _some_scope_model, _init(ckpt, amap), lambda b: [cm.Source(ckpt, map=amap(b))])


def test_init_from_checkpoint_exact_and_scope_entry_both_apply(tf, ckpt):
    def build(tf):
        with tf.compat.v1.variable_scope("some_scope"):
            _get(tf, "my4", [9, 9])
        with tf.compat.v1.variable_scope("some_other_scope"):
            _get(tf, "var4", [9, 9])
    amap = {"useful_scope/var4": "some_scope/my4", "useful_scope/": "some_other_scope/"}
    got = _parity(tf, build, _init(ckpt, amap), lambda b: [cm.Source(ckpt, map=amap)], allow_missing=())
    assert got["some_scope/my4"].tobytes() == got["some_other_scope/var4"].tobytes()


def test_init_from_checkpoint_one_tensor_to_several_targets_as_list_of_pairs(tf, ckpt):
    def build(tf):
        _get(tf, "a", [1, 10])
        _get(tf, "b", [1, 10])
    pairs = [("var1", "a"), ("var1", "b")]
    _parity(tf, build, _init(ckpt, pairs), lambda b: [cm.Source(ckpt, map=pairs)], allow_missing=())
    _parity(tf, build, _init(ckpt, pairs), lambda b: [cm.Source(ckpt, map={"var1": ["a", "b"]})],
            allow_missing=())


def test_init_with_scope_does_not_capture_suffixes(tf, ckpt):
    def build(tf):
        with tf.compat.v1.variable_scope("useful_scope"):
            _get(tf, "var4", [9, 9])
        with tf.compat.v1.variable_scope("useful_scope_1"):
            _get(tf, "var5", initializer=[[1.0, 2.0], [3.0, 4.0]])
    amap = {"useful_scope/": "useful_scope/"}
    got = _parity(tf, build, _init(ckpt, amap), lambda b: [cm.Source(ckpt, map=amap)],
                  allow_missing=["useful_scope_1/*"])
    np.testing.assert_array_equal(got["useful_scope_1/var5"], [[1.0, 2.0], [3.0, 4.0]])


def test_init_from_root_checkpoint(tf, ckpt):
    def build(tf):
        with tf.compat.v1.variable_scope("some_scope"):
            _get(tf, "var1", [1, 10])
            _get(tf, "var2", [10, 10])
            _get(tf, "var3", [100, 100])
            with tf.compat.v1.variable_scope("useful_scope"):
                _get(tf, "var4", [9, 9])
    amap = {"/": "some_scope/"}
    _parity(tf, build, _init(ckpt, amap), lambda b: [cm.Source(ckpt, map=amap)], allow_missing=())


def test_init_to_root_checkpoint(tf, ckpt):
    amap = {"/": "/"}
    _parity(tf, _ckpt_vars, _init(ckpt, amap), lambda b: [cm.Source(ckpt, map=amap)], allow_missing=())


def test_init_from_checkpoint_without_map_is_identity(tf, ckpt):
    _parity(tf, _ckpt_vars, _init(ckpt, {"/": "/"}), lambda b: [cm.Source(ckpt)], allow_missing=())


def test_init_into_ref_variables(tf, ckpt):
    def build(tf):
        _get(tf, "my1", [1, 10], use_resource=False)
        _get(tf, "my2", [10, 10], use_resource=False)
    amap = {"var1": "my1", "var2": "my2"}
    _parity(tf, build, _init(ckpt, amap), lambda b: [cm.Source(ckpt, map=amap)], allow_missing=())


def _partitioned_target(tf):
    with tf.compat.v1.variable_scope("some_scope"):
        my1 = _get(tf, "my1", [100, 100], partitioner=_partitioner(tf))
    return {"my1": my1}


def test_init_partitioned_variable_by_name(tf, part_ckpt):
    amap = {"var1": "some_scope/my1"}
    _parity(tf, _partitioned_target, _init(part_ckpt, amap), lambda b: [cm.Source(part_ckpt, map=amap)],
            allow_missing=())


def test_init_partitioned_variable_by_variable_list(tf, part_ckpt):
    amap = lambda b: {"var1": b["my1"]._get_variable_list()}  # noqa: E731
    _parity(tf, _partitioned_target, _init(part_ckpt, amap), lambda b: [cm.Source(part_ckpt, map=amap(b))],
            allow_missing=())


def test_init_partitioned_variable_by_partitioned_variable_object(tf, part_ckpt):
    tf_map = lambda b: {"var1": b["my1"]._get_variable_list()}  # noqa: E731
    _parity(tf, _partitioned_target, _init(part_ckpt, tf_map),
            lambda b: [cm.Source(part_ckpt, map={"var1": b["my1"]})], allow_missing=())


def test_init_partitioned_variable_by_scope(tf, part_ckpt):
    amap = {"/": "some_scope/"}

    def build(tf):
        with tf.compat.v1.variable_scope("some_scope"):
            _get(tf, "var1", [100, 100], partitioner=_partitioner(tf))
    _parity(tf, build, _init(part_ckpt, amap), lambda b: [cm.Source(part_ckpt, map=amap)], allow_missing=())


def test_init_unpartitioned_variable_from_partitioned_checkpoint(tf, part_ckpt):
    amap = {"var1": "my1"}
    _parity(tf, lambda tf: _get(tf, "my1", [100, 100]), _init(part_ckpt, amap),
            lambda b: [cm.Source(part_ckpt, map=amap)], allow_missing=())


def test_init_partitioned_variable_from_unpartitioned_checkpoint(tf, ckpt):
    amap = {"var3": "some_scope/my1"}
    _parity(tf, _partitioned_target, _init(ckpt, amap), lambda b: [cm.Source(ckpt, map=amap)],
            allow_missing=())


@pytest.mark.parametrize("dtype", ["float64", "int32", "int64", "bool", "float16", "string"])
def test_init_from_checkpoint_keeps_every_dtype(tf, tmp_path, dtype):
    value = (np.array([b"a", b"bc", b""], dtype=object) if dtype == "string"
             else np.arange(3).astype(dtype))
    prefix = _save(tf, tmp_path / "m", lambda tf: _get(tf, "v", initializer=value))
    tf_dtype = tf.string if dtype == "string" else tf.as_dtype(dtype)

    def build(tf):
        _get(tf, "w", [3], dtype=tf_dtype, initializer=tf.compat.v1.zeros_initializer())
    amap = {"v": "w"}
    got = _parity(tf, build, _init(prefix, amap), lambda b: [cm.Source(prefix, map=amap)], allow_missing=())
    assert got["w"].tolist() == value.tolist()


def test_missing_tensor_is_a_value_error_in_both(tf, ckpt):
    amap = {"no_scope/var1": "my1"}
    build = lambda tf: _get(tf, "my1", [1, 10])  # noqa: E731
    with pytest.raises(ValueError):
        _with_tf(tf, build, _init(ckpt, amap))
    with pytest.raises(ValueError, match="'no_scope/var1'"):
        _with_cm(tf, build, lambda b: [cm.Source(ckpt, map=amap)], allow_missing=())


def test_shape_mismatch_is_a_value_error_in_both(tf, ckpt):
    amap = {"var2": "my1"}
    build = lambda tf: _get(tf, "my1", [1, 10])  # noqa: E731
    with pytest.raises(ValueError):
        _with_tf(tf, build, _init(ckpt, amap))
    with pytest.raises(ValueError, match="shape mismatch"):
        _with_cm(tf, build, lambda b: [cm.Source(ckpt, map=amap)], allow_missing=())


def test_scope_with_no_checkpoint_tensors_is_a_value_error_in_both(tf, ckpt):
    amap = {"useless_scope/": "some_scope/"}
    build = lambda tf: _get(tf, "some_scope/var4", [9, 9])  # noqa: E731
    with pytest.raises(ValueError):
        _with_tf(tf, build, _init(ckpt, amap))
    with pytest.raises(ValueError, match="useless_scope"):
        _with_cm(tf, build, lambda b: [cm.Source(ckpt, map=amap)], allow_missing=())


def test_variable_name_not_in_graph_is_a_value_error_in_both(tf, ckpt):
    amap = {"var1": "some_scope/no_such_var"}
    build = lambda tf: _get(tf, "my1", [1, 10])  # noqa: E731
    with pytest.raises(ValueError):
        _with_tf(tf, build, _init(ckpt, amap))
    with pytest.raises(ValueError, match="names no target variable 'some_scope/no_such_var'"):
        _with_cm(tf, build, lambda b: [cm.Source(ckpt, map=amap)], allow_missing=())


def test_report_shows_each_target_with_its_provider(tf, ckpt):
    with tf.Graph().as_default():
        _get(tf, "a", [1, 10])
        _get(tf, "b", [1, 10])
        plan = cm.plan(None, [cm.Source(ckpt, map={"var1": ["a", "b"]}, name="C")])
    text = plan.report()
    assert "a <- C:'var1' float32 (1, 10)" in text and "b <- C:'var1' float32 (1, 10)" in text
    assert "1 used (feeding 2 targets)" in text
    assert plan.ok


def test_a_list_of_partitions_of_one_variable_is_one_target(tf, part_ckpt):
    with tf.Graph().as_default():
        my1 = _partitioned_target(tf)["my1"]
        plan = cm.plan(None, [cm.Source(part_ckpt, map={"var1": list(my1)})])
    assert list(plan.assignments) == ["some_scope/my1"]


# --------------------------------------------------------------------------------------------
# load_variable and list_variables


def test_list_variables_matches_tf(tf, ckpt):
    expected = tf.train.list_variables(ckpt)
    got = [(v.name, list(v.shape)) for v in cm.list_variables(ckpt)]
    assert got == [(n, list(s)) for n, s in expected]


def test_list_variables_of_a_partitioned_checkpoint_matches_tf(tf, part_ckpt):
    expected = tf.train.list_variables(part_ckpt)
    assert [(v.name, list(v.shape)) for v in cm.list_variables(part_ckpt)] == [(n, list(s)) for n, s in expected]


@pytest.mark.parametrize("name", ["var1", "var2", "var3", "useful_scope/var4"])
def test_load_variable_matches_tf_bit_for_bit(tf, ckpt, name):
    expected = tf.train.load_variable(ckpt, name)
    got = cm.load(ckpt, [name])[name]
    assert got.dtype == expected.dtype and got.tobytes() == expected.tobytes()


def test_load_variable_of_a_partitioned_tensor_matches_tf(tf, part_ckpt):
    expected = tf.train.load_variable(part_ckpt, "var1")
    assert cm.load(part_ckpt, ["var1"])["var1"].tobytes() == expected.tobytes()


def test_load_variable_accepts_a_pathlike(tf, ckpt):
    expected = tf.train.load_variable(pathlib.Path(ckpt), "var1")
    assert cm.load(pathlib.Path(ckpt), ["var1"])["var1"].tobytes() == expected.tobytes()


def test_load_variable_of_a_missing_name_fails_in_both(tf, ckpt):
    with pytest.raises(Exception):
        tf.train.load_variable(ckpt, "var5")
    with pytest.raises(KeyError, match="var5"):
        cm.load(ckpt, ["var5"])


def test_no_checkpoint_fails_in_both(tf, tmp_path):
    with pytest.raises(ValueError):
        tf.train.load_checkpoint(str(tmp_path))
    with pytest.raises(FileNotFoundError):
        cm.list_variables(str(tmp_path))


def test_checkpoint_directory_means_its_latest_checkpoint_in_both(tf, tmp_path):
    _save(tf, tmp_path / "model-1", _ckpt_vars, seed=3)
    _save(tf, tmp_path / "model-2", _ckpt_vars, seed=4)
    expected = tf.train.load_variable(str(tmp_path), "var1")
    assert cm.load(str(tmp_path), ["var1"])["var1"].tobytes() == expected.tobytes()
    assert os.path.basename(tf.train.latest_checkpoint(str(tmp_path))) == "model-2"
