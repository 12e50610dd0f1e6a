"""The modeling DSL: plain and async steps, primitives' weights, cloning, reproducibility, run()."""

import asyncio
import math

import numpy as np
import pytest

from llamppl import (
    Bernoulli,
    Categorical,
    Dirac,
    FunctionLM,
    Geometric,
    LMContext,
    Model,
    Token,
    Uniform,
    run,
)
from llamppl.inference import enumerate_exact, importance_sampling, smc_standard, smc_steer


def lm3():
    return FunctionLM(["x", "y", "."], 2, lambda ctx: [0.3, -0.2 + 0.1 * len(ctx), 0.1 * len(ctx)])


class AsyncProgram(Model):
    def __init__(self, lm):
        super().__init__()
        self.context = LMContext(lm, [0])

    async def step(self):
        token = await self.sample(self.context.next_token())
        await self.observe(Bernoulli(0.8 if token == 0 else 0.3), True)
        if token == 2 or len(self.context.generated) >= 3:
            self.finish()


class PlainProgram(Model):
    def __init__(self, lm):
        self.context = LMContext(lm, [0])  # no super().__init__(): bookkeeping still exists

    def step(self):
        token = self.sample(self.context.next_token())
        self.observe(Bernoulli(0.8 if token == 0 else 0.3), True)
        if token == 2 or len(self.context.generated) >= 3:
            self.finish()


def test_plain_and_async_steps_define_the_same_model():
    lm = lm3()
    a, p = run(enumerate_exact(AsyncProgram(lm))), run(enumerate_exact(PlainProgram(lm)))
    assert a.log_ml == pytest.approx(p.log_ml, abs=1e-12)
    assert a.posterior == pytest.approx(p.posterior, abs=1e-12)


def test_plain_step_is_batched_across_particles():
    lm = lm3()
    result = run(smc_standard(PlainProgram(lm), 16, seed=0))
    assert result.stats["batch_calls"] == result.stats["steps"]


def test_sample_with_proposal_scores_the_importance_ratio():
    class M(Model):
        async def step(self):
            self.v = await self.sample(Bernoulli(0.2), proposal=Dirac(True))
            self.finish()

    result = run(importance_sampling(M(), 3, seed=0))
    assert result.log_weights.tolist() == pytest.approx([math.log(0.2)] * 3)


def test_twist_condition_score_and_finish():
    class M(Model):
        async def step(self):
            self.twist(1.5)
            self.twist(-0.5)
            self.score(0.25)
            self.condition(True)
            self.finish()

    m = M()
    run(m.advance())
    assert m.weight == pytest.approx(1.25) and m.finished and m.done_stepping()
    m.condition(False)
    assert m.weight == -math.inf
    with pytest.raises(ValueError, match="NaN"):
        m.score(float("nan"))


def test_dead_particle_stops_at_next_sample():
    reached = []

    class M(Model):
        async def step(self):
            self.condition(False)
            await self.sample(Bernoulli(0.5))
            reached.append(True)

    m = M()
    run(m.advance())
    assert m.done_stepping() and not reached


def test_clone_copies_state_and_shares_the_lm():
    lm = lm3()
    m = AsyncProgram(lm)
    c = m.clone()
    c.context.extend(1)
    assert m.context.tokens == [0] and c.context.tokens == [0, 1]
    assert c.context.lm is lm


def test_runs_are_reproducible_with_a_seed():
    lm = lm3()
    for alg in (
        lambda s: smc_standard(AsyncProgram(lm), 8, seed=s),
        lambda s: smc_steer(AsyncProgram(lm), 4, 2, seed=s),
    ):
        a, b = run(alg(7)), run(alg(7))
        assert a.log_ml == b.log_ml and [str(p) for p in a] == [str(p) for p in b]


def test_result_interface():
    result = run(smc_standard(AsyncProgram(lm3()), 8, seed=1))
    assert len(result) == 8 and list(result) == result.particles
    assert sum(result.posterior.values()) == pytest.approx(1.0)
    assert isinstance(result.sample(0), AsyncProgram)
    assert result.history[-1].log_ml == pytest.approx(result.log_ml)
    assert "<table>" in result._repr_html_()


def test_user_errors_surface_with_their_traceback():
    class Broken(Model):
        async def step(self):
            raise KeyError("boom in user code")

    class BrokenPlain(Model):
        def step(self):
            self.sample(Bernoulli(0.5))
            {}["missing"]

    with pytest.raises(KeyError, match="boom in user code"):
        run(smc_standard(Broken(), 4, seed=0))
    with pytest.raises(KeyError, match="missing") as info:
        run(smc_standard(BrokenPlain(), 4, seed=0))
    assert any(entry.name == "step" for entry in info.traceback)


def test_run_inside_a_running_event_loop():
    async def notebook_cell():  # Jupyter runs cells inside a live loop
        return run(smc_standard(AsyncProgram(lm3()), 4, seed=0))

    result = asyncio.run(notebook_cell())
    assert len(result) == 4


