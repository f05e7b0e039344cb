"""What resolution finds: one checkpoint a path means (:class:`ResolvedCheckpoint`), and the
checkpoints of a directory (:class:`CheckpointInfo`). Shared by the local and the remote paths.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from ..core.redact import redacted_repr

__all__ = ["CheckpointInfo", "ResolvedCheckpoint"]


@dataclass(frozen=True)
class CheckpointInfo:
    """One checkpoint of a directory, as listed by :func:`ckptmerge.checkpoints`.

    Attributes:
        path: the absolute prefix (or the absolute ``.h5`` path).
        step: the trailing ``-N`` of the prefix's base name (``ckpt-10`` -> 10), else ``None``.
        time: when it was written, epoch seconds: the state file's timestamp when one is
            recorded for it, else the modification time of its ``.index`` (or ``.h5``) file.
        size: bytes of the ``.index`` plus all ``.data-*`` shards (or of the ``.h5`` file).
        latest: whether the directory's ``checkpoint`` state file names it as the latest.
        pinned: where :func:`ckptmerge.watch` holds it while the loop is on it (hard links in a
            private folder, or a ``memory://`` copy where links are impossible), else ``None``.

    Example:
        >>> import ckptmerge as cm
        >>> [(c.step, c.latest) for c in cm.checkpoints("runs/A")]  # doctest: +SKIP
        [(1, True), (9, False), (10, False)]
    """

    __repr__ = redacted_repr  # (a REPL, a notebook or a log line shows no credential)

    path: str
    step: Optional[int]
    time: float
    size: int
    latest: bool
    pinned: Optional[str] = None

    @property
    def read_path(self) -> str:
        """Where to read the checkpoint now: :attr:`pinned` when set, else :attr:`path`.

        Example:
            >>> CheckpointInfo("runs/A/ckpt-1", 1, 0.0, 10, True).read_path
            'runs/A/ckpt-1'
        """
        return self.pinned or self.path


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
        >>> from ckptmerge.sources.resolve import resolve_checkpoint
        >>> resolve_checkpoint("runs/A").note  # doctest: +SKIP
        'latest checkpoint per runs/A/checkpoint (step 10)'
    """

    __repr__ = redacted_repr  # (a REPL, a notebook or a log line shows no credential)

    prefix: str
    format: str
    step: Optional[int]
    note: str
