"""User-supplied regular expressions, matched by RE2 in time linear in the name's length.

Patterns come from users (``regex`` rules in the API and in config files, ``ckptmerge ls
--regex``), and names come from checkpoints: both are untrusted. Python's :mod:`re` backtracks, so
``(a+)+$`` against a 41-character name runs for minutes. Every user pattern is therefore compiled
here, by :func:`compile_pattern`, with RE2 (the ``google-re2`` package), which matches in time
linear in the length of the name whatever the pattern.

RE2's syntax is Python's minus the constructs that need backtracking: backreferences (``\\1``,
``(?P=name)``), lookahead and lookbehind, atomic groups, possessive quantifiers, conditionals.
A pattern using one is refused with a :class:`PatternError` that says so, and so is ``\\Z``
(written ``\\z``).

Where RE2 accepts Python's syntax but gives it another meaning, a pattern is never allowed to
depend on the difference silently:

- ``{,n}`` and ``{,}`` repeat in Python but are literal text in RE2: refused at compile time,
  with the fix (``{0,n}``, or ``\\{,n}`` for the text).
- ``\\d``, ``\\w``, ``\\s`` (and ``\\D``, ``\\W``, ``\\S``) match only ASCII characters in
  RE2, but any Unicode digit, letter or space in Python. Names are almost always ASCII, where both
  agree, so such patterns are accepted; a non-ASCII name is matched twice (once more with the
  classes spelt out as Python's), and if the results differ a :class:`PatternError` names the
  name and the fix (``[0-9]`` for ASCII digits only, ``\\p{Nd}`` for any). ``\\b`` and ``\\B``
  cannot be spelt out in RE2: they are refused for a name holding non-ASCII letters or digits.
- ``$`` matches only at the very end of a name (Python's ``$`` also matches before a final
  newline): a name ending in a newline does not end in what precedes it, which is what a user
  means by ``kernel$``.

Replacement templates keep Python's :meth:`re.Match.expand` syntax and meaning (``\\1``,
``\\g<name>``, escapes): :meth:`UserPattern.template` has Python's own template parser read them.
"""

from __future__ import annotations

import functools
import re
import warnings
from typing import Any, Callable, Dict, FrozenSet, List, Mapping, Optional, Tuple, Union

from ..core.errors import RuleError
from ..core.text import quote_name

__all__ = ["PatternError", "UserPattern", "Template", "compile_pattern"]

# Why some Python constructs are refused: said in every such error.
_WHY = ("user patterns are matched with RE2, in time linear in the name's length, so that no "
        "pattern can hang a plan; RE2 has no constructs that need backtracking")

# RE2's complaint about a pattern that Python's re accepts -> what the construct is called.
_UNSUPPORTED = (
    (re.compile(r"invalid escape sequence: \\[0-9]"), "a backreference"),
    (re.compile(r"invalid perl operator: \(\?P$"), "a named backreference"),
    (re.compile(r"invalid perl operator: \(\?[=!]$"), "a lookahead"),
    (re.compile(r"invalid perl operator: \(\?<[=!]$"), "a lookbehind"),
    (re.compile(r"invalid perl operator: \(\?>$"), "an atomic group"),
    (re.compile(r"invalid perl operator: \(\?\($"), "a conditional group"),
    (re.compile(r"invalid perl operator: \(\?#$"), "a comment group"),
    (re.compile(r"bad repetition operator"), "a possessive quantifier"),
    (re.compile(r"invalid repetition size"), "a repetition count above 1000"),
    (re.compile(r"invalid escape sequence: \\Z$"), "'\\Z' (write '\\z' for the end of the name)"),
)



class PatternError(RuleError):
    """A user pattern that cannot be used: bad syntax, or a construct RE2 does not run.

    ``str(e)`` reads ``"invalid regex '<pattern>': <detail>"``.

    Attributes:
        pattern: the pattern as given.
        detail: what is wrong, e.g. ``"missing ), unterminated subpattern at position 6"``.
        problem: the same as one diagnostic line naming the pattern, e.g.
            ``"unbalanced parenthesis in '^head/(.*'"`` (config files list problems this way).
    """

    def __init__(self, pattern: str, detail: str, problem: str) -> None:
        super().__init__(f"invalid regex {quote_name(pattern)}: {detail}")
        self.pattern = pattern
        self.detail = detail
        self.problem = problem


