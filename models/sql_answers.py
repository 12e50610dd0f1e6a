"""The answers of :func:`~llamppl.models.text_to_sql`: distinct queries, run once, ranked by posterior mass.

After the run, :func:`found_texts` reads the final particles' passing texts again from the
LM's cache (each distinct token sequence once, with its exact log p(y | x) at temperature 1),
and :func:`rank_answers` merges the texts that are the same SQL (keywords' case and spacing
ignored, :func:`~llamppl.decoding.sql.lexer.canonical_sql`), runs each distinct query once,
and ranks them: ``rank="rows"`` by the posterior mass of their *result* (queries that return
the same rows pool their mass: execution consistency), then their own; ``rank="sql"`` by
their own. The masses are exact ratios of the target's probabilities p(y | x) φ(y) over the
queries found (φ the program's potential), not estimates::

    answers = rank_answers(model.constraint, await found_texts(result), "rows", model.log_potential)
"""

from __future__ import annotations

import asyncio
import math
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from llamppl.decoding.sql.constraint import SQL
from llamppl.decoding.sql.lexer import canonical_sql, has_order_by

__all__ = ["RANKS", "Found", "SQLAnswer", "found_texts", "rank_answers"]

RANKS = ("rows", "sql")


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
