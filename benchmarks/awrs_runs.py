"""Our side of the molecule and pattern benchmarks: each method on one instance, as a record.

The tasks (prompts, stop rule, constraints) come from :mod:`awrs_tasks`, the metric from
:mod:`awrs_metrics` and the records from :mod:`awrs_records`, the modules the genlm-control
peer uses too; this module runs llamppl's methods on them and writes
:class:`awrs_records.RunRecord` lines. ``bench_molecules.py`` and ``bench_patterns.py`` are its
two front doors (``main(task)``).

Methods, all on the same LM, prompts, stop rule (EOS or a newline token; 100 tokens) and
metric:

- ``base LM`` — one unconstrained sample;
- ``locally constrained`` — one sample from the locally masked LM (each token drawn from
  p restricted to the allowed tokens, by the lazy draw, weights ignored: LCD);
- ``sample-rerank`` — N unconstrained samples, weighted by the complete check;
- ``SMC mask`` / ``SMC lazy`` — ``smc_standard`` (ESS threshold 0.5, as the peers) over
  :class:`~llamppl.models.HardConstraint` with the mask or the lazy proposal;
- ``SMC lazy, closure undeclared`` — the same checks with ``prefix_closed`` False, as a
  user's plain callable is (every token's whole text checked: the cost of the safe default);
- ``SMC lazy + need`` (molecules) — the lazy proposal with a user's guide added to the
  check: ``need`` is the count of open ring bonds and branches
  (:func:`llamppl.decoding.chemistry.open_closures`, a guide rather than a bound on tokens),
  which ``HardConstraint``'s ``need_twist`` turns into a twist (same posterior and Z; what a
  user who knows SMILES would add).
- ``SMC lazy + learned twist`` — the task's checks alone with a twist fitted on the
  program's own runs on training prompts drawn with another seed, raised to the power
  ``awrs_twist.SHARPNESS`` chosen on validation prompts (:mod:`awrs_twist`: cached under
  ``benchmarks/twists/``, trained before any timed run, its training CPU in ``extra``).

The constraint is the task's library constraint (:func:`~llamppl.decoding.chemistry.smiles`,
closed under prefixes by construction; :func:`~llamppl.constraints.regex_prefix`, whose
batched mask the mask proposal uses), subclassed here only to count its checks. Predicate
calls are counted on the constraint object (``extra["parses"]``: the partialsmiles parses
behind them), CPU seconds are the process's CPU time of the run (model load and a warm-up
run excluded), and generated tokens count every particle extension. Runs go ``--concurrency``
at a time in one process, sharing the LM's forwards (``benchmarks/_concurrency.py``; default:
all within a row bound); a run's CPU seconds are then its share of the process's
(``extra["concurrency"]`` says how many ran at once; ``--concurrency 1``: each alone).
``--move K`` runs the SMC methods with resample-move (``smc_standard(..., move=
ResampleMove(k=K))``: after each resampling, an independent Metropolis–Hastings move on every
particle's last K tokens, :mod:`llamppl.inference.moves`); their records are named
``... + resample-move k=K``.
"""

from __future__ import annotations

import argparse
import math
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import awrs_metrics as M
import awrs_records as R
import awrs_tasks as T
import torch
from _args import nonnegative_int, positive_int
from _concurrency import add_concurrency_argument, concurrency, solve_all
from awrs_twist import (
    SHARPNESS,
    TRAIN_SEED,
    TwistSettings,
    dropped_prompts,
    learned_twist,
    make_program,
)

from llamppl import CachedCausalLM, run
from llamppl.constraints import Constraint
from llamppl.decoding.chemistry import Smiles, open_closures
from llamppl.decoding.text.characters import RegexPrefix
from llamppl.inference import ResampleMove, importance_sampling, smc_standard
from llamppl.models import HardConstraint

__all__ = ["METHODS", "main", "method_name", "run_method", "solve_method"]

