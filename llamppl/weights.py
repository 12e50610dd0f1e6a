"""Log-space weight arithmetic in one place: ``logsumexp``, ``normalize``, ``ess``.

Weights are natural-log importance weights held in NumPy ``float64`` arrays.
``-inf`` is a legal weight (a particle that failed a condition); NaN never is::

    from llamppl.weights import normalize, ess
    w = np.array([0.0, -np.inf, np.log(3.0)])
    normalize(w)   # array([0.25, 0.  , 0.75])
    ess(w)         # 1.6
"""

from __future__ import annotations

import numpy as np

__all__ = ["logsumexp", "logmeanexp", "normalize", "ess", "check_no_nan"]


def check_no_nan(log_weights: np.ndarray, where: str = "log weights") -> None:
    """Raise ``FloatingPointError`` if any weight is NaN (a bug, never a legal state)."""
    if np.isnan(log_weights).any():
        raise FloatingPointError(f"NaN in {where}: {log_weights}")


def logsumexp(log_weights: np.ndarray) -> float:
    """``log Σ exp(w)``; ``-inf`` when every weight is ``-inf`` or the array is empty."""
    w = np.asarray(log_weights, dtype=np.float64)
    if w.size == 0:
        return -np.inf
    m = np.max(w)
    if m == -np.inf:
        return -np.inf
    if m == np.inf:
        raise FloatingPointError("a log weight is +inf")
    return float(m + np.log(np.sum(np.exp(w - m))))


def logmeanexp(log_weights: np.ndarray) -> float:
    """``log((1/n) Σ exp(w))``."""
    w = np.asarray(log_weights, dtype=np.float64)
    return logsumexp(w) - np.log(w.size) if w.size else -np.inf


def normalize(log_weights: np.ndarray) -> np.ndarray:
    """Normalised weights ``exp(w - logsumexp(w))``; all zeros if every weight is ``-inf``."""
    w = np.asarray(log_weights, dtype=np.float64)
    total = logsumexp(w)
    if total == -np.inf:
        return np.zeros_like(w)
    return np.exp(w - total)


def ess(log_weights: np.ndarray) -> float:
    """Effective sample size ``(Σ w)² / Σ w²``; 0 when every weight is ``-inf``."""
    w = normalize(log_weights)
    s = float(np.sum(w * w))
    return 1.0 / s if s > 0 else 0.0
