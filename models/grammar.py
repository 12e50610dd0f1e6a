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
are computed together by :class:`~llamppl.models.grammar_engine.MaskBatcher` and
used through :meth:`llamppl.LMContext.mask_dist`.

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

import warnings
from collections.abc import Sequence
from typing import Any

import torch

from llamppl.context import LMContext
from llamppl.lm.base import LanguageModel
from llamppl.modeling import Model
from llamppl.validation import check_positive_int

from .grammar_engine import Grammar, MatcherState, allowed_masks, mask_batcher

__all__ = ["GrammarConstraint", "make_grammar"]

PROPOSALS = ("mask", "sample")


def make_grammar(
    grammar: Grammar | None = None,
    *,
    json_schema: Any = None,
    regex: str | None = None,
    lark: str | None = None,
) -> Grammar:
    """A :class:`Grammar` from exactly one of ``grammar``, ``json_schema``, ``regex``, ``lark``."""
    given = {
        k: v
        for k, v in (
            ("grammar", grammar),
            ("json_schema", json_schema),
            ("regex", regex),
            ("lark", lark),
        )
        if v is not None
    }
    if len(given) != 1:
        raise ValueError(
            "give exactly one of grammar=, json_schema=, regex=, lark= "
            f"(got {sorted(given) or 'none'})"
        )
    ((kind, value),) = given.items()
    if kind == "grammar":
        if not isinstance(value, Grammar):
            raise TypeError(
                "grammar must be a Grammar (use json_schema=, regex= or lark= for sources), "
                f"got {type(value).__name__}"
            )
        return value
    return {
        "json_schema": Grammar.from_json_schema,
        "regex": Grammar.from_regex,
        "lark": Grammar.from_lark,
    }[kind](value)


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
            mask = await self._batcher.mask(self.matcher)  # (V,) bool: 1_C(s w), EOS iff accepting
            if last:  # the budget's final token must be EOS
                eos_only = torch.zeros_like(mask)
                eos_only[lm.eos_token_id] = mask[lm.eos_token_id]
                mask = eos_only
            await self.observe(ctx.mask_dist(mask), True)  # G'_t = allowed mass
            token = await self.sample(ctx.next_token())  # M'_t = p restricted to the mask
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
