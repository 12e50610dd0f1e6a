"""``VLLMLM``'s logic against a fake engine with vLLM's offline interface (no vLLM needed).

The fake serves a :class:`FunctionLM` through ``generate(prompts, params, use_tqdm=...)``,
returning vLLM-shaped request outputs: the generated position's full-vocabulary
log-probs as ``FlatLogprobs`` fields, and ``num_cached_tokens`` from a block
prefix cache (vLLM caches whole blocks of earlier prompts; the last prompt token
is always recomputed). The real engine is tested in ``test_vllm_lm.py``.
"""

from __future__ import annotations

import asyncio
import math
import sys
from dataclasses import dataclass, field
from types import SimpleNamespace

import pytest
import torch

from llamppl import FunctionLM, LMContext, Model
from llamppl.inference import enumerate_exact, smc_standard
from llamppl.lm.vllm.lm import VLLMLM, import_vllm

VOCAB = ["<eos>", "a", "b", "c", " ", "d"]
BLOCK = 4


def toy_logits(ctx: tuple[int, ...]) -> list[float]:
    n, last = len(ctx), ctx[-1]
    return [-1.0 + 0.3 * n, 0.5, 0.2 * last, -0.4, 0.1 * n, float("-inf") if last == 5 else 0.0]


@dataclass
class Params:  # the fields of vllm.SamplingParams that VLLMLM sets
    max_tokens: int = 16
    n: int = 1
    detokenize: bool = True
    ignore_eos: bool = False
    logprobs: int | None = None
    flat_logprobs: bool = False
    extra_args: dict = field(default_factory=dict)


class FakeTokenizer:
    """What ``build_vocab``/``eos_id``/``bos_id`` read from a Hugging Face tokenizer."""

    eos_token_id, bos_token_id, all_special_ids = 0, None, [0]

    def __init__(self, lm: FunctionLM) -> None:
        self.lm = lm

    def __len__(self) -> int:
        return len(VOCAB)

    def convert_ids_to_tokens(self, ids):
        return [VOCAB[i] for i in ids]

    def batch_decode(self, seqs, **kw):
        return [self.decode(s) for s in seqs]

    def decode(self, ids, **kw):
        return "".join(VOCAB[i] for i in ids)

    def encode(self, text, add_special_tokens=False):
        return self.lm.encode(text)

    def __call__(self, text, add_special_tokens=True):
        return {"input_ids": self.encode(text)}


class FakeEngine:
    def __init__(self) -> None:
        self.lm = FunctionLM(VOCAB, 0, toy_logits)
        self.tokenizer = FakeTokenizer(self.lm)
        self.llm_engine = SimpleNamespace(
            model_config=SimpleNamespace(get_vocab_size=lambda: len(VOCAB), hf_config=None)
        )
        self.blocks: set[tuple[int, ...]] = set()
        self.calls: list[int] = []  # batch size of every generate call

    def get_tokenizer(self):
        return self.tokenizer

    def reset_prefix_cache(self) -> bool:
        self.blocks.clear()
        return True

    def generate(self, prompts, sampling_params, *, use_tqdm=True):
        assert use_tqdm is False and not isinstance(sampling_params, list)
        assert sampling_params.max_tokens == 1 and sampling_params.logprobs == -1
        self.calls.append(len(prompts))
        outs = []
        for prompt in prompts:
            ids = tuple(prompt["prompt_token_ids"])
            cached = 0
            while cached + BLOCK <= len(ids) - 1 and ids[: cached + BLOCK] in self.blocks:
                cached += BLOCK
            self.blocks |= {ids[:k] for k in range(BLOCK, len(ids) + 1, BLOCK)}
            logps = self.lm.logprobs(ids).tolist()
            order = sorted(range(len(VOCAB)), key=lambda i: -logps[i])
            sampled = order[0]  # vLLM lists the sampled token first, then the top ranks
            flat = SimpleNamespace(
                start_indices=[0],
                end_indices=[len(VOCAB) + 1],
                token_ids=[sampled, *order],
                logprobs=[logps[sampled], *(logps[i] for i in order)],
            )
            outs.append(
                SimpleNamespace(
                    outputs=[SimpleNamespace(logprobs=flat, token_ids=[sampled])],
                    num_cached_tokens=cached,
                )
            )
        return outs


