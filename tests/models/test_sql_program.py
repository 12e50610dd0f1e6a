"""``text_to_sql``'s program on an exact small LM: its target with the question cues, its
ranking, its fallback, and the pieces of its prompt (examples nearest the question).

A ``FunctionLM`` with a chat template of its own writes SQL pieces over a small database
built here. The reference target is written out independently: the sampling formulation of
the SQL constraint summed over every token path (``exact_reference.sampling_target``), times
the cue potential φ(y) = exp(−λ · cue_penalty(question, y)). ``enumerate_exact`` of the
program must equal it, SMC's Ẑ and Ẑ π̂ must be unbiased for it, and the masses of the
ranked answers must be its exact ratios.
"""

from __future__ import annotations

import math
import sqlite3

import pytest
from exact_reference import assert_unbiased_paths, path_of, sampling_target, weighted_paths

from llamppl import FunctionLM, run
from llamppl.decoding.sql.lexer import has_order_by
from llamppl.inference import enumerate_exact, smc_standard
from llamppl.models import TextToSQL, text_to_sql
from llamppl.models.sql_answers import found_texts, rank_answers
from llamppl.models.sql_cues import asked, cue_penalty, features, motivated, wide
from llamppl.models.sql_examples import masked_words, nearest_examples, similarity
from llamppl.models.sql_prompt import SQLExample

VOCAB = [
    "SELECT",
    " count(*)",
    " name",
    " max(age)",
    " FROM singer",
    " ORDER BY age",
    " WHERE country = 'France'",
    " FROM nowhere",
    ";",
    "<eos>",
]
EOS = VOCAB.index("<eos>")
QUESTION = "How many singers are there?"


class ChatLM(FunctionLM):
    """A ``FunctionLM`` whose chat template is one fixed token (the program's prompt)."""

    def apply_chat_template(self, messages):
        return [0]


def _logits(ctx: tuple[int, ...]) -> list[float]:
    # a fixed, context-dependent preference: every token possible, none certain
    return [math.sin(1.3 * i + 0.7 * len(ctx) + 0.1 * sum(ctx)) for i in range(len(VOCAB))]


@pytest.fixture(scope="module")
def lm() -> ChatLM:
    return ChatLM(VOCAB, EOS, _logits)


@pytest.fixture(scope="module")
def db(tmp_path_factory):
    path = tmp_path_factory.mktemp("sql_program") / "music.sqlite"
    con = sqlite3.connect(path)
    con.executescript(
        """
        CREATE TABLE singer (singer_id INTEGER PRIMARY KEY, name TEXT, country TEXT, age INT);
        INSERT INTO singer VALUES (1, 'Joe', 'France', 30), (2, 'Ann', 'Spain', 41);
        """
    )
    con.commit()
    con.close()
    return path


def _program(lm, db, **options) -> TextToSQL:
    base = dict(examples=(), tables=None, literals=None, max_tokens=5, cues=2.0)
    return TextToSQL(lm, QUESTION, db, **{**base, **options})


def _reference(lm, model: TextToSQL) -> tuple[dict, float]:
    """``({path: P(path)}, Z)`` of p · 1_sql · φ, summed independently of the program."""
    c = model.constraint
    paths, z0 = sampling_target(
        lm,
        model.context.tokens,
        c.accepts_prefix,
        c.accepts_end,
        {EOS},
        model.max_tokens,
    )

    def phi(path):
        text = "".join(VOCAB[t] for t in path if t != EOS)
        return math.exp(-model.cues * cue_penalty(QUESTION, text))

    unnorm = {p: w * z0 * phi(p) for p, w in paths.items()}
    z = sum(unnorm.values())
    return {p: w / z for p, w in unnorm.items() if w > 0}, z


def test_the_exact_posterior_is_the_lm_times_the_cue_potential(lm, db):
    model = _program(lm, db)
    want, z = _reference(lm, model)
    exact = run(enumerate_exact(model))
    found = weighted_paths(exact)
    total = sum(found.values())
    assert math.exp(exact.log_ml) == pytest.approx(z, rel=1e-9)
    assert found.keys() == want.keys()
    for path, w in want.items():
        assert found[path] / total == pytest.approx(w, abs=1e-9), path
    # the cues move mass: the counting query outweighs the others more than the LM alone does
    plain = weighted_paths(run(enumerate_exact(_program(lm, db, cues=0.0))))
    count = [p for p in want if VOCAB.index(" count(*)") in p]
    assert count and sum(want[p] for p in count) > sum(plain[p] for p in count) / sum(
        plain.values()
    )


def test_smc_is_unbiased_for_the_program_with_cues(lm, db):
    model = _program(lm, db)
    want, z = _reference(lm, model)
    runs = [run(smc_standard(model, 4, 0.5, seed=s, progress=False)) for s in range(300)]
    assert_unbiased_paths(runs, want, z, bin_mass=0.1)


