"""What is on disk at a checkpoint path: file names, formats sniffed from bytes, sizes.

The low layer of :mod:`ckptmerge.sources.resolve`: the checkpoint formats it names, the file names of a
V2 bundle (``prefix.index`` and its ``.data-*`` shards) and of V1 sets, Keras ``.h5`` names,
telling an HDF5 or LevelDB-table file from its first and last bytes, checkpoint sizes, and the
message that says why a path is not a checkpoint (what is there instead, or the closest name).
Nothing here reads tensors; nothing here imports TensorFlow. Its names without a leading
underscore are shared with :mod:`ckptmerge.sources.resolve` and :mod:`ckptmerge.sources.state` (they are
not part of the package's API, which :mod:`ckptmerge` re-exports).
"""

from __future__ import annotations

import os
import re
import stat
from typing import Dict, Iterable, List, Optional, Tuple, Union

from ..core import limits
from ..core.errors import ArgumentError, CheckpointNotFoundError, CkptMergeError, ResourceLimitError, did_you_mean
from ..formats.io.storage import filesystem, is_url
from ..formats.io.urlpath import add_suffix, basename, canonical_url, has_suffix, path_part, scheme_of, sibling, strip_suffix
from ..formats.tf.bundle import (
    DATA_RE,  # the bundle format's data-file names (also imported from here)
)
from ..core.text import escape_name, quote_name, quoted_command

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
INDEX = ".index"
_STEP_RE = re.compile(r"-(\d+)$")
_H5_SUFFIXES = (".weights.h5", ".h5", ".hdf5")
_HDF5_MAGIC = b"\x89HDF\r\n\x1a\n"
# Last 8 bytes of every LevelDB-style table (TF's V1 checkpoints and V2 .index files),
# little-endian 0xdb4775248b80fb57.
_TABLE_MAGIC = bytes.fromhex("57fb808b247547db")
_TABLE_FOOTER_LEN = 48


def step_of(prefix: str) -> Optional[int]:
    """The trailing ``-N`` of a prefix's base name (``.h5`` suffixes stripped), else None."""
    base = basename(prefix) if is_url(prefix) else os.path.basename(prefix.rstrip(os.sep))  # (a URL: its path)
    base = _V1_SET_RE.sub("", base)  # model.ckpt-10-?????-of-00002 is step 10
    for suffix in (KERAS_SHARDS,) + _H5_SUFFIXES:
        if base.endswith(suffix):
            base = base[: -len(suffix)]
            break
    m = _STEP_RE.search(base)
    return int(m.group(1)) if m else None


def is_h5_name(path: str) -> bool:
    """True if ``path`` ends like a Keras HDF5 file (``.h5``, ``.hdf5``, ``.keras``, ...)."""
    return path_part(path).endswith(_H5_SUFFIXES)


#: The JSON of a Keras 3 sharded set (``save_weights("m.weights.json", max_shard_size=...)``).
KERAS_SHARDS = ".weights.json"
_KERAS_SHARD_RE = re.compile(r"^(.+)_\d{5}\.weights\.h5$")


def keras_weight_files(names: Iterable[str]) -> List[str]:
    """The Keras weights files among a folder's ``names``: ``.h5`` files and sharded sets'
    ``.weights.json``, without the shards of a set whose JSON is there (a set is one checkpoint).

    Example:
        >>> keras_weight_files(["m.weights.json", "m_00000.weights.h5", "m_00001.weights.h5", "x.h5"])
        ['m.weights.json', 'x.h5']
    """
    names = sorted(names)
    sets = {n[: -len(KERAS_SHARDS)] for n in names if n.endswith(KERAS_SHARDS)}
    out = []
    for n in names:
        if n.endswith(KERAS_SHARDS):
            out.append(n)
        elif is_h5_name(n):
            m = _KERAS_SHARD_RE.match(n)
            if m is None or m.group(1) not in sets:
                out.append(n)
    return out


def _read_head_tail(path: str, n: int) -> Tuple[bytes, bytes, int]:
    with limits.checked(path), open(path, "rb") as f:
        head = f.read(n)
        f.seek(0, os.SEEK_END)
        size = f.tell()
        f.seek(max(0, size - n))
        tail = f.read(n)
    return head, tail, size


