"""Read ``.safetensors`` files (single, or sharded with a ``*.safetensors.index.json``), TF-free.

The format is an 8-byte little-endian header length, a JSON header ``{name: {"dtype", "shape",
"data_offsets": [begin, end]}, "__metadata__": {...}}`` and the raw little-endian tensor bytes.
ckptmerge reads it with its own small reader rather than the ``safetensors`` package: tensors
are read with ``preadv`` straight into 64-byte aligned buffers (TensorFlow takes those without a
copy; a memory map of the file gives arbitrarily aligned views, which TF copies), ``bfloat16``
and the float8 types come from ``ml_dtypes`` as everywhere else in ckptmerge, and every header
field is validated against the file before anything is allocated (files are untrusted).

Names are kept exactly as written (``encoder.layer.0.attention.self.query.weight``); see
docs/formats.md, "From PyTorch and safetensors", for how ``.`` scopes match. A sharded set is read through its index
JSON, whose ``weight_map`` may name only files in the index's own directory.
"""

from __future__ import annotations

import json
import math
import os
import struct
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Dict, Iterable, Iterator, List, Optional, Tuple

import numpy as np

from ckptmerge.core.errors import CheckpointFormatError, CheckpointNotFoundError, UnreadableTensorError
from ckptmerge.formats.base import CheckpointReader, aligned_empty, contiguous_chunks, shape_problem
from ckptmerge.formats.dtypes import ML_ITEMSIZE, LazyDtypes, dtype_name
from ckptmerge.formats.io import storage
from ckptmerge.formats.io.fileio import Descriptors, Handle, pread_into, size_of
from ckptmerge.formats.io.localfile import link_problem
from ckptmerge.formats.io.urlpath import has_suffix, is_plain_name
from ckptmerge.formats.ranges import TensorRanges
from ckptmerge.core.redact import get_logger
from ckptmerge.core.specs import KIND_VARIABLE, VariableInfo
from ckptmerge.core.text import escape_name

__all__ = ["SafetensorsReader", "is_safetensors", "SAFETENSORS_DTYPES", "INDEX_SUFFIX", "read_json_file",
           "MAX_HEADER", "PACKED_DTYPES", "PACKED_BITS", "safetensors_dtype"]

logger = get_logger(__name__)

#: The suffix of a sharded set's index file (``model.safetensors.index.json``).
INDEX_SUFFIX = ".safetensors.index.json"
#: Largest JSON header (or index file) read: the same 100 MB bound the reference reader uses.
MAX_HEADER = 100_000_000
_SEGMENT = 32 << 20  # read_many reads bigger tensors in parallel segments of this size
_SNIFF = 4096  # bytes of the header the format sniffer looks at for its opening brace
_JSON_SPACE = b" \t\r\n"

#: safetensors dtype codes -> numpy dtypes (little-endian), one or more bytes per element: the
#: types ckptmerge reads and writes. (``C128`` is no safetensors type: the library refuses it.)
SAFETENSORS_DTYPES: LazyDtypes = LazyDtypes({
    "BOOL": np.dtype(np.bool_), "U8": np.dtype("<u1"), "I8": np.dtype("<i1"),
    "U16": np.dtype("<u2"), "I16": np.dtype("<i2"), "U32": np.dtype("<u4"), "I32": np.dtype("<i4"),
    "U64": np.dtype("<u8"), "I64": np.dtype("<i8"), "F16": np.dtype("<f2"), "F32": np.dtype("<f4"),
    "F64": np.dtype("<f8"), "C64": np.dtype("<c8"),
}, {"BF16": "bfloat16", "F8_E5M2": "float8_e5m2", "F8_E4M3": "float8_e4m3fn", "F8_E4M3FNUZ": "float8_e4m3fnuz",
    "F8_E5M2FNUZ": "float8_e5m2fnuz", "F8_E8M0": "float8_e8m0fnu"})  # (F8_E8M0: ml_dtypes >= 0.5)

