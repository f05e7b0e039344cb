"""mergekit configs, read as written: :func:`from_mergekit` turns a mergekit YAML into a combination.

A mergekit user's ``merge.yml`` (``merge_method``, ``base_model``, ``models`` with their
``parameters``, ``slices`` whose layers line up, merge-wide ``parameters`` with ``filter`` lists,
``dtype``, ``out_dtype``) becomes one :class:`~ckptmerge.CombinedSource` made with mergekit's
conventions (:mod:`ckptmerge.combining.conventions`). Every key is honoured with mergekit's
meaning or refused by name (with "did you mean" for a misspelt one), where mergekit itself
silently ignores unknown keys and parameters a method does not read. Nothing is read but the
config file (and, for ``slices``, each model's ``config.json`` to count its layers).

The file is untrusted, as every config: read within the limits of
:mod:`ckptmerge.config.files`, model paths resolved from the config file's folder, ``$VAR``
expanded (into a URL only for the variables the user allows), and every problem reported at
once as ``FILE:LINE KEYPATH: message``.

Example:
    >>> import ckptmerge as cm
    >>> merged = cm.from_mergekit("ties.yml")                                 # doctest: +SKIP
    >>> print(merged.report())                                                # doctest: +SKIP
    >>> cm.merge(merged, "out/model.safetensors")                             # doctest: +SKIP
"""

from __future__ import annotations

import difflib
import json
import os
import re
from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple, Union

from ..combining.combine import CombinedSource, combine
from ..combining.inputs import PerInput
from ..combining.methods import CONVENTIONS, METHODS
from ..core.errors import ConfigError, did_you_mean
from ..core.text import escape_name, quote_name
from ..formats.io.localfile import read_regular_file
from .env import allowed_variables, is_remote
from .fields import Context, check_path
from .files import parse_config_file
from .problems import KeyPath, Problems, show
from .schema import report_duplicates

__all__ = ["from_mergekit", "MERGEKIT_METHODS", "MERGEKIT_KEYS"]

#: mergekit's merge methods ckptmerge runs, and the ckptmerge method each becomes.
MERGEKIT_METHODS = {"linear": "mean", "task_arithmetic": "task_arithmetic", "ties": "ties", "dare_linear": "dare",
                    "dare_ties": "dare", "slerp": "slerp", "model_stock": "model_stock"}
#: mergekit's other methods: named in the refusal, so it is not mistaken for a typo.
_OTHER_METHODS = ("passthrough", "breadcrumbs", "breadcrumbs_ties", "della", "della_linear", "nuslerp", "multislerp",
                  "karcher", "arcee_fusion", "sce", "nearswap", "ram", "lrp", "core_space")
#: The top-level keys honoured.
MERGEKIT_KEYS = ("merge_method", "base_model", "models", "slices", "parameters", "dtype", "out_dtype")
_REFUSED_TOP = {
    "tokenizer_source": "ckptmerge merges tensors only and builds no tokenizer; remove tokenizer_source and copy the "
                        "tokenizer files of the model you want (or build the tokenizer with mergekit)",
    "tokenizer": "ckptmerge merges tensors only and builds no tokenizer; remove tokenizer and copy the tokenizer files "
                 "of the model you want",
    "chat_template": "ckptmerge writes no tokenizer config; remove chat_template and set it in the tokenizer files",
    "modules": "per-module merges are not supported; use models or slices",
}
_MODEL_KEYS = ("model", "parameters")
_SLICE_KEYS = ("sources", "parameters", "base_model")
_SOURCE_KEYS = ("model", "layer_range", "parameters")
_DTYPES = ("float16", "bfloat16", "float32", "float64")

