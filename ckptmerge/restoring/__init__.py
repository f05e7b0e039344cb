"""The live side: TF and Keras objects as targets, and the backends that assign values to them.

Holds: ``targets`` (walking a model, ``tf.Module``, graph or variable list into named targets),
``keraswalk`` (Keras's own saving order and object paths) and ``backends`` (graph, eager and
Keras-native assignment, atomic). TensorFlow and Keras are imported lazily, only here.

May import: ``render``, ``planning``, ``alignment``, ``formats`` and the bottom layer (``core``).
Never ``cli``, ``api``, ``config``, ``merging`` or ``sources``.
"""
