"""Every sampler against the exact oracle: Ẑ unbiased (4 standard errors) and posterior TV shrinking with N."""

import math

import numpy as np
import pytest
from programs import PROGRAMS, AllFailProgram, exp_or_zero, total_variation, toy_lm

from llamppl import run
from llamppl.inference import enumerate_exact, importance_sampling, smc_standard, smc_steer


def _standard(scheme: str, threshold: float = 0.5):
    return lambda m, n, seed: smc_standard(m, n, threshold, resampling=scheme, seed=seed)


ALGORITHMS = {
    **{
        f"smc_standard-{s}": _standard(s)
        for s in ("multinomial", "stratified", "systematic", "residual")
    },
    "smc_standard-always": _standard("multinomial", 1.0),
    "smc_steer": lambda m, n, seed: smc_steer(m, max(1, n // 2), 2, seed=seed),
    "importance_sampling": lambda m, n, seed: importance_sampling(m, n, seed=seed),
}

N_RUNS = 200


@pytest.fixture(scope="module")
def lm():
    return toy_lm()


@pytest.fixture(scope="module")
def exact(lm):
    return {name: run(enumerate_exact(cls(lm))) for name, cls in PROGRAMS.items()}


@pytest.mark.parametrize("algorithm", list(ALGORITHMS))
@pytest.mark.parametrize("program", list(PROGRAMS))
def test_z_hat_is_unbiased(lm, exact, program, algorithm):
    alg = ALGORITHMS[algorithm]
    z_hats = np.array(
        [exp_or_zero(run(alg(PROGRAMS[program](lm), 4, seed)).log_ml) for seed in range(N_RUNS)]
    )
    z = math.exp(exact[program].log_ml)
    se = z_hats.std(ddof=1) / math.sqrt(N_RUNS)
    assert abs(z_hats.mean() - z) <= 4 * se + 1e-12, (z_hats.mean(), z, se)


@pytest.mark.parametrize("algorithm", list(ALGORITHMS))
@pytest.mark.parametrize("program", list(PROGRAMS))
def test_posterior_tv_falls_with_n(lm, exact, program, algorithm):
    alg = ALGORITHMS[algorithm]
    target = exact[program].posterior

    def mean_tv(n, seeds):
        return np.mean(
            [
                total_variation(run(alg(PROGRAMS[program](lm), n, s)).posterior, target)
                for s in seeds
            ]
        )

    small, large = mean_tv(4, range(30)), mean_tv(64, range(100, 110))
    assert large < small, (small, large)


@pytest.mark.parametrize("algorithm", list(ALGORITHMS))
def test_all_paths_failing_gives_minus_inf(lm, algorithm):
    with np.errstate(all="raise"):
        result = run(ALGORITHMS[algorithm](AllFailProgram(lm), 8, 0))
    assert result.log_ml == -math.inf
    assert not np.isnan(result.log_weights).any()
    assert result.posterior == {}
    assert "weight zero" in repr(result)
