r"""The fewest tokens that spell a string, for the token budget of text-structure constraints.

:func:`spelling` computes, by dynamic programming over the vocabulary's prefixes and
suffixes (case-insensitively, once per LM and string), the fewest tokens whose concatenation
writes a target (:class:`Spelling`); :func:`overlap_need` and :func:`find_spelled` say how
much of it a text already holds (a word counts only where no letter or digit is glued to
it); :func:`progress_mask` lists the tokens that write more of it, and :func:`can_share`
whether one token can hold the end of one target and the start of another::

    from llamppl.decoding.text.spelling import spelling
    s = spelling(lm, "republicanism")
    s.fresh        # tokens to write it anew, whatever comes before and after (e.g. 3)
    s.after[5]     # tokens to finish it when "repub" already ends the text
"""

from __future__ import annotations

import bisect
import functools
import re
import string
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from llamppl.decoding.text.budget import text_ids
from llamppl.lm.base import LanguageModel
from llamppl.lm.memo import LRU, lm_table

__all__ = [
    "Spelling",
    "spelling",
    "find_spelled",
    "may_start_sentence",
    "copy_under_way",
    "overlap_need",
    "progress_mask",
    "ids_mask",
    "can_share",
    "first_tokens",
]

_PUNCT_THEN_MARK = re.compile(r"[^\w\s]*[.?!]")
_PUNCT_ONLY = re.compile(r"[^\w\s]*")
_TOP = "\U0010ffff"
_STRIPPED = string.punctuation + " "  # what the judge strips from a unit's ends
_AFTER_COPY = 4  # marks, quotes and spaces a finished copy may be followed by


class _Pieces:
    """The lower-cased token texts of an LM: a set of them, of their prefixes and suffixes
    (for the spelling DP), and sorted orders to list the tokens that start or end with a
    string (for budget masks)."""

    def __init__(self, lm: LanguageModel) -> None:
        pairs = [(lm.vocab[i].lower(), i) for i in text_ids(lm) if lm.vocab[i]]
        self.texts = [t for t, _ in pairs]
        self.exact = frozenset(self.texts)
        self.prefixes = frozenset(t[:k] for t in self.texts for k in range(1, len(t) + 1))
        self.suffixes = frozenset(t[k:] for t in self.texts for k in range(len(t)))
        self.longest = max(map(len, self.texts))
        self.by_text: dict[str, list[int]] = {}
        for t, i in pairs:
            self.by_text.setdefault(t, []).append(i)
        fw = sorted(pairs)
        self.fw, self.fw_ids = [t for t, _ in fw], [i for _, i in fw]
        bw = sorted((t[::-1], i) for t, i in pairs)
        self.bw, self.bw_ids = [t for t, _ in bw], [i for _, i in bw]
        self.mark_ids = [i for t, i in pairs if _PUNCT_THEN_MARK.match(t)]
        self.boundary_ids = [i for t, i in pairs if re.search(r"[.?!\n]", t)]
        self.vocab_size = lm.vocab_size

    def starting_with(self, head: str) -> list[int]:
        lo = bisect.bisect_left(self.fw, head)
        return self.fw_ids[lo : bisect.bisect_left(self.fw, head + _TOP, lo)]

    def ending_with(self, tail: str) -> list[int]:
        rev = tail[::-1]
        lo = bisect.bisect_left(self.bw, rev)
        return self.bw_ids[lo : bisect.bisect_left(self.bw, rev + _TOP, lo)]

    @functools.lru_cache(maxsize=4096)  # noqa: B019 - one _Pieces per LM, kept while the LM lives
    def containing(self, target: str, mark: bool) -> tuple[int, ...]:
        if len(target) > self.longest:
            return ()
        pattern = re.compile(re.escape(target) + (_PUNCT_THEN_MARK.pattern if mark else ""))
        return tuple(i for t, i in zip(self.fw, self.fw_ids) if target in t and pattern.search(t))

    def _ends_word(self, head: str, mark: bool) -> tuple[bool, bool]:
        """Tokens ``head`` + rest: whether a rest ends the string (with its mark, for
        ``mark``), and whether one is punctuation only (the mark may follow in another token)."""
        done = more = False
        lo = bisect.bisect_left(self.fw, head)
        for t in self.fw[lo : bisect.bisect_left(self.fw, head + _TOP, lo)]:
            tail = t[len(head) :]
            if not mark or _PUNCT_THEN_MARK.match(tail):
                return True, True
            more = more or _PUNCT_ONLY.fullmatch(tail) is not None
        return done, more

    @functools.lru_cache(maxsize=4096)  # noqa: B019 - one _Pieces per LM, kept while the LM lives
    def spell(self, target: str, mark: bool) -> Spelling:
        n, big = len(target), len(target) + 2
        after = [0] * (n + 1)
        if mark:  # the mark (after optional punctuation) still to write, in a token of its own
            after[n] = 1 if self.mark_ids else big
        for j in range(n - 1, -1, -1):
            done, more = self._ends_word(target[j:], mark)
            best = 1 if done else (1 + after[n] if more else big)
            for k in range(j + 1, min(n, j + self.longest) + 1):
                if target[j:k] in self.exact:
                    best = min(best, 1 + after[k])
            after[j] = best
        fresh = 1 if self.containing(target, mark) else big
        for k in range(1, n + 1):
            if target[:k] in self.suffixes:
                fresh = min(fresh, 1 + after[k])
        return Spelling(target, fresh, tuple(after), mark)


