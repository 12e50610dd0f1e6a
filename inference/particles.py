"""Operations on a population of particles, shared by the engines.

Checking a program (:func:`check_model`), running every particle's hook
concurrently so that one step's LM requests become one batch (:func:`start_all`,
:func:`step_all`), reading the log weights (:func:`log_weights`, NaN refused),
merging identical particles (:func:`merge_counted`) and building the resampled
population (:func:`resample_population`)::

    await step_all(particles)
    w = log_weights(particles)                       # (N,) float64
    particles = resample_population(particles, ancestors, logmeanexp(w))
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Iterable

import numpy as np

from llamppl.modeling import Model
from llamppl.weights import check_no_nan, logsumexp

__all__ = [
    "check_model",
    "step_all",
    "start_all",
    "log_weights",
    "merge_duplicates",
    "merge_counted",
    "group_indices",
    "resample_population",
]


def check_model(model: object) -> Model:
    """``model`` must be a ``Model`` instance whose class defines ``step`` (async or plain)."""
    if not isinstance(model, Model):
        raise TypeError(
            f"model must be an instance of a llamppl.Model subclass, got {type(model).__name__}"
        )
    step = getattr(type(model), "step", None)
    if step is Model.step:
        raise TypeError(f"model: {type(model).__name__} must define a step() method")
    if (
        not inspect.isfunction(step)
        or inspect.isgeneratorfunction(step)
        or inspect.isasyncgenfunction(step)
    ):
        raise TypeError(
            f"model: {type(model).__name__}.step must be an `async def` or plain `def` method"
        )
    return model


async def start_all(particles: Iterable[Model]) -> None:
    """Run every particle's ``start`` hook concurrently."""
    await asyncio.gather(*(p.run_start() for p in particles))


async def step_all(particles: Iterable[Model]) -> None:
    """One ``step`` of every particle that is not done, concurrently (one LM batch)."""
    live = [p for p in particles if not p.done_stepping()]
    if len(live) == 1:
        await live[0].run_step()
    elif live:
        await asyncio.gather(*(p.run_step() for p in live))


def log_weights(particles: list[Model]) -> np.ndarray:
    w = np.fromiter((p.weight for p in particles), dtype=np.float64, count=len(particles))
    check_no_nan(w, "particle log weights")
    return w


def group_indices(particles: list[Model]) -> list[list[int]]:
    """Indices of the particles with equal ``(state_key(), finished)``, one list per group, in
    order of first appearance (the groups :func:`merge_counted` merges)."""
    groups: dict[object, list[int]] = {}
    for i, p in enumerate(particles):
        groups.setdefault((p.state_key(), p.finished), []).append(i)
    return list(groups.values())


def merge_counted(
    particles: list[Model], counts: list[int], groups: list[list[int]] | None = None
) -> tuple[list[Model], list[int]]:
    """Merge particles with equal ``(state_key(), finished)``: weights and ``counts`` are summed.

    The first particle of each group stands for the group; ``counts[i]`` is how many
    unmerged particles particle i already represents (its multiplicity). ``groups``, when
    given, is :func:`group_indices` of ``particles`` (already computed).
    """
    out: list[Model] = []
    out_counts: list[int] = []
    for members in group_indices(particles) if groups is None else groups:
        q = particles[members[0]]
        for i in members[1:]:
            q.weight = logsumexp(np.array([q.weight, particles[i].weight]))
        out.append(q)
        out_counts.append(sum(counts[i] for i in members))
    return out, out_counts


def merge_duplicates(particles: list[Model]) -> list[Model]:
    """Merge particles with equal ``state_key()`` into one whose weight is their summed weight."""
    return merge_counted(particles, [1] * len(particles))[0]


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
