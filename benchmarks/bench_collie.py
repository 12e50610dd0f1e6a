"""COLLIE-v1: SmolLM2-135M steered by SMC with exact text-structure constraints.

Yao et al. (2023), "COLLIE: Systematic Construction of Constrained Text Generation Tasks".
For ``--per-structure K`` distinct prompts of each of the 13 structures (a seeded choice,
:func:`collie_judge.choose_prompts`), every method continues the same chat prompt (the
instance's ``prompt`` as the user turn of the model's chat template) and COLLIE's own
checker (:mod:`collie_judge`, rebuilt from the JSON tree) grades the one text it returns:

- ``plain``: one sample from the LM (``HardConstraint`` with no constraint, ``"sample"``);
- ``lcd``: locally constrained decoding, one particle of the lazy masked proposal, its
  weight ignored (what masking without weights gives);
- ``smc``: ``smc_standard`` with ``--particles N`` particles of ``HardConstraint`` on the
  instance's constraint (``llamppl.constraints.collie_constraint``), lazy proposal, a text
  drawn from the final weighted particles;
- ``smc-learned``: the same program with ``twist=`` a learned twist (:mod:`collie_twist`:
  fitted on the program's own runs on dev prompts this run does not evaluate, cached under
  ``benchmarks/twists/``, trained or loaded before any timed run, its training CPU in each
  record apart from the run's).

``--move K`` runs the SMC methods with resample-move (``smc_standard(..., move=ResampleMove(k=K))``,
:mod:`llamppl.inference.moves`); their records are labelled ``smc+move K`` and
``smc-learned+move K``. ``--append`` adds records to ``--out`` instead of replacing it, so that
one file holds several runs (``--report FILE`` prints them side by side).

This script only runs and grades: the constraint, its plain characters and its token budget
are the library's. LCD and SMC use the library's default, plain characters
(``llamppl.constraints.PlainCharacters``: ASCII letters, spaces, ``. , ; : ! ? '`` with a
space after a mark, the characters of the instance's targets, newlines only for paragraph
constraints; ``--no-plain-characters`` drops it, ``collie_constraint(inst, plain=False)``):
the target is then the LM conditioned on both, still exact. SMC uses ``HardConstraint``'s
default guidance (end, need and target twists, hints; docs/programs/collie.md). Our constraint
objects only steer; the judge never sees them. ``max_tokens`` comes from the
constraint (``llamppl.constraints.token_budget``), never from the prompt's id. Per structure and averaged
over structures it reports satisfaction (with a 95 % interval: Wilson per structure, a
stratified bootstrap for the average), the mean log-probability per generated token under
the LM (temperature 1, end token included) and the median CPU seconds per instance. Torch
runs on one thread. Problems run ``--concurrency`` at a time in one process, sharing the
LM's forwards (``benchmarks/_concurrency.py``; default: all, within a row bound), with
CPU seconds per problem its share of the process's. Records go to ``--out`` (one JSON line
per method and instance)::

    .venv/bin/python benchmarks/bench_collie.py --per-structure 2 --particles 8

The last line is ``collie: satisfied X/Y (Z%)`` for the SMC method, Z the average over
structures.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch
from _args import nonnegative_int, positive_int
from _concurrency import add_concurrency_argument, concurrency, solve_all
from _stats import wilson

METHODS = ("plain", "lcd", "smc", "smc-learned")
DEFAULT_METHODS = ("plain", "lcd", "smc")
ANCHORS = {  # published outputs judged with the same checker (shared data README)
    "c01": (100, 86, 86, 29),
    "c02": (1, 1, 0, 0),
    "c03": (43, 0, 0, 0),
    "c04": (5, 0, 0, 0),
    "c05": (0, 0, 0, 0),
    "c06a": (50, 14, 2, 2),
    "c07": (95, 89, 58, 68),
    "c08": (88, 85, 23, 62),
    "c09": (85, 26, 10, 15),
    "c10": (25, 12, 3, 4),
    "c11": (30, 4, 7, 7),
    "c12": (55, 0, 0, 0),
    "c14": (42, 0, 0, 0),
}
ANCHOR_AVERAGES = (47.6, 24.4, 14.5, 14.3)  # GPT-4, GPT-3.5, Alpaca-7B, Vicuna-7B


async def _mean_logprob(lm: Any, particle: Any) -> float | None:
    """Mean log-probability per generated token under the LM (temperature 1)."""
    ctx = particle.context
    gen = ctx.generated
    if not gen:
        return None
    total = 0.0
    for k in range(len(gen)):
        row = await lm.next_token_logprobs(ctx.tokens[: ctx.prompt_length + k])
        total += float(row[gen[k]])
    return total / len(gen)


def label(method: str, move: int) -> str:
    """A record's method: ``smc``, or ``smc+move 2`` with resample-move of k = 2."""
    return f"{method}+move {move}" if move and method.startswith("smc") else method


