"""The language-model interface every LM backend implements, with request coalescing.

``LanguageModel`` is the one thing the modeling layer talks to. Subclasses
implement :meth:`LanguageModel._next_token_logprobs_batch`, which receives every
context that was awaited concurrently and returns their normalised next-token
log-probabilities. The base class turns many concurrent awaits of
:meth:`LanguageModel.next_token_logprobs` (one per particle) into one such call::

    lm = FunctionLM(["a", "b", "<eos>"], eos_token_id=2, logits_fn=lambda ctx: [0.0, 0.0, 0.0])
    logps = await asyncio.gather(*(lm.next_token_logprobs([0] * i) for i in range(16)))
    assert lm.batch_calls == 1          # 16 awaits, one batched call

Coalescing works per event loop: the first request schedules a flush task,
which yields to the loop until no new request arrives, then serves all of them.
"""

from __future__ import annotations

import asyncio
import numbers
from collections.abc import Sequence

import torch

__all__ = ["LanguageModel", "validate_token_ids"]


def validate_token_ids(
    token_ids: object, vocab_size: int, name: str = "token_ids"
) -> tuple[int, ...]:
    """Return ``token_ids`` as a tuple of Python ints, or raise a clear error.

    Raises ``TypeError`` if ``token_ids`` is not a sequence of integers and
    ``ValueError`` if an id lies outside ``[0, vocab_size)``.
    """
    if isinstance(token_ids, torch.Tensor):
        token_ids = token_ids.tolist()
    if type(token_ids) in (list, tuple) and all(type(t) is int for t in token_ids):
        # fast path (every particle, every step): plain ints need only a range check
        if not token_ids or (min(token_ids) >= 0 and max(token_ids) < vocab_size):
            return tuple(token_ids)
    if isinstance(token_ids, (str, bytes)) or not isinstance(token_ids, Sequence):
        raise TypeError(
            f"{name} must be a sequence of integer token ids, got {type(token_ids).__name__}"
        )
    out = []
    for i, t in enumerate(token_ids):
        if isinstance(t, bool) or not isinstance(t, numbers.Integral):
            raise TypeError(
                f"{name}[{i}] must be an integer token id, got {t!r} ({type(t).__name__})"
            )
        t = int(t)
        if not 0 <= t < vocab_size:
            raise ValueError(
                f"{name}[{i}] = {t} is out of range: token ids must lie in [0, {vocab_size})"
            )
        out.append(t)
    return tuple(out)


