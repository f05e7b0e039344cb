"""Names and specs of variables: the small vocabulary every other module speaks.

A *name* is a checkpoint key or a target variable name without the ``:0`` output suffix,
normalised by :func:`normalize_name` (the one place that does it). A :class:`VariableInfo`
describes one tensor of a checkpoint or one target variable: its name, its raw checkpoint key,
its shape (a tuple) and its dtype (a numpy-style name such as ``"float32"``, ``"bfloat16"`` or
``"string"``). Nothing here touches files or TensorFlow.
"""

from __future__ import annotations

import itertools
import operator
import re
from dataclasses import dataclass, field, fields
from typing import Any, Callable, Dict, Iterable, List, Optional, Tuple, Type, TypeVar

__all__ = ["VariableInfo", "normalize_name", "KIND_VARIABLE", "KIND_OPTIMIZER", "KIND_BOOKKEEPING"]

#: An ordinary model variable.
KIND_VARIABLE = "variable"
#: Optimizer state: slots (Adam m/v, momentum), iteration counters, learning rates, ...
KIND_OPTIMIZER = "optimizer"
#: Checkpoint bookkeeping: ``global_step``, ``save_counter``, ``_CHECKPOINTABLE_OBJECT_GRAPH``.
KIND_BOOKKEEPING = "bookkeeping"

_OUTPUT_SUFFIX = re.compile(r":\d+$")


def normalize_name(name: str) -> str:
    """Return a variable name without a tensor output suffix (``":0"``) or leading ``/``.

    Example:
        >>> normalize_name("dense/kernel:0")
        'dense/kernel'
    """
    return _OUTPUT_SUFFIX.sub("", name).lstrip("/") if name != "/" else name


_T = TypeVar("_T")


def frozen_slots(cls: Type[_T]) -> Type[_T]:
    """The frozen dataclass ``cls`` again, with ``__slots__`` instead of a ``__dict__``.

    What ``@dataclass(frozen=True, slots=True)`` does on Python 3.10+, here for 3.9 too: the
    class is made again (slots cannot be added to an existing class), and pickling goes through
    ``__getstate__``/``__setstate__`` because the frozen ``__setattr__`` refuses the default.
    A slotted instance is about a third smaller and quicker to build, which counts at 100k.

    Example:
        >>> VariableInfo.__slots__[:3], hasattr(VariableInfo("x", (1,), "float32"), "__dict__")
        (('name', 'shape', 'dtype'), False)
    """
    names = tuple(f.name for f in fields(cls))
    body = {k: v for k, v in cls.__dict__.items() if k not in names and k not in ("__dict__", "__weakref__")}
    body["__slots__"] = names

    def __getstate__(self: Any) -> tuple:
        return tuple(getattr(self, n) for n in names)

    def __setstate__(self: Any, state: tuple) -> None:
        for n, v in zip(names, state):
            object.__setattr__(self, n, v)

    body["__getstate__"], body["__setstate__"] = __getstate__, __setstate__
    new = type(cls)(cls.__name__, cls.__bases__, body)
    new.__qualname__ = cls.__qualname__
    return new


@frozen_slots
@dataclass(frozen=True)
class VariableInfo:
    """One tensor of a checkpoint, or one target variable.

    Attributes:
        name: the name ckptmerge matches on (see docs/names.md).
        shape: the full shape as a tuple of ints.
        dtype: numpy-style dtype name: ``float32``, ``bfloat16``, ``int64``, ``bool``,
            ``complex64``, ``string``, ...
        key: the raw checkpoint key (equal to ``name`` for name-based checkpoints).
        kind: ``"variable"``, ``"optimizer"`` or ``"bookkeeping"``.
        nbytes: size of the stored data in bytes (``0`` when unknown).

    Example:
        >>> VariableInfo("dense/kernel", (3, 4), "float32").size
        12
    """

    name: str
    shape: Tuple[int, ...]
    dtype: str
    key: Optional[str] = None
    kind: str = KIND_VARIABLE
    nbytes: int = field(default=0, compare=False)

    @property
    def size(self) -> int:
        """Number of elements."""
        n = 1
        for d in self.shape:
            n *= d
        return n

    @property
    def raw_key(self) -> str:
        """The checkpoint key, falling back to the name."""
        return self.key if self.key is not None else self.name

    def to_dict(self) -> dict:
        """JSON-ready dict: name, key, dtype, shape (list), kind, nbytes."""
        return {"name": self.name, "key": self.raw_key, "dtype": self.dtype,
                "shape": list(self.shape), "kind": self.kind, "nbytes": self.nbytes}



