"""Config files for warm starts: every source, rule, transform and policy in one reviewed file.

:func:`load_config` reads a YAML, TOML or JSON file (or an already-parsed dict) with the schema
documented in ``docs/config.md`` and returns a :class:`Config`. Validation happens here, before
any checkpoint is opened: unknown keys (with "did you mean"), wrong types, bad enum values,
regexes that do not compile or use constructs RE2 does not run, backreferences to missing
groups, unset environment variables, missing paths, duplicate source names and syntax errors are
all collected and raised as one :class:`ckptmerge.ConfigError`, each problem on its own line as
``FILE:LINE KEYPATH: message``. Files are untrusted: only regular files up to
:data:`MAX_CONFIG_BYTES` are read, nesting is limited to :data:`MAX_NESTING` levels, and YAML
aliases may not expand a file beyond a size proportional to it.

A :class:`Config` maps one to one onto the Python API: :meth:`Config.source_kwargs` gives the
keyword arguments of each ``ckptmerge.Source`` and :attr:`Config.plan_options` those of
``ckptmerge.planner``. Nothing here reads checkpoints or imports TensorFlow; vocabulary files are
read (they are small and part of the config's meaning).
"""

from __future__ import annotations

import bisect
import difflib
import functools
import itertools
import json
import logging
import os
import re
import reprlib
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple, Union

from .align import ALIGN_MODES
from .layouts import LAYOUTS
from .errors import ConfigError, RuleError, did_you_mean
from .localfile import NotARegularFileError, read_regular_file
from .patterns import PatternError, UserPattern, compile_pattern
from .rules import MapRule
from .text import escape_name
from .transforms import SLICE_INITS, VOCAB_INITS, Slice, TransformError, VocabRemap, read_vocab

__all__ = [
    "Config",
    "SourceConfig",
    "load_config",
    "TOP_LEVEL_KEYS",
    "SOURCE_KEYS",
    "VOCAB_KEYS",
    "SLICE_KEYS",
    "MAX_CONFIG_BYTES",
    "MAX_NESTING",
]

logger = logging.getLogger(__name__)

#: Keys of the top-level mapping.
TOP_LEVEL_KEYS = ("sources", "allow_missing", "on_conflict", "on_shape_mismatch", "cast", "verify",
                  "strict", "target", "output")
#: Keys of one entry of ``sources`` (the options of ``ckptmerge.Source``, plus transforms).
SOURCE_KEYS = ("name", "path", "step", "map", "regex", "include", "exclude", "optimizer", "cast",
               "align", "layout", "vocab", "slice")
#: Keys of one entry of a source's ``vocab`` list (:class:`ckptmerge.transforms.VocabRemap`).
VOCAB_KEYS = ("name", "old_vocab", "new_vocab", "axis", "init", "old_vocab_size", "new_vocab_size",
              "num_oov_buckets")
#: Keys of one entry of a source's ``slice`` list (:class:`ckptmerge.transforms.Slice`).
SLICE_KEYS = ("name", "axis", "init")

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

ON_CONFLICT = ("error", "first", "last")
ON_SHAPE_MISMATCH = ("error", "skip")

# Names other tools use for the same option: suggested instead of a spelling match.
_ALIASES = {
    "source": {"assignment_map": "map", "var_name_to_prev_var_name": "map", "rename": "map",
               "renames": "map", "ckpt_to_initialize_from": "path", "checkpoint": "path",
               "init_checkpoint": "path", "vars_to_warm_start": "include", "regexes": "regex",
               "var_name_to_vocab_info": "vocab", "transforms": "vocab' or 'slice"},
    "vocab": {"target": "name", "variable": "name", "backup_initializer": "init",
              "previous_vocab_size": "old_vocab_size", "current_vocab_size": "new_vocab_size",
              "current_oov_buckets": "num_oov_buckets"},
    "slice": {"target": "name", "variable": "name"},
    "top": {},
}

KeyPath = Tuple[Union[str, int], ...]
# Keys and enum values form small closed sets: a looser match than for variable names is safe
# (it finds 'path' for 'paht' and 'keep' for 'kept').
_KEY_CUTOFF = 0.6
_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_FORMATS = {".yaml": "yaml", ".yml": "yaml", ".toml": "toml", ".json": "json"}


# ============================================================================================
# The result
# ============================================================================================


def _escape(path: str) -> str:
    """Undo env expansion for a round trip: a literal ``$`` is written ``$$``."""
    return path.replace("$", "$$")


