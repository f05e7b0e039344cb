"""Find the checkpoint a URL means: prefixes, directories, steps and state files in object storage.

The same rules as :mod:`ckptmerge.sources.resolve` for local paths, over fsspec listings: a URL is a
checkpoint prefix (``s3://b/run/ckpt-10``, its ``.index`` beside it), one of its files, or a
directory: its ``checkpoint`` state file names the latest, ``step=N`` picks a step, and without a
state file the only checkpoint or the highest step is taken. A state file written on another
machine names absolute local paths (``/home/me/run/ckpt-10``): as TensorFlow does, the checkpoint
is looked up by base name in the directory the state file is in. Each directory is listed once.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Dict, List, Optional

from ..core.errors import ArgumentError, CheckpointFormatError, CheckpointNotFoundError, CkptMergeError
from ..formats.io.storage import (
    probe_isfile,
    read_small,
    remote_exists,
    remote_isdir,
    remote_listdir,
)
from ..formats.io.urlpath import (
    add_suffix,
    basename,
    dirname,
    has_suffix,
    is_url,
    join,
    path_part,
    search_path,
    sibling,
    strip_slash,
    strip_suffix,
)
from ..formats.keras.shards import shard_set_of
from ..core.text import quote_name, quoted_command
from .files import (
    DATA_RE,
    FORMAT_KERAS_H5,
    FORMAT_NUMPY,
    FORMAT_SAFETENSORS,
    FORMAT_TF_BUNDLE,
    FORMAT_TF_V1,
    INDEX,
    KERAS_SHARDS,
    STATE_FILE,
    V1_SHARD_RE,
    array_dir_format,
    is_h5_name,
    keras_weight_files,
    step_of,
    v1_pattern_of,
)
from .resolved import CheckpointInfo, ResolvedCheckpoint
from .state import CheckpointState, state_from_text
from .orbax import FORMAT_ORBAX, ORBAX_MARKERS, orbax_folder, orbax_listing, orbax_root

__all__ = ["resolve_url", "checkpoints_url", "read_state_url"]

_KERAS_NAMES = (".h5", ".hdf5", ".keras")


def _locate(recorded: str, directory: str) -> str:
    """A recorded checkpoint path as a URL: a relative one is relative to the state file's
    directory; an absolute local one (written on another machine) is looked up by base name there,
    as TensorFlow does for a moved directory; a URL stays as written."""
    if is_url(recorded):
        return recorded
    path = recorded.replace("\\", "/")
    if path.startswith("/") or re.match(r"^[A-Za-z]:/", path):
        return join(directory, basename(path))
    return join(directory, path)


def read_state_url(directory: str) -> Optional[CheckpointState]:
    """Parse a remote directory's ``checkpoint`` state file; ``None`` when there is none.

    Paths are URLs (see :func:`_locate`); the ``recorded_*`` fields keep the strings as written.

    Raises:
        CheckpointFormatError: the state file cannot be read or parsed.

    Example:
        >>> read_state_url("s3://bucket/run").model_checkpoint_path  # doctest: +SKIP
        's3://bucket/run/ckpt-200'
    """
    directory = strip_slash(directory)
    return _read_state_at(directory) if remote_exists(join(directory, STATE_FILE)) else None


def _read_state_at(directory: str) -> CheckpointState:
    """:func:`read_state_url` of a directory known to hold a state file (no existence check)."""

    url = join(directory, STATE_FILE)
    return state_from_text(read_small(url, 1 << 24).decode("utf-8", "surrogateescape"), url, url, directory,
                           _locate)


def _latest_name(directory: str, names: Dict[str, dict]) -> Optional[str]:
    """The base name the directory's state file names as latest, if there is a state file."""
    if STATE_FILE not in names:
        return None
    latest = _read_state_at(strip_slash(directory)).model_checkpoint_path
    return basename(latest) if latest else None


