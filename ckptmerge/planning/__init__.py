"""Planning, pure: names, shapes and specs in, plans out; no file or TF access.

Holds: ``rules`` (map, regex, include/exclude), ``patterns`` (user patterns in linear time),
``planner`` (sources and targets into a :class:`~ckptmerge.Plan`), ``model`` (the plan and its
findings as data), ``findings``, ``nameshifts`` (Keras auto-name shifts), ``casts``,
``transforms`` (Slice, Transpose, VocabRemap), ``chains`` (which transforms apply to a target,
applied in order) and ``suggestion`` (a plan plus an alignment as a
reviewed config).

May import: ``alignment``, ``formats`` (specs and dtypes only) and the bottom layer (``core``). The plan
reaches ``render`` and ``restoring`` only late-bound, by module name, for ``plan.report()`` and
``plan.restore()``.
"""
