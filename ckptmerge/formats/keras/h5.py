"""Read Keras weights files (Keras 3 ``.weights.h5`` and ``.keras``, Keras 2 ``.h5``) with h5py.

Every HDF5 dataset is one tensor, named by its path in the file as is: Keras 3 writes
``layers/dense/vars/0`` and ``optimizer/vars/3``; Keras 2 ``save_weights`` writes
``dense/dense/kernel:0`` (the ``:0`` is dropped). Datasets under a top-level ``optimizer`` or
``optimizer_weights`` group are optimizer state. Keras 3 stores ``bfloat16`` (and other
``ml_dtypes`` types) as opaque bytes with a ``dtype`` attribute; those are viewed back as their
real dtype. A Keras 3 ``.keras`` archive is a zip holding ``model.weights.h5``; it is read in
place (stored members through a window on the zip file; compressed ones are streamed into an
anonymous temporary file, at most :data:`MAX_EXPANSION` times their compressed size), and its
entries are named by their variables' paths (:mod:`ckptmerge.formats.keras.names`). Keras 2 /
legacy files are named by each weight's name as their ``weight_names`` attributes record it.

Files are untrusted. Nothing outside the named file is read: a file with external raw storage,
a virtual dataset, a soft, external or user-defined link, or a filter HDF5 would load as a
plugin is refused when it is opened (:class:`~ckptmerge.core.errors.UnsafeCheckpointError`, every
problem listed). Before a dataset is read, its declared size is checked against the bytes the
file stores for it, so never-written chunks and decompression bombs are refused rather than
allocated. Datasets that are not tensors (compound, reference, opaque, array, variable-length,
null dataspace) are listed with an ``hdf5-*`` dtype and raise a clear error when read. ``h5py``
is imported only when a file is opened; TensorFlow never.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import itertools
import json
import math
import os
import shutil
import struct
import tempfile
import threading
import zipfile
from typing import Any, Dict, Iterator, List, Optional, Tuple

import numpy as np

from ckptmerge.core import limits
from ckptmerge.core.errors import (
    CheckpointFormatError,
    CheckpointNotFoundError,
    CkptMergeError,
    UnreadableTensorError,
    UnsafeCheckpointError,
    format_list,
)
from ckptmerge.formats.base import CheckpointReader, aligned_empty, shape_problem
from ckptmerge.formats.dtypes import TF_DTYPE_NAMES, ML_ITEMSIZE, LazyDtypes, dtype_name
from ckptmerge.formats.io import storage
from ckptmerge.formats.io.fileio import pread_into
from ckptmerge.formats.keras.names import archive_names
from ckptmerge.formats.ranges import TensorRanges
from ckptmerge.formats.io.zipmembers import MAX_EXPANSION, check_member, member_errors, open_member
from ckptmerge.core.redact import get_logger
from ckptmerge.core.specs import KIND_OPTIMIZER, KIND_VARIABLE, VariableInfo, normalize_name
from ckptmerge.core.text import escape_name, human_bytes, plural

__all__ = ["H5Reader", "HDF5_SIGNATURE", "MAX_EXPANSION", "LegacyLayout", "is_hdf5", "is_keras_archive",
           "list_attr"]

logger = get_logger(__name__)

#: The 8 bytes every HDF5 superblock starts with.
HDF5_SIGNATURE = b"\x89HDF\r\n\x1a\n"
_OPTIMIZER_GROUPS = ("optimizer", "optimizer_weights")
# The ml_dtypes types TensorFlow knows, by name (made on first use: ml_dtypes is imported only then).
_NAMED_DTYPES = LazyDtypes({}, {n: n for n in TF_DTYPE_NAMES.values() if n in ML_ITEMSIZE})
# Those Keras stores as opaque bytes with a 'dtype' attribute, and their item sizes: every one but
# float8_e5m2, which numpy sees as a float (known by name, so listing a file never imports ml_dtypes).
_OPAQUE_ITEMSIZE = {n: ML_ITEMSIZE[n] for n in _NAMED_DTYPES.named().values() if n != "float8_e5m2"}


def _opaque_name(ds: Any) -> Optional[str]:
    """The ml_dtypes type name Keras recorded for dataset ``ds`` if it holds such opaque values (a
    ``V<n>`` type with a ``dtype`` attribute naming a type of ``n`` bytes), else ``None``; nothing
    but the attribute is read, and ml_dtypes is not imported."""
    raw = ds.dtype
    if raw.kind != "V" or raw.names is not None or raw.subdtype is not None:
        return None
    named = ds.attrs.get("dtype")
    if isinstance(named, bytes):
        named = named.decode("utf-8", "replace")
    return named if isinstance(named, str) and _OPAQUE_ITEMSIZE.get(named) == raw.itemsize else None


def _dtype_label(ds: Any) -> str:
    """The dtype name ckptmerge lists dataset ``ds`` under (``"bfloat16"``, ``"float32"``), without
    ml_dtypes: dtype names are strings until values are decoded."""
    return _opaque_name(ds) or dtype_name(ds.dtype)

# MAX_EXPANSION (from zipmembers, one bound for every compressed thing ckptmerge reads): a
# compressed dataset may hold at most this many times the bytes it occupies in the file. Weights
# compress far less (float32 about 1.1x); only near-constant data (or a decompression bomb) goes
# beyond. Rewrite such a trusted file uncompressed (``h5repack -f NONE in.h5 out.h5``) to read it.
# Below this size a dataset is never refused for its size (e.g. a small never-written one).
_SMALL = 1 << 20
# Filters HDF5 or h5py provide themselves; any other is loaded as a plugin from outside the file.
_BUILTIN_FILTERS = {1: "deflate", 2: "shuffle", 3: "fletcher32", 4: "szip", 5: "nbit",
                    6: "scaleoffset", 32000: "lzf"}
_FIX_UNSAFE = ("If you trust the file and everything it points to, write a self-contained copy "
               "(read each dataset with h5py and write it to a new file) and pass that copy.")


def is_hdf5(path: str) -> bool:
    """True if ``path`` is a file starting with the HDF5 signature (at 0, 512, 1024, ...).

    Example:
        >>> is_hdf5("/nonexistent")
        False
    """
    try:
        with storage.open_binary(path, storage.SNIFF_BLOCK) as f:
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
        with storage.open_zip(path, storage.SNIFF_BLOCK) as z:
            return _KERAS_WEIGHTS_MEMBER in z.namelist()
    except (OSError, zipfile.BadZipFile, ValueError):
        return False


class _Window(io.RawIOBase):
    """A read-only, seekable view of ``length`` bytes of a file from ``start`` (for h5py)."""

    def __init__(self, path: str, start: int, length: int) -> None:
        super().__init__()
        self._f = storage.open_binary(path)
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


def _open_keras_member(path: str) -> Tuple[Any, int]:
    """A file object on ``model.weights.h5`` inside a ``.keras`` zip, and its size in bytes.

    A stored member is read in place; a compressed one is streamed into an anonymous temporary
    file (never memory). Either is first checked by :func:`~ckptmerge.formats.io.zipmembers.check_member`
    (not encrypted, a method ckptmerge decompresses, at most :data:`MAX_EXPANSION` times its
    compressed size).
    """
    size = storage.getsize(path)
    with storage.open_zip(path) as z:
        info = z.getinfo(_KERAS_WEIGHTS_MEMBER)
        check_member(info, path, size)
        if info.compress_type != zipfile.ZIP_STORED:
            tmp = tempfile.TemporaryFile(prefix="ckptmerge-keras-")
            try:
                # zipfile yields at most the declared file_size bytes and checks the CRC at the end
                with open_member(z, info, path) as member, member_errors(path, _KERAS_WEIGHTS_MEMBER):
                    shutil.copyfileobj(member, tmp, 1 << 18)
                tmp.seek(0)
            except BaseException:
                tmp.close()
                raise
            return tmp, info.file_size
    with storage.open_binary(path) as f:  # stored: find the data after the local file header
        f.seek(info.header_offset)
        header = f.read(30)
        if len(header) != 30 or header[:4] != b"PK\x03\x04":
            raise zipfile.BadZipFile("bad local file header")
        name_len, extra_len = struct.unpack("<HH", header[26:30])
    return _Window(path, info.header_offset + 30 + name_len + extra_len, info.file_size), info.file_size


def _archive_config(path: str) -> Any:
    """The parsed ``config.json`` of a ``.keras`` archive, or ``None`` if absent or malformed.

    Untrusted like the rest: one larger than ``_CONFIG_LIMIT``, compressed more than
    :data:`MAX_EXPANSION` times, or nested too deeply to parse is ignored (with a warning), and
    the entries keep their raw keys.
    """
    try:
        with storage.open_zip(path) as z:
            info = z.getinfo("config.json")
            try:
                if info.file_size > _CONFIG_LIMIT:
                    raise CheckpointFormatError("too large")
                with open_member(z, info, path) as f, member_errors(path, "config.json"):
                    raw = f.read(_CONFIG_LIMIT + 1)
            except CheckpointFormatError as e:
                logger.warning("Ignoring config.json of %s: it declares %s (%s compressed)%s; entries keep "
                               "their raw keys.", path, human_bytes(info.file_size),
                               human_bytes(info.compress_size), "" if str(e) == "too large" else f" ({e})")
                return None
        return json.loads(raw)
    except RecursionError:
        logger.warning("Ignoring config.json of %s: nested too deeply to parse; entries keep their "
                       "raw keys.", path)
        return None
    except (OSError, KeyError, ValueError, zipfile.BadZipFile, UnicodeDecodeError):
        return None


def _import_h5py() -> Any:
    try:
        import h5py
    except ImportError:  # pragma: no cover - h5py is a dependency
        raise CheckpointFormatError(
            "Reading Keras .h5 weights files needs the 'h5py' package: pip install h5py") from None
    return h5py


def _link_problems(f: Any, h5py: Any) -> List[Tuple[str, str]]:
    """``(path, problem)`` for every link of the file other than a plain (hard) link."""
    problems: List[Tuple[str, str]] = []
    links = f.id.links

    def visit(name: bytes, info: Any) -> None:
        text = name.decode("utf-8", "replace")
        if info.type == h5py.h5l.TYPE_HARD:
            return None
        if info.type == h5py.h5l.TYPE_SOFT:
            target = links.get_val(name).decode("utf-8", "replace")
            problems.append((text, f"{text!r} is a soft link (to {target!r})"))
        elif info.type == h5py.h5l.TYPE_EXTERNAL:
            other, where = (x.decode("utf-8", "replace") for x in links.get_val(name))
            problems.append((text, f"{text!r} is an external link (to {where!r} in file {other!r})"))
        else:
            problems.append((text, f"{text!r} is a user-defined link (HDF5 link type {info.type})"))
        return None

    links.visit(visit, info=True)
    return problems


def _storage_problem(name: str, ds: Any, h5py: Any) -> Optional[str]:
    """Why the dataset's values would come from outside the file, or None."""
    dcpl = ds.id.get_create_plist()
    if dcpl.get_layout() == h5py.h5d.VIRTUAL:
        return f"{name!r} is a virtual dataset (its values come from other datasets or files)"
    n_ext = dcpl.get_external_count()
    if n_ext:
        files = [dcpl.get_external(i)[0].decode("utf-8", "replace") for i in range(n_ext)]
        return f"{name!r} keeps its values in external file(s) {format_list(files)}"
    for i in range(dcpl.get_nfilters()):
        code = dcpl.get_filter(i)[0]
        if code not in _BUILTIN_FILTERS:
            return (f"{name!r} uses HDF5 filter {code}, which HDF5 would load as a plugin (a "
                    "shared library from outside the file)")
    return None


