"""Environment variables and paths in a config: ``$VAR`` / ``${VAR}`` expansion and resolution.

``$$`` is a literal ``$``; :func:`escape_dollars` is the inverse used when a config is written back.
Remote URLs (``gs://``, ``s3://``) are neither checked nor resolved; a ``file://`` URL is the local
path it names, checked and resolved like any other. A config file may come from
anyone, and a URL sends what it holds to its host: a variable is expanded into a URL only when
the user allows it (:func:`allowed_variables`), never because the config asks.
"""

from __future__ import annotations

import os
import re
from typing import FrozenSet, Iterable, List, Mapping, Optional, Tuple, Union

from ..core.args import local_path
from ..core.errors import ArgumentError, SettingError
from ..core.text import quote_name
from .problems import IDENT


def escape_dollars(path: str) -> str:
    """Undo env expansion for a round trip: a literal ``$`` is written ``$$``."""
    return path.replace("$", "$$")


def expand(value: str, env: Mapping[str, str]) -> Tuple[Optional[str], Optional[str]]:
    """Expand ``$VAR`` and ``${VAR}`` (``$$`` is a literal ``$``); return (result, problem)."""
    result, problem, _ = expand_names(value, env)
    return result, problem


def expand_names(value: str, env: Mapping[str, str]) -> Tuple[Optional[str], Optional[str], List[str]]:
    """:func:`expand`, also returning the names of the variables it used, in order, once each."""
    out: List[str] = []
    unset: List[str] = []
    used: List[str] = []
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
                return None, f"unterminated '${{' in {quote_name(value)} (write '$$' for a literal '$').", used
            name = value[i + 2:j]
            if not IDENT.fullmatch(name):
                return None, (f"invalid environment variable name {quote_name(name)} in {quote_name(value)} "
                              "(write '$$' for a literal '$')."), used
            i = j + 1
        else:
            m = IDENT.match(value, i + 1)
            if not m:  # '$' before something that cannot start a name: a literal '$'
                out.append("$")
                i += 1
                continue
            name = m.group(0)
            i = m.end()
        if name not in used:
            used.append(name)
        if name in env:
            out.append(env[name])
        elif name not in unset:
            unset.append(name)
    if unset:
        names = " and ".join(quote_name(u) for u in unset)
        verb = "is" if len(unset) == 1 else "are"
        return None, (f"environment variable{'s' if len(unset) > 1 else ''} {names} {verb} not set "
                      f"(used in {quote_name(value)})."), used
    return "".join(out), None, used


#: The environment variable listing, comma- or space-separated, the variables a config may put
#: into a URL (besides ``allow_env`` / ``--allow-env``).
ALLOW_ENV = "CKPTMERGE_ALLOW_ENV"


def allowed_variables(allow_env: Union[None, str, Iterable[str]], env: Mapping[str, str]) -> FrozenSet[str]:
    """The variables a config may expand into a remote URL: ``allow_env`` (a name or names)
    and those ``env`` lists in :data:`ALLOW_ENV`.

    Raises:
        ArgumentError: a name in ``allow_env`` is not a variable name.
        SettingError: a name in :data:`ALLOW_ENV` is not one.

    Example:
        >>> sorted(allowed_variables(["HF_TOKEN"], {"CKPTMERGE_ALLOW_ENV": "BUCKET, REGION"}))
        ['BUCKET', 'HF_TOKEN', 'REGION']
    """
    given = [allow_env] if isinstance(allow_env, str) else list(allow_env or ())
    for name in given:
        if not isinstance(name, str) or not IDENT.fullmatch(name):
            raise ArgumentError("allow_env must list environment variable names (letters, digits and '_', "
                                f"not starting with a digit), e.g. ['HF_TOKEN']. Received: {name!r:.80}")
    listed = [w for w in re.split(r"[,\s]+", env.get(ALLOW_ENV, "")) if w]
    for name in listed:
        if not IDENT.fullmatch(name):
            raise SettingError(f"The environment variable {ALLOW_ENV}={quote_name(env[ALLOW_ENV][:80])} is not valid: "
                               f"{quote_name(name[:40])} is not a variable name. List names separated by commas "
                               "or spaces, e.g. HF_TOKEN,BUCKET.", name=ALLOW_ENV, value=env[ALLOW_ENV])
    return frozenset(given) | frozenset(listed)


def is_remote(path: str) -> bool:
    return "://" in path  # gs://, s3://, hdfs://: not checked, not resolved


def resolve_path(path: str, base: str) -> str:
    """``path`` absolute (``~`` expanded, a relative path taken from ``base``); a ``file://`` URL
    is the local path it names (:func:`ckptmerge.core.args.local_path`), any other URL is kept as it is.

    Example:
        >>> resolve_path("runs/A", "/cfg"), resolve_path("file:///data/A", "/cfg"), resolve_path("s3://b/A", "/cfg")
        ('/cfg/runs/A', '/data/A', 's3://b/A')
    """
    path = local_path(path)
    if is_remote(path):
        return path
    path = os.path.expanduser(path)
    if not os.path.isabs(path):
        path = os.path.join(base, path)
    return os.path.normpath(path)
