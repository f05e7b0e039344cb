"""Checkpoint arithmetic as a source: :func:`combine` averages, EMAs, soups and task-vector
merges of many checkpoints, streamed tensor by tensor and chunk by chunk.

``cm.combine([...])`` returns a :class:`CombinedSource`, usable wherever a source is: planned and
restored into a live model (``cm.plan`` / ``cm.restore`` / :class:`~ckptmerge.Restorer`, with
every finding), or written by ``cm.merge(combined, out)`` as a TF checkpoint, a
``.safetensors`` or a ``.weights.h5`` file (atomically, as every merge). Nothing is read until
a tensor is asked for; then each output chunk is made from one chunk of each input in turn
(the next input's chunk read by a second thread meanwhile), or, for elementwise methods of local
files, a cache-sized block of every input at a time (:meth:`CombinedHandle._blocked`), so memory
holds a few chunks whatever the number of inputs. The math lives in :mod:`ckptmerge.combining.methods` (pure NumPy);
which inputs a combination takes and how their names line up (the policies: key sets, integers,
dtypes, optimizer state) is :mod:`ckptmerge.combining.inputs`; this module checks the arguments,
makes the source and streams. No TensorFlow.

Example:
    >>> import ckptmerge as cm
    >>> avg = cm.combine("runs/A", last=5)                                     # doctest: +SKIP
    >>> print(avg.report())                                                    # doctest: +SKIP
    >>> cm.merge(avg, "runs/A/avg-last5")                                      # doctest: +SKIP
    >>> cm.restore(model, [avg])                                               # doctest: +SKIP
"""

from __future__ import annotations

import math
import os
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Callable, Dict, Iterator, List, Mapping, Optional, Sequence, Tuple, Union

import numpy as np

from ..core.errors import ArgumentError, ArgumentTypeError, did_you_mean
from ..formats.base import CHUNK_ELEMENTS, aligned_empty
from ..formats.ranges import TensorRanges
from ..planning.casts import cast_array, numpy_dtype
from ..sources.opening import as_sources, check_unique_labels, open_sources
from ..sources.source import Source
from ..sources.handles import SourceHandle
from ..core.specs import VariableInfo
from ..core.text import plural
from .blocks import BlockedChunks, FixedChunks, aligned_step
from .report import CombineReport
from .inputs import FLOATS, Entry, PerInput, choice, line_up, select_inputs
from .methods import CONVENTIONS, METHODS, TensorParams, quiet
from .params import is_number, param_problems, weight_problems

__all__ = ["combine", "CombinedSource", "CombinedHandle", "CombineReport", "KEYS", "INTEGERS", "ACCUMULATE"]

KEYS = ("strict", "intersection", "union")
INTEGERS = ("last", "first", "error")
ACCUMULATE = ("float64", "float32")
_SPLIT = 1 << 16  # chunks at least this long are added in two halves at once

ParamValue = Union[float, int, str, bool, Mapping[str, Any]]


# --------------------------------------------------------------------------------------------
# The source
# --------------------------------------------------------------------------------------------


