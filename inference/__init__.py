"""Inference algorithms for ``llamppl.Model`` programs.

All are ``async`` and return an :class:`SMCResult`; call them with ``await``
inside async code or through :func:`llamppl.run` from plain code::

    from llamppl import run
    from llamppl.inference import smc_standard, smc_steer, importance_sampling, enumerate_exact
    from llamppl.inference import csmc_standard, particle_gibbs   # conditional SMC, particle Gibbs
    result = run(smc_steer(model, n_particles=8, n_beam=3, seed=0))
"""

from .csmc import CSMCResult, ParticleGibbsChain, Trajectory, csmc_standard, particle_gibbs
from .enumerate import enumerate_exact
from .importance import importance_sampling
from .resampling import RESAMPLERS, get_resampler
from .result import SMCResult, StepInfo
from .smc_standard import smc_standard
from .smc_steer import smc_steer, steer_downsample
from .steps import StepLimitError

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
]
