"""PowerLawSampler: the paper's formulas by hand, the sampler's draws, the HF LogitsProcessor,
and PowerLawProposal as an exact SMC proposal (against enumerate_exact and a brute-force sum)."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import torch

from llamppl import FunctionLM, LMContext, Model, run, using_rng
from llamppl.decoding.proposals.token_draw import draw_token_ids
from llamppl.inference import enumerate_exact, smc_standard
from llamppl.models import PowerLawProposal, PowerLawSampler, power_law_history

NEG = -math.inf


def pl_formula(p: np.ndarray, target: float, width: float, h: float, peak: float) -> np.ndarray:
    """PL-1 written out in float64: peak / (1 + (|p - τ| / w)^h)."""
    return peak / (1.0 + (np.abs(p - target) / width) ** h)


def softmax64(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


# ---------------------------------------------------------------------- the formulas
def test_paper_worked_example_ranks_c_first_and_a_last():
    p = np.array([0.60, 0.25, 0.10, 0.05])  # tokens A, B, C, D
    sampler = PowerLawSampler(target=0.10, width=0.05)
    new = sampler.reshape(torch.tensor(np.log(p)), target=0.10).double().numpy()
    np.testing.assert_allclose(new, pl_formula(p, 0.10, 0.05, 3.0, 12.0), rtol=1e-5)
    q = sampler.log_probs(torch.tensor(np.log(p)), target=0.10).exp().numpy()
    assert q.argmax() == 2 and q.argmin() == 0, q  # C first, A last
    assert abs(q.sum() - 1) < 1e-5


@pytest.mark.parametrize(
    "width,h,peak",
    [(0.1, 3.0, 12.0), (0.05, 2.0, 8.0), (0.2, 1.0, 5.0), (0.15, 2.5, 15.0), (1e-6, 10.0, 12.0)],
)
def test_reshape_matches_formula(width, h, peak):
    gen = torch.Generator().manual_seed(1)
    logits = torch.randn(6, 300, generator=gen, dtype=torch.float64) * 2.0  # [B, V]
    logits[2, 17] = NEG  # an impossible token stays impossible
    targets = torch.tensor([0.0, 0.05, 0.1, 0.3, 0.7, 1.0], dtype=torch.float64)
    sampler = PowerLawSampler(width=width, tail_heaviness=h, peak_logit=peak)
    new = sampler.reshape(logits, target=targets).numpy()
    p = softmax64(logits.numpy())
    expected = pl_formula(p, targets.numpy()[:, None], width, h, peak)
    expected[2, 17] = NEG
    np.testing.assert_allclose(new, expected, rtol=1e-9, atol=1e-12)
    # float32 input: same numbers to float32 precision
    new32 = sampler.reshape(logits.float(), target=targets.float()).double().numpy()
    np.testing.assert_allclose(new32, expected, rtol=2e-4, atol=1e-5)


def test_next_target_is_the_paper_formula_clamped():
    sampler = PowerLawSampler(target=0.2, queue_size=4, min_target=0.05, max_target=0.5)

    def T(values):
        return torch.tensor(values, dtype=torch.float64)

    h = [0.9, 0.1, 0.05, 0.3]  # full window, oldest first: 0.2·4 − (0.1 + 0.05 + 0.3)
    assert float(sampler.next_target(T(h))) == pytest.approx(0.8 - 0.45)
    assert float(sampler.next_target(T([0.0, 0.9, 0.9, 0.9]))) == 0.05  # −1.9 clamped up
    assert float(sampler.next_target(T([0.9, 0.0, 0.0, 0.0]))) == 0.5  # 0.8 clamped down
    # partial windows: missing entries count as the base target (the window mean stays on target)
    assert float(sampler.next_target(T([]))) == pytest.approx(0.2)
    assert float(sampler.next_target(T([0.1]))) == pytest.approx(0.2 * 2 - 0.1)
    # longer histories: only the newest queue_size − 1 entries count
    assert float(sampler.next_target(T([0.5, 0.4, *h]))) == pytest.approx(0.8 - 0.45)


def test_adaptive_target_follows_the_history_of_chosen_tokens():
    # Greedy width 0 makes every choice known: the token whose probability is closest to the target.
    Q, base, lo, hi = 3, 0.3, 0.1, 0.6
    sampler = PowerLawSampler(target=base, width=0.0, queue_size=Q, min_target=lo, max_target=hi)
    rng = np.random.default_rng(0)
    history, gen = [], torch.Generator().manual_seed(2)
    for _ in range(12):
        logits = torch.randn(40, generator=gen) * 2.5  # [V]
        p = softmax64(logits.double().numpy())
        recent = history[-(Q - 1) :] if Q > 1 else []
        expected_target = min(
            max(base * (len(recent) + 1) - sum(recent), lo), hi
        )  # PL-2, padded window
        draw = sampler.sample(logits, rng)
        assert float(draw.targets) == pytest.approx(expected_target, abs=1e-6)
        assert int(draw.token_ids) == int(np.argmin(np.abs(p - expected_target)))
        assert float(draw.original_probs) == pytest.approx(p[int(draw.token_ids)], rel=1e-5)
        history.append(p[int(draw.token_ids)])
    np.testing.assert_allclose(sampler.history[0].numpy(), history[-Q:], rtol=1e-5)


def test_width_zero_always_takes_the_token_closest_to_the_target():
    gen = torch.Generator().manual_seed(3)
    for queue_size in (1, 5):
        sampler = PowerLawSampler(target=0.15, width=0.0, queue_size=queue_size)
        rng = np.random.default_rng(queue_size)
        for _ in range(5):
            logits = torch.randn(64, 500, generator=gen) * 3.0  # [B, V]
            targets = sampler.current_targets(64).numpy()
            draw = sampler.sample(logits, rng)
            p = softmax64(logits.double().numpy())
            closest = np.abs(p - targets[:, None]).argmin(axis=1)
            np.testing.assert_array_equal(draw.token_ids.numpy(), closest)
            np.testing.assert_allclose(draw.log_probs.numpy(), 0.0, atol=1e-6)  # q(closest) = 1


def test_min_p_filters_first_and_keeps_original_probabilities():
    p = np.array([0.5, 0.3, 0.1, 0.06, 0.04])
    sampler = PowerLawSampler(target=0.1, width=0.05, min_p=0.15)  # keeps p >= 0.075
    new = sampler.reshape(torch.tensor(np.log(p)), target=0.1).double().numpy()
    expected = pl_formula(p, 0.1, 0.05, 3.0, 12.0)  # on the un-renormalised probabilities
    expected[3:] = NEG
    np.testing.assert_allclose(new, expected, rtol=1e-5)
    draw = sampler.sample(torch.tensor(np.log(p)), np.random.default_rng(0))
    assert int(draw.token_ids) < 3
    assert float(draw.original_probs) == pytest.approx(p[int(draw.token_ids)], rel=1e-5)


# ---------------------------------------------------------------------- drawing
def test_draw_token_ids_frequencies_and_zero_weights_never_drawn():
    # 4096 tokens (two-level path, 16 blocks), zero weights inside blocks and at the row's end.
    gen = torch.Generator().manual_seed(4)
    w = torch.rand(4096, generator=gen) ** 4
    w[::7] = 0.0
    w[-300:] = 0.0
    n = 3000
    u = torch.rand(n, 1, generator=gen)
    u[:20] = (
        1.0  # u·total rounded up to the total (a float boundary), past the last positive weight
    )
    u[20:40] = 0.0
    ids, total, chosen = draw_token_ids(w.expand(n, -1).contiguous(), u)
    assert (chosen[:, 0] > 0).all() and torch.equal(chosen[:, 0], w[ids[:, 0]])
    torch.testing.assert_close(total[:, 0], w.sum().expand(n), rtol=1e-5, atol=0)
    last = int(torch.nonzero(w).max())
    assert (ids[:20, 0] == last).all() and (
        ids[20:40, 0] == 1
    ).all()  # w[0] = 0: first positive is 1
    w2 = w.clone()
    w2[-300:] = torch.rand(300, generator=gen)
    w2[-50:] = 0.0  # the last block ends in zeros
    ids2, _, _ = draw_token_ids(w2.expand(4, -1).contiguous(), torch.ones(4, 1))
    assert (ids2[:, 0] == int(torch.nonzero(w2).max())).all()
    # grouped frequencies (16 groups of 256 tokens) within 4 binomial standard errors
    q = (w / w.sum()).double().view(16, 256).sum(1).numpy()
    freq = np.bincount(ids[40:, 0].numpy() // 256, minlength=16) / (n - 40)
    se = np.sqrt(q * (1 - q) / (n - 40))
    assert (np.abs(freq - q) <= 4 * se + 1e-12).all(), (freq, q)
    # single-level path (one row) agrees on a fixed uniform
    one, _, _ = draw_token_ids(w[None], torch.tensor([[0.5]]))
    cdf = (w / w.sum()).double().cumsum(0)
    assert int(one) == int(np.searchsorted(cdf.numpy(), 0.5, side="right"))


def test_sample_reports_exact_log_q_and_original_probs_and_is_reproducible():
    gen = torch.Generator().manual_seed(5)
    logits = torch.randn(16, 49152, generator=gen) * 3.0
    logits[:, :10] = NEG
    draws = []
    for seed in (7, 7):
        sampler = PowerLawSampler(min_p=0.01)
        d = sampler.sample(logits, np.random.default_rng(seed))
        q = sampler.log_probs(logits, target=d.targets)  # [B, V] (history already moved on)
        rows = torch.arange(16)
        torch.testing.assert_close(d.log_probs, q[rows, d.token_ids], rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(d.original_probs, torch.softmax(logits, -1)[rows, d.token_ids])
        assert (d.token_ids >= 10).all()
        draws.append(d.token_ids)
    assert torch.equal(draws[0], draws[1])
    g1, g2 = torch.Generator().manual_seed(9), torch.Generator().manual_seed(9)
    a = PowerLawSampler().sample(logits, g1).token_ids
    assert torch.equal(a, PowerLawSampler().sample(logits, g2).token_ids)


def test_history_rows_are_independent_and_reset_starts_fresh():
    sampler = PowerLawSampler(target=0.3, width=0.0, queue_size=2)
    logits = torch.log(torch.tensor([[0.7, 0.2, 0.1], [0.1, 0.3, 0.6]]))
    d = sampler.sample(logits, np.random.default_rng(0))
    assert d.token_ids.tolist() == [1, 1]
    np.testing.assert_allclose(sampler.history[:, -1].numpy(), [0.2, 0.3], rtol=1e-6)
    np.testing.assert_allclose(
        sampler.current_targets(2).numpy(), [0.6 - 0.2, 0.6 - 0.3], rtol=1e-6
    )
    with pytest.raises(ValueError, match="reset"):
        sampler.sample(logits[:1], np.random.default_rng(0))
    sampler.reset()
    assert sampler.history is None
    assert float(sampler.sample(logits[0], np.random.default_rng(0)).targets) == pytest.approx(0.3)


def test_logits_processor_reads_choices_from_input_ids_and_restarts_per_generation():
    V, Q = 30, 3
    sampler = PowerLawSampler(target=0.2, width=0.05, queue_size=Q)
    gen = torch.Generator().manual_seed(6)
    ids = torch.tensor([[1, 2], [3, 4]])  # [B, T] prompt
    history = [[], []]
    for _ in range(6):
        scores = torch.randn(2, V, generator=gen) * 2  # [B, V]
        out = sampler(ids, scores)
        p = softmax64(scores.double().numpy())
        for b in range(2):
            recent = history[b][-(Q - 1) :]
            t = min(max(0.2 * (len(recent) + 1) - sum(recent), 0.0), 1.0)
            np.testing.assert_allclose(
                out[b].double().numpy(), pl_formula(p[b], t, 0.05, 3.0, 12.0), rtol=1e-4
            )
        nxt = torch.multinomial(
            torch.softmax(out, -1), 1, generator=gen
        )  # [B, 1] what generate would do
        for b in range(2):
            history[b].append(p[b, int(nxt[b])])
        ids = torch.cat([ids, nxt], 1)
    sampler(ids, scores)  # records the last choice
    np.testing.assert_allclose(sampler.history.numpy(), [h[-Q:] for h in history], rtol=1e-5)
    sampler(torch.tensor([[5], [6]]), scores)  # a new generation: fresh rows
    assert torch.all(sampler.history == 0.2)


# ---------------------------------------------------------------------- as an SMC proposal
VOCAB = ["a", "b", "c", "d", "."]
EOS = 4


def _toy_logits(ctx: tuple[int, ...]) -> list[float]:
    n, last = len(ctx), ctx[-1]
    out = [1.0 - 0.3 * (last == 0), 0.4 + 0.2 * n, -0.2, -0.8 + 0.5 * (last == 2), -1.2 + 0.7 * n]
    if last == 1:
        out[3] = NEG  # "d" never follows "b"
    return out


TOY = FunctionLM(VOCAB, EOS, _toy_logits)
MAX_TOKENS = 3


class Continue(Model):
    """Up to three tokens, no "aa" (a condition); the proposal is the LM's own or a power-law one."""

    def __init__(self, lm, sampler: PowerLawSampler | None = None, defensive: float = 0.0) -> None:
        super().__init__()
        self.context = LMContext(lm, [0])
        self.sampler = sampler
        self.defensive = defensive

    async def step(self) -> None:
        proposal = None
        if self.sampler is not None:
            proposal = PowerLawProposal(self.context, self.sampler, defensive=self.defensive)
        token = await self.sample(self.context.next_token(), proposal=proposal)
        self.condition("aa" not in str(self.context))
        if token == EOS or len(self.context.generated) >= MAX_TOKENS:
            self.finish()


