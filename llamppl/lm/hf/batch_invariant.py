"""A batch-invariant forward: a context's log-probs do not depend on what else is in the batch.

A batched forward of :class:`~llamppl.CachedCausalLM` mixes the contexts of every particle
(of every job, under :func:`~llamppl.distributed.run_many`). On a CPU its floating-point
bits then depend on the company a context keeps in three ways: a linear layer's matrix
product rounds a row differently for different numbers of rows ``M``, an attention row
padded to another row's length reduces in another order, and the shared-prefix merge
(:mod:`llamppl.lm.hf.prefix_attention`) splits a row's softmax where the batch's common
prefix ends. This mode removes all three, so every hidden state is a function of its
context alone (the layout: :mod:`llamppl.lm.hf.per_query_forward`):

- **Linear layers** see row counts their kernels treat alike
  (:func:`~llamppl.lm.hf.fast_linear.linear_rows`). FBGEMM's float16-weight GEMM (the
  default on x86 CPUs) gives a row the same bits in every call whose row count is a
  multiple of 6, on AVX2 and AVX-512 alike, as its kernels show
  (:mod:`llamppl.lm.hf.fast_linear`): the forward runs as one call padded to such a count
  (:class:`~llamppl.lm.hf.batch_plan.PaddedCalls`; the LM head pads the same way). Other
  kernels (MKL's float32 GEMM, whose row classes change with the ISA and the thread count)
  get calls of exactly 48 rows each (:class:`~llamppl.lm.hf.batch_plan.FixedCalls`).
- **Attention** is computed per query over its own keys, read from the
  :class:`~llamppl.lm.hf.kv_pool.KVPool` in position order, in calls whose shapes depend on
  the query's context only (:mod:`llamppl.lm.hf.query_plan`). ``sdpa`` models without
  sliding windows, on the CPU, cut the keys into blocks at fixed absolute positions and
  merge per-block results in block order (:mod:`llamppl.lm.hf.block_attention`): a block
  shared by many queries (a long prompt below every row) is read once per call, so 16 and
  64 rows below a 1,000-token prompt cost 1.2-1.3x the per-row forward's decode steps
  (was 2.3x and 4.8x when each query gathered its whole context;
  ``benchmarks/reports/smc_step.md``). Other models read each query's whole context, end
  padded to a multiple of 8 columns, with the model's own attention function (``sdpa`` or
  ``eager``) on one query per batch entry.
- **No shared-prefix merge across queries**: where the prompt ends does not decide how a
  query's softmax is split; the block boundaries are the same for every context.
- **One thread for attention.** With several intra-op threads, CPU attention kernels split a
  small batch's work across threads differently for different batch sizes (measured,
  torch 2.13: ``sdpa`` and ``matmul`` attention at 2 threads give a query other bits beside
  other queries), so on a CPU the per-query calls run on one thread
  (:func:`one_thread`); the linear layers keep every thread (FBGEMM splits only the output
  columns across threads).

What holds where: bitwise invariance within one process (one CPU, one ISA, one thread
count) — the same context gives the same bits alone and in any company. Another ISA or
thread count gives other bits (still within float32 rounding). Tested on AVX-512 and, in a
subprocess with ``FBGEMM_ENABLE_INSTRUCTIONS=AVX2``, ``ATEN_CPU_CAPABILITY=avx2`` and
``MKL_ENABLE_INSTRUCTIONS=AVX2``, on the AVX2 paths (``tests/lm/test_avx2_paths.py``).

Not covered: mixture-of-experts layers run each expert's product on the tokens routed to it,
so their bits still depend on the batch (the log-probs stay exact). On a GPU the layout is
the same with whole contexts (batched gathers and calls, no per-row host sync), but the
kernels' invariance is only measured on CPUs here (a GPU's split-K products and split-KV
decoding are not).

The K/V cache, the trie and the work counts are those of the per-row forward; every new
token still runs once. Index data still goes to the device in one upload; the calls'
shapes are host-side. The attention function is registered in transformers'
``AttentionInterface`` as :data:`ATTENTION_NAME` and switched on for one forward
(:func:`per_query`), as the shared-prefix path is::

    reader = KeyBlocks(pool, plan_blocks(nodes, src, pool.scratch), tensors)
    state = QueryState(pool, reader, arch.windows, additive=False)
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

from .block_attention import KeyBlocks
from .kv_pool import KVPool, PoolLayer
from .prefix_attention import NEUTRAL_KWARGS, is_unset, routed_attention

__all__ = [
    "ATTENTION_NAME",
    "QueryPoolLayer",
    "QueryState",
    "Unsplittable",
    "WholeContext",
    "one_thread",
    "per_query",
    "per_query_attention",
]

ATTENTION_NAME = "llamppl_per_query"


class WholeContext:
    """The calls of a :class:`~llamppl.lm.hf.query_plan.QueryPlan`: each query's whole context.

    ``q_src, n_keys, slots`` are its index lists on the device: ``(n,)`` flat query index,
    ``(n,)`` keys seen, ``(sum count x width,)`` key slots.
    """

    def __init__(
        self,
        buckets: Sequence[tuple[int, int]],
        q_src: torch.Tensor,
        n_keys: torch.Tensor,
        slots: torch.Tensor,
    ) -> None:
        self.buckets = list(buckets)
        self.index = {q_src.device: (q_src, n_keys, slots)}
        self.masks: dict[tuple[torch.device, int | None, torch.dtype], list[torch.Tensor]] = {}

    def on(self, device: torch.device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The index tensors on ``device`` (a model split across devices: one copy per device)."""
        if device not in self.index:
            self.index[device] = tuple(x.to(device) for x in next(iter(self.index.values())))
        return self.index[device]

    def bucket_masks(
        self, device: torch.device, window: int | None, dtype: torch.dtype
    ) -> list[torch.Tensor]:
        """Each bucket's mask ``(count, 1, 1, width)``: key ``j`` seen iff ``j < n_keys`` (and
        ``j >= n_keys - window``); bool, or additive of ``dtype`` (0 / its minimum) when
        ``dtype`` is given as a floating type for eager attention."""
        key = (device, window, dtype)
        if key not in self.masks:
            _, n_keys, _ = self.on(device)
            out, at = [], 0
            for count, width in self.buckets:
                n = n_keys[at : at + count, None]  # (count, 1)
                j = torch.arange(width, device=device)[None, :]  # (1, width)
                seen = j < n if window is None else (j < n) & (j >= n - window)
                m = seen[:, None, None, :]  # (count, 1, 1, width)
                if dtype != torch.bool:
                    m = torch.zeros(m.shape, dtype=dtype, device=device).masked_fill_(
                        ~m, torch.finfo(dtype).min
                    )
                out.append(m)
                at += count
            self.masks[key] = out
        return self.masks[key]

    def attend(
        self,
        module: torch.nn.Module,
        layer: int,
        query: torch.Tensor,
        state: QueryState,
        v_dim: int,
        kwargs: dict[str, Any],
    ) -> torch.Tensor:
        """Each bucket is one call of the model's attention function on ``(count, H, 1, D_k)``
        queries and their ``(count, H_kv, width, D)`` keys read from the pool; the outputs land
        at the queries' flat positions, zeros elsewhere. ``(B, H, T, D_k)`` -> ``(B, T, H, D_v)``."""
        pool, dev = state.pool, query.device
        B, H, T, Dk = query.shape
        Hkv = pool.n_kv_heads
        q_src, _, slots = self.on(dev)
        mask_dtype = query.dtype if state.additive else torch.bool
        masks = self.bucket_masks(dev, state.windows[layer], mask_dtype)
        q_all = query.transpose(1, 2).reshape(B * T, H, Dk)  # (B·T, H, D_k)
        out = query.new_zeros(B * T, H, v_dim)  # (B·T, H, D_v); padding queries stay 0
        inner = eager_of(module) if state.additive else sdpa_attention_forward
        at_q = at_k = 0
        for (count, width), mask in zip(self.buckets, masks):
            idx = q_src[at_q : at_q + count]  # (count,)
            k, v = pool.read(layer, slots[at_k : at_k + count * width])  # (H_kv, count·width, D)
            k = k.view(Hkv, count, width, Dk).transpose(0, 1)  # (count, H_kv, width, D_k)
            v = v.view(Hkv, count, width, v_dim).transpose(0, 1)  # (count, H_kv, width, D_v)
            q = q_all.index_select(0, idx)[:, :, None]  # (count, H, 1, D_k)
            o, _ = inner(module, q, k, v, mask, **kwargs)  # (count, 1, H, D_v)
            out.index_copy_(0, idx, o.reshape(count, H, v_dim))
            at_q, at_k = at_q + count, at_k + count * width
        return out.view(B, T, H, v_dim)


