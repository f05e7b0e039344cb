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


@pytest.mark.parametrize("amap,target,shape,message", [
    ({"no_scope/var1": "my1"}, "my1", [1, 10], "'no_scope/var1'"),  # tensor not in the checkpoint
    ({"var2": "my1"}, "my1", [1, 10], "shape mismatch"),
    ({"useless_scope/": "some_scope/"}, "some_scope/var4", [9, 9], "useless_scope"),  # no such scope
    ({"var1": "some_scope/no_such_var"}, "my1", [1, 10], "names no target variable 'some_scope/no_such_var'"),
], ids=["missing-tensor", "shape-mismatch", "unknown-scope", "unknown-variable"])
def test_init_from_checkpoint_errors_are_value_errors_in_both(tf, ckpt, amap, target, shape, message):
    build = lambda tf: _get(tf, target, shape)  # noqa: E731
    with pytest.raises(ValueError):
        _with_tf(tf, build, _init(ckpt, amap))
    with pytest.raises(ValueError, match=message):
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


def test_a_list_of_some_partitions_only_is_a_rule_error(tf, part_ckpt):
    with tf.Graph().as_default():
        parts = list(_partitioned_target(tf)["my1"])
        with pytest.raises(cm.RuleError, match=r"partitions of 'some_scope/my1' that hold 2,000 of its 10,000"):
            cm.plan(None, [cm.Source(part_ckpt, map={"var1": parts[:1]})])


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


# --------------------------------------------------------------------------------------------
# warm_start and VocabInfo (warm_starting_util_test.py)

OLD_FRUITS = ["apple", "banana", "guava", "orange"]
NEW_FRUITS = ["orange", "guava", "banana", "apple", "raspberry"]
PREV_WEIGHTS = [[0.5], [1.0], [1.5], [2.0]]


def _vocab_file(tmp_path, name, tokens):
    path = tmp_path / name
    path.write_text("".join(t + "\n" for t in tokens), encoding="utf-8")
    return str(path)


def _prev_run(tf, tmp_path, build):
    """A previous run's checkpoint (in ``prev/``) and both vocabulary files."""
    prefix = _save(tf, tmp_path / "prev" / "model", build)
    return {"ckpt": str(tmp_path / "prev"), "prefix": prefix,
            "old": _vocab_file(tmp_path, "old_vocab.txt", OLD_FRUITS),
            "new": _vocab_file(tmp_path, "new_vocab.txt", NEW_FRUITS)}


@pytest.fixture
def fruits(tf, tmp_path):
    """fruit_weights (4 x 1) = PREV_WEIGHTS, row i for OLD_FRUITS[i]."""
    return _prev_run(tf, tmp_path, lambda tf: _get(tf, "fruit_weights", initializer=PREV_WEIGHTS))


@pytest.fixture
def part_fruits(tf, tmp_path):
    """fruit_weights (4 x 1), random, saved as 2 slices."""
    return _prev_run(tf, tmp_path, lambda tf: _get(tf, "fruit_weights", [4, 1],
                                                   partitioner=tf.compat.v1.fixed_size_partitioner(2)))


def _ws(ckpt_path, **kw):
    """TF's side: tf.compat.v1.train.warm_start with ``kw`` (callables get the built variables)."""
    def warm(tf, built):
        tf.compat.v1.train.warm_start(ckpt_path, **{k: v(built) if callable(v) else v for k, v in kw.items()})
    return warm


def _vocab_info(tf, f, **kw):
    kw.setdefault("new_vocab_size", len(NEW_FRUITS))
    kw.setdefault("num_oov_buckets", 0)
    return tf.compat.v1.train.VocabInfo(new_vocab=f["new"], old_vocab=f["old"], **kw)


def _fruit_weights(rows, partitioned=False, name="fruit_weights", cols=1):
    def build(tf):
        part = tf.compat.v1.fixed_size_partitioner(2) if partitioned else None
        return _get(tf, name, [rows, cols], initializer=tf.compat.v1.zeros_initializer(), partitioner=part)
    return build


