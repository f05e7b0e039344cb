"""Short source labels for reports read by people: a long path shown once, a short label after.

A source named by its path (no ``name=``) is labelled with the whole path, which a report would
otherwise repeat on every line (``/home/me/runs/exp-12/ckpt-300:'dense/kernel'``). In text
reports the ``Sources:`` header shows the path once, and the lines after it use the path's last
component (with as many parents as it takes to tell the sources apart). JSON (``to_dict``) keeps
the labels as they are.
"""

from __future__ import annotations

import re
from typing import Dict, Iterable, List, Tuple

__all__ = ["ShortLabels"]

#: A label at least this long and holding a ``/`` is shortened even when it is relative.
_LONG = 40


def _is_long_path(label: str) -> bool:
    return "/" in label.rstrip("/") and (label.startswith(("/", "~")) or "://" in label or len(label) >= _LONG)


class ShortLabels:
    """The short label of each source whose label is a long path, and the text rewritten to use it.

    Example:
        >>> labels = ShortLabels(["/data/runs/a/ckpt-3", "/data/runs/b/ckpt-3", "B"])
        >>> labels.short("/data/runs/a/ckpt-3"), labels.short("B")
        ('a/ckpt-3', 'B')
        >>> labels("dense/kernel <- /data/runs/b/ckpt-3:'dense/kernel'")
        "dense/kernel <- b/ckpt-3:'dense/kernel'"
    """

    def __init__(self, labels: Iterable[str]) -> None:
        labels = list(dict.fromkeys(labels))
        taken = set(labels)
        parts = {label: [p for p in label.rstrip("/").split("/") if p] for label in labels if _is_long_path(label)}
        self._short: Dict[str, str] = {}
        depth = {label: 1 for label in parts}
        while parts:
            guess = {label: "/".join(ps[-depth[label]:]) for label, ps in parts.items()}
            clash = {g for g in guess.values() if list(guess.values()).count(g) > 1 or g in taken - set(parts)}
            for label in list(parts):
                g = guess[label]
                if g not in clash:
                    if g != label:
                        self._short[label] = g
                    del parts[label]
                elif depth[label] >= len(parts[label]):  # no shorter form tells it apart: as it is
                    del parts[label]
                else:
                    depth[label] += 1
        found = sorted(self._short, key=len, reverse=True)
        # a label as a whole token: not inside a longer path or name
        self._pattern = (re.compile(r"(?<![\w./~-])(" + "|".join(map(re.escape, found)) + r")(?=[:'\"\s),]|$)")
                         if found else None)

    def short(self, label: str) -> str:
        """The label shown after the header (the label itself when it is short already)."""
        return self._short.get(label, label)

    def __call__(self, text: str) -> str:
        """``text`` with every long label in it replaced by its short one."""
        if self._pattern is None:
            return text
        return self._pattern.sub(lambda m: self._short[m.group(1)], text)

    def lines(self, lines: List[str]) -> List[str]:
        """:meth:`__call__` on each line."""
        return [self(line) for line in lines] if self._pattern is not None else lines

    def pairs(self) -> List[Tuple[str, str]]:
        """``(long, short)`` for each label shortened."""
        return sorted(self._short.items())
