"""Literals taken from a text: the query may only compare with values the question states.

A question says which values matter ("singers older than 20", "cartoons by Ben Jones"); a
small LM also writes conditions nobody asked for (``WHERE age > 18``, ``country = 'Poland'``).
With ``sql(db, literals=question)`` every literal of the query must come from the question
(:func:`literal_error`):

- a string literal (``'...'``, or a ``"..."`` that names no column) must occur in the text,
  case ignored; in a ``LIKE`` pattern, each piece between ``%`` and ``_`` wildcards must;
  one still being written must be (case ignored) a piece of the text so far;
- a number must be one the text writes (``20``, ``3.5``) or spells (``one`` to ``ten``,
  ``once``, ``twice``, ``single``, ``both``); the count of a ``LIMIT`` or ``OFFSET`` is free;
  a number still being written must begin like one of them.

The rule reads only the text before each literal, so it is closed under prefixes. Of the 427
questions of the Spider dev databases shipped for development, 422 state every literal of
their gold query this way (the five others name a value differently: "French" for
``'France'``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from llamppl.decoding.sql.lexer import Token

__all__ = ["Mentioned", "literal_error"]

_NUMBER_WORDS = {
    "one": "1",
    "two": "2",
    "three": "3",
    "four": "4",
    "five": "5",
    "six": "6",
    "seven": "7",
    "eight": "8",
    "nine": "9",
    "ten": "10",
    "once": "1",
    "twice": "2",
    "single": "1",
    "both": "2",
}


@dataclass(frozen=True)
class Mentioned:
    """What a text states: its lower-cased text and the numbers it writes or spells."""

    text: str
    numbers: frozenset[str]

    @classmethod
    def of(cls, text: str) -> Mentioned:
        if not isinstance(text, str):
            raise TypeError(
                f"literals must be a str (the question) or None, got {type(text).__name__}"
            )
        lower = text.lower()
        numbers = set(re.findall(r"\d+(?:\.\d+)?", text))
        numbers |= {v for k, v in _NUMBER_WORDS.items() if re.search(rf"\b{k}\b", lower)}
        return cls(lower, frozenset(_canonical_number(n) for n in numbers))


def _canonical_number(text: str) -> str:
    if "." in text:
        text = text.rstrip("0").rstrip(".")
    return text.lstrip("0") or "0"


def _string_ok(value: str, closed: bool, like: bool, text: str) -> bool:
    value = value.lower()
    if like:
        pieces = [p for p in re.split(r"[%_]", value)]
        if not closed:  # the last piece may still grow
            *done, last = pieces
            return all(p in text for p in done) and last in text
        return all(p in text for p in pieces)
    return value in text


def literal_error(toks: list[Token], mentioned: Mentioned, strings: list[int]) -> str | None:
    """Why a literal among ``toks`` is not taken from the text (module docstring), or None;
    ``strings``: the indices of the tokens SQLite reads as string literals."""
    is_string = set(strings)
    for i, tok in enumerate(toks):
        prev = toks[i - 1].upper if i else ""
        if i in is_string:
            like = prev == "LIKE"
            if not _string_ok(tok.value, tok.closed, like, mentioned.text):
                return f"the literal {tok.text!r} is not in the question"
        elif tok.kind == "number" and prev not in ("LIMIT", "OFFSET"):
            last = i == len(toks) - 1
            number = tok.text
            if last:  # may still grow: it must begin like a stated number
                if not any(
                    n.startswith(number.lstrip("0") or "0") or n.startswith(number)
                    for n in mentioned.numbers
                ):
                    return f"no number in the question begins like {number!r}"
            elif _canonical_number(number) not in mentioned.numbers:
                return f"the number {number} is not in the question"
    return None
