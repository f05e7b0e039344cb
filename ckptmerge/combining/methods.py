"""Checkpoint arithmetic, one tensor (or one chunk of one) at a time: the merge methods' math.

Pure NumPy, no file access: :mod:`ckptmerge.combining.combine` feeds these units flat chunks of
one tensor, input by input, so memory holds a few chunks whatever the number of inputs. Each
method is one small class (mergekit's ``merge_methods`` are the model) with three steps:

* :meth:`Method.prepare`: whole-tensor statistics, from passes over the chunks (TIES's
  magnitude threshold per input, SLERP's angle, Model Stock's mean cosine); most methods need
  none.
* :meth:`Method.start` / :meth:`Method.add`: accumulate one chunk of each input in turn, in the
  accumulation dtype (float64 unless asked otherwise).
* :meth:`Method.finish`: the chunk's result (still in the accumulation dtype: the caller casts).

The formulas (``x_i`` the inputs, ``b`` the base, ``w_i`` the weights, ``d_i = x_i - b``):

* ``mean``: ``sum(w_i x_i) / sum(w_i)``; ``ema`` is a mean whose weights come from ``decay``
  over the inputs in step order (``w_1 = decay**(n-1)``, ``w_i = (1-decay) decay**(n-i)``).
* ``task_arithmetic``: ``b + scale * sum(w_i d_i)``.
* ``ties`` (Yadav et al. 2023): keep the ``density`` fraction of largest ``|d_i|`` of each input,
  elect each element's sign as the sign of ``sum(w_i t_i)`` (positive on a tie), and take the
  weighted mean of the kept ``w_i t_i`` that agree with it: ``b + scale * mean``.
* ``dare`` (Yu et al. 2023): drop each element of ``d_i`` with probability ``1 - density``,
  rescale the rest by ``1/density``, then add as task arithmetic (or elect signs as TIES with
  ``consensus="ties"``). The draws come from a Philox generator seeded by ``(seed, tensor
  name, input)``, in element order, so a seed gives the same result whatever the chunk size.
* ``slerp``: spherical interpolation ``t`` of the way from the first input to the second, over
  the whole tensor as one vector; linear when the two are near-parallel (``|cos| > 0.9995``)
  or one is zero.
* ``model_stock`` (Jang et al. 2024): ``t = k cos / (1 + (k-1) cos)`` from the mean pairwise
  cosine of the fine-tunes' offsets ``d_i`` (k of them), then ``t * mean(x_i) + (1-t) b``
  (``t = 0`` where the denominator vanishes).

Conventions (:data:`CONVENTIONS`): ``"ckptmerge"`` (the formulas above, the defaults in each
method's ``defaults``) or ``"mergekit"`` (mergekit 0.1.5's: each method's ``mergekit_defaults``,
``density`` 1.0, DARE's kept values rescaled to the L1 norm of the whole offset instead of by
``1/density`` (``rescale``), ``normalize`` for task arithmetic, SLERP of an all-zero tensor
along the quarter circle as mergekit computes it). A parameter may differ per input
(``TensorParams.of``): mergekit gives each model its own ``density``.

Example:
    >>> import numpy as np
    >>> combine_arrays("mean", [np.ones(3, np.float32), np.zeros(3, np.float32)]).tolist()
    [0.5, 0.5, 0.5]
"""

from __future__ import annotations

import math
import zlib
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Iterable, Iterator, List, Mapping, Optional, Sequence, Tuple

import numpy as np

from ..core.errors import ArgumentError, CombineError
from .selection import kth_largest_abs, tie_cut

__all__ = ["Method", "METHODS", "TensorParams", "combine_arrays", "ema_weights", "kth_largest_abs", "tie_cut",
           "DOT_THRESHOLD", "CONVENTIONS", "RESCALE_EPS", "quiet",
           "refuse_nonfinite"]

#: The conventions a combination follows: ckptmerge's own, or mergekit 0.1.5's (see the module).
CONVENTIONS = ("ckptmerge", "mergekit")
#: mergekit's L1 rescale leaves the kept values as they are when either norm is below this.
RESCALE_EPS = 1e-7

#: SLERP interpolates linearly when the cosine between the two tensors exceeds this (as mergekit).
DOT_THRESHOLD = 0.9995

Chunks = Callable[[], Iterable[np.ndarray]]  # a fresh pass over one tensor's flat chunks