_REQUIRED = object()
_GTA = {"int8_mask": False, "normalize": False, "rescale": True, "lambda": 1.0}
#: mergekit's merge-wide parameters of each method and its defaults (``_REQUIRED``: no default).
_GLOBAL: Dict[str, Dict[str, Any]] = {
    "linear": {"normalize": True},
    "task_arithmetic": {**_GTA, "rescale": False},
    "ties": {**_GTA, "normalize": True, "rescale": False},
    "dare_linear": dict(_GTA),
    "dare_ties": dict(_GTA),
    "slerp": {"t": _REQUIRED},
    "model_stock": {"filter_wise": False},
}
#: mergekit's parameters per model (a model's own, or merge-wide for every model).
_TENSOR: Dict[str, Dict[str, Any]] = {
    "linear": {"weight": _REQUIRED},
    "task_arithmetic": {"weight": _REQUIRED, "density": 1.0},
    "ties": {"weight": _REQUIRED, "density": 1.0},
    "dare_linear": {"weight": _REQUIRED, "density": 1.0},
    "dare_ties": {"weight": _REQUIRED, "density": 1.0},
    "slerp": {},
    "model_stock": {},
}
_BOOLS = ("normalize", "int8_mask", "rescale", "filter_wise")
#: Parameters whose gradient lists are refused (the others spread over the layers, as mergekit).
_GRADIENT_REFUSED = _BOOLS + ("weight",)
_HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+")
_LAYER_KEYS = ("num_hidden_layers", "n_layer", "num_layers", "n_layers")

Setting = Union[None, Any, List[Tuple[str, Any]]]  # absent, a value, or [(filter, value), ...]


def from_mergekit(path: Union[str, "os.PathLike[str]"], *, conventions: str = "mergekit", seed: int = 0,
                  keys: str = "strict", integers: str = "last", accumulate: str = "float64",
                  env: Optional[Mapping[str, str]] = None, allow_env: Union[None, str, Iterable[str]] = None
                  ) -> CombinedSource:
    """Read a mergekit config (YAML) as written and return the combination it describes.

    ``merge_method`` ``linear``, ``task_arithmetic``, ``ties``, ``dare_linear``, ``dare_ties``,
    ``slerp`` or ``model_stock``; ``base_model``; ``models`` with ``parameters`` (``weight``,
    ``density``), or ``slices`` whose sources all take the same layers from every model and cover
    every layer; merge-wide ``parameters`` (``normalize``, ``rescale``, ``int8_mask``,
    ``lambda``, ``t``, ``filter_wise``, linear's ``normalize``, and the models' parameters for
    every model) as values or
    ``filter`` lists; ``dtype`` and ``out_dtype``; gradient lists spread over the numbered layers.
    Everything else is refused by name: ``tokenizer_source`` (ckptmerge builds no tokenizer),
    methods it does not run, gradient lists of ``weight`` or over several slices (not yet
    supported), LoRA references, Hub ids. Model paths are local folders or files
    of any format ckptmerge reads (or URLs), resolved from the config file's folder.

    Args:
        path: the mergekit ``.yml``/``.yaml`` file.
        conventions: ``"mergekit"`` (its defaults and meanings: ``density`` 1.0, DARE's L1
            rescale, substring filters, ...; docs/merging.md lists every difference) or
            ``"ckptmerge"`` (ckptmerge's, for the parameters the config leaves out).
        seed: DARE's seed (mergekit draws from torch's global generator; ckptmerge's draws are
            the same on every run for a seed).
        keys: as for :func:`ckptmerge.combine` (``"strict"``: the models hold the same names).
        integers: as for :func:`ckptmerge.combine` (integer tensors: the last model's).
        accumulate: as for :func:`ckptmerge.combine` (``"float64"``).
        env: the environment for ``$VAR`` in model paths (default ``os.environ``).
        allow_env: the variables a model path may expand into a URL (see
            :func:`ckptmerge.load_config`).

    Returns:
        A :class:`~ckptmerge.CombinedSource`; its ``report()`` says which convention each
        parameter followed. ``cm.merge(src, "out.safetensors")`` writes it.

    Raises:
        ConfigError: every problem of the file, each as ``FILE:LINE KEYPATH: message``.
        ArgumentError: a bad option of this function.

    Example:
        >>> src = from_mergekit("configs/ties.yml")                          # doctest: +SKIP
        >>> cm.merge(src, "out/merged.safetensors")                          # doctest: +SKIP
    """
    from ..combining.inputs import choice

    conventions = choice(conventions, "conventions", CONVENTIONS)
    file = os.fspath(path)
    env = os.environ if env is None else env
    data, locate, dups = parse_config_file(file, file)
    ctx = Context(Problems(file, locate), os.path.dirname(os.path.abspath(file)), "the config file's folder", env,
                  allowed_variables(allow_env, env))
    report_duplicates(dups, ctx)
    if not isinstance(data, Mapping):
        ctx.add((), f"a mergekit config is a mapping (merge_method, models, ...), received {show(data)}.")
        _raise(ctx, file)
    kwargs = _read(data, ctx)
    _raise(ctx, file)
    assert kwargs is not None
    method, inputs, base, weights, params, dtype = kwargs
    if conventions == "ckptmerge":
        params = _as_ckptmerge(method, params, ctx)
        _raise(ctx, file)
    if method == "dare":
        params["seed"] = seed
    return combine(inputs, method, base=base, weights=weights, dtype=dtype, keys=keys, integers=integers,
                   accumulate=accumulate, conventions=conventions, **params)


