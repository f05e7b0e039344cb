"""Tensors stored in pieces: partitioned variables and streamed reads of a tensor bundle.

A partitioned variable has one entry without data listing its ``slices``; each slice is stored
under its own key (TF's ``EncodeTensorNameSlice``). :class:`PartitionedReads` is the part of
:class:`~ckptmerge.formats.tf.bundle.BundleReader` that turns such an entry into
:class:`Part` s of the full tensor (checked to tile it exactly, to agree with their boxes and to
fit in the data files before anything is allocated), reads them whole, and streams any tensor,
one entry or many, block by block with each part's checksum accumulated on the way.
"""

from __future__ import annotations

from typing import Dict, Iterator, List, NamedTuple, Optional, Sequence, Tuple

import numpy as np

from ckptmerge.formats.base import aligned_empty
from ckptmerge.formats.dtypes import DT_STRING, TF_TO_NUMPY, tf_dtype_name
from ckptmerge.formats.io.urlpath import basename
from ckptmerge.formats.tf.bundleindex import BundleEntry
from ckptmerge.formats.tf.regions import Box, c_order_blocks, contiguous_span, intersect
from ckptmerge.formats.tf.slices import SliceError, encode_tensor_name_slice, slice_boxes
from ckptmerge.formats.tf.table import mask_crc, unmask_crc

__all__ = ["Part", "PartitionedReads"]


class Part(NamedTuple):
    """One stored piece of a tensor: its box of the full tensor, its entry, its name in errors
    (``None`` for an unpartitioned tensor's own entry)."""

    box: Box
    entry: BundleEntry
    label: Optional[str]


class PartitionedReads:
    """The reads of a bundle that work on parts of a tensor (mixed into ``BundleReader``, whose
    index, data files and checks they use).

    Example:
        >>> from ckptmerge.formats.tf.bundle import BundleReader
        >>> issubclass(BundleReader, PartitionedReads)
        True
    """

    def _slice_plan(self, e: BundleEntry) -> List[Part]:
        """The slices of a partitioned entry as parts of the full tensor, checked before
        anything is allocated: the slices tile the tensor exactly (no element twice, none left
        out: anything else would leave uninitialised memory in the result), each slice's entry
        agrees with its box, dtype and byte size, and their bytes fit in the data files."""
        try:
            boxes = slice_boxes(e.key, e.shape, e.slices)
        except SliceError as err:
            raise self._index_error(str(err), e.key) from None
        parts: List[Part] = []
        for extents, box in zip(e.slices, boxes):
            shape = tuple(stop - start for start, stop in box)
            part = self._raw_entries.get(encode_tensor_name_slice(e.key, extents))
            if part is None:
                raise self._index_error(f"slice {extents} of tensor {e.key!r} is missing", e.key)
            if part.dtype != e.dtype or part.shape != shape or part.slices:
                raise self._index_error(f"slice {extents} of tensor {e.key!r} has dtype "
                                        f"{tf_dtype_name(part.dtype)} shape {part.shape}", e.key)
            label = f"{self._by_key.get(e.key, e.key)} (slice {list(extents)})"
            if part.dtype == DT_STRING:
                self._check_strings(part, label)
            else:
                self._check_numeric(part, label)
            parts.append(Part(box, part, label))
        claimed: Dict[int, int] = {}
        for p in parts:
            claimed[p.entry.shard_id] = claimed.get(p.entry.shard_id, 0) + p.entry.size
        for shard, nbytes in sorted(claimed.items()):
            if nbytes > self._shard_sizes[shard]:
                path = self._shard_path(shard)
                raise self._index_error(
                    f"the slices of tensor {e.key!r} claim {nbytes} bytes of data file "
                    f"{basename(path)}, which has {self._shard_sizes[shard]}", e.key)
        return parts

    def _read_sliced(self, e: BundleEntry) -> np.ndarray:
        dt = TF_TO_NUMPY.get(e.dtype)
        if dt is None:
            raise self._unreadable(e)
        self._check_shape(e, dt)
        parts = self._slice_plan(e)
        if e.dtype == DT_STRING:
            out = np.empty(e.shape, dtype=dt)
            for p in parts:
                out[tuple(slice(start, stop) for start, stop in p.box)] = self._read_strings(p.entry, p.label)
            return out
        out = aligned_empty(e.shape, dt)
        raw = memoryview(out.reshape(-1).view(np.uint8))
        for p in parts:
            try:  # a slice of whole rows (TF's usual partitioning) is read straight into place
                first, count = contiguous_span(e.shape, p.box)
            except ValueError:
                out[tuple(slice(start, stop) for start, stop in p.box)] = self._read_entry(p.entry, p.label)
                continue
            self._fill(p.entry, raw[first * dt.itemsize:(first + count) * dt.itemsize], p.label)
        return out

    def _stream(self, shape: Tuple[int, ...], dt: np.dtype, parts: Sequence[Part],
                max_elements: int) -> Iterator[np.ndarray]:
        """Blocks of whole rows in C order; each block's bytes of a part are contiguous in it
        and follow the bytes read before, so each part's checksum is accumulated on the way and
        checked when its last byte has been read."""
        verify = self.verify
        for p in parts:
            if verify and p.entry.size == 0 and p.entry.crc32c != mask_crc(0):
                raise self._crc_error(p.entry, 0, p.label)
        crcs = [0] * len(parts)
        for block in c_order_blocks(shape, max_elements):
            # (read by a call: the generator keeps no reference to a block once it is yielded)
            yield self._block(block, dt, parts, crcs, verify)

    def _block(self, block: Tuple[Tuple[int, int], ...], dt: np.dtype, parts: Sequence[Part], crcs: List[int],
               verify: bool) -> np.ndarray:
        """One block of :meth:`_stream`, flat, its parts' checksums carried in ``crcs``."""
        itemsize = dt.itemsize
        out = aligned_empty(tuple(stop - start for start, stop in block), dt)
        for i, p in enumerate(parts):
            inter = intersect(p.box, block)
            if inter is None:
                continue
            local = tuple((a - s, b - s) for (a, b), (s, _) in zip(inter, p.box))
            first, count = contiguous_span(p.entry.shape, local)
            dest = out if inter == block else aligned_empty(count, dt)
            crcs[i] = self._read_crc(p.entry.shard_id, p.entry.offset + first * itemsize,
                                     memoryview(dest.reshape(-1).view(np.uint8)), p.entry.key,
                                     verify, crcs[i])
            if dest is not out:
                region = tuple(slice(a - o, b - o) for (a, b), (o, _) in zip(inter, block))
                out[region] = dest.reshape(tuple(b - a for a, b in inter))
            if verify and (first + count) * itemsize == p.entry.size and crcs[i] != unmask_crc(p.entry.crc32c):
                raise self._crc_error(p.entry, crcs[i], p.label)
        return out.reshape(-1)
