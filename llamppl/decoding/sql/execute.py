"""Running a query on a :class:`~llamppl.decoding.sql.database.Database`: reads only, time-bounded.

:class:`Executor` runs one ``SELECT`` statement on the database's private read-only connection
(:func:`~llamppl.decoding.sql.database.open_database`) and returns a :class:`Run` (the rows,
at most ``max_rows`` of them, or SQLite's error). Four locks keep it to reading:

1. the connection is read-only (``mode=ro``) and ``PRAGMA query_only`` is on;
2. an authorizer allows only ``SQLITE_SELECT``, ``SQLITE_READ`` and ``SQLITE_FUNCTION`` for the
   functions in :data:`SAFE_FUNCTIONS`; every other action (a write, a ``PRAGMA``, an
   ``ATTACH``, a transaction, a common table expression that recurses, ...) is denied when
   the statement is prepared;
3. one statement only: text after the first statement is refused (``sqlite3`` raises);
4. a time bound: a progress handler, called every :data:`PROGRESS_OPS` virtual-machine steps,
   interrupts the statement past its deadline and the run raises
   :class:`~llamppl.decoding.constraints.time_bound.CheckTimeout` (the named time-out of
   every constraint check), so no query can hang a run. The deadline is the executor's
   ``timeout`` or, when that is None, the bound of the check being run
   (:func:`~llamppl.decoding.constraints.time_bound.current_bound`, 2 s by default).

:meth:`Executor.prepare` compiles a statement without running it (SQLite's ``EXPLAIN``,
under the same authorizer): the prefix check asks it whether a query's first clauses name
real columns::

    run = Executor(open_database("pets_1.sqlite")).run("SELECT count(*) FROM pets")
    run.ok, run.rows          # True, ((3,),)
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Sequence
from dataclasses import dataclass

from llamppl.decoding.constraints.time_bound import (
    CheckTimeout,
    check_timeout_seconds,
    current_bound,
)
from llamppl.decoding.sql.database import Database
from llamppl.validation import check_positive_int

__all__ = ["DEFAULT_MAX_ROWS", "PROGRESS_OPS", "SAFE_FUNCTIONS", "Executor", "Run"]

#: Virtual-machine steps between two calls of the progress handler (the deadline's check).
PROGRESS_OPS = 1000
#: Rows fetched at most from one run (the rest is not read; ``Run.truncated`` says so).
DEFAULT_MAX_ROWS = 10_000
#: Functions a query may call: SQLite's aggregates and deterministic scalar functions that
#: neither touch files nor allocate without bound (no ``load_extension``, ``zeroblob``,
#: ``randomblob``, ``printf`` with widths, ...).
SAFE_FUNCTIONS = frozenset(
    """count sum avg min max total group_concat abs lower upper length substr substring round
    coalesce ifnull nullif instr trim ltrim rtrim replace date time datetime julianday
    strftime typeof like glob iif sign""".split()
)


def _authorizer(tables: frozenset[str] | None):
    """The authorizer: reads (of ``tables`` only, lower-case names, when given), ``SELECT``
    and the safe functions; everything else denied."""

    def authorize(action: int, arg1, arg2, dbname, source) -> int:
        if action == sqlite3.SQLITE_READ:
            if tables is None or dbname is None or str(arg1).lower() in tables:
                return sqlite3.SQLITE_OK  # (dbname None: a subquery's own result)
            return sqlite3.SQLITE_DENY
        if action == sqlite3.SQLITE_SELECT:
            return sqlite3.SQLITE_OK
        if action == sqlite3.SQLITE_FUNCTION and str(arg2).lower() in SAFE_FUNCTIONS:
            return sqlite3.SQLITE_OK
        return sqlite3.SQLITE_DENY

    return authorize


@dataclass(frozen=True)
class Run:
    """What running one query gave: ``rows`` (tuples, at most ``max_rows``; ``truncated``
    when there were more), ``columns`` (the result's column names) and ``error`` (SQLite's
    message when it did not run; then ``rows`` is empty)."""

    rows: tuple[tuple, ...] = ()
    columns: tuple[str, ...] = ()
    error: str | None = None
    truncated: bool = False

    @property
    def ok(self) -> bool:
        """Whether the query prepared and ran."""
        return self.error is None


class Executor:
    """Runs single ``SELECT`` statements on ``database``, reading only (module docstring).

    Parameters
    ----------
    database : Database
        The read-only database (:func:`~llamppl.decoding.sql.database.open_database`).
    timeout : float | None
        Seconds one statement may run; None (the default): the bound of the current check
        (:func:`~llamppl.decoding.constraints.time_bound.current_bound`).
    max_rows : int
        Rows fetched at most.
    tables : Sequence[str] | None
        The only tables a statement may read (None: every table); reading another is denied
        when the statement is prepared.
    """

    def __init__(
        self,
        database: Database,
        timeout: float | None = None,
        max_rows: int = DEFAULT_MAX_ROWS,
        tables: Sequence[str] | None = None,
    ) -> None:
        if not isinstance(database, Database):
            raise TypeError(f"database must be a Database, got {type(database).__name__}")
        max_rows = check_positive_int("max_rows", max_rows)
        self.database = database
        self.timeout = check_timeout_seconds("timeout", timeout)
        self.max_rows = max_rows
        self.runs = 0  # statements run or prepared (a count for tests and benchmarks)
        self.tables = None if tables is None else tuple(tables)
        allowed = None if tables is None else frozenset(t.lower() for t in tables)
        self._authorize = _authorizer(allowed)
        database.connection.text_factory = lambda b: b.decode("utf-8", "replace")

    def run(self, sql: str) -> Run:
        """Run ``sql`` (one ``SELECT``) and fetch at most ``max_rows`` rows;
        :class:`CheckTimeout` past the deadline."""
        return self._execute(sql, fetch=True)

    def prepare(self, sql: str) -> str | None:
        """Compile ``sql`` without running it: None when it compiles, else SQLite's message."""
        return self._execute("EXPLAIN " + sql, fetch=False).error

    def _execute(self, sql: str, fetch: bool) -> Run:
        if not isinstance(sql, str):
            raise TypeError(f"sql must be a str, got {type(sql).__name__}")
        seconds = self.timeout if self.timeout is not None else current_bound()
        deadline = None if seconds is None else time.monotonic() + seconds
        con = self.database.connection
        with self.database.lock:
            self.runs += 1
            con.set_authorizer(self._authorize)  # executors may share the connection
            con.set_progress_handler(_past(deadline), PROGRESS_OPS)
            cursor = con.cursor()
            try:
                cursor.execute(sql)
                if not fetch:
                    return Run()
                rows = cursor.fetchmany(self.max_rows + 1)
                columns = tuple(d[0] for d in cursor.description or ())
            except (sqlite3.Error, sqlite3.Warning) as exc:
                if deadline is not None and time.monotonic() >= deadline:
                    raise CheckTimeout(
                        f"check timed out (the query ran over {seconds:g} s)"
                    ) from None
                return Run(error=str(exc) or type(exc).__name__)
            finally:
                cursor.close()
                con.set_progress_handler(None, 0)
        truncated = len(rows) > self.max_rows
        return Run(tuple(rows[: self.max_rows]), columns, None, truncated)


def _past(deadline: float | None):
    """The progress handler: nonzero (interrupt) once ``deadline`` has passed."""
    if deadline is None:
        return lambda: 0
    return lambda: int(time.monotonic() >= deadline)
