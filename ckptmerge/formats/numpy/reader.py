"""Read NumPy files as checkpoints: a ``.npz`` archive, or a directory of ``.npy`` files.

Each array is one tensor. In a ``.npz`` its name is the member name without ``.npy`` (the key
given to ``np.savez``, ``/`` scopes kept); in a directory it is the path below the directory
without ``.npy``, with ``/`` between folders. Files are untrusted: object (pickled) arrays are
never loaded, headers are parsed with numpy's own literal-only parser, every declared size is
checked against the file before allocating, ``.npz`` members are opened under the rules of
:mod:`ckptmerge.formats.io.zipmembers` (no encrypted members or unknown methods; a compressed
member may expand at most :data:`~ckptmerge.formats.io.zipmembers.MAX_EXPANSION` times),
symbolic links in a directory are not followed, and ZIP CRC-32 checksums are verified while
reading (``verify=False`` skips them for stored members; zipfile always checks compressed ones).
"""

from __future__ import annotations

import contextlib
import io
import math
import os
import struct
import threading
import zipfile
import zlib
from typing import Any, Callable, Dict, Iterator, Optional, Tuple

import numpy as np

from ckptmerge.core import limits
from ckptmerge.core.errors import CheckpointFormatError, CheckpointNotFoundError
from ckptmerge.formats.base import CheckpointReader, aligned_empty, contiguous_chunks, shape_problem
from ckptmerge.formats.dtypes import dtype_name
from ckptmerge.formats.io import storage
from ckptmerge.formats.io.fileio import Descriptors, Handle, pread_into
from ckptmerge.formats.io.localfile import link_problem
from ckptmerge.formats.io.urlpath import path_part
from ckptmerge.formats.io.zipmembers import check_member, member_errors, open_member
from ckptmerge.core.redact import get_logger
from ckptmerge.core.specs import KIND_VARIABLE, VariableInfo
from ckptmerge.core.text import escape_name

__all__ = ["NumpyReader", "is_npz", "holds_npy", "NPY_MAGIC"]

logger = get_logger(__name__)

#: The 6 bytes every ``.npy`` file starts with.
NPY_MAGIC = b"\x93NUMPY"
_MAX_NPY_HEADER = 1 << 20
_PIECE = 1 << 22  # bytes per read from a compressed member


def is_npz(path: str) -> bool:
    """True if ``path`` is a zip archive meant as a ``.npz`` (``np.savez``): named ``*.npz``, or
    holding ``.npy`` members. A member that is not an array is then refused by the reader, which
    says which.

    Example:
        >>> is_npz("weights.npz")  # doctest: +SKIP
        True
    """
    try:
        with storage.open_zip(path, storage.SNIFF_BLOCK) as z:
            names = z.namelist()
    except (OSError, zipfile.BadZipFile, ValueError):
        return False
    return path_part(path).lower().endswith(".npz") or any(n.endswith(".npy") for n in names)


def holds_npy(directory: str, limit: int = 100_000) -> bool:
    """True if an ``.npy`` file lies in ``directory`` or in a folder below it (what
    :class:`NumpyReader` reads from a directory). Symbolic links are not followed, as the reader
    follows none, and at most ``limit`` entries are looked at.

    Example:
        >>> holds_npy("/nonexistent")
        False
    """
    stack, seen = [directory], 0
    while stack and seen < limit:
        try:
            with os.scandir(stack.pop()) as it:
                for entry in it:
                    seen += 1
                    if entry.is_symlink():
                        continue
                    if entry.name.endswith(".npy") and entry.is_file(follow_symlinks=False):
                        return True
                    if entry.is_dir(follow_symlinks=False):
                        stack.append(entry.path)
        except OSError:
            continue
    return False


class _Array:
    __slots__ = ("file", "member", "dtype", "shape", "fortran", "offset", "header", "crc")

    def __init__(self, file: str, member: Optional[zipfile.ZipInfo], dtype: np.dtype, shape: Tuple[int, ...],
                 fortran: bool, offset: int, header: bytes, crc: Optional[int]) -> None:
        self.file, self.member, self.dtype, self.shape = file, member, dtype, shape
        self.fortran, self.offset, self.header, self.crc = fortran, offset, header, crc


