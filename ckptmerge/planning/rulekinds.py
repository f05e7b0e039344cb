"""The rule kinds, one small frozen class each: :class:`MapRule` (an ``assignment_map`` entry),
:class:`RegexRule` (a full-match rename, run on RE2) and :class:`GlobFilter` (an include/exclude
glob). Each validates itself on construction and compiles its pattern once; applying a source's
rules together is :class:`ckptmerge.planning.rules.Rules`' job.
"""

from __future__ import annotations

import fnmatch
import functools
import itertools
import re
from dataclasses import dataclass, field
from typing import Any, List, Optional, Sequence, Tuple

from ..core.args import describe_value
from ..core.errors import RuleError
from ..core.specs import normalize_name
from ..core.text import quote_name
from .patterns import Template, UserPattern, compile_pattern

__all__ = ["MapRule", "RegexRule", "GlobFilter", "scopes_of", "SCOPE_ENDS"]

#: What ends a scope in a map entry: ``/`` in TF and Keras names, ``.`` in PyTorch/safetensors names.
SCOPE_ENDS = ("/", ".")


def scopes_of(names: Sequence[str]) -> List[str]:
    """Every scope prefix (``"a/"``, ``"a/b/"``) of the names, sorted."""
    scopes = set()
    for n in names:
        parts = n.split("/")[:-1]
        for i in range(1, len(parts) + 1):
            scopes.add("/".join(parts[:i]) + "/")
    return sorted(scopes)


# --------------------------------------------------------------------------------------------
# One small frozen class per rule kind
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class MapRule:
    """One ``assignment_map`` entry: an exact rename or a scope rename.

    Both names are normalised (a ``:0`` suffix and a leading ``/`` are removed). A scope entry
    has both sides ending with a scope separator: ``"/"`` (TF, Keras) or ``"."`` (PyTorch and
    safetensors names), so ``{"encoder.": "encoder/"}`` maps ``encoder.layer.0.weight`` to
    ``encoder/layer.0.weight``; ``"/"`` alone is the root (every name).

    Attributes:
        source: the checkpoint name (exact) or scope (``"a/"``, ``"/"``).
        target: the target name (exact) or scope (``"c/encoder/"``, ``"/"``).

    Raises:
        RuleError: a side is not a non-empty str, or only one side ends with ``"/"``.

    Example:
        >>> MapRule("a/", "c/encoder/").rename("a/dense/kernel")
        'c/encoder/dense/kernel'
        >>> MapRule("a1", "c/x1").rename("a1")
        'c/x1'
    """

    source: str
    target: str

    def __post_init__(self) -> None:
        for side, value in (("source", self.source), ("target", self.target)):
            if not isinstance(value, str):
                hint = " (pass the variable's name, e.g. v.name)" if side == "target" else ""
                raise RuleError(
                    f"map entry {side} must be a name (str); received {describe_value(value)}{hint}.")
        source, target = normalize_name(self.source), normalize_name(self.target)
        if not source or not target:
            raise RuleError(
                f"map entry {quote_name(self.source)} -> {quote_name(self.target)} has an empty name; "
                "use '/' for the root scope.")
        if source.endswith(SCOPE_ENDS) != target.endswith(SCOPE_ENDS):
            fixed_s = source if source.endswith(SCOPE_ENDS) else source + "/"
            fixed_t = target if target.endswith(SCOPE_ENDS) else target + "/"
            raise RuleError(
                f"map entry {quote_name(source)} -> {quote_name(target)} mixes a scope and a variable name: "
                "a scope entry needs both sides to end with '/' or '.' (and an exact entry neither). "
                f"Write {quote_name(fixed_s)} -> {quote_name(fixed_t)} to map a scope, or drop the '/' to map "
                "one variable.")
        object.__setattr__(self, "source", source)
        object.__setattr__(self, "target", target)

    # Cached on first use (in the instance's __dict__, which a frozen dataclass allows): plans
    # ask these once per checkpoint name.
    @functools.cached_property
    def is_scope(self) -> bool:
        """True for a scope entry (both sides end with ``"/"`` or ``"."``)."""
        return self.source.endswith(SCOPE_ENDS)

    @functools.cached_property
    def _source_prefix(self) -> str:
        return "" if self.source == "/" else self.source

    @functools.cached_property
    def _target_prefix(self) -> str:
        return "" if self.target == "/" else self.target

    @functools.cached_property
    def _display(self) -> str:
        return f"map {quote_name(self.source)} -> {quote_name(self.target)}"

    def matches(self, name: str) -> bool:
        """Whether this entry covers ``name`` (ignoring precedence over other entries)."""
        if self.is_scope:
            return name.startswith(self._source_prefix)
        return name == self.source

    def rename(self, name: str) -> str:
        """The target name of ``name``, which this entry must cover."""
        if self.is_scope:
            return self._target_prefix + name[len(self._source_prefix):]
        return self.target

    def describe(self) -> str:
        """Display form, e.g. ``"map 'a/' -> 'c/encoder/'"``."""
        return self._display


