"""Publishing one finished output file: a temporary file beside it, moved into place at once.

The single-file writers (safetensors, Keras ``.weights.h5``) write a hidden temporary file in
the output's folder and publish it here: with ``overwrite`` by one rename (readers see the old
file or the new one, never a mix); without it by a hard link, which fails rather than replace a
file that appeared meanwhile. With ``durable`` the file and the folder are fsynced.
"""

from __future__ import annotations

import os

from ckptmerge.errors import CheckpointWriteError, OutputExistsError
from ckptmerge.formats.io.output_prefix import remove_quietly
from ckptmerge.text import quote_name

__all__ = ["publish_file", "temp_path"]


def temp_path(abs_path: str) -> str:
    """A hidden temporary name beside ``abs_path`` (unique to this process and call).

    Example:
        >>> os.path.basename(temp_path("/out/model.safetensors")).startswith(".model.safetensors.ckptmerge-tmp-")
        True
    """
    return os.path.join(os.path.dirname(abs_path), f".{os.path.basename(abs_path)}.ckptmerge-tmp-{os.getpid()}-"
                                                   f"{os.urandom(4).hex()}")


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
