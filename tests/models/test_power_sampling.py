"""PowerSampling / power_smc / low_temperature_decode against a brute-force π_α on small FunctionLMs."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from llamppl import FunctionLM, run, using_rng
from llamppl.inference import enumerate_exact
from llamppl.models import PowerSampling, low_temperature_decode, power_smc

NEG = -math.inf


def _toy_logits(ctx: tuple[int, ...]) -> list[float]:
    n, last = len(ctx), ctx[-1]
    return [0.3 * last, 0.5 - 0.2 * n, -0.2 + 0.1 * (last == 1), -1.0 + 0.6 * n]


# vocab a b c + EOS "."; lengths vary (EOS grows likelier with the context length)
TOY = FunctionLM(["a", "b", "c", "."], 3, _toy_logits)
TOY_PROMPT = [0]
TOY_MAX = 4


def _gap_logits(ctx: tuple[int, ...]) -> list[float]:
    # After "a": a flat choice among four tokens; after "b": almost surely "b" then EOS.
    # Token-level temperature prefers "a" (0.55 vs 0.45), the power target prefers "bb.".
    gen = ctx[1:]
    if not gen:
        return [0.2, 0.0, NEG, NEG, NEG]
    if len(gen) == 1:
        return [0.0, 0.0, 0.0, 0.0, NEG] if gen[0] == 0 else [NEG, 3.0, NEG, NEG, 0.0]
    return [NEG, NEG, NEG, NEG, 0.0]


GAP = FunctionLM(["a", "b", "c", "d", "."], 4, _gap_logits)


def brute_force(lm, prompt, alpha, max_tokens):
    """Every continuation of the truncated target: {text: (log p(y|x), log q_{τ=1/α}(y|x))}."""
    out = {}

    def visit(seq, log_p, log_q):
        lp = lm.logprobs(list(prompt) + seq)
        lq = torch.log_softmax(alpha * lp, dim=0)
        for v in range(lm.vocab_size):
            if lp[v] == NEG:
                continue
            s, p, q = seq + [v], log_p + float(lp[v]), log_q + float(lq[v])
            if v == lm.eos_token_id or len(s) == max_tokens:
                out[lm.decode(s)] = (p, q)
            else:
                visit(s, p, q)

    visit([], 0.0, 0.0)
    return out


def power_target(lm, prompt, alpha, max_tokens):
    """(π_α as {text: prob}, log Z_α) by brute force."""
    paths = brute_force(lm, prompt, alpha, max_tokens)
    log_z = float(np.logaddexp.reduce([alpha * p for p, _ in paths.values()]))
    return {k: math.exp(alpha * p - log_z) for k, (p, _) in paths.items()}, log_z


def total_variation(p, q):
    return 0.5 * sum(abs(p.get(k, 0.0) - q.get(k, 0.0)) for k in set(p) | set(q))


def lm_itself(context_ids, log_p, alpha):
    """A prefix-only proposal other than the default: the LM at temperature 1."""
    return log_p


# ---------------------------------------------------------------------------- exact
@pytest.mark.parametrize("alpha", [1.0, 2.5, 4.0])
@pytest.mark.parametrize("ramp", [0, 2, 10])
@pytest.mark.parametrize("proposal", [None, lm_itself])
def test_enumerate_exact_matches_brute_force(alpha, ramp, proposal):
    pi, log_z = power_target(TOY, TOY_PROMPT, alpha, TOY_MAX)
    exact = run(enumerate_exact(PowerSampling(TOY, TOY_PROMPT, alpha, TOY_MAX, ramp, proposal)))
    assert len(pi) == 3**4 + sum(3**k for k in range(4))  # 81 cut-off + 40 EOS-terminated
    assert total_variation(exact.posterior, pi) < 1e-9
    assert exact.log_ml == pytest.approx(log_z, abs=1e-9)


def test_alpha_one_is_the_lm():
    paths = brute_force(TOY, TOY_PROMPT, 1.0, TOY_MAX)
    lm_dist = {k: math.exp(p) for k, (p, _) in paths.items()}
    exact = run(enumerate_exact(PowerSampling(TOY, TOY_PROMPT, 1.0, TOY_MAX)))
    assert total_variation(exact.posterior, lm_dist) < 1e-12
    assert exact.log_ml == pytest.approx(0.0, abs=1e-12)  # Z_1 = Σ_y p(y|x) = 1
    out = run(power_smc(TOY, TOY_PROMPT, alpha=1.0, n_particles=16, max_tokens=TOY_MAX, seed=0))
    assert np.allclose(out.result.log_weights, 0.0, atol=1e-12)  # q = p: every weight is 1
    assert not any(r.resampled for r in out.result.history)


class _FixedUniform:
    """Stands in for a numpy Generator: ``random()`` always returns ``u`` (inverse-CDF picks a chosen token)."""

    def __init__(self, u: float) -> None:
        self.u = u

    def random(self) -> float:
        return self.u


def _weight_of_each_token(prefix, alpha, proposal, log_q):
    """Incremental log weight of one step for every token v, forcing v through the inverse CDF of q."""
    cdf = np.concatenate([[0.0], np.cumsum(np.exp(log_q.numpy()))])
    weights = {}
    for v in range(len(log_q)):
        model = PowerSampling(TOY, prefix, alpha, max_tokens=5, proposal=proposal)
        with using_rng(_FixedUniform((cdf[v] + cdf[v + 1]) / 2)):
            run(model.advance())
        assert model.context.generated == [v]
        weights[v] = model.weight
    return weights


def test_incremental_weight_is_renyi_normaliser():
    """Theorem 1: with q ∝ p^α every token's weight is Σ_v p(v)^α (and not so for q = p)."""
    alpha = 3.0
    for prefix in ([0], [0, 1], [0, 2, 2], [0, 1, 0, 1]):
        log_p = TOY.logprobs(prefix).double()
        expected = float(torch.logsumexp(alpha * log_p, dim=0))
        optimal = _weight_of_each_token(
            prefix, alpha, None, torch.log_softmax(alpha * log_p, dim=0)
        )
        for w in optimal.values():
            assert w == pytest.approx(expected, abs=1e-12)
        plain = _weight_of_each_token(prefix, alpha, lm_itself, log_p)
        for v, w in plain.items():  # eq. 8 with q = p: (α − 1) log p(v), token dependent
            assert w == pytest.approx((alpha - 1) * float(log_p[v]), abs=1e-12)
        assert max(plain.values()) - min(plain.values()) > 0.1


