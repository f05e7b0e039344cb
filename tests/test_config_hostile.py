"""Hostile config files: alias bombs, deep nesting, paths that are not regular files.

Before these were handled, some of the files below made ``ckptmerge check`` run for minutes, read
until memory ran out, or wait forever. Those cases run ``ckptmerge check`` in a fresh interpreter
with a time limit and a memory limit, so that a regression fails the test instead of the machine.
"""

from __future__ import annotations

import os
import resource
import threading
from pathlib import Path

import pytest
from _cli_util import run_subprocess
from conftest import run_child

from ckptmerge.config import MAX_CONFIG_BYTES, MAX_NESTING, load_config
from ckptmerge.core.errors import ConfigError
from ckptmerge.planning.transforms import TransformError, read_vocab


def check_in_subprocess(config: Path, timeout: float = 120) -> dict:
    """``ckptmerge check CONFIG`` in a fresh interpreter, with 2 GiB of address space at most.

    ``subprocess.TimeoutExpired`` (the test fails) if it does not finish within ``timeout``
    seconds; the limit is generous: the fixed cases take well under a second.
    """
    def limit_memory() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))

    return run_subprocess(["check", config.name], config.parent, timeout=timeout, preexec_fn=limit_memory)


def one_problem(source) -> str:
    with pytest.raises(ConfigError) as e:
        load_config(source)
    assert len(e.value.problems) == 1, e.value.problems
    return e.value.problems[0]


# --------------------------------------------------------------------------------------------
# YAML aliases
# --------------------------------------------------------------------------------------------


def billion_laughs(levels: int = 9) -> str:
    """The classic: each anchor is a list of nine aliases of the previous one (9**9 values)."""
    lines = ['a0: &a0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    for i in range(1, levels):
        lines.append(f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 9) + "]")
    lines.append(f"sources: *a{levels - 1}")
    return "\n".join(lines) + "\n"


def test_billion_laughs_is_refused_promptly_with_the_line(tmp_path):
    config = tmp_path / "bomb.yaml"
    config.write_text(billion_laughs(), encoding="utf-8")
    assert config.stat().st_size < 1024
    proc = check_in_subprocess(config)
    assert proc['code'] == 2, proc['stderr']
    assert proc['stdout'] == ""
    assert proc['stderr'].startswith("Error: 1 problem in bomb.yaml:\n  bomb.yaml:")
    assert "YAML aliases expand this value to more than 100,000 values" in proc['stderr']
    assert "alias bomb" in proc['stderr'] and "Traceback" not in proc['stderr']


def test_merge_key_bomb_is_refused(tmp_path):
    # Each mapping merges the previous one twice: PyYAML's merge would copy 2**40 entries.
    lines = ["m0: &m0 {k0: 1, k1: 2}"]
    lines += [f"m{i}: &m{i} {{<<: [*m{i - 1}, *m{i - 1}], j{i}: 1}}" for i in range(1, 40)]
    config = tmp_path / "merge.yaml"
    config.write_text("\n".join(lines + ["sources: [*m39]"]) + "\n", encoding="utf-8")
    proc = check_in_subprocess(config)
    assert proc['code'] == 2, proc['stderr']
    assert "YAML aliases expand this value to more than 100,000 values" in proc['stderr']


def test_alias_chain_deeper_than_the_nesting_limit_is_refused(tmp_path):
    # Each anchor holds the last one's alias: shallow in the file, 3,000 levels deep as data.
    lines = ["a0: &a0 [x]"] + [f"a{i}: &a{i} [*a{i - 1}]" for i in range(1, 3000)]
    config = tmp_path / "chain.yaml"
    config.write_text("\n".join(lines + ["sources: *a2999"]) + "\n", encoding="utf-8")
    proc = check_in_subprocess(config)  # walking every path once took memory cubic in the length
    assert proc['code'] == 2, proc['stderr']
    assert proc['stderr'].startswith("Error: 1 problem in chain.yaml:\n  chain.yaml:")
    assert proc['stderr'].endswith(f"lists and mappings nested more than {MAX_NESTING} levels deep, the "
                                   "most accepted (a config needs fewer than 10)\n")


def test_aliases_and_merge_keys_within_limits_still_work(tmp_path):
    (tmp_path / "runs").mkdir()
    config = tmp_path / "warm.yaml"
    config.write_text("sources:\n"
                      "  - &base {path: runs, exclude: ['*/Adam*'], name: a}\n"
                      "  - {<<: *base, name: b}\n"
                      "  - {<<: *base, name: c, step: -1}\n", encoding="utf-8")
    # Lines stay exact for what is written out, and the alias's own keys keep the anchor's line.
    assert one_problem(config) == ("warm.yaml:4 sources[2].step: expected a global step (an integer >= 0), "
                                   "or null for the latest, received integer -1")
    config.write_text(config.read_text().replace(", step: -1", ""), encoding="utf-8")
    cfg = load_config(config)
    assert [s.name for s in cfg.sources] == ["a", "b", "c"]
    assert {tuple(s.exclude) for s in cfg.sources} == {("*/Adam*",)}


def test_a_recursive_alias_is_a_problem_not_a_crash(tmp_path):
    config = tmp_path / "rec.yaml"
    config.write_text("sources: &a [*a]\n", encoding="utf-8")
    assert one_problem(config) == ("rec.yaml:1 sources[0]: expected a source (a mapping with at least "
                                   "'path'), received list [[[[...]]]]")


