"""Argument checks for the public API: one clear error per wrong type or value.

Every public function checks its arguments here before it touches a file, so a wrong call fails
with an :class:`~ckptmerge.core.errors.ArgumentTypeError` (also a ``TypeError``) or an
:class:`~ckptmerge.core.errors.ArgumentError` (also a ``ValueError``) that says what was expected and
echoes what was received (``Received: names=[1]``), never with a bare ``TypeError`` from deep
inside, or a silently wrong result (a string iterated as its characters).
"""

from __future__ import annotations

import operator
import os
import re
from typing import Any, Callable, Collection, List, Mapping, Optional, Sequence, Set

from .errors import ArgumentError, ArgumentTypeError, did_you_mean

_NAME, _DTYPE, _SHAPE = operator.attrgetter("name"), operator.attrgetter("dtype"), operator.attrgetter("shape")

__all__ = ["received", "check_path", "local_path", "check_step", "check_bool", "check_names", "check_callable",
           "check_str", "check_spec", "check_specs", "check_options"]


def received(what: str, value: Any) -> str:
    """``"Received: what=<repr>"``, the repr shortened to 80 characters (and escaped by repr).

    Example:
        >>> received("names", [1])
        'Received: names=[1]'
    """
    text = repr(value)
    if len(text) > 80:
        text = text[:77] + "..."
    return f"Received: {what}={text}"


def describe_value(value: Any) -> str:
    """A received value for an error message: its repr, shortened to 80 characters, and its type.

    Example:
        >>> describe_value([1])
        '[1] (type list)'
    """
    text = repr(value)
    if len(text) > 80:
        text = text[:77] + "..."
    return f"{text} (type {type(value).__name__})"


_FILE_URL = re.compile(r"^(?:file|local)://(?:localhost(?=/))?", re.IGNORECASE)


def local_path(path: str) -> str:
    """The local path a ``file://`` (or ``local://``) URL names; any other path as it is.

    A ``file://`` URL is a local path written another way: it gets the local rules (no
    symbolic link out of a folder, no FIFO or device, every size check) and the local fast path,
    not the object-storage one. As fsspec reads them, the rest of the URL is the path, not
    percent-decoded (``file:///data/run`` -> ``/data/run``); ``file://localhost/x`` is ``/x``.

    Example:
        >>> local_path("file:///data/run/ckpt-1"), local_path("s3://b/run"), local_path("runs/A")
        ('/data/run/ckpt-1', 's3://b/run', 'runs/A')
    """
    m = _FILE_URL.match(path)
    if m is None:
        return path
    return path[m.end():] or "."


def check_path(value: Any, what: str = "path") -> str:
    """A path argument (str, bytes or os.PathLike, not empty) as a str (a ``file://`` URL as
    the local path it names: :func:`local_path`).

    Raises:
        ArgumentTypeError: another type. ArgumentError: an empty path.

    Example:
        >>> check_path(3)
        Traceback (most recent call last):
        ckptmerge.core.errors.ArgumentTypeError: path must be a str or os.PathLike, got int. Received: path=3
    """
    if isinstance(value, bool) or not isinstance(value, (str, bytes, os.PathLike)):
        raise ArgumentTypeError(f"{what} must be a str or os.PathLike, got {type(value).__name__}. "
                                f"{received(what, value)}")
    p = os.fspath(value)
    if isinstance(p, bytes):
        p = os.fsdecode(p)
    if not p:
        raise ArgumentError(f"{what} is empty. {received(what, value)}")
    return local_path(p)


def check_step(value: Any, what: str = "step") -> Optional[int]:
    """A step: ``None`` or an int >= 0 (not a bool).

    Example:
        >>> check_step(10), check_step(None)
        (10, None)
    """
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise ArgumentTypeError(f"{what} must be an int >= 0 or None, got {type(value).__name__}. "
                                f"{received(what, value)}")
    if value < 0:
        raise ArgumentError(f"{what} must be >= 0. {received(what, value)}")
    return int(value)


def check_bool(value: Any, what: str, *, optional: bool = False) -> Optional[bool]:
    """A flag: ``True`` or ``False`` (or ``None`` when ``optional``); ``0``, ``"yes"`` are refused,
    since a string like ``"false"`` would read as true.

    Example:
        >>> check_bool("false", "strict")
        Traceback (most recent call last):
        ckptmerge.core.errors.ArgumentTypeError: strict must be True or False, got str. Received: strict='false'
    """
    return _check_type(value, what, bool, "True, False or None" if optional else "True or False", optional)


