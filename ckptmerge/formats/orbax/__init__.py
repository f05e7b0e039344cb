"""Orbax checkpoints (JAX, Flax, Keras on JAX), read and written without JAX; ``tensorstore`` decodes arrays.

Holds: ``reader`` (:class:`~ckptmerge.formats.orbax.reader.OrbaxReader`: step and item folders,
their ``_METADATA`` trees and arrays), ``writer`` (Orbax outputs, beside it), ``store`` (where an
item's bytes are, as TensorStore sees them), ``ocdbt`` (key lookups in an OCDBT database without
tensorstore), ``aggregate`` (the old msgpack ``checkpoint`` file) and ``bridge`` (the loopback
server through which TensorStore reads URLs with fsspec).

``ckptmerge.formats.orbax`` was the reader module until this release; its names still resolve
here (``from ckptmerge.formats.orbax import OrbaxReader``), with a ``DeprecationWarning`` naming
``ckptmerge.formats.orbax.reader``.

May import: ``formats`` (``base``, ``dtypes``), ``formats.io``, ``formats.tf`` (the CRC32C of
``bundle``) and the bottom layer (``core``). Never JAX or TensorFlow.
"""

from ...core.compat import moved_names

__getattr__ = moved_names(__name__, ("ckptmerge.formats.orbax.reader",))
