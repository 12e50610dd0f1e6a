"""Batched grammar masks: the allowed tokens of many particles' matchers in one engine call.

The mask layer of the llguidance adapter, over :class:`~llamppl.decoding.grammar.matcher.MatcherState`
(:mod:`~llamppl.decoding.grammar.engine` re-exports every name here):

- :func:`allowed_masks` — the masks of many matchers at once: particles in the same
  matcher state (clones after resampling) share one filled row; one llguidance call fills a
  ``(U, ⌈V/32⌉)`` int32 bitmask for the U distinct states, one tensor operation on the
  LM's device unpacks it, with EOS allowed exactly when a matcher accepts;
- :func:`apply_masks` — masks applied to a ``(B, V)`` batch of next-token
  log-probabilities with one multiplication: masked probabilities and allowed masses
  (the LLaMPPL paper's G'), without new ``(B, V)`` tensors when the caller allows;
- :func:`forced_token` — the one token a matcher allows, if it allows exactly one (the
  forced tokens of :class:`~llamppl.models.GrammarConstraint`);
- :class:`MaskBatcher` — coalesces the concurrent mask requests of all particles
  in an SMC step into one :func:`apply_masks` (or :func:`allowed_masks`) call (same scheme as
  :meth:`llamppl.lm.base.LanguageModel.next_token_logprobs`).
"""

from __future__ import annotations

import sys
import threading

import torch

from llamppl.batching import Coalescer
from llamppl.decoding.constraints.protocol import finish_rows
from llamppl.decoding.grammar.matcher import (
    MatcherState,
    engine_failure,
    forget_template,
    require_llguidance,
)
from llamppl.lm.base import LanguageModel
from llamppl.lm.memo import PerLM

__all__ = [
    "MaskBatcher",
    "allowed_masks",
    "apply_masks",
    "forced_token",
    "mask_batcher",
]


def allowed_masks(
    lm: LanguageModel, states: list[MatcherState], dtype: torch.dtype = torch.bool
) -> torch.Tensor:
    """``(B, V)`` masks of the tokens each matcher allows next, on ``lm.device``.

    States with the same grammar and tokens (clones after resampling) share a row:
    one llguidance call (``fill_next_token_bitmask_par``, all distinct matchers at
    once) fills the ``(U, ⌈V/32⌉)`` int32 bitmask of the U distinct states (bit
    ``i % 32`` of word ``i // 32`` is token i), whose rows are repeated for duplicate
    states before one transfer and one unpack give the ``(B, V)`` masks (bool, or 0/1
    in a float ``dtype``); the EOS column is then set to ``accepting`` for every row
    (EOS allowed exactly when the matcher accepts).
    """
    bits, accepting = _filled_bits(lm, states)
    masks = _unpack(bits, lm.vocab_size, dtype)  # (B, V)
    masks[:, lm.eos_token_id] = accepting
    return masks


