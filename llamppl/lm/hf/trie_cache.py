"""The bounded K/V cache of :class:`~llamppl.CachedCausalLM`: ``max_cache_tokens`` lives here.

One place owns the memory budget and the eviction policy. A :class:`TrieCache`
joins the :class:`~llamppl.lm.trie.TokenTrie` (which tokens are cached, their
slots, LRU order, locks) and the :class:`~llamppl.lm.hf.kv_pool.KVPool` (their
K/V, grown on demand up to the same capacity), and keeps the memory gauges of
:class:`CacheStats`:

- **Budget.** ``max_cache_tokens`` K/V slots; by default as many as fit in
  1 GiB (:func:`cache_capacity`).
- **Eviction.** Before a forward, :meth:`TrieCache.reserve` frees slots for the
  batch's new tokens by evicting least-recently-used leaves; the cached nodes
  the batch reads are locked meanwhile (the "live" set: the contexts being
  served; between batches, the particles' current contexts are the most
  recently used and are evicted last).
- **Splitting.** If one batch needs more slots than can be freed,
  :meth:`TrieCache.serve_in_parts` serves it in halves (recursively); a single
  context longer than the bound raises ``ValueError``.
- **Rollback.** :meth:`TrieCache.insert` removes the batch's new nodes again if
  the forward fails, so no node without K/V stays in the trie.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

import torch

from ...validation import check_positive_int
from ..base import LMStats
from ..trie import TokenTrie, TrieNode
from .batch_plan import Request
from .kv_pool import KVPool, slot_bytes

__all__ = ["DEFAULT_CACHE_BYTES", "CacheStats", "TrieCache", "cache_capacity"]

DEFAULT_CACHE_BYTES = 1 << 30


def cache_capacity(max_cache_tokens: int | None, bytes_per_token: int) -> int:
    """``max_cache_tokens`` checked, or (None) as many tokens as fit in :data:`DEFAULT_CACHE_BYTES`."""
    if max_cache_tokens is None:
        return max(256, DEFAULT_CACHE_BYTES // bytes_per_token)
    return check_positive_int("max_cache_tokens", max_cache_tokens)


@dataclass
class CacheStats(LMStats):
    """Work and memory counters of a :class:`~llamppl.CachedCausalLM`.

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
    shared_prefix_tokens : int
        Key columns not gathered per row because every row of the forward shared them:
        rows x shared prefix tokens, summed over forwards
        (:mod:`llamppl.lm.hf.prefix_attention` reads them once per layer instead).
    """

    cached_tokens: int = 0
    peak_cached_tokens: int = 0
    peak_cache_bytes: int = 0
    evictions: int = 0
    uploads: int = 0
    shared_prefix_tokens: int = 0

    def reset(self) -> None:
        """Zero the work counters; the peaks restart from the current cache size."""
        per_token = (
            self.peak_cache_bytes // self.peak_cached_tokens if self.peak_cached_tokens else 0
        )
        cached = self.cached_tokens
        super().reset()
        self.cached_tokens = self.peak_cached_tokens = cached
        self.peak_cache_bytes = cached * per_token

    def __repr__(self) -> str:
        return (
            f"CacheStats(forward_calls={self.forward_calls}, tokens_run={self.tokens_run}, "
            f"cache_hits={self.cache_hits}, requests={self.requests}, "
            f"cached_tokens={self.cached_tokens}, peak_cached_tokens={self.peak_cached_tokens}, "
            f"peak_cache_bytes={self.peak_cache_bytes / 2**20:.1f} MiB, evictions={self.evictions})"
        )


class TrieCache:
    """The token trie and the K/V pool under one budget of ``capacity`` tokens.

    Parameters
    ----------
    max_cache_tokens : int | None
        K/V slots; None: as many as fit in 1 GiB (:func:`cache_capacity`).
    n_layers, n_kv_heads, head_dim, v_head_dim, dtype, device, layer_devices
        The model's K/V shapes and placement (:class:`~llamppl.lm.hf.kv_pool.KVPool`).

    Attributes
    ----------
    capacity : int
        The budget in tokens (``max_cache_tokens``).
    trie : TokenTrie
        Which tokens are cached.
    pool : KVPool
        Their K/V.
    """

    def __init__(
        self,
        max_cache_tokens: int | None,
        *,
        n_layers: int,
        n_kv_heads: int,
        head_dim: int,
        v_head_dim: int,
        dtype: torch.dtype,
        device: torch.device,
        layer_devices: Sequence[torch.device],
    ) -> None:
        per_token = slot_bytes(n_layers, n_kv_heads, head_dim, v_head_dim, dtype)
        self.capacity = cache_capacity(max_cache_tokens, per_token)
        self.trie = TokenTrie(self.capacity)
        self.pool = KVPool(
            n_layers,
            n_kv_heads,
            head_dim,
            self.capacity,
            dtype,
            device,
            v_head_dim=v_head_dim,
            layer_devices=layer_devices,
        )

    @property
    def bytes_per_token(self) -> int:
        """Bytes of K/V one cached token holds (all layers)."""
        return self.pool.bytes_per_slot

    def reserve(self, requests: Sequence[Request], n_new: int) -> bool:
        """Free ``n_new`` slots, evicting LRU leaves but never the nodes ``requests`` extend.

        Returns False, having evicted nothing, if that many cannot be freed.
        """
        trie = self.trie
        for r in requests:
            trie.lock(r.matched)
        try:
            return trie.make_room(n_new)
        finally:
            for r in requests:
                trie.unlock(r.matched)

    @contextmanager
    def insert(self, requests: Sequence[Request]) -> Iterator[list[list[TrieNode]]]:
        """Insert every request's suffix (call :meth:`reserve` first); yields the new paths.

        If the body raises, the new nodes are removed again (no node without K/V stays).
        """
        created: dict[TrieNode, None] = {}
        try:
            paths = []
            for r in requests:
                path = self.trie.insert(r.matched, r.suffix)
                created.update(dict.fromkeys(path))
                paths.append(path)
            yield paths
        except BaseException:
            for node in reversed(created):
                if node.alive and not node.children:
                    self.trie.remove(node)
            raise

    def serve_in_parts(
        self, contexts: Sequence[tuple[int, ...]], serve_part: Callable[[list[int]], bool]
    ) -> None:
        """Serve all ``contexts`` with ``serve_part(indices)``, halving a part that does not fit.

        ``serve_part`` returns False (having served nothing) when its part's new
        tokens cannot be given slots; a single context that does not fit raises ``ValueError``.
        """
        queue = [list(range(len(contexts)))]
        while queue:
            part = queue.pop(0)
            if not serve_part(part):
                if len(part) == 1:
                    raise ValueError(
                        f"max_cache_tokens={self.capacity} is too small for a context of "
                        f"{len(contexts[part[0]])} tokens; raise max_cache_tokens"
                    )
                half = len(part) // 2
                queue[:0] = [part[:half], part[half:]]

    def update_gauges(self, stats: CacheStats) -> None:
        """Copy the cache size, its peak and the eviction count into ``stats``."""
        n = len(self.trie)
        stats.cached_tokens = n
        if n > stats.peak_cached_tokens:
            stats.peak_cached_tokens = n
            stats.peak_cache_bytes = n * self.bytes_per_token
        stats.evictions = self.trie.evictions

    def clear(self) -> None:
        """Drop every cached token and release the pool down to its initial size."""
        self.trie.clear()
        self.pool.clear()
