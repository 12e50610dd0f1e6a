"""Batched row reads (``llamppl.row_sampling.serve_rows``): exact draws, one host read per round.

The batched inverse-CDF draw must have exactly the law ``softmax(row)`` for every
row, be the very draw :func:`~llamppl.row_sampling.sample_index` makes with the same
uniform, and read the results back to the host once for the whole round.
"""

from __future__ import annotations

import asyncio
import math

import numpy as np
import torch

from llamppl.row_sampling import gather_row, row_masses, sample_index, sample_row, serve_rows
from tests.core.test_host_syncs import SyncCounter

ROWS = torch.log(
    torch.tensor(
        [
            [0.5, 0.25, 0.0, 0.125, 0.125, 0.0],
            [0.0, 0.0, 0.0, 0.0, 1.0, 0.0],
            [0.05, 0.1, 0.15, 0.2, 0.2, 0.3],
        ],
        dtype=torch.float32,
    )
)


def test_batched_draw_has_the_row_law() -> None:
    m = 4000  # draws per row, all in ONE serve call
    rng = np.random.default_rng(7)
    requests = [("sample", ROWS[b], rng) for b in range(3) for _ in range(m)]
    with SyncCounter() as counter:
        out = serve_rows(requests)
    assert counter.count == 1  # 12,000 draws, one host read
    ids = np.array([i for i, _ in out]).reshape(3, m)
    probs = ROWS.exp().double().numpy()
    for b in range(3):
        freq = np.bincount(ids[b], minlength=6) / m
        se = np.sqrt(probs[b] * (1 - probs[b]) / m)
        assert np.all(np.abs(freq - probs[b]) <= 4 * se + 1e-12), (b, freq, probs[b])
        assert np.all(freq[probs[b] == 0] == 0)  # a zero-probability id is never drawn
    for (i, lp), b in zip(out, np.repeat(np.arange(3), m)):
        assert lp == float(ROWS[b, i])


def test_batched_draw_is_sample_index_with_the_same_uniform() -> None:
    gen = torch.Generator().manual_seed(3)
    rows = torch.log_softmax(3 * torch.randn(64, 500, generator=gen), dim=-1)
    rows[:, ::7] = -math.inf  # some impossible ids
    a, b = np.random.default_rng(11), np.random.default_rng(11)
    batched = serve_rows([("sample", r, a) for r in rows])
    one_by_one = [sample_index(r, b) for r in rows]
    assert [i for i, _ in batched] == one_by_one


def test_the_uniform_at_the_top_takes_the_last_possible_id() -> None:
    class One:  # u rounds onto the very top of the CDF
        def random(self) -> float:
            return 1.0 - 1e-17

    row = torch.log(torch.tensor([0.3, 0.7, 0.0, 0.0]))
    assert serve_rows([("sample", row, One())]) == [(1, float(row[1]))]


def test_a_round_of_mixed_requests_is_one_call_and_one_read() -> None:
    rng = np.random.default_rng(0)
    mask = torch.tensor([True, False, True, False, True, False])

    async def main():
        return await asyncio.gather(
            *(sample_row(ROWS[2], rng) for _ in range(5)),
            gather_row(ROWS[0], 3),
            row_masses(ROWS[2], mask),
            sample_row(torch.log(torch.tensor([0.5, 0.5], dtype=torch.float64)), rng),
        )

    with SyncCounter() as counter:
        out = asyncio.run(main())
    assert counter.count == 2  # one read per row shape (V = 6, V = 2)
    assert out[5] == float(ROWS[0, 3])
    inside, outside = out[6]
    assert math.isclose(math.exp(inside), 0.05 + 0.15 + 0.2, rel_tol=1e-6)
    assert math.isclose(math.exp(outside), 0.1 + 0.2 + 0.3, rel_tol=1e-6)
    assert out[7][0] in (0, 1)


def test_masses_of_a_tiny_side_and_an_empty_side() -> None:
    row = torch.tensor([0.0, -200.0, -300.0, -math.inf])  # exp(-200) underflows float32
    tiny = torch.tensor([False, True, True, False])
    everything = torch.tensor([True, True, True, True])
    (inside, outside), (all_in, none_out) = serve_rows(
        [("masses", row, tiny), ("masses", row, everything)]
    )
    assert math.isclose(inside, -200.0 + math.log1p(math.exp(-100.0)), rel_tol=1e-6)
    assert outside == 0.0 and all_in == 0.0 and none_out == -math.inf
