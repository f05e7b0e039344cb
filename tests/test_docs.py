"""The documentation site builds with ``mkdocs build --strict``, and its API reference covers the API.

The strict build fails on any warning: a page missing from ``nav``, a link to a page or an anchor
that does not exist (the README's links included: it is the site's home page), a reference that
mkdocstrings cannot resolve, a docstring Griffe cannot parse. Running it here keeps `.ci/run` the
README's test command and nothing more.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import griffe
import pytest

import ckptmerge

ROOT = Path(__file__).resolve().parents[1]
REFERENCE = ROOT / "docs" / "reference.md"


def _build(root: Path, site: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    return subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
                          cwd=root, env=env, capture_output=True, text=True, timeout=300)


def _script(name):
    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_site_builds_strict_without_a_warning(tmp_path):
    result = _build(ROOT, tmp_path / "site")
    log = result.stdout + result.stderr
    assert result.returncode == 0 and "WARNING" not in log, log
    home = (tmp_path / "site" / "index.html").read_text(encoding="utf-8")
    assert "Quick start" in home and 'href="restore/' in home  # the README, its links made relative
    reference = (tmp_path / "site" / "reference" / "index.html").read_text(encoding="utf-8")
    assert 'id="ckptmerge.Source"' in reference and 'id="ckptmerge.PlanError"' in reference
    # signatures are wrapped, one parameter a line (ruff formats them), not one long line
    signature = reference[reference.index('id="ckptmerge.plan"'):].split("</code>", 1)[0]
    assert '<span class="nf">plan</span><span class="p">(</span>\n    <span class="n">target</span>' in signature
    for page in (home, reference):  # the site works offline: no web fonts, no font CDN
        assert "fonts.googleapis" not in page and "fonts.gstatic" not in page


def test_strict_build_fails_on_a_broken_anchor_and_an_unknown_reference(tmp_path):
    copy = tmp_path / "repo"
    shutil.copytree(ROOT / "docs", copy / "docs")
    shutil.copytree(ROOT / "scripts", copy / "scripts", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "mkdocs.yml", copy)
    (copy / "ckptmerge").symlink_to(ROOT / "ckptmerge")
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    (copy / "README.md").write_text(readme.replace("(docs/restore.md#how-restores-work)",
                                                   "(docs/restore.md#no-such-section)"), encoding="utf-8")
    result = _build(copy, tmp_path / "site")
    assert result.returncode != 0
    assert "no-such-section" in result.stdout + result.stderr
    (copy / "README.md").write_text(readme, encoding="utf-8")
    with open(copy / "docs" / "reference.md", "a", encoding="utf-8") as f:
        f.write("\n::: ckptmerge.NoSuchName\n")
    result = _build(copy, tmp_path / "site")
    assert result.returncode != 0
    assert "ckptmerge.NoSuchName" in result.stdout + result.stderr


def test_the_reference_documents_every_public_name_once():
    documented = re.findall(r"^::: ckptmerge\.(\w+)$", REFERENCE.read_text(encoding="utf-8"), re.M)
    assert sorted(documented) == sorted(set(documented)), "a name documented twice"
    assert sorted(documented) == sorted(ckptmerge.__all__)


@pytest.fixture(scope="module")
def package():
    return griffe.load("ckptmerge", search_paths=[str(ROOT)], docstring_parser="google")


@pytest.mark.parametrize("name", ckptmerge.__all__)
def test_griffe_resolves_each_lazy_public_name_to_its_definition(package, name):
    # ckptmerge/__init__.py imports most names lazily (PEP 562): Griffe sees them through the
    # TYPE_CHECKING imports, which must name the module that really defines each one.
    obj = package[name].final_target if package[name].is_alias else package[name]
    runtime = getattr(ckptmerge, name)
    assert obj.path == f"{runtime.__module__}.{runtime.__qualname__}"
    assert obj.docstring is not None and obj.docstring.value.strip(), f"ckptmerge.{name} has no docstring"


def test_readme_links_into_docs_become_site_links():
    hooks = _script("mkdocs_hooks")
    assert hooks.readme_as_page("[a](docs/config.md#regex-dialect), [b](https://x/docs/y)") == \
        "[a](config.md#regex-dialect), [b](https://x/docs/y)"


def test_docstrings_read_as_google_style_in_the_reference():
    examples = _script("griffe_examples")
    text = examples.docstring_for_reference("Uses :class:`~ckptmerge.Report`.\n\n    Example:\n        >>> x[0]\n")
    assert text == "Uses `ckptmerge.Report`.\n\n    Examples:\n        >>> x[0]\n"
    sections = griffe.Docstring(text, parser="google").parsed
    assert [s.kind.value for s in sections] == ["text", "examples"]
