"""The shared engine loop: one StepInfo per step, the step limit, the memory check, early record checks."""

from __future__ import annotations

import math

import pytest
from programs import ConditionProgram, toy_lm

from llamppl import Bernoulli, Model, run
from llamppl.inference import (
    StepInfo,
    StepLimitError,
    StepRecord,
    budget,
    csmc_standard,
    importance_sampling,
    smc_standard,
    smc_steer,
)

ENGINES = {
    "smc_standard": lambda m, **kw: smc_standard(m, 4, 1.0, seed=0, **kw),
    "smc_steer": lambda m, **kw: smc_steer(m, 4, 2, seed=0, **kw),
    "importance_sampling": lambda m, **kw: importance_sampling(m, 4, seed=0, **kw),
    "csmc_standard": lambda m, **kw: csmc_standard(m, 4, None, seed=0, **kw),
}


class Forever(Model):
    """Never calls finish(); its own guard fails long before a hang, so the test cannot hang."""

    calls = 0

    def __init__(self) -> None:
        super().__init__()
        self.n = 0

    async def step(self) -> None:
        type(self).calls += 1
        assert type(self).calls < 10_000, "ran far past max_steps"
        self.n += int(await self.sample(Bernoulli(0.5)))


@pytest.mark.parametrize("name", sorted(ENGINES))
def test_a_step_that_never_finishes_stops_at_max_steps_naming_model_and_step(name):
    Forever.calls = 0
    with pytest.raises(StepLimitError, match=r"Forever.*after step 7 \(max_steps=7\)") as err:
        run(ENGINES[name](Forever(), max_steps=7))
    result = err.value.result  # the run so far is not lost
    assert len(result.history) == 7 and result.stats["steps"] == 7
    assert result.particles and not any(p.finished for p in result.particles)
    assert Forever.calls <= 7 * 4 * 2  # 7 steps of at most N·K particles


@pytest.mark.parametrize("name", sorted(ENGINES))
def test_max_steps_is_checked_and_a_finishing_program_is_unaffected(name):
    with pytest.raises(ValueError, match="max_steps must be a positive integer"):
        run(ENGINES[name](ConditionProgram(toy_lm()), max_steps=0))
    with pytest.raises(TypeError, match="max_steps must be a positive integer"):
        run(ENGINES[name](ConditionProgram(toy_lm()), max_steps=2.5))
    limited = run(ENGINES[name](ConditionProgram(toy_lm()), max_steps=3))  # ends by step 3
    default = run(ENGINES[name](ConditionProgram(toy_lm())))
    assert limited.log_ml == default.log_ml and len(limited.history) == len(default.history) <= 3


@pytest.mark.parametrize("name", sorted(ENGINES))
def test_history_and_record_come_from_one_step_info(name):
    result = run(ENGINES[name](ConditionProgram(toy_lm()), record=True))
    assert StepRecord is StepInfo and all(type(h) is StepInfo for h in result.history)
    assert [h.step for h in result.history] == list(range(1, len(result.history) + 1))
    for info, snap in zip(result.history, result.record["steps"]):
        assert info.particles is None  # the history keeps no particle alive
        assert snap["ess"] == info.ess and snap["resampled"] == info.resampled
        weights = [
            -math.inf if p["log_weight"] is None else p["log_weight"] for p in snap["particles"]
        ]
        assert weights == info.log_weights.tolist()
    assert "log_weights" not in repr(result.history[-1])


class Counted(Model):
    """Counts its clones, so a run that starts cloning 10**12 particles fails instead of hanging."""

    clones = 0

    def __init__(self) -> None:
        super().__init__()
        self.x = 0

    def clone(self):
        type(self).clones += 1
        assert type(self).clones < 10_000, "started cloning the population"
        return super().clone()

    async def step(self) -> None:
        self.finish()


@pytest.mark.parametrize("name", sorted(ENGINES))
def test_a_population_that_cannot_fit_is_refused_up_front_with_the_numbers(name):
    Counted.clones = 0
    engine = {
        "smc_standard": lambda n: smc_standard(Counted(), n),
        "smc_steer": lambda n: smc_steer(Counted(), n, 2),
        "importance_sampling": lambda n: importance_sampling(Counted(), n),
        "csmc_standard": lambda n: csmc_standard(Counted(), n),
    }[name]
    with pytest.raises(ValueError, match=r"n_particles=1000000000000 needs about .* available"):
        run(engine(10**12))
    assert Counted.clones == 1  # measured by cloning once, nothing else started


def test_the_estimate_counts_the_particles_and_the_lm_rows(monkeypatch):
    lm = toy_lm()
    program = ConditionProgram(lm)
    need, why = budget.run_memory(program, 10**7, [lm])
    per_particle = budget.particle_bytes(program) + 4 * lm.vocab_size + 64
    assert need >= 10**7 * per_particle > 10**9  # 10**7 particles: gigabytes
    assert "10000000 particles" in why
    Counted.clones = 0
    need, _ = budget.run_memory(Counted(), 10**7, [])
    monkeypatch.setattr(budget, "available_memory", lambda: need // 2)
    with pytest.raises(ValueError, match=r"n_particles=10000000 needs about .*available"):
        run(smc_standard(Counted(), 10**7))
    monkeypatch.setattr(budget, "available_memory", lambda: 10 * need)
    assert run(smc_standard(Counted(), 2, seed=0)).log_ml == 0.0


class Counting(ConditionProgram):
    steps = 0

    async def step(self) -> None:
        type(self).steps += 1
        await super().step()


@pytest.mark.parametrize(
    "keyword, path, message",
    [
        ("record", None, "record must be a non-empty path"),
        ("json_file", None, "json_file must be a non-empty path"),
        ("record", "FILE/r.json", "record: cannot write .* is not a directory"),
        ("json_file", "FILE/sub/r.json", "json_file: cannot write"),
        ("visualization_dir", "FILE", "visualization_dir must be a directory"),
        ("record", ".", "record must be a file path, got the directory"),
    ],
)
def test_record_paths_are_checked_before_the_run_starts(tmp_path, keyword, path, message):
    (tmp_path / "FILE").write_text("a file, not a folder")  # a file where a folder is needed
    kw = {keyword: "" if path is None else str(tmp_path / path)}
    Counting.steps = 0
    with pytest.raises(ValueError, match=message):
        run(smc_standard(Counting(toy_lm()), 2, seed=0, **kw))
    assert Counting.steps == 0  # refused before any step ran


class IntKey(ConditionProgram):
    def string_for_serialization(self):
        return len(self.context.tokens)


def test_a_non_string_serialization_is_a_type_error_naming_the_model():
    with pytest.raises(
        TypeError, match=r"IntKey.string_for_serialization\(\) must return a str.*got int"
    ):
        run(smc_standard(IntKey(toy_lm()), 2, seed=0, record=True))
