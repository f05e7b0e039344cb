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

A source's ``map`` and ``regex`` rules may name the template's tensors in PyTorch's spelling:
:func:`template_views` reads every target they give as the template's (:class:`TemplateNames`),
before anything is paired, and reports each one the template does not have with "did you mean".
A Keras tensor named for a template tensor whose shape or dtype is not the one its layout needs is
a mismatch (``TorchInverseHandle.mismatched``), never transposed or reshaped to fit.

:func:`torch_inverse` returns a :class:`TorchInverseHandle`: a source whose names are the
template's PyTorch names and whose values are computed from the Keras tensors as they are written.
The merge then plans the template's tensors against it as against any source, so strictness,
``allow_missing``, casts, the report and the atomic safetensors publish are the merge's own.
"""

from __future__ import annotations

import dataclasses
import math
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np

from ..alignment.inverse import Recipe, apply_recipe, invert_layout
from ..alignment.layouts import torch_layout
from ..alignment.tensorops import glob_escape
from ..core.errors import PlanError, RuleError, did_you_mean_text, suggest
from ..planning.fusion import concat_entries_of
from ..planning.planner import Plan, SourceView, make_plan
from ..planning.rulekinds import GlobFilter, MapRule, RegexRule
from ..planning.rules import Rules
from ..planning.suggestion import aligned_views
from ..planning.transforms import cast_array
from ..planning.chains import chain_apply, select
from ..sources.source import Source
from ..sources.handles import SourceHandle
from ..core.specs import KIND_BOOKKEEPING, KIND_VARIABLE, VariableInfo, by_name
from ..core.text import escape_name, plural, quote_name

__all__ = ["TorchInverseHandle", "torch_inverse", "TemplateNames", "TemplateRegex", "template_rules",
           "template_views", "template_globs",
           "TEMPLATE_VIEW_LABEL"]

#: The label the template's layout entries carry while they are aligned.
TEMPLATE_VIEW_LABEL = "template"


class TorchInverseHandle(SourceHandle):
    """The sources' Keras tensors seen under the PyTorch template's names (see the module docstring).

    Attributes:
        recipes: PyTorch name -> :class:`~ckptmerge.alignment.inverse.Recipe`.
        unresolved: ``{PyTorch name: why no value is made for it}``.
        keras_plan: the plan of the sources' own tensors (which source gives each Keras name).
        mismatched: ``{PyTorch name: why}`` of the template tensors a Keras tensor of another shape
            or dtype was named for (also in ``unresolved``).
    """

    def __init__(self, label: str, recipes: Dict[str, Recipe], bookkeeping: Dict[str, VariableInfo],
                 unresolved: Dict[str, str], keras_plan: Plan, handles: Sequence[SourceHandle],
                 template: Any = None) -> None:
        infos = [VariableInfo(n, r.info.shape, _keras_dtype(r, keras_plan), n, KIND_VARIABLE,
                              sum(keras_plan.assignments[p.name].spec.nbytes * math.prod(p.part_shape)
                                  // max(math.prod(p.shape), 1) for p in r.pieces))
                 for n, r in recipes.items()]
        infos += [VariableInfo(n, v.shape, v.dtype, n, KIND_VARIABLE, v.nbytes) for n, v in bookkeeping.items()]
        notes = {n: f"from {r.note}{_renamed(r, keras_plan)}" for n, r in recipes.items()}
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
        self.mismatched: Dict[str, str] = {}  # (set by torch_inverse)

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

    def check_mismatches(self, strict: bool, on_shape_mismatch: str, output: str) -> None:
        """Raise one :class:`~ckptmerge.core.errors.PlanError` listing every template tensor a Keras
        tensor of another shape or dtype was named for, where a strict merge that does not skip
        mismatches is asked for (a mismatch blocks it as in the forward direction)."""
        if not self.mismatched or not strict or on_shape_mismatch != "error":
            return
        lines = [f"  - {quote_name(n)}: {why}" for n, why in sorted(self.mismatched.items())]
        more = [f"  ... and {len(lines) - 20} more"] if len(lines) > 20 else []
        raise PlanError("\n".join([f"{plural(len(lines), 'template tensor')} with a Keras tensor of another shape or "
                                   "dtype named for it (strict=True):", *lines[:20], *more,
                                   f"Nothing was written to {quote_name(output)}."]), plan=self.keras_plan)

    def allow_mismatched(self, allow_missing: Any) -> Any:
        """``allow_missing`` with the mismatched template tensors added (``on_shape_mismatch='skip'``:
        each is left as the template has it, or out); a value of the wrong type is kept for the
        plan to reject."""
        if not self.mismatched or not isinstance(allow_missing, (str, list, tuple)):
            return allow_missing
        given = [allow_missing] if isinstance(allow_missing, str) else list(allow_missing)
        return [*given, *map(glob_escape, sorted(self.mismatched))]

    def why(self, name: str, default: str) -> str:
        """Why the template tensor ``name`` has no value from the sources (``default`` if not known)."""
        return self.unresolved.get(name, default)


def _include_hints(keras_plan: Plan, views: Sequence[SourceView], template_names: Sequence[str]) -> Plan:
    """The sources' plan with each ``include`` that selects none of a source's tensors but some of
    the template's names saying so: include and exclude select the sources' own (Keras) names."""
    hints = {}
    for u in keras_plan.unmatched_rules:
        if u.kind != "include":
            continue
        view = next((v for v in views if v.label == u.source), None)
        globs = view.rules.include if view is not None else ()
        glob = next((g for g in globs if u.rule == f"include {quote_name(g.pattern)}"), None)
        hits = sorted(set(glob.select(template_names))) if glob is not None else []
        if hits:
            hints[id(u)] = dataclasses.replace(u, reason=(
                f"{u.reason}; it matches {plural(len(hits), 'name')} of the template (e.g. {quote_name(hits[0])}), but "
                "include and exclude select the sources' own tensors (the Keras side): name the template's tensors "
                "in map or regex targets"))
    if not hints:
        return keras_plan
    return dataclasses.replace(keras_plan, unmatched_rules=[hints.get(id(u), u) for u in keras_plan.unmatched_rules])


def _renamed(recipe: Recipe, keras_plan: Plan) -> str:
    """``"; 'k' is A:'name' by <rule>"`` for each piece a source's rules renamed (or nothing)."""
    out = ""
    for p in recipe.pieces:
        a = keras_plan.assignments[p.name]
        if a.name != p.name:
            out += f"; {quote_name(p.name)} is {a.source}:{quote_name(a.name)}" + (f" by {a.rule}" if a.rule else "")
    return out


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
    keras_plan = _include_hints(keras_plan, views, [*(v.raw_key for v in template), *layout.entries])
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
    # A Keras tensor named for a template entry (by a rule, or as it is) whose shape or dtype is not
    # the entry's is a mismatch: neither is given to alignment, so no other tensor takes the entry
    # and the named one is never transposed or reshaped to fit.
    named = {m.name: m for m in pairing.mismatched}
    if named:
        claimed = {m.target for m in named.values()}
        keras = [t for t in keras if t.name not in claimed]
        view = dataclasses.replace(view, variables=by_name([e for e in entries if e.name not in named]))
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
    infos = {info.raw_key: info for info in template}
    mismatched = {}
    for entry, m in sorted(named.items()):
        for key in layout.entries[entry].sources:
            mismatched.setdefault(key, _mismatch_text(m, layout.entries[entry], infos[key], keras_plan))
    unresolved.update(mismatched)
    bookkeeping = {}
    for info in template:
        if info.raw_key in recipes or info.raw_key in unresolved:
            continue
        bookkeeping[info.raw_key] = info
    label = handles[0].label if len(handles) == 1 else "+".join(h.label for h in handles)
    handle = TorchInverseHandle(label, recipes, bookkeeping, unresolved, keras_plan, handles, template_reader)
    handle.mismatched = mismatched
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


