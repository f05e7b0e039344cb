"""NumPy's own files: ``.npz`` archives and folders of ``.npy`` files, one array per variable.

Holds: ``reader`` (:class:`~ckptmerge.formats.numpy.reader.NumpyReader`: headers parsed and
checked before an array is made, never unpickling).

May import: ``formats`` (``base``, ``dtypes``), ``formats.io`` and the bottom layer (``core``).
"""
