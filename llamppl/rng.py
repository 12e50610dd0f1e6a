"""Randomness as an argument: the generator that every random choice draws from.

Inference functions take ``seed=`` and install a ``numpy.random.Generator`` for
the duration of the run; distributions draw from :func:`current_rng` unless
given an explicit ``rng``. The generator lives in a ``contextvars.ContextVar``,
so every asyncio task of a run sees the run's generator and concurrent runs do
not share one::

    with using_rng(np.random.default_rng(0)):
        value, logp = await Bernoulli(0.3).sample()
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator

import numpy as np

from .validation import is_integer

__all__ = ["current_rng", "using_rng", "make_rng"]

_RNG: contextvars.ContextVar[np.random.Generator | None] = contextvars.ContextVar(
    "llamppl_rng", default=None
)
_FALLBACK = np.random.default_rng()


def make_rng(seed: int | np.random.Generator | None) -> np.random.Generator:
    """A ``numpy.random.Generator`` from ``seed`` (an int, a Generator, or None for fresh entropy)."""
    if isinstance(seed, np.random.Generator):
        return seed
    if seed is not None and not is_integer(seed):
        raise TypeError(f"seed must be an int, a numpy Generator or None, got {seed!r}")
    return np.random.default_rng(seed)


def current_rng() -> np.random.Generator:
    """The generator installed by the running inference call (or a process-wide fallback)."""
    rng = _RNG.get()
    return _FALLBACK if rng is None else rng


@contextlib.contextmanager
def using_rng(rng: np.random.Generator) -> Iterator[np.random.Generator]:
    """Install ``rng`` as :func:`current_rng` inside the ``with`` block."""
    token = _RNG.set(rng)
    try:
        yield rng
    finally:
        _RNG.reset(token)
