"""Distributions a ``Model`` can ``sample`` from and ``observe``.

Every distribution implements ``async sample(rng=None) -> (value, log_prob)``
and ``async log_prob(value) -> float``; distributions with finite support also
implement ``async support() -> list[(value, log_prob)]`` (positive-probability
values only), which :func:`~llamppl.inference.enumerate_exact` uses::

    from llamppl import Bernoulli, Categorical
    value, logp = await Bernoulli(0.3).sample()
    await Categorical([0.2, 0.8]).log_prob(1)      # log 0.8

LM-backed distributions (:class:`TokenCategorical`, :class:`Transformer`, and the
context distributions of :class:`~llamppl.LMContext`) work on ``Token`` values.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from ..rng import current_rng
from ..row_sampling import gather_row, sample_index, sample_row
from ..token import Token
from ..validation import check_unit_interval

__all__ = [
    "Distribution",
    "Bernoulli",
    "Categorical",
    "Geometric",
    "Uniform",
    "Dirac",
    "TokenCategorical",
    "Transformer",
    "token_support",
]


def _log(x: float) -> float:
    return math.log(x) if x > 0 else -math.inf


class Distribution:
    """Base class: ``sample``, ``log_prob`` and (for finite support) ``support``."""

    async def sample(self, rng: np.random.Generator | None = None) -> tuple[Any, float]:
        """Draw a value; return ``(value, log_prob(value))``."""
        raise NotImplementedError(f"{type(self).__name__} must implement sample()")

    async def log_prob(self, value: Any) -> float:
        """Natural-log probability (mass) of ``value``."""
        raise NotImplementedError(f"{type(self).__name__} must implement log_prob()")

    async def support(self) -> list[tuple[Any, float]]:
        """Every value of positive probability with its log-probability (finite support only)."""
        raise NotImplementedError(
            f"{type(self).__name__} does not enumerate its support; enumerate_exact needs finite-support distributions"
        )


class Bernoulli(Distribution):
    """``True`` with probability ``p``."""

    def __init__(self, p: float) -> None:
        self.p = check_unit_interval("p", p, open_left=False)

    async def sample(self, rng=None):
        value = bool((rng or current_rng()).random() < self.p)
        return value, await self.log_prob(value)

    async def log_prob(self, value):
        return _log(self.p) if value else _log(1.0 - self.p)

    async def support(self):
        return [(v, lp) for v in (True, False) if (lp := await self.log_prob(v)) > -math.inf]

    def __repr__(self) -> str:
        return f"Bernoulli({self.p})"


class Categorical(Distribution):
    """Index ``i`` with probability ``probs[i]`` (normalised here); or give ``logits=``."""

    def __init__(
        self, probs: Sequence[float] | None = None, *, logits: Sequence[float] | None = None
    ) -> None:
        if (probs is None) == (logits is None):
            raise ValueError("Categorical needs exactly one of probs or logits")
        if probs is not None:
            p = np.asarray(
                torch.as_tensor(probs).tolist() if isinstance(probs, torch.Tensor) else probs,
                dtype=np.float64,
            )
            if p.ndim != 1 or p.size == 0:
                raise ValueError(f"probs must be a non-empty 1-D sequence, got shape {p.shape}")
            if np.isnan(p).any() or (p < 0).any() or np.isinf(p).any():
                raise ValueError(f"probs must be finite and non-negative, got {p.tolist()}")
            if p.sum() <= 0:
                raise ValueError(
                    "probs must not be all zero (the distribution would have no support)"
                )
            with np.errstate(divide="ignore"):
                self.log_probs = np.log(p / p.sum())
        else:
            lg = np.asarray(
                torch.as_tensor(logits).tolist() if isinstance(logits, torch.Tensor) else logits,
                dtype=np.float64,
            )
            if lg.ndim != 1 or lg.size == 0:
                raise ValueError(f"logits must be a non-empty 1-D sequence, got shape {lg.shape}")
            if np.isnan(lg).any() or np.isposinf(lg).any() or np.isneginf(lg).all():
                raise ValueError("logits must be finite or -inf, not NaN/+inf, and not all -inf")
            m = lg.max()
            self.log_probs = lg - (m + np.log(np.exp(lg - m).sum()))

    async def sample(self, rng=None):
        i = sample_index(torch.from_numpy(self.log_probs), rng or current_rng())
        return i, float(self.log_probs[i])

    async def log_prob(self, value):
        i = int(value)
        return float(self.log_probs[i]) if 0 <= i < self.log_probs.size else -math.inf

    async def support(self):
        return [(i, float(lp)) for i, lp in enumerate(self.log_probs) if lp > -math.inf]

    def __repr__(self) -> str:
        return f"Categorical({np.round(np.exp(self.log_probs), 4).tolist()})"


class Geometric(Distribution):
    """Number of failures before the first success: ``P(k) = (1-p)^k p`` for k = 0, 1, ...

    The support is infinite, so it cannot be enumerated; programs that need
    exact enumeration should bound their loop (e.g. ``max_hole_tokens``).
    """

    def __init__(self, p: float) -> None:
        self.p = check_unit_interval("p", p)

    async def sample(self, rng=None):
        k = int((rng or current_rng()).geometric(self.p)) - 1
        return k, await self.log_prob(k)

    async def log_prob(self, value):
        k = int(value)
        if k < 0:
            return -math.inf
        return k * _log(1.0 - self.p) + math.log(self.p) if k else math.log(self.p)

    def __repr__(self) -> str:
        return f"Geometric({self.p})"


class Uniform(Distribution):
    """Uniform over a finite, non-empty collection of distinct values."""

    def __init__(self, values: Sequence[Any]) -> None:
        values = list(values)
        if not values:
            raise ValueError("values must be a non-empty collection (Uniform needs support)")
        self.values = values
        self._lp = -math.log(len(values))

    async def sample(self, rng=None):
        return self.values[int((rng or current_rng()).integers(len(self.values)))], self._lp

    async def log_prob(self, value):
        return self._lp * 1.0 if value in self.values else -math.inf

    async def support(self):
        return [(v, self._lp) for v in self.values]

    def __repr__(self) -> str:
        return f"Uniform({self.values!r})"


class Dirac(Distribution):
    """Point mass at ``value``."""

    def __init__(self, value: Any) -> None:
        self.value = value

    async def sample(self, rng=None):
        return self.value, 0.0

    async def log_prob(self, value):
        return 0.0 if value == self.value else -math.inf

    async def support(self):
        return [(self.value, 0.0)]

    def __repr__(self) -> str:
        return f"Dirac({self.value!r})"


class TokenCategorical(Distribution):
    """Distribution over ``Token`` values of ``lm`` with the given (unnormalised) logits ``[vocab_size]``."""

    def __init__(self, lm, logits: torch.Tensor) -> None:
        logits = torch.as_tensor(logits)
        if logits.shape != (lm.vocab_size,):
            raise ValueError(
                f"logits must have shape ({lm.vocab_size},), got {tuple(logits.shape)}"
            )
        if torch.isnan(logits).any() or not torch.isfinite(logits).any():
            raise ValueError("logits must contain no NaN and at least one finite entry")
        self.lm = lm
        self.log_probs = torch.log_softmax(logits, dim=-1)

    async def sample(self, rng=None):
        i, log_p = await sample_row(self.log_probs, rng or current_rng())
        return Token(self.lm, i), log_p

    async def log_prob(self, value):
        return await gather_row(self.log_probs, int(value))

    async def support(self):
        return token_support(self.lm, self.log_probs)


class Transformer(Distribution):
    """The LM's next-token distribution after ``prompt`` (token ids), optionally tempered.

    Unlike ``LMContext.next_token()`` it does not grow any context.
    """

    def __init__(self, lm, prompt: str | Sequence[int], temp: float = 1.0) -> None:
        from ..lm.base import validate_token_ids

        self.lm = lm
        if isinstance(prompt, str):  # text, encoded with BOS first as LMContext does
            bos = lm.bos_token_id
            prompt = ([] if bos is None else [bos]) + list(lm.encode(prompt))
        self.prompt = validate_token_ids(prompt, lm.vocab_size, "prompt")
        if not temp > 0 or not math.isfinite(temp):
            raise ValueError(f"temp must be a positive finite number, got {temp}")
        self.temp = float(temp)

    async def _log_probs(self) -> torch.Tensor:
        lp = await self.lm.next_token_logprobs(self.prompt)
        return lp if self.temp == 1.0 else torch.log_softmax(lp / self.temp, dim=-1)

    async def sample(self, rng=None):
        i, log_p = await sample_row(await self._log_probs(), rng or current_rng())
        return Token(self.lm, i), log_p

    async def log_prob(self, value):
        return await gather_row(await self._log_probs(), int(value))

    async def support(self):
        return token_support(self.lm, await self._log_probs())


def token_support(lm, log_probs: torch.Tensor) -> list[tuple[Token, float]]:
    """``support()`` of a next-token distribution: each token id of positive probability, as a Token."""
    ids = torch.nonzero(log_probs > -math.inf).flatten().tolist()
    values = log_probs[ids].tolist()
    return [(Token(lm, i), v) for i, v in zip(ids, values)]
