"""Name the entries of Keras weights-file sources as ``model.load_weights`` would, for a Keras target.

A Keras 3 ``.weights.h5`` (or ``.keras``) source is walked against the model by
:func:`~ckptmerge.restoring.keraswalk.load_walk`: every entry an object loads from gets the target
name of the variable it restores (the raw key stays beside it in reports), and everything
``load_weights`` would not do quietly becomes a structure finding of the source, never a silent
partial restore:

- an object Keras reports as "could not be loaded" (no entries at its path, another count,
  another shape), with Keras's own message;
- an optimizer Keras would skip with a warning (not built, or built for other variables), and
  optimizer state in the file when the model has no optimizer (``optimizer=True``);
- a nested container Keras would skip with a warning;
- entries no object of the model reaches (Keras ignores them without a word).

Each finding carries the targets it leaves unrestored (an ``allow_missing`` that covers all of
them, or another source that provides them, settles it) or the entries it leaves unused (rules
that drop all of them settle it). A LoRA-enabled layer's factors are restored as zeros, as
``load_weights`` resets them (the file holds the merged kernel). An entry that a later load
overwrites (a ``LossScaleOptimizer`` saves its inner optimizer's variables twice) is left out:
the later one restores the variable, as in Keras.

This module imports Keras (lazily, through the target); the planner never sees it.
"""

from __future__ import annotations

import re
from typing import Any, Dict, List, Optional, Sequence, Set, Tuple

import numpy as np

from ..alignment.keraspaths import LayerEntries, align_paths
from ..planning.casts import numpy_dtype
from ..planning.kerascompat import KerasVerdict
from ..core.specs import KIND_OPTIMIZER, KIND_VARIABLE
from ..core.text import plural, quote_name
from ..formats.keras.names import layer_of
from .keraswalk import FileEntries, KerasTree, Saveable, join, load_walk

__all__ = ["name_weights_files", "model_root", "legacy_problem"]

_KERAS3_KEY = re.compile(r"(^|/)vars/\d+$")
_UNBUILT = ("the model is not built ({name!r} has no variables yet), so nothing can be restored into it; "
            "load_weights refuses it too ('You are loading weights into a model that has not yet been "
            "built'). Build it first: call it on a batch of data, or model.build(input_shape)")
_KERAS_UNBUILT = ("You are loading weights into a model that has not yet been built. Try building the model "
                  "first by calling it on some data or by using `build()`.")
_ZEROS_NOTE = "zeros: load_weights resets a LoRA layer's factors (the file holds the merged kernel)"


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


def _listed(names: Sequence[str], limit: int = 3) -> str:
    shown = ", ".join(map(quote_name, sorted(names)[:limit]))
    return shown + (", ..." if len(names) > limit else "")


class _Findings:
    """The findings of one source, each with the targets or names that settle it."""

    def __init__(self, handle: Any) -> None:
        self.handle = handle

    def add(self, text: str, *, targets: Sequence[str] = (), names: Sequence[str] = ()) -> None:
        h = self.handle
        h.findings.append(text)
        if targets:
            h.finding_targets[text] = tuple(sorted(set(targets)))
        if names:
            h.finding_names[text] = tuple(sorted(set(names)))


def name_weights_files(model: Any, targets: Any, handles: Sequence[Any]) -> None:
    """Name the entries of every Keras 3 weights-file source as ``model.load_weights`` would.

    Args:
        model: the Keras target.
        targets: its :class:`~ckptmerge.restoring.targets.TargetSet` (optimizer variables
            included when a source has ``optimizer=True``).
        handles: the opened sources; only Keras 3 weights files (and ``.keras`` archives) change.

    Example:
        >>> name_weights_files(model, collect_targets(model), handles)   # doctest: +SKIP
    """
    tree: Optional[KerasTree] = None
    for h in handles:
        if h.format != "keras-h5":
            continue
        reader = getattr(h, "reader", None)  # (a combination of Keras files has none of its own)
        if not getattr(model, "built", True):
            _Findings(h).add(_UNBUILT.format(name=getattr(model, "name", "?")))
            h.keras = KerasVerdict((("", str(getattr(model, "name", "model")), _KERAS_UNBUILT),))
            continue
        keys = {v.raw_key: v for v in h.all_variables}
        layout = getattr(reader, "legacy", None)
        if layout is not None:  # Keras 2 / legacy h5: by topology where load_weights would load it
            h.keras = _legacy_verdict(model, layout, keys)
            if h.source.map is None and h.source.regex is None:
                _name_legacy(model, targets, h, layout)
            continue
        if not any(_KERAS3_KEY.search(k) for k in keys):
            continue
        if tree is None:
            tree = KerasTree(model)
        _name_one(model, tree, targets, h, keys)