@dataclass(frozen=True)
class TensorParams:
    """What one tensor's combination needs: its name, the weights of the inputs that hold it
    (in input order), the method's parameters resolved for this tensor, and the accumulation dtype.
    """

    name: str
    weights: Tuple[float, ...]
    params: Mapping[str, Any] = field(default_factory=dict)
    acc: str = "float64"
    inputs: Tuple[int, ...] = ()  # the inputs' positions among all inputs (DARE's seeds)
    conventions: str = "ckptmerge"
    shape: Tuple[int, ...] = ()  # the tensor's shape (Model Stock's filter_wise rows)

    def get(self, key: str) -> Any:
        return self.params[key]

    def of(self, key: str, j: int) -> Any:
        """Parameter ``key`` for the ``j``-th input holding the tensor: one value for all inputs,
        or a tuple with one value per input.

        Example:
            >>> TensorParams("w", (1.0, 1.0), {"density": (0.5, 0.3)}).of("density", 1)
            0.3
        """
        v = self.params[key]
        return v[j] if isinstance(v, tuple) else v


def ema_weights(n: int, decay: float) -> List[float]:
    """The weights an exponential moving average over ``n`` values in order gives each.

    ``ema = x_1``, then ``ema = decay * ema + (1 - decay) * x_i``, which is ``sum(w_i x_i)``.

    Example:
        >>> ema_weights(3, 0.5)
        [0.25, 0.25, 0.5]
    """
    if n <= 0:
        return []
    return [decay ** (n - 1)] + [(1 - decay) * decay ** (n - i) for i in range(2, n + 1)]


class Method:
    """One merge method: parameters, the inputs it takes, and its three steps (see the module).

    Attributes:
        name: the method's name (``"mean"``, ``"ties"``, ...).
        needs_base: whether a base checkpoint is required.
        min_inputs, max_inputs: how many inputs (besides the base) it combines.
        defaults: its parameters and their defaults.
        state: float accumulators it keeps per element (to size chunks).
    """

    name = ""
    elementwise = False  # add() of one element needs no other (so halves of a chunk may run at once)
    prepare_reads = True  # prepare() passes over the values (False: it reads nothing, e.g. a mean's weights)
    needs_base = False
    min_inputs = 1
    max_inputs: Optional[int] = None
    defaults: Mapping[str, Any] = {}
    #: the parameters and their defaults under mergekit's conventions (``None``: as ``defaults``)
    mergekit_defaults: Optional[Mapping[str, Any]] = None
    state = 1

    def defaults_for(self, conventions: str) -> Mapping[str, Any]:
        """The parameters and their defaults under ``conventions`` (one of :data:`CONVENTIONS`)."""
        if conventions == "mergekit" and self.mergekit_defaults is not None:
            return self.mergekit_defaults
        return self.defaults

    def check(self, params: Mapping[str, Any]) -> List[str]:
        """Problems with one tensor's parameter values (empty when they are fine)."""
        return []

    def prepare(self, p: TensorParams, size: int, inputs: Sequence[Chunks], base: Optional[Chunks]) -> Any:
        """Whole-tensor statistics from passes over the chunks; ``None`` when none are needed."""
        return None

    def start(self, p: TensorParams, n: int) -> Any:
        return np.zeros(n, p.acc)

    def add(self, acc: Any, p: TensorParams, stats: Any, j: int, x: np.ndarray, base: Optional[np.ndarray],
            offset: int) -> None:
        raise NotImplementedError

    def finish(self, acc: Any, p: TensorParams, stats: Any, base: Optional[np.ndarray]) -> np.ndarray:
        return acc

    def finish_into(self, acc: Any, p: TensorParams, stats: Any, base: Optional[np.ndarray], out: np.ndarray) -> None:
        """:meth:`finish`, cast into ``out`` (float16, float32 or float64: NumPy's rounding)."""
        np.copyto(out, self.finish(acc, p, stats, base), casting="unsafe")

    def describe(self, p: TensorParams) -> str:
        return ", ".join(f"{k}={v}" for k, v in sorted(p.params.items()))


#: Scaled adds go through temporaries of at most this many elements (their memory stays small).
_BLOCK = 1 << 16


def _add_scaled(acc: np.ndarray, x: np.ndarray, w: float, first: bool = False) -> None:
    """``acc += w * x`` in the accumulator's dtype, with no temporary for ``w == 1`` (and small
    ones otherwise); ``first``: ``acc = w * x`` (the accumulator was not initialised)."""
    if first:
        if w == 1.0:
            np.copyto(acc, x, casting="unsafe")
        else:
            np.multiply(x, w, out=acc, dtype=acc.dtype, casting="unsafe")
    elif w == 1.0:
        np.add(acc, x, out=acc, casting="unsafe")
    else:
        for s in range(0, acc.size, _BLOCK):
            part = acc[s:s + _BLOCK]
            np.add(part, np.multiply(x[s:s + _BLOCK], w, dtype=acc.dtype), out=part)


