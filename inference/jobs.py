"""Inference jobs and how they run in this process: :class:`Job`, :class:`JobResult`,
:func:`jobs_grid`, :func:`run_job` (one job) and :func:`run_jobs` (many at once on one event
loop, their particles sharing the LM's batched forwards).

:func:`~llamppl.inference.distributed.run_many` is the entry point users call; it runs jobs
here or on Ray workers, which run them with :func:`run_jobs` too::

    jobs = jobs_grid(make_model, prompts=["The Fed says", "My cat"], seeds=range(4))
    results = run(run_jobs(jobs, lm, concurrency=8))
"""

from __future__ import annotations

import asyncio
import contextvars
import dataclasses
import inspect
import os
import time
import traceback
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from llamppl import cpu_accounts
from llamppl.cpu_accounts import Account

__all__ = [
    "CPUShares",
    "Job",
    "JobResult",
    "check_jobs",
    "jobs_grid",
    "resolve_algorithm",
    "run_job",
    "run_jobs",
]


@dataclass(frozen=True)
class Job:
    """One inference run: ``algorithm(make_model(lm, *args), seed=seed, **options)``.

    ``algorithm`` is a name in :mod:`llamppl.inference` (``"smc_standard"``,
    ``"smc_steer"``, ``"importance_sampling"``, ...) or the function itself.

    A library program that is a function of the LM rather than a :class:`~llamppl.Model`
    (``power_smc``, ``speculative_smc``, ``generate_json_async``, ``mh_power_sampling``)
    is a job through :meth:`call`: ``await fn(lm, *args, seed=seed, **options)``.
    """

    make_model: Callable[..., Any]
    args: tuple = ()
    seed: int | None = None
    algorithm: str | Callable[..., Any] = "smc_standard"
    options: dict[str, Any] = field(default_factory=dict)
    driver: bool = False

    @classmethod
    def call(
        cls, fn: Callable[..., Any], *args: Any, seed: int | None = None, **options: Any
    ) -> Job:
        """The job ``await fn(lm, *args, seed=seed, **options)``: a program run by a function.

        ``fn`` is an ``async`` function whose first argument is the LM and which takes the
        run option ``seed``, e.g. ``Job.call(power_smc, "The Fed says", alpha=4.0,
        n_particles=16, seed=0)``. Its return value goes to :attr:`JobResult.output`
        (without the run and particle objects it holds, which refer to the LM); its
        ``.result`` (an :class:`~llamppl.inference.SMCResult`) fills the particles,
        weights and log Ẑ. Work counters a driver reads off the LM (SMC-SD's
        ``target_forwards``) count the forwards of the jobs running beside it too.
        """
        return cls(fn, tuple(args), seed, "call", dict(options), driver=True)


@dataclass
class JobResult:
    """What one job returned, or why it failed (``error``, a formatted traceback).

    ``particles`` are the particles' display strings (``string_for_serialization()``),
    ``log_weights`` their final log weights, ``log_ml`` the log Ẑ estimate; ``record``
    is the run record when the algorithm produced one (``record=True``), else None.
    ``output`` is what a :meth:`Job.call` job's function returned (its ``result`` and
    ``particle`` fields emptied, so it pickles without the LM), else None. ``time_s`` is
    the job's wall time; ``cpu_s`` the process CPU time it used. Alone (:func:`run_job`)
    that is all the CPU of its run. Beside other jobs (:func:`run_jobs`) it is measured
    (:mod:`llamppl.cpu_accounts`): the CPU of every step of its own tasks, plus its rows'
    share of every batched call (a forward of R rows charges each row 1/R of its CPU), plus
    an even share of the event loop's own work between steps among the jobs running then
    (:class:`CPUShares`). A job with more particles, longer texts or costlier checks gets a
    larger share, and the shares of all jobs add up to the CPU used while any ran.
    """

    index: int
    seed: int | None
    particles: list[str] = field(default_factory=list)
    log_weights: list[float] = field(default_factory=list)
    log_ml: float = float("nan")
    stats: dict[str, Any] = field(default_factory=dict)
    record: Any = None
    error: str | None = None
    worker: str = ""
    time_s: float = 0.0
    output: Any = None
    cpu_s: float = 0.0

    @property
    def ok(self) -> bool:
        """True when the job finished without raising."""
        return self.error is None

    @property
    def posterior(self) -> dict[str, float]:
        """Normalised weight of each distinct particle string, largest first."""
        import numpy as np

        from llamppl.weights import normalize

        acc: dict[str, float] = {}
        if not self.log_weights:
            return acc
        for p, w in zip(self.particles, normalize(np.asarray(self.log_weights))):
            if w > 0:
                acc[p] = acc.get(p, 0.0) + float(w)
        return dict(sorted(acc.items(), key=lambda kv: -kv[1]))


