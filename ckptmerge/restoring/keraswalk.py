"""Which Keras 3 weights-file entry feeds which variable of a model, as ``load_weights`` decides it.

Keras 3 ``.weights.h5`` files (and the ``model.weights.h5`` inside a ``.keras`` archive) store no
variable names: ``model.load_weights`` finds each object's entries by walking the model
(``keras/src/saving/saving_lib.py``: ``_load_state`` and ``_load_container_state`` recurse
through ``_walk_saveable``). Attributes are visited in sorted order (private ones last), the
layers of a ``Sequential``/``Functional`` model first; the items of a list, tuple or dict are
keyed by their snake-case class name made unique per container (``dense``, ``dense_1``), nested
containers ``container``, ``container_1``; each object stores its variables under ``vars/0``,
``vars/1``, ... in the order its ``save_own_variables`` writes them.

The walk depends on the file: an object reached by one path whose entries do not fit (no entries
there, another count, another shape) is not marked visited, so Keras tries it again where the walk
reaches it next (a layer kept under an attribute and also returned by a property, as
``saving_lib_test``'s redefinition of a trackable) and forgets the failure once it loads.
:func:`load_walk` repeats that walk against a file's entries (names and shapes, no values) and
says, as ``load_weights`` would, which path each object loads from, which objects fail (with
Keras's own message), which optimizer Keras would skip with a warning, and which nested containers
it would skip. :class:`KerasTree` records the model once (each object's stored entries and its
children in ``_walk_saveable``'s order) so that several files cost one walk of the model.

The children are listed as ``_walk_saveable`` lists them, with Keras's own ``get_attr_skipset``
and ``_name_key``; the skip set is computed once per object type and process (Keras recomputes
it, building a reference ``Layer``, for every object it visits). Containers nested in containers
are walked as the installed Keras walks them (descended into since Keras 3.15, skipped before).
Verified against Keras 3.15.1, 3.12.4, 3.9.2 and 3.5.0 (docs/names.md, ``scripts/keras_parity.py``).

This module imports Keras (lazily, through the target); the planner never sees it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence, Set, Tuple

from ..core.errors import CkptMergeError
from ..formats.keras.names import layer_of
from ..core.redact import get_logger

__all__ = ["KerasTree", "Saveable", "FileEntries", "LoadWalk", "load_walk", "weights_file_keys",
           "keras_saving", "unique_name"]

_log = get_logger(__name__)


def keras_saving() -> Any:
    """Keras's ``saving_lib`` module, or a clear error saying how to install Keras 3."""
    try:
        from keras.src.saving import saving_lib
    except ImportError as e:  # pragma: no cover - depends on the installed Keras
        raise CkptMergeError(
            "Naming Keras weights-file entries needs Keras 3's saving library "
            f"(keras.src.saving.saving_lib), which could not be imported ({e}). Install Keras 3 "
            "(pip install 'keras>=3'), or map the entries with Source(..., regex=[...]).") from None
    return saving_lib


def join(path: str, child: str) -> str:
    """``path/child`` (``child`` at the root)."""
    return f"{path}/{child}" if path else child


#: ``get_attr_skipset`` per (Keras function, object type): what the walk leaves out depends only on
#: Keras's own classes, so it is computed once per process (Keras itself recomputes it, building a
#: reference ``Layer`` or ``Optimizer``, for every object it visits).
_SKIPSETS: Dict[Tuple[int, str], frozenset] = {}


def unique_name(name: str, used: Dict[str, int]) -> str:
    """Keras's rule for the keys of a container's items: ``dense``, ``dense_1``, ``dense_2``, ...
    (``saving_lib._get_unique_name``; older Keras releases wrote the same rule inline).

    Example:
        >>> used = {}
        >>> [unique_name("dense", used) for _ in range(3)]
        ['dense', 'dense_1', 'dense_2']
    """
    if name in used:
        used[name] += 1
        return f"{name}_{used[name]}"
    used[name] = 0
    return name


class _Recorder(dict):
    """The ``store`` a ``save_own_variables`` writes into: keeps what it was given, in order."""


