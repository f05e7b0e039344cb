"""Suggestions: the map a plan would need, proposed by structural alignment, for review.

:func:`make_suggestion` takes a finished :class:`~ckptmerge.planning.planner.Plan` and, source by source,
aligns the targets still missing with the checkpoint names nothing took
(:func:`ckptmerge.alignment.align.align`), folding whole scopes into one entry. The :class:`Suggestion` is
for people: a text report, ``to_dict()`` for scripts, and ``to_config()`` / ``write(path)``, a
config file in the existing schema (:mod:`ckptmerge.config`) that ``ckptmerge check`` accepts and
``ckptmerge plan`` uses as it is: review it, edit it, commit it.
:func:`aligned_views` is what ``Source(..., align="structure")`` uses inside a plan: the same
alignment, keeping only what is unambiguous.

Pure: plans and specs in, no file access (``write`` writes the one file it is asked to), no TF.
"""

from __future__ import annotations

import dataclasses
import itertools
import operator
import os
from dataclasses import dataclass, field
from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

from ..alignment.align import (CONFIDENCE_FLOOR, Alignment, Entry, Unresolved, align, below_floor, match_columns,
                               scope_entries)
from ..alignment.conventions import position_offset, rewrite
from ..alignment.features import tokens
from ..alignment.tensorops import Reshape, glob_escape, unit_axis_op
from .fusion import compose_view, fused_proposals
from .splits import split_groups, split_proposals
from ..core.redact import redact, redacted_repr
from ..core.specs import VariableInfo
from ..core.text import escape_name
from .model import late
from .planner import Plan, SourceView
from .transforms import Slice

__all__ = ["SourceSuggestion", "Suggestion", "make_suggestion", "aligned_views", "alignable", "slice_proposals"]


@dataclass(frozen=True)
class SourceSuggestion:
    """What the suggestion proposes for one source.

    Attributes:
        label, path: the source's label and resolved path.
        entries: proposed map entries (scope-to-scope where a whole scope moves together); those
            that ``align="structure"`` would not apply are marked ``review`` (see :class:`Entry`).
        unresolved: targets the evidence cannot pair with one of its names.
        kept: ``{checkpoint name: target}`` the plan already assigns from this source.
    """

    __repr__ = redacted_repr  # (a REPL, a notebook or a log line shows no credential)

    label: str
    path: str
    entries: List[Entry] = field(default_factory=list)
    unresolved: List[Unresolved] = field(default_factory=list)
    kept: Dict[str, str] = field(default_factory=dict)
    #: the Concats ``align="structure"`` would apply (in the config's ``concat`` list, not its map)
    concats: List[Any] = field(default_factory=list)

    @property
    def n_variables(self) -> int:
        """Variables the proposed entries cover (those for review left out)."""
        return sum(e.count for e in self.entries if not e.review)

    @property
    def review(self) -> List[Entry]:
        """The entries proposed for review only (see :class:`Entry`)."""
        return [e for e in self.entries if e.review]

    def map(self) -> Dict[str, str]:
        """The source's ``map`` for a config: what the plan kept, plus the proposed entries that
        ``align="structure"`` would apply (an entry for review is left out: add it by hand once checked).

        Names the plan matched as they are stay so through a root entry ``{"/": "/"}``.
        """
        out: Dict[str, str] = {}
        if any(n == t for n, t in self.kept.items()):
            out["/"] = "/"
        for n, t in sorted(self.kept.items()):
            if n != t:
                out[n] = t
        joined = {c.name for c in self.concats}
        for e in self.entries:
            if not e.review and e.name not in joined:
                out[e.name] = e.target
        return out

    def to_dict(self) -> dict:
        """JSON-ready: label, path, map, entries, unresolved."""
        return {"label": redact(self.label), "path": redact(self.path), "map": self.map(),
                "entries": [e.to_dict() for e in self.entries],
                "unresolved": [{"targets": list(u.targets), "names": list(u.names),
                                "shape": list(u.shape), "dtype": u.dtype, "reason": u.reason}
                               for u in self.unresolved]}


