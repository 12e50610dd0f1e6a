"""What is certain about the paragraphs of a text prefix (pieces between ``"\\n\\n"``).

Every piece before the last delimiter is a final paragraph (no continuation changes it);
the open paragraph is read by :func:`~llamppl.decoding.text.prefix.analyze`. Used by the
paragraph-level constraints of :mod:`~llamppl.decoding.text.builders`.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from llamppl.decoding.text import units as tu
from llamppl.decoding.text.prefix import MEMO_SIZE, Analysis, analyze

__all__ = ["Paragraphs", "analyze_paragraphs"]


@dataclass(frozen=True)
class Paragraphs:
    """What is certain about a prefix's paragraphs (pieces between ``"\\n\\n"``).

    Attributes
    ----------
    final
        The judge's sentences of each final paragraph (every piece before the last
        delimiter, cleaned, then split), in order.
    final_words
        The judge's words of each final paragraph.
    open_text
        The open paragraph's text as the judge will clean it at its start (leading
        whitespace, then leading periods removed; its end is still open).
    open
        :func:`analyze` of ``open_text``.
    """

    final: tuple[tuple[str, ...], ...]
    final_words: tuple[tuple[str, ...], ...]
    open_text: str
    open: Analysis


@functools.lru_cache(maxsize=MEMO_SIZE)
def _final_paragraph(piece: str) -> tuple[tuple[str, ...], tuple[str, ...]]:
    cleaned = piece.strip().strip(".")
    return tuple(tu.sentences(cleaned)), tuple(tu.words(cleaned))


def _open_paragraph_text(piece: str) -> str:
    return piece.lstrip().lstrip(".")


def analyze_paragraphs(text: str, parent: str | None = None) -> Paragraphs:
    """The final paragraphs of the prefix ``text`` and the analysis of the open one.

    ``parent`` (a shorter prefix) only speeds the open paragraph's analysis up.
    """
    cut = text.rfind(tu.PARAGRAPH_DELIMITER)
    pieces = text[:cut].split(tu.PARAGRAPH_DELIMITER) if cut >= 0 else []
    split = [_final_paragraph(p) for p in pieces]
    open_text = _open_paragraph_text(text[cut + 2 :] if cut >= 0 else text)
    hint = None
    if parent is not None and parent.rfind(tu.PARAGRAPH_DELIMITER) == cut:
        hint = _open_paragraph_text(parent[cut + 2 :] if cut >= 0 else parent)
    return Paragraphs(
        tuple(s for s, _ in split), tuple(w for _, w in split), open_text, analyze(open_text, hint)
    )
