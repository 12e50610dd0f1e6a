"""Ours against genlm/llamppl 0.2.3 on the LLaMPPL paper's hard constraint, side by side (not a test).

The task (LLaMPPL paper §2.2): continue "The Fed says" so that no word is longer than
5 letters, with the token-masking proposal (observe "next token is allowed", then
sample the masked next token), N = 16 particles, the embedded SmolLM2-135M (ours: the
default ``CachedCausalLM.default()``, float16-weight linear layers on a CPU; the peer: the
same converted weights in float32, its own loader),
stopping at EOS or after T generated tokens; ``smc_standard`` and ``smc_steer`` (K = 3)
at T = 30 and 100. Ours runs in this process (``HardConstraint`` + ``max_word_length(5)``);
the peer runs in a subprocess of its own venv (``scripts/setup-peer.sh`` makes
``.venv-peer``; it has the same import name ``llamppl``, so it never shares ours). The
peer loads the same converted SmolLM2 from ``~/.cache/llamppl`` by local path (no hub),
with its ``hf`` backend (``AsyncTransformer``), caches the prompt's K/V with
``cache_kv`` as its own hard-constraint example does, and batches each step in one
forward (``batch_size`` = the step's request count). Both programs use the same allowed
token sets: this process computes ``max_word_length(5)``'s mask for each trailing-word
length r = 0..5 and hands them to the peer, which tracks r per particle.

Ours and the peer's runs alternate (same configuration and seed back to back), so both
see the same machine load; the table gives the median over ``--repeats`` of wall time,
process CPU time (robust to other load with one thread), tokens run through the
transformer and forward calls, and the ratios peer / ours. Both fix and print the torch
thread count::

    bash scripts/setup-peer.sh
    .venv/bin/python benchmarks/bench_peer.py --tokens 30 100 --repeats 3
    .venv/bin/python benchmarks/bench_peer.py --tokens 30 --repeats 1 --seed 1   # one more seed
"""

from __future__ import annotations

import argparse
import json
import os
import select
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PROMPT = "The Fed says"
MAX_LETTERS = 5
MODEL_DIR = Path(os.path.expanduser("~/.cache/llamppl/SmolLM2-135M-Instruct-fp32"))
MARK = "@@ "  # prefix of the worker's protocol lines (anything else on its stdout is ignored)


# ============================================================== peer side (runs in .venv-peer)
def worker(spec_path: str) -> None:
    """Serve jobs from stdin, one JSON line each, with genlm/llamppl; answer one JSON line each."""
    import asyncio
    import importlib.metadata as md
    import random

    import numpy as np
    import torch

    spec = json.loads(Path(spec_path).read_text())
    torch.set_num_threads(spec["threads"])
    from genlm.backend.llm import AsyncTransformer
    from transformers import AutoModelForCausalLM, AutoTokenizer

    # genlm/llamppl 0.2.3 from .venv-peer (this file runs there with -P), not ours:
    from llamppl import CachedCausalLM, LMContext, Model, smc_standard, smc_steer

    masks = [set(m) for m in spec["masks"]]  # allowed ids by trailing letter run r
    pure, tail, eos = spec["pure"], spec["tail"], set(spec["eos"])
    counts = {"forward_calls": 0, "tokens_run": 0}

    def counted(name, tokens_of):
        inner = getattr(AsyncTransformer, name)

        def wrapper(self, *a, **kw):
            n = tokens_of(self, *a, **kw)
            if n:
                counts["forward_calls"] += 1
                counts["tokens_run"] += n
            return inner(self, *a, **kw)

        setattr(AsyncTransformer, name, wrapper)

    def batch_tokens(self, queries, *a, **kw):  # the peer runs each distinct prompt once
        return sum(len(p) for p in {tuple(q.prompt) for q in queries})

    def sync_tokens(self, token_ids, *a, **kw):
        _, matched, _, base = self.walk_cache(token_ids)
        return 0 if matched == len(token_ids) else len(token_ids) - base

    counted("_evaluate_queries", batch_tokens)
    counted("next_token_logprobs_sync", sync_tokens)
    counted("cache_kv", lambda self, prompt, *a, **kw: len(prompt))

    class FedSays(Model):
        """The hard-constraint program in the peer's DSL (mask observe, then sample)."""

        def __init__(self, lm, max_tokens):
            super().__init__()
            self.context = LMContext(lm, PROMPT)
            self.max_tokens, self.run, self.generated = max_tokens, 0, 0

        async def step(self):
            await self.observe(self.context.mask_dist(masks[self.run]), True)
            token = await self.sample(self.context.next_token())
            self.generated += 1
            tid = int(token.token_id)
            if tid in eos:
                self.finish()
                return
            self.run = self.run + pure[tid] if pure[tid] >= 0 else tail[tid]
            if self.generated >= self.max_tokens:
                self.finish()

        def string_for_serialization(self):
            return str(self.context)

    tok = AutoTokenizer.from_pretrained(spec["model_dir"])
    hf = AutoModelForCausalLM.from_pretrained(spec["model_dir"], dtype=torch.float32)
    lm = CachedCausalLM(AsyncTransformer(hf, tok))
    prompt_ids = tok.encode(PROMPT)

    def job(method: str, tokens: int, n: int, beam: int, seed: int) -> dict:
        lm.clear_cache()
        random.seed(seed)
        np.random.seed(seed)
        torch.manual_seed(seed)
        lm.model.batch_size = n * (beam if method == "smc_steer" else 1)
        counts.update(forward_calls=0, tokens_run=0)
        t0, c0 = time.perf_counter(), time.process_time()
        lm.cache_kv(prompt_ids)
        model = FedSays(lm, tokens)
        if method == "smc_steer":
            parts = asyncio.run(smc_steer(model, n, beam))
        else:
            parts = asyncio.run(smc_standard(model, n))
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
        gen = statistics.mean(p.generated for p in parts)
        return {"wall": wall, "cpu": cpu, "generated": gen, **counts}

    job("smc_standard", 2, 2, 1, 0)  # warm-up
    print(
        MARK
        + json.dumps(
            {"ready": True, "threads": torch.get_num_threads(), "version": md.version("llamppl")}
        ),
        flush=True,
    )
    for line in sys.stdin:
        if line.strip():
            print(MARK + json.dumps(job(**json.loads(line))), flush=True)