def resolve_url(given: str, step: Optional[int]) -> ResolvedCheckpoint:
    """Resolve a URL (and optional step) to one checkpoint; see the module docstring.

    Example:
        >>> resolve_url("s3://bucket/run", 200).prefix  # doctest: +SKIP
        's3://bucket/run/ckpt-200'
    """
    url = strip_slash(given)
    data = DATA_RE.search(path_part(url))
    if has_suffix(url, INDEX):
        url = strip_suffix(url, INDEX)
    elif data:
        url = strip_suffix(url, data.group(0))
    single = _resolve_single(given, url)
    if single is not None:
        if step is not None and single.step != step:
            raise ArgumentError(f"step={step} was given, but checkpoint {quote_name(given)} is "
                                f"{'step ' + str(single.step) if single.step is not None else 'not of a step'}. "
                                "Pass the directory with the step, or drop the step.")
        return single
    if not remote_isdir(url):
        raise CheckpointNotFoundError(
            f"Checkpoint {quote_name(given)} does not exist: no object {quote_name(add_suffix(url, INDEX))} and no "
            "directory "
            f"there. Check the URL, or run {quoted_command('checkpoints', dirname(url))} to list the "
            "checkpoints of its parent.",
            path=given)
    names = {e["name"]: e for e in remote_listdir(url)}
    orbax = orbax_folder(url, step) if ORBAX_MARKERS.intersection(names) else None
    if orbax is not None:
        return ResolvedCheckpoint(orbax[0], FORMAT_ORBAX, orbax[1], orbax[2])
    prefixes = sorted(n[: -len(INDEX)] for n in names if n.endswith(INDEX) and len(n) > len(INDEX))
    # (name, format) of each checkpoint there: TF prefixes, and Keras weights files as in a local directory
    bundles = [(p, FORMAT_TF_BUNDLE) for p in prefixes]
    h5 = [(n, FORMAT_KERAS_H5) for n in keras_weight_files(names)]
    steps = sorted({s for s in (step_of(n) for n, _ in bundles + h5) if s is not None})
    shown_steps = ", ".join(map(str, steps)) or "none"
    if step is not None:
        match = [c for c in bundles + h5 if step_of(c[0]) == step]
        orbax = orbax_root(url, step) if not bundles and not h5 else None
        if orbax is not None:
            return ResolvedCheckpoint(orbax[0], FORMAT_ORBAX, orbax[1], orbax[2])
        if len(match) != 1:
            raise CheckpointNotFoundError(
                f"no checkpoint of step {step} in {quote_name(given)}; steps there: {shown_steps}. Run "
                f"{quoted_command('checkpoints', given)} to list them." if not match else
                f"several checkpoints of step {step} in {quote_name(given)}: "
                f"{', '.join(quote_name(n) for n, _ in match)}; pass one as a prefix.",
                path=given)
        return ResolvedCheckpoint(join(url, match[0][0]), match[0][1], step, f"step {step} of {given}")
    latest = _latest_name(url, names)
    if latest is not None:
        other = _resolve_single(given, join(url, latest)) if latest not in prefixes else None
        if other is not None:  # the state file names a V1 checkpoint (a file, or a set's pattern)
            return dataclasses.replace(other, note=f"latest checkpoint per {join(given, STATE_FILE)}")
        if latest not in prefixes:
            raise CheckpointNotFoundError(
                f"{quote_name(join(url, STATE_FILE))} names {quote_name(latest)} as the latest checkpoint, but "
                f"{quote_name(add_suffix(join(url, latest), INDEX))} "
                f"does not exist: deleted, or still being uploaded? Steps there: {shown_steps}. Pass a step.",
                path=given)
        s = step_of(latest)
        return ResolvedCheckpoint(join(url, latest), FORMAT_TF_BUNDLE, s,
                                  f"latest checkpoint per {join(given, STATE_FILE)} "
                                  f"({'step ' + str(s) if s is not None else latest})")
    pool = bundles or h5  # TF checkpoints before stray Keras files, as in a local directory
    if len(pool) == 1:
        return ResolvedCheckpoint(join(url, pool[0][0]), pool[0][1], step_of(pool[0][0]),
                                  f"only checkpoint in {given} (no 'checkpoint' state file)")
    pool_steps = sorted(s for s in (step_of(n) for n, _ in pool) if s is not None)
    if pool_steps:
        top = [c for c in pool if step_of(c[0]) == pool_steps[-1]]
        if len(top) == 1:
            return ResolvedCheckpoint(join(url, top[0][0]), top[0][1], pool_steps[-1],
                                      f"no 'checkpoint' state file in {given}; took the highest step "
                                      f"{pool_steps[-1]} of {len(pool)} checkpoints")
    if pool:
        raise ArgumentError(f"{quote_name(given)} holds {len(pool)} checkpoints and no 'checkpoint' state "
                            "file; pass one of them as a prefix, or a step.")
    fmt = array_dir_format(names)
    if fmt:
        return ResolvedCheckpoint(url, fmt, None, f"{fmt} directory {given}")
    orbax = orbax_root(url, None)
    if orbax is not None:
        return ResolvedCheckpoint(orbax[0], FORMAT_ORBAX, orbax[1], orbax[2])
    raise CheckpointNotFoundError(f"No checkpoint in {quote_name(given)}: no '*.index' object and no "
                                  "'checkpoint' state file there.", path=given)


def _resolve_single(given: str, url: str) -> Optional[ResolvedCheckpoint]:
    """``url`` as one checkpoint: a TF prefix, a file, or a sharded V1 set's pattern; else None."""
    from ..formats.tf.v1 import V1_PATTERN_RE, v1_shard_files

    if probe_isfile(add_suffix(url, INDEX)):
        return ResolvedCheckpoint(url, FORMAT_TF_BUNDLE, step_of(url), f"checkpoint prefix {given}")
    if remote_exists(url):  # one file: safetensors, NumPy .npz, Keras h5 / .keras, TF V1
        return _resolve_file(given, url)
    if search_path(V1_PATTERN_RE, url) and remote_exists(v1_shard_files(url)[0]):
        return ResolvedCheckpoint(url, FORMAT_TF_V1, step_of(url), f"V1 checkpoint {given}")
    return None