#: The sub-byte types: code -> (the ml_dtypes name of one element, bits per element). The file
#: packs them (``shape`` counts elements, the data holds ``elements * bits / 8`` bytes, a whole
#: number). ``F4`` is read two elements per byte, the first in the low nibble (as PyTorch's
#: ``float4_e2m1fn_x2``, which the ``safetensors`` package returns for it, ONNX and the OCP MX
#: formats pack them); ckptmerge unpacks it to one ``float4_e2m1fn`` per byte. The 6-bit types
#: are listed, but neither the format nor the library defines the order of their bits (the
#: package reads no value of them), so reading one is refused rather than guessed.
PACKED_BITS: Dict[str, Tuple[str, int]] = {"F4": ("float4_e2m1fn", 4), "F6_E2M3": ("float6_e2m3fn", 6),
                                           "F6_E3M2": ("float6_e3m2fn", 6)}
#: The sub-byte types' dtypes (one element per byte), by code.
PACKED_DTYPES: LazyDtypes = LazyDtypes({}, {code: name for code, (name, _) in PACKED_BITS.items()})

_CODE_OF = {**{dtype_name(dt): code for code, dt in SAFETENSORS_DTYPES.plain().items()},
            **{name: code for code, name in SAFETENSORS_DTYPES.named().items()}}


def safetensors_dtype(dtype: str) -> Optional[str]:
    """The safetensors code of a numpy-style dtype name, or ``None`` if it has none.

    Example:
        >>> safetensors_dtype("bfloat16"), safetensors_dtype("string")
        ('BF16', None)
    """
    return _CODE_OF.get(dtype)


def is_safetensors(path: str) -> bool:
    """True if ``path`` is a file that starts like a safetensors file (header length, then ``{``,
    after any JSON whitespace: the library accepts a header padded in front).

    Example:
        >>> is_safetensors("model.safetensors")  # doctest: +SKIP
        True
    """
    try:
        with storage.open_binary(path, storage.SNIFF_BLOCK) as f:
            head = f.read(8 + _SNIFF)
            size = os.fstat(f.fileno()).st_size if not storage.is_url(path) else f.size
    except OSError:
        return False
    if len(head) < 10:
        return False
    n = struct.unpack("<Q", head[:8])[0]
    start = head[8:8 + min(n, _SNIFF)].lstrip(_JSON_SPACE)
    return start[:1] == b"{" and 2 <= n <= size - 8


# code -> (dtype name, bytes per element in memory, bits per element in the file), without ml_dtypes:
# dtype names are strings until values are decoded.
_LISTED: Dict[str, Tuple[str, int, int]] = {
    **{code: (dtype_name(dt), dt.itemsize, 8 * dt.itemsize) for code, dt in SAFETENSORS_DTYPES.plain().items()},
    **{code: (name, ML_ITEMSIZE[name], 8 * ML_ITEMSIZE[name]) for code, name in SAFETENSORS_DTYPES.named().items()},
    **{code: (name, ML_ITEMSIZE[name], bits) for code, (name, bits) in PACKED_BITS.items()}}


class _Entry:
    __slots__ = ("shard", "dtype_name", "shape", "begin", "end", "code", "bits")

    def __init__(self, shard: int, code: str, dtype_name: str, shape: Tuple[int, ...],
                 begin: int, end: int, bits: int) -> None:
        self.shard, self.code, self.dtype_name, self.shape = shard, code, dtype_name, shape
        self.begin, self.end = begin, end
        self.bits = bits  # per element: 8 * itemsize, or 4 / 6 for the packed types


