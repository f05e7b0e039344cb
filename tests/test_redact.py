"""URL credentials (userinfo, signed query values) never appear in what ckptmerge prints or writes.

The unit tests pin :func:`ckptmerge.core.redact.redact` on the URL shapes of every store (S3 presigned
V2 and V4, GCS signed V2 and V4, Azure SAS, CloudFront, basic auth, tokens). The end-to-end
tests read checkpoints through ``memory://`` URLs whose names hold the secrets (fsspec's memory
filesystem keeps userinfo and query as part of the path, so every remote code path runs) and
look for the secret in every output: text, ``--json``, error messages, ``-v`` logs, the
safetensors metadata of a merge, and its raw header bytes.
"""

from __future__ import annotations

import io
import json
import logging
import os

import numpy as np
import pytest

import ckptmerge as cm
from ckptmerge.core.errors import (
    CheckpointFormatError,
    CheckpointNotFoundError,
    CheckpointWriteError,
    OutputExistsError,
    UnknownTensorError,
)
from ckptmerge.core.redact import MASK, get_logger, is_secret_parameter, redact
from ckptmerge.core.text import command_hint, escape_name, quote_name

from _cli_util import run

SECRET = "S3CR3Tvalue"

# -- the function -------------------------------------------------------------------------------


@pytest.mark.parametrize("url, shown", [
    ("https://user:hunter2@host/m.safetensors", "https://***@host/m.safetensors"),
    ("https://ghp_TOKEN@github.com/x", "https://***@github.com/x"),
    ("http://u:p%40ss@127.0.0.1:8080/m", "http://***@127.0.0.1:8080/m"),
    ("s3://AKIAKEY:SECRETKEY@bucket/run/ckpt-1", "s3://***@bucket/run/ckpt-1"),
    ("hdfs://me@namenode:8020/run", "hdfs://***@namenode:8020/run"),
    # S3 presigned, V4 and V2
    ("https://b.s3.amazonaws.com/m?X-Amz-Algorithm=AWS4-HMAC-SHA256&X-Amz-Credential=AKIA%2F2024%2Fus&"
     "X-Amz-Date=20240101T000000Z&X-Amz-Expires=3600&X-Amz-SignedHeaders=host&X-Amz-Security-Token=FQo&"
     "X-Amz-Signature=abcdef",
     "https://b.s3.amazonaws.com/m?X-Amz-Algorithm=AWS4-HMAC-SHA256&X-Amz-Credential=***&"
     "X-Amz-Date=20240101T000000Z&X-Amz-Expires=3600&X-Amz-SignedHeaders=host&X-Amz-Security-Token=***&"
     "X-Amz-Signature=***"),
    ("https://b.s3.amazonaws.com/m?AWSAccessKeyId=AKIA&Expires=1700000000&Signature=abc%3D&x-amz-security-token=t",
     "https://b.s3.amazonaws.com/m?AWSAccessKeyId=***&Expires=1700000000&Signature=***&x-amz-security-token=***"),
    # GCS signed, V4 and V2
    ("https://storage.googleapis.com/b/m?X-Goog-Algorithm=GOOG4-RSA-SHA256&X-Goog-Credential=sa%40p.iam&"
     "X-Goog-Date=20240101T000000Z&X-Goog-Expires=900&X-Goog-SignedHeaders=host&X-Goog-Signature=0a1b",
     "https://storage.googleapis.com/b/m?X-Goog-Algorithm=GOOG4-RSA-SHA256&X-Goog-Credential=***&"
     "X-Goog-Date=20240101T000000Z&X-Goog-Expires=900&X-Goog-SignedHeaders=host&X-Goog-Signature=***"),
    ("https://storage.googleapis.com/b/m?GoogleAccessId=sa%40p.iam&Expires=1700000000&Signature=Zm9v",
     "https://storage.googleapis.com/b/m?GoogleAccessId=***&Expires=1700000000&Signature=***"),
    # Azure SAS (service and user delegation)
    ("https://acct.blob.core.windows.net/c/m?sv=2022-11-02&ss=b&srt=o&sp=r&se=2030-01-01&spr=https&"
     "sig=k%2Fz%3D", "https://acct.blob.core.windows.net/c/m?sv=2022-11-02&ss=b&srt=o&sp=r&se=2030-01-01&"
                     "spr=https&sig=***"),
    ("az://c/m?sv=2022&skoid=oid&sktid=tid&sig=abc", "az://c/m?sv=2022&skoid=oid&sktid=tid&sig=***"),
    # CloudFront, tokens, keys
    ("https://d.cloudfront.net/m?Policy=eyJ&Signature=abc&Key-Pair-Id=K2", "https://d.cloudfront.net/m?Policy=***&"
                                                                           "Signature=***&Key-Pair-Id=***"),
    ("https://h/m?token=abc", "https://h/m?token=***"),
    ("https://h/m?access_token=abc&download=true", "https://h/m?access_token=***&download=true"),
    ("https://h/m?api_key=1&apikey=2&key=3&client_secret=4&password=5&auth=6",
     "https://h/m?api_key=***&apikey=***&key=***&client_secret=***&password=***&auth=***"),
    ("https://h/m#access_token=abc&state=1", "https://h/m#access_token=***&state=1"),
    ("https://h/m?TOKEN=abc&Sig=x", "https://h/m?TOKEN=***&Sig=***"),
    ("https://u:p@h/m?sig=1", "https://***@h/m?sig=***"),
])
def test_redact_hides_userinfo_and_every_secret_parameter(url, shown):
    assert redact(url) == shown
    assert redact(shown) == shown  # idempotent


