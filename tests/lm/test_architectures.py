"""Architecture matrix: cached log-probs equal a fresh full forward, or the model is refused.

Tiny random-weight models built from ``transformers`` config classes
(``tiny_models.py``: no download, hidden 64, 2–4 layers, a 96-token word-level
vocabulary, windows of 8); the contexts (a branching tree, 11–40 tokens) are
longer than a window.
Each context is requested on its own, then all of them together, then one token
longer (rows sharing a cached prefix), then again after eviction; each is compared
with ``model(ids).logits`` of a fresh forward.
"""

from __future__ import annotations

import sys

import pytest
import torch
from tiny_models import (
    ATTN,
    CONFIGS,
    LLAMPPL_DIR,
    REFUSED,
    SHARE_PREFIX,
    SHARE_PREFIX_BY_RELEASE,
    TOL,
    VOCAB,
    context_tree,
    max_diff,
    tiny_model,
    word_tokenizer,
)

from llamppl import CachedCausalLM
from llamppl.lm.hf.cached_causal_lm import rounding_tolerance


@pytest.fixture(scope="module")
def tokenizer():
    return word_tokenizer()


# models whose layers bypass the attention interface (Falcon, MLA) fall back to the per-row
# forward with a warning; tests/lm/test_batch_invariant_architectures.py asserts it
@pytest.mark.filterwarnings("ignore:batch_invariant=True needs every attention layer")
@pytest.mark.parametrize("attn", ATTN)
@pytest.mark.parametrize("arch", list(CONFIGS))
def test_cached_logprobs_equal_fresh_forward(tokenizer, arch, attn):
    try:
        model = tiny_model(CONFIGS[arch], attn)
    except ValueError as exc:  # transformers refuses this attention implementation here
        pytest.skip(f"{arch} with {attn}: {exc}")
    contexts = context_tree()
    lm = CachedCausalLM(model, tokenizer, batch_invariant=False)  # the per-row and prefix paths
    assert max_diff(lm, model, contexts, together=False) <= TOL
    lm.clear_cache()
    assert max_diff(lm, model, contexts, together=True) <= TOL
    # an SMC-like step: every context one token longer, all rows sharing the trunk's start
    steps = [c + (3 + i % 7,) for i, c in enumerate(contexts)]
    assert max_diff(lm, model, steps, together=True) <= TOL
    assert (lm.stats.shared_prefix_tokens > 0) == lm.share_prefix
    if arch not in SHARE_PREFIX_BY_RELEASE or attn != "sdpa":
        assert lm.share_prefix == (arch in SHARE_PREFIX and attn == "sdpa")
    small = CachedCausalLM(model, tokenizer, max_cache_tokens=48, verify=False)
    assert max_diff(small, model, contexts, together=True) <= TOL
    assert small.stats.evictions > 0


@pytest.mark.parametrize("arch", list(REFUSED))
def test_unservable_architectures_are_refused(tokenizer, arch):
    config_fn, reason = REFUSED[arch]
    model = tiny_model(config_fn, "eager")
    with pytest.raises(ValueError, match=f"cannot serve .*{reason}"):
        CachedCausalLM(model, tokenizer)


def test_probe_refuses_an_architecture_it_does_not_know(tokenizer, monkeypatch):
    """A logit transform the config tables miss is caught by the construction-time probe."""
    model = tiny_model(CONFIGS["llama"], "sdpa")
    head = model.lm_head
    original = head.forward
    monkeypatch.setattr(head, "forward", lambda x: original(x) * 1.7)  # the model's own path only
    lm = CachedCausalLM(model, tokenizer, verify=False)
    monkeypatch.setattr(head, "forward", original)
    lm._head = torch.nn.Linear(64, VOCAB, bias=False)  # a wrong head, as if a transform were missed
    with pytest.raises(ValueError, match="differ from a fresh forward"):
        lm.verify_exact()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("arch", ["llama", "gemma2", "mistral-window", "opt"])