def _not_a_tensor(ds: Any, h5py: Any) -> Optional[Tuple[str, str]]:
    """``(dtype name, why)`` for a dataset that holds no tensor values, else None."""
    if ds.id.get_space().get_simple_extent_type() == h5py.h5s.NULL:
        return "hdf5-empty", "it has a null dataspace (h5py.Empty): no shape and no values"
    raw = ds.dtype
    ref = h5py.check_dtype(ref=raw)
    if ref is not None:
        what = "region references" if ref is h5py.RegionReference else "object references"
        return "hdf5-reference", f"its values are HDF5 {what} (addresses inside the file), not numbers"
    vlen = h5py.check_dtype(vlen=raw)
    if raw.kind == "O" and vlen not in (bytes, str):
        return "hdf5-vlen", "its values are variable-length sequences, not a tensor"
    if raw.subdtype is not None:
        return "hdf5-array", f"its elements are HDF5 arrays of shape {raw.subdtype[1]}, not scalars"
    if raw.names is not None:
        return "hdf5-compound", f"it has an HDF5 compound type (fields {format_list(list(raw.names))})"
    if raw.kind == "V" and _opaque_name(ds) is None:
        return ("hdf5-opaque", f"it holds opaque {raw.itemsize}-byte values without the 'dtype' "
                "attribute Keras writes for bfloat16 and other ml_dtypes types")
    return None