def _mismatch_text(m: Any, entry: Any, info: VariableInfo, keras_plan: Plan) -> str:
    """Why a template tensor gets nothing from the Keras tensor named for it (a pairing's
    :class:`~ckptmerge.planning.findings.Mismatch`: its target is the Keras tensor, its checkpoint
    name the layout entry)."""
    a = keras_plan.assignments[m.target]
    what = {"shape": "shape", "dtype": "dtype"}.get(m.kind, "shape and dtype")
    named = f" (named {quote_name(m.target)} by {a.rule})" if a.rule else ""
    how = f" (its layout: {entry.note})" if entry.note else ""
    fix = ("Pass cast=True to convert it" if what == "dtype" else
           "It is not transposed or reshaped to fit: fix the rule, or give the source a cm.Transpose or cm.Reshape")
    return (f"{what} mismatch: {a.source}:{quote_name(a.name)}{named} is {tuple(m.target_shape)} {m.target_dtype}; "
            f"layout 'torch' makes PyTorch's {quote_name(info.raw_key)} {tuple(info.shape)} of a Keras "
            f"{quote_name(m.name)} {tuple(m.source_shape)} {m.source_dtype}{how}. {fix}; or pass "
            "on_shape_mismatch='skip' to leave it out")


class TemplateNames:
    """How the inverse direction reads a rule's target as one of the template's tensors.

    A rule (a ``map`` target, or what a ``regex`` makes of a name) may name a template tensor as
    PyTorch saved it (``encoder.layer.0.attention.self.query.weight``), by the name the template's
    layout gives it (``encoder/layer/0/attention/self/query/kernel``, what the inverse pairs by),
    or as a dotted scope followed by the layout's path below it
    (``encoder.layer.0.attention/self/query/kernel``, what a dotted scope entry of a map makes).
    :meth:`resolve` turns each of those into the layout's name. A target in PyTorch's spelling
    (with a ``.``) that names no template tensor is a problem, with "did you mean"; so is a
    PyTorch name spelled with ``/`` (``.../query/weight``: the layout's name ends in ``kernel``), a
    fused tensor the layout makes several tensors of, a bookkeeping tensor and one the layout cannot
    decide. Other targets (Keras names, for alignment to pair) are kept as they are.

    Example:
        >>> names = TemplateNames(torch_layout([VariableInfo("fc.weight", (2, 3), "float32")]))
        >>> names.resolve("fc.weight"), names.resolve("dense/kernel")
        (('fc/kernel', ''), (None, ''))
        >>> names.resolve("fc.wieght")[1]
        "names no tensor of the template. Did you mean 'fc.weight'?"
    """

    def __init__(self, layout: Any) -> None:
        self.entries = layout.entries
        self.made: Dict[str, List[str]] = {}
        for name, e in layout.entries.items():
            for key in e.sources:
                self.made.setdefault(key, []).append(name)
        self.undecided = dict(layout.undecided)

    def resolve(self, target: str) -> Tuple[Optional[str], str]:
        """``(the layout's name, "")``; ``(None, "")`` for a name to keep as it is; ``(None, why)``
        for a name that cannot be read as the template's (``why`` completes "the rule's target ...")."""
        if target in self.entries:
            return target, ""
        outputs = self.made.get(target)
        if outputs:
            if len(outputs) > 1:
                return None, (f"the template's {quote_name(target)} is made of {len(outputs)} tensors by layout "
                              f"'torch' ({', '.join(map(quote_name, sorted(outputs)))}); map one Keras tensor onto "
                              "each of those names instead")
            if self.entries[outputs[0]].info.kind == KIND_BOOKKEEPING:
                return None, (f"{quote_name(target)} is PyTorch bookkeeping (a BatchNorm's counter): the merge writes "
                              "it from the template (or as 0), never from a Keras tensor; leave it out of the rule")
            return outputs[0], ""
        slash, dotted = target.replace(".", "/"), target.replace("/", ".")
        if "." in target and slash in self.entries:
            return slash, ""
        if slash in self.undecided:
            return None, f"layout 'torch' cannot decide how to write {quote_name(dotted)}: {self.undecided[slash]}"
        if dotted in self.made:
            ours = sorted(self.made[dotted])
            return None, (f"spells the template's {quote_name(dotted)} with '/', but layout 'torch' names that tensor "
                          f"{' and '.join(map(quote_name, ours))}.{did_you_mean_text([*ours, dotted])}")
        if "." in target:
            close = suggest(target, self.made) or suggest(slash, self.entries)
            return None, "names no tensor of the template." + (did_you_mean_text(close) or (
                " A name with '.' is read as PyTorch's; 'ckptmerge ls' on the template lists its names"))
        return None, ""

    def resolve_scope(self, target: str) -> Tuple[Optional[str], str]:
        """:meth:`resolve` for a map's scope target (``encoder.layer.0.``: ``encoder/layer/0/``)."""
        if not target.endswith("."):
            return None, ""
        if any(k.startswith(target) for k in self.made):
            return target.replace(".", "/"), ""
        scopes = {k[:i + 1] for k in self.made for i, c in enumerate(k) if c == "."}
        return None, "names no scope of the template." + did_you_mean_text(suggest(target, scopes))


