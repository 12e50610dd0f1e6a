"""Algorithm 1 down-sampling: unbiased per-candidate weights, no duplicates, N distinct particles."""

import math

import numpy as np
import pytest
from programs import ConditionProgram, toy_lm

from llamppl import Bernoulli, FunctionLM, LMContext, Model, run
from llamppl.inference import enumerate_exact, smc_steer, steer_downsample


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


def test_every_step_makes_n_times_k_proposals():
    """Wide never finishes early and has 216 > N·K outputs: N·K extensions at every one of its 3 steps."""
    lm = FunctionLM(list("abcdef"), 5, lambda ctx: [0.0] * 6)
    for n, k in [(8, 3), (5, 1), (1, 4)]:
        result = run(smc_steer(Wide(lm), n, k, seed=1))
        assert result.stats["proposals"] == 3 * n * k


def test_distinct_particles_reach_n_on_condition_program():
    """ConditionProgram has 32 reachable outputs; N = 8 and 16 must come back as N distinct particles."""
    lm = toy_lm()
    for n in (8, 16):
        for seed in range(10):
            result = run(smc_steer(ConditionProgram(lm), n, 3, seed=seed))
            keys = [p.string_for_serialization() for p in result.particles]
            assert len(keys) == len(set(keys)) == n


FIRST = [1.2, 1.0, 0.8, 0.6, -0.6, -1.2, -1.6]  # logits of 7 first tokens, token 6 = EOS
LIKELIHOOD = [0.6, 0.5, 0.7, 0.8, 0.9, 0.5, 0.3]  # P(observation | first token)


class FirstToken(Model):
    """One step: a first token from FIRST, then an observation with likelihood LIKELIHOOD[token]."""

    def __init__(self, lm):
        super().__init__()
        self.context = LMContext(lm, [0])

    async def step(self):
        token = await self.sample(self.context.next_token())
        await self.observe(Bernoulli(LIKELIHOOD[int(token)]), True)
        self.finish()


def test_first_step_covers_every_likely_first_token():
    """With N·K = 32 draws at step one, every first token of exact posterior mass ≥ 0.1 appears.

    Each of the N·K first-step children draws its token i.i.d. from q, so a token of proposal
    mass q_t is missed with probability (1 − q_t)^{NK}; a seed misses some heavy token with
    probability δ ≤ Σ_t (1 − q_t)^{NK} (union bound over the heavy tokens). The 7 first tokens
    are at most N = 16, so the down-sampling keeps every drawn token. Over S seeds the number
    of failing seeds is dominated by Binomial(S, δ); we allow ⌊0.05 S⌋ failures and assert
    that a correct sampler fails this with probability P(Bin(S, δ) > ⌊0.05 S⌋) < 1e-6.

    The old algorithm merged the N identical clones into one particle with K = 2 children, so
    at most 2 distinct first tokens: with at least 3 heavy tokens (asserted) it failed every seed.
    """
    lm = FunctionLM(list("abcdef."), 6, lambda ctx: FIRST)
    n, k, seeds = 16, 2, 200
    exact = run(enumerate_exact(FirstToken(lm))).posterior
    q = np.exp(FIRST) / np.exp(FIRST).sum()
    text = {t: "" if t == 6 else lm.vocab[t] for t in range(7)}  # keys show no end token
    heavy = [t for t in range(7) if exact[text[t]] >= 0.1]
    assert len(heavy) >= 3 > k
    delta = sum((1 - q[t]) ** (n * k) for t in heavy)
    allowed = int(0.05 * seeds)
    false_alarm = sum(
        math.comb(seeds, j) * delta**j * (1 - delta) ** (seeds - j)
        for j in range(allowed + 1, seeds + 1)
    )
    assert false_alarm < 1e-6, (delta, false_alarm)
    failures = 0
    for seed in range(seeds):
        result = run(smc_steer(FirstToken(lm), n, k, seed=seed))
        drawn = {int(p.context.generated[0]) for p in result.particles}
        failures += not set(heavy) <= drawn
    assert failures <= allowed, (failures, allowed)


def test_allocate_slots_shares_spare_slots_by_weight_within_counts():
    from llamppl.inference.smc_steer import allocate_slots

    log_w = np.log(np.array([0.6, 0.3, 0.1]))
    # 3 survivors, N = 8: 5 spare slots; the finished one (index 2) keeps a single slot
    assert allocate_slots(log_w, [10, 10, 10], [True, True, False], 8) == [5, 2, 1]
    # no state gets more slots than the unmerged candidates it stands for
    assert allocate_slots(log_w, [2, 10, 10], [True, True, True], 8) == [2, 4, 2]
    # N distinct survivors: one slot each
    assert allocate_slots(log_w, [9, 9, 9], [True, True, True], 3) == [1, 1, 1]
