"""Spider text-to-SQL: SmolLM2-135M answering questions over real databases, with and without SMC.

For ``--per-db K`` questions of each database of ``--data`` (a folder in the format of
``../shared/data/spider``; a seeded choice per database, :func:`spider_eval.choose`), every
method answers from the same chat prompt (:class:`llamppl.models.TextToSQL`'s: ``--shots K``
worked examples, the questions of the *other* databases of ``--examples`` (default: ``--data``
itself) most like the question (:func:`llamppl.models.sql_examples.nearest_examples`), each
with its gold query and the ``CREATE TABLE`` text of the tables it reads; then the linked
tables of the question's own database and the question) and returns one query, ``pred``; the
benchmark runs it itself on a read-only connection and grades it by execution accuracy
(:func:`spider_eval.execution_match`: the gold query's rows, as a multiset, in order when the
gold query has ``ORDER BY``). No example ever comes from the database asked about.
Methods:

- ``plain``: one sample from the LM, unconstrained (the query read out of the text: a
  fenced code block or the text from its first ``SELECT``);
- ``lcd``: locally constrained decoding with the grammar of ``llamppl.constraints.sql(db)``
  (its mask alone, one particle, weights ignored);
- ``lcd-exec``: one particle of the whole constraint of ``smc`` (grammar, clauses that
  compile, a query that runs, a non-empty result, values that occur), weights ignored;
- ``smc-grammar``: ``smc_standard`` with ``--particles N`` over the grammar alone, the most
  probable query of the posterior;
- ``smc-exec``: SMC over ``sql(db)`` with its default options (the grammar and the run
  check: clauses that compile, a query that runs; every table, any literal, no cues, no
  fallback), ranked by each query's posterior mass;
- ``smc`` (recommended): ``llamppl.models.text_to_sql`` as it ships: SMC over
  ``sql(db, allow_empty=False, values=True)`` (a result that is not empty, string literals
  that occur in their column) with literals from the question, the question cues' potential
  (``--cues``) and the fallback run, queries ranked by the posterior mass of their result
  rows (execution consistency);
- ``smc-sqlrank``: ``smc`` ranked by each query's own mass instead;
- ``smc-move``: ``smc`` with resample-move (``ResampleMove(k=2)``).

CPU seconds are each question's share of the process's CPU time (questions run
``--concurrency`` at a time, sharing the LM's forwards; ``benchmarks/_concurrency.py``).
``--profile`` splits the process's time into forwards, grammar masks, the database's checks
and the rest (cProfile, by function). Records go to ``--out`` (one JSON line per question and
method: ``db_id``, ``question``, ``method``, ``pred``, ``runs``, ``correct``, ``cpu_s``, ...);
``--report FILE`` reprints the table from records::

    .venv/bin/python benchmarks/bench_spider.py --data ../shared/data/spider --per-db 1 \\
        --methods plain lcd smc --particles 8 --out /tmp/spider.jsonl
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import sys
import time
from pathlib import Path
from typing import Any

import torch
from _args import nonnegative_int, positive_int
from _concurrency import add_concurrency_argument, concurrency, solve_all
from spider_eval import (
    Question,
    choose,
    database_path,
    example_pools,
    execute,
    execution_match,
    load_questions,
)
from spider_report import profile_split, table

METHODS = ("plain", "lcd", "lcd-exec", "smc-grammar", "smc-exec", "smc", "smc-sqlrank", "smc-move")
DEFAULT_METHODS = ("plain", "lcd", "smc-grammar", "smc-exec", "smc")
MAX_TOKENS = 64
SHOTS = 4
TEMPERATURE = 1.0


def extract_sql(text: str) -> str:
    """The query in a free text: a fenced code block's content, else the text from its first
    ``SELECT`` to its first ``;`` (whitespace trimmed)."""
    if "```" in text:
        inner = text.split("```")[1]
        text = inner[3:] if inner.lower().startswith("sql") else inner
    start = text.upper().find("SELECT")
    if start < 0:
        return text.strip()
    body = text[start:]
    end = body.find(";")
    return (body if end < 0 else body[:end]).strip()


async def _particle_run(model: Any, n: int, seed: int, move: int = 0) -> Any:
    from llamppl.inference import ResampleMove, smc_standard

    rejuvenate = {"move": ResampleMove(k=move)} if move else {}
    return await smc_standard(model, n, 0.5, seed=seed, progress=False, **rejuvenate)


_POOLS: dict[Path, dict[str, list]] = {}


def shots(q: Question, data: Path, examples: Path | None, k: int) -> list:
    """The ``k`` worked examples for ``q``: the questions of the other databases of
    ``examples`` (default ``data``) most like it (:func:`llamppl.models.sql_examples.nearest_examples`)."""
    from llamppl.decoding.sql.database import open_database
    from llamppl.models.sql_examples import nearest_examples

    if k == 0:
        return []
    folder = Path(examples or data)
    if folder not in _POOLS:
        _POOLS[folder] = example_pools(folder)
    pool = [e for db, exs in _POOLS[folder].items() if db != q.db_id for e in exs]
    schema = open_database(database_path(data, q.db_id)).schema
    return nearest_examples(q.question, pool, k, schema=schema)


async def answer(
    lm: Any,
    method: str,
    q: Question,
    data: Path,
    n: int,
    *,
    seed: int,
    examples: Path | None = None,
    k: int = 0,
    temperature: float = 1.0,
    max_tokens: int = MAX_TOKENS,
    cues: float | None = None,
    ess: float | None = None,
) -> dict:
    """One method's answer to one question: the record without its grade."""
    from llamppl.constraints import sql
    from llamppl.models import HardConstraint, TextToSQL, text_to_sql_async
    from llamppl.models.sql_answers import found_texts, rank_answers

    path = database_path(data, q.db_id)
    extra: dict[str, Any] = {}
    chosen = shots(q, data, examples, k)
    # the nearest examples of the other databases; the built-in ones when there are none
    prompt_options: dict[str, Any] = {"examples": chosen} if chosen else {}
    if method in ("smc", "smc-sqlrank", "smc-move", "smc-exec"):
        options: dict[str, Any] = {
            "max_tokens": max_tokens,
            "temperature": temperature,
            **prompt_options,
        }
        if cues is not None:
            options["cues"] = cues
        if ess is not None:
            options["ess_threshold"] = ess
        if method == "smc-exec":  # the grammar and the run check alone
            options["db"] = sql(path)
            options.update(rank="sql", tables=None, literals=None, cues=0.0, fallback=False)
        else:
            options["db"] = path
            options["rank"] = "sql" if method == "smc-sqlrank" else "rows"
        if method == "smc-move":
            from llamppl.inference import ResampleMove

            options["move"] = ResampleMove(k=2)
        db = options.pop("db")
        out = await text_to_sql_async(lm, q.question, db, n, seed, **options)
        pred = out.best.sql if out.best else ""
        result = out.result
        extra["relaxed"] = out.relaxed
        extra["answers"] = [
            {
                "sql": a.sql,
                "log_prob": round(a.log_prob, 3),
                "mass": round(a.mass, 4),
                "rows_mass": round(a.rows_mass, 4),
                "weight": round(a.weight, 4),
            }
            for a in out.answers[:5]
        ]
        extra["sql_runs"] = result.particles[0].constraint.check.runs if result.particles else 0
        particles = n
    else:
        c = sql(path)
        probe = TextToSQL(lm, q.question, c, max_tokens=max_tokens, **prompt_options)
        prompt = probe.context.tokens
        if method == "plain":
            model = HardConstraint(
                lm, prompt, lambda t: True, "sample", max_tokens, truncated="keep"
            )
        elif method == "lcd":
            model = HardConstraint(lm, prompt, c.grammar, max_tokens=max_tokens)
        elif method == "lcd-exec":
            model = TextToSQL(lm, q.question, path, max_tokens=max_tokens, **prompt_options)
        else:  # smc-grammar
            model = HardConstraint(lm, prompt, c.grammar, max_tokens=max_tokens)
        particles = n if method == "smc-grammar" else 1
        result = await _particle_run(model, particles, seed)
        if method == "plain":
            p = result.particles[0]
            pred = extract_sql(p.text)
            extra["text"] = p.text
        elif method == "smc-grammar":
            ranked = rank_answers(c, await found_texts(result), "sql")
            pred = ranked[0].sql if ranked else ""
        else:
            p = result.particles[0]
            pred = p.text if p.failure is None and p.finished else ""
    failures: dict[str, int] = {}
    for p in result.particles:
        if p.failure is not None:
            cause = p.failure.split(":")[0]
            failures[cause] = failures.get(cause, 0) + 1
    return {
        "db_id": q.db_id,
        "question": q.question,
        "gold": q.query,
        "method": method,
        "pred": pred,
        "n_particles": particles,
        "seed": seed,
        "log_ml": result.log_ml if result.log_ml > -math.inf else None,
        "tokens": sum(len(p.context.generated) for p in result.particles),
        "failures": failures,
        "shots": [e.question for e in chosen],
        **extra,
    }


