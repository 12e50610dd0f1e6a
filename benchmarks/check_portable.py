"""Does the default forward keep its promises on this CPU? A held-out check (not a test).

On ``CachedCausalLM.default()`` (one torch thread unless ``--threads``):

1. **Batch invariance**: ``--targets`` contexts (default 4), each served alone on a fresh LM
   and among 1, 3, 8 and 15 other contexts (fresh LMs, one batch each; the others are
   held-out prompts of other lengths, some sharing the target's first words, one extending
   it, one below a long shared prompt): how many of the targets x companies give the same
   log-probs bit for bit. The promise: all of them wherever ``lm.batch_invariant`` is True.
2. **Exactness**: the largest |cached - fresh| log-prob of every context above against a
   fresh full forward of the model, and of 6 particles resampled 24 times under a 60-token
   cache bound (evictions, recomputation). The promise: within 1e-4.
3. **Long prompts**: 16 and 64 rows below one 1,000-token prompt, 12 decode steps, CPU
   seconds of the batch-invariant forward over the per-row forward with the prefix merge.
   The promise: at most 1.5.

Prints the CPU flags, ATen's capability and any forced ISA variable
(``FBGEMM_ENABLE_INSTRUCTIONS=AVX2 ATEN_CPU_CAPABILITY=avx2 MKL_ENABLE_INSTRUCTIONS=AVX2``
makes an AVX-512 CPU run the libraries' AVX2 code); exits 1 if a promise fails::

    .venv/bin/python benchmarks/check_portable.py
    FBGEMM_ENABLE_INSTRUCTIONS=AVX2 ATEN_CPU_CAPABILITY=avx2 MKL_ENABLE_INSTRUCTIONS=AVX2 \\
        .venv/bin/python benchmarks/check_portable.py
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import sys
import time

import torch

from llamppl import CachedCausalLM

TARGETS = [
    "The quick brown fox jumps over the lazy",
    "def fibonacci(n):\n    if n < 2:\n        return",
    "In the spring of 1887, the young painter moved to",
    "Q: What is the boiling point of water at sea level?\nA:",
    "Once upon a time, a robot who loved rivers",
    "My grandmother's recipe for apple pie starts with",
]
OTHERS = [
    "Hi",
    "Paris",
    "The quick brown cat",
    "The quick brown fox jumps over the lazy dog and then it",
    "Once upon a time",
    "import numpy as np\nx = np.",
    "In 1492 Columbus sailed the ocean blue and then he",
    "A long time ago in a galaxy far, far away, there lived a",
    "Write a haiku about the sea.",
    "Dear hiring manager, I am writing to apply for the position of",
    "SELECT name FROM users WHERE",
    "The Federal Reserve said on Tuesday that it would keep interest rates",
    "She opened the door and",
    "1, 2, 3, 5, 8, 13,",
    "Translate to French: good morning ->",
]
LONG = (
    "Every morning the old lighthouse keeper climbed the stairs, wiped the great lens, and "
    "wrote the weather in his book: wind, waves, clouds and the ships that passed. "
)
_LOOP = asyncio.new_event_loop()


def gather(lm: CachedCausalLM, contexts) -> list[torch.Tensor]:
    async def go():
        return await asyncio.gather(*(lm.next_token_logprobs(c) for c in contexts))

    return _LOOP.run_until_complete(go())


def fresh(lm: CachedCausalLM, context) -> torch.Tensor:
    with torch.inference_mode():
        logits = lm.model(torch.tensor([context]), use_cache=False).logits[0, -1].float()
    return torch.log_softmax(logits, -1)


def check_invariance(base: CachedCausalLM, n_targets: int) -> tuple[int, int, float]:
    """(equal, compared, max |cached - fresh|) over targets x companies of 1, 3, 8, 15."""
    enc = base.encode
    long_prompt = tuple((enc(LONG) * 8)[:300])
    others = [tuple(enc(t)) for t in OTHERS]
    others[-1] = long_prompt + tuple(enc(" And then"))  # one context below a long prompt
    equal = compared = 0
    worst = 0.0
    rng = random.Random(0)
    for t in TARGETS[:n_targets]:
        target = tuple(enc(t))
        lm = CachedCausalLM(base.model, base.tokenizer, verify=False)
        alone = gather(lm, [target])[0]
        worst = max(worst, float((alone - fresh(lm, target)).abs().max()))
        for k in (1, 3, 8, 15):
            company = rng.sample(others, k)
            lm = CachedCausalLM(base.model, base.tokenizer, verify=False)
            got = gather(lm, [*company[: k // 2], target, *company[k // 2 :]])
            equal += int(torch.equal(got[k // 2], alone))
            compared += 1
            for c, lp in zip(company, got[: k // 2] + got[k // 2 + 1 :]):
                worst = max(worst, float((lp - fresh(lm, c)).abs().max()))
    return equal, compared, worst


def check_memory_bound(base: CachedCausalLM) -> float:
    """Max |cached - fresh| of 6 particles resampled 24 times under a 60-token cache bound."""
    lm = CachedCausalLM(base.model, base.tokenizer, max_cache_tokens=60, verify=False)
    rng, gen = random.Random(5), torch.Generator().manual_seed(5)
    prompt = tuple(lm.encode("Fruits: apple,"))
    particles = [(prompt, gather(lm, [prompt])[0])] * 6
    worst = 0.0
    for step in range(24):
        grown = [c + (int(torch.multinomial(p.exp(), 1, generator=gen)),) for c, p in particles]
        survivors = [rng.choice(grown) for _ in grown]
        outs = gather(lm, survivors)
        if step in (0, 6, 12, 18, 23):
            worst = max(
                worst, max(float((o - fresh(lm, c)).abs().max()) for c, o in zip(survivors, outs))
            )
        particles = list(zip(survivors, outs))
    return worst


def check_long_prompt(base: CachedCausalLM, rows: int, length: int, steps: int) -> dict[str, float]:
    """CPU s of ``steps`` decode steps of ``rows`` rows below a ``length``-token prompt, per layout."""
    prompt = tuple((base.encode(LONG) * (length // 20 + 1))[:length])
    g = torch.Generator().manual_seed(rows)
    tails = torch.randint(100, 20000, (rows, steps), generator=g).tolist()
    out = {}
    for invariant in (True, False):
        lm = CachedCausalLM(base.model, base.tokenizer, verify=False, batch_invariant=invariant)
        gather(lm, [prompt])
        c0 = time.process_time()
        for t in range(1, steps + 1):
            gather(lm, [prompt + tuple(r[:t]) for r in tails])
        out["batch_invariant" if invariant else "per_row"] = time.process_time() - c0
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--targets", type=int, default=4, choices=range(1, len(TARGETS) + 1))
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--long-prompt", type=int, default=1000)
    ap.add_argument("--steps", type=int, default=12)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    caps = torch.cpu.get_capabilities()
    flags = [f for f in ("avx2", "avx512_f", "avx512_vnni", "amx_bf16") if caps.get(f)]
    forced = {k: v for k, v in os.environ.items() if k.endswith(("_INSTRUCTIONS", "_CAPABILITY"))}
    print(
        f"CPU {caps.get('cpu_name')}: {' '.join(flags)}; ATen {torch.backends.cpu.get_cpu_capability()}"
    )
    print(
        f"forced: {forced or 'nothing'}; torch {torch.__version__}, {torch.get_num_threads()} thread(s)"
    )
    base = CachedCausalLM.default()
    print(
        f"lm.batch_invariant = {base.batch_invariant}; row calls {getattr(base, 'row_calls', '-')}"
    )
    ok = True

    equal, compared, worst = check_invariance(base, args.targets)
    print(f"1. bitwise equal alone and in company: {equal} of {compared}")
    ok &= equal == compared or not base.batch_invariant
    bound = check_memory_bound(base)
    worst = max(worst, bound)
    print(
        f"2. max |cached - fresh| log-prob: {worst:.3g} (memory-bound run {bound:.3g}); promise 1e-4"
    )
    ok &= worst <= 1e-4
    for rows in (16, 64):
        cpu = check_long_prompt(base, rows, args.long_prompt, args.steps)
        ratio = cpu["batch_invariant"] / cpu["per_row"]
        print(
            f"3. {rows} rows below {args.long_prompt} tokens, {args.steps} steps: batch-invariant "
            f"{cpu['batch_invariant']:.2f} CPU s, per row {cpu['per_row']:.2f} CPU s, ratio {ratio:.2f}"
            " (promise <= 1.5)"
        )
        ok &= ratio <= 1.5
    print("all promises hold" if ok else "A PROMISE FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
