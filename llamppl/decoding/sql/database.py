"""A SQLite database opened read-only, and its schema: what the SQL constraint reads first.

:func:`open_database` takes a path (``str`` / ``os.PathLike``) or a ``sqlite3.Connection``
and returns a :class:`Database`: a private connection that can only read, and the
:class:`Schema` read from it (tables, views and their columns, primary and foreign keys):

- a path is opened as ``file:<path>?mode=ro`` (SQLite's read-only mode: no write reaches
  the file, no journal is created) with ``PRAGMA query_only``; the file's bytes and
  modification time stay as they were;
- a connection to a file is not used itself: the file it has open as ``main`` is opened
  again the same way, so the caller's connection keeps its own settings; a connection to an
  in-memory database is copied (``Connection.backup``) into a private in-memory database.

Bad input gets a ``ValueError`` naming ``db``: a missing file, a directory, a file that is not
a SQLite database, a database without tables. Statements run on the connection through
:mod:`~llamppl.decoding.sql.execute` (an authorizer that allows reads only, a time bound)::

    from llamppl.decoding.sql.database import open_database
    database = open_database("concert_singer.sqlite")
    database.schema.tables[0].name, database.schema.create_table_text()
"""

from __future__ import annotations

import os
import sqlite3
import threading
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["Column", "Database", "Schema", "Table", "open_database", "quote_identifier"]


def quote_identifier(name: str) -> str:
    """``name`` as a double-quoted SQL identifier (``"a""b"`` for ``a"b``)."""
    return '"' + name.replace('"', '""') + '"'


@dataclass(frozen=True)
class Column:
    """One column: its name, declared type (``""`` when none), primary-key position (0: not
    part of the key) and the ``(table, column)`` a foreign key points to (None: no key)."""

    name: str
    type: str = ""
    primary_key: int = 0
    references: tuple[str, str] | None = None

    @property
    def affinity(self) -> str:
        """SQLite's type affinity of the declared type (section 3.1 of its datatype page):
        ``"INTEGER"``, ``"TEXT"``, ``"BLOB"``, ``"REAL"`` or ``"NUMERIC"``."""
        t = self.type.upper()
        if "INT" in t:
            return "INTEGER"
        if "CHAR" in t or "CLOB" in t or "TEXT" in t:
            return "TEXT"
        if "BLOB" in t or not t:
            return "BLOB"
        if "REAL" in t or "FLOA" in t or "DOUB" in t:
            return "REAL"
        return "NUMERIC"


@dataclass(frozen=True)
class Table:
    """A table (or view) and its columns, in their declared order."""

    name: str
    columns: tuple[Column, ...]
    view: bool = False

    def column(self, name: str) -> Column | None:
        """The column called ``name`` (ASCII case ignored, as SQLite does), or None."""
        key = name.lower()
        return next((c for c in self.columns if c.name.lower() == key), None)


@dataclass(frozen=True)
class Schema:
    """The tables and views of a database, in the order SQLite lists them."""

    tables: tuple[Table, ...]

    def table(self, name: str) -> Table | None:
        """The table called ``name`` (ASCII case ignored), or None."""
        key = name.lower()
        return next((t for t in self.tables if t.name.lower() == key), None)

    @property
    def column_names(self) -> tuple[str, ...]:
        """Every column name once (case ignored; the first spelling kept)."""
        seen: dict[str, str] = {}
        for t in self.tables:
            for c in t.columns:
                seen.setdefault(c.name.lower(), c.name)
        return tuple(seen.values())

    def restrict(self, tables: tuple[str, ...] | None) -> Schema:
        """The schema with only ``tables`` (names, case ignored; None: all); a ``ValueError``
        names any table the database does not have."""
        if tables is None:
            return self
        keep = []
        for name in tables:
            t = self.table(name)
            if t is None:
                known = ", ".join(t.name for t in self.tables)
                raise ValueError(f"tables: no table {name!r} in the database (it has: {known})")
            if t not in keep:
                keep.append(t)
        return Schema(tuple(keep))

    def create_table_text(self) -> str:
        """The schema as compact ``CREATE TABLE`` statements, one per table: columns with their
        types, the primary key, foreign keys as ``REFERENCES`` (the text a prompt shows)."""
        out = []
        for t in self.tables:
            parts = []
            keys = [c for c in t.columns if c.primary_key]
            for c in t.columns:
                part = _name(c.name) + (f" {c.type}" if c.type else "")
                if len(keys) == 1 and c.primary_key:
                    part += " PRIMARY KEY"
                if c.references is not None:
                    part += f" REFERENCES {_name(c.references[0])}({_name(c.references[1])})"
                parts.append(part)
            if len(keys) > 1:
                ordered = sorted(keys, key=lambda c: c.primary_key)
                parts.append(f"PRIMARY KEY ({', '.join(_name(c.name) for c in ordered)})")
            kind = "VIEW" if t.view else "TABLE"
            out.append(f"CREATE {kind} {_name(t.name)} ({', '.join(parts)});")
        return "\n".join(out)