class Linear(Method):
    """A weighted sum ``sum(c_i x_i) + c_b b`` whose coefficients :meth:`coefficients` gives."""

    elementwise = True
    prepare_reads = False

    def coefficients(self, p: TensorParams, stats: Any) -> Tuple[List[float], float]:
        raise NotImplementedError

    def start(self, p: TensorParams, n: int) -> Any:
        return np.empty(n, p.acc)  # (the first input initialises it)

    def add(self, acc: Any, p: TensorParams, stats: Any, j: int, x: np.ndarray, base: Optional[np.ndarray],
            offset: int) -> None:
        _add_scaled(acc, x, stats[0][j], first=j == 0)

    def finish(self, acc: Any, p: TensorParams, stats: Any, base: Optional[np.ndarray]) -> np.ndarray:
        if stats[1] and base is not None:
            _add_scaled(acc, base, stats[1])
        return acc

    def prepare(self, p: TensorParams, size: int, inputs: Sequence[Chunks], base: Optional[Chunks]) -> Any:
        return self.coefficients(p, None)


class Mean(Linear):
    """``sum(w_i x_i) / sum(w_i)``: a uniform or weighted average (a model soup); with
    ``normalize=False``, the weighted sum ``sum(w_i x_i)`` as it is (mergekit's linear without
    normalising)."""

    name = "mean"
    defaults = {"normalize": True}

    @staticmethod
    def _uniform(p: TensorParams) -> bool:  # a sum, then one division by the count
        return len(set(p.weights)) == 1 and p.params.get("normalize", True)

    def coefficients(self, p: TensorParams, stats: Any) -> Tuple[List[float], float]:
        if not p.params.get("normalize", True):
            return list(p.weights), 0.0
        total = math.fsum(p.weights)
        if total == 0:
            raise ArgumentError(f"the weights of tensor {p.name!r} sum to 0; a weighted mean needs a nonzero sum.")
        if self._uniform(p):
            return [1.0] * len(p.weights), 0.0
        return [w / total for w in p.weights], 0.0

    def finish(self, acc: Any, p: TensorParams, stats: Any, base: Optional[np.ndarray]) -> np.ndarray:
        if self._uniform(p):
            acc /= len(p.weights)
        return acc

    def finish_into(self, acc: Any, p: TensorParams, stats: Any, base: Optional[np.ndarray], out: np.ndarray) -> None:
        if self._uniform(p):  # the float64 quotient, rounded once into out (one pass, not two)
            np.divide(acc, len(p.weights), out=out, casting="unsafe")
        else:
            np.copyto(out, acc, casting="unsafe")


class Ema(Mean):
    """An exponential moving average over the inputs in step order (weights from ``decay``)."""

    name = "ema"
    defaults = {"decay": 0.999}

    def check(self, params: Mapping[str, Any]) -> List[str]:
        d = params["decay"]
        return [] if 0 <= d < 1 else [f"decay must be in [0, 1), received {d!r}"]


class TaskArithmetic(Linear):
    """``b + scale * sum(w_i (x_i - b))``."""

    name = "task_arithmetic"
    needs_base = True
    defaults = {"scale": 1.0}
    mergekit_defaults = {"scale": 1.0, "normalize": False, "int8_mask": False}

    def coefficients(self, p: TensorParams, stats: Any) -> Tuple[List[float], float]:
        s = p.get("scale")
        total = math.fsum(p.weights)
        if p.params.get("normalize"):  # mergekit's: divided by the weights' sum (unless it is ~0)
            s = s / total if abs(total) >= 1e-8 else s
        return [s * w for w in p.weights], 1.0 - s * total

    def add(self, acc: Any, p: TensorParams, stats: Any, j: int, x: np.ndarray, base: Optional[np.ndarray],
            offset: int) -> None:
        if j == 0:
            np.subtract(x, base, out=acc, dtype=acc.dtype)  # deltas, as the formula: exact for x == b
            acc *= stats[0][j]
            return
        d = np.subtract(x, base, dtype=acc.dtype)
        d *= stats[0][j]
        acc += d

    def finish(self, acc: Any, p: TensorParams, stats: Any, base: Optional[np.ndarray]) -> np.ndarray:
        np.add(acc, base, out=acc, casting="unsafe")
        return acc


