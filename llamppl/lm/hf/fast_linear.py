"""Faster CPU linear layers: float16 weights, float32 activations, float32 sums.

A decode step of a small model on a CPU reads every weight from memory once per
forward; at a few rows the linear layers are bound by the bytes they read, not by
arithmetic. :func:`accelerate_linears` swaps each ``torch.nn.Linear`` of a
float32 model (decoder and output head) for an :class:`FP16Linear`: the same
module with the same ``weight``/``bias`` parameters, whose forward reads a
float16 copy of the weight packed once for FBGEMM
(``torch.ops.quantized.linear_prepack_fp16`` / ``linear_dynamic_fp16``), half
the bytes of float32. A gated MLP's gate and up projections become one packed
matrix (:class:`FP16GatedMLP`), one call instead of two::

    from llamppl.lm.hf.fast_linear import accelerate_linears
    accelerate_linears(hf_model, "fp16")     # in place; returns the number of layers swapped

Arithmetic. With ``W16 = fp16(W)`` (round to nearest, relative error ≤ 2⁻¹¹)
each layer computes ``y = x · W16ᵀ + b`` with ``x``, the products, the sums and
``y`` in float32 — the float32 model with its weights rounded once. Nothing
else changes (norms, rotary embeddings, attention, the K/V cache, the head's
log-softmax stay float32), and since the weights are fixed and the activations
are never rounded, the cached forward still equals a fresh forward to float32
rounding (:func:`llamppl.lm.hf.exactness.verify_exact` at its float32 tolerance).
On the embedded SmolLM2-135M the mean KL divergence per token from the
float32 model is about 2e-6 nats; decode steps are about 2.4× faster at one row,
2.1× at 9 and 1.2× at 64, where float32 multiply-adds, not bytes, bound the
products (``benchmarks/reports/forward.md``). Kernels that also round the
activations (bfloat16 oneDNN, ``torch._weight_int4pack_mm_for_cpu``) are faster at
9–64 rows and close in KL, but a rounding boundary turns float32 noise into
bfloat16 steps: cached log-probs then differ from a fresh forward by ~0.25 and
the exactness probe refuses them.

**Sums in K-blocks.** FBGEMM sums an output's ``K`` products in ONE float32 chain
(its micro-kernels accumulate into the output register across the whole of ``K``).
Once a large partial sum is in the chain every later addition rounds at its scale:
SmolLM2's third layer builds a ~715 "massive activation" in its MLP down-projection
(``K = 1536``), whose sum then carries 1.2e-3 of rounding error (MKL's float32 GEMM,
which sums blocks of a few hundred products from zero: 5e-5); the error stays in the
residual stream, and once later layers cancel the activation it moves the far tail of
the log-probs — two forwards of the same context (cached and fresh) then differed by up
to 1.8e-4 at tokens of log p ≈ −28. So a weight wider than :data:`K_BLOCK` is packed in
:func:`k_blocks`, each block's product summed from zero by its own FBGEMM call and the
blocks' partial products added in order (:class:`PackedFP16`). With 768 only the
down-projection is cut (in two): the linear layers of a decode step cost 1.06× the
unblocked ones at 1 and 18 rows and 1.12× at 66, where blocks of 384 (every layer cut)
cost 1.5×; cached against fresh on three random context trees with FBGEMM, ATen and MKL
forced to AVX2, 5.6e-5 to 6.7e-5 (unblocked: 7.4e-5 to 1.8e-4; float32 weights on MKL:
up to 1.5e-4). The far tail's error is float32 rounding of large logits either way, which
is why the tests bound it per token relative to ``|log p|`` beyond 20 nats.

**Row invariance** (what :mod:`llamppl.lm.hf.batch_invariant` builds on). FBGEMM's
``cblas_gemm_compute`` (``src/FbgemmFPCommon.cc``, ``include/fbgemm/FbgemmFPCommon.h``)
cuts the ``M`` rows into chunks of ``mb_max = 120`` and each chunk into micro-kernel
calls of 1-14 rows after a per-ISA partition table; threads split the output
*columns*, never the rows or ``K``. Every micro-kernel computes an output element as
one fused multiply-add chain over ``K`` in order — except the AVX2 kernels for one and
two rows (``gemmkernel_1x2_Avx2``, ``gemmkernel_2x2_Avx2``, also used by the
``avx512_256`` ISA), which keep four and two interleaved accumulators and add them at
the end. So a row's bits depend on the other rows only when a chunk's partition uses
those two kernels; with ``M`` a multiple of :data:`GEMM_ROW_BLOCK` = 6 none does, on
any x86 ISA (``partition_avx2[6j]`` is ``j`` calls of the 6-row kernel, and the
AVX-512 table uses 1- and 2-row kernels only for chunks of 1 and 2 rows), so every
row of such a call has the bits it has alone in a 6-row call, whatever the ``M``,
the row's position or the thread count (:func:`linear_rows`; checked for ``M`` up to
3000 on AVX-512 and with ``FBGEMM_ENABLE_INSTRUCTIONS=AVX2``/``AVX512_256``,
``tests/lm/test_fast_linear.py``). MKL's float32 GEMM (``weights="fp32"``) promises
nothing of the kind: its row classes change with the ISA and the thread count (measured:
``{1}, {2-15}, {16+}`` at one thread, ``{1}, {2, 3}, {4+}`` at two on AVX-512;
``{1}, {2}, {3}, {4-55}, {56+}`` forced to AVX2; at two threads some shapes even
differ for 60-192 rows only), so a forward on such layers runs every call on the same
number of rows instead (:class:`~llamppl.lm.hf.batch_plan.FixedCalls`).

Weights beyond float16's range (|w| > 65504) keep their float32 layer.

The float32 ``weight`` stays on the module (``state_dict``, parameter sharing,
tied embeddings and layer-skipping drafts see the model as before); a forward
on another device or dtype, or with gradients, falls back to ``F.linear`` with it.
The packed copy is made once: load new weights by building the model again.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .batch_plan import GEMM_ROW_BLOCK, FixedCalls, PaddedCalls, RowCalls

__all__ = [
    "K_BLOCK",
    "WEIGHT_FORMATS",
    "FP16GatedMLP",
    "FP16Linear",
    "PackedFP16",
    "accelerate_linears",
    "fp16_gemm_supported",
    "k_blocks",
    "linear_rows",
]

WEIGHT_FORMATS = ("fp32", "fp16")
#: at most this many products are summed in one FBGEMM float32 chain (:func:`k_blocks`): on
#: SmolLM2 only the MLP down-projection (K = 1536) is cut, in two
K_BLOCK = 768


def fp16_gemm_supported() -> bool:
    """Whether this torch build has FBGEMM's float16-weight GEMM (x86-64 builds do)."""
    return "fbgemm" in torch.backends.quantized.supported_engines


