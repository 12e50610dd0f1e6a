"""Prompt intersection: one continuation that is likely after two different prompts.

The LLaMPPL paper's prompt-intersection example (§2.2, Figures 1, 2 and 4): the
target is the product of experts P(s) ∝ P(s | prompt 1) P(s | prompt 2), so good
answers fit both prompts (the paper's "My favorite writer is probably" and "My
favorite physicist is probably" ask for a physicist who wrote). The embedded
135M model answers those two prompts with initials and titles (" J.", " Dr."), so
the default prompts are two numbered lists, fruits and colours: alone, the
fruit list continues with " grape" and the colour list with " green"; their
intersection answers " orange". Runs both Feynman–Kac models — proposing from
the first prompt and observing the second (`first`), and the locally optimal
product proposal with its normaliser as potential (`product`) — and prints each
prompt's greedy answer alone, then the intersection's answers, weights and log Ẑ.
An answer ends at a line break or sentence end.

    python examples/prompt_intersection.py --particles 8 --beam 3 --max-tokens 8
    python examples/prompt_intersection.py --prompts $'Capital cities:\\n1. London\\n2. Berlin\\n3.' \\
        $'Romantic cities:\\n1. Venice\\n2. Verona\\n3.'     # alone: Sydney, Rome; both: Prague
"""

from __future__ import annotations

import argparse
import math
import re

from llamppl import CachedCausalLM, run
from llamppl.inference import smc_steer
from llamppl.models import PromptIntersection

# an answer is a word: words of two or more Unicode letters (spaces, hyphens or
# apostrophes between them), then at most the stop string that ended it
ANSWER_WORD = re.compile(r"\s*[^\W\d_]{2,}(?:[ '-][^\W\d_]+)*[.!?\n]?")

PROMPTS = ["Fruits:\n1. apple\n2. banana\n3.", "Colors:\n1. red\n2. blue\n3."]
STOP_STRINGS = (".", "!", "?", "\n")


def greedy_answer(model: PromptIntersection, i: int) -> tuple[list[int], float]:
    """The argmax continuation of prompt ``i`` alone, up to a stop token, with its log-probability."""
    lm, prompt = model.contexts[i].lm, list(model.contexts[i].tokens)
    answer: list[int] = []
    log_p = 0.0
    while model.max_tokens is None or len(answer) < model.max_tokens:
        log_probs = lm.next_token_logprobs_sync(prompt + answer)
        token = int(log_probs.argmax())
        answer.append(token)
        log_p += float(log_probs[token])
        if model.is_stop_token(token):
            break
    return answer, log_p


def log_prob_under(model: PromptIntersection, i: int, answer: list[int]) -> float:
    """log P_{x_i}(S = answer): the sum of prompt ``i``'s next-token log-probabilities."""
    lm, prompt = model.contexts[i].lm, list(model.contexts[i].tokens)
    rows = lm.batch_next_token_logprobs([prompt + answer[:t] for t in range(len(answer))])
    return sum(float(row[w]) for row, w in zip(rows, answer))


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument(
        "--prompts", nargs="+", default=PROMPTS, help="two or more prompts (bash: $'a\\nb')"
    )
    parser.add_argument("--particles", type=int, default=8, help="N, particles kept per step")
    parser.add_argument("--beam", type=int, default=3, help="K, extensions per particle")
    parser.add_argument("--max-tokens", type=int, default=8, help="tokens per answer at most")
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

    def model(proposal: str) -> PromptIntersection:
        return PromptIntersection(
            lm, args.prompts, proposal, max_tokens=args.max_tokens, stop_strings=STOP_STRINGS
        )

    alone = model("product")
    print("\nEach prompt alone (greedy answer, its probability):")
    for i, prompt in enumerate(args.prompts):
        answer, log_p = greedy_answer(alone, i)
        print(f"  greedy alone: {lm.decode(answer)!r}  p={math.exp(log_p):.2g}  {prompt!r}")

    proposals = ["first", "product"] if args.proposal == "both" else [args.proposal]
    for proposal in proposals:
        result = run(
            smc_steer(model(proposal), args.particles, args.beam, seed=args.seed, progress=False)
        )
        print(f"\nproduct of experts, proposal={proposal!r}, N={args.particles}, K={args.beam}:")
        print("  weight  answer  (probability under each prompt alone)")
        best: dict[str, list[int]] = {}
        for p in result.particles:
            best.setdefault(str(p), list(p.contexts[0].generated))
        for text, weight in result.posterior.items():
            probs = [
                math.exp(log_prob_under(alone, i, best[text])) for i in range(len(args.prompts))
            ]
            print(f"  {weight:6.3f}  {text!r}  ({', '.join(f'{q:.2g}' for q in probs)})")
        print(f"  log Z estimate: {result.log_ml:.3f}   ({result.stats['time_s']:.1f}s)")
        word_weight = sum(w for t, w in result.posterior.items() if ANSWER_WORD.fullmatch(t))
        print(f"  weight on answers that are words: {word_weight:.3f}")
        print(f"  top answer: {next(iter(result.posterior))!r}")


if __name__ == "__main__":
    main()