def _raise(ctx: Context, file: str) -> None:
    """One problem: one line (``FILE:LINE KEYPATH: message``); several: the usual list."""
    lines = ctx.problems.lines()
    if len(lines) == 1:
        raise ConfigError(escape_name(lines[0]), path=file, problems=lines)
    ctx.problems.raise_if_any(file)


# --------------------------------------------------------------------------------------------
# The file, key by key
# --------------------------------------------------------------------------------------------


def _keys(d: Mapping, allowed: Sequence[str], refused: Mapping[str, str], path: KeyPath, ctx: Context) -> bool:
    """Report refused and unknown keys of ``d`` (with "did you mean"); whether all were known."""
    ok = True
    for k in d:
        if k in allowed:
            continue
        ok = False
        if not isinstance(k, str):
            ctx.add(path, f"keys must be strings, received {show(k)}.")
        elif k in refused:
            ctx.add(path + (k,), f"{refused[k]}.", key=True)
        else:
            hint = did_you_mean(k, list(allowed) + list(refused), n=1, cutoff=0.6)
            ctx.add(path + (k,), f"unknown mergekit key '{k}'.{hint or ' Valid keys: ' + ', '.join(allowed) + '.'}",
                    key=True)
    return ok


def _read(data: Mapping, ctx: Context) -> Optional[Tuple[str, List[str], Optional[str], Optional[List[Any]],
                                                         Dict[str, Any], Optional[str]]]:
    _keys(data, MERGEKIT_KEYS, _REFUSED_TOP, (), ctx)
    mm = data.get("merge_method")
    if mm is None:
        if any(isinstance(k, str) and difflib.get_close_matches(k, ["merge_method"], n=1, cutoff=0.6)
               for k in data):  # (a misspelt merge_method: reported as that)
            return None
        ctx.add((), "missing required key 'merge_method' (linear, task_arithmetic, ties, dare_linear, dare_ties, "
                    "slerp or model_stock).")
        return None
    if mm not in MERGEKIT_METHODS:
        if isinstance(mm, str) and mm in _OTHER_METHODS:
            why = f"mergekit's {mm!r} is not supported"
        else:
            why = f"unknown merge_method {show(mm)}" + (did_you_mean(mm, list(MERGEKIT_METHODS), n=1, cutoff=0.6)
                                                          if isinstance(mm, str) else "")
        ctx.add(("merge_method",), f"{why}; ckptmerge runs {', '.join(MERGEKIT_METHODS)}.")
        return None
    dtype = _dtype(data, "out_dtype", ctx) or _dtype(data, "dtype", ctx)
    top = _parameters(data.get("parameters"), ("parameters",), mm, ctx, merge_wide=True)
    base = None
    if data.get("base_model") is not None:
        base = _model_path(data["base_model"], ("base_model",), ctx)
    if ("models" in data) == ("slices" in data):
        ctx.add((), "give exactly one of 'models' (whole models) and 'slices' (layer ranges), as mergekit does.")
        return None
    if "models" in data:
        models = _models(data["models"], ctx, mm)
        layers: Dict[str, Any] = {}
    else:
        got = _slices(data["slices"], ctx, mm, base)
        if got is None:
            return None
        models, layers, slice_base = got
        if slice_base is not None:
            base = base if base is not None else slice_base
        top = {**layers, **{k: _chain(layers.get(k), v) for k, v in top.items()}} if layers else top
    if models is None:
        return None
    return _build(mm, models, base, top, dtype, ctx, "slices" in data)


def _dtype(data: Mapping, key: str, ctx: Context) -> Optional[str]:
    v = data.get(key)
    if v is None:
        return None
    name = v[len("torch."):] if isinstance(v, str) and v.startswith("torch.") else v
    if name not in _DTYPES:
        hint = did_you_mean(name, _DTYPES, n=1, cutoff=0.5) if isinstance(name, str) else ""
        ctx.add((key,), f"expected one of {', '.join(_DTYPES)}, received {show(v)}.{hint}")
        return None
    return str(name)


