"""What is where in an Orbax checkpoint: a CheckpointManager root's steps, a step's items, and leaf names.

A CheckpointManager root holds one folder per finalised step (``<step>`` or ``<prefix>_<step>``;
Orbax writes under a temporary name and renames, or marks finished steps with
``commit_success.txt`` where renames are not atomic); a step folder holds
``_CHECKPOINT_METADATA`` and one folder per *item*; an item folder holds ``_METADATA``, an OCDBT
database, zarr folders or the old msgpack ``checkpoint`` file. :func:`orbax_steps`,
:func:`item_folders` and :func:`is_orbax` tell them apart by their files (JSON and names only:
no array is opened). :func:`kind_of_path` and :func:`keras_name` say what a leaf is: optimizer
state, bookkeeping or a model variable, and the name Keras's ``load_weights`` gives a leaf of a
Keras ``OrbaxCheckpoint`` step. The arrays are read by :mod:`ckptmerge.formats.orbax.reader`.
"""

from __future__ import annotations

import re
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

from ckptmerge.core.errors import CheckpointFormatError, CheckpointNotFoundError, UnsafeCheckpointError
from ckptmerge.core.redact import get_logger
from ckptmerge.core.specs import KIND_BOOKKEEPING, KIND_OPTIMIZER, KIND_VARIABLE
from ckptmerge.core.text import quote_name
from ckptmerge.formats.io import storage
from ckptmerge.formats.orbax.bridge import safe_key
from ckptmerge.formats.orbax.store import Location, join_key

__all__ = ["is_orbax", "orbax_steps", "OrbaxStep", "is_keras_state", "keras_name", "KERAS_COLLECTIONS",
           "METADATA_FILE", "CHECKPOINT_METADATA_FILE", "AGGREGATE_FILE", "TMP_SUFFIX", "COMMIT_FILE", "NOT_ARRAYS",
           "kind_of_path", "item_folders", "step_items", "JSON_ITEM_FILE",
           "OCDBT_PROCESS"]

logger = get_logger(__name__)

#: Per-item tree metadata (JSON).
METADATA_FILE = "_METADATA"
#: Per-step metadata (JSON): the items' handlers, timestamps.
CHECKPOINT_METADATA_FILE = "_CHECKPOINT_METADATA"
#: The old msgpack aggregate file of an item.
AGGREGATE_FILE = "checkpoint"
#: Orbax writes a step (and each item) under ``<name>.orbax-checkpoint-tmp-<n>`` and renames it.
TMP_SUFFIX = ".orbax-checkpoint-tmp"
#: The per-process OCDBT databases of a multi-host save: ``ocdbt.process_<N>`` (no step folders).
OCDBT_PROCESS = "ocdbt.process_"
#: Where renames are not atomic (GCS), this file marks a finished step.
COMMIT_FILE = "commit_success.txt"

_ITEM_FILES = (METADATA_FILE, AGGREGATE_FILE, "manifest.ocdbt")
#: Names in an item folder that are not arrays (metadata, OCDBT files, the aggregate file).
NOT_ARRAYS = {"_sharding", METADATA_FILE, "array_metadatas", "d", "manifest.ocdbt", COMMIT_FILE, AGGREGATE_FILE,
               "_strings.json", CHECKPOINT_METADATA_FILE, "descriptor", "ocdbt.process_0"}
_OPTIMIZER_PARTS = {"opt_state", "optimizer", "optimizer_variables", "optimizer_state", "opt", "tx_state"}
_BOOKKEEPING_TOP = {"step", "steps", "global_step", "epoch", "save_counter", "metrics_variables", "rng", "rngs",
                    "dropout_rng"}
_STEP_NAME = re.compile(r"^(?:(.+)_)?(\d+)$")


def kind_of_path(parts: Sequence[str], item: str = "") -> str:
    """``"optimizer"``, ``"bookkeeping"`` or ``"variable"`` for a tree path of item ``item``.

    Optimizer state: any path component (or the item) named like optax's and Keras's
    (``opt_state``, ``optimizer_variables``, ...). Bookkeeping: a top-level ``step``, ``epoch``,
    ``rng`` or Keras's ``metrics_variables``.

    Example:
        >>> kind_of_path(["opt_state", "0", "mu", "Dense_0", "kernel"]), kind_of_path(["step"])
        ('optimizer', 'bookkeeping')
        >>> kind_of_path(["params", "Dense_0", "kernel"]), kind_of_path(["kernel"], item="opt_state")
        ('variable', 'optimizer')
    """
    if item in _OPTIMIZER_PARTS or any(p in _OPTIMIZER_PARTS for p in parts):
        return KIND_OPTIMIZER
    if item in _BOOKKEEPING_TOP or (parts and parts[0] in _BOOKKEEPING_TOP):
        return KIND_BOOKKEEPING
    return KIND_VARIABLE


