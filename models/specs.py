"""SPECS: block-wise reward-guided search with speculative drafts and dynamic switching.

``specs`` is SPECS Algorithm 1: the answer is built block by block; each
iteration draws ``n`` candidate blocks from the generator π_gen (the target at
first, the draft after a high-reward iteration), scores them with eq. (1)
S_i = log π_target(Y_i|tr)/π_gen(Y_i|tr) + β r(Y_i|tr), and keeps one drawn
∝ e^{S_i} (SUBSAMPLE, Algorithm 2). ``beam_search`` is the baseline (BS-B / BS-S):
keep the ``beam_width`` highest-reward partial answers after every block::

    from llamppl import CachedCausalLM, run
    from llamppl.models import beam_search, skip_middle_draft, specs
    target = CachedCausalLM.default()
    draft = skip_middle_draft(target, 12, 12)                  # layers 0-11 and 18-29 of 30
    reward = lambda prompt, text: float("5" in text)          # a process reward r(tr)
    out = run(specs(target, draft, reward, "Q: 2+3=? A:", n=4, block=4, tau=0.5, seed=0))
    out.text, out.reward, [s.generator for s in out.steps], out.target_forwards
    bs = run(beam_search(target, reward, "Q: 2+3=? A:", beam_width=2, block=4, max_tokens=16))

All candidates of an iteration are decoded together: their concurrent
``next_token_logprobs`` awaits coalesce into one batched call (one transformer
forward with :class:`~llamppl.CachedCausalLM`) per token position. Scoring a
draft block under the target requests the target's log-probs of every prefix of
every candidate at once: one call (one forward through the token trie). The block
kernels both searches share live in :mod:`llamppl.models.block_search`.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from llamppl.context import LMContext
from llamppl.inference.observers import Progress
from llamppl.lm.base import LanguageModel
from llamppl.rng import make_rng, using_rng
from llamppl.validation import check_finite, check_positive_int

from .block_search import (
    Reward,
    answer_text,
    block_logprobs,
    check_lm,
    check_reward,
    draw_blocks,
    extend_beams,
    score_reward,
    subsample,
)

__all__ = [
    "specs",
    "beam_search",
    "subsample",
    "SpecsStep",
    "SpecsResult",
    "BeamStep",
    "BeamSearchResult",
    "Reward",
]


@dataclass
class SpecsStep:
    """One SPECS iteration (Algorithm 1, steps I–III).

    Attributes
    ----------
    generator : str
        ``"target"`` or ``"draft"``: which model drew the candidates (π_gen).
    candidates : list[list[int]]
        The ``n`` candidate blocks Y_i (token ids; a block ends early at EOS).
    rewards : list[float]
        r(Y_i | tr): the reward of the trace extended by each candidate.
    log_ratios : list[float]
        log π_target(Y_i|tr) − log π_gen(Y_i|tr) (exactly 0 when π_gen = π_target).
    scores : list[float]
        S_i of eq. (1).
    chosen : int
        Index i* drawn ∝ e^{S_i}.
    switched : bool
        Whether this iteration switched π_gen to the draft (Algorithm 1 line 9).
    generation_forwards, scoring_forwards : int
        Work on π_gen while drawing the blocks, and on the target while scoring them.
    """

    generator: str
    candidates: list[list[int]]
    rewards: list[float]
    log_ratios: list[float]
    scores: list[float]
    chosen: int
    switched: bool
    generation_forwards: int
    scoring_forwards: int


@dataclass
class SpecsResult:
    """Output of :func:`specs`.

    ``tokens`` are the generated ids (EOS included when emitted), ``text`` their
    decoding without EOS, ``reward`` the reward of the final answer. Forward counts
    are ``lm.stats.forward_calls`` increments (transformer forwards of a
    :class:`~llamppl.CachedCausalLM`, one per batched call of a ``FunctionLM``).
    ``tokens_drawn`` counts every candidate token sampled (all n candidates).
    """

    text: str
    tokens: list[int]
    reward: float
    steps: list[SpecsStep] = field(default_factory=list)
    target_forwards: int = 0
    draft_forwards: int = 0
    tokens_drawn: int = 0


@dataclass
class BeamStep:
    """One beam-search iteration: the pool's rewards and the indices kept (best first)."""

    rewards: list[float]
    kept: list[int]
    forwards: int


@dataclass
class BeamSearchResult:
    """Output of :func:`beam_search`: the best beam (``text``, ``tokens``, ``reward``) and the run."""

    text: str
    tokens: list[int]
    reward: float
    steps: list[BeamStep] = field(default_factory=list)
    forwards: int = 0
    tokens_drawn: int = 0


