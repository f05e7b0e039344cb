"""How long remote requests may take, and what a failed one means, for every store alike.

**Timeouts.** Every filesystem is opened with a per-request timeout, ``CKPTMERGE_REMOTE_TIMEOUT``
seconds (default 60): how long a request may wait to connect, or for the server's next bytes, so a
stalled server fails the request instead of hanging it (a large transfer that keeps flowing is
never cut). It goes into each library's own options: ``s3fs`` (botocore's ``connect_timeout`` and
``read_timeout``), ``gcsfs`` (``requests_timeout``), ``adlfs`` (``connection_timeout`` and
``read_timeout``) and ``http(s)://`` (aiohttp's ``sock_connect`` and ``sock_read``), merged under
the options a user set in fsspec's own configuration (those win). On top of that, one read (a
lookup, an index, one piece of a tensor) may take ``CKPTMERGE_REMOTE_DEADLINE`` seconds in all,
its retries and the library's own retries included (default 300): past it, the read is cancelled
and not tried again, so a stalled store costs minutes, not the hours that retries of retries
could add up to. ckptmerge's own attempts (``CKPTMERGE_REMOTE_RETRIES``) are the only retries
where a library lets them be turned off: botocore's (``retries={"total_max_attempts": 1}``) and
s3fs's (:func:`single_attempt`), so a stalled request costs one timeout per attempt (four
attempts of 0.5 s and their backoff: about 3 s), not botocore's five attempts inside each of
s3fs's five inside each of ckptmerge's (minutes, up to the deadline). gcsfs and the Azure SDK
keep their own retries (they offer no switch); the deadline bounds them.

**Failures.** :func:`describe` names what went wrong in words a user can act on: "timed out", or
the HTTP status a server answered with (``HTTP 503 Service Unavailable``), whichever library
raised it (aiohttp, botocore, gcsfs, the Azure SDK) and however deeply it is wrapped (fsspec's
http filesystem turns every failed lookup into ``FileNotFoundError``, keeping the real cause).
:func:`is_transient` says whether another attempt may help (timeouts, throttling, 5xx).

Example:
    >>> http_status(FileNotFoundError("x")) is None
    True
"""

from __future__ import annotations

import asyncio
import socket
from http import HTTPStatus
from typing import Any, Dict, Iterator, Mapping, Optional

from ckptmerge.core.knobs import FloatSetting

__all__ = ["timeout_seconds", "deadline_seconds", "storage_options", "single_attempt", "http_status", "is_timeout",
           "is_transient", "describe", "TIMEOUT", "DEADLINE", "TIMEOUT_VAR", "DEADLINE_VAR"]

#: Seconds a request may wait to connect or for the server's next bytes.
TIMEOUT = FloatSetting("CKPTMERGE_REMOTE_TIMEOUT", 60.0, 0.001, 7 * 86400.0,
                       "the seconds a remote request may wait to connect or for its next bytes")
#: Seconds one remote read may take in all, its retries included.
DEADLINE = FloatSetting("CKPTMERGE_REMOTE_DEADLINE", 300.0, 0.001, 7 * 86400.0,
                        "the seconds one remote read may take in all, retries included")
TIMEOUT_VAR = TIMEOUT.name
DEADLINE_VAR = DEADLINE.name
#: Statuses worth another attempt: request timeout, throttling, and the server-side errors.
_TRANSIENT_STATUSES = {408, 425, 429, 500, 502, 503, 504}
#: Filesystem packages whose own retry loop :func:`single_attempt` turns off (an attribute read per call).
_OWN_RETRIES = ("s3fs",)


def timeout_seconds() -> float:
    """``CKPTMERGE_REMOTE_TIMEOUT``: seconds a request may wait to connect or for its next bytes.

    Raises:
        SettingError: the variable is not a number of seconds in range.
    """
    return TIMEOUT.get()


def deadline_seconds() -> float:
    """``CKPTMERGE_REMOTE_DEADLINE``: seconds one remote read may take in all, retries included."""
    return DEADLINE.get()


def _client_timeout(seconds: float) -> Any:
    """aiohttp's timeout for a request that may last (no total), but not stall."""
    import aiohttp

    return aiohttp.ClientTimeout(total=None, sock_connect=seconds, sock_read=seconds)


def _own_options(scheme: str, seconds: float) -> Dict[str, Any]:
    if scheme in ("s3", "s3a"):
        return {"config_kwargs": {"connect_timeout": seconds, "read_timeout": seconds,
                                  "retries": {"total_max_attempts": 1}}}
    if scheme in ("gs", "gcs"):
        return {"requests_timeout": _client_timeout(seconds)}
    if scheme in ("az", "abfs", "abfss", "adl"):
        return {"connection_timeout": seconds, "read_timeout": seconds}
    if scheme in ("http", "https"):
        return {"client_kwargs": {"timeout": _client_timeout(seconds)}}
    return {}