def _syntax_error(pattern: str, e: "re.error") -> PatternError:
    msg = e.msg
    if msg.startswith("missing ), unterminated subpattern") or msg == "unbalanced parenthesis":
        problem = f"unbalanced parenthesis in {quote_name(pattern)}"
    elif e.pos is not None:
        problem = f"{msg} at position {e.pos} in {quote_name(pattern)}"
    else:
        problem = f"{msg} in {quote_name(pattern)}"
    return PatternError(pattern, str(e), problem)


def _unsupported(pattern: str, re2_message: str) -> PatternError:
    what = next((name for test, name in _UNSUPPORTED if test.search(re2_message)),
                f"a construct RE2 does not support ({re2_message})")
    detail = f"it uses {what}, which ckptmerge does not support: {_WHY}; rewrite it without"
    return PatternError(pattern, detail, f"{quote_name(pattern)} uses {what}, which ckptmerge does not support: "
                                         f"{_WHY}; rewrite it without")


# Python's repetition with the lower bound left out: RE2 reads it as literal text.
_OPEN_REPEAT = re.compile(r"\{,(\d*)\}")
# Escapes that mean ASCII characters in RE2 and Unicode ones in Python's re (str patterns).
_ASCII_CLASSES = "dDwWsSbB"
# Per class: what it is, the ASCII spelling and the Unicode spelling that end the ambiguity.
_CLASS_FIXES = {
    "d": ("digits", "[0-9]", r"\p{Nd}"),
    "w": ("letters, digits and _", "[A-Za-z0-9_]", r"[\p{L}\p{N}_]"),
    "s": ("spaces", r"[ \t\n\r\f\v]", r"[\s\p{Z}]"),
}


def _rewrite(pattern: str, spell: Optional[Callable[[str, bool], str]] = None,
             ) -> Tuple[str, FrozenSet[str], Optional[str]]:
    """Walk a pattern's escapes and character classes once.

    Returns the pattern with each ASCII-only class escape replaced by ``spell(letter, in_class)``
    (unchanged without ``spell``), the set of those letters used, and the first ``{,n}``
    repetition found outside a character class (``None`` if there is none).
    """
    out: List[str] = []
    used = set()
    open_repeat: Optional[str] = None
    in_class = False
    i, n = 0, len(pattern)
    while i < n:
        c = pattern[i]
        if c == "\\" and i + 1 < n:
            x = pattern[i + 1]
            if x == "Q":  # RE2's \Q...\E: literal text
                j = pattern.find("\\E", i + 2)
                j = n if j < 0 else j + 2
                out.append(pattern[i:j])
                i = j
                continue
            if x in _ASCII_CLASSES:
                used.add(x)
                out.append(spell(x, in_class) if spell is not None and x not in "bB" else pattern[i:i + 2])
            else:
                out.append(pattern[i:i + 2])
            i += 2
            continue
        if in_class:
            if pattern.startswith("[:", i) and pattern.find(":]", i + 2) >= 0:  # [[:alpha:]]
                j = pattern.find(":]", i + 2) + 2
                out.append(pattern[i:j])
                i = j
                continue
            in_class = c != "]"
            out.append(c)
            i += 1
            continue
        if c == "[":
            j = i + 1 + pattern.startswith("^", i + 1)
            j += pattern.startswith("]", j)  # a ']' first in a class is literal
            out.append(pattern[i:j])
            in_class = True
            i = j
            continue
        if c == "{" and open_repeat is None:
            m = _OPEN_REPEAT.match(pattern, i)
            if m is not None:
                open_repeat = m.group(0)
        out.append(c)
        i += 1
    return "".join(out), frozenset(used), open_repeat


