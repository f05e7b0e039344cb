"""Credentials out of everything ckptmerge shows or writes: the one redaction function.

A URL can carry secrets: userinfo (``https://user:password@host/...``, ``s3://KEY:SECRET@bucket``)
and signed query or fragment values (S3 presigned URLs' ``X-Amz-Signature``/``X-Amz-Credential``/
``X-Amz-Security-Token``, GCS signed URLs' ``X-Goog-Signature``/``X-Goog-Credential`` and V2
``GoogleAccessId``/``Signature``, Azure SAS ``sig``, CloudFront ``Policy``/``Key-Pair-Id``, and any
``token``, ``key``, ``secret``, ``password``, ``auth``... parameter). :func:`redact` replaces each of
those values with ``***`` wherever it appears in a text, and leaves everything else as it is: the
scheme, host, path and the other parameters still say which object was meant.

It sits at the bottom so every layer uses the same function: :func:`ckptmerge.core.text.escape_name`
(every name and path in text output and error messages) calls it, :class:`ckptmerge.core.errors.CkptMergeError`
redacts its message when it is made (so ``str(e)`` never holds a secret, however the message was
built), JSON output and merge metadata redact their paths and labels, and the package's loggers
(:func:`get_logger`) redact each record, its formatted arguments and traceback included, before
any handler sees it. Data kept for the caller (``Source.path``, ``e.path``) is not redacted: it is
what the program needs to open the file.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import numbers
import os
import re
from typing import Any, Dict, Mapping, Optional

__all__ = ["redact", "redact_cached", "redact_optional", "redacted_repr", "is_secret_parameter", "mask_value",
           "show_path_as", "get_logger",
           "RedactingFilter", "MASK", "MIN_MASKED"]

#: What a secret is replaced with.
MASK = "***"

# scheme://userinfo@ : userinfo holds no '/', '?', '#' or '@' (RFC 3986; a raw one would end it)
_USERINFO = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*://)([^/?#@\s]+)@")
# ?name=value, &name=value, ;name=value, #name=value: the value ends at the next separator,
# whitespace or a quote (messages quote paths)
_PARAMETER = re.compile(r"([?&;#])([^=&;#?\s'\"]{1,100})=([^&;#\s'\"]*)")
#: parameter names (lowercase, split at '-', '_', '.' and case changes) any word of which is secret
_SECRET_WORDS = frozenset({
    "sig", "signature", "token", "secret", "password", "passwd", "pwd", "pass", "passphrase", "key",
    "apikey", "credential", "credentials", "auth", "authorization", "policy", "session", "jwt", "bearer",
    "sas", "cookie", "private", "code",
})
#: whole names that hold a secret without a secret word in them
_SECRET_NAMES = frozenset({"googleaccessid", "accesskeyid", "awsaccesskeyid", "sessionid", "apikey", "accesskey",
                           "secretkey", "privatekey", "clientsecret", "accesstoken", "idtoken", "refreshtoken",
                           "sastoken", "sv_sig"})
_WORD = re.compile(r"[A-Z]+(?![a-z])|[A-Z]?[a-z]+|\d+")


def is_secret_parameter(name: str) -> bool:
    """Whether a query parameter of this name holds a secret (case-insensitive).

    Example:
        >>> [is_secret_parameter(n) for n in ("X-Amz-Signature", "sig", "AWSAccessKeyId", "download", "X-Amz-Date")]
        [True, True, True, False, False]
    """
    flat = re.sub(r"[-_.]", "", name).lower()
    if flat in _SECRET_NAMES:
        return True
    words = [w.lower() for part in re.split(r"[-_.]+", name) for w in _WORD.findall(part)]
    return any(w in _SECRET_WORDS for w in words)


def _parameter(m: "re.Match[str]") -> str:
    sep, name, value = m.groups()
    if not value or value == MASK or not is_secret_parameter(name):
        return m.group(0)
    return f"{sep}{name}={MASK}"


#: ``{value: shown}``: values of environment variables the user allowed into URLs, shown as the
#: variable (``${HF_TOKEN}``) wherever a text holding a URL holds them (see :func:`mask_value`).
_MASKED: Dict[str, str] = {}
#: Shorter values are not masked (they would mangle every text, and hide nothing).
MIN_MASKED = 4


def mask_value(value: str, shown: str) -> None:
    """From now on, show ``value`` as ``shown`` in every redacted text that holds a URL.

    A config expands an allowed environment variable into a URL (``https://host/${TOKEN}/m``):
    the URL as sent holds its value, and messages show it as written instead.

    Example:
        >>> mask_value("tok-12345", "${HF_TOKEN}")
        >>> redact("cannot read https://host/tok-12345/model")
        'cannot read https://host/${HF_TOKEN}/model'
    """
    if len(value) >= MIN_MASKED and value != shown:
        _MASKED[value] = shown
        redact_cached.cache_clear()


#: ``{expanded folder: as written}``: local paths a config built from the environment or ``~``,
#: shown as written in every redacted text (see :func:`show_path_as`).
_WRITTEN: Dict[str, str] = {}
_WRITTEN_RE: Optional["re.Pattern[str]"] = None
#: A path character: a registered folder matches only where no such character touches it.
_PATH_CHAR = r"[\w.~+@%-]"


def show_path_as(expanded: str, written: str) -> None:
    """From now on, show the local folder ``expanded`` as ``written`` in every redacted text.

    A config's ``path: ${DATA}/ckpt`` (or ``~/ckpt``) becomes ``/data/ckpt`` before anything is
    read; an error found later (a damaged file, a missing shard, a lock) names the path the
    reader opened. Registering the folder that the environment put there makes every message,
    report and log line name it as the config wrote it (``${DATA}/ckpt.index``), and never show
    the variable's value. Only whole path components match (``/data`` is not touched in
    ``/database``); folders shorter than :data:`MIN_MASKED` characters are not registered.

    Example:
        >>> show_path_as("/mnt/runs-7", "${DATA}")
        >>> redact("Checkpoint data file /mnt/runs-7/ckpt.data-00000-of-00001 is truncated; /mnt/runs-70 is not")
        'Checkpoint data file ${DATA}/ckpt.data-00000-of-00001 is truncated; /mnt/runs-70 is not'
    """
    global _WRITTEN_RE
    expanded = expanded.rstrip("/") or expanded
    if len(expanded) < MIN_MASKED or expanded == written or _WRITTEN.get(expanded) == written:
        return
    _WRITTEN[expanded] = written
    alternatives = "|".join(re.escape(e) for e in sorted(_WRITTEN, key=len, reverse=True))
    _WRITTEN_RE = re.compile(f"(?<!{_PATH_CHAR})(?<!/)(?:{alternatives})(?!{_PATH_CHAR})")
    redact_cached.cache_clear()


def redact(text: Any) -> str:
    """``text`` with the credentials of every URL in it replaced by ``***``.

    Userinfo becomes ``***@``; the value of a secret query or fragment parameter becomes ``***``;
    a value registered with :func:`mask_value` becomes its variable. Idempotent, and the
    identity for text holding no URL credentials (checked at C speed first).

    Example:
        >>> redact("https://me:hunter2@host/m.safetensors?X-Amz-Signature=abc&download=1")
        'https://***@host/m.safetensors?X-Amz-Signature=***&download=1'
        >>> redact("Checkpoint 'az://c/m?sv=2022&sig=k%2Fz' does not exist")
        "Checkpoint 'az://c/m?sv=2022&sig=***' does not exist"
    """
    text = str(text)
    if _WRITTEN_RE is not None:
        text = _WRITTEN_RE.sub(lambda m: _WRITTEN[m.group(0)], text)
    if _MASKED and "://" in text:
        for value in sorted(_MASKED, key=len, reverse=True):  # (a longer value may hold a shorter one)
            if value in text:
                text = text.replace(value, _MASKED[value])
    if "@" in text and "://" in text:
        text = _USERINFO.sub(lambda m: m.group(1) + MASK + "@", text)
    if "=" in text:
        text = _PARAMETER.sub(_parameter, text)
    return text


#: :func:`redact` with a cache, for the few texts asked for again and again (a source's label).
redact_cached = functools.lru_cache(maxsize=1024)(redact)


def redact_optional(text: Optional[str]) -> Optional[str]:
    """:func:`redact`, with ``None`` kept as ``None`` (for optional fields of JSON records)."""
    return None if text is None else redact(text)


def redacted_repr(obj: Any) -> str:
    """A dataclass's usual repr (each field with ``repr=True``), credentials redacted: set as
    ``__repr__ = redacted_repr`` on the result types that hold paths (plans, reports, configs),
    so a REPL, a notebook or a log line that shows one shows no secret.

    Example:
        >>> @dataclasses.dataclass
        ... class Where:
        ...     path: str
        ...     __repr__ = redacted_repr
        >>> Where("s3://KEY:SECRET@bucket/m")
        Where(path='s3://***@bucket/m')
    """
    fields = ", ".join(f"{f.name}={getattr(obj, f.name)!r}" for f in dataclasses.fields(obj) if f.repr)
    return redact(f"{type(obj).__qualname__}({fields})")


class _Shown:
    """A log argument that is neither text nor a number (an exception, an object), shown redacted
    by ``%s`` and ``%r`` alike."""

    __slots__ = ("value",)

    def __init__(self, value: Any) -> None:
        self.value = value

    def __str__(self) -> str:
        return redact(str(self.value))

    def __repr__(self) -> str:
        return redact(repr(self.value))


def _argument(arg: Any) -> Any:
    if arg is None or isinstance(arg, numbers.Number):
        return arg  # (%d, %f and friends still get their number)
    if isinstance(arg, (str, os.PathLike)):
        return redact(os.fspath(arg))
    return _Shown(arg)


class RedactingFilter(logging.Filter):
    """Redacts a log record in place: its message (however it was built: an f-string holding a
    URL is as safe as a ``%s`` argument), each argument, and its traceback. Arguments stay
    arguments, so a handler can still escape them one by one."""

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.msg, str):
            record.msg = redact(record.msg)
        if isinstance(record.args, tuple):
            record.args = tuple(map(_argument, record.args))
        elif isinstance(record.args, Mapping):
            record.args = {k: _argument(v) for k, v in record.args.items()}
        if record.exc_info and not record.exc_text:
            record.exc_text = redact(logging.Formatter().formatException(record.exc_info))
        return True


_FILTER = RedactingFilter()


def get_logger(name: str) -> logging.Logger:
    """``logging.getLogger(name)`` with :class:`RedactingFilter` attached (once): what the
    package's modules log never holds a credential, whatever handler the application uses.

    Example:
        >>> get_logger("ckptmerge.example").filters[0].__class__.__name__
        'RedactingFilter'
    """
    logger = logging.getLogger(name)
    if _FILTER not in logger.filters:
        logger.addFilter(_FILTER)
    return logger
