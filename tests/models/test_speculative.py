"""SpeculativeDecoding / speculative_smc against the target LM's brute-force distribution."""

from __future__ import annotations

import math

import numpy as np
import pytest

from llamppl import FunctionLM, run, using_rng
from llamppl.inference import enumerate_exact
from llamppl.models import SpeculativeDecoding, speculative_smc, truncated_draft

NEG = -math.inf
VOCAB = ["a", "b", "c", "d", "."]  # four tokens + EOS "."
EOS = 4


def _target_logits(ctx: tuple[int, ...]) -> list[float]:
    n, last = len(ctx), ctx[-1]
    return [0.3 * last, 0.5 - 0.2 * n, -0.2 + 0.4 * (last == 1), 0.1, -1.0 + 0.5 * n]


def _draft_logits(ctx: tuple[int, ...]) -> list[float]:
    n, last = len(ctx), ctx[-1]
    return [0.2, 0.3 * last, 0.4, -0.3 * (last == 3), -0.6 + 0.2 * n]


TARGET = FunctionLM(VOCAB, EOS, _target_logits)
DRAFT = FunctionLM(VOCAB, EOS, _draft_logits)
PROMPT = [0]
MAX = 4


def target_distribution(lm, prompt, max_tokens):
    """{text: p(y|x)} over y EOS-terminated with |y| <= max_tokens or cut off at |y| = max_tokens."""
    out = {}

    def visit(seq, log_p):
        lp = lm.logprobs(list(prompt) + seq)
        for v in range(lm.vocab_size):
            if lp[v] == NEG:
                continue
            s, p = seq + [v], log_p + float(lp[v])
            if v == lm.eos_token_id or len(s) == max_tokens:
                out[lm.decode(s)] = math.exp(p)
            else:
                visit(s, p)

    visit([], 0.0)
    return out


def total_variation(p, q):
    return 0.5 * sum(abs(p.get(k, 0.0) - q.get(k, 0.0)) for k in set(p) | set(q))


# ---------------------------------------------------------------------------- exact
@pytest.mark.parametrize("k", [1, 2, 3, 5])
@pytest.mark.parametrize("draft_temp", [1.0, 0.5])
@pytest.mark.parametrize("max_tokens", [1, MAX, 5])
def test_enumerate_exact_is_the_target_lm(k, draft_temp, max_tokens):
    truth = target_distribution(TARGET, PROMPT, max_tokens)
    assert sum(truth.values()) == pytest.approx(1.0, abs=1e-12)
    model = SpeculativeDecoding(TARGET, DRAFT, PROMPT, k, max_tokens, draft_temp)
    exact = run(enumerate_exact(model))
    assert (
        len(exact.posterior) == len(truth) == sum(4**j for j in range(max_tokens)) + 4**max_tokens
    )
    assert total_variation(exact.posterior, truth) < 1e-9
    assert exact.log_ml == pytest.approx(0.0, abs=1e-9)  # Z = Σ_y p(y|x) = 1


def test_one_round_weight_is_the_block_ratio_and_adds_a_bonus_token():
    model = SpeculativeDecoding(TARGET, DRAFT, PROMPT, k=3, max_tokens=10)
    for seed in range(20):
        m = model.clone()
        with using_rng(np.random.default_rng(seed)):
            run(m.advance())
        gen = m.context.generated
        block = gen[:3] if EOS not in gen[:3] else gen[: gen.index(EOS) + 1]
        expected = TARGET.sequence_logprob(PROMPT, block) - DRAFT.sequence_logprob(PROMPT, block)
        assert m.weight == pytest.approx(expected, abs=1e-12)
        assert len(gen) == (len(block) + 1 if block[-1] != EOS else len(block))
        assert m.log_likelihood == pytest.approx(TARGET.sequence_logprob(PROMPT, gen), abs=1e-12)
        assert m.finished == (gen[-1] == EOS)


# ---------------------------------------------------------------------------- SMC vs exact
def test_z_hat_is_unbiased():
    n_runs = 200
    z_hats = np.array(
        [
            math.exp(run(speculative_smc(TARGET, DRAFT, PROMPT, 4, 2, MAX, seed=s)).result.log_ml)
            for s in range(n_runs)
        ]
    )
    se = z_hats.std(ddof=1) / math.sqrt(n_runs)
    assert se > 0.01  # the weights do vary (draft != target)
    assert abs(z_hats.mean() - 1.0) <= 4 * se, (z_hats.mean(), se)


def test_weighted_posterior_matches_the_target():
    """Seed-averaged weighted posterior at N = 64 vs the exact target (max_tokens = 3: 85 outcomes,
    so that 200 seeds push the Monte Carlo floor of the TV below 0.05); the tolerance is also
    checked against the average's own standard errors: E|avg_y − π_y| <= SE_y without bias."""
    max_tokens, n_seeds = 3, 200
    truth = target_distribution(TARGET, PROMPT, max_tokens)
    posts = [
        run(
            speculative_smc(TARGET, DRAFT, PROMPT, 64, 2, max_tokens, seed=100 + s)
        ).result.posterior
        for s in range(n_seeds)
    ]
    keys = sorted(set(truth) | {key for post in posts for key in post})
    table = np.array([[post.get(key, 0.0) for key in keys] for post in posts])  # (seeds, outcomes)
    average = dict(zip(keys, table.mean(axis=0)))
    noise = 0.5 * float(
        (table.std(axis=0, ddof=1) / math.sqrt(n_seeds)).sum()
    )  # >= E[TV] if unbiased
    tv = total_variation(average, truth)
    assert tv < 0.05, (tv, noise)
    assert tv < 2 * noise, (tv, noise)


