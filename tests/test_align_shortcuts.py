"""The shortcuts that keep structural alignment fast decide exactly what the long way decides.

Each shortcut (a scan of the distinct templates before the names, scopes kept on the match
columns, groups without hazards skipped by the series-position cut, empty folds skipped) is
checked against the computation it stands for, on random names drawn from the convention
table's vocabulary (numbered families, Keras counters, dimensions, multi-segment conventions).
Pure and fast: no TensorFlow.
"""

from __future__ import annotations

import numpy as np

from ckptmerge.alignment import conventions as C
from ckptmerge.alignment.entries import Columns, Match, scope_entries, scopes_of
from ckptmerge.alignment.features import Features, _side_positions

_SEGMENTS = ["norm", "norm0", "norm1", "norm2", "ln_1", "ln_2", "ln_3", "layer_norm", "layer_norm_1",
             "layer_norm_2", "fc1", "fc2", "fc3", "mlp/dense_1", "mlp/dense_2", "w1", "w3", "lin1", "dense",
             "dense_1", "input_layernorm", "post_attention_layernorm", "attention/output/LayerNorm",
             "output/LayerNorm", "q_proj", "layernorm_1", "final_norm", "final_norm_3", "LN_1", "Norm1",
             "conv2d", "conv2d_1", "batch_normalization_2", "x12y", "block_07"]
_LEAVES = ["kernel", "bias", "gamma", "beta", "weight", "scale"]


def _names(rng):
    out = set()
    for _ in range(int(rng.integers(1, 30))):
        parts = []
        for _ in range(int(rng.integers(1, 4))):
            r = rng.random()
            parts.append(str(rng.choice(_SEGMENTS)) if r < 0.6 else
                         f"block_{int(rng.integers(0, 12))}" if r < 0.8 else f"layers/{int(rng.integers(0, 3))}")
        out.add("/".join(parts + [str(rng.choice(_LEAVES))]))
    names = sorted(out)
    rng.shuffle(names)
    return names


def _positional_scanning_every_name(names):
    """conventions.positional as it was before the template scan: every name scanned."""
    joined = "\n".join(names)
    _, roles, _, family, counted = C._compiled()[:5]
    keep, members, bare = set(), {}, {}
    for m in family.finditer(joined):
        text = m.group(0).lower()
        members.setdefault((C._prefix(m), C._DIGIT_RUN.sub("0", text)), set()).add(text)
    for (prefix, _), found in members.items():
        if not found <= roles.keys():
            keep.update((prefix, t) for t in found)
    for m in counted.finditer(joined):
        bare.setdefault((C._prefix(m), m.group(1).lower()), []).append(m.group(0).lower())
    if bare:
        present = {(C._prefix(m), m.group(0).lower()) for m in C._compiled()[0].finditer(joined)}
        for key, numbered in bare.items():
            if key in present and f"{key[1]}_1" in numbered:  # (Keras counts from _1)
                keep.add(key)
                keep.update((key[0], t) for t in numbered)
    return frozenset(keep)


CASES = [_names(np.random.default_rng(seed)) for seed in range(300)]


def test_positional_scans_templates_first_and_finds_what_a_scan_of_every_name_finds():
    nonempty = 0
    for names in CASES:
        expected = _positional_scanning_every_name(names)
        templates = [C._DIGIT_RUN.sub("0", n) for n in names]
        assert C.positional(names) == expected, names
        assert C.positional(names, templates) == expected, names
        nonempty += bool(expected)
    assert nonempty > 100  # (the vocabulary makes numbered families often)


def test_the_series_position_cut_skips_only_groups_it_would_leave_as_they_are():
    for names in CASES[:150]:
        feats = Features(names)
        for group in (names, names[::2], names[1::2]):
            full = Features(names)
            full._dimensional = True  # (no shortcut: every group is read)
            assert _side_positions(group, feats, frozenset()) == _side_positions(group, full, frozenset()), group
            hazards = feats.hazards(group)
            assert _side_positions(group, feats, hazards) == _side_positions(group, full, hazards), group


def _columns(matches):
    out = Columns()
    out.extend(matches)
    return out


def test_scopes_kept_on_match_columns_follow_sorting_dropping_and_adding():
    ms = [Match(f"t/{i % 3}/x{i}/kernel", f"s/{i}/k", 0.5 + i / 100, ("shape",)) for i in range(9)]
    cols = _columns(ms)
    assert scopes_of(cols) == ([m.target[:m.target.rfind("/") + 1] for m in ms], [m.name[:m.name.rfind("/") + 1] for m in ms])
    assert cols.scopes is not None
    for derived in (cols.sorted_by_target(), cols.without({0, 4})):
        assert derived.scopes is not None
        assert derived.scopes == scopes_of(list(derived))  # (a plain list: computed afresh)
    cols.extend([Match("u/kernel", "v/kernel", 0.9, ())])
    assert cols.scopes is None and scopes_of(cols)[0][-1] == "u/"


def test_scope_entries_fold_alike_with_scopes_kept_or_computed():
    for seed, names in enumerate(CASES[:120]):
        rng = np.random.default_rng(seed)
        targets = [f"new/{n}" if rng.random() < 0.8 else f"other/{n}" for n in names]
        ms = [Match(t, n, float(rng.random()), ("shape",), "") for t, n in zip(targets, names)]
        cols = _columns(ms)
        scopes_of(cols)
        assert scope_entries(cols, names, targets) == scope_entries(ms, names, targets)
    assert scope_entries([], ["a/b"], ["c/d"]) == []
