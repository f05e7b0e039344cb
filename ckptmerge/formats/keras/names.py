"""Recognisable names for the weights inside a Keras 3 ``.keras`` archive, without Keras.

A Keras 3 weights file stores each layer's variables as numbered datasets under a path built
from class names (``layers/sequential/layers/dense_1/vars/0``): the structure Keras's own
``load_weights`` walks, not the names people know. Two things in the archive give those names
back, and this module joins them (pure: it takes what the reader found, opens nothing):

- each ``vars`` group carries the layer's own name as its ``name`` attribute (files written
  without it keep their raw keys), so the chain of names from the root
  to a layer is the layer's path: ``encoder/dense_1`` (the root model's own name is left out:
  it changes whenever a model is rebuilt, see docs/names.md);
- ``config.json`` says each layer's class (and options such as ``use_bias``, ``center``), and
  the class says which variable each index is (``Dense``: ``kernel``, ``bias``).

A dataset whose layer class is unknown, or whose count does not fit the class, is named
``<layer path>/vars/<i>``: still recognisable by its layer, never guessed.
"""

from __future__ import annotations

import re
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

__all__ = ["archive_names", "snake_case", "layer_classes", "layer_of"]

_KERNEL_BIAS = ("kernel", "bias")
_RNN_CELL = ("kernel", "recurrent_kernel", "bias")
#: Variables per layer class (snake case), in the order ``save_own_variables`` stores them.
_VARIABLES: Dict[str, Tuple[str, ...]] = {
    "dense": _KERNEL_BIAS, "einsum_dense": _KERNEL_BIAS,
    "conv1d": _KERNEL_BIAS, "conv2d": _KERNEL_BIAS, "conv3d": _KERNEL_BIAS,
    "conv1d_transpose": _KERNEL_BIAS, "conv2d_transpose": _KERNEL_BIAS,
    "conv3d_transpose": _KERNEL_BIAS,
    "depthwise_conv1d": ("kernel", "bias"), "depthwise_conv2d": ("kernel", "bias"),
    "embedding": ("embeddings",),
    "batch_normalization": ("gamma", "beta", "moving_mean", "moving_variance"),
    "layer_normalization": ("gamma", "beta"),
    "group_normalization": ("gamma", "beta"),
    "lstm_cell": _RNN_CELL, "gru_cell": _RNN_CELL, "simple_rnn_cell": _RNN_CELL,
    "p_re_lu": ("alpha",),
}
#: Attribute names under which Keras layers keep an inner layer of a known class.
_ATTRIBUTE_CLASSES = {"query_dense": "einsum_dense", "key_dense": "einsum_dense",
                      "value_dense": "einsum_dense", "output_dense": "einsum_dense"}
#: Variables a config option leaves out: (class, option) -> variable.
_OPTIONAL = {("dense", "use_bias"): "bias", ("einsum_dense", "bias_axes"): "bias",
             ("batch_normalization", "center"): "beta", ("batch_normalization", "scale"): "gamma",
             ("layer_normalization", "center"): "beta", ("layer_normalization", "scale"): "gamma",
             ("group_normalization", "center"): "beta", ("group_normalization", "scale"): "gamma"}
for _c in ("conv1d", "conv2d", "conv3d", "conv1d_transpose", "conv2d_transpose", "conv3d_transpose",
           "depthwise_conv1d", "depthwise_conv2d"):
    _OPTIONAL[(_c, "use_bias")] = "bias"
_UNIQUE_SUFFIX = re.compile(r"_\d+$")
_CONTAINER = re.compile(r"container(_\d+)?")


def layer_of(key: str) -> Optional[str]:
    """The object path of a weights-file entry (``layers/dense`` of ``layers/dense/vars/0``,
    ``""`` of the root's ``vars/0``), or ``None`` for a key that is not a Keras 3 entry.

    Example:
        >>> layer_of("layers/dense/vars/1"), layer_of("vars/0"), layer_of("dense/kernel")
        ('layers/dense', '', None)
    """
    head, sep, index = key.rpartition("/vars/")
    if sep and index.isdigit():
        return head
    if key.startswith("vars/") and key[5:].isdigit():
        return ""
    return None


def snake_case(name: str) -> str:
    """Keras's class-name-to-key rule: ``BatchNormalization`` -> ``batch_normalization``.

    Example:
        >>> snake_case("Conv2DTranspose"), snake_case("LSTMCell")
        ('conv2d_transpose', 'lstm_cell')
    """
    s = re.sub(r"\W+", "", name)
    s = re.sub("(.)([A-Z][a-z]+)", r"\1_\2", s)
    return re.sub("([a-z])([A-Z])", r"\1_\2", s).lower()


def layer_classes(config: Any) -> Dict[Tuple[str, ...], Tuple[str, Mapping[str, Any]]]:
    """``{layer name path: (snake-case class, layer config)}`` from a ``config.json`` dict.

    The path is the chain of layer names below the root model (nested ``Sequential`` and
    ``Functional`` models are followed). Malformed parts are skipped, never fatal.

    Example:
        >>> cfg = {"class_name": "Sequential", "config": {"name": "s", "layers": [
        ...     {"class_name": "Dense", "config": {"name": "d", "use_bias": False}}]}}
        >>> layer_classes(cfg)[("d",)][0]
        'dense'
    """
    out: Dict[Tuple[str, ...], Tuple[str, Mapping[str, Any]]] = {}

    def visit(node: Any, path: Tuple[str, ...]) -> None:
        if not isinstance(node, Mapping):
            return
        cfg = node.get("config")
        cls = node.get("class_name")
        if not isinstance(cfg, Mapping) or not isinstance(cls, str):
            return
        if path:
            out[path] = (snake_case(cls), cfg)
        layers = cfg.get("layers")
        if isinstance(layers, list):
            for child in layers:
                name = child.get("config", {}).get("name") if isinstance(child, Mapping) else None
                if isinstance(name, str):
                    visit(child, path + (name,))

    visit(config, ())
    return out


