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
The kernel treats every row alone: a row's output is bitwise the same whatever
other rows share the call (``benchmarks/bench_forward.py`` checks it for 1–64
rows). On the embedded SmolLM2-135M the mean KL divergence per token from the
float32 model is about 2e-6 nats; decode steps are about 2.4× faster at one row,
2.1× at 9 and 1.2× at 64, where float32 multiply-adds, not bytes, bound the
products (``benchmarks/reports/forward.md``). Kernels that also round the
activations (bfloat16 oneDNN, ``torch._weight_int4pack_mm_for_cpu``) are faster at
9–64 rows and close in KL, but a rounding boundary turns float32 noise into
bfloat16 steps: cached log-probs then differ from a fresh forward by ~0.25 and
the exactness probe refuses them.

Weights beyond float16's range (|w| > 65504) keep their float32 layer.

The float32 ``weight`` stays on the module (``state_dict``, parameter sharing,
tied embeddings and layer-skipping drafts see the model as before); a forward
on another device or dtype, or with gradients, falls back to ``F.linear`` with it.
The packed copy is made once: load new weights by building the model again.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

__all__ = [
    "WEIGHT_FORMATS",
    "FP16GatedMLP",
    "FP16Linear",
    "accelerate_linears",
    "fp16_gemm_supported",
]

WEIGHT_FORMATS = ("fp32", "fp16")


def fp16_gemm_supported() -> bool:
    """Whether this torch build has FBGEMM's float16-weight GEMM (x86-64 builds do)."""
    return "fbgemm" in torch.backends.quantized.supported_engines


class FP16Linear(torch.nn.Linear):
    """``y = x · fp16(W)ᵀ + b`` in float32 on the CPU (FBGEMM); otherwise ``torch.nn.Linear``.

    Built from an existing ``linear`` whose ``weight`` and ``bias`` parameters it
    shares (no copy); the float16 copy is packed at construction.
    """

    def __init__(self, linear: torch.nn.Linear) -> None:
        torch.nn.Module.__init__(self)
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.weight = linear.weight
        self.bias = linear.bias
        bias = None if self.bias is None else self.bias.detach().float()
        self.packed = torch.ops.quantized.linear_prepack_fp16(self.weight.detach().float(), bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not _fast(x, self.weight):
            return F.linear(x, self.weight, self.bias)
        lead = x.shape[:-1]
        y = torch.ops.quantized.linear_dynamic_fp16(x.reshape(-1, self.in_features), self.packed)
        return y.reshape(*lead, self.out_features)  # (..., out_features) float32

    def extra_repr(self) -> str:
        return super().extra_repr() + ", float16 weights packed for FBGEMM"


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
        self.packed = torch.ops.quantized.linear_prepack_fp16(both.float(), None)

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
        both = torch.ops.quantized.linear_dynamic_fp16(x.reshape(-1, x.shape[-1]), self.packed)
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
