"""Conditional SMC (``csmc_standard``) and the particle-Gibbs chain it drives (``particle_gibbs``).

Conditional SMC (Andrieu, Doucet & Holenstein 2010, "Particle Markov chain Monte
Carlo methods", §4.3) is SMC in which slot 0 is pinned to a *reference* path
x*_{1:T}: at step t the pinned particle makes the reference's choices x*_t (it is
not sampled), and at every resampling it keeps its own ancestor (A_t^0 = 0) while
the N − 1 free slots draw their ancestors multinomially from all N weights,
pinned slot included. The weights are the usual ones: the pinned particle's
increment G_t is what any particle making those choices gets (eq. 2 of the LLaMPPL
paper: proposal ratio × likelihoods × conditions × twists).

Particle Gibbs iterates it: draw K ∝ w_T^K among the final particles; its path is
the next reference. The chain leaves the exact posterior (the normalised
Feynman–Kac target) invariant for any N >= 2 (ADH 2010, Theorem 5), which
``tests/inference/test_csmc.py`` checks against ``enumerate_exact``.

A path is a :class:`Trajectory`: the values every ``sample`` returned, per hook
call (``start``, then each ``step``). Programs must draw all their randomness
through ``sample`` (as ``enumerate_exact`` also assumes), so replaying the values
rebuilds the state::

    chain = await particle_gibbs(model, n_particles=4, n_iterations=500, seed=0)
    chain.posterior                      # {string_for_serialization: frequency}
    res = await csmc_standard(model, 4, chain.trajectories[-1], seed=1)
"""

from __future__ import annotations

import asyncio
import weakref
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from llamppl.distributions import Distribution
from llamppl.modeling import Model
from llamppl.rng import make_rng, using_rng
from llamppl.validation import check_positive_int, check_unit_interval
from llamppl.weights import ess, logmeanexp, normalize

from .particles import LMCounters, Progress, check_model, log_weights
from .result import SMCResult, StepRecord
from .smc_standard import resample_population

__all__ = ["Trajectory", "CSMCResult", "ParticleGibbsChain", "csmc_standard", "particle_gibbs"]


@dataclass(frozen=True)
class Trajectory:
    """One particle's random choices: ``choices[t]`` holds the values its ``sample`` calls
    returned in hook call t (t = 0 is ``start``, then one entry per ``step``)."""

    choices: tuple[tuple[Any, ...], ...] = ()

    def extended(self, values: list[Any]) -> Trajectory:
        return Trajectory(self.choices + (tuple(values),))


# particle -> its Trajectory, for the particles csmc_standard returns (so reference=particle works)
_PATHS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


class _Record:
    """Samples exactly as ``Model.sample`` does and keeps the values (a free slot)."""

    def __init__(self) -> None:
        self.values: list[Any] = []

    async def choose(self, model: Model, dist: Distribution, proposal: Distribution | None) -> Any:
        if proposal is None:
            value, _ = await dist.sample()
        else:
            value, log_q = await proposal.sample()
            model.score(await dist.log_prob(value) - log_q)
        self.values.append(value)
        return value


class _Force:
    """Makes the reference's choices (the pinned slot): same side effects and weight as sampling them."""

    def __init__(self, forced: tuple[Any, ...]) -> None:
        self.values, self.position = list(forced), 0

    async def choose(self, model: Model, dist: Distribution, proposal: Distribution | None) -> Any:
        if self.position == len(self.values):
            raise ValueError(
                "reference: the program made more choices than the reference path recorded; "
                "a reference must come from the same program and start state"
            )
        value = self.values[self.position]
        self.position += 1
        if proposal is None:
            await dist.log_prob(value)  # the side effects of sampling it (q = p: no weight)
        else:
            log_q = await proposal.log_prob(value)
            model.score(await dist.log_prob(value) - log_q)
        return value


@dataclass
class CSMCResult(SMCResult):
    """An :class:`SMCResult` plus each final particle's :class:`Trajectory` (slot 0 is the reference)."""

    trajectories: list[Trajectory] = field(default_factory=list)


async def _run_hook(particles, paths, hook: str, t: int, reference: Trajectory | None) -> None:
    """One hook call ("begin" or "advance") of every live particle, recording (or forcing) choices."""
    live = [i for i, p in enumerate(particles) if hook == "begin" or not p.done_stepping()]
    choosers: dict[int, Any] = {}
    for i in live:
        if i == 0 and reference is not None:
            if t >= len(reference.choices):
                raise ValueError(
                    f"reference: the program took more steps than the reference path ({len(reference.choices) - 1})"
                )
            choosers[i] = _Force(reference.choices[t])
        else:
            choosers[i] = _Record()
        particles[i].set_chooser(choosers[i])
    try:
        await asyncio.gather(*(getattr(particles[i], hook)() for i in live))
    finally:
        for i in live:
            particles[i].set_chooser(None)
    for i in live:
        c = choosers[i]
        if (
            isinstance(c, _Force)
            and c.position != len(c.values)
            and not particles[i].weight == -np.inf
        ):
            raise ValueError(
                "reference: the program made fewer choices than the reference path recorded"
            )
        paths[i] = paths[i].extended(c.values)


def _as_trajectory(reference: object) -> Trajectory | None:
    if reference is None or isinstance(reference, Trajectory):
        return reference
    if isinstance(reference, Model):
        try:
            return _PATHS[reference]
        except (KeyError, TypeError):
            pass
    raise TypeError(
        "reference must be a Trajectory, a particle returned by csmc_standard / particle_gibbs, "
        f"or None (an unconditional run), got {type(reference).__name__}"
    )


