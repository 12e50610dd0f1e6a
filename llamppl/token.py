"""``Token``: a sampled vocabulary item, and exact inverse-CDF sampling from log-probs.

A ``Token`` compares equal to its integer id and to any other ``Token`` with the
same id; ``str(token)`` is its text::

    tok = Token(lm, 42)
    tok == 42, int(tok), str(tok)
"""

from __future__ import annotations

import numpy as np
import torch

__all__ = ["Token", "sample_index"]


class Token:
    """A token id together with the language model that gives it meaning."""

    __slots__ = ("lm", "token_id")

    def __init__(self, lm, token_id: int) -> None:
        self.lm = lm
        self.token_id = int(token_id)

    @property
    def token_str(self) -> str:
        return self.lm.vocab[self.token_id]

    def __str__(self) -> str:
        return self.token_str

    def __repr__(self) -> str:
        return f"<Token {self.token_id} {self.token_str!r}>"

    def __int__(self) -> int:
        return self.token_id

    __index__ = __int__

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Token):
            return self.token_id == other.token_id
        if isinstance(other, (int, np.integer)) and not isinstance(other, bool):
            return self.token_id == int(other)
        if isinstance(other, str):  # LLaMPPL: a token equals its text
            return self.token_str == other
        return NotImplemented

    def __hash__(self) -> int:
        return hash(self.token_id)

    def __deepcopy__(self, memo) -> Token:
        return self  # immutable; shares the LM


def sample_index(log_probs: torch.Tensor, rng: np.random.Generator) -> int:
    """Draw an index with probability ``exp(log_probs)`` (normalised or not) by inverse CDF.

    One uniform comes from ``rng``; the cumulative sum stays on the tensor's
    device. Zero-probability entries are never chosen.
    """
    probs = torch.exp(log_probs - log_probs.max())  # (V,)
    cdf = torch.cumsum(probs, dim=0)
    u = float(rng.random()) * float(cdf[-1])
    idx = int(
        torch.searchsorted(cdf, torch.tensor([u], dtype=cdf.dtype, device=cdf.device), right=True)
    )
    idx = min(idx, probs.numel() - 1)
    if (
        probs[idx] <= 0
    ):  # u landed on the float boundary at the very top: take the last possible entry
        idx = int(torch.nonzero(probs > 0)[-1])
    return idx
