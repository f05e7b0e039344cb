"""Reading config files with line numbers: YAML, TOML and JSON, within safety limits.

Files are untrusted: only regular files up to :data:`MAX_CONFIG_BYTES` are read, nesting is
limited to :data:`MAX_NESTING` levels (before a recursive parser could exhaust the stack), and
YAML aliases may not expand a file beyond a size proportional to it. Each parser returns the
data, a locator giving the line of a key path, and the duplicate keys found.
"""

from __future__ import annotations

import bisect
import functools
import json
import os
import re
from typing import Any, Dict, List, Optional, Tuple

from ..formats.io.localfile import NotARegularFileError, read_regular_file
from ..core.text import quote_name
from .problems import KeyPath, Locator, fail, map_locator

#: The largest config file read (16 MiB): a config is a few hundred lines; anything larger, or
#: a device such as ``/dev/zero``, is refused before it can fill memory.
MAX_CONFIG_BYTES = 16 * 1024 * 1024
#: The deepest nesting of lists and mappings accepted (a valid config needs 5 levels). Deeper
#: documents are refused before parsing them recursively could exhaust Python's stack.
MAX_NESTING = 100
#: YAML aliases may repeat parts of a document, but expanded it may hold at most this many values
#: per byte of the file (and at least ``_YAML_MIN_VALUES``): a 1 KB "billion laughs" would
#: otherwise expand to 10**9 values.
_YAML_VALUES_PER_BYTE = 10
_YAML_MIN_VALUES = 100_000

_FORMATS = {".yaml": "yaml", ".yml": "yaml", ".toml": "toml", ".json": "json"}


class _Refused(Exception):
    """A document refused before it is fully parsed (too deep, or aliases expanding too much)."""

    def __init__(self, line: int, message: str) -> None:
        super().__init__(message)
        self.line = line
        self.message = message


def _too_deep(line: int) -> _Refused:
    return _Refused(line, f"lists and mappings nested more than {MAX_NESTING} levels deep, the most "
                          "accepted (a config needs fewer than 10)")


@functools.lru_cache(maxsize=None)
def _yaml_loader() -> Any:
    import yaml  # PyYAML: a dependency of ckptmerge, imported only when a YAML file is read

    class Loader(yaml.SafeLoader):
        """PyYAML's safe loader, refusing nesting deeper than :data:`MAX_NESTING`.

        PyYAML composes nodes recursively (a few Python frames per level): a 5,000-deep
        ``[[[...]]]`` would end in a RecursionError.
        """

        _depth = 0

        def compose_node(self, parent: Any, index: Any) -> Any:
            self._depth += 1
            try:
                if self._depth > MAX_NESTING:
                    raise _too_deep(self.peek_event().start_mark.line + 1)
                return super().compose_node(parent, index)
            finally:
                self._depth -= 1

    return Loader


def _parse_yaml(text: str, label: str, file: str) -> Tuple[Any, Locator, List[Tuple[KeyPath, str, int, int]]]:
    import yaml

    loader = _yaml_loader()(text)
    try:
        node = loader.get_single_node()
        values: Dict[KeyPath, int] = {}
        keys: Dict[KeyPath, int] = {}
        dups: List[Tuple[KeyPath, str, int, int]] = []
        if node is not None:
            _check_yaml_expansion(node, max(_YAML_MIN_VALUES, _YAML_VALUES_PER_BYTE * len(text)))
            _walk_yaml(node, values, keys, dups)
        data = loader.construct_document(node) if node is not None else None
    except _Refused as e:
        raise fail(file, f"{label}:{e.line}: {e.message}") from None
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        where = f"{label}:{mark.line + 1}:{mark.column + 1}" if mark is not None else label
        what = e.problem or e.context or "syntax error"
        if e.context and e.problem and e.context_mark is not None:
            what += f" ({e.context} at line {e.context_mark.line + 1})"
        raise fail(file, f"{where}: invalid YAML: {what}") from None
    except yaml.YAMLError as e:
        raise fail(file, f"{label}: invalid YAML: {e}") from None
    finally:
        loader.dispose()
    return data, map_locator(values, keys), dups


