"""``benchmarks/collie_twist.py``: ``smc-learned``'s twist on COLLIE never trains on an evaluated
prompt, is cached by its settings, labels by the program's own check, and
``bench_collie.py`` refuses an evaluation seed that draws training or validation prompts."""

from __future__ import annotations

import math
import sys
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import pytest

pytest.importorskip("nltk")
BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))

import bench_collie as B  # noqa: E402
import collie_judge as cj  # noqa: E402
import collie_twist as W  # noqa: E402

needs_data = pytest.mark.skipif(not cj.DATA.is_file(), reason=f"no COLLIE data at {cj.DATA}")


def test_the_cache_key_changes_with_every_setting():
    base = W.CollieTwistSettings()
    changes = (
        ("train_seed", 1),
        ("per_structure", 3),
        ("focus_per_structure", 2),
        ("n_particles", 4),
        ("hidden", 8),
        ("max_cpu_seconds", 60.0),
        ("dropped", ("wiki_c14#3",)),
    )
    keys = {base.key()} | {replace(base, **{f: v}).key() for f, v in changes}
    assert len(keys) == 1 + len(changes)
    assert base.path().name == f"collie-{base.key()}.pt"
    assert base.path().parent.name == "twists"


@needs_data
def test_training_prompts_never_include_an_evaluated_one():
    instances = cj.load()
    settings = W.CollieTwistSettings()
    drawn, none_dropped = W.training_prompts(instances, settings)
    assert none_dropped == ()
    per = {s: sum(i["structure"] == s for i in drawn) for s in settings.structures}
    assert per["c05"] == settings.focus_per_structure and per["c01"] == settings.per_structure
    evaluated = [drawn[0], drawn[5], *W.report_prompts(instances)]
    kept, dropped = W.training_prompts(instances, settings, evaluated)
    seen = {i["prompt"] for i in evaluated}
    assert not any(i["prompt"] in seen for i in kept)
    assert W.instance_id(drawn[0]) in dropped and W.instance_id(drawn[5]) in dropped
    assert len(kept) + len(dropped) == len(drawn)
    # validation prompts avoid the training prompts and the report's evaluated ones
    val = W.validation_prompts(instances, W.VALIDATION_SEEDS[0], 3, ["c05", "c12"], settings)
    train, _ = W.training_prompts(instances, settings, W.report_prompts(instances))
    avoid = {i["prompt"] for i in train} | {i["prompt"] for i in W.report_prompts(instances)}
    assert len(val) == 6 and not any(i["prompt"] in avoid for i in val)
    with pytest.raises(ValueError, match="training-side seed"):
        W.validation_prompts(instances, 0, 3, ["c05"], settings)


def test_the_label_is_the_programs_own_check():
    ok = SimpleNamespace(finished=True, failure=None, weight=-3.0)
    assert W.succeeded(ok)
    assert not W.succeeded(SimpleNamespace(finished=True, failure="token limit", weight=-math.inf))
    assert not W.succeeded(SimpleNamespace(finished=False, failure=None, weight=-1.0))


@pytest.mark.parametrize("seed", [W.TRAIN_SEED, W.VALIDATION_SEEDS[0]])
def test_bench_collie_refuses_a_training_side_seed(seed):
    with pytest.raises(SystemExit):
        B.main(["--methods", "smc,smc-learned", "--seed", str(seed)])


def test_records_name_the_move():
    assert B.label("smc", 0) == "smc" and B.label("smc-learned", 2) == "smc-learned+move 2"
    assert B.label("lcd", 2) == "lcd"