def test_ranked_masses_are_exact_ratios_of_the_target(lm, db):
    model = _program(lm, db)
    want, _ = _reference(lm, model)
    result = run(smc_standard(model, 16, 0.5, seed=3, progress=False))
    found = run(found_texts(result))
    answers = rank_answers(model.constraint, found, "sql", model.log_potential)
    paths = {path_of(p): p.text for p in result.particles if p.failure is None}
    by_text: dict[str, float] = {}
    for path, text in paths.items():
        by_text[text] = by_text.get(text, 0.0) + want[path]
    total = sum(by_text.values())
    assert answers
    for a in answers:
        mass = sum(by_text[s] for s in a.spellings)
        assert a.mass == pytest.approx(mass / total, rel=1e-6), a.sql
    by_rows = rank_answers(model.constraint, found, "rows", model.log_potential)

    def result(a):  # rows in order under ORDER BY, else as a multiset
        return tuple(a.rows) if has_order_by(a.sql) else tuple(sorted(a.rows, key=repr))

    for a in by_rows:
        same = sum(b.mass for b in answers if result(b) == result(a))
        assert a.rows_mass == pytest.approx(same, rel=1e-6)
    assert [a.rows_mass for a in by_rows] == sorted((a.rows_mass for a in by_rows), reverse=True)


def test_the_fallback_answers_when_no_particle_passes(lm, db):
    # no query fits in one token; the fallback has two (``SELECT count(*)``, ``SELECT max(age)``)
    strict = dict(examples=(), tables=None, max_tokens=1)
    out = text_to_sql(lm, "Which singers?", db, 4, seed=0, **strict)
    assert out.relaxed and out.strict is not None and not out.strict.answers
    assert out.answers and all(a.rows for a in out.answers)
    off = text_to_sql(lm, "Which singers?", db, 4, seed=0, fallback=False, **strict)
    assert not off.answers and not off.relaxed
    # what a notebook shows: the answers with their masses and rows, or why there are none
    assert "relaxed" in repr(out) and out.best.sql in repr(out) and "<table>" in out._repr_html_()
    assert "no query passed" in repr(off) and "no query passed" in off._repr_html_()


def test_cues_read_the_question_and_the_query():
    assert asked("How many singers are there?") == {"count"}
    assert "order" in asked("List the names sorted by age.")
    assert features("SELECT max(age) FROM singer") == {"max/min", "extreme"}
    assert "max/min" not in motivated("How many singers are there?")
    assert cue_penalty(QUESTION, "SELECT max(age) FROM singer") == 2  # count missing, max extra
    assert cue_penalty(QUESTION, "SELECT max(age) FROM singer", finished=False) == 1
    assert cue_penalty(QUESTION, "SELECT count(*) FROM singer") == 0
    assert wide("SELECT a, b, c, d FROM t") and not wide("SELECT a, max(b, c), d FROM t")
    assert not wide("SELECT a FROM t WHERE x IN (1, 2, 3, 4)") and not wide("SELECT 'a,b,c,d'")
    assert "star" in features("SELECT T1.* FROM t AS T1") and "star" not in features(
        "SELECT count(*)"
    )
    assert cue_penalty("Show all the information about hiring.", "SELECT * FROM hiring") == 0
    with pytest.raises(TypeError, match="question"):
        cue_penalty(None, "SELECT 1")


def test_bad_options_of_the_program_are_named(lm, db):
    with pytest.raises(ValueError, match="cues"):
        _program(lm, db, cues=-1.0)
    with pytest.raises(ValueError, match="temperature"):
        _program(lm, db, temperature=0.0)
    with pytest.raises(ValueError, match="fallback"):
        text_to_sql(lm, QUESTION, db, 2, seed=0, fallback="yes")


LIBRARY = "CREATE TABLE book (book_id INTEGER PRIMARY KEY, title TEXT, year INTEGER);"
ZOO = "CREATE TABLE animal (animal_id INTEGER PRIMARY KEY, species TEXT, age INTEGER);"
POOL = [
    SQLExample("How many books do we have?", "SELECT count(*) FROM book;", LIBRARY),
    SQLExample("How many books are there?", "SELECT count(*) FROM book;", LIBRARY),
    SQLExample("List the titles sorted by year.", "SELECT title FROM book ORDER BY year;", LIBRARY),
    SQLExample("How many animals do we have?", "SELECT count(*) FROM animal;", ZOO),
    SQLExample("What is the average age?", "SELECT avg(age) FROM animal;", ZOO),
]


def test_examples_nearest_the_question_once_names_are_masked():
    assert masked_words("How many flights do we have?", "CREATE TABLE flights (id INTEGER);") == (
        "how", "many", "<s>", "do", "we", "have",
    )  # fmt: skip
    assert masked_words("Flights after 2010 from 'AHD'") == (
        "flight",
        "after",
        "<n>",
        "from",
        "<v>",
    )
    shots = nearest_examples("How many flights do we have?", POOL, k=2)
    assert shots[-1].question == "How many books do we have?"  # most similar last
    assert len({s.sql for s in shots}) == 2  # paraphrases with one query count once
    one_db = nearest_examples("How many flights do we have?", POOL, k=3, per_db=1)
    assert len({s.schema for s in one_db}) == len(one_db) == 2
    assert nearest_examples("anything", POOL, k=0) == []
    words = masked_words("How many books do we have?", LIBRARY)
    assert similarity(words, words) == 1.0
    with pytest.raises(ValueError, match="k must"):
        nearest_examples("q", POOL, k=-1)
    with pytest.raises(TypeError, match="pool"):
        nearest_examples("q", POOL[0])
