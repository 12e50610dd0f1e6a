"""Resample-move: the diversity it buys, beside the same runs without it.

Each run is ``smc_standard`` (ESS threshold 0.5) with ``move=ResampleMove(k, sweeps=1)`` beside
``move=ResampleMove(sweeps=0)``, which moves nothing (the run is the run without ``move=``, same
seed, same particles) but counts the distinct particles after each resampling the same way.
Distinct particles are distinct texts (``string_for_serialization()``) among the N. Two programs:

- ``toy``: a FunctionLM program (a 4-token vocabulary, 8 tokens, each observed through a
  likelihood that favours two of the tokens), N = 32;
- ``fed``: the hard-constraint demo on the embedded SmolLM2-135M ("The Fed says", no word longer
  than five letters, token masking, 20 tokens), N = 8.

Printed per program: distinct particles after resampling without the move and after the move
(mean over the moves of all seeds), their ratio, the acceptance rate, the program steps the
moves ran and the LM forward calls and tokens run both ways (exact work counts), CPU seconds.
One JSON line per run goes to ``--out``::

    .venv/bin/python benchmarks/bench_rejuvenation.py --seeds 5 --out benchmarks/results/rejuvenation.jsonl
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
import torch
from _args import positive_int

from llamppl import Bernoulli, FunctionLM, LMContext, Model, run
from llamppl.constraints import max_word_length
from llamppl.inference import ResampleMove, smc_standard
from llamppl.models import HardConstraint


class Sentence(Model):
    """Eight tokens of a small FunctionLM, each observed through a likelihood favouring a and c."""

    def __init__(self, lm) -> None:
        super().__init__()
        self.context = LMContext(lm, [0])

    async def step(self) -> None:
        token = await self.sample(self.context.next_token())
        await self.observe(Bernoulli(0.9 if int(token) in (0, 2) else 0.2), True)
        if len(self.context.generated) >= 8:
            self.finish()


def toy_lm() -> FunctionLM:
    def logits(ctx):
        n, last = len(ctx), ctx[-1] if ctx else 0
        return [0.4 + 0.1 * last, 0.2 * n, -0.3 + 0.25 * (last == 1), -0.5 + 0.45 * n]

    return FunctionLM(["a", "b", "c", "."], 3, logits)


def programs(which: list[str]):
    if "toy" in which:
        lm = toy_lm()
        yield "toy", lm, (lambda: Sentence(lm)), 32
    if "fed" in which:
        from llamppl import CachedCausalLM

        lm = CachedCausalLM.default()
        yield (
            "fed",
            lm,
            lambda: HardConstraint(
                lm, "The Fed says", max_word_length(5), proposal="mask", max_tokens=20
            ),
            8,
        )


def one_run(lm, make, n: int, move: ResampleMove, seed: int) -> dict:
    stats = getattr(lm, "stats", None)
    calls0 = getattr(stats, "forward_calls", 0)
    tokens0 = getattr(stats, "tokens_run", 0)
    cpu = time.process_time()
    result = run(smc_standard(make(), n, 0.5, move=move, seed=seed))
    cpu = time.process_time() - cpu
    s = result.stats
    return {
        "k": move.k,
        "sweeps": move.sweeps,
        "seed": seed,
        "n": n,
        "log_ml": result.log_ml,
        "moves": s["moves"],
        "distinct_before_move": s["distinct_before_move"],
        "distinct_after_move": s["distinct_after_move"],
        "distinct_final": len(result.posterior),
        "move_proposals": s["move_proposals"],
        "move_accepted": s["move_accepted"],
        "move_program_steps": s["move_program_steps"],
        "forward_calls": getattr(stats, "forward_calls", 0) - calls0,
        "tokens_run": getattr(stats, "tokens_run", 0) - tokens0,
        "cpu_s": cpu,
    }


def summary(rows: list[dict], key: str) -> float:
    values = [v for r in rows for v in r[key]]
    return float(np.mean(values)) if values else float("nan")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--programs", nargs="+", default=["toy", "fed"], choices=["toy", "fed"])
    ap.add_argument("--seeds", type=positive_int, default=5)
    ap.add_argument("--k", type=positive_int, default=2)
    ap.add_argument("--threads", type=positive_int, default=1)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    print(f"torch threads: {torch.get_num_threads()}")
    records = []
    for name, lm, make, n in programs(args.programs):
        both = {}
        for label, move in (("without", ResampleMove(sweeps=0)), ("with", ResampleMove(k=args.k))):
            rows = [one_run(lm, make, n, move, seed) for seed in range(args.seeds)]
            for r in rows:
                records.append({"program": name, "move": label, **r})
            both[label] = rows
        without, with_ = both["without"], both["with"]
        d0 = summary(without, "distinct_before_move")
        d1 = summary(with_, "distinct_after_move")
        proposals = sum(r["move_proposals"] for r in with_)
        accepted = sum(r["move_accepted"] for r in with_)
        print(f"\n{name}: smc_standard N={n}, ESS threshold 0.5, k={args.k}, {args.seeds} seeds")
        print(
            f"  resamplings (moves): {sum(r['moves'] for r in without)} without, "
            f"{sum(r['moves'] for r in with_)} with"
        )
        print(f"  distinct particles after resampling, without the move: {d0:.2f} of {n}")
        print(
            f"  distinct particles after the move:                     {d1:.2f} of {n}  "
            f"(ratio {d1 / d0:.2f})"
        )
        print(
            f"  distinct texts in the final population: "
            f"{np.mean([r['distinct_final'] for r in without]):.2f} without, "
            f"{np.mean([r['distinct_final'] for r in with_]):.2f} with"
        )
        print(
            f"  acceptance: {accepted}/{proposals} = {accepted / max(proposals, 1):.3f}; "
            f"program steps run by moves: {sum(r['move_program_steps'] for r in with_)}"
        )
        for label, rows in both.items():
            print(
                f"  {label:7s}: forward calls {sum(r['forward_calls'] for r in rows)}, "
                f"tokens run {sum(r['tokens_run'] for r in rows)}, "
                f"CPU {sum(r['cpu_s'] for r in rows):.1f} s, "
                f"mean log Z-hat {np.mean([r['log_ml'] for r in rows]):.3f}"
            )
        cpu0 = sum(r["cpu_s"] for r in without)
        print(f"  CPU ratio with/without: {sum(r['cpu_s'] for r in with_) / cpu0:.2f}")
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        with args.out.open("w") as f:
            for r in records:
                f.write(json.dumps(r) + "\n")
        print(f"\nrecords: {args.out}")


if __name__ == "__main__":
    main()
