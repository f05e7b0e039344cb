"""Write a ``.safetensors`` file atomically and in bounded memory, without TensorFlow.

The safetensors header lists every tensor's dtype, shape and byte range before the data, so the
writer is given the output's specs up front (the merge plan knows them before reading a byte):
it writes the header once, then each tensor at its precomputed offset as it arrives, in any
order, streamed in pieces. Data is written to a hidden temporary file beside the output and
published with one rename; without ``overwrite`` the publish is a hard link, which fails rather
than replace a file that appeared meanwhile. A failed or killed write leaves no file at the
output path. The writer offers the same ``add`` / ``add_raw`` / ``add_range`` / ``finish`` /
``abort`` methods as :class:`~ckptmerge.formats.tf.writer.BundleWriter`, so a merge streams into
either.
"""

from __future__ import annotations

import json
import math
import os
from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple, Union

import crc32c as _crc32c
import numpy as np

from ckptmerge.core import limits
from ckptmerge.core.errors import (
    ArgumentError,
    ArgumentTypeError,
    CheckpointWriteError,
    OutputExistsError,
)
from ckptmerge.formats.dtypes import TF_TO_NUMPY, dtype_name, tf_dtype_name
from ckptmerge.formats.io.bytecopy import array_chunks
from ckptmerge.formats.io.output_prefix import remove_quietly
from ckptmerge.formats.io.publish import SingleFileWriter, publish_file, temp_path
from ckptmerge.formats.safetensors.reader import SAFETENSORS_DTYPES, safetensors_dtype
from ckptmerge.formats.tf.bundle import mask_crc
from ckptmerge.core.redact import get_logger
from ckptmerge.core.text import quote_name

__all__ = ["SafetensorsWriter", "unsupported_dtypes"]

logger = get_logger(__name__)

# The JSON header is padded with spaces (as the format allows) so the data starts on a page
# boundary: every tensor's bytes then begin page-aligned or element-aligned in the page cache.
_HEADER_ALIGN = 4096
BytesLike = Union[bytes, bytearray, memoryview]
Spec = Tuple[str, str, Sequence[int]]


def unsupported_dtypes(specs: Iterable[Spec]) -> List[Tuple[str, str]]:
    """The ``(name, dtype)`` pairs that safetensors cannot store (strings, quantized types).

    Example:
        >>> unsupported_dtypes([("a", "float32", (2,)), ("vocab", "string", (3,))])
        [('vocab', 'string')]
    """
    return [(n, d) for n, d, _ in specs if safetensors_dtype(d) is None]


