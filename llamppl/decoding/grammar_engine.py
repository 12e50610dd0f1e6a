"""Adapter over the ``llguidance`` grammar engine: grammars, tokenizers, matchers, batched masks.

With ``grammar_compile``, the only modules importing ``llguidance`` (optional:
``pip install 'llamppl[grammar]'``; imported lazily). It offers:

- :class:`Grammar` (:mod:`~llamppl.decoding.grammar_compile`) — a compiled grammar from
  a JSON Schema, a regex or a Lark grammar (``ValueError`` quoting the engine);
- :func:`ll_tokenizer` — the llguidance tokenizer of an LM, built once per LM: from
  the HF fast tokenizer of a :class:`~llamppl.CachedCausalLM`
  (``llguidance.hf.from_tokenizer``) or, for :class:`~llamppl.FunctionLM` and other
  small LMs, from the list of token byte strings;
- :class:`MatcherState` — one particle's matcher (``llguidance.LLMatcher``), cloned
  with ``deep_copy()`` when the particle is cloned (``copy.deepcopy``); the first
  matcher of a grammar is built once per (grammar, LM) and copied after that;
- :func:`allowed_masks` — the masks of many matchers at once: particles in the same
  matcher state (clones after resampling) share one row; one llguidance call fills a
  ``(U, ⌈V/32⌉)`` int32 bitmask for the U distinct states, one tensor operation on the
  LM's device unpacks it, with EOS allowed exactly when a matcher accepts;
- :func:`apply_masks` — masks applied to a ``(B, V)`` batch of next-token
  log-probabilities with one multiplication: masked probabilities and allowed masses;
- :class:`MaskBatcher` — coalesces the concurrent mask requests of all particles
  in an SMC step into one :func:`apply_masks` (or :func:`allowed_masks`) call (same scheme as
  :meth:`llamppl.lm.base.LanguageModel.next_token_logprobs`).

Why llguidance: it compiles JSON Schema, regex and Lark to one matcher type,
builds from an HF tokenizer, and computes a 49,152-token mask in about 0.1 ms on
this CPU (``benchmarks/bench_structured.py`` measures the share of an SMC step)::

    from llamppl.decoding.grammar_engine import Grammar, MatcherState
    grammar = Grammar.from_regex("(ab|b)+c")
    state = MatcherState(lm, grammar)
    masks = allowed_masks(lm, [state])          # (1, V) bool
"""

from __future__ import annotations

import sys
import threading
from typing import Any

import torch

from llamppl.batching import Coalescer
from llamppl.lm.base import LanguageModel
from llamppl.lm.memo import LRU, PerLM

from .grammar_compile import (
    MAX_ARRAY_ITEMS,
    MAX_DECIMALS,
    MAX_STRING_LENGTH,
    Grammar,
    require_llguidance,
)

__all__ = [
    "Grammar",
    "MatcherState",
    "MaskBatcher",
    "allowed_masks",
    "apply_masks",
    "forced_token",
    "ll_tokenizer",
    "make_grammar",
    "mask_batcher",
]


class _VocabTokenizer:
    """The tokenizer protocol llguidance's ``TokenizerWrapper`` expects, over a token list.

    Used for LMs without an HF fast tokenizer (``FunctionLM``): token i is
    ``lm.vocab[i]`` in UTF-8, EOS/BOS are special (empty bytes); encoding is greedy
    longest match (llguidance only uses it for token healing hints).
    """

    def __init__(self, lm: LanguageModel) -> None:
        special = {lm.eos_token_id} | ({lm.bos_token_id} - {None})
        self.eos_token_id = lm.eos_token_id
        self.bos_token_id = lm.bos_token_id
        self.special_token_ids = sorted(special)
        self.tokens = [b"" if i in special else t.encode() for i, t in enumerate(lm.vocab)]
        self._by_length = sorted(
            (i for i in range(len(self.tokens)) if self.tokens[i]),
            key=lambda i: -len(self.tokens[i]),
        )

    def __call__(self, text: bytes | str) -> list[int]:
        data = text.encode() if isinstance(text, str) else bytes(text)
        ids, pos = [], 0
        while pos < len(data):
            for i in self._by_length:
                if data.startswith(self.tokens[i], pos):
                    ids.append(i)
                    pos += len(self.tokens[i])
                    break
            else:
                pos += 1  # a byte no token spells: skip it
        return ids


def _build_ll_tokenizer(lm: LanguageModel):
    llg = require_llguidance()
    hf = getattr(lm, "tokenizer", None)
    if hf is not None and getattr(hf, "is_fast", False):
        import llguidance.hf

        return llguidance.hf.from_tokenizer(hf, n_vocab=lm.vocab_size, eos_token=lm.eos_token_id)
    return llg.LLTokenizer(llg.TokenizerWrapper(_VocabTokenizer(lm)), slices=[])


_TOKENIZERS = PerLM(_build_ll_tokenizer)


def ll_tokenizer(lm: LanguageModel):
    """The llguidance ``LLTokenizer`` for ``lm`` (built once per LM, ~1 s for a 49k vocabulary)."""
    if not isinstance(lm, LanguageModel):
        raise TypeError(f"lm must be a LanguageModel, got {type(lm).__name__}")
    return _TOKENIZERS(lm)


