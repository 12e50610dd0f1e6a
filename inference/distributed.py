"""Fan many independent inference jobs out over a Ray cluster: :func:`run_many`.

A *job* is one inference run: a model factory ``make_model(lm, *args)``, an
algorithm from :mod:`llamppl.inference` with its options, and a seed. Each Ray
worker (an actor, one process) loads ONE language model with ``lm_factory()``
and runs the jobs it is given one after another; jobs go to whichever worker
is free. Results come back in the order of ``jobs``; a job that raises is
reported in its own :class:`JobResult` and the others go on::

    import ray
    from llamppl import CachedCausalLM
    from llamppl.inference.distributed import jobs_grid, run_many

    ray.init(num_cpus=2, include_dashboard=False)   # or ray.init(address="auto") on a cluster
    jobs = jobs_grid(make_model, prompts=["The Fed says", "My cat"], seeds=range(8), n_particles=16)
    results = run_many(jobs, CachedCausalLM.default, n_workers=2)
    [r.log_ml for r in results]

``make_model`` and ``lm_factory`` are pickled to the workers, so they must be
importable functions (or ``functools.partial`` of them). This module sits with the
engines in :mod:`llamppl.inference` (it calls them by name); nothing else imports it, and
``llamppl.distributed`` is a name for it at the API edge. Ray is optional:
``pip install llamppl[ray]``.
"""

from __future__ import annotations

import inspect
import math
import os
import time
import traceback
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from llamppl.validation import is_integer, is_real

from .observers import Progress

__all__ = ["Job", "JobResult", "jobs_grid", "run_job", "run_many"]


@dataclass(frozen=True)
class Job:
    """One inference run: ``algorithm(make_model(lm, *args), seed=seed, **options)``.

    ``algorithm`` is a name in :mod:`llamppl.inference` (``"smc_standard"``,
    ``"smc_steer"``, ``"importance_sampling"``, ...) or the function itself.
    """

    make_model: Callable[..., Any]
    args: tuple = ()
    seed: int | None = None
    algorithm: str | Callable[..., Any] = "smc_standard"
    options: dict[str, Any] = field(default_factory=dict)


