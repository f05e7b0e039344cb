"""Path operations on local paths and URLs alike: suffixes, base names, parents, comparisons.

A checkpoint's files are found by name arithmetic: ``<prefix>.index`` beside a prefix, the
``.data-*`` shards, the directory's ``checkpoint`` state file. On a URL that arithmetic belongs to
the URL's *path*: ``https://host/w/model.safetensors?download=true`` has the path
``https://host/w/model.safetensors`` and the tail ``?download=true``, so its index is
``https://host/w/model.safetensors.index?download=true``, never ``...?download=true.index``
(a server that ignores the query would serve the file itself as the "index"), and the shards an
index names beside it are ``https://host/w/<shard>?download=true``: every operation here works on
the path and carries the tail along (:func:`dirname`, :func:`join`, :func:`sibling`), except
:func:`basename`, which is a name. Only ``http`` and
``https`` have queries and fragments: in an object store (``s3://``, ``gs://``, ...) a ``?`` is
part of the object's key. The ``-?????-of-NNNNN`` of a sharded V1 checkpoint's pattern is a
name, not a query. Local paths are returned exactly as ``os.path`` would.

Example:
    >>> add_suffix("https://h/run/ckpt-1?download=true", ".index")
    'https://h/run/ckpt-1.index?download=true'
    >>> basename("https://h/run/model.safetensors?x=1"), sibling("https://h/run/model.safetensors?x=1", "a.bin")
    ('model.safetensors', 'https://h/run/a.bin?x=1')
"""

from __future__ import annotations

import os
import re
from typing import Optional, Tuple

__all__ = ["is_url", "split_tail", "path_part", "add_suffix", "has_suffix", "strip_suffix", "basename",
           "dirname", "join", "sibling", "strip_slash", "search_path", "is_plain_name", "canonical_url", "relative_to"]

_URL = re.compile(r"^([a-zA-Z][a-zA-Z0-9+.-]+)://")
#: The question marks of a V1 set's pattern (``m.ckpt-?????-of-00002``): part of the name.
_V1_MARKS = re.compile(r"-\?{5}-of-\d{5}")
_QUERY_SCHEMES = ("http", "https")
#: Schemes that name the same store (fsspec maps each pair to one filesystem).
_ALIASES = {"s3a": "s3", "gcs": "gs", "az": "abfs", "abfss": "abfs"}


def is_url(path: object) -> bool:
    """True for ``scheme://...`` paths (object storage and other fsspec filesystems).

    Example:
        >>> is_url("s3://bucket/run/ckpt-10"), is_url("runs/A")
        (True, False)
    """
    return isinstance(path, str) and _URL.match(path) is not None


def scheme_of(url: str) -> str:
    """The lower-case scheme of a URL (``""`` for a local path)."""
    m = _URL.match(url) if isinstance(url, str) else None
    return m.group(1).lower() if m else ""


def split_tail(path: str) -> Tuple[str, str]:
    """``(path, tail)``: an http(s) URL's query and fragment (``?...``, ``#...``) apart from the rest.

    Example:
        >>> split_tail("https://h/a/b?x=1#top")
        ('https://h/a/b', '?x=1#top')
        >>> split_tail("s3://b/odd?key")
        ('s3://b/odd?key', '')
    """
    if scheme_of(path) not in _QUERY_SCHEMES:
        return path, ""
    masked = _V1_MARKS.sub(lambda m: "-" * len(m.group(0)), path)
    cut = min((i for i in (masked.find("?"), masked.find("#")) if i >= 0), default=-1)
    return (path, "") if cut < 0 else (path[:cut], path[cut:])


def path_part(path: str) -> str:
    """The path without an http(s) query or fragment: what name tests (``.endswith``) look at."""
    return split_tail(path)[0]


def add_suffix(path: str, suffix: str) -> str:
    """``path + suffix``, the suffix going before an http(s) URL's query.

    Example:
        >>> add_suffix("runs/A/ckpt-1", ".index"), add_suffix("https://h/ckpt-1?t=1", ".index")
        ('runs/A/ckpt-1.index', 'https://h/ckpt-1.index?t=1')
    """
    head, tail = split_tail(path)
    return head + suffix + tail


def has_suffix(path: str, suffix: str) -> bool:
    """Whether the path part ends with ``suffix``."""
    return path_part(path).endswith(suffix)


def strip_suffix(path: str, suffix: str) -> str:
    """``path`` without ``suffix`` at the end of its path part (unchanged if it is not there)."""
    head, tail = split_tail(path)
    return head[: -len(suffix)] + tail if suffix and head.endswith(suffix) else path


def basename(path: str) -> str:
    """The last component of a URL's path or of a local path (``s3://b/run/ckpt-1`` -> ``ckpt-1``).

    Example:
        >>> basename("s3://b/run/ckpt-1"), basename("https://h/x/m.npz?dl=1")
        ('ckpt-1', 'm.npz')
    """
    return path_part(path).rstrip("/").rsplit("/", 1)[-1] if is_url(path) else os.path.basename(path)


