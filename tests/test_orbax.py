"""Orbax checkpoints read without JAX: every layout orbax-checkpoint writes, against Orbax's own
restore, bit for bit; CheckpointManager roots; damaged and hostile stores; URLs; the writer.

Checkpoints are written in the test by orbax-checkpoint (and so JAX); every read goes through
``no_jax_from_ckptmerge``, which fails the test if ckptmerge's code imports JAX, Flax or Orbax.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import urllib.request
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("tensorstore", reason="the Orbax reader needs tensorstore (pip install 'ckptmerge[orbax]')")
pytest.importorskip("orbax.checkpoint", reason="the Orbax tests write checkpoints with orbax-checkpoint")

from _cli_util import IN_PROCESS_CLI  # noqa: E402
from _orbax_util import (LAYOUTS, copy_tree_to_memory, no_jax_from_ckptmerge, orbax_restore,  # noqa: E402,F401
                         refuse_jax_from_ckptmerge, sample_tree, write_orbax)

from ckptmerge.core.errors import (ArgumentError, CheckpointFormatError, CheckpointNotFoundError,  # noqa: E402
                              OutputExistsError, UnsafeCheckpointError)
from ckptmerge.formats import open_checkpoint  # noqa: E402
from ckptmerge.formats.orbax.layout import is_orbax, orbax_steps  # noqa: E402
from ckptmerge.formats.orbax.reader import OrbaxReader  # noqa: E402
from ckptmerge.formats.orbax.writer import OrbaxWriter  # noqa: E402

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    """One checkpoint of the sample tree per layout."""
    base = tmp_path_factory.mktemp("orbax")
    return {layout: write_orbax(base / layout.replace("+", "_"), sample_tree(), layout) for layout in LAYOUTS}


def _same(a: np.ndarray, b: np.ndarray) -> bool:
    if a.dtype == object or b.dtype == object:
        return a.shape == b.shape and a.tolist() == b.tolist()
    if a.ndim == 0 and b.ndim == 0 and a.dtype != b.dtype:  # Orbax restores V0 scalars as Python numbers
        return a.item() == b.item()
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


# -- reading every layout ---------------------------------------------------------------------


@pytest.mark.parametrize("layout", LAYOUTS)
def test_every_layout_reads_every_array_as_orbax_restores_it_bit_for_bit(written, layout):
    with no_jax_from_ckptmerge():
        ref = orbax_restore(written[layout])
    with open_checkpoint(str(written[layout])) as r:
        assert isinstance(r, OrbaxReader) and list(r.items.values()) == [layout]
        assert sorted(r.names()) == sorted(ref)
        for name, want in ref.items():
            got = r.get(name)
            assert _same(got, want), name
            assert got.flags.c_contiguous and got.flags.writeable
        typed = {n: r.info(n).dtype for n in r.names() if n.startswith("params/typed/")}
    assert typed["params/typed/bfloat16"] == "bfloat16" and typed["params/typed/int4"] == "int4"
    assert {"float8_e4m3fn", "float8_e5m2", "float4_e2m1fn", "int2", "complex128", "bool"} <= set(typed.values())


def test_names_are_tree_paths_with_optimizer_state_and_step_recognised(written):
    with OrbaxReader(str(written["ocdbt+zarr"])) as r:
        kinds = {v.name: v.kind for v in r.variables()}
        assert kinds["params/Dense_0/kernel"] == "variable" and kinds["params/layers/1"] == "variable"
        assert kinds["opt_state/0/mu/Dense_0/kernel"] == "optimizer" and kinds["step"] == "bookkeeping"
        assert "opt_state/0/mu/Dense_0/kernel" not in r.names(optimizer=False)
        assert r.info("params/Conv_0/kernel").shape == (3, 3, 2, 4)
        assert r.info("name").dtype == "string" and r.get("name").item() == b"run-1"


@pytest.mark.parametrize("layout", ["ocdbt+zarr3", "zarr"])
def test_iter_chunks_and_read_many_equal_get(written, layout):
    with OrbaxReader(str(written[layout])) as r:
        names = r.names()
        many = r.read_many(names)
        for n in names:
            whole = r.get(n)
            assert _same(many[n], whole)
            if whole.dtype != object and whole.size:
                pieces = list(r.iter_chunks(n, 2))
                assert all(p.size <= 2 for p in pieces)
                assert np.concatenate(pieces).tobytes() == whole.reshape(-1).tobytes()


def test_iter_chunks_reads_one_stored_chunk_row_at_a_time(tmp_path):
    import tracemalloc

    import ckptmerge.formats.orbax.writer as writer_module

    big = np.arange(512 * 1024, dtype=np.float32).reshape(512, 1024)  # 2 MiB, chunks of 64 KiB
    old = writer_module.CHUNK_BYTES
    writer_module.CHUNK_BYTES = 64 << 10
    try:
        with OrbaxWriter(tmp_path / "out", [("big", "float32", big.shape)]) as w:
            w.add("big", big)
    finally:
        writer_module.CHUNK_BYTES = old
    with OrbaxReader(str(tmp_path / "out")) as r:
        tracemalloc.start()
        total = 0.0
        for piece in r.iter_chunks("big", 4096):
            total += float(piece.sum(dtype=np.float64))
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    assert total == float(big.sum(dtype=np.float64))
    assert peak < 512 << 10, peak  # two 64 KiB blocks and change, not the 2 MiB tensor


def test_a_checkpoint_manager_root_lists_finalised_steps_only(tmp_path):
    import orbax.checkpoint as ocp

    root = tmp_path / "run"
    mgr = ocp.CheckpointManager(str(root), options=ocp.CheckpointManagerOptions(max_to_keep=5))
    for step in (10, 20):
        mgr.save(step, args=ocp.args.Composite(state=ocp.args.PyTreeSave({"w": np.full(3, step, np.float32)}),
                                               extra=ocp.args.JsonSave({"note": step})))
    mgr.wait_until_finished()
    mgr.close()
    shutil.copytree(root / "20", root / "30.orbax-checkpoint-tmp-1234")  # a save still under way
    (root / "40").mkdir()  # a folder that is no checkpoint
    assert is_orbax(str(root / "10")) and not is_orbax(str(root))
    assert [(s.step, os.path.basename(s.path)) for s in orbax_steps(str(root))] == [(10, "10"), (20, "20")]
    with OrbaxReader(str(root / "20")) as r:  # several items: the item's name comes first
        assert r.items == {"extra": "json", "state": "ocdbt+zarr"}
        assert r.names() == ["state/w"]
        np.testing.assert_array_equal(r.get("state/w"), np.full(3, 20, np.float32))
    with pytest.raises(CheckpointFormatError, match="holds no Orbax item.*pass step=N"):
        OrbaxReader(str(root))


def test_a_gcs_step_without_its_commit_file_does_not_count(tmp_path):
    import fsspec
    from fsspec.implementations.memory import MemoryFileSystem
    from fsspec.registry import _registry

    class FakeGCS(MemoryFileSystem):  # fsspec's memory filesystem, served under gs://
        protocol = ("gs", "gcs")
        store: dict = {}
        pseudo_dirs = [""]

    step = write_orbax(tmp_path / "5", {"w": np.ones(2, np.float32)}, "ocdbt+zarr")
    fsspec.register_implementation("gs", FakeGCS, clobber=True)
    try:
        fs = FakeGCS()
        for n in (5, 6):  # step 6 lacks commit_success.txt: Orbax on GCS has not finished it
            for dirpath, _, files in os.walk(step):
                for f in files:
                    p = Path(dirpath) / f
                    rel = p.relative_to(step).as_posix()
                    if not (n == 6 and rel == "commit_success.txt"):
                        fs.pipe(f"gs://bucket/run/{n}/{rel}", p.read_bytes())
        assert [s.step for s in orbax_steps("gs://bucket/run")] == [5]
    finally:
        _registry.pop("gs", None)


# -- damaged and hostile checkpoints -------------------------------------------------------------


def _copy(written, layout, tmp_path) -> Path:
    dst = tmp_path / "copy"
    shutil.copytree(written[layout], dst)
    return dst


def test_metadata_that_is_not_json_is_a_clear_error(written, tmp_path):
    p = _copy(written, "ocdbt+zarr", tmp_path)
    (p / "_METADATA").write_text("{not json")
    with pytest.raises(CheckpointFormatError, match=r"_METADATA.* is not valid JSON.*damaged"):
        OrbaxReader(str(p))


def test_a_param_name_leading_outside_the_checkpoint_is_refused(written, tmp_path):
    p = _copy(written, "zarr", tmp_path)
    meta = json.loads((p / "_METADATA").read_text())
    entry = meta["tree_metadata"].pop("('params', 'Dense_0', 'bias')")
    meta["tree_metadata"]["evil"] = entry
    for keys in (["../../etc"], ["params", "a/../../../x"], ["/abs"]):
        entry["key_metadata"] = [{"key": k, "key_type": 2} for k in keys]
        (p / "_METADATA").write_text(json.dumps(meta))
        with pytest.raises(UnsafeCheckpointError, match="would lead outside the checkpoint folder"):
            OrbaxReader(str(p))


def test_a_symbolic_link_inside_the_checkpoint_is_refused(written, tmp_path):
    p = _copy(written, "zarr", tmp_path)
    outside = tmp_path / "outside"
    shutil.move(str(p / "params.Dense_0.kernel"), outside)
    os.symlink(outside, p / "params.Dense_0.kernel")
    with pytest.raises(UnsafeCheckpointError, match="symbolic link"):
        OrbaxReader(str(p))


def test_an_array_declaring_more_data_than_its_files_hold_is_refused(written, tmp_path):
    p = _copy(written, "zarr", tmp_path)
    zarray = p / "params.Dense_0.kernel" / ".zarray"
    meta = json.loads(zarray.read_text())
    meta["shape"] = meta["chunks"] = [1 << 20, 1 << 20]
    zarray.write_text(json.dumps(meta))
    with pytest.raises(UnsafeCheckpointError, match=r"declares shape \(1048576, 1048576\).*more than its stored"):
        OrbaxReader(str(p))


def test_a_missing_chunk_is_an_error_never_zeros(written, tmp_path):
    p = _copy(written, "zarr", tmp_path)
    for f in (p / "params.Conv_0.kernel").iterdir():
        if f.name != ".zarray":
            f.unlink()
    with OrbaxReader(str(p)) as r:
        with pytest.raises(CheckpointFormatError, match=r"params\.Conv_0\.kernel"):
            r.get("params/Conv_0/kernel")
        assert r.get("params/Dense_0/kernel").shape == (4, 3)  # the others still read


@pytest.mark.parametrize("layout", ["zarr", "msgpack"])
def test_without_the_all_chunks_stored_flag_a_missing_chunk_reads_as_orbax_restores_it(written, tmp_path, layout):
    p = _copy(written, layout, tmp_path)
    if layout == "zarr":  # an older Orbax: chunks equal to the fill value were left out
        meta = json.loads((p / "_METADATA").read_text())
        meta.pop("store_array_data_equal_to_fill_value")
        (p / "_METADATA").write_text(json.dumps(meta))
    for f in (p / "params.Conv_0.kernel").iterdir():
        if f.name != ".zarray":
            f.unlink()
    with no_jax_from_ckptmerge():
        want = orbax_restore(p)["params/Conv_0/kernel"]
    assert not want.any()
    with OrbaxReader(str(p)) as r:
        assert _same(r.get("params/Conv_0/kernel"), want)


def test_an_array_of_zeros_is_stored_by_the_writer_and_reads_back(tmp_path):
    values = {"zeros": np.zeros((3, 4), np.float32), "ones": np.ones(5, np.int8)}
    with OrbaxWriter(tmp_path / "out", [(k, v.dtype.name, v.shape) for k, v in values.items()]) as w:
        for k, v in values.items():
            w.add(k, v)
    with OrbaxReader(str(tmp_path / "out")) as r:
        for k, v in values.items():
            assert _same(r.get(k), v)


def test_corrupt_chunk_bytes_and_a_damaged_ocdbt_store_are_clear_errors(written, tmp_path):
    p = _copy(written, "zarr", tmp_path)
    chunk = next(f for f in (p / "params.Dense_0.kernel").iterdir() if f.name != ".zarray")
    chunk.write_bytes(b"\x00garbage" * 3)
    with OrbaxReader(str(p)) as r, pytest.raises(CheckpointFormatError, match="Cannot read Orbax checkpoint"):
        r.get("params/Dense_0/kernel")
    q = tmp_path / "ocdbt"
    shutil.copytree(written["ocdbt+zarr3"], q)
    for data in (q / "state" / "d").iterdir():
        data.write_bytes(data.read_bytes()[:20])
    for data in (q / "state" / "ocdbt.process_0" / "d").iterdir():
        data.write_bytes(data.read_bytes()[:20])
    with pytest.raises(CheckpointFormatError, match="Cannot read Orbax checkpoint"):
        with OrbaxReader(str(q)) as r:
            r.read_many(r.names())


def test_a_codec_orbax_never_writes_is_refused(written, tmp_path):
    p = _copy(written, "zarr", tmp_path)
    zarray = p / "params.Dense_0.bias" / ".zarray"
    if not zarray.exists():  # (the bias is small: still its own folder in this layout)
        pytest.skip("layout keeps the bias elsewhere")
    meta = json.loads(zarray.read_text())
    meta["compressor"] = {"id": "bz2", "level": 9}
    zarray.write_text(json.dumps(meta))
    with pytest.raises(CheckpointFormatError, match="uses compressor .*bz2"):
        OrbaxReader(str(p))


def test_a_truncated_msgpack_aggregate_is_a_clear_error(written, tmp_path):
    p = _copy(written, "msgpack", tmp_path)
    data = (p / "checkpoint").read_bytes()
    (p / "checkpoint").write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointFormatError, match="not a valid msgpack checkpoint"):
        OrbaxReader(str(p))


def test_an_inline_array_whose_bytes_do_not_fit_its_shape_is_refused(tmp_path):
    import msgpack

    packed = msgpack.packb(((1000, 1000), "float32", b"\x00" * 16), use_bin_type=True)
    (tmp_path / "checkpoint").write_bytes(msgpack.packb({"w": msgpack.ExtType(1, packed)}, use_bin_type=True))
    with pytest.raises(CheckpointFormatError, match=r"has 16 bytes, needs 4000000"):
        OrbaxReader(str(tmp_path))


def test_an_overflowing_shape_in_a_msgpack_aggregate_is_refused_by_the_shared_check(tmp_path):
    import msgpack

    packed = msgpack.packb(((0, 2 ** 61, 2 ** 61), "float32", b""), use_bin_type=True)
    (tmp_path / "checkpoint").write_bytes(msgpack.packb({"w": msgpack.ExtType(1, packed)}, use_bin_type=True))
    with pytest.raises(CheckpointFormatError, match=r"too large for any array"):
        OrbaxReader(str(tmp_path))


def test_a_missing_folder_is_checkpoint_not_found(tmp_path):
    with pytest.raises(CheckpointNotFoundError, match="does not exist"):
        OrbaxReader(str(tmp_path / "nope"))


_NO_JAX_DRIVER = """
import json, sys
for m in ('jax', 'jaxlib', 'flax', 'orbax', 'torch'):
    sys.modules[m] = None  # an import of any of them fails
