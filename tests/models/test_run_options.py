"""Run options as one value: every driver takes the run options, with one set of checks.

The drivers built on an engine (``power_smc``, ``speculative_smc``, ``generate_json``,
``particle_gibbs``) forward ``**run`` to :func:`llamppl.inference.options.options_from`,
so each takes ``seed``, ``progress``, ``record`` and ``max_steps`` with the engines'
meaning, each run can be seen in the viewer, and ``ess_threshold=0`` means "never
resample" wherever the math allows it.
"""

from __future__ import annotations

import dataclasses
import math

import pytest

pytest.importorskip("llguidance", reason="generate_json needs llguidance (dev extra)")

from llamppl import Bernoulli, FunctionLM, Model, run  # noqa: E402
from llamppl.decoding.grammar.json_budget import JSONBudget  # noqa: E402
from llamppl.inference import StepLimitError, enumerate_exact, particle_gibbs  # noqa: E402
from llamppl.inference.viewer import render_html  # noqa: E402
from llamppl.models import generate_json, power_smc, speculative_smc  # noqa: E402

VOCAB = ["a", "b", "."]
EOS = 2
LM = FunctionLM(VOCAB, EOS, lambda ctx: [0.3 * len(ctx), 0.1, -0.2 + 0.4 * len(ctx)])
DRAFT = FunctionLM(VOCAB, EOS, lambda ctx: [0.2, 0.2 * len(ctx), -0.1 + 0.3 * len(ctx)])
DIGITS = FunctionLM(
    ["<s>", "1", "3", "4", "<eos>"], 4, lambda ctx: [0.0, 0.5, 0.2, 0.1, 0.3], bos_token_id=0
)


class Coin(Model):
    """Two Bernoulli draws, the second conditioned to agree with the first."""

    def __init__(self) -> None:
        super().__init__()
        self.draws: list[bool] = []

    async def step(self) -> None:
        self.draws.append(bool(await self.sample(Bernoulli(0.3))))
        if len(self.draws) == 2:
            self.condition(self.draws[0] == self.draws[1])
            self.finish()

    def string_for_serialization(self) -> str:
        return str(self.draws)


DRIVERS = {
    "power_smc": lambda **kw: power_smc(LM, [0], 2.0, 4, 0.5, 0, 4, **kw),
    "speculative_smc": lambda **kw: speculative_smc(LM, DRAFT, [0], 4, 2, 4, **kw),
    "particle_gibbs": lambda **kw: particle_gibbs(Coin(), 6, 4, **kw),
}


def _result(name, out):
    return out if name == "particle_gibbs" else out.result


@pytest.mark.parametrize("name", sorted(DRIVERS))
def test_every_driver_takes_record_and_the_viewer_renders_it(name, tmp_path):
    path = tmp_path / f"{name}.json"
    out = run(DRIVERS[name](seed=0, record=path, progress=False))
    record = out.records[-1] if name == "particle_gibbs" else out.result.record
    assert record is not None and record["steps"] and path.stat().st_size > 0
    assert "<html" in render_html(record).lower()


@pytest.mark.parametrize("name", sorted(DRIVERS))
def test_every_driver_takes_max_steps_and_stops_there(name):
    with pytest.raises(StepLimitError, match=r"after step 1 \(max_steps=1\)"):
        run(DRIVERS[name](seed=0, max_steps=1))


@pytest.mark.parametrize("name", sorted(DRIVERS))
def test_every_driver_checks_its_run_options_in_one_place(name):
    with pytest.raises(TypeError, match=rf"{name}\(\) got unexpected keyword argument\(s\) 'sede'"):
        run(DRIVERS[name](sede=0))
    with pytest.raises(ValueError, match="max_steps must be a positive integer"):
        run(DRIVERS[name](max_steps=0))
    with pytest.raises(TypeError, match="progress must be True, False or None"):
        run(DRIVERS[name](progress="yes"))


