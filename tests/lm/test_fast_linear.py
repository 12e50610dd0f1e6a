"""The CPU fast path of the linear layers (``weights=``): its arithmetic, its keyword, its faithfulness.

Kernel tests use small random layers (no model); the ``slow`` ones use the embedded
SmolLM2 through ``CachedCausalLM.default()`` (``weights="auto"``: float16 weights on
the CPU) beside ``CachedCausalLM.default(weights="fp32")``.
"""

from __future__ import annotations

import pytest
import torch

from llamppl.lm.hf.batch_plan import GEMM_ROW_BLOCK, FixedCalls, PaddedCalls
from llamppl.lm.hf.cached_causal_lm import CachedCausalLM
from llamppl.lm.hf.fast_linear import (
    FP16GatedMLP,
    FP16Linear,
    PackedFP16,
    accelerate_linears,
    fp16_gemm_supported,
    k_blocks,
    linear_rows,
)
from llamppl.lm.hf.load import check_weights

needs_fbgemm = pytest.mark.skipif(not fp16_gemm_supported(), reason="torch build without FBGEMM")
FP32 = torch.float32


class GatedMLP(torch.nn.Module):
    """A LLaMA-style MLP: down(silu(gate(x)) * up(x))."""

    def __init__(self, d: int, i: int, swap: bool = False) -> None:
        super().__init__()
        self.gate_proj = torch.nn.Linear(d, i, bias=False)
        self.up_proj = torch.nn.Linear(d, i, bias=False)
        self.down_proj = torch.nn.Linear(i, d, bias=False)
        self.act_fn = torch.nn.SiLU()
        self.swap = swap  # True: act on up instead of gate (not the fused formula)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        g, u = (self.up_proj(x), self.gate_proj(x)) if self.swap else (self.gate_proj(x), None)
        u = self.up_proj(x) if u is None else u
        return self.down_proj(self.act_fn(g) * u)


def fp16_reference(x: torch.Tensor, lin: torch.nn.Linear) -> torch.Tensor:
    """x · fp16(W)ᵀ + b in float64: what FP16Linear computes, without float32 rounding."""
    w = lin.weight.detach().half().double()
    b = 0 if lin.bias is None else lin.bias.detach().double()
    return x.double() @ w.T + b


# ----------------------------------------------------------------------------- kernels
@needs_fbgemm
@pytest.mark.parametrize("bias", [False, True])
def test_fp16_linear_is_x_times_float16_weights_in_float32(bias):
    gen = torch.Generator().manual_seed(0)
    lin = torch.nn.Linear(96, 40, bias=bias)
    with torch.no_grad():
        lin.weight.copy_(torch.randn(40, 96, generator=gen))
    x = torch.randn(3, 5, 96, generator=gen)  # (B, T, K): any leading shape
    fast = FP16Linear(lin)
    with torch.inference_mode():
        y = fast(x)  # (3, 5, 40)
    ref = fp16_reference(x, lin)
    exact = x.double() @ lin.weight.detach().double().T
    assert y.shape == (3, 5, 40) and y.dtype == FP32
    # float32 sums of 96 products: |error| ≤ 96·eps32·Σ|x w| (a loose bound, never reached)
    bound = 96 * torch.finfo(FP32).eps * (x.double().abs() @ lin.weight.double().abs().T)
    assert ((y.double() - ref).abs() <= bound + 1e-7).all()
    # and it is NOT the float32 weights: the float16 rounding is visible
    assert (y.double() - exact).abs().max() > 10 * (y.double() - ref).abs().max()
    assert fast.weight is lin.weight and fast.bias is lin.bias  # parameters shared


@needs_fbgemm
def test_fp16_linear_falls_back_to_float32_with_gradients_or_other_dtypes():
    lin = torch.nn.Linear(32, 8)
    fast = FP16Linear(lin)
    x = torch.randn(4, 32, requires_grad=True)
    assert torch.equal(fast(x), lin(x))  # autograd: the float32 weights
    fast.double()  # converts the shared parameters: the packed float16 copy no longer applies
    xd = torch.randn(4, 32, dtype=torch.float64)
    with torch.no_grad():
        assert torch.equal(fast(xd), torch.nn.functional.linear(xd, lin.weight, lin.bias))


def alone_in_a_call(mod: torch.nn.Module, row: torch.Tensor, rows: int) -> torch.Tensor:
    """``mod``'s output for ``row`` run as the only real row of a ``rows``-row call."""
    x = torch.cat([row[None], row.new_zeros(rows - 1, row.shape[0])])
    return mod(x)[0]


