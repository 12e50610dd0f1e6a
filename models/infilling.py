"""``Infilling``: fill the holes of a template with LM text (LLaMPPL paper §2.2, "Infilling").

Fragments x_0, ..., x_n (strings, each tokenised on its own) are the known
text; the program writes s = x_0 h_1 x_1 ... h_n x_n EOS. It starts from
s_0 = x_0 (the prompt) and step t (1 <= t <= n) appends a hole h_t of a
geometric number of sampled tokens and then the fragment x_t. With
P(k) = (1-q)^k q the Geometric(q) law (q = ``geometric_p``), p the LM and
e_i = p(EOS | s_{t-1} h_t^{<i})::

    M_t(s_{t-1} h_t x_t | s_{t-1}) = P(|h_t|) ∏_{i<=|h_t|} p(h_t^i | s_{t-1} h_t^{<i}) / (1 - e_i)
    G_t(s_{t-1}, s_t)              = P(|h_t|)^{-1} ∏_{i<=|h_t|} (1 - e_i) ∏_{i<=|x_t|} p(x_t^i | s_{t-1} h_t x_t^{<i})

For q = 1/2, P(k)^{-1} = 2^{|h_t|+1}: the paper's kernels and potentials. Hole
tokens are never EOS (a string cannot continue after EOS), so the hole proposal
is the LM with EOS masked out and G_t carries the non-EOS mass 1 - e_i per hole
token (the token-masking construction of :mod:`~llamppl.models.hard_constraints`;
the paper leaves this case implicit). The last step also observes EOS after x_n
(the paper's x_n ∈ F; ``eos=False`` drops it). Fragments are scored token by
token, so the target counts the token sequences that contain each fragment's
own tokenisation.

Posterior. M_t G_t = p(h_t x_t | s_{t-1}) for every hole, so a path h_{1:n} has
weight p(h_1 x_1 ... h_n x_n EOS | x_0) and

    P(h_{1:n}) ∝ p(h_1 x_1 ... h_n x_n EOS | x_0),   Z = Σ_{h_{1:n}} p(h_1 x_1 ... h_n x_n EOS | x_0),

the LM conditioned on the template (paper: P(s) = P(S = s | ∃h. S = x_0 h_1 ... x_n)),
Z being the probability that the LM continues x_0 into the template. Over
strings, a token string with several decompositions into holes (a fragment
recurring inside a hole) is counted once per decomposition; when decompositions
are unique it is exactly the LM conditioned on matching the template.

``length_correction=False`` drops P(|h_t|)^{-1} from G_t: the geometric law then
stays in the posterior as a prior favouring short holes,
P(h_{1:n}) ∝ ∏_t P(|h_t|) · p(h_1 x_1 ... EOS | x_0).

``max_hole_tokens=L`` bounds each hole: |h_t| follows the geometric law
truncated to {0, ..., L}, P_L(k) = (1-q)^k q / (1 - (1-q)^{L+1}), and the
correction divides by P_L(k). The posterior is then the LM conditioned on the
template with holes of at most L tokens (times ∏ P_L(|h_t|) without the
correction). Every choice has finite support, so ``enumerate_exact`` applies::

    from llamppl import CachedCausalLM, run
    from llamppl.inference import smc_steer
    from llamppl.models import Infilling
    lm = CachedCausalLM.default()
    model = Infilling.from_template(lm, "To tell the truth, every[BLANK] he[BLANK] to[BLANK] another[BLANK].")
    result = run(smc_steer(model, n_particles=8, n_beam=3, seed=0))
    print(result.sample())
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Sequence

import numpy as np
import torch

from llamppl.context import LMContext
from llamppl.distributions import Distribution, Geometric
from llamppl.lm.base import LanguageModel
from llamppl.lm.memo import lm_table
from llamppl.modeling import Model
from llamppl.rng import current_rng
from llamppl.row_sampling import sample_index
from llamppl.validation import check_list, check_nonnegative_int, check_unit_interval

__all__ = ["Infilling", "TruncatedGeometric", "split_template", "BLANK"]

BLANK = "[BLANK]"


class TruncatedGeometric(Distribution):
    """Geometric(p) restricted to {0, ..., max_value}: P(k) = (1-p)^k p / (1 - (1-p)^{max_value+1})."""

    def __init__(self, p: float, max_value: int) -> None:
        self.p = check_unit_interval("geometric_p", p)
        self.max_value = check_nonnegative_int("max_hole_tokens", max_value)
        k = np.arange(self.max_value + 1)
        with np.errstate(divide="ignore"):
            log_q = np.log1p(-self.p) if self.p < 1 else -np.inf
            logp = np.where(k == 0, 0.0, k * log_q) + math.log(self.p)
        self.log_probs = logp - np.logaddexp.reduce(logp)  # (max_value + 1,)

    async def sample(self, rng=None):
        k = sample_index(torch.from_numpy(self.log_probs), rng or current_rng())
        return k, float(self.log_probs[k])

    async def log_prob(self, value):
        k = int(value)
        return float(self.log_probs[k]) if 0 <= k <= self.max_value else -math.inf

    async def support(self):
        return [(k, float(lp)) for k, lp in enumerate(self.log_probs) if lp > -math.inf]

    def __deepcopy__(self, memo: dict) -> TruncatedGeometric:
        return self  # immutable: particles share it

    def __repr__(self) -> str:
        return f"TruncatedGeometric({self.p}, {self.max_value})"


def _not_eos_mask(lm: LanguageModel) -> torch.Tensor:
    mask = torch.ones(lm.vocab_size, dtype=torch.bool, device=lm.device)  # (V,)
    mask[list(lm.eos_token_ids)] = False
    return mask


def split_template(template: str, blank: str = BLANK) -> list[str]:
    """Fragments of ``template`` around each ``blank`` marker (at least one marker required)."""
    if not isinstance(template, str):
        raise TypeError(f"template must be a str, got {type(template).__name__}")
    if not isinstance(blank, str) or not blank:
        raise ValueError(f"blank must be a non-empty str, got {blank!r}")
    if blank not in template:
        raise ValueError(f"template must contain at least one {blank} marker, got {template!r}")
    return template.split(blank)


class Infilling(Model):
    """Template infilling with geometric hole lengths (module docstring has the math).

    Parameters
    ----------
    lm : LanguageModel
    fragments : Sequence[str]
        x_0, ..., x_n with n >= 1 (n holes). x_0 is the prompt; it may be empty
        only if ``lm`` has a BOS token. Later fragments may be empty strings.
    geometric_p : float
        Success probability q in (0, 1] of the hole-length law (mean (1-q)/q tokens).
    length_correction : bool
        Divide by P(|h_t|) in G_t (the paper's 2^{|h_t|+1}); off = prior on short holes.
    max_hole_tokens : int | None
        Truncate hole lengths to {0, ..., max_hole_tokens} (exactly, see module docstring).
    eos : bool
        Observe EOS after the last fragment (the string ends there).

    Attributes
    ----------
    context : LMContext
    holes : list[str]
        Text of the holes filled so far.
    """

    def __init__(
        self,
        lm: LanguageModel,
        fragments: Sequence[str],
        geometric_p: float = 0.5,
        length_correction: bool = True,
        max_hole_tokens: int | None = None,
        eos: bool = True,
    ) -> None:
        super().__init__()
        fragments = check_list(
            "fragments", fragments, 2, "two strings (text before and after a hole)"
        )
        for i, f in enumerate(fragments):
            if not isinstance(f, str):
                raise TypeError(f"fragments[{i}] must be a str, got {type(f).__name__}")
        p = check_unit_interval("geometric_p", geometric_p)
        if max_hole_tokens is None:
            self.hole_length: Distribution = Geometric(p)
        else:
            self.hole_length = TruncatedGeometric(p, max_hole_tokens)
        self.length_correction = bool(length_correction)
        self.eos = bool(eos)
        self.context = LMContext(lm, fragments[0])
        self.prefix = fragments[0]
        self.fragments = [
            tuple(lm.encode(f)) if f else () for f in fragments[1:]
        ]  # token ids of x_1..x_n
        self.holes: list[str] = []

    @classmethod
    def from_template(
        cls, lm: LanguageModel, template: str, blank: str = BLANK, **kwargs
    ) -> Infilling:
        """``Infilling(lm, split_template(template, blank), **kwargs)``, e.g. ``"every[BLANK] he[BLANK]."``."""
        return cls(lm, split_template(template, blank), **kwargs)

    async def step(self) -> None:
        ctx = self.context
        k = await self.sample(self.hole_length)  # |h_t| ~ P (part of M_t)
        start = len(ctx.tokens)
        for _ in range(k):
            not_eos = lm_table(ctx.lm, "not_eos", _not_eos_mask)  # (V,) bool, shared
            await self.observe(ctx.mask_dist(not_eos), True)  # G_t *= 1 - p(EOS)
            await self.sample(ctx.next_token())  # h_t^i ~ p(· | s h^{<i}, not EOS)
        self.holes.append(ctx.lm.decode(ctx.tokens[start:]))
        if self.length_correction:
            self.score(
                -(await self.hole_length.log_prob(k))
            )  # G_t *= 1 / P(|h_t|) = 2^{|h_t|+1} for q = 1/2
        last = len(self.holes) == len(self.fragments)
        fragment = list(self.fragments[len(self.holes) - 1])
        if last and self.eos:
            fragment.append(ctx.lm.eos_token_id)  # scored as P(any of lm.eos_token_ids)
        await self._observe_tokens(fragment)  # G_t *= ∏_i p(x_t^i | s h_t x_t^{<i})
        if last:
            self.finish()

    async def _observe_tokens(self, tokens: list[int]) -> None:
        """Score and append known tokens; all their next-token distributions in one LM batch."""
        ctx = self.context
        base = list(ctx.tokens)
        log_probs = await asyncio.gather(
            *(ctx.lm.next_token_logprobs(base + tokens[:i]) for i in range(len(tokens)))
        )  # len(tokens) × (V,)
        eos = ctx.lm.eos_token_id
        ends = list(ctx.lm.eos_token_ids)
        self.score(
            sum(
                float(torch.logsumexp(lp[ends], 0)) if tok == eos else float(lp[tok])
                for lp, tok in zip(log_probs, tokens)
            )
        )  # the string ends with any end token (chat models have several)
        for tok in tokens:
            ctx.extend(tok)

    def state_key(self) -> tuple:
        """Tokens and holes so far (two decompositions of one string stay distinct particles)."""
        return (type(self).__name__, tuple(self.context.tokens), tuple(self.holes))

    def string_for_serialization(self) -> str:
        """The whole filled-in text x_0 h_1 x_1 ... h_n x_n (EOS not shown)."""
        ids = self.context.generated
        if ids and ids[-1] in self.context.lm.eos_token_ids:
            ids = ids[:-1]
        return self.prefix + self.context.lm.decode(ids)
