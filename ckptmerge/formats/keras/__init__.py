"""Keras's weights files, read and written without Keras or h5py's help for names.

Holds: ``h5`` (the reader of ``.weights.h5``, Keras 2 ``.h5`` and the weights inside a ``.keras``
archive), ``h5_writer`` (``.weights.h5`` and ``.keras`` outputs, beside it), ``names`` (the
recognisable names of a Keras 3 archive's numbered datasets, from its ``config.json``: pure) and
``shards`` (Keras 3 sharded weights: ``*.weights.json`` and its ``*_NNNNN.weights.h5`` shards).

May import: ``formats`` (``base``, ``dtypes``, ``ranges``), ``formats.io``, ``formats.tf`` (the
CRC32C of its ``crc``/``bundle``), ``formats.safetensors`` (the JSON-file bounds a shard index
shares) and the bottom layer (``core``). Never TensorFlow or Keras.
"""