def test_warm_start_var(tf, fruits):
    _parity(tf, _fruit_weights(4), _ws(fruits["ckpt"], vars_to_warm_start="fruit_weights"),
            lambda b: [cm.Source(fruits["ckpt"], include="fruit_weights")], allow_missing=())


def test_warm_start_var_from_a_checkpoint_prefix(tf, fruits):
    _parity(tf, _fruit_weights(4), _ws(fruits["prefix"]), lambda b: [cm.Source(fruits["prefix"])],
            allow_missing=())


def test_warm_start_var_current_var_partitioned(tf, fruits):
    _parity(tf, _fruit_weights(4, partitioned=True), _ws(fruits["ckpt"]),
            lambda b: [cm.Source(fruits["ckpt"])], allow_missing=())


def test_warm_start_var_prev_var_partitioned(tf, tmp_path):
    prefix = _save(tf, tmp_path / "model", lambda tf: _get(
        tf, "fruit_weights", [4, 1],
        partitioner=tf.compat.v1.fixed_size_partitioner(2)))
    _parity(tf, _fruit_weights(4), _ws(prefix), lambda b: [cm.Source(prefix)], allow_missing=())


def test_warm_start_var_both_vars_partitioned_with_a_prev_var_name(tf, tmp_path):
    prefix = _save(tf, tmp_path / "model", lambda tf: _get(
        tf, "old_scope/fruit_weights", [4, 1],
        partitioner=tf.compat.v1.fixed_size_partitioner(2)))
    names = {"new_scope/fruit_weights": "old_scope/fruit_weights"}
    _parity(tf, _fruit_weights(4, partitioned=True, name="new_scope/fruit_weights"),
            _ws(prefix, var_name_to_prev_var_name=names),
            lambda b: [cm.Source(prefix, map={"old_scope/fruit_weights": "new_scope/fruit_weights"})],
            allow_missing=())


def _two_scopes(tf):
    with tf.compat.v1.variable_scope("sc_a"):
        _get(tf, "w", [2, 3])
        _get(tf, "b", [3])
    with tf.compat.v1.variable_scope("sc_b"):
        _get(tf, "w", [3, 1])


@pytest.fixture
def two_scopes(tf, tmp_path):
    return _save(tf, tmp_path / "model", _two_scopes)


def test_warm_start_vars_to_warm_start_regex_is_an_include_glob(tf, two_scopes):
    _parity(tf, _two_scopes, _ws(two_scopes, vars_to_warm_start="sc_a/.*"),
            lambda b: [cm.Source(two_scopes, include="sc_a/*")])


def test_warm_start_vars_to_warm_start_list_of_regexes(tf, two_scopes):
    _parity(tf, _two_scopes, _ws(two_scopes, vars_to_warm_start=["sc_a/w", "sc_b/w"]),
            lambda b: [cm.Source(two_scopes, include=["sc_a/w", "sc_b/w"])])


def test_warm_start_vars_to_warm_start_list_of_variables(tf, two_scopes):
    def build(tf):
        _two_scopes(tf)
        return {v.op.name: v for v in tf.compat.v1.global_variables()}
    _parity(tf, build, _ws(two_scopes, vars_to_warm_start=lambda b: [b["sc_b/w"]]),
            lambda b: [cm.Source(two_scopes, map={"sc_b/w": b["sc_b/w"]})])


def test_warm_start_default_warm_starts_every_trainable_variable(tf, two_scopes):
    _parity(tf, _two_scopes, _ws(two_scopes), lambda b: [cm.Source(two_scopes)], allow_missing=())


def test_warm_start_var_name_to_prev_var_name_is_a_map(tf, two_scopes):
    def build(tf):
        _get(tf, "new_a/w", [2, 3])
        _get(tf, "sc_b/w", [3, 1])
    _parity(tf, build, _ws(two_scopes, vars_to_warm_start=".*", var_name_to_prev_var_name={"new_a/w": "sc_a/w"}),
            lambda b: [cm.Source(two_scopes, map={"sc_a/w": "new_a/w", "sc_b/w": "sc_b/w"})], allow_missing=())