METHODS = ("base", "lcd", "rerank", "smc-mask", "smc-lazy", "smc-plain", "smc-need", "smc-learned")
NAMES = {
    "base": "base LM",
    "lcd": "locally constrained",
    "rerank": "sample-rerank",
    "smc-mask": "llamppl SMC mask",
    "smc-lazy": "llamppl SMC lazy",
    "smc-plain": "llamppl SMC lazy, closure undeclared",
    "smc-need": "llamppl SMC lazy + need",
    "smc-learned": "llamppl SMC lazy + learned twist",
}
#: ``smc-learned``'s twist per task: the twist, its file, training CPU seconds and sharpness.
LEARNED: dict[str, dict[str, Any]] = {}


class CountedSmiles(Smiles):
    """The molecule task's constraint (``smiles(leading_space)``), its checks counted."""

    def __init__(self, leading_space: bool = True) -> None:
        super().__init__(leading_space)
        self.calls = 0

    def __call__(self, text: str) -> bool:
        self.calls += 1
        return super().__call__(text)

    def accepts_end(self, text: str) -> bool:
        self.calls += 1
        return super().accepts_end(text)


class CountedPlainSmiles(CountedSmiles):
    """The same checks, closure under prefixes not declared (``smc-plain``)."""

    prefix_closed = False


class CountedSmilesWithNeed(CountedSmiles):
    """The molecule checks plus a user's guide: ``need`` = open ring bonds and branches."""

    def need(self, lm: Any, state: str) -> int:
        return open_closures(state)


class CountedRegex(RegexPrefix):
    """The pattern task's constraint (``regex_prefix(pattern)``), its regex calls counted."""

    def __init__(self, pattern: str) -> None:
        super().__init__(pattern)
        self.calls = 0

    def __call__(self, text: str) -> bool:
        self.calls += 1
        return super().__call__(text)

    def accepts_end(self, text: str) -> bool:
        self.calls += 1
        return super().accepts_end(text)


class CountedPlainRegex(CountedRegex):
    """The same checks, closure under prefixes not declared (``smc-plain``)."""

    prefix_closed = False


class Anything(Constraint):
    """The constraint every text satisfies (unconstrained sampling with the stop rule)."""

    def __call__(self, text: str) -> bool:
        return True


@dataclass
class Outcome:
    particles: list[M.Particle]
    calls: int
    tokens: int
    extra: dict[str, Any]


def _constraint(instance: T.Instance, need: bool = False, plain: bool = False) -> Constraint:
    """The task's constraint, counted: closure undeclared (``plain``), a guide added (``need``)."""
    if isinstance(instance, T.PatternInstance):
        return CountedPlainRegex(instance.pattern) if plain else CountedRegex(instance.pattern)
    space = instance.constraint.leading_space  # as the task defines it (awrs_tasks)
    if plain:
        return CountedPlainSmiles(space)
    return CountedSmilesWithNeed(space) if need else CountedSmiles(space)


def _extensions(result) -> int:
    """Particle extensions of a run: N at the first step, then the live ones of each step."""
    n = result.stats.get("n_particles", len(result.particles))
    return n + sum(h.n_live for h in result.history[:-1])


def _particles(result, weighted: bool = True) -> list[M.Particle]:
    weights = result.weights if weighted else [float(w > -math.inf) for w in result.log_weights]
    total = sum(weights)
    out = []
    for p, w in zip(result.particles, weights):
        finished = p.finished and p.failure is None and len(p.context.generated) > 0
        finished = finished and int(p.context.tokens[-1]) in p.end_ids
        out.append(M.Particle(p.text, float(w / total) if total > 0 else 0.0, finished))
    return out


def run_method(
    method: str, lm: CachedCausalLM, instance: T.Instance, n: int, seed: int, move: int = 0
) -> Outcome:
    """One run of ``method`` with ``n`` particles on ``instance`` (the timed part); ``move`` > 0:
    the SMC methods with ``ResampleMove(k=move)``."""
    return run(solve_method(method, lm, instance, n, seed, move))


def method_name(method: str, move: int = 0) -> str:
    """The record's name of ``method`` (with its resample-move, if any)."""
    moved = move > 0 and method.startswith("smc")
    return NAMES[method] + (f" + resample-move k={move}" if moved else "")


