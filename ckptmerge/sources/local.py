"""Resolution on the local file system: prefixes, files, directories, steps and state files.

:func:`resolve_local` and :func:`checkpoints_local` are what :mod:`ckptmerge.sources.resolve`
calls for a path that is not a URL (URLs go to :mod:`ckptmerge.sources.remote`). What is on disk
(file names, formats sniffed from bytes, sizes) is :mod:`ckptmerge.sources.files`; the state file
is :mod:`ckptmerge.sources.state`; what a directory holds, the checkpoints of its run, is
:mod:`ckptmerge.sources.runs`. Nothing here reads tensors or imports TensorFlow.
"""


from __future__ import annotations

import os
from typing import List, Optional, Tuple

from ..core.errors import (
    ArgumentError,
    CheckpointFormatError,
    CheckpointNotFoundError,
    CkptMergeError,
    UnsafeCheckpointError,
    format_list,
    ResourceLimitError,
)
from ..formats.keras.shards import lone_shard_error, shard_set_of
from ..core.redact import get_logger
from ..core.text import escape_name, quote_name, quoted_command
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
    array_dir_format,
    display_path,
    index_exists,
    is_h5_name,
    is_hdf5,
    not_found_error,
    prefix_exists,
    shown_path,
    step_of,
    v1_format,
    v1_pattern_exists,
    v1_pattern_of,
    v1_shard,
)
from .listing import list_run
from .orbax import FORMAT_ORBAX, ORBAX_LOOKED_FOR, orbax_folder, orbax_listing, orbax_near_miss, orbax_root
from .resolved import CheckpointInfo, ResolvedCheckpoint
from .runs import KIND_FOLDER, Run, RunCheckpoint

__all__ = ["checkpoints_local", "resolve_local"]

logger = get_logger(__name__)


# --------------------------------------------------------------------------------------------
# listing a directory: the checkpoints of its run (ckptmerge.sources.runs)


def _saved_model_prefix(directory: str) -> Optional[str]:
    if os.path.isfile(os.path.join(directory, "saved_model.pb")) or os.path.isfile(
        os.path.join(directory, "saved_model.pbtxt")
    ):
        return os.path.join(os.path.abspath(directory), "variables", "variables")
    return None


def checkpoints_local(given: str) -> List[CheckpointInfo]:
    """:func:`ckptmerge.checkpoints` of a local directory (``given`` as the user wrote it).

    Example:
        >>> [c.step for c in checkpoints_local("runs/A")]   # doctest: +SKIP
        [1, 9, 10]
    """
    if not os.path.isdir(given) and os.path.isfile(given + ".index"):
        parent = os.path.dirname(given) or "."
        raise ArgumentError(
            f"{quote_name(given)} is a checkpoint prefix, not a directory. {quoted_command('checkpoints', parent)} "
            f"lists the checkpoints of its directory; {quoted_command('ls', given)} shows this one.")
    if not os.path.exists(given):
        raise not_found_error(given)
    if not os.path.isdir(given):
        raise ArgumentError(
            f"{quote_name(given)} is not a directory. Pass the directory holding the checkpoints; "
            f"{quoted_command('ls', given)} (or ckptmerge.list_variables) inspects a single checkpoint."
        )
    run = list_run(given)
    if not run.checkpoints:  # a CheckpointManager root of Orbax steps its look does not recognise?
        orbax = orbax_listing(given)
        if orbax:
            return [CheckpointInfo(path=o.path, step=o.step, time=o.time, size=o.size, latest=o.latest)
                    for o in orbax]
    return run.infos()


