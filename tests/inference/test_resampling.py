"""Resampling schemes: expected offspring counts, variance ordering, zero weights, bad names."""

import math

import numpy as np
import pytest

from llamppl.inference.resampling import RESAMPLERS, get_resampler

with np.errstate(divide="ignore"):
    LOG_W = np.log(np.array([0.05, 0.0, 0.3, 0.15, 0.4, 0.1]))
N, REPS = 6, 4000


def offspring_counts(scheme, seed=0):
    rng = np.random.default_rng(seed)
    return np.stack(
        [np.bincount(RESAMPLERS[scheme](LOG_W, rng, N), minlength=LOG_W.size) for _ in range(REPS)]
    )


@pytest.mark.parametrize("scheme", list(RESAMPLERS))
def test_expected_counts_equal_n_times_weight(scheme):
    counts = offspring_counts(scheme)
    expected = N * np.exp(LOG_W)
    se = counts.std(axis=0, ddof=1) / math.sqrt(REPS)
    assert np.all(np.abs(counts.mean(axis=0) - expected) <= 4 * se + 1e-12), (
        counts.mean(axis=0),
        expected,
    )
    assert counts.sum(axis=1).tolist() == [N] * REPS


@pytest.mark.parametrize("scheme", ["systematic", "stratified", "residual"])
def test_variance_no_larger_than_multinomial(scheme):
    assert (
        offspring_counts(scheme).var(axis=0).sum()
        <= offspring_counts("multinomial", 1).var(axis=0).sum()
    )


@pytest.mark.parametrize("scheme", list(RESAMPLERS))
def test_zero_weight_particle_never_chosen(scheme):
    rng = np.random.default_rng(3)
    log_w = np.array([-np.inf, 0.0, -np.inf, -40.0, -np.inf])
    for _ in range(500):
        anc = RESAMPLERS[scheme](log_w, rng, 7)
        assert not np.isin(anc, [0, 2, 4]).any()


def test_all_zero_weights_is_a_clear_error():
    with pytest.raises(ValueError, match="weight zero"):
        get_resampler("systematic")(np.full(3, -np.inf), np.random.default_rng(0), 3)


def test_unknown_scheme_lists_valid_names():
    with pytest.raises(ValueError, match="resampling must be one of .*systematic"):
        get_resampler("bogus")
