"""Many problems in one forward: problems per CPU-second with K at once, beside one after another.

A data set is many prompts. ``run_many(jobs, lm, concurrency=K)`` runs K of them at once on
one event loop, so the particles of all K share each batched forward of the one LM; this
script measures what that buys, on the embedded SmolLM2 with one torch thread, each K
beside the same K problems one after another in the same run:

- ``hard``: the hard-constraint program (``HardConstraint`` with ``max_word_length(5)``,
  ``smc_standard`` N = 16 or ``--particles``, 30 tokens), prompts the first sentences of
  COLLIE-v1's example texts (not written here);
- ``collie``: COLLIE-v1's instances (``collie_constraint``, ``token_budget``, N = 8);
- ``json``: JSONSchemaBench's ``Github_easy`` schemas (``GrammarConstraint``, N = 4, 48 tokens).

For each K it prints CPU seconds and problems per CPU-second both ways, their ratio, the
peak resident memory of each way (``VmHWM``, reset before each), forward calls and tokens
run, and how many problems got the same log Ẑ and the same first text both ways (batched
float kernels may round differently unless the LM is batch-invariant:
``--batch-invariant on|off`` sets :attr:`~llamppl.CachedCausalLM.batch_invariant`, default
the LM's own). Records go to ``--out`` (one JSON line per K)::

    .venv/bin/python benchmarks/bench_throughput.py --task hard --sizes 1 4 16 64
    .venv/bin/python benchmarks/bench_throughput.py --task hard --sizes 16 --particles 8 \
        --batch-invariant on
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import time
from pathlib import Path
from typing import Any

import torch
from _args import positive_int

from llamppl import CachedCausalLM
from llamppl.constraints import collie_constraint, max_word_length, token_budget
from llamppl.distributed import Job, run_many
from llamppl.models import GrammarConstraint, HardConstraint

DATA = next(
    (up / "shared" / "data" for up in Path(__file__).resolve().parents if (up / "shared").is_dir()),
    Path(__file__).resolve().parents[2] / "shared" / "data",
)  # the nearest parent folder that has shared/
COLLIE = DATA / "collie" / "collie_v1.json"
SCHEMAS = DATA / "jsonschemabench" / "Github_easy"


# ---------------------------------------------------------------- the three programs
def hard_model(lm: Any, prompt: str) -> HardConstraint:
    """The hard-constraint program: no word longer than five letters, 30 tokens."""
    return HardConstraint(lm, prompt, max_word_length(5), max_tokens=30)


def collie_model(lm: Any, inst: dict) -> HardConstraint:
    """A COLLIE instance's constraint on its chat prompt, with the constraint's budget."""
    constraint = collie_constraint(inst)
    prompt = lm.apply_chat_template([{"role": "user", "content": inst["prompt"]}])
    return HardConstraint(lm, prompt, constraint, "lazy", token_budget(lm, constraint))


def json_model(lm: Any, schema: dict) -> GrammarConstraint:
    """A JSON object of the schema after a short instruction, 48 tokens."""
    prompt = lm.apply_chat_template(
        [
            {
                "role": "user",
                "content": "Write one JSON object for this schema: " + json.dumps(schema)[:400],
            }
        ]
    )
    return GrammarConstraint(lm, prompt, json_schema=schema, max_tokens=48)


def collie_instances() -> list[dict]:
    """COLLIE-v1's shared development half (its instances, in file order)."""
    return json.loads(COLLIE.read_text())["instances"]


def first_sentences(n: int) -> list[str]:
    """The first sentence (at most 8 words) of COLLIE-v1's example texts, distinct."""
    out: list[str] = []
    for inst in collie_instances():
        text = re.split(r"(?<=[.!?])\s", str(inst.get("example", "")).strip())[0]
        words = text.split()[:8]
        if len(words) >= 3 and " ".join(words) not in out:
            out.append(" ".join(words))
        if len(out) == n:
            break
    return out


def jobs_for(task: str, n: int, particles: int | None = None) -> list[Job]:
    """``n`` jobs of ``task`` (seed 0 each; one problem per job); ``particles`` overrides N."""
    if task == "hard":
        return [
            Job(hard_model, (p,), 0, "smc_standard", {"n_particles": particles or 16})
            for p in first_sentences(n)
        ]
    if task == "collie":
        instances = list({i["prompt"]: i for i in collie_instances()}.values())  # distinct
        return [
            Job(collie_model, (i,), 0, "smc_standard", {"n_particles": particles or 8})
            for i in instances[:n]
        ]
    files = sorted(SCHEMAS.glob("*.json"))[:n]
    return [
        Job(
            json_model,
            (json.loads(f.read_text()),),
            0,
            "smc_standard",
            {"n_particles": particles or 4},
        )
        for f in files
    ]


# ---------------------------------------------------------------- measuring
def reset_peak_memory() -> None:
    """Reset this process's peak resident set (``VmHWM``) so the next one is measured."""
    try:
        Path(f"/proc/{os.getpid()}/clear_refs").write_text("5")
    except OSError:
        pass


