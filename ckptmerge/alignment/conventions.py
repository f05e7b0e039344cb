"""Framework naming conventions, as data: evidence for structural alignment beside shapes and order.

PyTorch, Hugging Face, KerasHub and Keras name the same part of a model differently: the norm
before attention is ``input_layernorm`` (Llama), ``ln_1`` (GPT-2), ``layernorm_before`` (ViT) and
``self_attention_layernorm`` (KerasHub); Llama's ``post_attention_layernorm`` is the norm *before
the MLP*, although its name says "attention". Word overlap alone gets these wrong. This module
holds one declarative table of :class:`Convention` rows: name segments (one scope of a name, or
a few joined by ``/``) and the *role* they stand for. Alignment rewrites every name segment that a
row lists into the row's role words before it compares names, so ``input_layernorm`` and
``self_attention_layernorm`` share the role ``attnnorm`` and ``post_attention_layernorm`` no
longer shares ``attention`` with anything.

The table is extended with :func:`add_convention` (or the config's ``conventions:`` list). It is
evidence, never a rule that renames: a name still pairs only with a tensor of a fitting shape, and
ties stay unresolved.

Pure: no file access, no framework.
"""

from __future__ import annotations

import bisect
import functools
import itertools
import re
import threading
from dataclasses import dataclass
from typing import Dict, FrozenSet, Iterable, List, Optional, Sequence, Tuple

from ..core.errors import RuleError

__all__ = ["Convention", "CONVENTIONS", "add_convention", "conventions", "rewrite", "rewrite_all",
           "digit_sensitive", "positional", "CONV1D_MODULES", "EMBEDDING_MODULES", "CONTEXT", "in_context",
           "POSITION_OFFSETS", "position_offset"]

_ROLE = re.compile(r"^[a-z][a-z ]*[a-z]$|^[a-z]$")
_LEAF = re.compile(r"^[a-z][a-z_]{0,63}$")


@dataclass(frozen=True)
class Convention:
    """One row of the table: name segments that mean one role.

    Attributes:
        names: segments as frameworks write them (matched case-insensitively against a whole
            scope of a name, or several scopes joined by ``/``): ``("input_layernorm", "ln_1")``.
        role: the words they stand for, lower-case letters and spaces: ``"attnnorm"``.
        why: what the row is for, for people reading the table.
        replace: whether the role replaces the segment's own words (for names whose words
            mislead, ``post_attention_layernorm``) or joins them (the default). Names holding
            digits are always replaced, so that ``ln_1`` is not read as position 1 of a series.
        leaf: for a variable that the other framework holds as a whole module: the module's
            variable it stands for. KerasHub's ``reverse_embeddings`` is PyTorch's
            ``lm_head.weight``, so its row reads it as ``lmhead/kernel`` (role, then leaf).

    Example:
        >>> Convention(("ffn_norm", "post_attention_layernorm"), "mlpnorm").role
        'mlpnorm'
    """

    names: Tuple[str, ...]
    role: str
    why: str = ""
    replace: bool = False
    leaf: str = ""

    def __post_init__(self) -> None:
        names = (self.names,) if isinstance(self.names, str) else tuple(self.names)
        if not names or not all(isinstance(n, str) and n.strip("/") and len(n) <= 200 for n in names):
            raise RuleError(f"a convention needs one or more non-empty names (at most 200 characters each). "
                            f"Received: names={self.names!r:.120}")
        if not isinstance(self.role, str) or not _ROLE.match(self.role):
            raise RuleError(f"a convention's role must be lower-case words (letters and spaces), e.g. 'attnnorm'. "
                            f"Received: role={self.role!r:.80}")
        if not isinstance(self.leaf, str) or (self.leaf and not _LEAF.match(self.leaf)):
            raise RuleError(f"a convention's leaf must be a variable name (lower-case letters and '_'), e.g. "
                            f"'kernel'. Received: leaf={self.leaf!r:.80}")
        object.__setattr__(self, "names", tuple(n.strip("/") for n in names))