@dataclass(frozen=True)
class SourceConfig:
    """One validated entry of ``sources``: the arguments of one ``ckptmerge.Source``.

    Paths are absolute (environment variables expanded, relative paths resolved). ``cast=None``
    means "as the plan's ``cast``". ``vocab`` and ``slice`` hold ready transform objects.

    Example:
        >>> SourceConfig(path="/runs/A", map={"a1": "c/x1"}).source_kwargs()["map"]
        {'a1': 'c/x1'}
    """

    path: str
    name: Optional[str] = None
    step: Optional[int] = None
    map: Optional[Dict[str, Union[str, List[str]]]] = None
    regex: Optional[List[Tuple[str, Optional[str]]]] = None
    include: Optional[List[str]] = None
    exclude: Optional[List[str]] = None
    optimizer: bool = False
    cast: Optional[bool] = None
    vocab: Tuple[VocabRemap, ...] = ()
    slice: Tuple[Slice, ...] = ()
    align: Optional[str] = None
    layout: Optional[str] = None

    @property
    def transforms(self) -> List[Union[VocabRemap, Slice]]:
        """The value transforms, in the order they apply: vocab remaps, then slices."""
        return [*self.vocab, *self.slice]

    def source_kwargs(self) -> Dict[str, Any]:
        """Keyword arguments for ``ckptmerge.Source(**kwargs)`` (``path`` included).

        Example:
            >>> sorted(SourceConfig(path="/runs/A").source_kwargs())  # doctest: +NORMALIZE_WHITESPACE
            ['align', 'cast', 'exclude', 'include', 'layout', 'map', 'name', 'optimizer', 'path',
             'regex', 'step', 'transforms']
        """
        return {
            "path": self.path,
            "step": self.step,
            "map": dict(self.map) if self.map is not None else None,
            "regex": [tuple(r) for r in self.regex] if self.regex is not None else None,
            "include": list(self.include) if self.include is not None else None,
            "exclude": list(self.exclude) if self.exclude is not None else None,
            "optimizer": self.optimizer,
            "name": self.name,
            "cast": self.cast,
            "transforms": self.transforms,
            "align": self.align,
            "layout": self.layout,
        }

    def to_dict(self) -> Dict[str, Any]:
        """The entry as plain data (only the options that are set); see :meth:`Config.to_dict`."""
        out: Dict[str, Any] = {}
        if self.name is not None:
            out["name"] = self.name
        out["path"] = _escape(self.path)
        if self.step is not None:
            out["step"] = self.step
        if self.map is not None:
            out["map"] = dict(self.map)
        if self.regex is not None:
            out["regex"] = [[p, r] for p, r in self.regex]
        if self.include is not None:
            out["include"] = list(self.include)
        if self.exclude is not None:
            out["exclude"] = list(self.exclude)
        if self.optimizer:
            out["optimizer"] = True
        if self.cast is not None:
            out["cast"] = self.cast
        if self.align is not None:
            out["align"] = self.align
        if self.layout is not None:
            out["layout"] = self.layout
        if self.vocab:
            out["vocab"] = [_vocab_to_dict(v) for v in self.vocab]
        if self.slice:
            out["slice"] = [{"name": s.target, "axis": s.axis, "init": s.init} for s in self.slice]
        return out


def _vocab_to_dict(v: VocabRemap) -> Dict[str, Any]:
    data = v.to_dict()
    out: Dict[str, Any] = {"name": data.pop("target")}
    data.pop("kind")
    for key in ("old_vocab", "new_vocab"):  # paths are written back with $ escaped
        if isinstance(data[key], str):
            data[key] = _escape(data[key])
    out.update(data)
    return out


@dataclass(frozen=True)
class Config:
    """A validated warm-start config.

    Attributes:
        path: the config file as given (``None`` for a dict). Not compared: the same config in
            YAML, TOML and JSON gives equal objects.
        sources: one :class:`SourceConfig` per entry of ``sources``, in order (= priority).
        plan_options: keyword arguments of ``ckptmerge.planner``: ``allow_missing`` (list),
            ``on_conflict``, ``on_shape_mismatch``, ``cast``, ``verify``.
        strict: whether findings other than ``unused`` stop the restore (default ``True``).
        target: a checkpoint used as the dry-run target by ``ckptmerge plan`` (absolute path).
        output: the output prefix of an offline merge (absolute path).

    Example:
        >>> cfg = load_config({"sources": [{"path": "."}], "on_conflict": "first"})
        >>> cfg.plan_options["on_conflict"], cfg.strict
        ('first', True)
    """

    path: Optional[str] = field(default=None, compare=False)
    sources: List[SourceConfig] = field(default_factory=list)
    plan_options: Dict[str, Any] = field(default_factory=dict)
    strict: bool = True
    target: Optional[str] = None
    output: Optional[str] = None

    def source_kwargs(self) -> List[Dict[str, Any]]:
        """Per source, the keyword arguments of ``ckptmerge.Source(**kwargs)``.

        Example:
            >>> cfg = load_config({"sources": [{"path": ".", "exclude": "*/Adam*"}]})
            >>> cfg.source_kwargs()[0]["exclude"]
            ['*/Adam*']
        """
        return [s.source_kwargs() for s in self.sources]

    def make_sources(self) -> List[Any]:
        """The :class:`ckptmerge.Source` objects this config describes (none is opened yet).

        Example:
            >>> cfg = load_config({"sources": [{"path": ".", "name": "base"}]})
            >>> [src.label for src in cfg.make_sources()]
            ['base']
        """
        from .source import Source

        return [Source(**kw) for kw in self.source_kwargs()]

    def to_dict(self) -> Dict[str, Any]:
        """The config as plain data: ``load_config(cfg.to_dict()) == cfg``.

        Paths are absolute with any literal ``$`` written as ``$$``; a dropping regex has a
        ``None`` replacement (write ``false`` when saving as TOML, which has no null).

        Example:
            >>> load_config({"sources": [{"path": "."}]}).to_dict()["on_shape_mismatch"]
            'error'
        """
        out: Dict[str, Any] = {"sources": [s.to_dict() for s in self.sources]}
        opts = dict(self.plan_options)
        out["allow_missing"] = list(opts.get("allow_missing", []))
        for k in ("on_conflict", "on_shape_mismatch", "cast", "verify"):
            if k in opts:
                out[k] = opts[k]
        out["strict"] = self.strict
        if self.target is not None:
            out["target"] = _escape(self.target)
        if self.output is not None:
            out["output"] = _escape(self.output)
        return out