@dataclass(frozen=True)
class Suggestion:
    """A proposed map per source, with evidence, confidence and what stays unresolved.

    Attributes:
        plan: the plan as it is without the suggestion.
        sources: one :class:`SourceSuggestion` per checkpoint source, in plan order.
        missing: targets that would still be missing with the suggestion applied.

    Example:
        >>> s = cm.suggest(model, [cm.Source("runs/tf1_dnn")])     # doctest: +SKIP
        >>> print(s.report()); s.write("warm.yaml")                  # doctest: +SKIP
    """

    __repr__ = redacted_repr  # (a REPL, a notebook or a log line shows no credential)

    plan: Plan
    sources: List[SourceSuggestion]
    missing: List[str]
    #: ``{source label: layout}`` of sources read through a layout (kept in :meth:`to_config`).
    layouts: Dict[str, str] = field(default_factory=dict)

    @property
    def n_proposed(self) -> int:
        """How many targets the proposed entries would restore."""
        return sum(s.n_variables for s in self.sources)

    def report(self, *, limit: Optional[int] = 50) -> str:
        """Plain text: per source the proposed entries with evidence, then unresolved names
        (see :func:`ckptmerge.render.report.render_suggestion`)."""
        return late("ckptmerge.render.report", "render_suggestion")(self, limit=limit)

    def __str__(self) -> str:
        return self.report()

    def to_dict(self) -> dict:
        """JSON-ready: ``{"n_proposed", "missing", "sources": [SourceSuggestion.to_dict()], "config"}``."""
        return {"n_proposed": self.n_proposed, "missing": list(self.missing),
                "sources": [s.to_dict() for s in self.sources], "config": self.to_config()}

    def to_config(self) -> dict:
        """A config (the :mod:`ckptmerge.config` schema) with every source and its proposed map.

        The plan's options (``allow_missing``, ``on_conflict``, ``on_shape_mismatch``, ``cast``)
        are kept; sources held in memory cannot be written to a file and are left out.

        Example:
            >>> cfg = suggestion.to_config(); cfg["sources"][0]["map"]   # doctest: +SKIP
            {'dnn/hiddenlayer_0/': 'h0/'}
        """
        sources = []
        for s in self.sources:
            if s.path == "<memory>":
                continue
            # a config expands '$' in paths: a literal one is written '$$', so it reloads as it is
            entry: Dict[str, Any] = {"name": redact(s.label), "path": redact(s.path).replace("$", "$$")}
            if s.label in self.layouts:  # the proposed names are the layout's: keep reading through it
                entry["layout"] = self.layouts[s.label]
            mapping = s.map()
            if mapping:
                entry["map"] = mapping
            if s.concats:
                entry["concat"] = [{"name": c.target, "sources": list(c.sources), "axis": c.axis} for c in s.concats]
            sources.append(entry)
        cfg: Dict[str, Any] = {"sources": sources}
        if self.plan.allow_missing:
            cfg["allow_missing"] = list(self.plan.allow_missing)
        for key, default in (("on_conflict", "error"), ("on_shape_mismatch", "error"), ("cast", False)):
            if getattr(self.plan, key) != default:
                cfg[key] = getattr(self.plan, key)
        return cfg

    def to_yaml(self) -> str:
        """:meth:`to_config` as YAML, with the evidence and unresolved names as comments.

        Everything in it may come from a checkpoint (names, dtypes, labels, paths): values are
        written by the YAML emitter, quoted where they need it, and each comment line is
        escaped whole (:func:`~ckptmerge.core.text.escape_name`), so no string can end a comment and
        start a key of its own (``"X\\nallow_missing: ['*']"`` as a dtype stays in its comment).
        """
        import yaml

        lines = ["Proposed by ckptmerge suggest (structural alignment). Review before use:",
                 "each map entry below was chosen from this evidence:"]
        for s in self.sources:
            for e in s.entries:
                lines.append(f"  {s.label}: {e.describe()}"
                             + (" (not in the map below: add it once checked)" if e.review else ""))
            for u in s.unresolved:
                lines.append(f"  {s.label}: UNRESOLVED {u.describe()}")
        if self.missing:
            lines.append(f"still missing: {', '.join(self.missing[:10])}"
                         + (f" ... and {len(self.missing) - 10} more" if len(self.missing) > 10 else ""))
        if any(redact(s.path) != s.path for s in self.sources):
            lines.append("credentials in a source URL are left out (***): give them through an environment "
                         "variable you allow (ckptmerge plan --allow-env NAME), never in the file")
        body = yaml.safe_dump(self.to_config(), sort_keys=False, default_flow_style=False, width=1000)
        return "".join(f"# {escape_name(line)}\n" for line in lines) + body

    def write(self, path: "os.PathLike[str] | str") -> str:
        """Write :meth:`to_yaml` to ``path``; returns the path.

        Example:
            >>> suggestion.write("warm.yaml")                        # doctest: +SKIP
            'warm.yaml'
        """
        path = os.fspath(path)
        with open(path, "w", encoding="utf-8") as f:
            f.write(self.to_yaml())
        return path

    def _repr_html_(self) -> str:
        return late("ckptmerge.render.notebook", "suggestion_html")(self)


