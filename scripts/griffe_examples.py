"""A Griffe extension for the API reference: ckptmerge's docstrings read as Google style intends.

Two conventions of our docstrings that Griffe would otherwise render badly:

- ``Example:`` (the singular, as in Google's style guide) is an examples section; Griffe takes
  only ``Examples:`` as one and shows the singular as an admonition whose ``>>>`` lines are
  parsed as Markdown (so ``cfg["sources"][0]`` became a broken link).
- Sphinx roles (``:class:`Report```, ``:meth:`switch```) become code spans, as the docstrings
  show them to ``help()`` readers; they name internal paths that the reference does not document.

Loaded by ``mkdocs.yml`` (``extensions: [scripts/griffe_examples.py:ExampleSections]``).
"""

from __future__ import annotations

import re
from typing import Any

import griffe

EXAMPLE = re.compile(r"^(\s*)Example:[ \t]*$", re.M)
ROLE = re.compile(r":(?:class|meth|func|mod|attr|exc|data|obj):`~?([^`]+)`")


def docstring_for_reference(text: str) -> str:
    """The docstring text with ``Example:`` as an examples section and Sphinx roles as code.

    Example:
        >>> docstring_for_reference("See :class:`ckptmerge.Report`.\\n\\nExample:\\n    >>> 1\\n")
        'See `ckptmerge.Report`.\\n\\nExamples:\\n    >>> 1\\n'
    """
    return ROLE.sub(r"`\1`", EXAMPLE.sub(r"\1Examples:", text))


class ExampleSections(griffe.Extension):
    """Rewrites each docstring once, when Griffe has loaded its object."""

    def on_object(self, *, obj: Any, **kwargs: Any) -> None:  # noqa: ARG002 (Griffe hook signature)
        if obj.docstring is not None:
            obj.docstring.value = docstring_for_reference(obj.docstring.value)
