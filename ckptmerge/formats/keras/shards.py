"""Read Keras 3 sharded weights: a ``*.weights.json`` and the ``*_NNNNN.weights.h5`` shards it names.

``model.save_weights("model.weights.json", max_shard_size=...)`` (Keras >= 3.9) writes the
variables across several ``.weights.h5`` files (``model_00000.weights.h5``, ...) beside a JSON
file whose ``weight_map`` says which shard (or shards, for an object whose entries were split)
holds each object's ``vars`` group (``"/layers/dense/vars": "model_00000.weights.h5"``). This
reader opens every shard the map names with :class:`~ckptmerge.formats.keras.h5.H5Reader` and offers
their entries as one file with the same keys an unsharded ``.weights.h5`` has
(``layers/dense/vars/0``), each read from its own shard: an entry in several shards is read from
the first one its group lists, as Keras's ``ShardedH5IOStore`` reads it.

The JSON is untrusted like any file: it is read with a size cap, and its ``weight_map`` may name
only files in its own folder (no path, no ``..``), so nothing outside the named files is read.
Works by path and by URL (each shard through :mod:`ckptmerge.formats.io.storage`).
"""

from __future__ import annotations

import re
from typing import Any, Dict, Iterator, List, Optional, Tuple

import numpy as np

from ckptmerge.core.errors import CheckpointFormatError, CheckpointNotFoundError, ResourceLimitError
from ckptmerge.formats.base import CheckpointReader
from ckptmerge.formats.keras.h5 import H5Reader
from ckptmerge.formats.io import storage
from ckptmerge.formats.io.localfile import link_problem
from ckptmerge.formats.io.urlpath import has_suffix, is_plain_name
from ckptmerge.formats.safetensors.reader import read_json_file
from ckptmerge.core.specs import VariableInfo
from ckptmerge.core.text import escape_name

__all__ = ["KerasShardsReader", "SHARDS_SUFFIX", "is_keras_shards", "shard_set_of", "shard_files", "lone_shard_error"]

#: The suffix of the JSON file that names a sharded set's files.
SHARDS_SUFFIX = ".weights.json"
_SHARD_RE = re.compile(r"^(?P<base>.+)_(?P<number>\d{5})\.weights\.h5$")


def is_keras_shards(path: str) -> bool:
    """True for a path named like a Keras sharded set's JSON (``*.weights.json``).

    Example:
        >>> is_keras_shards("run/model.weights.json"), is_keras_shards("run/model.weights.h5")
        (True, False)
    """
    return has_suffix(str(path), SHARDS_SUFFIX)


def shard_set_of(shard: str) -> Optional[str]:
    """The JSON of the set a shard file (``model_00001.weights.h5``) belongs to, when it exists
    beside it (``model.weights.json``), else ``None``.

    Example:
        >>> shard_set_of("/nonexistent/model_00001.weights.h5") is None
        True
    """
    m = _SHARD_RE.match(storage.basename(shard))
    if m is None:
        return None
    index = storage.join(storage.dirname(shard), m.group("base") + SHARDS_SUFFIX)
    return index if storage.probe_isfile(index) else None