class SafetensorsReader(CheckpointReader):
    """Reader of a ``.safetensors`` file, or of a sharded set through its index JSON.

    Use :func:`ckptmerge.formats.open_checkpoint` (or ``cm.open``) rather than this class.

    Attributes:
        metadata: the ``__metadata__`` dict of the (first) file, ``{}`` if none.
        files: the absolute paths of the files read (one, or every shard).

    Raises:
        CheckpointNotFoundError: the file, or a shard the index names, does not exist.
        CheckpointFormatError: a header or index is malformed or contradicts the file.

    Example:
        >>> with SafetensorsReader("model.safetensors") as r:  # doctest: +SKIP
        ...     r.get("encoder.layer.0.attention.self.query.weight").shape
        (768, 768)
    """

    format = "safetensors"

    def __init__(self, path: str, *, verify: bool = True) -> None:
        super().__init__(path)
        self.verify = verify  # safetensors has no checksums; kept for symmetry
        self._lock = threading.Lock()
        self._fds = Descriptors()
        self.metadata: Dict[str, str] = {}
        if has_suffix(path, INDEX_SUFFIX):  # a URL's name is its path, not its query
            self.files = self._shards_from_index(path)
        elif storage.isdir(path):
            self.files = self._shards_in_dir(path)
        else:
            self.files = [storage.abspath(path)]
        self._entries: Dict[str, _Entry] = {}
        self._data_start: List[int] = []
        infos: List[VariableInfo] = []
        for shard, file in enumerate(self.files):
            for name, e in self._parse_header(shard, file).items():
                if name in self._entries:
                    raise self._error(f"tensor {name!r} is stored twice (in "
                                      f"{storage.basename(self.files[self._entries[name].shard])} and "
                                      f"{storage.basename(file)})", file)
                self._entries[name] = e
                infos.append(VariableInfo(name, e.shape, e.dtype_name, name, KIND_VARIABLE, e.end - e.begin))
        self._set_infos(infos)

    # -- opening ---------------------------------------------------------------------------
    def _error(self, problem: str, file: Optional[str] = None, key: Optional[str] = None) -> CheckpointFormatError:
        file = file or self.path
        return CheckpointFormatError(
            f"Cannot read safetensors file {escape_name(storage.basename(file))}: {problem}. The file is corrupt, "
            f"truncated or not a safetensors file; re-copy it. (File: {escape_name(file)})", path=file, key=key)

    def _shards_from_index(self, index: str) -> List[str]:
        data = read_json_file(index, self._error)
        weight_map = data.get("weight_map") if isinstance(data, dict) else None
        if not isinstance(weight_map, dict) or not weight_map:
            raise self._error("the index has no 'weight_map' object naming the shard of each tensor", index)
        base = storage.dirname(storage.abspath(index))
        shards: List[str] = []
        for name, file in weight_map.items():
            if not is_plain_name(file, index):
                raise self._error(f"weight_map[{name!r}] = {file!r} is not a file name in the index's "
                                  "own directory (ckptmerge reads nothing outside the named files)", index)
            if file not in shards:
                shards.append(file)
        paths = [storage.join(base, f) for f in sorted(shards)]
        for p in paths:
            problem = None if storage.is_url(p) else link_problem(base, p)  # the folder scan's rules
            if problem:
                raise self._error(f"shard {escape_name(storage.basename(p))} named by its index {problem}", p)
            if not storage.isfile(p):
                raise CheckpointNotFoundError(
                    f"Shard {storage.basename(p)!r} named by {storage.basename(index)} does not exist "
                    f"in {base}; the set is incomplete. Download every shard the index names.", path=p)
        self._weight_map = weight_map
        return paths

    def _shards_in_dir(self, directory: str) -> List[str]:
        names = sorted(storage.listdir(directory))
        if not storage.is_url(directory):  # object stores have no links; a listing names objects only
            names = [n for n in names if not _skipped(directory, n)]
        indexes = [n for n in names if n.endswith(INDEX_SUFFIX)]
        if len(indexes) == 1:
            self.path = storage.join(directory, indexes[0])
            return self._shards_from_index(self.path)
        if len(indexes) > 1:
            raise CheckpointFormatError(
                f"Directory {directory!r} holds several safetensors index files ({', '.join(indexes)}); "
                "pass the one you mean.", path=directory)
        if storage.is_url(directory):
            files = [storage.join(directory, n) for n in names if n.endswith(".safetensors")]
        else:
            files = [os.path.join(os.path.abspath(directory), n) for n in names if n.endswith(".safetensors")]
        if not files:
            raise CheckpointNotFoundError(f"No .safetensors file in directory {directory!r}.", path=directory)
        return files

    def _parse_header(self, shard: int, file: str) -> Dict[str, _Entry]:
        try:
            fd = self._fds.get(shard, file)
        except FileNotFoundError:
            raise CheckpointNotFoundError(f"safetensors file {file!r} does not exist.", path=file) from None
        except OSError as e:
            raise self._error(f"cannot open it ({e.strerror or e})", file) from None
        size = size_of(fd)
        head = bytearray(8)
        if pread_into(fd, 0, memoryview(head)) < 8:
            raise self._error(f"it has {size} bytes, fewer than the 8-byte header length", file)
        n = struct.unpack("<Q", head)[0]
        if n > size - 8:
            raise self._error(f"the header claims {n} bytes but the file has {size - 8} after the length", file)
        if n > MAX_HEADER:
            raise self._error(f"the header claims {n} bytes, more than the {MAX_HEADER}-byte limit", file)
        raw = bytearray(n)
        pread_into(fd, 8, memoryview(raw))
        try:
            header = json.loads(bytes(raw).decode("utf-8"))
        except (UnicodeDecodeError, ValueError, RecursionError) as e:
            raise self._error(f"its JSON header does not parse ({type(e).__name__}: {str(e)[:80]})", file) from None
        if not isinstance(header, dict):
            raise self._error("its JSON header is not an object", file)
        try:  # a "\\ud800" escape parses to a lone surrogate: no Unicode text (the library refuses it)
            json.dumps(header, ensure_ascii=False).encode("utf-8")
        except UnicodeEncodeError:
            bad = next((k for k in header if not _is_text(k)), None)
            raise self._error("its JSON header holds a string that is not valid Unicode (a lone surrogate escape"
                              + (f", in tensor name {escape_name(bad)!r}" if bad is not None else "") + ")",
                              file) from None
        data_start = 8 + n
        self._data_start.append(data_start)
        data_len = size - data_start
        meta = header.pop("__metadata__", None)
        if meta is not None:
            if not isinstance(meta, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in meta.items()):
                raise self._error("'__metadata__' must map strings to strings", file)
            if shard == 0:
                self.metadata = dict(meta)
        out: Dict[str, _Entry] = {}
        for name, spec in header.items():
            out[name] = self._parse_entry(shard, file, name, spec, data_len)
        self._check_coverage(file, out, data_len)
        weight_map = getattr(self, "_weight_map", None)
        if weight_map is not None:
            base = storage.basename(file)
            listed = {k for k, v in weight_map.items() if v == base}
            extra = sorted(set(out) - listed)
            if extra:
                raise self._error(f"it holds {len(extra)} tensor(s) its index does not assign to it, e.g. {extra[0]!r}", file)
            missing = sorted(listed - set(out))
            if missing:
                raise self._error(f"the index assigns {len(missing)} tensor(s) to it that it lacks, e.g. {missing[0]!r}", file)
        return out

    def _check_coverage(self, file: str, entries: Dict[str, _Entry], data_len: int) -> None:
        """The tensors must tile the data exactly, as the format requires: the first at offset
        0, each starting where the one before ends, the last ending at the end of the file (no
        holes, no overlaps, no trailing bytes: nothing a polyglot file could hide there)."""
        pos, last = 0, None
        for begin, end, name in sorted((e.begin, e.end, n) for n, e in entries.items()):
            if begin < pos:
                raise self._error(f"tensors {last!r} and {name!r} overlap (bytes {begin}..{pos})", file, name)
            if begin > pos:
                where = f"after tensor {last!r}" if last is not None else "before the first tensor"
                raise self._error(f"bytes {pos}..{begin} of the data {where} belong to no tensor (tensor "
                                  f"{name!r} starts at {begin}; the format allows no holes"
                                  + (", and the first tensor starts at offset 0)" if last is None else ")"), file, name)
            pos, last = end, name
        if pos != data_len:
            raise self._error(f"the file has {data_len - pos} byte(s) after the last tensor's data (the data "
                              f"ends at byte {pos} of {data_len}; the format allows nothing after it)", file)

    def _parse_entry(self, shard: int, file: str, name: str, spec: Any, data_len: int) -> _Entry:
        if not isinstance(spec, dict):
            raise self._error(f"the header entry of {name!r} is not an object", file, name)
        code, shape, offsets = spec.get("dtype"), spec.get("shape"), spec.get("data_offsets")
        if not isinstance(code, str):
            raise self._error(f"tensor {name!r} has no dtype", file, name)
        if (not isinstance(offsets, list) or len(offsets) != 2
                or not all(type(o) is int for o in offsets) or not 0 <= offsets[0] <= offsets[1]):
            raise self._error(f"tensor {name!r} has invalid data_offsets {offsets!r}", file, name)
        begin, end = offsets
        if end > data_len:
            raise self._error(f"tensor {name!r} ends at byte {end} of the data but the data has {data_len} "
                              "(truncated file?)", file, name)
        listed = _LISTED.get(code)
        if listed is None:
            raise self._error(f"tensor {name!r} has dtype {escape_name(code)[:40]!r}, which is no safetensors "
                              f"dtype (they are {', '.join(sorted(_LISTED))})",
                              file, name)
        dtype, itemsize, bits = listed
        problem = shape_problem(shape, itemsize)  # (JSON makes lists, never tuples)
        if problem:
            raise self._error(f"tensor {name!r} {problem}", file, name)
        need_bits = math.prod(shape) * bits
        if need_bits % 8:
            raise self._error(f"tensor {name!r} has {math.prod(shape)} elements of {code}, which do not fill "
                              "a whole number of bytes", file, name)
        if end - begin != need_bits // 8:
            raise self._error(f"tensor {name!r} has {end - begin} bytes but shape {tuple(shape)} of "
                              f"{code} needs {need_bits // 8}", file, name)
        return _Entry(shard, code, dtype, tuple(shape), begin, end, bits)

    def _dtype(self, name: str, e: _Entry) -> np.dtype:
        """The numpy dtype of entry ``e``'s elements (ml_dtypes is imported here, when values are
        read; a packed type: one element per byte)."""
        table = PACKED_DTYPES if e.code in PACKED_BITS else SAFETENSORS_DTYPES
        dt = table.get(e.code)
        if dt is None:  # (a type an older ml_dtypes than ckptmerge knows lacks)
            raise UnreadableTensorError(
                f"Tensor {name!r} of {escape_name(storage.basename(self.files[e.shard]))} has safetensors dtype "
                f"{e.code} ({e.dtype_name}), which the installed ml_dtypes does not have. Upgrade it: "
                "pip install -U ml_dtypes", path=self.files[e.shard], key=name)
        return dt

    # -- reading ---------------------------------------------------------------------------
    def _read(self, info: VariableInfo) -> np.ndarray:
        e = self._entries[info.raw_key]
        if e.bits < 8:
            return self._read_packed(info, e)
        arr = aligned_empty(e.shape, self._dtype(info.raw_key, e))
        view = memoryview(arr.reshape(-1).view(np.uint8))
        if len(view):
            self._fill(info.name, e, self._data_start[e.shard] + e.begin, view)
        return arr

    def _iter_chunks(self, info: VariableInfo, max_elements: int) -> Iterator[np.ndarray]:
        """Pieces read from the file as they are asked for: memory for one piece."""
        e = self._entries[info.raw_key]
        if e.bits < 8 or info.size <= max_elements:  # packed, or one piece anyway
            return super()._iter_chunks(info, max_elements)
        start = self._data_start[e.shard] + e.begin
        return contiguous_chunks(self._dtype(info.raw_key, e), info.size, max_elements,
                                 lambda offset, view: self._fill(info.name, e, start + offset, view))

    def ranges(self, name: str) -> Optional[TensorRanges]:
        """A tensor of a local file as :class:`~ckptmerge.formats.ranges.TensorRanges` (no
        checksum: safetensors keeps none); ``None`` for packed 4- and 6-bit types, empty
        tensors and URLs (use :meth:`iter_chunks`).

        Example:
            >>> r = reader.ranges("enc.weight")                            # doctest: +SKIP
        """
        info = self.info(name)
        e = self._entries[info.raw_key]
        if e.bits < 8 or not info.size or storage.is_url(self.files[e.shard]):
            return None
        start = self._data_start[e.shard] + e.begin
        return TensorRanges(self._dtype(info.raw_key, e), info.size, lambda offset, view: self._fill(info.name, e, start + offset, view),
                            locate=lambda: (self._fd(e.shard), start))

    def read_many(self, names: Iterable[str], *, max_workers: Optional[int] = None) -> Dict[str, np.ndarray]:
        """Read several tensors at once: a thread pool fills the aligned arrays in file order,
        big tensors in segments of 32 MiB (``preadv`` releases the GIL), so a restore reads at
        disk or page-cache speed.

        Example:
            >>> arrays = reader.read_many(["enc.weight", "enc.bias"])  # doctest: +SKIP
        """
        names = list(names)
        infos = [self.info(n) for n in names]
        arrays: Dict[str, np.ndarray] = {}
        units: List[Tuple[str, _Entry, int, memoryview]] = []
        for info in infos:
            if info.raw_key in arrays:
                continue
            e = self._entries[info.raw_key]
            if e.bits < 8:
                arrays[info.raw_key] = self._read_packed(info, e)
                continue
            arr = arrays[info.raw_key] = aligned_empty(e.shape, self._dtype(info.raw_key, e))
            view = memoryview(arr.reshape(-1).view(np.uint8))
            for start in range(0, len(view), _SEGMENT):
                units.append((info.name, e, start, view[start:start + _SEGMENT]))
        units.sort(key=lambda u: (u[1].shard, u[1].begin + u[2]))

        def run(unit: Tuple[str, _Entry, int, memoryview]) -> None:
            name, e, start, view = unit
            self._fill(name, e, self._data_start[e.shard] + e.begin + start, view)

        workers = max_workers or (storage.REMOTE_CONCURRENCY.get() if storage.is_url(self.files[0])
                                  else min(8, 2 * (os.cpu_count() or 1)))
        if workers <= 1 or len(units) <= 1:
            for u in units:
                run(u)
        else:
            with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="ckptmerge-read") as pool:
                for _ in pool.map(run, units):
                    pass
        return {n: arrays[i.raw_key] for n, i in zip(names, infos)}

    def _read_packed(self, info: VariableInfo, e: _Entry) -> np.ndarray:
        """A sub-byte tensor, one element per byte (see :data:`PACKED_DTYPES`)."""
        if e.bits != 4:
            raise UnreadableTensorError(
                f"Tensor {info.name!r} of {escape_name(storage.basename(self.files[e.shard]))} has safetensors dtype "
                f"{e.code}: 6-bit values packed in an order neither the format nor the safetensors library "
                "defines (the library reads none of them either), so ckptmerge does not guess it. Exclude it, "
                "or unpack it with the code that wrote it.", path=self.files[e.shard], key=info.raw_key)
        packed = np.empty(e.end - e.begin, np.uint8)
        if len(packed):
            self._fill(info.name, e, self._data_start[e.shard] + e.begin, memoryview(packed))
        arr = aligned_empty(e.shape, np.uint8)
        flat = arr.reshape(-1)
        flat[0::2] = packed & 0x0F  # the first element of each byte in its low nibble
        flat[1::2] = packed >> 4
        return arr.view(self._dtype(info.raw_key, e))

    def _fill(self, name: str, e: _Entry, offset: int, view: memoryview) -> None:
        file = self.files[e.shard]
        try:
            got = pread_into(self._fd(e.shard), offset, view, key=name)
        except OSError as err:
            raise self._error(f"reading tensor {name!r} failed ({err.strerror or err})", file, name) from None
        if got < len(view):
            raise self._error(f"the file ended early while reading tensor {name!r} ({got} of {len(view)} "
                              "bytes); it was truncated after it was opened", file, name)

    def _fd(self, shard: int) -> Handle:
        return self._fds.get(shard, self.files[shard])

    def close(self) -> None:
        """Close the files (reading again reopens them)."""
        self._fds.close()