# ============================================================================================
# Problems and where they are
# ============================================================================================


def _keypath(path: KeyPath) -> str:
    """``("sources", 1, "regex", 0)`` -> ``"sources[1].regex[0]"``."""
    out = ""
    for p in path:
        if isinstance(p, int):
            out += f"[{p}]"
        elif _IDENT.fullmatch(p):
            out += ("." if out else "") + p
        else:
            out += f"['{p}']"
    return out


Locator = Callable[[KeyPath, bool], Optional[int]]


def _no_lines(path: KeyPath, key: bool) -> Optional[int]:
    return None


def _map_locator(values: Dict[KeyPath, int], keys: Dict[KeyPath, int]) -> Locator:
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


class _Problems:
    """Collects problems as ``FILE:LINE KEYPATH: message`` lines."""

    def __init__(self, label: Optional[str], locate: Locator) -> None:
        self.label = label
        self.locate = locate
        self.items: List[Tuple[Optional[int], str]] = []

    def add(self, path: KeyPath, message: str, *, at: Optional[KeyPath] = None, key: bool = False,
            line: Optional[int] = None) -> None:
        if line is None and self.label is not None:
            line = self.locate(at if at is not None else path, key)
        kp = _keypath(path)
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
        where = file if file is not None else "the config"
        message = f"{n} problem{'s' if n != 1 else ''} in {where}:\n" + "\n".join(f"  {escape_name(p)}" for p in lines)
        raise ConfigError(message, path=file, problems=lines)


def _fail(file: Optional[str], problem: str) -> ConfigError:
    where = file if file is not None else "the config"
    return ConfigError(f"1 problem in {where}:\n  {escape_name(problem)}", path=file, problems=[problem])


# ============================================================================================
# Parsing (with line numbers)
# ============================================================================================


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
        raise _fail(file, f"{label}:{e.line}: {e.message}") from None
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        where = f"{label}:{mark.line + 1}:{mark.column + 1}" if mark is not None else label
        what = e.problem or e.context or "syntax error"
        if e.context and e.problem and e.context_mark is not None:
            what += f" ({e.context} at line {e.context_mark.line + 1})"
        raise _fail(file, f"{where}: invalid YAML: {what}") from None
    except yaml.YAMLError as e:
        raise _fail(file, f"{label}: invalid YAML: {e}") from None
    finally:
        loader.dispose()
    return data, _map_locator(values, keys), dups


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
                raise _fail(file, f"{label}:{e.line}: {e.message}")
        elif c == "]" or c == "}":
            depth = max(0, depth - 1)


def _parse_json(text: str, label: str, file: str) -> Tuple[Any, Locator, List[Tuple[KeyPath, str, int, int]]]:
    _check_nesting(text, label, file)
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise _fail(file, f"{label}:{e.lineno}:{e.colno}: invalid JSON: {e.msg}") from None
    values, keys, dups = _json_positions(text)
    return data, _map_locator(values, keys), dups


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
        raise _fail(file, f"{where}: invalid TOML: {msg}") from None
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


# ============================================================================================
# Validation
# ============================================================================================


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


def _show(v: Any) -> str:
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


def _q(s: str) -> str:
    """Quote for messages without doubling backslashes (``'\\1'`` reads as typed)."""
    return f"'{s}'"


def _choices(options: Sequence[str]) -> str:
    return ", ".join(_q(o) for o in options)


@dataclass
class _Ctx:
    problems: _Problems
    base: str
    base_label: str
    env: Mapping[str, str]

    def add(self, path: KeyPath, message: str, **kw: Any) -> None:
        self.problems.add(path, message, **kw)