def brute_force() -> dict[str, float]:
    """Unnormalised posterior mass of every continuation, by summing over all token sequences."""
    mass: dict[str, float] = {}
    for n in range(1, MAX_TOKENS + 1):
        for seq in itertools.product(range(len(VOCAB)), repeat=n):
            if EOS in seq[:-1] or (n < MAX_TOKENS and seq[-1] != EOS):
                continue
            text = TOY.decode([t for t in seq if t != EOS])  # str(context): no end token
            log_p = TOY.sequence_logprob([0], seq)
            if "aa" not in text and log_p > NEG:
                mass[text] = mass.get(text, 0.0) + math.exp(log_p)
    return mass


# Proposals for the exactness tests. Those run with SMC keep p/q moderate (<= ~10 per step), so
# 200 runs estimate Z with a useful standard error; the sharp ones (default peak 12, greedy) are exact
# too but their importance weights are too heavy-tailed for a 200-run check, so they go to enumeration only.
PROPOSALS = {
    "power-law": dict(sampler=PowerLawSampler(target=0.3, width=0.1, queue_size=2, peak_logit=4.0)),
    "adaptive-clamped": dict(
        sampler=PowerLawSampler(
            target=0.1,
            width=0.2,
            tail_heaviness=2.0,
            peak_logit=3.0,
            queue_size=3,
            min_target=0.05,
            max_target=0.4,
        )
    ),
    "min-p+defensive": dict(
        sampler=PowerLawSampler(target=0.25, width=0.1, min_p=0.3), defensive=0.2
    ),
    "default+defensive": dict(
        sampler=PowerLawSampler(target=0.3, width=0.1, queue_size=2), defensive=0.2
    ),
    "default": dict(sampler=PowerLawSampler(target=0.3, width=0.1, queue_size=2)),
    "greedy": dict(sampler=PowerLawSampler(target=0.2, width=0.0)),
}
SMC_PROPOSALS = ["power-law", "adaptive-clamped", "min-p+defensive", "default+defensive"]


