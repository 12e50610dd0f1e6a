"""``VLLMLM(live=True)``'s logic against a fake vLLM engine core (no vLLM needed).

The fake (``fake_vllm_core.py``) keeps resumable requests, a block prefix cache and
forks that load their ancestor's K/V, and counts the tokens it runs, so these tests
check the work the live mode asks for: one engine step per round, one token per
particle per step, forks that recompute nothing, dead particles freed at once.
The real engine is tested in ``test_vllm_lm.py``.
"""

from __future__ import annotations

import asyncio
import gc
import math

import pytest
import torch

from llamppl import FunctionLM, LMContext, Model
from llamppl.inference import enumerate_exact, smc_standard, smc_steer
from llamppl.lm.vllm.engine import Lane, fork_block_copies, plan_round
from llamppl.lm.vllm.lm import VLLMLM
from tests.lm.fake_vllm_core import BLOCK, FakeLLM, Params
from tests.lm.test_vllm_fake import VOCAB, FakeTokenizer, Words, toy_logits


def make_live(capture: str = "logprobs") -> tuple[VLLMLM, FakeLLM]:
    fn = FunctionLM(VOCAB, 0, toy_logits)
    llm = FakeLLM(toy_logits, len(VOCAB), FakeTokenizer(fn), capture)
    return VLLMLM(llm, capture=capture, sampling_params=Params, live=True), llm


def gather(lm, contexts):
    async def go():
        return await asyncio.gather(*(lm.next_token_logprobs(c) for c in contexts))

    return asyncio.run(go())


def exact(c) -> torch.Tensor:
    return FunctionLM(VOCAB, 0, toy_logits).logprobs(c).float()


# ---------------------------------------------------------------------- planning (pure)
def test_plan_round_rows_extensions_forks_and_new_requests():
    a, b, c = Lane("a", (1, 2)), Lane("b", (1, 3)), Lane("c", (4,))
    lanes = {lane.tokens: lane for lane in (a, b, c)}
    plan = plan_round([(1, 2, 5), (1, 2, 6), (1, 3), (1, 3, 7, 8, 9), (2,), (4, 4, 4)], lanes)
    assert plan.rows == {(1, 3): b}  # the context of a live request: its row is there
    assert plan.extend == [((1, 2, 5), a), ((4, 4, 4), c)]  # c grows by two tokens at once
    assert plan.fork == [((1, 2, 6), a), ((1, 3, 7, 8, 9), b)]  # a and b are taken already
    assert plan.new == [(2,)] and plan.unused == []
    plan = plan_round([(1, 2, 5)], lanes)
    assert plan.extend == [((1, 2, 5), a)] and plan.unused == [b, c]


def test_fork_block_copies_cover_the_partial_blocks_only():
    # positions [8, 11) with blocks of 4: block 2 (8..11); block 3 is past the end
    assert fork_block_copies([5, 6, 7, 8], [5, 6, 9, 10], 8, 11, 4) == [(7, 9)]
    assert fork_block_copies([5, 6, 7], [5, 6, 9, 10], 4, 12, 4) == [(7, 9)]  # shared block 6
    assert fork_block_copies([0, 7], [3, 9], 0, 8, 4) == [(7, 9)]  # null block 0 skipped
    assert fork_block_copies([5], [6], 0, 0, 4) == []
    with pytest.raises(ValueError, match="start must be a multiple of block_size=4"):
        fork_block_copies([5], [6], 2, 4, 4)
    with pytest.raises(ValueError, match="block_size must be a positive integer"):
        fork_block_copies([5], [6], 0, 4, 0)


