"""The batch-invariant forward layout (``batch_invariant=True``): every token's bits its context's own.

:mod:`llamppl.lm.hf.batch_invariant` says why each piece is invariant; this module lays a
forward out. The new nodes, in topological order, are fed to the model in the calls the
linear layers' kernels require (:func:`~llamppl.lm.hf.fast_linear.linear_rows`):

- :class:`~llamppl.lm.hf.batch_plan.PaddedCalls` (FBGEMM float16 weights): one call; the
  groups packed side by side into rows (:func:`~llamppl.lm.hf.batch_plan.pack_rows`), the
  rows widened until their token count is a multiple of 6;
- :class:`~llamppl.lm.hf.batch_plan.FixedCalls` (any other kernel): calls of exactly 48 token
  rows (:func:`~llamppl.lm.hf.batch_plan.pack_tokens`), run in order — a token's keys are
  written by the layer before its attention reads them, and parents come before children,
  so a call reads the K/V of earlier calls from the pool.

Each query's keys come from :func:`~llamppl.lm.hf.query_plan.plan_blocks` (fixed absolute
key blocks: ``sdpa`` models without sliding windows) or
:func:`~llamppl.lm.hf.query_plan.plan_queries` (whole contexts: the others, and a model
whose attention calls carry keywords that change the scores). All calls' index data go to
the device in ONE upload::

    status = run_per_query(mc, groups, rows=PaddedCalls(), blocks=True)
    # "ok"; "whole": rerun with blocks=False; "bypass": a layer skips the attention interface
"""

from __future__ import annotations

from ..trie import TrieNode
from .batch_invariant import QueryPoolLayer, QueryState, Unsplittable, WholeContext, per_query
from .batch_plan import RowCalls
from .block_attention import KeyBlocks
from .model_call import ModelCall, keep_hidden
from .query_plan import BlockPlan, QueryPlan, plan_blocks, plan_queries

__all__ = ["run_per_query"]


def run_per_query(mc: ModelCall, groups: list[list[TrieNode]], rows: RowCalls, blocks: bool) -> str:
    """Run ``groups``' new nodes batch-invariantly; fills their K/V slots and ``node.hidden``.

    Returns ``"ok"``; ``"whole"`` when a key-block call met keywords that change the scores
    (rerun with ``blocks=False``); ``"bypass"`` when some layer does not call transformers'
    attention interface (serve the batch per row). In both cases the slots are rewritten by
    the rerun and no hidden state is kept.
    """
    pool = mc.pool
    pool.ensure(max(node.slot for g in groups for node in g))
    calls = rows.plans(groups)
    keys: list[BlockPlan | QueryPlan] = [
        plan_blocks(nodes, plan.src, pool.scratch)
        if blocks
        else plan_queries(nodes, plan.src, pool.scratch)
        for nodes, plan in calls
    ]
    parts: list[list[int]] = []
    for (_, plan), kp in zip(calls, keys):
        parts += [*plan.index_lists()[:6], plan.ancestry, *kp.index_lists()]
    uploaded = mc.upload(*parts)
    n_parts = 7 + (4 if blocks else 3)
    for c, ((nodes, plan), kp) in enumerate(zip(calls, keys)):
        ids_t, pos_t, t_t, p_t, src_t, dst_t, anc_t, *key_t = uploaded[
            c * n_parts : (c + 1) * n_parts
        ]
        B, T = plan.B, plan.T
        ids_t, pos_t = ids_t.view(B, T), pos_t.view(B, T)
        # the rows' causal mask only reaches a layer that bypasses the attention interface
        attention_mask = mc.masks(T, 0, t_t, p_t, plan.trees, anc_t, pos_t)
        reader = (
            KeyBlocks(pool, kp, key_t)
            if isinstance(kp, BlockPlan)
            else WholeContext(kp.buckets, *key_t)
        )
        state = QueryState(pool, reader, mc.arch.windows, mc.additive)
        index = {mc.device: (src_t, dst_t)}
        layers = []
        for layer, d in enumerate(pool.layer_devices):
            if d not in index:  # a model split across devices: indices per device
                index[d] = (src_t.to(d), dst_t.to(d))
            layers.append(QueryPoolLayer(pool, layer, *index[d], T, state))
        try:
            with per_query(mc.config, state):
                out = mc.run(ids_t, attention_mask, pos_t, layers)
        except Unsplittable:
            return "whole"
        if state.consumed != pool.n_layers or state.missed:
            return "bypass"
        keep_hidden(out.last_hidden_state, src_t, nodes)
    return "ok"
