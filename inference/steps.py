"""The loop every engine runs in: :func:`run_population`, and the step limit.

An engine (:class:`~llamppl.inference.engine.Engine`) extends the population once
per call of its ``step``, reweights, maybe resamples and reports what it did
(blackjax's ``one_step`` returns ``(state, info)`` the same way). The loop is
shared: :func:`run_population` clones the model N times, runs the engine's
``start``, then calls ``step`` until every particle is done, and hands each
``StepInfo`` to the observers — the history kept on ``SMCResult.history``, the
run record (:mod:`llamppl.inference.record`) and the progress bar::

    particles = await engine.start(particles)
    while not all(p.done_stepping() for p in particles):
        particles, info = await engine.step(particles, t, options.rng)
        for observe in observers:                    # history, run record, progress
            observe(info)

``options.max_steps`` bounds the loop (default 10,000 steps): a ``step`` that never
calls ``finish()`` ends with a :class:`StepLimitError` naming the model class and
the step, carrying the result so far (``error.result``, unfinished particles) so
that nothing computed is lost.
"""

from __future__ import annotations

import math
from typing import Any

from llamppl.modeling import Model
from llamppl.rng import using_rng
from llamppl.weights import logsumexp

from .budget import check_memory
from .engine import Engine
from .lm_counters import LMCounters
from .observers import Failures, History, Progress
from .options import DEFAULT_MAX_STEPS, RunOptions
from .particles import log_weights
from .record import RunRecorder
from .result import SMCResult

__all__ = ["StepLimitError", "DEFAULT_MAX_STEPS", "run_population"]


class StepLimitError(RuntimeError):
    """A run reached ``max_steps`` with particles still stepping; ``.result`` holds the run so far."""

    def __init__(self, message: str, result: Any) -> None:
        super().__init__(message)
        self.result = result


async def run_population(model: Model, n: int, engine: Engine, options: RunOptions) -> SMCResult:
    """Run ``engine`` on N clones of ``model`` until all are done; return the ``SMCResult``.

    Checks before anything runs: the memory the run needs (``engine.population_factor``
    · N particles alive at once, :func:`~llamppl.inference.budget.check_memory`); the
    run record's paths were checked when ``options`` was built. The final
    ``log_ml = log (1/N) Σ_i w_i`` (Eq. of Ẑ in the LLaMPPL paper, §3).
    """
    algorithm = engine.name
    counters = LMCounters(model)
    check_memory(model, n * engine.population_factor, counters.lms, argument=f"n_particles={n}")
    history, failures = History(), Failures()
    observers = [history.observe, failures.observe]
    recorder = None if options.record is None else RunRecorder(algorithm, n, options.record)
    if recorder is not None:
        observers.append(recorder.observe)
    bar = Progress(options.progress, algorithm)
    observers.append(bar.observe)
    t, max_steps = 0, options.max_steps
    try:
        with using_rng(options.rng):
            particles = await engine.start([model.clone() for _ in range(n)])
            while not all(p.done_stepping() for p in particles):
                if max_steps is not None and t >= max_steps:
                    break
                t += 1
                particles, info = await engine.step(particles, t, options.rng)
                for observe in observers:
                    observe(info)
    finally:
        bar.close()
    w = log_weights(particles)
    log_ml = logsumexp(w) - math.log(n)
    stats = counters.finish(steps=t, n_particles=n, **engine.stats())
    run_record = None if recorder is None else recorder.finish(particles, w, log_ml)
    result = SMCResult(
        particles,
        w,
        log_ml,
        history.steps,
        stats,
        algorithm,
        record=run_record,
        failures=dict(sorted(failures.counts.items(), key=lambda kv: -kv[1])),
    )
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