class QueryState:
    """What the layers of one batch-invariant forward pass to the attention function.

    Parameters
    ----------
    pool : KVPool
        The K/V pool the queries read.
    reader : WholeContext | KeyBlocks
        The forward's attention calls (:mod:`llamppl.lm.hf.query_plan`'s two layouts).
    windows : sequence of int | None
        Per-layer sliding windows (None: full attention).
    additive : bool
        Eager attention (the model's own ``eager_attention_forward``, an additive float
        mask) instead of ``sdpa`` (a boolean mask).

    ``pending`` is the layer whose K/V were just written, until its attention call takes
    it; ``consumed`` counts the layers that did, ``missed`` the calls that found no layer
    pending or a layer never taken. Any miss voids the forward. A key-block call carrying a
    keyword that changes the scores raises :class:`Unsplittable` (the forward is rerun with
    whole contexts).
    """

    def __init__(
        self,
        pool: KVPool,
        reader: WholeContext | KeyBlocks,
        windows: Sequence[int | None],
        additive: bool,
    ) -> None:
        self.pool, self.reader, self.windows = pool, reader, tuple(windows)
        self.additive = additive
        self.pending: tuple[int, torch.Tensor, torch.Tensor] | None = None
        self.consumed = 0
        self.missed = 0


class Unsplittable(Exception):
    """A key-block forward met an attention call with keywords that change the scores."""


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
    (already in the pool). The active :class:`QueryState`'s reader computes every query's
    attention over its own keys (:class:`WholeContext`, :class:`~llamppl.lm.hf.block_attention.KeyBlocks`);
    returns ``(B, T, H, D_v)``. Without a pending layer (another thread's forward, a model
    whose cache update bypassed ours): plain ``sdpa``.
    """
    state = ACTIVE.get()
    pending = None if state is None else state.pending
    if state is None or pending is None or not (pending[1] is key and pending[2] is value):
        if state is not None:
            state.missed += 1
        return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)
    state.pending = None
    state.consumed += 1
    layer, v_dim = pending[0], value.shape[-1]
    with one_thread(query.device):
        if isinstance(state.reader, WholeContext):
            return state.reader.attend(module, layer, query, state, v_dim, kwargs), None
        plain = all(k in NEUTRAL_KWARGS or is_unset(v) for k, v in kwargs.items())
        if not plain or not is_unset(kwargs.get("dropout")):
            # soft-capping, sinks, ...: stop, the caller reruns with whole contexts
            raise Unsplittable(sorted(k for k, v in kwargs.items() if not is_unset(v)))
        scaling = kwargs.get("scaling")
        if scaling is None:
            scaling = query.shape[-1] ** -0.5
        return state.reader.attend(layer, query, v_dim, scaling), None


AttentionInterface.register(ATTENTION_NAME, per_query_attention)
# another thread's forward of the same model during ours builds sdpa's masks and runs plain sdpa
AttentionMaskInterface.register(ATTENTION_NAME, sdpa_mask)