def _check_keys(d: Mapping, allowed: Sequence[str], path: KeyPath, ctx: _Ctx, where: str) -> set:
    """Report unknown keys; return the allowed keys that were suggested for them."""
    suggested: set = set()
    for k in d:
        if k in allowed:
            continue
        if not isinstance(k, str):
            ctx.add(path, f"keys must be strings, received {_show(k)}.")
            continue
        alias = _ALIASES[where].get(k)
        close = difflib.get_close_matches(k, allowed, n=1, cutoff=_KEY_CUTOFF)
        if alias:
            hint = f" Use '{alias}' (ckptmerge's name for '{k}')."
            suggested.add(alias)
        elif close:
            hint = did_you_mean(k, allowed, n=1, cutoff=_KEY_CUTOFF)
            suggested.add(close[0])
        elif where == "source" and k in TOP_LEVEL_KEYS:
            hint = " It is a top-level option: move it out of 'sources'."
        elif where == "top" and k in SOURCE_KEYS:
            hint = " It is an option of a source: put it inside an entry of 'sources'."
        else:
            hint = f" Valid keys: {', '.join(allowed)}."
        ctx.add(path, f"unknown key '{k}'.{hint}", at=path + (k,), key=True)
    return suggested


def _get_bool(d: Mapping, key: str, path: KeyPath, ctx: _Ctx, default: Any) -> Any:
    if key not in d:
        return default
    v = d[key]
    if isinstance(v, bool) or (v is None and default is None):  # null: "not set" where allowed
        return v
    ctx.add(path + (key,), f"expected true or false, received {_show(v)}.")
    return default


def _get_enum(d: Mapping, key: str, path: KeyPath, ctx: _Ctx, choices: Sequence[str], default: str) -> str:
    if key not in d:
        return default
    v = d[key]
    if isinstance(v, str) and v in choices:
        return v
    hint = did_you_mean(v, choices, n=1, cutoff=_KEY_CUTOFF) if isinstance(v, str) else ""
    ctx.add(path + (key,), f"expected one of {_choices(choices)}, received {_show(v)}.{hint}")
    return default


def _get_int(d: Mapping, key: str, path: KeyPath, ctx: _Ctx, default: Any, what: str) -> Any:
    if key not in d or d[key] is None:
        return default
    v = d[key]
    if isinstance(v, int) and not isinstance(v, bool) and v >= 0:
        return v
    ctx.add(path + (key,), f"expected {what}, received {_show(v)}.")
    return default


def _get_name(d: Mapping, key: str, path: KeyPath, ctx: _Ctx, required: bool, what: str) -> Optional[str]:
    if key not in d or (d[key] is None and not required):
        if required:
            ctx.add(path, f"missing required key '{key}' ({what}).")
        return None
    v = d[key]
    if isinstance(v, str) and v:
        return v
    ctx.add(path + (key,), f"expected {what} (a non-empty string), received {_show(v)}.")
    return None


def _get_globs(d: Mapping, key: str, path: KeyPath, ctx: _Ctx) -> Optional[List[str]]:
    if key not in d or d[key] is None:
        return None
    v = d[key]
    p = path + (key,)
    if isinstance(v, str):
        v = [v]
    if not isinstance(v, list):
        ctx.add(p, f"expected a glob or a list of globs (e.g. ['encoder/*']), received {_show(v)}.")
        return None
    out = []
    for i, g in enumerate(v):
        if isinstance(g, str) and g:
            out.append(g)
        else:
            ctx.add(p + (i,), f"expected a glob (a non-empty string), received {_show(g)}.")
    return out


# -- env vars and paths -----------------------------------------------------------------------


def _expand(value: str, env: Mapping[str, str]) -> Tuple[Optional[str], Optional[str]]:
    """Expand ``$VAR`` and ``${VAR}`` (``$$`` is a literal ``$``); return (result, problem)."""
    out: List[str] = []
    unset: List[str] = []
    i, n = 0, len(value)
    while i < n:
        c = value[i]
        if c != "$":
            out.append(c)
            i += 1
            continue
        nxt = value[i + 1] if i + 1 < n else ""
        if nxt == "$":
            out.append("$")
            i += 2
            continue
        if nxt == "{":
            j = value.find("}", i + 2)
            if j < 0:
                return None, f"unterminated '${{' in {_q(value)} (write '$$' for a literal '$')."
            name = value[i + 2:j]
            if not _IDENT.fullmatch(name):
                return None, (f"invalid environment variable name {_q(name)} in {_q(value)} "
                              "(write '$$' for a literal '$').")
            i = j + 1
        else:
            m = _IDENT.match(value, i + 1)
            if not m:  # '$' before something that cannot start a name: a literal '$'
                out.append("$")
                i += 1
                continue
            name = m.group(0)
            i = m.end()
        if name in env:
            out.append(env[name])
        elif name not in unset:
            unset.append(name)
    if unset:
        names = " and ".join(_q(u) for u in unset)
        verb = "is" if len(unset) == 1 else "are"
        return None, (f"environment variable{'s' if len(unset) > 1 else ''} {names} {verb} not set "
                      f"(used in {_q(value)}).")
    return "".join(out), None


def _is_remote(path: str) -> bool:
    return "://" in path  # gs://, s3://, hdfs://: not checked, not resolved


