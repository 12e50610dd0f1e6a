"""The AWRS draw and weight: exact draws, an unbiased and properly weighted weight, counted checks.

Every claim of :mod:`llamppl.decoding.proposals.lazy`'s docstring is checked by Monte
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

from llamppl.decoding.proposals import lazy as lazy_proposal
from llamppl.decoding.proposals.lazy import (
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


def _rare(row: torch.Tensor) -> tuple[torch.Tensor, set[int]]:
    """The row with one light token rescaled to 1e-4 of the mass, and that token allowed."""
    light = int(np.argsort(torch.exp(row.double()).numpy())[5])
    lp = row.double().clone()
    lp[light] = math.log(1e-4)
    return torch.log_softmax(lp, dim=0).float(), {light}


def _assert_properly_weighted(draws, row: torch.Tensor, allowed: set[int]) -> None:
    """E[Ẑ] = Z and E[Ẑ 1{a = w}] = p(w) 1_A(w) token by token, within 4 standard errors."""
    z, target = _exact(row, allowed)
    n = len(draws)
    z_hat = np.array([math.exp(d.log_weight) for d in draws])
    se = z_hat.std(ddof=1) / math.sqrt(n)
    assert abs(z_hat.mean() - z) <= 4 * se + 1e-12, (z_hat.mean(), z, se)
    # A token too light to be drawn has sample SE 0; since 0 <= Ẑ <= 1,
    # Var[Ẑ 1{a=w}] <= p(w), which bounds its SE.
    tokens = np.array([d.token for d in draws])
    for w in range(V):
        terms = z_hat * (tokens == w)
        se_w = max(terms.std(ddof=1), math.sqrt(target[w])) / math.sqrt(n)
        assert abs(terms.mean() - target[w]) <= 4 * se_w + 1e-12, (w, terms.mean(), target[w])
    # the draw itself is the masked LM: every accepted token is allowed
    assert set(tokens.tolist()) <= allowed


@pytest.mark.parametrize("case", ["most", "rare"])
def test_weight_is_unbiased_and_properly_weighted(case):
    row = _row(1)
    if case == "most":  # Z around 0.6: the allowed half of the tokens, heaviest ones included
        allowed = set(range(3, V, 2))
    else:  # Z ≈ 1e-4: one light token (its probability rescaled to 1e-4 of the mass)
        row, allowed = _rare(row)
    _assert_properly_weighted(_draws(row, allowed, 20_000), row, allowed)


def _listing(allowed: set[int], cost: int, listed: list[bool]):
    """An ``exhaust`` that lists ``allowed`` with ``cost`` checks (None under that budget);
    ``listed`` records whether it did."""
    listed.append(False)

    def exhaust(budget: int):
        if budget < cost:
            return None, budget
        listed[-1] = True
        return sorted(allowed), cost

    return exhaust


@pytest.mark.parametrize("case", ["most", "rare", "none"])
def test_listing_the_allowed_set_keeps_draws_and_weights_exact(case, monkeypatch):
    """After EXHAUST_AFTER rejections the draw may list A (module docstring, "Long runs of
    rejections"): the same token as the scan, the weight Z itself, still properly weighted."""
    monkeypatch.setattr(lazy_proposal, "EXHAUST_AFTER", 2)
    row = _row(6)
    if case == "most":
        allowed = set(range(3, V, 2))
    elif case == "rare":
        row, allowed = _rare(row)
    else:
        allowed = set()
    z, _ = _exact(row, allowed)
    n, cost = 4_000, 5
    listed, scanned, did = [], [], []
    for start in range(0, n, 1000):
        rows = row.expand(1000, -1)
        for a, b in zip(top_candidates(rows, start), top_candidates(rows, start)):
            listed.append(awrs(a, lambda w: w in allowed, exhaust=_listing(allowed, cost, did)))
            scanned.append(awrs(b, lambda w: w in allowed))
    assert [d.token for d in listed] == [d.token for d in scanned]
    switched = [d for d, listed_a in zip(listed, did) if listed_a]
    if case == "none":
        assert len(switched) == n and all(d.log_weight == -math.inf for d in listed)
        assert all(d.calls < V - 3 for d in listed)  # fewer checks than the full scan
        return
    assert switched and all(math.isclose(math.exp(d.log_weight), z, rel_tol=1e-6) for d in switched)
    if case == "rare":
        assert len(switched) > 0.9 * n
    _assert_properly_weighted(listed, row, allowed)


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