def _model_path(v: Any, path: KeyPath, ctx: Context) -> Optional[str]:
    if not isinstance(v, str) or not v:
        ctx.add(path, f"expected a model path (a non-empty string), received {show(v)}; ckptmerge reads local "
                      "folders and files (or URLs), not mergekit's model mappings.")
        return None
    local = os.path.join(ctx.base, v)
    if not is_remote(v) and "$" not in v and not os.path.exists(os.path.expanduser(local)):
        if "+" in v:
            ctx.add(path, f"{quote_name(v)} is not a file or folder; mergekit reads 'MODEL+LORA' as a LoRA adapter "
                          "applied to a model, which ckptmerge does not do: merge the adapter into the model first.")
            return None
        if "@" in v:
            ctx.add(path, f"{quote_name(v)} is not a file or folder; mergekit reads 'MODEL@REVISION' as a Hub "
                          "revision: download that revision and give its folder.")
            return None
        if _HUB_ID.fullmatch(v):
            ctx.add(path, f"model {quote_name(v)} not found relative to the config file's folder; mergekit reads it "
                          "from the Hugging Face Hub, ckptmerge reads local folders: download it (e.g. "
                          f"'huggingface-cli download {v} --local-dir {v}') and give that folder.")
            return None
    return check_path(v, path, ctx, "checkpoint")


def _models(v: Any, ctx: Context, mm: str) -> Optional[List[Tuple[Optional[str], Dict[str, Setting], KeyPath]]]:
    if not isinstance(v, list) or not v:
        ctx.add(("models",), f"expected a list of models (- model: PATH), received {show(v)}.")
        return None
    out = []
    for i, m in enumerate(v):
        p: KeyPath = ("models", i)
        if not isinstance(m, Mapping):
            ctx.add(p, f"expected a mapping with 'model' (and 'parameters'), received {show(m)}.")
            continue
        _keys(m, _MODEL_KEYS, {"layer_range": "layer_range belongs to slices[].sources, not models"}, p, ctx)
        if "model" not in m:
            ctx.add(p, "missing required key 'model' (the model's folder).")
            continue
        out.append((_model_path(m["model"], p + ("model",), ctx),
                    _parameters(m.get("parameters"), p + ("parameters",), mm, ctx, merge_wide=False), p))
    return out