def _parse_npy_header(stream: Any, where: str, error: Any) -> Tuple[np.dtype, Tuple[int, ...], bool, bytes]:
    """Parse an ``.npy`` header from ``stream``; return dtype, shape, fortran order, header bytes."""
    fmt = np.lib.format
    start = stream.read(8)
    if len(start) < 8 or start[:6] != NPY_MAGIC:
        raise error(f"{where} is not an .npy array (no NumPy magic)")
    major = start[6]
    if major == 1:
        n_len = stream.read(2)
        if len(n_len) < 2:
            raise error(f"{where}: truncated .npy header")
        hlen = struct.unpack("<H", n_len)[0]
    elif major in (2, 3):
        n_len = stream.read(4)
        if len(n_len) < 4:
            raise error(f"{where}: truncated .npy header")
        hlen = struct.unpack("<I", n_len)[0]
    else:
        raise error(f"{where}: unsupported .npy format version {major}.{start[7]}")
    if hlen > _MAX_NPY_HEADER:
        raise error(f"{where}: .npy header of {hlen} bytes is larger than the {_MAX_NPY_HEADER}-byte limit")
    text = stream.read(hlen)
    if len(text) < hlen:
        raise error(f"{where}: truncated .npy header")
    raw = start + n_len + text
    try:
        version = (major, start[7])
        d = fmt._read_array_header(io.BytesIO(raw[8:]), version, max_header_size=_MAX_NPY_HEADER + 1) \
            if hasattr(fmt, "_read_array_header") else None
        if d is None:  # pragma: no cover - numpy without the private helper
            reader = fmt.read_array_header_1_0 if major == 1 else fmt.read_array_header_2_0
            d = reader(io.BytesIO(raw[8:]))
        shape, fortran, dtype = d
    except (ValueError, SyntaxError, TypeError) as e:
        raise error(f"{where}: malformed .npy header ({str(e)[:100]})") from None
    if dtype.hasobject:
        raise error(f"{where} holds Python objects (a pickled array), which ckptmerge never loads: "
                    "it could run code. Save plain numeric arrays instead")
    if dtype.names is not None or dtype.subdtype is not None:
        raise error(f"{where} has structured dtype {dtype}, which is not a tensor dtype")
    problem = shape_problem(shape, dtype.itemsize)
    if problem:
        raise error(f"{where} {problem}")
    return dtype, tuple(int(s) for s in shape), bool(fortran), raw


