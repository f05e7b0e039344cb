"""The error family of ckptmerge.

Every error ckptmerge raises on purpose derives from :class:`CkptMergeError`, with a builtin
co-base where one fits, so callers can catch ``FileNotFoundError`` or ``ValueError`` as they
already do. Errors carry their data as attributes (``e.path``, ``e.plan``, ``e.problems``) so
callers and tests need not parse messages. This module also holds the one "did you mean" helper.
"""

from __future__ import annotations

import difflib
from typing import Any, Dict, Iterable, List, Optional, Sequence

from .redact import redact
from .text import quote_name

__all__ = [
    "OptionError",
    "CkptMergeError",
    "CheckpointNotFoundError",
    "CheckpointFormatError",
    "UnsafeCheckpointError",
    "UnreadableTensorError",
    "RuleError",
    "TransformError",
    "PlanError",
    "CombineError",
    "ConfigError",
    "RestoreError",
    "ArgumentError",
    "ArgumentTypeError",
    "OutputExistsError",
    "CheckpointWriteError",
    "ResourceLimitError",
    "UnknownTensorError",
    "SettingError",
    "did_you_mean",
    "did_you_mean_text",
    "suggest",
    "format_list",
]


class CkptMergeError(Exception):
    """Base class of every error ckptmerge raises on purpose.

    The message is redacted when the error is made (:func:`ckptmerge.core.redact.redact`): a URL's
    userinfo and signed query values in it read ``***``, however the message was built.
    Attributes such as ``e.path`` keep the exact values.

    Example:
        >>> try:
        ...     raise CkptMergeError("boom at https://me:pw@host/m")
        ... except CkptMergeError as e:
        ...     str(e)
        'boom at https://***@host/m'
    """

    def __init__(self, *args: Any) -> None:
        super().__init__(*(redact(a) if isinstance(a, str) else a for a in args))


class CheckpointNotFoundError(CkptMergeError, FileNotFoundError):
    """A checkpoint path, step or file does not exist.

    Attributes:
        path: the path that was asked for (as given by the user).
    """

    def __init__(self, message: str, *, path: Optional[str] = None) -> None:
        super().__init__(message)
        self.path = path

    def __str__(self) -> str:  # FileNotFoundError would otherwise format errno/filename
        return str(self.args[0]) if self.args else ""


class CheckpointFormatError(CkptMergeError, ValueError):
    """A checkpoint file is corrupt, truncated, or in a format ckptmerge does not read.

    Attributes:
        path: the file in which the problem was found.
        key: the tensor key concerned, if any.
    """

    def __init__(self, message: str, *, path: Optional[str] = None, key: Optional[str] = None) -> None:
        super().__init__(message)
        self.path = path
        self.key = key


class UnsafeCheckpointError(CheckpointFormatError):
    """A checkpoint file would make ckptmerge read outside it, or more than the file holds.

    Raised before anything is read: for HDF5 external storage, virtual datasets, soft,
    external or user-defined links, filters loaded from plugins, and datasets that declare far
    more data than the file stores (never-written chunks, decompression bombs).

    Attributes:
        path: the file.
        key: the (first) dataset concerned.
        problems: every problem found, one line each, naming its dataset.

    Example:
        >>> e = UnsafeCheckpointError("refused", path="m.weights.h5", key="x", problems=["'x': external"])
        >>> isinstance(e, CheckpointFormatError), e.problems
        (True, ["'x': external"])
    """

    def __init__(self, message: str, *, path: Optional[str] = None, key: Optional[str] = None,
                 problems: Sequence[str] = ()) -> None:
        super().__init__(message, path=path, key=key)
        self.problems = list(problems)


class UnreadableTensorError(CheckpointFormatError):
    """A tensor the checkpoint lists has no values ckptmerge can read (e.g. an HDF5 compound,
    reference or null-dataspace dataset, listed with an ``hdf5-*`` dtype).

    Attributes:
        path: the file.
        key: the tensor's raw key.
    """


class RuleError(CkptMergeError, ValueError):
    """A rename/selection rule is invalid (bad regex, bad backreference, bad glob, bad map entry)."""


class TransformError(RuleError):
    """A value transform is invalid, or does not fit the tensor it is applied to.

    Attributes:
        target: the transform's target name or glob, if known.
        path: the vocabulary file concerned, if any.
        line: the 1-based line in ``path`` concerned, if any.

    Example:
        >>> isinstance(TransformError("bad axis"), ValueError)
        True
    """

    def __init__(self, message: str, *, target: Optional[str] = None, path: Optional[str] = None,
                 line: Optional[int] = None) -> None:
        super().__init__(message)
        self.target = target
        self.path = path
        self.line = line


