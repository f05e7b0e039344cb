"""The inputs and the result of a plan: :class:`SourceView` (what the planner knows of one source),
:class:`Plan` (every decision and finding, with :meth:`Plan.check`, reports, ``to_dict`` and the
restore entry points) and :class:`OptionError`. :func:`ckptmerge.planning.planner.make_plan` builds plans;
nothing here plans, reads files or imports TensorFlow (restoring imports the backends lazily).

Example:
    >>> from ckptmerge.planning.planner import make_plan
    >>> make_plan([], []).ok
    True
"""

from __future__ import annotations

import dataclasses
import importlib
import itertools
import operator
import types
from dataclasses import dataclass, field
from typing import (
    TYPE_CHECKING,
    Any,
    Callable,
    Dict,
    Iterable,
    List,
    Mapping,
    Optional,
    Tuple,
)

from ..alignment.keraspaths import PathAlignment
from ..core.args import describe_value
from ..core.errors import OptionError, PlanError
from ..core.jsonout import Entries, Records
from ..core.redact import get_logger, redact, redacted_repr
from ..core.specs import VariableInfo
from ..core.text import escape_name, quote_name
from .findings import Assignment, Conflict, Mismatch
from .kerascompat import KerasVerdict
from .rules import Ambiguity, Rules, UnmatchedRule

if TYPE_CHECKING:  # pragma: no cover
    from ..render.report import Report

__all__ = ["OptionError", "SourceView", "Plan", "CHECK_LIMIT"]

_log = get_logger(__name__)
#: action -> (what strict=False lets you do, the warning's verb)
_ACTIONS = {"restore": ("restore what can be restored", "restoring"),
            "write": ("write what can be written", "merging")}

#: How many blocking lines :meth:`Plan.check` shows before "... and N more".
CHECK_LIMIT = 20


def late(module: str, name: str) -> Any:
    """``module.name``, imported when called: the one way up from planning.

    A plan renders itself (``report()``, ``_repr_html_``) and restores itself (``restore()``),
    but rendering and the TF backends sit in layers above planning. They are looked up by
    module name at the call, so planning never imports them (tests/test_layout.py).

    Example:
        >>> late("ckptmerge.core.text", "plural")(2, "target")
        '2 targets'
    """
    return getattr(importlib.import_module(module), name)




