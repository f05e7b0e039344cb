"""Small random models, named twice the ways real code renames (issue 32 item 3).

A model is a list of canonical variables: a layer path (segments, some numbered), a role in its
layer (``kernel``, ``bias``, ``gamma``, ...) and a Keras shape. :func:`render` names the model in
one random style: a prefix added or not, numbered segments as separate scopes or merged into their
parent (``encoder/layer_0/`` vs ``encoder_layer0/``), numbering from 0 or 1 or with gaps, word
synonyms (``attention``/``attn``/``self_attn``), Keras auto-names (``dense_7``, numbered per
class across the model from a random start), or PyTorch dotted names with PyTorch's shapes and
leaves (``encoder.layer.0.attention.query.weight``, a Linear kernel transposed), which a source
reads through ``layout="torch"``. Two renderings of one model give a target list and a source
with the truth known: each target's canonical variable, and the name it has in the source.

Pure (numpy and ckptmerge specs only); the fuzz is ``tests/test_align_fuzz.py``.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Sequence, Tuple

# A segment: (word choices, number or None). The first word is the canonical one.
Seg = Tuple[Tuple[str, ...], Optional[int]]


@dataclass(frozen=True)
class Var:
    """One canonical variable: its layer (segments), the layer's class, its role and Keras shape."""

    layer: Tuple[Seg, ...]
    cls: str
    role: str
    shape: Tuple[int, ...]


_LEAVES = {  # role -> (Keras leaf choices, PyTorch leaf)
    "kernel": (("kernel",), "weight"),
    "bias": (("bias",), "bias"),
    "gamma": (("gamma", "scale"), "weight"),
    "beta": (("beta", "offset"), "bias"),
    "moving_mean": (("moving_mean",), "running_mean"),
    "moving_variance": (("moving_variance",), "running_var"),
    "embeddings": (("embeddings", "embedding"), "weight"),
}
_CLASS_NAMES = {"dense": "dense", "conv": "conv2d", "bn": "batch_normalization", "ln": "layer_normalization",
                "emb": "embedding"}


def _dense(layer: Tuple[Seg, ...], n_in: int, n_out: int, bias: bool = True) -> List[Var]:
    out = [Var(layer, "dense", "kernel", (n_in, n_out))]
    return out + ([Var(layer, "dense", "bias", (n_out,))] if bias else [])


def _norm(layer: Tuple[Seg, ...], cls: str, n: int) -> List[Var]:
    roles = ("gamma", "beta", "moving_mean", "moving_variance") if cls == "bn" else ("gamma", "beta")
    return [Var(layer, cls, r, (n,)) for r in roles]


def mlp(rng: random.Random) -> List[Var]:
    """A stack of Dense layers, widths drawn from a few values (so that shapes repeat)."""
    depth = rng.randint(2, 6)
    widths = [rng.choice((4, 8, 16)) for _ in range(depth + 1)]
    out: List[Var] = []
    for i in range(depth):
        out += _dense(((("hidden", "fc", "dense", "linear"), i),), widths[i], widths[i + 1])
    return out + _dense(((("head", "output", "logits", "classifier"), None),), widths[-1], rng.choice((2, 3)))


def convnet(rng: random.Random) -> List[Var]:
    """Conv + BatchNorm blocks (the conv without a bias), then a Dense head."""
    depth = rng.randint(2, 5)
    chans = [3] + [rng.choice((4, 8, 8, 16)) for _ in range(depth)]
    out: List[Var] = []
    for i in range(depth):
        block = (("block", "stage", "layer"), i)
        k = rng.choice((1, 3))
        out.append(Var((block, (("conv",), None)), "conv", "kernel", (k, k, chans[i], chans[i + 1])))
        out += _norm((block, (("bn", "norm", "batch_norm"), None)), "bn", chans[i + 1])
    return out + _dense(((("head", "fc", "classifier"), None),), chans[-1], rng.choice((5, 10)))


def transformer(rng: random.Random) -> List[Var]:
    """An embedding, L encoder layers (q/k/v/o, two norms, a two-layer MLP), a final norm."""
    d, f, layers = rng.choice((8, 16)), rng.choice((32, 24)), rng.randint(1, 4)
    vocab = rng.choice((50, 64))
    enc = (("encoder", "transformer"), None)
    out: List[Var] = [Var(((("embeddings", "embed", "token_embedding"), None),), "emb", "embeddings", (vocab, d))]
    for i in range(layers):
        layer = (enc, (("layer", "block", "h"), i))
        attn = (*layer, (("attention", "attn", "self_attention"), None))
        for word in (("query", "q_proj", "q"), ("key", "k_proj", "k"), ("value", "v_proj", "v"),
                     ("output", "o_proj", "out_proj")):
            out += _dense((*attn, (word, None)), d, d)
        out += _norm((*layer, (("attention_norm", "ln_1", "norm1"), None)), "ln", d)
        mlp_scope = (*layer, (("mlp", "ffn", "feed_forward"), None))
        out += _dense((*mlp_scope, (("intermediate", "fc1", "dense_in"), None)), d, f)
        out += _dense((*mlp_scope, (("output", "fc2", "dense_out"), None)), f, d)
        out += _norm((*layer, (("mlp_norm", "ln_2", "norm2"), None)), "ln", d)
    return out + _norm(((("final_norm", "ln_f", "norm"), None),), "ln", d)


FAMILIES = (mlp, convnet, transformer)


