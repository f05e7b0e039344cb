"""CRC32C arithmetic for tensor bundles beyond one buffer: the checksum TF keeps over a string
tensor's lengths, and combining the CRCs of consecutive segments (read in parallel) into one.
"""

from __future__ import annotations

import struct
from typing import Dict, Iterable, List, Sequence, Tuple

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
#: ``_ZERO_TABLES[k]``: ``_ZERO_OPS[k]`` as four tables of 256 entries, one per byte of the CRC
#: (four lookups instead of a loop over 32 bits: combining is on the path of every TF read).
_ZERO_TABLES: Dict[int, Tuple[List[int], List[int], List[int], List[int]]] = {}


def _byte_tables(mat: Sequence[int]) -> Tuple[List[int], List[int], List[int], List[int]]:
    """``_gf2_times(mat, v)`` for each value of one byte of ``v``, the other bytes 0."""
    tables = []
    for k in range(4):
        cols = mat[8 * k:8 * k + 8]
        t = [0] * 256
        for b in range(1, 256):
            low = b & -b
            t[b] = t[b ^ low] ^ cols[low.bit_length() - 1]
        tables.append(t)
    return tables[0], tables[1], tables[2], tables[3]


def crc32c_combine(crc1: int, crc2: int, len2: int) -> int:
    """Return ``crc32c(a + b)`` from ``crc1 = crc32c(a)``, ``crc2 = crc32c(b)``, ``len(b)``.

    Lets segments of one tensor be checksummed in parallel (the zlib ``crc32_combine`` method).

    Example:
        >>> crc32c_combine(crc32c(b"hello "), crc32c(b"world"), 5) == crc32c(b"hello world")
        True
    """
    if not _ZERO_OPS:
        _ZERO_OPS.extend(_zero_operators())
    while len2:  # each set bit of len2, lowest first
        low = len2 & -len2
        len2 ^= low
        k = low.bit_length() - 1
        t = _ZERO_TABLES.get(k)
        if t is None:  # (built once per power of two; a race builds the same tables twice)
            t = _ZERO_TABLES[k] = _byte_tables(_ZERO_OPS[k])
        crc1 = t[0][crc1 & 0xFF] ^ t[1][(crc1 >> 8) & 0xFF] ^ t[2][(crc1 >> 16) & 0xFF] ^ t[3][crc1 >> 24]
    return crc1 ^ crc2
