"""Names and specs of variables: the small vocabulary every other module speaks.

A *name* is a checkpoint key or a target variable name without the ``:0`` output suffix,
normalised by :func:`normalize_name` (the one place that does it). A :class:`VariableInfo`
describes one tensor of a checkpoint or one target variable: its name, its raw checkpoint key,
its shape (a tuple) and its dtype (a numpy-style name such as ``"float32"``, ``"bfloat16"`` or
``"string"``). Nothing here touches files or TensorFlow.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Optional, Tuple

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


@dataclass(frozen=True)
class VariableInfo:
    """One tensor of a checkpoint, or one target variable.

    Attributes:
        name: the name ckptmerge matches on (see the README's "Names" section).
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
