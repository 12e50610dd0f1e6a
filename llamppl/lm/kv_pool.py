"""Per-token K/V slot pool shared by every context of a :class:`~llamppl.CachedCausalLM`.

The pool stores the keys and values of each cached token in a *slot*; the
:class:`~llamppl.lm.trie.TokenTrie` decides which slot belongs to which token.
All layers live in one tensor per K and V, ``(L, H_kv, slots + 1, D)``; the
extra last slot is scratch space for padding. A forward writes its new
tokens' K/V straight into their slots and reads each row's whole context
(prefix and new tokens) with one ``index_select`` per layer, so the prefix is
copied once per step. :class:`PoolCache` presents the pool to a Hugging Face
model as its ``past_key_values`` for one forward. The pool grows by doubling up to ``capacity`` slots, so a
large bound costs nothing until used::

    pool = KVPool(n_layers=30, n_kv_heads=3, head_dim=64, capacity=4096)
    pool.ensure(1)
    pool.write(0, torch.tensor([0, 1]), k_new, v_new)      # k_new: (H_kv, 2, D)
    k, v = pool.read(0, torch.tensor([0, 1, 1]))           # each (H_kv, 3, D)
"""

from __future__ import annotations

import torch
from transformers.cache_utils import Cache, DynamicCache, DynamicLayer

__all__ = ["KVPool", "PoolLayer", "PoolCache"]


class KVPool:
    """Slot-indexed K/V storage for all layers, ``(L, H_kv, N + 1, D)`` per K and V.

    Parameters
    ----------
    n_layers, n_kv_heads, head_dim : int
        Shape of the model's attention cache.
    capacity : int
        Maximum number of slots (plus one scratch slot, :attr:`scratch`).
    dtype, device
        Storage dtype and device (the model's).
    initial_slots : int
        Slots allocated up front; the pool doubles on demand.
    """

    def __init__(
        self,
        n_layers: int,
        n_kv_heads: int,
        head_dim: int,
        capacity: int,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str | None = None,
        initial_slots: int = 256,
    ) -> None:
        self.n_layers, self.n_kv_heads, self.head_dim = n_layers, n_kv_heads, head_dim
        self.capacity = capacity
        self.dtype = dtype
        self.device = torch.device(device) if device is not None else torch.device("cpu")
        self._initial = initial_slots
        self._allocate(max(1, min(capacity, initial_slots)))

    def _allocate(self, n: int) -> None:
        shape = (self.n_layers, self.n_kv_heads, n + 1, self.head_dim)
        self.k = torch.zeros(shape, dtype=self.dtype, device=self.device)  # (L, H_kv, N + 1, D)
        self.v = torch.zeros(shape, dtype=self.dtype, device=self.device)  # (L, H_kv, N + 1, D)

    @property
    def bytes_per_slot(self) -> int:
        """Bytes of K and V for one token across all layers."""
        elem = torch.empty((), dtype=self.dtype).element_size()
        return 2 * self.n_layers * self.n_kv_heads * self.head_dim * elem

    @property
    def allocated_slots(self) -> int:
        """Slots currently backed by memory (grows up to ``capacity``; scratch excluded)."""
        return self.k.shape[2] - 1

    @property
    def scratch(self) -> int:
        """Index of the scratch slot (padding reads and writes go there)."""
        return self.k.shape[2] - 1

    def ensure(self, max_slot: int) -> None:
        """Grow the storage (doubling) so that slot ``max_slot`` exists. Moves :attr:`scratch`."""
        n = self.allocated_slots
        if max_slot < n:
            return
        if max_slot >= self.capacity:
            raise IndexError(f"slot {max_slot} is outside the pool capacity {self.capacity}")
        new_n = min(self.capacity, max(2 * n, max_slot + 1))
        old_k, old_v = self.k, self.v
        self._allocate(new_n)
        self.k[:, :, :n].copy_(old_k[:, :, :n])
        self.v[:, :, :n].copy_(old_v[:, :, :n])

    def write(self, layer: int, slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """Store ``k``, ``v`` of shape ``(H_kv, n, D)`` of ``layer`` into ``slots`` (``(n,)`` long)."""
        self.k[layer].index_copy_(1, slots, k)
        self.v[layer].index_copy_(1, slots, v)

    def read(self, layer: int, slots: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """K and V of ``layer`` at ``slots`` (``(n,)`` long), each ``(H_kv, n, D)``."""
        return self.k[layer].index_select(1, slots), self.v[layer].index_select(1, slots)

    def clear(self) -> None:
        """Release the storage down to the initial size (contents are discarded)."""
        self._allocate(max(1, min(self.capacity, self._initial)))


# ---------------------------------------------------------------------- HF cache adapters
class PoolLayer(DynamicLayer):
    """One attention layer's view of the :class:`KVPool` during a forward.

    ``update`` receives the new tokens' K/V ``(B, H_kv, T, D)``, writes the real
    ones (not padding) into their pool slots, and returns every row's whole
    context ``(B, H_kv, P + T, D)`` read from the pool with one ``index_select``.
    """

    def __init__(
        self,
        pool: KVPool,
        layer: int,
        src: torch.Tensor,
        dst: torch.Tensor,
        read: torch.Tensor,
        width: int,
    ) -> None:
        super().__init__()
        self.pool, self.layer, self.width = pool, layer, width
        self.src, self.dst, self.read = src, dst, read  # (n,), (n,), (B * (P + T),)
        self.dtype, self.device = pool.dtype, pool.device
        self.is_initialized = True

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        b, h, t, d = key_states.shape  # (B, H_kv, T, D)
        k_new = (
            key_states.transpose(0, 1).reshape(h, b * t, d).index_select(1, self.src)
        )  # (H_kv, n, D)
        v_new = value_states.transpose(0, 1).reshape(h, b * t, d).index_select(1, self.src)
        self.pool.write(self.layer, self.dst, k_new, v_new)
        k, v = self.pool.read(self.layer, self.read)  # (H_kv, B * (P + T), D)
        self.keys = k.view(h, b, self.width, d).transpose(0, 1)  # (B, H_kv, P + T, D)
        self.values = v.view(h, b, self.width, d).transpose(0, 1)
        return self.keys, self.values


class PoolCache(DynamicCache):
    """A ``DynamicCache`` whose layers are :class:`PoolLayer` views of the pool."""

    def __init__(self, layers: list[PoolLayer]) -> None:
        Cache.__init__(self, layers=layers)