@pytest.fixture(scope="module")
def exact():
    mass = brute_force()
    z = sum(mass.values())
    own = run(enumerate_exact(Continue(TOY)))
    assert own.log_ml == pytest.approx(math.log(z), abs=1e-12)
    assert own.posterior == pytest.approx({k: v / z for k, v in mass.items()}, abs=1e-12)
    return mass, z


@pytest.mark.parametrize("name", list(PROPOSALS))
def test_enumerate_exact_with_power_law_proposal_equals_brute_force(exact, name):
    mass, z = exact
    result = run(enumerate_exact(Continue(TOY, **PROPOSALS[name])))
    assert result.log_ml == pytest.approx(math.log(z), abs=1e-12)
    assert result.posterior == pytest.approx({k: v / z for k, v in mass.items()}, abs=1e-12)
    # every final particle's history: the original probabilities of its tokens, recorded once each
    for particle in result.particles:
        ctx = particle.context
        probs = [
            math.exp(TOY.sequence_logprob(ctx.tokens[:i], [ctx.tokens[i]]))
            for i in range(1, len(ctx.tokens))
        ]
        queue = PROPOSALS[name]["sampler"].queue_size
        assert power_law_history(ctx) == pytest.approx(tuple(probs[-queue:]), rel=1e-12)