def _filled_bits(
    lm: LanguageModel, states: list[MatcherState]
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(B, W)`` int32 bitmasks and ``(B,)`` bool accepting flags on ``lm.device``.

    Filled once per distinct state (rows kept by :func:`forced_token` are copied) and
    repeated for duplicates at the bit level, ``W = ⌈V/32⌉`` words a row, so that the
    ``(B, V)`` unpack is the only full-size tensor.
    """
    import llguidance.torch as llt

    rows: dict[tuple, int] = {}
    index = [rows.setdefault((id(s.grammar), *s.consumed), len(rows)) for s in states]
    unique = [None] * len(rows)
    for s, i in zip(states, index):
        unique[i] = unique[i] or s
    bits = llt.allocate_token_bitmask(len(unique), lm.vocab_size)  # (U, W) int32, CPU
    todo = []
    for i, s in enumerate(unique):
        if s.filled is not None:  # filled by forced_token at this state: copy, do not refill
            bits[i] = s.filled[0]
        else:
            todo.append((s.matcher, i))
    if len(todo) == 1:
        llt.fill_next_token_bitmask(todo[0][0], bits, todo[0][1])
    elif todo:
        llt.fill_next_token_bitmask_par(_executor(), todo, bits)
    for matcher, i in todo:
        failure = engine_failure(matcher)
        if failure is not None:  # the engine failed (a limit): no token, the template dropped
            unique[i].engine_error = failure
            forget_template(unique[i].lm, unique[i].grammar)
            bits[i] = 0
    accepting = torch.tensor([s.accepting and s.engine_error is None for s in unique])
    if len(unique) < len(states):
        pick = torch.tensor(index)
        bits, accepting = bits.index_select(0, pick), accepting.index_select(0, pick)
    return bits.to(lm.device), accepting.to(lm.device)


def forced_token(state: MatcherState) -> int | None:
    """The one token ``state`` allows next, if it allows exactly one and it is not EOS; else None.

    Screened by llguidance's forced bytes (``compute_ff_bytes``, ≈0.2 µs): a single allowed
    token needs at least the next byte forced (a vocabulary without single-byte tokens may
    make this miss a singleton, never invent one). A token spelling the start of the forced
    bytes is not necessarily allowed (llguidance gives ``{`` alone before ``{"key":``), so
    the mask decides: one row of the bitmask is filled on the host and its set bits
    counted, without unpacking a ``(V,)`` mask (≈0.2 ms against ≈1 ms for
    :func:`allowed_masks` of one state). The row is kept on the state, and
    :func:`allowed_masks` copies it instead of filling it again. An accepting matcher
    allows EOS as well.
    """
    matcher = state.matcher
    if state.accepting:
        return None
    forced = matcher.compute_ff_bytes()
    if not forced:
        return None
    import llguidance.torch as llt

    bits = llt.allocate_token_bitmask(1, state.lm.vocab_size)  # (1, W) int32, host
    llt.fill_next_token_bitmask(matcher, bits, 0)
    state.filled = bits  # allowed_masks reuses it if the state does not move on
    words = torch.nonzero(bits[0]).flatten()
    if words.numel() != 1:
        return None
    word = int(words[0])
    value = int(bits[0, word]) & 0xFFFFFFFF
    if value & (value - 1):  # more than one bit set
        return None
    token = 32 * word + value.bit_length() - 1
    return None if token == state.lm.eos_token_id else token


_BYTE_TABLES: dict[tuple, torch.Tensor] = {}


def _unpack(
    bits: torch.Tensor, V: int, dtype: torch.dtype, out: torch.Tensor | None = None
) -> torch.Tensor:
    """``(B, W)`` int32 bitmask -> ``(B, V)`` 0/1 masks in ``dtype``, in one table lookup.

    On a little-endian machine token i is bit ``i % 8`` of byte ``i // 8`` of the
    bitmask's memory, so each byte indexes a ``(256, 8)`` table of its bits. ``out``
    (``(B * 4W, 8)``, ``dtype``) receives the lookup instead of a new tensor.
    """
    B = bits.shape[0]
    if sys.byteorder != "little":  # pragma: no cover - word-wise shifts, slower
        shifts = torch.arange(32, dtype=torch.int32, device=bits.device)
        return ((bits.unsqueeze(-1) >> shifts) & 1).flatten(1)[:, :V].to(dtype)
    key = (bits.device, dtype)
    table = _BYTE_TABLES.get(key)
    if table is None:
        ids = torch.arange(256, device=bits.device).unsqueeze(-1)
        table = _BYTE_TABLES[key] = ((ids >> torch.arange(8, device=bits.device)) & 1).to(dtype)
    rows = torch.index_select(table, 0, bits.view(torch.uint8).flatten().long(), out=out)
    return rows.view(B, -1)[:, :V]  # (B * 4W, 8) -> (B, V)


_SCRATCH = threading.local()  # per thread: {(device, dtype): buffer} for apply_masks' masks


def _scratch(bits: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """A reused ``(B * 4W, 8)`` buffer for the masks inside :func:`apply_masks`.

    They never leave that function, so one buffer per thread, device and dtype serves
    every call: a fresh ``(B, V)`` tensor per step costs page faults on first touch
    (≈2–3× the lookup itself on this VM's CPU at B = 64).
    """
    store = _SCRATCH.__dict__
    n = bits.numel() * 4
    buf = store.get((bits.device, dtype))
    if buf is None or buf.shape[0] < n:
        buf = store[(bits.device, dtype)] = torch.empty(n, 8, dtype=dtype, device=bits.device)
    return buf[:n]


def apply_masks(
    lm: LanguageModel,
    states: list[MatcherState],
    log_probs: torch.Tensor,
    final: torch.Tensor,
    *,
    ends: torch.Tensor | None = None,
    end_ids: list[int] | None = None,
    overwrite: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Masked next-token probabilities and log allowed masses for a batch of particles.

    ``log_probs`` is ``(B, V)``; ``final`` is ``(B,)`` bool (rows whose next token
    must end the text: only end tokens stay allowed). End tokens are ``end_ids``
    (default ``[lm.eos_token_id]``); they are allowed where ``ends`` (``(B,)`` bool,
    default: the matcher accepts). Returns ``q`` of shape ``(B, V)`` with
    ``q[b, w] = p_b(w) 1_C(s_b w)`` (unnormalised) and ``log G'`` of shape ``(B,)``,
    ``G'_b = Σ_w q[b, w]`` (the LLaMPPL paper's allowed mass). Works with probabilities
    and a 0/1 float mask: one multiplication applies all masks (no ``-inf`` arithmetic,
    slow on some CPUs). ``overwrite=True`` computes ``q`` in the memory of ``log_probs``
    (a tensor the caller owns and no longer needs), so the step allocates no new
    ``(B, V)`` tensor.
    """
    bits, accepting = _filled_bits(lm, states)
    masks = _unpack(bits, lm.vocab_size, log_probs.dtype, out=_scratch(bits, log_probs.dtype))
    ends = accepting if ends is None else ends.to(accepting.device)
    finish_rows(masks, ends, [lm.eos_token_id] if end_ids is None else end_ids, final)
    q = log_probs.exp_() if overwrite else log_probs.exp()
    q.mul_(masks)  # (B, V): the one application of the masks
    return q, q.sum(dim=-1).log()


_EXECUTOR = None


def _executor():
    global _EXECUTOR
    if _EXECUTOR is None:
        _EXECUTOR = require_llguidance().LLExecutor()
    return _EXECUTOR


class MaskBatcher:
    """Serve the concurrent mask requests of all particles of a step with one batched call.

    ``await batcher.mask(state)`` gives the ``(V,)`` bool mask of one matcher;
    ``await batcher.apply(state, log_probs, final)`` gives the masked probabilities
    and log allowed mass (:func:`apply_masks`). Each kind has a
    :class:`llamppl.batching.Coalescer` (the one LMs use): all requests of a kind
    awaited in one event-loop round are served in one call. ``flushes`` counts
    the batched calls.
    """

    def __init__(self, lm: LanguageModel) -> None:
        self.lm = lm
        self._masks = Coalescer(self._mask_batch)
        self._applies = Coalescer(self._apply_batch)

    @property
    def flushes(self) -> int:
        """Batched calls made (mask and apply rounds are separate calls)."""
        return self._masks.calls + self._applies.calls

    def __deepcopy__(self, memo) -> MaskBatcher:
        return self  # shared by all particles, like the LM

    async def mask(self, state: MatcherState) -> torch.Tensor:
        """``(V,)`` bool mask of the tokens ``state`` allows next."""
        return await self._masks.submit(state)

    async def apply(
        self, state: MatcherState, log_probs: torch.Tensor, final: bool = False
    ) -> tuple[torch.Tensor, float]:
        """``(q, log G')`` for one particle: masked probabilities ``(V,)`` and log allowed mass."""
        return await self._applies.submit((state, log_probs, bool(final)))

    def _mask_batch(self, states: list[MatcherState]) -> list:
        return list(allowed_masks(self.lm, states))

    def _apply_batch(self, requests: list[tuple]) -> list:
        states = [r[0] for r in requests]
        log_probs = torch.stack([r[1] for r in requests])  # (B, V)
        final = torch.tensor([r[2] for r in requests], device=log_probs.device)
        q, log_mass = apply_masks(self.lm, states, log_probs, final, overwrite=True)
        return list(zip(q, log_mass.tolist()))


_BATCHERS = PerLM(MaskBatcher)


def mask_batcher(lm: LanguageModel) -> MaskBatcher:
    """The shared :class:`MaskBatcher` of ``lm`` (one per LM)."""
    return _BATCHERS(lm)
