"""Every parameter of every combine method is checked, by name and with its allowed range, in
the API (``cm.combine``: an ``ArgumentError``, a ValueError), the CLI (``--param``: exit 2, one
``Error:`` line) and config files (``combine.parameters``: file:line) alike (issue 30 item 5).

The cases are generated: methods x parameters x bad values of the parameter's kind (non-finite,
bools, strings, None, out of range on either side, huge), plain, per glob and inside a gradient
list; and weights (or ``scale`` times them) that overflow float64. Nothing is opened: the
arguments are refused before any checkpoint is read (the paths need not exist)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from _cli_util import assert_one_line_error, run

import ckptmerge as cm
from ckptmerge.combining.methods import METHODS
from ckptmerge.combining.params import param_spec
from ckptmerge.core.errors import ArgumentError, CheckpointNotFoundError, CkptMergeError, ConfigError

RNG = np.random.default_rng(30)


def bad_values(spec):
    """Values a parameter of this kind must refuse, as (label, python value, CLI text, YAML text)."""
    nonfinite = [("nan", math.nan, "nan", ".nan"), ("inf", math.inf, "inf", ".inf"),
                 ("-inf", -math.inf, "-inf", "-.inf")]
    common = [("string", "abc", "abc", "abc"), ("none", None, None, "null")]
    if spec.kind == "bool":
        return nonfinite + common + [("one", 1, "1", "1"), ("string-true", "true", None, "'true'")]
    if spec.kind == "choice":
        return nonfinite + common + [("bool", True, "true", "true"), ("number", 1, "1", "1"),
                                     ("case", spec.choices[0].upper(), spec.choices[0].upper(), spec.choices[0].upper())]
    out = nonfinite + common + [("bool", True, "true", "true")]
    if spec.low is not None:  # below the range, by a little and by a random amount
        lo = spec.low - (0 if spec.open_low else 1e-9 * max(1, abs(spec.low)))
        out.append(("below", lo, repr(lo), repr(lo)))
        far = spec.low - float(RNG.uniform(1, 1e6))
        out.append(("far-below", far, repr(far), repr(far)))
    if spec.high is not None:
        hi = float(spec.high) + (0 if spec.open_high else 1e-6 * max(1, abs(spec.high)))
        out.append(("above", hi, repr(hi), repr(hi)))
        out.append(("huge", 1e308, "1e308", "1.0e+308"))
    if spec.kind == "integer":
        out.append(("fraction", 2.5, "2.5", "2.5"))
    return out


def good_value(spec):
    if spec.kind == "bool":
        return True
    if spec.kind == "choice":
        return spec.choices[0]
    if spec.low is not None and spec.high is not None:
        return (spec.low + spec.high) / 2 if spec.kind == "number" else int(spec.low) + 1
    return 1.0


CASES = [(m, k, v) for m, meth in METHODS.items() for k in meth.defaults
         for v in bad_values(param_spec(k, meth.defaults[k]))]
IDS = [f"{m}-{k}-{v[0]}" for m, k, v in CASES]


def call(method, **kw):
    """``cm.combine`` with inputs the method accepts (paths that need not exist: nothing opens)."""
    m = METHODS[method]
    base = "base-ckpt" if m.needs_base else None
    inputs = ["a-ckpt", "b-ckpt"] if m.max_inputs != 1 else ["a-ckpt"]
    return cm.combine(inputs, method, base=base, **kw)


def test_the_cross_product_covers_every_parameter_of_every_method():
    assert {(m, k) for m, k, _ in CASES} == {(m, k) for m, meth in METHODS.items() for k in meth.defaults}
    assert len(CASES) > 80


@pytest.mark.parametrize("form", ["plain", "glob", "gradient"])
@pytest.mark.parametrize("method,key,bad", CASES, ids=IDS)
def test_api_refuses_every_bad_value_by_name_and_range(method, key, bad, form):
    spec = param_spec(key, METHODS[method].defaults[key])
    value = {"plain": bad[1], "glob": {"*attn*": good_value(spec), "*": bad[1]},
             "gradient": [good_value(spec), bad[1]]}[form]
    with pytest.raises(ArgumentError) as e:
        call(method, **{key: value})
    assert isinstance(e.value, ValueError) and isinstance(e.value, CkptMergeError)
    msg = str(e.value)
    where = {"plain": key, "glob": f"{key}['*']", "gradient": f"{key}[1]"}[form]
    assert f"{where} must be {spec.allowed()}; received {bad[1]!r}" in msg, msg


@pytest.mark.parametrize("method,key,bad", [c for c in CASES if c[2][2] is not None],
                         ids=[i for c, i in zip(CASES, IDS) if c[2][2] is not None])
def test_cli_refuses_every_bad_value_with_one_error_line(method, key, bad):
    spec = param_spec(key, METHODS[method].defaults[key])
    m = METHODS[method]
    args = ["combine", "a-ckpt", "b-ckpt", "-m", method, "--param", f"{key}={bad[2]}", "-o", "out.safetensors"]
    if m.needs_base:
        args += ["--base", "base-ckpt"]
    assert_one_line_error(run(*args), f"{key} must be {spec.allowed()}; received")


def test_cli_refuses_bad_values_per_glob_and_in_gradients():
    assert_one_line_error(run("combine", "a", "b", "-m", "slerp", "--param", "t[*attn*]=nan", "--param", "t=0.5",
                              "-o", "o"), "t['*attn*'] must be a number in [0, 1]; received nan")
    assert_one_line_error(run("combine", "a", "b", "-m", "slerp", "--param", "t=[0, 0.5, 2]", "-o", "o"),
                          "t[2] must be a number in [0, 1]; received 2")
    assert_one_line_error(run("combine", "a", "b", "-m", "dare", "--base", "c", "--param", "seed=[1, -3]", "-o", "o"),
                          "seed[1] must be an integer in [0, 2**63); received -3")


@pytest.mark.parametrize("method", sorted(METHODS))
def test_config_refuses_every_bad_value_with_file_and_line(method, tmp_path):
    m = METHODS[method]
    for key in m.defaults:
        spec = param_spec(key, m.defaults[key])
        bads = bad_values(spec)
        text = ("combine:\n  method: " + method + "\n" + ("  base: b\n" if m.needs_base else "")
                + "  models: [a, c]\n  parameters:\n")
        for i, b in enumerate(bads):
            cfg = tmp_path / f"{method}-{key}-{i}.yaml"
            cfg.write_text(text + f"    {key}: {b[3]}\n")
            with pytest.raises(ConfigError) as e:
                cm.load_config(str(cfg))
            msg = str(e.value)
            line = text.count("\n") + 1
            assert f"{cfg.name}:{line} combine.parameters.{key}: {key} must be {spec.allowed()}; received" in msg, msg


def test_config_refuses_bad_values_in_globs_and_gradients(tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("combine:\n  method: ties\n  base: b\n  models: [a, c]\n  parameters:\n"
                   "    density: {'*attn*': .nan, '*': 0.5}\n    scale: [1.0, .inf]\n")
    with pytest.raises(ConfigError) as e:
        cm.load_config(str(cfg))
    msg = str(e.value)
    assert "c.yaml:6 combine.parameters.density['*attn*']: density must be a number in (0, 1]; received nan" in msg
    assert "c.yaml:7 combine.parameters.scale: scale[1] must be a finite number; received inf" in msg


@pytest.mark.parametrize("method", ["mean", "task_arithmetic", "ties", "dare"])
def test_weights_whose_sum_overflows_are_refused(method):
    with pytest.raises(ArgumentError, match="sum to more than float64 holds"):
        call(method, weights=[1e308, 1e308])
    big = float(RNG.uniform(0.9e308, 1.7e308))  # each finite, their sum not
    with pytest.raises(ArgumentError, match="sum to more than float64 holds"):
        call(method, weights=[big, -1e308 if method != "mean" else big])
    if method != "mean":
        with pytest.raises(ArgumentError, match=r"scale=1e\+300 times the weights 1e\+10, 1 overflows"):
            call(method, weights=[1e10, 1.0], scale=1e300)
    for w in (math.nan, math.inf, True, "1"):
        with pytest.raises(ArgumentError, match=r"weights\[1\] must be a finite number"):
            call(method, weights=[1.0, w])


def test_weighted_mean_with_a_vanishing_sum_is_refused():
    with pytest.raises(ArgumentError, match="sum to 0"):
        call("mean", weights=[1.0, -1.0])
    with pytest.raises(ArgumentError, match="dividing by it overflows"):
        cm.combine(["a", "b", "c"], weights=[1e300, -1e300, 1e-320])  # (an exact sum: 1e-320)
    call("mean", weights=[1e-310, 3e-310])  # tiny but a fine ratio


def test_cli_weights_and_scale_overflow_are_one_line_errors():
    assert_one_line_error(run("combine", "a", "b", "--weights", "1e308,1e308", "-o", "o"), "sum to more than")
    assert_one_line_error(run("combine", "a", "b", "--weights", "nan,1", "-o", "o"), "weights[0] must be a finite")
    assert_one_line_error(run("combine", "a", "b", "-m", "task_arithmetic", "--base", "c", "--param", "scale=1e308",
                              "--weights", "10,10", "-o", "o"), "scale=1e+308 times the weights")


def test_good_values_pass_the_check():
    for method, m in METHODS.items():
        for key, default in m.defaults.items():
            spec = param_spec(key, default)
            for value in (good_value(spec), {"*x*": good_value(spec), "*": default}, [default, good_value(spec)]):
                try:
                    call(method, **{key: value})
                except CheckpointNotFoundError:  # (ema orders its inputs by step: past the checks)
                    assert method == "ema"
