"""The engine protocol: what every inference algorithm implements, and the adaptive SMC engine.

An engine is a small object the shared loop
(:func:`~llamppl.inference.steps.run_population`) drives::

    particles = await engine.start(particles)                  # run every start hook
    particles, info = await engine.step(particles, t, rng)     # extend → reweight → maybe resample
    engine.stats()                                             # extra entries of SMCResult.stats

``name`` labels the result, the run record and the progress bar;
``population_factor`` says how many particles per slot are alive at once (K for
SMC steering), for the memory check before a run. A new algorithm (adaptive
tempering, twisted SMC, …) is one subclass of :class:`Engine` with a ``step``;
recording, progress and the step limit come from the loop.

:class:`SMC` is the engine of ``smc_standard``, ``importance_sampling`` and of the
drivers built on them (Power-SMC, SMC-SD, structured generation): extend every
live particle by one ``step`` (all LM requests in one batch), read the weights,
resample by its :mod:`rule <llamppl.inference.rules>`. After resampling every
weight is the log mean weight, so ``log_ml = log (1/N) Σ_i w_i`` stays the
standard unbiased estimate of Z. With ``move=`` (a
:class:`~llamppl.inference.moves.ResampleMove`) it then rejuvenates the population by a
Metropolis–Hastings move that leaves the intermediate target invariant
(:mod:`llamppl.inference.moves`).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from llamppl.modeling import Model
from llamppl.weights import logmeanexp

from .moves import Rejuvenation, ResampleMove, Trail, check_move
from .particles import log_weights, resample_population, start_all, step_all
from .rules import ResampleRule
from .step_info import StepInfo, step_info

__all__ = ["Engine", "SMC", "maybe_resample"]


class Engine:
    """Base of the engines (see the module docstring): override :meth:`step`."""

    name: str = "engine"
    population_factor: int = 1

    async def start(self, particles: list[Model]) -> list[Model]:
        """Run every particle's ``start`` hook concurrently; return the population."""
        await start_all(particles)
        return particles

    async def step(
        self, particles: list[Model], t: int, rng: np.random.Generator
    ) -> tuple[list[Model], StepInfo]:
        raise NotImplementedError(f"{type(self).__name__} must implement step()")

    def stats(self) -> dict[str, Any]:
        """Entries this engine adds to ``SMCResult.stats``."""
        return {}


class SMC(Engine):
    """Sequential Monte Carlo with a resampling rule (:class:`~llamppl.inference.rules.Never`:
    importance sampling), and optionally a resample-move ``move``."""

    def __init__(
        self, rule: ResampleRule, name: str = "smc_standard", move: ResampleMove | None = None
    ) -> None:
        if not isinstance(rule, ResampleRule):
            raise TypeError(f"rule must be a ResampleRule, got {type(rule).__name__}")
        self.rule, self.name = rule, name
        move = check_move(move)
        self.rejuvenation = None if move is None else Rejuvenation(move)
        self.population_factor = 1 if move is None else move.population_factor
        self.trails: list[Trail] | None = None  # aligned with the population (moves only)

    async def step(
        self, particles: list[Model], t: int, rng: np.random.Generator
    ) -> tuple[list[Model], StepInfo]:
        rj = self.rejuvenation
        if rj is None or not rj.tracks:
            await step_all(particles)  # extend: M_t for every live particle (one LM batch)
        else:  # the same, keeping each particle's state before the step and its log G_t
            trails = self.trails or [()] * len(particles)
            saved, before = rj.save(particles), [p.weight for p in particles]
            await step_all(particles)
            self.trails = rj.record(trails, saved, before, particles)
        w = log_weights(particles)  # reweight: G_t already folded in by the primitives
        survivors, ancestors = maybe_resample(particles, w, self.rule, rng)
        if rj is not None:  # move: MH on the last k steps, weights unchanged
            trails = self.trails or [()] * len(survivors)
            if ancestors is not None:
                trails = [trails[a] for a in ancestors.tolist()]
            resampled = ancestors is not None
            survivors, trails = await rj.after(survivors, trails, resampled, rng)
            self.trails = trails if rj.tracks else None
        return survivors, step_info(t, w, particles, survivors=survivors, ancestors=ancestors)

    def stats(self) -> dict[str, Any]:
        return {} if self.rejuvenation is None else self.rejuvenation.stats()


def maybe_resample(
    particles: list[Model], log_weights: np.ndarray, rule: ResampleRule, rng: np.random.Generator
) -> tuple[list[Model], np.ndarray | None]:
    """The population after ``rule``'s decision, and its ancestors (None: kept as it is).

    Resampling happens only while some particle is still stepping; the resampled weights
    are all the log mean weight, so the running Ẑ = mean w stays unbiased.
    """
    if not any(not p.done_stepping() for p in particles):
        return particles, None
    ancestors = rule.ancestors(log_weights, rng)
    if ancestors is None:
        return particles, None
    return resample_population(particles, ancestors, logmeanexp(log_weights)), ancestors
