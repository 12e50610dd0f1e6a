"""Conditional SMC and particle Gibbs against ``enumerate_exact`` on small FunctionLM programs.

The chain's empirical law must be within a TV bound of the exact posterior. The
bound is 4 standard errors per key, summed: TV = ½ Σ_k |p̂_k − p_k| <= ½ Σ_k 4 se_k,
where se_k is the batch-means standard error of the indicator of key k along the
chain (25 batches), floored at the i.i.d. error sqrt(p_k (1 − p_k) / M) (a Markov
chain's error is never smaller than that for positively correlated draws).
"""

import math

import numpy as np
import pytest

from llamppl import Bernoulli, Categorical, FunctionLM, LMContext, Model, run
from llamppl.inference import (
    Trajectory,
    csmc_standard,
    enumerate_exact,
    particle_gibbs,
    smc_standard,
)

VOCAB = ["a", "c", "<eos>"]


def _logits(ctx):
    return [2.0, -1.0, 0.0 if len(ctx) >= 2 else -1.0]  # the prior favours "a"


LM = FunctionLM(VOCAB, eos_token_id=2, logits_fn=_logits)


class LikesC(Model):
    """Two tokens at most; the likelihood favours "c", against the prior."""

    def __init__(self):
        super().__init__()
        self.context = LMContext(LM, [0])
        self.n = 0

    async def step(self):
        tok = await self.sample(self.context.next_token())
        self.n += 1
        if int(tok) == 2 or self.n == 2:
            self.finish()
            return
        await self.observe(Bernoulli(0.95 if int(tok) == 1 else 0.05), True)


class Proposed(Model):
    """A proposal differing from the prior, a condition and a twist undone later."""

    def __init__(self):
        super().__init__()
        self.xs = []

    async def step(self):
        x = await self.sample(Categorical([0.7, 0.2, 0.1]), proposal=Categorical([0.2, 0.3, 0.5]))
        self.xs.append(x)
        self.condition(not (len(self.xs) == 2 and self.xs == [0, 0]))
        if len(self.xs) == 1:
            self.twist(math.log(0.2 + x))
        else:
            self.untwist()
            await self.observe(Bernoulli(0.9 if sum(self.xs) >= 3 else 0.1), True)
            self.finish()


def _tv_and_bound(states, exact):
    keys = sorted(set(exact) | set(states))
    m = len(states)
    batches = np.array_split(np.arange(m), 25)
    tv, bound = 0.0, 0.0
    for k in keys:
        ind = np.array([s == k for s in states], dtype=float)
        p = exact.get(k, 0.0)
        se_bm = np.std([ind[b].mean() for b in batches], ddof=1) / math.sqrt(len(batches))
        se = max(se_bm, math.sqrt(p * (1 - p) / m))
        tv += 0.5 * abs(ind.mean() - p)
        bound += 0.5 * 4 * se
    return tv, bound


@pytest.mark.parametrize("program", [LikesC, Proposed])
def test_particle_gibbs_chain_matches_the_exact_posterior(program):
    exact = run(enumerate_exact(program())).posterior
    chain = run(particle_gibbs(program(), 4, 1200, seed=0))
    states = [p.string_for_serialization() for p in chain.particles[100:]]
    tv, bound = _tv_and_bound(states, exact)
    assert tv <= bound, (tv, bound)


def test_the_tv_check_has_power_against_unpinned_sampling():
    # The same check rejects the biased sampler particle Gibbs corrects: independent
    # runs of SMC with N=2, keeping one particle drawn ∝ weight (no pinned reference).
    exact = run(enumerate_exact(LikesC())).posterior
    rng = np.random.default_rng(0)
    states = []
    for _ in range(1100):
        res = run(smc_standard(LikesC(), 2, 1.0, resampling="multinomial", seed=rng))
        states.append(res.sample(rng).string_for_serialization())
    tv, bound = _tv_and_bound(states, exact)
    assert tv > bound, (tv, bound)


def test_the_reference_survives_every_resampling():
    first = run(csmc_standard(LikesC(), 4, None, seed=1))
    reference = first.trajectories[int(np.argmax(first.log_weights))]
    res = run(csmc_standard(LikesC(), 4, reference, seed=2))
    assert any(h.resampled for h in res.history)
    assert all(h.ancestors[0] == 0 for h in res.history if h.resampled)
    assert res.trajectories[0] == reference
    ref_text = first.particles[int(np.argmax(first.log_weights))].string_for_serialization()
    assert res.particles[0].string_for_serialization() == ref_text
    # a returned particle is accepted as the reference and gives its path
    again = run(csmc_standard(LikesC(), 3, res.particles[0], seed=3))
    assert again.trajectories[0] == reference


def test_reference_errors_name_the_argument():
    with pytest.raises(TypeError, match="reference must be a Trajectory"):
        run(csmc_standard(LikesC(), 2, "aa"))
    with pytest.raises(TypeError, match="reference must be a Trajectory"):
        run(csmc_standard(LikesC(), 2, LikesC()))  # not produced by csmc_standard
    too_short = Trajectory(((),))  # the start hook only: the program takes more steps
    with pytest.raises(ValueError, match="reference"):
        run(csmc_standard(LikesC(), 2, too_short))


def test_top_level_names_are_lazy_reexports():
    import llamppl
    import llamppl.inference as inf

    assert llamppl.csmc_standard is inf.csmc_standard
    assert llamppl.particle_gibbs is inf.particle_gibbs
