"""Sources: where values come from, and how a path, a directory or a URL becomes one checkpoint.

Holds: ``source`` (:class:`~ckptmerge.Source` and the opened handles: checkpoint, memory,
layout), ``resolve`` (the one dispatcher from a path or URL to a checkpoint), ``files`` (local
resolution), ``remote`` (resolution by URL), ``state`` (``checkpoint`` state files), and
following a training run: ``watch`` (each new complete checkpoint as it arrives), ``watchscan``
(one look at a directory: candidates, completeness) and ``pins`` (holding a checkpoint while it
is read: hard links, or its bytes).

May import: ``restoring`` (a live model can be a source: its object walk), ``render``, ``planning``,
``alignment``, ``formats`` and the bottom modules. Never ``cli``, ``api``, ``config`` or ``merging``.
"""
