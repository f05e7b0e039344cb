"""The combine methods' parameters: what each one accepts, and gradient lists over layers.

One table (:data:`PARAMS`) says, for every parameter of every method, its kind and its allowed
range; :func:`param_problems` checks a value against it (a plain value, ``{glob: value}``, or a
gradient list), so ``cm.combine``, ``ckptmerge combine --param`` and the ``combine:`` section of
a config file refuse the same values with the same words: the parameter's name, what it accepts,
what was received. A parameter a method defines and the table does not name is checked by the
type of its default (a finite number, ``true``/``false``, a string).

Gradients, as mergekit's: a list of values (``t=[0, 0.5, 1]``) is spread over the layers, a
tensor of layer ``i`` of ``n`` taking the list at ``i / (n - 1)`` (``1`` for one layer), linearly
interpolated between neighbouring entries for numbers and the entry at or below it for the
other kinds. A tensor's layer is :func:`layer_index`; ``n`` is one more than the largest index
among the combined names. Pure: no files.

Example:
    >>> param_problems("density", float("nan"))
    ['density must be a number in (0, 1]; received nan (type float)']
    >>> Gradient((0.0, 0.5, 1.0)).at(0.75)
    0.75
"""

from __future__ import annotations

import math
import numbers
import re
from dataclasses import dataclass
from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

from ..core.args import describe_value

__all__ = ["Param", "PARAMS", "Gradient", "param_spec", "param_problems", "weight_problems", "layer_index",
           "layer_positions", "is_number", "resolved"]


def is_number(v: Any) -> bool:
    """A real number, not a bool (``True`` is an int in Python, never a density).

    Example:
        >>> is_number(0.5), is_number(True), is_number("0.5")
        (True, False, False)
    """
    return isinstance(v, numbers.Real) and not isinstance(v, bool) and type(v).__name__ != "bool_"


@dataclass(frozen=True)
class Param:
    """One parameter: its kind (``"number"``, ``"integer"``, ``"bool"``, ``"choice"``) and range.

    Example:
        >>> Param("t", "number", 0, 1).allowed()
        'a number in [0, 1]'
    """

    name: str
    kind: str
    low: Optional[float] = None
    high: Optional[float] = None
    open_low: bool = False
    open_high: bool = False
    choices: Tuple[str, ...] = ()

    def allowed(self) -> str:
        """What the parameter accepts, as a message says it."""
        if self.kind == "bool":
            return "true or false"
        if self.kind == "choice":
            return "one of " + ", ".join(repr(c) for c in self.choices)
        what = "an integer" if self.kind == "integer" else "a number"
        if self.low is None and self.high is None:
            return f"a finite {what[2:] if what.startswith('a ') else what[3:]}"
        lo = "-inf" if self.low is None else f"{self.low:g}"
        hi = "2**63" if (self.kind == "integer" and self.high == 2 ** 63) else (
            "inf" if self.high is None else f"{self.high:g}")
        return f"{what} in {'(' if self.open_low or self.low is None else '['}{lo}, {hi}" \
               f"{')' if self.open_high or self.high is None else ']'}"

    def problem(self, v: Any) -> Optional[str]:
        """Why ``v`` is not a value of this parameter, or ``None``."""
        ok = self._ok(v)
        return None if ok else f"{self.name} must be {self.allowed()}; received {describe_value(v)}"

    def _ok(self, v: Any) -> bool:
        if self.kind == "bool":
            return isinstance(v, bool)
        if self.kind == "choice":
            return isinstance(v, str) and v in self.choices
        if not is_number(v) or not math.isfinite(v):
            return False
        if self.kind == "integer" and float(v) != math.floor(v):
            return False
        if self.low is not None and (v <= self.low if self.open_low else v < self.low):
            return False
        if self.high is not None and (v >= self.high if self.open_high else v > self.high):
            return False
        return True

    def value(self, v: Any) -> Any:
        """``v`` (already checked) as the method uses it: a float, an int, a bool or a string."""
        if self.kind == "number" and is_number(v):
            return float(v)
        if self.kind == "integer" and is_number(v):
            return int(v)
        return v


#: Every parameter of the built-in methods: its kind and what it accepts.
PARAMS: Dict[str, Param] = {p.name: p for p in (
    Param("density", "number", 0, 1, open_low=True),
    Param("t", "number", 0, 1),
    Param("decay", "number", 0, 1, open_high=True),
    Param("scale", "number"),
    Param("seed", "integer", 0, 2 ** 63, open_high=True),
    Param("consensus", "choice", choices=("ties", "none")),
    Param("normalize", "bool"),
    Param("filter_wise", "bool"),
)}


def param_spec(key: str, default: Any = None) -> Param:
    """The :class:`Param` of ``key``: from :data:`PARAMS`, else by the type of its default."""
    if key in PARAMS:
        return PARAMS[key]
    if isinstance(default, bool):
        return Param(key, "bool")
    if isinstance(default, str):
        return Param(key, "choice", choices=(default,))
    return Param(key, "number")