class TaskVectors(Method):
    """The task-vector family: sparsify each ``d_i`` (``magnitude`` or ``random``), optionally
    elect signs (``consensus``), sum with weights, optionally divide by the agreeing weights.

    The kept values of a sparsified ``d_i`` are rescaled (``rescale_mode``): by ``1/density``
    (ckptmerge's DARE), to the L1 norm of the whole ``d_i`` (mergekit's ``rescale: true``:
    ``sum|d_i| / sum|kept|``, left as they are when either is below :data:`RESCALE_EPS`), or not."""

    needs_base = True
    sparsify = ""           # "magnitude" (TIES) or "random" (DARE)
    normalize_default = True

    def check(self, params: Mapping[str, Any]) -> List[str]:
        d = params["density"]
        out = []
        for v in (d if isinstance(d, tuple) else (d,)):
            if not (isinstance(v, (int, float)) and not isinstance(v, bool) and 0 < v <= 1):
                out.append(f"density must be in (0, 1], received {v!r}")
        if params.get("consensus", "ties") not in ("ties", "none"):
            out.append(f"consensus must be 'ties' or 'none', received {params['consensus']!r}")
        return out

    @property
    def state(self) -> int:  # type: ignore[override]
        return 5  # P, Q, their weights, and one scratch array

    def consensus(self, p: TensorParams) -> bool:
        return True

    def rescale_mode(self, p: TensorParams) -> str:
        """``"inverse"`` (by ``1/density``), ``"l1"`` (mergekit's) or ``"none"``."""
        if p.conventions == "mergekit":
            return "l1" if p.params.get("rescale") else "none"
        return "inverse" if self.sparsify == "random" else "none"

    def prepare(self, p: TensorParams, size: int, inputs: Sequence[Chunks], base: Optional[Chunks]) -> Any:
        if all(p.of("density", j) >= 1 for j in range(len(inputs))):
            return None
        l1 = self.rescale_mode(p) == "l1"
        if self.sparsify != "magnitude" and not l1:
            return None
        assert base is not None
        stats: List[Any] = []
        for j, chunks in enumerate(inputs):
            density = p.of("density", j)
            if density >= 1:
                stats.append(None)
                continue

            def passes(chunks: Chunks = chunks) -> Iterator[Tuple[np.ndarray, int]]:
                off = 0
                for x, b in zip(chunks(), base()):
                    yield _finite_or_zero(np.subtract(x, b, dtype=np.float64)), off
                    off += x.size
            thr, cut = math.inf, 0
            if self.sparsify == "magnitude":
                k = max(1, int(density * size)) if size else 0
                thr, above, equal = kth_largest_abs(passes, size, k, lambda c, o: c, equal=True)
                # Of the magnitudes equal to thr, the first k - above in element order are kept: those
                # before index `cut` (found by one more pass only when some of them are left out), so
                # any element's fate depends on nothing but its value and index (any chunk, any thread).
                need = k - above
                cut = size if need >= equal else tie_cut(passes, thr, need)
            factor = 1.0
            if l1:  # one more pass: the L1 norms of d_i and of its kept values
                before = after = 0.0
                for d, off in passes():
                    mag = np.abs(d)
                    before += float(mag.sum())
                    after += float(mag[self.keep(p, (thr, cut, 1.0), j, d, off)].sum())
                if before >= RESCALE_EPS and after >= RESCALE_EPS:
                    factor = before / after
            stats.append((thr, cut, factor))
        return stats

    def keep(self, p: TensorParams, stat: Any, j: int, d: np.ndarray, offset: int) -> np.ndarray:
        """Which elements of ``d`` (elements ``offset ..`` of input ``j``'s offset) are kept."""
        if self.sparsify == "magnitude":
            # Exactly the k largest magnitudes: of those equal to the k-th, the ones before the
            # index `cut` (the first ones in element order).
            # Written as what is dropped, by comparisons that are False for NaN: a non-finite
            # element (ranked as 0, see prepare) is never trimmed, so it reaches the output.
            thr, cut = stat[0], stat[1]
            mag = np.abs(d)
            n = d.size
            if cut >= offset + n:
                drop = mag < thr
            else:
                drop = mag <= thr
                if cut > offset:
                    drop[:cut - offset] = mag[:cut - offset] < thr
            return ~drop
        return dare_uniform(p, j, offset, d.size) < p.of("density", j)

    def sparse(self, p: TensorParams, stats: Any, j: int, x: np.ndarray, base: np.ndarray, offset: int,
               dt: Any) -> np.ndarray:
        d = np.subtract(x, base, dtype=dt)
        density = p.of("density", j)
        if density >= 1:
            return d
        mode = self.rescale_mode(p)
        stat = stats[j] if stats is not None else None
        keep = self.keep(p, stat, j, d, offset)
        if self.sparsify == "magnitude":
            d = np.where(keep, d, d.dtype.type(0))  # (a select: far faster than d[~keep] = 0)
        else:
            d *= keep
        if mode == "inverse":
            d /= density
        elif mode == "l1" and stat[2] != 1.0:
            d *= stat[2]
        return d

    def start(self, p: TensorParams, n: int) -> Any:
        if not self.consensus(p):
            return np.zeros(n, p.acc)
        return [np.zeros(n, p.acc) for _ in range(4)]  # P, Q, Pw, Qw

    def add(self, acc: Any, p: TensorParams, stats: Any, j: int, x: np.ndarray, base: Optional[np.ndarray],
            offset: int) -> None:
        assert base is not None
        w = p.weights[j]
        t = self.sparse(p, stats, j, x, base, offset, p.acc)
        if w != 1.0:
            t *= w
        if not isinstance(acc, list):
            np.add(acc, t, out=acc, casting="unsafe")
            return
        # The sums of the positive and of the negative values and of their weights, as plain
        # adds (a masked add runs element by element): the other elements add a zero, which
        # changes no sum (P, Q, Pw and Qw start at +0 and never become -0). NaN goes into
        # both P and Q (maximum and minimum propagate it), so the elected mean is NaN: a NaN
        # input is kept, never hidden; an infinity is the largest value of its sign.
        P, Q, Pw, Qw = acc
        zero, wt = t.dtype.type(0), t.dtype.type(w)
        np.add(P, np.maximum(t, zero), out=P)
        np.add(Q, np.minimum(t, zero), out=Q)
        np.add(Pw, np.where(t > 0, wt, zero), out=Pw)
        np.add(Qw, np.where(t < 0, wt, zero), out=Qw)

    def finish(self, acc: Any, p: TensorParams, stats: Any, base: Optional[np.ndarray]) -> np.ndarray:
        normalize = p.params.get("normalize", self.normalize_default)
        if isinstance(acc, list):
            P, Q, Pw, Qw = acc
            up = (P + Q) >= 0  # the elected sign: positive on a tie, as mergekit's "sum" consensus
            mixed = np.where(up, P, Q)
            if normalize:
                div = np.where(up, Pw, Qw)
                div[div == 0] = 1
                mixed /= div
        else:
            mixed = acc
            if normalize:
                total = math.fsum(p.weights)
                mixed /= total if abs(total) >= 1e-8 else 1.0
        scale = p.get("scale")
        if scale != 1:
            mixed *= scale
        np.add(mixed, base, out=mixed, casting="unsafe")
        return mixed


