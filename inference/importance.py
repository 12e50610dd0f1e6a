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
from llamppl.validation import check_positive_int

from .engine import SMC
from .options import DEFAULT_MAX_STEPS, run_options
from .particles import check_model
from .result import SMCResult
from .rules import Never
from .steps import run_population

__all__ = ["importance_sampling"]


async def importance_sampling(
    model: Model,
    n_particles: int,
    seed: int | np.random.Generator | None = None,
    progress: bool | None = None,
    record: bool | str | os.PathLike = False,
    max_steps: int | None = DEFAULT_MAX_STEPS,
) -> SMCResult:
    """Sequential importance sampling of ``model`` with ``n_particles`` independent particles.

    The :class:`~llamppl.inference.engine.SMC` engine with the
    :class:`~llamppl.inference.rules.Never` rule. ``record=True`` keeps a run record on
    ``SMCResult.record`` (``record=path`` also writes it, checked before the run; format in
    :mod:`llamppl.inference.record`). ``max_steps`` (default 10,000, None for none) bounds
    the run: particles still stepping after it raise
    :class:`~llamppl.inference.steps.StepLimitError` (naming the model and the step;
    ``.result`` holds the run so far). A run that would not fit in the available memory is
    refused before it starts.
    """
    check_model(model)
    n = check_positive_int("n_particles", n_particles)
    options = run_options(seed=seed, progress=progress, record=record, max_steps=max_steps)
    return await run_population(model, n, SMC(Never(), "importance_sampling"), options)
