"""The batch-invariant layout of ``llamppl.lm.hf.batch_plan`` on a bare trie (no model):
every new token's own key list, row padding for the linear layers. Expected values are
worked out by hand from the module docstring."""

from llamppl.lm.hf.batch_plan import (
    KEY_BLOCK,
    MIN_GEMM_ROWS,
    Request,
    gemm_rows,
    group_paths,
    key_width,
    pack_rows,
    pad_rows,
    plan_queries,
    plan_rows,
)
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


def test_key_width_and_gemm_rows():
    B = KEY_BLOCK
    assert [key_width(n) for n in (1, B - 1, B, B + 1, 2 * B, 2 * B + 1)] == [B, B, B] + [
        2 * B,
        2 * B,
        3 * B,
    ]
    assert [gemm_rows(m) for m in (1, 2, 3, 4, 100)] == [MIN_GEMM_ROWS] * 3 + [4, 100]


def test_pad_rows_adds_empty_rows_until_the_linear_layers_see_enough_tokens():
    trie = TokenTrie(8)
    (node,) = trie.insert(trie.root, [5])
    groups, bases = [[node]], [trie.root]
    plan = pad_rows(plan_rows(groups, bases, SCRATCH), SCRATCH)  # one 1-token row
    assert (plan.B, plan.T, plan.P) == (MIN_GEMM_ROWS, 1, 0)
    assert plan.ids == [5] + [0] * (MIN_GEMM_ROWS - 1)
    assert plan.t_len == [1] + [0] * (MIN_GEMM_ROWS - 1)
    assert plan.src == [0] and plan.read == [0] + [SCRATCH] * (MIN_GEMM_ROWS - 1)
    nodes, big = _planned()  # 3 rows x 3 columns: already enough
    assert pad_rows(big, SCRATCH).B == 3


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