def test_low_precision_matches_fresh_forward_in_the_same_dtype(tokenizer, arch, dtype):
    """bf16/fp16 weights and K/V; log-probs come back float32.

    The tolerance is :func:`~llamppl.lm.hf.cached_causal_lm.rounding_tolerance`:
    rounding of L layers and the head, accumulated like a random walk,
    2·sqrt(L + 1)·eps·(1 + M) for logits of magnitude M (derivation in its
    docstring). Measured here: at most 0.0019 (bf16) and 0.0004 (fp16).
    """
    model = tiny_model(CONFIGS[arch], "eager", dtype=dtype)
    lm = CachedCausalLM(model, tokenizer)
    contexts = context_tree()
    got = lm.next_token_logprobs_batch(contexts)
    n_layers = model.config.num_hidden_layers
    for g, c in zip(got, contexts):
        assert g.dtype == torch.float32
        with torch.inference_mode():
            logits = model(input_ids=torch.tensor([c])).logits[0, -1].float()
        tol = rounding_tolerance(dtype, n_layers, float(logits.abs().max()))
        assert float((g - torch.log_softmax(logits, -1)).abs().max()) <= tol


class _TransferCounter(torch.overrides.TorchFunctionMode):
    """Counts the calls that copy between host and device (or sync): on a GPU each is a transfer."""

    NAMES = {"tensor", "as_tensor", "to", "cpu", "cuda", "item", "tolist", "numpy"}

    def __init__(self):
        super().__init__()
        self.count = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if getattr(func, "__name__", "") in self.NAMES:
            caller = sys._getframe(1).f_code.co_filename
            if caller.startswith(LLAMPPL_DIR):  # ours, not transformers' internal dtype casts
                self.count += 1
        return func(*args, **(kwargs or {}))


def test_host_device_transfers_per_step_do_not_grow_with_particles(tokenizer):
    """One SMC step = one batch of N contexts, each one token past a cached context.

    The budget (module docstring of ``cached_causal_lm``): one upload of index
    data per forward, nothing copied back (log-prob rows stay on the device).
    """
    model = tiny_model(CONFIGS["gemma2"], "eager")
    lm = CachedCausalLM(model, tokenizer)
    counts = {}
    for n in (2, 8, 32):
        lm.clear_cache()
        prompt = tuple(range(3, 20))
        lm.next_token_logprobs_batch([prompt])
        steps = [prompt + (3 + i % 90,) for i in range(n)]
        uploads = lm.stats.uploads
        with _TransferCounter() as counter:
            out = lm.next_token_logprobs_batch(steps)
        assert lm.stats.uploads - uploads == 1
        assert all(o.device == lm.device for o in out)
        counts[n] = counter.count
    # torch.tensor(...).to(device) for the indices; then three moves that are no-ops unless the
    # model is split across devices: output-row indices to the last layer's device, hidden rows
    # to the head's device, log-prob rows back to the LM's device
    assert counts[2] == counts[8] == counts[32] == 5


def test_device_map_split_model_keeps_each_layers_kv_on_its_device(tokenizer, tmp_path):
    """``from_pretrained(..., device_map=...)``: accelerate places the modules; the pool follows.

    This machine has one device, so every entry of the map is "cpu" (and
    transformers then places the model whole): the test proves that loading
    through ``device_map`` works, that the pool keeps each layer's K/V on the
    device of that layer's parameters and that results are exact. A real
    cross-device copy cannot run here; see docs/architectures.md.
    """
    model = tiny_model(CONFIGS["llama"], "sdpa")
    model.save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    device_map = {
        "model.embed_tokens": "cpu",
        "model.layers.0": "cpu",
        "model.layers.1": "cpu",
        "model.norm": "cpu",
        "model.rotary_emb": "cpu",
        "lm_head": "cpu",
    }
    lm = CachedCausalLM.from_pretrained(tmp_path, device_map=device_map)
    layer_devices = tuple(next(layer.parameters()).device for layer in lm.model.model.layers)
    assert lm._pool.layer_devices == layer_devices
    assert [k.device for k in lm._pool.k] == list(layer_devices)
    contexts = context_tree()
    assert max_diff(lm, lm.model, contexts, together=True) <= TOL
