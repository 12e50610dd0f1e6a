"""Hard constraints: continue "The Fed says" with no word longer than five letters.

The LLaMPPL paper's opening example (§1, §2.2). First the plain token-masking
baseline: at each step, forbid tokens that would create a word of more than
five letters and decode greedily or sample from what is left. It never breaks
the rule, but it happily starts words such as "mortg" that can only be cut off
(the paper's "greedy dead ends"), because it cannot see ahead. Then SMC
steering on `HardConstraint`, whose potential G'_t = allowed mass penalises
such prefixes in hindsight, targeting the LM conditioned on the constraint.
Prints samples, their weights and log Ẑ for both Feynman–Kac formulations.

    python examples/hard_constraints.py --particles 8 --beam 3 --max-tokens 20
"""

from __future__ import annotations

import argparse
import math

import numpy as np
import torch

from llamppl import CachedCausalLM, LMContext, run
from llamppl.constraints import max_word_length
from llamppl.inference import smc_steer
from llamppl.models import HardConstraint
from llamppl.row_sampling import sample_index


async def token_masking(lm, prompt: str, constraint, max_tokens: int, greedy: bool, rng):
    """Plain token masking: the proposal M'_t alone, no weights (greedy or sampled).

    Returns the text and the places where the LM put most of its mass on forbidden
    tokens (forbidden mass 1 − G'_t > 1/2): the dead ends the masking walked into, each
    with the forbidden token the LM wanted most.
    """
    ctx, text, stuck = LMContext(lm, prompt), "", []
    for _ in range(max_tokens):
        log_probs = await ctx.next_token_logprobs()  # (V,)
        mask = constraint.allowed_mask(lm, text)  # (V,) bool
        allowed_mass = float(torch.logsumexp(log_probs[mask], dim=0).exp())
        if allowed_mass < 0.5:  # a dead end: most of the LM's mass is on forbidden tokens
            wanted = int(log_probs.masked_fill(mask, -math.inf).argmax())
            stuck.append(
                f"{text[-12:]!r} wanted {lm.vocab[wanted]!r} (forbidden mass {1 - allowed_mass:.2f})"
            )
        masked = log_probs.masked_fill(~mask, -math.inf)  # (V,)
        token = int(masked.argmax()) if greedy else sample_index(masked, rng)
        if token in lm.eos_token_ids:
            break
        ctx.extend(token)
        text += lm.vocab[token]
    return text, stuck


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--prompt", default="The Fed says", help="text to continue")
    parser.add_argument("--max-letters", type=int, default=5, help="longest allowed word")
    parser.add_argument("--particles", type=int, default=8, help="N, particles kept per step")
    parser.add_argument("--beam", type=int, default=3, help="K, extensions per particle")
    parser.add_argument("--max-tokens", type=int, default=20, help="tokens per sample at most")
    parser.add_argument(
        "--baseline-samples", type=int, default=3, help="sampled token-masking runs"
    )
    parser.add_argument("--seed", type=int, default=0, help="random seed of the run")
    args = parser.parse_args()

    lm = CachedCausalLM.default()
    constraint = max_word_length(args.max_letters)
    rng = np.random.default_rng(args.seed)
    print(f"Prompt: {args.prompt!r}   constraint: no word longer than {args.max_letters} letters\n")

    print(
        "Plain token masking (no weights): greedy decoding, then sampled runs. Dead ends: "
        "where over half the LM's mass was on forbidden tokens, and the token it wanted:"
    )
    for i in range(1 + args.baseline_samples):
        greedy = i == 0
        text, stuck = run(token_masking(lm, args.prompt, constraint, args.max_tokens, greedy, rng))
        print(f"  {'greedy decoding' if greedy else f'sampled run {i}'}: {args.prompt + text!r}")
        print(f"      dead ends: {'; '.join(stuck) if stuck else 'none in this run'}")

    for proposal in ("mask", "sample"):
        model = HardConstraint(
            lm, args.prompt, constraint, proposal=proposal, max_tokens=args.max_tokens
        )
        result = run(smc_steer(model, args.particles, args.beam, seed=args.seed, progress=False))
        label = "token masking + G' = allowed mass" if proposal == "mask" else "sample + condition"
        print(
            f"\nSMC steering, proposal={proposal!r} ({label}), N={args.particles}, K={args.beam}:"
        )
        for particle, weight in sorted(
            zip(result.particles, result.weights), key=lambda pw: -pw[1]
        ):
            if weight > 0:
                assert constraint(particle.text)
                print(f"  weight {weight:6.3f}  {args.prompt + str(particle)!r}")
        print(f"  log Z estimate: {result.log_ml:.3f}   ({result.stats['time_s']:.1f}s)")


if __name__ == "__main__":
    main()
