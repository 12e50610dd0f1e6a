"""``StepInfo``: what one engine step did, built in one place (:func:`step_info`).

Every engine returns ``(particles, StepInfo)`` from its ``step``; the loop hands the
info to its observers (history, run record, progress bar). An info is always built
by :func:`step_info` from keywords, so a field added later cannot shift the others::

    info = step_info(t, w, population, ancestors=ancestors)
    info.ess, info.resampled, info.log_ml, info.n_live
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from llamppl.modeling import Model
from llamppl.weights import ess, logsumexp

__all__ = ["StepInfo", "step_info"]


@dataclass(frozen=True)
class StepInfo:
    """What one engine step did (one entry of ``SMCResult.history``).

    ``ess`` is measured after reweighting and before resampling; ``ancestors``
    (indices into this step's population ``particles``, or the kept candidates for
    ``smc_steer``) is None when no resampling happened; ``log_ml`` is the running
    log Ẑ; ``n_live`` counts particles still stepping after the step.

    The remaining fields feed the run record and are not shown: ``log_weights``
    of ``particles`` (this step's population after reweighting, before
    resampling) and ``origins`` (for each of them, the index of the particle at the
    start of the step it was extended from; None when it is the same index). The
    history keeps the summary without ``particles`` (:meth:`summary`).
    """

    step: int
    ess: float
    resampled: bool
    ancestors: np.ndarray | None
    log_ml: float
    n_live: int
    log_weights: np.ndarray | None = field(default=None, repr=False, compare=False)
    particles: tuple[Model, ...] | None = field(default=None, repr=False, compare=False)
    origins: tuple[int, ...] | None = field(default=None, repr=False, compare=False)

    def summary(self) -> StepInfo:
        """This info without the population (what ``SMCResult.history`` keeps: no particle stays alive)."""
        return replace(self, particles=None, origins=None)


def step_info(
    step: int,
    log_weights: np.ndarray,
    population: Sequence[Model],
    *,
    survivors: Sequence[Model] | None = None,
    ancestors: np.ndarray | None = None,
    n_slots: int | None = None,
    origins: Sequence[int] | None = None,
) -> StepInfo:
    """The :class:`StepInfo` of a step whose reweighted ``population`` has ``log_weights``.

    ``survivors`` is the population the step returns (default ``population``: nothing was
    resampled), from which ``n_live`` is counted; ``ancestors`` the resampling's indices
    into ``population`` (None: no resampling). The running log Ẑ is
    ``log (1/N) Σ_i w_i`` with N = ``n_slots`` (default ``len(population)``), the
    estimate every engine keeps unbiased.
    """
    n = len(population) if n_slots is None else n_slots
    after = population if survivors is None else survivors
    return StepInfo(
        step=step,
        ess=ess(log_weights),
        resampled=ancestors is not None,
        ancestors=ancestors,
        log_ml=logsumexp(log_weights) - math.log(n) if n else -math.inf,
        n_live=sum(not p.done_stepping() for p in after),
        log_weights=log_weights,
        particles=tuple(population),
        origins=None if origins is None else tuple(origins),
    )
