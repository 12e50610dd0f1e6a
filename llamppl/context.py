"""``LMContext``: a growing token context and the distributions it offers.

``context.next_token()`` is the LM's (tempered) next-token distribution;
sampling or observing it appends the token. ``context.mask_dist(mask)`` is the
Bernoulli "the next token lies in ``mask``", with probability equal to the
allowed mass; observing ``True`` also restricts the following ``next_token()``
to ``mask`` (renormalised) — the token-masking proposal of the LLaMPPL paper
(§2.2, hard constraints, formulation (b))::

    ctx = LMContext(lm, "The Fed says")
    await self.observe(ctx.mask_dist(allowed_ids), True)   # G' = allowed mass
    token = await self.sample(ctx.next_token())             # M' = LM masked to allowed
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

import torch

from .distributions import Distribution, token_support
from .lm.base import LanguageModel, validate_token_ids
from .rng import current_rng
from .row_sampling import gather_row, row_masses, sample_row
from .token import Token

__all__ = ["LMContext", "LMNextToken", "LMTokenMask"]


class LMContext:
    """Prompt plus generated tokens for one particle.

    Parameters
    ----------
    lm : LanguageModel
    prompt : str | Sequence[int] | None
        Text (encoded with ``lm.encode``) or token ids. ``lm.bos_token_id`` is
        prepended when the LM has one. Must be non-empty when it has none.
        Give either ``prompt`` or ``messages``.
    messages : list[dict] | None
        A chat, e.g. ``[{"role": "user", "content": "Hi!"}]``, rendered with the
        model's chat template up to the assistant's turn
        (:meth:`~llamppl.lm.base.LanguageModel.apply_chat_template`). The reply
        ends with any of ``lm.eos_token_ids`` (e.g. ``<|im_end|>``).
    temp : float
        Temperature τ > 0: ``next_token()`` draws from ``softmax(log p / τ)`` and its
        ``log_prob`` is that tempered probability.
    show_prompt : bool
        Whether ``str(context)`` starts with the prompt (default: the generated text only).
    show_eos : bool
        Whether ``str(context)`` ends with the end token's text (``<|im_end|>``) once the
        context has ended. Default False: a check on ``str(context)`` sees the text the model
        wrote, so ``condition("e" not in str(context))`` does not kill every ending particle.
        LLaMPPL's default was True; pass ``show_eos=True`` for its display.
    heal : bool
        Token healing (default False): back off the prompt's last token and make the first
        generated tokens re-spell its bytes (``"… is Pa"`` may continue as ``" Paris"``).
        While :attr:`healing` is non-empty, observe :meth:`heal_dist` before each token (or
        ``await model.call(context.heal())`` once): its allowed mass is the exact weight of
        "the text after the kept tokens starts with the backed-off bytes"
        (:mod:`llamppl.lm.bytes.healing`). ``str(context)`` shows the text after the prompt.

    Attributes
    ----------
    tokens : list[int]
        All token ids, prompt first.
    prompt_length : int
        Number of prompt tokens at the start of ``tokens``.
    """

    def __init__(
        self,
        lm: LanguageModel,
        prompt: str | Sequence[int] | None = None,
        temp: float = 1.0,
        show_prompt: bool = False,
        show_eos: bool = False,
        *,
        messages: Sequence[dict] | None = None,
        heal: bool = False,
    ) -> None:
        if not isinstance(lm, LanguageModel):
            raise TypeError(f"lm must be a LanguageModel, got {type(lm).__name__}")
        if not (isinstance(temp, (int, float)) and math.isfinite(temp) and temp > 0):
            raise ValueError(f"temp must be a positive finite number, got {temp!r}")
        if (prompt is None) == (messages is None):
            raise ValueError("give exactly one of prompt (text or token ids) and messages (a chat)")
        if messages is not None:
            ids = list(lm.apply_chat_template(_check_messages(messages)))
        elif isinstance(prompt, str):
            ids = list(lm.encode(prompt))
        else:
            ids = list(validate_token_ids(prompt, lm.vocab_size, "prompt"))
        bos = lm.bos_token_id
        if bos is not None and (not ids or ids[0] != bos):
            ids.insert(0, bos)
        healing = b""
        if heal and len(ids) > (bos is not None):
            from .lm.bytes.healing import heal_prompt

            ids, healing = heal_prompt(lm, ids)
        if not ids:
            raise ValueError(
                "prompt must be non-empty: this language model has no BOS token to start from"
            )
        self.lm = lm
        self.tokens: list[int] = ids
        self.prompt_length = len(ids)
        self.temp = float(temp)
        self._mask: torch.Tensor | None = None  # (V,) bool, set by an observed mask_dist
        self.show_prompt = bool(show_prompt)  # what str(context) shows
        self.show_eos = bool(show_eos)
        self._annotations: dict[str, object] = {}  # per-particle notes of proposals (annotate)
        self._healing = healing  # prompt bytes the next tokens must still re-spell (heal=True)
        self._healed = healing  # all backed-off bytes, which str(context) leaves out

    # ------------------------------------------------------------------ distributions
    def next_token(self) -> LMNextToken:
        """Distribution over the next token; sampling or observing it extends the context."""
        if self.__dict__.get("_healing") and self._mask is None:
            raise ValueError(
                f"this context is healing its prompt ({self._healing!r} still to re-spell): "
                "observe context.heal_dist() before the next token, or await "
                "model.call(context.heal())"
            )
        return LMNextToken(self)

    @property
    def healing(self) -> bytes:
        """Prompt bytes the next tokens must still re-spell (``heal=True``); ``b""`` when none."""
        return self.__dict__.get("_healing", b"")

    def heal_dist(self) -> LMTokenMask:
        """Bernoulli "the next token is consistent with :attr:`healing`" (it extends the
        bytes left or is a proper prefix of them); observe ``True`` to weight by the allowed mass
        and restrict the next token to it (exact: LLaMPPL §2.2, formulation (b))."""
        if not self.healing:
            raise ValueError("heal_dist(): nothing to heal (make the context with heal=True)")
        from .lm.bytes.healing import consistent_mask

        return LMTokenMask(self, consistent_mask(self.lm, self.healing))

    def heal(self):
        """A SubModel that re-spells :attr:`healing` (``await model.call(context.heal())``):
        before each token it observes :meth:`heal_dist` ``True``; returns the token ids drawn."""
        from .submodel import submodel

        @submodel
        async def heal(sub):
            drawn = []
            while self.healing:
                await sub.observe(self.heal_dist(), True)
                if self.pending_mask is None:
                    break  # no consistent token: the weight is 0
                drawn.append(int(await sub.sample(self.next_token())))
            return drawn

        return heal()

    def next_tokens(self, n: int):
        """A SubModel sampling ``n`` next tokens (``await model.call(ctx.next_tokens(n))``); returns their ids."""
        from .submodel import submodel
        from .validation import check_positive_int

        n = check_positive_int("n", n)

        @submodel
        async def next_tokens(sub):
            return [int(await sub.sample(self.next_token())) for _ in range(n)]

        return next_tokens()

    def mask_dist(self, mask: Iterable[int] | torch.Tensor) -> LMTokenMask:
        """Bernoulli distribution of "the next token is in ``mask``" (ids or a ``(V,)`` bool tensor)."""
        return LMTokenMask(self, self._as_mask(mask))

    # ------------------------------------------------------------------ state
    @property
    def generated(self) -> list[int]:
        """Token ids generated after the prompt."""
        return self.tokens[self.prompt_length :]

    @property
    def prompt(self) -> str:
        return self.lm.decode(self.tokens[: self.prompt_length])

    @property
    def finished(self) -> bool:
        """Whether the last token ends the sequence (is one of ``lm.eos_token_ids``)."""
        return len(self.tokens) > self.prompt_length and self.tokens[-1] in self.lm.eos_token_ids

    def extend(self, token_id: int) -> None:
        """Append a token (clears any pending mask)."""
        self.tokens.append(int(token_id))
        self._mask = None
        if self.__dict__.get("_healing"):
            from .lm.bytes.healing import after_token

            rest = after_token(self.lm, self._healing, token_id)
            self._healing = b"" if rest is None else rest  # inconsistent: its weight is 0

    @property
    def pending_mask(self) -> torch.Tensor | None:
        """``(V,)`` bool mask the next token is restricted to by observed ``mask_dist`` values, or None.

        Assigning it (ids, a ``(V,)`` bool tensor, an ``lm.masks`` set, or None) replaces it.
        """
        return self._mask

    @pending_mask.setter
    def pending_mask(self, mask: Iterable[int] | torch.Tensor | None) -> None:
        self._mask = None if mask is None else self._as_mask(mask)

    def restrict_next(self, mask: torch.Tensor) -> None:
        """Restrict the next token to ``mask`` (``(V,)`` bool) as well: the pending mask becomes ``m0 & mask``."""
        self._mask = mask if self._mask is None else self._mask & mask

    def annotation(self, key: str, default: object = None) -> object:
        """The note ``key`` a proposal attached to this context with :meth:`annotate`, else ``default``."""
        return self._annotations.get(key, default)

    def annotate(self, key: str, value: object) -> None:
        """Attach a note (e.g. a proposal's per-particle history) that is copied with the particle.

        Notes are not part of :meth:`state_key`; store immutable values (copies are shallow).
        """
        self._annotations[key] = value

    async def next_token_logprobs(self) -> torch.Tensor:
        """Tempered next-token log-probs ``(V,)``, ignoring a pending mask; batched with the
        other particles' requests (``await context.next_token_logprobs()``)."""
        lp = await self.lm.next_token_logprobs(self.tokens)
        return lp if self.temp == 1.0 else torch.log_softmax(lp / self.temp, dim=-1)

    def __str__(self) -> str:
        ids = self.tokens if self.show_prompt else self.generated
        if not self.show_eos and ids and ids[-1] in self.lm.eos_token_ids:
            ids = ids[:-1]
        text = self.lm.decode(ids)
        healed = self.__dict__.get("_healed", b"").decode("utf-8", errors="replace")
        if healed and not self.show_prompt and text.startswith(healed):
            return text[len(healed) :]  # heal=True: the re-spelled prompt bytes are prompt
        return text

    def __repr__(self) -> str:
        return f"LMContext({self.prompt!r} + {str(self)!r})"

    def state_key(self) -> tuple:
        mask = None if self._mask is None else tuple(torch.nonzero(self._mask).flatten().tolist())
        return (tuple(self.tokens), self.temp, mask)

    def __deepcopy__(self, memo) -> LMContext:
        new = object.__new__(LMContext)
        new.__dict__.update(self.__dict__)
        new.tokens = list(self.tokens)  # the LM and its trie nodes are shared, not copied
        new._annotations = dict(self.__dict__.get("_annotations", {}))
        return new

    def _as_mask(self, mask: Iterable[int] | torch.Tensor) -> torch.Tensor:
        V, device = self.lm.vocab_size, self.lm.device
        cached = getattr(mask, "tensor", None)  # a TokenSet from lm.masks
        if isinstance(cached, torch.Tensor) and cached.shape == (V,):
            return cached.to(device)
        if isinstance(mask, torch.Tensor) and mask.dtype == torch.bool:
            if mask.shape != (V,):
                raise ValueError(
                    f"mask must be a ({V},) bool tensor, got shape {tuple(mask.shape)}"
                )
            return mask.to(device)
        ids = validate_token_ids(list(mask), V, "mask")
        out = torch.zeros(V, dtype=torch.bool, device=device)
        out[list(ids)] = True
        return out


def _check_messages(messages: object) -> list[dict]:
    """``messages`` as a list of ``{"role": str, "content": ...}`` dicts, or a clear error."""
    if isinstance(messages, (str, bytes, dict)) or not isinstance(messages, Sequence):
        raise TypeError(
            'messages must be a list of {"role": ..., "content": ...} dicts, '
            f"got {type(messages).__name__}"
        )
    if not messages:
        raise ValueError("messages must contain at least one message")
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str) or "content" not in m:
            raise TypeError(
                f'messages[{i}] must be a dict with a str "role" and a "content", got {m!r}'
            )
    return list(messages)


