"""Read Keras weights files (Keras 3 ``.weights.h5`` and ``.keras``, Keras 2 ``.h5``) with h5py.

Every HDF5 dataset is one tensor, named by its path in the file as is: Keras 3 writes
``layers/dense/vars/0`` and ``optimizer/vars/3``; Keras 2 ``save_weights`` writes
``dense/dense/kernel:0`` (the ``:0`` is dropped). Datasets under a top-level ``optimizer`` or
``optimizer_weights`` group are optimizer state. Keras 3 stores ``bfloat16`` (and other
``ml_dtypes`` types) as opaque bytes with a ``dtype`` attribute; those are viewed back as their
real dtype. A Keras 3 ``.keras`` archive is a zip holding ``model.weights.h5``; it is read in
place (stored members through a window on the zip file, compressed ones from memory), and its
entries are named by their variables' paths (:mod:`ckptmerge.formats.kerasnames`). Keras 2 /
legacy files are named by each weight's name as their ``weight_names`` attributes record it. ``h5py`` is
imported only when a file is opened; TensorFlow never.
"""

from __future__ import annotations

import io
import json
import os
import struct
import threading
import zipfile
from typing import Any, List, Optional

import numpy as np

from ckptmerge.errors import CheckpointFormatError, CheckpointNotFoundError
from ckptmerge.formats.base import CheckpointReader
from ckptmerge.formats.dtypes import TF_TO_NUMPY, dtype_name
from ckptmerge.formats.kerasnames import archive_names
from ckptmerge.specs import KIND_OPTIMIZER, KIND_VARIABLE, VariableInfo, normalize_name

__all__ = ["H5Reader", "HDF5_SIGNATURE", "is_hdf5", "is_keras_archive"]

#: The 8 bytes every HDF5 superblock starts with.
HDF5_SIGNATURE = b"\x89HDF\r\n\x1a\n"
_OPTIMIZER_GROUPS = ("optimizer", "optimizer_weights")
_NAMED_DTYPES = {dtype_name(dt): dt for dt in TF_TO_NUMPY.values() if dt.kind == "V" and dt.names is None}


def is_hdf5(path: str) -> bool:
    """True if ``path`` is a file starting with the HDF5 signature (at 0, 512, 1024, ...).

    Example:
        >>> is_hdf5("/nonexistent")
        False
    """
    try:
        with open(path, "rb") as f:
            offset = 0
            while True:
                f.seek(offset)
                head = f.read(8)
                if head == HDF5_SIGNATURE:
                    return True
                if len(head) < 8 or offset >= 1 << 16:
                    return False
                offset = 512 if offset == 0 else offset * 2
    except OSError:
        return False


_KERAS_WEIGHTS_MEMBER = "model.weights.h5"
#: config.json files larger than this are not parsed (entries keep their raw keys).
_CONFIG_LIMIT = 64 << 20


def is_keras_archive(path: str) -> bool:
    """True if ``path`` is a zip file holding ``model.weights.h5`` (a Keras 3 ``.keras`` file).

    Example:
        >>> is_keras_archive("/nonexistent")
        False
    """
    try:
        with zipfile.ZipFile(path) as z:
            return _KERAS_WEIGHTS_MEMBER in z.namelist()
    except (OSError, zipfile.BadZipFile, ValueError):
        return False


class _Window(io.RawIOBase):
    """A read-only, seekable view of ``length`` bytes of a file from ``start`` (for h5py)."""

    def __init__(self, path: str, start: int, length: int) -> None:
        super().__init__()
        self._f = open(path, "rb")
        self._start, self._length, self._pos = start, length, 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = 0) -> int:
        base = {0: 0, 1: self._pos, 2: self._length}[whence]
        self._pos = max(0, base + offset)
        return self._pos

    def readinto(self, buf: Any) -> int:
        n = max(0, min(len(buf), self._length - self._pos))
        if n == 0:
            return 0
        self._f.seek(self._start + self._pos)
        got = self._f.readinto(memoryview(buf)[:n])
        self._pos += got or 0
        return got or 0

    def close(self) -> None:
        self._f.close()
        super().close()