# ---------------------------------------------------------------------------- SMC vs exact
N_RUNS = 200


@pytest.mark.parametrize("ramp, proposal", [(0, None), (3, None), (0, lm_itself)])
def test_z_hat_is_unbiased(ramp, proposal):
    _, log_z = power_target(TOY, TOY_PROMPT, 3.0, TOY_MAX)
    z_hats = np.array(
        [
            math.exp(
                run(
                    power_smc(
                        TOY, TOY_PROMPT, 3.0, 8, 0.5, ramp, TOY_MAX, seed=s, proposal=proposal
                    )
                ).result.log_ml
            )
            for s in range(N_RUNS)
        ]
    )
    se = z_hats.std(ddof=1) / math.sqrt(N_RUNS)
    assert abs(z_hats.mean() - math.exp(log_z)) <= 4 * se, (z_hats.mean(), math.exp(log_z), se)


@pytest.mark.parametrize("ramp", [0, 3])
def test_posterior_converges_with_n(ramp):
    """Per-run TV falls with N (by more than 3 standard errors of the difference);
    the seed-averaged weighted posterior at N = 64 is within TV 0.05 of π_α."""
    alpha = 3.0
    pi, _ = power_target(TOY, TOY_PROMPT, alpha, TOY_MAX)
    n_seeds = 40
    stats = {}
    for n in (4, 16, 64):
        tvs, average = [], {}
        for s in range(n_seeds):
            post = run(
                power_smc(TOY, TOY_PROMPT, alpha, n, 0.5, ramp, TOY_MAX, seed=1000 * n + s)
            ).result.posterior
            tvs.append(total_variation(post, pi))
            for k, w in post.items():
                average[k] = average.get(k, 0.0) + w / n_seeds
        tvs = np.array(tvs)
        stats[n] = (tvs.mean(), tvs.std(ddof=1) / math.sqrt(n_seeds), average)
    for small, large in ((4, 16), (16, 64)):
        (m_s, se_s, _), (m_l, se_l, _) = stats[small], stats[large]
        assert m_s - m_l > 3 * math.hypot(se_s, se_l), (small, m_s, se_s, large, m_l, se_l)
    assert total_variation(stats[64][2], pi) < 0.05


