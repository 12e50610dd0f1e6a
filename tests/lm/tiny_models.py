"""Tiny random-weight models of many architectures, for the architecture matrix tests.

Built from ``transformers`` config classes (no download): hidden 64, 2–4 layers,
grouped K/V heads where the architecture has them, a 96-token word-level
vocabulary; every windowed model gets a window of 8. :data:`CONFIGS` are the
architectures ``CachedCausalLM`` must serve exactly, :data:`REFUSED` those it must
refuse (with the reason's key words)::

    model = tiny_model(CONFIGS["llama"], "sdpa")
    lm = CachedCausalLM(model, word_tokenizer())
    max_diff(lm, model, context_tree(), together=True)   # vs a fresh full forward
"""

from __future__ import annotations

import asyncio
import os

import torch
import transformers as tf
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

import llamppl

LLAMPPL_DIR = os.path.dirname(llamppl.__file__)
VOCAB = 96
WINDOW = 8
TOL = 1e-4

COMMON = dict(
    vocab_size=VOCAB,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=128,
    eos_token_id=1,
    bos_token_id=0,
    pad_token_id=2,
)


def _llama_like(cls, **kw):
    return lambda: cls(**{**COMMON, **kw})


def _alternating(n=4):
    return ["sliding_attention" if i % 2 == 0 else "full_attention" for i in range(n)]


CONFIGS = {
    "llama": _llama_like(tf.LlamaConfig),
    "qwen2": _llama_like(tf.Qwen2Config),
    "qwen2-window": _llama_like(
        tf.Qwen2Config,
        num_hidden_layers=4,
        use_sliding_window=True,
        sliding_window=WINDOW,
        max_window_layers=2,
    ),
    "qwen3": _llama_like(tf.Qwen3Config, head_dim=16),
    "mistral-window": _llama_like(tf.MistralConfig, sliding_window=WINDOW),
    "mixtral": _llama_like(tf.MixtralConfig, num_local_experts=4, num_experts_per_tok=2),
    "qwen3-moe": _llama_like(
        tf.Qwen3MoeConfig,
        head_dim=16,
        num_experts=4,
        num_experts_per_tok=2,
        moe_intermediate_size=32,
    ),
    "gemma2": _llama_like(
        tf.Gemma2Config,
        head_dim=16,
        num_hidden_layers=4,
        sliding_window=WINDOW,
        layer_types=_alternating(),
        attn_logit_softcapping=5.0,
        final_logit_softcapping=3.0,
        query_pre_attn_scalar=24,
    ),
    "gemma3": _llama_like(
        tf.Gemma3TextConfig,
        head_dim=16,
        num_hidden_layers=4,
        sliding_window=WINDOW,
        layer_types=_alternating(),
        final_logit_softcapping=3.0,
    ),
    "phi3-window": _llama_like(tf.Phi3Config, sliding_window=WINDOW),
    "starcoder2-window": _llama_like(tf.Starcoder2Config, sliding_window=WINDOW),
    "olmo2": _llama_like(tf.Olmo2Config),
    "granite": _llama_like(tf.GraniteConfig, logits_scaling=4.0),
    "cohere": _llama_like(tf.CohereConfig, logit_scale=0.5),
    "granite-moe": _llama_like(
        tf.GraniteMoeConfig, num_local_experts=4, num_experts_per_tok=2, logits_scaling=3.0
    ),
    "cohere2-window": _llama_like(
        tf.Cohere2Config,
        num_hidden_layers=4,
        sliding_window=WINDOW,
        layer_types=_alternating(),
        logit_scale=0.5,
    ),
    "gpt-oss-window": _llama_like(
        tf.GptOssConfig,
        head_dim=16,
        num_hidden_layers=4,
        sliding_window=WINDOW,
        layer_types=_alternating(),
        num_local_experts=4,
        num_experts_per_tok=2,
    ),
    "deepseek-v3-mla": lambda: tf.DeepseekV3Config(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=128,
        moe_intermediate_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=4,
        n_routed_experts=4,
        num_experts_per_tok=2,
        n_group=1,
        topk_group=1,
        kv_lora_rank=16,
        q_lora_rank=None,
        qk_rope_head_dim=8,
        qk_nope_head_dim=8,
        v_head_dim=12,
        first_k_dense_replace=1,
        max_position_embeddings=128,
    ),
    "gpt2": lambda: tf.GPT2Config(
        vocab_size=VOCAB, n_embd=64, n_layer=2, n_head=4, n_positions=128, eos_token_id=1
    ),
    "gpt-neox": lambda: tf.GPTNeoXConfig(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        max_position_embeddings=128,
        eos_token_id=1,
    ),
    "opt": lambda: tf.OPTConfig(
        vocab_size=VOCAB,
        hidden_size=64,
        ffn_dim=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        max_position_embeddings=128,
        word_embed_proj_dim=64,
        eos_token_id=1,
        pad_token_id=2,
    ),
    "falcon": lambda: tf.FalconConfig(
        vocab_size=VOCAB,
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        multi_query=True,
        eos_token_id=1,
    ),
}

