"""``smc_standard``: sequential Monte Carlo with ESS-triggered resampling.

Each iteration reads as its steps (:func:`smc_standard_step`): extend every live
particle by one ``step`` (M_t, all LM requests in one batch), reweight (G_t is
folded into the particle weights by the ``Model`` primitives), resample when
ESS < ``ess_threshold · N``, and return one ``StepInfo``, from which the shared
loop (:mod:`llamppl.inference.steps`) derives the history, the run record and the
progress bar. After resampling every weight is set to the log mean weight, so the
final ``log_ml = log (1/N) Σ_i w_i`` is the standard unbiased estimate of Z::

    result = await smc_standard(model, n_particles=32, ess_threshold=0.5, seed=0)
"""

from __future__ import annotations

import os

import numpy as np

from llamppl.modeling import Model
from llamppl.rng import make_rng
from llamppl.validation import check_positive_int, check_unit_interval
from llamppl.weights import ess, logmeanexp

from .particles import check_model, log_weights, step_all
from .record import record_target
from .resampling import Resampler, get_resampler
from .result import SMCResult, StepInfo
from .steps import DEFAULT_MAX_STEPS, OneStep, check_max_steps, run_population

__all__ = ["smc_standard", "smc_standard_step", "resample_population"]


def resample_population(
    particles: list[Model], ancestors: np.ndarray, log_weight: float
) -> list[Model]:
    """New population ``particles[a]`` for each ancestor; repeats are clones. Every weight becomes ``log_weight``."""
    used: set[int] = set()
    out = []
    for a in ancestors.tolist():
        p = particles[a].clone() if a in used else particles[a]
        used.add(a)
        p.weight = log_weight
        out.append(p)
    return out


def smc_standard_step(
    resample: Resampler, ess_threshold: float, rng: np.random.Generator
) -> OneStep:
    """One step of adaptive SMC: ``(particles, t) -> (particles, StepInfo)``.

    Resamples when ESS < ``ess_threshold · N`` and some particle is still stepping;
    the resampled weights are all log Ẑ_t = log mean w (so Ẑ stays unbiased).
    """

    async def one_step(particles: list[Model], t: int) -> tuple[list[Model], StepInfo]:
        n = len(particles)
        await step_all(particles)  # extend: M_t for every live particle (one LM batch)
        w = log_weights(particles)  # reweight: G_t already folded in by the primitives
        log_ml, step_ess, ancestors = logmeanexp(w), ess(w), None
        before = tuple(particles)
        live = any(not p.done_stepping() for p in particles)
        if live and log_ml > -np.inf and step_ess < ess_threshold * n:  # maybe resample
            ancestors = resample(w, rng, n)
            particles = resample_population(particles, ancestors, log_ml)
        n_live = sum(not p.done_stepping() for p in particles)
        info = StepInfo(t, step_ess, ancestors is not None, ancestors, log_ml, n_live, w, before)
        return particles, info

    return one_step


async def smc_standard(
    model: Model,
    n_particles: int,
    ess_threshold: float = 0.5,
    *,
    resampling: str = "systematic",
    seed: int | np.random.Generator | None = None,
    progress: bool | None = None,
    json_file: str | os.PathLike | None = None,
    visualization_dir: str | os.PathLike | None = None,
    record: bool | str | os.PathLike = False,
    max_steps: int | None = DEFAULT_MAX_STEPS,
) -> SMCResult:
    """Run SMC with adaptive resampling on ``model``.

    LLaMPPL's positional order, ``smc_standard(model, n_particles, ess_threshold,
    visualization_dir, json_file, resampling_method)``, is accepted too
    (:mod:`llamppl.compat`).

    Parameters
    ----------
    model : Model
        The program; it is cloned ``n_particles`` times and not modified.
    n_particles : int
        Number of particles N >= 1. A run whose estimated memory exceeds what is
        available is refused before it starts (:mod:`llamppl.inference.budget`).
    ess_threshold : float
        Resample when ESS < ``ess_threshold · N``; in [0, 1] (1 resamples at every step
        unless all weights are equal; 0 never resamples: importance sampling, stepped
        like SMC).
    resampling : str
        ``"multinomial" | "stratified" | "systematic" | "residual"``.
    seed : int | numpy.random.Generator | None
        Fixes every random choice of the run.
    progress : bool | None
        tqdm bar; default on when stderr is a terminal.
    json_file, visualization_dir : path | None
        Write a run record (every particle at every step) as JSON to ``json_file``
        and/or ``visualization_dir/record.json`` (format in :mod:`llamppl.inference.record`).
    record : bool | path
        ``True`` keeps the run record on ``SMCResult.record`` (for ``to_html``, ``plot``);
        a path also writes it there. Every path is checked before the run starts.
    max_steps : int | None
        Step limit (default 10,000; None for none). A run with particles still stepping
        after it raises :class:`~llamppl.inference.steps.StepLimitError` naming the model
        and the step; its ``.result`` holds the run so far.
    """
    check_model(model)
    n = check_positive_int("n_particles", n_particles)
    threshold = check_unit_interval("ess_threshold", ess_threshold, open_left=False)
    resample = get_resampler(resampling)
    limit = check_max_steps(max_steps)
    target = record_target(json_file, visualization_dir, record)
    rng = make_rng(seed)
    one_step = smc_standard_step(resample, threshold, rng)
    return await run_population(
        "smc_standard",
        model,
        n,
        one_step,
        rng=rng,
        progress=progress,
        record=target,
        max_steps=limit,
    )