@dataclass(frozen=True)
class Gradient:
    """A gradient list: values spread over the layers (see the module).

    Example:
        >>> Gradient((0.0, 1.0, 0.0)).at(0.25), Gradient(("ties", "none")).at(0.5), Gradient((3, 7), False).at(0.9)
        (0.5, 'ties', 3)
    """

    values: Tuple[Any, ...]
    interpolate: bool = True  # numbers: linear between entries; False: the entry at or below

    def at(self, t: float) -> Any:
        """The value at ``t`` in [0, 1] (mergekit's ``evaluate_setting``)."""
        vs = self.values
        scaled = t * (len(vs) - 1)
        i0 = min(len(vs) - 1, int(scaled))
        if not self.interpolate or not all(is_number(v) for v in vs):
            return vs[i0]
        i1 = min(len(vs) - 1, i0 + 1)
        frac = scaled - i0
        return (1 - frac) * float(vs[i0]) + frac * float(vs[i1])

    def __str__(self) -> str:
        return "[" + ", ".join(f"{v:g}" if is_number(v) else repr(v) for v in self.values) + "]"


def param_problems(key: str, value: Any, default: Any = None) -> List[str]:
    """What is wrong with a value of parameter ``key``: a plain value, ``{glob: value}`` or a
    gradient list (a non-empty list of plain values); each problem names the parameter, what it
    accepts and what was received (empty when the value is fine).

    Example:
        >>> param_problems("seed", [1, 2.5])
        ['seed[1] must be an integer in [0, 2**63); received 2.5 (type float)']
    """
    spec = param_spec(key, default)
    if isinstance(value, Mapping):
        if not value:
            return [f"{key} is an empty mapping: give a value, or {{glob: value}} with at least one glob"]
        out = []
        for g, v in value.items():
            if not isinstance(g, str) or not g:
                out.append(f"{key}: globs must be non-empty strings; received the key {describe_value(g)}")
            elif isinstance(v, Mapping):
                out.append(f"{key}[{g!r}] must be a value or a gradient list, not another mapping; received "
                           f"{describe_value(v)}")
            else:
                out.extend(_plain_or_gradient(spec, v, f"{key}[{g!r}]"))
        return out
    return _plain_or_gradient(spec, value, key)


def _plain_or_gradient(spec: Param, value: Any, where: str) -> List[str]:
    if isinstance(value, (list, tuple)):
        if not value:
            return [f"{where} is an empty list: a gradient needs at least one value"]
        out = []
        for i, v in enumerate(value):
            bad = spec.problem(v)
            if bad:
                out.append(bad.replace(spec.name, f"{where}[{i}]", 1))
        return out
    bad = spec.problem(value)
    return [bad.replace(spec.name, where, 1)] if bad else []


def resolved(key: str, value: Any, default: Any = None) -> Any:
    """A checked plain value or gradient list as the methods take it (gradients as
    :class:`Gradient`)."""
    spec = param_spec(key, default)
    if isinstance(value, (list, tuple)):
        return Gradient(tuple(spec.value(v) for v in value), spec.kind == "number")
    return spec.value(value)


def weight_problems(method: str, weights: Sequence[float], params: Mapping[str, Any]) -> List[str]:
    """Why one tensor's weights cannot be used: sums that overflow float64, a weighted mean
    whose weights sum to 0 or to so little that dividing by it overflows, ``scale`` times the
    weights overflowing (empty when they are fine).

    Example:
        >>> weight_problems("mean", [1e308, 1e308], {})
        ['the weights 1e+308, 1e+308 sum to more than float64 holds; use smaller weights (only their ratios matter to a mean)']
    """
    text = ", ".join(f"{w:g}" for w in weights)
    try:
        total = math.fsum(weights)
        size = math.fsum(abs(w) for w in weights)
    except OverflowError:
        total = size = math.inf
    if not math.isfinite(size) or not math.isfinite(total):
        return [f"the weights {text} sum to more than float64 holds; use smaller weights"
                + (" (only their ratios matter to a mean)" if method == "mean" else "")]
    if method == "mean" and params.get("normalize", True):
        if total == 0:
            return [f"the weights {text} sum to 0; a weighted mean needs a nonzero sum (normalize=False "
                    "takes the weighted sum as it is)"]
        if not all(math.isfinite(w / total) for w in weights):
            return [f"the weights {text} sum to {total:g}: dividing by it overflows float64"]
    scale = params.get("scale")
    if is_number(scale) and not math.isfinite(scale * size):
        return [f"scale={scale:g} times the weights {text} overflows float64"]
    return []


_SPLIT = re.compile(r"[./]")


def layer_index(name: str) -> Optional[int]:
    """The layer a tensor belongs to, for gradients: the first component of its name (split at
    ``.`` and ``/``) that is a number, ignoring the numbered variables of a Keras layer
    (``.../vars/0``); ``None`` outside the numbered layers.

    Example:
        >>> layer_index("model.layers.12.self_attn.q_proj.weight"), layer_index("lm_head.weight")
        (12, None)
        >>> layer_index("layers/dense/vars/0") is None
        True
    """
    parts = _SPLIT.split(name)
    for i, part in enumerate(parts):
        if part.isdigit() and part.isascii():
            if i and parts[i - 1] == "vars":
                return None
            return int(part)
    return None


def layer_positions(names: Iterable[str]) -> Tuple[Dict[str, float], int]:
    """``{name: t}`` for the names inside numbered layers (``t = i / (n - 1)``, ``1`` for one
    layer, as mergekit spreads a gradient over a slice), and ``n`` (one more than the largest
    layer index).

    Example:
        >>> layer_positions(["h.0.w", "h.2.w", "h.1.w", "wte"])
        ({'h.0.w': 0.0, 'h.2.w': 1.0, 'h.1.w': 0.5}, 3)
    """
    idx = {n: layer_index(n) for n in names}
    found = {n: i for n, i in idx.items() if i is not None}
    if not found:
        return {}, 0
    n = max(found.values()) + 1
    return {k: (i / (n - 1) if n > 1 else 1.0) for k, i in found.items()}, n