def _resolve(path: str, base: str) -> str:
    if _is_remote(path):
        return path
    path = os.path.expanduser(path)
    if not os.path.isabs(path):
        path = os.path.join(base, path)
    return os.path.normpath(path)


def _get_path(d: Mapping, key: str, path: KeyPath, ctx: _Ctx, *, kind: str,
              required: bool = False) -> Optional[str]:
    """Validate, expand and resolve a path; ``kind`` is "checkpoint", "file" or "output"."""
    if key not in d or (d[key] is None and not required):
        if required:
            ctx.add(path, f"missing required key '{key}' (the checkpoint prefix or directory).")
        return None
    v = d[key]
    p = path + (key,)
    if not isinstance(v, str) or not v:
        ctx.add(p, f"expected a path (a non-empty string), received {_show(v)}.")
        return None
    return _check_path(v, p, ctx, kind)


def _check_path(v: str, p: KeyPath, ctx: _Ctx, kind: str) -> Optional[str]:
    expanded, problem = _expand(v, ctx.env)
    if problem or expanded is None:
        ctx.add(p, problem or "")
        return None
    resolved = _resolve(expanded, ctx.base)
    if _is_remote(resolved) or kind == "output":
        return resolved
    note = "" if os.path.isabs(os.path.expanduser(expanded)) else f" (relative to {ctx.base_label})"
    if kind == "checkpoint":
        if not (os.path.exists(resolved) or os.path.exists(resolved + ".index")):
            first = "it" if v == resolved else _q(resolved)
            ctx.add(p, f"checkpoint {_q(v)} not found: neither {first} nor {_q(resolved + '.index')} "
                       f"exists{note}.")
            return None
    else:
        if not os.path.exists(resolved):
            if v == resolved:
                ctx.add(p, f"vocab file {_q(v)} does not exist.")
            else:
                ctx.add(p, f"vocab file {_q(v)} not found: {_q(resolved)} does not exist{note}.")
            return None
        if os.path.isdir(resolved):
            ctx.add(p, f"vocab file {_q(v)} is a directory; expected a text file with one token per line.")
            return None
    return resolved


# -- source entries ---------------------------------------------------------------------------


def _get_map(d: Mapping, path: KeyPath, ctx: _Ctx) -> Optional[Dict[str, Union[str, List[str]]]]:
    if "map" not in d or d["map"] is None:
        return None
    v = d["map"]
    p = path + ("map",)
    if not isinstance(v, Mapping):
        ctx.add(p, "expected a mapping {checkpoint_name: target_name}, e.g. "
                   f"{{'bert/encoder/': 'model/encoder/'}}, received {_show(v)}.")
        return None
    out: Dict[str, Union[str, List[str]]] = {}
    seen: Dict[str, str] = {}
    for k, t in v.items():
        q = p + (str(k),)
        if not isinstance(k, str):
            ctx.add(p, f"checkpoint names must be strings, received the key {_show(k)}.")
            continue
        targets = t if isinstance(t, list) and t else [t]
        if not all(isinstance(x, str) for x in targets):
            ctx.add(q, "expected a target name or scope (a string), or a non-empty list of them "
                       f"(one checkpoint name feeding several targets), received {_show(t)}.")
            continue
        try:
            rule = [MapRule(k, x) for x in targets][0]
        except RuleError as e:
            ctx.add(q, str(e))
            continue
        if rule.source in seen:
            ctx.add(q, f"{_q(k)} is the same checkpoint name as {_q(seen[rule.source])} once "
                       "normalised; keep one entry.", key=True)
            continue
        seen[rule.source] = k
        out[k] = t
    return out


def _template_problem(pattern: str, repl: str, compiled: UserPattern, e: Exception) -> str:
    groups = compiled.groups
    have = f"{groups} group{'s' if groups != 1 else ''}"
    text = getattr(e, "msg", None) or str(e)
    m = re.match(r"invalid group reference (\d+)", text)
    if m:
        hint = " (add parentheses to capture)" if groups == 0 else ""
        return (f"replacement {_q(repl)} refers to group {m.group(1)} but {_q(pattern)} has "
                f"{have}{hint}")
    m = re.match(r"unknown group name '(.*)'", text)
    if m:
        names = sorted(compiled.groupindex)
        has = ("the named groups " + _choices(names)) if names else "no named groups"
        return (f"replacement {_q(repl)} refers to the unknown group {_q(m.group(1))}; "
                f"{_q(pattern)} has {has}.{did_you_mean(m.group(1), names, n=1, cutoff=_KEY_CUTOFF)}".rstrip("."))
    pos = getattr(e, "pos", None)
    at = f" at position {pos}" if pos is not None else ""
    return f"invalid replacement {_q(repl)} for {_q(pattern)}: {text}{at}"