#: The built-in table: (names, role, why). Roles are made-up words, so that they match only each other.
CONVENTIONS: Tuple[Convention, ...] = tuple(Convention(n, r, w, r.endswith("norm")) for n, r, w in (
    (("input_layernorm", "ln_1", "layernorm_before", "attention_norm", "self_attention_layernorm", "pre_attention_layernorm",
      "self_attention_layer_norm", "attention/output/LayerNorm", "layer_norm_1", "norm1", "attn_norm", "pre_attention_norm"),
     "attnnorm", "the norm of the attention sub-block (before it in pre-norm models, after it in BERT)"),
    (("post_attention_layernorm", "ln_2", "layernorm_after", "ffn_norm", "feedforward_layernorm",
      "feedforward_layer_norm", "output/LayerNorm", "output_layer_norm", "layer_norm_2", "norm2", "mlp_norm",
      "pre_ffw_norm", "pre_feedforward_layernorm"),
     "mlpnorm", "the norm of the MLP sub-block"),
    (("post_attention_norm",), "attnpostnorm",
     "the norm of the attention's output, before its residual add (Gemma 2 and 3, four norms a block; "
     "Hugging Face's post_attention_layernorm there: see CONTEXT)"),
    (("post_ffw_norm", "post_feedforward_layernorm"), "mlppostnorm",
     "the norm of the MLP's output, before its residual add (four norms a block)"),
    (("q_norm", "query_norm", "q_layernorm", "query_layernorm", "query_dense_layernorm",
      "query_dense_layer_norm"), "qnorm", "the norm of the attention's queries"),
    (("k_norm", "key_norm", "k_layernorm", "key_layernorm", "key_dense_layernorm",
      "key_dense_layer_norm"), "knorm", "the norm of the attention's keys"),
    (("ln_f", "norm", "final_layernorm", "final_layer_norm", "sequence_output_layernorm", "layernorm",
      "layer_norm", "final_norm", "norm_f", "ln"),
     "finalnorm", "the last norm of a transformer stack (at the model's top level)"),
    (("embeddings/LayerNorm", "embeddings_layer_norm", "embeddings_layernorm", "layernorm_embedding",
      "layer_norm_embedding", "embedding_layernorm", "embeddings_norm", "embedding_norm"),
     "embnorm", "the norm right after the embeddings (BERT's embeddings/LayerNorm), never the final norm"),
    (("embed_tokens", "wte", "word_embeddings", "token_embedding", "tok_embeddings", "token_embeddings",
      "embed_in"),
     "tokemb", "the token embedding"),
    (("wpe", "position_embeddings", "position_embedding", "pos_embed", "embed_positions"),
     "posemb", "the position embedding"),
    (("token_type_embeddings", "segment_embedding", "segment_embeddings"),
     "segemb", "the token-type (segment) embedding"),
    (("pooler", "pooled_dense", "pooler/dense"), "pooler", "the pooler of the first token"),
    (("q_proj", "query", "q", "query_dense", "q_lin"), "query", "attention query"),
    (("k_proj", "key", "k", "key_dense", "k_lin"), "key", "attention key"),
    (("v_proj", "value", "v", "value_dense", "v_lin"), "value", "attention value"),
    (("o_proj", "out_proj", "attention_output", "attention/output/dense", "attn/c_proj", "output_dense",
      "dense_out", "out_lin"),
     "attnout", "attention output projection"),
    (("c_fc", "fc1", "up_proj", "intermediate/dense", "intermediate", "feedforward_intermediate_dense", "mlp/dense_1", "w3",
      "fc_in", "lin1", "ffw_gating_2"),
     "mlpin", "the MLP's first projection (intermediate)"),
    # (w1 is the gate and w3 the up projection where a SwiGLU MLP is written w2(silu(w1(x)) * w3(x)):
    # Meta's Llama, Mixtral's experts, transformers' LFM2)
    (("gate_proj", "feedforward_gate_dense", "w1", "ffw_gating"), "mlpgate", "the MLP's gate projection"),
    (("down_proj", "fc2", "mlp/c_proj", "feedforward_output_dense", "output/dense", "output", "mlp/dense_2", "w2",
      "fc_out", "lin2", "ffw_linear"),
     "mlpout", "the MLP's last projection"),
    (("c_attn", "qkv", "query_key_value", "in_proj"), "fusedqkv", "query, key and value fused in one tensor"),
    (("lm_head",), "lmhead", "the output projection onto the vocabulary"),
    (("cls_token", "class_token"), "clstoken", "the class token of a vision transformer"),
    (("patch_embeddings/projection", "patch_embedding", "patch_embed/proj"), "patchemb",
     "the patch embedding convolution"),
)) + (Convention(("reverse_embeddings",), "lmhead", "KerasHub's untied output projection: PyTorch's "
                       "lm_head weight (transposed by the torch layout, as KerasHub's converters do)", True, "kernel"),)

