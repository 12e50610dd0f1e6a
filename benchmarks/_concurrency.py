"""``--concurrency``: the benchmarks that loop over problems run K of them at once.

K problems run on one event loop of this process and share the LM (the library's
:func:`~llamppl.inference.jobs.run_jobs`), so every round's forward serves the particles of
all of them. A problem's record is what it gives alone, up to the float caveat of
``docs/scaling/many_jobs.md``; its ``cpu_seconds`` is the process CPU time it used
(``JobResult.cpu_s``: its own steps, its rows' share of every batched forward, and an even
share of the event loop's own work), so per-problem CPU falls as K grows. ``--concurrency 1`` runs
them one after another, each on a fresh cache, with its own CPU time.

The default is all problems at once, bounded by :data:`MAX_ROWS` particle rows in one
forward (the KV cache and the forward's activations grow with the rows).
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence
from typing import Any

from _args import positive_int

#: default bound on K x particles: the rows of one forward
MAX_ROWS = 256


def add_concurrency_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--concurrency",
        type=positive_int,
        default=None,
        help=f"problems at once in this process (default: all, at most {MAX_ROWS} particle "
        "rows; 1: one after another)",
    )


def concurrency(value: int | None, n_particles: int, n_problems: int) -> int:
    """K: ``value`` if given, else as many problems as fit in :data:`MAX_ROWS` rows."""
    if value is not None:
        return value
    return max(1, min(n_problems, MAX_ROWS // max(1, n_particles)))


def solve_all(
    lm: Any,
    problems: Sequence[tuple[Callable[..., Any], tuple, int]],
    k: int,
    on_record: Callable[[int, dict], None],
) -> None:
    """Run every ``(solve, args, seed)``: ``await solve(lm, *args, seed=seed)`` returns a record.

    ``on_record(i, record)`` gets problem ``i``'s record as it ends (in the order problems
    end), with ``cpu_seconds`` and ``wall_seconds`` (its shares of the process's CPU and
    wall time), ``concurrency`` set; a problem that raised gets ``{"error": traceback}``.
    """
    import time

    from llamppl import run
    from llamppl.inference.jobs import CPUShares, Job, JobResult, run_job, run_jobs

    walls = CPUShares(time.perf_counter)
    wall_share: dict[int, float] = {}

    async def timed(lm: Any, i: int, solve: Callable[..., Any], *args: Any, seed: int) -> Any:
        walls.enter(i)
        try:
            return await solve(lm, *args, seed=seed)
        finally:
            wall_share[i] = walls.leave(i)

    jobs = [Job.call(timed, i, fn, *args, seed=seed) for i, (fn, args, seed) in enumerate(problems)]

    def done(result: JobResult) -> None:
        record = dict(result.output) if isinstance(result.output, dict) else {}
        if result.error is not None:
            record["error"] = result.error
        wall = wall_share.get(result.index, result.time_s)
        record.update(cpu_seconds=result.cpu_s, wall_seconds=wall, concurrency=k)
        on_record(result.index, record)

    if k == 1:
        for i, job in enumerate(jobs):
            done(run_job(job, lm, i, fresh_cache=True))
    else:
        run(run_jobs(jobs, lm, k, on_done=done))