class PlanError(CkptMergeError, ValueError):
    """A plan has findings that ``strict`` mode does not accept, or cannot be built.

    Also a ``ValueError``, as ``tf.compat.v1.train.init_from_checkpoint`` raises for missing
    names, shape mismatches and unmatched scopes, so code written for it keeps catching them.

    Attributes:
        plan: the :class:`ckptmerge.Plan` with every finding (may be ``None`` when the plan
            could not be built at all, e.g. duplicate target names).
    """

    def __init__(self, message: str, *, plan: Any = None) -> None:
        super().__init__(message)
        self.plan = plan


class CombineError(CkptMergeError, ValueError):
    """Checkpoints cannot be combined as asked: their names, shapes or dtypes differ under
    ``keys="strict"``, an integer tensor under ``integers="error"``, a bad per-tensor parameter.

    Attributes:
        differences: every problem found, one line each (the message lists them too).
    """

    def __init__(self, message: str, *, differences: Any = ()) -> None:
        super().__init__(message)
        self.differences = list(differences)


class ConfigError(CkptMergeError, ValueError):
    """A config file (or dict) is invalid.

    Attributes:
        path: the config file, if any.
        problems: every problem found, each a one-line string such as
            ``"warm.yaml:7 sources[1].regex[0]: unbalanced parenthesis in '^head/(.*'"``.
    """

    def __init__(self, message: str, *, path: Optional[str] = None, problems: Sequence[str] = ()) -> None:
        super().__init__(message)
        self.path = path
        self.problems = list(problems)


class RestoreError(CkptMergeError):
    """Reading or assigning failed during a restore; the targets were put back as they were.

    Attributes:
        path: the file that failed, if known.
        key: the tensor key that failed, if known.
    """

    def __init__(self, message: str, *, path: Optional[str] = None, key: Optional[str] = None) -> None:
        super().__init__(message)
        self.path = path
        self.key = key


class ArgumentError(CkptMergeError, ValueError):
    """An argument has a value ckptmerge cannot use (e.g. ``step=-1``), or is ambiguous.

    Example:
        >>> try:
        ...     from ckptmerge.sources.resolve import resolve_checkpoint
        ...     resolve_checkpoint("runs/A", step=-1)
        ... except ValueError as e:
        ...     print(type(e).__name__)
        ArgumentError
    """


class OptionError(CkptMergeError, ValueError):
    """An option has a value ckptmerge does not accept (the message lists the valid values).

    Example:
        >>> from ckptmerge.planning.planner import make_plan
        >>> try:
        ...     make_plan([], [], on_conflict="frist")
        ... except OptionError as e:
        ...     print(e)
        on_conflict must be one of 'error', 'first', 'last'; received 'frist'. Did you mean 'first'?
    """


class ArgumentTypeError(ArgumentError, TypeError):
    """An argument has the wrong type (e.g. ``step="10"`` or ``step=True``)."""


class OutputExistsError(CkptMergeError, FileExistsError):
    """The output checkpoint already exists and ``overwrite`` was not set.

    Attributes:
        path: the existing file.
    """

    def __init__(self, message: str, *, path: Optional[str] = None) -> None:
        super().__init__(message)
        self.path = path

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


class OutputLockedError(OutputExistsError):
    """Another merge to the same output in object storage is running (it holds the output's lock
    object, ``e.path``; see docs/remote.md, "Merging to object storage"), or the output's lock
    (a lock object, or a local ``.NAME.ckptmerge-lock`` file) holds what no merge writes, so it
    cannot be trusted: it is reported, never removed."""


class CheckpointWriteError(CkptMergeError, OSError):
    """Writing the checkpoint failed (disk full, permission denied, ...); nothing was left behind.

    Attributes:
        path: the file that could not be written.
        errno: the OS error number, if any.
    """

    def __init__(self, message: str, *, path: Optional[str] = None, errno_: Optional[int] = None) -> None:
        super().__init__(message)
        self.path = path
        self.errno = errno_

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