def _legacy_weights(layer: Any) -> List[Any]:
    """A layer's weights in the legacy format's order (Keras's ``_legacy_weights``)."""
    return list(layer.trainable_weights) + list(layer.non_trainable_weights)


def legacy_problem(model: Any, layout: Any) -> Optional[str]:
    """Keras's own error when ``load_weights`` (by topology) refuses a legacy file for ``model``,
    else ``None``.

    Example:
        >>> legacy_problem(model, reader.legacy)                   # doctest: +SKIP
        'Layer count mismatch when loading weights from file. Model expected 3 layers, found 2 saved layers.'
    """
    filtered = [layer for layer in model.layers if _legacy_weights(layer)]
    saved = [(name, keys) for name, keys in layout.layers if keys]
    if len(filtered) != len(saved):
        return ("Layer count mismatch when loading weights from file. Model expected "
                f"{len(filtered)} layers, found {len(saved)} saved layers.")
    for k, (layer, (name, keys)) in enumerate(zip(filtered, saved)):
        n = len(_legacy_weights(layer))
        if n != len(keys):
            return (f"Weight count mismatch for layer #{k} (named {layer.name} in the current model, {name} "
                    f"in the save file). Layer expects {n} weight(s). Received {len(keys)} saved weight(s)")
    top = _top_weights(model)
    if layout.has_top and len(top) != len(layout.top):
        return ("Weight count mismatch for top-level weights when loading weights from file. Model expects "
                f"{len(top)} top-level weight(s). Received {len(layout.top)} saved top-level weight(s)")
    return None


def _legacy_verdict(model: Any, layout: Any, keys: Dict[str, Any]) -> KerasVerdict:
    """What ``load_weights`` (by topology) does with a legacy file: its first error, or a load
    (``skip_mismatch=True`` skips mismatched shapes weight by weight)."""
    problem = legacy_problem(model, layout)
    if problem is not None:
        return KerasVerdict((("", str(model.name), problem),), legacy=True)
    filtered = [layer for layer in model.layers if _legacy_weights(layer)]
    saved = [(name, ks) for name, ks in layout.layers if ks]
    first = None
    skipped: List[str] = []
    pairs = [(k, layer, key, var) for k, (layer, (_, ks)) in enumerate(zip(filtered, saved))
             for key, var in zip(ks, _legacy_weights(layer))]
    for k, layer, key, var in pairs:
        want, got = tuple(int(d) for d in var.shape), tuple(keys[key].shape)
        if want != got:
            skipped.append(var.path)
            if first is None:
                first = (layer.name, layer.name, f"Shape mismatch in layer #{k} (named {layer.name})for weight "
                                                  f"{var.path}. Weight expects shape {want}. Received saved weight "
                                                  f"with shape {got}")
    if first is not None:
        return KerasVerdict((first,), tuple(skipped), legacy=True)
    return KerasVerdict(loaded=len(filtered), legacy=True)


def _top_weights(model: Any) -> List[Any]:
    ids = {id(v) for v in model.weights}
    own = list(getattr(model, "_trainable_variables", [])) + list(getattr(model, "_non_trainable_variables", []))
    return [v for v in own if id(v) in ids]


def _name_legacy(model: Any, targets: Any, h: Any, layout: Any) -> None:
    """Name a legacy file's weights by topology (``load_weights``'s default: the model's layers
    with weights, in order, against the file's), when Keras would accept the file and no
    explicitly named layer of the model would take another one's weights; else the weights keep
    their own names (matched by name, as ``load_weights(by_name=True)``)."""
    if legacy_problem(model, layout) is not None or not hasattr(model, "layers"):
        return
    filtered = [layer for layer in model.layers if _legacy_weights(layer)]
    saved = [(name, keys) for name, keys in layout.layers if keys]
    mine = {layer.name for layer in filtered}
    auto = {_snake(type(layer).__name__) for layer in model.layers}
    for layer, (name, _) in zip(filtered, saved):
        if name != layer.name and name in mine and not _auto_name(name, auto):
            return  # 'head' would load into 'encoder' while the model has its own 'head': by name
    names: Dict[str, str] = {}
    pairs = [(k, v) for layer, (_, keys) in zip(filtered, saved) for k, v in zip(keys, _legacy_weights(layer))]
    pairs += list(zip(layout.top, _top_weights(model)))
    for key, var in pairs:
        target = targets.name_of(var)
        if target is not None:
            names[key] = target
    h.rename(names, {n: f"h5 {quote_name(k)}" for k, n in names.items()})


