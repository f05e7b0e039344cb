"""Rendering: plans, reports and suggestions as text, JSON and notebook HTML. Nothing here prints.

Holds: ``report`` (text reports and verdicts) and ``notebook`` (HTML for ``_repr_html_``).
(JSON is written a piece at a time by the bottom module ``ckptmerge.core.jsonout``.)

May import: ``planning``, ``alignment``, ``formats`` and the bottom layer (``core``).
"""