def _left_out(rules: Any, name: str) -> bool:
    """True when the rules leave ``name`` out on purpose (include/exclude, a ``None`` regex), not
    merely because no ``map``/``regex`` entry covers it."""
    if rules.include and not any(g.matches(name) for g in rules.include):
        return True
    if any(g.matches(name) for g in rules.exclude):
        return True
    return any(r.try_rename(name) == (True, None) for r in rules.regexes)


_NAME = operator.attrgetter("name")


def _undecided(src: SourceView, name: str) -> bool:
    return any(name == u or name.startswith(u + "/") for u in src.undecided)


#: Why a tensor the layout could not decide stays unresolved.
TWO_READINGS = ("the layout cannot tell whether it is stored transposed (a Linear's (out, in)) or as it is "
                "(an Embedding): both readings fit; settle it with transforms=[cm.Transpose(target)] or a "
                "map onto an 'embeddings' target")


def undecided_groups(plan: Plan, src: SourceView, missing: Sequence[str]) -> List[Unresolved]:
    """One :class:`Unresolved` per 2-D tensor of ``src`` its layout left undecided, naming the
    missing targets it could fill as stored or transposed (both readings).

    Example:
        >>> from ckptmerge.planning.planner import make_plan
        >>> undecided_groups(make_plan([], []), SourceView("A", "<memory>", "", {}), [])
        []
    """
    want = set(missing)
    out = []
    for name in src.undecided:
        info = src.variables.get(name)
        if info is None or len(info.shape) != 2:
            continue
        shape = tuple(info.shape)
        fits = sorted(t.name for t in plan.targets if t.name in want and t.dtype == info.dtype
                      and tuple(t.shape) in (shape, shape[::-1]))
        if fits:
            out.append(Unresolved(tuple(fits), (name,), shape, info.dtype, TWO_READINGS))
    return out


