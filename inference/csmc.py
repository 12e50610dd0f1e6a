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
rebuilds the state. The engine is :class:`ConditionalSMC`, whose step returns
``(particles, StepInfo)`` like every engine's, driven by the shared loop
:func:`~llamppl.inference.steps.run_population` (history, run record, progress,
``max_steps`` and the up-front memory check)::

    chain = await particle_gibbs(model, n_particles=4, n_iterations=500, seed=0)
    chain.posterior                      # {string_for_serialization: frequency}
    res = await csmc_standard(model, 4, chain.trajectories[-1], seed=1)
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import weakref
from collections import Counter
from dataclasses import dataclass, field, fields
from typing import Any

import numpy as np

from llamppl.distributions import Distribution
from llamppl.modeling import Model
from llamppl.validation import check_positive_int

from .engine import Engine, maybe_resample
from .observers import Progress
from .options import DEFAULT_MAX_STEPS, RunOptions, options_from, run_options
from .particles import check_model, log_weights
from .record import RecordTarget, write_json
from .result import SMCResult
from .rules import PinnedMultinomial
from .step_info import StepInfo, step_info
from .steps import StepLimitError, run_population

__all__ = [
    "Trajectory",
    "CSMCResult",
    "ParticleGibbsChain",
    "ConditionalSMC",
    "csmc_standard",
    "particle_gibbs",
]


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


class ConditionalSMC(Engine):
    """The conditional SMC engine for :func:`~llamppl.inference.steps.run_population`.

    ``start(particles)`` runs every ``start`` hook and ``await step(particles, t, rng)``
    returns ``(particles, StepInfo)``: extend every live particle (slot 0 forced to the
    reference's choices x*_t, the others sampled and recorded), reweight, and resample by
    the :class:`~llamppl.inference.rules.PinnedMultinomial` rule (A_t^0 = 0 and
    A_t^{1..N-1} i.i.d. ∝ w_t; ADH 2010, §4.3). ``paths[i]`` is slot i's
    :class:`Trajectory`, kept aligned with the population.
    """

    name = "csmc_standard"

    def __init__(self, reference: Trajectory | None, ess_threshold: float) -> None:
        self.reference = reference
        self.rule = PinnedMultinomial(ess_threshold, pinned=reference is not None)
        self.paths: list[Trajectory] = []

    async def _run_hook(self, particles: list[Model], hook: str, t: int) -> None:
        """One hook call ("run_start" or "run_step") of every live particle, recording (or forcing) choices."""
        ref = self.reference
        live = [i for i, p in enumerate(particles) if hook == "run_start" or not p.done_stepping()]
        choosers: dict[int, _Record | _Force] = {}
        for i in live:
            if i == 0 and ref is not None:
                if t >= len(ref.choices):
                    raise ValueError(
                        "reference: the program took more steps than the reference path "
                        f"({len(ref.choices) - 1})"
                    )
                choosers[i] = _Force(ref.choices[t])
            else:
                choosers[i] = _Record()
        with contextlib.ExitStack() as stack:
            for i in live:
                stack.enter_context(particles[i].replaying(choosers[i]))
            await asyncio.gather(*(getattr(particles[i], hook)() for i in live))
        for i in live:
            c = choosers[i]
            if (
                isinstance(c, _Force)
                and c.position != len(c.values)
                and particles[i].weight > -np.inf
            ):
                raise ValueError(
                    "reference: the program made fewer choices than the reference path recorded"
                )
            self.paths[i] = self.paths[i].extended(c.values)

    async def start(self, particles: list[Model]) -> list[Model]:
        self.paths = [Trajectory() for _ in particles]
        await self._run_hook(particles, "run_start", 0)
        return particles

    async def step(
        self, particles: list[Model], t: int, rng: np.random.Generator
    ) -> tuple[list[Model], StepInfo]:
        await self._run_hook(particles, "run_step", t)  # extend: x*_t in slot 0, M_t elsewhere
        w = log_weights(particles)  # reweight: G_t already folded in by the primitives
        survivors, ancestors = maybe_resample(particles, w, self.rule, rng)
        if ancestors is not None:
            self.paths = [self.paths[a] for a in ancestors.tolist()]
        return survivors, step_info(t, w, particles, survivors=survivors, ancestors=ancestors)

    def result(self, res: SMCResult) -> CSMCResult:
        """``res`` with each final particle's path (and the paths remembered for ``reference=particle``)."""
        for p, path in zip(res.particles, self.paths):
            _PATHS[p] = path
        base = {f.name: getattr(res, f.name) for f in fields(SMCResult)}
        return CSMCResult(**base, trajectories=list(self.paths))


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
    record: bool | str | os.PathLike = False,
    max_steps: int | None = DEFAULT_MAX_STEPS,
) -> CSMCResult:
    """Conditional SMC with slot 0 pinned to ``reference`` (ADH 2010, §4.3).

    Parameters
    ----------
    model : Model
        The program; cloned ``n_particles`` times, not modified.
    n_particles : int
        N >= 1 slots, the pinned one included (N >= 2 for the chain to move). A run
        whose estimated memory exceeds what is available is refused before it starts.
    reference : Trajectory | Model | None
        The pinned path: a :class:`Trajectory` or a particle an earlier ``csmc_standard``
        returned. ``None`` pins nothing (plain SMC with multinomial resampling that
        records every path: the usual first iteration of particle Gibbs).
    ess_threshold : float
        Resample when ESS < ``ess_threshold · N`` (a symmetric function of the weights, so
        the conditional construction holds); 1.0, the default, resamples at every step; 0
        never resamples (conditional importance sampling).
    seed : int | numpy.random.Generator | None
        Fixes every random choice of the run.
    progress : bool | None
        tqdm bar; default on when stderr is a terminal.
    record : bool | path
        ``True`` keeps the run record on ``result.record``; a path also writes it there
        (checked before the run; format in :mod:`llamppl.inference.record`).
    max_steps : int | None
        Step limit (default 10,000; None for none). Particles still stepping after it
        raise :class:`~llamppl.inference.steps.StepLimitError`; its ``.result`` (a
        :class:`CSMCResult`) holds the run so far.

    Notes
    -----
    Resampling is multinomial: slot 0 keeps ancestor 0, the N − 1 free slots draw
    ancestors i.i.d. ∝ w_t (the conditional multinomial resampling of ADH 2010).
    ``log_ml`` is ``log (1/N) Σ w_T`` as in ``smc_standard``; it is not an unbiased
    estimate of Z once a reference is pinned.
    """
    check_model(model)
    n = check_positive_int("n_particles", n_particles)
    options = run_options(seed=seed, progress=progress, record=record, max_steps=max_steps)
    return await _conditional_run(model, n, _as_trajectory(reference), ess_threshold, options)


