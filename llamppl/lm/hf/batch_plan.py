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
5. Batch-invariant layout (:mod:`llamppl.lm.hf.batch_invariant`): the linear layers must
   see row counts their kernels treat alike (:class:`PaddedCalls`: one call, rows padded to a
   multiple of :data:`GEMM_ROW_BLOCK`, for FBGEMM's float16 GEMM; :class:`FixedCalls`: calls
   of exactly :data:`FIXED_CALL_ROWS` rows for any other kernel). :func:`pack_rows` lays a
   forward's groups out for the first, :func:`pack_tokens` one call's tokens for the second;
   each new token's keys are planned by :mod:`llamppl.lm.hf.query_plan`::

       rows = PaddedCalls()
       plan = pack_rows(groups, multiple=rows.multiple)     # B * T a multiple of 6
       plan = pack_tokens(nodes[a:b], FixedCalls().size)   # one call of 48 rows
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

from ..trie import TrieNode

__all__ = [
    "FIXED_CALL_ROWS",
    "GEMM_ROW_BLOCK",
    "PACK_ROW_TOKENS",
    "FixedCalls",
    "PaddedCalls",
    "Request",
    "RowCalls",
    "RowPlan",
    "common_ancestor",
    "count_new_tokens",
    "group_paths",
    "pack_rows",
    "pack_tokens",
    "plan_rows",
    "shared_prefix",
]

#: FBGEMM's float16 GEMM gives every row of a call the same bits for any number of rows that
#: is a multiple of this (its kernels, read in ``llamppl.lm.hf.fast_linear``'s docstring)
GEMM_ROW_BLOCK = 6
#: rows of every call of a forward whose products are not FBGEMM's (MKL's float32 GEMM and
#: others): a multiple of 6 and of 16, where MKL 2024.2 gave a row the same bits at every
#: position of the call (AVX-512 and forced AVX2, 1 and 2 threads; at 8 and 32 rows forced
#: to AVX2 it did not), and large enough that calls stay efficient (a 9-row decode step's
#: linear layers cost 2x, a 1000-token prompt's 1.4x)
FIXED_CALL_ROWS = 48
#: new tokens per row of a batch-invariant forward (:func:`pack_rows`); rows only shape the
#: linear layers' input there, so any width that packs the groups tightly will do
PACK_ROW_TOKENS = 256


class RowCalls(Protocol):
    """How a batch-invariant forward feeds its ``n`` new tokens to the matrix products."""

    def calls(self, n: int) -> list[tuple[int, int]]:
        """The token ranges ``[a, b)`` run by one model call each, in order."""
        ...

    def rows(self, n: int) -> int:
        """The rows a call holding ``n`` real tokens runs on (the rest is padding)."""
        ...

    def plans(self, groups: Sequence[Sequence[TrieNode]]) -> list[tuple[list[TrieNode], RowPlan]]:
        """The model calls of a forward of ``groups``: each call's nodes and row layout."""
        ...


@dataclass(frozen=True)
class PaddedCalls:
    """One call for the whole forward, its rows padded to a multiple of ``multiple``."""

    multiple: int = GEMM_ROW_BLOCK

    def calls(self, n: int) -> list[tuple[int, int]]:
        return [(0, n)]

    def rows(self, n: int) -> int:
        return max(1, -(-n // self.multiple)) * self.multiple

    def plans(self, groups: Sequence[Sequence[TrieNode]]) -> list[tuple[list[TrieNode], RowPlan]]:
        return [([node for g in groups for node in g], pack_rows(groups, multiple=self.multiple))]


@dataclass(frozen=True)
class FixedCalls:
    """Calls of exactly ``size`` rows each (the last one padded): no kernel ever sees another
    row count, so only a row's position inside the call could change its bits."""

    size: int = FIXED_CALL_ROWS

    def calls(self, n: int) -> list[tuple[int, int]]:
        return [(a, min(n, a + self.size)) for a in range(0, n, self.size)]

    def rows(self, n: int) -> int:
        return self.size

    def plans(self, groups: Sequence[Sequence[TrieNode]]) -> list[tuple[list[TrieNode], RowPlan]]:
        nodes = [node for g in groups for node in g]
        return [(nodes[a:b], pack_tokens(nodes[a:b], self.size)) for a, b in self.calls(len(nodes))]


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


def pack_rows(
    groups: Sequence[Sequence[TrieNode]],
    row_tokens: int = PACK_ROW_TOKENS,
    multiple: int = 1,
) -> RowPlan:
    """The row layout of a batch-invariant forward: whole groups packed side by side into rows
    of at most ``row_tokens`` new tokens, in order (a longer group has a row of its own); the
    rows are then widened (left padding) until ``B * T`` is a multiple of ``multiple``.

    Per-query attention reads each query's keys from the pool by slot and ignores the rows,
    so rows only shape the linear layers' input, which then holds about the forward's tokens
    and no more. :func:`plan_rows` gives every group a row of the longest group's width, so a
    forward whose groups carry several tokens each (forced tokens, a prompt) runs mostly
    padding: cheap where the linear layers are bound by reading weights (few rows), not where
    they are bound by arithmetic (many rows). Widening adds fewer than ``multiple`` columns
    (``T`` is rounded up to a multiple of ``multiple / gcd(B, multiple)``). ``P = 0`` and no
    tree is recorded: the mask built from this plan (a causal chain per row) is only there to
    give a layer that bypasses the attention interface a well-formed input; such a forward is
    discarded and served per row. ``src`` and ``dst`` follow the groups' order.
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
    B = len(rows)
    step = multiple // math.gcd(B, multiple)
    T = -(-max(sizes) // step) * step
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


def pack_tokens(nodes: Sequence[TrieNode], width: int) -> RowPlan:
    """One row of exactly ``width`` columns holding ``nodes`` (a call of :class:`FixedCalls`),
    left padded; as :func:`pack_rows`, no cached columns and no tree."""
    if len(nodes) > width:
        raise ValueError(f"{len(nodes)} tokens do not fit a row of {width}")
    plan = RowPlan(1, width, 0, [0] * width, [0] * width, [len(nodes)], [0])
    for k, node in enumerate(nodes):
        at = width - len(nodes) + k
        plan.ids[at] = node.token
        plan.pos[at] = node.depth - 1
        plan.src.append(at)
        plan.dst.append(node.slot)
    return plan