#: Segments whose role depends on a sibling: ``(segment, sibling, read as)``: where ``sibling``
#: sits in the same scope, ``segment`` is read as ``read as`` (a name of the table). Hugging Face's
#: ``post_attention_layernorm`` is the MLP's norm in Llama-like blocks, but the attention output's
#: norm in Gemma 2 and 3 blocks, which hold a ``pre_feedforward_layernorm`` beside it.
CONTEXT: Tuple[Tuple[str, str, str], ...] = (
    ("post_attention_layernorm", "pre_feedforward_layernorm", "post_attention_norm"),
)


def in_context(names: Sequence[str]) -> Sequence[str]:
    """``names`` with each segment that :data:`CONTEXT` reads otherwise beside its sibling
    replaced; the same list object when no name changes (or when a change would make two names
    one).

    Example:
        >>> in_context(["l/0/post_attention_layernorm/g", "l/0/pre_feedforward_layernorm/g"])[0]
        'l/0/post_attention_norm/g'
        >>> in_context(["l/0/post_attention_layernorm/g", "l/0/input_layernorm/g"])[0]
        'l/0/post_attention_layernorm/g'
    """
    out: Optional[List[str]] = None
    for segment, sibling, read_as in CONTEXT:
        lowered = [n.lower() for n in (out if out is not None else names)]
        if not any(sibling in n for n in lowered) or not any(segment in n for n in lowered):
            continue
        seg = re.compile(_START + re.escape(segment) + _END)
        sib = re.compile(_START + re.escape(sibling) + _END)
        scopes = {n[:m.start()] for n in lowered for m in sib.finditer(n)}
        current = list(out if out is not None else names)
        for i, n in enumerate(lowered):
            m = seg.search(n)
            if m and n[:m.start()] in scopes:
                current[i] = current[i][:m.start()] + read_as + current[i][m.end():]
        out = current
    if out is None or out == list(names) or len(set(out)) != len(set(names)):
        return names
    return out


#: Position tables that reserve rows at their start: ``(a scope of the checkpoint's name, rows,
#: why)``. RoBERTa counts positions from ``padding_idx + 1``: its table's first two rows are never
#: a position (XLM-R and CamemBERT are saved under the same ``roberta`` scope).
POSITION_OFFSETS: Tuple[Tuple[str, int, str], ...] = (
    ("roberta", 2, "RoBERTa's position ids start at padding_idx + 1 = 2: the table's first 2 rows are reserved"),
)


def position_offset(name: str) -> Optional[Tuple[int, str]]:
    """The rows a position table reserves at its start, and why, where :data:`POSITION_OFFSETS`
    says so for its name (a position table, by the table's roles, under one of its scopes).

    Example:
        >>> position_offset("roberta/embeddings/position_embeddings/embeddings")[0]
        2
        >>> position_offset("bert/embeddings/position_embeddings/embeddings") is None
        True
    """
    if "posemb" not in rewrite(name):
        return None
    scopes = re.split(r"[/.]", name.lower())[:-1]
    for scope, rows, why in POSITION_OFFSETS:
        if scope in scopes:
            return rows, why
    return None


#: Module names whose 2-D ``weight`` is Hugging Face's ``Conv1D`` (``(in, out)``, never transposed as a
#: Linear) when their bias shows it (see :mod:`ckptmerge.alignment.layouts`): the GPT-2 family.
CONV1D_MODULES = ("c_attn", "c_fc", "c_proj", "q_attn")
#: Module names whose 2-D ``weight`` is an embedding table (kept as it is), beside those the layout knows.
EMBEDDING_MODULES = ("embed_tokens", "embed_positions", "embed_in", "tok_embeddings", "word_embeddings",
                     "position_embeddings", "token_type_embeddings", "wte", "wpe", "shared", "embeddings",
                     "embedding", "embed", "emb")

