"""The merge methods' math (ckptmerge.combining.methods) against plain NumPy references of the
published formulas, whole and in chunks of every size (pure: no files, no TensorFlow)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from ckptmerge.core.errors import ArgumentError
from ckptmerge.combining.methods import (
    DOT_THRESHOLD,
    METHODS,
    TensorParams,
    combine_arrays,
    dare_uniform,
    ema_weights,
    kth_largest_abs,
    slerp_coefficients,
    tie_cut,
)

RNG = np.random.default_rng(7)
BASE = RNG.standard_normal(1000).astype(np.float32)
FTS = [(BASE + 0.1 * RNG.standard_normal(1000)).astype(np.float32) for _ in range(4)]
CHUNKS = [None, 1, 7, 128, 999]


def f32(x):
    return np.asarray(x, np.float64).astype(np.float32)


# -- references: the formulas as the papers write them, on stacked float64 arrays ---------------


def ref_ties(base, xs, weights, density, scale=1.0):
    b = np.asarray(base, np.float64)
    deltas = []
    for x in xs:
        d = np.asarray(x, np.float64) - b
        k = max(1, int(density * d.size))
        keep = np.zeros(d.size, bool)
        keep[np.argsort(-np.abs(d), kind="stable")[:k]] = True  # top-k magnitudes
        deltas.append(np.where(keep, d, 0.0))
    w = np.asarray(weights, np.float64)[:, None]
    t = np.stack(deltas) * w
    sign = np.where(t.sum(axis=0) >= 0, 1.0, -1.0)      # elected by summed magnitude
    agree = np.sign(t) == sign                          # disjoint: only the agreeing ones
    num = (t * agree).sum(axis=0)
    den = (w * agree).sum(axis=0)
    den[den == 0] = 1
    return b + scale * num / den


def ref_model_stock(base, xs):
    b = np.asarray(base, np.float64)
    ds = [np.asarray(x, np.float64) - b for x in xs]
    k = len(ds)
    cos = np.mean([np.dot(a, c) / (np.linalg.norm(a) * np.linalg.norm(c)) for a, c in itertools.combinations(ds, 2)])
    t = k * cos / (1 + (k - 1) * cos)
    return t * np.mean(np.stack(xs).astype(np.float64), axis=0) + (1 - t) * b


def ref_slerp(a, b, t):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    cos = np.dot(a, b) / (np.linalg.norm(a) * np.linalg.norm(b))
    if abs(cos) > DOT_THRESHOLD:
        return (1 - t) * a + t * b
    th = np.arccos(cos)
    return (np.sin((1 - t) * th) * a + np.sin(t * th) * b) / np.sin(th)


# -- the methods ----------------------------------------------------------------------------------


@pytest.mark.parametrize("chunk", CHUNKS)
def test_uniform_mean_equals_the_float64_mean_rounded_to_float32(chunk):
    got = f32(combine_arrays("mean", FTS, chunk=chunk))
    np.testing.assert_array_equal(got, f32(np.mean(np.stack(FTS).astype(np.float64), axis=0)))


@pytest.mark.parametrize("chunk", CHUNKS)
def test_weighted_mean_normalises_the_weights(chunk):
    w = [1.0, 2.0, 0.5, 4.0]
    ref = sum(wi * x.astype(np.float64) for wi, x in zip(w, FTS)) / sum(w)
    np.testing.assert_array_equal(f32(combine_arrays("mean", FTS, weights=w, chunk=chunk)), f32(ref))


def test_ema_weights_are_the_running_average_unrolled():
    xs = [np.float64(v) for v in (1.0, 5.0, -2.0, 3.0)]
    ema = xs[0]
    for x in xs[1:]:
        ema = 0.9 * ema + 0.1 * x
    w = ema_weights(4, 0.9)
    assert abs(sum(w) - 1) < 1e-12
    assert abs(sum(wi * x for wi, x in zip(w, xs)) - ema) < 1e-12


@pytest.mark.parametrize("chunk", CHUNKS)
def test_task_arithmetic_is_base_plus_scaled_task_vectors(chunk):
    lam = [0.3, 0.7, 1.0, -0.2]
    ref = BASE.astype(np.float64) + 0.8 * sum(l * (x.astype(np.float64) - BASE) for l, x in zip(lam, FTS))
    got = combine_arrays("task_arithmetic", FTS, BASE, weights=lam, scale=0.8, chunk=chunk)
    np.testing.assert_array_equal(f32(got), f32(ref))


@pytest.mark.parametrize("chunk", CHUNKS)
@pytest.mark.parametrize("density", [0.1, 0.5, 1.0])
def test_ties_trims_elects_signs_and_takes_the_disjoint_mean(chunk, density):
    w = [1.0, 0.5, 2.0, 1.0]
    ref = ref_ties(BASE, FTS, w, density, scale=0.9)
    got = combine_arrays("ties", FTS, BASE, weights=w, density=density, scale=0.9, chunk=chunk)
    np.testing.assert_array_equal(f32(got), f32(ref))


def test_ties_keeps_exactly_k_the_first_of_equal_magnitudes():
    base = np.zeros(10)
    x = np.array([1.0, -2, 2, 2, -2, 3, 0.5, 2, 1, -1])  # k = 4: 3, then the first three 2s
    got = combine_arrays("ties", [x], base, density=0.4, chunk=3)
    np.testing.assert_array_equal(got, [0, -2, 2, 2, 0, 3, 0, 0, 0, 0])
    np.testing.assert_array_equal(got, ref_ties(base, [x], [1.0], 0.4))


def test_ties_by_radix_selection_on_large_tensors_equals_the_reference():
    """Tensors larger than what is ranked in memory take the chunked radix selection."""
    import ckptmerge.combining.methods as methods

    base = RNG.standard_normal(50_000)
    xs = [base + RNG.standard_normal(50_000) * s for s in (0.01, 1.0, 100.0)]
    xs[0][::7] = base[::7] + 0.5  # many equal magnitudes
    old = methods.kth_largest_abs.__kwdefaults__["whole_limit"]
    methods.kth_largest_abs.__kwdefaults__["whole_limit"] = 1000
    try:
        got = combine_arrays("ties", xs, base, density=0.2, chunk=4096)
    finally:
        methods.kth_largest_abs.__kwdefaults__["whole_limit"] = old
    np.testing.assert_array_equal(got, ref_ties(base, xs, [1, 1, 1], 0.2))


@pytest.mark.parametrize("k", [1, 2, 37, 5000, 9999, 10000])
def test_kth_largest_abs_is_exact_in_chunks(k):
    x = RNG.standard_normal(10_000) * np.exp(RNG.uniform(-20, 20, 10_000))
    x[::97] = 0.0
    x[5::101] = x[4::101][: len(x[5::101])]  # repeated magnitudes

    def passes():
        return ((x[s:s + 777], s) for s in range(0, x.size, 777))

    want = np.sort(np.abs(x))[::-1][k - 1]
    above = int(np.count_nonzero(np.abs(x) > want))
    assert kth_largest_abs(passes, x.size, k, lambda c, o: c, whole_limit=50) == (want, above)
    assert kth_largest_abs(passes, x.size, k, lambda c, o: c) == (want, above)


def test_tie_cut_is_just_past_the_needed_tie():
    x = np.array([1.0, -2.0, 2.0, 0.5, 2.0, -2.0])

    def passes():
        return ((x[s:s + 4], s) for s in range(0, x.size, 4))

    assert [tie_cut(passes, 2.0, need) for need in (0, 1, 2, 3, 4, 5)] == [0, 2, 3, 5, 6, 6]


def test_ties_sign_sums_are_masked_adds_and_keep_nan_in_both():
    """The consensus sums are plain adds of zeros elsewhere: the same numbers as adding only
    the positive (negative) values, -0.0 included; NaN goes into both sums (issue 30 item 13:
    a NaN input is kept, never hidden)."""
    t = np.array([np.nan, -0.0, 0.0, 1.5, -2.5, np.inf, -np.inf, 3.0])
    base = np.zeros(t.size)
    m = METHODS["ties"]
    p = TensorParams("x", (0.5,), {"density": 1.0, "scale": 1.0, "normalize": True})
    acc = m.start(p, t.size)
    m.add(acc, p, None, 0, t * 2, base, 0)  # (weight 0.5: t again)
    want = [np.zeros(t.size) for _ in range(4)]
    np.add(want[0], t, out=want[0], where=t > 0)
    np.add(want[1], t, out=want[1], where=t < 0)
    np.add(want[2], 0.5, out=want[2], where=t > 0)
    np.add(want[3], 0.5, out=want[3], where=t < 0)
    want[0][0] = want[1][0] = np.nan
    for a, b in zip(acc, want):
        assert a.tobytes() == b.tobytes()


@pytest.mark.parametrize("chunk", CHUNKS)
def test_dare_is_reproducible_for_a_seed_whatever_the_chunks(chunk):
    a = combine_arrays("dare", FTS, BASE, density=0.3, seed=11)
    np.testing.assert_array_equal(combine_arrays("dare", FTS, BASE, density=0.3, seed=11, chunk=chunk), a)
    assert not np.array_equal(combine_arrays("dare", FTS, BASE, density=0.3, seed=12), a)


def test_dare_drops_with_one_minus_density_and_rescales_by_its_inverse():
    base = np.zeros(200_000)
    x = np.full(200_000, 2.0)
    out = combine_arrays("dare", [x], base, density=0.25, seed=3)
    kept = out != 0
    assert abs(kept.mean() - 0.25) < 0.01                       # p(drop) = 1 - density
    np.testing.assert_array_equal(out[kept], np.full(kept.sum(), 8.0))  # rescaled by 1/density


def test_dare_expectation_is_the_task_arithmetic_result():
    """Over seeds, the mean of DARE's result tends to task arithmetic's (the rescale is unbiased)."""
    xs, base = [f.astype(np.float64) for f in FTS[:2]], BASE.astype(np.float64)
    runs = np.mean([combine_arrays("dare", xs, base, density=0.5, seed=s) for s in range(400)], axis=0)
    want = combine_arrays("task_arithmetic", xs, base)
    sd = np.sqrt(sum((x - base) ** 2 for x in xs) / 400)  # per element: var = d^2 (1-p)/p per input
    assert np.all(np.abs(runs - want) <= 5 * sd + 1e-12)
    assert np.abs(runs - want).mean() < 0.1 * np.abs(want - base).mean()


def test_dare_draws_are_blockwise_and_offset_consistent():
    p = TensorParams("layer/w", (1.0,), {"seed": 5})
    whole = dare_uniform(p, 0, 0, 200_000)
    np.testing.assert_array_equal(dare_uniform(p, 0, 65_530, 100), whole[65_530:65_630])
    assert not np.array_equal(dare_uniform(TensorParams("layer/b", (1.0,), {"seed": 5}), 0, 0, 100), whole[:100])


@pytest.mark.parametrize("chunk", CHUNKS)
@pytest.mark.parametrize("t", [0.0, 0.3, 1.0])
def test_slerp_follows_the_great_circle(chunk, t):
    a, b = FTS[0], RNG.standard_normal(1000).astype(np.float32)
    np.testing.assert_allclose(combine_arrays("slerp", [a, b], t=t, chunk=chunk), ref_slerp(a, b, t), rtol=1e-12,
                               atol=1e-12)


def test_slerp_falls_back_to_linear_for_near_parallel_tensors():
    a = RNG.standard_normal(100)
    b = a * 3 + 1e-9
    assert slerp_coefficients(0.25, float(a @ b), float(a @ a), float(b @ b)) == [0.75, 0.25]
    np.testing.assert_allclose(combine_arrays("slerp", [a, b], t=0.25), 0.75 * a + 0.25 * b)
    assert slerp_coefficients(0.5, 0.0, 0.0, 1.0) == [0.5, 0.5]  # a zero tensor: linear too


@pytest.mark.parametrize("chunk", CHUNKS)
def test_model_stock_ratio_comes_from_the_angle_between_fine_tunes(chunk):
    got = combine_arrays("model_stock", FTS[:3], BASE, chunk=chunk)
    np.testing.assert_allclose(got, ref_model_stock(BASE, FTS[:3]), rtol=1e-10, atol=1e-12)


def test_model_stock_keeps_the_base_where_the_ratio_is_singular():
    base = np.zeros(4)
    a = np.array([1.0, 0, 0, 0])
    out = combine_arrays("model_stock", [a, -a], base)  # cos = -1: 1 + (k-1) cos = 0
    np.testing.assert_array_equal(out, base)


def test_parameter_checks_name_the_range():
    assert METHODS["ties"].check({"density": 0.0}) == ["density must be in (0, 1], received 0.0"]
    assert METHODS["slerp"].check({"t": 2}) == ["t must be in [0, 1], received 2"]
    assert METHODS["ema"].check({"decay": 1.0}) == ["decay must be in [0, 1), received 1.0"]
    with pytest.raises(ArgumentError, match="sum to 0"):
        combine_arrays("mean", FTS[:2], weights=[1.0, -1.0])


def test_float32_accumulation_is_what_it_says():
    xs = [np.full(3, v, np.float16) for v in (1.0, 2.0, 4.0)]
    assert combine_arrays("mean", xs, acc="float32").dtype == np.float32
    assert combine_arrays("mean", xs).dtype == np.float64