async def solve(
    lm: Any,
    method: str,
    inst: dict,
    n: int,
    plain: bool = True,
    move: int = 0,
    learned: dict | None = None,
    *,
    seed: int,
) -> dict[str, Any]:
    """One method on one instance: the returned text, its judgement and its work.

    ``move``: resample-move's k for the SMC methods (0: none); ``learned``: ``smc-learned``'s
    twist, ``{"twist", "mode", "sharpness", ...}`` (:mod:`collie_twist`)."""
    from collie_judge import judge
    from collie_twist import smc_program, succeeded

    from llamppl.constraints import collie_constraint, token_budget
    from llamppl.inference import ResampleMove, importance_sampling, smc_standard
    from llamppl.models import HardConstraint

    prompt = list(lm.apply_chat_template([{"role": "user", "content": inst["prompt"]}]))
    # plain characters (the library's default) for LCD and SMC unless turned off
    constraint = collie_constraint(inst, plain=plain and method != "plain")
    max_tokens = token_budget(lm, constraint)
    if method == "plain":
        model = HardConstraint(
            lm, prompt, lambda text: True, "sample", max_tokens, truncated="keep"
        )
        result = await importance_sampling(model, 1, seed=seed)
        chosen = result.particles[0]
    elif method == "lcd":
        model = HardConstraint(lm, prompt, constraint, "lazy", max_tokens, truncated="keep")
        result = await importance_sampling(model, 1, seed=seed)
        chosen = result.particles[0]  # the weight is ignored: local masking
    else:
        if method == "smc-learned":
            if learned is None:
                raise ValueError("smc-learned needs its learned twist (collie_twist)")
            model = smc_program(lm, inst, learned["twist"], plain=plain, mode=learned["mode"])
        else:
            model = smc_program(lm, inst, plain=plain)
        constraint, max_tokens = model.constraint, model.max_tokens
        rejuvenate = {"move": ResampleMove(k=move)} if move else {}
        result = await smc_standard(model, n, 0.5, seed=seed, **rejuvenate)
        live = [i for i, w in enumerate(result.log_weights) if w > -math.inf]
        if live:
            rng = random.Random(seed)
            top = max(result.log_weights[i] for i in live)
            weights = [math.exp(result.log_weights[i] - top) for i in live]
            chosen = result.particles[rng.choices(live, weights)[0]]
        else:
            chosen = result.particles[0]
    text = chosen.text
    failures: dict[str, int] = {}
    for p in result.particles:
        if p.failure is not None:
            cause = p.failure.split(" (")[0]
            failures[cause] = failures.get(cause, 0) + 1
    smc = method.startswith("smc")
    extra: dict[str, Any] = {}
    if smc and move:
        extra["move_k"] = move
        extra["move_acceptance"] = result.stats.get("move_acceptance")
    if method == "smc-learned":
        extra.update({k: v for k, v in learned.items() if k != "twist"})
    return {
        "method": label(method, move),
        "structure": inst["structure"],
        "key": inst["key"],
        "index": inst["index"],
        "n_particles": n if smc else 1,
        "max_tokens": max_tokens,
        "text": text,
        "satisfied": bool(judge(inst, text)),
        # the drawn particle ended by the program's own complete check (no judge)
        "own_check": succeeded(chosen),
        "tokens": len(chosen.context.generated),
        "mean_logprob": await _mean_logprob(lm, chosen),
        "log_ml": result.log_ml if result.log_ml > -math.inf else None,
        "failures": failures,
        "constraint": repr(constraint),
        **extra,
    }


