"""The AWRS draw and weight: exact draws, an unbiased and properly weighted weight, counted checks.

Every claim of :mod:`llamppl.decoding.lazy_proposal`'s docstring is checked by Monte
Carlo against closed forms on toy distributions, with tolerances of 4 standard errors
of the estimator itself: E[Ẑ] = Z (Z ≈ 0.6, Z ≈ 1e-4), E[Ẑ 1{a = w}] = p(w) 1_A(w)
for every token (proper weighting), Z = 0 gives weight zero after one check per token
of positive probability, and the draw reaches past the first batch of candidates.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from llamppl.decoding.lazy_proposal import (
    FIRST_CANDIDATES,
    MAX_EXTRA_CHECKS,
    awrs,
    top_candidates,
)

V = 40


def _row(seed: int, zeros: int = 3) -> torch.Tensor:
    """A (V,) normalised log-prob row with ``zeros`` impossible tokens."""
    g = torch.Generator().manual_seed(seed)
    logits = 2.0 * torch.randn(V, generator=g, dtype=torch.float64)
    logits[:zeros] = -math.inf
    return torch.log_softmax(logits, dim=0).float()


def _draws(row: torch.Tensor, allowed: set[int], n: int, seed: int = 0):
    """``n`` independent AWRS draws on ``row`` (batched in chunks of 1,000 rows)."""
    out = []
    for start in range(0, n, 1000):
        b = min(1000, n - start)
        for cand in top_candidates(row.expand(b, -1), seed + start):
            out.append(awrs(cand, lambda w: w in allowed))
    return out


def _exact(row: torch.Tensor, allowed: set[int]) -> tuple[float, np.ndarray]:
    p = torch.exp(row.double()).numpy()
    mask = np.array([w in allowed for w in range(V)])
    return float(p[mask].sum()), np.where(mask, p, 0.0)


@pytest.mark.parametrize("case", ["most", "rare"])
def test_weight_is_unbiased_and_properly_weighted(case):
    row = _row(1)
    p = torch.exp(row.double()).numpy()
    if case == "most":  # Z around 0.6: the allowed half of the tokens, heaviest ones included
        allowed = set(range(3, V, 2))
    else:  # Z ≈ 1e-4: one light token (its probability rescaled to 1e-4 of the mass)
        light = int(np.argsort(p)[5])
        lp = row.double().clone()
        lp[light] = math.log(1e-4)
        row = torch.log_softmax(lp, dim=0).float()
        allowed = {light}
    z, target = _exact(row, allowed)
    n = 20_000
    draws = _draws(row, allowed, n)
    z_hat = np.array([math.exp(d.log_weight) for d in draws])
    se = z_hat.std(ddof=1) / math.sqrt(n)
    assert abs(z_hat.mean() - z) <= 4 * se + 1e-12, (z_hat.mean(), z, se)
    # proper weighting: E[Ẑ 1{a = w}] = p(w) 1_A(w), token by token. A token too light to be
    # drawn has sample SE 0; since 0 <= Ẑ <= 1, Var[Ẑ 1{a=w}] <= p(w), which bounds its SE.
    tokens = np.array([d.token for d in draws])
    for w in range(V):
        terms = z_hat * (tokens == w)
        se_w = max(terms.std(ddof=1), math.sqrt(target[w])) / math.sqrt(n)
        assert abs(terms.mean() - target[w]) <= 4 * se_w + 1e-12, (w, terms.mean(), target[w])
    # the draw itself is the masked LM: every accepted token is allowed
    assert set(tokens.tolist()) <= allowed


def test_nothing_allowed_gives_weight_zero_after_every_possible_token():
    row = _row(2, zeros=5)
    draws = _draws(row, set(), 50)
    assert all(d.token is None and d.log_weight == -math.inf for d in draws)
    assert all(d.calls == V - 5 for d in draws)  # one check per token of positive probability


def test_checks_are_counted_and_never_repeated():
    row = _row(3)
    seen: list[int] = []

    def allowed(w: int) -> bool:
        seen.append(w)
        return w % 7 == 0

    (cand,) = top_candidates(row[None], 11)
    draw = awrs(cand, allowed)
    assert draw.calls == len(seen) == len(set(seen))
    assert draw.token is not None and draw.token % 7 == 0
    rejected = seen[: seen.index(draw.token)]
    assert all(w % 7 for w in rejected)
    extra = draw.calls - len(rejected) - 1  # the weight's extra checks
    assert 0 <= extra <= MAX_EXTRA_CHECKS


def test_draws_continue_past_the_first_candidates():
    vocab = 4 * FIRST_CANDIDATES
    g = torch.Generator().manual_seed(4)
    logits = torch.randn(vocab, generator=g, dtype=torch.float64)
    logits[-1] = -12.0  # the one allowed token is nearly the lightest
    row = torch.log_softmax(logits, dim=0).float()
    (cand,) = top_candidates(row[None], 5)
    draw = awrs(cand, lambda w: w == vocab - 1)
    assert draw.token == vocab - 1 and cand.reads >= 2
    assert draw.calls <= vocab


def test_a_fixed_seed_fixes_the_draws():
    row = _row(5)
    a = [d.token for d in _draws(row, set(range(3, V, 3)), 300, seed=9)]
    b = [d.token for d in _draws(row, set(range(3, V, 3)), 300, seed=9)]
    assert a == b
