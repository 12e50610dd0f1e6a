"""Griffe extension: render the reST idioms of our docstrings as Markdown.

The sources use numpydoc sections (parsed by mkdocstrings) plus two reST
idioms that Markdown would print literally:

- roles such as ``:func:`~llamppl.inference.smc_steer` `` become inline code
  (`` `smc_steer` ``; a leading ``~`` keeps only the last dotted component);
- a paragraph ending in ``::`` (reST "literal block follows") ends in ``:``.
  The indented block after it is already a Markdown code block.

Double-backquoted literals are valid Markdown code spans and are left alone.
"""

from __future__ import annotations

import re
from typing import Any

import griffe

_ROLE = re.compile(r":(?:py:)?(?:func|class|meth|mod|attr|data|obj|exc|const):`(~?)([^`]+)`")
_LITERAL = re.compile(r"(\S)::[ \t]*$", re.M)


def _role(m: re.Match) -> str:
    target = m.group(2).strip()
    if m.group(1):
        target = target.rsplit(".", 1)[-1]
    return f"`{target}`"


def to_markdown(text: str) -> str:
    """Rewrite reST roles and ``::`` literal-block markers of ``text`` as Markdown."""
    return _LITERAL.sub(r"\1:", _ROLE.sub(_role, text))


class RestToMarkdown(griffe.Extension):
    """Apply :func:`to_markdown` to every docstring griffe loads."""

    def on_instance(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        if obj.docstring is not None:
            obj.docstring.value = to_markdown(obj.docstring.value)
