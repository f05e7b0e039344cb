"""What a combination of checkpoints does: :class:`CombineReport`, in text, JSON and HTML.

Made by :meth:`ckptmerge.combining.combine.CombinedSource.report` (without reading a tensor) and
kept on the opened source: the inputs as resolved, the method and its parameters per family of
tensors, and every name a policy touched (averaged over fewer inputs, copied from one input,
left out), so nothing is averaged silently over fewer checkpoints than the user thinks.
"""

from __future__ import annotations

import html
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple

from ..render.notebook import html_table
from ..core.redact import redact, redacted_repr
from ..render.report import section
from ..core.text import escape_name, human_bytes, join_lines, plural, quote_name

__all__ = ["CombineReport"]


@dataclass(frozen=True)
class CombineReport:
    """A combination, described.

    Attributes:
        method: the method's name.
        inputs: one dict per input in combining order: ``label``, ``path`` (as resolved),
            ``note`` (how it was resolved), ``step``, ``weight`` (a number, or the weight's globs).
        base: the same for the base, or ``None``.
        options: ``dtype``, ``accumulate``, ``keys``, ``integers``, ``optimizer``.
        families: ``(parameters, tensor count, first names)`` per family of tensors that share
            their parameters.
        fewer: ``(name, inputs holding it, all inputs)`` for each name combined over fewer inputs
            (``keys="union"``).
        copied: ``(name, policy, input label)`` for integer and bool tensors taken from one input.
        left_out: ``(name, reason)`` for the names not in the result.
        dtypes: ``(name, dtype written, the inputs' dtypes)`` where the inputs' dtypes differ.
        tensors: the number of names in the result.
        nbytes_out: bytes of the result; ``nbytes_read``: bytes read from the inputs to make it once.
        conventions: ``(parameter, how its value and meaning were chosen)``: set, or the default
            of ckptmerge's or mergekit's conventions (``options["conventions"]``), and which
            convention its meaning follows (DARE's rescale, filters, SLERP of a zero tensor).

    Example:
        >>> r = CombineReport("mean", [{"label": "a", "path": "/r/a", "note": "", "step": 1, "weight": 1.0}],
        ...                   None, {"keys": "strict"}, [("weights 1", 2, ["x", "y"])], tensors=2)
        >>> r.summary()
        'mean of 1 input (step 1): 2 tensors'
    """

    __repr__ = redacted_repr  # (a REPL, a notebook or a log line shows no credential)

    method: str
    inputs: List[Dict[str, Any]]
    base: Optional[Dict[str, Any]]
    options: Dict[str, Any]
    families: List[Tuple[str, int, List[str]]] = field(default_factory=list)
    fewer: List[Tuple[str, int, int]] = field(default_factory=list)
    copied: List[Tuple[str, str, str]] = field(default_factory=list)
    left_out: List[Tuple[str, str]] = field(default_factory=list)
    dtypes: List[Tuple[str, str, str]] = field(default_factory=list)
    tensors: int = 0
    nbytes_out: int = 0
    nbytes_read: int = 0
    optimizer_left_out: int = 0
    conventions: List[Tuple[str, str]] = field(default_factory=list)

    def summary(self) -> str:
        """One line: method, inputs, tensors, and how many names each policy touched."""
        text = f"{self.method} of {plural(len(self.inputs), 'input')}"
        steps = [d.get("step") for d in self.inputs]
        if steps and all(isinstance(n, int) for n in steps):  # the checkpoints of a run: which ones
            text += f" (step{'s' if len(steps) > 1 else ''} {', '.join(map(str, steps))})"
        if self.base is not None:
            text += f" on base {quote_name(self.base['label'])}"
        text += f": {plural(self.tensors, 'tensor')}"
        extra = []
        if self.fewer:
            extra.append(f"{len(self.fewer)} over fewer inputs")
        if self.copied:
            extra.append(f"{len(self.copied)} copied ({self.options.get('integers')})")
        if self.left_out:
            extra.append(f"{len(self.left_out)} left out")
        return text + (f" ({', '.join(extra)})" if extra else "")

    def render(self, *, limit: Optional[int] = 50) -> str:
        """Plain text: the summary, inputs, options, families and the names each policy touched."""
        out = [self.summary()]
        if self.nbytes_out:
            out.append(f"Result: {human_bytes(self.nbytes_out)}, made from {human_bytes(self.nbytes_read)} read")
        rows = [self.base] if self.base is not None else []
        out.append("Inputs:")
        for i, d in enumerate(rows + self.inputs):
            role = "base" if self.base is not None and i == 0 else f"{i - (1 if self.base is not None else 0) + 1}"
            weight = "" if d.get("weight") is None else f", weight {d['weight']}"
            step = "" if d.get("step") is None else f", step {d['step']}"
            out.append(f"  {role}. {quote_name(d['label'])}: {escape_name(str(d['path']))}{step}{weight}"
                       + (f" ({escape_name(d['note'])})" if d.get("note") else ""))
        opts = ", ".join(f"{k}={v}" for k, v in self.options.items())
        out.append(f"Options: {opts}")
        if self.conventions and self.options.get("conventions") == "mergekit":  # (ckptmerge's: the docs')
            out.append(f"Conventions: {self.options.get('conventions', 'ckptmerge')}")
            out += [f"  {k}: {v}" for k, v in self.conventions]
        out += section("Parameters per family", [f"{p}: {plural(n, 'tensor')}, e.g. {', '.join(map(quote_name, names[:3]))}"
                                                 for p, n, names in self.families], limit)
        out += section("Combined over fewer inputs", [f"{n}: {k} of {total}" for n, k, total in self.fewer], limit,
                       render=escape_name)
        out += section("Copied from one input", [f"{n}: {pol} ({quote_name(src)})" for n, pol, src in self.copied], limit,
                       render=escape_name)
        out += section("Dtypes differ", [f"{n}: written as {d} (inputs: {ds})" for n, d, ds in self.dtypes], limit,
                       render=escape_name)
        out += section("Left out", [f"{n}: {why}" for n, why in self.left_out], limit, render=escape_name)
        if self.optimizer_left_out:
            out.append(f"Optimizer state and bookkeeping left out: {plural(self.optimizer_left_out, 'name')} "
                       "(combine(..., optimizer=True) keeps them)")
        return join_lines(out)

    def __str__(self) -> str:
        return self.render()

    def to_dict(self) -> Dict[str, Any]:
        """JSON-ready: every field, lists of records."""
        return {
            "summary": self.summary(), "method": self.method, "inputs": [_shown(d) for d in self.inputs],
            "base": _shown(self.base) if self.base is not None else None, "options": dict(self.options),
            "families": [{"parameters": p, "count": n, "names": list(names)} for p, n, names in self.families],
            "fewer": [{"name": n, "count": k, "of": total} for n, k, total in self.fewer],
            "copied": [{"name": n, "policy": pol, "from": src} for n, pol, src in self.copied],
            "dtypes": [{"name": n, "dtype": d, "inputs": ds} for n, d, ds in self.dtypes],
            "left_out": [{"name": n, "reason": why} for n, why in self.left_out],
            "tensors": self.tensors, "bytes": self.nbytes_out, "bytes_read": self.nbytes_read,
            "optimizer_left_out": self.optimizer_left_out,
            "conventions": [{"parameter": k, "followed": v} for k, v in self.conventions],
        }

    def to_html(self) -> str:
        """An HTML fragment (every name escaped), as notebooks show it."""
        parts = [f"<p><b>{html.escape(self.summary())}</b></p>"]
        base = _shown(self.base) if self.base else None
        rows = ([["base", base["label"], base["path"], base.get("step"), ""]] if base else [])
        rows += [[i + 1, d["label"], d["path"], d.get("step"), d.get("weight")] for i, d in enumerate(map(_shown, self.inputs))]
        parts.append(html_table(["", "input", "path", "step", "weight"], rows))
        parts.append(html_table(["parameters", "tensors", "e.g."],
                                [[p, n, ", ".join(names[:3])] for p, n, names in self.families]))
        for title, heads, items in (("Combined over fewer inputs", ["name", "inputs", "of"], self.fewer),
                                    ("Copied from one input", ["name", "policy", "from"], self.copied),
                                    ("Dtypes differ", ["name", "written as", "inputs"], self.dtypes),
                                    ("Left out", ["name", "reason"], self.left_out)):
            if items:
                parts.append(f"<h4>{html.escape(title)} ({len(items)})</h4>")
                parts.append(html_table(heads, items))
        return "".join(parts)

    def _repr_html_(self) -> str:
        return self.to_html()


def _shown(record: Dict[str, Any]) -> Dict[str, Any]:
    """An input's record as shown or written (JSON, HTML): its label, path and note without credentials."""
    return {k: redact(v) if k in ("label", "path", "note") and isinstance(v, str) else v for k, v in record.items()}
