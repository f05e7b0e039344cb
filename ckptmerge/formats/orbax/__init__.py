"""Orbax checkpoints (JAX, Flax, Keras on JAX), read and written without JAX; ``tensorstore`` decodes arrays.

Holds: ``layout`` (what is where: a CheckpointManager root's steps, a step's items, what each
leaf is), ``reader`` (:class:`~ckptmerge.formats.orbax.reader.OrbaxReader`: an item's
``_METADATA`` tree and its arrays), ``writer`` (Orbax outputs, beside it), ``store`` (where an
item's bytes are, as TensorStore sees them), ``ocdbt`` (key lookups in an OCDBT database without
tensorstore), ``aggregate`` (the old msgpack ``checkpoint`` file) and ``bridge`` (the loopback
server through which TensorStore reads URLs with fsspec).

``ckptmerge.formats.orbax`` was the reader module until this release; its names still resolve
here (``from ckptmerge.formats.orbax import OrbaxReader``), with a ``DeprecationWarning`` naming
the module that holds each now (``reader`` or ``layout``).

May import: ``formats`` (``base``, ``dtypes``), ``formats.io``, ``formats.tf`` (the CRC32C of
``bundle``) and the bottom layer (``core``). Never JAX or TensorFlow.
"""

from ...core.compat import moved_names

__getattr__ = moved_names(__name__, ("ckptmerge.formats.orbax.reader", "ckptmerge.formats.orbax.layout"))