class LMNextToken(Distribution):
    """Next-token distribution of an ``LMContext`` (masked and renormalised if a mask is pending)."""

    def __init__(self, context: LMContext) -> None:
        self.context = context

    async def log_probs(self) -> torch.Tensor:
        """The ``(V,)`` log-probs, masked and renormalised if a mask is pending (one row: for
        ``support()`` and callers; ``sample``/``log_prob`` mask inside the batched read)."""
        lp = await self.context.next_token_logprobs()
        mask = self.context.pending_mask
        if mask is not None:
            lp = torch.log_softmax(lp.masked_fill(~mask, -math.inf), dim=-1)
        return lp

    async def sample(self, rng=None):
        # The pending mask goes to the batched draw: one [N, V] masked, renormalised
        # computation for all particles (M'_t of §2.2), no per-particle masked log-softmax.
        lp = await self.context.next_token_logprobs()
        mask = self.context.pending_mask
        i, log_p = await sample_row(lp, rng or current_rng(), mask)
        self.context.extend(i)
        return Token(self.context.lm, i), log_p

    async def log_prob(self, value):
        lp = await self.context.next_token_logprobs()
        mask = self.context.pending_mask  # read before extend() clears it
        i = int(value)
        self.context.extend(i)
        return await gather_row(lp, i, mask)

    async def support(self):
        return token_support(self.context.lm, await self.log_probs())