def storage_options(scheme: str, configured: Optional[Mapping[str, Any]] = None) -> Dict[str, Any]:
    """The options ckptmerge opens a ``scheme://`` filesystem with: its timeouts, under what fsspec's
    configuration (``configured``, default ``fsspec.config.conf[scheme]``) already sets, which wins
    key by key (a user's ``client_kwargs`` keep their other entries and add ours).

    Example:
        >>> storage_options("s3", {})["config_kwargs"]["read_timeout"]
        60.0
        >>> storage_options("s3", {"config_kwargs": {"read_timeout": 5}})["config_kwargs"]
        {'connect_timeout': 60.0, 'read_timeout': 5, 'retries': {'total_max_attempts': 1}}
        >>> storage_options("memory", {})
        {}
    """
    ours = _own_options(scheme, timeout_seconds())
    if not ours:
        return {}
    if configured is None:
        import fsspec.config

        configured = fsspec.config.conf.get(scheme, {})
    out: Dict[str, Any] = {}
    for key, value in ours.items():
        theirs = configured.get(key)
        if isinstance(value, dict):
            out[key] = {**value, **(theirs if isinstance(theirs, Mapping) else {})}
        elif theirs is None:
            out[key] = value
    return out


def single_attempt(fs: Any) -> None:
    """Turn off a filesystem's own retry loop where it has a switch (s3fs's ``retries``, read at
    each call), so each of ckptmerge's attempts is one request, bounded by the timeout. A value
    a user configured (fsspec's ``retries`` option, which the filesystem keeps) stands.

    Example:
        >>> import s3fs                                    # doctest: +SKIP
        >>> fs = s3fs.S3FileSystem(anon=True); single_attempt(fs); fs.retries  # doctest: +SKIP
        1
    """
    if type(fs).__module__.split(".")[0] in _OWN_RETRIES and isinstance(getattr(type(fs), "retries", None), int) \
            and "retries" not in (getattr(fs, "storage_options", None) or {}):
        fs.retries = 1


def _chain(e: BaseException) -> Iterator[BaseException]:
    """``e`` and the exceptions it was raised from or during, innermost last (each once)."""
    seen = set()
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        yield e
        e = e.__cause__ or e.__context__


def _status_of(e: BaseException) -> Optional[int]:
    for attr in ("status", "status_code", "code"):  # aiohttp; the Azure SDK; gcsfs's HttpError
        value = getattr(e, attr, None)
        if isinstance(value, int) and not isinstance(value, bool) and 100 <= value <= 599:
            return value
    response = getattr(e, "response", None)  # botocore's ClientError
    if isinstance(response, Mapping):
        value = response.get("ResponseMetadata", {}).get("HTTPStatusCode")
        if isinstance(value, int) and 100 <= value <= 599:
            return value
    return None


def http_status(e: BaseException) -> Optional[int]:
    """The HTTP status a server answered with, if ``e`` (or what it wraps) says.

    Example:
        >>> import aiohttp
        >>> err = aiohttp.ClientResponseError(None, (), status=503, message="Service Unavailable")
        >>> try:
        ...     raise FileNotFoundError("https://h/x") from err
        ... except FileNotFoundError as e:
        ...     http_status(e)
        503
    """
    for inner in _chain(e):
        status = _status_of(inner)
        if status is not None:
            return status
    return None


def is_timeout(e: BaseException) -> bool:
    """Whether ``e`` (or what it wraps) is a timeout: no connection, or no bytes, in time."""
    for inner in _chain(e):
        if isinstance(inner, (TimeoutError, asyncio.TimeoutError, socket.timeout)) or \
                "timeout" in type(inner).__name__.lower():
            return True
    return False


def is_transient(e: BaseException) -> Optional[bool]:
    """True for failures another attempt may cure (a timeout, throttling, 5xx), False for an
    HTTP status that will not change (403, 404, 416, ...), None when neither is known."""
    if is_timeout(e):
        return True
    status = http_status(e)
    if status is None:
        return None
    return status in _TRANSIENT_STATUSES


def status_text(status: int) -> str:
    """``HTTP 503 Service Unavailable``."""
    try:
        return f"HTTP {status} {HTTPStatus(status).phrase}"
    except ValueError:
        return f"HTTP {status}"


def describe(status: Optional[int]) -> str:
    """What an HTTP status means for the user, and what to do about it."""
    if status is None:
        return ""
    text = status_text(status)
    if status in (401, 403):
        return (f"the server refused access ({text}). Check the credentials your storage library uses "
                "(ckptmerge passes none), or that the URL is public.")
    if status in (404, 410):
        return f"there is no such object ({text})."
    if status == 416:
        return (f"the server refused the byte range ({text}): the object is shorter than its checkpoint says, or "
                "it changed while it was read. Re-upload it.")
    if status == 429 or status >= 500:
        return f"the server failed to answer ({text}). Try again later."
    if 300 <= status < 400:
        return f"the server answered with a redirect ckptmerge could not follow ({text}). Use the final URL."
    return f"the server refused the request ({text}). Check the URL."
