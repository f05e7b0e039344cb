"""Graph-mode restore (``tf.compat.v1``): ops built once per plan, every restore just runs them.

For each checkpoint source the graph gets what a ``tf.compat.v1.train.Saver`` built from a
``{checkpoint_key: variable}`` dict gets: one ``RestoreV2`` op reading all of that source's keys
(with slice specs for partitioned variables), and one assign per variable. Two differences, both on
purpose: every assign waits for *all* sources' reads (so a failed read changes nothing), and all
sources are read in one ``session.run`` (so they are read concurrently instead of one Saver after
another). Casts are graph ops; values that come from memory or pass through a Python transform are
fed through cached placeholders. Building happens on the first restore (or ``Restorer`` creation);
later restores add no operation to the graph.
"""

from __future__ import annotations

import time
from typing import Any, Dict, List, Optional, Tuple

import numpy as np

from ..errors import CkptMergeError, RestoreError
from . import Progress, make_report
from .eager import read_sources
from .tensors import part_value

__all__ = ["GraphOps", "restore_graph"]


class GraphOps:
    """The cached restore ops of one plan in one graph.

    Attributes:
        op: the grouped op that performs the whole restore.
        prefixes: ``{source_label: string placeholder}`` fed with the checkpoint prefix.
        feeds: ``[(assignment, part_spec, placeholder)]`` fed with values computed in Python.
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
        self.prefixes: Dict[str, Any] = {}
        self.feeds: List[Tuple[Any, Optional[str], Any]] = []
        fed_sources = {h.label for h in binding.handles if h.source.in_memory}
        with graph.as_default(), tf.name_scope("ckptmerge_restore"):
            reads: Dict[str, Dict[Tuple[str, Optional[str]], Any]] = {}
            groups: Dict[str, List[Tuple[Any, Optional[str], Any]]] = {}
            for a in plan.assignments.values():
                target = binding.targets.variables[a.target]
                for var, spec in target.parts:
                    groups.setdefault(a.source, []).append((a, spec, var))
            read_ops = []
            for label, items in groups.items():
                if label in fed_sources:
                    continue
                items = [it for it in items if not binding.has_transform(it[0])]
                if not items:
                    continue
                prefix = tf.compat.v1.placeholder(tf.string, shape=(), name="prefix")
                self.prefixes[label] = prefix
                keys = [a.key for a, _, _ in items]
                slices = [spec or "" for _, spec, _ in items]
                dtypes = [tf.as_dtype(a.spec.dtype) for a, _, _ in items]
                tensors = tf.raw_ops.RestoreV2(prefix=prefix, tensor_names=keys, shape_and_slices=slices, dtypes=dtypes)
                reads[label] = {(a.name, spec): t for (a, spec, _), t in zip(items, tensors)}
                read_ops.append(tensors[0].op)
            assigns = []
            with tf.control_dependencies(read_ops):
                for label, items in groups.items():
                    for a, spec, var in items:
                        if label in reads and (a.name, spec) in reads[label]:
                            value = reads[label][(a.name, spec)]
                            if a.cast:
                                value = tf.cast(value, var.dtype.base_dtype)
                        else:
                            value = tf.compat.v1.placeholder(var.dtype.base_dtype, shape=var.shape)
                            self.feeds.append((a, spec, value))
                        assigns.append(_assign(tf, var, value))
            self.op = tf.group(*assigns, name="restore_all")

    def run(self, session: Any, plan: Any, binding: Any, progress: Optional[Progress]) -> int:
        """Run the restore; returns the bytes read by Python for fed values."""
        feed: Dict[Any, Any] = {ph: h.path for h in binding.handles for lbl, ph in self.prefixes.items() if lbl == h.label}
        nbytes = 0
        if self.feeds:
            needed = {a.target: a for a, _, _ in self.feeds}
            sub = type("SubPlan", (), {"assignments": needed})()
            values, nbytes = read_sources(sub, binding, progress)
            for a, spec, ph in self.feeds:
                value = binding.transform(a, values[(a.source, a.name)])
                if not isinstance(value, np.ndarray):
                    value = np.asarray(value)
                feed[ph] = part_value(value, spec)
        session.run(self.op, feed_dict=feed)
        return nbytes


def _assign(tf: Any, var: Any, value: Any) -> Any:
    if hasattr(var, "handle") or isinstance(var, tf.Variable) and not hasattr(var, "_ref"):
        try:
            return var.assign(value, read_value=False)
        except TypeError:  # pragma: no cover - ref variables without read_value
            pass
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
    try:
        nbytes = binding.graph_ops.run(session, plan, binding, progress)
    except tf.errors.OpError as exc:
        raise RestoreError(
            f"Reading a checkpoint failed, so no target variable was changed: {exc.message}",
        ) from exc
    nbytes += sum(a.spec.nbytes for a in plan.assignments.values()
                  if a.source in binding.graph_ops.prefixes)
    if progress is not None:
        progress(nbytes, nbytes)
    return make_report(plan, binding, mode="graph", elapsed=time.perf_counter() - t0, bytes_read=nbytes)
