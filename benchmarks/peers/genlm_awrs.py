"""genlm-control 0.4.1 AWRS-SMC on the molecule and pattern tasks (the peer rows of their benchmarks).

genlm-control is NOT a llamppl dependency: run this script with the Python of ``.venv-genlm``
(``bash scripts/setup-genlm.sh``), which also has ``partialsmiles``, ``rdkit`` and ``regex``.
The tasks' checks are llamppl's constraints (``smiles``, ``regex_prefix``: the same checks
on both sides), so the script imports llamppl from this checkout when that venv has no
llamppl of its own (the repository root is appended to ``sys.path``; llamppl needs only
torch, transformers, numpy, tqdm and regex at import). It loads the SmolLM2-135M-Instruct
copy that our ``CachedCausalLM.default()`` converts into ``~/.cache/llamppl`` (by local
path, offline)::

    .venv-genlm/bin/python benchmarks/peers/genlm_awrs.py --task molecules --instances 4 \\
        --replicates 3 --seed 1234 --cpu-timeout 400 --out benchmarks/results/genlm_awrs_molecules.jsonl
    python benchmarks/awrs_report.py benchmarks/results/genlm_awrs_molecules.jsonl

What runs, for each (replicate, instance), replicate-major:

- the task's prompt, instances, constraint and stopping rule from ``benchmarks/awrs_tasks.py``,
  the metric from ``awrs_metrics.py`` and the records of ``awrs_records.py`` (the modules our
  benchmarks use);
- ``PromptedLLM`` over genlm-backend's ``hf`` backend (``AsyncTransformer``) on CPU with one
  torch thread; its EOS set is every token that ends the text under ``awrs_tasks.STOP``
  (the tokenizer's EOS and every token containing a newline);
- the task's constraint as a genlm ``Potential`` over bytes (its ``prefix`` / ``complete`` call
  ``instance.prefix_ok`` / ``instance.complete_ok`` on the UTF-8 text, a trailing incomplete
  UTF-8 character being left for the next token) coerced to the LM's byte tokens with
  ``f=b"".join``; every call is counted, and a check past its time bound
  (``awrs_tasks.CHECK_TIMEOUT``, llamppl's time bound) counts as a rejection;
- ``AWRS(llm, condition, seed=...)`` and ``sampler.smc(n_particles, ess_threshold=0.5,
  max_tokens=100)``: genlm-control's AWRS token sampler inside its SMC. At the 100-token
  boundary genlm-control appends EOS with the weight correction of its length-conditioned
  target; such particles are recorded as *cut* (``finished=False``).

Each (instance, replicate) runs in a child process: it loads the model, runs a small warm-up
SMC on another prompt, prints ``ready``, then runs the timed part (the prompt's K/V, then SMC).
The parent kills it ``--timeout`` wall seconds or ``--cpu-timeout`` CPU seconds after ``ready``,
whichever comes first, and records the cause; the CPU seconds of a timed-out run are the
child's CPU after ``ready`` until the kill (a lower bound on the run's cost). On a shared
machine the CPU bound is the meaningful one: the wall clock also counts other processes.

``AsyncTransformer`` keeps log-probabilities in a token trie but reuses K/V only from nodes
given one by ``cache_kv``; without that call every step reruns the whole prompt (700 tokens
for a molecule prompt). The timed part therefore starts with ``backend.cache_kv(prompt_ids)``,
the backend's documented way to cache a prompt; ``--no-cache-prompt`` leaves it out (method
name ``genlm-control AWRS-SMC (prompt rerun)``). Generated tokens are still rerun at each
step, as the backend does.

Records are appended to ``--out`` in the shared JSON-lines format (``awrs_records.RunRecord``)
as they finish; a rerun skips (method, instance, replicate, N) already in the file, and
``--start-replicate`` lets two processes split the replicates between two files.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))  # awrs_tasks, awrs_metrics, awrs_records
if importlib.util.find_spec("llamppl") is None:  # .venv-genlm: llamppl from this checkout
    sys.path.append(str(ROOT))
import awrs_metrics as M  # noqa: E402
import awrs_records as R  # noqa: E402
import awrs_tasks as T  # noqa: E402

from llamppl.constraints import CheckTimeout  # noqa: E402

MODEL_DIR = Path(
    os.environ.get(
        "LLAMPPL_PEER_MODEL", os.path.expanduser("~/.cache/llamppl/SmolLM2-135M-Instruct-fp32")
    )
)
METHOD = "genlm-control AWRS-SMC"
ESS_THRESHOLD = 0.5


# ----------------------------------------------------------------------------- child side


def decode_prefix(data: bytes) -> str | None:
    """The text of a byte prefix: a trailing incomplete UTF-8 character dropped; None if invalid."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        if exc.reason == "unexpected end of data" and exc.end == len(data):
            return data[: exc.start].decode("utf-8")
        return None


