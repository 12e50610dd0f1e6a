"""``PromptIntersection``: a continuation likely under several prompts at once (LLaMPPL paper §2.2).

With prompts x_0, ..., x_m and p_i(w | s) = softmax(f(x_i s))_w, the target is
the normalised product of experts over continuations s,

    P(s) ∝ ∏_{i=0}^m P_{x_i}(S = s),     Z = Σ_s ∏_i P_{x_i}(S = s)

(paper §2.2, "This defines a product-of-experts posterior"). Two Feynman–Kac
models reach it; ``proposal`` picks one:

``"first"`` (paper Figure 2) — propose from the first prompt, score by the others::

    M_t(s w | s) = p_0(w | s)               G_t = ∏_{i>=1} p_i(w | s)

``"product"`` — the locally optimal proposal, with its normaliser as potential::

    M'_t(s w | s) = ∏_i p_i(w | s) / G'_t   G'_t = Σ_w ∏_{i=0}^m p_i(w | s)

In both, M_t G_t = ∏_i p_i(w | s) per token, so the posteriors and Z agree;
``"product"`` has lower variance (Figure 4 of the paper, and
``benchmarks/fig4_prompt_intersection.py`` here).

A particle stops after EOS, after a token whose text contains one of
``stop_strings`` (e.g. ``(".", "!", "?")`` to stop after one sentence, as in the
paper's Figure 4), or after ``max_tokens`` generated tokens. Final states are stopped
strings (probability ∏_i P_{x_i}(s), stop token included) and strings
truncated at ``max_tokens`` tokens (probability ∏_i P_{x_i}(first max_tokens
tokens = s)); the posterior above is over these::

    from llamppl import CachedCausalLM, run
    from llamppl.inference import smc_steer
    from llamppl.models import PromptIntersection
    lm = CachedCausalLM.default()
    model = PromptIntersection(lm, ["My favorite writer is probably", "My favorite physicist is probably"])
    result = run(smc_steer(model, n_particles=8, n_beam=3, seed=0))
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import torch

from llamppl.context import LMContext
from llamppl.distributions import TokenCategorical
from llamppl.lm.base import LanguageModel
from llamppl.modeling import Model
from llamppl.token import Token
from llamppl.validation import check_list, check_positive_int

__all__ = ["PromptIntersection"]

PROPOSALS = ("first", "product")


class PromptIntersection(Model):
    """Product of experts of one LM under several prompts (module docstring has the math).

    Parameters
    ----------
    lm : LanguageModel
    prompts : Sequence[str | Sequence[int]]
        At least two prompts (text or token ids); ``prompts[0]`` is x_0.
    proposal : {"product", "first"}
        Locally optimal product proposal, or the first prompt's LM with the others observed.
    max_tokens : int | None
        Generated tokens after which a particle stops (stop token included in the count).
    stop_strings : Sequence[str]
        A generated token whose text contains one of these also ends the string.
        Subclasses may override :meth:`is_stop_token` instead.

    Attributes
    ----------
    contexts : list[LMContext]
        One context per prompt; all share the generated tokens.
    """

    def __init__(
        self,
        lm: LanguageModel,
        prompts: Sequence[str | Sequence[int]],
        proposal: str = "product",
        max_tokens: int | None = 32,
        stop_strings: Sequence[str] = (),
    ) -> None:
        super().__init__()
        prompts = check_list("prompts", prompts, 2, "two prompts to intersect")
        if proposal not in PROPOSALS:
            raise ValueError(f"proposal must be one of {PROPOSALS}, got {proposal!r}")
        self.proposal = proposal
        self.max_tokens = (
            None if max_tokens is None else check_positive_int("max_tokens", max_tokens)
        )
        if isinstance(stop_strings, str) or not all(isinstance(x, str) and x for x in stop_strings):
            raise TypeError(
                f"stop_strings must be a sequence of non-empty strings, got {stop_strings!r}"
            )
        self.stop_strings = tuple(stop_strings)
        self.contexts = [LMContext(lm, p) for p in prompts]

    def is_stop_token(self, token: Token) -> bool:
        """Whether generating ``token`` ends the string: EOS, or its text contains a stop string."""
        lm = self.contexts[0].lm
        if token in lm.eos_token_ids:
            return True
        text = lm.vocab[int(token)]
        return any(s in text for s in self.stop_strings)

    async def step(self) -> None:
        first, others = self.contexts[0], self.contexts[1:]
        if self.proposal == "first":
            # fetch every prompt's distribution in one LM batch; the calls below reuse it
            await asyncio.gather(*(c.next_token_logprobs() for c in self.contexts))
            token = await self.sample(first.next_token())  # M_t = p_0
            await asyncio.gather(
                *(self.observe(c.next_token(), token) for c in others)
            )  # G_t = ∏_{i>=1} p_i(w)
        else:
            lm = first.lm
            log_probs = await asyncio.gather(
                *(c.next_token_logprobs() for c in self.contexts)
            )  # m+1 × (V,)
            joint = torch.stack(log_probs).sum(dim=0)  # (V,) log ∏_i p_i(w)
            log_g = float(torch.logsumexp(joint, dim=0))  # log G'_t
            self.score(log_g)
            if self.done_stepping():  # no token has positive probability under every prompt
                return
            token = await self.sample(TokenCategorical(lm, joint))  # M'_t ∝ ∏_i p_i(w)
            for c in self.contexts:
                c.extend(int(token))
        if self.is_stop_token(token) or (
            self.max_tokens is not None and len(first.generated) >= self.max_tokens
        ):
            self.finish()

    def string_for_serialization(self) -> str:
        """The shared continuation (an end token not shown; a stop string is)."""
        return str(self.contexts[0])