class NumpyReader(CheckpointReader):
    """Reader of a ``.npz`` archive or a directory of ``.npy`` files.

    Use :func:`ckptmerge.formats.open_checkpoint` (or ``cm.open``) rather than this class.

    Raises:
        CheckpointNotFoundError: the path does not exist, or a directory holds no ``.npy`` file.
        CheckpointFormatError: a header is malformed, an array holds Python objects, or a size
            contradicts the file.

    Example:
        >>> import numpy as np
        >>> np.savez("/tmp/w.npz", **{"dense/kernel": np.ones((2, 3), "float32")})
        >>> with NumpyReader("/tmp/w.npz") as r:
        ...     r.get("dense/kernel").shape
        (2, 3)
    """

    format = "numpy"

    def __init__(self, path: str, *, verify: bool = True) -> None:
        super().__init__(path)
        self.verify = verify
        self._lock = threading.Lock()
        self._fds = Descriptors()
        self._zip: Optional[zipfile.ZipFile] = None
        self._arrays: Dict[str, _Array] = {}
        if storage.isdir(path):
            self._scan_dir(path)
        elif storage.isfile(path):
            self._scan_npz(path)
        else:
            raise CheckpointNotFoundError(f"NumPy file or directory {path!r} does not exist.", path=path)
        infos = []
        for name, a in sorted(self._arrays.items()):
            nbytes = math.prod(a.shape) * a.dtype.itemsize
            infos.append(VariableInfo(name, a.shape, dtype_name(a.dtype.newbyteorder("=")), name,
                                      KIND_VARIABLE, nbytes))
        self._set_infos(infos)

    def _error(self, problem: str, file: Optional[str] = None) -> CheckpointFormatError:
        file = file or self.path
        return CheckpointFormatError(f"Cannot read NumPy data {storage.basename(file)!r}: {problem}. "
                                     f"(File: {escape_name(file)})", path=file)

    # -- listing ---------------------------------------------------------------------------
    def _scan_dir(self, root: str) -> None:
        if storage.is_url(root):  # object stores have no links: every object below, by its path
            for rel, url in storage.walk_files(root):
                if rel.endswith(".npy"):
                    self._add_npy(rel[:-4], url)
        root = storage.abspath(root)
        stack = [("", root)] if not storage.is_url(root) else []
        while stack:
            rel, folder = stack.pop()
            with os.scandir(folder) as it:
                for entry in sorted(it, key=lambda e: e.name):
                    name = f"{rel}/{entry.name}" if rel else entry.name
                    if entry.is_symlink():
                        problem = link_problem(root, entry.path) if entry.name.endswith(".npy") else "is a link"
                        if problem is None:  # a link to a file inside the directory
                            self._add_npy(name[:-4], entry.path)
                        else:
                            logger.warning("%s: skipping symbolic link %s (ckptmerge reads only files inside "
                                           "the directory)", root, name)
                    elif entry.is_dir(follow_symlinks=False):
                        stack.append((name, entry.path))
                    elif entry.name.endswith(".npy") and entry.is_file(follow_symlinks=False):
                        self._add_npy(name[:-4], entry.path)
        if not self._arrays:
            raise CheckpointNotFoundError(
                f"No .npy file in directory {self.path!r}: a NumPy checkpoint directory holds one "
                "'<name>.npy' per tensor.", path=self.path)

    def _add_npy(self, name: str, file: str) -> None:
        size = storage.getsize(file)
        with storage.open_binary(file) as f:
            dtype, shape, fortran, header = _parse_npy_header(
                f, repr(storage.basename(file)), lambda p: self._error(p, file))
        need = len(header) + math.prod(shape) * dtype.itemsize
        if size < need:
            raise self._error(f"shape {shape} of {dtype} needs {need} bytes but the file has {size} "
                              "(truncated?)", file)
        self._arrays[name] = _Array(file, None, dtype, shape, fortran, len(header), header, None)

    def _scan_npz(self, path: str) -> None:
        try:
            self._zip = z = storage.open_zip(path)
        except (zipfile.BadZipFile, OSError, ValueError) as e:
            raise self._error(f"not a .npz (zip) archive ({e})", path) from None
        size = storage.getsize(path)
        infos = z.infolist()
        if not infos:
            raise self._error("the archive is empty; a .npz holds one '<name>.npy' member per tensor", path)
        for info in infos:
            if info.is_dir():
                continue
            if not info.filename.endswith(".npy"):
                raise self._error(f"member {escape_name(info.filename)!r} is not an .npy array; a .npz "
                                  "holds only arrays (np.savez writes one '<name>.npy' per tensor)", path)
            check_member(info, path, size)
            where = repr(info.filename)
            stored = info.compress_type == zipfile.ZIP_STORED
            try:
                if stored:  # parse in place: zipfile would check the CRC of the whole member first
                    start = self._stored_offset(info, path)
                    with storage.open_binary(path) as f:
                        f.seek(start)
                        dtype, shape, fortran, header = _parse_npy_header(f, where, lambda p: self._error(p, path))
                else:
                    with open_member(z, info, path) as m, member_errors(path, info.filename):
                        dtype, shape, fortran, header = _parse_npy_header(m, where, lambda p: self._error(p, path))
            except OSError as e:
                limits.check(e, path, doing="read")
                raise self._error(f"member {where} is damaged ({e})", path) from None
            need = len(header) + math.prod(shape) * dtype.itemsize
            if info.file_size != need:
                raise self._error(f"member {where} has {info.file_size} bytes but its shape {shape} of "
                                  f"{dtype} needs {need}", path)
            offset = -1
            if stored:
                offset = start + len(header)
                if start + need > size:
                    raise self._error(f"member {where} runs past the end of the archive (truncated?)", path)
            self._arrays[info.filename[:-4]] = _Array(path, info, dtype, shape, fortran, offset, header, info.CRC)

    def _stored_offset(self, info: zipfile.ZipInfo, path: str) -> int:
        """Where a stored member's bytes start in the archive (after its local header)."""
        head = bytearray(30)
        if pread_into(self._fd(path), info.header_offset, memoryview(head)) < 30 or head[:4] != b"PK\x03\x04":
            raise self._error(f"bad local header for member {info.filename!r}", path)
        name_len, extra_len = struct.unpack("<HH", head[26:30])
        return info.header_offset + 30 + name_len + extra_len

    # -- reading ---------------------------------------------------------------------------
    def _fd(self, file: str) -> Handle:
        return self._fds.get(file, file)

    def _read(self, info: VariableInfo) -> np.ndarray:
        a = self._arrays[info.raw_key]
        stored_shape = a.shape[::-1] if a.fortran else a.shape
        raw = aligned_empty(stored_shape, a.dtype)
        view = memoryview(raw.reshape(-1).view(np.uint8))
        where = self._where(info, a)
        if a.member is None or a.offset >= 0:  # a plain file, or a stored member: read in place
            self._pread(a, 0, view, where, info.name)
            if self.verify and a.crc is not None and zlib.crc32(view, zlib.crc32(a.header)) != a.crc:
                raise self._crc_error(a, where)
        else:
            self._inflate(a, view, where)
        arr = raw.T if a.fortran else raw
        if not arr.dtype.isnative:
            arr = arr.byteswap().view(arr.dtype.newbyteorder("="))
        if arr is not raw:
            out = aligned_empty(a.shape, arr.dtype)
            np.copyto(out, arr)
            return out
        return raw

    def _iter_chunks(self, info: VariableInfo, max_elements: int) -> Iterator[np.ndarray]:
        """Pieces read as they are asked for (memory for one piece) when the array lies in C order:
        an ``.npy`` file or a stored ``.npz`` member (read in place; the CRC-32 is accumulated on
        the way), or a compressed member (decompressed piece by piece). The checksum is checked
        before the last piece is yielded."""
        a = self._arrays[info.raw_key]
        if a.fortran or info.size <= max_elements:
            return super()._iter_chunks(info, max_elements)
        if a.member is not None and a.offset < 0:
            return self._stream_compressed(info, a, max_elements)
        return self._stream(info, a, max_elements)

    def _stream_compressed(self, info: VariableInfo, a: _Array, max_elements: int) -> Iterator[np.ndarray]:
        native = a.dtype.newbyteorder("=")
        with self._member_data(a, self._where(info, a), info.size * a.dtype.itemsize) as fill:
            for piece in contiguous_chunks(a.dtype, info.size, max_elements, lambda _offset, view: fill(view)):
                yield piece if a.dtype.isnative else piece.byteswap().view(native)

    def _stream(self, info: VariableInfo, a: _Array, max_elements: int) -> Iterator[np.ndarray]:
        where, nbytes = self._where(info, a), info.size * a.dtype.itemsize
        check = self.verify and a.crc is not None
        crc = zlib.crc32(a.header)

        def fill(offset: int, view: memoryview) -> None:
            nonlocal crc
            self._pread(a, offset, view, where, info.name)
            if check:
                crc = zlib.crc32(view, crc)
                if offset + len(view) == nbytes and crc != a.crc:
                    raise self._crc_error(a, where)

        if a.dtype.isnative:
            return contiguous_chunks(a.dtype, info.size, max_elements, fill)
        native = a.dtype.newbyteorder("=")
        # (map, unlike a generator, keeps no reference to a piece it has handed out)
        return map(lambda piece: piece.byteswap().view(native), contiguous_chunks(a.dtype, info.size, max_elements, fill))

    @staticmethod
    def _where(info: VariableInfo, a: _Array) -> str:
        return f"{info.name!r} in {storage.basename(a.file)}"

    def _pread(self, a: _Array, offset: int, view: memoryview, where: str, key: str) -> None:
        """Read the array's bytes from ``offset`` (from its first byte) into ``view``, in place."""
        try:
            got = pread_into(self._fd(a.file), a.offset + offset, view, key=key)
        except OSError as e:
            limits.check(e, a.file, doing="read")
            raise self._error(f"reading {where} failed ({e.strerror or e})", a.file) from None
        if got < len(view):
            raise self._error(f"the file ended early while reading {where}", a.file)

    def _crc_error(self, a: _Array, where: str) -> CheckpointFormatError:
        return self._error(f"CRC-32 mismatch for {where}: the archive is corrupt; re-copy it, or "
                           "read it anyway with verify=False", a.file)

    def _inflate(self, a: _Array, view: memoryview, where: str) -> None:
        """Decompress a member straight into ``view``, in pieces (never a second full copy)."""
        with self._member_data(a, where, len(view)) as fill:
            for start in range(0, len(view), _PIECE):
                fill(view[start:start + _PIECE])

    @contextlib.contextmanager
    def _member_data(self, a: _Array, where: str, nbytes: int) -> Iterator[Callable[[memoryview], None]]:
        """A compressed member opened past its header: ``fill(view)`` decompresses the next
        ``len(view)`` bytes into ``view``; when all ``nbytes`` are in, zipfile checks the CRC-32."""
        assert a.member is not None
        member = a.member.filename
        done = 0
        with self._lock:
            if self._zip is None:
                self._zip = storage.open_zip(a.file)
            m = open_member(self._zip, a.member, a.file)

        def fill(view: memoryview) -> None:
            nonlocal done
            with member_errors(a.file, member):
                got = 0
                while got < len(view):
                    n = m.readinto(view[got:])
                    if not n:
                        raise self._error(f"member {where} ended early", a.file)
                    got += n
                done += got
                if done >= nbytes:
                    m.read(1)  # reaching the end makes zipfile check the CRC (always, even unverified)

        try:
            with m, member_errors(a.file, member):
                m.read(len(a.header))
                yield fill
        except OSError as e:
            limits.check(e, a.file, doing="read")
            raise self._error(f"reading {where} failed: the archive is damaged ({e})", a.file) from None

    def close(self) -> None:
        """Close the files (reading again reopens them)."""
        with self._lock:
            z, self._zip = self._zip, None
        if z is not None:
            z.close()
        self._fds.close()
