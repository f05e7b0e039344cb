"""Which Keras 3 weights-file entry belongs to which variable of a model, as Keras decides it.

Keras 3 ``.weights.h5`` files (and the ``model.weights.h5`` inside a ``.keras`` archive) do not
store variable names: ``model.load_weights`` finds each layer's entries by walking the model
(``keras/src/saving/saving_lib.py``: ``_save_state``/``_load_state`` recurse through
``_walk_saveable``; layers in a list are keyed by their snake-case class name made unique per
list, ``dense``, ``dense_1``; other children by attribute name; each layer stores its variables
under ``vars/0``, ``vars/1``, ... in the order its ``save_own_variables`` writes them).
:func:`weights_file_keys` repeats that walk with Keras's own helpers, so a model gets exactly the
entries ``load_weights`` would give it, however its layers happen to be named. It uses Keras's private
``_walk_saveable`` and ``_get_unique_name``; verified against Keras 3.15.1 (docs/names.md).

This module imports Keras (lazily, through the target); the planner never sees it.
"""

from __future__ import annotations

import logging
import re
from typing import Any, Dict, List, Mapping, Optional, Sequence

from ..errors import CkptMergeError
from ..text import plural, quote_name

__all__ = ["weights_file_keys", "name_weights_files", "model_root"]

_log = logging.getLogger(__name__)


class _Recorder(dict):
    """The ``store`` a layer's ``save_own_variables`` writes into: keeps what, not values."""


def _keras_saving() -> Any:
    try:
        from keras.src.saving import saving_lib
        from keras.src.saving.keras_saveable import KerasSaveable
        from keras.src.utils import naming
    except ImportError as e:  # pragma: no cover - depends on the installed Keras
        raise CkptMergeError(
            "Naming Keras weights-file entries needs Keras 3's saving library "
            f"(keras.src.saving.saving_lib), which could not be imported ({e}). Install Keras 3 "
            "(pip install 'keras>=3'), or map the entries with Source(..., regex=[...]).") from None
    return saving_lib, KerasSaveable, naming


def _own_variables(saveable: Any) -> List[Any]:
    """The variables a saveable's entries stand for, by position (for values that are copies)."""
    own = getattr(saveable, "_trainable_variables", None)
    if own is not None:
        return list(own) + list(getattr(saveable, "_non_trainable_variables", []))
    return list(getattr(saveable, "variables", []))


def weights_file_keys(model: Any, *, optimizer: bool = False) -> Dict[str, Any]:
    """``{weights-file key: variable}`` for a Keras 3 model, walked as ``load_weights`` walks it.

    Args:
        model: a built Keras 3 model or layer.
        optimizer: also walk ``model.optimizer`` (its entries are ``optimizer/vars/<i>``).

    Returns:
        Keys such as ``layers/sequential/layers/dense/vars/0`` mapped to the Keras variable
        whose value that entry holds (metrics and other stateful children included; a caller
        keeps the ones that are its targets).

    Raises:
        CkptMergeError: Keras's saving library cannot be imported.

    Example:
        >>> m = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])  # doctest: +SKIP
        >>> sorted(k for k in weights_file_keys(m))                           # doctest: +SKIP
        ['layers/dense/vars/0', 'layers/dense/vars/1']
    """
    saving_lib, keras_saveable, naming = _keras_saving()
    out: Dict[str, Any] = {}
    visited = set()
    opt = getattr(model, "optimizer", None)
    if opt is not None and not optimizer:
        visited.add(id(opt))

    def join(path: str, child: str) -> str:
        return f"{path}/{child}" if path else child

    def state(saveable: Any, path: str) -> None:
        if id(saveable) in visited:
            return
        if hasattr(saveable, "save_own_variables"):
            store = _Recorder()
            try:
                saveable.save_own_variables(store)
            except Exception as e:  # a layer Keras could not save either; say so, go on
                _log.warning("ckptmerge: Keras layer %r cannot list its weights (%s)", path, e)
            own = _own_variables(saveable)
            for index, value in store.items():
                var = value
                if not hasattr(var, "assign"):  # a computed copy (optimizer, merged LoRA)
                    i = int(index) if str(index).isdigit() else -1
                    var = own[i] if 0 <= i < len(own) else None
                if var is not None:
                    out[join(join(path, "vars"), str(index))] = var
        visited.add(id(saveable))
        for attr, child in saving_lib._walk_saveable(saveable):
            if isinstance(child, keras_saveable):
                state(child, join(path, attr))
            elif isinstance(child, (list, dict, tuple)):
                container(child, join(path, attr), set())

    def container(items: Any, path: str, seen: set) -> None:
        if id(items) in seen:
            return
        seen.add(id(items))
        used: Dict[str, int] = {}
        for item in (list(items.values()) if isinstance(items, dict) else items):
            if isinstance(item, keras_saveable):
                name = saving_lib._get_unique_name(naming.to_snake_case(type(item).__name__), used)
                state(item, join(path, name))
            elif isinstance(item, (list, dict, tuple)):
                container(item, join(path, saving_lib._get_unique_name("container", used)), seen)

    state(model, "")
    return out


