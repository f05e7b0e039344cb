"""The inverse direction: a merge that writes Keras/TF weights under a PyTorch template's names.

``cm.merge(sources, "out.safetensors", layout="torch", template="hf/model.safetensors")`` turns
the forward transfer around. The template (a PyTorch ``state_dict`` as a file, a
``save_pretrained`` folder, or a list of :class:`~ckptmerge.VariableInfo`) is read through
:func:`~ckptmerge.alignment.layouts.torch_layout`, exactly as a ``Source(layout="torch")`` is; the
sources' tensors are matched with its entries by the same planner and the same structural
alignment a forward restore runs (the Keras tensors play the targets, the layout entries the
checkpoint names, with the sources' creation order as evidence); then
:func:`~ckptmerge.alignment.inverse.invert_layout` undoes every layout operation and reshape.
What alignment leaves unpaired stays unresolved, with the reason: never a guess.

:func:`torch_inverse` returns a :class:`TorchInverseHandle`: a source whose names are the
template's PyTorch names and whose values are computed from the Keras tensors as they are written.
The merge then plans the template's tensors against it as against any source, so strictness,
``allow_missing``, casts, the report and the atomic safetensors publish are the merge's own.
"""

from __future__ import annotations

import dataclasses
import math
from collections import Counter
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

from ..alignment.inverse import Recipe, apply_recipe, invert_layout
from ..alignment.layouts import torch_layout
from ..planning.fusion import concat_entries_of
from ..planning.planner import Plan, SourceView, make_plan
from ..errors import RuleError
from ..planning.rulekinds import MapRule
from ..planning.rules import Rules
from ..planning.suggestion import aligned_views
from ..planning.transforms import cast_array, chain_apply, select
from ..sources.source import Source, SourceHandle
from ..specs import KIND_BOOKKEEPING, KIND_VARIABLE, VariableInfo, by_name
from ..text import quote_name

__all__ = ["TorchInverseHandle", "torch_inverse", "template_rules", "TEMPLATE_VIEW_LABEL"]

#: The label the template's layout entries carry while they are aligned.
TEMPLATE_VIEW_LABEL = "template"


