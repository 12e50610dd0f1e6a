"""``FunctionLM``: an exact, enumerable language model defined by a Python function.

The logits for a context (a tuple of token ids) come from ``logits_fn``; the
model normalises them in float64. Tokens whose logit is ``-inf`` have
probability zero: they are never sampled and enumeration skips them. It is the
test oracle's LM and a teaching tool::

    from llamppl import FunctionLM
    lm = FunctionLM(["a", "b", "."], eos_token_id=2,
                    logits_fn=lambda ctx: [1.0, 0.0, 0.5 * len(ctx)])
    lm.encode("abba.")      # [0, 1, 1, 0, 2]
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import torch

from .base import LanguageModel, validate_token_ids

__all__ = ["FunctionLM"]


class FunctionLM(LanguageModel):
    """Language model whose next-token logits are ``logits_fn(context)``.

    Parameters
    ----------
    vocab : list[str]
        Text of each token; must be non-empty strings (greedy longest-match
        ``encode`` needs them).
    eos_token_id : int
        Id of the end-of-sequence token, in ``[0, len(vocab))``.
    logits_fn : Callable[[tuple[int, ...]], Sequence[float]]
        Unnormalised logits of length ``len(vocab)`` for a context. May contain
        ``-inf`` (impossible tokens) but not NaN, and not be all ``-inf``.
    bos_token_id : int | None
        Optional id that :class:`~llamppl.LMContext` prepends to prompts.
    eos_token_ids : Sequence[int] | None
        Further ids that also end a sequence (like a chat model's end-of-turn
        tokens); ``lm.eos_token_ids`` is their set plus ``eos_token_id``.
    """

    def __init__(
        self,
        vocab: Sequence[str],
        eos_token_id: int,
        logits_fn: Callable[[tuple[int, ...]], Sequence[float]],
        bos_token_id: int | None = None,
        eos_token_ids: Sequence[int] | None = None,
    ) -> None:
        super().__init__()
        if isinstance(vocab, str) or not isinstance(vocab, Sequence) or len(vocab) == 0:
            raise ValueError("vocab must be a non-empty list of token strings")
        if not all(isinstance(v, str) and v for v in vocab):
            raise TypeError("vocab must contain non-empty strings only")
        if len(set(vocab)) != len(vocab):
            raise ValueError("vocab must not contain duplicate token strings")
        if not callable(logits_fn):
            raise TypeError(f"logits_fn must be callable, got {type(logits_fn).__name__}")
        self.vocab = list(vocab)
        (self.eos_token_id,) = validate_token_ids([eos_token_id], len(vocab), "eos_token_id")
        if bos_token_id is not None:
            (bos_token_id,) = validate_token_ids([bos_token_id], len(vocab), "bos_token_id")
        self.bos_token_id = bos_token_id
        if eos_token_ids is not None:
            extra = validate_token_ids(eos_token_ids, len(vocab), "eos_token_ids")
            self.other_eos_token_ids = frozenset(extra) - {self.eos_token_id}
        self.logits_fn = logits_fn
        self._cache: dict[tuple[int, ...], torch.Tensor] = {}
        self._by_length = sorted(range(len(vocab)), key=lambda i: -len(vocab[i]))

    def encode(self, text: str) -> list[int]:
        """Greedy longest-match tokenisation of ``text`` over ``vocab``."""
        if not isinstance(text, str):
            raise TypeError(f"text must be a str, got {type(text).__name__}")
        ids, pos = [], 0
        while pos < len(text):
            for i in self._by_length:
                if text.startswith(self.vocab[i], pos):
                    ids.append(i)
                    pos += len(self.vocab[i])
                    break
            else:
                raise ValueError(
                    f"text cannot be tokenised: no vocab entry matches at {text[pos:]!r}"
                )
        return ids

    def decode(self, token_ids: Sequence[int]) -> str:
        """Concatenated text of ``token_ids``."""
        return "".join(self.vocab[i] for i in validate_token_ids(token_ids, self.vocab_size))

    def logprobs(self, context: Sequence[int]) -> torch.Tensor:
        """Normalised float64 log-probabilities after ``context`` (memoised, synchronous)."""
        return self._logprobs(tuple(context))[0]

    def _logprobs(self, ctx: tuple[int, ...]) -> tuple[torch.Tensor, bool]:
        """``(log-probs, whether they were memoised)`` of ``ctx``."""
        out = self._cache.get(ctx)
        if out is not None:
            return out, True
        return self._compute([ctx])[0], False

    def _compute(self, ctxs: list[tuple[int, ...]]) -> list[torch.Tensor]:
        """Log-probs of new contexts, checked with one host read for all of them (memoised)."""
        rows = []
        for ctx in ctxs:
            logits = torch.as_tensor(self.logits_fn(ctx), dtype=torch.float64).flatten()
            if logits.numel() != self.vocab_size:
                raise ValueError(
                    f"logits_fn returned {logits.numel()} logits for a vocab of {self.vocab_size}"
                )
            rows.append(logits)
        logits = torch.stack(rows)  # [n, V]
        nan = torch.isnan(logits).any(dim=1)
        bad = torch.isposinf(logits).any(dim=1) | ~torch.isfinite(logits).any(dim=1)
        for ctx, is_nan, is_bad in zip(ctxs, *torch.stack([nan, bad]).tolist()):
            if is_nan:
                raise ValueError(f"logits_fn returned NaN for context {ctx}")
            if is_bad:
                raise ValueError(
                    "logits_fn must give finite logits or -inf, with at least one finite, "
                    f"for context {ctx}"
                )
        out = list(torch.log_softmax(logits, dim=1).unbind(0))
        self._cache.update(zip(ctxs, out))
        return out

    def next_token_logprobs_batch(self, contexts: list[tuple[int, ...]]) -> list[torch.Tensor]:
        """One "forward" per batched call (``stats``); memoised contexts count as cache hits."""
        stats = self.stats
        stats.forward_calls += 1
        stats.requests += len(contexts)
        new = list(dict.fromkeys(c for c in contexts if c not in self._cache))
        if new:
            self._compute(new)
        fresh, out = set(new), []
        for c in contexts:
            if c in fresh:
                stats.tokens_run += len(c)
                fresh.discard(c)  # a repeat within the batch is a cache hit, as before
            else:
                stats.cache_hits += 1
            out.append(self._cache[c])
        return out

    def sequence_logprob(self, prompt: Sequence[int], continuation: Sequence[int]) -> float:
        """``log p(continuation | prompt)``, summed token by token."""
        ctx, total = list(prompt), 0.0
        for t in continuation:
            total += float(self.logprobs(ctx)[t])
            if total == -math.inf:
                return total
            ctx.append(t)
        return total
