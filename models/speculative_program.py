"""The SMC-SD program: the block laws of a draft and a target, and the ``Model`` whose step is one round.

``SpeculativeDecoding`` is a :class:`~llamppl.Model` whose posterior is the target
LM's own distribution over continuations (truncated at ``max_tokens``). Each ``step``
is one SMC-SD round (papers.md §3): the draft proposes a block of up to K tokens
(:class:`DraftBlock`, law q), the target scores the whole block in ONE batched forward
(:class:`TargetBlock`, law p: all K+1 prefixes of all particles are awaited
concurrently, so the coalescer and the token trie run each new token once), the
particle is reweighted by p(block) / q(block), and one bonus token is drawn from the
target. The driver :func:`~llamppl.models.speculative_smc` runs it with SMC::

    from llamppl import run
    from llamppl.inference import enumerate_exact
    from llamppl.models import SpeculativeDecoding
    exact = run(enumerate_exact(SpeculativeDecoding(target, draft, "a", k=2, max_tokens=3)))
"""

from __future__ import annotations

import asyncio
import math
import numbers
from collections.abc import Sequence

import numpy as np
import torch

from llamppl.context import LMContext
from llamppl.distributions import Distribution, TokenCategorical
from llamppl.lm.base import LanguageModel
from llamppl.modeling import Model
from llamppl.rng import current_rng
from llamppl.row_sampling import sample_index
from llamppl.validation import check_positive_int

from .generation import Generation

__all__ = [
    "SpeculativeDecoding",
    "DraftBlock",
    "TargetBlock",
    "block_complete",
    "is_whole_block",
    "check_pair",
]


def block_complete(block: Sequence[int], eos: frozenset[int], n_max: int) -> bool:
    """Whether a block of at most ``n_max`` tokens is complete: it ends with EOS or has ``n_max`` tokens."""
    return len(block) == n_max or (len(block) > 0 and block[-1] in eos)


def is_whole_block(block: Sequence[int], eos: frozenset[int], n_max: int) -> bool:
    """Whether ``block`` is a value of the block law: complete, and no shorter prefix of it is."""
    return block_complete(block, eos, n_max) and not any(
        block_complete(block[:i], eos, n_max) for i in range(1, len(block))
    )


class DraftBlock(Distribution):
    """The draft's law q of one block: tokens drawn one by one from the draft LM (temperature τ).

    A block after ``context`` has at most ``n_max`` tokens and stops early at EOS, so
    q(b) = Π_i q_τ(b_i | context, b_<i) with q_τ = softmax(log q_draft / τ) is a
    normalised distribution over blocks (values: tuples of token ids). ``sample``
    costs one draft request per token; concurrent particles coalesce into one draft
    forward per position. After ``sample``/``log_prob``, ``rows`` holds the block's
    per-position draft log-probs ``(m, V)``.
    """

    def __init__(
        self,
        draft: LanguageModel,
        context: Sequence[int],
        n_max: int,
        eos: frozenset[int],
        temp: float,
    ) -> None:
        self.lm, self.context, self.n_max, self.eos, self.temp = (
            draft,
            tuple(context),
            n_max,
            eos,
            temp,
        )
        self.rows: torch.Tensor | None = None

    async def _log_q(self, prefix: tuple[int, ...]) -> torch.Tensor:
        lq = await self.lm.next_token_logprobs(self.context + prefix)  # (V,)
        return lq if self.temp == 1.0 else torch.log_softmax(lq / self.temp, dim=-1)

    async def sample(self, rng: np.random.Generator | None = None) -> tuple[tuple[int, ...], float]:
        rng = rng or current_rng()
        block: list[int] = []
        rows: list[torch.Tensor] = []
        while not block_complete(block, self.eos, self.n_max):
            lq = await self._log_q(tuple(block))  # (V,)
            block.append(sample_index(lq, rng))
            rows.append(lq)
        return tuple(block), self._total(block, rows)

    async def log_prob(self, value: Sequence[int]) -> float:
        block = tuple(int(t) for t in value)
        if not is_whole_block(block, self.eos, self.n_max):
            return -math.inf
        rows = await asyncio.gather(*(self._log_q(block[:i]) for i in range(len(block))))
        return self._total(block, list(rows))

    def _total(self, block: Sequence[int], rows: list[torch.Tensor]) -> float:
        self.rows = torch.stack(rows)  # (m, V)
        idx = torch.tensor(block, device=self.rows.device)  # (m,)
        return float(self.rows.gather(1, idx[:, None]).sum())

    async def support(self) -> list[tuple[tuple[int, ...], float]]:
        out: list[tuple[tuple[int, ...], float]] = []

        async def visit(block: tuple[int, ...], lp: float) -> None:
            if block_complete(block, self.eos, self.n_max):
                out.append((block, lp))
                return
            lq = (await self._log_q(block)).tolist()
            for v, lv in enumerate(lq):
                if lv > -math.inf:
                    await visit(block + (v,), lp + lv)

        await visit((), 0.0)
        return out