async def _conditional_run(
    model: Model,
    n: int,
    reference: Trajectory | None,
    ess_threshold: float,
    options: RunOptions,
) -> CSMCResult:
    """One conditional SMC run (``csmc_standard`` after its checks; a particle Gibbs iteration)."""
    engine = ConditionalSMC(reference, ess_threshold)
    try:
        res = await run_population(model, n, engine, options)
    except StepLimitError as error:
        error.result = engine.result(error.result)
        raise
    if reference is not None and engine.paths[0] != reference:
        raise ValueError("reference: the program finished before the reference path ended")
    return engine.result(res)


@dataclass
class ParticleGibbsChain:
    """The particle-Gibbs chain: one state (particle and its path) per iteration, and each
    iteration's run record when the chain ran with ``record=``."""

    particles: list[Model]
    trajectories: list[Trajectory]
    records: list[dict[str, Any]] = field(default_factory=list)

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
    **run: Any,
) -> ParticleGibbsChain:
    """Particle Gibbs (ADH 2010, §4.3): iterate ``csmc_standard``, each time pinning the
    previous state, and keep the particle K ∝ w_T^K drawn from each run.

    Without a ``reference`` the first run is unconditional. The chain's states have
    the exact posterior as their stationary law (Theorem 5 of ADH 2010); discard a
    burn-in as for any MCMC chain. ``ess_threshold = 0`` never resamples inside a run:
    each iteration is then conditional importance sampling, still a valid kernel.

    ``**run`` are the run options (:mod:`llamppl.inference.options`): ``seed`` fixes the
    whole chain; ``progress`` shows one bar over the iterations; ``max_steps`` bounds each
    run; ``record=True`` keeps every iteration's run record on ``chain.records`` (a path
    also writes the last iteration's record there, for the viewer).
    """
    check_model(model)
    n = check_positive_int("n_particles", n_particles)
    n_iterations = check_positive_int("n_iterations", n_iterations)
    options = options_from("particle_gibbs", run)
    rng = options.rng
    ref = _as_trajectory(reference)
    per_run = RunOptions(
        rng=rng,
        progress=False,
        record=None if options.record is None else RecordTarget(),
        max_steps=options.max_steps,
    )
    states: list[Model] = []
    paths: list[Trajectory] = []
    records: list[dict[str, Any]] = []
    bar = Progress(options.progress, "particle_gibbs", unit="iteration")
    try:
        for _ in range(n_iterations):
            res = await _conditional_run(model, n, ref, ess_threshold, per_run)
            w = res.weights
            if not w.sum() > 0:
                raise ValueError(
                    "particle_gibbs: every particle of the unconditional first run has weight "
                    "zero; give a reference path or more particles"
                )
            k = int(rng.choice(len(w), p=w / w.sum()))
            ref = res.trajectories[k]
            states.append(res.particles[k])
            paths.append(ref)
            if res.record is not None:
                records.append(res.record)
            bar.update(ess=f"{res.ess:.1f}")
    finally:
        bar.close()
    if options.record is not None:
        for path in options.record.paths:
            write_json(records[-1], path)
    return ParticleGibbsChain(states, paths, records)
