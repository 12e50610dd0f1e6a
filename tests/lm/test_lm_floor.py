"""The LM floor's shared machinery: work counters, the coalescer, memo tables, load-argument checks."""

import asyncio
import gc
import weakref

import pytest
import torch

from llamppl import CachedCausalLM, FunctionLM
from llamppl.batching import Coalescer
from llamppl.lm.base import LMStats
from llamppl.lm.hf.embedded import converted_dir
from llamppl.lm.memo import LRU, PerLM


def _lm():
    return FunctionLM(["a", "b", "."], eos_token_id=2, logits_fn=lambda ctx: [0.0, len(ctx), 0.0])


def test_function_lm_counts_one_forward_per_batched_call():
    lm = _lm()
    assert isinstance(lm.stats, LMStats)

    async def step(contexts):
        return await asyncio.gather(*(lm.next_token_logprobs(c) for c in contexts))

    asyncio.run(step([[0], [0, 1], [0], [1, 1, 1]]))  # 3 distinct contexts, one batch
    s = lm.stats
    assert (s.batch_calls, s.forward_calls, s.requests, s.cache_hits) == (1, 1, 3, 0)
    assert s.tokens_run == 1 + 2 + 3
    asyncio.run(step([[0], [1]]))  # [0] is memoised
    assert (s.batch_calls, s.forward_calls, s.requests, s.cache_hits) == (2, 2, 5, 1)
    assert lm.batch_calls == 2
    with pytest.raises(AttributeError):
        lm.batch_calls = 0  # read-only: the count lives in lm.stats
    s.reset()
    assert lm.batch_calls == s.forward_calls == s.tokens_run == 0


def test_coalescer_serves_one_round_in_one_call_and_reports_errors_to_all():
    seen = []

    def serve(xs):
        seen.append(list(xs))
        if "bad" in xs:
            raise ValueError("bad request")
        return [x * 2 for x in xs]

    co = Coalescer(serve)

    async def round_(xs):
        return await asyncio.gather(*(co.submit(x) for x in xs), return_exceptions=True)

    assert asyncio.run(round_([1, 2, 3])) == [2, 4, 6]
    out = asyncio.run(round_(["bad", 4]))  # a new event loop: nothing pending carries over
    assert all(isinstance(e, ValueError) for e in out)
    assert seen == [[1, 2, 3], ["bad", 4]] and co.calls == 2
    with pytest.raises(TypeError, match="serve"):
        Coalescer(3)


def test_per_lm_tables_do_not_keep_the_lm_alive():
    lm = _lm()
    masks = lm.masks
    assert lm.masks is masks  # built once
    table = PerLM(lambda lm: torch.zeros(lm.vocab_size))
    assert table(lm) is table(lm)
    ref = weakref.ref(lm)
    del lm, masks
    gc.collect()
    assert ref() is None  # the masks refer to their LM, yet the LM is freed


def test_lru_keeps_the_most_recent():
    lru = LRU(2)
    lru.put("a", 1)
    lru.put("b", 2)
    assert lru.get("a") == 1  # a is now the most recent
    lru.put("c", 3)
    assert "b" not in lru and lru.get("a") == 1 and len(lru) == 2
    off = LRU(0)
    off.put("a", 1)
    assert off.get("a") is None


def test_bad_device_and_dtype_name_the_argument():
    path = converted_dir()
    with pytest.raises(ValueError, match=r"dtype='float17'.*'float32'"):
        CachedCausalLM.from_pretrained(path, dtype="float17")
    with pytest.raises(ValueError, match="dtype=torch.int64"):
        CachedCausalLM.from_pretrained(path, dtype=torch.int64)
    with pytest.raises(TypeError, match="dtype"):
        CachedCausalLM.default(dtype=3)
    with pytest.raises(ValueError, match="device='gpu0' is not a device name"):
        CachedCausalLM.from_pretrained(path, device="gpu0")
    with pytest.raises(TypeError, match="device"):
        CachedCausalLM.default(device=0.5)


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a torch build without CUDA")
def test_unavailable_device_says_which_devices_this_build_has():
    with pytest.raises(ValueError, match=r"device='cuda' is not available.*has: cpu"):
        CachedCausalLM.from_pretrained(converted_dir(), device="cuda")
    with pytest.raises(ValueError, match=r"device='cuda:0' is not available"):
        CachedCausalLM.default(device="cuda:0")
