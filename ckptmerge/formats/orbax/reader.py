"""Read Orbax checkpoints (JAX, Flax, MaxText, t5x, Keras's OrbaxCheckpoint) without JAX.

An Orbax step folder holds ``_CHECKPOINT_METADATA`` and one folder per *item* (``state``,
``pytree``, ``model_config``, ...); a checkpoint saved with a bare ``Checkpointer`` is a single
item folder itself. A PyTree item keeps ``_METADATA``, a JSON tree of the arrays' tree paths and
value types with the flags ``use_ocdbt`` and ``use_zarr3``, and the array data in one of:

- an OCDBT database (``manifest.ocdbt``, ``d/``, ``ocdbt.process_N/``) of zarr3 arrays (Orbax
  V1's default) or of zarr v2 arrays;
- one zarr (v2 or v3) folder per array (``use_ocdbt=False``);
- the old msgpack aggregate file ``checkpoint`` (before ``_METADATA``): small values inline,
  the others as ``PLACEHOLDER://name`` pointing at zarr folders.

ckptmerge parses the JSON (and msgpack) itself, checks it, and lets ``tensorstore`` decode the
arrays (the ``[orbax]`` extra). Each array's TensorStore key is its tree path joined with ``.``
(Orbax's param name); ckptmerge's name for it is the tree path joined with ``/``
(``params/Dense_0/kernel``), with the item's name first when the step has several items
(``state/params/Dense_0/kernel``). Optimizer state (``opt_state``, ``optimizer_variables``, ...) is
kind ``"optimizer"``, step counters and metrics ``"bookkeeping"``. A step written by Keras's
``OrbaxCheckpoint`` (the items ``pytree`` and ``model_config``) names its model variables by their
Keras ``variable.path``, as ``model.load_weights(orbax_dir)`` matches them.

Untrusted input: every param name must stay inside its item folder (no ``..``, no absolute
paths, no symbolic links below a local checkpoint); each array's zarr metadata is checked
(shape, dtype, chunks, only the codecs Orbax and zarr use with bounded expansion) and must
agree with ``_METADATA``; no array may declare more bytes than its stored data could expand to
(:data:`MAX_EXPANSION`) or a shape no array can have (the shared check of every reader); a
missing chunk is an error, never zeros, where ``_METADATA`` says every chunk was stored
(``store_array_data_equal_to_fill_value``, what Orbax writes today); older checkpoints left out
chunks equal to the fill value, and those read as it, as Orbax restores them. Old msgpack files
are read whole, with every inline array's size checked. Reads go per tensor, and :meth:`iter_chunks`
reads one stored chunk row at a time. Which folders are steps and items, and what each leaf is,
is :mod:`ckptmerge.formats.orbax.layout`.
"""

from __future__ import annotations

import json
import math
import os
import re
import stat
import threading
from typing import Any, Dict, Iterator, List, Optional, Tuple

import numpy as np

from ckptmerge.core.errors import CheckpointFormatError, CheckpointNotFoundError, UnsafeCheckpointError
from ckptmerge.formats.io import storage
from ckptmerge.formats.base import CheckpointReader, aligned_empty, shape_problem
from ckptmerge.formats.dtypes import dtype_name
from ckptmerge.formats.orbax.ocdbt import OcdbtUnsupported, read_keys
from ckptmerge.formats.orbax.aggregate import checked_dtype_name, numpy_dtype_named, parse_aggregate
from ckptmerge.formats.orbax.bridge import safe_key
from ckptmerge.formats.orbax.layout import (
    AGGREGATE_FILE,
    CHECKPOINT_METADATA_FILE,
    METADATA_FILE,
    NOT_ARRAYS,
    is_keras_state,
    item_folders,
    keras_name,
    kind_of_path,
)
from ckptmerge.formats.orbax.store import Location, load_tensorstore, not_a_checkpoint_file, wait
from ckptmerge.core.redact import get_logger
from ckptmerge.core.specs import VariableInfo
from ckptmerge.core.text import escape_name, quote_name

__all__ = ["OrbaxReader", "MAX_EXPANSION"]

logger = get_logger(__name__)

#: The most bytes one stored byte may decode to: zstd's bound (an RLE block: 4 bytes for 128 KiB)
#: is the largest of the codecs allowed; DEFLATE's is about 1032.
MAX_EXPANSION = 1 << 15
_SLACK = 1 << 16  # tiny arrays: headers and padding make the ratio meaningless below this
_MAX_ZARR_METADATA = 1 << 24  # one array's zarr.json or .zarray (a few hundred bytes in practice)

_ARRAY_TYPES = {"jax.Array", "np.ndarray", "scalar"}
_ZARR2_COMPRESSORS = {"zstd", "zlib", "gzip", "blosc"}
_ZARR3_CODECS = {"sharding_indexed", "bytes", "zstd", "gzip", "blosc", "crc32c", "transpose"}


