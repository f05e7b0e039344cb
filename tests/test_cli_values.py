"""Reading values in the CLI: ``ls --stats`` and ``diff --values`` in bounded memory, and what
"equal" means for ``diff --values``.

Checkpoints are written by TensorFlow in the test. Bounded memory is checked with
``tracemalloc`` (numpy reports its buffers to it) while the piece size is made small, so a
tensor of a few MiB stands in for one of many GiB.
"""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

from _cli_util import assert_one_line_error, run, save_tf1
from _reader_util import traced_peak, write_saver_checkpoint
from ckptmerge.cli import inspect as cli_inspect

N = 1 << 21  # 8 MiB of float32
PIECE = 4096


@pytest.fixture(scope="module")
def big(tmp_path_factory):
    """A and B: one 8 MiB float32 tensor each; B's last element is 0.5 higher. P: A's values as
    a variable partitioned in 3 (rows of 1024)."""
    root = tmp_path_factory.mktemp("values")
    value = np.random.default_rng(0).standard_normal(N).astype(np.float32)
    value[7] = np.inf
    value[9] = np.nan
    other = value.copy()
    other[-1] += 0.5
    a = save_tf1(root / "A" / "model", {"w": value})
    b = save_tf1(root / "B" / "model", {"w": other})
    p = write_saver_checkpoint(str(root / "P" / "model"), [
        {"name": "w", "dtype": "float32", "value": value.reshape(-1, 1024), "partitions": 3}])
    pr = save_tf1(root / "R" / "model", {"w": value.reshape(-1, 1024)})
    run("diff", a, b, "--values")  # the commands' modules are imported before memory is measured
    return {"value": value, "A": a, "B": b, "P": p, "R": pr}


@pytest.fixture
def small_pieces(monkeypatch):
    monkeypatch.setattr(cli_inspect, "STATS_CHUNK", PIECE)


# --------------------------------------------------------------------------------------------
# ls --stats streams
# --------------------------------------------------------------------------------------------
def test_ls_stats_reads_a_big_tensor_in_bounded_pieces(big, small_pieces):
    r, peak = traced_peak(lambda: run("ls", big["A"], "--stats", "--json"))
    assert r.exit_code == 0, r.output
    assert peak < N * 4 / 8, peak  # the tensor is 8 MiB; a piece 16 KiB
    stats = json.loads(r.stdout)[0]["stats"]
    finite = big["value"][np.isfinite(big["value"])].astype(np.float64)
    assert stats["nan"] == 1 and stats["inf"] == 1
    assert (stats["min"], stats["max"]) == (finite.min(), finite.max())
    assert stats["mean"] == pytest.approx(finite.mean(), abs=1e-9)
    assert stats["std"] == pytest.approx(finite.std(), rel=1e-9)


def test_ls_stats_of_a_partitioned_variable_streams_its_slices(big, small_pieces):
    (r, peak), whole = traced_peak(lambda: run("ls", big["P"], "--stats", "--json")), run("ls", big["R"], "--stats", "--json")
    assert r.exit_code == 0, r.output
    assert peak < N * 4 / 8, peak
    got, want = json.loads(r.stdout)[0]["stats"], json.loads(whole.stdout)[0]["stats"]
    assert got == pytest.approx(want, rel=1e-12)