# ============================================================== our side
class Peer:
    """The peer worker subprocess: send a job, wait (with a time limit) for its answer."""

    def __init__(self, python: str, spec_path: str) -> None:
        self.cmd = [python, "-P", os.path.abspath(__file__), "--worker", spec_path]
        self.proc: subprocess.Popen | None = None
        self.info: dict = {}

    def start(self) -> None:
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
        self.proc = subprocess.Popen(
            self.cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env
        )
        self.info = self._answer(1800)
        if not self.info or not self.info.get("ready"):
            raise RuntimeError(f"the peer worker did not start: {' '.join(self.cmd)}")

    def _answer(self, timeout: float) -> dict | None:
        assert self.proc is not None and self.proc.stdout is not None
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self.proc.stdout], [], [], left)[0]:
                return None
            line = self.proc.stdout.readline()
            if not line:
                raise RuntimeError(f"the peer worker exited (code {self.proc.poll()})")
            if line.startswith(MARK):
                return json.loads(line[len(MARK) :])

    def run(self, timeout: float, **job) -> dict | None:
        """The job's answer, or None if it took longer than ``timeout`` s (the worker is restarted)."""
        if self.proc is None:
            self.start()
        assert self.proc is not None and self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(job) + "\n")
        self.proc.stdin.flush()
        out = self._answer(timeout)
        if out is None:
            self.stop()
        return out

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()
            self.proc = None


def trailing_letters(text: str) -> int:
    """Length of the run of letters that ends ``text`` (the constraint's r after it)."""
    n = 0
    while n < len(text) and text[-1 - n].isalpha():
        n += 1
    return n


def make_spec(lm, threads: int) -> dict:
    """Allowed ids per trailing letter run r (ours' mask), and how each token moves r."""
    from llamppl.models import max_word_length

    constraint = max_word_length(MAX_LETTERS)
    masks = [
        constraint.allowed_mask(lm, "a" * r).nonzero().flatten().tolist()
        for r in range(MAX_LETTERS + 1)
    ]
    pure = [len(t) if t.isalpha() or not t else -1 for t in lm.vocab]
    tail = [trailing_letters(t) for t in lm.vocab]
    return {
        "masks": masks,
        "pure": pure,
        "tail": tail,
        "eos": sorted(lm.eos_token_ids),
        "threads": threads,
        "model_dir": str(MODEL_DIR),
    }


def run_ours(lm, method: str, tokens: int, n: int, beam: int, seed: int) -> dict:
    from llamppl import run
    from llamppl.inference import smc_standard, smc_steer
    from llamppl.models import HardConstraint, max_word_length

    lm.clear_cache()
    lm.stats.reset()
    t0, c0 = time.perf_counter(), time.process_time()
    model = HardConstraint(lm, PROMPT, max_word_length(MAX_LETTERS), "mask", max_tokens=tokens)
    if method == "smc_steer":
        result = run(smc_steer(model, n, beam, seed=seed, progress=False))
    else:
        result = run(smc_standard(model, n, seed=seed, progress=False))
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    gen = statistics.mean(len(p.context.generated) for p in result.particles)
    return {
        "wall": wall,
        "cpu": cpu,
        "generated": gen,
        "forward_calls": lm.stats.forward_calls,
        "tokens_run": lm.stats.tokens_run,
    }


def median(rows: list[dict], key: str) -> float:
    return statistics.median(r[key] for r in rows)


