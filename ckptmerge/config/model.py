"""The validated config: :class:`Config` and its :class:`SourceConfig` entries.

They map one to one onto the Python API (``ckptmerge.Source`` keyword arguments and the
options of ``ckptmerge.planning.planner``) and back to plain data with ``to_dict``. Built by
:func:`ckptmerge.config.load_config`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple, Union
from urllib.parse import urlsplit

from ..planning.transforms import Slice, VocabRemap
from ..core.redact import redacted_repr
from .env import escape_dollars


@dataclass(frozen=True)
class SourceConfig:
    """One validated entry of ``sources``: the arguments of one ``ckptmerge.Source``.

    Paths are absolute (environment variables expanded, relative paths resolved). ``cast=None``
    means "as the plan's ``cast``". ``vocab``, ``slice`` and ``ops`` (the ``reshape``, ``split``
    and ``transpose`` entries, in that order) hold ready transform objects.

    Example:
        >>> SourceConfig(path="/runs/A", map={"a1": "c/x1"}).source_kwargs()["map"]
        {'a1': 'c/x1'}
    """

    __repr__ = redacted_repr  # (a REPL, a notebook or a log line shows no credential)

    path: str
    name: Optional[str] = None
    step: Optional[int] = None
    map: Optional[Dict[str, Union[str, List[str]]]] = None
    regex: Optional[List[Tuple[str, Optional[str]]]] = None
    include: Optional[List[str]] = None
    exclude: Optional[List[str]] = None
    optimizer: bool = False
    cast: Optional[bool] = None
    vocab: Tuple[VocabRemap, ...] = ()
    slice: Tuple[Slice, ...] = ()
    align: Optional[str] = None
    layout: Optional[str] = None
    item: Optional[str] = None
    ops: Tuple[Any, ...] = ()

    @property
    def transforms(self) -> List[Any]:
        """The value transforms, in the order they apply: vocab remaps, slices, then the tensor
        operations (``reshape``, ``split``, ``transpose`` entries: :attr:`ops`)."""
        return [*self.vocab, *self.slice, *self.ops]

    def source_kwargs(self) -> Dict[str, Any]:
        """Keyword arguments for ``ckptmerge.Source(**kwargs)`` (``path`` included).

        Example:
            >>> sorted(SourceConfig(path="/runs/A").source_kwargs())  # doctest: +NORMALIZE_WHITESPACE
            ['align', 'cast', 'exclude', 'include', 'item', 'layout', 'map', 'name', 'optimizer', 'path',
             'regex', 'step', 'transforms']
        """
        return {
            "path": self.path,
            "step": self.step,
            "map": dict(self.map) if self.map is not None else None,
            "regex": [tuple(r) for r in self.regex] if self.regex is not None else None,
            "include": list(self.include) if self.include is not None else None,
            "exclude": list(self.exclude) if self.exclude is not None else None,
            "optimizer": self.optimizer,
            "name": self.name,
            "cast": self.cast,
            "transforms": self.transforms,
            "align": self.align,
            "layout": self.layout,
            "item": self.item,
        }

    def to_dict(self) -> Dict[str, Any]:
        """The entry as plain data (only the options that are set); see :meth:`Config.to_dict`."""
        out: Dict[str, Any] = {}
        if self.name is not None:
            out["name"] = self.name
        out["path"] = escape_dollars(self.path)
        if self.step is not None:
            out["step"] = self.step
        if self.item is not None:
            out["item"] = self.item
        if self.map is not None:
            out["map"] = dict(self.map)
        if self.regex is not None:
            out["regex"] = [[p, r] for p, r in self.regex]
        if self.include is not None:
            out["include"] = list(self.include)
        if self.exclude is not None:
            out["exclude"] = list(self.exclude)
        if self.optimizer:
            out["optimizer"] = True
        if self.cast is not None:
            out["cast"] = self.cast
        if self.align is not None:
            out["align"] = self.align
        if self.layout is not None:
            out["layout"] = self.layout
        if self.vocab:
            out["vocab"] = [_vocab_to_dict(v) for v in self.vocab]
        if self.slice:
            out["slice"] = [{"name": s.target, "axis": s.axis, "init": s.init, **({"start": s.start} if s.start else {})}
                            for s in self.slice]
        for op in self.ops:
            data = {k: v for k, v in op.to_dict().items() if v is not None}
            kind = data.pop("kind")
            out.setdefault(kind, []).append({"name": data.pop("target"), **data})
        return out


def _vocab_to_dict(v: VocabRemap) -> Dict[str, Any]:
    data = v.to_dict()
    out: Dict[str, Any] = {"name": data.pop("target")}
    data.pop("kind")
    for key in ("old_vocab", "new_vocab"):  # paths are written back with $ escaped
        if isinstance(data[key], str):
            data[key] = escape_dollars(data[key])
    out.update(data)
    return out


@dataclass(frozen=True)
class CombineConfig:
    """The validated ``combine:`` section: the arguments of one ``ckptmerge.combine`` call.

    Attributes:
        method: the method's name.
        models: the inputs, each a :class:`SourceConfig` (its own rules) and its weight (a number,
            ``{glob: number}`` or ``None``); empty when ``run`` is given.
        run: a training directory whose checkpoints ``last``, ``steps``, ``every`` select.
        base: the base checkpoint, or ``None``.
        parameters: the method's parameters (values or ``{glob: value}``).
        options: ``dtype``, ``keys``, ``integers``, ``optimizer``, ``accumulate``, ``conventions``.
        rules: the rule keywords on the combined names (``name``, ``map``, ``regex``,
            ``include``, ``exclude``, ``layout``).

    Example:
        >>> CombineConfig(method="mean", run="/runs/A", last=5).combine_kwargs()["last"]
        5
    """

    __repr__ = redacted_repr  # (a REPL, a notebook or a log line shows no credential)

    method: str = "mean"
    models: List[Tuple[SourceConfig, Any]] = field(default_factory=list)
    run: Optional[str] = None
    last: Optional[int] = None
    steps: Any = None
    every: Optional[int] = None
    base: Optional[SourceConfig] = None
    parameters: Dict[str, Any] = field(default_factory=dict)
    options: Dict[str, Any] = field(default_factory=dict)
    rules: Dict[str, Any] = field(default_factory=dict)

    def combine_kwargs(self) -> Dict[str, Any]:
        """Keyword arguments of ``ckptmerge.combine`` (``checkpoints`` and ``method`` included)."""
        from ..sources.source import Source

        out: Dict[str, Any] = {"method": self.method, **self.options, **self.parameters, **self.rules}
        if self.run is not None:
            out.update(checkpoints=self.run, last=self.last, steps=self.steps, every=self.every)
        else:
            out["checkpoints"] = [Source(**m.source_kwargs()) for m, _ in self.models]
            weights = [w for _, w in self.models]
            if any(w is not None for w in weights):
                out["weights"] = [1.0 if w is None else w for w in weights]
        if self.base is not None:
            out["base"] = Source(**self.base.source_kwargs())
        return out

    def make_source(self) -> Any:
        """The :class:`ckptmerge.combining.combine.CombinedSource` (nothing is opened yet)."""
        from ..combining.combine import combine

        kw = self.combine_kwargs()
        return combine(kw.pop("checkpoints"), kw.pop("method"), **kw)

    def to_dict(self) -> Dict[str, Any]:
        """The section as plain data (see :meth:`Config.to_dict`)."""
        out: Dict[str, Any] = {"method": self.method}
        if self.run is not None:
            out["run"] = escape_dollars(self.run)
            for k in ("last", "every"):
                if getattr(self, k) is not None:
                    out[k] = getattr(self, k)
            if self.steps is not None:
                out["steps"] = ({"from": self.steps[0], "to": self.steps[1]} if isinstance(self.steps, tuple)
                                else list(self.steps))
        else:
            out["models"] = [{**m.to_dict(), **({"weight": w} if w is not None else {})} for m, w in self.models]
        if self.base is not None:
            out["base"] = self.base.to_dict()
        if self.parameters:
            out["parameters"] = dict(self.parameters)
        out.update(self.options)
        out.update(self.rules)
        return out


@dataclass(frozen=True)
class RemoteURL:
    """A URL a config makes ckptmerge contact (``ckptmerge check`` lists them).

    Attributes:
        key: where it is in the config (``"sources[0].path"``, ``"output"``).
        written: as written in the config (``${VAR}`` kept).
        url: as contacted, environment variables expanded.

    Example:
        >>> RemoteURL("output", "s3://${BUCKET}/m", "s3://models/m").host
        's3://models'
    """

    __repr__ = redacted_repr  # (a REPL, a notebook or a log line shows no credential)

    key: str
    written: str
    url: str = field(repr=False)  # (it may hold an allowed variable's value)

    @property
    def host(self) -> str:
        """``scheme://host[:port]`` of :attr:`url` (never its userinfo)."""
        parts = urlsplit(self.url)
        netloc = parts.netloc.rpartition("@")[2]
        return f"{parts.scheme}://{netloc}" if netloc else f"{parts.scheme}://"


