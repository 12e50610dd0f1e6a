"""``smc_standard``: sequential Monte Carlo with ESS-triggered resampling.

Each iteration reads as its steps (the :class:`~llamppl.inference.engine.SMC`
engine): extend every live particle by one ``step`` (M_t, all LM requests in one
batch), reweight (G_t is folded into the particle weights by the ``Model``
primitives), resample when ESS < ``ess_threshold · N`` (the rule
:func:`~llamppl.inference.rules.ess_rule`), and return one ``StepInfo``, from which
the shared loop (:mod:`llamppl.inference.steps`) derives the history, the run
record and the progress bar. After resampling every weight is set to the log mean weight, so the
final ``log_ml = log (1/N) Σ_i w_i`` is the standard unbiased estimate of Z::

    result = await smc_standard(model, n_particles=32, ess_threshold=0.5, seed=0)
    result = await smc_standard(model, 32, 0.5, move=ResampleMove(k=2), seed=0)  # resample-move
"""

from __future__ import annotations

import os

import numpy as np

from llamppl.modeling import Model
from llamppl.validation import check_positive_int

from .engine import SMC
from .moves import ResampleMove
from .options import DEFAULT_MAX_STEPS, run_options
from .particles import check_model
from .result import SMCResult
from .rules import ess_rule
from .steps import run_population

__all__ = ["smc_standard"]


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
    move: ResampleMove | None = None,
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
    move : ResampleMove | None
        Resample-move rejuvenation (:mod:`llamppl.inference.moves`): after each step that
        resamples (every step with ``every_step=True``), an independent Metropolis–Hastings
        move regenerates each particle's last ``k`` steps with the program's own proposal and
        accepts by the ratio of the tails' incremental weights; π_t (the twisted intermediate
        target) stays invariant and the weights unchanged. With ``every_step=True`` Ẑ stays
        exactly unbiased; after resampling only, exactly only as N grows (the measured bias is
        in :mod:`llamppl.inference.moves`). ``SMCResult.stats`` then holds the
        acceptance rate (``move_acceptance``), the work (``move_proposals``,
        ``move_program_steps``) and the distinct particles before and after each move.
    """
    check_model(model)
    n = check_positive_int("n_particles", n_particles)
    rule = ess_rule(ess_threshold, resampling)
    options = run_options(
        seed=seed,
        progress=progress,
        record=record,
        max_steps=max_steps,
        json_file=json_file,
        visualization_dir=visualization_dir,
    )
    return await run_population(model, n, SMC(rule, "smc_standard", move), options)
