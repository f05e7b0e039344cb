"""Tensor operations a cross-framework transfer needs, as small frozen value transforms.

Keras and PyTorch hold the same layer in different shapes: KerasHub keeps attention in
``EinsumDense`` kernels ``(hidden, heads, head_dim)`` where PyTorch has a ``(hidden, hidden)``
Linear weight; a ViT position table is ``(1, tokens, hidden)`` in one and ``(tokens, hidden)`` in
the other; GPT-2 fuses query, key and value into one ``c_attn`` tensor. Each operation here is
one frozen dataclass following the transform protocol of :mod:`ckptmerge.planning.transforms`
(``target``, ``applies_to``, ``output_shape``, ``apply``, ``describe``, ``to_dict``), pure NumPy,
and each has an :meth:`inverse` (the operation that gives the source's tensor back from the
target's), which the inverse direction (Keras weights written under PyTorch names) uses.

- :class:`Reshape`: the same values in C order under another shape of the same size: splitting
  or merging axes (attention heads, grouped-query heads) and adding or dropping unit axes.
- :class:`Split`: one of ``parts`` equal pieces along an axis (``c_attn`` into query, key, value;
  fused gate/up projections).

:func:`refines` tells whether two shapes differ only by splitting or merging neighbouring axes
and unit axes: the only reshapes structural alignment infers by itself (see
:mod:`ckptmerge.alignment.align`).
"""

from __future__ import annotations

import fnmatch
import math
from dataclasses import dataclass
from typing import Optional, Sequence, Tuple

import numpy as np

from ..errors import TransformError
from ..text import quote_name

__all__ = ["Reshape", "Split", "refines", "glob_escape", "OPS"]

Shape = Tuple[int, ...]


def _check_target(kind: str, target: object) -> None:
    if not isinstance(target, str) or not target:
        raise TransformError(f"{kind}: target must be a non-empty variable name or glob, received {target!r}.")


def _ints(kind: str, target: str, what: str, value: object) -> Tuple[int, ...]:
    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence) or not all(
            isinstance(d, (int, np.integer)) and not isinstance(d, bool) and d >= 0 for d in value):
        raise TransformError(f"{kind} of {quote_name(target)}: {what} must be a list of non-negative integers. "
                             f"Received: {what}={value!r:.80}", target=target)
    return tuple(int(d) for d in value)


def glob_escape(name: str) -> str:
    """A glob that matches exactly ``name`` (``*``, ``?`` and ``[`` made literal).

    Example:
        >>> glob_escape("a[0]/k*")
        'a[[]0]/k[*]'
    """
    return "".join(f"[{c}]" if c in "*?[" else c for c in name)


def _boundaries(shape: Sequence[int]) -> Optional[Tuple[int, ...]]:
    """The running products of a shape without its unit axes (``None`` for an empty tensor)."""
    out, p = [], 1
    for d in shape:
        if d == 0:
            return None
        if d != 1:
            p *= d
            out.append(p)
    return tuple(out)


def refines(a: Sequence[int], b: Sequence[int]) -> bool:
    """Whether a C-order reshape between shapes ``a`` and ``b`` only splits or merges neighbouring
    axes (one way, not both) or adds or drops unit axes: ``(64, 64) -> (64, 4, 16)``,
    ``(1, 17, 64) -> (17, 64)``; not ``(4, 16, 64) -> (64, 4, 16)``, which moves values between axes.

    Example:
        >>> refines((64, 64), (64, 4, 16)), refines((64,), (4, 16)), refines((4, 16, 64), (64, 4, 16))
        (True, True, False)
    """
    if math.prod(a) != math.prod(b):
        return False
    ba, bb = _boundaries(a), _boundaries(b)
    if ba is None or bb is None:
        return False
    sa, sb = set(ba), set(bb)
    return sa <= sb or sb <= sa


@dataclass(frozen=True)
class Reshape:
    """Give a tensor another shape of the same size, values in C order (``numpy.reshape``).

    Args:
        target: the target variable name (or a glob) this transform applies to.
        shape: the shape to produce; ``None`` (the default): the target's shape.
        source_shape: the shape the tensor has before (only needed by :meth:`inverse` of a
            ``Reshape`` made without it; alignment records it).

    Example:
        >>> import numpy as np
        >>> Reshape("query/kernel").apply(np.arange(8.0).reshape(2, 4), target_shape=(2, 2, 2)).shape
        (2, 2, 2)
        >>> Reshape("pos/embeddings", (3, 2)).output_shape((1, 3, 2))
        (3, 2)
    """

    target: str
    shape: Optional[Tuple[int, ...]] = None
    source_shape: Optional[Tuple[int, ...]] = None

    needs_current = False
    kind = "reshape"

    def __post_init__(self) -> None:
        _check_target("reshape", self.target)
        for what in ("shape", "source_shape"):
            if getattr(self, what) is not None:
                object.__setattr__(self, what, _ints("reshape", self.target, what, getattr(self, what)))

    def applies_to(self, name: str) -> bool:
        """Whether this transform applies to the target variable ``name`` (``fnmatch`` glob)."""
        return fnmatch.fnmatchcase(name, self.target)

    def output_shape(self, source_shape: Sequence[int], target_shape: Optional[Sequence[int]] = None) -> Shape:
        """The shape produced, once checked that the sizes agree.

        Raises:
            TransformError: no shape to produce, or one of another size.
        """
        src = tuple(int(d) for d in source_shape)
        out = self.shape if self.shape is not None else (
            tuple(int(d) for d in target_shape) if target_shape is not None else None)
        if out is None:
            raise TransformError(f"reshape of {quote_name(self.target)} needs a shape or the target's shape.",
                                 target=self.target)
        if math.prod(out) != math.prod(src):
            raise TransformError(f"reshape of {quote_name(self.target)}: the checkpoint tensor {src} has "
                                 f"{math.prod(src):,} values and shape {out} needs {math.prod(out):,}; a reshape "
                                 "keeps every value.", target=self.target)
        return out

    def apply(self, value: np.ndarray, current: Optional[np.ndarray] = None, *,
              target_shape: Optional[Sequence[int]] = None) -> np.ndarray:
        """Return the reshaped tensor (C-contiguous)."""
        value = np.asarray(value)
        if target_shape is None and current is not None:
            target_shape = np.shape(current)
        return np.ascontiguousarray(value).reshape(self.output_shape(value.shape, target_shape))

    def inverse(self) -> "Reshape":
        """The reshape back to the source's shape (needs :attr:`source_shape`).

        Example:
            >>> Reshape("q", (2, 2, 2), source_shape=(2, 4)).inverse()
            Reshape(target='q', shape=(2, 4), source_shape=(2, 2, 2))
        """
        if self.source_shape is None:
            raise TransformError(f"reshape of {quote_name(self.target)}: the inverse needs the source's shape "
                                 "(pass source_shape=...).", target=self.target)
        return Reshape(self.target, self.source_shape, self.shape)

    def describe(self, source_shape: Optional[Sequence[int]] = None,
                 target_shape: Optional[Sequence[int]] = None) -> str:
        """One line for reports.

        Example:
            >>> Reshape("q").describe((64, 64), (64, 4, 16))
            'reshaped (64, 64)->(64, 4, 16)'
        """
        if source_shape is None:
            return f"reshaped to {self.shape}" if self.shape is not None else "reshaped to the target's shape"
        return f"reshaped {tuple(source_shape)}->{self.output_shape(source_shape, target_shape)}"

    def to_dict(self) -> dict:
        """JSON-ready data: kind, target, shape."""
        return {"kind": self.kind, "target": self.target, "shape": list(self.shape) if self.shape else None}