@pytest.mark.parametrize("name", SMC_PROPOSALS)
def test_smc_with_power_law_proposal_is_unbiased(exact, name):
    mass, z = exact
    runs = [
        run(smc_standard(Continue(TOY, **PROPOSALS[name]), 4, seed=seed)) for seed in range(200)
    ]
    z_hats = np.array([math.exp(r.log_ml) if r.log_ml > NEG else 0.0 for r in runs])
    se = z_hats.std(ddof=1) / math.sqrt(len(runs))
    assert abs(z_hats.mean() - z) <= 4 * se, (z_hats.mean(), z, se)
    # unnormalised posterior mass of each first token, Z·π(first = v), is estimated without bias too
    # (whole keys are too rare under a sharp proposal for a 200-run check; first-token events are not)
    for first in {k[:1] for k in mass}:  # "" for the empty text (EOS first)
        m = sum(v for k, v in mass.items() if k[:1] == first)
        est = z_hats * np.array(
            [sum(w for k, w in r.posterior.items() if k[:1] == first) for r in runs]
        )
        assert abs(est.mean() - m) <= 4 * est.std(ddof=1) / math.sqrt(len(runs)), (
            first,
            est.mean(),
            m,
        )


@pytest.mark.parametrize("name", ["default", "min-p+defensive", "adaptive-clamped"])
def test_proposal_density_is_the_formula_for_the_particles_history(name):
    sampler, eps = PROPOSALS[name]["sampler"], PROPOSALS[name].get("defensive", 0.0)
    ctx, history = LMContext(TOY, [0]), []
    rng = np.random.default_rng(0)
    for _ in range(4):  # choose tokens through the proposal, then check q against PL-1/PL-2 by hand
        p = TOY.logprobs(ctx.tokens).exp().numpy()
        recent = history[-(sampler.queue_size - 1) :] if sampler.queue_size > 1 else []
        tau = min(
            max(sampler.target * (len(recent) + 1) - sum(recent), sampler.min_target),
            sampler.max_target,
        )
        new = pl_formula(p, tau, sampler.width, sampler.tail_heaviness, sampler.peak_logit)
        new[p == 0] = NEG
        if sampler.min_p is not None:
            new[p < sampler.min_p * p.max()] = NEG
        q = (1 - eps) * softmax64(new) + eps * p
        proposal = PowerLawProposal(ctx, sampler, defensive=eps)
        log_q, _ = run(proposal.log_probs())
        np.testing.assert_allclose(log_q.exp().numpy(), q, rtol=1e-12, atol=1e-15)
        with using_rng(rng):
            token, lq = run(proposal.sample())
        assert lq == pytest.approx(math.log(q[int(token)]), rel=1e-12)
        history.append(p[int(token)])
        ctx.extend(int(token))
        assert power_law_history(ctx) == pytest.approx(
            tuple(history[-sampler.queue_size :]), rel=1e-12
        )


