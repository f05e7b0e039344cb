"""NaN and Inf in any input of any method are kept in the output, or refused naming the tensor;
never hidden (issue 30 item 13, issue 34 item 4).

The elementwise methods (mean, ema, task_arithmetic, ties, dare with either consensus) keep
them: every element where an input or the base is non-finite is non-finite in the output, and
every other element is what the method gives when those elements are set to the base (or to
zero without a base): so a non-finite value changes nothing but its own element. The methods
whose coefficients are a whole-tensor angle (slerp, model_stock) refuse the tensor by name.
NaN, +Inf and -Inf are put at random positions of random inputs, over several seeds, sizes
and chunk sizes, and through real files (the blocked and streamed paths)."""

from __future__ import annotations

import numpy as np
import pytest
from test_combine import write

import ckptmerge as cm
from ckptmerge.combining.methods import METHODS, combine_arrays
from ckptmerge.core.errors import CombineError

KEEPING = [("mean", {}), ("mean", {"weights": [0.5, 0.0, 2.0]}), ("mean", {"weights": [1.0, -2.0, 0.5], "normalize": False}), ("ema", {"decay": 0.5}), ("ema", {"decay": 0.0}),
           ("task_arithmetic", {"weights": [1.0, -0.5, 0.3], "scale": 0.7}),
           ("ties", {"density": 0.3}), ("ties", {"density": 1.0, "normalize": False}),
           ("ties", {"density": 0.05, "weights": [1.0, 2.0, 0.5]}),
           ("dare", {"density": 0.5, "seed": 3}), ("dare", {"density": 0.4, "consensus": "ties", "seed": 1}),
           ("dare", {"density": 0.9, "consensus": "ties", "normalize": True})]
KEEPING += [("ties", {"density": 0.3, "conventions": "mergekit"}),  # (mergekit's conventions alike)
            ("ties", {"density": 0.5, "rescale": True, "conventions": "mergekit"}),
            ("ties", {"density": 0.4, "int8_mask": True, "conventions": "mergekit"}),
            ("dare", {"density": 0.5, "rescale": True, "consensus": "ties", "conventions": "mergekit"}),
            ("task_arithmetic", {"normalize": True, "weights": [0.5, 1.0, 2.0], "conventions": "mergekit"})]
REFUSING = ["slerp", "model_stock"]


def test_every_method_is_covered():
    assert {m for m, _ in KEEPING} | set(REFUSING) == set(METHODS)


