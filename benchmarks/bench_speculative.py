"""SMC speculative decoding sweep: draft depth × draft temperature × N against plain sampling.

Target: the embedded SmolLM2-135M (30 decoder layers). Drafts: the target cut after
its first L layers (``truncated_draft``). For every (L, draft temperature τ, N) the
script runs ``speculative_smc`` (K draft tokens per round) on a few seeds and reports
the mean ESS per round (before resampling; N when the draft equals the target), the
smallest round ESS, mean log Ẑ (Ẑ is unbiased for Z = 1; far below 0 means the weights
degenerate), wall time and tokens per second of the returned output, next to plain
autoregressive sampling from the target (``low_temperature_decode`` at τ = 1) in the
same process (alternating runs, so both see the same load; the ratio is the figure to
read on a shared machine). It ends with the setting of best tokens per second (as a
ratio to plain) among those keeping
mean ESS >= N/2 (the example's defaults).

    python benchmarks/bench_speculative.py --max-tokens 16 --seeds 2
"""

from __future__ import annotations

import argparse
import math
import time

import numpy as np
import torch
from _args import positive_float, positive_int  # noqa: E402

from llamppl import CachedCausalLM, run
from llamppl.models import low_temperature_decode, speculative_smc, truncated_draft

PROMPT = "Once upon a time, there was a"


def run_smc(target, draft, n, k, temp, max_tokens, seed) -> dict:
    target.clear_cache()
    draft.clear_cache()
    t0 = time.perf_counter()
    out = run(
        speculative_smc(
            target, draft, PROMPT, n_particles=n, k=k, max_tokens=max_tokens, seed=seed,
            draft_temp=temp, progress=False,
        )
    )  # fmt: skip
    wall = time.perf_counter() - t0
    ess = [h.ess for h in out.result.history]
    return dict(
        ess=float(np.mean(ess)),
        min_ess=float(np.min(ess)),
        log_z=out.result.log_ml,
        wall=wall,
        tokens=len(out.tokens),
        text=out.text,
    )


def run_plain(target, max_tokens, seed) -> tuple[float, int]:
    target.clear_cache()
    t0 = time.perf_counter()
    out = run(low_temperature_decode(target, PROMPT, 1.0, max_tokens, seed=seed))
    return time.perf_counter() - t0, len(out.tokens)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--layers", type=positive_int, nargs="+", default=[6, 12, 18, 24])
    parser.add_argument("--temps", type=positive_float, nargs="+", default=[1.0, 1.5])
    parser.add_argument("--particles", type=positive_int, nargs="+", default=[4, 8, 16])
    parser.add_argument("--k", type=positive_int, default=4, help="K, draft tokens per round")
    parser.add_argument("--max-tokens", type=positive_int, default=16)
    parser.add_argument("--seeds", type=positive_int, default=2, help="runs per setting")
    parser.add_argument(
        "--threads",
        type=positive_int,
        default=None,
        help="torch threads (default: llamppl's choice)",
    )
    args = parser.parse_args()
    if args.threads is not None:  # else llamppl.threads picks at the first load
        torch.set_num_threads(args.threads)
    target = CachedCausalLM.default()
    total = target.model.config.num_hidden_layers
    bad = [n for n in args.layers if n > total]
    if bad:
        parser.error(f"--layers must lie in [1, {total}] for this model, got {bad}")
    print(
        f"torch {torch.__version__}, threads = {torch.get_num_threads()}; target SmolLM2-135M "
        f"({total} layers), K = {args.k}, max tokens = {args.max_tokens}, seeds = {args.seeds}"
    )
    seeds = range(args.seeds)
    run_plain(target, 2, 0)  # warm-up

    header = f"{'layers':>6}{'temp':>6}{'N':>4}{'mean ESS':>10}{'ESS/N':>7}{'min ESS':>9}{'log Z':>8}{'wall s':>8}{'tok/s':>7}{'plain':>7}{'ratio':>7}"
    print(header)
    print("-" * len(header))
    rows = []
    for layers in args.layers:
        draft = truncated_draft(target, layers)
        for temp in args.temps:
            for n in args.particles:
                rs, plain = [], []
                for s in seeds:  # plain and SMC-SD alternate, so both see the same machine load
                    plain.append(run_plain(target, args.max_tokens, s))
                    rs.append(run_smc(target, draft, n, args.k, temp, args.max_tokens, s))
                tps = sum(r["tokens"] for r in rs) / sum(r["wall"] for r in rs)
                plain_tps = sum(t for _, t in plain) / sum(w for w, _ in plain)
                row = dict(
                    layers=layers,
                    temp=temp,
                    n=n,
                    ess=float(np.mean([r["ess"] for r in rs])),
                    min_ess=min(r["min_ess"] for r in rs),
                    log_z=float(np.mean([r["log_z"] for r in rs])),
                    wall=float(np.mean([r["wall"] for r in rs])),
                    tps=tps,
                    ratio=tps / plain_tps,
                    text=rs[0]["text"],
                )
                rows.append(row)
                print(
                    f"{layers:>6}{temp:>6.1f}{n:>4}{row['ess']:>10.2f}{row['ess'] / n:>7.2f}"
                    f"{row['min_ess']:>9.2f}{row['log_z']:>8.2f}{row['wall']:>8.2f}"
                    f"{tps:>7.1f}{plain_tps:>7.1f}{row['ratio']:>7.2f}"
                )
    print("tok/s: tokens of the returned output per second; plain: the same for plain sampling;")
    print("ratio: SMC-SD tokens/s over plain tokens/s, measured alternately on the same seeds.")
    ok = [r for r in rows if r["ess"] >= r["n"] / 2 and math.isfinite(r["log_z"])]
    if ok:
        best = max(ok, key=lambda r: r["ratio"])
        print(
            f"\nbest tokens/s with mean ESS >= N/2: layers {best['layers']}, temp {best['temp']}, "
            f"N {best['n']} ({best['tps']:.1f} tok/s, {best['ratio']:.2f}x plain); "
            f"output {best['text']!r}"
        )
    else:
        print("\nno setting kept mean ESS >= N/2")


if __name__ == "__main__":
    main()
