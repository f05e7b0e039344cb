"""Environment variables and paths in a config: ``$VAR`` / ``${VAR}`` expansion and resolution.

``$$`` is a literal ``$``; :func:`_escape` is the inverse used when a config is written back.
Remote URLs (``gs://``, ``s3://``) are neither checked nor resolved.
"""

from __future__ import annotations

import os
from typing import List, Mapping, Optional, Tuple

from .config_problems import _IDENT, _q


def _escape(path: str) -> str:
    """Undo env expansion for a round trip: a literal ``$`` is written ``$$``."""
    return path.replace("$", "$$")


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
