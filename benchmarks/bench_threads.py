"""Torch thread count and OpenMP wait policy against the time of a quickstart-style run.

Each configuration runs in a fresh Python process (``OMP_WAIT_POLICY`` is read
once, when the OpenMP runtime starts): load the embedded SmolLM2
(``CachedCausalLM.default()``), then ``smc_standard`` with N = 16 particles on the
quickstart's no-long-words program. The thread counts are 1, 2 and torch's own
default on this machine (``torch.get_num_threads()`` in a fresh process), each
set through ``LLAMPPL_NUM_THREADS``, and "library", which sets nothing and so
measures what ``llamppl.threads.apply_default_threads`` chooses. Wait policies:
unset (the runtime's default), ``passive`` and ``active``.

Times are wall seconds; configurations are interleaved over ``--repeats`` rounds
so that a change in the machine's load hits every column alike, and the median
is printed. ``--label`` names the column (``under load`` / ``idle``), so the same
command can be rerun on an idle machine::

    python benchmarks/bench_threads.py --label "under load"
    python benchmarks/bench_threads.py --label idle

A configuration that exceeds ``--timeout`` seconds prints ``>T``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

from _args import positive_int

CHILD = r"""
import json, re, sys, time
import torch
t0 = time.perf_counter()
from llamppl import CachedCausalLM, LMContext, Model, run
from llamppl.inference import smc_standard

class NoLongWords(Model):
    def __init__(self, lm, prompt, max_tokens):
        super().__init__()
        self.context = LMContext(lm, prompt)
        self.max_tokens = max_tokens

    async def step(self):
        token = await self.sample(self.context.next_token())
        self.condition(all(len(w) <= 5 for w in re.findall(r"[A-Za-z]+", str(self.context))))
        if token in self.context.lm.eos_token_ids or len(self.context.generated) >= self.max_tokens:
            self.finish()

lm = CachedCausalLM.default()
t1 = time.perf_counter()
result = run(smc_standard(NoLongWords(lm, "The Fed says", int(sys.argv[1])), 16, seed=0, progress=False))
t2 = time.perf_counter()
print(json.dumps({"load": t1 - t0, "run": t2 - t1, "threads": torch.get_num_threads(),
                  "tokens": result.stats["tokens_run"]}))
"""


def torch_default_threads() -> int:
    """torch's intra-op thread count in a fresh process with no thread variables set."""
    env = {k: v for k, v in os.environ.items() if k not in THREAD_VARS}
    out = subprocess.run(
        [sys.executable, "-c", "import torch; print(torch.get_num_threads())"],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    return int(out.stdout.strip())


THREAD_VARS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "LLAMPPL_NUM_THREADS", "OMP_WAIT_POLICY")


def measure(threads: str, policy: str, max_tokens: int, timeout: float) -> dict | None:
    """One fresh process; None if it ran past ``timeout`` seconds."""
    env = {k: v for k, v in os.environ.items() if k not in THREAD_VARS}
    env["LLAMPPL_PROGRESS"] = "0"
    if threads != "library":
        env["LLAMPPL_NUM_THREADS"] = threads
    if policy != "unset":
        env["OMP_WAIT_POLICY"] = policy
    try:
        out = subprocess.run(
            [sys.executable, "-c", CHILD, str(max_tokens)],
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
    except subprocess.TimeoutExpired:
        return None
    if out.returncode != 0:
        raise RuntimeError(f"threads={threads} policy={policy} failed:\n{out.stderr}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--label", default="under load", help="name of this machine state")
    parser.add_argument("--repeats", type=positive_int, default=1, help="interleaved rounds")
    parser.add_argument("--max-tokens", type=positive_int, default=30, help="tokens per particle")
    parser.add_argument(
        "--timeout", type=float, default=240.0, help="seconds before a run counts as >T"
    )
    parser.add_argument(
        "--policies",
        default="unset,passive,active",
        help="comma-separated OMP_WAIT_POLICY values (unset = not set)",
    )
    args = parser.parse_args()

    default = torch_default_threads()
    counts = sorted({"1", "2", str(default)}, key=int) + ["library"]
    policies = args.policies.split(",")
    print(
        f"# {args.label}: load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs; "
        f"torch default threads {default}; smc_standard N=16, max {args.max_tokens} tokens",
        flush=True,
    )
    times: dict[tuple[str, str], list[tuple[float, float]]] = {}
    seen: dict[str, int] = {}
    for _ in range(args.repeats):
        for policy in policies:
            for threads in counts:
                t = time.perf_counter()
                r = measure(threads, policy, args.max_tokens, args.timeout)
                cell = (r["load"], r["run"]) if r else (float("inf"), float("inf"))
                times.setdefault((threads, policy), []).append(cell)
                if r:
                    seen[threads] = r["threads"]
                wall = time.perf_counter() - t
                print(
                    f"  threads={threads:<8} OMP_WAIT_POLICY={policy:<8} {wall:6.1f}s", flush=True
                )

    def fmt(x: float) -> str:
        return f">{args.timeout:.0f}" if x == float("inf") else f"{x:.1f}"

    print(f"\n| threads | OMP_WAIT_POLICY | load s ({args.label}) | run s ({args.label}) |")
    print("| --- | --- | --- | --- |")
    for policy in policies:
        for threads in counts:
            cells = times[(threads, policy)]
            load = statistics.median(c[0] for c in cells)
            runs = statistics.median(c[1] for c in cells)
            name = threads
            if threads == "library":
                name = f"library default ({seen.get('library', '?')})"
            elif int(threads) == default:
                name = f"{threads} (torch default)"
            print(f"| {name} | {policy} | {fmt(load)} | {fmt(runs)} |")


if __name__ == "__main__":
    main()
