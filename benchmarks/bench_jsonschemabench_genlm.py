"""genlm-control on the JSONSchemaBench sample of ``bench_jsonschemabench.py`` (rows beside ours).

genlm-control is NOT a llamppl dependency and this script does not import llamppl:
run it with the Python of a separate environment that has genlm-control (see
``bench_structured_genlm.py``) and the converted SmolLM2 copy that
``CachedCausalLM.default()`` writes to ``~/.cache/llamppl``::

    /tmp/genlm-venv/bin/python benchmarks/bench_jsonschemabench_genlm.py \\
        --sample 50 --first 1 --out /tmp/jsb-genlm.jsonl
    python benchmarks/bench_jsonschemabench.py --out /tmp/jsb.jsonl \\
        --extra /tmp/jsb-genlm.jsonl --report

Same schemas (``sample(files, --sample, seed)`` as ``bench_jsonschemabench.py``: pass
the same ``--sample`` and ``--seed``, then ``--first`` runs only the first k of each
collection, round-robin), same chat prompt (JSONSchemaBench's system line, the
schema as ``json.dumps`` in the user message), N particles, token budget and seed.
Sampler: genlm-control's AWRS token sampler with its ``JsonSchema`` potential
coerced to the LM's byte tokens, SMC with ESS threshold 0.5, ``hf`` backend on CPU,
one torch thread. The ORIGINAL schema is given to genlm-control, under its own
semantics (Draft 7 validation, its own parser; no size or number budget).

Each schema runs in a child process with a wall-clock ``--timeout`` on its timed
part: a timeout is recorded as no output with the reason. The timed part is
potential construction plus SMC (model load and a tiny warm-up run excluded, as
the LM is warm in ours).
The returned object is a draw from the final weighted particles (as ours) and is
validated here, in the parent process, with ``jsonschema`` against the schema's
own draft (the parent never imports genlm-control, which patches ``jsonschema``).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import select
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from bench_jsonschemabench import (  # the same collections, seeded choice and check
    COLLECTIONS,
    DATA,
    sample,
    validates,
)

MODEL_DIR = Path(os.path.expanduser("~/.cache/llamppl/SmolLM2-135M-Instruct-fp32"))
SCHEMA_INSTRUCTION = "You need to generate a JSON object that matches the schema below."
WARMUP = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
METHOD = "genlm-control"
ANSI = re.compile(r"\x1b\[[0-9;]*m")


def chat_prompt(tokenizer, schema) -> str:
    """``models.structured.schema_prompt(lm, "", schema)`` for a dict schema."""
    messages = [
        {"role": "system", "content": SCHEMA_INSTRUCTION},
        {"role": "user", "content": json.dumps(schema)},
    ]
    return tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)


async def _smc(llm, schema, n: int, max_tokens: int, seed: int, verbosity: int = 0):
    from genlm.control import AWRS, JsonSchema

    coerced = JsonSchema(schema).coerce(llm, f=b"".join)
    sampler = AWRS(llm, coerced, seed=seed)
    try:
        return await sampler.smc(
            n_particles=n, ess_threshold=0.5, max_tokens=max_tokens, verbosity=verbosity
        )
    finally:
        await sampler.cleanup()


def worker(path: Path, n: int, max_tokens: int, seed: int) -> dict:
    """One schema through genlm-control (runs in the child process)."""
    import asyncio
    import random

    import torch

    torch.set_num_threads(1)
    from genlm.backend.llm import AsyncTransformer
    from genlm.control import PromptedLLM
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(MODEL_DIR)
    model = AutoModelForCausalLM.from_pretrained(MODEL_DIR, dtype=torch.float32)
    llm = PromptedLLM(AsyncTransformer(model, tok))
    llm.prompt_ids = tok.encode(chat_prompt(tok, WARMUP), add_special_tokens=False)
    asyncio.run(_smc(llm, WARMUP, 2, 4, seed))  # warm-up: tries and caches
    print("ready", flush=True)  # the parent's timeout starts here
    schema = json.loads(path.read_text())
    llm.prompt_ids = tok.encode(chat_prompt(tok, schema), add_special_tokens=False)
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    t, cpu = time.perf_counter(), time.process_time()
    try:
        with contextlib.redirect_stdout(sys.stderr):  # each step's particles, for a timeout
            seqs = asyncio.run(_smc(llm, schema, n, max_tokens, seed, verbosity=1))
    except Exception as exc:  # noqa: BLE001 - genlm refuses the schema: recorded, not fatal
        seconds, cpu = time.perf_counter() - t, time.process_time() - cpu
        reason = f"{type(exc).__name__}: {exc}"[:300]
        return {
            "seconds": seconds,
            "cpu_seconds": cpu,
            "tokens": 0,
            "text": None,
            "refused": reason,
        }
    seconds, cpu = time.perf_counter() - t, time.process_time() - cpu
    # completed, decodable particles with positive weight (all -inf weights: no output)
    items = [(s, float(w)) for s, w in seqs.decoded_posterior.items() if w > 0]
    text = None
    if items:
        p = np.array([w for _, w in items])
        text = items[int(np.random.default_rng(seed).choice(len(p), p=p / p.sum()))][0]
    return {
        "seconds": seconds,
        "cpu_seconds": cpu,
        "tokens": sum(len(c) for c in seqs.contexts),  # generated tokens incl. EOS, final particles
        "text": text,
        "log_ml": float(seqs.log_ml),
        "ess": float(seqs.ess),
    }


def run_child(path: Path, args) -> dict:
    """The worker in a child process, killed ``args.timeout`` s after its warm-up ends.

    The child prints ``ready`` once the model is loaded and warmed up, so the
    timeout bounds the timed part (the setup gets its own ``args.timeout``).
    """
    cmd = [sys.executable, __file__, "--worker", str(path), "--particles", str(args.particles)]
    cmd += ["--max-tokens", str(args.max_tokens), "--seed", str(args.seed)]
    with tempfile.TemporaryFile("w+") as err:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=err, text=True)
        ready, _, _ = select.select([proc.stdout], [], [], args.timeout)
        if ready:
            proc.stdout.readline()
        t = time.perf_counter()
        try:
            out, _ = proc.communicate(timeout=args.timeout if ready else 0)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
            seconds = time.perf_counter() - t
            what = "result" if ready else "model load and warm-up"
            reason = f"timeout: no {what} within {args.timeout:g} s (child killed)"
            err.seek(0)
            steps = [x for x in ANSI.sub("", err.read()).splitlines() if ":\t[" in x]
            last = [x[:200] + " ... " + x[-200:] for x in steps[-args.particles :]]
            return {
                "seconds": seconds,
                "tokens": 0,
                "text": None,
                "timeout": reason,
                "particle_steps": len(steps),  # particle extensions printed before the kill
                "last_particles": last,  # "log weight:\t[token|token|...]" at the kill
            }
        err.seek(0)
        stderr = err.read()
    lines = out.strip().splitlines()
    if proc.returncode != 0 or not lines:
        reason = f"child exit {proc.returncode}: {stderr.strip()[-300:]}"
        return {"seconds": 0.0, "tokens": 0, "text": None, "refused": reason}
    return json.loads(lines[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, default=DATA)
    parser.add_argument("--collections", nargs="+", default=list(COLLECTIONS))
    parser.add_argument("--sample", type=int, default=50, help="as in bench_jsonschemabench.py")
    parser.add_argument("--first", type=int, default=1, help="run the first k sampled schemas")
    parser.add_argument("--particles", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=256)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds per schema")
    parser.add_argument("--out", type=Path, default=Path("jsonschemabench-genlm.jsonl"))
    parser.add_argument("--worker", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    for name in ("sample", "first", "particles", "max_tokens"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')}: must be a positive integer")
    if args.worker is not None:
        print(json.dumps(worker(args.worker, args.particles, args.max_tokens, args.seed)))
        return
    if not args.data.is_dir():
        parser.error(f"--data: no directory {args.data}")

    records = [json.loads(line) for line in args.out.open()] if args.out.exists() else []
    done = {(r["collection"], r["schema"], r["n"]) for r in records}
    samples = {
        c: sample(sorted((args.data / c).glob("*.json")), args.sample, args.seed)
        for c in args.collections
    }
    with args.out.open("a") as fh:
        for i in range(args.first):
            for c in args.collections:
                if i >= len(samples[c]) or (c, samples[c][i].name, args.particles) in done:
                    continue
                f = samples[c][i]
                record = {"kind": "gen", "collection": c, "schema": f.name, "method": METHOD}
                record.update(n=args.particles, max_tokens=args.max_tokens)
                record.update(run_child(f, args))
                record["valid"] = validates(json.loads(f.read_text()), record["text"])
                fh.write(json.dumps(record) + "\n")
                fh.flush()
                print(
                    f"{c} {i + 1} {f.name} {METHOD}: valid={record['valid']} "
                    f"{record['seconds']:.1f}s tokens={record['tokens']}",
                    flush=True,
                )


if __name__ == "__main__":
    main()