def make_condition(instance: T.Instance, counts: dict):
    """The instance's constraint as a genlm-control Potential over bytes, counting its calls."""
    from genlm.control import Potential

    class TaskCondition(Potential):
        """0 (allowed) or -inf (forbidden) from the task's prefix / complete check."""

        def __init__(self):
            super().__init__(vocabulary=list(range(256)))

        def _check(self, context, complete: bool) -> float:
            counts["predicate_calls"] += 1
            data = bytes(context)
            text = data.decode("utf-8", errors="strict") if complete else decode_prefix(data)
            if text is None:
                return float("-inf")
            try:
                ok = instance.complete_ok(text) if complete else instance.prefix_ok(text)
            except CheckTimeout:
                counts["check_timeouts"] += 1
                ok = False
            return 0.0 if ok else float("-inf")

        async def prefix(self, context):
            return self._check(context, complete=False)

        async def complete(self, context):
            try:
                return self._check(context, complete=True)
            except UnicodeDecodeError:
                counts["predicate_calls"] += 1
                return float("-inf")

    return TaskCondition()


def counting_awrs(counts: dict, cut: set):
    """genlm-control's AWRS, counting token draws and remembering where EOS was forced."""
    from genlm.control import AWRS

    class CountingAWRS(AWRS):
        async def sample(self, context, draw=None, verbosity=0):
            result = await super().sample(context, draw=draw, verbosity=verbosity)
            counts["generated_tokens"] += 1
            print(
                f"progress {counts['predicate_calls']} {counts['generated_tokens']}",
                file=sys.stderr,
                flush=True,
            )
            return result

        async def logw_eos(self, context):  # only at the max_tokens boundary
            cut.add(tuple(context))
            return await super().logw_eos(context)

    return CountingAWRS


def stop_byte_strings(backend) -> list[bytes]:
    """Byte strings of every token that ends the text under ``awrs_tasks.STOP``."""
    ids = T.STOP.stop_token_ids(backend.byte_vocab, [backend.tokenizer.eos_token_id])
    return sorted({bytes(backend.byte_vocab[i]) for i in ids})


def warmup_instance(task: str) -> T.Instance:
    """A small instance, not one of the measured prompts, to warm the model and the checks."""
    if task == "molecules":
        return T.MoleculeInstance("molecules", -1, ("CCO", "c1ccccc1"))
    return T.PatternInstance("patterns", -1, "[a-z]+")


async def run_smc(llm, instance, counts, cut, n, max_tokens, seed):
    condition = make_condition(instance, counts).coerce(llm, f=b"".join)
    sampler = counting_awrs(counts, cut)(llm, condition, seed=seed)
    try:
        return await sampler.smc(n_particles=n, ess_threshold=ESS_THRESHOLD, max_tokens=max_tokens)
    finally:
        await sampler.cleanup()