def slice_proposals(plan: Plan, src: SourceView, missing: Sequence[str], used: Iterable[str] = ()) -> List[Entry]:
    """Entries for review: a missing target and an unused tensor of ``src`` whose shapes differ
    along one axis only (the tensor longer: a position table with padding rows, a head with more
    classes) and whose names share their words. Which rows belong in the target (the first ones, or
    the last ones after an offset such as RoBERTa's 2) no shape tells, so each is proposed for
    review only, with the ``cm.Slice`` of either reading; never applied by ``align="structure"``.
    Only a position table whose reserved rows the convention table names
    (:data:`~ckptmerge.alignment.conventions.POSITION_OFFSETS`: a ``roberta`` scope, 2 rows), and
    whose shapes differ by exactly those rows, is decided (``review`` False): ``align="structure"``
    applies it with its ``cm.Slice``; unless the checkpoint holds a token-type table the target has
    no place for (it may be folded into the target's position table).

    Example:
        >>> from ckptmerge.planning.planner import make_plan
        >>> t = VariableInfo("embeddings/position_embedding/embeddings", (64, 8), "float32")
        >>> s = VariableInfo("encoder/embeddings/position_embeddings", (66, 8), "float32")
        >>> src = SourceView("A", "<memory>", "", {s.name: s})
        >>> e = slice_proposals(make_plan([t], [src]), src, [t.name])[0]
        >>> e.review, e.evidence[1]
        (True, "cm.Slice('embeddings/position_embedding/embeddings', axis=0, start=2) copies rows 2..65 of 66, start=0 rows 0..63")
    """
    want = set(missing)
    targets = [t for t in plan.targets if t.name in want]
    if not targets:
        return []
    taken = set(used)
    unused = set(plan.unused.get(src.label, ()))
    free = [v for n, v in src.variables.items() if n not in taken and n in unused]
    # A checkpoint's token-type table with no place in the target may be folded into the target's
    # position table (KerasHub's XLM-R converter adds its row 0; its RoBERTa converter drops it): no
    # offset is certain then.
    folded = (any("segemb" in rewrite(n) for n in src.variables)
              and not any("segemb" in rewrite(t.name) for t in plan.targets))
    out = []
    for t in targets:
        fits = []
        for v in free:
            if v.dtype != t.dtype or len(v.shape) != len(t.shape) or not t.shape:
                continue
            axes = [a for a, (x, y) in enumerate(zip(v.shape, t.shape)) if x != y]
            if len(axes) != 1 or v.shape[axes[0]] <= t.shape[axes[0]]:
                continue
            mine, theirs = set(tokens(t.name)), set(tokens(v.name))
            if mine and len(mine & theirs) / len(mine | theirs) >= 0.5:
                fits.append((v, axes[0]))
        if len(fits) != 1:
            continue
        v, axis = fits[0]
        n_src, n_tgt = int(v.shape[axis]), int(t.shape[axis])
        unit = "rows" if axis == 0 else ("columns" if axis == 1 and len(t.shape) == 2 else f"axis-{axis} entries")
        offset = n_src - n_tgt
        known = position_offset(v.name) if axis == 0 and "posemb" in rewrite(t.name) else None
        if known is not None and known[0] == offset and not folded:  # the convention says which rows: applied, not reviewed
            out.append(Entry(v.name, t.name, 1.0, (
                f"shape {tuple(v.shape)} -> {tuple(t.shape)}: position table, {known[1]}",
                f"cm.Slice({t.name!r}, axis=0, start={offset}) copies rows {offset}..{n_src - 1} of {n_src}"), 1, False))
            continue
        out.append(Entry(v.name, t.name, 0.0, (
            f"shape {tuple(v.shape)} -> {tuple(t.shape)}: longer along axis {axis} only; names "
            f"{', '.join(map(repr, sorted(set(tokens(t.name)) & set(tokens(v.name)))))}",
            f"cm.Slice({t.name!r}, axis={axis}, start={offset}) copies {unit} {offset}..{n_src - 1} of {n_src}, "
            f"start=0 {unit} 0..{n_tgt - 1}"), 1, True))
    return out


