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

What is on disk (file names, formats sniffed from bytes, sizes, why a path is not a checkpoint)
is :mod:`ckptmerge.sources.files`; the state file is :mod:`ckptmerge.sources.state`; URLs are
:mod:`ckptmerge.sources.remote`. This module is the one place that
chooses between the local path (:mod:`ckptmerge.sources.local`) and the remote one.
"""

from __future__ import annotations

from typing import Any, List, Optional, Tuple

from ..core.args import check_path, check_step
from ..core.errors import (
    ArgumentError,
    ArgumentTypeError,
)
from ..formats.io.storage import is_url
from ..formats.io.urlpath import basename, dirname, path_part
from .files import (
    FORMAT_KERAS_H5,
    FORMAT_NUMPY,
    FORMAT_SAFETENSORS,
    FORMAT_TF_BUNDLE,
    FORMAT_TF_V1,
    STATE_FILE,
    PathArg,
)
from .local import checkpoints_local, resolve_local
from .orbax import FORMAT_ORBAX
from .resolved import CheckpointInfo, ResolvedCheckpoint
from ..core.redact import get_logger
from .state import CheckpointState
from .state import read_state_file as read_local_state_file

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
    "FORMAT_ORBAX",
]

logger = get_logger(__name__)



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
        from .remote import checkpoints_url

        return checkpoints_url(given)
    return checkpoints_local(given)


def read_state_file(directory: PathArg) -> Optional[CheckpointState]:
    """Parse a directory's ``checkpoint`` state file, on disk or by URL, without TensorFlow.

    Args:
        directory: the checkpoint directory, or the state file itself (a path or a URL).

    Returns:
        The :class:`CheckpointState` (a URL's paths are URLs), or ``None`` when there is no state file.

    Raises:
        CheckpointNotFoundError: a local ``directory`` does not exist.
        CheckpointFormatError: the state file cannot be read or parsed.

    Example:
        >>> read_state_file("s3://bucket/run").model_checkpoint_path  # doctest: +SKIP
        's3://bucket/run/ckpt-200'
    """
    given = check_path(directory, "directory")
    if not is_url(given):
        return read_local_state_file(given)
    from .remote import read_state_url

    if basename(given) == STATE_FILE and not path_part(given).endswith("/"):  # the state file itself
        return read_state_url(dirname(given))
    return read_state_url(given)


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
        from .remote import resolve_url

        return resolve_url(given, step)
    return resolve_local(given, step)


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
    from ..formats import BundleReader, OrbaxReader, open_checkpoint

    if resolved is None:
        resolved = resolve_checkpoint(path, step=step)
    if resolved.format == FORMAT_TF_BUNDLE:  # resolving found its index: not looked for again (a request less by URL)
        return resolved, BundleReader(resolved.prefix, verify=verify)
    if resolved.format == FORMAT_ORBAX:
        return resolved, OrbaxReader(resolved.prefix, verify=verify)
    return resolved, open_checkpoint(resolved.prefix, verify=verify)
