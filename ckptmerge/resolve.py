"""Find the checkpoint a user means: prefixes, files, directories, steps and state files.

Users point ckptmerge at whatever they have at hand: a checkpoint prefix (``runs/A/ckpt-10``),
one of its files (``ckpt-10.index``, ``ckpt-10.data-00000-of-00001``), a training directory
with TensorFlow's ``checkpoint`` state file, a directory plus a step, a SavedModel directory, a
V1 checkpoint (a single file, or a sharded set given as ``model.ckpt-?????-of-00002``, as one of
its shards or by its prefix) or a Keras ``.h5`` weights file. :func:`resolve_checkpoint` turns any of these into one absolute
prefix (a :class:`ResolvedCheckpoint`) and says in ``note`` how it was chosen, so reports can
show it. :func:`checkpoints` lists the checkpoints of a directory and :func:`read_state_file`
parses the ``checkpoint`` state file (a text-format ``CheckpointState`` proto) without
TensorFlow. Nothing here reads tensors; nothing here imports TensorFlow.
"""

from __future__ import annotations

import functools
import logging
import os
import re
import stat
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Tuple, Union

from .args import check_path, check_step
from .errors import (
    ArgumentError,
    ArgumentTypeError,
    CheckpointFormatError,
    CheckpointNotFoundError,
    did_you_mean,
    format_list,
)
from .formats.storage import is_url
from .text import quote_name

__all__ = [
    "open_resolved",
    "ArgumentError",
    "ArgumentTypeError",
    "CheckpointInfo",
    "CheckpointState",
    "ResolvedCheckpoint",
    "checkpoints",
    "read_state_file",
    "resolve_checkpoint",
    "FORMAT_TF_BUNDLE",
    "FORMAT_KERAS_H5",
    "FORMAT_SAFETENSORS",
    "FORMAT_NUMPY",
    "FORMAT_TF_V1",
]

logger = logging.getLogger(__name__)

PathArg = Union[str, "os.PathLike[str]"]

#: A TensorFlow V2 checkpoint: ``prefix.index`` plus ``prefix.data-NNNNN-of-NNNNN`` shards.
FORMAT_TF_BUNDLE = "tf-bundle"
#: A Keras HDF5 weights file (``.weights.h5`` of Keras 3, ``.h5`` of Keras 2).
FORMAT_KERAS_H5 = "keras-h5"
#: A ``.safetensors`` file, a sharded set's ``*.safetensors.index.json``, or a folder of them.
FORMAT_SAFETENSORS = "safetensors"
#: A ``.npz`` archive or a folder of ``.npy`` files.
FORMAT_NUMPY = "numpy"
#: A TensorFlow V1 checkpoint: one table file, or the pattern ``prefix-?????-of-NNNNN`` of a set.
FORMAT_TF_V1 = "tf-v1"

STATE_FILE = "checkpoint"
_INDEX = ".index"
_DATA_RE = re.compile(r"\.data-(\d{5})-of-(\d{5})$")
_STEP_RE = re.compile(r"-(\d+)$")
_H5_SUFFIXES = (".weights.h5", ".h5", ".hdf5")
_HDF5_MAGIC = b"\x89HDF\r\n\x1a\n"
# Last 8 bytes of every LevelDB-style table (TF's V1 checkpoints and V2 .index files),
# little-endian 0xdb4775248b80fb57.
_TABLE_MAGIC = bytes.fromhex("57fb808b247547db")
_TABLE_FOOTER_LEN = 48




@dataclass(frozen=True)
class CheckpointInfo:
    """One checkpoint of a directory, as listed by :func:`checkpoints`.

    Attributes:
        path: the absolute prefix (or the absolute ``.h5`` path).
        step: the trailing ``-N`` of the prefix's base name (``ckpt-10`` -> 10), else ``None``.
        time: when it was written, epoch seconds: the state file's timestamp when one is
            recorded for it, else the modification time of its ``.index`` (or ``.h5``) file.
        size: bytes of the ``.index`` plus all ``.data-*`` shards (or of the ``.h5`` file).
        latest: whether the directory's ``checkpoint`` state file names it as the latest.

    Example:
        >>> [(c.step, c.latest) for c in checkpoints("runs/A")]  # doctest: +SKIP
        [(1, True), (9, False), (10, False)]
    """

    path: str
    step: Optional[int]
    time: float
    size: int
    latest: bool


@dataclass(frozen=True)
class ResolvedCheckpoint:
    """The checkpoint a path (and optional step) refers to.

    Attributes:
        prefix: absolute checkpoint prefix, absolute V1 file or ``-?????-of-NNNNN`` pattern,
            or absolute ``.h5`` path.
        format: ``"tf-bundle"``, ``"tf-v1"`` or ``"keras-h5"``.
        step: the step of the checkpoint (trailing ``-N`` of its name), or ``None``.
        note: how it was chosen, for reports, e.g.
            ``"latest checkpoint per runs/A/checkpoint (step 10)"``.

    Example:
        >>> resolve_checkpoint("runs/A").note  # doctest: +SKIP
        'latest checkpoint per runs/A/checkpoint (step 10)'
    """

    prefix: str
    format: str
    step: Optional[int]
    note: str