_lock = threading.Lock()
_extra: List[Convention] = []


def add_convention(names: Sequence[str], role: str, why: str = "", *, replace: bool = False,
                   leaf: str = "") -> Convention:
    """Add a row to the convention table, for every later alignment in this process.

    Args:
        names: name segments as your framework writes them.
        role: a role of the table (``"attnnorm"``, ``"mlpnorm"``, ``"tokemb"``, ...: see
            :func:`conventions`) or a new word of your own for both sides.
        why: what it is for.
        replace: the role replaces the names' own words (see :class:`Convention`).
        leaf: the names are a variable standing for a whole module's ``leaf`` (see :class:`Convention`).

    Returns:
        The new :class:`Convention`.

    Raises:
        RuleError: a name is empty or the role is not lower-case words.

    Example:
        >>> c = add_convention(["pre_mlp_rmsnorm"], "mlpnorm")
        >>> rewrite("blocks/3/pre_mlp_rmsnorm/scale")
        'blocks/3/pre_mlp_rmsnorm_mlpnorm/scale'
    """
    row = Convention(tuple(names), role, why, replace, leaf)
    with _lock:
        _extra.append(row)
        _compiled.cache_clear()
    return row


def conventions() -> Tuple[Convention, ...]:
    """The table in force: the built-in rows, then those added (later rows win for a name)."""
    return CONVENTIONS + tuple(_extra)


def _trie(words: Iterable[str]) -> str:
    """One regex alternation of ``words`` as a trie (``ln(?:_1|_2)``), so that the engine tries
    each character once instead of every word at every position; each optional tail greedy, so
    the longest word that fits is tried first."""
    root: Dict[str, dict] = {}
    for w in words:
        node = root
        for ch in w:
            node = node.setdefault(ch, {})
        node[""] = {}

    def build(node: Dict[str, dict]) -> str:
        alts = [(_SEP if ch == "/" else re.escape(ch)) + build(node[ch]) for ch in sorted(node) if ch]
        if not alts:
            return ""
        body = alts[0] if len(alts) == 1 else "(?:" + "|".join(alts) + ")"
        return f"(?:{body})?" if "" in node else body

    return build(root)


_DIGIT_RUN = re.compile(r"[0-9]+")
#: Where a name segment ends: ``/``, or ``.`` as PyTorch joins modules. A name half in each
#: spelling (``encoder.layer.1.attention/output/LayerNorm``, as a regex into a dotted scope
#: makes it) is read as its segments say: ``attention/output/LayerNorm`` there, never only its
#: tail ``output/LayerNorm`` (the other norm of the layer).
_SEP = "[/.]"
_START, _END = r"(?<![^/.\n])", r"(?![^/.\n])"


def _key(text: str) -> str:
    """A matched run of segments as the table lists it (lower-case, joined by ``/``)."""
    return text.lower().replace(".", "/")


def _written(m: "re.Match[str]", roles: Dict[str, str], heads: Dict[str, Tuple[str, ...]]) -> str:
    """What the table writes for a matched run of segments: its role, or the run as written with
    its role joined (its own separators kept: ``attention.output.dense_attnout``); the run as it
    is where it is the tail of a longer row whose head is glued to the words before it (see
    :func:`_glued`)."""
    text = m.group(0)
    if heads and _glued(m, heads):
        return text
    role = roles[_key(text)]
    return f"{text}_{role[1:]}" if role[0] == "+" else role


def _glued(m: "re.Match[str]", heads: Dict[str, Tuple[str, ...]]) -> bool:
    """Whether a match is the tail of a longer row (``output/LayerNorm`` of
    ``attention/output/LayerNorm``) whose head ends the segment before it, glued to other words
    (``encoder_layer_1_attention/output/LayerNorm``, ``crossattention/output/LayerNorm``). The
    tail's own role (the MLP's norm) would be a guess there: the name may as well hold the longer
    row (the attention's norm), so it is read by its words alone."""
    tails = heads.get(_key(m.group(0)))
    if not tails:
        return False
    before = _key(m.string[m.string.rfind("\n", 0, m.start()) + 1:m.start()])
    for head in tails:
        k = len(before) - len(head) - 1  # where the head would start
        if k > 0 and before[k - 1] != "/" and before.endswith(head + "/"):
            return True
    return False