class LanguageModel:
    """Abstract next-token model over a fixed vocabulary.

    Attributes
    ----------
    vocab : list[str]
        Decoded text of each token id (``vocab[i]`` for id ``i``).
    eos_token_id : int
        Id of the primary end-of-sequence token.
    eos_token_ids : frozenset[int]
        Every id that ends a sequence: ``eos_token_id`` plus any other end-of-turn
        token (chat models list several in their generation config). Test
        "the sequence ended" with ``token in lm.eos_token_ids``.
    bos_token_id : int | None
        Id prepended to every context by :class:`~llamppl.LMContext`, or None.
    batch_calls : int
        How many batched calls the coalescer has made (one per flush).
    """

    vocab: list[str]
    eos_token_id: int
    bos_token_id: int | None = None
    _extra_eos_ids: frozenset[int] = frozenset()  # end tokens besides eos_token_id
    _batch_size: int | None = None  # lm.batch_size: most contexts per backend call (None: all)
    backend: str = "custom"  # LLaMPPL's lm.backend: "hf", "vllm", "function", ...

    def __init__(self) -> None:
        self.batch_calls = 0
        self._pending: list[tuple[tuple[int, ...], asyncio.Future]] = []
        self._flush_task: asyncio.Task | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    # ------------------------------------------------------------------ interface
    @property
    def vocab_size(self) -> int:
        """Number of token ids, ``len(vocab)``."""
        return len(self.vocab)

    @property
    def device(self) -> torch.device:
        """Device of the returned log-probability tensors."""
        return torch.device("cpu")

    @property
    def eos_token_ids(self) -> frozenset[int]:
        """Every token id that ends a sequence; always contains ``eos_token_id``."""
        return self._extra_eos_ids | {self.eos_token_id}

    @property
    def byte_vocab(self) -> list[bytes]:
        """Bytes each token id appends (UTF-8 of ``vocab[i]`` unless a backend knows better)."""
        return [v.encode("utf-8") for v in self.vocab]

    def apply_chat_template(self, messages: Sequence[dict]) -> list[int]:
        """Token ids of ``messages`` rendered by the model's chat template, ending with the
        assistant's generation prompt (backends that have a template override this)."""
        raise TypeError(
            f"{type(self).__name__} has no chat template: pass a prompt string or token ids "
            "instead of messages"
        )

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text`` (no BOS added)."""
        raise NotImplementedError(f"{type(self).__name__} must implement encode(text)")

    def decode(self, token_ids: Sequence[int]) -> str:
        """Text of ``token_ids``."""
        raise NotImplementedError(f"{type(self).__name__} must implement decode(token_ids)")

    def _next_token_logprobs_batch(self, contexts: list[tuple[int, ...]]) -> list[torch.Tensor]:
        """Normalised next-token log-probs, one ``[vocab_size]`` tensor per context.

        Subclasses implement this; ``contexts`` are validated and distinct.
        """
        raise NotImplementedError(
            f"{type(self).__name__} must implement _next_token_logprobs_batch"
        )

    # ------------------------------------------------------------------ LLaMPPL names
    @property
    def str_vocab(self) -> list[str]:
        """LLaMPPL name of :attr:`vocab` (decoded text of each token id)."""
        return self.vocab

    @property
    def masks(self):
        """Vocabulary masks (``lm.masks.STARTS_NEW_WORD``, ...), built lazily once per LM; see ``llamppl.lm.masks``."""
        from .masks import masks_for

        return masks_for(self)

    def next_token_logprobs_unbatched(self, token_ids: Sequence[int]) -> torch.Tensor:
        """LLaMPPL name of :meth:`next_token_logprobs_sync`."""
        return self.next_token_logprobs_sync(token_ids)

    def cache_kv(self, prompt_tokens: Sequence[int]) -> None:
        """LLaMPPL name: warm the cache with ``prompt_tokens`` (caching is otherwise automatic)."""
        self.next_token_logprobs_sync(prompt_tokens)

    @property
    def batch_size(self) -> int | None:
        """LLaMPPL's knob, with the meaning true for the coalescer: the most contexts one backend
        call may hold, hence the most rows one transformer forward may hold.

        ``None`` (the default): every pending request is served in one call. ``lm.batch_size = n``
        splits larger batches into calls of at most ``n`` contexts each (bounding a forward's
        activation memory); results are the same, only ``batch_calls`` / ``stats.forward_calls`` grow.
        """
        return self._batch_size

    @batch_size.setter
    def batch_size(self, value: int | None) -> None:
        from ..validation import check_positive_int

        self._batch_size = None if value is None else check_positive_int("batch_size", value)

    def clear_kv_cache(self) -> None:
        """LLaMPPL name of :meth:`clear_cache`: here the KV and the log-probs live in the same
        trie nodes, so clearing the KV clears both (backends without a cache do nothing)."""
        clear = getattr(self, "clear_cache", None)
        if clear is not None:
            clear()

    def __deepcopy__(self, memo) -> LanguageModel:
        return self  # particles share their LM (and its cache); cloning never copies it

    # ------------------------------------------------------------------ public API
    async def next_token_logprobs(self, token_ids: Sequence[int]) -> torch.Tensor:
        """Log-probabilities ``[vocab_size]`` of the token after ``token_ids``.

        Concurrent awaits (e.g. from all particles of an SMC step) are served by
        one batched call to the backend.
        """
        ids = validate_token_ids(token_ids, self.vocab_size)
        loop = asyncio.get_running_loop()
        if loop is not self._loop:
            self._loop, self._pending, self._flush_task = loop, [], None
        fut = loop.create_future()
        self._pending.append((ids, fut))
        if self._flush_task is None:
            self._flush_task = loop.create_task(self._flush())
        return await fut

    def next_token_logprobs_sync(self, token_ids: Sequence[int]) -> torch.Tensor:
        """Blocking single-context version of :meth:`next_token_logprobs`."""
        ids = validate_token_ids(token_ids, self.vocab_size)
        self.batch_calls += 1
        return self._next_token_logprobs_batch([ids])[0]

    def batch_next_token_logprobs(self, contexts: Sequence[Sequence[int]]) -> list[torch.Tensor]:
        """Blocking batched version: one backend call for all ``contexts``."""
        ids = [
            validate_token_ids(c, self.vocab_size, f"contexts[{i}]") for i, c in enumerate(contexts)
        ]
        return self._serve(ids)

    # ------------------------------------------------------------------ internals
    def _serve(self, contexts: list[tuple[int, ...]]) -> list[torch.Tensor]:
        unique = list(dict.fromkeys(contexts))
        cap = self._batch_size or max(len(unique), 1)  # lm.batch_size: contexts per backend call
        results: dict[tuple[int, ...], torch.Tensor] = {}
        for start in range(0, max(len(unique), 1), cap):
            chunk = unique[start : start + cap]
            self.batch_calls += 1
            results.update(zip(chunk, self._next_token_logprobs_batch(chunk)))
        return [results[c] for c in contexts]

    async def _flush(self) -> None:
        # Let every runnable coroutine submit its request before serving them.
        seen = -1
        while seen != len(self._pending):
            seen = len(self._pending)
            await asyncio.sleep(0)
        pending, self._pending, self._flush_task = self._pending, [], None
        live = [(c, f) for c, f in pending if not f.cancelled()]
        if not live:
            return
        try:
            results = self._serve([c for c, _ in live])
        except BaseException as exc:  # surface backend errors at every awaiting call
            for _, f in live:
                if not f.done():
                    f.set_exception(exc)
            return
        for (_, f), r in zip(live, results):
            if not f.done():
                f.set_result(r)
