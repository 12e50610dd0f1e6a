"""Ready-made text constraints with vectorised next-token masks.

Each is a :class:`~llamppl.decoding.constraints.protocol.Constraint` on the generated text
(its state), and computes its mask with tensor operations over tables built once
per language model (cached on the LM object), so a step costs a few vector
operations on the 49k-token vocabulary rather than 49k Python calls:

- :func:`max_word_length` — no word longer than ``n`` letters (O(V) tensor ops).
- :func:`banned_words` — none of the given words appears (O(V) tensor ops).
- :func:`regex_prefix` — the text is a prefix of a full match of a regular
  expression (the ``regex`` package's ``partial=True``). A regular expression
  has no closed form over token strings, so its mask calls the regex engine:
  once per distinct first character of the vocabulary, then once per token
  whose first character survives; results are memoised per prefix. That is not
  cheap, so by default a program checks it lazily on the tokens it draws. Every call
  carries the current check bound as the ``regex`` package's ``timeout=``
  (:mod:`~llamppl.decoding.constraints.time_bound`), so a pattern that backtracks for minutes
  ends its particle, not the run.

Measured on SmolLM2's 49,152 tokens, one CPU core: building the word tables
takes ~0.2 s once per LM, after which a ``max_word_length`` or
``banned_words`` mask costs ~0.1-0.3 ms; a ``regex_prefix`` mask costs ~85 ms
per new prefix for a permissive pattern (every token tested) and much less
when the pattern rules out most first characters::

    from llamppl.decoding import max_word_length, banned_words
    c = max_word_length(5) & banned_words(["rates"])
    mask = c.allowed_mask(lm, "The Fed")     # (V,) bool tensor
"""

from __future__ import annotations

import collections
import re
from collections.abc import Iterable
from typing import Any

import regex
import torch

from llamppl.decoding.constraints.protocol import Constraint
from llamppl.decoding.constraints.time_bound import CheckTimeout, current_bound
from llamppl.lm.base import LanguageModel
from llamppl.lm.masks import leading_letters, word_stats
from llamppl.lm.memo import LRU, PerLM, lm_table
from llamppl.validation import check_positive_int

__all__ = [
    "MaxWordLength",
    "BannedWords",
    "RegexPrefix",
    "max_word_length",
    "banned_words",
    "regex_prefix",
]


def _alpha_runs(text: str) -> list[tuple[int, int]]:
    """``(start, end)`` of each maximal run of letters (``str.isalpha``) in ``text``."""
    runs, start = [], None
    for i, ch in enumerate(text):
        if ch.isalpha():
            if start is None:
                start = i
        elif start is not None:
            runs.append((start, i))
            start = None
    if start is not None:
        runs.append((start, len(text)))
    return runs


def _trailing_run(text: str) -> int:
    n = 0
    while n < len(text) and text[-1 - n].isalpha():
        n += 1
    return n


def _word_stats(lm: LanguageModel) -> dict[str, torch.Tensor]:
    """Per-token letter-run statistics of ``lm.vocab`` (computed once, by ``llamppl.lm.masks``)."""
    return word_stats(lm)


# ---------------------------------------------------------------------- max_word_length
class MaxWordLength(Constraint):
    """Every word (maximal run of letters, ``str.isalpha``) has at most ``n`` letters.

    Prefix-closed, so C = C_F: any allowed prefix may end. Mask for a prefix
    whose last letter run has length r (shapes ``(V,)``)::

        allowed[w] = longest_run[w] <= n  and  r + leading_run[w] <= n
    """

    prefix_closed = True  # a rejected text has no accepted extension

    def __init__(self, n: int) -> None:
        self.n = check_positive_int("n", n)

    def __call__(self, text: str) -> bool:
        return all(e - s <= self.n for s, e in _alpha_runs(text))

    def allowed_mask(self, lm: LanguageModel, text: str) -> torch.Tensor:
        if not self(text):
            return torch.zeros(lm.vocab_size, dtype=torch.bool, device=lm.device)
        stats = _word_stats(lm)
        r = _trailing_run(text)
        mask = (stats["longest"] <= self.n) & (stats["lead"] <= self.n - r)  # (V,)
        mask[list(lm.eos_token_ids)] = True
        return mask

    def __repr__(self) -> str:
        return f"max_word_length({self.n})"


