"""Find the checkpoint a URL means: prefixes, directories, steps and state files in object storage.

The same rules as :mod:`ckptmerge.sources.resolve` for local paths, over fsspec listings: a URL is a
checkpoint prefix (``s3://b/run/ckpt-10``, its ``.index`` beside it), one of its files, or a
directory: its ``checkpoint`` state file names the latest, ``step=N`` picks a step, and without a
state file the only checkpoint or the highest step is taken: the run's checkpoints are those
:mod:`ckptmerge.sources.runs` defines, listed once (:func:`~ckptmerge.sources.listing.list_run`).
A state file written on another machine names absolute local paths (``/home/me/run/ckpt-10``):
the checkpoint is looked up by base name in the directory the state file is in; any other path
outside the directory is not used.
"""

from __future__ import annotations

import dataclasses
from typing import List, Optional

from ..core.errors import ArgumentError, CheckpointFormatError, CheckpointNotFoundError, UnsafeCheckpointError
from ..formats.io.storage import (
    probe_isfile,
    remote_exists,
    remote_isdir,
)
from ..formats.io.urlpath import (
    add_suffix,
    basename,
    dirname,
    has_suffix,
    join,
    path_part,
    search_path,
    sibling,
    strip_slash,
    strip_suffix,
)
from ..formats.keras.shards import lone_shard_error, shard_set_of
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
    step_of,
    v1_pattern_of,
)
from .listing import list_run, read_state_url
from .orbax import (FORMAT_ORBAX, ORBAX_LOOKED_FOR, ORBAX_MARKERS, orbax_folder, orbax_listing, orbax_near_miss,
                    orbax_root, orbax_step_of)
from .resolved import CheckpointInfo, ResolvedCheckpoint
from .runs import KIND_FOLDER, RunCheckpoint

__all__ = ["resolve_url", "checkpoints_url", "read_state_url"]

_KERAS_NAMES = (".h5", ".hdf5", ".keras")


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
    run = list_run(url, given=given)
    # (a step-named folder without markers: a step of Orbax before 0.6, if it holds only item folders)
    orbax = orbax_folder(url, step) if ORBAX_MARKERS.intersection(run.names) or orbax_step_of(url) is not None \
        else None
    if orbax is not None:
        return ResolvedCheckpoint(orbax[0], FORMAT_ORBAX, orbax[1], orbax[2])
    if step is not None:
        orbax = orbax_root(url, step) if not run.checkpoints or run.orbax_root else None
        if orbax is not None:
            return ResolvedCheckpoint(orbax[0], FORMAT_ORBAX, orbax[1], orbax[2])
        return _resolved(run.pick(step), f"step {step} of {given}")
    state = run.state
    shown_state = join(given, STATE_FILE)
    if state is not None and state.recorded_model_checkpoint_path:
        recorded = state.recorded_model_checkpoint_path
        if state.model_checkpoint_path is None:
            raise UnsafeCheckpointError(
                f"{quote_name(shown_state)} names {quote_name(recorded)} as the latest checkpoint, which is outside "
                f"{quote_name(given)}: ckptmerge reads only checkpoints inside the directory whose state file names "
                f"them (TensorFlow would follow the path). Steps there: {run.steps_text()}. Pass a step (step=N), "
                f"pass that checkpoint itself if you mean it, or run {quoted_command('checkpoints', given)} to list "
                "the directory's own.", path=given)
        latest = run.latest
        if latest is not None and latest.kind != KIND_FOLDER:
            s = latest.step
            return ResolvedCheckpoint(latest.path, latest.format, s, f"latest checkpoint per {shown_state} "
                                      f"({'step ' + str(s) if s is not None else basename(latest.path)})")
        other = _resolve_single(given, state.model_checkpoint_path)
        if other is not None:  # the state file names a V1 checkpoint (a file, or a set's pattern)
            return dataclasses.replace(other, note=f"latest checkpoint per {shown_state}")
        name = basename(state.model_checkpoint_path)
        raise CheckpointNotFoundError(
            f"{quote_name(join(url, STATE_FILE))} names {quote_name(name)} as the latest checkpoint, but "
            f"{quote_name(add_suffix(state.model_checkpoint_path, INDEX))} "
            f"does not exist: deleted, or still being uploaded? Steps there: {run.steps_text()}. Pass a step.",
            path=given)
    orbax = orbax_root(url, None) if run.orbax_root else None  # Orbax's own rule: its latest finalised step
    if orbax is not None:
        return ResolvedCheckpoint(orbax[0], FORMAT_ORBAX, orbax[1], orbax[2])
    chosen = run.choose("no 'checkpoint' state file")
    if chosen is not None:
        return _resolved(*chosen)
    fmt = array_dir_format(run.names)
    if fmt:
        return ResolvedCheckpoint(url, fmt, None, f"{fmt} directory {given}")
    orbax = orbax_root(url, None)
    if orbax is not None:
        return ResolvedCheckpoint(orbax[0], FORMAT_ORBAX, orbax[1], orbax[2])
    raise CheckpointNotFoundError(f"No checkpoint in {quote_name(given)}: no '*.index' object, no "
                                  f"'checkpoint' state file and no {ORBAX_LOOKED_FOR} there."
                                  f"{orbax_near_miss(url)}", path=given)


def _resolved(c: RunCheckpoint, note: str) -> ResolvedCheckpoint:
    """The checkpoint of a run as resolution returns it (a step folder: what it holds)."""
    if c.kind == KIND_FOLDER:
        inner = resolve_url(c.path, None)
        return ResolvedCheckpoint(inner.prefix, inner.format, c.step, note)
    return ResolvedCheckpoint(c.path, c.format, c.step, note)


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
    lone = lone_shard_error(url, given) if is_h5_name(url) else None
    if lone is not None:  # a shard without its set's JSON: part of a model
        raise lone
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


def checkpoints_url(directory: str) -> List[CheckpointInfo]:
    """The checkpoints of a remote directory, sorted by step (the run :func:`~ckptmerge.sources.listing.list_run`
    finds: one listing, and one per step folder).

    Example:
        >>> [c.step for c in checkpoints_url("s3://bucket/run")]  # doctest: +SKIP
        [100, 200]
    """
    url = strip_slash(directory)
    if not remote_isdir(url):
        raise CheckpointNotFoundError(f"{quote_name(directory)} is not a directory (no objects below it).",
                                      path=directory)
    run = list_run(url, given=directory)
    if not run.checkpoints:  # a CheckpointManager root of Orbax steps its look does not recognise?
        orbax = orbax_listing(url)
        if orbax:
            return [CheckpointInfo(o.path, o.step, o.time, o.size, o.latest) for o in orbax]
    return run.infos()
