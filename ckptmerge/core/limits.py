"""Running out of open files or memory is said as such, never as a damaged file.

A command over hundreds of inputs holds one or more descriptors per input; under a low
``ulimit -n`` the next ``open`` fails with ``EMFILE``. The readers turn an ``OSError`` on open into
"the file is corrupt, truncated, re-copy it", and the format sniffers into "not this format":
both wrong here, and both send the user after a file that is fine (issue 30.8). So every place
that opens a file passes the ``OSError`` through :func:`check` (or opens inside
:func:`checked`) first: one of ``EMFILE``, ``ENFILE`` or ``ENOMEM`` becomes a
:class:`~ckptmerge.core.errors.ResourceLimitError` that says what ran out and what to do; any
other error goes on as it was.

Example:
    >>> import errno
    >>> e = resource_error(OSError(errno.EMFILE, "Too many open files"), "runs/A/model.safetensors")
    >>> print(str(e).split(". ")[0])
    Cannot open 'runs/A/model.safetensors': this process has too many files open
    >>> resource_error(FileNotFoundError(errno.ENOENT, "No such file"), "x") is None
    True
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
from typing import Any, Iterator, Optional

try:  # (imported now: when the descriptors have run out, an import cannot open its file)
    import resource
except ImportError:  # pragma: no cover - Windows
    resource = None  # type: ignore[assignment]

from .errors import CkptMergeError, ResourceLimitError
from .text import quote_name

__all__ = ["resource_errno", "resource_error", "check", "checked", "open_files_limit"]

#: h5py and TensorStore put the OS error in their message, not in ``errno``
_ERRNO_IN_TEXT = re.compile(r"errno\s*=\s*(\d+)|\[Errno (\d+)\]")
_TEXTS = {"too many open files in system": errno.ENFILE, "too many open files": errno.EMFILE,
          "cannot allocate memory": errno.ENOMEM}
_ERRNOS = (errno.EMFILE, errno.ENFILE, errno.ENOMEM)


def resource_errno(e: BaseException) -> Optional[int]:
    """``EMFILE``, ``ENFILE`` or ``ENOMEM`` when the error ``e`` says one of them, else ``None``.

    Example:
        >>> import errno
        >>> resource_errno(OSError("Unable to open file (errno = 24, error message = 'Too many open files')"))
        24
    """
    if isinstance(e, ResourceLimitError):
        return e.errno
    if isinstance(e, CkptMergeError):  # ours: its text may quote names from a file
        return None
    code = getattr(e, "errno", None)
    if code in _ERRNOS:
        return code
    if code is not None and isinstance(e, OSError) and e.strerror:
        return None  # an OSError of another errno
    text = str(e)
    for m in _ERRNO_IN_TEXT.finditer(text):
        n = int(m.group(1) or m.group(2))
        if n in _ERRNOS:
            return n
    low = text.lower()
    for words, n in _TEXTS.items():
        if words in low:
            return n
    return None


def open_files_limit() -> Optional[int]:
    """The soft limit of open files of this process (``ulimit -n``), when the OS tells it."""
    if resource is None:  # pragma: no cover - Windows
        return None
    soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    return None if soft == resource.RLIM_INFINITY else int(soft)


def resource_error(e: BaseException, path: Any, *, doing: str = "open") -> Optional[ResourceLimitError]:
    """The :class:`~ckptmerge.core.errors.ResourceLimitError` for ``e`` (an error met while
    ``doing`` ``path``: "open", "read", "write"), or ``None`` when ``e`` is about something else."""
    if isinstance(e, ResourceLimitError):
        return e
    code = resource_errno(e)
    if code is None:
        return None
    shown = quote_name(os.fspath(path)) if isinstance(path, (str, os.PathLike)) else repr(path)
    if code == errno.EMFILE:
        limit = open_files_limit()
        where = f" (its limit is {limit:,} open files)" if limit else ""
        raise_to = max(4096, 2 * limit) if limit else 4096
        what = (f"this process has too many files open{where}; nothing is wrong with the file. A command "
                "holds one or more files open for each of its inputs. Raise the limit in the shell that runs "
                f"it ('ulimit -n {raise_to}', up to what 'ulimit -Hn' allows), or give fewer inputs at once")
    elif code == errno.ENFILE:
        what = ("this machine's table of open files is full (every process's files together); nothing is "
                "wrong with the file. Close other programs' files, give fewer inputs at once, or raise the "
                "system limit (fs.file-max on Linux)")
    else:
        what = ("the machine is out of memory; nothing is wrong with the file. Free memory, or give "
                "fewer inputs at once")
    return ResourceLimitError(f"Cannot {doing} {shown}: {what}.", path=os.fspath(path)
                              if isinstance(path, (str, os.PathLike)) else None, errno_=code)


def check(e: BaseException, path: Any, *, doing: str = "open") -> None:
    """Raise the :class:`~ckptmerge.core.errors.ResourceLimitError` for ``e`` if it is one (else
    return, and the caller handles ``e`` as before). Call it first in an ``except OSError``."""
    err = resource_error(e, path, doing=doing)
    if err is not None:
        raise err from None


@contextlib.contextmanager
def checked(path: Any, *, doing: str = "open") -> Iterator[None]:
    """Run the block; an error in it that says the process ran out of files or memory becomes a
    :class:`~ckptmerge.core.errors.ResourceLimitError` (any other is raised as it was).

    Example:
        >>> import errno
        >>> try:
        ...     with checked("model.h5"):
        ...         raise OSError(errno.ENFILE, "Too many open files in system")
        ... except ResourceLimitError as e:
        ...     print(e.errno == errno.ENFILE)
        True
    """
    try:
        yield
    except ResourceLimitError:
        raise
    except (OSError, RuntimeError, ValueError) as e:  # (h5py and TensorStore say it in their own errors)
        check(e, path, doing=doing)
        raise