@dataclass(frozen=True)
class Config:
    """A validated warm-start config.

    Attributes:
        path: the config file as given (``None`` for a dict). Not compared: the same config in
            YAML, TOML and JSON gives equal objects.
        sources: one :class:`SourceConfig` per entry of ``sources``, in order (= priority).
        plan_options: keyword arguments of ``ckptmerge.planning.planner``: ``allow_missing`` (list),
            ``on_conflict``, ``on_shape_mismatch``, ``cast``, ``verify``.
        strict: whether findings other than ``unused`` stop the restore (default ``True``).
        target: a checkpoint used as the dry-run target by ``ckptmerge plan`` (absolute path).
        output: the output prefix of an offline merge (absolute path).
        combine: the ``combine:`` section (a source made of many checkpoints, first in
            priority), or ``None``.
        record_paths: whether a safetensors merge output records its sources' paths in its
            metadata (``ckptmerge.merge(..., record_paths=...)``; default ``True``).
        urls: every URL the config names (:class:`RemoteURL`), in file order. Not compared.
        conventions: rows for the naming-convention table of structural alignment
            (:class:`~ckptmerge.alignment.conventions.Convention`) and for the fused-module table
            (:class:`~ckptmerge.alignment.fused.FusedConvention`, entries with ``parts``), added by
            :meth:`make_sources` (for every later alignment in the process, as
            :func:`ckptmerge.add_convention` does).

    Example:
        >>> from ckptmerge.config import load_config
        >>> cfg = load_config({"sources": [{"path": "."}], "on_conflict": "first"})
        >>> cfg.plan_options["on_conflict"], cfg.strict
        ('first', True)
    """

    __repr__ = redacted_repr  # (a REPL, a notebook or a log line shows no credential)

    path: Optional[str] = field(default=None, compare=False)
    sources: List[SourceConfig] = field(default_factory=list)
    plan_options: Dict[str, Any] = field(default_factory=dict)
    strict: bool = True
    target: Optional[str] = None
    output: Optional[str] = None
    combine: Optional[CombineConfig] = None
    record_paths: bool = True
    urls: Tuple[RemoteURL, ...] = field(default=(), compare=False)
    conventions: Tuple[Any, ...] = ()

    @property
    def hosts(self) -> List[str]:
        """The hosts the config makes ckptmerge contact (``scheme://host``), sorted, once each.

        Example:
            >>> Config(urls=(RemoteURL("output", "s3://b/m", "s3://b/m"),)).hosts
            ['s3://b']
        """
        return sorted({u.host for u in self.urls})

    def source_kwargs(self) -> List[Dict[str, Any]]:
        """Per source, the keyword arguments of ``ckptmerge.Source(**kwargs)``.

        Example:
            >>> cfg = Config(sources=[SourceConfig(path="/runs/A", exclude=["*/Adam*"])])
            >>> cfg.source_kwargs()[0]["exclude"]
            ['*/Adam*']
        """
        return [s.source_kwargs() for s in self.sources]

    def make_sources(self) -> List[Any]:
        """The :class:`ckptmerge.Source` objects this config describes (none is opened yet).

        Example:
            >>> cfg = Config(sources=[SourceConfig(path="/runs/A", name="base")])
            >>> [src.label for src in cfg.make_sources()]
            ['base']
        """
        from ..sources.source import Source

        if self.conventions:
            from ..alignment.conventions import add_convention, conventions
            from ..alignment.fused import add_fused_convention, fused_conventions

            known = set(conventions()) | set(fused_conventions())
            for row in self.conventions:
                if row in known:  # (a config loaded twice adds its rows once)
                    continue
                if hasattr(row, "parts"):
                    add_fused_convention(row.names, row.parts, equal=row.equal, why=row.why)
                else:
                    add_convention(row.names, row.role, row.why, replace=row.replace, leaf=row.leaf)
        combined = [self.combine.make_source()] if self.combine is not None else []
        return combined + [Source(**kw) for kw in self.source_kwargs()]

    def to_dict(self) -> Dict[str, Any]:
        """The config as plain data: ``load_config(cfg.to_dict()) == cfg``.

        Paths are absolute with any literal ``$`` written as ``$$``; a dropping regex has a
        ``None`` replacement (write ``false`` when saving as TOML, which has no null).

        Example:
            >>> Config(sources=[SourceConfig(path="/runs/$A")]).to_dict()["sources"]
            [{'path': '/runs/$$A'}]
        """
        out: Dict[str, Any] = {}
        if self.sources or self.combine is None:
            out["sources"] = [s.to_dict() for s in self.sources]
        if self.combine is not None:
            out["combine"] = self.combine.to_dict()
        opts = dict(self.plan_options)
        out["allow_missing"] = list(opts.get("allow_missing", []))
        for k in ("on_conflict", "on_shape_mismatch", "cast", "verify"):
            if k in opts:
                out[k] = opts[k]
        if opts.get("skip_mismatch"):
            out["skip_mismatch"] = True
        out["strict"] = self.strict
        if self.target is not None:
            out["target"] = escape_dollars(self.target)
        if self.output is not None:
            out["output"] = escape_dollars(self.output)
        if not self.record_paths:
            out["record_paths"] = False
        if self.conventions:
            out["conventions"] = [
                {"names": list(c.names), "parts": list(c.parts), **({} if c.equal else {"equal": False}),
                 **({"why": c.why} if c.why else {})} if hasattr(c, "parts") else
                {"names": list(c.names), "role": c.role, **({"why": c.why} if c.why else {}),
                 **({"replace": True} if c.replace else {}), **({"leaf": c.leaf} if c.leaf else {})}
                for c in self.conventions]
        return out
