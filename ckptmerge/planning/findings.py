"""What a plan decides for one target: an :class:`Assignment`, a :class:`Mismatch` or a
:class:`Conflict` (pure data with one-line messages; :mod:`ckptmerge.planning.planner` makes them).

Example:
    >>> Conflict("x", (("A", "x"), ("B", "x"))).blocking
    True
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Tuple

from ..core.specs import VariableInfo, frozen_slots, trusted_maker
from ..core.text import and_list, quote_name

__all__ = ["Assignment", "Mismatch", "Conflict"]


def _provider(label: str, name: str) -> str:
    return f"{label}:{quote_name(name)}"


@frozen_slots
@dataclass(frozen=True)
class Assignment:
    """One target restored from one checkpoint variable.

    Attributes:
        target: the target name.
        source: the source label.
        name: the checkpoint name.
        key: the raw checkpoint key.
        spec: the checkpoint side's spec.
        target_spec: the target's spec.
        cast: whether the value is converted from ``spec.dtype`` to ``target_spec.dtype``.
        rule: display form of the rule that renamed it (``None`` for identity).
        transforms: one description per value transform applied after the cast, in order.
        via: how the checkpoint name met the target when no rule says so: the raw key of a
            Keras weights-file entry, a model root swap, or ``"matched by structure: ..."``.

    Example:
        >>> a = Assignment("x", "A", "x", "x", VariableInfo("x", (2,), "float16"),
        ...                VariableInfo("x", (2,), "float32"), cast=True)
        >>> a.describe()
        "x <- A:'x' float16 (2,) cast float16->float32"
    """

    target: str
    source: str
    name: str
    key: str
    spec: VariableInfo
    target_spec: VariableInfo
    cast: bool = False
    rule: Optional[str] = None
    transforms: Tuple[str, ...] = ()
    via: Optional[str] = None

    def __post_init__(self) -> None:
        if type(self.transforms) is not tuple:
            object.__setattr__(self, "transforms", tuple(self.transforms))

    def describe(self) -> str:
        """``"target <- A:'name' dtype shape"`` plus ``"cast a->b"``, transforms and ``[via]`` (with the
        raw key when it is not the name and ``via`` does not name it)."""
        text = (f"{self.target} <- {_provider(self.source, self.name)} "
                f"{self.spec.dtype} {tuple(self.spec.shape)}")
        if self.cast:
            text += f" cast {self.spec.dtype}->{self.target_spec.dtype}"
        for t in self.transforms:
            text += f"; {t}"
        # The raw key, where it is not the name and no note names it (a layout's copied tensor)
        via = self.via or ""
        if self.key != self.name and self.key and not all(k in via for k in self.key.split("+")):
            via = f"raw key {quote_name(self.key)}" + (f"; {via}" if via else "")
        if via:
            text += f" [{via}]"
        return text

    def to_dict(self) -> dict:
        """JSON-ready: target, source, name, key, dtype, shape, target_dtype, target_shape,
        cast, rule, nbytes."""
        return {"target": self.target, "source": self.source, "name": self.name,
                "key": self.key, "dtype": self.spec.dtype, "shape": list(self.spec.shape),
                "target_dtype": self.target_spec.dtype,
                "target_shape": list(self.target_spec.shape), "cast": self.cast,
                "rule": self.rule, "transforms": list(self.transforms),
                "via": self.via, "nbytes": self.spec.nbytes}


#: ``trusted_assignment(target, source, name, key, spec, target_spec, cast, rule, transforms, via)``:
#: an :class:`Assignment` from checked fields (``transforms`` a tuple), built without its
#: ``__init__`` (see :func:`ckptmerge.core.specs.trusted_maker`); a plan makes one per target.
trusted_assignment = trusted_maker(Assignment)


@dataclass(frozen=True)
class Mismatch:
    """A target whose chosen checkpoint variable has another shape and/or dtype.

    Attributes:
        target, source, name, key: the target, the source label, the checkpoint name and key.
        target_shape, source_shape: shapes as tuples.
        target_dtype, source_dtype: numpy-style dtype names.
        kind: ``"shape"``, ``"dtype"``, ``"shape+dtype"`` or ``"transform"`` (a value
            transform of the source does not fit these shapes).
        detail: why, when there is more to say: the cast problem (``cast_problem``), the
            transform's error, or the shape after the transforms.

    Example:
        >>> Mismatch("h/k", "B", "h/k", "h/k", (8, 10), (8, 5), "float32", "float32", "shape").message()
        "shape mismatch: target 'h/k' (8, 10) <- B:'h/k' (8, 5) (pass on_shape_mismatch='skip' to leave it as it is)"
    """

    target: str
    source: str
    name: str
    key: str
    target_shape: Tuple[int, ...]
    source_shape: Tuple[int, ...]
    target_dtype: str
    source_dtype: str
    kind: str
    detail: str = ""

    def __post_init__(self) -> None:
        object.__setattr__(self, "target_shape", tuple(self.target_shape))
        object.__setattr__(self, "source_shape", tuple(self.source_shape))

    def message(self) -> str:
        """One line: what differs, on both sides, and how to fix it."""
        fix = "pass on_shape_mismatch='skip' to leave it as it is"
        if self.kind == "dtype" and not self.detail:
            fix = "pass cast=True to convert it, or on_shape_mismatch='skip' to leave it as it is"
        elif self.kind == "transform":
            fix = "fix the transform, or pass on_shape_mismatch='skip' to leave it as it is"
        return f"{self.describe()} ({fix})"

    def describe(self) -> str:
        """What differs, on both sides, without the fix (e.g. for skipped mismatches)."""
        prov = _provider(self.source, self.name)
        if self.kind == "shape":
            text = f"shape mismatch: target {quote_name(self.target)} {self.target_shape} <- {prov} {self.source_shape}"
        elif self.kind == "dtype":
            text = f"dtype mismatch: target {quote_name(self.target)} {self.target_dtype} <- {prov} {self.source_dtype}"
        elif self.kind == "transform":
            text = (f"transform mismatch: target {quote_name(self.target)} {self.target_shape} <- "
                    f"{prov} {self.source_shape}")
        else:
            text = (f"shape and dtype mismatch: target {quote_name(self.target)} {self.target_shape} "
                    f"{self.target_dtype} <- {prov} {self.source_shape} {self.source_dtype}")
        return f"{text}: {self.detail}" if self.detail else text

    def to_dict(self) -> dict:
        """JSON-ready: every field (shapes as lists) plus ``message``."""
        return {"target": self.target, "source": self.source, "name": self.name, "key": self.key,
                "kind": self.kind, "target_shape": list(self.target_shape),
                "source_shape": list(self.source_shape), "target_dtype": self.target_dtype,
                "source_dtype": self.source_dtype, "detail": self.detail,
                "message": self.message()}


@dataclass(frozen=True)
class Conflict:
    """A target that several checkpoint variables (in one source or several) would provide.

    Attributes:
        target: the target name.
        providers: ``(source label, checkpoint name)`` pairs in source order, then name order.
        resolved_to: the provider ``on_conflict='first'``/``'last'`` picked, or ``None``
            (``on_conflict='error'``: the target is not restored and the conflict blocks).

    Example:
        >>> Conflict("x", (("A", "x"), ("B", "x"))).message()
        "conflict: target 'x' is provided by A:'x' and B:'x' (pass on_conflict='first' or 'last', or narrow a source with include/exclude)"
    """

    target: str
    providers: Tuple[Tuple[str, str], ...]
    resolved_to: Optional[Tuple[str, str]] = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "providers", tuple(tuple(p) for p in self.providers))
        if self.resolved_to is not None:
            object.__setattr__(self, "resolved_to", tuple(self.resolved_to))

    @property
    def blocking(self) -> bool:
        """True when unresolved."""
        return self.resolved_to is None

    def message(self) -> str:
        """One line naming every provider, and the fix (or the resolution)."""
        provs = and_list([_provider(*p) for p in self.providers])
        text = f"conflict: target {quote_name(self.target)} is provided by {provs}"
        if self.resolved_to is not None:
            return text + f"; resolved to {_provider(*self.resolved_to)} by on_conflict."
        return text + (" (pass on_conflict='first' or 'last', or narrow a source with "
                       "include/exclude)")

    def to_dict(self) -> dict:
        """JSON-ready: target, providers (list of {source, name}), resolved_to, message."""
        return {"target": self.target,
                "providers": [{"source": s, "name": n} for s, n in self.providers],
                "resolved_to": (None if self.resolved_to is None else
                                {"source": self.resolved_to[0], "name": self.resolved_to[1]}),
                "message": self.message()}
