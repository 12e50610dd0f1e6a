"""``text_to_sql``: a question over a database, answered with SQL that runs on it, by SMC.

The program :class:`TextToSQL` is :class:`~llamppl.models.HardConstraint` with

- the prompt of :mod:`~llamppl.models.sql_prompt` (the LM's chat template: an instruction,
  worked examples over a database of our own, the user's tables as ``CREATE TABLE`` text read
  from the database, the question), and
- the constraint :func:`~llamppl.constraints.sql` of the database: SQLite's query grammar
  over its own tables and columns (a cheap mask), and the database's checks, lazily, on the
  tokens drawn: a query's first clauses must compile as soon as a clause keyword follows
  them, the finished query must run (read-only, time-bounded), and by default its result must
  not be empty and every string literal compared to a column must occur in it.

Let p be the LM after the prompt x. The target is the LM's query conditioned on passing::

    P(y) ∝ p(y EOS | x) · 1_sql(y),    Z = Σ_y p(y EOS | x) 1_sql(y)

within ``max_tokens`` tokens, sampled by ``smc_standard`` (the lazy masked proposal of
``HardConstraint`` and its unbiased weights; resampling at ESS < N/2). The answer is the
posterior: :func:`text_to_sql` merges particles whose queries are the same SQL (tokens
compared with keywords' and names' case ignored and whitespace dropped,
:func:`~llamppl.decoding.sql.lexer.canonical_sql`), runs each distinct query once, and ranks
them (``rank="rows"``, the default) by the posterior mass of their *result*: queries that
return the same rows pool their mass (execution consistency), and within a result the more
probable query comes first; ``rank="sql"`` ranks by each query's own mass::

    from llamppl import CachedCausalLM
    from llamppl.models import text_to_sql
    lm = CachedCausalLM.default()
    out = text_to_sql(lm, "How many singers are there?", "concert_singer.sqlite", seed=0)
    out.best.sql, out.best.rows        # 'SELECT count(*) FROM singer', ((6,),)
"""

from __future__ import annotations

import asyncio
import functools
import math
import os
import sqlite3
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from llamppl.decoding.constraints.twists import twist_level
from llamppl.decoding.sql.constraint import SQL, sql
from llamppl.decoding.sql.lexer import canonical_sql, has_order_by
from llamppl.lm.base import LanguageModel
from llamppl.rng import make_rng
from llamppl.runner import run
from llamppl.validation import check_positive_int

from .hard_constraints import HardConstraint
from .sql_cues import asked, cue_penalty, features
from .sql_linking import link_tables
from .sql_prompt import EXAMPLES, SYSTEM_MESSAGE, SQLExample, sql_messages

__all__ = ["RANKS", "SQLAnswer", "SQLResult", "TextToSQL", "text_to_sql", "text_to_sql_async"]

RANKS = ("rows", "sql")
DEFAULT_MAX_TOKENS = 64
#: The weight λ of the question cues (:mod:`~llamppl.models.sql_cues`), in nats per feature.
DEFAULT_CUES = 2.0
#: Runs of the fallback (each with fresh randomness) at most, when the program's run found nothing.
DEFAULT_FALLBACK = 2


def program_constraint(
    db: Any,
    question: str,
    *,
    tables: Sequence[str] | str | None = "linked",
    allow_empty: bool | None = None,
    values: bool | None = None,
    literals: str | None = "question",
) -> SQL:
    """The constraint of :class:`TextToSQL`: ``sql(db, allow_empty=False, values=True)`` (or the
    given ``db`` constraint with its own options), over the linked tables
    (``tables="linked"``: :func:`~llamppl.models.sql_linking.link_tables`; a list: those; None:
    all), with the literals taken from the question (``literals="question"``; a text: from it;
    None: any)."""
    if isinstance(db, SQL):
        if allow_empty is not None or values is not None:
            raise ValueError(
                "db is already a sql() constraint: give allow_empty and values to sql(), not here"
            )
        base = db
    elif isinstance(db, (str, os.PathLike, sqlite3.Connection)):
        base = sql(
            db,
            allow_empty=False if allow_empty is None else allow_empty,
            values=True if values is None else values,
        )
    else:
        raise TypeError(
            "db must be a path to a SQLite file, a sqlite3.Connection or a sql() constraint, "
            f"got {type(db).__name__}"
        )
    if tables == "linked":
        tables = link_tables(base.schema, question)
    elif isinstance(tables, str):
        raise ValueError(
            f'tables must be "linked", a sequence of table names or None, got {tables!r}'
        )
    if literals == "question":
        literals = question
    if tables is None and literals is None:
        return base
    return base.narrowed(tables, literals)