#: The dtypes TensorStore's zarr drivers decode (so ckptmerge reads): zarr v2 type strings
#: (one-byte types with any byte order, the others little- or big-endian) and zarr3 names, plus the
#: ml_dtypes names both accept. ``<f16`` (long double), ``<c32``, native-order ``=f4`` and the
#: ml_dtypes types TensorStore lacks (``float8_e4m3``, ``float6_*``, ``uint4``, ``uint2``) are not.
_ZARR2_TYPESTR = re.compile(r"^(?:[<>|][biu]1|[<>](?:[iu][248]|f[248]|c8|c16))$")
_ZARR3_NAMES = frozenset(("bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
                          "float16", "float32", "float64", "complex64", "complex128"))
_TS_ML_NAMES = frozenset(("bfloat16", "float8_e3m4", "float8_e4m3fn", "float8_e4m3fnuz", "float8_e4m3b11fnuz",
                          "float8_e5m2", "float8_e5m2fnuz", "float8_e8m0fnu", "float4_e2m1fn", "int2", "int4"))


def _ts_reads_dtype(driver: str, field: str) -> bool:
    """Whether TensorStore's ``driver`` (``zarr`` or ``zarr3``) decodes arrays of dtype ``field``."""
    if field in _TS_ML_NAMES:
        return True
    return bool(_ZARR2_TYPESTR.match(field)) if driver == "zarr" else field in _ZARR3_NAMES


def _chunk_key_depth(driver: str, meta: dict, ndim: int) -> int:
    """How many path parts a chunk key of this zarr array has (``0.0``: 1; ``c/0/0``: 3)."""
    if driver == "zarr":
        return 1 if meta.get("dimension_separator", ".") == "." else max(ndim, 1)
    enc = meta.get("chunk_key_encoding")
    enc = enc if isinstance(enc, dict) else {}
    conf = enc.get("configuration") if isinstance(enc.get("configuration"), dict) else {}
    if enc.get("name") == "v2":
        return 1 if conf.get("separator", ".") == "." else max(ndim, 1)
    return ndim + 1 if conf.get("separator", "/") == "/" else 1


def _newer(loc: Location, problem: str) -> CheckpointFormatError:
    """The error for a checkpoint in a format newer than this reader knows: what, and what to upgrade."""
    return CheckpointFormatError(
        f"Cannot read Orbax checkpoint {quote_name(loc.display)}: {problem}. It was written by a newer Orbax or "
        "TensorStore than this ckptmerge reads; upgrade both (pip install -U ckptmerge tensorstore), or restore it "
        "with the Orbax that wrote it and save it again.", path=loc.root)


def _newer_zarr(loc: Location, param: str, fmt: Any) -> Optional[CheckpointFormatError]:
    """The error for a zarr format past 3 (a newer zarr than TensorStore and ckptmerge read), else ``None``."""
    if type(fmt) is int and fmt > 3:
        return _newer(loc, f"array {quote_name(param)} is zarr format {fmt} (ckptmerge reads zarr formats 2 and 3)")
    return None


class _Array:
    """One tensor: a stored TensorStore array, an inline value, or a string. A stored array knows
    its dtype by name and size (``bfloat16``, 2) until it is read: its numpy dtype may need
    ml_dtypes, which listing never imports."""

    __slots__ = ("name", "loc", "key", "ocdbt", "driver", "metadata", "dtname", "itemsize", "_dtype", "shape", "rows",
                 "value", "ts", "complete")

    def __init__(self, name: str, loc: Location, key: str, *, ocdbt: bool = False, driver: str = "",
                 metadata: Optional[dict] = None, dtype: Optional[np.dtype] = None, dtname: str = "",
                 itemsize: int = 0, shape: Tuple[int, ...] = (), rows: int = 1, value: Any = None,
                 complete: bool = True) -> None:
        self.name, self.loc, self.key, self.ocdbt, self.driver = name, loc, key, ocdbt, driver
        self.metadata, self.shape, self.rows, self.value = metadata, shape, rows, value
        self._dtype = dtype
        self.dtname = dtype_name(dtype) if dtype is not None else dtname
        self.itemsize = (0 if dtype.hasobject else dtype.itemsize) if dtype is not None else itemsize
        self.ts: Any = None
        #: Every chunk was stored (``store_array_data_equal_to_fill_value``): a missing one is an error.
        #: Otherwise the writer left out chunks equal to the fill value, and they read as it (as Orbax does).
        self.complete = complete

    @property
    def dtype(self) -> np.dtype:
        """The numpy dtype (made on first use; ml_dtypes is imported for its types)."""
        if self._dtype is None:
            try:
                self._dtype = numpy_dtype_named(self.dtname)
            except ValueError as e:
                raise CheckpointFormatError(f"Cannot read array {quote_name(self.key)} of Orbax checkpoint "
                                            f"{quote_name(self.loc.display)}: {escape_name(e)}.", path=self.loc.root,
                                            key=self.name) from None
        return self._dtype


