"""The ``checkpoint`` state file of a training directory, parsed without TensorFlow.

TensorFlow writes a text-format ``CheckpointState`` proto naming the latest checkpoint and the
kept ones; :func:`read_state_file` parses its few fields (C escapes, adjacent literals and all)
into a :class:`CheckpointState` whose paths are resolved as TensorFlow resolves them.
"""

from __future__ import annotations

import functools
import os
import re
import time
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Tuple

from ..core import limits
from ..core.args import check_path
from ..core.errors import CheckpointFormatError
from ..core.redact import get_logger
from ..formats.io.localfile import link_problem
from ..core.text import quote_name
from .files import (
    STATE_FILE,
    PathArg,
    display_path,
    not_found_error,
    prefix_exists,
    same_checkpoint_path,
)

logger = get_logger(__name__)


@dataclass(frozen=True)
class CheckpointState:
    """The content of a directory's ``checkpoint`` state file (TF's ``CheckpointState``).

    Paths are resolved as TensorFlow resolves them (relative ones against the directory), with
    one rule TensorFlow does not have: a state file names checkpoints **inside** its directory
    (links resolved). A path outside it (``../elsewhere/ckpt-99``, an absolute path, a link out)
    is replaced by the same base name inside the directory when that exists (a run copied or
    moved from elsewhere), and is otherwise not used: it is left out of the resolved fields and
    listed in ``outside``. The ``recorded_*`` fields keep the strings as written.

    Attributes:
        path: absolute path of the state file.
        directory: absolute path of the directory holding it.
        model_checkpoint_path: absolute prefix of the latest checkpoint, or ``None``.
        all_model_checkpoint_paths: absolute prefixes of the kept checkpoints, oldest first.
        all_model_checkpoint_timestamps: their save times (epoch seconds), may be empty.
        last_preserved_timestamp: time of the last checkpoint kept by
            ``keep_checkpoint_every_n_hours``, or ``None``.
        recorded_model_checkpoint_path: ``model_checkpoint_path`` as written.
        recorded_all_model_checkpoint_paths: ``all_model_checkpoint_paths`` as written.
        outside: the recorded paths that point outside the directory and were not used, in
            the order written (the latest included).

    Example:
        >>> read_state_file("runs/A").model_checkpoint_path  # doctest: +SKIP
        '/home/me/runs/A/ckpt-1'
    """

    path: str
    directory: str
    model_checkpoint_path: Optional[str]
    all_model_checkpoint_paths: Tuple[str, ...]
    all_model_checkpoint_timestamps: Tuple[float, ...]
    last_preserved_timestamp: Optional[float]
    recorded_model_checkpoint_path: Optional[str]
    recorded_all_model_checkpoint_paths: Tuple[str, ...]
    outside: Tuple[str, ...] = ()

    def timestamp_of(self, prefix: str) -> Optional[float]:
        """Return the recorded save time of ``prefix`` (absolute), or ``None``."""
        return self._timestamps.get(os.path.normpath(prefix))

    @functools.cached_property
    def _timestamps(self) -> Dict[str, float]:
        """Recorded save times by normalised prefix (built once: one lookup per checkpoint)."""
        if len(self.all_model_checkpoint_timestamps) != len(self.all_model_checkpoint_paths):
            return {}
        out: Dict[str, float] = {}
        for p, t in zip(self.all_model_checkpoint_paths, self.all_model_checkpoint_timestamps):
            out.setdefault(os.path.normpath(p), t)  # the first entry wins, as the scan did
        return out

_ESCAPES = {
    "n": b"\n", "t": b"\t", "r": b"\r", "a": b"\a", "b": b"\b", "f": b"\f", "v": b"\v",
    "\\": b"\\", "'": b"'", '"': b'"', "?": b"?",
}
_ESCAPE_RE = re.compile(r"\\(?:([0-7]{1,3})|x([0-9a-fA-F]{1,2})|u([0-9a-fA-F]{4})|U([0-9a-fA-F]{8})|(.))",
                        re.DOTALL)
