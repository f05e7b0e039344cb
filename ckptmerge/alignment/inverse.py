"""The inverse of a framework layout: Keras/TF tensors back under a PyTorch ``state_dict``'s names.

:func:`~ckptmerge.alignment.layouts.torch_layout` turns a PyTorch tensor into one or more
Keras-shaped entries (transposed, gates reordered, a fused ``c_attn`` split in three); structural
alignment then pairs those entries with Keras variables, reshaping where a C-order reshape fits
(attention heads). :func:`invert_layout` walks that the other way: given which Keras tensor plays
each layout entry (the same alignment, run on the template's layout), it gives one
:class:`Recipe` per PyTorch tensor of the template, saying which Keras tensors it is made of and
how, and the tensors it cannot make, with the reason. :func:`apply_recipe` computes the value.

Every forward operation has an exact inverse here, so a restore followed by this gives back the
PyTorch file bit for bit: a transpose is undone by the inverse permutation, a gate reorder by the
inverse order, a split by concatenating its parts in order, a stacked GRU bias by its two rows,
a reshape by the reshape back. The one forward operation without an inverse is the LSTM bias
``bias_ih + bias_hh`` (Keras keeps only the sum): those tensors stay unresolved. Pure: names,
specs and NumPy arrays, no file and no framework.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np

from ..core.specs import KIND_BOOKKEEPING, VariableInfo
from .layouts import Layout, LayoutEntry
from .tensorops import Reshape, Split, glob_escape, unit_axis_op

__all__ = ["Piece", "Recipe", "invert_layout", "apply_recipe"]


@dataclass(frozen=True)
class Piece:
    """One Keras tensor that feeds a PyTorch tensor.

    Attributes:
        name: the Keras tensor's name (as the sources give it).
        shape: its shape.
        entry: the layout entry it plays (its shape is the layout's, before any reshape).
        split: for a fused Keras tensor that several layout entries joined into (a ``qkv``
            kernel where the template has ``q_proj``, ``k_proj``, ``v_proj``): the
            :class:`~ckptmerge.alignment.tensorops.Split` taking this entry's part back, else None.
    """

    name: str
    shape: Tuple[int, ...]
    entry: LayoutEntry
    split: Optional[Split] = None

    @property
    def part_shape(self) -> Tuple[int, ...]:
        """The shape of this piece's part of the Keras tensor (the whole shape without a split)."""
        return self.split.output_shape(self.shape) if self.split is not None else tuple(self.shape)

    @property
    def reshape(self) -> Optional[Any]:
        """The reshape from the Keras shape (of its part) back to the layout entry's (a
        :class:`~ckptmerge.alignment.tensorops.Squeeze` or :class:`~ckptmerge.alignment.tensorops.ExpandDims`
        when one unit axis differs), or None when they agree."""
        want = tuple(self.entry.info.shape)
        have = self.part_shape
        if have == want:
            return None
        unit = unit_axis_op(glob_escape(self.name), have, want)
        if unit is not None:
            return unit
        # the forward reshape (layout entry -> Keras shape), undone
        return Reshape(glob_escape(self.name), have, source_shape=want).inverse()


@dataclass(frozen=True)
class Recipe:
    """How one PyTorch tensor of the template is made from Keras tensors.

    Attributes:
        info: the PyTorch tensor (name, shape, dtype as the template has them).
        op: the forward layout op it undoes: ``"copy"``, ``"transpose"``, ``"gates"``,
            ``"split"`` (its pieces are concatenated), ``"stack"`` (row ``index`` of one piece).
        pieces: the Keras tensors, in order.
        index: for ``"stack"``, which row (0: ``bias_ih``, 1: ``bias_hh``).
        note: what is done, for reports.
    """

    info: VariableInfo
    op: str
    pieces: Tuple[Piece, ...]
    index: int = 0
    note: str = ""

    @property
    def dtype(self) -> str:
        """The dtype the Keras tensors have (the first one's)."""
        return self.info.dtype


def _inverse_perm(perm: Sequence[int]) -> Tuple[int, ...]:
    return tuple(int(i) for i in np.argsort(perm))


def _unreorder(value: np.ndarray, order: Sequence[int]) -> np.ndarray:
    """Undo :func:`ckptmerge.alignment.layouts._reorder`: gate blocks of axis 0 back in place."""
    if not order or list(order) == list(range(len(order))):
        return value
    blocks = np.split(value, len(order), axis=0)
    back = _inverse_perm(order)
    return np.concatenate([blocks[i] for i in back], axis=0)


def invert_layout(layout: Layout, template: Sequence[VariableInfo], mapping: Mapping[str, str],
                  shapes: Mapping[str, Sequence[int]], splits: Optional[Mapping[str, Split]] = None
                  ) -> Tuple[Dict[str, Recipe], List[Tuple[str, str]]]:
    """The recipe of every template tensor whose layout entries all have a Keras tensor.

    Args:
        layout: ``torch_layout(template)``.
        template: the PyTorch tensors (``raw_key`` is the PyTorch name).
        mapping: ``{layout entry name: Keras tensor name}``, as alignment paired them.
        shapes: the Keras tensors' shapes by name.
        splits: ``{layout entry name: Split}`` for entries that are a part of a fused Keras
            tensor (the inverse of the :class:`~ckptmerge.alignment.tensorops.Concat` that joined them).

    Returns:
        ``(recipes by PyTorch name, [(PyTorch name, why it has none)])``. Bookkeeping tensors
        (``num_batches_tracked``) have no Keras counterpart and are left to the caller.

    Example:
        >>> from ckptmerge.alignment.layouts import torch_layout
        >>> t = [VariableInfo("fc.weight", (3, 5), "float32"), VariableInfo("fc.bias", (3,), "float32")]
        >>> recipes, missing = invert_layout(torch_layout(t), t, {"fc/kernel": "dense/kernel"},
        ...                                  {"dense/kernel": (5, 3)})
        >>> recipes["fc.weight"].note, missing
        ("'dense/kernel' (5, 3): transposed (in,out)->(out,in)", [('fc.bias', 'no Keras tensor was aligned with it (as fc/bias)')])
    """
    undecided = {name for name, _ in layout.undecided}
    uses: Dict[str, List[LayoutEntry]] = {}
    for e in layout.entries.values():
        for key in e.sources:
            uses.setdefault(key, []).append(e)
    recipes: Dict[str, Recipe] = {}
    missing: List[Tuple[str, str]] = []
    for info in template:
        key = info.raw_key
        entries = uses.get(key, [])
        if info.kind == KIND_BOOKKEEPING or any(e.info.kind == KIND_BOOKKEEPING for e in entries):
            continue
        slash = key.replace(".", "/")
        if slash in undecided or not entries:
            why = next((w for n, w in layout.undecided if n == slash), "the layout gives it no Keras counterpart")
            missing.append((key, why))
            continue
        absent = [e.info.name for e in entries if e.info.name not in mapping]
        if absent:
            missing.append((key, "no Keras tensor was aligned with it (as " + ", ".join(absent) + ")"))
            continue
        splits = splits or {}
        pieces = tuple(Piece(mapping[e.info.name], tuple(shapes[mapping[e.info.name]]), e, splits.get(e.info.name))
                       for e in entries)
        first = entries[0]
        if first.op == "sum":
            missing.append((key, f"Keras keeps only the sum {' + '.join(first.sources)} (as "
                                 f"{first.info.name}); the two PyTorch biases cannot be told apart"))
            continue
        if first.op == "split":
            pieces = tuple(sorted(pieces, key=lambda p: p.entry.perm[1]))
            names = ", ".join(f"{p.name!r}" for p in pieces)
            axis = first.perm[0]
            fused = first.note.split(" Conv1D ")[0].split(" Linear ")[0].split(" bias")[0]  # 'fused q,k,v'
            recipes[key] = Recipe(info, "split", pieces, note=f"{names} joined along axis {axis} ({fused})")
            continue
        (piece,) = pieces if len(pieces) == 1 else (None,)
        if piece is None:  # pragma: no cover - torch_layout gives one entry per tensor but for splits
            missing.append((key, "several layout entries come from it"))
            continue
        what = [f"{piece.name!r} {tuple(piece.shape)}"]
        if piece.split is not None:  # (a part of a fused Keras tensor)
            what.append(piece.split.describe(tuple(piece.shape)))
        if piece.reshape is not None:  # (a unit axis added or dropped is named so)
            what.append(piece.reshape.describe(piece.part_shape))
        index = 0
        if first.op == "transpose":
            what.append("transposed (in,out)->(out,in)" if len(first.perm) == 2 else
                        f"axes permuted {_inverse_perm(first.perm)} (Keras kernel -> PyTorch weight)")
        elif first.op == "gates":
            what.append("transposed, gates back in PyTorch order")
        elif first.op == "stack":
            index = first.sources.index(key)
            what.append(f"row {index} of the stacked bias, gates back in PyTorch order")
        elif first.op != "copy":  # pragma: no cover - every op of torch_layout is handled above
            missing.append((key, f"the layout op {first.op!r} has no inverse here"))
            continue
        recipes[key] = Recipe(info, first.op, pieces, index, ": ".join([what[0], ", ".join(what[1:])])
                              if len(what) > 1 else what[0])
    return recipes, missing


def _layout_value(piece: Piece, value: np.ndarray) -> np.ndarray:
    if piece.split is not None:
        value = piece.split.apply(np.asarray(value))
    reshape = piece.reshape
    return reshape.apply(value) if reshape is not None else np.asarray(value)


def apply_recipe(recipe: Recipe, values: Sequence[np.ndarray]) -> np.ndarray:
    """The PyTorch tensor's value from its pieces' Keras values (in ``recipe.pieces`` order).

    Example:
        >>> from ckptmerge.alignment.layouts import torch_layout
        >>> t = [VariableInfo("fc.weight", (2, 3), "float32"), VariableInfo("fc.bias", (2,), "float32")]
        >>> r, _ = invert_layout(torch_layout(t), t, {"fc/kernel": "k", "fc/bias": "b"}, {"k": (3, 2), "b": (2,)})
        >>> apply_recipe(r["fc.weight"], [np.arange(6.0).reshape(3, 2)]).tolist()
        [[0.0, 2.0, 4.0], [1.0, 3.0, 5.0]]
    """
    arrays = [_layout_value(p, v) for p, v in zip(recipe.pieces, values)]
    op, entry = recipe.op, recipe.pieces[0].entry
    if op == "copy":
        out = arrays[0]
    elif op == "transpose":
        out = np.transpose(arrays[0], _inverse_perm(entry.perm))
    elif op == "gates":
        out = _unreorder(np.transpose(arrays[0], _inverse_perm(entry.perm)), entry.order)
    elif op == "stack":
        out = _unreorder(arrays[0][recipe.index], entry.order)
    elif op == "split":  # each piece: (axis, index, parts); a Linear's rows were transposed
        axis = entry.perm[0]
        parts = [a.T if a.ndim == 2 and axis == 0 else a for a in arrays]
        out = np.concatenate(parts, axis=axis)
    else:  # pragma: no cover - invert_layout makes no other op
        raise ValueError(f"unknown recipe op {op!r}")
    return np.ascontiguousarray(out)