def _snake(name: str) -> str:
    from .keraswalk import keras_saving

    keras_saving()
    from keras.src.utils import naming

    return str(naming.to_snake_case(name))


def _auto_name(name: str, bases: Set[str]) -> bool:
    """Whether ``name`` is a Keras auto-name (``dense``, ``dense_3``) of one of the classes."""
    base = re.sub(r"_\d+$", "", name)
    return name in bases or base in bases


def _name_one(model: Any, tree: KerasTree, targets: Any, h: Any, keys: Dict[str, Any]) -> None:
    optimizer = getattr(model, "optimizer", None)
    with_optimizer = h.source.optimizer
    skip = [optimizer] if optimizer is not None and not with_optimizer else []
    file = FileEntries({k: v.shape for k, v in keys.items()})
    walk = load_walk(tree, file, skip=skip)
    h.keras = _verdict(walk if not skip else load_walk(tree, file), file, keys)  # Keras walks the optimizer
    loads = list(walk.loads)
    loaded = {id(rec.obj) for _, rec in loads}
    failures = list(walk.failures)
    nested = [(path, [r for r in recs if id(r.obj) not in loaded]) for path, recs in walk.nested]
    nested = [(path, recs) for path, recs in nested if recs]
    shapes_only = {id(rec.obj): g for rec, _, _ in failures for g in [_shapes_only(rec, walk, file)] if g is not None}
    if h.source.align == "structure":  # path drift: pair what loads nothing, a layer at a time
        matched = _repair_paths(h, walk, file, keys, targets, loads, failures, nested)
        loads += matched
        done = {id(rec.obj) for _, rec in matched}
        taken = {group for group, _ in matched}
        failures = [f for f in failures if id(f[0].obj) not in done]
        nested = [(p, [r for r in recs if id(r.obj) not in done]) for p, recs in nested]
        nested = [(p, recs) for p, recs in nested if recs]
        shapes_only = {k: g for k, g in shapes_only.items() if g not in taken}
    for rec, _, _ in failures:  # every entry there, only shapes differ: named; Mismatched says which
        if id(rec.obj) in shapes_only:
            loads.append((shapes_only[id(rec.obj)], rec))
    failures = [f for f in failures if id(f[0].obj) not in shapes_only]
    # a layer placed above, or failed at its own path, is only retried in a nested container
    # (Keras's bookkeeping, e.g. a Functional's '_operations_by_depth'): never a finding of its own
    placed = {id(rec.obj) for _, rec in loads} | {id(rec.obj) for rec, _, _ in failures}
    nested = [(p, [r for r in recs if id(r.obj) not in placed]) for p, recs in nested]
    nested = [(p, recs) for p, recs in nested if recs]
    names: Dict[str, str] = {}  # raw key -> target
    owner: Dict[str, str] = {}  # target -> the raw key that restores it last
    zeros: Dict[str, Any] = {}  # target -> a LoRA factor load_weights resets
    tried: Set[str] = set()  # file groups some object loads from (or tries to)
    for group, rec in loads:
        tried.add(group)
        for key in rec.keys:
            var = rec.variables.get(key)
            target = targets.name_of(var) if var is not None else None
            if target is not None:
                raw = join(join(group, "vars"), key)
                names[raw] = target
                owner[target] = raw
        for var in rec.resets:
            target = targets.name_of(var)
            if target is not None:
                zeros[target] = var
    superseded = sorted(raw for raw, target in names.items() if owner[target] != raw)
    for raw in superseded:
        del names[raw]
    drift = {m.file: m.model for m in (h.drift.matches if h.drift is not None else ())}
    notes = {n: _note(k, drift) for k, n in names.items()}
    # every other entry keeps its raw key (a .keras archive's names could meet a target by accident)
    taken = set(names.values()) | {v.name for v in keys.values()}
    for raw, info in keys.items():
        if raw not in names and info.name != raw and layer_of(raw) is not None and raw not in taken:
            names[raw] = raw
    h.rename(names, notes)
    if zeros and hasattr(h, "supply"):  # (elsewhere the factors stay missing: a finding, never wrong)
        specs = {t: targets.variables[t].info for t in zeros}
        h.supply({t: np.zeros(s.shape, numpy_dtype(s.dtype)) for t, s in specs.items()},
                 {t: _ZEROS_NOTE for t in zeros})
    if superseded:
        h.supersede(superseded)
    if h.source.map is not None or h.source.regex is not None:
        return  # the user steers this source's names: what does not line up is theirs to map
    findings = _Findings(h)
    for rec, path, message in failures:
        group, stored = file.get(path)
        tried.add(group)
        mine = _targets_of(rec, targets)
        where = f"the model's layer at {quote_name(path or 'root')} ({_listed(mine)})"
        if not stored:
            findings.add(f"{where} has no entries in the file; load_weights would fail: {message}", targets=mine)
        else:
            findings.add(f"{where} does not fit the file's entries there; load_weights would fail: {message}",
                         targets=mine)
    for rec, path, message in walk.skipped:
        tried.add(file.get(path)[0])
        hint = ""
        if not getattr(rec.obj, "built", True):
            hint = " Build it first (model.optimizer.build(model.trainable_variables)), then restore."
        findings.add(f"the model's optimizer {quote_name(rec.name)} at {quote_name(path)} does not fit the file's "
                     f"optimizer state; load_weights would skip it with a warning: {message}{hint}",
                     targets=_targets_of(rec, targets))
    for path, recs in nested:
        mine = [t for rec in recs for t in _targets_of(rec, targets)]
        findings.add(f"the model's nested container at {quote_name(path)} ({_listed(mine)}) has no group in the "
                     "file; load_weights would skip it with a warning and leave its layers as they are",
                     targets=mine)
    _unreached(file, keys, names, superseded, tried, with_optimizer, optimizer, findings)


