"""The examples of the README and the docs pages, found by their tags, and how to run and check them.

Each example block in README.md and docs/*.md is preceded by ``<!-- readme-test: NAME -->``; NAME
(unique across the pages) names the example, and a test marked ``@runs("NAME")`` runs it
(tests/test_readme.py for the README's and the reference pages' examples, tests/test_recipes.py
for the Recipes page). An example may be followed by the output it prints, as a ```` ```text ````
block; a tagged ```` ```console ```` block holds ``$ ckptmerge ...`` lines, each followed by the
output of that command. In an expected output a line ``...`` stands for any number of lines and
``...`` inside a line for any text (a duration, say); everything else must be printed as shown.
"""

from __future__ import annotations

import ast
import contextlib
import io
import re
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Dict, List, Optional, Tuple

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
BLOCK = re.compile(r"<!-- readme-test: ([\w-]+) -->\n```(\w+)\n(.*?)```\n", re.S)
OUTPUT = re.compile(r"\n*```text\n(.*?)```", re.S)

#: the tags some test runs (filled by @runs when the test modules are imported)
TESTED: set = set()


def runs(*tags):
    """Marks a test as the one that runs the examples tagged ``tags``."""
    TESTED.update(tags)
    return lambda test: test


@dataclass(frozen=True)
class Example:
    where: str                 # page:line of the tag
    language: str              # python, yaml, console, ...
    code: str
    output: Optional[str]      # the ```text block right after it, if any


def _where(page, text, offset):
    return f"{page.relative_to(ROOT)}:{text.count(chr(10), 0, offset) + 1}"


def blocks(pages=PAGES) -> Tuple[Dict[str, Example], List[str], List[str]]:
    """({tag: Example}, [page:line of untagged python blocks], [repeated tags])."""
    tagged, untagged, repeated = {}, [], []
    for page in pages:
        text = page.read_text(encoding="utf-8")
        starts = set()
        for m in BLOCK.finditer(text):
            starts.add(m.start(3))
            if m.group(1) in tagged:
                repeated.append(m.group(1))
            out = OUTPUT.match(text, m.end())
            tagged[m.group(1)] = Example(_where(page, text, m.start()), m.group(2), m.group(3),
                                         out.group(1) if out else None)
        untagged += [_where(page, text, m.start()) for m in re.finditer(r"```python\n", text)
                     if m.end() not in starts]
    return tagged, untagged, repeated


def example(tag: str) -> Example:
    return blocks()[0][tag]


def block(tag: str) -> str:
    """The code of the example tagged ``tag``."""
    return example(tag).code


def assert_output(got: str, want: str, where: str = "") -> None:
    """``got`` reads as ``want``: line by line, ``...`` lines and ``...`` in a line as wildcards."""
    lines = []
    for line in want.rstrip("\n").split("\n"):
        if line.strip() == "...":
            lines.append(r"(?:[^\n]*\n)*?")
        else:
            lines.append(".*?".join(map(re.escape, line.rstrip().split("..."))) + r"[ \t]*\n")
    pattern = "".join(lines)
    text = "\n".join(line.rstrip() for line in got.rstrip("\n").split("\n")) + "\n"
    assert re.fullmatch(pattern, text), f"{where}: the output shown is not what runs\n--- shown:\n{want}\n--- printed:\n{got}"


def run_python(code: str, namespace: dict, notebook: bool = False) -> str:
    """Run ``code`` in ``namespace``; what it printed. As a ``notebook`` cell, also what Jupyter
    shows of a last bare expression (its ``_repr_html_``, else its ``repr``)."""
    tree = ast.parse(code)
    last = tree.body.pop() if notebook and tree.body and isinstance(tree.body[-1], ast.Expr) else None
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(tree, "<example>", "exec"), namespace)
        if last is not None:
            value = eval(compile(ast.Expression(last.value), "<example>", "eval"), namespace)
            if hasattr(value, "_repr_html_"):
                print(value._repr_html_())
            elif value is not None:
                print(repr(value))
    return out.getvalue()


def check_python(tag: str, namespace: dict, normalise: Callable[[str], str] = lambda s: s,
                 notebook: bool = False) -> str:
    """Run the example tagged ``tag`` (as a ``notebook`` cell: see :func:`run_python`); what it
    printed (through ``normalise``) must read as the output shown below it."""
    ex = example(tag)
    got = normalise(run_python(ex.code, namespace, notebook))
    if ex.output is not None:
        assert_output(got, ex.output, ex.where)
    return got


def check_console(tag: str, run: Callable, normalise: Callable[[str], str] = lambda s: s) -> None:
    """Run each ``$ ckptmerge ARGS`` of the console example tagged ``tag`` with ``run(*ARGS)``
    (a click ``Result``); its output must read as the lines shown under it. The exit code must be
    0, or the N of an ``exit N`` in the line's comment."""
    ex = example(tag)
    commands = re.split(r"^\$ ", ex.code, flags=re.M)
    assert commands[0] == "", f"{ex.where}: a console example starts with '$ '"
    for command in commands[1:]:
        line, _, want = command.partition("\n")
        code, _, comment = line.partition("  # ")
        args = shlex.split(code)
        assert args[0] == "ckptmerge", f"{ex.where}: not a ckptmerge command: {line}"
        result = run(*args[1:])
        expected = re.search(r"\bexit (\d+)", comment)
        assert result.exit_code == (int(expected.group(1)) if expected else 0), (line, result.output)
        if want.strip():
            assert_output(normalise(result.output), want, f"{ex.where} `{line}`")
