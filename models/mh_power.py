"""Metropolis–Hastings power sampling (Karan & Du 2025), the serial baseline of Power-SMC.

The chain targets π_α(y|x) ∝ p(y|x)^α (same truncated target as
:class:`~llamppl.models.PowerSampling`). It grows y in blocks of B tokens; after
each block's extension it makes M MH moves on the intermediate target
p(y_{1:L})^α (sequences cut at the current length bound L = min(kB, T_max)). A
move picks an edit index i uniformly in {0, …, |y|−1}, regenerates the suffix
from the proposal q (temperature 1/α) until EOS or L tokens, and accepts y' with

    A = min(1, [p(y')^α q(y_{i:} | y_{<i}) / |y'|] / [p(y)^α q(y'_{i:} | y_{<i}) / |y|])

The |y|/|y'| factor is the ratio of the edit-index probabilities 1/|y| and 1/|y'|
(the reverse move from y' picks the same i); it is 1 when no EOS makes lengths
differ, which gives the ratio as written by Power-SMC §6.3. With it each move
satisfies detailed balance for its target, so the moves of the last block
(L = T_max) leave π_α invariant. A chain whose state ends with EOS cannot be
extended; it goes straight to the last block. Per-token log p and log q of the
current state are kept, so only the regenerated suffix is ever scored, and its
first token's distribution comes from the LM's prefix cache::

    from llamppl import CachedCausalLM, run
    from llamppl.models import mh_power_sampling
    out = run(mh_power_sampling(CachedCausalLM.default(), "Q: 2+3=? A:", alpha=4.0,
                                block_size=4, n_mh_steps=10, max_tokens=32, seed=0))
    out.text, out.log_likelihood, out.acceptance_rate
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from llamppl.inference.observers import Progress
from llamppl.lm.base import LanguageModel
from llamppl.rng import make_rng
from llamppl.row_sampling import sample_index
from llamppl.validation import check_nonnegative_int, check_positive_int

from .generation import Generation
from .power_sampling import check_alpha, prompt_ids

__all__ = ["mh_power_sampling", "MHPowerResult"]


@dataclass
class MHPowerResult(Generation):
    """Output of :func:`mh_power_sampling`: the chain's final state plus diagnostics.

    Attributes
    ----------
    acceptance_rate : float
        Accepted / proposed MH moves (``nan`` if no move was made).
    n_moves : int
        MH moves made.
    proposal_tokens : int
        Tokens sampled by MH suffix regenerations (Σ L_{k,m} of Power-SMC eq. 15).
    sampled_tokens : int
        All tokens sampled (block extensions plus regenerations): the chain's token-evals.
    trace : list[tuple[int, ...]] | None
        With ``keep_trace=True``, the state after every move of the last block.
    """

    acceptance_rate: float = float("nan")
    n_moves: int = 0
    proposal_tokens: int = 0
    sampled_tokens: int = 0
    trace: list[tuple[int, ...]] | None = None


class _Suffix:
    """Tokens with their per-token base log-probs ``lp`` and proposal log-probs ``lq``."""

    __slots__ = ("tokens", "lp", "lq")

    def __init__(self) -> None:
        self.tokens: list[int] = []
        self.lp: list[float] = []
        self.lq: list[float] = []


async def _draw(
    lm, context: list[int], prefix: list[int], limit: int, alpha: float, rng
) -> _Suffix:
    """Sample from q = softmax(α log p) after ``context + prefix`` until EOS or ``limit`` generated tokens."""
    out = _Suffix()
    while len(prefix) + len(out.tokens) < limit:
        log_p = await lm.next_token_logprobs(context + prefix + out.tokens)  # (V,)
        log_q = torch.log_softmax(alpha * log_p, dim=-1)  # (V,) temperature 1/α
        v = sample_index(log_q, rng)
        out.tokens.append(v)
        out.lp.append(float(log_p[v]))
        out.lq.append(float(log_q[v]))
        if v in lm.eos_token_ids:
            break
    return out


async def mh_power_sampling(
    lm: LanguageModel,
    prompt: str | Sequence[int],
    alpha: float = 4.0,
    block_size: int | None = None,
    n_mh_steps: int = 10,
    max_tokens: int = 2048,
    seed: int | np.random.Generator | None = None,
    keep_trace: bool = False,
    progress: bool | None = None,
) -> MHPowerResult:
    """Run one MH power-sampling chain (Karan & Du 2025; see the module docstring).

    Parameters
    ----------
    lm, prompt
        The language model and the prompt (text or token ids).
    alpha : float
        Exponent α >= 1, finite.
    block_size : int | None
        Block length B >= 1; default ``ceil(max_tokens / 16)`` (K = 16 blocks, as in
        Karan & Du's setup).
    n_mh_steps : int
        MH moves per block, M >= 0 (M = 0 is low-temperature decoding).
    max_tokens : int
        Truncation length T_max >= 1 (EOS counted).
    seed : int | numpy.random.Generator | None
        Fixes the chain.
    keep_trace : bool
        Record the state after every move of the last block (for diagnostics/tests).
    progress : bool | None
        tqdm bar over blocks (with the acceptance rate so far); default on when stderr is
        a terminal.
    """
    alpha = check_alpha(alpha)
    max_tokens = check_positive_int("max_tokens", max_tokens)
    block = (
        math.ceil(max_tokens / 16)
        if block_size is None
        else check_positive_int("block_size", block_size)
    )
    moves = check_nonnegative_int("n_mh_steps", n_mh_steps)
    rng = make_rng(seed)
    context = prompt_ids(lm, prompt)
    eos = lm.eos_token_ids
    bounds = sorted(
        {min(k * block, max_tokens) for k in range(1, math.ceil(max_tokens / block) + 1)}
    )

    y = _Suffix()  # the chain state y with its per-token log p and log q
    accepted = proposed = proposal_tokens = sampled = 0
    trace: list[tuple[int, ...]] | None = [] if keep_trace else None
    k = 0
    with Progress(progress, "mh_power_sampling", unit="block", total=len(bounds)) as bar:
        while True:
            ended = bool(y.tokens) and y.tokens[-1] in eos
            if ended:
                k = len(bounds) - 1  # cannot grow any more: go to the last block
            limit = bounds[k]
            if not ended and len(y.tokens) < limit:  # block extension from the proposal
                ext = await _draw(lm, context, y.tokens, limit, alpha, rng)
                sampled += len(ext.tokens)
                y.tokens += ext.tokens
                y.lp += ext.lp
                y.lq += ext.lq
            last = k == len(bounds) - 1
            for _ in range(moves):
                n = len(y.tokens)
                i = int(rng.integers(n))  # edit index, uniform over the current y
                new = await _draw(lm, context, y.tokens[:i], limit, alpha, rng)
                sampled += len(new.tokens)
                proposal_tokens += len(new.tokens)
                n_new = i + len(new.tokens)
                # log A = log [p(y')^α q(y_{i:}) / |y'|] − log [p(y)^α q(y'_{i:}) / |y|]
                log_ratio = (
                    alpha * (math.fsum(new.lp) - math.fsum(y.lp[i:]))
                    + (math.fsum(y.lq[i:]) - math.fsum(new.lq))
                    + math.log(n)
                    - math.log(n_new)
                )
                proposed += 1
                if rng.random() < math.exp(min(log_ratio, 0.0)):
                    accepted += 1
                    y.tokens = y.tokens[:i] + new.tokens
                    y.lp = y.lp[:i] + new.lp
                    y.lq = y.lq[:i] + new.lq
                if last and trace is not None:
                    trace.append(tuple(y.tokens))
            bar.update(accept=f"{accepted / proposed:.2f}" if proposed else "-")
            if last:
                break
            k += 1
    out = Generation.from_tokens(lm, y.tokens, math.fsum(y.lp))
    return MHPowerResult(
        out.tokens,
        out.text,
        out.log_likelihood,
        acceptance_rate=accepted / proposed if proposed else float("nan"),
        n_moves=proposed,
        proposal_tokens=proposal_tokens,
        sampled_tokens=sampled,
        trace=trace,
    )
