"""Which conventions a combination follows: ckptmerge's own, or mergekit 0.1.5's.

:data:`DIFFERENCES` lists every way the two differ (``docs/merging.md`` has the same table,
and a test keeps the two in step); :func:`parameter_conventions` says, for one combination,
where each parameter's value came from and which convention its meaning follows, for the
:class:`~ckptmerge.CombineReport`. Pure: no file access.
"""

from __future__ import annotations

from typing import Any, Collection, List, Mapping, Tuple

__all__ = ["DIFFERENCES", "parameter_conventions"]

#: ``(what, ckptmerge, mergekit)``: every difference between the two conventions.
DIFFERENCES: Tuple[Tuple[str, str, str], ...] = (
    ("`density` default (ties, dare)", "0.5", "1.0 (nothing is trimmed or dropped)"),
    ("DARE's rescale of the kept values", "by `1/density`",
     "`rescale: true` (default for dare_linear, dare_ties): to the L1 norm of the whole offset, "
     "`sum|d| / sum|kept|` (kept as they are when either is below 1e-7); `rescale: false`: none"),
    ("TIES's rescale", "none", "none by default; `rescale: true` matches the L1 norm as DARE does"),
    ("`normalize` (task_arithmetic)", "not a parameter: `b + scale * sum(w_i d_i)`",
     "default false; true divides the weighted sum by `sum(w_i)` (unless it is below 1e-8)"),
    ("`normalize` (ties, dare)", "ties true, dare false", "the same defaults"),
    ("scaling of the merged offset", "`scale`", "`lambda` (the same: after normalizing)"),
    ("`int8_mask`", "not a parameter", "accepted; no effect on the values (sign masks are exact in any dtype)"),
    ("per-tensor parameters", "`{glob: value}`, `fnmatch` globs over the whole name, first match wins",
     "`filter` lists: a tensor matches when its name contains the filter (`*` or no filter: every "
     "tensor), first match wins, then the model's, then the merge-wide `parameters`"),
    ("per-input parameters", "`weights` only", "every tensor parameter (`weight`, `density`) per model"),
    ("SLERP of an all-zero tensor", "linear interpolation `(1-t) a + t b`",
     "its direction is left unnormalised (norm <= 1e-8), so the cosine is ~0: `cos(t pi/2) a + sin(t pi/2) b`"),
    ("SLERP's `t`", "default 0.5, in [0, 1]", "required, not checked (outside [0, 1] extrapolates); ckptmerge refuses that"),
    ("`density` 0", "refused (`density` is in (0, 1])", "TIES: an assertion error; DARE: every offset dropped (the base)"),
    ("linear's `normalize`", "default true (a weighted mean); false: the weighted sum", "the same"),
    ("DARE's random draws", "Philox, seeded by `(seed, tensor name, input)`: the same on every run",
     "torch's global generator (`--random-seed`); ckptmerge reads the config with `seed` 0 unless told"),
    ("TIES with `density * size < 1`", "keeps the largest magnitude", "an assertion error"),
    ("TIES's ties at the cut", "the first equal magnitudes in element order", "torch's argsort order"),
    ("accumulation", "float64, rounded once into the output dtype",
     "in `dtype` (the inputs are cast to it first), then cast to `out_dtype`"),
    ("gradient lists (`t: [0, 0.5, 1]`)", "spread over the numbered layers, `i / (n - 1)` for layer `i` of `n`; "
     "refused for a tensor outside them", "the same over the layers (over each slice's anew); the first value before "
     "the layers, the last after them (by the architecture); ckptmerge refuses that, and gradients of `weight`"),
    ("Model Stock's cosine", "of the unit offsets (an offset of norm <= 1e-6 counts as 0), mean clipped to [-1, 1]",
     "each pair's `d_i.d_j / max(|d_i| |d_j|, 1e-6)` clipped, then their mean (tiny offsets shrink it)"),
    ("Model Stock", "`t = 0` where `1 + (k-1) cos` vanishes", "the same formula (no guard); `filter_wise` the same (one ratio per row along the last axis)"),
)

_MEANING = {
    ("density", "ckptmerge"): "ckptmerge's default 0.5",
    ("density", "mergekit"): "mergekit's default 1.0",
    ("rescale", "mergekit"): "true: the kept values rescaled to the L1 norm of the offset (mergekit)",
    ("int8_mask", "mergekit"): "no effect on the values (mergekit's memory option)",
    ("scale", "mergekit"): "mergekit's lambda",
    ("normalize", "mergekit"): "mergekit's normalize",
    ("t", "mergekit"): "SLERP of a zero tensor as mergekit computes it",
}


def parameter_conventions(method: str, conventions: str, defaults: Mapping[str, Any],
                          given: Collection[str]) -> List[Tuple[str, str]]:
    """``(parameter, how its value and meaning were chosen)`` for each parameter of ``method``.

    Example:
        >>> parameter_conventions("slerp", "mergekit", {"t": 0.5}, ["t"])[:2]
        [('t', 'set (SLERP of a zero tensor as mergekit computes it)'), ('zero tensors', 'quarter circle (mergekit)')]
    """
    out: List[Tuple[str, str]] = []
    for key, default in defaults.items():
        if key in given:
            meaning = _MEANING.get((key, conventions), "")
            text = "set" + (f" ({meaning})" if meaning and key not in ("density",) else "")
        elif key == "rescale" and conventions == "mergekit":
            text = "mergekit's default " + ("true: to the L1 norm of the offset" if default else "false: none")
        else:
            text = f"{conventions}'s default {default!r}".replace("True", "true").replace("False", "false")
        out.append((key, text))
    if method in ("mean", "task_arithmetic", "ties", "dare"):
        out.insert(0, ("weights", "per input" + (" (mergekit's weight: required)" if conventions == "mergekit" else "")))
    if method == "dare" and conventions == "ckptmerge":
        out.append(("rescale", "by 1/density (ckptmerge)"))
    if method == "slerp":
        out.append(("zero tensors", "quarter circle (mergekit)" if conventions == "mergekit" else "linear (ckptmerge)"))
    out.append(("filters", "substrings (mergekit)" if conventions == "mergekit" else "globs (ckptmerge)"))
    return out
