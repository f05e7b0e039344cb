"""What Keras's ``model.load_weights`` would do with a weights file, said before anything loads.

A :class:`KerasVerdict` states it in Keras's own terms: the file loads; or ``load_weights`` fails,
with Keras's own error for each object it reports as "could not be loaded"; what
``skip_mismatch=True`` would do instead (warn, and leave those objects as they are: whole layers,
some of them already half assigned); what Keras skips with a warning (an optimizer not built, a
nested container the file lacks) and what it ignores without a word (entries no object of the
model reads). ``plan.report()`` shows one per Keras weights-file source beside ckptmerge's own
plan, and ``ckptmerge diff OLD NEW`` one for two weights files: :func:`compare_weights_files`
predicts it from the files alone, the newer file standing for the model that loads the older.

Pure: names and shapes in, a verdict out; no file access, no Keras, no TensorFlow.

Example:
    >>> old = {"layers/dense/vars/0": (3, 2), "layers/dense/vars/1": (2,)}
    >>> new = {**old, "layers/dense_1/vars/0": (2, 2), "layers/dense_1/vars/1": (2,)}
    >>> compare_weights_files(old, new).outcome
    'fail'
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from ..formats.keras.names import layer_of
from ..core.text import plural, quote_name

__all__ = ["KerasVerdict", "compare_weights_files", "compare_legacy_files", "shape_message", "count_message"]

_OPTIMIZER_TOPS = ("optimizer", "optimizer_weights")


def count_message(name: str, expected: int, received: int, names: Optional[Sequence[str]] = None) -> str:
    """Keras's error for an object whose entry count differs (``_check_load_own_variables``).

    Example:
        >>> count_message("dense_2", 2, 0, ["kernel", "bias"])
        "Layer 'dense_2' expected 2 variables, but received 0 variables during loading. Expected: ['kernel', 'bias']"
    """
    text = f"Layer '{name}' expected {expected} variables, but received {received} variables during loading."
    return text + (f" Expected: {list(names)}" if names is not None else "")


def shape_message(expected: Tuple[int, ...], received: Tuple[int, ...], target: str = "") -> str:
    """Keras's error for an entry whose shape differs (``Variable.assign``).

    Example:
        >>> shape_message((4, 6), (4, 5))
        'The shape of the target variable and the shape of the target value in `variable.assign(value)` must match. variable.shape=(4, 6), Received: value.shape=(4, 5).'
    """
    text = ("The shape of the target variable and the shape of the target value in `variable.assign(value)` "
            f"must match. variable.shape={tuple(expected)}, Received: value.shape={tuple(received)}.")
    return text + (f" Target variable: {target}" if target else "")


@dataclass(frozen=True)
class KerasVerdict:
    """What ``load_weights`` would do with one file (see the module docstring).

    Attributes:
        failures: ``(object path, object name, Keras's message)`` of every object Keras reports
            as "could not be loaded" (any: ``load_weights`` raises).
        dropped: the object paths ``skip_mismatch=True`` would leave as they are, with a warning.
        partial: of those, the ones Keras half assigns first (the entries before the first
            mismatched one), as ``(path, assigned, of)``.
        warnings: what Keras skips with a warning even without ``skip_mismatch``.
        ignored: entries no object of the model reads (Keras ignores them without a word).
        loaded: how many objects load.
        legacy: a Keras 2 / legacy ``.h5`` loaded by topology: Keras stops at the first error,
            and ``skip_mismatch`` skips mismatched weights one by one (not whole layers).

    Example:
        >>> KerasVerdict(loaded=3).lines()
        ['load_weights would load it: 3 objects restored from the file']
    """

    failures: Tuple[Tuple[str, str, str], ...] = ()
    dropped: Tuple[str, ...] = ()
    partial: Tuple[Tuple[str, int, int], ...] = ()
    warnings: Tuple[str, ...] = ()
    ignored: Tuple[str, ...] = ()
    loaded: int = 0
    legacy: bool = False

    @property
    def outcome(self) -> str:
        """``"fail"`` when ``load_weights`` raises, else ``"load"``."""
        return "fail" if self.failures else "load"

    def lines(self, limit: int = 5) -> List[str]:
        """The verdict for people: one line per fact, the first ``limit`` items of each list."""
        out: List[str] = []
        if self.failures:
            path, name, message = self.failures[0]
            total = "" if self.legacy else (f"A total of {len(self.failures)} objects could not be loaded. "
                                            f"Example error message for object {quote_name(name)} at "
                                            f"{quote_name(path or 'root')}: ")
            out.append(f"load_weights would fail: {total}{message}")
            for path, name, message in self.failures[1:limit]:
                out.append(f"  also {quote_name(name)} at {quote_name(path or 'root')}: {message}")
            if len(self.failures) > limit:
                out.append(f"  ... and {len(self.failures) - limit} more")
            if self.dropped:
                what = ("skip the mismatched weights one by one and load the rest" if self.legacy else
                        f"warn and leave {plural(len(self.dropped), 'object')} as "
                        f"{'it is' if len(self.dropped) == 1 else 'they are'}: {_listed(self.dropped, limit)}")
                out.append(f"with skip_mismatch=True it would {what}")
            elif self.legacy:
                out.append("skip_mismatch=True would not help: it skips mismatched shapes only")
            for path, assigned, of in self.partial[:limit]:
                out.append(f"  of which {quote_name(path)} half loads: Keras assigns {assigned} of its {of} "
                           "entries before it gives up on it")
        else:
            out.append(f"load_weights would load it: {plural(self.loaded, 'object')} restored from the file")
        for w in self.warnings[:limit]:
            out.append(f"it would skip with a warning: {w}")
        if len(self.warnings) > limit:
            out.append(f"  ... and {len(self.warnings) - limit} more warnings")
        if self.ignored:
            out.append(f"it would ignore, without a word, {plural(len(self.ignored), 'entry', 'entries')} no object "
                       f"of the model reads ({_listed(self.ignored, limit)})")
        return out

    def to_dict(self) -> Dict[str, Any]:
        """JSON-ready: ``outcome``, ``failures`` (``path``, ``name``, ``message``), ``dropped``,
        ``partial``, ``warnings``, ``ignored``, ``loaded``, ``legacy``."""
        return {"outcome": self.outcome,
                "failures": [{"path": p, "name": n, "message": m} for p, n, m in self.failures],
                "dropped": list(self.dropped),
                "partial": [{"path": p, "assigned": a, "of": o} for p, a, o in self.partial],
                "warnings": list(self.warnings), "ignored": list(self.ignored), "loaded": self.loaded,
                "legacy": self.legacy}


def _listed(items: Sequence[str], limit: int) -> str:
    shown = ", ".join(quote_name(i) for i in list(items)[:limit])
    return shown + (f", ... ({len(items)} in all)" if len(items) > limit else "")


def _groups(shapes: Mapping[str, Tuple[int, ...]]) -> Dict[str, Dict[str, Tuple[int, ...]]]:
    out: Dict[str, Dict[str, Tuple[int, ...]]] = {}
    for key, shape in shapes.items():
        head = layer_of(key)
        if head is not None:
            out.setdefault(head, {})[key.rpartition("/")[2]] = tuple(shape)
    return out


def _order(keys: Sequence[str]) -> List[str]:
    return sorted(keys, key=lambda k: (len(k), k))


def compare_weights_files(old: Mapping[str, Tuple[int, ...]], new: Mapping[str, Tuple[int, ...]],
                          names: Mapping[str, str] = {}) -> KerasVerdict:
    """What a model saved as ``new`` would do loading ``old`` (both Keras 3 weights files).

    Each object ``new`` holds entries for is looked up at its path in ``old``, as
    ``load_weights`` looks it up: no entries, another count or another shape is Keras's error
    (an optimizer with another count is skipped with a warning). Entries of ``old`` at paths
    ``new`` does not have are ignored. (A property that reaches a layer by a second path is
    invisible in a file: the model's own walk, in ``plan.report()``, sees it.)

    Args:
        old: ``{raw key: shape}`` of the file to load (``layers/dense/vars/0``).
        new: ``{raw key: shape}`` of a file the loading model saved.
        names: ``{object path: layer name}`` recorded in ``new`` (Keras's messages use it).

    Returns:
        The :class:`KerasVerdict`.

    Example:
        >>> compare_weights_files({"vars/0": (2,)}, {"vars/0": (3,)}).failures[0][2][:40]
        'The shape of the target variable and the'
    """
    have, want = _groups(old), _groups(new)
    failures: List[Tuple[str, str, str]] = []
    partial: List[Tuple[str, int, int]] = []
    warnings: List[str] = []
    loaded = 0
    for path in sorted(want):
        stored, expected = have.get(path, {}), want[path]
        name = names.get(path) or path.rsplit("/", 1)[-1] or "root"
        optimizer = path.split("/", 1)[0] in _OPTIMIZER_TOPS
        if len(stored) != len(expected):
            if optimizer:
                warnings.append(f"optimizer {quote_name(name)} at {quote_name(path)}: Skipping variable loading "
                                f"for optimizer '{name}', because it has {len(expected)} variables whereas the "
                                f"saved optimizer has {len(stored)} variables.")
            else:
                failures.append((path, name, count_message(name, len(expected), len(stored))))
            continue
        keys = _order(list(expected))
        bad = next((i for i, k in enumerate(keys) if k not in stored or stored[k] != expected[k]), None)
        if bad is None:
            loaded += 1
            continue
        key = keys[bad]
        failures.append((path, name, shape_message(expected[key], stored.get(key, ()))))
        if bad:
            partial.append((path, bad, len(keys)))
    ignored = [k for path, entries in sorted(have.items()) if path not in want
               for k in (f"{path}/vars/{i}" if path else f"vars/{i}" for i in _order(list(entries)))]
    return KerasVerdict(tuple(failures), tuple(p for p, _, _ in failures), tuple(partial), tuple(warnings),
                        tuple(ignored), loaded)


def compare_legacy_files(old: Sequence[Tuple[str, Sequence[Tuple[str, Tuple[int, ...]]]]],
                         new: Sequence[Tuple[str, Sequence[Tuple[str, Tuple[int, ...]]]]]) -> KerasVerdict:
    """What a model saved as the legacy file ``new`` would do loading the legacy file ``old``,
    by topology (``load_weights``' default for ``.h5``): each side's layers, in the file's
    order, as ``(layer name, [(weight name, shape), ...] in weight_names order)``; layers without
    weights are left out, as Keras leaves them out.

    Example:
        >>> dense = [("dense/kernel", (3, 2)), ("dense/bias", (2,))]
        >>> compare_legacy_files([("dense", dense)], [("dense_4", dense)]).outcome
        'load'
    """
    have = [(n, list(w)) for n, w in old if w]
    want = [(n, list(w)) for n, w in new if w]
    if len(have) != len(want):
        return KerasVerdict(((("", "model", "Layer count mismatch when loading weights from file. Model expected "
                                f"{len(want)} layers, found {len(have)} saved layers.")),), legacy=True)
    skipped: List[str] = []
    first: Optional[Tuple[str, str, str]] = None
    for k, ((name, weights), (saved, stored)) in enumerate(zip(want, have)):
        if len(weights) != len(stored):
            return KerasVerdict(((name, name, f"Weight count mismatch for layer #{k} (named {name} in the current "
                                  f"model, {saved} in the save file). Layer expects {len(weights)} weight(s). "
                                  f"Received {len(stored)} saved weight(s)"),), legacy=True)
        for (weight, s), (_, t) in zip(weights, stored):
            if tuple(s) != tuple(t):
                skipped.append(weight)
                if first is None:
                    first = (name, name, f"Shape mismatch in layer #{k} (named {name})for weight {weight}. Weight "
                                         f"expects shape {tuple(s)}. Received saved weight with shape {tuple(t)}")
    if first is not None:
        return KerasVerdict((first,), tuple(skipped), legacy=True)
    return KerasVerdict(loaded=len(want), legacy=True)