def lone_shard_error(shard: str, given: Optional[str] = None) -> Optional[CheckpointFormatError]:
    """The error for a shard of a Keras sharded set opened without its set's JSON beside it, or
    ``None`` when ``shard`` is not one.

    One shard alone restores only part of a model, silently: Keras itself never reads a shard
    without its JSON. A file is taken for a lone shard only on positive evidence: it is named as
    Keras names shards (``BASE_NNNNN.weights.h5``), no ``BASE.weights.json`` is beside it, Keras 3
    wrote it (its ``vars`` groups carry their object's ``name``), and either it lacks the model's
    own top-level ``vars`` group (every whole file Keras writes has one; a set's later shards do
    not) or it is the first shard, ``_00000`` (``ModelCheckpoint`` numbers epochs from 1); a later
    shard with no group named (the rest of a split layer) counts when its set's first shard, written
    by Keras, is beside it. A whole
    file named by epoch (``model_00007.weights.h5``) and files other tools wrote (ckptmerge's own
    outputs) are read as they are. (A shard renamed to another name cannot be told.)

    Example:
        >>> lone_shard_error("/nonexistent/model.weights.h5") is None
        True
    """
    m = _SHARD_RE.match(storage.basename(shard))
    if m is None:
        return None
    base, number = m.group("base"), int(m.group("number"))
    index = storage.join(storage.dirname(shard), base + SHARDS_SUFFIX)
    if storage.probe_isfile(index):
        return None
    signs = _keras_signs(shard)
    if signs is None:
        return None
    written_by_keras, model_vars = signs
    if not written_by_keras and not model_vars and number != 0:
        # a last shard may hold only the rest of a split layer (no group named): its set's first
        # shard beside it, written by Keras, tells
        first = storage.join(storage.dirname(shard), f"{base}_00000.weights.h5")
        written_by_keras = storage.probe_isfile(first) and (_keras_signs(first) or (False, False))[0]
    if not written_by_keras or (model_vars and number != 0):
        return None
    shown = given if given is not None else shard
    return CheckpointFormatError(
        f"{escape_name(repr(shown))} is shard {number + 1} of a Keras sharded weights set "
        f"(model.save_weights('{escape_name(base)}{SHARDS_SUFFIX}', max_shard_size=...)), but the set's index "
        f"{escape_name(repr(storage.basename(index)))}, which names every shard and which layers each holds, is "
        f"not beside it; one shard alone restores only part of a model. Copy the whole set (the {SHARDS_SUFFIX} "
        f"file and every {escape_name(base)}_NNNNN.weights.h5) into one folder and pass the {SHARDS_SUFFIX} file. "
        "(If it is a whole weights file of its own, rename it so that its name does not end in "
        f"_NNNNN.weights.h5.) (Expected: {escape_name(index)})", path=shard)


def _keras_signs(path: str) -> Optional[Tuple[bool, bool]]:
    """``(Keras 3 wrote it, it has the model's own top-level vars group)`` of an HDF5 weights file,
    or ``None`` when it cannot be read as HDF5 (its reader will say why)."""
    try:
        import h5py

        with storage.open_binary(path, storage.SNIFF_BLOCK) as f, h5py.File(f, "r") as h5:
            named: List[str] = []

            def visit(name: str, obj: Any) -> Optional[bool]:
                if isinstance(obj, h5py.Group) and name.rsplit("/", 1)[-1] == "vars" and "name" in obj.attrs:
                    named.append(name)
                    return True  # one is enough
                return None

            h5.visititems(visit)
            return bool(named), isinstance(h5.get("vars"), h5py.Group)
    except ResourceLimitError:
        raise
    except Exception:  # noqa: BLE001 - not HDF5, damaged, h5py missing: not ours to decide here
        return None


def _error(problem: str, path: str) -> CheckpointFormatError:
    return CheckpointFormatError(
        f"Cannot read Keras sharded weights {escape_name(storage.basename(path))}: {problem}. The file is "
        "corrupt or not a Keras '.weights.json' (save_weights(..., max_shard_size=...) writes one); re-copy "
        f"it. (File: {escape_name(path)})", path=path)


def shard_files(index: str) -> Tuple[Dict[str, List[str]], List[str]]:
    """``({group: [shard file name, ...]}, [every shard file name, in the map's order])`` of a
    sharded set's JSON, checked: every file name must be a plain name in the JSON's folder.

    Raises:
        CheckpointFormatError: the JSON is malformed or names a path outside its folder.
        CheckpointNotFoundError: it does not exist.
    """
    data = read_json_file(index, _error)
    weight_map = data.get("weight_map") if isinstance(data, dict) else None
    if not isinstance(weight_map, dict) or not weight_map:
        raise _error("it has no 'weight_map' object naming the shard of each group", index)
    groups: Dict[str, List[str]] = {}
    order: List[str] = []
    for group, files in weight_map.items():
        listed = files if isinstance(files, list) else [files]
        if not isinstance(group, str) or not listed:
            raise _error(f"weight_map[{group!r}] names no file", index)
        for file in listed:
            if not is_plain_name(file, index):
                raise _error(f"weight_map[{group!r}] names {file!r}, not a file name in the JSON's own "
                             "folder (ckptmerge reads nothing outside the named files)", index)
            if file not in order:
                order.append(file)
        groups[group.strip("/")] = list(listed)
    return groups, order