@functools.lru_cache(maxsize=1)
def _compiled() -> Tuple["re.Pattern[str]", Dict[str, str], "re.Pattern[str]", "re.Pattern[str]", "re.Pattern[str]",
                         Dict[str, Tuple[str, ...]]]:
    roles: Dict[str, str] = {}
    for row in conventions():
        for n in row.names:
            replace = row.replace or any(c.isdigit() for c in n)
            # (a role that joins the name's words is marked "+": it follows the name as written there)
            roles[n.lower()] = (f"{row.role}/{row.leaf}" if row.leaf else row.role) if replace else f"+{row.role}"
    # the rows that are the tail of a longer row: their heads (``output/layernorm``: ``attention``)
    heads: Dict[str, Tuple[str, ...]] = {}
    for n in roles:
        parts = n.split("/")
        for j in range(1, len(parts)):
            tail = "/".join(parts[j:])
            if tail in roles:
                heads[tail] = heads.get(tail, ()) + ("/".join(parts[:j]),)
    # a whole segment (or run of segments) of a name, never part of one
    pattern = re.compile(_START + _trie(roles) + _END, re.IGNORECASE)
    # the names holding digits, as digit templates show them (``ln_1`` -> ``ln_0``)
    with_digits = [n for n in roles if any(c.isdigit() for c in n)]
    digits = {_DIGIT_RUN.sub("0", n) for n in with_digits} or {"\0"}
    # ... and as a family: any number in their place (``ln_[0-9]+``), longest first
    family = "|".join(_DIGIT_RUN.sub("[0-9]+", re.escape(n)).replace("/", _SEP)
                      for n in sorted(with_digits, key=len, reverse=True))
    # the names without digits, followed by a counter as Keras numbers default names (``layer_norm_2``)
    counted = _trie(n for n in roles if not any(c.isdigit() for c in n))
    return (pattern, roles, re.compile(_START + _trie(digits) + _END, re.IGNORECASE),
            re.compile(_START + "(?:" + (family or "\0") + ")" + _END, re.IGNORECASE),
            re.compile(_START + "(" + counted + r")_[0-9]+" + _END, re.IGNORECASE), heads)


def _prefix(m: "re.Match[str]") -> str:
    """The text of a match's name before the match, its digit runs as ``0``."""
    return _DIGIT_RUN.sub("0", m.string[m.string.rfind("\n", 0, m.start()) + 1:m.start()])


