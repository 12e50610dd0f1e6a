"""Time-outs are time-outs: a user's check cannot swallow one, no verdict is kept from one, a
run counts them, and a draw's time-out is remembered only for the situation it happened in."""

from __future__ import annotations

import math
import time

import pytest

from llamppl import FunctionLM, run
from llamppl.decoding.constraints.protocol import PredicateConstraint
from llamppl.decoding.constraints.time_bound import CheckTimeout, bounded_call, time_bound
from llamppl.inference import importance_sampling, smc_standard
from llamppl.models import HardConstraint

VOCAB = ["a", "b", "ab", "ba", "c", "<eos>"]
LM = FunctionLM(VOCAB, 5, lambda ctx: [0.0] * 5 + [len(ctx) - 2.0])


def _spin_on_b(text: str) -> None:
    deadline = time.monotonic() + 30
    while text.endswith("b") and time.monotonic() < deadline:  # runs past any bound
        pass


def swallow_exception(text: str) -> bool:
    """A check in a common style: any error means "no"."""
    try:
        _spin_on_b(text)
        return len(text) <= 3
    except Exception:  # noqa: BLE001 - the style under test
        return False


def swallow_everything(text: str) -> bool:
    try:
        _spin_on_b(text)
        return len(text) <= 3
    except BaseException:  # noqa: BLE001 - the style under test
        return False


def test_the_time_out_is_not_an_exception_a_check_catches():
    assert not issubclass(CheckTimeout, Exception)
    with time_bound(0.05), pytest.raises(CheckTimeout):
        bounded_call(swallow_exception, "ab")


def test_a_check_that_swallows_the_time_out_is_still_timed_out():
    with time_bound(0.05), pytest.raises(CheckTimeout):
        bounded_call(swallow_everything, "ab")
    assert bounded_call(swallow_everything, "a")  # and the next call is unaffected


@pytest.mark.parametrize("check", [swallow_exception, swallow_everything])
@pytest.mark.parametrize("proposal", ["lazy", "sample"])
def test_a_runs_time_outs_are_reported_and_never_kept_as_verdicts(check, proposal):
    c = PredicateConstraint(check)
    model = HardConstraint(LM, [0], c, proposal, 3, check_timeout=0.05)
    result = run(smc_standard(model, 6, seed=0))
    assert result.failures.get("check timed out", 0) >= 1, result.failures
    assert "check timed out" in repr(result)
    for p in result.particles:  # a rejection comes from the length only, never a time-out
        if p.failure == "token outside the constraint":
            assert len(LM.decode(p.context.generated)) > 3
    memo = c.__dict__["_memo"]  # the answers kept per text: none for a text that timed out
    assert all(memo.get((False, t)) is None for t in ("b", "ab", "bb", "aab", "bab"))


def test_a_draws_time_out_is_not_inherited_by_another_prompt_or_lm():
    """A draw whose checks together ran out of time is remembered for its own context only:
    once the check is fast, another prompt on the same LM and the same prompt on another LM
    check again instead of dying at once."""
    vocab = [chr(ord("a") + i % 26) * (1 + i // 26) for i in range(200)] + ["<eos>"]
    flat = FunctionLM(vocab, 200, lambda ctx: [0.0] * 200 + [-math.inf])
    other = FunctionLM(vocab, 200, lambda ctx: [0.1] * 200 + [-math.inf])
    slow = {"on": True}

    def only_empty(text: str) -> bool:
        if slow["on"]:
            time.sleep(0.01)
        return text == ""

    c = PredicateConstraint(only_empty)
    first = run(importance_sampling(HardConstraint(flat, [0], c, "lazy", 3, check_timeout=0.05), 1))
    assert first.failures == {"check timed out": 1}
    slow["on"] = False
    for lm, prompt in ((flat, [1]), (other, [0])):
        model = HardConstraint(lm, prompt, c, "lazy", 3, check_timeout=0.05)
        again = run(importance_sampling(model, 1, seed=0))
        assert again.failures == {"no allowed token": 1}, (prompt, again.failures)
        assert again.particles[0].checks > 0


def test_failures_are_counted_once_each_by_cause():
    """Importance sampling keeps dead particles from step to step; each is counted once."""
    model = HardConstraint(LM, [0], lambda t: "c" not in t, "sample", 3)
    result = run(importance_sampling(model, 40, seed=3))
    dead = sum(p.weight == -math.inf for p in result.particles)
    assert dead > 0 and sum(result.failures.values()) == dead
    assert set(result.failures) <= {
        "token outside the constraint",
        "end before the text is complete",
        "token limit",
    }
