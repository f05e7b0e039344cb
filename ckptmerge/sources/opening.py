"""Many sources at once: what users pass as ``sources`` (paths, dicts of arrays, :class:`Source`
objects, or a list of them) made into sources, their labels checked, and all opened or none.

:func:`ckptmerge.plan`, :func:`ckptmerge.merge` and :class:`ckptmerge.Restorer` share these.
"""

from __future__ import annotations

import os
from typing import Any, Dict, List, Mapping, Optional, Sequence, Union

from ..core.args import received
from ..core.errors import ArgumentError, ArgumentTypeError, CkptMergeError
from ..core.text import quote_name
from .source import Source
from .handles import SourceHandle

__all__ = ["SourceArg", "SourcesArg", "as_sources", "check_unique_labels", "open_sources"]

SourceArg = Union[Source, str, "os.PathLike[str]", Mapping[str, Any]]
SourcesArg = Union[SourceArg, Sequence[SourceArg]]


def as_sources(sources: SourcesArg) -> List[Source]:
    """Sources as :class:`Source` objects: paths and dicts of arrays/tensors (in memory) are
    wrapped; several dicts are labelled ``memory[i]`` by their position.

    Example:
        >>> [s.label for s in as_sources(["runs/A", {"w": [1.0]}])]
        ['runs/A', 'memory']
    """
    if isinstance(sources, (Source, str, os.PathLike, Mapping)):
        sources = [sources]
    if not hasattr(sources, "__iter__"):
        raise ArgumentTypeError("sources must be a ckptmerge.Source, a checkpoint path, a dict of arrays, or "
                                f"a list of them, got {type(sources).__name__}. {received('sources', sources)}")
    sources = list(sources)
    n_dicts = sum(isinstance(s, Mapping) for s in sources)
    out = []
    for i, s in enumerate(sources):
        if isinstance(s, Source):
            out.append(s)
        elif isinstance(s, (str, os.PathLike)):
            out.append(Source(s))
        elif isinstance(s, Mapping):
            out.append(Source.from_values(s, name="memory" if n_dicts == 1 else f"memory[{i}]"))
        else:
            raise ArgumentTypeError(
                "sources must be ckptmerge.Source objects, checkpoint paths or dicts of "
                f"arrays; sources[{i}] is {s!r:.60} ({type(s).__name__}). {received('sources', sources)}"
            )
    if not out:
        raise ArgumentError("No sources given: pass at least one ckptmerge.Source or checkpoint path. "
                            f"{received('sources', sources)}")
    return out


def check_unique_labels(sources: List[Source]) -> None:
    """Raise when two sources share a label (reports and findings name sources by label).

    Example:
        >>> check_unique_labels([Source("runs/A", name="a"), Source("runs/B", name="b")])
    """
    seen: Dict[str, int] = {}
    for s in sources:
        seen[s.label] = seen.get(s.label, 0) + 1
    dups = sorted(k for k, v in seen.items() if v > 1)
    if dups:
        raise CkptMergeError(
            f"Two sources share the label {', '.join(repr(d) for d in dups)}; "
            "give each a distinct name=..., e.g. Source(path, name='encoder')."
        )


def open_sources(sources: List[Source], *, verify: bool = True,
                 resolved: Optional[List[Any]] = None) -> List[SourceHandle]:
    """Open every source (``resolved``: what each already resolved to), closing the ones already
    opened if one fails.

    Example:
        >>> handles = open_sources(as_sources(["runs/A"]))   # doctest: +SKIP
    """
    handles: List[SourceHandle] = []
    try:
        for i, s in enumerate(sources):
            try:
                handles.append(s.open(verify=verify, resolved=resolved[i] if resolved else None))
            except CkptMergeError as e:  # say which source, when several could be meant
                if len(sources) > 1 and e.args and isinstance(e.args[0], str):
                    e.args = (f"source {quote_name(s.label)}: {e.args[0]}",) + e.args[1:]
                raise
    except BaseException:
        for h in handles:
            h.close()
        raise
    return handles