def quiet() -> Any:
    """NumPy's "invalid value" and "overflow" warnings off (a context): NaN and Inf inputs are
    a documented case the methods keep or refuse by name, and the library never prints. Entered
    once per chunk or piece of work, on the thread doing it (NumPy's error state is per thread)."""
    return np.errstate(invalid="ignore", over="ignore")


def _finite_or_zero(d: np.ndarray) -> np.ndarray:
    """``d`` with its NaN and infinite elements set to 0 (in place; TIES ranks them so)."""
    bad = ~np.isfinite(d)
    if bad.any():
        d[bad] = 0.0
    return d


def refuse_nonfinite(p: TensorParams, method: str, what: str, inputs: Sequence[Chunks],
                     base: Optional[Chunks]) -> None:
    """Raise :class:`~ckptmerge.CombineError` naming tensor ``p.name`` and the inputs (in
    combining order) holding NaN or Inf: ``what`` (an angle) is a whole-tensor statistic they
    leave undefined, so no element could be combined right.

    Example:
        >>> x = np.array([1.0, np.nan])
        >>> refuse_nonfinite(TensorParams("w", (1.0, 1.0)), "slerp", "the angle", [lambda: [x], lambda: [x]], None)
        Traceback (most recent call last):
        ckptmerge.core.errors.CombineError: Cannot slerp tensor 'w': input 1 holds 1 NaN or Inf value; input 2 holds 1 NaN or Inf value, so the angle is undefined. Replace those values, or leave the tensor out (exclude='w').
    """
    counts = [("the base" if j < 0 else f"input {j + 1}", sum(int(np.count_nonzero(~np.isfinite(c))) for c in chunks()))
              for j, chunks in ([(-1, base)] if base is not None else []) + list(enumerate(inputs))]
    bad = [f"{who} holds {n} NaN or Inf value{'s' if n != 1 else ''}" for who, n in counts if n]
    why = ("; ".join(bad) if bad else "its values are too large for float64 (their squares overflow)")
    raise CombineError(f"Cannot {method} tensor {p.name!r}: {why}, so {what} is undefined. Replace those values, "
                       f"or leave the tensor out (exclude={p.name!r}).")


#: DARE draws its random numbers in blocks of this many elements, each from its own generator,
#: so any chunk of a tensor sees the same draws whatever the chunk size.
DARE_BLOCK = 1 << 16


