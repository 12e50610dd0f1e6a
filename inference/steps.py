"""The loop around one engine step: :func:`run_population` and the step limit.

An engine is a function ``one_step(particles, t) -> (particles, StepInfo)`` that
extends the population once, reweights, maybe resamples and reports what it did
(blackjax's ``one_step`` returns ``(state, info)`` the same way). The loop is
shared: :func:`run_population` clones the model N times, runs every ``start``
hook, then calls ``one_step`` until every particle is done, and hands each
``StepInfo`` to the observers — the history kept on ``SMCResult.history``, the
run record (:mod:`llamppl.inference.record`) and the progress bar::

    particles, info = await one_step(particles, t)   # extend → reweight → maybe resample
    for observe in observers:                        # history, run record, progress
        observe(info)

``max_steps`` bounds the loop (default 10,000 steps): a ``step`` that never calls
``finish()`` ends with a :class:`StepLimitError` naming the model class and the
step, carrying the result so far (``error.result``, unfinished particles) so
that nothing computed is lost.
"""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable
from typing import Any

import numpy as np

from llamppl.modeling import Model
from llamppl.rng import using_rng
from llamppl.validation import check_positive_int
from llamppl.weights import logsumexp

from .budget import check_memory
from .particles import LMCounters, Progress, log_weights, start_all
from .record import RecordTarget, RunRecorder
from .result import SMCResult, StepInfo

__all__ = [
    "StepLimitError",
    "OneStep",
    "DEFAULT_MAX_STEPS",
    "check_max_steps",
    "run_population",
]

DEFAULT_MAX_STEPS = 10_000


OneStep = Callable[[list[Model], int], Awaitable[tuple[list[Model], StepInfo]]]


class StepLimitError(RuntimeError):
    """A run reached ``max_steps`` with particles still stepping; ``.result`` holds the run so far."""

    def __init__(self, message: str, result: Any) -> None:
        super().__init__(message)
        self.result = result


def check_max_steps(max_steps: object) -> int | None:
    """``max_steps`` as a positive int, or None for no limit; ``TypeError``/``ValueError`` naming it."""
    return None if max_steps is None else check_positive_int("max_steps", max_steps)


async def run_population(
    algorithm: str,
    model: Model,
    n: int,
    one_step: OneStep,
    *,
    rng: np.random.Generator,
    progress: bool | None,
    record: RecordTarget | None,
    max_steps: int | None,
    population_factor: int = 1,
    extra_stats: Callable[[], dict[str, Any]] | None = None,
    start: Callable[[list[Model]], Awaitable[None]] = start_all,
):
    """Run ``one_step`` on N clones of ``model`` until all are done; return the ``SMCResult``.

    Checks before anything runs: the memory the run needs (``population_factor``
    · N particles alive at once, :func:`~llamppl.inference.budget.check_memory`)
    and the run record's paths (already resolved into ``record``). ``start`` runs
    every particle's ``start`` hook (default :func:`start_all`; ``csmc_standard``
    records or forces the choices made there). The final
    ``log_ml = log (1/N) Σ_i w_i`` (Eq. of Ẑ in the LLaMPPL paper, §3).
    """
    counters = LMCounters(model)
    check_memory(model, n * population_factor, counters.lms, argument=f"n_particles={n}")
    recorder = None if record is None else RunRecorder(algorithm, n, record)
    bar = Progress(progress, algorithm)
    history: list[StepInfo] = []
    observers: list[Callable[[StepInfo], None]] = [lambda info: history.append(info.summary())]
    if recorder is not None:
        observers.append(recorder.observe)
    observers.append(bar.observe)
    t = 0
    try:
        with using_rng(rng):
            particles = [model.clone() for _ in range(n)]
            await start(particles)
            while not all(p.done_stepping() for p in particles):
                if max_steps is not None and t >= max_steps:
                    break
                t += 1
                particles, info = await one_step(particles, t)
                for observe in observers:
                    observe(info)
    finally:
        bar.close()
    w = log_weights(particles)
    log_ml = logsumexp(w) - math.log(n)
    stats = counters.finish(steps=t, n_particles=n, **(extra_stats() if extra_stats else {}))
    run_record = None if recorder is None else recorder.finish(particles, w, log_ml)
    result = SMCResult(particles, w, log_ml, history, stats, algorithm, record=run_record)
    live = sum(not p.done_stepping() for p in particles)
    if live:
        raise StepLimitError(
            f"{algorithm}: {live} of {len(particles)} particles of {type(model).__name__} were "
            f"still stepping after step {t} (max_steps={max_steps}); does "
            f"{type(model).__name__}.step call self.finish() when it is done? Raise max_steps= "
            "for longer programs; error.result holds the run so far (unfinished particles)",
            result,
        )
    return result
