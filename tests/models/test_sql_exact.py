"""The text-to-SQL program's target, checked exactly on a small database and a ``FunctionLM``.

:class:`~llamppl.models.TextToSQL` is :class:`~llamppl.models.HardConstraint` with the
``sql(db)`` constraint (``allow_empty=False, values=True``), so its target is the LM's query
conditioned on passing (``models/sql.py``)::

    P(y) ∝ p(y | x) 1_sql(y),    Z = Σ_y p(y | x) 1_sql(y)

where y is a path of at most ``MAX_TOKENS`` generated tokens: ended by EOS (p(y | x) includes
the end token) when the query passes the complete check, or cut at ``MAX_TOKENS`` and kept
iff it passes (``truncated="check"``). The LM is a ``FunctionLM`` over SQL pieces with
uneven, context-dependent logits; every piece has positive probability everywhere, so the
LM writes queries the grammar refuses (``)``, a column ``height`` the table lacks), queries
that parse but do not run (``WHERE count(*)``), queries with an empty result
(``age > 9``) and a value not in the data (``city = 'Oslo'``), and queries that pass.

The reference (:func:`reference`) is written here again, apart from the program: a
depth-first walk over every token path that the grammar alone allows as a prefix, each
finished text judged by the grammar's complete check and by running it
(``c.check.failure``), never by the database's prefix checks. So a prefix check that
refused a text with a passing completion would show as a missing path. Checked:

- ``enumerate_exact`` of the program gives this Z and posterior (every proposal);
- Ẑ of ``smc_standard`` is unbiased, and so are its weighted particles per bin of paths
  (:func:`~exact_reference.assert_unbiased_paths`: within 4 measured standard errors);
- ``rank_answers``' ``mass`` and ``rows_mass`` are the exact posterior of each query and of
  each result, and ``text_to_sql``'s answers carry the exact ratios restricted to what the
  run found;
- the total variation of the particle posterior falls from N = 4 to N = 64.
"""

from __future__ import annotations

import math
import sqlite3
from collections import defaultdict

import numpy as np
import pytest
from exact_reference import assert_unbiased_paths, path_of, weighted_paths

from llamppl import FunctionLM, run
from llamppl.constraints import sql
from llamppl.decoding.constraints import time_bound
from llamppl.decoding.sql.lexer import canonical_sql
from llamppl.inference import enumerate_exact, smc_standard
from llamppl.models import TextToSQL, text_to_sql
from llamppl.models.sql_answers import Found, rank_answers

VOCAB = [
    "<s>",
    "SELECT",
    " name",
    " count(*)",
    " FROM person",
    " WHERE",
    " age > 3",
    " age > 9",  # runs, but no row has it: refused with allow_empty=False
    " city = 'Rome'",
    " city = 'Oslo'",  # no such value in the column: refused with values=True
    " height",  # no such column: the grammar refuses it
    ")",  # breaks the grammar
    ";",
    "<eos>",
]
BOS, EOS = 0, len(VOCAB) - 1
MAX_TOKENS = 6
QUESTION = "Who is older than 3?"
RUNS = 300  # seeded SMC runs for the unbiasedness test


def _logits(ctx: tuple[int, ...]) -> list[float]:
    n, last = len(ctx), ctx[-1]
    out = [math.sin(1.3 * i + 0.7 * n + 0.4 * last) for i in range(EOS)]
    out[BOS] = -math.inf  # BOS is never generated
    return out + [-1.0 + 0.5 * n]


class ChatFunctionLM(FunctionLM):
    """A ``FunctionLM`` with a chat template: every chat renders as the prompt ``[BOS]``; the
    last messages are kept (the program's prompt is checked to hold the schema)."""

    messages: list[dict] = []

    def apply_chat_template(self, messages):
        self.messages = list(messages)
        return [BOS]


@pytest.fixture(scope="module")
def lm():
    return ChatFunctionLM(VOCAB, EOS, _logits, bos_token_id=BOS)


@pytest.fixture(scope="module")
def db(tmp_path_factory):
    path = tmp_path_factory.mktemp("sql_exact") / "people.sqlite"
    con = sqlite3.connect(path)
    con.executescript(
        """
        CREATE TABLE person (name TEXT, age INTEGER, city TEXT);
        INSERT INTO person VALUES ('Ann', 5, 'Rome'), ('Bob', 2, 'Paris');
        """
    )
    con.commit()
    con.close()
    return path


@pytest.fixture(scope="module")
def c(db):
    return sql(db, allow_empty=False, values=True)