_FIELD_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_STRING_RE = re.compile(r'"(?:[^"\\\n]|\\.)*"|\'(?:[^\'\\\n]|\\.)*\'')
_NUMBER_RE = re.compile(r"[-+]?(?:inf(?:inity)?|nan|(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?)f?", re.IGNORECASE)
_SPACE_RE = re.compile(r"(?:\s+|#[^\n]*)*")
_STRING_FIELDS = ("model_checkpoint_path", "all_model_checkpoint_paths")
_FLOAT_FIELDS = ("all_model_checkpoint_timestamps", "last_preserved_timestamp")


def _unescape(body: str) -> bytes:
    """Undo the C escapes of a text-format string literal (without its quotes) into bytes."""
    out = bytearray()
    pos = 0
    for m in _ESCAPE_RE.finditer(body):
        out += body[pos:m.start()].encode("utf-8", "surrogateescape")
        octal, hex2, u4, u8, other = m.groups()
        if octal is not None:
            out.append(int(octal, 8) & 0xFF)
        elif hex2 is not None:
            out.append(int(hex2, 16))
        elif u4 is not None or u8 is not None:
            out += chr(int(u4 or u8, 16)).encode("utf-8", "surrogatepass")
        elif other in _ESCAPES:
            out += _ESCAPES[other]
        else:
            raise ValueError(f"unknown escape '\\{other}'")
        pos = m.end()
    out += body[pos:].encode("utf-8", "surrogateescape")
    return bytes(out)


def _parse_state_text(text: str, shown_path: str) -> Dict[str, list]:
    """Parse the few scalar fields of a text-format CheckpointState into lists of values."""
    fields: Dict[str, list] = {name: [] for name in _STRING_FIELDS + _FLOAT_FIELDS}
    pos = 0

    def fail(msg: str) -> CheckpointFormatError:
        line = text.count("\n", 0, pos) + 1
        return CheckpointFormatError(
            f"Cannot parse the checkpoint state file {quote_name(shown_path)} at line {line}: {msg}. "
            "It should hold lines like 'model_checkpoint_path: \"ckpt-10\"'. Fix or delete the "
            "file, or pass the checkpoint prefix itself instead of the directory.",
            path=shown_path,
        )

    while True:
        pos = _SPACE_RE.match(text, pos).end()
        if pos >= len(text):
            break
        m = _FIELD_RE.match(text, pos)
        if m is None:
            raise fail(f"expected a field name, found {text[pos:pos + 20]!r}")
        name = m.group(0)
        pos = _SPACE_RE.match(text, m.end()).end()
        if not text.startswith(":", pos):
            raise fail(f"expected ':' after '{name}'")
        pos = _SPACE_RE.match(text, pos + 1).end()
        sm = _STRING_RE.match(text, pos)
        if sm is not None:
            raw = b""
            while sm is not None:  # adjacent literals concatenate, as in C
                try:
                    raw += _unescape(sm.group(0)[1:-1])
                except ValueError as e:
                    raise fail(str(e)) from None
                pos = _SPACE_RE.match(text, sm.end()).end()
                sm = _STRING_RE.match(text, pos)
            value: object = os.fsdecode(raw)
        else:
            nm = _NUMBER_RE.match(text, pos)
            if nm is None:
                raise fail(f"expected a value for '{name}', found {text[pos:pos + 20]!r}")
            value = float(nm.group(0).rstrip("fF"))
            pos = nm.end()
        if text.startswith((";", ","), pos):
            pos += 1
        if name in _STRING_FIELDS:
            if not isinstance(value, str):
                raise fail(f"'{name}' must be a quoted string")
        elif name in _FLOAT_FIELDS:
            if not isinstance(value, float):
                raise fail(f"'{name}' must be a number")
        else:
            logger.debug("ignoring unknown field %r in %s", name, shown_path)
            continue
        fields[name].append(value)
    return fields


