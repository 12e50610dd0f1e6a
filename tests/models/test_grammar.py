"""GrammarConstraint on FunctionLM: exact posteriors against brute force, unbiased Ẑ, local-masking bias."""

from __future__ import annotations

import copy
import math
import re

import numpy as np
import pytest
import torch
from grammar_lms import assert_exact, brute_force, wavy_lm

from llamppl import FunctionLM, run
from llamppl.constraints import Grammar
from llamppl.decoding.grammar.engine import mask_batcher
from llamppl.decoding.proposals.constrained_tokens import mask_calls
from llamppl.inference import enumerate_exact, smc_standard
from llamppl.models import GrammarConstraint
from llamppl.models.grammar import MaskedNextToken

pytest.importorskip("llguidance")

# ---------------------------------------------------------------- LMs and brute force
REGEX_VOCAB = ["<s>", "a", "b", "c", "<eos>"]
LARK_VOCAB = ["<s>", "a", "(", ")", "+", "(a", "<eos>"]
LARK = """
start: expr
expr: "a" | "(" expr "+" expr ")"
"""


def _lark_member(text):
    """Independent recursive-descent recogniser of expr: "a" | "(" expr "+" expr ")"."""

    def expr(i):  # set of end positions of an expr starting at i
        ends = set()
        if text.startswith("a", i):
            ends.add(i + 1)
        if text.startswith("(", i):
            for j in expr(i + 1):
                if text.startswith("+", j):
                    for k in expr(j + 1):
                        if text.startswith(")", k):
                            ends.add(k + 1)
        return ends

    return len(text) in expr(0)


CASES = {
    "regex": dict(
        vocab=REGEX_VOCAB,
        kw={"regex": "(ab|b)+c"},
        member=lambda t: re.fullmatch("(ab|b)+c", t) is not None,
        max_tokens=7,
    ),
    "lark": dict(vocab=LARK_VOCAB, kw={"lark": LARK}, member=_lark_member, max_tokens=8),
}


def _model(case, proposal, lm=None):
    c = CASES[case]
    lm = lm or wavy_lm(c["vocab"])
    return GrammarConstraint(lm, [], proposal=proposal, max_tokens=c["max_tokens"], **c["kw"])


# ---------------------------------------------------------------- exactness
@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("proposal", ["mask", "sample"])
def test_enumerate_exact_equals_brute_force(case, proposal):
    c = CASES[case]
    log_z, post = brute_force(c["vocab"], c["member"], c["max_tokens"])
    assert len(post) >= 3  # a non-trivial language within the budget
    assert_exact(_model(case, proposal), log_z, post)


@pytest.mark.parametrize(
    "case,proposal", [("regex", "mask"), ("regex", "sample"), ("lark", "mask")]
)
def test_smc_z_hat_is_unbiased(case, proposal):
    exact = run(enumerate_exact(_model(case, proposal)))
    z = math.exp(exact.log_ml)
    model = _model(case, proposal)
    z_hats = np.array([math.exp(run(smc_standard(model, 4, seed=s)).log_ml) for s in range(200)])
    se = z_hats.std(ddof=1) / math.sqrt(len(z_hats))
    assert se > 0
    assert abs(z_hats.mean() - z) < 4 * se, (z_hats.mean(), z, se)


# ---------------------------------------------------------------- forced tokens (fast_forward)
FORCED_VOCAB = ["<s>", "a", "b", "c", "d", "<eos>"]
FORCED_REGEX = "(a|b)ddd(c|ab)?"  # "ddd" and the "b" after "a" are singletons of the mask


@pytest.mark.parametrize("max_tokens", [5, 6, 7, 8])
def test_fast_forward_is_exact_including_chains_cut_by_the_budget(max_tokens):
    """A chain stops before the last position, so budgets 5–8 cut it at every point."""
    vocab = FORCED_VOCAB
    log_z, post = brute_force(
        vocab,
        lambda t: re.fullmatch(FORCED_REGEX, t) is not None,
        max_tokens,
    )
    for fast_forward in (True, False):
        model = GrammarConstraint(
            wavy_lm(vocab), [], regex=FORCED_REGEX, max_tokens=max_tokens, fast_forward=fast_forward
        )
        assert_exact(model, log_z, post)


