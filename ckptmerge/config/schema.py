"""Validating a parsed config against the schema of ``docs/config.md``.

Every problem is collected (unknown keys with "did you mean", wrong types, bad enum values,
regexes that do not compile or use constructs RE2 does not run, backreferences to missing
groups, unset environment variables, missing paths, duplicate source names) so that
:func:`ckptmerge.config.load_config` can raise them all at once.
"""

from __future__ import annotations

import re
from typing import Any, Dict, List, Mapping, Optional, Tuple, Union

from ..core.errors import RuleError, did_you_mean
from ..planning.patterns import PatternError, UserPattern, compile_pattern
from ..planning.rules import MapRule
from ..planning.transforms import (
    SLICE_INITS,
    VOCAB_INITS,
    Slice,
    TransformError,
    VocabRemap,
    read_vocab,
)
from ..core.text import quote_name
from .fields import (  # noqa: F401 - the key lists are re-exported: schema.SOURCE_KEYS, ...
    COMBINE_KEYS,
    CONVENTION_KEYS,
    KEY_CUTOFF,
    OP_KEYS,
    SLICE_KEYS,
    SOURCE_KEYS,
    TOP_LEVEL_KEYS,
    VOCAB_KEYS,
    Context,
    check_keys,
    check_path,
    get_bool,
    get_enum,
    get_globs,
    get_int,
    get_name,
    get_path,
    show_choices,
)
from .model import CombineConfig, Config, SourceConfig
from .problems import KeyPath, show

_OP_REQUIRED = {"split": ("axis", "index", "parts"), "concat": ("sources",)}
_OP_EXAMPLES = {"reshape": "[{name: enc/query/kernel, shape: [64, 4, 16]}]", "transpose": "[{name: k, perm: [1, 0]}]",
                "split": "[{name: attn/key/kernel, axis: 1, index: 1, parts: 3}]", "squeeze": "[{name: pos, axis: 0}]",
                "expand_dims": "[{name: pos, axis: 0}]", "concat": "[{name: qkv/kernel, sources: [q, k, v], axis: 1}]"}

ON_CONFLICT = ("error", "first", "last")
ON_SHAPE_MISMATCH = ("error", "skip")


# -- source entries ---------------------------------------------------------------------------