@pytest.mark.parametrize("text", [
    "runs/A/ckpt-10", "s3://bucket/run/ckpt-10", "https://host:8080/m.safetensors?download=true&rev=main",
    "s3://bucket/key@v2/m", "dense/kernel", "x = y", "user@example.com", "a?b=c",
    "https://h/m?author=me&keyword=x&passes=3&monkey=1&X-Amz-Date=1", "https://h/m?sig=", "",
])
def test_redact_leaves_text_without_credentials_as_it_is(text):
    assert redact(text) == text


def test_redact_finds_every_url_in_a_message_and_stops_at_quotes():
    text = (f"Checkpoint 'https://u:{SECRET}@h/m?sig={SECRET}' does not exist; tried "
            f"\"s3://b/x?X-Amz-Signature={SECRET}\" and https://h/y?token={SECRET} too.")
    out = redact(text)
    assert SECRET not in out
    assert out == ("Checkpoint 'https://***@h/m?sig=***' does not exist; tried "
                   "\"s3://b/x?X-Amz-Signature=***\" and https://h/y?token=*** too.")


@pytest.mark.parametrize("name", ["X-Amz-Signature", "x-amz-credential", "X-Amz-Security-Token", "X-Goog-Signature",
                                  "X-Goog-Credential", "GoogleAccessId", "AWSAccessKeyId", "Signature", "sig", "token",
                                  "id_token", "refreshToken", "api-key", "secret", "passwd", "pwd", "Key-Pair-Id",
                                  "Policy", "sessionid", "jwt", "auth", "Authorization", "sas_token", "code"])
def test_secret_parameter_names(name):
    assert is_secret_parameter(name)


@pytest.mark.parametrize("name", ["download", "rev", "X-Amz-Date", "X-Amz-Expires", "X-Amz-Algorithm", "sv", "se",
                                  "sp", "spr", "Expires", "author", "keyword", "passes", "version", "alt",
                                  "response-content-disposition"])
def test_ordinary_parameter_names(name):
    assert not is_secret_parameter(name)


def test_escape_name_and_the_text_helpers_redact():
    url = f"https://me:{SECRET}@h/m?X-Amz-Signature={SECRET}\n"
    for shown in (escape_name(url), quote_name(url), command_hint("ls", url)):
        assert SECRET not in shown and MASK in shown and "\n" not in shown


@pytest.mark.parametrize("error", [cm.CkptMergeError, CheckpointFormatError, CheckpointNotFoundError,
                                   OutputExistsError, CheckpointWriteError, UnknownTensorError, cm.ConfigError])
def test_every_error_redacts_its_message_when_made_and_keeps_the_path(error):
    url = f"https://h/m?sig={SECRET}"
    e = error(f"cannot read '{url}' ({url})", path=url) if error is not cm.CkptMergeError else error(f"at {url}")
    assert SECRET not in str(e) and SECRET not in repr(e) and "sig=***" in str(e)
    if error is not cm.CkptMergeError:
        assert e.path == url  # the data keeps what the program needs


# -- logs ---------------------------------------------------------------------------------------