class OrbaxReader(CheckpointReader):
    """Reader of an Orbax step folder or item folder, through ``tensorstore``, without JAX.

    Use :func:`ckptmerge.formats.open_checkpoint` (or ``cm.open``) rather than this class; a
    CheckpointManager root is resolved to a step by :class:`ckptmerge.Source` (``step=N`` or the
    latest finalised step).

    Attributes:
        items: ``{item name: layout}`` with layout ``"ocdbt+zarr3"``, ``"ocdbt+zarr"``,
            ``"zarr3"``, ``"zarr"``, ``"msgpack"`` or ``"json"`` (an item with no arrays).
        metadata: the step's ``_CHECKPOINT_METADATA`` (``{}`` if none).

    Raises:
        CheckpointNotFoundError: the folder does not exist.
        CheckpointFormatError: it is not an Orbax checkpoint, or its metadata is damaged.
        UnsafeCheckpointError: a param name or link would lead outside the checkpoint, or an array
            declares more data than its files could hold.

    Example:
        >>> with OrbaxReader("runs/flax/100") as r:  # doctest: +SKIP
        ...     r.get("params/Dense_0/kernel").shape
        (784, 128)
    """

    format = "orbax"

    def __init__(self, path: str, *, verify: bool = True) -> None:
        super().__init__(path)
        self.verify = verify  # zarr3 shard indexes carry CRC32C, which TensorStore always checks
        self._lock = threading.Lock()
        self._ts: Any = None  # tensorstore and its Context: made when data is first read (listing needs neither)
        self._context: Any = None
        self._locations: List[Location] = []
        self._arrays: Dict[str, _Array] = {}
        self._depths: Dict[str, Dict[str, Tuple[int, str]]] = {}  # item root -> top entry -> deepest folder
        self._rechecked: set = set()
        self.items: Dict[str, str] = {}
        root = Location(path)
        self._locations.append(root)
        if not root.isdir():
            raise CheckpointNotFoundError(f"Orbax checkpoint {quote_name(path)} does not exist.", path=path)
        self.metadata: Dict[str, Any] = {}
        root.check_file(CHECKPOINT_METADATA_FILE)
        if root.exists(CHECKPOINT_METADATA_FILE):
            meta = root.read_json(CHECKPOINT_METADATA_FILE)
            self.metadata = meta if isinstance(meta, dict) else {}
            self._check_version(root, CHECKPOINT_METADATA_FILE, self.metadata)
        folders = item_folders(root, self.metadata)
        if not folders:
            raise CheckpointFormatError(
                f"{quote_name(path)} holds no Orbax item (no folder with {METADATA_FILE}, an OCDBT manifest or "
                "zarr arrays). If it is a CheckpointManager root, pass step=N or one of its step folders.", path=path)
        leaves: List[Tuple[str, Tuple[str, ...], _Array]] = []
        for item, folder in folders.items():
            if folder is None:
                self.items[item] = "json"
                continue
            loc = root.child(folder) if folder else root
            if loc is not root:
                self._locations.append(loc)
            self.items[item] = self._open_item(loc, item, leaves)
        self._set_infos(self._name_leaves(leaves, len(folders) > 1))

    def _name_leaves(self, leaves: List[Tuple[str, Tuple[str, ...], _Array]], prefix: bool) -> List[VariableInfo]:
        """Names and kinds: tree paths joined with ``/``, the item first when the step has several;
        a Keras ``OrbaxCheckpoint`` step named as Keras names its variables (see :func:`keras_name`)."""
        keras = is_keras_state({item: parts for item, parts, _ in leaves})
        infos: List[VariableInfo] = []
        for item, parts, arr in leaves:
            if keras:
                name, kind = keras_name(item, parts)
            else:
                name, kind = "/".join(((item,) if prefix and item else ()) + parts), kind_of_path(parts, item)
            if name in self._arrays:
                raise self._error(arr.loc, f"two leaves are both named {quote_name(name)}", name)
            arr.name = name
            self._arrays[name] = arr
            shape = arr.shape if arr.value is None or arr.dtname != "string" else ()
            infos.append(VariableInfo(name, shape, arr.dtname, name, kind, math.prod(shape) * arr.itemsize))
        return infos

    # -- opening -------------------------------------------------------------------------------
    def _error(self, loc: Location, problem: str, key: Optional[str] = None,
               cls: type = CheckpointFormatError) -> CheckpointFormatError:
        return cls(f"Cannot read Orbax checkpoint {quote_name(loc.display)}: {problem}. The checkpoint is damaged "
                   "or was not written by Orbax; re-copy it, or save it again.", path=loc.root, key=key)

    def _open_item(self, loc: Location, item: str, leaves: List[Tuple[str, Tuple[str, ...], _Array]]) -> str:
        names = set(loc.listdir())
        stored: List[Tuple[Tuple[str, ...], str]] = []  # (tree path, param name) of TensorStore arrays
        strings: List[Tuple[Tuple[str, ...], str]] = []
        inline: List[Tuple[Tuple[str, ...], str, Any]] = []
        meta = loc.read_json(METADATA_FILE) if METADATA_FILE in names else None
        ocdbt = "manifest.ocdbt" in names
        zarr3: Optional[bool] = None
        if meta is not None:
            if isinstance(meta, dict):
                self._check_version(loc, METADATA_FILE, meta)
            if not isinstance(meta, dict) or not isinstance(meta.get("tree_metadata"), dict):
                raise self._error(loc, f"{METADATA_FILE} has no 'tree_metadata' object")
            if isinstance(meta.get("use_ocdbt"), bool):
                ocdbt = meta["use_ocdbt"]
            if isinstance(meta.get("use_zarr3"), bool):
                zarr3 = meta["use_zarr3"]
            write_shapes: Dict[str, Any] = {}
            for entry in meta["tree_metadata"].values():
                parts, value_type, skip, write_shape = self._entry(loc, entry)
                if skip:
                    continue
                param = ".".join(parts)
                if value_type in _ARRAY_TYPES:
                    stored.append((parts, param))
                    write_shapes[param] = (value_type, write_shape)
                elif value_type == "string":
                    strings.append((parts, param))
                else:
                    logger.info("Orbax checkpoint %s: leaving out %s (value type %r, not an array)",
                                loc.display, "/".join(parts), value_type)
        elif AGGREGATE_FILE in names:
            write_shapes = {}
            data = loc.read_bytes(AGGREGATE_FILE, storage.MAX_SMALL)
            for parts, kind, value in parse_aggregate(data or b"", loc.path(AGGREGATE_FILE)):
                if kind == "stored":
                    stored.append((parts, value))
                else:
                    inline.append((parts, kind, value))
        else:
            write_shapes = {}
            for n in sorted(names - NOT_ARRAYS):
                if not n.startswith(".") and loc.isdir(n):
                    stored.append((tuple(n.split(".")), n))
        if ocdbt and stored and "manifest.ocdbt" not in names:
            raise self._error(loc, f"{METADATA_FILE} says the arrays are in an OCDBT database, but there is no "
                                   "manifest.ocdbt")
        sizes = self._stored_sizes(loc)
        if ocdbt:
            self._check_data_folders(loc)
        complete = meta is not None and meta.get("store_array_data_equal_to_fill_value") is True
        arrays = self._stored_arrays(loc, stored, ocdbt, zarr3, write_shapes, sizes, complete)
        if strings:
            table = loc.read_json("_strings.json")
            if not isinstance(table, dict):
                raise self._error(loc, f"{len(strings)} string value(s) but no _strings.json object")
            for parts, param in strings:
                value = table.get(param)
                if not isinstance(value, str):
                    raise self._error(loc, f"_strings.json has no string for {quote_name(param)}", param)
                arrays.append((parts, _Array("", loc, param, dtype=np.dtype(object),
                                             value=np.array(value.encode("utf-8", "surrogatepass"), dtype=object))))
        for parts, kind, value in inline:
            if kind == "string":
                arr = _Array("", loc, ".".join(parts), dtype=np.dtype(object), value=np.array(value, dtype=object))
            else:
                arr = _Array("", loc, ".".join(parts), dtype=value.dtype, shape=value.shape, value=value)
            arrays.append((parts, arr))
        leaves.extend((item, parts, arr) for parts, arr in arrays)
        if meta is None and AGGREGATE_FILE in names:
            return "msgpack"
        if meta is None and not arrays:
            return "json"
        z = "zarr3" if zarr3 or (zarr3 is None and arrays and any(a.driver == "zarr3" for _, a in arrays)) else "zarr"
        return f"ocdbt+{z}" if ocdbt else z

    def _entry(self, loc: Location, entry: Any) -> Tuple[Tuple[str, ...], str, bool, Any]:
        if not isinstance(entry, dict) or not isinstance(entry.get("key_metadata"), list):
            raise self._error(loc, f"a {METADATA_FILE} entry has no 'key_metadata' list")
        parts: List[str] = []
        for k in entry["key_metadata"]:
            key = k.get("key") if isinstance(k, dict) else None
            if isinstance(key, int) and not isinstance(key, bool):
                key = str(key)
            if not isinstance(key, str):
                raise self._error(loc, f"a {METADATA_FILE} key is not a string: {escape_name(repr(k)[:80])}")
            parts.append(key)
        value = entry.get("value_metadata")
        if not isinstance(value, dict) or not isinstance(value.get("value_type"), str):
            raise self._error(loc, f"{METADATA_FILE} entry {quote_name('/'.join(parts))} has no value type")
        if not parts:
            parts = [""]
        return tuple(parts), value["value_type"], value.get("skip_deserialize") is True, value.get("write_shape")

    def _stored_sizes(self, loc: Location) -> Dict[str, int]:
        """Bytes stored below each top-level entry of the item folder (and checks for links)."""
        if loc.is_url:
            fs, base = storage.filesystem(loc.root)
            try:
                found = fs.find(base, detail=True)
            except Exception as e:  # noqa: BLE001
                raise self._error(loc, f"listing it failed ({type(e).__name__}: {escape_name(e)})") from None
            out: Dict[str, int] = {}
            prefix = base.rstrip("/") + "/"
            for p, info in found.items():
                rel = str(p)[len(prefix):] if str(p).startswith(prefix) else str(p)
                top = rel.split("/", 1)[0]
                out[top] = out.get(top, 0) + int(info.get("size") or 0)
            return out
        out = {}
        self._depths[loc.root] = depths = {}
        for n in loc.listdir():
            p = loc.path(n)
            try:
                st = os.lstat(p)
            except OSError:
                continue
            if stat.S_ISDIR(st.st_mode):
                out[n], depth, folder = loc.check_tree(n)
                depths[n] = (depth, folder)
            elif stat.S_ISREG(st.st_mode):
                out[n] = st.st_size
            else:
                raise not_a_checkpoint_file(p, st.st_mode)
        return out

    def _check_chunk_files(self, loc: Location, param: str, driver: str, meta: dict, ndim: int) -> None:
        """Refuse a folder of a per-array zarr folder where a chunk file belongs (at the depth of
        its chunk keys): TensorStore would take it for a missing chunk, which an older checkpoint
        reads as the fill value."""
        depth, folder = self._depths.get(loc.root, {}).get(param, (0, ""))
        if depth and depth >= _chunk_key_depth(driver, meta, ndim):
            raise not_a_checkpoint_file(folder, stat.S_IFDIR)

    def _check_version(self, loc: Location, file: str, meta: dict) -> None:
        """Refuse metadata that carries a version field: no Orbax release from 0.5 to 0.12 writes
        one, so its format is newer than this reader knows, and reading it as the known one could
        be wrong."""
        for key in sorted(k for k in meta if isinstance(k, str) and "version" in k.lower()):
            raise _newer(loc, f"its {file} gives {quote_name(key)} = {escape_name(repr(meta[key])[:40])}, a "
                              "version field no Orbax release ckptmerge knows (0.5 to 0.12) writes")

    def _check_data_folders(self, loc: Location) -> None:
        """Refuse a folder inside an OCDBT database's data folders (``d/``, ``ocdbt.process_N/d/``),
        which hold only data files, or in place of a per-process manifest."""
        for top, (depth, folder) in self._depths.get(loc.root, {}).items():
            if top.startswith("ocdbt.process_"):
                loc.check_file(f"{top}/manifest.ocdbt")
            if depth >= (1 if top == "d" else 2 if top.startswith("ocdbt.process_") else 1 << 30):
                raise not_a_checkpoint_file(folder, stat.S_IFDIR)

    def _recheck(self, arr: _Array) -> None:
        """Just before TensorStore first opens ``arr``'s files: check them again (what was checked
        when the checkpoint was listed may have changed since)."""
        if arr.loc.is_url:
            return
        if not arr.ocdbt:
            _, depth, folder = arr.loc.check_tree(arr.key)
            self._depths.setdefault(arr.loc.root, {})[arr.key] = (depth, folder)
            self._check_chunk_files(arr.loc, arr.key, arr.driver, arr.metadata or {}, len(arr.shape))
        elif arr.loc.root not in self._rechecked:
            self._stored_sizes(arr.loc)
            self._check_data_folders(arr.loc)
            self._rechecked.add(arr.loc.root)

    def _stored_arrays(self, loc: Location, stored: List[Tuple[Tuple[str, ...], str]], ocdbt: bool,
                       zarr3: Optional[bool], write_shapes: Dict[str, Any], sizes: Dict[str, int],
                       complete: bool) -> List[Tuple[Tuple[str, ...], _Array]]:
        for parts, param in stored:
            if not safe_key(param):
                raise self._error(loc, f"param name {quote_name(param)} (of {quote_name('/'.join(parts))}) would "
                                       "lead outside the checkpoint folder", param, UnsafeCheckpointError)
        if not stored:
            return []
        candidates = ["zarr.json", ".zarray"] if zarr3 is None else ["zarr.json" if zarr3 else ".zarray"]
        raw = self._read_zarr_metadata(loc, [p for _, p in stored], candidates, ocdbt)
        total = sum(sizes.values())
        out = []
        for (parts, param), (which, data) in zip(stored, raw):
            if data is None:
                raise self._error(loc, f"array {quote_name(param)} (of {quote_name('/'.join(parts))}) has no zarr "
                                       f"metadata ({' or '.join(candidates)}); its data is missing", param)
            driver = "zarr3" if which == "zarr.json" else "zarr"
            meta, dtname, itemsize, shape, rows = self._zarr_metadata(loc, param, driver, data)
            if not ocdbt:
                self._check_chunk_files(loc, param, driver, meta, len(shape))
            value_type, write_shape = write_shapes.get(param, (None, None))
            if value_type == "scalar" and shape != ():
                raise self._error(loc, f"scalar {quote_name(param)} is stored with shape {shape}", param)
            if write_shape is not None and (not isinstance(write_shape, list) or len(write_shape) != len(shape)):
                raise self._error(loc, f"{METADATA_FILE} gives {quote_name(param)} write shape "
                                       f"{escape_name(repr(write_shape)[:40])}, but its zarr shape is {shape}", param)
            budget = (total if ocdbt else sizes.get(param.split("/", 1)[0], 0)) * MAX_EXPANSION + _SLACK
            need = math.prod(shape) * itemsize
            if need > budget:
                raise self._error(loc, f"array {quote_name(param)} declares shape {shape} of {dtname} "
                                       f"({need} bytes), more than its stored data could hold", param,
                                  UnsafeCheckpointError)
            out.append((parts, _Array("", loc, param, ocdbt=ocdbt, driver=driver, metadata=meta, dtname=dtname,
                                      itemsize=itemsize, shape=shape, rows=rows, complete=complete)))
        return out

    def _read_zarr_metadata(self, loc: Location, params: List[str], candidates: List[str],
                            ocdbt: bool) -> List[Tuple[str, Optional[bytes]]]:
        """The zarr metadata file of each array (``(file name, bytes or None)``), read by ckptmerge
        itself: files of the folder layout, values of the OCDBT database (:mod:`~ckptmerge.formats.orbax.ocdbt`).
        TensorStore reads them only where that reader meets a feature it does not implement."""
        keys = [f"{param}/{cand}" for param in params for cand in candidates]
        try:
            if ocdbt:
                values = read_keys(loc.read_bytes, loc.read_range, keys, loc.display, limit=_MAX_ZARR_METADATA)
            else:
                values = self._read_files(loc, keys)
        except OcdbtUnsupported as e:
            logger.info("Orbax checkpoint %s: reading its zarr metadata through tensorstore (%s)", loc.display, e)
            try:
                return self._read_zarr_metadata_ts(loc, params, candidates, ocdbt)
            except CheckpointFormatError as ts_error:
                raise _newer(loc, f"its OCDBT database uses what ckptmerge's own reader does not know "
                                  f"({escape_name(e)}), and tensorstore {getattr(self._ts, '__version__', '')} "
                                  f"could not read it either ({escape_name(ts_error)[:300]})") from None
        except UnsafeCheckpointError:
            raise
        except CheckpointFormatError as e:  # OcdbtError, or a node's file missing or too short
            if not ocdbt:
                raise
            raise self._error(loc, f"its OCDBT database is damaged ({escape_name(e)})") from None
        out: List[Tuple[str, Optional[bytes]]] = []
        for param in params:
            found = [(cand, values[f"{param}/{cand}"]) for cand in candidates if values[f"{param}/{cand}"] is not None]
            out.append(found[0] if found else (candidates[-1], None))
        return out

    def _read_files(self, loc: Location, keys: List[str]) -> Dict[str, Optional[bytes]]:
        """Small files of the item folder, by key: local ones in turn, remote ones 16 at a time."""
        def one(key: str) -> Optional[bytes]:
            return loc.read_bytes(key, _MAX_ZARR_METADATA)

        if not loc.is_url or len(keys) < 2:
            return {k: one(k) for k in keys}
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(max_workers=16, thread_name_prefix="ckptmerge-orbax-meta") as pool:
            return dict(zip(keys, pool.map(one, keys)))

    def _read_zarr_metadata_ts(self, loc: Location, params: List[str], candidates: List[str],
                               ocdbt: bool) -> List[Tuple[str, Optional[bytes]]]:
        """:meth:`_read_zarr_metadata` through TensorStore's kvstores, read concurrently."""
        ts = self._tensorstore()
        if ocdbt:
            kv = wait(ts.KvStore.open({"driver": "ocdbt", "base": loc.kvstore(), "cache_pool": "cache_pool#ocdbt"},
                                      context=self._context), "opening its OCDBT database", loc)
        else:
            kv = wait(ts.KvStore.open(loc.kvstore(), context=self._context), "opening it", loc)
        out: List[Tuple[str, Optional[bytes]]] = [(candidates[-1], None)] * len(params)
        pending = list(range(len(params)))
        for cand in candidates:
            futures = [(i, kv.read(f"{params[i]}/{cand}".encode("utf-8"))) for i in pending]
            pending = []
            for i, fut in futures:
                res = wait(fut, f"reading the metadata of array {quote_name(params[i])}", loc, key=params[i])
                if res.state == "value":
                    if len(res.value) > _MAX_ZARR_METADATA:
                        raise self._error(loc, f"the zarr metadata of {quote_name(params[i])} is over 16 MiB", params[i])
                    out[i] = (cand, bytes(res.value))
                else:
                    pending.append(i)
        return out

    def _tensorstore(self) -> Any:
        """The tensorstore module, with this reader's Context, imported and made on first use."""
        with self._lock:
            if self._ts is None:
                ts = load_tensorstore()
                self._context = ts.Context({"file_io_concurrency": {"limit": 128},
                                            "cache_pool#ocdbt": {"total_bytes_limit": 100_000_000}})
                self._ts = ts
        return self._ts

    def _zarr_metadata(self, loc: Location, param: str, driver: str,
                       data: bytes) -> Tuple[dict, str, int, Tuple[int, ...], int]:
        def bad(problem: str) -> CheckpointFormatError:
            return self._error(loc, f"the zarr metadata of array {quote_name(param)} {problem}", param)

        try:
            meta = json.loads(data.decode("utf-8"))
        except (UnicodeDecodeError, ValueError, RecursionError):
            raise bad("is not valid JSON") from None
        if not isinstance(meta, dict):
            raise bad("is not a JSON object")
        shape = meta.get("shape")
        problem = shape_problem(shape, 1)  # (again with its dtype's itemsize below)
        if problem:
            raise bad(problem)
        shape_t = tuple(shape)
        if driver == "zarr":
            if meta.get("zarr_format") != 2:
                raise _newer_zarr(loc, param, meta.get("zarr_format")) or bad("is not zarr v2 ('zarr_format': 2)")
            dt_field, chunks = meta.get("dtype"), meta.get("chunks")
            comp = meta.get("compressor")
            if comp is not None and (not isinstance(comp, dict) or comp.get("id") not in _ZARR2_COMPRESSORS):
                raise bad(f"uses compressor {escape_name(repr(comp)[:60])}; ckptmerge reads "
                          f"{', '.join(sorted(_ZARR2_COMPRESSORS))} (the ones Orbax and zarr write)")
            if meta.get("filters") not in (None, []):
                raise bad("uses zarr filters, which Orbax never writes")
            inner = chunks
        else:
            if meta.get("zarr_format") != 3 or meta.get("node_type", "array") != "array":
                raise _newer_zarr(loc, param, meta.get("zarr_format")) or bad("is not a zarr3 array ('zarr_format': 3)")
            dt_field = meta.get("data_type")
            grid = meta.get("chunk_grid")
            chunks = (grid.get("configuration") or {}).get("chunk_shape") if isinstance(grid, dict) else None
            if not isinstance(grid, dict) or grid.get("name") != "regular":
                raise bad("has no regular chunk grid")
            codecs = meta.get("codecs")
            inner = chunks
            if not isinstance(codecs, list) or not self._codecs_ok(codecs):
                raise bad(f"uses codecs other than {', '.join(sorted(_ZARR3_CODECS))}")
            if codecs and isinstance(codecs[0], dict) and codecs[0].get("name") == "sharding_indexed":
                inner = (codecs[0].get("configuration") or {}).get("chunk_shape")
        for c in (chunks, inner):
            if (not isinstance(c, list) or len(c) != len(shape)
                    or not all(type(d) is int and 1 <= d < 2 ** 62 for d in c)):
                raise bad(f"has chunks {escape_name(repr(c)[:60])} that do not fit shape {shape_t}")
        try:
            dtname, itemsize = checked_dtype_name(dt_field)
        except ValueError as e:
            raise bad(f"has a dtype ckptmerge does not read ({escape_name(e)})") from None
        if not _ts_reads_dtype(driver, dt_field):
            field = "dtype" if driver == "zarr" else "data_type"
            raise CheckpointFormatError(
                f"Cannot read array {quote_name(param)} of Orbax checkpoint {quote_name(loc.display)}: its zarr "
                f"{field} is {quote_name(dt_field)} ({dtname}), which TensorStore's {driver} driver does not decode "
                f"(it reads bool, int8-64, uint8-64, float16/32/64, complex64/128 and {', '.join(sorted(_TS_ML_NAMES))}"
                f"{'; zarr v2 type strings with < or > byte order' if driver == 'zarr' else ''}). Cast the array to "
                "one of those where it was saved, and save it again.", path=loc.root, key=param)
        problem = shape_problem(shape_t, itemsize)  # (0, 2**61, 2**61): no data, yet no array either
        if problem:
            raise bad(problem)
        return meta, dtname, itemsize, shape_t, (inner[0] if inner else 1)

    def _codecs_ok(self, codecs: Any) -> bool:
        for c in codecs:
            if not isinstance(c, dict) or c.get("name") not in _ZARR3_CODECS:
                return False
            conf = c.get("configuration") or {}
            if not isinstance(conf, dict):
                return False
            for sub in ("codecs", "index_codecs"):
                if sub in conf and not (isinstance(conf[sub], list) and self._codecs_ok(conf[sub])):
                    return False
        return True

    # -- reading -------------------------------------------------------------------------------
    def _store(self, arr: _Array) -> Any:
        """The opened TensorStore of ``arr`` (opened once). The zarr metadata ckptmerge read and
        checked at listing is given as constraints, so TensorStore reads the stored metadata
        itself and refuses the array if they differ in anything (shape, dtype, chunks, codecs)."""
        store = arr.ts
        if store is None:
            self._recheck(arr)
            kv = ({"driver": "ocdbt", "base": arr.loc.kvstore(), "path": arr.key + "/", "cache_pool": "cache_pool#ocdbt"}
                  if arr.ocdbt else dict(arr.loc.kvstore(arr.key)))
            spec = {"driver": arr.driver, "kvstore": kv, "metadata": arr.metadata, "recheck_cached_data": False,
                    "recheck_cached_metadata": False, "fill_missing_data_reads": not arr.complete}
            ts = self._tensorstore()
            what = f"opening array {quote_name(arr.key)}"
            try:  # (TensorStore refuses some specs at once, before any future)
                future = ts.open(spec, open=True, read=True, context=self._context)
            except Exception as e:  # noqa: BLE001 - ValueError, TypeError, ...
                raise arr.loc.error_from(e, what, key=arr.name) from None
            store = arr.ts = wait(future, what, arr.loc, key=arr.name)
        return store

    def _start(self, arr: _Array, out: np.ndarray, rows: Optional[slice] = None) -> Any:
        """Start reading ``arr`` (or its ``rows``) straight into ``out``; returns the future."""
        src = self._store(arr)
        if rows is not None:
            src = src[rows]
        try:
            return self._tensorstore().array(out, copy=False, write=True).write(src)
        except Exception as e:  # noqa: BLE001 - a dtype TensorStore has no type for, ...
            raise arr.loc.error_from(e, f"reading array {quote_name(arr.key)}", key=arr.name) from None

    def _finish(self, arr: _Array, future: Any) -> None:
        wait(future, f"reading array {quote_name(arr.key)}", arr.loc, key=arr.name)

    def _read(self, info: VariableInfo) -> np.ndarray:
        arr = self._arrays[info.raw_key]
        if arr.value is not None:
            out = aligned_empty(arr.value.shape, arr.value.dtype) if arr.dtype != np.dtype(object) else \
                np.empty(arr.value.shape, object)
            out[...] = arr.value
            return out
        out = aligned_empty(arr.shape, arr.dtype)
        if out.size:
            self._finish(arr, self._start(arr, out))
        return out

    def read_many(self, names: Any, *, max_workers: Optional[int] = None) -> Dict[str, np.ndarray]:
        """Read several tensors at once: every TensorStore read is started, then all are awaited
        (TensorStore decodes them on its own threads).

        Example:
            >>> arrays = reader.read_many(["params/Dense_0/kernel", "params/Dense_0/bias"])  # doctest: +SKIP
        """
        names = list(names)
        infos = [self.info(n) for n in names]
        done: Dict[str, np.ndarray] = {}
        pending: List[Tuple[_Array, Any]] = []
        for info in infos:
            if info.raw_key in done:
                continue
            arr = self._arrays[info.raw_key]
            if arr.value is not None or not info.size:
                done[info.raw_key] = self._read(info)
                continue
            out = done[info.raw_key] = aligned_empty(arr.shape, arr.dtype)
            pending.append((arr, self._start(arr, out)))
        try:
            for arr, fut in pending:
                self._finish(arr, fut)
        except BaseException:
            for _, fut in pending:
                fut.cancel()
            raise
        return {n: done[i.raw_key] for n, i in zip(names, infos)}

    def _iter_chunks(self, info: VariableInfo, max_elements: int) -> Iterator[np.ndarray]:
        """Rows of stored chunks, read one block ahead: memory for two blocks, each the rows of
        whole stored chunks (``max_elements`` or more elements)."""
        arr = self._arrays[info.raw_key]
        if arr.value is not None or len(arr.shape) == 0 or info.size <= max_elements:
            return super()._iter_chunks(info, max_elements)
        return self._chunk_rows(arr, info, max_elements)

    def _chunk_rows(self, arr: _Array, info: VariableInfo, max_elements: int) -> Iterator[np.ndarray]:
        row = info.size // arr.shape[0]
        step = arr.rows * max(1, max_elements // max(1, row * arr.rows))
        spans = [(s, min(s + step, arr.shape[0])) for s in range(0, arr.shape[0], step)]

        def start(span: Tuple[int, int]) -> Tuple[np.ndarray, Any]:
            out = aligned_empty((span[1] - span[0],) + arr.shape[1:], arr.dtype)
            return out, self._start(arr, out, slice(*span))

        ahead = start(spans[0])
        try:
            for i in range(len(spans)):
                out, fut = ahead
                self._finish(arr, fut)
                ahead = start(spans[i + 1]) if i + 1 < len(spans) else None
                flat = out.reshape(-1)
                for p in range(0, flat.size, max_elements):
                    yield flat[p:p + max_elements]
        finally:
            if ahead is not None:
                ahead[1].cancel()

    def close(self) -> None:
        """Stop serving remote folders (local ones hold nothing open)."""
        for loc in getattr(self, "_locations", ()):
            loc.close()