def test_power_law_proposal_actually_differs_from_the_lm():
    ctx = LMContext(TOY, [0])
    proposal = PowerLawProposal(ctx, PowerLawSampler(target=0.3, width=0.1, queue_size=2))
    log_q, log_p = run(proposal.log_probs())
    assert (log_q - log_p).abs().max() > 0.5
    assert torch.equal(log_q > NEG, log_p > NEG)  # same support


def test_proposal_history_belongs_to_the_particle():
    sampler = PowerLawSampler(target=0.3, width=0.1, queue_size=2)
    model = Continue(TOY, sampler)

    with using_rng(np.random.default_rng(0)):
        run(model.advance())
        clone = model.clone()
        before = power_law_history(model.context)
        assert len(before) == 1 and power_law_history(clone.context) == before
        run(clone.advance())
    assert power_law_history(model.context) == before  # the clone's choice stays with the clone
    assert len(power_law_history(clone.context)) == 2
    assert sampler.history is None  # the shared sampler holds no particle state


def test_proposal_support_and_log_prob_side_effects():
    ctx = LMContext(TOY, [1])  # "d" impossible after "b"
    proposal = PowerLawProposal(ctx, PowerLawSampler())
    support = run(proposal.support())
    assert [int(t) for t, _ in support] == [0, 1, 2, 4]
    assert power_law_history(ctx) == ()  # support records nothing
    lq = run(proposal.log_prob(2))
    assert lq == pytest.approx(dict((int(t), v) for t, v in support)[2])
    assert power_law_history(ctx) == pytest.approx((math.exp(float(TOY.logprobs([1])[2])),))
    assert ctx.tokens == [1]  # the proposal never extends the context


