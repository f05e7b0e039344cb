"""Value transforms: change a checkpoint tensor on its way to a target variable.

A transform is a small frozen dataclass that the planner and the restore backends apply to one
source tensor before it is assigned to a target variable whose name matches ``target`` (a name or
a glob). Two kinds exist, after TF's ``WarmStartSettings`` features people still need:

* :class:`VocabRemap` moves the rows (or columns) of an embedding or output layer from an old
  vocabulary to a new one, like ``tf.compat.v1.train.VocabInfo``;
* :class:`Slice` copies the overlap of a tensor that is larger or smaller along one axis (e.g. a
  head with more classes) and leaves the rest as the target already is.

Dtype casts are not a transform object: the plan's ``cast`` flag asks for them, and
:func:`~ckptmerge.planning.casts.cast_array` / :func:`~ckptmerge.planning.casts.cast_problem` do the work (in
:mod:`ckptmerge.planning.casts`; re-exported here, as is :class:`~ckptmerge.core.errors.TransformError`). A transform's result has the source's
dtype, except with ``init="keep"``: then it has the target's dtype (the kept values are copied,
never round-tripped through a narrower source dtype), so the cast may come before or after.

Everything here is pure numpy: no files except vocabulary files, no TensorFlow.

The protocol every transform follows (the planner and backends rely on nothing else):

* ``target``: the target variable name or glob; :meth:`applies_to` matches it.
* ``output_shape(source_shape, target_shape) -> tuple``: the shape :meth:`apply` produces, for the
  planner to compare with the target's shape; raises :class:`TransformError` when the transform
  cannot apply to these shapes (report it as a mismatch).
* ``apply(value, current, *, target_shape=None) -> np.ndarray``: the new value. ``current`` is the
  target's current value; it is only needed when ``needs_current`` is true.
* ``describe(source_shape=None, target_shape=None) -> str``: one line for reports.
* ``to_dict() -> dict``: JSON-ready data.
"""

from __future__ import annotations

import fnmatch
import os
from dataclasses import dataclass, field
from typing import Any, Callable, List, Optional, Sequence, Tuple, Union

import numpy as np

from ..core.errors import TransformError, did_you_mean
from ..formats.io.localfile import NotARegularFileError, read_regular_file
from ..core.redact import get_logger
from ..core.text import quote_name
from .casts import cast_array, cast_problem, dtype_name, numpy_dtype

__all__ = [
    "TransformError",
    "VocabRemap",
    "Slice",
    "Transpose",
    "Transform",
    "VOCAB_INITS",
    "SLICE_INITS",
    "read_vocab",
    "cast_array",
    "cast_problem",
    "numpy_dtype",
    "dtype_name",
]

logger = get_logger(__name__)

#: Initialisers (by name) of the rows of new tokens and OOV buckets: zeros, ones, or the target's
#: current value. A callable ``init(shape, dtype)`` works too, as ``VocabInfo``'s
#: ``backup_initializer`` (a TF or Keras initializer, or a function returning an array).
VOCAB_INITS = ("zeros", "keep", "ones")
#: Initialisers of the part of a sliced target that the checkpoint does not cover.
SLICE_INITS = ("keep", "zeros")

VocabSpec = Union[str, "os.PathLike[str]", Sequence[str]]
Shape = Tuple[int, ...]


# --------------------------------------------------------------------------------------------
# vocabularies


