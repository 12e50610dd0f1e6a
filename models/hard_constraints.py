"""``HardConstraint``: sample an LM continuation conditioned on a hard constraint.

LLaMPPL paper §2.2, "Hard constraints". Let p be the LM after the prompt x, C
the set of allowed prefixes (given by ``predicate``, see
:mod:`llamppl.decoding.constraints`) and s_{t-1} the text generated so far. The
program offers both Feynman–Kac formulations of the paper:

``proposal="sample"`` — sample, then condition::

    M_t(s_{t-1} w | s_{t-1}) = p(w | x s_{t-1})
    G_t(s_{t-1}, s_t)        = 1_C(s_t)

``proposal="mask"`` — token masking with the allowed mass as potential::

    M'_t(s_{t-1} w | s_{t-1}) = p(w | x s_{t-1}) 1_C(s_{t-1} w) / G'_t
    G'_t(s_{t-1}, s_t)        = Σ_w p(w | x s_{t-1}) 1_C(s_{t-1} w)

Since M'_t G'_t = M_t G_t token by token, both define the same posterior and the
same Z (the paper's G'_t = M_t / M'_t). Masking never wastes a particle on a
forbidden token, so SMC estimates have lower variance. The mask is computed by
``predicate.allowed_mask`` in one vectorised pass over the vocabulary and used
through :meth:`llamppl.LMContext.mask_dist` (observe "next token is allowed",
which scores G'_t and restricts the following ``next_token()`` to the mask).

Posterior. The particle stops at EOS or after ``max_tokens`` generated tokens
(EOS included in the count). Final states are therefore EOS-terminated strings
of at most ``max_tokens`` tokens and non-EOS strings of exactly ``max_tokens``
tokens (truncated), and the posterior is the LM's output *truncated to
``max_tokens`` tokens*, conditioned on the constraint::

    P(s) ∝ p(s | x) · ∏_{t<=|s|} 1_C(s_{1:t}),   Z = Σ_s p(s | x) ∏_t 1_C(s_{1:t})

where p(s | x) is the probability of the whole string (EOS included) for an
EOS-terminated s and the probability of the first ``max_tokens`` tokens for a
truncated one, and 1_C(s_{1:t}) is ``predicate(text)`` for a non-EOS prefix and
``predicate.accepts_end(text)`` for the final EOS (C_F membership). Z is the
probability that the LM's (truncated) output satisfies the constraint. With
``max_tokens=None`` only EOS-terminated strings count (the paper's
P(S = s | S ∈ C_F)); the LM must then stop with probability one.

The formula holds for any predicate. Ideally ``predicate`` is exactly the
prefix set C of C_F. A predicate that also accepts dead-end prefixes gives the
same posterior over EOS-terminated strings (such particles die later, wasting
work; only a dead end cut off at ``max_tokens`` survives as a truncated
string), while one that rejects a prefix of an acceptable string removes that
string from the target.

The text the predicate sees is the concatenation of ``lm.vocab[t]`` over the
generated tokens (EOS excluded), so appending token w appends exactly
``lm.vocab[w]``::

    from llamppl import CachedCausalLM, run
    from llamppl.inference import smc_steer
    from llamppl.models import HardConstraint, max_word_length
    lm = CachedCausalLM.default()
    model = HardConstraint(lm, "The Fed says", max_word_length(5), proposal="mask", max_tokens=20)
    result = run(smc_steer(model, n_particles=8, n_beam=3, seed=0))
    print(result.log_ml, result.sample().text)
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from llamppl.context import LMContext
from llamppl.decoding.constraints import Constraint, as_constraint
from llamppl.lm.base import LanguageModel
from llamppl.modeling import Model
from llamppl.token import Token
from llamppl.validation import check_positive_int

__all__ = ["HardConstraint"]

PROPOSALS = ("mask", "sample")


class HardConstraint(Model):
    """LM continuation of ``prompt`` in which every prefix satisfies ``predicate``.

    Parameters
    ----------
    lm : LanguageModel
    prompt : str | Sequence[int]
        Text or token ids to continue (``lm.bos_token_id`` is prepended as in ``LMContext``).
    predicate : Constraint | Callable[[str], bool]
        Membership in C of the generated text so far. A :class:`Constraint`
        (e.g. ``max_word_length(5)``) gives a vectorised mask; a plain callable is
        called once per vocabulary entry per step under ``proposal="mask"``.
    proposal : {"mask", "sample"}
        The Feynman–Kac formulation (module docstring). Same posterior, same Z.
    max_tokens : int | None
        Generated tokens after which a particle stops (EOS included in the count).

    Attributes
    ----------
    context : LMContext
    text : str
        Generated text as the predicate sees it (vocab strings joined, no EOS).
    """

    def __init__(
        self,
        lm: LanguageModel,
        prompt: str | Sequence[int],
        predicate: Constraint | Callable[[str], bool],
        proposal: str = "mask",
        max_tokens: int | None = 32,
    ) -> None:
        super().__init__()
        if proposal not in PROPOSALS:
            raise ValueError(f"proposal must be one of {PROPOSALS}, got {proposal!r}")
        self.constraint = as_constraint(predicate)
        self.max_tokens = (
            None if max_tokens is None else check_positive_int("max_tokens", max_tokens)
        )
        self.proposal = proposal
        self.context = LMContext(lm, prompt)
        self.text = ""
        if not self.constraint(""):
            raise ValueError(
                "predicate('') is False: the empty continuation is not in C, so no string can satisfy it"
            )

    async def step(self) -> None:
        ctx = self.context
        lm = ctx.lm
        if self.proposal == "mask":
            mask = self.constraint.allowed_mask(lm, self.text)  # (V,) bool, 1_C(s w)
            await self.observe(ctx.mask_dist(mask), True)  # G'_t = Σ_w p(w) 1_C(s w)
            token = await self.sample(ctx.next_token())  # M'_t = p restricted to the mask
        else:
            token = await self.sample(ctx.next_token())  # M_t = p
            self.condition(self._allowed(token))  # G_t = 1_C(s w)
        if token in lm.eos_token_ids:
            self.finish()
            return
        self.text += lm.vocab[int(token)]
        if self.max_tokens is not None and len(ctx.generated) >= self.max_tokens:
            self.finish()

    def _allowed(self, token: Token) -> bool:
        if token in self.context.lm.eos_token_ids:
            return self.constraint.accepts_end(self.text)
        return self.constraint(self.text + self.context.lm.vocab[int(token)])

    def string_for_serialization(self) -> str:
        """The generated text (EOS shown as the LM decodes it)."""
        return str(self.context)
