"""``PowerLawProposal``: the power-law sampler as an exact SMC proposal over a context's next token.

The proposal density is ``softmax(PL-1)`` of the context's next-token
probabilities for the particle's own adaptive target (PL-2), optionally mixed
with the LM (defensive importance sampling). Its log-density is exact, so the
weight ``p(v) / q(v)`` is exact and SMC still targets the program's posterior::

    from llamppl.decoding import PowerLawProposal, PowerLawSampler
    sampler = PowerLawSampler(target=0.2, width=0.1, min_p=0.05)
    token = await self.sample(ctx.next_token(), proposal=PowerLawProposal(ctx, sampler, defensive=0.1))
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import torch

from llamppl.context import LMContext, LMNextToken
from llamppl.distributions import Distribution
from llamppl.rng import current_rng
from llamppl.row_sampling import gather_row, sample_row
from llamppl.token import Token
from llamppl.validation import check_real_range

if TYPE_CHECKING:  # imported where used: the sampler is a transformers LogitsProcessor
    from llamppl.decoding.power_law.sampler import PowerLawSampler

__all__ = ["PowerLawProposal", "power_law_history"]

_HISTORY_ATTR = "_power_law_history"


def power_law_history(context: LMContext) -> tuple[float, ...]:
    """Original probabilities of the tokens a :class:`PowerLawProposal` chose in ``context`` (oldest first).

    At most the last ``queue_size`` entries are kept. The tuple lives on the
    context, so it is copied with the particle by ``Model.clone()``.
    """
    return context.annotation(_HISTORY_ATTR, ())


class PowerLawProposal(Distribution):
    """The power-law distribution over the next token of ``context``, as an exact SMC proposal.

    Use it as ``await self.sample(context.next_token(), proposal=PowerLawProposal(context, sampler))``.
    With ``p`` the context's next-token distribution (tempered and masked like
    ``context.next_token()``) and ``q_PL = softmax(PL-1)`` of ``p`` for the adaptive
    target PL-2 of this particle's history, the proposal is

        q = (1 − ε) · q_PL + ε · p        (ε = ``defensive``, default 0: q = q_PL)

    and ``sample`` / ``log_prob`` return the exact ``log q(v)``, so the weight
    ``p(v) / q(v)`` is exact and SMC targets the program's posterior. A sampler
    with ``min_p`` gives zero ``q_PL`` mass to tokens the program can produce; it
    therefore needs ``defensive = ε > 0`` (defensive importance sampling: q covers
    p and ``p / q <= 1 / ε``), which is also the practical choice on a large
    vocabulary.

    The history (:func:`power_law_history`) is stored on the context and updated
    once per chosen token: by ``sample``, or by ``log_prob``, which — like
    ``LMNextToken.log_prob`` — treats its argument as the chosen value (this is
    how ``enumerate_exact`` replays a choice). ``support`` has no side effects.
    The proposal does not extend the context; the ``next_token()`` distribution
    passed to ``Model.sample`` does.
    """

    def __init__(
        self, context: LMContext, sampler: PowerLawSampler, defensive: float = 0.0
    ) -> None:
        if not isinstance(context, LMContext):
            raise TypeError(f"context must be an LMContext, got {type(context).__name__}")
        from llamppl.decoding.power_law.sampler import PowerLawSampler

        if not isinstance(sampler, PowerLawSampler):
            raise TypeError(f"sampler must be a PowerLawSampler, got {type(sampler).__name__}")
        self.defensive = check_real_range("defensive", defensive, 0.0, 1.0)
        if sampler.min_p is not None and not 0.0 < self.defensive:
            raise ValueError(
                "defensive must lie in (0, 1] when sampler.min_p is set: min-p gives zero proposal mass to "
                "tokens the program can produce, and only the defensive mixture keeps the SMC weights exact"
            )
        self.context = context
        self.sampler = sampler

    async def log_probs(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(log q ``[V]``, the context's log p ``[V]``) for the particle's current history."""
        log_p = await LMNextToken(self.context).log_probs()  # [V]
        hist = torch.tensor(
            power_law_history(self.context), dtype=log_p.dtype, device=log_p.device
        )  # [n]
        log_q = self.sampler.log_probs(log_p, self.sampler.next_target(hist))  # [V]
        eps = self.defensive
        if eps == 1.0:
            log_q = log_p
        elif eps > 0.0:
            log_q = torch.logaddexp(log_q + math.log1p(-eps), log_p + math.log(eps))  # [V]
        return log_q, log_p

    async def _record(self, log_p: torch.Tensor, i: int) -> None:
        hist = (*power_law_history(self.context), math.exp(await gather_row(log_p, i)))
        self.context.annotate(_HISTORY_ATTR, hist[-self.sampler.queue_size :])

    async def sample(self, rng=None):
        log_q, log_p = await self.log_probs()
        i, log_q_i = await sample_row(log_q, rng or current_rng())  # batched with the step
        await self._record(log_p, i)
        return Token(self.context.lm, i), log_q_i

    async def log_prob(self, value):
        log_q, log_p = await self.log_probs()
        i = int(value)
        await self._record(log_p, i)
        return await gather_row(log_q, i)

    async def support(self):
        log_q, _ = await self.log_probs()
        ids = torch.nonzero(log_q > -math.inf).flatten().tolist()
        return [(Token(self.context.lm, i), v) for i, v in zip(ids, log_q[ids].tolist())]