def read_vocab(path: Union[str, "os.PathLike[str]"]) -> Tuple[str, ...]:
    """Read a vocabulary file: one token per line, UTF-8.

    Only the line end is stripped (``\\n``, or ``\\r\\n``), so tokens may contain spaces; a
    UTF-8 byte order mark at the start is ignored. Tokens must be unique.

    Args:
        path: the vocabulary file.

    Returns:
        The tokens, in file order (the index of a token is its row).

    Raises:
        TransformError: the file does not exist or is not a regular file (a FIFO, a device), is
            not UTF-8, is empty, or has a duplicate token
            (the message names the file and both lines).

    Example:
        >>> import tempfile, os
        >>> p = os.path.join(tempfile.mkdtemp(), "vocab.txt")
        >>> _ = open(p, "w", encoding="utf-8").write("the\\nnew york\\n")
        >>> read_vocab(p)
        ('the', 'new york')
    """
    path = os.fspath(path)
    try:
        data = read_regular_file(path)
    except FileNotFoundError:
        raise TransformError(f"vocab file {quote_name(path)} does not exist.", path=path) from None
    except NotARegularFileError as e:
        raise TransformError(f"vocab file {quote_name(path)} {e.reason}; expected a text file with one "
                             "token per line.", path=path) from None
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        raise TransformError(f"vocab file {quote_name(path)} is not valid UTF-8: line {line} has the byte "
                             f"{data[e.start:e.start + 1]!r}; save it as UTF-8.",
                             path=path, line=line) from None
    if text == "":
        raise TransformError(f"vocab file {quote_name(path)} is empty; expected one token per line.", path=path)
    lines = text.split("\n")
    if text.endswith("\n"):
        lines.pop()
    tokens = tuple(t[:-1] if t.endswith("\r") else t for t in lines)
    _check_unique(tokens, f"vocab file {quote_name(path)}", "line", 1, path=path)
    return tokens


def _check_unique(tokens: Sequence[str], what: str, unit: str, base: int, *, path: Optional[str] = None) -> None:
    first: dict = {}
    dups: List[Tuple[str, int, int]] = []
    for i, tok in enumerate(tokens):
        j = first.setdefault(tok, i)
        if j != i:
            dups.append((tok, j, i))
    if dups:
        tok, j, i = dups[0]
        more = f" ({len(dups) - 1} more duplicate{'s' if len(dups) > 2 else ''} follow)" if len(dups) > 1 else ""
        raise TransformError(f"{what} has the duplicate token {tok!r} on {unit}s {j + base} and "
                             f"{i + base}{more}; every token must be unique.", path=path, line=i + base)


def _load_tokens(spec: VocabSpec, which: str, target: str) -> Tuple[Union[str, Tuple[str, ...]], Tuple[str, ...]]:
    """Return (the spec as stored: a path string or a tuple of tokens, the tokens)."""
    if isinstance(spec, (str, os.PathLike)):
        spec = os.fspath(spec)
        return spec, read_vocab(spec)
    if isinstance(spec, (list, tuple)) and all(isinstance(t, str) for t in spec):
        tokens = tuple(spec)
        if not tokens:
            raise TransformError(f"vocab remap of {quote_name(target)}: {which} is an empty list; expected "
                                 "a file path or a non-empty list of tokens.", target=target)
        _check_unique(tokens, f"vocab remap of {quote_name(target)}: {which}", "position", 0)
        return tokens, tokens
    raise TransformError(f"vocab remap of {quote_name(target)}: {which} must be a vocabulary file path or a "
                         f"list of token strings, received {type(spec).__name__} {spec!r:.60}.",
                         target=target)


def _check_target(kind: str, target: object) -> None:
    if not isinstance(target, str) or not target:
        raise TransformError(f"{kind}: target must be a non-empty variable name or glob, "
                             f"received {target!r}.")


def _check_axis(kind: str, target: str, axis: object) -> None:
    if isinstance(axis, bool) or not isinstance(axis, (int, np.integer)) or axis < 0:
        raise TransformError(f"{kind} of {quote_name(target)}: axis must be a non-negative integer, "
                             f"received {axis!r}.", target=target)


def _check_init(kind: str, target: str, init: object, choices: Sequence[str], extra: str = "") -> None:
    if init not in choices:
        quoted = [f"'{c}'" for c in choices]
        options = ", ".join(quoted[:-1]) + " or " + quoted[-1]
        hint = did_you_mean(init, choices) if isinstance(init, str) else ""
        raise TransformError(f"{kind} of {quote_name(target)}: init must be {options}{extra}, received "
                             f"{init!r}.{hint}", target=target)


def _plural(n: int, word: str) -> str:
    return f"{n:,} {word}" + ("" if n == 1 else "s")


def _unit(axis: int, ndim: Optional[int], n: int = 2) -> str:
    """What the slices along ``axis`` are called: rows, columns or entries (singular if n == 1)."""
    if ndim == 2:
        word = "row" if axis == 0 else "column"
        return word if n == 1 else word + "s"
    return "entry" if n == 1 else "entries"