def _variable_names(cls: Optional[str], cfg: Mapping[str, Any], count: int) -> Optional[Sequence[str]]:
    names = _VARIABLES.get(cls or "")
    if names is None:
        return None
    dropped = {var for (c, option), var in _OPTIONAL.items()
               if c == cls and option in cfg and not cfg[option]}
    names = [n for n in names if n not in dropped]
    if len(names) != count and names[-1:] == ["bias"] and len(names) - 1 == count:
        names = names[:-1]  # no config, no bias: Keras stores the kernel alone
    return names if len(names) == count else None


def archive_names(datasets: Sequence[str], layer_names: Mapping[str, str],
                  config: Any = None) -> Dict[str, str]:
    """Name the model datasets of a Keras 3 weights file by their variables' paths.

    Args:
        datasets: dataset keys (``layers/dense/vars/0``); keys not ending in ``vars/<i>`` and
            optimizer entries are left out of the result.
        layer_names: ``{group path: layer name}`` from the ``name`` attribute of each
            ``vars`` group (``{"layers/dense": "head", "": "clf"}``).
        config: the archive's ``config.json`` as a dict (classes and options), or ``None``.

    Returns:
        ``{dataset key: name}`` for every dataset it can name (``encoder/dense_1/bias``);
        datasets of layers without a recorded name are left out (they keep their raw key).

    Example:
        >>> archive_names(["layers/dense/vars/0", "layers/dense/vars/1"],
        ...               {"": "sequential", "layers/dense": "head"})
        {'layers/dense/vars/0': 'head/kernel', 'layers/dense/vars/1': 'head/bias'}
    """
    classes = layer_classes(config) if config is not None else {}
    root_class = snake_case(config["class_name"]) if isinstance(config, Mapping) and isinstance(
        config.get("class_name"), str) else None
    by_layer: Dict[str, List[Tuple[int, str]]] = {}
    for key in datasets:
        head, sep, index = key.rpartition("/vars/")
        if not sep and key.startswith("vars/"):
            head, index = "", key[len("vars/"):]
        elif not sep:
            continue
        if not index.isdigit() or head.split("/", 1)[0] in ("optimizer", "optimizer_weights"):
            continue
        by_layer.setdefault(head, []).append((int(index), key))
    out: Dict[str, str] = {}
    for head, entries in by_layer.items():
        path = _layer_path(head, layer_names)
        if path is None:
            continue
        cls, cfg = classes.get(tuple(path), (None, {}))
        prefix = _scope(path, layer_names.get(""), root_class, classes)
        if cls is None:  # not in config.json: the key (``dense_1``, ``query_dense``) says the class
            last = head.rsplit("/", 1)[-1]
            cls = _ATTRIBUTE_CLASSES.get(last) or _UNIQUE_SUFFIX.sub("", last)
            if cls not in _VARIABLES:
                cls = _UNIQUE_SUFFIX.sub("", path[-1]) if path else None
        entries.sort()
        names = _variable_names(cls, cfg, len(entries))
        if [i for i, _ in entries] != list(range(len(entries))):
            names = None
        for i, key in entries:
            leaf = names[i] if names is not None else f"vars/{i}"
            out[key] = f"{prefix}/{leaf}" if prefix else leaf
    if len(set(out.values())) != len(out):  # two layers with one name: keep the raw keys
        return {}
    return out


def _scope(path: List[str], root_name: Optional[str], root_class: Optional[str],
           classes: Mapping[Tuple[str, ...], Tuple[str, Mapping[str, Any]]]) -> str:
    """The scope Keras gives the variables of the layer at name ``path``: the names of the
    enclosing layers that build it (a ``Sequential``, a custom layer or model adds its name), from
    the last ``Functional`` model on (a functional model's layers are built when it is made,
    outside any scope). Without ``config.json`` the root's name is left out."""
    scope: List[str] = [root_name] if root_class not in (None, "functional") and root_name else []
    for end in range(1, len(path)):
        if classes.get(tuple(path[:end]), ("",))[0] == "functional":
            scope = []
        else:
            scope.append(path[end - 1])
    return "/".join(scope + path[-1:])


def _layer_path(head: str, layer_names: Mapping[str, str]) -> Optional[List[str]]:
    """The layer names from below the root down to the group ``head`` (None if any is unknown)."""
    parts = head.split("/") if head else []
    path: List[str] = []
    for end in range(1, len(parts) + 1):
        group = "/".join(parts[:end])
        if _is_container(parts[end - 1]):
            continue
        name = layer_names.get(group)
        if name is None:
            return None
        path.append(name)
    return path


def _is_container(part: str) -> bool:
    """True for the ``layers``/``container`` groups that hold a list of layers, not a layer."""
    return part == "layers" or bool(_CONTAINER.fullmatch(part))
