"""Shared-prefix attention: rows of a forward read their common cached prefix once, exactly.

The merge rule is checked against ``scaled_dot_product_attention`` over the whole rows
(prefix copied into each); the cached LM against a fresh HF forward of each context, on
tiny random-weight models (hidden 64, 2 layers, grouped K/V heads, no download). Work is
counted through ``KVPool.read`` (slots gathered per call) and ``stats.shared_prefix_tokens``.
"""

from __future__ import annotations

import pytest
import torch
import transformers as tf
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from llamppl import CachedCausalLM
from llamppl.lm.hf.exactness import rounding_tolerance
from llamppl.lm.hf.kv_pool import KVPool
from llamppl.lm.hf.prefix_attention import (
    PrefixState,
    prefix_attention,
    shared_prefix_attention,
    sharing_prefix,
)

VOCAB = 96
TOL = 1e-4  # float32 rounding of a 2-layer model; the per-row path meets the same bound
PROMPT = tuple(range(10, 30))  # 20 tokens


def tiny_model(attn: str = "sdpa", dtype=torch.float32, **kw):
    """A 2-layer random-weight model, 4 query heads over 2 K/V heads unless ``kw`` says otherwise."""
    torch.manual_seed(0)
    cls = kw.pop("cls", tf.LlamaConfig)
    config = cls(
        **{
            "vocab_size": VOCAB,
            "hidden_size": 64,
            "intermediate_size": 128,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "max_position_embeddings": 128,
            "eos_token_id": 1,
            **kw,
        }
    )
    return tf.AutoModelForCausalLM.from_config(config, attn_implementation=attn, dtype=dtype).eval()


@pytest.fixture(scope="module")
def tokenizer():
    words = ["<s>", "</s>", "<pad>"] + [f"w{i}" for i in range(VOCAB - 3)]
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="w0"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<s>", eos_token="</s>", pad_token="<pad>"
    )


def max_diff(lm, contexts) -> float:
    """Serve ``contexts`` as one batch; largest |cached - fresh| log-prob over them."""
    got = lm.next_token_logprobs_batch(contexts)
    worst = 0.0
    with torch.inference_mode():
        for c, g in zip(contexts, got):
            logits = lm.model(input_ids=torch.tensor([c])).logits[0, -1].float()
            worst = max(worst, float((g - torch.log_softmax(logits, -1)).abs().max()))
    return worst


@pytest.fixture
def reads(monkeypatch):
    """Slots gathered by each ``KVPool.read`` call, in order."""
    sizes: list[int] = []
    original = KVPool.read

    def counting(self, layer, slots):
        sizes.append(slots.numel())
        return original(self, layer, slots)

    monkeypatch.setattr(KVPool, "read", counting)
    return sizes


def whole_rows(q, k_pre, v_pre, k, v, mask, scaling):
    """Reference: the prefix copied into every row, one softmax over the row (HF's sdpa)."""
    B = k.shape[0]
    k_all = torch.cat([k_pre[None].expand(B, -1, -1, -1), k], dim=2)
    v_all = torch.cat([v_pre[None].expand(B, -1, -1, -1), v], dim=2)
    seen = torch.ones if mask.dtype == torch.bool else torch.zeros
    head = seen((*mask.shape[:-1], k_pre.shape[1]), dtype=mask.dtype)
    m = torch.cat([head, mask], dim=-1)
    groups = q.shape[1] // k.shape[1]
    k_all, v_all = k_all.repeat_interleave(groups, 1), v_all.repeat_interleave(groups, 1)
    out = torch.nn.functional.scaled_dot_product_attention(q, k_all, v_all, m, scale=scaling)
    return out.transpose(1, 2)  # (B, T, H, D_v)


