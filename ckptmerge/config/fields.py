"""Reading one value of a parsed config: the keys each section of the schema takes, and the checks
and typed getters (booleans, enums, integers, names, globs, paths) that every section of
:mod:`ckptmerge.config.schema` uses.

Each getter reports what is wrong through the :class:`Context` (collected, never raised one at a
time) and returns a default, so a config with several problems reports them all at once.
"""

from __future__ import annotations

import difflib
import os
from dataclasses import dataclass, field
from typing import Any, FrozenSet, List, Mapping, Optional, Sequence

from ..core.args import local_path
from ..core.errors import did_you_mean
from ..core.redact import mask_value, show_path_as
from ..core.text import quote_name
from .env import ALLOW_ENV, expand_names, is_remote, resolve_path
from .model import RemoteURL
from .problems import KeyPath, Problems, keypath, show

__all__ = ["TOP_LEVEL_KEYS", "CONVENTION_KEYS", "COMBINE_KEYS", "SOURCE_KEYS", "OP_KEYS", "VOCAB_KEYS", "SLICE_KEYS",
           "KEY_CUTOFF", "Context", "show_choices", "check_keys", "get_bool", "get_enum", "get_int", "get_name",
           "get_globs", "get_path", "check_path"]

#: Keys of the top-level mapping.
TOP_LEVEL_KEYS = ("sources", "combine", "allow_missing", "on_conflict", "on_shape_mismatch", "skip_mismatch", "cast",
                  "verify", "strict", "target", "output", "record_paths", "conventions")
#: Keys of one entry of ``conventions`` (:class:`ckptmerge.alignment.conventions.Convention`, or with
#: ``parts`` a :class:`ckptmerge.alignment.fused.FusedConvention`).
CONVENTION_KEYS = ("names", "role", "why", "replace", "leaf", "parts", "equal")
#: Keys of the ``combine`` section (the options of ``ckptmerge.combine``).
COMBINE_KEYS = ("method", "models", "run", "last", "steps", "every", "base", "parameters", "dtype", "keys",
                "integers", "optimizer", "accumulate", "name", "map", "regex", "include", "exclude", "layout",
                "conventions")
#: Keys of one entry of ``sources`` (the options of ``ckptmerge.Source``, plus transforms).
SOURCE_KEYS = ("name", "path", "step", "item", "map", "regex", "include", "exclude", "optimizer", "cast",
               "align", "layout", "vocab", "slice", "reshape", "split", "transpose", "squeeze", "expand_dims",
               "concat")
#: Keys of one entry of a source's tensor-operation lists (:class:`ckptmerge.Reshape`, ``Split``,
#: ``Transpose``, ``Squeeze``, ``ExpandDims``, ``Concat``); the schema's ``_OP_REQUIRED``: those without a default.
OP_KEYS = {"reshape": ("name", "shape"), "split": ("name", "axis", "index", "parts", "sizes"), "concat": ("name",
           "sources", "axis"), "transpose": ("name", "perm"), "squeeze": ("name", "axis"), "expand_dims": ("name", "axis")}
#: Keys of one entry of a source's ``vocab`` list (:class:`ckptmerge.planning.transforms.VocabRemap`).
VOCAB_KEYS = ("name", "old_vocab", "new_vocab", "axis", "init", "old_vocab_size", "new_vocab_size",
              "num_oov_buckets")
#: Keys of one entry of a source's ``slice`` list (:class:`ckptmerge.planning.transforms.Slice`).
SLICE_KEYS = ("name", "axis", "init", "start")


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
    "reshape": {"target": "name", "variable": "name", "new_shape": "shape"},
    "split": {"target": "name", "variable": "name", "chunks": "parts", "part": "index", "dim": "axis"},
    "transpose": {"target": "name", "variable": "name", "axes": "perm", "permutation": "perm"},
    "convention": {"name": "names", "segments": "names", "meaning": "role", "description": "why"},
    "combine": {"merge_method": "method", "base_model": "base", "checkpoints": "models", "inputs": "models",
                "params": "parameters", "directory": "run", "dir": "run"},
    "top": {"merge": "combine", "average": "combine"},
}

# Keys and enum values form small closed sets: a looser match than for variable names is safe
# (it finds 'path' for 'paht' and 'keep' for 'kept').
KEY_CUTOFF = 0.6