@pytest.mark.parametrize("name", sorted(DRIVERS))
def test_a_seed_fixes_every_driver(name):
    a, b = (run(DRIVERS[name](seed=3)) for _ in range(2))
    if name == "particle_gibbs":
        assert [p.draws for p in a] == [p.draws for p in b]
    else:
        assert a.tokens == b.tokens and a.result.log_ml == b.result.log_ml


def test_power_smc_with_ess_threshold_zero_never_resamples():
    out = run(power_smc(LM, [0], 2.0, 8, 0.0, 0, 4, seed=0))
    assert out.result.history and not any(h.resampled for h in out.result.history)


def test_speculative_smc_with_ess_threshold_zero_never_resamples():
    out = run(speculative_smc(LM, DRAFT, [0], 8, 2, 4, 0.0, seed=0))
    assert not any(h.resampled for h in out.result.history)


def test_particle_gibbs_without_resampling_keeps_the_posterior():
    """``ess_threshold=0``: each iteration is conditional importance sampling, still exact.

    Coin's posterior puts 0.3²/(0.3² + 0.7²) on [True, True]. Over 600 iterations the
    chain's frequency must lie within 4 standard errors, with the standard error of a
    mean of 600 Bernoulli draws inflated by a factor 2 for the chain's autocorrelation
    (N = 4 particles, independent proposals).
    """
    exact = run(enumerate_exact(Coin())).posterior
    p = exact["[True, True]"]
    chain = run(particle_gibbs(Coin(), 4, 600, ess_threshold=0.0, seed=1))
    freq = chain.posterior.get("[True, True]", 0.0)
    se = 2 * math.sqrt(p * (1 - p) / 600)
    assert abs(freq - p) <= 4 * se, (freq, p, se)


def test_generate_json_takes_the_run_options_and_a_budget_value(tmp_path):
    schema = {"type": "integer"}
    out = generate_json(DIGITS, [], schema, 4, seed=0, max_tokens=3, record=True)
    assert out.result.record is not None and out.result.record["steps"]
    with pytest.raises(StepLimitError):
        generate_json(DIGITS, [], schema, 4, seed=0, max_tokens=3, max_steps=1)
    with pytest.raises(TypeError, match=r"generate_json\(\) got unexpected keyword"):
        generate_json(DIGITS, [], schema, 4, seed=0, colour="red")
    by_value = generate_json(DIGITS, [], schema, 4, seed=0, max_tokens=3, budget=JSONBudget())
    assert by_value.log_ml == out.log_ml and by_value.texts == out.texts


def test_json_budget_is_one_hashable_value_and_the_one_way_in():
    import inspect

    from llamppl.compat.adapters import BUDGET_KEYWORDS
    from llamppl.decoding.grammar.compile import Grammar, json_grammar
    from llamppl.decoding.grammar.engine import make_grammar
    from llamppl.models import GrammarConstraint

    a = JSONBudget(max_string_length=8)
    assert a == JSONBudget(max_string_length=8) and hash(a) == hash(JSONBudget(max_string_length=8))
    with pytest.raises(ValueError, match="max_string_length must be a positive integer"):
        JSONBudget(max_string_length=0)
    with pytest.raises(ValueError, match="whitespace must be one of"):
        JSONBudget(whitespace="pretty")
    for fn in (
        generate_json,
        GrammarConstraint,
        Grammar.from_json_schema,
        json_grammar,
        make_grammar,
    ):
        params = inspect.signature(fn).parameters  # ours: the budget is one value
        assert params["budget"].default is None and not set(params) & set(BUDGET_KEYWORDS)
    schema = {"type": "object", "properties": {"s": {"type": "string"}}}
    same = dataclasses.replace(JSONBudget(), max_string_length=8)
    assert json_grammar(schema, budget=a) is json_grammar(schema, budget=same)  # one cache key
    with pytest.raises(TypeError, match="budget must be a JSONBudget or None, got dict"):
        generate_json(DIGITS, [], {"type": "integer"}, 4, budget={"max_array_items": 2})
    with pytest.raises(ValueError, match="give budget= or the keywords"):  # an old spelling too
        generate_json(DIGITS, [], {"type": "integer"}, 4, budget=a, max_array_items=2)
