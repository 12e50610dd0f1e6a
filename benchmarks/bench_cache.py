"""Token-trie cache vs Hugging Face baselines on the embedded SmolLM2 (not a test).

(a) Decoding: N sequences x T tokens from a shared P-token prompt (default 16 x 64, P = 32).
    - HF ``generate`` at batch N (its own KV cache, sampling, fixed seed);
    - HF manual decode loop at batch N with a ``DynamicCache``, forcing those tokens;
    - ``CachedCausalLM``: the same tokens forced, all N contexts awaited per step, the
      shared prompt read once per layer (``share_prefix``) and, in the same process, per
      row (``share_prefix=False``, the per-row layout).
    Prefill and decode (the T - 1 following steps) are timed apart. ``--forced random``:
    seeded random tokens, every row distinct (``generate`` copies a long repeated prompt,
    giving every row the same tokens). ``--hf-prefill once``: HF's prompt at batch 1, its
    cache copied to the N rows (decode steps unchanged).
(b) Resampling-shaped tree: N particles grow one sampled token per step and are resampled
    at random; the request batches are replayed through a fresh ``CachedCausalLM`` and a
    baseline re-running every particle's full context each step (left-padded, no cache).
(c) ``--long-prompt P``: ``--long-rows`` rows (default 16 and 64) below one P-token prompt,
    ``--long-steps`` forced random tokens each: the default batch-invariant forward (key
    blocks, :mod:`llamppl.lm.hf.query_plan`) beside the per-row forward with the prefix
    merge (``batch_invariant=False``), prefill and decode CPU seconds apart, best of
    ``--repeats``; ``--out FILE`` appends a JSON line per row count.

Prints wall and CPU times, forward calls, tokens run and ratios, for any local model,
dtype and device (e.g. your GPU)::

    .venv/bin/python benchmarks/bench_cache.py            # embedded SmolLM2, fp32, 1 thread
    .venv/bin/python benchmarks/bench_cache.py --dtype bfloat16 --particles 32 --prompt-len 512
    .venv/bin/python benchmarks/bench_cache.py --model ~/models/Qwen2.5-0.5B --device cuda \
        --dtype bfloat16 --tree-steps 0
    .venv/bin/python benchmarks/bench_cache.py --long-prompt 1000 --decode 0 --tree-steps 0
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import os
import random
import time
from pathlib import Path

import torch
from transformers import DynamicCache

from llamppl.lm.hf.cached_causal_lm import CachedCausalLM

_LOOP = asyncio.new_event_loop()


def gather(lm: CachedCausalLM, contexts) -> list[torch.Tensor]:
    """All ``contexts`` awaited concurrently (one coalesced batch), on one persistent loop."""

    async def go():
        return await asyncio.gather(*(lm.next_token_logprobs(c) for c in contexts))

    return _LOOP.run_until_complete(go())


def best_of(repeats: int, fn):
    """Run ``fn`` ``repeats`` times; return ((min wall s, min CPU s), last result).

    CPU time is the process's, so with one thread it is robust to other load on the machine.
    """
    best_wall, best_cpu, out = float("inf"), float("inf"), None
    for _ in range(repeats):
        t0, c0 = time.perf_counter(), time.process_time()
        out = fn()
        best_wall = min(best_wall, time.perf_counter() - t0)
        best_cpu = min(best_cpu, time.process_time() - c0)
    return (best_wall, best_cpu), out


# --------------------------------------------------------------------------- (a) decoding
STORY = (
    "Once upon a time, in a land far away, there lived a curious little robot who loved to "
    "explore. Every morning it rolled out of its shed, greeted the birds, and set off along "
    "the river to look for shiny stones, odd leaves and stories the old trees might tell. "
)


def make_prompt(lm: CachedCausalLM, text: str, length: int) -> list[int]:
    """Exactly ``length`` token ids: ``text`` repeated as often as needed, then cut."""
    if length < 1:
        raise ValueError(f"--prompt-len must be a positive integer, got {length}")
    unit = lm.encode(text)
    return (unit * (length // len(unit) + 1))[:length]


def clocks() -> tuple[float, float]:
    """(wall, process CPU) seconds; with one thread CPU time is robust to other load."""
    return time.perf_counter(), time.process_time()


def sync(device: torch.device) -> None:
    """Wait for queued GPU work so that wall times are honest (no-op on CPU)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elif device.type == "mps":
        torch.mps.synchronize()