@dataclass(frozen=True)
class RegexRule:
    """A regex rename: a full match of ``pattern`` against a name, then ``match.expand(replacement)``.

    The pattern is compiled once, by RE2 (:func:`ckptmerge.planning.patterns.compile_pattern`: linear
    time, so no pattern can hang a plan); the replacement is checked at construction, so a
    reference to a group the pattern does not have fails here, not mid-restore.

    Attributes:
        pattern: a regular expression in RE2 syntax (Python's without backreferences and
            lookarounds), matched against whole checkpoint names.
        replacement: a :meth:`re.Match.expand` template (``\\1``, ``\\g<name>``), or ``None``
            to drop the matching names.

    Raises:
        RuleError: the pattern is not a valid regex or uses a construct RE2 does not run
            (:class:`ckptmerge.planning.patterns.PatternError`), the replacement is not a valid template
            for it, or either has the wrong type.

    Example:
        >>> RegexRule(r"^head/(.*)", r"new_head/\\1").rename("head/kernel")
        'new_head/kernel'
        >>> RegexRule(r".*/Adam(_1)?", None).rename("dense/kernel/Adam") is None
        True
    """

    pattern: str
    replacement: Optional[str]
    _regex: UserPattern = field(init=False, repr=False, compare=False)
    _template: Optional[Template] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not isinstance(self.pattern, str):
            raise RuleError(f"regex pattern must be a str; received {describe_value(self.pattern)}.")
        if self.replacement is not None and not isinstance(self.replacement, str):
            raise RuleError(
                f"regex replacement for {quote_name(self.pattern)} must be a str or None (drop); "
                f"received {describe_value(self.replacement)}.")
        compiled = compile_pattern(self.pattern)  # PatternError is a RuleError
        template = None
        if self.replacement is not None:
            try:
                # Checks group references and escapes without needing a name that matches.
                template = compiled.template(self.replacement)
            except (re.error, IndexError) as e:
                groups = compiled.groups
                names = sorted(compiled.groupindex)
                have = f"{groups} group{'s' if groups != 1 else ''}"
                if names:
                    have += " (named: " + ", ".join(quote_name(n) for n in names) + ")"
                raise RuleError(
                    f"invalid replacement {quote_name(self.replacement)} for regex {quote_name(self.pattern)}: "
                    f"{e}; the pattern has {have}.") from None
        object.__setattr__(self, "_regex", compiled)
        object.__setattr__(self, "_template", template)

    def matches(self, name: str) -> bool:
        """Whether the pattern matches the whole ``name``."""
        return self._regex.fullmatch(name) is not None

    def rename(self, name: str) -> Optional[str]:
        """The new name (``None``: drop), or raise :class:`RuleError` if it does not match."""
        m = self._regex.fullmatch(name)
        if m is None:
            raise RuleError(f"{self.describe()} does not match {quote_name(name)}.")
        return self.expand(m)

    def try_rename(self, name: str) -> Tuple[bool, Optional[str]]:
        """``(matched, new name)`` with one match of the pattern (``None``: drop)."""
        m = self._regex.fullmatch(name)
        return (False, None) if m is None else (True, self.expand(m))

    def expand(self, match: Any) -> Optional[str]:
        """The replacement for a match of this pattern (``None``: drop)."""
        return None if self._template is None else self._template.expand(match)

    def search(self, name: str) -> bool:
        """Whether the pattern matches some part of ``name`` (used for hints)."""
        return bool(self._regex.search(name))  # (UserPattern.search gives a bool, never None)

    def describe(self) -> str:
        """Display form, e.g. ``"regex '^head/(.*)' -> 'new_head/\\1'"`` or ``"... -> None (drop)"``."""
        return self._display

    @functools.cached_property
    def _display(self) -> str:
        right = "None (drop)" if self.replacement is None else quote_name(self.replacement)
        return f"regex {quote_name(self.pattern)} -> {right}"


@dataclass(frozen=True)
class GlobFilter:
    """One include/exclude glob (:func:`fnmatch.fnmatchcase`: ``*``, ``?``, ``[seq]``).

    ``*`` also matches ``/``, so ``"encoder/*"`` selects the whole ``encoder`` scope.

    Raises:
        RuleError: the pattern is not a non-empty str.

    Example:
        >>> GlobFilter("*/Adam*").matches("dense/kernel/Adam_1")
        True
    """

    pattern: str
    _regex: "re.Pattern[str]" = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not isinstance(self.pattern, str) or not self.pattern:
            raise RuleError(f"a glob must be a non-empty str; received {describe_value(self.pattern)}.")
        object.__setattr__(self, "_regex", re.compile(fnmatch.translate(self.pattern)))

    def matches(self, name: str) -> bool:
        """Whether ``name`` matches the glob (case-sensitive)."""
        return self._regex.match(name) is not None

    @functools.cached_property
    def _literal(self) -> Optional[Tuple[str, str]]:
        """``(how, text)`` when the glob is a literal with ``*`` only at its ends, which a string
        method decides: ``("all", "")``, ``("in", x)``, ``("suffix", x)``, ``("prefix", x)``,
        ``("equal", x)``; ``None`` for any other glob (the regex decides)."""
        p = self.pattern
        core = p.strip("*")
        if "?" in p or "[" in p or "*" in core:
            return None
        if not core:
            return ("all", "")
        lead, trail = p.startswith("*"), p.endswith("*")
        return ("in" if lead and trail else "suffix" if lead else "prefix" if trail else "equal", core)

    def select(self, names: Sequence[str]) -> List[str]:
        """The names that match, in order: one pass over all of them, with a string method
        instead of the regex when the glob is a literal with ``*`` at its ends (``*/global_step``
        is a suffix test, ``encoder/*`` a prefix test).

        Example:
            >>> GlobFilter("*/global_step").select(["a/global_step", "a/kernel", "global_step"])
            ['a/global_step']
        """
        literal = self._literal
        if literal is None:
            return list(itertools.compress(names, map(self._regex.match, names)))
        how, text = literal
        if how == "all":
            return list(names)
        test = {"in": str.__contains__, "suffix": str.endswith, "prefix": str.startswith, "equal": str.__eq__}[how]
        return list(itertools.compress(names, map(test, names, itertools.repeat(text))))  # (at C speed)