def poisoned(seed, size, n_inputs, with_base):
    """Inputs (and a base) near one another, with NaN, +Inf and -Inf at random positions."""
    rng = np.random.default_rng(seed)
    base = rng.standard_normal(size)
    xs = [base + 0.1 * rng.standard_normal(size) for _ in range(n_inputs)]
    arrays = xs + ([base] if with_base else [])
    bad = np.zeros(size, bool)
    for value in (np.nan, np.inf, -np.inf):
        for _ in range(int(rng.integers(1, 4))):
            a = arrays[int(rng.integers(len(arrays)))]
            at = rng.choice(size, size=int(rng.integers(1, 1 + max(1, size // 50))), replace=False)
            a[at] = value
            bad[at] = True
    return xs, (base if with_base else None), bad


def cleaned(xs, base):
    """The inputs with each non-finite element replaced so its delta is 0 (by the base there, or
    by 0 where the base itself is non-finite or there is no base): what the rest must be."""
    b = None if base is None else np.where(np.isfinite(base), base, 0.0)
    out = []
    for x in xs:
        x = x.copy()
        if base is None:
            x[~np.isfinite(x)] = 0.0
        else:
            x[~np.isfinite(x)] = b[~np.isfinite(x)]
            x[~np.isfinite(base)] = 0.0
        out.append(x)
    return out, b


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("method,kw", KEEPING, ids=[f"{m}-{i}" for i, (m, _) in enumerate(KEEPING)])
def test_nonfinite_inputs_stay_nonfinite_and_change_no_other_element(method, kw, seed):
    size = [7, 100, 1000, 4099][seed]
    m = METHODS[method]
    xs, base, bad = poisoned(seed, size, 3, m.needs_base)
    kw = dict(kw)
    if method == "ema":
        kw.pop("weights", None)
    for chunk in (None, 3, 64):
        got = combine_arrays(method, xs, base, chunk=chunk, **kw)
        assert not np.isfinite(got[bad]).any(), (method, chunk, got[bad])
        cx, cb = cleaned(xs, base)
        want = combine_arrays(method, cx, cb, chunk=chunk, **kw)
        np.testing.assert_array_equal(got[~bad], want[~bad])


@pytest.mark.parametrize("method", ["ties", "dare"])
def test_a_lone_nan_stays_nan_through_the_sign_election(method):
    base = np.zeros(6)
    xs = [np.array([1.0, -2, np.nan, 4, 5, -6]), np.array([1.0, 2, 3, -4, 5, 6])]
    kw = {"density": 1.0, "consensus": "ties"} if method == "dare" else {"density": 0.5}
    got = combine_arrays(method, xs, base, **kw)
    assert np.isnan(got[2]) and np.isfinite(np.delete(got, 2)).all()
    xs[1][4] = np.inf
    got = combine_arrays(method, xs, base, **kw)
    assert got[4] == np.inf


def test_ties_ranks_nonfinite_elements_out_of_the_cut_in_a_radix_selection():
    """A tensor larger than the in-memory ranking limit (the radix path) with NaN and Inf."""
    size = (1 << 20) + 4097
    xs, base, bad = poisoned(9, size, 2, True)
    got = combine_arrays("ties", xs, base, density=0.2, chunk=1 << 18)
    assert not np.isfinite(got[bad]).any()
    cx, cb = cleaned(xs, base)
    want = combine_arrays("ties", cx, cb, density=0.2, chunk=1 << 18)
    np.testing.assert_array_equal(got[~bad], want[~bad])


@pytest.mark.parametrize("method", REFUSING)
@pytest.mark.parametrize("value", [np.nan, np.inf, -np.inf])
@pytest.mark.parametrize("where", [0, 1, "base"])
def test_angle_methods_refuse_a_nonfinite_tensor_by_name(method, value, where):
    rng = np.random.default_rng(abs(hash((method, str(value), str(where)))) % 1000)
    base = rng.standard_normal(50)
    xs = [base + rng.standard_normal(50) for _ in range(2)]
    if where == "base":
        if method == "slerp":
            return  # (slerp has no base here: its first input is the start)
        base[int(rng.integers(50))] = value
        who = "the base"
    else:
        xs[where][int(rng.integers(50))] = value
        who = f"input {where + 1}"
    name = f"layer_{int(rng.integers(100))}/kernel"
    for conventions in ("ckptmerge", "mergekit"):
        with pytest.raises(CombineError) as e:
            combine_arrays(method, xs, base if method == "model_stock" else None, name=name, conventions=conventions)
    msg = str(e.value)
    assert f"Cannot {method} tensor {name!r}: {who} holds 1 NaN or Inf value" in msg, msg
    assert f"exclude={name!r}" in msg


def test_angle_methods_refuse_values_whose_squares_overflow():
    xs = [np.full(4, 1e200), np.full(4, -1e200)]
    with pytest.raises(CombineError, match="too large for float64"):
        combine_arrays("slerp", xs)


@pytest.mark.parametrize("method", sorted(METHODS))
def test_real_files_keep_or_refuse_nonfinite_values(method, tmp_path):
    """Through TF bundles: the blocked path of local files and a merge to safetensors."""
    m = METHODS[method]
    rng = np.random.default_rng(len(method))
    size = 5000
    b = rng.standard_normal(size).astype(np.float32)
    xs = [(b + 0.1 * rng.standard_normal(size)).astype(np.float32) for _ in range(2)]
    xs[0][17], xs[1][4000], xs[1][4001] = np.nan, np.inf, -np.inf
    paths = [write(tmp_path / f"in{i}", {"w": x, "ok": np.ones(3, np.float32)}) for i, x in enumerate(xs)]
    base = write(tmp_path / "base", {"w": b, "ok": np.ones(3, np.float32)}) if m.needs_base else None
    src = cm.combine(paths, method, base=base)
    out = str(tmp_path / "out.safetensors")
    if method in REFUSING:
        with pytest.raises(CombineError, match="Cannot .* tensor 'w': input 1 holds 1 NaN or Inf value"):
            cm.merge(src, out)
        assert not (tmp_path / "out.safetensors").exists()  # nothing half-written
        return
    cm.merge(src, out)
    got = cm.load(out)["w"]
    assert np.isnan(got[17]) or not np.isfinite(got[17])
    assert not np.isfinite(got[4000:4002]).any()
    assert np.isfinite(np.delete(got, [17, 4000, 4001])).all()


def test_model_stock_filter_wise_refuses_a_nonfinite_tensor_by_name():
    rng = np.random.default_rng(3)
    base = rng.standard_normal((4, 6))
    xs = [base + rng.standard_normal((4, 6)) for _ in range(3)]
    xs[2][1, 3] = np.nan
    with pytest.raises(CombineError, match="Cannot model_stock tensor 'k': input 3 holds 1 NaN or Inf value"):
        combine_arrays("model_stock", xs, base, name="k", filter_wise=True)
