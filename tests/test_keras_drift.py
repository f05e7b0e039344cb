"""Beyond Keras (issue 20): path drift repaired, and what ``load_weights`` would do said beforehand.

Keras keys weights by object path, so refactoring model code breaks loads ("Layer 'x' expected
2 variables, but received 0 variables during loading"). Each refactoring here saves an old model,
then restores into the new code with ``align="structure"``: every value must land where it
belongs, the report must say which file layer fed which model layer, and what the evidence cannot
separate stays unresolved (missing), never guessed. Then the compatibility report:
``plan.report()`` and ``ckptmerge diff OLD NEW`` state what ``load_weights`` would do, and
``on_shape_mismatch="skip"`` keeps its per-variable meaning beside Keras's per-layer
``skip_mismatch``.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from _cli_util import run

import ckptmerge as cm

pytestmark = pytest.mark.usefixtures("tf")

_RNG = np.random.default_rng(7)


@pytest.fixture(scope="module")
def keras():
    import keras

    return keras


def _randomize(model):
    for v in model.weights:
        v.assign(_RNG.standard_normal(tuple(v.shape)).astype("float32"))


def _built(model, shape):
    model(np.zeros(shape, "float32"))
    return model


def _save(model, tmp_path, name="old"):
    path = str(tmp_path / f"{name}.weights.h5")
    model.save_weights(path)
    return path


def _same(a, b):
    np.testing.assert_array_equal(a.numpy(), b.numpy())


def test_a_renamed_attribute_restores_with_align_structure(keras, tmp_path):
    class Old(keras.Model):
        def __init__(self):
            super().__init__()
            self.attn = keras.layers.Dense(4)
            self.head = keras.layers.Dense(2)

        def call(self, x):
            return self.head(self.attn(x))

    class New(keras.Model):  # the same layers; 'attn' renamed 'attention'
        def __init__(self):
            super().__init__()
            self.attention = keras.layers.Dense(4)
            self.head = keras.layers.Dense(2)

        def call(self, x):
            return self.head(self.attention(x))

    old = _built(Old(), (1, 3))
    _randomize(old)
    path = _save(old, tmp_path)
    new = _built(New(), (1, 3))
    with pytest.raises(ValueError, match="expected 2 variables, but received 0 variables"):
        _built(New(), (1, 3)).load_weights(path)
    plain = cm.plan(new, [cm.Source(path, name="old")])
    assert not plain.ok and plain.missing == sorted(v.path for v in new.attention.weights)
    assert ("Hint: 2 missing targets and unused entries of Keras weights file 'old' share shapes and dtypes, so "
            "layers may have moved") in plain.report()
    plan = cm.plan(new, [cm.Source(path, name="old", align="structure")])
    assert plan.ok
    (match,) = plan.sources[0].drift.matches
    assert (match.file, match.model) == ("attn", "attention")
    text = plan.report()
    assert "Path drift (1) - which file layer feeds which model layer (align='structure'):" in text
    assert "old: file 'attn' -> model 'attention'" in text
    assert plan.assignments[new.attention.kernel.path].via == (
        "h5 'attn/vars/0'; path drift (align='structure'): file layer 'attn' as model layer 'attention'")
    plan.restore()
    _same(new.attention.kernel, old.attn.kernel)
    _same(new.attention.bias, old.attn.bias)
    _same(new.head.kernel, old.head.kernel)


def test_a_swapped_layer_subclass_restores_with_align_structure(keras, tmp_path):
    class MyDense(keras.layers.Dense):
        """A subclass: the same variables, another class name (so another key in a list)."""

    def build(first):
        return keras.Sequential([keras.Input((4,)), first(3), keras.layers.Dense(2)])

    old = build(keras.layers.Dense)
    _randomize(old)
    path = _save(old, tmp_path)
    new = build(MyDense)  # keys: layers/my_dense, layers/dense; the file: layers/dense, layers/dense_1
    with pytest.raises(ValueError):
        build(MyDense).load_weights(path)  # Keras loads the file's first Dense into the second
    plan = cm.plan(new, [cm.Source(path, align="structure")])
    assert plan.ok
    pairs = {(m.file, m.model) for m in plan.sources[0].drift.matches}
    assert pairs == {("layers/dense", "layers/my_dense"), ("layers/dense_1", "layers/dense")}
    plan.restore()
    for a, b in zip(new.weights, old.weights):
        _same(a, b)


@pytest.mark.parametrize("direction", ["wrapped", "unwrapped"])
def test_layers_moved_into_or_out_of_a_sub_model_restore_with_align_structure(keras, tmp_path, direction):
    def flat():
        inputs = keras.Input((4,))
        x = keras.layers.Dense(3)(inputs)
        return keras.Model(inputs, keras.layers.Dense(2)(x))

    def wrapped():
        inputs = keras.Input((4,))
        block = keras.Sequential([keras.layers.Dense(3), keras.layers.Dense(2)], name="block")
        return keras.Model(inputs, block(inputs))

    build_old, build_new = (flat, wrapped) if direction == "wrapped" else (wrapped, flat)
    old = build_old()
    _randomize(old)
    path = _save(old, tmp_path)
    new = build_new()
    with pytest.raises(ValueError, match="received 0 variables"):
        build_new().load_weights(path)
    plan = cm.plan(new, [cm.Source(path, align="structure")])
    assert plan.ok and len(plan.sources[0].drift.matches) == 2
    inner = "layers/sequential/layers"
    expected = ({("layers/dense", f"{inner}/dense"), ("layers/dense_1", f"{inner}/dense_1")}
                if direction == "wrapped" else
                {(f"{inner}/dense", "layers/dense"), (f"{inner}/dense_1", "layers/dense_1")})
    assert {(m.file, m.model) for m in plan.sources[0].drift.matches} == expected
    plan.restore()
    for a, b in zip(new.weights, old.weights):
        _same(a, b)


def test_a_container_the_old_keras_walk_did_not_descend_into_restores_as_keras_recovers_it(keras, tmp_path):
    """Keras's own backward-compatibility case (saving_lib_test, PR 22362): an older Keras kept the
    layers of nested containers under the model's flat 'layers/' walk; the new walk looks in
    'blocks/container/...' first, warns, and finds them under 'layers/'."""
    import h5py

    class Nested(keras.Model):
        def __init__(self, **kw):
            super().__init__(**kw)
            self.blocks = [(keras.layers.Dense(4, use_bias=False),) for _ in range(3)]
            self.out = keras.layers.Dense(2)

        def call(self, x):
            for (d,) in self.blocks:
                x = d(x)
            return self.out(x)

    old = _built(Nested(), (2, 4))
    _randomize(old)
    path = _save(old, tmp_path)
    with h5py.File(path, "a") as f:  # as the older saver wrote it: no 'blocks/container*' groups
        for i in range(3):
            f.move(f"blocks/container{'_' + str(i) if i else ''}/dense", f"layers/dense{'_' + str(i) if i else ''}")
        del f["blocks"]
    theirs, ours = _built(Nested(), (2, 4)), _built(Nested(), (2, 4))
    with pytest.warns(UserWarning, match="Skipping nested container"):
        theirs.load_weights(path)
    plan = cm.plan(ours, [cm.Source(path)])
    assert plan.ok, plan.report()
    plan.restore()
    for a, b, c in zip(ours.weights, theirs.weights, old.weights):
        _same(a, b)
        _same(a, c)


def test_a_keras_2_13_file_keyed_by_layer_checkpoint_dependencies_restores_as_keras_reads_it(keras, tmp_path):
    """tf.keras 2.13/2.14 wrote the new format with '_layer_checkpoint_dependencies' where Keras 3
    writes 'layers'; Keras 3 reads such files by that name, and so does ckptmerge."""
    import h5py

    def build():
        inputs = keras.Input((4,))
        return keras.Model(inputs, keras.layers.Dense(2)(keras.layers.Dense(3)(inputs)))

    old = build()
    _randomize(old)
    path = _save(old, tmp_path)
    with h5py.File(path, "a") as f:
        f.move("layers", "_layer_checkpoint_dependencies")
    theirs, ours = build(), build()
    theirs.load_weights(path)
    plan = cm.plan(ours, [cm.Source(path)])
    assert plan.ok and plan.assignments[ours.layers[1].kernel.path].key == "_layer_checkpoint_dependencies/dense/vars/0"
    plan.restore()
    for a, b, c in zip(ours.weights, theirs.weights, old.weights):
        _same(a, b)
        _same(a, c)


def test_equal_layers_renamed_without_evidence_stay_unresolved(keras, tmp_path):
    def block(names):
        class Block(keras.layers.Layer):
            def __init__(self, **kw):
                super().__init__(**kw)
                for n in names:  # two equal layers under attribute names that say nothing
                    setattr(self, n, keras.layers.Dense(4, name=n))

            def call(self, x):
                for n in names:
                    x = getattr(self, n)(x)
                return x

        return _built(keras.Sequential([keras.Input((4,)), Block(name="block")]), (1, 4))

    old = block(["zeta", "alpha"])
    _randomize(old)
    path = _save(old, tmp_path)
    new = block(["first", "second"])
    before = [v.numpy() for v in new.weights]
    plan = cm.plan(new, [cm.Source(path, align="structure")])
    drift = plan.sources[0].drift
    assert drift.matches == () and len(drift.unresolved) == 1
    files, models, reason = drift.unresolved[0]
    assert files == ("layers/block/alpha", "layers/block/zeta")
    assert models == ("layers/block/first", "layers/block/second") and "more than one pairing" in reason
    assert not plan.ok and len(plan.missing) == 4 and not plan.assignments
    assert "unresolved: file 'layers/block/alpha', 'layers/block/zeta' / model" in plan.report()
    with pytest.raises(cm.PlanError):
        plan.restore()
    assert all(np.array_equal(a, v.numpy()) for a, v in zip(before, new.weights))


# -- what load_weights would do, said before anything loads --------------------------------------

def _pair(keras, tmp_path):
    old = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3), keras.layers.Dense(2)])
    new = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3), keras.layers.Dense(5), keras.layers.Dense(2)])
    return old, new, _save(old, tmp_path, "old"), _save(new, tmp_path, "new")


def test_the_plan_report_says_what_load_weights_would_do(keras, tmp_path):
    old, new, old_path, new_path = _pair(keras, tmp_path)
    plan = cm.plan(new, [cm.Source(old_path, name="old")])
    verdict = plan.sources[0].keras
    assert verdict.outcome == "fail" and [p for p, _, _ in verdict.failures] == ["layers/dense_1", "layers/dense_2"]
    with pytest.raises(ValueError) as keras_error:
        keras.Sequential([keras.Input((4,)), keras.layers.Dense(3), keras.layers.Dense(5),
                          keras.layers.Dense(2)]).load_weights(old_path)
    assert "A total of 2 objects could not be loaded" in str(keras_error.value)
    text = plan.report()
    assert "    Keras: load_weights would fail: A total of 2 objects could not be loaded." in text
    assert "must match. variable.shape=(3, 5), Received: value.shape=(3, 2)" in text
    assert "with skip_mismatch=True it would warn and leave 2 objects as they are: 'layers/dense_1', 'layers/dense_2'" in text
    assert plan.to_dict()["sources"][0]["keras"]["outcome"] == "fail"
    assert cm.plan(old, [cm.Source(old_path)]).sources[0].keras.lines() == [
        "load_weights would load it: 2 objects restored from the file"]
    extra = cm.plan(old, [cm.Source(new_path)]).sources[0].keras
    assert extra.ignored == ("layers/dense_2/vars/0", "layers/dense_2/vars/1")


def test_diff_of_two_weights_files_says_what_load_weights_would_do(keras, tmp_path):
    old, new, old_path, new_path = _pair(keras, tmp_path)
    r = run("diff", old_path, new_path)
    assert r.exit_code == 1
    lines = r.stdout.splitlines()
    at = lines.index("Keras (a model saved as B, loading A with load_weights):")
    assert lines[at + 1].startswith("  load_weights would fail: A total of 2 objects could not be loaded.")
    assert "expected 2 variables, but received 0 variables during loading." in lines[at + 2]
    assert lines[at + 3] == ("  with skip_mismatch=True it would warn and leave 2 objects as they are: "
                             "'layers/dense_1', 'layers/dense_2'")
    r = run("diff", new_path, old_path, "--json")
    data = json.loads(r.stdout)["keras"]
    assert data["outcome"] == "fail" and data["ignored"] == ["layers/dense_2/vars/0", "layers/dense_2/vars/1"]
    r = run("diff", old_path, old_path)
    assert r.exit_code == 0 and "  load_weights would load it: 2 objects restored from the file" in r.stdout


def test_diff_of_two_legacy_files_says_what_load_weights_by_topology_would_do(keras, tmp_path):
    import h5py
    from keras.src.legacy.saving import legacy_h5_format

    def save(model, name):
        path = str(tmp_path / name)
        with h5py.File(path, "w") as f:
            legacy_h5_format.save_weights_to_hdf5_group(f, model)
        return path

    a = save(keras.Sequential([keras.Input((4,)), keras.layers.Dense(3), keras.layers.Dense(2)]), "a.h5")
    b = save(keras.Sequential([keras.Input((4,)), keras.layers.Dense(3), keras.layers.Dense(5)]), "b.h5")
    r = run("diff", a, b, "--json")
    (failure,) = json.loads(r.stdout)["keras"]["failures"]
    assert failure["message"].startswith("Shape mismatch in layer #1 (named dense_")
    assert "Weight expects shape (3, 5). Received saved weight with shape (3, 2)" in failure["message"]


def test_on_shape_mismatch_skip_is_per_variable_where_skip_mismatch_drops_the_layer(keras, tmp_path):
    """Keras assigns a layer's entries in order and gives up on the layer at the first mismatch;
    ckptmerge's on_shape_mismatch='skip' restores every variable that fits and skips the others."""

    class Pair(keras.layers.Layer):
        def __init__(self, n, **kw):
            super().__init__(**kw)
            self.n = n

        def build(self, shape):
            self.scale = self.add_weight(shape=(self.n,), name="scale")  # stored first: vars/0
            self.offset = self.add_weight(shape=(3,), name="offset")

        def call(self, x):
            return x

    def build(n):
        return _built(keras.Sequential([keras.Input((3,)), Pair(n)]), (1, 3))

    old = build(2)
    _randomize(old)
    path = _save(old, tmp_path)
    theirs, ours = build(4), build(4)
    for v, w in zip(ours.weights, theirs.weights):
        v.assign(w.numpy())
    with pytest.warns(UserWarning, match="could not be loaded"):
        theirs.load_weights(path, skip_mismatch=True)
    _same(theirs.layers[0].offset, ours.layers[0].offset)  # Keras gave up on the whole layer
    report = cm.restore(ours, [cm.Source(path)], on_shape_mismatch="skip")
    assert report.restored == [ours.layers[0].offset.path]
    _same(ours.layers[0].offset, old.layers[0].offset)  # ckptmerge restored the variable that fits
    plan = cm.plan(ours, [cm.Source(path)])
    assert [m.target for m in plan.mismatched] == [ours.layers[0].scale.path]
    assert plan.sources[0].keras.failures and plan.structure == []