def show_choices(options: Sequence[str]) -> str:
    """The options quoted and joined with commas, for messages (``"'a', 'b'"``)."""
    return ", ".join(quote_name(o) for o in options)


@dataclass
class Context:
    problems: Problems
    base: str
    base_label: str
    env: Mapping[str, str]
    #: the variables the user allows into URLs (see ckptmerge.config.env.allowed_variables)
    allowed: FrozenSet[str] = frozenset()
    #: every URL the config names, in the order met
    urls: List[RemoteURL] = field(default_factory=list)

    def add(self, path: KeyPath, message: str, **kw: Any) -> None:
        self.problems.add(path, message, **kw)


def check_keys(d: Mapping, allowed: Sequence[str], path: KeyPath, ctx: Context, where: str) -> set:
    """Report unknown keys; return the allowed keys that were suggested for them."""
    suggested: set = set()
    for k in d:
        if k in allowed:
            continue
        if not isinstance(k, str):
            ctx.add(path, f"keys must be strings, received {show(k)}.")
            continue
        alias = _ALIASES[where].get(k)
        close = difflib.get_close_matches(k, allowed, n=1, cutoff=KEY_CUTOFF)
        if alias:
            hint = f" Use '{alias}' (ckptmerge's name for '{k}')."
            suggested.add(alias)
        elif close:
            hint = did_you_mean(k, allowed, n=1, cutoff=KEY_CUTOFF)
            suggested.add(close[0])
        elif where == "source" and k in TOP_LEVEL_KEYS:
            hint = " It is a top-level option: move it out of 'sources'."
        elif where == "top" and k in SOURCE_KEYS:
            hint = " It is an option of a source: put it inside an entry of 'sources'."
        else:
            hint = f" Valid keys: {', '.join(allowed)}."
        ctx.add(path, f"unknown key '{k}'.{hint}", at=path + (k,), key=True)
    return suggested


def get_bool(d: Mapping, key: str, path: KeyPath, ctx: Context, default: Any) -> Any:
    if key not in d:
        return default
    v = d[key]
    if isinstance(v, bool) or (v is None and default is None):  # null: "not set" where allowed
        return v
    ctx.add(path + (key,), f"expected true or false, received {show(v)}.")
    return default


def get_enum(d: Mapping, key: str, path: KeyPath, ctx: Context, choices: Sequence[str], default: str) -> str:
    if key not in d:
        return default
    v = d[key]
    if isinstance(v, str) and v in choices:
        return v
    hint = did_you_mean(v, choices, n=1, cutoff=KEY_CUTOFF) if isinstance(v, str) else ""
    ctx.add(path + (key,), f"expected one of {show_choices(choices)}, received {show(v)}.{hint}")
    return default


def get_int(d: Mapping, key: str, path: KeyPath, ctx: Context, default: Any, what: str) -> Any:
    if key not in d or d[key] is None:
        return default
    v = d[key]
    if isinstance(v, int) and not isinstance(v, bool) and v >= 0:
        return v
    ctx.add(path + (key,), f"expected {what}, received {show(v)}.")
    return default


def get_name(d: Mapping, key: str, path: KeyPath, ctx: Context, required: bool, what: str) -> Optional[str]:
    if key not in d or (d[key] is None and not required):
        if required:
            ctx.add(path, f"missing required key '{key}' ({what}).")
        return None
    v = d[key]
    if isinstance(v, str) and v:
        return v
    ctx.add(path + (key,), f"expected {what} (a non-empty string), received {show(v)}.")
    return None


def get_globs(d: Mapping, key: str, path: KeyPath, ctx: Context) -> Optional[List[str]]:
    if key not in d or d[key] is None:
        return None
    v = d[key]
    p = path + (key,)
    if isinstance(v, str):
        v = [v]
    if not isinstance(v, list):
        ctx.add(p, f"expected a glob or a list of globs (e.g. ['encoder/*']), received {show(v)}.")
        return None
    out = []
    for i, g in enumerate(v):
        if isinstance(g, str) and g:
            out.append(g)
        else:
            ctx.add(p + (i,), f"expected a glob (a non-empty string), received {show(g)}.")
    return out