def test_token_semantics():
    lm = lm3()
    t = Token(lm, 1)
    assert t == 1 and t == Token(lm, 1) and t != 2 and str(t) == "y" and int(t) == 1
    assert hash(t) == hash(1)


async def _dist_checks():
    for dist, values in [
        (Bernoulli(0.25), [True, False]),
        (Categorical([1.0, 3.0]), [0, 1]),
        (Uniform(["a", "b", "c"]), ["a", "b", "c"]),
        (Dirac(4), [4]),
    ]:
        support = await dist.support()
        assert [v for v, _ in support] == values
        assert sum(math.exp(lp) for _, lp in support) == pytest.approx(1.0)
        value, lp = await dist.sample(np.random.default_rng(0))
        assert lp == pytest.approx(await dist.log_prob(value))
    assert await Geometric(0.5).log_prob(2) == pytest.approx(math.log(0.125))


def test_distributions_normalised_and_consistent():
    asyncio.run(_dist_checks())


def test_tempered_context_log_prob_is_the_tempered_one():
    lm = lm3()

    async def check():
        ctx = LMContext(lm, [0], temp=0.5)
        lp = await ctx.next_token().log_prob(1)
        base = lm.logprobs((0,))
        expected = float(2 * base[1] - np.logaddexp.reduce(2 * base.numpy()))
        assert lp == pytest.approx(expected)

    asyncio.run(check())


def test_mask_dist_restricts_the_next_token():
    lm = lm3()

    async def check():
        ctx = LMContext(lm, [0])
        mass = await ctx.mask_dist({0, 2}).log_prob(True)
        p = lm.logprobs((0,)).exp()
        assert math.exp(mass) == pytest.approx(float(p[0] + p[2]))
        support = await ctx.next_token().support()
        assert [int(t) for t, _ in support] == [0, 2]
        assert sum(math.exp(lp) for _, lp in support) == pytest.approx(1.0)

    asyncio.run(check())


# ----------------------------------------------------------------------------- bad input
class NoStep(Model):
    pass


@pytest.mark.parametrize("n", [0, -3])
def test_n_particles_must_be_positive(n):
    with pytest.raises(ValueError, match="n_particles must be a positive integer"):
        run(smc_standard(AsyncProgram(lm3()), n))


def test_n_particles_must_be_int():
    with pytest.raises(TypeError, match="n_particles"):
        run(importance_sampling(AsyncProgram(lm3()), 2.5))


@pytest.mark.parametrize(
    "threshold,words",
    [(-0.1, r"must lie in \[0, 1\]"), (1.5, r"must lie in \[0, 1\]"), (float("nan"), "")],
)
def test_ess_threshold_range(threshold, words):
    with pytest.raises(ValueError, match="ess_threshold " + words):
        run(smc_standard(AsyncProgram(lm3()), 4, ess_threshold=threshold))


def test_ess_threshold_zero_never_resamples_and_estimates_z():
    model = AsyncProgram(lm3())
    z = math.exp(run(enumerate_exact(model)).log_ml)
    runs = [run(smc_standard(model, 4, ess_threshold=0.0, seed=s)) for s in range(200)]
    assert not any(step.resampled for r in runs for step in r.history)
    z_hats = np.array([math.exp(r.log_ml) for r in runs])
    se = z_hats.std(ddof=1) / math.sqrt(len(z_hats))
    assert abs(z_hats.mean() - z) < 4 * se, (z_hats.mean(), z, se)


def test_unknown_resampling_name():
    with pytest.raises(ValueError, match="resampling must be one of"):
        run(smc_standard(AsyncProgram(lm3()), 4, resampling="greedy"))


def test_n_beam_at_least_one():
    with pytest.raises(ValueError, match="n_beam"):
        run(smc_steer(AsyncProgram(lm3()), 4, 0))


def test_model_without_step():
    with pytest.raises(TypeError, match="must define a step"):
        run(smc_standard(NoStep(), 4))
    with pytest.raises(TypeError, match="model must be an instance"):
        run(smc_standard(object(), 4))


@pytest.mark.parametrize(
    "probs,match", [([0.5, -0.1], "non-negative"), ([0.0, 0.0], "all zero"), ([], "non-empty")]
)
def test_categorical_bad_probs(probs, match):
    with pytest.raises(ValueError, match=match):
        Categorical(probs)


def test_empty_prompt_without_bos():
    with pytest.raises(ValueError, match="prompt must be non-empty"):
        LMContext(lm3(), "")
    with_bos = FunctionLM(["<s>", "a", "."], 2, lambda ctx: [0.0, 0.0, 0.0], bos_token_id=0)
    assert LMContext(with_bos, "").tokens == [0]


def test_sample_needs_a_distribution():
    class M(Model):
        async def step(self):
            await self.sample([0.5, 0.5])

    with pytest.raises(TypeError, match="needs a Distribution"):
        run(smc_standard(M(), 2))