class TextToSQL(HardConstraint):
    """The LM's SQL answer to ``question`` over ``db``, conditioned on running (module docstring).

    Parameters
    ----------
    lm : LanguageModel
        An LM with a chat template (the embedded SmolLM2 has one).
    question : str
        The question, in words.
    db : str | os.PathLike | sqlite3.Connection | SQL
        The database (opened read-only), or a ready :func:`~llamppl.constraints.sql`
        constraint (then ``tables``, ``allow_empty`` and ``values`` are its own).
    examples : Sequence[SQLExample]
        Worked examples put before the question (:data:`~llamppl.models.sql_prompt.EXAMPLES`
        by default; ``()`` for none).
    tables, allow_empty, values
        The options of :func:`~llamppl.constraints.sql` (defaults here: every table,
        ``allow_empty=False``, ``values=True``).
    system : str
        The system message.
    max_tokens : int | None
        Tokens of the query at most (end token included; default 64).
    **options
        :class:`~llamppl.models.HardConstraint`'s options (``proposal``, ``check_timeout``,
        ``end_twist``, ``twist``, ...).

    Attributes
    ----------
    question : str
    constraint : SQL
    """

    constraint_noun = "SQL constraint"

    def __init__(
        self,
        lm: LanguageModel,
        question: str,
        db: Any,
        *,
        examples: Sequence[SQLExample] = EXAMPLES,
        tables: Sequence[str] | str | None = "linked",
        allow_empty: bool | None = None,
        values: bool | None = None,
        literals: str | None = "question",
        system: str = SYSTEM_MESSAGE,
        max_tokens: int | None = DEFAULT_MAX_TOKENS,
        temperature: float = 1.0,
        cues: float = DEFAULT_CUES,
        **options: Any,
    ) -> None:
        if isinstance(cues, bool) or not isinstance(cues, (int, float)) or not cues >= 0:
            raise ValueError(f"cues must be a number >= 0 (the weight λ; 0: off), got {cues!r}")
        constraint = program_constraint(
            db, question, tables=tables, allow_empty=allow_empty, values=values, literals=literals
        )
        messages = sql_messages(constraint.schema_text(), question, examples, system)
        prompt = list(lm.apply_chat_template(messages))
        if temperature != 1.0:
            options["fast_forward"] = False
        if cues:
            options["twist"] = functools.partial(_anticipated_cues, own=options.get("twist"))
        super().__init__(lm, prompt, constraint, max_tokens=max_tokens, **options)
        self.context.temp = float(temperature)
        self.question = question
        self.cues = float(cues)
        self.cue_level = 0

    async def step(self) -> None:
        """One token (:class:`HardConstraint`), then the question cues' potential brought up to
        date: ``−λ`` per feature of the text the question does not motivate, and, once the
        query has ended, per feature it asks for that the query lacks
        (:mod:`~llamppl.models.sql_cues`; the increments sum to ``log φ`` of the final text).
        While the query runs, the features still missing are a twist (:func:`_anticipated_cues`),
        undone when it ends, so a finished query is not outweighed by a live one only because
        the live one has not yet been charged for what it lacks."""
        await super().step()
        if self.cues and self.failure is None:
            level = cue_penalty(self.question, self.text, finished=self.ending is not None)
            if level != self.cue_level:
                self.score(-self.cues * (level - self.cue_level))
                self.cue_level = level

    def log_potential(self, text: str) -> float:
        """log φ of a finished query (the cues' potential; 0 when ``cues=0``)."""
        return -self.cues * cue_penalty(self.question, text) if self.cues else 0.0


async def _anticipated_cues(model: TextToSQL, own: Any = None) -> float:
    """The twist of a live query: ``−λ`` per feature the question asks for that the text does
    not have yet (what its potential would charge if it ended now), plus the program's own
    ``twist`` when one was given."""
    level = -model.cues * len(asked(model.question) - features(model.text))
    if own is not None:
        level += await twist_level(own, model)
    return level


@dataclass(frozen=True)
class SQLAnswer:
    """One distinct query the run found.

    Attributes
    ----------
    sql : str
        The query as its most probable spelling wrote it.
    log_prob : float
        log p(y | x) of that spelling under the LM at temperature 1 (end token included):
        the log of its posterior probability up to the constant Z.
    mass : float
        Its share of the posterior probability of every query found: Σ p(y | x) φ(y) over its
        spellings (φ the question cues' potential), divided by the same sum over all of them
        (exact ratios of the target's probabilities, not estimates).
    rows_mass : float
        The same share for every query found with the same result (``rank="rows"``'s key).
    weight : float
        Its share of the final SMC weights (the sampler's own estimate of ``mass``).
    rows : tuple[tuple, ...]
        Its result rows (at most the constraint's ``max_rows``).
    columns : tuple[str, ...]
        The result's column names.
    spellings : tuple[str, ...]
        The texts the particles wrote for it.
    """

    sql: str
    log_prob: float
    mass: float
    rows_mass: float
    weight: float
    rows: tuple[tuple, ...]
    columns: tuple[str, ...]
    spellings: tuple[str, ...] = ()


