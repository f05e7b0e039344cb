"""Publishing one finished output file: a temporary file beside it, moved into place at once.

The single-file writers (safetensors, Keras ``.weights.h5``) write a hidden temporary file in
the output's folder and publish it here: with ``overwrite`` by one rename (readers see the old
file or the new one, never a mix); without it by a hard link, which fails rather than replace a
file that appeared meanwhile. With ``durable`` the file and the folder are fsynced.
"""

from __future__ import annotations

import math
import os
from typing import Any, Iterable, Optional, Sequence

from ckptmerge.core.errors import (ArgumentError, ArgumentTypeError, CheckpointFormatError, CheckpointWriteError,
                              OutputExistsError)
from ckptmerge.formats.io.interrupts import HeldInterrupts
from ckptmerge.formats.io.output_prefix import remove_quietly, remove_stale_temps, temp_name
from ckptmerge.core.text import quote_name

__all__ = ["SingleFileWriter", "publish_file", "temp_path"]


def temp_path(abs_path: str) -> str:
    """A hidden temporary name beside ``abs_path`` (unique to this process and call), after
    removing the ones that writers of ``abs_path`` on this machine left when they were killed
    (:func:`~ckptmerge.formats.io.output_prefix.remove_stale_temps`).

    Example:
        >>> os.path.basename(temp_path("/out/model.safetensors")).startswith(".model.safetensors.ckptmerge-tmp-")
        True
    """
    remove_stale_temps(abs_path)
    return temp_name(abs_path)


def publish_file(tmp: str, abs_path: str, given: str, *, overwrite: bool, durable: bool) -> None:
    """Move the closed temporary file ``tmp`` to ``abs_path`` (``given``: the path as the user
    wrote it, for messages); the temporary file is removed whatever happens.

    Raises:
        OutputExistsError: without ``overwrite``, a file appeared at the output meanwhile.
        CheckpointWriteError: the move failed (permissions, disk).

    Example:
        >>> publish_file("/out/.m.tmp", "/out/m.safetensors", "out/m.safetensors",
        ...              overwrite=False, durable=False)                      # doctest: +SKIP
    """
    try:
        if durable:
            fd = os.open(tmp, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        with HeldInterrupts():  # published and its temporary name gone, or neither (Ctrl-C waits)
            if overwrite:
                os.replace(tmp, abs_path)
            else:
                os.link(tmp, abs_path)  # fails, unlike a rename, if the output appeared meanwhile
                os.remove(tmp)
    except FileExistsError:
        remove_quietly(tmp)
        raise OutputExistsError(f"A file appeared at {quote_name(given)} while it was being written (another "
                                "merge?); nothing was replaced. Choose another output, or pass "
                                "overwrite=True (--force).", path=given) from None
    except OSError as e:
        remove_quietly(tmp)
        raise CheckpointWriteError(f"Cannot publish {given!r}: {e.strerror or e}", path=given,
                                   errno_=e.errno) from e
    if durable:
        dfd = os.open(os.path.dirname(abs_path), os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)


class SingleFileWriter:
    """What the publishing writers share (safetensors and Keras ``.weights.h5`` files, and the
    Orbax writer's folder): the context-manager protocol, copying a tensor from a byte range of another file,
    the source checksum check, and the check that every declared tensor was written.

    Subclasses provide ``add_raw(key, dtype_enum, shape, chunks, *, expected_crc32c)``,
    ``abort()``, ``path``, ``_layout`` (the declared names) and ``_written``.
    """

    path: str
    _layout: dict
    _written: set

    def _set_output(self, path: Any, overwrite: bool, durable: bool) -> None:
        """Check and keep the output path (``path``, ``_abs``) and the publishing options."""
        if isinstance(path, bool) or not isinstance(path, (str, os.PathLike)):
            raise ArgumentTypeError(f"path must be a str or os.PathLike. Received: path={path!r}")
        self.path = os.fspath(path)
        self._abs = os.path.abspath(self.path)
        self._overwrite, self._durable = bool(overwrite), bool(durable)

    def add_raw(self, key: str, dtype_enum: int, shape: Sequence[int], chunks: Iterable[Any], *,
                expected_crc32c: Optional[int] = None) -> None:  # pragma: no cover - abstract
        raise NotImplementedError

    def abort(self) -> None:  # pragma: no cover - abstract
        raise NotImplementedError

    def finish(self) -> None:  # pragma: no cover - abstract
        raise NotImplementedError

    def __enter__(self) -> "SingleFileWriter":
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if exc_type is None:
            self.finish()
        else:
            self.abort()

    def __del__(self) -> None:  # a forgotten writer leaves no temporary file
        try:
            if getattr(self, "_state", None) == "open":
                self.abort()
        except BaseException:  # noqa: BLE001 - interpreter shutdown, or a Ctrl-C that landed here
            pass               # (Python would only print it as "Exception ignored")

    def add_range(self, key: str, dtype_enum: int, shape: Sequence[int], src_fd: int, src_offset: int, *,
                  expected_crc32c: Optional[int] = None, verify: bool = True) -> None:
        """Copy a tensor's raw bytes from a range of another file (as ``BundleWriter.add_range``).

        Example:
            >>> w.add_range("emb", 1, (1000, 64), fd, 4096, expected_crc32c=crc)  # doctest: +SKIP
        """
        from ckptmerge.formats.dtypes import TF_TO_NUMPY
        from ckptmerge.formats.io.bytecopy import pread_pieces

        nbytes = math.prod(int(d) for d in shape) * TF_TO_NUMPY[dtype_enum].itemsize
        self.add_raw(key, dtype_enum, shape, pread_pieces(src_fd, src_offset, nbytes),
                     expected_crc32c=expected_crc32c if verify else None)

    def _check_crc(self, key: str, masked: int, expected: Optional[int]) -> None:
        """Raise (after aborting) when a copied tensor's masked CRC32C is not the one its source
        recorded (``expected``; ``None``: not checked)."""
        if expected is not None and masked != expected:
            self.abort()
            raise CheckpointFormatError(
                f"Tensor {quote_name(key)} failed its checksum: its bytes have masked CRC32C {masked:#010x}, the "
                f"source recorded {expected:#010x}. The source checkpoint is corrupt; it was not copied.", key=key)

    def _check_all_written(self) -> None:
        """Raise (after aborting) when a declared tensor was never written."""
        missing = [k for k in self._layout if k not in self._written]
        if missing:
            self.abort()
            raise ArgumentError(f"{len(missing)} declared tensor(s) were never written, e.g. {missing[0]!r}; "
                                f"nothing was written to {quote_name(self.path)}.")