def _get_regex(d: Mapping, path: KeyPath, ctx: _Ctx) -> Optional[List[Tuple[str, Optional[str]]]]:
    if "regex" not in d or d["regex"] is None:
        return None
    v = d["regex"]
    p = path + ("regex",)
    example = "[['^head/(.*)$', 'model/head/\\1']]"
    if not isinstance(v, list):
        ctx.add(p, f"expected a list of [pattern, replacement] pairs, e.g. {example}, received {_show(v)}.")
        return None
    out: List[Tuple[str, Optional[str]]] = []
    for j, pair in enumerate(v):
        q = p + (j,)
        if not isinstance(pair, list) or len(pair) != 2:
            hint = f" (regex is a list of pairs: {example})" if isinstance(pair, str) else ""
            ctx.add(q, f"expected a [pattern, replacement] pair, received {_show(pair)}{hint}.")
            continue
        pattern, repl = pair
        if not isinstance(pattern, str) or not pattern:
            ctx.add(q, f"expected the pattern to be a non-empty string, received {_show(pattern)}.")
            continue
        if repl is False:  # TOML has no null: false drops, as null does elsewhere
            repl = None
        if repl is not None and not isinstance(repl, str):
            ctx.add(q, "expected the replacement to be a string, or null (false in TOML) to drop "
                       f"the matching names, received {_show(repl)}.")
            continue
        if repl == "":
            ctx.add(q, f"empty replacement for {_q(pattern)}: to drop the matching names write null "
                       "(false in TOML).")
            continue
        try:
            compiled = compile_pattern(pattern)
        except PatternError as e:
            ctx.add(q, e.problem)
            continue
        if repl is not None:
            try:
                compiled.template(repl)
            except (re.error, IndexError) as e:
                ctx.add(q, _template_problem(pattern, repl, compiled, e))
                continue
        out.append((pattern, repl))
    return out


def _get_list_of_mappings(d: Mapping, key: str, path: KeyPath, ctx: _Ctx,
                          example: str) -> List[Tuple[KeyPath, Mapping]]:
    if key not in d or d[key] is None:
        return []
    v = d[key]
    p = path + (key,)
    if not isinstance(v, list):
        hint = f" (write it as a list: {key}: [{{...}}])" if isinstance(v, Mapping) else ""
        ctx.add(p, f"expected a list of mappings, e.g. {example}, received {_show(v)}{hint}.")
        return []
    out = []
    for j, item in enumerate(v):
        if isinstance(item, Mapping):
            out.append((p + (j,), item))
        else:
            ctx.add(p + (j,), f"expected a mapping, e.g. {example}, received {_show(item)}.")
    return out


def _get_vocab_spec(d: Mapping, key: str, path: KeyPath, ctx: _Ctx) -> Optional[Union[str, Tuple[str, ...]]]:
    if key not in d or d[key] is None:
        ctx.add(path, f"missing required key '{key}' (a vocabulary file, one token per line, or a "
                      "list of tokens).")
        return None
    v = d[key]
    p = path + (key,)
    if isinstance(v, list):
        if not v or not all(isinstance(t, str) for t in v):
            ctx.add(p, f"expected a vocabulary file or a non-empty list of token strings, received {_show(v)}.")
            return None
        first: Dict[str, int] = {}
        for i, tok in enumerate(v):
            j = first.setdefault(tok, i)
            if j != i:
                ctx.add(p, f"duplicate token {_q(tok)} at positions {j} and {i}; every token must be unique.")
                return None
        return tuple(v)
    if not isinstance(v, str) or not v:
        ctx.add(p, f"expected a vocabulary file (a path) or a list of tokens, received {_show(v)}.")
        return None
    resolved = _check_path(v, p, ctx, "file")
    if resolved is None:
        return None
    try:
        read_vocab(resolved)
    except TransformError as e:
        ctx.add(p, str(e).rstrip("."))
        return None
    return resolved


def _get_vocab(d: Mapping, path: KeyPath, ctx: _Ctx) -> Tuple[VocabRemap, ...]:
    out = []
    example = "[{name: model/embed/embeddings, old_vocab: v1.txt, new_vocab: v2.txt}]"
    for q, item in _get_list_of_mappings(d, "vocab", path, ctx, example):
        suggested = _check_keys(item, VOCAB_KEYS, q, ctx, "vocab")
        name = _get_name(item, "name", q, ctx, "name" not in suggested, "the target variable name or glob")
        # A misspelt key already said "did you mean 'old_vocab'": do not also report it missing.
        old, new = (_get_vocab_spec(item, k, q, ctx) if k in item or k not in suggested else None
                    for k in ("old_vocab", "new_vocab"))
        axis = _get_int(item, "axis", q, ctx, 0, "an axis (an integer >= 0; 0: rows, 1: columns)")
        init = _get_enum(item, "init", q, ctx, VOCAB_INITS, "zeros")
        old_size = (-1 if item.get("old_vocab_size") == -1 else
                    _get_int(item, "old_vocab_size", q, ctx, None, "a number of tokens (an integer >= 1, or -1: all)"))
        new_size = _get_int(item, "new_vocab_size", q, ctx, None, "a number of tokens (an integer >= 1)")
        oov = _get_int(item, "num_oov_buckets", q, ctx, 0, "a number of OOV buckets (an integer >= 0)")
        if name is None or old is None or new is None:
            continue
        try:
            out.append(VocabRemap(name, old, new, axis=axis, init=init, old_vocab_size=old_size,
                                  new_vocab_size=new_size, num_oov_buckets=oov))
        except TransformError as e:
            ctx.add(q, str(e).rstrip("."))
    return tuple(out)


