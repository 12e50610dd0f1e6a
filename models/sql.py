"""``text_to_sql``: a question over a database, answered with SQL that runs on it, by SMC.

The program :class:`TextToSQL` is :class:`~llamppl.models.HardConstraint` with

- the prompt of :mod:`~llamppl.models.sql_prompt` (the LM's chat template: an instruction,
  worked examples (built-in ones over a database of our own, or the user's, for instance
  :func:`~llamppl.models.sql_examples.nearest_examples` from other databases), the linked
  tables (:mod:`~llamppl.models.sql_linking`) as ``CREATE TABLE`` text read from the
  database, the question),
- the constraint :func:`~llamppl.constraints.sql` of the database: SQLite's query grammar
  over its own tables and columns (a cheap mask), and the database's checks, lazily, on the
  tokens drawn: a query's first clauses must compile as soon as a clause keyword follows
  them, the finished query must run (read-only, time-bounded), and by default its result must
  not be empty, its literals must come from the question and every string literal compared
  to a column must occur in it, and
- the question cues' potential φ (:mod:`~llamppl.models.sql_cues`: ``how many`` asks for a
  ``count(``, an unasked ``max(`` is penalised, ...; ``cues=0`` turns it off).

Let p be the LM after the prompt x. The target is the LM's query conditioned on passing,
weighed by the cues::

    P(y) ∝ p(y EOS | x) · 1_sql(y) · φ(y),    Z = Σ_y p(y EOS | x) 1_sql(y) φ(y)

within ``max_tokens`` tokens, sampled by ``smc_standard`` (the lazy masked proposal of
``HardConstraint`` and its unbiased weights; resampling at ESS < N/2). The answers are the
posterior's distinct queries, run once each and ranked by the posterior mass of their result
(:mod:`~llamppl.models.sql_answers`). When no particle passes, a fallback runs the same
program under the loosest constraint (``SQLResult.relaxed``)::

    from llamppl import CachedCausalLM
    from llamppl.models import text_to_sql
    lm = CachedCausalLM.default()
    out = text_to_sql(lm, "How many singers are there?", "concert_singer.sqlite", seed=0)
    out.best.sql, out.best.rows        # 'SELECT count(*) FROM singer', ((6,),)
"""

from __future__ import annotations

import functools
import html
import math
import os
import sqlite3
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from llamppl.decoding.constraints.twists import twist_level
from llamppl.decoding.sql.constraint import SQL, sql
from llamppl.lm.base import LanguageModel
from llamppl.rng import make_rng
from llamppl.runner import run
from llamppl.validation import check_positive_int, check_real_range

from .hard_constraints import HardConstraint
from .sql_answers import RANKS, SQLAnswer, found_texts, rank_answers
from .sql_cues import asked, cue_penalty, features
from .sql_linking import link_tables
from .sql_prompt import EXAMPLES, SYSTEM_MESSAGE, SQLExample, sql_messages

__all__ = ["RANKS", "SQLAnswer", "SQLResult", "TextToSQL", "text_to_sql", "text_to_sql_async"]

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
    temperature : float
        The LM's temperature (> 0; the target is then the tempered LM's conditional).
    cues : float
        The weight λ of the question cues (:mod:`~llamppl.models.sql_cues`; default 2, 0: off).
    literals : str | None
        ``"question"`` (the default): the query's literals come from the question; a text: from
        it; None: any literal.
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
        cues = check_real_range("cues", cues, 0.0, math.inf)
        temperature = check_real_range("temperature", temperature, 0.0, math.inf, lo_open=True)
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
        self.asked = asked(question)  # the features the question asks for (read once)

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
    level = -model.cues * len(model.asked - features(model.text))
    if own is not None:
        level += await twist_level(own, model)
    return level


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

    def _head(self) -> str:
        loose = ", relaxed (fallback)" if self.relaxed else ""
        return f"SQLResult({len(self.answers)} queries, log_ml={self.log_ml:.4f}{loose})"

    def _nothing(self) -> str:
        causes = ", ".join(f"{k} ×{v}" for k, v in self.failures.items()) or "none recorded"
        return f"no query passed; particles failed: {causes}"

    def __repr__(self) -> str:
        lines = [self._head()]
        lines += [
            f"  {a.rows_mass:6.3f} {a.mass:6.3f}  {a.sql}  -> {_preview(a.rows)}"
            for a in self.answers[:10]
        ]
        if not self.answers:
            lines.append("  " + self._nothing())
        return "\n".join(lines)

    def _repr_html_(self) -> str:
        rows = "".join(
            f"<tr><td>{a.rows_mass:.3f}</td><td>{a.mass:.3f}</td>"
            f"<td style='text-align:left'><code>{html.escape(a.sql)}</code></td>"
            f"<td style='text-align:left'>{html.escape(_preview(a.rows))}</td></tr>"
            for a in self.answers[:20]
        )
        if not self.answers:
            rows = f"<tr><td colspan=4>{html.escape(self._nothing())}</td></tr>"
        return (
            f"<b>{html.escape(self._head())}</b><table><tr><th>result mass</th>"
            f"<th>query mass</th><th>SQL</th><th>rows</th></tr>{rows}</table>"
        )


def _preview(rows: tuple[tuple, ...], k: int = 3) -> str:
    """The first ``k`` rows of a result, and how many there are."""
    shown = ", ".join(repr(r) for r in rows[:k])
    more = f", … ({len(rows)} rows)" if len(rows) > k else ""
    return f"[{shown}{more}]"


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
