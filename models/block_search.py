"""Candidate blocks for block-wise search: draw them, score them under another LM, reward them.

The kernels that :func:`~llamppl.models.specs` and :func:`~llamppl.models.beam_search`
share. A *block* is up to ``length`` tokens sampled after a trace, stopping early at EOS;
all candidates of one call are decoded together, so their concurrent
``next_token_logprobs`` awaits coalesce into one batched call (one transformer forward
with :class:`~llamppl.CachedCausalLM`) per token position::

    from llamppl.models.block_search import block_logprobs, draw_blocks, subsample
    blocks, log_q = await draw_blocks(draft, trace, n=4, length=8, rng=rng)   # Y_i ~ π_gen
    log_p = await block_logprobs(target, trace, blocks)                       # π_target(Y_i)
    i = subsample([p - q for p, q in zip(log_p, log_q)], rng)                 # i ∝ e^{S_i}
"""

from __future__ import annotations

import asyncio
import inspect
import math
from collections.abc import Awaitable, Callable, Sequence

import numpy as np
import torch

from llamppl.lm.base import LanguageModel
from llamppl.row_sampling import sample_index
from llamppl.validation import is_real

__all__ = [
    "Reward",
    "check_lm",
    "check_reward",
    "answer_text",
    "score_reward",
    "draw_blocks",
    "block_logprobs",
    "extend_beams",
    "subsample",
]

#: ``reward(prompt_text, text_so_far) -> float`` (or an ``async def`` returning one): the
#: process reward r of the partial answer ``text_so_far`` (EOS excluded) after ``prompt_text``.
Reward = Callable[[str, str], "float | Awaitable[float]"]


def check_lm(name: str, lm: object) -> LanguageModel:
    """``lm`` if it is a LanguageModel, else a ``TypeError`` naming ``name``."""
    if not isinstance(lm, LanguageModel):
        raise TypeError(f"{name} must be a LanguageModel, got {type(lm).__name__}")
    return lm


def check_reward(reward: object) -> Reward:
    """``reward`` if it is callable, else a ``TypeError``."""
    if not callable(reward):
        raise TypeError(
            f"reward must be a callable reward(prompt_text, text_so_far) -> float, got {type(reward).__name__}"
        )
    return reward


def answer_text(lm: LanguageModel, tokens: Sequence[int]) -> str:
    """The decoded answer ``tokens`` without a final EOS."""
    body = tokens[:-1] if tokens and tokens[-1] in lm.eos_token_ids else tokens
    return lm.decode(list(body))


async def score_reward(reward: Reward, prompt_text: str, text: str) -> float:
    """``reward(prompt_text, text)``, awaited if async, checked to be a real number < +inf (not NaN)."""
    r = reward(prompt_text, text)
    if inspect.isawaitable(r):
        r = await r
    if not is_real(r) or math.isnan(r) or r == math.inf:
        raise ValueError(f"reward must return a real number < +inf (not NaN), got {r!r}")
    return float(r)


async def draw_blocks(
    lm: LanguageModel, trace: list[int], n: int, length: int, rng: np.random.Generator
) -> tuple[list[list[int]], list[float]]:
    """``n`` i.i.d. blocks of up to ``length`` tokens from ``lm`` after ``trace`` (each stops at EOS).

    All live candidates are awaited together at each position: one batched call per
    token. Returns the blocks and their log-probabilities log π_gen(Y_i | trace).
    """
    blocks: list[list[int]] = [[] for _ in range(n)]
    log_q = [0.0] * n
    live = list(range(n))
    for _ in range(length):
        log_ps = await asyncio.gather(*(lm.next_token_logprobs(trace + blocks[i]) for i in live))
        for i, log_p in zip(live, log_ps):  # log_p: (V,) normalised, on lm.device
            v = sample_index(log_p, rng)
            blocks[i].append(v)
            log_q[i] += float(log_p[v])
        live = [i for i in live if blocks[i][-1] not in lm.eos_token_ids]
        if not live:
            break
    return blocks, log_q


async def block_logprobs(
    lm: LanguageModel, trace: list[int], blocks: list[list[int]]
) -> list[float]:
    """log π(Y_i | trace) for every block: every prefix of every block requested at once (one call)."""
    wanted = [(i, k) for i, b in enumerate(blocks) for k in range(len(b))]
    log_ps = await asyncio.gather(
        *(lm.next_token_logprobs(trace + blocks[i][:k]) for i, k in wanted)
    )
    out = [0.0] * len(blocks)
    for (i, k), log_p in zip(wanted, log_ps):
        out[i] += float(log_p[blocks[i][k]])
    return out


def subsample(scores: Sequence[float], rng: np.random.Generator) -> int:
    """SUBSAMPLE (SPECS Algorithm 2, line 6): draw i* with P(i* = i) ∝ e^{S_i}."""
    s = torch.tensor(list(scores), dtype=torch.float64)  # (n,)
    if not bool(torch.isfinite(s).any()):
        raise ValueError("every candidate has score -inf (reward -inf or zero target probability)")
    return sample_index(s, rng)


async def extend_beams(
    lm: LanguageModel,
    ctx: list[int],
    beams: list[list[int]],
    expansions: int,
    block: int,
    max_tokens: int,
    rng: np.random.Generator,
) -> list[list[int]]:
    """``expansions`` sampled blocks after each beam, every beam's candidates decoded together."""
    jobs = [
        draw_blocks(lm, ctx + b, expansions, min(block, max_tokens - len(b)), rng) for b in beams
    ]
    results = await asyncio.gather(*jobs)
    return [b + y for b, (blocks, _) in zip(beams, results) for y in blocks]
