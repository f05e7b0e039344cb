"""Whether a checkpoint file is whole yet: the footers and headers of files still being written.

A trainer (or a copy tool) writes a checkpoint file by file, and often in place: Keras writes a
``.weights.h5`` straight to its final name, safetensors files are written front to back, ``cp``
and ``gsutil`` copy an index before its data shards or after. A watcher must tell a file that
is not finished from one that is damaged, so each format's own record of its length is checked
against the file, reading a few bytes at its start or its end:

- a LevelDB table (a TF ``.index``, a V1 checkpoint) ends with a 48-byte footer whose last 8
  bytes are the table magic;
- an HDF5 file's superblock records the end-of-file address, which HDF5 writes when the file is
  flushed or closed (until then it holds the superblock's own early value); superblocks of
  version 3 also carry a "file is open for writing" flag;
- a safetensors file is exactly 8 bytes, its JSON header and the data the header places;
- a zip archive (a ``.keras`` model) ends with its central directory, written at close.

:func:`unfinished` answers for one file, local or remote (through
:mod:`ckptmerge.formats.io.storage`): a short reason when it is not whole yet, else ``None``.
``None`` does not mean valid: opening the file with its reader decides that. Nothing here
imports TensorFlow or h5py.
"""

from __future__ import annotations

import json
import struct
import zipfile
from typing import Any, Callable, Optional

from ckptmerge.core import limits
from ckptmerge.formats.keras.h5 import HDF5_SIGNATURE
from ckptmerge.formats.io import storage
from ckptmerge.formats.safetensors.reader import MAX_HEADER
from ckptmerge.formats.tf.table import FOOTER_SIZE, TABLE_MAGIC

__all__ = ["unfinished", "table_unfinished", "hdf5_unfinished", "safetensors_unfinished", "zip_unfinished"]

_MAGIC_BYTES = struct.pack("<Q", TABLE_MAGIC)


def _with_file(path: str, check: Callable[[Any, int], Optional[str]]) -> Optional[str]:
    """``check(file, size)`` of the file at ``path`` opened for reading (local or remote);
    ``"it does not exist"`` when it cannot be opened."""
    try:
        with storage.open_binary(path, storage.SNIFF_BLOCK) as f:
            f.seek(0, 2)
            size = int(f.tell())
            f.seek(0)
            return check(f, size)
    except OSError as e:
        limits.check(e, path)
        return "it does not exist"


def table_unfinished(path: str) -> Optional[str]:
    """Why a LevelDB table (a TF ``.index``) is not whole yet, or ``None``: at least a footer long,
    ending with the table magic.

    Example:
        >>> table_unfinished("/nonexistent.index")
        'it does not exist'
    """
    return _with_file(path, _table)


def _table(f: Any, size: int) -> Optional[str]:
    if size < FOOTER_SIZE:
        return f"it has {size} bytes, fewer than a table footer ({FOOTER_SIZE})"
    f.seek(size - 8)
    if f.read(8) != _MAGIC_BYTES:
        return f"its {size} bytes do not end with the table footer yet"
    return None


def hdf5_unfinished(path: str) -> Optional[str]:
    """Why an HDF5 file is not whole yet, or ``None``: its superblock's end-of-file address is
    the file's size and (version 3) it is not marked open for writing.

    Example:
        >>> hdf5_unfinished("/nonexistent.h5")
        'it does not exist'
    """
    return _with_file(path, _hdf5)


def _hdf5(f: Any, size: int) -> Optional[str]:
    offset = 0
    while True:  # the superblock sits at 0, 512, 1024, ... (after a user block)
        f.seek(offset)
        head = f.read(96)
        if head[:8] == HDF5_SIGNATURE:
            return _superblock_unfinished(head, offset, size)
        if len(head) < 8 or offset >= 1 << 16:
            return f"it has {size} bytes and no HDF5 superblock yet"
        offset = 512 if offset == 0 else offset * 2


