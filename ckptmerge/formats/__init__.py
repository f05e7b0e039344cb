"""Checkpoint file formats, read without TensorFlow.

:func:`open_checkpoint` turns a resolved checkpoint path into a :class:`CheckpointReader`:
TF V2 tensor bundles (``<prefix>.index`` + ``<prefix>.data-*``, everything TF 0.12 to 2.x and
SavedModel ``variables/variables`` write) through :class:`~ckptmerge.formats.tf.bundle.BundleReader`,
TF V1 checkpoints (the single-file or ``-?????-of-NNNNN`` sharded table format of TF 0.x and
``Saver(write_version=V1)``) through :class:`~ckptmerge.formats.tf.v1.V1Reader`, and Keras weights
files (``.weights.h5``, ``.h5``, and the weights inside a ``.keras`` archive) through
:class:`~ckptmerge.formats.keras.h5.H5Reader`, Keras 3 sharded weights (``*.weights.json`` with its
``*_NNNNN.weights.h5`` shards) through :class:`~ckptmerge.formats.keras.shards.KerasShardsReader`,
and Orbax step or item folders (JAX) through :class:`~ckptmerge.formats.orbax.reader.OrbaxReader`
(``tensorstore`` decodes the arrays).
Every format is also read from object storage by URL (``s3://...``, ``memory://...``), by ranged
reads through :mod:`ckptmerge.formats.io.storage`. Nothing here imports TensorFlow. Path resolution
(directories, ``checkpoint`` state files, "latest") is :mod:`ckptmerge.sources.resolve`' job; this
module expects a prefix or a file.

Holds: one reader (and writer) per format: ``base`` (the reader interface), ``dtypes``, ``h5``,
``kerasnames`` and ``kerasshards`` (Keras weights files), ``numpy_files``, ``safetensors`` and
``safetensors_writer``; ``whole`` (whether a file still being written is whole yet: footers and headers);
``tf/`` (TensorFlow's own formats) and ``io/`` (storage, safe files, atomic outputs).

May import: the bottom layer (``core``) only. Never
TensorFlow, JAX or torch.
"""

from __future__ import annotations

import os
from typing import List

from ckptmerge.core.args import local_path
from ckptmerge.core.errors import CheckpointFormatError, CheckpointNotFoundError
from ckptmerge.formats.base import CheckpointReader, UnknownTensorError
from ckptmerge.formats.keras.h5 import H5Reader, is_hdf5, is_keras_archive
from ckptmerge.formats.io import storage
from ckptmerge.formats.io.urlpath import add_suffix, path_part, strip_suffix
from ckptmerge.formats.keras.shards import KerasShardsReader, is_keras_shards
from ckptmerge.formats.numpy.reader import NumpyReader, holds_npy, is_npz
from ckptmerge.formats.orbax.layout import is_orbax
from ckptmerge.formats.orbax.reader import OrbaxReader
from ckptmerge.formats.safetensors.reader import (
    INDEX_SUFFIX,
    SafetensorsReader,
    is_safetensors,
)
from ckptmerge.formats.tf.bundle import BundleReader
from ckptmerge.formats.tf.table import is_leveldb_table
from ckptmerge.formats.tf.v1 import V1_PATTERN_RE, V1Reader
from ckptmerge.core.specs import VariableInfo

__all__ = [
    "open_checkpoint",
    "list_variables",
    "CheckpointReader",
    "BundleReader",
    "H5Reader",
    "KerasShardsReader",
    "NumpyReader",
    "OrbaxReader",
    "SafetensorsReader",
    "V1Reader",
    "UnknownTensorError",
]

_H5_SUFFIXES = (".h5", ".hdf5")


