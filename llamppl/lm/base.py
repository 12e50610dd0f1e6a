"""The language-model interface every LM backend implements, with request coalescing.

``LanguageModel`` is the one thing the modeling layer talks to. A backend
implements one hook, :meth:`LanguageModel.next_token_logprobs_batch`, which
receives every context that was awaited concurrently and returns their
normalised next-token log-probabilities. The base class turns many concurrent awaits of
:meth:`LanguageModel.next_token_logprobs` (one per particle) into one such call::

    lm = FunctionLM(["a", "b", "<eos>"], eos_token_id=2, logits_fn=lambda ctx: [0.0, 0.0, 0.0])
    logps = await asyncio.gather(*(lm.next_token_logprobs([0] * i) for i in range(16)))
    assert lm.batch_calls == 1          # 16 awaits, one batched call

Coalescing is :class:`llamppl.batching.Coalescer` (per event loop: the first
request schedules a flush task, which yields to the loop until no new request
arrives, then serves all of them). Every LM counts its work in ``lm.stats``, an
:class:`LMStats` (backends extend it with their own counters).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields

import torch

from ..batching import Coalescer
from ..validation import is_integer

__all__ = ["LMStats", "LanguageModel", "validate_token_ids", "check_contexts"]


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
        if not is_integer(t):
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


def check_contexts(
    contexts: Sequence[Sequence[int]], max_positions: int | None, bos_token_id: int | None
) -> None:
    """``ValueError`` naming the context that is empty or longer than ``max_positions``."""
    for i, c in enumerate(contexts):
        if len(c) == 0:
            hint = "" if bos_token_id is None else f" (e.g. the BOS token {bos_token_id})"
            raise ValueError(
                "token_ids must be non-empty: a causal LM needs at least one token to condition on"
                + hint
            )
        if max_positions and len(c) > max_positions:
            raise ValueError(
                f"context {i} has {len(c)} tokens, more than the model's {max_positions} positions"
            )


@dataclass
class LMStats:
    """Work counters every :class:`LanguageModel` keeps in ``lm.stats``.

    Attributes
    ----------
    batch_calls : int
        Batched backend calls made for the coalesced requests (one per flush, one per
        blocking call).
    forward_calls : int
        Model evaluations: transformer forwards, engine calls; one per batched call for
        a :class:`~llamppl.FunctionLM`.
    tokens_run : int
        Context tokens the model had to compute (for a ``FunctionLM``: the lengths of
        the contexts ``logits_fn`` was called on).
    cache_hits : int
        Requested contexts served from a memo, with no model work.
    requests : int
        Distinct contexts served.
    """

    batch_calls: int = 0
    forward_calls: int = 0
    tokens_run: int = 0
    cache_hits: int = 0
    requests: int = 0

    def reset(self) -> None:
        """Zero every counter."""
        for f in fields(self):
            setattr(self, f.name, 0)


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
    other_eos_token_ids : frozenset[int]
        End tokens besides ``eos_token_id`` (set by backends).
    stats : LMStats
        Work counters (a backend's subclass of :class:`LMStats`).

    Notes
    -----
    A backend subclass implements THE backend hook,
    :meth:`next_token_logprobs_batch` (plus ``vocab``, ``eos_token_id``, ``encode``,
    ``decode``); everything else (validation, coalescing concurrent awaits into one
    call, ``batch_size`` chunking, ``stats.batch_calls``) is done here.
    """

    vocab: list[str]
    eos_token_id: int
    bos_token_id: int | None = None
    other_eos_token_ids: frozenset[int] = frozenset()
    _batch_size: int | None = None  # lm.batch_size: most contexts per backend call (None: all)

    def __init__(self) -> None:
        self.stats: LMStats = LMStats()
        self._coalescer: Coalescer[tuple[int, ...], torch.Tensor] = Coalescer(self._serve)

    @property
    def batch_calls(self) -> int:
        """How many batched calls the coalescer has made (``stats.batch_calls``, read-only)."""
        return self.stats.batch_calls

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
        return self.other_eos_token_ids | {self.eos_token_id}

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

    def next_token_logprobs_batch(self, contexts: list[tuple[int, ...]]) -> list[torch.Tensor]:
        """THE backend hook: normalised next-token log-probs, one ``[vocab_size]`` tensor per context.

        Backends implement it; the base class calls it with validated, distinct
        contexts (at most ``batch_size`` of them) and counts the call in
        ``stats.batch_calls``. Call :meth:`batch_next_token_logprobs` or
        :meth:`next_token_logprobs` from user code (they validate and coalesce).
        """
        raise NotImplementedError(
            f"{type(self).__name__} must implement next_token_logprobs_batch(contexts)"
        )

    # ------------------------------------------------------------------ vocabulary masks, batch size
    @property
    def masks(self):
        """Vocabulary masks (``lm.masks.STARTS_NEW_WORD``, ...), built lazily once per LM; see ``llamppl.lm.masks``."""
        from .masks import masks_for

        return masks_for(self)

    @property
    def batch_size(self) -> int | None:
        """The most contexts one backend call may hold, hence the most rows one transformer
        forward may hold.

        ``None`` (the default): every pending request is served in one call. ``lm.batch_size = n``
        splits larger batches into calls of at most ``n`` contexts each (bounding a forward's
        activation memory); results are the same, only ``batch_calls`` / ``stats.forward_calls`` grow.
        """
        return self._batch_size

    @batch_size.setter
    def batch_size(self, value: int | None) -> None:
        from ..validation import check_positive_int

        self._batch_size = None if value is None else check_positive_int("batch_size", value)

    def __deepcopy__(self, memo) -> LanguageModel:
        return self  # particles share their LM (and its cache); cloning never copies it

    # ------------------------------------------------------------------ public API
    async def next_token_logprobs(self, token_ids: Sequence[int]) -> torch.Tensor:
        """Log-probabilities ``[vocab_size]`` of the token after ``token_ids``.

        Concurrent awaits (e.g. from all particles of an SMC step) are served by
        one batched call to the backend.
        """
        return await self._coalescer.submit(validate_token_ids(token_ids, self.vocab_size))

    def next_token_logprobs_sync(self, token_ids: Sequence[int]) -> torch.Tensor:
        """Blocking single-context version of :meth:`next_token_logprobs`."""
        ids = validate_token_ids(token_ids, self.vocab_size)
        self.stats.batch_calls += 1
        return self.next_token_logprobs_batch([ids])[0]

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
            self.stats.batch_calls += 1
            results.update(zip(chunk, self.next_token_logprobs_batch(chunk)))
        return [results[c] for c in contexts]