# --------------------------------------------------------------------------------------------
# resolving
def _resolve_file(given: str, abs_path: str, note: str) -> ResolvedCheckpoint:
    """A regular file that is not a V2 prefix: Keras HDF5, V1 table, safetensors, NumPy, or
    not a checkpoint."""
    fmt = _array_file_format(abs_path)
    if fmt:
        return ResolvedCheckpoint(abs_path, fmt, None, note or f"{fmt} file {given}")
    if abs_path.endswith(KERAS_SHARDS):
        return ResolvedCheckpoint(abs_path, FORMAT_KERAS_H5, step_of(abs_path),
                                  note or f"Keras sharded weights {given}")
    shards = shard_set_of(abs_path) if is_h5_name(abs_path) else None
    if shards is not None:  # one shard means its whole set, as for a V1 shard
        shown = display_path(os.path.dirname(given), os.path.basename(shards))
        return ResolvedCheckpoint(shards, FORMAT_KERAS_H5, step_of(shards),
                                  note or f"all shards of Keras sharded weights {shown}")
    lone = lone_shard_error(abs_path, given) if is_h5_name(abs_path) else None
    if lone is not None:  # a shard without its set's JSON: part of a model
        raise lone
    if is_h5_name(abs_path) or is_hdf5(abs_path):
        return ResolvedCheckpoint(abs_path, FORMAT_KERAS_H5, step_of(abs_path),
                                  note or f"Keras HDF5 weights file {given}")
    if abs_path.endswith(".keras"):
        from ..formats.keras.h5 import is_keras_archive

        if is_keras_archive(abs_path):  # its weights are read in place, named from config.json
            return ResolvedCheckpoint(abs_path, FORMAT_KERAS_H5, step_of(abs_path),
                                      note or f"Keras model archive {given}")
        raise CheckpointFormatError(
            f"{quote_name(given)} is not a Keras '.keras' model archive: it is not a zip file holding "
            "'model.weights.h5'. It is damaged or was saved in another format; re-copy it, or "
            "save the model again with model.save('model.keras').",
            path=given,
        )
    v1 = v1_format(abs_path)
    if v1 is not None:
        if v1 != abs_path:
            note = note or f"all shards of V1 checkpoint {given}"
        return ResolvedCheckpoint(v1, FORMAT_TF_V1, step_of(v1), note or f"V1 checkpoint {given}")
    hint = ""
    for ext in (".meta", ".pb", ".pbtxt", ".json"):
        if abs_path.endswith(ext) and prefix_exists(abs_path[: -len(ext)]):
            hint = f" Did you mean the checkpoint prefix {quote_name(given[: -len(ext)])}?"
            break
    raise CheckpointFormatError(
        f"{quote_name(given)} is a file but not a checkpoint ckptmerge can read: expected a TF "
        "checkpoint prefix (with a '.index' file beside it), one of its '.index'/'.data-*' "
        "files, a V1 checkpoint file, a checkpoint or SavedModel directory, or a Keras '.h5' "
        f"weights file.{hint}",
        path=given,
    )


def _from_prefix(given: str, abs_prefix: str, note: str) -> ResolvedCheckpoint:
    return ResolvedCheckpoint(abs_prefix, FORMAT_TF_BUNDLE, step_of(abs_prefix), note)


def _array_file_format(path: str) -> str:
    """``FORMAT_SAFETENSORS`` or ``FORMAT_NUMPY`` for such a file, else ``""`` (by name, then content)."""
    from ..formats.numpy.reader import is_npz
    from ..formats.safetensors.reader import INDEX_SUFFIX, is_safetensors

    if path.endswith((".safetensors", INDEX_SUFFIX)) or is_safetensors(path):
        return FORMAT_SAFETENSORS
    if path.endswith(".npz") or is_npz(path):
        return FORMAT_NUMPY
    return ""


def _array_dir_format(directory: str) -> str:
    """The format of a folder of safetensors shards or ``.npy`` files (in it, or in folders
    below it), else ``""``."""
    from ..formats.numpy.reader import holds_npy

    try:
        fmt = array_dir_format(os.listdir(directory))
    except OSError:
        return ""
    return fmt or (FORMAT_NUMPY if holds_npy(directory) else "")


def _resolve_recorded(given_dir: str, abs_dir: str, run: Run, prefix: str,
                      recorded: str, what: str) -> Tuple[str, str, str]:
    """Check that a checkpoint named by the state file exists; return (prefix, format,
    relocation note)."""
    shown_state = display_path(given_dir, STATE_FILE)
    located = prefix
    fmt = ""
    if index_exists(prefix):
        fmt = FORMAT_TF_BUNDLE
    elif os.path.isfile(prefix) and (is_h5_name(prefix) or is_hdf5(prefix) or prefix.endswith(KERAS_SHARDS)):
        fmt = FORMAT_KERAS_H5
    elif v1_format(prefix) is not None or v1_shard(prefix):
        prefix, fmt = v1_format(prefix) or v1_pattern_of(v1_shard(prefix) or ""), FORMAT_TF_V1
    if not fmt:
        shown_index = shown_path(prefix, abs_dir, given_dir) + INDEX
        also = ""
        if os.path.isabs(recorded):
            local = display_path(given_dir, os.path.basename(recorded.rstrip("/\\"))) + INDEX
            if local != shown_index:
                also = f" (nor does {quote_name(local)})"
        raise CheckpointNotFoundError(
            f"{quote_name(shown_state)} names {quote_name(recorded)} as the {what}, but its index file "
            f"{quote_name(shown_index)} does not exist{also}: deleted, moved, or still being written? "
            f"Steps there: {run.steps_text()}. Pass a step (e.g. step=N) or a checkpoint "
            f"prefix, or run {quoted_command('checkpoints', given_dir)} to list them.",
            path=given_dir,
        )
    reloc = ""
    if os.path.normpath(os.path.join(abs_dir, recorded)) != located:
        reloc = f"; recorded as {quote_name(recorded)}, found in {given_dir}"
    return prefix, fmt, reloc


