"""Row layout of one batched cached forward: trie groups -> ids, positions, slots, ancestry.

Pure Python planning for :class:`~llamppl.CachedCausalLM`; no tensor, no model,
so it is tested on a bare :class:`~llamppl.lm.trie.TokenTrie`. The steps:

1. :func:`count_new_tokens`: how many trie nodes a set of requests will create
   (to reserve that many cache slots before inserting anything).
2. :func:`group_paths`: the inserted nodes grouped by the cached node they hang
   from. A group is usually one context's single new token; at a fresh prompt it
   is the prompt and every continuation of it (a tree).
3. :func:`plan_rows`: one row per group. Row ``b`` holds ``P`` cached keys (its
   base's path, left padded) then ``T`` new tokens (left padded); ``P``, ``T`` are
   the maxima over rows. A new token sees the cached path and its own ancestors
   in the group: a chain needs only the causal triangle; a branching group
   (a tree) also gets its ancestor-or-self matrix. Padding reads the pool's
   scratch slot. So every new node is run exactly once, and the rows are
   independent::

       plan = plan_rows(groups, bases, scratch=pool.scratch)
       plan.ids, plan.pos      # (B*T,) token ids and positions, row-major
       plan.read               # (B*(P+T),) pool slot of every key column
       plan.src, plan.dst      # new node k: flat index b*T + column, and its slot

4. :func:`shared_prefix`: the trie path every row's base extends (their common
   ancestor) and whether its slots are contiguous. ``plan_rows(..., shared=S)``
   then leaves those ``S`` keys out of every row (``P`` counts the keys past
   them), for :mod:`llamppl.lm.hf.prefix_attention` to read once for all rows.
5. Batch-invariant layout (:mod:`llamppl.lm.hf.batch_invariant`): :func:`pad_rows` adds
   empty rows until the forward has :func:`gemm_rows` token rows, and :func:`plan_queries`
   gives every new token its own key list, its whole context from position 0, end padded to
   :func:`key_width` columns, in buckets of equal width::

       qp = plan_queries([n for g in groups for n in g], plan.src, scratch=pool.scratch)
       qp.src, qp.n_keys      # (n,) each query's flat index b*T + column, its context length
       qp.slots               # each bucket's (count x width) key slots, row-major
       qp.buckets             # [(count, width), ...]
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from ..trie import TrieNode

__all__ = [
    "KEY_BLOCK",
    "MAX_GATHER_SLOTS",
    "MIN_GEMM_ROWS",
    "PACK_ROW_TOKENS",
    "QueryPlan",
    "Request",
    "RowPlan",
    "common_ancestor",
    "count_new_tokens",
    "gemm_rows",
    "group_paths",
    "key_width",
    "pack_rows",
    "pad_rows",
    "plan_queries",
    "plan_rows",
    "shared_prefix",
]

#: a matrix product ``(M, K) @ (K, N)`` gives every row the same bits for all M >= this
#: (measured: MKL 2024.2, AVX-512, 1 thread, the five weight shapes of SmolLM2-135M and
#: M = 1..4096: M = 1, M in {2, 3} and M >= 4 are three classes; position in the batch never
#: matters). A new linear kernel with another threshold changes only this number.
MIN_GEMM_ROWS = 4
#: key columns of one query are padded at the end to a multiple of this (:func:`key_width`):
#: any width that depends on the query's context alone is invariant; wider blocks mean fewer
#: attention calls but more masked columns to compute (blocks of 64 made a forward of 128
#: short rows ~16% slower than the per-row path, blocks of 8 about as fast)
KEY_BLOCK = 8
#: new tokens per row of a batch-invariant forward (:func:`pack_rows`); rows only shape the
#: linear layers' input there, so any width that packs the groups tightly will do
PACK_ROW_TOKENS = 256
#: at most this many key slots are gathered for one attention call (a bucket is split above it)
MAX_GATHER_SLOTS = 1 << 15


def gemm_rows(m: int) -> int:
    """Token rows to run a forward's linear layers on so that no row's bits depend on ``m``."""
    return max(m, MIN_GEMM_ROWS)


def key_width(n_keys: int) -> int:
    """Key columns of a query that sees ``n_keys`` keys, rounded up to :data:`KEY_BLOCK`.

    A function of the query's own context only, so its attention has the same shape (and the
    same masked tail) in every batch it is computed in.
    """
    return -(-n_keys // KEY_BLOCK) * KEY_BLOCK


@dataclass
class Request:
    """One context that needs transformer work in the current batch."""

    index: int  # position in the batch's result list
    context: tuple[int, ...]
    matched: TrieNode  # deepest node cached before the batch
    n_matched: int

    @property
    def suffix(self) -> tuple[int, ...]:
        """The tokens past the cached prefix."""
        return self.context[self.n_matched :]


def count_new_tokens(requests: Sequence[Request]) -> int:
    """Distinct trie nodes inserting every request's suffix will create (shared suffixes once)."""
    below: dict[int, dict] = {}
    n_new = 0
    for r in requests:
        d = below.setdefault(id(r.matched), {})
        for t in r.suffix:
            nxt = d.get(t)
            if nxt is None:
                nxt = d[t] = {}
                n_new += 1
            d = nxt
    return n_new