def make_lm(**kw) -> tuple[VLLMLM, FakeEngine]:
    engine = FakeEngine()
    return VLLMLM(engine, capture="logprobs", sampling_params=Params, live=False, **kw), engine


class Words(Model):
    """Tokens after "ab"; condition: no "c" (Z is about 0.77); EOS or 3 tokens end it."""

    def __init__(self, lm) -> None:
        super().__init__()
        self.context = LMContext(lm, "ab")

    async def step(self) -> None:
        token = await self.sample(self.context.next_token())
        self.condition("c" not in str(self.context))
        if token == 0 or len(self.context.generated) >= 3:
            self.finish()


def test_logprobs_equal_the_model_and_concurrent_awaits_are_one_engine_call():
    lm, engine = make_lm()
    assert lm.vocab == VOCAB and lm.eos_token_id == 0 and lm.vocab_size == 6
    contexts = [[1, 2, 3, 4, 5, 1, 2, 3, 4, t] for t in range(6)] + [[1, 5]] * 3

    async def go():
        return await asyncio.gather(*(lm.next_token_logprobs(c) for c in contexts))

    rows = asyncio.run(go())
    assert engine.calls == [7]  # 9 awaits, 7 distinct contexts, one generate call
    for c, r in zip(contexts, rows):
        assert r.dtype == torch.float32 and r.shape == (6,) and r.device == lm.device
        assert torch.equal(r, engine.lm.logprobs(c).float())  # -inf entries stay -inf
    # vLLM's prefix cache served the first two blocks of six of the seven prompts but one
    assert lm.stats.requests == 7 and lm.stats.engine_calls == 1
    assert lm.stats.prefix_cached_tokens == 5 * 2 * BLOCK
    assert lm.stats.tokens_computed == 6 * 10 + 2 - lm.stats.prefix_cached_tokens
    again = lm.next_token_logprobs_sync(contexts[0])  # memoised: no engine call
    assert torch.equal(again, rows[0]) and engine.calls == [7] and lm.stats.cache_hits == 1
    lm.clear_cache()
    lm.next_token_logprobs_sync(contexts[0])
    assert engine.calls == [7, 1] and lm.stats.prefix_cached_tokens == 40  # prefix cache reset


def test_smc_through_the_backend_is_unbiased_with_one_engine_call_per_step():
    exact = asyncio.run(enumerate_exact(Words(FunctionLM(VOCAB, 0, toy_logits))))
    lm, engine = make_lm()
    first = asyncio.run(smc_standard(Words(lm), 8, seed=0))
    # every step's requests (step 1: the shared prompt) are one generate call
    assert len(engine.calls) == lm.batch_calls == first.stats["steps"] == 3
    assert first.stats["forward_calls"] == 3 and first.stats["tokens_run"] > 0
    # mean of Z-hat over 200 seeds within 4 standard errors of the exact Z
    z = torch.tensor(
        [math.exp(asyncio.run(smc_standard(Words(lm), 8, seed=s)).log_ml) for s in range(200)],
        dtype=torch.float64,
    )
    se = z.std() / math.sqrt(len(z))
    assert abs(z.mean() - math.exp(exact.log_ml)) < 4 * se, (z.mean(), exact.log_ml, se)


def test_bad_input_and_missing_vllm(monkeypatch):
    with pytest.raises(TypeError, match="llm must be a vllm.LLM engine"):
        VLLMLM(object())
    with pytest.raises(ValueError, match="capture must be one of"):
        VLLMLM(FakeEngine(), capture="topk")
    lm, _ = make_lm()
    with pytest.raises(ValueError, match="token_ids must be non-empty"):
        lm.next_token_logprobs_sync([])
    with pytest.raises(ValueError, match=r"out of range: token ids must lie in \[0, 6\)"):
        lm.next_token_logprobs_sync([9])
    with pytest.raises(ValueError, match="local model directory"):
        VLLMLM.from_pretrained("/nonexistent/model")
    monkeypatch.setitem(sys.modules, "vllm", None)
    with pytest.raises(ImportError, match="pip install vllm"):
        import_vllm()