class CombinedSource(Source):
    """A source whose values are a combination of checkpoints (see :func:`combine`).

    It is not one checkpoint on disk: a :class:`~ckptmerge.Restorer` restores it again by
    reading its inputs again, but cannot switch it to another step, and graph-mode ``Saver``
    objects cannot restore it (``plan.restore()`` does).

    Example:
        >>> avg = combine(["runs/A/ckpt-1", "runs/A/ckpt-2"])            # doctest: +SKIP
        >>> avg.label                                                     # doctest: +SKIP
        'mean of 2'
    """

    def __init__(self, inputs: List[Source], method: str, *, base: Optional[Source], weights: List[Any],
                 dtype: Optional[str], keys: str, integers: str, optimizer: bool, accumulate: str,
                 params: Dict[str, Any], chunk_elements: int, order: str, conventions: str = "ckptmerge",
                 **rules: Any) -> None:
        rules.setdefault("name", f"{method} of {len(inputs)}")
        super().__init__(None, _values={}, optimizer=optimizer, **rules)
        self.inputs = inputs
        self.method = method
        self.base = base
        self.weights = weights
        self.dtype = dtype
        self.keys = keys
        self.integers = integers
        self.accumulate = accumulate
        self.params = params
        self.chunk_elements = chunk_elements
        self.order = order
        self.conventions = conventions

    @property
    def in_memory(self) -> bool:
        """True: the values are computed here, not read as they are from one checkpoint (so a
        Restorer does not switch it, and Savers do not restore it)."""
        return True

    def resolve(self) -> Any:
        """``None``: a combination is not one checkpoint (its inputs resolve when it is opened)."""
        return None

    def read_sources(self) -> List[Source]:
        """The base (if any) and the inputs: what a merge must not write over."""
        return ([self.base] if self.base is not None else []) + list(self.inputs)

    def __repr__(self) -> str:
        return f"CombinedSource({self.method!r}, {len(self.inputs)} inputs{', base' if self.base else ''})"

    def open(self, *, verify: bool = True, resolved: Any = None) -> SourceHandle:
        """Open every input (and the base), line their names up and check the policies; no
        tensor is read.

        Raises:
            CombineError: the inputs differ under ``keys="strict"`` (every difference listed),
                an integer tensor under ``integers="error"``, too few inputs for the method, ...
            CheckpointNotFoundError, CheckpointFormatError: an input cannot be found or read.
        """
        everything = ([self.base] if self.base is not None else []) + list(self.inputs)
        handles = open_sources(everything, verify=verify)
        try:
            base = handles[0] if self.base is not None else None
            ins = handles[1:] if self.base is not None else handles
            handle: SourceHandle = CombinedHandle(self, ins, base)
        except BaseException:
            for h in handles:
                h.close()
            raise
        if self.layout is not None:
            from ..sources.layout import LayoutHandle

            handle = LayoutHandle(handle)
        return handle

    def report(self, *, verify: bool = True) -> CombineReport:
        """What this combination would do (inputs resolved, names lined up; no tensor read).

        Example:
            >>> print(cm.combine("runs/A", last=3).report())                 # doctest: +SKIP
            mean of 3 inputs (steps 800, 900, 1000): 12 tensors
        """
        h = self.open(verify=verify)
        try:
            inner = getattr(h, "inner", h)
            return inner.report
        finally:
            h.close()