def prompt_cache(model, ids: torch.Tensor, once: bool) -> DynamicCache | None:
    """``once``: HF's cache of all but the last prompt token at batch 1, copied to every row."""
    if not once:
        return None
    cache = DynamicCache(config=model.config)
    model(ids[:1, :-1], past_key_values=cache, use_cache=True, logits_to_keep=1)
    cache.batch_repeat_interleave(ids.shape[0])
    return cache


def bench_decode(lm: CachedCausalLM, args: argparse.Namespace) -> list[dict]:
    """Rows for generate / manual DynamicCache loop / CachedCausalLM (prompt shared and per
    row); prefill and decode timed apart; ``--hf-prefill``, ``--forced``: module docstring."""
    n, prompt_len, new_tokens = args.particles, args.prompt_len, args.new_tokens
    repeats = args.repeats
    once, random_tokens = args.hf_prefill == "once", args.forced == "random"
    model, dev = lm.model, lm.device
    prompt = make_prompt(lm, STORY, prompt_len)
    ids = torch.tensor([prompt] * n, device=dev)  # (n, prompt_len)

    def run_generate():
        torch.manual_seed(0)
        with torch.inference_mode():
            out = model.generate(
                ids,
                past_key_values=prompt_cache(model, ids, once),
                attention_mask=torch.ones_like(ids),
                do_sample=True,
                top_k=0,
                top_p=1.0,
                temperature=1.0,
                max_new_tokens=new_tokens,
                min_new_tokens=new_tokens,
                pad_token_id=lm.eos_token_id,
            )
        sync(dev)
        return out

    t_gen, out = best_of(repeats, run_generate)
    # Rows that ended early are padded by generate, so the output stays rectangular; force
    # exactly the tokens it produced (however many that is) in the other two methods.
    seqs = out[:, prompt_len:].tolist()  # (n, steps)
    if random_tokens:  # rows that differ at every step (a repeated prompt makes generate copy it)
        g = torch.Generator().manual_seed(0)
        seqs = torch.randint(0, lm.vocab_size, (n, len(seqs[0])), generator=g).tolist()
    steps = len(seqs[0])
    if steps < 1:
        raise RuntimeError("generate produced no new tokens")

    def run_manual():
        with torch.inference_mode():
            t0 = clocks()
            cache = prompt_cache(model, ids, once) or DynamicCache(config=model.config)
            o = model(
                ids[:, cache.get_seq_length() :],
                past_key_values=cache,
                use_cache=True,
                logits_to_keep=1,
            )
            torch.log_softmax(o.logits[:, -1].float(), -1)
            sync(dev)
            t1 = clocks()
            for t in range(steps - 1):
                step = torch.tensor([[s[t]] for s in seqs], device=dev)  # (n, 1)
                o = model(step, past_key_values=o.past_key_values, use_cache=True)
                torch.log_softmax(o.logits[:, -1].float(), -1)
            sync(dev)
            t2 = clocks()
        return (t0, t1, t2), (steps, gen_tokens)

    def run_cached():
        lm.clear_cache()
        lm.stats.reset()
        t0 = clocks()
        gather(lm, [tuple(prompt)])
        sync(dev)
        t1 = clocks()
        for t in range(1, steps):
            gather(lm, [tuple(prompt) + tuple(s[:t]) for s in seqs])
        sync(dev)
        t2 = clocks()
        return (t0, t1, t2), (lm.stats.forward_calls, lm.stats.tokens_run)

    def phases(fn):
        """Best-of-``repeats`` total wall, CPU, prefill and decode times (each minimised apart)."""
        keys = ("time", "cpu", "prefill", "decode", "prefill_cpu", "decode_cpu")
        best = dict.fromkeys(keys, float("inf"))
        for _ in range(repeats):
            (wall, cpu), ((t0, t1, t2), work) = best_of(1, fn)
            values = (wall, cpu, t1[0] - t0[0], t2[0] - t1[0], t1[1] - t0[1], t2[1] - t1[1])
            for key, v in zip(keys, values):
                best[key] = min(best[key], v)
        return best, work

    gen_tokens = n * (prompt_len + steps - 1) if not once else n * steps + prompt_len - 1
    man, (man_calls, man_tokens) = phases(run_manual)
    lm.batch_invariant = False  # the per-row forward, with and without the shared-prefix merge
    lm.share_prefix = False
    rows, (row_calls, row_tokens) = phases(run_cached)
    lm.share_prefix = True  # on unless the model cannot (eager, sliding windows, ...)
    ours, (lm_calls, lm_tokens) = phases(run_cached)
    nan = float("nan")
    return [
        {
            "name": f"HF generate (batch {n})",
            **{"time": t_gen[0], "cpu": t_gen[1], "prefill": nan, "decode": nan},
            "calls": steps,
            "tokens": gen_tokens,
        },
        {"name": "HF DynamicCache loop, forced", **man, "calls": man_calls, "tokens": man_tokens},
        {
            "name": "CachedCausalLM, prompt per row",
            **rows,
            "calls": row_calls,
            "tokens": row_tokens,
        },
        {"name": "CachedCausalLM, forced", **ours, "calls": lm_calls, "tokens": lm_tokens},
    ]