def test_power_smc_closes_the_temperature_gap():
    alpha, prompt, max_tokens = 4.0, [0], 3
    paths = brute_force(GAP, prompt, alpha, max_tokens)
    pi, _ = power_target(GAP, prompt, alpha, max_tokens)
    low_temp = {k: math.exp(q) for k, (_, q) in paths.items()}
    gap = total_variation(low_temp, pi)
    assert gap > 0.05  # token-level τ = 1/α is not π_α (Power-SMC §3.2)

    n_runs = 400  # the baseline function samples the product of tempered conditionals
    counts = {}
    for s in range(n_runs):
        text = GAP.decode(
            run(low_temperature_decode(GAP, prompt, alpha, max_tokens, seed=s)).tokens
        )
        counts[text] = counts.get(text, 0) + 1 / n_runs
    # E[TV(empirical, q)] <= Σ_k sqrt(q_k (1 − q_k) / n) / 2; allow 4 times that bound
    noise = sum(math.sqrt(q * (1 - q) / n_runs) for q in low_temp.values()) / 2
    assert total_variation(counts, low_temp) < 4 * noise
    assert total_variation(counts, pi) > gap - 4 * noise

    n_seeds = 40
    average = {}
    for s in range(n_seeds):
        post = run(power_smc(GAP, prompt, alpha, 64, 0.5, 0, max_tokens, seed=s)).result.posterior
        for k, w in post.items():
            average[k] = average.get(k, 0.0) + w / n_seeds
    assert total_variation(average, pi) < 0.05


def test_output_is_drawn_from_final_particles_and_reproducible():
    a = run(power_smc(TOY, TOY_PROMPT, 3.0, 16, 0.5, 2, TOY_MAX, seed=7))
    b = run(power_smc(TOY, TOY_PROMPT, 3.0, 16, 0.5, 2, TOY_MAX, seed=7))
    assert a.tokens == b.tokens and a.result.log_ml == b.result.log_ml
    assert a.particle in a.result.particles
    assert a.tokens == a.particle.context.generated
    assert a.log_likelihood == pytest.approx(TOY.sequence_logprob(TOY_PROMPT, a.tokens), abs=1e-12)
    assert a.text == TOY.decode([t for t in a.tokens if t != TOY.eos_token_id])
    assert 1 <= len(a.tokens) <= TOY_MAX


# ---------------------------------------------------------------------------- bad input
@pytest.mark.parametrize(
    "kwargs, error, words",
    [
        ({"alpha": 0.5}, ValueError, "alpha"),
        ({"alpha": math.inf}, ValueError, "alpha"),
        ({"alpha": math.nan}, ValueError, "alpha"),
        ({"alpha": "4"}, TypeError, "alpha"),
        ({"n_particles": 0}, ValueError, "n_particles"),
        ({"n_particles": 2.5}, TypeError, "n_particles"),
        ({"ess_threshold": -0.1}, ValueError, "ess_threshold"),  # 0 is allowed: never resample
        ({"ess_threshold": 1.5}, ValueError, "ess_threshold"),
        ({"ramp_tokens": -1}, ValueError, "ramp_tokens"),
        ({"max_tokens": 0}, ValueError, "max_tokens"),
        ({"proposal": 3}, TypeError, "proposal"),
    ],
)
def test_bad_input(kwargs, error, words):
    args = {"alpha": 2.0, "n_particles": 4, "max_tokens": 3, "seed": 0, **kwargs}
    with pytest.raises(error, match=words):
        run(power_smc(TOY, TOY_PROMPT, **args))