def _name(name: str) -> str:
    """``name`` bare when it is a plain identifier, else double-quoted."""
    plain = name.replace("_", "a").isalnum() and name.isascii() and not name[0].isdigit()
    return name if plain else quote_identifier(name)


@dataclass
class Database:
    """A private read-only connection to a database, its schema, and where it came from.

    ``connection`` is shared by the checks of one constraint (``check_same_thread=False``,
    guarded by ``lock``); ``path`` is the file (None for a copied in-memory database);
    ``key`` identifies the database's content for caches (path, size, modification time).
    """

    connection: sqlite3.Connection
    schema: Schema
    path: Path | None
    key: tuple
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)


def _connect_read_only(path: Path) -> sqlite3.Connection:
    uri = f"file:{_uri_path(path)}?mode=ro"
    con = sqlite3.connect(uri, uri=True, check_same_thread=False, isolation_level=None)
    con.execute("PRAGMA query_only = 1")
    return con


def _uri_path(path: Path) -> str:
    """``path`` for a ``file:`` URI (``?`` and ``#`` and ``%`` escaped)."""
    return str(path).replace("%", "%25").replace("?", "%3f").replace("#", "%23")


def _file_of(con: sqlite3.Connection) -> str:
    """The file a connection has open as ``main`` (``""`` for an in-memory database)."""
    try:
        rows = con.execute("PRAGMA database_list").fetchall()
    except sqlite3.ProgrammingError as exc:  # a closed connection
        raise ValueError(f"db: the connection cannot be used ({exc})") from None
    return next((r[2] or "" for r in rows if r[1] == "main"), "")


def open_database(db: object) -> Database:
    """``db`` (a path or a ``sqlite3.Connection``) as a read-only :class:`Database`."""
    if isinstance(db, sqlite3.Connection):
        file = _file_of(db)
        if file:
            return _open_path(Path(file), "db (the connection's file)")
        if db.in_transaction:  # a backup would wait for it forever
            raise ValueError(
                "db: the in-memory connection has an uncommitted transaction; commit it first"
            )
        copy = sqlite3.connect(":memory:", check_same_thread=False, isolation_level=None)
        db.backup(copy)
        copy.execute("PRAGMA query_only = 1")
        schema = _read_schema(copy, "db (an in-memory connection)")
        return Database(copy, schema, None, ("memory", id(copy)))
    if isinstance(db, (str, os.PathLike)):
        return _open_path(Path(os.fspath(db)), "db")
    raise TypeError(
        f"db must be a path to a SQLite file (str or os.PathLike) or a sqlite3.Connection, "
        f"got {type(db).__name__}"
    )


def _open_path(path: Path, name: str) -> Database:
    if not path.exists():
        raise ValueError(f"{name}: no such file: {str(path)!r}")
    if not path.is_file():
        raise ValueError(f"{name}: not a file: {str(path)!r}")
    with open(path, "rb") as f:
        header = f.read(16)
    if header != b"SQLite format 3\x00":
        raise ValueError(
            f"{name}: {str(path)!r} is not a SQLite database (its header is not SQLite's)"
        )
    try:
        con = _connect_read_only(path.resolve())
    except sqlite3.Error as exc:
        raise ValueError(f"{name}: cannot open {str(path)!r} read-only: {exc}") from None
    schema = _read_schema(con, f"{name} {str(path)!r}")
    stat = path.stat()
    return Database(
        con, schema, path.resolve(), (str(path.resolve()), stat.st_size, stat.st_mtime_ns)
    )


def _read_schema(con: sqlite3.Connection, name: str) -> Schema:
    """The tables and views of ``con`` (``ValueError`` when it has none or cannot be read)."""
    try:
        rows = con.execute(
            "SELECT name, type FROM sqlite_master WHERE type IN ('table', 'view') "
            "AND name NOT LIKE 'sqlite\\_%' ESCAPE '\\' ORDER BY rowid"
        ).fetchall()
        tables = []
        for table, kind in rows:
            info = con.execute(f"PRAGMA table_info({quote_identifier(table)})").fetchall()
            keys = con.execute(f"PRAGMA foreign_key_list({quote_identifier(table)})").fetchall()
            refs = {}
            for fk in keys:  # (id, seq, table, from, to, on_update, on_delete, match)
                target = fk[4]
                if target is None:  # REFERENCES t without a column: t's primary key
                    target = _primary_key(con, fk[2])
                refs.setdefault(fk[3].lower(), (fk[2], target or fk[3]))
            columns = tuple(
                Column(c[1], c[2] or "", int(c[5]), refs.get(c[1].lower())) for c in info
            )
            tables.append(Table(table, columns, view=kind == "view"))
    except sqlite3.DatabaseError as exc:
        raise ValueError(f"{name}: cannot read the schema: {exc}") from None
    if not tables:
        raise ValueError(f"{name}: the database has no tables")
    return Schema(tuple(tables))


def _primary_key(con: sqlite3.Connection, table: str) -> str | None:
    info = con.execute(f"PRAGMA table_info({quote_identifier(table)})").fetchall()
    return next((c[1] for c in info if c[5] == 1), None)