def _is_text(name: str) -> bool:
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _skipped(directory: str, name: str) -> bool:
    """Whether a folder scan leaves ``name`` out: a safetensors file or index that is not a
    regular file inside the folder (:func:`~ckptmerge.formats.io.localfile.link_problem`), with a
    warning naming it."""
    if not name.endswith((".safetensors", INDEX_SUFFIX)):
        return False
    problem = link_problem(directory, os.path.join(directory, name))
    if problem:
        logger.warning("%s: skipping %s, which %s", directory, name, problem)
    return problem is not None


def read_json_file(path: str, error: Any) -> Any:
    """A small JSON file (an index), read with a size cap; errors through ``error(problem, path)``."""
    if not storage.is_url(path) and os.path.exists(path) and not os.path.isfile(path):
        raise error("it is not a regular file", path)  # a FIFO would block, a device never end
    try:
        with storage.open_binary(path) as f:
            raw = f.read(MAX_HEADER + 1)
    except FileNotFoundError:
        raise CheckpointNotFoundError(f"{path!r} does not exist.", path=path) from None
    except OSError as e:
        raise error(f"cannot read it ({e.strerror or e})", path) from None
    if len(raw) > MAX_HEADER:
        raise error(f"it is larger than the {MAX_HEADER}-byte limit for an index", path)
    try:
        return json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as e:
        raise error(f"it is not valid JSON ({type(e).__name__})", path) from None