# --------------------------------------------------------------------------- (b) tree workload
def record_tree_workload(
    lm: CachedCausalLM, n: int, prompt_len: int, steps: int, seed: int
) -> list[list[tuple]]:
    """Sample an SMC-shaped run and return its request batches (lists of contexts)."""
    rng = random.Random(seed)
    gen = torch.Generator().manual_seed(seed)
    text = (
        "She opened the old wooden box and found a letter, a key, and a photograph of a "
        "house she had never seen. The letter began with a name she did not recognise, and "
    )
    prompt = tuple(make_prompt(lm, text, prompt_len))
    batches = [[prompt]]
    (lp,) = gather(lm, [prompt])
    particles = [(prompt, lp)] * n
    for _ in range(steps):
        grown = [c + (int(torch.multinomial(p.exp(), 1, generator=gen)),) for c, p in particles]
        weights = [rng.random() for _ in grown]  # uneven weights: duplication / dropping
        survivors = rng.choices(grown, weights=weights, k=n)
        outs = gather(lm, survivors)
        batches.append(survivors)
        particles = list(zip(survivors, outs))
    lm.clear_cache()
    lm.stats.reset()
    return batches


def bench_tree(lm: CachedCausalLM, n: int, prompt_len: int, steps: int, repeats: int) -> list[dict]:
    batches = record_tree_workload(lm, n, prompt_len, steps, seed=0)
    model = lm.model

    def run_cached():
        lm.clear_cache()
        lm.stats.reset()
        for b in batches:
            gather(lm, b)
        return lm.stats.forward_calls, lm.stats.tokens_run

    t_lm, (lm_calls, lm_tokens) = best_of(repeats, run_cached)

    def run_no_sharing():
        tokens = 0
        with torch.inference_mode():
            for b in batches:
                width = max(map(len, b))
                ids = torch.tensor(
                    [[0] * (width - len(c)) + list(c) for c in b], device=model.device
                )  # left padded (B, S)
                mask = torch.tensor(
                    [[0] * (width - len(c)) + [1] * len(c) for c in b], device=model.device
                )
                pos = (mask.cumsum(-1) - 1).clamp(min=0)
                o = model(
                    ids, attention_mask=mask, position_ids=pos, use_cache=False, logits_to_keep=1
                )
                torch.log_softmax(o.logits[:, -1].float(), -1)
                tokens += sum(map(len, b))
        return len(batches), tokens

    t_base, (base_calls, base_tokens) = best_of(repeats, run_no_sharing)
    return [
        {
            "name": "no sharing (full recompute)",
            "time": t_base[0],
            "cpu": t_base[1],
            "calls": base_calls,
            "tokens": base_tokens,
        },
        {
            "name": "CachedCausalLM (trie)",
            "time": t_lm[0],
            "cpu": t_lm[1],
            "calls": lm_calls,
            "tokens": lm_tokens,
        },
    ]


# --------------------------------------------------------------------------- (c) long prompt
def bench_long_prompt(lm: CachedCausalLM, n: int, prompt_len: int, steps: int, repeats: int):
    """CPU s of the prompt's prefill and of ``steps`` decode steps of ``n`` rows below it, per
    layout (batch-invariant, then per row with the prefix merge), best of ``repeats``."""
    g = torch.Generator().manual_seed(n)
    prompt = tuple(make_prompt(lm, STORY, prompt_len))
    tails = torch.randint(100, 20000, (n, steps), generator=g).tolist()
    out = {}
    for invariant in (True, False):
        lm.batch_invariant = invariant
        best = {"prefill_cpu": float("inf"), "decode_cpu": float("inf")}
        for _ in range(repeats):
            lm.clear_cache()
            lm.stats.reset()
            c0 = time.process_time()
            gather(lm, [prompt])
            c1 = time.process_time()
            for t in range(1, steps + 1):
                gather(lm, [prompt + tuple(row[:t]) for row in tails])
            c2 = time.process_time()
            best["prefill_cpu"] = min(best["prefill_cpu"], c1 - c0)
            best["decode_cpu"] = min(best["decode_cpu"], c2 - c1)
        work = (lm.stats.forward_calls, lm.stats.tokens_run, lm.stats.shared_prefix_tokens)
        out["batch_invariant" if invariant else "per_row"] = {**best, "work": work}
    lm.batch_invariant = True
    return out


