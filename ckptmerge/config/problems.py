"""Where a config problem is and how it is worded: key paths, line locators, ``FILE:LINE`` lines.

Shared by :mod:`ckptmerge.config.files` (syntax errors and refused documents) and
:mod:`ckptmerge.config.schema` (validation). Values from an untrusted file are shown short
(:func:`show`), and every problem line is escaped before it reaches a terminal.
"""

from __future__ import annotations

import itertools
import re
import reprlib
from typing import Any, Callable, Dict, List, Mapping, Optional, Tuple, Union

from ..core.errors import ConfigError
from ..core.text import escape_name

KeyPath = Tuple[Union[str, int], ...]
IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def keypath(path: KeyPath) -> str:
    """``("sources", 1, "regex", 0)`` -> ``"sources[1].regex[0]"``."""
    out = ""
    for p in path:
        if isinstance(p, int):
            out += f"[{p}]"
        elif IDENT.fullmatch(p):
            out += ("." if out else "") + p
        else:
            out += f"['{p}']"
    return out


Locator = Callable[[KeyPath, bool], Optional[int]]


def no_lines(path: KeyPath, key: bool) -> Optional[int]:
    return None


def map_locator(values: Dict[KeyPath, int], keys: Dict[KeyPath, int]) -> Locator:
    """Exact line of a key or value; else the line of the nearest enclosing value."""
    def locate(path: KeyPath, key: bool) -> Optional[int]:
        if key and path in keys:
            return keys[path]
        while True:
            if path in values:
                return values[path]
            if not path:
                return None
            path = path[:-1]
    return locate


class Problems:
    """Collects problems as ``FILE:LINE KEYPATH: message`` lines."""

    def __init__(self, label: Optional[str], locate: Locator) -> None:
        self.label = label
        self.locate = locate
        self.items: List[Tuple[Optional[int], str]] = []

    def add(self, path: KeyPath, message: str, *, at: Optional[KeyPath] = None, key: bool = False,
            line: Optional[int] = None) -> None:
        if line is None and self.label is not None:
            line = self.locate(at if at is not None else path, key)
        kp = keypath(path)
        if message.endswith(".") and not message.endswith(".."):
            message = message[:-1]  # problem lines read like compiler diagnostics: no final period
        if self.label is None:
            text = f"{kp}: {message}" if kp else message
        else:
            where = f"{self.label}:{line}" if line else self.label
            text = f"{where} {kp}: {message}" if kp else f"{where}: {message}"
        self.items.append((line, text))

    def __bool__(self) -> bool:
        return bool(self.items)

    def lines(self) -> List[str]:
        # Document order where lines are known (stable: equal lines keep the order found).
        order = sorted(range(len(self.items)),
                       key=lambda i: (self.items[i][0] is None, self.items[i][0] or 0, i))
        return [self.items[i][1] for i in order]

    def raise_if_any(self, file: Optional[str]) -> None:
        if not self.items:
            return
        lines = self.lines()
        n = len(lines)
        where = escape_name(file) if file is not None else "the config"
        message = f"{n} problem{'s' if n != 1 else ''} in {where}:\n" + "\n".join(f"  {escape_name(p)}" for p in lines)
        raise ConfigError(message, path=file, problems=lines)


def fail(file: Optional[str], problem: str) -> ConfigError:
    where = escape_name(file) if file is not None else "the config"
    return ConfigError(f"1 problem in {where}:\n  {escape_name(problem)}", path=file, problems=[problem])


def _type_name(v: Any) -> str:
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "boolean"
    if isinstance(v, int):
        return "integer"
    if isinstance(v, float):
        return "number"
    if isinstance(v, str):
        return "string"
    if isinstance(v, Mapping):
        return "mapping"
    if isinstance(v, (list, tuple)):
        return "list"
    return type(v).__name__


# repr() of a value from an untrusted file must stay short: a list may hold itself (YAML
# aliases), nest thousands deep or share parts a billion times over.
class _ShortRepr(reprlib.Repr):
    """:mod:`reprlib` with bounded size and depth, keeping a mapping's keys in file order."""

    def repr_dict(self, x: Any, level: int) -> str:
        if not x:
            return "{}"
        if level <= 0:
            return "{...}"
        items = [f"{self.repr1(k, level - 1)}: {self.repr1(v, level - 1)}"
                 for k, v in itertools.islice(x.items(), self.maxdict)]
        return "{" + ", ".join(items + (["..."] if len(x) > self.maxdict else [])) + "}"


_SHORT_REPR = _ShortRepr()
_SHORT_REPR.maxlevel = 3
_SHORT_REPR.maxlist = _SHORT_REPR.maxtuple = _SHORT_REPR.maxdict = 10
_SHORT_REPR.maxstring = _SHORT_REPR.maxother = 60


def show(v: Any) -> str:
    """``string '200k'``, ``boolean true``, ``list ['a', 1]``, ``null``."""
    kind = _type_name(v)
    if v is None:
        return "null"
    if isinstance(v, bool):
        return f"{kind} {'true' if v else 'false'}"
    text = f"'{v}'" if isinstance(v, str) else _SHORT_REPR.repr(v)
    if len(text) > 60:
        text = text[:57] + "..."
    return f"{kind} {text}"