@dataclass
class Saveable:
    """One object of a model's walk that stores entries of its own (a layer, an optimizer).

    Attributes:
        obj: the Keras object.
        name: its ``name`` (Keras's messages use it).
        kind: ``"layer"`` or ``"optimizer"``.
        keys: the store keys ``save_own_variables`` writes, in order (``"0"``, ``"1"``, ...).
        variables: key -> the variable that entry restores (``None`` for state that is not a
            variable: a value computed at saving time that ckptmerge cannot assign back).
        shapes: key -> the shape stored.
        expected: the variable names Keras's count check expects (``None``: no count check,
            e.g. a LoRA-enabled layer, or a layer with its own ``load_own_variables``).
        built: whether the layer is built (Keras words an unbuilt layer's failure differently).
        resets: variables ``load_own_variables`` sets to zeros (a LoRA layer's factors).
    """

    obj: Any
    name: str
    kind: str
    keys: Tuple[str, ...]
    variables: Dict[str, Any]
    shapes: Dict[str, Tuple[int, ...]]
    expected: Optional[Tuple[str, ...]]
    built: bool = True
    resets: Tuple[Any, ...] = ()

    def problem(self, stored: Mapping[str, Tuple[int, ...]]) -> Tuple[Optional[str], bool]:
        """``(message, fatal)`` of loading ``stored`` (key -> shape) into this object as Keras
        does; ``(None, False)`` when it loads. An optimizer whose count differs is skipped with
        a warning (not fatal); every other problem raises in Keras (fatal)."""
        if self.kind == "optimizer":
            if len(stored) != len(self.keys):
                msg = (f"Skipping variable loading for optimizer '{self.name}', because it has "
                       f"{len(self.keys)} variables whereas the saved optimizer has {len(stored)} "
                       "variables. ")
                if len(self.keys) <= 2 and not getattr(self.obj, "built", True):
                    msg += "This is likely because the optimizer has not been called/built yet."
                return msg.strip(), False
        elif self.expected is not None and len(stored) != len(self.expected):
            if not self.expected and not self.built:
                return (f"Layer '{self.name}' was never built and thus it doesn't have any variables. "
                        f"However the weights file lists {len(stored)} variables for this layer."), True
            return (f"Layer '{self.name}' expected {len(self.expected)} variables, but received "
                    f"{len(stored)} variables during loading. Expected: {list(self.expected)}"), True
        for key in self.keys:
            if key not in stored:
                return (f"Layer '{self.name}' stores entry {key!r}, which the weights file does not "
                        f"hold (it holds {sorted(stored)})"), True
            got, want = tuple(stored[key]), self.shapes[key]
            if got != want:
                var = self.variables.get(key)
                what = f"<Variable path={getattr(var, 'path', '?')}, shape={want}>" if var is not None else "?"
                return ("The shape of the target variable and the shape of the target value in "
                        f"`variable.assign(value)` must match. variable.shape={want}, Received: "
                        f"value.shape={got}. Target variable: {what}"), True
        return None, False


    def assigned_before(self, stored: Mapping[str, Tuple[int, ...]]) -> int:
        """How many entries Keras assigns before a fatal :meth:`problem` stops it (it assigns in
        order, so a layer whose second entry mismatches is left half loaded)."""
        if self.expected is not None and len(stored) != len(self.expected):
            return 0
        for i, key in enumerate(self.keys):
            if key not in stored or tuple(stored[key]) != self.shapes[key]:
                return i
        return len(self.keys)


def _shape(value: Any) -> Tuple[int, ...]:
    return tuple(int(d) for d in getattr(value, "shape", ()))