def _is_item(loc: Location, rel: str = "") -> bool:
    names = set(loc.listdir(rel)) if loc.isdir(rel) else set()
    if names & set(_ITEM_FILES):
        return True
    # the oldest layout: nothing but one zarr folder per array (and _sharding)
    arrays = [n for n in names if n not in NOT_ARRAYS and not n.startswith(".")]
    return bool(arrays) and all(loc.exists(join_key(rel, n, ".zarray")) or loc.exists(join_key(rel, n, "zarr.json"))
                                for n in arrays[:3])


def is_orbax(path: str) -> bool:
    """True if ``path`` is an Orbax step folder or item folder (not a CheckpointManager root).

    Example:
        >>> is_orbax("runs/jax/100")  # doctest: +SKIP
        True
    """
    try:
        loc = Location(path)
        if not loc.isdir():
            return False
        names = loc.listdir()
    except (OSError, CheckpointFormatError, CheckpointNotFoundError):
        return False
    if CHECKPOINT_METADATA_FILE in names or METADATA_FILE in names or "orbax.checkpoint" in names:
        return True
    if "manifest.ocdbt" in names:
        return True
    if _is_unmarked_step(loc, names):
        return True
    if AGGREGATE_FILE in names:
        return _msgpack_aggregate(loc)
    return False


def _msgpack_aggregate(loc: Location, rel: str = "") -> bool:
    """Whether ``rel``'s ``checkpoint`` file is Orbax's msgpack aggregate (a TF state file of
    that name is text; a msgpack aggregate starts with a map)."""
    if loc.exists(join_key(rel, "checkpoint.index")):
        return False
    try:
        with storage.open_binary(loc.path(join_key(rel, AGGREGATE_FILE)), storage.SNIFF_BLOCK) as f:
            head = f.read(1)
    except OSError:
        return False
    return bool(head) and (0x80 <= head[0] <= 0x8F or head[0] in (0xDE, 0xDF))


def _is_item_folder(loc: Location, rel: str) -> bool:
    """:func:`_is_item`, with an aggregate ``checkpoint`` file told from a TF state file."""
    names = set(loc.listdir(rel))
    if METADATA_FILE in names or "manifest.ocdbt" in names:
        return True
    if AGGREGATE_FILE in names:
        return _msgpack_aggregate(loc, rel)
    return _is_item(loc, rel)


#: The file a ``JsonCheckpointHandler`` item folder holds (Orbax's default name for it).
JSON_ITEM_FILE = "metadata"


def _is_json_item(loc: Location, rel: str) -> bool:
    return loc.isdir(rel) and loc.listdir(rel) == [JSON_ITEM_FILE] and loc.exists(join_key(rel, JSON_ITEM_FILE))


def step_items(loc: Location, names: Optional[Sequence[str]] = None) -> List[str]:
    """The items of a step folder that has no ``_CHECKPOINT_METADATA`` (Orbax before 0.6 wrote
    none: a CheckpointManager step was ``<step>/<item>/...``), when the folder holds nothing but
    item folders (PyTree items, and JSON items of ``JsonCheckpointHandler``), items still being
    written and a commit marker; ``[]`` otherwise, or when no item holds arrays. Nothing is opened.

    Example:
        >>> step_items(Location("run/2"))  # doctest: +SKIP
        ['state']
    """
    names = loc.listdir() if names is None else names
    items, arrays = [], False
    for n in names:
        if n.startswith(".") or TMP_SUFFIX in n or n == COMMIT_FILE:
            continue
        if not safe_key(n) or not loc.isdir(n):
            return []
        if _is_item_folder(loc, n):
            arrays = True
        elif not _is_json_item(loc, n):
            return []
        items.append(n)
    return sorted(items) if arrays else []


def _is_unmarked_step(loc: Location, names: Sequence[str]) -> bool:
    """A step or composite folder without ``_CHECKPOINT_METADATA`` (Orbax before 0.6): only item
    folders, and either the folder is named like a step or none of its items is (a root whose
    steps are bare item folders, ``run/1/_METADATA``, is a root, never one step of items)."""
    items = step_items(loc, names)
    if not items:
        return False
    base = storage.basename(loc.root)
    if _STEP_NAME.match(base) and not base.startswith(OCDBT_PROCESS):
        return True
    return not any(_STEP_NAME.match(i) for i in items)


#: The collections of a Keras ``get_state_tree()``, as ``keras.callbacks.OrbaxCheckpoint`` saves it.
KERAS_COLLECTIONS = ("trainable_variables", "non_trainable_variables", "optimizer_variables", "metrics_variables")
_KERAS_EXTRA_ITEMS = ("model_config", "assets")


def is_keras_state(items: Dict[str, Sequence[str]]) -> bool:
    """Whether a step's items (``{item: a tree path}``, one path per leaf is enough) are those of
    ``keras.callbacks.OrbaxCheckpoint``: ``pytree`` holding Keras's state tree, and perhaps
    ``model_config`` and ``assets``.

    Example:
        >>> is_keras_state({"pytree": ("trainable_variables", "dense", "kernel"), "model_config": ("config",)})
        True
    """
    return (set(items) - set(_KERAS_EXTRA_ITEMS) == {"pytree"}
            and all(item != "pytree" or (parts and parts[0] in KERAS_COLLECTIONS) for item, parts in items.items()))


