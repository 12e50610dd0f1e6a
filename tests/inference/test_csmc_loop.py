"""``csmc_standard`` on the shared engine loop: the pinned slot in the run record, and the
run so far (with each slot's path) kept when ``max_steps`` stops a run."""

from __future__ import annotations

import numpy as np
import pytest
from test_csmc import LikesC

from llamppl import Bernoulli, Model, run
from llamppl.inference import CSMCResult, StepLimitError, Trajectory, csmc_standard


def test_the_record_shows_the_reference_kept_in_slot_0(tmp_path):
    first = run(csmc_standard(LikesC(), 4, None, seed=1))
    reference = first.trajectories[int(np.argmax(first.log_weights))]
    res = run(csmc_standard(LikesC(), 4, reference, seed=2, record=tmp_path / "r.json"))
    record = res.record
    assert record["algorithm"] == "csmc_standard"
    assert (tmp_path / "r.json").exists()
    steps = record["steps"]
    assert [s["step"] for s in steps] == [h.step for h in res.history]
    assert any(s["resampled"] for s in steps)
    for s, h in zip(steps, res.history):
        assert s["ancestors"] == (None if h.ancestors is None else h.ancestors.tolist())
        assert s["ancestors"] is None or s["ancestors"][0] == 0  # the pinned slot keeps itself
    assert record["final"][0]["log_weight"] == res.log_weights[0]


class Walk(Model):
    """Never finishes: one coin per step."""

    def __init__(self) -> None:
        super().__init__()
        self.xs: list[bool] = []

    async def step(self) -> None:
        self.xs.append(bool(await self.sample(Bernoulli(0.5))))


def test_max_steps_keeps_the_paths_and_a_truncated_reference_is_reused():
    with pytest.raises(StepLimitError, match=r"Walk.*after step 5 \(max_steps=5\)") as err:
        run(csmc_standard(Walk(), 3, None, seed=0, max_steps=5))
    so_far = err.value.result
    assert isinstance(so_far, CSMCResult) and len(so_far.history) == 5
    assert all(len(t.choices) == 6 for t in so_far.trajectories)  # start + 5 steps
    for p, t in zip(so_far.particles, so_far.trajectories):
        assert p.xs == [c[0] for c in t.choices[1:]]
    # the path of the truncated run is pinned in the next one, up to the same limit
    with pytest.raises(StepLimitError) as again:
        run(csmc_standard(Walk(), 3, so_far.particles[1], seed=1, max_steps=5))
    assert again.value.result.particles[0].xs == so_far.particles[1].xs
    with pytest.raises(ValueError, match="reference: the program took more steps"):
        run(csmc_standard(Walk(), 3, Trajectory(so_far.trajectories[1].choices), max_steps=6))


def test_replaying_is_the_one_public_way_to_route_sample():
    # csmc_standard and enumerate_exact both use Model.replaying; set_chooser is gone
    assert hasattr(Model, "replaying") and not hasattr(Model, "set_chooser")
