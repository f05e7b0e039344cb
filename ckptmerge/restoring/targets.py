"""Naming target variables: turn what the user passes as ``target`` into named variables.

This is one of the few modules that touch TensorFlow, and it imports it lazily. A target is:

- ``None``: the default graph's global variables (graph mode only);
- a list/tuple of variables (TF variables or Keras 3 variables);
- a dict ``{name: variable}``: the names are the user's;
- a ``tf.Module``;
- a Keras 3 model or layer (on any Keras backend: with JAX, PyTorch or NumPy the targets are
  Keras variables in mode ``"keras"``, and TensorFlow is not imported).

Every target variable gets exactly one name (see :func:`variable_name`):

- graph mode: the variable's op name (``c/x1``); partitioned variables (saved as slices) are
  grouped under their full name, as a ``Saver`` writes them;
- Keras 3: the variable's ``.path`` (``enc1/kernel``, or ``sequential/enc1/kernel`` for a
  ``Sequential`` model, whose path includes the model's name);
- ``tf.Module``: the variable's own name (``v.name`` without ``:0``) when it was given
  explicitly and is unique in the module; otherwise its attribute path (``sub/b``, ``layers/0``).
  TF's automatic names (``Variable``, ``Variable_1``) count as no name.

A Keras model whose variables share a ``.path`` (sublayers built outside their parent's scope)
names those by their object path (see :func:`keras_model_variables`). Any other two target
variables with one name are an error that lists every duplicate.
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass, field
from typing import Any, Dict, Iterable, List, Optional, Sequence, Tuple

from ..core.args import received
from ..core.errors import ArgumentTypeError, CkptMergeError, PlanError
from ..core.specs import VariableInfo, normalize_name
from ..core.text import quote_name

__all__ = ["TargetVariable", "TargetSet", "collect_targets", "creation_order", "input_layers", "import_tf",
           "keras_backend", "keras_model_variables"]

_AUTO_NAME = re.compile(r"^(Sharded)?Variable(_\d+)?$")
_PART_SUFFIX = re.compile(r"/part_\d+$")


def import_tf() -> Any:
    """Import TensorFlow, or raise a clear error saying how to install it."""
    try:
        import tensorflow as tf  # noqa: WPS433 (lazy by design: importing TF costs ~2.5 s)
    except ImportError as exc:  # pragma: no cover - TF is a dependency of the package
        raise CkptMergeError(
            "TensorFlow is needed to restore into variables but could not be imported "
            f"({exc}). Install it with: pip install 'tensorflow>=2.16'"
        ) from exc
    return tf


@dataclass
class TargetVariable:
    """One named target: a variable, or the parts of one partitioned variable.

    Attributes:
        name: the unique target name.
        info: its spec (full shape, dtype).
        parts: ``(variable, slice_spec)`` pairs; ``slice_spec`` is ``None`` for a whole
            variable, else TF's ``"full_shape slice"`` string (e.g. ``"10 3 0,5:-"``).
        assign_target: the object to call ``.assign`` on (a Keras variable's TF variable).
    """

    name: str
    info: VariableInfo
    parts: List[Tuple[Any, Optional[str]]] = field(default_factory=list)

    @property
    def partitioned(self) -> bool:
        """True for a TF1 partitioned variable (several parts, each a slice of the whole)."""
        return len(self.parts) != 1 or self.parts[0][1] is not None


@dataclass
class TargetSet:
    """All target variables of a plan, by name, and the mode they live in.

    Attributes:
        variables: name -> :class:`TargetVariable`, sorted by name.
        mode: ``"graph"``, ``"eager"``, or ``"keras"`` (a Keras 3 model on another backend).
        graph: the ``tf.Graph`` in graph mode, else ``None``.
        by_id: ``id(variable) -> name`` so map values given as variables can be named.
    """

    variables: Dict[str, TargetVariable]
    mode: str
    graph: Any = None
    by_id: Dict[int, str] = field(default_factory=dict)

    @property
    def infos(self) -> List[VariableInfo]:
        """The target specs, sorted by name."""
        if self.mode == "specs":  # (VariableInfo objects already)
            return list(self.variables.values())
        return [t if isinstance(t, VariableInfo) else t.info for t in self.variables.values()]

    def name_of(self, variable: Any) -> Optional[str]:
        """The target name of a variable object, or ``None`` if it is not a target."""
        name = self.by_id.get(id(variable))
        if name is None:
            inner = getattr(variable, "value", None)
            name = self.by_id.get(id(inner)) if inner is not None and not callable(inner) else None
        return name


def _dtype_name(dtype: Any) -> str:
    return getattr(dtype, "name", str(dtype)).replace("_ref", "")


def is_keras_object(obj: Any) -> bool:
    keras = sys.modules.get("keras")
    if keras is None:
        return False
    try:
        return isinstance(obj, (keras.Layer, keras.Variable))
    except AttributeError:  # pragma: no cover - very old keras
        return False


def keras_backend(target: Any) -> Optional[str]:
    """The Keras backend (``"tensorflow"``, ``"jax"``, ``"torch"``, ...) when ``target`` is a
    Keras model, layer or variable, or a list/dict of Keras variables; else ``None``.

    Example:
        >>> keras_backend({"w": object()}) is None
        True
    """
    keras = sys.modules.get("keras")
    if keras is None:
        return None
    items = list(target.values()) if isinstance(target, dict) else (
        list(target) if isinstance(target, (list, tuple)) else [target])
    if not items or not all(is_keras_object(x) for x in items):
        return None
    return str(keras.backend.backend())


def keras_model_variables(target: Any, optimizer: bool = False) -> List[Tuple[str, Any]]:
    """A Keras model's (or layer's) variables as ``(name, variable)`` targets: its ``weights``
    by ``.path`` (a path several variables share, by each one's object path instead:
    ``layers/block_1/o_proj/kernel``), then, with ``optimizer``, its optimizer's ``variables`` (in the optimizer's own
    order), when it has one. An optimizer variable whose path another one has too (Adafactor
    names its factors after the model variable) is named ``<path>_<its index in the optimizer>``.

    Example:
        >>> [n for n, _ in keras_model_variables(model, optimizer=True)][-2:]   # doctest: +SKIP
        ['adam/dense_bias_momentum', 'adam/dense_bias_velocity']
    """
    pairs = _unique_paths([(v.path, v) for v in target.weights], target)
    opt = getattr(target, "optimizer", None) if optimizer else None
    if opt is not None and hasattr(opt, "variables"):
        seen = {id(v) for v in target.weights}
        own = [(i, v) for i, v in enumerate(opt.variables) if id(v) not in seen]
        counts: Dict[str, int] = {}
        for _, v in own:
            counts[v.path] = counts.get(v.path, 0) + 1
        taken = {n for n, _ in pairs} | set(counts)
        for i, v in own:
            name = v.path
            if counts[name] > 1:
                name = f"{v.path}_{i}"
                while name in taken:
                    name += "_"
                taken.add(name)
            pairs.append((name, v))
    return pairs


def _unique_paths(pairs: List[Tuple[str, Any]], model: Any) -> List[Tuple[str, Any]]:
    """The model's ``(path, variable)`` pairs, each variable whose ``.path`` another one shares
    (sublayers built outside their parent's name scope: ``o_proj/kernel`` in each of four layers)
    named by its object path instead: where Keras's own saving walk keys it (the weights-file
    entry ``layers/block_1/o_proj/vars/0``), without ``vars/N``, and its own name
    (``layers/block_1/o_proj/kernel``); unique, and stable from one build of the model to the next.
    A variable the walk does not reach keeps its path and gets ``_<its index in weights>``."""
    counts: Dict[str, int] = {}
    for name, _ in pairs:
        counts[name] = counts.get(name, 0) + 1
    if all(c == 1 for c in counts.values()):
        return pairs
    from .keraswalk import weights_file_keys

    where = {}
    for key, v in weights_file_keys(model).items():
        group = key.rsplit("/vars/", 1)[0]
        where.setdefault(id(v), (group, key))
    taken = {n for n, c in counts.items() if c == 1}
    out = []
    for i, (name, v) in enumerate(pairs):
        if counts[name] > 1:
            group, key = where.get(id(v), (None, None))
            leaf = str(getattr(v, "name", "") or "").rsplit("/", 1)[-1]
            options = [f"{group}/{leaf}", key] if group is not None and leaf else [key] if key else []
            name = next((o for o in options if o not in taken), f"{name}_{i}")
            while name in taken:
                name += "_"
        taken.add(name)
        out.append((name, v))
    return out


def _keras_native_set(target: Any, optimizer: bool) -> TargetSet:
    """Targets of a Keras 3 model on a backend other than TensorFlow: Keras variables, assigned
    through Keras's own API, named by ``variable.path`` as on TensorFlow (no TF import)."""
    if isinstance(target, dict):
        pairs = [(normalize_name(str(k)), v) for k, v in target.items()]
    elif isinstance(target, (list, tuple)):
        pairs = [(v.path, v) for v in target]
    else:
        pairs = keras_model_variables(target, optimizer)
    names = [n for n, _ in pairs]
    _raise_duplicates(names, "Give the layers unique names, or pass a dict {name: variable}.")
    groups = {}
    by_id: Dict[int, str] = {}
    for name, v in pairs:
        info = VariableInfo(name=name, shape=tuple(int(d) for d in v.shape), dtype=_dtype_name(v.dtype), key=name)
        groups[name] = TargetVariable(name, info, [(v, None)])
        by_id[id(v)] = name
    return TargetSet(variables={n: groups[n] for n in sorted(groups)}, mode="keras", by_id=by_id)