def positional(names: Iterable[str], templates: Optional[Sequence[str]] = None) -> FrozenSet[Tuple[str, str]]:
    """The convention names that, among ``names``, are members of a numbered family rather than
    roles: ``(scope before it, as a digit template; the name, lower-case)``. :func:`rewrite_all`
    leaves those as they are, so their numbers stay series positions.

    Two kinds: a family of a convention name holding digits with a member the table does not list
    (``norm0``, ``norm1``, ``norm2`` under one scope: ``norm1`` is no attention norm there, only
    the second of three; ``fc1``, ``fc2``, ``fc3`` of a classifier), and a convention name beside
    the same name with a counter, as Keras numbers the default names of one layer class
    (``layer_norm``, ``layer_norm_1``, ``layer_norm_2``).

    Args:
        names: the names of one alignment.
        templates: the names' digit templates (each run of digits as ``0``), in the same order,
            where the caller has them already (:class:`~ckptmerge.alignment.features.Features`);
            then no name may hold a newline.

    Example:
        >>> sorted(positional(["b/0/norm0/g", "b/0/norm1/g", "h/0/ln_1/g", "h/0/ln_2/g"]))
        [('b/0/', 'norm0'), ('b/0/', 'norm1')]
        >>> sorted(positional(["layer_norm/gamma", "layer_norm_1/gamma"]))
        [('', 'layer_norm'), ('', 'layer_norm_1')]
    """
    names = list(names)
    if templates is None or len(templates) != len(names):
        names = [n for n in names if "\n" not in n]
        templates = _DIGIT_RUN.sub("0", "\n".join(names)).split("\n")
    if not names:
        return frozenset()
    _, roles, _, family, counted, _ = _compiled()
    # Only names whose template holds a family or a counted name can hold one: those patterns
    # read digits only as whole runs (``[0-9]+`` between letters or segment edges), so a name
    # matches where its template does, at the same segments. Scanning the distinct templates
    # (a few dozen for a 10,000-variable model) picks the few names worth scanning.
    distinct = list(dict.fromkeys(templates))
    in_family, counted_in = _matching(family, distinct), _matching(counted, distinct)
    if not in_family and not counted_in:
        return frozenset()
    keep = set()
    members: Dict[Tuple[str, str], set] = {}
    for m in family.finditer("\n".join(n for n, t in zip(names, templates) if t in in_family) if in_family else ""):
        text = _key(m.group(0))
        members.setdefault((_prefix(m), _DIGIT_RUN.sub("0", text)), set()).add(text)
    for (prefix, _), found in members.items():
        if not found <= roles.keys():
            keep.update((prefix, t) for t in found)
    bare: Dict[Tuple[str, str], List[str]] = {}
    for m in counted.finditer("\n".join(n for n, t in zip(names, templates) if t in counted_in) if counted_in else ""):
        bare.setdefault((_prefix(m), _key(m.group(1))), []).append(_key(m.group(0)))
    if bare:
        present = {(_prefix(m), _key(m.group(0))) for m in _compiled()[0].finditer("\n".join(names))}
        for key, numbered in bare.items():
            # (Keras counts from _1: a family without it, Gemma's ffw_gating beside ffw_gating_2, is
            # two names the table lists, not one class counted)
            if key in present and f"{key[1]}_1" in numbered:
                keep.add(key)
                keep.update((key[0], t) for t in numbered)
    return frozenset(keep)


def _matching(pattern: "re.Pattern[str]", lines: Sequence[str]) -> set:
    """The lines holding a match of ``pattern`` (lines without newlines)."""
    joined = "\n".join(lines)
    starts = list(itertools.accumulate((len(s) + 1 for s in lines[:-1]), initial=0))
    return {lines[bisect.bisect_right(starts, m.start()) - 1] for m in pattern.finditer(joined)}


def rewrite(name: str) -> str:
    """A name with every segment the table lists replaced by its role.

    Example:
        >>> rewrite("model/layers/0/post_attention_layernorm/gamma")
        'model/layers/0/mlpnorm/gamma'
        >>> rewrite("h/1/ln_1/beta")
        'h/1/attnnorm/beta'
        >>> rewrite("wte/embeddings")
        'wte_tokemb/embeddings'
    """
    pattern, roles, heads = _compiled()[0], _compiled()[1], _compiled()[5]
    return pattern.sub(lambda m: _written(m, roles, heads), name)


def rewrite_all(names: Iterable[str], keep: FrozenSet[Tuple[str, str]] = frozenset()) -> List[str]:
    """:func:`rewrite` of many names in one regex pass (names without newlines), leaving the
    convention names ``keep`` holds as they are (see :func:`positional`)."""
    names = list(names)
    joined = "\n".join(names)
    if joined.count("\n") != max(len(names) - 1, 0):
        return [rewrite(n) for n in names]
    pattern, roles, heads = _compiled()[0], _compiled()[1], _compiled()[5]
    if keep:
        def role(m: "re.Match[str]") -> str:
            text = m.group(0)
            return text if (_prefix(m), _key(text)) in keep else _written(m, roles, heads)
    else:
        def role(m: "re.Match[str]") -> str:
            return _written(m, roles, heads)
    out = pattern.sub(role, joined)
    return out.split("\n") if names else []


def digit_sensitive(templates: Iterable[str]) -> List[bool]:
    """Per digit template (each run of digits as ``0``): whether the table may read it differently
    for different digits (it holds ``ln_0``, which is ``ln_1`` or ``ln_2``). Any other template
    rewrites alike for every name it stands for, so :func:`rewrite` of the template serves them all.

    Example:
        >>> digit_sensitive(["h/0/ln_0/gamma", "h/0/attn/c_attn/kernel"])
        [True, False]
    """
    found = _compiled()[2].search
    return [found(t) is not None for t in templates]
