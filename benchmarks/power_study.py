"""Power sampling study on the embedded SmolLM2: accuracy, likelihood and latency per method.

A seeded generator writes short arithmetic word questions with known integer
answers (no data download). Each question goes, as a chat prompt, to:

* plain sampling (τ = 1, the latency reference 1.00×),
* low-temperature decoding (τ = 1/α),
* ``power_smc`` with N = 8 and N = 16 particles (α = 4, ESS threshold 0.5),
* MH power sampling (Karan & Du; K = 16 blocks of B = ⌈T_max/16⌉ tokens, M = 10 moves per
  block by default, i.e. the paper's setup scaled to the output length).

Per method it reports accuracy (the last integer of the output equals the answer,
± binomial standard error), the mean per-token log-likelihood log p(y|x)/|y| under the
base model, mean output length, transformer forwards per question, and total wall
time (and process CPU time, less sensitive to a busy machine) relative to plain sampling. Methods run interleaved question by question, each
with a cleared KV cache, so load drift on a shared machine hits all of them alike.
Writes ``benchmarks/out/power_study.{md,png,jsonl}``::

    python benchmarks/power_study.py --n-questions 50 --max-tokens 48
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import re
import time
from pathlib import Path

import numpy as np
import torch
from _args import nonnegative_int, positive_int  # noqa: E402

from llamppl import CachedCausalLM, run
from llamppl.models import low_temperature_decode, mh_power_sampling, power_smc

OUT = Path(__file__).parent / "out"

TEMPLATES = [
    ("What is {a} + {b}?", lambda a, b: a + b),
    ("What is {a} - {b}?", lambda a, b: a - b),
    ("What is {a} times {b}?", lambda a, b: a * b),
    (
        "Tom has {a} apples and buys {b} more. How many apples does Tom have now?",
        lambda a, b: a + b,
    ),
    (
        "A box holds {a} pens. {b} pens are taken out. How many pens are left in the box?",
        lambda a, b: a - b,
    ),
    ("Each bag has {a} marbles. How many marbles are in {b} bags?", lambda a, b: a * b),
    (
        "Sara reads {a} pages on Monday and {b} pages on Tuesday. How many pages did she read in total?",
        lambda a, b: a + b,
    ),
    (
        "A class has {a} students and {b} of them are absent. How many students are present?",
        lambda a, b: a - b,
    ),
]


def make_questions(n: int, seed: int) -> list[tuple[str, int]]:
    """``n`` (question, answer) pairs; operands in 2..20 (products: 2..9), differences non-negative."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        text, fn = TEMPLATES[i % len(TEMPLATES)]
        hi = 10 if "times" in text or "Each" in text else 21
        a, b = (int(x) for x in rng.integers(2, hi, size=2))
        if fn(a, b) < 0:
            a, b = b, a
        out.append((text.format(a=a, b=b) + " Answer with a number.", fn(a, b)))
    return out


def chat_prompt(lm: CachedCausalLM, question: str) -> str:
    messages = [{"role": "user", "content": question}]
    return lm.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)


def extract_answer(text: str) -> int | None:
    """The last integer in ``text`` (commas in numbers allowed), or None."""
    numbers = re.findall(r"-?\d[\d,]*", text)
    return int(numbers[-1].replace(",", "")) if numbers else None


def methods(args: argparse.Namespace) -> dict:
    """Method name -> ``f(lm, prompt, seed)`` returning a coroutine of a ``Generation``."""
    a, t = args.alpha, args.max_tokens
    block = math.ceil(t / args.mh_blocks)
    table = {
        "plain (τ=1)": lambda lm, p, s: low_temperature_decode(lm, p, 1.0, t, seed=s),
        f"low temp (τ=1/{a:g})": lambda lm, p, s: low_temperature_decode(lm, p, a, t, seed=s),
    }
    for n in args.particles:
        table[f"power_smc N={n}"] = functools.partial(
            _power_smc, n=n, alpha=a, ramp=args.ramp_tokens, max_tokens=t
        )
    table[f"MH B={block} M={args.mh_steps}"] = lambda lm, p, s: mh_power_sampling(
        lm, p, a, block, args.mh_steps, t, seed=s
    )
    return table


def _power_smc(lm, prompt, seed, *, n, alpha, ramp, max_tokens):
    return power_smc(lm, prompt, alpha, n, 0.5, ramp, max_tokens, seed=seed, progress=False)


def summarise(rows: list[dict], names: list[str]) -> list[dict]:
    ref = sum(r["time_s"] for r in rows if r["method"] == names[0])
    ref_cpu = sum(r["cpu_s"] for r in rows if r["method"] == names[0])
    table = []
    for name in names:
        rs = [r for r in rows if r["method"] == name]
        acc = np.mean([r["correct"] for r in rs])
        total = sum(r["time_s"] for r in rs)
        table.append(
            {
                "method": name,
                "n": len(rs),
                "accuracy": acc,
                "acc_se": math.sqrt(acc * (1 - acc) / len(rs)),
                "loglik_per_token": np.mean([r["mean_loglik"] for r in rs]),
                "tokens": np.mean([r["n_tokens"] for r in rs]),
                "forwards": np.mean([r["forwards"] for r in rs]),
                "time_s": total,
                "ratio": total / ref,
                "cpu_ratio": sum(r["cpu_s"] for r in rs) / ref_cpu,
            }
        )
    return table


