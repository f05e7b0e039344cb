"""The bottom layer: what every other folder of the package uses, importing nothing of ours above it.

Holds: ``errors`` (the error family rooted at :class:`~ckptmerge.CkptMergeError`), ``specs``
(:class:`~ckptmerge.VariableInfo`, names normalised in one place), ``text`` (quoting, escaping,
plurals, sizes), ``args`` (argument checks with clear errors), ``gcpause`` (the collector paused
around many small acyclic objects), ``jsonout`` (JSON written a piece at a time), ``knobs``
(``CKPTMERGE_*`` settings, checked when used), ``redact`` (the one redaction of URL credentials
and the package's redacting loggers), ``compat`` (old module paths, kept for one release with
a ``DeprecationWarning``), ``interrupts`` (the ``ckptmerge`` program's Ctrl-C handler, from its
first line) and ``limits`` (running out of open files or memory, said as such).

May import: the standard library, NumPy and each other only; nothing else of ckptmerge.
"""