def dare_uniform(p: TensorParams, j: int, offset: int, n: int) -> np.ndarray:
    """Uniform [0, 1) draws for elements ``offset .. offset + n`` of input ``j`` of tensor
    ``p.name``: block ``k`` of :data:`DARE_BLOCK` elements comes from a Philox generator seeded by
    ``(seed, crc32(name), input, k)``.

    Example:
        >>> p = TensorParams("w", (1.0,), {"seed": 0})
        >>> bool((dare_uniform(p, 0, 0, 10)[4:] == dare_uniform(p, 0, 4, 6)).all())
        True
    """
    seed = int(p.get("seed")) & (2 ** 63 - 1)
    where = p.inputs[j] if p.inputs else j
    tag = zlib.crc32(p.name.encode("utf-8"))
    out = np.empty(n, np.float64)
    pos = offset
    while pos < offset + n:
        block = pos // DARE_BLOCK
        lo = block * DARE_BLOCK
        hi = min(lo + DARE_BLOCK, offset + n)
        draws = np.random.Generator(np.random.Philox(np.random.SeedSequence([seed, tag, where, block]))).random(hi - lo)
        out[pos - offset:hi - offset] = draws[pos - lo:]
        pos = hi
    return out


class Ties(TaskVectors):
    """TIES-merging: trim by magnitude (``density``), elect signs, disjoint mean."""

    elementwise = True  # (after prepare: each element is kept by its magnitude and index)

    name = "ties"
    sparsify = "magnitude"
    defaults = {"density": 0.5, "scale": 1.0, "normalize": True}
    mergekit_defaults = {"density": 1.0, "scale": 1.0, "normalize": True, "rescale": False, "int8_mask": False}


class Dare(TaskVectors):
    """DARE: random drop with ``p = 1 - density`` and rescale by ``1/density`` (seeded), then a
    task-arithmetic sum (``consensus="ties"``: TIES's sign election and disjoint sum)."""

    elementwise = True

    name = "dare"
    sparsify = "random"
    normalize_default = False
    defaults = {"density": 0.5, "scale": 1.0, "seed": 0, "consensus": "none", "normalize": False}
    mergekit_defaults = {"density": 1.0, "scale": 1.0, "seed": 0, "consensus": "none", "normalize": False,
                         "rescale": True, "int8_mask": False}

    def consensus(self, p: TensorParams) -> bool:
        return p.get("consensus") == "ties"


def _reduce(pairs: Iterable[Tuple[np.ndarray, ...]], fn: Callable[..., Sequence[float]], n: int) -> List[float]:
    totals = [0.0] * n
    for chunk in pairs:
        for i, v in enumerate(fn(*chunk)):
            totals[i] += v
    return totals


class Slerp(Linear):
    """Spherical interpolation ``t`` of the way from the first input to the second."""

    prepare_reads = True  # (the angle between the inputs)

    name = "slerp"
    min_inputs = max_inputs = 2
    defaults = {"t": 0.5}

    def check(self, params: Mapping[str, Any]) -> List[str]:
        t = params["t"]
        return [] if 0 <= t <= 1 else [f"t must be in [0, 1], received {t!r}"]

    def prepare(self, p: TensorParams, size: int, inputs: Sequence[Chunks], base: Optional[Chunks]) -> Any:
        def parts(a: np.ndarray, b: np.ndarray) -> Sequence[float]:
            a, b = a.astype(np.float64), b.astype(np.float64)
            return float(np.dot(a, b)), float(np.dot(a, a)), float(np.dot(b, b))

        dot, na, nb = _reduce(zip(inputs[0](), inputs[1]()), parts, 3)
        if not (math.isfinite(dot) and math.isfinite(na) and math.isfinite(nb)):
            refuse_nonfinite(p, "slerp", "the angle between the two tensors", inputs, None)
        return slerp_coefficients(p.get("t"), dot, na, nb, conventions=p.conventions), 0.0


#: mergekit's SLERP divides a tensor by its norm only when the norm exceeds this.
SLERP_EPS = 1e-8