async def solve_method(
    method: str, lm: CachedCausalLM, instance: T.Instance, n: int, seed: int, move: int = 0
) -> Outcome:
    """:func:`run_method` as a coroutine: runs of several instances at once share the LM."""
    prompt = instance.prompt(lm.tokenizer)
    common = dict(max_tokens=T.STOP.max_tokens, stop="newline", check_timeout=T.CHECK_TIMEOUT)
    if method in ("base", "rerank"):
        model = HardConstraint(lm, prompt, Anything(), "sample", truncated="keep", **common)
        result = await importance_sampling(model, 1 if method == "base" else n, seed=seed)
        particles = _particles(result, weighted=False)
        calls = 0
        if method == "rerank":  # weight each finished sample by the complete check
            check = _constraint(instance)
            particles = [
                M.Particle(
                    p.text, p.weight * float(p.finished and check.accepts_end(p.text)), p.finished
                )
                for p in particles
            ]
            total = sum(p.weight for p in particles)
            particles = [
                M.Particle(p.text, p.weight / total if total else 0.0, p.finished)
                for p in particles
            ]
            calls = check.calls
        return Outcome(particles, calls, _extensions(result), {})
    constraint = _constraint(instance, need=method == "smc-need", plain=method == "smc-plain")
    proposal = "mask" if method == "smc-mask" else "lazy"
    if method == "smc-learned":
        model = make_program(lm, instance, LEARNED[instance.task]["twist"], constraint)
    else:
        model = HardConstraint(lm, prompt, constraint, proposal, **common)
    if method == "lcd":
        result = await importance_sampling(model, 1, seed=seed)
        particles = _particles(result, weighted=False)  # the weight is ignored: local masking
    else:
        rejuvenate = ResampleMove(k=move) if move > 0 else None
        result = await smc_standard(model, n, 0.5, seed=seed, move=rejuvenate)
        particles = _particles(result)
    causes: dict[str, int] = {}
    for p in result.particles:
        if p.failure is not None:
            causes[p.failure.split(" (")[0]] = causes.get(p.failure.split(" (")[0], 0) + 1
    extra = {"log_ml": result.log_ml if result.log_ml > -math.inf else None, "failures": causes}
    if isinstance(constraint, Smiles):
        extra["parses"] = constraint.parses
    return Outcome(particles, constraint.calls, _extensions(result), extra)


async def solve(lm, method: str, instance: T.Instance, n: int, move: int, *, seed: int) -> dict:
    """One (method, instance) run for :func:`_concurrency.solve_all`: its outcome or error."""
    try:
        return {"outcome": await solve_method(method, lm, instance, n, seed, move), "error": None}
    except Exception as exc:  # noqa: BLE001 - a failed run is a row, not a crash
        return {"outcome": Outcome([], 0, 0, {}), "error": f"{type(exc).__name__}: {exc}"}


def make_record(
    method: str, instance: T.Instance, n: int, replicate: int, seed: int, done: dict, move: int = 0
) -> R.RunRecord:
    """The record of one run from what :func:`solve` returned, timed by ``solve_all``."""
    out = done.get("outcome") or Outcome([], 0, 0, {})
    error = done.get("error")
    score, valid = M.posterior_score(out.particles, instance.score) if out.particles else (0.0, 0.0)
    return R.RunRecord(
        method=method_name(method, move),
        task=instance.task,
        instance=instance.id,
        replicate=replicate,
        n_particles=1 if method in ("base", "lcd") else n,
        particles=out.particles,
        score=score,
        valid=valid,
        predicate_calls=out.calls,
        generated_tokens=out.tokens,
        cpu_seconds=done["cpu_seconds"],
        wall_seconds=done["wall_seconds"],
        error=error,
        extra={
            "seed": seed,
            "concurrency": done["concurrency"],
            **({"move_k": move} if move > 0 and method.startswith("smc") else {}),
            **out.extra,
            **(
                {k: v for k, v in LEARNED[instance.task].items() if k != "twist"}
                if method == "smc-learned"
                else {}
            ),
        },
    )