""" + IN_PROCESS_CLI + """
paths = json.loads(sys.argv[1])
listed = {layout: cli('ls', path, '--all', '--json') for layout, path in paths.items()}
diff = cli('diff', paths['ocdbt+zarr3'], paths['zarr3'])
names_only = sorted(m for m, mod in sys.modules.items() if mod is not None
                    and m.split('.')[0] in ('tensorstore', 'ml_dtypes', 'tensorflow', 'keras', 'jax', 'torch'))
sys.modules['tensorstore'] = None  # reading values needs it: the hint names the extra
no_ts = cli('show', paths['ocdbt+zarr3'], 'params/Dense_0/kernel')
del sys.modules['tensorstore']
show = cli('show', paths['ocdbt+zarr3'], 'params/Dense_0/kernel')
heavy = sorted(m for m, mod in sys.modules.items() if mod is not None
               and m.split('.')[0] in ('tensorflow', 'keras', 'jax', 'jaxlib', 'flax', 'orbax', 'torch'))
print(json.dumps({'listed': listed, 'diff': diff, 'names_only': names_only[:5], 'no_ts': no_ts, 'show': show,
                  'heavy': heavy[:5]}))
"""


def test_ls_and_diff_need_neither_tensorstore_nor_ml_dtypes_and_list_what_orbax_restores(written):
    # One fresh interpreter where JAX, Flax, Orbax and torch cannot be imported: 'ls' of every
    # layout and 'diff' read only Orbax's JSON and the OCDBT index, so tensorstore, ml_dtypes
    # (bfloat16 and float8 are names), TensorFlow and JAX stay unimported, and each listing
    # equals what Orbax restores; 'show' reads values: without tensorstore it fails in one line
    # naming the [orbax] extra, with it it prints them.
    paths = {layout: str(p) for layout, p in written.items()}
    out = subprocess.run([sys.executable, "-c", _NO_JAX_DRIVER, json.dumps(paths)], capture_output=True,
                         text=True, cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)}, timeout=180)
    assert out.returncode == 0, out.stderr[-3000:]
    found = json.loads(out.stdout.splitlines()[-1])
    assert found["names_only"] == []
    for layout, (code, listing, err) in found["listed"].items():
        assert code == 0, err
        with no_jax_from_ckptmerge():
            ref = orbax_restore(written[layout])
        got = {v["name"]: (v["dtype"], tuple(v["shape"])) for v in json.loads(listing)}
        assert sorted(got) == sorted(ref), layout
        for name, want in ref.items():
            dtype = "string" if want.dtype == object else want.dtype.name
            if want.ndim or got[name][0] == dtype:  # (V0 restores a scalar as a Python number: int64)
                assert got[name] == (dtype, want.shape), (layout, name)
    assert found["diff"][0] == 0 and "same names, dtypes, shapes" in found["diff"][1], found["diff"]
    code, _, err = found["no_ts"]
    assert code == 2 and 'pip install "ckptmerge[orbax]"' in err and len(err.strip().splitlines()) == 1, err
    show_code, show_out, _ = found["show"]
    assert show_code == 0 and re.match(r"params/Dense_0/kernel +float32 +\(4, 3\)", show_out), show_out
    assert found["heavy"] == []


# -- URLs through fsspec ----------------------------------------------------------------------


@pytest.fixture
def memory_copy(written):
    import fsspec

    url = f"memory://orbax-{os.getpid()}"
    for layout, path in written.items():
        copy_tree_to_memory(path, f"{url}/{layout.replace('+', '_')}")
    yield url
    fsspec.filesystem("memory").rm(url, recursive=True)


@pytest.mark.parametrize("layout", ["ocdbt+zarr3", "zarr", "msgpack"])
def test_a_memory_url_reads_as_the_local_folder(written, memory_copy, layout):
    url = f"{memory_copy}/{layout.replace('+', '_')}"
    assert is_orbax(url)
    with OrbaxReader(str(written[layout])) as local, open_checkpoint(url) as remote:
        assert remote.names() == local.names()
        for n in local.names():
            assert _same(remote.get(n), local.get(n)), n
        pieces = list(remote.iter_chunks("params/Conv_0/kernel", 10))
        assert np.concatenate(pieces).tobytes() == local.get("params/Conv_0/kernel").tobytes()


def test_a_remote_read_that_outlasts_the_time_limit_is_a_clear_error(memory_copy, monkeypatch):
    import threading

    import ckptmerge.formats.orbax.store as orbax_store
    from ckptmerge.formats.io import storage

    url = f"{memory_copy}/zarr"
    release, real = threading.Event(), storage.RemoteFile.readinto

    def stalled(self, *args, **kwargs):  # a store that stops answering
        release.wait(30)
        return real(self, *args, **kwargs)

    with open_checkpoint(url) as r:
        monkeypatch.setattr(storage.RemoteFile, "readinto", stalled)
        monkeypatch.setenv(orbax_store.REMOTE_TIMEOUT.name, "0.5")
        try:
            with pytest.raises(CheckpointFormatError, match=r"Timed out after 0\.5 s while (opening|reading) array "
                                                            r".*\(CKPTMERGE_REMOTE_DEADLINE sets the limit\)") as err:
                r.get("params/Dense_0/kernel")
        finally:
            release.set()
    assert url in str(err.value) and "127.0.0.1" not in str(err.value)


def test_a_missing_remote_chunk_names_the_url_not_the_loopback_bridge(memory_copy):
    import fsspec

    url = f"{memory_copy}/zarr"
    fs = fsspec.filesystem("memory")
    for f in fs.ls(f"{url}/params.Conv_0.kernel", detail=False):
        if not f.endswith(".zarray"):
            fs.rm(f)
    with open_checkpoint(url) as r:
        with pytest.raises(CheckpointFormatError) as e:
            r.get("params/Conv_0/kernel")
    assert "127.0.0.1" not in str(e.value) and "memory://" in str(e.value)


def test_the_bridge_serves_nothing_outside_a_registered_checkpoint(memory_copy):
    from ckptmerge.formats.orbax.bridge import bridge

    b = bridge()
    token = b.register(f"{memory_copy}/zarr")
    try:
        base = b.base_url(token)
        assert urllib.request.urlopen(base + "_METADATA", timeout=10).status == 200
        for bad in ("../ocdbt_zarr/_METADATA", "%2e%2e/ocdbt_zarr/_METADATA", "/etc/passwd"):
            with pytest.raises(urllib.error.HTTPError) as e:
                urllib.request.urlopen(base + bad, timeout=10)
            assert e.value.code in (403, 404)
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(base.replace(token, "wrong-token") + "_METADATA", timeout=10)
        assert e.value.code == 403
    finally:
        b.unregister(token)


# -- writing ----------------------------------------------------------------------------------


def _specs(values):
    from ckptmerge.formats.dtypes import dtype_name

    return [(k, dtype_name(v.dtype), v.shape) for k, v in values.items()]


def _values():
    import ml_dtypes

    return {"params/Dense_0/kernel": np.arange(12, dtype=np.float32).reshape(3, 4),
            "params/Dense_0/bias": np.ones(4, ml_dtypes.bfloat16),
            "params/emb": np.arange(40, dtype=np.int64).reshape(4, 10),
            "params/q": np.array([1, -2, 3], ml_dtypes.int4), "step": np.array(9, np.int64),
            "name": np.array(b"merged", dtype=object), "empty": np.zeros((0, 3), np.float32)}


def test_the_written_checkpoint_restores_with_orbax_v1_load_and_v0_checkpointer(tmp_path):
    values = _values()
    out = tmp_path / "out"
    with OrbaxWriter(out, _specs(values), metadata={"ckptmerge": {"sources": ["a"]}}) as w:
        for k, v in values.items():
            if k == "params/emb":
                raw = v.tobytes()
                w.add_raw(k, 9, v.shape, [raw[i:i + 7] for i in range(0, len(raw), 7)])
            else:
                w.add(k, v)
    with no_jax_from_ckptmerge():
        import orbax.checkpoint as ocp
        import orbax.checkpoint.experimental.v1 as ocp1

        v1 = ocp1.load(str(out))
        v0 = ocp.PyTreeCheckpointer().restore(str(out / "pytree"))
    for tree in (v1, v0):
        for k, v in values.items():
            node = tree
            for part in k.split("/"):
                node = node[part]
            assert _same(np.asarray(node if not isinstance(node, str) else node.encode(), dtype=v.dtype), v), k
    with OrbaxReader(str(out)) as r:
        assert sorted(r.names()) == sorted(values)
        for k, v in values.items():
            assert _same(r.get(k), v), k
    meta = json.loads((out / "_CHECKPOINT_METADATA").read_text())
    assert meta["custom_metadata"] == {"ckptmerge": {"sources": ["a"]}}


def test_the_writer_refuses_names_that_do_not_form_a_tree_and_unstorable_dtypes(tmp_path):
    with pytest.raises(ArgumentError, match="also a scope of other tensors"):
        OrbaxWriter(tmp_path / "o", [("a", "float32", (1,)), ("a/b", "float32", (1,))])
    with pytest.raises(ArgumentError, match=r"would both be stored as Orbax array 'a\.b'"):
        OrbaxWriter(tmp_path / "o", [("a.b", "float32", (1,)), ("a/b", "float32", (1,))])
    with pytest.raises(ArgumentError, match="cannot hold 1 of these tensors.*'vocab' .*not a single string"):
        OrbaxWriter(tmp_path / "o", [("vocab", "string", (3,))])
    assert not (tmp_path / "o").exists() and os.listdir(tmp_path) == []


def test_an_existing_output_is_kept_unless_overwrite_and_a_failed_write_leaves_nothing(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep").write_text("old")
    with pytest.raises(OutputExistsError, match="already exists"):
        OrbaxWriter(out, [("w", "float32", (2,))])
    with pytest.raises(RuntimeError):
        with OrbaxWriter(out, [("w", "float32", (2,))], overwrite=True) as w:
            w.add("w", np.ones(2, np.float32))
            raise RuntimeError("killed half-way")
    assert sorted(os.listdir(tmp_path)) == ["out"] and (out / "keep").read_text() == "old"
    with OrbaxWriter(out, [("w", "float32", (2,))], overwrite=True) as w:
        w.add("w", np.full(2, 3, np.float32))
    assert sorted(os.listdir(tmp_path)) == ["out"] and not (out / "keep").exists()
    with OrbaxReader(str(out)) as r:
        np.testing.assert_array_equal(r.get("w"), np.full(2, 3, np.float32))
    w = OrbaxWriter(tmp_path / "other", [("w", "float32", (2,)), ("v", "float32", (1,))])
    w.add("w", np.ones(2, np.float32))
    with pytest.raises(ArgumentError, match="1 declared tensor.*never written.*'v'"):
        w.finish()
    assert sorted(os.listdir(tmp_path)) == ["out"]


def test_a_checkpoint_manager_root_at_a_url_resolves_its_latest_or_given_step(tmp_path):
    import fsspec

    import ckptmerge as cm

    url = f"memory://orbax-root-{os.getpid()}"
    for step in (1, 2):
        local = write_orbax(tmp_path / str(step), {"w": np.full(3, step, np.float32)}, "ocdbt+zarr")
        copy_tree_to_memory(local, f"{url}/{step}")
    copy_tree_to_memory(tmp_path / "2", f"{url}/3.orbax-checkpoint-tmp-99")  # not finalised
    try:
        resolved = cm.Source(url).resolve()
        assert (resolved.prefix, resolved.step, resolved.format) == (f"{url}/2", 2, "orbax")
        np.testing.assert_array_equal(cm.load(url, ["w"])["w"], np.full(3, 2, np.float32))
        np.testing.assert_array_equal(cm.load(url, ["w"], step=1)["w"], np.full(3, 1, np.float32))
        assert [(c.step, c.latest) for c in cm.checkpoints(url)] == [(1, False), (2, True)]
        with pytest.raises(CheckpointNotFoundError, match="no finalised Orbax step 3 .*steps there: 1, 2"):
            cm.Source(url, step=3).resolve()
    finally:
        fsspec.filesystem("memory").rm(url, recursive=True)


def test_the_guard_refuses_jax_imported_by_ckptmerge_code_even_when_jax_is_loaded():
    import jax  # noqa: F401 - loaded already (Orbax, or TensorFlow, brought it in)

    with no_jax_from_ckptmerge() as seen:
        with pytest.raises(ImportError, match="must not import jax"):
            exec("import jax.numpy", {"__name__": "ckptmerge.formats.fake"})
        exec("import jax", {"__name__": "keras.src.fake"})  # another library may
    assert seen == ["ckptmerge.formats.fake -> jax.numpy"]
