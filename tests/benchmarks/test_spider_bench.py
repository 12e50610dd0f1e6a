"""``benchmarks/spider_eval.py`` and ``spider_report.py``: the metric ``bench_spider.py`` grades
with, its choice of questions, its worked examples and its table, on a database built here
(and on the shared Spider dev data when it is there)."""

from __future__ import annotations

import json
import sqlite3
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))

import bench_spider as B  # noqa: E402
import spider_eval as E  # noqa: E402
import spider_report as R  # noqa: E402


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    """A Spider-format folder with two small databases and their questions."""
    root = tmp_path_factory.mktemp("spider")
    questions = []
    for db, rows in (("zoo", [("cat", 3), ("dog", 5), ("owl", 5)]), ("farm", [("cow", 7)])):
        path = root / "database" / db / f"{db}.sqlite"
        path.parent.mkdir(parents=True)
        con = sqlite3.connect(path)
        con.execute("CREATE TABLE animal (name TEXT, age INTEGER)")
        con.executemany("INSERT INTO animal VALUES (?, ?)", rows)
        con.commit()
        con.close()
        questions += [
            {"db_id": db, "question": "How many animals are there?", "query": "select count(*) from animal"},
            {"db_id": db, "question": 'Which animal is "cat"?', "query": 'SELECT name FROM animal WHERE name = "cat"'},
            {"db_id": db, "question": "List names by age.", "query": "SELECT name FROM animal ORDER BY age"},
        ]  # fmt: skip
    (root / "questions.json").write_text(json.dumps(questions))
    return root


def test_execution_match_is_a_multiset_unless_the_gold_orders(data):
    path = E.database_path(data, "zoo")
    gold, _ = E.execute(path, "SELECT name FROM animal ORDER BY age")
    rows, _ = E.execute(path, "SELECT name FROM animal ORDER BY age DESC")
    assert not E.execution_match(rows, gold, "SELECT name FROM animal ORDER BY age")
    assert E.execution_match(rows, gold, "SELECT name FROM animal")  # same multiset
    assert E.execution_match([(5.0,)], [(5,)], "SELECT max(age) FROM animal")
    assert not E.execution_match(None, gold, "SELECT name FROM animal")
    assert E.execute(path, "SELECT nope FROM animal")[0] is None
    assert E.execute(path, "DELETE FROM animal")[0] is None  # read-only
    assert E.execute(path, "SELECT count(*) FROM animal")[0] == [(3,)]


def test_choice_of_questions_is_seeded_per_database(data):
    qs = E.load_questions(data)
    one = E.choose(qs, 2, seed=0)
    assert one == E.choose(qs, 2, seed=0) and len(one) == 4
    alone = E.choose([q for q in qs if q.db_id == "zoo"], 2, seed=0)
    assert [q for q in one if q.db_id == "zoo"] == alone  # independent of the other databases
    with pytest.raises(ValueError, match="--data"):
        E.load_questions(data / "database")


def test_examples_are_tidy_and_never_from_the_database_asked(data):
    assert E.tidy_sql('select name ,  count(*) from t where x  =  "a b"') == (
        "SELECT name, count(*) FROM t WHERE x = 'a b';"
    )
    pools = E.example_pools(data)
    assert set(pools) == {"zoo", "farm"}
    assert all("CREATE TABLE animal" in e.schema for e in pools["zoo"])
    q = E.load_questions(data)[0]
    shots = B.shots(q, data, None, 2)
    assert shots and all(e in pools["farm"] for e in shots)
    assert shots[-1].question == q.question  # the same template, from the other database
    alone = data.parent / "alone"
    (alone / "database").mkdir(parents=True)
    (alone / "database" / "zoo").symlink_to(data / "database" / "zoo")
    zoo = [r for r in json.loads((data / "questions.json").read_text()) if r["db_id"] == "zoo"]
    (alone / "questions.json").write_text(json.dumps(zoo))
    assert B.shots(E.load_questions(alone)[0], alone, None, 2) == []  # then: built-in examples


def test_sql_read_out_of_free_text():
    assert B.extract_sql("Sure!\n```sql\nSELECT a FROM t;\n```") == "SELECT a FROM t"
    assert B.extract_sql("The answer is SELECT a FROM t; done") == "SELECT a FROM t"


def test_table_reports_runs_accuracy_and_cpu():
    records = [
        {"method": "smc", "n_particles": 8, "runs": True, "correct": True, "cpu_s": 2.0},
        {"method": "smc", "n_particles": 8, "runs": True, "correct": False, "cpu_s": 4.0},
    ]
    row = R.table(records).splitlines()[-1]
    assert row.startswith("| smc | 8 | 2 | 100.0 % | 50.0 % (")
    assert row.endswith("| 3.00, 3.00 |")
    lo, hi = R.wilson(1, 2)
    assert 0 < lo < 0.5 < hi < 1