def _get_slices(d: Mapping, path: KeyPath, ctx: _Ctx) -> Tuple[Slice, ...]:
    out = []
    for q, item in _get_list_of_mappings(d, "slice", path, ctx, "[{name: model/head/kernel, axis: 1}]"):
        suggested = _check_keys(item, SLICE_KEYS, q, ctx, "slice")
        name = _get_name(item, "name", q, ctx, "name" not in suggested, "the target variable name or glob")
        if "axis" not in item or item["axis"] is None:
            if "axis" not in suggested:
                ctx.add(q, "missing required key 'axis' (the one axis along which the shapes differ).")
            axis = None
        else:
            axis = _get_int(item, "axis", q, ctx, None, "an axis (an integer >= 0)")
        init = _get_enum(item, "init", q, ctx, SLICE_INITS, "keep")
        if name is None or axis is None:
            continue
        try:
            out.append(Slice(name, axis, init=init))
        except TransformError as e:  # pragma: no cover - every field was checked above
            ctx.add(q, str(e).rstrip("."))
    return tuple(out)


def _get_source(entry: Any, path: KeyPath, ctx: _Ctx) -> Optional[SourceConfig]:
    if not isinstance(entry, Mapping):
        ctx.add(path, f"expected a source (a mapping with at least 'path'), received {_show(entry)}.")
        return None
    suggested = _check_keys(entry, SOURCE_KEYS, path, ctx, "source")
    name = _get_name(entry, "name", path, ctx, False, "a source name")
    if "path" in entry or "path" not in suggested:
        ckpt = _get_path(entry, "path", path, ctx, kind="checkpoint", required=True)
    else:
        ckpt = None
    return SourceConfig(
        path=ckpt,  # type: ignore[arg-type] - None only when a problem was reported
        name=name,
        step=_get_int(entry, "step", path, ctx, None, "a global step (an integer >= 0), or null for the latest"),
        map=_get_map(entry, path, ctx),
        regex=_get_regex(entry, path, ctx),
        include=_get_globs(entry, "include", path, ctx),
        exclude=_get_globs(entry, "exclude", path, ctx),
        optimizer=_get_bool(entry, "optimizer", path, ctx, False),
        cast=_get_bool(entry, "cast", path, ctx, None),
        align=None if entry.get("align") is None else _get_enum(entry, "align", path, ctx, ALIGN_MODES, None),
        layout=None if entry.get("layout") is None else _get_enum(entry, "layout", path, ctx, LAYOUTS, None),
        vocab=_get_vocab(entry, path, ctx),
        slice=_get_slices(entry, path, ctx),
    )


def _check_labels(sources: List[Optional[SourceConfig]], ctx: _Ctx) -> None:
    """Sources need distinct labels (name, or path when unnamed), as ``ckptmerge.planner`` does."""
    first: Dict[str, int] = {}
    for i, s in enumerate(sources):
        if s is None:
            continue
        label = s.name or s.path
        if label is None:
            continue
        if label not in first:
            first[label] = i
            continue
        j = first[label]
        if s.name:
            ctx.add(("sources", i, "name"), f"duplicate source name {_q(s.name)} (also sources[{j}]); "
                                            "give each source a distinct name.")
        else:
            ctx.add(("sources", i), f"reads the same checkpoint as sources[{j}] and neither has a "
                                    "'name'; give each a distinct name.")


def _build(data: Any, file: Optional[str], ctx: _Ctx) -> Optional[Config]:
    if data is None:
        ctx.add((), "the config is empty; expected a mapping with at least 'sources', e.g. "
                    "sources: [{path: runs/A}].")
        return None
    if not isinstance(data, Mapping):
        ctx.add((), f"expected a mapping of options (sources, allow_missing, ...) at the top level, "
                    f"received {_show(data)}.")
        return None
    suggested = _check_keys(data, TOP_LEVEL_KEYS, (), ctx, "top")
    sources: List[Optional[SourceConfig]] = []
    if "sources" not in data:
        if "sources" not in suggested:
            ctx.add((), "missing required key 'sources' (a list of sources, each with at least 'path').")
    else:
        raw = data["sources"]
        if not isinstance(raw, list):
            ctx.add(("sources",), f"expected a list of sources (each a mapping with at least 'path'), "
                                  f"received {_show(raw)}.")
        elif not raw:
            ctx.add(("sources",), "expected at least one source, received an empty list.")
        else:
            sources = [_get_source(entry, ("sources", i), ctx) for i, entry in enumerate(raw)]
            _check_labels(sources, ctx)
    allow = _get_globs(data, "allow_missing", (), ctx)
    plan_options = {
        "allow_missing": allow if allow is not None else [],
        "on_conflict": _get_enum(data, "on_conflict", (), ctx, ON_CONFLICT, "error"),
        "on_shape_mismatch": _get_enum(data, "on_shape_mismatch", (), ctx, ON_SHAPE_MISMATCH, "error"),
        "cast": _get_bool(data, "cast", (), ctx, False),
        "verify": _get_bool(data, "verify", (), ctx, True),
    }
    strict = _get_bool(data, "strict", (), ctx, True)
    target = _get_path(data, "target", (), ctx, kind="checkpoint")
    output = _get_path(data, "output", (), ctx, kind="output")
    if ctx.problems:
        return None
    return Config(path=file, sources=[s for s in sources if s is not None], plan_options=plan_options,
                  strict=strict, target=target, output=output)