def test_warm_start_unused_prev_var_name_is_a_value_error_in_both(tf, two_scopes):
    build = lambda tf: _get(tf, "sc_b/w", [3, 1])  # noqa: E731
    with pytest.raises(ValueError):
        _with_tf(tf, build, _ws(two_scopes, var_name_to_prev_var_name={"nope/w": "sc_a/w"}))
    with pytest.raises(ValueError, match="names no target variable 'nope/w'"):
        _with_cm(tf, build, lambda b: [cm.Source(two_scopes, map={"sc_a/w": "nope/w", "sc_b/w": "sc_b/w"})])


def _vocab_parity(tf, fruits, build, info_kw, remap_kw, **ws_kw):
    info = lambda b: {"fruit_weights": _vocab_info(tf, fruits, **info_kw)}  # noqa: E731
    remap = cm.VocabRemap("fruit_weights", fruits["old"], fruits["new"], **remap_kw)
    return _parity(tf, build, _ws(fruits["ckpt"], var_name_to_vocab_info=info, **ws_kw),
                   lambda b: [cm.Source(fruits["ckpt"], transforms=[remap])], allow_missing=())


def test_vocab_info_moves_rows_to_their_new_index(tf, fruits):
    got = _vocab_parity(tf, fruits, _fruit_weights(5), {}, {})
    np.testing.assert_array_equal(got["fruit_weights"], [[2.0], [1.5], [1.0], [0.5], [0.0]])


def test_vocab_info_with_constrained_old_vocab_size(tf, fruits):
    got = _vocab_parity(tf, fruits, _fruit_weights(5), {"old_vocab_size": 2}, {"old_vocab_size": 2})
    np.testing.assert_array_equal(got["fruit_weights"], [[0.0], [0.0], [1.0], [0.5], [0.0]])


def test_vocab_info_with_constrained_new_vocab_size(tf, fruits):
    _vocab_parity(tf, fruits, _fruit_weights(3), {"new_vocab_size": 3}, {"new_vocab_size": 3})


def test_vocab_info_with_oov_buckets(tf, fruits):
    got = _vocab_parity(tf, fruits, _fruit_weights(7), {"num_oov_buckets": 2}, {"num_oov_buckets": 2})
    assert got["fruit_weights"].shape == (7, 1)


def test_vocab_info_with_a_backup_initializer(tf, fruits):
    # constant_initializer cannot take the symbolic shape warm_start gives it; a uniform
    # initializer over [0.42, 0.42] is the same constant and can.
    init = tf.compat.v1.random_uniform_initializer(0.42, 0.42)
    _vocab_parity(tf, fruits, _fruit_weights(6), {"num_oov_buckets": 1, "backup_initializer": init},
                  {"num_oov_buckets": 1, "init": init})


def test_vocab_info_backup_initializer_as_a_name(tf, fruits):
    _vocab_parity(tf, fruits, _fruit_weights(6),
                  {"num_oov_buckets": 1, "backup_initializer": tf.compat.v1.ones_initializer()},
                  {"num_oov_buckets": 1, "init": "ones"})


def test_vocab_info_checkpoint_with_oov_rows(tf, tmp_path):
    # An Estimator checkpoint: 4 vocabulary rows plus 1 OOV row; the OOV row is not carried over.
    fr = _prev_run(tf, tmp_path, lambda tf: _get(tf, "fruit_weights", initializer=PREV_WEIGHTS + [[9.0]]))
    got = _vocab_parity(tf, fr, _fruit_weights(6), {"num_oov_buckets": 1}, {"num_oov_buckets": 1})
    assert 9.0 not in got["fruit_weights"]


def test_vocab_info_current_var_partitioned(tf, fruits):
    _vocab_parity(tf, fruits, _fruit_weights(5, partitioned=True), {}, {})


def test_vocab_info_prev_var_partitioned(tf, part_fruits):
    _vocab_parity(tf, part_fruits, _fruit_weights(5), {}, {})


def test_vocab_info_both_vars_partitioned_with_oov_buckets(tf, part_fruits):
    _vocab_parity(tf, part_fruits, _fruit_weights(6, partitioned=True), {"num_oov_buckets": 1},
                  {"num_oov_buckets": 1})