@dataclass(frozen=True)
class CheckpointState:
    """The content of a directory's ``checkpoint`` state file (TF's ``CheckpointState``).

    Paths are resolved the way TensorFlow resolves them (relative ones against the
    directory) with one addition: an absolute path that does not exist on this machine (a
    directory copied from elsewhere) is replaced by the same base name inside the directory
    when that exists. The ``recorded_*`` fields keep the strings as written.

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


# --------------------------------------------------------------------------------------------
# small helpers


def _step_of(prefix: str) -> Optional[int]:
    """The trailing ``-N`` of a prefix's base name (``.h5`` suffixes stripped), else None."""
    base = os.path.basename(prefix.rstrip(os.sep))
    base = _V1_SET_RE.sub("", base)  # model.ckpt-10-?????-of-00002 is step 10
    for suffix in _H5_SUFFIXES:
        if base.endswith(suffix):
            base = base[: -len(suffix)]
            break
    m = _STEP_RE.search(base)
    return int(m.group(1)) if m else None


def _is_h5_name(path: str) -> bool:
    return path.endswith(_H5_SUFFIXES)


def _read_head_tail(path: str, n: int) -> Tuple[bytes, bytes, int]:
    with open(path, "rb") as f:
        head = f.read(n)
        f.seek(0, os.SEEK_END)
        size = f.tell()
        f.seek(max(0, size - n))
        tail = f.read(n)
    return head, tail, size


def _is_hdf5(path: str) -> bool:
    try:
        with open(path, "rb") as f:
            # The superblock may sit at 0, 512, 1024, 2048, ... (after a user block).
            for offset in (0, 512, 1024, 2048):
                f.seek(offset)
                if f.read(8) == _HDF5_MAGIC:
                    return True
    except OSError:
        return False
    return False


def _is_table(path: str) -> bool:
    """True if the file ends with a LevelDB table footer (TF's V1 checkpoint format)."""
    try:
        _, tail, size = _read_head_tail(path, 8)
    except OSError:
        return False
    return size >= _TABLE_FOOTER_LEN and tail == _TABLE_MAGIC


_V1_SHARD_RE = re.compile(r"-\d{5}-of-\d{5}$")
_V1_SET_RE = re.compile(r"-(?:\d{5}|\?{5})-of-\d{5}$")  # a shard or the pattern of the set
# Files that are never a V1 checkpoint, so directory scans need not open them.
_NOT_V1 = (_INDEX, ".meta", ".pb", ".pbtxt", ".json", ".txt", ".md", ".h5", ".hdf5", ".keras",
           ".safetensors", ".npz", ".npy")


def _v1_pattern_of(shard: str) -> str:
    """The set pattern of a V1 shard file name: ``m-00001-of-00002`` -> ``m-?????-of-00002``."""
    from .formats.v1 import v1_pattern

    return v1_pattern(shard) or shard


def _v1_files(prefix: str) -> List[str]:
    """The files of a V1 checkpoint: the file itself, or every shard of a set's pattern."""
    from .formats.v1 import v1_shard_files

    return v1_shard_files(prefix)


def _v1_pattern_exists(pattern: str) -> bool:
    """True if ``pattern`` is ``prefix-?????-of-NNNNN`` and its first shard is a table file."""
    files = _v1_files(pattern)
    return bool(files) and files[0] != pattern and _is_table(files[0])


def _v1_format(path: str) -> Optional[str]:
    """The V1 checkpoint ``path`` names, as ckptmerge opens it (a file, or a set's pattern)."""
    if _v1_pattern_exists(path):
        return path
    if os.path.isfile(path) and not path.endswith(_INDEX) and _is_table(path):
        return _v1_pattern_of(path) if _V1_SHARD_RE.search(path) else path
    return None


def _v1_shard(prefix: str) -> Optional[str]:
    """A V1 sharded checkpoint file of ``prefix`` (``prefix-00000-of-00002``), if one exists."""
    directory, base = os.path.split(prefix)
    try:
        names = sorted(os.listdir(directory or "."))
    except OSError:
        return None
    for name in names:
        if name.startswith(base) and _V1_SHARD_RE.fullmatch(name[len(base):]):
            full = os.path.join(directory, name)
            if _is_table(full):
                return full
    return None


def _index_exists(prefix: str) -> bool:
    return os.path.isfile(prefix + _INDEX)


def _prefix_exists(prefix: str) -> bool:
    """A V2 prefix (``.index`` exists), a single-file checkpoint (V1 or ``.h5``) or a V1 set."""
    return _index_exists(prefix) or os.path.isfile(prefix) or _v1_pattern_exists(prefix)