class KerasTree:
    """A Keras model's walk, recorded once: each object's own entries and its children.

    Args:
        model: a Keras 3 model or layer.

    Example:
        >>> tree = KerasTree(model)                                   # doctest: +SKIP
        >>> [attr for attr, _ in tree.children(model)][:1]           # doctest: +SKIP
        ['layers']
    """

    def __init__(self, model: Any) -> None:
        self.model = model
        self._saving = keras_saving()
        from keras.src.saving.keras_saveable import KerasSaveable
        from keras.src.utils import naming

        self.saveable_type = KerasSaveable
        self.snake = naming.to_snake_case
        self.unique_name = getattr(self._saving, "_get_unique_name", unique_name)  # dense, dense_1, ...
        # Keras 3.15 descends into containers nested in containers (keras PR 22362); older ones skip them
        self.nested = hasattr(self._saving, "_container_path_present")
        self._children: Dict[int, List[Tuple[str, Any]]] = {}
        self._records: Dict[int, Optional[Saveable]] = {}
        self._base_layer, self._base_optimizer = _base_classes()

    def children(self, obj: Any) -> List[Tuple[str, Any]]:
        """``(attribute, child)`` as ``_walk_saveable`` yields them (cached per object)."""
        key = id(obj)
        got = self._children.get(key)
        if got is None:
            got = self._children[key] = list(self._walk(obj))
        return got

    def _walk(self, obj: Any) -> Iterable[Tuple[str, Any]]:
        saving = self._saving
        skip_of = getattr(saving, "get_attr_skipset", None)
        name_key = getattr(saving, "_name_key", None)
        if skip_of is None or name_key is None:  # pragma: no cover - another Keras: its own walk
            yield from saving._walk_saveable(obj)
            return
        obj_type = obj._obj_type()
        skip = _SKIPSETS.get((id(skip_of), obj_type))
        if skip is None:  # (one per object type and Keras: the attributes of Keras's own base classes)
            skip = _SKIPSETS[(id(skip_of), obj_type)] = frozenset(skip_of(obj_type))
        if obj_type in ("Sequential", "Functional"):
            yield "layers", obj.layers
        for attr in sorted(dir(obj), key=name_key):
            if attr.startswith("__") or attr in skip:
                continue
            try:
                child = getattr(obj, attr)
            except Exception:  # as Keras: an attribute that raises is not walked
                continue
            yield attr, child

    def record(self, obj: Any) -> Optional[Saveable]:
        """What ``obj`` stores of its own (``None`` for an object without ``save_own_variables``)."""
        key = id(obj)
        if key not in self._records:
            self._records[key] = self._record(obj) if hasattr(obj, "save_own_variables") else None
        return self._records[key]

    def _record(self, obj: Any) -> Saveable:
        name = obj.name if isinstance(getattr(obj, "name", None), str) else type(obj).__name__
        cls = type(obj)
        if self._base_optimizer is not None and isinstance(obj, self._base_optimizer):
            variables = list(obj.variables)
            if cls.save_own_variables is self._base_optimizer.save_own_variables:  # no copies
                keys = tuple(str(i) for i in range(len(variables)))
                return Saveable(obj, name, "optimizer", keys, dict(zip(keys, variables)),
                                {k: _shape(v) for k, v in zip(keys, variables)}, None)
            return self._recorded(obj, name, "optimizer", variables, None)
        own = list(getattr(obj, "_trainable_variables", [])) + list(getattr(obj, "_non_trainable_variables", []))
        lora = bool(getattr(obj, "lora_enabled", False))
        expected = None if lora or not self._checks_count(cls) else tuple(v.name for v in own)
        built = bool(getattr(obj, "built", True))
        if self._base_layer is not None and cls.save_own_variables is self._base_layer.save_own_variables:
            keys = tuple(str(i) for i in range(len(own)))
            return Saveable(obj, name, "layer", keys, dict(zip(keys, own)), {k: _shape(v) for k, v in zip(keys, own)},
                            expected, built)
        rec = self._recorded(obj, name, "layer", own, expected)
        rec.built = built
        if lora:
            rec.resets = tuple(v for v in (getattr(obj, a, None) for a in _LORA_FACTORS) if hasattr(v, "assign"))
        return rec

    def _checks_count(self, cls: type) -> bool:
        """Whether the class's ``load_own_variables`` runs Keras's count check
        (``_check_load_own_variables``: ``Layer``, ``Dense``, ``EinsumDense``, ``Embedding``,
        convolutions, and every class whose override calls ``super()`` into one of them); a class
        that loads in its own way is judged by the entries it stores."""
        for c in cls.__mro__:
            fn = c.__dict__.get("load_own_variables")
            if fn is None:
                continue
            names = getattr(getattr(fn, "__code__", None), "co_names", ())
            if "_check_load_own_variables" in names or c is self._base_layer:  # (older Keras: inline)
                return True
            if "super" not in names:
                return False
        return False

    def _recorded(self, obj: Any, name: str, kind: str, own: Sequence[Any],
                  expected: Optional[Tuple[str, ...]]) -> Saveable:
        """A record made by running the object's own ``save_own_variables`` into a recorder."""
        store = _Recorder()
        try:
            obj.save_own_variables(store)
        except Exception as e:  # an object Keras could not save either; say so, go on
            _log.warning("ckptmerge: Keras %s %r cannot list its weights (%s)", kind, name, e)
        keys = tuple(str(k) for k in store)
        variables: Dict[str, Any] = {}
        shapes: Dict[str, Tuple[int, ...]] = {}
        for k, value in zip(keys, store.values()):
            shapes[k] = _shape(value)
            var = value if hasattr(value, "assign") else None
            if var is None and k.isdigit() and int(k) < len(own) and _shape(own[int(k)]) == shapes[k]:
                var = own[int(k)]  # a copy computed at saving time (a merged LoRA kernel): its variable
            variables[k] = var
        return Saveable(obj, name, kind, keys, variables, shapes, expected)