def jobs_grid(
    make_model: Callable[..., Any],
    prompts: Iterable[Any],
    seeds: Iterable[int],
    algorithm: str | Callable[..., Any] = "smc_standard",
    **options: Any,
) -> list[Job]:
    """Jobs for every ``(prompt, seed)`` pair, prompt-major: ``make_model(lm, prompt)``."""
    seeds = list(seeds)
    return [
        Job(make_model, (prompt,), seed, algorithm, dict(options))
        for prompt in prompts
        for seed in seeds
    ]


def resolve_algorithm(algorithm: str | Callable[..., Any]) -> Callable[..., Any]:
    from llamppl import inference

    if callable(algorithm):
        return algorithm
    fn = getattr(inference, str(algorithm), None)
    if not isinstance(algorithm, str) or not inspect.iscoroutinefunction(fn):
        names = sorted(
            n for n in inference.__all__ if inspect.iscoroutinefunction(getattr(inference, n))
        )
        raise ValueError(f"algorithm must be one of {names} or a function, got {algorithm!r}")
    return fn


def check_jobs(jobs: Sequence[Job]) -> list[Job]:
    if isinstance(jobs, (str, bytes)) or not isinstance(jobs, Iterable):
        raise TypeError(f"jobs must be a list of Job, got {type(jobs).__name__}")
    jobs = list(jobs)
    for i, job in enumerate(jobs):
        if not isinstance(job, Job):
            raise TypeError(
                f"jobs[{i}] must be a llamppl.distributed.Job, got {type(job).__name__}"
            )
        if not callable(job.make_model):
            raise TypeError(f"jobs[{i}].make_model must be callable")
        if not job.driver:
            resolve_algorithm(job.algorithm)
    return jobs


def start(job: Job, lm: Any) -> Any:
    """The coroutine that runs ``job`` on ``lm`` (a program's algorithm, or a driver call)."""
    if job.driver:
        coro = job.make_model(lm, *job.args, seed=job.seed, **job.options)
        if not inspect.isawaitable(coro):
            raise TypeError(
                f"Job.call needs an async function (power_smc, generate_json_async, ...); "
                f"{job.make_model!r} returned {type(coro).__name__}"
            )
        return coro
    model = job.make_model(lm, *job.args)
    return resolve_algorithm(job.algorithm)(model, seed=job.seed, **job.options)


def run_job(job: Job, lm: Any, index: int = 0, fresh_cache: bool = True) -> JobResult:
    """Run one job on ``lm`` in this process; exceptions become ``JobResult.error``.

    With ``fresh_cache`` the LM's cache is cleared first, so a job's result does
    not depend on which jobs ran before it on the same worker.
    """
    from llamppl.runner import run

    t0, cpu0 = time.perf_counter(), time.process_time()
    out = JobResult(index=index, seed=job.seed, worker=f"pid {os.getpid()}")
    try:
        if fresh_cache and callable(getattr(lm, "clear_cache", None)):
            lm.clear_cache()
        _fill(out, run(start(job, lm)))
    except Exception:
        out.error = traceback.format_exc()
    out.time_s = time.perf_counter() - t0
    out.cpu_s = time.process_time() - cpu0
    return out


def _fill(out: JobResult, result: Any) -> None:
    """Copy what a job keeps of its ``SMCResult`` (or a driver's result) into ``out``."""
    if not hasattr(result, "particles"):  # a driver's own result type
        out.output = _detached(result)
        result = getattr(result, "result", None)
        if result is None or not hasattr(result, "particles"):
            return
    out.particles = [p.string_for_serialization() for p in result.particles]
    out.log_weights = [float(w) for w in result.log_weights]
    out.log_ml = float(result.log_ml)
    out.stats = dict(result.stats)
    out.record = getattr(result, "record", None)


