r"""Vocabulary facts for text-structure constraints: what one token can add, and the fewest
tokens that can spell a string.

The constraints of :mod:`~llamppl.decoding.text.builders` end a particle when its text can
no longer be completed within the tokens left (``reachable``). A bound is only *sound* if
it holds for every token sequence the language model could produce, so each rests on facts
read from ``lm.vocab`` once per LM (kept on the LM, :func:`llamppl.lm.memo.lm_table`):

- :func:`token_lengths`, :func:`max_token_chars`: characters per token (SmolLM2: at most 81);
- :func:`char_codes`: every token's characters as COLLIE compares them (for batched masks);
- :func:`unit_growth`: the most judge words, sentence marks and newlines one token can add;
- :func:`layout_facts`: whether a token can straddle two pieces of text that whitespace or a
  sentence boundary separates (SmolLM2: no token has whitespace between two non-space
  characters, none has a sentence mark followed by a boundary punctuation and a letter, and
  no token holds a newline next to a non-space character);
- the fewest tokens that spell a string: :mod:`~llamppl.decoding.text.spelling`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import torch

from llamppl.decoding.text import units as tu
from llamppl.lm.base import LanguageModel
from llamppl.lm.memo import lm_table

__all__ = [
    "token_lengths",
    "max_token_chars",
    "char_key",
    "char_codes",
    "UnitGrowth",
    "unit_growth",
    "LayoutFacts",
    "layout_facts",
    "text_ids",
]

_NONWORD = "[)\";}\\]*:@'({\\[\u2018\u2019\u201c\u201d\xab\xbb?!]"  # Punkt's NonWord characters
_BOUNDARY_INSIDE = re.compile(f"[.?!]{_NONWORD}+\\S*?[^\\W_]")
_INNER_SPACE = re.compile(r"\S\s+\S")


def text_ids(lm: LanguageModel) -> list[int]:
    """Ids of the tokens that add text (every token but the end tokens)."""
    ends = set(lm.eos_token_ids)
    return [i for i in range(lm.vocab_size) if i not in ends]


def token_lengths(lm: LanguageModel) -> torch.Tensor:
    """``(V,)`` long on ``lm.device``: characters of each token's text (0 for end tokens)."""

    def build(lm: LanguageModel) -> torch.Tensor:
        ends = set(lm.eos_token_ids)
        n = [0 if i in ends else len(t) for i, t in enumerate(lm.vocab)]
        return torch.tensor(n, dtype=torch.long, device=lm.device)

    return lm_table(lm, "text_budget.token_lengths", build)


def max_token_chars(lm: LanguageModel) -> int:
    """The most characters one token adds (the longest token text)."""
    return int(token_lengths(lm).max())


def char_key(ch: str) -> str:
    """How COLLIE compares a character unit with a target: cleaned (whitespace and ``.`` are
    ``""``), then lower-cased, punctuation kept (its normalisation would leave nothing)."""
    return tu.normalize(ch.strip().strip("."))


def char_codes(lm: LanguageModel) -> tuple[torch.Tensor, dict[str, int]]:
    """Every token's characters as integer codes of :func:`char_key`.

    Returns
    -------
    tuple
        ``(codes, index)``: ``codes`` is ``(V, L)`` int32 on ``lm.device`` (``L`` the longest
        token; ``-1`` past a token's end), ``index`` maps a key to its code.
    """

    def build(lm: LanguageModel) -> tuple[torch.Tensor, dict[str, int]]:
        index: dict[str, int] = {}
        ends = set(lm.eos_token_ids)
        rows = [
            [] if i in ends else [index.setdefault(char_key(c), len(index)) for c in t]
            for i, t in enumerate(lm.vocab)
        ]
        width = max(1, max(map(len, rows)))
        codes = torch.full((lm.vocab_size, width), -1, dtype=torch.int32)
        for i, row in enumerate(rows):
            if row:
                codes[i, : len(row)] = torch.tensor(row, dtype=torch.int32)
        return codes.to(lm.device), index

    return lm_table(lm, "text_budget.char_codes", build)


@dataclass(frozen=True)
class UnitGrowth:
    """The most units one token can add to any text.

    Attributes
    ----------
    words
        Judge words: the token's own words (Treebank rules on the token alone) plus one, for
        the word of the text it joins being cut in two (``don`` + ``'t`` gives ``do``,
        ``n't``; ``can`` + ``not`` gives ``can``, ``not``).
    marks
        ``.``, ``?`` or ``!`` characters in one token: every sentence boundary sits at a mark.
    newlines
        Newlines in one token: a new paragraph delimiter needs at least one new newline.
    """

    words: int
    marks: int
    newlines: int


def unit_growth(lm: LanguageModel) -> UnitGrowth:
    """:class:`UnitGrowth` of ``lm``'s vocabulary (computed once per LM)."""

    def build(lm: LanguageModel) -> UnitGrowth:
        texts = [lm.vocab[i] for i in text_ids(lm)]
        plain = re.compile(r"\s*[A-Za-z]+\s*")
        contraction = re.compile(r"(?i)\s*(cannot|gimme|gonna|gotta|lemme|wanna)\s*")
        most = 1
        for t in texts:
            if plain.fullmatch(t) and not contraction.fullmatch(t):
                continue  # a run of letters is one word at most
            most = max(most, len(tu.span_words(" " + t + " ")))
        return UnitGrowth(
            words=most + 1,
            marks=max(1, max(t.count(".") + t.count("?") + t.count("!") for t in texts)),
            newlines=max(1, max(t.count("\n") for t in texts)),
        )

    return lm_table(lm, "text_budget.unit_growth", build)


@dataclass(frozen=True)
class LayoutFacts:
    """Whether one token can straddle pieces of text that something separates.

    Attributes
    ----------
    inner_space
        Some token has whitespace between two non-space characters.
    boundary_inside
        Some token holds a sentence mark, then punctuation after which Punkt may start a
        new sentence, then a letter or digit (``'."The'``): one token could end a sentence
        and start the next.
    newline_with_text
        Some token holds a newline next to a non-space character.
    """

    inner_space: bool
    boundary_inside: bool
    newline_with_text: bool

    @property
    def separate_sentences(self) -> bool:
        """Two sentences' words never share a token (so their spellings add up)."""
        return not (self.inner_space or self.boundary_inside)


def layout_facts(lm: LanguageModel) -> LayoutFacts:
    """:class:`LayoutFacts` of ``lm``'s vocabulary (computed once per LM)."""

    def build(lm: LanguageModel) -> LayoutFacts:
        texts = [lm.vocab[i] for i in text_ids(lm)]
        return LayoutFacts(
            inner_space=any(_INNER_SPACE.search(t) for t in texts),
            boundary_inside=any(_BOUNDARY_INSIDE.search(t) for t in texts),
            newline_with_text=any(re.search(r"\S\n|\n\S", t) for t in texts),
        )

    return lm_table(lm, "text_budget.layout_facts", build)
