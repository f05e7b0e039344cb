"""Restore into a Keras 3 model on a backend other than TensorFlow (JAX, PyTorch, NumPy).

Values are read by ckptmerge's TF-free readers exactly as for an eager TF restore (every source
concurrently, nothing assigned until every read succeeded), then assigned through Keras's own
variable API (``variable.assign``), which each backend implements. The previous values are
copied to the host first, so an assignment that fails half-way, or Ctrl-C, puts every variable
back (:func:`~ckptmerge.restoring.backends.common.assign_all`).
TensorFlow is never imported here.
"""

from __future__ import annotations

import time
from typing import Any, Optional

import numpy as np

from .common import Progress, assign_all, make_report
from .eager import prepare_values, read_sources

__all__ = ["restore_keras", "keras_numpy"]


def keras_numpy(variable: Any) -> np.ndarray:
    """The value of a Keras variable as a numpy array (on the host), on any backend.

    Example:
        >>> keras_numpy(model.weights[0]).shape  # doctest: +SKIP
        (784, 128)
    """
    from keras import ops

    return np.asarray(ops.convert_to_numpy(variable.value))


def restore_keras(plan: Any, binding: Any, progress: Optional[Progress] = None) -> Any:
    """Carry out ``plan`` on Keras variables of a non-TensorFlow backend; see the module docstring."""
    t0 = time.perf_counter()
    values, nbytes = read_sources(plan, binding, progress)
    prepared = prepare_values(plan, binding, values, as_numpy=True)
    work = [(var, prepared[(a.target, spec)]) for a in plan.assignments.values()
            for var, spec in binding.targets.variables[a.target].parts]
    assign_all(work, lambda var, value: var.assign(value), lambda var: np.array(keras_numpy(var)),
               lambda var, old: var.assign(old))
    return make_report(plan, binding, mode="keras", elapsed=time.perf_counter() - t0, bytes_read=nbytes)