class KerasShardsReader(CheckpointReader):
    """Reader of Keras 3 sharded weights (``*.weights.json`` plus its ``.weights.h5`` shards).

    Use :func:`ckptmerge.formats.open_checkpoint` (or ``cm.open``) rather than this class.

    Attributes:
        files: the shard files read, in the order the JSON names them.
        legacy: always ``None`` (a sharded set is a Keras 3 file).
        layer_names: ``{object path: layer name}`` the shards record (see
            :class:`~ckptmerge.formats.keras.h5.H5Reader`).

    Raises:
        CheckpointNotFoundError: the JSON, or a shard it names, does not exist.
        CheckpointFormatError: the JSON or a shard is malformed.

    Example:
        >>> with KerasShardsReader("run/model.weights.json") as r:   # doctest: +SKIP
        ...     r.get("layers/dense/vars/0").shape
        (12, 64)
    """

    format = "keras-h5"
    legacy = None

    def __init__(self, path: str, *, verify: bool = True) -> None:
        super().__init__(path)
        self.verify = verify
        groups, order = shard_files(path)
        folder = storage.dirname(storage.abspath(path))
        self.files = [storage.join(folder, f) for f in order]
        for f in self.files:
            problem = None if storage.is_url(f) else link_problem(folder, f)  # a folder's rules
            if problem:
                raise CheckpointFormatError(
                    f"Cannot read Keras sharded weights {escape_name(storage.basename(path))}: the shard "
                    f"{escape_name(storage.basename(f))} it names {problem}.", path=f)
            if not storage.isfile(f):
                raise CheckpointNotFoundError(
                    f"Shard {storage.basename(f)!r} named by {storage.basename(path)} does not exist in "
                    f"{folder}; the set is incomplete. Copy every shard the JSON names.", path=f)
        self._shards: Dict[str, H5Reader] = {}
        try:
            for name, f in zip(order, self.files):
                self._shards[name] = H5Reader(f, verify=verify)
            self._where: Dict[str, Tuple[H5Reader, VariableInfo]] = {}
            infos: List[VariableInfo] = []
            rank = {name: i for i, name in enumerate(order)}
            for name in order:  # an entry in two shards: the first its group's list names
                for info in self._shards[name].variables():
                    key = info.raw_key
                    group = key.rpartition("/")[0]
                    held = self._where.get(key)
                    if held is not None and not _prefer(name, held[0], groups.get(group, ()), rank, self._shards):
                        continue
                    if held is None:
                        infos.append(VariableInfo(key, info.shape, info.dtype, key, info.kind, info.nbytes))
                    self._where[key] = (self._shards[name], info)
        except BaseException:
            self.close()
            raise
        self._set_infos(sorted(infos, key=lambda i: i.name))
        self.layer_names: Dict[str, str] = {}
        for reader in reversed(list(self._shards.values())):
            self.layer_names.update(reader.layer_names)

    def _read(self, info: VariableInfo) -> np.ndarray:
        reader, inner = self._where[info.raw_key]
        return reader.get(inner.name)

    def _iter_chunks(self, info: VariableInfo, max_elements: int) -> Iterator[np.ndarray]:
        reader, inner = self._where[info.raw_key]
        return reader.iter_chunks(inner.name, max_elements)

    def close(self) -> None:
        """Close every shard (reading again reopens them)."""
        for reader in getattr(self, "_shards", {}).values():
            reader.close()


def _prefer(name: str, held: Any, listed: Any, rank: Dict[str, int], shards: Dict[str, Any]) -> bool:
    """Whether shard ``name`` should serve an entry ``held`` serves already: when the entry's
    group lists ``name`` before ``held``'s file (Keras reads the first listed shard first)."""
    held_name = next(n for n, r in shards.items() if r is held)
    order = list(listed) or sorted(rank, key=rank.__getitem__)
    pos = {n: i for i, n in enumerate(order)}
    return pos.get(name, len(order)) < pos.get(held_name, len(order))
