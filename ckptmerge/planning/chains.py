"""Which value transforms apply to a target, and a chain of them applied in order.

A source's ``transforms`` are matched to each target variable by name or glob
(:func:`select`; :class:`TransformIndex` for many names at once, looking up plain names instead
of matching each transform), and applied in their order: :func:`chain_output_shape` gives the
shape the planner compares with the target's, :func:`chain_apply` the value a backend or a merge
writes. The transforms themselves are :mod:`ckptmerge.planning.transforms` (and the tensor
operations of :mod:`ckptmerge.alignment.tensorops`). Pure numpy.
"""

from __future__ import annotations

from typing import Any, Iterable, List, Optional, Sequence

import numpy as np

from .transforms import Shape, Slice, Transform, Transpose, VocabRemap

__all__ = ["select", "literal_glob", "TransformIndex", "chain_output_shape", "chain_apply"]


def select(transforms: Iterable[Transform], name: str) -> List[Transform]:
    """The transforms (in order) that apply to the target variable ``name``.

    Example:
        >>> [t.target for t in select([Slice("head/*", 0), Slice("enc/k", 1)], "head/bias")]
        ['head/*']
    """
    return [t for t in transforms if t.applies_to(name)]


def literal_glob(pattern: Any) -> Optional[str]:
    """The one name an ``fnmatch`` glob matches when it has no wildcard (``[c]`` classes of one
    character, as :func:`ckptmerge.alignment.tensorops.glob_escape` writes them, included), else ``None``.

    Example:
        >>> literal_glob("a[[]0]/k[*]"), literal_glob("enc/*")
        ('a[0]/k*', None)
    """
    if not isinstance(pattern, str):
        return None
    out, i, n = [], 0, len(pattern)
    while i < n:
        c = pattern[i]
        if c == "[":
            if i + 2 < n and pattern[i + 2] == "]" and pattern[i + 1] not in "!^":
                out.append(pattern[i + 1])
                i += 3
                continue
            return None
        if c in "*?":
            return None
        out.append(c)
        i += 1
    return "".join(out)


class TransformIndex:
    """:func:`select` for many names over one list of transforms: transforms whose target is a
    plain name (the reshapes alignment adds, one per target) are looked up, not matched one by
    one, so a plan of N targets and N such transforms costs N, not N squared.

    Example:
        >>> index = TransformIndex([Slice("head/*", 0), Slice("enc/k", 1)])
        >>> [t.target for t in index.select("enc/k")], index.select("x")
        (['enc/k'], [])
    """

    def __init__(self, transforms: Iterable[Any]) -> None:
        from ..alignment.tensorops import OPS

        known = (VocabRemap, Slice, Transpose, *OPS.values())  # those whose applies_to is fnmatch's
        self.transforms = tuple(transforms)
        self._exact: dict = {}
        self._other: List[int] = []
        for i, t in enumerate(self.transforms):
            name = literal_glob(getattr(t, "target", None)) if type(t) in known else None
            if name is None:
                self._other.append(i)
            else:
                self._exact.setdefault(name, []).append(i)

    def select(self, name: str) -> List[Any]:
        """The transforms (in their order) that apply to ``name``."""
        hits = self._exact.get(name, [])
        if self._other:
            hits = sorted(hits + [i for i in self._other if self.transforms[i].applies_to(name)])
        return [self.transforms[i] for i in hits]


def chain_output_shape(transforms: Sequence[Transform], source_shape: Sequence[int],
                       target_shape: Sequence[int]) -> Shape:
    """The shape after applying ``transforms`` in order; the planner compares it to the target.

    Raises:
        TransformError: a transform does not fit (report it as a mismatch).

    Example:
        >>> chain_output_shape([Slice("b", 0)], (10,), (12,))
        (12,)
    """
    shape = tuple(int(d) for d in source_shape)
    for t in transforms:
        shape = t.output_shape(shape, target_shape)
    return shape


def chain_apply(transforms: Sequence[Transform], value: np.ndarray, current: Optional[np.ndarray] = None,
                *, target_shape: Optional[Sequence[int]] = None) -> np.ndarray:
    """Apply ``transforms`` in order (each gets the target's ``current`` value).

    Example:
        >>> import numpy as np
        >>> chain_apply([Slice("b", 0, init="zeros")], np.ones(2), target_shape=(3,)).tolist()
        [1.0, 1.0, 0.0]
    """
    for t in transforms:
        value = t.apply(value, current, target_shape=target_shape)
    return value
