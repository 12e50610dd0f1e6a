"""``GrammarConstraint``: LM output conditioned on a grammar (JSON Schema, regex or Lark), exactly.

Let p be the LM after the prompt x and L the grammar's language. The target is
the LM's output conditioned on membership in L::

    P(y) ∝ p(y EOS | x) · 1_L(y),   Z = Σ_{y ∈ L} p(y EOS | x) = P(valid)

(restricted to at most ``max_tokens`` generated tokens, EOS included, when
``max_tokens`` is set: a particle that reaches the budget without EOS gets
weight zero). Write C for the prefixes of L (prefixes from which the engine
allows a continuation) and s_{t-1} for the tokens so far. The two Feynman–Kac
formulations of the LLaMPPL paper (§2.2, as in
:mod:`llamppl.models.hard_constraints`) are:

``proposal="sample"`` — sample, then condition::

    M_t(w | s_{t-1}) = p(w | x s_{t-1}),   G_t = 1_C(s_{t-1} w)   (EOS: 1_L(s_{t-1}))

``proposal="mask"`` — token masking with the allowed mass as potential::

    M'_t(w | s_{t-1}) = p(w | x s_{t-1}) 1_C(s_{t-1} w) / G'_t
    G'_t             = Σ_w p(w | x s_{t-1}) 1_C(s_{t-1} w)

Both give the same posterior and the same Z (M'_t G'_t = M_t G_t token by
token). The mask 1_C(s w) over the whole vocabulary comes from llguidance; EOS is
allowed exactly when the matcher accepts. The masks of all particles in a step
are computed and applied together by
:class:`~llamppl.decoding.grammar_engine.MaskBatcher` (one llguidance call, one
multiplication of the ``(N, V)`` probabilities by the ``(N, V)`` 0/1 masks), and
:class:`MaskedNextToken` draws from the result — the batched counterpart of
:meth:`llamppl.LMContext.mask_dist` followed by ``next_token()``.

*Local masking* (the mask proposal without G'_t — what Outlines, XGrammar, vLLM
and HF ``generate`` with :class:`~llamppl.models.GrammarLogitsProcessor` do)
samples a distorted distribution; ``enumerate_exact`` of this program, or SMC
with enough particles, gives the exact conditional::

    from llamppl import CachedCausalLM, run
    from llamppl.inference import smc_standard
    from llamppl.models import GrammarConstraint
    lm = CachedCausalLM.default()
    model = GrammarConstraint(lm, "Answer: ", regex=r"(yes|no)\\.", max_tokens=8)
    result = run(smc_standard(model, n_particles=8, seed=0))
    print(result.log_ml, result.posterior)
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence
from typing import Any

import torch

from llamppl.context import LMContext
from llamppl.decoding.grammar_engine import (
    Grammar,
    MatcherState,
    allowed_masks,
    make_grammar,
    mask_batcher,
)
from llamppl.distributions import Distribution
from llamppl.lm.base import LanguageModel
from llamppl.modeling import Model
from llamppl.rng import current_rng
from llamppl.token import Token
from llamppl.validation import check_positive_int

__all__ = ["GrammarConstraint", "MaskedNextToken"]

PROPOSALS = ("mask", "sample")


class GrammarConstraint(Model):
    """LM continuation of ``prompt`` conditioned on lying in a grammar's language.

    Parameters
    ----------
    lm : LanguageModel
    prompt : str | Sequence[int]
        Text or token ids to continue (as in :class:`~llamppl.LMContext`).
    grammar : Grammar, optional
        A compiled grammar; or give exactly one of the next three.
    json_schema : dict | str | type, optional
        JSON Schema as a dict, a JSON string, or a pydantic model class.
    regex : str, optional
        Regular expression the whole output must match.
    lark : str, optional
        Lark grammar (llguidance dialect, rule ``start``).
    proposal : {"mask", "sample"}
        Feynman–Kac formulation (module docstring); same posterior, same Z.
    max_tokens : int | None
        Token budget, EOS included; a particle without EOS by then gets weight zero.

    Attributes
    ----------
    context : LMContext
    matcher : MatcherState
        The particle's grammar state (cloned with the particle).
    """

    def __init__(
        self,
        lm: LanguageModel,
        prompt: str | Sequence[int],
        grammar: Grammar | None = None,
        *,
        json_schema: Any = None,
        regex: str | None = None,
        lark: str | None = None,
        proposal: str = "mask",
        max_tokens: int | None = 64,
    ) -> None:
        super().__init__()
        if proposal not in PROPOSALS:
            raise ValueError(f"proposal must be one of {PROPOSALS}, got {proposal!r}")
        self.grammar = make_grammar(grammar, json_schema=json_schema, regex=regex, lark=lark)
        self.max_tokens = (
            None if max_tokens is None else check_positive_int("max_tokens", max_tokens)
        )
        self.proposal = proposal
        self.context = LMContext(lm, prompt)
        self.matcher = MatcherState(lm, self.grammar)
        self._batcher = mask_batcher(lm)
        if not bool(allowed_masks(lm, [self.matcher]).any()):
            warnings.warn(
                f"the {self.grammar.kind} admits no token of this LM's vocabulary as a first token: "
                "every particle will have weight zero (log_ml = -inf)",
                stacklevel=2,
            )

    async def step(self) -> None:
        ctx = self.context
        lm = ctx.lm
        last = self.max_tokens is not None and len(ctx.generated) + 1 >= self.max_tokens
        if self.proposal == "mask":
            log_probs = await ctx.next_token_logprobs()  # (V,), coalesced across particles
            # batched over the step's particles: q = p · 1_C(s w) (EOS iff accepting), G'_t = Σ q
            q, log_mass = await self._batcher.apply(self.matcher, log_probs, final=last)
            self.score(log_mass)  # G'_t = allowed mass
            token = await self.sample(MaskedNextToken(ctx, q, log_mass))  # M'_t = q / G'_t
            if token == lm.eos_token_id:
                self.finish()
            elif not self.matcher.consume(int(token)):
                raise RuntimeError(
                    f"llguidance rejected token {int(token)} it allowed: {self.matcher.matcher.get_error()}"
                )
            return
        token = await self.sample(ctx.next_token())  # M_t = p
        if token == lm.eos_token_id:
            self.condition(self.matcher.accepting)  # G_t = 1_L(s)
            self.finish()
            return
        self.condition(not last and self.matcher.consume(int(token)))  # G_t = 1_C(s w)

    @property
    def text(self) -> str:
        """The generated text without EOS."""
        ids = self.context.generated
        if ids and ids[-1] == self.context.lm.eos_token_id:
            ids = ids[:-1]
        return self.context.lm.decode(ids)

    def string_for_serialization(self) -> str:
        """The generated text (without EOS): the posterior key."""
        return self.text


class MaskedNextToken(Distribution):
    """The token-masking proposal M'_t = q / G'_t from precomputed masked probabilities.

    The batched counterpart of ``context.mask_dist(mask)`` + ``context.next_token()``
    (:mod:`llamppl.context`): ``q`` (``(V,)``, unnormalised, zero outside the mask)
    and ``log G' = log Σ q`` come from one batched
    :func:`~llamppl.decoding.grammar_engine.apply_masks` for all particles of the
    step. Sampling or observing a token extends the context.
    """

    def __init__(self, context: LMContext, q: torch.Tensor, log_mass: float) -> None:
        self.context, self.q, self.log_mass = context, q, log_mass

    async def sample(self, rng=None):
        cdf = torch.cumsum(self.q, dim=0)  # (V,)
        u = float((rng or current_rng()).random()) * float(cdf[-1])
        i = int(
            torch.searchsorted(
                cdf, torch.tensor([u], dtype=cdf.dtype, device=cdf.device), right=True
            )
        )
        i = min(i, cdf.numel() - 1)
        if self.q[i] <= 0:  # u on the float boundary at the very top: the last allowed token
            i = int(torch.nonzero(self.q > 0)[-1])
        return await self._take(i)

    async def log_prob(self, value):
        return (await self._take(int(value)))[1]

    async def _take(self, i: int):
        self.context.extend(i)
        p = float(self.q[i])
        return Token(self.context.lm, i), (math.log(p) - self.log_mass if p > 0 else -math.inf)

    async def support(self):
        ids = torch.nonzero(self.q > 0).flatten().tolist()
        return [
            (Token(self.context.lm, i), math.log(float(self.q[i])) - self.log_mass) for i in ids
        ]