# ---------------------------------------------------------------------------- helpers
# ---------------------------------------------------------------------------- SPECS
async def specs(
    target: LanguageModel,
    draft: LanguageModel,
    reward: Reward,
    prompt: str | Sequence[int],
    n: int = 8,
    block: int = 16,
    beta: float | None = None,
    tau: float = 0.8,
    max_tokens: int = 256,
    seed: int | np.random.Generator | None = None,
    progress: bool | None = None,
) -> SpecsResult:
    """SPECS (Algorithm 1) with SUBSAMPLE (Algorithm 2) and dynamic switching.

    Each iteration (until the chosen block ends with EOS or ``max_tokens`` tokens
    are generated):

    I.   draw Y_1..Y_n i.i.d. ~ π_gen(·|tr), each ``block`` tokens (fewer at EOS or at
         the ``max_tokens`` budget), all decoded in one batched call per token;
    II.  S_i = log π_target(Y_i|tr)/π_gen(Y_i|tr) + β r(Y_i|tr)  (eq. 1; the log ratio
         is 0 when π_gen = π_target), target scoring and rewards run concurrently;
         tr ← (tr, Y_{i*}) with i* ∝ e^{S_i};
    III. if max_i r(Y_i|tr) > τ, π_gen ← π_draft (lines 9–10). Algorithm 1 has no rule
         that switches back, so once drafting starts it continues to the end.

    With one block covering the whole answer (``block >= max_tokens``) this is
    self-normalised importance sampling of π*_β ∝ π_target e^{β r} (eq. 3–4), which
    it approaches as n grows (SPECS Theorem 3).

    Parameters
    ----------
    target, draft : LanguageModel
        π_target and π_draft; they must share the vocabulary and EOS id (may be the same object).
    reward : callable
        ``reward(prompt_text, text_so_far) -> float`` (sync or ``async``); ``text_so_far``
        is the decoded answer including the candidate block, EOS excluded; ``prompt_text``
        is the prompt string (decoded, if ids were given). May return ``-inf`` (never kept).
    prompt : str | Sequence[int]
        Text or token ids (BOS handling as :class:`~llamppl.LMContext` on the target).
    n : int
        Candidates per iteration (beam width), >= 1.
    block : int
        Block size γ in tokens, >= 1.
    beta : float | None
        Inverse temperature β >= 0 of the reward (finite); default 2·``block``
        (SPECS Appendix, "β = 2 × L is a stable choice").
    tau : float
        Switching threshold τ (finite).
    max_tokens : int
        Budget of generated tokens (EOS included), >= 1.
    seed : int | numpy.random.Generator | None
        Randomness of the candidates and of SUBSAMPLE; installed as ``current_rng()``
        while the reward runs.
    progress : bool | None
        tqdm bar over blocks (the chosen block's reward, the generator in use); default on
        when stderr is a terminal.
    """
    target = check_lm("target", target)
    draft = check_lm("draft", draft)
    if draft is not target and (
        draft.vocab_size != target.vocab_size
        or draft.eos_token_ids != target.eos_token_ids
        or list(draft.vocab) != list(target.vocab)
    ):
        raise ValueError(
            "draft must share the target's vocabulary and eos_token_ids "
            f"(target: {target.vocab_size} tokens, eos {sorted(target.eos_token_ids)}; "
            f"draft: {draft.vocab_size} tokens, eos {sorted(draft.eos_token_ids)})"
        )
    reward = check_reward(reward)
    n = check_positive_int("n", n)
    block = check_positive_int("block", block)
    max_tokens = check_positive_int("max_tokens", max_tokens)
    beta = 2.0 * block if beta is None else check_finite("beta", beta)
    if beta < 0:
        raise ValueError(f"beta must be a finite number >= 0, got {beta}")
    tau = check_finite("tau", tau)
    rng = make_rng(seed)
    prompt_text = prompt if isinstance(prompt, str) else target.decode(list(prompt))
    trace = list(LMContext(target, prompt).tokens)
    generated: list[int] = []
    out = SpecsResult("", [], math.nan)
    drafting = False  # π_gen = π_draft? (Algorithm 1 line 4: start with the target)
    total = math.ceil(max_tokens / block)
    with using_rng(rng), Progress(progress, "specs", unit="block", total=total) as bar:
        while True:
            gen = draft if drafting else target
            length = min(block, max_tokens - len(generated))
            work = gen.stats.forward_calls
            blocks, log_q = await draw_blocks(gen, trace + generated, n, length, rng)  # step I
            gen_work = gen.stats.forward_calls - work
            texts = [answer_text(target, generated + b) for b in blocks]
            rewards_job = asyncio.gather(*(score_reward(reward, prompt_text, t) for t in texts))
            work = target.stats.forward_calls
            if gen is target:  # eq. (1) collapses to β r
                rewards = await rewards_job
                log_ratios = [0.0] * n
            else:
                log_p, rewards = await asyncio.gather(
                    block_logprobs(target, trace + generated, blocks), rewards_job
                )
                log_ratios = [p - q for p, q in zip(log_p, log_q)]
            score_work = target.stats.forward_calls - work
            scores = [lr + beta * r for lr, r in zip(log_ratios, rewards)]  # eq. (1)
            chosen = subsample(scores, rng)  # step II, Algorithm 2
            generated += blocks[chosen]
            switch = not drafting and max(rewards) > tau  # step III, lines 9-10
            out.steps.append(
                SpecsStep("draft" if drafting else "target", blocks, list(rewards), log_ratios, scores, chosen, switch,
                          gen_work, score_work)
            )  # fmt: skip
            out.tokens_drawn += sum(map(len, blocks))
            if drafting:
                out.draft_forwards += gen_work
            else:
                out.target_forwards += gen_work
            out.target_forwards += score_work
            out.reward = rewards[chosen]
            drafting = drafting or switch
            bar.update(reward=f"{out.reward:.3g}", generator="draft" if drafting else "target")
            if generated[-1] in target.eos_token_ids or len(generated) >= max_tokens:
                break
    out.tokens, out.text = generated, answer_text(target, generated)
    return out


