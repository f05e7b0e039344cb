"""mkdocs hooks: the site's home page is the README, so the front door has one source.

``docs/index.md`` is a stub; at build time its text is replaced by ``README.md`` with the links
into ``docs/`` made relative to the site (``docs/config.md`` -> ``config.md``), so the strict
build checks the README's links and anchors like any page's. And 404.html works wherever the
site is served, below the root of a host too (see "404.html below the root of a host" below).
"""

from __future__ import annotations

import json
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


# ------------------------------------------------------------------------------------------------
# 404.html below the root of a host
#
# A server answers every missing URL (``/docs/restore/typo``, ``/docs/a/b/c``) with the site's one
# 404.html, so its links cannot be relative to where it is. mkdocs makes them absolute from the
# path of ``site_url``; without a ``site_url`` that path is ``/``, and a site served below the root
# of its host (``https://host/docs/``) gets a 404 page without styles whose links all lead out of
# the site. When the docs are built without ``site_url`` (``CKPTMERGE_DOCS_URL`` unset), the hook
# makes 404.html's links relative to the site's root and puts in front of them a small script
# that finds that root where the page is served: the deepest folder of the URL's path that holds
# 404.html (one ``HEAD`` request a level; ``/`` when none answers), set as the page's ``<base>``.

#: Where the site's root is, for a missing URL's ``path``: the deepest folder of it for which
#: ``exists(folder + "404.html")``; "/" when there is none.
FIND_ROOT_JS = ('function(path,exists){var d=path.replace(/[^/]*$/,"");for(;;){if(exists(d+"404.html"))'
                'return d;if(d==="/"||d==="")return "/";d=d.replace(/[^/]*\\/$/,"")}}')
HEAD_SCRIPT = ('<script>(function(root){function exists(u){var x=new XMLHttpRequest();try{x.open("HEAD",u,false);'
               'x.send();return x.status>=200&&x.status<300}catch(e){return false}}'
               'var b=document.createElement("base");b.href=root(location.pathname,exists);'
               'document.head.appendChild(b)})(' + FIND_ROOT_JS + ')</script>')
#: Material reads its base URL from the __config JSON, against the page's location: made the root
CONFIG_SCRIPT = ('<script>(function(c){var j=JSON.parse(c.textContent),b=document.baseURI;j.base=b;'
                 'j.search=new URL(j.search,b).href;c.textContent=JSON.stringify(j)})'
                 '(document.getElementById("__config"))</script>')
ROOT_LINK = re.compile(r'\b(href|src)="/(?!/)')
CONFIG = re.compile(r'(<script id="__config" type="application/json">)(.*?)(</script>)', re.S)


def not_found_page_anywhere(html: str) -> str:
    """404.html with its links relative to the site's root and the script that finds the root.

    Example:
        >>> page = not_found_page_anywhere('<head><link href="/assets/x.css"></head><a href="/.">')
        >>> 'href="assets/x.css"' in page and 'href="."' in page and "<base" not in page
        True
    """
    html = ROOT_LINK.sub(r'\1="', html)
    html = html.replace('__md_scope=new URL("/",location)', '__md_scope=new URL(".",document.baseURI)')

    def config(m):
        data = json.loads(m.group(2))
        data["base"] = "."
        data["search"] = data["search"].lstrip("/")
        return m.group(1) + json.dumps(data) + m.group(3) + CONFIG_SCRIPT

    html = CONFIG.sub(config, html, count=1)
    return html.replace("<head>", "<head>" + HEAD_SCRIPT, 1)


def on_post_build(config) -> None:
    if config.site_url:  # mkdocs made its links absolute from site_url's path: right on that host
        return
    page = Path(config.site_dir) / "404.html"
    if page.exists():
        page.write_text(not_found_page_anywhere(page.read_text(encoding="utf-8")), encoding="utf-8")