@dataclass(frozen=True)
class Spelling:
    """The fewest tokens that write ``target`` (lower-cased) into a text.

    Attributes
    ----------
    target
        The lower-cased string.
    fresh
        Tokens needed to write it anywhere, each token free to carry other characters
        before the string's start and after its end (``len(target) + 2`` when no token
        sequence can spell it).
    after
        ``after[j]``: tokens needed to write ``target[j:]`` when ``target[:j]`` ends the text
        already (``after[len(target)]`` is 0, or the mark's token with ``mark``).
    mark
        Whether a sentence mark must follow ``target`` (optionally after punctuation): the
        last word of a sentence that another sentence follows.
    word
        Whether ``target`` is a judge word (it counts as written only where no letter or
        digit is glued to it) rather than any string.
    sentence
        Whether ``target`` is a whole sentence: it counts as written only where it may start
        a sentence (:func:`may_start_sentence`).
    """

    target: str
    fresh: int
    after: tuple[int, ...]
    mark: bool = False
    word: bool = False
    sentence: bool = False


def spelling(
    lm: LanguageModel, target: str, mark: bool = False, word: bool = False, sentence: bool = False
) -> Spelling:
    """:class:`Spelling` of ``target`` (case-insensitive) over ``lm``'s vocabulary.

    Sound for any tokenisation: a token sequence whose text contains ``target`` (ignoring
    case; with ``mark``, followed by punctuation and a ``.``, ``?`` or ``!``) has at least
    ``fresh`` tokens that touch it. ``word`` and ``sentence`` only change where the target
    counts as already written (:func:`find_spelled`).
    """
    if not isinstance(target, str):
        raise TypeError(f"target must be a str, got {type(target).__name__}")
    s = _pieces(lm).spell(target.lower(), bool(mark))
    return Spelling(s.target, s.fresh, s.after, s.mark, bool(word), bool(sentence))


@functools.lru_cache(maxsize=4096)
def copy_under_way(text: str, target: str) -> tuple[int, int] | None:
    """``(start, written)``: the longest copy of the sentence ``target`` (as given, in any
    case) that ``text`` ends with, starting where a sentence may start
    (:func:`may_start_sentence`); ``written == len(target)`` for a finished copy, which
    marks, quotes and spaces may follow (the judge strips them from a sentence's end).
    None when there is none. ``copy_under_way("It rained. The c", "The cat") == (11, 5)``."""
    goal, low = target.lower(), text.lower()
    bare = goal.rstrip(_STRIPPED)
    for i in range(max(0, len(text) - len(target) - _AFTER_COPY), len(text)):
        if not may_start_sentence(text, i):
            continue
        if goal.startswith(low[i:]):
            return i, len(text) - i
        if bare and low[i:].rstrip(_STRIPPED) == bare:
            return i, len(target)
    return None