def _note(raw: str, drift: Dict[str, str]) -> str:
    """How an entry got its target's name, for the report."""
    group = layer_of(raw)
    if group is not None and group in drift:
        return (f"h5 {quote_name(raw)}; path drift (align='structure'): file layer {quote_name(group or 'root')} "
                f"as model layer {quote_name(drift[group] or 'root')}")
    return f"h5 {quote_name(raw)}"


def _repair_paths(h: Any, walk: Any, file: FileEntries, keys: Dict[str, Any], targets: Any,
                  loads: Sequence[Tuple[str, Saveable]], failures: Sequence[Tuple[Saveable, str, str]],
                  nested: Sequence[Tuple[str, Sequence[Saveable]]]) -> List[Tuple[str, Saveable]]:
    """Pair the model's layers that load nothing with the file's layers nothing loads
    (:func:`~ckptmerge.alignment.keraspaths.align_paths`); ``[(file group, Saveable)]`` of the
    pairs, and ``h.drift`` set to the whole alignment (pairs and what stays unresolved)."""
    candidates = [rec for rec, _, _ in failures] + [rec for _, recs in nested for rec in recs]
    model: Dict[str, Tuple[Saveable, Tuple[Tuple[str, Tuple[int, ...], str], ...]]] = {}
    for rec in candidates:
        entries = []
        for key in rec.keys:
            var = rec.variables.get(key)
            name = targets.name_of(var) if var is not None else None
            if name is None:
                break
            entries.append((key, rec.shapes[key], targets.variables[name].info.dtype))
        else:
            if entries:
                model[walk.visits[id(rec.obj)][0]] = (rec, tuple(entries))
    consumed = {group for group, _ in loads}
    groups: Dict[str, List[Tuple[str, Tuple[int, ...], str]]] = {}
    for raw, info in keys.items():
        group = layer_of(raw)
        if group is not None and group not in consumed and info.kind in (KIND_VARIABLE, KIND_OPTIMIZER):
            groups.setdefault(group, []).append((raw.rpartition("/")[2], tuple(info.shape), info.dtype))
    names = getattr(getattr(h, "reader", None), "layer_names", {})
    file_layers = [LayerEntries(g, names.get(g, ""), tuple(sorted(e, key=lambda x: (len(x[0]), x[0]))))
                   for g, e in sorted(groups.items())]
    model_layers = [LayerEntries(p, rec.name, entries) for p, (rec, entries) in sorted(model.items())]
    h.drift = align_paths(file_layers, model_layers)
    return [(m.file, model[m.model][0]) for m in h.drift.matches]


def _shapes_only(rec: Saveable, walk: Any, file: FileEntries) -> Optional[str]:
    """The one file group where a failed object finds exactly the entries it stores, only with
    other shapes (its entries then line up as Keras would assign them, and ``on_shape_mismatch``
    decides variable by variable); ``None`` when there is no such group, or several."""
    groups = {file.get(p)[0] for p in walk.visits.get(id(rec.obj), ()) if set(file.get(p)[1]) == set(rec.keys)}
    return groups.pop() if len(groups) == 1 and rec.keys else None