class LMTokenMask(Distribution):
    """``True`` iff the next token lies in ``mask``; P(True) = allowed probability mass.

    Sampling or observing the value sets the context's pending mask (``mask``
    for True, its complement for False) for the next ``next_token()``. Successive
    mask observations before a token combine: the masses are
    conditional on the pending mask m0, P(mask | m0), and the pending mask
    becomes ``m0 & mask`` — the chain rule P(A ∧ B) = P(A) P(B | A).
    """

    def __init__(self, context: LMContext, mask: torch.Tensor) -> None:
        self.context = context
        self.mask = mask

    async def _log_masses(self) -> tuple[float, float]:
        # Conditional on a pending mask m0 (an earlier observation): P(mask | m0), P(~mask | m0),
        # renormalised inside the batched read.
        lp = await self.context.next_token_logprobs()
        return await row_masses(lp, self.mask, self.context.pending_mask)

    async def sample(self, rng=None):
        inside, outside = await self._log_masses()
        value = bool((rng or current_rng()).random() < math.exp(inside))
        return value, await self._set(value, inside, outside)

    async def log_prob(self, value):
        inside, outside = await self._log_masses()
        return await self._set(bool(value), inside, outside)

    async def _set(self, value: bool, inside: float, outside: float) -> float:
        if (inside if value else outside) == -math.inf:
            return -math.inf  # impossible: the particle dies, the context stays untouched
        self.context.restrict_next(self.mask if value else ~self.mask)
        return inside if value else outside

    async def support(self):
        inside, outside = await self._log_masses()
        return [(v, lp) for v, lp in ((True, inside), (False, outside)) if lp > -math.inf]