def _zeros(shape: Shape, dtype: np.dtype) -> np.ndarray:
    if dtype == np.dtype(object):  # TF strings: empty bytes, not the integer 0
        return np.full(shape, b"", dtype=object)
    return np.zeros(shape, dtype=dtype)


def _check_size(target: str, option: str, size: object, n_tokens: int, *, minus_one: bool = False) -> int:
    """A vocabulary size option: an int in ``[1, n_tokens]`` (or ``-1``: all); returns the count."""
    if minus_one and size == -1:
        return n_tokens
    if isinstance(size, bool) or not isinstance(size, (int, np.integer)) or not 0 < size <= n_tokens:
        allowed = "-1 (all), or " if minus_one else ""
        raise TransformError(f"vocab remap of {quote_name(target)}: {option} must be {allowed}an integer from 1 "
                             f"to the vocabulary's {_plural(n_tokens, 'token')}, received {size!r}.",
                             target=target)
    return int(size)


def _initial_values(init: Callable[..., Any], shape: Shape, dtype: np.dtype, target: str) -> np.ndarray:
    """Call a backup initializer ``init(shape, dtype)`` and check what it gives (a fresh array)."""
    dt = dtype_name(dtype)
    try:
        got = init(shape, dtype=dt)
    except TypeError:  # initializers that take the shape only
        got = init(shape)
    if hasattr(got, "numpy"):
        got = got.numpy()
    elif callable(getattr(got, "eval", None)) and hasattr(got, "graph"):  # a graph-mode TF tensor
        got = got.eval()
    try:
        arr = np.array(got, dtype=dtype, copy=True)
    except (TypeError, ValueError, NotImplementedError) as e:
        raise TransformError(f"vocab remap of {quote_name(target)}: the backup initializer gave "
                             f"{type(got).__name__}, not values ({e}); pass a callable that returns "
                             "an array, or an initializer name such as 'zeros'.", target=target) from None
    if arr.shape != tuple(shape):
        raise TransformError(f"vocab remap of {quote_name(target)}: the backup initializer gave shape "
                             f"{arr.shape}, expected {tuple(shape)}.", target=target)
    return arr


def _start(value: np.ndarray, current: Optional[np.ndarray], out_shape: Shape, keep: bool,
           kind: str, target: str) -> np.ndarray:
    """The array a transform writes into: a copy of ``current`` (keep) or zeros of ``value``'s dtype."""
    if not keep:
        return _zeros(out_shape, value.dtype)
    if current is None:
        raise TransformError(f"{kind} of {quote_name(target)} with init='keep' needs the target's current "
                             "value; the restore backend must pass it as `current`.", target=target)
    current = np.asarray(current)
    if tuple(current.shape) != tuple(out_shape):
        raise TransformError(f"{kind} of {quote_name(target)}: the target's current value has shape "
                             f"{tuple(current.shape)}, expected {tuple(out_shape)}.", target=target)
    # Keep the target's dtype: the kept part must not round-trip through a narrower source dtype
    # (e.g. float16), whether the backend casts before or after the transform.
    return np.array(current, copy=True)


# --------------------------------------------------------------------------------------------
# transforms