def _tf_variable(v: Any) -> Any:
    """The TF variable behind ``v`` (a Keras 3 variable wraps one in ``.value``)."""
    if is_keras_object(v):
        return v.value
    return v


def _is_sharded(v: Any) -> bool:
    """True for a TF2 ``ShardedVariable`` (ParameterServerStrategy with a variable partitioner)."""
    if "tensorflow" not in sys.modules:
        return False
    try:
        from tensorflow.python.distribute.sharded_variable import ShardedVariableMixin
    except ImportError:  # pragma: no cover - a TF without sharded variables
        return False
    return isinstance(v, ShardedVariableMixin)


def _sharded_name(v: Any) -> str:
    """A ShardedVariable's own name: its shards' common name without ``/part_N`` (TF names the
    shards ``emb/part_0``, ``emb/part_1``), else the container's (automatic) name."""
    bases = {_PART_SUFFIX.sub("", normalize_name(s.name)) for s in v.variables}
    return bases.pop() if len(bases) == 1 else normalize_name(v.name)


def _shard_specs(v: Any) -> List[Tuple[Any, str]]:
    """``(shard, slice spec)`` per shard, in TF's ``"full_shape slice"`` form: shards split axis 0."""
    full = [int(d) for d in v.shape]
    out = []
    for shard, offset in zip(v.variables, v._var_offsets):  # noqa: SLF001 - TF keeps offsets only here
        rows = int(shard.shape[0])
        rest = ":".join("-" for _ in full[1:])
        out.append((shard, " ".join(map(str, full)) + f" {int(offset[0])},{rows}" + (f":{rest}" if rest else "")))
    return out


