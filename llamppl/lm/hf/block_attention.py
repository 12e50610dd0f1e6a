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
    """``fn(x)`` for ``x`` ``(n, h)``, computed on rows padded to :data:`ALIGN` columns."""
    n, h = x.shape
    pad = -h % ALIGN
    if pad:
        x = torch.cat([x, x.new_zeros(n, pad)], dim=1)
    return fn(x)[:, :h]


def merge(
    o: torch.Tensor, lse: torch.Tensor, o_j: torch.Tensor, lse_j: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Merge a partial result ``(o_j (n, H, D), lse_j (n, H))`` into ``(o, lse)`` (module docstring)."""
    m = torch.maximum(lse, lse_j)
    a = _aligned(torch.exp, lse - m)  # (n, H)
    b = _aligned(torch.exp, lse_j - m)
    s = a + b
    out = (o * a[..., None] + o_j * b[..., None]) / s[..., None]
    return out, m + _aligned(torch.log, s)


class KeyBlocks:
    """The attention calls of one forward's :class:`~llamppl.lm.hf.query_plan.BlockPlan`.

    ``tensors`` are its :meth:`~llamppl.lm.hf.query_plan.BlockPlan.index_lists` on the device:
    ``src`` ``(n,)``, the calls' queries, visible counts and slots, concatenated.
    """

    def __init__(
        self, pool: KVPool, plan: BlockPlan, tensors: list[torch.Tensor], split: int
    ) -> None:
        self.pool, self.split = pool, split
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
        """Each masked call's additive mask ``(count, 1, 1, S)``: 0 on a query's visible
        columns, ``dtype``'s minimum past them; None for a call of full blocks."""
        key = (device, dtype)
        if key not in self.masks:
            _, _, visible, _ = self.on(device)
            j = torch.arange(self.split, device=device)[None, :]  # (1, S)
            out: list[torch.Tensor | None] = []
            for c, _, (v0, v1), _ in self.calls:
                if not c.masked:
                    out.append(None)
                    continue
                seen = j < visible[v0:v1, None]  # (count, S)
                m = torch.zeros(seen.shape, dtype=dtype, device=device)
                out.append(m.masked_fill_(~seen, torch.finfo(dtype).min)[:, None, None, :])
            self.masks[key] = out
        return self.masks[key]

    def attend(self, layer: int, query: torch.Tensor, v_dim: int, scaling: float) -> torch.Tensor:
        """Every query's attention over its blocks: ``query`` ``(B, H, T, D_k)`` -> ``(B, T, H, D_v)``
        (zeros at the padding positions)."""
        B, H, T, Dk = query.shape
        pool, S, dev = self.pool, self.split, query.device
        Hkv = pool.n_kv_heads
        g = H // Hkv
        src, queries, _, slots = self.on(dev)
        masks = self.call_masks(dev, query.dtype)
        q_all = query.transpose(1, 2).reshape(B * T, H, Dk).index_select(0, src)  # (n, H, D_k)
        o = torch.zeros(self.n, H, v_dim, dtype=torch.float32, device=dev)  # (n, H, D_v)
        lse = torch.full((self.n, H), float("-inf"), dtype=torch.float32, device=dev)
        for (c, (q0, q1), _, (s0, s1)), mask in zip(self.calls, masks):
            idx = queries[q0:q1]  # (count,)
            count = q1 - q0
            q = q_all.index_select(0, idx).view(count, Hkv, g, Dk)  # query heads of a K/V head
            if c.shared and c.start >= 0:
                k = pool.k[layer][:, c.start : c.start + S]  # (H_kv, S, D_k), a view
                v = pool.v[layer][:, c.start : c.start + S]
            else:
                k, v = pool.read(layer, slots[s0:s1])  # (H_kv, S or count·S, D)
            if c.shared:
                k, v = k[None].expand(count, -1, -1, -1), v[None].expand(count, -1, -1, -1)
            else:
                k = k.view(Hkv, count, S, Dk).transpose(0, 1)  # (count, H_kv, S, D_k)
                v = v.view(Hkv, count, S, v_dim).transpose(0, 1)
            o_j, lse_j = _FLASH(q, k, v, 0.0, False, attn_mask=mask, scale=scaling)
            o_j = o_j.reshape(count, H, v_dim)  # (count, H_kv, g, D_v) -> (count, H, D_v)
            merged, l_new = merge(
                o.index_select(0, idx),
                lse.index_select(0, idx),
                o_j.float(),
                lse_j.reshape(count, H),
            )
            o.index_copy_(0, idx, merged)
            lse.index_copy_(0, idx, l_new)
        out = query.new_zeros(B * T, H, v_dim)  # padding positions stay 0
        out.index_copy_(0, src, o.to(out.dtype))
        return out.view(B, T, H, v_dim)