@needs_fbgemm
def test_a_rows_output_is_the_same_in_every_call_of_a_multiple_of_six_rows():
    """FBGEMM's row rule (``fast_linear``'s docstring): with M a multiple of 6 a row has the
    bits it has alone in a 6-row call, whatever M (past the 120-row chunks) and its position;
    K-blocked weights (K = 1536 > K_BLOCK) and the fused gate/up pack included."""
    gen = torch.Generator().manual_seed(1)
    down = FP16Linear(torch.nn.Linear(1536, 576, bias=True))
    mlp = FP16GatedMLP.from_mlp(GatedMLP(64, 160))
    assert mlp is not None and len(down.packed.blocks) == len(k_blocks(1536)) > 1
    with torch.inference_mode():
        for mod, k in ((down, 1536), (mlp, 64)):
            x = torch.randn(1206, k, generator=gen)
            for m in [GEMM_ROW_BLOCK * j for j in range(1, 23)] + [240, 366, 1206]:
                y = mod(x[:m])
                for r in {0, m // 2, m - 1}:
                    assert torch.equal(y[r], alone_in_a_call(mod, x[r], GEMM_ROW_BLOCK)), (m, r)


@needs_fbgemm
def test_k_blocks_sum_each_block_from_zero_and_shrink_the_rounding_of_a_large_partial_sum():
    """Each K-block is one FBGEMM product summed from zero, added in order; with a large term
    first (a "massive activation"), the blocked sum rounds less than one float32 chain."""
    assert k_blocks(576) == [(0, 576)] and k_blocks(768) == [(0, 768)]
    assert k_blocks(1536) == [(0, 768), (768, 1536)]
    assert k_blocks(1000, 384) == [(0, 334), (334, 668), (668, 1000)]
    gen = torch.Generator().manual_seed(3)
    w = torch.randn(576, 1536, generator=gen) * 0.05
    w[:, 0] = 0.7
    x = torch.randn(60, 1536, generator=gen)
    x[:, 0] = 1000.0  # every output starts its sum near 700: ulp 6e-5 from then on
    packed = PackedFP16(w)
    with torch.inference_mode():
        y = packed(x)
        parts = [
            torch.ops.quantized.linear_dynamic_fp16(
                x[:, a:b].contiguous(),
                torch.ops.quantized.linear_prepack_fp16(w[:, a:b].contiguous(), None),
            )
            for a, b in k_blocks(1536)
        ]
        chain = torch.ops.quantized.linear_dynamic_fp16(
            x, torch.ops.quantized.linear_prepack_fp16(w, None)
        )
    assert torch.equal(y, parts[0] + parts[1])
    exact = x.double() @ w.half().double().T
    blocked_err = (y.double() - exact).abs().mean()
    chain_err = (chain.double() - exact).abs().mean()
    # the large term's block rounds 767 terms at its scale, the chain 1535: a random walk's
    # error is sqrt(767 / 1535) = 0.71 of the chain's (the mean over 34,560 outputs is sharp)
    assert blocked_err < 0.85 * chain_err


@needs_fbgemm
def test_linear_rows_pads_fbgemm_calls_and_fixes_other_kernels_calls():
    fast = torch.nn.Sequential(torch.nn.Embedding(10, 8), FP16Linear(torch.nn.Linear(8, 8)))
    assert linear_rows(fast) == PaddedCalls(GEMM_ROW_BLOCK)
    assert linear_rows(torch.nn.Sequential(torch.nn.Linear(8, 8))) == FixedCalls()
    fused = FP16GatedMLP.from_mlp(GatedMLP(8, 16))
    assert linear_rows(torch.nn.Sequential(fused)) == PaddedCalls(GEMM_ROW_BLOCK)


@needs_fbgemm
def test_fused_gated_mlp_equals_its_float16_linears():
    gen = torch.Generator().manual_seed(2)
    mlp = GatedMLP(64, 160)
    for p in mlp.parameters():
        p.data.copy_(torch.randn(p.shape, generator=gen) * 0.2)
    fused = FP16GatedMLP.from_mlp(mlp)
    x = torch.randn(7, 64, generator=gen)
    with torch.inference_mode():
        g, u = fp16_reference(x, mlp.gate_proj), fp16_reference(x, mlp.up_proj)
        h = torch.nn.functional.silu(g) * u
        ref = h @ mlp.down_proj.weight.detach().half().double().T
        got = fused(x)
    assert (got.double() - ref).abs().max() <= 1e-4 * ref.abs().max()
    assert set(fused.state_dict()) == set(mlp.state_dict())
    assert FP16GatedMLP.from_mlp(GatedMLP(64, 160, swap=True)) is None  # another formula


@needs_fbgemm
def test_accelerate_linears_keeps_the_state_dict_and_the_tied_head():
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=50, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True,
    )  # fmt: skip
    torch.manual_seed(0)
    model = LlamaForCausalLM(config).eval()
    keys = list(model.state_dict())
    ids = torch.tensor([[1, 5, 9, 3]])
    with torch.inference_mode():
        before = model(ids).logits
    assert accelerate_linears(model, "fp16") == 2 * 7 + 1
    assert list(model.state_dict()) == keys
    assert isinstance(model.lm_head, FP16Linear)
    assert model.lm_head.weight is model.model.embed_tokens.weight
    assert all(isinstance(layer.mlp, FP16GatedMLP) for layer in model.model.layers)
    with torch.inference_mode():
        after = model(ids).logits
    assert 0 < (after - before).abs().max() < 1e-2  # float16 rounding of the weights, no more
    with pytest.raises(ValueError, match="weights='int4' is not one of 'fp32', 'fp16'"):
        accelerate_linears(model, "int4")
    with pytest.raises(ValueError, match="needs a float32 model on the CPU"):
        accelerate_linears(LlamaForCausalLM(config).to(torch.bfloat16), "fp16")


