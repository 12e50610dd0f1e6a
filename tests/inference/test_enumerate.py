"""enumerate_exact against sums written out by hand."""

import math

import pytest
from programs import AllFailProgram, ConditionProgram, toy_lm

from llamppl import Bernoulli, Categorical, Geometric, Model, run
from llamppl.inference import enumerate_exact


class TwoCoins(Model):
    """x ~ Bern(0.3), y ~ Bern(0.6); observe Bern(0.9 if x==y else 0.2) = True; condition(x or y)."""

    def __init__(self):
        super().__init__()
        self.x = self.y = None

    async def step(self):
        self.x = await self.sample(Bernoulli(0.3))
        self.y = await self.sample(Bernoulli(0.6), proposal=Bernoulli(0.5))
        await self.observe(Bernoulli(0.9 if self.x == self.y else 0.2), True)
        self.condition(self.x or self.y)
        self.finish()

    def string_for_serialization(self):
        return f"{int(self.x)}{int(self.y)}"


def test_hand_computed_z_and_posterior():
    exact = run(enumerate_exact(TwoCoins()))
    joint = {"11": 0.3 * 0.6 * 0.9, "10": 0.3 * 0.4 * 0.2, "01": 0.7 * 0.6 * 0.2}
    z = sum(joint.values())
    assert exact.log_ml == pytest.approx(math.log(z), abs=1e-12)
    assert exact.posterior == pytest.approx({k: v / z for k, v in joint.items()}, abs=1e-12)


def test_lm_program_matches_brute_force():
    lm = toy_lm()
    exact = run(enumerate_exact(ConditionProgram(lm)))
    # brute force over all token strings of length <= 3 that stop at EOS or length 3
    total, post = 0.0, {}

    def walk(ctx, text, p):
        nonlocal total
        for t in range(4):
            q = p * math.exp(lm.logprobs(ctx)[t])
            s = text + lm.vocab[t]
            if s.count("b") > 1:
                continue
            if t == 3 or len(ctx) == 3:
                total += q
                key = text if t == 3 else s  # str(context) shows no end token
                post[key] = post.get(key, 0.0) + q
            else:
                walk(ctx + (t,), s, q)

    walk((0,), "", 1.0)
    assert math.exp(exact.log_ml) == pytest.approx(total, rel=1e-10)
    assert exact.posterior == pytest.approx({k: v / total for k, v in post.items()}, abs=1e-10)


def test_all_paths_fail_gives_minus_inf_without_nan():
    exact = run(enumerate_exact(AllFailProgram(toy_lm())))
    assert exact.log_ml == -math.inf
    assert exact.posterior == {}
    with pytest.raises(ValueError, match="weight zero"):
        exact.sample()


def test_categorical_with_zero_probabilities_is_skipped():
    class M(Model):
        async def step(self):
            self.v = await self.sample(Categorical([0.0, 0.25, 0.75]))
            self.finish()

    exact = run(enumerate_exact(M()))
    assert exact.posterior == pytest.approx({"1": 0.25, "2": 0.75})


def test_infinite_support_is_a_clear_error():
    class M(Model):
        async def step(self):
            self.v = await self.sample(Geometric(0.5))
            self.finish()

    with pytest.raises(NotImplementedError, match="Geometric does not enumerate"):
        run(enumerate_exact(M()))


def test_max_steps_truncates_with_warning():
    class Forever(Model):
        async def step(self):
            self.v = await self.sample(Bernoulli(0.5))

    with pytest.warns(UserWarning, match="max_steps=3"):
        exact = run(enumerate_exact(Forever(), max_steps=3))
    assert math.exp(exact.log_ml) == pytest.approx(1.0)
