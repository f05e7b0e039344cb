"""Small text helpers for reports, messages and the command line: names, counts, byte sizes.

Kept apart from :mod:`ckptmerge.render.report` so the CLI's inspection commands can use them without
loading the planning engine. :func:`escape_name` is the one place names from files become safe
text: tensor names, keys and paths come from untrusted files, and a name holding ESC, a newline
or a bidi override must not forge a table row or drive the terminal; a path holding a URL's
credentials must not show them.
"""

from __future__ import annotations

import shlex
from typing import Any, Iterable, Optional, Sequence

from .redact import redact

__all__ = ["escape_name", "escape_text", "quote_name", "command_hint", "quoted_command", "join_lines", "plural", "human_bytes", "and_list"]

_NAMED_ESCAPES = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escape_char(c: str) -> str:
    if c.isprintable():
        return c
    named = _NAMED_ESCAPES.get(c)
    if named:
        return named
    n = ord(c)
    return f"\\x{n:02x}" if n < 0x100 else f"\\u{n:04x}" if n < 0x10000 else f"\\U{n:08x}"


def escape_name(name: str) -> str:
    r"""A name (or any one-line text) as one visible line: every character that is not printable
    is written as a Python-style escape.

    Escaped: control characters (newline, carriage return, tab, ESC and so the ANSI CSI/OSC
    sequences that start with it, DEL, C1 controls), format characters (the bidi overrides
    U+202A-U+202E and U+2066-U+2069, zero-width characters), line and paragraph separators,
    non-ASCII spaces, lone surrogates and unassigned code points. Printable text, including
    non-ASCII letters, is kept as it is, and so is ``\`` (not doubled): escaping is idempotent,
    so text built from already escaped names can be escaped again safely. URL credentials
    (userinfo, signed query values) become ``***`` (:func:`ckptmerge.core.redact.redact`). Text output
    (tables, trees, reports, error messages) uses this; ``--json`` and the library's data keep
    exact names.

    Example:
        >>> print(escape_name("x\x1b]0;t\x07\nhidden  float32"))
        x\x1b]0;t\x07\nhidden  float32
        >>> escape_name("dense/kernel"), escape_name("admin\u202egnp.exe")
        ('dense/kernel', 'admin\\u202egnp.exe')
    """
    name = str(name)
    if "=" in name or "://" in name:  # maybe a URL's credentials (checked at C speed first)
        name = redact(name)
    if name.isprintable():  # the common case, at C speed
        return name
    return "".join(map(_escape_char, name))


def escape_text(text: str) -> str:
    r""":func:`escape_name` for each line of multi-line text: newlines are kept, everything else
    that is not printable (including carriage returns) is escaped.

    Example:
        >>> print(escape_text("a\x1b[2J\nb\r"))
        a\x1b[2J
        b\r
    """
    return "\n".join(map(escape_name, str(text).split("\n")))


def quote_name(name: Optional[str]) -> str:
    r"""A name quoted for messages, escaped (:func:`escape_name`); ``None`` as ``None``.

    Backslashes are not doubled, so ``'\1'`` reads as typed.

    Example:
        >>> print(quote_name("a\nb"), quote_name(None))
        'a\nb' None
    """
    return "None" if name is None else f"'{escape_name(name)}'"


def command_hint(*words: Any) -> str:
    """A ``ckptmerge ...`` command line for a hint: shell-quoted, so it can be pasted, and escaped
    (:func:`escape_name`), so a path the user typed stays on one visible line.

    Example:
        >>> command_hint("check", "my config.yaml")
        "ckptmerge check 'my config.yaml'"
    """
    return escape_name(" ".join(["ckptmerge"] + [shlex.quote(str(w)) for w in words]))


def quoted_command(*words: Any) -> str:
    """:func:`command_hint` set off in a message: in single quotes, or in double quotes when the
    command quotes a word itself (a path with spaces or control characters).

    Example:
        >>> print(quoted_command("ls", "runs/A"), quoted_command("ls", "my runs/A"))
        'ckptmerge ls runs/A' "ckptmerge ls 'my runs/A'"
    """
    hint = command_hint(*words)
    return f'"{hint}"' if "'" in hint else f"'{hint}'"


def join_lines(lines: Iterable[str]) -> str:
    r"""Text of one visible line per item: each escaped (:func:`escape_name`), joined with newlines.

    Example:
        >>> print(join_lines(["Missing (1):", "  c/\x1b[2Jz"]))
        Missing (1):
          c/\x1b[2Jz
    """
    return "\n".join(map(escape_name, lines))


def plural(n: int, word: str, many: Optional[str] = None) -> str:
    """``"1 variable"``, ``"3 variables"`` (``many`` for irregular plurals).

    Example:
        >>> plural(3, "variable"), plural(1, "entry", "entries")
        ('3 variables', '1 entry')
    """
    return f"{n} {word if n == 1 else (many or word + 's')}"


def human_bytes(n: int) -> str:
    """``"512 B"``, ``"1.5 KiB"``, ``"3.0 MiB"``, ..."""
    if n < 1024:
        return f"{n} B"
    size = float(n)
    for unit in ("KiB", "MiB", "GiB", "TiB"):
        size /= 1024.0
        if size < 1024 or unit == "TiB":
            break
    return f"{size:.1f} {unit}"


def and_list(items: Sequence[str]) -> str:
    """Join items as prose: ``"a"``, ``"a and b"``, ``"a, b and c"``.

    Example:
        >>> and_list(["x", "y", "z"])
        'x, y and z'
    """
    if len(items) <= 1:
        return "".join(items)
    return ", ".join(items[:-1]) + " and " + items[-1]
