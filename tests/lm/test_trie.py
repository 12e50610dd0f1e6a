"""Token trie without a model: matching, insertion, slots, LRU eviction, locks."""

from __future__ import annotations

import random

import pytest

from llamppl.lm.trie import TokenTrie


def check_invariants(trie: TokenTrie) -> None:
    nodes = list(trie.nodes())
    slots = [n.slot for n in nodes]
    assert len(slots) == len(set(slots)) == len(trie)
    assert all(0 <= s < trie.capacity for s in slots)
    assert len(trie) + trie.n_free == trie.capacity
    assert set(slots).isdisjoint(trie._free)
    for n in nodes:
        assert n.parent.children[n.token] is n
        assert n.depth == n.parent.depth + 1
    assert trie._leaves == {n for n in nodes if not n.children}


def test_match_and_insert():
    trie = TokenTrie(capacity=10)
    assert trie.match_prefix([1, 2, 3]) == (trie.root, 0)
    path = trie.insert(trie.root, [1, 2, 3])
    assert [n.token for n in path] == [1, 2, 3]
    assert [n.slot for n in path] == [0, 1, 2]  # lowest slots first
    node, n = trie.match_prefix([1, 2, 9])
    assert (node, n) == (path[1], 2)
    assert trie.match_prefix([1, 2, 3, 4]) == (path[2], 3)
    assert path[2].tokens() == (1, 2, 3)
    assert path[2].path_slots() == [0, 1, 2]
    # inserting a shared prefix reuses nodes
    path2 = trie.insert(trie.root, [1, 2, 5])
    assert path2[:2] == path[:2] and len(trie) == 4
    # start below a node
    assert trie.match_prefix([3], start=path[1]) == (path[2], 1)
    check_invariants(trie)


def test_insert_without_room_raises():
    trie = TokenTrie(capacity=2)
    trie.insert(trie.root, [1, 2])
    with pytest.raises(MemoryError):
        trie.insert(trie.root, [3])


def test_lru_evicts_oldest_leaf_first():
    trie = TokenTrie(capacity=5)
    trie.tick()
    a = trie.insert(trie.root, [1, 2])  # t=1
    trie.tick()
    b = trie.insert(a[0], [3])  # t=2: [1, 3]
    trie.tick()
    c = trie.insert(trie.root, [4, 5])  # t=3
    assert trie.n_free == 0
    assert trie.make_room(1)
    assert not a[1].alive and b[0].alive  # [1, 2] was the oldest leaf
    trie.tick()
    trie.touch(b[0])  # [1, 3] is now the newest
    assert trie.make_room(3)  # two more: [4, 5] then [4] (it became a leaf, t=3) before [1, 3]
    assert not c[1].alive and not c[0].alive and b[0].alive and a[0].alive
    assert trie.make_room(5)  # [1, 3] and then [1]
    assert len(trie) == 0
    check_invariants(trie)


def test_parent_inherits_recency_of_evicted_child():
    trie = TokenTrie(capacity=4)
    trie.tick()
    p = trie.insert(trie.root, [1, 2])  # t=1
    trie.tick()
    q = trie.insert(trie.root, [7])  # t=2
    trie.tick()
    trie.touch(p[1])  # t=3 on the leaf only
    trie.remove(p[1])
    # [1] inherits t=3, so [7] (t=2) is older
    assert p[0].last_used == 3
    assert trie.make_room(trie.n_free + 1)
    assert not q[0].alive and p[0].alive


def test_locked_nodes_and_their_paths_survive():
    trie = TokenTrie(capacity=4)
    path = trie.insert(trie.root, [1, 2, 3])
    other = trie.insert(trie.root, [9])
    trie.lock(path[2])
    assert not trie.make_room(2)  # only [9] is evictable: nothing is evicted
    assert other[0].alive and len(trie) == 4
    assert trie.make_room(1) and not other[0].alive
    assert all(n.alive for n in path)
    trie.unlock(path[2])
    assert trie.make_room(4) and len(trie) == 0
    with pytest.raises(RuntimeError):
        trie.unlock(path[2])


def test_lock_of_internal_node_protects_ancestors_only():
    trie = TokenTrie(capacity=3)
    path = trie.insert(trie.root, [1, 2, 3])
    trie.lock(path[1])
    assert not trie.make_room(3)
    assert trie.make_room(1)  # [1, 2, 3] can go, [1, 2] stays
    assert not path[2].alive and path[1].alive and path[0].alive
    trie.unlock(path[1])


def test_remove_only_leaves():
    trie = TokenTrie(capacity=3)
    path = trie.insert(trie.root, [1, 2])
    with pytest.raises(ValueError):
        trie.remove(path[0])
    assert trie.remove(path[1]) == 1
    with pytest.raises(ValueError):
        trie.remove(path[1])
    with pytest.raises(ValueError):
        trie.insert(path[1], [4])


def test_clear():
    trie = TokenTrie(capacity=3)
    path = trie.insert(trie.root, [1, 2])
    trie.lock(path[1])
    trie.clear()
    assert len(trie) == 0 and trie.n_free == 3 and not path[0].alive
    assert trie.make_room(3)
    check_invariants(trie)


@pytest.mark.parametrize("capacity", [0, -3, 2.5, True, "8"])
def test_bad_capacity(capacity):
    with pytest.raises(ValueError, match="capacity"):
        TokenTrie(capacity)


def test_random_workload_keeps_invariants_and_bound():
    """Simulated SMC: particles grow by one token, are duplicated/dropped; never over capacity."""
    rng = random.Random(0)
    trie = TokenTrie(capacity=60)
    particles = [(3, 1, 4)] * 8
    for _ in range(40):
        trie.tick()
        contexts = [p + (rng.randrange(5),) for p in particles]
        matched = []
        for c in contexts:
            node, n = trie.match_prefix(c)
            trie.lock(node)
            matched.append((node, n, c))
        need = len({c[:k] for _, n, c in matched for k in range(n + 1, len(c) + 1)})
        if trie.make_room(need):
            for node, n, c in matched:
                for new in trie.insert(node, c[n:]):
                    trie.touch(new)
        for node, _, _ in matched:
            trie.unlock(node)
        assert len(trie) <= trie.capacity
        check_invariants(trie)
        particles = [rng.choice(contexts) for _ in contexts]  # resample
        if len(particles[0]) > 12:  # keep within capacity: restart from a new prompt
            particles = [(rng.randrange(5),)] * 8
    assert trie.evictions > 0