@dataclass(frozen=True)
class Split:
    """Take piece ``index`` of ``parts`` equal pieces along ``axis`` (a fused tensor's part).

    Args:
        target: the target variable name (or a glob) this transform applies to.
        axis: the axis to cut.
        index: which piece (0-based).
        parts: how many equal pieces the axis holds.

    Example:
        >>> import numpy as np
        >>> Split("attn/key/kernel", axis=1, index=1, parts=3).apply(np.arange(12.0).reshape(2, 6)).tolist()
        [[2.0, 3.0], [8.0, 9.0]]
        >>> Split("k", 1, 1, 3).describe((64, 192))
        'split axis 1 into 3: columns 64..127 of 192 (part 2 of 3) -> (64, 64)'
    """

    target: str
    axis: int
    index: int
    parts: int

    needs_current = False
    kind = "split"

    def __post_init__(self) -> None:
        _check_target("split", self.target)
        for what in ("axis", "index", "parts"):
            v = getattr(self, what)
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 0:
                raise TransformError(f"split of {quote_name(self.target)}: {what} must be a non-negative integer. "
                                     f"Received: {what}={v!r}", target=self.target)
        if not 0 <= self.index < self.parts:
            raise TransformError(f"split of {quote_name(self.target)}: index must be in 0..{self.parts - 1} for "
                                 f"{self.parts} parts. Received: index={self.index}", target=self.target)

    def applies_to(self, name: str) -> bool:
        """Whether this transform applies to the target variable ``name`` (``fnmatch`` glob)."""
        return fnmatch.fnmatchcase(name, self.target)

    def _rows(self, n: int) -> Tuple[int, int]:
        step = n // self.parts
        return self.index * step, (self.index + 1) * step

    def output_shape(self, source_shape: Sequence[int], target_shape: Optional[Sequence[int]] = None) -> Shape:
        """The piece's shape.

        Raises:
            TransformError: the axis is out of range or does not divide into ``parts``.
        """
        src = tuple(int(d) for d in source_shape)
        if self.axis >= len(src) or src[self.axis] % self.parts:
            raise TransformError(f"split of {quote_name(self.target)}: axis {self.axis} of the checkpoint tensor "
                                 f"{src} does not divide into {self.parts} equal parts.", target=self.target)
        out = list(src)
        out[self.axis] //= self.parts
        return tuple(out)

    def apply(self, value: np.ndarray, current: Optional[np.ndarray] = None, *,
              target_shape: Optional[Sequence[int]] = None) -> np.ndarray:
        """Return the piece (C-contiguous)."""
        value = np.asarray(value)
        self.output_shape(value.shape)
        lo, hi = self._rows(value.shape[self.axis])
        index = [slice(None)] * value.ndim
        index[self.axis] = slice(lo, hi)
        return np.ascontiguousarray(value[tuple(index)])

    def describe(self, source_shape: Optional[Sequence[int]] = None,
                 target_shape: Optional[Sequence[int]] = None) -> str:
        """One line for reports, naming the rows (columns, entries) it takes."""
        if source_shape is None:
            return f"split axis {self.axis} into {self.parts}: part {self.index + 1}"
        n = int(source_shape[self.axis])
        lo, hi = self._rows(n)
        unit = ("rows" if self.axis == 0 else "columns") if len(source_shape) == 2 else f"axis-{self.axis} entries"
        return (f"split axis {self.axis} into {self.parts}: {unit} {lo}..{hi - 1} of {n} "
                f"(part {self.index + 1} of {self.parts}) -> {self.output_shape(source_shape)}")

    def to_dict(self) -> dict:
        """JSON-ready data: kind, target, axis, index, parts."""
        return {"kind": self.kind, "target": self.target, "axis": self.axis, "index": self.index,
                "parts": self.parts}


#: The tensor operations by config kind.
OPS = {"reshape": Reshape, "split": Split}
