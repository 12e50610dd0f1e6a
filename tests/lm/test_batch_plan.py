"""Row planning, tree masks and the cache budget of CachedCausalLM, on a bare trie (no model).

The expected layouts are worked out by hand from the module docstrings of
``llamppl.lm.hf.batch_plan`` and ``llamppl.lm.hf.tree_mask``.
"""

import pytest
import torch

from llamppl.lm.hf.batch_plan import (
    Request,
    common_ancestor,
    count_new_tokens,
    group_paths,
    plan_rows,
    shared_prefix,
)
from llamppl.lm.hf.tree_mask import tree_mask
from llamppl.lm.hf.trie_cache import TrieCache
from llamppl.lm.trie import TokenTrie

SCRATCH = 99


def _requests(trie, contexts):
    out = []
    for i, c in enumerate(contexts):
        node, m = trie.match_prefix(c)
        out.append(Request(i, c, node, m))
    return out


def _planned():
    """Cached 5 7 (slots 0, 1); requests: two extensions of it and a fresh branching prompt."""
    trie = TokenTrie(16)
    trie.insert(trie.root, [5, 7])
    requests = _requests(trie, [(5, 7, 9), (5, 7, 8, 3), (4, 6), (4, 2)])
    n_new = count_new_tokens(requests)
    paths = [trie.insert(r.matched, r.suffix) for r in requests]
    groups, bases = group_paths([r.matched for r in requests], paths)
    return n_new, groups, bases, plan_rows(groups, bases, SCRATCH)


def test_requests_are_grouped_by_the_node_they_hang_from_and_counted_once():
    n_new, groups, bases, _ = _planned()
    assert n_new == 6  # 9 | 8 3 | 4 6 2: the shared 4 is one node
    assert [[n.token for n in g] for g in groups] == [[9], [8, 3], [4, 6, 2]]
    assert [b.depth for b in bases] == [2, 2, 0]


def test_row_layout_left_pads_prefixes_and_new_tokens():
    *_, plan = _planned()
    assert (plan.B, plan.T, plan.P) == (3, 3, 2)
    assert plan.ids == [0, 0, 9, 0, 8, 3, 4, 6, 2]
    assert plan.pos == [0, 0, 2, 0, 2, 3, 0, 1, 1]  # a token's position is its depth - 1
    # per row: P prefix columns (cached path, left padded) then T new columns (left padded)
    assert plan.read == [0, 1, SCRATCH, SCRATCH, 2] + [0, 1, SCRATCH, 3, 4] + [
        SCRATCH,
        SCRATCH,
        5,
        6,
        7,
    ]
    assert plan.src == [2, 4, 5, 6, 7, 8] and plan.dst == [2, 3, 4, 5, 6, 7]
    # only the branching group needs an ancestry matrix: 4 -> 6, 4 -> 2
    assert plan.trees == [(2, 3)]
    assert plan.ancestry == [1, 0, 0, 1, 1, 0, 1, 0, 1]


def test_tree_mask_sees_the_real_prefix_and_ancestors_only():
    *_, plan = _planned()
    t_t, p_t = torch.tensor(plan.t_len), torch.tensor(plan.p_len)
    mask = tree_mask(plan.T, plan.P, t_t, p_t, plan.trees, torch.tensor(plan.ancestry))
    assert mask.shape == (3, 3, 5)
    # row 0: the new token (column 4) sees the cached 5 7 and itself; padding queries see themselves
    assert mask[0, 2].tolist() == [True, True, False, False, True]
    assert mask[0, 0].tolist() == [True, True, True, False, False]
    # row 1: a chain, 3 sees 8
    assert mask[1, 2].tolist() == [True, True, False, True, True]
    # row 2: no cached prefix; 2 sees 4 and itself but not its sibling 6
    assert mask[2, 2].tolist() == [False, False, True, False, True]
    assert mask[2, 1].tolist() == [False, False, True, True, False]


def _cache(capacity):
    return TrieCache(
        capacity,
        n_layers=1,
        n_kv_heads=1,
        head_dim=2,
        v_head_dim=2,
        dtype=torch.float32,
        device=torch.device("cpu"),
        layer_devices=[torch.device("cpu")],
    )


def test_cache_budget_default_rollback_and_splitting():
    assert _cache(None).capacity == (1 << 30) // (2 * 2 * 4)  # as many tokens as fit in 1 GiB
    with pytest.raises(ValueError, match="max_cache_tokens"):
        _cache(0)
    cache = _cache(4)
    requests = _requests(cache.trie, [(1, 2), (1, 3)])
    assert cache.reserve(requests, count_new_tokens(requests))
    with pytest.raises(RuntimeError, match="forward failed"):
        with cache.insert(requests) as paths:
            assert len(cache.trie) == 3
            raise RuntimeError("forward failed")
    assert len(cache.trie) == 0 and paths  # no node without K/V stays

    served = []

    def serve_part(part):  # at most two contexts fit
        if len(part) > 2:
            return False
        served.append(part)
        return True

    cache.serve_in_parts([(1,)] * 5, serve_part)
    assert served == [[0, 1], [2], [3, 4]]
    with pytest.raises(ValueError, match="max_cache_tokens=4 is too small for a context of 9"):
        cache.serve_in_parts([tuple(range(9))], lambda part: False)


def test_shared_prefix_is_the_common_path_and_rows_leave_it_out():
    """Bases 5 7 9 and 5 7 8 share 5 7 (slots 0, 1: contiguous); rows hold only the rest."""
    trie = TokenTrie(16)
    a = trie.insert(trie.root, [5, 7, 9])[-1]  # slots 0 1 2
    b = trie.insert(a.parent, [8])[-1]  # slot 3
    assert common_ancestor([a, b]).tokens() == (5, 7)
    assert shared_prefix([a, b]) == (2, [0, 1], 0)
    assert shared_prefix([a]) == (0, [], None)  # one row: nothing to share
    c = trie.insert(trie.root, [4])[-1]
    assert shared_prefix([a, c]) == (0, [], None)  # no common token
    new = [trie.insert(a, [1]), trie.insert(b, [2, 6])]
    groups, bases = group_paths([a, b], new)
    plan = plan_rows(groups, bases, SCRATCH, shared=2)
    assert (plan.P, plan.T, plan.p_len) == (1, 2, [1, 1])
    # per row: the key past the shared 5 7, then the new tokens (left padded)
    assert plan.read == [2, SCRATCH, 5] + [3, 6, 7]
    assert plan.pos == [0, 3, 3, 4]  # positions still count the shared prefix


def test_shared_prefix_reports_scattered_slots():
    """A common path whose slots are not consecutive is read with its slot list."""
    trie = TokenTrie(16)
    p = trie.insert(trie.root, [5, 7])[-1]  # slots 0 1
    trie.insert(trie.root, [4])  # slot 2
    q = trie.insert(p, [9])[-1]  # slot 3: the path 5 7 9 is slots 0 1 3
    r, s = trie.insert(q, [1])[-1], trie.insert(q, [2])[-1]
    assert shared_prefix([r, s]) == (3, [0, 1, 3], None)