_KERAS3_KEY = re.compile(r"(^|/)vars/\d+$")


def model_root(model: Any, target_names: Sequence[str]) -> str:
    """The model's own name when every target name starts with it (a ``Sequential``), else ``""``.

    Example:
        >>> model_root(keras.Sequential(name="seq"), ["seq/dense/kernel"])  # doctest: +SKIP
        'seq'
    """
    name = getattr(model, "name", None)
    if isinstance(name, str) and name and target_names and all(
            n.startswith(name + "/") for n in target_names):
        return name
    return ""


def _layer_of(key: str) -> str:
    return key.rpartition("/vars/")[0] if "/vars/" in key else ""


def name_weights_files(model: Any, targets: Any, handles: Sequence[Any]) -> None:
    """Name the entries of every Keras 3 weights-file source as ``model.load_weights`` would.

    Each entry the model's walk reaches gets its target's name (the raw key stays beside it in
    reports); entries of a source without ``map``/``regex`` that do not line up with the model
    (layers the model lacks, or the file lacks) become structure findings.

    Args:
        model: the Keras target.
        targets: its :class:`~ckptmerge.restoring.targets.TargetSet`.
        handles: the opened sources; only Keras 3 weights files (and ``.keras`` archives) change.

    Example:
        >>> name_weights_files(model, collect_targets(model), handles)   # doctest: +SKIP
    """
    walk: Optional[Dict[str, str]] = None
    for h in handles:
        if h.format != "keras-h5":
            continue
        keys = {v.raw_key: v for v in h.all_variables}
        if not any(_KERAS3_KEY.search(k) for k in keys):
            continue  # Keras 2 / legacy h5: named by layer and weight name already
        if walk is None:
            walk = {}
            for key, var in weights_file_keys(model).items():
                name = targets.name_of(var)
                if name is not None:
                    walk[key] = name
        names = {k: n for k, n in walk.items() if k in keys}
        h.rename(names, {n: f"h5 {quote_name(k)}" for k, n in names.items()})
        if h.source.map is None and h.source.regex is None:
            h.findings.extend(_structure(walk, keys))


def _structure(walk: Mapping[str, str], keys: Mapping[str, Any]) -> List[str]:
    """Where a weights file and the model's walk differ, one line per layer."""
    extra: Dict[str, List[str]] = {}
    for k, v in keys.items():
        if k not in walk and v.kind == "variable" and _KERAS3_KEY.search(k):
            extra.setdefault(_layer_of(k), []).append(k)
    absent: Dict[str, List[str]] = {}
    for k, name in walk.items():
        if k not in keys:
            absent.setdefault(_layer_of(k), []).append(name)
    lines = []
    for layer, ks in sorted(extra.items()):
        lines.append(f"the file's {quote_name(layer or 'root')} holds {plural(len(ks), 'entry', 'entries')} "
                     f"({', '.join(map(quote_name, sorted(ks)[:3]))}{', ...' if len(ks) > 3 else ''}) that the model's "
                     "own walk (as Keras's load_weights) does not reach: the file was saved from "
                     "another architecture")
    for layer, ns in sorted(absent.items()):
        lines.append(f"the model's layer at {quote_name(layer or 'root')} ({', '.join(map(quote_name, sorted(ns)[:3]))}"
                     f"{', ...' if len(ns) > 3 else ''}) has no entries in the file")
    return lines