@dataclass(frozen=True)
class VocabRemap:
    """Move the rows (or columns) of a tensor from an old vocabulary to a new one.

    Tokens in both vocabularies move from their old index to their new index along ``axis``;
    tokens only in the new vocabulary, and the ``num_oov_buckets`` rows after them, get ``init``;
    tokens only in the old vocabulary are dropped. The semantics are those of TF's ``VocabInfo``
    for ``tf.compat.v1.train.warm_start``: the checkpoint may hold more rows than the old
    vocabulary (its own OOV rows, which are not carried over), and ``old_vocab_size`` /
    ``new_vocab_size`` use only the first entries of each vocabulary.

    Args:
        target: the target variable name (or a glob) this transform applies to.
        old_vocab: the vocabulary the checkpoint was trained with: a file (one token per line,
            UTF-8) or a list of tokens. Token ``i`` is the checkpoint tensor's entry ``i`` along
            ``axis``; the tensor must have at least as many entries as the old vocabulary
            (``VocabInfo.old_vocab``).
        new_vocab: the target's vocabulary, as a file or a list (``VocabInfo.new_vocab``).
        axis: 0 for rows (embeddings), 1 for columns (e.g. an output layer's kernel).
        init: for the rows of new tokens and OOV buckets: ``"zeros"``, ``"ones"``, ``"keep"``
            (the target's current value) or a callable ``init(shape, dtype)`` returning an array
            or tensor of that shape, e.g. a TF initializer (``VocabInfo.backup_initializer``;
            it is called once, with the whole output shape, and the kept rows overwrite its
            result).
        old_vocab_size: use only the first ``old_vocab_size`` tokens of ``old_vocab``
            (``VocabInfo.old_vocab_size``; ``None`` or ``-1``: all of them).
        new_vocab_size: use only the first ``new_vocab_size`` tokens of ``new_vocab``
            (``VocabInfo.new_vocab_size``; ``None``: all of them).
        num_oov_buckets: rows after the new vocabulary's that the target has for
            out-of-vocabulary ids (``VocabInfo.num_oov_buckets``); they get ``init``. The output
            size along ``axis`` is ``new_vocab_size + num_oov_buckets``.

    Raises:
        TransformError: a vocabulary file is missing, not UTF-8, empty or has duplicates; a bad
            axis or init.

    Example:
        >>> import numpy as np
        >>> t = VocabRemap("embed", ["a", "b", "c"], ["c", "a", "new"])
        >>> t.apply(np.array([[1.], [2.], [3.]]), None).tolist()
        [[3.0], [1.0], [0.0]]
        >>> t.describe()
        'vocab remap axis 0: 2 of 3 old tokens kept, 1 new token (zeros), 1 dropped'
    """

    target: str
    old_vocab: Union[str, Tuple[str, ...]]
    new_vocab: Union[str, Tuple[str, ...]]
    axis: int = 0
    init: Union[str, Callable[..., Any]] = "zeros"
    old_vocab_size: Optional[int] = None
    new_vocab_size: Optional[int] = None
    num_oov_buckets: int = 0
    _old: Tuple[str, ...] = field(init=False, repr=False, compare=False)
    _new: Tuple[str, ...] = field(init=False, repr=False, compare=False)
    _old_idx: np.ndarray = field(init=False, repr=False, compare=False)
    _new_idx: np.ndarray = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        _check_target("vocab remap", self.target)
        _check_axis("vocab remap", self.target, self.axis)
        if not callable(self.init):
            _check_init("vocab remap", self.target, self.init, VOCAB_INITS,
                        " (or a callable backup initializer)")
        old_spec, old = _load_tokens(self.old_vocab, "old_vocab", self.target)
        new_spec, new = _load_tokens(self.new_vocab, "new_vocab", self.target)
        old_size = -1 if self.old_vocab_size is None else self.old_vocab_size
        old = old[:_check_size(self.target, "old_vocab_size", old_size, len(old), minus_one=True)]
        new_size = len(new) if self.new_vocab_size is None else self.new_vocab_size
        new = new[:_check_size(self.target, "new_vocab_size", new_size, len(new))]
        oov = self.num_oov_buckets
        if isinstance(oov, bool) or not isinstance(oov, (int, np.integer)) or oov < 0:
            raise TransformError(f"vocab remap of {quote_name(self.target)}: num_oov_buckets must be an "
                                 f"integer >= 0, received {oov!r}.", target=self.target)
        new_index = {tok: i for i, tok in enumerate(new)}
        pairs = [(i, new_index[tok]) for i, tok in enumerate(old) if tok in new_index]
        set_ = object.__setattr__  # frozen dataclass: normalise once, here
        set_(self, "old_vocab", old_spec)
        set_(self, "new_vocab", new_spec)
        set_(self, "axis", int(self.axis))
        set_(self, "num_oov_buckets", int(oov))
        set_(self, "_old", old)
        set_(self, "_new", new)
        set_(self, "_old_idx", np.array([p[0] for p in pairs], dtype=np.intp))
        set_(self, "_new_idx", np.array([p[1] for p in pairs], dtype=np.intp))

    # counts -----------------------------------------------------------------------------
    @property
    def old_tokens(self) -> Tuple[str, ...]:
        """The old vocabulary's tokens."""
        return self._old

    @property
    def new_tokens(self) -> Tuple[str, ...]:
        """The new vocabulary's tokens."""
        return self._new

    @property
    def num_kept(self) -> int:
        """Tokens in both vocabularies (their values move to the new index)."""
        return len(self._old_idx)

    @property
    def num_added(self) -> int:
        """Tokens only in the new vocabulary (initialised by ``init``; OOV buckets not counted)."""
        return len(self._new) - self.num_kept

    @property
    def num_dropped(self) -> int:
        """Tokens only in the old vocabulary (their values are not used)."""
        return len(self._old) - self.num_kept

    @property
    def needs_current(self) -> bool:
        """Whether :meth:`apply` needs the target's current value."""
        return isinstance(self.init, str) and self.init == "keep"

    def applies_to(self, name: str) -> bool:
        """Whether this transform applies to the target variable ``name`` (``fnmatch`` glob)."""
        return fnmatch.fnmatchcase(name, self.target)

    def _vocab_label(self, which: str) -> str:
        spec = self.old_vocab if which == "old" else self.new_vocab
        return quote_name(spec) if isinstance(spec, str) else "(a list)"

    # protocol ---------------------------------------------------------------------------
    def output_shape(self, source_shape: Sequence[int], target_shape: Optional[Sequence[int]] = None) -> Shape:
        """The remapped tensor's shape: ``source_shape`` with ``new size + num_oov_buckets`` at ``axis``.

        Raises:
            TransformError: ``axis`` is out of range, or the source has fewer entries along
                ``axis`` than the old vocabulary has tokens.

        Example:
            >>> VocabRemap("e", ["a", "b"], ["b", "c", "d"]).output_shape((2, 8), (3, 8))
            (3, 8)
        """
        shape = tuple(int(d) for d in source_shape)
        if self.axis >= len(shape):
            raise TransformError(f"vocab remap of {quote_name(self.target)}: axis {self.axis} is out of range "
                                 f"for the checkpoint tensor of shape {shape}.", target=self.target)
        if shape[self.axis] < len(self._old):
            raise TransformError(
                f"vocab remap of {quote_name(self.target)}: the checkpoint tensor has {shape[self.axis]:,} "
                f"{_unit(self.axis, len(shape), shape[self.axis])} along axis {self.axis} (shape {shape}) but the old "
                f"vocabulary {self._vocab_label('old')} has {_plural(len(self._old), 'token')}; "
                "it must have at least one per token (is old_vocab the vocabulary this checkpoint "
                "was trained with? old_vocab_size=N uses its first N tokens).",
                target=self.target)
        return shape[:self.axis] + (len(self._new) + self.num_oov_buckets,) + shape[self.axis + 1:]

    def apply(self, value: np.ndarray, current: Optional[np.ndarray] = None, *,
              target_shape: Optional[Sequence[int]] = None) -> np.ndarray:
        """Return ``value`` remapped to the new vocabulary (a new array; inputs are not changed).

        Args:
            value: the checkpoint tensor (after any dtype cast).
            current: the target's current value; needed only when ``init="keep"`` (then its
                shape must be the output shape).
            target_shape: the target's shape (unused: the output shape follows from the
                vocabularies; the planner compares the two).

        Raises:
            TransformError: the shapes do not fit, or ``current`` is missing for ``init="keep"``.
        """
        value = np.asarray(value)
        out_shape = self.output_shape(value.shape, target_shape)
        if callable(self.init):
            out = _initial_values(self.init, out_shape, value.dtype, self.target)
        elif self.init == "ones":
            out = np.ones(out_shape, dtype=value.dtype)
        else:
            out = _start(value, current, out_shape, self.init == "keep", "vocab remap", self.target)
        index: list = [slice(None)] * value.ndim
        index[self.axis] = self._new_idx
        out[tuple(index)] = np.take(value, self._old_idx, axis=self.axis)
        return out

    def describe(self, source_shape: Optional[Sequence[int]] = None,
                 target_shape: Optional[Sequence[int]] = None) -> str:
        """One line for reports.

        Example:
            >>> VocabRemap("e", ["a", "b", "c"], ["a", "b", "d", "e"], init="keep").describe()
            "vocab remap axis 0: 2 of 3 old tokens kept, 2 new tokens (target's current value), 1 dropped"
        """
        init = {"zeros": "zeros", "ones": "ones", "keep": "target's current value"}.get(
            self.init, "backup initializer") if isinstance(self.init, str) else "backup initializer"
        old = len(self._old)
        oov = f", {_plural(self.num_oov_buckets, 'OOV bucket')}" if self.num_oov_buckets else ""
        return (f"vocab remap axis {self.axis}: {self.num_kept:,} of {old:,} old "
                f"token{'' if old == 1 else 's'} kept, {_plural(self.num_added, 'new token')}"
                f"{oov} ({init}), {self.num_dropped:,} dropped")

    def to_dict(self) -> dict:
        """JSON-ready data: kind, target, old_vocab, new_vocab (path or token list), axis, init
        (a callable shows as its repr), and old_vocab_size, new_vocab_size, num_oov_buckets when set."""
        def spec(s: Union[str, Tuple[str, ...]]) -> Union[str, List[str]]:
            return s if isinstance(s, str) else list(s)
        out = {"kind": "vocab", "target": self.target, "old_vocab": spec(self.old_vocab),
               "new_vocab": spec(self.new_vocab), "axis": self.axis,
               "init": self.init if isinstance(self.init, str) else repr(self.init)}
        for key in ("old_vocab_size", "new_vocab_size"):
            if getattr(self, key) is not None:
                out[key] = getattr(self, key)
        if self.num_oov_buckets:
            out["num_oov_buckets"] = self.num_oov_buckets
        return out