def max_word_length(n: int) -> MaxWordLength:
    """Constraint: no word longer than ``n`` letters (LLaMPPL paper §2.2, "The Fed says" example)."""
    return MaxWordLength(n)


# ---------------------------------------------------------------------- banned_words
class BannedWords(Constraint):
    """No word (maximal run of letters) equals a banned word (case-insensitive by default).

    A word is judged once it is complete: when a non-letter follows it, or at
    the end of the string. So ``"the"`` is an allowed prefix when ``"the"`` is
    banned (it may become ``"then"``), but the string may not end there.
    Mask for a prefix whose unfinished last word is u (shapes ``(V,)``): a token
    is refused if a word completed inside it is banned, or if it contains a
    non-letter and ``u + leading_letters(token)`` is banned.
    """

    prefix_closed = True  # a rejected text has no accepted extension

    def __init__(self, words: Iterable[str], case_sensitive: bool = False) -> None:
        if isinstance(words, str) or not isinstance(words, Iterable):
            raise TypeError(f"words must be an iterable of strings, got {type(words).__name__}")
        words = list(words)
        if not words:
            raise ValueError("words must contain at least one word")
        for w in words:
            if not isinstance(w, str) or not w or not w.isalpha():
                raise ValueError(
                    f"words must be non-empty strings of letters (str.isalpha), got {w!r}"
                )
        self.case_sensitive = bool(case_sensitive)
        self.words = frozenset(self._fold(w) for w in words)

    def _fold(self, s: str) -> str:
        return s if self.case_sensitive else s.casefold()  # casefold maps character by character

    def _completed_words(self, text: str, include_last: bool) -> list[str]:
        return [text[s:e] for s, e in _alpha_runs(text) if include_last or e < len(text)]

    def __call__(self, text: str) -> bool:
        return not any(self._fold(w) in self.words for w in self._completed_words(text, False))

    def accepts_end(self, text: str) -> bool:
        return not any(self._fold(w) in self.words for w in self._completed_words(text, True))

    def _tables(self, lm: LanguageModel) -> dict[str, Any]:
        inner_banned, lead_ids = [], collections.defaultdict(list)
        for i, text in enumerate(lm.vocab):
            runs = _alpha_runs(text)
            # words that start after a non-letter and end before one, all inside the token
            inner = [text[s:e] for s, e in runs if s > 0 and e < len(text)]
            inner_banned.append(any(self._fold(w) in self.words for w in inner))
            if any(not ch.isalpha() for ch in text):  # its leading run completes the pending word
                lead_ids[self._fold(text[: leading_letters(text)])].append(i)
        dev = lm.device
        return {
            "inner_ok": ~torch.tensor(inner_banned, dtype=torch.bool, device=dev),  # (V,)
            "lead_ids": {
                k: torch.tensor(v, dtype=torch.long, device=dev) for k, v in lead_ids.items()
            },
        }

    def allowed_mask(self, lm: LanguageModel, text: str) -> torch.Tensor:
        if not self(text):
            return torch.zeros(lm.vocab_size, dtype=torch.bool, device=lm.device)
        tables = lm_table(lm, ("banned_words", self.words, self.case_sensitive), self._tables)
        mask = tables["inner_ok"].clone()  # (V,)
        pending = self._fold(text[len(text) - _trailing_run(text) :])
        for word in self.words:
            if word.startswith(pending):
                ids = tables["lead_ids"].get(word[len(pending) :])
                if ids is not None:
                    mask[ids] = False
        mask[list(lm.eos_token_ids)] = self.accepts_end(text)
        return mask

    def __repr__(self) -> str:
        return f"banned_words({sorted(self.words)!r})"


def banned_words(words: Iterable[str], case_sensitive: bool = False) -> BannedWords:
    """Constraint: none of ``words`` appears as a whole word."""
    return BannedWords(words, case_sensitive)


# ---------------------------------------------------------------------- regex_prefix
def _first_char_groups(lm: LanguageModel) -> list[tuple[str, list[tuple[int, str]]]]:
    groups: dict[str, list[tuple[int, str]]] = collections.defaultdict(list)
    for i, text in enumerate(lm.vocab):
        groups[text[:1]].append((i, text))
    return list(groups.items())