REFUSED = {
    "bloom": (
        lambda: tf.BloomConfig(vocab_size=VOCAB, hidden_size=64, n_layer=2, n_head=4),
        "ALiBi",
    ),
    "falcon-alibi": (
        lambda: tf.FalconConfig(
            vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, alibi=True
        ),
        "ALiBi",
    ),
    "mpt": (
        lambda: tf.MptConfig(vocab_size=VOCAB, d_model=64, n_layers=2, n_heads=4, max_seq_len=128),
        "ALiBi",
    ),
    "gpt-neo-local": (
        lambda: tf.GPTNeoConfig(
            vocab_size=VOCAB,
            hidden_size=64,
            num_layers=2,
            num_heads=4,
            attention_types=[[["global", "local"], 1]],
            window_size=WINDOW,
            max_position_embeddings=128,
        ),
        "local attention",
    ),
    "lfm2": (
        lambda: tf.Lfm2Config(
            vocab_size=VOCAB,
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            layer_types=["conv", "full_attention"],
        ),
        "conv",
    ),
}


def word_tokenizer() -> PreTrainedTokenizerFast:
    """A word-level tokenizer over VOCAB words ``<s> </s> <pad> w0 w1 ...`` (no download)."""
    words = ["<s>", "</s>", "<pad>"] + [f"w{i}" for i in range(VOCAB - 3)]
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="w0"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<s>", eos_token="</s>", pad_token="<pad>"
    )


def tiny_model(config_fn, attn: str, dtype=torch.float32):
    torch.manual_seed(0)
    config = config_fn()
    config._attn_implementation = attn
    model = tf.AutoModelForCausalLM.from_config(config, attn_implementation=attn, dtype=dtype)
    return model.eval()


def context_tree() -> list[tuple[int, ...]]:
    """25 contexts of 11–40 tokens sharing prefixes (a branching tree), ids in [3, VOCAB)."""
    g = torch.Generator().manual_seed(1)
    trunk = (3 + torch.randint(0, VOCAB - 3, (40,), generator=g)).tolist()
    out = []
    for i in range(25):
        cut = 11 + (i * 7) % 24
        tail = (3 + torch.randint(0, VOCAB - 3, (1 + i % 5,), generator=g)).tolist()
        out.append(tuple(trunk[: cut - len(tail)] + tail))
    return out


def fresh_logprobs(model, ctx) -> torch.Tensor:
    with torch.inference_mode():
        logits = model(input_ids=torch.tensor([ctx])).logits[0, -1].float()
    return torch.log_softmax(logits, dim=-1)


def max_diff(lm, model, contexts, together: bool) -> float:
    async def go():
        if together:
            return await asyncio.gather(*(lm.next_token_logprobs(c) for c in contexts))
        return [await lm.next_token_logprobs(c) for c in contexts]

    got = asyncio.run(go())
    return max(float((g - fresh_logprobs(model, c)).abs().max()) for g, c in zip(got, contexts))


ATTN = ["sdpa", "eager"]
#: read the rows' common prefix once (sdpa, no window, pool K/V passed unchanged to the attention
#: interface); eager, windowed, Falcon (own attention code), DeepSeek-V3 (latents) read it per row
SHARE_PREFIX = set(
    "llama qwen2 qwen3 mixtral qwen3-moe olmo2 granite cohere granite-moe gpt2 gpt-neox opt".split()
)
#: read it once or per row depending on the transformers release: 5.0 hands DeepSeek-V3's
#: latent K/V to the attention interface unchanged (shared, exact), 5.24 does not (per row)
SHARE_PREFIX_BY_RELEASE = {"deepseek-v3-mla"}