@dataclass(frozen=True)
class TemplateRegex(RegexRule):
    """A source's regex rule in the inverse direction: what it makes of a name is read as the
    template's (:meth:`TemplateNames.resolve`: the layout's name for a PyTorch name). Reports show
    the user's rule as written.

    Attributes:
        names: ``{what the rule makes: the layout's name}``, for the outputs that differ.
    """

    names: Mapping[str, str] = field(default_factory=dict, compare=False, repr=False)

    def expand(self, match: Any) -> Optional[str]:
        """The replacement for a match, as the template names it."""
        out = super().expand(match)
        return None if out is None else self.names.get(out, out)


def template_rules(rules: Rules, layout: Any, *, names: Sequence[str] = (), label: str = "") -> Rules:
    """A source's rules with each target that names the template in PyTorch's own terms turned into
    the name the template's layout gives it, the name the inverse pairs by (see
    :class:`TemplateNames` for the spellings read).

    ``map`` targets are turned as written; what the ``regex`` rules make of the source's ``names``
    (the names the view selected) is turned name by name (:class:`TemplateRegex`). Other targets
    (Keras names for alignment to pair) are kept as they are.

    Raises:
        RuleError: listing every target that cannot be read as the template's: a PyTorch name the
            template does not have (with "did you mean"), a PyTorch name spelled with ``/``, a
            fused tensor the layout makes several tensors of (a ``c_attn.weight``: its query, key
            and value each need a Keras tensor of their own), bookkeeping, an undecided tensor.

    Example:
        >>> lay = torch_layout([VariableInfo("fc.weight", (2, 3), "float32")])
        >>> template_rules(Rules.from_options(map={"dense/kernel": "fc.weight"}), lay).maps[0].target
        'fc/kernel'
        >>> r = template_rules(Rules.from_options(regex=[("d/(.*)", r"fc.\\1")]), lay, names=["d/weight"])
        >>> r.apply(["d/weight"]).mapping
        {'d/weight': ('fc/kernel',)}
    """
    if not rules.renames:
        return rules
    known = TemplateNames(layout)
    where = f" in source {quote_name(label)}" if label else ""
    problems: List[str] = []
    maps = []
    for m in rules.maps:
        target, why = known.resolve_scope(m.target) if m.is_scope else known.resolve(m.target)
        if why:
            problems.append(f"map entry {quote_name(m.source)} -> {quote_name(m.target)}{where}: {why}")
        maps.append(m if target is None or target == m.target else MapRule(m.source, target))
    regexes = rules.regexes
    if regexes and names:
        res = rules.apply(names)
        made: Dict[str, Tuple[str, str]] = {}  # what a regex makes -> (the rule, one name it makes it of)
        for (name, out), rule in res.via.items():
            if isinstance(rule, RegexRule):
                made.setdefault(out, (rule.describe(), name))
        for amb in res.ambiguous:
            for out, rule_text in zip(amb.targets, amb.rules):
                if out is not None:
                    made.setdefault(out, (rule_text, amb.name))
        turned: Dict[str, str] = {}
        for out, (rule_text, name) in sorted(made.items()):
            target, why = known.resolve(out)
            if why:
                problems.append(f"{rule_text}{where} makes {quote_name(out)} of {quote_name(name)}: {why}")
            elif target is not None and target != out:
                turned[out] = target
        if turned:
            regexes = tuple(TemplateRegex(r.pattern, r.replacement, names=turned) for r in regexes)
    if problems:
        head = ("A rule's target names the template wrongly" if len(problems) == 1 else
                f"{len(problems)} rule targets name the template wrongly")
        shown = [f"  - {escape_name(p)}" for p in problems[:20]]
        if len(problems) > 20:
            shown.append(f"  ... and {len(problems) - 20} more")
        raise RuleError("\n".join([f"{head} (layout 'torch' reads a target as the template's PyTorch name, "
                                    "'encoder.layer.0.output.dense.weight', or as its own name for it, "
                                    "'encoder/layer/0/output/dense/kernel'):", *shown]))
    return dataclasses.replace(rules, maps=tuple(dict.fromkeys(maps)), regexes=regexes)


