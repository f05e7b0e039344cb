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
- :class:`Squeeze` and :class:`ExpandDims`: drop or add one unit axis (a ViT position table
  ``(1, 17, 64)`` as ``(17, 64)`` and back): a reshape, named for what it does.
- :class:`Concat`: several checkpoint tensors joined along an axis into one target (separate
  query, key and value Linear weights into a fused kernel; gate and up into one). It is not a
  per-target value transform: it makes a tensor of its own (see :mod:`ckptmerge.sources.composed`),
  and its inverse is one :class:`Split` per part.

:func:`refines` tells whether two shapes differ only by splitting or merging neighbouring axes
and unit axes: the only reshapes structural alignment infers by itself (see
:mod:`ckptmerge.alignment.align`).
"""

from __future__ import annotations

import fnmatch
import math
from dataclasses import dataclass
from typing import Any, Optional, Sequence, Tuple

import numpy as np

from ..core.errors import TransformError
from ..core.text import quote_name

__all__ = ["Reshape", "Split", "Squeeze", "ExpandDims", "Concat", "refines", "glob_escape", "unit_axis_op", "OPS"]

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
        if self.shape is not None and self.source_shape is not None \
                and math.prod(self.shape) != math.prod(self.source_shape):
            raise TransformError(f"reshape of {quote_name(self.target)}: shape {self.shape} holds "
                                 f"{math.prod(self.shape):,} values and source_shape {self.source_shape} "
                                 f"{math.prod(self.source_shape):,}; a reshape keeps every value.", target=self.target)

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
    """Take piece ``index`` of ``parts`` pieces along ``axis`` (a fused tensor's part): equal
    pieces, or with ``sizes`` pieces of those sizes (a grouped-query fused ``qkv`` whose key and
    value are narrower than its query).

    Args:
        target: the target variable name (or a glob) this transform applies to.
        axis: the axis to cut.
        index: which piece (0-based).
        parts: how many pieces the axis holds.
        sizes: the pieces' sizes along ``axis``, one per part (default: equal pieces).

    Example:
        >>> import numpy as np
        >>> Split("attn/key/kernel", axis=1, index=1, parts=3).apply(np.arange(12.0).reshape(2, 6)).tolist()
        [[2.0, 3.0], [8.0, 9.0]]
        >>> Split("k", 1, 1, 3).describe((64, 192))
        'split axis 1 into 3: columns 64..127 of 192 (part 2 of 3) -> (64, 64)'
        >>> Split("v", 1, 2, 3, sizes=(64, 16, 16)).describe((64, 96))
        'split axis 1 into 3: columns 80..95 of 96 (part 3 of 3) -> (64, 16)'
    """

    target: str
    axis: int
    index: int
    parts: int
    sizes: Optional[Tuple[int, ...]] = None

    needs_current = False
    kind = "split"

    def __post_init__(self) -> None:
        _check_target("split", self.target)
        for what in ("axis", "index", "parts"):
            v = getattr(self, what)
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 0:
                raise TransformError(f"split of {quote_name(self.target)}: {what} must be a non-negative integer. "
                                     f"Received: {what}={v!r}", target=self.target)
        if self.parts < 1:
            raise TransformError(f"split of {quote_name(self.target)}: parts must be at least 1. "
                                 f"Received: parts={self.parts}", target=self.target)
        if not 0 <= self.index < self.parts:
            raise TransformError(f"split of {quote_name(self.target)}: index must be in 0..{self.parts - 1} for "
                                 f"{self.parts} parts. Received: index={self.index}", target=self.target)
        if self.sizes is not None:
            sizes = _ints("split", self.target, "sizes", self.sizes)
            if len(sizes) != self.parts:
                raise TransformError(f"split of {quote_name(self.target)}: sizes must give one size per part "
                                     f"({self.parts}). Received: sizes={list(sizes)}", target=self.target)
            object.__setattr__(self, "sizes", sizes)

    def applies_to(self, name: str) -> bool:
        """Whether this transform applies to the target variable ``name`` (``fnmatch`` glob)."""
        return fnmatch.fnmatchcase(name, self.target)

    def _rows(self, n: int) -> Tuple[int, int]:
        if self.sizes is not None:
            lo = sum(self.sizes[:self.index])
            return lo, lo + self.sizes[self.index]
        step = n // self.parts
        return self.index * step, (self.index + 1) * step

    def output_shape(self, source_shape: Sequence[int], target_shape: Optional[Sequence[int]] = None) -> Shape:
        """The piece's shape.

        Raises:
            TransformError: the axis is out of range or does not divide into ``parts``.
        """
        src = tuple(int(d) for d in source_shape)
        if self.sizes is not None and (self.axis >= len(src) or sum(self.sizes) != src[self.axis]):
            raise TransformError(f"split of {quote_name(self.target)}: axis {self.axis} of the checkpoint tensor "
                                 f"{src} does not hold parts of sizes {list(self.sizes)} (they sum to "
                                 f"{sum(self.sizes)}).", target=self.target)
        if self.sizes is None and (self.axis >= len(src) or src[self.axis] % self.parts):
            raise TransformError(f"split of {quote_name(self.target)}: axis {self.axis} of the checkpoint tensor "
                                 f"{src} does not divide into {self.parts} equal parts.", target=self.target)
        out = list(src)
        lo, hi = self._rows(src[self.axis])
        out[self.axis] = hi - lo
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
        """JSON-ready data: kind, target, axis, index, parts (and sizes, when given)."""
        out = {"kind": self.kind, "target": self.target, "axis": self.axis, "index": self.index, "parts": self.parts}
        if self.sizes is not None:
            out["sizes"] = list(self.sizes)
        return out


def _unit(axis: int, ndim: int, plural: bool = True) -> str:
    """What the slices along ``axis`` of an ``ndim``-D tensor are called in a report."""
    if ndim == 2:
        return ("rows" if plural else "row") if axis == 0 else ("columns" if plural else "column")
    if ndim == 1:
        return "entries" if plural else "entry"
    return f"axis-{axis} entries"


def _check_int(kind: str, target: str, what: str, value: object, *, negative: bool = False) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or (value < 0 and not negative):
        need = "an integer" if negative else "a non-negative integer"
        raise TransformError(f"{kind} of {quote_name(target)}: {what} must be {need}. Received: {what}={value!r}",
                             target=target)
    return int(value)


@dataclass(frozen=True)
class _UnitAxis:
    """What :class:`Squeeze` and :class:`ExpandDims` share: a target, one axis, values kept in place."""

    target: str
    axis: int = 0

    needs_current = False
    kind = "unit axis"
    verb = ""

    def __post_init__(self) -> None:
        _check_target(self.kind, self.target)
        object.__setattr__(self, "axis", _check_int(self.kind, self.target, "axis", self.axis, negative=True))

    def applies_to(self, name: str) -> bool:
        """Whether this transform applies to the target variable ``name`` (``fnmatch`` glob)."""
        return fnmatch.fnmatchcase(name, self.target)

    def _axis(self, ndim: int, shape: Shape) -> int:
        axis = self.axis + ndim if self.axis < 0 else self.axis
        if not 0 <= axis < ndim:
            raise TransformError(f"{self.kind} of {quote_name(self.target)}: axis {self.axis} is out of range for "
                                 f"{ndim} dimensions (the checkpoint tensor is {shape}).", target=self.target)
        return axis

    def output_shape(self, source_shape: Sequence[int], target_shape: Optional[Sequence[int]] = None) -> Shape:
        raise NotImplementedError

    def apply(self, value: np.ndarray, current: Optional[np.ndarray] = None, *,
              target_shape: Optional[Sequence[int]] = None) -> np.ndarray:
        """Return the reshaped tensor (C-contiguous)."""
        value = np.asarray(value)
        return np.ascontiguousarray(value).reshape(self.output_shape(value.shape))

    def describe(self, source_shape: Optional[Sequence[int]] = None,
                 target_shape: Optional[Sequence[int]] = None) -> str:
        """One line for reports: the axis and both shapes."""
        if source_shape is None:
            return f"{self.verb} axis {self.axis}"
        return f"{self.verb} axis {self.axis} {tuple(source_shape)}->{self.output_shape(source_shape)}"

    def to_dict(self) -> dict:
        """JSON-ready data: kind, target, axis."""
        return {"kind": self.kind, "target": self.target, "axis": self.axis}


@dataclass(frozen=True)
class Squeeze(_UnitAxis):
    """Drop the unit axis ``axis`` of a tensor: ``(1, 17, 64) -> (17, 64)`` with ``axis=0``
    (``numpy.squeeze``; a reshape that keeps every value in place).

    Args:
        target: the target variable name (or a glob) this transform applies to.
        axis: the axis of size 1 to drop (negative counts from the end).

    Example:
        >>> import numpy as np
        >>> Squeeze("pos/embeddings", axis=0).apply(np.zeros((1, 17, 64))).shape
        (17, 64)
        >>> Squeeze("pos/embeddings", 0).describe((1, 17, 64))
        'squeezed axis 0 (1, 17, 64)->(17, 64)'
    """

    kind = "squeeze"
    verb = "squeezed"

    def output_shape(self, source_shape: Sequence[int], target_shape: Optional[Sequence[int]] = None) -> Shape:
        """The shape without the unit axis.

        Raises:
            TransformError: the axis is out of range or not of size 1.
        """
        src = tuple(int(d) for d in source_shape)
        axis = self._axis(len(src), src)
        if src[axis] != 1:
            raise TransformError(f"squeeze of {quote_name(self.target)}: axis {self.axis} of the checkpoint tensor "
                                 f"{src} has size {src[axis]}, not 1; only a unit axis can be dropped.",
                                 target=self.target)
        return src[:axis] + src[axis + 1:]

    def inverse(self) -> "ExpandDims":
        """The :class:`ExpandDims` that adds the axis back.

        Example:
            >>> Squeeze("p", 0).inverse()
            ExpandDims(target='p', axis=0)
        """
        return ExpandDims(self.target, self.axis)


@dataclass(frozen=True)
class ExpandDims(_UnitAxis):
    """Add a unit axis at ``axis``: ``(17, 64) -> (1, 17, 64)`` with ``axis=0`` (``numpy.expand_dims``).

    Args:
        target: the target variable name (or a glob) this transform applies to.
        axis: where the new axis goes in the result (negative counts from the end).

    Example:
        >>> import numpy as np
        >>> ExpandDims("pos/embeddings", axis=0).apply(np.zeros((17, 64))).shape
        (1, 17, 64)
        >>> ExpandDims("pos/embeddings", 0).describe((17, 64))
        'expanded axis 0 (17, 64)->(1, 17, 64)'
    """

    kind = "expand_dims"
    verb = "expanded"

    def output_shape(self, source_shape: Sequence[int], target_shape: Optional[Sequence[int]] = None) -> Shape:
        """The shape with the new unit axis.

        Raises:
            TransformError: the axis is out of range for the result.
        """
        src = tuple(int(d) for d in source_shape)
        axis = self._axis(len(src) + 1, src)
        return src[:axis] + (1,) + src[axis:]

    def inverse(self) -> Squeeze:
        """The :class:`Squeeze` that drops the axis again.

        Example:
            >>> ExpandDims("p", 0).inverse()
            Squeeze(target='p', axis=0)
        """
        return Squeeze(self.target, self.axis)


def unit_axis_op(target: str, have: Sequence[int], want: Sequence[int]) -> Optional[Any]:
    """The :class:`Squeeze` or :class:`ExpandDims` that turns shape ``have`` into ``want`` when
    they differ by exactly one unit axis, named by the first place it can go; else ``None``.

    Example:
        >>> unit_axis_op("p", (1, 17, 64), (17, 64)), unit_axis_op("p", (17, 64), (17, 1, 64))
        (Squeeze(target='p', axis=0), ExpandDims(target='p', axis=1))
        >>> unit_axis_op("p", (64, 64), (64, 4, 16)) is None
        True
    """
    have, want = tuple(have), tuple(want)
    longer, shorter, cls = (have, want, Squeeze) if len(have) == len(want) + 1 else (want, have, ExpandDims)
    if len(longer) != len(shorter) + 1:
        return None
    for axis, d in enumerate(longer):
        if d == 1 and longer[:axis] + longer[axis + 1:] == shorter:
            return cls(target, axis)
    return None


@dataclass(frozen=True)
class Concat:
    """Join several checkpoint tensors along ``axis`` into one target tensor.

    Separate query, key and value Linear weights become a fused ``qkv`` kernel; a gate and an
    up projection become one fused MLP kernel. The parts are checkpoint names of one source (as
    its listing shows them: after its ``layout``), in order; every other axis must agree, and so
    must their dtypes. The joined tensor is offered to the plan under the name
    ``"part_a+part_b+..."`` and mapped onto ``target``; its report line names every part's raw
    key and stored shape. The parts count as used when the target is restored, and are not
    offered under their own names.

    Unlike the per-target transforms, a ``Concat`` is not applied to a tensor on its way: it
    makes one (:mod:`ckptmerge.sources.composed` does, when the source is opened).

    Args:
        target: the target variable name (exact; no glob).
        sources: the checkpoint names of the parts, in order (at least two).
        axis: the axis to join along (negative counts from the end); ``None``: the one axis
            along which the parts joined give the target's shape (an error when more than one
            would, e.g. equal parts into a square target).

    Example:
        >>> import numpy as np
        >>> c = Concat("attn/qkv/kernel", ["attn/q/kernel", "attn/k/kernel", "attn/v/kernel"], axis=1)
        >>> c.apply([np.zeros((4, 2)), np.ones((4, 2)), np.ones((4, 2))]).shape
        (4, 6)
        >>> c.describe([(4, 2), (4, 2), (4, 2)], labels=["q", "k", "v"])
        'concat axis 1 of 3 parts: columns 0..1 <- q (4, 2), 2..3 <- k (4, 2), 4..5 <- v (4, 2) -> (4, 6)'
        >>> [s.to_dict()["index"] for s in c.inverse()]
        [0, 1, 2]
    """

    target: str
    sources: Tuple[str, ...]
    axis: Optional[int] = None

    needs_current = False
    kind = "concat"

    def __post_init__(self) -> None:
        _check_target("concat", self.target)
        sources = self.sources
        if isinstance(sources, (str, bytes)) or not isinstance(sources, Sequence) or not all(
                isinstance(s, str) and s for s in sources):
            raise TransformError(f"concat of {quote_name(self.target)}: sources must be a list of checkpoint names. "
                                 f"Received: sources={sources!r:.80}", target=self.target)
        sources = tuple(sources)
        if len(sources) < 2:
            raise TransformError(f"concat of {quote_name(self.target)}: sources must name at least two checkpoint "
                                 f"tensors to join (one is a plain map entry). Received: sources={list(sources)!r}",
                                 target=self.target)
        if len(set(sources)) != len(sources):
            twice = sorted({s for s in sources if sources.count(s) > 1})
            raise TransformError(f"concat of {quote_name(self.target)}: sources name "
                                 f"{', '.join(quote_name(s) for s in twice)} more than once; each part is joined "
                                 "once.", target=self.target)
        object.__setattr__(self, "sources", sources)
        if self.axis is not None:
            object.__setattr__(self, "axis", _check_int("concat", self.target, "axis", self.axis, negative=True))

    @property
    def name(self) -> str:
        """The name the joined tensor has in its source: the parts' names joined with ``+``."""
        return "+".join(self.sources)

    def applies_to(self, name: str) -> bool:
        """Always False: a Concat makes a tensor, it is not applied to one on its way."""
        return False

    def _part_shapes(self, shapes: object) -> Tuple[Shape, ...]:
        """``shapes`` checked: one shape of non-negative integers per part, in order."""
        if isinstance(shapes, (str, bytes)) or not isinstance(shapes, Sequence):
            raise TransformError(f"concat of {quote_name(self.target)}: shapes must be a list of the parts' shapes. "
                                 f"Received: shapes={shapes!r:.80}", target=self.target)
        if len(shapes) != len(self.sources):
            raise TransformError(f"concat of {quote_name(self.target)}: {len(shapes)} "
                                 f"shape{'' if len(shapes) == 1 else 's'} given for the {len(self.sources)} parts "
                                 f"({', '.join(quote_name(s) for s in self.sources)}); give one shape per part, "
                                 f"in order. Received: shapes={list(shapes)!r:.80}", target=self.target)
        return tuple(_ints("concat", self.target, f"the shape of part {quote_name(n)}", s)
                     for n, s in zip(self.sources, shapes))

    def axes(self, shapes: Sequence[Sequence[int]], target_shape: Optional[Sequence[int]] = None) -> Tuple[int, ...]:
        """The axes the parts of these shapes may be joined along (with ``axis`` given: that one,
        checked), narrowed by ``target_shape`` when given.

        Raises:
            TransformError: the parts differ in rank, or off the axis; no axis (or, with
                ``axis=None``, more than one) fits.
        """
        shapes = self._part_shapes(shapes)
        ranks = {len(s) for s in shapes}
        parts = ", ".join(f"{quote_name(n)} {s}" for n, s in zip(self.sources, shapes))
        if len(ranks) != 1:
            raise TransformError(f"concat of {quote_name(self.target)}: the parts have different numbers of "
                                 f"dimensions ({parts}); they must differ along the joined axis only.",
                                 target=self.target)
        ndim = ranks.pop()
        if self.axis is not None:
            axis = self.axis + ndim if self.axis < 0 else self.axis
            if not 0 <= axis < ndim:
                raise TransformError(f"concat of {quote_name(self.target)}: axis {self.axis} is out of range for "
                                     f"parts with {ndim} dimensions ({parts}).", target=self.target)
            candidates = [axis]
        else:
            candidates = list(range(ndim))
        fits = [a for a in candidates if all(s[:a] + s[a + 1:] == shapes[0][:a] + shapes[0][a + 1:] for s in shapes)]
        if target_shape is not None:
            fits = [a for a in fits if _joined(shapes, a) == tuple(int(d) for d in target_shape)] or fits
        if not fits:
            along = f"along axis {self.axis}" if self.axis is not None else "along any one axis"
            raise TransformError(f"concat of {quote_name(self.target)}: the parts ({parts}) cannot be joined {along}: "
                                 "every other axis must agree.", target=self.target)
        if len(fits) > 1:
            raise TransformError(f"concat of {quote_name(self.target)}: the parts ({parts}) can be joined along axis "
                                 f"{' or '.join(map(str, fits))}; give axis=... to say which.", target=self.target)
        return tuple(fits)

    def output_shape(self, shapes: Sequence[Sequence[int]], target_shape: Optional[Sequence[int]] = None) -> Shape:
        """The joined shape of parts with these shapes.

        Example:
            >>> Concat("qkv", ["q", "k", "v"]).output_shape([(64, 64), (64, 16), (64, 16)])
            (64, 96)
        """
        return _joined(shapes, self.axes(shapes, target_shape)[0])

    def apply(self, values: Sequence[np.ndarray], out: Optional[np.ndarray] = None, *,
              target_shape: Optional[Sequence[int]] = None) -> np.ndarray:
        """Return the parts joined (into ``out`` when given: a buffer of the joined shape)."""
        values = [np.asarray(v) for v in values]
        if len(values) != len(self.sources):
            raise TransformError(f"concat of {quote_name(self.target)}: {len(values)} values given for "
                                 f"{len(self.sources)} parts.", target=self.target)
        axis = self.axes([v.shape for v in values], target_shape)[0]
        if out is None:
            return np.concatenate(values, axis=axis)
        return np.concatenate(values, axis=axis, out=out)

    def inverse(self, shapes: Optional[Sequence[Sequence[int]]] = None) -> Tuple[Split, ...]:
        """One :class:`Split` per part, taking it back from the joined tensor (the inverse
        direction). Needs ``axis`` or the parts' ``shapes``; with shapes of unequal size along the
        axis (grouped-query attention), each Split has the parts' ``sizes``.

        Raises:
            TransformError: the axis is unknown, or ``shapes`` does not give one shape per part.
        """
        if shapes is not None:
            shapes = self._part_shapes(shapes)
            axis = self.axes(shapes)[0]
            sizes = tuple(s[axis] for s in shapes)
            if len(set(sizes)) > 1:
                return tuple(Split(glob_escape(s), axis, i, len(self.sources), sizes=sizes)
                             for i, s in enumerate(self.sources))
        elif self.axis is None or self.axis < 0:
            raise TransformError(f"concat of {quote_name(self.target)}: the inverse needs a non-negative axis "
                                 "(or the parts' shapes).", target=self.target)
        else:
            axis = self.axis
        return tuple(Split(glob_escape(s), axis, i, len(self.sources)) for i, s in enumerate(self.sources))

    def describe(self, shapes: Optional[Sequence[Sequence[int]]] = None,
                 target_shape: Optional[Sequence[int]] = None, *, labels: Optional[Sequence[str]] = None) -> str:
        """One line for reports: the axis, each part with the rows (columns, entries) it fills
        and its shape, and the joined shape. ``labels``: how to show each part (default: its name).
        """
        labels = list(labels) if labels is not None else list(self.sources)
        n = len(self.sources)
        if shapes is None:
            where = f"axis {self.axis}" if self.axis is not None else "the axis that fits"
            return f"concat along {where} of {n} parts: {' + '.join(labels)}"
        shapes = self._part_shapes(shapes)
        axis = self.axes(shapes, target_shape)[0]
        out = _joined(shapes, axis)
        pieces, lo = [], 0
        for label, s in zip(labels, shapes):
            pieces.append(f"{lo}..{lo + s[axis] - 1} <- {label} {s}")
            lo += s[axis]
        return (f"concat axis {axis} of {n} parts: {_unit(axis, len(out))} {', '.join(pieces)} -> {out}")

    def to_dict(self) -> dict:
        """JSON-ready data: kind, target, sources, axis."""
        return {"kind": self.kind, "target": self.target, "sources": list(self.sources), "axis": self.axis}


def _joined(shapes: Sequence[Sequence[int]], axis: int) -> Shape:
    first = tuple(int(d) for d in shapes[0])
    return first[:axis] + (sum(int(s[axis]) for s in shapes),) + first[axis + 1:]


#: The tensor operations by config kind.
OPS = {"reshape": Reshape, "split": Split, "squeeze": Squeeze, "expand_dims": ExpandDims}
