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
from llamppl.rng import make_rng
from llamppl.validation import check_positive_int
from llamppl.weights import ess, logmeanexp

from .particles import check_model, log_weights, step_all
from .record import record_target
from .result import SMCResult, StepInfo
from .steps import DEFAULT_MAX_STEPS, check_max_steps, run_population

__all__ = ["importance_sampling", "importance_step"]


async def importance_step(particles: list[Model], t: int) -> tuple[list[Model], StepInfo]:
    """One step of importance sampling: extend and reweight, never resample."""
    await step_all(particles)  # extend: M_t for every live particle (one LM batch)
    w = log_weights(particles)  # reweight: G_t already folded in by the primitives
    n_live = sum(not p.done_stepping() for p in particles)
    return particles, StepInfo(t, ess(w), False, None, logmeanexp(w), n_live, w, tuple(particles))


async def importance_sampling(
    model: Model,
    n_particles: int,
    seed: int | np.random.Generator | None = None,
    progress: bool | None = None,
    record: bool | str | os.PathLike = False,
    max_steps: int | None = DEFAULT_MAX_STEPS,
) -> SMCResult:
    """Sequential importance sampling of ``model`` with ``n_particles`` independent particles.

    ``record=True`` keeps a run record on ``SMCResult.record`` (``record=path`` also writes
    it, checked before the run; format in :mod:`llamppl.inference.record`). ``max_steps``
    (default 10,000, None for none) bounds the run: particles still stepping after it raise
    :class:`~llamppl.inference.steps.StepLimitError` (naming the model and the step;
    ``.result`` holds the run so far). A run that would not fit in the available memory is
    refused before it starts.
    """
    check_model(model)
    n = check_positive_int("n_particles", n_particles)
    limit = check_max_steps(max_steps)
    target = record_target(record=record)
    rng = make_rng(seed)
    return await run_population(
        "importance_sampling",
        model,
        n,
        importance_step,
        rng=rng,
        progress=progress,
        record=target,
        max_steps=limit,
    )