def variable_name(v: Any, *, graph_mode: bool) -> str:
    """The default target name of one variable (no module context).

    Example:
        >>> import tensorflow as tf                                # doctest: +SKIP
        >>> variable_name(tf.Variable(1.0, name="w"), graph_mode=False)  # doctest: +SKIP
        'w'
    """
    if is_keras_object(v):
        return v.path
    if _is_sharded(v):
        return _sharded_name(v)
    if graph_mode:
        return normalize_name(v.op.name)
    return normalize_name(v.name)


def _info(name: str, v: Any, shape: Optional[Sequence[int]] = None) -> VariableInfo:
    shp = tuple(int(d) for d in (shape if shape is not None else v.shape))
    return VariableInfo(name=name, shape=shp, dtype=_dtype_name(v.dtype), key=name)


def _raise_duplicates(names: Sequence[str], hint: str) -> None:
    seen: Dict[str, int] = {}
    for n in names:
        seen[n] = seen.get(n, 0) + 1
    dups = sorted(n for n, c in seen.items() if c > 1)
    if dups:
        listed = ", ".join(f"{quote_name(d)} ({seen[d]}x)" for d in dups)
        raise PlanError(f"{len(dups)} target name(s) are used by more than one variable: {listed}. {hint}")


def _module_entries(module: Any) -> List[Tuple[str, Any]]:
    tf = import_tf()
    flat = list(module._flatten(with_path=True, predicate=lambda x: isinstance(x, tf.Variable) or _is_sharded(x)))
    entries: List[Tuple[str, Any]] = []
    seen_ids = {id(s) for _, v in flat if _is_sharded(v) for s in v.variables}  # shards belong to their container
    for path, v in flat:
        if id(v) in seen_ids:
            continue
        seen_ids.add(id(v))
        entries.append(("/".join(str(p) for p in path), v))
    own = [_sharded_name(v) if _is_sharded(v) else normalize_name(v.name) for _, v in entries]
    counts: Dict[str, int] = {}
    for n in own:
        counts[n] = counts.get(n, 0) + 1
    named = []
    for (path, v), n in zip(entries, own):
        explicit = not _AUTO_NAME.match(n.rsplit("/", 1)[-1]) and counts[n] == 1
        named.append((n if explicit else path, v))
    return named