def _report_duplicates(dups: List[Tuple[KeyPath, str, int, int]], ctx: _Ctx) -> None:
    for path, key, line, first in dups:
        ctx.add(path, f"duplicate key '{key}' (first at line {first}); keep one.", line=line)


# ============================================================================================
# The front door
# ============================================================================================


def load_config(path_or_dict: Union[str, "os.PathLike[str]", Mapping[str, Any], Config], *,
                base_dir: Optional[Union[str, "os.PathLike[str]"]] = None,
                env: Optional[Mapping[str, str]] = None) -> Config:
    """Read and validate a warm-start config (YAML, TOML, JSON file, or a dict).

    Everything is checked before any checkpoint is opened, and every problem is reported at
    once. Environment variables (``$VAR``, ``${VAR}``; ``$$`` for a literal ``$``) are expanded
    in checkpoint paths, vocabulary file paths, ``target`` and ``output``; relative paths are
    resolved from the config file's folder (for a dict: ``base_dir``, else the current
    directory; ``base_dir`` also overrides the file's folder when given).

    Args:
        path_or_dict: a ``.yaml``/``.yml``, ``.toml`` or ``.json`` file, a parsed dict, or a
            :class:`Config` (returned as it is).
        base_dir: the folder relative paths are resolved from.
        env: the environment for variable expansion (default ``os.environ``).

    Returns:
        The validated :class:`Config`.

    Raises:
        ConfigError: listing every problem as ``FILE:LINE KEYPATH: message`` in ``e.problems``.

    Example:
        >>> cfg = load_config({"sources": [{"path": "${HOME}", "name": "home"}]},
        ...                   env={"HOME": "/"})
        >>> cfg.sources[0].path, cfg.sources[0].name
        ('/', 'home')
    """
    if isinstance(path_or_dict, Config):
        return path_or_dict
    env = os.environ if env is None else env
    if isinstance(path_or_dict, Mapping):
        file: Optional[str] = None
        label: Optional[str] = None
        data: Any = path_or_dict
        locate: Locator = _no_lines
        dups: List[Tuple[KeyPath, str, int, int]] = []
        base = os.path.abspath(os.fspath(base_dir)) if base_dir is not None else os.getcwd()
        base_label = "base_dir" if base_dir is not None else "the current directory"
    elif isinstance(path_or_dict, (str, os.PathLike)):
        file = os.fspath(path_or_dict)
        label = os.path.basename(file) or file
        ext = os.path.splitext(file)[1].lower()
        if ext not in _FORMATS:
            raise _fail(file, f"{label}: unsupported config file extension {_q(ext or '(none)')}; "
                              "expected .yaml, .yml, .toml or .json")
        try:
            raw = read_regular_file(file, limit=MAX_CONFIG_BYTES)
        except FileNotFoundError:
            raise _fail(file, f"{label}: config file not found: {_q(os.path.abspath(file))}") from None
        except NotARegularFileError as e:
            raise _fail(file, f"{label}: {e.reason}; expected a .yaml, .yml, .toml or .json file") from None
        try:
            text = raw.decode("utf-8-sig")
        except UnicodeDecodeError as e:
            line = raw.count(b"\n", 0, e.start) + 1
            raise _fail(file, f"{label}:{line}: the file is not valid UTF-8") from None
        parse = {"yaml": _parse_yaml, "toml": _parse_toml, "json": _parse_json}[_FORMATS[ext]]
        data, locate, dups = parse(text, label, file)
        if base_dir is not None:
            base = os.path.abspath(os.fspath(base_dir))
            base_label = "base_dir"
        else:
            base = os.path.dirname(os.path.abspath(file))
            base_label = "the config file's folder"
    else:
        raise ConfigError("load_config expects a path to a .yaml, .yml, .toml or .json file, or a dict; "
                          f"received {_show(path_or_dict)}.")
    ctx = _Ctx(_Problems(label, locate), base, base_label, env)
    _report_duplicates(dups, ctx)
    cfg = _build(data, file, ctx)
    ctx.problems.raise_if_any(file)
    if cfg is None:  # pragma: no cover - _build returns None only after reporting a problem
        raise _fail(file, "the config could not be read")
    logger.debug("loaded config %s: %d source(s)", file or "<dict>", len(cfg.sources))
    return cfg
