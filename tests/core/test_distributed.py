"""``run_many`` on a local two-CPU Ray cluster equals the same jobs run serially with the same seeds.

One Ray start per module (about 3 s). Workers unpickle this module's model and
LM factories by value (the test folder is not importable in a Ray worker).
"""

from __future__ import annotations

import os
import re
import sys
import threading

import pytest
import torch

from llamppl import FunctionLM, LMContext, Model
from llamppl.distributed import Job, jobs_grid, run_job, run_many

VOCAB = ["a", "b", "c", "."]
EOS = 3


def toy_logits(ctx: tuple[int, ...]) -> list[float]:
    n, last = len(ctx), (ctx[-1] if ctx else 0)
    return [0.4 + 0.1 * last, 0.2 * n, -0.3 + 0.25 * (last == 1), -0.5 + 0.45 * n]


def toy_lm() -> FunctionLM:
    return FunctionLM(VOCAB, EOS, toy_logits)


class AtMostOneB(Model):
    """Tokens after ``prompt``; at most one 'b'; EOS or 4 tokens end it. Prompt 'x' is invalid."""

    def __init__(self, lm, prompt: str) -> None:
        super().__init__()
        self.context = LMContext(lm, lm.encode(prompt))  # 'x' raises: not in the vocabulary

    async def step(self) -> None:
        token = await self.sample(self.context.next_token())
        self.condition(str(self.context).count("b") <= 1)
        if token == EOS or len(self.context.generated) >= 4:
            self.finish()


class NoLongWords(Model):
    """The quickstart model: no word longer than 5 letters, at most ``max_tokens`` tokens."""

    def __init__(self, lm, prompt: str, max_tokens: int = 6) -> None:
        super().__init__()
        self.context = LMContext(lm, prompt)
        self.max_tokens = max_tokens

    async def step(self) -> None:
        token = await self.sample(self.context.next_token())
        self.condition(all(len(w) <= 5 for w in re.findall(r"[A-Za-z]+", str(self.context))))
        if token == self.context.lm.eos_token_id or len(self.context.generated) >= self.max_tokens:
            self.finish()


class Hangs(Model):
    """A step that never returns (a stuck native call, a deadlock): only a timeout ends it."""

    def __init__(self, lm, prompt: str) -> None:
        super().__init__()

    async def step(self) -> None:
        threading.Event().wait()  # blocks the worker's event loop for good


def embedded_lm():
    from llamppl import CachedCausalLM

    return CachedCausalLM.default()


@pytest.fixture(scope="module")
def ray_cluster():
    ray = pytest.importorskip("ray", reason="Ray is not installed (pip install llamppl[ray])")
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")  # no auth token file under $HOME
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield ray
    ray.shutdown()


def serial(jobs: list[Job], lm) -> list:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as in the workers (threads=1), so float sums run the same way
    try:
        return [run_job(job, lm, i) for i, job in enumerate(jobs)]
    finally:
        torch.set_num_threads(threads)


def test_function_lm_jobs_equal_serial_and_failures_stay_per_job(ray_cluster, capsys):
    jobs = jobs_grid(AtMostOneB, ["a", "x", "ab"], seeds=[0, 1, 2], n_particles=8)
    jobs.append(Job(AtMostOneB, ("c",), 5, "smc_steer", {"n_particles": 4, "n_beam": 2}))
    got = run_many(jobs, toy_lm, n_workers=2, progress=True)
    bar = capsys.readouterr().err  # the shared Progress bar, counting jobs and failures
    assert "run_many" in bar and "10/10" in bar and "failed=3" in bar
    want = serial(jobs, toy_lm())
    assert [r.index for r in got] == list(range(len(jobs)))
    assert len({r.worker for r in got}) == 2  # both workers used, each kept its one LM
    for r, w, job in zip(got, want, jobs):
        assert r.seed == job.seed
        if job.args == ("x",):  # make_model raised: reported, the other jobs unaffected
            assert not r.ok and "ValueError" in r.error and "cannot be tokenised" in r.error
            continue
        assert r.ok, r.error
        assert (r.particles, r.log_weights, r.log_ml) == (w.particles, w.log_weights, w.log_ml)
        assert r.stats["n_particles"] == job.options["n_particles"]
        assert abs(sum(r.posterior.values()) - 1) < 1e-12
    assert sum(not r.ok for r in got) == 3