def _open_repeat_error(pattern: str, found: str) -> PatternError:
    upper = found[2:-1]
    means = f"0 to {upper} repetitions" if upper else "0 or more repetitions"
    fix = f"{{0,{upper}}}"
    detail = (f"{quote_name(found)} means {means} in Python's re but is literal text in RE2, which matches "
              f"user patterns; write {quote_name(fix)} to repeat, or {quote_name(chr(92) + found)} for the text")
    return PatternError(pattern, detail, f"{quote_name(pattern)}: {detail}")


@functools.lru_cache(maxsize=None)
def _unicode_ranges(letter: str) -> Tuple[str, str]:
    """Python's ``\\d``/``\\w``/``\\s`` on str as RE2 class ranges: (the class, its complement).

    Found by Python's own ``re`` over every code point, once, on first need (RE2 takes no
    surrogates, which no name RE2 sees holds).
    """
    every = "".join(map(chr, range(0x110000)))

    def ranges(cls: str) -> str:
        out = []
        for m in re.finditer(cls + "+", every):
            a, b = m.start(), m.end() - 1
            for lo, hi in ((a, min(b, 0xD7FF)), (max(a, 0xE000), b)):
                if lo <= hi:
                    out.append(_range(lo, hi))
        return "".join(out)

    return ranges("\\" + letter), ranges("\\" + letter.upper())


def _range(a: int, b: int) -> str:
    return f"\\x{{{a:x}}}" if a == b else f"\\x{{{a:x}}}-\\x{{{b:x}}}"


def _spell_unicode(letter: str, in_class: bool) -> str:
    inside, outside = _unicode_ranges(letter.lower())
    ranges = inside if letter.islower() else outside
    return ranges if in_class else f"[{ranges}]"


def _class_difference(pattern: str, name: str, used: FrozenSet[str], boundary: bool) -> PatternError:
    """The error for a non-ASCII name the pattern matches (or may match) otherwise than Python's re."""
    if boundary:
        fixes = ["'\\b' and '\\B' see only ASCII letters, digits and _ as word characters in RE2 "
                 "(any Unicode ones in Python's re) and cannot be spelt otherwise: match the "
                 "separators instead, e.g. '(^|/)kernel($|/)'"]
        how = "may match the name {} differently than Python's re would"
    else:
        fixes = []
        for letter in sorted({u.lower() for u in used} - {"b"}):
            what, ascii_, unicode_ = _CLASS_FIXES[letter]
            fixes.append(f"'\\{letter}' matches ASCII {what} only in RE2 (any Unicode {what} in "
                         f"Python's re): write {quote_name(ascii_)} for ASCII only, or {quote_name(unicode_)} for any")
        how = "matches the name {} differently than Python's re would"
    text = how.format(quote_name(name)) + "; " + "; ".join(fixes)
    return PatternError(pattern, f"it {text}", f"{quote_name(pattern)} {text}")


class _AsciiMatch:
    """The groups of a match of an ASCII name (byte offsets are character offsets)."""

    __slots__ = ("_name", "_spans")

    def __init__(self, name: str, spans: List[Any]) -> None:
        self._name = name
        self._spans = spans

    def group(self, i: int = 0) -> Optional[str]:
        start, end = self._spans[i]
        return None if start < 0 else self._name[start:end]


class Template:
    """A replacement template read with Python's rules, expanded with the groups of an RE2 match.

    Build with :meth:`UserPattern.template`.

    Example:
        >>> p = compile_pattern(r"^head/(?P<leaf>.*)$")
        >>> p.template(r"new/\\g<leaf>\\n").expand(p.fullmatch("head/kernel"))
        'new/kernel\\n'
    """

    __slots__ = ("text", "_pieces")

    def __init__(self, text: str, pieces: List[Union[str, int]]) -> None:
        self.text = text
        self._pieces = pieces  # literal text, or the number of a group

    def expand(self, match: Any) -> str:
        """The template with each group reference replaced by what the group matched ("" if none)."""
        return "".join(p if isinstance(p, str) else (match.group(p) or "") for p in self._pieces)


