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

from ckptmerge.core.errors import CheckpointFormatError, CheckpointNotFoundError
from ckptmerge.formats.base import CheckpointReader
from ckptmerge.formats.keras.h5 import H5Reader
from ckptmerge.formats.io import storage
from ckptmerge.formats.io.localfile import link_problem
from ckptmerge.formats.io.urlpath import has_suffix, is_plain_name
from ckptmerge.formats.safetensors.reader import read_json_file
from ckptmerge.core.specs import VariableInfo
from ckptmerge.core.text import escape_name

__all__ = ["KerasShardsReader", "SHARDS_SUFFIX", "is_keras_shards", "shard_set_of", "shard_files"]

#: The suffix of the JSON file that names a sharded set's files.
SHARDS_SUFFIX = ".weights.json"
_SHARD_RE = re.compile(r"^(?P<base>.+)_\d{5}\.weights\.h5$")


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
