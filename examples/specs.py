"""SPECS on the embedded SmolLM2: speculative drafts + reward-guided selection vs beam search vs sampling.

Target: SmolLM2-135M-Instruct. Draft: the same model truncated to its first ``--draft-layers``
decoder layers (``truncated_draft``, shared weights, same vocabulary). Process
reward: an exact checker of the answer so far (:func:`arithmetic_reward`, values 0, 1/2,
1); with τ = 0.8 SPECS drafts once a candidate states the correct answer (SPECS
Algorithm 1, lines 9–10), and β = 2·block as the paper prescribes. For each method and
seed the script prints the answer, its reward, the wall time and the transformer
forwards on each model; for SPECS also "generators", one letter per block: ``t`` if the
target drew that block's candidates, ``d`` if the draft did (e.g. ``tddd``: the first
block, drawn by the target, held the answer, and the draft wrote the rest).
``benchmarks/specs_study.py`` compares the methods on many questions.

    python examples/specs.py --n 4 --block 8 --max-tokens 32 --runs 3
    python examples/specs.py --fast      # a few tokens, for a CI smoke test
"""

from __future__ import annotations

import argparse
import re
import time

import torch

from llamppl import CachedCausalLM, run
from llamppl.models import beam_search, low_temperature_decode, specs
from llamppl.models.speculative import truncated_draft

QUESTION = "What is 7 + 5? Reply with just the number."
ANSWER, OPERANDS = "12", {"7", "5"}


def arithmetic_reward(prompt_text: str, text: str) -> float:
    """Process reward r(tr) in {0, 1/2, 1}: an exact checker of the partial answer ``text``.

    1 once the last number stated is the answer; 0 once it is another number (not one
    of the question's operands) or once the text holds special-token markup such as
    ``<|endoftext|>`` (garbage after a false end); 1/2 while undecided. The same checker
    as ``benchmarks/specs_study.py``; its value is the probability that the trace ends
    correct, SPECS' idealised PRM.
    """
    if "<|" in text:
        return 0.0
    numbers = re.findall(r"\d+", text)
    if not numbers:
        return 0.5
    if numbers[-1] == ANSWER:
        return 1.0
    return 0.5 if set(numbers) <= OPERANDS else 0.0


def forwards(lm: CachedCausalLM) -> int:
    return lm.stats.forward_calls


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--question", default=QUESTION, help="the question asked (chat template)")
    parser.add_argument("--n", type=int, default=4, help="SPECS candidates per block (beam width)")
    parser.add_argument("--block", type=int, default=8, help="γ, tokens per block")
    parser.add_argument(
        "--beta", type=float, default=None, help="β (None: 2·block, the paper's choice)"
    )
    parser.add_argument("--tau", type=float, default=0.8, help="switching threshold τ")
    parser.add_argument("--beam-width", type=int, default=2, help="beam search: beams kept")
    parser.add_argument("--max-tokens", type=int, default=32, help="tokens per answer")
    parser.add_argument("--draft-layers", type=int, default=12, help="layers kept in the draft")
    parser.add_argument("--runs", type=int, default=3, help="seeds per method")
    parser.add_argument("--fast", action="store_true", help="tiny settings for a smoke test")
    args = parser.parse_args()
    if args.fast:
        args.n, args.block, args.max_tokens, args.runs, args.beam_width = 2, 2, 4, 1, 2

    print(f"torch threads: {torch.get_num_threads()}")
    target = CachedCausalLM.default()
    draft = truncated_draft(target, args.draft_layers)
    messages = [{"role": "user", "content": args.question}]
    prompt = target.apply_chat_template(messages)  # token ids: chat template + generation prompt
    width = args.beam_width
    methods = {
        "plain sampling": lambda s: low_temperature_decode(target, prompt, 1.0, args.max_tokens, s),
        f"beam search (target, {width}x{args.n // width or 1})": lambda s: beam_search(
            target, arithmetic_reward, prompt, width, args.block, args.max_tokens, s,
            expansions=max(args.n // width, 1),
        ),
        f"SPECS (n={args.n}, τ={args.tau:g})": lambda s: specs(
            target, draft, arithmetic_reward, prompt, args.n, args.block, args.beta,
            args.tau, args.max_tokens, s,
        ),
    }  # fmt: skip
    rows = []
    for name, make in methods.items():
        total_r, total_t, total_ft, total_fd = 0.0, 0.0, 0, 0
        for seed in range(args.runs):
            target.clear_cache()
            draft.clear_cache()
            ft, fd = forwards(target), forwards(draft)
            start = time.perf_counter()
            out = run(make(seed))
            elapsed = time.perf_counter() - start
            r = arithmetic_reward(prompt, out.text)
            total_r, total_t = total_r + r, total_t + elapsed
            total_ft += forwards(target) - ft
            total_fd += forwards(draft) - fd
            extra = ""
            if hasattr(out, "steps") and out.steps and hasattr(out.steps[0], "generator"):
                extra = "  generators (t target, d draft): " + "".join(
                    s.generator[0] for s in out.steps
                )
            print(f"[{name}] seed {seed}: reward {r:.2f}, {elapsed:.2f}s{extra}\n  {out.text!r}")
        rows.append((name, total_r / args.runs, total_t / args.runs, total_ft, total_fd))
    base_t = rows[1][2]
    print(f"\n{'method':<32} {'mean reward':>11} {'time/run':>9} {'vs beam':>8} "
          f"{'target fwd':>10} {'draft fwd':>9}")  # fmt: skip
    for name, r, t, ft, fd in rows:
        print(f"{name:<32} {r:>11.2f} {t:>8.2f}s {t / base_t:>7.2f}x {ft:>10} {fd:>9}")


if __name__ == "__main__":
    main()
