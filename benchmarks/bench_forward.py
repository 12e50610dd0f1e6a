"""CPU forward of the embedded SmolLM2-135M: linear-layer kernels side by side (not a test).

Every candidate is the float32 model (``CachedCausalLM.default(weights="fp32")``) with
its ``torch.nn.Linear`` layers (30 decoder layers × 7, and the 49,152 × 576 head tied to
the input embeddings) swapped for another kernel; the float32 tensors are shared, only
the packed copies are new. Candidates (``--candidates``):

``fp32``   the baseline: ``torch.nn.Linear`` (MKL sgemm, weight re-packed at every call).
``fp16``   the library's ``weights="fp16"`` (:mod:`llamppl.lm.hf.fast_linear`): FBGEMM
           ``linear_dynamic_fp16``, float16 weights, float32 activations and sums, summed
           in K-blocks of at most 384 products.
``fp16-chain`` the same, each output summed in ONE FBGEMM float32 chain over all of K (the
           K-blocks' cost and accuracy are the difference).
``mkl``    MKL packed sgemm (``torch.ops.mkl._mkl_reorder_linear_weight`` /
           ``_mkl_linear``, what inductor's freezing emits): a pack per row count ``M``
           (1, 9, 64 here; 424 MB each), other ``M`` fall back to ``F.linear``.
``bf16``   oneDNN pre-packed bfloat16 GEMM (``mkldnn._reorder_linear_weight`` /
           ``_linear_pointwise``): x and W rounded to bfloat16, output bfloat16.
``q4``     ``torch._weight_int4pack_mm_for_cpu``: the GGUF's own Q4_1 blocks
           (``w = d·q + m``, 32 per block), recovered bit for bit from the fp32 copy,
           scale ``d`` and zero ``m + 8d`` in bfloat16, x in bfloat16 (the float32 path
           of this kernel is scalar: ~40× slower than fp32 here); head as ``bf16``
           (it is Q8_0 in the GGUF).
``int8``   ``torch._weight_int8pack_mm``: per-output-channel int8 weights, x in
           bfloat16 (its float32 path is scalar too); head as ``bf16``.

Measurements, all in one process:

1. **Decode step** at ``--rows`` rows (default 1, 9, 64): each row a context of
   ``--context`` tokens (a shared 15-token prompt plus random tokens), cached; a step
   asks every row's next-token log-probs after one new token, i.e. ONE forward of
   ``rows`` new tokens over the trie cache, in the per-row layout
   (``batch_invariant=False``) for every kernel. Candidates are interleaved within every
   repeat; the table prints medians of CPU time (one thread: robust to other load on
   the machine) over ``--repeats`` and the ratio to ``fp32``
   measured in the same run, with the work counts (forward calls, tokens run), which
   must be equal across candidates.
1b. **The default layout**: the same steps and a ``--prefill``-token prefill with the
   batch-invariant forward (``fp16 inv``, ``fp32 inv``) beside the per-row one: what
   batch invariance costs on this CPU.
2. **Faithfulness**: mean KL(fp32 ‖ candidate) per token over every position of
   ``PROMPTS`` each followed by 32 tokens sampled from the fp32 model (seed 0), from
   full forwards; "faithful" means ≤ 0.01 nats.
3. **Exactness probe**: ``CachedCausalLM.verify_exact`` (cached log-probs vs a fresh
   forward, float32 tolerance 1e-3) with each candidate; one that fails it cannot be
   a ``CachedCausalLM`` without ``verify=False``.
4. **Batch invariance** of each kernel: the largest |difference| of row 0's output
   computed alone vs inside batches of 2, 3, 4, 9 and 64 rows, for every linear
   shape of the model (the input rows are real hidden states), as called and as the
   batch-invariant layout calls them (``linear_rows``).

The CPU flags, ATen's capability and any ``*_INSTRUCTIONS`` / ``*_CAPABILITY`` variable
(``FBGEMM_ENABLE_INSTRUCTIONS=AVX2 ATEN_CPU_CAPABILITY=avx2 MKL_ENABLE_INSTRUCTIONS=AVX2``
runs the libraries' AVX2 code on an AVX-512 CPU) are printed and recorded.
5. **Load**: seconds to swap the linears (packing) per candidate.

``--compile`` adds ``torch.compile`` (inductor, ``freezing=True``) of the fp32 model,
in place (``module.compile()``; compiling the whole decoder hides its signature from
``CachedCausalLM``, which then refuses it), twice: every layer's MLP, then every whole
decoder layer, as ``CachedCausalLM`` calls them: seconds to construct the LM (its
architecture probe compiles) and of the first steps at each row count (recompiles for
new shapes), dynamo's counters (``unique_graphs``: graphs compiled), graph breaks and
step times after warm-up. Freezing guards every layer's weights, so each layer compiles
its own graph: the recompile limit is raised to 512 (at its default of 8 only the first
8 layers compile). Slow: minutes; ``TORCH_LOGS=recompiles`` shows why it recompiles. ``--out FILE``
appends one JSON record::

    .venv/bin/python benchmarks/bench_forward.py
    .venv/bin/python benchmarks/bench_forward.py --out benchmarks/results/forward.jsonl
"""