def test_the_package_loggers_redact_messages_arguments_and_tracebacks():
    log = get_logger("ckptmerge.test_redact")
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(logging.Formatter("%(message)s"))
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    try:
        url = f"https://me:{SECRET}@h/m?token={SECRET}"
        log.info("reading %s (attempt %d of %d, %.1f s)", url, 1, 4, 0.5)
        log.info(f"prebuilt message about {url}")
        log.info("an error: %s; repr %r", ConnectionError(f"reset while reading {url}"), OSError(url))
        log.info("by name: %(u)s", {"u": url})
        try:
            raise RuntimeError(f"failed on {url}")
        except RuntimeError:
            log.exception("with a traceback")
    finally:
        log.removeHandler(handler)
    text = stream.getvalue()
    assert SECRET not in text, text
    assert "reading https://***@h/m?token=*** (attempt 1 of 4, 0.5 s)" in text
    assert text.count("***@h") >= 6 and "RuntimeError: failed on https://***@h" in text


@pytest.mark.parametrize("module", ["ckptmerge.formats.io.storage", "ckptmerge.merging.remote", "ckptmerge.merging.local",
                                    "ckptmerge.sources.local", "ckptmerge.formats.numpy.reader", "ckptmerge.cli.common"])
def test_the_modules_that_log_paths_use_the_redacting_logger(module):
    import importlib

    from ckptmerge.core.redact import RedactingFilter

    importlib.import_module(module)
    assert any(isinstance(f, RedactingFilter) for f in logging.getLogger(module).filters)


def test_every_module_logger_of_the_package_redacts():
    import ast
    from pathlib import Path

    root = Path(cm.__file__).parent
    plain = [str(p.relative_to(root)) for p in root.rglob("*.py")
             if any(isinstance(n, ast.Call) and getattr(n.func, "attr", None) == "getLogger"
                    for n in ast.walk(ast.parse(p.read_text(encoding="utf-8"))))
             and p.name != "redact.py"]
    assert not plain, f"modules that make a logger without ckptmerge.core.redact.get_logger: {plain}"


# -- end to end, through memory:// --------------------------------------------------------------

W = np.arange(6, dtype=np.float32).reshape(2, 3)


def _safetensors_bytes(tmp_path, values) -> bytes:
    from ckptmerge.formats.safetensors.writer import SafetensorsWriter

    path = tmp_path / "tmp.safetensors"
    with SafetensorsWriter(str(path), [(n, "float32", v.shape) for n, v in values.items()], overwrite=True) as w:
        for n, v in values.items():
            w.add(n, v)
    data = path.read_bytes()
    path.unlink()
    return data


@pytest.fixture
def secret_urls(tmp_path):
    import fsspec

    fs = fsspec.filesystem("memory")
    base = f"memory://me:{SECRET}@redact-{os.getpid()}-{id(tmp_path)}"
    a = f"{base}/a/model.safetensors?X-Amz-Signature={SECRET}&X-Amz-Date=1"
    b = f"{base}/b/model.safetensors?sig={SECRET}"
    fs.pipe(a, _safetensors_bytes(tmp_path, {"w": W, "only_a": W[0]}))
    fs.pipe(b, _safetensors_bytes(tmp_path, {"w": W * 2}))
    yield {"a": a, "b": b, "base": base}
    fs.rm(base, recursive=True)


def _no_secret(*texts: str) -> None:
    for t in texts:
        assert SECRET not in t, t


@pytest.mark.parametrize("args", [["ls"], ["ls", "--json"], ["ls", "--stats"], ["-v", "ls"], ["show"],
                                  ["show", "--json"], ["diff"], ["diff", "--json"], ["diff", "--values"]])
def test_inspection_commands_show_no_credential(secret_urls, args):
    url = secret_urls["a"]
    if "diff" in args:
        argv = [*args, url, secret_urls["b"]]
    elif "show" in args:
        argv = [*args, url, "w"]
    else:
        argv = [*args, url]
    r = run(*argv)
    assert r.exit_code in (0, 1), r.output
    _no_secret(r.stdout, r.stderr)
    if "--json" not in args and args[0] != "show":
        assert "***" in r.stdout


@pytest.mark.parametrize("argv", [["ls", "{a}nope"], ["show", "{a}", "nothere"], ["ls", "{base}/none/"],
                                  ["checkpoints", "{base}/none"], ["diff", "{a}", "{a}x"]])
def test_errors_about_urls_with_credentials_show_none(secret_urls, argv):
    r = run(*[a.format(**secret_urls) for a in argv])
    assert r.exit_code == 2, r.output
    assert r.stderr.startswith("Error: ") and "Traceback" not in r.stderr
    assert "***" in r.stderr
    _no_secret(r.stdout, r.stderr)


def _config(tmp_path, *paths, **top):
    lines = ["sources:"] + [f"  - path: '{p}'" for p in paths] + [f"{k}: {v}" for k, v in top.items()]
    cfg = tmp_path / "warm.yaml"
    cfg.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return cfg