def group_paths(
    bases: Sequence[TrieNode], paths: Sequence[Sequence[TrieNode]]
) -> tuple[list[list[TrieNode]], list[TrieNode]]:
    """Group the new nodes ``paths[i]`` (inserted below ``bases[i]``) by the base they hang from.

    Returns ``(groups, group_bases)``: each group's nodes in topological order
    (parents first), and the cached node above it. Every node appears once.
    """
    group_of: dict[TrieNode, int] = {}
    groups: list[list[TrieNode]] = []
    group_bases: list[TrieNode] = []
    for base, path in zip(bases, paths):
        g = group_of.get(path[0])
        if g is None:
            g = len(groups)
            groups.append([])
            group_bases.append(base)
        for node in path:
            if node not in group_of:
                group_of[node] = g
                groups[g].append(node)
    return groups, group_bases


@dataclass
class RowPlan:
    """Index data of one batched forward (see the module docstring); flat lists, row-major."""

    B: int  # rows
    T: int  # new-token columns
    P: int  # cached-key columns
    ids: list[int]  # (B*T,) token ids, 0 in padding
    pos: list[int]  # (B*T,) positions, 0 in padding
    t_len: list[int]  # (B,) new tokens per row
    p_len: list[int]  # (B,) cached keys per row
    src: list[int] = field(default_factory=list)  # flat index b*T + column of each new node
    dst: list[int] = field(default_factory=list)  # its pool slot
    read: list[int] = field(default_factory=list)  # (B*(P+T),) pool slot of every key column
    trees: list[tuple[int, int]] = field(default_factory=list)  # (row, size) of branching groups
    ancestry: list[int] = field(default_factory=list)  # their ancestor-or-self matrices, flattened

    def index_lists(self) -> list[list[int]]:
        """``ids, pos, t_len, p_len, src, dst, read, ancestry``: what goes to the device."""
        return [
            self.ids,
            self.pos,
            self.t_len,
            self.p_len,
            self.src,
            self.dst,
            self.read,
            self.ancestry,
        ]


def ancestor_matrix(parents: Sequence[int]) -> list[list[int]]:
    """0/1 matrix ``m[k][j] = 1`` iff node ``j`` is node ``k`` or an ancestor (``parents[k] < k``, -1: none)."""
    n = len(parents)
    anc: list[list[int]] = []
    for k, par in enumerate(parents):
        row = list(anc[par]) if par >= 0 else [0] * n
        row[k] = 1
        anc.append(row)
    return anc


def common_ancestor(nodes: Sequence[TrieNode]) -> TrieNode:
    """The deepest node on every one of ``nodes``' paths (their longest common context).

    Walks up from each node only as far as the running answer: O(rows x tokens past it).
    """
    a = nodes[0]
    for b in nodes[1:]:
        while b.depth > a.depth:
            b = b.parent
        while a.depth > b.depth:
            a = a.parent
        while a is not b:
            a, b = a.parent, b.parent
    return a


def shared_prefix(bases: Sequence[TrieNode]) -> tuple[int, list[int], int | None]:
    """``(S, slots, start)``: the ``S`` tokens all ``bases`` extend, their slots, and
    the first slot if they are ``start, start + 1, ...`` (a view of the pool), else None.
    A single row shares nothing (``S = 0``): its prefix is read once anyway."""
    node = common_ancestor(bases)
    if node.depth == 0 or len(bases) < 2:
        return 0, [], None
    slots = node.path_slots()
    start = slots[0]
    contiguous = slots == list(range(start, start + len(slots)))
    return node.depth, slots, start if contiguous else None


def slots_below(node: TrieNode, depth: int) -> list[int]:
    """KV slots of ``node``'s context past its first ``depth`` tokens, root side first."""
    out = []
    while node.depth > depth:
        out.append(node.slot)
        node = node.parent
    out.reverse()
    return out


def plan_rows(
    groups: Sequence[Sequence[TrieNode]],
    bases: Sequence[TrieNode],
    scratch: int,
    shared: int = 0,
) -> RowPlan:
    """The row layout of ``groups`` below ``bases``; padding reads and writes slot ``scratch``.

    ``shared``: leading tokens common to every base (:func:`shared_prefix`) left out of
    the rows (``p_len``, ``P`` and ``read`` count only the keys past them).
    """
    B = len(groups)
    t_len = [len(g) for g in groups]
    p_len = [b.depth - shared for b in bases]
    T, P = max(t_len), max(p_len)
    plan = RowPlan(B, T, P, [0] * (B * T), [0] * (B * T), t_len, p_len)
    for b, (g, base) in enumerate(zip(groups, bases)):
        off = T - len(g)
        index = {node: k for k, node in enumerate(g)}
        parents = [index.get(node.parent, -1) for node in g]
        if any(par != k - 1 for k, par in enumerate(parents)):
            plan.trees.append((b, len(g)))
            plan.ancestry += [x for row in ancestor_matrix(parents) for x in row]
        plan.read += [scratch] * (P - p_len[b])
        if p_len[b]:
            plan.read += base.path_slots() if shared == 0 else slots_below(base, shared)
        plan.read += [scratch] * off
        for k, node in enumerate(g):
            at = b * T + off + k
            plan.ids[at] = node.token
            plan.pos[at] = node.depth - 1
            plan.src.append(at)
            plan.dst.append(node.slot)
            plan.read.append(node.slot)
    return plan


