"""Offline merges: many sources into one new checkpoint on disk or in object storage.

Holds: ``local`` (the plan, the per-tensor jobs and the atomic local publish), ``remote`` (the
same outputs written to a URL), and the one place that chooses between them.

A combination (``combining/``) is merged as any other source.

May import: ``combining``, ``following``, ``sources``, ``restoring`` (never TF: merges stay
TF-free), ``render``, ``planning``, ``alignment``, ``formats`` and the bottom layer (``core``).
Never ``cli``, ``api`` or ``config``.
"""
