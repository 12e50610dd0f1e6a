"""Which keys each new token of a batch-invariant forward reads, and in which attention calls.

Pure Python planning for :mod:`llamppl.lm.hf.batch_invariant` (no tensor, no model; tested on a
bare :class:`~llamppl.lm.trie.TokenTrie`). A new token's query must see the same keys in the
same calls of the same shapes whatever else the forward holds, so every choice below is a
function of the query's own context. Two layouts:

- **Whole context** (:func:`plan_queries`): a query reads its ``n`` keys from position 0, end
  padded to :func:`key_width` (a multiple of :data:`KEY_BLOCK`) with masked slots; queries of
  one width form a bucket, one call each. Used where a layer has a sliding window or runs
  the model's eager attention. Each query gathers its whole context: O(n) copies per query.
- **Key blocks** (:func:`plan_blocks`): positions are cut at fixed absolute multiples of
  :data:`KEY_SPLIT` (``S``). A query with ``n`` keys has ``J = (n - 1) // S`` full blocks,
  read in power-of-two runs after ``J``'s binary digits (:func:`key_blocks`: ``J = 15`` reads
  ``[0, 8S)``, ``[8S, 12S)``, ``[12S, 14S)``, ``[14S, 15S)``), then its last block
  ``[J S, J S + S)``, whose columns past its own ``n`` are masked. Each run or block is one
  partial attention (output and log-sum-exp), merged in that order
  (:mod:`llamppl.lm.hf.block_attention`). A run is a trie path, named by its width and the
  node that ends it: queries that share it (the rows below one prompt, the tokens of a
  prompt) read its keys once — a view of the pool when its slots are contiguous — in one
  call. A masked last block's extra columns hold whatever follows on the query's list (the
  next tokens of its prompt) or the scratch slot: masked keys change no bit of the result,
  so the tokens of one prompt block share their last block too. Rows below a 1,000-token
  prompt then read it in four shared calls per layer instead of one gather per row::

      bp = plan_blocks(nodes, src, scratch=pool.scratch)
      bp.src                  # (n,) each query's flat index in the rows
      bp.calls                # KeyCall per attention call: step, width, queries, slots
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from ..trie import TrieNode

__all__ = [
    "KEY_BLOCK",
    "KEY_SPLIT",
    "MAX_GATHER_SLOTS",
    "BlockPlan",
    "KeyCall",
    "QueryPlan",
    "key_blocks",
    "key_width",
    "plan_blocks",
    "plan_queries",
]

#: key columns of one query are padded at the end to a multiple of this (:func:`key_width`):
#: any width that depends on the query's context alone is invariant; wider blocks mean fewer
#: attention calls but more masked columns to compute (blocks of 64 made a forward of 128
#: short rows ~16% slower than the per-row path, blocks of 8 about as fast)
KEY_BLOCK = 8
#: absolute positions where :func:`plan_blocks` cuts every context's keys (a multiple of 64 so
#: that a block's elementwise work has no vector remainder)
KEY_SPLIT = 64
#: at most this many key slots are gathered for one attention call (a call is split above it)
MAX_GATHER_SLOTS = 1 << 15


def key_width(n_keys: int) -> int:
    """Key columns of a query that sees ``n_keys`` keys, rounded up to :data:`KEY_BLOCK`.

    A function of the query's own context only, so its attention has the same shape (and the
    same masked tail) in every batch it is computed in.
    """
    return -(-n_keys // KEY_BLOCK) * KEY_BLOCK


@dataclass
class QueryPlan:
    """Per-query key lists of the whole-context layout; flat lists."""

    src: list[int] = field(default_factory=list)  # (n,) flat index b*T + column, bucket by bucket
    n_keys: list[int] = field(default_factory=list)  # (n,) keys each query sees (itself included)
    slots: list[int] = field(default_factory=list)  # per bucket (count x width) slots, row-major
    buckets: list[tuple[int, int]] = field(default_factory=list)  # (count, width) in order

    def index_lists(self) -> list[list[int]]:
        """``src, n_keys, slots``: what goes to the device."""
        return [self.src, self.n_keys, self.slots]


def _path_lists(
    nodes: Sequence[TrieNode],
) -> list[tuple[list[int], int]]:
    """Each node's ``(list, n)``: the first ``n = depth`` entries of ``list`` are its path's
    slots. A node extends its parent's list in place when it is the first planned node to do
    so (a prompt's tokens share one list), else copies it: O(tokens + branches x context)."""
    paths: dict[TrieNode, tuple[list[int], int]] = {}
    out = []
    for node in nodes:
        par = paths.get(node.parent)  # type: ignore[arg-type]
        if par is not None and len(par[0]) == par[1]:
            keys = par[0]
            keys.append(node.slot)
        elif par is not None:
            keys = par[0][: par[1]] + [node.slot]
        else:
            keys = node.path_slots()
        paths[node] = (keys, node.depth)
        out.append(paths[node])
    return out


def plan_queries(
    nodes: Sequence[TrieNode],
    src: Sequence[int],
    scratch: int,
    max_slots: int = MAX_GATHER_SLOTS,
) -> QueryPlan:
    """Every new node's own key list: the slots of its whole context, root first, end padded
    with ``scratch`` to :func:`key_width`; queries of one width form a bucket (at most
    ``max_slots`` slots each, else split). ``src[k]`` is node ``k``'s flat index in the rows.
    """
    by_width: dict[int, list[tuple[int, int, list[int]]]] = {}
    for (keys, n), at in zip(_path_lists(nodes), src):
        by_width.setdefault(key_width(n), []).append((at, n, keys[:n]))
    plan = QueryPlan()
    for width in sorted(by_width):
        queries = by_width[width]
        per_call = max(1, max_slots // width)
        for first in range(0, len(queries), per_call):
            chunk = queries[first : first + per_call]
            plan.buckets.append((len(chunk), width))
            for at, n, keys in chunk:
                plan.src.append(at)
                plan.n_keys.append(n)
                plan.slots += keys
                plan.slots += [scratch] * (width - n)
    return plan


def key_blocks(n: int, split: int = KEY_SPLIT) -> list[tuple[int, int]]:
    """The blocks ``(start, width)`` a query with ``n`` keys reads, in merge order.

    The ``J = (n - 1) // split`` full blocks of ``split`` keys are taken in power-of-two runs
    after the binary digits of ``J``, largest first (as a Fenwick tree does): ``J = 13`` gives
    ``[0, 8s), [8s, 12s), [12s, 13s)``. Then the last block ``[J s, J s + s)``, of which the
    query sees its first ``n - J s`` keys. A run starting at ``start`` is always preceded by
    the runs of ``start``'s binary digits, so its position in the merge order is
    ``popcount(start / split)`` whatever the query; and runs align to their width, so the
    queries below a long prompt mostly read the same few runs.
    """
    last = (n - 1) // split
    out, at = [], 0
    for bit in reversed(range(last.bit_length())):
        if last >> bit & 1:
            out.append((at, split << bit))
            at += split << bit
    return [*out, (at, split)]


@dataclass
class KeyCall:
    """One attention call of the key-block layout: ``queries`` against one block of keys each.

    ``step`` is the block's place in a query's merge order, ``width`` its number of keys.
    ``shared``: one block for every query (``start >= 0``: its slots are ``start, start + 1,
    ...``, a view of the pool; else ``slots`` holds its ``width`` slots); otherwise ``slots``
    holds ``count x width`` slots, a block per query. ``masked``: each query's last block,
    of which it sees the first ``visible[i]`` keys.
    """

    step: int
    width: int
    masked: bool
    queries: list[int]
    shared: bool
    start: int = -1
    slots: list[int] = field(default_factory=list)
    visible: list[int] = field(default_factory=list)


@dataclass
class BlockPlan:
    """The key-block layout of one forward (see the module docstring)."""

    src: list[int]  # (n,) each query's flat index b*T + column, in node order
    calls: list[KeyCall]
    steps: int  # the most blocks one query reads

    def index_lists(self) -> list[list[int]]:
        """``src`` then each call's queries, visible counts and slots, concatenated."""
        queries = [q for c in self.calls for q in c.queries]
        visible = [v for c in self.calls for v in c.visible]
        slots = [s for c in self.calls for s in c.slots]
        return [self.src, queries, visible, slots]


def plan_blocks(
    nodes: Sequence[TrieNode],
    src: Sequence[int],
    scratch: int,
    split: int = KEY_SPLIT,
    max_slots: int = MAX_GATHER_SLOTS,
) -> BlockPlan:
    """The key-block layout of the new ``nodes`` (topological order; ``src[k]``: node ``k``'s
    flat index in the rows): each query's :func:`key_blocks`. A full run is named by its width
    and the node that ends it, a last block by the list it lies on; blocks read by two
    queries or more are one call each, the others are gathered per query into calls of at
    most ``max_slots`` slots, one per (step, width).
    """
    # (step, width, masked) -> identity -> (list, start, [(query, visible)])
    groups: dict[tuple[int, int, bool], dict[object, tuple[list[int], int, list]]] = {}
    steps = 0
    for q, (keys, n) in enumerate(_path_lists(nodes)):
        blocks = key_blocks(n, split)
        steps = max(steps, len(blocks))
        for step, (start, width) in enumerate(blocks[:-1]):
            named = groups.setdefault((step, width, False), {})
            named.setdefault(keys[start + width - 1], (keys, start, []))[2].append((q, width))
        start = blocks[-1][0]
        named = groups.setdefault((len(blocks) - 1, split, True), {})
        named.setdefault((id(keys), start), (keys, start, []))[2].append((q, n - start))
    calls: list[KeyCall] = []
    for (step, width, masked), named in sorted(groups.items()):
        alone: list[tuple[int, int, list[int]]] = []
        for keys, start, members in named.values():
            block = keys[start : start + width]
            block += [scratch] * (width - len(block))
            if len(members) > 1:
                contiguous = block == list(range(block[0], block[0] + width))
                calls.append(
                    KeyCall(
                        step,
                        width,
                        masked,
                        [q for q, _ in members],
                        True,
                        start=block[0] if contiguous else -1,
                        slots=[] if contiguous else block,
                        visible=[v for _, v in members] if masked else [],
                    )
                )
            else:
                alone.append((*members[0], block))
        per_call = max(1, max_slots // width)
        for first in range(0, len(alone), per_call):
            chunk = alone[first : first + per_call]
            calls.append(
                KeyCall(
                    step,
                    width,
                    masked,
                    [q for q, _, _ in chunk],
                    False,
                    slots=[s for _, _, block in chunk for s in block],
                    visible=[v for _, v, _ in chunk] if masked else [],
                )
            )
    return BlockPlan(list(src), calls, steps)
