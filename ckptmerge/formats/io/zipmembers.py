"""Members of zip archives (``.npz``, ``.keras``), opened under one set of rules.

Archives are untrusted. Before a member is read, :func:`check_member` refuses an encrypted
member, a compression method ckptmerge does not decompress, sizes that run past the end of the
archive, and a compressed member declaring more than :data:`MAX_EXPANSION` times its
compressed size (a decompression bomb; only near-constant data compresses that well).
:func:`member_errors` turns what :mod:`zipfile` raises while a member streams (``EOFError``,
``zlib.error``, ``lzma.LZMAError``, bzip2's ``OSError`` without an errno, ``BadZipFile``, a CRC
mismatch) into a :class:`~ckptmerge.core.errors.CheckpointFormatError` naming the archive and the
member, whatever its compression, so no reader lets a zip fault escape as a traceback. zipfile
never yields more than the member's declared size, so the bound holds while the data streams,
not only on paper.
"""

from __future__ import annotations

import contextlib
import lzma
import os
import zipfile
import zlib
from typing import Any, Iterator, Optional

from ckptmerge.core.errors import CheckpointFormatError, UnsafeCheckpointError
from ckptmerge.core.text import escape_name, human_bytes

__all__ = ["MAX_EXPANSION", "SMALL_MEMBER", "check_member", "member_errors", "open_member"]

#: A compressed member (like a compressed HDF5 dataset) may hold at most this many times the
#: bytes it occupies in the archive. Weights compress far less (float32 about 1.1x).
MAX_EXPANSION = 256
#: Below this declared size a member is never refused for its ratio (small, constant arrays).
SMALL_MEMBER = 1 << 20

_METHODS = {zipfile.ZIP_STORED: "stored", zipfile.ZIP_DEFLATED: "deflate", zipfile.ZIP_BZIP2: "bzip2",
            zipfile.ZIP_LZMA: "lzma"}
_NAMES = {0: "stored", 1: "shrunk", 6: "imploded", 8: "deflate", 9: "deflate64", 12: "bzip2", 14: "lzma",
          93: "zstandard", 95: "xz", 98: "ppmd", 99: "AES encryption"}


def _describe(archive: str, member: str) -> str:
    return f"member {escape_name(member)!r} of {escape_name(os.path.basename(archive))}"


def _error(archive: str, member: str, problem: str, fix: str) -> CheckpointFormatError:
    return CheckpointFormatError(f"Cannot read {_describe(archive, member)}: {problem}. {fix} "
                                 f"(File: {escape_name(archive)})", path=archive, key=member)


def check_member(info: zipfile.ZipInfo, archive: str, archive_size: Optional[int] = None) -> None:
    """Refuse a member that cannot or must not be read, before reading it.

    Args:
        info: the member, from ``ZipFile.getinfo`` or ``infolist``.
        archive: the archive's path (for the message).
        archive_size: the archive's size in bytes, to check the member's declared sizes against.

    Raises:
        CheckpointFormatError: the member is encrypted, uses a compression method ckptmerge
            cannot decompress, or its sizes run past the end of the archive.
        UnsafeCheckpointError: a compressed member declares more than :data:`MAX_EXPANSION`
            times its compressed size.

    Example:
        >>> info = zipfile.ZipInfo("a.npy"); info.compress_type = 99
        >>> check_member(info, "w.npz")
        Traceback (most recent call last):
        ...
        ckptmerge.core.errors.CheckpointFormatError: Cannot read member 'a.npy' of w.npz: it uses compression method 99 (AES encryption), ...
    """
    member = info.filename
    if info.flag_bits & 0x1:
        raise _error(archive, member, "it is encrypted", "ckptmerge reads no encrypted archives; extract the "
                     "archive with its password and pass the files, or re-save it without a password.")
    if info.compress_type not in _METHODS:
        name = _NAMES.get(info.compress_type)
        raise _error(archive, member, f"it uses compression method {info.compress_type}"
                     + (f" ({name})" if name else "") + ", which ckptmerge cannot decompress (it reads "
                     + ", ".join(_METHODS.values()) + ")", "Re-save it, e.g. with np.savez or np.savez_compressed.")
    if archive_size is not None and (info.compress_size > archive_size
                                     or info.header_offset + info.compress_size > archive_size):
        raise _error(archive, member, f"its declared compressed size ({info.compress_size} bytes from byte "
                     f"{info.header_offset}) runs past the end of the {archive_size}-byte archive",
                     "The archive is corrupt or truncated; re-copy it.")
    if info.compress_type == zipfile.ZIP_STORED:
        if info.file_size != info.compress_size:
            raise _error(archive, member, f"it is stored uncompressed but declares {info.file_size} bytes and "
                         f"{info.compress_size} stored", "The archive is corrupt; re-copy it.")
    elif info.file_size > max(info.compress_size * MAX_EXPANSION, SMALL_MEMBER):
        raise UnsafeCheckpointError(
            f"Refusing to read {_describe(archive, member)}: it declares {human_bytes(info.file_size)} "
            f"compressed into {human_bytes(info.compress_size)}, more than {MAX_EXPANSION}x (a decompression "
            "bomb, or a corrupt archive). If you trust it, extract the member ('unzip "
            f"{escape_name(os.path.basename(archive))} {escape_name(member)}') and pass the extracted file. "
            f"(File: {escape_name(archive)})", path=archive, key=member,
            problems=[f"{member!r}: expands {info.file_size / max(info.compress_size, 1):.0f}x"])


@contextlib.contextmanager
def member_errors(archive: str, member: str) -> Iterator[None]:
    """Turn zipfile's errors while a member is read into a ``CheckpointFormatError`` naming it.

    Example:
        >>> with member_errors("w.npz", "a.npy"):
        ...     raise EOFError
        Traceback (most recent call last):
        ...
        ckptmerge.core.errors.CheckpointFormatError: Cannot read member 'a.npy' of w.npz: its data ended early ...
    """
    try:
        yield
    except RecursionError:  # (a RuntimeError, but not zipfile's)
        raise
    except (EOFError, zlib.error, lzma.LZMAError) as e:
        _does_not_decompress(archive, member, e)
    except OSError as e:
        if e.errno is not None:  # the disk or the temporary file, not the member's data
            raise
        _does_not_decompress(archive, member, e)  # bz2's "Invalid data stream" (an OSError without errno)
    except zipfile.BadZipFile as e:
        raise _error(archive, member, f"it is damaged ({e})", "Re-copy the archive.") from None
    except (RuntimeError, NotImplementedError) as e:  # zipfile: encrypted, or a method it lacks
        raise _error(archive, member, f"zipfile cannot read it ({e})", "Re-save the archive.") from None


def _does_not_decompress(archive: str, member: str, e: BaseException) -> None:
    detail = f" ({e})" if str(e) else ""
    raise _error(archive, member, f"its data ended early or does not decompress{detail}",
                 "The archive is corrupt or truncated; re-copy it.") from None


def open_member(z: zipfile.ZipFile, info: zipfile.ZipInfo, archive: str,
                archive_size: Optional[int] = None) -> Any:
    """``z.open(info)`` after :func:`check_member`, its opening errors translated.

    Read the returned file inside :func:`member_errors` (a member can fail as it streams).

    Example:
        >>> with zipfile.ZipFile("w.npz") as z:  # doctest: +SKIP
        ...     with open_member(z, z.getinfo("a.npy"), "w.npz") as f, member_errors("w.npz", "a.npy"):
        ...         head = f.read(8)
    """
    check_member(info, archive, archive_size)
    with member_errors(archive, info.filename):
        return z.open(info)
