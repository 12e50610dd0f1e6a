"""``sql(db)``: text is a query over the database's own tables and columns that runs on it.

The constraint is the conjunction of two parts (:class:`SQL`, an
:class:`~llamppl.decoding.constraints.protocol.AllOf`):

- the **grammar** of SQLite's ``SELECT`` with the database's table and column names
  (:mod:`~llamppl.decoding.sql.grammar`): a cheap mask, compiled once per schema;
- the **database's checks** (:mod:`~llamppl.decoding.sql.checks`): the complete check runs
  the query (read-only, one statement, time-bounded), the prefix check compiles a query's
  first clauses as soon as a clause keyword follows them, and the options below add to both.
  They have no cheap mask, so :class:`~llamppl.models.HardConstraint` checks them lazily, on
  the tokens it draws, and runs a query only when an end token is drawn (or, for its end
  twist, once per particle and step on a text the grammar accepts).

``c.accepts_prefix(text)`` and ``c.accepts_end(text)`` judge strings with the same verdicts
as the token-level walk: the grammar's byte-level walk
(:meth:`~llamppl.decoding.grammar.compile.Grammar.accepts_prefix`), then the database's
checks (closed under prefixes, so the walk's checks at earlier token boundaries agree with
the last one). A query in the language that runs past the time bound raises
:class:`~llamppl.decoding.constraints.time_bound.CheckTimeout` (a program ends that particle). ``c.run(text)`` gives a
complete query's result (:class:`~llamppl.decoding.sql.execute.Run`) and
``c.schema_text()`` the ``CREATE TABLE`` text of its tables::

    from llamppl.constraints import sql
    c = sql("concert_singer.sqlite", allow_empty=False, values=True)
    c.accepts_end("SELECT count(*) FROM singer")      # True
    c.accepts_prefix("SELECT name FROM singr")        # False: no table "singr"...
    c.accepts_end("DELETE FROM singer")               # False: not a query
    c.run("SELECT count(*) FROM singer").rows         # ((6,),)

Nothing reaches the file: it is opened ``mode=ro`` with ``PRAGMA query_only``, statements
pass an authorizer that allows reads only, and text after a first statement is refused.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from os import PathLike

from llamppl.decoding.constraints.protocol import AllOf
from llamppl.decoding.constraints.time_bound import check_timeout_seconds
from llamppl.decoding.grammar.compile import Grammar
from llamppl.decoding.sql.checks import QueryCheck
from llamppl.decoding.sql.database import Database, Schema, open_database
from llamppl.decoding.sql.execute import DEFAULT_MAX_ROWS, Executor, Run
from llamppl.decoding.sql.grammar import sql_grammar

__all__ = ["SQL", "sql"]


class SQL(AllOf):
    """The SQL constraint of a database (module docstring): ``grammar & check``.

    Attributes
    ----------
    database : Database
        The private read-only connection and where it came from.
    schema : Schema
        The tables the constraint allows (all, or the ``tables`` given).
    grammar : Grammar
        The grammar part (cheap mask).
    check : QueryCheck
        The database's checks (costly, lazy).
    """

    def __init__(
        self, database: Database, schema: Schema, check: QueryCheck, multiline: bool = False
    ) -> None:
        self.database, self.schema, self.check = database, schema, check
        self.multiline = multiline
        self.grammar: Grammar = sql_grammar(schema, multiline)
        super().__init__(self.grammar, check, imply=False)

    # ------------------------------------------------------------ verdicts on strings
    def accepts_prefix(self, text: str) -> bool:
        """Whether ``text`` can still be completed into a query that passes (the grammar's
        prefix check, then the database's)."""
        return self.grammar.accepts_prefix(text) and bool(self.check(text))

    def accepts_end(self, text: str) -> bool:
        """Whether ``text`` is a complete query that passes: in the grammar, runs (read-only,
        within the time bound: :class:`~llamppl.decoding.constraints.time_bound.CheckTimeout`
        past it) and meets the options. As the token-level walk, which asks the prefix check
        at each token before the complete check, a text must pass both."""
        return (
            self.grammar.accepts_end(text)
            and bool(self.check(text))
            and bool(self.check.accepts_end(text))
        )

    def __call__(self, text: str) -> bool:
        return self.accepts_prefix(text)

    def failure(self, text: str) -> str | None:
        """Why ``text`` does not pass as a complete query (None when it does)."""
        if not self.grammar.accepts_end(text):
            where = "" if self.grammar.accepts_prefix(text) else " (not even a prefix)"
            return f"not a query of the grammar over this database's tables{where}"
        failure = self.check.failure(text)
        if failure is None and not self.check(text):
            return "a clause or name of the query cannot run (the prefix check)"
        return failure

    # ------------------------------------------------------------ the database
    def run(self, text: str) -> Run:
        """Run a complete query (a final ``;`` allowed) and return its rows or error."""
        return self.check.run(text)

    def narrowed(self, tables: Sequence[str] | None = None, literals: str | None = None) -> SQL:
        """This constraint over ``tables`` only (names, case ignored; None: the same tables)
        and, when ``literals`` is given, with literals taken from that text; the other options
        unchanged. Shares this constraint's connection (not its answers)."""
        if tables is not None and (
            isinstance(tables, str) or not tables or not all(isinstance(t, str) for t in tables)
        ):
            raise TypeError("tables must be a non-empty sequence of table names (str) or None")
        schema = self.schema if tables is None else self.schema.restrict(tuple(tables))
        old = self.check
        executor = Executor(
            self.database,
            old.executor.timeout,
            old.executor.max_rows,
            [t.name for t in schema.tables],
        )
        check = QueryCheck(
            executor,
            schema,
            allow_empty=old.allow_empty,
            values=old.values,
            literals=old.literals if literals is None else literals,
        )
        return SQL(self.database, schema, check, self.multiline)

    def relaxed(self) -> SQL:
        """The loosest constraint of the same database: every table, any literal, empty
        results allowed, no value check (the grammar and the run check alone). Shares this
        constraint's connection."""
        schema = self.database.schema
        old = self.check
        executor = Executor(self.database, old.executor.timeout, old.executor.max_rows, None)
        check = QueryCheck(executor, schema, allow_empty=True, values=False, literals=None)
        return SQL(self.database, schema, check, self.multiline)

    def schema_text(self) -> str:
        """The allowed tables as ``CREATE TABLE`` statements (for a prompt)."""
        return self.schema.create_table_text()

    def __repr__(self) -> str:
        where = self.database.path or "an in-memory database"
        return (
            f"sql({str(where)!r}, tables={len(self.schema.tables)}, "
            f"allow_empty={self.check.allow_empty}, values={self.check.values}, "
            f"literals={self.check.literals!r})"
        )


def sql(
    db: str | PathLike | sqlite3.Connection,
    *,
    tables: Sequence[str] | None = None,
    allow_empty: bool = True,
    values: bool = False,
    literals: str | None = None,
    multiline: bool = False,
    max_rows: int = DEFAULT_MAX_ROWS,
    timeout: float | None = None,
) -> SQL:
    """The constraint "a query over ``db`` that runs on it" (module docstring).

    Parameters
    ----------
    db : str | os.PathLike | sqlite3.Connection
        A SQLite file (opened read-only), or a connection (its file opened again read-only;
        an in-memory database copied). ``ValueError`` for a missing file, a file that is not
        SQLite, a database without tables.
    tables : Sequence[str] | None
        The only tables a query may name and read (names, case ignored); None: all.
    allow_empty : bool
        Whether a query whose result has no row, or only NULL values, passes.
    values : bool
        Whether a string literal compared to a column (``=``, ``!=``, ``<>``, ``LIKE``,
        ``IN``) must occur in it (a literal still being written: begin like a value).
    literals : str | None
        A text (the question asked) the query's literals must come from: every string
        literal occurs in it (case ignored), every number but a ``LIMIT``'s is one it states
        (:mod:`~llamppl.decoding.sql.literals`); None (the default): any literal.
    multiline : bool
        Whether whitespace between tokens may hold newlines and tabs; False (the default):
        spaces only, the query on one line (a small LM that writes a newline is often about to
        leave SQL for prose).
    max_rows : int
        Rows fetched at most from one run (``run``; the checks need no more).
    timeout : float | None
        Seconds one query may run; None: the bound of the check running it (``check_timeout``
        of the program, 2 s by default). Past it: ``CheckTimeout``.
    """
    if not isinstance(allow_empty, bool):
        raise TypeError(f"allow_empty must be a bool, got {type(allow_empty).__name__}")
    if not isinstance(values, bool):
        raise TypeError(f"values must be a bool, got {type(values).__name__}")
    if not isinstance(multiline, bool):
        raise TypeError(f"multiline must be a bool, got {type(multiline).__name__}")
    if tables is not None:
        if isinstance(tables, str) or not all(isinstance(t, str) for t in tables):
            raise TypeError("tables must be a sequence of table names (str) or None")
        if not tables:
            raise ValueError("tables must name at least one table (or be None for all)")
    timeout = check_timeout_seconds("timeout", timeout)
    database = open_database(db)
    schema = database.schema.restrict(None if tables is None else tuple(tables))
    names = None if tables is None else [t.name for t in schema.tables]
    executor = Executor(database, timeout=timeout, max_rows=max_rows, tables=names)
    check = QueryCheck(executor, schema, allow_empty=allow_empty, values=values, literals=literals)
    return SQL(database, schema, check, multiline)
