"""``Generation``: one generated continuation (tokens, text, log-likelihood), the output record
that the sequence-sampling programs return (power sampling, MH power sampling, SMC-SD).

::

    from llamppl.models.generation import Generation
    out = Generation.from_tokens(lm, tokens, log_likelihood)   # text decoded without the final EOS
    out.text, out.tokens, out.mean_log_likelihood
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from llamppl.lm.base import LanguageModel

__all__ = ["Generation"]


@dataclass
class Generation:
    """One generated continuation.

    Attributes
    ----------
    tokens : list[int]
        Generated ids, the EOS id included when it was emitted.
    text : str
        Decoded generated text without the final EOS.
    log_likelihood : float
        ``log p(y | x)`` of ``tokens`` under the base LM (τ = 1).
    """

    tokens: list[int]
    text: str
    log_likelihood: float

    @classmethod
    def from_tokens(
        cls, lm: LanguageModel, tokens: Sequence[int], log_likelihood: float
    ) -> Generation:
        """The continuation ``tokens`` of ``lm``, its text decoded without a final EOS."""
        body = tokens[:-1] if tokens and tokens[-1] in lm.eos_token_ids else tokens
        return cls(list(tokens), lm.decode(list(body)), float(log_likelihood))

    @property
    def mean_log_likelihood(self) -> float:
        """Per-token log-likelihood ``log p(y|x) / |y|`` (``nan`` for an empty output)."""
        return self.log_likelihood / len(self.tokens) if self.tokens else float("nan")