def grade(record: dict, data: Path) -> dict:
    """The record with ``runs`` and ``correct`` (the benchmark runs both queries itself)."""
    path = database_path(data, record["db_id"])
    gold, gold_error = execute(path, record["gold"])
    if gold is None:
        raise RuntimeError(f"the gold query does not run ({gold_error}): {record['gold']}")
    rows, error = execute(path, record["pred"])
    record["runs"] = rows is not None
    record["error"] = error
    record["correct"] = execution_match(rows, gold, record["gold"])
    return record


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument(
        "--data",
        type=Path,
        default=Path(__file__).resolve().parents[2] / "shared" / "data" / "spider",
    )
    ap.add_argument(
        "--per-db", type=positive_int, default=None, help="questions per database (default: all)"
    )
    ap.add_argument("--seed", type=nonnegative_int, default=0)
    ap.add_argument("--methods", nargs="+", choices=METHODS, default=list(DEFAULT_METHODS))
    ap.add_argument("--particles", type=positive_int, default=8)
    ap.add_argument(
        "--shots",
        type=nonnegative_int,
        default=SHOTS,
        help="worked examples per question from other databases (0: the built-in examples)",
    )
    ap.add_argument(
        "--max-tokens", type=positive_int, default=MAX_TOKENS, help="tokens of a query at most"
    )
    ap.add_argument(
        "--cues",
        type=float,
        default=None,
        help="text_to_sql's cue weight λ (default: the program's); 0 turns the cues off",
    )
    ap.add_argument(
        "--ess",
        type=float,
        default=None,
        help="text_to_sql's ess_threshold (default: the program's); 0: never resample",
    )
    ap.add_argument(
        "--temperature",
        type=float,
        default=TEMPERATURE,
        help="the smc methods' LM temperature (text_to_sql's temperature)",
    )
    ap.add_argument(
        "--examples",
        type=Path,
        default=None,
        help="a Spider-format folder whose other databases' questions are the examples "
        "(default: --data itself)",
    )
    ap.add_argument("--dbs", nargs="+", default=None, help="only these databases")
    ap.add_argument("--threads", type=positive_int, default=1)
    ap.add_argument(
        "--out", type=Path, default=None, help="JSONL records, one per question and method"
    )
    ap.add_argument("--append", action="store_true", help="add to --out instead of replacing it")
    ap.add_argument(
        "--report", type=Path, default=None, help="print the table of a record file and stop"
    )
    ap.add_argument(
        "--profile", action="store_true", help="split the time into forwards, masks, checks"
    )
    add_concurrency_argument(ap)
    args = ap.parse_args(argv)

    if args.report is not None:
        records = [
            json.loads(line) for line in args.report.read_text().splitlines() if line.strip()
        ]
        print(table(records))
        return 0
    torch.set_num_threads(args.threads)
    print(f"torch threads: {torch.get_num_threads()}", flush=True)
    questions = load_questions(args.data)
    if args.dbs:
        questions = [q for q in questions if q.db_id in set(args.dbs)]
    chosen = choose(questions, args.per_db, args.seed)
    print(f"{len(chosen)} questions over {len({q.db_id for q in chosen})} databases", flush=True)

    from llamppl import CachedCausalLM

    lm = CachedCausalLM.default()
    out = None
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        out = args.out.open("a" if args.append else "w")
    records: list[dict] = []
    profiler = None
    if args.profile:
        import cProfile

        profiler = cProfile.Profile()
    for method in args.methods:
        problems = [
            (
                functools.partial(
                    answer,
                    examples=args.examples,
                    k=args.shots,
                    temperature=args.temperature,
                    max_tokens=args.max_tokens,
                    cues=args.cues,
                    ess=args.ess,
                ),
                (method, q, args.data, args.particles),
                args.seed,
            )
            for q in chosen
        ]
        n = args.particles if method.startswith("smc") else 1
        k = concurrency(args.concurrency, n, len(problems))
        start = time.process_time()

        def done(i: int, record: dict, method: str = method, n: int = n) -> None:
            if "error" in record and "pred" not in record:  # the method raised
                q = chosen[i]
                record = {
                    "db_id": q.db_id,
                    "question": q.question,
                    "gold": q.query,
                    "method": method,
                    "pred": "",
                    "n_particles": n,
                    "error_trace": record["error"],
                    "runs": False,
                    "correct": False,
                }
                print(record["error_trace"], file=sys.stderr)
            else:
                record = grade(record, args.data)
            record["cpu_s"] = record.pop("cpu_seconds", None)
            record["wall_s"] = record.pop("wall_seconds", None)
            records.append(record)
            mark = "OK" if record["correct"] else ("ru" if record["runs"] else "--")
            print(
                f"{mark} {method} {record['db_id']} | {record['question']} | {record['pred']!r}",
                flush=True,
            )
            if out is not None:
                out.write(json.dumps(record, default=str) + "\n")
                out.flush()

        if profiler is not None:
            profiler.enable()
        solve_all(lm, problems, k, done)
        if profiler is not None:
            profiler.disable()
        print(
            f"{method}: {time.process_time() - start:.1f} CPU s for {len(problems)} questions (concurrency {k})",
            flush=True,
        )
    if out is not None:
        out.close()
    print(table(records))
    if profiler is not None:
        split = profile_split(profiler)
        total = sum(split.values())
        print(
            "time (cProfile tottime): "
            + ", ".join(f"{k} {v:.1f} s ({100 * v / total:.0f} %)" for k, v in split.items())
        )
    for m in args.methods:
        rs = [r for r in records if r["method"] == m]
        if rs:
            print(
                f"spider {m}: runs {sum(r['runs'] for r in rs)}/{len(rs)}, correct {sum(r['correct'] for r in rs)}/{len(rs)}"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
