"""Structural alignment, pure: which source tensor feeds which target when the names differ.

Holds: ``align`` (evidence scoring and global assignment), ``features`` (what it reads in a name:
tokens, numbered-series templates and positions), ``entries`` (what it returns: matches,
unresolved groups, map entries), ``layouts`` (framework layouts such as PyTorch's, as data),
``conventions`` (the naming-convention table read as evidence) and ``tensorops`` (the reshapes and
splits a transfer needs, each with its inverse).

May import: ``formats`` (specs and dtypes only) and the bottom layer (``core``).
"""