@pytest.mark.parametrize("additive", [False, True], ids=["bool-mask", "float-mask"])
def test_merge_equals_one_softmax_over_the_whole_row(additive):
    """B=3 rows, T=2 queries, 6 query heads on 2 K/V heads, S=7 shared and L=4 own keys."""
    g = torch.Generator().manual_seed(0)
    B, H, Hkv, T, S, L, D, Dv = 3, 6, 2, 2, 7, 4, 8, 5
    q = torch.randn(B, H, T, D, generator=g)
    k_pre, v_pre = torch.randn(Hkv, S, D, generator=g), torch.randn(Hkv, S, Dv, generator=g)
    k, v = torch.randn(B, Hkv, L, D, generator=g), torch.randn(B, Hkv, L, Dv, generator=g)
    mask = torch.rand(B, 1, T, L, generator=g) < 0.5
    mask[..., -1] = True  # every query sees at least its own key
    if additive:
        mask = torch.zeros(mask.shape).masked_fill_(~mask, torch.finfo(torch.float32).min)
    got = prefix_attention(q, k_pre, v_pre, k, v, mask, 0.3)
    assert got.shape == (B, T, H, Dv)
    torch.testing.assert_close(got, whole_rows(q, k_pre, v_pre, k, v, mask, 0.3))


def test_a_score_changing_keyword_materialises_the_rows():
    """A ``position_bias`` is not a plain softmax: the rows are built and HF's sdpa runs on them."""
    g = torch.Generator().manual_seed(1)
    B, H, T, S, L, D = 2, 2, 1, 5, 3, 4
    q = torch.randn(B, H, T, D, generator=g)
    k_pre, v_pre = torch.randn(H, S, D, generator=g), torch.randn(H, S, D, generator=g)
    k, v = torch.randn(B, H, L, D, generator=g), torch.randn(B, H, L, D, generator=g)
    mask = torch.ones(B, 1, T, L, dtype=torch.bool)
    bias = torch.randn(B, H, T, S + L, generator=g)
    state = PrefixState()
    state.pending = (k_pre, v_pre, k, v)  # as the layer's cache update leaves it
    module = torch.nn.Module()
    with sharing_prefix(tf.LlamaConfig(), state):
        got, _ = shared_prefix_attention(module, q, k, v, mask, scaling=0.5, position_bias=bias)
    assert state.consumed == 1 and state.pending is None
    k_all = torch.cat([k_pre[None].expand(B, -1, -1, -1), k], dim=2)
    v_all = torch.cat([v_pre[None].expand(B, -1, -1, -1), v], dim=2)
    full = torch.ones(B, 1, T, S + L, dtype=torch.bool)
    want, _ = sdpa_attention_forward(module, q, k_all, v_all, full, scaling=0.5, position_bias=bias)
    torch.testing.assert_close(got, want)


def test_decode_step_reads_the_shared_prompt_once_per_layer(tokenizer, reads):
    """Six rows one token past a 20-token prompt: each layer gathers 6 slots, not 6 x 21."""
    lm = CachedCausalLM(tiny_model(), tokenizer, batch_invariant=False)
    assert lm.share_prefix
    lm.next_token_logprobs_batch([PROMPT])
    steps = [PROMPT + (40 + i,) for i in range(6)]
    reads.clear()
    assert max_diff(lm, steps) <= TOL
    assert reads == [6, 6]  # two layers, one new token per row, the prompt stays in the pool
    assert lm.stats.shared_prefix_tokens == 6 * 20
    assert lm.model.config._attn_implementation == "sdpa"  # switched for our forward only
    # the next step: rows 21 tokens deep, sharing the same prompt (the new tokens differ)
    reads.clear()
    assert max_diff(lm, [s + (50,) for s in steps]) <= TOL
    assert reads == [12, 12] and lm.stats.shared_prefix_tokens == 2 * 6 * 20
    # the per-row path, for comparison: every row copies the prompt
    lm.share_prefix = False
    reads.clear()
    assert max_diff(lm, [s + (51,) for s in steps]) <= TOL
    assert reads == [6 * 22, 6 * 22] and lm.stats.shared_prefix_tokens == 2 * 6 * 20