def list_attr(obj: Any, name: str) -> List[str]:
    """A list-of-strings attribute as Keras's legacy format writes it: ``name``, or split into
    ``name0``, ``name1``, ... when it outgrew HDF5's 64 KB attribute limit."""
    attrs = obj.attrs
    if name in attrs:
        raw = [attrs[name]]
    else:
        raw, i = [], 0
        while f"{name}{i}" in attrs and i < 1 << 16:
            raw.append(attrs[f"{name}{i}"])
            i += 1
    out = []
    for chunk in raw:
        for w in (chunk if isinstance(chunk, (list, tuple, np.ndarray)) else [chunk]):
            out.append(w.decode("utf-8", "replace") if isinstance(w, bytes) else str(w))
    return out


@dataclasses.dataclass(frozen=True)
class LegacyLayout:
    """What a Keras 2 / legacy ``.h5`` weights file says of its layers, in the file's order.

    Attributes:
        layers: ``(layer name, dataset keys in weight_names order)`` per entry of
            ``layer_names`` (layers without weights have no keys).
        top: the keys of ``top_level_model_weights`` (a subclassed model's own weights).
        has_top: whether the file has a ``top_level_model_weights`` group (Keras then checks
            the model's own weights against it, even when it is empty).
    """

    layers: Tuple[Tuple[str, Tuple[str, ...]], ...]
    top: Tuple[str, ...] = ()
    has_top: bool = False


