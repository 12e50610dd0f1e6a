"""Names in scope: the prefix check that a query's words can still name something.

The grammar lets any column follow any table (it is context-free) and aliases are free
identifiers, so ``SELECT age FROM student WHERE pet_age <`` is a prefix of its language
though ``student`` has no ``pet_age``, and a made-up qualifier ``HOTELINE.`` can grow without
end. :func:`scope_error` reads a text's tokens (:mod:`~llamppl.decoding.sql.lexer`) with the
queries it opens (one per ``SELECT``, nested by parentheses; a compound's next ``SELECT``
replaces its core) and refuses, once a query's ``FROM`` clause is written:

1. a bare word that is no name the query may use: a word of the grammar (keyword, function,
   type), a table or column of the schema, or an alias defined before it (after ``AS``, a
   table or ``)``); the word still being written (the text's last token) must begin like one;
2. in the clauses after ``FROM`` (``WHERE``, ``GROUP BY``, ``HAVING``, ``ORDER BY``, ``LIMIT``),
   while every enclosing query is past its ``FROM`` clause too and none reads a subquery in
   its ``FROM``: a bare column that is in none of the tables those queries read, a
   qualifier that names none of them (by name or alias), and ``t.c`` where the table ``t``
   stands for has no column ``c`` (for the last token: no name in scope begins like it).

Such a query cannot run, whatever follows (SQLite resolves a column in the tables of its
query and of the queries around it; an alias of a result column is accepted where a column
is), so the check is sound, and it depends only on the tokens before each word, so it is
closed under prefixes. Clauses it does not reach (the ``SELECT`` list before ``FROM``, the
``ON`` conditions) are compiled by the clause check of :mod:`~llamppl.decoding.sql.checks`
as soon as a clause keyword follows them.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from llamppl.decoding.sql.database import Schema
from llamppl.decoding.sql.lexer import Token

__all__ = ["Names", "scope_error"]

_AFTER_FROM = {"WHERE", "GROUP", "HAVING", "ORDER", "LIMIT"}


@dataclass(frozen=True)
class Names:
    """The names a check compares words with, in upper case: ``tables`` (name -> its
    columns) and ``words`` (the grammar's keywords, functions and types)."""

    tables: dict[str, frozenset[str]]
    words: frozenset[str]

    @classmethod
    def of(cls, schema: Schema, words: frozenset[str]) -> Names:
        tables = {
            t.name.upper(): frozenset(c.name.upper() for c in t.columns) for t in schema.tables
        }
        return cls(tables, frozenset(words))

    @property
    def columns(self) -> frozenset[str]:
        return frozenset().union(*self.tables.values())

    @property
    def known(self) -> frozenset[str]:
        return self.words | frozenset(self.tables) | self.columns


@dataclass
class _Query:
    depth: int
    phase: str = "select"  # "select", "from" (its FROM clause), "after" (the clauses after it)
    tables: list[str] = field(default_factory=list)
    aliases: dict[str, str] = field(default_factory=dict)  # alias -> table
    derived: bool = False  # reads a subquery (or parenthesised join) in its FROM


def _table(tok: Token | None, names: Names) -> str | None:
    """The table (upper case) a bare or quoted name token names, or None."""
    if tok is None or not (tok.kind == "word" or (tok.kind == "quoted" and tok.closed)):
        return None
    key = tok.value.upper()
    return key if key in names.tables else None


def _is_definition(prev: Token | None, names: Names) -> bool:
    return prev is not None and (
        prev.upper == "AS" or prev.text == ")" or _table(prev, names) is not None
    )


def scope_error(toks: list[Token], names: Names, known: frozenset[str] | None = None) -> str | None:
    """Why no completion of the text of ``toks`` can run (module docstring), or None."""
    known = names.known if known is None else known
    queries: list[_Query] = []
    defined: set[str] = set()
    for i, tok in enumerate(toks):
        while queries and queries[-1].depth > tok.depth:
            queries.pop()
        prev = toks[i - 1] if i else None
        if tok.kind == "punct" and tok.text == "(" and queries:
            q = queries[-1]
            if q.phase == "from" and q.depth == tok.depth:
                q.derived = True
            continue
        if tok.kind == "quoted":  # a quoted table in FROM is read (else: not checked)
            q = queries[-1] if queries else None
            table = _table(tok, names)
            if q is not None and q.depth == tok.depth and q.phase == "from" and table:
                if not (prev and prev.text == "."):
                    q.tables.append(table)
            continue
        if tok.kind != "word":
            continue
        word, last = tok.upper, i == len(toks) - 1
        q = queries[-1] if queries else None
        here = q is not None and q.depth == tok.depth
        if word == "SELECT":
            if here:
                queries.pop()  # a compound's next core
            queries.append(_Query(tok.depth))
            continue
        if here and word == "FROM":
            q.phase = "from"
            continue
        if here and word in _AFTER_FROM and q.phase != "select":
            q.phase = "after"
            continue
        if here and q.phase == "from" and word in names.tables and not (prev and prev.text == "."):
            q.tables.append(word)
        if word not in known and _is_definition(prev, names):
            defined.add(word)
            if here and q.phase == "from":
                table = _table(prev, names)
                if prev.upper == "AS" and i >= 2:
                    table = _table(toks[i - 2], names)
                if table is None:
                    q.derived = True  # the alias of a subquery
                else:
                    q.aliases[word] = table
            continue
        if q is None or q.phase == "select":
            continue
        # rule 1: a name the query may use
        if word not in known and word not in defined:
            if not last or not any(n.startswith(word) for n in (*known, *defined)):
                return f"no name {tok.text!r} in the schema or the query"
        # rule 2: in scope, after FROM
        if q.phase != "after" or any(x.phase != "after" or x.derived for x in queries):
            continue
        tables = [t for x in queries for t in x.tables]
        aliases = {a: t for x in queries for a, t in x.aliases.items()}
        in_scope = set(tables) | set(aliases)
        if i + 1 < len(toks) and toks[i + 1].text == ".":  # a qualifier
            if word not in in_scope:
                return f"{tok.text!r} names no table of the query"
            continue
        if prev is not None and prev.text == "." and i >= 2:  # t.c
            table = aliases.get(toks[i - 2].upper, toks[i - 2].upper)
            columns = names.tables.get(table)
            if columns is None:
                continue
            if word not in columns and not (last and any(c.startswith(word) for c in columns)):
                return f"table {toks[i - 2].text} has no column {tok.text!r}"
            continue
        if word in names.words or word in defined:
            continue
        columns = set().union(*(names.tables[t] for t in tables)) if tables else set()
        if word in columns:
            continue
        if last and any(n.startswith(word) for n in (*names.words, *columns, *in_scope, *defined)):
            continue
        return f"no column {tok.text!r} in the tables the query reads"
    return None