def _check_type(value: Any, what: str, kind: type, expected: str, optional: bool) -> Any:
    if value is None and optional:
        return None
    if not isinstance(value, kind):
        raise ArgumentTypeError(f"{what} must be {expected}, got {type(value).__name__}. {received(what, value)}")
    return value


def check_names(value: Any, what: str = "names", *, noun: str = "name") -> Optional[List[str]]:
    """Tensor names (or globs, ``noun="glob"``): ``None``, one name (a str: one name, not its
    characters) or an iterable of str; returns a list (or ``None``).

    Example:
        >>> check_names("a1"), check_names(("a1", "a2"))
        (['a1'], ['a1', 'a2'])
    """
    if value is None:
        return None
    if isinstance(value, str):
        return [value]
    if isinstance(value, (bytes, Mapping)) or not hasattr(value, "__iter__"):
        raise ArgumentTypeError(f"{what} must be a {noun} (str) or a list of {noun}s, got "
                                f"{type(value).__name__}. {received(what, value)}")
    names = list(value)
    bad = [i for i, n in enumerate(names) if not isinstance(n, str)]
    if bad:
        i = bad[0]
        raise ArgumentTypeError(f"{what} must be a {noun} (str) or a list of {noun}s; {what}[{i}] is "
                                f"{names[i]!r:.60} ({type(names[i]).__name__}). {received(what, value)}")
    return names


def check_callable(value: Any, what: str) -> Optional[Callable[..., Any]]:
    """``None`` or a callable (e.g. a ``progress(done, total)`` callback)."""
    if value is not None and not callable(value):
        raise ArgumentTypeError(f"{what} must be a callable or None, got {type(value).__name__}. "
                                f"{received(what, value)}")
    return value


def check_str(value: Any, what: str, *, optional: bool = False) -> Optional[str]:
    """A str (or ``None`` when ``optional``)."""
    return _check_type(value, what, str, "a str or None" if optional else "a str", optional)


def check_spec(info: Any, where: str) -> None:
    """A user-made :class:`~ckptmerge.VariableInfo`: name and dtype str, shape a tuple of ints."""
    shape_ok = isinstance(info.shape, tuple) and all(isinstance(d, int) and not isinstance(d, bool) and d >= 0
                                                     for d in info.shape)
    if not (isinstance(info.name, str) and isinstance(info.dtype, str) and shape_ok):
        raise ArgumentTypeError(f"{where} must have a str name, a tuple of ints >= 0 as shape and a str dtype "
                                f"such as 'float32'. {received(where, info)}")


def check_specs(infos: Sequence[Any], what: str) -> None:
    """:func:`check_spec` of every ``infos[i]`` (as ``what[i]``), quickly for the usual specs:
    exact ``str`` names and dtypes, and shapes checked once per distinct shape object (readers
    share one tuple per shape), so 100,000 specs cost one pass.

    Example:
        >>> from ckptmerge.core.specs import VariableInfo
        >>> check_specs([VariableInfo("x", (2,), "float32")], "target")
    """
    if set(map(type, map(_NAME, infos))) <= {str} and set(map(type, map(_DTYPE, infos))) <= {str}:
        shapes = dict(zip(map(id, map(_SHAPE, infos)), map(_SHAPE, infos)))  # the distinct shape objects
        if all(isinstance(s, tuple) and all(type(d) is int and d >= 0 for d in s) for s in shapes.values()):
            return  # (in passes at C speed; the loop below finds the first bad one)
    good_shapes: Set[int] = set()
    for i, info in enumerate(infos):
        shape = info.shape
        if type(info.name) is str and type(info.dtype) is str and id(shape) in good_shapes:
            continue
        check_spec(info, f"{what}[{i}]")
        good_shapes.add(id(shape))  # alive as long as infos: the id cannot be reused meanwhile


def check_options(options: Mapping[str, Any], allowed: Collection[str], where: str) -> None:
    """Refuse keyword options ``where`` does not take, with a "did you mean".

    Example:
        >>> check_options({"allow_mising": ["x"]}, ["allow_missing", "cast"], "restore()")
        Traceback (most recent call last):
        ckptmerge.core.errors.ArgumentTypeError: restore() got an unknown option 'allow_mising'. Did you mean 'allow_missing'? It takes: allow_missing, cast.
    """
    for key in options:
        if key not in allowed:
            raise ArgumentTypeError(f"{where} got an unknown option {key!r}.{did_you_mean(key, allowed)} "
                                    f"It takes: {', '.join(sorted(allowed))}.")