def _align_source(plan: Plan, src: SourceView, missing: Sequence[str], target_order: Optional[Sequence[str]],
                  source_order: Optional[Sequence[str]] = None,
                  target_inputs: Optional[Mapping[str, Sequence[str]]] = None, taken: Iterable[str] = ()) -> Alignment:
    want = set(missing)
    variables, rules = src.variables, src.rules
    unused = plan.unused.get(src.label, [])
    if taken:  # (tensors the first pass matched or joined)
        gone = set(taken)
        unused = [n for n in unused if n not in gone]
    if src.undecided:  # a tensor the layout could not decide (transposed or not) is never paired
        unused = [n for n in unused if not _undecided(src, n)]
    names = list(map(variables.get, unused))
    # The usual case in C-speed passes: every unused name a variable under its own name, no
    # filter rules; anything else name by name.
    if (rules.include or rules.exclude or rules.regexes or any(map(operator.is_, names, itertools.repeat(None)))
            or list(map(_NAME, names)) != list(unused)):
        names = [variables[n] if variables[n].name == n else dataclasses.replace(variables[n], name=n)
                 for n in unused if n in variables and not _left_out(rules, n)]
    wanted = itertools.compress(plan.targets, map(want.__contains__, map(_NAME, plan.targets)))  # (C speed)
    return align(list(wanted), names, target_order=target_order,
                 source_order=src.order if source_order is None else source_order, target_inputs=target_inputs)


def make_suggestion(plan: Plan, *, target_order: Optional[Sequence[str]] = None,
                    source_orders: Optional[Sequence[Optional[Sequence[str]]]] = None,
                    target_inputs: Optional[Mapping[str, Sequence[str]]] = None) -> Suggestion:
    """Propose, per source in plan order, a map for the targets the plan leaves missing.

    Args:
        plan: a plan (e.g. from :func:`ckptmerge.plan`); only its names and specs are used.
        target_order: target names in creation order, if known (evidence for order).
        source_orders: per source, its names in saving order where known (see
            :attr:`SourceHandle.order <ckptmerge.sources.handles.SourceHandle.order>`); else each view's ``order``.
        target_inputs: per target, the targets of the layer that feeds its layer, where known
            (see :func:`ckptmerge.restoring.targets.input_layers`).

    Returns:
        The :class:`Suggestion`.

    Example:
        >>> from ckptmerge.planning.planner import make_plan
        >>> from ckptmerge.core.specs import VariableInfo as V
        >>> k, b = V("dnn/hiddenlayer_0/kernel", (4, 8), "float32"), V("dnn/hiddenlayer_0/bias", (8,), "float32")
        >>> p = make_plan([V("h0/kernel", (4, 8), "float32"), V("h0/bias", (8,), "float32")],
        ...               [SourceView("A", "runs/A", "", {k.name: k, b.name: b})])
        >>> make_suggestion(p).sources[0].map()
        {'dnn/hiddenlayer_0/': 'h0/'}
    """
    missing = list(plan.missing)
    all_targets = list(map(_NAME, plan.targets))
    out = []
    orders = source_orders or [None] * len(plan.sources)
    for src, order in zip(plan.sources, orders):
        found = _align_source(plan, src, missing, target_order, order, target_inputs)
        certain, _ = below_floor(found)
        found_map = found.mapping  # (each mapping built once: a dict of every match)
        certain_map = found_map if certain is found else certain.mapping
        taken = set(certain_map.values())
        missing = [t for t in missing if t not in taken]
        kept = {a.name: a.target for a in plan.assignments.values() if a.source == src.label}
        # What align="structure" would apply, folded into scopes; the rest one entry per variable, for review.
        entries = scope_entries(certain.matches, src.variables, all_targets)
        confidence = match_columns(found.matches)[2]
        if confidence and min(confidence) < CONFIDENCE_FLOOR:  # (the usual case has none: no match is read)
            entries += [e._replace(review=True) for e in scope_entries(
                [m for m in found.matches if m.confidence < CONFIDENCE_FLOOR], src.variables, all_targets)]
        used = set(found_map) | {n for u in found.unresolved for n in u.names}
        # (a decided offset too is listed for review here: a config's map entry cannot carry its slice)
        entries += [e if e.review else e._replace(review=True, confidence=0.0)
                    for e in slice_proposals(plan, src, missing, used)]
        entries += split_proposals(plan, src, missing, used)
        fusions = fused_proposals(plan, src, missing, found_map, certain_map)
        entries += [Entry(f.concat.name, f.concat.target, 0.0 if f.review else 1.0, f.evidence, len(f.concat.sources),
                          f.review) for f in fusions]
        joined = {f.concat.target for f in fusions if not f.review}
        missing = [t for t in missing if t not in joined]
        entries.sort(key=operator.itemgetter(1))
        unresolved = list(found.unresolved) + undecided_groups(plan, src, missing) + split_groups(
            plan, src, missing, used)
        out.append(SourceSuggestion(src.label, src.path, entries, unresolved, kept,
                                    [f.concat for f in fusions if not f.review]))
    return Suggestion(plan, out, missing)