# ---------------------------------------------------------------------------- beam search
async def beam_search(
    lm: LanguageModel,
    reward: Reward,
    prompt: str | Sequence[int],
    beam_width: int = 4,
    block: int = 16,
    max_tokens: int = 256,
    seed: int | np.random.Generator | None = None,
    expansions: int | None = None,
    progress: bool | None = None,
) -> BeamSearchResult:
    """Block-wise beam search with a process reward (the BS-B / BS-S baseline of SPECS §4).

    Start from ``beam_width`` copies of the empty beam, so the first iteration draws
    ``beam_width`` · ``expansions`` blocks from the prompt like every later one (one
    empty beam would sample ``beam_width`` times fewer first blocks and start the search
    from less). Each iteration, every unfinished beam is extended by
    ``expansions`` (default ``beam_width``) blocks sampled i.i.d. from ``lm`` at
    temperature 1 (``block`` tokens, fewer at EOS or the ``max_tokens`` budget); all
    these candidates are decoded together (one batched call per token). The pool is
    the new candidates plus the finished beams (with their rewards); the
    ``beam_width`` with the highest reward are kept (ties: earlier in the pool wins,
    finished beams come last). Stops when every kept beam has ended (EOS or
    ``max_tokens``) and returns the highest-reward one.

    ``reward`` is as in :func:`specs`; ``seed`` fixes the sampled blocks; ``progress``
    shows a tqdm bar over iterations (default: on when stderr is a terminal).
    """
    lm = check_lm("lm", lm)
    reward = check_reward(reward)
    beam_width = check_positive_int("beam_width", beam_width)
    block = check_positive_int("block", block)
    max_tokens = check_positive_int("max_tokens", max_tokens)
    expansions = beam_width if expansions is None else check_positive_int("expansions", expansions)
    rng = make_rng(seed)
    prompt_text = prompt if isinstance(prompt, str) else lm.decode(list(prompt))
    ctx = list(LMContext(lm, prompt).tokens)
    eos = lm.eos_token_ids

    def ended(toks: list[int]) -> bool:
        return bool(toks) and (toks[-1] in eos or len(toks) >= max_tokens)

    beams: list[tuple[list[int], float]] = [([], -math.inf)] * beam_width
    out = BeamSearchResult("", [], math.nan)
    total = math.ceil(max_tokens / block)
    with using_rng(rng), Progress(progress, "beam_search", unit="block", total=total) as bar:
        while not all(ended(b) for b, _ in beams):
            live = [b for b, _ in beams if not ended(b)]
            work = lm.stats.forward_calls
            candidates = await extend_beams(lm, ctx, live, expansions, block, max_tokens, rng)
            forwards = lm.stats.forward_calls - work
            rewards = await asyncio.gather(
                *(score_reward(reward, prompt_text, answer_text(lm, c)) for c in candidates)
            )
            pool = list(zip(candidates, rewards)) + [(b, r) for b, r in beams if ended(b)]
            order = sorted(range(len(pool)), key=lambda i: -pool[i][1])[:beam_width]
            beams = [pool[i] for i in order]
            out.steps.append(BeamStep([r for _, r in pool], order, forwards))
            bar.update(best=f"{beams[0][1]:.3g}")
            out.forwards += forwards
            out.tokens_drawn += sum(
                len(c) - len(live[0]) for c in candidates
            )  # live beams: equal length
    best, out.reward = beams[0]
    out.tokens, out.text = best, answer_text(lm, best)
    return out
