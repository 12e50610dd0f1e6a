"""SMC speculative decoding sweep: draft × draft temperature × N against plain sampling.

Target: the embedded SmolLM2-135M (30 decoder layers). Drafts share the target's
weights: ``first:L`` keeps its first L layers (``truncated_draft``, an early exit) and
``skip:A+B`` its first A and last B layers (``skip_middle_draft``). For each draft the
script first prints its mean next-token total variation from the target over the
positions of a fixed text (0 when the draft is the target). For every (draft, draft
temperature τ, N) it runs ``speculative_smc`` (K draft tokens per round) on a few seeds
and reports the mean ESS per round (before resampling; N when the draft equals the
target), the smallest round ESS, mean log Ẑ (Ẑ is unbiased for Z = 1; far below 0 means
the weights degenerate), process CPU time and tokens per CPU second of the returned
output, next to plain autoregressive sampling from the target (``low_temperature_decode``
at τ = 1) in the same process, alternating runs. CPU time rather than wall time: with one
torch thread it barely depends on the machine's load. It ends with the setting of best
tokens per second (as a ratio to plain) among those keeping mean ESS >= N/2 and mean
log Ẑ >= ``--min-log-z-per-token`` (−0.25) per generated token (the example's defaults).
The log Ẑ floor matters: a draft far from the target keeps ESS high after every
resampling (the particles are equally poor) while log Ẑ shows the damage.

    python benchmarks/bench_speculative.py --max-tokens 16 --seeds 2
    python benchmarks/bench_speculative.py --drafts first:24 skip:12+12 --particles 4 8
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch
from _args import positive_float, positive_int  # noqa: E402

from llamppl import CachedCausalLM, run
from llamppl.models import (
    low_temperature_decode,
    skip_middle_draft,
    speculative_smc,
    truncated_draft,
)

PROMPT = "Once upon a time, there was a"
TV_TEXT = (
    "Once upon a time, there was a little girl who lived in a village near the forest. "
    "She loved to walk among the trees and listen to the birds."
)


def make_draft(target, spec: str):
    """``first:L`` -> truncated_draft(target, L); ``skip:A+B`` -> skip_middle_draft(target, A, B)."""
    kind, _, arg = spec.partition(":")
    try:
        if kind == "first":
            return truncated_draft(target, int(arg))
        if kind == "skip":
            first, _, last = arg.partition("+")
            return skip_middle_draft(target, int(first), int(last))
    except ValueError as e:
        raise SystemExit(f"--drafts {spec!r}: {e}") from None
    raise SystemExit(f"--drafts entries must look like first:24 or skip:12+12, got {spec!r}")


def next_token_tv(target, draft) -> float:
    """Mean total variation between the two LMs' next-token distributions over ``TV_TEXT``."""
    ids = torch.tensor([target.tokenizer.encode(TV_TEXT)])
    with torch.inference_mode():
        p, q = (
            torch.softmax(lm.model(ids, use_cache=False).logits[0].float(), -1)
            for lm in (target, draft)
        )
    return float(0.5 * (p - q).abs().sum(-1).mean())


def run_smc(target, draft, n, k, temp, max_tokens, seed) -> dict:
    target.clear_cache()
    draft.clear_cache()
    c0 = time.process_time()
    out = run(
        speculative_smc(
            target, draft, PROMPT, n_particles=n, k=k, max_tokens=max_tokens, seed=seed,
            draft_temp=temp, progress=False,
        )
    )  # fmt: skip
    cpu = time.process_time() - c0
    ess = [h.ess for h in out.result.history]
    return dict(
        ess=float(np.mean(ess)),
        min_ess=float(np.min(ess)),
        log_z=out.result.log_ml,
        cpu=cpu,
        tokens=len(out.tokens),
        text=out.text,
    )