async def csmc_standard(
    model: Model,
    n_particles: int,
    reference: Trajectory | Model | None = None,
    ess_threshold: float = 1.0,
    *,
    seed: int | np.random.Generator | None = None,
    progress: bool | None = None,
) -> CSMCResult:
    """Conditional SMC with slot 0 pinned to ``reference`` (ADH 2010, §4.3).

    Parameters
    ----------
    model : Model
        The program; cloned ``n_particles`` times, not modified.
    n_particles : int
        N >= 1 slots, the pinned one included (N >= 2 for the chain to move).
    reference : Trajectory | Model | None
        The pinned path: a :class:`Trajectory` or a particle an earlier ``csmc_standard``
        returned. ``None`` pins nothing (plain SMC with multinomial resampling that
        records every path: the usual first iteration of particle Gibbs).
    ess_threshold : float
        Resample when ESS < ``ess_threshold · N`` (a symmetric function of the weights, so
        the conditional construction holds); 1.0, the default, resamples at every step.
    seed : int | numpy.random.Generator | None
        Fixes every random choice of the run.

    Resampling is multinomial: slot 0 keeps ancestor 0, the N − 1 free slots draw
    ancestors i.i.d. ∝ w_t (the conditional multinomial resampling of ADH 2010).
    ``log_ml`` is ``log (1/N) Σ w_T`` as in ``smc_standard``; it is not an unbiased
    estimate of Z once a reference is pinned.
    """
    check_model(model)
    n = check_positive_int("n_particles", n_particles)
    threshold = check_unit_interval("ess_threshold", ess_threshold)
    ref = _as_trajectory(reference)
    rng = make_rng(seed)
    counters = LMCounters(model)
    bar = Progress(progress, "csmc_standard")
    history: list[StepRecord] = []
    try:
        with using_rng(rng):
            particles = [model.clone() for _ in range(n)]
            paths = [Trajectory() for _ in range(n)]
            await _run_hook(particles, paths, "begin", 0, ref)
            t = 0
            while not all(p.done_stepping() for p in particles):
                t += 1
                await _run_hook(particles, paths, "advance", t, ref)
                w = log_weights(particles)
                step_ess, log_ml = ess(w), logmeanexp(w)
                ancestors = None
                live = sum(not p.done_stepping() for p in particles)
                if live and log_ml > -np.inf and step_ess < threshold * n:
                    free = rng.choice(n, size=n - 1, p=normalize(w)) if n > 1 else []
                    start = [0] if ref is not None else [int(rng.choice(n, p=normalize(w)))]
                    ancestors = np.asarray(start + list(free), dtype=np.int64)
                    particles = resample_population(particles, ancestors, log_ml)
                    paths = [paths[a] for a in ancestors.tolist()]
                    live = sum(not p.done_stepping() for p in particles)
                history.append(
                    StepRecord(t, step_ess, ancestors is not None, ancestors, log_ml, live)
                )
                bar.update(ess=f"{step_ess:.1f}", live=live)
    finally:
        bar.close()
    if ref is not None and paths[0] != ref:
        raise ValueError("reference: the program finished before the reference path ended")
    for p, path in zip(particles, paths):
        _PATHS[p] = path
    w = log_weights(particles)
    return CSMCResult(
        particles,
        w,
        logmeanexp(w),
        history,
        counters.finish(steps=len(history), n_particles=n),
        "csmc_standard",
        trajectories=paths,
    )


@dataclass
class ParticleGibbsChain:
    """The particle-Gibbs chain: one state (particle and its path) per iteration."""

    particles: list[Model]
    trajectories: list[Trajectory]

    def __len__(self) -> int:
        return len(self.particles)

    def __iter__(self):
        return iter(self.particles)

    def __getitem__(self, i):
        return self.particles[i]

    @property
    def posterior(self) -> dict[str, float]:
        """Empirical frequency of each ``string_for_serialization()`` over the chain, largest first."""
        counts = Counter(p.string_for_serialization() for p in self.particles)
        total = max(len(self.particles), 1)
        return {k: c / total for k, c in counts.most_common()}


async def particle_gibbs(
    model: Model,
    n_particles: int,
    n_iterations: int,
    reference: Trajectory | Model | None = None,
    ess_threshold: float = 1.0,
    *,
    seed: int | np.random.Generator | None = None,
) -> ParticleGibbsChain:
    """Particle Gibbs (ADH 2010, §4.3): iterate ``csmc_standard``, each time pinning the
    previous state, and keep the particle K ∝ w_T^K drawn from each run.

    Without a ``reference`` the first run is unconditional. The chain's states have
    the exact posterior as their stationary law (Theorem 5 of ADH 2010); discard a
    burn-in as for any MCMC chain.
    """
    n_iterations = check_positive_int("n_iterations", n_iterations)
    rng = make_rng(seed)
    ref = _as_trajectory(reference)
    states: list[Model] = []
    paths: list[Trajectory] = []
    for _ in range(n_iterations):
        res = await csmc_standard(model, n_particles, ref, ess_threshold, seed=rng)
        w = res.weights
        if not w.sum() > 0:
            raise ValueError(
                "particle_gibbs: every particle of the unconditional first run has weight zero; "
                "give a reference path or more particles"
            )
        k = int(rng.choice(len(w), p=w / w.sum()))
        ref = res.trajectories[k]
        states.append(res.particles[k])
        paths.append(ref)
    return ParticleGibbsChain(states, paths)
