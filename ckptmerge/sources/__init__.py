"""Sources: where values come from, and how a path, a directory or a URL becomes one checkpoint.

Holds: ``source`` (:class:`~ckptmerge.Source`), ``handles`` (the opened handles: checkpoint,
memory), ``layout`` (a source seen through a framework layout), ``resolve`` (the one dispatcher from a path or URL to a checkpoint), ``files`` (local
resolution), ``remote`` (resolution by URL), ``state`` (``checkpoint`` state files). Following a
run as it is written is ``following/``, one layer up.

May import: ``restoring`` (a live model can be a source: its object walk), ``render``, ``planning``,
``alignment``, ``formats`` and the bottom layer (``core``). Never ``cli``, ``api``, ``config``,
``merging``, ``combining`` or ``following``.
"""
