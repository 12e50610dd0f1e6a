"""Attention over fixed absolute key blocks, merged in block order: the key-block layout.

:func:`~llamppl.lm.hf.query_plan.plan_blocks` cuts every query's keys at the absolute
positions ``0, S, 2S, ...`` (``S`` = :data:`~llamppl.lm.hf.query_plan.KEY_SPLIT`) and groups
the (query, block) pairs into calls. For each call, :meth:`KeyBlocks.attend` runs the CPU
flash-attention kernel (``aten::_scaled_dot_product_flash_attention_for_cpu``) on
``(count, H_kv, g, D)`` queries — the ``g = H / H_kv`` query heads of one K/V head as its
``g`` rows, so grouped-query attention needs no copy of the keys — against the block's
``(H_kv, S, D)`` keys, read once when the call's queries share them (a view of the pool,
expanded over the queries with stride 0) or gathered per query. The kernel returns each
query's partial output ``o_j`` and log-sum-exp ``l_j`` over the block; a query's blocks are
merged in block order with the log-sum-exp rule (Milakov & Gimelshein 2018; FlashAttention,
Dao et al. 2022 §3.1)::

    m = max(l, l_j),   a = exp(l - m),   b = exp(l_j - m)
    o <- (a o + b o_j) / (a + b),   l <- m + log(a + b)

starting from ``l = -inf`` (the first block is then taken exactly: ``a = 0``, ``b = 1``).

Why the bits are the query's own. The kernel computes every batch entry alone, with shapes
fixed by the call (``g`` rows, ``S`` keys, a mask or none): a query's partial over a block
is the same in any call, whether its keys are a view or a gathered copy (measured, AVX-512
and forced AVX2). The merge is elementwise in a fixed order. Elementwise kernels in ATen run
the vector path on full vectors and a scalar path on the remainder of a tensor, and the two
``exp`` / ``log`` implementations may round differently; so the merge applies them to rows
padded to :data:`ALIGN` columns, where every element takes the vector path whatever the
number of queries. Masked columns add ``exp(-huge) = 0`` exactly, so what they hold (the
next tokens of a prompt, the scratch slot; any finite K/V) changes nothing.
"""

from __future__ import annotations

from typing import Any

import torch

from .kv_pool import KVPool
from .query_plan import BlockPlan

__all__ = ["ALIGN", "KeyBlocks", "merge"]

#: elementwise ``exp``/``log`` run on rows padded to a multiple of this many columns (a
#: multiple of two vectors of float32 up to 2048-bit vectors), so no element takes ATen's
#: scalar remainder path
ALIGN = 128

_FLASH = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu


def _aligned(fn: Any, x: torch.Tensor) -> torch.Tensor:
    """``fn(x)`` for ``x`` ``(..., h)``, computed on rows padded to :data:`ALIGN` columns."""
    pad = -x.shape[-1] % ALIGN
    if pad:
        x = torch.cat([x, x.new_zeros(*x.shape[:-1], pad)], dim=-1)
    return fn(x)[..., : x.shape[-1] - pad]


def merge(outs: torch.Tensor, lses: torch.Tensor) -> torch.Tensor:
    """Each query's attention from its blocks' partial results, in block order.

    ``outs`` ``(steps, n, H, D)`` and ``lses`` ``(steps, n, H)`` float32: block ``s`` of query
    ``i`` (``lse = -inf`` and ``out = 0`` where a query has fewer blocks). With
    ``m = max_s lse_s`` and ``w_s = exp(lse_s - m)``, returns ``sum_s w_s out_s / sum_s w_s``
    ``(n, H, D)``, the sums taken in block order (a missing block adds an exact zero).
    """
    m = lses.amax(dim=0)  # (n, H)
    w = _aligned(torch.exp, lses - m)  # (steps, n, H)
    num, den = outs[0] * w[0, ..., None], w[0]
    for s in range(1, outs.shape[0]):
        num = num + outs[s] * w[s, ..., None]
        den = den + w[s]
    return num / den[..., None]


