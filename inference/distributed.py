"""Run many independent inference jobs: :func:`run_many`, in this process or on Ray workers.

A *job* is one inference run: a model factory ``make_model(lm, *args)``, an algorithm
from :mod:`llamppl.inference` with its options, and a seed. Results come back in the
order of ``jobs``; a job that raises or times out is reported in its own
:class:`JobResult` and the others go on.

**In this process** (an LM instance): up to ``concurrency`` jobs run at once on one
event loop, so the particles of every running job share each batched forward of the
one LM (and its cache); a job's result does not depend on the jobs beside it, up to
the float rounding of batched kernels on real models (exactly equal on a ``FunctionLM``)::

    from llamppl import CachedCausalLM
    from llamppl.inference.distributed import jobs_grid, run_many

    lm = CachedCausalLM.default()
    jobs = jobs_grid(make_model, prompts=["The Fed says", "My cat"], seeds=range(8), n_particles=16)
    results = run_many(jobs, lm, concurrency=16)
    [r.log_ml for r in results]

**On Ray workers** (an LM factory): each worker (an actor, one process) loads ONE
language model with ``lm()`` and runs its jobs ``concurrency`` at a time the same way;
jobs go to whichever worker is free::

    import ray
    ray.init(num_cpus=2, include_dashboard=False)   # or ray.init(address="auto") on a cluster
    results = run_many(jobs, CachedCausalLM.default, n_workers=2, concurrency=8)

``make_model`` and the factory are pickled to the workers, so they must be importable
functions (or ``functools.partial`` of them). This module sits with the engines in
:mod:`llamppl.inference` (it calls them by name); nothing else imports it, and
``llamppl.distributed`` is a name for it at the API edge. Ray is optional:
``pip install llamppl[ray]``.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from typing import Any

from llamppl.lm.base import LanguageModel
from llamppl.validation import is_integer, is_real

from .jobs import Job, JobResult, check_jobs, jobs_grid, run_job, run_jobs
from .observers import Progress

__all__ = ["Job", "JobResult", "jobs_grid", "run_job", "run_jobs", "run_many"]

#: Jobs run at once in one process when ``concurrency`` is not given.
DEFAULT_CONCURRENCY = 16


class _Worker:
    """Ray actor body: loads the LM once, then runs jobs."""

    def __init__(self, lm_factory: Callable[[], Any], threads: int | None) -> None:
        if threads is not None:
            import torch

            torch.set_num_threads(threads)
        self.lm = lm_factory()

    def ready(self) -> bool:
        """Returns once the LM is built (actor methods run after ``__init__``)."""
        return True

    def run(self, job: Job, index: int, fresh_cache: bool) -> JobResult:
        return run_job(job, self.lm, index, fresh_cache)

    def run_batch(self, jobs: list[Job], first_index: int, timeout: float | None) -> list:
        """Run ``jobs`` at once in this worker (:func:`~llamppl.inference.jobs.run_jobs`)."""
        from llamppl.runner import run

        return run(run_jobs(jobs, self.lm, len(jobs), timeout=timeout, first_index=first_index))


def _import_ray() -> Any:
    try:
        import ray
    except ImportError as exc:
        raise ImportError(
            "run_many needs Ray: `pip install llamppl[ray]` (or `pip install ray`)"
        ) from exc
    return ray


def run_many(
    jobs: Sequence[Job],
    lm: Any,
    *,
    concurrency: int | None = None,
    n_workers: int | None = None,
    cpus_per_worker: float = 1,
    gpus_per_worker: float = 0,
    threads: int | None = 1,
    fresh_cache: bool = True,
    progress: bool | None = None,
    timeout: float | None = None,
) -> list[JobResult]:
    """Run ``jobs``; results in the order of ``jobs`` (module docstring).

    Parameters
    ----------
    jobs : list[Job]
        The runs (see :func:`jobs_grid` for prompts x seeds).
    lm : LanguageModel | Callable[[], LanguageModel]
        An LM instance: the jobs run in this process, ``concurrency`` at a time, sharing
        its forwards and cache. A factory (e.g. ``CachedCausalLM.default`` or a
        ``functools.partial(VLLMLM.from_pretrained, path)``): the jobs run on Ray workers,
        each building its LM once.
    concurrency : int | None
        Jobs running at once in one process (this one, or each Ray worker). Default: 16 in
        this process; 1 per Ray worker (one job after another, each on a fresh cache).
    n_workers : int | None
        Ray worker processes; default: as many as the cluster's free CPUs (or GPUs when
        ``gpus_per_worker > 0``) allow, at most the number of batches of jobs.
    cpus_per_worker, gpus_per_worker : float
        Ray resources reserved by each worker.
    threads : int | None
        ``torch.set_num_threads`` in each Ray worker (None: leave Ray's default).
    fresh_cache : bool
        On Ray with ``concurrency=1``: clear the worker's LM cache before each job (results
        independent of scheduling). Jobs running at once share the cache.
    progress : bool | None
        tqdm bar over jobs; default on when stderr is a terminal.
    timeout : float | None
        Seconds one job may run (on Ray, counted once its worker has built its LM). A job
        still running then is reported failed (``JobResult.error`` starts with
        ``TimeoutError``) and the others go on; on Ray a worker whose batch overruns is
        killed and replaced. None (default): no limit.

    Notes
    -----
    On Ray, a local cluster is started if none is running (``ray.init()``); call
    ``ray.init(address=...)`` first to use a cluster. A worker that dies is replaced and
    its jobs reported failed.
    """
    jobs = check_jobs(jobs)
    timeout = _check_timeout(timeout)
    here = isinstance(lm, LanguageModel)
    if not here and not callable(lm):
        raise TypeError(
            "lm must be a LanguageModel (jobs run in this process) or a callable that builds "
            f"one (jobs run on Ray workers), got {type(lm).__name__}"
        )
    if concurrency is not None and (not is_integer(concurrency) or concurrency < 1):
        raise ValueError(f"concurrency must be a positive integer or None, got {concurrency!r}")
    if n_workers is not None and (not is_integer(n_workers) or n_workers < 1):
        raise ValueError(f"n_workers must be a positive integer or None, got {n_workers!r}")
    if not jobs:
        return []
    if here:
        return _run_here(jobs, lm, concurrency or DEFAULT_CONCURRENCY, timeout, progress)
    lm_factory = lm
    batch = concurrency or 1
    ray = _import_ray()
    if not ray.is_initialized():
        ray.init(include_dashboard=False)
    if n_workers is None:
        free = ray.available_resources()
        by_cpu = int(free.get("CPU", 1) // cpus_per_worker) if cpus_per_worker else len(jobs)
        by_gpu = int(free.get("GPU", 0) // gpus_per_worker) if gpus_per_worker else len(jobs)
        n_workers = max(1, min(by_cpu, by_gpu))
    n_workers = min(n_workers, -(-len(jobs) // batch))

    actor_cls = ray.remote(num_cpus=cpus_per_worker, num_gpus=gpus_per_worker)(_Worker)
    workers: list[Any] = [None] * n_workers
    results: list[JobResult | None] = [None] * len(jobs)
    in_flight: dict[Any, tuple[range, int]] = {}  # object ref -> (its jobs' indices, worker slot)
    starting: dict[Any, int] = {}  # ref of a new worker's ready() -> slot (with a timeout only)
    deadline: dict[Any, float] = {}  # batch ref -> time.monotonic() it must finish by
    next_job = 0
    bar = Progress(progress, "run_many", unit="job", total=len(jobs))
    # a batch runs its jobs at once: it must end within one job's timeout (plus the slack
    # of jobs sharing the CPU), after which its worker is killed
    batch_timeout = None if timeout is None else timeout * (1 + 0.25 * (batch - 1))

    def start_worker(slot: int) -> None:
        workers[slot] = actor_cls.remote(lm_factory, threads)
        if timeout is not None:  # the jobs' clock starts once the LM is built
            starting[workers[slot].ready.remote()] = slot

    def submit(slot: int) -> None:
        nonlocal next_job
        if next_job < len(jobs):
            span = range(next_job, min(next_job + batch, len(jobs)))
            if batch == 1:
                ref = workers[slot].run.remote(jobs[span[0]], span[0], fresh_cache)
            else:
                ref = workers[slot].run_batch.remote([jobs[i] for i in span], span[0], timeout)
            in_flight[ref] = (span, slot)
            if timeout is not None and slot not in starting.values():
                deadline[ref] = time.monotonic() + batch_timeout
            next_job = span.stop

    def fail(span: range, slot: int, error: str) -> None:
        for index in span:
            results[index] = JobResult(index=index, seed=jobs[index].seed, error=error)
        ray.kill(workers[slot])
        for ref in [r for r, s in starting.items() if s == slot]:
            del starting[ref]
        if next_job < len(jobs):  # a replacement only when jobs are left for it
            start_worker(slot)

    def tick(n: int) -> None:
        for _ in range(n):
            bar.update(failed=sum(r is not None and not r.ok for r in results))

    try:
        for slot in range(n_workers):
            start_worker(slot)
            submit(slot)
        while in_flight:
            wait_s = None
            if deadline:
                wait_s = max(0.0, min(deadline.values()) - time.monotonic())
            done, _ = ray.wait(list(in_flight) + list(starting), num_returns=1, timeout=wait_s)
            for ref in done:
                if ref in starting:  # a new worker is ready (or failed to start: its jobs say so)
                    slot = starting.pop(ref)
                    for job_ref, (_, s) in in_flight.items():
                        if s == slot:
                            deadline[job_ref] = time.monotonic() + batch_timeout
                    continue
                span, slot = in_flight.pop(ref)
                deadline.pop(ref, None)
                try:
                    got = ray.get(ref)
                    for index, result in zip(span, got if batch > 1 else [got]):
                        results[index] = result
                except Exception as exc:  # the worker died (or could not load its LM)
                    fail(span, slot, f"{type(exc).__name__}: {exc}")
                tick(len(span))
                submit(slot)
            now = time.monotonic()
            for ref in [r for r, t in deadline.items() if t <= now]:
                span, slot = in_flight.pop(ref)
                del deadline[ref]
                what = f"job {span[0]}" if len(span) == 1 else f"jobs {span[0]}-{span[-1]}"
                fail(
                    span,
                    slot,
                    f"TimeoutError: {what} did not finish within timeout={timeout:g} s; "
                    "the worker was killed and replaced",
                )
                tick(len(span))
                submit(slot)
    finally:
        bar.close()
        for w in workers:
            ray.kill(w)
    return results  # type: ignore[return-value]


def _run_here(
    jobs: list[Job], lm: Any, concurrency: int, timeout: float | None, progress: bool | None
) -> list[JobResult]:
    """Every job in this process, ``concurrency`` at a time on one event loop (one bar)."""
    from llamppl.runner import run

    bar = Progress(progress, "run_many", unit="job", total=len(jobs))
    failed = 0

    def done(result: JobResult) -> None:
        nonlocal failed
        failed += not result.ok
        bar.update(failed=failed)

    try:
        return run(run_jobs(jobs, lm, concurrency, timeout=timeout, on_done=done))
    finally:
        bar.close()


def _check_timeout(timeout: float | None) -> float | None:
    """``timeout`` as a positive finite float of seconds, or None."""
    if timeout is None:
        return None
    if not is_real(timeout):
        raise TypeError(f"timeout must be a number of seconds or None, got {timeout!r}")
    if not (math.isfinite(timeout) and timeout > 0):
        raise ValueError(
            f"timeout must be a positive finite number of seconds or None, got {timeout!r}"
        )
    return float(timeout)