def _resolve_dir(given: str, step: Optional[int]) -> ResolvedCheckpoint:
    abs_dir = os.path.abspath(given)
    orbax = orbax_folder(given, step)  # (first: an old Orbax item's 'checkpoint' file is no state file)
    if orbax is not None:
        return ResolvedCheckpoint(orbax[0], FORMAT_ORBAX, orbax[1], orbax[2])
    sm = _saved_model_prefix(given)
    if sm is not None:
        if not index_exists(sm):
            raise CheckpointNotFoundError(
                f"{quote_name(given)} is a SavedModel directory without variables: "
                f"{quote_name(display_path(given, os.path.join('variables', 'variables.index')))} does not exist "
                "(a model without variables, or an incomplete copy).",
                path=given,
            )
        if step is not None:
            raise ArgumentError(
                f"step={step} was given, but {quote_name(given)} is a SavedModel directory, which holds "
                "one set of variables and no steps. Drop step, or pass the training directory "
                "that holds the step's checkpoint."
            )
        return ResolvedCheckpoint(sm, FORMAT_TF_BUNDLE, None, f"variables of SavedModel {given}")

    run = list_run(given)
    state = run.state
    shown_state = display_path(given, STATE_FILE)

    if step is not None:
        orbax = orbax_root(given, step) if not run.checkpoints or run.orbax_root else None  # a manager root
        if orbax is not None:
            return ResolvedCheckpoint(orbax[0], FORMAT_ORBAX, orbax[1], orbax[2])
        return _resolved(run.pick(step), f"step {step} of {given}")

    if state is not None and state.recorded_model_checkpoint_path:
        recorded = state.recorded_model_checkpoint_path
        if state.model_checkpoint_path is None:  # it names a checkpoint outside the directory
            raise _outside_latest(given, abs_dir, run, recorded)
        unsafe = {u.path: u for u in run.unsafe}  # checkpoints whose files lead outside: never read
        if state.model_checkpoint_path in unsafe:
            raise unsafe[state.model_checkpoint_path].error(given)
        prefix, fmt, reloc = _resolve_recorded(given, abs_dir, run, state.model_checkpoint_path, recorded,
                                               "latest checkpoint")
        if prefix in unsafe:
            raise unsafe[prefix].error(given)
        s = step_of(prefix)
        detail = f"step {s}" if s is not None else os.path.basename(prefix)
        return ResolvedCheckpoint(prefix, fmt, s,
                                  f"latest checkpoint per {shown_state} ({detail}{reloc})")
    if state is not None:
        logger.warning("%s names no model_checkpoint_path; looking at the files instead",
                       shown_state)

    orbax = orbax_root(given, None) if run.orbax_root else None  # Orbax's own rule: its latest finalised step
    if orbax is not None:
        return ResolvedCheckpoint(orbax[0], FORMAT_ORBAX, orbax[1], orbax[2])
    why = "no 'checkpoint' state file" if state is None else f"{shown_state} names no latest checkpoint"
    chosen = run.choose(why)
    if chosen is not None:
        return _resolved(*chosen)

    fmt = _array_dir_format(given)
    if fmt:
        return ResolvedCheckpoint(abs_dir, fmt, None, f"{fmt} files in {given}")
    orbax = orbax_root(given, None)
    if orbax is not None:
        return ResolvedCheckpoint(orbax[0], FORMAT_ORBAX, orbax[1], orbax[2])

    # Nothing here; point at subdirectories that do hold checkpoints.
    sub_hint = ""
    try:
        subdirs = sorted(n for n in os.listdir(given) if os.path.isdir(os.path.join(given, n)))
    except OSError:
        subdirs = []
    holding = [display_path(given, n) for n in subdirs if _holds_checkpoints(os.path.join(given, n))]
    if holding:
        sub_hint = f" Its subdirectories {format_list(holding)} hold checkpoints; pass one of them."
    raise CheckpointNotFoundError(
        f"No checkpoint in directory {quote_name(given)}: looked for a '{STATE_FILE}' state file, "
        "'*.index' files of TF checkpoints, V1 checkpoint files, a SavedModel ('saved_model.pb' "
        "with 'variables/variables.index'), Keras '*.h5' weights files and sharded sets' "
        f"'*.weights.json', {ORBAX_LOOKED_FOR}.{orbax_near_miss(given)}{sub_hint or _DIR_HINT}",
        path=given,
    )


