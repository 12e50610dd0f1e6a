"""``smc_standard``: sequential Monte Carlo with ESS-triggered resampling.

Each iteration reads as its steps: extend every live particle by one ``step``
(M_t, all LM requests in one batch), reweight (G_t is folded into the particle
weights by the ``Model`` primitives), resample when ESS < ``ess_threshold · N``,
record. After resampling every weight is set to the log mean weight, so the
final ``log_ml = log (1/N) Σ_i w_i`` is the standard unbiased estimate of Z::

    result = await smc_standard(model, n_particles=32, ess_threshold=0.5, seed=0)
"""

from __future__ import annotations

import os

import numpy as np

from llamppl.modeling import Model
from llamppl.rng import make_rng, using_rng
from llamppl.validation import check_positive_int, check_unit_interval
from llamppl.weights import ess, logmeanexp

from .particles import LMCounters, Progress, begin_all, check_model, log_weights, step_all
from .record import recorder_for
from .resampling import get_resampler
from .result import SMCResult, StepRecord

__all__ = ["smc_standard", "resample_population"]


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


async def smc_standard(
    model: Model,
    n_particles: int,
    ess_threshold: float = 0.5,
    visualization_dir: str | os.PathLike | None = None,
    json_file: str | os.PathLike | None = None,
    resampling_method: str | None = None,
    *,
    resampling: str = "systematic",
    seed: int | np.random.Generator | None = None,
    progress: bool | None = None,
    record: bool | str | os.PathLike = False,
) -> SMCResult:
    """Run SMC with adaptive resampling on ``model``.

    The positional order is LLaMPPL's, ``smc_standard(model, n_particles,
    ess_threshold, visualization_dir, json_file, resampling_method)``; our own
    options (``resampling=``, ``seed=``, ``progress=``, ``record=``) are keywords.

    Parameters
    ----------
    model : Model
        The program; it is cloned ``n_particles`` times and not modified.
    n_particles : int
        Number of particles N >= 1.
    ess_threshold : float
        Resample when ESS < ``ess_threshold · N``; in (0, 1] (1 resamples at every step
        unless all weights are equal).
    resampling : str
        ``"multinomial" | "stratified" | "systematic" | "residual"``.
    seed : int | numpy.random.Generator | None
        Fixes every random choice of the run.
    progress : bool | None
        tqdm bar; default on when stderr is a terminal.
    resampling_method : str | None
        LLaMPPL name of ``resampling`` (give one or the other).
    json_file, visualization_dir : path | None
        Write a run record (every particle at every step) as JSON to ``json_file``
        and/or ``visualization_dir/record.json`` (LLaMPPL's names; format in
        :mod:`llamppl.inference.record`).
    record : bool | path
        ``True`` keeps the run record on ``SMCResult.record`` (for ``to_html``, ``plot``);
        a path also writes it there.
    """
    if resampling_method is not None:
        if resampling != "systematic" and resampling != resampling_method:
            raise ValueError(
                f"give resampling= or resampling_method= (its LLaMPPL name), not both: {resampling!r} vs {resampling_method!r}"
            )
        resampling = resampling_method
    check_model(model)
    n = check_positive_int("n_particles", n_particles)
    threshold = check_unit_interval("ess_threshold", ess_threshold)
    resample = get_resampler(resampling)
    rng = make_rng(seed)
    counters = LMCounters(model)
    recorder = recorder_for("smc_standard", n, json_file, visualization_dir, record)
    bar = Progress(progress, "smc_standard")
    history: list[StepRecord] = []
    try:
        with using_rng(rng):
            particles = [model.clone() for _ in range(n)]
            await begin_all(particles)
            t = 0
            while not all(p.done_stepping() for p in particles):
                await step_all(particles)
                w = log_weights(particles)
                t += 1
                step_ess = ess(w)
                log_ml = logmeanexp(w)
                ancestors = None
                snapshot = list(particles) if recorder is not None else None
                live = sum(not p.done_stepping() for p in particles)
                if live and log_ml > -np.inf and step_ess < threshold * n:
                    ancestors = resample(w, rng, n)
                    particles = resample_population(particles, ancestors, log_ml)
                    live = sum(not p.done_stepping() for p in particles)
                history.append(
                    StepRecord(t, step_ess, ancestors is not None, ancestors, log_ml, live)
                )
                if recorder is not None:
                    recorder.step(t, snapshot, w, step_ess, log_ml, ancestors)
                bar.update(ess=f"{step_ess:.1f}", live=live)
    finally:
        bar.close()
    w = log_weights(particles)
    record = None if recorder is None else recorder.finish(particles, w, logmeanexp(w))
    return SMCResult(
        particles,
        w,
        logmeanexp(w),
        history,
        counters.finish(steps=len(history), n_particles=n),
        "smc_standard",
        record=record,
    )
