"""Write an Orbax checkpoint (the way back to JAX), without JAX: ``merge --format orbax``.

The output is a step folder as Orbax V1's ``save`` lays it out: ``_CHECKPOINT_METADATA``, the
``orbax.checkpoint`` marker, ``commit_success.txt`` and one PyTree item, ``pytree/``, holding
``_METADATA`` and an OCDBT database of zarr3 arrays (zstd-compressed). Names are split on ``/``
into the tree (``params/Dense_0/kernel`` -> ``{"params": {"Dense_0": {"kernel": ...}}}``), every
leaf a NumPy array (``value_type`` ``np.ndarray``), single strings in ``_strings.json``. Orbax's
own readers restore it: V1 ``load(path)`` and V0 ``PyTreeCheckpointer().restore(path + "/pytree")``.

Tensors arrive in any order and are streamed: each array's chunks are whole rows of its
leading axes (at most :data:`CHUNK_BYTES`), so a chunk is a contiguous run of the C-order
bytes; writes are committed to the database every :data:`COMMIT_BYTES`, which bounds memory.
Everything is written to a hidden folder beside the output and published with one rename
(``renameat2``: ``RENAME_NOREPLACE`` without ``overwrite``, ``RENAME_EXCHANGE`` with it), so a
failed or killed merge leaves the old output as it was and no partial one.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import json
import math
import os
import shutil
import time
from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple, Union

import numpy as np

from ckptmerge.core.errors import (ArgumentError, CheckpointWriteError,
                              OutputExistsError)
from ckptmerge.formats.tf.bundle import crc32c, mask_crc
from ckptmerge.formats.dtypes import TF_TO_NUMPY, dtype_name, tf_dtype_name
from ckptmerge.formats.io.interrupts import HeldInterrupts
from ckptmerge.formats.io.publish import SingleFileWriter
from ckptmerge.formats.io.output_prefix import remove_stale_temps, temp_name
from ckptmerge.formats.orbax.aggregate import numpy_dtype_named
from ckptmerge.formats.orbax.bridge import safe_key
from ckptmerge.formats.orbax.store import load_tensorstore
from ckptmerge.core.text import escape_name, quote_name

__all__ = ["OrbaxWriter", "unsupported_dtypes", "ITEM", "CHUNK_BYTES", "COMMIT_BYTES", "tree_keys"]

#: The item the output's arrays are in (the name V1 ``load`` looks for first, and Keras uses).
ITEM = "pytree"
#: Largest chunk of an output array.
CHUNK_BYTES = 32 << 20
#: Bytes buffered before the writes are committed to the OCDBT database.
COMMIT_BYTES = 256 << 20
_V0_HANDLER = "orbax.checkpoint._src.handlers.pytree_checkpoint_handler.PyTreeCheckpointHandler"
BytesLike = Union[bytes, bytearray, memoryview]
Spec = Tuple[str, str, Sequence[int]]


def unsupported_dtypes(specs: Iterable[Spec]) -> List[Tuple[str, str]]:
    """The ``(name, dtype)`` pairs an Orbax checkpoint cannot hold: quantized TF types, and
    strings other than single ones.

    Example:
        >>> unsupported_dtypes([("a", "bfloat16", (2,)), ("vocab", "string", (3,)), ("s", "string", ())])
        [('vocab', 'string')]
    """
    bad = []
    for name, dtype, shape in specs:
        if dtype == "string":
            if tuple(shape) != ():
                bad.append((name, dtype))
            continue
        try:
            numpy_dtype_named(dtype)
        except ValueError:
            bad.append((name, dtype))
    return bad


def tree_keys(names: Iterable[str]) -> Dict[str, Tuple[str, ...]]:
    """``{name: tree path}`` for names split on ``/``, checked to form a tree Orbax can store.

    Raises:
        ArgumentError: an empty path component, a name that is also another's parent
            (``a`` and ``a/b``), or two names with the same Orbax param name (``.``-joined).

    Example:
        >>> tree_keys(["params/Dense_0/kernel"])
        {'params/Dense_0/kernel': ('params', 'Dense_0', 'kernel')}
    """
    out: Dict[str, Tuple[str, ...]] = {}
    params: Dict[str, str] = {}
    for name in names:
        parts = tuple(name.split("/"))
        if not all(parts):
            raise ArgumentError(f"Tensor name {quote_name(name)} has an empty path component; an Orbax tree "
                                "key cannot be empty. Rename it (Source(..., map=...)).")
        param = ".".join(parts)
        if not safe_key(param):
            raise ArgumentError(f"Tensor name {quote_name(name)} cannot be an Orbax param name ({quote_name(param)}).")
        if param in params:
            raise ArgumentError(f"Tensor names {quote_name(params[param])} and {quote_name(name)} would both be "
                                f"stored as Orbax array {quote_name(param)} (Orbax joins tree keys with '.'). "
                                "Rename one of them.")
        params[param] = name
        out[name] = parts
    prefixes = {"/".join(p[:i]) for p in out.values() for i in range(1, len(p))}
    clash = sorted(n for n in out if n in prefixes)
    if clash:
        raise ArgumentError(f"Tensor {quote_name(clash[0])} is also a scope of other tensors "
                            f"({quote_name(clash[0] + '/...')}); an Orbax tree leaf cannot have children. Rename one "
                            f"({len(clash)} such name(s)).")
    return out


def _chunk_shape(shape: Tuple[int, ...], itemsize: int) -> List[int]:
    """Chunks of whole trailing rows: ``[1, .., 1, k, full, .., full]``, each a contiguous C-order run."""
    if not shape:
        return []
    chunk = [max(1, d) for d in shape]
    inner = itemsize
    for axis in range(len(shape) - 1, -1, -1):
        if inner * max(1, shape[axis]) <= CHUNK_BYTES:
            inner *= max(1, shape[axis])
            continue
        chunk[axis] = max(1, CHUNK_BYTES // inner)
        for a in range(axis):
            chunk[a] = 1
        break
    return chunk


_RENAME_NOREPLACE, _RENAME_EXCHANGE = 1, 2


def _renameat2(src: str, dst: str, flags: int) -> bool:
    """``renameat2(src, dst, flags)``; False where the system lacks it (then the caller falls back)."""
    libc_name = ctypes.util.find_library("c")
    if not libc_name:
        return False
    libc = ctypes.CDLL(libc_name, use_errno=True)
    fn = getattr(libc, "renameat2", None)
    if fn is None:
        return False
    at_fdcwd = -100
    if fn(at_fdcwd, os.fsencode(src), at_fdcwd, os.fsencode(dst), flags) != 0:
        err = ctypes.get_errno()
        if err in (38, 22):  # ENOSYS, EINVAL: the kernel or filesystem lacks the flag
            return False
        raise OSError(err, os.strerror(err), dst)
    return True


class _Out:
    __slots__ = ("name", "parts", "dtype", "shape", "chunk", "store", "written", "is_string")

    def __init__(self, name: str, parts: Tuple[str, ...], dtype: np.dtype, shape: Tuple[int, ...],
                 is_string: bool) -> None:
        self.name, self.parts, self.dtype, self.shape, self.is_string = name, parts, dtype, shape, is_string
        self.chunk = _chunk_shape(shape, dtype.itemsize) if not is_string else []
        self.store: Any = None
        self.written = False


class OrbaxWriter(SingleFileWriter):
    """Write one Orbax checkpoint (a step folder) whose tensors are known up front.

    Args:
        path: the output step folder (``out/orbax``); missing parents are created.
        specs: ``(name, dtype, shape)`` of every tensor, dtype a numpy-style name.
        metadata: recorded in ``_CHECKPOINT_METADATA``'s ``custom_metadata`` (JSON values).
        overwrite: replace an existing folder at ``path``.
        durable: fsync the files before publishing.

    Raises:
        OutputExistsError: ``path`` exists and ``overwrite`` is false.
        ArgumentError: a dtype Orbax cannot hold, names that do not form a tree.
        CkptMergeError: tensorstore is not installed (with the install hint).

    Example:
        >>> with OrbaxWriter("out/orbax", [("params/w", "float32", (2, 3))]) as w:  # doctest: +SKIP
        ...     w.add("params/w", np.ones((2, 3), np.float32))
    """

    def __init__(self, path: Union[str, "os.PathLike[str]"], specs: Sequence[Spec], *,
                 metadata: Optional[Mapping[str, Any]] = None, overwrite: bool = False,
                 durable: bool = False) -> None:
        self._set_output(path, overwrite, durable)
        self._metadata = dict(metadata or {})
        self._state = "new"
        bad = unsupported_dtypes(specs)
        if bad:
            raise ArgumentError(f"An Orbax checkpoint cannot hold {len(bad)} of these tensors, e.g. "
                                f"{quote_name(bad[0][0])} ({bad[0][1]}{', not a single string' if bad[0][1] == 'string' else ''}). "
                                "Exclude them, or write a TF checkpoint instead.")
        keys = tree_keys([s[0] for s in specs])
        self._outs: Dict[str, _Out] = {}
        self._layout, self._written = self._outs, set()  # (SingleFileWriter's checks read these)
        for name, dtype, shape in specs:
            dims = tuple(int(d) for d in shape)
            if name in self._outs:
                raise ArgumentError(f"tensor name {quote_name(name)} is given twice")
            if any(d < 0 for d in dims):
                raise ArgumentError(f"tensor {quote_name(name)} has a negative dimension: {dims}")
            is_string = dtype == "string"
            dt = np.dtype(object) if is_string else numpy_dtype_named(dtype)
            self._outs[name] = _Out(name, keys[name], dt, dims, is_string)
        self._check_existing()
        self._ts = load_tensorstore()
        remove_stale_temps(self._abs)  # the folders of writers that were killed
        self._tmp = temp_name(self._abs)
        self._item = os.path.join(self._tmp, ITEM)
        self._init_ns = time.time_ns()
        try:  # (one try from the folder's creation on: Ctrl-C just after it leaves no folder behind)
            os.makedirs(self._item)
            self._state = "open"
            self._context = self._ts.Context({"file_io_concurrency": {"limit": 128}})
            self._kv = {"driver": "ocdbt", "base": {"driver": "file", "path": self._item + "/"}}
            self._txn = self._ts.Transaction()
        except BaseException as e:
            self._state = "aborted"
            shutil.rmtree(self._tmp, ignore_errors=True)  # (our pid and a random name: nobody else's)
            if isinstance(e, OSError):
                raise CheckpointWriteError(f"Cannot create {quote_name(self._tmp)} to write {quote_name(self.path)}: "
                                           f"{escape_name(e.strerror or e)}", path=self._tmp, errno_=e.errno) from e
            raise
        self._pending = 0
        #: Bytes of the tensors written so far; once finished, of the files published.
        self.bytes_written = 0

    def _check_existing(self) -> None:
        if not self._overwrite and os.path.lexists(self._abs):
            raise OutputExistsError(f"Something already exists at {quote_name(self.path)}. Choose another output, or "
                                    "pass overwrite=True (--force) to replace it.", path=self.path)

    def _io_error(self, e: BaseException, action: str) -> CheckpointWriteError:
        self.abort()
        reason = e.strerror if isinstance(e, OSError) and e.strerror else str(e)
        return CheckpointWriteError(f"Cannot {action} Orbax checkpoint {quote_name(self.path)}: {escape_name(reason)}. "
                                    "Nothing was written there.", path=self.path,
                                    errno_=e.errno if isinstance(e, OSError) else None)

    # -- adding tensors --------------------------------------------------------------------
    def _slot(self, key: str, dtype: str, shape: Sequence[int]) -> _Out:
        if self._state != "open":
            raise ArgumentError(f"This OrbaxWriter for {quote_name(self.path)} is already {self._state}.")
        out = self._outs.get(key)
        if out is None:
            raise ArgumentError(f"tensor {quote_name(key)} was not declared when the writer was created")
        if out.written:
            raise ArgumentError(f"tensor {quote_name(key)} was already written")
        want = "string" if out.is_string else dtype_name(out.dtype)
        if dtype != want or tuple(int(d) for d in shape) != out.shape:
            raise ArgumentError(f"tensor {quote_name(key)} is {dtype} {tuple(shape)}, declared as {want} {out.shape}")
        return out

    def _open(self, out: _Out) -> Any:
        codecs: List[Dict[str, Any]] = [{"name": "bytes", "configuration": {"endian": "little"}}
                                        if out.dtype.itemsize > 1 else {"name": "bytes"},
                                        {"name": "zstd", "configuration": {"level": 1}}]
        spec = {"driver": "zarr3", "kvstore": dict(self._kv, path=".".join(out.parts) + "/"),
                "metadata": {"shape": list(out.shape), "data_type": dtype_name(out.dtype),
                             "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": out.chunk}},
                             "codecs": codecs},
                "store_data_equal_to_fill_value": True}  # every chunk, zeros too: _METADATA says so
        try:
            return self._ts.open(spec, create=True, context=self._context, transaction=self._txn).result()
        except Exception as e:  # noqa: BLE001
            raise self._io_error(e, f"create array {quote_name(out.name)} in") from None

    def _write(self, out: _Out, index: Tuple[Any, ...], data: np.ndarray) -> None:
        try:
            if out.store.transaction is not self._txn:  # committed since it was opened: bind the new one
                out.store = out.store.with_transaction(self._txn)
            out.store[index].write(data).result()
        except Exception as e:  # noqa: BLE001
            raise self._io_error(e, f"write array {quote_name(out.name)} to") from None
        self._pending += data.nbytes
        self.bytes_written += data.nbytes
        if self._pending >= COMMIT_BYTES:
            self._commit()

    def _commit(self) -> None:
        try:
            self._txn.commit_async().result()
        except Exception as e:  # noqa: BLE001
            raise self._io_error(e, "commit data to") from None
        self._txn = self._ts.Transaction()
        self._pending = 0

    def _chunks(self, out: _Out) -> Iterable[Tuple[Tuple[Any, ...], Tuple[int, ...]]]:
        """``(index, shape of the indexed region)`` of each chunk, in the array's C order."""
        shape = out.shape
        if not shape:
            yield (), ()
            return
        axis = next((a for a, (c, d) in enumerate(zip(out.chunk, shape)) if c < d), len(shape) - 1)
        step = max(1, min(out.chunk[axis], shape[axis]))
        for lead in np.ndindex(*shape[:axis]) if axis else [()]:
            for s in range(0, shape[axis], step):
                e = min(s + step, shape[axis])
                yield tuple(lead) + (slice(s, e),), (e - s,) + shape[axis + 1:]

    def add(self, key: str, value: Any) -> None:
        """Write a whole array (any memory order).

        Example:
            >>> w.add("params/w", np.zeros((4, 3), np.float32))  # doctest: +SKIP
        """
        value = np.asarray(value)
        out = self._slot(key, dtype_name(value.dtype), value.shape)
        if out.is_string:
            out.store = value.reshape(()).item()
            out.written = True
            self._written.add(key)
            return
        out.store = self._open(out)  # (an empty array too: its metadata says its shape)
        if value.size:
            for index, region in self._chunks(out):
                self._write(out, index, np.ascontiguousarray(value[index] if index else value).reshape(region))
        out.written = True
        self._written.add(key)

    def add_raw(self, key: str, dtype_enum: int, shape: Sequence[int], chunks: Iterable[BytesLike], *,
                expected_crc32c: Optional[int] = None) -> None:
        """Write a tensor from its raw little-endian C-order bytes, streamed (as
        ``BundleWriter.add_raw``): with ``expected_crc32c`` (a TF bundle's masked CRC32C of the
        source bytes) the bytes are checked as they go by, and a mismatch fails the write.

        Example:
            >>> w.add_raw("emb", 1, (1000, 64), pieces)  # doctest: +SKIP
        """
        dt = TF_TO_NUMPY.get(dtype_enum)
        out = self._slot(key, dtype_name(dt) if dt is not None else tf_dtype_name(dtype_enum), shape)
        if out.is_string:
            raise ArgumentError(f"tensor {quote_name(key)}: strings are added whole (add), not as raw bytes")
        nbytes = math.prod(out.shape) * out.dtype.itemsize
        it = iter(chunks)
        pending = memoryview(b"")
        done, crc = 0, 0
        out.store = self._open(out)
        if nbytes:
            for index, region in self._chunks(out):
                need = math.prod(region) * out.dtype.itemsize
                buf = np.empty(need, np.uint8)
                filled = 0
                while filled < need:
                    if not len(pending):
                        try:
                            pending = memoryview(next(it)).cast("B")
                        except StopIteration:
                            raise ArgumentError(f"tensor {quote_name(key)}: the chunks held {done + filled} of its "
                                                f"{nbytes} bytes") from None
                    take = min(len(pending), need - filled)
                    buf[filled:filled + take] = pending[:take]
                    if expected_crc32c is not None:
                        crc = crc32c(pending[:take], crc)
                    pending = pending[take:]
                    filled += take
                done += need
                le = out.dtype.newbyteorder("<") if out.dtype.itemsize > 1 else out.dtype
                self._write(out, index, buf.view(le).reshape(region))
        if len(pending) or next(it, None) is not None:
            raise ArgumentError(f"tensor {quote_name(key)}: the chunks hold more than its {nbytes} bytes")
        self._check_crc(key, mask_crc(crc), expected_crc32c)
        out.written = True
        self._written.add(key)

    # -- publishing ------------------------------------------------------------------------
    def _metadata_files(self) -> None:
        tree: Dict[str, Any] = {}
        strings: Dict[str, str] = {}
        for out in self._outs.values():
            key_meta = [{"key": p, "key_type": 2} for p in out.parts]
            tree[str(out.parts)] = {"key_metadata": key_meta,
                                    "value_metadata": {"value_type": "string" if out.is_string else "np.ndarray",
                                                       "skip_deserialize": False}}
            if out.is_string:
                value = out.store
                strings[".".join(out.parts)] = (value.decode("utf-8", "replace") if isinstance(value, bytes)
                                                else str(value))
        self._json(os.path.join(self._item, "_METADATA"),
                   {"tree_metadata": tree, "use_ocdbt": True, "use_zarr3": True,
                    "store_array_data_equal_to_fill_value": True, "custom_metadata": None})
        if strings:
            self._json(os.path.join(self._item, "_strings.json"), strings)
        self._json(os.path.join(self._tmp, "_CHECKPOINT_METADATA"),
                   {"item_handlers": {ITEM: _V0_HANDLER}, "metrics": {}, "performance_metrics": {},
                    "init_timestamp_nsecs": self._init_ns, "commit_timestamp_nsecs": time.time_ns(),
                    "custom_metadata": self._metadata})
        open(os.path.join(self._tmp, "orbax.checkpoint"), "wb").close()
        for folder in (self._tmp, self._item):
            with open(os.path.join(folder, "commit_success.txt"), "w", encoding="utf-8") as f:
                f.write(f"Checkpoint commit was successful to {self._abs}")

    def _json(self, path: str, value: Any) -> None:
        with open(path, "w", encoding="utf-8") as f:
            json.dump(value, f)
            if self._durable:
                f.flush()
                os.fsync(f.fileno())

    def finish(self) -> None:
        """Check every declared tensor was written, write the metadata, publish atomically.

        Raises:
            ArgumentError: a declared tensor was never written (nothing is published).
            OutputExistsError: something appeared at the output meanwhile (without ``overwrite``).
        """
        if self._state != "open":
            raise ArgumentError(f"This OrbaxWriter for {quote_name(self.path)} is already {self._state}.")
        self._check_all_written()
        self._commit()
        try:
            self._metadata_files()
            self.bytes_written = sum(os.lstat(os.path.join(d, n)).st_size for d, _, files in os.walk(self._tmp)
                                     for n in files)
            if self._durable:
                for dirpath, _, files in os.walk(self._tmp):
                    for n in files:
                        fd = os.open(os.path.join(dirpath, n), os.O_RDONLY)
                        try:
                            os.fsync(fd)
                        finally:
                            os.close(fd)
            with HeldInterrupts():  # published and the old output gone, or neither (Ctrl-C waits)
                self._publish()
        except OutputExistsError:
            self.abort()
            raise
        except OSError as e:
            raise self._io_error(e, "publish") from None
        self._state = "finished"

    def _publish(self) -> None:
        if not self._overwrite:
            try:
                if not _renameat2(self._tmp, self._abs, _RENAME_NOREPLACE):
                    if os.path.lexists(self._abs):
                        raise FileExistsError(self._abs)
                    os.rename(self._tmp, self._abs)
            except FileExistsError:
                raise OutputExistsError(f"Something appeared at {quote_name(self.path)} while the Orbax checkpoint "
                                        "was being written (another merge?); nothing was replaced. Choose another "
                                        "output, or pass overwrite=True (--force).", path=self.path) from None
            return
        if os.path.lexists(self._abs) and _renameat2(self._tmp, self._abs, _RENAME_EXCHANGE):
            old = self._tmp  # the old output now sits at the temporary name
        elif os.path.lexists(self._abs):
            old = self._tmp + "-old"
            os.rename(self._abs, old)
            try:
                os.rename(self._tmp, self._abs)
            except OSError:
                os.rename(old, self._abs)
                raise
        else:
            os.rename(self._tmp, self._abs)
            return
        if os.path.isdir(old) and not os.path.islink(old):
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.remove(old)

    def abort(self) -> None:
        """Remove the temporary folder; nothing appears at the output."""
        if self._state != "open":
            return
        self._state = "aborted"
        shutil.rmtree(self._tmp, ignore_errors=True)