def _data_files_by_base(directory: str) -> Dict[str, List[str]]:
    """Every ``BASE.data-NNNNN-of-NNNNN`` file of a directory, by ``BASE``, each list sorted:
    one listing serves every checkpoint there."""
    try:
        names = sorted(os.listdir(directory or "."))
    except OSError:
        return {}
    out: Dict[str, List[str]] = {}
    for name in names:
        m = _DATA_RE.search(name)
        if m is not None:
            out.setdefault(name[:m.start()], []).append(os.path.join(directory, name))
    return out


def _data_files(prefix: str) -> List[str]:
    """The ``prefix.data-NNNNN-of-NNNNN`` files that exist, sorted."""
    directory, base = os.path.split(prefix)
    return _data_files_by_base(directory).get(base, [])


def _size_of(prefix: str, fmt: str, data_files: Optional[List[str]] = None) -> int:
    """Bytes of a checkpoint: the ``.h5`` file, or the ``.index`` and every data shard
    (``data_files`` when the caller listed the directory already)."""
    if fmt == FORMAT_KERAS_H5:
        return os.path.getsize(prefix)
    if fmt == FORMAT_TF_V1:
        return sum(os.path.getsize(f) for f in _v1_files(prefix))
    total = os.path.getsize(prefix + _INDEX)
    for f in _data_files(prefix) if data_files is None else data_files:
        total += os.path.getsize(f)
    return total


def _display(given_dir: str, name: str) -> str:
    """A path to show in messages: joined to the directory as the user gave it."""
    return os.path.join(given_dir, name)


def _shown(abs_path: str, abs_dir: str, given_dir: str) -> str:
    """Show ``abs_path`` relative to the directory the user gave when it lies inside it."""
    try:
        rel = os.path.relpath(abs_path, abs_dir)
    except ValueError:  # different drives on Windows
        return abs_path
    if rel.startswith(os.pardir):
        return abs_path
    return _display(given_dir, rel)


# --------------------------------------------------------------------------------------------
# the state file


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
            f"Cannot parse the checkpoint state file '{shown_path}' at line {line}: {msg}. "
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


def _locate(recorded: str, abs_dir: str) -> str:
    """Resolve a recorded checkpoint path against the state file's directory."""
    if not os.path.isabs(recorded):
        return os.path.normpath(os.path.join(abs_dir, recorded))
    if _prefix_exists(recorded):
        return os.path.normpath(recorded)
    # An absolute path from another machine (or a moved directory): try the base name here.
    local = os.path.join(abs_dir, os.path.basename(recorded.rstrip("/\\")))
    if _prefix_exists(local):
        logger.info("state file path %s does not exist; using %s", recorded, local)
        return os.path.normpath(local)
    return os.path.normpath(recorded)