def peak_memory_mb() -> float:
    """Peak resident set since the last reset, in MB (``VmHWM``; nan where unavailable)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return math.nan


def measure(jobs: list[Job], lm: CachedCausalLM, concurrency: int) -> dict[str, Any]:
    """Run ``jobs`` ``concurrency`` at a time; CPU seconds, peak memory, work and results."""
    lm.clear_cache()
    before = {k: getattr(lm.stats, k) for k in ("forward_calls", "tokens_run")}
    reset_peak_memory()
    cpu0, wall0 = time.process_time(), time.perf_counter()
    results = run_many(jobs, lm, concurrency=concurrency, progress=False)
    cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
    return {
        "cpu_s": cpu,
        "wall_s": wall,
        "peak_mb": peak_memory_mb(),
        "forward_calls": lm.stats.forward_calls - before["forward_calls"],
        "tokens_run": lm.stats.tokens_run - before["tokens_run"],
        "log_ml": [r.log_ml for r in results],
        "first": [r.particles[0] if r.particles else None for r in results],
        "failed": sum(not r.ok for r in results),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--task", choices=["hard", "collie", "json"], default="hard")
    parser.add_argument("--sizes", type=positive_int, nargs="+", default=[1, 4, 16, 64])
    parser.add_argument("--threads", type=positive_int, default=1)
    parser.add_argument("--particles", type=positive_int, default=None, help="N per problem")
    parser.add_argument(
        "--batch-invariant",
        choices=["on", "off"],
        default=None,
        help="set CachedCausalLM.batch_invariant (default: the LM's own default)",
    )
    parser.add_argument(
        "--weights", default=None, help="CachedCausalLM.default(weights=...) (default: its own)"
    )
    parser.add_argument("--out", type=Path, default=None, help="JSON lines, one per size")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    lm = CachedCausalLM.default(**({"weights": args.weights} if args.weights else {}))
    if args.batch_invariant is not None:
        lm.batch_invariant = args.batch_invariant == "on"
    linear = sorted({type(m).__name__ for m in lm.model.modules() if "Linear" in type(m).__name__})
    caps = torch.cpu.get_capabilities()
    cpu = {
        "cpu": caps.get("cpu_name"),
        "cpu_flags": [f for f in ("avx2", "avx512_f", "amx_bf16") if caps.get(f)],
        "aten_capability": torch.backends.cpu.get_cpu_capability(),
        "forced": {
            k: v for k, v in os.environ.items() if k.endswith(("_INSTRUCTIONS", "_CAPABILITY"))
        },
    }
    print(
        f"[throughput] task {args.task}, torch threads {torch.get_num_threads()}, "
        f"batch_invariant={lm.batch_invariant}, share_prefix={lm.share_prefix}, "
        f"linear layers {'/'.join(linear)}; {cpu}",
        flush=True,
    )
    jobs = jobs_for(args.task, max(args.sizes), args.particles)
    measure(jobs[:1], lm, 1)  # warm-up: tables, trie, first forward
    print(
        f"{'K':>3}  {'serial CPU s':>12}  {'at once CPU s':>13}  {'problems/CPU-s':>16}  "
        f"{'ratio':>5}  {'peak MB (serial/once)':>21}  {'forwards':>15}  {'same log Z':>10}"
    )
    for k in args.sizes:
        batch = jobs[:k]
        alone = measure(batch, lm, 1)
        together = measure(batch, lm, k)
        rate = (k / alone["cpu_s"], k / together["cpu_s"])
        same = sum(
            a == b or (math.isinf(a) and math.isinf(b))
            for a, b in zip(alone["log_ml"], together["log_ml"])
        )
        same_text = sum(a == b for a, b in zip(alone["first"], together["first"]))
        row = {
            "task": args.task,
            "k": k,
            "particles": batch[0].options["n_particles"],
            "batch_invariant": lm.batch_invariant,
            "linear": linear,
            "threads": torch.get_num_threads(),
            **cpu,
            "serial": {key: v for key, v in alone.items() if key not in ("log_ml", "first")},
            "at_once": {key: v for key, v in together.items() if key not in ("log_ml", "first")},
            "ratio": rate[1] / rate[0],
            "same_log_ml": same,
            "same_first_text": same_text,
            "max_log_ml_gap": max(
                (
                    abs(a - b)
                    for a, b in zip(alone["log_ml"], together["log_ml"])
                    if math.isfinite(a) and math.isfinite(b)
                ),
                default=0.0,
            ),
        }
        print(
            f"{k:>3}  {alone['cpu_s']:>12.1f}  {together['cpu_s']:>13.1f}  "
            f"{rate[0]:>7.3f} / {rate[1]:<6.3f}  {row['ratio']:>5.2f}  "
            f"{alone['peak_mb']:>10.0f} / {together['peak_mb']:<9.0f}  "
            f"{alone['forward_calls']:>6} / {together['forward_calls']:<6}  {same:>4}/{k:<5}",
            flush=True,
        )
        if args.out is not None:
            args.out.parent.mkdir(parents=True, exist_ok=True)
            with args.out.open("a") as f:
                f.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()