@dataclass(frozen=True)
class Style:
    """One way of naming a model (see the module docstring)."""

    prefix: str
    merged: bool      # numbered segments merged into their parent scope: encoder_layer0
    start: int        # first number
    step: int         # numbering step (2: gaps)
    words: int        # which word choice (a seed for per-segment choices)
    auto: Optional[int]  # Keras auto-names per class from this start (layer paths dropped)
    torch: bool       # PyTorch dotted names, leaves and shapes


def random_style(rng: random.Random, torch: bool = False) -> Style:
    auto = rng.choice((None, None, 0, rng.randint(1, 9))) if not torch else None
    return Style(prefix=rng.choice(("", "", "model/", "backbone/", "net/")), merged=rng.random() < 0.35,
                 start=rng.choice((0, 0, 1)), step=rng.choice((1, 1, 1, 2)), words=rng.randint(0, 1 << 30),
                 auto=auto, torch=torch)


def _layer_name(layer: Tuple[Seg, ...], style: Style) -> List[str]:
    pick = random.Random(style.words)
    parts: List[str] = []
    for words, number in layer:
        word = words[pick.randrange(len(words))] if style.words % 3 else words[0]
        if number is None:
            parts.append(word)
            continue
        n = style.start + number * style.step
        if style.merged and parts:
            parts[-1] = f"{parts[-1]}_{word}{n}"
        elif style.torch:
            parts += [word, str(n)]
        else:
            parts.append(f"{word}_{n}")
    return parts


def render(model: Sequence[Var], style: Style) -> Tuple[List[Tuple[str, Tuple[int, ...]]], List[str]]:
    """``(name, shape)`` per variable of ``model`` in ``style``, and the names in saving order."""
    out: List[Tuple[str, Tuple[int, ...]]] = []
    counts: Dict[str, int] = {}
    seen: Dict[Tuple[Seg, ...], str] = {}
    leaf_pick = random.Random(style.words + 1).randrange(2)
    for v in model:
        keras_leaves, torch_leaf = _LEAVES[v.role]
        if style.auto is not None:  # Keras auto-names: one counter per class, across the model
            if v.layer not in seen:
                base = _CLASS_NAMES[v.cls]
                n = counts.get(base, style.auto)
                counts[base] = n + 1
                seen[v.layer] = base if n == 0 else f"{base}_{n}"
            scope = [seen[v.layer]]
        else:
            scope = _layer_name(v.layer, style)
        if style.torch:
            shape = v.shape
            if v.role == "kernel" and len(shape) == 2:
                shape = (shape[1], shape[0])
            elif v.role == "kernel" and len(shape) == 4:
                shape = (shape[3], shape[2], shape[0], shape[1])
            name = ".".join([p for p in style.prefix.split("/") if p] + scope + [torch_leaf])
        else:
            shape = v.shape
            leaf = keras_leaves[leaf_pick % len(keras_leaves)]
            name = style.prefix + "/".join(scope + [leaf])
        out.append((name, shape))
    return out, [n for n, _ in out]


def plan_in_order(targets: Sequence[Any], source: Any, target_order: Optional[Sequence[str]]) -> Any:
    """The plan ``cm.plan(targets, [source])`` makes, with ``target_order`` as the targets'
    creation order (what a Keras model target gives alignment; a spec list gives none)."""
    from ckptmerge.core.specs import by_name
    from ckptmerge.planning.planner import make_plan
    from ckptmerge.planning.suggestion import aligned_views
    from ckptmerge.restoring.targets import TargetSet
    from ckptmerge.sources.opening import open_sources

    ts = TargetSet(variables=by_name(list(targets)), mode="specs")
    [handle] = open_sources([source], verify=True)
    try:
        if callable(getattr(handle, "name_targets", None)):
            handle.name_targets(ts.infos)
        views = [handle.view(source.rules(ts.name_of))]
        result = make_plan(ts.infos, views)
        if result.missing:
            views = aligned_views(result, views, [True], target_order=target_order, source_orders=[handle.order])
            result = make_plan(ts.infos, views)
    finally:
        handle.close()
    return result


@dataclass
class Case:
    """One fuzz case: the family, both styles, the targets ``(name, shape)`` in creation order,
    the source's ``(name, shape)`` in saving order, whether the source records that order (as a
    TF2 object-based checkpoint does; PyTorch and name-keyed files do not), and the truth."""

    family: str
    target_style: Style
    source_style: Style
    targets: List[Tuple[str, Tuple[int, ...]]]
    source: List[Tuple[str, Tuple[int, ...]]]
    source_ordered: bool

    @property
    def truth(self) -> Dict[str, str]:
        """Target name -> the source name of the same variable."""
        return {t: s for (t, _), (s, _) in zip(self.targets, self.source)}


def make_case(seed: int) -> Case:
    """The fuzz case of ``seed``: a model of family ``seed % 3``, a Keras-style target naming and a
    source naming (a PyTorch one three times in ten). A source name equal to the name of another
    target is renamed under ``old/``: equal names are the planner's to pair, not alignment's (and
    a Keras model target undoes an auto-name shift by its own rule, docs/names.md)."""
    rng = random.Random(seed)
    family = FAMILIES[seed % len(FAMILIES)]
    model = family(rng)
    t_style = random_style(rng)
    s_style = random_style(rng, torch=rng.random() < 0.3)
    targets, _ = render(model, t_style)
    source, _ = render(model, s_style)
    own = {s: t for (t, _), (s, _) in zip(targets, source)}
    names = {t for t, _ in targets}
    if any(s in names and own[s] != s for s in own):
        s_style = Style(**{**s_style.__dict__, "prefix": "old." if s_style.torch else "old/"})
        source, _ = render(model, s_style)
    return Case(family.__name__, t_style, s_style, targets, source,
                source_ordered=not s_style.torch and rng.random() < 0.5)
