"""A tensor-free token trie with KV-slot allocation, LRU eviction and lock counts.

:class:`TokenTrie` is the bookkeeping half of :class:`~llamppl.CachedCausalLM`'s
cache (DESIGN §4): one :class:`TrieNode` per token from the root (the empty
context). A node owns the integer *slot* where its token's K/V live in a
:class:`~llamppl.lm.hf.kv_pool.KVPool`, plus an opaque payload the LM fills in
(``hidden``: the final hidden state). The trie itself never
touches a tensor, so it can be built and tested without a model (like
sglang's simulated radix cache)::

    from llamppl.lm.trie import TokenTrie
    trie = TokenTrie(capacity=4)
    a, b = trie.insert(trie.root, [5, 7])       # two new nodes, slots 0 and 1
    trie.match_prefix([5, 7, 9])                # (b, 2): two tokens cached
    trie.make_room(3)                           # evicts b (the LRU leaf) -> True

Operations and their side effects:

- ``match_prefix(tokens, start=root)`` -> ``(node, length)``: pure lookup.
- ``insert(parent, tokens)``: allocates one slot per new node; raises
  ``MemoryError`` if no slot is free (call ``make_room`` first).
- ``touch(node)``: marks the node most recently used.
- ``lock(node)`` / ``unlock(node)``: a locked node is never evicted. Only
  leaves are evictable, and every ancestor of a node is an internal node, so
  locking a node protects its whole path in O(1) (no walk to the root, unlike
  sglang's ``inc_lock_ref``).
- ``make_room(n)``: evicts least-recently-used unlocked leaves (leaf first, so a
  subtree empties bottom-up) until ``n`` slots are free; returns False, having
  evicted nothing, if that is impossible.

Recency propagates lazily: when a leaf is evicted its parent inherits the
leaf's ``last_used`` if newer, so an internal node that becomes a leaf carries
the time its subtree was last used.

Why not ``pygtrie``: its nodes are keyed by whole sequences and hold one value;
we need per-node mutable metadata (slot, lock count, recency, payloads), an
O(1) step from a known node to its child (requests extend the previous
context by one token), a parent pointer for leaf-first eviction, and a live
leaf set for LRU. A ``__slots__`` node with a ``children`` dict gives all of
that in ~150 lines, with no per-lookup key traversal from the root.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterator, Sequence

from ..validation import is_integer

__all__ = ["TokenTrie", "TrieNode"]


class TrieNode:
    """One token of a cached context.

    Attributes
    ----------
    token : int
        The token id this node adds to its parent's context (-1 at the root).
    parent : TrieNode | None
        Parent node (None at the root and after eviction).
    children : dict[int, TrieNode]
        Child nodes by token id.
    depth : int
        Length of the context this node ends (0 at the root).
    slot : int
        KV slot of this node's token (-1 at the root and after eviction).
    last_used : int
        Logical time of the last use (see :meth:`TokenTrie.touch`).
    lock_ref : int
        Number of outstanding locks; a locked node is never evicted.
    hidden : object
        Opaque payload owned by the LM (the final hidden state).
    """

    __slots__ = (
        "token",
        "parent",
        "children",
        "depth",
        "slot",
        "last_used",
        "lock_ref",
        "hidden",
    )

    def __init__(self, token: int, parent: TrieNode | None, depth: int, slot: int) -> None:
        self.token = token
        self.parent = parent
        self.children: dict[int, TrieNode] = {}
        self.depth = depth
        self.slot = slot
        self.last_used = 0
        self.lock_ref = 0
        self.hidden: object = None

    @property
    def alive(self) -> bool:
        """False once the node has been evicted (or for a detached node)."""
        return self.slot >= 0

    def tokens(self) -> tuple[int, ...]:
        """The context this node ends, from the root."""
        out = []
        node: TrieNode | None = self
        while node is not None and node.depth > 0:
            out.append(node.token)
            node = node.parent
        return tuple(reversed(out))

    def path_slots(self) -> list[int]:
        """KV slots of the context's tokens, root side first (``depth`` entries)."""
        out = []
        node: TrieNode | None = self
        while node is not None and node.depth > 0:
            out.append(node.slot)
            node = node.parent
        out.reverse()
        return out

    def __repr__(self) -> str:
        return f"TrieNode(token={self.token}, depth={self.depth}, slot={self.slot}, lock_ref={self.lock_ref})"


