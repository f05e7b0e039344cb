"""Fused PyTorch modules as data: which modules hold several projections in one weight, in which
order, and how large each part is.

GPT-2's ``c_attn`` holds query, key and value one after the other; Phi-3's ``qkv_proj`` does too,
but with grouped-query attention its key and value are narrower than its query (4 query heads,
2 key/value heads: 16, 8 and 8 rows of a 32-row weight); Phi-3's ``gate_up_proj`` holds the MLP's
gate, then its up projection (``gate, up = gate_up_proj(x).chunk(2, dim=-1)``). Keras and KerasHub
keep each part in a layer of its own. :data:`FUSED` is one small table of :class:`FusedConvention`
rows; :func:`~ckptmerge.alignment.layouts.torch_layout` splits a module the table names into its
parts, named as the row says (``gate_up_proj/gate_proj/kernel``, ``gate_up_proj/up_proj/kernel``),
and structural alignment then pairs each part with a target as it pairs any tensor, by the
convention table's roles (:mod:`ckptmerge.alignment.conventions`).

Which part is which comes from the row, never from shapes: a fused weight whose module the table
does not name is never split by inference (two equal halves fit a gate and an up projection
either way round); ``cm.suggest`` proposes such splits for review only. The sizes of the parts
come from the row where they are equal by definition (``gate_up_proj``: two halves), else from
the targets (:func:`part_sizes`): every group of targets that plays the row's parts (a query, a
key and a value under one scope, by the table's names) must give the same sizes, which must add
up to the fused size; anything else leaves the module as it is, never a guess.

Pure: names and shapes in, decisions out.
"""

from __future__ import annotations

import math
import threading
from dataclasses import dataclass
from typing import Dict, Iterable, List, Optional, Sequence, Tuple

from ..core.errors import RuleError
from ..core.specs import VariableInfo
from .conventions import conventions

__all__ = ["FusedConvention", "FUSED", "add_fused_convention", "fused_conventions", "fused_row", "part_roles",
           "part_sizes", "target_role"]


@dataclass(frozen=True)
class FusedConvention:
    """One row of the fused-module table.

    Attributes:
        names: module names (the last scope of a PyTorch module, matched case-insensitively):
            ``("gate_up_proj",)``.
        parts: the parts in the fused weight's order along its output axis, each a name the
            convention table knows (so that alignment reads its role): ``("gate_proj", "up_proj")``.
        equal: whether the parts are equal by definition (split without other evidence); when
            False their sizes come from the targets (grouped-query attention).
        why: what the row is for, for people reading the table.

    Example:
        >>> FusedConvention(("gate_up_proj",), ("gate_proj", "up_proj")).parts
        ('gate_proj', 'up_proj')
    """

    names: Tuple[str, ...]
    parts: Tuple[str, ...]
    equal: bool = True
    why: str = ""

    def __post_init__(self) -> None:
        names = (self.names,) if isinstance(self.names, str) else tuple(self.names)
        parts = (self.parts,) if isinstance(self.parts, str) else tuple(self.parts)
        for what, values in (("names", names), ("parts", parts)):
            if not values or not all(isinstance(n, str) and n and "/" not in n and "." not in n and len(n) <= 100
                                     for n in values):
                raise RuleError(f"a fused convention's {what} must be module names (no '/' or '.', at most 100 "
                                f"characters). Received: {what}={getattr(self, what)!r:.120}")
        if len(parts) < 2 or len(set(p.lower() for p in parts)) != len(parts):
            raise RuleError(f"a fused convention needs two or more distinct parts. Received: parts={self.parts!r:.120}")
        object.__setattr__(self, "names", names)
        object.__setattr__(self, "parts", parts)
        object.__setattr__(self, "equal", bool(self.equal))


#: The built-in table. Only fusions whose parts lie one after the other along the output axis
#: belong here: per-head interleaved ones (BLOOM's and GPT-NeoX's ``query_key_value``) do not.
FUSED: Tuple[FusedConvention, ...] = (
    FusedConvention(("c_attn", "qkv"), ("query", "key", "value"), True,
                    "GPT-2's c_attn and timm's qkv: query, key and value of equal sizes, in that order"),
    FusedConvention(("qkv_proj",), ("query", "key", "value"), False,
                    "Phi-3's qkv_proj: query (heads * head_dim rows), then key and value (kv_heads * head_dim "
                    "each): with grouped-query attention the sizes come from the targets"),
    FusedConvention(("gate_up_proj",), ("gate_proj", "up_proj"), True,
                    "Phi-3's gate_up_proj: the MLP's gate, then its up projection (gate, up = chunk(2))"),
)

_lock = threading.Lock()
_extra: List[FusedConvention] = []


