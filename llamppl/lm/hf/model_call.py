"""One call of a Hugging Face base model over planned rows, its K/V read and written through the pool.

What both forward layouts of :class:`~llamppl.CachedCausalLM` share
(:mod:`llamppl.lm.hf.per_row_forward`, :mod:`llamppl.lm.hf.per_query_forward`): the wrapped
model's parts, the ONE host-to-device upload of a forward's index data, the row masks, the
base model's forward with a :class:`~llamppl.lm.hf.kv_pool.PoolCache` standing in for its
cache, and keeping each new node's final hidden state::

    mc = ModelCall(base, config, arch, pool, device, dtype, additive=False, stats=stats)
    ids_t, pos_t, ... = mc.upload(plan.ids, plan.pos, ...)
    out = mc.run(ids_t.view(B, T), mc.masks(...), pos_t.view(B, T), layers)
    keep_hidden(out.last_hidden_state, src_t, nodes)
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import torch

from ..trie import TrieNode
from .arch import Architecture
from .kv_pool import KVPool, PoolCache
from .tree_mask import layer_masks, tree_mask
from .trie_cache import CacheStats

__all__ = ["ModelCall", "keep_hidden"]


@dataclass
class ModelCall:
    """The parts of a :class:`~llamppl.CachedCausalLM` a forward layout runs the model with.

    ``base`` is the HF base model (decoder without head), ``config`` its text config, ``arch``
    what :mod:`llamppl.lm.hf.arch` read, ``additive`` whether attention is ``eager`` (float
    masks); ``stats`` counts uploads.
    """

    base: Any
    config: Any
    arch: Architecture
    pool: KVPool
    device: torch.device
    dtype: torch.dtype
    additive: bool
    stats: CacheStats

    def upload(self, *parts: list[int]) -> list[torch.Tensor]:
        """Send integer lists to the device in one host-to-device copy; views of it, one per list."""
        flat = [x for part in parts for x in part]
        self.stats.uploads += 1
        data = torch.tensor(flat, dtype=torch.long).to(self.device, non_blocking=True)
        return list(torch.split(data, [len(part) for part in parts]))

    def masks(
        self,
        T: int,
        P: int,
        t_t: torch.Tensor,
        p_t: torch.Tensor,
        trees: list[tuple[int, int]],
        anc_t: torch.Tensor,
        pos_t: torch.Tensor,
    ) -> torch.Tensor | dict[str, torch.Tensor]:
        """The rows' tree mask as each layer needs it (:mod:`llamppl.lm.hf.tree_mask`)."""
        mask = tree_mask(T, P, t_t, p_t, trees, anc_t)  # (B, T, P+T)
        return layer_masks(mask, pos_t, p_t, P, self.arch, self.additive, self.dtype)

    def run(
        self,
        ids_t: torch.Tensor,
        attention_mask: Any,
        pos_t: torch.Tensor,
        layers: list,
    ) -> Any:
        """The base model's forward over the rows ``(B, T)``, its K/V read and written through
        ``layers`` (one :class:`~llamppl.lm.hf.kv_pool.PoolLayer` per attention layer)."""
        return self.base(
            input_ids=ids_t,
            attention_mask=attention_mask,
            position_ids=pos_t,
            use_cache=True,
            **{self.arch.cache_keyword: PoolCache(layers)},
        )


def keep_hidden(hidden: torch.Tensor, src_t: torch.Tensor, nodes: Iterable[TrieNode]) -> None:
    """Keep each new node's final hidden state on it: row ``src_t[k]`` of ``hidden``
    ``(B, T, D)`` flattened is node ``k``'s (what :meth:`CachedCausalLM.next_token_hidden`
    reads and the LM head turns into log-probs)."""
    flat = hidden.reshape(-1, hidden.shape[-1]).index_select(0, src_t.to(hidden.device))
    for node, h in zip(nodes, flat):
        node.hidden = h
