r"""Plain characters: the text builders' default restriction of a text to plain prose.

COLLIE's judge splits any text into words and sentences, junk included: ``Amarahah"\n\n5/15``
is text, ``therazorlitacheer`` one long word, ``a.b`` one word and ``Defied.fight.Son`` a
sentence the judge may split several ways. Where a text's words and sentences stay undecided,
the prefix analysis (:mod:`~llamppl.decoding.text.prefix`) can call nothing certain, so a
dead end shows only at the token limit. :class:`PlainCharacters` keeps the text in plain
prose instead: ASCII letters, spaces and ``. , ; : ! ? '``, newlines only when paragraphs
are asked for, and the targets' own characters (a required word or sentence can always be
written), with plain spacing (a mark followed by whitespace; no endless word, no mark or
quote opening a sentence, a quote only after a letter, no mark after a space, no two
spaces). Its batched mask comes from per-LM tables and equals the per-token check.

The text builders (:mod:`~llamppl.decoding.text.builders`) add it by default (``plain=True``):
a conjunction of text constraints carries one :class:`PlainCharacters` part, derived from all
of its text constraints by :func:`plain_for` (:meth:`~llamppl.decoding.text.base.TextConstraint.implied`).
It is part of the target: the posterior is the LM conditioned on the structure *and* plain
characters (exactly; the judge never sees this part). ``plain=False`` on every builder of a
conjunction leaves it out::

    from llamppl.constraints import plain_characters, word_count
    plain_characters(word_count(exactly=8))   # plain_characters('', spaced_marks=True, max_run=20, ...)
    PlainCharacters(newlines=False)("a.b")    # False: a mark glued to a letter
"""

from __future__ import annotations

import re
import string
from collections.abc import Sequence

import torch

from llamppl.decoding.constraints.protocol import Constraint
from llamppl.lm.base import LanguageModel
from llamppl.lm.memo import lm_table
from llamppl.validation import check_positive_int

__all__ = [
    "PLAIN",
    "MAX_RUN",
    "GLUED",
    "PlainCharacters",
    "plain_for",
    "open_run",
]

PLAIN = frozenset(string.ascii_letters + " .,;:!?'")
"""The characters every plain text may use."""
NEWLINE = "\n"
MARKS = tuple(".,;:!?")
GLUED = re.compile(r"[.,;:!?][^\s'\"]")  # a mark with a letter or another mark right after it
RUN_START = re.compile(r"\S*")  # a token's leading run, up to its first whitespace
QUOTES = ("'", '"')
OPENER = re.compile(r"[.?!]\s+[.,;:!?'\"]")  # a mark or quote opening a sentence (inside)
START_OPENER = re.compile(r"^\s*[.,;:!?'\"]")  # one opening the text's first sentence
SENTENCE_GAP = re.compile(r"(^\s*|[.?!]\s+)$")  # a sentence may start right after this
OPEN_QUOTE = re.compile(r"(?<=\W)['\"]")  # a quote after a space, mark or quote (inside)
# an open quote, a mark after a space, two spaces
LOOSE = re.compile(OPEN_QUOTE.pattern + r"|\s[.,;:!?]| {2}")
MAX_RUN = 20
"""Characters between whitespace, unless a target has a longer run."""


def open_run(text: str) -> int:
    """The length of the run of non-whitespace characters ``text`` ends with."""
    n = 0
    for ch in reversed(text):
        if ch.isspace():
            break
        n += 1
    return n


