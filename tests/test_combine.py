"""cm.combine: checkpoint arithmetic as a source, on real files (TF bundles written by
ckptmerge's writer, safetensors, Keras weights files), merged to every output format and
restored into live models."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import ckptmerge as cm
from ckptmerge.core.errors import ArgumentError, CheckpointFormatError, CombineError
from ckptmerge.formats.tf.writer import BundleWriter
from ckptmerge.combining.methods import combine_arrays, ema_weights

REPO = Path(__file__).resolve().parents[1]
STEPS = (100, 200, 300, 400, 500)


def values(step: int) -> dict:
    rng = np.random.default_rng(step)
    return {
        "dense/kernel": rng.standard_normal((64, 33)).astype(np.float32),
        "dense/bias": rng.standard_normal(33).astype(np.float32),
        "emb/embeddings": rng.standard_normal((300, 40)).astype(np.float16),
        "counter": np.array(step // 100, np.int64),
        "global_step": np.array(step, np.int64),
        "dense/kernel/.OPTIMIZER_SLOT/optimizer/m/.ATTRIBUTES/VARIABLE_VALUE": np.full((64, 33), step, np.float32),
    }


def write(prefix: Path, vals: dict) -> str:
    with BundleWriter(str(prefix)) as w:
        for k, v in vals.items():
            w.add(k, v)
    return str(prefix)


def write_run(d: Path) -> Path:
    """A training directory: one checkpoint per step of STEPS."""
    for s in STEPS:
        write(d / f"ckpt-{s}", values(s))
    return d


@pytest.fixture
def run(tmp_path):
    return write_run(tmp_path / "run")


def mean_of(steps, name, dtype=None):
    arr = np.mean([values(s)[name].astype(np.float64) for s in steps], axis=0)
    return arr.astype(dtype or values(steps[0])[name].dtype)


# -- inputs -----------------------------------------------------------------------------------


def test_average_of_the_last_n_checkpoints_of_a_run_equals_numpy(run, tmp_path):
    avg = cm.combine(str(run), last=3)
    report = avg.report()
    assert [d["label"] for d in report.inputs] == ["ckpt-300", "ckpt-400", "ckpt-500"]
    assert [d["step"] for d in report.inputs] == [300, 400, 500]
    assert all(d["path"] == str(run / f"ckpt-{s}") for d, s in zip(report.inputs, (300, 400, 500)))
    cm.merge(avg, str(tmp_path / "avg"))
    got = cm.load(str(tmp_path / "avg"))
    for name in ("dense/kernel", "dense/bias", "emb/embeddings"):
        np.testing.assert_array_equal(got[name], mean_of((300, 400, 500), name))
        assert got[name].dtype == values(100)[name].dtype  # the inputs' dtype is kept
    assert got["counter"] == 5  # integers="last"


def test_selection_by_steps_and_every(run):
    assert [d["step"] for d in cm.combine(str(run), steps=range(200, 401)).report().inputs] == [200, 300, 400]
    assert [d["step"] for d in cm.combine(str(run), steps=(None, 200)).report().inputs] == [100, 200]
    assert [d["step"] for d in cm.combine(str(run), steps=[100, 500]).report().inputs] == [100, 500]
    assert [d["step"] for d in cm.combine(str(run), every=200).report().inputs] == [200, 400]
    assert [d["step"] for d in cm.combine(str(run), every=100, last=2).report().inputs] == [400, 500]
    with pytest.raises(CombineError, match="fewer than last=9"):
        cm.combine(str(run), last=9)
    with pytest.raises(CombineError, match="no checkpoint of step 150"):
        cm.combine(str(run), steps=[150])
    with pytest.raises(ArgumentError, match="one training directory"):
        cm.combine([str(run / "ckpt-100")], last=1)


def test_inputs_may_be_paths_and_sources_with_their_own_rules(run, tmp_path):
    other = write(tmp_path / "renamed", {("enc/" + k if k.startswith("dense") else k): v for k, v in values(200).items()})
    first = cm.Source(str(run / "ckpt-100"), include="dense/*")
    avg = cm.combine([first, cm.Source(other, map={"enc/": "/"}, name="renamed")], exclude="*/bias")
    report = avg.report()
    assert [d["label"] for d in report.inputs] == [str(run / "ckpt-100"), "renamed"]
    out = cm.merge(avg, str(tmp_path / "o"))
    assert out.restored == ["dense/kernel"]  # each input's rules, then combine's own exclude
    np.testing.assert_array_equal(cm.load(str(tmp_path / "o"), ["dense/kernel"])["dense/kernel"],
                                  mean_of((100, 200), "dense/kernel"))


def test_urls_work_as_inputs(run):
    import fsspec

    fs = fsspec.filesystem("memory")
    url = f"memory://combine-run-{os.getpid()}"
    for f in run.iterdir():
        fs.pipe(f"{url}/{f.name}", f.read_bytes())
    try:
        avg = cm.combine(url, last=2)
        got = avg.open().read(["dense/kernel"])["dense/kernel"]
        np.testing.assert_array_equal(got, mean_of((400, 500), "dense/kernel"))
    finally:
        fs.rm(url, recursive=True)


# -- key sets and policies --------------------------------------------------------------------


@pytest.fixture
def uneven(tmp_path):
    a = values(100)
    b = dict(values(200))
    del b["dense/bias"]
    b["emb/embeddings"] = b["emb/embeddings"].astype(np.float32)  # dtype differs
    c = dict(values(300))
    c["dense/kernel"] = c["dense/kernel"][:10]  # shape differs
    c["extra"] = np.ones(3, np.float32)
    return [write(tmp_path / n, v) for n, v in (("a", a), ("b", b), ("c", c))]


def test_strict_keys_raise_one_error_listing_every_difference(uneven):
    with pytest.raises(CombineError) as e:
        cm.combine(uneven).report()
    msg = str(e.value)
    assert len(e.value.differences) == 4
    assert "'dense/bias' is missing from" in msg and "'extra' is missing from" in msg
    assert "'dense/kernel' differs: float32 (64, 33)" in msg and "'emb/embeddings' differs" in msg
    assert "keys='intersection'" in msg


def test_intersection_and_union_report_what_they_did(uneven, tmp_path):
    inter = cm.combine(uneven, keys="intersection").report()
    assert dict(inter.left_out)["dense/bias"] == "in 2 of 3 inputs (keys='intersection')"
    assert "shapes or dtypes differ" in dict(inter.left_out)["dense/kernel"]
    union = cm.combine(uneven, keys="union")
    rep = union.report()
    assert ("dense/bias", 2, 3) in rep.fewer and ("extra", 1, 3) in rep.fewer
    assert rep.dtypes[0][0] == "emb/embeddings" and rep.dtypes[0][1] == "float16"
    assert "Combined over fewer inputs (2)" in rep.render()
    h = union.open()
    try:
        got = h.read(["dense/bias", "extra"])
        assert not h.findings  # the chosen policy, not a finding: a strict merge writes (issue 30.9)
    finally:
        h.close()
    np.testing.assert_array_equal(got["dense/bias"], mean_of((100, 300), "dense/bias"))
    np.testing.assert_array_equal(got["extra"], np.ones(3, np.float32))
    for keys in ("union", "intersection"):
        cm.merge(cm.combine(uneven, keys=keys), str(tmp_path / f"{keys}.safetensors"))
        written = set(cm.load(str(tmp_path / f"{keys}.safetensors")))
        assert ({"extra", "dense/bias"} <= written) if keys == "union" else not ({"extra", "dense/bias"} & written)


def test_union_and_intersection_merge_through_the_api_without_strict_false(uneven, tmp_path):
    """cm.merge of a union or an intersection writes as it is (issue 34 item 5): the merge's
    report marks each name combined over fewer inputs, and the combine report lists each one
    and each name left out."""
    src = cm.combine(uneven, keys="union")
    rep = cm.merge(src, str(tmp_path / "u.safetensors"))
    text = rep.render()
    assert "[combined over 2 of 3 inputs (keys='union')]" in text and "[combined over 1 of 3 inputs" in text
    assert rep.to_dict()["plan"]["assignments"]["extra"]["via"] == "combined over 1 of 3 inputs (keys='union')"
    assert [n for n, _, _ in src.report().fewer] == ["dense/bias", "extra"]
    src = cm.combine(uneven, keys="intersection")
    rep = cm.merge(src, str(tmp_path / "i.safetensors"))
    assert "combined over" not in rep.render()
    assert {"dense/bias", "extra"} <= set(dict(src.report().left_out))
    assert not {"dense/bias", "extra"} & set(cm.load(str(tmp_path / "i.safetensors")))


def test_integers_policy_first_last_error(run):
    first = cm.combine(str(run), last=2, integers="first").open()
    try:
        assert first.read(["counter"])["counter"] == 4
        assert ("counter", "first", "ckpt-400") in first.report.copied
    finally:
        first.close()
    with pytest.raises(CombineError, match="integer or bool tensor.*'counter'.*integers='last'"):
        cm.combine(str(run), last=2, integers="error").report()


def test_optimizer_slots_are_left_out_unless_asked(run):
    names = [v.name for v in cm.combine(str(run), last=2).open().all_variables]
    assert "global_step" not in names and not any("OPTIMIZER_SLOT" in n for n in names)
    assert cm.combine(str(run), last=2).report().optimizer_left_out == 2
    h = cm.combine(str(run), last=2, optimizer=True).open()
    try:
        slot = "dense/kernel/.OPTIMIZER_SLOT/optimizer/m/.ATTRIBUTES/VARIABLE_VALUE"
        assert h.read([slot])[slot][0, 0] == 450.0
        assert h.read(["global_step"])["global_step"] == 500
    finally:
        h.close()


def test_dtype_option_and_float32_accumulation(run, tmp_path):
    h = cm.combine(str(run), last=2, dtype="float32").open()
    try:
        emb = h.read(["emb/embeddings"])["emb/embeddings"]
    finally:
        h.close()
    assert emb.dtype == np.float32
    np.testing.assert_array_equal(emb, mean_of((400, 500), "emb/embeddings", np.float32))
    h = cm.combine(str(run), last=2, accumulate="float32").open()
    try:
        assert "accumulate float32" in h.report.render()
        np.testing.assert_array_equal(h.read(["emb/embeddings"])["emb/embeddings"],
                                      mean_of((400, 500), "emb/embeddings"))
    finally:
        h.close()


# -- methods through files --------------------------------------------------------------------


def test_every_method_streams_to_the_same_result_as_the_whole_arrays(run, tmp_path):
    base = str(run / "ckpt-100")
    fts = [str(run / f"ckpt-{s}") for s in (200, 300, 400)]
    xs = [values(s)["dense/kernel"] for s in (200, 300, 400)]
    b = values(100)["dense/kernel"]
    cases = [
        ("mean", dict(weights=[1, 2, 3]), dict(weights=[1, 2, 3])),
        ("ema", dict(decay=0.9), None),
        ("task_arithmetic", dict(base=base, weights=[0.5, 0.3, 0.2]), dict(weights=[0.5, 0.3, 0.2])),
        ("ties", dict(base=base, density=0.3), dict(density=0.3)),
        ("dare", dict(base=base, density=0.4, seed=1), dict(density=0.4, seed=1)),
        ("model_stock", dict(base=base), {}),
    ]
    for method, opts, ref_opts in cases:
        src = cm.combine(fts, method, chunk_elements=500, **opts)
        h = src.open()
        try:
            got = h.read(["dense/kernel"])["dense/kernel"]
        finally:
            h.close()
        if method == "ema":
            ref = sum(w * x.astype(np.float64) for w, x in zip(ema_weights(3, 0.9), xs))
        else:
            ref = combine_arrays(method, xs, b if "base" in opts else None, name="dense/kernel", **ref_opts)
        np.testing.assert_array_equal(got, ref.astype(np.float32), err_msg=method)
    got = cm.combine(fts[:2], "slerp", t=0.3).open().read(["dense/kernel"])["dense/kernel"]
    np.testing.assert_array_equal(got, combine_arrays("slerp", xs[:2], t=0.3).astype(np.float32))


def test_ema_orders_inputs_by_step(run):
    src = cm.combine([str(run / "ckpt-300"), str(run / "ckpt-100"), str(run / "ckpt-200")], "ema", decay=0.5)
    rep = src.report()
    assert [d["step"] for d in rep.inputs] == [100, 200, 300] and rep.options["order"] == "by step"


def test_parameters_per_tensor_by_glob(run):
    src = cm.combine([str(run / f"ckpt-{s}") for s in (200, 300)], "ties", base=str(run / "ckpt-100"),
                     density={"dense/*": 0.2, "*": 0.9})
    rep = src.report()
    fams = {p: names for p, n, names in rep.families}
    assert any("density=0.2" in p and "density by 'dense/*'" in p for p in fams)
    assert any("density=0.9" in p and "emb/embeddings" in names for p, names in fams.items())
    h = src.open()
    try:
        got = h.read(["dense/bias"])["dense/bias"]
    finally:
        h.close()
    want = combine_arrays("ties", [values(s)["dense/bias"] for s in (200, 300)], values(100)["dense/bias"], density=0.2)
    np.testing.assert_array_equal(got, want.astype(np.float32))


def test_argument_errors_say_what_to_do(run):
    paths = [str(run / "ckpt-100"), str(run / "ckpt-200")]
    with pytest.raises(ArgumentError, match="Did you mean 'mean'"):
        cm.combine(paths, "meen")
    with pytest.raises(ArgumentError, match="takes the parameters 'density'.*received 'denisty'"):
        cm.combine(paths, "ties", base=paths[0], denisty=0.3)
    with pytest.raises(ArgumentError, match="needs base="):
        cm.combine(paths, "ties")
    with pytest.raises(ArgumentError, match="weights has 1 entries for 2 inputs"):
        cm.combine(paths, weights=[1])
    with pytest.raises(ArgumentError, match="exactly 2 inputs"):
        cm.combine(paths + [str(run / "ckpt-300")], "slerp")
    with pytest.raises(ArgumentError, match=r"density\['\*'\] must be a number in \(0, 1\]; received 2.0"):
        cm.combine(paths, "ties", base=str(run / "ckpt-300"), density={"*": 2.0})  # refused before anything opens


# -- the report ---------------------------------------------------------------------------------


def test_report_text_dict_and_html_escape_names(tmp_path):
    a = write(tmp_path / "a", {"w<script>\n": np.ones(2, np.float32)})
    b = write(tmp_path / "b", {"w<script>\n": np.zeros(2, np.float32)})
    rep = cm.combine([a, b]).report()
    assert "\\n" in rep.render() and "\n'" not in rep.render().split("Parameters")[1]
    d = rep.to_dict()
    assert d["method"] == "mean" and d["tensors"] == 1 and d["inputs"][1]["path"] == b
    assert "<script>" not in rep.to_html() and "&lt;script&gt;" in rep.to_html()


# -- outputs and live models ------------------------------------------------------------------


def test_merge_writes_safetensors_and_dry_runs(run, tmp_path):
    avg = cm.combine(str(run), last=2)
    dry = cm.merge(avg, str(tmp_path / "m.safetensors"), dry_run=True)
    assert dry.dry_run and not (tmp_path / "m.safetensors").exists()
    cm.merge(avg, str(tmp_path / "m.safetensors"))
    from safetensors.numpy import load_file

    got = load_file(str(tmp_path / "m.safetensors"))
    np.testing.assert_array_equal(got["dense/kernel"], mean_of((400, 500), "dense/kernel"))


def test_a_merge_refuses_to_write_over_one_of_the_inputs(run):
    with pytest.raises(ArgumentError, match="input 'ckpt-500' of source 'mean of 2'"):
        cm.merge(cm.combine(str(run), last=2), str(run / "ckpt-500"), overwrite=True)
    assert cm.load(str(run / "ckpt-500"))["counter"] == 5


def test_a_failed_combination_leaves_no_output(run, tmp_path):
    bad = tmp_path / "bad"
    for f in (run / "ckpt-500").parent.glob("ckpt-500*"):
        (bad.parent / ("bad" + f.name[len("ckpt-500"):])).write_bytes(f.read_bytes())
    data = tmp_path / "bad.data-00000-of-00001"
    raw = bytearray(data.read_bytes())
    raw[100] ^= 0xFF
    data.write_bytes(bytes(raw))
    avg = cm.combine([str(run / "ckpt-400"), str(bad)])
    entries = cm.combine([str(run / "ckpt-400"), str(bad)], regex=[(r"(.*)", r"layers/\1/vars/0")])  # (Keras entries)
    for out in ("o", "o.safetensors", "o.weights.h5"):
        with pytest.raises(CheckpointFormatError, match="[Cc]hecksum"):
            cm.merge(entries if out.endswith(".h5") else avg, str(tmp_path / out))
        assert not list(tmp_path.glob(out + "*")) and not list(tmp_path.glob("." + out + "*"))


def test_restore_into_a_live_model_and_restorer(run, tf):
    m = tf.Module()
    m.kernel = tf.Variable(tf.zeros((64, 33)), name="kernel")
    m.bias = tf.Variable(tf.zeros(33), name="bias")
    avg = cm.combine(str(run), last=2, map={"dense/": "model/"}, include="dense/*")
    plan = cm.plan({"model/kernel": m.kernel, "model/bias": m.bias}, [avg])
    assert not plan.missing and "mean of 2" in plan.report()
    plan.restore()
    plan._binding.close()
    np.testing.assert_array_equal(m.kernel.numpy(), mean_of((400, 500), "dense/kernel"))
    r = cm.Restorer({"model/kernel": m.kernel, "model/bias": m.bias}, [avg])
    m.bias.assign(tf.zeros(33))
    r.restore()
    np.testing.assert_array_equal(m.bias.numpy(), mean_of((400, 500), "dense/bias"))
    r.close()


def test_keras_weights_files_combine_into_a_file_keras_loads_and_into_a_live_model(tf, tmp_path):
    import keras

    def build():
        return keras.Sequential([keras.Input((5,)), keras.layers.Dense(4), keras.layers.Dense(3, dtype="bfloat16")])

    paths = []
    for i in range(3):
        m = build()
        for w in m.weights:
            w.assign(np.random.default_rng(i).normal(size=w.shape))
        paths.append(str(tmp_path / f"m{i}.weights.h5"))
        m.save_weights(paths[-1])
    refs = []
    for p in paths:
        m = build()
        m.load_weights(p)
        refs.append([np.asarray(w.numpy(), np.float64) for w in m.weights])
    avg = cm.combine(paths)
    cm.merge(avg, str(tmp_path / "avg.weights.h5"))
    loaded = build()
    loaded.load_weights(str(tmp_path / "avg.weights.h5"))
    live = build()
    cm.restore(live, [avg])
    for a, b, *ws in zip(loaded.weights, live.weights, *refs):
        want = np.mean(ws, axis=0).astype(a.dtype)
        assert np.array_equal(np.asarray(a.numpy()), want), a.path
        assert np.array_equal(np.asarray(b.numpy()), want), b.path
    assert [str(w.dtype) for w in loaded.weights] == ["float32", "float32", "bfloat16", "bfloat16"]


def test_combining_and_merging_import_no_tensorflow(run, tmp_path):
    code = (f"import sys, ckptmerge as cm\n"
            f"cm.merge(cm.combine(r'{run}', 'ties', base=r'{run}/ckpt-100', last=3), r'{tmp_path}/t.safetensors')\n"
            f"cm.merge(cm.combine(r'{run}', last=3), r'{tmp_path}/t')\n"
            "assert 'tensorflow' not in sys.modules and 'torch' not in sys.modules\nprint('ok')")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=str(REPO),
                         env={**os.environ, "PYTHONPATH": str(REPO)}, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-2000:]