@dataclass(frozen=True)
class Slice:
    """Copy the overlap of a tensor that differs from its target along one axis.

    When the checkpoint tensor and the target differ in size along ``axis`` only (e.g. a head
    with more classes), ``min(source - start, target)`` entries along ``axis`` are copied, from
    entry ``start`` of the checkpoint's on, and the rest of the target keeps its current value
    (``init="keep"``) or becomes zeros. Every other axis must match exactly. ``start`` skips
    leading checkpoint entries: a RoBERTa-style position table ``(66, 64)`` whose real rows are
    2..65 goes into a ``(64, 64)`` target with ``start=2``.

    Args:
        target: the target variable name (or a glob) this transform applies to.
        axis: the one axis along which the sizes may differ.
        init: ``"keep"`` (default) or ``"zeros"``, for the part the checkpoint does not cover.
        start: the first checkpoint entry along ``axis`` to copy (default 0).

    Example:
        >>> import numpy as np
        >>> s = Slice("head/kernel", axis=1, init="zeros")
        >>> s.apply(np.ones((2, 2)), None, target_shape=(2, 3)).tolist()
        [[1.0, 1.0, 0.0], [1.0, 1.0, 0.0]]
        >>> Slice("pos/embeddings", axis=0, start=2).describe((66, 64), (64, 64))
        'slice axis 0: 64 of 64 rows copied (checkpoint rows 2..65 of 66), 2 checkpoint rows dropped'
    """

    target: str
    axis: int
    init: str = "keep"
    start: int = 0

    def __post_init__(self) -> None:
        _check_target("slice", self.target)
        _check_axis("slice", self.target, self.axis)
        _check_init("slice", self.target, self.init, SLICE_INITS)
        object.__setattr__(self, "axis", int(self.axis))
        if isinstance(self.start, bool) or not isinstance(self.start, (int, np.integer)) or self.start < 0:
            raise TransformError(f"slice of {quote_name(self.target)}: start must be an integer >= 0. "
                                 f"Received: start={self.start!r}", target=self.target)
        object.__setattr__(self, "start", int(self.start))

    @property
    def needs_current(self) -> bool:
        """Whether :meth:`apply` needs the target's current value."""
        return self.init == "keep"

    def applies_to(self, name: str) -> bool:
        """Whether this transform applies to the target variable ``name`` (``fnmatch`` glob)."""
        return fnmatch.fnmatchcase(name, self.target)

    def output_shape(self, source_shape: Sequence[int], target_shape: Optional[Sequence[int]] = None) -> Shape:
        """The target's shape, once checked that the shapes differ along ``axis`` only.

        Raises:
            TransformError: no target shape, different ranks, ``axis`` out of range, or a
                difference along another axis.

        Example:
            >>> Slice("head/bias", axis=0).output_shape((10,), (12,))
            (12,)
        """
        src = tuple(int(d) for d in source_shape)
        if target_shape is None:
            raise TransformError(f"slice of {quote_name(self.target)} needs the target's shape.", target=self.target)
        tgt = tuple(int(d) for d in target_shape)
        if len(src) != len(tgt):
            raise TransformError(f"slice of {quote_name(self.target)}: the checkpoint tensor has shape {src} and "
                                 f"the target {tgt}; a slice needs the same number of dimensions.",
                                 target=self.target)
        if self.axis >= len(src):
            raise TransformError(f"slice of {quote_name(self.target)}: axis {self.axis} is out of range for shape "
                                 f"{src}.", target=self.target)
        if self.start and self.start >= src[self.axis]:
            raise TransformError(f"slice of {quote_name(self.target)}: start {self.start} is past the "
                                 f"{src[self.axis]} entries of axis {self.axis} of the checkpoint tensor {src}.",
                                 target=self.target)
        other = [d for d in range(len(src)) if d != self.axis and src[d] != tgt[d]]
        if other:
            axes = " and ".join(str(d) for d in other)
            raise TransformError(
                f"slice of {quote_name(self.target)} along axis {self.axis}: the checkpoint tensor {src} and the "
                f"target {tgt} also differ along axis {axes}; a slice may change one axis only.",
                target=self.target)
        return tgt

    def apply(self, value: np.ndarray, current: Optional[np.ndarray] = None, *,
              target_shape: Optional[Sequence[int]] = None) -> np.ndarray:
        """Return the target-shaped tensor: the overlap from ``value``, the rest per ``init``.

        Args:
            value: the checkpoint tensor (after any dtype cast).
            current: the target's current value; needed when ``init="keep"``.
            target_shape: the target's shape; needed when ``current`` is not given.

        Raises:
            TransformError: the shapes do not fit, or neither ``current`` nor ``target_shape``.
        """
        value = np.asarray(value)
        if target_shape is None and current is not None:
            target_shape = np.shape(current)
        out_shape = self.output_shape(value.shape, target_shape)
        out = _start(value, current, out_shape, self.init == "keep", "slice", self.target)
        n = min(value.shape[self.axis] - self.start, out_shape[self.axis])
        index: list = [slice(None)] * value.ndim
        index[self.axis] = slice(0, n)
        taken = list(index)
        taken[self.axis] = slice(self.start, self.start + n)
        out[tuple(index)] = value[tuple(taken)]
        return out

    def describe(self, source_shape: Optional[Sequence[int]] = None,
                 target_shape: Optional[Sequence[int]] = None) -> str:
        """One line for reports; with both shapes it gives the counts.

        Example:
            >>> Slice("head/kernel", axis=1).describe((64, 10), (64, 12))
            "slice axis 1: 10 of 12 columns copied, 2 keep the target's current value"
        """
        rest = "keep the target's current value" if self.init == "keep" else "zeros"
        if source_shape is None or target_shape is None or self.axis >= len(target_shape) \
                or self.axis >= len(source_shape):
            if self.init == "keep":
                return f"slice axis {self.axis}: overlap copied, the rest keeps the target's current value"
            return f"slice axis {self.axis}: overlap copied, the rest zeros"
        n_src, n_tgt = int(source_shape[self.axis]), int(target_shape[self.axis])
        ndim = len(target_shape)
        n = max(min(n_src - self.start, n_tgt), 0)
        text = f"slice axis {self.axis}: {n:,} of {n_tgt:,} {_unit(self.axis, ndim, n_tgt)} copied"
        if n_src > n:  # (which of the checkpoint's: the report names them)
            text += f" (checkpoint {_unit(self.axis, ndim, n)} {self.start}..{self.start + n - 1} of {n_src:,})"
        if n_tgt > n:
            text += f", {n_tgt - n:,} {rest}"
        if n_src > n:
            text += f", {n_src - n:,} checkpoint {_unit(self.axis, ndim, n_src - n)} dropped"
        return text

    def to_dict(self) -> dict:
        """JSON-ready data: kind, target, axis, init (and start, when not 0)."""
        out = {"kind": "slice", "target": self.target, "axis": self.axis, "init": self.init}
        if self.start:
            out["start"] = self.start
        return out


