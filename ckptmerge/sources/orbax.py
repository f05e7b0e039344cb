"""Which Orbax checkpoint a path (and optional step) means: a step or item folder, or the latest
finalised step of a CheckpointManager root.

Used by :mod:`ckptmerge.sources.local` and :mod:`ckptmerge.sources.remote` for local paths and URLs
alike (the folder questions go through :mod:`ckptmerge.formats.orbax.layout`). Only finalised steps
count: never a folder under Orbax's temporary name, nor a step without its commit marker where
Orbax uses one (GCS); "latest" is the highest finalised step, as Orbax's CheckpointManager has it.
"""

from __future__ import annotations

import os
import re
from typing import Any, List, NamedTuple, Optional, Tuple

from ..core import limits
from ..core.errors import ArgumentError, CheckpointNotFoundError, did_you_mean
from ..formats.io import storage
from ..core.errors import CheckpointFormatError
from ..formats.orbax.layout import (CHECKPOINT_METADATA_FILE, COMMIT_FILE, METADATA_FILE, OCDBT_PROCESS, TMP_SUFFIX,
                                    is_orbax, item_folders, orbax_steps)
from ..formats.orbax.store import Location
from ..core.text import quote_name, quoted_command

__all__ = ["orbax_item", "orbax_near_miss", "ORBAX_LOOKED_FOR", "orbax_folder", "orbax_root", "ORBAX_MARKERS", "orbax_listing", "OrbaxListed", "FORMAT_ORBAX", "orbax_step_of"]

#: An Orbax step or item folder (read through tensorstore).
FORMAT_ORBAX = "orbax"
_STEP = re.compile(r"^(?:.+_)?(\d+)$")
#: Files whose presence makes a folder an Orbax step or item folder.
ORBAX_MARKERS = frozenset((CHECKPOINT_METADATA_FILE, METADATA_FILE, "manifest.ocdbt", "orbax.checkpoint"))


#: What makes a folder an Orbax checkpoint, as the "no checkpoint" messages list it.
ORBAX_LOOKED_FOR = ("Orbax checkpoints ('_CHECKPOINT_METADATA', '_METADATA' or 'manifest.ocdbt', or a "
                    "CheckpointManager root of step folders such as '100/state/' or 'checkpoint_100/')")
_SHOWN = 3


def orbax_near_miss(folder: str) -> str:
    """What in ``folder`` looks almost like an Orbax checkpoint, as a sentence for a "no
    checkpoint" message (``""`` when nothing does): steps still being written, a step folder
    whose items sit beside other files, OCDBT data without its manifest, a commit marker alone.
    Only names are listed (of the folder and of its step-named subfolders); nothing is read.

    Example:
        >>> orbax_near_miss("runs/jax")  # doctest: +SKIP
        " Orbax steps still being written (or left by a crash) are never read: '3.orbax-checkpoint-tmp-17'."
    """
    try:
        loc = Location(folder)
        names = loc.listdir() if loc.isdir() else []
    except (OSError, CheckpointFormatError):
        return ""
    seen = []
    tmp = [n for n in names if TMP_SUFFIX in n]
    if tmp:
        seen.append("Orbax steps or items still being written (or left by a crash) are never read: "
                    f"{', '.join(quote_name(n) for n in tmp[:_SHOWN])}{' ...' if len(tmp) > _SHOWN else ''}.")
    if ("d" in names or any(n.startswith("ocdbt.process_") for n in names)) and "manifest.ocdbt" not in names:
        seen.append(f"It holds OCDBT data ('d/', 'ocdbt.process_N/') but no 'manifest.ocdbt' or {METADATA_FILE}: "
                    "an incomplete copy of an Orbax item; copy it again.")
    elif names and set(names) <= {COMMIT_FILE, "_sharding"}:
        seen.append(f"It holds only {' and '.join(quote_name(n) for n in names)}: an Orbax step or item "
                    "whose data is missing; copy it again.")
    for n in [""] + names[:200]:
        if orbax_step_of(n or folder) is None or TMP_SUFFIX in n or (n and not loc.isdir(n)):
            continue
        try:
            sub = loc.child(n) if n else loc
            items = [i for i, f in item_folders(sub).items() if f]
            others = [x for x in sub.listdir() if x not in items and not x.startswith(".") and TMP_SUFFIX not in x
                      and x != COMMIT_FILE]
        except (OSError, CheckpointFormatError):
            continue
        if items and items != [""] and others:
            step = storage.join(folder, n) if n else folder
            shown = ", ".join(quote_name(i) for i in items[:_SHOWN])
            seen.append(f"{quote_name(step)} holds Orbax item(s) {shown} beside "
                        f"{', '.join(quote_name(x) for x in others[:_SHOWN])}, so it is not taken for a step; "
                        f"pass the item folder ({quote_name(storage.join(step, items[0]))}).")
            break
    return "".join(" " + x for x in seen)


