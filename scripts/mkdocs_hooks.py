"""mkdocs hooks: the site's home page is the README, so the front door has one source.

``docs/index.md`` is a stub; at build time its text is replaced by ``README.md`` with the links
into ``docs/`` made relative to the site (``docs/config.md`` -> ``config.md``), so the strict
build checks the README's links and anchors like any page's.
"""

from __future__ import annotations

import re
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"
DOCS_LINK = re.compile(r"\]\(docs/")


def readme_as_page(text: str) -> str:
    """The README's markdown with its ``docs/...`` links relative to the docs folder.

    Example:
        >>> readme_as_page("see [Config](docs/config.md#regex-dialect)")
        'see [Config](config.md#regex-dialect)'
    """
    return DOCS_LINK.sub("](", text)


def on_page_markdown(markdown: str, page, config, files) -> str:  # noqa: ARG001 (mkdocs hook signature)
    if page.file.src_uri == "index.md":
        return readme_as_page(README.read_text(encoding="utf-8"))
    return markdown
