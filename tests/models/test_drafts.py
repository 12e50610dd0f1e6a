"""Self-speculative drafts (``draft_from_layers``, ``skip_middle_draft``, ``truncated_draft``).

Tiny random-weight models (no download) with 4 decoder layers and a 12-token vocabulary:
a Llama, and a Gemma 3 whose layers alternate sliding-window (window 4) and full
attention, so the kept layers' ``layer_types`` matter. Checked: the draft is a real
model whose cached next-token log-probs equal a fresh forward of the target with the
other layers removed (built independently here, by deleting layers from a deep copy);
it shares the target's tensors; it differs from the target; and SMC-SD with it is
still exact (``enumerate_exact`` gives the target's own distribution and Z = 1).
"""

from __future__ import annotations

import asyncio
import copy
import math

import pytest
import torch
import transformers as tf
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from llamppl import CachedCausalLM, FunctionLM, run
from llamppl.inference import enumerate_exact
from llamppl.models import (
    SpeculativeDecoding,
    draft_from_layers,
    skip_middle_draft,
    truncated_draft,
)

VOCAB = 12
TOL = 1e-4  # fp32 cached vs fresh forward
COMMON = dict(
    vocab_size=VOCAB,
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=4,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=64,
    bos_token_id=0,
    eos_token_id=1,
    pad_token_id=2,
)
ARCHS = {
    "llama": lambda: tf.LlamaConfig(**COMMON),
    "gemma3-window": lambda: tf.Gemma3TextConfig(
        **COMMON,
        head_dim=8,
        sliding_window=4,
        layer_types=["sliding_attention", "full_attention"] * 2,
    ),
}
#: draft builder -> the target layers it keeps
DRAFTS = {
    "skip_middle(1, 1)": (lambda lm: skip_middle_draft(lm, 1, 1), [0, 3]),
    "skip_middle(0, 2)": (lambda lm: skip_middle_draft(lm, keep_first=0, keep_last=2), [2, 3]),
    "truncated(2)": (lambda lm: truncated_draft(lm, 2), [0, 1]),
    "layers(1, 3)": (lambda lm: draft_from_layers(lm, [1, 3]), [1, 3]),
}
CONTEXTS = [(0, 5), (0, 5, 7, 3), (0, 5, 7, 3, 9, 4, 11, 6, 8, 3), (0, 4, 4, 4, 10, 6, 5, 9)]


def _tokenizer() -> PreTrainedTokenizerFast:
    words = ["<s>", "</s>", "<pad>"] + [f"w{i}" for i in range(VOCAB - 3)]
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="w0"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<s>", eos_token="</s>", pad_token="<pad>"
    )


def _target(arch: str) -> CachedCausalLM:
    torch.manual_seed(0)
    config = ARCHS[arch]()
    model = tf.AutoModelForCausalLM.from_config(config, attn_implementation="sdpa")
    return CachedCausalLM(model.eval(), _tokenizer())


def _fresh_logprobs(model, contexts) -> list[torch.Tensor]:
    with torch.inference_mode():
        return [
            torch.log_softmax(model(torch.tensor([c]), use_cache=False).logits[0, -1], -1)
            for c in contexts
        ]


def _layer_skipped_reference(target: CachedCausalLM, keep: list[int]):
    """The target with the other layers deleted from a deep copy (independent of the draft code)."""
    ref = copy.deepcopy(target.model)
    ref.model.layers = torch.nn.ModuleList([ref.model.layers[i] for i in keep])
    ref.config.num_hidden_layers = len(keep)
    if getattr(ref.config, "layer_types", None) is not None:
        ref.config.layer_types = [ref.config.layer_types[i] for i in keep]
    return ref


