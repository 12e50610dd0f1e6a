"""The COLLIE program's own choices, beside COLLIE's constraints (``bench_collie.py``).

- :func:`token_budget`: ``max_tokens`` for an instance, read from its constraint's counts
  and targets (never from the prompt's id);
- :class:`PlainCharacters` (:func:`plain_characters` per instance): a constraint of our
  own that keeps the text plain (letters, spaces, simple marks followed by a space, the
  targets' own characters). The target is the LM conditioned on COLLIE's constraint and
  this one, still exactly; the judge never sees it.
"""

from __future__ import annotations

import re
import string
from typing import Any

import torch

from llamppl.decoding.constraints.protocol import Constraint
from llamppl.lm.memo import lm_table

TOKENS_PER_WORD = (
    1.4  # SmolLM2 tokens per judge word of plain English, punctuation included, with room
)
WORDS_PER_SENTENCE = 18  # room per free sentence when nothing bounds its length
MAX_TOKENS = 400


def token_budget(lm: Any, constraint: Any) -> int:
    """``max_tokens`` for one constraint, derived from its counts and targets.

    Room for what the constraint asks: characters (half a token each, plus 12), words (2
    tokens each, plus 12), required words (their own tokens and a free sentence, plus 12),
    sentences (so many words each: the upper bound, else 5/4 of the
    lower bound plus 4, else :data:`WORDS_PER_SENTENCE`; :data:`TOKENS_PER_WORD` tokens per
    word), the target sentences of
    paragraphs (their own tokens, free sentences, 8 tokens per paragraph); at least 24 and
    at most :data:`MAX_TOKENS`. It reads the constraint, never the prompt's id.
    """
    from llamppl.decoding.constraints.protocol import AllOf
    from llamppl.decoding.text.builders import (
        CharCount,
        EachAt,
        EachCount,
        UnitCount,
        WordsIncluded,
    )

    parts = constraint.parts if isinstance(constraint, AllOf) else (constraint,)
    need, sentences, words_each = 24, None, None
    for p in parts:
        if isinstance(p, CharCount):
            n = p.bounds.hi if p.bounds.hi is not None else p.bounds.lo
            need = max(need, n // 2 + 12)
        elif isinstance(p, UnitCount) and p.level == "word":
            n = p.bounds.hi if p.bounds.hi is not None else p.bounds.lo + 8
            need = max(need, 2 * n + 12)
        elif isinstance(p, UnitCount) and p.level == "sentence":
            sentences = p.bounds.hi if p.bounds.hi is not None else p.bounds.lo
        elif isinstance(p, EachCount) and (p.outer, p.inner) == ("sentence", "word"):
            words_each = p.bounds.hi if p.bounds.hi is not None else p.bounds.lo * 5 // 4 + 4
        elif isinstance(p, EachAt) and not isinstance(p.targets, str):
            if p.outer == "sentence":
                sentences = len(p.targets)
            else:
                own = sum(len(lm.encode(t)) + 2 for t in p.targets)
                free = max(1, p.min_inner - 1) * len(p.targets)
                room = int(free * WORDS_PER_SENTENCE * TOKENS_PER_WORD) + 8 * len(p.targets)
                need = max(need, own + room + 16)
        elif isinstance(p, WordsIncluded):  # a sentence around the required words
            own = sum(len(lm.encode(" " + w)) for w in p.words)
            need = max(need, own + int(WORDS_PER_SENTENCE * TOKENS_PER_WORD) + 12)
    if sentences is not None:
        per = words_each if words_each is not None else WORDS_PER_SENTENCE
        need = max(need, int(sentences * per * TOKENS_PER_WORD) + 16)
    return min(MAX_TOKENS, need)


PLAIN = frozenset(string.ascii_letters + " .,;:!?'")
NEWLINE = "\n"
GLUED = re.compile(r"[.,;:!?][^\s'\"]")  # a mark with a letter or another mark right after it
RUN_START = re.compile(r"\S*")  # a token's leading run, up to its first whitespace
QUOTES = ("'", '"')
OPENER = re.compile(r"[.?!]\s+[.,;:!?'\"]")  # a mark or quote opening a sentence (inside)
START_OPENER = re.compile(r"^\s*[.,;:!?'\"]")  # one opening the text's first sentence
SENTENCE_GAP = re.compile(r"(^\s*|[.?!]\s+)$")  # a sentence may start right after this
OPEN_QUOTE = re.compile(r"(?<=\W)['\"]")  # a quote after a space, mark or quote (inside)
# an open quote, a mark after a space, two spaces
LOOSE = re.compile(OPEN_QUOTE.pattern + r"|\s[.,;:!?]| {2}")
MAX_RUN = 20  # characters between whitespace, unless a target has a longer run


def open_run(text: str) -> int:
    """The length of the run of non-whitespace characters ``text`` ends with."""
    n = 0
    for ch in reversed(text):
        if ch.isspace():
            break
        n += 1
    return n


class PlainCharacters(Constraint):
    """Our program's own constraint (not COLLIE's): the text uses only ASCII letters, spaces,
    ``. , ; : ! ? '``, newlines when ``newlines``, and the characters of ``extra`` (the
    instance's targets, so a required word or sentence can always be written); with
    ``spaced_marks``, a mark is followed by whitespace, a quote or the end (no ``a.b`` nor
    ``...``); with ``max_run``, no run of characters between whitespace is longer (no
    ``thivestruthincorracan...``, one endless word for the judge); without
    ``open_marks``, no mark or quote opens a sentence (``. 'Based,`` or ``.  ,`` leave
    Punkt's break before them undecided for good, so the prefix check cannot refuse what
    follows), a quote follows a letter (``It's``, ``students'``), never a space, a mark or
    a quote (``,  'Denched``, ``And,'smallville``: the word split stays undecided, and every
    particle of such COLLIE runs died there), and no mark follows a space and no space
    another (``late,   ,  ,``; a sentence padded with spaces). Exact, with a cheap mask from
    per-LM tables. It keeps particles out of text the prefix analysis cannot read
    (brackets, URLs, digits, runs glued by dots, endless words), where no unit is certain
    and a dead end would only show at the token limit (or after a scan of the vocabulary).
    """

    def __init__(
        self,
        newlines: bool,
        extra: str = "",
        spaced_marks: bool = True,
        max_run: int | None = None,
        open_marks: bool = True,
    ) -> None:
        self.chars = PLAIN | ({NEWLINE} if newlines else set()) | set(extra)
        self.spaced_marks, self.max_run, self.open_marks = spaced_marks, max_run, open_marks

    def __call__(self, text: str) -> bool:
        return self._inner(text) and (self.open_marks or not START_OPENER.match(text))

    def _inner(self, text: str) -> bool:
        """The rules inside ``text``, as if a word came before it."""
        if self.max_run is not None and any(len(r) > self.max_run for r in text.split()):
            return False
        if not self.open_marks and (OPENER.search(text) or LOOSE.search(text)):
            return False
        return all(ch in self.chars for ch in text) and not (
            self.spaced_marks and GLUED.search(text)
        )

    def allowed_mask(self, lm: Any, text: str) -> torch.Tensor:
        key = ("bench_collie.plain", repr(self))
        plain, spaced, lead, opener, spaced_opener, quote, mark, space = lm_table(
            lm, key, self._tables
        )
        ok = self(text)  # one scan of the text per mask
        mask = plain.clone() if ok else torch.zeros_like(plain)
        if self.spaced_marks and text[-1:] in tuple(".,;:!?"):
            mask &= spaced  # after a mark: whitespace, a quote (or nothing) first
        if self.max_run is not None:  # the open run goes on with the token's leading run
            mask &= lead + open_run(text) <= self.max_run
        if not self.open_marks and SENTENCE_GAP.search(text):
            mask &= ~opener  # no mark or quote opens the sentence that may start here
        elif not self.open_marks and text[-1:] in tuple(".?!"):
            mask &= ~spaced_opener  # nor after the space the token brings
        if not self.open_marks and OPEN_QUOTE.search(text[-1:] + "'"):
            mask &= ~quote  # a quote only right after a letter
        if not self.open_marks and text[-1:].isspace():
            mask &= ~(mark | space) if text[-1] == " " else ~mark  # no mark, space after a space
        mask[list(lm.eos_token_ids)] = ok
        return mask.to(lm.device)

    def _tables(self, lm: Any) -> tuple[torch.Tensor, ...]:
        """Per token: passes inside a text; starts with whitespace or a quote; the length of
        its leading run (up to its first whitespace); a mark or quote after its leading
        whitespace, if any; the same after some whitespace; starts with a quote, a mark, a
        space."""
        plain = torch.tensor([self._inner(t) for t in lm.vocab])
        spaced = torch.tensor([t[:1] in ("", *QUOTES) or t[0].isspace() for t in lm.vocab])
        lead = torch.tensor([len(RUN_START.match(t).group()) for t in lm.vocab])
        opens = [bool(START_OPENER.match(t)) for t in lm.vocab]
        spaced_opens = [o and t[:1].isspace() for o, t in zip(opens, lm.vocab)]
        quote = torch.tensor([t[:1] in QUOTES for t in lm.vocab])
        mark = torch.tensor([t[:1] in tuple(".,;:!?") for t in lm.vocab])
        space = torch.tensor([t[:1] == " " for t in lm.vocab])
        opens, spaced_opens = torch.tensor(opens), torch.tensor(spaced_opens)
        return plain, spaced, lead, opens, spaced_opens, quote, mark, space

    def __repr__(self) -> str:
        extra = "".join(sorted(self.chars - PLAIN))
        run = f", max_run={self.max_run}" if self.max_run is not None else ""
        quotes = "" if self.open_marks else ", open_marks=False"
        return f"plain_characters({extra!r}, spaced_marks={self.spaced_marks}{run}{quotes})"


def target_strings(targets: Any) -> list[str]:
    """The strings among an instance's ``targets`` (nested lists; counts left out)."""
    if isinstance(targets, str):
        return [targets]
    if isinstance(targets, list):
        return [s for t in targets for s in target_strings(t)]
    return []


def plain_characters(inst: dict, constraint: Constraint) -> PlainCharacters:
    """The program's :class:`PlainCharacters` for one instance and its constraint: newlines
    only where paragraphs are asked for; the targets' characters allowed; where words or
    sentences are counted or placed (not for character constraints, whose texts need no
    word split): runs capped at ``MAX_RUN`` (or a target's longest run), plain spacing and
    quoting (no mark or quote opening a sentence, no quote after a space or mark, no mark
    after a space, no two spaces) unless a target breaks those rules, and marks spaced unless
    a target glues one (``U.S.``)."""
    from llamppl.decoding.constraints.protocol import AllOf
    from llamppl.decoding.text.builders import CharCount, CharsAt

    strings = target_strings(inst["targets"])
    parts = constraint.parts if isinstance(constraint, AllOf) else (constraint,)
    characters = any(isinstance(p, (CharCount, CharsAt)) for p in parts)
    glued = any(GLUED.search(s) for s in strings)
    newlines = "paragraph" in repr(constraint)
    runs = [r for s in strings for r in s.split()]
    return PlainCharacters(
        newlines,
        "".join(strings),
        spaced_marks=not (characters or glued),
        max_run=None if characters else max([MAX_RUN, *map(len, runs)]),
        open_marks=characters
        or any(START_OPENER.match(r) for r in runs)
        or any(OPENER.search(t) or LOOSE.search(t) for t in strings),
    )
