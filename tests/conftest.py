"""Shared fixtures: the embedded SmolLM2 (loaded once per session) and helpers.

``smollm`` is one :class:`~llamppl.CachedCausalLM` for the whole session; tests
that count work build their own LM over the same weights with ``make_lm`` (a
fresh trie and zeroed stats, no reload).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import pytest
import torch
from warning_policy import filterwarnings_lines

from llamppl.lm.hf.cached_causal_lm import CachedCausalLM


def pytest_configure(config: pytest.Config) -> None:
    """Deprecation and future warnings fail the test that triggers them (``warning_policy``)."""
    for line in filterwarnings_lines():
        config.addinivalue_line("filterwarnings", line)


@pytest.fixture(scope="session")
def smollm() -> CachedCausalLM:
    """The embedded default model, ``CachedCausalLM.default()``, shared by the session."""
    return CachedCausalLM.default()


@pytest.fixture
def make_lm(smollm: CachedCausalLM) -> Callable[..., CachedCausalLM]:
    """Factory for fresh ``CachedCausalLM`` objects sharing the session's weights."""

    def make(**kw) -> CachedCausalLM:
        return CachedCausalLM(smollm.model, smollm.tokenizer, **kw)

    return make


@pytest.fixture(scope="session")
def reference_logprobs(smollm: CachedCausalLM) -> Callable[[Sequence[int]], torch.Tensor]:
    """Next-token log-probs from a fresh full forward of the HF model (no cache, batch 1)."""
    cache: dict[tuple[int, ...], torch.Tensor] = {}

    def ref(context: Sequence[int]) -> torch.Tensor:
        key = tuple(context)
        if key not in cache:
            with torch.inference_mode():
                ids = torch.tensor([key], device=smollm.device)
                logits = smollm.model(ids, use_cache=False, logits_to_keep=1).logits
            cache[key] = torch.log_softmax(logits[0, -1].float(), dim=-1)
        return cache[key]

    return ref


@pytest.fixture(scope="session")
def batched_reference_logprobs(
    smollm: CachedCausalLM,
) -> Callable[[Sequence[Sequence[int]]], list[torch.Tensor]]:
    """Like ``reference_logprobs`` for many contexts at once: one uncached forward,
    right-padded (padding after a causal sequence cannot change it). Cheaper on CPU,
    where a forward's cost is dominated by streaming the weights."""
    cache: dict[tuple[int, ...], torch.Tensor] = {}

    def refs(contexts: Sequence[Sequence[int]]) -> list[torch.Tensor]:
        todo = list(dict.fromkeys(tuple(c) for c in contexts if tuple(c) not in cache))
        if todo:
            width = max(map(len, todo))
            ids = torch.tensor(
                [list(c) + [0] * (width - len(c)) for c in todo], device=smollm.device
            )
            mask = torch.tensor(
                [[1] * len(c) + [0] * (width - len(c)) for c in todo], device=smollm.device
            )
            with torch.inference_mode():
                logits = smollm.model(ids, attention_mask=mask, use_cache=False).logits  # (B, S, V)
            for b, c in enumerate(todo):
                cache[c] = torch.log_softmax(logits[b, len(c) - 1].float(), dim=-1)
        return [cache[tuple(c)] for c in contexts]

    return refs