def _check_yaml_expansion(root: Any, limit: int) -> None:
    """Refuse a document whose aliases expand it too much or nest it too deeply.

    An alias is the very node object of its anchor, so the composed document is a graph with one
    node per value written in the file. Its expanded size ("billion laughs": a 1 KB file with
    10**9 values) and depth (a chain of anchors, each aliasing the last) are computed once per
    node, never by expanding it; merge keys (``<<: *a``) count the merged mapping in full.
    """
    measured: Dict[int, Tuple[int, int]] = {}  # id(node) -> (expanded size, height)

    def measure(node: Any, depth: int) -> Tuple[int, int]:
        known = measured.get(id(node))
        if known is None:
            if depth > MAX_NESTING:
                raise _too_deep(node.start_mark.line + 1)
            measured[id(node)] = (1, 1)  # a recursive alias back to this node counts once
            n, h = 1, 1
            if isinstance(node.value, list):
                children = [c for pair in node.value for c in (pair if isinstance(pair, tuple) else (pair,))]
                for child in children:
                    cn, ch = measure(child, depth + 1)
                    n += cn
                    h = max(h, ch + 1)
                if n > limit:
                    raise _Refused(node.start_mark.line + 1,
                                   f"YAML aliases expand this value to more than {limit:,} values, "
                                   "the most accepted for a file of this size (an alias bomb?); "
                                   "repeat fewer parts with aliases")
            known = measured[id(node)] = (n, h)
        if depth + known[1] - 1 > MAX_NESTING:
            raise _too_deep(node.start_mark.line + 1)
        return known

    measure(root, 1)


def _walk_yaml(root: Any, values: Dict[KeyPath, int], keys: Dict[KeyPath, int],
               dups: List[Tuple[KeyPath, str, int, int]]) -> None:
    """Record the line of every key and value, and duplicate keys, visiting each node once.

    A path through an alias gets the line of the anchored value; what is inside it is not walked
    again (the lines found the first time stand for every use), so the work is one visit per
    node of the file however often aliases repeat it.
    """
    import yaml

    seen: set = set()

    def walk(node: Any, path: KeyPath) -> None:
        values.setdefault(path, node.start_mark.line + 1)
        if id(node) in seen:
            return
        seen.add(id(node))
        if isinstance(node, yaml.MappingNode):
            found: Dict[str, int] = {}
            for key_node, value_node in node.value:
                if not isinstance(key_node, yaml.ScalarNode):
                    continue  # a list or mapping as a key: construction reports it
                k = str(key_node.value)
                line = key_node.start_mark.line + 1
                if k in found and k != "<<":
                    dups.append((path, k, line, found[k]))
                found.setdefault(k, line)
                keys.setdefault(path + (k,), line)
                walk(value_node, path + (k,))
        elif isinstance(node, yaml.SequenceNode):
            for i, item in enumerate(node.value):
                walk(item, path + (i,))

    walk(root, ())


_JSON_WS = re.compile(r"[ \t\n\r]*")
_JSON_NUMBER = re.compile(r"-?(?:0|[1-9]\d*)(?:\.\d+)?(?:[eE][-+]?\d+)?")


# Brackets outside strings and comments, for JSON and TOML (JSON's strings are TOML's basic
# strings; TOML adds multi-line and literal strings and comments). Each alternative consumes what
# it matches, so one pass is linear in the text.
_NESTING_TOKENS = re.compile(r'"""(?:[^\\]|\\.)*?"""|' r"'''.*?'''|" r'"(?:[^"\\\n]|\\.)*"|'
                             r"'[^'\n]*'|#[^\n]*|[\[\]{}]", re.S)


def _check_nesting(text: str, label: str, file: str) -> None:
    """Refuse JSON or TOML nested deeper than :data:`MAX_NESTING`, before a recursive parser sees it.

    ``json`` and ``tomllib`` recurse once per level: 5,000 nested lists end in a RecursionError.
    """
    depth = 0
    for m in _NESTING_TOKENS.finditer(text):
        c = m.group()
        if c == "[" or c == "{":
            depth += 1
            if depth > MAX_NESTING:
                e = _too_deep(text.count("\n", 0, m.start()) + 1)
                raise fail(file, f"{label}:{e.line}: {e.message}")
        elif c == "]" or c == "}":
            depth = max(0, depth - 1)