def may_start_sentence(text: str, i: int) -> bool:
    """Whether a judge sentence's cleaned text may start at ``text[i]`` (``text`` starting a
    paragraph): only characters without letters or digits stand between ``i`` and the
    paragraph start or a ``.``, ``?`` or ``!`` before it. Punkt breaks only after such a
    mark, and the judge strips only punctuation and whitespace from a sentence's start."""
    j = i
    while j > 0:
        ch = text[j - 1]
        if ch.isalnum() or ch == "_":
            return False
        if ch in ".?!":
            return True
        j -= 1
    return True


def _pieces(lm: LanguageModel) -> _Pieces:
    return lm_table(lm, "text_budget.pieces", _Pieces)


def _overlaps(spelled: Spelling, text_lower: str, start: int = 0) -> list[int]:
    """Lengths ``j >= 1`` of the starts of the target that end the text after ``start`` (for
    a word, only where no letter or digit is glued before it: ``extrawnik`` never becomes
    ``trawniki``; for a sentence, only where a sentence may start)."""
    target, n = spelled.target, len(text_lower)
    top = len(target) if spelled.mark else len(target) - 1
    glued = spelled.word and target not in _SECOND_PARTS
    return [
        j
        for j in range(min(top, n - start), 0, -1)
        if text_lower.endswith(target[:j])
        and not (glued and n - j > start and _GLUE.match(text_lower, n - j - 1))
        and not (spelled.sentence and not may_start_sentence(text_lower, n - j))
    ]


_GLUE = re.compile(r"[a-z0-9]")
_FIRST_PARTS = frozenset({"can", "gim", "gon", "got", "lem", "wan", "d", "more"})
_SECOND_PARTS = frozenset({"not", "me", "na", "ta", "'ye", "'n", "n't"})


@functools.lru_cache(maxsize=4096)
def _presence(target: str, mark: bool, word: bool) -> re.Pattern:
    """Where ``target`` may already stand as written: anywhere (a sentence), or as a word
    (no letter or digit glued to it, but for the Treebank contractions ``can|not``,
    ``do|n't``), with ``mark``: followed by punctuation and a sentence mark."""
    body = re.escape(target)
    if word and target not in _SECOND_PARTS:
        body = "(?<![a-z0-9])" + body
    if mark:
        return re.compile(body + _PUNCT_THEN_MARK.pattern)
    if word and target not in _FIRST_PARTS:
        body += "(?:(?![a-z0-9])|(?=n't))"
    return re.compile(body)


def find_spelled(spelled: Spelling, text_lower: str, start: int = 0) -> int | None:
    """The end of the first place from ``start`` where the target may already stand (see
    :func:`spelling`'s ``word`` and ``mark``), or None."""
    pattern = _presence(spelled.target, spelled.mark, spelled.word)
    found = pattern.search(text_lower, start)
    while (
        found is not None and spelled.sentence and not may_start_sentence(text_lower, found.start())
    ):
        found = pattern.search(text_lower, found.start() + 1)  # overlapping places too
    return None if found is None else found.end()


def overlap_need(spelled: Spelling, text_lower: str, start: int = 0) -> int:
    """Tokens still needed to have ``spelled.target`` in a text that is ``text_lower`` so far
    (looking from ``start`` on): 0 when it may stand there already, else the best of writing
    it anew and finishing a start of it that ends the text."""
    if find_spelled(spelled, text_lower, start) is not None:
        return 0
    need = spelled.fresh
    for j in _overlaps(spelled, text_lower, start):
        need = min(need, spelled.after[j])
    return need


