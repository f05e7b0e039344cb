"""Environment variables and paths in a config: ``$VAR`` / ``${VAR}`` expansion and resolution.

``$$`` is a literal ``$``; :func:`escape_dollars` is the inverse used when a config is written back.
Remote URLs (``gs://``, ``s3://``) are neither checked nor resolved.
"""

from __future__ import annotations

import os
from typing import List, Mapping, Optional, Tuple

from ..text import quote_name
from .problems import IDENT


def escape_dollars(path: str) -> str:
    """Undo env expansion for a round trip: a literal ``$`` is written ``$$``."""
    return path.replace("$", "$$")


def expand(value: str, env: Mapping[str, str]) -> Tuple[Optional[str], Optional[str]]:
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
                return None, f"unterminated '${{' in {quote_name(value)} (write '$$' for a literal '$')."
            name = value[i + 2:j]
            if not IDENT.fullmatch(name):
                return None, (f"invalid environment variable name {quote_name(name)} in {quote_name(value)} "
                              "(write '$$' for a literal '$').")
            i = j + 1
        else:
            m = IDENT.match(value, i + 1)
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
        names = " and ".join(quote_name(u) for u in unset)
        verb = "is" if len(unset) == 1 else "are"
        return None, (f"environment variable{'s' if len(unset) > 1 else ''} {names} {verb} not set "
                      f"(used in {quote_name(value)}).")
    return "".join(out), None


def is_remote(path: str) -> bool:
    return "://" in path  # gs://, s3://, hdfs://: not checked, not resolved


def resolve_path(path: str, base: str) -> str:
    if is_remote(path):
        return path
    path = os.path.expanduser(path)
    if not os.path.isabs(path):
        path = os.path.join(base, path)
    return os.path.normpath(path)
