"""The documentation site builds with ``mkdocs build --strict``, and its API reference covers the API.

The strict build fails on any warning: a page missing from ``nav``, a link to a page or an anchor
that does not exist (the README's links included: it is the site's home page), a reference that
mkdocstrings cannot resolve, a docstring Griffe cannot parse. Running it here keeps `.ci/run` the
README's test command and nothing more.
"""

from __future__ import annotations

import importlib.util
import json
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
    env.pop("CKPTMERGE_DOCS_URL", None)  # the site as built without a site_url
    return subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
                          cwd=root, env=env, capture_output=True, text=True, timeout=300)


def _script(name):
    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    """The site as the docs build makes it, without a site_url (built once for this module)."""
    site = tmp_path_factory.mktemp("docs") / "site"
    result = _build(ROOT, site)
    return site, result.returncode, result.stdout + result.stderr


def test_site_builds_strict_without_a_warning(site):
    site, returncode, log = site
    assert returncode == 0 and "WARNING" not in log, log
    home = (site / "index.html").read_text(encoding="utf-8")
    assert "Quick start" in home and 'href="restore/' in home  # the README, its links made relative
    reference = (site / "reference" / "index.html").read_text(encoding="utf-8")
    assert 'id="ckptmerge.Source"' in reference and 'id="ckptmerge.PlanError"' in reference
    # signatures are wrapped, one parameter a line (ruff formats them), not one long line
    signature = reference[reference.index('id="ckptmerge.plan"'):].split("</code>", 1)[0]
    assert '<span class="nf">plan</span><span class="p">(</span>\n    <span class="n">target</span>' in signature
    for page in (home, reference):  # the site works offline: no web fonts, no font CDN
        assert "fonts.googleapis" not in page and "fonts.gstatic" not in page


LINK = re.compile(r'\b(?:href|src)="([^"]*)"')


def _file_of(site: Path, link: str) -> Path:
    path = site / link.split("#")[0].split("?")[0]
    return path / "index.html" if path.is_dir() else path


def test_404_page_links_work_below_the_root_of_a_host(site):
    # A server answers every missing URL with the one 404.html: served at /docs/, the page of
    # /docs/a/b/missing must still find its styles, scripts and pages under /docs/.
    site, returncode, _ = site
    assert returncode == 0
    page = (site / "404.html").read_text(encoding="utf-8")
    links = [link for link in LINK.findall(page) if not re.match(r"[a-z]+:", link)]
    assert len(links) > 20 and not [link for link in links if link.startswith("/")], links
    assert [link for link in links if not _file_of(site, link).is_file()] == []
    hooks = _script("mkdocs_hooks")
    head = page[page.index("<head>"):]
    assert head.index(hooks.HEAD_SCRIPT) < min(head.index('href="'), head.index('src="'))  # <base> first
    config = json.loads(re.search(r'<script id="__config" type="application/json">(.*?)</script>', page).group(1))
    assert config["base"] == "." and (site / config["search"]).is_file()
    assert hooks.CONFIG_SCRIPT in page and "new URL(\"/\"" not in page
    node = shutil.which("node")
    if node is None:
        pytest.skip("node not found: the root-finding script is not run")
    for script in (hooks.HEAD_SCRIPT, hooks.CONFIG_SCRIPT):
        check = subprocess.run([node, "--check", "-"], input=script[len("<script>"):-len("</script>")],
                               capture_output=True, text=True, timeout=60)
        assert check.returncode == 0, check.stderr
    # The root the script finds, with the server's answers: HEAD MOUNT/404.html is the only 200
    cases = {"/": ["/missing", "/a/b/missing", "/restore/typo", "/404.html", "/"],
             "/docs/": ["/docs/missing", "/docs/a/b/c/missing", "/docs/restore/typo/", "/docs/"],
             "/a/docs/": ["/a/docs/x/y"]}
    program = (f"const root = {hooks.FIND_ROOT_JS};\n"
               f"const cases = {json.dumps(cases)};\n"
               "const out = {};\n"
               "for (const [mount, paths] of Object.entries(cases))\n"
               "  out[mount] = paths.map(p => root(p, u => u === mount + '404.html'));\n"
               "console.log(JSON.stringify(out));\n")
    found = subprocess.run([node, "-e", program], capture_output=True, text=True, timeout=60)
    assert found.returncode == 0, found.stderr
    assert json.loads(found.stdout) == {mount: [mount] * len(paths) for mount, paths in cases.items()}
    none = subprocess.run([node, "-e", f"console.log(({hooks.FIND_ROOT_JS})('/docs/a/x', u => false))"],
                          capture_output=True, text=True, timeout=60)
    assert none.stdout.strip() == "/"  # no answer: mkdocs' own guess, the host's root


def test_404_page_is_left_as_mkdocs_makes_it_when_site_url_is_set(tmp_path):
    hooks = _script("mkdocs_hooks")
    (tmp_path / "404.html").write_text('<head><link href="/docs/x.css"></head>', encoding="utf-8")

    class Config:
        site_url, site_dir = "https://host/docs/", str(tmp_path)

    hooks.on_post_build(Config())
    assert (tmp_path / "404.html").read_text(encoding="utf-8") == '<head><link href="/docs/x.css"></head>'
    Config.site_url = None
    hooks.on_post_build(Config())
    assert 'href="docs/x.css"' in (tmp_path / "404.html").read_text(encoding="utf-8")


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
