"""Path drift: which layer of an old Keras weights file is which layer of a refactored model.

Keras keys a weights file by object path (``layers/block/attn/vars/0``), so refactoring model
code breaks loads: a renamed attribute (``attn`` -> ``attention``), a layer class swapped for
another (``layers/dense`` -> ``layers/my_dense``), a layer wrapped in a sub-model or taken out of
one (``layers/dense_1`` <-> ``layers/sequential/layers/dense_1``) leave the old entries where the
new walk does not look. :func:`align_paths` pairs the file's layers nothing loads with the model's
layers that load nothing, a whole layer at a time, with the certainty rules of structural
alignment (:func:`ckptmerge.alignment.align.align`): two layers can pair only when they hold the
same entries (count, order, shapes, dtypes); among those, the path and layer-name tokens decide,
solved as one assignment per kind of layer, and a pair is kept only when every alternative scores
lower. Everything else stays unresolved, with the reason. Walk order is not used as evidence:
Keras walks attributes alphabetically, so a rename reorders them.

Pure: layer descriptions in, pairs out; no file access, no Keras.

Example:
    >>> old = [LayerEntries("layers/dense", "dense", (("0", (4, 3), "float32"), ("1", (3,), "float32")))]
    >>> new = [LayerEntries("layers/my_dense", "my_dense", (("0", (4, 3), "float32"), ("1", (3,), "float32")))]
    >>> [(m.file, m.model) for m in align_paths(old, new).matches]
    [('layers/dense', 'layers/my_dense')]
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Dict, List, Sequence, Tuple

from ..core.specs import VariableInfo
from ..core.text import quote_name
from .align import align

__all__ = ["LayerEntries", "PathMatch", "PathAlignment", "align_paths"]

_SUFFIX = re.compile(r"_\d+$")


@dataclass(frozen=True)
class LayerEntries:
    """One layer as a weights file stores it, or as a model's walk would.

    Attributes:
        path: its object path (``layers/block/attn``).
        name: the layer's own name (a file's ``vars`` group records it), ``""`` if unknown.
        entries: ``(key, shape, dtype)`` per entry, in key order (``("0", (4, 3), "float32")``).
    """

    path: str
    name: str
    entries: Tuple[Tuple[str, Tuple[int, ...], str], ...]

    @property
    def signature(self) -> str:
        """The entries as one string: only layers with equal signatures can pair."""
        return ";".join(f"{k}:{'x'.join(map(str, s))}:{d}" for k, s, d in self.entries)

    def described(self) -> str:
        """``2 entries: (4, 3) float32, (3,) float32``."""
        shown = ", ".join(f"{tuple(s)} {d}" for _, s, d in self.entries[:4])
        more = ", ..." if len(self.entries) > 4 else ""
        return f"{len(self.entries)} entr{'y' if len(self.entries) == 1 else 'ies'}: {shown}{more}"


@dataclass(frozen=True)
class PathMatch:
    """A file layer paired with a model layer.

    Attributes:
        file: the file's object path.
        model: the model's object path (where ``load_weights`` would look for it).
        confidence: 0..1, as structural alignment gives it.
        evidence: what pairs them.
    """

    file: str
    model: str
    confidence: float
    evidence: Tuple[str, ...]

    def describe(self) -> str:
        """``file 'layers/dense' -> model 'layers/my_dense' (0.83: ...)``."""
        return (f"file {quote_name(self.file)} -> model {quote_name(self.model)} "
                f"({self.confidence:.2f}: {'; '.join(self.evidence)})")


@dataclass(frozen=True)
class PathAlignment:
    """The result of :func:`align_paths`.

    Attributes:
        matches: accepted pairs, sorted by file path.
        unresolved: ``(file paths, model paths, reason)`` of layers the evidence cannot pair.
    """

    matches: Tuple[PathMatch, ...] = ()
    unresolved: Tuple[Tuple[Tuple[str, ...], Tuple[str, ...], str], ...] = ()

    def lines(self) -> List[str]:
        """One line per pair, then one per unresolved group."""
        out = [m.describe() for m in self.matches]
        out += [f"unresolved: file {', '.join(map(quote_name, f))} / model {', '.join(map(quote_name, m))}: {why}"
                for f, m, why in self.unresolved]
        return out


def _pseudo(layer: LayerEntries) -> str:
    """The name alignment sees: the path, then the layer's own name without its auto-number
    (process-dependent: ``dense_7`` and ``dense_12`` are both a ``dense``) as the leaf."""
    name = _SUFFIX.sub("", layer.name) or layer.path.rsplit("/", 1)[-1] or "root"
    return f"{layer.path}/{name}" if layer.path else name


def align_paths(file_layers: Sequence[LayerEntries], model_layers: Sequence[LayerEntries]) -> PathAlignment:
    """Pair file layers with model layers where the evidence is unambiguous (module docstring).

    Args:
        file_layers: the file's layers nothing loads.
        model_layers: the model's layers that load nothing.

    Returns:
        A :class:`PathAlignment`.
    """
    by_pseudo_f: Dict[str, LayerEntries] = {_pseudo(f): f for f in file_layers}
    by_pseudo_m: Dict[str, LayerEntries] = {_pseudo(m): m for m in model_layers}
    if len(by_pseudo_f) != len(file_layers) or len(by_pseudo_m) != len(model_layers):  # pragma: no cover
        return PathAlignment(unresolved=((tuple(f.path for f in file_layers), tuple(m.path for m in model_layers),
                                          "two layers look alike by path and name"),))
    found = align([VariableInfo(p, (), m.signature) for p, m in by_pseudo_m.items()],
                  [VariableInfo(p, (), f.signature) for p, f in by_pseudo_f.items()])
    matches = []
    for match in found.matches:
        f, m = by_pseudo_f[match.name], by_pseudo_m[match.target]
        if f.signature != m.signature:  # pragma: no cover - alignment pairs equal specs only
            continue
        evidence = [f"same {f.described()}"]
        for e in match.reasons:
            if e.startswith("shape "):
                if "the only candidate" in e:
                    evidence.append("the only layers holding these entries")
            else:
                evidence.append(e.replace("leaf ", "layer name ", 1).replace("scope tokens ", "path tokens ", 1))
        matches.append(PathMatch(f.path, m.path, match.confidence, tuple(evidence)))
    unresolved = [(tuple(sorted(by_pseudo_f[n].path for n in u.names)),
                   tuple(sorted(by_pseudo_m[t].path for t in u.targets)), u.reason) for u in found.unresolved]
    paired_f = {m.file for m in matches} | {p for u in unresolved for p in u[0]}
    paired_m = {m.model for m in matches} | {p for u in unresolved for p in u[1]}
    lonely_f = sorted(f.path for f in file_layers if f.path not in paired_f)
    lonely_m = sorted(m.path for m in model_layers if m.path not in paired_m)
    if lonely_f and lonely_m:
        unresolved.append((tuple(lonely_f), tuple(lonely_m), "no layer on the other side holds the same entries"))
    return PathAlignment(tuple(sorted(matches, key=lambda m: m.file)), tuple(unresolved))