def orbax_item(resolved: Any, item: str, label: str) -> Any:
    """``resolved`` (a step of an Orbax run) narrowed to its item ``item``: the item folder,
    resolved the same way (a :class:`~ckptmerge.sources.resolve.ResolvedCheckpoint`).

    Raises:
        ArgumentError: the checkpoint is not Orbax, or its step has no item ``item`` (naming the
            items it has).

    Example:
        >>> orbax_item(resolve_checkpoint("run", step=2), "state", "run").prefix  # doctest: +SKIP
        '/abs/run/2/state'
    """
    if resolved.format != FORMAT_ORBAX:
        raise ArgumentError(f"item={item!r} was given for source {quote_name(label)}, but it is a "
                            f"{resolved.format} checkpoint; items are the folders of an Orbax step. Drop item.")
    folders = item_folders(resolved.prefix)
    arrays = sorted(n for n, f in folders.items() if f)
    if folders.get(item) is None or item == "":
        what = (f"its items are {', '.join(quote_name(n) for n in arrays)}" if arrays and arrays != [""]
                else "it is a single item folder, which holds no items")
        hint = did_you_mean(item, arrays) if arrays else ""
        raise ArgumentError(f"item={item!r} was given for source {quote_name(label)}, but Orbax checkpoint "
                            f"{quote_name(resolved.prefix)} has no such item with arrays: {what}.{hint}")
    return type(resolved)(storage.join(resolved.prefix, folders[item]), FORMAT_ORBAX, resolved.step,
                          f"{resolved.note}, item {item}")


def orbax_step_of(path: str) -> Optional[int]:
    """The step in an Orbax step folder's name (``100``, ``ckpt_100``), else ``None``.

    Example:
        >>> orbax_step_of("runs/jax/ckpt_100"), orbax_step_of("runs/jax/100/state")
        (100, None)
    """
    name = storage.basename(path.rstrip("/\\"))
    m = _STEP.match(name)
    return int(m.group(1)) if m and not name.startswith(OCDBT_PROCESS) else None


def _looks_like_orbax(given: str) -> bool:
    """Whether ``given`` is an Orbax step or item folder, from a few file lookups (no listing, so a
    TF run directory pays almost nothing): Orbax's metadata files or OCDBT manifest, or an old
    item's msgpack ``checkpoint`` file (a TF state file of that name is text)."""
    if any(storage.isfile(storage.join(given, m)) for m in sorted(ORBAX_MARKERS)):
        return True
    # a step of Orbax before 0.6 (item folders only); by URL only a step-named folder is listed for it
    if (not storage.is_url(given) or orbax_step_of(given) is not None) and is_orbax(given):
        return True
    state = storage.join(given, "checkpoint")
    if storage.is_url(given) or not os.path.isfile(state):
        return False
    try:
        with open(state, "rb") as f:
            head = f.read(1)
    except OSError as e:
        limits.check(e, state)
        return False
    return bool(head) and (0x80 <= head[0] <= 0x8F or head[0] in (0xDE, 0xDF)) and is_orbax(given)