def main(task: str, argv: list[str] | None = None) -> None:
    """The benchmark of ``task``: methods x instances x replicates, then the table.

    The last line printed is machine-readable: ``{"awrs_report": [...]}`` (one row per method).
    """
    parser = argparse.ArgumentParser(
        description=f"The {task} benchmark of the AWRS paper (llamppl side)."
    )
    parser.add_argument("--instances", type=positive_int, default=4 if task == "molecules" else 8)
    parser.add_argument("--seed", type=nonnegative_int, default=T.PEER_SEED, help="instance draw")
    parser.add_argument("--replicates", type=positive_int, default=3)
    parser.add_argument("--start-replicate", type=nonnegative_int, default=0, help="resume a run")
    parser.add_argument("--methods", nargs="+", choices=METHODS, default=list(METHODS))
    parser.add_argument(
        "--particles", type=positive_int, nargs="+", default=[5, 10], help="for SMC"
    )
    parser.add_argument("--rerank", type=positive_int, default=10, help="samples of sample-rerank")
    parser.add_argument(
        "--mask-instances",
        type=nonnegative_int,
        default=None,
        help="instances for the mask proposal (default: all; 49k checks a step)",
    )
    parser.add_argument("--out", type=Path, default=Path(f"benchmarks/out/{task}.jsonl"))
    parser.add_argument("--peer", type=Path, nargs="*", default=[], help="peer record files")
    parser.add_argument("--threads", type=positive_int, default=1, help="torch threads")
    parser.add_argument("--report", action="store_true", help="only print the table")
    parser.add_argument("--retrain-twist", action="store_true", help="smc-learned: no cache")
    parser.add_argument(
        "--move",
        type=nonnegative_int,
        default=0,
        help="SMC methods with ResampleMove(k=MOVE) after resampling (0: none)",
    )
    add_concurrency_argument(parser)
    args = parser.parse_args(argv)
    if "smc-learned" in args.methods and args.seed == TRAIN_SEED:
        parser.error(f"--seed {TRAIN_SEED} draws smc-learned's training prompts; pick another")
    torch.set_num_threads(args.threads)
    print(f"[{task}] torch threads {torch.get_num_threads()}, out {args.out}", flush=True)
    if not args.report:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        lm = CachedCausalLM.default()
        instances = T.instances(task, args.instances, seed=args.seed)
        run_method("base", lm, instances[0], 1, 0)  # warm-up: trie, tables
        if "smc-learned" in args.methods:  # trained or loaded before any timed run
            settings = TwistSettings(task)
            twist, cpu, _ = learned_twist(lm, settings, instances, args.retrain_twist)
            LEARNED[task] = {
                "twist": twist.sharpened(SHARPNESS),
                "twist_file": settings.path(dropped_prompts(settings, instances)).name,
                "twist_training_cpu_s": cpu,
                "twist_sharpness": SHARPNESS,
            }
        runs = []  # (method, instance, n, replicate, seed)
        for rep in range(args.start_replicate, args.replicates):
            for k, inst in enumerate(instances):
                for method in args.methods:
                    if method == "smc-need" and task != "molecules":
                        continue  # the guide is a SMILES one
                    if method == "smc-mask" and args.mask_instances is not None:
                        if k >= args.mask_instances:
                            continue
                    sizes = args.particles if method.startswith("smc") else [args.rerank]
                    runs += [(method, inst, n, rep, 1000 * rep + k) for n in sizes]
        problems = [
            (solve, (method, inst, n, args.move), seed) for method, inst, n, _, seed in runs
        ]
        k = concurrency(args.concurrency, max(args.particles + [args.rerank]), len(runs))
        print(f"[{task}] {len(runs)} runs, {k} at once", flush=True)

        def write(i: int, done: dict) -> None:
            method, inst, n, rep, seed = runs[i]
            rec = make_record(method, inst, n, rep, seed, done, args.move)
            R.append_record(args.out, rec)
            print(
                f"  rep {rep} inst {inst.id:>3} {rec.method:<22} N={rec.n_particles:<3} "
                f"score {rec.score:.3f} valid {rec.valid:.2f} cpu {rec.cpu_seconds:6.1f}s "
                f"calls/tok {rec.predicate_calls / max(rec.generated_tokens, 1):7.2f}"
                f"{'  ' + rec.error if rec.error else ''}",
                flush=True,
            )

        solve_all(lm, problems, k, write)
    files = [args.out, *args.peer]
    print(R.report(R.read_records(*[f for f in files if f.is_file()])))


if __name__ == "__main__":  # pragma: no cover
    sys.exit("run bench_molecules.py or bench_patterns.py")