def _slices(v: Any, ctx: Context, mm: str, base: Optional[str]) -> Optional[Tuple[List[Any], Dict[str, Setting],
                                                                                 Optional[str]]]:
    """``slices`` whose layers line up: the same layer range from every model in each slice, the
    slices one after the other from layer 0 to the models' last layer, the same models and
    parameters in each. They merge as ``models`` do; anything else is refused."""
    if not isinstance(v, list) or not v:
        ctx.add(("slices",), f"expected a list of slices (- sources: [...]), received {show(v)}.")
        return None
    firsts: List[Any] = []
    ends: List[Tuple[int, int]] = []
    shapes = []
    slice_base = None
    for i, s in enumerate(v):
        p: KeyPath = ("slices", i)
        if not isinstance(s, Mapping):
            ctx.add(p, f"expected a mapping with 'sources', received {show(s)}.")
            return None
        if not _keys(s, _SLICE_KEYS, {"residual_weight": "residual_weight is not supported"}, p, ctx):
            return None
        srcs = s.get("sources")
        if not isinstance(srcs, list) or not srcs:
            ctx.add(p + ("sources",), f"expected a list of sources (- model: PATH, layer_range: [A, B]), "
                                      f"received {show(srcs)}.")
            return None
        ranges = []
        models = []
        for j, src in enumerate(srcs):
            q = p + ("sources", j)
            if not isinstance(src, Mapping) or "model" not in src or "layer_range" not in src:
                ctx.add(q, f"expected a mapping with 'model' and 'layer_range', received {show(src)}.")
                return None
            if not _keys(src, _SOURCE_KEYS, {}, q, ctx):
                return None
            r = src["layer_range"]
            if not (isinstance(r, list) and len(r) == 2 and all(isinstance(x, int) and not isinstance(x, bool)
                                                                for x in r) and 0 <= r[0] < r[1]):
                ctx.add(q + ("layer_range",), f"expected [FIRST, END] with 0 <= FIRST < END, received {show(r)}.")
                return None
            ranges.append(tuple(r))
            models.append((_model_path(src["model"], q + ("model",), ctx),
                           _parameters(src.get("parameters"), q + ("parameters",), mm, ctx, merge_wide=False), q))
        if len(set(ranges)) > 1:
            shown = ", ".join(f"{list(r)}" for r in ranges)
            ctx.add(p + ("sources",), f"the sources take different layers ({shown}): ckptmerge merges layer k of "
                                      "every model with layer k of the others; give every source the same "
                                      "layer_range.")
            return None
        params = _parameters(s.get("parameters"), p + ("parameters",), mm, ctx, merge_wide=True)
        sb = _model_path(s["base_model"], p + ("base_model",), ctx) if s.get("base_model") is not None else None
        if i == 0:
            firsts, slice_base = models, sb
        shapes.append(([(m[0], m[1]) for m in models], params, sb))
        ends.append(ranges[0])
    if ctx.problems:
        return None
    if any(sh != shapes[0] for sh in shapes[1:]):
        ctx.add(("slices",), "the slices differ in their models or parameters: per-slice merges are not supported "
                             "yet; give every slice the same sources and parameters (or use models).")
        return None
    if len(ends) > 1 and _has_gradient(list(shapes[0][:2])):
        ctx.add(("slices",), "gradient lists over several slices are not yet supported (mergekit spreads a gradient "
                             "over each slice's layers anew); use one slice covering every layer.")
        return None
    if ends[0][0] != 0 or any(a[1] != b[0] for a, b in zip(ends, ends[1:])):
        ctx.add(("slices",), "the slices do not follow one another from layer 0 ("
                + ", ".join(f"{list(r)}" for r in ends) + "): a merge that drops or repeats layers is not supported.")
        return None
    last = ends[-1][1]
    for path_, _, q in firsts:
        n = _layer_count(path_) if path_ is not None else None
        if n is None:
            ctx.add(q + ("model",), f"cannot tell how many layers {quote_name(str(path_))} has (no config.json with "
                                    f"{' or '.join(_LAYER_KEYS)}): slices must cover every layer, as models does.")
        elif n != last:
            ctx.add(q + ("layer_range",), f"the slices cover layers 0 to {last} of {n}: a merge that drops layers "
                                          "is not supported; cover every layer (or use models).")
    if ctx.problems:
        return None
    if slice_base is not None and base is not None and slice_base != base:
        ctx.add(("slices", 0, "base_model"), "differs from the top-level base_model; give one base.")
        return None
    return firsts, shapes[0][1], slice_base


class _Gradient(tuple):
    """A gradient list read from the config (``combine`` spreads it over the layers)."""


def _has_gradient(x: Any) -> bool:
    """Whether a gradient list is anywhere in ``x``."""
    if isinstance(x, _Gradient):
        return True
    if isinstance(x, Mapping):
        return any(_has_gradient(v) for v in x.values())
    if isinstance(x, (list, tuple)):
        return any(_has_gradient(v) for v in x)
    return False


def _layer_count(path: str) -> Optional[int]:
    """The number of layers ``config.json`` beside (or in) a model gives, or ``None``."""
    folder = path if os.path.isdir(path) else os.path.dirname(path)
    try:
        cfg = json.loads(read_regular_file(os.path.join(folder, "config.json"), limit=1 << 20))
    except (OSError, ValueError):
        return None
    if not isinstance(cfg, dict):
        return None
    for k in _LAYER_KEYS:
        v = cfg.get(k)
        if isinstance(v, int) and not isinstance(v, bool):
            return v
    return None


def _parameters(v: Any, path: KeyPath, mm: str, ctx: Context, *, merge_wide: bool) -> Dict[str, Setting]:
    """One ``parameters`` mapping: each value a setting, each key checked against ``mm``'s."""
    if v is None:
        return {}
    if not isinstance(v, Mapping):
        ctx.add(path, f"expected a mapping of parameters, received {show(v)}.")
        return {}
    known = dict(_TENSOR[mm], **(_GLOBAL[mm] if merge_wide else {}))
    out: Dict[str, Setting] = {}
    for k, val in v.items():
        p = path + (k,)
        if k not in known:
            if not merge_wide and k in _GLOBAL[mm]:
                ctx.add(p, f"'{k}' is a merge-wide parameter of {mm}: mergekit reads it only from the top-level "
                           "parameters (or a slice's), and ignores it here; move it there.", key=True)
            elif isinstance(k, str) and any(k in _GLOBAL[o] or k in _TENSOR[o] for o in _GLOBAL):
                ctx.add(p, f"'{k}' is not a parameter of {mm} (mergekit ignores it); remove it. {mm} takes "
                           f"{', '.join(known) or 'no parameters'}.", key=True)
            else:
                hint = did_you_mean(str(k), list(known), n=1, cutoff=0.6)
                ctx.add(p, f"unknown parameter '{k}' of {mm}.{hint or ' It takes ' + (', '.join(known) or 'none') + '.'}",
                        key=True)
            continue
        s = _setting(val, p, k, ctx)
        if s is not None:
            out[k] = s
    return out