def test_bad_input_of_model_and_baseline():
    with pytest.raises(ValueError, match="alpha"):
        PowerSampling(TOY, TOY_PROMPT, 0.9, 3)
    with pytest.raises(ValueError, match="max_tokens"):
        PowerSampling(TOY, TOY_PROMPT, 2.0, 0)
    with pytest.raises(ValueError, match="ramp_tokens"):
        PowerSampling(TOY, TOY_PROMPT, 2.0, 3, ramp_tokens=-2)
    with pytest.raises(TypeError, match="lm"):
        PowerSampling("not an lm", TOY_PROMPT, 2.0, 3)
    with pytest.raises(ValueError, match="alpha"):
        run(low_temperature_decode(TOY, TOY_PROMPT, -1.0, 3))
    with pytest.raises(ValueError, match="max_tokens"):
        run(low_temperature_decode(TOY, TOY_PROMPT, 2.0, 0))


def test_proposal_missing_support_is_refused():
    def no_eos(ids, log_p, alpha):
        return (alpha * log_p).masked_fill(torch.arange(4) == 3, NEG)

    with pytest.raises(ValueError, match="proposal"):
        run(power_smc(TOY, TOY_PROMPT, 2.0, 4, max_tokens=3, seed=0, proposal=no_eos))
    with pytest.raises(ValueError, match="proposal must return"):
        run(
            power_smc(
                TOY, TOY_PROMPT, 2.0, 4, max_tokens=3, seed=0, proposal=lambda i, lp, a: lp[:2]
            )
        )


# ---------------------------------------------------------------------------- embedded model
@pytest.mark.slow
def test_power_smc_decodes_all_particles_in_one_forward_per_step(make_lm):
    lm = make_lm()  # fresh trie and counters
    prompt = "Once upon a time, there was a"
    n, max_tokens = 16, 4
    # α = 1.5 keeps the particles diverse (at α = 4 they mostly coincide), ESS threshold 1 resamples often
    out = run(power_smc(lm, prompt, 1.5, n, 1.0, 3, max_tokens, seed=0))
    steps = out.result.stats["steps"]
    assert steps == len(out.result.history) == max_tokens  # some particle ran to T_max
    # step 1 runs the prompt once for all 16 particles; every later step runs each live
    # particle's new token in one batched forward, resampled duplicates included
    assert lm.stats.forward_calls == out.result.stats["forward_calls"] == steps
    assert any(h.resampled for h in out.result.history)
    prompt_len = len(out.particle.context.tokens) - len(out.tokens)
    # several distinct particles per forward (more than one new token per step), yet resampled
    # clones share their ancestor's cached prefix: at most one new token per particle per step
    assert prompt_len + (steps - 1) < lm.stats.tokens_run <= prompt_len + n * (steps - 1)


@pytest.mark.slow
def test_theorem_one_on_the_embedded_model(smollm):
    alpha = 4.0
    prompt = smollm.encode("The answer is")
    model = PowerSampling(smollm, prompt, alpha, max_tokens=3)
    log_p = run(smollm.next_token_logprobs(model.context.tokens)).double()  # (V,)
    expected = float(torch.logsumexp(alpha * log_p, dim=0))
    for seed in range(3):
        m = model.clone()
        with using_rng(np.random.default_rng(seed)):
            run(m.advance())
        assert m.weight == pytest.approx(expected, abs=1e-4 * alpha)