def test_fast_forward_takes_forced_tokens_in_the_forward_of_the_next_draw():
    """Forced tokens cost LM rounds only without fast_forward (exactness: the test above)."""
    runs = {}
    for fast_forward in (True, False):
        lm = wavy_lm(FORCED_VOCAB)
        model = GrammarConstraint(
            lm, [], regex=FORCED_REGEX, max_tokens=8, fast_forward=fast_forward
        )
        result = run(smc_standard(model, 8, seed=3))
        runs[fast_forward] = (result, lm.batch_calls)
    (fast, fast_calls), (slow, slow_calls) = runs[True], runs[False]
    assert all(p.forced >= 3 for p in fast.particles)  # "ddd" at least, no draw for them
    assert all(p.forced == 0 for p in slow.particles)
    assert all(re.fullmatch(FORCED_REGEX, text) for text in fast.posterior)
    assert fast_calls <= slow_calls - 3  # >= 3 LM rounds saved ("ddd")
    with pytest.raises(TypeError, match="fast_forward"):
        GrammarConstraint(wavy_lm(FORCED_VOCAB), [], regex="a", fast_forward=1)


# ---------------------------------------------------------------- local masking is biased
BIAS_VOCAB = ["<s>", "a", "b", "c", "<eos>"]


def _bias_logits(ctx):
    """Step 1: a and c equally likely; after "a" the LM wants to stop (EOS), so few "abbb"."""
    if len(ctx) == 1:
        return [-math.inf, 0.0, -1.0, 0.0, -1.0]
    return [-math.inf, 0.0, 0.0, 0.0, 2.0]


class _LocalMasking(GrammarConstraint):
    """The mask proposal WITHOUT the potential G'_t (what HF/Outlines-style masking samples)."""

    async def step(self):
        log_probs = await self.context.next_token_logprobs()
        q, log_mass = await mask_batcher(self.context.lm).apply(self.matcher, log_probs)
        token = await self.sample(MaskedNextToken(self.context, q, log_mass))  # no score(G')
        if token == self.context.lm.eos_token_id:
            self.finish()
        else:
            assert self.matcher.consume(int(token))


def test_local_masking_differs_and_smc_converges_to_the_exact_conditional():
    lm = FunctionLM(BIAS_VOCAB, 4, _bias_logits, bos_token_id=0)
    kw = dict(regex="ab{3}|c", max_tokens=6)
    # closed forms: p = softmax of the logits above
    p1 = np.exp(np.array([0.0, -1.0, 0.0, -1.0])) / np.exp([0.0, -1.0, 0.0, -1.0]).sum()
    p2 = np.exp(np.array([0.0, 0.0, 0.0, 2.0])) / np.exp([0.0, 0.0, 0.0, 2.0]).sum()
    p_c, p_abbb = p1[2] * p2[3], p1[0] * p2[1] ** 3 * p2[3]  # p(c EOS), p(abbb EOS)
    exact_c = p_c / (p_c + p_abbb)  # p(y = c | y ∈ L)
    local_c = p1[2] / (p1[0] + p1[2])  # local masking: step 1 sees only that a and c are allowed

    exact = run(enumerate_exact(GrammarConstraint(lm, [], **kw)))
    local = run(enumerate_exact(_LocalMasking(lm, [], **kw)))
    assert exact.posterior["c"] == pytest.approx(exact_c, abs=1e-12)
    assert local.posterior["c"] == pytest.approx(local_c, abs=1e-12)
    assert exact_c - local_c > 0.4  # measurably different: 0.999 vs 0.5

    # SMC: E[Ẑ · π̂(c)] = Z · π(c) = p(c EOS) exactly (unnormalised estimates are unbiased)
    model = GrammarConstraint(lm, [], **kw)
    runs = [run(smc_standard(model, 8, seed=s)) for s in range(200)]
    est = np.array([math.exp(r.log_ml) * r.posterior.get("c", 0.0) for r in runs])
    se = est.std(ddof=1) / math.sqrt(len(est))
    assert abs(est.mean() - p_c) < 4 * se + 1e-12
    # and the seed-averaged posterior sits near the exact one, far from local masking
    mean_post = np.mean([r.posterior.get("c", 0.0) for r in runs])
    post_se = np.std([r.posterior.get("c", 0.0) for r in runs], ddof=1) / math.sqrt(len(runs))
    assert abs(mean_post - local_c) > 20 * post_se


# ---------------------------------------------------------------- mechanics
def test_clone_copies_the_matcher():
    model = _model("regex", "mask")
    run(model.advance())
    clone = model.clone()
    assert clone.matcher is not model.matcher
    assert clone.matcher.matcher is not model.matcher.matcher
    before = list(model.matcher.consumed)
    while not clone.done_stepping():
        run(clone.advance())
    assert model.matcher.consumed == before
    assert copy.deepcopy(model.matcher).state_key() == model.matcher.state_key()


def test_masks_of_a_step_are_computed_in_one_batch():
    lm = wavy_lm(REGEX_VOCAB)
    before = mask_calls(lm)
    model = GrammarConstraint(lm, [], regex="(ab|b)+c", max_tokens=7)
    result = run(smc_standard(model, 16, seed=0))
    # one llguidance call per SMC step for all 16 particles
    assert mask_calls(lm) - before == len(result.history)