def _verdict(walk: Any, file: FileEntries, keys: Dict[str, Any]) -> KerasVerdict:
    """What ``load_weights`` does with the file, from its own walk (the optimizer included)."""
    failures, dropped, partial = [], [], []
    for rec, path, message in walk.failures:
        failures.append((path, rec.name, message))
        dropped.append(path)
        assigned = rec.assigned_before(file.get(path)[1])
        if assigned:
            partial.append((path, assigned, len(rec.keys)))
    warnings = [f"optimizer {quote_name(rec.name)} at {quote_name(path)}: {message}" for rec, path, message in walk.skipped]
    failed = {id(rec.obj) for rec, _, _ in walk.failures}
    # (a container where Keras only retries layers that failed at their own path, e.g. a
    # Functional's '_operations_by_depth', changes nothing: its bookkeeping, not the user's)
    warnings += [f"nested container {quote_name(path)} (no group in the file): its "
                 f"{plural(len(recs), 'layer')} keep their values" for path, recs in walk.nested
                 if not all(id(r.obj) in failed for r in recs)]
    tried = {file.get(path)[0] for visits in walk.visits.values() for path in visits}
    ignored = sorted(k for k in keys if layer_of(k) is not None and layer_of(k) not in tried)
    loaded = len({id(rec.obj) for _, rec in walk.loads if rec.keys})
    return KerasVerdict(tuple(failures), tuple(dropped), tuple(partial), tuple(warnings), tuple(ignored), loaded)


def _unreached(file: FileEntries, keys: Dict[str, Any], names: Dict[str, str], superseded: Sequence[str],
               tried: Set[str], with_optimizer: bool, optimizer: Any, findings: _Findings) -> None:
    """Findings for the file's entries no object of the model reaches (Keras ignores them)."""
    done = set(names) | set(superseded)
    extra: Dict[str, List[str]] = {}
    state: List[str] = []
    for raw, info in keys.items():
        head = layer_of(raw)
        if head is None or raw in done or head in tried:
            continue
        if info.kind == KIND_OPTIMIZER:
            if with_optimizer:
                state.append(raw)
        elif info.kind == KIND_VARIABLE:
            extra.setdefault(head, []).append(raw)
    for layer, ks in sorted(extra.items()):
        findings.add(f"the file's {quote_name(layer or 'root')} holds {plural(len(ks), 'entry', 'entries')} "
                     f"({_listed(ks)}) that the model's own walk (as Keras's load_weights) does not reach: "
                     "the file was saved from another architecture", names=ks)
    if state and optimizer is None:
        findings.add(f"the file holds optimizer state ({plural(len(state), 'entry', 'entries')} under 'optimizer/') "
                     "but the model has no optimizer: compile it (model.compile(optimizer=...)) and build the "
                     "optimizer (model.optimizer.build(model.trainable_variables)) before restoring, or drop "
                     "optimizer=True", names=state)
    elif state:
        groups = sorted({layer_of(k) or "" for k in state})
        findings.add(f"the file's optimizer state at {_listed(groups)} ({plural(len(state), 'entry', 'entries')}) "
                     "is not reached by the model's optimizer (another optimizer class?)", names=state)


def _targets_of(rec: Saveable, targets: Any) -> List[str]:
    """The target names of an object's stored variables and of the factors it resets."""
    out = []
    for var in list(rec.variables.values()) + list(rec.resets):
        name = targets.name_of(var) if var is not None else None
        if name is not None:
            out.append(name)
    return out



def weights_file_entries(model: Any) -> Dict[str, str]:
    """``{variable name: entry}``: where ``model.save_weights`` writes each variable of a Keras
    model (``layers/dense/vars/0``), the variables named as ``plan --model`` names them, so that a
    ``.weights.h5`` output is laid out as ``model.load_weights`` reads it.

    Example:
        >>> weights_file_entries(keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)]))  # doctest: +SKIP
        {'sequential/dense/kernel': 'layers/dense/vars/0', 'sequential/dense/bias': 'layers/dense/vars/1'}
    """
    from .keraswalk import weights_file_keys
    from .targets import collect_targets

    targets = collect_targets(model)
    entries: Dict[str, str] = {}
    for key, variable in weights_file_keys(model).items():
        name = targets.name_of(variable)
        if name is not None:
            entries.setdefault(name, key)
    return entries