def _get_map(d: Mapping, path: KeyPath, ctx: Context) -> Optional[Dict[str, Union[str, List[str]]]]:
    if "map" not in d or d["map"] is None:
        return None
    v = d["map"]
    p = path + ("map",)
    if not isinstance(v, Mapping):
        ctx.add(p, "expected a mapping {checkpoint_name: target_name}, e.g. "
                   f"{{'bert/encoder/': 'model/encoder/'}}, received {show(v)}.")
        return None
    out: Dict[str, Union[str, List[str]]] = {}
    seen: Dict[str, str] = {}
    for k, t in v.items():
        q = p + (str(k),)
        if not isinstance(k, str):
            ctx.add(p, f"checkpoint names must be strings, received the key {show(k)}.")
            continue
        targets = t if isinstance(t, list) and t else [t]
        if not all(isinstance(x, str) for x in targets):
            ctx.add(q, "expected a target name or scope (a string), or a non-empty list of them "
                       f"(one checkpoint name feeding several targets), received {show(t)}.")
            continue
        try:
            rule = [MapRule(k, x) for x in targets][0]
        except RuleError as e:
            ctx.add(q, str(e))
            continue
        if rule.source in seen:
            ctx.add(q, f"{quote_name(k)} is the same checkpoint name as {quote_name(seen[rule.source])} once "
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
        return (f"replacement {quote_name(repl)} refers to group {m.group(1)} but {quote_name(pattern)} has "
                f"{have}{hint}")
    m = re.match(r"unknown group name '(.*)'", text)
    if m:
        names = sorted(compiled.groupindex)
        has = ("the named groups " + show_choices(names)) if names else "no named groups"
        return (f"replacement {quote_name(repl)} refers to the unknown group {quote_name(m.group(1))}; "
                f"{quote_name(pattern)} has {has}.{did_you_mean(m.group(1), names, n=1, cutoff=KEY_CUTOFF)}".rstrip("."))
    pos = getattr(e, "pos", None)
    at = f" at position {pos}" if pos is not None else ""
    return f"invalid replacement {quote_name(repl)} for {quote_name(pattern)}: {text}{at}"


def _get_regex(d: Mapping, path: KeyPath, ctx: Context) -> Optional[List[Tuple[str, Optional[str]]]]:
    if "regex" not in d or d["regex"] is None:
        return None
    v = d["regex"]
    p = path + ("regex",)
    example = "[['^head/(.*)$', 'model/head/\\1']]"
    if not isinstance(v, list):
        ctx.add(p, f"expected a list of [pattern, replacement] pairs, e.g. {example}, received {show(v)}.")
        return None
    out: List[Tuple[str, Optional[str]]] = []
    for j, pair in enumerate(v):
        q = p + (j,)
        if not isinstance(pair, list) or len(pair) != 2:
            hint = f" (regex is a list of pairs: {example})" if isinstance(pair, str) else ""
            ctx.add(q, f"expected a [pattern, replacement] pair, received {show(pair)}{hint}.")
            continue
        pattern, repl = pair
        if not isinstance(pattern, str) or not pattern:
            ctx.add(q, f"expected the pattern to be a non-empty string, received {show(pattern)}.")
            continue
        if repl is False:  # TOML has no null: false drops, as null does elsewhere
            repl = None
        if repl is not None and not isinstance(repl, str):
            ctx.add(q, "expected the replacement to be a string, or null (false in TOML) to drop "
                       f"the matching names, received {show(repl)}.")
            continue
        if repl == "":
            ctx.add(q, f"empty replacement for {quote_name(pattern)}: to drop the matching names write null "
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


def _get_list_of_mappings(d: Mapping, key: str, path: KeyPath, ctx: Context,
                          example: str) -> List[Tuple[KeyPath, Mapping]]:
    if key not in d or d[key] is None:
        return []
    v = d[key]
    p = path + (key,)
    if not isinstance(v, list):
        hint = f" (write it as a list: {key}: [{{...}}])" if isinstance(v, Mapping) else ""
        ctx.add(p, f"expected a list of mappings, e.g. {example}, received {show(v)}{hint}.")
        return []
    out = []
    for j, item in enumerate(v):
        if isinstance(item, Mapping):
            out.append((p + (j,), item))
        else:
            ctx.add(p + (j,), f"expected a mapping, e.g. {example}, received {show(item)}.")
    return out


def _get_vocab_spec(d: Mapping, key: str, path: KeyPath, ctx: Context) -> Optional[Union[str, Tuple[str, ...]]]:
    if key not in d or d[key] is None:
        ctx.add(path, f"missing required key '{key}' (a vocabulary file, one token per line, or a "
                      "list of tokens).")
        return None
    v = d[key]
    p = path + (key,)
    if isinstance(v, list):
        if not v or not all(isinstance(t, str) for t in v):
            ctx.add(p, f"expected a vocabulary file or a non-empty list of token strings, received {show(v)}.")
            return None
        first: Dict[str, int] = {}
        for i, tok in enumerate(v):
            j = first.setdefault(tok, i)
            if j != i:
                ctx.add(p, f"duplicate token {quote_name(tok)} at positions {j} and {i}; every token must be unique.")
                return None
        return tuple(v)
    if not isinstance(v, str) or not v:
        ctx.add(p, f"expected a vocabulary file (a path) or a list of tokens, received {show(v)}.")
        return None
    resolved = check_path(v, p, ctx, "file")
    if resolved is None:
        return None
    try:
        read_vocab(resolved)
    except TransformError as e:
        ctx.add(p, str(e).rstrip("."))
        return None
    return resolved


def _get_vocab(d: Mapping, path: KeyPath, ctx: Context) -> Tuple[VocabRemap, ...]:
    out = []
    example = "[{name: model/embed/embeddings, old_vocab: v1.txt, new_vocab: v2.txt}]"
    for q, item in _get_list_of_mappings(d, "vocab", path, ctx, example):
        suggested = check_keys(item, VOCAB_KEYS, q, ctx, "vocab")
        name = get_name(item, "name", q, ctx, "name" not in suggested, "the target variable name or glob")
        # A misspelt key already said "did you mean 'old_vocab'": do not also report it missing.
        old, new = (_get_vocab_spec(item, k, q, ctx) if k in item or k not in suggested else None
                    for k in ("old_vocab", "new_vocab"))
        axis = get_int(item, "axis", q, ctx, 0, "an axis (an integer >= 0; 0: rows, 1: columns)")
        init = get_enum(item, "init", q, ctx, VOCAB_INITS, "zeros")
        old_size = (-1 if item.get("old_vocab_size") == -1 else
                    get_int(item, "old_vocab_size", q, ctx, None, "a number of tokens (an integer >= 1, or -1: all)"))
        new_size = get_int(item, "new_vocab_size", q, ctx, None, "a number of tokens (an integer >= 1)")
        oov = get_int(item, "num_oov_buckets", q, ctx, 0, "a number of OOV buckets (an integer >= 0)")
        if name is None or old is None or new is None:
            continue
        try:
            out.append(VocabRemap(name, old, new, axis=axis, init=init, old_vocab_size=old_size,
                                  new_vocab_size=new_size, num_oov_buckets=oov))
        except TransformError as e:
            ctx.add(q, str(e).rstrip("."))
    return tuple(out)


def _get_slices(d: Mapping, path: KeyPath, ctx: Context) -> Tuple[Slice, ...]:
    out = []
    for q, item in _get_list_of_mappings(d, "slice", path, ctx, "[{name: model/head/kernel, axis: 1}]"):
        suggested = check_keys(item, SLICE_KEYS, q, ctx, "slice")
        name = get_name(item, "name", q, ctx, "name" not in suggested, "the target variable name or glob")
        if "axis" not in item or item["axis"] is None:
            if "axis" not in suggested:
                ctx.add(q, "missing required key 'axis' (the one axis along which the shapes differ).")
            axis = None
        else:
            axis = get_int(item, "axis", q, ctx, None, "an axis (an integer >= 0)")
        init = get_enum(item, "init", q, ctx, SLICE_INITS, "keep")
        start = get_int(item, "start", q, ctx, 0, "a start entry (an integer >= 0)")
        if name is None or axis is None or start is None:
            continue
        try:
            out.append(Slice(name, axis, init=init, start=start))
        except TransformError as e:  # pragma: no cover - every field was checked above
            ctx.add(q, str(e).rstrip("."))
    return tuple(out)


def _get_ops(d: Mapping, path: KeyPath, ctx: Context) -> Tuple[Any, ...]:
    """A source's tensor-operation lists (``reshape``, ``split``, ... :data:`OP_KEYS`), as transform objects."""
    from ..alignment.tensorops import (  # (only for a config with some)
        Concat,
        ExpandDims,
        Reshape,
        Split,
        Squeeze,
    )
    from ..planning.transforms import Transpose

    kinds = {"reshape": Reshape, "split": Split, "transpose": Transpose, "squeeze": Squeeze, "expand_dims": ExpandDims,
             "concat": Concat}
    out = []
    for kind, cls in kinds.items():
        for q, item in _get_list_of_mappings(d, kind, path, ctx, _OP_EXAMPLES[kind]):
            suggested = check_keys(item, OP_KEYS[kind], q, ctx, kind)
            name = get_name(item, "name", q, ctx, "name" not in suggested, "the target variable name or glob")
            args = {k: item[k] for k in OP_KEYS[kind][1:] if item.get(k) is not None}
            need = [k for k in _OP_REQUIRED.get(kind, ()) if k not in args and k not in suggested]
            if need:
                ctx.add(q, f"missing required key{'s' if len(need) > 1 else ''} "
                           f"{', '.join(repr(k) for k in need)} (e.g. {_OP_EXAMPLES[kind]}).")
            for key in ("shape", "perm", "sources", "sizes"):
                if key in args and isinstance(args[key], list):
                    args[key] = tuple(args[key])
            if name is None or need:
                continue
            try:
                out.append(cls(name, **args))
            except (TransformError, TypeError) as e:
                ctx.add(q, str(e).rstrip("."))
    return tuple(out)


def _fused_row(item: Mapping, names: List[str], q: Tuple[Any, ...], ctx: Context) -> Any:
    """A ``conventions:`` entry with ``parts``: a row of the fused-module table, or None (reported)."""
    from ..alignment.fused import FusedConvention  # (loaded only for a config that has some)

    parts, why = item.get("parts"), item.get("why", "")
    for key in ("role", "replace", "leaf"):
        if key in item:
            ctx.add(q + (key,), f"'{key}' belongs to a naming convention; an entry with 'parts' is a fused module "
                                "(names, parts, equal, why).")
            return None
    if not isinstance(parts, list) or not all(isinstance(p, str) for p in parts):
        ctx.add(q + ("parts",), f"expected a list of part names in the fused order (e.g. [gate_proj, up_proj]), "
                                f"received {show(parts)}.")
        return None
    equal = get_bool(item, "equal", q, ctx, True)
    if not isinstance(why, str):
        ctx.add(q + ("why",), f"expected a string, received {show(why)}.")
        return None
    try:
        return FusedConvention(tuple(names), tuple(parts), bool(equal), why)
    except RuleError as e:
        ctx.add(q, str(e).rstrip("."))
        return None


def _get_conventions(d: Mapping, ctx: Context) -> Tuple[Any, ...]:
    """The ``conventions:`` list: rows added to the naming-convention table for alignment."""
    from ..alignment.conventions import (
        Convention,  # (loaded only for a config that has some)
    )

    out = []
    for q, item in _get_list_of_mappings(d, "conventions", (), ctx, "[{names: [pre_mlp_rmsnorm], role: mlpnorm}]"):
        suggested = check_keys(item, CONVENTION_KEYS, q, ctx, "convention")
        names = item.get("names")
        if isinstance(names, str):
            names = [names]
        if names is None:
            if "names" not in suggested:
                ctx.add(q, "missing required key 'names' (the name segments, e.g. [pre_mlp_rmsnorm]).")
            continue
        if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
            ctx.add(q + ("names",), f"expected a list of name segments (strings), received {show(names)}.")
            continue
        if "parts" in item:  # a fused module: its parts, in order (ckptmerge.alignment.fused)
            fused = _fused_row(item, names, q, ctx)
            if fused is not None:
                out.append(fused)
            continue
        role = get_name(item, "role", q, ctx, "role" not in suggested, "a role (lower-case words, e.g. mlpnorm)")
        why = item.get("why", "")
        leaf = item.get("leaf", "")
        replace = get_bool(item, "replace", q, ctx, False)
        if role is None:
            continue
        for key, value in (("why", why), ("leaf", leaf)):
            if not isinstance(value, str):
                ctx.add(q + (key,), f"expected a string, received {show(value)}.")
        if not isinstance(why, str) or not isinstance(leaf, str):
            continue
        try:
            out.append(Convention(tuple(names), role, why, bool(replace), leaf))
        except RuleError as e:
            ctx.add(q, str(e).rstrip("."))
    return tuple(out)


def _get_source(entry: Any, path: KeyPath, ctx: Context, extra: Tuple[str, ...] = ()) -> Optional[SourceConfig]:
    if isinstance(entry, str) and extra:  # a combine input or base given as its path alone
        entry = {"path": entry}
    if not isinstance(entry, Mapping):
        ctx.add(path, f"expected a source (a mapping with at least 'path'), received {show(entry)}.")
        return None
    suggested = check_keys(entry, SOURCE_KEYS + extra, path, ctx, "source")
    name = get_name(entry, "name", path, ctx, False, "a source name")
    if "path" in entry or "path" not in suggested:
        ckpt = get_path(entry, "path", path, ctx, kind="checkpoint", required=True)
    else:
        ckpt = None
    return SourceConfig(
        path=ckpt,  # type: ignore[arg-type] - None only when a problem was reported
        name=name,
        step=get_int(entry, "step", path, ctx, None, "a global step (an integer >= 0), or null for the latest"),
        item=get_name(entry, "item", path, ctx, False, "the name of an item of an Orbax step (e.g. state)"),
        map=_get_map(entry, path, ctx),
        regex=_get_regex(entry, path, ctx),
        include=get_globs(entry, "include", path, ctx),
        exclude=get_globs(entry, "exclude", path, ctx),
        optimizer=get_bool(entry, "optimizer", path, ctx, False),
        cast=get_bool(entry, "cast", path, ctx, None),
        align=None if entry.get("align") is None else get_enum(entry, "align", path, ctx, _align_modes(), None),
        layout=None if entry.get("layout") is None else get_enum(entry, "layout", path, ctx, _layouts(), None),
        vocab=_get_vocab(entry, path, ctx),
        slice=_get_slices(entry, path, ctx),
        ops=_get_ops(entry, path, ctx),
    )


def _check_labels(sources: List[Optional[SourceConfig]], ctx: Context) -> None:
    """Sources need distinct labels (name, or path when unnamed), as ``ckptmerge.planning.planner`` does."""
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
            ctx.add(("sources", i, "name"), f"duplicate source name {quote_name(s.name)} (also sources[{j}]); "
                                            "give each source a distinct name.")
        else:
            ctx.add(("sources", i), f"reads the same checkpoint as sources[{j}] and neither has a "
                                    "'name'; give each a distinct name.")


def _number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and v == v and abs(v) != float("inf")


def _get_glob_values(v: Any, p: KeyPath, ctx: Context, check: Any, what: str) -> Any:
    """A value, or ``{glob: value}`` (first matching glob wins), each value passing ``check``."""
    if isinstance(v, Mapping):
        if not v:
            ctx.add(p, f"expected {what} or a non-empty mapping {{glob: value}}, received an empty mapping.")
            return None
        for g, x in v.items():
            if not isinstance(g, str) or not g:
                ctx.add(p, f"globs must be non-empty strings, received the key {show(g)}.")
            problem = check(x)
            if problem:
                ctx.add(p + (g,), problem)
        return dict(v)
    problem = check(v)
    if problem:
        ctx.add(p, problem)
        return None
    return v


def _get_combine(data: Mapping, ctx: Context) -> Optional[CombineConfig]:
    from ..combining.combine import ACCUMULATE, INTEGERS, KEYS
    from ..combining.methods import CONVENTIONS, METHODS
    from ..combining.params import param_problems

    c = data["combine"]
    path: KeyPath = ("combine",)
    if not isinstance(c, Mapping):
        ctx.add(path, f"expected a mapping (method, models or run, base, parameters, ...), received {show(c)}.")
        return None
    check_keys(c, COMBINE_KEYS, path, ctx, "combine")
    method = get_enum(c, "method", path, ctx, tuple(METHODS), "mean")
    m = METHODS[method]
    conventions = get_enum(c, "conventions", path, ctx, CONVENTIONS, "ckptmerge")
    defaults = m.defaults_for(conventions)
    models: List[Tuple[SourceConfig, Any]] = []
    run = None
    if ("models" in c) == ("run" in c):
        ctx.add(path, "give either 'models' (a list of checkpoints) or 'run' (a training directory, with last, "
                      "steps or every), not " + ("both." if "models" in c else "neither."))
    if "models" in c:
        raw = c["models"]
        if not isinstance(raw, list) or not raw:
            ctx.add(path + ("models",), f"expected a non-empty list of checkpoints (paths, or mappings with 'path' and "
                                        f"optionally 'weight'), received {show(raw)}.")
        else:
            for i, entry in enumerate(raw):
                q = path + ("models", i)
                src = _get_source(entry, q, ctx, extra=("weight",))
                weight = None
                if isinstance(entry, Mapping) and "weight" in entry:
                    weight = _get_glob_values(entry["weight"], q + ("weight",), ctx,
                                              lambda x: None if (_number(x) or (isinstance(x, list) and x and all(
                                                  map(_number, x)))) else
                                              f"expected a number or a gradient list of numbers, received {show(x)}.",
                                              "a number or a gradient list")
                if src is not None:
                    models.append((src, weight))
            _check_labels_at([s for s, _ in models], path + ("models",), ctx)
    if "run" in c:
        run = get_path(c, "run", path, ctx, kind="checkpoint")
    for key in ("last", "every"):
        if key in c and "run" not in c:
            ctx.add(path + (key,), f"'{key}' selects checkpoints of 'run' (a training directory); there is no 'run'.")
    last = get_int(c, "last", path, ctx, None, "a number of checkpoints (an integer >= 1)")
    every = get_int(c, "every", path, ctx, None, "a step interval (an integer >= 1)")
    for key, v in (("last", last), ("every", every)):
        if v is not None and v < 1:
            ctx.add(path + (key,), f"expected an integer >= 1, received {show(v)}.")
    steps: Any = None
    if "steps" in c:
        v = c["steps"]
        if isinstance(v, list) and v and all(isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in v):
            steps = list(v)
        elif isinstance(v, Mapping) and set(v) <= {"from", "to"} and all(
                x is None or (isinstance(x, int) and not isinstance(x, bool)) for x in v.values()):
            steps = (v.get("from"), v.get("to"))
        else:
            ctx.add(path + ("steps",), f"expected a list of steps or {{from: N, to: M}} (inclusive), received {show(v)}.")
    base = _get_source(c["base"], path + ("base",), ctx, extra=("weight",)) if "base" in c else None
    if m.needs_base and "base" not in c:
        ctx.add(path, f"method '{method}' needs 'base' (the checkpoint the models were fine-tuned from).")
    parameters: Dict[str, Any] = {}
    if "parameters" in c:
        raw = c["parameters"]
        if not isinstance(raw, Mapping):
            ctx.add(path + ("parameters",), f"expected a mapping of the method's parameters, received {show(raw)}.")
        else:
            for k, v in raw.items():
                q = path + ("parameters", k)
                if k not in defaults:
                    hint = did_you_mean(str(k), list(defaults), n=1, cutoff=KEY_CUTOFF)
                    if conventions == "ckptmerge" and k in m.defaults_for("mergekit"):
                        hint = " It is a parameter under mergekit's conventions: add 'conventions: mergekit'."
                    ctx.add(q, f"method '{method}' has no parameter {quote_name(str(k))}"
                               f"{' under ' + conventions + ' conventions' if conventions != 'ckptmerge' else ''}; "
                               f"it takes {show_choices(list(defaults)) or 'none'}.{hint}", key=True)
                    continue
                def check(x: Any, k: str = k) -> Optional[str]:  # (the API's check: the same words)
                    bad = param_problems(k, x, defaults[k])
                    return "; ".join(bad) + "." if bad else None

                value = _get_glob_values(v, q, ctx, check, "a value or a gradient list")
                if value is not None:
                    parameters[k] = value
    options = {
        "keys": get_enum(c, "keys", path, ctx, KEYS, "strict"),
        "integers": get_enum(c, "integers", path, ctx, INTEGERS, "last"),
        "accumulate": get_enum(c, "accumulate", path, ctx, ACCUMULATE, "float64"),
        "optimizer": get_bool(c, "optimizer", path, ctx, False),
    }
    if conventions != "ckptmerge":  # (written back only when set)
        options["conventions"] = conventions
    if c.get("dtype") is not None:
        options["dtype"] = get_enum(c, "dtype", path, ctx, ("float16", "bfloat16", "float32", "float64"), None)
    rules: Dict[str, Any] = {}
    name = get_name(c, "name", path, ctx, False, "a source name")
    if name is not None:
        rules["name"] = name
    for key, value in (("map", _get_map(c, path, ctx)), ("regex", _get_regex(c, path, ctx)),
                       ("include", get_globs(c, "include", path, ctx)), ("exclude", get_globs(c, "exclude", path, ctx))):
        if value is not None:
            rules[key] = value
    if c.get("layout") is not None:
        rules["layout"] = get_enum(c, "layout", path, ctx, _layouts(), None)
    return CombineConfig(method=method, models=models, run=run, last=last, steps=steps, every=every, base=base,
                         parameters=parameters, options=options, rules=rules)


def _check_labels_at(sources: List[SourceConfig], path: KeyPath, ctx: Context) -> None:
    seen: Dict[str, int] = {}
    for i, s in enumerate(sources):
        label = s.name or s.path
        if label in seen:
            ctx.add(path + (i,), f"reads the same checkpoint as entry {seen[label]}; give each a distinct 'name'.")
        seen.setdefault(label, i)


def build(data: Any, file: Optional[str], ctx: Context) -> Optional[Config]:
    if data is None:
        ctx.add((), "the config is empty; expected a mapping with at least 'sources', e.g. "
                    "sources: [{path: runs/A}].")
        return None
    if not isinstance(data, Mapping):
        ctx.add((), f"expected a mapping of options (sources, allow_missing, ...) at the top level, "
                    f"received {show(data)}.")
        return None
    suggested = check_keys(data, TOP_LEVEL_KEYS, (), ctx, "top")
    sources: List[Optional[SourceConfig]] = []
    combined = _get_combine(data, ctx) if "combine" in data else None
    if "sources" not in data:
        if "sources" not in suggested and "combine" not in data:
            ctx.add((), "missing required key 'sources' (a list of sources, each with at least 'path'), or a "
                        "'combine' section.")
    else:
        raw = data["sources"]
        if not isinstance(raw, list):
            ctx.add(("sources",), f"expected a list of sources (each a mapping with at least 'path'), "
                                  f"received {show(raw)}.")
        elif not raw:
            ctx.add(("sources",), "expected at least one source, received an empty list.")
        else:
            sources = [_get_source(entry, ("sources", i), ctx) for i, entry in enumerate(raw)]
            _check_labels(sources, ctx)
    allow = get_globs(data, "allow_missing", (), ctx)
    plan_options = {
        "allow_missing": allow if allow is not None else [],
        "on_conflict": get_enum(data, "on_conflict", (), ctx, ON_CONFLICT, "error"),
        "on_shape_mismatch": get_enum(data, "on_shape_mismatch", (), ctx, ON_SHAPE_MISMATCH, "error"),
        "skip_mismatch": get_bool(data, "skip_mismatch", (), ctx, False),
        "cast": get_bool(data, "cast", (), ctx, False),
        "verify": get_bool(data, "verify", (), ctx, True),
    }
    strict = get_bool(data, "strict", (), ctx, True)
    conventions = _get_conventions(data, ctx)
    target = get_path(data, "target", (), ctx, kind="checkpoint")
    output = get_path(data, "output", (), ctx, kind="output")
    record_paths = get_bool(data, "record_paths", (), ctx, True)
    if ctx.problems:
        return None
    return Config(path=file, sources=[s for s in sources if s is not None], plan_options=plan_options,
                  strict=strict, target=target, output=output, combine=combined, record_paths=record_paths,
                  urls=tuple(ctx.urls), conventions=conventions)


def report_duplicates(dups: List[Tuple[KeyPath, str, int, int]], ctx: Context) -> None:
    for path, key, line, first in dups:
        ctx.add(path, f"duplicate key '{key}' (first at line {first}); keep one.", line=line)


# ============================================================================================
# The front door
# ============================================================================================


def _align_modes() -> Tuple[str, ...]:
    from ..alignment.align import (
        ALIGN_MODES,  # (loaded only for a config that names one)
    )

    return ALIGN_MODES


def _layouts() -> Tuple[str, ...]:
    from ..alignment.layouts import LAYOUTS  # (loaded only for a config that names one)

    return LAYOUTS
