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
keyword are ours. LLaMPPL's ``RESAMPLING_METHODS`` / :func:`get_resampling_fn` /
``*_resample(weights)`` and ``resampling_method=`` are aliases at the API edge
(the section at the end), over the same schemes.
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
    "multinomial_resample",
    "stratified_resample",
    "systematic_resample",
    "residual_resample",
    "RESAMPLING_METHODS",
    "get_resampling_fn",
    "resampling_name",
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


# ---------------------------------------------------------------------- LLaMPPL adapter
# LLaMPPL's form: ``fn(weights)`` with *normalised* probabilities, randomness from NumPy's
# global state (``np.random.seed``), returning ``len(weights)`` indices.
def _llamppl_form(scheme: Resampler, name: str) -> Callable[[np.ndarray], np.ndarray]:
    def resample(weights) -> np.ndarray:
        w = np.asarray(weights, dtype=np.float64)
        if w.ndim != 1 or w.size == 0 or np.isnan(w).any() or (w < 0).any():
            raise ValueError(f"weights must be a non-empty 1-D array of probabilities, got {w}")
        rng = np.random.default_rng(np.random.randint(2**32))  # seeded by np.random.seed
        with np.errstate(divide="ignore"):
            return scheme(np.log(w), rng)

    resample.__name__ = f"{name}_resample"
    resample.__doc__ = (
        f"LLaMPPL name: :func:`{name}` on normalised ``weights`` (NumPy's global RNG)."
    )
    return resample


multinomial_resample = _llamppl_form(multinomial, "multinomial")
stratified_resample = _llamppl_form(stratified, "stratified")
systematic_resample = _llamppl_form(systematic, "systematic")
residual_resample = _llamppl_form(residual, "residual")
RESAMPLING_METHODS: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "systematic": systematic_resample,
    "stratified": stratified_resample,
    "residual": residual_resample,
    "multinomial": multinomial_resample,
}


def resampling_name(resampling: str, resampling_method: str | None) -> str:
    """The scheme's name from ``resampling=`` or its LLaMPPL alias ``resampling_method=``.

    ``ValueError`` when both are given and differ (``resampling`` left at its default
    ``"systematic"`` counts as not given).
    """
    if resampling_method is None:
        return resampling
    if resampling != "systematic" and resampling != resampling_method:
        raise ValueError(
            "give resampling= or resampling_method= (its LLaMPPL name), not both: "
            f"{resampling!r} vs {resampling_method!r}"
        )
    return resampling_method


def get_resampling_fn(method: str) -> Callable[[np.ndarray], np.ndarray]:
    """LLaMPPL name: the ``RESAMPLING_METHODS`` entry ``method``; ``ValueError`` otherwise."""
    if method not in RESAMPLING_METHODS:
        raise ValueError(
            f"Unknown resampling method {method!r}: must be one of {', '.join(RESAMPLING_METHODS)}"
        )
    return RESAMPLING_METHODS[method]