def test_ls_stats_still_checks_the_checksum_of_a_streamed_tensor(big, tmp_path, small_pieces):
    import shutil

    for f in os.listdir(os.path.dirname(big["A"])):
        shutil.copy(os.path.join(os.path.dirname(big["A"]), f), tmp_path / f)
    data = next(tmp_path.glob("model.data-*"))
    raw = bytearray(data.read_bytes())
    raw[len(raw) // 2] ^= 0x01
    data.write_bytes(bytes(raw))
    assert_one_line_error(run("ls", tmp_path / "model", "--stats"), "checksum mismatch for tensor 'w'")
    assert run("ls", tmp_path / "model", "--stats", "--no-verify").exit_code == 0


@pytest.fixture(scope="module")
def files(big, tmp_path_factory):
    """A's and B's values as a .safetensors file (written by the safetensors package), a folder
    of .npy files (one big-endian, so pieces are byte-swapped) and a .npz of stored members."""
    from safetensors.numpy import save_file

    root = tmp_path_factory.mktemp("formats")
    value = big["value"]
    other = value.copy()
    other[-1] += 0.5
    out = {}
    for label, v in (("A", value), ("B", other)):
        save_file({"w": v}, str(root / f"{label}.safetensors"))
        (root / f"{label}-npy").mkdir()
        np.save(root / f"{label}-npy" / "w.npy", v.astype(">f4") if label == "A" else v)
        np.savez(root / f"{label}.npz", w=v)
        out[label] = {"safetensors": root / f"{label}.safetensors", "npy": root / f"{label}-npy",
                      "npz": root / f"{label}.npz"}
    return out


FORMATS = ["safetensors", "npy", "npz"]


@pytest.mark.parametrize("fmt", FORMATS)
def test_ls_stats_streams_a_big_tensor_of_other_formats_from_the_file(big, files, fmt, small_pieces):
    run("ls", files["A"][fmt])  # the reader's modules are imported before memory is measured
    r, peak = traced_peak(lambda: run("ls", files["A"][fmt], "--stats", "--json"))
    assert r.exit_code == 0, r.output
    assert peak < N * 4 / 8, peak  # the tensor is 8 MiB; a piece 16 KiB
    want = json.loads(run("ls", big["A"], "--stats", "--json").stdout)[0]["stats"]
    assert json.loads(r.stdout)[0]["stats"] == pytest.approx(want, rel=1e-12)


@pytest.mark.parametrize("fmt", FORMATS)
def test_diff_values_streams_big_tensors_of_other_formats_from_the_files(files, fmt, small_pieces):
    r, peak = traced_peak(lambda: run("diff", files["A"][fmt], files["B"][fmt], "--values"))
    assert r.exit_code == 1, r.output
    assert peak < N * 4 / 8, peak
    assert "Values differ (1):\n  w: max abs diff 0.5\n" in r.stdout


def test_streamed_npz_member_still_checks_its_crc_before_the_last_piece(files, tmp_path, small_pieces):
    raw = bytearray(files["A"]["npz"].read_bytes())
    end = raw.index(b"PK\x01\x02")  # the central directory follows the member's data
    raw[end - 1] ^= 0x01  # the member's last byte: only the last piece reads it
    bad = tmp_path / "bad.npz"
    bad.write_bytes(bytes(raw))
    assert_one_line_error(run("ls", bad, "--stats"), "CRC-32 mismatch for 'w' in bad.npz")
    assert run("ls", bad, "--stats", "--no-verify").exit_code == 0


def test_pieces_are_read_as_they_are_asked_for(files, tmp_path):
    import shutil

    import ckptmerge as cm

    path = tmp_path / "w.safetensors"
    shutil.copy(files["A"]["safetensors"], path)
    with cm.open(str(path)) as reader:
        pieces = reader.iter_chunks("w", PIECE)
        first = next(pieces)
        with open(path, "r+b") as f:  # cut the file after the first piece was read
            f.truncate(os.path.getsize(path) - N * 2)
        assert first.size == PIECE
        with pytest.raises(cm.CheckpointFormatError, match="ended early"):
            for _ in pieces:
                pass


# --------------------------------------------------------------------------------------------
# diff --values streams
# --------------------------------------------------------------------------------------------
def test_diff_values_compares_big_tensors_in_bounded_pieces(big, small_pieces):
    r, peak = traced_peak(lambda: run("diff", big["A"], big["B"], "--values"))
    assert r.exit_code == 1, r.output
    assert peak < N * 4 / 8, peak
    assert "Values differ (1):\n  w: max abs diff 0.5\n" in r.stdout


def test_diff_values_of_a_partitioned_and_a_plain_copy_are_equal(big, small_pieces):
    r, peak = traced_peak(lambda: run("diff", big["P"], big["R"], "--values"))
    assert r.exit_code == 0, r.output
    assert peak < N * 4 / 8, peak
    assert r.stdout.endswith("Equal: 1 variable, same names, dtypes, shapes and values (1 compared)\n")


def test_paired_pieces_line_up_streams_cut_in_different_places():
    xs = [np.arange(0, 5), np.arange(5, 6), np.arange(6, 10)]
    ys = [np.arange(0, 2), np.arange(2, 9), np.arange(9, 10)]
    pairs = list(cli_inspect._paired(iter(xs), iter(ys)))
    assert all(np.array_equal(a, b) for a, b in pairs)
    assert np.concatenate([a for a, _ in pairs]).tolist() == list(range(10))


# --------------------------------------------------------------------------------------------
# diff --values: what equal means
# --------------------------------------------------------------------------------------------
SPECIAL = np.array([np.inf, -np.inf, np.nan, 1.0, -0.0], np.float32)


@pytest.fixture(scope="module")
def specials(tmp_path_factory):
    root = tmp_path_factory.mktemp("specials")
    c = np.array([complex(np.inf, 1), complex(np.nan, 2)], np.complex64)
    a = save_tf1(root / "A" / "model", {"f": SPECIAL, "c": c})
    changed = SPECIAL.copy()
    changed[3] = 2.0
    changed[4] = 0.0  # -0.0 and 0.0 are equal values
    b = save_tf1(root / "B" / "model", {"f": changed, "c": c})
    inf_vs_finite = SPECIAL.copy()
    inf_vs_finite[0] = 3.0
    nan_vs_number = SPECIAL.copy()
    nan_vs_number[2] = 3.0
    return {"A": a, "B": b, "inf": save_tf1(root / "I" / "model", {"f": inf_vs_finite, "c": c}),
            "nan": save_tf1(root / "N" / "model", {"f": nan_vs_number, "c": c})}


def test_diff_values_of_a_checkpoint_with_itself_is_equal_with_inf_and_nan(specials):
    r = run("diff", specials["A"], specials["A"], "--values")
    assert r.exit_code == 0, r.output
    assert r.stdout.splitlines()[-1] == "Equal: 2 variables, same names, dtypes, shapes and values (2 compared)"
    d = json.loads(run("diff", specials["A"], specials["A"], "--values", "--json").stdout)
    assert d["equal"] is True
    assert d["values"] == [{"name": "c", "max_abs_diff": 0.0, "equal": True},
                           {"name": "f", "max_abs_diff": 0.0, "equal": True}]


def test_diff_values_with_inf_and_nan_still_finds_a_real_difference(specials):
    r = run("diff", specials["A"], specials["B"], "--values")
    assert r.exit_code == 1, r.output
    assert "Values differ (1):\n  f: max abs diff 1\n" in r.stdout


@pytest.mark.parametrize("which,shown,as_json", [("inf", "inf", "inf"), ("nan", "nan", "nan")])
def test_diff_values_of_inf_or_nan_facing_a_number_differ(specials, which, shown, as_json):
    r = run("diff", specials["A"], specials[which], "--values")
    assert r.exit_code == 1, r.output
    assert f"  f: max abs diff {shown}\n" in r.stdout
    d = json.loads(run("diff", specials["A"], specials[which], "--values", "--json").stdout)
    assert d["values"][1] == {"name": "f", "max_abs_diff": as_json, "equal": False}


def test_max_abs_diff_counts_equal_values_and_nan_facing_nan_as_equal():
    a = np.array([np.inf, -np.inf, np.nan, 0.0])
    assert cli_inspect.max_abs_diff(a, np.array([np.inf, -np.inf, np.nan, -0.0])) == 0.0
    assert cli_inspect.max_abs_diff(a, np.array([np.inf, -np.inf, np.nan, 0.25])) == 0.25
    assert cli_inspect.max_abs_diff(a, np.array([-np.inf, -np.inf, np.nan, 0.0])) == np.inf
    c = np.array([complex(np.inf, np.nan)])
    assert cli_inspect.max_abs_diff(c, c.copy()) == 0.0
    assert np.isnan(cli_inspect.max_abs_diff(c, np.array([complex(np.inf, 1.0)])))
