"""SMC speculative decoding (SMC-SD): a cheap draft proposes blocks, the target reweights them.

``SpeculativeDecoding`` is a :class:`~llamppl.Model` whose posterior is the target
LM's own distribution over continuations (truncated at ``max_tokens``). Each
``step`` is one SMC-SD round (papers.md §3): the draft proposes a block of up to
K tokens, the target scores the whole block in ONE batched forward (all K+1
prefixes of all particles are awaited concurrently, so the coalescer and the
token trie run each new token once), the particle is reweighted by
p_target(block) / q_draft(block), and one bonus token is drawn from the target:
K+1 tokens per round. ``speculative_smc`` runs it with ``smc_standard`` (resample
when ESS < threshold · N) and returns one output drawn ∝ final weight::

    from llamppl import CachedCausalLM, run
    from llamppl.models import speculative_smc, truncated_draft
    target = CachedCausalLM.default()
    draft = truncated_draft(target, n_layers=6)      # self-speculative layer-skip draft
    out = run(speculative_smc(target, draft, "Once upon a time", n_particles=8, k=4,
                              max_tokens=32, seed=0))
    out.text, out.result.log_ml, out.target_forwards, out.tokens_per_target_forward
"""

from __future__ import annotations

import asyncio
import math
import numbers
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from llamppl.context import LMContext
from llamppl.distributions import Distribution, TokenCategorical
from llamppl.inference import SMCResult, smc_standard
from llamppl.lm.base import LanguageModel
from llamppl.modeling import Model
from llamppl.rng import current_rng, make_rng
from llamppl.token import sample_index
from llamppl.validation import check_positive_int, check_unit_interval

from .power_sampling import Generation, _generation

__all__ = [
    "SpeculativeDecoding",
    "DraftBlock",
    "TargetBlock",
    "SpeculativeResult",
    "speculative_smc",
    "truncated_draft",
]


def _block_ends(block: Sequence[int], eos: frozenset[int], n_max: int) -> bool:
    """Whether a block of at most ``n_max`` tokens is complete: it ends with EOS or has ``n_max`` tokens."""
    return len(block) == n_max or (len(block) > 0 and block[-1] in eos)


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
        while not _block_ends(block, self.eos, self.n_max):
            lq = await self._log_q(tuple(block))  # (V,)
            block.append(sample_index(lq, rng))
            rows.append(lq)
        return tuple(block), self._total(block, rows)

    async def log_prob(self, value: Sequence[int]) -> float:
        block = tuple(int(t) for t in value)
        if not block or any(
            _block_ends(block[:i], self.eos, self.n_max) for i in range(1, len(block))
        ):
            return -math.inf
        if not _block_ends(block, self.eos, self.n_max):
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
            if _block_ends(block, self.eos, self.n_max):
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
        while not _block_ends(block, self.eos, self.n_max):
            lp = await self.lm.next_token_logprobs(self.context + tuple(block))
            block.append(sample_index(lp, rng))
        return tuple(block), await self.log_prob(block)

    async def log_prob(self, value: Sequence[int]) -> float:
        block = tuple(int(t) for t in value)
        m = len(block)
        if m == 0 or any(_block_ends(block[:i], self.eos, self.n_max) for i in range(1, m)):
            return -math.inf
        if not _block_ends(block, self.eos, self.n_max):
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
        """The particle's continuation as a :class:`~llamppl.models.power_sampling.Generation`."""
        return _generation(self.target, self.context.generated, self.log_likelihood)


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


def _work(lm: LanguageModel) -> int:
    """Transformer forwards of ``lm`` if it counts them, else its coalesced batch calls."""
    stats = getattr(lm, "stats", None)
    return int(stats.forward_calls) if hasattr(stats, "forward_calls") else int(lm.batch_calls)


@dataclass
class SpeculativeResult(Generation):
    """Output of :func:`speculative_smc`: the chosen continuation plus the run and its work.

    Attributes
    ----------
    result : SMCResult
        Final particles, log weights, ``log_ml`` (log Ẑ, an unbiased estimate of Z = 1),
        history (per round: ESS, resampled), stats.
    particle : SpeculativeDecoding
        The chosen particle (drawn ∝ final weight).
    rounds : int
        SMC-SD rounds (SMC steps).
    target_forwards, draft_forwards : int
        Transformer forwards of each LM during the run (coalesced batch calls for
        LMs without ``stats.forward_calls``, e.g. ``FunctionLM``).
    tokens_generated : int
        Tokens generated by all final particles, summed.
    """

    result: SMCResult | None = None
    particle: SpeculativeDecoding | None = None
    rounds: int = 0
    target_forwards: int = 0
    draft_forwards: int = 0
    tokens_generated: int = 0

    @property
    def tokens_per_target_forward(self) -> float:
        """Tokens of the chosen output per target forward (≈ K+1 when drafts are accepted)."""
        return len(self.tokens) / self.target_forwards if self.target_forwards else float("nan")

    @property
    def mean_ess(self) -> float:
        """Mean ESS over rounds (before resampling): an acceptance proxy, N when q = p."""
        return float(np.mean([h.ess for h in self.result.history])) if self.result else math.nan