def dirname(path: str) -> str:
    """The parent of a URL (an http(s) query kept: the files beside it are asked for with it) or
    of a local path.

    Example:
        >>> dirname("s3://b/run/ckpt-1"), dirname("https://h/run/m.npz?dl=1")
        ('s3://b/run', 'https://h/run?dl=1')
    """
    if is_url(path):
        head, tail = split_tail(path)
        parent = head.rstrip("/").rpartition("/")[0]
        return (parent if "://" in parent else head) + tail
    return os.path.dirname(path)


def join(base: str, name: str) -> str:
    """``base/name`` for URLs and local paths alike (an http(s) query of ``base`` kept at the end).

    Example:
        >>> join("s3://b/run", "checkpoint"), join("https://h/run?dl=1", "checkpoint")
        ('s3://b/run/checkpoint', 'https://h/run/checkpoint?dl=1')
    """
    if is_url(base):
        head, tail = split_tail(base)
        return head.rstrip("/") + "/" + name + tail
    return os.path.join(base, name)


def sibling(path: str, name: str) -> str:
    """The file ``name`` beside ``path`` (in its folder), with ``path``'s http(s) query: the shards
    of a safetensors index or of a Keras ``.weights.json``, the ``checkpoint`` state file beside a
    prefix.

    Example:
        >>> sibling("https://h/w/model.safetensors.index.json?download=true", "model-1.safetensors")
        'https://h/w/model-1.safetensors?download=true'
        >>> sibling("s3://b/run/ckpt-1", "checkpoint"), sibling("run/ckpt-1", "checkpoint")
        ('s3://b/run/checkpoint', 'run/checkpoint')
    """
    return join(dirname(path), name)


def is_plain_name(name: object, beside: str) -> bool:
    """Whether ``name`` (a shard an index names) is a plain file name in the folder of ``beside``:
    no folder, not ``.`` or ``..``; beside a URL also no ``%``, ``?``, ``#`` or ``\\``, which a
    server would decode or cut into another path (``..%2Fsecret``).

    Example:
        >>> is_plain_name("m-1.safetensors", "https://h/w/i.json"), is_plain_name("..%2Fx", "https://h/w/i.json")
        (True, False)
        >>> is_plain_name("a%b.safetensors", "run/i.json"), is_plain_name("../x", "run/i.json")
        (True, False)
    """
    if not isinstance(name, str) or not name or name in (".", "..") or "/" in name or "\x00" in name:
        return False
    return not (is_url(beside) and any(c in name for c in "%?#\\"))


def strip_slash(path: str) -> str:
    """``path`` without trailing slashes on its path part (``https://h/run/?t=1`` -> ``https://h/run?t=1``).

    Example:
        >>> strip_slash("https://h/run/?t=1"), strip_slash("s3://b/run/")
        ('https://h/run?t=1', 's3://b/run')
    """
    head, tail = split_tail(path)
    return head.rstrip("/") + tail


def search_path(pattern: "re.Pattern[str]", path: str) -> "Optional[re.Match[str]]":
    """``pattern.search`` on the path part (a ``$``-anchored name pattern still matches a URL with a query).

    Example:
        >>> bool(search_path(re.compile(r"\\.index$"), "https://h/ckpt-1.index?t=1"))
        True
    """
    return pattern.search(path_part(path))


def relative_to(path: str, directory: str) -> str:
    """``path`` relative to ``directory`` (a URL below a URL, or local paths); else ``path``.

    Example:
        >>> relative_to("s3://b/run/ckpt-1", "s3://b/run/")
        'ckpt-1'
    """
    if is_url(path) or is_url(directory):
        base, name = path_part(directory).rstrip("/") + "/", path_part(path)
        return name[len(base):] if is_url(path) and name.startswith(base) else path
    try:
        return os.path.relpath(path, os.path.abspath(directory))
    except ValueError:  # pragma: no cover - another drive on Windows
        return path


def canonical_url(url: str) -> str:
    """One spelling of a URL for comparisons: the scheme lower-cased and aliases folded
    (``s3a`` -> ``s3``, ``gcs`` -> ``gs``, ``az``/``abfss`` -> ``abfs``), repeated and trailing
    slashes dropped, the bucket (or http host) lower-cased, an http(s) default port dropped, and an
    http(s) query and fragment left out (many servers ignore them: ``m.safetensors?download=true``
    is ``m.safetensors``).

    Two URLs with one canonical form name the same object; different forms may still do (the
    store decides), so use it to refuse, never to allow.

    Example:
        >>> canonical_url("S3A://Bucket//run/ckpt-1/") == canonical_url("s3://bucket/run/ckpt-1")
        True
    """
    scheme = scheme_of(url)
    head = path_part(url)
    rest = head[len(scheme) + 3:]
    parts = [p for p in rest.split("/") if p]
    if parts:
        if scheme in _QUERY_SCHEMES:
            host = parts[0].lower()
            default = ":443" if scheme == "https" else ":80"
            parts[0] = host[: -len(default)] if host.endswith(default) else host
        elif scheme != "memory":  # a bucket or container: lower case in every store
            parts[0] = parts[0].lower()
    return f"{_ALIASES.get(scheme, scheme)}://{'/'.join(parts)}"
