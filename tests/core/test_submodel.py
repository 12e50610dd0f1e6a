"""Submodels (``Model.call``, ``SubModel``, ``@submodel``) checked against brute-force enumeration.

The program calls one submodel twice (and a nested one inside it); its exact
Z is computed here by summing over all choices by hand, independently of
``enumerate_exact``. ``enumerate_exact`` must reproduce it through the
submodels, and importance sampling (proposal ≠ prior inside the submodel)
must be unbiased: the mean of Ẑ over 200 seeds within 4 standard errors.
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from inference import enumerate_exact, importance_sampling
from llamppl import Bernoulli, Categorical, Model, SubModel, run, submodel

P_B = [0.2, 0.3, 0.5]
Q_B = [1 / 3, 1 / 3, 1 / 3]


@submodel
async def flip(self, p):
    return await self.sample(Bernoulli(p))


@submodel
async def pick(self, p):
    a = await self.call(flip(p))  # nested submodel
    b = await self.sample(Categorical(P_B), proposal=Categorical(Q_B))
    await self.observe(Bernoulli(0.3 if a else 0.8), b == 2)
    return int(a) + b


class Two(Model):
    async def step(self):
        x = await self.call(pick(0.4))
        y = await self.call(pick(0.7))
        self.total = x + y
        self.condition(self.total != 3)
        self.finish()


class TwoPlain(Model):
    def step(self):  # plain step: self.call returns the value
        x = self.call(pick(0.4))
        y = self.call(pick(0.7))
        self.total = x + y
        self.condition(self.total != 3)
        self.finish()


def exact() -> tuple[float, dict[int, float]]:
    post: dict[int, float] = {}
    for a1, b1, a2, b2 in itertools.product([0, 1], range(3), [0, 1], range(3)):
        w = 1.0
        for a, b, p in ((a1, b1, 0.4), (a2, b2, 0.7)):
            w *= (p if a else 1 - p) * P_B[b]
            like = 0.3 if a else 0.8
            w *= like if b == 2 else 1 - like
        total = a1 + b1 + a2 + b2
        if total != 3:
            post[total] = post.get(total, 0.0) + w
    z = sum(post.values())
    return z, {k: v / z for k, v in post.items()}


@pytest.mark.parametrize("cls", [Two, TwoPlain])
def test_enumerate_exact_through_submodels(cls):
    z, post = exact()
    result = run(enumerate_exact(cls()))
    assert result.log_ml == pytest.approx(math.log(z), abs=1e-12)
    got: dict[int, float] = {}
    for p, w in zip(result.particles, np.exp(result.log_weights - result.log_ml)):
        got[p.total] = got.get(p.total, 0.0) + w
    assert got == pytest.approx(post, abs=1e-12)


@pytest.mark.parametrize("cls", [Two, TwoPlain])
def test_importance_sampling_unbiased_through_submodels(cls):
    z, _ = exact()
    zs = np.array(
        [
            math.exp(run(importance_sampling(cls(), n_particles=4, seed=s)).log_ml)
            for s in range(200)
        ]
    )
    se = zs.std(ddof=1) / math.sqrt(zs.size)
    assert abs(zs.mean() - z) < 4 * se


class NotAsync(SubModel):
    def forward(self):
        return 1


class CallsBad(Model):
    def __init__(self, sub):
        super().__init__()
        self.sub = sub

    async def step(self):
        await self.call(self.sub)


@pytest.mark.parametrize(
    "bad, name", [(flip, "function"), (NotAsync(), "NotAsync"), (Bernoulli(0.5), "Bernoulli")]
)
def test_call_rejects_non_submodels(bad, name):
    with pytest.raises(TypeError, match=name):
        run(CallsBad(bad).advance())


def test_submodel_decorator_needs_async():
    with pytest.raises(TypeError, match="async def"):
        submodel(lambda self: None)


class Twisted(Model):
    def __init__(self):
        super().__init__()
        self.shared = {"table": [1, 2]}
        self.own = [0]

    def immutable_properties(self):
        return {"shared"}

    async def step(self):
        self.twist(1.5)
        self.twist(-0.5)
        self.finish()


def test_untwist_reset_immutable_properties_intervene():
    m = Twisted()
    run(m.advance())
    assert m.weight == pytest.approx(1.0)
    m.untwist()
    assert m.weight == pytest.approx(0.0)
    c = m.clone()
    assert c.shared is m.shared and c.own is not m.own
    m.score(-2.0)
    m.reset()
    assert (m.weight, m.finished) == (0.0, False)
    assert run(m.intervene(Bernoulli(0.25), True)) is True
    assert m.weight == 0.0  # intervene does not score