@pytest.mark.parametrize("arch", sorted(ARCHS))
@pytest.mark.parametrize("kind", sorted(DRAFTS))
def test_draft_is_the_layer_skipped_model_sharing_the_targets_weights(arch, kind):
    target = _target(arch)
    build, keep = DRAFTS[kind]
    draft = build(target)
    assert draft.model.config.num_hidden_layers == len(keep)
    if arch == "gemma3-window":
        types = target.model.config.layer_types
        assert draft.model.config.layer_types == [types[i] for i in keep]
    for j, i in enumerate(keep):  # shared tensors, not copies
        for (name, p), (_, q) in zip(
            draft.model.model.layers[j].named_parameters(),
            target.model.model.layers[i].named_parameters(),
            strict=True,
        ):
            assert p.data_ptr() == q.data_ptr() and p.shape == q.shape, name
    emb = draft.model.model.embed_tokens.weight, target.model.model.embed_tokens.weight
    assert emb[0].data_ptr() == emb[1].data_ptr()
    assert draft.vocab_size == target.vocab_size
    assert draft.eos_token_ids == target.eos_token_ids

    got = run(_gather(draft, CONTEXTS))  # all contexts in one coalesced, cached call
    want = _fresh_logprobs(_layer_skipped_reference(target, keep), CONTEXTS)
    full = _fresh_logprobs(target.model, CONTEXTS)
    for g, w, f in zip(got, want, full):
        torch.testing.assert_close(g, w, atol=TOL, rtol=0)
        assert float((w - f).abs().max()) > 100 * TOL  # a real skip: not the target itself


async def _gather(lm, contexts):
    return await asyncio.gather(*(lm.next_token_logprobs(c) for c in contexts))


def _target_law(model, prompt: tuple[int, ...], max_tokens: int, eos: int) -> dict[tuple, float]:
    """{continuation: p(y|x)} by brute force over fresh forwards (EOS-terminated or cut off)."""
    out: dict[tuple, float] = {}

    def visit(seq: tuple, log_p: float) -> None:
        (lp,) = _fresh_logprobs(model, [prompt + seq])
        for v in range(VOCAB):
            s, p = seq + (v,), log_p + float(lp[v])
            if v == eos or len(s) == max_tokens:
                out[s] = math.exp(p)
            else:
                visit(s, p)

    visit((), 0.0)
    return out


@pytest.mark.parametrize("k", [1, 2])
def test_smc_sd_with_a_skip_middle_draft_is_exact(k):
    target = _target("gemma3-window")
    draft = skip_middle_draft(target, 1, 1)
    prompt, max_tokens = (0, 5, 7, 3), 2
    truth = _target_law(target.model, prompt, max_tokens, eos=1)
    assert sum(truth.values()) == pytest.approx(1.0, abs=1e-5)
    model = SpeculativeDecoding(target, draft, list(prompt), k=k, max_tokens=max_tokens)
    exact = run(enumerate_exact(model))
    assert abs(exact.log_ml) < TOL  # Z = 1: the weights p/q are exact
    posterior = {}
    for particle, w in zip(exact.particles, exact.log_weights):
        key = tuple(particle.context.generated)
        posterior[key] = posterior.get(key, 0.0) + math.exp(w - exact.log_ml)
    assert set(posterior) == set(truth)
    assert max(abs(posterior[y] - truth[y]) for y in truth) < TOL


def test_bad_input():
    target = _target("llama")
    with pytest.raises(ValueError, match=r"keep_first \+ keep_last must lie in \[1, 4\]"):
        skip_middle_draft(target, 0, 0)
    with pytest.raises(ValueError, match=r"keep_first \+ keep_last must lie in \[1, 4\]"):
        skip_middle_draft(target, 3, 2)
    with pytest.raises(ValueError, match="keep_first must be a non-negative integer"):
        skip_middle_draft(target, -1, 2)
    with pytest.raises(TypeError, match="keep_last must be a non-negative integer"):
        skip_middle_draft(target, 1, 1.5)
    with pytest.raises(ValueError, match=r"layers must be increasing indices in \[0, 3\]"):
        draft_from_layers(target, [2, 1])
    with pytest.raises(ValueError, match=r"layers must be increasing indices in \[0, 3\]"):
        draft_from_layers(target, [0, 4])
    with pytest.raises(ValueError, match="layers must be a non-empty list of integers"):
        draft_from_layers(target, [])
    with pytest.raises(TypeError, match="layers must be a sequence of layer indices"):
        draft_from_layers(target, "01")
    with pytest.raises(ValueError, match=r"n_layers must lie in \[1, 4\]"):
        truncated_draft(target, 5)
    with pytest.raises(TypeError, match="lm must be a CachedCausalLM, got FunctionLM"):
        skip_middle_draft(FunctionLM(["a", "."], 1, lambda c: [0.0, 0.0]), 1, 1)