class CombinedHandle(SourceHandle):
    """An opened :class:`CombinedSource`: the combined names, and their values on demand.

    Attributes:
        report: the :class:`~ckptmerge.combining.report.CombineReport`.
        inputs: the opened inputs (combining order); ``base`` the opened base or ``None``.
    """

    streams = True

    def __init__(self, source: CombinedSource, inputs: List[SourceHandle], base: Optional[SourceHandle]) -> None:
        self.inputs = inputs
        self.base = base
        self.method = METHODS[source.method]
        self._pool: Optional[ThreadPoolExecutor] = None
        self._after: Dict[str, str] = {}  # read_order: the name asked for after each
        self._ahead: Optional[Tuple[str, BlockedChunks]] = None  # the next tensor, started early
        entries, report = line_up(source, inputs, base, self.method)
        self.entries = entries
        self._renamed: Dict[str, str] = {}
        self.report = report
        infos = [e.spec for e in entries.values()]
        note = report.summary()
        # The names keys='union' combined over fewer inputs, or 'intersection' left out, are the
        # policy the caller chose, not findings: they do not block a strict plan (under 'strict'
        # there are none, line_up raised instead). The report lists every one of them.
        findings: List[str] = []
        super().__init__(source, f"<{source.label}>", note, infos, findings=findings)
        for name, k, n in report.fewer:  # (a plan's and a merge's report show it beside the name)
            self.notes[name] = f"combined over {k} of {n} inputs (keys={source.keys!r})"
        steps = source.chunk_elements // max(1, self.method.state)
        self.step = max(1, steps)

    @property
    def format(self) -> Optional[str]:
        """The inputs' format when they all share one (a combination of Keras weights files is
        named by a Keras model's walk as each of them would be), else ``None``."""
        kinds = {h.format for h in self.inputs}
        return kinds.pop() if len(kinds) == 1 else None

    @property
    def renamed(self) -> Dict[str, str]:
        """``{combined name: name}`` of the tensors :meth:`rename` renamed."""
        return dict(self._renamed)

    def rename(self, names: Mapping[str, str], notes: Mapping[str, str] = {}) -> None:
        """Give combined tensors new names (``{name: new name}``, e.g. by a Keras model's walk)."""
        entries: Dict[str, Entry] = {}
        for old, e in self.entries.items():
            new = names.get(old, old)
            if new != old:
                self._renamed[old] = new
                spec = e.spec
                e = Entry(VariableInfo(new, spec.shape, spec.dtype, old, spec.kind, spec.nbytes), e.inputs, e.base,
                           e.params)
            entries[e.spec.name] = e
        self.entries = entries
        self.all_variables = sorted((e.spec for e in entries.values()), key=lambda v: v.name)
        self.notes.update(notes)

    # -- reading ---------------------------------------------------------------------------
    def _submit(self, fn: Callable[..., Any], *args: Any) -> Future:
        if self._pool is None:  # one thread reads ahead, one adds half of a chunk
            self._pool = ThreadPoolExecutor(max_workers=2, thread_name_prefix="ckptmerge-combine")
        return self._pool.submit(_quietly, fn, *args)

    def _next(self, it: Iterator[np.ndarray]) -> Future:
        return self._submit(next, it)

    def _add(self, acc: Any, p: TensorParams, stats: Any, j: int, x: np.ndarray, b: Optional[np.ndarray],
             off: int) -> None:
        """``method.add`` for one chunk: elementwise methods add the two halves on two threads
        (NumPy releases the GIL), so the arithmetic keeps up with the reads."""
        m, n = self.method, x.size
        if not m.elementwise or n < _SPLIT or isinstance(acc, list):
            m.add(acc, p, stats, j, x, b, off)
            return
        h = n // 2
        lo = self._submit(m.add, acc[:h], p, stats, j, x[:h], None if b is None else b[:h], off)
        m.add(acc[h:], p, stats, j, x[h:], None if b is None else b[h:], off + h)
        lo.result()

    def read_order(self, names: Sequence[str]) -> None:
        """The names a merge will ask for, in order: while it writes the last chunk of one, the
        first chunk of the next is made (elementwise methods of local files whose parameters
        need no pass over the values: ``mean``, ``ema``, ``task_arithmetic``)."""
        self._after = dict(zip(names, names[1:]))

    def iter_chunks(self, name: str, max_elements: int = 0) -> Iterator[np.ndarray]:
        """The combined values of ``name`` as flat chunks in C order, each made as it is asked
        for (``max_elements`` is ignored: the source's own chunk size applies)."""
        e = self.entries[name]
        ahead, self._ahead = self._ahead, None
        if ahead is not None:
            if ahead[0] == name:
                return iter(ahead[1])
            ahead[1].abandon()  # (asked in another order than announced)
        if e.params is None:  # copied from one input, as it is
            j, n = e.inputs[0]
            return self.inputs[j].iter_chunks(n, self.step)
        return self._combined(e)

    def _start_after(self, name: str) -> None:
        """Start the first chunk of the tensor announced after ``name`` (see :meth:`read_order`)."""
        nxt = self._after.get(name)
        e = self.entries.get(nxt) if nxt is not None else None
        if e is None or e.params is None or self.method.prepare_reads or self._ahead is not None:
            return
        try:
            ranges = self._ranges(e)
        except Exception:  # (raised again, to the caller, when the tensor is asked for)
            return
        if ranges is not None:
            stats = self.method.prepare(e.params, e.spec.size, [], None)  # (prepare_reads: it reads nothing)
            self._ahead = (e.spec.name, self._stream(e, stats, *ranges).begin())

    def _ranges(self, e: Entry) -> Optional[Tuple[List[TensorRanges], Optional[TensorRanges]]]:
        """Every input's (and the base's) ranges of ``e``, when the method is elementwise and
        all of them are local files that store it in one piece; else ``None``."""
        if not self.method.elementwise or not e.spec.size:
            return None
        got = []
        for j, n in e.inputs:
            r = self.inputs[j].ranges(n)
            if r is None:
                return None
            got.append(r)
        b = None
        if self.base is not None and e.base is not None:
            b = self.base.ranges(e.base)
            if b is None:
                return None
        return got, b

    def _combined(self, e: Entry) -> Iterator[np.ndarray]:
        m, p, step = self.method, e.params, self.step
        assert p is not None
        size = e.spec.size
        feeds = [(lambda h=self.inputs[j], n=n: FixedChunks(h.iter_chunks(n, step), step)) for j, n in e.inputs]
        base = self.base
        base_feed = ((lambda: FixedChunks(base.iter_chunks(e.base, step), step))
                     if (base is not None and e.base is not None) else None)
        ranges = self._ranges(e)
        with quiet():
            stats = m.prepare(p, size, feeds, base_feed)  # (its passes keep the source's step: the same sums)
        if ranges is not None:
            yield from self._blocked(e, stats, *ranges)
            return
        # chunks on which every input's pieces end, so no input keeps a rest between chunks (memory
        # independent of the number of inputs); elementwise results do not depend on the chunks
        step = aligned_step(e.spec.shape, step) if m.elementwise else step
        its = [FixedChunks(self.inputs[j].iter_chunks(n, step), step) for j, n in e.inputs]
        bit = (FixedChunks(base.iter_chunks(e.base, step), step)
               if (base is not None and e.base is not None) else None)
        order: List[Iterator[np.ndarray]] = ([bit] if bit is not None else []) + its
        out_dt = e.spec.dtype
        try:
            pending = self._next(order[0]) if size else None
            for off in range(0, size, step):
                n = min(step, size - off)
                acc = m.start(p, n)
                b = None
                with quiet():  # (per chunk: never across a yield)
                    for k in range(len(order)):  # read the next input while this one is added
                        assert pending is not None
                        x = pending.result()
                        nxt = order[k + 1] if k + 1 < len(order) else (order[0] if off + step < size else None)
                        pending = self._next(nxt) if nxt is not None else None
                        if bit is not None and k == 0:
                            b = x
                            continue
                        self._add(acc, p, stats, k - (1 if bit is not None else 0), x, b, off)
                        del x
                    chunk = cast_array(m.finish(acc, p, stats, b), out_dt)
                yield chunk
        finally:
            for it in order:
                close = getattr(it, "close", None)
                if close is not None:
                    close()

    def _blocked(self, e: Entry, stats: Any, ranges: List[TensorRanges],
                 base: Optional[TensorRanges]) -> Iterator[np.ndarray]:
        """The chunks of an elementwise combination of local files (see :func:`blocked_chunks`)."""
        return iter(self._stream(e, stats, ranges, base))

    def _stream(self, e: Entry, stats: Any, ranges: List[TensorRanges],
                base: Optional[TensorRanges]) -> BlockedChunks:
        assert e.params is not None
        name = e.spec.name
        return BlockedChunks(self.method, e.params, stats, ranges, base, e.spec.size, self.step, e.spec.dtype,
                             self._submit, on_last=lambda: self._start_after(name))

    def read(self, names: Sequence[str]) -> Dict[str, Any]:
        """The combined values of ``names`` as whole arrays (64-byte aligned)."""
        out = {}
        for name in names:
            e = self.entries[name]
            if e.params is None:  # one input's value, as it reads it (strings included)
                j, n = e.inputs[0]
                out[name] = self.inputs[j].read([n])[n]
                continue
            arr = aligned_empty(e.spec.shape, numpy_dtype(e.spec.dtype))
            flat = arr.reshape(-1)
            pos = 0
            for chunk in self.iter_chunks(name):
                flat[pos:pos + chunk.size] = chunk
                pos += chunk.size
            out[name] = arr
        return out

    def close(self) -> None:
        """Close every input and the base."""
        ahead, self._ahead = self._ahead, None
        if ahead is not None:
            ahead[1].abandon()
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None
        for h in ([self.base] if self.base is not None else []) + list(self.inputs):
            h.close()


