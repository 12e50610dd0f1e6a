"""The library's programs as ``run_many`` jobs: Power-SMC, MH power sampling, SMC-SD,
``generate_json_async``, infilling and ``HardConstraint`` run at once on one ``FunctionLM``
give exactly what each gives alone, and the run's output comes back on ``JobResult.output``."""

from __future__ import annotations

import math

import pytest
from grammar_lms import wavy_lm

from llamppl import FunctionLM
from llamppl.constraints import PredicateConstraint
from llamppl.distributed import Job, run_job, run_many
from llamppl.models import (
    HardConstraint,
    Infilling,
    StructuredResult,
    generate_json_async,
    mh_power_sampling,
    power_smc,
    speculative_smc,
)

VOCAB = ["a", "b", "c", "d", "."]
EOS = 4
DIGITS = ["<s>", "1", "2", "3", "4", "7", "<eos>"]
SCHEMA = {"type": "integer", "minimum": 2}


def _logits(ctx: tuple[int, ...]) -> list[float]:
    n, last = len(ctx), ctx[-1]
    return [math.sin(1.1 * i + 0.6 * n + 0.5 * last) for i in range(EOS)] + [0.5 * n - 2.0]


def _draft_logits(ctx: tuple[int, ...]) -> list[float]:
    return [0.8 * x for x in _logits(ctx)]


def target() -> FunctionLM:
    return FunctionLM(VOCAB, EOS, _logits)


DRAFT = FunctionLM(VOCAB, EOS, _draft_logits)


async def sd(lm, prompt, **options):
    """SMC-SD with this module's draft (a driver taking two LMs, as a job of one)."""
    return await speculative_smc(lm, DRAFT, prompt, 6, 2, 5, **options)


def infill(lm, parts):
    return Infilling(lm, parts, max_hole_tokens=2)


def hard(lm, prompt):
    return HardConstraint(
        lm, lm.encode(prompt), PredicateConstraint(lambda t: "dd" not in t), "lazy", 5
    )


JOBS = [
    Job.call(power_smc, [0], alpha=3.0, n_particles=6, max_tokens=4, ramp_tokens=2, seed=1),
    Job.call(power_smc, [1, 2], alpha=2.0, n_particles=5, max_tokens=4, ramp_tokens=1, seed=2),
    Job.call(mh_power_sampling, [0], alpha=3.0, block_size=2, n_mh_steps=3, max_tokens=4, seed=3),
    Job.call(sd, [0], seed=4),
    Job.call(sd, [2], seed=5),
    Job(infill, (["a", "c", "."],), 6, options={"n_particles": 5}),
    Job(hard, ("b",), 7, "smc_steer", {"n_particles": 4, "n_beam": 2}),
]


def _same(a, b) -> None:
    assert a.ok and b.ok, (a.error, b.error)
    assert (a.particles, a.log_weights, a.log_ml) == (b.particles, b.log_weights, b.log_ml)
    assert _outcome(a.output) == _outcome(b.output)


def _outcome(output) -> dict:
    """The output without the LM's work counters (read off a shared LM, they count the
    company's forwards too)."""
    fields = dict(getattr(output, "__dict__", {}))
    return {k: repr(v) for k, v in fields.items() if not k.endswith("_forwards")}


def test_every_program_at_once_equals_its_run_alone():
    serial = [run_job(job, target(), i) for i, job in enumerate(JOBS)]
    shared = target()
    got = run_many(JOBS, shared, concurrency=len(JOBS), progress=False)
    for a, b in zip(got, serial):
        _same(a, b)
    assert got[0].output.text == serial[0].output.text and got[0].output.result is None
    assert got[2].output.n_moves > 0 and not got[2].particles  # MH: a chain, no population
    assert got[3].output.rounds > 0 and got[3].particles
    # the jobs' particles shared the LM's batches
    one_by_one = target()
    for i, job in enumerate(JOBS):
        run_job(job, one_by_one, i, fresh_cache=False)
    assert shared.stats.batch_calls < 0.6 * one_by_one.stats.batch_calls


def test_generate_json_runs_at_once_equal_their_runs_alone():
    jobs = [
        Job.call(generate_json_async, [], SCHEMA, n_particles=8, max_tokens=3, seed=s)
        for s in range(4)
    ]
    serial = [run_job(job, wavy_lm(DIGITS), i) for i, job in enumerate(jobs)]
    got = run_many(jobs, wavy_lm(DIGITS), concurrency=4, progress=False)
    for a, b in zip(got, serial):
        _same(a, b)
        assert isinstance(a.output, StructuredResult) and a.output.objects
        assert all(obj >= 2 for obj, _ in a.output.objects)


def test_a_call_job_needs_an_async_function():
    got = run_many([Job.call(lambda lm, seed=None: 3, seed=0)], target(), progress=False)
    assert "Job.call needs an async function" in got[0].error


@pytest.mark.parametrize("job", [JOBS[0], JOBS[5]])
def test_jobs_pickle_for_ray_workers(job):
    import pickle

    assert pickle.loads(pickle.dumps(job)) == job
