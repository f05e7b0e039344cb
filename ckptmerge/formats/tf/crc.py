"""CRC32C arithmetic for tensor bundles beyond one buffer: the checksum TF keeps over a string
tensor's lengths, and combining the CRCs of consecutive segments (read in parallel) into one.
"""

from __future__ import annotations

import struct
from typing import Iterable, List, Sequence

from .table import crc32c

__all__ = ["string_lengths_crc", "crc32c_combine"]


def string_lengths_crc(lengths: Iterable[int], crc: int = 0) -> int:
    """The CRC32C TF accumulates over a string tensor's element lengths: each as a little-endian
    uint32 (uint64 from 4 GiB up), not as the varints stored in the file.

    Example:
        >>> string_lengths_crc([3]) == string_lengths_crc([3], 0)
        True
    """
    for x in lengths:
        crc = crc32c(struct.pack("<I", x) if x <= 0xFFFFFFFF else struct.pack("<Q", x), crc)
    return crc


_CRC32C_POLY = 0x82F63B78  # Castagnoli, reflected


def _gf2_times(mat: Sequence[int], vec: int) -> int:
    out = 0
    i = 0
    while vec:
        if vec & 1:
            out ^= mat[i]
        vec >>= 1
        i += 1
    return out


def _zero_operators() -> List[List[int]]:
    """``ops[k]`` maps the CRC of ``x`` to the CRC of ``x`` followed by ``2**k`` zero bytes."""
    one_bit = [_CRC32C_POLY] + [1 << (n - 1) for n in range(1, 32)]
    op = one_bit
    for _ in range(3):  # 1 bit -> 8 bits = one byte
        op = [_gf2_times(op, op[n]) for n in range(32)]
    ops = [op]
    for _ in range(47):
        op = [_gf2_times(op, op[n]) for n in range(32)]
        ops.append(op)
    return ops


_ZERO_OPS: List[List[int]] = []


def crc32c_combine(crc1: int, crc2: int, len2: int) -> int:
    """Return ``crc32c(a + b)`` from ``crc1 = crc32c(a)``, ``crc2 = crc32c(b)``, ``len(b)``.

    Lets segments of one tensor be checksummed in parallel (the zlib ``crc32_combine`` method).

    Example:
        >>> crc32c_combine(crc32c(b"hello "), crc32c(b"world"), 5) == crc32c(b"hello world")
        True
    """
    if not _ZERO_OPS:
        _ZERO_OPS.extend(_zero_operators())
    k = 0
    while len2:
        if len2 & 1:
            crc1 = _gf2_times(_ZERO_OPS[k], crc1)
        len2 >>= 1
        k += 1
    return crc1 ^ crc2