class _Locate:
    """Resolve the recorded checkpoint paths of one state file against its directory: ``None``
    for a path outside the directory (links resolved) when the directory holds no checkpoint of
    its base name (a run copied or moved from elsewhere, or from another machine, uses its own)."""

    def __init__(self, abs_dir: str) -> None:
        self.real_dir = os.path.realpath(abs_dir)
        self._folders: Dict[str, str] = {}  # folder -> its real path (most paths share one folder)

    def inside(self, path: str) -> bool:
        """Whether the checkpoint ``path`` is in a folder inside the directory (its own files are
        confined where they are read: a link out of the directory is never followed)."""
        folder = os.path.dirname(path)
        real = self._folders.get(folder)
        if real is None:
            real = self._folders[folder] = os.path.realpath(folder)
        return real == self.real_dir or real.startswith(self.real_dir.rstrip(os.sep) + os.sep)

    def __call__(self, recorded: str, abs_dir: str) -> Optional[str]:
        path = os.path.normpath(os.path.join(abs_dir, recorded))  # (an absolute ``recorded`` stays itself)
        if self.inside(path):
            return path
        local = os.path.join(abs_dir, os.path.basename(recorded.rstrip("/\\")))
        if prefix_exists(local):
            logger.info("state file path %s is outside %s; using %s", recorded, abs_dir, local)
            return os.path.normpath(local)
        return None


def read_state(directory: str, shown_dir: str) -> Optional[CheckpointState]:
    state_path = os.path.join(directory, STATE_FILE)
    if not os.path.isfile(state_path):
        return None
    shown_path = display_path(shown_dir, STATE_FILE)
    if os.path.islink(state_path):
        why = link_problem(directory, state_path)
        if why is not None:  # a state file the directory leads to: confined like any file of the run
            logger.warning("%s %s: not read as the directory's state file", shown_path, why)
            return None
    try:
        with open(state_path, "rb") as f:
            data = f.read()
    except OSError as e:
        limits.check(e, state_path)
        raise CheckpointFormatError(
            f"Cannot read the checkpoint state file {quote_name(shown_path)}: {e.strerror or e}. "
            "Check its permissions, or pass the checkpoint prefix itself.",
            path=shown_path,
        ) from e
    abs_dir = os.path.abspath(directory)
    return state_from_text(data.decode("utf-8", "surrogateescape"), shown_path, os.path.abspath(state_path),
                           abs_dir, _Locate(abs_dir))


def state_from_text(text: str, shown_path: str, path: str, directory: str,
                    locate: Callable[[str, str], Optional[str]]) -> CheckpointState:
    """The :class:`CheckpointState` a state file's ``text`` describes: ``path`` and ``directory``
    are where it lives (local or URL), ``locate(recorded, directory)`` finds a recorded path in
    the directory (``None``: it points outside; see :class:`CheckpointState`), and problems name
    the file as ``shown_path``.

    Example:
        >>> state_from_text('model_checkpoint_path: "ckpt-2"', "checkpoint", "/run/checkpoint", "/run",
        ...                 lambda p, d: d + "/" + p).model_checkpoint_path
        '/run/ckpt-2'
        >>> state_from_text('model_checkpoint_path: "../x/ckpt-9"', "checkpoint", "/run/checkpoint", "/run",
        ...                 lambda p, d: None).outside
        ('../x/ckpt-9',)
    """
    fields = _parse_state_text(text, shown_path)
    latest = fields["model_checkpoint_path"][-1] if fields["model_checkpoint_path"] else None
    recorded_all = tuple(fields["all_model_checkpoint_paths"])
    stamps = tuple(fields["all_model_checkpoint_timestamps"])
    last = fields["last_preserved_timestamp"]
    located = [locate(p, directory) for p in recorded_all]
    outside = [p for p, at in zip(recorded_all, located) if at is None]
    if len(stamps) == len(recorded_all):  # times stay beside their paths
        stamps = tuple(t for t, at in zip(stamps, located) if at is not None)
    latest_at = locate(latest, directory) if latest else None
    if latest and latest_at is None and latest not in outside:
        outside.append(latest)
    return CheckpointState(
        path=path,
        directory=directory,
        model_checkpoint_path=latest_at,
        all_model_checkpoint_paths=tuple(at for at in located if at is not None),
        all_model_checkpoint_timestamps=stamps,
        last_preserved_timestamp=last[-1] if last else None,
        recorded_model_checkpoint_path=latest or None,
        recorded_all_model_checkpoint_paths=recorded_all,
        outside=tuple(outside),
    )