def run_plain(target, max_tokens, seed) -> tuple[float, int]:
    """(process CPU seconds, tokens) of plain sampling from the target."""
    target.clear_cache()
    c0 = time.process_time()
    out = run(low_temperature_decode(target, PROMPT, 1.0, max_tokens, seed=seed))
    return time.process_time() - c0, len(out.tokens)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--drafts", nargs="+", default=["first:24", "skip:12+12", "skip:13+13"],
        help="first:L (first L layers) or skip:A+B (first A and last B layers)",
    )  # fmt: skip
    parser.add_argument("--temps", type=positive_float, nargs="+", default=[1.0, 1.5])
    parser.add_argument("--particles", type=positive_int, nargs="+", default=[4, 8, 16])
    parser.add_argument("--k", type=positive_int, default=4, help="K, draft tokens per round")
    parser.add_argument("--max-tokens", type=positive_int, default=16)
    parser.add_argument("--seeds", type=positive_int, default=2, help="runs per setting")
    parser.add_argument(
        "--min-log-z-per-token", type=float, default=-0.25,
        help="quality floor of the best setting: mean log Z-hat per generated token",
    )  # fmt: skip
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
    drafts = {spec: make_draft(target, spec) for spec in args.drafts}
    print(
        f"torch {torch.__version__}, threads = {torch.get_num_threads()}; target SmolLM2-135M "
        f"({total} layers), K = {args.k}, max tokens = {args.max_tokens}, seeds = {args.seeds}"
    )
    seeds = range(args.seeds)
    run_plain(target, 2, 0)  # warm-up
    for spec, draft in drafts.items():
        print(
            f"draft {spec}: {draft.model.config.num_hidden_layers} layers, "
            f"next-token TV from the target {next_token_tv(target, draft):.3f}"
        )

    header = f"{'draft':>11}{'temp':>6}{'N':>4}{'mean ESS':>10}{'ESS/N':>7}{'min ESS':>9}{'log Z':>8}{'cpu s':>8}{'tok/s':>7}{'plain':>7}{'ratio':>7}"
    print(header)
    print("-" * len(header))
    rows = []
    for spec, draft in drafts.items():
        for temp in args.temps:
            for n in args.particles:
                rs, plain = [], []
                for s in seeds:  # plain and SMC-SD alternate, so both see the same machine load
                    plain.append(run_plain(target, args.max_tokens, s))
                    rs.append(run_smc(target, draft, n, args.k, temp, args.max_tokens, s))
                tps = sum(r["tokens"] for r in rs) / sum(r["cpu"] for r in rs)
                plain_tps = sum(t for _, t in plain) / sum(w for w, _ in plain)
                row = dict(
                    draft=spec,
                    temp=temp,
                    n=n,
                    ess=float(np.mean([r["ess"] for r in rs])),
                    min_ess=min(r["min_ess"] for r in rs),
                    log_z=float(np.mean([r["log_z"] for r in rs])),
                    cpu=float(np.mean([r["cpu"] for r in rs])),
                    tps=tps,
                    ratio=tps / plain_tps,
                    text=rs[0]["text"],
                )
                rows.append(row)
                print(
                    f"{spec:>11}{temp:>6.1f}{n:>4}{row['ess']:>10.2f}{row['ess'] / n:>7.2f}"
                    f"{row['min_ess']:>9.2f}{row['log_z']:>8.2f}{row['cpu']:>8.2f}"
                    f"{tps:>7.1f}{plain_tps:>7.1f}{row['ratio']:>7.2f}"
                )
    print("tok/s: tokens of the returned output per process-CPU second (one torch thread, so")
    print("machine load barely moves it); plain: the same for plain sampling from the target;")
    print("ratio: SMC-SD tokens/s over plain tokens/s, measured alternately on the same seeds.")
    floor = args.min_log_z_per_token * args.max_tokens  # E[Ẑ] = Z = 1, so E[log Ẑ] <= 0 (Jensen)
    ok = [r for r in rows if r["ess"] >= r["n"] / 2 and r["log_z"] >= floor]
    if ok:
        best = max(ok, key=lambda r: r["ratio"])
        print(
            f"\nbest tokens/s with mean ESS >= N/2 and mean log Z >= {floor:.1f}: "
            f"draft {best['draft']}, temp {best['temp']}, "
            f"N {best['n']} ({best['tps']:.1f} tok/s, {best['ratio']:.2f}x plain); "
            f"output {best['text']!r}"
        )
    else:
        print(f"\nno setting kept mean ESS >= N/2 and mean log Z >= {floor:.1f}")


if __name__ == "__main__":
    main()
