"""Algorithm 1 down-sampling: unbiased per-candidate weights, no duplicates, N distinct particles."""

import math

import numpy as np
import pytest
from llamppl.inference import smc_steer, steer_downsample

from llamppl import FunctionLM, LMContext, Model, run


def test_downsample_is_unbiased_per_candidate():
    log_w = np.log(np.array([0.4, 0.02, 0.1, 0.05, 0.2, 0.03, 0.15, 0.05]))
    rng, reps, n = np.random.default_rng(0), 4000, 4
    kept = np.zeros((reps, log_w.size))
    for r in range(reps):
        idx, new = steer_downsample(log_w, n, rng)
        assert len(set(idx.tolist())) == len(idx) == n
        kept[r, idx] = np.exp(new)
    se = kept.std(axis=0, ddof=1) / math.sqrt(reps)
    assert np.all(np.abs(kept.mean(axis=0) - np.exp(log_w)) <= 4 * se + 1e-12)
    # the heaviest candidate (c·w >= 1) is kept deterministically with its own weight
    assert np.all(kept[:, 0] == pytest.approx(0.4))


def test_downsample_keeps_everything_when_few_candidates():
    idx, new = steer_downsample(np.array([0.0, -np.inf, -1.0]), 4, np.random.default_rng(0))
    assert idx.tolist() == [0, 2] and new.tolist() == [0.0, -1.0]


class Wide(Model):
    """Uniform choice among 6 tokens, three steps: 216 distinct extensions."""

    def __init__(self, lm):
        super().__init__()
        self.context = LMContext(lm, [0])

    async def step(self):
        await self.sample(self.context.next_token())
        if len(self.context.generated) >= 3:
            self.finish()


def test_returns_n_distinct_particles():
    lm = FunctionLM(list("abcdef"), 5, lambda ctx: [0.0] * 6)
    for seed in range(5):
        result = run(smc_steer(Wide(lm), 8, 3, seed=seed))
        texts = [str(p.context) for p in result.particles]
        assert len(texts) == 8 and len(set(texts)) == 8
        assert math.exp(result.log_ml) == pytest.approx(
            1.0
        )  # uniform LM, no constraint: Z = 1 exactly
