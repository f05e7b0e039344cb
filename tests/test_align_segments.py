"""Names whose segments are not all joined by ``/`` (issue 19, "never wrong").

A regex into a dotted scope (``L0/(.*)`` -> ``encoder.layer.1.\\1``) makes names half in PyTorch's
spelling: ``encoder.layer.1.attention/output/LayerNorm/gamma`` beside
``encoder.layer.1.output/LayerNorm/gamma``. The convention table read only ``/`` as a segment
edge, so it saw the first as ``output/LayerNorm`` (the MLP's norm) and alignment swapped every
layer's two LayerNorms: 8 wrong tensors, with confidence. ``.`` is a segment edge now, so those
names read as their segments say; a head glued to other words by ``_`` (``..._attention/output/
LayerNorm``) leaves the reading open, and the two equal-shaped norms stay unresolved, both named.
Pure: names and shapes in, assignments out.
"""

from __future__ import annotations

import numpy as np
import pytest

import ckptmerge as cm
from ckptmerge.alignment.align import align
from ckptmerge.alignment.conventions import rewrite
from ckptmerge.core.specs import VariableInfo as V

_MODULES = {  # BERT's layer as the torch layout names it: module -> {leaf: shape}
    "attention/self/query": {"kernel": (16, 16), "bias": (16,)},
    "attention/self/key": {"kernel": (16, 16), "bias": (16,)},
    "attention/self/value": {"kernel": (16, 16), "bias": (16,)},
    "attention/output/dense": {"kernel": (16, 16), "bias": (16,)},
    "attention/output/LayerNorm": {"gamma": (16,), "beta": (16,)},
    "intermediate/dense": {"kernel": (16, 40), "bias": (40,)},
    "output/dense": {"kernel": (40, 16), "bias": (16,)},
    "output/LayerNorm": {"gamma": (16,), "beta": (16,)},
}


def _layers(scope):
    """``{name: shape}`` of two BERT layers; ``scope(k)``: layer k's scope, joined to the module path by ``/``."""
    return {f"{scope(k)}/{module}/{leaf}": shape
            for k in range(2) for module, leaves in _MODULES.items() for leaf, shape in leaves.items()}


def _specs(names):
    return [V(n, s, "float32") for n, s in names.items()]


SLASHED = _layers(lambda k: f"encoder/layer/{k}")
#: the layer scope joined to the module's first segment (``encoder.layer.1.attention/output/LayerNorm``)
JOINED = {"dotted": lambda k: f"encoder.layer.{k}.", "glued": lambda k: f"encoder_layer_{k}_"}


def _truth(kind):
    """Slashed name -> the same tensor's name with the layer scope joined as ``kind``."""
    scope = JOINED[kind]
    return {n: n.replace(f"encoder/layer/{k}/", scope(k), 1)
            for n in SLASHED for k in range(2) if n.startswith(f"encoder/layer/{k}/")}


def _aligned(kind, side):
    """The truth, the targets and the alignment, with ``kind``'s names on ``side``."""
    truth = _truth(kind)
    other = {truth[n]: s for n, s in SLASHED.items()}
    targets, names = (SLASHED, other) if side == "source" else (other, SLASHED)
    return truth, targets, align(_specs(targets), _specs(names))


@pytest.mark.parametrize("side", ["source", "target"])
def test_dotted_layer_scopes_pair_each_layernorm_with_its_own(side):
    truth, targets, found = _aligned("dotted", side)
    want = {v: k for k, v in truth.items()} if side == "source" else dict(truth)
    assert found.mapping == want  # all 32, the four LayerNorms of each layer included
    assert not found.unresolved


@pytest.mark.parametrize("side", ["source", "target"])
def test_glued_layer_scopes_leave_the_two_layernorms_unresolved_never_swapped(side):
    truth, targets, found = _aligned("glued", side)
    pairs = {t: s for s, t in found.mapping.items()}
    right = (lambda t, s: truth[t] == s) if side == "source" else (lambda t, s: truth[s] == t)
    assert [(t, s) for t, s in pairs.items() if not right(t, s)] == []  # 0 wrong
    norms = {t for t in targets if "LayerNorm" in t}
    assert len(pairs) == len(targets) - len(norms)  # everything else decided
    assert {t for u in found.unresolved for t in u.targets} == norms
    inverse = {v: k for k, v in truth.items()}
    for u in found.unresolved:  # both candidates of each norm named
        for t in u.targets:
            slashed = t if side == "source" else inverse[t]
            layer, leaf = slashed.split("/")[2], slashed.rsplit("/", 1)[1]
            both = {f"encoder/layer/{layer}/{m}/LayerNorm/{leaf}" for m in ("attention/output", "output")}
            assert ({truth[x] for x in both} if side == "source" else both) <= set(u.names), (t, u.names)


def test_suggest_and_align_structure_apply_no_swapped_layernorm():
    for kind in JOINED:
        truth = _truth(kind)
        values = {truth[n]: np.zeros(s, np.float32) for n, s in SLASHED.items()}
        (sug,) = cm.suggest(_specs(SLASHED), [cm.Source.from_values(values)]).sources
        applied = {e.name: e.target for e in sug.entries if not e.review}
        for name, target in applied.items():  # (entries are whole modules here: scope to scope)
            assert name.endswith("/") and all(truth[t] == name + t[len(target):] for t in SLASHED
                                              if t.startswith(target)), (kind, name, target)
        plan = cm.plan(_specs(SLASHED), [cm.Source.from_values(values, align="structure")])
        got = {t: a.name for t, a in plan.assignments.items()}
        assert all(truth[t] == n for t, n in got.items()), kind
        norms = {t for t in SLASHED if "LayerNorm" in t}
        assert set(got) == (set(SLASHED) if kind == "dotted" else set(SLASHED) - norms), kind


def test_the_convention_table_reads_dots_as_segment_edges():
    assert rewrite("encoder.layer.1.attention/output/LayerNorm/gamma") == "encoder.layer.1.attnnorm/gamma"
    assert rewrite("encoder.layer.1.attention.output.LayerNorm.weight") == "encoder.layer.1.attnnorm.weight"
    assert rewrite("encoder.layer.1.output/LayerNorm/gamma") == "encoder.layer.1.mlpnorm/gamma"
    assert rewrite("model.layers.0.post_attention_layernorm.weight") == "model.layers.0.mlpnorm.weight"
    # a role that joins the words keeps the name's own separators
    assert rewrite("h.0.attn.c_proj.weight") == "h.0.attn.c_proj_attnout.weight"
    # the tail of a longer row, its head glued to other words: read by its words alone
    assert rewrite("encoder_layer_1_attention/output/LayerNorm/gamma") == "encoder_layer_1_attention/output/LayerNorm/gamma"
    assert rewrite("x/crossattention/output/LayerNorm/gamma") == "x/crossattention/output/LayerNorm/gamma"
    assert rewrite("encoder/layer/1/output/LayerNorm/gamma") == "encoder/layer/1/mlpnorm/gamma"  # (as before)