def _legacy_layout(f: Any, datasets: Any) -> Optional[LegacyLayout]:
    """The :class:`LegacyLayout` of a legacy file (its root or ``model_weights`` group lists
    ``layer_names``), or ``None`` (a Keras 3 file, or one whose lists name missing datasets)."""
    group, prefix = f, ""
    if "model_weights" in f and not list_attr(f, "layer_names"):
        group, prefix = f["model_weights"], "model_weights/"
    try:
        names = list_attr(group, "layer_names")
        if not names:
            return None
        layers = []
        for name in names:
            sub = group.get(name)
            if sub is None or isinstance(sub, _import_h5py().Dataset):
                return None
            layers.append((name, tuple(f"{prefix}{name}/{w}" for w in list_attr(sub, "weight_names"))))
        top_group = group.get("top_level_model_weights")
        top = tuple(f"{prefix}top_level_model_weights/{w}" for w in list_attr(top_group, "weight_names")) \
            if top_group is not None else ()
    except (OSError, RuntimeError, KeyError, ValueError, TypeError):
        return None
    if any(k not in datasets for _, keys in layers for k in keys) or any(k not in datasets for k in top):
        return None
    return LegacyLayout(tuple(layers), top, top_group is not None)


class H5Reader(CheckpointReader):
    """Reader of a Keras weights file (``.weights.h5``, legacy ``.h5``, or a ``.keras`` archive).

    Use :func:`ckptmerge.formats.open_checkpoint` rather than this class directly.

    Attributes:
        legacy: a Keras 2 / legacy file's :class:`LegacyLayout` (layers in the file's order,
            each with its weights in ``weight_names`` order), else ``None``.
        layer_names: a Keras 3 file's ``{object path: layer name}``, from the ``name`` each
            ``vars`` group records (``{"layers/dense": "head"}``).

    Raises:
        CheckpointNotFoundError: if the file does not exist.
        CheckpointFormatError: if it is not a readable HDF5 file.
        UnsafeCheckpointError: if it would make ckptmerge read outside the file (external
            storage, virtual datasets, soft/external/user-defined links, plugin filters).

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
        self._size = 0  # bytes of the HDF5 file (the member of a .keras archive)
        self._datasets: dict = {}
        self._not_tensors: Dict[str, str] = {}  # dataset path -> why it holds no tensor
        self._archive = not is_hdf5(self.path) and is_keras_archive(self.path)
        if not storage.exists(self.path):
            raise CheckpointNotFoundError(f"Keras weights file {self.path!r} does not exist.",
                                          path=self.path)
        f = self._open()
        infos: List[VariableInfo] = []
        h5py = _import_h5py()
        problems: List[Tuple[str, str]] = []
        layer_names: dict = {}
        weight_names: dict = {}  # Keras 2 / legacy h5: dataset path -> the weight's own name
        bad_shapes: List[Tuple[str, Optional[str]]] = []  # (dataset path, why no array has its shape)

        def visit(name: str, obj: Any) -> None:
            if not isinstance(obj, h5py.Dataset):
                for w in list_attr(obj, "weight_names"):
                    weight_names[f"{name}/{w}"] = normalize_name(w)
                if name == "vars" or name.endswith("/vars"):
                    layer = obj.attrs.get("name")
                    if isinstance(layer, bytes):
                        layer = layer.decode("utf-8", "replace")
                    if isinstance(layer, str):
                        layer_names[name[:-len("vars")].rstrip("/")] = layer
                return
            problem = _storage_problem(name, obj, h5py)
            if problem is not None:
                problems.append((name, problem))
                return
            top = name.split("/", 1)[0]
            kind = KIND_OPTIMIZER if top in _OPTIMIZER_GROUPS else KIND_VARIABLE
            odd = _not_a_tensor(obj, h5py)
            shape = () if obj.shape is None else tuple(int(d) for d in obj.shape)
            nbytes = 0 if obj.shape is None else math.prod(shape) * obj.dtype.itemsize
            if odd is not None:
                self._not_tensors[name] = odd[1]
            elif shape_problem(shape, obj.dtype.itemsize):
                bad_shapes.append((name, shape_problem(shape, obj.dtype.itemsize)))
            vname = normalize_name(name)
            self._datasets[vname] = name
            infos.append(VariableInfo(vname, shape, odd[0] if odd else _dtype_label(obj), name, kind, nbytes))

        try:
            problems.extend(_link_problems(f, h5py))
            f.visititems(visit)
        except (OSError, RuntimeError, KeyError, ValueError, TypeError) as e:
            self.close()
            raise self._error(f"cannot list its datasets ({e})") from None
        if problems:
            self.close()
            lines = [p for _, p in problems]
            more = f" ... and {len(lines) - 5} more" if len(lines) > 5 else ""
            raise UnsafeCheckpointError(
                f"Refusing to read Keras weights file {self.path!r}: ckptmerge reads nothing outside "
                f"the file you name, and {plural(len(lines), 'entry', 'entries')} would make it: "
                f"{'; '.join(lines[:5])}{more}. {_FIX_UNSAFE}",
                path=self.path, key=problems[0][0], problems=lines)
        if bad_shapes:  # refused when listed, as every reader does (never listed, then refused when read)
            self.close()
            key, problem = bad_shapes[0]
            raise self._error(f"dataset {key!r} {problem}", key)
        if len({i.name for i in infos}) != len(infos):  # "a:0" and "a" in one file
            infos = [VariableInfo(i.raw_key, i.shape, i.dtype, i.raw_key, i.kind, i.nbytes) for i in infos]
            self._datasets = {i.raw_key: i.raw_key for i in infos}
        legacy = {i.raw_key: weight_names[i.raw_key] for i in infos
                  if i.kind == KIND_VARIABLE and i.raw_key in weight_names}
        if legacy and len(set(legacy.values())) == len(legacy):  # Keras 2: by the weight's name
            infos = [VariableInfo(legacy.get(i.raw_key, i.name), i.shape, i.dtype, i.raw_key, i.kind,
                                  i.nbytes) for i in infos]
        self.legacy = _legacy_layout(f, {i.raw_key for i in infos})
        self.layer_names: Dict[str, str] = layer_names
        if self._archive:  # a .keras archive: name entries as config.json and the file say
            named = archive_names([i.raw_key for i in infos], layer_names, _archive_config(self.path))
            infos = [VariableInfo(named.get(i.raw_key, i.name), i.shape, i.dtype, i.raw_key, i.kind, i.nbytes)
                     for i in infos]
        self._set_infos(infos)

    def _error(self, problem: str, key: Optional[str] = None) -> CheckpointFormatError:
        return CheckpointFormatError(
            f"Cannot read Keras weights file {escape_name(storage.basename(self.path))}: {problem}. The file "
            f"is corrupt or not an HDF5 weights file; re-copy it. (File: {escape_name(self.path)})",
            path=self.path, key=key)

    def _open(self) -> Any:
        if self._file is None:
            with self._lock:
                if self._file is None:
                    h5py = _import_h5py()
                    try:
                        if self._archive:
                            self._raw, self._size = _open_keras_member(self.path)
                            self._file = h5py.File(self._raw, "r")
                        elif storage.is_url(self.path):  # h5py reads through a block-cached remote file
                            self._raw = storage.open_binary(self.path)
                            self._size = self._raw.size
                            self._file = h5py.File(self._raw, "r")
                        else:
                            self._size = os.path.getsize(self.path)
                            self._file = h5py.File(self.path, "r")
                    except CkptMergeError:
                        raise
                    except (OSError, ValueError, KeyError, zipfile.BadZipFile) as e:
                        limits.check(e, self.path)
                        raise self._error(f"not an HDF5 file or damaged ({e})") from None
        return self._file

    def _dtype(self, ds: Any) -> np.dtype:
        """The dtype of dataset ``ds``'s values: its own, or the ml_dtypes type of its opaque
        bytes (imported here, when values are read)."""
        named = _opaque_name(ds)
        if named is None:
            return ds.dtype
        dt = _NAMED_DTYPES.get(named)
        if dt is None or dt.itemsize != ds.dtype.itemsize:  # (an older ml_dtypes than ckptmerge knows)
            key = ds.name.lstrip("/")
            raise CheckpointFormatError(
                f"Cannot read dataset {key!r} of Keras weights file {escape_name(self.path)}: it holds {named} "
                "values, which the installed ml_dtypes does not have. Upgrade it: pip install -U ml_dtypes",
                path=self.path, key=key)
        return dt

    def _check_size(self, ds: Any, info: VariableInfo) -> None:
        """Refuse a dataset that declares far more bytes than the file stores for it."""
        if info.nbytes <= _SMALL:
            return
        h5py = _import_h5py()
        dcpl = ds.id.get_create_plist()
        stored = ds.id.get_storage_size()
        offset = ds.id.get_offset()  # None unless contiguous and written
        compressed = dcpl.get_layout() == h5py.h5d.CHUNKED and dcpl.get_nfilters() > 0
        budget = stored * (MAX_EXPANSION if compressed else 1)
        what = (f"dataset {info.raw_key!r} declares shape {info.shape} of {info.dtype} "
                f"({human_bytes(info.nbytes)})")
        problem = fix = ""
        if stored > self._size or (offset is not None and offset + stored > self._size):
            problem = (f"{what} stored in {human_bytes(stored)}, past the end of the "
                       f"{human_bytes(self._size)} file")
            fix = "The file is truncated or corrupt; re-copy it."
        elif info.nbytes > budget and compressed and stored:
            problem = (f"{what} compressed into {human_bytes(stored)}, more than the "
                       f"{MAX_EXPANSION}x expansion ckptmerge accepts (a decompression bomb?)")
            fix = ("If you trust the file, rewrite it uncompressed ('h5repack -f NONE in.h5 "
                   "out.h5') and pass that.")
        elif info.nbytes > budget:
            problem = (f"{what} but the file stores only {human_bytes(stored)} of it (the rest was "
                       "never written: HDF5 would fill it in)")
            fix = "Reading it would allocate memory the file does not justify; re-save the weights."
        if problem:
            raise UnsafeCheckpointError(
                f"Refusing to read Keras weights file {self.path!r}: {problem}. {fix}",
                path=self.path, key=info.raw_key, problems=[problem])

    def _checked(self, info: VariableInfo) -> None:
        """Raise unless dataset ``info`` holds tensor values the file justifies (nothing is read)."""
        key = info.raw_key
        why = self._not_tensors.get(key)
        if why is not None:
            raise UnreadableTensorError(
                f"Cannot read dataset {key!r} of Keras weights file {self.path!r}: {why}. ckptmerge "
                f"lists it (dtype {info.dtype!r}) but cannot show, compare or merge its values; "
                "leave it out of merges and restores.", path=self.path, key=key)
        f = self._open()
        with self._h5_errors(key), self._lock:
            self._check_size(f[key], info)

    def _load(self, info: VariableInfo, sel: Tuple[Any, ...] = ()) -> np.ndarray:
        """Read dataset ``info`` (or the part ``sel`` selects) once, into the array returned."""
        f = self._open()
        with self._h5_errors(info.raw_key), self._lock:
            return self._values(f[info.raw_key], sel)

    @contextlib.contextmanager
    def _h5_errors(self, key: str) -> Iterator[None]:
        try:
            yield
        except CkptMergeError:
            raise
        except (OSError, RuntimeError, KeyError, ValueError, TypeError) as e:
            raise self._error(f"cannot read dataset {key!r} ({e})", key) from None

    def _read(self, info: VariableInfo) -> np.ndarray:
        self._checked(info)
        return self._load(info)

    def _iter_chunks(self, info: VariableInfo, max_elements: int) -> Iterator[np.ndarray]:
        """Pieces read one hyperslab at a time: memory for one piece, whatever the dataset's size."""
        self._checked(info)
        if info.size <= max_elements or info.dtype == "string":
            return super()._iter_chunks(info, max_elements)
        return self._pieces(info, max_elements)

    def ranges(self, name: str) -> Optional[TensorRanges]:
        """A numeric dataset stored contiguously in a local weights file as
        :class:`~ckptmerge.formats.ranges.TensorRanges`, read with ``preadv`` from HDF5's own
        descriptor of the file at the dataset's offset (HDF5 keeps no checksum of it); ``None``
        for chunked or compressed datasets, strings, big-endian values, files with a user block
        or opened through another HDF5 file driver than ``sec2`` (``HDF5_DRIVER``), ``.keras``
        archives and URLs (use :meth:`iter_chunks`). Raises as :meth:`get` for a
        dataset that holds no tensor or that the file does not justify.

        Example:
            >>> r = reader.ranges("layers/dense/vars/0")                   # doctest: +SKIP
        """
        info = self.info(name)
        if self._archive or storage.is_url(self.path) or info.dtype == "string" or not info.size:
            return None
        self._checked(info)
        h5py = _import_h5py()
        f = self._open()
        key = info.raw_key
        with self._h5_errors(key), self._lock:
            ds = f[key]
            raw, dt = ds.dtype, self._dtype(ds)
            dcpl = ds.id.get_create_plist()
            offset = ds.id.get_offset()  # None unless contiguous and written
            plain = (raw.kind in "fiu" and not raw.metadata and raw.byteorder in "=|<" and np.little_endian
                     or raw.kind == "V" and dt.kind == "V" and raw.itemsize == dt.itemsize)
            if (not plain or offset is None or dcpl.get_layout() != h5py.h5d.CONTIGUOUS or f.driver != "sec2"
                    or f.userblock_size or ds.id.get_storage_size() != info.nbytes
                    or offset + info.nbytes > self._size):
                return None
        dt = dt.newbyteorder("=") if dt.kind != "V" else dt

        def fd() -> int:
            return self._open().id.get_vfd_handle()  # (the very file HDF5 read the layout from)

        def fill(start: int, view: memoryview) -> None:
            try:
                got = pread_into(fd(), offset + start, view)
            except OSError as e:
                raise self._error(f"cannot read dataset {key!r} ({e})", key) from None
            if got < len(view):
                raise self._error(f"the file ended early while reading dataset {key!r} ({got} of {len(view)} "
                                  f"bytes at offset {offset + start}); it was truncated after it was opened", key)

        return TensorRanges(dt, info.size, fill, locate=lambda: (fd(), offset))

    def _pieces(self, info: VariableInfo, max_elements: int) -> Iterator[np.ndarray]:
        shape = info.shape
        axis, inner = len(shape) - 1, 1  # trailing axes after `axis` fit whole in one piece
        while axis > 0 and inner * shape[axis] <= max_elements:
            inner *= shape[axis]
            axis -= 1
        rows = max(1, max_elements // inner)  # blocks of `rows` along `axis`; earlier axes one by one
        for prefix in itertools.product(*(range(d) for d in shape[:axis])):
            for start in range(0, shape[axis], rows):
                yield self._load(info, prefix + (slice(start, min(start + rows, shape[axis])),)).reshape(-1)

    def _values(self, ds: Any, sel: Tuple[Any, ...] = ()) -> np.ndarray:
        """Dataset ``ds`` (or the part ``sel`` selects: indices, then one slice) as a fresh
        C-contiguous array, read once into its final buffer."""
        raw, dt = ds.dtype, self._dtype(ds)
        if raw.kind in "OSU":  # strings -> object array of bytes, like TF
            arr = np.asarray(ds[sel] if sel else ds[()])
            if arr.dtype.kind in "SU":
                flat = [x if isinstance(x, bytes) else str(x).encode("utf-8") for x in arr.reshape(-1).tolist()]
                arr = np.array(flat + [None], dtype=object)[:-1].reshape(arr.shape)
            return arr
        shape = ds.shape
        if sel:
            last = sel[-1]
            shape = (last.stop - last.start,) + tuple(shape[len(sel):])
        # native byte order: HDF5 converts big-endian data while reading, no second copy
        out = aligned_empty(shape, raw if raw.kind == "V" else raw.newbyteorder("="))
        if out.size:
            ds.read_direct(out, sel or None)
        if out.dtype.metadata:  # h5py's enum (and bool) marker: plain integers from here on
            out = out.view(np.dtype(out.dtype.str))
        return out.view(dt) if dt.kind == "V" else out

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