class CPUShares:
    """Each running job's even share of a clock: by default this process's CPU time.

    Between two consecutive starts or ends of jobs, the time the clock advanced is split
    evenly among the jobs running in that interval; a job's share is the sum over the
    intervals it ran in. The shares of all jobs add up to the clock's advance while any ran.
    ``clock`` may be another clock (``time.perf_counter``: shares of the wall time;
    :func:`run_jobs` passes the CPU time that no job's account measured).
    """

    def __init__(self, clock: Callable[[], float] | None = None) -> None:
        self.clock = clock or time.process_time
        self.last = self.clock()
        self.running: dict[int, float] = {}

    def _accrue(self) -> None:
        now = self.clock()
        if self.running:
            share = (now - self.last) / len(self.running)
            for key in self.running:
                self.running[key] += share
        self.last = now

    def enter(self, key: int) -> None:
        """Job ``key`` starts."""
        self._accrue()
        self.running[key] = 0.0

    def leave(self, key: int) -> float:
        """Job ``key`` ends: its share of the CPU seconds."""
        self._accrue()
        return self.running.pop(key)


def _detached(value: Any) -> Any:
    """A driver's result without the fields that hold the run's particles (and so the LM)."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        names = {f.name for f in dataclasses.fields(value)}
        return dataclasses.replace(value, **{n: None for n in ("result", "particle") if n in names})
    return value


async def run_jobs(
    jobs: Sequence[Job],
    lm: Any,
    concurrency: int,
    *,
    timeout: float | None = None,
    first_index: int = 0,
    on_done: Callable[[JobResult], None] | None = None,
) -> list[JobResult]:
    """Run ``jobs`` on ``lm`` in this event loop, ``concurrency`` at a time; results in order.

    The running jobs' particles await the same LM, so its coalescer serves their requests
    in one batched forward per round. Each job keeps its own random stream (its ``seed``),
    so its particles, weights and log Ẑ are those it has alone, on an exact LM such as
    ``FunctionLM``; on a real model a batched kernel may round differently. A job that
    raises, or runs past ``timeout`` seconds, gets ``JobResult.error`` and the others go on
    (a check stuck in C code cannot be interrupted: bound checks with ``check_timeout``).
    ``on_done(result)`` is called as each job ends (a progress bar); result indices start
    at ``first_index``.
    """
    gate = asyncio.Semaphore(concurrency)
    worker = f"pid {os.getpid()}"
    # each job's CPU: its account (its steps, its rows of batched calls), plus an even share
    # of what no account measured (the loop's own work), see JobResult
    accounts = [Account() for _ in jobs]
    shares = CPUShares(lambda: time.process_time() - cpu_accounts.measured())

    async def one(i: int, job: Job) -> JobResult:
        async with gate:
            out = JobResult(index=first_index + i, seed=job.seed, worker=worker)
            t0 = time.perf_counter()
            shares.enter(i)
            try:
                _fill(out, await asyncio.wait_for(start(job, lm), timeout))
            except asyncio.TimeoutError:
                out.error = (
                    f"TimeoutError: job {first_index + i} did not finish within "
                    f"timeout={timeout:g} s"
                )
            except Exception:
                out.error = traceback.format_exc()
            out.time_s = time.perf_counter() - t0
            out.cpu_s = accounts[i].seconds + shares.leave(i)
            if on_done is not None:
                on_done(out)
            return out

    def in_account(i: int, job: Job) -> asyncio.Future:
        """Job i's task, created in a context that charges its account (so are its children)."""
        context = contextvars.copy_context()
        context.run(cpu_accounts.ACCOUNT.set, accounts[i])
        return context.run(asyncio.ensure_future, one(i, job))

    with cpu_accounts.timed_tasks():
        tasks = [in_account(i, job) for i, job in enumerate(jobs)]
        return list(await asyncio.gather(*tasks))
