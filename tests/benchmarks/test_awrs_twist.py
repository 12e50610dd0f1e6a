"""``benchmarks/awrs_twist.py``: the learned twist of ``smc-learned`` never sees an evaluated
prompt, is cached by its settings, and the shipped head loads with the task's features."""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))

import awrs_tasks as T  # noqa: E402
import awrs_twist as W  # noqa: E402

needs_data = pytest.mark.skipif(
    not T.MOLECULES_FILE.is_file(), reason=f"shared data not found under {T.DATA}"
)


def test_the_cache_key_changes_with_every_setting():
    base = W.TwistSettings("molecules")
    keys = {base.key()}
    for field, value in (("train_seed", 1), ("prompts", 3), ("hidden", 0), ("l2", 0.1)):
        keys.add(replace(base, **{field: value}).key())
    assert len(keys) == 5
    assert base.path().name == f"molecules-{base.key()}.pt"
    # a twist trained without some prompts (equal to evaluated ones) has a file of its own
    assert base.path(["a", "b"]) == base.path(["b", "a"]) != base.path(["a"]) != base.path()


@needs_data
def test_an_evaluation_sharing_a_training_prompt_gets_a_twist_trained_without_it():
    settings = W.TwistSettings("molecules", prompts=6)
    drawn = T.instances("molecules", 6, seed=settings.train_seed)
    assert W.dropped_prompts(settings, T.instances("molecules", 8, seed=4242)) == []
    dropped = W.dropped_prompts(settings, [drawn[4], drawn[1]])
    assert dropped == [W._identity(drawn[1]), W._identity(drawn[4])]  # in training order
    assert settings.path(dropped) != settings.path()


@needs_data
def test_training_prompts_never_include_an_evaluated_one():
    settings = W.TwistSettings("molecules", prompts=6)
    drawn = T.instances("molecules", 6, seed=settings.train_seed)
    kept = W._training_instances(settings, [drawn[2], *T.instances("molecules", 4, seed=4242)])
    assert len(kept) == 5 and drawn[2] not in kept
    assert W.TRAIN_SEED != T.PEER_SEED


@needs_data
def test_the_shipped_molecule_twist_loads_with_the_tasks_features():
    settings = W.TwistSettings("molecules")
    if not settings.path().is_file():
        pytest.skip(f"no trained twist at {settings.path()} (python benchmarks/awrs_twist.py)")
    twist = W.LearnedTwist.load(settings.path(), features=W.features_for(settings))
    assert twist.features.names[-1] == "open_closures"
    rows = torch.zeros(3, twist.dim)
    assert bool(((twist.log_psi_of(rows) <= 0) & (twist.log_psi_of(rows) >= -twist.clip)).all())
    assert twist.report.held_out_loss < twist.report.base_loss
