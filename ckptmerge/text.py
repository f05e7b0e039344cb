"""Small text helpers for reports and the command line: counts and byte sizes.

Kept apart from :mod:`ckptmerge.report` so the CLI's inspection commands can use them without
loading the planning engine.
"""

from __future__ import annotations

from typing import Optional

__all__ = ["plural", "human_bytes"]


def plural(n: int, word: str, many: Optional[str] = None) -> str:
    """``"1 variable"``, ``"3 variables"`` (``many`` for irregular plurals).

    Example:
        >>> plural(3, "variable"), plural(1, "entry", "entries")
        ('3 variables', '1 entry')
    """
    return f"{n} {word if n == 1 else (many or word + 's')}"


def human_bytes(n: int) -> str:
    """``"512 B"``, ``"1.5 KiB"``, ``"3.0 MiB"``, ..."""
    if n < 1024:
        return f"{n} B"
    size = float(n)
    for unit in ("KiB", "MiB", "GiB", "TiB"):
        size /= 1024.0
        if size < 1024 or unit == "TiB":
            break
    return f"{size:.1f} {unit}"
