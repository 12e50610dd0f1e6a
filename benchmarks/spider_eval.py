"""Spider's data and metric for ``bench_spider.py``: questions, the choice of questions, execution accuracy.

- :func:`load_questions` reads a folder in the format of ``../shared/data/spider``
  (``questions.json``: ``{"db_id", "question", "query"}``; ``database/<db_id>/<db_id>.sqlite``);
- :func:`choose` takes ``K`` questions per database, a seeded choice per database (the
  same questions whatever other databases the folder holds);
- :func:`execution_match` is the metric: a predicted query is right when it runs and returns
  the same rows as the gold query, as a multiset, in order when the gold query has
  ``ORDER BY`` at its top level; values compare robustly (an integer equals a float of the
  same value, floats within 1e-6 relative, text exactly, bytes as text).

Queries run on a connection of their own, read-only (``mode=ro``, ``PRAGMA query_only``),
with a time bound (a progress handler): the benchmark grades what it is given without
trusting the library that wrote it.
"""

from __future__ import annotations

import json
import math
import random
import re
import sqlite3
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["Question", "choose", "database_path", "execute", "execution_match", "load_questions"]

#: Seconds a graded query may run.
GRADE_TIMEOUT = 10.0


@dataclass(frozen=True)
class Question:
    db_id: str
    question: str
    query: str


def load_questions(data: Path) -> list[Question]:
    """Every question of a Spider-format folder (``ValueError`` naming what is missing)."""
    path = Path(data) / "questions.json"
    if not path.is_file():
        raise ValueError(f"--data: no questions.json in {str(data)!r}")
    rows = json.loads(path.read_text())
    out = [Question(r["db_id"], r["question"], r["query"]) for r in rows]
    for db in sorted({q.db_id for q in out}):
        if not database_path(data, db).is_file():
            raise ValueError(f"--data: no database file for {db!r} in {str(data)!r}")
    return out


def database_path(data: Path, db_id: str) -> Path:
    return Path(data) / "database" / db_id / f"{db_id}.sqlite"


def choose(questions: list[Question], per_db: int | None, seed: int) -> list[Question]:
    """``per_db`` questions of each database (all when None), in the order of the file, each
    database's choice seeded by ``(seed, db_id)`` alone."""
    by_db: dict[str, list[Question]] = {}
    for q in questions:
        by_db.setdefault(q.db_id, []).append(q)
    out = []
    for db in sorted(by_db):
        qs = by_db[db]
        if per_db is not None and per_db < len(qs):
            picked = set(random.Random(f"{seed}:{db}").sample(range(len(qs)), per_db))
            qs = [q for i, q in enumerate(qs) if i in picked]
        out.extend(qs)
    return out


def _connect(path: Path) -> sqlite3.Connection:
    con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    con.text_factory = lambda b: b.decode("utf-8", "replace")
    con.execute("PRAGMA query_only = 1")
    return con


def execute(
    path: Path, query: str, timeout: float = GRADE_TIMEOUT
) -> tuple[list[tuple] | None, str | None]:
    """``(rows, None)`` or ``(None, error)`` of ``query`` on the database at ``path``."""
    if not query.strip():
        return None, "empty query"
    con = _connect(path)
    deadline = time.monotonic() + timeout
    con.set_progress_handler(lambda: int(time.monotonic() > deadline), 1000)
    try:
        return con.execute(query).fetchall(), None
    except (sqlite3.Error, sqlite3.Warning) as exc:
        return None, str(exc)
    finally:
        con.close()


def _value(v: Any) -> Any:
    if isinstance(v, bytes):
        v = v.decode("utf-8", "replace")
    if isinstance(v, bool):
        return int(v)
    if isinstance(v, float):
        if math.isnan(v):
            return "nan"
        if v.is_integer():
            return int(v)
        return float(f"{v:.6g}")
    return v


def _top_level_order_by(query: str) -> bool:
    depth, words = 0, []
    word = ""
    for ch in query + " ":
        if ch.isalnum() or ch == "_":
            word += ch
            continue
        if word:
            words.append((depth, word.upper()))
            word = ""
        depth += ch == "("
        depth -= ch == ")"
    return any(d == 0 and a == "ORDER" and b == "BY" for (d, a), (_, b) in zip(words, words[1:]))


def execution_match(pred_rows: list[tuple] | None, gold_rows: list[tuple], gold_query: str) -> bool:
    """Whether ``pred_rows`` equals ``gold_rows`` (module docstring)."""
    if pred_rows is None:
        return False
    pred = [tuple(_value(v) for v in r) for r in pred_rows]
    gold = [tuple(_value(v) for v in r) for r in gold_rows]
    if _top_level_order_by(gold_query):
        return pred == gold
    return Counter(pred) == Counter(gold)


_KEYWORDS = frozenset(
    "select from where group by having order limit join on as and or not in like between "
    "distinct count avg min max sum union intersect except desc asc is null".split()
)
_SQL_PIECE = re.compile(r"'[^']*'|\"[^\"]*\"|[A-Za-z_][A-Za-z0-9_]*|\s+|.")


def tidy_sql(query: str) -> str:
    """A gold query in one plain style for a prompt: keywords upper case, string literals in
    single quotes, one space between words, no space inside parentheses or before commas."""
    out = []
    for piece in _SQL_PIECE.findall(query.strip().rstrip(";").strip()):
        if piece.isspace():
            out.append(" ")
        elif piece.startswith('"'):
            out.append("'" + piece[1:-1].replace("'", "''") + "'")
        elif piece.lower() in _KEYWORDS:
            out.append(
                piece.upper()
                if piece.lower() not in ("count", "avg", "min", "max", "sum")
                else piece.lower()
            )
        else:
            out.append(piece)
    text = re.sub(r" +", " ", "".join(out))
    text = re.sub(r"\( ", "(", text)
    text = re.sub(r" \)", ")", text)
    text = re.sub(r" ,", ",", text)
    return text + ";"


def example_pools(data: Path) -> dict[str, list[Any]]:
    """Worked examples from every question of a Spider-format folder, by database: each an
    :class:`~llamppl.models.sql_prompt.SQLExample` with its gold query (:func:`tidy_sql`) and
    the ``CREATE TABLE`` text of the tables the query reads."""
    from llamppl.decoding.sql.database import open_database
    from llamppl.models.sql_prompt import SQLExample

    pools: dict[str, list[Any]] = {}
    schemas: dict[str, Any] = {}
    for q in load_questions(data):
        if q.db_id not in schemas:
            schemas[q.db_id] = open_database(database_path(data, q.db_id)).schema
        schema = schemas[q.db_id]
        words = {w.lower() for w in re.findall(r"[A-Za-z_][A-Za-z0-9_]*", q.query)}
        used = tuple(t.name for t in schema.tables if t.name.lower() in words)
        text = schema.restrict(used or None).create_table_text()
        pools.setdefault(q.db_id, []).append(SQLExample(q.question, tidy_sql(q.query), text))
    return pools