def print_table(title: str, rows: list[dict]) -> None:
    print(f"\n{title}")
    print(
        f"  {'method':<30} {'wall s':>8} {'CPU s':>8} {'prefill s':>9} {'decode s':>9}"
        f" {'forwards':>9} {'tokens run':>11}"
    )
    for r in rows:
        pre, dec = r.get("prefill", float("nan")), r.get("decode", float("nan"))
        print(
            f"  {r['name']:<30} {r['time']:>8.3f} {r['cpu']:>8.3f} {pre:>9.3f} {dec:>9.3f}"
            f" {r['calls']:>9d} {r['tokens']:>11d}"
        )


DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def load_lm(model: str | None, dtype: str, device: str) -> CachedCausalLM:
    """The embedded SmolLM2 (``model=None``) or any local Hugging Face directory / .gguf file."""
    if model is None:
        return CachedCausalLM.default(device, dtype=DTYPES[dtype])
    return CachedCausalLM.from_pretrained(model, device, dtype=DTYPES[dtype])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--model",
        default=None,
        help="local HF model directory or .gguf file (default: embedded SmolLM2-135M)",
    )
    ap.add_argument(
        "--dtype", choices=sorted(DTYPES), default="float32", help="model and K/V dtype"
    )
    ap.add_argument("--device", default="cpu", help="cpu, cuda, cuda:1, mps, ...")
    ap.add_argument(
        "--threads", type=int, default=None, help="torch threads (default: llamppl's choice)"
    )
    ap.add_argument("--repeats", type=int, default=2, help="timed repetitions, best kept")
    ap.add_argument("--particles", type=int, default=16)
    ap.add_argument("--prompt-len", type=int, default=32)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--tree-steps", type=int, default=32, help="0 skips the tree workload (b)")
    ap.add_argument("--forced", choices=("generate", "random"), default="generate")
    ap.add_argument("--hf-prefill", choices=("batch", "once"), default="batch")
    ap.add_argument("--decode", type=int, choices=(0, 1), default=1, help="0 skips (a)")
    ap.add_argument("--long-prompt", type=int, default=0, help="(c): prompt tokens; 0 skips")
    ap.add_argument("--long-rows", type=int, nargs="+", default=[16, 64])
    ap.add_argument("--long-steps", type=int, default=12)
    ap.add_argument("--out", type=Path, default=None, help="(c): append JSON lines here")
    args = ap.parse_args()
    for name in ("particles", "prompt_len", "new_tokens", "repeats"):
        if getattr(args, name) < 1:
            ap.error(f"--{name.replace('_', '-')} must be a positive integer")
    if args.tree_steps < 0 or args.long_prompt < 0:
        ap.error("--tree-steps and --long-prompt must be >= 0")
    if args.long_steps < 1 or min(args.long_rows) < 1:
        ap.error("--long-steps and --long-rows must be positive integers")
    if args.threads is not None and args.threads < 1:
        ap.error("--threads must be a positive integer")

    if args.threads is not None:  # else llamppl.threads picks at the first load
        torch.set_num_threads(args.threads)
    lm = load_lm(args.model, args.dtype, args.device)
    limit = lm.max_positions
    if limit is not None and args.prompt_len + max(args.new_tokens, args.tree_steps) > limit:
        ap.error(f"--prompt-len + --new-tokens must not exceed the model's {limit} positions")
    if limit is not None and args.long_prompt + args.long_steps > limit:
        ap.error(f"--long-prompt + --long-steps must not exceed the model's {limit} positions")
    print(
        f"torch threads {torch.get_num_threads()}; torch {torch.__version__}; best of {args.repeats}; "
        f"model {args.model or 'embedded SmolLM2-135M'} {args.dtype} on {lm.device}"
    )
    gather(lm, [lm.encode("warm up")])  # first-call overheads
    if args.decode:
        run_decode(lm, args)
    if args.tree_steps:
        run_tree(lm, args)
    if args.long_prompt:
        run_long_prompt(lm, args)
    print(f"\n{lm.stats}")


