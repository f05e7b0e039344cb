"""Graph-mode restore (``tf.compat.v1``): assign ops built once per plan, fed by ckptmerge's reader.

Once per plan the graph gets one placeholder and one assign per target variable (or per part of
a partitioned variable), grouped into a single op. Every restore then reads all sources
concurrently with the TF-free reader (the same path as eager mode: CRC-checked, into fresh
64-byte-aligned buffers) and runs that one op, feeding the buffers. TF takes aligned feeds without a
copy and the variables take over the buffers, so a restore costs about what reading the files
costs.

Why not one ``tf.compat.v1.train.Saver`` per source: measured side by side
(``scripts/bench_restore.py``), a session with default settings runs the Savers' ``RestoreV2`` ops
one after another, TF's reader is ~2.5x slower than a plain page-cache read, and a Saver assigns
each variable as soon as its own read is done, so a corrupt second source leaves the first one
restored. Here every read succeeds before the single ``session.run`` assigns anything, and
restoring again adds no op to the graph.
"""

from __future__ import annotations

import time
from collections import Counter
from typing import Any, Dict, List, Optional, Tuple

import numpy as np

from ...core.errors import CkptMergeError
from ...core.text import quote_name
from .common import Progress, make_report
from .eager import prepare_values, read_sources

__all__ = ["GraphOps", "restore_graph", "build_savers", "set_initializers"]


class GraphOps:
    """The cached restore op of one plan in one graph.

    Attributes:
        op: the grouped op that assigns every fed value.
        feeds: ``[(target name, part spec, placeholder)]`` in the order values are prepared.
    """

    def __init__(self, plan: Any, binding: Any) -> None:
        import tensorflow as tf

        graph = binding.targets.graph
        if graph.finalized:
            raise CkptMergeError(
                "The graph is finalized, so ckptmerge cannot add its restore ops. Build the plan and "
                "call plan.restore() (or create a ckptmerge.Restorer) before finalizing the graph, "
                "e.g. before creating a MonitoredSession."
            )
        self.feeds: List[Tuple[str, Optional[str], Any]] = []
        assigns = []
        with graph.as_default(), tf.name_scope("ckptmerge_restore"):
            for a in plan.assignments.values():
                for var, spec in binding.targets.variables[a.target].parts:
                    ph = tf.compat.v1.placeholder(var.dtype.base_dtype, shape=var.shape)
                    self.feeds.append((a.target, spec, ph))
                    assigns.append(_assign(tf, var, ph))
            self.op = tf.group(*assigns, name="restore_all")

    def run(self, session: Any, values: Dict[Tuple[str, Optional[str]], np.ndarray]) -> None:
        """Assign the prepared values (keyed by target name and part spec) in one run."""
        session.run(self.op, feed_dict={ph: values[(name, spec)] for name, spec, ph in self.feeds})


def _assign(tf: Any, var: Any, value: Any) -> Any:
    try:
        return var.assign(value, read_value=False)
    except TypeError:  # pragma: no cover - ref variables of very old graphs
        return tf.compat.v1.assign(var, value)


def restore_graph(plan: Any, binding: Any, session: Any, progress: Optional[Progress] = None) -> Any:
    """Carry out ``plan`` in graph mode in ``session`` (default: the default session)."""
    import tensorflow as tf

    if session is None:
        session = tf.compat.v1.get_default_session()
    if session is None:
        raise CkptMergeError(
            "Graph mode needs a session: pass session=sess to restore(), or run it inside "
            "'with sess.as_default():'."
        )
    if session.graph is not binding.targets.graph:
        raise CkptMergeError("The session runs another graph than the one the target variables live in.")
    t0 = time.perf_counter()
    binding.session = session
    if binding.graph_ops is None:
        binding.graph_ops = GraphOps(plan, binding)
    values, nbytes = read_sources(plan, binding, progress)
    prepared = prepare_values(plan, binding, values, as_numpy=True)
    binding.graph_ops.run(session, prepared)
    return make_report(plan, binding, mode="graph", elapsed=time.perf_counter() - t0, bytes_read=nbytes)


