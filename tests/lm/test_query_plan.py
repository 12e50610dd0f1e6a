"""The batch-invariant layout on a bare trie (no model): the linear layers' row calls
(``llamppl.lm.hf.batch_plan``) and every new token's own keys (``llamppl.lm.hf.query_plan``:
whole contexts, and fixed absolute key blocks shared between queries). Expected values are
worked out by hand from the module docstrings."""

from llamppl.lm.hf.batch_plan import (
    FixedCalls,
    PaddedCalls,
    Request,
    group_paths,
    pack_rows,
    pack_tokens,
    plan_rows,
)
from llamppl.lm.hf.query_plan import KEY_BLOCK, key_blocks, key_width, plan_blocks, plan_queries
from llamppl.lm.trie import TokenTrie

SCRATCH = 99


def _grouped():
    """Cached 5 7 (slots 0, 1); new: 9 below it, a chain 8 3 below it, a fresh tree 4 6 | 4 2."""
    trie = TokenTrie(16)
    trie.insert(trie.root, [5, 7])
    contexts = [(5, 7, 9), (5, 7, 8, 3), (4, 6), (4, 2)]
    requests = [Request(i, c, *trie.match_prefix(c)) for i, c in enumerate(contexts)]
    paths = [trie.insert(r.matched, r.suffix) for r in requests]
    return group_paths([r.matched for r in requests], paths)


def _planned():
    groups, bases = _grouped()
    plan = plan_rows(groups, bases, SCRATCH)
    return [node for g in groups for node in g], plan


def test_every_query_reads_its_whole_context_from_position_zero_end_padded():
    nodes, plan = _planned()
    qp = plan_queries(nodes, plan.src, SCRATCH)
    # nodes 9 8 3 4 6 2 have slots 2..7; all contexts (1-4 keys) fit one bucket
    assert qp.buckets == [(6, KEY_BLOCK)]
    assert qp.src == plan.src == [2, 4, 5, 6, 7, 8]
    assert qp.n_keys == [3, 3, 4, 1, 2, 2]
    lists = [qp.slots[k * KEY_BLOCK : (k + 1) * KEY_BLOCK] for k in range(6)]
    real = [[0, 1, 2], [0, 1, 3], [0, 1, 3, 4], [5], [5, 6], [5, 7]]  # a tree: 2 sees 4, not 6
    for keys, want in zip(lists, real):
        assert keys == want + [SCRATCH] * (KEY_BLOCK - len(want))


