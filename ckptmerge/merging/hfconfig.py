"""A PyTorch output beside its Hugging Face config, so ``from_pretrained`` loads the folder.

``merge(..., layout="torch", template="hf/")`` writes the sources' tensors under the names of a
``save_pretrained`` folder's ``model.safetensors``. ``from_pretrained`` reads a folder: its
``config.json`` (which class, which sizes) and its ``model.safetensors``. When the template's
folder has a ``config.json`` and the output is named ``model.safetensors``, the merge copies the
config (and ``generation_config.json``, when there is one) into the output's folder after the
weights are published, each file atomically; an existing different one is refused before anything
is written (replaced with ``overwrite``). An output named otherwise gets a note saying how to have
a folder ``from_pretrained`` loads.
"""

from __future__ import annotations

import os
from typing import List, Optional, Tuple

from ..core.errors import CheckpointWriteError, OutputExistsError
from ..core.text import quote_name
from ..formats.io.localfile import read_regular_file
from ..formats.io.publish import publish_file, temp_path

__all__ = ["HF_FILES", "companions", "check_companions", "copy_companions"]

#: The files of a ``save_pretrained`` folder copied beside a PyTorch output.
HF_FILES = ("config.json", "generation_config.json")
_LIMIT = 16 << 20  # a config is a few kB; a larger one is not a config

Pairs = List[Tuple[str, str]]


def companions(template: str, template_prefix: str, out_abs: str) -> Tuple[Pairs, str]:
    """``([(template file, output file)], note)``: what to copy beside the output, or why nothing.

    Example:
        >>> companions("no/such/folder", "no/such/folder/model.safetensors", "/out/model.safetensors")
        ([], '')
    """
    folder = template if os.path.isdir(template) else os.path.dirname(template_prefix)
    if not os.path.isfile(os.path.join(folder, "config.json")):
        return [], ""
    if os.path.basename(out_abs) != "model.safetensors":
        return [], (f"The template's folder {quote_name(folder)} is a Hugging Face folder (config.json): "
                    "from_pretrained reads a folder's model.safetensors with its config.json. Name the output "
                    "'<folder>/model.safetensors' and the config is copied beside it.")
    out_dir = os.path.dirname(out_abs)
    return [(os.path.join(folder, f), os.path.join(out_dir, f)) for f in HF_FILES
            if os.path.isfile(os.path.join(folder, f))], ""


def check_companions(pairs: Pairs, overwrite: bool) -> None:
    """Refuse, before anything is written, a different config already in the output's folder.

    Raises:
        OutputExistsError: without ``overwrite``, a file of the same name and other bytes exists.

    Example:
        >>> check_companions([], False)
    """
    if overwrite:
        return
    for src, dst in pairs:
        if os.path.lexists(dst) and (not os.path.isfile(dst) or read_regular_file(dst, limit=_LIMIT)
                                     != read_regular_file(src, limit=_LIMIT)):
            raise OutputExistsError(f"The output's folder already holds another {os.path.basename(dst)} "
                                    f"({quote_name(dst)}), which from_pretrained would read with the new weights. "
                                    "Choose another folder, or pass overwrite=True (--force) to replace it. "
                                    "Nothing was written.", path=dst)


def copy_companions(pairs: Pairs, *, durable: bool) -> List[str]:
    """Copy each file (atomically: a temporary name, then one rename); return what was written.

    Raises:
        CheckpointWriteError: a copy failed (the weights are published already; the message says so).

    Example:
        >>> copy_companions([], durable=False)
        []
    """
    written: List[str] = []
    for src, dst in pairs:
        data = read_regular_file(src, limit=_LIMIT)
        if os.path.isfile(dst) and read_regular_file(dst, limit=_LIMIT) == data:
            continue
        tmp = temp_path(dst)
        try:
            with open(tmp, "xb") as f:
                f.write(data)
        except OSError as e:
            _remove(tmp)
            raise CheckpointWriteError(f"The weights were written, but {os.path.basename(src)} could not be copied "
                                       f"beside them ({quote_name(dst)}): {e.strerror or e}. Copy "
                                       f"{quote_name(src)} there yourself for from_pretrained.", path=dst,
                                       errno_=e.errno) from e
        publish_file(tmp, dst, dst, overwrite=True, durable=durable)
        written.append(dst)
    return written


def _remove(path: Optional[str]) -> None:
    try:
        if path:
            os.remove(path)
    except OSError:
        pass