@dataclass(frozen=True)
class Transpose:
    """Permute a tensor's axes on its way to the target (e.g. a PyTorch Linear weight ``(out, in)``
    into a Keras kernel ``(in, out)``, where ``layout="torch"`` could not tell the layer kind).

    Args:
        target: the target variable name (or a glob) this transform applies to.
        perm: the axis order, as for ``numpy.transpose``; default: all axes reversed.

    Example:
        >>> import numpy as np
        >>> Transpose("dense/kernel").apply(np.zeros((3, 5))).shape
        (5, 3)
        >>> Transpose("q/kernel", perm=(1, 0, 2)).describe((4, 64, 16))
        'permuted axes (1, 0, 2) (4, 64, 16)->(64, 4, 16)'
    """

    target: str
    perm: Optional[Tuple[int, ...]] = None

    def __post_init__(self) -> None:
        _check_target("transpose", self.target)
        if self.perm is not None:
            perm = tuple(self.perm)
            if not all(isinstance(a, int) and not isinstance(a, bool) for a in perm) \
                    or sorted(perm) != list(range(len(perm))):
                raise TransformError(f"transpose of {quote_name(self.target)}: perm must be a permutation of 0..n-1. "
                                     f"Received: perm={self.perm!r}", target=self.target)
            object.__setattr__(self, "perm", perm)

    needs_current = False

    def applies_to(self, name: str) -> bool:
        """Whether this transform applies to the target variable ``name`` (``fnmatch`` glob)."""
        return fnmatch.fnmatchcase(name, self.target)

    def _perm(self, ndim: int) -> Tuple[int, ...]:
        if self.perm is None:
            return tuple(range(ndim))[::-1]
        if len(self.perm) != ndim:
            raise TransformError(f"transpose of {quote_name(self.target)}: perm {self.perm} does not fit a tensor with "
                                 f"{ndim} dimensions.", target=self.target)
        return self.perm

    def output_shape(self, source_shape: Sequence[int], target_shape: Optional[Sequence[int]] = None) -> Shape:
        """The permuted shape.

        Example:
            >>> Transpose("k", perm=(2, 0, 1)).output_shape((2, 3, 4))
            (4, 2, 3)
        """
        src = tuple(int(d) for d in source_shape)
        return tuple(src[a] for a in self._perm(len(src)))

    def apply(self, value: np.ndarray, current: Optional[np.ndarray] = None, *,
              target_shape: Optional[Sequence[int]] = None) -> np.ndarray:
        """Return the permuted tensor (C-contiguous)."""
        value = np.asarray(value)
        return np.ascontiguousarray(np.transpose(value, self._perm(value.ndim)))

    def describe(self, source_shape: Optional[Sequence[int]] = None,
                 target_shape: Optional[Sequence[int]] = None) -> str:
        """One line for reports.

        Example:
            >>> Transpose("k").describe((3, 5))
            'transposed (3, 5)->(5, 3)'
        """
        if source_shape is None:
            return f"permuted axes {self.perm}" if self.perm else "transposed"
        if self.perm is not None and self.perm != tuple(range(len(self.perm)))[::-1]:
            return f"permuted axes {self.perm} {tuple(source_shape)}->{self.output_shape(source_shape)}"
        return f"transposed {tuple(source_shape)}->{self.output_shape(source_shape)}"

    def to_dict(self) -> dict:
        """JSON-ready data: kind, target, perm."""
        return {"kind": "transpose", "target": self.target, "perm": list(self.perm) if self.perm else None}


#: Any value transform.
Transform = Union[VocabRemap, Slice, Transpose]