class TorchInverseHandle(SourceHandle):
    """The sources' Keras tensors seen under the PyTorch template's names (see the module docstring).

    Attributes:
        recipes: PyTorch name -> :class:`~ckptmerge.alignment.inverse.Recipe`.
        unresolved: ``{PyTorch name: why no value is made for it}``.
        keras_plan: the plan of the sources' own tensors (which source gives each Keras name).
    """

    def __init__(self, label: str, recipes: Dict[str, Recipe], bookkeeping: Dict[str, VariableInfo],
                 unresolved: Dict[str, str], keras_plan: Plan, handles: Sequence[SourceHandle],
                 template: Any = None) -> None:
        infos = [VariableInfo(n, r.info.shape, _keras_dtype(r, keras_plan), n, KIND_VARIABLE,
                              sum(keras_plan.assignments[p.name].spec.nbytes * math.prod(p.part_shape)
                                  // max(math.prod(p.shape), 1) for p in r.pieces))
                 for n, r in recipes.items()]
        infos += [VariableInfo(n, v.shape, v.dtype, n, KIND_VARIABLE, v.nbytes) for n, v in bookkeeping.items()]
        notes = {n: f"from {r.note}" for n, r in recipes.items()}
        for n in bookkeeping:
            notes[n] = ("bookkeeping: the template's own value" if template is not None
                        else "bookkeeping: written as 0, PyTorch's value for a fresh module")
        super().__init__(Source.from_values({}, name=label), "<layout torch>", "Keras tensors under PyTorch names",
                         sorted(infos, key=lambda v: v.name), notes)
        self.recipes = recipes
        self.bookkeeping = bookkeeping
        self.unresolved = unresolved
        self.keras_plan = keras_plan
        self._handles = {h.label: h for h in handles}
        self._views = {v.label: v for v in keras_plan.sources}
        self._template = template

    def keras_value(self, name: str) -> np.ndarray:
        """One Keras tensor's value as the sources give it (their casts and transforms applied)."""
        a = self.keras_plan.assignments[name]
        value = np.asarray(self._handles[a.source].read([a.name])[a.name])
        if a.cast:
            value = cast_array(value, a.target_spec.dtype)
        ts = select(self._views[a.source].transforms, name)
        if ts:
            value = chain_apply(ts, value, None, target_shape=a.target_spec.shape)
        return value

    def read(self, names: Sequence[str]) -> Dict[str, Any]:
        """The named PyTorch tensors, each made from its Keras tensors."""
        out: Dict[str, Any] = {}
        for n in names:
            r = self.recipes.get(n)
            if r is not None:
                out[n] = apply_recipe(r, [self.keras_value(p.name) for p in r.pieces])
            elif self._template is not None:
                out[n] = np.asarray(self._template.get(n))
            else:
                spec = self.bookkeeping[n]
                out[n] = np.zeros(spec.shape, dtype=spec.dtype)
        return out

    def why(self, name: str, default: str) -> str:
        """Why the template tensor ``name`` has no value from the sources (``default`` if not known)."""
        return self.unresolved.get(name, default)


def _keras_dtype(recipe: Recipe, keras_plan: Plan) -> str:
    return keras_plan.assignments[recipe.pieces[0].name].target_spec.dtype


def _floating(dtype: str) -> bool:
    return dtype.startswith(("float", "bfloat")) or dtype in ("half", "double")


def torch_inverse(handles: Sequence[SourceHandle], views: Sequence[SourceView], keras_specs: Sequence[VariableInfo],
                  template: Sequence[VariableInfo], *, template_reader: Any = None, template_label: str = "",
                  on_conflict: str = "error", cast: bool = False, layout: Any = None) -> Tuple[TorchInverseHandle, Plan]:
    """Match the sources' Keras tensors with a PyTorch template and make the inverse handle.

    Args:
        handles, views: the opened sources and their views (rules applied).
        keras_specs: the Keras tensors the sources give (each name once, as a merge without a
            template would write them).
        template: the PyTorch tensors (names with ``.``, shapes and dtypes as PyTorch saved them).
        template_reader: the template checkpoint's reader, when it has values (bookkeeping tensors
            such as ``num_batches_tracked`` are then copied from it; else written as 0).
        template_label: how reports name the template.
        on_conflict: as for the merge, between sources giving one Keras name.
        cast: the merge's ``cast``: floating tensors of another precision than the template's are
            aligned as if they had the Keras dtype (the merge then casts them).
        layout: ``torch_layout(template)``, where the caller has it already.

    Returns:
        ``(handle, keras_plan)``: the handle to plan the template against, and the plan of the
        sources' own tensors (check it: conflicts between sources are its findings).

    Example:
        >>> handle, keras_plan = torch_inverse(handles, views, specs, template)   # doctest: +SKIP
        >>> sorted(handle.unresolved)                                              # doctest: +SKIP
        ['lm_head.weight']
    """
    keras_plan = make_plan(keras_specs, views, on_conflict=on_conflict, cast=cast)
    keras = [t for t in keras_specs if t.name in keras_plan.assignments]
    shapes = {t.name: tuple(t.shape) for t in keras}
    layout = torch_layout(template) if layout is None else layout
    entries = [e.info for e in layout.entries.values() if e.info.kind != KIND_BOOKKEEPING]
    if cast:  # align across precisions: the template's floats as the Keras side's usual float
        floats = Counter(t.dtype for t in keras if _floating(t.dtype))
        if floats:
            common = floats.most_common(1)[0][0]
            entries = [VariableInfo(e.name, e.shape, common, e.raw_key, e.kind, e.nbytes) if _floating(e.dtype) else e
                       for e in entries]
    view = SourceView(TEMPLATE_VIEW_LABEL, template_label, "the template through layout 'torch'", by_name(entries),
                      Rules.from_options())
    pairing = make_plan(keras, [view])
    if pairing.missing:
        order, inputs = _creation_order(handles, keras_plan)
        aligned = aligned_views(pairing, [view], [True], target_order=order, source_orders=[None],
                                target_inputs=inputs)
        pairing = make_plan(keras, aligned)
        view = aligned[0]
    mapping = {a.name: a.target for a in pairing.assignments.values()}
    splits = _fused_parts(view, mapping, layout, shapes)
    mapping.update({part: mapping[joined] for joined, parts in view.composed.items() if joined in mapping
                    for part in parts})
    recipes, missing = invert_layout(layout, template, mapping, shapes, splits)
    unresolved = {name: why for name, why in missing}
    left = [t for t in keras if t.name not in set(mapping.values())]
    for name, why in missing:
        if why.startswith("no Keras tensor"):
            unresolved[name] = why + _candidates(layout, name, left)
    bookkeeping = {}
    for info in template:
        if info.raw_key in recipes or info.raw_key in unresolved:
            continue
        bookkeeping[info.raw_key] = info
    label = handles[0].label if len(handles) == 1 else "+".join(h.label for h in handles)
    handle = TorchInverseHandle(label, recipes, bookkeeping, unresolved, keras_plan, handles, template_reader)
    return handle, keras_plan


def _fused_parts(view: SourceView, mapping: Dict[str, str], layout: Any,
                 keras_shapes: Dict[str, Tuple[int, ...]]) -> Dict[str, Any]:
    """``{layout entry: Split}`` for the entries alignment joined into one fused Keras tensor (a
    Concat of :mod:`~ckptmerge.planning.fusion`, applied only where it is the one candidate): each
    entry's part is split back out of the Keras tensor."""
    out: Dict[str, Any] = {}
    for c in concat_entries_of(view):
        if c.name in mapping:
            shapes = [tuple(layout.entries[p].info.shape) for p in c.sources]
            c = dataclasses.replace(c, axis=c.axes(shapes, keras_shapes[mapping[c.name]])[0])
            out.update(zip(c.sources, c.inverse(shapes)))
    return out


def template_rules(rules: Rules, layout: Any) -> Rules:
    """A source's rules with each ``map`` target that names the template in PyTorch's own terms
    turned into the name the template's layout gives it, the name the inverse pairs by.

    A target may be a template tensor's raw key (``encoder.layer.0.attention.self.query.weight``:
    the one tensor the layout makes of it, ``encoder/layer/0/attention/self/query/kernel``) or a
    dotted scope of raw keys (``encoder.layer.0.``: ``encoder/layer/0/``), as well as the
    layout's own names. Other targets (Keras names for alignment to pair) are kept as they are.

    Raises:
        RuleError: a target is a PyTorch tensor the layout makes several tensors of (a fused
            ``c_attn.weight``: its query, key and value); each needs a Keras tensor of its own.

    Example:
        >>> lay = torch_layout([VariableInfo("fc.weight", (2, 3), "float32")])
        >>> template_rules(Rules.from_options(map={"dense/kernel": "fc.weight"}), lay).maps[0].target
        'fc/kernel'
    """
    if not any("." in m.target for m in rules.maps):
        return rules
    made: Dict[str, List[str]] = {}
    for name, e in layout.entries.items():
        for key in e.sources:
            made.setdefault(key, []).append(name)
    maps = []
    for m in rules.maps:
        target = m.target
        if target not in layout.entries:
            outputs = made.get(target, ())
            if len(outputs) > 1:
                raise RuleError(f"map entry {quote_name(m.source)} -> {quote_name(target)}: the template's "
                                f"{quote_name(target)} is made of {len(outputs)} tensors by layout 'torch' "
                                f"({', '.join(map(quote_name, sorted(outputs)))}); map one Keras tensor onto each "
                                "of those names instead.")
            if outputs:
                target = outputs[0]
            elif target.endswith(".") and any(k.startswith(target) for k in made):
                target = target.replace(".", "/")
        maps.append(m if target == m.target else MapRule(m.source, target))
    return dataclasses.replace(rules, maps=tuple(dict.fromkeys(maps)))


def _candidates(layout: Any, key: str, left: Sequence[VariableInfo]) -> str:
    """``"; Keras tensors of its size nothing took: 'a', 'b'"`` (or nothing)."""
    sizes = {int(np.prod(e.info.shape)) for e in layout.entries.values() if key in e.sources}
    names = [t.name for t in left if int(np.prod(t.shape)) in sizes]
    if not names:
        return "; no Keras tensor of its size is left"
    more = f" and {len(names) - 5} more" if len(names) > 5 else ""
    return "; Keras tensors of its size nothing took: " + ", ".join(map(quote_name, names[:5])) + more


def _creation_order(handles: Sequence[SourceHandle], keras_plan: Plan
                    ) -> Tuple[Optional[List[str]], Optional[Dict[str, Tuple[str, ...]]]]:
    """The Keras tensors' names in the sources' creation (or saving) order, and per tensor the
    tensors of the layer feeding its layer, where the sources record them (a live model), under
    the names the sources give them."""
    out: List[str] = []
    inputs: Dict[str, Tuple[str, ...]] = {}
    by_source: Dict[Tuple[str, str], str] = {(a.source, a.name): t for t, a in keras_plan.assignments.items()}
    for h in handles:
        order = h.order
        if order:
            out += [by_source[(h.label, n)] for n in order if (h.label, n) in by_source]
        for n, feeding in (getattr(h.source, "inputs", None) or {}).items():
            if (h.label, n) in by_source:
                inputs[by_source[(h.label, n)]] = tuple(by_source[(h.label, f)] for f in feeding
                                                        if (h.label, f) in by_source)
    return list(dict.fromkeys(out)) or None, inputs or None


def template_specs(infos: Sequence[VariableInfo]) -> List[VariableInfo]:
    """The template's tensors as merge targets: every one of them, bookkeeping included (PyTorch's
    ``load_state_dict(strict=True)`` wants ``num_batches_tracked`` too), each keyed by its name."""
    return [VariableInfo(v.name, v.shape, v.dtype, v.name, KIND_VARIABLE, v.nbytes) for v in infos]


def describe_unresolved(handle: TorchInverseHandle, names: Sequence[str], limit: int = 20) -> List[str]:
    """One line per unresolved template tensor among ``names``."""
    lines = [f"  - {quote_name(n)}: {handle.unresolved[n]}" for n in names if n in handle.unresolved]
    if len(lines) > limit:
        lines = lines[:limit] + [f"  ... and {len(lines) - limit} more"]
    return lines
