"""Quickstart: steer the embedded SmolLM2 so that no word is longer than five letters.

A ten-line model (the hard-constraint example of the LLaMPPL paper) run with
SMC steering (`smc_steer`, Algorithm 1). Each `step` samples one token from the
LM and conditions on the constraint; SMC keeps the particles that can still
satisfy it. Prints every particle with its normalised weight and log Z.

    python examples/quickstart.py --particles 16 --beam 3 --max-tokens 30
"""

from __future__ import annotations

import argparse
import re

from llamppl import CachedCausalLM, LMContext, Model, run
from llamppl.inference import smc_steer


class NoLongWords(Model):
    def __init__(self, lm, prompt: str, max_letters: int = 5, max_tokens: int = 30):
        super().__init__()
        self.context = LMContext(lm, prompt)
        self.max_letters, self.max_tokens = max_letters, max_tokens

    async def step(self):
        token = await self.sample(self.context.next_token())
        words = re.findall(r"[A-Za-z]+", str(self.context))
        self.condition(all(len(w) <= self.max_letters for w in words))
        if token in self.context.lm.eos_token_ids or len(self.context.generated) >= self.max_tokens:
            self.finish()


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--prompt", default="The Fed says", help="text to continue")
    parser.add_argument("--particles", type=int, default=16, help="N, particles kept per step")
    parser.add_argument("--beam", type=int, default=3, help="K, extensions per particle")
    parser.add_argument("--max-tokens", type=int, default=30, help="tokens per particle at most")
    parser.add_argument("--max-letters", type=int, default=5, help="longest allowed word")
    parser.add_argument("--seed", type=int, default=0, help="random seed of the run")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    args = parser.parse_args()

    lm = CachedCausalLM.default()
    model = NoLongWords(lm, args.prompt, args.max_letters, args.max_tokens)
    result = run(
        smc_steer(
            model,
            args.particles,
            args.beam,
            seed=args.seed,
            progress=False if args.no_progress else None,
        )
    )

    print(f"\nPrompt: {args.prompt!r}   (no word longer than {args.max_letters} letters)")
    for particle, weight in sorted(zip(result.particles, result.weights), key=lambda pw: -pw[1]):
        print(f"  weight {weight:6.3f}  {args.prompt + str(particle.context)!r}")
    print(f"log Z estimate: {result.log_ml:.3f}")
    s = result.stats
    print(
        f"{s['steps']} steps in {s['time_s']:.1f}s: {s['forward_calls']} forward calls, {s['tokens_run']} tokens run"
    )


if __name__ == "__main__":
    main()