def worker(args) -> dict:
    """One (instance, replicate) through genlm-control (runs in the child process)."""
    import asyncio
    import random

    import torch

    torch.set_num_threads(1)
    from genlm.backend.llm import AsyncTransformer
    from genlm.control import PromptedLLM
    from genlm.control.constant import EndOfSequence
    from transformers import AutoModelForCausalLM, AutoTokenizer

    instance = T.instances(args.task, args.instances, seed=args.seed)[args.worker]
    tok = AutoTokenizer.from_pretrained(MODEL_DIR)
    model = AutoModelForCausalLM.from_pretrained(MODEL_DIR, dtype=torch.float32)
    backend = AsyncTransformer(model, tok)
    llm = PromptedLLM(backend, eos_byte_strings=stop_byte_strings(backend))

    def encode(inst):
        return tok.encode(inst.prompt(tok), add_special_tokens=False)

    warm = warmup_instance(args.task)
    llm.prompt_ids = encode(warm)
    if args.cache_prompt:
        backend.cache_kv(llm.prompt_ids)
    scratch = {"predicate_calls": 0, "check_timeouts": 0, "generated_tokens": 0}
    asyncio.run(run_smc(llm, warm, scratch, set(), 2, 4, args.seed))
    print(f"ready {time.process_time():.4f}", flush=True)  # the parent's timeout starts here

    llm.prompt_ids = encode(instance)
    seed = args.seed + 1000 * args.replicate + args.worker
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    counts = {"predicate_calls": 0, "check_timeouts": 0, "generated_tokens": 0}
    cut: set = set()
    wall, cpu = time.perf_counter(), time.process_time()
    if args.cache_prompt:  # the prompt's K/V, so that each step runs only the generated tokens
        backend.cache_kv(llm.prompt_ids)
    seqs = asyncio.run(run_smc(llm, instance, counts, cut, args.particles, T.STOP.max_tokens, seed))
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu

    particles = []
    for context, weight in zip(seqs.contexts, seqs.normalized_weights):
        ended = bool(context) and isinstance(context[-1], EndOfSequence)
        body = context[:-1] if ended else context
        text = b"".join(bytes(t) for t in body).decode("utf-8", errors="replace")
        finished = ended and tuple(body) not in cut
        particles.append({"text": text, "weight": float(weight), "finished": finished})
    return {
        "particles": particles,
        "predicate_calls": counts["predicate_calls"],
        "generated_tokens": counts["generated_tokens"],
        "cpu_seconds": cpu,
        "wall_seconds": wall,
        "extra": {
            "seed": seed,
            "log_ml": float(seqs.log_ml),
            "ess": float(seqs.ess),
            "check_timeouts": counts["check_timeouts"],
            "prompt_tokens": len(llm.prompt_ids),
            "prompt_kv_cached": args.cache_prompt,
        },
    }