def _setting(v: Any, path: KeyPath, key: str, ctx: Context) -> Setting:
    """A value, or a ``filter`` list as ``[(filter, value), ...]`` (no filter: ``"*"``)."""
    if isinstance(v, list):
        if not v or not all(isinstance(x, Mapping) for x in v):  # a gradient list (or not a setting)
            return _scalar(v, path, key, ctx)
        out: List[Tuple[str, Any]] = []
        for i, c in enumerate(v):
            q = path + (i,)
            if not isinstance(c, Mapping) or "value" not in c:
                ctx.add(q, f"expected '- filter: TEXT' and 'value: X' (or '- value: X' for every tensor), "
                           f"received {show(c)}.")
                return None
            if not _keys(c, ("filter", "value"), {"pattern": "'pattern' is the old spelling of 'filter': mergekit "
                                                           "0.1.5 ignores it, so its value would apply to every "
                                                           "tensor; write 'filter'"}, q, ctx):
                return None
            f = c.get("filter")
            if f is not None and not (isinstance(f, str) and f):
                ctx.add(q + ("filter",), f"expected the text a tensor name contains, received {show(f)}.")
                return None
            val = _scalar(c["value"], q + ("value",), key, ctx)
            if val is None:
                return None
            out.append((f if f is not None else "*", val))
        return out
    if isinstance(v, Mapping):
        ctx.add(path, f"expected a value or a list of '- filter: TEXT, value: X' entries, received {show(v)}; "
                      "mergekit also needs the list (a single filter mapping is an error there).")
        return None
    return _scalar(v, path, key, ctx)


def _scalar(v: Any, path: KeyPath, key: str, ctx: Context) -> Any:
    """A value; a gradient list (numbers spread over the layers) as a tuple."""
    if isinstance(v, list):
        if key in _GRADIENT_REFUSED:
            ctx.add(path, f"{key} is a gradient list ({show(v)}: a value per layer); gradient lists of {key} are not "
                          "yet supported: give one value (or a filter list of values).")
            return None
        if not v or not all(isinstance(x, (int, float)) and not isinstance(x, bool) and x == x
                            and abs(x) != float("inf") for x in v):
            ctx.add(path, f"{key} as a list is a gradient: finite numbers, at least one; received {show(v)}.")
            return None
        return _Gradient(float(x) for x in v)
    if key in _BOOLS:
        if isinstance(v, bool):
            return v
        ctx.add(path, f"{key} must be true or false, received {show(v)}.")
        return None
    if isinstance(v, (int, float)) and not isinstance(v, bool) and v == v and abs(v) != float("inf"):
        return float(v)
    ctx.add(path, f"{key} must be a finite number, received {show(v)}.")
    return None


def _chain(*settings: Setting) -> Setting:
    """mergekit's precedence: the first level whose filter matches wins (a model's own, then the
    slice's, then the merge-wide one): the levels' filter lists one after the other, up to the
    first plain value (a catch-all)."""
    out: Dict[str, Any] = {}
    for s in settings:
        if s is None:
            continue
        if isinstance(s, dict):  # (an earlier chain's result)
            s = list(s.items())
        if not isinstance(s, list):
            if not out:
                return s
            out.setdefault("*", s)
            break
        for f, v in s:
            out.setdefault(f, v)  # (a repeated filter: the first one wins, as in mergekit)
        if "*" in out:
            break
    if not out:
        return None
    if list(out) == ["*"]:
        return out["*"]
    return out


