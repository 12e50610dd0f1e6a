"""CachedCausalLM on the embedded SmolLM2: exactness, work accounting, batching, memory bound."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Sequence

import pytest
import torch

from llamppl.lm.hf.cached_causal_lm import CachedCausalLM

pytestmark = pytest.mark.slow

TOL = 1e-4
"""Cached against fresh log-probs, per token, up to 20 nats below zero; beyond, the bound grows
in proportion to ``|log p|`` (:func:`scaled_err`)."""
SCALE_NATS = 20.0


def scaled_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    """The largest ``|out - ref| / max(1, |ref| / SCALE_NATS)`` over the vocabulary.

    Two float32 forwards that sum in different orders (the cache's incremental one, the fresh
    one over the whole sequence) differ in the logits by rounding that grows with their
    magnitude, so the log-probs of the least likely tokens carry the largest absolute error:
    on the branching tree (seed 3, FBGEMM/ATen/MKL forced to AVX2) it is 9.3e-5 at a token of
    log p = -27.9 with float16 weights and 1.5e-4 with float32 ones, while the most likely token
    is off by 5e-6 and the KL is 1e-8. Tokens within 20 nats of certainty keep the absolute
    1e-4; farther ones get 1e-4 per 20 nats.
    """
    return ((out - ref).abs() / (ref.abs() / SCALE_NATS).clamp(min=1.0)).max().item()


_LOOP = asyncio.new_event_loop()


def gather(lm, contexts: Sequence[Sequence[int]]) -> list[torch.Tensor]:
    """Await ``next_token_logprobs`` for all ``contexts`` concurrently (one coalesced batch)."""

    async def go():
        return await asyncio.gather(*(lm.next_token_logprobs(c) for c in contexts))

    return _LOOP.run_until_complete(go())


def max_err(outs, contexts, ref) -> float:
    return max(scaled_err(o, ref(c)) for o, c in zip(outs, contexts))


def max_err_batched(outs, contexts, refs) -> float:
    return max(scaled_err(o, r) for o, r in zip(outs, refs(contexts)))


def all_prefixes(contexts) -> set[tuple[int, ...]]:
    return {tuple(c[:k]) for c in contexts for k in range(1, len(c) + 1)}


def branching_tree(lm, seed: int, n: int = 32, max_len: int = 40) -> list[tuple[int, ...]]:
    """``n`` distinct random contexts (at most ``max_len`` tokens) sharing a prompt,
    each branching off an earlier one at a random point (so: several branch points)."""
    rng = random.Random(seed)
    prompt = tuple(lm.encode("In a small village by the sea, an old fisherman"))
    contexts = [prompt]
    while len(contexts) < n:
        parent = rng.choice(contexts)
        cut = rng.randint(3, len(parent))
        extra = rng.randint(1, 16)
        child = (parent[:cut] + tuple(rng.randrange(lm.vocab_size) for _ in range(extra)))[:max_len]
        if child not in contexts:
            contexts.append(child)
    return contexts


# --------------------------------------------------------------------------- tokenizer side
def test_vocab_and_special_tokens(smollm):
    assert smollm.vocab_size == 49152 == len(smollm.vocab)
    assert smollm.eos_token_id == 2 and smollm.vocab[2] == "<|im_end|>"
    assert smollm.bos_token_id is None  # SmolLM2 adds no BOS
    assert smollm.device == torch.device("cpu")
    text = "Hello world! The café costs 5€\n\tand\u00a0more."
    ids = smollm.encode(text)
    assert smollm.decode(ids) == text
    assert smollm.decode(ids) == smollm.tokenizer.decode(ids)
    ascii_ids = smollm.encode("Hello world, it is 12:30.\n  Done")
    assert "".join(smollm.vocab[i] for i in ascii_ids) == "Hello world, it is 12:30.\n  Done"
    assert smollm.vocab[smollm.encode(" the")[0]] == " the"


# --------------------------------------------------------------------------- exactness
def test_branching_tree_equals_fresh_forward(make_lm, reference_logprobs):
    lm = make_lm()
    rng = random.Random(1)
    contexts = branching_tree(lm, seed=1)
    assert len(contexts) >= 30 and 30 <= max(map(len, contexts)) <= 40
    rng.shuffle(contexts)
    batches = [contexts[i::3] for i in range(3)]
    outs = []
    for batch in batches:
        outs += gather(lm, batch)
    flat = [c for b in batches for c in b]
    assert lm.stats.forward_calls == 3
    assert lm.stats.tokens_run == len(all_prefixes(contexts))  # every prefix run exactly once
    assert max_err(outs, flat, reference_logprobs) < TOL
    for o in outs:
        assert o.dtype == torch.float32 and o.shape == (lm.vocab_size,)
        assert abs(torch.logsumexp(o, 0).item()) < 1e-4
    # every intermediate prefix is a cache hit now (LM head only) and still exact
    before = lm.stats.forward_calls
    some = rng.sample(sorted(all_prefixes(contexts)), 6)
    again = gather(lm, some)
    assert lm.stats.forward_calls == before
    assert max_err(again, some, reference_logprobs) < TOL


def test_exact_after_eviction_and_recompute(make_lm, reference_logprobs):
    lm = make_lm(max_cache_tokens=64)
    contexts = branching_tree(lm, seed=1)  # same tree as above: the references are memoised
    outs = []
    for i in range(0, len(contexts), 6):
        outs += gather(lm, contexts[i : i + 6])
        assert len(lm.trie) <= 64
    assert lm.stats.evictions > 0
    assert lm.stats.peak_cached_tokens <= 64
    assert max_err(outs, contexts, reference_logprobs) < TOL
    # the first contexts were evicted: requesting them again recomputes, exactly
    run_before = lm.stats.tokens_run
    again = gather(lm, contexts[:6])
    assert lm.stats.tokens_run > run_before
    assert max_err(again, contexts[:6], reference_logprobs) < TOL


# --------------------------------------------------------------------------- work accounting
def test_resampling_workload_runs_each_node_once(make_lm):
    lm = make_lm()
    rng = random.Random(3)
    gen = torch.Generator().manual_seed(3)
    prompt = tuple(lm.encode("Write a short story about a robot who learns to paint. Once upon"))[
        :20
    ]
    prompt = prompt + tuple(range(100, 100 + 20 - len(prompt)))
    assert len(prompt) == 20
    requested = [prompt]
    (logp,) = gather(lm, [prompt])
    particles = [(prompt, logp)] * 16
    steps = 10
    for _ in range(steps):
        grown = []
        for ctx, lp in particles:
            tok = int(torch.multinomial(lp.exp(), 1, generator=gen))
            grown.append(ctx + (tok,))
        survivors = [rng.choice(grown) for _ in grown]  # duplicate / drop, like resampling
        outs = gather(lm, survivors)
        requested += survivors
        particles = list(zip(survivors, outs))
    s = lm.stats
    assert s.forward_calls == steps + 1
    assert s.tokens_run == len(all_prefixes(requested)) == len(lm.trie) == s.cached_tokens
    assert s.peak_cache_bytes == s.peak_cached_tokens * lm._pool.bytes_per_slot
    assert lm.batch_calls == steps + 1


def test_sixteen_concurrent_awaits_are_one_forward(make_lm, batched_reference_logprobs):
    lm = make_lm()
    base = lm.encode("The weather today is")
    (_,) = gather(lm, [base])
    rng = random.Random(4)
    # different cached-prefix lengths and different suffix lengths in one batch
    contexts = [
        tuple(base[: rng.randint(1, len(base))])
        + tuple(rng.randrange(1000, 2000) for _ in range(i % 4))
        for i in range(16)
    ]
    before = lm.stats.forward_calls
    outs = gather(lm, contexts)
    assert lm.stats.forward_calls - before == 1
    assert lm.batch_calls == 2
    assert max_err_batched(outs, contexts, batched_reference_logprobs) < TOL


def test_cache_hit_needs_no_forward(make_lm):
    lm = make_lm()
    ctx = lm.encode("Paris is the capital of")
    (a,) = gather(lm, [ctx])
    s0 = (lm.stats.forward_calls, lm.stats.tokens_run)
    (b,) = gather(lm, [ctx])
    assert (lm.stats.forward_calls, lm.stats.tokens_run) == s0
    assert lm.stats.cache_hits == 1
    assert torch.equal(a, b)
    assert lm.next_token_logprobs_sync(ctx).equal(a)


# --------------------------------------------------------------------------- memory bound
def test_memory_bound_long_run(make_lm, batched_reference_logprobs):
    bound = 60
    lm = make_lm(max_cache_tokens=bound)
    rng = random.Random(5)
    gen = torch.Generator().manual_seed(5)
    prompt = tuple(lm.encode("Fruits: apple,"))
    (lp,) = gather(lm, [prompt])
    particles = [(prompt, lp)] * 6
    checked = 0
    for step in range(24):
        grown = [c + (int(torch.multinomial(p.exp(), 1, generator=gen)),) for c, p in particles]
        survivors = [rng.choice(grown) for _ in grown]
        outs = gather(lm, survivors)
        assert len(lm.trie) <= bound
        if step in (0, 12, 23):
            assert max_err_batched(outs, survivors, batched_reference_logprobs) < TOL
            checked += 1
        particles = list(zip(survivors, outs))
    s = lm.stats
    assert s.evictions > 0 and checked == 3
    assert s.peak_cached_tokens <= bound
    assert s.peak_cache_bytes <= bound * lm._pool.bytes_per_slot
    assert lm._pool.allocated_slots <= bound


def test_bound_smaller_than_batch_splits_and_too_long_context_raises(
    make_lm, batched_reference_logprobs
):
    lm = make_lm(max_cache_tokens=12)
    rng = random.Random(6)
    contexts = [tuple(rng.randrange(5000) for _ in range(8)) for _ in range(4)]  # 32 nodes > 12
    outs = gather(lm, contexts)
    assert lm.stats.forward_calls == 4
    assert max_err_batched(outs, contexts, batched_reference_logprobs) < TOL
    with pytest.raises(ValueError, match="max_cache_tokens"):
        gather(lm, [tuple(range(13))])
    # the failed request left the cache consistent
    assert len(lm.trie) <= 12
    assert max_err_batched(gather(lm, contexts[:1]), contexts[:1], batched_reference_logprobs) < TOL


# --------------------------------------------------------------------------- stats and API
def test_stats_reset_repr_and_clear_cache(make_lm):
    lm = make_lm()
    gather(lm, [lm.encode("One two three")])
    assert "forward_calls=1" in repr(lm.stats) and "MiB" in repr(lm.stats)
    n = lm.stats.cached_tokens
    assert n == 3
    lm.stats.reset()
    assert lm.stats.forward_calls == lm.stats.tokens_run == 0
    assert lm.stats.cached_tokens == lm.stats.peak_cached_tokens == n
    lm.clear_cache()
    assert lm.stats.cached_tokens == 0 and len(lm.trie) == 0
    gather(lm, [lm.encode("One two three")])
    assert lm.stats.tokens_run == 3


def test_default_returns_fresh_lm_sharing_weights(smollm):
    other = CachedCausalLM.default()
    assert other is not smollm and other.model is smollm.model
    assert other.stats.forward_calls == 0 and len(other.trie) == 0


def test_from_pretrained_local_copy(smollm):
    from llamppl.lm.hf.embedded import converted_dir

    # weights="auto": the default's linear-layer format (float16 weights on a CPU)
    lm = CachedCausalLM.from_pretrained(converted_dir(), max_cache_tokens=100, weights="auto")
    ctx = lm.encode("Hi there")
    (a,) = gather(lm, [ctx])
    (b,) = gather(smollm, [ctx])
    assert (a - b).abs().max().item() < TOL


# --------------------------------------------------------------------------- bad input
def test_bad_input(smollm, make_lm, tmp_path):
    missing = tmp_path / "no-such-model"
    with pytest.raises(ValueError, match="no-such-model"):
        CachedCausalLM.from_pretrained(missing)
    with pytest.raises(ValueError, match="not-a-real-org/not-a-model"):
        CachedCausalLM.from_pretrained("not-a-real-org/not-a-model")
    with pytest.raises(ValueError, match="max_cache_tokens"):
        make_lm(max_cache_tokens=0)
    with pytest.raises(TypeError, match="max_cache_tokens"):
        make_lm(max_cache_tokens="8")
    with pytest.raises(ValueError, match="token_ids"):
        gather(smollm, [[1, 49152]])
    with pytest.raises(ValueError, match="token_ids"):
        gather(smollm, [[-1]])
    with pytest.raises(TypeError, match="token_ids"):
        gather(smollm, [[1, 2.5]])
    with pytest.raises(TypeError, match="token_ids"):
        gather(smollm, ["hello"])
    with pytest.raises(ValueError, match="non-empty"):
        gather(smollm, [[]])
    with pytest.raises(TypeError, match="text"):
        smollm.encode(b"bytes")
    with pytest.raises(TypeError, match="hf_model"):
        CachedCausalLM(object(), smollm.tokenizer)