async def speculative_smc(
    target: LanguageModel,
    draft: LanguageModel,
    prompt: str | Sequence[int],
    n_particles: int = 16,
    k: int = 4,
    max_tokens: int = 256,
    ess_threshold: float = 0.5,
    seed: int | np.random.Generator | None = None,
    draft_temp: float = 1.0,
    resampling: str = "systematic",
    progress: bool | None = None,
) -> SpeculativeResult:
    """SMC-SD (papers.md §3): SMC over :class:`SpeculativeDecoding`, output drawn ∝ final weight.

    Each round every live particle drafts up to K tokens (K draft forwards for all
    particles), the target scores all particles' blocks and bonus positions in one
    forward, and one bonus token per particle is sampled from the target. Resampling
    when ESS < ``ess_threshold · N``; clones share the trie's K/V. A round costs one
    target forward, plus one for each early-EOS position in a round where some
    particle's block stopped at EOS before the others' (its request leaves earlier).
    """
    model = SpeculativeDecoding(target, draft, prompt, k, max_tokens, draft_temp)
    n = check_positive_int("n_particles", n_particles)
    threshold = check_unit_interval("ess_threshold", ess_threshold)
    rng = make_rng(seed)
    before = _work(target), _work(draft)
    result = await smc_standard(
        model, n, threshold, resampling=resampling, seed=rng, progress=progress
    )
    t_fw, d_fw = _work(target) - before[0], _work(draft) - before[1]
    chosen = result.sample(rng)
    out = chosen.output()
    return SpeculativeResult(
        out.tokens,
        out.text,
        out.log_likelihood,
        result=result,
        particle=chosen,
        rounds=len(result.history),
        target_forwards=t_fw,
        draft_forwards=d_fw,
        tokens_generated=sum(len(p.context.generated) for p in result.particles),
    )


def truncated_draft(lm, n_layers: int):
    """A self-speculative "layer-skip" draft: the first ``n_layers`` decoder layers of ``lm``.

    Builds a fresh Hugging Face model from ``lm.model.config`` with
    ``num_hidden_layers = n_layers``, loads the embeddings, the first ``n_layers``
    layers, the final norm and the LM head from ``lm.model`` (the tensors are shared, not copied),
    and wraps it in a :class:`~llamppl.CachedCausalLM` with ``lm``'s tokenizer, so the
    vocabulary is the target's.
    """
    from transformers import AutoModelForCausalLM

    from llamppl.lm.cached_causal_lm import CachedCausalLM

    if not isinstance(lm, CachedCausalLM):
        raise TypeError(f"lm must be a CachedCausalLM, got {type(lm).__name__}")
    total = lm.model.config.get_text_config(decoder=True).num_hidden_layers
    n_layers = check_positive_int("n_layers", n_layers)
    if n_layers > total:
        raise ValueError(f"n_layers must lie in [1, {total}] for this model, got {n_layers}")
    config = lm.model.config.__class__.from_dict(lm.model.config.to_dict())
    config.num_hidden_layers = n_layers
    if getattr(config, "layer_types", None) is not None:
        config.layer_types = list(config.layer_types)[:n_layers]
    config.quantization_config = None
    config._attn_implementation = lm.model.config._attn_implementation
    param = next(lm.model.parameters())
    small = AutoModelForCausalLM.from_config(config, dtype=param.dtype).to(param.device)
    keep = {
        name: t
        for name, t in lm.model.state_dict().items()
        if not name.startswith("model.layers.") or int(name.split(".")[2]) < n_layers
    }
    # assign=True: the draft's tensors ARE the target's (no copy of the shared weights)
    missing, unexpected = small.load_state_dict(keep, strict=False, assign=True)
    if missing or unexpected:
        raise ValueError(f"cannot truncate this model: missing {missing}, unexpected {unexpected}")
    small.tie_weights()
    return CachedCausalLM(small, lm.tokenizer)