@pytest.fixture(autouse=True)
def no_check_timeout():
    """Exact answers must not depend on the machine's load (a check past the default 2 s
    bound would end its particle and lose its mass)."""
    with time_bound(None):
        yield


def _program(lm, c, proposal="auto"):
    # tables=None, literals=None: every table, any literal (the question states only "3");
    # cues=0: the LM's own conditional (test_sql_program.py checks the cues' potential)
    return TextToSQL(
        lm,
        QUESTION,
        c,
        tables=None,
        literals=None,
        cues=0.0,
        max_tokens=MAX_TOKENS,
        proposal=proposal,
    )


def reference(lm, c):
    """``({path: p(path | x) 1_sql(path)}, {text: failure})`` over every path the grammar
    allows as a prefix (module docstring): a path is the tuple of generated token ids, EOS
    included when it ended; the second map says why each complete text of the grammar
    failed (None when it passed)."""
    grammar, weights, verdicts = c.grammar, {}, {}

    def passes(text: str) -> bool:
        if text not in verdicts:
            verdicts[text] = c.check.failure(text) if grammar.accepts_end(text) else "grammar"
        return verdicts[text] is None

    def visit(path: tuple[int, ...], text: str, log_p: float) -> None:
        row = lm.logprobs([BOS, *path]).double().tolist()
        for w, lp in enumerate(row[1:], start=1):
            here = path + (w,)
            if w == EOS:
                if passes(text):
                    weights[here] = math.exp(log_p + lp)
                continue
            grown = text + VOCAB[w]
            if not grammar.accepts_prefix(grown):
                continue
            if len(here) < MAX_TOKENS:
                visit(here, grown, log_p + lp)
            elif passes(grown):
                weights[here] = math.exp(log_p + lp)

    visit((), "", 0.0)
    return weights, verdicts


@pytest.fixture(scope="module")
def target(lm, c):
    weights, verdicts = reference(lm, c)
    z = sum(weights.values())
    return {p: w / z for p, w in weights.items()}, z, verdicts


def _text(path) -> str:
    return "".join(VOCAB[t] for t in path if t != EOS)


def test_the_reference_meets_every_kind_of_refusal(c, target):
    posterior, z, verdicts = target
    assert 0 < z < 1
    passed = {_text(p) for p in posterior}
    for q in [
        "SELECT name FROM person",
        "SELECT count(*) FROM person WHERE age > 9",  # one row (0,): not empty
        "SELECT name FROM person WHERE age > 3",
        "SELECT name FROM person WHERE city = 'Rome'",
        "SELECT name FROM person WHERE age > 3;",  # cut at MAX_TOKENS, and it passes
    ]:
        assert q in passed, q
    assert "the query's result is empty" == verdicts["SELECT name FROM person WHERE age > 9"]
    assert "misuse of aggregate" in verdicts["SELECT name FROM person WHERE count(*)"]
    assert verdicts["SELECT name"].startswith("the query does not run: no such column")
    # a value not in the column: its result is empty too; the prefix check refuses it early
    assert verdicts["SELECT count(*) FROM person WHERE city = 'Oslo'"].startswith("no value")
    assert verdicts["SELECT name FROM person WHERE city = 'Oslo'"] is not None
    # no column "height", no ")" after a name: the grammar refuses them (an alias "height" passes)
    assert not c.grammar.accepts_prefix("SELECT height")
    assert not c.grammar.accepts_prefix("SELECT name)")
    assert not any(VOCAB.index(")") in p for p in posterior)
    assert not any("WHERE city = 'Oslo'" in t for t in passed)


@pytest.mark.parametrize("proposal", ["auto", "mask"])
def test_enumeration_of_the_program_is_the_reference(lm, c, target, proposal):
    posterior, z, _ = target
    model = _program(lm, c, proposal)
    assert model.context.tokens == [BOS] and "CREATE TABLE person" in lm.messages[-1]["content"]
    exact = run(enumerate_exact(model))
    assert exact.log_ml == pytest.approx(math.log(z), abs=1e-10)
    paths = weighted_paths(exact)
    total = sum(paths.values())
    assert paths.keys() == posterior.keys()
    for p, w in posterior.items():
        assert paths[p] / total == pytest.approx(w, abs=1e-10), _text(p)


@pytest.fixture(scope="module")
def runs4(lm, c):
    """``RUNS`` seeded ``smc_standard`` runs of the program with N = 4 particles."""
    model = _program(lm, c)
    return [run(smc_standard(model, 4, seed=s)) for s in range(RUNS)]