def slerp_coefficients(t: float, dot: float, na: float, nb: float, *, conventions: str = "ckptmerge") -> List[float]:
    """``[c_a, c_b]`` with ``slerp(a, b) = c_a a + c_b b`` from ``a.b``, ``a.a`` and ``b.b``.

    A zero tensor (or, under mergekit's conventions, one whose norm is at most
    :data:`SLERP_EPS`) has no direction: ckptmerge interpolates linearly; mergekit leaves it
    unnormalised, so the cosine is ~0 and the result follows the quarter circle
    (``cos(t pi/2) a + sin(t pi/2) b``).

    Example:
        >>> [round(c, 6) for c in slerp_coefficients(0.5, 0.0, 1.0, 1.0)]  # a quarter circle
        [0.707107, 0.707107]
        >>> [round(c, 6) for c in slerp_coefficients(0.5, 0.0, 0.0, 1.0, conventions="mergekit")]
        [0.707107, 0.707107]
    """
    if conventions == "mergekit":
        sa, sb = math.sqrt(na), math.sqrt(nb)
        cos = dot / ((sa if sa > SLERP_EPS else 1.0) * (sb if sb > SLERP_EPS else 1.0))
        if abs(cos) > DOT_THRESHOLD:
            return [1 - t, t]
        theta = math.acos(cos)
        s = math.sin(theta)
        return [math.sin((1 - t) * theta) / s, math.sin(t * theta) / s]
    if na <= 0 or nb <= 0:
        return [1 - t, t]
    cos = max(-1.0, min(1.0, dot / math.sqrt(na * nb)))
    if abs(cos) > DOT_THRESHOLD:
        return [1 - t, t]
    theta = math.acos(cos)
    s = math.sin(theta)
    return [math.sin((1 - t) * theta) / s, math.sin(t * theta) / s]


