"""The plan: which target variable gets which checkpoint variable, computed before any restore.

:func:`make_plan` is pure: it takes target specs and one :class:`SourceView` per checkpoint
(names, specs and :class:`~ckptmerge.rules.Rules`, no readers) and returns a :class:`Plan`
holding the :class:`Assignment` of every target that can be restored plus every finding:
``missing``, ``allowed_missing``, ``unused``, ``dropped``, ``mismatched`` (with ``skipped``),
``conflicts``, ``ambiguous`` and ``unmatched_rules``. Nothing is resolved silently:
:meth:`Plan.blocking` turns the findings into one fix-it line each, and :meth:`Plan.check`
raises one :class:`~ckptmerge.errors.PlanError` listing all of them.

Every target lands in exactly one of ``assignments``, ``missing``, ``allowed_missing``,
``skipped`` (a provider exists but does not fit) or :attr:`Plan.unresolved_conflicts`.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import logging
import operator
import re
import types
from dataclasses import dataclass, field
from typing import (
    TYPE_CHECKING,
    Any,
    Dict,
    Iterable,
    List,
    Mapping,
    NamedTuple,
    Optional,
    Sequence,
    Set,
    Tuple,
    Union,
)

from .errors import CkptMergeError, PlanError, RuleError
from .gcpause import paused_gc
from .rules import (
    Ambiguity,
    GlobFilter,
    MapRule,
    RegexRule,
    Rules,
    UnmatchedRule,
    _q,
    _received,
    _scopes_of,
    did_you_mean_text,
    suggest,
)
from .specs import VariableInfo
from .text import escape_name
from .transforms import TransformError, cast_problem, chain_output_shape

if TYPE_CHECKING:  # pragma: no cover
    from .report import Report

_log = logging.getLogger(__name__)
#: action -> (what strict=False lets you do, the warning's verb)
_ACTIONS = {"restore": ("restore what can be restored", "restoring"),
            "write": ("write what can be written", "merging")}

__all__ = [
    "OptionError",
    "SourceView",
    "Assignment",
    "Mismatch",
    "Conflict",
    "Plan",
    "make_plan",
    "ON_CONFLICT",
    "ON_SHAPE_MISMATCH",
]

#: Valid values of ``on_conflict``.
ON_CONFLICT = ("error", "first", "last")
#: Valid values of ``on_shape_mismatch``.
ON_SHAPE_MISMATCH = ("error", "skip")

#: How many blocking lines :meth:`Plan.check` shows before "... and N more".
CHECK_LIMIT = 20


class OptionError(CkptMergeError, ValueError):
    """An option has a value ckptmerge does not accept (the message lists the valid values).

    Example:
        >>> try:
        ...     make_plan([], [], on_conflict="frist")
        ... except OptionError as e:
        ...     print(e)
        on_conflict must be one of 'error', 'first', 'last'; received 'frist'. Did you mean 'first'?
    """


def _provider(label: str, name: str) -> str:
    return f"{label}:{_q(name)}"


def _and_list(items: Sequence[str]) -> str:
    if len(items) <= 1:
        return "".join(items)
    return ", ".join(items[:-1]) + " and " + items[-1]


def _check_choice(option: str, value: Any, choices: Sequence[str]) -> None:
    if not isinstance(value, str) or value not in choices:
        valid = ", ".join(_q(c) for c in choices)
        dym = did_you_mean_text(suggest(value, choices, cutoff=0.6)) if isinstance(value, str) else ""
        raise OptionError(f"{option} must be one of {valid}; received {value!r}.{dym}")


# --------------------------------------------------------------------------------------------
# Inputs and findings
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SourceView:
    """What the plan needs to know of one source checkpoint.

    Attributes:
        label: unique display name, e.g. ``"A"`` or ``"base"``.
        path: resolved checkpoint prefix, or ``"<memory>"``.
        note: how it was resolved, e.g. ``"latest checkpoint per runs/A/checkpoint (step 10)"``.
        variables: name -> :class:`~ckptmerge.specs.VariableInfo`, already filtered (e.g.
            optimizer state left out); stored as a read-only mapping sorted by name.
        rules: the source's selection/rename rules (identity by default).
        transforms: value transforms (:mod:`ckptmerge.transforms`: objects with
            ``applies_to(target_name)``, ``output_shape(source_shape, target_shape)`` and
            ``describe(source_shape, target_shape)``); the plan compares the shape they produce
            with the target's, so e.g. a ``Slice`` turns a shape mismatch into an assignment.
        cast: per-source override of the plan's ``cast`` option (``None``: the plan's).
        hidden: names the source holds but left out of ``variables`` (optimizer state and
            bookkeeping without ``optimizer=True``), so that an ``include`` that matches only
            those can say so.
        notes: checkpoint name -> how it got that name (e.g. ``"h5 'layers/dense/vars/0'"``),
            shown beside its assignment.
        findings: structure findings of this source (a Keras weights file whose layers differ
            from the model's); they block a strict restore.
        aligned: ``{checkpoint name: target}`` from structural alignment
            (``Source(align="structure")``), used for names the rules put on no target.
        order: checkpoint names in the order the checkpoint saved them, where it records one
            (a TF2 object graph), else ``None``: evidence for structural alignment.

    Raises:
        OptionError: a field has the wrong type or the label is empty.

    Example:
        >>> s = SourceView("A", "<memory>", "", {"x": VariableInfo("x", (2,), "float32")})
        >>> list(s.variables)
        ['x']
    """

    label: str
    path: str
    note: str
    variables: Mapping[str, VariableInfo]
    rules: Rules = field(default_factory=Rules)
    transforms: Tuple[Any, ...] = ()
    cast: Optional[bool] = None
    hidden: Tuple[str, ...] = ()
    notes: Mapping[str, str] = field(default_factory=dict)
    findings: Tuple[str, ...] = ()
    aligned: Mapping[str, str] = field(default_factory=dict)
    order: Optional[Tuple[str, ...]] = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "notes", types.MappingProxyType(dict(self.notes)))
        object.__setattr__(self, "aligned", types.MappingProxyType(dict(self.aligned)))
        object.__setattr__(self, "findings", tuple(self.findings))
        if self.cast is not None and not isinstance(self.cast, bool):
            raise OptionError(f"source {_q(self.label)}: cast must be True, False or None (the plan's "
                              f"option); received {_received(self.cast)}.")
        if not isinstance(self.label, str) or not self.label:
            raise OptionError(f"a source label must be a non-empty str; received {_received(self.label)}.")
        for name in ("path", "note"):
            if not isinstance(getattr(self, name), str):
                raise OptionError(f"source {_q(self.label)}: {name} must be a str; received "
                                  f"{_received(getattr(self, name))}.")
        if not isinstance(self.variables, Mapping):
            raise OptionError(f"source {_q(self.label)}: variables must be a dict of name -> "
                              f"VariableInfo; received {_received(self.variables)}.")
        if all(map(isinstance, self.variables, itertools.repeat(str))) and all(
                map(isinstance, self.variables.values(), itertools.repeat(VariableInfo))):
            bad = []  # (one pass at C speed: sources hold up to 100,000s of names)
        else:
            bad = [k for k, v in self.variables.items() if not isinstance(k, str) or not isinstance(v, VariableInfo)]
        if bad:
            raise OptionError(f"source {_q(self.label)}: variables must map names (str) to "
                              f"VariableInfo; {len(bad)} entr{'y does' if len(bad) == 1 else 'ies do'} "
                              f"not, e.g. {bad[0]!r} -> {_received(self.variables[bad[0]])}.")
        if not isinstance(self.rules, Rules):
            raise OptionError(f"source {_q(self.label)}: rules must be a Rules (build it with "
                              f"Rules.from_options(...)); received {_received(self.rules)}.")
        if isinstance(self.transforms, (str, bytes)) or not isinstance(self.transforms, Iterable):
            raise OptionError(f"source {_q(self.label)}: transforms must be a list of transforms; "
                              f"received {_received(self.transforms)}.")
        transforms = tuple(self.transforms)
        for t in transforms:
            if not (callable(getattr(t, "applies_to", None)) and callable(getattr(t, "output_shape", None))):
                raise OptionError(f"source {_q(self.label)}: {_received(t)} is not a value transform "
                                  "(see ckptmerge.transforms: Slice, VocabRemap).")
        object.__setattr__(self, "transforms", transforms)
        if isinstance(self.hidden, (str, bytes)) or not all(isinstance(n, str) for n in self.hidden):
            raise OptionError(f"source {_q(self.label)}: hidden must be a list of names; received "
                              f"{_received(self.hidden)}.")
        object.__setattr__(self, "hidden", tuple(sorted(self.hidden)))
        if self.order is not None:
            if isinstance(self.order, (str, bytes)) or not all(isinstance(n, str) for n in self.order):
                raise OptionError(f"source {_q(self.label)}: order must be a list of names or None; "
                                  f"received {_received(self.order)}.")
            object.__setattr__(self, "order", tuple(self.order))
        names = list(self.variables)
        if all(map(operator.lt, names, names[1:])):  # usually sorted already: copy as it is
            frozen = types.MappingProxyType(dict(self.variables))
        else:
            frozen = types.MappingProxyType({k: self.variables[k] for k in sorted(names)})
        object.__setattr__(self, "variables", frozen)

    def to_dict(self) -> dict:
        """JSON-ready summary: label, path, note, rules (options dict), n_variables, transforms."""
        return {"label": self.label, "path": self.path, "note": self.note,
                "rules": self.rules.to_dict(), "n_variables": len(self.variables),
                "findings": list(self.findings),
                "transforms": [t.to_dict() if hasattr(t, "to_dict") else repr(t)
                               for t in self.transforms]}


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
        """``"target <- A:'name' dtype shape"`` plus ``"cast a->b"``, transforms and ``[via]``."""
        text = (f"{self.target} <- {_provider(self.source, self.name)} "
                f"{self.spec.dtype} {tuple(self.spec.shape)}")
        if self.cast:
            text += f" cast {self.spec.dtype}->{self.target_spec.dtype}"
        for t in self.transforms:
            text += f"; {t}"
        if self.via:
            text += f" [{self.via}]"
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
            text = f"shape mismatch: target {_q(self.target)} {self.target_shape} <- {prov} {self.source_shape}"
        elif self.kind == "dtype":
            text = f"dtype mismatch: target {_q(self.target)} {self.target_dtype} <- {prov} {self.source_dtype}"
        elif self.kind == "transform":
            text = (f"transform mismatch: target {_q(self.target)} {self.target_shape} <- "
                    f"{prov} {self.source_shape}")
        else:
            text = (f"shape and dtype mismatch: target {_q(self.target)} {self.target_shape} "
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
        provs = _and_list([_provider(*p) for p in self.providers])
        text = f"conflict: target {_q(self.target)} is provided by {provs}"
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


# --------------------------------------------------------------------------------------------
# Plan
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Plan:
    """Every decision and finding of a restore, before anything is read.

    Lists are sorted (targets and target-keyed findings by target name; per-source findings
    in source order, then name); ``sources`` keep the order given (it decides
    ``on_conflict='first'``/``'last'``).

    Attributes:
        targets: target specs, sorted by name.
        sources: the :class:`SourceView` objects, in the order given.
        assignments: target name -> :class:`Assignment`, sorted by target name.
        missing: targets no source provides and no ``allow_missing`` glob allows (blocking).
        allowed_missing: targets no source provides, allowed by ``allow_missing``.
        unused: label -> checkpoint names no assignment took, the dropped ones included (never blocking).
        dropped: label -> the unused names that the source's rules left out (never blocking).
        mismatched: :class:`Mismatch` findings (blocking unless ``on_shape_mismatch='skip'``).
        skipped: targets that have a provider but are left as they are (their mismatch).
        conflicts: :class:`Conflict` findings (blocking when unresolved).
        ambiguous: :class:`~ckptmerge.rules.Ambiguity` findings: names that regex rules
            rename differently (blocking when unresolved; shown with the conflicts).
        unmatched_rules: :class:`~ckptmerge.rules.UnmatchedRule` findings (explicit map
            entries block even a non-strict restore, the others only a strict one).
        structure: ``(source label, message)`` findings about names that do not line up: a
            Keras weights file whose layers differ from the model's, a model root swap that
            fits two targets (blocking a strict restore).
        allow_missing, on_conflict, on_shape_mismatch, cast, model_root: the options used.

    Example:
        >>> t = [VariableInfo("x", (2,), "float32")]
        >>> plan = make_plan(t, [SourceView("A", "<memory>", "", {"x": t[0]})])
        >>> plan.ok, list(plan.assignments)
        (True, ['x'])
    """

    targets: List[VariableInfo]
    sources: List[SourceView]
    assignments: Dict[str, Assignment]
    missing: List[str]
    allowed_missing: List[str]
    unused: Dict[str, List[str]]
    dropped: Dict[str, List[str]]
    mismatched: List[Mismatch]
    skipped: List[str]
    conflicts: List[Conflict]
    ambiguous: List[Ambiguity]
    unmatched_rules: List[UnmatchedRule]
    allow_missing: Tuple[str, ...] = ()
    on_conflict: str = "error"
    on_shape_mismatch: str = "error"
    cast: bool = False
    structure: List[Tuple[str, str]] = field(default_factory=list)
    model_root: Optional[str] = None
    _binding: Any = field(default=None, repr=False, compare=False)

    @property
    def unresolved_conflicts(self) -> List[str]:
        """Targets left alone because of an unresolved conflict (sorted)."""
        return sorted(c.target for c in self.conflicts if c.blocking)

    def blocking(self, strict: bool = True) -> List[str]:
        """One fix-it line per finding that blocks a restore.

        Args:
            strict: ``True``: missing targets, mismatches (unless ``on_shape_mismatch='skip'``),
                unresolved conflicts and ambiguities, and every unmatched rule block.
                ``False``: only explicit map entries that match nothing (or name no target).

        Returns:
            The lines, in a stable order (empty when nothing blocks).

        Example:
            >>> make_plan([VariableInfo("c/z", (), "int64")], []).blocking()
            ["missing: target 'c/z' is provided by no source (map a checkpoint variable to it, or pass allow_missing=['c/z'])"]
        """
        if not strict:
            return [u.message() for u in self.unmatched_rules if u.explicit]
        lines = [f"missing: target {_q(t)} is provided by no source (map a checkpoint variable "
                 f"to it, or pass allow_missing=[{_q(t)}])" for t in self.missing]
        if self.on_shape_mismatch == "error":
            lines += [m.message() for m in self.mismatched]
        lines += [c.message() for c in self.conflicts if c.blocking]
        lines += [a.message() for a in self.ambiguous if not a.resolved]
        lines += [u.message() for u in self.unmatched_rules]
        lines += [f"structure: source {_q(label)}: {text}" for label, text in self.structure]
        return lines

    @property
    def ok(self) -> bool:
        """True when nothing blocks a strict restore."""
        return not self.blocking(strict=True)

    def check(self, strict: bool = True, *, action: str = "restore") -> "Plan":
        """Raise one :class:`~ckptmerge.errors.PlanError` listing every blocking finding.

        With ``strict=False``, the findings that are let through are logged as one warning.

        Args:
            strict: see :meth:`blocking`.
            action: what the plan is checked for, ``"restore"`` or ``"write"`` (a merge), for the
                wording of the message and the warning.

        Returns:
            ``self``, so ``plan.check().restore()`` reads naturally.

        Raises:
            PlanError: with ``e.plan`` set to this plan; the message gives the count, then
                one line per finding (the first 20, then "... and N more").

        Example:
            >>> make_plan([VariableInfo("x", (), "int64")], [], allow_missing=["x"]).check().ok
            True
        """
        lines = self.blocking(strict=strict)
        if not lines:
            lenient = [] if strict else self.blocking(strict=True)
            if lenient:
                _log.warning("ckptmerge: %s with %d finding(s) not enforced (strict=False): %s",
                             _ACTIONS[action][1], len(lenient),
                             "; ".join(lenient[:3]) + (" ..." if len(lenient) > 3 else ""))
            return self
        n = len(lines)
        head = (f"{n} blocking finding{'s' if n != 1 else ''} in the plan "
                f"(strict={strict}):")
        body = [f"  - {escape_name(line)}" for line in lines[:CHECK_LIMIT]]
        if n > CHECK_LIMIT:
            body.append(f"  ... and {n - CHECK_LIMIT} more (plan.report() or "
                        "`ckptmerge plan --json` shows all)")
        tail = []
        if strict and len(self.blocking(strict=False)) < n:
            tail.append(f"Pass strict=False to {_ACTIONS[action][0]}; then only explicit "
                        "map entries that match nothing block.")
        raise PlanError("\n".join([head, *body, *tail]), plan=self)

    def report(self, *, limit: Optional[int] = 50) -> str:
        """Plain-text report for people (see :func:`ckptmerge.report.render_plan`)."""
        from .report import render_plan

        return render_plan(self, limit=limit)

    def _repr_html_(self) -> str:
        from .notebook import plan_html

        return plan_html(self)

    def restore(self, session: Any = None, *, strict: bool = True, progress: Any = None) -> "Report":
        """Restore the planned variables (see :mod:`ckptmerge.backends`).

        Only plans made by :func:`ckptmerge.plan` (which attaches the live variables and
        readers) can be restored.

        Args:
            session: graph mode: the ``tf.compat.v1.Session`` (default: the default session).
            strict: raise :class:`~ckptmerge.PlanError` for any finding but ``unused``, before a
                single variable changes; ``False`` restores what matches and logs a warning.
            progress: optional ``progress(done_bytes, total_bytes)`` callback.

        Returns:
            The :class:`~ckptmerge.report.Report`: restored and skipped targets, timings.

        Raises:
            PlanError: see ``strict``.
            RestoreError: a read failed; every target variable kept its value.

        Example:
            >>> report = cm.plan(model, [cm.Source("runs/A")]).restore()   # doctest: +SKIP
        """
        from .backends import run_plan

        return run_plan(self, session=session, strict=strict, progress=progress)

    def set_initializers(self, *, strict: bool = True) -> List[str]:
        """Make each assigned variable's initializer read its value from the sources (graph mode).

        As ``tf.compat.v1.train.init_from_checkpoint`` does: afterwards
        ``tf.compat.v1.global_variables_initializer()``, a ``Scaffold``, a
        ``MonitoredTrainingSession`` or an Estimator warm-start the variables with no call of
        ours, and ``variable.initialized_value()`` holds the checkpoint value. TF tensor bundles
        read as stored go through TF's own ``RestoreV2``; casts, transforms and other formats
        through ckptmerge's reader, inside the initializer. Values are read when the initializer
        runs, one variable at a time: unlike :meth:`restore`, this path is not atomic.

        Args:
            strict: as for :meth:`restore`; findings are checked now.

        Returns:
            The target names whose initializers now read from the sources, sorted.

        Raises:
            PlanError: see ``strict``.
            CkptMergeError: not graph mode, or the graph is finalized.

        Example:
            >>> cm.plan(None, [cm.Source("runs/A")]).set_initializers()   # doctest: +SKIP
            >>> with tf.compat.v1.train.MonitoredTrainingSession() as sess:   # doctest: +SKIP
            ...     sess.run(train_op)
        """
        from .backends.graph import set_initializers

        self.check(strict=strict, action="restore")
        return set_initializers(self, self._binding)

    def savers(self) -> Dict[str, Any]:
        """One ``tf.compat.v1.train.Saver`` per checkpoint source, built once per plan (graph mode).

        Each is built from a ``{checkpoint_key: variable}`` dict of that source's assignments
        (a list of parts for a partitioned variable), the canonical TF way; call
        ``saver.restore(sess, path)`` yourself when you want TF's own I/O. :meth:`restore` is
        faster and atomic across sources (see the README), so it does not use them.

        Returns:
            ``{source label: Saver}``; the same objects on every call (no new ops).

        Raises:
            CkptMergeError: not graph mode, or an assignment needs a cast or transform (a Saver
                cannot convert values) or comes from memory.

        Example:
            >>> for label, saver in plan.savers().items():          # doctest: +SKIP
            ...     saver.restore(sess, {s.label: s.path for s in plan.sources}[label])
        """
        from .backends.graph import build_savers

        return build_savers(self, self._binding)

    def with_binding(self, binding: Any) -> "Plan":
        """A copy of this plan with live readers/variables attached (used by the restore layer)."""
        return dataclasses.replace(self, _binding=binding)

    def to_dict(self) -> dict:
        """JSON-ready dict (shapes as lists, everything sorted as in the plan).

        Schema::

            {"ok": bool, "blocking": [str], "blocking_non_strict": [str],
             "options": {"allow_missing": [glob], "on_conflict": str,
                         "on_shape_mismatch": str, "cast": bool},
             "targets": [VariableInfo.to_dict()],
             "sources": [{"label", "path", "note", "rules": {...}, "n_variables"}],
             "assignments": {target: {"target", "source", "name", "key", "dtype", "shape",
                                      "target_dtype", "target_shape", "cast", "rule", "nbytes"}},
             "missing": [str], "allowed_missing": [str], "skipped": [str],
             "unused": {label: [str]}, "dropped": {label: [str]},
             "mismatched": [Mismatch.to_dict()], "conflicts": [Conflict.to_dict()],
             "ambiguous": [Ambiguity.to_dict()], "unmatched_rules": [UnmatchedRule.to_dict()],
             "structure": [{"source", "message"}]}

        Example:
            >>> import json
            >>> json.loads(json.dumps(make_plan([], []).to_dict()))["ok"]
            True
        """
        blocking = self.blocking(strict=True)
        return {
            "ok": not blocking,
            "blocking": blocking,
            "blocking_non_strict": self.blocking(strict=False),
            "options": {"allow_missing": list(self.allow_missing), "on_conflict": self.on_conflict,
                        "on_shape_mismatch": self.on_shape_mismatch, "cast": self.cast},
            "targets": [t.to_dict() for t in self.targets],
            "sources": [s.to_dict() for s in self.sources],
            "assignments": {k: a.to_dict() for k, a in self.assignments.items()},
            "missing": list(self.missing),
            "allowed_missing": list(self.allowed_missing),
            "skipped": list(self.skipped),
            "unused": {k: list(v) for k, v in self.unused.items()},
            "dropped": {k: list(v) for k, v in self.dropped.items()},
            "mismatched": [m.to_dict() for m in self.mismatched],
            "conflicts": [c.to_dict() for c in self.conflicts],
            "ambiguous": [a.to_dict() for a in self.ambiguous],
            "unmatched_rules": [u.to_dict() for u in self.unmatched_rules],
            "structure": [{"source": label, "message": text} for label, text in self.structure],
        }


# --------------------------------------------------------------------------------------------
# make_plan
# --------------------------------------------------------------------------------------------


def _as_allow_missing(value: Any) -> Tuple[GlobFilter, ...]:
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, (list, tuple)):
        raise OptionError("allow_missing must be a glob (str) or a list of globs over target "
                          f"names, e.g. ['head/*']; received {_received(value)}.")
    out = []
    for i, pat in enumerate(value):
        try:
            out.append(GlobFilter(pat))
        except RuleError as e:
            raise OptionError(f"allow_missing[{i}]: {e}") from None
    return tuple(dict.fromkeys(out))


class _Candidate(NamedTuple):
    """A checkpoint name that lands on a target (a tuple: a plan makes one per target)."""

    target: str
    source_index: int
    label: str
    name: str
    rule: Optional[Union[MapRule, RegexRule]]
    via: Optional[str] = None

    @property
    def order(self) -> Tuple[int, str]:
        """(source index, checkpoint name): the resolution order."""
        return self.source_index, self.name


@dataclass
class _SourceMatch:
    candidates: List[_Candidate]
    unmatched: List[UnmatchedRule]
    ambiguous: List[Ambiguity]
    dropped: List[str]
    selected: Set[str]
    structure: List[str] = field(default_factory=list)


def _common_root(names: Sequence[str]) -> Optional[str]:
    """The first name component every name shares (``sequential`` of ``sequential/dense/kernel``)."""
    root = None
    for n in names:
        head, sep, _ = n.partition("/")
        if not sep or (root is not None and head != root):
            return None
        root = head
    return root


def root_swaps(names: Sequence[str], target_names: Iterable[str],
               model_root: str) -> Tuple[Dict[str, str], List[str]]:
    """Match checkpoint names to a Keras model's targets with the model's own name replaceable.

    A checkpoint of ``sequential`` fits ``sequential_1`` and names without a root
    (``dense/kernel``) fit ``sequential/dense/kernel``: the name is tried with the checkpoint's
    common root (if any) removed and with ``model_root`` put in front (if not empty).

    Args:
        names: checkpoint names that met no target as they are.
        target_names: every target name.
        model_root: the model's root scope in its target names (``""`` if they have none).

    Returns:
        ``({checkpoint name: target}, [finding])``: a name two ways fit two targets is a
        finding, never a guess.

    Example:
        >>> root_swaps(["sequential/dense/kernel"], ["sequential_1/dense/kernel"], "sequential_1")
        ({'sequential/dense/kernel': 'sequential_1/dense/kernel'}, [])
    """
    targets = set(target_names)
    src_root = _common_root(names)
    out: Dict[str, str] = {}
    findings: List[str] = []
    for n in names:
        forms = [n]
        if src_root is not None:
            forms.append(n[len(src_root) + 1:])
        fits = sorted({f"{model_root}/{f}" if model_root else f for f in forms} & targets - {n})
        if len(fits) == 1:
            out[n] = fits[0]
        elif fits:
            findings.append(f"{_q(n)} fits {_and_list([_q(f) for f in fits])} once the model's "
                            "root name is ignored; map it explicitly (map={...})")
    return out, findings


_NAME_AND_TARGET = operator.itemgetter(0, 1)
_FIRST = operator.itemgetter(0)
_THIRD = operator.itemgetter(2)
_ORDER = operator.attrgetter("order")
_NAME = operator.attrgetter("name")
_ANAME = _NAME

_SERIES = re.compile(r"^([a-z][a-z0-9_]*?)(?:_(\d+))?$")


def series_shifts(names: Sequence[str], target_names: Iterable[str], model_root: str) -> Dict[str, str]:
    """Undo a Keras auto-name shift of a model's layers (TF issue 46317), at every depth.

    Keras names layers ``dense``, ``dense_1``, ... per process, so a model built after another
    one saves ``dense_3``... and a fresh rebuild has ``dense``...: names that also exist on the
    other side would pair the wrong layers. The same holds inside nested models and layers (a
    Sequential inside a Functional, Dense layers inside a custom layer), whose own names shift
    too. Within each scope, a family of sub-scopes (one base name) is shifted only when it is
    certain: the same number of them on both sides, each side numbered without gaps, the numbers
    offset by a constant, and every shifted scope holding exactly the variables of the scope it
    lands on (with the shifts inside it undone). Scopes named alike on both sides are looked
    into for shifts further down.

    Args:
        names: the target names identity would give the checkpoint's names (root already swapped).
        target_names: every target name.
        model_root: the model's root scope in its target names (``""`` if none).

    Returns:
        ``{name: shifted target}`` for the names that move.

    Example:
        >>> series_shifts(["m/dense_3/kernel", "m/dense_4/kernel"], ["m/dense/kernel", "m/dense_1/kernel"], "m")
        {'m/dense_3/kernel': 'm/dense/kernel', 'm/dense_4/kernel': 'm/dense_1/kernel'}
        >>> series_shifts(["m/sequential_1/dense_3/kernel"], ["m/sequential_2/dense_8/kernel"], "m")
        {'m/sequential_1/dense_3/kernel': 'm/sequential_2/dense_8/kernel'}
    """
    head = f"{model_root}/" if model_root else ""
    k = len(head)
    moves = _scope_shifts([n[k:] for n in names if n.startswith(head)],
                          [t[k:] for t in target_names if t.startswith(head)])
    return {head + a: head + b for a, b in moves.items()}


@functools.lru_cache(maxsize=4096)
def _series_parts(scope: str) -> Optional[Tuple[str, int]]:
    """``("dense", 3)`` for ``dense_3``, ``("dense", 0)`` for ``dense``; ``None`` for a scope that
    is not a Keras auto-name (cached: the same scopes recur under every parent)."""
    m = _SERIES.match(scope)
    return (m.group(1), int(m.group(2) or 0)) if m else None


def _layer_families(names: Iterable[str]) -> Dict[str, Dict[int, Tuple[str, List[str]]]]:
    """``{base: {number: (scope, [names inside it])}}`` of the sub-scopes of relative names
    (``dense_3/kernel`` is in family ``dense``, number 3); a family where two scopes share a
    number (``dense`` and ``dense_0``) is left out: not an automatic series."""
    out: Dict[str, Dict[int, Tuple[str, List[str]]]] = {}
    bad = set()
    for n in names:
        scope, sep, rest = n.partition("/")
        parts = _series_parts(scope) if sep else None
        if parts is None:
            continue
        base, number = parts
        family = out.setdefault(base, {})
        held = family.get(number)
        if held is None:
            family[number] = (scope, [rest])
        elif held[0] == scope:
            held[1].append(rest)
        else:
            bad.add(base)
    for base in bad:
        del out[base]
    return out


def _scope_shifts(names: Sequence[str], targets: Sequence[str]) -> Dict[str, str]:
    """:func:`series_shifts` within one scope, on names relative to it: ``{name: moved name}``."""
    ckpt, tgt = _layer_families(names), _layer_families(targets)
    moves: Dict[str, str] = {}
    for base, layers in ckpt.items():
        have = tgt.get(base)
        if not have:
            continue
        if set(layers) == set(have):  # named alike: look inside for shifts further down
            for number, (scope, inside) in layers.items():
                there = have[number][1]
                for a, b in _scope_shifts(inside, there).items():
                    moves[f"{scope}/{a}"] = f"{scope}/{b}"
            continue
        c, t = sorted(layers), sorted(have)
        if len(c) != len(t) or c != list(range(c[0], c[0] + len(c))) or t != list(range(t[0], t[0] + len(t))):
            continue
        inner = []
        for i, j in zip(c, t):  # every scope must hold exactly what its twin holds
            inside, there = layers[i][1], have[j][1]
            shifted = _scope_shifts(inside, there)
            if {shifted.get(x, x) for x in inside} != set(there) or len(inside) != len(there):
                break
            inner.append(shifted)
        else:
            for (i, j), shifted in zip(zip(c, t), inner):
                old, new = layers[i][0], have[j][0]
                for x in layers[i][1]:
                    moves[f"{old}/{x}"] = f"{new}/{shifted.get(x, x)}"
    return moves


def _match_source(si: int, src: SourceView, target_by_name: Mapping[str, VariableInfo],
                  on_conflict: str, model_root: Optional[str] = None) -> _SourceMatch:
    """Apply one source's rules and match the results against the target names."""
    res = src.rules._apply(list(src.variables), src.hidden)
    label = src.label
    target_names = list(target_by_name)
    unmatched = [dataclasses.replace(u, source=label) for u in res.unmatched]
    ambiguous: List[Ambiguity] = []
    drop = list(res.dropped)
    pairs: List[Tuple[str, str, Optional[Union[MapRule, RegexRule]]]] = res.triples
    selected = set(map(_FIRST, pairs))
    for amb in res.ambiguous:
        if on_conflict == "error":
            ambiguous.append(dataclasses.replace(amb, source=label))
            selected.add(amb.name)
            continue
        chosen = amb.targets[0 if on_conflict == "first" else -1]
        ambiguous.append(dataclasses.replace(amb, source=label, resolved=True, resolved_to=chosen))
        if chosen is None:
            drop.append(amb.name)
        else:
            selected.add(amb.name)
            pairs.append((amb.name, chosen, None))

    structure: List[str] = []
    via = dict(src.notes)
    if model_root is not None:  # a Keras target: its model's own name is no barrier
        lost = [n for n, t, rule in pairs if rule is None and t not in target_by_name]
        swaps, structure = root_swaps(lost, target_names, model_root)
        pairs = [(n, swaps.get(n, t), rule) for n, t, rule in pairs]
        for n, t in swaps.items():
            via[n] = f"model root: {_q(n)} as {_q(t)}"
        shifted = series_shifts([t for _, t, rule in pairs if rule is None], target_names, model_root)
        if shifted:  # layers numbered from where another model in the saving process left off
            pairs = [(n, shifted.get(t, t) if rule is None else t, rule) for n, t, rule in pairs]
            for n, t, rule in pairs:
                if rule is None and n not in via and t != n and t in shifted.values():
                    via[n] = f"auto-name shift: {_q(n)} as {_q(t)}"
    if src.aligned:  # structural alignment, for names no rule put on a target (rules win)
        # (the alignment already left out what include/exclude or a None regex drop on purpose)
        landed = {n for n, t, _ in pairs if t in target_by_name}
        pairs = [(n, src.aligned[n], None) if n in src.aligned and n not in landed else (n, t, rule)
                 for n, t, rule in pairs]
        listed = {n for n, _, _ in pairs}
        extra = [n for n in src.aligned if n not in listed]
        pairs += [(n, src.aligned[n], None) for n in extra]
        selected.update(extra)
        drop = [n for n in drop if n not in src.aligned]
    keys = map(_NAME_AND_TARGET, pairs)
    if not all(map(operator.le, keys, map(_NAME_AND_TARGET, pairs[1:]))):  # (the rules give them sorted)
        pairs.sort(key=_NAME_AND_TARGET)
    landed = [p for p in pairs if p[1] in target_by_name]
    # How a name met its target: shown when no rule says so, and always for what a source's
    # layout did to the value (a transpose is worth seeing beside any rule).
    notes: Iterable[Optional[str]] = itertools.repeat(None)
    if via:
        notes = [note if rule is None or (note or "").startswith("layout:") else None
                 for note, rule in zip(map(via.get, map(_FIRST, landed)), map(_THIRD, landed))]
    # (each candidate holds its target's own name string, so the rules' copies can go now)
    candidates = [_Candidate(target_by_name[t].name, si, label, n, rule, note)
                  for (n, t, rule), note in zip(landed, notes)]
    lost = [p for p in pairs if p[1] not in target_by_name] if len(landed) < len(pairs) else []
    for name, tname, rule in lost:
        if isinstance(rule, MapRule) and not rule.is_scope:
            unmatched.append(UnmatchedRule(
                "map", rule.describe(), tuple(suggest(tname, target_names)), True, label,
                reason=f"names no target variable {_q(tname)}"))
    # A scope or regex rule that renamed names but put none on a target does nothing.
    landed_rules = {r.describe() for r in {id(r): r for r in map(_THIRD, landed) if r is not None}.values()}
    renamed_by: Dict[str, List[Tuple[str, str]]] = {}  # rule display -> [(name, target)], none landed
    rule_of: Dict[str, Union[MapRule, RegexRule]] = {}
    for name, tname, rule in lost:
        if rule is None or (isinstance(rule, MapRule) and not rule.is_scope):
            continue
        d = rule.describe()
        if d not in landed_rules:
            rule_of.setdefault(d, rule)
            renamed_by.setdefault(d, []).append((name, tname))
    for d, renamed in renamed_by.items():
        rule = rule_of[d]
        n0, t0 = renamed[0]
        k = len(renamed)
        if isinstance(rule, MapRule):
            kind, sugg = "map-scope", suggest(rule.target, _scopes_of(target_names))
        else:
            kind, sugg = "regex", suggest(t0, target_names)
        unmatched.append(UnmatchedRule(
            kind, d, tuple(sugg), False, label,
            reason=(f"renamed {k} checkpoint variable{'s' if k != 1 else ''} but none to a "
                    f"target variable (e.g. {_q(n0)} -> {_q(t0)})")))
    return _SourceMatch(candidates, unmatched, ambiguous, sorted(drop), selected,
                        list(src.findings) + structure)


def make_plan(targets: Sequence[VariableInfo], sources: Sequence[SourceView], *,
              allow_missing: Union[str, Sequence[str]] = (), on_conflict: str = "error",
              on_shape_mismatch: str = "error", cast: bool = False,
              model_root: Optional[str] = None) -> Plan:
    """Work out which checkpoint variable restores which target, and every finding.

    Pure: no file access, no TensorFlow.

    Args:
        targets: the target variables' specs (names must be unique).
        sources: one :class:`SourceView` per checkpoint (labels must be unique); their order
            decides ``on_conflict='first'``/``'last'``.
        allow_missing: globs (:func:`fnmatch.fnmatchcase`) over target names that may stay
            unrestored without blocking.
        on_conflict: ``"error"`` (a target with several providers is not restored and
            blocks), ``"first"`` or ``"last"`` (pick by source order, then checkpoint name
            order; for regex ambiguity, by rule order).
        on_shape_mismatch: ``"error"`` (a mismatch blocks) or ``"skip"`` (leave the target
            as it is). Both leave a mismatched target unrestored (listed in ``skipped``).
        cast: convert dtypes to the target's dtype instead of reporting a dtype mismatch,
            where :func:`ckptmerge.transforms.cast_problem` allows it (not string <-> number,
            not complex -> real).
        model_root: for a Keras model target, its root scope in the target names (``""``
            when they have none): checkpoint names that meet no target are matched with the
            model's own name replaceable (see :func:`root_swaps`). ``None``: names as they are.

    Returns:
        The :class:`Plan`.

    Raises:
        OptionError: an option has an invalid value or type, or two sources share a label.
        PlanError: two targets share a name (``e.plan`` is ``None``).

    Example:
        >>> t = [VariableInfo("c/x1", (3,), "float32")]
        >>> a = SourceView("A", "<memory>", "", {"a1": VariableInfo("a1", (3,), "float32")},
        ...                Rules.from_options(map={"a1": "c/x1"}))
        >>> make_plan(t, [a]).assignments["c/x1"].name
        'a1'
    """
    with paused_gc():  # hundreds of thousands of small acyclic objects: see ckptmerge.gcpause
        return _make_plan(targets, sources, allow_missing=allow_missing, on_conflict=on_conflict,
                          on_shape_mismatch=on_shape_mismatch, cast=cast, model_root=model_root)


def _make_plan(targets: Sequence[VariableInfo], sources: Sequence[SourceView], *,
               allow_missing: Union[str, Sequence[str]], on_conflict: str, on_shape_mismatch: str,
               cast: bool, model_root: Optional[str]) -> Plan:
    _check_choice("on_conflict", on_conflict, ON_CONFLICT)
    _check_choice("on_shape_mismatch", on_shape_mismatch, ON_SHAPE_MISMATCH)
    if not isinstance(cast, bool):
        raise OptionError(f"cast must be True or False; received {_received(cast)}.")
    if model_root is not None and not isinstance(model_root, str):
        raise OptionError(f"model_root must be a str or None; received {_received(model_root)}.")
    allow = _as_allow_missing(allow_missing)
    if isinstance(targets, (str, bytes, Mapping)) or not isinstance(targets, Iterable):
        raise OptionError("targets must be a list of VariableInfo; received "
                          f"{_received(targets)}.")
    targets = list(targets)
    bad = [i for i, t in enumerate(targets) if not isinstance(t, VariableInfo)]
    if bad:
        raise OptionError(f"targets must be VariableInfo objects; targets[{bad[0]}] is "
                          f"{_received(targets[bad[0]])} ({len(bad)} bad in all).")
    if isinstance(sources, (str, bytes, Mapping)) or not isinstance(sources, Iterable):
        raise OptionError(f"sources must be a list of SourceView; received {_received(sources)}.")
    sources = list(sources)
    bad = [i for i, s in enumerate(sources) if not isinstance(s, SourceView)]
    if bad:
        raise OptionError(f"sources must be SourceView objects; sources[{bad[0]}] is "
                          f"{_received(sources[bad[0]])}.")

    target_by_name = {t.name: t for t in sorted(targets, key=_NAME)}
    if len(target_by_name) != len(targets):
        counts: Dict[str, int] = {}
        for t in targets:
            counts[t.name] = counts.get(t.name, 0) + 1
        dups = sorted(n for n, c in counts.items() if c > 1)
        raise PlanError(f"{len(dups)} target name{'s are' if len(dups) != 1 else ' is'} used by "
                        "more than one target variable: " + ", ".join(_q(d) for d in dups)
                        + ". Target names must be unique; rename the variables or restore them "
                        "in separate calls.", plan=None)
    labels: Dict[str, int] = {}
    for s in sources:
        labels[s.label] = labels.get(s.label, 0) + 1
    dup_labels = [lb for lb, c in labels.items() if c > 1]
    if dup_labels:
        raise OptionError("source labels must be unique; " + ", ".join(_q(d) for d in dup_labels)
                          + " appear" + ("s" if len(dup_labels) == 1 else "")
                          + " more than once. Give each source its own label.")

    source_by_label = {s.label: s for s in sources}
    target_names = list(target_by_name)
    first: Dict[str, _Candidate] = {}  # target -> its first candidate
    more: Dict[str, List[_Candidate]] = {}  # target -> all its candidates, when it has several
    unmatched: List[UnmatchedRule] = []
    ambiguous: List[Ambiguity] = []
    dropped: Dict[str, List[str]] = {}
    selected: Dict[str, Set[str]] = {}
    structure: List[Tuple[str, str]] = []

    for si, src in enumerate(sources):
        found = _match_source(si, src, target_by_name, on_conflict, model_root)
        structure += [(src.label, text) for text in found.structure]
        for c in found.candidates:
            prev = first.setdefault(c.target, c)
            if prev is not c:
                more.setdefault(c.target, [prev]).append(c)
        unmatched.extend(found.unmatched)
        ambiguous.extend(found.ambiguous)
        dropped[src.label] = found.dropped
        selected[src.label] = found.selected

    assignments: Dict[str, Assignment] = {}
    conflicts: List[Conflict] = []
    mismatched: List[Mismatch] = []
    skipped: List[str] = []
    missing: List[str] = []
    allowed: List[str] = []
    plain = {s.label: not s.transforms for s in sources}  # no value transforms: the usual case
    variables = {s.label: s.variables for s in sources}
    for tname, tspec in target_by_name.items():
        chosen: Optional[_Candidate] = first.get(tname)
        if chosen is None:
            (allowed if any(g.matches(tname) for g in allow) else missing).append(tname)
            continue
        if tname in more:
            cands = sorted(more[tname], key=_ORDER)
            chosen = {"first": cands[0], "last": cands[-1]}.get(on_conflict)
            conflicts.append(Conflict(
                tname, tuple((c.label, c.name) for c in cands),
                None if chosen is None else (chosen.label, chosen.name)))
            if chosen is None:
                continue
        spec = variables[chosen.label][chosen.name]
        rule = chosen.rule.describe() if chosen.rule else None
        if plain[chosen.label] and spec.shape == tspec.shape and spec.dtype == tspec.dtype:
            assignments[tname] = Assignment(tname, chosen.label, chosen.name, spec.raw_key, spec, tspec,
                                            False, rule, (), chosen.via)
            continue
        src = source_by_label[chosen.label]
        src_shape, tgt_shape = tuple(spec.shape), tuple(tspec.shape)
        mismatch = functools.partial(Mismatch, tname, chosen.label, chosen.name, spec.raw_key,
                                     tgt_shape, src_shape, tspec.dtype, spec.dtype)
        # Cast first, then the value transforms (as the backends do).
        dtype_differs = spec.dtype != tspec.dtype
        problem = cast_problem(spec.dtype, tspec.dtype) if dtype_differs else None
        dtype_bad = dtype_differs and (not (cast if src.cast is None else src.cast) or problem is not None)
        ts = [t for t in src.transforms if t.applies_to(tname)]
        out_shape, detail = src_shape, problem or ""
        if ts:
            try:
                out_shape = tuple(chain_output_shape(ts, src_shape, tgt_shape))
            except TransformError as e:
                mismatched.append(mismatch("transform", str(e)))
                skipped.append(tname)
                continue
            if out_shape != tgt_shape:
                detail = "; ".join(x for x in (problem, f"{out_shape} after the transforms") if x)
        shape_differs = out_shape != tgt_shape
        if shape_differs or dtype_bad:
            kind = "shape+dtype" if shape_differs and dtype_bad else ("shape" if shape_differs else "dtype")
            mismatched.append(mismatch(kind, detail))
            skipped.append(tname)
            continue
        assignments[tname] = Assignment(
            tname, chosen.label, chosen.name, spec.raw_key, spec, tspec, cast=dtype_differs,
            rule=rule, via=chosen.via,
            transforms=tuple(t.describe(src_shape, tgt_shape) if hasattr(t, "describe") else repr(t)
                             for t in ts))

    for g in allow:
        if not any(g.matches(t) for t in target_names):
            cands = [s + "*" for s in _scopes_of(target_names)] + target_names
            unmatched.append(UnmatchedRule("allow_missing", f"allow_missing {_q(g.pattern)}",
                                           tuple(suggest(g.pattern, cands, cutoff=0.6)), False,
                                           None, reason="matched no target variable"))

    # A value transform (vocab remap, slice) whose target glob reaches no variable this source
    # provides is a typo or a stale config: report it, as an unmatched rule.
    if not all(plain.values()):
        provided: Dict[str, List[str]] = {}
        for a in assignments.values():
            provided.setdefault(a.source, []).append(a.target)
        for m in mismatched:
            provided.setdefault(m.source, []).append(m.target)
        for src in sources:
            for t in src.transforms:
                if not any(t.applies_to(n) for n in provided.get(src.label, ())):
                    unmatched.append(UnmatchedRule(
                        "transform", f"{type(t).__name__} for {_q(getattr(t, 'target', '?'))}",
                        tuple(suggest(getattr(t, "target", ""), target_names, cutoff=0.6)), False, src.label,
                        reason="applies to no variable this source provides"))

    if len(sources) == 1:
        taken = {sources[0].label: set(map(_ANAME, assignments.values()))}
    else:
        taken = {}
        for a in assignments.values():
            taken.setdefault(a.source, set()).add(a.name)
    # "unused" is every name nothing took (the definition); "dropped" says which of
    # those the rules left out on purpose, so reports can tell the two apart.
    unused = {s.label: sorted((selected[s.label] - taken.get(s.label, set())) | set(dropped[s.label]))
              for s in sources}
    order = {s.label: i for i, s in enumerate(sources)}
    ambiguous.sort(key=lambda a: (order[a.source], a.name))

    return Plan(
        targets=list(target_by_name.values()),
        sources=list(sources),
        assignments=assignments,
        missing=missing,
        allowed_missing=allowed,
        unused=unused,
        dropped=dropped,
        mismatched=mismatched,
        skipped=skipped,
        conflicts=conflicts,
        ambiguous=ambiguous,
        unmatched_rules=unmatched,
        allow_missing=tuple(g.pattern for g in allow),
        on_conflict=on_conflict,
        on_shape_mismatch=on_shape_mismatch,
        cast=cast,
        structure=structure,
        model_root=model_root,
    )
