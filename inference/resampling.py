"""Resampling schemes as pure functions ``(log_weights, rng, n) -> ancestor indices``.

Each scheme returns ``n`` indices (default ``len(log_weights)``) whose expected
counts are ``n · w_i`` for normalised weights ``w``. Zero-weight (``-inf``)
particles are never chosen. Schemes are looked up by name::

    from llamppl.inference.resampling import get_resampler
    ancestors = get_resampler("systematic")(log_weights, np.random.default_rng(0))

``multinomial`` draws i.i.d.; ``stratified`` one uniform per stratum;
``systematic`` one shared uniform; ``residual`` keeps ``floor(n w_i)`` copies and
draws the remainder multinomially (the last three have lower variance).

Names: ``RESAMPLERS`` / :func:`get_resampler` and the engines' ``resampling=``
keyword. (LLaMPPL's ``RESAMPLING_METHODS``, ``get_resampling_fn`` and ``*_resample(weights)``
are adapters over these schemes in :mod:`llamppl.compat`.)
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from llamppl.weights import normalize

__all__ = [
    "Resampler",
    "ancestors_at",
    "multinomial",
    "stratified",
    "systematic",
    "residual",
    "RESAMPLERS",
    "get_resampler",
]

Resampler = Callable[[np.ndarray, np.random.Generator, "int | None"], np.ndarray]


def _probabilities(log_weights: np.ndarray) -> np.ndarray:
    w = normalize(np.asarray(log_weights, dtype=np.float64))
    if w.sum() <= 0:
        raise ValueError("cannot resample: every particle has weight zero (log weight -inf)")
    return w


def ancestors_at(w: np.ndarray, u: np.ndarray) -> np.ndarray:
    """Ancestor index at each point ``u`` of [0, 1): i with cdf[i-1] <= u < cdf[i] (inverse CDF).

    ``w`` are normalised weights; zero-weight entries never match.
    """
    cdf = np.cumsum(w)
    cdf[-1] = 1.0  # guard against round-off leaving u >= cdf[-1]
    return np.searchsorted(cdf, u, side="right").astype(np.int64)


def multinomial(
    log_weights: np.ndarray, rng: np.random.Generator, n: int | None = None
) -> np.ndarray:
    """``n`` i.i.d. draws from the normalised weights (sorted)."""
    w = _probabilities(log_weights)
    n = w.size if n is None else n
    return ancestors_at(w, np.sort(rng.random(n)))


def stratified(
    log_weights: np.ndarray, rng: np.random.Generator, n: int | None = None
) -> np.ndarray:
    """One uniform in each stratum ``[j/n, (j+1)/n)``."""
    w = _probabilities(log_weights)
    n = w.size if n is None else n
    return ancestors_at(w, (np.arange(n) + rng.random(n)) / n)


def systematic(
    log_weights: np.ndarray, rng: np.random.Generator, n: int | None = None
) -> np.ndarray:
    """One shared uniform offset: points ``(j + u)/n``."""
    w = _probabilities(log_weights)
    n = w.size if n is None else n
    return ancestors_at(w, (np.arange(n) + rng.random()) / n)


def residual(log_weights: np.ndarray, rng: np.random.Generator, n: int | None = None) -> np.ndarray:
    """``floor(n w_i)`` copies of each particle, the remaining draws multinomial on the residuals."""
    w = _probabilities(log_weights)
    n = w.size if n is None else n
    counts = np.floor(n * w).astype(np.int64)
    deterministic = np.repeat(np.arange(w.size), counts)
    rest = n - int(counts.sum())
    if rest == 0:
        return deterministic
    r = n * w - counts
    extra = ancestors_at(r / r.sum(), np.sort(rng.random(rest)))
    return np.sort(np.concatenate([deterministic, extra]))


RESAMPLERS: dict[str, Resampler] = {
    "multinomial": multinomial,
    "stratified": stratified,
    "systematic": systematic,
    "residual": residual,
}


def get_resampler(name: str) -> Resampler:
    """The scheme called ``name``; ``ValueError`` listing valid names otherwise."""
    try:
        return RESAMPLERS[name]
    except (KeyError, TypeError):
        raise ValueError(f"resampling must be one of {sorted(RESAMPLERS)}, got {name!r}") from None