def test_eos_allowed_exactly_when_accepting():
    lm = wavy_lm(REGEX_VOCAB)
    model = GrammarConstraint(lm, [], regex="b+c?", max_tokens=7)
    batcher = mask_batcher(lm)
    for token, accepting in [(2, True), (2, True), (3, True)]:
        assert model.matcher.consume(token)
        assert model.matcher.accepting == accepting
        mask = run(batcher.mask(model.matcher))
        assert bool(mask[lm.eos_token_id]) == accepting
    assert mask.tolist() == [False, False, False, False, True]  # after "bbc": only EOS


# ---------------------------------------------------------------- bad input
@pytest.mark.parametrize(
    "kw,words",
    [
        ({"regex": "(ab"}, ["regex", "unclosed group"]),
        ({"lark": "start: foo"}, ["lark", "foo"]),
        ({"json_schema": {"type": "objectx"}}, ["json_schema", "objectx"]),
        ({"json_schema": "{not json"}, ["json_schema", "JSON"]),
    ],
)
def test_invalid_grammar_is_a_value_error_quoting_the_engine(kw, words):
    with pytest.raises(ValueError) as info:
        GrammarConstraint(wavy_lm(REGEX_VOCAB), [], **kw)
    for w in words:
        assert w in str(info.value)


def test_argument_errors():
    lm = wavy_lm(REGEX_VOCAB)
    with pytest.raises(ValueError, match="exactly one"):
        GrammarConstraint(lm, [])
    with pytest.raises(ValueError, match="exactly one"):
        GrammarConstraint(lm, [], regex="a", lark='start: "a"')
    with pytest.raises(ValueError, match="proposal"):
        GrammarConstraint(lm, [], regex="a", proposal="greedy")
    with pytest.raises(TypeError, match="regex"):
        GrammarConstraint(lm, [], regex=3)
    with pytest.raises(TypeError, match="json_schema"):
        Grammar.from_json_schema([1, 2])
    with pytest.raises(ValueError, match="max_tokens"):
        GrammarConstraint(lm, [], regex="a", max_tokens=0)


@pytest.mark.parametrize("proposal", ["mask", "sample"])
def test_grammar_admitting_no_token_gives_minus_inf(proposal):
    lm = wavy_lm(REGEX_VOCAB)
    with pytest.warns(UserWarning, match="admits no token"):
        model = GrammarConstraint(lm, [], regex="xyz", proposal=proposal, max_tokens=4)
    assert run(smc_standard(model, 4, seed=0)).log_ml == -math.inf
    assert run(enumerate_exact(model)).log_ml == -math.inf


def test_apply_masks_reuses_its_scratch_without_leaking_between_calls():
    """Two batches in turn (different sizes, duplicates, a final row): each equals the
    masks computed on their own, and ``overwrite`` writes q into the caller's tensor."""
    from llamppl.decoding.grammar.engine import MatcherState, allowed_masks, apply_masks

    lm = wavy_lm(REGEX_VOCAB)
    grammar = Grammar.from_regex("(ab|b)+c")
    states = [MatcherState(lm, grammar) for _ in range(5)]
    for s, tokens in zip(states, [[], [1], [2], [2, 3], [1]]):  # "", a, b, bc, a (dup of 1)
        for t in tokens:
            assert s.consume(t)
    gen = torch.Generator().manual_seed(0)
    for batch, final in [(states, [0, 0, 1, 1, 0]), (states[:2], [0, 1]), (states, [0] * 5)]:
        log_probs = torch.log_softmax(torch.randn(len(batch), lm.vocab_size, generator=gen), -1)
        final = torch.tensor(final, dtype=torch.bool)
        masks = allowed_masks(lm, batch, dtype=log_probs.dtype)
        masks[final, : lm.eos_token_id] = 0
        want = log_probs.exp() * masks
        given = log_probs.clone()
        q, log_mass = apply_masks(lm, batch, given, final, overwrite=True)
        assert q.data_ptr() == given.data_ptr()
        assert torch.equal(q, want)
        assert torch.allclose(log_mass, want.sum(-1).log())
        q2, _ = apply_masks(lm, batch, log_probs, final)
        assert torch.equal(q2, want) and q2.data_ptr() != log_probs.data_ptr()


def test_sample_proposal_names_forbidden_tokens_without_engine_warnings():
    """Under ``proposal="sample"`` a forbidden token is the potential G_t = 0, not an
    engine failure: the cause is named and no RuntimeWarning is raised."""
    import warnings

    model = _model("regex", "sample")
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        result = run(smc_standard(model, 32, seed=0))
    causes = {p.failure for p in result.particles} - {None}
    assert "token outside the grammar" in causes
    assert not any(c.startswith("grammar engine") for c in causes)
