"""Posterior accuracy at N=64 against ``enumerate_exact``: absolute bounds derived from exact quantities.

A run (seed s) gives the particle measure γ̂_s(x) = (1/N) Σ_i w_i 1[x_i = x], its total
Ẑ_s and the posterior π̂_s = γ̂_s / Ẑ_s (π̂_s := π when Ẑ_s = 0). Every engine makes
γ̂_s(x) unbiased for Z π(x) (Ẑ's unbiasedness applied to the indicator of x; for
smc_steer because the down-sampling is unbiased per candidate).

Bias, exactly. With A = γ̂(x) − π(x) Ẑ (so E A = 0) one has
(π̂(x) − π(x)) Z = A − (π̂(x) − π(x)) (Ẑ − Z), hence

    E π̂(x) − π(x) = −E[(π̂(x) − π(x)) (Ẑ/Z − 1)],   TV(E π̂, π) ≤ β := E[TV(π̂, π) |Ẑ/Z − 1|].

Bias, O(1/N), from the program's exact quantities. For importance sampling with proposal
path law q, π̂(x) − π(x) ≈ a_x and Ẑ/Z − 1 ≈ ā, means of N i.i.d. zero-mean terms with
E a_x² = v_x / N, v_x = Σ_y (π(y)²/q(y)) (1[y = x] − π(x))², and E ā² = (ρ − 1)/N,
ρ = Σ_y π(y)²/q(y) (the weights' second moment over Z²). By Cauchy–Schwarz per state,
β ≤ ½ Σ_x √(E a_x²) √(E ā²) = C/N with C = ½ √(ρ − 1) Σ_x √v_x. We require every engine
to be at least 1/κ as efficient as importance sampling (κ = 2: both variances at most
κ times IS's), so β ≤ κ C / N, and Var(Ẑ)/Z² ≤ κ (ρ − 1)/N. The seed averages of
TV_s |Ẑ_s/Z − 1| and (Ẑ_s/Z − 1)², minus 4 of their standard errors, must respect these.

Monte Carlo part. P̄ = (1/S) Σ_s π̂_s has |P̄(x) − E π̂(x)| ≤ 4 σ̂_x / √S per state (σ̂_x the
standard deviation of π̂_s(x) over seeds; a miss has probability ≈ 6e-5 per state), so
TV(P̄, π) ≤ κ C / N + ½ Σ_x 4 σ̂_x / √S.

The old smc_steer (merging, one particle at step one) fails the bias and variance checks:
measured on "condition" β̂ = 0.145 against κC/N = 0.034, Var(Ẑ)/Z² = 0.054 against 0.006; on "observe" β̂ = 0.25 against 0.061.
"""

import math

import numpy as np
import pytest
from programs import ConditionProgram, ObserveProgram, exp_or_zero, toy_lm

from llamppl import run
from llamppl.inference import enumerate_exact, importance_sampling, smc_standard, smc_steer

N, SEEDS, KAPPA = 64, 200, 2.0

ENGINES = {
    "smc_standard": lambda m, seed: smc_standard(m, N, seed=seed),
    "smc_steer": lambda m, seed: smc_steer(m, N, 2, seed=seed),
    "importance_sampling": lambda m, seed: importance_sampling(m, N, seed=seed),
}


def _prior(cls):
    """The same program with observe/condition switched off: its posterior is the proposal q."""

    class Prior(cls):
        async def observe(self, dist, value):
            return None

        def condition(self, ok):
            return None

    return Prior


PROGRAMS = {"condition": ConditionProgram, "observe": ObserveProgram}


@pytest.fixture(scope="module")
def lm():
    return toy_lm()


@pytest.mark.parametrize("engine", list(ENGINES))
@pytest.mark.parametrize("program", list(PROGRAMS))
def test_seed_averaged_posterior_within_derived_bound(lm, program, engine):
    cls = PROGRAMS[program]
    exact = run(enumerate_exact(cls(lm)))
    q = run(enumerate_exact(_prior(cls)(lm))).posterior
    keys = sorted(exact.posterior)
    pi = np.array([exact.posterior[k] for k in keys])
    r2 = np.array([exact.posterior[k] ** 2 / q[k] for k in keys])  # π(y)²/q(y)
    rho = r2.sum()
    v = np.array([r2[i] - 2 * pi[i] * r2[i] + pi[i] ** 2 * rho for i in range(len(keys))])
    bias_bound = KAPPA * 0.5 * math.sqrt(rho - 1) * np.sqrt(v).sum() / N

    z = math.exp(exact.log_ml)
    post, rel = np.zeros((SEEDS, len(keys))), np.zeros(SEEDS)
    for s in range(SEEDS):
        result = run(ENGINES[engine](cls(lm), s))
        p = result.posterior
        assert set(p) <= set(keys)
        post[s] = [p.get(k, 0.0) for k in keys] if p else pi
        rel[s] = exp_or_zero(result.log_ml) / z - 1

    def lower(x):  # seed mean minus 4 standard errors
        return x.mean() - 4 * x.std(ddof=1) / math.sqrt(SEEDS)

    tv_s = 0.5 * np.abs(post - pi).sum(axis=1)
    assert lower(tv_s * np.abs(rel)) <= bias_bound, (tv_s @ np.abs(rel) / SEEDS, bias_bound)
    assert lower(rel**2) <= KAPPA * (rho - 1) / N, (np.mean(rel**2), KAPPA * (rho - 1) / N)
    mc = 0.5 * np.sum(4 * post.std(axis=0, ddof=1) / math.sqrt(SEEDS))
    tv = 0.5 * np.abs(post.mean(axis=0) - pi).sum()
    assert tv <= bias_bound + mc, (tv, bias_bound, mc)