def _build(mm: str, models: List[Tuple[Optional[str], Dict[str, Setting], KeyPath]], base: Optional[str],
           top: Dict[str, Setting], dtype: Optional[str], ctx: Context,
           sliced: bool) -> Optional[Tuple[str, List[str], Optional[str], Optional[List[Any]], Dict[str, Any],
                                           Optional[str]]]:
    method = MERGEKIT_METHODS[mm]
    where = "slices[0].sources" if sliced else "models"
    if ctx.problems or any(m[0] is None for m in models):
        return None
    seen: Dict[str, KeyPath] = {}
    for path_, _, p in models:
        assert path_ is not None
        if path_ in seen:
            ctx.add(p + ("model",), f"the same model as {_kp(seen[path_])}; list each model once.")
        seen.setdefault(path_, p)
    if ctx.problems:
        return None
    needs_base = mm != "linear"
    if needs_base and base is None:
        ctx.add((), f"{mm} needs a base_model (the model the others were fine-tuned from"
                    + (", and the start of the interpolation)." if mm == "slerp" else ")."))
        return None
    if mm == "linear" and base is not None and base not in seen:
        ctx.add(("base_model",), "linear takes no base_model: mergekit would add it as a model without a weight and "
                                 "fail; remove it (or list it under models with a weight).")
        return None
    if sliced and needs_base and base not in seen:
        ctx.add(("base_model",), "the base model must be one of the slices' sources (mergekit reads the base's layers "
                                 "from them); add it to each slice's sources.")
        return None
    inputs = [m for m in models if not (needs_base and m[0] == base)]
    if mm == "slerp" and len(inputs) != 1:
        ctx.add((where,), f"slerp merges exactly two models, the base_model and one other; received "
                          f"{len(inputs) + 1} in all.")
        return None
    if mm == "model_stock" and len(inputs) < 2:
        ctx.add((where,), "model_stock needs at least two models besides the base_model.")
        return None
    if not inputs:
        ctx.add((where,), f"{mm} needs at least one model besides the base_model.")
        return None
    params: Dict[str, Any] = {}
    weights: Optional[List[Any]] = None
    tensor = _TENSOR[mm]
    if "weight" in tensor:
        weights = []
        for path_, own, p in inputs:
            w = _chain(own.get("weight"), top.get("weight"))
            if w is None or (isinstance(w, dict) and "*" not in w):
                what = "no weight" if w is None else "no weight for the tensors no filter matches"
                ctx.add(p, f"{path_ and quote_name(os.path.basename(path_))} has {what}: mergekit requires one "
                           "(parameters: weight: X, here or in the top-level parameters; end a filter list with "
                           "'- value: X').")
            weights.append(w)
    if "density" in tensor:
        dens = [_chain(own.get("density"), top.get("density")) for _, own, _ in inputs]
        if mm == "task_arithmetic":
            if any(d is not None for d in dens) or "rescale" in top:
                key = "density" if any(d is not None for d in dens) else "rescale"
                ctx.add((where,) if key == "density" else ("parameters", "rescale"),
                        f"task_arithmetic does not sparsify: mergekit ignores {key} there; remove it (or use "
                        "ties, dare_linear or dare_ties).")
        elif any(d is not None for d in dens):
            filled = [d if d is not None else 1.0 for d in dens]
            params["density"] = filled[0] if all(d == filled[0] for d in filled) else PerInput(tuple(filled))
    for key, default in _GLOBAL[mm].items():
        s = _chain(top.get(key))
        if s is None:
            if default is _REQUIRED:
                ctx.add(("parameters",), f"{mm} needs the parameter {key} (mergekit has no default).")
            continue
        if mm == "task_arithmetic" and key == "rescale":
            continue
        if key == "lambda":
            params["scale"] = s
        else:
            params[key] = s
    if mm.startswith("dare"):
        params["consensus"] = "ties" if mm == "dare_ties" else "none"
    if ctx.problems:
        return None
    return method, [str(m[0]) for m in inputs], base if needs_base else None, weights, params, dtype


def _as_ckptmerge(method: str, params: Dict[str, Any], ctx: Context) -> Dict[str, Any]:
    """The parameters under ckptmerge's conventions: those ckptmerge's method takes."""
    known = METHODS[method].defaults_for("ckptmerge")
    out = {}
    for k, v in params.items():
        if k in known:
            out[k] = v
        elif k not in ("int8_mask",):
            ctx.add(("parameters", k), f"'{k}' follows mergekit's conventions; read this config with "
                                       "conventions='mergekit' (the default).")
    return out


def _kp(path: KeyPath) -> str:
    from .problems import keypath

    return keypath(path)
