"""Attention over a prefix every row of a forward shares, read once per layer instead of once per row.

In an SMC step the N rows of one batched forward usually extend the same
cached prompt (their bases' common trie path, ``S`` tokens). The per-row
layout of :mod:`llamppl.lm.hf.batch_plan` copies those ``S`` keys and values into
every row; here they stay in the :class:`~llamppl.lm.hf.kv_pool.KVPool` (a view
when their slots are contiguous, else ONE ``index_select``) and each row
gathers only its own keys past the prefix. :func:`prefix_attention` attends
every row's queries to both parts and merges them exactly with the
log-sum-exp rule (the online-softmax merge of Milakov & Gimelshein 2018,
FlashAttention's eq. in Dao et al. 2022 §3.1): with ``s_p = q·K_pᵀ·scale`` over
the shared prefix and ``s_r`` over the row's own keys,

    m = max(max s_p, max s_r),  l_x = Σ exp(s_x - m),
    out = (exp(s_p - m) V_p + exp(s_r - m) V_r) / (l_p + l_r),

which is ``softmax([s_p, s_r]) [V_p; V_r]``, the attention over the whole row; it is
computed as one softmax over the joined scores, then two products.

The cached forward registers :func:`shared_prefix_attention` in transformers'
``AttentionInterface`` as :data:`ATTENTION_NAME` and switches the model's
``config._attn_implementation`` to it for that forward only
(:func:`sharing_prefix`); each layer's :class:`PrefixPoolLayer` hands the
function its prefix K/V through a :class:`PrefixState`. The path applies to
``sdpa`` models without sliding windows (:func:`prefix_eligible`); a call
carrying anything else that changes the scores (soft-capping, sinks, a
position bias) materialises the rows and runs the model's own ``sdpa``, and a
model whose layers never call the function is detected afterwards
(``state.consumed``) so the caller can rerun the forward the per-row way::

    state = PrefixState()
    layers = [PrefixPoolLayer(pool, l, src, dst, read, width, state, prefix_kv=(start, S))
              for l in range(pool.n_layers)]
    with sharing_prefix(model.config, state):
        model.base_model(..., cache=PoolCache(layers))  # or past_key_values= before 5.24
    ok = state.consumed == pool.n_layers and not state.missed
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

import torch
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

from .arch import Architecture
from .kv_pool import KVPool, PoolLayer

__all__ = [
    "ATTENTION_NAME",
    "PrefixPoolLayer",
    "PrefixState",
    "pool_layers",
    "prefix_attention",
    "prefix_eligible",
    "routed_attention",
    "shared_prefix_attention",
    "sharing_prefix",
]

ATTENTION_NAME = "llamppl_shared_prefix"
#: keyword arguments of an attention call that do not change the scores (None/False/0 values aside)
NEUTRAL_KWARGS = frozenset(
    {"dropout", "scaling", "position_ids", "use_cache", "output_router_logits", "cache_position"}
)
#: above this many prefix scores (heads x queries x prefix keys) the rows are materialised instead
MAX_PREFIX_SCORES = 1 << 26


class PrefixState:
    """What the layers of one prefix-sharing forward pass to the attention function.

    ``pending`` holds the current layer's prefix ``(K, V)``, each ``(H_kv, S, D)``, and
    the rows ``(K, V)`` its cache update returned, until its attention call takes them;
    ``consumed`` counts the layers whose attention did; ``missed`` counts attention
    calls that found nothing pending or K/V other than the update's (a model that
    transforms the cached K/V, e.g. expands latents), and updates that found the
    previous layer's prefix unused. Any miss voids the forward.
    """

    def __init__(self) -> None:
        self.pending: tuple[torch.Tensor, ...] | None = None
        self.consumed = 0
        self.missed = 0


ACTIVE: ContextVar[PrefixState | None] = ContextVar("llamppl_prefix_state", default=None)


def prefix_eligible(arch: Architecture, attn_implementation: str) -> bool:
    """Whether :func:`prefix_attention` reproduces the model's attention: ``sdpa``, no windows."""
    return attn_implementation == "sdpa" and all(w is None for w in arch.windows)


