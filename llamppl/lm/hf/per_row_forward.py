"""The per-row forward layout (``batch_invariant=False``): a row per trie group, the common prefix read once.

Each group of new nodes (:func:`~llamppl.lm.hf.batch_plan.group_paths`) is one row: its
base's cached keys, then its new tokens, with explicit positions and a 4-D tree mask
(:func:`~llamppl.lm.hf.batch_plan.plan_rows`); each attention layer writes the new tokens'
K/V into their pool slots and reads each row's context with one gather
(:class:`~llamppl.lm.hf.kv_pool.PoolLayer`). When the rows share a cached prefix (the prompt
of an SMC step) and the model allows it, the prefix is left out of the rows and read once
per layer (:mod:`llamppl.lm.hf.prefix_attention`), its softmax merged with each row's::

    ok = run_per_row(mc, groups, bases, share_prefix=True)
    if not ok:   # a layer bypassed the attention interface: no prefix sharing for this model
        run_per_row(mc, groups, bases, share_prefix=False)

Fastest on a CPU, but a row's bits depend on its company (the rows' count and widths, where
the common prefix ends): :mod:`llamppl.lm.hf.per_query_forward` is the layout that does not.
"""

from __future__ import annotations

from ..trie import TrieNode
from .batch_plan import plan_rows, shared_prefix
from .model_call import ModelCall, keep_hidden
from .prefix_attention import PrefixState, pool_layers, sharing_prefix

__all__ = ["run_per_row"]


def run_per_row(
    mc: ModelCall, groups: list[list[TrieNode]], bases: list[TrieNode], share_prefix: bool
) -> bool:
    """One batched forward, a row per group; fills the groups' K/V slots and ``node.hidden``.

    Returns False (nothing to keep; the K/V slots are rewritten by the rerun) when
    ``share_prefix`` found a layer that does not call transformers' attention interface:
    rerun with ``share_prefix=False``. Counts ``mc.stats.shared_prefix_tokens``.
    """
    pool = mc.pool
    pool.ensure(max(node.slot for g in groups for node in g))
    S, slots, start = shared_prefix(bases) if share_prefix else (0, [], None)
    plan = plan_rows(groups, bases, pool.scratch, shared=S)
    B, T, P = plan.B, plan.T, plan.P
    ids_t, pos_t, t_t, p_t, src_t, dst_t, read_t, anc_t, pre_t = mc.upload(
        *plan.index_lists(), slots if start is None else []
    )
    ids_t, pos_t = ids_t.view(B, T), pos_t.view(B, T)
    attention_mask = mc.masks(T, P, t_t, p_t, plan.trees, anc_t, pos_t)
    state = PrefixState() if S else None
    at = (start, S) if start is not None else pre_t  # the prefix: a view, or one gather
    layers = pool_layers(pool, mc.device, (src_t, dst_t, read_t), P + T, P, state, at)
    with sharing_prefix(mc.config, state):
        out = mc.run(ids_t, attention_mask, pos_t, layers)
    if state is not None and (state.consumed != pool.n_layers or state.missed):
        return False
    mc.stats.shared_prefix_tokens += B * S
    keep_hidden(out.last_hidden_state, src_t, (node for g in groups for node in g))
    return True
