"""Exact magnitude selection in bounded memory: TIES's cut.

:func:`kth_largest_abs` finds the ``k``-th largest ``|value|`` of a tensor given as chunks
(in memory for small tensors, by a radix selection on the bit patterns otherwise), and
:func:`tie_cut` where the kept magnitudes equal to it stop in element order, so that any chunk
of the tensor, on any thread, is trimmed alike. Pure NumPy, no files.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Iterable, Tuple

import numpy as np

__all__ = ["kth_largest_abs", "tie_cut"]

Chunks = Callable[[], Iterable[Any]]  # a fresh pass over one tensor's (chunk, offset) pairs


def kth_largest_abs(passes: Chunks, size: int, k: int, delta: Callable[[np.ndarray, int], np.ndarray],
                    *, whole_limit: int = 1 << 20, equal: bool = False) -> Tuple[Any, ...]:
    """The ``k``-th largest ``|value|`` of a tensor given as chunks, exactly, in bounded memory,
    and how many magnitudes are strictly larger (the values equal to it make up the rest of the
    ``k``); with ``equal=True`` also how many are equal to it.

    ``passes()`` starts a pass over the tensor's chunks (``(chunk, offset)`` pairs) and
    ``delta(chunk, offset)`` turns one into the float64 values ranked. A tensor of at most
    ``whole_limit`` elements is ranked in memory (``np.partition``); a larger one by a radix
    selection on the bit patterns of the magnitudes (non-negative float64 values order as their
    uint64 bits): 16 bits a pass, until the candidates fit in ``whole_limit``.

    Example:
        >>> x = np.array([3.0, -7.0, 1.0, 5.0, -5.0])
        >>> kth_largest_abs(lambda: [(x, 0)], 5, 2, lambda c, o: c)
        (5.0, 1)
    """
    if k <= 0:
        return (math.inf, 0, 0) if equal else (math.inf, 0)
    if size <= whole_limit:
        a = np.abs(np.concatenate([delta(c, o) for c, o in passes()])) if size else np.zeros(0)
        thr = float(np.partition(a, size - k)[size - k])
        above = int(np.count_nonzero(a > thr))
        return (thr, above, int(np.count_nonzero(a == thr))) if equal else (thr, above)
    prefix, shift, rank = 0, 64, k  # the k-th largest has bits `prefix` above `shift`
    while True:
        shift -= 16
        counts = np.zeros(1 << 16, np.int64)
        for c, o in passes():
            bits = np.abs(delta(c, o)).view(np.uint64)
            if shift + 16 < 64:
                bits = bits[(bits >> np.uint64(shift + 16)) == np.uint64(prefix)]
            counts += np.bincount(((bits >> np.uint64(shift)) & np.uint64(0xFFFF)).astype(np.int64),
                                  minlength=1 << 16)
        above = np.cumsum(counts[::-1])  # elements in this bin or a higher one
        top = int(np.searchsorted(above, rank))  # first count from the top reaching `rank`
        b = (1 << 16) - 1 - top
        rank -= int(above[top - 1]) if top else 0
        prefix = (prefix << 16) | b
        if counts[b] <= whole_limit or shift == 0:
            break
    keep = []
    for c, o in passes():
        bits = np.abs(delta(c, o)).view(np.uint64)
        keep.append(bits[(bits >> np.uint64(shift)) == np.uint64(prefix)])
    cand = np.concatenate(keep).view(np.float64)  # (every magnitude equal to the k-th is among them)
    thr = float(np.partition(cand, cand.size - rank)[cand.size - rank])
    above = (k - rank) + int(np.count_nonzero(cand > thr))
    return (thr, above, int(np.count_nonzero(cand == thr))) if equal else (thr, above)


def tie_cut(passes: Chunks, thr: float, need: int) -> int:
    """The element index just past the ``need``-th magnitude equal to ``thr`` in element order
    (``passes()`` as for :func:`kth_largest_abs`): keeping ``|d| > thr``, and ``|d| == thr`` only
    before that index, keeps the first ``need`` of the tied magnitudes.

    Example:
        >>> x = np.array([2.0, -1.0, 1.0, 3.0, 1.0])
        >>> tie_cut(lambda: [(x[:2], 0), (x[2:], 2)], 1.0, 2)
        3
    """
    if need <= 0:
        return 0
    seen = end = 0
    for c, o in passes():
        at = np.flatnonzero(np.abs(c) == thr)
        if seen + at.size >= need:
            return o + int(at[need - seen - 1]) + 1
        seen += at.size
        end = o + c.size
    return end  # (fewer than `need`: all of them)
