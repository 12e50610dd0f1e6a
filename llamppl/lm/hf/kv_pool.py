"""Per-token K/V slot pool shared by every context of a :class:`~llamppl.CachedCausalLM`.

The pool stores the keys and values of each cached token in a *slot*; the
:class:`~llamppl.lm.trie.TokenTrie` decides which slot belongs to which token.
Each layer has one tensor for K and one for V, ``(H_kv, slots + 1, D)``, on
that layer's device (a model split by ``device_map`` keeps each layer's K/V
beside it); the extra last slot is scratch space for padding. A forward writes its new
tokens' K/V straight into their slots and reads each row's whole context
(prefix and new tokens) with one ``index_select`` per layer, so the prefix is
copied once per step. :class:`PoolCache` presents the pool to a Hugging Face
model as its cache (``cache=``, ``past_key_values=`` before transformers 5.24) for one forward. The pool grows by doubling up to ``capacity`` slots, so a
large bound costs nothing until used::

    pool = KVPool(n_layers=30, n_kv_heads=3, head_dim=64, capacity=4096)
    pool.ensure(1)
    pool.write(0, torch.tensor([0, 1]), k_new, v_new)      # k_new: (H_kv, 2, D)
    k, v = pool.read(0, torch.tensor([0, 1, 1]))           # each (H_kv, 3, D)
"""

from __future__ import annotations

import torch
from transformers.cache_utils import Cache, DynamicCache, DynamicLayer

__all__ = ["KVPool", "PoolLayer", "PoolCache", "slot_bytes"]


def slot_bytes(
    n_layers: int, n_kv_heads: int, head_dim: int, v_head_dim: int, dtype: torch.dtype
) -> int:
    """Bytes of K and V for one token across all layers."""
    elem = torch.empty((), dtype=dtype).element_size()
    return n_layers * n_kv_heads * (head_dim + v_head_dim) * elem


class KVPool:
    """Slot-indexed K/V storage, one ``(H_kv, N + 1, D)`` tensor per layer for K and for V.

    Parameters
    ----------
    n_layers, n_kv_heads, head_dim : int
        Shape of the model's attention cache (``head_dim`` of the keys).
    capacity : int
        Maximum number of slots (plus one scratch slot, :attr:`scratch`).
    dtype, device
        Storage dtype and device (the model's).
    initial_slots : int
        Slots allocated up front; the pool doubles on demand.
    v_head_dim : int | None
        Width of the values when it differs from the keys' (multi-head latent attention).
    layer_devices : sequence of devices | None
        Per-layer devices for a model split across devices (``device_map``); default ``device``.
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
        v_head_dim: int | None = None,
        layer_devices: list[torch.device] | tuple[torch.device, ...] | None = None,
    ) -> None:
        self.n_layers, self.n_kv_heads, self.head_dim = n_layers, n_kv_heads, head_dim
        self.v_head_dim = head_dim if v_head_dim is None else v_head_dim
        self.capacity = capacity
        self.dtype = dtype
        self.device = torch.device(device) if device is not None else torch.device("cpu")
        self.layer_devices = (
            tuple(torch.device(d) for d in layer_devices)
            if layer_devices is not None
            else (self.device,) * n_layers
        )
        self._initial = initial_slots
        self._allocate(max(1, min(capacity, initial_slots)))

    def _allocate(self, n: int) -> None:
        h = self.n_kv_heads
        self.k = [
            torch.zeros((h, n + 1, self.head_dim), dtype=self.dtype, device=d)
            for d in self.layer_devices
        ]  # per layer (H_kv, N + 1, D_k)
        self.v = [
            torch.zeros((h, n + 1, self.v_head_dim), dtype=self.dtype, device=d)
            for d in self.layer_devices
        ]  # per layer (H_kv, N + 1, D_v)

    @property
    def bytes_per_slot(self) -> int:
        """Bytes of K and V for one token across all layers (:func:`slot_bytes`)."""
        return slot_bytes(
            self.n_layers, self.n_kv_heads, self.head_dim, self.v_head_dim, self.dtype
        )

    @property
    def allocated_slots(self) -> int:
        """Slots currently backed by memory (grows up to ``capacity``; scratch excluded)."""
        return self.k[0].shape[1] - 1

    @property
    def scratch(self) -> int:
        """Index of the scratch slot (padding reads and writes go there)."""
        return self.k[0].shape[1] - 1

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
        for new, old in zip(self.k + self.v, old_k + old_v):
            new[:, :n].copy_(old[:, :n])

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
        prefix: int = 0,
    ) -> None:
        super().__init__()
        self.pool, self.layer, self.width, self.prefix = pool, layer, width, prefix
        self.src, self.dst, self.read = src, dst, read  # (n,), (n,), (B * (P + T),)
        self.dtype, self.device = pool.dtype, pool.layer_devices[layer]
        self.is_initialized = True

    def get_seq_length(self, *args, **kwargs) -> int:
        """Keys already cached before this forward's tokens (the ``P`` prefix columns)."""
        return self.prefix

    def write_new(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        """Write the real new tokens' K/V ``(B, H_kv, T, D)`` (not padding) into their slots."""
        b, h, t, d = key_states.shape
        k_new = key_states.transpose(0, 1).reshape(h, b * t, d).index_select(1, self.src)
        v_new = value_states.transpose(0, 1).reshape(h, b * t, -1).index_select(1, self.src)
        self.pool.write(self.layer, self.dst, k_new, v_new)  # (H_kv, n, D) into their slots

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        b, h = key_states.shape[:2]  # (B, H_kv, T, D)
        self.write_new(key_states, value_states)
        k, v = self.pool.read(self.layer, self.read)  # (H_kv, B * (P + T), D)
        self.keys = k.view(h, b, self.width, -1).transpose(0, 1)  # (B, H_kv, P + T, D_k)
        self.values = v.view(h, b, self.width, -1).transpose(0, 1)  # (B, H_kv, P + T, D_v)
        return self.keys, self.values


class PoolCache(DynamicCache):
    """A ``DynamicCache`` whose layers are :class:`PoolLayer` views of the pool."""

    def __init__(self, layers: list[PoolLayer]) -> None:
        Cache.__init__(self, layers=layers)
