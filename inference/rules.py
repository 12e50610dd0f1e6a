"""Resampling rules as values: *when* an SMC step resamples, and *how*.

A rule looks at a step's reweighted log weights and returns the ancestor indices
of the next population, or ``None`` to keep the population as it is (blackjax's
resampling strategy, one object instead of flags in each engine)::

    rule = ess_rule(0.5, "systematic")      # ESS < N/2: systematic resampling
    ancestors = rule.ancestors(log_weights, rng)   # (N,) int indices, or None

- :class:`Never` — importance sampling (``ess_rule(0)`` is this rule).
- :class:`WhenESSBelow` — resample when ESS < ``threshold · N`` with a scheme of
  :mod:`llamppl.inference.resampling` (``smc_standard``, Power-SMC, SMC-SD).
- :class:`PinnedMultinomial` — conditional SMC (Andrieu, Doucet & Holenstein 2010,
  §4.3): slot 0 keeps its own ancestor (the reference path), the other N − 1 slots
  draw ancestors i.i.d. ∝ w; without a reference, slot 0 draws too.

Every rule returns ``None`` when every weight is zero (``-inf``): there is nothing to
resample from, and the run ends with ``log_ml = -inf``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from llamppl.validation import check_unit_interval
from llamppl.weights import ess, logsumexp, normalize

from .resampling import get_resampler

__all__ = ["ResampleRule", "Never", "WhenESSBelow", "PinnedMultinomial", "ess_rule"]


class ResampleRule:
    """Base of the rules: ``ancestors(log_weights, rng) -> indices | None``."""

    def ancestors(self, log_weights: np.ndarray, rng: np.random.Generator) -> np.ndarray | None:
        raise NotImplementedError(f"{type(self).__name__} must implement ancestors()")


@dataclass(frozen=True)
class Never(ResampleRule):
    """Never resample: sequential importance sampling, stepped like SMC."""

    def ancestors(self, log_weights: np.ndarray, rng: np.random.Generator) -> None:
        return None


@dataclass(frozen=True)
class WhenESSBelow(ResampleRule):
    """Resample with ``scheme`` when ESS < ``threshold · N`` (threshold in (0, 1]).

    With ``threshold = 1`` every step resamples unless all weights are equal.
    """

    threshold: float
    scheme: str = "systematic"

    def __post_init__(self) -> None:
        check_unit_interval("ess_threshold", self.threshold)
        get_resampler(self.scheme)  # ValueError listing the valid names

    def ancestors(self, log_weights: np.ndarray, rng: np.random.Generator) -> np.ndarray | None:
        n = len(log_weights)
        if logsumexp(log_weights) == -np.inf or ess(log_weights) >= self.threshold * n:
            return None
        return get_resampler(self.scheme)(log_weights, rng, n)


@dataclass(frozen=True)
class PinnedMultinomial(ResampleRule):
    """Conditional multinomial resampling when ESS < ``threshold · N`` (ADH 2010, §4.3).

    Slot 0 keeps ancestor 0 when ``pinned`` (a reference path occupies it); the other
    N − 1 slots draw i.i.d. ∝ w. Unpinned, slot 0 draws ∝ w as well (plain multinomial
    resampling, the first run of particle Gibbs). The ESS test is a symmetric function
    of the weights, so the conditional construction holds for any threshold; with
    ``threshold = 0`` nothing is resampled and one particle Gibbs iteration is
    conditional importance sampling (Andrieu, Lee & Vihola 2018), which also leaves the
    posterior invariant.
    """

    threshold: float
    pinned: bool

    def __post_init__(self) -> None:
        check_unit_interval("ess_threshold", self.threshold, open_left=False)

    def ancestors(self, log_weights: np.ndarray, rng: np.random.Generator) -> np.ndarray | None:
        n = len(log_weights)
        if logsumexp(log_weights) == -np.inf or ess(log_weights) >= self.threshold * n:
            return None
        p = normalize(log_weights)
        free = rng.choice(n, size=n - 1, p=p) if n > 1 else []
        first = [0] if self.pinned else [int(rng.choice(n, p=p))]
        return np.asarray(first + list(free), dtype=np.int64)


def ess_rule(ess_threshold: float, resampling: str = "systematic") -> ResampleRule:
    """The rule of ``smc_standard``'s arguments: :class:`Never` for ``ess_threshold = 0``,
    else :class:`WhenESSBelow` (``ValueError`` naming the argument outside [0, 1] or for an
    unknown scheme)."""
    threshold = check_unit_interval("ess_threshold", ess_threshold, open_left=False)
    get_resampler(resampling)
    return Never() if threshold == 0 else WhenESSBelow(threshold, resampling)