def _metadata(path) -> dict:
    with open(path, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        return json.loads(f.read(n))["__metadata__"]


@pytest.mark.parametrize("args", [[], ["--json"], ["-v"]])
def test_a_merge_writes_and_prints_no_credential(secret_urls, tmp_path, args):
    out = tmp_path / "merged.safetensors"
    cfg = _config(tmp_path, secret_urls["a"])
    argv = ["-v", "merge", cfg, "-o", out] if args == ["-v"] else ["merge", cfg, "-o", out, *args]
    r = run(*argv)
    assert r.exit_code == 0, r.output
    _no_secret(r.stdout, r.stderr, out.read_bytes().decode("latin-1"))
    meta = _metadata(out)
    sources = json.loads(meta["ckptmerge.sources"])
    assert sources[0]["path"].endswith("/a/model.safetensors?X-Amz-Signature=***&X-Amz-Date=1")
    assert sources[0]["path"].startswith("memory://***@")
    np.testing.assert_array_equal(cm.load(str(out))["w"], W)


@pytest.mark.parametrize("args", [[], ["--json"], ["-v"]])
def test_a_combination_prints_and_writes_no_credential(secret_urls, tmp_path, args):
    out = tmp_path / "mean.safetensors"
    argv = ["-v", "combine"] if args == ["-v"] else ["combine", *args]
    import fsspec

    a = secret_urls["a"]
    fsspec.filesystem("memory").pipe(a.replace("/a/", "/a2/"), fsspec.filesystem("memory").cat(a))
    r = run(*argv, a, a.replace("/a/", "/a2/"), "-o", out)
    assert r.exit_code == 0, r.output
    _no_secret(r.stdout, r.stderr, out.read_bytes().decode("latin-1"))
    if args == ["--json"]:
        inputs = json.loads(r.stdout)["combine"]["inputs"]
        assert [i["path"].startswith("memory://***@") for i in inputs] == [True, True]
    report = cm.combine([a, secret_urls["b"]], keys="union").report()
    _no_secret(json.dumps(report.to_dict()), report.to_html(), str(report), repr(report))


def test_plan_json_and_text_show_no_credential(secret_urls, tmp_path):
    cfg = _config(tmp_path, secret_urls["a"], secret_urls["b"], on_conflict="first")
    target = tmp_path / "target.safetensors"
    target.write_bytes(_safetensors_bytes(tmp_path, {"w": W}))
    for extra in ([], ["--json"]):
        r = run("plan", cfg, "--target", target, *extra)
        assert r.exit_code == 0, r.output
        _no_secret(r.stdout, r.stderr)
    data = json.loads(run("plan", cfg, "--target", target, "--json").stdout)
    assert all("***" in s["path"] and "***" in s["label"] for s in data["sources"])
    assert all("***" in a["source"] for a in data["assignments"].values())


def test_a_restore_report_holds_no_credential(secret_urls):
    import tensorflow as tf

    v = tf.Variable(np.zeros_like(W), name="w")
    report = cm.restore({"w": v}, [cm.Source(secret_urls["b"])])
    np.testing.assert_array_equal(v.numpy(), W * 2)
    _no_secret(report.render(), json.dumps(report.to_dict()), str(report.plan.report()))


def test_a_remote_merge_output_with_credentials_is_reported_redacted(secret_urls, tmp_path):
    out = f"{secret_urls['base']}/out/merged?token={SECRET}"
    report = cm.merge([cm.Source(secret_urls["a"])], out)
    _no_secret(report.summary(), report.render(), json.dumps(report.to_dict()))
    assert report.output == out  # the object keeps the URL it wrote to
    with pytest.raises(OutputExistsError) as info:
        cm.merge([cm.Source(secret_urls["a"])], out)
    _no_secret(str(info.value))


def test_the_reprs_of_sources_plans_reports_configs_and_checkpoints_show_no_credential(secret_urls, tmp_path):
    """What a REPL, a notebook cell or a log line shows of the library's objects (their repr)."""
    from ckptmerge.config.model import RemoteURL
    from ckptmerge.sources.resolved import CheckpointInfo

    source = cm.Source(secret_urls["a"])
    target = {"w": cm.list_variables(secret_urls["a"])[0]}
    plan = cm.plan(list(target.values()), [source])
    suggestion = cm.suggest(list(target.values()), [source])
    merged = cm.merge([source], str(tmp_path / "out.safetensors"), allow_missing="*")
    config = cm.load_config({"sources": [{"path": secret_urls["b"]}]})
    shown = [repr(source), repr(plan), repr(suggestion), repr(merged), repr(config), repr(config.urls),
             repr(CheckpointInfo(secret_urls["a"], 1, 0.0, 1, True)), repr(RemoteURL("output", secret_urls["b"], "x"))]
    _no_secret(*shown)
    assert all("***" in text for text in shown)
    assert source.path == secret_urls["a"] and config.sources[0].path == secret_urls["b"]  # the data stays exact


# -- record_paths: no path in the output's metadata ---------------------------------------------


@pytest.fixture
def local_sources(tmp_path):
    a, b = tmp_path / "private-alice" / "a.safetensors", tmp_path / "private-alice" / "b.safetensors"
    a.parent.mkdir()
    a.write_bytes(_safetensors_bytes(tmp_path, {"w": W}))
    b.write_bytes(_safetensors_bytes(tmp_path, {"v": W[0]}))
    return a, b


def test_record_paths_false_leaves_every_path_out_of_the_metadata(local_sources, tmp_path):
    a, b = local_sources
    out = tmp_path / "out.safetensors"
    cm.merge([cm.Source(str(a), name="base"), cm.Source(str(b))], str(out), record_paths=False)
    raw = out.read_bytes()
    assert b"private-alice" not in raw and str(tmp_path).encode() not in raw
    meta = _metadata(out)
    assert json.loads(meta["ckptmerge.sources"]) == [{"label": "base"}, {"label": "source 2"}]
    assert json.loads(meta["ckptmerge.plan"]) == {"v": "source 2:v", "w": "base:w"}


@pytest.mark.parametrize("record_paths", [True, False])
def test_an_orbax_output_records_its_sources_redacted_or_by_name_only(secret_urls, local_sources, tmp_path, record_paths):
    pytest.importorskip("tensorstore")
    a, _ = local_sources
    out = tmp_path / "orbax-out"
    cm.merge([cm.Source(str(a), name="base"), cm.Source(secret_urls["b"], exclude=["w"])], str(out), format="orbax",
             record_paths=record_paths, allow_missing="*")
    meta = json.loads((out / "_CHECKPOINT_METADATA").read_text())["custom_metadata"]["ckptmerge"]
    written = b"".join(p.read_bytes() for p in out.rglob("*") if p.is_file())
    _no_secret(written.decode("latin-1"))
    assert (b"private-alice" in written) is record_paths
    if record_paths:
        assert meta["sources"][1]["path"].startswith("memory://***@")
    else:
        assert meta["sources"] == [{"label": "base"}, {"label": "source 2"}]


def test_record_paths_default_records_them(local_sources, tmp_path):
    a, _ = local_sources
    out = tmp_path / "out.safetensors"
    cm.merge([cm.Source(str(a))], str(out))
    sources = json.loads(_metadata(out)["ckptmerge.sources"])
    assert sources[0]["path"] == str(a) and sources[0]["label"] == str(a)


@pytest.mark.parametrize("config_value, flag, recorded", [(None, None, True), ("false", None, False),
                                                          ("true", "--no-record-paths", False),
                                                          ("false", "--record-paths", True), (None, "--no-record-paths", False)])
def test_record_paths_from_the_config_and_the_cli_flag(local_sources, tmp_path, config_value, flag, recorded):
    a, _ = local_sources
    cfg = _config(tmp_path, a, **({"record_paths": config_value} if config_value else {}))
    out = tmp_path / "out.safetensors"
    r = run("merge", cfg, "-o", out, *([flag] if flag else []))
    assert r.exit_code == 0, r.output
    assert (b"private-alice" in out.read_bytes()) is recorded


def test_record_paths_must_be_a_bool(local_sources, tmp_path):
    a, _ = local_sources
    with pytest.raises(cm.ArgumentTypeError, match="record_paths must be True or False"):
        cm.merge([cm.Source(str(a))], str(tmp_path / "o.safetensors"), record_paths="no")
    cfg = _config(tmp_path, a, record_paths="'no'")
    r = run("check", cfg)
    assert r.exit_code == 2 and "record_paths" in r.stderr and "expected true or false" in r.stderr
    assert "warm.yaml:3" in r.stderr


def test_record_paths_round_trips_through_config_to_dict(local_sources):
    a, _ = local_sources
    cfg = cm.load_config({"sources": [{"path": str(a)}], "record_paths": False})
    assert cfg.record_paths is False and cfg.to_dict()["record_paths"] is False
    assert cm.load_config(cfg.to_dict()) == cfg
    assert "record_paths" not in cm.load_config({"sources": [{"path": str(a)}]}).to_dict()