@dataclass
class SQLResult:
    """The ranked answers of :func:`text_to_sql`.

    Attributes
    ----------
    answers : list[SQLAnswer]
        Distinct queries, best first (by ``rank``); empty when no particle passed.
    log_ml : float
        log Ẑ: the log of the unbiased estimate of P(the LM's query passes the constraint).
    result : SMCResult
        The run (particles, weights, history, stats).
    failures : dict[str, int]
        Why particles of the final population failed, with counts.
    relaxed : bool
        Whether these answers come from the fallback (``fallback=k``: when no particle of the
        program's own run passed, up to ``k`` runs, 2 by default, stopping at the first that
        finds a query): the same program over every table of the database
        (the prompt shows them all) with the grammar and the run check only (any literal,
        empty results allowed; the question cues kept) and twice the tokens. Its target is
        that looser one; ``log_ml`` estimates the probability of passing *it*.
    strict : SQLResult | None
        The run that found nothing, when ``relaxed``.
    """

    answers: list[SQLAnswer]
    log_ml: float
    result: Any
    failures: dict[str, int] = field(default_factory=dict)
    relaxed: bool = False
    strict: SQLResult | None = None

    @property
    def best(self) -> SQLAnswer | None:
        """The first answer, or None when no particle passed."""
        return self.answers[0] if self.answers else None


@dataclass(frozen=True)
class Found:
    """A passing text a run found: its text, its tokens, log p(tokens | prompt) at
    temperature 1 and its normalised final weight."""

    text: str
    tokens: tuple[int, ...]
    log_prob: float
    weight: float


def _rows_key(rows: tuple[tuple, ...], ordered: bool) -> tuple:
    """A result as a hashable key: values of equal numbers made equal, order kept when
    ``ordered``."""
    norm = tuple(tuple(_value(v) for v in row) for row in rows)
    return norm if ordered else tuple(sorted(norm, key=repr))


def _value(v: Any) -> Any:
    if isinstance(v, float):
        return int(v) if v.is_integer() else round(v, 9)
    return v


async def found_texts(result: Any) -> list[Found]:
    """The passing texts of a run's final particles, each distinct token sequence once, with
    its exact log-probability under the LM at temperature 1 (the run's rows, read again from
    the LM's cache) and its normalised weight."""
    live = [(p, w) for p, w in zip(result.particles, result.log_weights) if w > -math.inf]
    if not live:
        return []
    top = max(w for _, w in live)
    total = sum(math.exp(w - top) for _, w in live)
    by_tokens: dict[tuple[int, ...], list] = {}
    for p, w in live:
        key = tuple(p.context.generated)
        entry = by_tokens.setdefault(key, [p, 0.0])
        entry[1] += math.exp(w - top) / total
    out = []
    for key, (p, weight) in by_tokens.items():
        ctx, lm = p.context, p.context.lm
        start = ctx.prompt_length
        rows = await asyncio.gather(
            *(lm.next_token_logprobs(ctx.tokens[: start + i]) for i in range(len(key)))
        )
        log_prob = sum(float(row[t]) for row, t in zip(rows, key))
        out.append(Found(p.text, key, log_prob, weight))
    return out


def rank_answers(
    constraint: SQL,
    found: Sequence[Found],
    rank: str = "rows",
    log_potential: Callable[[str], float] | None = None,
) -> list[SQLAnswer]:
    """The distinct queries among ``found`` (texts with the same canonical SQL merged), run once
    each and ranked by ``rank``: ``"rows"``, the posterior probability of their result (every
    query found with the same rows together), then their own; ``"sql"``, their own. The
    probabilities are exact ratios, Σ p(y | x) φ(y) over the spellings found, with
    ``log_potential`` the program's log φ (None: φ = 1)."""
    if rank not in RANKS:
        raise ValueError(f"rank must be one of {RANKS}, got {rank!r}")
    if not found:
        return []
    score = {f.text: f.log_prob + (log_potential(f.text) if log_potential else 0.0) for f in found}
    top = max(score.values())
    merged: dict[str, list] = {}
    for f in sorted(found, key=lambda f: -score[f.text]):
        entry = merged.setdefault(canonical_sql(f.text), [f.text, f.log_prob, 0.0, 0.0, []])
        entry[2] += math.exp(score[f.text] - top)
        entry[3] += f.weight
        entry[4].append(f.text)
    total = sum(e[2] for e in merged.values())
    runs = {key: constraint.run(entry[0]) for key, entry in merged.items()}
    keys = {k: _rows_key(runs[k].rows, has_order_by(e[0])) for k, e in merged.items()}
    by_rows: Counter = Counter()
    for k, e in merged.items():
        by_rows[keys[k]] += e[2] / total
    answers = [
        SQLAnswer(
            e[0],
            e[1],
            e[2] / total,
            by_rows[keys[k]],
            e[3],
            runs[k].rows,
            runs[k].columns,
            tuple(e[4]),
        )
        for k, e in merged.items()
    ]
    if rank == "rows":
        answers.sort(key=lambda a: (-a.rows_mass, -a.mass))
    else:
        answers.sort(key=lambda a: -a.mass)
    return answers