def orbax_folder(given: str, step: Optional[int]) -> Optional[Tuple[str, Optional[int], str]]:
    """``(folder, step, note)`` when ``given`` is an Orbax step or item folder, else ``None``.

    Raises:
        ArgumentError: ``step`` contradicts the step folder given.

    Example:
        >>> orbax_folder("runs/jax/200", None)  # doctest: +SKIP
        ('/abs/runs/jax/200', 200, 'Orbax checkpoint runs/jax/200')
    """
    if not _looks_like_orbax(given):
        return None
    own = orbax_step_of(given)
    if step is not None and own != step:
        has = f"is step {own}" if own is not None else "has no step in its name"
        raise ArgumentError(
            f"step={step} was given, but Orbax checkpoint {quote_name(given)} {has}. Pass its "
            f"CheckpointManager folder with the step (Source({quote_name(storage.dirname(given))}, step={step})), "
            "or drop the step.")
    return _abs(storage.strip_slash(given) if storage.is_url(given) else given.rstrip("/")), own, f"Orbax checkpoint {given}"


def orbax_root(given: str, step: Optional[int]) -> Optional[Tuple[str, Optional[int], str]]:
    """``(step folder, step, note)`` when ``given`` is a CheckpointManager root: ``step`` picks one of
    its finalised steps, else the latest; ``None`` when it holds no Orbax step.

    Raises:
        CheckpointNotFoundError: the root has no finalised step ``step``.

    Example:
        >>> orbax_root("runs/jax", None)  # doctest: +SKIP
        ('/abs/runs/jax/200', 200, 'latest finalised Orbax step of runs/jax (step 200; steps there: 100, 200)')
    """
    steps = orbax_steps(given)
    if not steps:
        return None
    shown = ", ".join(str(s.step) for s in steps)
    if step is not None:
        match = [s for s in steps if s.step == step]
        if not match:
            raise CheckpointNotFoundError(
                f"no finalised Orbax step {step} in {quote_name(given)}; steps there: {shown}. Run "
                f"{quoted_command('checkpoints', given)} to list them.", path=given)
        return _abs(match[0].path), step, f"step {step} of {given}"
    last = steps[-1]
    return _abs(last.path), last.step, f"latest finalised Orbax step of {given} (step {last.step}; steps there: {shown})"


def _abs(path: str) -> str:
    return path if storage.is_url(path) else os.path.abspath(path)


class OrbaxListed(NamedTuple):
    """One step of :func:`orbax_listing`."""

    path: str
    step: int
    time: float
    size: int
    latest: bool


def orbax_listing(directory: str) -> List[OrbaxListed]:
    """The finalised steps of a CheckpointManager root with their time (of the step's metadata
    file) and size (every file below the step), the last one marked latest; ``[]`` if none.

    Example:
        >>> [(s.step, s.latest) for s in orbax_listing("runs/jax")]  # doctest: +SKIP
        [(100, False), (200, True)]
    """
    steps = orbax_steps(directory)
    out = []
    for i, s in enumerate(steps):
        if storage.is_url(s.path):
            entries = {e["name"]: e for e in storage.remote_listdir(s.path)}
            t = (entries.get(CHECKPOINT_METADATA_FILE) or {}).get("mtime") or 0.0
            size = sum(int(e.get("size") or 0) for e in storage.remote_listdir(s.path))
            fs, path = storage.filesystem(s.path)
            try:
                size = int(fs.du(path, total=True) or size)
            except Exception:  # noqa: BLE001 - a listing that fails leaves the top-level size
                pass
        else:
            meta = os.path.join(s.path, CHECKPOINT_METADATA_FILE)
            t = os.path.getmtime(meta if os.path.exists(meta) else s.path)
            size = 0
            for dirpath, _, files in os.walk(s.path):
                for n in files:
                    try:
                        size += os.lstat(os.path.join(dirpath, n)).st_size
                    except OSError:
                        pass
        out.append(OrbaxListed(_abs(s.path), s.step, float(t), size, i == len(steps) - 1))
    return out
