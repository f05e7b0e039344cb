"""Tensors made of several checkpoint tensors: a source with :class:`~ckptmerge.alignment.tensorops.Concat` entries.

A :class:`~ckptmerge.alignment.tensorops.Concat` names one target and the checkpoint tensors
joined into it (separate query, key and value weights into a fused ``qkv`` kernel). A source
with some is opened as a :class:`ComposedHandle` around its own handle: the plan sees one tensor
per entry, named ``"part_a+part_b+..."``, mapped onto the entry's target, in place of its parts
(they are used by it, not offered under their own names); its note names every part's raw key and
stored shape. Like a structural match, the joined tensor goes to its target whatever the
source's rules do (a ``map`` that lists only other names does not leave it out), and it never
lands anywhere under its own name. Reads give the joined tensor, made from the parts as they are read (one entry's
parts at a time, for a merge that writes tensor by tensor).

Every entry is checked when the plan is made, before anything is read or restored: its parts
exist in the source (with "did you mean"), share one dtype, agree off the joined axis; the
planner then compares the joined shape with the target's, as for any tensor.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any, Dict, Iterator, List, Mapping, Sequence, Tuple

import numpy as np

from ..core.errors import TransformError, did_you_mean
from ..planning.fusion import part_label
from ..planning.rules import MapRule, Rules
from ..core.specs import KIND_VARIABLE, VariableInfo
from ..core.text import quote_name

if TYPE_CHECKING:  # pragma: no cover
    from ..alignment.tensorops import Concat
    from ..planning.planner import SourceView

__all__ = ["ComposedHandle", "concat_entries", "composed_like"]

def concat_entries(transforms: Sequence[Any]) -> List["Concat"]:
    """The :class:`~ckptmerge.alignment.tensorops.Concat` entries among a source's transforms."""
    from ..alignment.tensorops import Concat

    return [t for t in transforms if isinstance(t, Concat)]


def composed_like(old: Any, new: Any) -> Any:
    """``new`` (a handle of the same source, e.g. another step) joining what ``old`` joins: the
    source's own Concats and those alignment inferred. ``new`` as it is when ``old`` joins nothing."""
    if not isinstance(old, ComposedHandle):
        return new
    inner = new.inner if isinstance(new, ComposedHandle) else new
    handle = ComposedHandle(inner, old.entries)
    object.__setattr__(handle, "_target_shapes", dict(old._target_shapes))
    return handle