class PrefixPoolLayer(PoolLayer):
    """A :class:`~llamppl.lm.hf.kv_pool.PoolLayer` whose rows hold only their keys past the shared prefix.

    ``prefix_kv`` is ``(start, S)`` when the prefix's slots are ``start, ..., start + S - 1``
    (its K/V are a view of the pool), or a ``(S,)`` long tensor of its slots (read once).
    """

    def __init__(
        self,
        pool: KVPool,
        layer: int,
        src: torch.Tensor,
        dst: torch.Tensor,
        read: torch.Tensor,
        width: int,
        state: PrefixState,
        prefix_kv: tuple[int, int] | torch.Tensor,
        prefix: int = 0,
    ) -> None:
        super().__init__(pool, layer, src, dst, read, width, prefix)
        self.state, self.prefix_kv = state, prefix_kv

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        keys, values = super().update(key_states, value_states, *args, **kwargs)
        if self.state.pending is not None:
            self.state.missed += 1  # the previous layer's attention never took its prefix
        if isinstance(self.prefix_kv, torch.Tensor):
            k_pre, v_pre = self.pool.read(self.layer, self.prefix_kv)  # (H_kv, S, D) once
        else:
            start, n = self.prefix_kv
            k_pre = self.pool.k[self.layer][:, start : start + n]  # (H_kv, S, D_k), a view
            v_pre = self.pool.v[self.layer][:, start : start + n]
        self.state.pending = (k_pre, v_pre, keys, values)
        return keys, values  # (B, H_kv, P' + T, D): the rows past the prefix


def pool_layers(
    pool: KVPool,
    device: torch.device,
    index: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
    width: int,
    prefix: int,
    state: PrefixState | None = None,
    prefix_kv: tuple[int, int] | torch.Tensor | None = None,
) -> list[PoolLayer]:
    """The cache layers of one forward: :class:`PrefixPoolLayer` given a ``state``, else ``PoolLayer``.

    ``index`` is ``(src, dst, read)`` on ``device``; a model split across devices gets a
    copy per extra device (as does a ``prefix_kv`` tensor of slots).
    """
    local = {device: (*index, prefix_kv)}
    for d in {d for d in pool.layer_devices if d != device}:  # a split model: indices per device
        at = prefix_kv.to(d) if isinstance(prefix_kv, torch.Tensor) else prefix_kv
        local[d] = (*(x.to(d) for x in index), at)
    layers: list[PoolLayer] = []
    for layer in range(pool.n_layers):
        src, dst, read, at = local[pool.layer_devices[layer]]
        if state is None:
            layers.append(PoolLayer(pool, layer, src, dst, read, width, prefix))
        else:
            layers.append(PrefixPoolLayer(pool, layer, src, dst, read, width, state, at, prefix))
    return layers


@contextmanager
def routed_attention(config: Any, name: str, active: ContextVar, state: Any) -> Iterator[Any]:
    """Run ``config``'s model with attention implementation ``name`` and ``active`` set to
    ``state`` for the block, then restore both (the forward's layers find ``state`` there)."""
    before = config._attn_implementation
    token = active.set(state)
    config._attn_implementation = name
    try:
        yield state
    finally:
        config._attn_implementation = before
        active.reset(token)


@contextmanager
def sharing_prefix(config: Any, state: PrefixState | None) -> Iterator[PrefixState | None]:
    """Route ``config``'s model through :func:`shared_prefix_attention` with ``state``, then
    restore; a no-op for ``state=None``."""
    if state is None:
        yield state
        return
    with routed_attention(config, ATTENTION_NAME, ACTIVE, state):
        yield state


