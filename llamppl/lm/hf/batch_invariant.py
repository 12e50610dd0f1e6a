"""A batch-invariant forward: a context's log-probs do not depend on what else is in the batch.

A batched forward of :class:`~llamppl.CachedCausalLM` mixes the contexts of every particle
(of every job, under :func:`~llamppl.distributed.run_many`). On a CPU its floating-point
bits then depend on the company a context keeps in three ways: a linear layer's matrix
product rounds a row differently for different numbers of rows ``M`` (MKL: ``M = 1``,
``M in {2, 3}`` and ``M >= 4`` give three results), an attention row padded to another
row's length reduces in another order, and the shared-prefix merge
(:mod:`llamppl.lm.hf.prefix_attention`) splits a row's softmax where the batch's common
prefix ends. This mode removes all three, so every hidden state is a function of its
context alone:

- **Linear layers** run on at least :data:`~llamppl.lm.hf.batch_plan.MIN_GEMM_ROWS` token
  rows (:func:`~llamppl.lm.hf.batch_plan.pad_rows` adds empty rows to a smaller forward;
  the LM head pads the same way). Above that the per-row result is the same for every M.
- **Attention** is computed per query over its own keys: the query of a token at
  position ``t`` reads the ``t + 1`` keys of its context from the
  :class:`~llamppl.lm.hf.kv_pool.KVPool`, in position order from 0, end padded to
  :func:`~llamppl.lm.hf.batch_plan.key_width` columns (a multiple of 8) with masked
  slots. Queries of the same width are one call of the model's own attention function
  (``sdpa`` or ``eager``) with one query each, so a query's call has the same shape,
  the same key order and the same masked tail whichever rows, row lengths or tree
  groups the forward holds; a batch entry's result does not depend on the batch size.
- **No shared-prefix merge**: the prefix is read per query (it is part of its key list).
- **One thread for attention.** With several intra-op threads, CPU attention kernels split a
  small batch's work across threads differently for different batch sizes (measured,
  torch 2.13: ``sdpa`` and ``matmul`` attention at 2 threads give a query other bits beside
  other queries), so on a CPU the per-query calls run on one thread
  (:func:`one_thread`); the linear layers keep every thread (their rows were measured
  invariant at 1 and 2 threads).

Not covered: mixture-of-experts layers run each expert's product on the tokens routed to it,
so their bits still depend on the batch (the log-probs stay exact). On a GPU the layout is
the same (batched gathers and calls, no per-row host sync), but the row threshold and the
kernels' invariance are those measured on this CPU; a GPU's (split-K products,
split-KV decoding) are not measured here.

The K/V cache, the trie and the work counts are those of the per-row forward; every new
token still runs once. Index data still goes to the device in one upload; the buckets'
shapes are host-side. The attention function is registered in transformers'
``AttentionInterface`` as :data:`ATTENTION_NAME` and switched on for one forward
(:func:`per_query`), as the shared-prefix path is::

    qp = plan_queries(nodes, plan.src, scratch=pool.scratch)
    state = QueryState(pool, qp.buckets, q_src, n_keys, slots, arch.windows, additive=False)
    layers = [QueryPoolLayer(pool, l, src, dst, width, state) for l in range(pool.n_layers)]
    with per_query(model.config, state):
        model.base_model(..., cache=PoolCache(layers))
    ok = state.consumed == pool.n_layers and not state.missed

Measured cost: ``benchmarks/reports/throughput.md`` ("batch-invariant").
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

import torch
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

from .kv_pool import KVPool, PoolLayer
from .prefix_attention import routed_attention

__all__ = [
    "ATTENTION_NAME",
    "QueryPoolLayer",
    "QueryState",
    "one_thread",
    "per_query",
    "per_query_attention",
]

ATTENTION_NAME = "llamppl_per_query"


class QueryState:
    """What the layers of one batch-invariant forward pass to the attention function.

    Parameters
    ----------
    pool : KVPool
        The K/V pool the queries read.
    buckets : sequence of (count, width)
        The query buckets of a :class:`~llamppl.lm.hf.batch_plan.QueryPlan`.
    q_src, n_keys, slots : torch.Tensor
        Its index lists on the device: ``(n,)`` flat query index, ``(n,)`` keys seen,
        ``(sum count x width,)`` key slots.
    windows : sequence of int | None
        Per-layer sliding windows (None: full attention).
    additive : bool
        Eager attention (the model's own ``eager_attention_forward``, an additive float
        mask) instead of ``sdpa`` (a boolean mask).

    ``pending`` is the layer whose K/V were just written, until its attention call takes
    it; ``consumed`` counts the layers that did, ``missed`` the calls that found no layer
    pending or a layer never taken. Any miss voids the forward.
    """

    def __init__(
        self,
        pool: KVPool,
        buckets: Sequence[tuple[int, int]],
        q_src: torch.Tensor,
        n_keys: torch.Tensor,
        slots: torch.Tensor,
        windows: Sequence[int | None],
        additive: bool,
    ) -> None:
        self.pool, self.buckets, self.windows = pool, list(buckets), tuple(windows)
        self.additive = additive
        self.index = {q_src.device: (q_src, n_keys, slots)}
        self.masks: dict[tuple[torch.device, int | None, torch.dtype], list[torch.Tensor]] = {}
        self.pending: tuple[int, torch.Tensor, torch.Tensor] | None = None
        self.consumed = 0
        self.missed = 0

    def on(self, device: torch.device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The index tensors on ``device`` (a model split across devices: one copy per device)."""
        if device not in self.index:
            self.index[device] = tuple(x.to(device) for x in next(iter(self.index.values())))
        return self.index[device]

    def bucket_masks(
        self, device: torch.device, window: int | None, dtype: torch.dtype
    ) -> list[torch.Tensor]:
        """Each bucket's mask ``(count, 1, 1, width)``: key ``j`` seen iff ``j < n_keys`` (and
        ``j >= n_keys - window``); bool, or additive of ``dtype`` (0 / its minimum) for eager."""
        key = (device, window, dtype if self.additive else torch.bool)
        if key not in self.masks:
            _, n_keys, _ = self.on(device)
            out, at = [], 0
            for count, width in self.buckets:
                n = n_keys[at : at + count, None]  # (count, 1)
                j = torch.arange(width, device=device)[None, :]  # (1, width)
                seen = j < n if window is None else (j < n) & (j >= n - window)
                m = seen[:, None, None, :]  # (count, 1, 1, width)
                if self.additive:
                    m = torch.zeros(m.shape, dtype=dtype, device=device).masked_fill_(
                        ~m, torch.finfo(dtype).min
                    )
                out.append(m)
                at += count
            self.masks[key] = out
        return self.masks[key]