@dataclass(frozen=True)
class SourceView:
    """What the plan needs to know of one source checkpoint.

    Attributes:
        label: unique display name, e.g. ``"A"`` or ``"base"``.
        path: resolved checkpoint prefix, or ``"<memory>"``.
        note: how it was resolved, e.g. ``"latest checkpoint per runs/A/checkpoint (step 10)"``.
        variables: name -> :class:`~ckptmerge.core.specs.VariableInfo`, already filtered (e.g.
            optimizer state left out); stored as a read-only mapping sorted by name (a
            ``types.MappingProxyType`` sorted by name is kept as it is, not copied).
        rules: the source's selection/rename rules (identity by default).
        transforms: value transforms (:mod:`ckptmerge.planning.transforms`: objects with
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
        finding_targets: finding -> the targets it leaves unrestored: the finding is settled
            (dropped from the plan) when each of them is restored from elsewhere or allowed by
            ``allow_missing``.
        finding_names: finding -> the checkpoint names it leaves unused: settled when the
            source's rules drop every one of them (``exclude``).
        aligned: ``{checkpoint name: target}`` from structural alignment
            (``Source(align="structure")``), used for names the rules put on no target.
        keras: for a Keras weights file restored into a Keras model, what Keras's own
            ``load_weights`` would do with it (a :class:`~ckptmerge.planning.kerascompat.KerasVerdict`),
            else ``None``; reports show it beside ckptmerge's plan.
        drift: for such a file with ``align="structure"``, the layers path-drift repair paired
            (file path -> model path) and those it left unresolved
            (a :class:`~ckptmerge.alignment.keraspaths.PathAlignment`), else ``None``.
        layout: the framework layout the source is read through (``"torch"``), or ``None``.
        undecided: names (or scopes) of tensors the layout could not decide (a square 2-D weight
            that may need transposing or not): structural alignment never pairs them.
        unresolved: what structural alignment left unresolved for this source (its
            :class:`~ckptmerge.alignment.entries.Unresolved` groups: ties, and matches below the
            confidence floor), counted in the plan's :attr:`~Plan.coverage`.
        order: checkpoint names in the order the checkpoint saved them, where it records one
            (a TF2 object graph), else ``None``: evidence for structural alignment. Plans made by
            :func:`ckptmerge.plan` leave it ``None`` (walking a large object graph on every plan
            would cost for nothing): alignment asks the source's handle when it runs.

    Raises:
        OptionError: a field has the wrong type or the label is empty.

    Example:
        >>> s = SourceView("A", "<memory>", "", {"x": VariableInfo("x", (2,), "float32")})
        >>> list(s.variables)
        ['x']
    """

    __repr__ = redacted_repr  # (a REPL, a notebook or a log line shows no credential)

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
    finding_targets: Mapping[str, Tuple[str, ...]] = field(default_factory=dict)
    finding_names: Mapping[str, Tuple[str, ...]] = field(default_factory=dict)
    aligned: Mapping[str, str] = field(default_factory=dict)
    order: Optional[Tuple[str, ...]] = None
    keras: Optional[KerasVerdict] = None
    drift: Optional[PathAlignment] = None
    unresolved: Tuple[Any, ...] = ()
    layout: Optional[str] = None
    undecided: Tuple[str, ...] = ()
    composed: Mapping[str, Tuple[str, ...]] = field(default_factory=dict)
    joined: Mapping[str, str] = field(default_factory=dict)

    @property
    def n_tensors(self) -> int:
        """How many checkpoint tensors the view offers: a joined tensor (a
        :class:`~ckptmerge.Concat`) counts as its parts."""
        if not self.composed:
            return len(self.variables)
        return len(self.variables) - len(self.composed) + len({p for ps in self.composed.values() for p in ps})

    def __post_init__(self) -> None:
        object.__setattr__(self, "notes", types.MappingProxyType(dict(self.notes)))
        object.__setattr__(self, "aligned", types.MappingProxyType(dict(self.aligned)))
        object.__setattr__(self, "findings", tuple(self.findings))
        for name in ("finding_targets", "finding_names"):
            object.__setattr__(self, name, types.MappingProxyType(
                {str(k): tuple(v) for k, v in getattr(self, name).items()}))
        object.__setattr__(self, "unresolved", tuple(self.unresolved))
        object.__setattr__(self, "undecided", tuple(self.undecided))
        if self.cast is not None and not isinstance(self.cast, bool):
            raise OptionError(f"source {quote_name(self.label)}: cast must be True, False or None (the plan's "
                              f"option); received {describe_value(self.cast)}.")
        if not isinstance(self.label, str) or not self.label:
            raise OptionError(f"a source label must be a non-empty str; received {describe_value(self.label)}.")
        for name in ("path", "note"):
            if not isinstance(getattr(self, name), str):
                raise OptionError(f"source {quote_name(self.label)}: {name} must be a str; received "
                                  f"{describe_value(getattr(self, name))}.")
        if not isinstance(self.variables, Mapping):
            raise OptionError(f"source {quote_name(self.label)}: variables must be a dict of name -> "
                              f"VariableInfo; received {describe_value(self.variables)}.")
        if all(map(isinstance, self.variables, itertools.repeat(str))) and all(
                map(isinstance, self.variables.values(), itertools.repeat(VariableInfo))):
            bad = []  # (one pass at C speed: sources hold up to 100,000s of names)
        else:
            bad = [k for k, v in self.variables.items() if not isinstance(k, str) or not isinstance(v, VariableInfo)]
        if bad:
            raise OptionError(f"source {quote_name(self.label)}: variables must map names (str) to "
                              f"VariableInfo; {len(bad)} entr{'y does' if len(bad) == 1 else 'ies do'} "
                              f"not, e.g. {bad[0]!r} -> {describe_value(self.variables[bad[0]])}.")
        if not isinstance(self.rules, Rules):
            raise OptionError(f"source {quote_name(self.label)}: rules must be a Rules (build it with "
                              f"Rules.from_options(...)); received {describe_value(self.rules)}.")
        if isinstance(self.transforms, (str, bytes)) or not isinstance(self.transforms, Iterable):
            raise OptionError(f"source {quote_name(self.label)}: transforms must be a list of transforms; "
                              f"received {describe_value(self.transforms)}.")
        transforms = tuple(self.transforms)
        for t in transforms:
            if not (callable(getattr(t, "applies_to", None)) and callable(getattr(t, "output_shape", None))):
                raise OptionError(f"source {quote_name(self.label)}: {describe_value(t)} is not a value transform "
                                  "(see ckptmerge.planning.transforms: Slice, VocabRemap).")
        object.__setattr__(self, "transforms", transforms)
        if isinstance(self.hidden, (str, bytes)) or not all(isinstance(n, str) for n in self.hidden):
            raise OptionError(f"source {quote_name(self.label)}: hidden must be a list of names; received "
                              f"{describe_value(self.hidden)}.")
        object.__setattr__(self, "hidden", tuple(sorted(self.hidden)))
        if self.order is not None:
            if isinstance(self.order, (str, bytes)) or not all(isinstance(n, str) for n in self.order):
                raise OptionError(f"source {quote_name(self.label)}: order must be a list of names or None; "
                                  f"received {describe_value(self.order)}.")
            object.__setattr__(self, "order", tuple(self.order))
        names = list(self.variables)
        if all(map(operator.lt, names, names[1:])):  # usually sorted already: copy as it is
            # (a read-only view is kept as it is: whoever made it decides who may change the dict)
            frozen = (self.variables if type(self.variables) is types.MappingProxyType
                      else types.MappingProxyType(dict(self.variables)))
        else:
            frozen = types.MappingProxyType({k: self.variables[k] for k in sorted(names)})
        object.__setattr__(self, "variables", frozen)

    def to_dict(self) -> dict:
        """JSON-ready summary: label, path, note, rules (options dict), n_variables, findings,
        transforms, and ``keras`` (:meth:`KerasVerdict.to_dict`) where there is one (a URL's
        credentials redacted, as everywhere the path is shown)."""
        return {"label": redact(self.label), "path": redact(self.path), "note": redact(self.note),
                "rules": self.rules.to_dict(), "n_variables": len(self.variables),
                "findings": list(map(redact, self.findings)),
                **({"keras": self.keras.to_dict()} if self.keras is not None else {}),
                **({"paths": [{"file": m.file, "model": m.model, "confidence": m.confidence,
                               "evidence": list(m.evidence)} for m in self.drift.matches],
                    "paths_unresolved": [{"file": list(f), "model": list(m), "reason": r}
                                         for f, m, r in self.drift.unresolved]} if self.drift is not None else {}),
                "transforms": [t.to_dict() if hasattr(t, "to_dict") else repr(t)
                               for t in self.transforms]}


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
        ambiguous: :class:`~ckptmerge.planning.rules.Ambiguity` findings: names that regex rules
            rename differently (blocking when unresolved; shown with the conflicts).
        unmatched_rules: :class:`~ckptmerge.planning.rules.UnmatchedRule` findings (explicit map
            entries block even a non-strict restore, the others only a strict one).
        structure: ``(source label, message)`` findings about names that do not line up: a
            Keras weights file whose layers differ from the model's, a model root swap that
            fits two targets (blocking a strict restore).
        allow_missing, on_conflict, on_shape_mismatch, cast, model_root: the options used.

    Example:
        >>> from ckptmerge.planning.planner import make_plan
        >>> t = [VariableInfo("x", (2,), "float32")]
        >>> plan = make_plan(t, [SourceView("A", "<memory>", "", {"x": t[0]})])
        >>> plan.ok, list(plan.assignments)
        (True, ['x'])
    """

    __repr__ = redacted_repr  # (a REPL, a notebook or a log line shows no credential)

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
            >>> from ckptmerge.planning.planner import make_plan
            >>> make_plan([VariableInfo("c/z", (), "int64")], []).blocking()
            ["missing: target 'c/z' is provided by no source (map a checkpoint variable to it, or pass allow_missing=['c/z'])"]
        """
        if not strict:
            return [u.message() for u in self.unmatched_rules if u.explicit]
        lines = [f"missing: target {quote_name(t)} is provided by no source (map a checkpoint variable "
                 f"to it, or pass allow_missing=[{quote_name(t)}])" for t in self.missing]
        if self.on_shape_mismatch == "error":
            lines += [m.message() for m in self.mismatched]
        lines += [c.message() for c in self.conflicts if c.blocking]
        lines += [a.message() for a in self.ambiguous if not a.resolved]
        lines += [u.message() for u in self.unmatched_rules]
        lines += [f"structure: source {quote_name(label)}: {text}" for label, text in self.structure]
        return lines

    @property
    def ok(self) -> bool:
        """True when nothing blocks a strict restore."""
        return not self.blocking(strict=True)

    def check(self, strict: bool = True, *, action: str = "restore") -> "Plan":
        """Raise one :class:`~ckptmerge.core.errors.PlanError` listing every blocking finding.

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
            >>> from ckptmerge.planning.planner import make_plan
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

    @property
    def across_frameworks(self) -> bool:
        """True when a source is read through a layout or aligned by structure: such a plan's
        renderings end with its :meth:`coverage`."""
        return any(s.layout or s.aligned or s.unresolved for s in self.sources)

    def coverage(self) -> dict:
        """Where every target and every source tensor ended up (JSON-ready).

        Targets are assigned, unresolved (structural alignment found candidates of their shape
        but could not tell which: see each source's ``unresolved``), missing (no candidate),
        allowed missing, or skipped (a mismatch left alone); a source's tensors are used or unused.

        Returns:
            ``{"targets": {"total", "assigned", "unresolved", "missing", "allowed_missing",
            "skipped"}, "sources": [{"label", "tensors", "used", "unused"}], "unresolved":
            [{"source", "targets", "names", "shape", "dtype", "reason"}]}``.

        Example:
            >>> from ckptmerge.planning.planner import make_plan
            >>> t = [VariableInfo("x", (2,), "float32"), VariableInfo("y", (3,), "float32")]
            >>> make_plan(t, [SourceView("A", "<memory>", "", {"x": t[0]})]).coverage()["targets"]
            {'total': 2, 'assigned': 1, 'unresolved': 0, 'missing': 1, 'allowed_missing': 0, 'skipped': 0}
        """
        missing = set(self.missing) | set(self.allowed_missing)
        groups = [(s.label, u) for s in self.sources for u in s.unresolved
                  if any(t in missing for t in u.targets)]
        unresolved = {t for _, u in groups for t in u.targets if t in missing}
        return {
            "targets": {"total": len(self.targets), "assigned": len(self.assignments),
                        "unresolved": len(unresolved),
                        "missing": sum(1 for t in self.missing if t not in unresolved),
                        "allowed_missing": sum(1 for t in self.allowed_missing if t not in unresolved),
                        "skipped": len(self.skipped)},
            "sources": [{"label": s.label, "tensors": s.n_tensors,
                         "used": s.n_tensors - len(self.unused.get(s.label, ())),
                         "unused": len(self.unused.get(s.label, ()))} for s in self.sources],
            "unresolved": [{"source": label, "targets": list(u.targets), "names": list(u.names),
                            "shape": list(u.shape), "dtype": u.dtype, "reason": u.reason} for label, u in groups],
        }

    def report(self, *, limit: Optional[int] = 50) -> str:
        """Plain-text report for people (see :func:`ckptmerge.render.report.render_plan`)."""
        return late("ckptmerge.render.report", "render_plan")(self, limit=limit)

    def _repr_html_(self) -> str:
        return late("ckptmerge.render.notebook", "plan_html")(self)

    def restore(self, session: Any = None, *, strict: bool = True, progress: Any = None) -> "Report":
        """Restore the planned variables (see :mod:`ckptmerge.restoring.backends`).

        Only plans made by :func:`ckptmerge.plan` (which attaches the live variables and
        readers) can be restored.

        Args:
            session: graph mode: the ``tf.compat.v1.Session`` (default: the default session).
            strict: raise :class:`~ckptmerge.PlanError` for any finding but ``unused``, before a
                single variable changes; ``False`` restores what matches and logs a warning.
            progress: optional ``progress(done_bytes, total_bytes)`` callback.

        Returns:
            The :class:`~ckptmerge.render.report.Report`: restored and skipped targets, timings.

        Raises:
            PlanError: see ``strict``.
            RestoreError: a read failed; every target variable kept its value.

        Example:
            >>> report = cm.plan(model, [cm.Source("runs/A")]).restore()   # doctest: +SKIP
        """
        run_plan = late("ckptmerge.restoring.backends", "run_plan")
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
        self.check(strict=strict, action="restore")
        return late("ckptmerge.restoring.backends.graph", "set_initializers")(self, self._binding)

    def savers(self) -> Dict[str, Any]:
        """One ``tf.compat.v1.train.Saver`` per checkpoint source, built once per plan (graph mode).

        Each is built from a ``{checkpoint_key: variable}`` dict of that source's assignments
        (a list of parts for a partitioned variable), the canonical TF way; call
        ``saver.restore(sess, path)`` yourself when you want TF's own I/O. :meth:`restore` is
        faster and atomic across sources (see docs/restore.md, "How restores work"), so it does not use them.

        Returns:
            ``{source label: Saver}``; the same objects on every call (no new ops).

        Raises:
            CkptMergeError: not graph mode, or an assignment needs a cast or transform (a Saver
                cannot convert values) or comes from memory.

        Example:
            >>> for label, saver in plan.savers().items():          # doctest: +SKIP
            ...     saver.restore(sess, {s.label: s.path for s in plan.sources}[label])
        """
        return late("ckptmerge.restoring.backends.graph", "build_savers")(self, self._binding)

    def with_binding(self, binding: Any) -> "Plan":
        """A copy of this plan with live readers/variables attached (used by the restore layer)."""
        return dataclasses.replace(self, _binding=binding)

    def to_dict(self, *, lazy: bool = False) -> dict:
        """JSON-ready dict (shapes as lists, everything sorted as in the plan). With ``lazy``,
        the parts with one item per target or name are :class:`~ckptmerge.core.jsonout.Records` and
        :class:`~ckptmerge.core.jsonout.Entries` that make their items while they are written
        (:func:`~ckptmerge.core.jsonout.json_pieces`; ``ckptmerge plan --json`` writes a plan of
        100,000 targets so), and :func:`~ckptmerge.core.jsonout.materialize` makes them plain.

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
             "structure": [{"source", "message"}], "coverage": Plan.coverage()}

        Example:
            >>> from ckptmerge.planning.planner import make_plan
            >>> import json
            >>> json.loads(json.dumps(make_plan([], []).to_dict()))["ok"]
            True
        """
        blocking = self.blocking(strict=True)
        records: Callable[[Iterable[Any]], Any] = Records if lazy else list
        entries: Callable[[Iterable[Tuple[str, Any]]], Any] = Entries if lazy else dict
        return {
            "ok": not blocking,
            "blocking": blocking,
            "blocking_non_strict": self.blocking(strict=False),
            "options": {"allow_missing": list(self.allow_missing), "on_conflict": self.on_conflict,
                        "on_shape_mismatch": self.on_shape_mismatch, "cast": self.cast},
            "targets": records(t.to_dict() for t in self.targets),
            "sources": [s.to_dict() for s in self.sources],
            "assignments": entries((k, a.to_dict()) for k, a in self.assignments.items()),
            "missing": list(self.missing),
            "allowed_missing": list(self.allowed_missing),
            "skipped": list(self.skipped),
            "unused": {k: list(v) for k, v in self.unused.items()},
            "dropped": {k: list(v) for k, v in self.dropped.items()},
            "mismatched": records(m.to_dict() for m in self.mismatched),
            "conflicts": [c.to_dict() for c in self.conflicts],
            "ambiguous": [a.to_dict() for a in self.ambiguous],
            "unmatched_rules": [u.to_dict() for u in self.unmatched_rules],
            "structure": [{"source": label, "message": text} for label, text in self.structure],
            "coverage": self.coverage(),
        }
