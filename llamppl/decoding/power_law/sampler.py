"""Power-law token sampler: reshape next-token probabilities to favour a target probability.

The sampler (``papers.md`` §5, ``papers/power-law-sampler.txt``) maps every
token's ORIGINAL probability ``p`` to a new logit that peaks where ``p`` equals
a target probability ``τ``::

    new_logit(v) = peak_logit / (1 + (|p(v) − τ| / width) ** tail_heaviness)    (PL-1)

then draws from ``softmax(new_logit)``. The target adapts to a rolling window
``h`` (oldest first) of the original probabilities of the last ``queue_size``
chosen tokens, so that the window's mean is pulled back to the base target::

    τ_next = clamp(target · queue_size − Σ(h without its oldest entry),
                   min_target, max_target)                                    (PL-2)

With ``width ≈ 0`` the token closest to ``τ`` gets ``peak_logit`` and every
other token ``-100`` (PL-3, the greedy case). Optional min-p filtering removes
tokens with ``p < min_p · max p`` first; tokens of zero original probability
(logit ``-inf``) stay impossible.

On a large vocabulary use ``min_p`` (the paper's chain is min-p → power law):
every token with ``p ≈ 0`` gets the logit ``peak / (1 + (τ / width)^h)`` (1.33
with the defaults), and 49k such tokens together outweigh the on-target ones.

One sampler, three uses::

    from llamppl.decoding import PowerLawSampler, PowerLawProposal
    sampler = PowerLawSampler(target=0.2, width=0.1)
    draw = sampler.sample(logits, rng)                    # (a) [B, V] logits, per-row history
    model.generate(ids, do_sample=True, logits_processor=[sampler])   # (b) Hugging Face
    token = await self.sample(ctx.next_token(), proposal=PowerLawProposal(ctx, sampler))  # (c) SMC

As an SMC proposal (c, :mod:`llamppl.decoding.power_law.proposal`) the importance weight ``p(v) / q(v)`` uses the exact
density ``q = softmax(PL-1)`` (optionally mixed with ``p``), so SMC still
targets the program's posterior.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np
import torch
from transformers import LogitsProcessor

from llamppl.decoding.proposals.token_draw import draw_token_ids, row_uniforms
from llamppl.validation import check_positive_int, check_real_range

__all__ = ["PowerLawSampler", "PowerLawDraw", "PRESETS"]

#: The paper's parameter sets: its creative-writing and "mostly follow top choices" examples,
#: and the balanced / aggressive levels of its controlled-randomness use case.
PRESETS: dict[str, dict[str, float]] = {
    "creative": {"target": 0.12, "width": 0.08, "tail_heaviness": 3.0, "queue_size": 20},
    "balanced": {"target": 0.2, "width": 0.15},
    # max_target = target: PL-2 lifts the target towards 1 when the model offers nothing as
    # likely as 0.6, and near 1 the reshape is flat over the min-p survivors (below plain
    # sampling's mean probability); capped, it keeps favouring the likeliest tokens
    "conservative": {
        "target": 0.6,
        "width": 0.2,
        "tail_heaviness": 2.0,
        "queue_size": 5,
        "max_target": 0.6,
    },
    "aggressive": {"target": 0.03, "width": 0.05},
}

_WIDTH_EPS = 1.1920929e-07  # FLT_EPSILON: width at or below it is the greedy case (PL-3)
_GREEDY_OTHER = -100.0  # PL-3: logit of every token but the closest one


class PowerLawDraw(NamedTuple):
    """Result of :meth:`PowerLawSampler.sample`; each field has shape ``[B]`` (``[]`` for 1-D logits)."""

    token_ids: torch.Tensor  # int64: chosen token ids
    log_probs: torch.Tensor  # log q(chosen) under the reshaped distribution
    original_probs: torch.Tensor  # p(chosen) under the original distribution
    targets: torch.Tensor  # the target τ used for this draw


class PowerLawSampler(LogitsProcessor):
    """Power-law reshaping (PL-1) with an adaptive target (PL-2); per-row history.

    Parameters
    ----------
    target : float in [0, 1]
        Base target probability τ.
    width : float >= 0
        Tolerance around τ; ``<= 1.19e-7`` selects the greedy case (PL-3).
    tail_heaviness : float > 0
        Exponent of the power-law fall-off.
    peak_logit : float > 0
        Logit given to a token whose probability equals τ.
    queue_size : int >= 1
        Length of the rolling history window.
    min_target, max_target : float in [0, 1], ``min_target <= max_target``
        Clamp of the adaptive target.
    min_p : float in (0, 1] or None
        If set, tokens with ``p < min_p · max p`` are removed before reshaping.

    Notes
    -----
    A partially filled window counts its missing entries as the base target,
    so the first target is ``target`` and PL-2 is the running mean condition
    (the reference C++ sums the partial window, which pins the target to
    ``max_target`` while the window fills).

    State: ``history`` is a ``[B, queue_size]`` tensor, one row per sequence
    (oldest first, unfilled entries hold the base target), created on first use
    and shared by :meth:`sample` and the ``LogitsProcessor`` call. :meth:`reshape`
    and :meth:`log_probs` never change it. :class:`PowerLawProposal` keeps its
    own per-particle history on the ``LMContext``.
    """

    def __init__(
        self,
        target: float = 0.2,
        width: float = 0.1,
        tail_heaviness: float = 3.0,
        peak_logit: float = 12.0,
        queue_size: int = 20,
        min_target: float = 0.0,
        max_target: float = 1.0,
        min_p: float | None = None,
    ) -> None:
        self.target = check_real_range("target", target, 0.0, 1.0)
        self.width = check_real_range("width", width, 0.0, math.inf)
        self.tail_heaviness = check_real_range(
            "tail_heaviness", tail_heaviness, 0.0, math.inf, lo_open=True
        )
        self.peak_logit = check_real_range("peak_logit", peak_logit, 0.0, math.inf, lo_open=True)
        self.queue_size = check_positive_int("queue_size", queue_size)
        self.min_target = check_real_range("min_target", min_target, 0.0, 1.0)
        self.max_target = check_real_range("max_target", max_target, 0.0, 1.0)
        if self.min_target > self.max_target:
            raise ValueError(f"min_target must be <= max_target, got {min_target} > {max_target}")
        self.min_p = (
            None if min_p is None else check_real_range("min_p", min_p, 0.0, 1.0, lo_open=True)
        )
        self._scalars: dict[tuple, torch.Tensor] = {}
        self._work: tuple | None = None
        self.reset()

    @classmethod
    def preset(cls, name: str, **overrides: float) -> PowerLawSampler:
        """A sampler with the paper's preset ``name`` (see :data:`PRESETS`), overridden by ``overrides``."""
        if name not in PRESETS:
            raise ValueError(f"preset must be one of {sorted(PRESETS)}, got {name!r}")
        return cls(**{**PRESETS[name], **overrides})

    def __repr__(self) -> str:
        return (
            f"PowerLawSampler(target={self.target}, width={self.width}, tail_heaviness={self.tail_heaviness}, "
            f"peak_logit={self.peak_logit}, queue_size={self.queue_size}, min_target={self.min_target}, "
            f"max_target={self.max_target}, min_p={self.min_p})"
        )

    def state_key(self) -> tuple:
        """Hashable value of the sampler (settings and history), so equal particles merge."""
        hist = None if self._history is None else tuple(map(tuple, self._history.tolist()))
        return (repr(self), hist)

    # ------------------------------------------------------------------ pure math
    def next_target(self, history: torch.Tensor, keepdim: bool = False) -> torch.Tensor:
        """PL-2 from ``history [..., n]`` (chosen tokens' original probabilities, oldest first) → ``[...]``.

        Only the newest ``min(n, queue_size − 1)`` entries matter; missing ones count as ``target``.
        """
        history = torch.as_tensor(history)
        m = min(history.shape[-1], self.queue_size - 1)
        recent = history[..., history.shape[-1] - m :].sum(-1, keepdim=keepdim)  # [...] or [..., 1]
        return (self.target * (m + 1) - recent).clamp_(self.min_target, self.max_target)

    def reshape(
        self, logits: torch.Tensor, target: float | torch.Tensor | None = None
    ) -> torch.Tensor:
        """Reshaped logits (PL-1 / PL-3) of ``logits [B, V]`` (or ``[V]``), ``-inf`` where removed.

        ``target``: a float or ``[B]`` tensor; default the current adaptive targets of the rows.
        """
        x, squeeze = self._as_batch(logits)
        out, _ = self._reshape(x, self._targets_for(x, target)[:, None])
        return out[0] if squeeze else out

    def log_probs(
        self, logits: torch.Tensor, target: float | torch.Tensor | None = None
    ) -> torch.Tensor:
        """Normalised log q of the reshaped distribution, same shape as ``logits``."""
        return torch.log_softmax(self.reshape(logits, target), dim=-1)

    # ------------------------------------------------------------------ stateful use
    @property
    def history(self) -> torch.Tensor | None:
        """``[B, queue_size]`` window per row (oldest first), or None before first use."""
        return self._history

    def reset(self) -> None:
        """Forget all rows' histories (the next call starts fresh rows)."""
        self._history: torch.Tensor | None = None
        # LogitsProcessor only: input_ids and original probabilities of the previous call
        self._prev_ids: torch.Tensor | None = None
        self._prev_p: torch.Tensor | None = None

    def current_targets(self, batch_size: int = 1) -> torch.Tensor:
        """Adaptive target of each row ``[B]`` (the base target, clamped, for fresh rows)."""
        if self._history is None:
            return self.next_target(torch.full((batch_size, self.queue_size), self.target))
        return self.next_target(self._history)

    def sample(
        self, logits: torch.Tensor, rng: np.random.Generator | torch.Generator | None = None
    ) -> PowerLawDraw:
        """Draw one token per row of ``logits [B, V]`` (or ``[V]``) and record its original probability.

        ``rng``: a numpy or torch generator (default :func:`llamppl.rng.current_rng`).
        """
        x, squeeze = self._as_batch(logits)
        B = x.shape[0]
        self._ensure_rows(B, x.device)
        targets = self.next_target(self._history, keepdim=True)  # [B, 1]
        if targets.dtype != x.dtype:
            targets = targets.to(x.dtype)
        new, p = self._reshape(x, targets, self._workspace(x))  # [B, V] each, reused buffers
        if self.width > _WIDTH_EPS and self.peak_logit <= 60.0:
            weights = new.exp_()  # [B, V]; <= e^60, V · e^60 fits float32
        else:
            weights = new.sub_(self.peak_logit).exp_()  # [B, V]; new <= peak
        ids, total, w_chosen = draw_token_ids(weights, row_uniforms(rng, B, x))  # [B, 1] each
        p_chosen = p.gather(1, ids)  # [B, 1] original probabilities
        self._push(p_chosen)
        log_q = w_chosen.div_(total).log_()  # [B, 1] log(w / Σw)
        draw = PowerLawDraw(ids, log_q, p_chosen, targets)
        return PowerLawDraw(*(t.view(()) if squeeze else t.view(B) for t in draw))

    def __call__(self, input_ids: torch.LongTensor, scores: torch.Tensor) -> torch.Tensor:
        """``transformers`` LogitsProcessor: reshaped ``scores [B, V]`` for the rows' current targets.

        The token chosen after the previous call is read from ``input_ids[:, -1]``
        and its original probability enters the row's history. A call whose
        ``input_ids`` do not extend the previous ones by one token starts a new
        generation (fresh histories). Meant for sampling (``do_sample=True``);
        beam search reorders rows and is not supported.
        """
        if scores.ndim != 2 or input_ids.ndim != 2 or input_ids.shape[0] != scores.shape[0]:
            raise ValueError(
                f"input_ids [B, T] and scores [B, V] must share B, got {tuple(input_ids.shape)} and {tuple(scores.shape)}"
            )
        prev = self._prev_ids
        continuing = (
            prev is not None
            and prev.shape[0] == input_ids.shape[0]
            and prev.shape[1] + 1 == input_ids.shape[1]
            and torch.equal(prev.to(input_ids.device), input_ids[:, :-1])
        )
        if continuing:
            chosen = input_ids[:, -1:].to(self._prev_p.device)  # [B, 1]
            self._push(self._prev_p.gather(1, chosen))
        else:
            self._history = None
        x, _ = self._as_batch(scores)
        self._ensure_rows(x.shape[0], x.device)
        new, p = self._reshape(x, self.next_target(self._history, keepdim=True).to(x.dtype))
        self._prev_ids, self._prev_p = input_ids.clone(), p  # [B, T], [B, V]
        return new.to(scores.dtype)

    # ------------------------------------------------------------------ internals
    def _as_batch(self, logits: torch.Tensor) -> tuple[torch.Tensor, bool]:
        if not isinstance(logits, torch.Tensor):
            raise TypeError(f"logits must be a torch.Tensor, got {type(logits).__name__}")
        if logits.ndim not in (1, 2) or logits.shape[-1] == 0:
            raise ValueError(
                f"logits must have shape [V] or [B, V] with V >= 1, got {tuple(logits.shape)}"
            )
        if not logits.is_floating_point():
            raise TypeError(f"logits must be a floating-point tensor, got {logits.dtype}")
        x = logits if logits.dtype in (torch.float32, torch.float64) else logits.float()
        return (x[None], True) if x.ndim == 1 else (x, False)

    def _targets_for(self, x: torch.Tensor, target: float | torch.Tensor | None) -> torch.Tensor:
        B = x.shape[0]
        if target is None:
            if self._history is not None and self._history.shape[0] != B:
                raise ValueError(
                    f"logits has {B} rows but the sampler's history has {self._history.shape[0]}; call reset()"
                )
            t = self.current_targets(B)
        elif isinstance(target, torch.Tensor):
            t = target.reshape(-1)
            if t.numel() == 1:
                t = t.expand(B)
            if t.shape != (B,):
                raise ValueError(
                    f"target must be a float or a tensor of shape [{B}], got {tuple(target.shape)}"
                )
            if not bool(((t >= 0) & (t <= 1)).all()):
                raise ValueError("target must lie in [0, 1]")
        else:
            t = torch.full((B,), check_real_range("target", target, 0.0, 1.0))
        return t.to(device=x.device, dtype=x.dtype)

    def _ensure_rows(self, B: int, device: torch.device) -> None:
        if self._history is None:
            self._history = torch.full((B, self.queue_size), self.target, device=device)  # [B, Q]
        elif self._history.shape[0] != B:
            raise ValueError(
                f"logits has {B} rows but the sampler's history has {self._history.shape[0]}; call reset()"
            )
        elif self._history.device != device:
            self._history = self._history.to(device)

    def _workspace(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Two ``[B, V]`` buffers like ``x``, kept between :meth:`sample` calls (never returned to users)."""
        key = (x.shape, x.dtype, x.device)
        if self._work is None or self._work[0] != key:
            self._work = (key, torch.empty_like(x), torch.empty_like(x))
        return self._work[1], self._work[2]

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)  # the caches are not state: copies and pickles skip them
        state["_work"], state["_scalars"] = None, {}
        return state

    def _scalar(self, value: float, like: torch.Tensor) -> torch.Tensor:
        """Cached 0-d tensor ``value`` with ``like``'s dtype and device (saves allocations per step)."""
        key = (value, like.dtype, like.device)
        t = self._scalars.get(key)
        if t is None:
            t = self._scalars[key] = torch.tensor(value, dtype=like.dtype, device=like.device)
        return t

    def _push(self, probs: torch.Tensor) -> None:
        """Append each row's chosen original probability ``[B, 1]`` to its window."""
        h = self._history
        self._history = torch.cat([h[:, 1:], probs.to(h.dtype)], dim=1)  # [B, Q]

    def _reshape(
        self,
        x: torch.Tensor,
        target: torch.Tensor,
        work: tuple[torch.Tensor, torch.Tensor] | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """PL-1 / PL-3 for ``x [B, V]``, ``target [B, 1]`` → (new logits ``[B, V]``, original probs ``[B, V]``).

        This is the hot path: as few passes over ``[B, V]`` as possible, in place,
        into the two ``work`` buffers if given (no page faults from fresh allocations).
        """
        p_out, d_out = work if work is not None else (None, None)
        p = torch.softmax(x, dim=-1, out=p_out)  # [B, V] original probabilities
        removed = None  # [B, V] bool: tokens that stay impossible
        # smallest probability: NaN if a row had a NaN or +inf logit, or no finite logit
        lowest = float(p.amin() if p.shape[0] == 1 else p.amin(-1).min())
        if not lowest > 0:  # rare path
            if math.isnan(lowest):
                raise ValueError(
                    "logits must have a finite entry in every row and contain no NaN or +inf"
                )
            removed = p == 0  # logit -inf (or so low that p underflows): stays impossible
        if self.min_p is not None:
            removed = p < self.min_p * p.amax(-1, keepdim=True)  # [B, V]; includes -inf entries
        d = torch.sub(p, target, out=d_out).abs_()  # [B, V] |p - τ|
        if self.width <= _WIDTH_EPS:  # PL-3: greedy choice of the token closest to the target
            if removed is not None:
                d.masked_fill_(removed, math.inf)
            closest = d.argmin(-1, keepdim=True)  # [B, 1]
            out = d.fill_(_GREEDY_OTHER).scatter_(1, closest, self.peak_logit)
        else:  # PL-1 as (peak·w^h) / (w^h + |p - τ|^h): two single passes after the power
            h, wh = self.tail_heaviness, self.width**self.tail_heaviness
            if not (1e-30 < wh and self.peak_logit * wh < 1e30):  # keep w^h representable:
                # divide by the width before the power instead
                d.mul_(1.0 / self.width)
                wh = 1.0
            if h == 3.0 or h == 2.0:
                d.pow_(h)  # vectorised fast path
            elif h != 1.0:
                d.log_().mul_(h).exp_()  # d^h; 0 stays 0 (generic pow is scalar and ~20x slower)
            out = torch.div(self._scalar(self.peak_logit * wh, d), d.add_(wh), out=d)
        if removed is not None:
            out.masked_fill_(removed, -math.inf)
        return out, p