def is_hdf5(path: str) -> bool:
    """True if ``path`` holds the HDF5 signature where a superblock may start; False if unreadable."""
    try:
        with open(path, "rb") as f:
            # The superblock may sit at 0, 512, 1024, 2048, ... (after a user block).
            for offset in (0, 512, 1024, 2048):
                f.seek(offset)
                if f.read(8) == _HDF5_MAGIC:
                    return True
    except OSError as e:
        limits.check(e, path)
        return False
    return False


def _is_table(path: str) -> bool:
    """True if the file ends with a LevelDB table footer (TF's V1 checkpoint format)."""
    try:
        _, tail, size = _read_head_tail(path, 8)
    except OSError:
        return False
    return size >= _TABLE_FOOTER_LEN and tail == _TABLE_MAGIC


V1_SHARD_RE = re.compile(r"-\d{5}-of-\d{5}$")
_V1_SET_RE = re.compile(r"-(?:\d{5}|\?{5})-of-\d{5}$")  # a shard or the pattern of the set
# Files that are never a V1 checkpoint, so directory scans need not open them.
NOT_V1_SUFFIXES = (INDEX, ".meta", ".pb", ".pbtxt", ".json", ".txt", ".md", ".h5", ".hdf5", ".keras",
                   ".safetensors", ".npz", ".npy")


def v1_pattern_of(shard: str) -> str:
    """The set pattern of a V1 shard file name: ``m-00001-of-00002`` -> ``m-?????-of-00002``."""
    from ..formats.tf.v1 import v1_pattern

    return v1_pattern(shard) or shard


def v1_files(prefix: str) -> List[str]:
    """The files of a V1 checkpoint: the file itself, or every shard of a set's pattern."""
    from ..formats.tf.v1 import v1_shard_files

    return v1_shard_files(prefix)


def v1_pattern_exists(pattern: str) -> bool:
    """True if ``pattern`` is ``prefix-?????-of-NNNNN`` and its first shard is a table file."""
    files = v1_files(pattern)
    return bool(files) and files[0] != pattern and _is_table(files[0])


def v1_format(path: str) -> Optional[str]:
    """The V1 checkpoint ``path`` names, as ckptmerge opens it (a file, or a set's pattern)."""
    if v1_pattern_exists(path):
        return path
    if os.path.isfile(path) and not path.endswith(INDEX) and _is_table(path):
        return v1_pattern_of(path) if V1_SHARD_RE.search(path) else path
    return None


def v1_shard(prefix: str) -> Optional[str]:
    """A V1 sharded checkpoint file of ``prefix`` (``prefix-00000-of-00002``), if one exists."""
    directory, base = os.path.split(prefix)
    try:
        names = sorted(os.listdir(directory or "."))
    except OSError:
        return None
    for name in names:
        if name.startswith(base) and V1_SHARD_RE.fullmatch(name[len(base):]):
            full = os.path.join(directory, name)
            if _is_table(full):
                return full
    return None


def array_dir_format(names: Iterable[str]) -> str:
    """The format of a folder holding ``names``: safetensors shards (or their index) or ``.npy``
    files, else ``""``.

    Example:
        >>> array_dir_format(["model-00001-of-00002.safetensors", "README.md"])
        'safetensors'
    """
    names = list(names)
    if any(n.endswith((".safetensors", ".safetensors.index.json")) for n in names):
        return FORMAT_SAFETENSORS
    if any(n.endswith(".npy") for n in names):
        return FORMAT_NUMPY
    return ""


def index_exists(prefix: str) -> bool:
    """True if ``prefix.index`` is a file (a V2 bundle's index)."""
    return os.path.isfile(prefix + INDEX)


def prefix_exists(prefix: str) -> bool:
    """A V2 prefix (``.index`` exists), a single-file checkpoint (V1 or ``.h5``) or a V1 set."""
    return index_exists(prefix) or os.path.isfile(prefix) or v1_pattern_exists(prefix)


def data_files_by_base(directory: str) -> Dict[str, List[str]]:
    """Every ``BASE.data-NNNNN-of-NNNNN`` file of a directory, by ``BASE``, each list sorted:
    one listing serves every checkpoint there."""
    try:
        names = sorted(os.listdir(directory or "."))
    except OSError:
        return {}
    out: Dict[str, List[str]] = {}
    for name in names:
        m = DATA_RE.search(name)
        if m is not None:
            out.setdefault(name[:m.start()], []).append(os.path.join(directory, name))
    return out