def keras_name(item: str, parts: Sequence[str]) -> Tuple[str, str]:
    """``(name, kind)`` of a leaf of a Keras ``OrbaxCheckpoint`` step, as Keras's ``load_weights``
    matches it: a model variable by its ``variable.path`` (the tree path below
    ``trainable_variables`` or ``non_trainable_variables``), optimizer and metric variables below
    their collection's name, the model's config as bookkeeping.

    Example:
        >>> keras_name("pytree", ("trainable_variables", "mlp", "dense", "kernel"))
        ('mlp/dense/kernel', 'variable')
        >>> keras_name("pytree", ("optimizer_variables", "adam", "iteration"))
        ('optimizer_variables/adam/iteration', 'optimizer')
    """
    if item != "pytree":
        return "/".join((item,) + tuple(parts)), KIND_BOOKKEEPING
    top, rest = parts[0], tuple(parts[1:])
    if top in ("trainable_variables", "non_trainable_variables"):
        return "/".join(rest), KIND_VARIABLE
    return "/".join(parts), KIND_OPTIMIZER if top == "optimizer_variables" else KIND_BOOKKEEPING


class OrbaxStep:
    """One finalised step of a CheckpointManager root.

    Attributes:
        step: the step number.
        path: the step folder's path or URL.
    """

    __slots__ = ("step", "path")

    def __init__(self, step: int, path: str) -> None:
        self.step, self.path = step, path

    def __repr__(self) -> str:
        return f"OrbaxStep({self.step}, {self.path!r})"


def orbax_steps(root: str) -> List[OrbaxStep]:
    """The finalised Orbax steps below a CheckpointManager root, sorted by step.

    A step folder is named ``<step>`` or ``<prefix>_<step>``; folders still under Orbax's
    temporary name (``...orbax-checkpoint-tmp...``) never count, nor, on Google Cloud Storage
    (where Orbax marks finished steps with ``commit_success.txt`` instead of renaming them), a
    step without that file.

    Raises:
        CheckpointFormatError: two folders hold the same step (``10`` and ``ckpt_10``).

    Example:
        >>> [s.step for s in orbax_steps("runs/jax")]  # doctest: +SKIP
        [100, 200]
    """
    loc = Location(root)
    if not loc.isdir():
        return []
    needs_commit = loc.is_url and root.lower().startswith(("gs://", "gcs://"))
    found: Dict[int, str] = {}
    for name in loc.listdir():
        if TMP_SUFFIX in name:
            continue
        m = _STEP_NAME.match(name)
        if m is None or name.startswith(OCDBT_PROCESS):
            continue
        path = loc.path(name)
        if not is_orbax(path):
            continue
        if needs_commit and not loc.exists(join_key(name, COMMIT_FILE)):
            logger.info("skipping Orbax step %s: no %s (not finalised)", path, COMMIT_FILE)
            continue
        step = int(m.group(2))
        if step in found:
            raise CheckpointFormatError(
                f"Two folders of {quote_name(root)} hold step {step}: {quote_name(storage.basename(found[step]))} "
                f"and {quote_name(name)}. Pass the one you mean as the path.", path=root)
        found[step] = path
    return [OrbaxStep(s, found[s]) for s in sorted(found)]


def item_folders(path: Union[str, Location], meta: Any = None) -> Dict[str, Optional[str]]:
    """``{item name: folder relative to the step}`` of an Orbax step folder, or ``{"": ""}`` for an
    item folder; ``None`` for an item the metadata names but no folder holds (``meta``: the
    step's ``_CHECKPOINT_METADATA`` when the caller read it already).

    Example:
        >>> item_folders("runs/keras/3")  # doctest: +SKIP
        {'model_config': 'model_config', 'pytree': 'pytree'}
    """
    loc = path if isinstance(path, Location) else Location(path)
    if _is_item(loc):
        return {"": ""}
    if meta is None and loc.exists(CHECKPOINT_METADATA_FILE):
        meta = loc.read_json(CHECKPOINT_METADATA_FILE)
    handlers = meta.get("item_handlers") if isinstance(meta, dict) else None
    names = loc.listdir()
    items: Dict[str, Optional[str]] = {}
    listed = sorted(handlers) if isinstance(handlers, dict) else []
    for name in names:
        if TMP_SUFFIX in name or name.startswith((".", "_")) or name in ("d", "array_metadatas"):
            continue
        if name in listed or (loc.isdir(name) and _is_item(loc, name)):
            if not safe_key(name):
                raise UnsafeCheckpointError(f"Orbax item name {quote_name(name)} is not a folder name.", path=loc.root)
            items[name] = name
        elif safe_key(name) and _is_json_item(loc, name):
            items[name] = None  # a JSON item (no arrays)
    for name in listed:  # items the metadata names but that hold no folder (nothing to read)
        if name not in items and isinstance(name, str) and safe_key(name):
            items.setdefault(name, None)
    return dict(sorted(items.items()))
