"""Shared machinery of the inference loops: argument checks, stepping a population
concurrently (so one step's LM requests become one batch), progress and LM counters.
"""

from __future__ import annotations

import asyncio
import inspect
import os
import sys
import time
from collections.abc import Iterable

import numpy as np

from llamppl.lm.base import LanguageModel
from llamppl.modeling import Model
from llamppl.weights import check_no_nan, logsumexp

__all__ = [
    "check_model",
    "step_all",
    "start_all",
    "log_weights",
    "merge_duplicates",
    "merge_counted",
    "Progress",
    "LMCounters",
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


def merge_counted(particles: list[Model], counts: list[int]) -> tuple[list[Model], list[int]]:
    """Merge particles with equal ``(state_key(), finished)``: weights and ``counts`` are summed.

    The first particle of each group stands for the group; ``counts[i]`` is how many
    unmerged particles particle i already represents (its multiplicity).
    """
    merged: dict[object, int] = {}
    out: list[Model] = []
    out_counts: list[int] = []
    for p, m in zip(particles, counts):
        key = (p.state_key(), p.finished)
        i = merged.get(key)
        if i is None:
            merged[key] = len(out)
            out.append(p)
            out_counts.append(m)
        else:
            q = out[i]
            q.weight = logsumexp(np.array([q.weight, p.weight]))
            out_counts[i] += m
    return out, out_counts


def merge_duplicates(particles: list[Model]) -> list[Model]:
    """Merge particles with equal ``state_key()`` into one whose weight is their summed weight."""
    return merge_counted(particles, [1] * len(particles))[0]


class Progress:
    """tqdm bar over inference steps; on when stderr is a TTY (or ``enabled=True``), off with LLAMPPL_PROGRESS=0."""

    def __init__(self, enabled: bool | None, desc: str) -> None:
        if enabled is None:
            enabled = sys.stderr.isatty() and os.environ.get("LLAMPPL_PROGRESS", "1") != "0"
        self.bar = None
        if enabled:
            from tqdm.auto import tqdm

            self.bar = tqdm(desc=desc, unit="step", leave=True)

    def update(self, **postfix: object) -> None:
        if self.bar is not None:
            self.bar.update(1)
            self.bar.set_postfix(postfix, refresh=False)

    def observe(self, info) -> None:
        """Advance by one engine step (an observer of the loop): shows its ESS and live particles."""
        self.update(ess=f"{info.ess:.1f}", live=info.n_live)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


class LMCounters:
    """Snapshot of the work counters of every LM a model refers to, to report a run's LM work."""

    FIELDS = ("batch_calls", "forward_calls", "tokens_run", "cache_hits")

    def __init__(self, model: Model) -> None:
        self.lms = _find_lms(model)
        self.t0 = time.perf_counter()
        self.start = [self._read(lm) for lm in self.lms]

    @classmethod
    def _read(cls, lm: LanguageModel) -> dict[str, int]:
        return {f: getattr(lm.stats, f) for f in cls.FIELDS}

    def finish(self, **extra: object) -> dict[str, object]:
        stats: dict[str, object] = {"time_s": time.perf_counter() - self.t0, **extra}
        for lm, before in zip(self.lms, self.start):
            now = self._read(lm)
            for k, v in now.items():
                stats[k] = stats.get(k, 0) + v - before[k]
        return stats


def _find_lms(model: Model) -> list[LanguageModel]:
    found: dict[int, LanguageModel] = {}

    def visit(obj: object, depth: int) -> None:
        if isinstance(obj, LanguageModel):
            found[id(obj)] = obj
        elif depth < 3:
            if isinstance(obj, (list, tuple)):
                for o in obj:
                    visit(o, depth + 1)
            elif isinstance(obj, dict):
                for o in obj.values():
                    visit(o, depth + 1)
            elif hasattr(obj, "__dict__") and not isinstance(obj, type):
                for o in vars(obj).values():
                    visit(o, depth + 1)

    visit(model, 0)
    return list(found.values())