ACTIVE: ContextVar[QueryState | None] = ContextVar("llamppl_query_state", default=None)


class QueryPoolLayer(PoolLayer):
    """A :class:`~llamppl.lm.hf.kv_pool.PoolLayer` that writes the new tokens' K/V and gathers
    nothing: :func:`per_query_attention` reads each query's keys from the pool itself."""

    def __init__(
        self,
        pool: KVPool,
        layer: int,
        src: torch.Tensor,
        dst: torch.Tensor,
        width: int,
        state: QueryState,
        prefix: int = 0,
    ) -> None:
        super().__init__(pool, layer, src, dst, src[:0], width, prefix)
        self.state = state

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        self.write_new(key_states, value_states)  # (B, H_kv, T, D)
        if self.state.pending is not None:
            self.state.missed += 1  # the previous layer's attention never ran through us
        self.state.pending = (self.layer, key_states, value_states)
        return key_states, value_states  # (B, H_kv, T, D): only the new tokens


@contextmanager
def one_thread(device: torch.device) -> Iterator[None]:
    """Run the body on one intra-op thread when ``device`` is a CPU (a no-op elsewhere)."""
    n = torch.get_num_threads()
    if device.type != "cpu" or n == 1:
        yield
        return
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(n)


def eager_of(module: torch.nn.Module) -> Callable[..., tuple[torch.Tensor, Any]]:
    """The ``eager_attention_forward`` of ``module``'s modeling file (the model's own eager)."""
    fn = getattr(sys.modules.get(type(module).__module__), "eager_attention_forward", None)
    if fn is None:
        raise TypeError(
            f"{type(module).__name__} has no eager_attention_forward in its module; "
            "load the model with attn_implementation='sdpa' for batch_invariant=True"
        )
    return fn


@contextmanager
def per_query(config: Any, state: QueryState) -> Iterator[QueryState]:
    """Route ``config``'s model through :func:`per_query_attention` with ``state``, then restore."""
    with routed_attention(config, ATTENTION_NAME, ACTIVE, state):
        yield state


def per_query_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """transformers attention function (registered as :data:`ATTENTION_NAME`).

    ``query`` ``(B, H, T, D_k)``; ``key``/``value`` are the new tokens' own ``(B, H_kv, T, D)``
    (already in the pool). Each bucket of the active :class:`QueryState` is one call of the
    model's attention function on ``(count, H, 1, D_k)`` queries and their
    ``(count, H_kv, width, D)`` keys read from the pool; the outputs land at the queries'
    flat positions, zeros elsewhere (padding). Returns ``(B, T, H, D_v)``. Without a pending
    layer (another thread's forward, a model whose cache update bypassed ours): plain ``sdpa``.
    """
    state = ACTIVE.get()
    pending = None if state is None else state.pending
    if state is None or pending is None or not (pending[1] is key and pending[2] is value):
        if state is not None:
            state.missed += 1
        return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)
    state.pending = None
    state.consumed += 1
    layer = pending[0]
    pool, dev = state.pool, query.device
    B, H, T, Dk = query.shape
    Hkv, Dv = key.shape[1], value.shape[-1]
    q_src, _, slots = state.on(dev)
    masks = state.bucket_masks(dev, state.windows[layer], query.dtype)
    q_all = query.transpose(1, 2).reshape(B * T, H, Dk)  # (B·T, H, D_k)
    out = query.new_zeros(B * T, H, Dv)  # (B·T, H, D_v); padding queries stay 0
    inner = eager_of(module) if state.additive else sdpa_attention_forward
    at_q = at_k = 0
    with one_thread(dev):
        for (count, width), mask in zip(state.buckets, masks):
            idx = q_src[at_q : at_q + count]  # (count,)
            k, v = pool.read(layer, slots[at_k : at_k + count * width])  # (H_kv, count·width, D)
            k = k.view(Hkv, count, width, Dk).transpose(0, 1)  # (count, H_kv, width, D_k)
            v = v.view(Hkv, count, width, Dv).transpose(0, 1)  # (count, H_kv, width, D_v)
            q = q_all.index_select(0, idx)[:, :, None]  # (count, H, 1, D_k)
            o, _ = inner(module, q, k, v, mask, **kwargs)  # (count, 1, H, D_v)
            out.index_copy_(0, idx, o.reshape(count, H, Dv))
            at_q, at_k = at_q + count, at_k + count * width
    return out.view(B, T, H, Dv), None


AttentionInterface.register(ATTENTION_NAME, per_query_attention)
# another thread's forward of the same model during ours builds sdpa's masks and runs plain sdpa
AttentionMaskInterface.register(ATTENTION_NAME, sdpa_mask)
