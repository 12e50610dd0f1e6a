"""HardConstraint with the SMILES constraint targets the sampling formulation, every proposal.

The reference is :func:`~exact_reference.sampling_target`: each whole token's text checked
with the prefix check (a fresh ``smiles()`` asked only about whole-token texts), an end
token allowed iff the complete check passes, summed over every token path of a small
``FunctionLM`` whose vocabulary holds SMILES pieces that share character prefixes (``C``,
``Cl``, ``C1``, ``C(``; ``B``, ``Br``; ``[``, ``[A``, ``[Al``), so the trie listing that
the declared closure allows prunes real subtrees. ``enumerate_exact`` of each proposal must
give the same posterior and Z; a seeded SMC run whose lazy draw lists on the trie after one
rejection must be unbiased for them.
"""

from __future__ import annotations

import math

import pytest
from exact_reference import assert_unbiased_paths, sampling_target, weighted_paths

from llamppl import FunctionLM, run
from llamppl.decoding.chemistry import smiles
from llamppl.decoding.constraints import time_bound
from llamppl.decoding.proposals import lazy as lazy_proposal
from llamppl.decoding.proposals import token_check
from llamppl.inference import enumerate_exact, smc_standard
from llamppl.models import HardConstraint

pytest.importorskip("partialsmiles")

VOCAB = ["C", "Cl", "C1", "C(", "1", ")", "#", "=O", "B", "Br", "[", "[A", "[Al", "]", "X"]
VOCAB += ["<eos>"]
EOS = len(VOCAB) - 1
MAX_TOKENS = 4


def _logits(ctx):
    n, last = len(ctx), ctx[-1]
    return [math.cos(0.7 * i + 0.5 * n + 0.3 * last) for i in range(EOS)] + [0.8 * n - 0.5]


LM = FunctionLM(VOCAB, EOS, _logits)


def _target(leading_space: bool = False):
    prefix, complete = smiles(leading_space), smiles(leading_space)
    return sampling_target(LM, [0], prefix, complete.accepts_end, {EOS}, MAX_TOKENS)


@pytest.fixture(autouse=True)
def no_check_timeout():
    """Exact answers must not depend on the machine's load: a check past the default wall-clock
    bound (2 s, a GC pause on a loaded machine) would end its particle and lose its mass."""
    with time_bound(None):
        yield


def _exact(model) -> tuple[dict, float]:
    exact = run(enumerate_exact(model))
    paths = weighted_paths(exact)
    z = sum(paths.values())
    return {p: w / z for p, w in paths.items()}, math.exp(exact.log_ml)


@pytest.mark.parametrize("proposal", ["sample", "mask", "lazy"])
def test_enumeration_of_every_proposal_is_the_sampling_target(proposal):
    want, z_want = _target()
    assert 0 < z_want < 1 and len(want) > 20  # the constraint rejects much, and not all
    assert any(VOCAB[p[0]] == "[" for p in want) or any(VOCAB[p[0]] == "C1" for p in want)
    model = HardConstraint(LM, [0], smiles(), proposal, MAX_TOKENS)
    paths, z = _exact(model)
    assert z == pytest.approx(z_want, abs=1e-9)
    assert paths.keys() == want.keys()
    for p, w in want.items():
        assert paths[p] == pytest.approx(w, abs=1e-9), [VOCAB[t] for t in p]


def test_the_lazy_draw_that_lists_on_the_trie_is_unbiased(monkeypatch):
    monkeypatch.setattr(lazy_proposal, "EXHAUST_AFTER", 1)  # list after one rejection
    listed = []
    exhaust = token_check.TokenCheck.exhaust

    def counted_exhaust(check, budget):
        found, checks = exhaust(check, budget)
        listed.append(found is not None)
        return found, checks

    monkeypatch.setattr(token_check.TokenCheck, "exhaust", counted_exhaust)
    target, z = _target()
    model = HardConstraint(LM, [0], smiles(), "lazy", MAX_TOKENS)
    runs = [run(smc_standard(model, 4, seed=s)) for s in range(400)]
    assert sum(listed) > 50  # the trie listing really ran
    assert_unbiased_paths(runs, target, z)
