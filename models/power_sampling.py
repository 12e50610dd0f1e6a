"""Power sampling: the sequence-level power distribution π_α(y|x) ∝ p(y|x)^α as an SMC program.

``PowerSampling`` is a :class:`~llamppl.Model` whose posterior is the power
target (Power-SMC eq. 1); ``power_smc`` runs it with ``smc_standard`` (Power-SMC
Algorithm 1: all particles advance in one batched forward per token through the
LM's shared token-trie cache, and resampling copies no KV); ``low_temperature_decode``
is the token-level baseline τ = 1/α, which is *not* π_α (Power-SMC §3.2)::

    from llamppl import CachedCausalLM, run
    from llamppl.models import power_smc, low_temperature_decode
    lm = CachedCausalLM.default()
    out = run(power_smc(lm, "Q: 2+3=? A:", alpha=4.0, n_particles=16, max_tokens=32, seed=0))
    out.text, out.log_likelihood, out.result.log_ml      # chosen output, log p(y|x), log Ẑ_α
    base = run(low_temperature_decode(lm, "Q: 2+3=? A:", alpha=4.0, max_tokens=32, seed=0))

The MH baseline of Karan & Du (2025) lives in :mod:`llamppl.models.mh_power`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from llamppl.context import LMContext
from llamppl.distributions import TokenCategorical
from llamppl.inference import SMC, SMCResult, ess_rule, run_population
from llamppl.inference.options import options_from
from llamppl.lm.base import LanguageModel
from llamppl.modeling import Model
from llamppl.rng import make_rng
from llamppl.row_sampling import sample_index
from llamppl.validation import (
    check_nonnegative_int,
    check_positive_int,
    is_real,
)

from .generation import Generation

__all__ = [
    "PowerSampling",
    "power_smc",
    "low_temperature_decode",
    "temperature_proposal",
    "stage_alpha",
    "Generation",
    "PowerSMCResult",
]

#: ``proposal(context_ids, log_p, stage_alpha) -> logits (V,)``: a prefix-only token proposal.
Proposal = Callable[[Sequence[int], torch.Tensor, float], torch.Tensor]


def temperature_proposal(
    context_ids: Sequence[int], log_p: torch.Tensor, alpha: float
) -> torch.Tensor:
    """Logits ``α · log p`` (V,): temperature τ = 1/α, the variance-minimising proposal (Power-SMC Theorem 1)."""
    return alpha * log_p


def check_alpha(alpha: object) -> float:
    """``alpha`` as a float, finite and >= 1, else a ``TypeError``/``ValueError`` naming it."""
    if not is_real(alpha):
        raise TypeError(f"alpha must be a real number >= 1, got {alpha!r}")
    if not math.isfinite(alpha) or alpha < 1:
        raise ValueError(f"alpha must be a finite number >= 1, got {alpha}")
    return float(alpha)


def stage_alpha(alpha: float, ramp_tokens: int, t: int) -> float:
    """Exponent α(t) of the stage that generates token ``t`` (1-based).

    Linear α-ramp (Power-SMC Appendix B) with one stage per token over the first
    ``ramp_tokens`` tokens: α(t) = 1 + (α − 1) · min(t, R)/R, and α(0) = 1 for the
    empty prefix. ``ramp_tokens = 0`` means no ramp (α(t) = α for every t >= 1).
    """
    if ramp_tokens == 0 or t >= ramp_tokens:
        return alpha
    return 1.0 + (alpha - 1.0) * t / ramp_tokens


def prompt_ids(lm: LanguageModel, prompt: str | Sequence[int]) -> list[int]:
    """Token ids of ``prompt`` exactly as :class:`~llamppl.LMContext` builds them (BOS prepended if any)."""
    return list(LMContext(lm, prompt).tokens)


class PowerSampling(Model):
    """Posterior π_α(y|x) ∝ p(y|x)^α over continuations y of ``prompt`` (Power-SMC eq. 1).

    Truncated target. The support is every y that either ends with EOS and has at
    most ``max_tokens`` tokens (EOS counted), or has exactly ``max_tokens`` tokens and
    no EOS (cut off); p(y|x) is the product of the LM's next-token probabilities of
    y's tokens (for a cut-off y, the probability of that prefix). These y partition
    the LM's outcomes, so Σ_y p(y|x) = 1, and the target is
    π_α(y|x) = p(y|x)^α / Z_α with Z_α = Σ_y p(y|x)^α (the SMC ``log_ml`` estimates log Z_α).

    Each ``step`` generates one token: M_t draws it from the proposal q_t (default
    temperature 1/α(t), the stage's exponent), and G_t is the incremental weight
    ω_t = p(y_t|x, y_<t)^α(t) / q_t(y_t|x, y_<t) (Power-SMC eq. 8). EOS is absorbing: the
    particle finishes, so later steps have weight 1 (Appendix D).

    α-ramping (Appendix B, ``ramp_tokens = R > 0``): token t is generated in stage
    α(t) = 1 + (α − 1) · min(t, R)/R (:func:`stage_alpha`); before it, the boundary
    update (α(t) − α(t−1)) · log p(y_{1:t−1}|x) moves the prefix target from
    p^α(t−1) to p^α(t). A particle that ends (EOS or ``max_tokens``) while still ramping
    receives the last boundary update (α − α(t)) · log p(y|x) at once, so every
    finished particle's weight targets p(y|x)^α: the final target is unchanged.

    Parameters
    ----------
    lm : LanguageModel
    prompt : str | Sequence[int]
        Text or token ids (see :class:`~llamppl.LMContext`).
    alpha : float
        Exponent α >= 1 (finite). α = 1 is the LM itself.
    max_tokens : int
        Truncation length T_max >= 1 (tokens generated, EOS included).
    ramp_tokens : int
        Length R >= 0 of the linear α-ramp; 0 disables it.
    proposal : callable | None
        ``proposal(context_ids, log_p, stage_alpha) -> logits (V,)`` for the next token,
        a function of the prefix only (normalised here with ``log_softmax``). It must
        give positive probability to every token the LM does. Default
        :func:`temperature_proposal`.
    """

    def __init__(
        self,
        lm: LanguageModel,
        prompt: str | Sequence[int],
        alpha: float,
        max_tokens: int,
        ramp_tokens: int = 0,
        proposal: Proposal | None = None,
    ) -> None:
        super().__init__()
        if not isinstance(lm, LanguageModel):
            raise TypeError(f"lm must be a LanguageModel, got {type(lm).__name__}")
        self.alpha = check_alpha(alpha)
        self.max_tokens = check_positive_int("max_tokens", max_tokens)
        self.ramp_tokens = check_nonnegative_int("ramp_tokens", ramp_tokens)
        if proposal is not None and not callable(proposal):
            raise TypeError(
                f"proposal must be a callable (context_ids, log_p, alpha) -> logits, got {type(proposal).__name__}"
            )
        self.proposal = proposal or temperature_proposal
        self.context = LMContext(lm, prompt)
        self.stage_alpha = 1.0  # α(0): the empty prefix
        self.log_likelihood = 0.0  # log p(y_{1:t} | x) under the base LM

    @property
    def lm(self) -> LanguageModel:
        return self.context.lm

    async def step(self) -> None:
        t = len(self.context.generated) + 1
        a = stage_alpha(self.alpha, self.ramp_tokens, t)
        if a != self.stage_alpha:  # stage boundary (Appendix B): p(y_{1:t-1})^(α(t) − α(t−1))
            self.score((a - self.stage_alpha) * self.log_likelihood)
            self.stage_alpha = a
        ids = self.context.tokens
        log_p = await self.lm.next_token_logprobs(ids)  # (V,) normalised, on lm.device
        if self.proposal is temperature_proposal:
            log_q = torch.log_softmax(a * log_p, dim=-1)  # (V,) τ = 1/α(t), same support as p
        else:
            log_q = self._custom_log_q(ids, log_p, a)  # (V,)
        token = await self.sample(TokenCategorical(self.lm, log_q))  # M_t: y_t ~ q_t
        v = token.token_id
        lp_v = float(log_p[v])
        self.score(a * lp_v - float(log_q[v]))  # G_t: eq. 8, ω_t = p(y_t)^α(t) / q_t(y_t)
        self.log_likelihood += lp_v
        self.context.extend(v)
        if v in self.lm.eos_token_ids or t >= self.max_tokens:
            if self.stage_alpha != self.alpha:  # ended while ramping: last boundary update
                self.score((self.alpha - self.stage_alpha) * self.log_likelihood)
                self.stage_alpha = self.alpha
            self.finish()

    def _custom_log_q(self, ids: list[int], log_p: torch.Tensor, a: float) -> torch.Tensor:
        logits = torch.as_tensor(
            self.proposal(ids, log_p, a), dtype=log_p.dtype, device=log_p.device
        )
        if logits.shape != log_p.shape:
            raise ValueError(
                f"proposal must return logits of shape {tuple(log_p.shape)}, got {tuple(logits.shape)}"
            )
        log_q = torch.log_softmax(logits, dim=-1)  # (V,)
        # one device sync: NaN anywhere, or q = 0 where p > 0 (p^α/q would then be biased)
        if bool((torch.isnan(log_q) | (torch.isneginf(log_q) & ~torch.isneginf(log_p))).any()):
            raise ValueError(
                "proposal must return logits without NaN that give every token the LM allows a positive probability"
            )
        return log_q

    def string_for_serialization(self) -> str:
        """The generated text, EOS included (so an EOS-terminated y differs from a cut-off one)."""
        return self.lm.decode(self.context.generated)

    def output(self) -> Generation:
        """The particle's continuation as a :class:`Generation`."""
        return Generation.from_tokens(self.lm, self.context.generated, self.log_likelihood)


@dataclass
class PowerSMCResult(Generation):
    """Output of :func:`power_smc`: the chosen continuation plus the whole run.

    Attributes
    ----------
    result : SMCResult
        Final particles, log weights, ``log_ml`` (log Ẑ_α), history, stats.
    particle : PowerSampling
        The chosen particle (drawn ∝ final weight).
    """

    result: SMCResult | None = None
    particle: PowerSampling | None = None


async def power_smc(
    lm: LanguageModel,
    prompt: str | Sequence[int],
    alpha: float = 4.0,
    n_particles: int = 64,
    ess_threshold: float = 0.5,
    ramp_tokens: int = 100,
    max_tokens: int = 2048,
    *,
    resampling: str = "systematic",
    proposal: Proposal | None = None,
    **run: Any,
) -> PowerSMCResult:
    """Power-SMC (Algorithm 1): SMC over :class:`PowerSampling`, output drawn ∝ final weights.

    ``smc_standard``'s engine steps all particles concurrently, so their next-token
    requests coalesce into one batched forward per token; with
    :class:`~llamppl.CachedCausalLM` particles share prefixes in the token trie, and
    resampling clones a particle without copying KV. Resampling happens when
    ESS < ``ess_threshold · N`` (``ess_threshold = 0`` never resamples: importance
    sampling with the power proposal).

    ``**run`` are the run options (:mod:`llamppl.inference.options`): ``seed`` (also
    fixes the final draw), ``progress``, ``record`` (the run record on ``.result.record``,
    for the viewer) and ``max_steps``.

    Returns a :class:`PowerSMCResult` (``.text``, ``.tokens``, ``.log_likelihood`` of the
    chosen output, ``.result`` the :class:`~llamppl.inference.SMCResult`). Defaults are
    the paper's (α = 4, N = 64, κ = 0.5, ramp over 100 tokens, T_max = 2048).
    """
    model = PowerSampling(lm, prompt, alpha, max_tokens, ramp_tokens, proposal)
    n = check_positive_int("n_particles", n_particles)
    rule = ess_rule(ess_threshold, resampling)
    options = options_from("power_smc", run)
    result = await run_population(model, n, SMC(rule), options)
    chosen = result.sample(options.rng)
    out = chosen.output()
    return PowerSMCResult(out.tokens, out.text, out.log_likelihood, result=result, particle=chosen)


async def low_temperature_decode(
    lm: LanguageModel,
    prompt: str | Sequence[int],
    alpha: float,
    max_tokens: int,
    seed: int | np.random.Generator | None = None,
) -> Generation:
    """Token-level temperature τ = 1/α: y_t ~ softmax(α · log p(·|x, y_<t)) (Power-SMC eq. 3).

    Stops at EOS or after ``max_tokens`` tokens. With α = 1 this is plain ancestral
    sampling. Its joint law is Π_t q_t, which generally differs from π_α (§3.2).
    """
    alpha = check_alpha(alpha)
    max_tokens = check_positive_int("max_tokens", max_tokens)
    rng = make_rng(seed)
    ids = prompt_ids(lm, prompt)
    tokens: list[int] = []
    log_likelihood = 0.0
    while len(tokens) < max_tokens:
        log_p = await lm.next_token_logprobs(ids + tokens)  # (V,)
        v = sample_index(alpha * log_p, rng)
        log_likelihood += float(log_p[v])
        tokens.append(v)
        if v in lm.eos_token_ids:
            break
    return Generation.from_tokens(lm, tokens, log_likelihood)
