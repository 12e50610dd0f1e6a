"""One masked sampling round of N particles: per-particle masked log-softmax vs the mask in the batched read (not a test).

The hard constraint's proposal (observe ``mask_dist``, then sample the next token)
draws each particle's token from the LM row restricted to the pending mask and
renormalised. ``old`` is what the DSL did before: a ``masked_fill(-inf)`` and a
``log_softmax`` per particle, then the batched draw (``serve_rows`` "sample", whose
``exp`` then meets the ``-inf`` entries). ``new`` passes the masks to the batched
draw (``serve_rows`` "sample_in": one ``[N, V]`` computation, finite ``exp``, mask
multiply). Rows are SmolLM2-135M's next-token log-probs after a few prompts; masks are
``max_word_length(5)``'s for a few trailing words. Both are timed interleaved in one
process (CPU clock, one torch thread), best and median of ``--repeats``; the script
first checks that both give the same ids for the same uniforms::

    .venv/bin/python benchmarks/bench_masked_rows.py --particles 16 64 --repeats 25
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _args import positive_int  # noqa: E402

PROMPTS = ["The Fed says", "The Fed says the", "Once upon a time", "In 2024 the", "He said that"]
TEXTS = ["The Fed says", "The Fed sa", "abc", "abcde"]  # trailing words of 0, 2, 3, 5 letters


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--particles", type=positive_int, nargs="+", default=[16, 64])
    ap.add_argument("--repeats", type=positive_int, default=25)
    ap.add_argument("--threads", type=positive_int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)

    from llamppl import CachedCausalLM
    from llamppl.models import max_word_length
    from llamppl.row_sampling import serve_rows

    lm = CachedCausalLM.default()
    base = [lm.next_token_logprobs_sync(lm.encode(p)) for p in PROMPTS]
    constraint = max_word_length(5)
    base_masks = [constraint.allowed_mask(lm, t) for t in TEXTS]
    print(f"torch {torch.__version__}, {torch.get_num_threads()} thread(s), V = {lm.vocab_size}")
    for n in args.particles:
        rows = [base[i % len(base)].clone() for i in range(n)]
        masks = [base_masks[i % len(base_masks)] for i in range(n)]

        def old(rows=rows, masks=masks):
            rng = np.random.default_rng(0)
            lsm = [torch.log_softmax(r.masked_fill(~m, -math.inf), -1) for r, m in zip(rows, masks)]
            return serve_rows([("sample", row, rng) for row in lsm])

        def new(rows=rows, masks=masks):
            rng = np.random.default_rng(0)
            return serve_rows([("sample_in", r, (rng, m)) for r, m in zip(rows, masks)])

        a, b = old(), new()
        if [i for i, _ in a] != [i for i, _ in b]:
            raise SystemExit("old and new drew different ids for the same uniforms")
        times: dict[str, list[float]] = {"old": [], "new": []}
        for _ in range(args.repeats):
            for name, fn in (("old", old), ("new", new)):
                t0 = time.process_time()
                fn()
                times[name].append(time.process_time() - t0)
        best = {k: min(v) * 1e3 for k, v in times.items()}
        med = {k: statistics.median(v) * 1e3 for k, v in times.items()}
        print(
            f"N={n:>3}: old {best['old']:6.1f} ms (median {med['old']:6.1f}), "
            f"new {best['new']:6.1f} ms (median {med['new']:6.1f}); "
            f"best {best['old'] / best['new']:.2f}x, median {med['old'] / med['new']:.2f}x; same ids"
        )


if __name__ == "__main__":
    main()