def _open_keras_member(path: str) -> Any:
    """A file object on ``model.weights.h5`` inside a ``.keras`` zip."""
    with zipfile.ZipFile(path) as z:
        info = z.getinfo(_KERAS_WEIGHTS_MEMBER)
        if info.compress_type != zipfile.ZIP_STORED:
            return io.BytesIO(z.read(info))
    with open(path, "rb") as f:  # stored: find the data after the local file header
        f.seek(info.header_offset)
        header = f.read(30)
        if len(header) != 30 or header[:4] != b"PK\x03\x04":
            raise zipfile.BadZipFile("bad local file header")
        name_len, extra_len = struct.unpack("<HH", header[26:30])
    return _Window(path, info.header_offset + 30 + name_len + extra_len, info.file_size)


def _archive_config(path: str) -> Any:
    """The parsed ``config.json`` of a ``.keras`` archive, or ``None`` if absent or malformed."""
    try:
        with zipfile.ZipFile(path) as z:
            if z.getinfo("config.json").file_size > _CONFIG_LIMIT:
                return None
            with z.open("config.json") as f:
                return json.loads(f.read(_CONFIG_LIMIT + 1))
    except (OSError, KeyError, ValueError, zipfile.BadZipFile, UnicodeDecodeError):
        return None


def _import_h5py() -> Any:
    try:
        import h5py
    except ImportError:  # pragma: no cover - h5py is a dependency
        raise CheckpointFormatError(
            "Reading Keras .h5 weights files needs the 'h5py' package: pip install h5py") from None
    return h5py