def add_fused_convention(names: Sequence[str], parts: Sequence[str], *, equal: bool = True,
                         why: str = "") -> FusedConvention:
    """Add a row to the fused-module table, for every later layout in this process.

    Args:
        names: module names as your PyTorch model writes them.
        parts: the parts in the fused weight's order, each a name of the convention table
            (``"query"``, ``"gate_proj"``, ... or one you added with
            :func:`~ckptmerge.alignment.conventions.add_convention`).
        equal: the parts are equal by definition; False: their sizes come from the targets.
        why: what it is for.

    Raises:
        RuleError: a name or part is empty or holds ``/`` or ``.``; fewer than two parts.

    Example:
        >>> row = add_fused_convention(["w13_gate_up"], ["gate_proj", "up_proj"])
        >>> fused_row("w13_gate_up").parts
        ('gate_proj', 'up_proj')
    """
    row = FusedConvention(tuple(names), tuple(parts), equal, why)
    with _lock:
        _extra.append(row)
    return row


def fused_conventions() -> Tuple[FusedConvention, ...]:
    """The table in force: the built-in rows, then those added (later rows win for a name)."""
    return FUSED + tuple(_extra)


def fused_row(module: str) -> Optional[FusedConvention]:
    """The row naming a module (its last scope, any case), or None.

    Example:
        >>> fused_row("model.layers.0.self_attn.qkv_proj".rsplit(".", 1)[-1]).equal
        False
    """
    found = None
    leaf = module.lower()
    for row in fused_conventions():
        if leaf in (n.lower() for n in row.names):
            found = row
    return found


def _role_table() -> Dict[str, str]:
    out: Dict[str, str] = {}
    for c in conventions():
        for n in c.names:
            if "/" not in n:
                out[n.lower()] = c.role
    return out


def target_role(segment: str, roles: Optional[Dict[str, str]] = None) -> Optional[str]:
    """The convention role of one name segment: the whole of it, or its last ``_`` word.

    Example:
        >>> target_role("feedforward_gate_dense"), target_role("query"), target_role("dense_3")
        ('mlpgate', 'query', None)
    """
    roles = _role_table() if roles is None else roles
    seg = segment.lower()
    return roles.get(seg) or roles.get(seg.rsplit("_", 1)[-1])


def part_roles(row: FusedConvention, roles: Optional[Dict[str, str]] = None) -> Tuple[Optional[str], ...]:
    """The roles of a row's parts (None for a part name the convention table does not know).

    Example:
        >>> part_roles(fused_row("gate_up_proj"))
        ('mlpgate', 'mlpin')
    """
    roles = _role_table() if roles is None else roles
    return tuple(roles.get(p.lower()) for p in row.parts)


def part_sizes(row: FusedConvention, rows: int, fan_in: int, targets: Iterable[VariableInfo]
               ) -> Tuple[Optional[Tuple[int, ...]], str]:
    """The sizes of a fused weight's parts along its output axis, and why.

    Equal parts (``row.equal``) are ``rows / len(parts)`` each, unless the targets show other
    sizes (then the evidence disagrees: None). Otherwise every group of kernel targets under one
    scope that plays the row's parts, one target per part (by the convention roles of their layer
    names), with ``fan_in`` inputs, gives sizes (each target's outputs: the product of its shape
    after the first axis); the sizes must be the same for every group and add up to ``rows``.

    Returns:
        ``(sizes, evidence)``, or ``(None, why not)``.

    Example:
        >>> row = fused_row("qkv_proj")
        >>> ts = [VariableInfo(f"l_0/attention/{p}/kernel", s, "float32")
        ...       for p, s in (("query", (16, 4, 4)), ("key", (16, 2, 4)), ("value", (16, 2, 4)))]
        >>> part_sizes(row, 32, 16, ts)[0]
        (16, 8, 8)
    """
    n = len(row.parts)
    table = _role_table()
    roles = part_roles(row, table)
    found = set()
    if None not in roles:
        groups: Dict[str, Dict[str, List[int]]] = {}
        for t in targets:
            segs = t.name.split("/")
            if len(segs) < 2 or segs[-1] != "kernel" or len(t.shape) < 2 or int(t.shape[0]) != fan_in:
                continue
            role = target_role(segs[-2], table)
            if role in roles:
                groups.setdefault("/".join(segs[:-2]), {}).setdefault(role, []).append(math.prod(t.shape[1:]))
        for g in groups.values():
            if all(len(g.get(r, ())) == 1 for r in roles):
                sizes = tuple(g[r][0] for r in roles)
                if sum(sizes) == rows:
                    found.add(sizes)
    parts = " + ".join(row.parts)
    if len(found) > 1:
        return None, (f"the targets give {len(found)} different sizes for its parts {parts} "
                      f"({', '.join(map(str, sorted(found)))})")
    if row.equal:
        if rows % n:
            return None, f"its {rows} outputs do not divide into {n} equal parts {parts}"
        equal = (rows // n,) * n
        if found and found != {equal}:
            return None, (f"its parts {parts} are equal by convention, but the targets give sizes "
                          f"{next(iter(found))}")
        return equal, f"{n} equal parts {parts} by convention"
    if not found:
        return None, (f"no targets play its parts {parts} with {fan_in} inputs and sizes that add up to {rows}, "
                      "so their sizes are unknown")
    sizes = next(iter(found))
    return sizes, f"parts {parts} of sizes {'+'.join(map(str, sizes))}, as the targets' shapes give them"