def collect_targets(target: Any = None, *, optimizer: bool = False) -> TargetSet:
    """Name every target variable.

    Args:
        target: ``None`` (default graph's global variables), a list/tuple or dict of variables,
            a ``tf.Module`` or a Keras 3 model/layer.
        optimizer: for a Keras model, also its optimizer's variables (named by their ``.path``,
            e.g. ``adam/iteration``), for sources with ``optimizer=True``.

    Returns:
        A :class:`TargetSet`.

    Raises:
        PlanError: two variables would get the same name, or the target is empty.
        ArgumentTypeError: the target is of a kind ckptmerge does not know, or holds values that
            are not variables.

    Example:
        >>> ts = collect_targets({"c/x1": tf.Variable([1.0])})    # doctest: +SKIP
        >>> list(ts.variables)                                     # doctest: +SKIP
        ['c/x1']
    """
    backend = keras_backend(target)
    if backend is not None and backend != "tensorflow":
        return _keras_native_set(target, optimizer)  # JAX, PyTorch, NumPy backends: no TensorFlow
    tf = import_tf()
    graph_mode = not tf.executing_eagerly()
    graph = tf.compat.v1.get_default_graph() if graph_mode else None
    pairs: List[Tuple[str, Any]]
    hint = "Pass a dict {name: variable} to choose the names yourself."
    if target is None:
        if not graph_mode:
            raise CkptMergeError(
                "target=None means the default graph's global variables, which exist in graph mode "
                "only; in eager mode pass a Keras model, a tf.Module, or a list/dict of variables."
            )
        pairs = [(variable_name(v, graph_mode=True), v) for v in tf.compat.v1.global_variables()]
    elif isinstance(target, dict):
        _check_variables((f"target[{k!r}]", v) for k, v in target.items())
        pairs = [(normalize_name(str(k)), v) for k, v in target.items()]
    elif is_keras_object(target) and not isinstance(target, (list, tuple)):
        pairs = keras_model_variables(target, optimizer)
        hint = "Give the layers unique names, or pass a dict {name: variable}."
    elif isinstance(target, tf.Module):
        pairs = _module_entries(target)
    elif isinstance(target, (list, tuple)):
        _check_variables((f"target[{i}]", v) for i, v in enumerate(target))
        pairs = [(variable_name(v, graph_mode=graph_mode), v) for v in target]
    else:
        raise ArgumentTypeError(
            f"Cannot restore into a target of type {type(target).__name__}. Expected None (graph "
            "mode), a list or dict of variables, a tf.Module or a Keras model. "
            f"Received: target={target!r:.80}"
        )
    return _build_set(pairs, graph_mode, graph, hint)


def _check_variables(items: Iterable[Tuple[str, Any]]) -> None:
    """Refuse values that are not variables (arrays, tensors, numbers) in a list or dict target."""
    for where, v in items:
        if not (is_keras_object(v) or hasattr(_tf_variable(v), "assign")):
            raise ArgumentTypeError(
                f"{where} is a {type(v).__module__}.{type(v).__qualname__}, not a variable: a target holds "
                "the variables to restore into (tf.Variable, Keras variables). To restore from arrays, "
                f"make them a source: ckptmerge.Source.from_values({{name: array}}). {received(where, v)}")