class FP16Linear(torch.nn.Linear):
    """``y = x · fp16(W)ᵀ + b`` in float32 on the CPU (FBGEMM); otherwise ``torch.nn.Linear``.

    Built from an existing ``linear`` whose ``weight`` and ``bias`` parameters it
    shares (no copy); the float16 copy is packed at construction, in K-blocks
    (:func:`k_blocks`).
    """

    def __init__(self, linear: torch.nn.Linear) -> None:
        torch.nn.Module.__init__(self)
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.weight = linear.weight
        self.bias = linear.bias
        self.packed = PackedFP16(self.weight.detach())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not _fast(x, self.weight):
            return F.linear(x, self.weight, self.bias)
        lead = x.shape[:-1]
        y = self.packed(x.reshape(-1, self.in_features))
        if self.bias is not None:
            y = y + self.bias.detach().float()
        return y.reshape(*lead, self.out_features)  # (..., out_features) float32

    def extra_repr(self) -> str:
        return super().extra_repr() + ", float16 weights packed for FBGEMM"


def k_blocks(k: int, k_block: int = K_BLOCK) -> list[tuple[int, int]]:
    """The column ranges ``[a, b)`` a ``K``-wide weight is packed in: ``ceil(K / k_block)``
    near-equal blocks (one block when ``K <= k_block``)."""
    n = -(-k // k_block)
    step = -(-k // n)
    return [(a, min(k, a + step)) for a in range(0, k, step)]


class PackedFP16:
    """A float32 ``(N, K)`` weight rounded to float16 and packed for FBGEMM, K-block by K-block.

    ``packed(x)`` is ``x · fp16(W)ᵀ`` ``(M, N)`` float32 for ``x`` ``(M, K)`` float32: one
    FBGEMM call per K-block (:func:`k_blocks`; ``k_block >= K``: one chain, as FBGEMM alone
    sums), each summing its products from zero, and the
    blocks' partial products added in order. FBGEMM sums an output's ``K`` products in one
    float32 chain; once a large partial sum is in it, every later addition rounds at that
    scale, so a block that starts from zero keeps the error of the small terms small.
    """

    def __init__(self, weight: torch.Tensor, k_block: int = K_BLOCK) -> None:
        w = weight.float()
        self.blocks = [
            (a, b, torch.ops.quantized.linear_prepack_fp16(w[:, a:b].contiguous(), None))
            for a, b in k_blocks(w.shape[1], k_block)
        ]

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if len(self.blocks) == 1:
            return torch.ops.quantized.linear_dynamic_fp16(x, self.blocks[0][2])
        y = None
        for a, b, packed in self.blocks:
            part = torch.ops.quantized.linear_dynamic_fp16(x[:, a:b].contiguous(), packed)
            y = part if y is None else y.add_(part)
        return y


def _fits_fp16(*weights: torch.Tensor) -> bool:
    """Whether every weight is finite within float16's range (else rounding would saturate)."""
    big = torch.finfo(torch.float16).max
    return all(bool(w.detach().abs().max() <= big) for w in weights)


def _fast(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether a forward on ``x`` may use the packed float16 weights (else ``F.linear``)."""
    return (
        x.device.type == "cpu"
        and x.dtype == torch.float32
        and weight.device.type == "cpu"
        and not (torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad))
    )


class FP16GatedMLP(torch.nn.Module):
    """A gated MLP ``down(act(gate(x)) · up(x))`` whose gate and up projections are ONE FBGEMM call.

    ``[gate; up]`` (``2I × D``) is packed as one float16 matrix, so a forward
    reads it in one pass (one call instead of two per layer); ``down`` is an
    :class:`FP16Linear`. The numbers are those of :class:`FP16Linear` layers: each
    output element is the same float32 dot product with the float16 weight row.
    ``gate_proj``, ``up_proj`` and ``act_fn`` stay as they were (same
    ``state_dict``; the fallback off the CPU uses them). Build with
    :meth:`from_mlp`, which returns ``None`` unless ``mlp`` computes exactly that
    (checked on a random input).
    """

    def __init__(self, mlp: torch.nn.Module) -> None:
        super().__init__()
        self.gate_proj, self.up_proj, self.act_fn = mlp.gate_proj, mlp.up_proj, mlp.act_fn
        down = mlp.down_proj
        self.down_proj = down if isinstance(down, FP16Linear) else FP16Linear(down)
        self.intermediate = self.gate_proj.out_features
        both = torch.cat([self.gate_proj.weight.detach(), self.up_proj.weight.detach()])  # (2I, D)
        self.packed = PackedFP16(both)

    @classmethod
    def from_mlp(cls, mlp: torch.nn.Module) -> FP16GatedMLP | None:
        parts = [getattr(mlp, n, None) for n in ("gate_proj", "up_proj", "down_proj")]
        if not all(type(p) is torch.nn.Linear and p.bias is None for p in parts):
            return None
        gate, up, down = parts
        if not callable(getattr(mlp, "act_fn", None)) or gate.weight.shape != up.weight.shape:
            return None
        if not _fits_fp16(gate.weight, up.weight, down.weight):
            return None
        gen = torch.Generator().manual_seed(0)
        x = torch.randn(2, gate.in_features, generator=gen, dtype=gate.weight.dtype)  # (2, D)
        try:
            with torch.no_grad():
                same = torch.allclose(mlp(x), down(mlp.act_fn(gate(x)) * up(x)), 1e-5, 1e-6)
        except (TypeError, RuntimeError, ValueError):  # a forward that wants more than x
            return None
        return cls(mlp) if same else None  # another MLP: its linears are swapped one by one

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not _fast(x, self.gate_proj.weight):
            return self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x))
        lead, inter = x.shape[:-1], self.intermediate
        both = self.packed(x.reshape(-1, x.shape[-1]))  # (n, 2I)
        h = self.act_fn(both[:, :inter]) * both[:, inter:]  # (n, I)
        return self.down_proj(h).reshape(*lead, -1)


def accelerate_linears(model: torch.nn.Module, weights: str) -> int:
    """Swap ``model``'s linear layers (in place) for the ``weights`` format; returns how many.

    ``weights`` is one of :data:`WEIGHT_FORMATS`: ``"fp32"`` leaves the model
    alone; ``"fp16"`` swaps every gated MLP for an :class:`FP16GatedMLP` and every
    other ``torch.nn.Linear`` (attention projections, the output head, whose tie
    to the input embeddings stays) for an :class:`FP16Linear`. The
    model must be float32 on the CPU for ``"fp16"``. FBGEMM packs each weight in
    about 11 ns of CPU time (measured on 1536 × 576 matrices): ~1.5 s for the 135M
    weights of SmolLM2.
    """
    if weights not in WEIGHT_FORMATS:
        raise ValueError(
            f"weights={weights!r} is not one of {', '.join(map(repr, WEIGHT_FORMATS))}"
        )
    if weights == "fp32":
        return 0
    param = next(model.parameters())
    if param.device.type != "cpu" or param.dtype != torch.float32:
        raise ValueError(
            f"weights='fp16' needs a float32 model on the CPU, got {param.dtype} on {param.device}"
        )
    if not fp16_gemm_supported():
        raise ValueError("weights='fp16' needs FBGEMM, which this torch build lacks; use 'fp32'")
    count = 0
    with torch.no_grad():
        for parent in list(model.modules()):
            for name, child in list(parent.named_children()):
                fused = FP16GatedMLP.from_mlp(child)
                if fused is not None:
                    setattr(parent, name, fused)
                    count += 3
        for parent in list(model.modules()):
            if isinstance(parent, FP16GatedMLP):
                continue  # its gate and up are read through the fused pack
            for name, child in list(parent.named_children()):
                if type(child) is torch.nn.Linear and _fits_fp16(child.weight):
                    setattr(parent, name, FP16Linear(child))  # the head too (tie kept)
                    count += 1
    return count


def linear_rows(model: torch.nn.Module) -> RowCalls:
    """How a batch-invariant forward must feed ``model``'s matrix products their rows.

    :class:`~llamppl.lm.hf.batch_plan.PaddedCalls` (one call, rows padded to a multiple of
    :data:`~llamppl.lm.hf.batch_plan.GEMM_ROW_BLOCK`) when every weight matrix is read by
    FBGEMM's float16 GEMM on the CPU (:class:`FP16Linear`, :class:`FP16GatedMLP`; embedding
    tables are lookups): the module docstring derives its row invariance from FBGEMM's
    kernels. Otherwise (float32 ``nn.Linear`` on MKL, other dtypes, other devices, other
    matrix modules) :class:`~llamppl.lm.hf.batch_plan.FixedCalls`: every call of the forward
    gets the same number of rows, so no kernel can choose another blocking for it.
    """
    for parent in model.modules():
        if isinstance(parent, FP16GatedMLP):
            continue  # its gate and up projections are read through the fused pack
        for child in parent.children():
            if isinstance(child, (FP16Linear, FP16GatedMLP, torch.nn.Embedding)):
                continue
            own = [p for p in child.parameters(recurse=False) if p.dim() >= 2]
            if own:
                return FixedCalls()
    on_cpu = all(p.device.type == "cpu" and p.dtype == torch.float32 for p in model.parameters())
    return PaddedCalls(GEMM_ROW_BLOCK) if on_cpu else FixedCalls()