def prefix_attention(
    query: torch.Tensor,
    k_pre: torch.Tensor,
    v_pre: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    mask: torch.Tensor | None,
    scaling: float,
) -> torch.Tensor:
    """``softmax([q K_preᵀ, q Kᵀ + mask] · scale) [V_pre; V]`` without copying the prefix per row.

    Shapes: ``query`` (B, H, T, D_k); ``k_pre``/``v_pre`` (H_kv, S, D) shared by all rows;
    ``key``/``value`` (B, H_kv, L, D) each row's own; ``mask`` (B, 1, T, L), bool (True =
    attend) or additive float. Returns (B, T, H, D_v), the layout of transformers'
    attention functions. The scores of a row's two parts are joined (they are
    ``D/(H/H_kv)`` times smaller than the K/V a per-row copy would move) and
    normalised by one float32 softmax, the merge of the module docstring; the
    products run in the inputs' dtype.
    """
    B, H, T, Dk = query.shape
    Hkv, S, Dv = v_pre.shape
    L, g = key.shape[2], H // Hkv
    q = (query * scaling).reshape(B, Hkv, g * T, Dk)  # head kv*g + j uses K/V head kv (repeat_kv)
    q_pre = q.transpose(0, 1).reshape(Hkv, B * g * T, Dk)  # (H_kv, M, D_k), M = B·g·T
    s_pre = torch.matmul(q_pre, k_pre.transpose(1, 2)).view(Hkv, B, g * T, S)  # one K_pre for all
    s_row = torch.matmul(q, key.transpose(2, 3)).transpose(0, 1)  # (H_kv, B, g·T, L)
    if mask is not None:
        m = mask[..., :L][:, 0, None].expand(B, g, T, L).reshape(B, g * T, L)
        if m.dtype == torch.bool:
            s_row = s_row.masked_fill(~m, torch.finfo(s_row.dtype).min)
        else:
            s_row = (s_row + m).to(s_pre.dtype)
    s = torch.cat([s_pre, s_row], dim=-1)  # (H_kv, B, g·T, S + L): the whole row's scores
    p = torch.softmax(s, dim=-1, dtype=torch.float32).to(v_pre.dtype)
    out = torch.matmul(p[..., :S].reshape(Hkv, B * g * T, S), v_pre).view(Hkv, B, g * T, Dv)
    out = out + torch.matmul(p[..., S:].transpose(0, 1), value).transpose(0, 1)
    return out.view(Hkv, B, g, T, Dv).permute(1, 3, 0, 2, 4).reshape(B, T, H, Dv)


def materialised(
    k_pre: torch.Tensor, v_pre: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Whole rows ``[prefix; own keys]`` (B, H_kv, S + L, D) and their mask: the per-row layout."""
    B, S, L = key.shape[0], k_pre.shape[1], key.shape[2]
    k = torch.cat([k_pre[None].expand(B, -1, -1, -1), key], dim=2)
    v = torch.cat([v_pre[None].expand(B, -1, -1, -1), value], dim=2)
    if mask is None:
        return k, v, None
    mask = mask[..., :L]
    seen = torch.ones if mask.dtype == torch.bool else torch.zeros
    head = seen((*mask.shape[:-1], S), dtype=mask.dtype, device=mask.device)
    return k, v, torch.cat([head, mask], dim=-1)


def same(a: torch.Tensor, b: torch.Tensor) -> bool:
    """``a`` is the tensor ``b`` (same storage start and shape; host metadata only)."""
    return a.shape == b.shape and a.data_ptr() == b.data_ptr()


def is_unset(value: Any) -> bool:
    """None, False or zero: a keyword that leaves the attention scores alone."""
    return value is None or (isinstance(value, (bool, int, float)) and not value)


def shared_prefix_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """transformers attention function (registered as :data:`ATTENTION_NAME`).

    With a prefix pending in the active :class:`PrefixState`: :func:`prefix_attention`,
    or the model's ``sdpa`` on materialised rows when a keyword changes the scores or the
    prefix scores would be too large. Otherwise (no state, nothing pending): plain ``sdpa``.
    """
    state = ACTIVE.get()
    pending = None if state is None else state.pending
    if pending is None:
        if state is not None:
            state.missed += 1
        return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)
    state.pending = None
    k_pre, v_pre, keys, values = pending
    if not (same(key, keys) and same(value, values)):  # not the pool's K/V: void the forward
        state.missed += 1
        return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)
    state.consumed += 1
    plain = all(k in NEUTRAL_KWARGS or is_unset(v) for k, v in kwargs.items())
    plain = plain and is_unset(kwargs.get("dropout"))
    scores = query.shape[0] * query.shape[1] * query.shape[2] * k_pre.shape[1]
    if not plain or scores > MAX_PREFIX_SCORES or query.shape[1] % k_pre.shape[0]:
        k, v, mask = materialised(k_pre, v_pre, key, value, attention_mask)
        return sdpa_attention_forward(module, query, k, v, mask, **kwargs)
    scaling = kwargs.get("scaling")
    if scaling is None:
        scaling = query.shape[-1] ** -0.5
    return prefix_attention(query, k_pre, v_pre, key, value, attention_mask, scaling), None


AttentionInterface.register(ATTENTION_NAME, shared_prefix_attention)
# another thread's forward of the same model during ours builds sdpa's masks and runs plain sdpa
AttentionMaskInterface.register(ATTENTION_NAME, sdpa_mask)
