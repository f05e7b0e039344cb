"""Restore into a Keras 3 model on a backend other than TensorFlow (JAX, PyTorch, NumPy).

Values are read by ckptmerge's TF-free readers exactly as for an eager TF restore (every source
concurrently, nothing assigned until every read succeeded), then assigned through Keras's own
variable API (``variable.assign``), which each backend implements. The previous values are
copied to the host first, so an assignment that fails half-way puts every variable back.
TensorFlow is never imported here.
"""

from __future__ import annotations

import time
from typing import Any, Optional

import numpy as np

from ...errors import RestoreError
from .common import Progress, make_report
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
    backups = [np.array(keras_numpy(var)) for var, _ in work]
    done = 0
    try:
        for var, value in work:
            var.assign(value)
            done += 1
    except Exception as exc:  # put back what was changed, then report the cause
        for (var, _), old in zip(work[:done + 1], backups):
            var.assign(old)
        raise RestoreError(
            f"Assigning target variable {done + 1} of {len(work)} failed; every target was put "
            f"back as it was. Cause: {exc}"
        ) from exc
    return make_report(plan, binding, mode="keras", elapsed=time.perf_counter() - t0, bytes_read=nbytes)