_LORA_FACTORS = ("lora_kernel_a", "lora_kernel_b", "lora_embeddings_a", "lora_embeddings_b")


def _base_classes() -> Tuple[Optional[type], Optional[type]]:
    try:
        from keras.src.layers.layer import Layer
        from keras.src.optimizers.base_optimizer import BaseOptimizer
    except ImportError:  # pragma: no cover - another Keras layout
        return None, None
    return Layer, BaseOptimizer


class FileEntries:
    """A Keras 3 weights file as ``load_weights`` sees it: entries by object path, with shapes.

    Args:
        shapes: ``{raw key: shape}`` of the file's datasets (``layers/dense/vars/0``).

    Example:
        >>> f = FileEntries({"layers/dense/vars/0": (3, 2), "layers/dense/vars/1": (2,)})
        >>> f.get("layers/dense"), f.has_path("layers"), f.has_path("layers/dense_1")
        ({'0': (3, 2), '1': (2,)}, True, False)
    """

    def __init__(self, shapes: Mapping[str, Tuple[int, ...]]) -> None:
        self.groups: Dict[str, Dict[str, Tuple[int, ...]]] = {}
        self.paths: Set[str] = set()
        for key, shape in shapes.items():
            head = layer_of(key)
            if head is None:
                continue
            self.groups.setdefault(head, {})[key.rpartition("/")[2]] = tuple(shape)
        for key in shapes:
            parts = key.split("/")
            for end in range(1, len(parts)):
                self.paths.add("/".join(parts[:end]))
        self._legacy = "_layer_checkpoint_dependencies" in self.paths

    def get(self, path: str) -> Tuple[str, Dict[str, Tuple[int, ...]]]:
        """``(group path, {key: shape})`` of the entries ``weights_store.get(path)`` returns
        (Keras 2.13 files keep layers under ``_layer_checkpoint_dependencies``)."""
        got = self.groups.get(path)
        if got is None and self._legacy and path:
            other = path.replace("layers", "_layer_checkpoint_dependencies")
            if other in self.groups:
                return other, self.groups[other]
        return path, got or {}

    def has_path(self, path: str) -> bool:
        """Whether the file has a group at ``path`` (``weights_store.has_path``)."""
        return path in self.paths


@dataclass
class LoadWalk:
    """What ``load_weights`` does with one file (see :func:`load_walk`).

    Attributes:
        loads: ``(group path, Saveable)`` in the order Keras loads them; an object loaded twice
            (its children failed the first time) appears twice, the later load winning.
        failures: ``(Saveable, path, Keras's message)`` of every object Keras would report as
            "could not be loaded" (``load_weights`` raises; ``skip_mismatch=True`` warns).
        skipped: optimizers Keras skips with a warning: ``(Saveable, path, message)``.
        nested: containers Keras skips with a warning (their group is not in the file):
            ``(path, [Saveable, ...])``.
        visits: every path each object was tried at, by ``id`` (for reports).
    """

    loads: List[Tuple[str, Saveable]] = field(default_factory=list)
    failures: List[Tuple[Saveable, str, str]] = field(default_factory=list)
    skipped: List[Tuple[Saveable, str, str]] = field(default_factory=list)
    nested: List[Tuple[str, List[Saveable]]] = field(default_factory=list)
    visits: Dict[int, List[str]] = field(default_factory=dict)