def test_queries_are_bucketed_by_width_and_large_buckets_split():
    trie = TokenTrie(256)
    n = 2 * KEY_BLOCK + 2  # a prompt: widths B (tokens 1..B), 2B (B+1..2B), 3B (the last two)
    path = trie.insert(trie.root, list(range(n)))
    B = KEY_BLOCK
    qp = plan_queries(path, list(range(n)), SCRATCH, max_slots=3 * B)  # at most 3B slots a call
    want = [(3, B)] * (B // 3) + [(B % 3, B)] * (B % 3 > 0) + [(1, 2 * B)] * B + [(1, 3 * B)] * 2
    assert qp.buckets == want and all(c * w <= 3 * B for c, w in qp.buckets)
    assert sum(c for c, _ in qp.buckets) == n
    widths = [w for c, w in qp.buckets for _ in range(c)]
    assert widths == [key_width(n) for n in qp.n_keys] and widths == sorted(widths)
    assert sorted(qp.n_keys) == list(range(1, n + 1))
    assert len(qp.slots) == sum(c * w for c, w in qp.buckets)


def test_key_width_and_row_calls():
    B = KEY_BLOCK
    assert [key_width(n) for n in (1, B - 1, B, B + 1, 2 * B, 2 * B + 1)] == [B, B, B] + [
        2 * B,
        2 * B,
        3 * B,
    ]
    padded = PaddedCalls(6)
    assert [padded.rows(n) for n in (1, 5, 6, 7, 12, 13, 1000)] == [6, 6, 6, 12, 12, 18, 1002]
    assert padded.calls(1000) == [(0, 1000)]
    fixed = FixedCalls(48)
    assert fixed.calls(100) == [(0, 48), (48, 96), (96, 100)]
    assert {fixed.rows(n) for n in (1, 4, 48)} == {48}


def test_pack_rows_widens_the_rows_to_a_multiple_of_the_row_block():
    trie = TokenTrie(16)
    (node,) = trie.insert(trie.root, [5])
    plan = pack_rows([[node]], multiple=6)  # one token: a row of 6 columns, left padded
    assert (plan.B, plan.T, plan.P, plan.t_len) == (1, 6, 0, [1])
    assert plan.ids == [0] * 5 + [5] and plan.src == [5]
    groups, _ = _grouped()  # groups of 1, 2, 3 tokens in rows of at most 3: B = 2, T = 3 -> 6
    small = pack_rows(groups, row_tokens=3, multiple=6)
    assert (small.B, small.T) == (2, 3)
    small = pack_rows(groups, row_tokens=2, multiple=6)  # rows [1], [2], [3]: B = 3, T = 4
    assert (small.B, small.T) == (3, 4) and (small.B * small.T) % 6 == 0


def test_pack_tokens_is_one_left_padded_row_of_the_call_width():
    groups, _ = _grouped()
    nodes = [node for g in groups for node in g]
    plan = pack_tokens(nodes[2:5], 8)
    assert (plan.B, plan.T, plan.t_len) == (1, 8, [3])
    assert plan.src == [5, 6, 7] and plan.dst == [n.slot for n in nodes[2:5]]
    assert [plan.ids[i] for i in plan.src] == [n.token for n in nodes[2:5]]
    calls = FixedCalls(4).plans(groups)  # 6 tokens: calls of 4 and 2 (padded to 4)
    assert [len(n) for n, _ in calls] == [4, 2] and [p.T for _, p in calls] == [4, 4]
    assert [n for ns, _ in calls for n in ns] == nodes


def test_pack_rows_puts_whole_groups_side_by_side_and_keeps_their_order():
    groups, bases = _grouped()
    nodes = [node for g in groups for node in g]
    per_row = plan_rows(groups, bases, SCRATCH)
    assert per_row.B * per_row.T == 9  # three rows as wide as the 3-token tree: 3 of 9 padding
    packed = pack_rows(groups)  # groups of 1, 2 and 3 tokens: one row of 6, no padding
    assert (packed.B, packed.T, packed.P, packed.t_len) == (1, 6, 0, [6])
    assert packed.src == list(range(6)) and packed.dst == [n.slot for n in nodes]
    assert packed.ids == [n.token for n in nodes] and packed.pos == [n.depth - 1 for n in nodes]
    assert packed.trees == [] and packed.ancestry == []
    # rows of at most 3 tokens: the groups fill rows in order, a row left padded
    small = pack_rows(groups, row_tokens=3)
    assert [len(g) for g in groups] == [1, 2, 3] and small.t_len == [3, 3]
    assert [small.ids[i] for i in small.src] == [n.token for n in nodes]
    assert all(small.ids[i] == 0 for i in range(small.B * small.T) if i not in small.src)
    # the per-query key lists do not depend on the layout, only the flat indices move
    a = plan_queries(nodes, per_row.src, SCRATCH)
    b = plan_queries(nodes, packed.src, SCRATCH)
    assert (a.n_keys, a.slots, a.buckets) == (b.n_keys, b.slots, b.buckets)


def test_pack_rows_gives_a_group_longer_than_a_row_its_own_row():
    trie = TokenTrie(64)
    long = trie.insert(trie.root, list(range(1, 11)))  # a 10-token prompt
    short = trie.insert(trie.root, [20])
    plan = pack_rows([long, short], row_tokens=4)
    assert (plan.B, plan.T, plan.t_len) == (2, 10, [10, 1])
    assert plan.src == list(range(10)) + [19]  # the 1-token row is left padded to 10 columns


def _blocks_of(plan, q: int) -> list[tuple[int, bool, list[int], int]]:
    """Query ``q``'s ``(step, masked, slots, visible)`` in merge order, read off the calls."""
    out = []
    for c in plan.calls:
        if q not in c.queries:
            continue
        i, w = c.queries.index(q), c.width
        if c.shared:
            slots = list(range(c.start, c.start + w)) if c.start >= 0 else c.slots
        else:
            slots = c.slots[w * i : w * (i + 1)]
        out.append((c.step, c.masked, slots, c.visible[i] if c.masked else w))
    return sorted(out)


def test_key_blocks_are_power_of_two_runs_then_the_last_block():
    assert key_blocks(1, 4) == [(0, 4)] and key_blocks(4, 4) == [(0, 4)]
    assert key_blocks(5, 4) == [(0, 4), (4, 4)]
    assert key_blocks(4 * 13 + 1, 4) == [(0, 32), (32, 16), (48, 4), (52, 4)]  # 13 = 8 + 4 + 1
    # a run's place in the merge order is the popcount of its start: the same for every query
    for n in range(1, 200):
        runs = key_blocks(n, 4)
        assert [bin(a // 4).count("1") for a, _ in runs] == list(range(len(runs)))
        assert all(a % w == 0 for a, w in runs[:-1]) and sum(w for _, w in runs[:-1]) == runs[-1][0]


def test_key_blocks_cut_every_context_at_fixed_absolute_positions():
    """Blocks of 4 keys: a 10-token prompt's tokens and two rows below it (slots 10, 11)."""
    trie = TokenTrie(64)
    prompt = trie.insert(trie.root, list(range(1, 11)))  # slots 0..9
    rows = [trie.insert(prompt[-1], [20 + i])[0] for i in range(2)]  # slots 10, 11
    plan = plan_blocks(prompt, list(range(10)), scratch=63, split=4)
    # token 6 (7 keys): the run [0..3], then block 1 of which it sees 3 keys; the block's
    # fourth column holds the next prompt token (slot 7), masked for this query
    assert _blocks_of(plan, 6) == [(0, False, [0, 1, 2, 3], 4), (1, True, [4, 5, 6, 7], 3)]
    # the last token (10 keys): one run of 8 keys, then [8, 9] and scratch, 2 seen
    assert _blocks_of(plan, 9) == [(0, False, list(range(8)), 8), (1, True, [8, 9, 63, 63], 2)]
    # every run is read once, by one shared call, a view of the pool (contiguous)
    full = [c for c in plan.calls if not c.masked]
    assert [(c.width, len(c.queries), c.start) for c in full] == [(4, 4, 0), (8, 2, 0)]
    # the prompt's tokens of one block share their last block too (the same slots)
    last = sorted((c.step, c.queries, c.visible) for c in plan.calls if c.masked)
    assert last == [
        (0, [0, 1, 2, 3], [1, 2, 3, 4]),
        (1, [4, 5, 6, 7], [1, 2, 3, 4]),
        (1, [8, 9], [1, 2]),
    ]
    # two rows below the cached prompt: the run is a shared view, the last blocks (8 9 and
    # the row's own token) are each row's own, gathered in one call
    below = plan_blocks(rows, [0, 1], scratch=63, split=4)
    assert [(c.step, c.width, c.masked, c.shared) for c in below.calls] == [
        (0, 8, False, True),
        (1, 4, True, False),
    ]
    assert below.calls[-1].slots == [8, 9, 10, 63, 8, 9, 11, 63]
    assert below.calls[-1].visible == [3, 3] and below.steps == 2


def test_key_blocks_do_not_depend_on_the_company():
    """A query's blocks (slots seen, merge order) are the same alone and beside others."""
    trie = TokenTrie(256)
    prompt = trie.insert(trie.root, list(range(1, 30)))
    target = trie.insert(prompt[-1], [200, 201])  # two new tokens below the prompt
    others = [trie.insert(prompt[i], [100 + i]) for i in (3, 12, 20, 28)]
    alone = plan_blocks(target, [0, 1], scratch=255, split=8)
    nodes = [n for g in others for n in g] + target
    mixed = plan_blocks(nodes, list(range(len(nodes))), scratch=255, split=8)
    for k in (0, 1):
        a = [(s, m, sl[:v], v) for s, m, sl, v in _blocks_of(alone, k)]
        b = [(s, m, sl[:v], v) for s, m, sl, v in _blocks_of(mixed, len(others) + k)]
        assert a == b
