"""Run records written through LLaMPPL's ``json_file=`` / ``visualization_dir=`` keywords."""

import json
import math

import pytest
from programs import AllFailProgram, ConditionProgram, toy_lm

from llamppl import run
from llamppl.inference import csmc_standard, importance_sampling, smc_standard, smc_steer
from llamppl.inference.record import frame_texts


def _strict_load(path):
    def refuse(constant):
        raise ValueError(f"non-standard JSON constant {constant}")

    return json.loads(path.read_text(), parse_constant=refuse)


@pytest.mark.parametrize(
    "engine",
    [
        lambda m, **kw: smc_standard(m, 6, 1.0, seed=1, **kw),
        lambda m, **kw: smc_steer(m, 6, 2, seed=1, **kw),
    ],
)
def test_record_matches_the_run(tmp_path, engine):
    result = run(
        engine(
            ConditionProgram(toy_lm()),
            json_file=tmp_path / "a.json",
            visualization_dir=tmp_path / "viz",
        )
    )
    record = _strict_load(tmp_path / "a.json")
    assert record == _strict_load(tmp_path / "viz" / "record.json") == result.record
    assert record["format"] == "llamppl-run-record" and record["n_particles"] == 6
    assert len(record["steps"]) == len(result.history)
    for snap, step in zip(record["steps"], result.history):
        assert snap["step"] == step.step and snap["resampled"] == step.resampled
        assert snap["ess"] == pytest.approx(step.ess)
        if snap["ancestors"] is not None:
            assert max(snap["ancestors"]) < len(snap["particles"])
        for p in snap["particles"]:
            assert p["log_weight"] is None or math.isfinite(p["log_weight"])
    final = frame_texts(record)[-1]
    assert final == [q.string_for_serialization() for q in result.particles]
    assert record["log_ml"] == pytest.approx(result.log_ml)


def test_all_particles_dead_still_writes_strict_json(tmp_path):
    result = run(smc_standard(AllFailProgram(toy_lm()), 4, seed=0, json_file=tmp_path / "r.json"))
    record = _strict_load(tmp_path / "r.json")
    assert result.log_ml == -math.inf and record["log_ml"] is None
    assert all(p["log_weight"] is None for p in record["final"])


def test_no_record_unless_asked_and_bad_paths_are_refused(tmp_path):
    assert run(smc_standard(ConditionProgram(toy_lm()), 2, seed=0)).record is None
    with pytest.raises(TypeError, match="json_file must be a path"):
        run(smc_standard(ConditionProgram(toy_lm()), 2, json_file=3))
    with pytest.raises(TypeError, match="visualization_dir must be a path"):
        run(smc_steer(ConditionProgram(toy_lm()), 2, 2, visualization_dir=["x"]))


ENGINES = {
    "smc_standard": lambda m, **kw: smc_standard(m, 6, 1.0, seed=1, **kw),
    "smc_steer": lambda m, **kw: smc_steer(m, 6, 2, seed=1, **kw),
    "importance_sampling": lambda m, **kw: importance_sampling(m, 6, seed=1, **kw),
    "csmc_standard": lambda m, **kw: csmc_standard(m, 6, None, seed=1, **kw),
}


@pytest.mark.parametrize("name", sorted(ENGINES))
def test_record_true_keeps_a_genealogy_that_matches_the_texts(tmp_path, name):
    result = run(ENGINES[name](ConditionProgram(toy_lm()), record=True))
    record = result.record
    assert record["version"] == 3 and record["algorithm"] == name
    assert not list(tmp_path.iterdir())  # record=True writes nothing
    frames = [s["particles"] for s in record["steps"]] + [record["final"]]
    texts = frame_texts(record)
    assert all(p["parent"] is None and "text" in p for p in frames[0])
    for t in range(1, len(frames)):
        for i, p in enumerate(frames[t]):
            parent = frames[t - 1][p["parent"]]
            # each particle extends the one it came from (final: is the same particle),
            # so only what it adds is stored
            assert texts[t][i].startswith(texts[t - 1][p["parent"]]), (t, p, parent)
            assert "append" in p and "text" not in p
            assert p["died"] == (p["log_weight"] is None)
            if name in ("smc_standard", "csmc_standard") and record["steps"][t - 1]["resampled"]:
                assert not parent["died"]  # resampling never picks a dead particle
    assert texts[-1] == [q.string_for_serialization() for q in result.particles]
    written = result.to_json(tmp_path / "out" / "r.json")
    assert _strict_load(written) == record


def test_record_path_writes_the_file_and_bad_record_is_refused(tmp_path):
    result = run(importance_sampling(ConditionProgram(toy_lm()), 3, seed=0, record=tmp_path / "r"))
    assert _strict_load(tmp_path / "r") == result.record
    with pytest.raises(TypeError, match="record must be True/False or a path"):
        run(smc_standard(ConditionProgram(toy_lm()), 2, record=1))


def test_methods_without_a_record_explain_record_true(tmp_path):
    result = run(smc_standard(ConditionProgram(toy_lm()), 2, seed=0))
    with pytest.raises(ValueError, match="record=True"):
        result.to_json(tmp_path / "x")