def _quietly(fn: Callable[..., Any], *args: Any) -> Any:
    """``fn(*args)`` on a worker thread with NumPy's warnings on NaN and Inf off (as on the caller's)."""
    with quiet():
        return fn(*args)


# --------------------------------------------------------------------------------------------
# combine()
# --------------------------------------------------------------------------------------------


def combine(
    checkpoints: Any,
    method: str = "mean",
    *,
    base: Any = None,
    weights: Optional[Sequence[Any]] = None,
    dtype: Optional[str] = None,
    keys: str = "strict",
    integers: str = "last",
    optimizer: bool = False,
    accumulate: str = "float64",
    last: Optional[int] = None,
    steps: Any = None,
    every: Optional[int] = None,
    chunk_elements: int = CHUNK_ELEMENTS,
    map: Any = None,  # noqa: A002 - the rule keywords of Source
    regex: Any = None,
    include: Any = None,
    exclude: Any = None,
    layout: Optional[str] = None,
    name: Optional[str] = None,
    cast: Optional[bool] = None,
    transforms: Sequence[Any] = (),
    align: Optional[str] = None,
    conventions: str = "ckptmerge",
    **params: ParamValue,
) -> CombinedSource:
    """Combine many checkpoints into one source: average, EMA, soup or task-vector merge.

    Args:
        checkpoints: a list of checkpoint paths, URLs or :class:`~ckptmerge.Source` objects (with
            their own rules, applied before combining), of any format ckptmerge reads; or a
            training directory (local or URL) whose checkpoints ``last``, ``steps``, ``every`` select.
        method: ``"mean"``, ``"ema"``, ``"task_arithmetic"``, ``"ties"``, ``"dare"``, ``"slerp"``
            or ``"model_stock"`` (see :mod:`ckptmerge.combining.methods` for the formulas).
        base: the base checkpoint (path, URL or Source) of the task-vector methods
            (``task_arithmetic``, ``ties``, ``dare``, ``model_stock``; required there).
        weights: one weight per input (``mean``, ``task_arithmetic``, ``ties``, ``dare``); each a
            number, a gradient list over the layers (``[0.2, 1.0]``) or ``{glob: number or list}``
            (first matching glob wins).
        dtype: the output dtype of float tensors (default: the inputs' dtype).
        keys: ``"strict"`` (the inputs hold the same names, shapes and dtypes, otherwise one
            error lists every difference), ``"intersection"`` (the names all inputs hold) or
            ``"union"`` (each name over the inputs that hold it, listed in the report).
        integers: integer, bool and string tensors (``global_step``, counters) are not averaged:
            ``"last"`` or ``"first"`` input's value, or ``"error"``.
        optimizer: also combine optimizer slots and bookkeeping (left out by default).
        accumulate: ``"float64"``; ``"float32"`` accumulates float16/bfloat16 tensors in float32.
        last: with a directory: its last N checkpoints (after ``steps`` and ``every``).
        steps: with a directory: the steps in a ``range``, a ``(low, high)`` tuple (inclusive,
            either may be ``None``) or a list.
        every: with a directory: the steps divisible by K.
        chunk_elements: accumulator elements per chunk (memory: a few chunks of float64).
        map: as for :class:`~ckptmerge.Source`, on the combined names (so are the next ones).
        regex: rename rules on the combined names.
        include: glob(s) of the combined names to keep.
        exclude: glob(s) of the combined names to leave out.
        layout: ``"torch"`` reads the combined names as a PyTorch ``state_dict``.
        name: the source's label (default ``"<method> of <n>"``).
        cast: per-source override of the plan's ``cast``.
        transforms: value transforms applied to the combined values.
        align: ``"structure"``: structural alignment for the targets nothing else reaches.
        conventions: ``"ckptmerge"`` (the defaults below) or ``"mergekit"`` (mergekit 0.1.5's:
            ``density`` 1.0, DARE's kept values rescaled to the L1 norm of the offset unless
            ``rescale=False``, ``normalize`` for task_arithmetic, ``int8_mask`` accepted, the keys
            of ``{filter: value}`` substrings instead of globs, SLERP of a zero tensor as mergekit
            computes it; docs/merging.md lists every difference). :func:`ckptmerge.from_mergekit`
            reads a mergekit config with them.
        **params: the method's parameters, each a value or ``{glob: value}`` per tensor:
            ``decay`` (ema, 0.999), ``scale`` (task_arithmetic/ties/dare, 1.0), ``density``
            (ties/dare, 0.5), ``seed`` (dare, 0), ``consensus`` (dare: ``"none"`` or ``"ties"``),
            ``normalize`` (mean and ties True, dare False; mean's False: the weighted sum), ``t``
            (slerp, 0.5), ``filter_wise`` (model_stock, False: one ratio per row when True).
            Any of them may be a gradient list spread over the layers (``t=[0, 0.5, 1]``; see
            :mod:`ckptmerge.combining.params`).

    Returns:
        A :class:`CombinedSource`; ``.report()`` describes it without reading a tensor.

    Raises:
        ArgumentError: an unknown method or parameter, a bad option, a missing base.
        CombineError: (when opened) the inputs do not line up; see ``keys``.

    Example:
        >>> import ckptmerge as cm
        >>> avg = cm.combine("runs/A", last=5)                                       # doctest: +SKIP
        >>> cm.merge(avg, "runs/A/avg.safetensors")                                  # doctest: +SKIP
        >>> soup = cm.combine(["ft1", "ft2", "ft3"], "ties", base="pretrained",
        ...                   density={"*attention*": 0.3, "*": 0.5})                 # doctest: +SKIP
        >>> cm.restore(model, [soup])                                                # doctest: +SKIP
    """
    m = METHODS.get(method) if isinstance(method, str) else None
    if m is None:
        choice(method, "method", list(METHODS))
    assert m is not None
    keys = choice(keys, "keys", KEYS)
    integers = choice(integers, "integers", INTEGERS)
    accumulate = choice(accumulate, "accumulate", ACCUMULATE)
    if not isinstance(optimizer, bool):
        raise ArgumentTypeError(f"optimizer must be True or False. Received: optimizer={optimizer!r}")
    if dtype is not None:
        dtype = choice(getattr(dtype, "name", dtype), "dtype", FLOATS)
    if isinstance(chunk_elements, bool) or not isinstance(chunk_elements, int) or chunk_elements < 1:
        raise ArgumentError(f"chunk_elements must be a positive int. Received: chunk_elements={chunk_elements!r}")
    conventions = choice(conventions, "conventions", CONVENTIONS)
    defaults = m.defaults_for(conventions)
    unknown = sorted(set(params) - set(defaults))
    if unknown:
        hint = did_you_mean(unknown[0], list(defaults) + ["weights", "base", "dtype", "keys"], cutoff=0.6)
        raise ArgumentError(f"method {method!r} takes the parameters {', '.join(repr(k) for k in defaults) or 'none'}"
                            f"{' under mergekit conventions' if conventions == 'mergekit' else ''}; "
                            f"received {', '.join(repr(k) for k in unknown)}.{hint}")
    bad = [b for k, v in params.items()
           for x in (v.values if isinstance(v, PerInput) else (v,)) for b in param_problems(k, x, defaults[k])]
    if bad:  # (every value, per glob and gradient entry too, before anything is opened)
        raise ArgumentError(f"Method {method!r}: " + "; ".join(bad[:10]) + (f"; ... and {len(bad) - 10} more" if len(bad) > 10 else "") + ".")
    srcs = select_inputs(checkpoints, last, steps, every)
    base_src = None
    if base is not None:
        base_src = as_sources([base])[0]
        if base_src.name is None and isinstance(base, (str, os.PathLike)):
            base_src = Source(os.fspath(base), name="base") if os.fspath(base) in [s.label for s in srcs] else base_src
    if m.needs_base and base_src is None:
        raise ArgumentError(f"method {method!r} needs base=<the checkpoint the inputs were fine-tuned from>.")
    if not m.needs_base and base_src is not None and method != "slerp":
        raise ArgumentError(f"method {method!r} takes no base; the task-vector methods (task_arithmetic, ties, dare, "
                            "model_stock) do.")
    if method == "slerp" and base_src is not None:  # mergekit's form: from the base toward the other model
        srcs = [base_src] + srcs
        base_src = None
    if len(srcs) < m.min_inputs or (m.max_inputs is not None and len(srcs) > m.max_inputs):
        want = (f"exactly {m.min_inputs}" if m.max_inputs == m.min_inputs else f"at least {m.min_inputs}")
        raise ArgumentError(f"method {method!r} combines {want} inputs{' besides the base' if m.needs_base else ''}; "
                            f"received {len(srcs)}.")
    check_unique_labels(srcs + ([base_src] if base_src is not None else []))
    for k, v in params.items():
        if isinstance(v, PerInput) and len(v.values) != len(srcs):
            raise ArgumentError(f"{k} has {len(v.values)} values for {plural(len(srcs), 'input')}; give one per input.")
    if weights is not None:
        if method in ("ema", "slerp", "model_stock"):
            raise ArgumentError(f"method {method!r} takes no weights ("
                                + {"ema": "they come from decay", "slerp": "t sets the mix",
                                   "model_stock": "its ratio comes from the inputs' angle"}[method] + ").")
        weights = list(weights)
        if len(weights) != len(srcs):
            raise ArgumentError(f"weights has {len(weights)} entries for {plural(len(srcs), 'input')}; give one per input.")
        for i, w in enumerate(weights):
            vals = list(w.values()) if isinstance(w, Mapping) else [w]
            vals = [x for v in vals for x in (v if isinstance(v, (list, tuple)) and v else [v])]  # (gradients)
            if not all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) for v in vals):
                raise ArgumentTypeError(f"weights[{i}] must be a finite number, a gradient list of them or "
                                        f"{{glob: number or list}}. Received: {w!r:.80}")
    ws = [1.0] * len(srcs) if weights is None else weights
    if method in ("mean", "task_arithmetic", "ties", "dare") and all(is_number(w) for w in ws):
        plain = {k: v for k, v in params.items() if is_number(v) or isinstance(v, bool)}  # (globs: when opened)
        bad = weight_problems(method, [float(w) for w in ws], {**defaults, **plain})
        if bad:
            raise ArgumentError(f"Invalid weights or scale for method {method!r}: {bad[0]}.")
    order = "given"
    if method == "ema":
        steps_of = [s.resolve() for s in srcs]
        if all(r is not None and r.step is not None for r in steps_of):
            pairs = sorted(zip([r.step for r in steps_of], range(len(srcs))))
            srcs = [srcs[i] for _, i in pairs]
            order = "by step"
    rules = {k: v for k, v in dict(map=map, regex=regex, include=include, exclude=exclude, layout=layout, name=name,
                                   cast=cast, transforms=transforms, align=align).items() if v is not None}
    return CombinedSource(srcs, method, base=base_src, weights=list(weights or []), dtype=dtype, keys=keys,
                          integers=integers, optimizer=optimizer, accumulate=accumulate, params=dict(params),
                          chunk_elements=chunk_elements, order=order, conventions=conventions, **rules)


def _from_mergekit(path: Any, **options: Any) -> CombinedSource:
    """:func:`ckptmerge.from_mergekit`, as ``cm.combine.from_mergekit(path)`` (mergekit users'
    spelling): a mergekit config read as written (the reader lives in ``config``, above this
    module, so it is reached by module name).

    Example:
        >>> src = combine.from_mergekit("ties.yml")                              # doctest: +SKIP
    """
    import importlib

    return importlib.import_module("ckptmerge.config.mergekit").from_mergekit(path, **options)


combine.from_mergekit = _from_mergekit  # type: ignore[attr-defined]
