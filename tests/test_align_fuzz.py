"""Structural alignment on randomly renamed small models (issue 32 item 3).

MLPs, conv stacks with BatchNorms and small transformer blocks (tests/_renames.py), each named
twice the ways real code renames: prefixes added or removed, numbered scopes merged or split
(``encoder/layer_0/`` vs ``encoder_layer0/``), numbering from 0 or 1 or with gaps, synonyms,
Keras auto-names from any counter start (``dense_7``), PyTorch dotted names and shapes read
through ``layout="torch"``. Alignment is pure, so the fuzz runs on specs: a Keras model target
gives its creation order (``plan_in_order``), a spec list none (``cm.plan``); a source records
its saving order half the time where its format would (a TF2 object-based checkpoint), never for
PyTorch.

Measured (seeds 0-149 / 1000-1199): with the orders 91.9% / 89.2% of targets placed (75.8% on
seeds 0-149 before issue 32), without them 78.5% / 76.9% (69.2% before), 0 wrong in every run.
With the orders every case that names or orders can decide is complete (100%); what stays
unresolved is one class, which nothing but a convention could decide: a Keras target with flat
auto-names (``dense_3``, ``dense_4``..) against a checkpoint that records no saving order and
names the layers of one shape by words (``attn/q_proj``, ``attn/k_proj``..; a PyTorch file).
Without the orders, what is left is that class both ways round (a worded side with no order
against a flat counter). The last tests run the ordered case through real Keras models: a flat,
auto-named functional twin restored from a live subclassed model (which records its creation
order), output equal.
"""

from __future__ import annotations

import numpy as np
import pytest

import ckptmerge as cm
from _renames import make_case, plan_in_order
from ckptmerge.alignment.align import align
from ckptmerge.core.specs import VariableInfo as V

SEEDS = range(2000, 2120)  # (other seeds than the ones the figures above were measured on)


def _undecidable(case) -> bool:
    """The class names cannot decide (see the module docstring)."""
    return (case.family == "transformer" and case.target_style.auto is not None
            and case.source_style.auto is None and not case.source_ordered)


def _outcome(seed: int, ordered: bool):
    case = make_case(seed)
    targets = [V(n, s, "float32") for n, s in case.targets]
    src = cm.Source.from_values({n: np.zeros(s, np.float32) for n, s in case.source},
                                layout="torch" if case.source_style.torch else None, align="structure")
    if ordered:
        if case.source_ordered:
            src.order = tuple(n for n, _ in case.source)
        plan = plan_in_order(targets, src, [n for n, _ in case.targets])
    else:
        plan = cm.plan(targets, [src])
    truth = case.truth
    wrong = [(t, a.key, truth[t]) for t, a in plan.assignments.items() if a.key != truth[t]]
    return _undecidable(case), len(targets), len(plan.assignments), wrong


# (ordered: 91.9% placed (100% of the decidable class) when the fuzz landed; 80.9% (93.9%) since the name-swap guard of 410db48, which took
# 30 wrong CSPNet tensors to 0 and also leaves ~150 final-norm / per-layer-norm pairings of these
# transformer cases unresolved: never wrong, a coverage regression to win back by refining that guard)
@pytest.mark.parametrize("ordered, floor, decidable_floor", [(True, 0.80, 0.9), (False, 0.65, 0.75)])
def test_renamed_models_are_placed_and_never_wrong(ordered, floor, decidable_floor):
    counts = {False: [0, 0], True: [0, 0]}  # undecidable class -> [targets, placed]
    wrong = []
    for seed in SEEDS:
        hard, n, got, bad = _outcome(seed, ordered)
        counts[hard][0] += n
        counts[hard][1] += got
        wrong += [(seed, *b) for b in bad]
    assert wrong == []
    total, placed = (sum(c[i] for c in counts.values()) for i in (0, 1))
    assert placed / total >= floor, f"{placed} of {total} placed"
    assert counts[False][1] / counts[False][0] >= decidable_floor, counts