def test_each_worker_runs_its_jobs_several_at_once(ray_cluster):
    """With ``concurrency=3`` a worker runs batches of 3 jobs on one event loop (their
    particles share forwards); the results equal serial runs, failures stay per job."""
    jobs = jobs_grid(AtMostOneB, ["a", "x", "ab", "ba"], seeds=[0, 1], n_particles=6)
    got = run_many(jobs, toy_lm, n_workers=2, concurrency=3)
    want = serial(jobs, toy_lm())
    assert [r.index for r in got] == list(range(len(jobs)))
    for r, w, job in zip(got, want, jobs):
        if job.args == ("x",):
            assert not r.ok and "cannot be tokenised" in r.error
            continue
        assert r.ok, r.error
        assert (r.particles, r.log_weights, r.log_ml) == (w.particles, w.log_weights, w.log_ml)


def call_within(seconds: float, fn, *args, **kwargs):
    """``fn(*args, **kwargs)`` in a daemon thread; fails the test (instead of hanging it) after ``seconds``."""
    box: dict = {}

    def target() -> None:
        try:
            box["value"] = fn(*args, **kwargs)
        except BaseException as exc:  # re-raised in the test's thread
            box["error"] = exc

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(seconds)
    if thread.is_alive():
        pytest.fail(f"{getattr(fn, '__name__', fn)} did not return within {seconds} s")
    if "error" in box:
        raise box["error"]
    return box["value"]


def test_a_hanging_job_times_out_and_the_others_are_returned(ray_cluster):
    # One worker: job 1 hangs, is stopped 10 s after it starts, its worker is killed and a new
    # one runs job 2; the finished jobs come back in order, equal to serial runs. Without the
    # timeout run_many waits forever; the guard turns that into a failure. About 16 s on an idle
    # machine: two worker starts of ~3 s and the timeout (10 s, as a first job in a fresh worker
    # took over 2 s under load). Ray runs its workers niced: on a 2-core machine under load 20
    # one worker start took over 2 min, hence the guard's 900 s.
    ok = Job(AtMostOneB, ("a",), 0, options={"n_particles": 8})
    hang = Job(Hangs, ("a",), 1, options={"n_particles": 2})
    jobs = [ok, hang, Job(AtMostOneB, ("ab",), 2, options={"n_particles": 8})]
    got = call_within(900, run_many, jobs, toy_lm, n_workers=1, timeout=10)
    assert [r.index for r in got] == [0, 1, 2]
    assert not got[1].ok and got[1].error.startswith("TimeoutError"), got[1].error
    assert "job 1 did not finish within timeout=10 s" in got[1].error
    assert got[0].worker != got[2].worker  # the hung worker was replaced
    lm = toy_lm()
    for i in (0, 2):
        want = serial([jobs[i]], lm)[0]
        assert got[i].ok, got[i].error
        assert (got[i].particles, got[i].log_weights, got[i].log_ml) == (
            want.particles,
            want.log_weights,
            want.log_ml,
        )


@pytest.mark.slow
def test_embedded_model_jobs_equal_serial(ray_cluster, make_lm):
    jobs = jobs_grid(NoLongWords, ["The Fed says", "My cat"], seeds=[3], n_particles=4)
    got = run_many(jobs, embedded_lm, n_workers=2)
    want = serial(jobs, make_lm())
    for r, w in zip(got, want):
        assert r.ok, r.error
        assert r.particles == w.particles
        # Same weights, same thread count, fresh caches, same batches: the runs do the same
        # float work, so the weights agree to far below the LM's 1e-4 cache tolerance.
        assert r.log_weights == pytest.approx(w.log_weights, abs=1e-4)
        assert r.log_ml == pytest.approx(w.log_ml, abs=1e-4)
        assert r.stats["forward_calls"] >= 1


def test_bad_input_and_missing_ray(monkeypatch):
    with pytest.raises(TypeError, match="jobs\\[0\\] must be a llamppl.distributed.Job"):
        run_many([AtMostOneB], toy_lm)
    with pytest.raises(ValueError, match="algorithm must be one of .*smc_standard"):
        run_many([Job(AtMostOneB, ("a",), algorithm="smc_fast")], toy_lm)
    with pytest.raises(ValueError, match="n_workers must be a positive integer"):
        run_many([Job(AtMostOneB, ("a",))], toy_lm, n_workers=0)
    with pytest.raises(TypeError, match="lm must be a LanguageModel"):
        run_many([Job(AtMostOneB, ("a",))], "smollm")
    for bad, error in [("5", TypeError), (True, TypeError), (0, ValueError), (-1.0, ValueError),
                       (float("nan"), ValueError), (float("inf"), ValueError)]:  # fmt: skip
        with pytest.raises(error, match="timeout must be a .*number of seconds or None"):
            run_many([Job(AtMostOneB, ("a",))], toy_lm, timeout=bad)
    assert run_many([], toy_lm) == []
    monkeypatch.setitem(sys.modules, "ray", None)
    with pytest.raises(ImportError, match=r"llamppl\[ray\]"):
        run_many([Job(AtMostOneB, ("a",))], toy_lm)
