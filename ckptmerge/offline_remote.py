"""Merge outputs in object storage: ``cm.merge(sources, "s3://bucket/run/merged")``.

The merge itself runs exactly as for a local output, into a private temporary folder (so every
check, the plan, streaming and checksums are the same code). The files are then uploaded through
fsspec (``s3fs`` and friends upload large files as multipart uploads, streamed from disk, in
bounded memory) in the order a reader needs: **data objects first, the index last**, so no reader
ever sees an index whose data is incomplete. Object stores have no atomic rename, so replacing an
existing checkpoint (``overwrite=True``) first deletes its index: during the upload the prefix
reads as "no checkpoint", never as a mix of old and new. An upload that fails or is interrupted
removes the objects it wrote (an unfinished multipart upload is aborted by the filesystem
library) and leaves no index. Nothing here imports TensorFlow.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import re
import shutil
import tempfile
from typing import Any, Callable, List

from .errors import ArgumentError, CheckpointWriteError, OutputExistsError
from .formats.storage import basename, dirname, filesystem, join, remote_exists, remote_listdir
from .text import quote_name

__all__ = ["merge_to_url"]

logger = logging.getLogger(__name__)

_DATA_RE = re.compile(r"\.data-\d{5}-of-\d{5}$")


def _remote_checkpoint_objects(url: str) -> List[str]:
    """The index and data objects of a checkpoint at ``url`` (a prefix) that exist."""
    parent, base = dirname(url), basename(url)
    try:
        names = [e["name"] for e in remote_listdir(parent)]
    except Exception:  # noqa: BLE001 - no such "directory": nothing there
        return []
    return [join(parent, n) for n in names
            if n == base + ".index" or (n.startswith(base) and _DATA_RE.fullmatch(n[len(base):]))]


def merge_to_url(merge: Callable[..., Any], sources: Any, url: str, **options: Any) -> Any:
    """Run ``merge(sources, <local temp prefix>, **options)``, then upload the result to ``url``.

    Raises:
        OutputExistsError: a checkpoint exists at ``url`` and ``overwrite`` is false.
        ArgumentError: ``update_state`` (not supported for remote outputs yet).
        CheckpointWriteError: an upload failed; the objects it wrote are removed.

    Example:
        >>> merge_to_url(merge, [Source("runs/A")], "s3://bucket/release/model")  # doctest: +SKIP
    """
    if options.get("update_state"):
        raise ArgumentError("update_state is not supported for a merge output in object storage yet: write the "
                            f"'checkpoint' state file yourself. Received: out_prefix={url!r}, update_state=True")
    fmt = options.get("format") or ("safetensors" if url.endswith(".safetensors") else "tf")
    existing = ([url] if remote_exists(url) else []) if fmt == "safetensors" else _remote_checkpoint_objects(url)
    if existing and not options.get("overwrite"):
        raise OutputExistsError(f"A checkpoint already exists at {quote_name(url)} ({quote_name(existing[0])}). Choose "
                                "another output, or pass overwrite=True (ckptmerge merge --force) to replace it.",
                                path=existing[0])
    tmp = tempfile.mkdtemp(prefix="ckptmerge-upload-")
    try:
        local = os.path.join(tmp, basename(url))
        report = merge(sources, local, **{**options, "overwrite": True, "update_state": False})
        if not options.get("dry_run"):
            _upload(local, url, fmt, existing)
        return dataclasses.replace(report, output=url)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _upload(local: str, url: str, fmt: str, existing: List[str]) -> None:
    fs, _ = filesystem(url)
    folder, base = os.path.dirname(local), os.path.basename(local)
    files = sorted(n for n in os.listdir(folder) if n == base or n.startswith(base + "."))
    index = [n for n in files if n.endswith(".index")]
    order = [n for n in files if n not in index] + index  # data first, the index last
    uploaded: List[str] = []
    target_dir = dirname(url)
    old_index = [u for u in existing if u.endswith(".index")]
    try:
        for u in old_index:  # from here until the new index lands, the prefix reads as "nothing"
            fs.rm_file(filesystem(u)[1])
        for name in order:
            dest = join(target_dir, name)
            fs.put_file(os.path.join(folder, name), filesystem(dest)[1])
            uploaded.append(dest)
            logger.info("uploaded %s", dest)
    except BaseException as e:
        for dest in reversed(uploaded):
            try:
                fs.rm_file(filesystem(dest)[1])
            except Exception:  # noqa: BLE001 - best effort; the index (uploaded last) is what counts
                logger.warning("could not remove %s after a failed upload", dest)
        if isinstance(e, Exception):
            raise CheckpointWriteError(f"Uploading the merge to {quote_name(url)} failed ({type(e).__name__}: {e}); "
                                       "the objects it wrote were removed, so no index points at incomplete data.",
                                       path=url) from e
        raise
    stale = [u for u in existing if not u.endswith(".index") and basename(u) not in order]
    for u in stale:  # data shards of the replaced checkpoint that the new one does not have
        try:
            fs.rm_file(filesystem(u)[1])
        except Exception:  # noqa: BLE001
            logger.warning("could not remove stale object %s", u)