class UserPattern:
    """A user's regular expression, compiled by RE2; see :func:`compile_pattern`.

    Attributes:
        pattern: the pattern as given.
        groups: the number of capturing groups.
        groupindex: group name -> group number.

    Example:
        >>> p = compile_pattern(r"(a+)+$")
        >>> p.fullmatch("a" * 40 + "!") is None  # at once; Python's re takes minutes
        True
    """

    __slots__ = ("pattern", "_re2", "_raw", "_classes", "_twin")

    def __init__(self, pattern: str, compiled: Any, classes: FrozenSet[str] = frozenset()) -> None:
        self.pattern = pattern
        self._re2 = compiled
        self._classes = classes  # the ASCII-only class escapes the pattern uses
        self._twin: Any = None  # the pattern with them spelt as Python's, compiled on first need
        # The RE2 object under google-re2's re-like wrapper. The wrapper maps UTF-8 byte offsets
        # back to str offsets on every call (about 5x the cost of the match for a short name);
        # an ASCII name needs no mapping, so it is matched here directly. Without that binding
        # (another google-re2 version), the wrapper does everything.
        raw = getattr(compiled, "_regexp", None)
        self._raw = raw if _ANCHOR is not None and hasattr(raw, "Match") else None

    @property
    def groups(self) -> int:
        return self._re2.groups

    @property
    def groupindex(self) -> Mapping[str, int]:
        return self._re2.groupindex

    def _spans(self, name: str, anchor: str) -> Optional[List[Any]]:
        """Group spans of an ASCII name matched by the RE2 binding, or ``None`` if it cannot."""
        if self._raw is None or not name.isascii():
            return None
        data = name.encode("ascii")
        return self._raw.Match(_ANCHOR[anchor], data, 0, len(data))  # type: ignore[index]

    def fullmatch(self, name: str) -> Any:
        """The match of the pattern against the whole ``name`` (with ``.group(i)``), or ``None``.

        Raises:
            PatternError: ``name`` is not ASCII and the pattern matches it differently than
                Python's ``re`` would (see the module docstring).
        """
        spans = self._spans(name, "ANCHOR_BOTH")
        if spans is None:
            m = self._re2.fullmatch(name)
            if self._classes and not name.isascii():
                self._same_as_python(name, m, lambda twin: twin.fullmatch(name))
            return m
        return _AsciiMatch(name, spans) if spans[0][0] >= 0 else None

    def search(self, name: str) -> bool:
        """Whether the pattern matches some part of ``name``.

        Raises:
            PatternError: as :meth:`fullmatch`.
        """
        spans = self._spans(name, "UNANCHORED")
        if spans is None:
            found = self._re2.search(name) is not None
            if self._classes and not name.isascii():
                self._same_as_python(name, found, lambda twin: twin.search(name) is not None)
            return found
        return spans[0][0] >= 0

    def _same_as_python(self, name: str, result: Any, twin_result: Callable[[Any], Any]) -> None:
        """Raise if Python's Unicode ``\\d``/``\\w``/``\\s``/``\\b`` would match ``name`` otherwise."""
        if {"b", "B"} & self._classes and any(not c.isascii() and c.isalnum() for c in name):
            raise _class_difference(self.pattern, name, self._classes, boundary=True)
        if not self._classes - {"b", "B"}:
            return
        if self._twin is None:
            import re2

            self._twin = re2.compile(_rewrite(self.pattern, _spell_unicode)[0], _options())
        other = twin_result(self._twin)
        if isinstance(result, bool):
            same = result == other
        elif result is None or other is None:
            same = result is None and other is None
        else:
            same = all(result.group(i) == other.group(i) for i in range(self.groups + 1))
        if not same:
            raise _class_difference(self.pattern, name, self._classes, boundary=False)

    def template(self, replacement: str) -> Template:
        """Read a :meth:`re.Match.expand` template (``\\1``, ``\\g<name>``, escapes) for this pattern.

        Python's own parser reads it, on a stand-in pattern with the same groups, so the syntax,
        the escapes and the errors are exactly Python's.

        Raises:
            re.error: the template is invalid or refers to a group the pattern does not have
                (``IndexError`` on some Python versions for unknown group names).
        """
        names: Dict[int, str] = {i: n for n, i in self.groupindex.items() if n.isidentifier()}

        def stand_in(before: str, captures: List[str]) -> "re.Pattern[str]":
            return re.compile(re.escape(before) + "".join(
                f"(?P<{names[i]}>{re.escape(c)})" if i in names else f"({re.escape(c)})"
                for i, c in enumerate(captures, 1)))

        # First with every group empty: this checks the template and gives its literal text.
        literal = stand_in("", [""] * self.groups).sub(replacement, "", count=1)
        # Then with each group capturing one character the literal text does not contain, after
        # one more such character for the whole match: where those characters land in the
        # result is where the template refers to a group (or, for the first one, to \g<0>).
        unused = (chr(c) for c in range(0xE000, 0x110000) if chr(c) not in literal)  # private use first
        whole = next(unused)
        marks = {next(unused): i for i in range(1, self.groups + 1)}
        subject = whole + "".join(marks)
        marked = stand_in(whole, list(marks)).sub(replacement, subject, count=1)
        pieces: List[Union[str, int]] = []
        run: List[str] = []
        i = 0
        while i < len(marked):
            ch = marked[i]
            group = 0 if ch == whole else marks.get(ch)
            i += 1 + (len(marks) if group == 0 else 0)  # \g<0> brought every group's mark along
            if group is None:
                run.append(ch)
                continue
            if run:
                pieces.append("".join(run))
                run = []
            pieces.append(group)
        if run:
            pieces.append("".join(run))
        return Template(replacement, pieces)