def progress_mask(lm: LanguageModel, spelled: Spelling, text_lower: str) -> torch.Tensor:
    """``(V,)`` bool: a superset of the tokens after which :func:`overlap_need` of the text
    drops below its value now (the tokens that write more of the target, or start it)."""
    pieces = _pieces(lm)
    target, after = spelled.target, spelled.after
    need = overlap_need(spelled, text_lower)
    ids: list[int] = list(pieces.containing(target, spelled.mark))
    for j in [0, *_overlaps(spelled, text_lower)]:
        if j == len(target):  # only the mark is missing
            ids += pieces.mark_ids
            continue
        ids += pieces.starting_with(target[j:])
        for k in range(j + 1, min(len(target), j + pieces.longest) + 1):
            if after[k] < need:
                ids += pieces.by_text.get(target[j:k], [])
    for k in range(1, len(target) + 1):
        if after[k] < need:
            ids += pieces.ending_with(target[:k])
    mask = torch.zeros(pieces.vocab_size, dtype=torch.bool)
    if ids:
        mask[ids] = True
    return mask.to(lm.device)


def ids_mask(lm: LanguageModel, which: str) -> torch.Tensor:
    """``(V,)`` bool of the tokens holding a sentence mark or a newline (``"boundary"``)."""
    if which != "boundary":
        raise ValueError(f"which must be 'boundary', got {which!r}")

    def build(lm: LanguageModel) -> torch.Tensor:
        mask = torch.zeros(lm.vocab_size, dtype=torch.bool)
        mask[_pieces(lm).boundary_ids] = True
        return mask.to(lm.device)

    return lm_table(lm, "text_budget.boundary_mask", build)


def can_share(lm: LanguageModel, words: Sequence[str]) -> bool:
    """Whether one token of ``lm`` can hold the end of one of ``words`` and the start of
    another (two separate judge words): a non-empty end, then punctuation (or nothing, when
    the two make a contraction such as ``can`` + ``not``), then a non-empty start."""
    return len(words) > 1 and _share(_pieces(lm), tuple(sorted(w.lower() for w in words)))


_CONTRACTED = ("cannot", "gimme", "gonna", "gotta", "lemme", "wanna", "n't")


@functools.lru_cache(maxsize=1024)
def _share(pieces: _Pieces, words: tuple[str, ...]) -> bool:
    for x, a in enumerate(words):
        for y, b in enumerate(words):
            if x == y:
                continue
            ends = "|".join(re.escape(a[-i:]) for i in range(1, len(a) + 1))
            starts = "|".join(re.escape(b[:j]) for j in range(1, len(b) + 1))
            pattern = re.compile(f"(?:{ends})([^a-z0-9\\s]*)(?:{starts})")
            for t in pieces.texts:
                m = pattern.search(t)
                while m is not None:
                    if m.group(1) or any(c in t for c in _CONTRACTED):
                        return True
                    m = pattern.search(t, m.start() + 1)
    return False


def first_tokens(lm: LanguageModel, strings: Sequence[str]) -> tuple[int, ...]:
    """The first token of the LM's own tokenisation of each non-empty string, when that
    token's text starts the string (a token that can begin writing it), once each.
    Memoised per LM and string (hints ask for the same strings at every step)."""
    memo = lm_table(lm, "text_spelling.first_tokens", lambda lm: LRU(4096))
    out: dict[int, None] = {}
    for s in strings:
        if not s:
            continue
        first = memo.get(s)
        if first is None:
            first = _first_token(lm, s)
            memo.put(s, first)
        if first >= 0:
            out[first] = None
    return tuple(out)


def _first_token(lm: LanguageModel, s: str) -> int:
    """The first token of ``s`` if its text starts ``s``, else -1."""
    try:
        ids = lm.encode(s)
    except ValueError:  # a vocabulary that cannot spell it
        return -1
    if ids and lm.vocab[ids[0]] and s.startswith(lm.vocab[ids[0]]):
        return int(ids[0])
    return -1