def main() -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from _args import nonnegative_int, positive_int

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=positive_int, nargs="+", default=[30, 100])
    ap.add_argument("--methods", nargs="+", default=["smc_standard", "smc_steer"],
                    choices=["smc_standard", "smc_steer"])  # fmt: skip
    ap.add_argument("--particles", type=positive_int, default=16)
    ap.add_argument("--beam", type=positive_int, default=3, help="K of smc_steer")
    ap.add_argument("--repeats", type=positive_int, default=3, help="runs per row (median)")
    ap.add_argument("--seed", type=nonnegative_int, default=0,
                    help="seed of the first repeat (repeats use seed, seed + 1, ...)")  # fmt: skip
    ap.add_argument("--peer-repeats-long", type=positive_int, default=None,
                    help="repeats of rows with T >= 100 (default --repeats): the peer is slow")  # fmt: skip
    ap.add_argument("--threads", type=positive_int, default=1, help="torch threads, both sides")
    ap.add_argument("--peer-python", default=".venv-peer/bin/python",
                    help="Python of the peer's venv (scripts/setup-peer.sh)")  # fmt: skip
    ap.add_argument("--peer-timeout", type=positive_int, default=3600,
                    help="seconds after which one peer run is stopped and reported as '>'")  # fmt: skip
    args = ap.parse_args()
    if not Path(args.peer_python).is_file():
        ap.error(f"--peer-python {args.peer_python} not found: run `bash scripts/setup-peer.sh`")

    import torch

    from llamppl import CachedCausalLM

    torch.set_num_threads(args.threads)
    lm = CachedCausalLM.default()
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(make_spec(lm, args.threads), f)
    peer = Peer(args.peer_python, f.name)
    try:
        peer.start()
        run_ours(lm, "smc_standard", 2, 2, 1, 0)  # warm-up (word tables, first forwards)
        print(
            f"ours: torch {torch.__version__}, threads {torch.get_num_threads()}; peer: "
            f"genlm/llamppl {peer.info['version']}, threads {peer.info['threads']}; "
            f"N = {args.particles}, K = {args.beam}; SmolLM2-135M on the CPU, our linear layers "
            f"{'/'.join(sorted({type(m).__name__ for m in lm.model.modules() if 'Linear' in type(m).__name__}))}"
            ", the peer's float32"
        )
        rows = []
        for method in args.methods:
            for tokens in args.tokens:
                reps = args.repeats
                if tokens >= 100 and args.peer_repeats_long is not None:
                    reps = args.peer_repeats_long
                ours, theirs, stopped = [], [], False
                for seed in range(args.seed, args.seed + reps):
                    ours.append(run_ours(lm, method, tokens, args.particles, args.beam, seed))
                    job = dict(method=method, tokens=tokens, n=args.particles, beam=args.beam)
                    out = peer.run(args.peer_timeout, seed=seed, **job)
                    stopped |= out is None
                    if out is not None:
                        theirs.append(out)
                    print(
                        f"  {method} T={tokens} seed {seed}: ours {ours[-1]}; peer {out}",
                        flush=True,
                    )
                rows.append((method, tokens, reps, ours, theirs, stopped))
    finally:
        peer.stop()
        os.unlink(f.name)

    print(f"\nmedians of the repeats ({args.threads} thread(s) each side; peer / ours = speed-up)")
    head = (
        f"{'method':<13}{'T':>4}{'reps':>5} | {'ours s':>7}{'CPU s':>7}{'tokens':>7}{'fwd':>5}"
        f"{'gen':>6} | {'peer s':>8}{'CPU s':>8}{'tokens':>8}{'fwd':>6}{'gen':>6}"
        f" | {'wall x':>7}{'CPU x':>7}{'tok x':>7}"
    )
    print(head)
    for method, tokens, reps, ours, theirs, stopped in rows:
        o = {k: median(ours, k) for k in ours[0]}
        line = (
            f"{method:<13}{tokens:>4}{reps:>5} | {o['wall']:>7.2f}{o['cpu']:>7.2f}"
            f"{o['tokens_run']:>7.0f}{o['forward_calls']:>5.0f}{o['generated']:>6.1f} | "
        )
        if theirs:
            t = {k: median(theirs, k) for k in theirs[0]}
            line += (
                f"{t['wall']:>8.1f}{t['cpu']:>8.1f}{t['tokens_run']:>8.0f}{t['forward_calls']:>6.0f}"
                f"{t['generated']:>6.1f} | {t['wall'] / o['wall']:>6.1f}x{t['cpu'] / o['cpu']:>6.1f}x"
                f"{t['tokens_run'] / o['tokens_run']:>6.1f}x"
            )
        if stopped:
            line += f"  ({reps - len(theirs)} peer run(s) stopped after {args.peer_timeout} s)"
        print(line)


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--worker":
        worker(sys.argv[2])
    else:
        main()