def open_checkpoint(path: str, *, verify: bool = True) -> CheckpointReader:
    """Open a checkpoint prefix, a V1 checkpoint or a Keras weights file for reading.

    Args:
        path: a resolved checkpoint prefix (``runs/base/model.ckpt-1000``, for which
            ``model.ckpt-1000.index`` exists), a V1 checkpoint file or the pattern of a sharded
            V1 set (``model.ckpt-1000-?????-of-00002``), a ``.weights.h5``/``.h5`` file, a
            Keras 3 ``.keras`` archive or a sharded set's ``.weights.json``, or an Orbax step or
            item folder.
        verify: check CRC32C checksums while reading (``False`` to salvage corrupt files).

    Returns:
        A :class:`CheckpointReader`; close it (or use ``with``) when done.

    Raises:
        CheckpointNotFoundError: if neither ``path + ".index"`` nor the file exists.
        CheckpointFormatError: for a corrupt file or a format ckptmerge does not read.

    Example:
        >>> with open_checkpoint("runs/base/model.ckpt-1000") as r:  # doctest: +SKIP
        ...     [v.name for v in r.variables()][:2]
        ['dense/bias', 'dense/kernel']
    """
    path = local_path(os.fspath(path))  # a file:// URL is a local path: the local rules apply
    # A URL (object storage) takes the same steps through storage's helpers: ranged reads.
    name = path_part(path)  # a URL's name tests look at its path, not its query
    if storage.probe_isfile(add_suffix(path, ".index")):
        return BundleReader(path, verify=verify)
    if V1_PATTERN_RE.search(name) and not storage.exists(path):
        return V1Reader(path, verify=verify)
    if storage.isfile(path):
        if is_keras_shards(path):
            return KerasShardsReader(path, verify=verify)
        if is_hdf5(path) or (name.lower().endswith(".keras") and is_keras_archive(path)):
            return H5Reader(path, verify=verify)
        if name.endswith(INDEX_SUFFIX) or name.lower().endswith(".safetensors") or is_safetensors(path):
            return SafetensorsReader(path, verify=verify)  # (a damaged one: its error says what is wrong)
        if is_npz(path):
            return NumpyReader(path, verify=verify)
        if name.endswith(".index"):
            raise CheckpointFormatError(
                f"{path!r} is an index file; pass the checkpoint prefix without '.index': "
                f"{strip_suffix(path, '.index')!r}.", path=path)
        if is_leveldb_table(path):
            return V1Reader(path, verify=verify)
        if name.lower().endswith(_H5_SUFFIXES):
            raise CheckpointFormatError(
                f"{path!r} is not an HDF5 file (no HDF5 signature); it is corrupt or was saved in "
                "another format. Re-copy it, or re-save the weights with Keras "
                "model.save_weights('model.weights.h5').", path=path)
        raise CheckpointFormatError(
            f"{path!r} is not a checkpoint ckptmerge can read: it is neither a TF checkpoint "
            "prefix (with a '.index' file next to it), a V1 checkpoint nor a Keras .weights.h5 "
            "file. If it is a "
            "data shard, pass the prefix (the part before '.data-').", path=path)
    if storage.isdir(path):
        if is_orbax(path):  # (tensorstore is imported when an Orbax checkpoint is opened)
            return OrbaxReader(path, verify=verify)
        names = storage.listdir(path)
        if any(n.endswith((".safetensors", INDEX_SUFFIX)) for n in names):
            return SafetensorsReader(path, verify=verify)
        if any(n.endswith(".npy") for n in names) or (not storage.is_url(path) and holds_npy(path)):
            return NumpyReader(path, verify=verify)
        raise CheckpointNotFoundError(
            f"{path!r} is a directory; open_checkpoint expects a checkpoint prefix such as "
            f"'{storage.join(path, 'model.ckpt-1000')}' (with a '.index' file) or a .weights.h5 "
            "file.", path=path)
    if name.lower().endswith(_H5_SUFFIXES + (".keras",)):
        raise CheckpointNotFoundError(f"Keras weights file {path!r} does not exist.", path=path)
    raise CheckpointNotFoundError(
        f"Checkpoint not found: neither {add_suffix(path, '.index')!r} nor {path!r} exists.", path=path)


def list_variables(path: str) -> List[VariableInfo]:
    """Return every tensor of the checkpoint at ``path`` (opens, lists and closes it).

    Example:
        >>> [(v.name, v.shape) for v in list_variables("model.ckpt-1000")]  # doctest: +SKIP
        [('dense/bias', (128,)), ('dense/kernel', (784, 128))]
    """
    with open_checkpoint(path) as reader:
        return reader.variables()
