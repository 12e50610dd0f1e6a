"""Words that must or must not appear in a text (COLLIE's ``in`` / ``not in`` on words).

:class:`WordsIncluded` and :class:`WordsExcluded`, built by
:func:`~llamppl.decoding.text.builders.contains_words` and
:func:`~llamppl.decoding.text.builders.excludes_words`. Words are the judge's (NLTK's
``word_tokenize``, punctuation-only tokens dropped), compared as COLLIE compares them.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from llamppl.decoding.text import automata as ta
from llamppl.decoding.text import units as tu
from llamppl.decoding.text.base import (
    TextStructure,
    plain_flag,
    spelled_budget,
    target_keys,
    word_need,
)
from llamppl.decoding.text.budget import layout_facts
from llamppl.decoding.text.prefix import Analysis
from llamppl.decoding.text.spelling import can_share, spelling
from llamppl.lm.base import LanguageModel

__all__ = ["WordsIncluded", "WordsExcluded"]


# ---------------------------------------------------------------------- words present or absent
class WordsIncluded(TextStructure):
    """Every target word is among the text's words (COLLIE's ``in`` on words).

    Prefix check: always possible. Budget: each target not yet in the text (as a substring,
    case-insensitively) needs its fewest spelling tokens, a start of it ending the text
    counting (:func:`~llamppl.decoding.text.budget.overlap_need`); summed when no token of
    the LM can hold the end of one target and the start of another, else the maximum.
    """

    def __init__(self, words: Sequence[str], *, plain: bool = False) -> None:
        self.words = target_keys(words, "words")
        self.spelled = tuple(words)
        self.plain = plain_flag(plain)

    def target_strings(self) -> tuple[str, ...]:
        return self.spelled

    def levels(self) -> frozenset[str]:
        return frozenset({"word"})

    def automaton(self) -> ta.Automaton:
        return ta.Required(self.words)

    def prefix_ok(self, text: str, view: Analysis) -> bool:
        return True

    def __call__(self, text: str) -> bool:
        return True

    def accepts_end(self, text: str) -> bool:
        found = {tu.normalize(w) for w in tu.words(text)}
        return all(w in found for w in self.words)

    def _budget(self, lm: LanguageModel, state: str, tokens_left: int):
        view = self.view_of(state)
        present = {tu.normalize(w) for w in view.flat + view.open_flat}
        if all(w in present for w in self.words):
            return True, None
        add = not (can_share(lm, self.words) or layout_facts(lm).inner_space)
        here = state[view.anchor :].lower()
        spelled = [spelling(lm, w, word=True) for w in self.words]
        needs = [word_need(sp, view, here, present) for sp in spelled]
        return spelled_budget(lm, spelled, needs, here, tokens_left, add=add)

    def reachable(self, lm: LanguageModel, state: str, tokens_left: int) -> bool:
        return self._budget(lm, state, tokens_left)[0]

    def budget_mask(self, lm: LanguageModel, state: str, tokens_left: int) -> torch.Tensor | None:
        return self._budget(lm, state, tokens_left)[1]

    def __repr__(self) -> str:
        return f"contains_words({list(self.words)!r}{self.plain_repr()})"


class WordsExcluded(TextStructure):
    """No banned word is among the text's words (COLLIE's ``not in`` on words).

    Unlike :func:`~llamppl.decoding.text.characters.banned_words` (runs of letters), the
    words are the judge's: ``isn't`` holds the word ``is``, ``is-a`` does not. Prefix check:
    no certain word is banned. No budget.
    """

    def __init__(self, words: Sequence[str], *, plain: bool = False) -> None:
        self.words = frozenset(target_keys(words, "words"))
        self.spelled = tuple(words)
        self.plain = plain_flag(plain)

    def target_strings(self) -> tuple[str, ...]:
        return self.spelled

    def levels(self) -> frozenset[str]:
        return frozenset({"word"})

    def automaton(self) -> ta.Automaton:
        return ta.Banned(tuple(self.words))

    def prefix_ok(self, text: str, view: Analysis) -> bool:
        return not any(tu.normalize(w) in self.words for w in view.flat + view.open_flat)

    def accepts_end(self, text: str) -> bool:
        return not any(tu.normalize(w) in self.words for w in tu.words(text))

    def __repr__(self) -> str:
        return f"excludes_words({sorted(self.words)!r}{self.plain_repr()})"
