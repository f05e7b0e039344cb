"""TensorFlow's own checkpoint formats, read and written without TensorFlow.

Holds: the V2 tensor bundle (``bundle``, ``bundleindex``, ``table``, ``table_writer``, ``writer``,
``entries``: the index a writer encodes; ``partitioned``: tensors read in parts),
its protobuf wire format (``protowire``, ``tfproto``), the object graph (``objectgraph``), the
old V1 format (``v1``) and partitioned-variable slices (``slices``, ``regions``).

May import: ``formats`` (``base``, ``dtypes``), ``formats.io`` and the bottom layer (``core``).
"""
