"""Masked row reads: the pending mask of ``LMContext`` is applied inside the batched read.

``sample_row(row, rng, mask)`` draws from the row restricted to ``mask`` and
renormalised (LLaMPPL §2.2, proposal M'), ``gather_row(row, i, mask)`` and
``row_masses(row, mask, within)`` read the same renormalised row, all for every
particle of a round in one ``[N, V]`` computation. The draws must be
:func:`~llamppl.row_sampling.sample_index`'s on the masked ``log_softmax`` with the same
uniform, the log-normaliser exactly ``logsumexp`` over the allowed entries, and the
DSL builds no masked log-softmax per particle.
"""

from __future__ import annotations

import asyncio
import math

import numpy as np
import pytest
import torch
from torch.overrides import TorchFunctionMode

from inference import enumerate_exact, smc_standard
from llamppl import LMContext, Model, run
from llamppl.row_sampling import gather_row, row_masses, sample_index, sample_row, serve_rows
from tests.core.test_host_syncs import MaskedTokens, SyncCounter
from tests.inference.programs import toy_lm


def masked_log_softmax(row: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """The old per-particle computation: the row restricted to ``mask``, renormalised."""
    return torch.log_softmax(row.masked_fill(~mask, -math.inf), dim=-1)


def random_rows(n: int, v: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    rows = torch.log_softmax(3 * torch.randn(n, v, generator=gen), dim=-1)
    rows[:, ::7] = -math.inf  # some impossible ids
    masks = torch.rand(n, v, generator=gen) < 0.4
    masks[:, 1] = True  # every mask allows an id of positive probability
    return rows, masks


def test_masked_draw_is_sample_index_of_the_masked_row() -> None:
    rows, masks = random_rows(64, 500, seed=3)
    a, b = np.random.default_rng(11), np.random.default_rng(11)
    with SyncCounter() as counter:
        batched = serve_rows([("sample_in", r, (a, m)) for r, m in zip(rows, masks)])
    assert counter.count == 1  # 64 masked draws, one host read
    for (i, lp), r, m in zip(batched, rows, masks):
        expected = masked_log_softmax(r, m)
        assert i == sample_index(expected, b)  # the same draw for the same uniform
        assert bool(m[i]) and r[i] > -math.inf
        # log-prob = x_i - logsumexp(x[mask]), the masked log-normaliser
        assert lp == pytest.approx(float(r[i]) - float(torch.logsumexp(r[m], 0)), abs=1e-5)


def test_a_mixed_round_takes_its_uniforms_in_submission_order() -> None:
    rows, masks = random_rows(12, 300, seed=4)
    plain = [k % 3 == 0 for k in range(12)]  # every third particle has no pending mask
    a, b = np.random.default_rng(5), np.random.default_rng(5)
    requests = [
        ("sample", r, a) if p else ("sample_in", r, (a, m)) for r, m, p in zip(rows, masks, plain)
    ]
    out = serve_rows(requests)
    for (i, _), r, m, p in zip(out, rows, masks, plain):
        assert i == sample_index(r if p else masked_log_softmax(r, m), b)


def test_masked_draw_has_the_masked_law() -> None:
    rows, masks = random_rows(3, 6, seed=5)
    rows[0] = torch.tensor([0.0, -0.5, -1.0, -1.5, -2.0, -2.5])
    m = 4000
    rng = np.random.default_rng(7)
    requests = [("sample_in", rows[b], (rng, masks[b])) for b in range(3) for _ in range(m)]
    out = serve_rows(requests)
    ids = np.array([i for i, _ in out]).reshape(3, m)
    for b in range(3):
        probs = masked_log_softmax(rows[b], masks[b]).exp().double().numpy()
        freq = np.bincount(ids[b], minlength=6) / m
        se = np.sqrt(probs * (1 - probs) / m)
        assert np.all(np.abs(freq - probs) <= 4 * se + 1e-12), (b, freq, probs)
        assert np.all(freq[probs == 0] == 0)  # outside the mask or impossible: never drawn


def test_a_mask_far_below_the_row_maximum_does_not_underflow() -> None:
    # Allowed ids 1 and 2 lie e^-200 below the maximum: exp(x - max x) is 0 in float32.
    row = torch.tensor([0.0, -200.0, -201.0, -3.0])
    mask = torch.tensor([False, True, True, False])
    m = 2000
    out = serve_rows([("sample_in", row, (np.random.default_rng(1), mask))] * m)
    p1 = 1 / (1 + math.exp(-1.0))  # P(1) = e^-200 / (e^-200 + e^-201)
    freq = sum(i == 1 for i, _ in out) / m
    assert {i for i, _ in out} <= {1, 2}
    assert abs(freq - p1) <= 4 * math.sqrt(p1 * (1 - p1) / m)
    lp = dict(out)
    assert lp[1] == pytest.approx(math.log(p1), abs=1e-6)
    assert lp[2] == pytest.approx(math.log(1 - p1), abs=1e-6)


def test_masked_gather_and_conditional_masses() -> None:
    rows, masks = random_rows(8, 50, seed=9)
    within = torch.rand(8, 50, generator=torch.Generator().manual_seed(2)) < 0.7
    within[:, 1] = True
    rng = np.random.default_rng(0)
    ids = rng.integers(0, 50, size=8)
    requests = [("gather_in", r, (int(i), m)) for r, m, i in zip(rows, masks, ids)]
    requests += [("masses_in", r, (m, w)) for r, m, w in zip(rows, masks, within)]
    with SyncCounter() as counter:
        out = serve_rows(requests)
    assert counter.count == 1
    for k in range(8):
        lsm = masked_log_softmax(rows[k], masks[k])
        assert out[k] == pytest.approx(float(lsm[ids[k]]), abs=1e-5)  # -inf outside the mask
        old = masked_log_softmax(rows[k], within[k])  # P(mask | m0) read from the old row
        inside = float(torch.logsumexp(old[masks[k]], 0))
        outside = float(torch.logsumexp(old[~masks[k]], 0))
        assert out[8 + k] == pytest.approx((inside, outside), abs=1e-5)


def test_bad_masks_are_refused() -> None:
    row = torch.zeros(4)

    async def main(mask):
        return await sample_row(row, np.random.default_rng(0), mask)

    with pytest.raises(TypeError, match="mask must be a bool tensor"):
        asyncio.run(main(torch.ones(4)))
    with pytest.raises(ValueError, match=r"mask must have the row's shape \(4,\)"):
        asyncio.run(main(torch.ones(3, dtype=torch.bool)))
    with pytest.raises(TypeError, match="within must be a bool tensor"):
        asyncio.run(row_masses(row, torch.ones(4, dtype=torch.bool), [1, 2]))
    with pytest.raises(ValueError, match="mask must have the row's shape"):
        asyncio.run(gather_row(row, 0, torch.ones(5, dtype=torch.bool)))


class TwoMasks(Model):
    """Observe two masks (A, then B given A), then sample the token from the LM on A ∩ B."""

    def __init__(self, lm) -> None:
        super().__init__()
        self.context = LMContext(lm, [0])

    async def step(self) -> None:
        await self.observe(self.context.mask_dist([0, 1, 2]), True)
        await self.observe(self.context.mask_dist([1, 2, 3]), True)
        self.token = int(await self.sample(self.context.next_token()))
        self.finish()


def test_smc_on_successive_masks_matches_enumerate_exact() -> None:
    lm = toy_lm()
    exact = run(enumerate_exact(TwoMasks(lm)))
    post = {q.token: w for q, w in zip(exact.particles, exact.weights)}
    n = 3000
    result = run(smc_standard(TwoMasks(lm), n, seed=0))
    # every particle's weight is log P(A) + log P(B | A) = log P(A ∩ B): Ẑ is exact
    assert result.log_ml == pytest.approx(exact.log_ml, abs=1e-6)
    tokens = np.array([p.token for p in result.particles])
    for token, p in post.items():
        freq = float(np.mean(tokens == token))
        assert abs(freq - p) <= 4 * math.sqrt(p * (1 - p) / n), (token, freq, p)
    assert set(tokens.tolist()) <= set(post)


class OpCounter(TorchFunctionMode):
    """Counts masked log-softmax work: ``log_softmax`` and ``masked_fill`` calls."""

    NAMES = ("log_softmax", "masked_fill", "masked_fill_")

    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if getattr(func, "__name__", "") in self.NAMES:
            self.count += 1
        return func(*args, **(kwargs or {}))


def test_masked_proposal_work_does_not_grow_with_n() -> None:
    """Per step, the LM's batched log-softmax only: no masked log-softmax per particle."""

    def ops_per_step(n: int, steps: int = 4) -> float:
        with OpCounter() as counter:
            asyncio.run(smc_standard(MaskedTokens(toy_lm(), steps, 3, 1), n, seed=0))
        return counter.count / steps

    counts = {n: ops_per_step(n) for n in (2, 8, 32)}
    assert counts[2] == counts[8] == counts[32], counts
