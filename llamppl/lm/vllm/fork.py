"""The vLLM KV connector that lets a forked particle start from its ancestor's K/V.

Loaded by vLLM itself (``kv_transfer_config={"kv_connector": "ForkConnector",
"kv_connector_module_path": "llamppl.lm.vllm.fork", ...}``, which
:func:`llamppl.lm.vllm.load.build_engine` sets); never imported by llamppl's
own code, so it may import vLLM at the top. What it does, in vLLM's words:

- A new request whose ``SamplingParams.extra_args["kv_transfer_params"]`` holds
  ``{"fork_of": parent_request_id, "fork_tokens": n}`` was resampled from a
  live request whose first ``n`` tokens it shares and whose K/V for them is
  computed (:mod:`llamppl.lm.vllm.engine` sends such requests).
- Scheduler side: vLLM's prefix cache has already matched the ancestor's full
  blocks (they are shared, not copied). :meth:`ForkConnector.get_num_new_matched_tokens`
  reports the rest of the ``n`` tokens (at most one partial block) as loadable,
  so the scheduler neither recomputes them nor counts them as work; after
  allocation, :meth:`ForkConnector.update_state_after_alloc` pairs the parent's
  blocks with the child's fresh ones (:func:`~llamppl.lm.vllm.engine.fork_block_copies`).
- Worker side: before the forward that computes the child's first new token,
  :meth:`ForkConnector.start_load_kv` copies those blocks inside every layer's
  K/V tensor on its own device (one ``index_copy_`` per layer; the K/V never
  leaves the device, and with tensor parallelism each worker copies its shard).

Example of the engine argument (what ``build_engine`` passes to ``vllm.LLM``)::

    kv_transfer_config={"kv_connector": "ForkConnector", "kv_role": "kv_both",
                        "kv_connector_module_path": "llamppl.lm.vllm.fork"}
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1,
    KVConnectorMetadata,
    KVConnectorRole,
)

from .engine import FORK_OF, FORK_TOKENS, fork_block_copies

__all__ = ["ForkConnector", "ForkMetadata"]


@dataclass
class ForkMetadata(KVConnectorMetadata):
    """One step's block copies: ``copies[group] = [(src_block, dst_block), ...]``."""

    copies: dict[int, list[tuple[int, int]]] = field(default_factory=dict)


class ForkConnector(KVConnectorBase_V1):
    """Copies the partial blocks of a forked request's ancestor into the request's own blocks."""

    def __init__(self, vllm_config: Any, role: KVConnectorRole, kv_cache_config: Any) -> None:
        super().__init__(vllm_config, role, kv_cache_config)
        self._block_size = int(vllm_config.cache_config.block_size)
        self._pending: dict[str, tuple[str, int, int]] = {}  # child -> (parent, start, end)
        self._copies: dict[int, list[tuple[int, int]]] = {}
        self._layers: list[tuple[int, torch.Tensor, int]] = []  # (group, kv tensor, block dim)
        self._group_of = {
            name: g
            for g, group in enumerate(kv_cache_config.kv_cache_groups)
            for name in group.layer_names
        }
        self._num_blocks = int(kv_cache_config.num_blocks)

    @property
    def requires_kv_delivery(self) -> bool:
        return False  # nothing is handed off: a fork only reads its live parent's blocks

    # ------------------------------------------------------------------ scheduler side
    def get_num_new_matched_tokens(
        self, request: Any, num_computed_tokens: int
    ) -> tuple[int | None, bool]:
        params = request.kv_transfer_params or {}
        parent, n = params.get(FORK_OF), int(params.get(FORK_TOKENS, 0) or 0)
        if parent is None or self._kv_cache_manager is None:
            return 0, False
        # The request must compute at least its last token (its logits are the point).
        n = min(n, request.num_tokens - 1)
        try:
            parent_blocks = self._kv_cache_manager.get_block_ids(parent)
        except (KeyError, AssertionError):
            return 0, False  # the parent is gone: compute instead of loading
        have = min(len(b) for b in parent_blocks) * self._block_size if parent_blocks else 0
        n = min(n, have)
        if n <= num_computed_tokens:
            return 0, False
        self._pending[request.request_id] = (parent, num_computed_tokens, n)
        return n - num_computed_tokens, False

    def update_state_after_alloc(self, request: Any, blocks: Any, num_external_tokens: int) -> None:
        plan = self._pending.pop(request.request_id, None)
        if plan is None or num_external_tokens == 0:
            return
        parent, start, end = plan
        parent_blocks = self._kv_cache_manager.get_block_ids(parent)
        for g, (src, dst) in enumerate(zip(parent_blocks, blocks.get_block_ids())):
            pairs = fork_block_copies(src, dst, start, end, self._block_size)
            self._copies.setdefault(g, []).extend(pairs)

    def build_connector_meta(self, scheduler_output: Any) -> ForkMetadata:
        meta, self._copies = ForkMetadata(self._copies), {}
        return meta

    def request_finished(self, request: Any, block_ids: list[int]) -> tuple[bool, None]:
        self._pending.pop(request.request_id, None)
        return False, None

    # ------------------------------------------------------------------ worker side
    def register_kv_caches(self, kv_caches: dict[str, torch.Tensor]) -> None:
        self._layers = []
        for name, kv in kv_caches.items():
            dims = [d for d, size in enumerate(kv.shape) if size == self._num_blocks]
            if len(dims) != 1:
                raise RuntimeError(
                    f"cannot tell the block dimension of layer {name}'s K/V cache "
                    f"(shape {tuple(kv.shape)}, {self._num_blocks} blocks)"
                )
            self._layers.append((self._group_of.get(name, 0), kv, dims[0]))

    def start_load_kv(self, forward_context: Any, **kwargs: Any) -> None:
        meta = self._get_connector_metadata()
        if not isinstance(meta, ForkMetadata) or not meta.copies:
            return
        index: dict[tuple[int, torch.device], tuple[torch.Tensor, torch.Tensor]] = {}
        for group, kv, dim in self._layers:
            pairs = meta.copies.get(group)
            if not pairs:
                continue
            key = (group, kv.device)
            if key not in index:  # host -> device copies of the ids, once per group and device
                src = torch.tensor([s for s, _ in pairs], dtype=torch.long, device=kv.device)
                dst = torch.tensor([d for _, d in pairs], dtype=torch.long, device=kv.device)
                index[key] = (src, dst)
            src, dst = index[key]
            kv.index_copy_(dim, dst, kv.index_select(dim, src))

    def wait_for_layer_load(self, layer_name: str) -> None:
        return  # start_load_kv copies synchronously, before the forward

    def save_kv_layer(self, layer_name: str, kv_layer: Any, attn_metadata: Any, **kw: Any) -> None:
        return  # nothing is saved: the blocks stay where they are

    def wait_for_save(self) -> None:
        return
