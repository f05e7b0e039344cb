"""Bytes in and out: local and remote storage, safe file opening, copies and atomic outputs.

Holds: ``storage`` (local files and URLs through fsspec, ranged reads), ``fileio``, ``bytecopy``,
``localfile`` (regular files only, within the size the reader allows) and ``output_prefix``
(locks, temporary names and the atomic publish of outputs).

May import: the bottom modules only.
"""