class RegexPrefix(Constraint):
    """The text is a prefix of a full match of ``pattern``; it may end only on a full match.

    Uses the ``regex`` package's partial matching: ``s`` is in C iff
    ``pattern.fullmatch(s, partial=True)`` matches. If ``s + c`` cannot be
    extended to a match then neither can ``s + c + ...``, so the mask tests each
    distinct first character of the vocabulary once and only tests the tokens
    whose first character survives. Cost per distinct prefix: at most
    (#first characters + V) regex calls, each O(len(s)); masks are memoised per
    prefix (an LRU of ``cache_size`` entries per LM). Lookarounds and
    backreferences are supported as far as the ``regex`` engine's partial
    matching supports them.

    ``cheap_mask`` is False: the mask exists (``proposal="mask"`` uses it), but it may cost
    one regex call per token of the vocabulary at each new prefix, and a pattern that
    backtracks makes each call slow, so ``proposal="auto"`` checks a pattern lazily, on the
    few tokens it draws (measured on the AWRS paper's patterns: 1–17 CPU s per instance at
    N = 10 lazily, against 1–153 s with the mask). Every call passes the current check bound
    (:func:`~llamppl.decoding.constraints.time_bound.current_bound`) as ``timeout=``; a call that
    exceeds it raises :class:`~llamppl.decoding.constraints.time_bound.CheckTimeout`.
    """

    prefix_closed = True  # a rejected text has no accepted extension

    def __init__(
        self, pattern: str | regex.Pattern | re.Pattern, flags: int = 0, cache_size: int = 256
    ) -> None:
        if isinstance(pattern, re.Pattern):  # a stdlib pattern: recompile with the `regex` engine
            pattern, flags = pattern.pattern, flags | (pattern.flags & ~re.UNICODE)
        if not isinstance(pattern, (str, regex.Pattern)):
            raise TypeError(
                f"pattern must be a str or compiled regex, got {type(pattern).__name__}"
            )
        try:
            self.pattern = regex.compile(pattern, flags) if isinstance(pattern, str) else pattern
        except regex.error as exc:
            raise ValueError(f"pattern is not a valid regular expression: {exc}") from exc
        self.cache_size = check_positive_int("cache_size", cache_size)
        self._masks: PerLM[LRU[str, torch.Tensor]] = PerLM(lambda lm: LRU(self.cache_size))

    cheap_mask = False  # a mask of regex calls, not of tensor operations: see the class docstring

    def _fullmatch(self, text: str, partial: bool) -> bool:
        try:
            found = self.pattern.fullmatch(text, partial=partial, timeout=current_bound())
        except TimeoutError:
            raise CheckTimeout(f"regex {self.pattern.pattern!r} on {text[-40:]!r}") from None
        return found is not None

    def __call__(self, text: str) -> bool:
        return self._fullmatch(text, True)

    def accepts_end(self, text: str) -> bool:
        return self._fullmatch(text, False)

    def allowed_mask(self, lm: LanguageModel, text: str) -> torch.Tensor:
        lru = self._masks(lm)
        mask = lru.get(text)
        if mask is None:
            mask = self._compute_mask(lm, text)
            lru.put(text, mask)
        return mask.clone()

    def _compute_mask(self, lm: LanguageModel, text: str) -> torch.Tensor:
        allowed: list[int] = []
        if self(text):
            for first, members in lm_table(lm, "first_char_groups", _first_char_groups):
                if first and not self(text + first):
                    continue  # no token starting with `first` can follow `text`
                allowed += [i for i, t in members if self(text + t)]
        mask = torch.zeros(lm.vocab_size, dtype=torch.bool)
        mask[allowed] = True
        mask[list(lm.eos_token_ids)] = self(text) and self.accepts_end(text)
        return mask.to(lm.device)

    def __repr__(self) -> str:
        return f"regex_prefix({self.pattern.pattern!r})"


def regex_prefix(pattern: str | regex.Pattern | re.Pattern, flags: int = 0) -> RegexPrefix:
    """Constraint: the generated text stays a prefix of a full match of ``pattern`` (``regex`` syntax)."""
    return RegexPrefix(pattern, flags)
