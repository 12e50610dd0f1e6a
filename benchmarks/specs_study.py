"""SPECS study on the embedded SmolLM2: accuracy, latency and forwards against beam search.

The same generated arithmetic questions as ``power_study.py`` (seeded, no data
download), as chat prompts, to five methods with the same process reward:

* plain sampling from the target (the latency reference 1.00×);
* best-of-n: ``n`` full answers from the target, the highest-reward one kept
  (``beam_search`` with one beam and one block of ``max_tokens``);
* BS-B: block-wise beam search with the target (``beam_search``, ``n`` candidates
  per block: ``--beam-width`` beams × n / beam-width expansions, block ``L``);
* BS-S: the same beam search with the draft;
* SPECS (Algorithm 1): ``n`` candidates per block, block ``L``, β = 2·L and τ from
  ``--taus`` (the paper's range 0.7–0.9; its Table 3 picks τ in 0.6–0.9 per dataset).

Target: SmolLM2-135M-Instruct (30 layers). Draft: its first ``--draft-layers``
layers (``truncated_draft``, shared weights): the only smaller model with the same
vocabulary available offline.

The process reward is an exact checker of the partial answer, offline and
deterministic: r(tr) = 1 once the last number stated is the question's answer,
0 once it is another number (other than the question's own operands), 1/2 while
no number or only the operands have been written. It is the idealised PRM of
SPECS' analysis (Assumption 1: r is the value of the trace, here the probability
that it ends correct, known exactly because arithmetic can be checked), so the
comparison is about the search, not about a PRM's errors. The alternative, the
target's own probability that a partial answer is correct, costs a forward per
candidate and, for a 135M model, is close to noise; a checker that is right is
the better test of whether SPECS saves time. It sees the answer, as any verifier
does, so every reward-guided method can pick a correct candidate once one is
drawn; plain sampling is the only method without it.

Accuracy: the last integer of the output equals the answer, ± binomial standard
error. Latency: total wall time relative to plain sampling (methods interleaved
question by question, each with cleared KV caches, so load drift hits all of
them). Forwards: transformer forwards on target and draft per question.
Writes ``benchmarks/out/specs_study.{md,jsonl}``::

    python benchmarks/specs_study.py --n-questions 24 --max-tokens 32
"""

from __future__ import annotations

import argparse
import json
import math
import re
import time
from pathlib import Path

import numpy as np
import torch
from _args import nonnegative_int, positive_float, positive_int
from power_study import chat_prompt, extract_answer, make_questions

from llamppl import CachedCausalLM, run
from llamppl.models import beam_search, low_temperature_decode, specs
from llamppl.models.speculative import truncated_draft

OUT = Path(__file__).parent / "out"


def checker(question: str, answer: int):
    """The process reward r(prompt, partial answer) in {0, 1/2, 1} for one question (see above)."""
    operands = {int(x) for x in re.findall(r"\d+", question)}

    def reward(prompt_text: str, text: str) -> float:
        numbers = [int(x.replace(",", "")) for x in re.findall(r"-?\d[\d,]*", text)]
        if not numbers:
            return 0.5
        if numbers[-1] == answer:
            return 1.0
        return 0.5 if set(numbers) <= operands else 0.0

    return reward