class H5Reader(CheckpointReader):
    """Reader of a Keras weights file (``.weights.h5``, legacy ``.h5``, or a ``.keras`` archive).

    Use :func:`ckptmerge.formats.open_checkpoint` rather than this class directly.

    Raises:
        CheckpointNotFoundError: if the file does not exist.
        CheckpointFormatError: if it is not a readable HDF5 file.

    Example:
        >>> with H5Reader("model.weights.h5") as r:  # doctest: +SKIP
        ...     r.get("layers/dense/vars/0").shape
        (12, 64)
    """

    format = "keras-h5"

    def __init__(self, path: str, *, verify: bool = True) -> None:
        super().__init__(path)
        self.verify = verify  # HDF5 has its own (optional) checksums; kept for symmetry
        self._lock = threading.Lock()
        self._file: Any = None
        self._raw: Any = None
        self._datasets: dict = {}
        self._archive = not is_hdf5(self.path) and is_keras_archive(self.path)
        if not os.path.exists(self.path):
            raise CheckpointNotFoundError(f"Keras weights file {self.path!r} does not exist.",
                                          path=self.path)
        f = self._open()
        infos: List[VariableInfo] = []
        h5py = _import_h5py()
        layer_names: dict = {}
        weight_names: dict = {}  # Keras 2 / legacy h5: dataset path -> the weight's own name

        def visit(name: str, obj: Any) -> None:
            if not isinstance(obj, h5py.Dataset):
                for w in obj.attrs.get("weight_names", ()) if "weight_names" in obj.attrs else ():
                    w = w.decode("utf-8", "replace") if isinstance(w, bytes) else str(w)
                    weight_names[f"{name}/{w}"] = normalize_name(w)
                if name == "vars" or name.endswith("/vars"):
                    layer = obj.attrs.get("name")
                    if isinstance(layer, bytes):
                        layer = layer.decode("utf-8", "replace")
                    if isinstance(layer, str):
                        layer_names[name[:-len("vars")].rstrip("/")] = layer
                return
            dt = self._dtype(obj)
            top = name.split("/", 1)[0]
            kind = KIND_OPTIMIZER if top in _OPTIMIZER_GROUPS else KIND_VARIABLE
            shape = tuple(int(d) for d in (obj.shape or ()))
            n = 1
            for d in shape:
                n *= d
            vname = normalize_name(name)
            self._datasets[vname] = name
            infos.append(VariableInfo(vname, shape, dtype_name(dt), name, kind, n * dt.itemsize))

        try:
            f.visititems(visit)
        except (OSError, RuntimeError, KeyError, ValueError) as e:
            raise self._error(f"cannot list its datasets ({e})") from None
        if len({i.name for i in infos}) != len(infos):  # "a:0" and "a" in one file
            infos = [VariableInfo(i.raw_key, i.shape, i.dtype, i.raw_key, i.kind, i.nbytes) for i in infos]
            self._datasets = {i.raw_key: i.raw_key for i in infos}
        legacy = {i.raw_key: weight_names[i.raw_key] for i in infos
                  if i.kind == KIND_VARIABLE and i.raw_key in weight_names}
        if legacy and len(set(legacy.values())) == len(legacy):  # Keras 2: by the weight's name
            infos = [VariableInfo(legacy.get(i.raw_key, i.name), i.shape, i.dtype, i.raw_key, i.kind,
                                  i.nbytes) for i in infos]
        if self._archive:  # a .keras archive: name entries as config.json and the file say
            named = archive_names([i.raw_key for i in infos], layer_names, _archive_config(self.path))
            infos = [VariableInfo(named.get(i.raw_key, i.name), i.shape, i.dtype, i.raw_key, i.kind, i.nbytes)
                     for i in infos]
        self._set_infos(infos)

    def _error(self, problem: str, key: Optional[str] = None) -> CheckpointFormatError:
        return CheckpointFormatError(
            f"Cannot read Keras weights file {os.path.basename(self.path)}: {problem}. The file "
            f"is corrupt or not an HDF5 weights file; re-copy it. (File: {self.path})",
            path=self.path, key=key)

    def _open(self) -> Any:
        if self._file is None:
            with self._lock:
                if self._file is None:
                    h5py = _import_h5py()
                    try:
                        if self._archive:
                            self._raw = _open_keras_member(self.path)
                            self._file = h5py.File(self._raw, "r")
                        else:
                            self._file = h5py.File(self.path, "r")
                    except (OSError, ValueError, KeyError, zipfile.BadZipFile) as e:
                        raise self._error(f"not an HDF5 file or damaged ({e})") from None
        return self._file

    @staticmethod
    def _dtype(ds: Any) -> np.dtype:
        dt = ds.dtype
        named = ds.attrs.get("dtype") if dt.kind == "V" else None
        if isinstance(named, bytes):
            named = named.decode("utf-8", "replace")
        if isinstance(named, str) and named in _NAMED_DTYPES and _NAMED_DTYPES[named].itemsize == dt.itemsize:
            return _NAMED_DTYPES[named]
        return dt

    def _read(self, info: VariableInfo) -> np.ndarray:
        f = self._open()
        try:
            ds = f[info.raw_key]
            dt = self._dtype(ds)
            with self._lock:
                value = ds[()]
        except (OSError, RuntimeError, KeyError, ValueError, TypeError) as e:
            raise self._error(f"cannot read dataset {info.raw_key!r} ({e})", info.raw_key) from None
        arr = np.asarray(value)
        if arr.dtype != dt and dt.kind == "V":
            arr = arr.view(dt)
        if arr.dtype.kind in "SU":  # fixed-length strings -> object array of bytes, like TF
            flat = [x if isinstance(x, bytes) else str(x).encode("utf-8") for x in arr.reshape(-1).tolist()]
            arr = np.array(flat + [None], dtype=object)[:-1].reshape(arr.shape)
        return np.array(arr, copy=True, order="C")

    def close(self) -> None:
        """Close the HDF5 file (reading again reopens it)."""
        with self._lock:
            f, self._file = self._file, None
            raw, self._raw = self._raw, None
        for obj in (f, raw):
            if obj is not None:
                try:
                    obj.close()
                except Exception:  # pragma: no cover
                    pass
