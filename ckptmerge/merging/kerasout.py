"""Keras weights-file outputs laid out as ``model.load_weights`` reads them.

A Keras 3 ``.weights.h5`` file names no variables: ``load_weights`` walks the model and reads each
object's variables from the entries of its own path (``layers/dense/vars/0``, ``vars/1``, ...).
A merge whose names are already such entries (``.weights.h5`` or ``.keras`` inputs, as ckptmerge
names them) writes them as they are. Names of TF checkpoints, safetensors or a live model
(``sequential/dense/kernel``) are placed by the model the file is for, given as the template
(``template=model``, ``--model MODULE:FUNCTION``): its own walk gives each variable its entry
(:func:`ckptmerge.restoring.kerasfiles.weights_file_layout`). Without one no Keras model could
load the file, so :func:`h5_entries` refuses before anything is written, saying what to pass.
"""

from __future__ import annotations

import re
from typing import Dict, List, Optional, Sequence, Tuple

from ..core.errors import ArgumentError
from ..core.text import plural, quote_name

__all__ = ["h5_entries", "is_keras_entry", "missing_layers"]

_ENTRY = re.compile(r"(?:[^/]+/)*vars/\d+")

_FIX = ("Pass the model the file is for as the template: template=<the Keras model> (on the command line "
        "--model MODULE:FUNCTION), whose own layout gives each variable its entry; or write a TF checkpoint or a "
        ".safetensors file.")


def is_keras_entry(name: str) -> bool:
    """Whether ``name`` is a Keras weights-file entry (``layers/dense/vars/0``).

    Example:
        >>> is_keras_entry("layers/dense/vars/0"), is_keras_entry("sequential/dense/kernel")
        (True, False)
    """
    return bool(_ENTRY.fullmatch(name))


def _listed(names: Sequence[str], limit: int = 3) -> str:
    shown = ", ".join(quote_name(n) for n in names[:limit])
    return shown + (f" and {len(names) - limit} more" if len(names) > limit else "")


def h5_entries(names: Sequence[str], model_keys: Optional[Dict[str, str]], given: str) -> Optional[Dict[str, str]]:
    """``{written name: entry}`` for a ``.weights.h5`` output, or ``None`` when the names are
    entries already (see the module docstring).

    Raises:
        ArgumentError: names that are not entries and no model to place them (or names the
            model's ``save_weights`` does not write); nothing has been written.

    Example:
        >>> h5_entries(["layers/dense/vars/0"], None, "out.weights.h5") is None
        True
        >>> h5_entries(["d/kernel"], {"d/kernel": "layers/dense/vars/0"}, "out.weights.h5")
        {'d/kernel': 'layers/dense/vars/0'}
    """
    if model_keys is not None:
        unknown = [n for n in names if n not in model_keys]
        if unknown:
            raise ArgumentError(
                f"The model given as the template saves no entry for {plural(len(unknown), 'name')} of this merge "
                f"({_listed(unknown)}): model.save_weights does not write them, so model.load_weights would not "
                f"read them. Exclude them (Source(..., exclude=[...])). Nothing was written to {quote_name(given)}.")
        return {n: model_keys[n] for n in names}
    foreign = [n for n in names if not is_keras_entry(n)]
    if not foreign:
        return None
    raise ArgumentError(
        f"Keras's model.load_weights reads a .weights.h5 file by the model's own layout (entries such as "
        f"'layers/dense/vars/0'), not by variable names, and {len(foreign)} of the {len(names)} names to write "
        f"are variable names ({_listed(foreign)}): no Keras model would load {quote_name(given)}. {_FIX} "
        "Nothing was written.")


def missing_layers(entries: Dict[str, str], model_keys: Optional[Dict[str, str]]) -> List[Tuple[str, int]]:
    """The model's layers (entry groups) whose variables the output leaves out, with how many:
    ``load_weights`` raises for each of them unless it skips them.

    Example:
        >>> missing_layers({"a": "layers/dense/vars/0"}, {"a": "layers/dense/vars/0", "b": "layers/dense_1/vars/0"})
        [('layers/dense_1', 1)]
    """
    if model_keys is None:
        return []
    written = set(entries.values())
    out: Dict[str, int] = {}
    for entry in model_keys.values():
        if entry not in written:
            group = entry.rsplit("/vars/", 1)[0]
            out[group] = out.get(group, 0) + 1
    return sorted(out.items())