class SafetensorsWriter(SingleFileWriter):
    """Write one ``.safetensors`` file whose tensors (names, dtypes, shapes) are known up front.

    Args:
        path: the output file (``out/model.safetensors``); missing parent folders are created.
        specs: ``(name, dtype, shape)`` of every tensor; dtype is a numpy-style name
            (``"float32"``, ``"bfloat16"``). Tensors are laid out largest element size first,
            so each starts aligned to its element size.
        metadata: the header's ``__metadata__`` (strings to strings).
        overwrite: replace an existing file at ``path``.
        durable: fsync the file and its folder before and after publishing.

    Raises:
        OutputExistsError: ``path`` exists and ``overwrite`` is false.
        ArgumentError: a dtype safetensors cannot store, a duplicate name, a bad shape.
        CheckpointWriteError: the output folder cannot be written.

    Example:
        >>> with SafetensorsWriter("out/model.safetensors", [("w", "float32", (2, 3))]) as w:  # doctest: +SKIP
        ...     w.add("w", np.ones((2, 3), np.float32))
    """

    def __init__(self, path: Union[str, "os.PathLike[str]"], specs: Sequence[Spec], *,
                 metadata: Optional[Mapping[str, str]] = None, overwrite: bool = False,
                 durable: bool = False) -> None:
        self._set_output(path, overwrite, durable)
        bad = unsupported_dtypes(specs)
        if bad:
            raise ArgumentError(
                f"safetensors cannot store {len(bad)} of these tensors' dtypes, e.g. {bad[0][0]!r} "
                f"({bad[0][1]}). Exclude them, or write a TF checkpoint instead.")
        self._layout: Dict[str, Tuple[str, Tuple[int, ...], int, int]] = {}
        header: Dict[str, Any] = {}
        if metadata:
            if not all(isinstance(k, str) and isinstance(v, str) for k, v in metadata.items()):
                raise ArgumentTypeError("metadata must map str to str. Received: metadata with other types")
            header["__metadata__"] = dict(metadata)
        pos = 0
        # Larger elements first (stable), so every tensor starts aligned to its element size.
        ordered = sorted(specs, key=lambda s: -SAFETENSORS_DTYPES[safetensors_dtype(s[1])].itemsize)
        for name, dtype, shape in ordered:
            dims = tuple(int(d) for d in shape)
            if name in self._layout or name == "__metadata__":
                raise ArgumentError(f"tensor name {name!r} is given twice (or is reserved)")
            if any(d < 0 for d in dims):
                raise ArgumentError(f"tensor {name!r} has a negative dimension: {dims}")
            try:
                name.encode("utf-8")
            except UnicodeEncodeError:
                raise ArgumentError(
                    f"tensor name {quote_name(name)} is not valid Unicode text (it holds a lone surrogate, as a "
                    "file name that is not UTF-8 gives), and safetensors names are UTF-8. Rename it with a map "
                    "rule, or write a TF checkpoint.") from None
            nbytes = math.prod(dims) * SAFETENSORS_DTYPES[safetensors_dtype(dtype)].itemsize
            self._layout[name] = (dtype, dims, pos, nbytes)
            header[name] = {"dtype": safetensors_dtype(dtype), "shape": list(dims), "data_offsets": [pos, pos + nbytes]}
            pos += nbytes
        text = json.dumps(header, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
        text += b" " * (-(len(text) + 8) % _HEADER_ALIGN)
        self._data_start = 8 + len(text)
        self._size = self._data_start + pos
        self._written: set = set()
        self._state = "open"
        self._check_existing()
        directory = os.path.dirname(self._abs)
        self._tmp = temp_path(self._abs)
        try:
            os.makedirs(directory, exist_ok=True)
            self._fd = os.open(self._tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0), 0o644)
        except OSError as e:
            limits.check(e, self._tmp, doing="create")
            raise CheckpointWriteError(f"Cannot create {self._tmp!r} to write {self.path!r}: {e.strerror or e}",
                                       path=self._tmp, errno_=e.errno) from e
        try:
            self._pwrite(len(text).to_bytes(8, "little") + text, 0)
        except BaseException:
            self.abort()
            raise

    # -- adding tensors --------------------------------------------------------------------
    def _check_existing(self) -> None:
        if not self._overwrite and os.path.lexists(self._abs):
            raise OutputExistsError(f"A file already exists at {quote_name(self.path)}. Choose another output, or pass "
                                    "overwrite=True (--force) to replace it.", path=self.path)

    def _slot(self, key: str, dtype: str, shape: Sequence[int]) -> Tuple[int, int]:
        if self._state != "open":
            raise ArgumentError(f"This SafetensorsWriter for {quote_name(self.path)} is already {self._state}.")
        spec = self._layout.get(key)
        if spec is None:
            raise ArgumentError(f"tensor {key!r} was not declared when the writer was created")
        if key in self._written:
            raise ArgumentError(f"tensor {key!r} was already written")
        want_dtype, want_shape, offset, nbytes = spec
        if dtype != want_dtype or tuple(int(d) for d in shape) != want_shape:
            raise ArgumentError(f"tensor {key!r} is {dtype} {tuple(shape)}, declared as {want_dtype} {want_shape}")
        return self._data_start + offset, nbytes

    def _pwrite(self, data: BytesLike, offset: int) -> None:
        view = memoryview(data).cast("B")
        done = 0
        try:
            while done < len(view):
                done += os.pwrite(self._fd, view[done:], offset + done)
        except OSError as e:
            self.abort()
            raise CheckpointWriteError(f"Cannot write {self.path!r} (temporary file {self._tmp!r}): "
                                       f"{e.strerror or e}", path=self._tmp, errno_=e.errno) from e

    def _stream(self, key: str, offset: int, nbytes: int, chunks: Iterable[BytesLike]) -> int:
        """Write ``chunks`` at ``offset``; return their CRC32C (for a source checksum check)."""
        done, crc = 0, 0
        for chunk in chunks:
            n = memoryview(chunk).nbytes
            if done + n > nbytes:
                raise ArgumentError(f"tensor {key!r}: the chunks hold more than its {nbytes} bytes")
            crc = _crc32c.crc32c(chunk, crc)
            self._pwrite(chunk, offset + done)
            done += n
        if done != nbytes:
            raise ArgumentError(f"tensor {key!r}: the chunks held {done} of its {nbytes} bytes")
        return crc

    def add(self, key: str, value: np.ndarray) -> None:
        """Write a whole array (any memory order; written little-endian, C order).

        Example:
            >>> w.add("dense.weight", np.zeros((4, 3), np.float32))  # doctest: +SKIP
        """
        value = np.asarray(value)
        offset, nbytes = self._slot(key, dtype_name(value.dtype), value.shape)
        le = value.dtype.newbyteorder("<") if value.dtype.byteorder == ">" else value.dtype
        self._stream(key, offset, nbytes, array_chunks(value, le))
        self._written.add(key)

    def add_raw(self, key: str, dtype_enum: int, shape: Sequence[int], chunks: Iterable[BytesLike], *,
                expected_crc32c: Optional[int] = None) -> None:
        """Write a tensor from its raw little-endian bytes, streamed (as ``BundleWriter.add_raw``).

        Example:
            >>> w.add_raw("emb", 1, (1000, 64), pieces)  # doctest: +SKIP
        """
        dtype = dtype_name(TF_TO_NUMPY[dtype_enum]) if dtype_enum in TF_TO_NUMPY else tf_dtype_name(dtype_enum)
        offset, nbytes = self._slot(key, dtype, shape)
        crc = self._stream(key, offset, nbytes, chunks)
        self._check_crc(key, mask_crc(crc), expected_crc32c)
        self._written.add(key)

    # -- publishing ------------------------------------------------------------------------
    def finish(self) -> None:
        """Check every declared tensor was written, then move the file into place atomically.

        Raises:
            ArgumentError: a declared tensor was never written (nothing is published).
            OutputExistsError: a file appeared at the output meanwhile (without ``overwrite``).
        """
        self._check_all_written()
        try:
            os.ftruncate(self._fd, self._size)  # zero-size tensors at the end
            os.close(self._fd)  # (publish_file fsyncs a durable file)
            self._fd = -1
        except OSError as e:
            self.abort()
            raise CheckpointWriteError(f"Cannot publish {self.path!r}: {e.strerror or e}", path=self.path,
                                       errno_=e.errno) from e
        try:
            publish_file(self._tmp, self._abs, self.path, overwrite=self._overwrite, durable=self._durable)
        except BaseException:
            self.abort()
            raise
        self._state = "finished"

    def abort(self) -> None:
        """Remove the temporary file; nothing appears at the output."""
        if self._state != "open":
            return
        self._state = "aborted"
        if getattr(self, "_fd", -1) >= 0:
            try:
                os.close(self._fd)
            except OSError:  # pragma: no cover
                pass
            self._fd = -1
        if hasattr(self, "_tmp"):
            remove_quietly(self._tmp)

