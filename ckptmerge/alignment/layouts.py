"""Framework layouts: how PyTorch stores a layer's tensors, and what Keras/TF expects instead.

``Source(path, layout="torch")`` reads a PyTorch ``state_dict`` (usually a ``.safetensors`` file)
as a Keras/TF model would hold it. :func:`torch_layout` is the pure part: names and specs in, one
:class:`LayoutEntry` per output tensor out, each saying which source tensor(s) it comes from,
how it is changed and why. Nothing here reads a file or imports a framework.

What it does, per PyTorch module kind (the kind comes from the parameter names of the module,
and from its name where those do not tell):

- ``nn.Linear`` ``weight (out, in)`` -> ``kernel (in, out)`` (transposed); ``bias`` as is.
- ``nn.Conv1d/2d/3d`` and ``nn.ConvTranspose*`` ``weight (O, I, *k)`` / ``(I, O, *k)`` ->
  ``kernel (*k, I, O)`` / ``(*k, O, I)``: one permutation serves both. A depthwise conv
  (``(C, 1, *k)`` in a module named like ``depthwise``/``dw``) -> ``(*k, C, 1)``.
- ``nn.Embedding`` ``weight`` -> ``embeddings``, as is.
- ``nn.LayerNorm`` / ``nn.GroupNorm`` ``weight``/``bias`` -> ``gamma``/``beta``;
  ``nn.BatchNorm*`` also ``running_mean``/``running_var`` -> ``moving_mean``/``moving_variance``
  (``num_batches_tracked`` is bookkeeping).
- ``nn.LSTM`` ``weight_ih_lK``/``weight_hh_lK`` -> ``lK/kernel``/``lK/recurrent_kernel``
  (transposed; gate order i, f, g, o is Keras's i, f, c, o), ``bias_ih + bias_hh`` -> ``lK/bias``;
  ``nn.GRU`` reorders the gates from r, z, n to Keras's z, r, h and stacks the two biases into
  Keras's ``(2, 3H)`` bias (``reset_after=True``). ``_reverse`` tensors go to ``lK_reverse``.
  A layer whose ranks or shapes do not fit (see ``_rnn_problem``) is kept as is and reported.
- Names use ``/`` scopes: ``encoder.layer.0.attention.query.weight`` ->
  ``encoder/layer/0/attention/query/kernel``.

A 2-D ``weight`` whose module has no ``bias`` and whose name says neither linear nor embedding
cannot be decided (a Linear must be transposed, an Embedding must not; a square one fits either
way): it keeps its name and values, and the layout reports it as a finding, settled by an
explicit ``transforms=[cm.Transpose(target)]`` (or a map to an ``embeddings`` target).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

from ..core.specs import KIND_BOOKKEEPING, KIND_VARIABLE, VariableInfo
from ..core.text import quote_name
from .conventions import CONV1D_MODULES, EMBEDDING_MODULES
from .features import tokens
from .fused import FusedConvention, fused_row, part_sizes

__all__ = ["LayoutEntry", "Layout", "torch_layout", "flax_layout", "LAYOUTS", "layout_of", "apply_entry",
           "likely_target", "transpose_into", "transpose_rows_into"]

#: The layouts ``Source(layout=...)`` accepts.
LAYOUTS = ("torch", "flax")

_EMBED = re.compile(r"(^|[_.])(" + "|".join(map(re.escape, EMBEDDING_MODULES)) + r")$", re.IGNORECASE)
_LINEAR = re.compile(r"(^|[_.])(linear|fc\d*|dense|proj|q_proj|k_proj|v_proj|o_proj|out_proj|query|key|value|"
                     r"qkv|out|output|gate|gate_proj|up|up_proj|down|down_proj|lm_head|head|classifier|"
                     r"pooler|mlp|c_fc|c_proj|c_attn|w\d|attn|fc_in|fc_out)$", re.IGNORECASE)
_DEPTHWISE = re.compile(r"(depthwise|dw)", re.IGNORECASE)
_RNN_PARAM = re.compile(r"^(weight|bias)_(ih|hh)_l(\d+)(_reverse)?$")


@dataclass(frozen=True)
class LayoutEntry:
    """One output tensor of a layout: its new name and spec, and how to compute it.

    Attributes:
        info: the output name, shape and dtype (``key`` is the first source tensor's key).
        sources: the raw keys of the source tensors it is computed from (one, or two for RNN biases).
        op: ``"copy"``, ``"transpose"`` (``perm``), ``"gates"`` (reorder gate blocks of axis 0 by
            ``order``, then transpose), ``"sum"`` or ``"stack"`` (of ``sources``, after ``order``).
        perm: the axis permutation of ``"transpose"``/``"gates"``.
        order: gate block order (``"gates"``, ``"sum"``, ``"stack"``).
        note: what was done, for reports (``"transposed (out,in)->(in,out)"``); empty for a copy.
        sizes: for ``"split"`` (``perm`` = axis, index, parts): the sizes of the parts where they
            differ (a grouped-query ``qkv_proj``); empty for equal parts.
    """

    info: VariableInfo
    sources: Tuple[str, ...]
    op: str = "copy"
    perm: Tuple[int, ...] = ()
    order: Tuple[int, ...] = ()
    note: str = ""
    sizes: Tuple[int, ...] = ()


@dataclass
class Layout:
    """The result of a layout: entries by output name, and the tensors it could not decide."""

    entries: Dict[str, LayoutEntry] = field(default_factory=dict)
    undecided: List[Tuple[str, str]] = field(default_factory=list)
    name: str = "torch"
    #: fused modules (:mod:`ckptmerge.alignment.fused`) kept whole: ``[(tensor name, why)]``
    unsplit: List[Tuple[str, str]] = field(default_factory=list)
    #: whether a fused module's split waits for the targets' shapes (see :func:`torch_layout`)
    needs_targets: bool = False

    def findings(self, label: str, targets: Sequence[VariableInfo] = ()) -> List[str]:
        """One line per undecided tensor, for the plan's findings; with ``targets``, each names the
        target it most likely belongs to (see :func:`likely_target`) where one stands out."""
        out = []
        for name, why in self.undecided:
            entry = self.entries.get(name)
            found = likely_target(name, entry.info.shape, targets) if entry is not None and targets else None
            out.append(f"layout '{self.name}' of source '{label}': {name}: "
                       + (why.replace("'<target>'", repr(found)) if found else why))
        return out


def likely_target(name: str, shape: Sequence[int], targets: Sequence[VariableInfo]) -> Optional[str]:
    """The target a 2-D tensor most likely belongs to: the one target of its shape (as stored or
    transposed), or of those the one sharing the most name tokens with it; ``None`` when none
    stands out.

    Example:
        >>> likely_target("proj_a/weight", (8, 4), [VariableInfo("enc/proj_a/kernel", (4, 8), "float32"),
        ...                                         VariableInfo("head/kernel", (8, 8), "float32")])
        'enc/proj_a/kernel'
    """
    shape = tuple(shape)
    fits = [t.name for t in targets if tuple(t.shape) in (shape, shape[::-1])]
    if len(fits) <= 1:
        return fits[0] if fits else None
    def scope(n: str) -> set:  # (the leaves, kernel ~ weight, say nothing here)
        return set(tokens(n[:n.rfind("/") + 1]))

    mine = scope(name)
    scores = sorted(((len(mine & scope(t)) / max(len(mine | scope(t)), 1), t) for t in fits), reverse=True)
    return scores[0][1] if scores[0][0] > 0 and scores[0][0] > scores[1][0] else None


def _slash(name: str) -> str:
    return name.replace(".", "/")


def _kind(module: str, params: Dict[str, VariableInfo]) -> str:
    """The PyTorch module kind from its parameters (names, ranks) and, where those do not tell, its name."""
    w = params.get("weight")
    if "running_mean" in params or "running_var" in params:
        return "batchnorm"
    if any(_RNN_PARAM.match(p) for p in params):
        return "rnn"
    if w is None:
        return "other"
    leaf = module.rsplit(".", 1)[-1] if module else ""
    if len(w.shape) == 1:
        return "norm"
    if len(w.shape) >= 3:
        return "depthwise" if w.shape[1] == 1 and _DEPTHWISE.search(leaf) else "conv"
    if len(w.shape) == 2:
        if _EMBED.search(leaf):
            return "embedding"
        b = params.get("bias")
        if b is not None and len(b.shape) == 1 and w.shape[0] != w.shape[1]:
            # The bias has the output size: (out, in) is a Linear, (in, out) Hugging Face's Conv1D.
            if b.shape[0] == w.shape[1]:
                return "conv1d"
            if b.shape[0] == w.shape[0]:
                return "linear"
        if leaf in CONV1D_MODULES:
            return "conv1d?"  # square: decided by its siblings' biases (see torch_layout)
        if "bias" in params or _LINEAR.search(leaf):
            return "linear"
        return "undecided"
    return "other"


def torch_layout(infos: Sequence[VariableInfo], *, rnn: str = "auto",
                 targets: Optional[Sequence[VariableInfo]] = None) -> Layout:
    """Map a PyTorch ``state_dict``'s tensors to Keras/TF names, shapes and transforms.

    Args:
        infos: the source's tensors (names as PyTorch writes them, ``.`` between scopes).
        rnn: ``"lstm"``, ``"gru"`` or ``"auto"`` (by gate count: 4 blocks LSTM, 3 GRU).
        targets: the Keras tensors the entries are meant for, where known: the sizes of a
            fused module's parts that are not equal by convention come from them (see
            :func:`~ckptmerge.alignment.fused.part_sizes`); without them such a module is kept
            whole and ``needs_targets`` is set.

    Returns:
        A :class:`Layout`; tensors it does not know keep their values under ``/`` names.

    Example:
        >>> from ckptmerge.core.specs import VariableInfo
        >>> lay = torch_layout([VariableInfo("fc.weight", (3, 5), "float32"),
        ...                     VariableInfo("fc.bias", (3,), "float32")])
        >>> [(n, e.info.shape, e.note) for n, e in lay.entries.items()]
        [('fc/kernel', (5, 3), 'transposed (out,in)->(in,out)'), ('fc/bias', (3,), '')]
    """
    modules: Dict[str, Dict[str, VariableInfo]] = {}
    for v in infos:
        module, _, param = v.name.rpartition(".")
        modules.setdefault(module, {})[param] = v
    out = Layout()
    kinds = {module: _kind(module, params) for module, params in modules.items()}
    # A square weight of a Conv1D-named module is a Conv1D when another module of that name shows
    # it by its bias (GPT-2's attn.c_proj beside c_attn and mlp.c_fc), a Linear when one shows that.
    shown = {(m.rsplit(".", 1)[-1], k) for m, k in kinds.items() if k in ("conv1d", "linear")}
    for module, kind in kinds.items():
        if kind == "conv1d?":
            leaves = {leaf for leaf, k in shown if k == "conv1d"}
            linear = {leaf for leaf, k in shown if k == "linear"} & set(CONV1D_MODULES)
            kinds[module] = "conv1d" if leaves and not linear else "undecided"

    def add(name: str, shape: Sequence[int], src: Sequence[VariableInfo], op: str = "copy", *,
            perm: Sequence[int] = (), order: Sequence[int] = (), note: str = "", kind: Optional[str] = None,
            sizes: Sequence[int] = ()) -> None:
        first = src[0]
        nbytes = int(np.prod(shape)) * (first.nbytes // max(first.size, 1)) if first.size else 0
        info = VariableInfo(name, tuple(int(d) for d in shape), first.dtype, first.raw_key, kind or first.kind, nbytes)
        out.entries[name] = LayoutEntry(info, tuple(s.raw_key for s in src), op, tuple(perm), tuple(order), note,
                                        tuple(sizes))

    for module, params in modules.items():
        scope = _slash(module) + "/" if module else ""
        kind = kinds[module]
        done = set()
        row = fused_row(module.rsplit(".", 1)[-1]) if kind in ("linear", "conv1d") else None
        split, why = _split_fused(scope, params, kind, add, row, targets) if row is not None else (False, "")
        if row is not None and not split:
            out.unsplit.append((_slash(params["weight"].name), why))
            out.needs_targets |= targets is None and not row.equal
        if split:
            done |= {"weight", "bias"}
        elif kind == "conv1d":  # Hugging Face Conv1D: weight (in, out) is already a Keras kernel
            w = params["weight"]
            done.add("weight")
            add(scope + "kernel", w.shape, [w], note="Conv1D weight (in,out) kept")
        elif kind in ("linear", "conv", "depthwise", "embedding"):
            w = params["weight"]
            done.add("weight")
            if kind == "embedding":
                add(scope + "embeddings", w.shape, [w])
            elif kind == "linear":
                add(scope + "kernel", w.shape[::-1], [w], "transpose", perm=(1, 0),
                    note="transposed (out,in)->(in,out)")
            else:
                n = len(w.shape)
                perm = tuple(range(2, n)) + (1, 0)
                shape = tuple(w.shape[p] for p in perm)
                if kind == "depthwise":  # (C, 1, *k) -> (*k, 1, C) -> Keras (*k, C, 1)
                    perm = tuple(range(2, n)) + (0, 1)
                    shape = tuple(w.shape[p] for p in perm)
                    note = "depthwise conv (C,1,*k)->(*k,C,1)"
                else:
                    note = "conv (O,I,*k)->(*k,I,O)"
                add(scope + "kernel", shape, [w], "transpose", perm=perm, note=note)
        elif kind in ("norm", "batchnorm"):
            renames = {"weight": "gamma", "bias": "beta", "running_mean": "moving_mean",
                       "running_var": "moving_variance"}
            for p, new in renames.items():
                if p in params:
                    add(scope + new, params[p].shape, [params[p]], note=f"{p} -> {new}")
                    done.add(p)
            if "num_batches_tracked" in params:
                v = params["num_batches_tracked"]
                add(scope + "num_batches_tracked", v.shape, [v], kind=KIND_BOOKKEEPING)
                done.add("num_batches_tracked")
        elif kind == "rnn":
            done |= _rnn(scope, params, rnn, add, out.undecided)
        elif kind == "undecided":
            w = params["weight"]
            out.undecided.append((_slash(w.name), f"2-D weight {w.shape} without a bias and without a name "
                                  "that says Linear or Embedding: a Linear needs transposing, an Embedding "
                                  "does not. Pass transforms=[cm.Transpose('<target>')] for a Linear, or map it "
                                  "to an 'embeddings' target"))
        for p, v in params.items():
            if p not in done:
                add(scope + p, v.shape, [v])
    return out


def _split_fused(scope: str, params: Dict[str, VariableInfo], kind: str, add, row: FusedConvention,
                 targets: Optional[Sequence[VariableInfo]]) -> Tuple[bool, str]:
    """A fused module (a row of :data:`~ckptmerge.alignment.fused.FUSED`) as one module per part
    under its scope, named as the row says (each kernel ``(in, size)``); ``(False, why not)`` when
    the sizes of its parts are not known (see :func:`~ckptmerge.alignment.fused.part_sizes`)."""
    w, b = params["weight"], params.get("bias")
    rows, fan_in = (w.shape[1], w.shape[0]) if kind == "conv1d" else (w.shape[0], w.shape[1])
    if b is not None and tuple(b.shape) != (rows,):
        return False, f"its bias {quote_name(b.raw_key)} {tuple(b.shape)} is not one entry per output ({rows})"
    sizes, why = part_sizes(row, rows, fan_in, targets) if targets is not None else (
        part_sizes(row, rows, fan_in, ()) if row.equal else (None, "the targets are not known yet"))
    if sizes is None:
        return False, why
    n = len(sizes)
    equal = len(set(sizes)) == 1
    what = ",".join(p[0] if row.parts == ("query", "key", "value") else p for p in row.parts)
    shape = f"{n}*out" if equal else "+".join(map(str, sizes))
    lo = 0
    for i, (name, size) in enumerate(zip(row.parts, sizes)):
        hi = lo + size
        split = (1 if kind == "conv1d" else 0, i, n)
        given = () if equal else tuple(sizes)
        if kind == "conv1d":
            add(f"{scope}{name}/kernel", (fan_in, size), [w], "split", perm=split, sizes=given,
                note=f"fused {what} Conv1D weight (in,{shape}): columns {lo}..{hi - 1} of {rows}")
        else:
            add(f"{scope}{name}/kernel", (fan_in, size), [w], "split", perm=split, sizes=given,
                note=f"fused {what} Linear weight ({shape},in): rows {lo}..{hi - 1} of {rows}, transposed")
        if b is not None:
            add(f"{scope}{name}/bias", (size,), [b], "split", perm=(0, i, n), sizes=given,
                note=f"fused {what} bias: entries {lo}..{hi - 1} of {rows}")
        lo = hi
    return True, why


_GATES = {"lstm": 4, "gru": 3}


def _rnn_problem(t: Dict[str, VariableInfo], rnn: str) -> Optional[str]:
    """Why one RNN layer's tensors (``weight_ih``, ``weight_hh``, ``bias_ih``, ``bias_hh``) cannot be
    an LSTM or GRU layer as PyTorch stores it, or None: weights of rank 2 and biases of rank 1, all
    with the same ``gates * hidden`` rows, ``weight_hh`` of shape ``(gates * hidden, hidden)``.
    Each tensor is named as the checkpoint has it (``weight_hh 'lstm.weight_hh_l0'``)."""
    def named(k: str) -> str:
        return f"{k} {quote_name(t[k].raw_key)}"

    for k, v in sorted(t.items()):
        rank = 2 if k.startswith("weight") else 1
        if len(v.shape) != rank:
            return f"{named(k)} has shape {v.shape}, not rank {rank}"
    rows = {k: v.shape[0] for k, v in t.items()}
    if len(set(rows.values())) > 1:
        return "the gate rows differ: " + ", ".join(f"{named(k)} {v.shape}" for k, v in sorted(t.items()))
    n = next(iter(rows.values()))
    w_hh = t.get("weight_hh")
    gates = _GATES.get(rnn)
    if w_hh is not None:
        hidden = w_hh.shape[1]
        if hidden == 0 or n % hidden:
            return f"{named('weight_hh')} has shape {w_hh.shape}: its rows are not a whole number of gates of {hidden}"
        if gates is not None and n != gates * hidden:
            return f"{named('weight_hh')} has shape {w_hh.shape}, not ({gates} * hidden, hidden) for rnn={rnn!r}"
    elif gates is not None and n % gates:
        return (f"{', '.join(named(k) for k in sorted(t))} have {n} rows, which do not divide into {gates} gates "
                f"for rnn={rnn!r}")
    return None


def _rnn(scope: str, params: Dict[str, VariableInfo], rnn: str, add,
         undecided: List[Tuple[str, str]]) -> set:
    """LSTM/GRU tensors of one module: kernels transposed with gates in Keras order, biases joined.
    A layer whose shapes do not fit is kept as it is and reported in ``undecided``."""
    done = set()
    layers: Dict[Tuple[str, str], Dict[str, VariableInfo]] = {}
    for p, v in params.items():
        m = _RNN_PARAM.match(p)
        if m:
            kind, which, layer, rev = m.groups()
            layers.setdefault((layer, rev or ""), {})[f"{kind}_{which}"] = v
            done.add(p)
    for (layer, rev), t in sorted(layers.items()):
        sub = f"{scope}l{layer}{rev}/"
        problem = _rnn_problem(t, rnn)
        if problem is not None:
            for k, v in sorted(t.items()):
                add(sub + k, v.shape, [v])
            undecided.append((sub.rstrip("/"), f"malformed RNN layer: {problem}. Its tensors keep their "
                              "names and values (nothing is transposed or reordered); exclude them, or fix "
                              "the file"))
            continue
        w_ih = t.get("weight_ih")
        rows = (w_ih or next(iter(t.values()))).shape[0]
        hidden = params_hidden = None
        w_hh = t.get("weight_hh")
        if w_hh is not None:
            params_hidden = w_hh.shape[1]
        hidden = params_hidden or rows
        gates = rows // hidden if hidden else 0
        mode = rnn if rnn != "auto" else {4: "lstm", 3: "gru"}.get(gates, "")
        # LSTM gates (i, f, g, o) are Keras's (i, f, c, o); GRU (r, z, n) become Keras's (z, r, h).
        order = (0, 1, 2, 3) if mode == "lstm" else (1, 0, 2)
        what = "LSTM gates i,f,g,o kept" if mode == "lstm" else "GRU gates r,z,n -> z,r,h"
        if not mode:
            for k, v in t.items():
                add(sub + k, v.shape, [v])
            continue
        for k, new in (("weight_ih", "kernel"), ("weight_hh", "recurrent_kernel")):
            if k in t:
                v = t[k]
                add(sub + new, v.shape[::-1], [v], "gates", perm=(1, 0), order=order,
                    note=f"{k} transposed (gates*H,in)->(in,gates*H), {what}")
        if "bias_ih" in t and "bias_hh" in t:
            b_ih, b_hh = t["bias_ih"], t["bias_hh"]
            if mode == "lstm":
                add(sub + "bias", b_ih.shape, [b_ih, b_hh], "sum", order=order, note="bias_ih + bias_hh")
            else:
                add(sub + "bias", (2,) + tuple(b_ih.shape), [b_ih, b_hh], "stack", order=order,
                    note=f"[bias_ih; bias_hh] (reset_after), {what}")
        else:
            for k in ("bias_ih", "bias_hh"):
                if k in t:
                    add(sub + k, t[k].shape, [t[k]])
    return done


def _reorder(value: np.ndarray, order: Sequence[int]) -> np.ndarray:
    if not order or list(order) == list(range(len(order))):
        return value
    blocks = np.split(value, len(order), axis=0)
    return np.concatenate([blocks[i] for i in order], axis=0)


#: A large 2-D transpose goes :data:`_BAND` rows at a time through a buffer whose rows are
#: :data:`_PAD` elements longer than the tensor's. Row strides such as 3 KiB and 12 KiB (768 and
#: 3072 float32s, BERT's widths) put every row of a band into the same few cache sets, so the
#: column-wise reads of a transpose keep evicting each other; padded rows spread them over the
#: cache. On BERT-base's kernels this is about 2x faster than NumPy's copy of a transposed view
#: (and than 64 x 64 tiles, which hit the same sets).
_BAND, _PAD = 128, 32


def transpose_rows_into(rows: Callable[[int, int], np.ndarray], shape: Sequence[int], dtype: Any,
                        out: np.ndarray) -> np.ndarray:
    """Write the transpose of a 2-D tensor into ``out``, reading the tensor a band of rows at a time.

    Args:
        rows: ``rows(start, stop)`` gives rows ``start:stop`` of the tensor, asked for in order
            (a view of an array in memory, or a band just read from a file).
        shape: the tensor's ``(rows, columns)``.
        dtype: its dtype.
        out: a C-contiguous array of shape ``(columns, rows)``.

    Example:
        >>> x = np.arange(6.0).reshape(2, 3)
        >>> transpose_rows_into(lambda i, j: x[i:j], x.shape, x.dtype, np.empty((3, 2))).tolist()
        [[0.0, 3.0], [1.0, 4.0], [2.0, 5.0]]
    """
    n, m = shape
    band = np.empty((min(_BAND, n), m + _PAD), dtype)[:, :m]
    for i in range(0, n, _BAND):
        b = min(_BAND, n - i)
        band[:b] = rows(i, i + b)
        out[:, i:i + b] = band[:b].T
    return out


def transpose_into(value: np.ndarray, perm: Sequence[int], out: Optional[np.ndarray] = None) -> np.ndarray:
    """``np.transpose(value, perm)`` as a C-contiguous array, written into ``out`` when given.

    A large 2-D transpose goes through :func:`transpose_rows_into`; other ranks are copied by
    NumPy as they are.

    Example:
        >>> transpose_into(np.arange(6.0).reshape(2, 3), (1, 0)).tolist()
        [[0.0, 3.0], [1.0, 4.0], [2.0, 5.0]]
    """
    view = np.transpose(value, perm)
    if out is None:
        out = np.empty(view.shape, view.dtype)
    if value.ndim == 2 and tuple(perm) == (1, 0) and value.size >= _BAND * _BAND:
        transpose_rows_into(lambda i, j: value[i:j], value.shape, value.dtype, out)
    else:
        np.copyto(out, view)
    return out


def apply_entry(entry: LayoutEntry, values: Sequence[np.ndarray], out: Optional[np.ndarray] = None) -> np.ndarray:
    """Compute an entry's value from its source tensors' values (in ``entry.sources`` order).

    Args:
        entry: the layout entry.
        values: its source tensors' values.
        out: a C-contiguous array of the entry's shape to write the value into (a copy's value is
            the source's own array, unless ``out`` is given).

    Example:
        >>> from ckptmerge.core.specs import VariableInfo
        >>> e = torch_layout([VariableInfo("fc.weight", (2, 3), "float32"),
        ...                   VariableInfo("fc.bias", (2,), "float32")]).entries["fc/kernel"]
        >>> apply_entry(e, [np.arange(6.0).reshape(2, 3)]).tolist()
        [[0.0, 3.0], [1.0, 4.0], [2.0, 5.0]]
    """
    if entry.op == "transpose":
        return transpose_into(values[0], entry.perm, out)
    if entry.op == "gates":
        return transpose_into(_reorder(values[0], entry.order), entry.perm, out)
    value = _entry_value(entry, values)
    if out is None:
        return value
    np.copyto(out, value)
    return out


def _entry_value(entry: LayoutEntry, values: Sequence[np.ndarray]) -> np.ndarray:
    if entry.op == "copy":
        return values[0]
    if entry.op == "split":  # perm = (axis, index, parts); a Linear's rows are then transposed
        axis, index, parts = entry.perm
        v = values[0]
        sizes = entry.sizes or (v.shape[axis] // parts,) * parts
        lo = sum(sizes[:index])
        piece = np.take(v, range(lo, lo + sizes[index]), axis=axis)
        return np.ascontiguousarray(piece.T if v.ndim == 2 and axis == 0 else piece)
    if entry.op == "sum":
        return _reorder(values[0], entry.order) + _reorder(values[1], entry.order)
    if entry.op == "stack":
        return np.stack([_reorder(values[0], entry.order), _reorder(values[1], entry.order)])
    raise ValueError(f"unknown layout op {entry.op!r}")  # pragma: no cover - entries come from here


# -- Flax (Linen and NNX) ----------------------------------------------------------------------

_FLAX_COLLECTIONS = ("params", "batch_stats")
_FLAX_TRANSPOSED_CONV = re.compile(r"(conv_?transpose|deconv)", re.IGNORECASE)
_FLAX_RENAMES = {"embedding": "embeddings", "mean": "moving_mean", "var": "moving_variance"}


def _flax_name(v: VariableInfo) -> Tuple[str, ...]:
    parts = tuple(v.name.split("/"))
    if v.kind == KIND_VARIABLE:
        for i in range(min(2, len(parts) - 1)):  # the variables' collection, perhaps after an item name
            if parts[i] in _FLAX_COLLECTIONS:
                parts = parts[i + 1:]
                break
    if len(parts) > 1 and parts[-1] in ("value", "raw_value"):  # an NNX Variable's leaf
        parts = parts[:-1]
    return parts


def flax_layout(infos: Sequence[VariableInfo]) -> Layout:
    """Map a Flax checkpoint's tensors (Linen ``params``/``batch_stats`` trees, NNX states) to
    Keras names, shapes and transforms.

    Flax's conventions are Keras's but for names: ``Dense``/``nnx.Linear`` kernels are
    ``(in, out)`` and ``Conv`` kernels HWIO in both, so they are copied; ``LayerNorm``,
    ``GroupNorm``, ``RMSNorm`` and ``BatchNorm`` ``scale``/``bias`` become ``gamma``/``beta``,
    ``BatchNorm``'s ``mean``/``var`` (``batch_stats``) ``moving_mean``/``moving_variance``,
    ``Embed``'s ``embedding`` ``embeddings``; ``ConvTranspose`` kernels ``(*k, in, out)`` become
    Keras's ``(*k, out, in)``. The collection (``params/``, ``batch_stats/``) and NNX's trailing
    ``/value`` are dropped, so a layer's tensors share one scope as in Keras (``BatchNorm_0/gamma``
    and ``BatchNorm_0/moving_mean``). Optimizer state keeps its names.

    Example:
        >>> from ckptmerge.core.specs import VariableInfo
        >>> lay = flax_layout([VariableInfo("params/LayerNorm_0/scale", (4,), "float32"),
        ...                    VariableInfo("params/Dense_0/kernel", (3, 4), "float32")])
        >>> [(n, e.note) for n, e in lay.entries.items()]
        [('LayerNorm_0/gamma', 'scale -> gamma'), ('Dense_0/kernel', '')]
    """
    modules: Dict[Tuple[str, ...], Dict[str, VariableInfo]] = {}
    for v in infos:
        parts = _flax_name(v)
        modules.setdefault(parts[:-1], {})[parts[-1]] = v
    out = Layout(name="flax")
    for module, params in modules.items():
        scope = "/".join(module) + "/" if module else ""
        norm = "scale" in params and len(params["scale"].shape) == 1 and "kernel" not in params
        for p, v in params.items():
            new, op, perm, note = p, "copy", (), ""
            if norm and p in ("scale", "bias"):
                new = {"scale": "gamma", "bias": "beta"}[p]
            elif p in _FLAX_RENAMES and (p == "embedding" or len(v.shape) == 1):
                new = _FLAX_RENAMES[p]
            elif p == "kernel" and module and _FLAX_TRANSPOSED_CONV.search(module[-1]) and len(v.shape) >= 3:
                n = len(v.shape)
                perm = tuple(range(n - 2)) + (n - 1, n - 2)
                op, note = "transpose", "ConvTranspose kernel (*k,in,out)->(*k,out,in)"
            if new != p and not note:
                note = f"{p} -> {new}"
            shape = tuple(v.shape[i] for i in perm) if perm else v.shape
            info = VariableInfo(scope + new, shape, v.dtype, v.raw_key, v.kind, v.nbytes)
            if info.name in out.entries:
                out.undecided.append((info.name, f"two Flax tensors ({out.entries[info.name].sources[0]!r} and "
                                                 f"{v.raw_key!r}) would both be {info.name!r}; map one of them"))
                continue
            out.entries[info.name] = LayoutEntry(info, (v.raw_key,), op, perm, (), note)
    return out


def layout_of(name: str, infos: Sequence[VariableInfo]) -> Layout:
    """The layout ``name`` (one of :data:`LAYOUTS`) of a source's tensors.

    Example:
        >>> layout_of("flax", []).entries
        {}
    """
    return flax_layout(infos) if name == "flax" else torch_layout(infos)