class ResourceLimitError(CkptMergeError):
    """A file could not be opened or read because this process or this machine ran out of open
    files or memory (``EMFILE``, ``ENFILE``, ``ENOMEM``): nothing is wrong with the file, and no
    reader takes it for a damaged one (see :mod:`ckptmerge.core.limits`). Deliberately not an
    ``OSError``: the code that treats an unreadable file as "not this format" or "damaged, skip
    it" never catches it.

    Attributes:
        path: the file being opened.
        errno: ``errno.EMFILE``, ``errno.ENFILE`` or ``errno.ENOMEM``.
    """

    def __init__(self, message: str, *, path: Optional[str] = None, errno_: Optional[int] = None) -> None:
        super().__init__(message)
        self.path = path
        self.errno = errno_


class SettingError(CkptMergeError, ValueError):
    """An environment setting (``CKPTMERGE_*``) holds a value ckptmerge cannot use; raised when
    the setting is used, never at import (see :mod:`ckptmerge.core.knobs`).

    Attributes:
        name: the environment variable.
        value: what it holds.
    """

    def __init__(self, message: str, *, name: Optional[str] = None, value: Optional[str] = None) -> None:
        super().__init__(message)
        self.name = name
        self.value = value


# --------------------------------------------------------------------------------------------
# the SSTable (.index) encoding


class UnknownTensorError(CkptMergeError, KeyError):
    """A tensor name is not in the checkpoint. Also a ``KeyError``, so ``dict``-style code works.

    Attributes:
        name: the name that was asked for.
        path: the checkpoint.
    """

    def __init__(self, message: str, *, name: Optional[str] = None, path: Optional[str] = None) -> None:
        super().__init__(message)
        self.name = name
        self.path = path

    def __str__(self) -> str:  # KeyError would otherwise show the repr of the message
        return str(self.args[0]) if self.args else ""


def suggest(name: str, candidates: Iterable[str], *, n: int = 3, cutoff: float = 0.8,
            leaf_cutoff: Optional[float] = None) -> List[str]:
    """Up to ``n`` candidates close to ``name``, best first (empty if none is close).

    Matching is on the whole name and, as a fallback, on the last path component (with
    ``leaf_cutoff``, default ``cutoff``), so that ``enc/kernal`` finds ``encoder/dense/kernel``
    when the scope differs too.

    Example:
        >>> suggest("dense/kernal", ["dense/kernel", "dense/bias"])
        ['dense/kernel']
    """
    cands = list(dict.fromkeys(candidates))
    close = difflib.get_close_matches(name, cands, n=n, cutoff=cutoff)
    if not close:
        leaf = name.rstrip("/").rsplit("/", 1)[-1]
        by_leaf: Dict[str, List[str]] = {}
        for c in cands:
            by_leaf.setdefault(c.rstrip("/").rsplit("/", 1)[-1], []).append(c)
        leaf_cut = cutoff if leaf_cutoff is None else leaf_cutoff
        for m in difflib.get_close_matches(leaf, list(by_leaf), n=1, cutoff=leaf_cut):
            close = difflib.get_close_matches(name, by_leaf[m], n=n, cutoff=0.0)
    return close


def did_you_mean_text(suggestions: Sequence[str]) -> str:
    """Render ``" Did you mean 'x'?"`` / ``" Did you mean 'x' or 'y'?"`` or ``""`` (names escaped).

    Example:
        >>> did_you_mean_text(["a", "b"])
        " Did you mean 'a' or 'b'?"
    """
    if not suggestions:
        return ""
    quoted = [quote_name(s) for s in suggestions]
    if len(quoted) == 1:
        return f" Did you mean {quoted[0]}?"
    return " Did you mean " + ", ".join(quoted[:-1]) + " or " + quoted[-1] + "?"


def did_you_mean(name: str, candidates: Iterable[str], *, n: int = 3, cutoff: float = 0.8) -> str:
    """Return ``" Did you mean 'x'?"`` (or ``" Did you mean 'x' or 'y'?"``) or ``""``.

    Example:
        >>> did_you_mean("dense/kernal", ["dense/kernel", "dense/bias"])
        " Did you mean 'dense/kernel'?"
    """
    return did_you_mean_text(suggest(name, candidates, n=n, cutoff=cutoff, leaf_cutoff=0.8))


def format_list(items: Sequence[str], *, limit: int = 5, more_hint: str = "") -> str:
    """Render the first ``limit`` items quoted (and escaped), then ``... and N more``.

    Example:
        >>> format_list(["a", "b", "c"], limit=2)
        "'a', 'b' ... and 1 more"
    """
    shown = ", ".join(quote_name(x) for x in items[:limit])
    rest = len(items) - limit
    if rest > 0:
        shown += f" ... and {rest} more"
        if more_hint:
            shown += f" ({more_hint})"
    return shown