# ---------------------------------------------------------------------- the embedded model
@pytest.mark.slow
def test_generate_with_logits_processor_tracks_the_target(smollm):
    """``generate`` sampled from exactly PL-1 of the logits, each row with the PL-2 target of its
    own choices.

    Reference. The processor's original probabilities are float32 ``torch.softmax`` of the
    scores it was given (the raw logits with EOS at -inf, which is what min_new_tokens does).
    The test computes them with the same call on the same tensor, so they are the same bits on
    any CPU (one kernel per process; each row is reduced in one fixed order, whatever the
    threads). Deriving the softmax error instead does not work: over V = 49k terms the float32
    sum may err by up to (V - 1)·u relatively (u = 2^-24; tiny terms vanish against the running
    sum), and the kernels' order differs by CPU (16 lanes on AVX-512, 8 on AVX2, 4 on NEON).
    The test reproduces the min-p cut the same way, in float32 as the processor does.

    Tolerance: what is left is the processor's float32 arithmetic after the softmax, against
    PL-1 and PL-2 in float64 from the same probabilities.
      PL-2: τ = clamp(1 − Σ h) over the newest 9 window entries (queue 10: target·queue = 1.0
      exactly). The unfilled entries hold float32(0.1) (error <= 0.1u each, 0.9u in all);
      summing 9 probabilities errs by <= 8u·Σh, and Σh <= 1 wherever the clamp does not
      bind (clamp is 1-Lipschitz); the subtraction by <= u. So |Δτ| <= 10u.
      d = |p − τ|: |Δd| <= |Δτ| + u·d <= 11u.
      PL-1 = P·W / (W + d^h), P = 12, W = w^h, w = 0.1, h = 3:
      |d PL-1/dp| = (P·h/w)·y^(h−1)/(1 + y^h)^2, y = d/w, at most (P·h/w)·0.28 (its peak at
      y^3 = 1/2), so Δd moves PL-1 by <= 360·0.28·11u;
      float32 roundings of d^3 (two products), W, P·W, the sum and the division: relative
      error <= 5u, i.e. <= P·5u absolute.
    atol = (360·0.28·11 + 12·5)·u = 1169u ≈ 7.0e-5 (the float64 reference errs by ~1e-15).
    """
    model, tok = smollm.model, smollm.tokenizer
    ids = torch.tensor([tok.encode("The warrior entered the dark")] * 2)  # [B, T]
    target, n_new, queue = 0.1, 24, 10
    sampler = PowerLawSampler(target=target, width=0.1, min_p=0.05, queue_size=queue)
    torch.manual_seed(0)  # generate samples with torch's global generator
    threads = torch.get_num_threads()
    torch.set_num_threads(
        1
    )  # batch 2 gains nothing from threads, and they stall on a shared machine
    try:
        out = model.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            do_sample=True,
            max_new_tokens=n_new,
            min_new_tokens=n_new,
            top_k=None,
            top_p=None,
            temperature=None,
            logits_processor=[sampler],
            output_logits=True,
            output_scores=True,
            return_dict_in_generate=True,
            pad_token_id=tok.eos_token_id,
        )
    finally:
        torch.set_num_threads(threads)
    new = out.sequences[:, ids.shape[1] :]  # [B, n_new]
    seen = torch.stack(out.logits, 1).clone()  # [B, n_new, V] float32, before any processor
    seen[:, :, tok.eos_token_id] = NEG  # min_new_tokens masks EOS before our processor runs
    p32 = torch.stack([torch.softmax(seen[:, t], -1) for t in range(n_new)], 1)  # as the processor
    removed = p32 < 0.05 * p32.amax(-1, keepdim=True)  # [B, n_new, V], the processor's min-p cut
    p = p32.double()
    chosen_p = p.gather(2, new[:, :, None])[:, :, 0]  # [B, n_new]
    u = 2.0**-24
    atol = (12.0 * 3.0 / 0.1 * 0.28 * 11 + 12.0 * 5) * u
    scores = torch.stack(out.scores, 1).double()  # [B, n_new, V] after our processor
    for b in range(ids.shape[0]):
        for t in range(n_new):
            recent = chosen_p[b, max(0, t - queue + 1) : t].tolist()
            tau = min(max(target * (len(recent) + 1) - sum(recent), 0.0), 1.0)
            pt = p[b, t].numpy()
            expected = pl_formula(pt, tau, 0.1, 3.0, 12.0)
            expected[removed[b, t].numpy()] = NEG
            np.testing.assert_allclose(scores[b, t].numpy(), expected, rtol=0, atol=atol)
    mean_p = chosen_p.mean().item()
    plain_p = (p * p).sum(-1).mean().item()  # E[p(chosen)] of plain sampling in the same contexts
    print(
        f"\nchosen tokens' original probability: mean {mean_p:.3f} (target {target}); plain sampling {plain_p:.3f}"
    )
    assert abs(mean_p - target) < abs(plain_p - target)


