"""``llamppl.constraints.sql(db)``: SQLite queries over a database's own names, run read-only.

Small databases built here with ``sqlite3`` check the grammar's names, the run check, the
options (allowed tables, empty results, values), the refusals (a write, a second statement,
``PRAGMA``, ``ATTACH``), the named time-out of a slow query, bad input, an untouched file, and
that the string verdicts equal the token-level walk. Gold queries of the shared Spider dev
databases (skipped when ``shared/data/spider`` is absent) must be accepted.
"""

from __future__ import annotations

import hashlib
import json
import random
import sqlite3

import pytest
from string_walks import assert_agree, chunk_lm, random_texts
from text_programs import _shared

from llamppl.constraints import CheckTimeout, sql

SPIDER = _shared("data", "spider")


def _build(path) -> None:
    con = sqlite3.connect(path)
    con.executescript(
        """
        CREATE TABLE singer (singer_id INTEGER PRIMARY KEY, name TEXT, country TEXT, age INTEGER);
        CREATE TABLE "concert hall" (hall_id INTEGER PRIMARY KEY, city TEXT);
        CREATE TABLE concert (concert_id INTEGER PRIMARY KEY,
            singer_id INTEGER REFERENCES singer(singer_id),
            hall_id INTEGER REFERENCES "concert hall"(hall_id), year TEXT);
        INSERT INTO singer VALUES (1, 'Joe', 'France', 30), (2, 'Ann', 'Spain', 41),
            (3, 'Tim', 'France', 25);
        INSERT INTO "concert hall" VALUES (1, 'Paris'), (2, 'Madrid');
        INSERT INTO concert VALUES (1, 1, 1, '2014'), (2, 2, 2, '2015'), (3, 1, 2, '2015');
        """
    )
    con.commit()
    con.close()


