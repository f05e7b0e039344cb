"""The torch layout checks RNN ranks and bias shapes (issue 24, item 12).

An LSTM/GRU layer whose tensors cannot be what PyTorch stores (a weight that is not rank 2, a
bias that is not rank 1, rows that differ between the four tensors, a ``weight_hh`` whose rows
are no whole number of gates, or not the gates ``rnn=`` names) is kept as it is, tensor by tensor,
and reported as a layout finding naming the layer: no IndexError or ValueError from the layout or
from applying it, and never a tensor broadcast into a wrong shape (a ``(1,)`` bias would broadcast
against a ``(4H,)`` one).
"""

from __future__ import annotations

import numpy as np
import pytest
import safetensors.numpy as st_numpy

import ckptmerge as cm
from _cli_util import run, write_config
from ckptmerge.alignment.layouts import apply_entry, torch_layout
from ckptmerge.core.specs import VariableInfo

H, IN = 2, 3


def _specs(shapes):
    return [VariableInfo(f"rnn.{k}_l0", shape, "float32") for k, shape in shapes.items()]


GOOD = {"weight_ih": (4 * H, IN), "weight_hh": (4 * H, H), "bias_ih": (4 * H,), "bias_hh": (4 * H,)}

MALFORMED = {
    "scalar-weight_ih": ({**GOOD, "weight_ih": ()}, "weight_ih 'rnn.weight_ih_l0' has shape (), not rank 2"),
    "scalar-weight_hh": ({**GOOD, "weight_hh": ()}, "weight_hh 'rnn.weight_hh_l0' has shape (), not rank 2"),
    "rank-1-weight_hh": ({**GOOD, "weight_hh": (4 * H,)}, "weight_hh 'rnn.weight_hh_l0' has shape (8,), not rank 2"),
    "rank-1-weight_ih": ({**GOOD, "weight_ih": (4 * H,)}, "weight_ih 'rnn.weight_ih_l0' has shape (8,), not rank 2"),
    "rank-3-weight_ih": ({**GOOD, "weight_ih": (4 * H, IN, 1)}, "weight_ih 'rnn.weight_ih_l0' has shape (8, 3, 1), "
                                                               "not rank 2"),
    "2-D-bias": ({**GOOD, "bias_ih": (4 * H, 1)}, "bias_ih 'rnn.bias_ih_l0' has shape (8, 1), not rank 1"),
    "scalar-bias": ({**GOOD, "bias_hh": ()}, "bias_hh 'rnn.bias_hh_l0' has shape (), not rank 1"),
    "broadcasting-bias": ({**GOOD, "bias_ih": (1,)}, "the gate rows differ: bias_hh 'rnn.bias_hh_l0' (8,), "
                                                      "bias_ih 'rnn.bias_ih_l0' (1,)"),
    "short-bias": ({**GOOD, "bias_hh": (3 * H,)}, "the gate rows differ"),
    "rows-differ": ({**GOOD, "weight_ih": (3 * H, IN)}, "weight_ih 'rnn.weight_ih_l0' (6, 3)"),
    "hidden-0": ({**GOOD, "weight_hh": (4 * H, 0)}, "weight_hh 'rnn.weight_hh_l0' has shape (8, 0): its rows are "
                                                     "not a whole number of gates"),
    "rows-not-gates": ({"weight_ih": (7, IN), "weight_hh": (7, H)}, "not a whole number of gates"),
}


