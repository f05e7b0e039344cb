"""Every public function checks its argument types: a wrong call raises a CkptMergeError that is
also a TypeError (wrong type) or ValueError (wrong value), says what was expected and echoes what
it received; never a bare TypeError from deep inside, never a silently wrong result."""

from __future__ import annotations

import numpy as np
import pytest

import ckptmerge as cm
from ckptmerge.core.args import check_names
from ckptmerge import ArgumentError, ArgumentTypeError

SPECS = [cm.VariableInfo("a1", (3, 4), "float32")]


@pytest.fixture
def ckpt(ab_checkpoints):
    return ab_checkpoints["B"]  # b1 (4,), b2 (5,), b3 (6,)


def assert_type_error(err: pytest.ExceptionInfo, *received: str) -> None:
    e = err.value
    assert isinstance(e, cm.CkptMergeError) and isinstance(e, TypeError), type(e).__mro__
    for r in received:
        assert r in str(e), (r, str(e))


# --------------------------------------------------------------------------------------------
# cm.load: one name or a list of names


def test_load_takes_one_name_as_a_str_not_its_characters(ckpt, ab_checkpoints):
    # Regression: load(p, "b1") read 'b' and '1' ("Tensor 'b' not found").
    values = cm.load(ckpt, "b1")
    assert list(values) == ["b1"]
    np.testing.assert_array_equal(values["b1"], ab_checkpoints["b"]["b1"])
    assert list(cm.load(ckpt, ("b1", "b2"))) == ["b1", "b2"]


@pytest.mark.parametrize("names,shown", [([1], "Received: names=[1]"), (b"b1", "Received: names=b'b1'"),
                                         (3, "Received: names=3"), ({"b1": 1}, "Received: names={'b1': 1}")])
def test_load_with_names_that_are_not_str_is_a_type_error(ckpt, names, shown):
    # Regression: load(p, [1]) raised a bare "TypeError: 'int' object is not iterable".
    with pytest.raises(ArgumentTypeError) as err:
        cm.load(ckpt, names)
    assert_type_error(err, shown, "names must be a name (str) or a list of names")


def test_check_names_says_which_entry_is_wrong():
    with pytest.raises(ArgumentTypeError, match=r"names\[1\] is 2 \(int\)"):
        check_names(["a", 2])


# --------------------------------------------------------------------------------------------
# one representative bad call per public function


@pytest.mark.parametrize("call,received", [
    (lambda p: cm.load(p, verify="no"), "Received: verify='no'"),
    (lambda p: cm.load(3), "Received: path=3"),
    (lambda p: cm.open(p, verify=1), "Received: verify=1"),
    (lambda p: cm.open(p, step="10"), "Received: step='10'"),
    (lambda p: cm.list_variables(p, optimizer="no"), "Received: optimizer='no'"),
    (lambda p: cm.checkpoints(3), "Received: directory=3"),
    (lambda p: cm.plan(SPECS, 3), "Received: sources=3"),
    (lambda p: cm.plan(SPECS, [p, 3]), "sources[1] is 3 (int)"),
    (lambda p: cm.plan(SPECS, p, allow_missing=3), "Received: allow_missing=3"),
    (lambda p: cm.plan(SPECS, p, verify="yes"), "Received: verify='yes'"),
    (lambda p: cm.plan([cm.VariableInfo("a1", 3, "float32")], p), "Received: target[0]=VariableInfo("),
    (lambda p: cm.restore(SPECS, p, strict="no"), "Received: strict='no'"),
    (lambda p: cm.restore(SPECS, p, progress=3), "Received: progress=3"),
    (lambda p: cm.warm_start(SPECS, {"sources": [{"path": p}]}, strict="no"), "Received: strict='no'"),
    (lambda p: cm.merge(p, 3), "Received: out_prefix=3"),
    (lambda p: cm.Source(3), "Received: path=3"),
    (lambda p: cm.Source(p, step="10"), "Received: step='10'"),
    (lambda p: cm.Source(p, optimizer="yes"), "Received: optimizer='yes'"),
    (lambda p: cm.Source(p, name=3), "Received: name=3"),
    (lambda p: cm.snapshot(SPECS, name=3), "Received: name=3"),
    (lambda p: cm.Restorer(SPECS, p, strict="no"), "Received: strict='no'"),
])
def test_a_wrong_type_is_a_type_error_that_echoes_what_was_received(ckpt, call, received):
    with pytest.raises(ArgumentTypeError) as err:
        call(ckpt)
    assert_type_error(err, received)


def test_an_unknown_option_is_named_with_a_suggestion(ckpt):
    # Regression: a bare "TypeError: plan() got an unexpected keyword argument".
    with pytest.raises(ArgumentTypeError) as err:
        cm.restore(SPECS, ckpt, allow_mising=["a1"])
    assert_type_error(err, "restore() got an unknown option 'allow_mising'. Did you mean 'allow_missing'?")
    with pytest.raises(ArgumentTypeError, match="suggest\\(\\) got an unknown option 'on_conflit'"):
        cm.suggest(SPECS, ckpt, on_conflit="first")
    with pytest.raises(ArgumentTypeError, match="Restorer\\(\\) got an unknown option 'stric'"):
        cm.Restorer(SPECS, ckpt, stric=False)


def test_arrays_in_a_target_are_not_variables(ckpt, tf):
    with pytest.raises(ArgumentTypeError) as err:
        cm.plan({"b1": np.zeros(4, np.float32)}, ckpt)
    assert_type_error(err, "target['b1'] is a numpy.ndarray, not a variable", "Source.from_values")
    with pytest.raises(ArgumentTypeError, match=r"target\[0\] is a .*EagerTensor, not a variable"):
        cm.plan([tf.constant([1.0])], ckpt)


def test_a_restorer_step_of_the_wrong_type_is_a_type_error(tf, ab_checkpoints):
    v = {"a1": tf.Variable(np.zeros((3, 4), np.float32))}
    restorer = cm.Restorer(v, cm.Source(ab_checkpoints["A"], include="a1"))
    try:
        with pytest.raises(ArgumentTypeError) as err:
            restorer.restore(step="10")
        assert_type_error(err, "Received: step='10'")
    finally:
        restorer.close()


@pytest.mark.parametrize("call,received", [
    (lambda p: cm.load(p, []), None),
    (lambda p: cm.plan(SPECS, []), "Received: sources=[]"),
    (lambda p: cm.open(p, step=-1), "Received: step=-1"),
])
def test_a_wrong_value_is_a_value_error(ckpt, call, received):
    if received is None:  # no names: nothing to read, an empty dict
        assert call(ckpt) == {}
        return
    with pytest.raises(ArgumentError) as err:
        call(ckpt)
    assert isinstance(err.value, ValueError) and received in str(err.value)