def _digest(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def db(tmp_path_factory):
    path = tmp_path_factory.mktemp("sql") / "music.sqlite"
    _build(path)
    return path


@pytest.fixture(scope="module")
def c(db):
    return sql(db)


GOOD = [
    "SELECT count(*) FROM singer",
    "select NAME from SINGER where age > 26 order by age desc limit 1;",
    "SELECT T1.name, count(*) FROM singer AS T1 JOIN concert AS T2 ON T1.singer_id = "
    "T2.singer_id GROUP BY T1.singer_id HAVING count(*) >= 1",
    'SELECT city FROM "concert hall" WHERE hall_id IN (SELECT hall_id FROM concert)',
    "SELECT [city] FROM [concert hall] WHERE city LIKE 'P%'",
    "SELECT name FROM singer WHERE age BETWEEN 20 AND 35 EXCEPT SELECT name FROM singer "
    "WHERE country = 'Spain'",
    "SELECT DISTINCT country FROM singer UNION SELECT city FROM `concert hall`",
    "SELECT avg(age), max(age) FROM singer WHERE singer_id NOT IN (SELECT singer_id FROM concert)",
]
BAD = [
    "DELETE FROM singer",
    "SELECT count(*) FROM singer; DROP TABLE singer",
    "SELECT 1; SELECT 2",
    "PRAGMA table_info(singer)",
    "ATTACH DATABASE 'other.db' AS other",
    "INSERT INTO singer VALUES (4, 'Sam', 'Peru', 20)",
    "UPDATE singer SET age = 1",
    "SELECT name FROM singers",  # no such table
    "SELECT height FROM singer",  # no such column
    "SELECT name FROM singer WHERE",  # not complete
]


def test_queries_over_the_databases_names_pass(c):
    for q in GOOD:
        assert c.accepts_prefix(q) and c.accepts_end(q), (q, c.failure(q))


def test_writes_statements_pragmas_and_unknown_names_are_refused(db, c):
    before = _digest(db)
    for q in BAD:
        assert not c.accepts_end(q), q
        assert c.failure(q) is not None
    for q in BAD[:7]:  # not SELECT statements: the grammar refuses them at once
        assert not c.accepts_prefix(q), q
    # the run itself refuses them too (authorizer, one statement)
    for q in BAD[:7]:
        assert not c.run(q).ok, q
    assert not c.accepts_prefix("SELECT name FROM singer WHERE heigh")  # no column begins so
    assert c.accepts_prefix("SELECT name FROM singer WHERE ag")
    assert _digest(db) == before


def test_prefix_check_compiles_the_first_clauses(c):
    # "pets" is no table, and the column of a SELECT list is checked once a clause follows
    assert not c.accepts_prefix("SELECT city FROM singer WHERE")
    assert c.accepts_prefix("SELECT name FROM singer WHERE")
    assert not c.accepts_prefix("SELECT name FROM pets")


def test_a_slow_query_raises_the_named_timeout(tmp_path):
    path = tmp_path / "big.sqlite"
    con = sqlite3.connect(path)
    con.execute("CREATE TABLE n (x INTEGER)")
    con.executemany("INSERT INTO n VALUES (?)", [(i,) for i in range(1000)])
    con.commit()
    con.close()
    c = sql(path, timeout=0.2)
    slow = "SELECT count(*) FROM n AS a, n AS b, n AS c, n AS d"
    assert c.accepts_prefix(slow)
    with pytest.raises(CheckTimeout):
        c.accepts_end(slow)
    # a recursive common table expression is no query of the language, and not authorized
    cte = "WITH RECURSIVE r(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM r) SELECT count(*) FROM r"
    assert not c.accepts_prefix(cte) and not c.run(cte).ok


def test_options_tables_empty_results_and_values(db):
    only = sql(db, tables=["SINGER"])
    assert only.accepts_end("SELECT name FROM singer")
    assert not only.accepts_prefix("SELECT year FROM concert")
    assert "concert" not in only.schema_text()
    empty = "SELECT name FROM singer WHERE age > 90"
    assert sql(db).accepts_end(empty)
    assert not sql(db, allow_empty=False).accepts_end(empty)
    values = sql(db, values=True)
    assert values.accepts_end("SELECT name FROM singer WHERE country = 'France'")
    assert not values.accepts_end("SELECT name FROM singer WHERE country = 'france'")
    assert values.accepts_prefix("SELECT name FROM singer WHERE country = 'Fr")
    assert not values.accepts_prefix("SELECT name FROM singer WHERE country = 'Ger")
    assert values.accepts_end("SELECT count(*) FROM concert WHERE year = '2015'")
    # a literal left of the column: read once the name is complete (it may still grow)
    assert values.accepts_end("SELECT name FROM singer WHERE 'France' = country")
    assert not values.accepts_end("SELECT name FROM singer WHERE 'Italy' = country")
    assert values.accepts_prefix("SELECT name FROM singer WHERE 'Italy' = country")
    assert not values.accepts_prefix("SELECT name FROM singer WHERE 'Italy' = country AND")
    assert not values.accepts_end("SELECT name FROM singer AS s WHERE 'Italy' <> s.country")
    asked = sql(db, literals="Which singers are from Spain?")
    assert asked.accepts_end("SELECT name FROM singer WHERE country = 'Spain'")
    assert not asked.accepts_prefix("SELECT name FROM singer WHERE country = 'France")
    assert sql(db).run("SELECT count(*) FROM singer").rows == ((3,),)
    with pytest.raises(ValueError, match="tables"):
        sql(db, tables=["nope"])
    with pytest.raises(TypeError, match="allow_empty"):
        sql(db, allow_empty="no")


def test_bad_databases_get_clear_errors(tmp_path):
    with pytest.raises(ValueError, match="no such file"):
        sql(tmp_path / "missing.sqlite")
    text = tmp_path / "notes.sqlite"
    text.write_text("not a database")
    with pytest.raises(ValueError, match="not a SQLite database"):
        sql(text)
    empty = tmp_path / "empty.sqlite"
    sqlite3.connect(empty).execute("CREATE TABLE t (x)").connection.execute("DROP TABLE t")
    with pytest.raises(ValueError, match="no tables"):
        sql(empty)
    with pytest.raises(TypeError, match="db must be"):
        sql(42)


def test_connections_are_read_again_read_only(db):
    con = sqlite3.connect(db)
    c = sql(con)
    assert c.accepts_end("SELECT count(*) FROM concert")
    con.close()
    memory = sqlite3.connect(":memory:")
    memory.execute("CREATE TABLE t (x INTEGER)")
    memory.execute("INSERT INTO t VALUES (7)")
    with pytest.raises(ValueError, match="uncommitted"):
        sql(memory)
    memory.commit()
    c = sql(memory)
    assert c.run("SELECT x FROM t").rows == ((7,),)
    assert not c.run("DELETE FROM t").ok
    assert memory.execute("SELECT count(*) FROM t").fetchone() == (1,)


def test_string_verdicts_equal_the_token_walk(db):
    c = sql(db, values=True)
    seeds = [
        "SELECT name FROM singer WHERE country = 'France';",
        "SELECT count(*) FROM concert WHERE year = '2015'",
        "SELECT T1.name FROM singer AS T1 JOIN concert AS T2 ON T1.singer_id = T2.singer_id",
    ]
    rng = random.Random(52)
    texts = random_texts(seeds, rng, 60, extra=" ;'")
    prefixes, ends = assert_agree(c, texts, chunk_lm(texts, rng), rng)
    assert 0 < prefixes < len(texts) and ends > 0, (prefixes, ends)


@pytest.mark.skipif(not SPIDER.is_dir(), reason="shared Spider data absent")
def test_spider_gold_queries_pass_and_files_stay_unchanged():
    questions = json.loads((SPIDER / "questions.json").read_text())
    chosen = random.Random(0).sample(questions, 40)
    files = {q["db_id"]: SPIDER / "database" / q["db_id"] / f"{q['db_id']}.sqlite" for q in chosen}
    before = {k: _digest(p) for k, p in files.items()}
    built = {k: sql(p) for k, p in files.items()}
    for q in chosen:
        c = built[q["db_id"]]
        assert c.accepts_end(q["query"]), (q["query"], c.failure(q["query"]))
        assert not c.accepts_end("DELETE FROM " + c.schema.tables[0].name)
    assert {k: _digest(p) for k, p in files.items()} == before