def methods(args: argparse.Namespace, target, draft) -> dict:
    """Method name -> ``f(prompt, reward, seed)`` returning a coroutine with ``.text``."""
    n, L, t, w = args.n, args.block, args.max_tokens, args.beam_width
    table = {
        "plain": lambda p, r, s: low_temperature_decode(target, p, 1.0, t, seed=s),
        f"best-of-{n}": lambda p, r, s: beam_search(target, r, p, 1, t, t, s, expansions=n),
        f"BS-B {w}×{n // w}": lambda p, r, s: beam_search(target, r, p, w, L, t, s, expansions=n // w),
        f"BS-S {w}×{n // w}": lambda p, r, s: beam_search(draft, r, p, w, L, t, s, expansions=n // w),
    }  # fmt: skip
    for tau in args.taus:
        table[f"SPECS τ={tau:g}"] = lambda p, r, s, tau=tau: specs(
            target, draft, r, p, n, L, 2.0 * L, tau, t, s
        )
    return table


def summarise(rows: list[dict], names: list[str]) -> list[dict]:
    ref = sum(r["time_s"] for r in rows if r["method"] == names[0])
    table = []
    for name in names:
        rs = [r for r in rows if r["method"] == name]
        acc = float(np.mean([r["correct"] for r in rs]))
        total = sum(r["time_s"] for r in rs)
        table.append(
            {
                "method": name,
                "n": len(rs),
                "accuracy": acc,
                "acc_se": math.sqrt(acc * (1 - acc) / len(rs)),
                "reward": float(np.mean([r["reward"] for r in rs])),
                "time_s": total,
                "ratio": total / ref,
                "target_fwd": float(np.mean([r["target_fwd"] for r in rs])),
                "draft_fwd": float(np.mean([r["draft_fwd"] for r in rs])),
            }
        )
    return table


def markdown(table: list[dict], args: argparse.Namespace, threads: int | str) -> str:
    head = (
        f"SPECS study: SmolLM2-135M-Instruct target, first {args.draft_layers} layers as draft, "
        f"{table[0]['n']} questions, n = {args.n}, L = {args.block}, β = 2·L = {2 * args.block}, "
        f"T_max = {args.max_tokens}, torch threads = {threads}, CPU\n\n"
        "| method | accuracy | final reward | wall time (s) | latency vs plain | target fwd / q | draft fwd / q |\n"
        "|---|---|---|---|---|---|---|\n"
    )
    rows = [
        f"| {r['method']} | {r['accuracy']:.2f} ± {r['acc_se']:.2f} | {r['reward']:.2f} | "
        f"{r['time_s']:.1f} | {r['ratio']:.2f}× | {r['target_fwd']:.1f} | {r['draft_fwd']:.1f} |"
        for r in table
    ]
    return head + "\n".join(rows) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--n-questions", type=positive_int, default=24, help="questions")
    parser.add_argument("--max-tokens", type=positive_int, default=32, help="T_max per answer")
    parser.add_argument("--n", type=positive_int, default=4, help="candidates per block")
    parser.add_argument("--block", type=positive_int, default=8, help="L, tokens per block")
    parser.add_argument(
        "--taus", type=positive_float, nargs="+", default=[0.8], help="SPECS thresholds τ"
    )
    parser.add_argument("--beam-width", type=positive_int, default=2, help="beams kept (BS)")
    parser.add_argument(
        "--draft-layers", type=positive_int, default=12, help="layers kept in the draft"
    )
    parser.add_argument("--seed", type=nonnegative_int, default=0, help="question generator seed")
    parser.add_argument(
        "--threads", type=positive_int, default=None, help="torch threads (None: llamppl's)"
    )
    parser.add_argument("--out", type=Path, default=OUT, help="output folder")
    parser.add_argument(
        "--summarise",
        type=Path,
        default=None,
        metavar="JSONL",
        help="only print the table of the questions complete in a (partial) specs_study.jsonl",
    )
    args = parser.parse_args()
    if args.n % args.beam_width:
        parser.error(f"--n ({args.n}) must be a multiple of --beam-width ({args.beam_width})")
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    if args.summarise is not None:
        rows = [json.loads(line) for line in args.summarise.read_text().splitlines() if line]
        names = list(dict.fromkeys(r["method"] for r in rows))
        done = {
            q
            for q in {r["question"] for r in rows}
            if sum(r["question"] == q for r in rows) == len(names)
        }
        table = summarise([r for r in rows if r["question"] in done], names)
        print(markdown(table, args, rows[0].get("threads", "?")))
        return

    target = CachedCausalLM.default()
    draft = truncated_draft(target, args.draft_layers)
    print(f"torch threads: {torch.get_num_threads()}", flush=True)
    run(low_temperature_decode(target, "Hello", 1.0, 4, seed=0))  # warm-up
    run(low_temperature_decode(draft, "Hello", 1.0, 4, seed=0))
    table_methods = methods(args, target, draft)
    names = list(table_methods)
    args.out.mkdir(parents=True, exist_ok=True)
    rows: list[dict] = []
    with open(args.out / "specs_study.jsonl", "w") as log:
        for qi, (question, answer) in enumerate(make_questions(args.n_questions, args.seed)):
            prompt = chat_prompt(target, question)
            reward = checker(question, answer)
            for mi, (name, method) in enumerate(table_methods.items()):
                target.clear_cache()
                draft.clear_cache()
                ft, fd = target.stats.forward_calls, draft.stats.forward_calls
                t0 = time.perf_counter()
                out = run(method(prompt, reward, args.seed * 100_003 + qi * 101 + mi))
                elapsed = time.perf_counter() - t0
                row = {
                    "question": qi,
                    "method": name,
                    "answer": answer,
                    "output": out.text,
                    "predicted": extract_answer(out.text),
                    "reward": reward("", out.text),
                    "time_s": elapsed,
                    "target_fwd": target.stats.forward_calls - ft,
                    "draft_fwd": draft.stats.forward_calls - fd,
                    "threads": torch.get_num_threads(),
                }
                row["correct"] = row["predicted"] == answer
                rows.append(row)
                log.write(json.dumps(row) + "\n")
                log.flush()
            print(f"question {qi + 1}/{args.n_questions} done", flush=True)
    text = markdown(summarise(rows, names), args, torch.get_num_threads())
    (args.out / "specs_study.md").write_text(text)
    print("\n" + text)


if __name__ == "__main__":
    main()