def _data_files(prefix: str) -> List[str]:
    """The ``prefix.data-NNNNN-of-NNNNN`` files that exist, sorted."""
    directory, base = os.path.split(prefix)
    return data_files_by_base(directory).get(base, [])


def size_of(prefix: str, fmt: str, data_files: Optional[List[str]] = None) -> int:
    """Bytes of a checkpoint: the ``.h5`` file (a sharded set's JSON and its shards), or the
    ``.index`` and every data shard (``data_files`` when the caller listed the directory already)."""
    if fmt == FORMAT_KERAS_H5:
        if prefix.endswith(KERAS_SHARDS):  # the JSON and every shard it names
            from ..formats.keras.shards import shard_files

            folder = os.path.dirname(prefix)
            try:
                shards = shard_files(prefix)[1]
            except ResourceLimitError:  # out of open files or memory: not this file's fault, never skipped
                raise
            except CkptMergeError:  # a damaged JSON: listed with its own size, refused when opened
                shards = []
            files = [os.path.join(folder, f) for f in shards]  # (a missing shard: refused when opened)
            return os.path.getsize(prefix) + sum(os.path.getsize(f) for f in files if os.path.isfile(f))
        return os.path.getsize(prefix)
    if fmt == FORMAT_TF_V1:
        return sum(os.path.getsize(f) for f in v1_files(prefix))
    total = os.path.getsize(prefix + INDEX)
    for f in _data_files(prefix) if data_files is None else data_files:
        total += os.path.getsize(f)
    return total


def display_path(given_dir: str, name: str) -> str:
    """A path to show in messages: joined to the directory as the user gave it."""
    return os.path.join(given_dir, name)


def shown_path(abs_path: str, abs_dir: str, given_dir: str) -> str:
    """Show ``abs_path`` relative to the directory the user gave when it lies inside it."""
    try:
        rel = os.path.relpath(abs_path, abs_dir)
    except ValueError:  # different drives on Windows
        return abs_path
    if rel.startswith(os.pardir):
        return abs_path
    return display_path(given_dir, rel)


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


def not_found_error(given: str) -> CheckpointNotFoundError:
    """The error for a path that is no checkpoint: what is there instead, or the closest name."""
    # Something that is not a regular file where the checkpoint should be: say what it is (a
    # directory named 'x.index', a FIFO, a dangling link) rather than "does not exist".
    for path in (given + INDEX, given):
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
            f"Checkpoint path {quote_name(given)} does not exist, nor does its directory {quote_name(parent)}. "
            "Check the path (relative paths start from the current directory "
            f"{quote_name(os.getcwd())}).",
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
        if name.endswith(INDEX):
            siblings.append(name[: -len(INDEX)])
        m = DATA_RE.search(name)
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
    listing = f" Run {quoted_command('checkpoints', shown_parent or '.')} to list the checkpoints there."
    return CheckpointNotFoundError(
        f"Checkpoint path {quote_name(given)} does not exist (no such file or directory, and no "
        f"{quote_name(given + INDEX)}).{hint}{listing}",
        path=given,
    )


def same_checkpoint_path(a: str, b: str) -> bool:
    """Whether two checkpoint paths name the same checkpoint: by real path on disk (links
    followed, case folded where the file system folds it; a ``file://`` URL is its local path),
    by one spelling for other URLs (:func:`~ckptmerge.formats.io.urlpath.canonical_url`).

    Example:
        >>> same_checkpoint_path("runs/A/ckpt-1", "runs/A/../A/ckpt-1")
        True
        >>> same_checkpoint_path("s3a://b//run/ckpt-1", "s3://b/run/ckpt-1/")
        True
    """
    a, b = _local_if_file_url(a), _local_if_file_url(b)
    if is_url(a) or is_url(b):  # object storage: no links, no case folding; one spelling per object
        return is_url(a) and is_url(b) and canonical_url(a) == canonical_url(b)
    return os.path.normcase(os.path.realpath(a)) == os.path.normcase(os.path.realpath(b))