# ---------------------------------------------------------------------- bad input
@pytest.mark.parametrize(
    "kwargs,match",
    [
        (dict(width=-0.1), "width"),
        (dict(target=1.5), "target"),
        (dict(target=-0.1), "target"),
        (dict(min_target=0.6, max_target=0.4), "min_target"),
        (dict(queue_size=0), "queue_size"),
        (dict(tail_heaviness=0.0), "tail_heaviness"),
        (dict(tail_heaviness=-1.0), "tail_heaviness"),
        (dict(peak_logit=0.0), "peak_logit"),
        (dict(min_p=0.0), "min_p"),
        (dict(min_p=1.5), "min_p"),
        (dict(width=float("nan")), "width"),
        (dict(max_target=2.0), "max_target"),
    ],
)
def test_bad_parameters_raise_value_error(kwargs, match):
    with pytest.raises(ValueError, match=match):
        PowerLawSampler(**kwargs)


def test_bad_types_and_inputs():
    with pytest.raises(TypeError, match="queue_size"):
        PowerLawSampler(queue_size=2.5)
    with pytest.raises(TypeError, match="target"):
        PowerLawSampler(target="0.2")
    with pytest.raises(ValueError, match="preset"):
        PowerLawSampler.preset("wild")
    sampler = PowerLawSampler()
    with pytest.raises(TypeError, match="floating"):
        sampler.reshape(torch.tensor([1, 2, 3]))
    with pytest.raises(ValueError, match="shape"):
        sampler.reshape(torch.zeros(2, 3, 4))
    with pytest.raises(ValueError, match="NaN"):
        sampler.reshape(torch.tensor([0.0, float("nan")]))
    with pytest.raises(ValueError, match="finite"):
        sampler.sample(torch.full((2, 5), NEG), np.random.default_rng(0))
    with pytest.raises(ValueError, match="target"):
        sampler.reshape(torch.zeros(3), target=1.2)
    with pytest.raises(TypeError, match="rng"):
        PowerLawSampler().sample(torch.zeros(3), rng=0)
    ctx = LMContext(TOY, [0])
    with pytest.raises(ValueError, match="defensive"):
        PowerLawProposal(ctx, PowerLawSampler(min_p=0.1))
    with pytest.raises(ValueError, match="defensive"):
        PowerLawProposal(ctx, PowerLawSampler(), defensive=1.5)
    with pytest.raises(TypeError, match="sampler"):
        PowerLawProposal(ctx, object())
    with pytest.raises(TypeError, match="context"):
        PowerLawProposal("ctx", PowerLawSampler())