def _parse_json(text: str, label: str, file: str) -> Tuple[Any, Locator, List[Tuple[KeyPath, str, int, int]]]:
    _check_nesting(text, label, file)
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise fail(file, f"{label}:{e.lineno}:{e.colno}: invalid JSON: {e.msg}") from None
    values, keys, dups = _json_positions(text)
    return data, map_locator(values, keys), dups


def _json_positions(text: str) -> Tuple[Dict[KeyPath, int], Dict[KeyPath, int], List[Tuple[KeyPath, str, int, int]]]:
    """Line of every value and key of a valid JSON document (json itself keeps none)."""
    from json.decoder import scanstring

    starts = [0] + [m.end() for m in re.finditer("\n", text)]
    values: Dict[KeyPath, int] = {}
    keys: Dict[KeyPath, int] = {}
    dups: List[Tuple[KeyPath, str, int, int]] = []

    def line(i: int) -> int:
        return bisect.bisect_right(starts, i)

    def skip(i: int) -> int:
        return _JSON_WS.match(text, i).end()  # type: ignore[union-attr]

    def value(i: int, path: KeyPath) -> int:
        i = skip(i)
        values.setdefault(path, line(i))
        c = text[i]
        if c == "{":
            i = skip(i + 1)
            if text[i] == "}":
                return i + 1
            seen: Dict[str, int] = {}
            while True:
                i = skip(i)
                kline = line(i)
                k, i = scanstring(text, i + 1)
                if k in seen:
                    dups.append((path, k, kline, seen[k]))
                seen.setdefault(k, kline)
                keys.setdefault(path + (k,), kline)
                i = skip(i) + 1  # ':'
                i = skip(value(i, path + (k,)))
                if text[i] == ",":
                    i += 1
                    continue
                return i + 1
        if c == "[":
            i = skip(i + 1)
            if text[i] == "]":
                return i + 1
            n = 0
            while True:
                i = skip(value(i, path + (n,)))
                n += 1
                if text[i] == ",":
                    i += 1
                    continue
                return i + 1
        if c == '"':
            return scanstring(text, i + 1)[1]
        for lit in ("true", "false", "null", "NaN", "Infinity", "-Infinity"):
            if text.startswith(lit, i):
                return i + len(lit)
        m = _JSON_NUMBER.match(text, i)
        return m.end() if m else i + 1

    value(0, ())
    return values, keys, dups


def _parse_toml(text: str, label: str, file: str) -> Tuple[Any, Locator, List[Tuple[KeyPath, str, int, int]]]:
    import tomllib

    _check_nesting(text, label, file)
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        msg = str(e)
        m = re.search(r"\s*\(at line (\d+), column (\d+)\)$", msg)
        if m:
            msg = msg[:m.start()]
            where = f"{label}:{m.group(1)}:{m.group(2)}"
        else:
            msg = re.sub(r"\s*\(at end of document\)$", " (at the end of the file)", msg)
            where = label
        raise fail(file, f"{where}: invalid TOML: {msg}") from None
    return data, _TomlLocator(text).locate, []


_TOML_KEY = r'(?:[A-Za-z0-9_-]+|"(?:[^"\\]|\\.)*"|\'[^\']*\')'
_TOML_DOTTED = re.compile(rf"\s*{_TOML_KEY}(?:\s*\.\s*{_TOML_KEY})*\s*")
_TOML_HEADER = re.compile(r"^\s*(\[\[|\[)(.+?)(\]\]|\])\s*(?:#.*)?$")


