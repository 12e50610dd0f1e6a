"""The token draws of :class:`~llamppl.models.HardConstraint`, batched across particles.

- :func:`masked_round` — the mask proposal's masked probabilities ``q = p ⊙ 1_C`` and
  allowed masses of every particle awaiting in one event-loop round, one
  ``constraint.masked_probs`` call per constraint (one llguidance call for grammars);
- :class:`MaskedNextToken` — the token-masking proposal M'_t = q / G'_t drawn from ``q``;
- :func:`mask_round` — the cheap parts' masks of a composed constraint, batched the same way;
- :class:`DrawnToken` — a lazy (AWRS) draw as the proposal of ``sample``: its ``sample``
  returns the drawn token with log q = log p(a) − log Ẑ, so ``sample(p, DrawnToken)`` adds
  log Ẑ to the weight (:mod:`~llamppl.decoding.proposals.lazy`); its ``support`` and
  ``log_prob`` are the exact masked proposal, for ``enumerate_exact`` and conditional SMC.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import torch

from llamppl.batching import Coalescer
from llamppl.context import LMContext
from llamppl.decoding.constraints.protocol import Constraint, sound_listings
from llamppl.distributions import Distribution
from llamppl.lm.base import LanguageModel
from llamppl.lm.memo import PerLM, lm_table
from llamppl.rng import current_rng
from llamppl.token import Token

__all__ = [
    "MaskedNextToken",
    "DrawnToken",
    "masked_round",
    "mask_round",
    "mask_calls",
    "end_token_ids",
    "is_text_state",
    "one_of",
    "allowed_hints",
]


# ---------------------------------------------------------------- batched masked probabilities
def _serve_masked(lm: LanguageModel, requests: list[tuple]) -> list[tuple[torch.Tensor, float]]:
    """Requests ``(constraint, state, row, end_ok, final, end_ids, sound)``, grouped by
    constraint, end tokens and whether sound checks may be listed (:func:`sound_listings`)."""
    out: list[Any] = [None] * len(requests)
    groups: dict[tuple, list[int]] = {}
    for i, r in enumerate(requests):
        groups.setdefault((id(r[0]), r[5], r[6]), []).append(i)
    for idx in groups.values():
        constraint, end_ids = requests[idx[0]][0], list(requests[idx[0]][5])
        rows = torch.stack([requests[i][2] for i in idx])  # (B, V)
        ends = torch.tensor([requests[i][3] for i in idx], device=rows.device)
        final = torch.tensor([requests[i][4] for i in idx], device=rows.device)
        states = [requests[i][1] for i in idx]
        with sound_listings(requests[idx[0]][6]):
            q, log_mass = constraint.masked_probs(lm, states, rows, ends, end_ids, final)
        for i, q_row, lm_b in zip(idx, q, log_mass.tolist()):  # one host read per group
            out[i] = (q_row, lm_b)
    return out


_MASKED = PerLM(lambda lm: Coalescer(lambda reqs: _serve_masked(lm, reqs)))


async def masked_round(
    lm: LanguageModel,
    constraint: Constraint,
    state: Any,
    log_probs: torch.Tensor,
    end_ok: bool,
    final: bool,
    end_ids: tuple[int, ...],
    sound: bool = True,
) -> tuple[torch.Tensor, float]:
    """``(q, log G')`` of one particle, computed with the other particles of the round;
    ``sound``: whether a sound (not closed) check may be listed (:func:`sound_listings`)."""
    request = (constraint, state, log_probs, end_ok, final, end_ids, sound)
    return await _MASKED(lm).submit(request)


def _serve_masks(lm: LanguageModel, requests: list[tuple]) -> list[torch.Tensor]:
    """Requests ``(constraint, state, parts)``: the masks of ``parts``, grouped by constraint."""
    out: list[Any] = [None] * len(requests)
    groups: dict[tuple, list[int]] = {}
    for i, r in enumerate(requests):
        groups.setdefault((id(r[0]), r[2]), []).append(i)
    for idx in groups.values():
        constraint, parts = requests[idx[0]][0], requests[idx[0]][2]
        masks = constraint.masks(lm, [requests[i][1] for i in idx], parts=parts)
        for i, row in zip(idx, masks):
            out[i] = row
    return out


_MASKS = PerLM(lambda lm: Coalescer(lambda reqs: _serve_masks(lm, reqs)))


async def mask_round(
    lm: LanguageModel, constraint: Constraint, state: Any, parts: tuple[int, ...]
) -> torch.Tensor:
    """The ``(V,)`` mask of the parts ``parts`` of a composed constraint, batched per round."""
    return await _MASKS(lm).submit((constraint, state, parts))


def mask_calls(lm: LanguageModel) -> int:
    """Batched mask rounds served for ``lm`` so far (one per SMC step with masked particles)."""
    return _MASKED(lm).calls + _MASKS(lm).calls


# ---------------------------------------------------------------- the proposals
class MaskedNextToken(Distribution):
    """The token-masking proposal M'_t = q / G'_t from precomputed masked probabilities.

    ``q`` (``(V,)``, unnormalised, zero outside the mask) and ``log G' = log Σ q`` come
    from one batched :func:`masked_round` for all particles of the step. Sampling or
    observing a token extends the context.
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


class DrawnToken(Distribution):
    """A lazy draw (token ``a``, ``log p(a)``, ``log Ẑ``) as the proposal of ``sample``.

    ``sample()`` returns ``a`` with log q(a) = log p(a) − log Ẑ, so
    ``sample(next_token, DrawnToken(...))`` adds exactly log Ẑ to the weight (the AWRS
    weight). ``support()`` and ``log_prob()`` are the exact masked proposal
    p(w) 1_A(w) / Z, computed with ``allowed`` on every token of positive probability:
    what ``enumerate_exact`` and conditional SMC's pinned particle need.
    """

    def __init__(
        self,
        lm: LanguageModel,
        log_probs: torch.Tensor,
        draw: tuple[int, float, float],
        allowed: Callable[[int], bool],
    ) -> None:
        self.lm, self.log_probs, self.draw, self.allowed = lm, log_probs, draw, allowed
        self._exact: list[tuple[int, float]] | None = None

    async def sample(self, rng=None):
        token, log_p, log_z_hat = self.draw
        return Token(self.lm, token), log_p - log_z_hat

    def _masked(self) -> list[tuple[int, float]]:
        """``[(w, log p(w))]`` over the allowed tokens (one check per token, once)."""
        if self._exact is None:
            ids = torch.nonzero(self.log_probs > -math.inf).flatten().tolist()
            values = self.log_probs[ids].double().tolist()
            self._exact = [(w, v) for w, v in zip(ids, values) if self.allowed(w)]
        return self._exact

    async def log_prob(self, value):
        masked = self._masked()
        log_z = math.log(sum(math.exp(v) for _, v in masked)) if masked else -math.inf
        found = dict(masked).get(int(value))
        return -math.inf if found is None else found - log_z

    async def support(self):
        masked = self._masked()
        log_z = math.log(sum(math.exp(v) for _, v in masked))
        return [(Token(self.lm, w), v - log_z) for w, v in masked]


def end_token_ids(lm: LanguageModel, stop: str) -> tuple[int, ...]:
    """The tokens that end a text: EOS, and with ``stop="newline"`` every token containing a newline."""
    eos = set(lm.eos_token_ids)
    if stop == "eos":
        return tuple(sorted(eos))
    newline = lm_table(
        lm, "newline_tokens", lambda lm: [i for i, t in enumerate(lm.vocab) if "\n" in t]
    )
    return tuple(sorted(eos | set(newline)))


def is_text_state(state: object) -> bool:
    """Whether a constraint state is text (or a tuple of texts, ``&`` of text constraints),
    which ``advance`` extends without touching the original (grammar matchers are stateful)."""
    return isinstance(state, str) or (
        isinstance(state, tuple) and all(isinstance(s, str) for s in state)
    )


def one_of(name: str, value: object, allowed: tuple[str, ...]) -> str:
    """``value`` if it is one of ``allowed``, else a ``ValueError`` naming ``name``."""
    if value not in allowed:
        raise ValueError(f"{name} must be one of {allowed}, got {value!r}")
    return value  # type: ignore[return-value]


def allowed_hints(
    constraint: Constraint,
    lm: LanguageModel,
    state: Any,
    row: torch.Tensor,
    allowed: Callable[[int], bool],
    end_ids: Sequence[int],
    on: bool = True,
) -> tuple[list[tuple[int, float]], set[int]]:
    """The constraint's hints (:meth:`~llamppl.decoding.constraints.protocol.Constraint.hint`) of
    positive probability in ``row`` that ``allowed`` accepts, with their log-probabilities,
    and the set of hints checked (end tokens are never hints); none unless ``on``."""
    out: list[tuple[int, float]] = []
    checked: set[int] = set()
    for h in constraint.hint(lm, state) if on else ():
        if h in end_ids or h in checked:
            continue
        lp = float(row[h])  # one host read per hint (a handful, only with hints on)
        if lp > -math.inf:
            checked.add(h)
            if allowed(h):
                out.append((h, lp))
    return out, checked
