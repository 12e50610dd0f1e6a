"""``importance_sampling``: N independent particles, no resampling.

Each particle runs to completion with its proposals; its weight is the product
of all potentials G_t met, and ``log_ml = log (1/N) Σ_i w_i`` is unbiased for Z.
Particles are still stepped together, so each step's LM requests form one batch::

    result = await importance_sampling(model, n_particles=100, seed=0)
"""

from __future__ import annotations

import os

import numpy as np

from llamppl.modeling import Model
from llamppl.rng import make_rng, using_rng
from llamppl.validation import check_positive_int
from llamppl.weights import ess, logmeanexp

from .particles import LMCounters, Progress, begin_all, check_model, log_weights, step_all
from .record import recorder_for
from .result import SMCResult, StepRecord

__all__ = ["importance_sampling"]


async def importance_sampling(
    model: Model,
    n_particles: int,
    seed: int | np.random.Generator | None = None,
    progress: bool | None = None,
    record: bool | str | os.PathLike = False,
) -> SMCResult:
    """Sequential importance sampling of ``model`` with ``n_particles`` independent particles.

    ``record=True`` keeps a run record on ``SMCResult.record`` (``record=path`` also writes
    it; format in :mod:`llamppl.inference.record`).
    """
    check_model(model)
    n = check_positive_int("n_particles", n_particles)
    rng = make_rng(seed)
    counters = LMCounters(model)
    recorder = recorder_for("importance_sampling", n, record=record)
    bar = Progress(progress, "importance_sampling")
    history: list[StepRecord] = []
    try:
        with using_rng(rng):
            particles = [model.clone() for _ in range(n)]
            await begin_all(particles)
            while not all(p.done_stepping() for p in particles):
                await step_all(particles)
                w = log_weights(particles)
                live = sum(not p.done_stepping() for p in particles)
                history.append(
                    StepRecord(len(history) + 1, ess(w), False, None, logmeanexp(w), live)
                )
                if recorder is not None:
                    recorder.step(len(history), particles, w, ess(w), logmeanexp(w), None)
                bar.update(live=live)
    finally:
        bar.close()
    w = log_weights(particles)
    stats = counters.finish(steps=len(history), n_particles=n)
    rec = None if recorder is None else recorder.finish(particles, w, logmeanexp(w))
    return SMCResult(particles, w, logmeanexp(w), history, stats, "importance_sampling", record=rec)
