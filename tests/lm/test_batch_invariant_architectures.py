"""The batch-invariant forward on architectures of the matrix (``tiny_models.py``: tiny random
weights, windows of 8, eager and sdpa, torch's default threads): exact against a fresh
forward, and each context's log-probs bitwise the same alone and in a batch of others (or,
for a model whose layers bypass transformers' attention interface, a warning and the per-row
path). One of each kind: grouped K/V (llama), biases and full heads (gpt2), sliding windows
(mistral), soft-capping (gemma2, eager only), latent K/V (deepseek-v3), its own attention
code (falcon), experts (mixtral: exact, but not invariant, see
``llamppl/lm/hf/batch_invariant.py``)."""

from __future__ import annotations

import asyncio
import warnings

import pytest
import torch
from tiny_models import ATTN, CONFIGS, TOL, context_tree, max_diff, tiny_model, word_tokenizer

from llamppl import CachedCausalLM


@pytest.fixture(scope="module")
def tokenizer():
    return word_tokenizer()


def served(lm, contexts) -> list[torch.Tensor]:
    async def go():
        return await asyncio.gather(*(lm.next_token_logprobs(c) for c in contexts))

    return asyncio.run(go())


KINDS = ["llama", "gpt2", "mistral-window", "gemma2", "deepseek-v3-mla", "falcon", "mixtral"]
#: each expert's product runs on the tokens routed to it: rows of a batch change its bits
EXPERTS = {"mixtral"}


@pytest.mark.parametrize("attn", ATTN)
@pytest.mark.parametrize("arch", KINDS)
def test_invariant_forward_is_exact_and_keeps_no_company(tokenizer, arch, attn):
    try:
        model = tiny_model(CONFIGS[arch], attn)
    except ValueError as exc:  # transformers refuses this attention implementation here
        pytest.skip(f"{arch} with {attn}: {exc}")
    contexts = context_tree()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        lm = CachedCausalLM(model, tokenizer, batch_invariant=True)
        assert max_diff(lm, model, contexts, together=True) <= TOL
    if not lm.batch_invariant:  # the model's layers do not call the attention interface
        assert any("batch_invariant=True needs" in str(w.message) for w in caught)
        return
    steps = [c + (3 + i % 7,) for i, c in enumerate(contexts)]
    together = served(lm, steps)
    if arch in EXPERTS:
        return
    for c, got in zip(steps[::6], together[::6]):
        alone = CachedCausalLM(model, tokenizer, batch_invariant=True, verify=False)
        assert torch.equal(served(alone, [c])[0], got)
    assert lm.stats.shared_prefix_tokens == 0
