"""SQL over a real database (``llamppl.decoding.sql``): the constraint ``sql(db)`` and its rooms.

- :mod:`~llamppl.decoding.sql.database` — :func:`open_database`: a path or a connection as a
  private read-only connection, and the :class:`Schema` read from it;
- :mod:`~llamppl.decoding.sql.execute` — :class:`Executor`: one ``SELECT`` at a time, reads
  only (authorizer), time-bounded (progress handler, ``CheckTimeout``);
- :mod:`~llamppl.decoding.sql.grammar` — the Lark grammar of SQLite queries over the schema's
  names, compiled once per schema;
- :mod:`~llamppl.decoding.sql.lexer`, :mod:`~llamppl.decoding.sql.values`,
  :mod:`~llamppl.decoding.sql.checks` — the database's checks of a text (prefix and complete);
- :mod:`~llamppl.decoding.sql.constraint` — :func:`sql` and :class:`SQL`, the conjunction.

Users import the constraint from :mod:`llamppl.constraints`::

    from llamppl.constraints import sql
    c = sql("concert_singer.sqlite")
"""

from llamppl.decoding.sql.constraint import SQL, sql
from llamppl.decoding.sql.database import Database, Schema, open_database
from llamppl.decoding.sql.execute import Executor, Run

__all__ = ["SQL", "Database", "Executor", "Run", "Schema", "open_database", "sql"]