async def text_to_sql_async(
    lm: LanguageModel,
    question: str,
    db: Any,
    n_particles: int = 8,
    seed: Any = None,
    *,
    rank: str = "rows",
    ess_threshold: float = 0.5,
    resampling: str = "systematic",
    move: Any = None,
    fallback: int | bool = DEFAULT_FALLBACK,
    **options: Any,
) -> SQLResult:
    """:func:`text_to_sql` as a coroutine (questions awaited together share the LM's forwards)."""
    n = check_positive_int("n_particles", n_particles)
    if rank not in RANKS:
        raise ValueError(f"rank must be one of {RANKS}, got {rank!r}")
    if isinstance(fallback, bool):
        fallback = DEFAULT_FALLBACK if fallback else 0
    elif not isinstance(fallback, int) or fallback < 0:
        raise ValueError(f"fallback must be a bool or an int >= 0 (runs at most), got {fallback!r}")
    rng = make_rng(seed)
    model = TextToSQL(lm, question, db, **options)
    out = await _solve(model, n, rng, rank, ess_threshold, resampling, move)
    if out.answers or not fallback:
        return out
    relaxed = dict(options, tables=None, literals=None)
    relaxed.pop("allow_empty", None)
    relaxed.pop("values", None)
    db = model.constraint.relaxed()
    budget = options.get("max_tokens", DEFAULT_MAX_TOKENS)
    relaxed["max_tokens"] = None if budget is None else 2 * budget
    loose = TextToSQL(lm, question, db, **relaxed)
    for _ in range(fallback):
        second = await _solve(loose, n, rng, rank, ess_threshold, resampling, move)
        if second.answers:
            break
    second.relaxed = True
    second.strict = out
    return second


async def _solve(
    model: TextToSQL,
    n: int,
    rng: Any,
    rank: str,
    ess_threshold: float,
    resampling: str,
    move: Any,
) -> SQLResult:
    """One SMC run of ``model`` and its ranked answers."""
    from llamppl.inference import smc_standard

    result = await smc_standard(
        model, n, ess_threshold, resampling=resampling, seed=rng, move=move, progress=False
    )
    failures = dict(Counter(p.failure for p in result.particles if p.failure is not None))
    found = await found_texts(result)
    answers = rank_answers(model.constraint, found, rank, model.log_potential)
    return SQLResult(answers, result.log_ml, result, failures)


def text_to_sql(
    lm: LanguageModel,
    question: str,
    db: Any,
    n_particles: int = 8,
    seed: Any = None,
    **options: Any,
) -> SQLResult:
    """Answer ``question`` over the database ``db`` with SQL, by SMC (module docstring).

    Parameters
    ----------
    lm : LanguageModel
    question : str
    db : str | os.PathLike | sqlite3.Connection | SQL
        A SQLite file, a connection, or a :func:`~llamppl.constraints.sql` constraint (reuse
        one across questions on the same database: its answers are kept).
    n_particles : int
        SMC particles N (default 8).
    seed : int | numpy.random.Generator | None
        Fixes the run.
    **options
        ``rank`` (``"rows"`` or ``"sql"``), ``fallback`` (runs under the loosest constraint,
        2 by default, when no particle passes: :attr:`SQLResult.relaxed`; 0 or False: none), ``ess_threshold``
        (0.5), ``resampling``,
        ``move`` (a :class:`~llamppl.inference.ResampleMove`), and :class:`TextToSQL`'s
        options (``examples``, ``tables``, ``allow_empty``, ``values``, ``literals``,
        ``cues``, ``max_tokens``, ``temperature``, ...).

    Returns
    -------
    SQLResult
        ``answers`` ranked best first, each with its rows; ``best`` the first.
    """
    return run(text_to_sql_async(lm, question, db, n_particles, seed, **options))
