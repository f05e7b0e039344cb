"""A map written on the stored names of a laid-out source (issue 33 item 6).

``layout="flax"`` and ``layout="torch"`` rename what is stored (``params/Dense_0/kernel`` ->
``Dense_0/kernel``, ``fc.weight`` -> ``fc/kernel``). A map may use either spelling: a stored
key, or a scope of stored keys, is put in the layout's spelling where that is certain; where it is
not, the entry stays unmatched and its message says that the layout renamed the names.
"""

from __future__ import annotations

from pathlib import Path
from typing import Dict, List

import numpy as np
import pytest

import ckptmerge as cm


def _flax_tree(rng: np.random.Generator, n_dense: int, n_norm: int) -> Dict[str, np.ndarray]:
    tree: Dict[str, np.ndarray] = {}
    for i in range(n_dense):
        a, b = (int(x) for x in rng.integers(2, 9, size=2))
        tree[f"params/Dense_{i}/kernel"] = rng.standard_normal((a, b)).astype(np.float32)
        tree[f"params/Dense_{i}/bias"] = rng.standard_normal(b).astype(np.float32)
    for i in range(n_norm):
        d = int(rng.integers(2, 9))
        tree[f"params/LayerNorm_{i}/scale"] = rng.standard_normal(d).astype(np.float32)
        tree[f"params/LayerNorm_{i}/bias"] = rng.standard_normal(d).astype(np.float32)
    return tree


def _targets(tree: Dict[str, np.ndarray]) -> List[cm.VariableInfo]:
    out = []
    for key, value in tree.items():
        _, module, leaf = key.split("/")
        kind = "dense" if module.startswith("Dense") else "norm"
        leaf = {"scale": "gamma", "bias": "beta" if kind == "norm" else "bias"}.get(leaf, leaf)
        out.append(cm.VariableInfo(f"model/{kind}{module.split('_')[1]}/{leaf}", value.shape, "float32"))
    return out


def _map(tree: Dict[str, np.ndarray], stored: bool) -> Dict[str, str]:
    """Scopes for the Dense modules, exact names for the norms; on stored or converted names."""
    out = {}
    for key in tree:
        _, module, leaf = key.split("/")
        kind = "dense" if module.startswith("Dense") else "norm"
        target = f"model/{kind}{module.split('_')[1]}/"
        if kind == "dense":
            out[f"params/{module}/" if stored else f"{module}/"] = target
        else:
            conv = {"scale": "gamma", "bias": "beta"}[leaf]
            out[key if stored else f"{module}/{conv}"] = target + conv
    return out


@pytest.mark.parametrize("seed", range(4))
def test_flax_map_on_stored_names_equals_map_on_converted_names(tmp_path: Path, seed: int) -> None:
    rng = np.random.default_rng(seed)
    tree = _flax_tree(rng, int(rng.integers(1, 4)), int(rng.integers(1, 3)))
    path = tmp_path / "params.npz"
    np.savez(path, **tree)
    targets = _targets(tree)
    plans = [cm.plan(targets, [cm.Source(str(path), layout="flax", map=_map(tree, stored))])
             for stored in (True, False)]
    for plan in plans:
        assert not plan.missing and not plan.unmatched_rules, plan.report()
    assert ({t: a.name for t, a in plans[0].assignments.items()}
            == {t: a.name for t, a in plans[1].assignments.items()})
    assert len(plans[0].assignments) == len(tree)


def test_flax_root_scope_of_stored_names(tmp_path: Path) -> None:
    tree = _flax_tree(np.random.default_rng(0), 2, 1)
    np.savez(tmp_path / "p.npz", **tree)
    laid_out = cm.plan([], [cm.Source(str(tmp_path / "p.npz"), layout="flax")]).sources[0].variables
    assert laid_out and not any(n.startswith("params/") for n in laid_out)
    targets = [cm.VariableInfo("m/" + v.name, v.shape, v.dtype) for v in laid_out.values()]
    plan = cm.plan(targets, [cm.Source(str(tmp_path / "p.npz"), layout="flax", map={"params/": "m/"})])
    assert not plan.unmatched_rules and not plan.missing, plan.report()  # 'params/' is the layout's root


def test_a_stored_scope_the_layout_splits_says_the_layout_renamed_it(tmp_path: Path) -> None:
    """Flax's batch_stats collection and params collection meet in one module: the stored scope
    'batch_stats/' has no certain spelling in the layout (it would be the root), so it stays."""
    tree = {"params/BatchNorm_0/scale": np.ones(3, np.float32), "params/BatchNorm_0/bias": np.zeros(3, np.float32),
            "batch_stats/BatchNorm_0/mean": np.zeros(3, np.float32),
            "batch_stats/BatchNorm_0/var": np.ones(3, np.float32)}
    np.savez(tmp_path / "bn.npz", **tree)
    plan = cm.plan([cm.VariableInfo("bn/moving_mean", (3,), "float32")],
                   [cm.Source(str(tmp_path / "bn.npz"), layout="flax", map={"batch_stats/": "bn/"})])
    text = plan.report()
    assert plan.unmatched_rules, text
    assert "layout='flax' renames the stored names" in text, text


@pytest.mark.parametrize("layers", [1, 3, 12])
def test_torch_map_on_stored_names_exact_and_scoped(tmp_path: Path, layers: int) -> None:
    rng = np.random.default_rng(layers)
    tensors = {}
    for i in range(layers):
        tensors[f"encoder.layer.{i}.dense.weight"] = rng.standard_normal((3, 4)).astype(np.float32)
        tensors[f"encoder.layer.{i}.dense.bias"] = rng.standard_normal(3).astype(np.float32)
    from safetensors.numpy import save_file

    save_file(tensors, str(tmp_path / "m.safetensors"))
    last = layers - 1
    targets = [cm.VariableInfo("blk/kernel", (4, 3), "float32"), cm.VariableInfo("blk/bias", (3,), "float32"),
               cm.VariableInfo("first/kernel", (4, 3), "float32")]
    plan = cm.plan(targets, [cm.Source(str(tmp_path / "m.safetensors"), layout="torch",
                                       map={f"encoder.layer.{last}.dense.": "blk/",
                                            "encoder.layer.0.dense.weight": "first/kernel"})])
    assert not plan.missing and not plan.unmatched_rules, plan.report()
    assert plan.assignments["blk/kernel"].name == f"encoder/layer/{last}/dense/kernel"
    assert plan.assignments["first/kernel"].name == "encoder/layer/0/dense/kernel"
    got = cm.load(str(tmp_path / "m.safetensors"))
    np.testing.assert_array_equal(got[f"encoder.layer.{last}.dense.weight"], tensors[f"encoder.layer.{last}.dense.weight"])