class TargetBlock(Distribution):
    """The target's law p of the same block variable as :class:`DraftBlock`.

    ``log_prob(b)`` = Σ_i log p_target(b_i | context, b_<i), computed from the target
    log-probs of all prefixes of ``b`` awaited concurrently (one coalesced batch, one
    forward on a trie-cached LM). If the block leaves room for a bonus token, the
    prefix ``context + b`` is requested in the same batch and kept in
    ``bonus_logprobs`` ``(V,)``; ``rows`` holds the per-position log-probs ``(m, V)``.
    """

    def __init__(
        self,
        target: LanguageModel,
        context: Sequence[int],
        n_max: int,
        eos: frozenset[int],
        bonus: bool,
    ) -> None:
        self.lm, self.context, self.n_max, self.eos, self.bonus = (
            target,
            tuple(context),
            n_max,
            eos,
            bonus,
        )
        self.rows: torch.Tensor | None = None
        self.bonus_logprobs: torch.Tensor | None = None

    async def sample(self, rng: np.random.Generator | None = None) -> tuple[tuple[int, ...], float]:
        rng = rng or current_rng()
        block: list[int] = []
        while not block_complete(block, self.eos, self.n_max):
            lp = await self.lm.next_token_logprobs(self.context + tuple(block))
            block.append(sample_index(lp, rng))
        return tuple(block), await self.log_prob(block)

    async def log_prob(self, value: Sequence[int]) -> float:
        block = tuple(int(t) for t in value)
        m = len(block)
        if not is_whole_block(block, self.eos, self.n_max):
            return -math.inf
        extra = self.bonus and block[-1] not in self.eos and m == self.n_max
        prefixes = [self.context + block[:i] for i in range(m + extra)]
        rows = await asyncio.gather(*(self.lm.next_token_logprobs(c) for c in prefixes))
        self.bonus_logprobs = rows[m] if extra else None
        self.rows = torch.stack(rows[:m])  # (m, V)
        idx = torch.tensor(block, device=self.rows.device)  # (m,)
        return float(self.rows.gather(1, idx[:, None]).sum())