def markdown(table: list[dict], args: argparse.Namespace) -> str:
    head = (
        f"Power sampling study: SmolLM2-135M-Instruct (embedded), {table[0]['n']} questions, "
        f"α = {args.alpha:g}, T_max = {args.max_tokens}, ramp = {args.ramp_tokens} tokens, "
        f"torch threads = {torch.get_num_threads()}, CPU\n\n"
        "| method | accuracy | log p / token | tokens | forwards / q | wall time (s) | latency vs plain | CPU time vs plain |\n"
        "|---|---|---|---|---|---|---|---|\n"
    )
    rows = [
        f"| {r['method']} | {r['accuracy']:.2f} ± {r['acc_se']:.2f} | {r['loglik_per_token']:.3f} | "
        f"{r['tokens']:.1f} | {r['forwards']:.1f} | {r['time_s']:.1f} | {r['ratio']:.2f}× | {r['cpu_ratio']:.2f}× |"
        for r in table
    ]
    return head + "\n".join(rows) + "\n"


def plot(table: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    for r in table:
        ax1.errorbar(
            r["ratio"], r["accuracy"], yerr=r["acc_se"], fmt="o", capsize=3, label=r["method"]
        )
        ax2.scatter(r["ratio"], r["loglik_per_token"], label=r["method"])
    ax1.set(
        xlabel="wall time relative to plain sampling",
        ylabel="accuracy",
        title="accuracy vs latency",
    )
    ax2.set(
        xlabel="wall time relative to plain sampling",
        ylabel="mean log p(y|x) per token",
        title="likelihood vs latency",
    )
    for ax in (ax1, ax2):
        ax.xaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda x, _: f"{x:g}×"))
    ax1.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n-questions", type=positive_int, default=50)
    parser.add_argument(
        "--max-tokens", type=positive_int, default=48, help="T_max, tokens per output"
    )
    parser.add_argument("--alpha", type=float, default=4.0)
    parser.add_argument("--particles", type=positive_int, nargs="+", default=[8, 16])
    parser.add_argument(
        "--ramp-tokens", type=nonnegative_int, default=8, help="α-ramp length for power_smc"
    )
    parser.add_argument(
        "--mh-blocks", type=positive_int, default=16, help="K; MH block size B = ceil(T_max / K)"
    )
    parser.add_argument(
        "--mh-steps", type=nonnegative_int, default=10, help="M, MH moves per block"
    )
    parser.add_argument("--seed", type=nonnegative_int, default=0)
    parser.add_argument(
        "--threads",
        type=positive_int,
        default=None,
        help="torch threads (default: llamppl's choice)",
    )
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument(
        "--summarise",
        type=Path,
        metavar="JSONL",
        help="only rebuild the table and plot from a (possibly partial) power_study.jsonl",
    )
    args = parser.parse_args()
    if args.threads is not None:  # else llamppl.threads picks at the first load
        torch.set_num_threads(args.threads)
    if args.summarise is not None:
        rows = [json.loads(line) for line in args.summarise.read_text().splitlines() if line]
        names = list(dict.fromkeys(r["method"] for r in rows))
        complete = {
            q
            for q in {r["question"] for r in rows}
            if sum(r["question"] == q for r in rows) == len(names)
        }
        report([r for r in rows if r["question"] in complete], names, args)
        return

    lm = CachedCausalLM.default()
    print(f"torch threads: {torch.get_num_threads()}", flush=True)
    run(low_temperature_decode(lm, "Hello", 1.0, 4, seed=0))  # warm-up
    questions = make_questions(args.n_questions, args.seed)
    table_methods = methods(args)
    names = list(table_methods)
    args.out.mkdir(parents=True, exist_ok=True)
    rows: list[dict] = []
    with open(args.out / "power_study.jsonl", "w") as log:
        for qi, (question, answer) in enumerate(questions):
            prompt = chat_prompt(lm, question)
            for mi, (name, method) in enumerate(table_methods.items()):
                lm.clear_cache()
                forwards = lm.stats.forward_calls
                t0, c0 = time.perf_counter(), time.process_time()
                out = run(method(lm, prompt, args.seed * 100_003 + qi * 101 + mi))
                elapsed, cpu = time.perf_counter() - t0, time.process_time() - c0
                row = {
                    "question": qi,
                    "method": name,
                    "answer": answer,
                    "output": out.text,
                    "predicted": extract_answer(out.text),
                    "time_s": elapsed,
                    "cpu_s": cpu,
                    "mean_loglik": out.mean_log_likelihood,
                    "n_tokens": len(out.tokens),
                    "forwards": lm.stats.forward_calls - forwards,
                }
                row["correct"] = row["predicted"] == answer
                rows.append(row)
                log.write(json.dumps(row) + "\n")
                log.flush()
            done = [r for r in rows if r["question"] == qi]
            print(
                f"[{qi + 1}/{len(questions)}] {question!r} = {answer}: "
                + ", ".join(f"{r['method']}: {r['predicted']} ({r['time_s']:.1f}s)" for r in done),
                flush=True,
            )
    report(rows, names, args)


def report(rows: list[dict], names: list[str], args: argparse.Namespace) -> None:
    """Print the table and write ``power_study.md`` and ``power_study.png`` into ``args.out``."""
    args.out.mkdir(parents=True, exist_ok=True)
    table = summarise(rows, names)
    text = markdown(table, args)
    print("\n" + text)
    (args.out / "power_study.md").write_text(text)
    plot(table, args.out / "power_study.png")
    print(f"wrote {args.out / 'power_study.md'}, {args.out / 'power_study.png'}")


if __name__ == "__main__":
    main()