def _read_state(directory: str, shown_dir: str) -> Optional[CheckpointState]:
    state_path = os.path.join(directory, STATE_FILE)
    if not os.path.isfile(state_path):
        return None
    shown_path = _display(shown_dir, STATE_FILE)
    try:
        with open(state_path, "rb") as f:
            data = f.read()
    except OSError as e:
        raise CheckpointFormatError(
            f"Cannot read the checkpoint state file '{shown_path}': {e.strerror or e}. "
            "Check its permissions, or pass the checkpoint prefix itself.",
            path=shown_path,
        ) from e
    fields = _parse_state_text(data.decode("utf-8", "surrogateescape"), shown_path)
    abs_dir = os.path.abspath(directory)
    latest = fields["model_checkpoint_path"][-1] if fields["model_checkpoint_path"] else None
    recorded_all = tuple(fields["all_model_checkpoint_paths"])
    last = fields["last_preserved_timestamp"]
    return CheckpointState(
        path=os.path.abspath(state_path),
        directory=abs_dir,
        model_checkpoint_path=_locate(latest, abs_dir) if latest else None,
        all_model_checkpoint_paths=tuple(_locate(p, abs_dir) for p in recorded_all),
        all_model_checkpoint_timestamps=tuple(fields["all_model_checkpoint_timestamps"]),
        last_preserved_timestamp=last[-1] if last else None,
        recorded_model_checkpoint_path=latest or None,
        recorded_all_model_checkpoint_paths=recorded_all,
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
        return _read_state(os.path.dirname(given) or ".", os.path.dirname(given) or ".")
    if not os.path.isdir(given):
        raise _not_found(given)
    return _read_state(given, given)


# --------------------------------------------------------------------------------------------
# scanning a directory


@dataclass(frozen=True)
class _Candidate:
    prefix: str  # absolute
    format: str
    step: Optional[int]


def _scan(directory: str) -> List[_Candidate]:
    """Checkpoints directly in ``directory``: ``*.index`` prefixes, V1 files and sets, ``.h5`` files."""
    abs_dir = os.path.abspath(directory)
    out = []
    try:
        names = sorted(os.listdir(directory))
    except OSError:
        return []
    for name in names:
        full = os.path.join(abs_dir, name)
        if name.endswith(_INDEX) and len(name) > len(_INDEX) and os.path.isfile(full):
            prefix = full[: -len(_INDEX)]
            out.append(_Candidate(prefix, FORMAT_TF_BUNDLE, _step_of(prefix)))
        elif _is_h5_name(name) and os.path.isfile(full):
            out.append(_Candidate(full, FORMAT_KERAS_H5, _step_of(full)))
        elif not name.startswith(".") and name != STATE_FILE and not name.endswith(_NOT_V1) \
                and _DATA_RE.search(name) is None:
            v1 = _v1_format(full)
            if v1 is not None and all(c.prefix != v1 for c in out):
                out.append(_Candidate(v1, FORMAT_TF_V1, _step_of(v1)))
    return out


def _saved_model_prefix(directory: str) -> Optional[str]:
    if os.path.isfile(os.path.join(directory, "saved_model.pb")) or os.path.isfile(
        os.path.join(directory, "saved_model.pbtxt")
    ):
        return os.path.join(os.path.abspath(directory), "variables", "variables")
    return None


def _candidates_with_state(directory: str, state: Optional[CheckpointState]) -> List[_Candidate]:
    """Union of the state file's existing checkpoints and the directory's own, by prefix."""
    found: Dict[str, _Candidate] = {}
    if state is not None:
        paths = list(state.all_model_checkpoint_paths)
        if state.model_checkpoint_path:
            paths.append(state.model_checkpoint_path)
        for p in paths:
            if _index_exists(p):
                found.setdefault(p, _Candidate(p, FORMAT_TF_BUNDLE, _step_of(p)))
            elif os.path.isfile(p) and _is_h5_name(p):
                found.setdefault(p, _Candidate(p, FORMAT_KERAS_H5, _step_of(p)))
            elif _v1_format(p) is not None:
                v1 = _v1_format(p) or p
                found.setdefault(v1, _Candidate(v1, FORMAT_TF_V1, _step_of(v1)))
            else:
                logger.debug("state file lists %s but it does not exist", p)
    for c in _scan(directory):
        found.setdefault(c.prefix, c)
    return list(found.values())


def _sort_key(c: _Candidate) -> tuple:
    return (c.step is None, c.step if c.step is not None else 0, c.prefix)


def _steps_text(cands: List[_Candidate]) -> str:
    steps = sorted({c.step for c in cands if c.step is not None})
    return ", ".join(str(s) for s in steps) if steps else "none"


def checkpoints(directory: PathArg) -> List[CheckpointInfo]:
    """List the checkpoints of a directory, sorted by step (``None`` last) then path.

    Lists the checkpoints named by the ``checkpoint`` state file that still exist, every
    ``*.index`` prefix and Keras ``*.h5`` file directly in the directory, and the variables
    of a SavedModel directory.

    Args:
        directory: the directory to list.

    Returns:
        One :class:`CheckpointInfo` per checkpoint (empty if there is none).

    Raises:
        CheckpointNotFoundError: ``directory`` does not exist.
        ArgumentError: ``directory`` is not a directory.
        CheckpointFormatError: the state file cannot be parsed.

    Example:
        >>> [os.path.basename(c.path) for c in checkpoints("runs/A")]  # doctest: +SKIP
        ['ckpt-1', 'ckpt-9', 'ckpt-10']
    """
    given = check_path(directory, "directory")
    if is_url(given):
        from .resolve_remote import checkpoints_url

        return checkpoints_url(given)
    if not os.path.isdir(given) and os.path.isfile(given + ".index"):
        parent = os.path.dirname(given) or "."
        raise ArgumentError(
            f"'{given}' is a checkpoint prefix, not a directory. 'ckptmerge checkpoints {parent}' "
            f"lists the checkpoints of its directory; 'ckptmerge ls {given}' shows this one.")
    if not os.path.exists(given):
        raise _not_found(given)
    if not os.path.isdir(given):
        raise ArgumentError(
            f"'{given}' is not a directory. Pass the directory holding the checkpoints; "
            f"'ckptmerge ls {given}' (or ckptmerge.list_variables) inspects a single checkpoint."
        )
    state = _read_state(given, given)
    cands = _candidates_with_state(given, state)
    sm = _saved_model_prefix(given)
    if sm is not None and _index_exists(sm) and all(c.prefix != sm for c in cands):
        cands.append(_Candidate(sm, FORMAT_TF_BUNDLE, None))
    latest = state.model_checkpoint_path if state is not None else None
    infos = []
    shards: Dict[str, Dict[str, List[str]]] = {}  # directory -> its data files by base: one listing each
    for c in sorted(cands, key=_sort_key):
        ts = state.timestamp_of(c.prefix) if state is not None else None
        stat_path = {FORMAT_KERAS_H5: c.prefix, FORMAT_TF_V1: _v1_files(c.prefix)[0]}.get(
            c.format, c.prefix + _INDEX)
        directory, base = os.path.split(c.prefix)
        if directory not in shards:
            shards[directory] = _data_files_by_base(directory)
        try:
            t = ts if ts is not None else os.path.getmtime(stat_path)
            size = _size_of(c.prefix, c.format, shards[directory].get(base, []))
        except OSError:  # deleted while we looked
            continue
        infos.append(CheckpointInfo(
            path=c.prefix, step=c.step, time=float(t), size=size,
            latest=latest is not None and os.path.normpath(latest) == c.prefix,
        ))
    return infos


# --------------------------------------------------------------------------------------------
# resolving


_KINDS = ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISSOCK, "a socket"),
          (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"))


def _not_a_file(path: str) -> Optional[str]:
    """What ``path`` is when something is there that is not a regular file (``"a directory"``,
    ``"a FIFO (named pipe)"``, ``"a dangling symbolic link to 'x'"``, ...), else ``None``."""
    try:
        mode = os.lstat(path).st_mode
    except OSError:
        return None
    link = ""
    if stat.S_ISLNK(mode):
        try:
            target = quote_name(os.readlink(path))
        except OSError:  # pragma: no cover - removed while we looked
            target = "?"
        try:
            mode = os.stat(path).st_mode
        except OSError:
            return f"a dangling symbolic link to {target}"
        link = f"a symbolic link to {target}, which is "
    for test, kind in _KINDS:
        if test(mode):
            return link + kind
    return None


def _not_found(given: str) -> CheckpointNotFoundError:
    # Something that is not a regular file where the checkpoint should be: say what it is (a
    # directory named 'x.index', a FIFO, a dangling link) rather than "does not exist".
    for path in (given + _INDEX, given):
        kind = _not_a_file(path)
        if kind is not None:
            what = "" if path == given else f" cannot be read: {quote_name(path)}"
            return CheckpointNotFoundError(
                f"Checkpoint path {quote_name(given)}{what} is {kind}, not a "
                "regular file. A checkpoint is a '.index' file with its '.data-*' shards, or a single "
                "file (.weights.h5, .safetensors, .npz); replace it, or pass another path.",
                path=given,
            )
    parent = os.path.dirname(given.rstrip("/\\")) or "."
    shown_parent = os.path.dirname(given.rstrip("/\\"))
    if not os.path.isdir(parent):
        return CheckpointNotFoundError(
            f"Checkpoint path '{given}' does not exist, nor does its directory '{parent}'. "
            "Check the path (relative paths start from the current directory "
            f"'{os.getcwd()}').",
            path=given,
        )
    siblings = []
    try:
        names = os.listdir(parent)
    except OSError:
        names = []
    for name in names:
        if name.startswith("."):  # hidden files, e.g. a writer's temporary files
            continue
        siblings.append(name)
        if name.endswith(_INDEX):
            siblings.append(name[: -len(_INDEX)])
        m = _DATA_RE.search(name)
        if m:
            siblings.append(name[: m.start()])
    base = os.path.basename(given.rstrip("/\\"))
    siblings = sorted(set(siblings) - {base})  # never the path itself
    # A typo usually replaces characters ('1O' for '10'): prefer same-length names that differ
    # in at most two places, so 'model-1O' suggests 'model-10' rather than 'model-1'.
    close = [s for s in siblings
             if len(s) == len(base) and sum(a != b for a, b in zip(s, base)) <= 2]
    candidates = [os.path.join(shown_parent, s) if shown_parent else s for s in (close or siblings)]
    hint = did_you_mean(given.rstrip("/\\"), candidates)
    listing = f" Run 'ckptmerge checkpoints {shown_parent or '.'}' to list the checkpoints there."
    return CheckpointNotFoundError(
        f"Checkpoint path '{given}' does not exist (no such file or directory, and no "
        f"'{given}{_INDEX}').{hint}{listing}",
        path=given,
    )


def _resolve_file(given: str, abs_path: str, note: str) -> ResolvedCheckpoint:
    """A regular file that is not a V2 prefix: Keras HDF5, V1 table, safetensors, NumPy, or
    not a checkpoint."""
    fmt = _array_file_format(abs_path)
    if fmt:
        return ResolvedCheckpoint(abs_path, fmt, None, note or f"{fmt} file {given}")
    if _is_h5_name(abs_path) or _is_hdf5(abs_path):
        return ResolvedCheckpoint(abs_path, FORMAT_KERAS_H5, _step_of(abs_path),
                                  note or f"Keras HDF5 weights file {given}")
    if abs_path.endswith(".keras"):
        from .formats.h5 import is_keras_archive

        if is_keras_archive(abs_path):  # its weights are read in place, named from config.json
            return ResolvedCheckpoint(abs_path, FORMAT_KERAS_H5, _step_of(abs_path),
                                      note or f"Keras model archive {given}")
        raise CheckpointFormatError(
            f"'{given}' is not a Keras '.keras' model archive: it is not a zip file holding "
            "'model.weights.h5'. It is damaged or was saved in another format; re-copy it, or "
            "save the model again with model.save('model.keras').",
            path=given,
        )
    v1 = _v1_format(abs_path)
    if v1 is not None:
        if v1 != abs_path:
            note = note or f"all shards of V1 checkpoint {given}"
        return ResolvedCheckpoint(v1, FORMAT_TF_V1, _step_of(v1), note or f"V1 checkpoint {given}")
    hint = ""
    for ext in (".meta", ".pb", ".pbtxt", ".json"):
        if abs_path.endswith(ext) and _prefix_exists(abs_path[: -len(ext)]):
            hint = f" Did you mean the checkpoint prefix '{given[: -len(ext)]}'?"
            break
    raise CheckpointFormatError(
        f"'{given}' is a file but not a checkpoint ckptmerge can read: expected a TF "
        "checkpoint prefix (with a '.index' file beside it), one of its '.index'/'.data-*' "
        "files, a V1 checkpoint file, a checkpoint or SavedModel directory, or a Keras '.h5' "
        f"weights file.{hint}",
        path=given,
    )


def _from_prefix(given: str, abs_prefix: str, note: str) -> ResolvedCheckpoint:
    return ResolvedCheckpoint(abs_prefix, FORMAT_TF_BUNDLE, _step_of(abs_prefix), note)


def _array_file_format(path: str) -> str:
    """``FORMAT_SAFETENSORS`` or ``FORMAT_NUMPY`` for such a file, else ``""`` (by name, then content)."""
    from .formats.numpy_files import is_npz
    from .formats.safetensors import INDEX_SUFFIX, is_safetensors

    if path.endswith((".safetensors", INDEX_SUFFIX)) or is_safetensors(path):
        return FORMAT_SAFETENSORS
    if path.endswith(".npz") or is_npz(path):
        return FORMAT_NUMPY
    return ""


def _array_dir_format(directory: str) -> str:
    """The format of a folder of safetensors shards or ``.npy`` files, else ``""``."""
    try:
        names = os.listdir(directory)
    except OSError:
        return ""
    if any(n.endswith(".safetensors") or n.endswith(".safetensors.index.json") for n in names):
        return FORMAT_SAFETENSORS
    if any(n.endswith(".npy") for n in names):
        return FORMAT_NUMPY
    return ""


def _resolve_recorded(given_dir: str, abs_dir: str, state: CheckpointState, prefix: str,
                      recorded: str, what: str) -> Tuple[str, str, str]:
    """Check that a checkpoint named by the state file exists; return (prefix, format,
    relocation note)."""
    shown_state = _display(given_dir, STATE_FILE)
    located = prefix
    fmt = ""
    if _index_exists(prefix):
        fmt = FORMAT_TF_BUNDLE
    elif os.path.isfile(prefix) and (_is_h5_name(prefix) or _is_hdf5(prefix)):
        fmt = FORMAT_KERAS_H5
    elif _v1_format(prefix) is not None or _v1_shard(prefix):
        prefix, fmt = _v1_format(prefix) or _v1_pattern_of(_v1_shard(prefix) or ""), FORMAT_TF_V1
    if not fmt:
        shown_index = _shown(prefix, abs_dir, given_dir) + _INDEX
        also = ""
        if os.path.isabs(recorded):
            local = _display(given_dir, os.path.basename(recorded.rstrip("/\\"))) + _INDEX
            if local != shown_index:
                also = f" (nor does {quote_name(local)})"
        others = [c for c in _candidates_with_state(given_dir, state)]
        raise CheckpointNotFoundError(
            f"'{shown_state}' names {quote_name(recorded)} as the {what}, but its index file "
            f"{quote_name(shown_index)} does not exist{also}: deleted, moved, or still being written? "
            f"Steps there: {_steps_text(others)}. Pass a step (e.g. step=N) or a checkpoint "
            f"prefix, or run 'ckptmerge checkpoints {given_dir}' to list them.",
            path=given_dir,
        )
    reloc = ""
    if os.path.isabs(recorded) and os.path.normpath(recorded) != located:
        reloc = f"; recorded as {quote_name(recorded)}, found in {given_dir}"
    return prefix, fmt, reloc


def _resolve_dir(given: str, step: Optional[int]) -> ResolvedCheckpoint:
    abs_dir = os.path.abspath(given)
    sm = _saved_model_prefix(given)
    if sm is not None:
        if not _index_exists(sm):
            raise CheckpointNotFoundError(
                f"'{given}' is a SavedModel directory without variables: "
                f"'{_display(given, os.path.join('variables', 'variables.index'))}' does not exist "
                "(a model without variables, or an incomplete copy).",
                path=given,
            )
        if step is not None:
            raise ArgumentError(
                f"step={step} was given, but '{given}' is a SavedModel directory, which holds "
                "one set of variables and no steps. Drop step, or pass the training directory "
                "that holds the step's checkpoint."
            )
        return ResolvedCheckpoint(sm, FORMAT_TF_BUNDLE, None, f"variables of SavedModel {given}")

    state = _read_state(given, given)
    shown_state = _display(given, STATE_FILE)

    if step is not None:
        cands = _candidates_with_state(given, state)
        matching = sorted({c.prefix: c for c in cands if c.step == step}.values(), key=_sort_key)
        if not matching:
            raise CheckpointNotFoundError(
                f"no checkpoint of step {step} in {given}; steps there: {_steps_text(cands)}. "
                f"Run 'ckptmerge checkpoints {given}' to list them.",
                path=given,
            )
        if len(matching) > 1:
            shown = [_shown(c.prefix, abs_dir, given) for c in matching]
            raise ArgumentError(
                f"several checkpoints of step {step} in {given}: {format_list(shown)}. Pass "
                "the one you mean as a prefix instead of the directory."
            )
        c = matching[0]
        return ResolvedCheckpoint(c.prefix, c.format, c.step, f"step {step} of {given}")

    if state is not None and state.model_checkpoint_path:
        prefix = state.model_checkpoint_path
        prefix, fmt, reloc = _resolve_recorded(given, abs_dir, state, prefix,
                                       state.recorded_model_checkpoint_path or "",
                                       "latest checkpoint")
        s = _step_of(prefix)
        detail = f"step {s}" if s is not None else os.path.basename(prefix)
        return ResolvedCheckpoint(prefix, fmt, s,
                                  f"latest checkpoint per {shown_state} ({detail}{reloc})")
    if state is not None:
        logger.warning("%s names no model_checkpoint_path; looking at the files instead",
                       shown_state)

    cands = _scan(given)
    bundles = [c for c in cands if c.format in (FORMAT_TF_BUNDLE, FORMAT_TF_V1)]
    pool = bundles or cands  # prefer TF checkpoints over stray .h5 files
    why = "no 'checkpoint' state file" if state is None else f"{shown_state} names no latest checkpoint"
    if len(pool) == 1:
        c = pool[0]
        return ResolvedCheckpoint(c.prefix, c.format, c.step,
                                  f"only checkpoint in {given} ({why})")
    if len(pool) > 1:
        stepped = [c for c in pool if c.step is not None]
        shown = [_shown(c.prefix, abs_dir, given) for c in sorted(pool, key=_sort_key)]
        if stepped:
            top = max(c.step for c in stepped)
            best = [c for c in stepped if c.step == top]
            if len(best) == 1:
                c = best[0]
                logger.info("%s: %s; taking the highest step %d", given, why, top)
                return ResolvedCheckpoint(
                    c.prefix, c.format, c.step,
                    f"{why} in {given}; took the highest step {top} of {len(pool)} checkpoints",
                )
        raise ArgumentError(
            f"'{given}' holds {len(pool)} checkpoints ({format_list(shown)}) and {why}, so "
            "ckptmerge cannot tell which one you mean. Pass one of them as a prefix, or a step "
            f"(run 'ckptmerge checkpoints {given}' to list them)."
        )

    fmt = _array_dir_format(given)
    if fmt:
        return ResolvedCheckpoint(abs_dir, fmt, None, f"{fmt} files in {given}")

    # Nothing here; point at subdirectories that do hold checkpoints.
    sub_hint = ""
    try:
        subdirs = sorted(n for n in os.listdir(given) if os.path.isdir(os.path.join(given, n)))
    except OSError:
        subdirs = []
    holding = [_display(given, n) for n in subdirs
               if _scan(os.path.join(given, n)) or os.path.isfile(os.path.join(given, n, STATE_FILE))
               or _saved_model_prefix(os.path.join(given, n))]
    if holding:
        sub_hint = f" Its subdirectories {format_list(holding)} hold checkpoints; pass one of them."
    raise CheckpointNotFoundError(
        f"No checkpoint in directory '{given}': looked for a '{STATE_FILE}' state file, "
        "'*.index' files of TF checkpoints, V1 checkpoint files, a SavedModel ('saved_model.pb' "
        f"with 'variables/variables.index') and Keras '*.h5' weights files.{sub_hint or _DIR_HINT}",
        path=given,
    )


_DIR_HINT = " Pass the directory a training run saved its checkpoints to, or a checkpoint prefix."


def resolve_checkpoint(path: PathArg, *, step: Optional[int] = None) -> ResolvedCheckpoint:
    """Resolve what a user passed (prefix, file, directory, SavedModel, ``.h5``) to one checkpoint.

    Args:
        path: a checkpoint prefix (``runs/A/ckpt-10``), its ``.index`` or ``.data-*`` file, a
            directory (the latest checkpoint per its ``checkpoint`` state file; without one,
            the only checkpoint or the highest step), a SavedModel directory, a V1 checkpoint
            (a file, or a sharded set as its ``-?????-of-NNNNN`` pattern, one of its shards or
            its prefix), or a Keras ``.h5`` / ``.weights.h5`` file.
        step: the checkpoint of this step in a directory; with a prefix it must match the
            prefix's step. Never falls back to another step.

    Returns:
        A :class:`ResolvedCheckpoint` with the absolute prefix and a note saying how it was
        chosen.

    Raises:
        CheckpointNotFoundError: nothing exists at ``path``, the step is not there, or the state
            file names a checkpoint whose files are missing.
        CheckpointFormatError: ``path`` is another kind of file, or the state file cannot be
            parsed.
        ArgumentError: ``step`` is negative or contradicts the prefix, or the directory holds
            several checkpoints and no way to choose. ``ArgumentTypeError`` for wrong types.

    Example:
        >>> r = resolve_checkpoint("runs/A", step=10)  # doctest: +SKIP
        >>> r.step, r.note  # doctest: +SKIP
        (10, 'step 10 of runs/A')
    """
    given = check_path(path)
    step = check_step(step)
    if is_url(given):  # object storage and other fsspec filesystems
        from .resolve_remote import resolve_url

        return resolve_url(given, step)
    abs_path = os.path.abspath(given)
    resolved: Optional[ResolvedCheckpoint] = None

    if given.endswith(_INDEX) and os.path.isfile(abs_path):
        prefix = abs_path[: -len(_INDEX)]
        resolved = _from_prefix(given, prefix, f"prefix of {given}")
    elif _DATA_RE.search(given) and os.path.isfile(abs_path):
        m = _DATA_RE.search(abs_path)
        prefix = abs_path[: m.start()]
        shown_prefix = given[: _DATA_RE.search(given).start()]
        if not _index_exists(prefix):
            raise CheckpointNotFoundError(
                f"'{given}' is a data shard, but its index file '{shown_prefix}{_INDEX}' does not "
                "exist, so the checkpoint is incomplete (deleted, or still being written?).",
                path=given,
            )
        resolved = _from_prefix(given, prefix, f"prefix of {given}")
    elif _index_exists(abs_path):
        resolved = _from_prefix(given, abs_path, f"checkpoint prefix {given}")
    elif os.path.isdir(abs_path):
        return _resolve_dir(given, step)
    elif os.path.isfile(abs_path) and os.path.basename(abs_path) == STATE_FILE:
        # The state file itself: the user means the latest checkpoint it names.
        return _resolve_dir(os.path.dirname(given) or ".", step)
    elif os.path.isfile(abs_path):
        resolved = _resolve_file(given, abs_path, "")
    elif _v1_pattern_exists(abs_path):
        resolved = ResolvedCheckpoint(abs_path, FORMAT_TF_V1, _step_of(abs_path), f"V1 checkpoint {given}")
    elif _v1_shard(abs_path):
        pattern = _v1_pattern_of(_v1_shard(abs_path) or "")
        resolved = ResolvedCheckpoint(pattern, FORMAT_TF_V1, _step_of(pattern),
                                      f"all shards of V1 checkpoint {given}")
    else:
        raise _not_found(given)

    if step is not None and resolved.step != step:
        has = f"is step {resolved.step}" if resolved.step is not None else "has no step in its name"
        parent = os.path.dirname(given) or "."
        raise ArgumentError(
            f"step={step} was given, but checkpoint '{given}' {has}. To pick a step, pass the "
            f"directory with the step: Source('{parent}', step={step}) in Python, "
            f"'ckptmerge ls {parent} --step {step}' on the command line; or drop the step."
        )
    return resolved


def open_resolved(path: PathArg, *, step: Optional[int] = None, verify: bool = True,
                  resolved: Optional[ResolvedCheckpoint] = None) -> Tuple[ResolvedCheckpoint, Any]:
    """Resolve ``path`` (or take ``resolved``) and open a TF-free reader on it.

    Returns:
        ``(resolved checkpoint, reader)``; close the reader (it is a context manager).

    Example:
        >>> resolved, reader = open_resolved("runs/A")     # doctest: +SKIP
        >>> resolved.note, len(reader)                      # doctest: +SKIP
        ('latest checkpoint per runs/A/checkpoint (step 10)', 3)
    """
    from .formats import open_checkpoint

    if resolved is None:
        resolved = resolve_checkpoint(path, step=step)
    return resolved, open_checkpoint(resolved.prefix, verify=verify)
