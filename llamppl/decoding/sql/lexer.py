"""SQLite's tokens in a query text, for the checks that read a query (prefixes included).

:func:`tokens` splits a text the way SQLite's tokenizer does, far enough for
:mod:`~llamppl.decoding.sql.checks`: words (keywords and bare identifiers, one maximal run of
``[A-Za-z0-9_$]`` and non-ASCII characters), numbers, ``'...'`` strings (``''`` inside one
is a quote), ``"..."`` / `` `...` `` / ``[...]`` quoted names, and punctuation (``<=``,
``<>``, ``!=``, ``==``, ``>=`` and ``||`` as one token). Whitespace and comments separate
tokens. A string or quoted name the text has not closed yet is a token with ``closed``
False: the checks of a prefix read it as a literal still being written. Every token
carries its parenthesis depth::

    [t.text for t in tokens("SELECT name FROM pets WHERE x = 'a")]
    # ['SELECT', 'name', 'FROM', 'pets', 'WHERE', 'x', '=', "'a"]
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = [
    "CLAUSE_KEYWORDS",
    "OPERAND_KEYWORDS",
    "RESERVED",
    "Token",
    "canonical_sql",
    "has_order_by",
    "is_keyword",
    "tokens",
]

#: Keywords that begin a clause after a complete ``SELECT ... FROM ...`` (an alias may not
#: begin with one).
CLAUSE_KEYWORDS = ("WHERE", "GROUP", "HAVING", "ORDER", "LIMIT", "UNION", "INTERSECT", "EXCEPT")
#: Words that are never an alias.
RESERVED = (
    "SELECT FROM AS ON USING JOIN INNER LEFT OUTER CROSS NATURAL BY ALL DISTINCT AND OR NOT "
    "IN IS NULL LIKE GLOB BETWEEN EXISTS CASE WHEN THEN ELSE END ASC DESC CAST OFFSET ISNULL "
    "NOTNULL ESCAPE COLLATE"
).split()
#: Keywords that end an operand (after them a clause keyword may follow).
OPERAND_KEYWORDS = frozenset(
    "NULL END ASC DESC TRUE FALSE CURRENT_DATE CURRENT_TIME CURRENT_TIMESTAMP ISNULL NOTNULL".split()
)
_KEYWORDS = frozenset(RESERVED) | frozenset(CLAUSE_KEYWORDS) | OPERAND_KEYWORDS


def is_keyword(word: str) -> bool:
    """Whether ``word`` (any case) is one of the keywords above."""
    return word.upper() in _KEYWORDS


_TWO = {"<=", ">=", "<>", "!=", "==", "||"}
_CLOSE = {"'": "'", '"': '"', "`": "`", "[": "]"}
_KIND = {"'": "string", '"': "quoted", "`": "quoted", "[": "quoted"}


@dataclass(frozen=True)
class Token:
    """One token: ``kind`` (``"word"``, ``"number"``, ``"string"``, ``"quoted"`` or
    ``"punct"``), its ``text`` as written, its ``value`` (a string's or quoted name's
    content without quotes and escapes; else the text), ``start`` (offset in the text),
    ``depth`` (open parentheses before it) and ``closed`` (False for a string or quoted name
    the text ends inside)."""

    kind: str
    text: str
    value: str
    start: int
    depth: int
    closed: bool = True

    @property
    def upper(self) -> str:
        """The text in upper case (keywords compare this way)."""
        return self.text.upper()


def _word_char(ch: str) -> bool:
    return ch.isalnum() or ch in "_$" or ord(ch) > 127


def tokens(text: str) -> list[Token]:
    """The tokens of ``text`` (module docstring)."""
    out: list[Token] = []
    i, n, depth = 0, len(text), 0
    while i < n:
        ch = text[i]
        if ch.isspace():
            i += 1
        elif text.startswith("--", i):
            j = text.find("\n", i)
            i = n if j < 0 else j + 1
        elif text.startswith("/*", i):
            j = text.find("*/", i + 2)
            i = n if j < 0 else j + 2
        elif ch in _CLOSE:
            close = _CLOSE[ch]
            j, parts = i + 1, []
            while True:
                k = text.find(close, j)
                if k < 0:  # not closed yet
                    parts.append(text[j:])
                    out.append(Token(_KIND[ch], text[i:], "".join(parts), i, depth, False))
                    i = n
                    break
                parts.append(text[j:k])
                if close != "]" and text.startswith(close * 2, k):  # a doubled quote
                    parts.append(close)
                    j = k + 2
                    continue
                out.append(Token(_KIND[ch], text[i : k + 1], "".join(parts), i, depth))
                i = k + 1
                break
        elif ch.isdigit() or (ch == "." and i + 1 < n and text[i + 1].isdigit()):
            j = i + 1
            while j < n and (_word_char(text[j]) or text[j] == "."):
                if text[j] in "eE" and j + 1 < n and text[j + 1] in "+-":
                    j += 1
                j += 1
            out.append(Token("number", text[i:j], text[i:j], i, depth))
            i = j
        elif _word_char(ch):
            j = i + 1
            while j < n and _word_char(text[j]):
                j += 1
            out.append(Token("word", text[i:j], text[i:j], i, depth))
            i = j
        else:
            two = text[i : i + 2]
            size = 2 if two in _TWO else 1
            if ch == ")":
                depth = max(0, depth - 1)
            out.append(Token("punct", text[i : i + size], text[i : i + size], i, depth))
            if ch == "(":
                depth += 1
            i += size
    return out


def canonical_sql(text: str) -> str:
    """``text`` as one spelling per query: tokens joined by single spaces, words (keywords
    and bare names) in lower case, quoted names unquoted in lower case, one final ``;``
    dropped. Two texts with the same canonical form are the same query to SQLite."""
    toks = tokens(text)
    if toks and toks[-1].text == ";":
        toks = toks[:-1]
    parts = []
    for t in toks:
        if t.kind == "word" or (t.kind == "quoted" and t.text[0] != '"'):
            parts.append(t.value.lower())
        else:
            parts.append(t.text)
    return " ".join(parts)


def has_order_by(text: str) -> bool:
    """Whether the query orders its result (``ORDER BY`` at parenthesis depth 0)."""
    toks = tokens(text)
    return any(
        a.depth == 0 and a.upper == "ORDER" and b.upper == "BY" for a, b in zip(toks, toks[1:])
    )
