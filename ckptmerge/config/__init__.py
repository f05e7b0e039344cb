"""Config files: one reviewed file for every source, rule, transform and policy of a warm start.

Holds: ``load`` (the front door: :func:`load_config`), ``files`` (reading and parsing within the
safety limits), ``schema`` (validation, with ``FILE:LINE KEYPATH`` problems), ``model``
(:class:`Config`, :class:`SourceConfig`), ``env`` (``$VAR`` expansion and path resolution) and
``problems`` (key paths, line locators and the wording of problems).

May import: ``combining`` (a ``combine:`` source), ``following``, ``sources``, ``restoring``,
``render``, ``planning``, ``alignment``, ``formats`` and the bottom layer (``core``). Never
``cli``, ``api`` or ``merging``.

Example:
    >>> from ckptmerge.config import load_config
    >>> cfg = load_config({"sources": [{"path": "runs/a"}]}, check_paths=False)   # doctest: +SKIP
"""

from .load import (
    MAX_CONFIG_BYTES,
    MAX_NESTING,
    SLICE_KEYS,
    SOURCE_KEYS,
    TOP_LEVEL_KEYS,
    VOCAB_KEYS,
    Config,
    RemoteURL,
    SourceConfig,
    load_config,
)

__all__ = ["Config", "SourceConfig", "RemoteURL", "load_config", "TOP_LEVEL_KEYS", "SOURCE_KEYS", "VOCAB_KEYS",
           "SLICE_KEYS", "MAX_CONFIG_BYTES", "MAX_NESTING"]
