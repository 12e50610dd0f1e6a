"""The text builders' constraints as small automata over the stream of a plain text's units.

A plain text is a stream of events (:mod:`~llamppl.decoding.text.shape`): ``word(x)`` (one
judge word, ``x`` its normalised form, or :data:`OTHER` for a word no constraint names),
``stop`` (a sentence ends), ``para`` (a paragraph ends) and, last, the end. Each builder's
constraint, read on that stream, is a deterministic automaton with a small state (a few
counters, capped where the bounds stop caring, and a few flags):

==============================  ==============================================================
builder                         state
==============================  ==============================================================
``word_count``                  words so far
``sentence_count``              sentences ended, whether the open one has a word
``paragraph_count``             paragraphs so far
``words_per_sentence``          words of the open sentence
``sentences_per_paragraph``     sentences ended in the open paragraph, whether one is open
``chars_per_word``              none: which word lengths exist (:attr:`Automaton.lengths`)
``words_at``                    words so far, the last ``k`` words (positions from the end)
``first_word_of_sentences``     sentences ended, whether the open one has a word
``last_word_of_sentences``      sentences ended, whether the open one has a word, whether its
                                last word is its target
``last_sentence_of_paragraphs`` paragraphs, sentences of the open one (counts only: each
                                paragraph holds ``max(min_sentences, 1)`` sentences; the
                                sentences' text is not followed)
``contains_words``              the required words seen
``excludes_words``              none (a banned word is refused)
==============================  ==============================================================

``word`` / ``stop`` / ``para`` return the next state, or None when the text has broken the
constraint for good; ``end`` says whether the text may end in that state. The product of
the automata of a conjunction is searched by :mod:`~llamppl.decoding.text.feasible`.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence

__all__ = [
    "OTHER",
    "MAX_TAIL",
    "Automaton",
    "Bounded",
    "CountWords",
    "CountSentences",
    "CountParagraphs",
    "PerSentence",
    "PerParagraph",
    "WordLength",
    "WordsAt",
    "FirstWords",
    "LastWords",
    "ParagraphEnds",
    "Required",
    "Banned",
]

OTHER = "\x00other"
"""The class of a word that no constraint names."""
MAX_TAIL = 8
"""Positions from the end that :class:`WordsAt` follows (``-1`` to ``-8``)."""


def _more(n: int, lo: int | None, hi: int | None) -> int | None:
    """``n + 1`` within ``<= hi`` (None beyond it); without ``hi``, capped at ``lo``."""
    n += 1
    if hi is not None:
        return n if n <= hi else None
    return min(n, lo or 0)


def _ok(n: int, lo: int | None, hi: int | None) -> bool:
    return (lo is None or n >= lo) and (hi is None or n <= hi)


class Automaton:
    """One constraint on the event stream (module docstring); the defaults ignore every event.

    ``targets``: words it asks for (the classes worth writing); ``names``: words it must tell
    apart (targets and banned words); ``lengths``: the word lengths it allows (``(lo, hi)``,
    either None).
    """

    targets: frozenset[str] = frozenset()
    names: frozenset[str] = frozenset()
    lengths: tuple[int | None, int | None] = (None, None)

    def start(self) -> Hashable:
        return 0

    def word(self, s, x: str):
        return s

    def stop(self, s):
        return s

    def para(self, s):
        return s

    def end(self, s) -> bool:
        return True


class Bounded(Automaton):
    """An automaton that counts something against the bounds ``[lo, hi]`` (either None)."""

    def __init__(self, lo: int | None, hi: int | None) -> None:
        self.lo, self.hi = lo, hi


class CountWords(Bounded):
    """``word_count``: the number of words within ``[lo, hi]``."""

    def word(self, n, x):
        return _more(n, self.lo, self.hi)

    def end(self, n):
        return _ok(n, self.lo, self.hi)


class CountSentences(Bounded):
    """``sentence_count``: sentences ended plus one for an open sentence with a word."""

    def start(self):
        return (0, False)

    def word(self, s, x):
        n, has = s
        if has:
            return s
        return None if self.hi is not None and n + 1 > self.hi else (n, True)

    def stop(self, s):
        n = _more(s[0], self.lo, self.hi)
        return None if n is None else (n, False)

    def end(self, s):
        return _ok(s[0] + s[1], self.lo, self.hi)


class CountParagraphs(Bounded):
    """``paragraph_count``: pieces between ``"\\n\\n"`` (the empty text is one)."""

    def start(self):
        return 1

    def para(self, n):
        return _more(n, self.lo, self.hi)

    def end(self, n):
        return _ok(n, self.lo, self.hi)


class PerSentence(Bounded):
    """``words_per_sentence``: every sentence holds ``[lo, hi]`` words."""

    def word(self, n, x):
        return _more(n, self.lo, self.hi)

    def stop(self, n):
        return 0 if _ok(n, self.lo, self.hi) else None

    def end(self, n):
        return n == 0 or _ok(n, self.lo, self.hi)


class PerParagraph(Bounded):
    """``sentences_per_paragraph``: every paragraph holds ``[lo, hi]`` sentences (Punkt on the
    paragraph: its sentences end at the text's sentence ends and at its own end)."""

    def start(self):
        return (0, False)

    def word(self, s, x):
        n, has = s
        if has:
            return s
        return None if self.hi is not None and n + 1 > self.hi else (n, True)

    def stop(self, s):
        n = _more(s[0], self.lo, self.hi)
        return None if n is None else (n, False)

    def para(self, s):
        return (0, False) if self.end(s) else None

    def end(self, s):
        return _ok(s[0] + s[1], self.lo, self.hi)


class WordLength(Automaton):
    """``chars_per_word``: only the word lengths ``[lo, hi]`` exist."""

    def __init__(self, lo: int | None, hi: int | None) -> None:
        self.lengths = (lo, hi)


class WordsAt(Automaton):
    """``words_at``: the word at each position ``>= 0`` and at each position ``-k`` from the
    end, for ``k <= MAX_TAIL`` (farther ones are left to the constraint's own check).

    The state is the number of words (capped) and the set of ``m`` (``0 <= m <= K``, and
    ``K + 1`` for "more than ``K``") such that the words so far fit a text that ends after
    exactly ``m`` more words: the smallest automaton of "the last words are these".
    """

    def __init__(self, positions: Mapping[int, str]) -> None:
        self.ahead = {i: t for i, t in positions.items() if i >= 0}
        self.behind = {-i: t for i, t in positions.items() if -MAX_TAIL <= i < 0}
        self.k = max(self.behind, default=0)
        self.cap = max(self.ahead, default=-1) + 1
        self.targets = self.names = frozenset(self.ahead.values()) | frozenset(self.behind.values())

    def start(self):
        return (0, frozenset({self.k, self.k + 1}) if self.k else frozenset())

    def word(self, s, x):
        n, ends = s
        if self.ahead.get(n, x) != x:
            return None
        if self.k:  # the word lands at -m when the text ends m - 1 words later
            ends = frozenset(
                [m - 1 for m in ends if 1 <= m <= self.k and self.behind.get(m, x) == x]
                + [self.k, self.k + 1] * (self.k + 1 in ends)
            )
        return (min(n + 1, self.cap), ends)

    def end(self, s):
        n, ends = s
        return n >= self.cap and (not self.k or 0 in ends)


def _targets(targets: str | Sequence[str]) -> tuple[str | None, tuple[str, ...]]:
    return (targets, ()) if isinstance(targets, str) else (None, tuple(targets))


class FirstWords(Automaton):
    """``first_word_of_sentences``: each sentence's first word (one target for all, or one per
    sentence, then exactly that many sentences)."""

    def __init__(self, targets: str | Sequence[str]) -> None:
        self.one, self.each = _targets(targets)
        self.targets = self.names = frozenset([self.one] if self.one else self.each)

    def _target(self, k: int) -> str | None:
        if self.one is not None:
            return self.one
        return self.each[k] if k < len(self.each) else None

    def start(self):
        return (0, False)

    def word(self, s, x):
        k, has = s
        if has:
            return s
        return (k, True) if self._target(k) == x else None

    def stop(self, s):
        return (s[0] + (self.one is None), False)

    def end(self, s):
        return self.one is not None or s[0] + s[1] == len(self.each)


class LastWords(Automaton):
    """``last_word_of_sentences``: each sentence's last word (one target for all, or one per
    sentence, then exactly that many sentences)."""

    def __init__(self, targets: str | Sequence[str]) -> None:
        self.one, self.each = _targets(targets)
        self.targets = self.names = frozenset([self.one] if self.one else self.each)

    def _target(self, k: int) -> str | None:
        if self.one is not None:
            return self.one
        return self.each[k] if k < len(self.each) else None

    def start(self):
        return (0, False, False)

    def word(self, s, x):
        target = self._target(s[0])
        return None if target is None else (s[0], True, x == target)

    def stop(self, s):
        return (s[0] + (self.one is None), False, False) if s[2] else None

    def end(self, s):
        k, has, last = s
        if has and not last:
            return False
        return self.one is not None or k + has == len(self.each)


class ParagraphEnds(Automaton):
    """``last_sentence_of_paragraphs``, counts only: ``n`` paragraphs (None: any number), each
    with at least ``least`` sentences."""

    def __init__(self, n: int | None, least: int) -> None:
        self.n, self.least = n, least

    def start(self):
        return (1, 0, False)

    def word(self, s, x):
        return s if s[2] else (s[0], s[1], True)

    def stop(self, s):
        return (s[0], min(s[1] + 1, self.least), False)

    def para(self, s):
        p = s[0] + 1
        if not self._full(s) or (self.n is not None and p > self.n):
            return None
        return (p if self.n is not None else 1, 0, False)

    def _full(self, s) -> bool:
        return s[1] + s[2] >= self.least

    def end(self, s):
        return self._full(s) and (self.n is None or s[0] == self.n)


class Required(Automaton):
    """``contains_words``: every required word appears (the state: a bit per word seen)."""

    def __init__(self, words: Sequence[str]) -> None:
        self.bit = {w: 1 << i for i, w in enumerate(dict.fromkeys(words))}
        self.full = (1 << len(self.bit)) - 1
        self.targets = self.names = frozenset(self.bit)

    def word(self, seen, x):
        return seen | self.bit.get(x, 0)

    def end(self, seen):
        return seen == self.full


class Banned(Automaton):
    """``excludes_words``: no banned word appears."""

    def __init__(self, words: Sequence[str]) -> None:
        self.names = frozenset(words)

    def word(self, s, x):
        return None if x in self.names else s