def build_savers(plan: Any, binding: Any) -> Dict[str, Any]:
    """The cached ``{source label: tf.compat.v1.train.Saver}`` of a graph-mode plan."""
    import tensorflow as tf

    if binding is None or binding.targets.mode != "graph":
        raise CkptMergeError("plan.savers() is for graph-mode plans (tf.compat.v1 graphs); in eager "
                             "mode call plan.restore().")
    if binding.savers is not None:
        return binding.savers
    in_memory = {h.label for h in binding.handles if h.source.in_memory}
    odd = sorted(a.target for a in plan.assignments.values()
                 if a.cast or a.source in in_memory or binding.has_transform(a))
    if odd:
        raise CkptMergeError(
            f"A Saver restores stored values as they are, but {len(odd)} assignment(s) cast, transform "
            f"or come from memory (e.g. {quote_name(odd[0])}); use plan.restore() for this plan.")
    uses = Counter((a.source, a.key) for a in plan.assignments.values())
    shared = sorted(k for k, n in uses.items() if n > 1)
    if shared:
        raise CkptMergeError(
            f"A Saver restores each checkpoint key into one variable, but {quote_name(shared[0][1])} of "
            f"source {quote_name(shared[0][0])} feeds several targets ({len(shared)} such key(s)); use "
            "plan.restore() for this plan.")
    var_lists: Dict[str, Dict[str, Any]] = {}
    for a in plan.assignments.values():
        parts = [var for var, _ in binding.targets.variables[a.target].parts]
        var_lists.setdefault(a.source, {})[a.key] = parts if len(parts) > 1 else parts[0]
    with binding.targets.graph.as_default():
        binding.savers = {label: tf.compat.v1.train.Saver(var_list=vl, name=f"ckptmerge_saver_{i}")
                          for i, (label, vl) in enumerate(sorted(var_lists.items()))}
    return binding.savers


def _tf_reads_it(binding: Any, assignment: Any) -> bool:
    """Whether TF's own ``RestoreV2`` can give this assignment's value as it is stored (a TF
    tensor bundle, no cast, no transform), as ``init_from_checkpoint`` reads it."""
    from ...formats.tf.bundle import BundleReader

    handle = next(h for h in binding.handles if h.label == assignment.source)
    return (isinstance(getattr(handle, "reader", None), BundleReader) and not assignment.cast
            and not binding.has_transform(assignment))


def set_initializers(plan: Any, binding: Any) -> List[str]:
    """Make each assigned variable's initializer read its value from the plan's sources.

    As ``tf.compat.v1.train.init_from_checkpoint`` does, each variable (each part of a
    partitioned one) gets a new ``_initializer_op`` and ``_initial_value``: a ``RestoreV2`` of its
    checkpoint key (and slice) for TF tensor bundles read as stored; otherwise a
    ``tf.numpy_function`` that reads with ckptmerge's reader and applies the cast and transforms
    (their "current value" is the variable's original initial value). Nothing is read now.

    Returns:
        The target names whose initializers were replaced, sorted.
    """
    import tensorflow as tf
    from tensorflow.python.ops import io_ops

    if binding is None or binding.targets.mode != "graph":
        raise CkptMergeError("plan.set_initializers() is for graph-mode plans (tf.compat.v1 graphs, "
                             "where variables have initializers); in eager mode call plan.restore().")
    graph = binding.targets.graph
    if graph.finalized:
        raise CkptMergeError(
            "The graph is finalized, so ckptmerge cannot replace initializers. Call "
            "plan.set_initializers() before creating the MonitoredTrainingSession or Scaffold.")
    handles = {h.label: h for h in binding.handles}
    with graph.as_default():
        for a in plan.assignments.values():
            target = binding.targets.variables[a.target]
            tf_reads = _tf_reads_it(binding, a)
            originals = [var._initial_value for var, _ in target.parts]
            for var, spec in target.parts:
                dtype = var.dtype.base_dtype
                # As init_from_checkpoint: on the variable's device, but on its CPU (RestoreV2 and
                # Python run there), so the variable is not forced onto the CPU.
                with tf.device(var.device), tf.device("/cpu:0"), tf.name_scope("ckptmerge_init"):
                    if tf_reads:
                        value = io_ops.restore_v2(handles[a.source].path, [a.key], [spec or ""], [dtype])[0]
                    else:
                        read = _reader_of(binding, handles[a.source], a, target, spec)
                        value = tf.numpy_function(read, originals, dtype, stateful=True)
                value.set_shape(var.shape)
                var._initializer_op = _assign(tf, var, value)  # noqa: SLF001 - as TF itself does
                var._initial_value = value  # noqa: SLF001
    return sorted(plan.assignments)


def _reader_of(binding: Any, handle: Any, assignment: Any, target: Any, spec: Optional[str]) -> Any:
    """The Python function a ``numpy_function`` initializer runs: read, cast, transform, slice."""
    from .tensors import join_parts, part_value, to_numpy

    def read(*original_parts: np.ndarray) -> np.ndarray:
        raw = handle.read([assignment.name])[assignment.name]
        current = join_parts(target, list(original_parts))
        value = binding.transform(assignment, raw, current)
        return to_numpy(part_value(np.asarray(value), spec), owned=False)
    return read