def trusted_maker(cls: Type[_T]) -> Callable[..., _T]:
    """A constructor of the frozen slotted dataclass ``cls`` (see :func:`frozen_slots`) that
    takes every field positionally and checks nothing: no ``__init__``, no ``__post_init__``.
    About twice as fast as ``cls(...)``, for the places that build one per checkpoint entry
    (100k at a time) from fields already checked.

    The object is made as an instance of a mutable twin of ``cls`` (the same slots, nothing
    else), its slots filled by plain attribute stores (the interpreter's fastest way), then
    turned into a ``cls``: the layouts are the same, so the result is an ordinary frozen ``cls``.

    Raises:
        TypeError: ``cls`` is not a class :func:`frozen_slots` made (another layout).

    Example:
        >>> make = trusted_maker(VariableInfo)
        >>> info = make("x", (2,), "float32", None, "variable", 8)
        >>> info == VariableInfo("x", (2,), "float32"), type(info) is VariableInfo
        (True, True)
    """
    names = [f.name for f in fields(cls)]
    if getattr(cls, "__slots__", None) != tuple(names) or cls.__bases__ != (object,):
        raise TypeError(f"trusted_maker needs a frozen_slots dataclass; {cls.__name__} has another layout")
    twin = type(f"_Mutable{cls.__name__}", (object,), {"__slots__": tuple(names)})
    lines = [f"def make({', '.join(names)}):", "    obj = new(twin)"]
    lines += [f"    obj.{n} = {n}" for n in names]
    lines += ["    obj.__class__ = cls", "    return obj"]
    scope: dict = {"new": object.__new__, "cls": cls, "twin": twin}
    exec("\n".join(lines), scope)  # unrolled, as dataclasses writes its __init__
    make = scope["make"]
    make.__qualname__ = f"trusted_maker({cls.__name__})"
    return make


#: ``trusted_info(name, shape, dtype, key, kind, nbytes)``: a :class:`VariableInfo` from fields
#: the caller already checked (all six given, ``shape`` a tuple of ints): see
#: :func:`trusted_maker`. For readers that build one per index entry.
trusted_info: Callable[[str, Tuple[int, ...], str, Optional[str], str, int], VariableInfo] = trusted_maker(VariableInfo)


_NAME = operator.attrgetter("name")
_KIND = operator.attrgetter("kind")


def model_variables(infos: Iterable[VariableInfo]) -> List[VariableInfo]:
    """The infos of kind ``"variable"`` (optimizer state and bookkeeping left out), in order, in
    passes at C speed.

    Example:
        >>> [v.name for v in model_variables([VariableInfo("w", (), "float32"),
        ...                                   VariableInfo("step", (), "int64", kind=KIND_BOOKKEEPING)])]
        ['w']
    """
    infos = list(infos)
    return list(itertools.compress(infos, map(operator.eq, map(_KIND, infos), itertools.repeat(KIND_VARIABLE))))


def by_name(infos: Iterable[VariableInfo]) -> Dict[str, VariableInfo]:
    """``{name: info}`` sorted by name (of two infos with one name, the later one stays), in a
    few passes at C speed when the infos come sorted already, as readers give them.

    Example:
        >>> list(by_name([VariableInfo("b", (), "int32"), VariableInfo("a", (), "int32")]))
        ['a', 'b']
    """
    ordered = list(infos)
    names = list(map(_NAME, ordered))
    if not all(map(operator.lt, names, names[1:])):
        ordered.sort(key=_NAME)
        names = list(map(_NAME, ordered))
    return dict(zip(names, ordered))
