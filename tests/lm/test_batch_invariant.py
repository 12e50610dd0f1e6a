"""``CachedCausalLM(batch_invariant=True)`` on the embedded SmolLM2: a context's log-probs are
bitwise the same whatever other contexts share its forward (their number, lengths, prompts,
prefixes), and the trie cache's work counts are unchanged."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import pytest
import torch

pytestmark = pytest.mark.slow

TOL = 1e-4
_LOOP = asyncio.new_event_loop()

TARGET = "The quick brown fox jumps over the lazy"
#: companions of different lengths: unrelated prompts, one sharing the target's first
#: words, one extending the target, a one-token prompt and a long one
OTHERS = [
    "Once upon a time",
    "The quick brown cat",
    "In 1492 Columbus sailed the ocean blue and then he",
    "Hi",
    "The quick brown fox jumps over the lazy dog and the",
    "def f(x): return",
    "A long time ago in a galaxy far, far away, there lived a",
    "Paris",
]


def gather(lm, contexts: Sequence[Sequence[int]]) -> list[torch.Tensor]:
    """Await ``next_token_logprobs`` for all ``contexts`` concurrently (one coalesced batch)."""

    async def go():
        return await asyncio.gather(*(lm.next_token_logprobs(c) for c in contexts))

    return _LOOP.run_until_complete(go())


@pytest.fixture(scope="module", params=["default", "fp32"])
def make_lm(request, smollm):
    """Fresh LMs over the embedded weights: as ``CachedCausalLM.default()`` loads them, and with
    float32 ``nn.Linear`` layers (whose products round a row by the number of rows)."""
    from llamppl.lm.hf.cached_causal_lm import CachedCausalLM
    from llamppl.lm.hf.load import load_default

    if request.param == "default":
        model, tokenizer = smollm.model, smollm.tokenizer
    else:
        model, tokenizer = load_default(None, torch.float32)

    def make(**kw) -> CachedCausalLM:
        return CachedCausalLM(model, tokenizer, **kw)

    return make


@pytest.fixture(scope="module")
def target_alone(make_lm):
    """The target's log-probs served alone on a fresh batch-invariant LM (one 9-token row)."""
    lm = make_lm(batch_invariant=True, verify=False)
    return tuple(lm.encode(TARGET)), gather(lm, [lm.encode(TARGET)])[0]


@pytest.mark.parametrize("n_others", [1, 3, 8])
def test_a_context_is_bitwise_the_same_beside_other_rows(make_lm, target_alone, n_others):
    target, alone = target_alone
    lm = make_lm(batch_invariant=True, verify=False)
    others = [tuple(lm.encode(t)) for t in OTHERS[:n_others]]
    got = gather(lm, [*others, target])
    assert torch.equal(got[-1], alone)
    assert lm.stats.forward_calls == 1


def test_a_context_is_bitwise_the_same_whatever_was_cached_before(make_lm, target_alone):
    """Served as one new token after a cached prefix (a 1-token row of a lone forward), as
    the tail of a tree row below a cached prompt, and from the cache's hidden state."""
    target, alone = target_alone
    lm = make_lm(batch_invariant=True, verify=False)
    gather(lm, [target[:-1]])  # prefix cached: the target is one new token, alone
    assert torch.equal(gather(lm, [target])[0], alone)
    lm.logprob_memo.clear()  # recomputed from the stored hidden state by the head only
    assert torch.equal(gather(lm, [target])[0], alone)
    lm = make_lm(batch_invariant=True, verify=False)
    gather(lm, [target[:3]])  # a cached prompt; the target's tail and a sibling form one tree row
    sibling = target[:5] + tuple(lm.encode(" cat sat"))
    assert torch.equal(gather(lm, [sibling, target])[1], alone)


def test_a_long_prompts_context_is_bitwise_the_same_beside_rows_below_it(make_lm):
    """The key-block layout: a 102-token context (the key run [0, 64), then its last block) served
    in its own prefill, below the cached prompt beside rows that share it or part of it, and in
    one prefill with a sibling; the same bits, within TOL of a fresh forward."""
    lm = make_lm(batch_invariant=True, verify=False)
    unit = lm.encode(" The fox jumps over the lazy dog while the cat sleeps on the warm mat.")
    prompt = tuple((unit * 8)[:100])
    target = prompt + tuple(lm.encode(" Then"))[:1] + (unit[0],)
    alone = gather(lm, [target])[0]
    lm = make_lm(batch_invariant=True, verify=False)
    gather(lm, [prompt])
    company = [prompt + (unit[3],), prompt[:80] + (unit[5],), tuple(lm.encode("Hi there"))]
    assert torch.equal(gather(lm, [*company, target])[-1], alone)
    lm = make_lm(batch_invariant=True, verify=False)
    assert torch.equal(gather(lm, [prompt[:70] + (unit[1], unit[2]), target])[1], alone)
    assert (alone - fresh(lm.model, [target])[0]).abs().max().item() < TOL


def fresh(model, contexts) -> list[torch.Tensor]:
    """Log-probs from a fresh full forward of ``model`` for each context (no cache)."""
    with torch.inference_mode():
        return [
            torch.log_softmax(model(torch.tensor([c])).logits[0, -1].float(), -1) for c in contexts
        ]


def test_invariant_forwards_are_exact_and_count_the_same_work(make_lm):
    lm = make_lm(batch_invariant=True)  # the construction probe passes in this mode
    per_row = make_lm(batch_invariant=False, verify=False)
    contexts = [tuple(lm.encode(t)) for t in [TARGET, *OTHERS]]
    got, want = gather(lm, contexts), gather(per_row, contexts)
    assert max((g - r).abs().max().item() for g, r in zip(got, want)) < TOL
    refs = fresh(lm.model, contexts)
    assert max((g - r).abs().max().item() for g, r in zip(got, refs)) < TOL
    for key in ("forward_calls", "tokens_run", "cache_hits", "requests", "cached_tokens"):
        assert getattr(lm.stats, key) == getattr(per_row.stats, key), key
    assert lm.stats.shared_prefix_tokens == 0  # no prefix merge in this mode
    ext = [c + (lm.eos_token_id,) for c in contexts[:3]]  # one token each past a cached node
    gather(lm, ext), gather(per_row, ext)
    assert lm.stats.tokens_run == per_row.stats.tokens_run
    assert lm.stats.forward_calls == per_row.stats.forward_calls == 2


def test_on_by_default_and_the_per_row_path_one_keyword_away(make_lm):
    assert make_lm(verify=False).batch_invariant
    lm = make_lm(batch_invariant=False, verify=False)
    prompt = tuple(lm.encode(TARGET))
    gather(lm, [prompt])
    gather(lm, [prompt + (t,) for t in (11, 12, 13)])  # three rows below one cached prompt
    assert lm.stats.shared_prefix_tokens == 3 * len(prompt)  # read once: the per-row path
    lm.batch_invariant = True
    gather(lm, [prompt + (t, 5) for t in (11, 12, 13)])
    assert lm.stats.shared_prefix_tokens == 3 * len(prompt)  # no merge in this mode
