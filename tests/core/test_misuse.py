"""Misuse of the DSL fails at once with a TypeError naming the argument: no silent coercion, no hang."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from llamppl import Bernoulli, Categorical, Distribution, Model, SubModel, run, submodel
from llamppl.inference import enumerate_exact, importance_sampling, smc_standard, smc_steer


class Scores(Model):
    """One step that applies ``action`` (a function of the model) and finishes."""

    def __init__(self, action) -> None:
        super().__init__()
        self.action = action

    async def step(self) -> None:
        self.action(self)
        self.finish()


def weight_after(action) -> float:
    model = Scores(action)
    run(model.run_step())
    return model.weight


@pytest.mark.parametrize(
    "value", [0.5, 2, np.float32(0.5), np.int64(2), np.array(0.5), torch.tensor(0.5), -math.inf]
)
def test_score_and_twist_accept_real_numbers(value):
    assert weight_after(lambda m: m.score(value)) == float(value)
    assert weight_after(lambda m: m.twist(value)) == float(value)


def test_a_twist_as_large_as_float64_allows_is_undone_exactly_and_a_larger_one_is_refused():
    from llamppl.modeling import TWIST_LIMIT

    def twist_and_undo(amount):
        def action(m):
            m.score(-1.5)
            m.twist(amount)
            m.untwist()

        return action

    # 10^6 nats and back: the weight is -1.5 to float64's spacing at 10^6 (2^-33)
    assert abs(weight_after(twist_and_undo(TWIST_LIMIT)) + 1.5) <= 2**-33
    assert weight_after(twist_and_undo(-TWIST_LIMIT)) == pytest.approx(-1.5, abs=2**-33)
    for amount in (1e17, -1e17, TWIST_LIMIT * (1 + 1e-12), math.inf):  # 1e17 would give w = 0
        with pytest.raises(ValueError, match=r"twist\(amount\) must lie within ±1e\+06 nats"):
            weight_after(twist_and_undo(amount))
    with pytest.raises(ValueError, match="twists not yet undone"):  # each small, the sum not
        weight_after(lambda m: [m.twist(0.6 * TWIST_LIMIT) for _ in range(2)])


@pytest.mark.parametrize(
    "value", ["1", True, np.bool_(True), None, 1j, torch.tensor([0.5, 0.5]), np.array([0.5])]
)
@pytest.mark.parametrize("primitive", ["score", "twist"])
def test_score_and_twist_refuse_anything_else(value, primitive):
    argument = "log_w" if primitive == "score" else "amount"
    with pytest.raises(TypeError, match=rf"{primitive}\({argument}\) must be a real number"):
        weight_after(lambda m: getattr(m, primitive)(value))


@pytest.mark.parametrize(
    "value, ok", [(True, True), (np.bool_(False), False), (torch.tensor(True), True),
                  (np.array(False), False), (torch.tensor(2) > 1, True)],
)  # fmt: skip
def test_condition_accepts_bool_likes(value, ok):
    assert weight_after(lambda m: m.condition(value)) == (0.0 if ok else -math.inf)


@pytest.mark.parametrize(
    "value", ["no", "", 0.5, 1, 0, None, torch.tensor([True, False]), torch.tensor(1.0), [True]]
)
def test_condition_refuses_numbers_strings_and_tensors_with_elements(value):
    with pytest.raises(TypeError, match=r"condition\(ok\) must be a bool"):
        weight_after(lambda m: m.condition(value))


class StringLogProb(Distribution):
    async def sample(self, rng=None):
        return 0, "0.0"

    async def log_prob(self, value):
        return "0.0"


class ObservesBadLogProb(Model):
    async def step(self) -> None:
        await self.observe(StringLogProb(), 0)
        self.finish()


def test_a_log_prob_that_is_not_a_number_names_the_distribution():
    with pytest.raises(TypeError, match=r"StringLogProb.log_prob\(value\) must be a real number"):
        run(importance_sampling(ObservesBadLogProb(), 2, seed=0))


# ---------------------------------------------------------------- a forgotten `await`
class Forgets(Model):
    """Forgets one `await`; its guard fails (instead of hanging) if the step keeps being run."""

    steps = 0

    def __init__(self, primitive: str) -> None:
        super().__init__()
        self.primitive = primitive
        self.last = None

    async def step(self) -> None:
        type(self).steps += 1
        assert type(self).steps < 100, "the missing await was not caught"
        dist = Bernoulli(0.5)
        if self.primitive == "sample":
            self.last = self.sample(dist)  # missing await: a coroutine, never a token
        elif self.primitive == "observe":
            self.observe(dist, True)
        elif self.primitive == "intervene":
            self.intervene(dist, True)
        elif self.primitive == "call":
            self.call(coin())
        elif self.primitive == "submodel":
            await self.call(forgetful())
        if self.last is True:  # never: `last` is a coroutine
            self.finish()


@submodel
async def coin(self):
    return await self.sample(Bernoulli(0.5))


@submodel
async def forgetful(self):
    self.sample(Bernoulli(0.5))  # missing await inside a submodel
    return None


@pytest.mark.parametrize(
    "primitive, advice",
    [
        ("sample", "token = await self.sample"),
        ("observe", "await self.observe"),
        ("intervene", "await self.intervene"),
        ("call", "result = await self.call"),
        ("submodel", "token = await self.sample"),
    ],
)
@pytest.mark.parametrize(
    "engine",
    [
        lambda m: smc_standard(m, 4, seed=0),
        lambda m: smc_steer(m, 2, 2, seed=0),
        lambda m: importance_sampling(m, 3, seed=0),
        lambda m: enumerate_exact(m),
    ],
)
def test_a_forgotten_await_is_a_type_error_at_the_end_of_the_first_step(
    primitive, advice, engine, recwarn
):
    Forgets.steps = 0
    with pytest.raises(
        TypeError, match=rf"Forgets.step called self\.\w+\(...\) without `await`.*{advice}"
    ):
        run(engine(Forgets(primitive)))
    assert 1 <= Forgets.steps <= 4  # the first step of each particle, not a loop
    assert not [w for w in recwarn if "never awaited" in str(w.message)]


def test_awaited_primitives_and_a_stored_then_awaited_coroutine_are_fine():
    class Later(Model):
        async def step(self) -> None:
            pending = self.sample(Categorical([0.5, 0.5]))
            self.value = await pending
            self.finish()

    result = run(smc_standard(Later(), 4, seed=0))
    assert math.isclose(result.log_ml, 0.0)


def test_a_user_error_in_a_step_is_not_masked_by_the_await_check():
    class Fails(Model):
        async def step(self) -> None:
            self.sample(Bernoulli(0.5))  # unawaited, but the real error comes first
            raise KeyError("the user's bug")

    with pytest.raises(KeyError, match="the user's bug"):
        run(smc_standard(Fails(), 2, seed=0))


def test_submodel_primitives_reach_the_parent_through_the_public_interface():
    class Parent(Model):
        async def step(self) -> None:
            self.flips = await self.call(coin())
            self.finish()

    exact = run(enumerate_exact(Parent()))
    assert exact.posterior == pytest.approx({"True": 0.5, "False": 0.5})
    assert isinstance(coin(), SubModel)
