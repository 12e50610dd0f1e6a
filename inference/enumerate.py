"""``enumerate_exact``: the exact posterior and log Z of a finite program, by visiting every path.

Every ``sample`` must use a distribution with finite support (``support()``).
Each call of ``step`` is replayed from the particle's state at the start of the
step with a growing list of forced choices: when the program reaches a choice
beyond the list, the replay stops and branches on every value of positive
probability under the proposal. A path that picks v for ``sample(p, q)``
contributes q(v) · p(v)/q(v) = p(v) (so its weight gains log p(v));
observations, conditions and twists score as usual. Identical states are
merged after every step. The search is an engine (:class:`Enumeration`) run by the
shared loop, with one slot: its population is every distinct path, weighted by its
exact probability, so ``log_ml = log Σ_i w_i`` is log Z. This is the oracle the
tests compare every sampler against::

    exact = await enumerate_exact(model)
    exact.log_ml, exact.posterior
"""

from __future__ import annotations

import math
import warnings
from typing import Any

import numpy as np

from llamppl.distributions import Distribution
from llamppl.modeling import Model
from llamppl.validation import check_positive_int
from llamppl.weights import logsumexp

from .engine import Engine
from .options import RunOptions
from .particles import check_model, log_weights, merge_duplicates
from .result import SMCResult
from .step_info import StepInfo, step_info
from .steps import StepLimitError, run_population

__all__ = ["enumerate_exact", "Enumeration"]


class _Branch(BaseException):
    """Raised by a replay that reached a new choice point; carries the choice's support."""

    def __init__(self, values: list[Any]) -> None:
        self.values = values


class _Replay:
    """A chooser for ``Model.replaying``: feeds forced choices to ``sample``; ``_Branch`` at the first unforced one."""

    def __init__(self, forced: list[Any]) -> None:
        self.forced = forced
        self.position = 0

    async def choose(self, model: Model, dist: Distribution, proposal: Distribution | None) -> Any:
        if self.position == len(self.forced):
            support = await (proposal or dist).support()
            if not support:
                raise ValueError(f"{type(proposal or dist).__name__} has empty support")
            raise _Branch([v for v, _ in support])
        value = self.forced[self.position]
        self.position += 1
        if proposal is not None:
            await proposal.log_prob(value)  # same side effects as proposal.sample()
        model.score(await dist.log_prob(value))  # q(v) · p(v)/q(v)
        return value


async def _expand(particle: Model, hook: str) -> list[Model]:
    """All children of ``particle`` after one call of ``hook`` ("run_step" or "run_start")."""
    children, stack = [], [[]]
    while stack:
        forced = stack.pop()
        child = particle.clone()
        try:
            with child.replaying(_Replay(forced)):
                await getattr(child, hook)()
        except _Branch as branch:
            stack.extend(forced + [v] for v in reversed(branch.values))
            continue
        children.append(child)
    return children


def _settle(paths: list[Model]) -> list[Model]:
    """Merge identical paths; drop finished paths of weight zero (they add nothing to Z)."""
    return [p for p in merge_duplicates(paths) if not (p.done_stepping() and p.weight == -math.inf)]


class Enumeration(Engine):
    """Exact enumeration as an engine: each step expands every unfinished path on every
    value of its choices (finished paths are carried), then merges identical states."""

    name = "enumerate_exact"

    async def start(self, particles: list[Model]) -> list[Model]:
        children = [c for p in particles for c in await _expand(p, "run_start")]
        return _settle(children)

    async def step(
        self, particles: list[Model], t: int, rng: np.random.Generator
    ) -> tuple[list[Model], StepInfo]:
        paths: list[Model] = []
        for p in particles:
            paths += [p] if p.done_stepping() else await _expand(p, "run_step")
        paths = _settle(paths)
        return paths, step_info(t, log_weights(paths), paths, n_slots=1)


async def enumerate_exact(model: Model, max_steps: int | None = None) -> SMCResult:
    """Exact posterior over final particles and exact ``log_ml = log Z``.

    ``max_steps`` truncates the program: paths still running after that many steps
    are kept as final states (the Feynman–Kac model with horizon ``max_steps``)
    and a warning says how much mass they carry.
    """
    check_model(model)
    if max_steps is not None:
        max_steps = check_positive_int("max_steps", max_steps)
    options = RunOptions(rng=np.random.default_rng(0), progress=False, max_steps=max_steps)
    try:
        result = await run_population(model, 1, Enumeration(), options)
    except StepLimitError as stopped:
        result = stopped.result
        live = [p for p in result.particles if not p.done_stepping()]
        mass = math.exp(logsumexp(log_weights(live)))
        warnings.warn(
            f"enumerate_exact stopped after max_steps={max_steps}; {len(live)} unfinished "
            f"paths (mass {mass:.3g}) kept as final",
            stacklevel=2,
        )
    result.stats["paths"] = len(result.particles)
    return result
