"""Power sampling on the embedded SmolLM2: plain vs low temperature vs Power-SMC vs MH.

All four sample a continuation of the same arithmetic word question (as a chat
prompt). Plain sampling draws from p(y|x); low temperature draws each token from
p(·)^α renormalised, which is not the sequence-level target; Power-SMC (`power_smc`)
and MH power sampling (Karan & Du 2025) both target π_α(y|x) ∝ p(y|x)^α. For each
the script prints the output, its log-likelihood under the base model (total and per
token), the wall time, and the transformer forwards it needed.

    python examples/power_sampling.py --alpha 4 --particles 16 --max-tokens 48
    python examples/power_sampling.py --fast      # a few tokens, for a CI smoke test
"""

from __future__ import annotations

import argparse
import time

from llamppl import CachedCausalLM, run
from llamppl.models import low_temperature_decode, mh_power_sampling, power_smc

QUESTION = (
    "Tom has 7 apples and buys 5 more. How many apples does Tom have now? Answer with a number."
)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--question", default=QUESTION, help="the question asked (chat template)")
    parser.add_argument("--alpha", type=float, default=4.0, help="power α >= 1")
    parser.add_argument("--particles", type=int, default=16, help="N, Power-SMC particles")
    parser.add_argument("--max-tokens", type=int, default=48, help="T_max, tokens per output")
    parser.add_argument(
        "--ramp-tokens", type=int, default=8, help="Power-SMC α-ramp length (0: off)"
    )
    parser.add_argument("--mh-block-size", type=int, default=6, help="B, MH block length")
    parser.add_argument("--mh-steps", type=int, default=5, help="M, MH moves per block")
    parser.add_argument("--seed", type=int, default=0, help="random seed of the run")
    parser.add_argument("--fast", action="store_true", help="tiny settings for a smoke test")
    args = parser.parse_args()
    if args.fast:
        args.particles, args.max_tokens, args.ramp_tokens = 4, 6, 2
        args.mh_block_size, args.mh_steps = 3, 2

    lm = CachedCausalLM.default()
    messages = [{"role": "user", "content": args.question}]
    prompt = lm.apply_chat_template(messages)  # token ids: the chat template + generation prompt
    a, t, s = args.alpha, args.max_tokens, args.seed
    methods = {
        "plain sampling (τ = 1)": low_temperature_decode(lm, prompt, 1.0, t, seed=s),
        f"low temperature (τ = 1/{a:g})": low_temperature_decode(lm, prompt, a, t, seed=s),
        f"Power-SMC (N = {args.particles}, α = {a:g})": power_smc(
            lm, prompt, a, args.particles, 0.5, args.ramp_tokens, t, seed=s, progress=False
        ),
        f"MH power sampling (B = {args.mh_block_size}, M = {args.mh_steps})": mh_power_sampling(
            lm, prompt, a, args.mh_block_size, args.mh_steps, t, seed=s
        ),
    }
    print(f"Q: {args.question}\n")
    for name, coroutine in methods.items():
        lm.clear_cache()
        forwards = lm.stats.forward_calls
        t0 = time.perf_counter()
        out = run(coroutine)
        elapsed = time.perf_counter() - t0
        print(f"== {name}")
        print(f"   output: {out.text.strip()!r}")
        print(
            f"   log p(y|x) = {out.log_likelihood:.2f} over {len(out.tokens)} tokens "
            f"({out.mean_log_likelihood:.3f} per token); {elapsed:.1f} s, "
            f"{lm.stats.forward_calls - forwards} forwards"
        )
        if hasattr(out, "result"):
            r = out.result
            print(
                f"   log Ẑ_α = {r.log_ml:.2f}, resampled at {sum(h.resampled for h in r.history)} of {len(r.history)} steps"
            )
        if hasattr(out, "acceptance_rate"):
            print(f"   {out.n_moves} MH moves, acceptance rate {out.acceptance_rate:.2f}")


if __name__ == "__main__":
    main()
