"""Question cues: what the words of a question say the query's shape must be.

A small LM writes the SQL it finds likely, not the SQL the question asks for: ``Sort employee
names by their age`` answered with ``... WHERE age > (SELECT ...)``, ``How many flights?``
with ``SELECT max(FlightNo) ...``. Some of the question's words name a feature of the query
outright, and :class:`~llamppl.models.TextToSQL` weighs each query by how well its features
agree with them, a potential on the finished text::

    log φ(y) = −λ · (asked(q) ∖ has(y)  +  has(y) ∖ motivated(q))        (counted in features)

with ``asked(q)`` the features the question's words ask for (``how many`` → a ``count(``,
``sorted``/``ascending`` → ``ORDER BY``, ``average`` → ``avg(``, ``each`` → ``GROUP BY``,
``different`` → ``DISTINCT``, ``youngest``/``most`` → ``LIMIT`` or ``max``/``min``,
``descending`` → ``DESC``, ...; :data:`CUES`), ``has(y)`` the features the
query has, and ``motivated(q)`` the features a word of the question could motivate at all
(an aggregate, ``GROUP BY``, ``LIMIT``, a nested ``SELECT``, ``NOT``, ``*``, four or more
result columns: features the LM adds on its own far more often than questions ask for them). The program's target is then::

    P(y) ∝ p(y EOS | x) · 1_sql(y) · φ(y)

The penalty for an unmotivated feature is scored as soon as the feature appears (it never
goes away as the query grows), the one for a missing feature when the query ends; the total
is the same ``log φ(y)``, so this is the target above, not a heuristic on top of it. λ = 0
turns the cues off and leaves the LM's own conditional. The cue words are English words for
query features, fixed once for all databases (never tuned per database or question)::

    from llamppl.models.sql_cues import cue_penalty
    cue_penalty("How many flights are there?", "SELECT max(FlightNo) FROM flights")   # 2
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["CUES", "WIDE", "Cue", "asked", "cue_penalty", "features", "motivated", "wide"]


@dataclass(frozen=True)
class Cue:
    """A feature of a query (``has``: a regular expression on the query, case ignored, or a
    function of the query), the question words that ask for it (``asks``), and the words that
    could motivate it at all (``allows``; None: the feature is never penalised for being
    there)."""

    name: str
    has: str | Callable[[str], bool]
    asks: str | None
    allows: str | None = None


#: Result columns from which a result counts as wide (``SELECT a, b, c, d``).
WIDE = 4


def wide(query: str) -> bool:
    """Whether the first ``SELECT`` lists at least :data:`WIDE` result columns (commas outside
    parentheses and quotes, before a ``FROM``); true of a prefix as soon as it is of the text."""
    depth, commas, quote, word = 0, 0, "", ""
    for ch in query:
        if quote:
            quote = "" if ch == quote else quote
            continue
        if ch in "'\"`":
            quote = ch
        elif ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        elif ch == "," and depth == 0:
            commas += 1
        if ch.isalnum() or ch == "_":
            word += ch.lower()
            continue
        if word == "from" and depth == 0:
            break
        word = ""
    return commas + 1 >= WIDE


_SUPERLATIVE = (
    r"\b(most|least|highest|lowest|largest|smallest|biggest|greatest|maximum|minimum|max|min|"
    r"oldest|youngest|newest|latest|earliest|best|worst|top|first|last|longest|shortest|"
    r"fewest|\w+est)\b"
)
#: Superlatives that ask for one extreme row or value (``ORDER BY ... LIMIT`` or ``max``/``min``).
_EXTREME = (
    r"\b(most|least|highest|lowest|largest|smallest|biggest|greatest|maximum|minimum|oldest|"
    r"youngest|newest|earliest|latest|longest|shortest|fewest|heaviest|lightest|cheapest)\b"
)
_AMOUNT = r"\b(how many|number|count|total|sum|average|mean|avg)\b"

#: The cues (module docstring): features, the words asking for them, the words allowing them.
CUES: tuple[Cue, ...] = (
    Cue(
        "count",
        r"\bcount\s*\(",
        r"\b(how many|number of|count)\b",
        _AMOUNT
        + "|"
        + _SUPERLATIVE
        + r"|\b(each|per|every|more than|less than|fewer than|at least|popular|common|frequent)\b",
    ),
    Cue("avg", r"\bavg\s*\(", r"\b(average|mean)\b", r"\b(average|mean)\b"),
    Cue("sum", r"\bsum\s*\(", r"\b(total|sum)\b", r"\b(total|sum|combined|altogether)\b"),
    Cue("max/min", r"\b(max|min)\s*\(", None, _SUPERLATIVE + r"|\b(range|maximum|minimum)\b"),
    Cue(
        "order",
        r"\border\s+by\b",
        r"\b(sort|sorted|order|ordered|ascending|descending|alphabetical|alphabetically)\b",
        None,
    ),
    Cue(
        "group",
        r"\bgroup\s+by\b",
        r"\b(each|per|every)\b",
        r"\b(each|per|every|different|distinct|unique|by|for all|more than|at least|fewer than|"
        r"less than)\b|" + _SUPERLATIVE + "|" + _AMOUNT,
    ),
    Cue(
        "distinct",
        r"\bdistinct\b",
        r"\b(different|distinct|unique)\b",
        r"\b(different|distinct|unique|all|which|list|what)\b",
    ),
    Cue("limit", r"\blimit\b", None, _SUPERLATIVE + r"|\b(one|single)\b"),
    Cue("extreme", r"\blimit\b|\b(max|min)\s*\(", _EXTREME, None),
    Cue(
        "desc",
        r"\bdesc\b",
        r"\b(descending|decreasing)\b",
        _SUPERLATIVE + r"|\b(descending|decreasing|reverse|high|large|big)\b",
    ),
    Cue(
        "not",
        r"\bnot\b|!=|<>|\bexcept\b",
        r"\b(not|without|never|no|none|except|excluding|other than)\b|n't\b",
        r"\b(not|without|never|no|none|except|excluding|other|than|but|only)\b|n't\b",
    ),
    Cue(
        "nested",
        r"\(\s*select\b",
        None,
        r"\b(not|without|never|no|than the|than any|than all|than average|average|who|whose|that|"
        r"which|those|except|excluding|both|either)\b|n't\b|" + _SUPERLATIVE,
    ),
    Cue("wide", wide, None, r"\b(information|info|details|everything|attributes)\b"),
    Cue(
        "star",
        r"\bselect\s+(distinct\s+)?(\w+\.)?\*|,\s*(\w+\.)?\*",
        None,
        r"\b(information|info|details|everything|attributes|all the data)\b",
    ),
    Cue(
        "compare",
        r"[<>]",
        r"\b(more|less|greater|fewer|larger|smaller|higher|lower|above|"
        r"below|over|under|older|younger|before|after|exceed|exceeds|at least|at most)\b",
        None,
    ),
)


def _search(pattern: str | Callable[[str], bool], text: str) -> bool:
    if callable(pattern):
        return pattern(text)
    return re.search(pattern, text, re.IGNORECASE) is not None


def features(query: str) -> frozenset[str]:
    """The cue features the query (or a prefix of it) has (:data:`CUES`)."""
    return frozenset(c.name for c in CUES if _search(c.has, query))


def asked(question: str) -> frozenset[str]:
    """The features the question's words ask for."""
    return frozenset(c.name for c in CUES if c.asks is not None and _search(c.asks, question))


def motivated(question: str) -> frozenset[str]:
    """The features a word of the question could motivate (a feature whose ``allows`` is None
    always counts as motivated)."""
    return frozenset(c.name for c in CUES if c.allows is None or _search(c.allows, question))


def cue_penalty(question: str, query: str, *, finished: bool = True) -> int:
    """How many features disagree with the question: missing ones it asks for (only once
    ``finished``; a prefix may still write them) and present ones it does not motivate."""
    if not isinstance(question, str) or not isinstance(query, str):
        raise TypeError("question and query must be str")
    has = features(query)
    extra = len(has - motivated(question))
    return extra + (len(asked(question) - has) if finished else 0)