_TEMPLATES = PerLM(lambda lm: LRU(64))  # per LM: grammar spec -> fresh LLMatcher


def _template(lm: LanguageModel, grammar: Grammar):
    """The fresh ``LLMatcher`` of ``grammar`` for ``lm``, built once (lexer build) and kept."""
    per_lm = _TEMPLATES(lm)
    matcher = per_lm.get(grammar.spec)
    if matcher is None:
        llg = require_llguidance()
        matcher = llg.LLMatcher(ll_tokenizer(lm), grammar.spec, log_level=0)
        if matcher.is_error():
            raise ValueError(
                f"invalid {grammar.kind}: llguidance says: {matcher.get_error().strip()}"
            )
        per_lm.put(grammar.spec, matcher)
    return matcher


class MatcherState:
    """One particle's grammar matcher over the tokens generated so far.

    ``copy.deepcopy`` (hence ``Model.clone``) copies the matcher with
    ``LLMatcher.deep_copy()``; the LM and the grammar are shared. ``engine_error`` is
    llguidance's message when the engine failed (a limit: "Too many items").
    """

    def __init__(self, lm: LanguageModel, grammar: Grammar) -> None:
        self.lm, self.grammar = lm, grammar
        self.matcher = _template(lm, grammar).deep_copy()
        self.consumed: list[int] = []
        self.engine_error: str | None = None
        self.filled: torch.Tensor | None = None  # (1, W) bitmask of this state, if computed

    @property
    def accepting(self) -> bool:
        """Whether the text so far is a complete sentence of the grammar (EOS allowed)."""
        return self.matcher.is_accepting()

    def consume(self, token_id: int) -> bool:
        """Advance by a non-EOS token; False (and the state is dead) if the grammar forbids it."""
        ok = self.matcher.consume_token(int(token_id))
        self.consumed.append(int(token_id))
        self.filled = None
        if self.matcher.is_error():
            self.engine_error = self.matcher.get_error().strip()
            return False
        return bool(ok)

    def allows(self, token_id: int) -> bool:
        """Whether the grammar allows the non-EOS token next (the state does not move)."""
        return self.matcher.validate_tokens([int(token_id)]) == 1

    def state_key(self) -> tuple:
        return (self.grammar.spec, tuple(self.consumed))

    def __deepcopy__(self, memo) -> MatcherState:
        new = object.__new__(MatcherState)
        new.lm, new.grammar = self.lm, self.grammar
        new.matcher = self.matcher.deep_copy()
        new.consumed = list(self.consumed)
        new.engine_error = self.engine_error
        new.filled = self.filled  # never written in place: shared by the copies
        return new


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
    accepting = torch.tensor([s.accepting for s in unique])
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
    overwrite: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Masked next-token probabilities and log allowed masses for a batch of particles.

    ``log_probs`` is ``(B, V)``; ``final`` is ``(B,)`` bool (rows whose next token
    must be EOS: only EOS stays allowed, if the matcher accepts). Returns ``q`` of
    shape ``(B, V)`` with ``q[b, w] = p_b(w) 1_C(s_b w)`` (unnormalised) and
    ``log G'`` of shape ``(B,)``, ``G'_b = Σ_w q[b, w]`` (the LLaMPPL paper's
    allowed mass). Works with probabilities and a 0/1 float mask: one
    multiplication applies all masks (no ``-inf`` arithmetic, slow on some CPUs).
    ``overwrite=True`` computes ``q`` in the memory of ``log_probs`` (a tensor the
    caller owns and no longer needs), so the step allocates no new ``(B, V)`` tensor.
    """
    bits, accepting = _filled_bits(lm, states)
    masks = _unpack(bits, lm.vocab_size, log_probs.dtype, out=_scratch(bits, log_probs.dtype))
    masks[:, lm.eos_token_id] = accepting.to(log_probs.dtype)
    if bool(final.any()):
        masks[final, : lm.eos_token_id] = 0
        masks[final, lm.eos_token_id + 1 :] = 0
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


def make_grammar(
    grammar: Grammar | None = None,
    *,
    json_schema: Any = None,
    regex: str | None = None,
    lark: str | None = None,
    whitespace: str = "compact",
    max_string_length: int | None = MAX_STRING_LENGTH,
    max_array_items: int | None = MAX_ARRAY_ITEMS,
    closed_objects: bool = True,
    max_decimals: int | None = MAX_DECIMALS,
) -> Grammar:
    """A :class:`Grammar` from exactly one of ``grammar``, ``json_schema``, ``regex``, ``lark``.

    ``whitespace`` (``"compact"`` or ``"flexible"``) and the size budget
    (``max_string_length``, ``max_array_items``, ``closed_objects``, ``max_decimals``) apply to
    ``json_schema`` (:func:`~llamppl.decoding.grammar_compile.json_grammar`).
    """
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
    if kind == "json_schema":
        return Grammar.from_json_schema(
            value,
            whitespace=whitespace,
            max_string_length=max_string_length,
            max_array_items=max_array_items,
            closed_objects=closed_objects,
            max_decimals=max_decimals,
        )
    return {
        "regex": Grammar.from_regex,
        "lark": Grammar.from_lark,
    }[kind](value)
