"""Every ```python block in docs/ runs as written.

Blocks of one page run in order in one namespace (like a notebook), so a page
may define a model in one block and run it in the next. A block is tagged by an
HTML comment on the line just before its fence:

- ``<!-- docs-test: skip (reason) -->`` — never run (e.g. top-level ``await``);
- ``<!-- docs-test: embedded -->`` — needs the embedded SmolLM2; run only with
  ``LLAMPPL_DOCS_EMBEDDED=1`` (they take minutes; the examples' smoke tests
  cover the same code paths in CI).

Untagged blocks always run; they use ``FunctionLM`` and are fast. An unknown
tag is an error. Tracebacks point at the Markdown file and line.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

DOCS = Path(__file__).resolve().parent.parent / "docs"
FENCE = re.compile(r"^```python[ \t]*\n(.*?)^```[ \t]*$", re.M | re.S)
TAG = re.compile(r"<!--\s*docs-test:\s*(\w+)[^>]*-->\s*$")
TAGS = {"skip", "embedded"}
RUN_EMBEDDED = os.environ.get("LLAMPPL_DOCS_EMBEDDED") == "1"


def blocks(page: Path) -> list[tuple[int, str | None, str]]:
    """``(line number, tag or None, code)`` of every ```python block of ``page``."""
    text = page.read_text(encoding="utf-8")
    out = []
    for m in FENCE.finditer(text):
        before = text[: m.start()].rstrip("\n").rsplit("\n", 1)[-1]
        tag = TAG.search(before)
        out.append((text.count("\n", 0, m.start()) + 1, tag.group(1) if tag else None, m.group(1)))
    return out


PAGES = sorted(p for p in DOCS.rglob("*.md") if blocks(p))


def test_pages_found():
    assert len(PAGES) >= 5, f"expected the guide pages with code under {DOCS}, found {PAGES}"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(DOCS)))
def test_page_snippets_run(page: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    monkeypatch.setenv("LLAMPPL_PROGRESS", "0")
    monkeypatch.chdir(tmp_path)
    found = blocks(page)
    unknown = [(line, tag) for line, tag, _ in found if tag is not None and tag not in TAGS]
    assert not unknown, f"{page.name}: unknown docs-test tags {unknown}; allowed: {sorted(TAGS)}"
    runnable = [
        (line, code)
        for line, tag, code in found
        if tag is None or (tag == "embedded" and RUN_EMBEDDED)
    ]
    if not runnable:
        pytest.skip(f"{page.name}: every block needs the embedded model (LLAMPPL_DOCS_EMBEDDED=1)")
    namespace: dict[str, object] = {"__name__": f"docs_{page.stem}"}
    for line, code in runnable:
        try:
            exec(compile("\n" * line + code, str(page), "exec"), namespace)
        except Exception as exc:
            raise AssertionError(
                f"{page.relative_to(DOCS)}, block at line {line} failed: {exc!r}"
            ) from exc