class ModelStock(Linear):
    """Model Stock: the interpolation ratio from the angle between fine-tunes, toward the base."""

    prepare_reads = True  # (the inputs' mean cosine)

    name = "model_stock"
    needs_base = True
    min_inputs = 2
    defaults = {"filter_wise": False}

    def prepare(self, p: TensorParams, size: int, inputs: Sequence[Chunks], base: Optional[Chunks]) -> Any:
        assert base is not None
        if p.params.get("filter_wise") and len(p.shape) > 1 and size:
            return self._rows(p, size, inputs, base)
        k = len(inputs)
        if p.conventions == "mergekit":
            return self._mergekit_ratio(p, k, inputs, base)
        norms = []
        for chunks in inputs:  # pass 1: |d_i|, one input at a time
            total = 0.0
            for x, b in zip(chunks(), base()):
                d = np.subtract(x, b, dtype=np.float64)
                total += float(np.dot(d, d))
            norms.append(math.sqrt(total))
        if not all(map(math.isfinite, norms)):
            refuse_nonfinite(p, "model_stock", "the angle between the fine-tunes", inputs, base)
        # pass 2: |sum u_i|^2 with u_i = d_i/|d_i|: sum over pairs of cos_ij = (|U|^2 - sum |u_i|^2) / 2
        iters = [iter(c()) for c in inputs]
        u2 = 0.0
        for b in base():
            acc = np.zeros(b.size, np.float64)
            for it, nrm in zip(iters, norms):
                x = next(it)
                if nrm > 1e-6:
                    acc += np.subtract(x, b, dtype=np.float64) / nrm
            u2 += float(np.dot(acc, acc))
        if not math.isfinite(u2):
            refuse_nonfinite(p, "model_stock", "the angle between the fine-tunes", inputs, base)
        unit = sum(1 for nrm in norms if nrm > 1e-6)
        cos = (u2 - unit) / (k * (k - 1))
        cos = max(-1.0, min(1.0, cos))
        den = 1 + (k - 1) * cos
        t = 0.0 if abs(den) < 1e-6 else k * cos / den
        return [t / k] * k, 1.0 - t

    def _mergekit_ratio(self, p: TensorParams, k: int, inputs: Sequence[Chunks], base: Chunks) -> Any:
        """mergekit's ratio: each pair's cosine ``d_i.d_j / max(|d_i| |d_j|, 1e-6)`` clipped to
        [-1, 1], then their mean (from the Gram matrix of the offsets, one pass)."""
        iters = [iter(c()) for c in inputs]
        gram = np.zeros((k, k), np.float64)
        for b in base():
            d = np.stack([np.subtract(next(it), b, dtype=np.float64) for it in iters])
            gram += d @ d.T
        if not np.isfinite(gram).all():
            refuse_nonfinite(p, "model_stock", "the angle between the fine-tunes", inputs, base)
        n = np.sqrt(np.diag(gram))
        cos = [max(-1.0, min(1.0, gram[i, j] / max(n[i] * n[j], 1e-6))) for i in range(k) for j in range(i + 1, k)]
        c = math.fsum(cos) / len(cos)
        den = 1 + (k - 1) * c
        t = 0.0 if abs(den) < 1e-6 else k * c / den
        return [t / k] * k, 1.0 - t

    def _rows(self, p: TensorParams, size: int, inputs: Sequence[Chunks], base: Chunks) -> Any:
        """``filter_wise``: one ``t`` per vector along the last axis (mergekit's rows), from the
        mean pairwise cosine of the fine-tunes' offsets in that row (a zero offset's cosine is 0)."""
        k, length = len(inputs), p.shape[-1]
        rows = size // length

        def row_sums(values: Iterator[Tuple[np.ndarray, ...]], fn: Callable[..., np.ndarray]) -> np.ndarray:
            out, off = np.zeros(rows, np.float64), 0
            for chunks in values:
                v = fn(*chunks)
                out += np.bincount((np.arange(off, off + v.size)) // length, weights=v, minlength=rows)[:rows]
                off += v.size
            return out

        def deltas(x: np.ndarray, b: np.ndarray) -> np.ndarray:
            return np.subtract(x, b, dtype=np.float64)

        norms = [np.sqrt(row_sums(zip(c(), base()), lambda x, b: deltas(x, b) ** 2)) for c in inputs]
        cos = np.zeros(rows, np.float64)
        for i in range(k):
            for j in range(i + 1, k):
                dot = row_sums(zip(inputs[i](), inputs[j](), base()),
                               lambda x, y, b: deltas(x, b) * deltas(y, b))
                cos += np.clip(dot / np.maximum(norms[i] * norms[j], 1e-6), -1.0, 1.0)
        cos /= k * (k - 1) / 2
        if not np.isfinite(cos).all():
            refuse_nonfinite(p, "model_stock", "the angle between the fine-tunes", inputs, base)
        den = 1 + (k - 1) * cos
        small = np.abs(den) < 1e-6
        t = np.where(small, 0.0, k * cos / np.where(small, 1.0, den))
        return t, length, k

    def start(self, p: TensorParams, n: int) -> Any:
        if p.params.get("filter_wise") and len(p.shape) > 1:
            return [np.empty(n, p.acc), 0]  # the sum of the inputs, and the chunk's offset
        return super().start(p, n)

    def add(self, acc: Any, p: TensorParams, stats: Any, j: int, x: np.ndarray, base: Optional[np.ndarray],
            offset: int) -> None:
        if not isinstance(acc, list):
            return super().add(acc, p, stats, j, x, base, offset)
        if j == 0:
            acc[1] = offset
            np.copyto(acc[0], x, casting="unsafe")
        else:
            np.add(acc[0], x, out=acc[0], casting="unsafe")

    def finish(self, acc: Any, p: TensorParams, stats: Any, base: Optional[np.ndarray]) -> np.ndarray:
        if not isinstance(acc, list):
            return super().finish(acc, p, stats, base)
        total, off = acc
        t_rows, length, k = stats
        t = t_rows[np.arange(off, off + total.size) // length]  # each element's row's t
        total *= t / k  # t * mean(x_i) + (1 - t) * b
        total += (1 - t) * base
        return total

    def describe(self, p: TensorParams) -> str:
        return "t per row from the fine-tunes' angles" if p.params.get("filter_wise") else "t from the fine-tunes' angle"


#: Every method by name.
METHODS: Dict[str, Method] = {m.name: m for m in (Mean(), Ema(), TaskArithmetic(), Ties(), Dare(), Slerp(),
                                                  ModelStock())}


def combine_arrays(method: str, inputs: Sequence[Any], base: Any = None, *, weights: Optional[Sequence[float]] = None,
                   name: str = "x", acc: str = "float64", chunk: Optional[int] = None, conventions: str = "ckptmerge",
                   **params: Any) -> np.ndarray:
    """Combine whole arrays with a method (the streaming units over one tensor in memory), in
    the accumulation dtype; ``chunk`` splits it into pieces of that many elements as a stream would.

    Example:
        >>> a, b = np.array([1.0, -2.0]), np.array([3.0, 2.0])
        >>> combine_arrays("task_arithmetic", [a], np.zeros(2)).tolist()
        [1.0, -2.0]
    """
    m = METHODS[method]
    xs = [np.asarray(x).reshape(-1) for x in inputs]
    shape = np.shape(inputs[0])
    b = None if base is None else np.asarray(base).reshape(-1)
    size = xs[0].size
    step = chunk or max(size, 1)
    ps = {**m.defaults_for(conventions), **params}
    p = TensorParams(name, tuple(weights or [1.0] * len(xs)), ps, acc, tuple(range(len(xs))), conventions,
                     tuple(np.shape(inputs[0])))

    def pieces(a: np.ndarray) -> Chunks:
        return lambda: (a[s:s + step] for s in range(0, size, step))

    out = []
    with quiet():
        stats = m.prepare(p, size, [pieces(x) for x in xs], pieces(b) if b is not None else None)
        for s in range(0, size, step):
            part = m.start(p, min(step, size - s))
            bb = b[s:s + step] if b is not None else None
            for j, x in enumerate(xs):
                m.add(part, p, stats, j, x[s:s + step], bb, s)
            out.append(m.finish(part, p, stats, bb))
    return (np.concatenate(out) if out else np.zeros(0, acc)).reshape(shape)