from __future__ import annotations

import argparse
import copy
import datetime
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _args import positive_int  # noqa: E402

PROMPTS = [
    "The Fed says",
    "Once upon a time",
    "My favorite writer is probably",
    "My favorite physicist is probably",
    "In 2024 the",
    "He said that",
    "Write a haiku about the sea.",
    "def fibonacci(n):",
]
STEP_PROMPT = "The Federal Reserve said on Tuesday that it would keep interest rates unchanged"
MKL_ROWS = (1, 9, 64)
ALL = ("fp32", "fp16", "fp16-chain", "mkl", "bf16", "q4", "int8")


# ----------------------------------------------------------------------------- kernels
class BF16Linear(torch.nn.Module):
    """oneDNN bf16 GEMM on a pre-packed bfloat16 weight; x rounded to bf16, y back to fp32."""

    def __init__(self, lin: torch.nn.Linear) -> None:
        super().__init__()
        self.weight, self.n = lin.weight, lin.out_features
        self.packed = torch.ops.mkldnn._reorder_linear_weight(lin.weight.detach().bfloat16())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x2 = x.reshape(-1, x.shape[-1]).bfloat16()  # (n, K)
        y = torch.ops.mkldnn._linear_pointwise(x2, self.packed, None, "none", [], "")
        return y.float().reshape(*x.shape[:-1], self.n)


