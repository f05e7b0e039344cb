"""Following a training run: each new complete checkpoint as it arrives (``cm.watch``, ``Restorer.follow``).

Holds: ``watch`` (:func:`~ckptmerge.watch`: a looking thread, a queue, each new complete
checkpoint in step order), ``scan`` (one look at a directory: its step-numbered checkpoints and
whether each is complete yet) and ``pins`` (hard links, or the bytes, holding a checkpoint while
it is read, so a trainer's cleanup cannot delete it under the reader).

May import: ``sources``, ``restoring`` (never TF), ``render``, ``planning``, ``alignment``,
``formats`` and the bottom layer (``core``). Never ``cli``, ``api``, ``config``, ``merging`` or
``combining``.
"""
