"""How :meth:`BundleReader.read_many` lays out a batch of reads: where each tensor lands, and which
file bytes are read together.

Big tensors get arrays of their own and are read in segments (checksummed in parallel, the
segment CRCs combined); small ones share aligned buffers and runs of them contiguous in a shard
become one scatter read. Pure: entries in, buffers and units out; the reader does the I/O.
"""

from __future__ import annotations

from typing import Dict, List, NamedTuple, Sequence, Tuple

import numpy as np

from ..base import ALIGN, aligned_empty
from ..dtypes import TF_TO_NUMPY
from .bundleindex import BundleEntry

__all__ = ["ReadUnit", "allocate_many", "read_units", "SEGMENT", "SMALL"]

SEGMENT = 32 << 20  # read_many reads bigger tensors in parallel segments of this size
SMALL = 4 << 20  # smaller tensors share buffers in read_many (numpy uses huge pages from 4 MiB)
ARENA = 64 << 20  # size of those shared buffers
ALIGN_TO = ALIGN  # alignment of each tensor in a shared buffer
GROUP = 8 << 20  # at most this many bytes per scatter read
MAX_IOV = 512  # at most this many buffers per scatter read (IOV_MAX is 1024 on Linux)


class ReadUnit(NamedTuple):
    """One read of :meth:`BundleReader.read_many`: consecutive file bytes from ``offset``."""

    entries: List[BundleEntry]
    offset: int
    views: List[memoryview]
    segment: bool  # True: a segment of entries[0]; False: all of each entry, back to back


def allocate_many(entries: Sequence[BundleEntry]) -> Dict[str, Tuple[np.ndarray, memoryview]]:
    """``{key: (array, byte view of it)}`` for ``entries`` (in file order): big arrays on
    their own, small ones packed into shared buffers."""
    arrays: Dict[str, Tuple[np.ndarray, memoryview]] = {}
    pending: List[Tuple[BundleEntry, int]] = []
    used = 0

    def flush() -> None:
        nonlocal pending, used
        if pending:
            arena = aligned_empty(used, np.uint8)
            raw = memoryview(arena)
            for e, at in pending:
                arr = np.ndarray(e.shape, TF_TO_NUMPY[e.dtype], buffer=arena, offset=at)
                arrays[e.key] = (arr, raw[at:at + e.size])
        pending, used = [], 0

    for e in entries:
        if e.size == 0 or e.size >= SMALL:
            arr = aligned_empty(e.shape, TF_TO_NUMPY[e.dtype])
            arrays[e.key] = (arr, memoryview(arr.reshape(-1).view(np.uint8)))
            continue
        if used + e.size > ARENA:
            flush()
        pending.append((e, used))
        used += -(-e.size // ALIGN_TO) * ALIGN_TO
    flush()
    return arrays

def read_units(entries: Sequence[BundleEntry],
                arrays: Dict[str, Tuple[np.ndarray, memoryview]]) -> List["ReadUnit"]:
    """Split the reads into work units: runs of small tensors contiguous in the file (one
    scatter read each) and segments of big tensors."""
    units: List[ReadUnit] = []
    group: List[Tuple[BundleEntry, memoryview]] = []
    group_bytes = 0

    def close_group() -> None:
        nonlocal group, group_bytes
        if group:
            units.append(ReadUnit([e for e, _ in group], group[0][0].offset, [v for _, v in group], False))
        group, group_bytes = [], 0

    for e in entries:
        if e.size == 0:
            continue
        view = arrays[e.key][1]
        if e.size >= SMALL:
            close_group()
            for start in range(0, e.size, SEGMENT):
                units.append(ReadUnit([e], e.offset + start, [view[start:start + SEGMENT]], True))
            continue
        last = group[-1][0] if group else None
        if last is not None and (last.shard_id != e.shard_id or last.offset + last.size != e.offset
                                 or group_bytes + e.size > GROUP or len(group) >= MAX_IOV):
            close_group()
        group.append((e, view))
        group_bytes += e.size
    close_group()
    return units