class ComposedHandle:
    """A source handle (:class:`~ckptmerge.sources.handles.SourceHandle`) seen with its
    :class:`~ckptmerge.alignment.tensorops.Concat` entries joined (see the module docstring). Its
    listing (``all_variables``) and everything else are the wrapped handle's: renames by a Keras
    model's walk, layout entries, findings; only the plan's view and reads see the joined tensors."""

    def __init__(self, inner: Any, entries: Sequence["Concat"]) -> None:
        # (no dataclass __init__: the fields are the inner handle's, read through the properties)
        object.__setattr__(self, "inner", inner)
        object.__setattr__(self, "entries", tuple(entries))
        object.__setattr__(self, "_target_shapes", {})
        object.__setattr__(self, "_version", 0)
        object.__setattr__(self, "_renamed", {})  # joined name as given -> as made (raw keys resolved)

    # -- everything else is the wrapped handle's (a rename by a Keras model's walk reaches it) --
    def __getattr__(self, name: str) -> Any:
        if name == "inner":  # (not set yet: no recursion)
            raise AttributeError(name)
        return getattr(self.inner, name)

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self.inner, name, value)

    def __repr__(self) -> str:
        n = len(self.entries)
        return f"ComposedHandle({self.inner!r}, {n} concat entr{'y' if n == 1 else 'ies'})"

    # -- the entries ------------------------------------------------------------------------
    def name_targets(self, targets: Sequence[VariableInfo]) -> None:
        """Learn the targets' shapes (an entry with ``axis=None`` is joined along the axis that
        gives its target's shape); passed on to a layout handle inside."""
        self._target_shapes.clear()
        self._target_shapes.update({t.name: tuple(t.shape) for t in targets})
        object.__setattr__(self, "_version", self._version + 1)
        inner = getattr(self.inner, "name_targets", None)
        if inner is not None:
            inner(targets)

    def _part(self, c: "Concat", name: str, by_name: Mapping[str, VariableInfo],
              outputs: Mapping[str, List[str]]) -> VariableInfo:
        info = by_name.get(name)
        if info is None and len(outputs.get(name, ())) == 1:  # a raw key (PyTorch's dotted name) of one output
            info = by_name.get(outputs[name][0])
        if info is None:  # a raw key as the file lists it (a Keras file's entries named by the model's walk)
            info = next((v for v in by_name.values() if v.raw_key == name), None)
        if info is None:
            known = [v.name for v in self.inner.all_variables]
            raise TransformError(
                f"concat of {quote_name(c.target)} in source {quote_name(self.inner.label)}: part {quote_name(name)} "
                f"is not a tensor of the source.{did_you_mean(name, known, cutoff=0.6)} Run 'ckptmerge ls "
                f"{self.inner.path}' to list its tensors.", target=c.target)
        return info

    def _joined(self) -> Dict[str, Tuple[VariableInfo, str]]:
        """``{joined name: (its spec, its note)}``, each entry checked (see the module docstring).

        Raises:
            TransformError: a part is missing, the dtypes differ, or the shapes do not join.
        """
        inner_vars = self.inner.all_variables
        key = (id(inner_vars), len(inner_vars), self._version)
        cached = self.__dict__.get("_cache")
        if cached is not None and cached[0] == key:
            return cached[1]
        by_name = {v.name: v for v in inner_vars}
        outputs: Dict[str, List[str]] = {}
        for name, e in (getattr(self.inner, "entries", None) or {}).items():  # a layout's: raw key -> names
            for k in e.sources:
                outputs.setdefault(k, []).append(name)
        out: Dict[str, Tuple[VariableInfo, str]] = {}
        for c in self.entries:
            parts = [self._part(c, name, by_name, outputs) for name in c.sources]
            dtypes = {p.dtype for p in parts}
            if len(dtypes) > 1:
                listed = ", ".join(f"{quote_name(p.name)} {p.dtype}" for p in parts)
                raise TransformError(f"concat of {quote_name(c.target)} in source {quote_name(self.inner.label)}: the "
                                     f"parts have different dtypes ({listed}); join tensors of one dtype.",
                                     target=c.target)
            if tuple(p.name for p in parts) != c.sources:  # raw keys given: the names they stand for
                self._renamed[c.name] = "+".join(p.name for p in parts)
                c = dataclasses.replace(c, sources=tuple(p.name for p in parts))
                object.__setattr__(self, "entries", tuple(c if e.target == c.target else e for e in self.entries))
            shapes = [tuple(p.shape) for p in parts]
            try:
                shape = c.output_shape(shapes, self._target_shapes.get(c.target))
                labels = [part_label(p, self.inner.notes.get(p.name, "")) for p in parts]
                note = c.describe(shapes, self._target_shapes.get(c.target), labels=labels)
            except TransformError as e:
                raise TransformError(f"{e} (source {quote_name(self.inner.label)})", target=c.target) from None
            info = VariableInfo(c.name, shape, parts[0].dtype, "+".join(p.raw_key for p in parts), KIND_VARIABLE,
                                sum(p.nbytes for p in parts))
            out[c.name] = (info, note)
        self.__dict__["_cache"] = (key, out)
        return out

    def joined_specs(self) -> Dict[str, VariableInfo]:
        """``{joined name: its spec}`` (the listing, ``all_variables``, is the wrapped handle's)."""
        return {n: info for n, (info, _) in self._joined().items()}

    def view(self, rules: Rules) -> "SourceView":
        """The inner handle's view with each entry's parts replaced by its joined tensor, mapped
        onto its target."""
        joined = self._joined()
        if self._renamed and rules.maps:  # a map entry naming the joined tensor as given (see Source's map)
            rules = dataclasses.replace(rules, maps=tuple(
                MapRule(self._renamed.get(m.source, m.source), m.target) for m in rules.maps))
        base = self.inner.view(rules)
        parts = {p for c in self.entries for p in c.sources}
        variables = {n: v for n, v in base.variables.items() if n not in parts}
        variables.update({n: info for n, (info, _) in joined.items()})
        transforms = tuple(t for t in base.transforms if getattr(t, "kind", None) != "concat")
        return dataclasses.replace(base, variables=dict(sorted(variables.items())), transforms=transforms,
                                   notes={**base.notes, **{n: note for n, (_, note) in joined.items()}},
                                   composed={c.name: c.sources for c in self.entries},
                                   joined={c.name: c.target for c in self.entries})

    # -- reading ----------------------------------------------------------------------------
    def read(self, names: Sequence[str]) -> Dict[str, Any]:
        """Read the named tensors; a joined one is made from its parts, read with the rest."""
        from ..formats.base import aligned_empty

        by_name = {c.name: c for c in self.entries}
        joined = self._joined()
        wanted = [by_name[n] for n in names if n in by_name]
        plain = [n for n in names if n not in by_name]
        raw = self.inner.read(sorted(set(plain) | {p for c in wanted for p in c.sources}))
        out = {n: raw[n] for n in plain}
        for c in wanted:
            info = joined[c.name][0]
            values = [np.asarray(raw[p]) for p in c.sources]
            out[c.name] = c.apply(values, aligned_empty(info.shape, values[0].dtype),
                                  target_shape=self._target_shapes.get(c.target))
        return out

    def iter_chunks(self, name: str, max_elements: int) -> Iterator[np.ndarray]:
        """A joined tensor in flat pieces (made whole first); any other as the inner handle streams it."""
        if any(c.name == name for c in self.entries):
            flat = np.asarray(self.read([name])[name]).reshape(-1)
            return map(flat.__getitem__, (slice(s, s + max_elements) for s in range(0, flat.size, max_elements)))
        return self.inner.iter_chunks(name, max_elements)

    def ranges(self, name: str) -> Any:
        """``None`` for a joined tensor (it is made, not read in place), else the inner handle's."""
        if any(c.name == name for c in self.entries):
            return None
        return self.inner.ranges(name)

    def close(self) -> None:
        """Close the wrapped source."""
        self.inner.close()
