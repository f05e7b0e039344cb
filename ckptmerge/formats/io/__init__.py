"""Bytes in and out: local and remote storage, safe file opening, copies and atomic outputs.

Holds: ``storage`` (local files and URLs through fsspec, ranged reads), ``fileio``, ``bytecopy``,
``localfile`` (regular files only, within the size the reader allows), ``output_prefix``
(locks, temporary names and the atomic publish of outputs) and ``notify`` (waiting for a
directory to change: inotify where there is one, else a timer).

May import: the bottom layer (``core``) only.
"""