def get_path(d: Mapping, key: str, path: KeyPath, ctx: Context, *, kind: str,
              required: bool = False) -> Optional[str]:
    """Validate, expand and resolve a path; ``kind`` is "checkpoint", "file" or "output"."""
    if key not in d or (d[key] is None and not required):
        if required:
            ctx.add(path, f"missing required key '{key}' (the checkpoint prefix or directory).")
        return None
    v = d[key]
    p = path + (key,)
    if not isinstance(v, str) or not v:
        ctx.add(p, f"expected a path (a non-empty string), received {show(v)}.")
        return None
    return check_path(v, p, ctx, kind)


def _check_url(v: str, url: str, names: List[str], p: KeyPath, ctx: Context) -> Optional[str]:
    """A URL: only the variables the user allowed may be in it (its host would receive them)."""
    refused = [n for n in names if n not in ctx.allowed]
    if refused:
        shown = " and ".join(quote_name(n) for n in refused)
        flags = " ".join(f"--allow-env {n}" for n in refused)
        ctx.add(p, f"{quote_name(v)} is a URL built from the environment variable{'s' if len(refused) > 1 else ''} "
                   f"{shown}: its host would receive {'their values' if len(refused) > 1 else 'its value'}, so it is "
                   f"not expanded. If this config is yours and {'they are' if len(refused) > 1 else 'it is'} meant "
                   f"for that host, allow {'them' if len(refused) > 1 else 'it'}: {flags} (load_config(..., "
                   f"allow_env={refused!r}), or {ALLOW_ENV}={','.join(refused)}).")
        return None
    for n in names:  # shown as written wherever the URL is shown
        mask_value(ctx.env[n], "${" + n + "}")
    ctx.urls.append(RemoteURL(keypath(p), v, url))
    return url


def _show_as_written(written: str, resolved: str) -> None:
    """Show the folder the environment (or ``~``) made of ``written`` as written, in every message
    from now on (:func:`ckptmerge.core.redact.show_path_as`): ``${DATA}/run/ckpt`` resolved to
    ``/mnt/d/run/ckpt`` shows ``/mnt/d`` as ``${DATA}``, so a later error about
    ``/mnt/d/run/ckpt.index`` reads ``${DATA}/run/ckpt.index``."""
    w = written[len("file://"):] if written.startswith("file://") else written
    wparts, rparts = w.rstrip("/").split("/"), resolved.rstrip("/").split("/")
    while len(wparts) > 1 and len(rparts) > 1 and wparts[-1] == rparts[-1] and "$" not in wparts[-1]:
        wparts.pop()
        rparts.pop()
    show_path_as("/".join(rparts), "/".join(wparts))


def check_path(v: str, p: KeyPath, ctx: Context, kind: str) -> Optional[str]:
    expanded, problem, names = expand_names(v, ctx.env)
    if problem or expanded is None:
        ctx.add(p, problem or "")
        return None
    resolved = resolve_path(expanded, ctx.base)
    if is_remote(resolved):
        return _check_url(v, resolved, names, p, ctx)
    if names or v.startswith("~") or v.startswith("file://~"):
        _show_as_written(v, resolved)
    if kind == "output":
        return resolved
    note = "" if os.path.isabs(os.path.expanduser(local_path(expanded))) else f" (relative to {ctx.base_label})"
    if names:  # messages show the path as written, never what the environment put into it
        resolved_shown = v
    else:
        resolved_shown = resolved
    if kind == "checkpoint":
        if not (os.path.exists(resolved) or os.path.exists(resolved + ".index")):
            first = "it" if v == resolved_shown else quote_name(resolved_shown)
            ctx.add(p, f"checkpoint {quote_name(v)} not found: neither {first} nor "
                       f"{quote_name(resolved_shown + '.index')} exists{note}.")
            return None
    else:
        if not os.path.exists(resolved):
            if v == resolved_shown:
                ctx.add(p, f"vocab file {quote_name(v)} does not exist{note if names else ''}.")
            else:
                ctx.add(p, f"vocab file {quote_name(v)} not found: {quote_name(resolved_shown)} does not exist{note}.")
            return None
        if os.path.isdir(resolved):
            ctx.add(p, f"vocab file {quote_name(v)} is a directory; expected a text file with one token per line.")
            return None
    return resolved