def _local_if_file_url(path: str) -> str:
    """A ``file://`` URL as the local path fsspec reads for it; anything else unchanged."""
    if scheme_of(path) in ("file", "local"):
        return filesystem(path)[1]
    return path


def files_read(prefix: str, fmt: str) -> List[str]:
    """The files (or URLs) a resolved checkpoint is read from, as far as its names and small
    JSON files say, without reading tensors: a TF prefix's ``.index`` (its data files are
    ``<prefix>.data-*``), a V1 set's shards, a safetensors index and the shards it names (a folder:
    every ``.safetensors`` file and index in it), a Keras ``.weights.json`` and its shards, the
    file itself otherwise. A merge refuses an output that is one of them
    (:func:`output_overwrites`).

    Example:
        >>> files_read("runs/A/ckpt-10", FORMAT_TF_BUNDLE)
        ['runs/A/ckpt-10.index']
    """
    from ..formats.io import storage

    if fmt == FORMAT_TF_BUNDLE:
        return [add_suffix(prefix, INDEX)]
    if fmt == FORMAT_TF_V1:
        return v1_files(prefix)
    named: List[str] = []
    try:
        if fmt == FORMAT_KERAS_H5 and has_suffix(prefix, KERAS_SHARDS):
            from ..formats.keras.shards import shard_files

            named = shard_files(prefix)[1]
        elif fmt == FORMAT_SAFETENSORS and has_suffix(prefix, ".safetensors.index.json"):
            from ..formats.safetensors.reader import read_json_file

            data = read_json_file(prefix, lambda problem, path: CkptMergeError(problem))
            weight_map = data.get("weight_map") if isinstance(data, dict) else None
            named = sorted({f for f in weight_map.values() if isinstance(f, str)}) if isinstance(weight_map, dict) else []
        elif fmt == FORMAT_SAFETENSORS and storage.isdir(prefix):
            return [prefix] + [storage.join(prefix, n) for n in storage.listdir(prefix)
                               if n.endswith((".safetensors", ".safetensors.index.json"))]
    except ResourceLimitError:  # out of open files or memory: not this file's fault, never skipped
        raise
    except (CkptMergeError, OSError):  # unreadable: opening it will say why; the prefix still counts
        named = []
    return [prefix] + [sibling(prefix, n) for n in named if "/" not in n]


def output_overwrites(out: str, fmt: str, read: str) -> bool:
    """Whether writing a merge's output ``out`` (a TF prefix for ``fmt == "tf"``, else the file
    or folder) would write over ``read``, a file an input is read from (:func:`files_read`).

    Example:
        >>> output_overwrites("runs/A/m-00001-of-00002.safetensors", "safetensors", "runs/A/m-00001-of-00002.safetensors")
        True
        >>> output_overwrites("runs/A/ckpt-10", "tf", "runs/A/ckpt-10.index"), output_overwrites("runs/B/x", "tf", "runs/A/x")
        (True, False)
    """
    if same_checkpoint_path(out, read):
        return True
    if fmt != "tf":
        return False
    if same_checkpoint_path(add_suffix(out, INDEX), read):
        return True
    data = DATA_RE.search(path_part(read))
    return data is not None and same_checkpoint_path(out, strip_suffix(read, data.group(0)))


def refuse_overwriting_inputs(out: str, shown: str, fmt: str, inputs: Iterable[Tuple[str, str]], *,
                              noun: str = "output prefix", then: str = "move") -> None:
    """Raise :class:`~ckptmerge.core.errors.ArgumentError` when a merge's output ``out`` (named ``shown``
    in the message) would write over one of ``inputs``, ``(label, file)`` pairs of every file a
    source or the template is read from: writing would destroy what is read.

    Example:
        >>> refuse_overwriting_inputs("runs/C/m", "runs/C/m", "tf", [("source 'A'", "runs/A/m")])
    """
    for label, prefix in inputs:
        if output_overwrites(out, fmt, prefix):
            raise ArgumentError(
                f"The {noun} {quote_name(shown)} is the checkpoint of {label} ({escape_name(prefix)}): merging "
                "into a checkpoint that is being read would destroy it, even with overwrite=True. Write to "
                f"another prefix, then {then} the result if you want to replace the input.")
