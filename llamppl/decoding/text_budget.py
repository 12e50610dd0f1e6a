r"""Vocabulary facts for text-structure constraints: what one token can add, and the fewest
tokens that can spell a string.

The constraints of :mod:`~llamppl.decoding.text_structure` end a particle when its text can
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
- :func:`spelling`: the fewest tokens whose concatenation spells a string, case-insensitively
  (:class:`Spelling`), by dynamic programming over the vocabulary's prefixes and suffixes::

    from llamppl.decoding.text_budget import spelling
    s = spelling(lm, "republicanism")
    s.fresh        # tokens to write it anew, whatever comes before and after (e.g. 3)
    s.after[5]     # tokens to finish it when "repub" already ends the text
"""

from __future__ import annotations

import bisect
import functools
import re
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from llamppl.lm.base import LanguageModel
from llamppl.lm.memo import lm_table

from . import text_units as tu

__all__ = [
    "token_lengths",
    "max_token_chars",
    "char_key",
    "char_codes",
    "UnitGrowth",
    "unit_growth",
    "LayoutFacts",
    "layout_facts",
    "Spelling",
    "spelling",
    "find_spelled",
    "overlap_need",
    "progress_mask",
    "ids_mask",
    "can_share",
]

_NONWORD = "[)\";}\\]*:@'({\\[\u2018\u2019\u201c\u201d\xab\xbb?!]"  # Punkt's NonWord characters
_BOUNDARY_INSIDE = re.compile(f"[.?!]{_NONWORD}+\\S*?[^\\W_]")
_INNER_SPACE = re.compile(r"\S\s+\S")


def _text_ids(lm: LanguageModel) -> list[int]:
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
        texts = [lm.vocab[i] for i in _text_ids(lm)]
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
        texts = [lm.vocab[i] for i in _text_ids(lm)]
        return LayoutFacts(
            inner_space=any(_INNER_SPACE.search(t) for t in texts),
            boundary_inside=any(_BOUNDARY_INSIDE.search(t) for t in texts),
            newline_with_text=any(re.search(r"\S\n|\n\S", t) for t in texts),
        )

    return lm_table(lm, "text_budget.layout_facts", build)


_PUNCT_THEN_MARK = re.compile(r"[^\w\s]*[.?!]")
_PUNCT_ONLY = re.compile(r"[^\w\s]*")
_TOP = "\U0010ffff"


class _Pieces:
    """The lower-cased token texts of an LM: a set of them, of their prefixes and suffixes
    (for the spelling DP), and sorted orders to list the tokens that start or end with a
    string (for budget masks)."""

    def __init__(self, lm: LanguageModel) -> None:
        pairs = [(lm.vocab[i].lower(), i) for i in _text_ids(lm) if lm.vocab[i]]
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
    """

    target: str
    fresh: int
    after: tuple[int, ...]
    mark: bool = False
    word: bool = False


def spelling(lm: LanguageModel, target: str, mark: bool = False, word: bool = False) -> Spelling:
    """:class:`Spelling` of ``target`` (case-insensitive) over ``lm``'s vocabulary.

    Sound for any tokenisation: a token sequence whose text contains ``target`` (ignoring
    case; with ``mark``, followed by punctuation and a ``.``, ``?`` or ``!``) has at least
    ``fresh`` tokens that touch it. ``word`` only changes where the target counts as
    already written (:func:`find_spelled`).
    """
    if not isinstance(target, str):
        raise TypeError(f"target must be a str, got {type(target).__name__}")
    spelled = _pieces(lm).spell(target.lower(), bool(mark))
    return (
        spelled
        if not word
        else Spelling(spelled.target, spelled.fresh, spelled.after, spelled.mark, True)
    )


def _pieces(lm: LanguageModel) -> _Pieces:
    return lm_table(lm, "text_budget.pieces", _Pieces)


def _overlaps(spelled: Spelling, text_lower: str) -> list[int]:
    """Lengths ``j >= 1`` of the starts of the target that end the text."""
    target = spelled.target
    top = len(target) if spelled.mark else len(target) - 1
    return [j for j in range(min(top, len(text_lower)), 0, -1) if text_lower.endswith(target[:j])]


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
    found = _presence(spelled.target, spelled.mark, spelled.word).search(text_lower, start)
    return None if found is None else found.end()


def overlap_need(spelled: Spelling, text_lower: str, start: int = 0) -> int:
    """Tokens still needed to have ``spelled.target`` in a text that is ``text_lower`` so far
    (looking from ``start`` on): 0 when it may stand there already, else the best of writing
    it anew and finishing a start of it that ends the text."""
    if find_spelled(spelled, text_lower, start) is not None:
        return 0
    need = spelled.fresh
    for j in _overlaps(spelled, text_lower[start:]):
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