class TokenTrie:
    """Token trie whose non-root nodes each own one of ``capacity`` KV slots.

    Parameters
    ----------
    capacity : int
        Number of slots, i.e. the maximum number of cached tokens (non-root nodes).
    """

    def __init__(self, capacity: int) -> None:
        if not is_integer(capacity) or capacity < 1:
            raise ValueError(f"capacity must be a positive integer, got {capacity!r}")
        self.capacity = capacity
        self.root = TrieNode(-1, None, 0, -1)
        self._clock = 0
        # Free slots, lowest on top: slots are reused LIFO so the pool stays compact.
        self._free: list[int] = list(range(capacity - 1, -1, -1))
        self._leaves: set[TrieNode] = set()
        self._locked: set[TrieNode] = set()
        self.evictions = 0

    # ------------------------------------------------------------------ queries
    def __len__(self) -> int:
        """Number of cached tokens (non-root nodes), i.e. slots in use."""
        return self.capacity - len(self._free)

    @property
    def n_free(self) -> int:
        """Number of free slots."""
        return len(self._free)

    def match_prefix(
        self, tokens: Sequence[int], start: TrieNode | None = None
    ) -> tuple[TrieNode, int]:
        """Deepest node on the path of ``tokens`` below ``start`` (default the root).

        Returns ``(node, n)``: ``n`` tokens of ``tokens`` matched below ``start``.
        No side effects.
        """
        node = self.root if start is None else start
        n = 0
        children = node.children
        for t in tokens:
            child = children.get(t)
            if child is None:
                break
            node, children, n = child, child.children, n + 1
        return node, n

    def nodes(self) -> Iterator[TrieNode]:
        """All non-root nodes, depth first."""
        stack = list(self.root.children.values())
        while stack:
            node = stack.pop()
            yield node
            stack.extend(node.children.values())

    def is_evictable(self, node: TrieNode) -> bool:
        """True if ``node`` is an unlocked leaf (not the root)."""
        return node.depth > 0 and not node.children and node.lock_ref == 0 and node.alive

    # ------------------------------------------------------------------ updates
    def tick(self) -> int:
        """Advance and return the logical clock (one tick per served batch)."""
        self._clock += 1
        return self._clock

    def touch(self, node: TrieNode) -> None:
        """Mark ``node`` (and, lazily, its path) as used now."""
        node.last_used = self._clock

    def lock(self, node: TrieNode) -> None:
        """Protect ``node`` and its whole path from eviction until :meth:`unlock`."""
        node.lock_ref += 1
        self._locked.add(node)

    def unlock(self, node: TrieNode) -> None:
        """Release one :meth:`lock` of ``node``."""
        if node.lock_ref <= 0:
            raise RuntimeError(f"unlock of an unlocked node {node!r}")
        node.lock_ref -= 1
        if node.lock_ref == 0:
            self._locked.discard(node)

    def insert(self, parent: TrieNode, tokens: Sequence[int]) -> list[TrieNode]:
        """Create nodes for ``tokens`` below ``parent``, reusing existing children.

        Returns the nodes along the path (existing or new). Each new node takes a
        free slot; raises ``MemoryError`` if none is left (nothing is evicted here).
        """
        if not parent.alive and parent is not self.root:
            raise ValueError("cannot insert below an evicted node")
        path = []
        node = parent
        for t in tokens:
            child = node.children.get(t)
            if child is None:
                if not self._free:
                    raise MemoryError(
                        f"no free KV slot (capacity {self.capacity}); call make_room first"
                    )
                child = TrieNode(t, node, node.depth + 1, self._free.pop())
                child.last_used = self._clock
                if not node.children:
                    self._leaves.discard(node)
                node.children[t] = child
                self._leaves.add(child)
            node = child
            path.append(node)
        return path

    def remove(self, node: TrieNode) -> int:
        """Remove leaf ``node`` and free its slot; returns the slot. Ignores locks."""
        if node.children:
            raise ValueError(f"only leaves can be removed, {node!r} has children")
        if not node.alive:
            raise ValueError(f"{node!r} was already removed")
        parent = node.parent
        assert parent is not None
        del parent.children[node.token]
        self._leaves.discard(node)
        if parent.depth > 0 and not parent.children:
            self._leaves.add(parent)
            if node.last_used > parent.last_used:
                parent.last_used = node.last_used
        slot = node.slot
        self._free.append(slot)
        node.slot, node.parent, node.hidden = -1, None, None
        if node.lock_ref:
            node.lock_ref = 0
            self._locked.discard(node)
        return slot

    def make_room(self, n: int) -> bool:
        """Evict LRU unlocked leaves until ``n`` slots are free.

        Returns True on success. If fewer than ``n`` slots can be freed, evicts
        nothing and returns False.
        """
        need = n - len(self._free)
        if need <= 0:
            return True
        if need > self._evictable_count():
            return False
        heap = [
            (leaf.last_used, leaf.depth, id(leaf), leaf)
            for leaf in self._leaves
            if leaf.lock_ref == 0
        ]
        heapq.heapify(heap)
        while need > 0:
            _, _, _, leaf = heapq.heappop(heap)
            parent = leaf.parent
            self.remove(leaf)
            self.evictions += 1
            need -= 1
            if parent is not None and self.is_evictable(parent):
                heapq.heappush(heap, (parent.last_used, parent.depth, id(parent), parent))
        return True

    def _evictable_count(self) -> int:
        """Number of nodes that repeated leaf eviction could free (no locked descendant)."""
        # A node is freeable iff its subtree holds no locked node: the locked
        # nodes and their ancestors are blocked, everything else can go.
        blocked: set[int] = set()
        for node in self._locked:
            p: TrieNode | None = node
            while p is not None and p.depth > 0 and id(p) not in blocked:
                blocked.add(id(p))
                p = p.parent
        return len(self) - len(blocked)

    def clear(self) -> None:
        """Drop every node (locks included) and free all slots."""
        for node in list(self.nodes()):
            node.slot, node.parent, node.hidden = -1, None, None
            node.children, node.lock_ref = {}, 0
        self.root.children = {}
        self._free = list(range(self.capacity - 1, -1, -1))
        self._leaves.clear()
        self._locked.clear()
