"""Environment settings (``CKPTMERGE_*``) are checked when used, never at import; forged lock
objects cannot break the "locked" message."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

import ckptmerge as cm
from ckptmerge.core.errors import OutputLockedError, SettingError
from ckptmerge.core.knobs import FlagSetting, FloatSetting, IntSetting

from _cli_util import REPO, assert_one_line_error, run

W = np.arange(6, dtype=np.float32).reshape(2, 3)

REMOTE_SETTINGS = ["CKPTMERGE_REMOTE_RETRIES", "CKPTMERGE_REMOTE_CONCURRENCY", "CKPTMERGE_REMOTE_BLOCK",
                   "CKPTMERGE_REMOTE_LOCK", "CKPTMERGE_REMOTE_TIMEOUT", "CKPTMERGE_REMOTE_DEADLINE"]


# -- the setting classes ------------------------------------------------------------------------


@pytest.mark.parametrize("raw", ["abc", "0", "-1", "101", "4.0", "1e3", "0x10", "4 4", "99999999999999999999999"])
def test_an_integer_setting_out_of_range_or_malformed_names_the_variable_and_the_range(raw):
    s = IntSetting("CKPTMERGE_X", 4, 1, 100, "the attempts")
    with pytest.raises(SettingError) as info:
        s.get({"CKPTMERGE_X": raw})
    text = str(info.value)
    assert "CKPTMERGE_X=" in text and "an integer from 1 to 100" in text and "default (4)" in text
    assert info.value.name == "CKPTMERGE_X" and info.value.value == raw.strip()
    assert isinstance(info.value, ValueError) and isinstance(info.value, cm.CkptMergeError)


@pytest.mark.parametrize("env, value", [({}, 4), ({"CKPTMERGE_X": ""}, 4), ({"CKPTMERGE_X": "  "}, 4),
                                        ({"CKPTMERGE_X": " 7 "}, 7), ({"CKPTMERGE_X": "1"}, 1),
                                        ({"CKPTMERGE_X": "100"}, 100)])
def test_an_integer_setting_unset_or_empty_is_its_default_and_bounds_are_inclusive(env, value):
    assert IntSetting("CKPTMERGE_X", 4, 1, 100, "n").get(env) == value


@pytest.mark.parametrize("raw", ["nan", "NaN", "inf", "-inf", "1e300", "0", "-5", "soon", ""])
def test_a_float_setting_refuses_nan_infinity_and_out_of_range(raw):
    s = FloatSetting("CKPTMERGE_T", 60.0, 0.001, 86400.0, "seconds")
    if not raw:
        assert s.get({"CKPTMERGE_T": raw}) == 60.0
        return
    with pytest.raises(SettingError, match="CKPTMERGE_T=.*a number from 0.001 to 86400"):
        s.get({"CKPTMERGE_T": raw})


@pytest.mark.parametrize("raw, value", [("1", True), ("true", True), ("YES", True), ("On", True),
                                        ("0", False), ("false", False), ("No", False), ("off", False)])
def test_a_flag_setting_reads_the_usual_words(raw, value):
    assert FlagSetting("CKPTMERGE_F", True, "lock").get({"CKPTMERGE_F": raw}) is value


@pytest.mark.parametrize("raw", ["2", "maybe", "disabled", "00"])
def test_a_flag_setting_refuses_other_words(raw):
    with pytest.raises(SettingError, match="CKPTMERGE_F=.*1 or 0"):
        FlagSetting("CKPTMERGE_F", True, "lock").get({"CKPTMERGE_F": raw})


def test_a_setting_value_with_control_characters_is_escaped_and_cut_short():
    with pytest.raises(SettingError) as info:
        IntSetting("CKPTMERGE_X", 4, 1, 100, "n").get({"CKPTMERGE_X": "\x1b[2J" + "9" * 500})
    assert "\x1b" not in str(info.value) and "\\x1b[2J" in str(info.value) and len(str(info.value)) < 400


# -- where they are used ------------------------------------------------------------------------


@pytest.fixture
def memory_ckpt():
    import fsspec

    from ckptmerge.formats.safetensors.writer import SafetensorsWriter

    fs = fsspec.filesystem("memory")
    url = f"memory://knobs-{os.getpid()}/model.safetensors"
    local = f"/tmp/ckptmerge-knobs-{os.getpid()}.safetensors"
    with SafetensorsWriter(local, [("w", "float32", (2, 3))], overwrite=True) as w:
        w.add("w", W)
    fs.pipe(url, open(local, "rb").read())
    os.remove(local)
    yield url
    fs.rm(url.rsplit("/", 1)[0], recursive=True)


@pytest.mark.parametrize("name, raw", [("CKPTMERGE_REMOTE_RETRIES", "0"), ("CKPTMERGE_REMOTE_RETRIES", "abc"),
                                       ("CKPTMERGE_REMOTE_RETRIES", "-3"),
                                       ("CKPTMERGE_REMOTE_CONCURRENCY", "0"),
                                       ("CKPTMERGE_REMOTE_CONCURRENCY", "many")])
def test_a_bad_remote_setting_is_a_clear_error_when_a_url_is_read(memory_ckpt, monkeypatch, name, raw):
    monkeypatch.setenv(name, raw)
    with pytest.raises(SettingError, match=name):
        cm.load(memory_ckpt)


@pytest.mark.parametrize("raw", ["1", "1024", "65535"])
def test_a_remote_block_size_below_64_kib_is_refused_where_an_archive_is_opened(monkeypatch, raw):
    from ckptmerge.formats.io import storage

    monkeypatch.setenv("CKPTMERGE_REMOTE_BLOCK", raw)
    with pytest.raises(SettingError, match="CKPTMERGE_REMOTE_BLOCK=.*from 65,536"):
        storage.open_binary("memory://knobs-nothing/x.npz")


@pytest.mark.parametrize("raw", ["soon", "0", "nan", "1e300"])
def test_a_bad_orbax_timeout_is_a_clear_error_when_a_url_is_waited_for(monkeypatch, raw):
    from concurrent.futures import Future

    from ckptmerge.formats.orbax.store import Location, wait

    done = Future()
    done.set_result(7)
    assert wait(done, "reading", Location("memory://knobs-orbax/state")) == 7
    monkeypatch.setenv("CKPTMERGE_REMOTE_DEADLINE", raw)  # a TensorStore read is one read: its deadline
    assert wait(done, "reading", Location("/tmp")) == 7  # a local read has no time bound: never read
    with pytest.raises(SettingError, match="CKPTMERGE_REMOTE_DEADLINE=.*from 0.001 to 604800"):
        wait(done, "reading", Location("memory://knobs-orbax/state"))


def test_every_ckptmerge_setting_is_a_checked_knob_and_documented():
    """No module reads the environment itself (a malformed value would crash it at import or
    give a traceback): each CKPTMERGE_* setting is a ckptmerge.core.knobs setting, checked when it is
    used, and docs/ say what it accepts."""
    import ast

    knob_kinds = {"IntSetting", "FloatSetting", "FlagSetting"}
    # modules that may touch os.environ: the knobs themselves, config expansion ($VAR in paths),
    # and what only sets or passes it on (TF's log level, a child process's environment, a host name)
    allowed = {"core/knobs.py", "config/load.py", "config/mergekit.py", "cli/workflow.py", "cli/follow.py",
               "formats/io/output_prefix.py"}
    raw, settings = [], set()
    for path in sorted((REPO / "ckptmerge").rglob("*.py")):
        rel = path.relative_to(REPO / "ckptmerge").as_posix()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr", None)) in knob_kinds \
                    and node.args and isinstance(node.args[0], ast.Constant):
                settings.add(node.args[0].value)
            if isinstance(node, ast.Attribute) and node.attr in ("environ", "getenv") \
                    and isinstance(node.value, ast.Name) and node.value.id == "os" and rel not in allowed:
                raw.append(f"ckptmerge/{rel}:{node.lineno}")
    assert not raw, f"read the setting through ckptmerge.core.knobs (IntSetting, FloatSetting, FlagSetting) instead: {raw}"
    assert set(REMOTE_SETTINGS) <= settings
    docs = "".join(p.read_text(encoding="utf-8") for p in (REPO / "docs").glob("*.md"))
    assert not [n for n in settings if n not in docs], "document each setting (docs/remote.md, Settings)"


def test_one_attempt_is_no_retry_and_still_a_clear_error(monkeypatch):
    from ckptmerge.formats.io import storage

    calls = []

    def flaky(seconds_left=None):  # (the time left before the deadline)
        calls.append(1)
        raise ConnectionError("reset by peer")

    monkeypatch.setenv("CKPTMERGE_REMOTE_RETRIES", "1")
    with pytest.raises(cm.CheckpointFormatError, match="ConnectionError: reset by peer"):
        storage._with_retries("fetching", "memory://x/y", flaky)
    assert len(calls) == 1
    monkeypatch.setenv("CKPTMERGE_REMOTE_RETRIES", "3")
    calls.clear()
    with pytest.raises(cm.CheckpointFormatError, match="after 3 attempts"):
        storage._with_retries("fetching", "memory://x/y", flaky)
    assert len(calls) == 3


@pytest.mark.parametrize("name, raw, accepted, command", [
    ("CKPTMERGE_REMOTE_RETRIES", "0", "an integer from 1 to 100", ["ls"]),
    ("CKPTMERGE_REMOTE_RETRIES", "many", "an integer from 1 to 100", ["ls", "--stats"]),
    ("CKPTMERGE_REMOTE_BLOCK", "1k", "an integer from 65,536 to 1,073,741,824", ["ls", "{npz}"])])
def test_the_cli_reports_a_bad_remote_setting_in_one_line(memory_ckpt, monkeypatch, name, raw, accepted, command):
    monkeypatch.setenv(name, raw)
    npz = memory_ckpt.replace(".safetensors", ".npz")
    if "{npz}" in command:
        import io

        import fsspec

        buffer = io.BytesIO()
        np.savez(buffer, w=W)
        fsspec.filesystem("memory").pipe(npz, buffer.getvalue())
    argv = [a.format(npz=npz) for a in command]
    if not any("{" in a for a in command):
        argv.append(memory_ckpt)
    assert_one_line_error(run(*argv), f"{name}='{raw}' is not valid", accepted)


def test_local_commands_never_read_the_remote_settings(tmp_path, monkeypatch):
    from ckptmerge.formats.safetensors.writer import SafetensorsWriter

    path = tmp_path / "m.safetensors"
    with SafetensorsWriter(str(path), [("w", "float32", (2, 3))]) as w:
        w.add("w", W)
    for name in REMOTE_SETTINGS:
        monkeypatch.setenv(name, "garbage")
    result = run("ls", path)
    assert result.exit_code == 0, result.output
    assert "w" in result.stdout
    out = tmp_path / "merged.safetensors"
    assert run("merge", _config(tmp_path, path), "-o", out).exit_code == 0
    np.testing.assert_array_equal(cm.load(str(out))["w"], W)


def _config(tmp_path, path):
    cfg = tmp_path / "merge.yaml"
    cfg.write_text(f"sources:\n  - path: {path}\n", encoding="utf-8")
    return cfg


def test_import_and_help_work_whatever_the_settings_hold(tmp_path):
    env = dict(os.environ, PYTHONPATH=str(REPO), **{n: "garbage" for n in REMOTE_SETTINGS})
    done = subprocess.run([sys.executable, "-c", "import ckptmerge, ckptmerge.formats.io.storage, "
                           "ckptmerge.merging.dispatch, ckptmerge.formats.orbax.store; print('ok')"], env=env, capture_output=True, text=True,
                          timeout=120, cwd=tmp_path)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr
    done = subprocess.run([sys.executable, "-m", "ckptmerge", "--help"], env=env, capture_output=True, text=True,
                          timeout=120, cwd=tmp_path)
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr


def test_a_malformed_lock_setting_stops_a_remote_merge_before_it_writes(memory_ckpt, monkeypatch):
    import fsspec

    out = memory_ckpt.rsplit("/", 1)[0] + "/out/merged"
    monkeypatch.setenv("CKPTMERGE_REMOTE_LOCK", "maybe")
    with pytest.raises(SettingError, match="CKPTMERGE_REMOTE_LOCK='maybe'"):
        cm.merge([cm.Source(memory_ckpt)], out)
    assert not fsspec.filesystem("memory").exists(out + ".index")
    monkeypatch.setenv("CKPTMERGE_REMOTE_LOCK", "off")  # a word that used to mean "on"
    fs = fsspec.filesystem("memory")
    fs.pipe(out + ".lock", b"{}")  # a lock that "off" must not wait for
    cm.merge([cm.Source(memory_ckpt)], out)
    assert fs.exists(out + ".index")


# -- forged lock objects ------------------------------------------------------------------------


@pytest.mark.parametrize("body", [
    {"host": "h", "pid": 1, "started": 1e300},
    {"host": "h", "pid": 1, "started": -1e300},
    {"host": "h", "pid": 1, "started": 10 ** 400},
    {"host": "h", "pid": 1, "started": -5},
    {"host": "h", "pid": 1, "started": True},
    {"host": "h", "pid": 1, "started": "yesterday"},
    {"host": "h", "pid": 1, "started": [1, 2]},
    {"host": "h", "pid": 1, "started": {"t": 1}},
    {"host": "h", "pid": 1, "started": None},
    {"host": ["a", {"b": 1}], "pid": {"x": [1] * 5000}, "started": 0},
    {"host": "\x1b]0;pwned\x07" + "x" * 50_000, "pid": "\u202e1", "started": 1},
    {"host": None},
])
def test_a_forged_lock_object_still_gives_the_locked_message(memory_ckpt, body):
    import fsspec

    out = memory_ckpt.rsplit("/", 1)[0] + "/forged/merged"
    fsspec.filesystem("memory").pipe(out + ".lock", json.dumps(body).encode())
    with pytest.raises(OutputLockedError) as info:
        cm.merge([cm.Source(memory_ckpt)], out)
    text = str(info.value)  # reported as a lock that cannot be trusted, never judged stale nor overwritten
    assert text.startswith(f"The lock '{out}.lock' of the output '{out}' cannot be trusted") and "delete the object" in text
    assert "\x1b" not in text and "\u202e" not in text and len(text) < 1000
    assert fsspec.filesystem("memory").cat(out + ".lock") == json.dumps(body).encode()


@pytest.mark.parametrize("raw", [b'{"host": "h", "pid": 1, "started": NaN}', b'{"host": "h", "pid": 1, "started": Infinity}',
                                 b'{"started": -Infinity}', b"[1, 2]", b"not json", b"\xff\xfe", b"[" * 100_000])
def test_a_lock_object_holding_nan_or_no_json_object_gives_the_locked_message(memory_ckpt, raw):
    import fsspec

    out = memory_ckpt.rsplit("/", 1)[0] + "/nan/merged"
    fsspec.filesystem("memory").pipe(out + ".lock", raw)
    with pytest.raises(OutputLockedError, match="cannot be trusted"):
        cm.merge([cm.Source(memory_ckpt)], out)
    assert fsspec.filesystem("memory").cat(out + ".lock") == raw


def test_a_sane_lock_object_shows_its_holder_and_age(memory_ckpt):
    import time

    import fsspec

    out = memory_ckpt.rsplit("/", 1)[0] + "/sane/merged"
    fsspec.filesystem("memory").pipe(out + ".lock", json.dumps(
        {"host": "trainer-7", "pid": 4242, "started": time.time() - 600, "token": "ab12", "output": out,
         "machine": None}).encode())
    with pytest.raises(OutputLockedError) as info:
        cm.merge([cm.Source(memory_ckpt)], out)
    assert "process 4242 on host 'trainer-7', started " in str(info.value) and "(10 min ago)" in str(info.value)