def average_interval(by_structure: dict[str, list[bool]]) -> tuple[float, float]:
    """A 95 % interval of the average over structures: the normal approximation of the
    stratified mean, its variance from Wilson-smoothed rates (``(k + 2) / (n + 4)`` per
    structure, so that a structure at 0/2 or 2/2 still counts as uncertain)."""
    cells = [(sum(v), len(v)) for v in by_structure.values() if v]
    mean = sum(k / n for k, n in cells) / len(cells)
    var = sum(((k + 2) / (n + 4)) * (1 - (k + 2) / (n + 4)) / n for k, n in cells)
    half = 1.96 * math.sqrt(var) / len(cells)
    return max(0.0, mean - half), min(1.0, mean + half)


def report(records: list[dict], methods: list[str]) -> tuple[int, int, float]:
    """Print the per-structure table and the averages; returns SMC's (X, Y, Z%)."""
    seen = {r["structure"] for r in records}
    structures = [s for s in ANCHORS if s in seen] + sorted(seen - set(ANCHORS))
    header = (
        "| structure | n | " + " | ".join(methods) + " | GPT-4 | GPT-3.5 | Alpaca-7B | Vicuna-7B |"
    )
    print(header)
    print("|" + "---|" * (2 + len(methods) + 4))
    per: dict[str, dict[str, list[bool]]] = {m: {} for m in methods}
    for s in structures:
        cells = []
        for m in methods:
            oks = [r["satisfied"] for r in records if r["method"] == m and r["structure"] == s]
            per[m][s] = oks
            lo, hi = wilson(sum(oks), len(oks))
            cells.append(f"{sum(oks)}/{len(oks)} [{100 * lo:.0f}-{100 * hi:.0f}]")
        n = len(per[methods[0]][s])
        anchors = " | ".join(f"{a}%" for a in ANCHORS.get(s, ("?",) * 4))
        print(f"| {s} | {n} | " + " | ".join(cells) + f" | {anchors} |")
    rows = []
    for m in methods:
        rates = [sum(v) / len(v) for v in per[m].values() if v]
        avg = 100 * sum(rates) / len(rates) if rates else 0.0
        lo, hi = average_interval(per[m])
        recs = [r for r in records if r["method"] == m]
        lps = [r["mean_logprob"] for r in recs if r["mean_logprob"] is not None]
        cpu = statistics.median(r["cpu_seconds"] for r in recs) if recs else float("nan")
        rows.append((m, avg, lo, hi, statistics.mean(lps) if lps else float("nan"), cpu, recs))
    print()
    print(
        "| method | satisfied (avg over structures) | 95 % interval | mean log-prob/token | median CPU s |"
    )
    print("|---|---|---|---|---|")
    for m, avg, lo, hi, lp, cpu, _ in rows:
        print(f"| {m} | {avg:.1f}% | {100 * lo:.1f}-{100 * hi:.1f}% | {lp:.2f} | {cpu:.1f} |")
    for name, a in zip(("GPT-4", "GPT-3.5", "Alpaca-7B", "Vicuna-7B"), ANCHOR_AVERAGES):
        print(f"| {name} (published outputs) | {a}% | | | |")
    smc = next((r for r in rows if r[0].startswith("smc")), rows[-1])
    recs = smc[6]
    return sum(r["satisfied"] for r in recs), len(recs), smc[1]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", default=None, help="COLLIE JSON (default: the shared dev half)")
    parser.add_argument(
        "--per-structure", type=positive_int, default=2, help="prompts per structure"
    )
    parser.add_argument("--particles", type=positive_int, default=8, help="SMC particles (<= 16)")
    parser.add_argument("--seed", type=nonnegative_int, default=0, help="prompt choice and runs")
    parser.add_argument(
        "--methods",
        default=",".join(DEFAULT_METHODS),
        help="comma-separated: " + ", ".join(METHODS),
    )
    parser.add_argument(
        "--move",
        type=nonnegative_int,
        default=0,
        help="resample-move for the SMC methods: ResampleMove(k=K) (0: none)",
    )
    parser.add_argument("--retrain-twist", action="store_true", help="smc-learned: no cache")
    parser.add_argument("--append", action="store_true", help="append to --out, not replace")
    parser.add_argument("--structures", default=None, help="comma-separated subset (default: all)")
    parser.add_argument(
        "--plain-characters",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="LCD and SMC also constrain the text to plain characters and the targets' own "
        "(the library's default, PlainCharacters; --no-plain-characters turns it off)",
    )
    parser.add_argument(
        "--report", default=None, help="print the report of a saved records file, run nothing"
    )
    parser.add_argument("--out", default=str(Path(__file__).parent / "results" / "collie.jsonl"))
    add_concurrency_argument(parser)
    args = parser.parse_args(argv)
    methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    for m in methods:
        if m not in METHODS:
            parser.error(f"--methods: unknown method {m!r} (choose from {', '.join(METHODS)})")
    if args.particles > 16:
        parser.error(f"--particles must be at most 16, got {args.particles}")
    if "smc-learned" in methods:
        from collie_twist import TRAIN_SEED, VALIDATION_SEEDS

        if args.seed == TRAIN_SEED or args.seed in VALIDATION_SEEDS:
            parser.error(f"--seed {args.seed} draws smc-learned's training or validation prompts")

    if args.report:
        records = [json.loads(line) for line in Path(args.report).open() if line.strip()]
        labels = sorted(
            {r["method"] for r in records},
            key=lambda m: (METHODS.index(m.split("+")[0]) if m.split("+")[0] in METHODS else 99, m),
        )
        shown = METHODS if args.methods == ",".join(DEFAULT_METHODS) else methods  # default: all
        x, y, z = report(records, [m for m in labels if m.split("+")[0] in shown])
        print(f"collie: satisfied {x}/{y} ({z:.1f}%)")
        return
    import collie_judge  # sets NLTK_DATA to the shared Punkt data unless the user set it

    os.environ.setdefault("NLTK_DATA", str(collie_judge.NLTK_DATA))

    torch.set_num_threads(1)
    from llamppl import CachedCausalLM

    instances = collie_judge.load(args.data) if args.data else collie_judge.load()
    picked = collie_judge.choose_prompts(instances, k=args.per_structure, seed=args.seed)
    if args.structures:
        keep = set(args.structures.split(","))
        picked = {s: v for s, v in picked.items() if s in keep}
    lm = CachedCausalLM.default()
    learned = None
    if "smc-learned" in methods:  # trained or loaded before any timed run
        import collie_twist as W

        settings = W.CollieTwistSettings(plain=args.plain_characters)
        evaluated = [i for v in picked.values() for i in v] + W.report_prompts(instances)
        twist, cpu, path = W.learned_twist(
            lm, settings, instances, evaluated, retrain=args.retrain_twist
        )
        learned = {
            "twist": twist.sharpened(W.SHARPNESS),
            "mode": W.MODE,
            "sharpness": W.SHARPNESS,
            "twist_file": path.name,
            "twist_training_cpu_s": cpu,
        }
        print(f"smc-learned: {path.name}, {W.MODE}, sharpness {W.SHARPNESS:g}")
    print(f"torch threads: {torch.get_num_threads()}; NLTK_DATA={os.environ['NLTK_DATA']}")
    print(
        f"methods: {methods}; particles: {args.particles}; seed: {args.seed}; "
        f"move: {args.move or 'none'}; "
        f"plain characters: {'on' if args.plain_characters else 'off'}"
    )
    problems = [
        (
            solve,
            (m, inst, args.particles, args.plain_characters, args.move, learned),
            args.seed * 1000 + j,
        )
        for insts in picked.values()
        for j, inst in enumerate(insts)
        for m in methods
    ]
    k = concurrency(args.concurrency, args.particles, len(problems))
    print(f"problems: {len(problems)}, {k} at once")
    records: list[dict] = []
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    cpu0 = time.process_time()
    with out.open("a" if args.append else "w") as fh:

        def write(i: int, rec: dict) -> None:
            if "error" in rec:
                print(f"problem {i} failed:\n{rec['error']}", flush=True)
                return
            records.append(rec)
            fh.write(json.dumps(rec) + "\n")
            fh.flush()
            lp = rec["mean_logprob"]
            print(
                f"{rec['structure']} {rec['key']}#{rec['index']} {rec['method']:11s} "
                f"ok={rec['satisfied']!s:5} cpu={rec['cpu_seconds']:.1f}s tok={rec['tokens']} "
                f"lp={lp if lp is None else round(lp, 2)} {rec['text'][:70]!r}",
                flush=True,
            )

        solve_all(lm, problems, k, write)
    print(f"CPU: {time.process_time() - cpu0:.1f} s for {len(problems)} problems, {k} at once")
    x, y, z = report(records, [label(m, args.move) for m in methods])
    print(f"collie: satisfied {x}/{y} ({z:.1f}%)")


if __name__ == "__main__":
    sys.exit(main())