def aligned_views(plan: Plan, views: Sequence[SourceView], which: Sequence[bool], *,
                  target_order: Optional[Sequence[str]] = None,
                  source_orders: Optional[Sequence[Optional[Sequence[str]]]] = None,
                  target_inputs: Optional[Mapping[str, Sequence[str]]] = None, fuse: bool = True) -> List[SourceView]:
    """The views again, the ``which`` ones with the plan's unambiguous structural matches added
    (``source_orders``, ``target_inputs``: as for :func:`make_suggestion`), and with ``fuse`` the
    Concats of :func:`~ckptmerge.planning.fusion.fused_proposals` that are certain (joined tensors,
    see :func:`~ckptmerge.planning.fusion.compose_view`).

    Each match of at least :data:`~ckptmerge.alignment.align.CONFIDENCE_FLOOR` confidence becomes a
    ``(name -> target)`` pair the planner uses for a name its rules did not put on a target
    (explicit ``map``/``regex`` entries win), with the note ``"matched by structure: <evidence>"``
    shown beside its assignment. What stays unresolved (ties, and matches below the floor) is
    kept in the view's ``unresolved``, for the plan's coverage.

    Example:
        >>> views = aligned_views(plan, views, [True])             # doctest: +SKIP
    """
    missing = list(plan.missing)
    out = []
    orders = source_orders or [None] * len(views)
    for src, on, order in zip(views, which, orders):
        if not on:
            out.append(src)
            continue
        found, weak = below_floor(_align_source(plan, src, missing, target_order, order, target_inputs))
        mapping = found.mapping  # (built once: a dict of every match)
        taken = set(mapping.values())
        missing = [t for t in missing if t not in taken]
        fusions = [f.concat for f in fused_proposals(plan, src, missing, mapping, mapping)
                   if not f.review] if fuse else []
        joined = {c.target for c in fusions}
        missing = [t for t in missing if t not in joined]
        if fusions:  # what stays open among tensors the joins took, again among the free ones
            found, weak, missing = _after_fusion(plan, src, found, weak, missing, fusions,
                                                 (target_order, order, target_inputs))
            mapping = found.mapping
        notes = dict(src.notes)
        for m in found.matches:
            how = f"matched by structure: {'; '.join(m.reasons)} (confidence {m.confidence:.2f})"
            notes[m.name] = f"{notes[m.name]}; {how}" if notes.get(m.name) else how
        reshapes = tuple(reshape_transforms(found, src, plan.targets))
        # position tables whose reserved rows the convention table names (RoBERTa's 2): sliced
        offsets = [e for e in slice_proposals(plan, src, missing, set(mapping)) if not e.review]
        if offsets:
            mapping = {**mapping, **{e.name: e.target for e in offsets}}
            for e in offsets:
                notes[e.name] = f"matched by structure: {'; '.join(e.evidence)}"
            reshapes += tuple(Slice(glob_escape(e.target), axis=0,
                                    start=src.variables[e.name].shape[0] - _shape(plan, e.target)[0]) for e in offsets)
            missing = [t for t in missing if t not in {e.target for e in offsets}]
        out.append(compose_view(dataclasses.replace(
            src, aligned=mapping, notes=notes, transforms=src.transforms + reshapes,
            unresolved=(*found.unresolved, *weak, *undecided_groups(plan, src, missing),
                        *split_groups(plan, src, missing, set(mapping)))), fusions))
    return out


