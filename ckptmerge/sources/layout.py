"""A source seen through a framework layout (``Source(..., layout="torch")``).

:class:`LayoutHandle` wraps an opened source: PyTorch's (or another framework's) names become the
target framework's, kernels are transposed and RNN gates reordered on the way
(:mod:`ckptmerge.alignment.layouts` says how, as data), 2-D weights band by band in threads
while the next batch is read. A 2-D weight the layout cannot decide stays a finding until the
user settles it (a ``Transpose`` on its target, or a map onto an Embedding's ``embeddings``).
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
from concurrent.futures import ThreadPoolExecutor
from typing import (
    TYPE_CHECKING,
    Any,
    Dict,
    List,
    Mapping,
    Optional,
    Sequence,
    Tuple,
)

import numpy as np

from ..planning.rules import MapRule, Rules
from ..core.specs import VariableInfo
from .handles import SourceHandle

if TYPE_CHECKING:  # pragma: no cover
    from ..planning.planner import SourceView
    from .source import Source

__all__ = ["LayoutHandle"]


#: Bytes of layout outputs computed per batch while the next batch is read (see LayoutHandle.read).
_LAYOUT_BATCH = 64 << 20
#: Threads that read and transpose 2-D weights band by band (see LayoutHandle.read).
_TRANSPOSERS = 4


class LayoutHandle(SourceHandle):
    """A source seen through a framework layout (``Source(..., layout="torch")``): renamed, with
    kernels transposed and RNN gates reordered on the way (see :mod:`ckptmerge.alignment.layouts`)."""

    def __init__(self, inner: SourceHandle) -> None:
        from ..alignment.layouts import layout_of

        layout = self._settle(layout_of(inner.source.layout, inner.all_variables), inner.source)
        infos, notes = self._listing(layout, inner)
        super().__init__(inner.source, inner.path, inner.note, infos, notes,
                         [*inner.findings, *layout.findings(inner.label)])
        self.inner = inner
        self.entries = layout.entries
        self._layout = layout
        self._by_key = {v.raw_key: v.name for v in inner.all_variables}

    @staticmethod
    def _settle(layout: Any, src: Source) -> Any:
        # An undecided 2-D weight is settled by the user: a Transpose on its target, or a map
        # onto an Embedding's 'embeddings'.
        layout.undecided = [(n, why) for n, why in layout.undecided if not _settled(src, n)]
        return layout

    @staticmethod
    def _listing(layout: Any, inner: SourceHandle) -> Tuple[List[VariableInfo], Dict[str, str]]:
        infos = sorted((e.info for e in layout.entries.values()), key=lambda v: v.name)
        stored = {v.raw_key: tuple(v.shape) for v in inner.all_variables}
        notes = {n: f"layout: {', '.join(e.sources)} {stored.get(e.sources[0], ())}: {e.note}"
                 for n, e in layout.entries.items() if e.note}
        return infos, {**inner.notes, **notes}

    def name_targets(self, targets: Sequence[VariableInfo]) -> None:
        """Let the layout's findings name the target each undecided tensor most likely belongs to,
        and split the fused modules whose parts' sizes only the targets give (a grouped-query
        ``qkv_proj``: see :mod:`ckptmerge.alignment.fused`)."""
        if self._layout.needs_targets:
            from ..alignment.layouts import torch_layout

            layout = self._settle(torch_layout(self.inner.all_variables, targets=targets), self.source)
            self.all_variables, self.notes = self._listing(layout, self.inner)
            self.entries, self._layout = layout.entries, layout
            self.findings = [*self.inner.findings, *layout.findings(self.inner.label)]
        if self._layout.undecided:
            self.findings = [*self.inner.findings, *self._layout.findings(self.inner.label, targets)]

    def view(self, rules: Rules) -> "SourceView":
        """As :meth:`SourceHandle.view`, naming the layout and the tensors it could not decide.

        ``map`` keys may be PyTorch's own names: a raw key that the layout turns into one tensor
        (``model.embed_tokens.weight`` -> ``model/embed_tokens/embeddings``) stands for it, and a
        dotted scope (``model.layers.0.``) for the ``/`` scope the layout writes."""
        return dataclasses.replace(super().view(self._torch_names(rules)), layout=self.source.layout,
                                   undecided=tuple(n for n, _ in self._layout.undecided))

    def _torch_names(self, rules: Rules) -> Rules:
        """``rules`` with each ``map`` key written in the stored spelling (a raw key, or a scope of
        raw keys: ``model.layers.0.``, Flax's ``params/Dense_0/``) put in the layout's spelling,
        where that spelling is certain; the others stay as written (and unmatched, they say so)."""
        if not rules.maps or all(m.source in self.entries for m in rules.maps):
            return rules
        outputs: Dict[str, List[str]] = {}
        for name, e in self.entries.items():
            for k in e.sources:
                outputs.setdefault(k, []).append(name)
        maps = []
        for m in rules.maps:
            source = m.source
            if source not in self.entries:
                if len(outputs.get(source, ())) == 1:
                    source = outputs[source][0]
                elif source.endswith((".", "/")):
                    scope = _layout_scope(source, outputs)
                    if scope is None and source.endswith(".") and any(k.startswith(source) for k in outputs):
                        scope = source.replace(".", "/")  # (a dotted scope: '/' for '.', as PyTorch's)
                    source = scope or source
            maps.append(m if source == m.source else MapRule(source, m.target))
        return dataclasses.replace(rules, maps=tuple(dict.fromkeys(maps)))

    def read(self, names: Sequence[str]) -> Dict[str, Any]:
        """Read the source tensors the named outputs need, then compute each output.

        A transposed 2-D weight that the wrapped source can read in ranges (a local file) is
        read a band of rows at a time and transposed as it comes (no copy of it as stored), on
        a few threads while this one reads the other tensors."""
        streamed = {}
        for n in names:
            ranges = self._band_ranges(self.entries[n])
            if ranges is not None:
                streamed[n] = ranges
        if not streamed:
            return self._read_whole(names)
        workers = min(len(streamed), _TRANSPOSERS, os.cpu_count() or 1)
        pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="ckptmerge-layout")
        try:
            futures = {n: pool.submit(self._transposed, self.entries[n], r) for n, r in streamed.items()}
            out = self._read_whole([n for n in names if n not in streamed])
            for n, fut in futures.items():
                out[n] = fut.result()
        finally:  # (after an error, the transposes not begun are dropped)
            pool.shutdown(wait=True, cancel_futures=True)
        return out

    def _band_ranges(self, e: Any) -> Any:
        """The wrapped source's ranges of the tensor a plain 2-D transpose reads, else ``None``."""
        if e.op != "transpose" or tuple(e.perm) != (1, 0) or len(e.info.shape) != 2:
            return None
        ranges = self.inner.ranges(self._by_key.get(e.sources[0], e.sources[0]))
        if ranges is None or ranges.count != math.prod(e.info.shape) or not ranges.dtype.isnative:
            return None
        return ranges

    @staticmethod
    def _transposed(e: Any, ranges: Any) -> np.ndarray:
        """The transpose of a stored ``(out, in)`` weight, read in bands from ``ranges``."""
        from ..alignment.layouts import transpose_rows_into
        from ..formats.base import aligned_empty

        cols, rows = e.info.shape  # (the output's shape is the stored one reversed)
        span, flat = ranges.span(0, ranges.count), None

        def band(i: int, j: int) -> np.ndarray:
            nonlocal flat
            if flat is None:
                flat = np.empty(min(j - i, rows) * cols, ranges.dtype)
            return span.read(flat[:(j - i) * cols]).reshape(j - i, cols)

        return transpose_rows_into(band, (rows, cols), ranges.dtype, aligned_empty(e.info.shape, ranges.dtype))

    def _read_whole(self, names: Sequence[str]) -> Dict[str, Any]:
        """Read whole source tensors, then compute each output from them."""
        from ..alignment.layouts import apply_entry
        from ..formats.base import aligned_empty

        batches: List[List[Tuple[str, Any]]] = [[]]
        size = 0
        for n in names:  # about _LAYOUT_BATCH bytes each, so reading and transposing overlap
            e = self.entries[n]
            if size >= _LAYOUT_BATCH:
                batches.append([])
                size = 0
            batches[-1].append((n, e))
            size += e.info.nbytes
        out: Dict[str, Any] = {}

        def compute(batch: List[Tuple[str, Any]], raw: Mapping[str, Any]) -> None:
            for n, e in batch:
                values = [np.asarray(raw[self._by_key.get(k, k)]) for k in e.sources]
                # fresh arrays go straight into the aligned buffers restores take without a copy
                buffer = None if e.op == "copy" else aligned_empty(e.info.shape, np.result_type(*values))
                out[n] = apply_entry(e, values, buffer)

        def read(batch: List[Tuple[str, Any]]) -> Mapping[str, Any]:
            return self.inner.read(sorted({self._by_key.get(k, k) for _, e in batch for k in e.sources}))

        if len(batches) == 1:
            compute(batches[0], read(batches[0]))
            return out
        # The next batch is read (by the reader's own threads) while this one is transposed.
        with ThreadPoolExecutor(max_workers=1, thread_name_prefix="ckptmerge-layout") as pool:
            pending = None
            for batch in batches:
                raw = read(batch)
                if pending is not None:
                    pending.result()
                pending = pool.submit(compute, batch, raw)
            pending.result()
        return out

    def close(self) -> None:
        """Close the wrapped source."""
        self.inner.close()


def _parts(name: str) -> List[str]:
    return [p for p in re.split(r"[./]", name) if p]


def _layout_scope(scope: str, outputs: Mapping[str, Sequence[str]]) -> Optional[str]:
    """The layout's spelling of a scope of stored names (``model.layers.0.`` ->
    ``model/layers/0/``, Flax's ``params/Dense_0/`` -> ``Dense_0/``), or ``None`` when it is not
    certain: the layout must drop the same number of leading parts from every name in the scope,
    and the scope it gives must hold every tensor of those names and no other.

    Example:
        >>> _layout_scope("params/Dense_0/", {"params/Dense_0/kernel": ["Dense_0/kernel"],
        ...                                   "params/Dense_1/kernel": ["Dense_1/kernel"]})
        'Dense_0/'
    """
    inside = [(k, n) for k, ns in outputs.items() if k.startswith(scope) for n in ns]
    if not inside:
        return None
    dropped = {len(_parts(k)) - len(n.split("/")) for k, n in inside}
    if len(dropped) != 1:
        return None
    depth = len(_parts(scope)) - dropped.pop()
    heads = {"/".join(n.split("/")[:depth]) for _, n in inside} if depth > 0 else {""}
    if len(heads) != 1 or any(len(n.split("/")) <= depth for _, n in inside):
        return None
    head = heads.pop()
    prefix = head + "/" if head else "/"
    outside = (n for k, ns in outputs.items() if not k.startswith(scope) for n in ns)
    if any(not head or n.startswith(prefix) for n in outside):
        return None
    return prefix


def _settled(source: Source, name: str) -> bool:
    """Whether the user decided an undecided layout tensor: its map target has a Transpose, or is
    an Embedding's ``embeddings``."""
    mapping = dict(source.map_items())
    target = mapping.get(name, mapping.get(name.replace("/", ".")))  # (its own name, or PyTorch's)
    if not isinstance(target, str):
        return False
    if target.rsplit("/", 1)[-1] == "embeddings":
        return True
    from ..planning.transforms import Transpose

    return any(isinstance(t, Transpose) and t.applies_to(target) for t in source.transforms)