class PlainCharacters(Constraint):
    """The text uses only ASCII letters, spaces, ``. , ; : ! ? '``, newlines when ``newlines``,
    and the characters of ``extra``; with ``spaced_marks``, a mark is followed by whitespace,
    a quote or the end (no ``a.b`` nor ``...``); with ``max_run``, no run of characters
    between whitespace is longer (no ``thivestruthincorracan...``, one endless word for the
    judge); without ``open_marks``, no mark or quote opens a sentence (``. 'Based,`` or
    ``.  ,`` leave Punkt's break before them undecided for good), a quote follows a letter
    (``It's``, ``students'``), never a space, a mark or a quote (``,  'Denched``,
    ``And,'smallville``: the word split stays undecided), and no mark follows a space and no
    space another (``late,   ,  ,``).

    Closed under prefixes (every rule, once broken, stays broken), with a cheap ``(V,)`` mask
    from per-LM tables that equals the per-token check.
    """

    prefix_closed = True

    def __init__(
        self,
        newlines: bool,
        extra: str = "",
        spaced_marks: bool = True,
        max_run: int | None = None,
        open_marks: bool = True,
    ) -> None:
        for name, flag in (
            ("newlines", newlines),
            ("spaced_marks", spaced_marks),
            ("open_marks", open_marks),
        ):
            if not isinstance(flag, bool):
                raise TypeError(f"{name} must be a bool, got {type(flag).__name__}")
        if not isinstance(extra, str):
            raise TypeError(f"extra must be a str, got {type(extra).__name__}")
        if max_run is not None:
            max_run = check_positive_int("max_run", max_run)
        self.chars = PLAIN | ({NEWLINE} if newlines else set()) | set(extra)
        self.spaced_marks, self.max_run, self.open_marks = spaced_marks, max_run, open_marks

    def __call__(self, text: str) -> bool:
        return self.inside(text) and (self.open_marks or not START_OPENER.match(text))

    def inside(self, text: str) -> bool:
        """The rules inside ``text``, as if a word came before it."""
        if self.max_run is not None and any(len(r) > self.max_run for r in text.split()):
            return False
        if not self.open_marks and (OPENER.search(text) or LOOSE.search(text)):
            return False
        return all(ch in self.chars for ch in text) and not (
            self.spaced_marks and GLUED.search(text)
        )

    def allowed_mask(self, lm: LanguageModel, text: str) -> torch.Tensor:
        plain, spaced, lead, opener, spaced_opener, quote, mark, space = lm_table(
            lm, ("text.plain", repr(self)), self.tables
        )
        ok = self(text)  # one scan of the text per mask
        mask = plain.clone() if ok else torch.zeros_like(plain)
        if self.spaced_marks and text[-1:] in MARKS:
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

    def tables(self, lm: LanguageModel) -> tuple[torch.Tensor, ...]:
        """Per token, ``(V,)`` each: passes inside a text; starts with whitespace or a quote;
        the length of its leading run (up to its first whitespace); a mark or quote after its
        leading whitespace, if any; the same after some whitespace; starts with a quote, a
        mark, a space. Built once per LM and constraint (``lm_table``)."""
        plain = torch.tensor([self.inside(t) for t in lm.vocab])
        spaced = torch.tensor([t[:1] in ("", *QUOTES) or t[0].isspace() for t in lm.vocab])
        lead = torch.tensor([len(RUN_START.match(t).group()) for t in lm.vocab])
        opens = [bool(START_OPENER.match(t)) for t in lm.vocab]
        spaced_opens = [o and t[:1].isspace() for o, t in zip(opens, lm.vocab)]
        quote = torch.tensor([t[:1] in QUOTES for t in lm.vocab])
        mark = torch.tensor([t[:1] in MARKS for t in lm.vocab])
        space = torch.tensor([t[:1] == " " for t in lm.vocab])
        opens, spaced_opens = torch.tensor(opens), torch.tensor(spaced_opens)
        return plain, spaced, lead, opens, spaced_opens, quote, mark, space

    def __repr__(self) -> str:
        extra = "".join(sorted(self.chars - PLAIN))
        run = f", max_run={self.max_run}" if self.max_run is not None else ""
        quotes = "" if self.open_marks else ", open_marks=False"
        return f"plain_characters({extra!r}, spaced_marks={self.spaced_marks}{run}{quotes})"


def plain_for(
    strings: Sequence[str], *, paragraphs: bool, characters: bool, run_floor: int = 0
) -> PlainCharacters:
    """The :class:`PlainCharacters` of a conjunction of text constraints.

    Parameters
    ----------
    strings
        Every target string of the conjunction, as given (words, sentences, characters):
        their characters are allowed, their runs fit, and a target that glues a mark
        (``U.S.``), opens with a mark or quote (``'Tis``) or spaces loosely (``a  b``) lifts
        the rule it breaks.
    paragraphs
        Whether some constraint counts or places paragraphs: newlines are allowed.
    characters
        Whether some constraint is on characters (``char_count``, ``chars_at``): such a text
        needs no word split, so only the character set applies (no spacing rules, no cap on
        runs).
    run_floor
        A run every text must be able to hold (the shortest word ``chars_per_word`` allows).
        Runs may be one character longer than this and than every target's run, so a mark
        can follow the longest word.
    """
    strings = [s for s in strings if isinstance(s, str)]
    glued = any(GLUED.search(s) for s in strings)
    runs = [r for s in strings for r in s.split()]
    return PlainCharacters(
        bool(paragraphs),
        "".join(strings),
        spaced_marks=not (characters or glued),
        max_run=None if characters else max([MAX_RUN, run_floor + 1, *(len(r) + 1 for r in runs)]),
        open_marks=bool(characters)
        or any(START_OPENER.match(r) for r in runs)
        or any(OPENER.search(t) or LOOSE.search(t) for t in strings),
    )
