"""Count constraints on a text's units, exact on prefixes (COLLIE's ``Count``).

:class:`CharCount` and :class:`CharsAt` (characters, with batched ``(V,)`` masks from per-LM
tables), :class:`UnitCount` (words, sentences, paragraphs) and :class:`EachCount` (every
word / sentence / paragraph holds so many inner units). Built by the functions of
:mod:`~llamppl.decoding.text.builders` (``char_count``, ``word_count``, ...), whose
docstring explains the protocol they answer. A count also says what it implies next to
other parts of a conjunction (``implied``): an exact count turns positions counted from the
end into positions from the start, and a cap on the word count bounds the last words and
the required words (:mod:`~llamppl.decoding.text.joint`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch

from llamppl.decoding.constraints.protocol import Constraint
from llamppl.decoding.text import automata as ta
from llamppl.decoding.text import units as tu
from llamppl.decoding.text.base import (
    Bounds,
    TextConstraint,
    TextStructure,
    check_level,
    count_marks,
    count_nonspace,
    plain_flag,
)
from llamppl.decoding.text.budget import (
    char_codes,
    char_key,
    max_token_chars,
    token_lengths,
    unit_growth,
)
from llamppl.decoding.text.joint import CappedLastWords, RequiredWordsFit, SentenceEndsAtCap
from llamppl.decoding.text.positions import EachAt, UnitsAt
from llamppl.decoding.text.prefix import next_chunk, word_floor
from llamppl.decoding.text.presence import WordsIncluded
from llamppl.lm.base import LanguageModel
from llamppl.validation import is_integer

__all__ = ["CharCount", "CharsAt", "UnitCount", "EachCount", "EACH_COUNT"]


# ---------------------------------------------------------------------- characters
class CharCount(TextConstraint):
    """The number of characters (``len(text)``, whitespace included) within :class:`Bounds`.

    Prefix check: ``len(text) <= at_most``. Mask: ``len(text) + len(token) <= at_most``
    from a per-LM table of token lengths. Budget: at least ``at_least - len(text)``
    characters must come, and a token adds at most ``max_token_chars(lm)`` of them. Implied
    with an exact count: the characters at negative positions of :class:`CharsAt` are at
    positions from the start.
    """

    prefix_closed = True  # a rejected text has no accepted extension
    on_characters = True

    def __init__(self, bounds: Bounds, *, plain: bool = False) -> None:
        self.bounds = bounds
        self.plain = plain_flag(plain)

    def levels(self) -> frozenset[str]:
        return frozenset({"character"})

    def implied(self, parts: Sequence[Constraint]) -> list[Constraint]:
        out = super().implied(parts)
        n = self.bounds.hi
        if n is None or self.bounds.lo != n:
            return out
        for p in parts:
            if isinstance(p, CharsAt):
                tail = {i + n: c for i, c in p.raw_positions.items() if i < 0 and i + n >= 0}
                if tail:
                    out.append(CharsAt(tail))
        return out

    def __call__(self, text: str) -> bool:
        return not self.bounds.over(len(text))

    def accepts_end(self, text: str) -> bool:
        return self.bounds.ok(len(text))

    def allowed_mask(self, lm: LanguageModel, text: str) -> torch.Tensor:
        n = len(text)
        mask = torch.ones(lm.vocab_size, dtype=torch.bool, device=lm.device)
        if self.bounds.hi is not None:
            mask = token_lengths(lm) + n <= self.bounds.hi
        mask[list(lm.eos_token_ids)] = self.accepts_end(text)
        return mask

    def reachable(self, lm: LanguageModel, state: str, tokens_left: int) -> bool:
        need = 0 if self.bounds.lo is None else self.bounds.lo - len(state)
        return need <= tokens_left * max_token_chars(lm)

    def budget_mask(self, lm: LanguageModel, state: str, tokens_left: int) -> torch.Tensor | None:
        if self.bounds.lo is None:
            return None
        shortest = self.bounds.lo - len(state) - (tokens_left - 1) * max_token_chars(lm)
        if shortest <= 0:
            return None
        mask = token_lengths(lm) >= shortest
        mask[list(lm.eos_token_ids)] = True
        return mask

    def __repr__(self) -> str:
        return f"char_count({self.bounds!r}{self.plain_repr()})"


class CharsAt(TextConstraint):
    """Given characters at given positions (COLLIE's ``Position`` on characters, ``==``).

    A character compares as COLLIE compares it: lower-cased, and a space or ``.`` is the
    empty unit, which no letter equals. Positions ``>= 0`` are checked as soon as the text
    reaches them (the mask reads each token's characters from a per-LM ``(V, L)`` table);
    negative positions count from the end and are checked only on the finished text.
    No budget of its own.
    """

    prefix_closed = True  # a rejected text has no accepted extension
    on_characters = True

    def __init__(self, positions: Mapping[int, str], *, plain: bool = False) -> None:
        if not isinstance(positions, Mapping) or not positions:
            raise TypeError(
                f"positions must be a non-empty mapping index -> str, got {positions!r}"
            )
        for i, c in positions.items():
            if not is_integer(i):
                raise TypeError(f"positions keys must be integers, got {i!r}")
            if not isinstance(c, str) or len(c) != 1:
                raise ValueError(f"positions values must be single characters, got {c!r}")
        self.raw_positions = dict(positions)
        self.positions = {i: char_key(c) for i, c in positions.items()}
        self.plain = plain_flag(plain)

    def target_strings(self) -> tuple[str, ...]:
        return tuple(self.raw_positions.values())

    def levels(self) -> frozenset[str]:
        return frozenset({"character"})

    def _ok(self, text: str, end: bool) -> bool:
        for i, key in self.positions.items():
            if i >= len(text) or i < -len(text):
                if end:
                    return False
            elif (i >= 0 or end) and char_key(text[i]) != key:
                return False
        return True

    def __call__(self, text: str) -> bool:
        return self._ok(text, end=False)

    def accepts_end(self, text: str) -> bool:
        return self._ok(text, end=True)

    def allowed_mask(self, lm: LanguageModel, text: str) -> torch.Tensor:
        n = len(text)
        mask = torch.full((lm.vocab_size,), self(text), dtype=torch.bool, device=lm.device)
        codes, index = char_codes(lm)
        for i, key in self.positions.items():
            offset = i - n
            if 0 <= offset < codes.shape[1]:  # the position falls inside some tokens
                want = index.get(key, -2)
                mask &= (codes[:, offset] == want) | (codes[:, offset] < 0)
        mask[list(lm.eos_token_ids)] = self.accepts_end(text)
        return mask

    def __repr__(self) -> str:
        return f"chars_at({self.positions!r}{self.plain_repr()})"


# ---------------------------------------------------------------------- units
class UnitCount(TextStructure):
    """The number of words, sentences or paragraphs within :class:`Bounds`.

    Prefix check: the units certain to be there (certain words and the word being written, or
    one word per chunk holding a letter or digit where that is more:
    :func:`~llamppl.decoding.text.prefix.word_floor`; certain sentences plus one for any open
    text; every paragraph delimiter) do not exceed ``at_most``. Budget: ``at_least`` minus an upper bound of the units the text can still
    hold must be within ``tokens_left`` times the most units one token adds
    (:func:`~llamppl.decoding.text.budget.unit_growth`: judge words, marks, newlines).

    Implied next to other parts (:meth:`implied`): with an exact count, the units at negative
    positions of :class:`~llamppl.decoding.text.positions.UnitsAt` (same level) at positions
    from the start; with a cap on words, :class:`~llamppl.decoding.text.joint.CappedLastWords`
    (negative word positions, also read where marks leave the words undecided), :class:`~llamppl.decoding.text.joint.SentenceEndsAtCap`
    (the last word of every sentence) and :class:`~llamppl.decoding.text.joint.RequiredWordsFit`
    (required words).
    """

    def __init__(self, level: str, bounds: Bounds, *, plain: bool = False) -> None:
        self.level = check_level("level", level, ("word", "sentence", "paragraph"))
        self.bounds = bounds
        self.view = "paragraph" if self.level == "paragraph" else "sentence"
        self.plain = plain_flag(plain)

    def levels(self) -> frozenset[str]:
        return frozenset({self.level})

    def implied(self, parts: Sequence[Constraint]) -> list[Constraint]:
        """The plain characters (:class:`~llamppl.decoding.text.base.TextConstraint`) and the
        joint constraints of the class docstring."""
        out = super().implied(parts)
        cap = self.bounds.hi
        if cap is None:
            return out
        exact = self.bounds.lo == cap
        for p in parts:
            if isinstance(p, UnitsAt) and p.level == self.level:
                tail = {i: p.spelled[i] for i in p.positions if i < 0}
                ahead = {i + cap: t for i, t in tail.items() if i + cap >= 0}
                if exact and ahead:
                    out.append(UnitsAt(self.level, ahead))
                if tail and self.level == "word":
                    out.append(CappedLastWords(cap, tail, (self, p)))
            if self.level != "word":
                continue
            if isinstance(p, EachAt) and (p.outer, p.inner, p.index) == ("sentence", "word", -1):
                out.append(
                    SentenceEndsAtCap(
                        cap,
                        p.raw_targets[0] if isinstance(p.targets, str) else p.raw_targets,
                        (self, p),
                    )
                )
            elif isinstance(p, WordsIncluded):
                out.append(RequiredWordsFit(cap, p.spelled, (self, p)))
        return out

    def automaton(self) -> ta.Automaton:
        kind = {
            "word": ta.CountWords,
            "sentence": ta.CountSentences,
            "paragraph": ta.CountParagraphs,
        }
        return kind[self.level](self.bounds.lo, self.bounds.hi)

    def _certain(self, text: str, view: Any) -> int:
        if self.level == "word":
            return word_floor(text, view)
        if self.level == "sentence":
            return len(view.sentences) + view.content
        return len(view.final) + 1

    def prefix_ok(self, text: str, view: Any) -> bool:
        return not self.bounds.over(self._certain(text, view))

    def accepts_end(self, text: str) -> bool:
        return self.bounds.ok(len(tu.units(text, self.level)))

    def reachable(self, lm: LanguageModel, state: str, tokens_left: int) -> bool:
        if self.bounds.lo is None:
            return True
        view, grow = self.view_of(state), unit_growth(lm)
        if self.level == "word":
            upper = len(view.flat) + len(view.open_flat) + 2
            if not view.exact:
                upper = len(view.flat) + count_nonspace(state[view.anchor :])
            per_token = grow.words
        elif self.level == "sentence":
            upper, per_token = (
                len(view.sentences) + count_marks(state[view.anchor :]) + 1,
                grow.marks,
            )
        else:
            upper, per_token = len(view.final) + 1, grow.newlines
        return self.bounds.lo - upper <= tokens_left * per_token

    def missing(self, lm: LanguageModel, state: str) -> int:
        """Certain sentences or paragraphs short of ``at_least``; word counts name no
        targets (a twist per word would favour text that splits into many words)."""
        if self.level == "word" or self.bounds.lo is None:
            return 0
        view = self.view_of(state)
        done = len(view.sentences) if self.level == "sentence" else len(view.final)
        return max(0, self.bounds.lo - done)

    def __repr__(self) -> str:
        return f"{self.level}_count({self.bounds!r}{self.plain_repr()})"


# ---------------------------------------------------------------------- per unit
EACH_COUNT = (
    ("word", "character"),
    ("sentence", "word"),
    ("sentence", "character"),
    ("paragraph", "sentence"),
    ("paragraph", "word"),
)


class EachCount(TextStructure):
    """Every outer unit holds a number of inner units within :class:`Bounds` (COLLIE's
    ``InputLevel(outer)``, ``TargetLevel(inner)``, ``ForEach(Count())``, reduction ``all``).

    Prefix check: every certain outer unit complies; the open one (the word, sentence or
    paragraph being written) must not hold more than ``at_most`` certain inner units (the
    word being written is at least ``OpenWord.min_length()`` characters long). Budget: the
    open unit still needs ``at_least`` minus an upper bound of what it holds, at the most
    inner units one token adds (:func:`~llamppl.decoding.text.budget.unit_growth`).
    """

    def __init__(self, outer: str, inner: str, bounds: Bounds, *, plain: bool = False) -> None:
        if (outer, inner) not in EACH_COUNT:
            raise ValueError(f"(outer, inner) must be one of {EACH_COUNT}; got {(outer, inner)!r}")
        self.outer, self.inner, self.bounds = outer, inner, bounds
        self.view = "paragraph" if outer == "paragraph" else "sentence"
        self.plain = plain_flag(plain)

    def levels(self) -> frozenset[str]:
        return frozenset({self.outer, self.inner})

    def run_floor(self) -> int:
        if (self.outer, self.inner) == ("word", "character"):
            return self.bounds.lo or 0
        return 0

    def automaton(self) -> ta.Automaton | None:
        kind = {
            ("word", "character"): ta.WordLength,
            ("sentence", "word"): ta.PerSentence,
            ("paragraph", "sentence"): ta.PerParagraph,
        }.get((self.outer, self.inner))
        return None if kind is None else kind(self.bounds.lo, self.bounds.hi)

    def _finished(self, view: Any) -> list[int]:
        if self.outer == "word":
            return [len(w) for w in view.flat + view.open_flat]
        if self.outer == "sentence":
            return [len(s.words if self.inner == "word" else s.text) for s in view.sentences]
        return [len(u) for u in (view.final if self.inner == "sentence" else view.final_words)]

    def _open_lower(self, text: str, view: Any) -> int:
        if self.outer == "word":
            return 0 if view.open_word is None else view.open_word.min_length()
        if self.outer == "sentence":
            if self.inner == "character":
                return 0
            nxt = next_chunk(text, view)  # ``far away.``: ``away`` is in the open sentence
            return len(view.open_nested) + (view.open_word is not None or bool(nxt and nxt[1]))
        a = view.open
        return len(a.sentences) + a.content if self.inner == "sentence" else a.certain_words

    def prefix_ok(self, text: str, view: Any) -> bool:
        if not all(self.bounds.ok(n) for n in self._finished(view)):
            return False
        return not self.bounds.over(self._open_lower(text, view))

    def accepts_end(self, text: str) -> bool:
        return all(self.bounds.ok(len(u)) for u in tu.nested_units(text, self.outer, self.inner))

    def reachable(self, lm: LanguageModel, state: str, tokens_left: int) -> bool:
        if self.bounds.lo is None or self.outer == "word" or self.inner == "character":
            return True
        view, grow = self.view_of(state), unit_growth(lm)
        if self.outer == "sentence":  # words the open sentence may hold at most
            a = view
            if not a.content:
                return True
            upper, per_token = len(a.open_nested) + count_nonspace(state[a.anchor :]), grow.words
        else:
            a = view.open
            if not a.content:
                return True
            rest = view.open_text[a.anchor :]
            if self.inner == "sentence":
                upper, per_token = len(a.sentences) + count_marks(rest) + 1, grow.marks
            else:
                upper, per_token = len(a.flat) + count_nonspace(rest), grow.words
        return self.bounds.lo - upper <= tokens_left * per_token

    def __repr__(self) -> str:
        return f"each_count({self.outer!r}, {self.inner!r}, {self.bounds!r}{self.plain_repr()})"
