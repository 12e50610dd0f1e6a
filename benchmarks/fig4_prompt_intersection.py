"""Figure 4 of the LLaMPPL paper: E[log Ẑ] of SMC steering on prompt intersection, two proposals.

Task (paper §3, Figure 4): intersect "My favorite writer is probably" and
"My favorite physicist is probably", stopping after one sentence. For
N in {1, 2, 4, 8} particles and K = 3 extensions, run `smc_steer` 10 times on
each Feynman–Kac model — `first` (propose from the first prompt, observe the
second) and `product` (locally optimal product proposal, G' = Σ_w p_1(w) p_2(w))
— and report the mean log Ẑ with its standard error. Both models have the same
Z, and E[log Ẑ] <= log Z (Jensen), so a higher mean log Ẑ means a tighter
bound and a better sampler. Writes a Markdown table and a PNG to
`benchmarks/out/`, with the posterior-weighted length of the generated
sentences as a diagnostic.

Measured on the embedded SmolLM2-135M (see `out/fig4_prompt_intersection.md`):
log Ẑ rises with N for both models, but unlike the paper's LLaMA-7B figure the
`first` proposal scores higher at every N. Z is dominated by very short
sentences, which the first prompt's LM proposes at its own stopping rate; the
product proposal sharpens towards tokens both prompts agree on and writes
longer sentences (about twice as many tokens at N = 1, 2), whose weights are
smaller.

    python benchmarks/fig4_prompt_intersection.py            # full study (~5 min on 2 cores)
    python benchmarks/fig4_prompt_intersection.py --quick    # smoke run
"""

from __future__ import annotations

import argparse
import math
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from _args import positive_int  # noqa: E402

from llamppl import CachedCausalLM, run
from llamppl.inference import smc_steer
from llamppl.models import PromptIntersection

PROMPTS = ["My favorite writer is probably", "My favorite physicist is probably"]
PROPOSALS = ("first", "product")
OUT = Path(__file__).resolve().parent / "out"


def study(lm, particles: list[int], runs: int, beam: int, max_tokens: int) -> dict:
    """{(proposal, N): Row}; run r uses seed r for both proposals."""
    out = {}
    for n in particles:
        for proposal in PROPOSALS:
            log_z, seconds, lengths = [], [], []
            for seed in range(runs):
                model = PromptIntersection(
                    lm,
                    PROMPTS,
                    proposal=proposal,
                    max_tokens=max_tokens,
                    stop_strings=(".", "!", "?", "\n"),
                )
                t0 = time.perf_counter()
                result = run(smc_steer(model, n, beam, seed=seed, progress=False))
                seconds.append(time.perf_counter() - t0)
                log_z.append(result.log_ml)
                sizes = [len(p.contexts[0].generated) for p in result.particles]
                lengths.append(
                    float(np.dot(result.weights, sizes)) if result.log_ml > -math.inf else math.nan
                )
            out[proposal, n] = Row(
                np.array(log_z), float(np.mean(seconds)), float(np.nanmean(lengths))
            )
            print(
                f"  N={n:2d} {proposal:8s} mean log Z = {np.mean(log_z):8.3f}  "
                f"mean length {np.nanmean(lengths):5.1f}  ({np.mean(seconds):.1f}s/run)",
                flush=True,
            )
    return out


@dataclass
class Row:
    log_z: np.ndarray  # (runs,) log Ẑ of each run
    seconds: float  # mean wall time per run
    length: float  # mean over runs of the weighted mean generated length (tokens)


def mean_se(x: np.ndarray) -> tuple[float, float]:
    if np.isneginf(x).any():
        return -math.inf, math.nan
    return float(x.mean()), float(x.std(ddof=1) / math.sqrt(len(x))) if len(x) > 1 else math.nan


def table(results: dict, particles: list[int], runs: int, beam: int) -> str:
    lines = [
        f"Mean log Ẑ over {runs} runs of smc_steer (K={beam}) ± standard error; "
        f"prompts {PROMPTS[0]!r} ∩ {PROMPTS[1]!r}, one sentence. "
        "Length: posterior-weighted generated tokens, averaged over runs.",
        "",
        "| N | first: mean log Ẑ | product: mean log Ẑ | product − first "
        "| length first | length product | s/run first | s/run product | time ratio product/first |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for n in particles:
        f, p = results["first", n], results["product", n]
        (mf, sf), (mp, sp) = mean_se(f.log_z), mean_se(p.log_z)
        lines.append(
            f"| {n} | {mf:.3f} ± {sf:.3f} | {mp:.3f} ± {sp:.3f} | {mp - mf:+.3f} "
            f"| {f.length:.1f} | {p.length:.1f} | {f.seconds:.2f} | {p.seconds:.2f} | {p.seconds / f.seconds:.2f} |"
        )
    return "\n".join(lines)


def plot(results: dict, particles: list[int], path: Path, beam: int) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5, 3.6))
    for proposal, label in (("first", "proposal from prompt 1"), ("product", "product proposal")):
        stats = [mean_se(results[proposal, n].log_z) for n in particles]
        ax.errorbar(
            particles,
            [m for m, _ in stats],
            yerr=[s for _, s in stats],
            marker="o",
            capsize=3,
            label=label,
        )
    ax.set_xscale("log", base=2)
    ax.set_xticks(particles, [str(n) for n in particles])
    ax.set_xlabel("particles N")
    ax.set_ylabel("mean log Ẑ")
    ax.set_title(f"Prompt intersection, smc_steer K={beam}")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="3 runs, N in {1, 2}, 6 tokens")
    parser.add_argument("--runs", type=positive_int, default=10)
    parser.add_argument("--particles", type=positive_int, nargs="+", default=[1, 2, 4, 8])
    parser.add_argument("--beam", type=positive_int, default=3, help="K, extensions per particle")
    parser.add_argument("--max-tokens", type=positive_int, default=16)
    parser.add_argument(
        "--threads",
        type=positive_int,
        default=None,
        help="torch threads (default: llamppl's choice)",
    )
    parser.add_argument("--out", type=Path, default=OUT, help="output directory")
    args = parser.parse_args()
    if args.quick:
        args.runs, args.particles, args.max_tokens = 3, [1, 2], 6

    if args.threads is not None:  # else llamppl.threads picks at the first load
        torch.set_num_threads(args.threads)
    lm = CachedCausalLM.default()
    print(f"torch threads: {torch.get_num_threads()}")
    t0 = time.perf_counter()
    results = study(lm, args.particles, args.runs, args.beam, args.max_tokens)
    text = table(results, args.particles, args.runs, args.beam)
    text += f"\n\nmax_tokens={args.max_tokens}, torch threads={torch.get_num_threads()}, total {time.perf_counter() - t0:.0f}s\n"
    print("\n" + text)
    args.out.mkdir(parents=True, exist_ok=True)
    suffix = "_quick" if args.quick else ""
    (args.out / f"fig4_prompt_intersection{suffix}.md").write_text(text)
    plot(results, args.particles, args.out / f"fig4_prompt_intersection{suffix}.png", args.beam)
    print(f"wrote {args.out / f'fig4_prompt_intersection{suffix}.md'} and .png")


if __name__ == "__main__":
    main()