# ---------------------------------------------------------------------- the LM on the fake
@pytest.mark.parametrize("capture", ["logprobs", "processor"])
def test_live_rows_equal_the_model_and_forks_run_one_token(capture):
    lm, llm = make_live(capture)
    prompt = [1, 2, 3, 4, 5, 1, 2, 3, 4, 1]  # 10 tokens: two full blocks and a partial one
    (row,) = gather(lm, [prompt])
    assert torch.equal(row, exact(prompt)) and row.dtype == torch.float32
    assert llm.core.computed == 10 and lm.stats.engine_calls == 1 and lm.stats.requests == 1
    kids = [prompt + [t] for t in (1, 2, 3, 4)]
    rows = gather(lm, kids)  # one extends the prompt's request, three fork from it
    for c, r in zip(kids, rows):
        assert torch.equal(r, exact(c))
    assert (lm.stats.extends, lm.stats.forks, lm.stats.requests) == (1, 3, 4)
    assert llm.core.computed == 10 + 4  # forks load the 10 tokens, they do not rerun them
    assert llm.core.loaded == 3 * (10 - 2 * BLOCK)  # the partial block, per fork
    assert lm.stats.tokens_computed == llm.core.computed and lm.stats.engine_calls == 2
    if capture == "processor":  # the step's rows are views of ONE tensor
        assert len({r.untyped_storage().data_ptr() for r in rows}) == 1
    # the next round continues two of them; the other two particles died: freed at once
    rows = gather(lm, [kids[0] + [2], kids[3] + [2, 3]])
    assert all(torch.equal(r, exact(c)) for r, c in zip(rows, [kids[0] + [2], kids[3] + [2, 3]]))
    assert lm.stats.freed == 2 and len(llm.core.sessions) == 2
    assert llm.core.computed == 14 + 3 and lm.stats.engine_calls == 3
    # asking again for a live request's context costs nothing
    again = lm.next_token_logprobs_sync(kids[0] + [2])
    assert torch.equal(again, rows[0]) and lm.stats.engine_calls == 3 and lm.stats.cache_hits == 1


def test_live_requests_are_freed_by_release_clear_cache_and_garbage_collection():
    lm, llm = make_live()
    gather(lm, [[1, 2], [1, 3]])
    assert len(llm.core.sessions) == 2
    lm.release()
    assert llm.core.sessions == {} and lm.stats.freed == 2
    gather(lm, [[1, 2]])
    lm.clear_cache()
    assert llm.core.sessions == {}
    gather(lm, [[1, 2]])
    del lm
    gc.collect()
    assert llm.core.sessions == {}


def test_a_round_spans_engine_steps_when_the_budget_is_short():
    lm, llm = make_live()
    llm.core.budget = 4  # chunked prefill: 4 tokens per engine step
    contexts = [[1, 2, 3, 4, 5, 1], [2, 3]]
    rows = gather(lm, contexts)
    assert all(torch.equal(r, exact(c)) for r, c in zip(rows, contexts))
    assert lm.stats.engine_calls == llm.core.steps == 2 and llm.core.computed == 8


def test_an_engine_that_admits_nothing_raises_and_frees_the_requests():
    lm, llm = make_live()
    gather(lm, [[1, 2]])
    lm._sessions.max_idle_steps = 5
    llm.core.stall = True
    with pytest.raises(RuntimeError, match="K/V cache is too small"):
        gather(lm, [[1, 2, 3], [1, 2, 4]])
    assert llm.core.sessions == {} and lm._sessions.lanes == {}
    llm.core.stall = False
    rows = gather(lm, [[1, 2, 3]])  # the next round starts afresh
    assert torch.equal(rows[0], exact([1, 2, 3]))


def test_smc_on_live_requests_is_unbiased_and_runs_one_token_per_context():
    ref = asyncio.run(enumerate_exact(Words(FunctionLM(VOCAB, 0, toy_logits))))
    lm, llm = make_live()
    first = asyncio.run(smc_standard(Words(lm), 8, seed=0))
    assert first.stats["steps"] == 3 and lm.stats.engine_calls == lm.batch_calls == 3
    # Z-hat over 200 seeds: mean within 4 standard errors of the exact Z
    z = torch.tensor(
        [math.exp(asyncio.run(smc_standard(Words(lm), 8, seed=s)).log_ml) for s in range(200)],
        dtype=torch.float64,
    )
    se = z.std() / math.sqrt(len(z))
    assert abs(z.mean() - math.exp(ref.log_ml)) < 4 * se, (z.mean(), ref.log_ml, se)


class Counting(Model):
    """Four tokens after "ab", recording every context the program reads."""

    seen: list[set] = []

    def __init__(self, lm) -> None:
        super().__init__()
        self.context = LMContext(lm, "ab")

    async def step(self) -> None:
        step = len(self.context.generated)
        while len(Counting.seen) <= step:
            Counting.seen.append(set())
        Counting.seen[step].add(tuple(self.context.tokens))
        await self.sample(self.context.next_token())
        if len(self.context.generated) >= 4:
            self.finish()


def test_smc_steer_computes_one_token_per_distinct_context_and_step():
    lm, llm = make_live()
    Counting.seen = []
    asyncio.run(smc_steer(Counting(lm), 6, 3, seed=1))
    distinct = [len(s) for s in Counting.seen]
    assert lm.stats.engine_calls == len(distinct) == 4
    # the prompt's two tokens, then one token per distinct context of every later step
    assert llm.core.computed == lm.stats.tokens_computed == 2 + sum(distinct[1:])
    assert lm.stats.requests == 1 + lm.stats.forks