# ----------------------------------------------------------------------------- parent side


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _cpu_of(pid: int) -> float | None:
    """CPU seconds (user + system) a live process has used so far (Linux ``/proc``), else None."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime, stime


def run_child(index: int, replicate: int, args) -> dict:
    """The worker in a child process, stopped at the time bounds of its timed part.

    The child prints ``ready <cpu>`` once the model is loaded and warmed up; from then on it is
    killed after ``args.timeout`` wall seconds or ``args.cpu_timeout`` CPU seconds, whichever
    comes first (the setup gets ``args.timeout`` wall seconds of its own).
    """
    cmd = [sys.executable, __file__, "--worker", str(index), "--replicate-index", str(replicate)]
    cmd += ["--task", args.task, "--instances", str(args.instances), "--seed", str(args.seed)]
    cmd += ["--particles", str(args.particles)]
    cmd += [] if args.cache_prompt else ["--no-cache-prompt"]
    env = dict(os.environ, HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false")
    cpu_before = _children_cpu()
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        proc = subprocess.Popen(cmd, stdout=out, stderr=err, text=True, env=env)
        start, ready_at, ready_cpu, cause = time.perf_counter(), None, 0.0, None
        while proc.poll() is None:
            time.sleep(0.5)
            now = time.perf_counter()
            if ready_at is None:
                out.seek(0)
                first = out.readline().split()
                if len(first) == 2 and first[0] == "ready":
                    ready_at, ready_cpu = now, float(first[1])
                elif now - start > args.timeout:
                    cause = f"no model load and warm-up within {args.timeout:g} s"
            elif now - ready_at > args.timeout:
                cause = f"no result within {args.timeout:g} wall s"
            else:
                used = _cpu_of(proc.pid)
                if used is not None and used - ready_cpu > args.cpu_timeout:
                    cause = f"no result within {args.cpu_timeout:g} CPU s"
            if cause is not None and proc.poll() is None:
                proc.kill()
                proc.wait()
                err.seek(0)
                progress = [x.split() for x in err.read().splitlines() if x.startswith("progress ")]
                calls, tokens = (int(progress[-1][1]), int(progress[-1][2])) if progress else (0, 0)
                return {
                    "predicate_calls": calls,
                    "generated_tokens": tokens,
                    "cpu_seconds": max(_children_cpu() - cpu_before - ready_cpu, 0.0),
                    "wall_seconds": now - (ready_at or start),
                    "error": f"timeout: {cause} (child killed)",
                }
        out.seek(0)
        lines = out.read().strip().splitlines()
        err.seek(0)
        stderr = err.read()
    if proc.returncode != 0 or len(lines) < 2:
        tail = "\n".join(x for x in stderr.splitlines() if not x.startswith("progress "))[-400:]
        return {"error": f"child exit {proc.returncode}: {tail.strip()}"}
    return json.loads(lines[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--task", choices=T.TASKS, required=True)
    parser.add_argument("--instances", type=int, default=4, help="instances K (the first K drawn)")
    parser.add_argument("--seed", type=int, default=T.PEER_SEED, help="draws instances and seeds")
    parser.add_argument("--replicates", type=int, default=3)
    parser.add_argument("--particles", type=int, default=5)
    parser.add_argument("--timeout", type=float, default=3600.0, help="wall seconds per instance")
    parser.add_argument(
        "--cpu-timeout", type=float, default=600.0, help="CPU seconds per instance (timed part)"
    )
    parser.add_argument(
        "--start-replicate", type=int, default=0, help="run replicates start..R-1 (split a run)"
    )
    parser.add_argument("--out", type=Path, help="JSON-lines records (appended)")
    parser.add_argument(
        "--no-cache-prompt",
        dest="cache_prompt",
        action="store_false",
        help="do not call AsyncTransformer.cache_kv on the prompt (genlm's default: every step "
        "reruns the whole prompt)",
    )
    parser.add_argument("--worker", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--replicate-index", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    for name in ("instances", "replicates", "particles"):
        if getattr(args, name) < 1:
            parser.error(f"--{name}: must be a positive integer, got {getattr(args, name)}")
    for name in ("timeout", "cpu_timeout"):
        if not getattr(args, name) > 0:
            flag = "--" + name.replace("_", "-")
            parser.error(f"{flag}: must be a positive number of seconds, got {getattr(args, name)}")
    if not 0 <= args.start_replicate < args.replicates:
        parser.error(
            f"--start-replicate: must be in [0, {args.replicates}), got {args.start_replicate}"
        )
    if args.worker is not None:
        args.replicate = args.replicate_index
        print(json.dumps(worker(args)))
        return
    if args.out is None:
        parser.error("--out is required")
    if not (MODEL_DIR / "config.json").is_file():
        parser.error(f"no converted model at {MODEL_DIR}: run bash scripts/setup-genlm.sh")

    method = METHOD if args.cache_prompt else f"{METHOD} (prompt rerun)"
    todo = T.instances(args.task, args.instances, seed=args.seed)
    done = set()
    if args.out.exists():
        done = {
            (r.method, r.instance, r.replicate, r.n_particles) for r in R.read_records(args.out)
        }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    for replicate in range(args.start_replicate, args.replicates):
        for index, instance in enumerate(todo):
            if (method, instance.id, replicate, args.particles) in done:
                continue
            result = run_child(index, replicate, args)
            record = R.RunRecord(
                method=method,
                task=args.task,
                instance=instance.id,
                replicate=replicate,
                n_particles=args.particles,
                **result,
            )
            record.score, record.valid = M.posterior_score(record.particles, instance.score)
            record.extra.update(
                ess_threshold=ESS_THRESHOLD, max_tokens=T.STOP.max_tokens, draw_seed=args.seed
            )
            if args.task == "patterns":
                record.extra["pattern"] = instance.pattern
            R.append_record(args.out, record)
            best = max(record.particles, key=lambda p: p.weight, default=None)
            print(
                f"{args.task} instance {instance.id} replicate {replicate}: "
                f"score={record.score:.3f} valid={record.valid:.2f} "
                f"cpu={record.cpu_seconds or 0:.1f}s calls={record.predicate_calls} "
                f"tokens={record.generated_tokens} top={best.text if best else None!r} "
                f"error={record.error}",
                flush=True,
            )


if __name__ == "__main__":
    main()