def _shape(plan: Plan, target: str) -> Tuple[int, ...]:
    return next(tuple(t.shape) for t in plan.targets if t.name == target)


def _after_fusion(plan: Plan, src: SourceView, found: Alignment, weak: List[Unresolved], missing: List[str],
                  fusions: Sequence[Any], orders: Tuple[Any, Any, Any]
                  ) -> Tuple[Alignment, List[Unresolved], List[str]]:
    """Alignment's open groups again once the joins are decided: a group that named tensors a
    Concat now takes (Swin's attention output tied with the ``query``/``key``/``value`` that
    join into ``qkv``) is aligned again among the tensors still free, so it pairs with the
    one that is left where the evidence says so, and else names every free candidate, never a
    used one. ``orders``: the target order, source order and target inputs of the first pass."""
    used = set(found.mapping) | {p for c in fusions for p in c.sources}
    open_ = set(missing)
    stale = [u for u in (*found.unresolved, *weak) if used.intersection(u.names) and open_.intersection(u.targets)]
    if not stale:
        return found, weak, missing
    again = sorted({t for u in stale for t in u.targets if t in open_})
    second, weak2 = below_floor(_align_source(plan, src, again, *orders, taken=used))
    keep = [u for u in found.unresolved if u not in stale]
    found = Alignment(sorted([*found.matches, *second.matches], key=lambda m: m.target), [*keep, *second.unresolved])
    weak = [*(u for u in weak if u not in stale), *weak2]
    placed = set(second.mapping.values())
    return found, weak, [t for t in missing if t not in placed]


def reshape_transforms(found: Alignment, src: SourceView, targets: Sequence[VariableInfo]) -> List[Any]:
    """A :class:`~ckptmerge.alignment.tensorops.Reshape` per match whose checkpoint tensor has another shape
    than its target (alignment pairs those only when a reshape splits or merges neighbouring
    axes: attention heads, unit axes); a :class:`~ckptmerge.alignment.tensorops.Squeeze` or
    :class:`~ckptmerge.alignment.tensorops.ExpandDims` where only one unit axis differs.

    Example:
        >>> reshape_transforms(Alignment(), None, [])
        []
    """
    if not found.matches:
        return []
    shapes = {t.name: tuple(t.shape) for t in targets}
    out = []
    for m in found.matches:
        have, want = tuple(src.variables[m.name].shape), shapes.get(m.target)
        if want is not None and have != want:  # (one unit axis dropped or added: named so in the report)
            out.append(unit_axis_op(glob_escape(m.target), have, want) or Reshape(glob_escape(m.target), want, have))
    return out


def alignable(plan: Plan) -> Tuple[int, List[str]]:
    """How many missing targets have an unused checkpoint name of their shape and dtype, and in
    which sources: when non-zero the report hints at :func:`ckptmerge.suggest`.

    Example:
        >>> from ckptmerge.planning.planner import make_plan
        >>> alignable(make_plan([], []))
        (0, [])
    """
    if not plan.missing:
        return 0, []
    want: Dict[Tuple[Tuple[int, ...], str], int] = {}
    missing = set(plan.missing)
    for t in plan.targets:
        if t.name in missing:
            key = (tuple(t.shape), t.dtype)
            want[key] = want.get(key, 0) + 1
    if not want:
        return 0, []
    n, labels = 0, []
    for src in plan.sources:
        keys = {(tuple(src.variables[x].shape), src.variables[x].dtype)
                for x in plan.unused.get(src.label, ()) if x in src.variables and not _left_out(src.rules, x)}
        hit = sum(c for k, c in want.items() if k in keys)
        if hit:
            labels.append(src.label)
            n = max(n, hit)
    return n, labels