def test_vocab_info_with_a_prev_var_name(tf, fruits):
    info = lambda b: {"new_weights": _vocab_info(tf, fruits)}  # noqa: E731
    remap = cm.VocabRemap("new_weights", fruits["old"], fruits["new"])
    _parity(tf, _fruit_weights(5, name="new_weights"),
            _ws(fruits["ckpt"], var_name_to_vocab_info=info,
                var_name_to_prev_var_name={"new_weights": "fruit_weights"}),
            lambda b: [cm.Source(fruits["ckpt"], map={"fruit_weights": "new_weights"}, transforms=[remap])],
            allow_missing=())


def test_vocab_info_on_columns_of_an_output_layer(tf, tmp_path):
    prev = [[0.5, 0.3, 0.0, 1.0], [0.8, 0.0, 1.0, 2.0]]  # 2 x 4: columns are OLD_FRUITS
    _save(tf, tmp_path / "prev" / "model", lambda tf: _get(tf, "fruit_output_layer", initializer=prev))
    old, new = _vocab_file(tmp_path, "old.txt", OLD_FRUITS), _vocab_file(tmp_path, "new.txt", NEW_FRUITS)
    info = {"fruit_output_layer": tf.compat.v1.train.VocabInfo(new, 5, 1, old, axis=1)}
    remap = cm.VocabRemap("fruit_output_layer", old, new, axis=1, new_vocab_size=5, num_oov_buckets=1)
    _parity(tf, _fruit_weights(2, name="fruit_output_layer", cols=6),
            _ws(str(tmp_path / "prev"), var_name_to_vocab_info=info),
            lambda b: [cm.Source(str(tmp_path / "prev"), transforms=[remap])], allow_missing=())


def test_vocab_info_only_with_vars_to_warm_start_none(tf, fruits, tmp_path):
    def build(tf):
        _fruit_weights(5)(tf)
        _get(tf, "other", [2])
    remap = cm.VocabRemap("fruit_weights", fruits["old"], fruits["new"])
    info = lambda b: {"fruit_weights": _vocab_info(tf, fruits)}  # noqa: E731
    _parity(tf, build, _ws(fruits["ckpt"], vars_to_warm_start=None, var_name_to_vocab_info=info),
            lambda b: [cm.Source(fruits["ckpt"], include="fruit_weights", transforms=[remap])],
            allow_missing=["other"])


def test_vocab_info_with_a_bad_axis_is_a_value_error_in_both(tf, fruits):
    with pytest.raises(ValueError):
        tf.compat.v1.train.VocabInfo(fruits["new"], 5, 0, fruits["old"], axis=2)
    with pytest.raises(ValueError, match="axis"):
        cm.VocabRemap("fruit_weights", fruits["old"], fruits["new"], axis=-1)


# --------------------------------------------------------------------------------------------
# initializer mode: plan.set_initializers() replaces initializers, as init_from_checkpoint does


def _with_cm_initializers(tf, build, sources, **options):
    """Build the graph, let ckptmerge replace the initializers, then run TF's initializer only."""
    options.setdefault("allow_missing", "*")
    with tf.Graph().as_default() as g:
        tf.compat.v1.set_random_seed(1)
        built = build(tf)
        plan = cm.plan(None, sources(built), **options)
        plan.set_initializers()
        with tf.compat.v1.Session(graph=g) as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            return _values(tf, sess)


def test_set_initializers_gives_init_from_checkpoint_values(tf, ckpt):
    maps = [{"var1": "some_scope/my1",
             "useful_scope/": "some_scope/some_other_scope/other_useful_scope/"},
            lambda b: {"var2": "some_scope/some_other_scope/my2", "var3": b["my3"]}]
    expected = _with_tf(tf, _some_scope_model, _init(ckpt, *maps))
    got = _with_cm_initializers(tf, _some_scope_model, lambda b: [cm.Source(ckpt, map={**maps[0], **maps[1](b)})],
                                allow_missing=())
    _assert_same(expected, got)


def test_set_initializers_into_partitioned_variables(tf, part_ckpt):
    amap = {"var1": "some_scope/my1"}
    expected = _with_tf(tf, _partitioned_target, _init(part_ckpt, amap))
    _assert_same(expected, _with_cm_initializers(tf, _partitioned_target, lambda b: [cm.Source(part_ckpt, map=amap)]))