def test_draft_equal_to_target_gives_zero_weights():
    out = run(speculative_smc(TARGET, TARGET, PROMPT, 16, 3, 5, seed=0))
    assert np.allclose(out.result.log_weights, 0.0, atol=1e-12)
    assert out.result.log_ml == pytest.approx(0.0, abs=1e-12)
    assert not any(h.resampled for h in out.result.history)
    assert out.mean_ess == pytest.approx(16.0)


def test_output_is_reproducible_and_scored_by_the_target():
    a = run(speculative_smc(TARGET, DRAFT, PROMPT, 8, 2, MAX, seed=3))
    b = run(speculative_smc(TARGET, DRAFT, PROMPT, 8, 2, MAX, seed=3))
    assert a.tokens == b.tokens and a.result.log_ml == b.result.log_ml
    assert a.particle in a.result.particles and a.tokens == a.particle.context.generated
    assert a.log_likelihood == pytest.approx(TARGET.sequence_logprob(PROMPT, a.tokens), abs=1e-12)
    assert 1 <= len(a.tokens) <= MAX


def test_one_target_batch_per_round_without_eos():
    """No EOS possible: every round is K drafts + 1 bonus, the target is asked once per round."""
    no_eos_t = FunctionLM(VOCAB, EOS, lambda c: _target_logits(c)[:4] + [NEG])
    no_eos_d = FunctionLM(VOCAB, EOS, lambda c: _draft_logits(c)[:4] + [NEG])
    k, max_tokens, n = 3, 10, 8
    out = run(speculative_smc(no_eos_t, no_eos_d, PROMPT, n, k, max_tokens, seed=0))
    assert out.rounds == math.ceil(max_tokens / (k + 1)) == 3  # 4 + 4 + 2 tokens
    assert out.target_forwards == out.rounds
    assert out.draft_forwards == 3 + 3 + 2  # one coalesced draft batch per drafted position
    assert out.tokens_generated == n * max_tokens
    assert out.tokens_per_target_forward == pytest.approx(max_tokens / 3)


# ---------------------------------------------------------------------------- bad input
@pytest.mark.parametrize(
    "kwargs, error, words",
    [
        ({"k": 0}, ValueError, "k must"),
        ({"k": 1.5}, TypeError, "k must"),
        ({"n_particles": 0}, ValueError, "n_particles"),
        ({"max_tokens": 0}, ValueError, "max_tokens"),
        ({"ess_threshold": -0.1}, ValueError, "ess_threshold"),  # 0 is allowed: never resample
        ({"draft_temp": 0.0}, ValueError, "draft_temp"),
        ({"draft": FunctionLM(VOCAB[:4], 3, lambda c: [0.0] * 4)}, ValueError, "draft"),
        ({"draft": FunctionLM(VOCAB, 0, _draft_logits)}, ValueError, "draft"),
        ({"draft": "gpt"}, TypeError, "draft"),
        ({"target": None}, TypeError, "target"),
    ],
)
def test_bad_input(kwargs, error, words):
    args = {"target": TARGET, "draft": DRAFT, "prompt": PROMPT, "n_particles": 4, "k": 2}
    args.update(max_tokens=3, seed=0)
    args.update(kwargs)
    with pytest.raises(error, match=words):
        run(speculative_smc(**args))


def test_draft_missing_target_support_is_refused():
    no_d = FunctionLM(VOCAB, EOS, lambda c: [0.0, 0.0, 0.0, NEG, 0.0])  # never drafts "d"
    with pytest.raises(ValueError, match="draft must give positive probability"):
        run(speculative_smc(TARGET, no_d, PROMPT, 4, 2, 3, seed=0))


# ---------------------------------------------------------------------------- embedded model
@pytest.mark.slow
def test_one_target_forward_per_round_on_the_embedded_model(smollm, make_lm):
    target = make_lm()  # fresh trie and counters
    draft = truncated_draft(smollm, 6)
    assert draft.vocab_size == target.vocab_size and draft.model.config.num_hidden_layers == 6
    assert draft.model.model.embed_tokens.weight.data_ptr() == (
        smollm.model.model.embed_tokens.weight.data_ptr()
    )  # shared, not copied
    n, k, max_tokens = 6, 3, 10
    out = run(
        speculative_smc(target, draft, "Once upon a time, there was a", n, k, max_tokens, seed=0)
    )
    assert all(len(p.context.generated) == max_tokens for p in out.result.particles)  # no early EOS
    assert out.rounds == math.ceil(max_tokens / (k + 1))
    # one target forward per round for all particles, the prompt included in the first
    assert target.stats.forward_calls == out.target_forwards == out.rounds
    assert out.draft_forwards == k * (out.rounds - 1) + (max_tokens - (k + 1) * (out.rounds - 1))
    assert out.tokens_per_target_forward == pytest.approx(max_tokens / out.rounds)
    assert np.isfinite(out.result.log_ml)
    with pytest.raises(ValueError, match="n_layers"):
        truncated_draft(smollm, 31)