def run_decode(lm: CachedCausalLM, args: argparse.Namespace) -> None:
    dec = bench_decode(lm, args)
    print_table(
        f"(a) decode {args.particles} x {args.new_tokens} tokens from a shared {args.prompt_len}-token prompt",
        dec,
    )
    gen, man, rows, ours = dec
    for key, label in (("time", "wall"), ("cpu", "CPU ")):
        print(
            f"  {label} ratio   CachedCausalLM / generate       = {ours[key] / gen[key]:.3f}  (goal <= 1.15)"
        )
        print(f"  {label} ratio   CachedCausalLM / manual KV loop = {ours[key] / man[key]:.3f}")
    for r, label in (
        (ours, f"CachedCausalLM (share_prefix={lm.share_prefix})"),
        (rows, "prompt per row"),
    ):
        print(
            f"  decode ratio {label} / DynamicCache decode steps = {r['decode'] / man['decode']:.3f} wall, "
            f"{r['decode_cpu'] / man['decode_cpu']:.3f} CPU"
        )
    print(
        f"  prefill ratio CachedCausalLM / DynamicCache prefill     = {ours['prefill'] / man['prefill']:.3f}"
    )
    print(f"  tokens ratio CachedCausalLM / generate      = {ours['tokens'] / gen['tokens']:.3f}")


def run_tree(lm: CachedCausalLM, args: argparse.Namespace) -> None:
    tree = bench_tree(lm, args.particles, args.prompt_len, args.tree_steps, args.repeats)
    print_table(
        f"(b) resampling tree: {args.particles} particles, {args.tree_steps} steps, {args.prompt_len}-token prompt",
        tree,
    )
    base, ours = tree
    print(f"  wall speedup no sharing / CachedCausalLM     = {base['time'] / ours['time']:.2f}x")
    print(f"  CPU speedup  no sharing / CachedCausalLM     = {base['cpu'] / ours['cpu']:.2f}x")
    print(f"  tokens ratio CachedCausalLM / no sharing     = {ours['tokens'] / base['tokens']:.3f}")


def run_long_prompt(lm: CachedCausalLM, args: argparse.Namespace) -> None:
    caps = torch.cpu.get_capabilities()
    flags = [f for f in ("avx2", "avx512_f", "amx_bf16") if caps.get(f)]
    forced = {k: v for k, v in os.environ.items() if k.endswith(("_INSTRUCTIONS", "_CAPABILITY"))}
    print(
        f"\n(c) rows below a {args.long_prompt}-token prompt, {args.long_steps} decode steps; "
        f"CPU flags {' '.join(flags)}; ATen {torch.backends.cpu.get_cpu_capability()}; forced {forced}"
    )
    print(
        f"  {'rows':>5} {'layout':<16} {'prefill CPU s':>13} {'decode CPU s':>12} {'forwards/tokens':>16}"
    )
    for n in args.long_rows:
        res = bench_long_prompt(lm, n, args.long_prompt, args.long_steps, args.repeats)
        for name, r in res.items():
            fw, tk, _ = r["work"]
            print(
                f"  {n:>5} {name:<16} {r['prefill_cpu']:>13.2f} {r['decode_cpu']:>12.2f} {fw:>7}/{tk}"
            )
        bi, row = res["batch_invariant"], res["per_row"]
        ratio = {k: bi[k] / row[k] for k in ("prefill_cpu", "decode_cpu")}
        print(
            f"  {n:>5} {'ratio':<16} {ratio['prefill_cpu']:>13.2f} {ratio['decode_cpu']:>12.2f}  (goal <= 1.5)"
        )
        if args.out is not None:
            record = {
                "date": datetime.date.today().isoformat(),
                "torch": torch.__version__,
                "threads": torch.get_num_threads(),
                "cpu": caps.get("cpu_name"),
                "cpu_flags": flags,
                "aten_capability": torch.backends.cpu.get_cpu_capability(),
                "forced": forced,
                "prompt_len": args.long_prompt,
                "rows": n,
                "steps": args.long_steps,
                "repeats": args.repeats,
                **res,
                "ratio": ratio,
            }
            with args.out.open("a") as f:
                f.write(json.dumps(record) + "\n")


if __name__ == "__main__":
    main()
