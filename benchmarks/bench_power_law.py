"""Time per sampling step of the power-law sampler vs plain softmax and top-k sampling.

One step maps logits ``[B, V]`` to one token id per row. All three methods run
in the same process on the same logits, with the same thread count:

- plain: softmax over the whole vocabulary, then ``torch.multinomial`` (what
  ``transformers`` does);
- plain-cdf: softmax, then the two-level inverse-CDF draw the power-law sampler
  uses (so ``PL / plain-cdf`` is the cost of the reshaping itself);
- top-k: ``torch.topk`` (k=50), softmax over the k logits, ``torch.multinomial``;
- power-law: :meth:`PowerLawSampler.sample` (PL-1 reshape, two-level inverse-CDF
  draw, exact ``log q`` of the chosen token, history update).

The paper calls its C++ power-law sampler 2–3× slower than top-k; our goal is
<= 1.5× top-k at V = 49,152, batch 1 and 16::

    python benchmarks/bench_power_law.py            # full run
    python benchmarks/bench_power_law.py --fast     # CI smoke test
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import torch
from _args import positive_int  # noqa: E402

from llamppl.decoding.proposals.token_draw import draw_token_ids
from llamppl.models import PowerLawSampler


def _interleaved_median_us(fns: dict, rounds: int, block: int = 10) -> dict[str, float]:
    """Median per-call time of each function, timed in round-robin blocks so all see the same machine load.

    Each round runs every function ``block + 1`` times in a row and times the last
    ``block`` calls (the first warms caches and the allocator after the other
    methods). Time is this thread's CPU time (``time.thread_time``): with one
    torch thread it is the work done, and other processes on a shared machine do
    not inflate it.
    """
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            fn()
            for _ in range(block):
                t0 = time.thread_time()
                fn()
                times[name].append(time.thread_time() - t0)
    return {name: statistics.median(ts) * 1e6 for name, ts in times.items()}


def bench(vocab: int, batch: int, rounds: int, k: int, seed: int = 0) -> dict[str, float]:
    """Median microseconds per sampling step of each method on one ``[batch, vocab]`` logits tensor."""
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn(batch, vocab, generator=gen) * 3.0  # [B, V], LM-like spread of logits
    sampler = PowerLawSampler()
    rng = np.random.default_rng(seed)

    def plain():
        return torch.multinomial(torch.softmax(logits, -1), 1, generator=gen)  # [B, 1]

    def plain_cdf():
        u = torch.from_numpy(rng.random((batch, 1), dtype=np.float32))  # [B, 1]
        return draw_token_ids(torch.softmax(logits, -1), u)[0]  # [B, 1]

    def top_k():
        vals, idx = torch.topk(logits, k, dim=-1)  # [B, k]
        return idx.gather(1, torch.multinomial(torch.softmax(vals, -1), 1, generator=gen))  # [B, 1]

    def power_law():
        return sampler.sample(logits, rng).token_ids  # [B]

    fns = {"plain": plain, "plain-cdf": plain_cdf, "top-k": top_k, "power-law": power_law}
    return _interleaved_median_us(fns, rounds)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--vocab", type=positive_int, default=49152, help="vocabulary size V (default 49152)"
    )
    parser.add_argument(
        "--batch", type=positive_int, nargs="+", default=[1, 16], help="batch sizes (default 1 16)"
    )
    parser.add_argument(
        "--rounds",
        type=positive_int,
        default=30,
        help="round-robin rounds of 10 timed steps per method (default 30)",
    )
    parser.add_argument(
        "--k", type=positive_int, default=50, help="k of the top-k baseline (default 50)"
    )
    parser.add_argument("--threads", type=positive_int, default=1, help="torch threads (default 1)")
    parser.add_argument("--fast", action="store_true", help="tiny run for a smoke test")
    args = parser.parse_args()
    if args.k > args.vocab:
        parser.error(f"--k must be at most --vocab ({args.vocab}), got {args.k}")
    if args.fast:
        args.rounds = 1
    torch.set_num_threads(args.threads)
    print(
        f"torch {torch.__version__}, threads={torch.get_num_threads()}, V={args.vocab}, k={args.k}, "
        f"median thread-CPU time per step, {args.rounds} interleaved rounds of 10 steps"
    )
    cols = ("plain", "plain-cdf", "top-k", "power-law")
    print(
        f"{'batch':>5} | "
        + " | ".join(f"{c + ' µs':>12}" for c in cols)
        + " | PL / top-k | PL / plain-cdf"
    )
    print("-" * 95)
    for b in args.batch:
        t = bench(args.vocab, b, args.rounds, args.k)
        print(
            f"{b:>5} | "
            + " | ".join(f"{t[c]:>12.0f}" for c in cols)
            + f" | {t['power-law'] / t['top-k']:>9.2f}× | {t['power-law'] / t['plain-cdf']:>13.2f}×"
        )


if __name__ == "__main__":
    main()