def test_z_hat_and_weighted_particles_are_unbiased(runs4, target):
    posterior, z, _ = target
    assert_unbiased_paths(runs4, posterior, z)


def _tv(result, posterior) -> float:
    """Total variation between a run's normalised particle weights (over paths) and the exact
    posterior."""
    paths = weighted_paths(result)
    total = sum(paths.values())
    keys = paths.keys() | posterior.keys()
    return 0.5 * sum(abs(paths.get(p, 0.0) / total - posterior.get(p, 0.0)) for p in keys)


def test_particle_posterior_approaches_the_exact_one_as_n_grows(lm, c, runs4, target):
    posterior, _, _ = target
    model = _program(lm, c)
    small = np.array([_tv(r, posterior) for r in runs4])
    large = np.array([_tv(run(smc_standard(model, 64, seed=s)), posterior) for s in range(20)])
    se = math.sqrt(small.var(ddof=1) / len(small) + large.var(ddof=1) / len(large))
    assert large.mean() + 4 * se < small.mean(), (small.mean(), large.mean(), se)


def _key(text: str) -> str:
    """A query's identity here: its text without the final ``;`` (no two spellings of the
    vocabulary differ otherwise)."""
    return text.removesuffix(";")


def _rows(db, text: str) -> tuple:
    """The query's result as sorted rows, read with a connection of our own."""
    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        return tuple(sorted(con.execute(_key(text)).fetchall(), key=repr))
    finally:
        con.close()


def _expected(db, posterior, found_paths):
    """``({query: mass}, {query: rows_mass})``: the exact posterior restricted to
    ``found_paths`` and normalised, per query and per result."""
    total = sum(posterior[p] for p in found_paths)
    mass, by_rows, rows_of = defaultdict(float), defaultdict(float), {}
    for p in found_paths:
        k = _key(_text(p))
        mass[k] += posterior[p] / total
        rows_of[k] = _rows(db, k)
        by_rows[rows_of[k]] += posterior[p] / total
    return dict(mass), {k: by_rows[r] for k, r in rows_of.items()}


def _check_answers(answers, db, posterior, z, found_paths) -> None:
    mass, rows_mass = _expected(db, posterior, found_paths)
    assert sorted(_key(a.sql) for a in answers) == sorted(mass)
    for a in answers:
        k = _key(a.sql)
        assert {_key(s) for s in a.spellings} == {k}
        assert a.mass == pytest.approx(mass[k], rel=1e-9), k
        assert a.rows_mass == pytest.approx(rows_mass[k], rel=1e-9), k
        assert tuple(sorted(a.rows, key=repr)) == _rows(db, k)
        best = max((p for p in found_paths if _key(_text(p)) == k), key=lambda p: posterior[p])
        assert _text(best) == a.sql
        assert a.log_prob == pytest.approx(math.log(z * posterior[best]), abs=1e-9)
    order = [(-a.rows_mass, -a.mass) for a in answers]
    assert order == sorted(order)


def test_ranked_answers_carry_the_exact_posterior_of_queries_and_results(c, db, target):
    posterior, z, _ = target
    found = [Found(_text(p), p, math.log(z * w), w) for p, w in posterior.items()]
    texts = [f.text for f in found]  # _key names the same queries as the program's canonical_sql
    assert len({_key(t) for t in texts}) == len({canonical_sql(t) for t in texts}) < len(texts)
    answers = rank_answers(c, found)
    _check_answers(answers, db, posterior, z, list(posterior))
    # results shared by several queries are pooled: Ann's row alone, from several queries
    ann = [a for a in answers if a.rows == (("Ann",),)]
    assert len(ann) >= 2 and len({a.rows_mass for a in ann}) == 1
    assert ann[0].rows_mass == pytest.approx(sum(a.mass for a in ann), rel=1e-12)
    assert sum(a.mass for a in answers) == pytest.approx(1.0, abs=1e-12)


def test_text_to_sql_gives_the_exact_ratios_of_what_it_found(lm, c, db, target):
    posterior, z, _ = target
    out = text_to_sql(
        lm, QUESTION, c, 32, seed=0, tables=None, literals=None, cues=0.0, max_tokens=MAX_TOKENS
    )
    live = [
        path_of(p) for p, w in zip(out.result.particles, out.result.log_weights) if w > -math.inf
    ]
    assert len(set(live)) >= 5 and out.log_ml == out.result.log_ml
    _check_answers(out.answers, db, posterior, z, set(live))
    assert sum(a.weight for a in out.answers) == pytest.approx(1.0, abs=1e-12)
