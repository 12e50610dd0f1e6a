"""Inference algorithms for ``llamppl.Model`` programs.

All are ``async`` and return an :class:`SMCResult`; call them with ``await``
inside async code or through :func:`llamppl.run` from plain code::

    from llamppl import run
    from llamppl.inference import smc_standard, smc_steer, importance_sampling, enumerate_exact
    from llamppl.inference import csmc_standard, particle_gibbs   # conditional SMC, particle Gibbs
    result = run(smc_steer(model, n_particles=8, n_beam=3, seed=0))
    result = run(smc_standard(model, 16, move=ResampleMove(k=2), seed=0))  # resample-move

Every engine implements one protocol (:class:`Engine`: ``start`` and
``step(particles, t, rng) -> (particles, StepInfo)``) and runs in one loop,
:func:`run_population(model, n, engine, options) <llamppl.inference.steps.run_population>`;
the run options are one value (:class:`RunOptions`) and when to resample is one rule
value (:mod:`llamppl.inference.rules`). A new algorithm is an ``Engine`` subclass.
"""

from .csmc import CSMCResult, ParticleGibbsChain, Trajectory, csmc_standard, particle_gibbs
from .engine import SMC, Engine
from .enumerate import enumerate_exact
from .importance import importance_sampling
from .moves import ResampleMove
from .options import RunOptions, run_options
from .resampling import RESAMPLERS, get_resampler
from .result import SMCResult
from .rules import Never, PinnedMultinomial, ResampleRule, WhenESSBelow, ess_rule
from .smc_standard import smc_standard
from .smc_steer import Steering, smc_steer, steer_downsample
from .step_info import StepInfo
from .steps import StepLimitError, run_population
from .twist_features import TwistFeatures
from .twist_learning import LearnedTwist, TrainingReport, learn_twist

__all__ = [
    "smc_standard",
    "smc_steer",
    "importance_sampling",
    "enumerate_exact",
    "csmc_standard",
    "particle_gibbs",
    "CSMCResult",
    "ParticleGibbsChain",
    "Trajectory",
    "SMCResult",
    "StepInfo",
    "StepLimitError",
    "RESAMPLERS",
    "get_resampler",
    "steer_downsample",
    "Engine",
    "SMC",
    "Steering",
    "run_population",
    "RunOptions",
    "run_options",
    "ResampleRule",
    "Never",
    "WhenESSBelow",
    "PinnedMultinomial",
    "ess_rule",
    "ResampleMove",
    "TwistFeatures",
    "LearnedTwist",
    "TrainingReport",
    "learn_twist",
]
