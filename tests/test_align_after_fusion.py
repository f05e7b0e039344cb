"""Swin's attention once q/k/v are joined (issue 32): the output projection is aligned among the
tensors still free, and what stays open names every free candidate, never a tensor a join took.

Before, the first alignment pass tied the output projection with the ``query``/``key``/``value``
tensors that the fusion then joined into ``qkv``: the report named those used tensors as the
candidates while the right one stayed unused.
"""

from __future__ import annotations

import numpy as np

import ckptmerge as cm
from ckptmerge.core.specs import VariableInfo as V

D = 8


def _swin(blocks=2, extra=False):
    targets, values = [], {}
    for i in range(blocks):
        t = f"swin/stage_0/block_{i}/attn"
        targets += [V(f"{t}/qkv/kernel", (D, 3 * D), "float32"), V(f"{t}/qkv/bias", (3 * D,), "float32"),
                    V(f"{t}/proj/kernel", (D, D), "float32"), V(f"{t}/proj/bias", (D,), "float32")]
        s = f"swin.encoder.layers.0.blocks.{i}.attention"
        for w in ("self.query", "self.key", "self.value", "output.dense") + (("output.gate",) if extra else ()):
            values[f"{s}.{w}.weight"] = np.zeros((D, D), np.float32)
            values[f"{s}.{w}.bias"] = np.zeros((D,), np.float32)
    return targets, values


def test_the_output_projection_takes_the_tensor_the_joins_left_free():
    targets, values = _swin()
    plan = cm.plan(targets, [cm.Source.from_values(values, layout="torch", align="structure")])
    assert plan.missing == [] and plan.ok
    for i in range(2):
        assert plan.assignments[f"swin/stage_0/block_{i}/attn/proj/kernel"].key == \
            f"swin.encoder.layers.0.blocks.{i}.attention.output.dense.weight"
        assert plan.assignments[f"swin/stage_0/block_{i}/attn/proj/bias"].key == \
            f"swin.encoder.layers.0.blocks.{i}.attention.output.dense.bias"
        assert "+" in plan.assignments[f"swin/stage_0/block_{i}/attn/qkv/kernel"].name  # (joined)


def test_an_open_output_projection_names_every_free_candidate_and_no_used_one():
    targets, values = _swin(extra=True)  # a second free (8, 8) tensor beside output.dense: a tie
    plan = cm.plan(targets, [cm.Source.from_values(values, layout="torch", align="structure")])
    proj = [f"swin/stage_0/block_{i}/attn/proj/kernel" for i in range(2)]
    assert set(proj) <= set(plan.missing)
    [view] = plan.sources
    named = {n for u in view.unresolved if set(u.targets) & set(proj) for n in u.names}
    want = {f"swin/encoder/layers/0/blocks/{i}/attention/output/{w}/kernel" for i in range(2) for w in ("dense", "gate")}
    assert named == want
    report = plan.report()
    assert "self/query/kernel' <-" not in report and "one of 'swin/encoder/layers/0/blocks/0/attention/output" in report
