"""Prompt intersection: one continuation that is likely after two different prompts.

The LLaMPPL paper's prompt-intersection example (§2.2, Figures 1, 2 and 4): the
target is the product of experts P(s) ∝ P(s | prompt 1) P(s | prompt 2). With
"My favorite writer is probably" and "My favorite physicist is probably", good
answers name someone who is both (a physicist who wrote books). Runs both
Feynman–Kac models — proposing from the first prompt and observing the second
(`first`), and the locally optimal product proposal with its normaliser as
potential (`product`) — and prints samples, weights and log Ẑ; the product
proposal usually reaches a higher log Ẑ. Strings end after one sentence.

    python examples/prompt_intersection.py --particles 8 --beam 3 --max-tokens 16
"""

from __future__ import annotations

import argparse
import re

from llamppl import CachedCausalLM, run
from llamppl.inference import smc_steer
from llamppl.models import PromptIntersection

ANSWER_WORD = re.compile(r"\s*[^\W\d_]{2,}")  # a word of two or more Unicode letters first

PROMPTS = ["My favorite writer is probably", "My favorite physicist is probably"]


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--prompts", nargs="+", default=PROMPTS, help="two or more prompts")
    parser.add_argument("--particles", type=int, default=8, help="N, particles kept per step")
    parser.add_argument("--beam", type=int, default=3, help="K, extensions per particle")
    parser.add_argument("--max-tokens", type=int, default=16, help="tokens per answer at most")
    parser.add_argument(
        "--proposal",
        choices=["both", "first", "product"],
        default="both",
        help="Feynman–Kac formulation(s) to run",
    )
    parser.add_argument("--seed", type=int, default=0, help="random seed of the run")
    args = parser.parse_args()

    lm = CachedCausalLM.default()
    print("Prompts: " + " | ".join(repr(p) for p in args.prompts))
    proposals = ["first", "product"] if args.proposal == "both" else [args.proposal]
    for proposal in proposals:
        model = PromptIntersection(
            lm,
            args.prompts,
            proposal=proposal,
            max_tokens=args.max_tokens,
            stop_strings=(".", "!", "?", "\n"),
        )
        result = run(smc_steer(model, args.particles, args.beam, seed=args.seed, progress=False))
        print(f"\nproposal={proposal!r}, N={args.particles}, K={args.beam}:")
        for particle, weight in sorted(
            zip(result.particles, result.weights), key=lambda pw: -pw[1]
        ):
            if weight > 0:
                print(f"  weight {weight:6.3f}  {str(particle)!r}")
        print(f"  log Z estimate: {result.log_ml:.3f}   ({result.stats['time_s']:.1f}s)")
        answers = [str(p) for p, w in zip(result.particles, result.weights) if w > 0]
        words = [a for a in answers if ANSWER_WORD.match(a)]
        print(f"  answers that start with a word: {len(words)}/{len(answers)}")
        if not words:
            print(
                "  (this 135M model puts its mass on initials, titles and punctuation after these "
                "prompts; try other --prompts or more --max-tokens)"
            )


if __name__ == "__main__":
    main()