def template_views(handles: Sequence[SourceHandle], layout: Any) -> List[SourceView]:
    """Each source's view with its rules read against the template (:func:`template_rules`).

    Raises:
        RuleError: every rule of every source that names the template wrongly, at once.
    """
    views, problems = [], []
    for h in handles:
        view = h.view(h.source.rules(None))
        try:
            rules = template_rules(view.rules, layout, names=list(view.variables), label=h.label)
        except RuleError as e:
            problems.append(str(e))
            continue
        views.append(view if rules is view.rules else dataclasses.replace(view, rules=rules))
    if problems:
        raise RuleError("\n".join(problems) + "\nNothing was written.")
    return views


def template_globs(allow_missing: Any, layout: Any, template: Sequence[VariableInfo]) -> Any:
    """``allow_missing`` over the template's PyTorch names, a glob written in the layout's converted
    spelling (``classifier/*``) standing for the PyTorch names of the tensors it matches
    (``classifier.weight``, ``classifier.bias``). A glob that matches a PyTorch name is kept as it
    is; one that matches neither is kept for the plan to report; a value of the wrong type too.

    Example:
        >>> lay = torch_layout([VariableInfo("fc.weight", (2, 3), "float32")])
        >>> template_globs(["fc/*", "x.*"], lay, [VariableInfo("fc.weight", (2, 3), "float32")])
        ['fc.weight', 'x.*']
    """
    if not isinstance(allow_missing, (str, list, tuple)) or not all(isinstance(g, str) for g in allow_missing):
        return allow_missing
    globs = [allow_missing] if isinstance(allow_missing, str) else list(allow_missing)
    names = [t.name for t in template]
    out: List[str] = []
    for pattern in globs:
        try:
            glob = GlobFilter(pattern)
        except RuleError:
            out.append(pattern)  # (the plan says what is wrong with it)
            continue
        converted = [] if glob.select(names) else glob.select(list(layout.entries))
        keys = sorted({k for e in converted for k in layout.entries[e].sources})
        out.extend(map(glob_escape, keys) if keys else [pattern])
    return out


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