class SpeculativeDecoding(Model):
    """Posterior = the target LM's distribution over continuations of ``prompt``, sampled by SMC-SD.

    Truncated target. The support is every y that ends with EOS and has at most
    ``max_tokens`` tokens (EOS counted), or has exactly ``max_tokens`` tokens and no
    EOS (cut off); p(y|x) = Π_t p_target(y_t | x, y_<t). These y partition the
    target's outcomes, so Σ_y p(y|x) = 1 = Z (each Ẑ is an unbiased estimate of 1).

    One ``step`` is one round (papers.md §3). With r = ``max_tokens`` − |y so far|:

    1. M_t draws a block b of m = min(K, r) draft tokens, stopping early at EOS
       (:class:`DraftBlock`, ``sample(TargetBlock, proposal=DraftBlock)``).
    2. G_t = p_target(b) / q_draft(b) = Π_i p(b_i | ·) / q_τ(b_i | ·); the target's
       log-probs of all prefixes (and of the bonus position) are one batch.
    3. If b neither ended with EOS nor reached ``max_tokens``, a bonus token is drawn
       from the target itself (weight 1): K+1 tokens per round.

    Every draft token must have positive draft probability wherever the target's is
    positive (else the weights are biased); a violation raises ``ValueError``.

    Parameters
    ----------
    target, draft : LanguageModel
        Same vocabulary (``vocab_size`` and ``eos_token_ids``).
    prompt : str | Sequence[int]
        Text (encoded by the target) or token ids.
    k : int
        Draft block length K >= 1.
    max_tokens : int
        Truncation length >= 1 (generated tokens, EOS included).
    draft_temp : float
        Temperature τ > 0 of the draft proposal.
    """

    def __init__(
        self,
        target: LanguageModel,
        draft: LanguageModel,
        prompt: str | Sequence[int],
        k: int = 4,
        max_tokens: int = 256,
        draft_temp: float = 1.0,
    ) -> None:
        super().__init__()
        check_pair(target, draft)
        self.k = check_positive_int("k", k)
        self.max_tokens = check_positive_int("max_tokens", max_tokens)
        if (
            isinstance(draft_temp, bool)
            or not isinstance(draft_temp, numbers.Real)
            or not math.isfinite(draft_temp)
            or draft_temp <= 0
        ):
            raise ValueError(f"draft_temp must be a positive finite number, got {draft_temp!r}")
        self.draft_temp = float(draft_temp)
        self.draft = draft
        self.context = LMContext(target, prompt)
        self.log_likelihood = 0.0  # log p_target(y | x) of the tokens so far
        self.rounds = 0
        self.drafted = 0  # draft tokens proposed (bonus tokens excluded)

    @property
    def target(self) -> LanguageModel:
        return self.context.lm

    async def step(self) -> None:
        eos, ctx = self.target.eos_token_ids, self.context.tokens
        n_max = min(self.k, self.max_tokens - len(self.context.generated))
        room_for_bonus = len(self.context.generated) + n_max < self.max_tokens
        p = TargetBlock(self.target, ctx, n_max, eos, bonus=room_for_bonus)
        q = DraftBlock(self.draft, ctx, n_max, eos, self.draft_temp)
        block = await self.sample(p, proposal=q)  # M_t: b ~ q; G_t = p(b)/q(b)
        self.rounds += 1
        self.drafted += len(block)
        self._check_support(p, q)
        idx = torch.tensor(block, device=p.rows.device)  # (m,)
        self.log_likelihood += float(p.rows.gather(1, idx[:, None]).sum())
        for t in block:
            self.context.extend(t)
        if block[-1] in eos or len(self.context.generated) >= self.max_tokens:
            self.finish()
            return
        bonus = await self.sample(TokenCategorical(self.target, p.bonus_logprobs))  # weight 1
        v = bonus.token_id
        self.log_likelihood += float(p.bonus_logprobs[v])
        self.context.extend(v)
        if v in eos or len(self.context.generated) >= self.max_tokens:
            self.finish()

    @staticmethod
    def _check_support(p: TargetBlock, q: DraftBlock) -> None:
        if q.rows is None or p.rows is None:
            return
        # one device sync: some token the target allows has draft probability 0
        if bool((torch.isneginf(q.rows) & ~torch.isneginf(p.rows.to(q.rows.dtype))).any()):
            raise ValueError(
                "draft must give positive probability to every token the target allows "
                "(q_draft = 0 where p_target > 0 biases the weights)"
            )

    def string_for_serialization(self) -> str:
        """The generated text, EOS included (so an EOS-terminated y differs from a cut-off one)."""
        return self.target.decode(self.context.generated)

    def output(self) -> Generation:
        """The particle's continuation as a :class:`~llamppl.models.generation.Generation`."""
        return Generation.from_tokens(self.target, self.context.generated, self.log_likelihood)


def check_pair(target: object, draft: object) -> None:
    """``target`` and ``draft`` must be LanguageModels over the same vocabulary."""
    if not isinstance(target, LanguageModel):
        raise TypeError(f"target must be a LanguageModel, got {type(target).__name__}")
    if not isinstance(draft, LanguageModel):
        raise TypeError(f"draft must be a LanguageModel, got {type(draft).__name__}")
    if draft.vocab_size != target.vocab_size:
        raise ValueError(
            f"draft must share the target's vocabulary: draft vocab_size {draft.vocab_size} "
            f"!= target vocab_size {target.vocab_size}"
        )
    if draft.eos_token_ids != target.eos_token_ids:
        raise ValueError(
            f"draft must share the target's EOS tokens: draft eos_token_ids "
            f"{sorted(draft.eos_token_ids)} != target eos_token_ids {sorted(target.eos_token_ids)}"
        )