class _TomlLocator:
    """Best-effort lines for TOML (tomllib keeps none): table headers, then ``key =`` lines.

    Follows ``[[sources]]`` / ``[sources.map]`` / ``[[sources.vocab]]`` headers by index, then
    finds ``key = ...`` among a table's own lines. Inside inline tables and arrays it stops at
    the line of the enclosing key.
    """

    def __init__(self, text: str) -> None:
        self.lines = text.split("\n")
        self.headers: List[Tuple[int, Tuple[str, ...], bool]] = []
        in_string = False
        for i, line in enumerate(self.lines):
            if (line.count('"""') + line.count("'''")) % 2 == 1:
                in_string = not in_string
                continue
            if in_string:
                continue
            m = _TOML_HEADER.match(line)
            if not m or (m.group(1) == "[[") != (m.group(3) == "]]"):
                continue
            if not _TOML_DOTTED.fullmatch(m.group(2)):
                continue  # e.g. an array item ["a", "b"] on its own line
            names = tuple(_toml_unquote(k) for k in re.findall(_TOML_KEY, m.group(2)))
            self.headers.append((i, names, m.group(1) == "[["))

    def _find_key(self, key: str, start: int, end: int) -> Optional[int]:
        k = re.escape(key)
        pat = re.compile(rf"^\s*(?:{k}|\"{k}\"|'{k}')\s*=")
        for i in range(max(start, 0), end):
            if pat.match(self.lines[i]):
                return i
        return None

    def locate(self, path: KeyPath, key: bool = False) -> Optional[int]:
        start, end, prefix = -1, len(self.lines), ()  # the root table: the whole file
        best: Optional[int] = None
        i = 0
        while i < len(path):
            comp = path[i]
            if not isinstance(comp, str):
                return best
            own_end = next((h[0] for h in self.headers if start < h[0] < end), end)
            found = self._find_key(comp, start + 1, own_end)
            if found is not None:
                return found + 1
            name = prefix + (comp,)
            cands = [h for h in self.headers if start < h[0] < end and h[1] == name]
            nxt = path[i + 1] if i + 1 < len(path) else None
            if cands and cands[0][2] and isinstance(nxt, int) and nxt < len(cands):
                header = cands[nxt]
                i += 2
            elif cands and not cands[0][2]:
                header = cands[0]
                i += 1
            else:
                return best
            best = header[0] + 1
            new_end = end
            for h in self.headers:
                if header[0] < h[0] < end and not (len(h[1]) > len(name) and h[1][:len(name)] == name):
                    new_end = h[0]
                    break
            start, end, prefix = header[0], new_end, name
        return best


def _toml_unquote(k: str) -> str:
    if k.startswith('"'):
        try:
            return json.loads(k)
        except ValueError:
            return k[1:-1]
    if k.startswith("'"):
        return k[1:-1]
    return k


def parse_config_file(file: str, label: str) -> Tuple[Any, Locator, List[Tuple[KeyPath, str, int, int]]]:
    """Read and parse a ``.yaml``/``.yml``, ``.toml`` or ``.json`` config file, within the limits.

    Args:
        file: the config file.
        label: how problem lines name the file (its base name).

    Returns:
        The parsed data, a locator of key paths' lines, and the duplicate keys found as
        ``(mapping path, key, line, first line)``.

    Raises:
        ConfigError: the file is missing, not a regular file, too large, not UTF-8, nested too
            deeply, an alias bomb, or not valid YAML/TOML/JSON.

    Example:
        >>> data, locate, dups = parse_config_file("warm.yaml", "warm.yaml")  # doctest: +SKIP
        >>> data["sources"][0]["path"], locate(("sources", 0, "path"), False)  # doctest: +SKIP
        ('runs/A', 2)
    """
    ext = os.path.splitext(file)[1].lower()
    if ext not in _FORMATS:
        raise fail(file, f"{label}: unsupported config file extension {quote_name(ext or '(none)')}; "
                          "expected .yaml, .yml, .toml or .json")
    try:
        raw = read_regular_file(file, limit=MAX_CONFIG_BYTES)
    except FileNotFoundError:
        raise fail(file, f"{label}: config file not found: {quote_name(os.path.abspath(file))}") from None
    except NotARegularFileError as e:
        raise fail(file, f"{label}: {e.reason}; expected a .yaml, .yml, .toml or .json file") from None
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        line = raw.count(b"\n", 0, e.start) + 1
        raise fail(file, f"{label}:{line}: the file is not valid UTF-8") from None
    parse = {"yaml": _parse_yaml, "toml": _parse_toml, "json": _parse_json}[_FORMATS[ext]]
    return parse(text, label, file)
