"""MH power sampling (Karan & Du 2025): a long chain's empirical law is π_α on a small FunctionLM."""

from __future__ import annotations

import math
from collections import Counter

import pytest
from test_power_sampling import TOY, TOY_MAX, TOY_PROMPT, brute_force, power_target, total_variation

from llamppl import run
from llamppl.models import low_temperature_decode, mh_power_sampling

ALPHA = 3.0


@pytest.mark.parametrize("block_size, n_moves", [(TOY_MAX, 10_000), (2, 6_000)])
def test_long_chain_matches_power_target(block_size, n_moves):
    pi, _ = power_target(TOY, TOY_PROMPT, ALPHA, TOY_MAX)
    paths = brute_force(TOY, TOY_PROMPT, ALPHA, TOY_MAX)
    proposal_law = {k: math.exp(q) for k, (_, q) in paths.items()}
    # The proposal alone (token-level τ = 1/α) is far from π_α, so matching is the MH correction's doing.
    assert total_variation(proposal_law, pi) > 0.1

    out = run(
        mh_power_sampling(
            TOY, TOY_PROMPT, ALPHA, block_size, n_moves, TOY_MAX, seed=0, keep_trace=True
        )
    )
    assert len(out.trace) == n_moves  # the moves of the last block
    counts = Counter(TOY.decode(s) for s in out.trace)
    empirical = {k: c / n_moves for k, c in counts.items()}
    assert set(empirical) <= set(pi)
    assert total_variation(empirical, pi) < 0.05
    assert 0.0 < out.acceptance_rate < 1.0


def test_zero_moves_is_low_temperature_decoding():
    for seed in range(5):
        mh = run(mh_power_sampling(TOY, TOY_PROMPT, ALPHA, 2, 0, TOY_MAX, seed=seed))
        low = run(low_temperature_decode(TOY, TOY_PROMPT, ALPHA, TOY_MAX, seed=seed))
        assert mh.tokens == low.tokens
        assert mh.log_likelihood == pytest.approx(low.log_likelihood, abs=1e-12)
        assert mh.n_moves == 0 and math.isnan(mh.acceptance_rate)


def test_output_and_counters(capsys):
    a = run(mh_power_sampling(TOY, TOY_PROMPT, ALPHA, 2, 3, TOY_MAX, seed=11))
    b = run(mh_power_sampling(TOY, TOY_PROMPT, ALPHA, 2, 3, TOY_MAX, seed=11, progress=True))
    assert "mh_power_sampling" in capsys.readouterr().err  # the bar does not change the chain
    assert a.tokens == b.tokens and a.acceptance_rate == b.acceptance_rate
    assert 1 <= len(a.tokens) <= TOY_MAX
    assert a.log_likelihood == pytest.approx(TOY.sequence_logprob(TOY_PROMPT, a.tokens), abs=1e-12)
    # bounds 2 and 4: M = 3 moves in each block (an EOS-ended state jumps to the last block)
    assert a.n_moves == 6
    assert a.sampled_tokens >= a.proposal_tokens >= a.n_moves


@pytest.mark.parametrize(
    "kwargs, error, words",
    [
        ({"alpha": 0.99}, ValueError, "alpha"),
        ({"alpha": math.nan}, ValueError, "alpha"),
        ({"block_size": 0}, ValueError, "block_size"),
        ({"n_mh_steps": -1}, ValueError, "n_mh_steps"),
        ({"max_tokens": 0}, ValueError, "max_tokens"),
        ({"max_tokens": 2.0}, TypeError, "max_tokens"),
    ],
)
def test_bad_input(kwargs, error, words):
    args = {"alpha": 2.0, "block_size": 2, "n_mh_steps": 1, "max_tokens": 3, "seed": 0, **kwargs}
    with pytest.raises(error, match=words):
        run(mh_power_sampling(TOY, TOY_PROMPT, **args))


@pytest.mark.slow
def test_regenerated_suffix_starts_from_the_prefix_cache(make_lm):
    lm = make_lm()  # fresh trie and counters
    before = lm.stats.forward_calls
    out = run(
        mh_power_sampling(
            lm, "Once upon a time", alpha=1.5, block_size=2, n_mh_steps=2, max_tokens=4, seed=0
        )
    )
    forwards = lm.stats.forward_calls - before
    # one forward per sampled token, except each move's first token, whose prefix is cached
    assert 0 < forwards <= out.sampled_tokens - out.n_moves
    assert out.n_moves >= 2 and len(out.tokens) <= 4
