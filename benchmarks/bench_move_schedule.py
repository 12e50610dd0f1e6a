"""Resample-move schedules: the bias of E[Ẑ] with the move after resampling, beside every step.

``ResampleMove(every_step=True)`` moves after every step, a schedule fixed before the run, under
which Ẑ is exactly unbiased; the default moves after the steps that resampled, a decision made
from the weights, under which E[Ẑ] = Z only as N grows (``llamppl.inference.moves``). This
measures both over many seeded runs, against the exact Z of ``enumerate_exact``:

- ``early-or-late``: step 1 ends the text with probability 0.8 (weight 1); otherwise steps 2
  and 3 score 2 and 3, so Z = 2 and the early ending holds γ(early) = 0.8 of it;
- ``condition``: a 4-token FunctionLM, at most one "b", ended by EOS or after 3 tokens;
- ``selection``: x ∈ {0, 1, 2} drawn with probabilities (0.6, 0.3, 0.1) and scored e^0, e^1.5,
  e^3 at step 1, then e^2, e^0, e^-1 at step 2: the first step's weights point away from the
  posterior, so resampling is frequent and the move matters;
- ``twist``: the FunctionLM's text twisted by a heuristic of its prefix (undone the next step),
  scored by its count of "a" at the end (EOS or 3 tokens).

Each row runs ``seeds = max(200, --budget // N)`` seeds (the same particle count per row).
``--rows default`` runs only the default schedule, at more sizes.

Printed per program, engine, schedule and N: mean Ẑ / Z − 1 in percent with its standard error
and the gap in standard errors, the same for Ẑ · π̂(B) (the mass of one posterior key B: the texts that end at
the first possible step, or x = 0), the moves per run and the CPU seconds. Weights are bounded, so the
standard errors are honest. One JSON line per row goes to ``--out``::

    .venv/bin/python benchmarks/bench_move_schedule.py --budget 32000 \\
        --out benchmarks/results/move_schedule.jsonl
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import time
from pathlib import Path

import numpy as np
import torch
from _args import positive_int

from llamppl import Bernoulli, Categorical, FunctionLM, LMContext, Model, run
from llamppl.inference import ResampleMove, enumerate_exact, smc_standard, smc_steer


class EarlyOrLate(Model):
    """Ends at step 1 with probability 0.8, else scores 2 then 3 and ends at step 3 (Z = 2)."""

    def __init__(self) -> None:
        super().__init__()
        self.t = 0
        self.early: bool | None = None

    async def step(self) -> None:
        self.t += 1
        if self.t == 1:
            self.early = bool(await self.sample(Bernoulli(0.8)))
            if self.early:
                self.finish()
        else:
            self.score(math.log(self.t))
            if self.t == 3:
                self.finish()

    def string_for_serialization(self) -> str:
        return "early" if self.early else "late"


def _toy_logits(ctx: tuple[int, ...]) -> list[float]:
    n, last = len(ctx), ctx[-1] if ctx else 0
    return [0.4 + 0.1 * last, 0.2 * n, -0.3 + 0.25 * (last == 1), -0.5 + 0.45 * n]


TOY_LM = FunctionLM(["a", "b", "c", "."], 3, _toy_logits)


class AtMostOneB(Model):
    """At most one "b" (a condition), ended by EOS or after 3 tokens."""

    def __init__(self) -> None:
        super().__init__()
        self.context = LMContext(TOY_LM, [0])

    async def step(self) -> None:
        token = await self.sample(self.context.next_token())
        self.condition(str(self.context).count("b") <= 1)
        if token == 3 or len(self.context.generated) >= 3:
            self.finish()

    def string_for_serialization(self) -> str:
        return "early" if len(self.context.generated) == 1 else str(self.context)


class Selection(Model):
    """x ~ (0.6, 0.3, 0.1), scored e^(0, 1.5, 3)[x] at step 1 and e^(2, 0, -1)[x] at step 2."""

    def __init__(self) -> None:
        super().__init__()
        self.x: int | None = None

    async def step(self) -> None:
        if self.x is None:
            self.x = int(await self.sample(Categorical([0.6, 0.3, 0.1])))
            self.score((0.0, 1.5, 3.0)[self.x])
        else:
            self.score((2.0, 0.0, -1.0)[self.x])
            self.finish()

    def string_for_serialization(self) -> str:
        return str(self.x)


class Twisted(Model):
    """Twists by 0.9 · (count of "a") − 0.4, undone the next step; scores 0.7 · count at the end."""

    def __init__(self) -> None:
        super().__init__()
        self.context = LMContext(TOY_LM, [2])

    async def step(self) -> None:
        token = await self.sample(self.context.next_token())
        self.untwist()
        a = str(self.context).count("a")
        if token == 3 or len(self.context.generated) >= 3:
            self.score(0.7 * a)
            self.finish()
        else:
            self.twist(0.9 * a - 0.4)

    def string_for_serialization(self) -> str:
        return "early" if len(self.context.generated) == 1 else str(self.context)


# name: (program, the posterior key B whose mass Ẑ · π̂(B) is measured beside Ẑ)
PROGRAMS = {
    "early-or-late": (EarlyOrLate, "early"),
    "condition": (AtMostOneB, "early"),
    "selection": (Selection, "0"),
    "twist": (Twisted, "early"),
}

# (engine, schedule label, ess threshold, move, sizes N): --rows all
SETTINGS = [
    ("smc_standard", "after resampling", 0.5, ResampleMove(k=2), (4, 16, 64)),
    ("smc_standard", "every step", 0.5, ResampleMove(k=2, every_step=True), (4, 16, 64)),
    ("smc_standard", "after resampling", 1.0, ResampleMove(k=2), (2, 4, 16)),
    ("smc_standard", "every step", 1.0, ResampleMove(k=2, every_step=True), (2,)),
    ("smc_steer", "after resampling", None, ResampleMove(k=2), (4, 16)),
    ("smc_steer", "every step", None, ResampleMove(k=2, every_step=True), (4,)),
]
# --rows default: the default schedule only, with more sizes
DEFAULT_SETTINGS = [
    ("smc_standard", "after resampling", 0.5, ResampleMove(k=2), (4, 16, 64)),
    ("smc_standard", "after resampling", 1.0, ResampleMove(k=2), (2, 4, 16, 64)),
    ("smc_steer", "after resampling", None, ResampleMove(k=2), (4, 16, 64)),
]


def exact(make, key: str) -> tuple[float, float]:
    """Z and γ(B) = Z · π(B) for B = {key}, exactly."""
    result = run(enumerate_exact(make()))
    return math.exp(result.log_ml), math.exp(result.log_ml) * result.posterior.get(key, 0.0)


def one_run(make, engine: str, ess: float | None, move: ResampleMove, n: int, seed: int):
    if engine == "smc_standard":
        return smc_standard(make(), n, ess, move=move, seed=seed)
    return smc_steer(make(), n, 2, move=move, seed=seed)


def measure(make, key, engine, ess, move, n, seeds: int, chunk: int = 500) -> dict:
    """Ẑ and Ẑ · π̂(key) of ``seeds`` seeded runs (``chunk`` at a time, sharing LM batches)."""

    async def runs(start: int, stop: int):
        return await asyncio.gather(
            *(one_run(make, engine, ess, move, n, s) for s in range(start, stop))
        )

    cpu = time.process_time()
    rows, moves = [], 0
    for start in range(0, seeds, chunk):
        for r in run(runs(start, min(seeds, start + chunk))):
            z = 0.0 if r.log_ml == -math.inf else math.exp(r.log_ml)
            rows.append((z, z * r.posterior.get(key, 0.0)))
            moves += r.stats["moves"]
    a = np.array(rows)  # (seeds, 2)
    return {
        "mean": a.mean(axis=0).tolist(),
        "se": (a.std(axis=0, ddof=1) / math.sqrt(seeds)).tolist(),
        "moves_per_run": moves / seeds,
        "cpu_s": time.process_time() - cpu,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--programs", nargs="+", default=list(PROGRAMS), choices=list(PROGRAMS))
    ap.add_argument("--budget", type=positive_int, default=32000, help="particles per row")
    ap.add_argument("--rows", choices=["all", "default"], default="all")
    ap.add_argument("--threads", type=positive_int, default=1)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    print(f"torch threads: {torch.get_num_threads()}; {args.budget} particles per row; k = 2")
    records = []
    for name in args.programs:
        make, key = PROGRAMS[name]
        z, mass = exact(make, key)
        print(f"\n{name}: Z = {z:.6g}, B = {{{key!r}}}, γ(B) = {mass:.6g}")
        print(
            f"  {'engine':12s} {'schedule':17s} {'ESS':>4s} {'N':>3s}  "
            f"{'E[Ẑ]/Z − 1':>17s} {'SE off':>6s}  {'E[Ẑπ̂(B)]/γ(B) − 1':>19s} {'SE off':>6s}  "
            f"{'moves':>5s} {'seeds':>6s} {'CPU s':>6s}"
        )
        for engine, schedule, ess, move, sizes in (
            SETTINGS if args.rows == "all" else DEFAULT_SETTINGS
        ):
            for n in sizes:
                seeds = max(200, args.budget // n)
                m = measure(make, key, engine, ess, move, n, seeds)
                rel = [m["mean"][0] / z - 1, m["mean"][1] / mass - 1]
                rel_se = [m["se"][0] / z, m["se"][1] / mass]
                off = [(m["mean"][0] - z) / m["se"][0], (m["mean"][1] - mass) / m["se"][1]]
                print(
                    f"  {engine:12s} {schedule:17s} {'K=2' if ess is None else ess:>4} {n:3d}  "
                    f"{100 * rel[0]:+7.2f} ± {100 * rel_se[0]:4.2f} % {off[0]:+6.1f}  "
                    f"{100 * rel[1]:+9.2f} ± {100 * rel_se[1]:4.2f} % {off[1]:+6.1f}  "
                    f"{m['moves_per_run']:5.2f} {seeds:6d} {m['cpu_s']:6.1f}"
                )
                records.append(
                    {
                        "program": name,
                        "engine": engine,
                        "schedule": schedule,
                        "ess_threshold": ess,
                        "n": n,
                        "k": move.k,
                        "seeds": seeds,
                        "z": z,
                        "key": key,
                        "gamma_key": mass,
                        **m,
                    }
                )
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        with args.out.open("w") as f:
            for r in records:
                f.write(json.dumps(r) + "\n")
        print(f"\nrecords: {args.out}")


if __name__ == "__main__":
    main()