def read_state_file(directory: PathArg) -> Optional[CheckpointState]:
    """Parse a directory's ``checkpoint`` state file, without TensorFlow.

    Args:
        directory: the checkpoint directory (or the state file itself).

    Returns:
        The :class:`CheckpointState`, or ``None`` when the directory has no state file.

    Raises:
        CheckpointNotFoundError: ``directory`` does not exist.
        CheckpointFormatError: the state file cannot be read or parsed.

    Example:
        >>> st = read_state_file("runs/A")  # doctest: +SKIP
        >>> os.path.basename(st.model_checkpoint_path), st.all_model_checkpoint_paths[-1]  # doctest: +SKIP
        ('ckpt-1', '/home/me/runs/A/ckpt-1')
    """
    given = check_path(directory, "directory")
    if os.path.isfile(given) and os.path.basename(given) == STATE_FILE:
        return read_state(os.path.dirname(given) or ".", os.path.dirname(given) or ".")
    if not os.path.isdir(given):
        raise not_found_error(given)
    return read_state(given, given)


def _proto_string(path: str) -> str:
    """Quote a path for a text-format proto string, as protobuf's CEscape does."""
    out = []
    for b in os.fsencode(path):
        c = chr(b)
        if c in "\\\"'":
            out.append("\\" + c)
        elif c == "\n":
            out.append("\\n")
        elif c == "\r":
            out.append("\\r")
        elif c == "\t":
            out.append("\\t")
        elif 0x20 <= b < 0x7F:
            out.append(c)
        else:
            out.append(f"\\{b:03o}")
    return '"' + "".join(out) + '"'


def state_file_text(out_abs: str, state: Any) -> str:
    """The new ``checkpoint`` state file: the output is the latest; earlier entries are kept.

    Earlier paths keep the strings they were recorded with; the new checkpoint is recorded by
    its base name (relative to the directory, as TensorFlow records checkpoints it saves there).
    Timestamps are written when the earlier ones line up with their paths (or there are none).

    Example:
        >>> state_file_text("/runs/C/merged", None).splitlines()[0]
        'model_checkpoint_path: "merged"'
    """
    paths: List[str] = []
    stamps: List[float] = []
    keep_stamps = True
    if state is not None:
        old_stamps = state.all_model_checkpoint_timestamps
        keep_stamps = len(old_stamps) == len(state.all_model_checkpoint_paths)
        resolved = iter(zip(state.all_model_checkpoint_paths, old_stamps if keep_stamps else
                            [0.0] * len(state.all_model_checkpoint_paths)))
        for recorded in state.recorded_all_model_checkpoint_paths:
            if recorded in state.outside:  # kept as written, without a time (it has none beside it)
                if recorded not in paths:
                    paths.append(recorded)
                    keep_stamps = False
                continue
            at, stamp = next(resolved)
            if same_checkpoint_path(at, out_abs) or recorded in paths:
                continue
            paths.append(recorded)
            stamps.append(stamp)
    new = os.path.basename(out_abs)
    paths.append(new)
    stamps.append(time.time())
    lines = [f"model_checkpoint_path: {_proto_string(new)}"]
    lines += [f"all_model_checkpoint_paths: {_proto_string(p)}" for p in paths]
    if keep_stamps:
        lines += [f"all_model_checkpoint_timestamps: {t!r}" for t in stamps]
    if state is not None and state.last_preserved_timestamp is not None:
        lines.append(f"last_preserved_timestamp: {state.last_preserved_timestamp!r}")
    return "\n".join(lines) + "\n"
