"""safetensors files (Hugging Face): one file or a sharded set with its ``.index.json``.

Holds: ``reader`` (:class:`~ckptmerge.formats.safetensors.reader.SafetensorsReader`: the header
checked against the file, tensors read by ranged reads or memory maps) and ``writer`` (atomic
``.safetensors`` outputs, beside it).

``ckptmerge.formats.safetensors`` was the reader module until this release; its names still
resolve here (``from ckptmerge.formats.safetensors import SafetensorsReader``), with a
``DeprecationWarning`` naming ``ckptmerge.formats.safetensors.reader``.

May import: ``formats`` (``base``, ``dtypes``, ``ranges``), ``formats.io``, ``formats.tf`` (the
CRC32C of ``bundle``) and the bottom layer (``core``). Never torch or TensorFlow.
"""

from ...core.compat import moved_names

__getattr__ = moved_names(__name__, ("ckptmerge.formats.safetensors.reader",))