# --------------------------------------------------------------------------------------------
# Deep nesting
# --------------------------------------------------------------------------------------------


NESTED = {
    ".yaml": "sources: {open}{close}\n",
    ".json": '{{"sources": {open}{close}}}\n',
    ".toml": "sources = {open}{close}\n",
}


@pytest.mark.parametrize("ext", sorted(NESTED))
@pytest.mark.parametrize("depth", [990, 5000])
def test_deep_nesting_is_a_config_error_with_the_line(tmp_path, ext, depth):
    config = tmp_path / f"deep{ext}"
    config.write_text("\n" + NESTED[ext].format(open="[" * depth, close="]" * depth), encoding="utf-8")
    assert one_problem(config) == (f"deep{ext}:2: lists and mappings nested more than {MAX_NESTING} "
                                   "levels deep, the most accepted (a config needs fewer than 10)")


@pytest.mark.parametrize("ext", sorted(NESTED))
def test_nesting_up_to_the_limit_reaches_validation(tmp_path, ext):
    depth = MAX_NESTING - 2  # inside the top-level mapping, and YAML counts the innermost scalar
    config = tmp_path / f"deep{ext}"
    config.write_text(NESTED[ext].format(open="[" * depth + "1", close="]" * depth), encoding="utf-8")
    assert one_problem(config).endswith(
        "sources[0]: expected a source (a mapping with at least 'path'), received list [[[[...]]]]")


def test_brackets_inside_strings_and_comments_do_not_count(tmp_path):
    deep = "[" * 500
    config = tmp_path / "warm.toml"
    config.write_text(f'# {deep}\n[[sources]]\npath = "{deep}"\nname = \'{deep}\'\n'
                      f'include = ["""{deep}"""]\n', encoding="utf-8")
    assert "checkpoint '[[[" in one_problem(config)
    config = tmp_path / "warm.json"
    config.write_text(f'{{"sources": [{{"path": "{deep}\\"#{deep}"}}]}}\n', encoding="utf-8")
    assert "checkpoint '[[[" in one_problem(config)


# --------------------------------------------------------------------------------------------
# Paths that are not regular files
# --------------------------------------------------------------------------------------------


def test_symlink_to_dev_zero_is_refused_without_reading(tmp_path):
    config = tmp_path / "zero.yaml"
    config.symlink_to("/dev/zero")
    proc = check_in_subprocess(config)
    assert proc['code'] == 2, proc['stderr']
    assert proc['stderr'] == ("Error: 1 problem in zero.yaml:\n  zero.yaml: is a symbolic link to '/dev/zero', "
                           "which is a character device, not a regular file; expected a .yaml, .yml, "
                           ".toml or .json file\n")


def test_fifo_is_refused_promptly(tmp_path):
    config = tmp_path / "pipe.yaml"
    os.mkfifo(config)
    proc = check_in_subprocess(config, timeout=60)
    assert proc['code'] == 2, proc['stderr']
    assert "pipe.yaml: is a FIFO (named pipe), not a regular file; expected a .yaml" in proc['stderr']


def test_directory_is_refused(tmp_path):
    (tmp_path / "conf.json").mkdir()
    assert one_problem(tmp_path / "conf.json") == (
        "conf.json: is a directory; expected a .yaml, .yml, .toml or .json file")


def test_dangling_symlink_says_where_it_points(tmp_path):
    (tmp_path / "warm.yaml").symlink_to("gone.yaml")
    assert one_problem(tmp_path / "warm.yaml") == (
        "warm.yaml: is a symbolic link to 'gone.yaml', which does not exist; expected a .yaml, .yml, "
        ".toml or .json file")


def test_config_larger_than_the_cap_is_refused(tmp_path):
    config = tmp_path / "big.yaml"
    with open(config, "wb") as f:
        f.truncate(MAX_CONFIG_BYTES + 1)  # sparse: nothing is written
    assert one_problem(config) == ("big.yaml: is 16,777,217 bytes, larger than the 16.0 MiB (16,777,216 "
                                   "bytes) accepted for this kind of file; expected a .yaml, .yml, "
                                   ".toml or .json file")


def test_vocab_file_that_is_a_fifo_or_a_device_is_refused(tmp_path):
    fifo = tmp_path / "vocab.txt"
    os.mkfifo(fifo)

    def unblock() -> None:  # were the FIFO opened for reading, a writer coming and going ends the wait
        try:
            os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        except OSError:
            pass  # no reader: the FIFO was refused without being opened

    timer = threading.Timer(10, unblock)
    timer.start()
    try:
        with pytest.raises(TransformError, match=r"is a FIFO \(named pipe\), not a regular file; expected "
                                                 "a text file with one token per line"):
            read_vocab(fifo)
    finally:
        timer.cancel()
    (tmp_path / "zero.txt").symlink_to("/dev/zero")
    found = run_child("""
        import json, resource, sys
        resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))  # reading /dev/zero stops here
        from ckptmerge.planning.transforms import TransformError, read_vocab
        try:
            read_vocab(sys.argv[1])
        except TransformError as e:
            print(json.dumps(str(e)))
        """, tmp_path / "zero.txt")
    assert found == (f"vocab file '{tmp_path / 'zero.txt'}' is a symbolic link to '/dev/zero', which is a "
                     "character device, not a regular file; expected a text file with one token per line.")