def _anchors() -> Optional[Dict[str, Any]]:
    try:
        from re2 import _re2

        return {a: getattr(_re2.RE2.Anchor, a) for a in ("ANCHOR_BOTH", "UNANCHORED")}
    except (ImportError, AttributeError):  # pragma: no cover - another google-re2 layout
        return None


_ANCHOR: Optional[Dict[str, Any]] = None


def _options() -> Any:
    import re2

    options = re2.Options()
    options.log_errors = False  # RE2 would also print every error to stderr
    return options


def compile_pattern(pattern: str) -> UserPattern:
    """Compile a user's regular expression with RE2: the one place that does.

    Args:
        pattern: a regular expression in RE2 syntax (Python's, without backreferences,
            lookarounds and other backtracking constructs).

    Returns:
        A :class:`UserPattern`.

    Raises:
        PatternError: the pattern is invalid, or uses a construct RE2 does not run (the message
            names it and says why it is not supported).

    Example:
        >>> compile_pattern(r"^enc/(.*)$").search("enc/kernel")
        True
        >>> compile_pattern(r"(a)\\1")  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        ckptmerge.planning.patterns.PatternError: invalid regex '(a)\\1': it uses a backreference, ...
    """
    import re2  # google-re2: imported on first use

    global _ANCHOR
    if _ANCHOR is None:
        _ANCHOR = _anchors()
    try:
        compiled = re2.compile(pattern, _options())
    except re2.error as e:
        reason = e.args[0] if e.args else ""
        reason = reason.decode("utf-8", "replace") if isinstance(reason, bytes) else str(reason)
    else:
        _, classes, open_repeat = _rewrite(pattern)
        if open_repeat is not None:
            raise _open_repeat_error(pattern, open_repeat)
        return UserPattern(pattern, compiled, classes)
    try:
        with warnings.catch_warnings():  # e.g. "possible nested set": RE2 has refused it anyway
            warnings.simplefilter("ignore")
            re.compile(pattern)
    except re.error as e:  # invalid for Python too: Python's message, with its position
        raise _syntax_error(pattern, e) from None
    raise _unsupported(pattern, reason)