@pytest.mark.parametrize("case", sorted(MALFORMED))
@pytest.mark.parametrize("module, layer", [("rnn", "0"), ("encoder.lstm", "1"), ("dec.gru_cell", "2_reverse")])
def test_every_malformed_rnn_tensor_is_named_as_the_checkpoint_has_it(case, module, layer):
    """Issue 30: a wrong rank was refused without naming the tensor. Each problem names each
    tensor it is about by its checkpoint key, in any module and layer (reverse direction too)."""
    shapes, problem = MALFORMED[case]
    specs = [VariableInfo(f"{module}.{k}_l{layer}", s, "float32") for k, s in shapes.items()]
    lay = torch_layout(specs)
    scope = module.replace(".", "/") + f"/l{layer}".replace("_reverse", "_reverse")
    assert len(lay.undecided) == 1, lay.undecided
    name, why = lay.undecided[0]
    expected = problem.replace("'rnn.", f"'{module}.").replace("_l0'", f"_l{layer}'")
    assert expected in why, why
    assert name.startswith(module.replace(".", "/") + "/l"), name


@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_a_malformed_rnn_layer_is_a_finding_and_kept_as_it_is(case):
    shapes, problem = MALFORMED[case]
    lay = torch_layout(_specs(shapes))
    assert [n for n, _ in lay.undecided] == ["rnn/l0"]
    why = lay.undecided[0][1]
    assert why.startswith("malformed RNN layer: ") and problem in why, why
    assert sorted(lay.entries) == sorted(f"rnn/l0/{k}" for k in shapes)
    for name, entry in lay.entries.items():
        assert entry.op == "copy" and entry.info.shape == shapes[name.rsplit("/", 1)[1]]
        value = np.zeros(entry.info.shape, np.float32)
        assert apply_entry(entry, [value]) is value


@pytest.mark.parametrize("rnn,shapes,problem", [
    ("lstm", {"weight_ih": (3 * H, IN), "weight_hh": (3 * H, H)}, "not (4 * hidden, hidden) for rnn='lstm'"),
    ("gru", {"weight_ih": (4 * H, IN), "weight_hh": (4 * H, H)}, "not (3 * hidden, hidden) for rnn='gru'"),
    ("lstm", {"weight_ih": (6, IN)}, "do not divide into 4 gates for rnn='lstm'"),
])
def test_a_layer_that_is_not_the_rnn_named_is_a_finding(rnn, shapes, problem):
    lay = torch_layout(_specs(shapes), rnn=rnn)
    assert len(lay.undecided) == 1 and problem in lay.undecided[0][1], lay.undecided


@pytest.mark.parametrize("gates,rnn", [(4, "auto"), (3, "auto"), (4, "lstm"), (3, "gru")])
def test_well_formed_layers_are_still_converted(gates, rnn):
    shapes = {"weight_ih": (gates * H, IN), "weight_hh": (gates * H, H), "bias_ih": (gates * H,),
              "bias_hh": (gates * H,)}
    lay = torch_layout(_specs(shapes), rnn=rnn)
    assert lay.undecided == []
    assert sorted(lay.entries) == ["rnn/l0/bias", "rnn/l0/kernel", "rnn/l0/recurrent_kernel"]


def test_a_malformed_rnn_file_plans_with_a_finding_and_no_traceback(tmp_path):
    rng = np.random.default_rng(0)
    state = {f"rnn.{k}_l0": rng.standard_normal(s).astype(np.float32)
             for k, s in {**GOOD, "bias_ih": (1,)}.items()}
    state["fc.weight"] = rng.standard_normal((4, 2)).astype(np.float32)
    path = tmp_path / "w.safetensors"
    st_numpy.save_file(state, str(path))
    source = cm.Source(str(path), layout="torch")
    plan = cm.plan([VariableInfo("fc/kernel", (2, 4), "float32")], [source])
    report = plan.report()
    assert "rnn/l0: malformed RNN layer: the gate rows differ" in report, report
    assert plan.assignments["fc/kernel"].name == "fc/kernel"
    config = write_config(tmp_path / "c.yaml", f"""
        sources:
          - path: {path}
            layout: torch
    """)
    for args in (("plan", config, "--target", path), ("merge", config, "-o", tmp_path / "out" / "m.ckpt")):
        result = run(*args)
        assert "Traceback" not in result.output and result.exit_code in (0, 1, 2), result.output
        assert "malformed RNN layer" in result.output, result.output