_DIR_HINT = " Pass the directory a training run saved its checkpoints to, or a checkpoint prefix."


def _holds_checkpoints(folder: str) -> bool:
    try:
        return bool(list_run(folder, state=False).checkpoints) or os.path.isfile(os.path.join(folder, STATE_FILE)) \
            or _saved_model_prefix(folder) is not None or bool(_array_dir_format(folder))
    except ResourceLimitError:  # out of open files or memory: not this file's fault, never skipped
        raise
    except (CkptMergeError, OSError):
        return False


def _resolved(c: RunCheckpoint, note: str) -> ResolvedCheckpoint:
    """The checkpoint of a run as resolution returns it (a step folder: what it holds)."""
    if c.kind == KIND_FOLDER:
        inner = resolve_local(c.path, None)
        return ResolvedCheckpoint(inner.prefix, inner.format, c.step, note)
    return ResolvedCheckpoint(c.path, c.format, c.step, note)


def _outside_latest(given: str, abs_dir: str, run: Run, recorded: str) -> CkptMergeError:
    """The error for a state file whose latest lies outside its directory."""
    located = os.path.normpath(os.path.join(abs_dir, recorded))
    if not (prefix_exists(located) or os.path.isdir(located)):
        try:  # nowhere at all: say so, naming both places looked at
            _resolve_recorded(given, abs_dir, run, located, recorded, "latest checkpoint")
        except CheckpointNotFoundError as e:
            return e
    return UnsafeCheckpointError(
        f"{quote_name(display_path(given, STATE_FILE))} names {quote_name(recorded)} as the latest checkpoint, which "
        f"is outside {quote_name(given)} ({escape_name(os.path.realpath(located))}): ckptmerge reads only checkpoints "
        "inside the directory whose state file names them (TensorFlow would follow the path). Steps there: "
        f"{run.steps_text()}. Pass a step (step=N), pass that checkpoint itself if you mean it, or run "
        f"{quoted_command('checkpoints', given)} to list the directory's own.", path=given)


def resolve_local(given: str, step: Optional[int]) -> ResolvedCheckpoint:
    """:func:`resolve_checkpoint` of a local path (``given`` as the user wrote it, ``step`` checked).

    Example:
        >>> resolve_local("runs/A", 10).note   # doctest: +SKIP
        'step 10 of runs/A'
    """
    abs_path = os.path.abspath(given)
    resolved: Optional[ResolvedCheckpoint] = None

    if given.endswith(INDEX) and os.path.isfile(abs_path):
        prefix = abs_path[: -len(INDEX)]
        resolved = _from_prefix(given, prefix, f"prefix of {given}")
    elif DATA_RE.search(given) and os.path.isfile(abs_path):
        m = DATA_RE.search(abs_path)
        prefix = abs_path[: m.start()]
        shown_prefix = given[: DATA_RE.search(given).start()]
        if not index_exists(prefix):
            raise CheckpointNotFoundError(
                f"{quote_name(given)} is a data shard, but its index file {quote_name(shown_prefix + INDEX)} does not "
                "exist, so the checkpoint is incomplete (deleted, or still being written?).",
                path=given,
            )
        resolved = _from_prefix(given, prefix, f"prefix of {given}")
    elif index_exists(abs_path):
        resolved = _from_prefix(given, abs_path, f"checkpoint prefix {given}")
    elif os.path.isdir(abs_path):
        return _resolve_dir(given, step)
    elif os.path.isfile(abs_path) and os.path.basename(abs_path) == STATE_FILE:
        # The state file itself: the user means the latest checkpoint it names.
        return _resolve_dir(os.path.dirname(given) or ".", step)
    elif os.path.isfile(abs_path):
        resolved = _resolve_file(given, abs_path, "")
    elif v1_pattern_exists(abs_path):
        resolved = ResolvedCheckpoint(abs_path, FORMAT_TF_V1, step_of(abs_path), f"V1 checkpoint {given}")
    elif v1_shard(abs_path):
        pattern = v1_pattern_of(v1_shard(abs_path) or "")
        resolved = ResolvedCheckpoint(pattern, FORMAT_TF_V1, step_of(pattern),
                                      f"all shards of V1 checkpoint {given}")
    else:
        raise not_found_error(given)

    if step is not None and resolved.step != step:
        has = f"is step {resolved.step}" if resolved.step is not None else "has no step in its name"
        parent = os.path.dirname(given) or "."
        raise ArgumentError(
            f"step={step} was given, but checkpoint {quote_name(given)} {has}. To pick a step, pass the "
            f"directory with the step: Source({quote_name(parent)}, step={step}) in Python, "
            f"{quoted_command('ls', parent, '--step', step)} on the command line; or drop the step."
        )
    return resolved