def q4_blocks(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None:
    """Q4_1 blocks ``(q, d, m)`` with ``d·q + m == w`` bit for bit in float32, or None.

    ggml's Q4_1 sets ``m`` = block minimum (stored as float16) and ``d`` = (max - min)/15
    rounded to float16, so both are recovered from the block's extremes.
    """
    N, K = w.shape
    g = w.reshape(N, K // 32, 32)  # (N, G, 32)
    m = g.amin(-1)  # (N, G)
    d = ((g.amax(-1) - m) / 15).half().float()  # (N, G)
    safe = torch.where(d > 0, d, torch.ones_like(d))
    q = torch.round((g - m[..., None]) / safe[..., None]).clamp(0, 15) * (d[..., None] > 0)
    if not torch.equal(d[..., None] * q + m[..., None], g):
        return None
    return q.to(torch.int32).reshape(N, K), d, m


class Q4Linear(torch.nn.Module):
    """``torch._weight_int4pack_mm_for_cpu`` on the Q4_1 blocks; x and scales in bfloat16."""

    def __init__(self, lin: torch.nn.Linear, blocks) -> None:
        super().__init__()
        q, d, m = blocks
        self.weight, self.n = lin.weight, lin.out_features
        self.packed = torch._convert_weight_to_int4pack_for_cpu(q, 1)
        sz = torch.stack([d.t(), (m + 8 * d).t()], dim=-1)  # (K/32, N, 2): w = (q-8)·d + (m+8d)
        self.sz = sz.bfloat16().contiguous()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x2 = x.reshape(-1, x.shape[-1]).bfloat16()
        y = torch._weight_int4pack_mm_for_cpu(x2, self.packed, 32, self.sz)
        return y.float().reshape(*x.shape[:-1], self.n)


class Int8Linear(torch.nn.Module):
    """``torch._weight_int8pack_mm``: int8 weights with a scale per output channel; x in bf16."""

    def __init__(self, lin: torch.nn.Linear) -> None:
        super().__init__()
        w = lin.weight.detach()
        s = w.abs().amax(1).clamp_min(1e-12) / 127  # (N,)
        self.weight, self.n = lin.weight, lin.out_features
        self.q = torch.round(w / s[:, None]).to(torch.int8)
        self.s = s.bfloat16()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x2 = x.reshape(-1, x.shape[-1]).bfloat16()
        y = torch._weight_int8pack_mm(x2, self.q, self.s)
        return y.float().reshape(*x.shape[:-1], self.n)


class MKLLinear(torch.nn.Module):
    """MKL packed sgemm, one pack per row count in ``MKL_ROWS``; other row counts: ``F.linear``."""

    def __init__(self, lin: torch.nn.Linear) -> None:
        super().__init__()
        self.weight, self.n = lin.weight, lin.out_features
        w = lin.weight.detach()
        self.packs = {m: torch.ops.mkl._mkl_reorder_linear_weight(w, m) for m in MKL_ROWS}

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x2 = x.reshape(-1, x.shape[-1])
        M = x2.shape[0]
        if M in self.packs:
            y = torch.ops.mkl._mkl_linear(x2, self.packs[M], self.weight, None, M)
        else:
            y = F.linear(x2, self.weight)
        return y.reshape(*x.shape[:-1], self.n)


def build(base: torch.nn.Module, kind: str) -> torch.nn.Module:
    """A model sharing ``base``'s tensors with its linear layers swapped for ``kind``."""
    from llamppl.lm.hf.fast_linear import FP16GatedMLP, FP16Linear, PackedFP16, accelerate_linears

    shared = {id(t): t for t in (*base.parameters(), *base.buffers())}
    model = copy.deepcopy(base, memo=shared).eval()
    if kind in ("fp32", "fp16", "fp16-chain"):
        accelerate_linears(model, kind[:4])
        for mod in model.modules() if kind == "fp16-chain" else ():
            if isinstance(mod, FP16Linear):
                mod.packed = PackedFP16(mod.weight.detach(), k_block=mod.in_features)
            elif isinstance(mod, FP16GatedMLP):
                both = torch.cat([mod.gate_proj.weight.detach(), mod.up_proj.weight.detach()])
                mod.packed = PackedFP16(both, k_block=both.shape[1])
        return model
    head = model.get_output_embeddings()
    for parent in list(model.modules()):
        for name, lin in list(parent.named_children()):
            if type(lin) is not torch.nn.Linear:
                continue
            if kind == "mkl":
                new = MKLLinear(lin)
            elif kind == "q4" and lin is not head:
                blocks = q4_blocks(lin.weight.detach())
                new = Q4Linear(lin, blocks) if blocks is not None else BF16Linear(lin)
            elif kind == "int8" and lin is not head:
                new = Int8Linear(lin)
            else:
                new = BF16Linear(lin)
            setattr(parent, name, new)
    return model


# ----------------------------------------------------------------------------- measurements
def kl_per_token(models: dict, tokenizer) -> dict[str, float]:
    """Mean KL(fp32 ‖ candidate) per position over PROMPTS + 32 fp32-sampled tokens each."""
    ref_model = models["fp32"]
    gen = torch.Generator().manual_seed(0)
    seqs = []
    with torch.inference_mode():
        for p in PROMPTS:
            ids = tokenizer.encode(p)
            for _ in range(32):
                logits = ref_model(torch.tensor([ids])).logits[0, -1].float()
                probs = torch.softmax(logits, -1)
                ids.append(int(torch.multinomial(probs, 1, generator=gen)))
            seqs.append(torch.tensor([ids]))
        refs = [torch.log_softmax(ref_model(s).logits[0].float(), -1) for s in seqs]
        out = {}
        for kind, model in models.items():
            total, count = 0.0, 0
            for s, r in zip(seqs, refs):
                lp = torch.log_softmax(model(s).logits[0].float(), -1)  # (T, V)
                kl = (r.exp() * (r - lp)).sum(-1)  # (T,)
                total += float(kl.sum())
                count += kl.numel()
            out[kind] = total / count
    return out, sum(s.shape[1] for s in seqs)


def batch_invariance(models: dict, hidden: torch.Tensor) -> dict[str, tuple[float, float]]:
    """Max |row 0 alone − row 0 in a batch of n|, n in 2, 3, 4, 9, 64, over each kernel's modules:
    as called (any row count), and as the batch-invariant layout calls them (rows padded to
    the row calls of ``linear_rows``: a multiple of 6 for FBGEMM, 48-row calls otherwise).

    The modules: layer 0's q/k/v/o projections and its MLP (fused or not), and the head;
    ``hidden`` (64, D) are real hidden states.
    """
    from llamppl.lm.hf.fast_linear import linear_rows

    def padded(mod, x, rows):  # row 0's call as the layout makes it: its rows, then zero rows
        a, b = rows.calls(len(x))[0]
        return mod(torch.cat([x[a:b], x.new_zeros(rows.rows(b - a) - (b - a), x.shape[1])]))

    out = {}
    with torch.inference_mode():
        for kind, model in models.items():
            rows = linear_rows(model)
            attn, layer = model.model.layers[0].self_attn, model.model.layers[0]
            mods = [attn.q_proj, attn.k_proj, attn.v_proj, attn.o_proj, layer.mlp]
            worst, worst_padded = 0.0, 0.0
            for mod in [*mods, model.get_output_embeddings()]:
                alone, alone_p = mod(hidden[:1]), padded(mod, hidden[:1], rows)
                for n in (2, 3, 4, 9, 64):
                    worst = max(worst, float((mod(hidden[:n])[0] - alone[0]).abs().max()))
                    got = padded(mod, hidden[:n], rows)[0]
                    worst_padded = max(worst_padded, float((got - alone_p[0]).abs().max()))
            out[kind] = (worst, worst_padded)
    return out


def step_times(lms: dict, tokenizer, rows: int, context: int, repeats: int):
    """Medians (s) of one decode step of ``rows`` rows per candidate, interleaved; work counts."""
    prompt = tuple(tokenizer.encode(STEP_PROMPT))[: context - 1]
    gen = torch.Generator().manual_seed(rows)
    ctxs = [
        prompt + tuple(torch.randint(100, 20000, (context - len(prompt),), generator=gen).tolist())
        for _ in range(rows)
    ]
    times: dict[str, list[float]] = {k: [] for k in lms}
    work: dict[str, tuple[int, int]] = {}
    for lm in lms.values():
        lm.clear_cache()
        lm.batch_next_token_logprobs(ctxs)  # cache the contexts (not timed)
    for r in range(repeats + 2):
        for kind, lm in lms.items():
            step = [c + (30000 + r,) for c in ctxs]  # a new sibling token each repeat
            f0, t0 = lm.stats.forward_calls, lm.stats.tokens_run
            start = time.process_time()  # CPU s: one thread, robust to other load
            lm.batch_next_token_logprobs(step)
            elapsed = time.process_time() - start
            if r >= 2:  # two warm-up steps
                times[kind].append(elapsed)
                fw, tk = work.get(kind, (0, 0))
                work[kind] = (fw + lm.stats.forward_calls - f0, tk + lm.stats.tokens_run - t0)
    return {k: statistics.median(v) for k, v in times.items()}, work


def prefill_times(lms: dict, tokenizer, length: int, repeats: int) -> dict[str, float]:
    """Median seconds to serve one fresh ``length``-token context (one forward), per LM."""
    unit = tuple(tokenizer.encode(" ".join(PROMPTS)))
    ctx = (unit * (length // len(unit) + 1))[:length]
    times: dict[str, list[float]] = {k: [] for k in lms}
    for _ in range(repeats):
        for kind, lm in lms.items():
            lm.clear_cache()
            start = time.process_time()
            lm.batch_next_token_logprobs([ctx])
            times[kind].append(time.process_time() - start)
    return {k: statistics.median(v) for k, v in times.items()}


def compile_study(base, tokenizer, rows_list, context, repeats, part: str) -> dict:
    """torch.compile (inductor, freezing) of the fp32 decoder's ``part`` ("layers" or "mlp")."""
    import torch._dynamo
    import torch._inductor.config as inductor_config

    from llamppl import CachedCausalLM

    inductor_config.freezing = True
    torch._dynamo.config.recompile_limit = 512  # freezing guards each layer's weights: ≥ 30 graphs
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    model = build(base, "fp32")
    t0 = time.perf_counter()
    for layer in model.model.layers:  # in place: the modules and their signatures stay
        (layer if part == "layers" else layer.mlp).compile()
    lm = CachedCausalLM(model, tokenizer, verify=False)  # its architecture probe compiles
    out: dict = {"part": part, "construct_s": time.perf_counter() - t0}
    plain = CachedCausalLM(build(base, "fp32"), tokenizer, verify=False)
    for rows in rows_list:
        t0 = time.perf_counter()
        step_times({"compiled": lm}, tokenizer, rows, context, 1)  # compiles: prime + 3 steps
        first = time.perf_counter() - t0
        med, _ = step_times({"fp32": plain, "compiled": lm}, tokenizer, rows, context, repeats)
        out[str(rows)] = {"first_steps_s": first, **{k: v * 1e3 for k, v in med.items()}}
    counters = torch._dynamo.utils.counters
    out["frames"] = dict(counters["frames"])
    out["dynamo_stats"] = dict(counters["stats"])  # unique_graphs: graphs compiled
    out["graph_breaks"] = sum(counters["graph_break"].values())
    return out


# ----------------------------------------------------------------------------- main
def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--candidates", nargs="+", choices=ALL, default=list(ALL))
    parser.add_argument("--rows", nargs="+", type=positive_int, default=[1, 9, 64])
    parser.add_argument("--context", type=positive_int, default=40)
    parser.add_argument("--prefill", type=positive_int, default=512, help="prefill tokens")
    parser.add_argument("--repeats", type=positive_int, default=7, help="timed steps (median)")
    parser.add_argument("--threads", type=positive_int, default=1)
    parser.add_argument("--compile", action="store_true", help="also torch.compile (slow)")
    parser.add_argument("--out", type=Path, default=None, help="append a JSON record here")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    from llamppl import CachedCausalLM
    from llamppl.lm.hf.exactness import probe_difference

    kinds = ["fp32"] + [k for k in args.candidates if k != "fp32"]
    print(f"torch {torch.__version__}, threads {torch.get_num_threads()}, {platform.machine()}")
    caps = torch.cpu.get_capabilities()
    isa = [f for f in ("avx2", "avx512_f", "avx512_bf16", "avx512_vnni", "amx_bf16") if caps.get(f)]
    print(
        f"CPU {caps.get('cpu_name')}: {' '.join(isa)}; ATen {torch.backends.cpu.get_cpu_capability()}"
    )
    forced = {k: v for k, v in os.environ.items() if k.endswith(("_INSTRUCTIONS", "_CAPABILITY"))}
    print(f"forced: {forced or 'nothing'}")
    fp32 = CachedCausalLM.default(weights="fp32")
    base, tokenizer = fp32.model, fp32.tokenizer
    models, load_s = {}, {}
    for kind in kinds:
        t0 = time.perf_counter()
        models[kind] = build(base, kind)
        load_s[kind] = time.perf_counter() - t0
    lms, probe = {}, {}
    for kind, model in models.items():  # kernels side by side: the per-row layout for all
        lm = CachedCausalLM(model, tokenizer, verify=False, batch_invariant=False)
        probe[kind] = probe_difference(lm, float("inf"))  # verify_exact's number, never raises
        lms[kind] = lm
    layouts = [k for k in ("fp16", "fp32") if k in models]  # and the default, batch-invariant
    for kind in layouts:
        lms[f"{kind} inv"] = CachedCausalLM(models[kind], tokenizer, verify=False)

    times = {}
    work = {}
    for rows in args.rows:
        times[rows], work[rows] = step_times(lms, tokenizer, rows, args.context, args.repeats)
    prefill = prefill_times(lms, tokenizer, args.prefill, max(3, args.repeats // 2))
    kl, n_tokens = kl_per_token(models, tokenizer)
    print(
        f"\nthe batch-invariant layout (default) beside the per-row one: decode step (median of "
        f"{args.repeats}, CPU) at each row count and a {args.prefill}-token prefill (median of "
        f"{max(3, args.repeats // 2)}), ms (× per-row)"
    )
    for kind in layouts:
        cells = [
            f"{times[r][kind + ' inv'] * 1e3:.1f} / {times[r][kind] * 1e3:.1f} "
            f"({times[r][kind + ' inv'] / times[r][kind]:.2f}×)"
            for r in args.rows
        ]
        pre = prefill[kind + " inv"] / prefill[kind]
        print(
            f"  {kind}: " + "; ".join(f"{r} rows {c}" for r, c in zip(args.rows, cells)) + "; "
            f"prefill {prefill[kind + ' inv'] * 1e3:.0f} / {prefill[kind] * 1e3:.0f} ({pre:.2f}×)"
        )
    with torch.inference_mode():
        hidden = base.model(torch.tensor([tokenizer.encode(" ".join(PROMPTS) * 2)[:64]]))
    invariance = batch_invariance(models, hidden.last_hidden_state[0])

    head = f"{'rows':>5} " + " ".join(f"{k:>16}" for k in kinds) + "   forwards/tokens per step"
    print(f"\ndecode step, context {args.context}, median of {args.repeats} (CPU ms, ×fp32)")
    print(head)
    for rows in args.rows:
        base_t = times[rows]["fp32"]
        cells = " ".join(
            f"{times[rows][k] * 1e3:8.1f} ({base_t / times[rows][k]:4.2f}×)" for k in kinds
        )
        counts = {work[rows][k] for k in kinds}
        fw, tk = next(iter(counts))
        same = "" if len(counts) == 1 else f" DIFFER {work[rows]}"
        print(f"{rows:>5} {cells}   {fw / args.repeats:.0f}/{tk / args.repeats:.0f}{same}")
    print(f"\nmean KL(fp32 ‖ candidate) per token over {n_tokens} tokens; faithful: ≤ 0.01")
    print("verify_exact: max |cached − fresh| log-prob on its probe (passes at ≤ 1e-3, float32)")
    print("batch invariance: max |row alone − row in batch of 2, 3, 4, 9, 64| (all shapes), as")
    print("called / as the batch-invariant layout calls them (rows padded to its row calls)")
    print(f"{'':18} {'KL/token':>10} {'verify_exact':>13} {'batch-var':>19} {'pack s':>7}")
    for k in kinds:
        var = f"{invariance[k][0]:.1e} / {invariance[k][1]:.1e}"
        print(f"{k:18} {kl[k]:10.2e} {probe[k]:13.2e} {var:>19} {load_s[k]:7.2f}")

    compiled = None
    if args.compile:
        compiled = []
        for part in ("mlp", "layers"):
            try:
                compiled.append(
                    compile_study(base, tokenizer, args.rows, args.context, args.repeats, part)
                )
            except Exception as exc:  # noqa: BLE001 - report what inductor refused
                compiled.append({"part": part, "error": f"{type(exc).__name__}: {str(exc)[:300]}"})
            print(f"\ntorch.compile (inductor, freezing), fp32 {part}:", json.dumps(compiled[-1]))

    if args.out is not None:
        record = {
            "date": datetime.date.today().isoformat(),
            "torch": torch.__version__,
            "threads": torch.get_num_threads(),
            "cpu": caps.get("cpu_name"),
            "isa": isa,
            "context": args.context,
            "repeats": args.repeats,
            "forced": forced,
            "aten_capability": torch.backends.cpu.get_cpu_capability(),
            "layout": "per-row (batch_invariant=False) for step_ms; '<kind> inv': the default",
            "step_ms": {r: {k: times[r][k] * 1e3 for k in lms} for r in args.rows},
            "prefill_tokens": args.prefill,
            "prefill_ms": {k: v * 1e3 for k, v in prefill.items()},
            "ratio": {r: {k: times[r]["fp32"] / times[r][k] for k in kinds} for r in args.rows},
            "work_per_step": {
                r: {
                    "forward_calls": work[r]["fp32"][0] / args.repeats,
                    "tokens_run": work[r]["fp32"][1] / args.repeats,
                }
                for r in args.rows
            },
            "kl_per_token": kl,
            "kl_tokens": n_tokens,
            "verify_exact": probe,
            "batch_variance": invariance,
            "pack_s": load_s,
            "compile": compiled,
        }
        with args.out.open("a") as f:
            f.write(json.dumps(record) + "\n")


if __name__ == "__main__":
    main()
