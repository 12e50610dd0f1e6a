"""The three Feynman–Kac formulations of :class:`~llamppl.models.HardConstraint`, as objects.

LLaMPPL paper §2.2: one target (every prefix in C, the finished text in C_F), three ways to
draw a token and weight it. Each is a :class:`Formulation` with one method, ``draw``, that
draws the next token for a particle, scores the particle's weight with the formulation's
potential and returns the token (or None when the particle died, its cause named)::

    formulation = FORMULATIONS["lazy"]
    token = await formulation.draw(model, ahead=None, only_end=False, left=12)

- :class:`SampleThenCheck` (``"sample"``): M_t = p, G_t = 1_C(s w) (1_{C_F}(s) for an end token);
- :class:`TokenMasking` (``"mask"``): M'_t = p ⊙ 1_C / G'_t, G'_t = Σ_w p(w) 1_C(s w), all
  particles' masks in one batched round;
- :class:`LazyMasking` (``"lazy"``): M'_t drawn by adaptive weighted rejection with an
  unbiased estimate of G'_t as the weight
  (:mod:`~llamppl.decoding.proposals.lazy`, properly weighted: E[Ẑ f(w)] = Σ_w p(w) 1_C(s w) f(w)).

Since M'_t G'_t = M_t G_t token by token (and the lazy pair has the same expectation), all
three define the same posterior and the same Z. The particle (``model``) provides the state
and the primitives: ``context``, ``constraint``, ``state``, ``end_ids``, ``sample``,
``score``, ``die(cause)``, ``count_check()``, ``hint_prob``, ``sound_listings``.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import torch

from llamppl.decoding.proposals.constrained_tokens import (
    DrawnToken,
    MaskedNextToken,
    allowed_hints,
    mask_round,
    masked_round,
)
from llamppl.decoding.proposals.lazy import lazy_draw
from llamppl.decoding.proposals.token_check import TokenCheck, split_costly
from llamppl.rng import current_rng

if TYPE_CHECKING:  # pragma: no cover - for annotations only
    from .hard_constraints import HardConstraint

__all__ = ["FORMULATIONS", "Formulation", "LazyMasking", "SampleThenCheck", "TokenMasking"]


class Formulation:
    """One Feynman–Kac formulation of a hard constraint (module docstring)."""

    #: The ``proposal=`` name that selects it.
    name: str = ""
    #: Whether tokens the constraint allows alone are taken without a draw (``fast_forward``):
    #: only where the weight is the allowed mass, which is then that token's probability.
    takes_forced: bool = True

    async def draw(
        self,
        model: HardConstraint,
        *,
        ahead: torch.Tensor | None,
        only_end: bool,
        left: int | None,
    ) -> int | None:
        """Draw the next token of ``model`` and score its potential; None when it died.

        ``ahead`` holds the row's ``(V,)`` log-probs when the forced chain already read them;
        ``only_end``: only an end token may come (the last position under ``"drop"``);
        ``left``: tokens left in the budget (None: no budget reasoning).
        """
        raise NotImplementedError(f"{type(self).__name__} must implement draw()")

    def __deepcopy__(self, memo: dict) -> Formulation:
        return self  # stateless: clones share it

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


class SampleThenCheck(Formulation):
    """``"sample"``: draw from the LM, then condition (M_t = p, G_t = 1_C(s w))."""

    name = "sample"
    takes_forced = False

    async def draw(self, model, *, ahead, only_end, left):
        ctx, lm, c = model.context, model.context.lm, model.constraint
        token = int(await model.sample(ctx.next_token()))  # M_t = p
        model.count_check()
        if token in model.end_ids:
            if not c.ends(lm, model.state):  # G_t = 1_{C_F}(s)
                model.die(c.end_failure(lm, model.state) or "end before the text is complete")
                return None
        elif only_end:
            model.die("token limit")
            return None
        elif not c.allows(lm, model.state, token):  # G_t = 1_C(s w)
            model.die(f"token outside the {model.constraint_noun}")
            return None
        return token


class TokenMasking(Formulation):
    """``"mask"``: the allowed mass as potential, the masked LM as proposal (one batched
    mask round for every particle of the step)."""

    name = "mask"

    async def draw(self, model, *, ahead, only_end, left):
        ctx, lm, c = model.context, model.context.lm, model.constraint
        log_probs = ahead if ahead is not None else await ctx.next_token_logprobs()  # (V,)
        end_ok = c.ends(lm, model.state)
        q, log_mass = await masked_round(
            lm, c, model.state, log_probs, end_ok, only_end, model.end_ids, model.sound_listings
        )
        if log_mass == -math.inf:
            model.die("token limit" if only_end else model.end_cause())
            return None
        model.score(log_mass)  # G'_t = allowed mass
        return int(await model.sample(MaskedNextToken(ctx, q, log_mass)))  # M'_t = q / G'_t


class LazyMasking(Formulation):
    """``"lazy"``: the masked proposal drawn by adaptive weighted rejection, checking only the
    tokens drawn; ``cheap & costly`` masks with the cheap parts and checks the costly ones."""

    name = "lazy"

    async def draw(self, model, *, ahead, only_end, left):
        drawn = await self._draw(model, ahead, only_end, left)
        if drawn is None:
            return None
        token = int(await model.sample(model.context.next_token(), proposal=drawn))  # + log Ẑ
        if model.weight == -math.inf:  # the hint mixture's rest branch found no token
            model.die("no allowed token besides the hints")
            return None
        return token

    async def _draw(self, model, ahead, only_end, left) -> DrawnToken | None:
        """The lazy draw (:func:`~llamppl.decoding.proposals.lazy.lazy_draw`) on the particle's
        row. With ``left`` tokens in the budget, a token after which the constraint is out of
        reach is never proposed (:class:`~.token_check.TokenCheck`): the weight is the mass of
        the tokens that can still succeed, and the target is unchanged (a text that passes
        within the budget has every prefix reachable; ``reachable`` is sound)."""
        ctx, lm, c, state = model.context, model.context.lm, model.constraint, model.state
        log_probs = ahead if ahead is not None else await ctx.next_token_logprobs()  # (V,)
        row = log_probs
        (cheap, costly_allows), mask = split_costly(lm, c), None
        if cheap is not None:
            mask = await mask_round(lm, c, state, cheap)  # (V,) bool
        if left is not None:  # tokens after which the budget certainly fails are left out
            budget = c.budget_mask(lm, state, left)
            if budget is not None:
                mask = budget if mask is None else mask & budget
        if mask is not None:
            # end tokens (EOS, and newlines under stop="newline") are never masked out: the
            # draw's check decides them by the complete check of the whole constraint
            mask = mask.clone()
            mask[torch.as_tensor(model.end_ids, dtype=torch.long, device=mask.device)] = True
            row = log_probs.masked_fill(~mask, -math.inf)
        allowed = TokenCheck(
            c,
            lm,
            state,
            costly_allows,
            model.end_ids,
            only_end=only_end,
            left=left,
            counted=model.count_check,
            sound=model.sound_listings,
            context=ctx.tokens,
        )
        on = model.hint_prob and not only_end
        hints, checked = allowed_hints(c, lm, state, row, allowed, model.end_ids, on)
        rest = _rest_check(checked, allowed)
        exhaust = allowed.exhauster(checked, row)
        draw = await lazy_draw(row, rest, current_rng(), hints, model.hint_prob, exhaust)
        full = allowed if mask is None else _within(mask, allowed)
        if draw.token is None and hints:  # the rest branch found A − H empty: weight 0 (a
            return DrawnToken(lm, log_probs, (*hints[0], -math.inf), full)  # token, for replays)
        if draw.token is None:  # Z = 0 exactly: no token of positive probability is allowed
            model.die("token limit" if only_end else model.end_cause())
            return None
        return DrawnToken(lm, log_probs, (draw.token, draw.log_p, draw.log_weight), full)


def _rest_check(checked: set[int], allowed: Any):
    """The check of the rest branch: the hints already checked count as rejected."""
    return lambda w: w not in checked and allowed(w)


def _within(mask: torch.Tensor, allowed: Any):
    """``allowed`` restricted to the tokens ``mask`` keeps (the exact masked proposal)."""
    return lambda w: bool(mask[w]) and allowed(w)


#: The formulations by their ``proposal=`` name.
FORMULATIONS: dict[str, Formulation] = {
    f.name: f for f in (SampleThenCheck(), TokenMasking(), LazyMasking())
}