def _build_set(pairs: List[Tuple[str, Any]], graph_mode: bool, graph: Any, hint: str) -> TargetSet:
    groups: Dict[str, TargetVariable] = {}
    names: List[str] = []
    by_id: Dict[int, str] = {}
    for name, v in pairs:
        if _is_sharded(v):  # one target, assigned shard by shard (each a slice of the whole)
            groups[name] = TargetVariable(name, _info(name, v), _shard_specs(v))
            names.append(name)
            by_id[id(v)] = name
            for shard, _ in groups[name].parts:
                by_id[id(shard)] = name
            continue
        tfv = _tf_variable(v)
        ssi = getattr(tfv, "_save_slice_info", None)
        if ssi is not None and not is_keras_object(v):
            full = normalize_name(ssi.full_name)
            spec = ssi.spec
            if full not in groups:
                groups[full] = TargetVariable(full, _info(full, tfv, ssi.full_shape))
                names.append(full)
            groups[full].parts.append((tfv, spec))
            by_id[id(tfv)] = full
            continue
        names.append(name)
        groups.setdefault(name, TargetVariable(name, _info(name, tfv), [(tfv, None)]))
        by_id[id(v)] = name
        by_id[id(tfv)] = name
    _raise_duplicates(names, hint)
    ordered = {n: groups[n] for n in sorted(groups)}
    return TargetSet(variables=ordered, mode="graph" if graph_mode else "eager", graph=graph, by_id=by_id)


def creation_order(target: Any, targets: TargetSet) -> Optional[List[str]]:
    """Target names in the order their variables were created, where that order is known.

    A Keras model's ``weights`` and a graph's global variables come in creation order (evidence
    for structural alignment); dicts, modules and spec lists have no such order (``None``).

    Example:
        >>> creation_order(model, collect_targets(model))[:2]      # doctest: +SKIP
        ['sequential/dense/kernel', 'sequential/dense/bias']
    """
    if targets.mode == "specs" or isinstance(target, dict):
        return None
    if target is None and targets.mode == "graph":
        variables = import_tf().compat.v1.global_variables()
    elif is_keras_object(target) and not isinstance(target, (list, tuple)):
        variables = list(target.weights)
    else:
        return None
    names = [targets.name_of(v) for v in variables]
    return list(dict.fromkeys(n for n in names if n is not None))


def input_layers(target: Any, targets: TargetSet) -> Optional[Dict[str, Tuple[str, ...]]]:
    """Per target variable of a functional Keras model: the variables of the one layer with
    weights that feeds its layer (through layers without weights: activations, padding, pooling),
    where exactly one does; ``None`` for targets without such a graph.

    The graph is evidence for structural alignment: a ``BatchNormalization`` fed by
    ``conv2d_17`` belongs beside the module that feeds ``conv2d_17`` in the checkpoint
    (``layer4.0.downsample.0`` -> ``layer4.0.downsample.1``). Read from Keras 3's own graph
    records (each layer's inbound nodes, as ``Functional.get_config`` reads them); a model without
    them (subclassed, not yet called) gives ``None``.

    Example:
        >>> input_layers(model, collect_targets(model))["batch_normalization/gamma"]  # doctest: +SKIP
        ('conv2d/kernel',)
    """
    if targets.mode == "specs" or not is_keras_object(target) or isinstance(target, (list, tuple, dict)):
        return None
    layers = getattr(target, "layers", None)
    if not layers:
        return None

    def names(layer: Any) -> Tuple[str, ...]:
        return tuple(n for n in (targets.name_of(v) for v in layer.weights) if n is not None)

    def feeding(layer: Any) -> set:
        """The layers with weights nearest above ``layer`` in the graph (ids -> layers)."""
        found: Dict[int, Any] = {}
        todo = [p for node in getattr(layer, "_inbound_nodes", ()) for p in _parents(node)]
        seen = set()
        while todo and len(seen) < 10_000:
            op = todo.pop()
            if id(op) in seen:
                continue
            seen.add(id(op))
            if getattr(op, "weights", None):
                found[id(op)] = op
            else:
                todo += [p for node in getattr(op, "_inbound_nodes", ()) for p in _parents(node)]
        return set(found.values())

    out: Dict[str, Tuple[str, ...]] = {}
    try:
        for layer in layers:
            if not getattr(layer, "weights", None):
                continue
            above = feeding(layer)
            if len(above) != 1:
                continue
            anchor = names(next(iter(above)))
            if anchor:
                for n in names(layer):
                    out[n] = anchor
    except Exception:  # noqa: BLE001 - a graph Keras does not record as usual is no evidence
        return None
    return out or None


def _parents(node: Any) -> List[Any]:
    """The operations whose outputs a Keras graph node consumes."""
    return [p.operation for p in getattr(node, "parent_nodes", ()) if getattr(p, "operation", None) is not None]