def _superblock_unfinished(head: bytes, at: int, size: int) -> Optional[str]:
    """The end-of-file check of a superblock read at offset ``at`` of a file of ``size`` bytes."""
    if len(head) < 12:
        return "its superblock is not written yet"
    version = head[8]
    if version in (0, 1):
        width = head[13]
        first = 24 + (4 if version == 1 else 0)  # base, free-space, end-of-file, driver addresses
        flags = 0
    elif version in (2, 3):
        width = head[9]
        flags = head[11]
        first = 12  # base, superblock extension, end-of-file, root object header addresses
    else:
        return None  # a superblock this check does not know: the reader decides
    eof_at = first + 2 * width
    if width not in (2, 4, 8):
        return None
    if len(head) < eof_at + width:
        return "its superblock is not whole yet"
    base = int.from_bytes(head[first:first + width], "little")
    eof = int.from_bytes(head[eof_at:eof_at + width], "little")
    if version == 3 and flags & 0x05:  # bit 0: open for writing; bit 2: SWMR writing
        return "HDF5 marks it open for writing"
    if eof == (1 << (8 * width)) - 1:  # HDF5's "undefined address"
        return "its superblock records no end of file yet"
    if size not in (eof, base + eof, at + eof):
        return f"its superblock says {eof} bytes, the file has {size}"
    return None


def safetensors_unfinished(path: str) -> Optional[str]:
    """Why a ``.safetensors`` file is not whole yet, or ``None``: 8 bytes, the JSON header they
    announce, and every byte the header places.

    Example:
        >>> safetensors_unfinished("/nonexistent.safetensors")
        'it does not exist'
    """
    return _with_file(path, _safetensors)


def _safetensors(f: Any, size: int) -> Optional[str]:
    if size < 8:
        return f"it has {size} bytes, fewer than the 8-byte header length"
    n = struct.unpack("<Q", f.read(8))[0]
    if n > MAX_HEADER:
        return None  # not a header length: the reader says so
    if size < 8 + n:
        return f"its {n}-byte header is not whole yet ({size} bytes)"
    try:
        entries = json.loads(f.read(n))
    except ValueError:
        return None  # the header is all there but not JSON: damaged, the reader says so
    if not isinstance(entries, dict):
        return None
    try:
        need = 8 + n + max((int(e["data_offsets"][1]) for k, e in entries.items()
                            if k != "__metadata__" and isinstance(e, dict) and "data_offsets" in e), default=0)
    except (TypeError, ValueError, IndexError, KeyError):
        return None
    if size < need:
        return f"it has {size} of the {need} bytes its header places"
    return None


def zip_unfinished(path: str) -> Optional[str]:
    """Why a zip archive (a Keras ``.keras`` file) is not whole yet, or ``None``: its central
    directory is there and every member lies within the file.

    Example:
        >>> zip_unfinished("/nonexistent.keras")
        'it does not exist'
    """
    return _with_file(path, _zip)


def _zip(f: Any, size: int) -> Optional[str]:
    try:
        with zipfile.ZipFile(f) as z:
            members = z.infolist()
    except zipfile.BadZipFile:
        return f"its {size} bytes hold no zip central directory yet"
    for m in members:
        if m.header_offset + m.compress_size > size:
            return f"member {m.filename!r} runs past its {size} bytes"
    return None


_BY_SUFFIX = ((".index", table_unfinished), (".safetensors", safetensors_unfinished),
              (".keras", zip_unfinished), (".h5", hdf5_unfinished), (".hdf5", hdf5_unfinished))


def unfinished(path: str) -> Optional[str]:
    """Why the checkpoint file ``path`` is not whole yet (a short reason), or ``None``; by its
    name: ``.index``, ``.safetensors``, ``.keras``, ``.h5``/``.hdf5``. Other files are not
    checked (``None``).

    Example:
        >>> unfinished("/nonexistent.weights.h5")
        'it does not exist'
    """
    lower = path.lower()
    for suffix, check in _BY_SUFFIX:
        if lower.endswith(suffix):
            return check(path)
    return None