def _resolve_file(given: str, url: str) -> ResolvedCheckpoint:
    """A remote file that is not a TF prefix, by its name, then by its first or last bytes."""
    from ..formats.keras.h5 import is_hdf5, is_keras_archive
    from ..formats.numpy.reader import is_npz
    from ..formats.safetensors.reader import INDEX_SUFFIX, is_safetensors
    from ..formats.tf.table import is_leveldb_table

    lower = path_part(url).lower()
    if has_suffix(url, KERAS_SHARDS):
        return ResolvedCheckpoint(url, FORMAT_KERAS_H5, step_of(url), f"Keras sharded weights {given}")
    shards = shard_set_of(url) if is_h5_name(url) else None
    if shards is not None:  # one shard means its whole set, as for a local path
        return ResolvedCheckpoint(shards, FORMAT_KERAS_H5, step_of(shards),
                                  f"all shards of Keras sharded weights {sibling(given, basename(shards))}")
    if lower.endswith((".safetensors", INDEX_SUFFIX)) or (not lower.endswith(_KERAS_NAMES) and is_safetensors(url)):
        return ResolvedCheckpoint(url, FORMAT_SAFETENSORS, None, f"safetensors file {given}")
    if lower.endswith(".npz") or (not lower.endswith(_KERAS_NAMES) and is_npz(url)):
        return ResolvedCheckpoint(url, FORMAT_NUMPY, None, f"NumPy archive {given}")
    if lower.endswith(_KERAS_NAMES[:2]) or is_hdf5(url):
        return ResolvedCheckpoint(url, FORMAT_KERAS_H5, step_of(url), f"Keras HDF5 weights file {given}")
    if lower.endswith(".keras") and is_keras_archive(url):
        return ResolvedCheckpoint(url, FORMAT_KERAS_H5, step_of(url), f"Keras model archive {given}")
    if is_leveldb_table(url):
        if search_path(V1_SHARD_RE, url):  # one shard means its whole set, as for a local path
            pattern = v1_pattern_of(url)
            return ResolvedCheckpoint(pattern, FORMAT_TF_V1, step_of(pattern), f"all shards of V1 checkpoint {given}")
        return ResolvedCheckpoint(url, FORMAT_TF_V1, step_of(url), f"V1 checkpoint {given}")
    raise CheckpointFormatError(
        f"{quote_name(given)} is a file but not a checkpoint ckptmerge can read: expected a TF checkpoint "
        "prefix (with a '.index' object beside it), a V1 checkpoint file, a .safetensors or .npz file, or a "
        "Keras '.h5'/'.keras' file.", path=given)


def _shard_names(index: str) -> List[str]:
    """The shard file names a remote sharded set's JSON lists (none if it cannot be read)."""
    from ..formats.keras.shards import shard_files

    try:
        return shard_files(index)[1]
    except CkptMergeError:
        return []


def checkpoints_url(directory: str) -> List[CheckpointInfo]:
    """The checkpoints of a remote directory, sorted by step: one listing for all of them.

    Example:
        >>> [c.step for c in checkpoints_url("s3://bucket/run")]  # doctest: +SKIP
        [100, 200]
    """
    url = strip_slash(directory)
    if not remote_isdir(url):
        raise CheckpointNotFoundError(f"{quote_name(directory)} is not a directory (no objects below it).",
                                      path=directory)
    names = {e["name"]: e for e in remote_listdir(url)}
    if not any(n.endswith(INDEX) or is_h5_name(n) for n in names):  # a CheckpointManager root of Orbax steps?
        orbax = orbax_listing(url)
        if orbax:
            return [CheckpointInfo(o.path, o.step, o.time, o.size, o.latest) for o in orbax]
    latest = _latest_name(url, names)
    data: Dict[str, int] = {}  # prefix -> bytes of its data shards, in one pass (linear in the listing)
    for n, e in names.items():
        m = DATA_RE.search(n)
        if m:
            data[n[: m.start()]] = data.get(n[: m.start()], 0) + e["size"]
    out = []
    keras = set(keras_weight_files(names))
    for n, e in names.items():
        if n in keras:  # a Keras weights file (a sharded set by its JSON), as a local listing shows it
            size = e["size"]
            if n.endswith(KERAS_SHARDS):
                size += sum(names[f]["size"] for f in _shard_names(join(url, n)) if f in names)
            out.append(CheckpointInfo(join(url, n), step_of(n), e["mtime"] or 0.0, size, False))
            continue
        if not n.endswith(INDEX) or len(n) == len(INDEX):
            continue
        prefix = n[: -len(INDEX)]
        size = e["size"] + data.get(prefix, 0)
        out.append(CheckpointInfo(join(url, prefix), step_of(prefix), e["mtime"] or 0.0, size, prefix == latest))
    return sorted(out, key=lambda c: (c.step is None, c.step or 0, c.path))