@needs_fbgemm
def test_weights_beyond_float16_range_keep_their_float32_layer():
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 8))
    with torch.no_grad():
        model[1].weight[0, 0] = 1e5  # float16 would saturate it to 65504
    assert accelerate_linears(model, "fp16") == 1
    assert isinstance(model[0], FP16Linear) and type(model[1]) is torch.nn.Linear


# ----------------------------------------------------------------------------- the keyword
def test_check_weights_resolves_auto_per_device_and_dtype():
    cpu, other = torch.device("cpu"), torch.device("meta")  # meta: any non-CPU device
    auto_cpu = "fp16" if fp16_gemm_supported() else "fp32"
    assert check_weights("auto", None, FP32) == auto_cpu
    assert check_weights("auto", cpu, FP32) == auto_cpu
    assert check_weights("auto", other, FP32) == "fp32"  # GPU: the default stays as it was
    assert check_weights("auto", cpu, torch.bfloat16) == "fp32"
    assert check_weights("fp32", other, torch.float16) == "fp32"
    with pytest.raises(ValueError, match=r"weights='fp16' runs a float32 model on the CPU"):
        check_weights("fp16", other, FP32)
    with pytest.raises(ValueError, match=r"got dtype=torch.bfloat16"):
        check_weights("fp16", cpu, torch.bfloat16)


@pytest.mark.parametrize("bad", ["bf16", "FP16", "", None, 16])
def test_default_refuses_an_unknown_weights_value(bad):
    with pytest.raises(ValueError, match=r"weights=.* is not one of 'auto', 'fp32', 'fp16'"):
        CachedCausalLM.default(weights=bad)


# ----------------------------------------------------------------------------- the embedded model
@pytest.fixture(scope="module")
def fp32_lm() -> CachedCausalLM:
    return CachedCausalLM.default(weights="fp32")


PROMPTS = ["The Fed says", "Once upon a time", "My favorite physicist is probably"]


def _serve(lm: CachedCausalLM, batches: list[list[tuple[int, ...]]]) -> list[torch.Tensor]:
    out = []
    for contexts in batches:
        out += lm.batch_next_token_logprobs(contexts)
    return out


def _batches(lm: CachedCausalLM) -> list[list[tuple[int, ...]]]:
    """Every prefix of each prompt plus a continuation, then a branching step over them."""
    texts = [lm.encode(p + " and so on, for a while, until the end of the day.") for p in PROMPTS]
    prefixes = [tuple(t[:k]) for t in texts for k in range(1, len(t) + 1)]
    step = [tuple(t) + (tok,) for t in texts for tok in (11, 4109)]
    return [prefixes, step, [c + (30,) for c in step[:3]]]


@pytest.mark.slow
@needs_fbgemm
def test_default_on_cpu_is_fp16_and_keeps_fp32_one_keyword_away(smollm, make_lm, fp32_lm):
    assert isinstance(smollm.model.get_output_embeddings(), FP16Linear)
    assert isinstance(smollm.model.model.layers[0].mlp, FP16GatedMLP)
    assert type(fp32_lm.model.get_output_embeddings()) is torch.nn.Linear
    emb = smollm.model.model.embed_tokens.weight, fp32_lm.model.model.embed_tokens.weight
    assert emb[0] is emb[1]  # one set of float32 tensors per process
    assert make_lm().verify_exact() <= 1e-3  # cached == fresh at the float32 tolerance


@pytest.mark.slow
@needs_fbgemm
def test_default_forward_is_faithful_with_the_same_work(make_lm, fp32_lm):
    """Mean KL(fp32 ‖ default) per token ≤ 0.01 nats; identical trie and work counts."""
    fast = make_lm()
    slow = CachedCausalLM(fp32_lm.model, fp32_lm.tokenizer, verify=False)
    batches = _batches(fast)
    got, want = _serve(fast, batches), _serve(slow, batches)
    kl = torch.stack([(w.exp() * (w - g)).sum() for g, w in zip(got, want)])  # (n,)
    assert len(kl) == sum(map(len, batches)) > 60 and float(kl.mean()) <= 0.01
    assert float(kl.mean()) > 0  # the float16 weights do change the numbers a little
    assert fast.stats == slow.stats
    assert len(fast.trie) == len(slow.trie)


def test_weights_keyword_reaches_from_pretrained(tmp_path):
    with pytest.raises(ValueError, match=r"weights='fp8' is not one of"):
        CachedCausalLM.from_pretrained(tmp_path, weights="fp8")
