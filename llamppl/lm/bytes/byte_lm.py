"""``ByteLM``: a language model over bytes (256 bytes and an end), built from any token LM.

Vieira et al. (ICML 2025, arXiv 2412.03719; ``papers.md`` §7): the probability that a
text starts with the bytes σ sums the token LM over the covering of σ
(:mod:`llamppl.lm.bytes.covering`), and the next byte's distribution is a ratio of two such
sums. ``ByteLM(lm, beam=None)`` sums every token string (exact; feasible on small
vocabularies), ``ByteLM(lm, beam=K)`` keeps the K most probable covering strings::

    from llamppl import CachedCausalLM, ByteLM, run
    byte_lm = ByteLM(CachedCausalLM.default(), beam=8)
    run(byte_lm.greedy("The capital of France is Pa", max_bytes=4))     # 'ris.'
    logps = run(byte_lm.next_byte_logprobs(b"The capital of France is Pa"))  # (257,)
    run(byte_lm.prefix_logprob(b"The capital"))     # log P(text starts with it)

The prompt is bytes like any other prefix: a prompt that ends inside a token (``"… is
Pa"``) is *healed* by construction, since the covering holds ``" Paris"`` as well as
``" Pa"`` (see ``docs/bytes.md``). The covering strings are token ids after ``context``,
the token ids every text is conditioned on (default: the LM's BOS, else its tokenizer's
``<|endoftext|>`` document separator, else nothing for an LM that accepts an empty
context such as a ``FunctionLM``); a chat is ``context=lm.apply_chat_template(messages)``.

It is a :class:`~llamppl.lm.base.LanguageModel` whose tokens are the 256 bytes, the end
(id 256) and the start of the text (id 257, its ``bos_token_id``, never drawn, so
``LMContext(byte_lm, "")`` starts right after ``context``). Programs use it like any LM:
``LMContext(byte_lm, "The Fed says")`` samples bytes with exact weights (for this byte LM),
``HardConstraint(byte_lm, ...)`` checks a constraint at every byte, and the covering
elements of all particles are requested from the token LM concurrently, so they share one
batched forward and the KV of the trie.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from ...runner import run
from ...validation import check_positive_int
from ..base import LanguageModel, LMStats, validate_token_ids
from ..memo import LRU
from .covering import (
    EOS_BYTE,
    Covering,
    byte_tables,
    element_masses,
    extend_covering,
    next_byte_logprobs,
    root_covering,
)

__all__ = ["ByteLM", "ByteLMStats", "document_start"]

#: How a non-ASCII byte shows in ``ByteLM.vocab`` (a byte alone is no character).
REPLACEMENT = "\ufffd"
#: The id of the start of the text (``bos_token_id``): ``LMContext`` puts it first, so an empty
#: prompt is the start of the text after ``context`` (a chat's reply); it is never drawn.
START = 257


@dataclass
class ByteLMStats(LMStats):
    """:class:`~llamppl.lm.base.LMStats` of a :class:`ByteLM`, plus its own work.

    Attributes
    ----------
    extensions : int
        Coverings computed from their parent's (one per new byte prefix).
    token_requests : int
        Next-token requests sent to the token LM (one per candidate that ends at a prefix).
    candidates : int
        Elements kept over all computed coverings (their sum; divide by ``extensions``).
    covering_hits : int
        Prefixes whose covering was already known.
    """

    extensions: int = 0
    token_requests: int = 0
    candidates: int = 0
    covering_hits: int = 0


def document_start(lm: LanguageModel) -> tuple[int, ...]:
    """Token ids a plain text starts from: the LM's BOS, else its tokenizer's
    ``<|endoftext|>`` (the document separator of GPT-2-style vocabularies, SmolLM's too), else
    ``()``."""
    if lm.bos_token_id is not None:
        return (lm.bos_token_id,)
    tokenizer = getattr(lm, "tokenizer", None)
    if tokenizer is not None:
        found = tokenizer.convert_tokens_to_ids("<|endoftext|>")
        if isinstance(found, int) and tokenizer.convert_ids_to_tokens(found) == "<|endoftext|>":
            return (found,)
    return ()


def as_prefix(prefix: object, name: str = "prefix") -> bytes:
    """``prefix`` as bytes: bytes/bytearray as they are, a str as UTF-8, or a list of byte values."""
    if isinstance(prefix, (bytes, bytearray)):
        return bytes(prefix)
    if isinstance(prefix, str):
        return prefix.encode("utf-8")
    if isinstance(prefix, (list, tuple)) or isinstance(prefix, torch.Tensor):
        ids = validate_token_ids(prefix, 256, name)
        return bytes(ids)
    raise TypeError(
        f"{name} must be bytes, a str or a list of byte values, got {type(prefix).__name__}"
    )


class ByteLM(LanguageModel):
    """The byte-level language model of a token LM (module docstring).

    Parameters
    ----------
    lm : LanguageModel
        Any token LM (``CachedCausalLM``, ``VLLMLM``, ``FunctionLM``); its ``byte_vocab``
        gives each token's bytes.
    beam : int | None
        K, the covering strings kept after each byte (``None``: every one, exact).
    context : Sequence[int] | None
        Token ids every text is conditioned on (default :func:`document_start`).
    max_coverings : int
        How many prefixes' coverings are remembered (least recently used go first).

    Attributes
    ----------
    token_lm : LanguageModel
    beam : int | None
    context : tuple[int, ...]
    stats : ByteLMStats
    """

    def __init__(
        self,
        lm: LanguageModel,
        beam: int | None = 8,
        context: Sequence[int] | None = None,
        max_coverings: int = 1024,
    ) -> None:
        super().__init__()
        if not isinstance(lm, LanguageModel):
            raise TypeError(f"lm must be a LanguageModel, got {type(lm).__name__}")
        if isinstance(lm, ByteLM):
            raise TypeError("lm must be a token LM, got a ByteLM (it is already over bytes)")
        self.token_lm = lm
        self.beam = None if beam is None else check_positive_int("beam", beam)
        ctx = document_start(lm) if context is None else context
        self.context = validate_token_ids(ctx, lm.vocab_size, "context")
        if not self.context and getattr(lm, "max_positions", None) is not None:
            raise ValueError(
                f"context must be non-empty for {type(lm).__name__} (it has no BOS token): "
                "pass the token ids to condition on, e.g. context=lm.encode('\\n')"
            )
        self.stats: ByteLMStats = ByteLMStats()
        self.vocab = [chr(b) if b < 128 else REPLACEMENT for b in range(256)] + ["", ""]
        self.eos_token_id = EOS_BYTE
        self.bos_token_id = START
        self._tables = byte_tables(lm)
        self._coverings: LRU[bytes, Covering] = LRU(
            check_positive_int("max_coverings", max_coverings)
        )
        self._coverings.put(b"", root_covering())
        self._inflight: dict[bytes, asyncio.Future] = {}
        self._loop: asyncio.AbstractEventLoop | None = None

    # ------------------------------------------------------------------ LanguageModel
    @property
    def byte_vocab(self) -> list[bytes]:
        """Each byte id's one byte; the end (256) and the start (257) have none."""
        return [bytes([b]) for b in range(256)] + [b"", b""]

    @property
    def device(self) -> torch.device:
        return self.token_lm.device

    def encode(self, text: str) -> list[int]:
        """The UTF-8 bytes of ``text`` as ids."""
        if not isinstance(text, str):
            raise TypeError(f"text must be a str, got {type(text).__name__}")
        return list(text.encode("utf-8"))

    def decode(self, token_ids: Sequence[int]) -> str:
        """The bytes decoded as UTF-8 (an incomplete character shows as U+FFFD); the end and
        the start add nothing."""
        ids = validate_token_ids(token_ids, 258)
        return bytes(i for i in ids if i < 256).decode("utf-8", errors="replace")

    async def next_token_logprobs(self, token_ids: Sequence[int]) -> torch.Tensor:
        """``(258,)`` log-probs of the byte after the ids ``token_ids`` (bytes, after the start
        257 that ``LMContext`` puts first): :meth:`next_byte_logprobs`, and ``-inf`` for the
        start. The LM interface of programs (``LMContext``)."""
        dist = await self.next_byte_logprobs(self._prefix_of(token_ids))
        return torch.cat([dist, dist.new_full((1,), -math.inf)])

    def next_token_logprobs_batch(self, contexts: list[tuple[int, ...]]) -> list[torch.Tensor]:
        """The blocking hook: each context's next-byte log-probs (all requested concurrently)."""

        async def all_of() -> list[torch.Tensor]:
            return list(await asyncio.gather(*(self.next_token_logprobs(c) for c in contexts)))

        return run(all_of())

    # ------------------------------------------------------------------ the byte view
    async def next_byte_logprobs(self, prefix: bytes | str) -> torch.Tensor:
        """``(257,)`` float64 log-probs on the token LM's device of the byte after ``prefix``;
        index 256 is the end of the text.

        P(b | σ) = P(σ·b) / P(σ) and P(end | σ) = P_end(σ) / P(σ) over the (beam's) covering
        of σ (:func:`~llamppl.lm.bytes.covering.next_byte_logprobs`), where P is the byte view
        of the token LM: special tokens and tokens of no bytes are never drawn (the others are
        renormalised at every token boundary; :mod:`~llamppl.lm.bytes.covering`). Exactly
        (``beam=None``) the 257 outcomes then sum to one on their own and the chain of these
        probabilities is :meth:`prefix_logprob`; with a beam they are normalised over the kept
        strings (the beam's own byte LM). An impossible prefix gives all ``-inf``.
        """
        cover = await self.covering(as_prefix(prefix))
        if cover.dist is None:
            await self._masses(cover)
            cover.dist = next_byte_logprobs(cover).to(self.device)
        return cover.dist

    async def prefix_logprob(self, prefix: bytes | str) -> float:
        """log P(the text starts with ``prefix``): log Σ p̃(t) over the covering of ``prefix``
        (Vieira et al. 2025), p̃ the token LM that draws no special or byteless token (as
        :meth:`next_byte_logprobs`, whose chain it equals exactly); with a beam, over the
        strings the beam kept up to the last byte (a lower bound)."""
        return (await self.covering(as_prefix(prefix))).logprob

    async def greedy(
        self, prompt: bytes | str, max_bytes: int = 32, stop: Sequence[bytes | str] = ()
    ) -> str:
        """The most probable next byte, repeatedly: the continuation of ``prompt`` (text or
        bytes, healed by the covering) until the end, ``max_bytes`` bytes, or a ``stop``
        string ends it (the stop string is kept). Returns the continuation decoded as UTF-8."""
        text = as_prefix(prompt, "prompt")
        max_bytes = check_positive_int("max_bytes", max_bytes)
        stops = [as_prefix(s, "stop") for s in ([stop] if isinstance(stop, (str, bytes)) else stop)]
        out = b""
        for _ in range(max_bytes):
            best = int((await self.next_byte_logprobs(text + out)).argmax())  # one read per byte
            if best == EOS_BYTE:
                break
            out += bytes([best])
            if any(s and out.endswith(s) for s in stops):
                break
        return out.decode("utf-8", errors="replace")

    async def covering(self, prefix: bytes) -> Covering:
        """The (beam's) covering of ``prefix``, from the longest remembered prefix of it, byte
        by byte; concurrent requests for one prefix share its computation."""
        prefix = as_prefix(prefix)
        found = self._coverings.get(prefix)
        if found is not None:
            self.stats.covering_hits += 1
            return found
        loop = asyncio.get_running_loop()
        if loop is not self._loop:
            self._loop, self._inflight = loop, {}
        start = len(prefix) - 1
        while (
            start > 0
            and prefix[:start] not in self._coverings
            and prefix[:start] not in self._inflight
        ):
            start -= 1
        cover = self._coverings.get(prefix[:start])
        if cover is None:
            cover = await self._inflight[prefix[:start]] if start else root_covering()
        for n in range(start + 1, len(prefix) + 1):
            key = prefix[:n]
            known = self._coverings.get(key)
            if known is not None:
                cover = known
                continue
            pending = self._inflight.get(key)
            if pending is not None:
                cover = await pending
                continue
            future = loop.create_future()
            self._inflight[key] = future
            try:
                cover = await self._extend(cover, key[-1])
            except BaseException as exc:
                future.set_exception(exc)
                future.exception()  # retrieved: awaiting requests re-raise it
                raise
            finally:
                self._inflight.pop(key, None)
            self._coverings.put(key, cover)
            future.set_result(cover)
        return cover

    def clear(self) -> None:
        """Forget every remembered covering (the token LM's cache is its own)."""
        self._coverings.clear()
        self._coverings.put(b"", root_covering())

    # ------------------------------------------------------------------ internals
    async def _extend(self, cover: Covering, byte: int) -> Covering:
        await self._masses(cover)
        child = extend_covering(self._tables, cover, byte, self.beam)
        self.stats.extensions += 1
        self.stats.candidates += len(child.elements)
        return child

    async def _masses(self, cover: Covering) -> None:
        """Fill ``cover.masses``, first fetching the rows of its elements that lack one: the
        LM's next-token log-probs after each, requested concurrently (one coalesced batch)."""
        if cover.masses is not None:
            return
        todo = cover.pending()
        if todo:
            lm, ctx = self.token_lm, self.context
            self.stats.token_requests += len(todo)
            rows = await asyncio.gather(*(lm.next_token_logprobs(ctx + e.tokens) for e in todo))
            for e, row in zip(todo, rows):
                e.row = row
        if cover.masses is None:
            cover.masses = element_masses(self._tables, cover)

    def _prefix_of(self, token_ids: Sequence[int]) -> bytes:
        ids = validate_token_ids(token_ids, 258)
        if ids and ids[0] == START:
            ids = ids[1:]
        if EOS_BYTE in ids or START in ids:
            raise ValueError(
                "token_ids must be bytes (0..255) after an optional start (257): the end (256) "
                "ends the text, so a finished text has no next byte"
            )
        return bytes(ids)

    def __repr__(self) -> str:
        return f"ByteLM({type(self.token_lm).__name__}, beam={self.beam})"