@dataclass
class JobResult:
    """What one job returned, or why it failed (``error``, a formatted traceback).

    ``particles`` are the particles' display strings (``string_for_serialization()``),
    ``log_weights`` their final log weights, ``log_ml`` the log Ẑ estimate; ``record``
    is the run record when the algorithm produced one (``record=True``), else None.
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


def _resolve_algorithm(algorithm: str | Callable[..., Any]) -> Callable[..., Any]:
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


def _check_jobs(jobs: Sequence[Job]) -> list[Job]:
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
        _resolve_algorithm(job.algorithm)
    return jobs


def run_job(job: Job, lm: Any, index: int = 0, fresh_cache: bool = True) -> JobResult:
    """Run one job on ``lm`` in this process; exceptions become ``JobResult.error``.

    With ``fresh_cache`` the LM's cache is cleared first, so a job's result does
    not depend on which jobs ran before it on the same worker.
    """
    from llamppl.runner import run

    t0 = time.perf_counter()
    out = JobResult(index=index, seed=job.seed, worker=f"pid {os.getpid()}")
    try:
        if fresh_cache and callable(getattr(lm, "clear_cache", None)):
            lm.clear_cache()
        model = job.make_model(lm, *job.args)
        result = run(_resolve_algorithm(job.algorithm)(model, seed=job.seed, **job.options))
        out.particles = [p.string_for_serialization() for p in result.particles]
        out.log_weights = [float(w) for w in result.log_weights]
        out.log_ml = float(result.log_ml)
        out.stats = dict(result.stats)
        out.record = getattr(result, "record", None)
    except Exception:
        out.error = traceback.format_exc()
    out.time_s = time.perf_counter() - t0
    return out


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
    lm_factory: Callable[[], Any],
    *,
    n_workers: int | None = None,
    cpus_per_worker: float = 1,
    gpus_per_worker: float = 0,
    threads: int | None = 1,
    fresh_cache: bool = True,
    progress: bool | None = None,
    timeout: float | None = None,
) -> list[JobResult]:
    """Run ``jobs`` on Ray workers, each holding one LM from ``lm_factory()``; results in order.

    Parameters
    ----------
    jobs : list[Job]
        The runs (see :func:`jobs_grid` for prompts x seeds).
    lm_factory : Callable[[], LanguageModel]
        Builds a worker's LM, once per worker (e.g. ``CachedCausalLM.default`` or a
        ``functools.partial(VLLMLM.from_pretrained, path)``).
    n_workers : int | None
        Worker processes; default: as many as the cluster's free CPUs (or GPUs
        when ``gpus_per_worker > 0``) allow, at most ``len(jobs)``.
    cpus_per_worker, gpus_per_worker : float
        Ray resources reserved by each worker.
    threads : int | None
        ``torch.set_num_threads`` in each worker (None: leave Ray's default).
    fresh_cache : bool
        Clear the worker's LM cache before each job (results independent of scheduling).
    progress : bool | None
        tqdm bar over jobs; default on when stderr is a terminal.
    timeout : float | None
        Seconds one job may run, counted from when its worker has built its LM
        (building the LM is not timed). A job still running then is reported failed
        (``JobResult.error`` starts with ``TimeoutError``), its worker is killed and
        replaced, and the other jobs go on. None (default): no limit.

    A local Ray cluster is started if none is running (``ray.init()``); call
    ``ray.init(address=...)`` first to use a cluster. A job that raises gets
    ``JobResult.error``; a worker that dies is replaced and its job reported failed.
    """
    jobs = _check_jobs(jobs)
    timeout = _check_timeout(timeout)
    if not callable(lm_factory):
        raise TypeError(f"lm_factory must be callable, got {type(lm_factory).__name__}")
    if n_workers is not None and (not is_integer(n_workers) or n_workers < 1):
        raise ValueError(f"n_workers must be a positive integer or None, got {n_workers!r}")
    if not jobs:
        return []
    ray = _import_ray()
    if not ray.is_initialized():
        ray.init(include_dashboard=False)
    if n_workers is None:
        free = ray.available_resources()
        by_cpu = int(free.get("CPU", 1) // cpus_per_worker) if cpus_per_worker else len(jobs)
        by_gpu = int(free.get("GPU", 0) // gpus_per_worker) if gpus_per_worker else len(jobs)
        n_workers = max(1, min(by_cpu, by_gpu))
    n_workers = min(n_workers, len(jobs))

    actor_cls = ray.remote(num_cpus=cpus_per_worker, num_gpus=gpus_per_worker)(_Worker)
    workers: list[Any] = [None] * n_workers
    results: list[JobResult | None] = [None] * len(jobs)
    in_flight: dict[Any, tuple[int, int]] = {}  # object ref -> (job index, worker slot)
    starting: dict[Any, int] = {}  # ref of a new worker's ready() -> slot (with a timeout only)
    deadline: dict[Any, float] = {}  # job ref -> time.monotonic() it must finish by
    next_job = 0
    bar = Progress(progress, "run_many", unit="job", total=len(jobs))

    def start_worker(slot: int) -> None:
        workers[slot] = actor_cls.remote(lm_factory, threads)
        if timeout is not None:  # the job's clock starts once the LM is built
            starting[workers[slot].ready.remote()] = slot

    def submit(slot: int) -> None:
        nonlocal next_job
        if next_job < len(jobs):
            ref = workers[slot].run.remote(jobs[next_job], next_job, fresh_cache)
            in_flight[ref] = (next_job, slot)
            if timeout is not None and slot not in starting.values():
                deadline[ref] = time.monotonic() + timeout
            next_job += 1

    def fail(index: int, slot: int, error: str) -> None:
        results[index] = JobResult(index=index, seed=jobs[index].seed, error=error)
        ray.kill(workers[slot])
        for ref in [r for r, s in starting.items() if s == slot]:
            del starting[ref]
        if next_job < len(jobs):  # a replacement only when jobs are left for it
            start_worker(slot)

    def tick() -> None:
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
                if ref in starting:  # a new worker is ready (or failed to start: its job says so)
                    slot = starting.pop(ref)
                    for job_ref, (_, s) in in_flight.items():
                        if s == slot:
                            deadline[job_ref] = time.monotonic() + timeout
                    continue
                index, slot = in_flight.pop(ref)
                deadline.pop(ref, None)
                try:
                    results[index] = ray.get(ref)
                except Exception as exc:  # the worker died (or could not load its LM)
                    fail(index, slot, f"{type(exc).__name__}: {exc}")
                tick()
                submit(slot)
            now = time.monotonic()
            for ref in [r for r, t in deadline.items() if t <= now]:
                index, slot = in_flight.pop(ref)
                del deadline[ref]
                fail(
                    index,
                    slot,
                    f"TimeoutError: job {index} did not finish within timeout={timeout:g} s; "
                    "its worker was killed and replaced",
                )
                tick()
                submit(slot)
    finally:
        bar.close()
        for w in workers:
            ray.kill(w)
    return results  # type: ignore[return-value]


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
