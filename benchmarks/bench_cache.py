"""Token-trie cache vs Hugging Face baselines on the embedded SmolLM2 (not a test).

(a) Decoding: 16 sequences x 64 tokens from a shared 32-token prompt.
    - HF ``generate`` at batch 16 (its own KV cache, sampling, fixed seed);
    - HF manual decode loop at batch 16 with a ``DynamicCache``, forcing those tokens;
    - ``CachedCausalLM``: the same tokens forced, all 16 contexts awaited per step.
(b) Resampling-shaped tree: N particles grow one sampled token per step and are
    resampled (duplicated / dropped) at random; the recorded request batches
    are replayed through a fresh ``CachedCausalLM`` and through a no-sharing
    baseline that re-runs every particle's full context each step (batched,
    left-padded, no cache).

Prints a table of wall and CPU times, forward calls and tokens run, and the ratios::

    .venv/bin/python benchmarks/bench_cache.py            # 1 thread
    .venv/bin/python benchmarks/bench_cache.py --threads 2 --repeats 3
"""

from __future__ import annotations

import argparse
import asyncio
import random
import time

import torch
from transformers import DynamicCache

from llamppl.lm.cached_causal_lm import CachedCausalLM

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
def bench_decode(
    lm: CachedCausalLM, n: int, prompt_len: int, new_tokens: int, repeats: int
) -> list[dict]:
    model = lm.model
    text = (
        "Once upon a time, in a land far away, there lived a curious little robot who loved to explore. "
        * 4
    )
    prompt = lm.encode(text)[:prompt_len]
    ids = torch.tensor([prompt] * n)
    torch.manual_seed(0)

    def run_generate():
        torch.manual_seed(0)
        with torch.inference_mode():
            return model.generate(
                ids,
                attention_mask=torch.ones_like(ids),
                do_sample=True,
                top_k=0,
                top_p=1.0,
                temperature=1.0,
                max_new_tokens=new_tokens,
                min_new_tokens=new_tokens,
                pad_token_id=lm.eos_token_id,
            )

    t_gen, out = best_of(repeats, run_generate)
    seqs = out[:, prompt_len:].tolist()  # (n, new_tokens)

    def run_manual():
        with torch.inference_mode():
            cache = DynamicCache(config=model.config)
            o = model(ids, past_key_values=cache, use_cache=True, logits_to_keep=1)
            torch.log_softmax(o.logits[:, -1].float(), -1)
            for t in range(new_tokens - 1):
                step = torch.tensor([[s[t]] for s in seqs])
                o = model(step, past_key_values=o.past_key_values, use_cache=True)
                torch.log_softmax(o.logits[:, -1].float(), -1)
        return (new_tokens, n * (prompt_len + new_tokens - 1))

    t_man, (man_calls, man_tokens) = best_of(repeats, run_manual)

    def run_cached():
        lm.clear_cache()
        lm.stats.reset()
        for t in range(new_tokens):
            gather(lm, [tuple(prompt) + tuple(s[:t]) for s in seqs])
        return lm.stats.forward_calls, lm.stats.tokens_run

    t_lm, (lm_calls, lm_tokens) = best_of(repeats, run_cached)
    gen_tokens = n * (prompt_len + new_tokens - 1)
    return [
        {
            "name": "HF generate (batch 16)",
            "time": t_gen[0],
            "cpu": t_gen[1],
            "calls": new_tokens,
            "tokens": gen_tokens,
        },
        {
            "name": "HF manual KV loop, forced",
            "time": t_man[0],
            "cpu": t_man[1],
            "calls": man_calls,
            "tokens": man_tokens,
        },
        {
            "name": "CachedCausalLM, forced",
            "time": t_lm[0],
            "cpu": t_lm[1],
            "calls": lm_calls,
            "tokens": lm_tokens,
        },
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
        "house she had never seen. The letter began with a name she did not recognise, and"
    )
    prompt = tuple(lm.encode(text)[:prompt_len])
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
                    [[0] * (width - len(c)) + list(c) for c in b]
                )  # left padded (B, S)
                mask = torch.tensor([[0] * (width - len(c)) + [1] * len(c) for c in b])
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


def print_table(title: str, rows: list[dict]) -> None:
    print(f"\n{title}")
    print(f"  {'method':<30} {'wall s':>8} {'CPU s':>8} {'forwards':>9} {'tokens run':>11}")
    for r in rows:
        print(
            f"  {r['name']:<30} {r['time']:>8.3f} {r['cpu']:>8.3f} {r['calls']:>9d} {r['tokens']:>11d}"
        )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=1, help="torch.set_num_threads (default 1)")
    ap.add_argument("--repeats", type=int, default=2, help="timed repetitions, best kept")
    ap.add_argument("--particles", type=int, default=16)
    ap.add_argument("--prompt-len", type=int, default=32)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--tree-steps", type=int, default=32)
    args = ap.parse_args()

    torch.set_num_threads(args.threads)
    print(
        f"torch.set_num_threads({args.threads}); torch {torch.__version__}; best of {args.repeats}"
    )
    lm = CachedCausalLM.default()
    gather(lm, [lm.encode("warm up")])  # first-call overheads

    dec = bench_decode(lm, args.particles, args.prompt_len, args.new_tokens, args.repeats)
    print_table(
        f"(a) decode {args.particles} x {args.new_tokens} tokens from a shared {args.prompt_len}-token prompt",
        dec,
    )
    gen, man, ours = dec
    for key, label in (("time", "wall"), ("cpu", "CPU ")):
        print(
            f"  {label} ratio   CachedCausalLM / generate       = {ours[key] / gen[key]:.3f}  (goal <= 1.15)"
        )
        print(f"  {label} ratio   CachedCausalLM / manual KV loop = {ours[key] / man[key]:.3f}")
    print(f"  tokens ratio CachedCausalLM / generate      = {ours['tokens'] / gen['tokens']:.3f}")

    tree = bench_tree(lm, args.particles, args.prompt_len, args.tree_steps, args.repeats)
    print_table(
        f"(b) resampling tree: {args.particles} particles, {args.tree_steps} steps, {args.prompt_len}-token prompt",
        tree,
    )
    base, ours = tree
    print(f"  wall speedup no sharing / CachedCausalLM     = {base['time'] / ours['time']:.2f}x")
    print(f"  CPU speedup  no sharing / CachedCausalLM     = {base['cpu'] / ours['cpu']:.2f}x")
    print(f"  tokens ratio CachedCausalLM / no sharing     = {ours['tokens'] / base['tokens']:.3f}")
    print(f"\n{lm.stats}")


if __name__ == "__main__":
    main()
