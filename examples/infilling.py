"""Infilling: fill the [BLANK]s of a template with text the LM finds likely.

The LLaMPPL paper's infilling example (§2.2). Each step appends a hole of a
Geometric(1/2) number of sampled tokens, then the next known fragment; the
potential 2^{|h|+1} ∏ p(fragment tokens) corrects the length prior and scores
how well the hole explains the fragment. With `--no-correction` the geometric
law stays in the target as a prior favouring short holes. Prints samples,
their weights and log Ẑ.

    python examples/infilling.py --particles 8 --beam 3
"""

from __future__ import annotations

import argparse

from llamppl import CachedCausalLM, run
from llamppl.inference import smc_steer
from llamppl.models import Infilling

TEMPLATE = "To tell the truth, every[BLANK] he[BLANK] to[BLANK] another[BLANK]."


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--template", default=TEMPLATE, help="text with [BLANK] markers")
    parser.add_argument("--particles", type=int, default=8, help="N, particles kept per step")
    parser.add_argument("--beam", type=int, default=3, help="K, extensions per particle")
    parser.add_argument("--geometric-p", type=float, default=0.5, help="hole length ~ Geometric(p)")
    parser.add_argument(
        "--max-hole-tokens", type=int, default=None, help="truncate hole lengths (None: no limit)"
    )
    parser.add_argument(
        "--no-correction", action="store_true", help="drop 2^{|h|+1}: prior on short holes"
    )
    parser.add_argument("--seed", type=int, default=0, help="random seed of the run")
    args = parser.parse_args()

    lm = CachedCausalLM.default()
    model = Infilling.from_template(
        lm,
        args.template,
        geometric_p=args.geometric_p,
        length_correction=not args.no_correction,
        max_hole_tokens=args.max_hole_tokens,
    )
    result = run(smc_steer(model, args.particles, args.beam, seed=args.seed, progress=False))

    print(f"Template: {args.template!r}")
    print(
        f"SMC steering, N={args.particles}, K={args.beam}, correction={'off' if args.no_correction else 'on'}:"
    )
    for particle, weight in sorted(zip(result.particles, result.weights), key=lambda pw: -pw[1]):
        if weight > 0:
            print(f"  weight {weight:6.3f}  {str(particle)!r}   holes={particle.holes}")
    print(f"log Z estimate: {result.log_ml:.3f}   ({result.stats['time_s']:.1f}s)")


if __name__ == "__main__":
    main()