def pack_rows(groups: Sequence[Sequence[TrieNode]], row_tokens: int = PACK_ROW_TOKENS) -> RowPlan:
    """The row layout of a batch-invariant forward: whole groups packed side by side into rows
    of at most ``row_tokens`` new tokens, in order (a longer group has a row of its own).

    Per-query attention reads each query's keys from the pool by slot and ignores the rows,
    so rows only shape the linear layers' input, which then holds about the forward's tokens
    and no more. :func:`plan_rows` gives every group a row of the longest group's width, so a
    forward whose groups carry several tokens each (forced tokens, a prompt) runs mostly
    padding: cheap where the linear layers are bound by reading weights (few rows), not where
    they are bound by arithmetic (many rows). ``P = 0`` and no tree is recorded: the mask
    built from this plan (a causal chain per row) is only there to give a layer that bypasses
    the attention interface a well-formed input; such a forward is discarded and served per
    row (``CachedCausalLM._run_per_query``). ``src`` and ``dst`` follow the groups' order.
    """
    rows: list[list[int]] = []
    sizes: list[int] = []
    for i, g in enumerate(groups):
        if sizes and sizes[-1] + len(g) <= row_tokens:
            rows[-1].append(i)
            sizes[-1] += len(g)
        else:
            rows.append([i])
            sizes.append(len(g))
    B, T = len(rows), max(sizes)
    plan = RowPlan(B, T, 0, [0] * (B * T), [0] * (B * T), sizes, [0] * B)
    where: list[int] = [0] * len(groups)  # flat index of each group's first token
    for b, members in enumerate(rows):
        at = b * T + T - sizes[b]  # rows are left padded, as plan_rows's
        for i in members:
            where[i] = at
            at += len(groups[i])
    for i, g in enumerate(groups):
        for k, node in enumerate(g):
            plan.ids[where[i] + k] = node.token
            plan.pos[where[i] + k] = node.depth - 1
            plan.src.append(where[i] + k)
            plan.dst.append(node.slot)
    return plan


def pad_rows(plan: RowPlan, scratch: int, rows: int | None = None) -> RowPlan:
    """Append empty rows to ``plan`` (in place) until ``B * T >= gemm_rows(B * T)``, or ``rows`` rows.

    An empty row has no new token (``t_len = 0``): it is padding for the linear layers only,
    its key columns read ``scratch`` and nothing of it is stored.
    """
    n = rows if rows is not None else -(-gemm_rows(plan.B * plan.T) // plan.T) - plan.B
    if n <= 0:
        return plan
    plan.B += n
    plan.ids += [0] * (n * plan.T)
    plan.pos += [0] * (n * plan.T)
    plan.t_len += [0] * n
    plan.p_len += [0] * n
    plan.read += [scratch] * (n * (plan.P + plan.T))
    return plan


@dataclass
class QueryPlan:
    """Per-query key lists of one batch-invariant forward (see the module docstring); flat lists."""

    src: list[int] = field(default_factory=list)  # (n,) flat index b*T + column, bucket by bucket
    n_keys: list[int] = field(default_factory=list)  # (n,) keys each query sees (itself included)
    slots: list[int] = field(default_factory=list)  # per bucket (count x width) slots, row-major
    buckets: list[tuple[int, int]] = field(default_factory=list)  # (count, width) in order

    def index_lists(self) -> list[list[int]]:
        """``src, n_keys, slots``: what goes to the device."""
        return [self.src, self.n_keys, self.slots]


def plan_queries(
    nodes: Sequence[TrieNode],
    src: Sequence[int],
    scratch: int,
    max_slots: int = MAX_GATHER_SLOTS,
) -> QueryPlan:
    """Every new node's own key list: the slots of its whole context, root first, end padded
    with ``scratch`` to :func:`key_width`; queries of one width form a bucket (at most
    ``max_slots`` slots each, else split). ``src[k]`` is node ``k``'s flat index in the rows.

    A node's list is its parent's plus its own slot when the parent is planned too (a prompt's
    tokens), so a group of ``T`` tokens costs O(T x context) list items, no trie walks.
    """
    context: dict[TrieNode, list[int]] = {}
    by_width: dict[int, list[tuple[int, int, list[int]]]] = {}
    for node, at in zip(nodes, src):
        parent = context.get(node.parent)  # type: ignore[arg-type]
        keys = parent + [node.slot] if parent is not None else node.path_slots()
        context[node] = keys
        by_width.setdefault(key_width(len(keys)), []).append((at, len(keys), keys))
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
