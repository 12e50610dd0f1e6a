"""The value check: a string literal compared to a column must be one of the column's values.

A question names a value ("singers from France") and the query must spell it as the data
does (``'France'``, not ``'france'`` or ``'FR'``). :func:`literal_comparisons` finds, in a
query or a prefix of one, every string literal compared to a column reference on its left
with ``=``, ``==``, ``!=``, ``<>``, ``[NOT] LIKE`` or ``[NOT] IN ( ... )``, or on its right
with ``=``, ``==``, ``!=``, ``<>`` (``'France' = country``; read once the name is complete); :class:`Values`
answers whether such a literal can occur:

- closed (``'France'``): ``=``-like comparisons and ``IN`` lists need a row whose column
  equals it (SQLite's own comparison, column affinity included: ``Year = '2014'`` matches
  an integer 2014), ``LIKE`` needs a row that matches the pattern;
- still open at the end of a prefix (``'Fra``): a text column (TEXT or no affinity) needs a
  value that begins with it, ``LIKE`` a value that matches the pattern followed by ``%``
  (sound: any completion's pattern matches only values that ``pattern%`` matches); a numeric
  column is not checked until the literal closes.

The column is resolved from the text before the literal: ``t.c`` or ``alias.c`` names the
table ``t`` (an alias is bound by ``t [AS] alias`` earlier in the text); a bare ``c`` may be
in any table named earlier that has a column ``c``, and the literal must occur in one of
them. A reference that resolves to no table is not checked. A ``"..."`` token is a string
literal unless it names (or may still name) a column, as SQLite reads it. The check depends
only on the text before each literal, so it is closed under prefixes.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass

from llamppl.decoding.sql.database import Schema, Table, quote_identifier
from llamppl.decoding.sql.execute import Executor
from llamppl.decoding.sql.lexer import Token, is_keyword

__all__ = ["Comparison", "Values", "is_string_literal", "literal_comparisons"]

_EQUAL = {"=", "==", "!=", "<>"}


@dataclass(frozen=True)
class Comparison:
    """A string literal compared to a column: the candidate tables (names), the column name,
    ``like`` (a ``LIKE`` pattern rather than a value), the literal's content and whether it
    is closed."""

    tables: tuple[str, ...]
    column: str
    like: bool
    literal: str
    closed: bool


def is_string_literal(tok: Token, schema: Schema) -> bool:
    """Whether ``tok`` is a string literal as SQLite reads it (module docstring)."""
    if tok.kind == "string":
        return True
    if tok.kind != "quoted" or not tok.text.startswith('"'):
        return False
    key = tok.value.lower()
    names = (c.lower() for c in schema.column_names)
    if tok.closed:
        return all(key != n for n in names)
    return all(not n.startswith(key) for n in names)


def _name(tok: Token) -> str | None:
    return tok.value if tok.kind in ("word", "quoted") else None


def _aliases(toks: list[Token], schema: Schema) -> dict[str, str]:
    """``alias (lower) -> table`` for every ``table [AS] alias`` among ``toks``."""
    out: dict[str, str] = {}
    for i, tok in enumerate(toks):
        name = _name(tok)
        table = schema.table(name) if name is not None else None
        if table is None:
            continue
        j = i + 1
        if j < len(toks) and toks[j].upper == "AS":
            j += 1
        alias = toks[j] if j + 1 < len(toks) else None  # complete: a token follows it
        if alias is not None and alias.kind in ("word", "quoted") and not is_keyword(alias.text):
            out[alias.value.lower()] = table.name
    return out


def _resolve(toks: list[Token], at: int, schema: Schema) -> tuple[tuple[str, ...], str] | None:
    """The candidate tables and column name of the column reference ending at ``toks[at]``."""
    col = _name(toks[at])
    if col is None:
        return None
    before = toks[:at]
    if at >= 2 and toks[at - 1].text == ".":
        qualifier = _name(toks[at - 2])
        if qualifier is None:
            return None
        table = schema.table(qualifier)
        name = (
            table.name
            if table is not None
            else _aliases(toks[: at - 2], schema).get(qualifier.lower())
        )
        if name is None:
            return None
        found = schema.table(name)
        return ((name,), col) if found is not None and found.column(col) else None
    named: list[str] = []
    for tok in before:
        table = schema.table(tok.value) if tok.kind in ("word", "quoted") else None
        if table is not None and table.column(col) and table.name not in named:
            named.append(table.name)
    return (tuple(named), col) if named else None


def literal_comparisons(
    toks: list[Token], schema: Schema, complete: bool = False
) -> list[Comparison]:
    """Every string literal among ``toks`` compared to a column on its left, or by ``=``-like
    operators to one on its right (module docstring). A column on the right is read once a
    token follows it (a prefix may still be writing a longer name), or at the end of a
    ``complete`` text."""
    out: list[Comparison] = []
    for i, tok in enumerate(toks):
        if not is_string_literal(tok, schema):
            continue
        right = _right_column(toks, i, complete)
        if right is not None:
            resolved = _resolve(toks, right, schema)
            if resolved is not None:
                out.append(Comparison(resolved[0], resolved[1], False, tok.value, tok.closed))
            continue
        if i < 2:
            continue
        op, like = toks[i - 1], False
        if op.text in _EQUAL:
            at = i - 2
        elif op.upper == "LIKE":
            at, like = i - 2, True
            if at >= 0 and toks[at].upper == "NOT":
                at -= 1
        elif op.text in ("(", ","):  # an IN list: walk back to IN over strings and commas
            j = i - 1
            while j >= 1 and toks[j].text == "," and is_string_literal(toks[j - 1], schema):
                j -= 2
            if toks[j].text != "(" or j < 2 or toks[j - 1].upper != "IN":
                continue
            at = j - 2
            if at >= 0 and toks[at].upper == "NOT":
                at -= 1
        else:
            continue
        if at < 0 or toks[at].kind not in ("word", "quoted"):
            continue
        resolved = _resolve(toks, at, schema)
        if resolved is not None:
            out.append(Comparison(resolved[0], resolved[1], like, tok.value, tok.closed))
    return out


def _right_column(toks: list[Token], i: int, complete: bool) -> int | None:
    """The index of the column reference right of ``toks[i] =`` (``'France' = country``,
    ``'x' != t.c``), or None: no such reference, or one a prefix may still extend."""
    if i + 2 >= len(toks) or toks[i + 1].text not in _EQUAL:
        return None
    at = i + 2
    if at + 1 < len(toks) and toks[at + 1].text == ".":
        at += 2
    if at >= len(toks) or toks[at].kind not in ("word", "quoted") or is_keyword(toks[at].text):
        return None
    if at + 1 >= len(toks) and not complete:
        return None
    return at


class Values:
    """Answers whether a :class:`Comparison`'s literal can occur (module docstring), with the
    answers and each column's distinct text values kept. With ``mentioned`` (the lower-cased
    question, when the query's literals must come from it: :mod:`~llamppl.decoding.sql.literals`)
    a literal still being written must begin like a value of the column that the question
    states, so ``country = '`` is refused at once when the question names no country of the
    data."""

    def __init__(self, schema: Schema, executor: Executor, mentioned: str | None = None) -> None:
        self.schema, self.executor, self.mentioned = schema, executor, mentioned
        self._answers: dict[tuple, bool] = {}
        self._texts: dict[tuple[str, str], list[str] | None] = {}
        self._stated: dict[tuple[str, str], list[str] | None] = {}

    def ok(self, c: Comparison) -> bool:
        """Whether some candidate table's column can hold the literal."""
        key = (c.tables, c.column.lower(), c.like, c.literal, c.closed)
        answer = self._answers.get(key)
        if answer is None:
            answer = self._answers[key] = any(self._one(t, c) for t in c.tables)
        return answer

    def _one(self, table_name: str, c: Comparison) -> bool:
        table = self.schema.table(table_name)
        column = table.column(c.column) if table is not None else None
        if column is None:
            return True
        if c.closed or c.like:
            pattern = c.literal if c.closed else c.literal + "%"
            op = "LIKE" if c.like else "="
            return self._exists(table, column.name, op, pattern)
        if column.affinity not in ("TEXT", "BLOB"):
            return True  # a numeric column: checked once the literal closes
        if self.mentioned is not None:
            stated = self._stated_values(table, column.name)
            return stated is None or any(v.startswith(c.literal) for v in stated)
        values = self._text_values(table, column.name)
        if values is None:
            return True
        i = bisect.bisect_left(values, c.literal)
        return i < len(values) and values[i].startswith(c.literal)

    def _stated_values(self, table: Table, column: str) -> list[str] | None:
        """The column's text values that the question states (case ignored)."""
        key = (table.name, column)
        if key not in self._stated:
            values = self._text_values(table, column)
            text = self.mentioned or ""
            self._stated[key] = None if values is None else [v for v in values if v.lower() in text]
        return self._stated[key]

    def _exists(self, table: Table, column: str, op: str, literal: str) -> bool:
        sql = (
            f"SELECT 1 FROM {quote_identifier(table.name)} WHERE {quote_identifier(column)} "
            f"{op} {_sql_string(literal)} LIMIT 1"
        )
        run = self.executor.run(sql)
        return run.ok and bool(run.rows)

    def _text_values(self, table: Table, column: str) -> list[str] | None:
        key = (table.name, column)
        if key not in self._texts:
            sql = (
                f"SELECT DISTINCT CAST({quote_identifier(column)} AS TEXT) FROM "
                f"{quote_identifier(table.name)} WHERE {quote_identifier(column)} IS NOT NULL"
            )
            run = self.executor.run(sql)  # more than max_rows values: prefixes go unchecked
            rows = [r[0] for r in run.rows] if run.ok and not run.truncated else None
            self._texts[key] = None if rows is None else sorted(rows)
        return self._texts[key]


def _sql_string(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"