def test_set_initializers_with_a_vocab_remap_gives_warm_start_values(tf, fruits):
    info = lambda b: {"fruit_weights": _vocab_info(tf, fruits, num_oov_buckets=1)}  # noqa: E731
    remap = cm.VocabRemap("fruit_weights", fruits["old"], fruits["new"], num_oov_buckets=1)
    expected = _with_tf(tf, _fruit_weights(6), _ws(fruits["ckpt"], var_name_to_vocab_info=info))
    got = _with_cm_initializers(tf, _fruit_weights(6), lambda b: [cm.Source(fruits["ckpt"], transforms=[remap])])
    _assert_same(expected, got)


def test_set_initializers_keep_init_keeps_the_original_initial_value(tf, fruits):
    remap = cm.VocabRemap("fruit_weights", fruits["old"], fruits["new"], init="keep")

    def build(tf):
        _get(tf, "fruit_weights", initializer=np.full((5, 1), 7.0, np.float32))
    got = _with_cm_initializers(tf, build, lambda b: [cm.Source(fruits["ckpt"], transforms=[remap])])
    np.testing.assert_array_equal(got["fruit_weights"], [[2.0], [1.5], [1.0], [0.5], [7.0]])


def test_initial_value_comes_from_checkpoint(tf, ckpt):
    expected = tf.train.load_variable(ckpt, "var1")
    with tf.Graph().as_default() as g:
        my1 = _get(tf, "my1", [1, 10], use_resource=False)  # TF 2's resource variables have no initialized_value()
        my2 = _get(tf, "my2", [1, 10])
        cm.plan(None, [cm.Source(ckpt, map={"var1": ["my1", "my2"]})]).set_initializers()
        with tf.compat.v1.Session(graph=g) as sess:
            assert sess.run(my2.initial_value).tobytes() == expected.tobytes()  # before initialising
            sess.run(tf.compat.v1.global_variables_initializer())
            assert sess.run(my1.initialized_value()).tobytes() == expected.tobytes()


def test_monitored_training_session_warm_starts_with_no_session_call_of_ours(tf, ckpt, tmp_path):
    expected = tf.train.load_variable(ckpt, "useful_scope/var4")
    with tf.Graph().as_default():
        step = tf.compat.v1.train.get_or_create_global_step()
        w = _get(tf, "model/var4", [9, 9])
        train = tf.compat.v1.assign_add(step, 1)
        cm.plan(None, [cm.Source(ckpt, map={"useful_scope/": "model/"})], allow_missing=["global_step"]).set_initializers()
        with tf.compat.v1.train.MonitoredTrainingSession(checkpoint_dir=str(tmp_path / "train")) as sess:
            assert sess.run(w).tobytes() == expected.tobytes()
            sess.run(train)
        # The session saved a checkpoint: the warm-started value went through training as usual.
    assert tf.train.load_variable(str(tmp_path / "train"), "model/var4").tobytes() == expected.tobytes()


def test_set_initializers_after_the_graph_is_finalized_is_an_error(tf, ckpt):
    with tf.Graph().as_default() as g:
        _get(tf, "var1", [1, 10])
        plan = cm.plan(None, [cm.Source(ckpt, include="var1")])
        g.finalize()
        with pytest.raises(cm.CkptMergeError, match="before creating the MonitoredTrainingSession"):
            plan.set_initializers()


def test_set_initializers_in_eager_mode_is_an_error(tf, ckpt):
    plan = cm.plan({"var1": tf.Variable(np.zeros((1, 10), np.float32))}, [cm.Source(ckpt, include="var1")])
    with pytest.raises(cm.CkptMergeError, match="in eager mode call plan.restore"):
        plan.set_initializers()


def test_set_initializers_checks_the_plan_first(tf, ckpt):
    with tf.Graph().as_default():
        _get(tf, "my1", [1, 10])
        with pytest.raises(cm.PlanError):
            cm.plan(None, [cm.Source(ckpt, map={"var_1": "my1"})]).set_initializers()
