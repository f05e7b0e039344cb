"""Layers as units across layers (issue 32): a norm goes with the layer it normalises.

torchvision ResNets into KerasHub's ``ResNetBackbone`` once had their stem's and first stage's
64-channel BatchNorms shifted by one place (28 wrong tensors in ResNet-50, reported as confident
matches), while the convs beside them paired right. The class: a numbered series compared across
two families (``conv1_bn`` beside ``stack0_block0_1_bn``) where the graph says which conv feeds
each norm. Generated here for several depths, widths and block types: every pairing is right or
left unresolved, never wrong.
"""

from __future__ import annotations

from typing import Dict, List, Sequence, Tuple

import pytest

from ckptmerge.alignment.align import align
from ckptmerge.alignment import units
from ckptmerge.core.specs import VariableInfo

_BN_T = ("gamma", "beta", "moving_mean", "moving_variance")


def _resnet(depths: Sequence[int], width: int, bottleneck: bool):
    """KerasHub-named targets (names, order, inputs) and torchvision-named sources of one ResNet,
    with the truth ``{target: source}``."""
    targets: List[VariableInfo] = []
    order: List[str] = []
    inputs: Dict[str, Tuple[str, ...]] = {}
    sources: List[VariableInfo] = []
    truth: Dict[str, str] = {}

    def layer(tscope: str, sscope: str, kshape: Tuple[int, ...], tnorm: str, snorm: str, prev: str) -> str:
        kt, ks = f"{tscope}/kernel", f"{sscope}/kernel"
        targets.append(VariableInfo(kt, kshape, "float32"))
        sources.append(VariableInfo(ks, kshape, "float32"))
        truth[kt] = ks
        order.append(kt)
        if prev:
            inputs[kt] = tuple(f"{prev}/{leaf}" for leaf in _BN_T)
        for leaf in _BN_T:
            t, s = f"{tnorm}/{leaf}", f"{snorm}/{leaf}"
            targets.append(VariableInfo(t, (kshape[-1],), "float32"))
            sources.append(VariableInfo(s, (kshape[-1],), "float32"))
            truth[t] = s
            order.append(t)
            inputs[t] = (kt,)
        return tnorm

    prev = layer("conv1_conv", "conv1", (7, 7, 3, width), "conv1_bn", "bn1", "")
    cin = width
    expand = 4 if bottleneck else 1
    for s, depth in enumerate(depths):
        f = width * 2 ** s
        for b in range(depth):
            tp, sp = f"stack{s}_block{b}", f"layer{s + 1}/{b}"
            block_in = prev
            if bottleneck:
                shapes = [(1, 1, cin, f), (3, 3, f, f), (1, 1, f, f * expand)]
            else:
                shapes = [(3, 3, cin, f), (3, 3, f, f)]
            for i, shape in enumerate(shapes, 1):
                prev = layer(f"{tp}_{i}_conv", f"{sp}/conv{i}", shape, f"{tp}_{i}_bn", f"{sp}/bn{i}", prev)
            if b == 0 and cin != f * expand:
                layer(f"{tp}_0_conv", f"{sp}/downsample/0", (1, 1, cin, f * expand), f"{tp}_0_bn",
                      f"{sp}/downsample/1", block_in)
            cin = f * expand
    sources += [VariableInfo("fc/kernel", (cin, 10), "float32"), VariableInfo("fc/bias", (10,), "float32")]
    return targets, order, inputs, sources, truth


@pytest.mark.parametrize("depths,width,bottleneck", [
    ((3, 4, 6, 3), 64, True),    # ResNet-50, the case of issue 32
    ((3, 4, 23, 3), 64, True),   # ResNet-101
    ((2, 3), 16, True),
    ((1, 2, 2), 8, True),
    ((2, 2, 2, 2), 64, False),   # ResNet-18
    ((3, 4, 6, 3), 32, False),   # ResNet-34, narrower
])
def test_resnet_norms_are_never_shifted_off_their_convs(depths, width, bottleneck):
    targets, order, inputs, sources, truth = _resnet(depths, width, bottleneck)
    result = align(targets, sources, target_order=order, target_inputs=inputs)
    wrong = {m.target: m.name for m in result.matches if truth[m.target] != m.name}
    assert wrong == {}
    placed = {m.target for m in result.matches}
    open_ = {t for u in result.unresolved for t in u.targets}
    assert placed | open_ == set(truth) and not placed & open_
    # the ResNet-50 of the issue is placed whole (the norms beside their convs)
    if depths == (3, 4, 6, 3) and bottleneck:
        assert placed == set(truth)


def test_a_norm_split_from_its_conv_is_never_kept():
    """:func:`units.contradicted` flags a norm paired away from its own conv's module while a
    candidate sits beside that conv; a norm without a graph anchor is not judged."""
    from ckptmerge.alignment.entries import Columns, Match
    spec = VariableInfo("x", (4,), "float32")
    groups = {((4,), "float32"): (["a_bn/gamma", "b_bn/gamma"], ["m1/bn/gamma", "m2/bn/gamma"], spec)}
    inputs = {"a_bn/gamma": ("a_conv/kernel",), "b_bn/gamma": ("b_conv/kernel",)}
    matches = Columns()
    matches.extend([Match("a_conv/kernel", "m1/conv/kernel", 0.9, (), None),
                    Match("b_conv/kernel", "m2/conv/kernel", 0.9, (), None),
                    Match("a_bn/gamma", "m2/bn/gamma", 0.7, (), None),
                    Match("b_bn/gamma", "m1/bn/gamma", 0.7, (), None)])
    assert units.contradicted(matches, groups, inputs) == {2, 3}
    assert units.contradicted(matches, groups, {}) == set()
