"""Checkpoint arithmetic: averages, EMAs, soups and task-vector merges of many checkpoints, as a source.

``cm.combine([...])`` returns a :class:`~ckptmerge.CombinedSource`, a source like any other: it is
planned and restored through ``cm.plan``/``cm.restore`` and written by ``cm.merge`` (``merging/``),
streamed tensor by tensor and chunk by chunk.

Holds: ``combine`` (:func:`~ckptmerge.combine`, the source and its streaming), ``inputs`` (which
checkpoints a combination takes, how their names line up, the policies),
``methods`` (the math of every method, pure NumPy over one chunk), ``selection`` (TIES's
exact magnitude cut in bounded memory), ``params`` (what each
parameter accepts, checked alike for the API, the CLI and config files; gradient lists over
layers), ``blocks`` (chunks made from
the inputs' chunks or element ranges in bounded memory) and ``report`` (what a combination did,
as text and HTML).

May import: ``following`` (a run's checkpoints), ``sources``, ``restoring`` (never TF),
``render``, ``planning``, ``alignment``, ``formats`` and the bottom layer (``core``). Never
``cli``, ``api``, ``config`` or ``merging``.
"""