class KeyBlocks:
    """The attention calls of one forward's :class:`~llamppl.lm.hf.query_plan.BlockPlan`.

    ``tensors`` are its :meth:`~llamppl.lm.hf.query_plan.BlockPlan.index_lists` on the device:
    ``src`` ``(n,)``, the calls' queries, visible counts and slots, concatenated.
    """

    def __init__(self, pool: KVPool, plan: BlockPlan, tensors: list[torch.Tensor]) -> None:
        self.pool, self.steps = pool, plan.steps
        self.n = len(plan.src)
        self.calls = []  # (call, query slice, visible slice, slot slice)
        at_q = at_v = at_s = 0
        for c in plan.calls:
            q, v, s = len(c.queries), len(c.visible), len(c.slots)
            self.calls.append((c, (at_q, at_q + q), (at_v, at_v + v), (at_s, at_s + s)))
            at_q, at_v, at_s = at_q + q, at_v + v, at_s + s
        self.index = {tensors[0].device: tensors}
        self.masks: dict[tuple[torch.device, torch.dtype], list[torch.Tensor | None]] = {}

    def on(self, device: torch.device) -> list[torch.Tensor]:
        """The index tensors on ``device`` (a model split across devices: one copy per device)."""
        if device not in self.index:
            self.index[device] = [x.to(device) for x in next(iter(self.index.values()))]
        return self.index[device]

    def call_masks(self, device: torch.device, dtype: torch.dtype) -> list[torch.Tensor | None]:
        """Each masked call's additive mask ``(count, 1, 1, width)``: 0 on a query's visible
        columns, ``dtype``'s minimum past them; None for a call of full blocks."""
        key = (device, dtype)
        if key not in self.masks:
            _, _, visible, _ = self.on(device)
            out: list[torch.Tensor | None] = []
            for c, _, (v0, v1), _ in self.calls:
                if not c.masked:
                    out.append(None)
                    continue
                j = torch.arange(c.width, device=device)[None, :]  # (1, width)
                seen = j < visible[v0:v1, None]  # (count, width)
                m = torch.zeros(seen.shape, dtype=dtype, device=device)
                out.append(m.masked_fill_(~seen, torch.finfo(dtype).min)[:, None, None, :])
            self.masks[key] = out
        return self.masks[key]

    def attend(self, layer: int, query: torch.Tensor, v_dim: int, scaling: float) -> torch.Tensor:
        """Every query's attention over its blocks: ``query`` ``(B, H, T, D_k)`` -> ``(B, T, H, D_v)``
        (zeros at the padding positions)."""
        B, H, T, Dk = query.shape
        pool, dev = self.pool, query.device
        Hkv = pool.n_kv_heads
        g = H // Hkv
        src, queries, _, slots = self.on(dev)
        masks = self.call_masks(dev, query.dtype)
        q_all = query.transpose(1, 2).reshape(B * T, H, Dk).index_select(0, src)  # (n, H, D_k)
        outs = torch.zeros(self.steps, self.n, H, v_dim, dtype=torch.float32, device=dev)
        lses = torch.full((self.steps, self.n, H), float("-inf"), dtype=torch.float32, device=dev)
        for (c, (q0, q1), _, (s0, s1)), mask in zip(self.calls, masks):
            idx, count, W = queries[q0:q1], q1 - q0, c.width  # (count,)
            q = q_all.index_select(0, idx).view(count, Hkv, g, Dk)  # query heads of a K/V head
            if c.shared and c.start >= 0:
                k = pool.k[layer][:, c.start : c.start + W]  # (H_kv, W, D_k), a view
                v = pool.v[layer][:, c.start : c.start + W]
            else:
                k, v = pool.read(layer, slots[s0:s1])  # (H_kv, W or count·W, D)
            if c.shared:
                k, v = k[None].expand(count, -1, -1, -1), v[None].expand(count, -1, -1, -1)
            else:
                k = k.view(Hkv, count, W, Dk).transpose(0, 1)  # (count, H_kv, W, D_k)
                v = v.view(Hkv, count, W, v_dim).transpose(0, 1)
            o_j, lse_j = _FLASH(q, k, v, 0.0, False, attn_mask=mask, scale=scaling)
            outs[c.step].index_copy_(0, idx, o_j.reshape(count, H, v_dim).float())
            lses[c.step].index_copy_(0, idx, lse_j.reshape(count, H).float())
        out = query.new_zeros(B * T, H, v_dim)  # padding positions stay 0
        out.index_copy_(0, src, merge(outs, lses).to(out.dtype))
        return out.view(B, T, H, v_dim)