def load_walk(tree: KerasTree, file: FileEntries, *, skip: Iterable[Any] = (), saving: bool = False) -> LoadWalk:
    """Walk ``tree``'s model against ``file`` exactly as ``load_weights`` does.

    Args:
        tree: the model's :class:`KerasTree`.
        file: the weights file's entries.
        skip: objects not to walk (Keras's ``objects_to_skip``; ckptmerge passes the optimizer
            unless the source has ``optimizer=True``).
        saving: walk as ``save_weights`` does instead (``file`` unused): every object "loads"
            at the first path it is reached by, every container is walked.

    Returns:
        A :class:`LoadWalk`.

    Example:
        >>> walk = load_walk(KerasTree(model), FileEntries(shapes))    # doctest: +SKIP
        >>> [path for path, _ in walk.loads]                             # doctest: +SKIP
        ['', 'layers/dense', 'layers/dense_1']
    """
    out = LoadWalk()
    visited: Set[int] = {id(o) for o in skip}
    main: Dict[int, Tuple[Saveable, str, str]] = {}
    saveable = tree.saveable_type

    def state(obj: Any, path: str, failed: Dict[int, Tuple[Saveable, str, str]]) -> None:
        if id(obj) in visited:
            return
        failure = False
        rec = tree.record(obj)
        if rec is not None:
            out.visits.setdefault(id(obj), []).append(path)
            group, stored = (path, {}) if saving else file.get(path)
            message, fatal = (None, False) if saving else rec.problem(stored)
            if message is None:
                out.loads.append((group, rec))
            elif fatal:
                failed[id(obj)] = (rec, path, message)
                failure = True
            else:
                out.skipped.append((rec, path, message))
        before = len(failed)
        for attr, child in tree.children(obj):
            if isinstance(child, saveable):
                state(child, join(path, attr), failed)
            elif isinstance(child, (list, dict, tuple)):
                container(child, join(path, attr), failed, set())
        if not failure:
            if len(failed) - before <= 0:
                visited.add(id(obj))
            failed.pop(id(obj), None)

    def container(items: Any, path: str, failed: Dict[int, Tuple[Saveable, str, str]], seen: Set[int]) -> None:
        if id(items) in seen:
            return
        seen.add(id(items))
        used: Dict[str, int] = {}
        unique = tree.unique_name
        for item in (list(items.values()) if isinstance(items, dict) else items):
            if isinstance(item, saveable):
                state(item, join(path, unique(tree.snake(type(item).__name__), used)), failed)
            elif isinstance(item, (list, dict, tuple)) and tree.nested:
                nested = join(path, unique("container", used))
                if not saving and not file.has_path(nested):  # Keras: tried leniently, warned, skipped
                    tracked: Dict[int, Tuple[Saveable, str, str]] = {}
                    container(item, nested, tracked, seen)
                    if tracked:
                        out.nested.append((nested, [r for r, _, _ in tracked.values()]))
                    continue
                container(item, nested, failed, seen)

    state(tree.model, "", main)
    out.failures = list(main.values())
    return out


def weights_file_keys(model: Any, *, optimizer: bool = False) -> Dict[str, Any]:
    """``{weights-file key: variable}`` for a Keras 3 model, as ``save_weights`` writes them.

    Args:
        model: a built Keras 3 model or layer.
        optimizer: also walk ``model.optimizer`` (its entries are ``optimizer/vars/<i>``).

    Returns:
        Keys such as ``layers/sequential/layers/dense/vars/0`` mapped to the Keras variable
        whose value that entry holds (each object at the first path the walk reaches it by).

    Raises:
        CkptMergeError: Keras's saving library cannot be imported.

    Example:
        >>> m = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])  # doctest: +SKIP
        >>> sorted(k for k in weights_file_keys(m))                           # doctest: +SKIP
        ['layers/dense/vars/0', 'layers/dense/vars/1']
    """
    opt = getattr(model, "optimizer", None)
    walk = load_walk(KerasTree(model), FileEntries({}), skip=[opt] if opt is not None and not optimizer else [],
                     saving=True)
    return {join(join(group, "vars"), key): rec.variables[key]
            for group, rec in walk.loads for key in rec.keys if rec.variables.get(key) is not None}