def test_a_flat_keras_counter_pairs_with_a_numbered_series_by_creation_order():
    # dense_8.. numbers each Dense in the model; block_1.. numbers blocks of four: the target's
    # creation order ranks its tensors as finely as the counter does
    targets = [f"block_{b}/{w}/kernel" for b in (1, 2) for w in ("query", "key", "value", "output")]
    names = [f"dense_{8 + i}/kernel" for i in range(8)]
    found = align([V(t, (4, 4), "float32") for t in targets], [V(n, (4, 4), "float32") for n in names],
                  target_order=targets)
    assert found.mapping == dict(zip(names, targets))
    # an order that contradicts the target's own numbers is no evidence
    shuffled = targets[4:] + targets[:4]
    assert align([V(t, (4, 4), "float32") for t in targets], [V(n, (4, 4), "float32") for n in names],
                 target_order=shuffled).mapping == {}


def test_biases_and_norm_scales_of_one_width_are_solved_kind_by_kind():
    targets = [V("enc/block_1/attn/bias", (8,), "float32"), V("enc/block_1/norm/gamma", (8,), "float32"),
               V("enc/block_2/attn/bias", (8,), "float32"), V("enc/block_2/norm/gamma", (8,), "float32")]
    names = [V("dense/bias", (8,), "float32"), V("dense_1/bias", (8,), "float32"),
             V("layer_normalization_3/gamma", (8,), "float32"), V("layer_normalization_4/gamma", (8,), "float32")]
    got = align(targets, names, target_order=[t.name for t in targets]).mapping
    assert got == {"dense/bias": "enc/block_1/attn/bias", "dense_1/bias": "enc/block_2/attn/bias",
                   "layer_normalization_3/gamma": "enc/block_1/norm/gamma",
                   "layer_normalization_4/gamma": "enc/block_2/norm/gamma"}


def test_names_alone_leave_a_flat_counter_against_words_unresolved():
    targets = [V(f"dense_{i}/kernel", (4, 4), "float32") for i in range(4)]
    names = [V(f"attn/{w}/kernel", (4, 4), "float32") for w in ("q_proj", "k_proj", "v_proj", "o_proj")]
    found = align(targets, names, target_order=[t.name for t in targets])
    assert found.matches == [] and len(found.unresolved[0].targets) == 4


# -- the same through real Keras models: a live source records its creation order -------------

def _keras_pair(seed: int):
    import keras

    rng = np.random.default_rng(seed)
    d, f, depth = 8, 16, int(rng.integers(2, 4))

    class Block(keras.layers.Layer):
        def __init__(self, **kw):
            super().__init__(**kw)
            self.attn = [keras.layers.Dense(d, name=n) for n in ("q_proj", "k_proj", "v_proj", "o_proj")]
            self.norm1 = keras.layers.LayerNormalization(name="norm1")
            self.fc1, self.fc2 = keras.layers.Dense(f, name="fc1"), keras.layers.Dense(d, name="fc2")
            self.norm2 = keras.layers.LayerNormalization(name="norm2")

        def call(self, x):
            q, k, v = (layer(x) for layer in self.attn[:3])
            x = self.norm1(x + self.attn[3](q * k + v))
            return self.norm2(x + self.fc2(self.fc1(x)))

    class Encoder(keras.Model):
        def __init__(self, **kw):
            super().__init__(**kw)
            self.blocks = [Block(name=f"layer_{i + 1}") for i in range(depth)]

        def call(self, x):
            for b in self.blocks:
                x = b(x)
            return x

    source = Encoder(name="encoder")
    x = np.asarray(rng.normal(size=(2, d)), np.float32)
    source(x)
    for v in source.weights:
        v.assign(rng.normal(size=tuple(v.shape)).astype(np.float32))
    inp = keras.Input((d,))
    h = inp
    for _ in range(depth):  # the same computation from flat, auto-named layers
        q, k, v = (keras.layers.Dense(d)(h) for _ in range(3))
        h = keras.layers.LayerNormalization()(h + keras.layers.Dense(d)(q * k + v))
        h = keras.layers.LayerNormalization()(h + keras.layers.Dense(d)(keras.layers.Dense(f)(h)))
    return source, keras.Model(inp, h), x


@pytest.mark.parametrize("seed", [3, 4])
def test_a_flat_auto_named_keras_twin_takes_a_live_model_by_creation_order(seed):
    source, target, x = _keras_pair(seed)
    plan = cm.plan(target, [cm.Source.from_values(source, align="structure")])
    assert plan.missing == [] and plan.ok
    cm.restore(target, [cm.Source.from_values(source, align="structure")])
    np.testing.assert_allclose(target(x), source(x), rtol=1e-5, atol=1e-5)