@pytest.mark.parametrize("capture", ["logprobs", "processor"])
def test_live_host_syncs_per_step_do_not_grow_with_n(capture):
    from tests.core.test_host_syncs import syncs_per_step

    counts = {}
    for n in (2, 8, 32):
        lm, _ = make_live(capture)
        counts[n] = syncs_per_step(lm, n, steps=4, eos=0, observed=1)
    assert counts[2] == counts[8] == counts[32], counts


def test_live_mode_bad_input():
    from tests.lm.test_vllm_fake import FakeEngine

    with pytest.raises(TypeError, match="live=True needs vLLM's v1 engine"):
        VLLMLM(FakeEngine(), capture="logprobs", sampling_params=Params)
    with pytest.raises(TypeError, match="live must be True or False"):
        VLLMLM(FakeEngine(), capture="logprobs", live="yes")


def test_contexts_nested_in_one_round_fork_from_their_prefix():
    lm, llm = make_live()
    # a program that takes forced tokens asks for a context and its extensions together
    contexts = [[1, 2, 3, 4, 5, 1, 2], [1, 2, 3, 4, 5, 1, 2, 3, 4], [1, 2, 3, 4, 5, 1, 2, 3]]
    rows = gather(lm, contexts)
    assert all(torch.equal(r, exact(c)) for r, c in zip(rows, contexts))
    # three waves: the 7-token prompt, then each longer context forks from the one before
    assert llm.core.computed == 7 + 1 + 1 and lm.stats.engine_calls == 3
    assert (lm.stats.forks, lm.stats.extends) == (2, 0) and len(llm.core.sessions) == 3
    # every particle's request lives on: the next round extends each of them
    rows = gather(lm, [c + [1] for c in contexts])
    assert llm.core.computed == 9 + 3 and lm.stats.extends == 3 and lm.stats.freed == 0


def test_idle_rounds_keep_a_request_that_skips_a_round():
    fn = FunctionLM(VOCAB, 0, toy_logits)
    llm = FakeLLM(toy_logits, len(VOCAB), FakeTokenizer(fn), "logprobs")
    lm = VLLMLM(llm, capture="logprobs", sampling_params=Params, idle_rounds=1)
    gather(lm, [[1, 2], [1, 3]])
    gather(lm, [[1, 2, 4]])  # [1, 3]'s particle skips this round: kept
    assert lm.stats.freed == 0 and len(llm.core.sessions) == 2
    gather(lm, [[1, 3, 4, 4], [1, 2, 4, 1]])  # it comes back two tokens later: extended
    assert lm.stats.extends == 3 and lm.stats.requests == 2 and llm.core.computed == 4 + 1 + 3
    gather(lm, [[1, 2, 4, 1, 1]])
    gather(lm, [[1, 2, 4, 1, 1, 1]])  # unasked for two rounds: freed
    assert lm.stats.freed == 1 and len(llm.core.sessions) == 1
    with pytest.raises(ValueError, match="idle_rounds must be"):
        VLLMLM(llm, capture="logprobs", sampling_params=Params, idle_rounds=-1)


def test_batch_size_and_blocking_calls_do_not_free_live_requests():
    lm, llm = make_live()
    lm.batch_size = 1  # vLLM batches itself: a live round stays one call
    gather(lm, [[1, 2], [1, 3], [1, 4]])
    assert lm.batch_calls == 1 and lm.stats.engine_calls == 1 and len(llm.core.sessions) == 3
    row = lm.next_token_logprobs_sync([1, 2, 5])  # a lone blocking call amid a run
    assert torch.equal(row, exact([1, 2, 5])) and lm.stats.freed == 0
    assert len(llm.core.sessions) == 3  # [1, 2] was extended, [1, 3] and [1, 4] live on
    gather(lm, [[1, 3, 1], [1, 4, 1]])
    assert lm.stats.extends == 3 and lm.stats.freed == 1  # only [1, 2, 5]'s request


def test_a_context_longer_than_the_engine_allows_is_refused():
    lm, llm = make_live()
    gather(lm, [[1] * 60])
    with pytest.raises(ValueError, match="length 64 do not fit the vLLM engine's max_model_len=64"):
        gather(lm, [[1] * 64])  # extending the 60-token request by 4
    with pytest.raises(ValueError, match="max_model_len=64"):
        gather(lm, [[2] * 70])
    assert llm.core.sessions == {}  # the failed rounds freed everything
    assert torch.equal(gather(lm, [[1] * 63])[0], exact([1] * 63))