def test_rows_without_a_common_prefix_take_the_per_row_path(tokenizer, reads):
    lm = CachedCausalLM(tiny_model(), tokenizer, batch_invariant=False)
    lm.next_token_logprobs_batch([PROMPT, (60, 61, 62)])
    reads.clear()
    assert max_diff(lm, [PROMPT + (40,), (60, 61, 62, 41)]) <= TOL
    assert lm.stats.shared_prefix_tokens == 0
    assert reads == [2 * 21, 2 * 21]  # each row its whole context (the shorter left padded)


def test_scattered_prefix_slots_are_gathered_once(tokenizer, reads):
    """Prompt, an unrelated context, then the prompt's next token: the shared path is not
    one run of slots, so each layer gathers it once (21 slots) and then the rows (2 x 1)."""
    lm = CachedCausalLM(tiny_model(), tokenizer, batch_invariant=False)
    lm.next_token_logprobs_batch([PROMPT])
    lm.next_token_logprobs_batch([(60, 61)])
    lm.next_token_logprobs_batch([PROMPT + (40,)])  # slot 22: after 60 61's
    reads.clear()
    assert max_diff(lm, [PROMPT + (40, 41), PROMPT + (40, 42)]) <= TOL
    assert reads == [2, 21, 2, 21]  # per layer: the rows' own keys, then the prefix once
    assert lm.stats.shared_prefix_tokens == 2 * 21


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_low_precision_shared_prefix_matches_fresh_forward(tokenizer, dtype):
    """Tolerance: :func:`rounding_tolerance` of the model's dtype (derivation in its docstring)."""
    model = tiny_model(dtype=dtype)
    lm = CachedCausalLM(model, tokenizer, batch_invariant=False)
    lm.next_token_logprobs_batch([PROMPT])
    steps = [PROMPT + (40 + i,) for i in range(4)]
    got = lm.next_token_logprobs_batch(steps)
    assert lm.stats.shared_prefix_tokens == 4 * 20
    for c, g in zip(steps, got):
        with torch.inference_mode():
            logits = model(input_ids=torch.tensor([c])).logits[0, -1].float()
        tol = rounding_tolerance(dtype, 2, float(logits.abs().max()))
        assert float((g - torch.log_softmax(logits, -1)).abs().max()) <= tol


def test_eager_and_windowed_models_keep_the_per_row_path(tokenizer):
    eager = CachedCausalLM(tiny_model("eager"), tokenizer, batch_invariant=False)
    windowed = CachedCausalLM(
        tiny_model(cls=tf.MistralConfig, sliding_window=8), tokenizer, batch_invariant=False
    )
    for lm in (eager, windowed):
        lm.share_prefix = True  # asking is not enough: the path would not be exact here
        assert not lm.share_prefix
        lm.next_token_logprobs_batch([PROMPT])
        assert max_diff(lm, [PROMPT + (40,), PROMPT + (41,)]) <= TOL
        assert lm.stats.shared_prefix_tokens == 0


def test_a_model_whose_layers_bypass_the_interface_falls_back(tokenizer):
    """Falcon's attention is its own code: the first shared forward finds no layer took its
    prefix, turns sharing off and reruns the batch per row (exact)."""
    config = dict(
        cls=tf.FalconConfig, num_kv_heads=1, multi_query=True, new_decoder_architecture=False
    )
    lm = CachedCausalLM(tiny_model(**config), tokenizer, verify=False, batch_invariant=False)
    assert lm.share_prefix
    lm.next_token_logprobs_batch([PROMPT])
    assert max_diff(lm, [PROMPT + (40,), PROMPT + (41,)]) <= TOL
    assert not lm.share_prefix and lm.stats.shared_prefix_tokens == 0
    probed = CachedCausalLM(tiny_model(**config), tokenizer, batch_invariant=False)
    assert not probed.share_prefix  # the probe finds it
